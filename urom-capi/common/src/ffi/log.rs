//! `doca_log.h`. A backend handle is a tag naming the backend, never dereferenced.
//!
//! `DOCA_LOG_*` and `doca_log()` are inline in the header: they format the message in the
//! program and pass the text to [`urom_doca_log_message`], after asking
//! [`urom_doca_log_enabled`] whether any backend shows its level.

use std::ffi::{c_char, c_int, c_void};

use urom_capi_abi::{DocaError, Status};

use super::{arg, guard, guard_value, text};
use crate::log::{self, Handle, Limit, MAX_BACKENDS, Sink};

/// Opaque `struct doca_log_backend`.
pub struct Backend {
    _never: (),
}

fn handle(backend: *mut Backend) -> Result<Handle, Status> {
    Handle::from_raw(backend as usize).ok_or(Status::InvalidValue)
}

fn out(handle: Handle) -> *mut Backend {
    handle.to_raw() as *mut Backend
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_log_get_max_num_backends() -> u32 {
    MAX_BACKENDS as u32
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_log_get_max_num_backends_sdk() -> u32 {
    MAX_BACKENDS as u32
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_log_backend_set_level_lower_limit(
    backend: *mut Backend,
    level: u32,
) -> DocaError {
    guard(|| log::set_app_limit(handle(backend)?, Limit::Lower, level))
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_log_backend_set_level_upper_limit(
    backend: *mut Backend,
    level: u32,
) -> DocaError {
    guard(|| log::set_app_limit(handle(backend)?, Limit::Upper, level))
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_log_backend_set_level_lower_limit_strict(
    backend: *mut Backend,
) -> DocaError {
    guard(|| log::set_app_strict(handle(backend)?, Limit::Lower))
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_log_backend_set_level_upper_limit_strict(
    backend: *mut Backend,
) -> DocaError {
    guard(|| log::set_app_strict(handle(backend)?, Limit::Upper))
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_log_level_set_global_lower_limit(level: u32) -> DocaError {
    guard(|| log::set_global_limit(Limit::Lower, level))
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_log_level_set_global_upper_limit(level: u32) -> DocaError {
    guard(|| log::set_global_limit(Limit::Upper, level))
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_log_level_get_global_lower_limit() -> u32 {
    guard_value(log::INFO, || log::global_limit(Limit::Lower))
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_log_level_get_global_upper_limit() -> u32 {
    guard_value(log::CRIT, || log::global_limit(Limit::Upper))
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_log_level_set_global_sdk_limit(level: u32) -> DocaError {
    guard(|| log::set_global_sdk(level))
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_log_level_get_global_sdk_limit() -> u32 {
    guard_value(log::INFO, log::global_sdk)
}

/// Registers a log source; `source` receives its identifier.
///
/// # Safety
///
/// `source_name` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn doca_log_register_source(
    source_name: *const c_char,
    source: Option<&mut c_int>,
) -> DocaError {
    guard(|| {
        // SAFETY: the caller passes NULL or a NUL-terminated string.
        let name = unsafe { text(source_name) }.ok_or(Status::InvalidValue)?;
        let out = arg(source)?;
        *out = log::register_source(&name)?;
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_log_unregister_source(_source: c_int) -> DocaError {
    Status::Success.raw()
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_log_backend_create_standard() -> DocaError {
    guard(log::create_standard)
}

/// Makes a backend with `create` writing to `sink` (`None`: the caller gave no usable file or
/// descriptor) and stores it in `backend`.
fn create_backend(
    sink: Option<Sink>,
    backend: Option<&mut *mut Backend>,
    create: fn(Sink) -> Result<Handle, Status>,
) -> DocaError {
    guard(|| {
        let sink = sink.ok_or(Status::InvalidValue)?;
        let slot = arg(backend)?;
        *slot = out(create(sink)?);
        Ok(())
    })
}

/// The sink of a `FILE *`, if it is not NULL.
fn file_sink(fptr: *mut c_void) -> Option<Sink> {
    (!fptr.is_null()).then_some(Sink::File(fptr as usize))
}

/// The sink of a descriptor, if it is one.
fn fd_sink(fd: c_int) -> Option<Sink> {
    (fd >= 0).then_some(Sink::Fd(fd))
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_log_backend_create_with_file(
    fptr: *mut c_void,
    backend: Option<&mut *mut Backend>,
) -> DocaError {
    create_backend(file_sink(fptr), backend, log::create_app)
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_log_backend_create_with_fd(
    fd: c_int,
    backend: Option<&mut *mut Backend>,
) -> DocaError {
    create_backend(fd_sink(fd), backend, log::create_app)
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_log_backend_create_with_file_sdk(
    fptr: *mut c_void,
    backend: Option<&mut *mut Backend>,
) -> DocaError {
    create_backend(file_sink(fptr), backend, log::create_sdk)
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_log_backend_create_with_fd_sdk(
    fd: c_int,
    backend: Option<&mut *mut Backend>,
) -> DocaError {
    create_backend(fd_sink(fd), backend, log::create_sdk)
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_log_backend_set_sdk_level(backend: *mut Backend, level: u32) -> DocaError {
    guard(|| log::set_sdk_level(handle(backend)?, level))
}

/// Whether any application backend shows messages of `level` (the header's `doca_log()` asks
/// before it formats).
#[unsafe(no_mangle)]
pub extern "C" fn urom_doca_log_enabled(level: u32) -> c_int {
    guard_value(0, || c_int::from(log::app_enabled(level)))
}

/// Logs a program's message, already formatted.
///
/// # Safety
///
/// `fname`, `func` and `message` are NULL or NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn urom_doca_log_message(
    level: u32,
    source: c_int,
    fname: *const c_char,
    line: c_int,
    func: *const c_char,
    message: *const c_char,
) -> DocaError {
    guard(|| {
        // SAFETY: the caller passes NULL or NUL-terminated strings.
        let fname = unsafe { text(fname) };
        // SAFETY: as above.
        let func = unsafe { text(func) };
        // SAFETY: as above.
        let message = unsafe { text(message) };
        let message = message.ok_or(Status::InvalidValue)?;
        log::app(
            level,
            source,
            fname.as_deref().unwrap_or("?"),
            line,
            func.as_deref().unwrap_or("?"),
            &message,
        )
    })
}
