//! A set-up channel as each side holds it: the control connection, the data connections (one
//! vector per transport) and what both sides agreed on.

use urom_transport::Channel;
use urom_transport::shm::ShmConnection;

use super::control::Control;
use super::params::ChannelParams;

/// The data connections of a set-up channel, one per data-path thread in thread order, over
/// the transport the channel uses. Each vector holds its transport's own connection type, so
/// that the threads that serve them are compiled for it.
pub enum DataConnections {
    /// Shared memory (server and orchestrator on one machine).
    Shm(Vec<ShmConnection>),
    /// UCX (server and orchestrator on different machines).
    #[cfg(feature = "ucx")]
    Ucx(Vec<urom_transport::ucx::UcxConnection>),
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
