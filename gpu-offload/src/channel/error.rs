//! Why the channel could not be set up or broke: one error for every step, each naming what
//! the operator can do, and the OS's or the transport's error as its source.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;

use urom_transport::ConnectError;
use urom_wire::gpu::channel::CHANNEL_VERSION;

use crate::limits::MAX_MESSAGE_LENGTH;

/// Why the channel could not be set up or broke.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    /// The server could not listen on the channel's socket.
    #[error("cannot listen on channel socket {}: {source}", .path.display())]
    Bind {
        /// The socket.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
    /// Another server already listens on the socket.
    #[error(
        "another server already listens on channel socket {} (choose another -c name)",
        .0.display()
    )]
    InUse(PathBuf),
    /// The orchestrator found no server listening on the socket in time.
    #[error(
        "no server on channel socket {}: {source} (start the server first, with the same -c \
         name)",
        .path.display()
    )]
    Connect {
        /// The socket.
        path: PathBuf,
        /// What the OS said last.
        source: io::Error,
    },
    /// A read or write on a channel socket failed.
    #[error("channel {op} failed: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// What the OS said.
        source: io::Error,
    },
    /// The server already serves an orchestrator (it answered with a busy hello).
    #[error(
        "the server on this channel already has an orchestrator (a server serves one): stop that \
         one first, or start this one with the -c of another server"
    )]
    ServerBusy,
    /// The peer did not answer in time.
    #[error("channel setup timed out: {0}")]
    Timeout(&'static str),
    /// The peer hung up during setup.
    #[error("the peer hung up {0}")]
    PeerGone(&'static str),
    /// What connected is not a gpu-offload server or orchestrator.
    #[error("the peer on the channel socket is not a gpu-offload server or orchestrator")]
    NotAPeer,
    /// The peer speaks another version of this setup.
    #[error(
        "the peer speaks channel version {0}, this program {CHANNEL_VERSION}: use matching builds"
    )]
    Version(u32),
    /// The two sides run different numbers of data-path threads.
    #[error(
        "thread count mismatch: the server has {server} data-path threads (--cpu given {server} \
         times) but the orchestrator runs {orchestrator} (-t {orchestrator}); start both with \
         the same count"
    )]
    ThreadCountMismatch {
        /// The server's `--cpu` count.
        server: u32,
        /// The orchestrator's `-t/--num-gpu-threads`.
        orchestrator: u32,
    },
    /// The two sides allow different message lengths.
    #[error(
        "message length mismatch: the server allows {server} bytes (--max-message-length \
         {server}), the orchestrator {orchestrator}; start both with the same value"
    )]
    MessageLengthMismatch {
        /// The server's `--max-message-length`.
        server: u32,
        /// The orchestrator's `--max-message-length`.
        orchestrator: u32,
    },
    /// `--max-message-length` (from a peer's hello: the parser refuses it) gives frames
    /// larger than the transport carries.
    #[error(
        "--max-message-length {len} is too long: a frame carries at most {MAX_MESSAGE_LENGTH} \
         payload bytes (headers excluded)"
    )]
    MessageTooLong {
        /// The `--max-message-length`.
        len: u32,
    },
    /// A data connection could not be set up.
    #[error("data channel setup failed: {0}")]
    DataSetup(#[source] ConnectError),
    /// The peer broke the consumer-id exchange.
    #[error("consumer id exchange failed: {0}")]
    ConsumerId(&'static str),
    /// A stop signal arrived during setup.
    #[error("stopped by a signal during channel setup")]
    Stopped,
    /// A `-c` name that starts like a UCX address but is not one.
    #[error(
        "channel name {0}: a UCX channel is ucx://IP:PORT, for example ucx://192.0.2.1:7000 or \
         ucx://[2001:db8::1]:7000"
    )]
    BadName(String),
    /// `-c ucx://...` in a build without UCX.
    #[error(
        "-c ucx://{0}: this build has no UCX; rebuild gpu-offload with `--features ucx` (or run \
         server and orchestrator on one machine with a channel name)"
    )]
    NoUcx(SocketAddr),
    /// The server could not listen for UCX connections.
    #[error("channel ucx://{address}: cannot listen for the orchestrator: {source}{cause}")]
    ListenUcx {
        /// The address.
        address: SocketAddr,
        /// What UCX said.
        source: ConnectError,
        /// What a probe of the address found.
        cause: ListenCause,
    },
    /// The orchestrator's UCX connection to the server's listener failed.
    #[error("the orchestrator's UCX connection failed: {0}")]
    AcceptUcx(#[source] ConnectError),
    /// The orchestrator could not reach a server over UCX (in time).
    #[error(
        "no server on channel ucx://{address} (start the server first, with the same -c, an \
         address of its machine that this one reaches): {source}"
    )]
    ConnectUcx {
        /// The address.
        address: SocketAddr,
        /// What UCX said last.
        source: ConnectError,
    },
}

/// A closure for `map_err` that names the failed operation `op`.
pub(super) fn io_error(op: &'static str) -> impl FnOnce(io::Error) -> ChannelError {
    move |source| ChannelError::Io { op, source }
}

#[cfg(test)]
mod tests {
    use std::error::Error;

    use super::*;

    #[test]
    fn os_errors_stay_the_source_and_in_the_message() {
        let e = io_error("write")(io::Error::from(io::ErrorKind::BrokenPipe));
        let source = e.source().expect("the io::Error is the source");
        assert_eq!(
            source.downcast_ref::<io::Error>().map(io::Error::kind),
            Some(io::ErrorKind::BrokenPipe)
        );
        assert_eq!(e.to_string(), format!("channel write failed: {source}"));
        assert!(ChannelError::Stopped.source().is_none());
    }
}

/// Why an address cannot be listened on, as a probe with a socket of our own finds it after
/// UCX failed (UCX says only "Device is busy" or "Invalid address").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListenCause {
    /// The address is not one of this machine's.
    NotLocal,
    /// Another program listens on that port.
    PortTaken,
    /// Connections of an earlier run still hold the port (TCP TIME-WAIT, or closing), made
    /// without address reuse (`UCX_TCP_CM_REUSEADDR=n`, or an older build).
    Lingering,
    /// The probe found nothing wrong with the address.
    Unknown,
}

impl std::fmt::Display for ListenCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::NotLocal => " (the address must be one of this machine's, or 0.0.0.0 for all)",
            Self::PortTaken => {
                " (another program listens on that port: is a server with this -c already \
                 running?)"
            }
            Self::Lingering => {
                " (connections of an earlier run still hold the port, in TCP TIME-WAIT for up \
                 to 60 s, and that run or this one did not allow reusing it: wait, or keep \
                 UCX_TCP_CM_REUSEADDR unset or y on every run)"
            }
            Self::Unknown => "",
        })
    }
}
