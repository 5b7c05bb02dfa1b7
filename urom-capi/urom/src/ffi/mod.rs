//! The C boundary of libdoca_urom: the exported `doca_urom_*` functions, the operation tables
//! libdoca_common calls back through, and every operation on raw pointers: calls into
//! libdoca_common's internal interface, C callbacks, the memory C reads and writes directly
//! (payloads, responses, user data), C strings and arrays.
//!
//! Exported functions take handles as `Option<&T>` (NULL arrives as `None`) and check each
//! object's magic word, so a foreign or destroyed object is refused with
//! `DOCA_ERROR_INVALID_VALUE` while its memory still holds one of ours. Bodies run in
//! [`guard`]: no panic unwinds into C.
#![allow(unsafe_code)]

mod domain;
mod service;
mod worker;

use std::ffi::{c_char, c_void};

use urom_capi_abi::internal as common;
use urom_capi_abi::{
    CtxOps, CtxState, DocaBuf, DocaCtx, DocaData, DocaDev, DocaError, DocaTask, Status, TaskOps,
};

pub(crate) use urom_capi_abi::{arg, guard, guard_value};

pub(crate) use domain::OobColl;

use crate::domain::DomainObj;
use crate::service::{GidTask, GidTaskCb, ServiceObj};
use crate::worker::{CmdTask, CmdTaskCb, WorkerObj};

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

/// A UROM object that is a DOCA context: a service, a worker or a domain.
pub(crate) trait ContextObject {
    /// Its context operations.
    const OPS: &'static CtxOps;
    /// A new idle object, without its context yet.
    fn new_boxed() -> Box<Self>;
    /// The object, if `obj` points to a live one.
    fn check(obj: Option<&Self>) -> Result<&Self, Status>;
    /// Gives the object its context.
    fn set_ctx(&self, ctx: *mut DocaCtx);
    /// Its context.
    fn ctx(&self) -> *mut DocaCtx;
    /// Whether it may be destroyed now.
    fn destroyable(&self) -> Result<(), Status>;
    /// Forgets its tasks and context; the caller frees the object and the context.
    fn retire(&self);
}

/// `doca_urom_*_create`: a new object and its context, stored in `out`.
fn create<T: ContextObject>(out: Option<&mut *mut T>) -> DocaError {
    guard(|| {
        let out = arg(out)?;
        let handle = Box::into_raw(T::new_boxed());
        let ctx = ctx_create(T::OPS, handle.cast());
        if ctx.is_null() {
            // SAFETY: just made by `Box::into_raw`, handed to no one.
            drop(unsafe { reclaim(handle) });
            return Err(Status::NoMemory);
        }
        // SAFETY: just made by `Box::into_raw` and alive.
        unsafe { &*handle }.set_ctx(ctx);
        *out = handle;
        Ok(())
    })
}

/// `doca_urom_*_destroy`: the object and its context, when it may be destroyed.
///
/// # Safety
///
/// `obj` is NULL or a live object from [`create`].
unsafe fn destroy<T: ContextObject>(obj: *mut T) -> DocaError {
    guard(|| {
        // SAFETY: the caller passes NULL or a live object.
        let live = T::check(unsafe { obj.as_ref() })?;
        live.destroyable()?;
        let ctx = live.ctx();
        live.retire();
        ctx_destroy(ctx);
        // SAFETY: objects come from `Box::into_raw` in `create`.
        drop(unsafe { reclaim(obj) });
        Ok(())
    })
}

impl ContextObject for ServiceObj {
    const OPS: &'static CtxOps = &SERVICE_OPS;
    fn new_boxed() -> Box<Self> {
        ServiceObj::new()
    }
    fn check(obj: Option<&Self>) -> Result<&Self, Status> {
        ServiceObj::check(obj)
    }
    fn set_ctx(&self, ctx: *mut DocaCtx) {
        self.inner.ctx.set(ctx);
    }
    fn ctx(&self) -> *mut DocaCtx {
        ServiceObj::ctx(self)
    }
    fn destroyable(&self) -> Result<(), Status> {
        ServiceObj::destroyable(self)
    }
    fn retire(&self) {
        ServiceObj::retire(self)
    }
}

impl ContextObject for WorkerObj {
    const OPS: &'static CtxOps = &WORKER_OPS;
    fn new_boxed() -> Box<Self> {
        WorkerObj::new()
    }
    fn check(obj: Option<&Self>) -> Result<&Self, Status> {
        WorkerObj::check(obj)
    }
    fn set_ctx(&self, ctx: *mut DocaCtx) {
        self.inner.ctx.set(ctx);
    }
    fn ctx(&self) -> *mut DocaCtx {
        WorkerObj::ctx(self)
    }
    fn destroyable(&self) -> Result<(), Status> {
        WorkerObj::destroyable(self)
    }
    fn retire(&self) {
        WorkerObj::retire(self)
    }
}

impl ContextObject for DomainObj {
    const OPS: &'static CtxOps = &DOMAIN_OPS;
    fn new_boxed() -> Box<Self> {
        DomainObj::new()
    }
    fn check(obj: Option<&Self>) -> Result<&Self, Status> {
        DomainObj::check(obj)
    }
    fn set_ctx(&self, ctx: *mut DocaCtx) {
        self.inner.ctx.set(ctx);
    }
    fn ctx(&self) -> *mut DocaCtx {
        DomainObj::ctx(self)
    }
    fn destroyable(&self) -> Result<(), Status> {
        DomainObj::destroyable(self)
    }
    fn retire(&self) {
        DomainObj::retire(self)
    }
}

// libdoca_common's internal interface. Its functions check their arguments (NULL and foreign
// pointers are ignored or refused), so the wrappers below are safe to call with any handle this
// library got from it.

pub(crate) fn ctx_create(ops: &'static CtxOps, imp: *mut c_void) -> *mut DocaCtx {
    // SAFETY: `ops` is a static table; `imp` is the object the operations expect.
    unsafe { common::urom_capi_ctx_create(ops, imp) }
}

pub(crate) fn ctx_destroy(ctx: *mut DocaCtx) {
    // SAFETY: libdoca_common ignores NULL; a context is destroyed once, by its owner.
    unsafe { common::urom_capi_ctx_destroy(ctx) }
}

pub(crate) fn ctx_state(ctx: *const DocaCtx) -> CtxState {
    // SAFETY: a context handle of ours or NULL (which reads as idle).
    CtxState::from_raw(unsafe { common::urom_capi_ctx_state(ctx) }).unwrap_or(CtxState::Idle)
}

pub(crate) fn ctx_set_state(ctx: *mut DocaCtx, state: CtxState) {
    // SAFETY: a context handle of ours or NULL (ignored).
    unsafe { common::urom_capi_ctx_set_state(ctx, state as u32) }
}

pub(crate) fn ctx_user_data(ctx: *const DocaCtx) -> DocaData {
    // SAFETY: a context handle of ours or NULL (which reads as zero).
    unsafe { common::urom_capi_ctx_user_data(ctx) }
}

pub(crate) fn task_create(
    ctx: *mut DocaCtx,
    ops: &'static TaskOps,
    imp: *mut c_void,
) -> *mut DocaTask {
    // SAFETY: `ops` is a static table; `imp` is the task object the operations expect.
    unsafe { common::urom_capi_task_create(ctx, ops, imp) }
}

pub(crate) fn task_destroy(task: *mut DocaTask) {
    // SAFETY: a task handle of ours, destroyed once by its owner, or NULL.
    unsafe { common::urom_capi_task_destroy(task) }
}

pub(crate) fn task_set_status(task: *mut DocaTask, status: Status) {
    // SAFETY: a task handle of ours or NULL.
    unsafe { common::urom_capi_task_set_status(task, status.raw()) }
}

pub(crate) fn task_user_data(task: *const DocaTask) -> DocaData {
    // SAFETY: a task handle of ours or NULL.
    unsafe { common::urom_capi_task_user_data(task) }
}

pub(crate) fn buf_create(memory: &RawBytes) -> *mut DocaBuf {
    // SAFETY: libdoca_common records the range; `memory` outlives the buffer (both belong to
    // one task, which destroys the buffer first).
    unsafe { common::urom_capi_buf_create(memory.ptr, memory.len) }
}

pub(crate) fn buf_destroy(buf: *mut DocaBuf) {
    // SAFETY: a buffer handle of ours, destroyed once, or NULL.
    unsafe { common::urom_capi_buf_destroy(buf) }
}

/// Where a buffer's data starts and how long it is.
pub(crate) fn buf_data(buf: *const DocaBuf) -> Result<(*mut u8, usize), Status> {
    let mut data = std::ptr::null_mut();
    let mut len = 0;
    // SAFETY: a buffer handle of ours; the outputs are locals.
    let status = unsafe { common::urom_capi_buf_data(buf, &mut data, &mut len) };
    Status::from_raw(status).into_result()?;
    Ok((data, len))
}

pub(crate) fn buf_set_data(buf: *mut DocaBuf, data: *mut u8, len: usize) -> Result<(), Status> {
    // SAFETY: a buffer handle of ours; libdoca_common checks the range against the buffer.
    Status::from_raw(unsafe { common::urom_capi_buf_set_data(buf, data, len) }).into_result()
}

/// The PCI address of a device C passed.
pub(crate) fn dev_pci(dev: *const DocaDev) -> Result<String, Status> {
    let mut out = [0u8; 16];
    // SAFETY: libdoca_common checks `dev`; `out` is a local of the length given.
    let status = unsafe { common::urom_capi_dev_pci(dev, out.as_mut_ptr().cast(), out.len()) };
    Status::from_raw(status).into_result()?;
    let end = out.iter().position(|&b| b == 0).unwrap_or(out.len());
    Ok(String::from_utf8_lossy(&out[..end]).into_owned())
}

/// Logs one of urom's messages through libdoca_common's SDK backends.
pub(crate) fn log_sdk(level: u32, source: &str, message: &str) {
    // SAFETY: both slices are live for the call and their lengths are given.
    unsafe {
        common::urom_capi_log_sdk(
            level,
            source.as_ptr(),
            source.len(),
            message.as_ptr(),
            message.len(),
        )
    }
}

/// Memory C reads and writes directly (a payload, a response, user data): `len` zeroed bytes
/// allocated once, freed on drop. Rust never holds a reference into it; it copies in and out.
pub(crate) struct RawBytes {
    ptr: *mut u8,
    len: usize,
}

impl RawBytes {
    pub(crate) fn new(len: usize) -> Self {
        let bytes: Box<[u8]> = vec![0u8; len.max(1)].into_boxed_slice();
        let len = bytes.len();
        Self {
            ptr: Box::into_raw(bytes).cast::<u8>(),
            len,
        }
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Copies `dst.len()` bytes from `offset` into `dst`; false if they are not all inside.
    pub(crate) fn read(&self, offset: usize, dst: &mut [u8]) -> bool {
        if offset
            .checked_add(dst.len())
            .is_none_or(|end| end > self.len)
        {
            return false;
        }
        let src = self.ptr.wrapping_add(offset);
        // SAFETY: the range lies inside the allocation (checked above); C writes it only
        // between calls into this library, never during one.
        unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
        true
    }

    /// Copies `src` to the start; false if it does not fit.
    pub(crate) fn write(&self, src: &[u8]) -> bool {
        if src.len() > self.len {
            return false;
        }
        // SAFETY: the range lies inside the allocation; C reads it only between calls.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr, src.len()) };
        true
    }

    /// Sets every byte to zero.
    pub(crate) fn clear(&self) {
        // SAFETY: the whole allocation, as above.
        unsafe { std::ptr::write_bytes(self.ptr, 0, self.len) };
    }
}

impl Drop for RawBytes {
    fn drop(&mut self) {
        let slice = std::ptr::slice_from_raw_parts_mut(self.ptr, self.len);
        // SAFETY: `ptr` and `len` came from `Box::into_raw` of a boxed slice of that length, and
        // this is its only owner.
        drop(unsafe { Box::from_raw(slice) });
    }
}

/// Runs a command task's completion callback.
pub(crate) fn call_cmd_cb(cb: CmdTaskCb, task: &CmdTask, task_data: DocaData, ctx_data: DocaData) {
    let handle = task as *const CmdTask as *mut CmdTask;
    // SAFETY: the program set `cb` with this signature for this task.
    unsafe { cb(handle, task_data, ctx_data) }
}

/// Runs a workers-by-gid task's completion callback.
pub(crate) fn call_gid_cb(cb: GidTaskCb, task: &GidTask, task_data: DocaData, ctx_data: DocaData) {
    let handle = task as *const GidTask as *mut GidTask;
    // SAFETY: the program set `cb` with this signature for this task.
    unsafe { cb(handle, task_data, ctx_data) }
}

/// The NUL-terminated strings of a C array, as Rust strings.
///
/// # Safety
///
/// `items` is NULL or holds `count` pointers, each NULL or a NUL-terminated string.
unsafe fn string_array(items: *const *const c_char, count: usize) -> Result<Vec<String>, Status> {
    if count == 0 {
        return Ok(Vec::new());
    }
    if items.is_null() {
        return Err(Status::InvalidValue);
    }
    // SAFETY: the caller guarantees `count` entries.
    let entries = unsafe { std::slice::from_raw_parts(items, count) };
    entries
        .iter()
        .map(|&entry| {
            if entry.is_null() {
                return Err(Status::InvalidValue);
            }
            // SAFETY: each entry is a NUL-terminated string, as the caller guarantees.
            let text = unsafe { std::ffi::CStr::from_ptr(entry) };
            text.to_str()
                .map(str::to_owned)
                .map_err(|_| Status::InvalidValue)
        })
        .collect()
}

/// The object behind an operation's `imp` pointer.
///
/// # Safety
///
/// `imp` is the pointer this library gave libdoca_common with the operation table: a live
/// object of type `T`.
unsafe fn imp<'a, T>(imp: *mut c_void) -> Option<&'a T> {
    // SAFETY: as the caller guarantees.
    unsafe { imp.cast::<T>().as_ref() }
}

// The operation tables libdoca_common calls. Each operation receives the object's own handle:
// the `imp` pointer this library gave with the table, a live object of the operation's type.

unsafe extern "C" fn service_start(obj: *mut c_void) -> i32 {
    guard(|| {
        // SAFETY: the service context's `imp` is its live `ServiceObj`.
        let service = unsafe { imp::<ServiceObj>(obj) };
        service.ok_or(Status::InvalidValue)?.start()
    })
}

unsafe extern "C" fn service_stop(obj: *mut c_void) -> i32 {
    guard(|| {
        // SAFETY: as in `service_start`.
        let service = unsafe { imp::<ServiceObj>(obj) };
        service.ok_or(Status::InvalidValue)?.stop()
    })
}

unsafe extern "C" fn service_progress(obj: *mut c_void) -> usize {
    guard_value(0, || {
        // SAFETY: as in `service_start`.
        let service = unsafe { imp::<ServiceObj>(obj) };
        service.map_or(0, ServiceObj::progress)
    })
}

unsafe extern "C" fn service_inflight(obj: *mut c_void) -> usize {
    guard_value(0, || {
        // SAFETY: as in `service_start`.
        let service = unsafe { imp::<ServiceObj>(obj) };
        service.map_or(0, ServiceObj::inflight)
    })
}

unsafe extern "C" fn service_request_notification(obj: *mut c_void) -> i32 {
    guard_value(urom_capi_abi::notify::SOON, || {
        // SAFETY: as in `service_start`.
        let service = unsafe { imp::<ServiceObj>(obj) };
        service.map_or(
            urom_capi_abi::notify::NONE,
            ServiceObj::request_notification,
        )
    })
}

unsafe extern "C" fn service_clear_notification(obj: *mut c_void) {
    guard_value((), || {
        // SAFETY: as in `service_start`.
        let service = unsafe { imp::<ServiceObj>(obj) };
        if let Some(service) = service {
            service.clear_notification();
        }
    })
}

pub(crate) static SERVICE_OPS: CtxOps = CtxOps {
    start: service_start,
    stop: service_stop,
    progress: service_progress,
    inflight: service_inflight,
    request_notification: service_request_notification,
    clear_notification: service_clear_notification,
};

unsafe extern "C" fn worker_start(obj: *mut c_void) -> i32 {
    guard(|| {
        // SAFETY: the worker context's `imp` is its live `WorkerObj`.
        let worker = unsafe { imp::<WorkerObj>(obj) };
        worker.ok_or(Status::InvalidValue)?.start()
    })
}

unsafe extern "C" fn worker_stop(obj: *mut c_void) -> i32 {
    guard(|| {
        // SAFETY: as in `worker_start`.
        let worker = unsafe { imp::<WorkerObj>(obj) };
        worker.ok_or(Status::InvalidValue)?.stop()
    })
}

unsafe extern "C" fn worker_progress(obj: *mut c_void) -> usize {
    guard_value(0, || {
        // SAFETY: as in `worker_start`.
        let worker = unsafe { imp::<WorkerObj>(obj) };
        worker.map_or(0, WorkerObj::progress)
    })
}

unsafe extern "C" fn worker_inflight(obj: *mut c_void) -> usize {
    guard_value(0, || {
        // SAFETY: as in `worker_start`.
        let worker = unsafe { imp::<WorkerObj>(obj) };
        worker.map_or(0, WorkerObj::inflight)
    })
}

unsafe extern "C" fn worker_request_notification(obj: *mut c_void) -> i32 {
    guard_value(urom_capi_abi::notify::SOON, || {
        // SAFETY: as in `worker_start`.
        let worker = unsafe { imp::<WorkerObj>(obj) };
        worker.map_or(urom_capi_abi::notify::NONE, WorkerObj::request_notification)
    })
}

unsafe extern "C" fn worker_clear_notification(obj: *mut c_void) {
    guard_value((), || {
        // SAFETY: as in `worker_start`.
        let worker = unsafe { imp::<WorkerObj>(obj) };
        if let Some(worker) = worker {
            worker.clear_notification();
        }
    })
}

pub(crate) static WORKER_OPS: CtxOps = CtxOps {
    start: worker_start,
    stop: worker_stop,
    progress: worker_progress,
    inflight: worker_inflight,
    request_notification: worker_request_notification,
    clear_notification: worker_clear_notification,
};

unsafe extern "C" fn domain_start(obj: *mut c_void) -> i32 {
    guard(|| {
        // SAFETY: the domain context's `imp` is its live `DomainObj`.
        let domain = unsafe { imp::<DomainObj>(obj) };
        domain.ok_or(Status::InvalidValue)?.start()
    })
}

unsafe extern "C" fn domain_stop(obj: *mut c_void) -> i32 {
    guard(|| {
        // SAFETY: as in `domain_start`.
        let domain = unsafe { imp::<DomainObj>(obj) };
        domain.ok_or(Status::InvalidValue)?.stop()
    })
}

unsafe extern "C" fn domain_progress(obj: *mut c_void) -> usize {
    guard_value(0, || {
        // SAFETY: as in `domain_start`.
        let domain = unsafe { imp::<DomainObj>(obj) };
        domain.map_or(0, DomainObj::progress)
    })
}

/// A domain has no tasks.
unsafe extern "C" fn domain_inflight(_obj: *mut c_void) -> usize {
    0
}

unsafe extern "C" fn domain_request_notification(obj: *mut c_void) -> i32 {
    guard_value(urom_capi_abi::notify::SOON, || {
        // SAFETY: as in `domain_start`.
        let domain = unsafe { imp::<DomainObj>(obj) };
        domain.map_or(urom_capi_abi::notify::NONE, DomainObj::request_notification)
    })
}

unsafe extern "C" fn domain_clear_notification(_obj: *mut c_void) {
    // Nothing to undo: a domain watches no descriptor.
}

pub(crate) static DOMAIN_OPS: CtxOps = CtxOps {
    start: domain_start,
    stop: domain_stop,
    progress: domain_progress,
    inflight: domain_inflight,
    request_notification: domain_request_notification,
    clear_notification: domain_clear_notification,
};

unsafe extern "C" fn cmd_submit(obj: *mut c_void) -> i32 {
    guard(|| {
        // SAFETY: a command task's `imp` is its live `CmdTask`, owned by its worker's pool.
        let task = unsafe { imp::<CmdTask>(obj) };
        task.ok_or(Status::InvalidValue)?.submit()
    })
}

unsafe extern "C" fn cmd_free(obj: *mut c_void) {
    guard_value((), || {
        // SAFETY: as in `cmd_submit`.
        let task = unsafe { imp::<CmdTask>(obj) };
        if let Some(task) = task {
            let _ = task.release();
        }
    })
}

pub(crate) static CMD_TASK_OPS: TaskOps = TaskOps {
    submit: cmd_submit,
    free: cmd_free,
};

unsafe extern "C" fn gid_submit(obj: *mut c_void) -> i32 {
    guard(|| {
        // SAFETY: a workers-by-gid task's `imp` is its live `GidTask`, owned by its service.
        let task = unsafe { imp::<GidTask>(obj) };
        task.ok_or(Status::InvalidValue)?.submit()
    })
}

unsafe extern "C" fn gid_free(obj: *mut c_void) {
    guard_value((), || {
        // SAFETY: as in `gid_submit`.
        let task = unsafe { imp::<GidTask>(obj) };
        if let Some(task) = task {
            let _ = task.release();
        }
    })
}

pub(crate) static GID_TASK_OPS: TaskOps = TaskOps {
    submit: gid_submit,
    free: gid_free,
};
