//! What the host API tests share: a real daemon with the graph and faulty plugins.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use urom_core::host::{Idle, ProgressEngine, Running, Service, StartProgress, Worker};
use urom_testkit::daemon::{self, Daemon, plugin_dir};
use urom_testkit::{TempDir, binary};

pub const TIMEOUT: Duration = Duration::from_secs(30);

/// A daemon offering the graph and faulty plugins.
pub fn start_daemon() -> (TempDir, Daemon) {
    let plugins = TempDir::new("urom-host-plugins");
    let dir = plugin_dir(
        &plugins,
        &[
            ("urom-plugin-graph", "worker_graph"),
            ("urom-plugin-faulty", "worker_faulty"),
        ],
    );
    let daemon = daemon::start_daemon(
        binary("urom-daemon", "urom-daemon"),
        dir.to_str().unwrap(),
        &[],
        true,
    );
    (plugins, daemon)
}

pub fn start_service(daemon: &Daemon) -> Service<Running> {
    Service::<Idle>::new()
        .set_socket(&daemon.socket)
        .start()
        .map_err(|(_, e)| e)
        .unwrap()
}

/// Progresses `engine` until the worker runs.
pub fn run_worker(engine: &mut ProgressEngine, worker: Worker<Idle>) -> Worker<Running> {
    let mut starting = worker.start(engine).map_err(|(_, e)| e).unwrap();
    let deadline = Instant::now() + TIMEOUT;
    loop {
        engine.progress();
        match starting.try_running() {
            Ok(running) => return running,
            Err(StartProgress::Starting(again)) => starting = again,
            Err(StartProgress::Failed(_, e)) => panic!("worker failed to start: {e}"),
        }
        assert!(Instant::now() < deadline, "the worker did not start");
    }
}
