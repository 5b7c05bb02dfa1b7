//! `struct doca_urom_worker` and its command tasks, over `urom_host::Worker`.
//!
//! A worker context holds the Rust worker in whichever state it is (`Phase`) and a progress
//! engine of its own. Its command tasks come from a pool allocated when it first runs:
//! `max_inflight_tasks` tasks, each with a payload buffer of the largest command, a response
//! buffer of the largest notification and 32 bytes of user data, which the program reads and
//! writes directly. Submitting copies the payload into one of the Rust worker's task slots; a
//! completion copies the notification into the response buffer and queues the task, and the
//! callbacks run once the Rust engine has returned, so that a callback may submit, release,
//! allocate or stop. Nothing is allocated per command.

use std::cell::{Cell, Ref, RefCell};
use std::collections::VecDeque;
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use urom_capi_abi::{CtxState, DocaBuf, DocaCtx, DocaData, DocaTask, Status, notify};
use urom_host::{
    CommandError, CompletedTask, ControlError, Idle, ProgressEngine, Running, StartProgress,
    Starting, StopProgress, Worker, WorkerStartError, WorkerState, WorkerStop,
};
use urom_wire::MaxMsgSize;
use urom_wire::data::max_notify_payload;

use crate::borrow;
use crate::ffi::{self, RawBytes};
use crate::log;
use crate::service::{ServiceCell, ServiceState, TaskState};

/// Marks a live worker.
pub(crate) const WORKER_MAGIC: u64 = 0x7572_6f6d_776b_7231; // "uromwkr1"
/// Marks a live command task.
pub(crate) const CMD_TASK_MAGIC: u64 = 0x7572_6f6d_636d_6474; // "uromcmdt"

/// Bytes of user data in each command task.
pub(crate) const USER_DATA_LEN: usize = 32;

/// `doca_urom_worker_cmd_task_completion_cb_t`.
pub(crate) type CmdTaskCb =
    unsafe extern "C" fn(task: *mut CmdTask, task_user_data: DocaData, ctx_user_data: DocaData);

/// Where the Rust worker is.
enum Phase {
    Idle(Worker<Idle>),
    Starting(Worker<Starting>),
    Running(Worker<Running>),
    /// Stopped while starting: stopped as soon as it runs (or fails).
    StopStarting(Worker<Starting>),
    /// Stopped while running: the next progress stops it.
    StopRunning(Worker<Running>),
    /// Stopped (by the program, or because it failed): its tasks have completed, the service's
    /// answer to destroying it is awaited; progress brings the context to idle once it comes.
    Stopping(WorkerStop),
    /// Between two states (only seen if a transition panicked).
    Moving,
}

/// `struct doca_urom_worker`.
pub struct WorkerObj {
    pub(crate) magic: Cell<u64>,
    pub(crate) inner: Rc<WorkerInner>,
}

pub(crate) struct WorkerInner {
    pub(crate) ctx: Cell<*mut DocaCtx>,
    service: RefCell<Option<Arc<ServiceCell>>>,
    phase: RefCell<Phase>,
    engine: RefCell<ProgressEngine>,
    pool: RefCell<Option<Rc<Pool>>>,
    /// The id set (or the worker's own once running) and the group.
    id: Cell<u64>,
    gid: Cell<u32>,
    max_inflight: Cell<u32>,
    max_msg_size: Cell<Option<MaxMsgSize>>,
    /// Tells this worker's tasks apart in the completion callback.
    serial: u64,
}

/// `DOCA_UROM_WORKER_ID_ANY`.
pub(crate) const WORKER_ID_ANY: u64 = u64::MAX;

fn start_status(error: &WorkerStartError) -> Status {
    match error {
        WorkerStartError::NoService
        | WorkerStartError::MaxInflight(_)
        | WorkerStartError::Env(_) => Status::InvalidValue,
        WorkerStartError::TooManyWorkers(_) => Status::Full,
        WorkerStartError::EnvRefused(_) => Status::NotPermitted,
        WorkerStartError::Control(e) => e.status(),
        WorkerStartError::Connect(_) | WorkerStartError::Failed(_) => Status::NotConnected,
    }
}

fn command_status(error: &CommandError) -> Status {
    match error {
        CommandError::NotRunning | CommandError::Send(_) => Status::NotConnected,
        CommandError::Exhausted => Status::NoMemory,
        CommandError::TooBig { .. } => Status::TooBig,
    }
}

impl WorkerObj {
    pub(crate) fn new() -> Box<Self> {
        static SERIAL: AtomicU64 = AtomicU64::new(1);
        Box::new(Self {
            magic: Cell::new(WORKER_MAGIC),
            inner: Rc::new(WorkerInner {
                ctx: Cell::new(std::ptr::null_mut()),
                service: RefCell::new(None),
                phase: RefCell::new(Phase::Idle(Worker::<Idle>::new())),
                engine: RefCell::new(ProgressEngine::new()),
                pool: RefCell::new(None),
                id: Cell::new(WORKER_ID_ANY),
                gid: Cell::new(0),
                max_inflight: Cell::new(64),
                max_msg_size: Cell::new(None),
                serial: SERIAL.fetch_add(1, Ordering::Relaxed),
            }),
        })
    }

    /// The worker, if `worker` points to a live one.
    pub(crate) fn check(worker: Option<&Self>) -> Result<&Self, Status> {
        worker
            .filter(|w| w.magic.get() == WORKER_MAGIC)
            .ok_or(Status::InvalidValue)
    }

    pub(crate) fn ctx(&self) -> *mut DocaCtx {
        self.inner.ctx.get()
    }

    /// Applies a setter to the idle worker; `DOCA_ERROR_BAD_STATE` when it is not idle.
    pub(crate) fn configure(
        &self,
        set: impl FnOnce(Worker<Idle>) -> Worker<Idle>,
    ) -> Result<(), Status> {
        let mut phase = borrow::change(&self.inner.phase)?;
        match std::mem::replace(&mut *phase, Phase::Moving) {
            Phase::Idle(idle) => {
                *phase = Phase::Idle(set(idle));
                Ok(())
            }
            other => {
                *phase = other;
                Err(Status::BadState)
            }
        }
    }

    pub(crate) fn set_service(&self, service: Arc<ServiceCell>) -> Result<(), Status> {
        self.configure(|idle| idle)?;
        *self.inner.service.borrow_mut() = Some(service);
        Ok(())
    }

    pub(crate) fn set_id(&self, id: u64) -> Result<(), Status> {
        self.configure(|idle| idle.set_id(id))?;
        self.inner.id.set(id);
        Ok(())
    }

    pub(crate) fn set_gid(&self, gid: u32) -> Result<(), Status> {
        self.configure(|idle| idle.set_gid(gid))?;
        self.inner.gid.set(gid);
        Ok(())
    }

    pub(crate) fn set_max_inflight(&self, tasks: u32) -> Result<(), Status> {
        if !tasks.is_power_of_two() || tasks > 1 << 31 {
            log::error(
                "worker",
                &format!("max in-flight tasks {tasks} is not a power of two between 1 and 2^31"),
            );
            return Err(Status::InvalidValue);
        }
        self.configure(|idle| idle.set_max_inflight_tasks(tasks as usize))?;
        self.inner.max_inflight.set(tasks);
        Ok(())
    }

    pub(crate) fn id(&self) -> u64 {
        match self.inner.phase.try_borrow().as_deref() {
            Ok(Phase::Running(worker) | Phase::StopRunning(worker)) => worker.id(),
            _ => self.inner.id.get(),
        }
    }

    pub(crate) fn gid(&self) -> u32 {
        self.inner.gid.get()
    }

    /// `doca_ctx_start()`: asks the service for the worker; progress brings it to running.
    pub(crate) fn start(&self) -> Result<(), Status> {
        let Some(service) = self.inner.service.borrow().clone() else {
            log::error(
                "worker",
                "the worker has no service: call doca_urom_worker_set_service()",
            );
            return Err(Status::InvalidValue);
        };
        let mut phase = borrow::change(&self.inner.phase)?;
        let idle = match std::mem::replace(&mut *phase, Phase::Moving) {
            Phase::Idle(idle) => idle,
            other => {
                *phase = other;
                return Err(Status::BadState);
            }
        };
        let idle = {
            let state = service.lock();
            let ServiceState::Running(running) = &*state else {
                *phase = Phase::Idle(idle);
                log::error(
                    "worker",
                    "the worker's service is not running: start it first",
                );
                return Err(Status::BadState);
            };
            self.inner.max_msg_size.set(Some(running.max_msg_size));
            idle.set_service(&running.service)
        };
        let mut engine = borrow::change(&self.inner.engine)?;
        match idle.start(&mut engine) {
            Ok(starting) => {
                *phase = Phase::Starting(starting);
                Err(Status::InProgress)
            }
            Err((idle, error)) => {
                *phase = Phase::Idle(idle);
                log::error("worker", &format!("the worker did not start: {error}"));
                Err(start_status(&error))
            }
        }
    }

    /// `doca_ctx_stop()`: the next progress stops it (completing its tasks in flight with
    /// `DOCA_ERROR_SHUTDOWN`) and asks the service to destroy it; a later progress brings the
    /// context to idle once the service has answered. No progress waits for that answer.
    pub(crate) fn stop(&self) -> Result<(), Status> {
        let mut phase = borrow::change(&self.inner.phase)?;
        *phase = match std::mem::replace(&mut *phase, Phase::Moving) {
            Phase::Starting(worker) => Phase::StopStarting(worker),
            Phase::Running(worker) => Phase::StopRunning(worker),
            other => {
                *phase = other;
                return Err(Status::BadState);
            }
        };
        Err(Status::InProgress)
    }

    pub(crate) fn progress(&self) -> usize {
        // The object may be destroyed from a callback below; its inner part stays alive here.
        let inner = Rc::clone(&self.inner);
        inner.progress()
    }

    /// `doca_pe_request_notification()` for this context: its engine's descriptor, or a
    /// [`notify`] answer.
    pub(crate) fn request_notification(&self) -> i32 {
        self.inner.request_notification()
    }

    pub(crate) fn clear_notification(&self) {
        borrow::clear_notification(&self.inner.engine);
    }

    pub(crate) fn inflight(&self) -> usize {
        self.inner
            .pool
            .borrow()
            .as_ref()
            .map_or(0, |pool| pool.in_flight())
    }

    /// Whether it may be destroyed: idle, and not inside its own progress.
    pub(crate) fn destroyable(&self) -> Result<(), Status> {
        let phase = self.inner.phase.try_borrow().map_err(|_| Status::InUse)?;
        match &*phase {
            Phase::Idle(_) | Phase::Moving => Ok(()),
            _ => Err(Status::NotPermitted),
        }
    }

    /// Forgets its context; the caller frees the object, its tasks and its context.
    pub(crate) fn retire(&self) {
        self.magic.set(0);
        if let Some(pool) = self.inner.pool.borrow().as_ref() {
            for task in &pool.tasks {
                task.magic.set(0);
            }
        }
        self.inner.ctx.set(std::ptr::null_mut());
    }

    /// A command task for `plugin`; the worker must run.
    pub(crate) fn allocate(&self, plugin: u64) -> Result<*mut CmdTask, Status> {
        if ffi::ctx_state(self.ctx()) != CtxState::Running {
            return Err(Status::BadState);
        }
        let pool = self.inner.pool.borrow().clone().ok_or(Status::NoMemory)?;
        let index = pool.free.borrow_mut().pop().ok_or(Status::NoMemory)?;
        let task = &pool.tasks[index as usize];
        task.reset(plugin)?;
        Ok(task as *const CmdTask as *mut CmdTask)
    }
}

thread_local! {
    /// The pool of the worker this thread is progressing: where completions go.
    static CURRENT: RefCell<Option<Rc<Pool>>> = const { RefCell::new(None) };
}

/// Makes `pool` the current one until dropped (then the previous one again).
struct Current(Option<Rc<Pool>>);

impl Current {
    fn enter(pool: Option<Rc<Pool>>) -> Self {
        Self(CURRENT.with(|current| current.replace(pool)))
    }
}

impl Drop for Current {
    fn drop(&mut self) {
        let previous = self.0.take();
        CURRENT.with(|current| *current.borrow_mut() = previous);
    }
}

/// The Rust worker's completion callback: hands the completion to the current pool.
fn on_complete(done: &CompletedTask<'_>) {
    let index = u32::from_le_bytes([
        done.user_data[0],
        done.user_data[1],
        done.user_data[2],
        done.user_data[3],
    ]);
    let mut serial = [0u8; 8];
    serial.copy_from_slice(&done.user_data[8..16]);
    let serial = u64::from_le_bytes(serial);
    CURRENT.with(|current| {
        if let Some(pool) = current
            .borrow()
            .as_ref()
            .filter(|pool| pool.serial == serial)
        {
            pool.complete(index, done.status, done.response);
        }
    });
}

impl WorkerInner {
    /// The Rust worker while it runs (not stopping, and not inside its own progress).
    pub(crate) fn running_worker(&self) -> Option<Ref<'_, Worker<Running>>> {
        let phase = self.phase.try_borrow().ok()?;
        Ref::filter_map(phase, |phase| match phase {
            Phase::Running(worker) => Some(worker),
            _ => None,
        })
        .ok()
    }

    fn progress(self: &Rc<Self>) -> usize {
        let _current = Current::enter(self.pool.borrow().clone());
        let mut work = borrow::progress(&self.engine);
        work += self.advance();
        let pool = self.pool.borrow().clone();
        if let Some(pool) = pool {
            work += self.run_callbacks(&pool);
        }
        work
    }

    /// Moves a starting or stopping worker on; returns how many transitions it made.
    fn advance(self: &Rc<Self>) -> usize {
        let Ok(mut phase) = self.phase.try_borrow_mut() else {
            return 0;
        };
        let (next, work) = match std::mem::replace(&mut *phase, Phase::Moving) {
            Phase::Starting(worker) => match worker.try_running() {
                Ok(running) => (self.running(running), 1),
                Err(StartProgress::Starting(worker)) => (Phase::Starting(worker), 0),
                Err(StartProgress::Failed(idle, error)) => {
                    log::error("worker", &format!("the worker did not start: {error}"));
                    ffi::ctx_set_state(self.ctx.get(), CtxState::Idle);
                    (Phase::Idle(idle), 1)
                }
            },
            Phase::StopStarting(worker) => match worker.try_running() {
                Ok(running) => (self.stopping(running), 1),
                Err(StartProgress::Starting(worker)) => (Phase::StopStarting(worker), 0),
                Err(StartProgress::Failed(idle, _)) => {
                    ffi::ctx_set_state(self.ctx.get(), CtxState::Idle);
                    (Phase::Idle(idle), 1)
                }
            },
            Phase::StopRunning(worker) => (self.stopping(worker), 1),
            Phase::Stopping(stop) => match stop.try_stopped() {
                StopProgress::Stopping(stop) => (Phase::Stopping(stop), 0),
                StopProgress::Stopped(result) => (self.stopped(result), 1),
            },
            Phase::Running(worker) => match worker.state() {
                // Its tasks in flight have completed (DOCA_ERROR_NOT_CONNECTED); the context
                // reports the failure by stopping, as a DOCA context that hits an error does.
                // The service's answer is looked at from the next progress on, so that the
                // callback reporting STOPPING runs while the context is STOPPING.
                WorkerState::Failed(failure) => {
                    log::error("worker", &format!("worker {}: {failure}", worker.id()));
                    ffi::ctx_set_state(self.ctx.get(), CtxState::Stopping);
                    (Phase::Stopping(worker.begin_stop()), 1)
                }
                _ => (Phase::Running(worker), 0),
            },
            other => (other, 0),
        };
        *phase = next;
        work
    }

    /// The worker runs: its task pool is made (once), its context goes to running.
    fn running(self: &Rc<Self>, worker: Worker<Running>) -> Phase {
        self.id.set(worker.id());
        let payload = worker.max_command_payload();
        let response = self.max_msg_size.get().map_or(payload, max_notify_payload);
        let tasks = self.max_inflight.get() as usize;
        let reuse = self.pool.borrow().as_ref().is_some_and(|pool| {
            pool.tasks.len() == tasks
                && pool.payload_cap == payload
                && pool.response_cap == response
        });
        let outstanding = self
            .pool
            .borrow()
            .as_ref()
            .is_some_and(|pool| pool.free.borrow().len() != pool.tasks.len());
        if !reuse && !outstanding {
            match Pool::new(self, tasks, payload, response) {
                Ok(pool) => *self.pool.borrow_mut() = Some(pool),
                Err(status) => log::error(
                    "worker",
                    &format!(
                        "no command tasks for worker {}: {}",
                        worker.id(),
                        status.name()
                    ),
                ),
            }
        }
        log::info("worker", &format!("worker {} is running", worker.id()));
        ffi::ctx_set_state(self.ctx.get(), CtxState::Running);
        Phase::Running(worker)
    }

    /// Stops a running worker without waiting for the service: its tasks in flight complete
    /// now; its context goes to idle when the service has answered (now, or at a later
    /// progress).
    fn stopping(&self, worker: Worker<Running>) -> Phase {
        match worker.begin_stop().try_stopped() {
            StopProgress::Stopping(stop) => Phase::Stopping(stop),
            StopProgress::Stopped(result) => self.stopped(result),
        }
    }

    /// The service answered a stop; the context goes to idle.
    fn stopped(&self, result: Result<Worker<Idle>, (Worker<Idle>, ControlError)>) -> Phase {
        let idle = match result {
            Ok(idle) => idle,
            Err((idle, error)) => {
                log::warn(
                    "worker",
                    &format!("stopping worker {}: {error}", self.id.get()),
                );
                idle
            }
        };
        ffi::ctx_set_state(self.ctx.get(), CtxState::Idle);
        Phase::Idle(idle)
    }

    /// Readies the worker to wake a sleeping engine.
    fn request_notification(&self) -> i32 {
        let callbacks_due = self
            .pool
            .borrow()
            .as_ref()
            .is_some_and(|pool| !pool.done.borrow().is_empty());
        if callbacks_due {
            return notify::READY;
        }
        let Ok(phase) = self.phase.try_borrow() else {
            return notify::READY;
        };
        match &*phase {
            Phase::Idle(_) => return notify::NONE,
            Phase::StopRunning(_) | Phase::Moving => return notify::READY,
            Phase::Running(worker) if matches!(worker.state(), WorkerState::Failed(_)) => {
                return notify::READY;
            }
            // The service's answer comes through its reader thread, which wakes no one.
            Phase::Stopping(_) => return notify::SOON,
            Phase::Starting(_) | Phase::StopStarting(_) | Phase::Running(_) => {}
        }
        drop(phase);
        borrow::request_notification(&self.engine)
    }

    /// Runs the callbacks of the tasks completed so far.
    fn run_callbacks(&self, pool: &Rc<Pool>) -> usize {
        let ctx_data = ffi::ctx_user_data(self.ctx.get());
        let mut ran = 0;
        loop {
            let next = pool.done.borrow_mut().pop_front();
            let Some(index) = next else {
                return ran;
            };
            ran += 1;
            let task = &pool.tasks[index as usize];
            if let Some(cb) = task.cb.get() {
                ffi::call_cmd_cb(cb, task, ffi::task_user_data(task.task.get()), ctx_data);
            }
        }
    }
}

/// A worker's command tasks, allocated once.
pub(crate) struct Pool {
    serial: u64,
    worker: Weak<WorkerInner>,
    /// Never resized: each task's address is its C handle.
    tasks: Vec<CmdTask>,
    free: RefCell<Vec<u32>>,
    /// Completed tasks whose callbacks have not run.
    done: RefCell<VecDeque<u32>>,
    payload_cap: usize,
    response_cap: usize,
}

impl Pool {
    fn new(
        worker: &Rc<WorkerInner>,
        count: usize,
        payload_cap: usize,
        response_cap: usize,
    ) -> Result<Rc<Self>, Status> {
        let ctx = worker.ctx.get();
        let mut failed = false;
        let pool = Rc::new_cyclic(|weak: &Weak<Pool>| {
            let tasks: Vec<CmdTask> = (0..count)
                .map(|index| CmdTask::new(index as u32, weak.clone(), payload_cap, response_cap))
                .collect();
            // The tasks are in place (the vector never grows): their addresses are final.
            for task in &tasks {
                if !task.attach(ctx) {
                    failed = true;
                }
            }
            Pool {
                serial: worker.serial,
                worker: Rc::downgrade(worker),
                tasks,
                free: RefCell::new((0..count as u32).rev().collect()),
                done: RefCell::new(VecDeque::with_capacity(count)),
                payload_cap,
                response_cap,
            }
        });
        if failed {
            return Err(Status::NoMemory);
        }
        Ok(pool)
    }

    fn in_flight(&self) -> usize {
        self.tasks
            .iter()
            .filter(|t| t.state.get() == TaskState::InFlight)
            .count()
    }

    /// Stores task `index`'s outcome and queues its callback.
    fn complete(&self, index: u32, status: Status, response: &[u8]) {
        let Some(task) = self.tasks.get(index as usize) else {
            return;
        };
        if task.state.get() != TaskState::InFlight {
            return;
        }
        let len = response.len().min(task.response.len());
        task.response.write(&response[..len]);
        let _ = ffi::buf_set_data(task.response_buf, task.response.ptr(), len);
        ffi::task_set_status(task.task.get(), status);
        task.state.set(TaskState::Completed);
        self.done.borrow_mut().push_back(index);
    }
}

/// `struct doca_urom_worker_cmd_task`.
pub struct CmdTask {
    pub(crate) magic: Cell<u64>,
    index: u32,
    pool: Weak<Pool>,
    pub(crate) task: Cell<*mut DocaTask>,
    payload: RawBytes,
    pub(crate) payload_buf: *mut DocaBuf,
    response: RawBytes,
    pub(crate) response_buf: *mut DocaBuf,
    user_data: RawBytes,
    pub(crate) plugin: Cell<u64>,
    pub(crate) cb: Cell<Option<CmdTaskCb>>,
    state: Cell<TaskState>,
}

impl CmdTask {
    fn new(index: u32, pool: Weak<Pool>, payload_cap: usize, response_cap: usize) -> Self {
        let payload = RawBytes::new(payload_cap);
        let response = RawBytes::new(response_cap);
        let payload_buf = ffi::buf_create(&payload);
        let response_buf = ffi::buf_create(&response);
        Self {
            magic: Cell::new(CMD_TASK_MAGIC),
            index,
            pool,
            task: Cell::new(std::ptr::null_mut()),
            payload,
            payload_buf,
            response,
            response_buf,
            user_data: RawBytes::new(USER_DATA_LEN),
            plugin: Cell::new(0),
            cb: Cell::new(None),
            state: Cell::new(TaskState::Free),
        }
    }

    /// Makes its generic task on `ctx`; false when libdoca_common could not.
    fn attach(&self, ctx: *mut DocaCtx) -> bool {
        let handle = self as *const Self as *mut std::ffi::c_void;
        self.task
            .set(ffi::task_create(ctx, &ffi::CMD_TASK_OPS, handle));
        !self.task.get().is_null() && !self.payload_buf.is_null() && !self.response_buf.is_null()
    }

    /// The task, if `task` points to a live one.
    pub(crate) fn check(task: Option<&Self>) -> Result<&Self, Status> {
        task.filter(|t| t.magic.get() == CMD_TASK_MAGIC)
            .ok_or(Status::InvalidValue)
    }

    /// Fresh for a new command: the payload buffer's data spans it all (its capacity), the
    /// response is empty, the user data zero.
    fn reset(&self, plugin: u64) -> Result<(), Status> {
        ffi::buf_set_data(self.payload_buf, self.payload.ptr(), self.payload.len())?;
        ffi::buf_set_data(self.response_buf, self.response.ptr(), 0)?;
        self.user_data.clear();
        self.plugin.set(plugin);
        self.cb.set(None);
        ffi::task_set_status(self.task.get(), Status::Success);
        self.state.set(TaskState::Allocated);
        Ok(())
    }

    pub(crate) fn user_data_ptr(&self) -> *mut u8 {
        self.user_data.ptr()
    }

    /// `doca_task_submit()`: the payload buffer's data goes to the plugin.
    pub(crate) fn submit(&self) -> Result<(), Status> {
        if !matches!(
            self.state.get(),
            TaskState::Allocated | TaskState::Completed
        ) {
            return Err(Status::BadState);
        }
        if self.cb.get().is_none() {
            log::error("worker", "a command task was submitted without a callback");
            return Err(Status::InvalidValue);
        }
        let pool = self.pool.upgrade().ok_or(Status::BadState)?;
        let (data, len) = ffi::buf_data(self.payload_buf)?;
        let offset = (data as usize)
            .checked_sub(self.payload.ptr() as usize)
            .ok_or(Status::InvalidValue)?;
        let owner = pool.worker.upgrade().ok_or(Status::BadState)?;
        let phase = borrow::read(&owner.phase)?;
        let Phase::Running(worker) = &*phase else {
            return Err(Status::BadState);
        };
        let index = self.index;
        let serial = pool.serial;
        let mut copied = true;
        let result = worker.submit(self.plugin.get(), |slot| {
            let dst = slot.payload_mut();
            if len <= dst.len() {
                copied = self.payload.read(offset, &mut dst[..len]);
            }
            let user = slot.user_data_mut();
            user[..4].copy_from_slice(&index.to_le_bytes());
            user[8..16].copy_from_slice(&serial.to_le_bytes());
            slot.set_callback(on_complete);
            len
        });
        match result {
            Ok(_) if copied => {
                self.state.set(TaskState::InFlight);
                Ok(())
            }
            Ok(_) => Err(Status::InvalidValue),
            Err(error) => {
                log::error("worker", &format!("command not submitted: {error}"));
                Err(command_status(&error))
            }
        }
    }

    /// `doca_urom_worker_cmd_task_release()`: back to the pool, not while in flight.
    pub(crate) fn release(&self) -> Result<(), Status> {
        match self.state.get() {
            TaskState::InFlight => Err(Status::NotPermitted),
            TaskState::Free => Err(Status::BadState),
            TaskState::Allocated | TaskState::Completed => {
                self.state.set(TaskState::Free);
                if let Some(pool) = self.pool.upgrade() {
                    pool.free.borrow_mut().push(self.index);
                }
                Ok(())
            }
        }
    }
}

impl Drop for CmdTask {
    fn drop(&mut self) {
        ffi::task_destroy(self.task.replace(std::ptr::null_mut()));
        ffi::buf_destroy(self.payload_buf);
        ffi::buf_destroy(self.response_buf);
    }
}
