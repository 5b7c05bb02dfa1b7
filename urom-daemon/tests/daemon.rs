//! A real `urom-daemon` process with real plugins and workers, driven over its socket.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use urom_core::graph::{GraphCommand, GraphNotification};
use urom_core::transport::Transport;
use urom_core::transport::{Channel, ChannelConfig};
use urom_testkit::control::ControlClient;
use urom_testkit::daemon::{Daemon, plugin_dir, start_daemon};
use urom_testkit::{TempDir, binary, c_shared_object, workspace_root};
use urom_wire::control::WORKER_ID_ANY;
use urom_wire::data::{COMMAND_PAYLOAD_OFFSET, DataMessage, write_command_headers};
use urom_wire::{FrameRepr, MaxMsgSize, Status};

const TIMEOUT: Duration = Duration::from_secs(30);
const SIGTERM: i32 = 15;
const SIGKILL: i32 = 9;

fn client(daemon: &Daemon) -> ControlClient {
    let mut client = ControlClient::connect(&daemon.socket, TIMEOUT).unwrap();
    client.handshake().unwrap();
    client
}

/// A plugin directory holding the graph plugin as `worker_graph.so`.
fn graph_dir(parent: &TempDir) -> PathBuf {
    plugin_dir(parent, &[("urom-plugin-graph", "worker_graph")])
}

fn start(plugin_path: &str, extra: &[&str]) -> Daemon {
    start_daemon(
        PathBuf::from(env!("CARGO_BIN_EXE_urom-daemon")),
        plugin_path,
        extra,
        false,
    )
}

/// A daemon offering the graph plugin (id 1).
fn graph_daemon() -> (TempDir, Daemon) {
    let plugins = TempDir::new("urom-daemon-plugins");
    let dir = graph_dir(&plugins);
    let daemon = start(dir.to_str().unwrap(), &[]);
    (plugins, daemon)
}

/// One graph loopback command through a worker's socket.
fn loopback_through(socket: &Path, data: u64) {
    let stream = std::os::unix::net::UnixStream::connect(socket).unwrap();
    let mut conn = Channel::accept(stream, &ChannelConfig::default()).unwrap();
    let mut frame = [0u8; 64];
    let len = write_command_headers(&mut frame, 1, 1, data, 16, MaxMsgSize::DEFAULT).unwrap();
    GraphCommand::Loopback { data }
        .pack(&mut frame[COMMAND_PAYLOAD_OFFSET..])
        .unwrap();
    conn.send(&frame[..len]).unwrap();
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Some(reply) = conn.recv().unwrap() {
            let FrameRepr {
                body: DataMessage::Notify(notify),
                ..
            } = FrameRepr::<DataMessage>::parse(reply, MaxMsgSize::DEFAULT).unwrap()
            else {
                panic!("not a notification");
            };
            assert_eq!(
                (notify.urom_context, notify.status),
                (data, Status::Success)
            );
            assert_eq!(
                GraphNotification::unpack(notify.payload),
                Ok(GraphNotification::Loopback { data })
            );
            return;
        }
        assert!(Instant::now() < deadline, "no answer from the worker");
        conn.wait_recv(Duration::from_millis(10)).unwrap();
    }
}

/// The pid of the process whose command line mentions `needle`.
fn pid_of(needle: &str) -> i32 {
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

#[test]
fn discovery_reports_exactly_the_good_plugins() {
    let plugins = TempDir::new("urom-discovery");
    let dir = graph_dir(&plugins);
    let root = workspace_root();
    let source = root.join("plugins/c-loopback/loopback.c");
    let include = root.join("plugins/include");
    let c_plugin = |name: &str, defines: &[&str]| {
        let built = c_shared_object(&source, name, &[&include], defines);
        std::fs::copy(built, dir.join(format!("{name}.so"))).unwrap();
    };
    c_plugin("worker_c_loopback", &[]);
    c_plugin("worker_no_iface", &["OMIT_GET_IFACE"]);
    c_plugin("worker_crash", &["CRASH_ON_LOAD"]);
    c_plugin("worker_bad_version", &["GET_VERSION_FAILS"]);
    c_plugin("worker_hang", &["HANG_ON_LOAD"]);
    std::fs::write(dir.join("notes.so"), "not a library").unwrap();
    std::fs::write(dir.join("README.txt"), "plugins live here").unwrap();
    let path = format!(
        "{};{}",
        dir.display(),
        plugins.path().join("missing").display()
    );
    let daemon = start(&path, &[]);

    let mut host = client(&daemon);
    let expected = vec![
        (1, 1, "worker_c_loopback".to_owned()),
        (2, 1, "worker_graph".to_owned()),
    ];
    assert_eq!(host.plugins(), expected);
    // The daemon is still up for another host, which gets the same ids.
    let mut second = client(&daemon);
    assert_eq!(second.plugins(), expected);

    let log = daemon.log();
    for reason in [
        "does not export `urom_plugin_get_iface`",
        "crashed while loading (signal 11)",
        "`urom_plugin_get_version` failed",
        "hung while loading",
        "notes.so",
        "plugin directory skipped",
    ] {
        assert!(log.contains(reason), "log lacks {reason:?}:\n{log}");
    }
}

#[test]
fn workers_spawn_attach_query_and_destroy() {
    let (_plugins, daemon) = graph_daemon();
    let mut host = client(&daemon);
    assert_eq!(host.plugins().len(), 1);
    let cpus = host.cpuset();
    assert!(!cpus.is_empty());

    let mut sockets = Vec::new();
    for id in 0..4u64 {
        let (worker_id, socket) = host.spawn(id, (id % 2) as u32, 1, "", &[]).unwrap();
        assert_eq!(worker_id, id);
        sockets.push(socket);
    }
    assert_eq!(host.by_gid(0), vec![0, 2]);
    assert_eq!(host.by_gid(1), vec![1, 3]);
    for (id, socket) in sockets.iter().enumerate() {
        loopback_through(socket, id as u64 + 100);
    }

    // A fresh id for WORKER_ID_ANY.
    let (fresh, _) = host
        .spawn(WORKER_ID_ANY, 5, 1, "", &["UROM_TEST=1"])
        .unwrap();
    assert!(fresh > 3 && fresh != WORKER_ID_ANY);

    // A second host attaches to worker 2 and reaches it through the same socket.
    let mut second = client(&daemon);
    let (attached, socket) = second.spawn(2, 0, 1, "", &[]).unwrap();
    assert_eq!((attached, &socket), (2, &sockets[2]));
    loopback_through(&socket, 7);

    // Refusals.
    let (status, reason) = host.spawn(2, 0, 1, "", &["A=b"]).unwrap_err();
    assert_eq!(status, Status::AlreadyExist, "{reason}");
    let (status, reason) = host.spawn(9, 0, 1, "1000", &[]).unwrap_err();
    assert_eq!(status, Status::InvalidValue);
    assert!(reason.contains("outside the service's CPUs"), "{reason}");
    let (status, _) = host.spawn(9, 0, 1 << 5, "", &[]).unwrap_err();
    assert_eq!(status, Status::NotFound);
    let (status, _) = host.destroy(42).unwrap_err();
    assert_eq!(status, Status::NotFound);

    // Destroy: the worker stops and its id is free again.
    let old_pid = pid_of(&sockets[3].display().to_string());
    host.destroy(3).unwrap();
    assert_eq!(host.by_gid(1), vec![1]);
    let (again, socket) = host.spawn(3, 1, 1, "", &[]).unwrap();
    assert_eq!(again, 3);
    assert_eq!(host.by_gid(1), vec![1, 3]);
    // The new worker has a socket of its own, which the old one's exit leaves alone.
    assert_ne!(socket, sockets[3]);
    let deadline = Instant::now() + TIMEOUT;
    while Path::new(&format!("/proc/{old_pid}")).exists() {
        assert!(Instant::now() < deadline, "the old worker 3 still runs");
        std::thread::sleep(Duration::from_millis(10));
    }
    loopback_through(&socket, 9);
}

#[test]
fn the_worker_limit_is_enforced() {
    let plugins = TempDir::new("urom-daemon-plugins");
    let dir = graph_dir(&plugins);
    let daemon = start(dir.to_str().unwrap(), &["--max-workers", "2"]);
    let mut host = client(&daemon);
    host.spawn(0, 0, 1, "", &[]).unwrap();
    host.spawn(1, 0, 1, "", &[]).unwrap();
    let (status, reason) = host.spawn(2, 0, 1, "", &[]).unwrap_err();
    assert_eq!(status, Status::Full, "{reason}");
}

#[test]
fn a_killed_worker_is_reaped_and_its_hosts_are_told() {
    let (_plugins, daemon) = graph_daemon();
    let mut host = client(&daemon);
    let (_, doomed) = host.spawn(7, 0, 1, "", &[]).unwrap();
    let (_, survivor) = host.spawn(8, 0, 1, "", &[]).unwrap();
    let pid = pid_of(&doomed.display().to_string());
    let status = Command::new("kill")
        .arg(format!("-{SIGKILL}"))
        .arg(pid.to_string())
        .status();
    assert!(status.unwrap().success());

    let exit = host.next_event();
    assert_eq!((exit.worker_id, exit.signal), (7, SIGKILL));
    assert_eq!(host.by_gid(0), vec![8]);
    loopback_through(&survivor, 3);
    // Its id is free again.
    assert_eq!(host.spawn(7, 0, 1, "", &[]).unwrap().0, 7);
}

#[test]
fn a_host_that_leaves_takes_its_workers_along() {
    let (_plugins, daemon) = graph_daemon();
    let mut first = client(&daemon);
    let (_, socket) = first.spawn(0, 0, 1, "", &[]).unwrap();
    let mut second = client(&daemon);
    second.spawn(1, 0, 1, "", &[]).unwrap();
    drop(first);
    let deadline = Instant::now() + TIMEOUT;
    while second.by_gid(0) != vec![1] {
        assert!(Instant::now() < deadline, "worker 0 outlived its host");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!socket.exists());
}

#[test]
fn bad_frames_get_errors_and_other_hosts_go_on() {
    let (_plugins, daemon) = graph_daemon();
    let mut good = client(&daemon);
    assert_eq!(good.plugins().len(), 1);

    // Garbage: an error reply, then the connection is closed.
    let mut garbage = ControlClient::connect(&daemon.socket, TIMEOUT).unwrap();
    garbage
        .send_raw(b"GET / HTTP/1.1\r\nHost: urom\r\n\r\n")
        .unwrap();
    let reply = garbage.try_read_frame().unwrap().expect("an error reply");
    let (status, reason) = reply.refusal().unwrap_err();
    assert_eq!(status, Status::InvalidValue);
    assert!(reason.contains("not a urom frame"), "{reason}");
    assert!(garbage.is_closed());

    // Oversized: refused from the header alone.
    let mut oversized = ControlClient::connect(&daemon.socket, TIMEOUT).unwrap();
    let mut header = [0u8; 24];
    header[..4].copy_from_slice(b"UROM");
    header[4] = 1;
    header[6..8].copy_from_slice(&0x0110u16.to_le_bytes());
    header[8..12].copy_from_slice(&1_000_000u32.to_le_bytes());
    oversized.send_raw(&header).unwrap();
    let (status, reason) = oversized
        .try_read_frame()
        .unwrap()
        .unwrap()
        .refusal()
        .unwrap_err();
    assert_eq!(status, Status::InvalidValue);
    assert!(
        reason.contains("exceeds the maximum message size"),
        "{reason}"
    );

    // Truncated: half a header, then the host hangs up.
    let mut truncated = ControlClient::connect(&daemon.socket, TIMEOUT).unwrap();
    truncated.send_raw(&header[..10]).unwrap();
    drop(truncated);

    // A request before authentication.
    let mut early = ControlClient::connect(&daemon.socket, TIMEOUT).unwrap();
    let (status, _) = early
        .request(urom_wire::control::ControlMessage::PluginListRequest)
        .refusal()
        .unwrap_err();
    assert_eq!(status, Status::Authentication);

    // A host with another message size.
    let mut mismatched = ControlClient::connect(&daemon.socket, TIMEOUT).unwrap();
    let (status, reason) = mismatched.handshake_with(8192).unwrap_err();
    assert_eq!(status, Status::BadConfig);
    assert!(
        reason.contains("8192") && reason.contains("4096"),
        "{reason}"
    );

    // The good host was never disturbed.
    assert_eq!(good.plugins().len(), 1);
    let (_, socket) = good.spawn(0, 0, 1, "", &[]).unwrap();
    loopback_through(&socket, 11);
}

#[test]
fn a_host_of_another_user_is_refused() {
    if !nix::unistd::geteuid().is_root() {
        println!("skipped: running as another user needs root");
        return;
    }
    let (_plugins, daemon) = graph_daemon();
    let test_host = binary("urom-testkit", "urom-test-host");
    let nobody = 65534;
    let as_nobody = |command: &mut Command| command.uid(nobody).gid(nobody).output().unwrap();
    // Without other users allowed, the socket is the daemon's user's alone.
    let output = as_nobody(Command::new(&test_host).arg(&daemon.socket));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(1),
        "{stdout} {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("cannot connect") && stdout.contains("Permission denied"),
        "{stdout}"
    );
    // The daemon's own user is still served.
    let mut host = client(&daemon);
    assert_eq!(host.plugins().len(), 1);

    // With the allow list, that user is accepted.
    let plugins = TempDir::new("urom-daemon-plugins");
    let dir = graph_dir(&plugins);
    let allowing = start(dir.to_str().unwrap(), &["--allow-uid", "65534"]);
    let output = as_nobody(Command::new(&test_host).arg(&allowing.socket));
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
    // ... and reaches the workers it starts: the whole bootstrap flow, run as that user.
    let output = as_nobody(
        Command::new(binary("urom-samples", "urom-bootstrap"))
            .args(["--once", "--socket"])
            .arg(&allowing.socket),
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}\ndaemon log:\n{}",
        String::from_utf8_lossy(&output.stderr),
        allowing.log()
    );
    assert!(stdout.contains("loopback"), "{stdout}");
}

#[test]
fn sigterm_tears_down_every_worker_and_exits_zero() {
    let (_plugins, mut daemon) = graph_daemon();
    let mut host = client(&daemon);
    let sockets: Vec<PathBuf> = (0..3)
        .map(|id| host.spawn(id, 0, 1, "", &[]).unwrap().1)
        .collect();
    let pids: Vec<i32> = sockets
        .iter()
        .map(|s| pid_of(&s.display().to_string()))
        .collect();
    daemon.child.signal(SIGTERM);
    let status = daemon
        .child
        .wait_timeout(TIMEOUT)
        .expect("the daemon did not stop");
    assert!(status.success(), "{status}");
    for pid in pids {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "worker {pid} still runs"
        );
    }
    assert!(!daemon.socket.exists());
}

#[test]
fn bad_flags_exit_2_naming_the_flag() {
    let output = Command::new(env!("CARGO_BIN_EXE_urom-daemon"))
        .args(["--max-workers", "0"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--max-workers") && stderr.contains("1..=4096"),
        "{stderr}"
    );
    let help = Command::new(env!("CARGO_BIN_EXE_urom-daemon"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for flag in [
        "--log-level",
        "--sdk-log-level",
        "--max-msg-size",
        "--json",
        "--listen",
        "--log-dir",
        "--cpuset",
        "--max-workers",
        "--worker-bin",
        "--allow-uid",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}");
    }
}
