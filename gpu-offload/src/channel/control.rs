//! The control connection once the channel is set up: `start_shutdown` and
//! `shutdown_complete` in either direction ([`ControlEvent`]), and the peer's liveness.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

#[cfg(feature = "ucx")]
use urom_transport::Transport;
use urom_wire::DecodeError;
use urom_wire::gpu::GpuMessage;

use super::error::{ChannelError, io_error};
#[cfg(feature = "ucx")]
use super::setup::send_frame;

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
    Ucx(urom_transport::ucx::UcxConnection),
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
    /// The control connection over a Unix socket (server and orchestrator on one machine).
    pub(super) fn unix(stream: UnixStream) -> Result<Self, ChannelError> {
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

    /// The control connection over UCX (server and orchestrator on different machines).
    #[cfg(feature = "ucx")]
    pub(super) fn ucx(conn: urom_transport::ucx::UcxConnection) -> Self {
        Self {
            link: ControlLink::Ucx(conn),
        }
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
                use urom_transport::{Armed, FrameReceiver};
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
                use urom_transport::FrameReceiver;
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
