//! A real `urom-worker` process, and hosts that talk to a worker over bare shared-memory
//! channels, frame by frame (the host library's worker context is the real client).

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use urom_graph::{GraphCommand, GraphNotification};
use urom_transport::{Channel, ChannelConfig, Transport};
use urom_wire::data::{COMMAND_PAYLOAD_OFFSET, DataMessage, Notification, write_command_headers};
use urom_wire::{FrameRepr, MaxMsgSize, Status};

use crate::{ChildGuard, TempDir, cdylib};

/// The graph plugin's id on a worker started with [`graph_and_faulty`].
pub const GRAPH_ID: u64 = 1;
/// The faulty plugin's id on a worker started with [`graph_and_faulty`].
pub const FAULTY_ID: u64 = 2;
/// How long a worker may take to come up or to answer.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// A worker process, stopped when dropped, with its socket and log directory.
pub struct RunningWorker {
    /// The worker process.
    pub child: ChildGuard,
    /// The socket hosts connect to.
    pub socket: PathBuf,
    /// Its log directory (holds `urom_worker_<pid>_dev.log`).
    pub dir: TempDir,
}

/// Starts the worker `program` with `plugins` (`so_path:id`), extra flags and extra
/// environment variables; its standard error is piped.
pub fn start_worker(
    program: &Path,
    plugins: &[String],
    extra: &[&str],
    env: &[(&str, &Path)],
) -> RunningWorker {
    start_worker_with_stdin(program, plugins, extra, env, Stdio::inherit())
}

/// [`start_worker`] with `stdin` as the worker's standard input (the daemon link's end, for a
/// worker started with `--daemon-link`).
pub fn start_worker_with_stdin(
    program: &Path,
    plugins: &[String],
    extra: &[&str],
    env: &[(&str, &Path)],
    stdin: Stdio,
) -> RunningWorker {
    let dir = TempDir::new("urom-worker-test");
    let socket = dir.path().join("worker.sock");
    let mut command = Command::new(program);
    for plugin in plugins {
        command.arg("--plugin").arg(plugin);
    }
    command
        .arg("--listen")
        .arg(&socket)
        .arg("--log-dir")
        .arg(dir.path())
        .args(extra)
        .envs(env.iter().copied())
        .stdin(stdin)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let child = ChildGuard(command.spawn().expect("starting urom-worker"));
    RunningWorker { child, socket, dir }
}

/// The graph plugin as [`GRAPH_ID`] and the faulty plugin as [`FAULTY_ID`], as `--plugin`
/// values.
pub fn graph_and_faulty() -> Vec<String> {
    let graph = cdylib("urom-plugin-graph", "worker_graph");
    let faulty = cdylib("urom-plugin-faulty", "worker_faulty");
    vec![
        format!("{}:{GRAPH_ID}", graph.display()),
        format!("{}:{FAULTY_ID}", faulty.display()),
    ]
}

/// Connects a host to the worker's socket, waiting for the worker to come up.
pub fn connect(socket: &Path) -> Channel {
    connect_with(socket, &ChannelConfig::default())
}

/// [`connect`] with channel settings of the caller's (another message size, say).
pub fn connect_with(socket: &Path, config: &ChannelConfig) -> Channel {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        match UnixStream::connect(socket) {
            Ok(stream) => {
                return Channel::accept(stream, config)
                    .unwrap_or_else(|e| panic!("no channel to the worker: {e}"));
            }
            Err(e) if Instant::now() > deadline => panic!("worker socket never came up: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Sends a command frame, waiting (at most [`TIMEOUT`]) for room in the ring.
pub fn send_command(conn: &mut Channel, seq: u64, plugin: u64, context: u64, payload: &[u8]) {
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

/// The next notification: (plugin, context, status, payload); panics after [`TIMEOUT`].
pub fn next_notification(conn: &mut Channel) -> (u64, u64, Status, Vec<u8>) {
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

/// A graph loopback command's payload.
pub fn loopback(data: u64) -> [u8; 16] {
    let mut packed = [0u8; 16];
    GraphCommand::Loopback { data }.pack(&mut packed).unwrap();
    packed
}

/// Runs `count` pipelined loopback commands on one host connection and checks every answer.
pub fn pipelined_loopbacks(mut conn: Channel, host: u64, count: u64) {
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

/// The worker's log file.
pub fn log_file(worker: &RunningWorker) -> PathBuf {
    std::fs::read_dir(worker.dir.path())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .find(|path| {
            let name = path.file_name().unwrap().to_string_lossy();
            name.starts_with("urom_worker_") && name.ends_with("_dev.log")
        })
        .expect("the worker writes urom_worker_<pid>_dev.log")
}

/// What [`pause_and_come_back`] saw.
pub struct PausedHost {
    /// The round trips the other host made meanwhile, in the order made.
    pub round_trips: Vec<Duration>,
    /// How many notifications the paused host got for each of its commands, by context.
    pub answered: Vec<u32>,
    /// How many of them carried an error status.
    pub errors: u64,
    /// Whether anything more arrived after the last expected notification.
    pub more: bool,
}

impl PausedHost {
    /// The median and the worst round trip.
    pub fn median_and_worst(&self) -> (Duration, Duration) {
        let mut sorted = self.round_trips.clone();
        sorted.sort();
        match sorted.last() {
            Some(&worst) => (sorted[sorted.len() / 2], worst),
            None => (Duration::ZERO, Duration::ZERO),
        }
    }
}

/// Two hosts on the worker at `socket`: the slow one leaves `in_flight` loopbacks for the
/// graph plugin (id `graph`) in flight and takes nothing for `pause`, while the quick one
/// makes round trips; then the slow one takes its notifications (each waited for at most
/// [`TIMEOUT`]: one that never comes panics).
pub fn pause_and_come_back(
    socket: &Path,
    graph: u64,
    in_flight: u64,
    pause: Duration,
) -> PausedHost {
    let mut slow = connect(socket);
    let mut quick = connect(socket);
    for task in 0..in_flight {
        send_command(&mut slow, task, graph, task, &loopback(task));
    }
    let start = Instant::now();
    let mut round_trips = Vec::new();
    let mut seq = 0;
    while start.elapsed() < pause {
        seq += 1;
        let sent = Instant::now();
        send_command(&mut quick, seq, graph, seq, &loopback(seq));
        let (plugin, context, status, _) = next_notification(&mut quick);
        assert_eq!((plugin, context, status), (graph, seq, Status::Success));
        round_trips.push(sent.elapsed());
    }
    let mut answered = vec![0u32; in_flight as usize];
    let mut errors = 0;
    for _ in 0..in_flight {
        let (plugin, context, status, _) = next_notification(&mut slow);
        assert_eq!(plugin, graph, "task {context}");
        errors += u64::from(status != Status::Success);
        match answered.get_mut(context as usize) {
            Some(count) => *count += 1,
            None => panic!("a notification for context {context}, which was never sent"),
        }
    }
    let more = slow.wait_recv(Duration::from_millis(200)).unwrap();
    PausedHost {
        round_trips,
        answered,
        errors,
        more,
    }
}

/// A graph loopback command frame as the host API writes it (numbered 1): 24 + 24 + 16 = 64
/// bytes.
pub fn loopback_frame() -> [u8; 64] {
    use urom_graph::GraphCommand;
    use urom_wire::MaxMsgSize;
    use urom_wire::data::{COMMAND_PAYLOAD_OFFSET, write_command_headers};
    let mut frame = [0u8; 64];
    let len = write_command_headers(&mut frame, 1, 1, 7, 16, MaxMsgSize::DEFAULT)
        .expect("a loopback command fits 64 bytes");
    assert_eq!(len, 64);
    GraphCommand::Loopback { data: 42 }
        .pack(&mut frame[COMMAND_PAYLOAD_OFFSET..])
        .expect("16 bytes of payload");
    frame
}
