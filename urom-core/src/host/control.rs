//! The host's connection to the daemon: a synchronous handshake, then requests answered by a
//! reader thread that routes each reply to its requester and each worker exit to the workers
//! watching it. Shared by every thread's contexts; not on any hot path.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use crate::wire::control::{AuthMethod, AuthResponse, ControlMessage, Hello, WorkerExit};
use crate::wire::frame::frame_length;
use crate::wire::{FRAME_HEADER_LEN, FrameRepr, MaxMsgSize, PROTOCOL_VERSION, Status};

/// How long the handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why talking to the daemon failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlError {
    /// The socket failed.
    Io(String),
    /// The daemon refused: its status and reason.
    Refused {
        /// The status of its error reply.
        status: Status,
        /// Its reason.
        reason: String,
    },
    /// The daemon did not answer in time.
    TimedOut {
        /// What was waited for: "the hello", "the authentication".
        waited_for: &'static str,
        /// How long.
        after: Duration,
    },
    /// The daemon answered something unexpected.
    Protocol(String),
    /// The connection to the daemon is gone.
    Closed,
}

impl fmt::Display for ControlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io(e) => write!(f, "connection to the service failed: {e}"),
            Self::Refused { status, reason } => {
                write!(f, "the service refused: {reason} ({status})")
            }
            Self::TimedOut { waited_for, after } => write!(
                f,
                "the daemon did not answer {waited_for} within {} s",
                after.as_secs_f64()
            ),
            Self::Protocol(what) => write!(f, "unexpected answer from the service: {what}"),
            Self::Closed => f.write_str("the connection to the service is closed"),
        }
    }
}

impl std::error::Error for ControlError {}

impl ControlError {
    /// The status a task failing with this error completes with.
    pub fn status(&self) -> Status {
        match self {
            Self::Refused { status, .. } => *status,
            Self::Closed => Status::NotConnected,
            Self::Io(_) => Status::IoFailed,
            Self::TimedOut { .. } => Status::TimeOut,
            Self::Protocol(_) => Status::Unexpected,
        }
    }
}

fn io_error(e: io::Error) -> ControlError {
    ControlError::Io(e.to_string())
}

/// Why reading a frame failed.
enum ReadError {
    /// The read timeout passed first.
    TimedOut,
    /// Anything else.
    Other(ControlError),
}

impl ReadError {
    /// The error of a handshake read that waited for the answer to `request`.
    fn timed_out(self, request: &'static str) -> ControlError {
        match self {
            Self::TimedOut => ControlError::TimedOut {
                waited_for: request,
                after: HANDSHAKE_TIMEOUT,
            },
            Self::Other(e) => e,
        }
    }
}

impl From<io::Error> for ReadError {
    fn from(e: io::Error) -> Self {
        match e.kind() {
            // A read timeout (SO_RCVTIMEO) ends a read with EAGAIN.
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Self::TimedOut,
            io::ErrorKind::UnexpectedEof => Self::Other(ControlError::Closed),
            _ => Self::Other(io_error(e)),
        }
    }
}

impl From<ControlError> for ReadError {
    fn from(e: ControlError) -> Self {
        Self::Other(e)
    }
}

/// A received frame, kept whole.
pub(crate) struct Reply {
    bytes: Vec<u8>,
    max: MaxMsgSize,
}

impl Reply {
    /// The reply's message (valid: checked when it was read).
    pub(crate) fn message(&self) -> ControlMessage<'_> {
        FrameRepr::<ControlMessage>::parse(&self.bytes, self.max)
            .map(|frame| frame.body)
            .unwrap_or(ControlMessage::Ack)
    }

    /// `Err` for an error reply.
    pub(crate) fn refusal(&self) -> Result<(), ControlError> {
        match self.message() {
            ControlMessage::Error(error) => Err(ControlError::Refused {
                status: error.status,
                reason: error.reason.to_owned(),
            }),
            _ => Ok(()),
        }
    }
}

type Waiters = Mutex<HashMap<u64, mpsc::Sender<Reply>>>;
type ExitWatchers = Mutex<HashMap<u64, Vec<mpsc::Sender<WorkerExit>>>>;

/// The connection to the daemon.
pub(crate) struct ControlChannel {
    writer: Mutex<UnixStream>,
    max: MaxMsgSize,
    next_seq: AtomicU64,
    waiters: Arc<Waiters>,
    exits: Arc<ExitWatchers>,
}

impl ControlChannel {
    /// Connects, says hello and authenticates, then starts the reader thread.
    pub(crate) fn connect(
        socket: &Path,
        max: MaxMsgSize,
        identity: &str,
    ) -> Result<Arc<Self>, ControlError> {
        let mut stream = UnixStream::connect(socket).map_err(io_error)?;
        stream
            .set_read_timeout(Some(HANDSHAKE_TIMEOUT))
            .map_err(io_error)?;
        let hello = Hello {
            protocol_version: PROTOCOL_VERSION,
            max_msg_size: max.as_u32(),
            identity: crate::wire::truncate_at_char_boundary(identity, 63),
        };
        send_handshake(&mut stream, max, 1, ControlMessage::Hello(hello))?;
        let reply = read_frame(&mut stream, max).map_err(|e| e.timed_out("the hello"))?;
        reply.refusal()?;
        let ControlMessage::AuthChallenge(challenge) = reply.message() else {
            return Err(ControlError::Protocol("no authentication challenge".into()));
        };
        if challenge.method != AuthMethod::PeerCredentials {
            return Err(ControlError::Protocol(format!(
                "authentication method {:?} is not supported on a local socket",
                challenge.method
            )));
        }
        let response = AuthResponse {
            method: AuthMethod::PeerCredentials,
            proof: [0; 32],
        };
        send_handshake(&mut stream, max, 2, ControlMessage::AuthResponse(response))?;
        let reply = read_frame(&mut stream, max).map_err(|e| e.timed_out("the authentication"))?;
        reply.refusal()?;
        if !matches!(reply.message(), ControlMessage::Ack) {
            return Err(ControlError::Protocol(
                "authentication was not acknowledged".into(),
            ));
        }
        stream.set_read_timeout(None).map_err(io_error)?;
        let reader = stream.try_clone().map_err(io_error)?;
        let channel = Arc::new(Self {
            writer: Mutex::new(stream),
            max,
            next_seq: AtomicU64::new(3),
            waiters: Arc::default(),
            exits: Arc::default(),
        });
        let (waiters, exits) = (Arc::clone(&channel.waiters), Arc::clone(&channel.exits));
        std::thread::Builder::new()
            .name("urom-service".into())
            .spawn(move || route_replies(reader, max, &waiters, &exits))
            .map_err(io_error)?;
        Ok(channel)
    }

    /// Sends a request; the reply arrives on the returned receiver (which disconnects if the
    /// daemon goes away first).
    pub(crate) fn request(
        &self,
        body: ControlMessage<'_>,
    ) -> Result<mpsc::Receiver<Reply>, ControlError> {
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        let (sender, receiver) = mpsc::channel();
        lock(&self.waiters).insert(seq, sender);
        let mut writer = lock(&self.writer);
        if let Err(e) = write_frame(&mut writer, self.max, seq, body) {
            lock(&self.waiters).remove(&seq);
            return Err(e);
        }
        Ok(receiver)
    }

    /// Sends a request and waits for its reply.
    pub(crate) fn call(&self, body: ControlMessage<'_>) -> Result<Reply, ControlError> {
        let reply = self
            .request(body)?
            .recv()
            .map_err(|_| ControlError::Closed)?;
        reply.refusal()?;
        Ok(reply)
    }

    /// A receiver told when worker `id` ends (or disconnected when the daemon goes away).
    pub(crate) fn watch_exit(&self, id: u64) -> mpsc::Receiver<WorkerExit> {
        let (sender, receiver) = mpsc::channel();
        lock(&self.exits).entry(id).or_default().push(sender);
        receiver
    }

    /// Closes the connection: the daemon tears down the workers only this host used.
    pub(crate) fn close(&self) {
        let _ = lock(&self.writer).shutdown(std::net::Shutdown::Both);
    }
}

impl Drop for ControlChannel {
    fn drop(&mut self) {
        self.close();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The reader thread: replies to their waiters, exit events to their watchers. When the
/// daemon goes away, dropping every sender tells everyone.
fn route_replies(mut reader: UnixStream, max: MaxMsgSize, waiters: &Waiters, exits: &ExitWatchers) {
    while let Ok(reply) = read_frame(&mut reader, max) {
        if let ControlMessage::WorkerExited(exit) = reply.message() {
            if let Some(watchers) = lock(exits).remove(&exit.worker_id) {
                for watcher in watchers {
                    let _ = watcher.send(exit);
                }
            }
            continue;
        }
        let seq = crate::wire::frame::peek_seq(&reply.bytes).expect("a whole header");
        if let Some(waiter) = lock(waiters).remove(&seq) {
            let _ = waiter.send(reply);
        }
    }
    lock(waiters).clear();
    lock(exits).clear();
}

fn write_frame(
    stream: &mut UnixStream,
    max: MaxMsgSize,
    seq: u64,
    body: ControlMessage<'_>,
) -> Result<(), ControlError> {
    let frame = FrameRepr { seq, body };
    let mut bytes = vec![0u8; frame.buffer_len()];
    frame
        .emit(&mut bytes, max)
        .map_err(|e| ControlError::Protocol(e.to_string()))?;
    stream.write_all(&bytes).map_err(io_error)
}

/// Sends a handshake frame. A daemon that turns the connection away (a user it does not serve,
/// too many connections, a handshake too slow) answers with an error and hangs up, possibly
/// before this frame arrived: its reason is worth more than the broken pipe.
fn send_handshake(
    stream: &mut UnixStream,
    max: MaxMsgSize,
    seq: u64,
    body: ControlMessage<'_>,
) -> Result<(), ControlError> {
    write_frame(stream, max, seq, body).map_err(|sent| {
        match read_frame(stream, max).map(|reply| reply.refusal()) {
            Ok(Err(refused)) => refused,
            _ => sent,
        }
    })
}

fn read_frame(stream: &mut UnixStream, max: MaxMsgSize) -> Result<Reply, ReadError> {
    let mut bytes = vec![0u8; FRAME_HEADER_LEN];
    stream.read_exact(&mut bytes)?;
    let len = frame_length(&bytes, max)
        .map_err(|e| ControlError::Protocol(e.to_string()))?
        .ok_or_else(|| ControlError::Protocol("short header".into()))?;
    bytes.resize(len, 0);
    stream.read_exact(&mut bytes[FRAME_HEADER_LEN..])?;
    FrameRepr::<ControlMessage>::parse(&bytes, max)
        .map_err(|e| ControlError::Protocol(e.to_string()))?;
    Ok(Reply { bytes, max })
}
