//! What the host API tests share: a real daemon with the graph and faulty plugins.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use urom_core::host::{Idle, ProgressEngine, Running, Service, StartProgress, Worker};
use urom_testkit::{ChildGuard, TempDir, binary, cdylib};

pub const TIMEOUT: Duration = Duration::from_secs(30);

pub struct Daemon {
    _child: ChildGuard,
    pub socket: PathBuf,
    _dir: TempDir,
}

pub fn start_daemon() -> Daemon {
    let dir = TempDir::new("urom-host-test");
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    std::fs::copy(
        cdylib("urom-plugin-graph", "worker_graph"),
        plugins.join("worker_graph.so"),
    )
    .unwrap();
    std::fs::copy(
        cdylib("urom-plugin-faulty", "worker_faulty"),
        plugins.join("worker_faulty.so"),
    )
    .unwrap();
    let socket = dir.path().join("urom.sock");
    let child = Command::new(binary("urom-daemon", "urom-daemon"))
        .arg("--listen")
        .arg(&socket)
        .arg("--log-dir")
        .arg(dir.path())
        .arg("--worker-bin")
        .arg(binary("urom-worker", "urom-worker"))
        .env("UROM_PLUGIN_PATH", &plugins)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + TIMEOUT;
    while !socket.exists() {
        assert!(Instant::now() < deadline, "the daemon did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
    Daemon {
        _child: ChildGuard(child),
        socket,
        _dir: dir,
    }
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
