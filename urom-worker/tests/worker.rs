//! A real `urom-worker` process with real plugins, reached over the shared-memory transport.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use urom_graph::GraphNotification;
use urom_testkit::TempDir;
use urom_transport::{FrameRecvError, Transport};
use urom_wire::Status;

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
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let c_variant = |name: &str, define: &str| {
        urom_testkit::c_shared_object(
            &root.join("plugins/c-loopback/loopback.c"),
            name,
            &[&root.join("plugins/include")],
            &[define],
        )
    };
    let no_iface = c_variant("worker_no_iface", "OMIT_GET_IFACE");
    let wrong_version = c_variant("worker_iface_v9", "IFACE_VERSION=9");
    let mut plugins = graph_and_faulty();
    plugins.push(format!("{}:4", text_file.display()));
    plugins.push("/nonexistent/worker_missing.so:8".to_owned());
    plugins.push(format!("{}:32", no_iface.display()));
    plugins.push(format!("{}:64", wrong_version.display()));
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
    assert!(
        log.contains("does not export `urom_plugin_get_iface`"),
        "{log}"
    );
    assert!(log.contains("interface version 9"), "{log}");
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
