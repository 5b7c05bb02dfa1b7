//! The host API of urom: what an HPC or AI runtime embeds to offload work.
//!
//! * [`ProgressEngine`]: single-threaded, owned by the caller (one per thread); `progress()`
//!   polls every context connected to it, completes tasks and runs their callbacks.
//! * [`Service`]: `Service<Idle>` (where the service is, message size, worker limit) ->
//!   `start()` connects and authenticates -> `Service<Running>` (plugins, CPU set, queries by
//!   group id) -> `stop()`. A running service is shared by every thread's workers.
//! * [`Service::status`] and [`Service::destroy_worker`]: what an operator asks of the daemon
//!   (`urom-ctl`): its status report and stopping a worker by id.
//! * [`Worker`]: `Worker<Idle>` (service, id, group, plugins, CPUs, environment, in-flight
//!   tasks) -> `start()` -> `Worker<Starting>`, progressed until it is running ->
//!   `Worker<Running>` (command tasks) -> `stop()`.
//!
//! * [`Domain`]: `Domain<Idle>` (out-of-band collective, workers with their domain ids,
//!   buffers) -> `start()` -> `Domain<Starting>`, progressed until every host's workers have
//!   the domain's table -> `Domain<Running>` -> `stop()`. The collective is an
//!   [`oob::OobCollective`]; [`oob::SocketOob`] is a rendezvous over a socket that needs no
//!   MPI.
//!
//! Methods that are wrong in a state do not exist in that state, and a context holds in each
//! state only what is true of it (an idle worker has no channel, a running one always has).
//!
//! A running worker's commands are tasks from [`TaskSlots`] allocated when it starts. It fails
//! ([`WorkerState::Failed`] with a [`WorkerFailure`]) when its process ends, its channel breaks,
//! it is stopped, or it sends anything but a notification for a task in flight (a frame that
//! does not parse, a command, a notification for a task already completed or never submitted:
//! [`WorkerProtocolError`]). The host then closes the channel and completes every task in
//! flight exactly once, with [`WorkerFailure::status`].
//!
//! ```compile_fail
//! use urom_host::{Idle, Worker};
//! let worker = Worker::<Idle>::new();
//! worker.id(); // an idle worker has no id yet
//! ```
//!
//! ```compile_fail
//! use urom_host::{Idle, Service};
//! let service = Service::<Idle>::new();
//! service.plugins(); // an idle service has not listed its plugins
//! ```
//!
//! ```compile_fail
//! use urom_host::{Domain, Running};
//! fn grow(domain: Domain<Running>) {
//!     domain.set_buffers_count(2); // a started domain takes no settings
//! }
//! ```
//!
//! Plugins' host-side helpers (`urom-graph`, `urom-sandbox`, ...) build their typed commands on
//! [`Worker::submit`]. This crate has no unsafe code.
#![forbid(unsafe_code)]

mod control;
mod domain;
mod engine;
#[cfg(feature = "ucx")]
mod memory;
pub mod oob;
mod service;
mod service_file;
mod start;
mod status;
mod task;
mod worker;

pub use control::ControlError;
pub use domain::{Domain, DomainBuffer, DomainConfigError, DomainStartError, DomainStartProgress};
pub use engine::{ProgressEngine, WaitStats};
#[cfg(feature = "ucx")]
pub use memory::HostMemory;
pub use service::{GidCallback, Service, ServicePlugin, ServiceStartError};
pub use service_file::{
    SERVICE_FILE_VAR, ServiceFileError, ServiceLine, lookup_service, same_pci, service_lines,
};
pub use start::Progress;
pub use status::StatusReport;
pub use task::{
    CompletedTask, TaskCallback, TaskCompleteError, TaskHandle, TaskLoan, TaskLoanError, TaskSlots,
    TaskSlotsNewError, TaskSubmitError, TaskWriteError, USER_DATA_LEN,
};
pub use urom_contract::{default_service_socket, writable_dir};
pub use worker::{
    CommandError, CommandTask, StartProgress, StopProgress, Worker, WorkerFailure,
    WorkerProtocolError, WorkerStartError, WorkerState, WorkerStop,
};

mod sealed {
    /// Seals [`State`](super::State) and says what each context holds in each state, so that
    /// a context in one state carries only what is true of it.
    pub trait Sealed {
        /// What a [`Service`](super::Service) holds in this state besides its settings.
        type Service;
        /// What a [`Worker`](super::Worker) holds in this state besides its settings.
        type Worker;
        /// What a [`Domain`](super::Domain) holds in this state besides its settings.
        type Domain;
    }
}

/// A context's lifecycle state.
pub trait State: sealed::Sealed {}

/// Configured, not started.
#[derive(Debug)]
pub struct Idle;
/// Started; progress until it is running.
#[derive(Debug)]
pub struct Starting;
/// Running: its operations are available.
#[derive(Debug)]
pub struct Running;

impl sealed::Sealed for Idle {
    type Service = ();
    type Worker = worker::Unstarted;
    type Domain = domain::Unstarted;
}
impl sealed::Sealed for Starting {
    // A service starts in one call: there is no starting service.
    type Service = core::convert::Infallible;
    type Worker = worker::Started;
    type Domain = domain::Started;
}
impl sealed::Sealed for Running {
    type Service = service::Connected;
    type Worker = worker::Started;
    type Domain = domain::Joined;
}
impl State for Idle {}
impl State for Starting {}
impl State for Running {}
