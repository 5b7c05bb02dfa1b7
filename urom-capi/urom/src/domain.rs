//! `struct doca_urom_domain`, over `urom_host::Domain`.
//!
//! A domain context keeps its settings as the program gave them (the program's out-of-band
//! collective, its workers with their domain ids, the buffer count and buffers) and builds a
//! Rust domain from them at each `doca_ctx_start()`: the workers are looked at then, and must be
//! running (`DOCA_ERROR_BAD_STATE` otherwise). The start returns `DOCA_ERROR_IN_PROGRESS`; the
//! domain's own progress engine drives the exchange from `doca_pe_progress()`, which also
//! progresses the workers when they are connected to the same engine (as a DOCA host connects
//! them). Running, the context reports `DOCA_CTX_STATE_RUNNING`; a start that fails is logged
//! and the context goes back to idle, its settings kept. `doca_ctx_stop()` leaves the domain
//! (or abandons its start) at once.

use std::cell::{Cell, Ref, RefCell};
use std::rc::Rc;

use urom_capi_abi::{CtxState, DocaCtx, Status, notify};
use urom_host::{
    Domain, DomainConfigError, DomainStartProgress, Idle, ProgressEngine, Running, Starting, Worker,
};

use crate::borrow;
use crate::ffi::{self, OobColl};
use crate::log;
use crate::worker::{WorkerInner, WorkerObj};

/// Marks a live domain.
pub(crate) const DOMAIN_MAGIC: u64 = 0x7572_6f6d_646f_6d31; // "uromdom1"

/// Where the Rust domain is.
enum Phase {
    Idle,
    Starting(Domain<Starting>),
    Running(Domain<Running>),
}

/// What the program set.
struct Settings {
    oob: Option<OobColl>,
    ids: Vec<u64>,
    workers: Vec<Rc<WorkerInner>>,
    buffer_count: Option<usize>,
    /// Holds the buffers added so far; its setters check them.
    buffers: Option<Domain<Idle>>,
}

/// `struct doca_urom_domain`.
pub struct DomainObj {
    pub(crate) magic: Cell<u64>,
    pub(crate) inner: Rc<DomainInner>,
}

pub(crate) struct DomainInner {
    pub(crate) ctx: Cell<*mut DocaCtx>,
    settings: RefCell<Settings>,
    phase: RefCell<Phase>,
    engine: RefCell<ProgressEngine>,
}

fn config_error(error: &DomainConfigError) -> Status {
    log::error("domain", &error.to_string());
    error.status()
}

impl DomainObj {
    pub(crate) fn new() -> Box<Self> {
        Box::new(Self {
            magic: Cell::new(DOMAIN_MAGIC),
            inner: Rc::new(DomainInner {
                ctx: Cell::new(std::ptr::null_mut()),
                settings: RefCell::new(Settings {
                    oob: None,
                    ids: Vec::new(),
                    workers: Vec::new(),
                    buffer_count: None,
                    buffers: Some(Domain::new()),
                }),
                phase: RefCell::new(Phase::Idle),
                engine: RefCell::new(ProgressEngine::new()),
            }),
        })
    }

    /// The domain, if `domain` points to a live one.
    pub(crate) fn check(domain: Option<&Self>) -> Result<&Self, Status> {
        domain
            .filter(|d| d.magic.get() == DOMAIN_MAGIC)
            .ok_or(Status::InvalidValue)
    }

    pub(crate) fn ctx(&self) -> *mut DocaCtx {
        self.inner.ctx.get()
    }

    /// Applies a setter while the domain is idle; `DOCA_ERROR_BAD_STATE` otherwise.
    fn configure<T>(
        &self,
        set: impl FnOnce(&mut Settings) -> Result<T, Status>,
    ) -> Result<T, Status> {
        let phase = borrow::read(&self.inner.phase)?;
        if !matches!(*phase, Phase::Idle) {
            log::error(
                "domain",
                "a started domain takes no settings: stop it first",
            );
            return Err(Status::BadState);
        }
        let mut settings = borrow::change(&self.inner.settings)?;
        set(&mut settings)
    }

    /// `doca_urom_domain_set_oob()`: a copy of the program's collective.
    pub(crate) fn set_oob(&self, oob: OobColl) -> Result<(), Status> {
        if let Err(why) = oob.collective() {
            log::error("domain", &why);
            return Err(Status::InvalidValue);
        }
        self.configure(|settings| {
            settings.oob = Some(oob);
            Ok(())
        })
    }

    /// `doca_urom_domain_set_workers()`: `workers[i]` is domain id `ids[i]`.
    pub(crate) fn set_workers(&self, ids: &[u64], workers: &[&WorkerObj]) -> Result<(), Status> {
        for (at, id) in ids.iter().enumerate() {
            if ids[..at].contains(id) {
                log::error(
                    "domain",
                    &format!("domain id {id} is given twice; each worker needs an id of its own"),
                );
                return Err(Status::InvalidValue);
            }
        }
        for (at, worker) in workers.iter().enumerate() {
            if workers[..at]
                .iter()
                .any(|other| Rc::ptr_eq(&other.inner, &worker.inner))
            {
                log::error("domain", &format!("worker {} is given twice", worker.id()));
                return Err(Status::InvalidValue);
            }
        }
        self.configure(|settings| {
            settings.ids = ids.to_vec();
            settings.workers = workers.iter().map(|w| Rc::clone(&w.inner)).collect();
            Ok(())
        })
    }

    /// `doca_urom_domain_set_buffers_count()`.
    pub(crate) fn set_buffers_count(&self, count: usize) -> Result<(), Status> {
        self.configure(|settings| {
            let buffers = settings.buffers.take().unwrap_or_default();
            let (buffers, result) = match buffers.set_buffers_count(count) {
                Ok(buffers) => (buffers, Ok(())),
                Err((buffers, error)) => (buffers, Err(config_error(&error))),
            };
            settings.buffers = Some(buffers);
            if result.is_ok() {
                settings.buffer_count = Some(count);
            }
            result
        })
    }

    /// `doca_urom_domain_add_buffer()`: its address and length, packed memory handle and
    /// remote key.
    pub(crate) fn add_buffer(
        &self,
        va: u64,
        len: u64,
        memh: &[u8],
        mkey: &[u8],
    ) -> Result<(), Status> {
        self.configure(|settings| {
            let buffers = settings.buffers.take().unwrap_or_default();
            let (buffers, result) = match buffers.add_buffer(va, len, memh, mkey) {
                Ok(buffers) => (buffers, Ok(())),
                Err((buffers, error)) => (buffers, Err(config_error(&error))),
            };
            settings.buffers = Some(buffers);
            result
        })
    }

    /// `doca_ctx_start()`: builds the Rust domain from the settings and starts it.
    pub(crate) fn start(&self) -> Result<(), Status> {
        let mut phase = borrow::change(&self.inner.phase)?;
        if !matches!(*phase, Phase::Idle) {
            return Err(Status::BadState);
        }
        let settings = borrow::read(&self.inner.settings)?;
        let domain = settings.domain()?;
        let mut engine = borrow::change(&self.inner.engine)?;
        match domain.start(&mut engine) {
            Ok(starting) => {
                *phase = Phase::Starting(starting);
                Err(Status::InProgress)
            }
            Err((_, error)) => {
                log::error("domain", &format!("the domain did not start: {error}"));
                Err(error.status())
            }
        }
    }

    /// `doca_ctx_stop()`: leaves the domain, or abandons its start, at once.
    pub(crate) fn stop(&self) -> Result<(), Status> {
        let mut phase = borrow::change(&self.inner.phase)?;
        match std::mem::replace(&mut *phase, Phase::Idle) {
            Phase::Idle => return Err(Status::BadState),
            Phase::Starting(_) => log::info("domain", "the domain's start was abandoned"),
            Phase::Running(running) => {
                log::info(
                    "domain",
                    &format!(
                        "rank {} left the domain of {} ranks",
                        running.rank(),
                        running.ranks()
                    ),
                );
                drop(running.stop());
            }
        }
        Ok(())
    }

    pub(crate) fn progress(&self) -> usize {
        // The object may be destroyed from a callback below; its inner part stays alive here.
        let inner = Rc::clone(&self.inner);
        inner.progress()
    }

    /// `doca_pe_request_notification()` for this context: a starting domain waits on the
    /// program's out-of-band collective, which wakes no one, so it is looked at again soon; a
    /// domain that runs, or is idle, has nothing to do until the program acts.
    pub(crate) fn request_notification(&self) -> i32 {
        match self.inner.phase.try_borrow().as_deref() {
            Ok(Phase::Starting(_)) => notify::SOON,
            Ok(Phase::Idle | Phase::Running(_)) => notify::NONE,
            Err(_) => notify::READY,
        }
    }

    /// Whether it may be destroyed: idle, and not inside its own progress.
    pub(crate) fn destroyable(&self) -> Result<(), Status> {
        let phase = self.inner.phase.try_borrow().map_err(|_| Status::InUse)?;
        match &*phase {
            Phase::Idle => Ok(()),
            _ => Err(Status::NotPermitted),
        }
    }

    /// Forgets its context; the caller frees the object and its context.
    pub(crate) fn retire(&self) {
        self.magic.set(0);
        self.inner.ctx.set(std::ptr::null_mut());
    }
}

impl Settings {
    /// A Rust domain of these settings; its workers must be running.
    fn domain(&self) -> Result<Domain<Idle>, Status> {
        let mut domain = Domain::new();
        if let Some(oob) = self.oob {
            // Checked when it was set.
            let oob = oob.collective().map_err(|_| Status::InvalidValue)?;
            domain = domain.set_oob(oob);
        }
        let mut running: Vec<Ref<'_, Worker<Running>>> = Vec::with_capacity(self.workers.len());
        for (id, worker) in self.ids.iter().zip(&self.workers) {
            match worker.running_worker() {
                Some(worker) => running.push(worker),
                None => {
                    log::error(
                        "domain",
                        &format!(
                            "the worker of domain id {id} is not running: start it and progress \
                             it until it runs before the domain starts"
                        ),
                    );
                    return Err(Status::BadState);
                }
            }
        }
        let workers: Vec<&Worker<Running>> = running.iter().map(|worker| &**worker).collect();
        domain = domain
            .set_workers(&self.ids, &workers)
            .map_err(|(_, error)| config_error(&error))?;
        drop(workers);
        drop(running);
        if let Some(count) = self.buffer_count {
            domain = domain
                .set_buffers_count(count)
                .map_err(|(_, error)| config_error(&error))?;
        }
        for buffer in self.buffers.iter().flat_map(|buffers| buffers.buffers()) {
            domain = domain
                .add_buffer(buffer.va, buffer.len, &buffer.memh, &buffer.mkey)
                .map_err(|(_, error)| config_error(&error))?;
        }
        Ok(domain)
    }
}

impl DomainInner {
    fn progress(&self) -> usize {
        let mut work = borrow::progress(&self.engine);
        let Ok(mut phase) = self.phase.try_borrow_mut() else {
            return work;
        };
        *phase = match std::mem::replace(&mut *phase, Phase::Idle) {
            Phase::Starting(starting) => match starting.try_running() {
                Ok(running) => {
                    work += 1;
                    log::info(
                        "domain",
                        &format!(
                            "the domain runs: rank {} of {} ranks, {} members",
                            running.rank(),
                            running.ranks(),
                            running.table().members().count()
                        ),
                    );
                    ffi::ctx_set_state(self.ctx.get(), CtxState::Running);
                    Phase::Running(running)
                }
                Err(DomainStartProgress::Starting(starting)) => Phase::Starting(starting),
                Err(DomainStartProgress::Failed(_, error)) => {
                    work += 1;
                    log::error("domain", &format!("the domain did not start: {error}"));
                    ffi::ctx_set_state(self.ctx.get(), CtxState::Idle);
                    Phase::Idle
                }
            },
            other => other,
        };
        work
    }
}
