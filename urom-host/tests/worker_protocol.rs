//! A worker that breaks the data protocol: a stand-in daemon (a thread speaking the control
//! protocol) hands the host a stand-in worker (a thread speaking the shared-memory channel),
//! which answers the host's commands with a frame that does not parse. The host fails the
//! channel, every task in flight completes exactly once with an error, and the worker's state
//! names the decode error.

mod common;

use std::cell::RefCell;
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{TIMEOUT, run_worker};
use urom_host::{
    CommandError, CompletedTask, Idle, ProgressEngine, Service, Worker, WorkerFailure,
    WorkerProtocolError, WorkerState,
};
use urom_testkit::TempDir;
use urom_transport::{Channel, ChannelConfig};
use urom_transport::{FrameRecvError, Transport};
use urom_wire::control::{
    AuthChallenge, AuthMethod, ControlMessage, EndpointKind, PluginInfo, SpawnResult,
};
use urom_wire::data::DataMessage;
use urom_wire::frame::frame_length;
use urom_wire::{CpuSet, FRAME_HEADER_LEN, FrameRepr, List, MaxMsgSize, Status};

/// The stand-in worker's id and its only plugin.
const WORKER_ID: u64 = 7;
const PLUGIN: u64 = 1;
/// Commands in flight when the garbage arrives.
const IN_FLIGHT: usize = 8;

/// Bytes that are no urom frame.
const GARBAGE: [u8; 64] = [0xa5; 64];

thread_local! {
    /// (task number, status) of every completion, in order.
    static DONE: RefCell<Vec<(u8, Status)>> = const { RefCell::new(Vec::new()) };
}

fn record(task: &CompletedTask<'_>) {
    DONE.with(|done| done.borrow_mut().push((task.user_data[0], task.status)));
}

/// Serves one host on `socket` the way the daemon does, with one plugin, and answers every
/// spawn request with `worker_socket`. Ends when the host hangs up.
fn stand_in_daemon(socket: &Path, worker_socket: PathBuf) -> JoinHandle<()> {
    let listener = UnixListener::bind(socket).unwrap();
    std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let max = MaxMsgSize::DEFAULT;
        let plugins = [PluginInfo {
            id: PLUGIN,
            version: 1,
            name: "worker_fake",
        }];
        let address = worker_socket.to_str().unwrap().as_bytes();
        while let Some(request) = read_frame(&mut stream) {
            let frame = FrameRepr::<ControlMessage>::parse(&request, max).unwrap();
            let reply = match frame.body {
                ControlMessage::Hello(_) => ControlMessage::AuthChallenge(AuthChallenge {
                    method: AuthMethod::PeerCredentials,
                    nonce: [0; 32],
                }),
                ControlMessage::AuthResponse(_) | ControlMessage::DestroyWorker { .. } => {
                    ControlMessage::Ack
                }
                ControlMessage::PluginListRequest => {
                    ControlMessage::PluginListReply(List::new(&plugins))
                }
                ControlMessage::CpusetRequest => ControlMessage::CpusetReply(CpuSet::new()),
                ControlMessage::SpawnWorker(_) => ControlMessage::SpawnResult(SpawnResult {
                    worker_id: WORKER_ID,
                    endpoint: EndpointKind::UnixSocket,
                    address,
                }),
                other => panic!("the stand-in daemon does not serve {other:?}"),
            };
            let reply = FrameRepr {
                seq: frame.seq,
                body: reply,
            };
            let mut bytes = vec![0u8; reply.buffer_len()];
            reply.emit(&mut bytes, max).unwrap();
            stream.write_all(&bytes).unwrap();
        }
    })
}

/// One whole control frame, or `None` once the host hung up.
fn read_frame(stream: &mut UnixStream) -> Option<Vec<u8>> {
    let mut bytes = vec![0u8; FRAME_HEADER_LEN];
    stream.read_exact(&mut bytes).ok()?;
    let len = frame_length(&bytes, MaxMsgSize::DEFAULT)
        .unwrap()
        .expect("a whole header");
    bytes.resize(len, 0);
    stream.read_exact(&mut bytes[FRAME_HEADER_LEN..]).unwrap();
    Some(bytes)
}

/// Accepts the host on `socket`, receives `IN_FLIGHT` commands, answers with `GARBAGE`, then
/// waits for the host to close the channel; returns how the channel ended.
fn stand_in_worker(socket: &Path) -> JoinHandle<FrameRecvError> {
    let listener = UnixListener::bind(socket).unwrap();
    std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut conn = Channel::offer(stream, &ChannelConfig::default()).unwrap();
        let max = conn.max_msg_size();
        let mut commands = 0;
        let deadline = Instant::now() + TIMEOUT;
        while commands < IN_FLIGHT {
            assert!(
                Instant::now() < deadline,
                "the host sent {commands} commands"
            );
            if let Some(frame) = conn.recv().unwrap() {
                let command = FrameRepr::<DataMessage>::parse(frame, max).unwrap();
                assert!(matches!(command.body, DataMessage::Command(_)));
                commands += 1;
            } else {
                conn.wait_recv(Duration::from_millis(10)).unwrap();
            }
        }
        conn.send(&GARBAGE).unwrap();
        loop {
            assert!(Instant::now() < deadline, "the host kept the channel open");
            match conn.recv() {
                Ok(None) => drop(conn.wait_recv(Duration::from_millis(10))),
                Ok(Some(_)) => panic!("the host sent more than {IN_FLIGHT} commands"),
                Err(gone) => return gone,
            }
        }
    })
}

#[test]
fn a_frame_that_does_not_parse_fails_every_task_in_flight_once() {
    let dir = TempDir::new("urom-worker-protocol");
    let daemon_socket = dir.path().join("urom.sock");
    let worker_socket = dir.path().join("worker.sock");
    let worker_thread = stand_in_worker(&worker_socket);
    let daemon_thread = stand_in_daemon(&daemon_socket, worker_socket);

    let service = Service::<Idle>::new()
        .set_socket(&daemon_socket)
        .start()
        .map_err(|(_, e)| e)
        .unwrap();
    assert_eq!(service.plugin("worker_fake").unwrap().id, PLUGIN);
    let mut engine = ProgressEngine::new();
    let worker = run_worker(
        &mut engine,
        Worker::new().set_service(&service).set_plugins(PLUGIN),
    );
    assert_eq!(worker.id(), WORKER_ID);
    for task in 0..IN_FLIGHT as u8 {
        worker
            .submit(PLUGIN, |command| {
                command.user_data_mut()[0] = task;
                command.set_callback(record);
                0
            })
            .unwrap();
    }

    let deadline = Instant::now() + TIMEOUT;
    while DONE.with(|done| done.borrow().len()) < IN_FLIGHT {
        engine.progress();
        assert!(Instant::now() < deadline, "the tasks did not complete");
    }
    // Nothing completes twice.
    for _ in 0..100 {
        engine.progress();
    }
    let mut done = DONE.with(|done| done.take());
    done.sort_by_key(|(task, _)| *task);
    let expected: Vec<_> = (0..IN_FLIGHT as u8)
        .map(|task| (task, Status::NotConnected))
        .collect();
    assert_eq!(done, expected);

    // The state names the decode error.
    let error = FrameRepr::<DataMessage>::parse(&GARBAGE, MaxMsgSize::DEFAULT).unwrap_err();
    let failure = WorkerFailure::Protocol(WorkerProtocolError::Malformed(error));
    assert_eq!(worker.state(), WorkerState::Failed(failure));
    assert_eq!(
        failure.to_string(),
        format!(
            "the worker broke the data protocol: a frame from the worker does not parse: {error}"
        )
    );
    assert_eq!(
        worker.submit(PLUGIN, |_| 0).unwrap_err(),
        CommandError::NotRunning
    );

    // The host closed the channel.
    assert!(matches!(
        worker_thread.join().unwrap(),
        FrameRecvError::PeerGone(_)
    ));
    worker.stop().map_err(|(_, e)| e).unwrap();
    service.stop();
    daemon_thread.join().unwrap();
}
