//! The channel between the server and the orchestrator: where DOCA Comch ran in the original,
//! here one control connection and one data connection per server data-path thread, over one
//! of two transports, chosen by the `-c` name both sides are given ([`Endpoint`]):
//!
//! * a name (or a path): the two run on one machine; control is a Unix socket
//!   ([`socket_path`]), data connections are urom shared memory
//!   ([`ShmConnection`](urom_transport::shm::ShmConnection));
//! * `ucx://IP:PORT` (build feature `ucx`): the two run on different machines; the server
//!   listens for UCX connections on that address, the orchestrator connects to it; control and
//!   data connections are urom UCX connections (`urom_transport::ucx`), over whatever
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
//! byte as the client sent them, concatenated (at most [`BATCH_BYTES`](crate::limits::BATCH_BYTES), or one message when a
//! message is longer): a pipelining client's requests cross in one frame. The answer to a frame
//! is one frame holding the `client_response` of each of its requests, in order, and the
//! orchestrator answers a connection's frames in the order they came. Each connection has
//! `--max-concurrent-messages` slots in each direction, rounded up to a power of two, at most
//! [`MAX_CHANNEL_SLOTS`](crate::limits::MAX_CHANNEL_SLOTS): frames hold many requests, so the server
//! rarely finds a ring full, and a client whose frame finds it full waits for a slot.
//!
//! The files, bottom up: `error` (every failure), `name` ([`Endpoint`]), `params`
//! ([`ChannelParams`], the hellos' content), `setup` (the steps every transport shares),
//! `control` ([`Control`]), `connections` (a set-up channel), then one file per transport,
//! `local` (Unix socket and shared memory) and `ucx`; this one chooses between them.

mod connections;
mod control;
mod error;
mod local;
mod name;
mod params;
mod setup;
#[cfg(feature = "ucx")]
mod ucx;

use std::sync::atomic::AtomicBool;
use std::time::Duration;

pub use connections::{DataConnections, OrchestratorChannel, ServerChannel};
pub use control::{Control, ControlEvent};
pub use error::{ChannelError, ListenCause};
pub use name::{DEFAULT_CHANNEL_NAME, Endpoint, UCX_SCHEME, check_name, socket_path};
pub use params::{ChannelParams, TICK};
#[cfg(feature = "ucx")]
pub use ucx::control_config as ucx_control_config;

/// The server's end of the channel before the orchestrator connected. A Unix socket's file is
/// removed when it is dropped.
pub struct ChannelListener {
    kind: ListenerKind,
}

enum ListenerKind {
    Unix(local::Listener),
    #[cfg(feature = "ucx")]
    Ucx(ucx::Listener),
}

impl ChannelListener {
    /// Listens where `endpoint` says: on its Unix socket (a stale socket left by a dead server
    /// is replaced, a live one is an error), or for UCX connections on its address.
    pub fn bind(endpoint: &Endpoint) -> Result<Self, ChannelError> {
        let kind = match endpoint {
            Endpoint::Local(path) => ListenerKind::Unix(local::Listener::bind(path)?),
            #[cfg(feature = "ucx")]
            Endpoint::Ucx(address) => ListenerKind::Ucx(ucx::Listener::bind(*address)?),
            #[cfg(not(feature = "ucx"))]
            Endpoint::Ucx(address) => return Err(ChannelError::NoUcx(*address)),
        };
        Ok(Self { kind })
    }

    /// Where it listens (a UCX listener's real port when asked for port 0): what the
    /// orchestrator's `-c` must name.
    pub fn endpoint(&self) -> Endpoint {
        match &self.kind {
            ListenerKind::Unix(listener) => Endpoint::Local(listener.path().to_owned()),
            #[cfg(feature = "ucx")]
            ListenerKind::Ucx(listener) => Endpoint::Ucx(listener.local_addr()),
        }
    }

    /// Answers any orchestrator that connects while this server has one, without waiting:
    /// it gets a hello that says so, and gives up with [`ChannelError::ServerBusy`].
    pub fn refuse_waiting(&mut self, ours: &ChannelParams) {
        match &mut self.kind {
            ListenerKind::Unix(listener) => listener.refuse_waiting(ours),
            #[cfg(feature = "ucx")]
            ListenerKind::Ucx(listener) => listener.refuse_waiting(ours),
        }
    }

    /// As [`Self::accept`] if an orchestrator is connecting now (a new one, after the last
    /// went away); `Ok(None)` at once if none is.
    pub fn try_accept(
        &mut self,
        ours: &ChannelParams,
        stop: &AtomicBool,
    ) -> Result<Option<ServerChannel>, ChannelError> {
        match &mut self.kind {
            ListenerKind::Unix(listener) => listener.try_accept(ours, stop),
            #[cfg(feature = "ucx")]
            ListenerKind::Ucx(listener) => listener.try_accept(ours, stop),
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
            ListenerKind::Unix(listener) => listener.accept(ours, stop),
            #[cfg(feature = "ucx")]
            ListenerKind::Ucx(listener) => listener.accept(ours, stop),
        }
    }
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
        Endpoint::Local(path) => local::connect(path, ours, wait, stop),
        #[cfg(feature = "ucx")]
        Endpoint::Ucx(address) => ucx::connect(*address, ours, wait, stop),
        #[cfg(not(feature = "ucx"))]
        Endpoint::Ucx(address) => Err(ChannelError::NoUcx(*address)),
    }
}
