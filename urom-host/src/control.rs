//! The host's connection to the daemon: a synchronous handshake, then requests answered by a
//! reader thread that routes each reply to its requester and each worker exit to the workers
//! watching it. Shared by every thread's contexts; not on any hot path.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, Write};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak, mpsc};
use std::time::Duration;

use nix::sys::eventfd::{EfdFlags, EventFd};

use urom_transport::auth::{self, SealedKey, SessionKeys, SharedSecret, Side, Transcript};
use urom_transport::stream::{self, StreamReader, StreamWriter};
use urom_wire::control::{
    AuthMethod, AuthResponse, ControlMessage, Hello, IDENTITY_LEN, WorkerExit,
};
use urom_wire::{FrameRepr, MaxMsgSize, PROTOCOL_VERSION, Status};

/// How long the handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why talking to the daemon failed. Errors of the system keep their cause
/// ([`std::error::Error::source`]).
#[derive(Debug, Clone)]
pub enum ControlError {
    /// No daemon answers at the local socket (there is none, or nothing listens on it).
    NoDaemon {
        /// The socket tried.
        socket: PathBuf,
        /// What the OS said.
        reason: String,
    },
    /// The local socket's permissions keep this user out.
    PermissionDenied {
        /// The socket tried.
        socket: PathBuf,
    },
    /// The socket failed.
    Io {
        /// What was being done, when more than talking on the connection: "connecting to
        /// 192.0.2.1:18515", "resolving the service's address host:18515".
        doing: Option<String>,
        /// What the system said.
        source: Arc<io::Error>,
    },
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
            Self::NoDaemon { socket, reason } => write!(
                f,
                "no urom daemon answers at {} ({reason}): start one (urom-daemon listens there \
                 unless given --socket), or point this program at the daemon's socket (the \
                 samples and urom-ctl take --socket; DOCA_UROM_SERVICE_FILE names a service)",
                socket.display()
            ),
            Self::PermissionDenied { socket } => write!(
                f,
                "permission denied on {}: the daemon serves its own user and root, and others \
                 only when started with --allow-uid",
                socket.display()
            ),
            Self::Io {
                doing: Some(doing),
                source,
            } => write!(f, "connection to the service failed: {doing}: {source}"),
            Self::Io {
                doing: None,
                source,
            } => write!(f, "connection to the service failed: {source}"),
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

impl std::error::Error for ControlError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io { source, .. } => Some(source.as_ref()),
            _ => None,
        }
    }
}

impl ControlError {
    /// The status a task failing with this error completes with.
    pub fn status(&self) -> Status {
        match self {
            Self::Refused { status, .. } => *status,
            Self::Closed | Self::NoDaemon { .. } => Status::NotConnected,
            Self::PermissionDenied { .. } => Status::NotPermitted,
            Self::Io { .. } => Status::IoFailed,
            Self::TimedOut { .. } => Status::TimeOut,
            Self::Protocol(_) => Status::Unexpected,
        }
    }
}

impl ControlError {
    /// The system's error `source`, met while `doing` something that the connection alone
    /// does not say.
    pub fn io(doing: impl Into<String>, source: io::Error) -> Self {
        Self::Io {
            doing: Some(doing.into()),
            source: Arc::new(source),
        }
    }
}

fn io_error(e: io::Error) -> ControlError {
    ControlError::Io {
        doing: None,
        source: Arc::new(e),
    }
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
            io::ErrorKind::InvalidData => Self::Other(ControlError::Protocol(e.to_string())),
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
type ExitWatchers = Mutex<HashMap<u64, Vec<Weak<ExitWatch>>>>;

/// A watch on a worker's process: where the service's reader thread leaves the daemon's word
/// that it ended, and a descriptor that becomes readable then, so that an engine asleep wakes
/// for it. The second way a host learns that a worker died, independent of the data
/// channel's. The reader thread holds it weakly: a watch dropped with its worker context
/// (stopped, or failed otherwise) closes its descriptor at once.
pub(crate) struct ExitWatch {
    exit: OnceLock<WorkerExit>,
    /// Non-blocking; written once `exit` is set.
    wake: EventFd,
}

impl ExitWatch {
    /// The daemon's word that the worker ended, once it came. One atomic load.
    #[inline]
    pub(crate) fn exited(&self) -> Option<WorkerExit> {
        self.exit.get().copied()
    }

    /// Readable once the word came, until [`ExitWatch::quiet`].
    pub(crate) fn wake_fd(&self) -> BorrowedFd<'_> {
        self.wake.as_fd()
    }

    /// Makes the descriptor quiet again (the word stays).
    pub(crate) fn quiet(&self) {
        // Non-blocking: nothing to read is fine.
        let _ = self.wake.read();
    }
}

/// A service on another machine, as [`ControlChannel::open`] authenticates with it.
#[derive(Clone, Copy)]
pub(crate) struct RemoteService<'a> {
    /// The secret both hold.
    pub(crate) secret: &'a SharedSecret,
    /// Its IP address, when known.
    pub(crate) ip: Option<IpAddr>,
}

/// What a host that authenticated with the shared secret keeps of the session: enough to open
/// the worker keys the daemon seals for it.
struct RemoteSession {
    /// The service's IP address, when known: where its workers listen when they say
    /// "any address".
    service_ip: Option<IpAddr>,
    keys: SessionKeys,
}

/// The connection to the daemon.
pub(crate) struct ControlChannel {
    remote: Option<RemoteSession>,
    writer: Mutex<StreamWriter>,
    max: MaxMsgSize,
    next_seq: AtomicU64,
    waiters: Arc<Waiters>,
    exits: Arc<ExitWatchers>,
}

impl ControlChannel {
    /// Connects to a daemon on this machine, says hello and authenticates with this process's
    /// Unix credentials, then starts the reader thread.
    pub(crate) fn connect(
        socket: &Path,
        max: MaxMsgSize,
        identity: &str,
    ) -> Result<Arc<Self>, ControlError> {
        let stream = UnixStream::connect(socket).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => ControlError::NoDaemon {
                socket: socket.to_owned(),
                reason: e.to_string(),
            },
            io::ErrorKind::PermissionDenied => ControlError::PermissionDenied {
                socket: socket.to_owned(),
            },
            _ => io_error(e),
        })?;
        let (reader, writer) = stream::split_unix(stream).map_err(io_error)?;
        Self::open(reader, writer, max, identity, None)
    }

    /// Says hello on a connected stream and authenticates: with a `secret` (a daemon on
    /// another machine) by proving it and checking the daemon's proof, else with this
    /// process's Unix credentials. Then starts the reader thread.
    pub(crate) fn open(
        mut reader: StreamReader,
        mut writer: StreamWriter,
        max: MaxMsgSize,
        identity: &str,
        remote: Option<RemoteService<'_>>,
    ) -> Result<Arc<Self>, ControlError> {
        reader
            .set_read_timeout(Some(HANDSHAKE_TIMEOUT))
            .map_err(io_error)?;
        let identity = urom_wire::truncate_at_char_boundary(identity, IDENTITY_LEN - 1);
        let hello = Hello {
            protocol_version: PROTOCOL_VERSION,
            max_msg_size: max.as_u32(),
            identity,
        };
        let mut handshake = Handshake {
            reader: &mut reader,
            writer: &mut writer,
            max,
        };
        let reply = handshake.exchange(1, ControlMessage::Hello(hello), "the hello")?;
        let ControlMessage::AuthChallenge(challenge) = reply.message() else {
            return Err(ControlError::Protocol("no authentication challenge".into()));
        };
        let mut session = None;
        match (challenge.method, remote) {
            (AuthMethod::PeerCredentials, None) => {
                let response = AuthResponse {
                    method: AuthMethod::PeerCredentials,
                    proof: [0; 32],
                };
                let reply = handshake.exchange(
                    2,
                    ControlMessage::AuthResponse(response),
                    "the authentication",
                )?;
                if !matches!(reply.message(), ControlMessage::Ack) {
                    return Err(ControlError::Protocol(
                        "authentication was not acknowledged".into(),
                    ));
                }
            }
            (AuthMethod::SharedSecret, Some(RemoteService { secret, ip })) => {
                let proof = secret
                    .answer(&challenge.nonce, identity)
                    .map_err(|e| ControlError::io("drawing a nonce", io::Error::other(e)))?;
                let nonce = proof.nonce;
                let transcript = Transcript {
                    service_nonce: &challenge.nonce,
                    host_nonce: &nonce,
                    identity,
                };
                let reply = handshake.exchange(
                    2,
                    ControlMessage::SecretProof(proof),
                    "the authentication",
                )?;
                let ControlMessage::ServiceProof(service) = reply.message() else {
                    return Err(ControlError::Protocol(
                        "the service did not prove that it holds the shared secret".into(),
                    ));
                };
                if !secret.check_service_proof(&transcript, &service.proof) {
                    return Err(ControlError::Refused {
                        status: Status::Authentication,
                        reason: "the service's proof of the shared secret is wrong: it does not \
                                 hold the same key, or someone else answered"
                            .into(),
                    });
                }
                // Everything after the proofs travels in records with an integrity check.
                let keys = secret.session_keys(&transcript);
                keys.seal(Side::Connecting, handshake.reader, handshake.writer, max);
                session = Some(RemoteSession {
                    service_ip: ip,
                    keys,
                });
            }
            (AuthMethod::SharedSecret, None) => {
                return Err(ControlError::Refused {
                    status: Status::Authentication,
                    reason: format!(
                        "the service asks for a shared secret; give a key file ({})",
                        auth::KEY_FILE_VAR
                    ),
                });
            }
            (method, _) => {
                return Err(ControlError::Protocol(format!(
                    "authentication method {method:?} is not supported here"
                )));
            }
        }
        reader.set_read_timeout(None).map_err(io_error)?;
        let channel = Arc::new(Self {
            remote: session,
            writer: Mutex::new(writer),
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

    /// Opens the key of worker `worker_id` that the daemon sealed for this session; `None` on a
    /// local connection.
    pub(crate) fn open_worker_key(
        &self,
        worker_id: u64,
        sealed: &SealedKey,
    ) -> Result<SharedSecret, &'static str> {
        let session = self
            .remote
            .as_ref()
            .ok_or("a sealed worker address on a local connection")?;
        let key = session
            .keys
            .open_worker_key(worker_id, sealed)
            .ok_or("the worker's key does not open with this session's keys")?;
        Ok(SharedSecret::from_bytes(&key))
    }

    /// Where to reach a listener of the service's: `listener` (`IP:PORT`) with an unspecified IP
    /// replaced by the service's own.
    pub(crate) fn resolve_listener(&self, listener: &str) -> String {
        let service_ip = self.remote.as_ref().and_then(|r| r.service_ip);
        match (listener.parse::<SocketAddr>(), service_ip) {
            (Ok(address), Some(ip)) if address.ip().is_unspecified() => {
                SocketAddr::new(ip, address.port()).to_string()
            }
            _ => listener.to_owned(),
        }
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

    /// A watch told when worker `id` ends (never, if the daemon goes away first).
    pub(crate) fn watch_exit(&self, id: u64) -> io::Result<Arc<ExitWatch>> {
        let watch = Arc::new(ExitWatch {
            exit: OnceLock::new(),
            wake: EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)?,
        });
        let mut exits = lock(&self.exits);
        // Forget the watches of contexts that are gone.
        exits.retain(|_, watches| {
            watches.retain(|watch| watch.strong_count() > 0);
            !watches.is_empty()
        });
        exits.entry(id).or_default().push(Arc::downgrade(&watch));
        Ok(watch)
    }

    /// Closes the connection: the daemon tears down the workers only this host used.
    pub(crate) fn close(&self) {
        lock(&self.writer).hang_up();
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
fn route_replies(
    mut reader: StreamReader,
    max: MaxMsgSize,
    waiters: &Waiters,
    exits: &ExitWatchers,
) {
    while let Ok(reply) = read_frame(&mut reader, max) {
        if let ControlMessage::WorkerExited(exit) = reply.message() {
            let watches = lock(exits).remove(&exit.worker_id).unwrap_or_default();
            for watch in watches.iter().filter_map(Weak::upgrade) {
                if watch.exit.set(exit).is_ok() {
                    let _ = watch.wake.write(1);
                }
            }
            continue;
        }
        let seq = urom_wire::frame::peek_seq(&reply.bytes).expect("a whole header");
        if let Some(waiter) = lock(waiters).remove(&seq) {
            let _ = waiter.send(reply);
        }
    }
    lock(waiters).clear();
    lock(exits).clear();
}

fn write_frame(
    stream: &mut StreamWriter,
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

/// The two halves of a connection during the handshake.
struct Handshake<'a> {
    reader: &'a mut StreamReader,
    writer: &'a mut StreamWriter,
    max: MaxMsgSize,
}

impl Handshake<'_> {
    /// Sends a handshake frame and reads the answer, which must not be an error reply. A
    /// daemon that turns the connection away (a user it does not serve, too many connections, a
    /// handshake too slow) answers with an error and hangs up, possibly before this frame
    /// arrived: its reason is worth more than the broken pipe.
    fn exchange(
        &mut self,
        seq: u64,
        body: ControlMessage<'_>,
        waited_for: &'static str,
    ) -> Result<Reply, ControlError> {
        if let Err(sent) = write_frame(self.writer, self.max, seq, body) {
            return Err(
                match read_frame(self.reader, self.max).map(|r| r.refusal()) {
                    Ok(Err(refused)) => refused,
                    _ => sent,
                },
            );
        }
        let reply = read_frame(self.reader, self.max).map_err(|e| e.timed_out(waited_for))?;
        reply.refusal()?;
        Ok(reply)
    }
}

fn read_frame(stream: &mut StreamReader, max: MaxMsgSize) -> Result<Reply, ReadError> {
    let mut bytes = Vec::new();
    stream::read_frame(stream, &mut bytes, max, None)?;
    FrameRepr::<ControlMessage>::parse(&bytes, max)
        .map_err(|e| ControlError::Protocol(e.to_string()))?;
    Ok(Reply { bytes, max })
}

#[cfg(test)]
mod tests {
    use super::*;
    use urom_wire::control::{AuthChallenge, SecretProof};

    /// A service that answers the handshake as `answer` says, on the other end of a stream.
    fn fake_service(
        method: AuthMethod,
        answer: impl FnOnce(&SecretProof) -> ControlMessage<'static> + Send + 'static,
    ) -> (StreamReader, StreamWriter) {
        let (host, service) = UnixStream::pair().unwrap();
        std::thread::spawn(move || {
            let (mut reader, mut writer) = stream::split_unix(service).unwrap();
            let max = MaxMsgSize::DEFAULT;
            let _hello = read_frame(&mut reader, max).ok().unwrap();
            let challenge = AuthChallenge {
                method,
                nonce: [7; 32],
            };
            write_frame(
                &mut writer,
                max,
                1,
                ControlMessage::AuthChallenge(challenge),
            )
            .unwrap();
            let Ok(reply) = read_frame(&mut reader, max) else {
                return;
            };
            if let ControlMessage::SecretProof(proof) = reply.message() {
                write_frame(&mut writer, max, 2, answer(&proof)).unwrap();
            }
        });
        stream::split_unix(host).unwrap()
    }

    fn open(
        halves: (StreamReader, StreamWriter),
        secret: Option<&SharedSecret>,
    ) -> Result<Arc<ControlChannel>, ControlError> {
        let (reader, writer) = halves;
        let remote = secret.map(|secret| RemoteService { secret, ip: None });
        ControlChannel::open(reader, writer, MaxMsgSize::DEFAULT, "rank-0", remote)
    }

    #[test]
    fn a_service_that_cannot_prove_the_secret_is_refused() {
        let secret = SharedSecret::from_bytes(b"the host's shared secret");
        let forged = fake_service(AuthMethod::SharedSecret, |_| {
            ControlMessage::ServiceProof(urom_wire::control::ServiceProof { proof: [9; 32] })
        });
        let error = open(forged, Some(&secret)).err().unwrap();
        assert!(
            matches!(&error, ControlError::Refused { status: Status::Authentication, reason } if reason.contains("proof of the shared secret is wrong")),
            "{error}"
        );

        let acked = fake_service(AuthMethod::SharedSecret, |_| ControlMessage::Ack);
        let error = open(acked, Some(&secret)).err().unwrap();
        assert!(
            error.to_string().contains("did not prove that it holds"),
            "{error}"
        );
    }

    #[test]
    fn a_service_that_proves_the_secret_is_accepted() {
        let secret = SharedSecret::from_bytes(b"the host's shared secret");
        let service_secret = secret.clone();
        let honest = fake_service(AuthMethod::SharedSecret, move |proof| {
            let transcript = Transcript {
                service_nonce: &[7; 32],
                host_nonce: &proof.nonce,
                identity: "rank-0",
            };
            assert!(service_secret.check_host_proof(&transcript, &proof.proof));
            ControlMessage::ServiceProof(urom_wire::control::ServiceProof {
                proof: service_secret.service_proof(&transcript),
            })
        });
        assert!(open(honest, Some(&secret)).is_ok());
    }

    #[test]
    fn a_secret_challenge_without_a_key_file_says_what_is_missing() {
        let remote = fake_service(AuthMethod::SharedSecret, |_| ControlMessage::Ack);
        let error = open(remote, None).err().unwrap();
        assert!(error.to_string().contains(auth::KEY_FILE_VAR), "{error}");
    }
}
