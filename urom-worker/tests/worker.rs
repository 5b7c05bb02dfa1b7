//! A real `urom-worker` process with real plugins, reached over the shared-memory transport.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use urom_core::graph::{GraphCommand, GraphNotification};
use urom_core::shm::{ShmConfig, ShmConnection};
use urom_core::transport::{FrameRecvError, Transport};
use urom_testkit::{ChildGuard, TempDir, cdylib};
use urom_wire::data::{COMMAND_PAYLOAD_OFFSET, DataMessage, Notification, write_command_headers};
use urom_wire::{FrameRepr, MaxMsgSize, Status};

const GRAPH_ID: u64 = 1;
const FAULTY_ID: u64 = 2;
const TIMEOUT: Duration = Duration::from_secs(30);
const SIGTERM: i32 = 15;

struct RunningWorker {
    child: ChildGuard,
    socket: PathBuf,
    dir: TempDir,
}

/// Starts a worker with `plugins` (`so_path:id`) and extra flags.
fn start_worker(plugins: &[String], extra: &[&str]) -> RunningWorker {
    let dir = TempDir::new("urom-worker-test");
    let socket = dir.path().join("worker.sock");
    let mut command = Command::new(env!("CARGO_BIN_EXE_urom-worker"));
    for plugin in plugins {
        command.arg("--plugin").arg(plugin);
    }
    command
        .arg("--listen")
        .arg(&socket)
        .arg("--log-dir")
        .arg(dir.path())
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let child = ChildGuard(command.spawn().expect("starting urom-worker"));
    RunningWorker { child, socket, dir }
}

fn graph_and_faulty() -> Vec<String> {
    let graph = cdylib("urom-plugin-graph", "worker_graph");
    let faulty = cdylib("urom-plugin-faulty", "worker_faulty");
    vec![
        format!("{}:{GRAPH_ID}", graph.display()),
        format!("{}:{FAULTY_ID}", faulty.display()),
    ]
}

/// Connects a host to the worker's socket, waiting for the worker to come up.
fn connect(socket: &Path) -> ShmConnection {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        match UnixStream::connect(socket) {
            Ok(stream) => return ShmConnection::accept(stream, &ShmConfig::default()).unwrap(),
            Err(e) if Instant::now() > deadline => panic!("worker socket never came up: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

fn send_command(conn: &mut ShmConnection, seq: u64, plugin: u64, context: u64, payload: &[u8]) {
    let mut frame = [0u8; 4096];
    let len = write_command_headers(
        &mut frame,
        seq,
        plugin,
        context,
        payload.len(),
        MaxMsgSize::DEFAULT,
    )
    .unwrap();
    frame[COMMAND_PAYLOAD_OFFSET..len].copy_from_slice(payload);
    let deadline = Instant::now() + TIMEOUT;
    while conn.send(&frame[..len]).is_err() {
        assert!(
            Instant::now() < deadline,
            "the worker stopped taking commands"
        );
        conn.wait_send(Duration::from_millis(10)).unwrap();
    }
}

/// The next notification: (plugin, context, status, payload).
fn next_notification(conn: &mut ShmConnection) -> (u64, u64, Status, Vec<u8>) {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Some(frame) = conn.recv().unwrap() {
            let parsed = FrameRepr::<DataMessage>::parse(frame, MaxMsgSize::DEFAULT).unwrap();
            let DataMessage::Notify(Notification {
                plugin,
                urom_context,
                status,
                payload,
            }) = parsed.body
            else {
                panic!("the worker sent a command: {parsed:?}");
            };
            return (plugin, urom_context, status, payload.to_vec());
        }
        assert!(
            Instant::now() < deadline,
            "no notification within {TIMEOUT:?}"
        );
        conn.wait_recv(Duration::from_millis(10)).unwrap();
    }
}

fn loopback(data: u64) -> [u8; 16] {
    let mut packed = [0u8; 16];
    GraphCommand::Loopback { data }.pack(&mut packed).unwrap();
    packed
}

/// Runs `count` pipelined loopback commands on one host connection and checks every answer.
fn pipelined_loopbacks(mut conn: ShmConnection, host: u64, count: u64) {
    const IN_FLIGHT: u64 = 32;
    let mut sent = 0;
    let mut received = 0;
    while received < count {
        while sent < count && sent - received < IN_FLIGHT {
            let data = host << 40 | sent;
            send_command(&mut conn, sent, GRAPH_ID, data, &loopback(data));
            sent += 1;
        }
        let (plugin, context, status, payload) = next_notification(&mut conn);
        let expected = host << 40 | received;
        assert_eq!(
            (plugin, context, status),
            (GRAPH_ID, expected, Status::Success)
        );
        assert_eq!(
            GraphNotification::unpack(&payload),
            Ok(GraphNotification::Loopback { data: expected })
        );
        received += 1;
    }
}

#[test]
fn hosts_round_trip_loopback_commands_through_a_worker_process() {
    let worker = start_worker(&graph_and_faulty(), &[]);
    const HOSTS: u64 = 3;
    const TOTAL: u64 = 100_000;
    let threads: Vec<_> = (0..HOSTS)
        .map(|host| {
            let conn = connect(&worker.socket);
            let count = TOTAL / HOSTS + u64::from(host < TOTAL % HOSTS);
            std::thread::spawn(move || pipelined_loopbacks(conn, host, count))
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    drop(worker);
}

#[test]
fn every_bad_command_gets_an_error_and_the_worker_goes_on() {
    let dir = TempDir::new("urom-worker-junk");
    let text_file = dir.path().join("notes.so");
    std::fs::write(&text_file, "not a library").unwrap();
    let mut plugins = graph_and_faulty();
    plugins.push(format!("{}:4", text_file.display()));
    plugins.push("/nonexistent/worker_missing.so:8".to_owned());
    let worker = start_worker(&plugins, &[]);
    let mut host = connect(&worker.socket);

    let cases: [(u64, &[u8], Status); 5] = [
        (16, b"no such plugin", Status::NotFound),
        (4, b"plugin failed to load", Status::NotFound),
        (FAULTY_ID, b"fail", Status::NotSupported),
        (FAULTY_ID, b"panic", Status::Unexpected),
        (GRAPH_ID, b"short", Status::InvalidValue),
    ];
    for (context, (plugin, payload, expected)) in cases.iter().enumerate() {
        send_command(&mut host, 1, *plugin, context as u64, payload);
        let (got_plugin, got_context, status, _) = next_notification(&mut host);
        assert_eq!(
            (got_plugin, got_context, status),
            (*plugin, context as u64, *expected)
        );
    }

    // A frame that is not a urom frame at all.
    host.send(b"garbage garbage garbage garbage!").unwrap();
    let (_, _, status, _) = next_notification(&mut host);
    assert_eq!(status, Status::InvalidValue);

    // A deferred answer and a normal one still arrive.
    send_command(&mut host, 2, FAULTY_ID, 100, b"later");
    assert_eq!(
        next_notification(&mut host),
        (FAULTY_ID, 100, Status::Success, b"late".to_vec())
    );
    send_command(&mut host, 3, GRAPH_ID, 101, &loopback(7));
    let (_, context, status, payload) = next_notification(&mut host);
    assert_eq!((context, status), (101, Status::Success));
    assert_eq!(
        GraphNotification::unpack(&payload),
        Ok(GraphNotification::Loopback { data: 7 })
    );

    let log = std::fs::read_to_string(log_file(&worker)).unwrap();
    assert!(log.contains("cannot load plugin"), "{log}");
    assert!(log.contains("worker_missing.so"), "{log}");
    assert!(log.contains("plugin left out"), "{log}");
}

fn log_file(worker: &RunningWorker) -> PathBuf {
    std::fs::read_dir(worker.dir.path())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .find(|path| {
            let name = path.file_name().unwrap().to_string_lossy();
            name.starts_with("urom_worker_") && name.ends_with("_dev.log")
        })
        .expect("the worker writes urom_worker_<pid>_dev.log")
}

#[test]
fn sigterm_closes_the_plugins_and_exits_zero() {
    let mut worker = start_worker(&graph_and_faulty(), &[]);
    let mut host = connect(&worker.socket);
    send_command(&mut host, 1, GRAPH_ID, 1, &loopback(1));
    assert_eq!(next_notification(&mut host).2, Status::Success);
    worker.child.signal(SIGTERM);
    let status = worker
        .child
        .wait_timeout(TIMEOUT)
        .expect("the worker did not stop");
    assert!(status.success(), "{status}");
    // The host learns that the worker is gone.
    let deadline = Instant::now() + TIMEOUT;
    loop {
        match host.recv() {
            Err(FrameRecvError::PeerGone(_)) => break,
            other => assert!(Instant::now() < deadline, "host still sees {other:?}"),
        }
        let _ = host.wait_recv(Duration::from_millis(10));
    }
    assert!(!worker.socket.exists(), "the worker removes its socket");
    let log = std::fs::read_to_string(log_file(&worker)).unwrap();
    assert!(log.contains("urom worker stopped"), "{log}");
}

/// Runs a worker that must fail at start; returns its stderr.
fn failing_start(plugins: &[String], extra: &[&str]) -> String {
    let mut worker = start_worker(plugins, extra);
    let status = worker
        .child
        .wait_timeout(TIMEOUT)
        .expect("the worker did not exit");
    assert!(!status.success());
    let mut stderr = String::new();
    use std::io::Read;
    worker
        .child
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    stderr
}

#[test]
fn a_worker_without_any_loadable_plugin_refuses_to_run() {
    let stderr = failing_start(&["/nonexistent/worker_none.so:1".to_owned()], &[]);
    assert!(stderr.contains("no plugin could be loaded"), "{stderr}");
}

#[test]
fn an_impossible_cpuset_is_an_error() {
    let stderr = failing_start(&graph_and_faulty(), &["--cpuset", "1000-1001"]);
    assert!(stderr.contains("cannot run on CPUs 1000-1001"), "{stderr}");
}

#[test]
fn bad_flags_name_what_is_wrong() {
    let output = Command::new(env!("CARGO_BIN_EXE_urom-worker"))
        .args(["--plugin", "x.so:3", "--listen", "/tmp/unused.sock"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("single bit"), "{stderr}");
}
