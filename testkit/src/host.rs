//! The host library against a real daemon: a service on the daemon's socket, a worker brought
//! to running by progressing its engine.

use std::time::Duration;

use urom_graph::GraphHost;
use urom_host::{Idle, ProgressEngine, Running, Service, StartProgress, Worker};

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

/// A daemon offering the graph and faulty plugins that also listens over UCX on 127.0.0.1 with
/// a key of its own, and a service that reaches it there (as root, the daemon runs such hosts'
/// workers as `nobody`); the directory holds the plugins and the key.
#[cfg(feature = "ucx")]
pub fn remote_service() -> (crate::TempDir, Daemon, Service<Running>) {
    use std::os::unix::fs::PermissionsExt;

    let dir = crate::TempDir::new("urom-remote-service");
    // The workers' user reads the plugins from here.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let key = dir.path().join("key");
    std::fs::write(&key, "a test's shared secret").unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let plugins = crate::daemon::plugin_dir(&dir, &crate::daemon::GRAPH_AND_FAULTY);
    let port = std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|listener| listener.local_addr())
        .expect("a free port on 127.0.0.1")
        .port();
    let address = format!("127.0.0.1:{port}");
    let key_path = key.to_str().expect("a UTF-8 path");
    let mut flags = vec!["--listen-ucx", &address, "--key-file", key_path];
    if nix::unistd::geteuid().is_root() {
        flags.extend(["--remote-user", "nobody"]);
    }
    let daemon = crate::daemon::start_daemon(
        crate::binary("urom-daemon", "urom-daemon"),
        plugins.to_str().expect("a UTF-8 path"),
        &flags,
        true,
    );
    let service = Service::<Idle>::new()
        .set_remote(&address)
        .set_key_file(&key)
        .set_identity("test")
        .start()
        .map_err(|(_, e)| e)
        .unwrap_or_else(|e| panic!("the remote service did not start: {e}\n{}", daemon.log()));
    (dir, daemon, service)
}
