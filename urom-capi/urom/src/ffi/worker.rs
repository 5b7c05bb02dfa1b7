//! `doca_urom_worker_*` and `doca_urom_worker_cmd_task_*`.

use std::ffi::{c_char, c_void};

use urom_capi_abi::{DocaBuf, DocaCtx, DocaError, DocaTask, Status};

use super::service::CpuSetC;
use super::{arg, guard, guard_value, string_array};
use crate::log;
use crate::service::ServiceObj;
use crate::worker::{CmdTask, CmdTaskCb, WorkerObj};

#[unsafe(no_mangle)]
pub extern "C" fn doca_urom_worker_create(worker_ctx: Option<&mut *mut WorkerObj>) -> DocaError {
    super::create(worker_ctx)
}

/// Destroys an idle worker and its command tasks.
///
/// # Safety
///
/// `worker_ctx` is NULL or a live worker from `doca_urom_worker_create`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn doca_urom_worker_destroy(worker_ctx: *mut WorkerObj) -> DocaError {
    // SAFETY: the caller's contract is `destroy`'s.
    unsafe { super::destroy(worker_ctx) }
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_urom_worker_set_service(
    worker_ctx: Option<&WorkerObj>,
    service_ctx: Option<&ServiceObj>,
) -> DocaError {
    guard(|| {
        let worker = WorkerObj::check(worker_ctx)?;
        let service = ServiceObj::check(service_ctx)?;
        worker.set_service(std::sync::Arc::clone(&service.cell))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_urom_worker_set_id(
    worker_ctx: Option<&WorkerObj>,
    worker_id: u64,
) -> DocaError {
    guard(|| WorkerObj::check(worker_ctx)?.set_id(worker_id))
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_urom_worker_set_gid(worker_ctx: Option<&WorkerObj>, gid: u32) -> DocaError {
    guard(|| WorkerObj::check(worker_ctx)?.set_gid(gid))
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_urom_worker_set_plugins(
    worker_ctx: Option<&WorkerObj>,
    plugins: u64,
) -> DocaError {
    guard(|| {
        let worker = WorkerObj::check(worker_ctx)?;
        if plugins == 0 {
            log::error(
                "worker",
                "a worker needs at least one plugin (an OR of plugin ids)",
            );
            return Err(Status::InvalidValue);
        }
        worker.configure(|idle| idle.set_plugins(plugins))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_urom_worker_set_cpuset(
    worker_ctx: Option<&WorkerObj>,
    cpuset: CpuSetC,
) -> DocaError {
    guard(|| {
        let worker = WorkerObj::check(worker_ctx)?;
        let set = cpuset.to_cpuset();
        if set.is_empty() {
            log::error("worker", "the worker's CPU set is empty");
            return Err(Status::InvalidValue);
        }
        worker.configure(|idle| idle.set_cpuset(set))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_urom_worker_set_max_inflight_tasks(
    worker_ctx: Option<&WorkerObj>,
    max_tasks: u32,
) -> DocaError {
    guard(|| WorkerObj::check(worker_ctx)?.set_max_inflight(max_tasks))
}

/// Sets the environment of the worker's process: `count` entries `NAME=value`.
///
/// # Safety
///
/// `env` is NULL (with `count` zero) or holds `count` NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn doca_urom_worker_set_env(
    worker_ctx: Option<&WorkerObj>,
    env: *const *const c_char,
    count: usize,
) -> DocaError {
    guard(|| {
        let worker = WorkerObj::check(worker_ctx)?;
        if env.is_null() {
            return Err(Status::InvalidValue);
        }
        // SAFETY: the caller passes `count` NUL-terminated strings.
        let entries = unsafe { string_array(env, count) }?;
        for entry in &entries {
            if let Err(e) = urom_wire::control::check_env_entry(entry.as_bytes()) {
                log::error("worker", &format!("environment entry `{entry}`: {e}"));
                return Err(Status::InvalidValue);
            }
            if let Err(e) = urom_contract::worker_env::check_entry(entry) {
                log::error("worker", &e.to_string());
                return Err(Status::NotPermitted);
            }
        }
        worker.configure(|idle| idle.set_env(entries))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_urom_worker_get_id(
    worker_ctx: Option<&WorkerObj>,
    worker_id: Option<&mut u64>,
) -> DocaError {
    guard(|| {
        let worker = WorkerObj::check(worker_ctx)?;
        *arg(worker_id)? = worker.id();
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_urom_worker_get_gid(
    worker_ctx: Option<&WorkerObj>,
    worker_gid: Option<&mut u32>,
) -> DocaError {
    guard(|| {
        let worker = WorkerObj::check(worker_ctx)?;
        *arg(worker_gid)? = worker.gid();
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_urom_worker_as_ctx(worker_ctx: Option<&WorkerObj>) -> *mut DocaCtx {
    guard_value(std::ptr::null_mut(), || {
        WorkerObj::check(worker_ctx).map_or(std::ptr::null_mut(), WorkerObj::ctx)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_urom_worker_cmd_task_allocate(
    worker_ctx: Option<&WorkerObj>,
    task: Option<&mut *mut CmdTask>,
) -> DocaError {
    guard(|| {
        let worker = WorkerObj::check(worker_ctx)?;
        let out = arg(task)?;
        *out = worker.allocate(0)?;
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_urom_worker_cmd_task_allocate_init(
    worker_ctx: Option<&WorkerObj>,
    plugin: u64,
    task: Option<&mut *mut CmdTask>,
) -> DocaError {
    guard(|| {
        let worker = WorkerObj::check(worker_ctx)?;
        let out = arg(task)?;
        *out = worker.allocate(plugin)?;
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_urom_worker_cmd_task_release(task: Option<&CmdTask>) -> DocaError {
    guard(|| CmdTask::check(task)?.release())
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_urom_worker_cmd_task_set_plugin(task: Option<&CmdTask>, plugin: u64) {
    guard_value((), || {
        if let Ok(task) = CmdTask::check(task) {
            task.plugin.set(plugin);
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_urom_worker_cmd_task_set_cb(task: Option<&CmdTask>, cb: Option<CmdTaskCb>) {
    guard_value((), || {
        if let Ok(task) = CmdTask::check(task) {
            task.cb.set(cb);
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_urom_worker_cmd_task_get_payload(task: Option<&CmdTask>) -> *mut DocaBuf {
    guard_value(std::ptr::null_mut(), || {
        CmdTask::check(task).map_or(std::ptr::null_mut(), |t| t.payload_buf)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_urom_worker_cmd_task_get_response(task: Option<&CmdTask>) -> *mut DocaBuf {
    guard_value(std::ptr::null_mut(), || {
        CmdTask::check(task).map_or(std::ptr::null_mut(), |t| t.response_buf)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_urom_worker_cmd_task_get_user_data(task: Option<&CmdTask>) -> *mut c_void {
    guard_value(std::ptr::null_mut(), || {
        CmdTask::check(task).map_or(std::ptr::null_mut(), |t| t.user_data_ptr().cast())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_urom_worker_cmd_task_as_task(task: Option<&CmdTask>) -> *mut DocaTask {
    guard_value(std::ptr::null_mut(), || {
        CmdTask::check(task).map_or(std::ptr::null_mut(), |t| t.task.get())
    })
}
