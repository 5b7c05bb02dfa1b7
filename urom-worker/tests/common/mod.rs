//! What the worker tests share: starting this package's worker program; the rest (connecting
//! hosts, exchanging commands and notifications) is `urom_testkit::worker`'s.
#![allow(dead_code, unused_imports)]

use std::path::Path;

pub use urom_testkit::worker::{
    FAULTY_ID, GRAPH_ID, RunningWorker, TIMEOUT, connect, graph_and_faulty, log_file, loopback,
    next_notification, pipelined_loopbacks, send_command,
};

pub const SIGTERM: i32 = 15;

/// Starts a worker with `plugins` (`so_path:id`) and extra flags.
pub fn start_worker(plugins: &[String], extra: &[&str]) -> RunningWorker {
    start_worker_with_env(plugins, extra, &[])
}

/// Starts a worker with `plugins`, extra flags and extra environment variables.
pub fn start_worker_with_env(
    plugins: &[String],
    extra: &[&str],
    env: &[(&str, &Path)],
) -> RunningWorker {
    urom_testkit::worker::start_worker(
        Path::new(env!("CARGO_BIN_EXE_urom-worker")),
        plugins,
        extra,
        env,
    )
}

/// Starts a worker with `plugins`, extra flags and extra environment variables, and a daemon
/// link on its standard input; returns the worker and the link's other end.
pub fn start_worker_with_link(
    plugins: &[String],
    extra: &[&str],
    env: &[(&str, &Path)],
) -> (RunningWorker, std::os::unix::net::UnixStream) {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    ours.set_read_timeout(Some(TIMEOUT)).unwrap();
    let mut flags = vec!["--daemon-link"];
    flags.extend_from_slice(extra);
    let worker = urom_testkit::worker::start_worker_with_stdin(
        Path::new(env!("CARGO_BIN_EXE_urom-worker")),
        plugins,
        &flags,
        env,
        std::process::Stdio::from(std::os::fd::OwnedFd::from(theirs)),
    );
    (worker, ours)
}

/// Asks a worker for its counters on its daemon link, as the daemon does.
pub fn ask_counters(
    link: &mut std::os::unix::net::UnixStream,
    seq: u64,
) -> (
    urom_wire::report::WorkerCounters,
    Vec<urom_wire::report::ErrorEntry>,
) {
    use std::io::{Read, Write};
    use urom_wire::link::{LINK_MAX_MSG_SIZE, LinkMessage};
    use urom_wire::{FRAME_HEADER_LEN, FrameRepr};

    let mut buf = vec![0u8; LINK_MAX_MSG_SIZE.get()];
    let request = FrameRepr {
        seq,
        body: LinkMessage::CountersRequest,
    };
    let len = request.emit(&mut buf, LINK_MAX_MSG_SIZE).unwrap();
    link.write_all(&buf[..len]).unwrap();
    link.read_exact(&mut buf[..FRAME_HEADER_LEN]).unwrap();
    let len = urom_wire::frame::frame_length(&buf[..FRAME_HEADER_LEN], LINK_MAX_MSG_SIZE)
        .unwrap()
        .unwrap();
    link.read_exact(&mut buf[FRAME_HEADER_LEN..len]).unwrap();
    let frame = FrameRepr::<LinkMessage>::parse(&buf[..len], LINK_MAX_MSG_SIZE).unwrap();
    assert_eq!(frame.seq, seq);
    let LinkMessage::CountersReply(report) = frame.body else {
        panic!("not a counter report: {frame:?}");
    };
    (report.counters, report.errors.iter().collect())
}

/// Asks for the counters until they show `commands` commands (the worker publishes them when
/// it goes idle).
pub fn counters_after(
    link: &mut std::os::unix::net::UnixStream,
    commands: u64,
) -> (
    urom_wire::report::WorkerCounters,
    Vec<urom_wire::report::ErrorEntry>,
) {
    let deadline = std::time::Instant::now() + TIMEOUT;
    for seq in 1.. {
        let (counters, errors) = ask_counters(link, seq);
        if counters.commands == commands {
            return (counters, errors);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the counters never reached {commands} commands: {counters:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    unreachable!("the loop returns or panics")
}
