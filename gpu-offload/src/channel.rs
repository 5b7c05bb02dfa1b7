//! The channel between the server and the orchestrator: where DOCA Comch ran in the original,
//! here a Unix socket for control and one urom shared-memory connection per server data-path
//! thread.
//!
//! Setup, the server listening on [`socket_path`] and the orchestrator connecting:
//!
//! 1. control connection: each side sends a hello (`urom_wire::gpu::channel::ChannelHello`:
//!    version, data-path threads, `--max-message-length`, `--max-concurrent-messages`); a
//!    different thread count or message length is refused, with the same clear error on both
//!    sides;
//! 2. one data connection per thread, in thread order: the orchestrator sends a data hello
//!    (`urom_wire::gpu::channel::DataHello`: the thread index), the server creates the shared mapping on it
//!    ([`Channel::offer`]), then sends the GPU wire's `exchange_consumer_id_request`
//!    with its thread index and the orchestrator answers with the
//!    `exchange_consumer_id_response` of the processor that serves that thread;
//! 3. the control connection then carries `start_shutdown` and `shutdown_complete` (the GPU
//!    wire's messages) in either direction; its hang-up tells each side that the other died.
//!
//! A data frame carries one or more whole `client_request` messages of one client, byte for
//! byte as the client sent them, concatenated (at most [`BATCH_BYTES`], or one message when a
//! message is longer): a pipelining client's requests cross in one frame. The answer to a frame
//! is one frame holding the `client_response` of each of its requests, in order, and the
//! orchestrator answers a connection's frames in the order they came. Each connection has a
//! power of two of slots in each direction, at least `--max-concurrent-messages` (up to 1024),
//! so the server, which never has more messages than that in flight per thread, rarely finds
//! a ring full (and waits when it does).

use std::fmt;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use urom_core::transport::shm::HugePages;
use urom_core::transport::{Channel, ChannelConfig, ConnectError};
use urom_core::transport::{Transport, WaitMode};
use urom_wire::DecodeError;
use urom_wire::MaxMsgSize;
use urom_wire::gpu::channel::{
    CHANNEL_HELLO_LEN, CHANNEL_VERSION, ChannelHelloRepr, DATA_HELLO_LEN, DataHelloRepr,
};
use urom_wire::gpu::{CLIENT_HEADER_LEN, GpuMessage};

use crate::limits::{self, BATCH_BYTES};
use urom_core::transport::shm::MAX_MAPPING_LEN;

/// The channel name used when `-c/--comch-channel-name` is not given.
pub const DEFAULT_CHANNEL_NAME: &str = "dpu_gpu_remote_offload";

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
                max_concurrent: self.max_concurrent,
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

    fn from_hello(hello: &[u8; CHANNEL_HELLO_LEN]) -> Result<Self, ChannelError> {
        match ChannelHelloRepr::parse(hello) {
            Ok(hello) => Ok(Self {
                threads: hello.threads,
                max_message_length: hello.max_message_length,
                max_concurrent: hello.max_concurrent,
            }),
            Err(DecodeError::UnsupportedFormatVersion { found, .. }) => {
                Err(ChannelError::Version(found))
            }
            Err(_) => Err(ChannelError::NotAPeer),
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
    /// `--max-message-length` gives frames larger than the transport carries, or data
    /// connections larger than it maps, with `--max-concurrent-messages`.
    MessageTooLong {
        /// The `--max-message-length`.
        len: u32,
        /// The `--max-concurrent-messages`.
        max_concurrent: u32,
    },
    /// A data connection could not be set up.
    DataSetup(ConnectError),
    /// The peer broke the consumer-id exchange.
    ConsumerId(&'static str),
    /// A stop signal arrived during setup.
    Stopped,
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
            Self::MessageTooLong {
                len,
                max_concurrent,
            } => {
                write!(
                    f,
                    "--max-message-length {len} is too long: with --max-concurrent-messages \
                     {max_concurrent} it can be at most {} (payload bytes, headers excluded)",
                    limits::max_message_length_for(*max_concurrent)
                )?;
                if limits::max_message_length_for(*max_concurrent) < limits::MAX_MESSAGE_LENGTH {
                    let fewer = (1..=*max_concurrent)
                        .rev()
                        .find(|&n| limits::max_message_length_for(n) >= *len)
                        .filter(|_| *len <= limits::MAX_MESSAGE_LENGTH);
                    if let Some(fewer) = fewer {
                        write!(f, ", or {len} with --max-concurrent-messages {fewer}")?;
                    }
                }
                f.write_str(
                    "; each data connection maps one frame slot per request in flight each \
                     way, at most 2 GiB",
                )
            }
            Self::DataSetup(e) => write!(f, "data channel setup failed: {e}"),
            Self::ConsumerId(what) => write!(f, "consumer id exchange failed: {what}"),
            Self::Stopped => f.write_str("stopped by a signal during channel setup"),
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

/// The server's end of the channel before the orchestrator connected. Removes its socket
/// when dropped.
pub struct ChannelListener {
    listener: UnixListener,
    path: PathBuf,
}

impl ChannelListener {
    /// Listens on `path`; a stale socket left by a dead server is replaced, a live one is an
    /// error.
    pub fn bind(path: &Path) -> Result<Self, ChannelError> {
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
            listener,
            path: path.to_owned(),
        })
    }

    /// The socket.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn accept_one(
        &self,
        stop: &AtomicBool,
        deadline: Option<Instant>,
        what: &'static str,
    ) -> Result<UnixStream, ChannelError> {
        wait_readable(self.listener.as_fd(), stop, deadline, what)?;
        let (stream, _) = self.listener.accept().map_err(io_error("accept"))?;
        stream
            .set_read_timeout(Some(STEP_TIMEOUT))
            .map_err(io_error("setsockopt"))?;
        Ok(stream)
    }

    /// Waits for the orchestrator (until `stop`), agrees on `ours`, and sets up one data
    /// connection per thread.
    pub fn accept(
        &self,
        ours: &ChannelParams,
        stop: &AtomicBool,
    ) -> Result<ServerChannel, ChannelError> {
        let mut control = self.accept_one(stop, None, "waiting for the orchestrator")?;
        let mut hello = [0u8; CHANNEL_HELLO_LEN];
        read_exact_or_gone(&mut control, &mut hello, "before its hello")?;
        let theirs = ChannelParams::from_hello(&hello)?;
        control
            .write_all(&ours.hello())
            .map_err(io_error("write"))?;
        agree(ours, &theirs)?;
        let config = ours.channel_config()?;
        let deadline = Instant::now() + STEP_TIMEOUT;
        let mut data = Vec::with_capacity(ours.threads as usize);
        for index in 0..ours.threads {
            let mut stream = self.accept_one(stop, Some(deadline), "data connections")?;
            let mut announce = [0u8; DATA_HELLO_LEN];
            read_exact_or_gone(
                &mut stream,
                &mut announce,
                "before announcing a data connection",
            )?;
            if DataHelloRepr::parse(&announce) != Ok(DataHelloRepr { thread: index }) {
                return Err(ChannelError::NotAPeer);
            }
            let mut conn = Channel::offer(stream, &config).map_err(ChannelError::DataSetup)?;
            exchange_as_server(&mut conn, index, ours.max_message_length)?;
            data.push(conn);
        }
        Ok(ServerChannel {
            control: Control::new(control)?,
            data,
            params: *ours,
        })
    }
}

impl Drop for ChannelListener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Receives one frame within [`STEP_TIMEOUT`] and hands it to `read`.
fn recv_one<T>(
    conn: &mut Channel,
    read: impl FnOnce(&[u8]) -> Result<T, ChannelError>,
) -> Result<T, ChannelError> {
    let gone = |_| ChannelError::PeerGone("during the consumer id exchange");
    if !conn.wait_recv(STEP_TIMEOUT).map_err(gone)? {
        return Err(ChannelError::Timeout("consumer id exchange"));
    }
    let frame = conn
        .recv()
        .map_err(gone)?
        .ok_or(ChannelError::ConsumerId("frame announced but missing"))?;
    read(frame)
}

fn send_one(conn: &mut Channel, message: GpuMessage<'_>) -> Result<(), ChannelError> {
    let mut buf = [0u8; 16];
    let len = message
        .emit(&mut buf, 0)
        .map_err(|_| ChannelError::ConsumerId("cannot encode the message"))?;
    conn.send(&buf[..len])
        .map_err(|_| ChannelError::PeerGone("during the consumer id exchange"))
}

fn exchange_as_server(conn: &mut Channel, index: u32, max: u32) -> Result<(), ChannelError> {
    send_one(conn, GpuMessage::ConsumerIdRequest { consumer_id: index })?;
    recv_one(conn, |frame| match GpuMessage::parse(frame, max as usize) {
        Ok(GpuMessage::ConsumerIdResponse { .. }) => Ok(()),
        _ => Err(ChannelError::ConsumerId(
            "the orchestrator did not answer with exchange_consumer_id_response",
        )),
    })
}

/// The server's side of a set-up channel.
pub struct ServerChannel {
    /// Shutdown messages and the orchestrator's liveness.
    pub control: Control,
    /// One data connection per data-path thread, in thread order.
    pub data: Vec<Channel>,
    /// What both sides agreed on.
    pub params: ChannelParams,
}

/// The orchestrator's side of a set-up channel.
pub struct OrchestratorChannel {
    /// Shutdown messages and the server's liveness.
    pub control: Control,
    /// One data connection per processor thread, in thread order.
    pub data: Vec<Channel>,
    /// What both sides agreed on (`max_concurrent` is the server's).
    pub params: ChannelParams,
}

/// Connects to the server at `path`, retrying until it listens, `stop` is set or `wait`
/// passes; agrees on `ours` and sets up the data connections.
pub fn connect(
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
    control
        .write_all(&ours.hello())
        .map_err(io_error("write"))?;
    let mut hello = [0u8; CHANNEL_HELLO_LEN];
    read_exact_or_gone(&mut control, &mut hello, "before its hello")?;
    let server = ChannelParams::from_hello(&hello)?;
    agree(&server, ours)?;
    let params = ChannelParams {
        max_concurrent: server.max_concurrent,
        ..*ours
    };
    let config = params.channel_config()?;
    let mut data = Vec::with_capacity(params.threads as usize);
    for index in 0..params.threads {
        let mut stream = connect_once()?;
        let announce = DataHelloRepr { thread: index }.to_bytes();
        stream.write_all(&announce).map_err(io_error("write"))?;
        let mut conn = Channel::accept(stream, &config).map_err(ChannelError::DataSetup)?;
        let max = params.max_message_length as usize;
        recv_one(&mut conn, |frame| match GpuMessage::parse(frame, max) {
            Ok(GpuMessage::ConsumerIdRequest { consumer_id }) if consumer_id == index => Ok(()),
            _ => Err(ChannelError::ConsumerId(
                "the server did not send this thread's exchange_consumer_id_request",
            )),
        })?;
        send_one(
            &mut conn,
            GpuMessage::ConsumerIdResponse { consumer_id: index },
        )?;
        data.push(conn);
    }
    Ok(OrchestratorChannel {
        control: Control::new(control)?,
        data,
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
    stream: UnixStream,
    buf: [u8; 16],
    filled: usize,
}

impl Control {
    fn new(stream: UnixStream) -> Result<Self, ChannelError> {
        stream
            .set_nonblocking(true)
            .map_err(io_error("fcntl(O_NONBLOCK)"))?;
        Ok(Self {
            stream,
            buf: [0; 16],
            filled: 0,
        })
    }

    /// The socket, to wait on with `poll`.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.stream.as_fd()
    }

    /// Sends `start_shutdown` or `shutdown_complete`; a peer already gone is not an error.
    pub fn send(&mut self, message: GpuMessage<'_>) {
        let mut buf = [0u8; 8];
        if let Ok(len) = message.emit(&mut buf, 0) {
            let _ = self.stream.set_nonblocking(false);
            let _ = self.stream.write_all(&buf[..len]);
            let _ = self.stream.set_nonblocking(true);
        }
    }

    /// The next control message, if one has arrived. A malformed one counts as the peer
    /// being gone: nothing sane can follow.
    pub fn poll(&mut self) -> Option<ControlEvent> {
        loop {
            match urom_wire::gpu::message_length(&self.buf[..self.filled], 0) {
                Ok(Some(len)) if len <= self.filled => {
                    let event = match GpuMessage::parse(&self.buf[..len], 0) {
                        Ok(GpuMessage::StartShutdown) => Some(ControlEvent::StartShutdown),
                        Ok(GpuMessage::ShutdownComplete) => Some(ControlEvent::ShutdownComplete),
                        Ok(other) => {
                            tracing::warn!(msg_id = ?other.msg_id(), "unexpected control message ignored");
                            None
                        }
                        Err(_) => Some(ControlEvent::Gone),
                    };
                    self.buf.copy_within(len..self.filled, 0);
                    self.filled -= len;
                    if event.is_some() {
                        return event;
                    }
                    continue;
                }
                Ok(Some(len)) if len > self.buf.len() => return Some(ControlEvent::Gone),
                Ok(_) => {}
                Err(e) => {
                    tracing::error!("malformed control message: {e}");
                    return Some(ControlEvent::Gone);
                }
            }
            match self.stream.read(&mut self.buf[self.filled..]) {
                Ok(0) => return Some(ControlEvent::Gone),
                Ok(n) => self.filled += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return None,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Some(ControlEvent::Gone),
            }
        }
    }

    /// Waits up to `timeout` for a control message.
    pub fn wait(&mut self, timeout: Duration) -> Option<ControlEvent> {
        if let Some(event) = self.poll() {
            return Some(event);
        }
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let mut fds = [PollFd::new(self.stream.as_fd(), PollFlags::POLLIN)];
        let ms = timeout.as_millis().min(u128::from(u16::MAX)) as u16;
        let _ = poll(&mut fds, PollTimeout::from(ms));
        self.poll()
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
        assert_eq!(config.slots, 128);
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
