//! `struct doca_urom_service` and its workers-by-gid task, over `urom_host::Service`.
//!
//! The service's state lives in a [`ServiceCell`] shared with the workers that use it (on any
//! thread); its progress part (the engine that completes workers-by-gid queries and their
//! callbacks) belongs to the thread that progresses the service's progress engine.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::ffi::c_char;
use std::rc::{Rc, Weak};
use std::sync::{Arc, Mutex, MutexGuard};

use urom_capi_abi::{CtxState, DocaCtx, DocaData, DocaTask, Status};
use urom_host::{ControlError, Idle, ProgressEngine, Running, Service, ServiceStartError};
use urom_wire::{CpuSet, MaxMsgSize};

use crate::{borrow, ffi, log};

/// Marks a live service.
pub(crate) const SERVICE_MAGIC: u64 = 0x7572_6f6d_7376_6331; // "uromsvc1"
/// Marks a live workers-by-gid task.
pub(crate) const GID_TASK_MAGIC: u64 = 0x7572_6f6d_6769_6474; // "uromgidt"

/// The environment variable naming the daemon's socket, overriding the service file (for a
/// daemon listening elsewhere than its default socket).
pub const SOCKET_VAR: &str = "UROM_SERVICE_SOCKET";

/// `DOCA_UROM_PLUGIN_NAME_MAX_LEN`.
const PLUGIN_NAME_LEN: usize = 48;

/// `struct doca_urom_service_plugin_info`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct PluginInfo {
    /// The plugin's id.
    pub id: u64,
    /// Its version.
    pub version: u64,
    /// Its name, NUL-terminated.
    pub plugin_name: [c_char; PLUGIN_NAME_LEN],
}

/// `doca_urom_service_get_workers_by_gid_task_completion_cb_t`.
pub(crate) type GidTaskCb =
    unsafe extern "C" fn(task: *mut GidTask, task_user_data: DocaData, ctx_user_data: DocaData);

/// A running service and what it said when it started.
pub(crate) struct RunningService {
    pub(crate) service: Service<Running>,
    pub(crate) plugins: Vec<PluginInfo>,
    pub(crate) cpuset: CpuSet,
    pub(crate) max_msg_size: MaxMsgSize,
}

/// Where a service is.
pub(crate) enum ServiceState {
    Idle(Service<Idle>),
    Running(Box<RunningService>),
    /// Between two states (only seen if a transition panicked).
    Moving,
}

/// A service's state, shared with its workers on every thread.
pub struct ServiceCell {
    state: Mutex<ServiceState>,
    max_msg_size: Mutex<MaxMsgSize>,
}

impl ServiceCell {
    pub(crate) fn lock(&self) -> MutexGuard<'_, ServiceState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn msg_size(&self) -> MaxMsgSize {
        *self
            .max_msg_size
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// `struct doca_urom_service`.
pub struct ServiceObj {
    pub(crate) magic: Cell<u64>,
    /// Shared with workers (read from their threads).
    pub(crate) cell: Arc<ServiceCell>,
    pub(crate) inner: Rc<ServiceInner>,
}

/// A query's answer: the task's handle and the worker ids or why it failed.
type Answer = (usize, Result<Vec<u64>, Status>);

/// What only the service's own thread touches.
pub(crate) struct ServiceInner {
    pub(crate) ctx: Cell<*mut DocaCtx>,
    cell: Arc<ServiceCell>,
    engine: RefCell<ProgressEngine>,
    /// Workers-by-gid tasks allocated and not released.
    tasks: RefCell<Vec<Rc<GidTask>>>,
    /// Released tasks, freed at the next progress (a task may release itself from its own
    /// callback).
    retired: RefCell<Vec<Rc<GidTask>>>,
    /// Queries answered, by task handle, their callbacks not yet run.
    done: RefCell<VecDeque<Answer>>,
}

/// The DOCA status for why a service did not start: `NOT_SUPPORTED` for a service on another
/// machine in a library built without UCX; `BAD_CONFIG` for a key file that cannot be used;
/// the daemon's own for a refusal (`AUTHENTICATION` for a wrong key).
fn start_status(error: &ServiceStartError) -> Status {
    match error {
        ServiceStartError::ServiceFile(urom_host::ServiceFileError::NoMatch { .. }) => {
            Status::NotFound
        }
        ServiceStartError::ServiceFile(_) | ServiceStartError::KeyFile(_) => Status::BadConfig,
        ServiceStartError::Remote { .. } => Status::NotSupported,
        ServiceStartError::Connect(_) => Status::NotConnected,
        ServiceStartError::Control(ControlError::Refused { status, .. }) => *status,
        ServiceStartError::Control(_) => Status::NotConnected,
    }
}

/// Why a service did not start, in words; a service on another machine names the feature
/// this library lacks.
fn start_message(error: &ServiceStartError) -> String {
    match error {
        ServiceStartError::Remote { .. } => format!(
            "the service did not start: {error} (libdoca_urom was built without UCX: build it \
             with `--features ucx`, or install with `scripts/install.sh --features ucx`)"
        ),
        _ => format!("the service did not start: {error}"),
    }
}

fn plugin_infos(service: &Service<Running>) -> Vec<PluginInfo> {
    service
        .plugins()
        .iter()
        .map(|plugin| {
            let mut name = [0 as c_char; PLUGIN_NAME_LEN];
            for (dst, &src) in name
                .iter_mut()
                .zip(plugin.name.as_bytes().iter().take(PLUGIN_NAME_LEN - 1))
            {
                *dst = src as c_char;
            }
            PluginInfo {
                id: plugin.id,
                version: plugin.version,
                plugin_name: name,
            }
        })
        .collect()
}

impl ServiceObj {
    /// A service with default settings; its context is attached by the caller.
    pub(crate) fn new() -> Box<Self> {
        let cell = Arc::new(ServiceCell {
            state: Mutex::new(ServiceState::Idle(Service::<Idle>::new())),
            max_msg_size: Mutex::new(MaxMsgSize::DEFAULT),
        });
        Box::new(Self {
            magic: Cell::new(SERVICE_MAGIC),
            cell: Arc::clone(&cell),
            inner: Rc::new(ServiceInner {
                ctx: Cell::new(std::ptr::null_mut()),
                cell,
                engine: RefCell::new(ProgressEngine::new()),
                tasks: RefCell::new(Vec::new()),
                retired: RefCell::new(Vec::new()),
                done: RefCell::new(VecDeque::new()),
            }),
        })
    }

    /// The service, if `service` points to a live one.
    pub(crate) fn check(service: Option<&Self>) -> Result<&Self, Status> {
        service
            .filter(|s| s.magic.get() == SERVICE_MAGIC)
            .ok_or(Status::InvalidValue)
    }

    pub(crate) fn ctx(&self) -> *mut DocaCtx {
        self.inner.ctx.get()
    }

    /// Applies a setter to the idle service; `DOCA_ERROR_BAD_STATE` when it is not idle.
    pub(crate) fn configure(
        &self,
        set: impl FnOnce(Service<Idle>) -> Result<Service<Idle>, (Service<Idle>, Status)>,
    ) -> Result<(), Status> {
        let mut state = self.cell.lock();
        match std::mem::replace(&mut *state, ServiceState::Moving) {
            ServiceState::Idle(idle) => match set(idle) {
                Ok(idle) => {
                    *state = ServiceState::Idle(idle);
                    Ok(())
                }
                Err((idle, status)) => {
                    *state = ServiceState::Idle(idle);
                    Err(status)
                }
            },
            other => {
                *state = other;
                Err(Status::BadState)
            }
        }
    }

    pub(crate) fn set_max_msg_size(&self, bytes: usize) -> Result<(), Status> {
        let bytes = u32::try_from(bytes).map_err(|_| Status::InvalidValue)?;
        let size = MaxMsgSize::new(bytes).map_err(|e| {
            log::error("service", &e.to_string());
            Status::InvalidValue
        })?;
        // Checked above, so the setter takes it; it consumes the service only when it refuses.
        self.configure(|idle| {
            idle.set_max_msg_size(bytes)
                .map_err(|_| (Service::<Idle>::new(), Status::InvalidValue))
        })?;
        *self
            .cell
            .max_msg_size
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = size;
        Ok(())
    }

    /// `doca_ctx_start()`: connects, authenticates, reads the plugins and CPUs.
    pub(crate) fn start(&self) -> Result<(), Status> {
        let mut state = self.cell.lock();
        let idle = match std::mem::replace(&mut *state, ServiceState::Moving) {
            ServiceState::Idle(idle) => idle,
            // The context says idle, so this is a service that failed mid-transition.
            other => {
                *state = other;
                return Err(Status::BadState);
            }
        };
        let idle = match std::env::var_os(SOCKET_VAR) {
            Some(socket) => idle.set_socket(socket),
            None => idle,
        };
        match idle.start() {
            Ok(service) => {
                let plugins = plugin_infos(&service);
                let cpuset = service.cpuset();
                log::info(
                    "service",
                    &format!(
                        "connected: {} plugins, CPUs {cpuset}",
                        service.plugins().len()
                    ),
                );
                *state = ServiceState::Running(Box::new(RunningService {
                    service,
                    plugins,
                    cpuset,
                    max_msg_size: self.cell.msg_size(),
                }));
                Ok(())
            }
            Err((idle, error)) => {
                *state = ServiceState::Idle(idle);
                log::error("service", &start_message(&error));
                Err(start_status(&error))
            }
        }
    }

    /// `doca_ctx_stop()`: disconnects at once; the daemon tears down the workers only this
    /// host used. Queries in flight complete with an error at the next progress.
    pub(crate) fn stop(&self) -> Result<(), Status> {
        let mut state = self.cell.lock();
        match std::mem::replace(&mut *state, ServiceState::Moving) {
            ServiceState::Running(running) => {
                *state = ServiceState::Idle(running.service.stop());
                Ok(())
            }
            other => {
                *state = other;
                Err(Status::BadState)
            }
        }
    }

    /// Completes answered queries and runs their callbacks.
    pub(crate) fn progress(&self) -> usize {
        // The object may be destroyed from a callback below; its inner part stays alive here.
        let inner = Rc::clone(&self.inner);
        inner.progress()
    }

    /// `doca_pe_request_notification()` for this context: its engine's descriptor (queries in
    /// flight make that engine look again soon), or a [`notify`](urom_capi_abi::notify) answer.
    pub(crate) fn request_notification(&self) -> i32 {
        if !self.inner.done.borrow().is_empty() {
            return urom_capi_abi::notify::READY;
        }
        borrow::request_notification(&self.inner.engine)
    }

    pub(crate) fn clear_notification(&self) {
        borrow::clear_notification(&self.inner.engine);
    }

    pub(crate) fn inflight(&self) -> usize {
        self.inner
            .tasks
            .borrow()
            .iter()
            .filter(|t| t.state.get() == TaskState::InFlight)
            .count()
    }

    /// Whether it may be destroyed: idle, no query in flight.
    pub(crate) fn destroyable(&self) -> Result<(), Status> {
        if ffi::ctx_state(self.ctx()) != CtxState::Idle {
            return Err(Status::NotPermitted);
        }
        if self.inflight() > 0 {
            return Err(Status::InUse);
        }
        Ok(())
    }

    /// Frees its tasks; the caller frees the object and its context.
    pub(crate) fn retire(&self) {
        self.magic.set(0);
        for task in self.inner.tasks.borrow_mut().drain(..) {
            task.magic.set(0);
        }
        self.inner.retired.borrow_mut().clear();
        self.inner.ctx.set(std::ptr::null_mut());
    }

    /// A workers-by-gid task; the service must run.
    pub(crate) fn allocate_gid_task(&self) -> Result<*mut GidTask, Status> {
        if ffi::ctx_state(self.ctx()) != CtxState::Running {
            return Err(Status::BadState);
        }
        let task = Rc::new(GidTask {
            magic: Cell::new(GID_TASK_MAGIC),
            task: Cell::new(std::ptr::null_mut()),
            service: Rc::downgrade(&self.inner),
            gid: Cell::new(0),
            cb: Cell::new(None),
            ids: RefCell::new(Vec::new()),
            state: Cell::new(TaskState::Allocated),
        });
        let handle = Rc::as_ptr(&task).cast_mut();
        let generic = ffi::task_create(self.ctx(), &ffi::GID_TASK_OPS, handle.cast());
        if generic.is_null() {
            return Err(Status::NoMemory);
        }
        task.task.set(generic);
        self.inner.tasks.borrow_mut().push(task);
        Ok(handle)
    }
}

impl ServiceInner {
    fn progress(&self) -> usize {
        self.retired.borrow_mut().clear();
        let mut work = borrow::progress(&self.engine);
        let ctx_data = ffi::ctx_user_data(self.ctx.get());
        loop {
            let next = self.done.borrow_mut().pop_front();
            let Some((handle, result)) = next else {
                break;
            };
            let task = self
                .tasks
                .borrow()
                .iter()
                .find(|t| Rc::as_ptr(t) as usize == handle)
                .cloned();
            let Some(task) = task else {
                continue;
            };
            work += 1;
            let status = match result {
                Ok(ids) => {
                    *task.ids.borrow_mut() = ids;
                    Status::Success
                }
                Err(status) => {
                    task.ids.borrow_mut().clear();
                    status
                }
            };
            ffi::task_set_status(task.task.get(), status);
            task.state.set(TaskState::Completed);
            if let Some(cb) = task.cb.get() {
                ffi::call_gid_cb(cb, &task, ffi::task_user_data(task.task.get()), ctx_data);
            }
        }
        work
    }
}

/// Where a task is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TaskState {
    /// Back in its pool (command tasks only).
    Free,
    /// Allocated, not submitted.
    Allocated,
    /// Submitted, not completed.
    InFlight,
    /// Completed (its callback ran); may be submitted again or released.
    Completed,
}

/// `struct doca_urom_service_get_workers_by_gid_task`.
pub struct GidTask {
    pub(crate) magic: Cell<u64>,
    pub(crate) task: Cell<*mut DocaTask>,
    service: Weak<ServiceInner>,
    pub(crate) gid: Cell<u32>,
    pub(crate) cb: Cell<Option<GidTaskCb>>,
    pub(crate) ids: RefCell<Vec<u64>>,
    state: Cell<TaskState>,
}

impl GidTask {
    /// The task, if `task` points to a live one.
    pub(crate) fn check(task: Option<&Self>) -> Result<&Self, Status> {
        task.filter(|t| t.magic.get() == GID_TASK_MAGIC)
            .ok_or(Status::InvalidValue)
    }

    /// `doca_task_submit()`: asks the service; the callback runs from its progress engine.
    pub(crate) fn submit(&self) -> Result<(), Status> {
        if !matches!(
            self.state.get(),
            TaskState::Allocated | TaskState::Completed
        ) {
            return Err(Status::BadState);
        }
        if self.cb.get().is_none() {
            log::error(
                "service",
                "a workers-by-gid task was submitted without a callback",
            );
            return Err(Status::InvalidValue);
        }
        let service = self.service.upgrade().ok_or(Status::BadState)?;
        let state = service.cell.lock();
        let ServiceState::Running(running) = &*state else {
            return Err(Status::BadState);
        };
        let handle = self as *const Self as usize;
        let weak = Rc::downgrade(&service);
        let mut engine = borrow::change(&service.engine)?;
        running
            .service
            .workers_by_gid_task_with(&mut engine, self.gid.get(), move |_, result| {
                if let Some(service) = weak.upgrade() {
                    let result = result.map(<[u64]>::to_vec).map_err(ControlError::status);
                    service.done.borrow_mut().push_back((handle, result));
                }
            })
            .map_err(|e| {
                log::error("service", &format!("the workers-by-gid query failed: {e}"));
                e.status()
            })?;
        self.state.set(TaskState::InFlight);
        Ok(())
    }

    /// `doca_urom_service_get_workers_by_gid_task_release()`: not while in flight.
    pub(crate) fn release(&self) -> Result<(), Status> {
        if self.state.get() == TaskState::InFlight {
            return Err(Status::NotPermitted);
        }
        let service = self.service.upgrade().ok_or(Status::BadState)?;
        let mut tasks = service.tasks.borrow_mut();
        let position = tasks
            .iter()
            .position(|t| std::ptr::eq(Rc::as_ptr(t), self))
            .ok_or(Status::BadState)?;
        let task = tasks.remove(position);
        self.magic.set(0);
        // Freed at the next progress: the caller may still be inside this task's callback.
        service.retired.borrow_mut().push(task);
        Ok(())
    }
}

impl Drop for GidTask {
    fn drop(&mut self) {
        ffi::task_destroy(self.task.replace(std::ptr::null_mut()));
    }
}
