//! What urom's two C libraries share.
//!
//! `libdoca_common` (package `urom-capi-common`) holds DOCA's core objects: progress engines,
//! generic contexts and tasks, buffers, devices, logging and argument parsing.
//! `libdoca_urom` (package `urom-capi-urom`) holds the UROM service, worker and their tasks, built
//! on `urom_host`. The UROM objects are DOCA contexts and tasks, so `libdoca_urom` asks
//! `libdoca_common` for a context or task object of its own and hands it a table of operations
//! ([`CtxOps`], [`TaskOps`]) that `doca_ctx_start()`, `doca_pe_progress()`, `doca_task_submit()`
//! and the like call. That internal interface is the `urom_capi_*` functions declared here; only
//! `libdoca_common` defines them, and every argument crossing it is a C type, so the two
//! libraries share no Rust data layout.
//!
//! Also here: the C types both use ([`DocaData`], [`CtxState`]), the status conversions and the
//! panic guard every exported function runs its body in ([`guard`]); and a C program's
//! out-of-band allgather as the host API's collective ([`oob`]), which `liburom_coll`
//! (package `urom-capi-coll`) uses too.
#![deny(unsafe_code)]

pub mod oob;

use core::ffi::{c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

pub use urom_wire::Status;

/// `doca_error_t` as C passes it.
pub type DocaError = i32;

/// `union doca_data`: a pointer or a 64-bit integer.
#[repr(C)]
#[derive(Clone, Copy)]
pub union DocaData {
    /// As a pointer.
    pub ptr: *mut c_void,
    /// As an integer.
    pub u64: u64,
}

impl DocaData {
    /// Zero.
    pub const ZERO: Self = Self { u64: 0 };

    /// From 64 bits.
    pub fn from_bits(bits: u64) -> Self {
        Self { u64: bits }
    }
}

mod union_view {
    //! Reading a union member is the one unsafe operation of this crate.
    #![allow(unsafe_code)]

    impl super::DocaData {
        /// The 64 bits, whichever member was written.
        pub fn bits(self) -> u64 {
            // SAFETY: both members are 8 bytes of plain data on the 64-bit targets urom
            // supports (checked below), and every bit pattern is a valid u64: a pointer reads as
            // its address.
            unsafe { self.u64 }
        }
    }

    const _: () = assert!(size_of::<super::DocaData>() == 8);
}

/// `enum doca_ctx_states`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum CtxState {
    /// `DOCA_CTX_STATE_IDLE`: created or stopped; configurable.
    Idle = 0,
    /// `DOCA_CTX_STATE_STARTING`: started, progress until it runs.
    Starting = 1,
    /// `DOCA_CTX_STATE_RUNNING`: tasks may be allocated and submitted.
    Running = 2,
    /// `DOCA_CTX_STATE_STOPPING`: stopped, progress until it is idle.
    Stopping = 3,
}

impl CtxState {
    /// From its C value.
    pub fn from_raw(raw: u32) -> Option<Self> {
        match raw {
            0 => Some(Self::Idle),
            1 => Some(Self::Starting),
            2 => Some(Self::Running),
            3 => Some(Self::Stopping),
            _ => None,
        }
    }
}

/// Opaque `struct doca_ctx` (defined by `libdoca_common`).
#[repr(C)]
pub struct DocaCtx {
    _opaque: [u8; 0],
}

/// Opaque `struct doca_task` (defined by `libdoca_common`).
#[repr(C)]
pub struct DocaTask {
    _opaque: [u8; 0],
}

/// Opaque `struct doca_buf` (defined by `libdoca_common`).
#[repr(C)]
pub struct DocaBuf {
    _opaque: [u8; 0],
}

/// Opaque `struct doca_dev` (defined by `libdoca_common`).
#[repr(C)]
pub struct DocaDev {
    _opaque: [u8; 0],
}

/// Opaque `struct doca_devinfo` (defined by `libdoca_common`).
#[repr(C)]
pub struct DocaDevinfo {
    _opaque: [u8; 0],
}

/// `doca_ctx_state_changed_callback_t`.
pub type StateChangedCb =
    unsafe extern "C" fn(user_data: DocaData, ctx: *mut DocaCtx, prev: u32, next: u32);

/// What a context of another library does when the generic context calls are made on it. Each
/// operation gets the `imp` pointer given to [`urom_capi_ctx_create`](internal::urom_capi_ctx_create); none may unwind.
#[repr(C)]
pub struct CtxOps {
    /// `doca_ctx_start()` on an idle context connected to a progress engine: `DOCA_SUCCESS`
    /// when it runs now, `DOCA_ERROR_IN_PROGRESS` when progress will bring it to running (or
    /// back to idle on failure), any other status when it stays idle.
    pub start: unsafe extern "C" fn(imp: *mut c_void) -> DocaError,
    /// `doca_ctx_stop()` on a starting or running context: `DOCA_SUCCESS` when it is idle now,
    /// `DOCA_ERROR_IN_PROGRESS` when progress will bring it to idle, any other status when it
    /// keeps its state.
    pub stop: unsafe extern "C" fn(imp: *mut c_void) -> DocaError,
    /// One round of `doca_pe_progress()`: receives, completes tasks, runs their callbacks and
    /// makes state transitions ([`urom_capi_ctx_set_state`](internal::urom_capi_ctx_set_state)); returns how much it did.
    pub progress: unsafe extern "C" fn(imp: *mut c_void) -> usize,
    /// Tasks submitted and not yet completed.
    pub inflight: unsafe extern "C" fn(imp: *mut c_void) -> usize,
    /// `doca_pe_request_notification()`: readies the context to wake a sleeping progress
    /// engine. Returns a descriptor that becomes readable when the context may have work (the
    /// context's own; it stays open while the context exists), or one of the [`notify`] answers.
    pub request_notification: unsafe extern "C" fn(imp: *mut c_void) -> i32,
    /// `doca_pe_clear_notification()`: undoes `request_notification` once awake.
    pub clear_notification: unsafe extern "C" fn(imp: *mut c_void),
}

/// What [`CtxOps::request_notification`] answers when it gives no descriptor.
pub mod notify {
    /// Work is waiting already: progress instead of sleeping.
    pub const READY: i32 = -1;
    /// The context cannot wake a sleeper: look at it again soon.
    pub const SOON: i32 = -2;
    /// Nothing happens in the context until the program acts on it.
    pub const NONE: i32 = -3;
}

/// What a task of another library does on the generic task calls.
#[repr(C)]
pub struct TaskOps {
    /// `doca_task_submit()` while its context runs.
    pub submit: unsafe extern "C" fn(imp: *mut c_void) -> DocaError,
    /// `doca_task_free()`.
    pub free: unsafe extern "C" fn(imp: *mut c_void),
}

/// The signature of [`urom_capi_ctx_create`](internal::urom_capi_ctx_create).
pub type CtxCreateFn = unsafe extern "C" fn(ops: *const CtxOps, imp: *mut c_void) -> *mut DocaCtx;
/// The signature of [`urom_capi_ctx_destroy`](internal::urom_capi_ctx_destroy).
pub type CtxDestroyFn = unsafe extern "C" fn(ctx: *mut DocaCtx);
/// The signature of [`urom_capi_ctx_state`](internal::urom_capi_ctx_state).
pub type CtxStateFn = unsafe extern "C" fn(ctx: *const DocaCtx) -> u32;
/// The signature of [`urom_capi_ctx_set_state`](internal::urom_capi_ctx_set_state).
pub type CtxSetStateFn = unsafe extern "C" fn(ctx: *mut DocaCtx, state: u32);
/// The signature of [`urom_capi_ctx_user_data`](internal::urom_capi_ctx_user_data).
pub type CtxUserDataFn = unsafe extern "C" fn(ctx: *const DocaCtx) -> DocaData;
/// The signature of [`urom_capi_task_create`](internal::urom_capi_task_create).
pub type TaskCreateFn =
    unsafe extern "C" fn(ctx: *mut DocaCtx, ops: *const TaskOps, imp: *mut c_void) -> *mut DocaTask;
/// The signature of [`urom_capi_task_destroy`](internal::urom_capi_task_destroy).
pub type TaskDestroyFn = unsafe extern "C" fn(task: *mut DocaTask);
/// The signature of [`urom_capi_task_set_status`](internal::urom_capi_task_set_status).
pub type TaskSetStatusFn = unsafe extern "C" fn(task: *mut DocaTask, status: DocaError);
/// The signature of [`urom_capi_task_user_data`](internal::urom_capi_task_user_data).
pub type TaskUserDataFn = unsafe extern "C" fn(task: *const DocaTask) -> DocaData;
/// The signature of [`urom_capi_buf_create`](internal::urom_capi_buf_create).
pub type BufCreateFn = unsafe extern "C" fn(head: *mut u8, len: usize) -> *mut DocaBuf;
/// The signature of [`urom_capi_buf_destroy`](internal::urom_capi_buf_destroy).
pub type BufDestroyFn = unsafe extern "C" fn(buf: *mut DocaBuf);
/// The signature of [`urom_capi_buf_data`](internal::urom_capi_buf_data).
pub type BufDataFn =
    unsafe extern "C" fn(buf: *const DocaBuf, data: *mut *mut u8, len: *mut usize) -> DocaError;
/// The signature of [`urom_capi_buf_set_data`](internal::urom_capi_buf_set_data).
pub type BufSetDataFn =
    unsafe extern "C" fn(buf: *mut DocaBuf, data: *mut u8, len: usize) -> DocaError;
/// The signature of [`urom_capi_dev_pci`](internal::urom_capi_dev_pci).
pub type DevPciFn =
    unsafe extern "C" fn(dev: *const DocaDev, out: *mut c_char, size: usize) -> DocaError;
/// The signature of [`urom_capi_log_sdk`](internal::urom_capi_log_sdk).
pub type LogSdkFn = unsafe extern "C" fn(
    level: u32,
    source: *const u8,
    source_len: usize,
    msg: *const u8,
    len: usize,
);

/// The internal interface, defined by libdoca_common (which checks its definitions against the
/// signature types above). Only libdoca_urom calls it.
pub mod internal {
    #![allow(unsafe_code)]

    use core::ffi::{c_char, c_void};

    use super::{CtxOps, DocaBuf, DocaCtx, DocaData, DocaDev, DocaError, DocaTask, TaskOps};

    unsafe extern "C" {
        /// A context object for `imp`, whose generic calls go to `ops` (which must outlive it);
        /// idle, not connected. Null when out of memory.
        pub fn urom_capi_ctx_create(ops: *const CtxOps, imp: *mut c_void) -> *mut DocaCtx;
        /// Disconnects `ctx` from its progress engine and frees it.
        pub fn urom_capi_ctx_destroy(ctx: *mut DocaCtx);
        /// The context's state (a [`CtxState`](super::CtxState)).
        pub fn urom_capi_ctx_state(ctx: *const DocaCtx) -> u32;
        /// Moves the context to `state`; the state-changed callback runs from the next progress.
        pub fn urom_capi_ctx_set_state(ctx: *mut DocaCtx, state: u32);
        /// The context's user data.
        pub fn urom_capi_ctx_user_data(ctx: *const DocaCtx) -> DocaData;
        /// A task object of `ctx` for `imp`, whose generic calls go to `ops`.
        pub fn urom_capi_task_create(
            ctx: *mut DocaCtx,
            ops: *const TaskOps,
            imp: *mut c_void,
        ) -> *mut DocaTask;
        /// Frees a task object.
        pub fn urom_capi_task_destroy(task: *mut DocaTask);
        /// Sets the status `doca_task_get_status()` reports.
        pub fn urom_capi_task_set_status(task: *mut DocaTask, status: DocaError);
        /// The task's user data.
        pub fn urom_capi_task_user_data(task: *const DocaTask) -> DocaData;
        /// A buffer over `len` bytes at `head` that belongs to the caller (no inventory), its data
        /// empty at the head.
        pub fn urom_capi_buf_create(head: *mut u8, len: usize) -> *mut DocaBuf;
        /// Frees a buffer made by [`urom_capi_buf_create`].
        pub fn urom_capi_buf_destroy(buf: *mut DocaBuf);
        /// The buffer's data: where it starts and how long it is.
        pub fn urom_capi_buf_data(
            buf: *const DocaBuf,
            data: *mut *mut u8,
            len: *mut usize,
        ) -> DocaError;
        /// Sets the buffer's data (within the buffer).
        pub fn urom_capi_buf_set_data(buf: *mut DocaBuf, data: *mut u8, len: usize) -> DocaError;
        /// The PCI address (`XXXX:XX:XX.X`, NUL-terminated) of an open device.
        pub fn urom_capi_dev_pci(dev: *const DocaDev, out: *mut c_char, size: usize) -> DocaError;
        /// Logs an SDK message of `level` from `source` (UTF-8, not NUL-terminated).
        pub fn urom_capi_log_sdk(
            level: u32,
            source: *const u8,
            source_len: usize,
            msg: *const u8,
            len: usize,
        );
    }
}

/// DOCA log levels (`enum doca_log_level`).
pub mod level {
    /// Nothing.
    pub const DISABLE: u32 = 10;
    /// Critical.
    pub const CRIT: u32 = 20;
    /// Errors.
    pub const ERROR: u32 = 30;
    /// Warnings.
    pub const WARNING: u32 = 40;
    /// Information.
    pub const INFO: u32 = 50;
    /// Debugging.
    pub const DEBUG: u32 = 60;
    /// Tracing.
    pub const TRACE: u32 = 70;
}

/// Runs an exported function's body: its status as C sees it, `DOCA_ERROR_UNEXPECTED` (and the
/// panic's message on stderr, from the panic hook) if it panicked. Nothing unwinds into C.
pub fn guard(body: impl FnOnce() -> Result<(), Status>) -> DocaError {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => Status::Success.raw(),
        Ok(Err(status)) => status.raw(),
        Err(_) => Status::Unexpected.raw(),
    }
}

/// Runs an exported function's body that returns a value: `fallback` if it panicked.
pub fn guard_value<T>(fallback: T, body: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(fallback)
}

/// `Ok(value)` for a present argument, `DOCA_ERROR_INVALID_VALUE` for a null one.
pub fn arg<T>(value: Option<T>) -> Result<T, Status> {
    value.ok_or(Status::InvalidValue)
}

/// A status from C: `Ok(())` for success.
pub fn check(raw: DocaError) -> Result<(), Status> {
    Status::from_raw(raw).into_result()
}

/// The description `doca_error_get_descr()` gives each status.
pub fn description(status: Status) -> &'static str {
    match status {
        Status::Success => "Success",
        Status::Unknown => "Unknown error",
        Status::NotPermitted => "Operation not permitted",
        Status::InUse => "Resource in use",
        Status::NotSupported => "Operation not supported",
        Status::Again => "Resource temporarily unavailable, try again",
        Status::InvalidValue => "Invalid input",
        Status::NoMemory => "Out of memory",
        Status::Initialization => "Initialization failed",
        Status::TimeOut => "Timed out",
        Status::Shutdown => "Shut down in progress",
        Status::ConnectionReset => "Connection reset by peer",
        Status::ConnectionAborted => "Connection aborted",
        Status::ConnectionInProgress => "Connection in progress",
        Status::NotConnected => "Not connected",
        Status::NoLock => "Could not take a lock",
        Status::NotFound => "Not found",
        Status::IoFailed => "Input/output operation failed",
        Status::BadState => "Not allowed in the current state",
        Status::UnsupportedVersion => "Unsupported version",
        Status::OperatingSystem => "Operating system call failed",
        Status::Driver => "Driver call failed",
        Status::Unexpected => "Unexpected condition",
        Status::AlreadyExist => "Already exists",
        Status::Full => "No more room",
        Status::Empty => "Nothing available",
        Status::InProgress => "In progress",
        Status::TooBig => "Too big",
        Status::Authentication => "Authentication failed",
        Status::BadConfig => "Invalid configuration",
        Status::Skipped => "Result valid, earlier output dropped",
        Status::DeviceFatalError => "Device hit a fatal error",
        Status::Unrecognized(_) => "Unrecognized error code",
    }
}

/// The name `doca_error_get_name()` gives each status.
pub fn name(status: Status) -> &'static str {
    match status {
        Status::Unrecognized(_) => "DOCA_ERROR_UNRECOGNIZED",
        known => known.name(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guard_turns_panics_into_unexpected() {
        assert_eq!(guard(|| Ok(())), 0);
        assert_eq!(guard(|| Err(Status::BadState)), 18);
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        assert_eq!(guard(|| panic!("boom")), 22);
        assert_eq!(guard_value(7u8, || panic!("boom")), 7);
        std::panic::set_hook(hook);
    }

    #[test]
    fn names_and_descriptions_cover_every_code() {
        for code in 0..32 {
            let status = Status::from_raw(code);
            assert!(name(status).starts_with("DOCA_"), "{code}");
            assert_ne!(description(status), "Unrecognized error code", "{code}");
        }
        assert_eq!(name(Status::from_raw(99)), "DOCA_ERROR_UNRECOGNIZED");
        assert_eq!(CtxState::from_raw(2), Some(CtxState::Running));
        assert_eq!(CtxState::from_raw(4), None);
        assert_eq!(DocaData::from_bits(5).bits(), 5);
    }
}
