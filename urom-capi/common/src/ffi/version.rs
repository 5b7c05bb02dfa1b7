//! `doca_version_runtime()` and `urom_version_runtime()` (`doca_version.h`).

use std::ffi::{CStr, c_char};

/// The DOCA release whose API urom implements, as `doca_version.h`'s `DOCA_VERSION_STRING`.
const DOCA_VERSION: &CStr = c"3.3.0000";

/// urom's version, as `doca_version.h`'s `UROM_VERSION_STRING`.
const UROM_VERSION: &CStr =
    match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(version) => version,
        Err(_) => panic!("the package version holds a NUL"),
    };

#[unsafe(no_mangle)]
pub extern "C" fn doca_version_runtime() -> *const c_char {
    DOCA_VERSION.as_ptr()
}

#[unsafe(no_mangle)]
pub extern "C" fn urom_version_runtime() -> *const c_char {
    UROM_VERSION.as_ptr()
}
