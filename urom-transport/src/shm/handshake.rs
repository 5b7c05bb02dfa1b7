//! How the two sides agree on a mapping, over a connected Unix stream socket.
//!
//! The request, the hello and the ack are `urom_wire::shm`'s.
//!
//! 0. the acceptor asks for rings of its `ChannelConfig::slots` (the most frames it keeps in
//!    flight); the creator gives that many slots, rounded up to a power of two, at least
//!    `MIN_SLOTS` and at most its own `slots` (what its maximum message size allows), so that
//!    each of a worker's hosts gets rings of its own size;
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
use urom_wire::DecodeError;
use urom_wire::shm::{
    SHM_ACK_LEN, SHM_HANDSHAKE_VERSION, SHM_HELLO_DESCRIPTORS, SHM_HELLO_LEN, SHM_REQUEST_LEN,
    ShmAckRepr, ShmAckStatus, ShmHelloRepr, ShmRequestRepr,
};

use super::layout::{Layout, MIN_SLOTS, ShmLayoutError};
use super::mapping::{self, Mapping, OpenError, SysError};
use crate::ChannelConfig;
use crate::sys;

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
    /// The peer speaks another version of the handshake.
    Version {
        /// The version the peer speaks.
        found: u32,
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
            ShmConnectError::Version { found } => write!(
                f,
                "peer speaks version {found} of the shared-memory handshake, this build \
                 {SHM_HANDSHAKE_VERSION} (different urom versions?)"
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

/// Asks the creator on `stream` for rings of `config.slots` slots: the acceptor's first word.
pub(super) fn request(stream: &UnixStream, config: &ChannelConfig) -> Result<(), ShmConnectError> {
    let request = ShmRequestRepr {
        slots: config.slots,
    };
    sys::send_with_fds(stream, &request.to_bytes(), &[]).map_err(|errno| match errno {
        Errno::EPIPE | Errno::ECONNRESET => {
            ShmConnectError::Handshake("peer hung up before the request")
        }
        errno => ShmConnectError::Sys {
            op: "sendmsg",
            errno,
        },
    })
}

/// Reads the acceptor's request on `stream`, waiting for it at most the handshake timeout;
/// the slots per ring to give it: what it asks for (0: `config.slots`), rounded up to a power
/// of two, at least [`MIN_SLOTS`] and at most `config.slots`.
fn read_request(stream: &UnixStream, config: &ChannelConfig) -> Result<u32, ShmConnectError> {
    stream
        .set_read_timeout(Some(config.handshake_timeout))
        .map_err(io_err("setsockopt(SO_RCVTIMEO)"))?;
    let mut request = [0u8; SHM_REQUEST_LEN];
    let (n, fds) = sys::recv_with_fds(stream, &mut request).map_err(|errno| match errno {
        Errno::EAGAIN => ShmConnectError::Handshake(
            "the peer asked for no rings in time (a peer older than this build?)",
        ),
        errno => ShmConnectError::Sys {
            op: "recvmsg",
            errno,
        },
    })?;
    if n == 0 {
        return Err(ShmConnectError::Handshake(
            "peer hung up before asking for its rings",
        ));
    }
    if !fds.is_empty() {
        return Err(ShmConnectError::Handshake(
            "peer's request carried descriptors",
        ));
    }
    let asked = match ShmRequestRepr::parse(&request[..n]) {
        Ok(request) => request.slots,
        Err(DecodeError::UnsupportedFormatVersion { found, .. }) => {
            return Err(ShmConnectError::Version { found });
        }
        Err(_) => {
            return Err(ShmConnectError::Handshake(
                "peer's first message is not a urom shared-memory request",
            ));
        }
    };
    if asked == 0 {
        return Ok(config.slots);
    }
    let slots = asked
        .max(MIN_SLOTS)
        .checked_next_power_of_two()
        .unwrap_or(u32::MAX);
    Ok(slots.min(config.slots))
}

/// Reads the acceptor's request, then creates the mapping and the eventfds and offers them to
/// the peer on `stream`.
pub(super) fn offer(
    stream: UnixStream,
    config: &ChannelConfig,
) -> Result<Offered, ShmConnectError> {
    let slots = read_request(&stream, config)?;
    let layout = Layout::new(config.max_msg_size, slots).map_err(ShmConnectError::Layout)?;
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
    let [(c0, p0), (c1, p1)] = &wakes.rings;
    sys::send_with_fds(
        &stream,
        &ShmHelloRepr.to_bytes(),
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
    /// The socket the acceptor answers on.
    pub(super) fn socket(&self) -> std::os::fd::BorrowedFd<'_> {
        self.0.socket.as_fd()
    }

    /// Waits for the acceptor's answer.
    pub(super) fn finish(self, config: &ChannelConfig) -> Result<Agreed, ShmConnectError> {
        let agreed = self.0;
        agreed
            .socket
            .set_read_timeout(Some(config.handshake_timeout))
            .map_err(io_err("setsockopt(SO_RCVTIMEO)"))?;
        let mut ack = [0u8; SHM_ACK_LEN];
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
        let ack = ShmAckRepr::parse(&ack[..n]).map_err(|_| {
            ShmConnectError::Handshake("peer's answer is not a urom shared-memory ack")
        })?;
        match ack.status {
            ShmAckStatus::Ok => Ok(agreed),
            ShmAckStatus::MaxMsgSize => Err(ShmConnectError::MaxMsgSizeMismatch {
                ours: config.max_msg_size.as_u32(),
                theirs: ack.detail,
            }),
            ShmAckStatus::BadLayout => Err(ShmConnectError::Refused(
                "it found the layout invalid (different urom versions?)",
            )),
            _ => Err(ShmConnectError::Refused(
                "it could not map the file (out of memory or address space?)",
            )),
        }
    }
}

/// Asks the peer on `stream` for rings ([`request`]), then receives its offer, checks it, maps
/// it and answers.
pub(super) fn accept(
    stream: UnixStream,
    config: &ChannelConfig,
) -> Result<Agreed, ShmConnectError> {
    request(&stream, config)?;
    accept_offer(stream, config)
}

/// Receives the peer's offer on `stream` (asked for already), checks it, maps it and answers.
pub(super) fn accept_offer(
    stream: UnixStream,
    config: &ChannelConfig,
) -> Result<Agreed, ShmConnectError> {
    stream
        .set_read_timeout(Some(config.handshake_timeout))
        .map_err(io_err("setsockopt(SO_RCVTIMEO)"))?;
    let mut hello = [0u8; SHM_HELLO_LEN];
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
    match ShmHelloRepr::parse(&hello[..n]) {
        Ok(ShmHelloRepr) => {}
        Err(DecodeError::UnsupportedFormatVersion { found, .. }) => {
            answer(&stream, ShmAckStatus::BadLayout, found);
            return Err(ShmConnectError::Version { found });
        }
        Err(_) => return Err(NOT_AN_OFFER),
    }
    let Ok([memfd, c0, p0, c1, p1]) = <[OwnedFd; SHM_HELLO_DESCRIPTORS]>::try_from(fds) else {
        return Err(NOT_AN_OFFER);
    };
    let (layout, mapping) = match mapping::open(&memfd) {
        Ok(opened) => opened,
        Err(OpenError::Layout(e)) => {
            answer(&stream, ShmAckStatus::BadLayout, 0);
            return Err(ShmConnectError::Layout(e));
        }
        Err(OpenError::Sys(e)) => {
            answer(&stream, ShmAckStatus::System, e.errno as u32);
            return Err(e.into());
        }
    };
    if layout.slot_size != config.max_msg_size.as_u32() {
        answer(
            &stream,
            ShmAckStatus::MaxMsgSize,
            config.max_msg_size.as_u32(),
        );
        return Err(ShmConnectError::MaxMsgSizeMismatch {
            ours: config.max_msg_size.as_u32(),
            theirs: layout.slot_size,
        });
    }
    answer(&stream, ShmAckStatus::Ok, 0);
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
fn answer(stream: &UnixStream, status: ShmAckStatus, detail: u32) {
    let ack = ShmAckRepr { status, detail };
    let _ = sys::send_with_fds(stream, &ack.to_bytes(), &[]);
}
