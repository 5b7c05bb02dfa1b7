//! Status codes, numbered as the DOCA error enum (`doca_error_t`).
//!
//! The one definition for all of urom: notifications, error replies, plugin return values and
//! the C header use these numbers.

use core::fmt;

int_enum! {
    /// The outcome of an operation, as the DOCA error enum numbers it.
    ///
    /// On the wire it is an `i32`; codes this version does not know are kept in
    /// [`Status::Unrecognized`] so they can be passed on unchanged.
    open Status: i32, other Unrecognized {
        /// `DOCA_SUCCESS`.
        Success = 0,
        /// `DOCA_ERROR_UNKNOWN`: an error with no better code.
        Unknown = 1,
        /// `DOCA_ERROR_NOT_PERMITTED`.
        NotPermitted = 2,
        /// `DOCA_ERROR_IN_USE`.
        InUse = 3,
        /// `DOCA_ERROR_NOT_SUPPORTED`.
        NotSupported = 4,
        /// `DOCA_ERROR_AGAIN`: try again later.
        Again = 5,
        /// `DOCA_ERROR_INVALID_VALUE`.
        InvalidValue = 6,
        /// `DOCA_ERROR_NO_MEMORY`.
        NoMemory = 7,
        /// `DOCA_ERROR_INITIALIZATION`.
        Initialization = 8,
        /// `DOCA_ERROR_TIME_OUT`.
        TimeOut = 9,
        /// `DOCA_ERROR_SHUTDOWN`.
        Shutdown = 10,
        /// `DOCA_ERROR_CONNECTION_RESET`.
        ConnectionReset = 11,
        /// `DOCA_ERROR_CONNECTION_ABORTED`.
        ConnectionAborted = 12,
        /// `DOCA_ERROR_CONNECTION_INPROGRESS`.
        ConnectionInProgress = 13,
        /// `DOCA_ERROR_NOT_CONNECTED`.
        NotConnected = 14,
        /// `DOCA_ERROR_NO_LOCK`.
        NoLock = 15,
        /// `DOCA_ERROR_NOT_FOUND`.
        NotFound = 16,
        /// `DOCA_ERROR_IO_FAILED`.
        IoFailed = 17,
        /// `DOCA_ERROR_BAD_STATE`.
        BadState = 18,
        /// `DOCA_ERROR_UNSUPPORTED_VERSION`.
        UnsupportedVersion = 19,
        /// `DOCA_ERROR_OPERATING_SYSTEM`.
        OperatingSystem = 20,
        /// `DOCA_ERROR_DRIVER`.
        Driver = 21,
        /// `DOCA_ERROR_UNEXPECTED`.
        Unexpected = 22,
        /// `DOCA_ERROR_ALREADY_EXIST`.
        AlreadyExist = 23,
        /// `DOCA_ERROR_FULL`.
        Full = 24,
        /// `DOCA_ERROR_EMPTY`: nothing to do (a plugin's `progress` with no work).
        Empty = 25,
        /// `DOCA_ERROR_IN_PROGRESS`.
        InProgress = 26,
        /// `DOCA_ERROR_TOO_BIG`.
        TooBig = 27,
        /// `DOCA_ERROR_AUTHENTICATION`.
        Authentication = 28,
        /// `DOCA_ERROR_BAD_CONFIG`.
        BadConfig = 29,
        /// `DOCA_ERROR_SKIPPED`.
        Skipped = 30,
        /// `DOCA_ERROR_DEVICE_FATAL_ERROR`: the device hit a fatal error.
        DeviceFatalError = 31,
    }
}

impl Status {
    /// Whether this is [`Status::Success`].
    pub const fn is_success(self) -> bool {
        matches!(self, Self::Success)
    }

    /// `Ok(())` for success, `Err(self)` for anything else.
    pub const fn into_result(self) -> Result<(), Status> {
        match self {
            Self::Success => Ok(()),
            other => Err(other),
        }
    }

    /// The name of the DOCA constant, e.g. `DOCA_ERROR_INVALID_VALUE`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Success => "DOCA_SUCCESS",
            Self::Unknown => "DOCA_ERROR_UNKNOWN",
            Self::NotPermitted => "DOCA_ERROR_NOT_PERMITTED",
            Self::InUse => "DOCA_ERROR_IN_USE",
            Self::NotSupported => "DOCA_ERROR_NOT_SUPPORTED",
            Self::Again => "DOCA_ERROR_AGAIN",
            Self::InvalidValue => "DOCA_ERROR_INVALID_VALUE",
            Self::NoMemory => "DOCA_ERROR_NO_MEMORY",
            Self::Initialization => "DOCA_ERROR_INITIALIZATION",
            Self::TimeOut => "DOCA_ERROR_TIME_OUT",
            Self::Shutdown => "DOCA_ERROR_SHUTDOWN",
            Self::ConnectionReset => "DOCA_ERROR_CONNECTION_RESET",
            Self::ConnectionAborted => "DOCA_ERROR_CONNECTION_ABORTED",
            Self::ConnectionInProgress => "DOCA_ERROR_CONNECTION_INPROGRESS",
            Self::NotConnected => "DOCA_ERROR_NOT_CONNECTED",
            Self::NoLock => "DOCA_ERROR_NO_LOCK",
            Self::NotFound => "DOCA_ERROR_NOT_FOUND",
            Self::IoFailed => "DOCA_ERROR_IO_FAILED",
            Self::BadState => "DOCA_ERROR_BAD_STATE",
            Self::UnsupportedVersion => "DOCA_ERROR_UNSUPPORTED_VERSION",
            Self::OperatingSystem => "DOCA_ERROR_OPERATING_SYSTEM",
            Self::Driver => "DOCA_ERROR_DRIVER",
            Self::Unexpected => "DOCA_ERROR_UNEXPECTED",
            Self::AlreadyExist => "DOCA_ERROR_ALREADY_EXIST",
            Self::Full => "DOCA_ERROR_FULL",
            Self::Empty => "DOCA_ERROR_EMPTY",
            Self::InProgress => "DOCA_ERROR_IN_PROGRESS",
            Self::TooBig => "DOCA_ERROR_TOO_BIG",
            Self::Authentication => "DOCA_ERROR_AUTHENTICATION",
            Self::BadConfig => "DOCA_ERROR_BAD_CONFIG",
            Self::Skipped => "DOCA_ERROR_SKIPPED",
            Self::DeviceFatalError => "DOCA_ERROR_DEVICE_FATAL_ERROR",
            Self::Unrecognized(_) => "unrecognized status",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.raw())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_follow_the_doca_numbering() {
        let anchors = [
            (Status::Success, 0),
            (Status::Unknown, 1),
            (Status::NotPermitted, 2),
            (Status::InvalidValue, 6),
            (Status::NoMemory, 7),
            (Status::Empty, 25),
            (Status::InProgress, 26),
            (Status::TooBig, 27),
            (Status::Authentication, 28),
            (Status::BadConfig, 29),
            (Status::Skipped, 30),
            (Status::DeviceFatalError, 31),
        ];
        for (status, code) in anchors {
            assert_eq!(status.raw(), code, "{status}");
            assert_eq!(Status::from_raw(code), status);
        }
    }

    #[test]
    fn every_code_round_trips_and_unknown_codes_are_kept() {
        for code in -5..40 {
            assert_eq!(Status::from_raw(code).raw(), code);
        }
        assert_eq!(Status::from_raw(32), Status::Unrecognized(32));
        assert_eq!(Status::from_raw(-1), Status::Unrecognized(-1));
    }

    #[test]
    fn display_names_the_constant_and_code() {
        use std::string::ToString;
        assert_eq!(
            Status::InvalidValue.to_string(),
            "DOCA_ERROR_INVALID_VALUE (6)"
        );
        assert_eq!(
            Status::Unrecognized(99).to_string(),
            "unrecognized status (99)"
        );
        assert_eq!(Status::Empty.into_result(), Err(Status::Empty));
        assert!(Status::Success.into_result().is_ok());
    }
}
