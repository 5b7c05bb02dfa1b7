//! `doca_argp.h`.

use std::ffi::{c_char, c_int, c_void};

use urom_capi_abi::{DocaError, Status};

use super::{arg, guard, guard_value, reclaim, text};
use crate::argp::{self, ParamCb, ParamObj, ValidationCb};

/// Starts the parser for a program called `program_name` (or what `argv[0]` says).
///
/// # Safety
///
/// `program_name` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn doca_argp_init(
    program_name: *const c_char,
    program_config: *mut c_void,
) -> DocaError {
    guard(|| {
        // SAFETY: the caller passes NULL or a NUL-terminated string.
        let name = unsafe { text(program_name) };
        argp::init(name, program_config as usize)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_argp_destroy() -> DocaError {
    guard(argp::destroy)
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_argp_usage() {
    guard_value((), argp::usage)
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_argp_param_create(param: Option<&mut *mut ParamObj>) -> DocaError {
    guard(|| {
        let out = arg(param)?;
        if !argp::initialized() {
            return Err(Status::BadState);
        }
        *out = Box::into_raw(ParamObj::new());
        Ok(())
    })
}

/// Destroys a parameter that was not registered.
///
/// # Safety
///
/// `param` is NULL or an unregistered parameter from `doca_argp_param_create`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn doca_argp_param_destroy(param: *mut ParamObj) -> DocaError {
    guard(|| {
        // SAFETY: the caller passes NULL or a live parameter.
        ParamObj::check(unsafe { param.as_mut() }).ok_or(Status::InvalidValue)?;
        // SAFETY: parameters come from `Box::into_raw` in `doca_argp_param_create`.
        drop(unsafe { reclaim(param) });
        Ok(())
    })
}

/// Sets a text field of a parameter from a C string.
///
/// # Safety
///
/// `value` is NULL or a NUL-terminated string.
unsafe fn set_text(
    param: Option<&mut ParamObj>,
    value: *const c_char,
    field: fn(&mut ParamObj) -> &mut Option<String>,
) {
    guard_value((), || {
        if let Some(param) = ParamObj::check(param) {
            // SAFETY: the caller passes NULL or a NUL-terminated string.
            *field(param) = unsafe { text(value) };
        }
    })
}

/// # Safety
///
/// `name` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn doca_argp_param_set_short_name(
    param: Option<&mut ParamObj>,
    name: *const c_char,
) {
    // SAFETY: forwarded from the caller.
    unsafe { set_text(param, name, |p| &mut p.short) }
}

/// # Safety
///
/// `name` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn doca_argp_param_set_long_name(
    param: Option<&mut ParamObj>,
    name: *const c_char,
) {
    // SAFETY: forwarded from the caller.
    unsafe { set_text(param, name, |p| &mut p.long) }
}

/// # Safety
///
/// `arguments` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn doca_argp_param_set_arguments(
    param: Option<&mut ParamObj>,
    arguments: *const c_char,
) {
    // SAFETY: forwarded from the caller.
    unsafe { set_text(param, arguments, |p| &mut p.arguments) }
}

/// # Safety
///
/// `description` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn doca_argp_param_set_description(
    param: Option<&mut ParamObj>,
    description: *const c_char,
) {
    // SAFETY: forwarded from the caller.
    unsafe { set_text(param, description, |p| &mut p.description) }
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_argp_param_set_callback(
    param: Option<&mut ParamObj>,
    callback: Option<ParamCb>,
) {
    guard_value((), || {
        if let Some(param) = ParamObj::check(param) {
            param.callback = callback;
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_argp_param_set_type(param: Option<&mut ParamObj>, kind: u32) {
    guard_value((), || {
        if let Some(param) = ParamObj::check(param) {
            param.kind = kind;
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_argp_param_set_mandatory(param: Option<&mut ParamObj>) {
    guard_value((), || {
        if let Some(param) = ParamObj::check(param) {
            param.mandatory = true;
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_argp_param_set_cli_only(param: Option<&mut ParamObj>) {
    guard_value((), || {
        if let Some(param) = ParamObj::check(param) {
            param.cli_only = true;
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_argp_param_set_multiplicity(param: Option<&mut ParamObj>) {
    guard_value((), || {
        if let Some(param) = ParamObj::check(param) {
            param.multiplicity = true;
        }
    })
}

/// Registers a parameter; the parser owns it from then on, whatever the outcome.
///
/// # Safety
///
/// `input_param` is NULL or an unregistered parameter from `doca_argp_param_create`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn doca_argp_register_param(input_param: *mut ParamObj) -> DocaError {
    guard(|| {
        // SAFETY: the caller passes NULL or a live, unregistered parameter.
        ParamObj::check(unsafe { input_param.as_mut() }).ok_or(Status::InvalidValue)?;
        // SAFETY: parameters come from `Box::into_raw`; registering takes them once.
        let param = unsafe { reclaim(input_param) }.ok_or(Status::InvalidValue)?;
        argp::register(*param)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_argp_register_validation_callback(
    callback: Option<ValidationCb>,
) -> DocaError {
    guard(|| argp::set_validation(arg(callback)?))
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_argp_register_version_callback(callback: Option<ParamCb>) -> DocaError {
    guard(|| argp::set_version(arg(callback)?))
}

/// Parses the command line and runs the flags' callbacks.
///
/// # Safety
///
/// `argv` is NULL or holds `argc` NUL-terminated strings (NULL entries are skipped).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn doca_argp_start(argc: c_int, argv: *mut *mut c_char) -> DocaError {
    guard(|| {
        let count = usize::try_from(argc).map_err(|_| Status::InvalidValue)?;
        if argv.is_null() && count > 0 {
            return Err(Status::InvalidValue);
        }
        let args: Vec<String> = (0..count)
            .filter_map(|i| {
                let slot = argv.wrapping_add(i);
                // SAFETY: the caller passes `argc` entries in `argv`.
                let entry = unsafe { *slot };
                // SAFETY: each entry is NULL or a NUL-terminated string.
                unsafe { text(entry) }
            })
            .collect();
        argp::start(&args)
    })
}
