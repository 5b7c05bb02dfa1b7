//! What the worker tests share: starting a worker process, connecting hosts, exchanging
//! commands and notifications.
#![allow(dead_code)]

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use urom_core::graph::{GraphCommand, GraphNotification};
use urom_core::transport::Transport;
use urom_core::transport::{Channel, ChannelConfig};
use urom_testkit::{ChildGuard, TempDir, cdylib};

use urom_wire::data::{COMMAND_PAYLOAD_OFFSET, DataMessage, Notification, write_command_headers};
use urom_wire::{FrameRepr, MaxMsgSize, Status};

pub const GRAPH_ID: u64 = 1;
pub const FAULTY_ID: u64 = 2;
pub const TIMEOUT: Duration = Duration::from_secs(30);
pub const SIGTERM: i32 = 15;

pub struct RunningWorker {
    pub child: ChildGuard,
    pub socket: PathBuf,
    pub dir: TempDir,
}

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
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let child = ChildGuard(command.spawn().expect("starting urom-worker"));
    RunningWorker { child, socket, dir }
}

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
    let deadline = Instant::now() + TIMEOUT;
    loop {
        match UnixStream::connect(socket) {
            Ok(stream) => return Channel::accept(stream, &ChannelConfig::default()).unwrap(),
            Err(e) if Instant::now() > deadline => panic!("worker socket never came up: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

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

/// The next notification: (plugin, context, status, payload).
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
