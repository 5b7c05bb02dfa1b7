//! The counters a worker keeps, read over its daemon link as the daemon reads them: commands,
//! notifications, bytes, errors by status, host channels; and a worker without a usable link
//! serves its hosts all the same.

mod common;

use common::*;
use urom_wire::Status;
use urom_wire::data::{COMMAND_PAYLOAD_OFFSET, NOTIFY_PAYLOAD_OFFSET};

#[test]
fn the_daemon_link_reports_what_the_worker_did() {
    let (worker, mut link) = start_worker_with_link(&graph_and_faulty(), &[], &[]);
    let (counters, errors) = ask_counters(&mut link, 1);
    assert_eq!((counters.commands, counters.notifications), (0, 0));
    assert!(errors.is_empty());

    let mut host = connect(&worker.socket);
    for seq in 1..=4 {
        send_command(&mut host, seq, GRAPH_ID, seq, &loopback(seq));
        assert_eq!(next_notification(&mut host).2, Status::Success);
    }
    // A plugin this worker does not run, and an empty graph command.
    send_command(&mut host, 5, 1 << 10, 5, &loopback(5));
    assert_eq!(next_notification(&mut host).2, Status::NotFound);
    send_command(&mut host, 6, GRAPH_ID, 6, &[]);
    assert_eq!(next_notification(&mut host).2, Status::InvalidValue);

    let (counters, errors) = counters_after(&mut link, 6);
    assert_eq!(counters.notifications, 6);
    assert_eq!(counters.errors, 2);
    assert_eq!(counters.in_flight, 0);
    assert_eq!(counters.hosts, 1);
    assert!(counters.peak_ring >= 1);
    // Four loopbacks and a command for an unknown plugin of 16 payload bytes, one empty.
    let loopback_command = (COMMAND_PAYLOAD_OFFSET + 16) as u64;
    assert_eq!(
        counters.bytes_in,
        5 * loopback_command + COMMAND_PAYLOAD_OFFSET as u64,
        "{counters:?}"
    );
    // Four loopbacks back, and two errors without payload.
    let loopback_answer = (NOTIFY_PAYLOAD_OFFSET + 16) as u64;
    assert_eq!(
        counters.bytes_out,
        4 * loopback_answer + 2 * NOTIFY_PAYLOAD_OFFSET as u64,
        "{counters:?}"
    );
    let statuses: Vec<(Status, u64)> = errors.iter().map(|e| (e.status, e.count)).collect();
    assert_eq!(statuses, [(Status::InvalidValue, 1), (Status::NotFound, 1)]);

    drop(host);
    let deadline = std::time::Instant::now() + TIMEOUT;
    while ask_counters(&mut link, 100).0.hosts != 0 {
        assert!(std::time::Instant::now() < deadline, "the host never left");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn a_worker_whose_standard_input_is_no_socket_serves_hosts_anyway() {
    let mut worker = urom_testkit::worker::start_worker_with_stdin(
        std::path::Path::new(env!("CARGO_BIN_EXE_urom-worker")),
        &graph_and_faulty(),
        &["--daemon-link"],
        &[],
        std::process::Stdio::null(),
    );
    let mut host = connect(&worker.socket);
    send_command(&mut host, 1, GRAPH_ID, 1, &loopback(1));
    assert_eq!(next_notification(&mut host).2, Status::Success);
    drop(host);
    let log = std::fs::read_to_string(log_file(&worker)).unwrap();
    assert!(log.contains("standard input is not a socket"), "{log}");
    worker.child.signal(SIGTERM);
    let status = worker.child.wait_timeout(TIMEOUT).expect("stops");
    assert!(status.success(), "{status}");
}
