//! The graph plugin's messages, shared by the plugin (`plugins/graph`) and hosts.
//!
//! The graph plugin is the loopback sample of the DOCA UROM guide: a 16-byte command
//! `{type, data}` comes back as a 16-byte notification `{type, data}` with the same data. Both
//! are two little-endian `u64`s.

use core::fmt;

use crate::wire::Status;

/// The plugin's name, as the daemon reports it (its file is `worker_graph.so`).
pub const NAME: &str = "worker_graph";
/// The plugin's version; hosts refuse a plugin of another version.
pub const VERSION: u64 = 0x01;
/// Length of a packed command and of a packed notification.
pub const MESSAGE_LEN: usize = 16;

/// `UROM_WORKER_CMD_GRAPH_LOOPBACK`.
const CMD_LOOPBACK: u64 = 0;
/// `UROM_WORKER_NOTIFY_GRAPH_LOOPBACK`.
const NOTIFY_LOOPBACK: u64 = 0;

/// A command for the graph plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraphCommand {
    /// Send `data` back.
    Loopback {
        /// The value to return.
        data: u64,
    },
}

/// A notification from the graph plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraphNotification {
    /// The answer to [`GraphCommand::Loopback`].
    Loopback {
        /// The value the command carried.
        data: u64,
    },
}

/// Why graph bytes or a graph plugin were refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraphError {
    /// The message is not 16 bytes.
    BadLength(usize),
    /// The message type is not one the graph plugin defines.
    UnknownType(u64),
    /// The buffer to pack into is shorter than 16 bytes.
    BufferTooSmall(usize),
    /// The service's graph plugin has another version than this host's.
    VersionMismatch {
        /// The version the service reported.
        found: u64,
    },
}

impl fmt::Display for GraphError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::BadLength(len) => {
                write!(f, "graph message of {len} bytes; it must be {MESSAGE_LEN}")
            }
            Self::UnknownType(kind) => write!(f, "unknown graph message type {kind}"),
            Self::BufferTooSmall(len) => {
                write!(
                    f,
                    "buffer of {len} bytes cannot hold a {MESSAGE_LEN}-byte graph message"
                )
            }
            Self::VersionMismatch { found } => write!(
                f,
                "the service's graph plugin has version {found:#x}, this host speaks {VERSION:#x}"
            ),
        }
    }
}

impl std::error::Error for GraphError {}

impl From<GraphError> for Status {
    fn from(_: GraphError) -> Self {
        Status::InvalidValue
    }
}

/// `Ok` when the service's graph plugin speaks this host's version.
pub fn check_version(found: u64) -> Result<(), GraphError> {
    if found == VERSION {
        Ok(())
    } else {
        Err(GraphError::VersionMismatch { found })
    }
}

fn pack(kind: u64, data: u64, buf: &mut [u8]) -> Result<usize, GraphError> {
    let available = buf.len();
    let out = buf
        .get_mut(..MESSAGE_LEN)
        .ok_or(GraphError::BufferTooSmall(available))?;
    out[..8].copy_from_slice(&kind.to_le_bytes());
    out[8..].copy_from_slice(&data.to_le_bytes());
    Ok(MESSAGE_LEN)
}

fn unpack(bytes: &[u8]) -> Result<(u64, u64), GraphError> {
    let message: &[u8; MESSAGE_LEN] = bytes
        .try_into()
        .map_err(|_| GraphError::BadLength(bytes.len()))?;
    let (kind, data) = message.split_at(8);
    let word = |half: &[u8]| u64::from_le_bytes(half.try_into().expect("8 bytes"));
    Ok((word(kind), word(data)))
}

impl GraphCommand {
    /// Packs the command into the start of `buf`; returns its length.
    pub fn pack(&self, buf: &mut [u8]) -> Result<usize, GraphError> {
        match *self {
            Self::Loopback { data } => pack(CMD_LOOPBACK, data, buf),
        }
    }

    /// Reads a packed command.
    pub fn unpack(bytes: &[u8]) -> Result<Self, GraphError> {
        match unpack(bytes)? {
            (CMD_LOOPBACK, data) => Ok(Self::Loopback { data }),
            (kind, _) => Err(GraphError::UnknownType(kind)),
        }
    }
}

impl GraphNotification {
    /// Packs the notification into the start of `buf`; returns its length.
    pub fn pack(&self, buf: &mut [u8]) -> Result<usize, GraphError> {
        match *self {
            Self::Loopback { data } => pack(NOTIFY_LOOPBACK, data, buf),
        }
    }

    /// Reads a packed notification.
    pub fn unpack(bytes: &[u8]) -> Result<Self, GraphError> {
        match unpack(bytes)? {
            (NOTIFY_LOOPBACK, data) => Ok(Self::Loopback { data }),
            (kind, _) => Err(GraphError::UnknownType(kind)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_pack_as_two_little_endian_words() {
        let mut buf = [0xa5; 20];
        assert_eq!(
            GraphCommand::Loopback { data: 0x0102 }.pack(&mut buf),
            Ok(16)
        );
        assert_eq!(
            &buf[..16],
            &[0, 0, 0, 0, 0, 0, 0, 0, 2, 1, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(buf[16], 0xa5);
        assert_eq!(
            GraphCommand::unpack(&buf[..16]),
            Ok(GraphCommand::Loopback { data: 0x0102 })
        );
        assert_eq!(
            GraphNotification::unpack(&buf[..16]),
            Ok(GraphNotification::Loopback { data: 0x0102 })
        );
    }

    #[test]
    fn bad_messages_and_versions_are_refused() {
        assert_eq!(
            GraphCommand::unpack(&[0; 15]),
            Err(GraphError::BadLength(15))
        );
        let mut buf = [0; 16];
        buf[0] = 9;
        assert_eq!(GraphCommand::unpack(&buf), Err(GraphError::UnknownType(9)));
        assert_eq!(
            GraphNotification::Loopback { data: 1 }.pack(&mut [0; 8]),
            Err(GraphError::BufferTooSmall(8))
        );
        assert!(check_version(VERSION).is_ok());
        assert_eq!(
            check_version(2),
            Err(GraphError::VersionMismatch { found: 2 })
        );
    }
}

/// The host side of the graph plugin: `init` once with the id and version the service
/// reported, then submit loopbacks (the DOCA UROM guide's `urom_graph_init` and
/// `urom_graph_task_loopback`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphHost {
    id: u64,
}

/// A finished loopback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoopbackResult {
    /// The data the plugin sent back.
    pub data: u64,
    /// The cookie given when the loopback was submitted.
    pub cookie: u64,
}

impl GraphHost {
    /// The graph plugin with `id`, if the service's `version` is this host's.
    pub fn init(id: u64, version: u64) -> Result<Self, GraphError> {
        check_version(version)?;
        Ok(Self { id })
    }

    /// The plugin id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Sends `data` to the plugin and back; `callback` runs from the worker's progress engine
    /// and reads the outcome with [`loopback_result`]. Allocates nothing.
    pub fn loopback(
        &self,
        worker: &crate::host::Worker<crate::host::Running>,
        cookie: u64,
        data: u64,
        callback: crate::host::TaskCallback,
    ) -> Result<crate::host::TaskHandle, crate::host::CommandError> {
        worker.submit(self.id, |task| {
            task.user_data_mut()[..8].copy_from_slice(&cookie.to_le_bytes());
            task.set_callback(callback);
            GraphCommand::Loopback { data }
                .pack(task.payload_mut())
                .unwrap_or(0)
        })
    }
}

/// The outcome of a loopback task: the data and cookie, or the status it failed with.
pub fn loopback_result(task: &crate::host::CompletedTask<'_>) -> Result<LoopbackResult, Status> {
    task.status.into_result()?;
    let cookie = u64::from_le_bytes(task.user_data[..8].try_into().expect("8 bytes"));
    match GraphNotification::unpack(task.response) {
        Ok(GraphNotification::Loopback { data }) => Ok(LoopbackResult { data, cookie }),
        Err(_) => Err(Status::InvalidValue),
    }
}
