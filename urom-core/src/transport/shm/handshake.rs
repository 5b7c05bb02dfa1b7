//! How the two sides agree on a mapping, over a connected Unix stream socket.
//!
//! 1. the creator makes the mapping (see `mapping`) and four eventfds (one for each half of each
//!    side to sleep on), then sends the hello with the memfd and the eventfds attached
//!    (`SCM_RIGHTS`, in the order memfd, ring 0 consumer, ring 0 producer, ring 1 consumer,
//!    ring 1 producer);
//! 2. the acceptor checks the file (seals, size, header) and its maximum message size, maps it
//!    and answers with the ack;
//! 3. both keep the socket open and never write to it again: its hang-up is how each side learns
//!    that the other died.
//!
//! Ring 0 carries frames from the creator to the acceptor, ring 1 the other way.

use core::fmt;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;

use nix::errno::Errno;

use super::layout::{Layout, ShmLayoutError};
use super::mapping::{self, Mapping, OpenError, SysError};
use crate::sys;
use crate::transport::ChannelConfig;

const HELLO: [u8; 8] = *b"UROMHELO";
const ACK: [u8; 8] = *b"UROMACK\0";
const HANDSHAKE_VERSION: u32 = 2;
const STATUS_OK: u32 = 0;
const STATUS_BAD_LAYOUT: u32 = 1;
const STATUS_MAX_MSG_SIZE: u32 = 2;
const STATUS_SYSTEM: u32 = 3;
/// The memfd and the four eventfds.
const HELLO_FDS: usize = 5;

/// Why a shared-memory connection could not be set up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShmConnectError {
    /// A system call failed.
    Sys {
        /// The call.
        op: &'static str,
        /// What the OS said.
        errno: Errno,
    },
    /// The mapping the peer offered is unusable.
    Layout(ShmLayoutError),
    /// The two sides were configured with different maximum message sizes.
    MaxMsgSizeMismatch {
        /// This side's maximum message size.
        ours: u32,
        /// The peer's maximum message size.
        theirs: u32,
    },
    /// The peer does not speak this handshake, hung up, or did not answer in time.
    Handshake(&'static str),
    /// The peer could not use our mapping.
    Refused(&'static str),
}

impl fmt::Display for ShmConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShmConnectError::Sys { op, errno } => {
                write!(f, "shared-memory setup failed in {op}: {errno}")
            }
            ShmConnectError::Layout(e) => write!(f, "peer offered a bad shared mapping: {e}"),
            ShmConnectError::MaxMsgSizeMismatch { ours, theirs } => write!(
                f,
                "maximum message size mismatch: this side uses {ours} bytes, the peer {theirs}; \
                 configure both the same"
            ),
            ShmConnectError::Handshake(what) => write!(f, "shared-memory handshake failed: {what}"),
            ShmConnectError::Refused(what) => write!(f, "peer refused the shared mapping: {what}"),
        }
    }
}

impl core::error::Error for ShmConnectError {}

impl From<SysError> for ShmConnectError {
    fn from(e: SysError) -> Self {
        ShmConnectError::Sys {
            op: e.op,
            errno: e.errno,
        }
    }
}

fn io_err(op: &'static str) -> impl FnOnce(std::io::Error) -> ShmConnectError {
    move |e| ShmConnectError::Sys {
        op,
        errno: Errno::from_raw(e.raw_os_error().unwrap_or(0)),
    }
}

/// The eventfds of a connection, by ring.
pub(super) struct Wakes {
    /// `[ring] = (consumer's, producer's)`.
    pub(super) rings: [(OwnedFd, OwnedFd); 2],
}

/// A mapping both sides agreed on, ready to be split into halves.
pub(super) struct Agreed {
    pub(super) layout: Layout,
    pub(super) mapping: Mapping,
    /// The ring this side sends on (0: creator, 1: acceptor).
    pub(super) side: usize,
    pub(super) wakes: Wakes,
    pub(super) socket: UnixStream,
}

/// A creator's half-done handshake: offer sent, ack not yet received.
pub(super) struct Offered(Agreed);

/// Creates the mapping and the eventfds and offers them to the peer on `stream`.
pub(super) fn offer(
    stream: UnixStream,
    config: &ChannelConfig,
) -> Result<Offered, ShmConnectError> {
    let layout = Layout::new(config.max_msg_size, config.slots).map_err(ShmConnectError::Layout)?;
    let (memfd, mapping) = mapping::create(&layout, config.hugepages)?;
    let event = || {
        sys::wake_event().map_err(|errno| ShmConnectError::Sys {
            op: "eventfd",
            errno,
        })
    };
    let wakes = Wakes {
        rings: [(event()?, event()?), (event()?, event()?)],
    };
    let mut hello = [0u8; 16];
    hello[..8].copy_from_slice(&HELLO);
    hello[8..12].copy_from_slice(&HANDSHAKE_VERSION.to_le_bytes());
    let [(c0, p0), (c1, p1)] = &wakes.rings;
    sys::send_with_fds(
        &stream,
        &hello,
        &[
            memfd.as_fd(),
            c0.as_fd(),
            p0.as_fd(),
            c1.as_fd(),
            p1.as_fd(),
        ],
    )
    .map_err(|errno| match errno {
        Errno::EPIPE | Errno::ECONNRESET => {
            ShmConnectError::Handshake("peer hung up before the offer")
        }
        errno => ShmConnectError::Sys {
            op: "sendmsg",
            errno,
        },
    })?;
    Ok(Offered(Agreed {
        layout,
        mapping,
        side: 0,
        wakes,
        socket: stream,
    }))
}

impl Offered {
    /// Waits for the acceptor's answer.
    pub(super) fn finish(self, config: &ChannelConfig) -> Result<Agreed, ShmConnectError> {
        let agreed = self.0;
        agreed
            .socket
            .set_read_timeout(Some(config.handshake_timeout))
            .map_err(io_err("setsockopt(SO_RCVTIMEO)"))?;
        let mut ack = [0u8; 16];
        let n = match sys::recv_with_fds(&agreed.socket, &mut ack) {
            Ok((n, _)) => n,
            Err(Errno::EAGAIN) => {
                return Err(ShmConnectError::Handshake("peer did not answer in time"));
            }
            Err(errno) => {
                return Err(ShmConnectError::Sys {
                    op: "recvmsg",
                    errno,
                });
            }
        };
        if n == 0 {
            return Err(ShmConnectError::Handshake(
                "peer hung up without answering the offer",
            ));
        }
        if n != ack.len() || ack[..8] != ACK {
            return Err(ShmConnectError::Handshake(
                "peer's answer is not a urom shared-memory ack",
            ));
        }
        let status = u32::from_le_bytes([ack[8], ack[9], ack[10], ack[11]]);
        let detail = u32::from_le_bytes([ack[12], ack[13], ack[14], ack[15]]);
        match status {
            STATUS_OK => Ok(agreed),
            STATUS_MAX_MSG_SIZE => Err(ShmConnectError::MaxMsgSizeMismatch {
                ours: config.max_msg_size.as_u32(),
                theirs: detail,
            }),
            STATUS_BAD_LAYOUT => Err(ShmConnectError::Refused(
                "it found the layout invalid (different urom versions?)",
            )),
            _ => Err(ShmConnectError::Refused(
                "it could not map the file (out of memory or address space?)",
            )),
        }
    }
}

/// Receives the peer's offer on `stream`, checks it, maps it and answers.
pub(super) fn accept(
    stream: UnixStream,
    config: &ChannelConfig,
) -> Result<Agreed, ShmConnectError> {
    stream
        .set_read_timeout(Some(config.handshake_timeout))
        .map_err(io_err("setsockopt(SO_RCVTIMEO)"))?;
    let mut hello = [0u8; 16];
    let (n, fds) = sys::recv_with_fds(&stream, &mut hello).map_err(|errno| match errno {
        Errno::EAGAIN => ShmConnectError::Handshake("no offer arrived in time"),
        Errno::EMSGSIZE => ShmConnectError::Handshake("offer carried too many descriptors"),
        errno => ShmConnectError::Sys {
            op: "recvmsg",
            errno,
        },
    })?;
    if n == 0 {
        return Err(ShmConnectError::Handshake("peer hung up before offering"));
    }
    const NOT_AN_OFFER: ShmConnectError =
        ShmConnectError::Handshake("peer's first message is not a urom shared-memory offer");
    if n != hello.len() || hello[..8] != HELLO || fds.len() != HELLO_FDS {
        return Err(NOT_AN_OFFER);
    }
    let version = u32::from_le_bytes([hello[8], hello[9], hello[10], hello[11]]);
    if version != HANDSHAKE_VERSION {
        answer(&stream, STATUS_BAD_LAYOUT, version);
        return Err(ShmConnectError::Layout(ShmLayoutError::Version {
            found: version,
        }));
    }
    let Ok([memfd, c0, p0, c1, p1]) = <[OwnedFd; HELLO_FDS]>::try_from(fds) else {
        return Err(NOT_AN_OFFER);
    };
    let (layout, mapping) = match mapping::open(&memfd) {
        Ok(opened) => opened,
        Err(OpenError::Layout(e)) => {
            answer(&stream, STATUS_BAD_LAYOUT, 0);
            return Err(ShmConnectError::Layout(e));
        }
        Err(OpenError::Sys(e)) => {
            answer(&stream, STATUS_SYSTEM, e.errno as u32);
            return Err(e.into());
        }
    };
    if layout.slot_size != config.max_msg_size.as_u32() {
        answer(&stream, STATUS_MAX_MSG_SIZE, config.max_msg_size.as_u32());
        return Err(ShmConnectError::MaxMsgSizeMismatch {
            ours: config.max_msg_size.as_u32(),
            theirs: layout.slot_size,
        });
    }
    answer(&stream, STATUS_OK, 0);
    Ok(Agreed {
        layout,
        mapping,
        side: 1,
        wakes: Wakes {
            rings: [(c0, p0), (c1, p1)],
        },
        socket: stream,
    })
}

/// Sends the acceptor's answer; a failure shows up on the creator's side.
fn answer(stream: &UnixStream, status: u32, detail: u32) {
    let mut ack = [0u8; 16];
    ack[..8].copy_from_slice(&ACK);
    ack[8..12].copy_from_slice(&status.to_le_bytes());
    ack[12..16].copy_from_slice(&detail.to_le_bytes());
    let _ = sys::send_with_fds(stream, &ack, &[]);
}
