//! The channel on one machine: control over a Unix socket, data over urom shared memory (the
//! server creates each mapping, the orchestrator maps it).

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use urom_transport::shm::ShmConnection;
use urom_wire::gpu::channel::{DATA_HELLO_LEN, DataHelloRepr};

use super::connections::{DataConnections, OrchestratorChannel, ServerChannel};
use super::control::Control;
use super::error::{ChannelError, io_error};
use super::params::{ChannelParams, STEP_TIMEOUT, TICK};
use super::setup::{
    SetupLink, check_data_hello, exchange_as_orchestrator, exchange_as_server, orchestrator_hellos,
    server_hellos,
};

/// The server's Unix socket, before the orchestrator connected. Its file is removed when it is
/// dropped.
pub(super) struct Listener {
    listener: UnixListener,
    path: PathBuf,
}

impl Listener {
    /// Listens on `path`; a stale socket left by a dead server is replaced, a live one is an
    /// error.
    pub(super) fn bind(path: &Path) -> Result<Self, ChannelError> {
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
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// Waits for the orchestrator (until `stop`), agrees on `ours`, and sets up one data
    /// connection per thread.
    pub(super) fn accept(
        &self,
        ours: &ChannelParams,
        stop: &AtomicBool,
    ) -> Result<ServerChannel, ChannelError> {
        let control = accept_one(&self.listener, stop, None, "waiting for the orchestrator")?;
        self.set_up(control, ours, stop)
    }

    /// As [`Self::accept`] if an orchestrator is connecting now; `Ok(None)` at once if none.
    pub(super) fn try_accept(
        &self,
        ours: &ChannelParams,
        stop: &AtomicBool,
    ) -> Result<Option<ServerChannel>, ChannelError> {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let mut fds = [PollFd::new(self.listener.as_fd(), PollFlags::POLLIN)];
        if !matches!(poll(&mut fds, PollTimeout::ZERO), Ok(1)) {
            return Ok(None);
        }
        let control = accept_one(&self.listener, stop, None, "waiting for the orchestrator")?;
        self.set_up(control, ours, stop).map(Some)
    }

    /// The setup after the orchestrator's control connection came.
    fn set_up(
        &self,
        mut control: UnixStream,
        ours: &ChannelParams,
        stop: &AtomicBool,
    ) -> Result<ServerChannel, ChannelError> {
        let params = server_hellos(&mut control, ours)?;
        let config = params.channel_config()?;
        let deadline = Instant::now() + STEP_TIMEOUT;
        let mut data = Vec::with_capacity(params.threads as usize);
        for index in 0..params.threads {
            let mut stream = accept_one(&self.listener, stop, Some(deadline), "data connections")?;
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
}

impl Listener {
    /// Answers every orchestrator waiting to connect with a busy hello and hangs up, without
    /// waiting: this server has one.
    pub(super) fn refuse_waiting(&self, ours: &ChannelParams) {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        loop {
            let mut fds = [PollFd::new(self.listener.as_fd(), PollFlags::POLLIN)];
            if !matches!(poll(&mut fds, PollTimeout::ZERO), Ok(1)) {
                return;
            }
            let Ok((mut stream, _)) = self.listener.accept() else {
                return;
            };
            let _ = stream.set_write_timeout(Some(TICK));
            let _ = stream.write_all(&ours.busy_hello());
            tracing::warn!(
                "another orchestrator connected; told it that this server already has one"
            );
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The next connection on `listener`, waiting until `stop` is set or `deadline` passes; its
/// reads time out after [`STEP_TIMEOUT`].
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

/// Connects to the server's socket at `path`, retrying until it listens, `stop` is set or
/// `wait` passes; agrees on `ours` and sets up the data connections.
pub(super) fn connect(
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

/// Fills `buf` from `stream`; a peer that hangs up or stays silent is named with `when`.
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
