//! The borrows of a C object's inner state from a DOCA call.
//!
//! A call made from a callback that the object's own progress is running finds the state it
//! needs already borrowed; such a call is in the wrong state for the object, so it answers
//! `DOCA_ERROR_BAD_STATE` rather than panicking. Its progress, likewise, skips what is busy.

use std::cell::{Ref, RefCell, RefMut};
use std::os::fd::AsRawFd;

use urom_capi_abi::{Status, notify};
use urom_host::ProgressEngine;

/// Reads `cell`; `DOCA_ERROR_BAD_STATE` while it is being changed.
pub(crate) fn read<T>(cell: &RefCell<T>) -> Result<Ref<'_, T>, Status> {
    cell.try_borrow().map_err(|_| Status::BadState)
}

/// Changes `cell`; `DOCA_ERROR_BAD_STATE` while it is borrowed.
pub(crate) fn change<T>(cell: &RefCell<T>) -> Result<RefMut<'_, T>, Status> {
    cell.try_borrow_mut().map_err(|_| Status::BadState)
}

/// Progresses `engine` unless a call below its own progress holds it; the work it did.
pub(crate) fn progress(engine: &RefCell<ProgressEngine>) -> usize {
    engine
        .try_borrow_mut()
        .map_or(0, |mut engine| engine.progress())
}

/// Readies `engine` to wake a sleeping DOCA progress engine: its descriptor, or a [`notify`]
/// answer (work waiting, or busy below its own progress: ready; no descriptor: soon).
pub(crate) fn request_notification(engine: &RefCell<ProgressEngine>) -> i32 {
    let Ok(mut engine) = engine.try_borrow_mut() else {
        return notify::READY;
    };
    match engine.request_notification() {
        Ok(true) => engine
            .notification_fd()
            .map_or(notify::SOON, |fd| fd.as_raw_fd()),
        Ok(false) => notify::READY,
        Err(_) => notify::SOON,
    }
}

/// Undoes [`request_notification`].
pub(crate) fn clear_notification(engine: &RefCell<ProgressEngine>) {
    if let Ok(mut engine) = engine.try_borrow_mut() {
        engine.clear_notification();
    }
}
