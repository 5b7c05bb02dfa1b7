//! `urom_status_t` and the calling thread's last error message.

use std::cell::RefCell;
use std::ffi::{CStr, CString};

use urom_coll::{CollError, SetupError};
use urom_host::CommandError;

/// `urom_status_t` as C passes it.
pub type RawStatus = i32;

/// `urom_status_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum UromStatus {
    /// `UROM_OK`: done.
    Ok = 0,
    /// `UROM_INPROGRESS`: still runs.
    InProgress = 1,
    /// `UROM_ERR_INVALID_PARAM`: a NULL or destroyed handle, or a wrong argument.
    InvalidParam = -1,
    /// `UROM_ERR_NO_SERVICE`: the urom service cannot be reached on some rank.
    NoService = -2,
    /// `UROM_ERR_NOT_SUPPORTED`: for example a team spanning nodes.
    NotSupported = -3,
    /// `UROM_ERR_NO_MEMORY`: shared memory or an allocation failed.
    NoMemory = -4,
    /// `UROM_ERR_BUSY`: the collective runs.
    Busy = -5,
    /// `UROM_ERR_TIMED_OUT`: the worker did not answer a set-up step in time.
    TimedOut = -6,
    /// `UROM_ERR_OOB`: the out-of-band allgather failed.
    Oob = -7,
    /// `UROM_ERR_WORKER`: the node's worker died or its connection failed.
    Worker = -8,
    /// `UROM_ERR_FAILED`: the collective failed.
    Failed = -9,
    /// `UROM_ERR_CROSS_MEMORY`: cross-memory attach is forbidden.
    CrossMemory = -10,
    /// `UROM_ERR_WRONG_THREAD`: called from another thread than the context's.
    WrongThread = -11,
    /// `UROM_ERR_INTERNAL`: a bug (a panic was caught).
    Internal = -12,
}

impl UromStatus {
    /// Every status, for tests and for the names.
    pub const ALL: [Self; 14] = [
        Self::Ok,
        Self::InProgress,
        Self::InvalidParam,
        Self::NoService,
        Self::NotSupported,
        Self::NoMemory,
        Self::Busy,
        Self::TimedOut,
        Self::Oob,
        Self::Worker,
        Self::Failed,
        Self::CrossMemory,
        Self::WrongThread,
        Self::Internal,
    ];

    /// The value C sees.
    pub const fn raw(self) -> RawStatus {
        self as RawStatus
    }

    /// The status of a value C passed; `None` for one that is not a status.
    pub fn from_raw(raw: RawStatus) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.raw() == raw)
    }

    /// `urom_status_string()`: the constant's name and what it means.
    pub fn describe(self) -> &'static CStr {
        match self {
            Self::Ok => c"UROM_OK: done",
            Self::InProgress => c"UROM_INPROGRESS: still running",
            Self::InvalidParam => c"UROM_ERR_INVALID_PARAM: a NULL or destroyed handle, or a wrong argument",
            Self::NoService => c"UROM_ERR_NO_SERVICE: the urom service cannot be reached (or offers no worker_coll) on some rank",
            Self::NotSupported => c"UROM_ERR_NOT_SUPPORTED: not supported (for example a team spanning nodes)",
            Self::NoMemory => c"UROM_ERR_NO_MEMORY: shared memory or an allocation failed",
            Self::Busy => c"UROM_ERR_BUSY: the collective is running; wait for it first",
            Self::TimedOut => c"UROM_ERR_TIMED_OUT: the worker did not answer a set-up step in time",
            Self::Oob => c"UROM_ERR_OOB: the out-of-band allgather failed",
            Self::Worker => c"UROM_ERR_WORKER: the node's worker died or its connection failed",
            Self::Failed => c"UROM_ERR_FAILED: the collective failed (a rank died, or arguments disagree)",
            Self::CrossMemory => c"UROM_ERR_CROSS_MEMORY: the kernel or a container forbids cross-memory attach",
            Self::WrongThread => c"UROM_ERR_WRONG_THREAD: called from another thread than the context's",
            Self::Internal => c"UROM_ERR_INTERNAL: a bug in liburom_coll (it caught a panic)",
        }
    }
}

/// An error status and what it failed on.
#[derive(Debug)]
pub struct Failure {
    /// The status returned.
    pub status: UromStatus,
    /// What failed, for `urom_coll_last_error()`.
    pub message: String,
}

impl Failure {
    /// A failure with a message.
    pub fn new(status: UromStatus, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }
}

/// The status of a collective's failure.
pub fn coll_status(e: &CollError) -> UromStatus {
    match e {
        CollError::Failed { .. } => UromStatus::Failed,
        CollError::Malformed | CollError::Layout | CollError::Foreign => UromStatus::InvalidParam,
        CollError::Worker(_) => UromStatus::Worker,
        CollError::Submit(CommandError::Exhausted) => UromStatus::Busy,
        CollError::Submit(CommandError::TooBig { .. }) => UromStatus::InvalidParam,
        CollError::Submit(_) => UromStatus::Worker,
        CollError::Busy | CollError::BufferBusy => UromStatus::Busy,
    }
}

impl From<CollError> for Failure {
    fn from(e: CollError) -> Self {
        Self::new(coll_status(&e), e.to_string())
    }
}

impl From<SetupError> for Failure {
    fn from(e: SetupError) -> Self {
        let status = match &e {
            SetupError::NoPlugin => UromStatus::NoService,
            SetupError::Version(_) | SetupError::NotOneNode => UromStatus::NotSupported,
            SetupError::Oob(_) => UromStatus::Oob,
            SetupError::Worker(_) => UromStatus::Worker,
            SetupError::Members | SetupError::Spec(_) | SetupError::NotInDomain { .. } => {
                UromStatus::InvalidParam
            }
            SetupError::SharedMemory(_) => UromStatus::NoMemory,
            SetupError::CrossMemory(_) => UromStatus::CrossMemory,
            SetupError::Timeout => UromStatus::TimedOut,
            SetupError::Coll(c) => coll_status(c),
        };
        Self::new(status, e.to_string())
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `message` as the calling thread's last error.
pub fn set_last_error(message: &str) {
    let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|last| *last.borrow_mut() = text);
}

/// The calling thread's last error message; the pointer stays valid until the thread's next
/// failed call.
pub fn last_error_ptr() -> *const std::ffi::c_char {
    LAST_ERROR.with(|last| last.borrow().as_ptr())
}

/// The status to return for `result`, recording a failure's message.
pub fn report(result: Result<UromStatus, Failure>) -> RawStatus {
    match result {
        Ok(status) => status.raw(),
        Err(failure) => {
            set_last_error(&failure.message);
            failure.status.raw()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::UromStatus;

    #[test]
    fn statuses_round_trip_and_are_named_after_their_constants() {
        for status in UromStatus::ALL {
            assert_eq!(UromStatus::from_raw(status.raw()), Some(status));
            let text = status.describe().to_str().expect("ASCII");
            assert!(text.starts_with("UROM_"), "{text}");
        }
        assert_eq!(UromStatus::from_raw(-99), None);
    }
}
