//! `doca_pe.h` and `doca_ctx.h`: progress engines, contexts, tasks.

use urom_capi_abi::{CtxState, DocaData, DocaError, StateChangedCb, Status};

use super::{arg, guard, guard_value, reclaim};
use crate::ctx::{CtxObj, PeObj, TaskObj};

/// `doca_notification_handle_t` on Linux: a descriptor.
type NotificationHandle = i32;

#[unsafe(no_mangle)]
pub extern "C" fn doca_pe_create(pe: Option<&mut *mut PeObj>) -> DocaError {
    guard(|| {
        let out = arg(pe)?;
        *out = Box::into_raw(PeObj::new());
        Ok(())
    })
}

/// Destroys a progress engine with no context connected (`DOCA_ERROR_IN_USE` otherwise).
///
/// # Safety
///
/// `pe` is NULL or a progress engine from `doca_pe_create`, not destroyed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn doca_pe_destroy(pe: *mut PeObj) -> DocaError {
    guard(|| {
        // SAFETY: the caller passes NULL or a live engine.
        let engine = PeObj::check(unsafe { pe.as_ref() })?;
        if engine.in_use() {
            return Err(Status::InUse);
        }
        engine.retire();
        // SAFETY: a live engine came from `Box::into_raw` in `doca_pe_create`.
        drop(unsafe { reclaim(pe) });
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_pe_progress(pe: Option<&PeObj>) -> u8 {
    guard_value(0, || PeObj::check(pe).map_or(0, PeObj::progress))
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_pe_connect_ctx(pe: Option<&PeObj>, ctx: Option<&CtxObj>) -> DocaError {
    guard(|| PeObj::check(pe)?.connect(CtxObj::check(ctx)?))
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_pe_get_num_inflight_tasks(
    pe: Option<&PeObj>,
    num_inflight_tasks: Option<&mut usize>,
) -> DocaError {
    guard(|| {
        let pe = PeObj::check(pe)?;
        *arg(num_inflight_tasks)? = pe.inflight();
        Ok(())
    })
}

// Notifications: the handle is an epoll descriptor; request, wait for it to be readable
// (`epoll_wait`, `poll`, or inside the program's own epoll set), clear, then progress.

#[unsafe(no_mangle)]
pub extern "C" fn doca_pe_get_notification_handle(
    pe: Option<&PeObj>,
    handle: Option<&mut NotificationHandle>,
) -> DocaError {
    guard(|| {
        let pe = PeObj::check(pe)?;
        let out = arg(handle)?;
        *out = pe.notification_handle()?;
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_pe_request_notification(pe: Option<&PeObj>) -> DocaError {
    guard(|| PeObj::check(pe)?.request_notification())
}

/// The handle argument is ignored (the engine has one handle), as DOCA does on Linux.
#[unsafe(no_mangle)]
pub extern "C" fn doca_pe_clear_notification(
    pe: Option<&PeObj>,
    _handle: NotificationHandle,
) -> DocaError {
    guard(|| {
        PeObj::check(pe)?.clear_notification();
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_ctx_start(ctx: Option<&CtxObj>) -> DocaError {
    guard(|| CtxObj::check(ctx)?.start())
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_ctx_stop(ctx: Option<&CtxObj>) -> DocaError {
    guard(|| CtxObj::check(ctx)?.stop())
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_ctx_get_state(ctx: Option<&CtxObj>, state: Option<&mut u32>) -> DocaError {
    guard(|| {
        let ctx = CtxObj::check(ctx)?;
        *arg(state)? = ctx.state() as u32;
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_ctx_get_num_inflight_tasks(
    ctx: Option<&CtxObj>,
    num_inflight_tasks: Option<&mut usize>,
) -> DocaError {
    guard(|| {
        let ctx = CtxObj::check(ctx)?;
        *arg(num_inflight_tasks)? = ctx.inflight();
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_ctx_set_user_data(ctx: Option<&CtxObj>, user_data: DocaData) -> DocaError {
    guard(|| {
        CtxObj::check(ctx)?.set_user_data(user_data);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_ctx_get_user_data(
    ctx: Option<&CtxObj>,
    user_data: Option<&mut DocaData>,
) -> DocaError {
    guard(|| {
        let ctx = CtxObj::check(ctx)?;
        *arg(user_data)? = ctx.user_data();
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_ctx_set_state_changed_cb(
    ctx: Option<&CtxObj>,
    cb: Option<StateChangedCb>,
) -> DocaError {
    guard(|| {
        CtxObj::check(ctx)?.set_state_cb(arg(cb)?);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_task_submit(task: Option<&TaskObj>) -> DocaError {
    guard(|| TaskObj::check(task)?.submit())
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_task_try_submit(task: Option<&TaskObj>) -> DocaError {
    guard(|| TaskObj::check(task)?.submit())
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_task_free(task: Option<&TaskObj>) {
    guard_value((), || {
        if let Ok(task) = TaskObj::check(task) {
            task.free();
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_task_get_status(task: Option<&TaskObj>) -> DocaError {
    guard(|| Status::from_raw(TaskObj::check(task)?.status()).into_result())
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_task_set_user_data(task: Option<&TaskObj>, user_data: DocaData) {
    guard_value((), || {
        if let Ok(task) = TaskObj::check(task) {
            task.set_user_data(user_data);
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_task_get_user_data(task: Option<&TaskObj>) -> DocaData {
    guard_value(DocaData::ZERO, || {
        TaskObj::check(task).map_or(DocaData::ZERO, TaskObj::user_data)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_task_get_ctx(task: Option<&TaskObj>) -> *mut CtxObj {
    guard_value(std::ptr::null_mut(), || {
        TaskObj::check(task).map_or(std::ptr::null_mut(), TaskObj::ctx_handle)
    })
}

/// A context state's C value, checked.
pub(super) fn state_from_raw(raw: u32) -> Option<CtxState> {
    CtxState::from_raw(raw)
}
