//! The C boundary of libdoca_common: every exported function, and every operation on raw
//! pointers, C strings and C function pointers the library performs.
//!
//! Exported functions take object handles as `Option<&T>`: C passes a pointer this library
//! handed out (or NULL, which arrives as `None`); each object carries a magic word that is
//! checked before use, so a pointer to another kind of object or to a destroyed one is refused
//! with `DOCA_ERROR_INVALID_VALUE` as long as its memory still holds one of ours. Each body runs
//! in [`guard`] so that no panic unwinds into C.
#![allow(unsafe_code)]

mod argp;
mod buf;
mod dev;
mod error;
mod internal;
mod log;
mod pe;
mod version;

use std::ffi::{CStr, c_char, c_void};

use urom_capi_abi::{CtxOps, CtxState, DocaCtx, DocaData, StateChangedCb, Status, TaskOps};

use crate::argp::{ParamCb, ValidationCb, Value};

pub(crate) use urom_capi_abi::{arg, guard, guard_value};

/// The boxed object `ptr` points to, to be dropped; `None` for NULL.
///
/// # Safety
///
/// `ptr` is NULL or came from `Box::into_raw` of a `Box<T>` not reclaimed since.
unsafe fn reclaim<T>(ptr: *mut T) -> Option<Box<T>> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: the caller guarantees `ptr` came from `Box::into_raw` and is reclaimed once.
    Some(unsafe { Box::from_raw(ptr) })
}

/// The text of a C string; `None` for NULL. Invalid UTF-8 is replaced.
///
/// # Safety
///
/// `ptr` is NULL or points to a NUL-terminated string valid for the call.
unsafe fn text(ptr: *const c_char) -> Option<String> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: the caller guarantees a NUL-terminated string.
    let cstr = unsafe { CStr::from_ptr(ptr) };
    Some(cstr.to_string_lossy().into_owned())
}

/// The bytes C gave as an output buffer; `None` for NULL.
///
/// # Safety
///
/// `ptr` is NULL or points to `len` writable bytes.
unsafe fn out_bytes<'a>(ptr: *mut c_char, len: usize) -> Option<&'a mut [u8]> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: the caller guarantees `len` writable bytes at `ptr`.
    Some(unsafe { std::slice::from_raw_parts_mut(ptr.cast::<u8>(), len) })
}

/// The operations table another library gave with a context.
fn ctx_ops<'a>(ops: *const CtxOps) -> &'a CtxOps {
    // SAFETY: `urom_capi_ctx_create` refuses a null table, and its caller (libdoca_urom) keeps
    // the table, a static, alive for as long as the context exists.
    unsafe { &*ops }
}

pub(crate) fn ctx_start(ops: *const CtxOps, imp: *mut c_void) -> Status {
    let start = ctx_ops(ops).start;
    // SAFETY: the operation belongs to the context that holds `imp`, as its library promised.
    Status::from_raw(unsafe { start(imp) })
}

pub(crate) fn ctx_stop(ops: *const CtxOps, imp: *mut c_void) -> Status {
    let stop = ctx_ops(ops).stop;
    // SAFETY: as in `ctx_start`.
    Status::from_raw(unsafe { stop(imp) })
}

pub(crate) fn ctx_progress(ops: *const CtxOps, imp: *mut c_void) -> usize {
    let progress = ctx_ops(ops).progress;
    // SAFETY: as in `ctx_start`.
    unsafe { progress(imp) }
}

pub(crate) fn ctx_inflight(ops: *const CtxOps, imp: *mut c_void) -> usize {
    let inflight = ctx_ops(ops).inflight;
    // SAFETY: as in `ctx_start`.
    unsafe { inflight(imp) }
}

pub(crate) fn ctx_request_notification(ops: *const CtxOps, imp: *mut c_void) -> i32 {
    let request = ctx_ops(ops).request_notification;
    // SAFETY: as in `ctx_start`.
    unsafe { request(imp) }
}

pub(crate) fn ctx_clear_notification(ops: *const CtxOps, imp: *mut c_void) {
    let clear = ctx_ops(ops).clear_notification;
    // SAFETY: as in `ctx_start`.
    unsafe { clear(imp) }
}

/// Adds a context's descriptor to a progress engine's epoll set, for reading.
pub(crate) fn epoll_watch(
    epoll: &nix::sys::epoll::Epoll,
    fd: std::os::fd::RawFd,
) -> nix::Result<()> {
    use nix::sys::epoll::{EpollEvent, EpollFlags};
    // SAFETY: the descriptor is a context's own, open while the context exists (its library
    // promises it); it is borrowed only for the `epoll_ctl` call, and the set forgets it by
    // itself once it is closed.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    epoll.add(fd, EpollEvent::new(EpollFlags::EPOLLIN, 1))
}

/// Runs a state-changed callback.
pub(crate) fn call_state_cb(
    cb: StateChangedCb,
    data: DocaData,
    ctx: *mut crate::ctx::CtxObj,
    prev: CtxState,
    next: CtxState,
) {
    // SAFETY: the program registered `cb` with this signature for this context.
    unsafe { cb(data, ctx.cast::<DocaCtx>(), prev as u32, next as u32) }
}

fn task_ops<'a>(ops: *const TaskOps) -> &'a TaskOps {
    // SAFETY: `urom_capi_task_create` refuses a null table; the task's library keeps its
    // static table alive.
    unsafe { &*ops }
}

pub(crate) fn task_submit(ops: *const TaskOps, imp: *mut c_void) -> Status {
    let submit = task_ops(ops).submit;
    // SAFETY: the operation belongs to the task that holds `imp`.
    Status::from_raw(unsafe { submit(imp) })
}

pub(crate) fn task_free(ops: *const TaskOps, imp: *mut c_void) {
    let free = task_ops(ops).free;
    // SAFETY: as in `task_submit`.
    unsafe { free(imp) }
}

/// The local time of day: hours, minutes, seconds, microseconds.
pub(crate) fn local_time() -> (u32, u32, u32, u32) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let seconds = libc::time_t::try_from(now.as_secs()).unwrap_or(0);
    let mut tm = std::mem::MaybeUninit::<libc::tm>::zeroed();
    // SAFETY: `localtime_r` reads one time_t and fills the `tm` it is given; both live here.
    let filled = unsafe { libc::localtime_r(&seconds, tm.as_mut_ptr()) };
    let (h, m, s) = if filled.is_null() {
        let day = now.as_secs() % 86_400;
        (day / 3600, day / 60 % 60, day % 60)
    } else {
        // SAFETY: `localtime_r` succeeded, so it filled `tm` (and it was zeroed before).
        let tm = unsafe { tm.assume_init() };
        (tm.tm_hour as u64, tm.tm_min as u64, tm.tm_sec as u64)
    };
    (h as u32, m as u32, s as u32, now.subsec_micros())
}

/// Writes `bytes` to the C stream at `file` and flushes it.
pub(crate) fn write_file(file: usize, bytes: &[u8]) {
    let stream = file as *mut libc::FILE;
    // SAFETY: `file` is a `FILE *` the program gave a log backend and keeps open while it logs.
    unsafe { libc::fwrite(bytes.as_ptr().cast(), 1, bytes.len(), stream) };
    // SAFETY: as above.
    unsafe { libc::fflush(stream) };
}

/// Writes `bytes` to the descriptor `fd`.
pub(crate) fn write_fd(fd: i32, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        // SAFETY: `write` reads `bytes.len()` bytes from a live slice; a bad descriptor only
        // makes it fail.
        let written = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        match usize::try_from(written) {
            Ok(n) if n > 0 => bytes = &bytes[n.min(bytes.len())..],
            _ => return,
        }
    }
}

/// Ends the process as C's `exit()` does, flushing C's streams.
pub(crate) fn exit(code: i32) -> ! {
    std::process::exit(code)
}

/// Runs a flag's callback with `value` (a `char *`, `int *`, `bool *` or `double *`) and the
/// program's configuration.
pub(crate) fn call_param_cb(cb: ParamCb, value: &mut Value, config: usize) -> i32 {
    let param: *mut c_void = match value {
        Value::Str(s) => s.as_ptr().cast_mut().cast(),
        Value::Int(i) => (i as *mut i32).cast(),
        Value::Bool(b) => (b as *mut bool).cast(),
        Value::Double(d) => (d as *mut f64).cast(),
    };
    // SAFETY: the program registered `cb` for this flag; the value lives for the call.
    unsafe { cb(param, config as *mut c_void) }
}

/// Runs the program's validation callback.
pub(crate) fn call_validation_cb(cb: ValidationCb, config: usize) -> i32 {
    // SAFETY: the program registered `cb` as its validation callback.
    unsafe { cb(config as *mut c_void) }
}
