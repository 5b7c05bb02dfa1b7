//! The daemon serves every connection from one event loop: thousands of idle hosts cost it no
//! thread, and a host that stalls halfway through a frame or never reads its replies delays no
//! other.

mod common;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::*;
use urom_testkit::control::ControlClient;
use urom_wire::control::ControlMessage;
use urom_wire::report::StatusRecord;
use urom_wire::{FrameRepr, MaxMsgSize};

/// Idle connections the first test holds at once.
const IDLE: usize = 2000;

/// Open files of process `pid`.
fn open_files(pid: i32) -> usize {
    urom_testkit::process::open_files(pid).expect("the daemon's open files")
}

/// The host connections the daemon's status report counts.
fn hosts(client: &mut ControlClient) -> u32 {
    let frame = client.request(ControlMessage::StatusRequest { cursor: 0 });
    let ControlMessage::StatusReply(reply) = frame.message() else {
        panic!("not a status page: {:?}", frame.message());
    };
    reply
        .records
        .iter()
        .find_map(|record| match record {
            StatusRecord::Daemon(daemon) => Some(daemon.hosts),
            _ => None,
        })
        .expect("the daemon's record")
}

/// Waits up to a minute for `done`.
fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn thousands_of_idle_connections_cost_the_daemon_no_thread() {
    let files = IDLE as u64 + 256;
    if !urom_testkit::process::raise_open_file_limit(files) {
        urom_testkit::skip(&format!(
            "{IDLE} connections need {files} open files, more than the hard limit"
        ));
        return;
    }
    let bound = (2 * IDLE).to_string();
    let (_plugins, daemon) = graph_daemon(&[
        "--max-connections",
        &bound,
        "--max-connections-per-user",
        &bound,
    ]);
    let pid = daemon.pid();
    let mut operator = client(&daemon);
    assert_eq!(hosts(&mut operator), 1);
    // A plugin probe's short-lived thread may still be finishing here, so the count may only
    // fall; one thread per connection would add thousands.
    let threads_before = urom_testkit::process::threads(pid);
    let files_before = open_files(pid);

    let idle: Vec<ControlClient> = (0..IDLE).map(|_| client(&daemon)).collect();
    assert_eq!(hosts(&mut operator), IDLE as u32 + 1);
    let threads_idle = urom_testkit::process::threads(pid);
    assert!(
        threads_idle <= threads_before,
        "{threads_idle} threads with {IDLE} idle hosts, {threads_before} before"
    );
    assert_eq!(open_files(pid), files_before + IDLE);
    // The operator's tool is answered meanwhile.
    let output = std::process::Command::new(urom_testkit::binary("urom-ctl", "urom-ctl"))
        .arg("status")
        .arg("--socket")
        .arg(&daemon.socket)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    assert!(stdout.contains(&(IDLE + 2).to_string()), "{stdout}");

    drop(idle);
    eventually("the daemon forgets the hosts that left", || {
        hosts(&mut operator) == 1
    });
    eventually("the daemon closes their sockets", || {
        open_files(pid) == files_before
    });
    assert!(urom_testkit::process::threads(pid) <= threads_before);
    assert!(daemon.is_running());
}

/// The bytes of a plugin list request.
fn plugin_list_request(seq: u64) -> Vec<u8> {
    let frame = FrameRepr {
        seq,
        body: ControlMessage::PluginListRequest,
    };
    let mut bytes = vec![0u8; frame.buffer_len()];
    let len = frame.emit(&mut bytes, MaxMsgSize::DEFAULT).unwrap();
    bytes.truncate(len);
    bytes
}

#[test]
fn a_host_that_stalls_halfway_through_a_frame_or_never_reads_delays_no_other() {
    let (_plugins, daemon) = graph_daemon(&[]);
    // Stops halfway through a request.
    let mut half = client(&daemon);
    let request = plugin_list_request(100);
    half.send_raw(&request[..request.len() / 2]).unwrap();
    // Sends requests without end and reads none of the replies.
    let mut deaf = client(&daemon);
    let flooding = std::thread::spawn(move || {
        let request = plugin_list_request(1);
        let mut sent = 0usize;
        while deaf.send_raw(&request).is_ok() {
            sent += 1;
        }
        (deaf, sent)
    });
    // A raw connection that says half a hello and nothing more.
    let mut mute = UnixStream::connect(&daemon.socket).unwrap();
    mute.write_all(&request[..3]).unwrap();

    // Others are served meanwhile, again and again.
    for _ in 0..20 {
        let mut other = client(&daemon);
        assert_eq!(other.plugins().len(), 1);
        assert!(hosts(&mut other) >= 2);
    }

    // The stalled frame is given up on, with a reason.
    assert_timed_out(&mut half, "frame not completed");
    // The host that never reads is dropped: its requests stop being taken.
    let (_deaf, sent) = flooding.join().unwrap();
    assert!(sent > 0);
    assert!(daemon.is_running());
    assert_eq!(client(&daemon).plugins().len(), 1);
}
