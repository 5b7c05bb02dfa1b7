//! `doca_urom_service_*`.

use urom_capi_abi::{DocaCtx, DocaDev, DocaError, DocaTask, Status};
use urom_host::{Idle, Service};

use super::{arg, guard, guard_value};
use crate::log;
use crate::service::{GidTask, GidTaskCb, PluginInfo, ServiceObj, ServiceState};

/// `doca_cpu_set_t` (UCX's `ucs_cpu_set_t`): 1024 bits in 16 words.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CpuSetC {
    bits: [u64; 16],
}

impl CpuSetC {
    pub(crate) fn to_cpuset(self) -> urom_wire::CpuSet {
        let mut bytes = [0u8; urom_wire::cpuset::CPUSET_BYTES];
        for (chunk, word) in bytes.chunks_exact_mut(8).zip(self.bits.iter()) {
            chunk.copy_from_slice(&word.to_le_bytes());
        }
        urom_wire::CpuSet::from_bytes(&bytes)
    }

    fn from_cpuset(set: urom_wire::CpuSet) -> Self {
        let bytes = set.to_bytes();
        let mut bits = [0u64; 16];
        for (word, chunk) in bits.iter_mut().zip(bytes.chunks_exact(8)) {
            let mut le = [0u8; 8];
            le.copy_from_slice(chunk);
            *word = u64::from_le_bytes(le);
        }
        Self { bits }
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_urom_service_create(service_ctx: Option<&mut *mut ServiceObj>) -> DocaError {
    super::create(service_ctx)
}

/// Destroys an idle service with no query in flight.
///
/// # Safety
///
/// `service_ctx` is NULL or a live service from `doca_urom_service_create`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn doca_urom_service_destroy(service_ctx: *mut ServiceObj) -> DocaError {
    // SAFETY: the caller's contract is `destroy`'s.
    unsafe { super::destroy(service_ctx) }
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_urom_service_set_max_comm_msg_size(
    service_ctx: Option<&ServiceObj>,
    msg_size: usize,
) -> DocaError {
    guard(|| ServiceObj::check(service_ctx)?.set_max_msg_size(msg_size))
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_urom_service_set_max_workers(
    service_ctx: Option<&ServiceObj>,
    max_workers: u32,
) -> DocaError {
    guard(|| {
        let service = ServiceObj::check(service_ctx)?;
        service.configure(|idle| {
            idle.set_max_workers(max_workers as usize).map_err(|idle| {
                log::error(
                    "service",
                    &format!("max workers {max_workers} is not a power of two"),
                );
                (idle, Status::InvalidValue)
            })
        })
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_urom_service_set_dev(
    service_ctx: Option<&ServiceObj>,
    dev: *const DocaDev,
) -> DocaError {
    guard(|| {
        let service = ServiceObj::check(service_ctx)?;
        let pci = super::dev_pci(dev)?;
        service.configure(|idle: Service<Idle>| Ok(idle.set_device_pci(pci)))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_urom_service_as_ctx(service_ctx: Option<&ServiceObj>) -> *mut DocaCtx {
    guard_value(std::ptr::null_mut(), || {
        ServiceObj::check(service_ctx).map_or(std::ptr::null_mut(), ServiceObj::ctx)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_urom_service_get_plugins_list(
    service_ctx: Option<&ServiceObj>,
    plugins: Option<&mut *const PluginInfo>,
    plugins_count: Option<&mut usize>,
) -> DocaError {
    guard(|| {
        let service = ServiceObj::check(service_ctx)?;
        let (list, count) = (arg(plugins)?, arg(plugins_count)?);
        let state = service.cell.lock();
        let ServiceState::Running(running) = &*state else {
            return Err(Status::BadState);
        };
        if running.plugins.is_empty() {
            return Err(Status::NotFound);
        }
        // Valid while the service runs: the list is not changed until it stops.
        *list = running.plugins.as_ptr();
        *count = running.plugins.len();
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_urom_service_get_cpuset(
    service_ctx: Option<&ServiceObj>,
    cpuset: Option<&mut CpuSetC>,
) -> DocaError {
    guard(|| {
        let service = ServiceObj::check(service_ctx)?;
        let out = arg(cpuset)?;
        let state = service.cell.lock();
        let ServiceState::Running(running) = &*state else {
            return Err(Status::BadState);
        };
        *out = CpuSetC::from_cpuset(running.cpuset);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_urom_service_get_workers_by_gid_task_allocate(
    service_ctx: Option<&ServiceObj>,
    task: Option<&mut *mut GidTask>,
) -> DocaError {
    guard(|| {
        let service = ServiceObj::check(service_ctx)?;
        let out = arg(task)?;
        *out = service.allocate_gid_task()?;
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_urom_service_get_workers_by_gid_task_allocate_init(
    service_ctx: Option<&ServiceObj>,
    gid: u32,
    cb: Option<GidTaskCb>,
    task: Option<&mut *mut GidTask>,
) -> DocaError {
    guard(|| {
        let service = ServiceObj::check(service_ctx)?;
        let out = arg(task)?;
        let handle = service.allocate_gid_task()?;
        // SAFETY: just allocated by the service, which keeps it alive until released.
        let made = unsafe { &*handle };
        made.gid.set(gid);
        made.cb.set(cb);
        *out = handle;
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_urom_service_get_workers_by_gid_task_release(
    task: Option<&GidTask>,
) -> DocaError {
    guard(|| GidTask::check(task)?.release())
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_urom_service_get_workers_by_gid_task_set_gid(
    task: Option<&GidTask>,
    gid: u32,
) {
    guard_value((), || {
        if let Ok(task) = GidTask::check(task) {
            task.gid.set(gid);
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_urom_service_get_workers_by_gid_task_set_cb(
    task: Option<&GidTask>,
    cb: Option<GidTaskCb>,
) {
    guard_value((), || {
        if let Ok(task) = GidTask::check(task) {
            task.cb.set(cb);
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_urom_service_get_workers_by_gid_task_as_task(
    task: Option<&GidTask>,
) -> *mut DocaTask {
    guard_value(std::ptr::null_mut(), || {
        GidTask::check(task).map_or(std::ptr::null_mut(), |t| t.task.get())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_urom_service_get_workers_by_gid_task_get_workers_count(
    task: Option<&GidTask>,
) -> usize {
    guard_value(0, || {
        GidTask::check(task).map_or(0, |t| t.ids.borrow().len())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_urom_service_get_workers_by_gid_task_get_worker_ids(
    task: Option<&GidTask>,
) -> *const u64 {
    guard_value(std::ptr::null(), || {
        // Valid until the task is submitted again or released.
        GidTask::check(task).map_or(std::ptr::null(), |t| t.ids.borrow().as_ptr())
    })
}
