//! Progress engines, generic contexts and tasks (`doca_pe.h`, `doca_ctx.h`).
//!
//! A context belongs to another library (libdoca_urom's service or worker): it asks for a
//! [`CtxObj`] with a table of operations ([`CtxOps`]) and its own object as `imp`. The generic
//! calls check what they can here (arguments, the state machine, the connection to a progress
//! engine) and hand the rest to the operations. State changes are recorded as they happen and
//! their callbacks run from `PeObj::progress`: those made outside it (by `doca_ctx_start()` or
//! `doca_ctx_stop()`) before the context is polled, those its polling made right after, so a
//! callback sees its context in the state it reports and may start, stop or destroy contexts,
//! submit tasks and connect new contexts.
//!
//! Notifications (`doca_pe_get_notification_handle()` and friends): the engine's handle is an
//! epoll set (`Notifier`) holding an eventfd, a timer and, once requested, each context's own
//! descriptor (a worker's or service's Rust progress engine's, itself an epoll set of that
//! context's wake-up descriptors). Requesting a notification asks every context for its
//! descriptor: one with work waiting (or a state change whose callback has not run) makes the
//! eventfd readable at once, one that cannot wake a sleeper sets the timer to `POLL_SOON`.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::ffi::c_void;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::rc::{Rc, Weak};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use urom_capi_abi::{CtxOps, CtxState, DocaData, StateChangedCb, Status, TaskOps, notify};

use crate::ffi;

/// Marks a live context object.
pub(crate) const CTX_MAGIC: u64 = 0x7572_6f6d_6374_7831; // "uromctx1"
/// Marks a live progress engine.
pub(crate) const PE_MAGIC: u64 = 0x7572_6f6d_7065_6e31; // "urompen1"
/// Marks a live task object.
pub(crate) const TASK_MAGIC: u64 = 0x7572_6f6d_7461_736b; // "uromtask"

/// `struct doca_ctx`.
pub struct CtxObj {
    pub(crate) magic: Cell<u64>,
    pub(crate) inner: Rc<CtxInner>,
}

/// A context's generic part.
pub(crate) struct CtxInner {
    ops: *const CtxOps,
    imp: *mut c_void,
    /// The C handle (the address of its [`CtxObj`]), given to state-changed callbacks.
    handle: Cell<*mut CtxObj>,
    state: Cell<CtxState>,
    user_data: Cell<u64>,
    state_cb: Cell<Option<StateChangedCb>>,
    /// State changes whose callback has not run yet.
    pending: RefCell<VecDeque<(CtxState, CtxState)>>,
    pe: RefCell<Weak<PeInner>>,
}

impl CtxObj {
    /// A context for `imp` whose generic calls go to `ops`; idle and not connected.
    pub(crate) fn new(ops: *const CtxOps, imp: *mut c_void) -> Box<Self> {
        let ctx = Box::new(Self {
            magic: Cell::new(CTX_MAGIC),
            inner: Rc::new(CtxInner {
                ops,
                imp,
                handle: Cell::new(std::ptr::null_mut()),
                state: Cell::new(CtxState::Idle),
                user_data: Cell::new(0),
                state_cb: Cell::new(None),
                pending: RefCell::new(VecDeque::with_capacity(4)),
                pe: RefCell::new(Weak::new()),
            }),
        });
        ctx.inner.handle.set(&*ctx as *const Self as *mut Self);
        ctx
    }

    /// The context, if `ctx` points to a live one.
    pub(crate) fn check(ctx: Option<&Self>) -> Result<&Self, Status> {
        ctx.filter(|ctx| ctx.magic.get() == CTX_MAGIC)
            .ok_or(Status::InvalidValue)
    }

    /// Disconnects from the progress engine; the object is freed by the caller.
    pub(crate) fn retire(&self) {
        if let Some(pe) = self.inner.pe.borrow().upgrade() {
            pe.ctxs
                .borrow_mut()
                .retain(|ctx| !Rc::ptr_eq(ctx, &self.inner));
        }
        self.inner.pending.borrow_mut().clear();
        self.magic.set(0);
    }

    pub(crate) fn state(&self) -> CtxState {
        self.inner.state.get()
    }

    pub(crate) fn set_state(&self, state: CtxState) {
        self.inner.set_state(state);
    }

    /// `doca_ctx_start()`.
    pub(crate) fn start(&self) -> Result<(), Status> {
        if self.state() != CtxState::Idle {
            return Err(Status::BadState);
        }
        if self.inner.pe.borrow().upgrade().is_none() {
            return Err(Status::NotConnected);
        }
        let status = ffi::ctx_start(self.inner.ops, self.inner.imp);
        match status {
            Status::Success => self.set_state(CtxState::Running),
            Status::InProgress => self.set_state(CtxState::Starting),
            _ => {}
        }
        status.into_result()
    }

    /// `doca_ctx_stop()`.
    pub(crate) fn stop(&self) -> Result<(), Status> {
        match self.state() {
            CtxState::Idle => return Err(Status::BadState),
            CtxState::Stopping => return Err(Status::InProgress),
            CtxState::Starting | CtxState::Running => {}
        }
        let status = ffi::ctx_stop(self.inner.ops, self.inner.imp);
        match status {
            Status::Success => self.set_state(CtxState::Idle),
            Status::InProgress => self.set_state(CtxState::Stopping),
            _ => {}
        }
        status.into_result()
    }

    pub(crate) fn inflight(&self) -> usize {
        self.inner.inflight()
    }

    pub(crate) fn user_data(&self) -> DocaData {
        DocaData::from_bits(self.inner.user_data.get())
    }

    pub(crate) fn set_user_data(&self, data: DocaData) {
        self.inner.user_data.set(data.bits());
    }

    pub(crate) fn set_state_cb(&self, cb: StateChangedCb) {
        self.inner.state_cb.set(Some(cb));
    }
}

impl CtxInner {
    fn set_state(&self, state: CtxState) {
        let prev = self.state.replace(state);
        if prev != state {
            self.pending.borrow_mut().push_back((prev, state));
        }
    }

    fn inflight(&self) -> usize {
        ffi::ctx_inflight(self.ops, self.imp)
    }

    /// Readies the context to wake the engine: its descriptor, or a [`notify`] answer.
    fn request_notification(&self) -> i32 {
        if !self.pending.borrow().is_empty() {
            return notify::READY;
        }
        ffi::ctx_request_notification(self.ops, self.imp)
    }

    fn clear_notification(&self) {
        ffi::ctx_clear_notification(self.ops, self.imp);
    }

    /// Runs the callbacks of the state changes recorded so far; returns how many.
    fn deliver_state_changes(&self) -> usize {
        let mut delivered = 0;
        loop {
            let Some((prev, next)) = self.pending.borrow_mut().pop_front() else {
                return delivered;
            };
            delivered += 1;
            if let Some(cb) = self.state_cb.get() {
                let data = DocaData::from_bits(self.user_data.get());
                ffi::call_state_cb(cb, data, self.handle.get(), prev, next);
            }
        }
    }
}

/// `struct doca_pe`.
pub struct PeObj {
    pub(crate) magic: Cell<u64>,
    inner: Rc<PeInner>,
}

pub(crate) struct PeInner {
    ctxs: RefCell<Vec<Rc<CtxInner>>>,
    progressing: Cell<bool>,
    /// Made by the first notification call.
    notifier: RefCell<Option<Notifier>>,
}

/// How soon a context that cannot wake a sleeping engine is looked at again.
pub(crate) const POLL_SOON: Duration = Duration::from_millis(1);

/// What a program sleeps on: the handle `doca_pe_get_notification_handle()` gives.
pub(crate) struct Notifier {
    /// The handle: holds `ready`, `timer` and the contexts' descriptors.
    epoll: Epoll,
    /// Readable while work waits already.
    ready: EventFd,
    /// Ends a sleep when some context cannot wake it.
    timer: TimerFd,
}

impl Notifier {
    fn new() -> nix::Result<Self> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        let ready = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?;
        let timer = TimerFd::new(
            ClockId::CLOCK_MONOTONIC,
            TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
        )?;
        epoll.add(&ready, EpollEvent::new(EpollFlags::EPOLLIN, 0))?;
        epoll.add(&timer, EpollEvent::new(EpollFlags::EPOLLIN, 0))?;
        Ok(Self {
            epoll,
            ready,
            timer,
        })
    }

    /// Watches a context's descriptor (once: it stays in the set until the context closes it).
    fn watch(&self, fd: RawFd) -> nix::Result<()> {
        match ffi::epoll_watch(&self.epoll, fd) {
            Ok(()) | Err(Errno::EEXIST) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Quiet again: the eventfd read, the timer stopped and its expiry read.
    fn quiet(&self) {
        let _ = self.ready.read();
        let _ = self.timer.unset();
        let mut expirations = [0u8; 8];
        let _ = nix::unistd::read(&self.timer, &mut expirations);
    }
}

fn os_status(errno: Errno) -> Status {
    match errno {
        Errno::ENOMEM | Errno::ENOSPC => Status::NoMemory,
        Errno::EMFILE | Errno::ENFILE => Status::Full,
        _ => Status::OperatingSystem,
    }
}

impl PeObj {
    pub(crate) fn new() -> Box<Self> {
        Box::new(Self {
            magic: Cell::new(PE_MAGIC),
            inner: Rc::new(PeInner {
                ctxs: RefCell::new(Vec::new()),
                progressing: Cell::new(false),
                notifier: RefCell::new(None),
            }),
        })
    }

    /// The engine, if `pe` points to a live one.
    pub(crate) fn check(pe: Option<&Self>) -> Result<&Self, Status> {
        pe.filter(|pe| pe.magic.get() == PE_MAGIC)
            .ok_or(Status::InvalidValue)
    }

    /// Whether contexts are still connected (then it cannot be destroyed).
    pub(crate) fn in_use(&self) -> bool {
        !self.inner.ctxs.borrow().is_empty()
    }

    pub(crate) fn retire(&self) {
        self.magic.set(0);
    }

    /// `doca_pe_connect_ctx()`.
    pub(crate) fn connect(&self, ctx: &CtxObj) -> Result<(), Status> {
        if ctx.state() != CtxState::Idle {
            return Err(Status::BadState);
        }
        let mut pe = ctx.inner.pe.borrow_mut();
        if pe.upgrade().is_some() {
            return Err(Status::NotPermitted);
        }
        *pe = Rc::downgrade(&self.inner);
        self.inner.ctxs.borrow_mut().push(Rc::clone(&ctx.inner));
        Ok(())
    }

    /// `doca_pe_progress()`: polls every connected context, then runs the callbacks of their
    /// state changes; 1 when anything happened. A call from inside one of its own callbacks
    /// does nothing.
    pub(crate) fn progress(&self) -> u8 {
        if self.inner.progressing.replace(true) {
            return 0;
        }
        let mut work = 0;
        let mut index = 0;
        loop {
            // Callbacks may connect or destroy contexts: look the list up afresh each time.
            let Some(ctx) = self.inner.ctxs.borrow().get(index).cloned() else {
                break;
            };
            // Changes made since the last progress (by doca_ctx_start() or doca_ctx_stop())
            // are reported before the context moves on, then those its progress made: each
            // callback sees the context in the state it reports.
            work += ctx.deliver_state_changes();
            work += ffi::ctx_progress(ctx.ops, ctx.imp);
            work += ctx.deliver_state_changes();
            index += 1;
        }
        self.inner.progressing.set(false);
        u8::from(work > 0)
    }

    pub(crate) fn inflight(&self) -> usize {
        self.inner
            .ctxs
            .borrow()
            .iter()
            .map(|ctx| ctx.inflight())
            .sum()
    }

    /// The `index`th context connected, if there are as many.
    fn ctx_at(&self, index: usize) -> Option<Rc<CtxInner>> {
        self.inner.ctxs.borrow().get(index).cloned()
    }

    /// The notifier, made on first use.
    fn notifier(&self) -> Result<std::cell::Ref<'_, Notifier>, Status> {
        if self.inner.notifier.borrow().is_none() {
            let notifier = Notifier::new().map_err(os_status)?;
            *self.inner.notifier.borrow_mut() = Some(notifier);
        }
        Ok(std::cell::Ref::map(self.inner.notifier.borrow(), |n| {
            n.as_ref().expect("made just above")
        }))
    }

    /// `doca_pe_get_notification_handle()`: the epoll descriptor, the same one every time.
    pub(crate) fn notification_handle(&self) -> Result<RawFd, Status> {
        Ok(self.notifier()?.epoll.0.as_fd().as_raw_fd())
    }

    /// `doca_pe_request_notification()`: arms every context; the handle becomes readable when
    /// one may have work (at once when work is waiting already).
    pub(crate) fn request_notification(&self) -> Result<(), Status> {
        let notifier = self.notifier()?;
        notifier.quiet();
        let mut ready = false;
        let mut soon = false;
        let mut index = 0;
        while let Some(ctx) = self.ctx_at(index) {
            index += 1;
            match ctx.request_notification() {
                notify::READY => ready = true,
                notify::SOON => soon = true,
                notify::NONE => {}
                fd if fd >= 0 => {
                    if let Err(e) = notifier.watch(fd) {
                        drop(notifier);
                        self.clear_notification();
                        return Err(os_status(e));
                    }
                }
                // An answer of no kind above: look at it soon rather than sleep through it.
                _ => soon = true,
            }
        }
        if ready {
            notifier.ready.write(1).map_err(os_status)?;
        } else if soon {
            notifier
                .timer
                .set(
                    Expiration::OneShot(TimeSpec::from(POLL_SOON)),
                    TimerSetTimeFlags::empty(),
                )
                .map_err(os_status)?;
        }
        Ok(())
    }

    /// `doca_pe_clear_notification()`: disarms every context; the handle is quiet again.
    pub(crate) fn clear_notification(&self) {
        let mut index = 0;
        while let Some(ctx) = self.ctx_at(index) {
            index += 1;
            ctx.clear_notification();
        }
        if let Some(notifier) = self.inner.notifier.borrow().as_ref() {
            notifier.quiet();
        }
    }
}

/// `struct doca_task`: the generic part of another library's task.
pub struct TaskObj {
    pub(crate) magic: Cell<u64>,
    ctx: Weak<CtxInner>,
    ops: *const TaskOps,
    imp: *mut c_void,
    user_data: Cell<u64>,
    status: Cell<i32>,
}

impl TaskObj {
    pub(crate) fn new(ctx: &CtxObj, ops: *const TaskOps, imp: *mut c_void) -> Box<Self> {
        Box::new(Self {
            magic: Cell::new(TASK_MAGIC),
            ctx: Rc::downgrade(&ctx.inner),
            ops,
            imp,
            user_data: Cell::new(0),
            status: Cell::new(0),
        })
    }

    /// The task, if `task` points to a live one.
    pub(crate) fn check(task: Option<&Self>) -> Result<&Self, Status> {
        task.filter(|task| task.magic.get() == TASK_MAGIC)
            .ok_or(Status::InvalidValue)
    }

    pub(crate) fn retire(&self) {
        self.magic.set(0);
    }

    /// `doca_task_submit()`: only while its context runs.
    pub(crate) fn submit(&self) -> Result<(), Status> {
        let ctx = self.ctx.upgrade().ok_or(Status::BadState)?;
        if ctx.state.get() != CtxState::Running {
            return Err(Status::BadState);
        }
        ffi::task_submit(self.ops, self.imp).into_result()
    }

    /// `doca_task_free()`.
    pub(crate) fn free(&self) {
        ffi::task_free(self.ops, self.imp);
    }

    pub(crate) fn status(&self) -> i32 {
        self.status.get()
    }

    pub(crate) fn set_status(&self, status: i32) {
        self.status.set(status);
    }

    pub(crate) fn user_data(&self) -> DocaData {
        DocaData::from_bits(self.user_data.get())
    }

    pub(crate) fn set_user_data(&self, data: DocaData) {
        self.user_data.set(data.bits());
    }

    /// The handle of the context that allocated it, null once that is gone.
    pub(crate) fn ctx_handle(&self) -> *mut CtxObj {
        self.ctx
            .upgrade()
            .map_or(std::ptr::null_mut(), |ctx| ctx.handle.get())
    }
}
