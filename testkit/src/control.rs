//! A bare client of the daemon's control protocol, for tests that talk to a real daemon
//! frame by frame (the host library's service context is the real client).

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use urom_wire::control::{
    AuthMethod, AuthResponse, ControlMessage, Hello, SpawnWorker, WorkerExit,
};
use urom_wire::frame::frame_length;
use urom_wire::{CpuSet, FRAME_HEADER_LEN, FrameRepr, List, MaxMsgSize, PROTOCOL_VERSION, Status};

/// An error reply: its status and reason.
pub type Refusal = (Status, String);

/// A received frame, kept whole.
pub struct OwnedFrame(pub Vec<u8>);

impl OwnedFrame {
    /// The frame's message.
    pub fn message(&self) -> ControlMessage<'_> {
        FrameRepr::<ControlMessage>::parse(&self.0, largest())
            .expect("the daemon sends valid frames")
            .body
    }

    /// The frame's sequence number.
    pub fn seq(&self) -> u64 {
        urom_wire::frame::peek_seq(&self.0).expect("a whole header")
    }

    /// `Err` with the status and reason when this is an error reply.
    pub fn refusal(&self) -> Result<(), Refusal> {
        match self.message() {
            ControlMessage::Error(error) => Err((error.status, error.reason.to_owned())),
            _ => Ok(()),
        }
    }
}

/// One host connection to a daemon.
pub struct ControlClient {
    stream: UnixStream,
    max: MaxMsgSize,
    seq: u64,
    events: VecDeque<WorkerExit>,
}

impl ControlClient {
    /// Connects to `socket`, waiting up to `timeout` for the daemon to come up (a socket that
    /// the caller may not connect to is an error at once).
    pub fn connect(socket: &Path, timeout: Duration) -> io::Result<Self> {
        let deadline = Instant::now() + timeout;
        let stream = loop {
            match UnixStream::connect(socket) {
                Ok(stream) => break stream,
                Err(e) if Instant::now() > deadline => return Err(e),
                Err(e) if e.kind() == io::ErrorKind::PermissionDenied => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(Self::from_stream(stream))
    }

    /// A client on a connection made already (no read timeout).
    pub fn from_stream(stream: UnixStream) -> Self {
        Self {
            stream,
            max: MaxMsgSize::DEFAULT,
            seq: 0,
            events: VecDeque::new(),
        }
    }

    /// Hello and peer-credential authentication with the default message size.
    pub fn handshake(&mut self) -> Result<(), Refusal> {
        self.handshake_with(MaxMsgSize::DEFAULT.as_u32())
    }

    /// Hello announcing `max_msg_size`, then authentication.
    pub fn handshake_with(&mut self, max_msg_size: u32) -> Result<(), Refusal> {
        let hello = Hello {
            protocol_version: PROTOCOL_VERSION,
            max_msg_size,
            identity: "urom-test-host",
        };
        let reply = self.request(ControlMessage::Hello(hello));
        reply.refusal()?;
        let ControlMessage::AuthChallenge(challenge) = reply.message() else {
            panic!("expected a challenge, got {:?}", reply.message());
        };
        assert_eq!(challenge.method, AuthMethod::PeerCredentials);
        let response = AuthResponse {
            method: AuthMethod::PeerCredentials,
            proof: [0; 32],
        };
        let reply = self.request(ControlMessage::AuthResponse(response));
        reply.refusal()?;
        assert!(matches!(reply.message(), ControlMessage::Ack));
        Ok(())
    }

    /// Sends `body` and returns the reply to it; worker exit events that arrive meanwhile are
    /// kept for [`ControlClient::next_event`]. An error with sequence number 0 is the daemon
    /// turning the connection away, whatever was asked; it may come before the request could
    /// even be sent.
    pub fn request(&mut self, body: ControlMessage<'_>) -> OwnedFrame {
        self.seq += 1;
        let frame = FrameRepr {
            seq: self.seq,
            body,
        };
        let mut bytes = vec![0u8; frame.buffer_len()];
        frame.emit(&mut bytes, self.max).expect("encodable request");
        if let Err(e) = self.send_raw(&bytes) {
            return match self.try_read_frame() {
                Ok(Some(reply)) if reply.seq() == 0 && reply.refusal().is_err() => reply,
                _ => panic!("sending a request: {e}"),
            };
        }
        loop {
            let reply = self.read_frame().expect("reading a reply");
            if let ControlMessage::WorkerExited(exit) = reply.message() {
                self.events.push_back(exit);
                continue;
            }
            if reply.seq() == 0 && reply.refusal().is_err() {
                return reply;
            }
            assert_eq!(reply.seq(), self.seq, "reply to another request");
            return reply;
        }
    }

    /// The plugins offered: (id, version, name).
    pub fn plugins(&mut self) -> Vec<(u64, u64, String)> {
        let reply = self.request(ControlMessage::PluginListRequest);
        let ControlMessage::PluginListReply(list) = reply.message() else {
            panic!("expected a plugin list, got {:?}", reply.message());
        };
        list.iter()
            .map(|p| (p.id, p.version, p.name.to_owned()))
            .collect()
    }

    /// The CPUs workers may use.
    pub fn cpuset(&mut self) -> CpuSet {
        let reply = self.request(ControlMessage::CpusetRequest);
        let ControlMessage::CpusetReply(cpuset) = reply.message() else {
            panic!("expected a cpuset, got {:?}", reply.message());
        };
        cpuset
    }

    /// Spawns or attaches; returns the worker id and its socket.
    pub fn spawn(
        &mut self,
        worker_id: u64,
        gid: u32,
        plugins: u64,
        cpuset: &str,
        env: &[&str],
    ) -> Result<(u64, PathBuf), Refusal> {
        let spawn = SpawnWorker {
            worker_id,
            plugins,
            gid,
            max_inflight_tasks: 64,
            cpuset: cpuset.parse().expect("a CPU list"),
            env: List::new(env),
        };
        let reply = self.request(ControlMessage::SpawnWorker(spawn));
        reply.refusal()?;
        let ControlMessage::SpawnResult(result) = reply.message() else {
            panic!("expected a spawn result, got {:?}", reply.message());
        };
        let socket = PathBuf::from(std::str::from_utf8(result.address).expect("a UTF-8 path"));
        Ok((result.worker_id, socket))
    }

    /// Destroys a worker.
    pub fn destroy(&mut self, worker_id: u64) -> Result<(), Refusal> {
        let reply = self.request(ControlMessage::DestroyWorker { worker_id });
        reply.refusal()?;
        assert!(matches!(reply.message(), ControlMessage::Ack));
        Ok(())
    }

    /// The ids of a group's workers.
    pub fn by_gid(&mut self, gid: u32) -> Vec<u64> {
        let reply = self.request(ControlMessage::WorkersByGidRequest { gid });
        let ControlMessage::WorkersByGidReply(ids) = reply.message() else {
            panic!("expected worker ids, got {:?}", reply.message());
        };
        ids.iter().collect()
    }

    /// The next worker exit event.
    pub fn next_event(&mut self) -> WorkerExit {
        if let Some(event) = self.events.pop_front() {
            return event;
        }
        let frame = self.read_frame().expect("reading an event");
        match frame.message() {
            ControlMessage::WorkerExited(exit) => exit,
            other => panic!("expected a worker exit event, got {other:?}"),
        }
    }

    /// Writes bytes as they are.
    pub fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// Reads one whole frame; `Ok(None)` when the daemon closed the connection.
    pub fn try_read_frame(&mut self) -> io::Result<Option<OwnedFrame>> {
        let mut bytes = vec![0u8; FRAME_HEADER_LEN];
        if let Err(e) = self.stream.read_exact(&mut bytes) {
            return if e.kind() == io::ErrorKind::UnexpectedEof {
                Ok(None)
            } else {
                Err(e)
            };
        }
        let len = frame_length(&bytes, largest())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?
            .expect("a whole header");
        bytes.resize(len, 0);
        self.stream.read_exact(&mut bytes[FRAME_HEADER_LEN..])?;
        Ok(Some(OwnedFrame(bytes)))
    }

    fn read_frame(&mut self) -> io::Result<OwnedFrame> {
        self.try_read_frame()?.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the daemon closed the connection",
            )
        })
    }

    /// Reads until the daemon closes the connection; returns what came before the end of the
    /// stream. A reset connection is an error (`ConnectionReset`).
    pub fn read_until_closed(&mut self) -> io::Result<Vec<u8>> {
        let mut rest = Vec::new();
        self.stream.read_to_end(&mut rest)?;
        Ok(rest)
    }

    /// Spawns a worker with any fresh id, group 0 and plugin 1 on all the service's CPUs.
    pub fn spawn_any(&mut self, env: &[&str]) -> Result<(u64, PathBuf), Refusal> {
        self.spawn(urom_wire::control::WORKER_ID_ANY, 0, 1, "", env)
    }

    /// Sets how long a read waits; `None` waits for ever.
    pub fn set_read_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.stream.set_read_timeout(timeout)
    }

    /// Whether the daemon has closed the connection: reading ends, or is reset because the
    /// daemon left some of what was sent unread.
    pub fn is_closed(&mut self) -> bool {
        let mut byte = [0u8; 1];
        match self.stream.read(&mut byte) {
            Ok(0) => true,
            Err(e) => e.kind() == io::ErrorKind::ConnectionReset,
            Ok(_) => false,
        }
    }
}

/// The largest maximum message size: accepts whatever the daemon sends.
fn largest() -> MaxMsgSize {
    MaxMsgSize::new(MaxMsgSize::MAX).expect("MAX is legal")
}
