//! The channel between the server and the orchestrator: where DOCA Comch ran in the original,
//! here one control connection and one data connection per server data-path thread, over one
//! of two transports, chosen by the `-c` name both sides are given ([`Endpoint`]):
//!
//! * a name (or a path): the two run on one machine; control is a Unix socket
//!   ([`socket_path`]), data connections are urom shared memory
//!   ([`ShmConnection`]);
//! * `ucx://IP:PORT` (build feature `ucx`): the two run on different machines; the server
//!   listens for UCX connections on that address, the orchestrator connects to it; control and
//!   data connections are urom UCX connections (`urom_core::transport::ucx`), over whatever
//!   `UCX_TLS` / `UCX_NET_DEVICES` select (TCP, RDMA).
//!
//! The data connections come as [`DataConnections`], one vector per transport, so that each
//! data-path and processor thread is compiled for its transport: no dispatch per frame.
//!
//! Setup, the server listening and the orchestrator connecting:
//!
//! 1. control connection: each side sends a hello (`urom_wire::gpu::channel::ChannelHello`:
//!    version, data-path threads, `--max-message-length`, `--max-concurrent-messages`; the
//!    server sends its own before it checks the orchestrator's); another version, a different
//!    thread count or message length is refused, with the same clear error on both sides;
//! 2. over UCX only, the server listens for the data connections on a second port of the same
//!    address (their frame size follows the agreed message length, which the control
//!    connection's cannot) and sends it (`urom_wire::gpu::channel::DataListener`);
//! 3. one data connection per thread, in thread order: the orchestrator sends a data hello
//!    (`urom_wire::gpu::channel::DataHello`: the thread index; over UCX as the connection's first
//!    frame), the server creates the shared mapping on it (shared memory), then sends the GPU
//!    wire's `exchange_consumer_id_request` with its thread index and the orchestrator answers
//!    with the `exchange_consumer_id_response` of the processor that serves that thread;
//! 4. the control connection then carries `start_shutdown` and `shutdown_complete` (the GPU
//!    wire's messages) in either direction; its end tells each side that the other died.
//!
//! A data frame carries one or more whole `client_request` messages of one client, byte for
//! byte as the client sent them, concatenated (at most [`BATCH_BYTES`], or one message when a
//! message is longer): a pipelining client's requests cross in one frame. The answer to a frame
//! is one frame holding the `client_response` of each of its requests, in order, and the
//! orchestrator answers a connection's frames in the order they came. Each connection has
//! `--max-concurrent-messages` slots in each direction, rounded up to a power of two, at most
//! [`MAX_CHANNEL_SLOTS`](limits::MAX_CHANNEL_SLOTS): frames hold many requests, so the server
//! rarely finds a ring full, and a client whose frame finds it full waits for a slot.

#[cfg(feature = "ucx")]
mod ucx;

#[cfg(feature = "ucx")]
pub use ucx::control_config as ucx_control_config;

use std::fmt;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use urom_core::transport::shm::{HugePages, ShmConnection};
use urom_core::transport::{Channel, ChannelConfig, ConnectError};
use urom_core::transport::{Transport, WaitMode};
use urom_wire::DecodeError;
use urom_wire::MaxMsgSize;
use urom_wire::gpu::channel::{
    CHANNEL_HELLO_LEN, CHANNEL_HELLO_MAGIC, CHANNEL_VERSION, ChannelHelloRepr, DATA_HELLO_LEN,
    DataHelloRepr,
};
use urom_wire::gpu::{CLIENT_HEADER_LEN, GpuMessage};

use crate::limits::{self, BATCH_BYTES};
use urom_core::transport::shm::MAX_MAPPING_LEN;

/// The channel name used when `-c/--comch-channel-name` is not given.
pub const DEFAULT_CHANNEL_NAME: &str = "dpu_gpu_remote_offload";
/// How a `-c` name that is a UCX address starts.
pub const UCX_SCHEME: &str = "ucx://";

/// How long one step of the setup may take once the peer is there.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a wait checks the stop flag.
pub const TICK: Duration = Duration::from_millis(50);

/// The Unix socket of channel `name`: `name` itself when it contains a `/`, else
/// `$XDG_RUNTIME_DIR/gpu-offload-<name>.sock`, or `/tmp/gpu-offload-<name>.sock` without
/// `XDG_RUNTIME_DIR`.
pub fn socket_path(name: &str) -> PathBuf {
    if name.contains('/') {
        return PathBuf::from(name);
    }
    let dir = std::env::var_os("XDG_RUNTIME_DIR")
        .filter(|dir| !dir.is_empty())
        .map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
    dir.join(format!("gpu-offload-{name}.sock"))
}

/// Where the channel is, as the `-c` name says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// Server and orchestrator on one machine: the control socket ([`socket_path`] of the
    /// name), data over shared memory.
    Local(PathBuf),
    /// Server and orchestrator on different machines (`ucx://IP:PORT`): the server listens for
    /// UCX connections on this address, the orchestrator connects to it. Needs the `ucx`
    /// build feature.
    Ucx(SocketAddr),
}

impl Endpoint {
    /// The endpoint a `-c` name names: `ucx://IP:PORT` (`ucx://192.0.2.1:7000`,
    /// `ucx://[2001:db8::1]:7000`) or else a channel name or socket path.
    pub fn parse(name: &str) -> Result<Self, ChannelError> {
        match name.strip_prefix(UCX_SCHEME) {
            Some(address) => address
                .parse()
                .map(Self::Ucx)
                .map_err(|_| ChannelError::BadName(name.to_owned())),
            None => Ok(Self::Local(socket_path(name))),
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Local(path) => write!(f, "{}", path.display()),
            Self::Ucx(address) => write!(f, "{UCX_SCHEME}{address}"),
        }
    }
}

/// Checks a `-c` name on the command line (see [`Endpoint::parse`]).
pub fn check_name(name: &str) -> Result<String, String> {
    Endpoint::parse(name)
        .map(|_| name.to_owned())
        .map_err(|e| e.to_string())
}

/// What both sides must agree on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelParams {
    /// Server data-path threads (`--cpu` count) = orchestrator processor threads (`-t`).
    pub threads: u32,
    /// Largest payload, headers excluded (`--max-message-length`).
    pub max_message_length: u32,
    /// Requests in flight per thread (`--max-concurrent-messages`); the server's value is the
    /// one used.
    pub max_concurrent: u32,
}

impl ChannelParams {
    /// The largest client message: header and the largest payload.
    pub fn max_message(&self) -> usize {
        CLIENT_HEADER_LEN + self.max_message_length as usize
    }

    /// The largest frame on a data connection: [`BATCH_BYTES`], or one largest message when
    /// that is more.
    pub fn frame_capacity(&self) -> usize {
        self.max_message().max(BATCH_BYTES)
    }

    /// The shared-memory settings of every data connection.
    pub fn channel_config(&self) -> Result<ChannelConfig, ChannelError> {
        let frame = u32::try_from(self.frame_capacity())
            .ok()
            .map(|frame| frame.max(MaxMsgSize::MIN));
        let max_msg_size = frame
            .and_then(|frame| MaxMsgSize::new(frame).ok())
            .filter(|frame| {
                limits::mapping_len(frame.as_u32(), self.max_concurrent) <= MAX_MAPPING_LEN
            })
            .ok_or(ChannelError::MessageTooLong {
                len: self.max_message_length,
            })?;
        Ok(ChannelConfig {
            max_msg_size,
            slots: limits::channel_slots(self.max_concurrent),
            wait: WaitMode::Adaptive {
                spin: Duration::from_micros(20),
            },
            hugepages: HugePages::Auto,
            handshake_timeout: STEP_TIMEOUT,
        })
    }

    fn hello(&self) -> [u8; CHANNEL_HELLO_LEN] {
        ChannelHelloRepr {
            threads: self.threads,
            max_message_length: self.max_message_length,
            max_concurrent: self.max_concurrent,
        }
        .to_bytes()
    }

    /// The peer's parameters from its hello. A hello of another version is
    /// [`ChannelError::Version`] whatever its length, so that a later version may grow it.
    fn from_hello(hello: &[u8]) -> Result<Self, ChannelError> {
        match ChannelHelloRepr::parse(hello) {
            Ok(hello) => Ok(Self {
                threads: hello.threads,
                max_message_length: hello.max_message_length,
                max_concurrent: hello.max_concurrent,
            }),
            Err(DecodeError::UnsupportedFormatVersion { found, .. }) => {
                Err(ChannelError::Version(found))
            }
            Err(_) => {
                // A hello's magic, then its version word.
                let version = hello
                    .strip_prefix(&CHANNEL_HELLO_MAGIC)
                    .and_then(|rest| rest.get(..4))
                    .and_then(|word| <[u8; 4]>::try_from(word).ok())
                    .map(u32::from_be_bytes);
                match version {
                    Some(found) if found != CHANNEL_VERSION => Err(ChannelError::Version(found)),
                    _ => Err(ChannelError::NotAPeer),
                }
            }
        }
    }
}

/// Why the channel could not be set up or broke.
#[derive(Debug)]
pub enum ChannelError {
    /// The server could not listen on the channel's socket.
    Bind {
        /// The socket.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
    /// Another server already listens on the socket.
    InUse(PathBuf),
    /// The orchestrator found no server listening on the socket in time.
    Connect {
        /// The socket.
        path: PathBuf,
        /// What the OS said last.
        source: io::Error,
    },
    /// A read or write on a channel socket failed.
    Io {
        /// What was being done.
        op: &'static str,
        /// What the OS said.
        source: io::Error,
    },
    /// The peer did not answer in time.
    Timeout(&'static str),
    /// The peer hung up during setup.
    PeerGone(&'static str),
    /// What connected is not a gpu-offload server or orchestrator.
    NotAPeer,
    /// The peer speaks another version of this setup.
    Version(u32),
    /// The two sides run different numbers of data-path threads.
    ThreadCountMismatch {
        /// The server's `--cpu` count.
        server: u32,
        /// The orchestrator's `-t/--num-gpu-threads`.
        orchestrator: u32,
    },
    /// The two sides allow different message lengths.
    MessageLengthMismatch {
        /// The server's `--max-message-length`.
        server: u32,
        /// The orchestrator's `--max-message-length`.
        orchestrator: u32,
    },
    /// `--max-message-length` (from a peer's hello: the parser refuses it) gives frames
    /// larger than the transport carries.
    MessageTooLong {
        /// The `--max-message-length`.
        len: u32,
    },
    /// A data connection could not be set up.
    DataSetup(ConnectError),
    /// The peer broke the consumer-id exchange.
    ConsumerId(&'static str),
    /// A stop signal arrived during setup.
    Stopped,
    /// A `-c` name that starts like a UCX address but is not one.
    BadName(String),
    /// `-c ucx://...` in a build without UCX.
    NoUcx(SocketAddr),
    /// The server could not listen for UCX connections.
    ListenUcx {
        /// The address.
        address: SocketAddr,
        /// What UCX said.
        reason: String,
    },
    /// The orchestrator's UCX connection to the server's listener failed.
    AcceptUcx(String),
    /// The orchestrator could not reach a server over UCX (in time).
    ConnectUcx {
        /// The address.
        address: SocketAddr,
        /// What UCX said last.
        reason: String,
    },
}

impl fmt::Display for ChannelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Bind { path, source } => {
                write!(
                    f,
                    "cannot listen on channel socket {}: {source}",
                    path.display()
                )
            }
            Self::InUse(path) => write!(
                f,
                "another server already listens on channel socket {} (choose another -c name)",
                path.display()
            ),
            Self::Connect { path, source } => write!(
                f,
                "no server on channel socket {}: {source} (start the server first, with the \
                 same -c name)",
                path.display()
            ),
            Self::Io { op, source } => write!(f, "channel {op} failed: {source}"),
            Self::Timeout(what) => write!(f, "channel setup timed out: {what}"),
            Self::PeerGone(when) => write!(f, "the peer hung up {when}"),
            Self::NotAPeer => f.write_str(
                "the peer on the channel socket is not a gpu-offload server or orchestrator",
            ),
            Self::Version(v) => write!(
                f,
                "the peer speaks channel version {v}, this program {CHANNEL_VERSION}: use matching builds"
            ),
            Self::ThreadCountMismatch {
                server,
                orchestrator,
            } => write!(
                f,
                "thread count mismatch: the server has {server} data-path threads (--cpu given \
                 {server} times) but the orchestrator runs {orchestrator} (-t {orchestrator}); \
                 start both with the same count"
            ),
            Self::MessageLengthMismatch {
                server,
                orchestrator,
            } => write!(
                f,
                "message length mismatch: the server allows {server} bytes \
                 (--max-message-length {server}), the orchestrator {orchestrator}; start both \
                 with the same value"
            ),
            Self::MessageTooLong { len } => write!(
                f,
                "--max-message-length {len} is too long: a frame carries at most {} payload \
                 bytes (headers excluded)",
                limits::MAX_MESSAGE_LENGTH
            ),
            Self::DataSetup(e) => write!(f, "data channel setup failed: {e}"),
            Self::ConsumerId(what) => write!(f, "consumer id exchange failed: {what}"),
            Self::Stopped => f.write_str("stopped by a signal during channel setup"),
            Self::BadName(name) => write!(
                f,
                "channel name {name}: a UCX channel is {UCX_SCHEME}IP:PORT, for example \
                 {UCX_SCHEME}192.0.2.1:7000 or {UCX_SCHEME}[2001:db8::1]:7000"
            ),
            Self::NoUcx(address) => write!(
                f,
                "-c {UCX_SCHEME}{address}: this build has no UCX; rebuild gpu-offload with \
                 `--features ucx` (or run server and orchestrator on one machine with a channel \
                 name)"
            ),
            Self::ListenUcx { address, reason } => write!(
                f,
                "channel {UCX_SCHEME}{address}: cannot listen for the orchestrator: {reason} (the \
                 address must be one of this machine's, or 0.0.0.0 for all)"
            ),
            Self::AcceptUcx(reason) => {
                write!(f, "the orchestrator's UCX connection failed: {reason}")
            }
            Self::ConnectUcx { address, reason } => write!(
                f,
                "no server on channel {UCX_SCHEME}{address} (start the server first, with the \
                 same -c, an address of its machine that this one reaches): {reason}"
            ),
        }
    }
}

impl std::error::Error for ChannelError {}

fn io_error(op: &'static str) -> impl FnOnce(io::Error) -> ChannelError {
    move |source| ChannelError::Io { op, source }
}

/// Checks the peer's parameters against ours: the same on both sides.
fn agree(server: &ChannelParams, orchestrator: &ChannelParams) -> Result<(), ChannelError> {
    if server.threads != orchestrator.threads {
        return Err(ChannelError::ThreadCountMismatch {
            server: server.threads,
            orchestrator: orchestrator.threads,
        });
    }
    if server.max_message_length != orchestrator.max_message_length {
        return Err(ChannelError::MessageLengthMismatch {
            server: server.max_message_length,
            orchestrator: orchestrator.max_message_length,
        });
    }
    Ok(())
}

fn read_exact_or_gone(
    stream: &mut UnixStream,
    buf: &mut [u8],
    when: &'static str,
) -> Result<(), ChannelError> {
    stream.read_exact(buf).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset => {
            ChannelError::PeerGone(when)
        }
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => ChannelError::Timeout(when),
        _ => ChannelError::Io {
            op: "read",
            source: e,
        },
    })
}

/// Waits until `fd` is readable, `stop` is set (`Err(Stopped)`) or `deadline` passes.
fn wait_readable(
    fd: BorrowedFd<'_>,
    stop: &AtomicBool,
    deadline: Option<Instant>,
    what: &'static str,
) -> Result<(), ChannelError> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    loop {
        if stop.load(Ordering::Relaxed) {
            return Err(ChannelError::Stopped);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(ChannelError::Timeout(what));
        }
        let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(TICK.as_millis() as u16)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => {}
            Ok(_) => return Ok(()),
            Err(errno) => {
                return Err(ChannelError::Io {
                    op: "poll",
                    source: errno.into(),
                });
            }
        }
    }
}

/// A control connection while the channel is set up: whole records each way.
trait SetupLink {
    /// Sends `record` whole.
    fn put(&mut self, record: &[u8]) -> Result<(), ChannelError>;

    /// Receives one record of `len` bytes (a whole frame, where the link has frames) and hands
    /// it to `read`; `when` says what was awaited, for errors.
    fn get<R>(
        &mut self,
        len: usize,
        when: &'static str,
        read: impl FnOnce(&[u8]) -> Result<R, ChannelError>,
    ) -> Result<R, ChannelError>;
}

impl SetupLink for UnixStream {
    fn put(&mut self, record: &[u8]) -> Result<(), ChannelError> {
        self.write_all(record).map_err(io_error("write"))
    }

    fn get<R>(
        &mut self,
        len: usize,
        when: &'static str,
        read: impl FnOnce(&[u8]) -> Result<R, ChannelError>,
    ) -> Result<R, ChannelError> {
        let mut buf = [0u8; 64];
        let buf = buf.get_mut(..len).ok_or(ChannelError::NotAPeer)?;
        read_exact_or_gone(self, buf, when)?;
        read(buf)
    }
}

/// The server's half of the hellos: takes the orchestrator's, answers with `ours` whatever it
/// said (so that an orchestrator of another version sees the difference too), then checks it.
/// Returns what both sides agreed on.
fn server_hellos(
    link: &mut impl SetupLink,
    ours: &ChannelParams,
) -> Result<ChannelParams, ChannelError> {
    let theirs = link.get(CHANNEL_HELLO_LEN, "before its hello", |hello| {
        Ok(ChannelParams::from_hello(hello))
    })?;
    link.put(&ours.hello())?;
    agree(ours, &theirs?)?;
    Ok(*ours)
}

/// The orchestrator's half of the hellos: sends `ours`, takes the server's and checks it.
/// Returns what both sides agreed on (the server's `max_concurrent`).
fn orchestrator_hellos(
    link: &mut impl SetupLink,
    ours: &ChannelParams,
) -> Result<ChannelParams, ChannelError> {
    link.put(&ours.hello())?;
    let server = link.get(
        CHANNEL_HELLO_LEN,
        "before its hello",
        ChannelParams::from_hello,
    )?;
    agree(&server, ours)?;
    Ok(ChannelParams {
        max_concurrent: server.max_concurrent,
        ..*ours
    })
}

/// The server's end of the channel before the orchestrator connected. A Unix socket's file is
/// removed when it is dropped.
pub struct ChannelListener {
    kind: ListenerKind,
}

enum ListenerKind {
    Unix {
        listener: UnixListener,
        path: PathBuf,
    },
    #[cfg(feature = "ucx")]
    Ucx(ucx::Listener),
}

impl ChannelListener {
    /// Listens where `endpoint` says: on its Unix socket (a stale socket left by a dead server
    /// is replaced, a live one is an error), or for UCX connections on its address.
    pub fn bind(endpoint: &Endpoint) -> Result<Self, ChannelError> {
        match endpoint {
            Endpoint::Local(path) => Self::bind_unix(path),
            #[cfg(feature = "ucx")]
            Endpoint::Ucx(address) => Ok(Self {
                kind: ListenerKind::Ucx(ucx::Listener::bind(*address)?),
            }),
            #[cfg(not(feature = "ucx"))]
            Endpoint::Ucx(address) => Err(ChannelError::NoUcx(*address)),
        }
    }

    fn bind_unix(path: &Path) -> Result<Self, ChannelError> {
        if path.exists() {
            if UnixStream::connect(path).is_ok() {
                return Err(ChannelError::InUse(path.to_owned()));
            }
            let _ = std::fs::remove_file(path);
        }
        let listener = UnixListener::bind(path).map_err(|source| ChannelError::Bind {
            path: path.to_owned(),
            source,
        })?;
        Ok(Self {
            kind: ListenerKind::Unix {
                listener,
                path: path.to_owned(),
            },
        })
    }

    /// Where it listens (a UCX listener's real port when asked for port 0): what the
    /// orchestrator's `-c` must name.
    pub fn endpoint(&self) -> Endpoint {
        match &self.kind {
            ListenerKind::Unix { path, .. } => Endpoint::Local(path.clone()),
            #[cfg(feature = "ucx")]
            ListenerKind::Ucx(listener) => Endpoint::Ucx(listener.local_addr()),
        }
    }

    /// Waits for the orchestrator (until `stop`), agrees on `ours`, and sets up one data
    /// connection per thread.
    pub fn accept(
        &mut self,
        ours: &ChannelParams,
        stop: &AtomicBool,
    ) -> Result<ServerChannel, ChannelError> {
        match &mut self.kind {
            ListenerKind::Unix { listener, .. } => accept_unix(listener, ours, stop),
            #[cfg(feature = "ucx")]
            ListenerKind::Ucx(listener) => listener.accept(ours, stop),
        }
    }
}

impl Drop for ChannelListener {
    fn drop(&mut self) {
        match &self.kind {
            ListenerKind::Unix { path, .. } => {
                let _ = std::fs::remove_file(path);
            }
            #[cfg(feature = "ucx")]
            ListenerKind::Ucx(_) => {}
        }
    }
}

fn accept_one(
    listener: &UnixListener,
    stop: &AtomicBool,
    deadline: Option<Instant>,
    what: &'static str,
) -> Result<UnixStream, ChannelError> {
    wait_readable(listener.as_fd(), stop, deadline, what)?;
    let (stream, _) = listener.accept().map_err(io_error("accept"))?;
    stream
        .set_read_timeout(Some(STEP_TIMEOUT))
        .map_err(io_error("setsockopt"))?;
    Ok(stream)
}

fn accept_unix(
    listener: &UnixListener,
    ours: &ChannelParams,
    stop: &AtomicBool,
) -> Result<ServerChannel, ChannelError> {
    let mut control = accept_one(listener, stop, None, "waiting for the orchestrator")?;
    let params = server_hellos(&mut control, ours)?;
    let config = params.channel_config()?;
    let deadline = Instant::now() + STEP_TIMEOUT;
    let mut data = Vec::with_capacity(params.threads as usize);
    for index in 0..params.threads {
        let mut stream = accept_one(listener, stop, Some(deadline), "data connections")?;
        let mut announce = [0u8; DATA_HELLO_LEN];
        read_exact_or_gone(
            &mut stream,
            &mut announce,
            "before announcing a data connection",
        )?;
        check_data_hello(&announce, index)?;
        let mut conn = ShmConnection::create(stream, &config)
            .map_err(|e| ChannelError::DataSetup(e.into()))?;
        exchange_as_server(&mut conn, index, params.max_message_length)?;
        data.push(conn);
    }
    Ok(ServerChannel {
        control: Control::unix(control)?,
        data: DataConnections::Shm(data),
        params,
    })
}

/// Checks that a data connection announces thread `index`.
fn check_data_hello(announce: &[u8], index: u32) -> Result<(), ChannelError> {
    if DataHelloRepr::parse(announce) == Ok(DataHelloRepr { thread: index }) {
        Ok(())
    } else {
        Err(ChannelError::NotAPeer)
    }
}

/// Receives one frame within [`STEP_TIMEOUT`] and hands it to `read`; `when` says what was
/// awaited, for errors.
fn recv_one<T: Transport, R>(
    conn: &mut T,
    when: &'static str,
    read: impl FnOnce(&[u8]) -> Result<R, ChannelError>,
) -> Result<R, ChannelError> {
    let gone = |_| ChannelError::PeerGone(when);
    if !conn.wait_recv(STEP_TIMEOUT).map_err(gone)? {
        return Err(ChannelError::Timeout(when));
    }
    let frame = conn
        .recv()
        .map_err(gone)?
        .ok_or(ChannelError::Timeout(when))?;
    read(frame)
}

/// Sends one frame, waiting (at most [`STEP_TIMEOUT`]) while the peer's slots are full.
fn send_frame<T: Transport>(
    conn: &mut T,
    frame: &[u8],
    when: &'static str,
) -> Result<(), ChannelError> {
    let deadline = Instant::now() + STEP_TIMEOUT;
    loop {
        match conn.send(frame) {
            Ok(()) => return Ok(()),
            Err(urom_core::transport::FrameSendError::Full) if Instant::now() < deadline => {
                conn.wait_send(TICK)
                    .map_err(|_| ChannelError::PeerGone(when))?;
            }
            Err(urom_core::transport::FrameSendError::Full) => {
                return Err(ChannelError::Timeout(when));
            }
            Err(_) => return Err(ChannelError::PeerGone(when)),
        }
    }
}

fn send_one<T: Transport>(conn: &mut T, message: GpuMessage<'_>) -> Result<(), ChannelError> {
    let mut buf = [0u8; 16];
    let len = message
        .emit(&mut buf, 0)
        .map_err(|_| ChannelError::ConsumerId("cannot encode the message"))?;
    send_frame(conn, &buf[..len], "during the consumer id exchange")
}

fn exchange_as_server<T: Transport>(
    conn: &mut T,
    index: u32,
    max: u32,
) -> Result<(), ChannelError> {
    send_one(conn, GpuMessage::ConsumerIdRequest { consumer_id: index })?;
    recv_one(
        conn,
        "during the consumer id exchange",
        |frame| match GpuMessage::parse(frame, max as usize) {
            Ok(GpuMessage::ConsumerIdResponse { .. }) => Ok(()),
            _ => Err(ChannelError::ConsumerId(
                "the orchestrator did not answer with exchange_consumer_id_response",
            )),
        },
    )
}

fn exchange_as_orchestrator<T: Transport>(
    conn: &mut T,
    index: u32,
    max: u32,
) -> Result<(), ChannelError> {
    recv_one(
        conn,
        "during the consumer id exchange",
        |frame| match GpuMessage::parse(frame, max as usize) {
            Ok(GpuMessage::ConsumerIdRequest { consumer_id }) if consumer_id == index => Ok(()),
            _ => Err(ChannelError::ConsumerId(
                "the server did not send this thread's exchange_consumer_id_request",
            )),
        },
    )?;
    send_one(conn, GpuMessage::ConsumerIdResponse { consumer_id: index })
}

/// The data connections of a set-up channel, one per data-path thread in thread order, over
/// the transport the channel uses. Each vector holds its transport's own connection type, so
/// that the threads that serve them are compiled for it.
pub enum DataConnections {
    /// Shared memory (server and orchestrator on one machine).
    Shm(Vec<ShmConnection>),
    /// UCX (server and orchestrator on different machines).
    #[cfg(feature = "ucx")]
    Ucx(Vec<urom_core::transport::ucx::UcxConnection>),
}

impl DataConnections {
    /// How many there are.
    pub fn len(&self) -> usize {
        match self {
            Self::Shm(conns) => conns.len(),
            #[cfg(feature = "ucx")]
            Self::Ucx(conns) => conns.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The transport, in words.
    pub fn transport(&self) -> &'static str {
        match self {
            Self::Shm(_) => "shared memory",
            #[cfg(feature = "ucx")]
            Self::Ucx(_) => "UCX",
        }
    }

    /// The connections as [`Channel`]s, whichever the transport: for tools and tests, which
    /// need no code per transport (a `match` per call).
    pub fn into_channels(self) -> Vec<Channel> {
        match self {
            Self::Shm(conns) => conns.into_iter().map(Channel::from).collect(),
            #[cfg(feature = "ucx")]
            Self::Ucx(conns) => conns.into_iter().map(Channel::from).collect(),
        }
    }
}

/// The server's side of a set-up channel.
pub struct ServerChannel {
    /// Shutdown messages and the orchestrator's liveness.
    pub control: Control,
    /// One data connection per data-path thread, in thread order.
    pub data: DataConnections,
    /// What both sides agreed on.
    pub params: ChannelParams,
}

/// The orchestrator's side of a set-up channel.
pub struct OrchestratorChannel {
    /// Shutdown messages and the server's liveness.
    pub control: Control,
    /// One data connection per processor thread, in thread order.
    pub data: DataConnections,
    /// What both sides agreed on (`max_concurrent` is the server's).
    pub params: ChannelParams,
}

/// Connects to the server at `endpoint`, retrying until it listens, `stop` is set or `wait`
/// passes; agrees on `ours` and sets up the data connections.
pub fn connect(
    endpoint: &Endpoint,
    ours: &ChannelParams,
    wait: Duration,
    stop: &AtomicBool,
) -> Result<OrchestratorChannel, ChannelError> {
    match endpoint {
        Endpoint::Local(path) => connect_unix(path, ours, wait, stop),
        #[cfg(feature = "ucx")]
        Endpoint::Ucx(address) => ucx::connect(*address, ours, wait, stop),
        #[cfg(not(feature = "ucx"))]
        Endpoint::Ucx(address) => Err(ChannelError::NoUcx(*address)),
    }
}

fn connect_unix(
    path: &Path,
    ours: &ChannelParams,
    wait: Duration,
    stop: &AtomicBool,
) -> Result<OrchestratorChannel, ChannelError> {
    let deadline = Instant::now() + wait;
    let connect_once = || -> Result<UnixStream, ChannelError> {
        loop {
            match UnixStream::connect(path) {
                Ok(stream) => {
                    stream
                        .set_read_timeout(Some(STEP_TIMEOUT))
                        .map_err(io_error("setsockopt"))?;
                    return Ok(stream);
                }
                Err(source) if Instant::now() >= deadline => {
                    return Err(ChannelError::Connect {
                        path: path.to_owned(),
                        source,
                    });
                }
                Err(_) if stop.load(Ordering::Relaxed) => return Err(ChannelError::Stopped),
                Err(_) => std::thread::sleep(TICK),
            }
        }
    };
    let mut control = connect_once()?;
    let params = orchestrator_hellos(&mut control, ours)?;
    let config = params.channel_config()?;
    let mut data = Vec::with_capacity(params.threads as usize);
    for index in 0..params.threads {
        let mut stream = connect_once()?;
        let announce = DataHelloRepr { thread: index }.to_bytes();
        stream.write_all(&announce).map_err(io_error("write"))?;
        let mut conn = ShmConnection::accept(stream, &config)
            .map_err(|e| ChannelError::DataSetup(e.into()))?;
        exchange_as_orchestrator(&mut conn, index, params.max_message_length)?;
        data.push(conn);
    }
    Ok(OrchestratorChannel {
        control: Control::unix(control)?,
        data: DataConnections::Shm(data),
        params,
    })
}

/// What arrived on the control connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControlEvent {
    /// The peer asks this side to shut down.
    StartShutdown,
    /// The peer finished shutting down.
    ShutdownComplete,
    /// The peer hung up or died.
    Gone,
}

/// The control connection: shutdown messages in either direction, and the peer's liveness.
pub struct Control {
    link: ControlLink,
}

enum ControlLink {
    /// A Unix socket, read into `buf`.
    Unix {
        stream: UnixStream,
        buf: [u8; 16],
        filled: usize,
    },
    /// A UCX connection, one message per frame.
    #[cfg(feature = "ucx")]
    Ucx(urom_core::transport::ucx::UcxConnection),
}

/// What a control message means.
fn control_event(message: Result<GpuMessage<'_>, DecodeError>) -> Option<ControlEvent> {
    match message {
        Ok(GpuMessage::StartShutdown) => Some(ControlEvent::StartShutdown),
        Ok(GpuMessage::ShutdownComplete) => Some(ControlEvent::ShutdownComplete),
        Ok(other) => {
            tracing::warn!(msg_id = ?other.msg_id(), "unexpected control message ignored");
            None
        }
        Err(e) => {
            tracing::error!("malformed control message: {e}");
            Some(ControlEvent::Gone)
        }
    }
}

impl Control {
    fn unix(stream: UnixStream) -> Result<Self, ChannelError> {
        stream
            .set_nonblocking(true)
            .map_err(io_error("fcntl(O_NONBLOCK)"))?;
        Ok(Self {
            link: ControlLink::Unix {
                stream,
                buf: [0; 16],
                filled: 0,
            },
        })
    }

    /// Prepares to sleep until the next control message: the descriptors to poll for reading
    /// (with a timeout: a link may have fewer than two, or none), or `None` when a message or
    /// the peer's end may be there already (call [`Control::poll`] at once).
    pub fn sleep_fds(&mut self) -> Option<[Option<BorrowedFd<'_>>; 2]> {
        match &mut self.link {
            ControlLink::Unix { stream, .. } => {
                let stream: &UnixStream = stream;
                Some([Some(stream.as_fd()), None])
            }
            #[cfg(feature = "ucx")]
            ControlLink::Ucx(conn) => {
                use urom_core::transport::{Armed, FrameReceiver};
                let (_, rx) = conn.split();
                match rx.arm() {
                    Ok(Armed::Armed { .. }) => Some(rx.wake_fds()),
                    Ok(Armed::Unsupported) => Some([None, None]),
                    Ok(Armed::Ready) | Err(_) => None,
                }
            }
        }
    }

    /// Sends `start_shutdown` or `shutdown_complete`; a peer already gone is not an error.
    pub fn send(&mut self, message: GpuMessage<'_>) {
        let mut buf = [0u8; 8];
        let Ok(len) = message.emit(&mut buf, 0) else {
            return;
        };
        match &mut self.link {
            ControlLink::Unix { stream, .. } => {
                let _ = stream.set_nonblocking(false);
                let _ = stream.write_all(&buf[..len]);
                let _ = stream.set_nonblocking(true);
            }
            #[cfg(feature = "ucx")]
            ControlLink::Ucx(conn) => {
                let _ = send_frame(conn, &buf[..len], "control message");
            }
        }
    }

    /// The next control message, if one has arrived. A malformed one counts as the peer
    /// being gone: nothing sane can follow.
    pub fn poll(&mut self) -> Option<ControlEvent> {
        match &mut self.link {
            ControlLink::Unix {
                stream,
                buf,
                filled,
            } => poll_stream(stream, buf, filled),
            #[cfg(feature = "ucx")]
            ControlLink::Ucx(conn) => {
                use urom_core::transport::FrameReceiver;
                conn.split().1.disarm();
                loop {
                    let event = match conn.recv() {
                        Ok(Some(frame)) => control_event(GpuMessage::parse(frame, 0)),
                        Ok(None) => return None,
                        Err(_) => Some(ControlEvent::Gone),
                    };
                    if event.is_some() {
                        return event;
                    }
                }
            }
        }
    }

    /// Waits up to `timeout` for a control message.
    pub fn wait(&mut self, timeout: Duration) -> Option<ControlEvent> {
        if let Some(event) = self.poll() {
            return Some(event);
        }
        match &mut self.link {
            ControlLink::Unix { stream, .. } => {
                use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
                let mut fds = [PollFd::new(stream.as_fd(), PollFlags::POLLIN)];
                let ms = timeout.as_millis().min(u128::from(u16::MAX)) as u16;
                let _ = poll(&mut fds, PollTimeout::from(ms));
            }
            #[cfg(feature = "ucx")]
            ControlLink::Ucx(conn) => {
                let _ = conn.wait_recv(timeout);
            }
        }
        self.poll()
    }
}

/// [`Control::poll`] on a Unix socket: whole messages out of `buf`, more read as needed.
fn poll_stream(
    stream: &mut UnixStream,
    buf: &mut [u8; 16],
    filled: &mut usize,
) -> Option<ControlEvent> {
    loop {
        match urom_wire::gpu::message_length(&buf[..*filled], 0) {
            Ok(Some(len)) if len <= *filled => {
                let event = control_event(GpuMessage::parse(&buf[..len], 0));
                buf.copy_within(len..*filled, 0);
                *filled -= len;
                if event.is_some() {
                    return event;
                }
                continue;
            }
            Ok(Some(len)) if len > buf.len() => return Some(ControlEvent::Gone),
            Ok(_) => {}
            Err(e) => {
                tracing::error!("malformed control message: {e}");
                return Some(ControlEvent::Gone);
            }
        }
        match stream.read(&mut buf[*filled..]) {
            Ok(0) => return Some(ControlEvent::Gone),
            Ok(n) => *filled += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return None,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Some(ControlEvent::Gone),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_paths_follow_the_name() {
        assert_eq!(socket_path("/x/y.sock"), PathBuf::from("/x/y.sock"));
        assert!(
            socket_path("abc")
                .to_string_lossy()
                .ends_with("/gpu-offload-abc.sock")
        );
    }

    #[test]
    fn names_choose_the_transport() {
        assert_eq!(
            Endpoint::parse("abc").unwrap(),
            Endpoint::Local(socket_path("abc"))
        );
        assert_eq!(
            Endpoint::parse("/x/y.sock").unwrap(),
            Endpoint::Local(PathBuf::from("/x/y.sock"))
        );
        let v4 = Endpoint::parse("ucx://192.0.2.1:7000").unwrap();
        assert_eq!(v4, Endpoint::Ucx(SocketAddr::from(([192, 0, 2, 1], 7000))));
        assert_eq!(v4.to_string(), "ucx://192.0.2.1:7000");
        let v6 = Endpoint::parse("ucx://[2001:db8::1]:7000").unwrap();
        assert_eq!(v6.to_string(), "ucx://[2001:db8::1]:7000");
        for bad in [
            "ucx://",
            "ucx://host:7000",
            "ucx://192.0.2.1",
            "ucx://192.0.2.1:70000",
        ] {
            let e = check_name(bad).unwrap_err();
            assert!(e.contains(bad) && e.contains("ucx://IP:PORT"), "{e}");
        }
        assert_eq!(check_name("abc").unwrap(), "abc");
    }

    #[test]
    fn a_hello_of_another_version_is_named_whatever_its_length() {
        let mut newer = ChannelParams {
            threads: 1,
            max_message_length: 64,
            max_concurrent: 8,
        }
        .hello()
        .to_vec();
        newer[11] = 2;
        assert!(matches!(
            ChannelParams::from_hello(&newer),
            Err(ChannelError::Version(2))
        ));
        newer.extend_from_slice(&[0; 8]);
        assert!(matches!(
            ChannelParams::from_hello(&newer),
            Err(ChannelError::Version(2))
        ));
        let e = ChannelError::Version(2).to_string();
        assert!(
            e.contains("version 2") && e.contains("use matching builds"),
            "{e}"
        );
        assert!(matches!(
            ChannelParams::from_hello(b"GPUOFF"),
            Err(ChannelError::NotAPeer)
        ));
    }

    #[test]
    fn hellos_round_trip_and_mismatches_name_both_counts() {
        let server = ChannelParams {
            threads: 2,
            max_message_length: 256,
            max_concurrent: 128,
        };
        assert_eq!(ChannelParams::from_hello(&server.hello()).unwrap(), server);
        let orchestrator = ChannelParams {
            threads: 3,
            ..server
        };
        let e = agree(&server, &orchestrator).unwrap_err().to_string();
        assert!(e.contains("server has 2") && e.contains("-t 3"), "{e}");
        let mut bad = server.hello();
        bad[0] = b'X';
        assert!(matches!(
            ChannelParams::from_hello(&bad),
            Err(ChannelError::NotAPeer)
        ));
    }

    #[test]
    fn data_connections_have_room_for_every_request_in_flight() {
        let params = ChannelParams {
            threads: 1,
            max_message_length: 0,
            max_concurrent: 100,
        };
        let config = params.channel_config().unwrap();
        assert_eq!(config.slots, 32);
        assert_eq!(config.max_msg_size.as_u32() as usize, BATCH_BYTES);
        let long = ChannelParams {
            max_message_length: 100_000,
            max_concurrent: 1,
            ..params
        };
        let config = long.channel_config().unwrap();
        assert_eq!(config.slots, 2);
        assert_eq!(config.max_msg_size.as_u32(), 100_012);
        let huge = ChannelParams {
            max_message_length: u32::MAX,
            ..params
        };
        assert!(matches!(
            huge.channel_config(),
            Err(ChannelError::MessageTooLong { .. })
        ));
    }
}
