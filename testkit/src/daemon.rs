//! A real `urom-daemon` for tests and benches: plugins copied into a directory of their own,
//! the daemon's socket and logs in a temporary directory.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{ChildGuard, TempDir, binary, cdylib};

/// A running daemon, stopped (with its workers) when dropped.
pub struct Daemon {
    /// The daemon process.
    pub child: ChildGuard,
    /// Its socket.
    pub socket: PathBuf,
    /// Its log directory (holds `urom_daemon_dev.log`).
    pub dir: TempDir,
}

impl Daemon {
    /// The daemon's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("urom_daemon_dev.log")).unwrap_or_default()
    }

    /// The daemon's process id.
    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.0.id()).expect("process ids fit an i32")
    }

    /// Whether the daemon still runs.
    pub fn is_running(&self) -> bool {
        crate::process::alive(self.pid())
    }

    /// The process of the daemon's worker `worker_id`, if it runs.
    pub fn worker_pid(&self, worker_id: u64) -> Option<i32> {
        crate::process::worker_pid(self.pid(), worker_id)
    }
}

/// A plugin directory holding each `(package, library)` plugin as `<library>.so`.
pub fn plugin_dir(parent: &TempDir, plugins: &[(&str, &str)]) -> PathBuf {
    let dir = parent.path().join("plugins");
    std::fs::create_dir_all(&dir).expect("creating the plugin directory");
    for (package, library) in plugins {
        std::fs::copy(cdylib(package, library), dir.join(format!("{library}.so")))
            .expect("copying a plugin");
    }
    dir
}

/// Starts `daemon` (the program) with `UROM_PLUGIN_PATH` set to `plugin_path` and extra
/// flags; waits until its socket is there unless `wait` is false.
pub fn start_daemon(daemon: PathBuf, plugin_path: &str, extra: &[&str], wait: bool) -> Daemon {
    start_daemon_command(Command::new(daemon), plugin_path, extra, wait)
}

/// A command that runs `program` with at most `open_files` open files (soft and hard limit),
/// through `sh`'s `ulimit`; the program keeps the shell's process id.
pub fn with_open_file_limit(program: &Path, open_files: u32) -> Command {
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(format!("ulimit -n {open_files} && exec \"$0\" \"$@\""))
        .arg(program);
    command
}

/// [`start_daemon`] with the daemon started by `command` (the program and any arguments before
/// the daemon's own).
pub fn start_daemon_command(
    mut command: Command,
    plugin_path: &str,
    extra: &[&str],
    wait: bool,
) -> Daemon {
    let dir = TempDir::new("urom-daemon");
    let socket = dir.path().join("urom.sock");
    let child = command
        .arg("--listen")
        .arg(&socket)
        .arg("--log-dir")
        .arg(dir.path())
        .arg("--worker-bin")
        .arg(binary("urom-worker", "urom-worker"))
        .args(extra)
        .env("UROM_PLUGIN_PATH", plugin_path)
        .stdout(Stdio::null())
        .spawn()
        .expect("starting urom-daemon");
    let daemon = Daemon {
        child: ChildGuard(child),
        socket,
        dir,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while wait && !daemon.socket.exists() {
        assert!(
            Instant::now() < deadline,
            "the daemon did not come up:\n{}",
            daemon.log()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    daemon
}

/// The graph and faulty plugins (package and library name each), which most tests' daemons
/// offer.
pub const GRAPH_AND_FAULTY: [(&str, &str); 2] = [
    ("urom-plugin-graph", "worker_graph"),
    ("urom-plugin-faulty", "worker_faulty"),
];

/// A daemon offering the graph and faulty plugins (`worker_graph` and `worker_faulty`),
/// started with `extra` flags; the directory holding the plugins goes with it.
pub fn graph_and_faulty(extra: &[&str]) -> (TempDir, Daemon) {
    let plugins = TempDir::new("urom-plugins");
    let dir = plugin_dir(&plugins, &GRAPH_AND_FAULTY);
    let daemon = start_daemon(
        binary("urom-daemon", "urom-daemon"),
        dir.to_str().expect("a UTF-8 path"),
        extra,
        true,
    );
    (plugins, daemon)
}

/// Writes `secret` to a key file `name` in `dir` that only its owner may read, as the daemon
/// and hosts require.
pub fn write_key(dir: &Path, name: &str, secret: &[u8]) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let key = dir.join(name);
    std::fs::write(&key, secret).expect("writing a key file");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))
        .expect("making the key file private");
    key
}

/// A daemon in namespace `service` of `network` that serves hosts in namespace `hosts` at a
/// front door on its address towards them (UCX over TCP on that device), with `key`, running
/// their workers as `nobody`; it offers the plugins in `plugin_path`. Returns it and the front
/// door's `IP:PORT`.
pub fn start_remote_daemon(
    network: &crate::netns::Network,
    service: usize,
    hosts: usize,
    plugin_path: &Path,
    key: &Path,
) -> (Daemon, String) {
    let ip = network.hub_address(hosts);
    let port = network.run_in(service, || {
        std::net::TcpListener::bind((ip, 0))
            .and_then(|listener| listener.local_addr())
            .expect("a free port on the service's address")
            .port()
    });
    let address = format!("{ip}:{port}");
    let mut command = network.command(service, binary("urom-daemon", "urom-daemon"));
    command
        .env("UCX_TLS", "tcp")
        .env("UCX_NET_DEVICES", network.device(service, hosts))
        .env("UCX_WARN_UNUSED_ENV_VARS", "n");
    let daemon = start_daemon_command(
        command,
        plugin_path.to_str().expect("a UTF-8 path"),
        &[
            "--listen-ucx",
            &address,
            "--key-file",
            key.to_str().expect("a UTF-8 path"),
            "--remote-user",
            "nobody",
        ],
        true,
    );
    (daemon, address)
}
