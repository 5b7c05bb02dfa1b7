//! `doca_error_get_name()` and `doca_error_get_descr()`. `doca_error.h` also defines them as weak
//! functions for programs and plugins that use no library; these are the same text.

use std::ffi::c_char;

use urom_capi_abi::{DocaError, Status, description, name};

/// A NUL-terminated copy of each name and description, made once.
fn c_text(text: &'static str) -> *const c_char {
    use std::collections::HashMap;
    use std::ffi::CString;
    use std::sync::{Mutex, OnceLock};
    static TEXTS: OnceLock<Mutex<HashMap<&'static str, CString>>> = OnceLock::new();
    let mut texts = TEXTS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    texts
        .entry(text)
        .or_insert_with(|| CString::new(text).unwrap_or_default())
        .as_ptr()
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_error_get_name(error: DocaError) -> *const c_char {
    super::guard_value(c"DOCA_ERROR_UNRECOGNIZED".as_ptr(), || {
        c_text(name(Status::from_raw(error)))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_error_get_descr(error: DocaError) -> *const c_char {
    super::guard_value(c"Unrecognized error code".as_ptr(), || {
        c_text(description(Status::from_raw(error)))
    })
}
