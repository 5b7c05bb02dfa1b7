//! What the daemon's security tests share: a daemon with the graph plugin, a host, and a peer
//! running as `nobody`.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use urom_testkit::control::ControlClient;
use urom_testkit::daemon::{Daemon, plugin_dir, start_daemon};
use urom_testkit::{ChildGuard, TempDir, as_nobody, binary};

pub const TIMEOUT: Duration = Duration::from_secs(30);

pub fn daemon_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_urom-daemon"))
}

/// A daemon offering the graph plugin (id 1), with extra flags.
pub fn graph_daemon(extra: &[&str]) -> (TempDir, Daemon) {
    let plugins = TempDir::new("urom-security-plugins");
    let dir = plugin_dir(&plugins, &[("urom-plugin-graph", "worker_graph")]);
    let daemon = start_daemon(daemon_bin(), dir.to_str().unwrap(), extra, true);
    (plugins, daemon)
}

pub fn client(daemon: &Daemon) -> ControlClient {
    let mut client = ControlClient::connect(&daemon.socket, TIMEOUT).unwrap();
    client.handshake().unwrap();
    client
}

/// Reads the daemon's last word to `client`: a refusal for taking too long whose reason says
/// `why`, after which the connection is closed.
pub fn assert_timed_out(client: &mut ControlClient, why: &str) {
    let reply = client
        .try_read_frame()
        .expect("the daemon answered before the test gave up")
        .expect("an error reply");
    let (status, reason) = reply.refusal().unwrap_err();
    assert_eq!(status, urom_wire::Status::TimeOut, "{reason}");
    assert!(reason.contains(why), "{reason}");
    assert!(client.is_closed());
}

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// `urom-test-host` running as `nobody`, its output read line by line.
pub struct Peer {
    child: ChildGuard,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Peer {
    pub fn start(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Self {
        let mut command = Command::new(binary("urom-testkit", "urom-test-host"));
        for arg in args {
            command.arg(arg);
        }
        let mut child = as_nobody(&mut command)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting urom-test-host as nobody");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().unwrap();
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            child: ChildGuard(child),
            stdin,
            lines,
        }
    }

    /// The next line it prints.
    pub fn line(&self) -> String {
        self.lines
            .recv_timeout(TIMEOUT * 2)
            .expect("urom-test-host printed nothing more")
    }

    /// Ends its standard input (it lets go of what it holds) and returns the rest of what it
    /// prints.
    pub fn finish(mut self) -> Vec<String> {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.flush();
        }
        let mut rest = Vec::new();
        while let Ok(line) = self.lines.recv_timeout(TIMEOUT * 2) {
            rest.push(line);
        }
        self.child.wait_timeout(TIMEOUT);
        rest
    }
}

/// The pid of the process whose command line mentions `needle`.
pub fn pid_of(needle: &str) -> i32 {
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(needle) {
            return pid;
        }
    }
    panic!("no process mentions {needle}");
}
