//! The graph plugin's messages, shared by the plugin (`plugins/graph/worker`) and hosts.
//!
//! The graph plugin is the loopback sample of the DOCA UROM guide: a 16-byte command
//! `{type, data}` comes back as a 16-byte notification `{type, data}` with the same data. They
//! travel as the payload of a data-path command and notification (`urom_wire::data`):
//!
//! ```text
//! command, notification   0 u64 type | 8 u64 data                                = 16
//! ```
//!
//! Both words little-endian. Types: [`CMD_LOOPBACK`] for commands, [`NOTIFY_LOOPBACK`] for
//! notifications. Errors are [`GraphError`], which a plugin returns as
//! [`Status::InvalidValue`].
#![no_std]
#![forbid(unsafe_code)]

use core::fmt;

use static_assertions::assert_eq_size;
use zerocopy::little_endian::U64;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use urom_wire::Status;

/// The plugin's name, as the daemon reports it (its file is `worker_graph.so`).
pub const NAME: &str = "worker_graph";
/// The plugin's version; hosts refuse a plugin of another version.
pub const VERSION: u64 = 0x01;
/// `UROM_WORKER_CMD_GRAPH_LOOPBACK`: the type of a loopback command.
pub const CMD_LOOPBACK: u64 = 0;
/// `UROM_WORKER_NOTIFY_GRAPH_LOOPBACK`: the type of a loopback notification.
pub const NOTIFY_LOOPBACK: u64 = 0;

/// The wire layout of a graph command or notification.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct GraphMessage {
    /// The message type: [`CMD_LOOPBACK`] or [`NOTIFY_LOOPBACK`].
    pub kind: U64,
    /// The message's data.
    pub data: U64,
}
assert_eq_size!(GraphMessage, [u8; 16]);

/// Length of a packed command and of a packed notification.
pub const MESSAGE_LEN: usize = size_of::<GraphMessage>();

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

impl core::error::Error for GraphError {}

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

#[inline]
fn pack(kind: u64, data: u64, buf: &mut [u8]) -> Result<usize, GraphError> {
    let wire = GraphMessage {
        kind: U64::new(kind),
        data: U64::new(data),
    };
    put_whole(buf, &wire).ok_or(GraphError::BufferTooSmall(buf.len()))
}

#[inline]
fn unpack(bytes: &[u8]) -> Result<(u64, u64), GraphError> {
    let wire =
        GraphMessage::ref_from_bytes(bytes).map_err(|_| GraphError::BadLength(bytes.len()))?;
    Ok((wire.kind.get(), wire.data.get()))
}

impl GraphCommand {
    /// Packs the command into the start of `buf`; returns its length.
    #[inline]
    pub fn pack(&self, buf: &mut [u8]) -> Result<usize, GraphError> {
        match *self {
            Self::Loopback { data } => pack(CMD_LOOPBACK, data, buf),
        }
    }

    /// Reads a packed command; `bytes` must hold exactly one.
    #[inline]
    pub fn unpack(bytes: &[u8]) -> Result<Self, GraphError> {
        match unpack(bytes)? {
            (CMD_LOOPBACK, data) => Ok(Self::Loopback { data }),
            (kind, _) => Err(GraphError::UnknownType(kind)),
        }
    }
}

impl GraphNotification {
    /// Packs the notification into the start of `buf`; returns its length.
    #[inline]
    pub fn pack(&self, buf: &mut [u8]) -> Result<usize, GraphError> {
        match *self {
            Self::Loopback { data } => pack(NOTIFY_LOOPBACK, data, buf),
        }
    }

    /// Reads a packed notification; `bytes` must hold exactly one.
    #[inline]
    pub fn unpack(bytes: &[u8]) -> Result<Self, GraphError> {
        match unpack(bytes)? {
            (NOTIFY_LOOPBACK, data) => Ok(Self::Loopback { data }),
            (kind, _) => Err(GraphError::UnknownType(kind)),
        }
    }
}

/// Writes a fixed-size wire struct that is a whole message at the front of `buf`; returns its
/// length, or `None` when `buf` is shorter.
#[inline]
fn put_whole<W: IntoBytes + Immutable>(buf: &mut [u8], wire: &W) -> Option<usize> {
    let out = buf.get_mut(..size_of::<W>())?;
    out.copy_from_slice(wire.as_bytes());
    Some(out.len())
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
