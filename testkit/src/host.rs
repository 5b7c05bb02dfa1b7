//! The host library against a real daemon: a service on the daemon's socket, a worker brought
//! to running by progressing its engine.

use std::time::Duration;

use urom_core::graph::GraphHost;
use urom_core::host::{Idle, ProgressEngine, Running, Service, StartProgress, Worker};

use crate::daemon::Daemon;

/// How long a worker may take to start.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// A service on `daemon`'s socket with the default message size.
pub fn start_service(daemon: &Daemon) -> Service<Running> {
    Service::<Idle>::new()
        .set_socket(&daemon.socket)
        .start()
        .map_err(|(_, e)| e)
        .unwrap_or_else(|e| panic!("the service did not start: {e}"))
}

/// Progresses `engine` until the worker runs; panics if it fails or takes longer than
/// [`TIMEOUT`].
pub fn run_worker(engine: &mut ProgressEngine, worker: Worker<Idle>) -> Worker<Running> {
    try_run_worker(engine, worker).unwrap_or_else(|e| panic!("worker failed to start: {e}"))
}

/// Progresses `engine` until the worker runs or fails; a worker still starting after
/// [`TIMEOUT`] is an error too.
pub fn try_run_worker(
    engine: &mut ProgressEngine,
    worker: Worker<Idle>,
) -> Result<Worker<Running>, String> {
    let starting = worker.start(engine).map_err(|(_, e)| e.to_string())?;
    match starting.wait_running(engine, TIMEOUT) {
        Ok(running) => Ok(running),
        Err(StartProgress::Starting(_)) => {
            Err(format!("the worker did not start within {TIMEOUT:?}"))
        }
        Err(StartProgress::Failed(_, e)) => Err(e.to_string()),
    }
}

/// The host side of the graph plugin `service` offers; panics when it offers none.
pub fn graph_host(service: &Service<Running>) -> GraphHost {
    let info = service
        .plugin("worker_graph")
        .expect("the service offers the graph plugin");
    GraphHost::init(info.id, info.version).expect("the graph plugin's version is supported")
}
