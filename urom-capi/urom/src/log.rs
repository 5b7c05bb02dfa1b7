//! urom's own messages, through libdoca_common's SDK log backends.

use urom_capi_abi::level;

use crate::ffi;

/// An error: why a call failed, in words.
pub(crate) fn error(source: &str, message: &str) {
    ffi::log_sdk(level::ERROR, source, message);
}

/// A warning: something went wrong that did not fail the call.
pub(crate) fn warn(source: &str, message: &str) {
    ffi::log_sdk(level::WARNING, source, message);
}

/// Information about a context's life.
pub(crate) fn info(source: &str, message: &str) {
    ffi::log_sdk(level::INFO, source, message);
}
