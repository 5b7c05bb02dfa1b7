//! A real `urom-daemon` process with real plugins and workers, driven over its socket.

mod common;

use common::pid_of;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use urom_graph::{GraphCommand, GraphNotification};
use urom_testkit::control::ControlClient;
use urom_testkit::daemon::{Daemon, plugin_dir, start_daemon};
use urom_testkit::{TempDir, binary, c_shared_object, process, workspace_root};
use urom_transport::Transport;
use urom_transport::{Channel, ChannelConfig};
use urom_wire::control::{ControlMessage, Hello, WORKER_ID_ANY};
use urom_wire::data::{COMMAND_PAYLOAD_OFFSET, DataMessage, write_command_headers};
use urom_wire::{FrameRepr, MaxMsgSize, PROTOCOL_VERSION, Status};

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
    loopback_at(socket, data, MaxMsgSize::DEFAULT);
}

/// One graph loopback command through the socket of a worker whose maximum message size is
/// `max`.
fn loopback_at(socket: &Path, data: u64, max: MaxMsgSize) {
    let stream = std::os::unix::net::UnixStream::connect(socket).unwrap();
    let mut conn = Channel::accept(stream, &ChannelConfig::new(max))
        .unwrap_or_else(|e| panic!("no channel to a worker with -m {}: {e}", max.as_u32()));
    let mut frame = [0u8; 64];
    let len = write_command_headers(&mut frame, 1, 1, data, 16, max).unwrap();
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
            } = FrameRepr::<DataMessage>::parse(reply, max).unwrap()
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

    // The hanging plugin's probe is given up on in the background.
    let deadline = Instant::now() + TIMEOUT;
    for reason in [
        "does not export `urom_plugin_get_iface`",
        "crashed while loading (signal 11)",
        "`urom_plugin_get_version` failed",
        "hung while loading",
        "notes.so",
        "plugin directory skipped",
    ] {
        while !daemon.log().contains(reason) {
            assert!(
                Instant::now() < deadline,
                "log lacks {reason:?}:\n{}",
                daemon.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let mut third = client(&daemon);
    assert_eq!(third.plugins(), expected);
}

/// The C loopback plugin built with `defines`, copied into `dir` under each of `names`.
fn c_plugins(dir: &Path, build_name: &str, defines: &[&str], names: &[&str]) {
    let root = workspace_root();
    let built = c_shared_object(
        &root.join("plugins/c-loopback/loopback.c"),
        build_name,
        &[&root.join("plugins/include")],
        defines,
    );
    for name in names {
        std::fs::copy(&built, dir.join(format!("{name}.so"))).unwrap();
    }
}

/// Whether a probe of `plugin` still runs.
fn probing(plugin: &Path) -> bool {
    let needle = format!("--probe-plugin\0{}", plugin.display());
    std::fs::read_dir("/proc").unwrap().flatten().any(|entry| {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        String::from_utf8_lossy(&cmdline).contains(&needle)
    })
}

#[test]
fn plugins_that_hang_while_loading_delay_no_host() {
    let plugins = TempDir::new("urom-hanging");
    let dir = graph_dir(&plugins);
    // One before the good plugin in scan order, one after.
    c_plugins(
        &dir,
        "worker_hang",
        &["HANG_ON_LOAD"],
        &["a_hang", "z_hang"],
    );
    let hanging = [dir.join("a_hang.so"), dir.join("z_hang.so")];
    let graph = vec![(1, 1, "worker_graph".to_owned())];
    let started = Instant::now();
    let daemon = start(dir.to_str().unwrap(), &[]);

    // The first host is served from what is known while both probes still hang.
    let mut first = client(&daemon);
    let first_waited = started.elapsed();
    assert_eq!(first.plugins(), graph);
    // A second host, arriving meanwhile, is not held up either.
    let arrived = Instant::now();
    let mut second = client(&daemon);
    let second_waited = arrived.elapsed();
    assert_eq!(second.plugins(), graph);
    println!(
        "with two plugins hanging: the first host was served {first_waited:?} after the daemon \
         started, the second {second_waited:?} after it connected"
    );
    let log = daemon.log();
    assert!(
        hanging.iter().all(|plugin| probing(plugin)) && !log.contains("hung while loading"),
        "the hosts were answered only once the probes had ended:\n{log}"
    );

    // Both probes end (in parallel); the plugins are never offered, and the ids stay the same.
    let deadline = Instant::now() + TIMEOUT;
    while daemon.log().matches("hung while loading").count() < 2 {
        assert!(
            Instant::now() < deadline,
            "the hanging probes were never given up on"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(hanging.iter().all(|plugin| !probing(plugin)));
    let mut third = client(&daemon);
    assert_eq!(third.plugins(), graph);
    let (_, socket) = first.spawn(0, 0, 1, "", &[]).unwrap();
    loopback_through(&socket, 5);
}

#[test]
fn a_plugin_that_prints_a_lot_while_loading_is_offered() {
    let plugins = TempDir::new("urom-chatty");
    let dir = graph_dir(&plugins);
    c_plugins(
        &dir,
        "worker_chatty",
        &["CHATTY_ON_LOAD"],
        &["worker_chatty"],
    );
    let daemon = start(dir.to_str().unwrap(), &[]);
    let mut host = client(&daemon);
    let expected = vec![
        (1, 1, "worker_chatty".to_owned()),
        (2, 1, "worker_graph".to_owned()),
    ];
    // Its probe may take a while to drain the 2 MiB; it is offered once it has answered.
    let deadline = Instant::now() + TIMEOUT;
    while host.plugins() != expected {
        assert!(
            Instant::now() < deadline,
            "the chatty plugin was never offered:\n{}",
            daemon.log()
        );
        std::thread::sleep(Duration::from_millis(50));
        host = client(&daemon);
    }
    let log = daemon.log();
    assert!(!log.contains("hung while loading"), "{log}");
    // What it printed is in the log, cut down to its last few KiB.
    assert!(
        log.contains("the plugin printed 2097152 bytes while loading; the last 4096"),
        "{log}"
    );
    assert!(log.len() < 64 * 1024, "the log holds {} bytes", log.len());
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
fn workers_serve_at_the_smallest_and_the_largest_message_size() {
    for max in [MaxMsgSize::MIN, MaxMsgSize::MAX] {
        let plugins = TempDir::new("urom-daemon-plugins");
        let dir = graph_dir(&plugins);
        let daemon = start(dir.to_str().unwrap(), &["-m", &max.to_string()]);
        let mut host = ControlClient::connect(&daemon.socket, TIMEOUT).unwrap();
        host.handshake_with(max).unwrap();
        let (_, socket) = host.spawn(0, 0, 1, "", &[]).unwrap();
        loopback_at(&socket, u64::from(max), MaxMsgSize::new(max).unwrap());
    }
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

/// A worker program that, when its environment has `UROM_TEST_HOLD`, stops itself (as a
/// worker's user may) before it runs `urom-worker`: it publishes no socket until it is sent
/// SIGCONT.
fn holding_worker(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let script = dir.join("holding-worker");
    let worker = binary("urom-worker", "urom-worker");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nif [ -n \"$UROM_TEST_HOLD\" ]; then kill -STOP $$; fi\nexec '{}' \"$@\"\n",
            worker.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

/// Serves another host while `waiting` hosts each wait for an answer about one stopped worker,
/// and checks that all of them still wait, their workers all stopped, once it was served.
fn serve_another_host_meanwhile<T>(
    daemon: &Daemon,
    waiting: &[std::thread::JoinHandle<T>],
    what: &str,
) -> OtherHost {
    let other = serve_another_host(daemon);
    assert_eq!(
        stopped_children(daemon).len(),
        waiting.len(),
        "the stopped workers did not all wait at once while the other host was served:\n{}",
        daemon.log()
    );
    assert!(
        waiting.iter().all(|host| !host.is_finished()),
        "a {what} was answered before the other host was served:\n{}",
        daemon.log()
    );
    other
}

/// The daemon's children that are stopped.
fn stopped_children(daemon: &Daemon) -> Vec<i32> {
    process::children(daemon.pid())
        .into_iter()
        .filter(|&pid| process::stopped(pid))
        .collect()
}

#[test]
fn workers_that_never_start_hold_up_no_other_host() {
    // More than the daemon's pool threads.
    const HELD: usize = 5;
    const RESUMED: usize = 3;
    let plugins = TempDir::new("urom-held");
    let dir = graph_dir(&plugins);
    let worker_bin = holding_worker(plugins.path());
    let daemon = start(
        dir.to_str().unwrap(),
        &["--worker-bin", worker_bin.to_str().unwrap()],
    );
    // Hosts whose workers stop before they listen, each waiting for its answer.
    let held: Vec<_> = (0..HELD)
        .map(|_| {
            let mut host = client(&daemon);
            std::thread::spawn(move || {
                let result = host.spawn_any(&["UROM_TEST_HOLD=1"]);
                (result, host)
            })
        })
        .collect();
    let deadline = Instant::now() + TIMEOUT;
    while stopped_children(&daemon).len() < HELD && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }

    let mut other = serve_another_host_meanwhile(&daemon, &held, "held host");

    // Resumed workers start and their hosts reach them; killed ones are reported.
    for (n, pid) in stopped_children(&daemon).into_iter().enumerate() {
        let signal = if n < RESUMED {
            process::Signal::SIGCONT
        } else {
            process::Signal::SIGKILL
        };
        process::signal(pid, signal);
    }
    let answers: Vec<_> = held.into_iter().map(|host| host.join().unwrap()).collect();
    let mut started = 0;
    for (result, _) in &answers {
        match result {
            Ok((worker, socket)) => {
                loopback_through(socket, *worker + 100);
                started += 1;
            }
            Err((status, reason)) => {
                assert_eq!(*status, Status::Initialization, "{reason}");
                assert!(reason.contains("ended while starting"), "{reason}");
            }
        }
    }
    assert_eq!(started, RESUMED);

    // Their hosts leave, and nothing of their workers is left.
    drop(answers);
    other.is_all_that_is_left(&daemon);
}

/// A host served while others wait, and what it saw of the daemon.
struct OtherHost {
    client: ControlClient,
    worker: u64,
    socket: PathBuf,
    threads: usize,
}

/// Another host authenticates, spawns, reaches its worker, destroys a second one and reads
/// the status report.
fn serve_another_host(daemon: &Daemon) -> OtherHost {
    let mut client = client(daemon);
    let (worker, socket) = client.spawn(WORKER_ID_ANY, 1, 1, "", &[]).unwrap();
    loopback_through(&socket, 21);
    let (spare, _) = client.spawn(WORKER_ID_ANY, 1, 1, "", &[]).unwrap();
    client.destroy(spare).unwrap();
    let report = client.request(ControlMessage::StatusRequest { cursor: 0 });
    assert!(
        matches!(report.message(), ControlMessage::StatusReply(_)),
        "{:?}",
        report.message()
    );
    let threads = urom_testkit::process::threads(daemon.pid());
    OtherHost {
        client,
        worker,
        socket,
        threads,
    }
}

impl OtherHost {
    /// Once every other host has left: only this host's worker is left (its process and
    /// directory), it still serves, and the daemon runs no more threads than when it was served.
    fn is_all_that_is_left(&mut self, daemon: &Daemon) {
        let deadline = Instant::now() + TIMEOUT;
        while self.client.by_gid(0) != Vec::<u64>::new()
            || process::children(daemon.pid()).len() != 1
        {
            assert!(
                Instant::now() < deadline,
                "the other hosts' workers outlived them: {:?}",
                process::children(daemon.pid())
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let dir = self.socket.parent().unwrap();
        let worker_dirs: Vec<_> = std::fs::read_dir(dir.parent().unwrap())
            .unwrap()
            .flatten()
            .filter(|entry| {
                entry
                    .file_name()
                    .to_string_lossy()
                    .starts_with("urom-worker-")
            })
            .map(|entry| entry.path())
            .collect();
        assert_eq!(worker_dirs, [dir]);
        assert_eq!(self.client.by_gid(1), [self.worker]);
        // Not equal: a plugin probe's short-lived thread may have been counted then.
        let threads = urom_testkit::process::threads(daemon.pid());
        assert!(
            threads <= self.threads,
            "{threads} threads, {} when this host was served",
            self.threads
        );
        loopback_through(&self.socket, 22);
    }
}

/// Whether `pid` has a SIGTERM pending (a stopped process keeps it until it is resumed).
fn sigterm_pending(pid: i32) -> bool {
    ["ShdPnd", "SigPnd"].iter().any(|key| {
        let mask = process::status_line(pid, key)
            .and_then(|mask| u64::from_str_radix(&mask, 16).ok())
            .unwrap_or(0);
        mask & (1 << (SIGTERM - 1)) != 0
    })
}

#[test]
fn workers_stopped_by_their_user_and_destroyed_hold_up_no_other_host() {
    // More than the daemon's pool threads.
    const STOPPED: usize = 5;
    let (_plugins, daemon) = graph_daemon();
    // Hosts of one user, each with a worker that user stopped, each destroying it.
    let mut hosts: Vec<ControlClient> = (0..STOPPED).map(|_| client(&daemon)).collect();
    let ids: Vec<u64> = hosts
        .iter_mut()
        .map(|host| host.spawn_any(&[]).unwrap().0)
        .collect();
    let workers = process::children(daemon.pid());
    assert_eq!(workers.len(), STOPPED);
    for &pid in &workers {
        process::signal(pid, process::Signal::SIGSTOP);
    }
    let deadline = Instant::now() + TIMEOUT;
    while stopped_children(&daemon).len() < STOPPED {
        assert!(Instant::now() < deadline, "the workers never stopped");
        std::thread::sleep(Duration::from_millis(5));
    }
    let destroys: Vec<_> = hosts
        .into_iter()
        .zip(&ids)
        .map(|(mut host, &id)| {
            std::thread::spawn(move || {
                let result = host.destroy(id);
                (result, host)
            })
        })
        .collect();
    // Every destroy was taken up: each worker was sent SIGTERM, which waits for a SIGCONT (or
    // is gone already, which fails below).
    while !workers
        .iter()
        .all(|&pid| sigterm_pending(pid) || !process::alive(pid))
    {
        assert!(
            Instant::now() < deadline,
            "the workers were not all sent SIGTERM:\n{}",
            daemon.log()
        );
        std::thread::sleep(Duration::from_millis(5));
    }

    let mut other = serve_another_host_meanwhile(&daemon, &destroys, "destroy");

    // The grace period over, they are killed and every destroy is answered.
    for destroy in destroys {
        let (result, host) = destroy.join().unwrap();
        result.unwrap();
        drop(host);
    }
    let log = daemon.log();
    assert_eq!(log.matches("did not stop within").count(), STOPPED, "{log}");
    other.is_all_that_is_left(&daemon);
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

/// A frame header with every field given.
fn raw_header(
    magic: &[u8; 4],
    version: u16,
    kind: u16,
    length: u32,
    flags: u32,
    seq: u64,
) -> Vec<u8> {
    let mut header = Vec::with_capacity(24);
    header.extend_from_slice(magic);
    header.extend_from_slice(&version.to_le_bytes());
    header.extend_from_slice(&kind.to_le_bytes());
    header.extend_from_slice(&length.to_le_bytes());
    header.extend_from_slice(&flags.to_le_bytes());
    header.extend_from_slice(&seq.to_le_bytes());
    header
}

/// A valid hello frame (96 bytes: the identity field is at 32..96).
fn hello_frame(seq: u64) -> Vec<u8> {
    let frame = FrameRepr {
        seq,
        body: ControlMessage::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            max_msg_size: MaxMsgSize::DEFAULT.as_u32(),
            identity: "urom-test-host",
        }),
    };
    let mut bytes = vec![0u8; frame.buffer_len()];
    frame.emit(&mut bytes, MaxMsgSize::DEFAULT).unwrap();
    bytes
}

/// Eighteen malformed or misplaced frames: each gets an error reply that names the problem and
/// carries the frame's sequence number, then the end of the stream, never a reset, whatever
/// the host sent after it.
#[test]
fn every_refused_frame_gets_its_error_reply_and_an_orderly_close() {
    const HELLO: u16 = 0x0101;
    let (_plugins, daemon) = graph_daemon();
    let header = |seq, magic: &[u8; 4], version, kind, length, flags| {
        raw_header(magic, version, kind, length, flags, seq)
    };
    let edit = |seq, at: usize, bytes: &[u8]| {
        let mut frame = hello_frame(seq);
        frame[at..at + bytes.len()].copy_from_slice(bytes);
        frame
    };
    let resized = |seq, length: u32| {
        let mut frame = hello_frame(seq);
        frame.resize(length as usize, 0);
        frame[8..12].copy_from_slice(&length.to_le_bytes());
        frame
    };
    let mut not_utf8 = [0u8; 64];
    not_utf8[..2].copy_from_slice(&[0xc3, 0x28]);
    let cases: Vec<(&str, Vec<u8>, Status, &str)> = vec![
        (
            "bad magic",
            header(1, b"HTTP", 1, HELLO, 96, 0),
            Status::InvalidValue,
            "not a urom frame",
        ),
        (
            "another protocol version",
            header(2, b"UROM", 2, HELLO, 96, 0),
            Status::InvalidValue,
            "protocol version 2",
        ),
        (
            "an unknown kind",
            header(3, b"UROM", 1, 0x0999, 96, 0),
            Status::InvalidValue,
            "unknown frame kind 0x0999",
        ),
        (
            "non-zero flags",
            header(4, b"UROM", 1, HELLO, 96, 1),
            Status::InvalidValue,
            "`flags`",
        ),
        (
            "length 2^31",
            header(5, b"UROM", 1, HELLO, 1 << 31, 0),
            Status::InvalidValue,
            "2147483648 bytes exceeds",
        ),
        (
            "length 2^32-1",
            header(6, b"UROM", 1, HELLO, u32::MAX, 0),
            Status::InvalidValue,
            "4294967295 bytes exceeds",
        ),
        (
            "length max+1",
            header(7, b"UROM", 1, HELLO, 4097, 0),
            Status::InvalidValue,
            "4097 bytes exceeds",
        ),
        (
            "length 0",
            header(8, b"UROM", 1, HELLO, 0, 0),
            Status::InvalidValue,
            "says 0 bytes",
        ),
        (
            "length below the header",
            header(9, b"UROM", 1, HELLO, 23, 0),
            Status::InvalidValue,
            "says 23 bytes",
        ),
        (
            "a data frame",
            edit(10, 6, &0x0201u16.to_le_bytes()),
            Status::InvalidValue,
            "0x0201 does not belong",
        ),
        (
            "a hello one byte short",
            resized(11, 95),
            Status::InvalidValue,
            "72",
        ),
        (
            "a hello one byte long",
            resized(12, 97),
            Status::InvalidValue,
            "72",
        ),
        (
            "a hello with its reserved field set",
            edit(13, 26, &[1]),
            Status::InvalidValue,
            "`hello.reserved`",
        ),
        (
            "an identity that is not UTF-8",
            edit(14, 32, &not_utf8),
            Status::InvalidValue,
            "not UTF-8",
        ),
        (
            "an identity without its NUL",
            edit(15, 32, &[b'x'; 64]),
            Status::InvalidValue,
            "NUL",
        ),
        (
            "a hello of another protocol version",
            edit(16, 24, &[2]),
            Status::UnsupportedVersion,
            "protocol version 2",
        ),
        (
            "a request with a body",
            {
                let mut frame = header(17, b"UROM", 1, 0x0110, 28, 0);
                frame.extend_from_slice(&[0; 4]);
                frame
            },
            Status::InvalidValue,
            "4 bytes",
        ),
        (
            "a reply sent by a host",
            header(18, b"UROM", 1, 0x0104, 24, 0),
            Status::Authentication,
            "unexpected",
        ),
    ];
    assert_eq!(cases.len(), 18);
    let mut wrong = Vec::new();
    for (seq, (what, frame, status, naming)) in (1u64..).zip(cases) {
        let mut host = ControlClient::connect(&daemon.socket, TIMEOUT).unwrap();
        // The rest of a frame the header announced, and a request sent right after it.
        let mut bytes = frame;
        if bytes.len() == 24 {
            bytes.extend_from_slice(&[0xa5; 1000]);
        }
        bytes.extend_from_slice(&hello_frame(99));
        host.send_raw(&bytes).unwrap();
        let reply = match host.try_read_frame() {
            Ok(Some(reply)) => reply,
            Ok(None) => {
                wrong.push(format!("{what}: closed without an error reply"));
                continue;
            }
            Err(e) => {
                wrong.push(format!("{what}: no error reply: {e}"));
                continue;
            }
        };
        let Err((got, reason)) = reply.refusal() else {
            panic!("{what}: answered {:?}", reply.message());
        };
        assert_eq!((got, reply.seq()), (status, seq), "{what}: {reason}");
        assert!(reason.contains(naming), "{what}: {reason}");
        match host.read_until_closed() {
            Ok(rest) => assert!(rest.is_empty(), "{what}: {} more bytes", rest.len()),
            Err(e) => wrong.push(format!("{what}: after the reply: {e}")),
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of 18:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    // The daemon serves on.
    assert_eq!(client(&daemon).plugins().len(), 1);
}

#[test]
fn a_host_of_another_user_is_refused() {
    if !nix::unistd::geteuid().is_root() {
        urom_testkit::skip("running as another user needs root");
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
