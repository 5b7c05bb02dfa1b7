//! The internal interface libdoca_urom builds its contexts and tasks on (`urom_capi_*`,
//! declared in `urom-capi-abi`, whose signature types the definitions are checked against).
//! Its caller is urom's own library, which passes live objects; the checks below still refuse
//! NULL and foreign pointers.

use std::ffi::{c_char, c_void};

use urom_capi_abi as abi;
use urom_capi_abi::{CtxOps, DocaBuf, DocaCtx, DocaData, DocaDev, DocaError, DocaTask, TaskOps};

use super::{guard, guard_value, out_bytes, reclaim};
use crate::buf::{BufObj, Owner};
use crate::ctx::{CtxObj, TaskObj};
use crate::dev::{DevObj, copy_c_string};
use crate::log;

const _: abi::CtxCreateFn = urom_capi_ctx_create;
const _: abi::CtxDestroyFn = urom_capi_ctx_destroy;
const _: abi::CtxStateFn = urom_capi_ctx_state;
const _: abi::CtxSetStateFn = urom_capi_ctx_set_state;
const _: abi::CtxUserDataFn = urom_capi_ctx_user_data;
const _: abi::TaskCreateFn = urom_capi_task_create;
const _: abi::TaskDestroyFn = urom_capi_task_destroy;
const _: abi::TaskSetStatusFn = urom_capi_task_set_status;
const _: abi::TaskUserDataFn = urom_capi_task_user_data;
const _: abi::BufCreateFn = urom_capi_buf_create;
const _: abi::BufDestroyFn = urom_capi_buf_destroy;
const _: abi::BufDataFn = urom_capi_buf_data;
const _: abi::BufSetDataFn = urom_capi_buf_set_data;
const _: abi::DevPciFn = urom_capi_dev_pci;
const _: abi::LogSdkFn = urom_capi_log_sdk;

/// The context behind an opaque pointer, if it is a live one.
///
/// # Safety
///
/// `ctx` is NULL or was returned by [`urom_capi_ctx_create`] and not destroyed.
unsafe fn ctx<'a>(ctx: *const DocaCtx) -> Option<&'a CtxObj> {
    // SAFETY: opaque context pointers are `CtxObj` handles, as the caller guarantees.
    CtxObj::check(unsafe { ctx.cast::<CtxObj>().as_ref() }).ok()
}

/// The task behind an opaque pointer, if it is a live one.
///
/// # Safety
///
/// `task` is NULL or was returned by [`urom_capi_task_create`] and not destroyed.
unsafe fn task<'a>(task: *const DocaTask) -> Option<&'a TaskObj> {
    // SAFETY: opaque task pointers are `TaskObj` handles, as the caller guarantees.
    TaskObj::check(unsafe { task.cast::<TaskObj>().as_ref() }).ok()
}

/// The buffer behind an opaque pointer, if it is a live one.
///
/// # Safety
///
/// `buf` is NULL or a buffer of this library, not freed.
unsafe fn buf<'a>(buf: *const DocaBuf) -> Option<&'a BufObj> {
    // SAFETY: opaque buffer pointers are `BufObj` handles, as the caller guarantees.
    BufObj::check(unsafe { buf.cast::<BufObj>().as_ref() }).ok()
}

/// A context for `imp` with operations `ops`.
///
/// # Safety
///
/// `ops` is NULL or points to a table that outlives the context.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn urom_capi_ctx_create(
    ops: *const CtxOps,
    imp: *mut c_void,
) -> *mut DocaCtx {
    guard_value(std::ptr::null_mut(), || {
        if ops.is_null() {
            return std::ptr::null_mut();
        }
        Box::into_raw(CtxObj::new(ops, imp)).cast()
    })
}

/// Disconnects and frees a context.
///
/// # Safety
///
/// `ctx` is NULL or a live context from [`urom_capi_ctx_create`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn urom_capi_ctx_destroy(ctx: *mut DocaCtx) {
    guard_value((), || {
        // SAFETY: the caller passes NULL or a live context.
        if let Some(live) = unsafe { self::ctx(ctx) } {
            live.retire();
            // SAFETY: live contexts come from `Box::into_raw` in `urom_capi_ctx_create`.
            drop(unsafe { reclaim(ctx.cast::<CtxObj>()) });
        }
    })
}

/// # Safety
///
/// `ctx` is NULL or a live context.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn urom_capi_ctx_state(ctx: *const DocaCtx) -> u32 {
    guard_value(0, || {
        // SAFETY: the caller passes NULL or a live context.
        let live = unsafe { self::ctx(ctx) };
        live.map_or(0, |ctx| ctx.state() as u32)
    })
}

/// # Safety
///
/// `ctx` is NULL or a live context.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn urom_capi_ctx_set_state(ctx: *mut DocaCtx, state: u32) {
    guard_value((), || {
        // SAFETY: the caller passes NULL or a live context.
        let live = unsafe { self::ctx(ctx) };
        if let (Some(live), Some(state)) = (live, super::pe::state_from_raw(state)) {
            live.set_state(state);
        }
    })
}

/// # Safety
///
/// `ctx` is NULL or a live context.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn urom_capi_ctx_user_data(ctx: *const DocaCtx) -> DocaData {
    guard_value(DocaData::ZERO, || {
        // SAFETY: the caller passes NULL or a live context.
        unsafe { self::ctx(ctx) }.map_or(DocaData::ZERO, CtxObj::user_data)
    })
}

/// A task of `ctx` for `imp` with operations `ops`.
///
/// # Safety
///
/// `ctx` is NULL or a live context; `ops` is NULL or points to a table that outlives the task.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn urom_capi_task_create(
    ctx: *mut DocaCtx,
    ops: *const TaskOps,
    imp: *mut c_void,
) -> *mut DocaTask {
    guard_value(std::ptr::null_mut(), || {
        // SAFETY: the caller passes NULL or a live context.
        match unsafe { self::ctx(ctx) } {
            Some(ctx) if !ops.is_null() => Box::into_raw(TaskObj::new(ctx, ops, imp)).cast(),
            _ => std::ptr::null_mut(),
        }
    })
}

/// Frees a task.
///
/// # Safety
///
/// `task` is NULL or a live task from [`urom_capi_task_create`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn urom_capi_task_destroy(task: *mut DocaTask) {
    guard_value((), || {
        // SAFETY: the caller passes NULL or a live task.
        if let Some(live) = unsafe { self::task(task) } {
            live.retire();
            // SAFETY: live tasks come from `Box::into_raw` in `urom_capi_task_create`.
            drop(unsafe { reclaim(task.cast::<TaskObj>()) });
        }
    })
}

/// # Safety
///
/// `task` is NULL or a live task.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn urom_capi_task_set_status(task: *mut DocaTask, status: DocaError) {
    guard_value((), || {
        // SAFETY: the caller passes NULL or a live task.
        if let Some(task) = unsafe { self::task(task) } {
            task.set_status(status);
        }
    })
}

/// # Safety
///
/// `task` is NULL or a live task.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn urom_capi_task_user_data(task: *const DocaTask) -> DocaData {
    guard_value(DocaData::ZERO, || {
        // SAFETY: the caller passes NULL or a live task.
        unsafe { self::task(task) }.map_or(DocaData::ZERO, TaskObj::user_data)
    })
}

/// A buffer over memory its caller owns.
#[unsafe(no_mangle)]
pub extern "C" fn urom_capi_buf_create(head: *mut u8, len: usize) -> *mut DocaBuf {
    guard_value(std::ptr::null_mut(), || {
        if head.is_null() {
            return std::ptr::null_mut();
        }
        Box::into_raw(BufObj::new(head, len, Owner::Library)).cast()
    })
}

/// Frees a buffer from [`urom_capi_buf_create`].
///
/// # Safety
///
/// `buf` is NULL or a live buffer from [`urom_capi_buf_create`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn urom_capi_buf_destroy(buf: *mut DocaBuf) {
    guard_value((), || {
        // SAFETY: the caller passes NULL or a live buffer.
        if let Some(live) = unsafe { self::buf(buf) } {
            live.retire();
            // SAFETY: live buffers come from `Box::into_raw`.
            drop(unsafe { reclaim(buf.cast::<BufObj>()) });
        }
    })
}

/// # Safety
///
/// `buf` is NULL or a live buffer; `data` and `len` are NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn urom_capi_buf_data(
    buf: *const DocaBuf,
    data: *mut *mut u8,
    len: *mut usize,
) -> DocaError {
    guard(|| {
        // SAFETY: the caller passes NULL or a live buffer.
        let buf = unsafe { self::buf(buf) }.ok_or(abi::Status::InvalidValue)?;
        // SAFETY: the caller passes NULL or a writable output.
        let data = unsafe { data.as_mut() };
        // SAFETY: as above.
        let len = unsafe { len.as_mut() };
        let (start, length) = buf.data();
        *super::arg(data)? = start;
        *super::arg(len)? = length;
        Ok(())
    })
}

/// # Safety
///
/// `buf` is NULL or a live buffer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn urom_capi_buf_set_data(
    buf: *mut DocaBuf,
    data: *mut u8,
    len: usize,
) -> DocaError {
    guard(|| {
        // SAFETY: the caller passes NULL or a live buffer.
        let buf = unsafe { self::buf(buf) }.ok_or(abi::Status::InvalidValue)?;
        buf.set_data(data, len)
    })
}

/// The PCI address of an open device.
///
/// # Safety
///
/// `dev` is NULL or a device of this library; `out` is NULL or points to `size` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn urom_capi_dev_pci(
    dev: *const DocaDev,
    out: *mut c_char,
    size: usize,
) -> DocaError {
    guard(|| {
        // SAFETY: the caller passes NULL or one of our devices.
        let dev = DevObj::check(unsafe { dev.cast::<DevObj>().as_ref() })?;
        // SAFETY: the caller passes NULL or `size` writable bytes.
        let out = unsafe { out_bytes(out, size) }.ok_or(abi::Status::InvalidValue)?;
        copy_c_string(&dev.info.info.pci, out)
    })
}

/// Logs one of urom's messages.
///
/// # Safety
///
/// `source` and `msg` point to `source_len` and `len` readable bytes (or are NULL).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn urom_capi_log_sdk(
    level: u32,
    source: *const u8,
    source_len: usize,
    msg: *const u8,
    len: usize,
) {
    guard_value((), || {
        let bytes = |ptr: *const u8, len: usize| {
            if ptr.is_null() {
                return String::new();
            }
            // SAFETY: the caller passes `len` readable bytes at `ptr`.
            let slice = unsafe { std::slice::from_raw_parts(ptr, len) };
            String::from_utf8_lossy(slice).into_owned()
        };
        log::sdk(level, &bytes(source, source_len), &bytes(msg, len));
    })
}
