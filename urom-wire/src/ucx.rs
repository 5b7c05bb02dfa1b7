//! The UCX transport's byte formats: the handshake that sets up a connection, and the small
//! headers of the active messages that carry frames, credits and closes.
//!
//! All integers little-endian. Each message travels as one UCX active message; its id says
//! which format it is (the transport's business).
//!
//! Handshake messages (the message's data), 32 bytes, then `address_len` bytes of a UCX worker
//! address (possibly none):
//!
//! ```text
//! hello   0 [8] magic "UROMUCXH" | 8 u32 version (UCX_HANDSHAKE_VERSION) | 12 u32 max_msg_size
//!         16 u32 slots | 20 u32 address_len | 24 u32 am_base | 28 u32 reserved (zero)
//!         32 address
//! answer  0 [8] magic "UROMUCXA" | 8 u32 status (UcxAnswerStatus) | 12 u32 max_msg_size
//!         16 u32 slots | 20 u32 address_len | 24 u32 am_base | 28 u32 reserved (zero)
//!         32 address
//! ```
//!
//! `max_msg_size` is the sender's maximum message size, `slots` how many frames of that size
//! the sender keeps room for (the peer's credits), `address` the UCX address of the sender's
//! worker for this connection when the peer must connect to it, else empty. `am_base` is the
//! first of the active-message ids the sender's end of the connection receives on (its UCP
//! worker is shared by many connections, each with ids of its own): data at `am_base`, control
//! at `am_base + 1`, handshake at `am_base + 2`, batch at `am_base + 3`.
//!
//! Active-message headers (the message's header; the data is the frame, or nothing):
//!
//! ```text
//! data     0 u64 sequence number of the frame (0, 1, 2, ... per direction)
//! batch    0 u64 sequence number of its first frame
//! control  0 u32 kind (UcxControlKind) | 4 u32 reserved (zero) | 8 u64 value
//! ```
//!
//! A batch message carries several frames of one direction, numbered on from its header's
//! sequence number, in one active message: its data is one entry per frame, each a `u32`
//! length and then that many bytes, with nothing after the last ([`UcxBatchFrames`] reads
//! them, [`emit_batch_entry`] writes one).
//!
//! A control message's value: for [`UcxControlKind::Credit`], how many frames the receiver has
//! released so far in all; for [`UcxControlKind::SenderClosed`], how many frames the sender sent
//! in all; zero for [`UcxControlKind::ReceiverClosed`], [`UcxControlKind::CloseSeen`] and
//! [`UcxControlKind::Abort`].

use static_assertions::assert_eq_size;
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::codec::{
    check_exact_len, count_u32, exact, magic, prefix, put, put_whole, reserved_zero, version,
};
use crate::{DecodeError, EncodeError};

/// The first bytes of a handshake hello.
pub const UCX_HELLO_MAGIC: [u8; 8] = *b"UROMUCXH";
/// The first bytes of a handshake answer.
pub const UCX_ANSWER_MAGIC: [u8; 8] = *b"UROMUCXA";
/// The handshake version this build speaks: 2 since batch messages (a peer of version 1 would
/// drop them), 3 since each end names its active-message ids (`am_base`).
pub const UCX_HANDSHAKE_VERSION: u32 = 3;

const HELLO: &str = "urom UCX hello";
const ANSWER: &str = "urom UCX answer";

/// The fixed part of a hello or an answer.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct UcxHandshake {
    /// [`UCX_HELLO_MAGIC`] or [`UCX_ANSWER_MAGIC`].
    pub magic: [u8; 8],
    /// The version (hello) or a [`UcxAnswerStatus`] code (answer).
    pub word: U32,
    /// The sender's maximum message size.
    pub max_msg_size: U32,
    /// Frames the sender keeps room for.
    pub slots: U32,
    /// Bytes of worker address after the fixed part.
    pub address_len: U32,
    /// The first active-message id the sender's end receives on.
    pub am_base: U32,
    /// Must be zero.
    pub reserved: U32,
}
assert_eq_size!(UcxHandshake, [u8; 32]);

/// Length of [`UcxHandshake`], the fixed part of a hello or an answer.
pub const UCX_HANDSHAKE_LEN: usize = size_of::<UcxHandshake>();

int_enum! {
    /// The accepting side's answer to a hello.
    open UcxAnswerStatus: u32, other Unknown {
        /// The connection is up.
        Ok = 0,
        /// The hello's version is not the accepting side's (its version in `max_msg_size`).
        Version = 1,
        /// The maximum message sizes differ (the accepting side's in `max_msg_size`).
        MaxMsgSize = 2,
        /// The hello's slot count is out of range.
        Slots = 3,
        /// The accepting side could not set up its end.
        Failed = 4,
    }
}

/// A hello: what the connecting side offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UcxHelloRepr<'a> {
    /// The connecting side's maximum message size.
    pub max_msg_size: u32,
    /// Frames the connecting side keeps room for: the accepting side's credits.
    pub slots: u32,
    /// The connecting side's worker address when the accepting side must connect to it.
    pub address: &'a [u8],
    /// The first active-message id the connecting side's end receives on.
    pub am_base: u32,
}

/// An answer: the accepting side's outcome and its own settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UcxAnswerRepr<'a> {
    /// The outcome.
    pub status: UcxAnswerStatus,
    /// The accepting side's maximum message size (its version for
    /// [`UcxAnswerStatus::Version`]).
    pub max_msg_size: u32,
    /// Frames the accepting side keeps room for: the connecting side's credits.
    pub slots: u32,
    /// The accepting side's worker address when the connecting side must connect to it.
    pub address: &'a [u8],
    /// The first active-message id the accepting side's end receives on.
    pub am_base: u32,
}

/// Splits a hello or answer into its fixed part and its address.
fn parse_handshake<'a>(
    bytes: &'a [u8],
    format: &'static str,
    expected_magic: &[u8; 8],
) -> Result<(&'a UcxHandshake, &'a [u8]), DecodeError> {
    let (wire, address) = prefix::<UcxHandshake>(bytes)?;
    magic(format, &wire.magic, expected_magic)?;
    reserved_zero("ucx_handshake.reserved", wire.reserved.get().into())?;
    check_exact_len(
        UCX_HANDSHAKE_LEN + wire.address_len.get() as usize,
        bytes.len(),
    )?;
    Ok((wire, address))
}

/// Writes a hello or answer.
fn emit_handshake(
    buf: &mut [u8],
    wire: &UcxHandshake,
    address: &[u8],
) -> Result<usize, EncodeError> {
    let needed = UCX_HANDSHAKE_LEN + address.len();
    let available = buf.len();
    let out = buf
        .get_mut(..needed)
        .ok_or(EncodeError::BufferTooSmall { needed, available })?;
    put(out, wire).copy_from_slice(address);
    Ok(needed)
}

fn address_len(address: &[u8]) -> Result<U32, EncodeError> {
    count_u32("ucx_handshake.address", address.len()).map(U32::new)
}

impl<'a> UcxHelloRepr<'a> {
    /// Reads a hello; `bytes` must hold exactly one. A hello of another version is
    /// [`DecodeError::UnsupportedFormatVersion`].
    pub fn parse(bytes: &'a [u8]) -> Result<Self, DecodeError> {
        let (wire, address) = parse_handshake(bytes, HELLO, &UCX_HELLO_MAGIC)?;
        version(HELLO, wire.word.get(), UCX_HANDSHAKE_VERSION)?;
        Ok(Self {
            max_msg_size: wire.max_msg_size.get(),
            slots: wire.slots.get(),
            address,
            am_base: wire.am_base.get(),
        })
    }

    /// The length of this hello.
    pub const fn buffer_len(&self) -> usize {
        UCX_HANDSHAKE_LEN + self.address.len()
    }

    /// Writes the hello at the start of `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EncodeError> {
        let wire = UcxHandshake {
            magic: UCX_HELLO_MAGIC,
            word: U32::new(UCX_HANDSHAKE_VERSION),
            max_msg_size: U32::new(self.max_msg_size),
            slots: U32::new(self.slots),
            address_len: address_len(self.address)?,
            am_base: U32::new(self.am_base),
            reserved: U32::ZERO,
        };
        emit_handshake(buf, &wire, self.address)
    }
}

impl<'a> UcxAnswerRepr<'a> {
    /// Reads an answer; `bytes` must hold exactly one. Statuses this build does not know are
    /// kept in [`UcxAnswerStatus::Unknown`].
    pub fn parse(bytes: &'a [u8]) -> Result<Self, DecodeError> {
        let (wire, address) = parse_handshake(bytes, ANSWER, &UCX_ANSWER_MAGIC)?;
        Ok(Self {
            status: UcxAnswerStatus::from_raw(wire.word.get()),
            max_msg_size: wire.max_msg_size.get(),
            slots: wire.slots.get(),
            address,
            am_base: wire.am_base.get(),
        })
    }

    /// The length of this answer.
    pub const fn buffer_len(&self) -> usize {
        UCX_HANDSHAKE_LEN + self.address.len()
    }

    /// Writes the answer at the start of `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EncodeError> {
        let wire = UcxHandshake {
            magic: UCX_ANSWER_MAGIC,
            word: U32::new(self.status.raw()),
            max_msg_size: U32::new(self.max_msg_size),
            slots: U32::new(self.slots),
            address_len: address_len(self.address)?,
            am_base: U32::new(self.am_base),
            reserved: U32::ZERO,
        };
        emit_handshake(buf, &wire, self.address)
    }
}

/// The header of a data message.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct UcxDataHeader {
    /// The frame's sequence number.
    pub seq: U64,
}
assert_eq_size!(UcxDataHeader, [u8; 8]);

/// Length of [`UcxDataHeader`].
pub const UCX_DATA_HEADER_LEN: usize = size_of::<UcxDataHeader>();

/// A data message's header: which frame of the direction this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UcxDataRepr {
    /// The frame's sequence number (0 for the first frame of a direction).
    pub seq: u64,
}

impl UcxDataRepr {
    /// Reads a data header; `bytes` must be exactly [`UCX_DATA_HEADER_LEN`] bytes.
    pub fn parse(bytes: &[u8]) -> Result<Self, DecodeError> {
        let wire: &UcxDataHeader = exact(bytes)?;
        Ok(Self {
            seq: wire.seq.get(),
        })
    }

    /// The header's bytes.
    pub fn to_bytes(&self) -> [u8; UCX_DATA_HEADER_LEN] {
        self.seq.to_le_bytes()
    }

    /// Writes the header at the start of `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EncodeError> {
        put_whole(
            buf,
            &UcxDataHeader {
                seq: U64::new(self.seq),
            },
        )
    }
}

/// Length of a batch entry's length field.
pub const UCX_BATCH_ENTRY_HEADER_LEN: usize = 4;

/// The frames of a batch message's data, in order. Each item is a frame, or the error that
/// ends a malformed rest (an entry that claims more bytes than remain); nothing follows an
/// error. Frame lengths are the transport's to check.
#[derive(Debug, Clone)]
pub struct UcxBatchFrames<'a> {
    rest: &'a [u8],
}

impl<'a> UcxBatchFrames<'a> {
    /// Reads the entries of `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Self { rest: data }
    }
}

impl<'a> Iterator for UcxBatchFrames<'a> {
    type Item = Result<&'a [u8], DecodeError>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let rest = core::mem::take(&mut self.rest);
        let Some((len, body)) = rest.split_first_chunk::<UCX_BATCH_ENTRY_HEADER_LEN>() else {
            return Some(Err(DecodeError::Truncated {
                needed: UCX_BATCH_ENTRY_HEADER_LEN,
                available: rest.len(),
            }));
        };
        let len = u32::from_le_bytes(*len) as usize;
        if len > body.len() {
            return Some(Err(DecodeError::Truncated {
                needed: len,
                available: body.len(),
            }));
        }
        let (frame, rest) = body.split_at(len);
        self.rest = rest;
        Some(Ok(frame))
    }
}

/// Writes one batch entry for `frame` at the start of `buf`; returns its length,
/// [`UCX_BATCH_ENTRY_HEADER_LEN`] more than the frame's.
#[inline]
pub fn emit_batch_entry(buf: &mut [u8], frame: &[u8]) -> Result<usize, EncodeError> {
    let needed = UCX_BATCH_ENTRY_HEADER_LEN + frame.len();
    let len = u32::try_from(frame.len()).map_err(|_| EncodeError::TooLong {
        length: frame.len(),
        max: u32::MAX as usize,
    })?;
    let Some(entry) = buf.get_mut(..needed) else {
        return Err(EncodeError::BufferTooSmall {
            needed,
            available: buf.len(),
        });
    };
    let (head, body) = entry.split_at_mut(UCX_BATCH_ENTRY_HEADER_LEN);
    head.copy_from_slice(&len.to_le_bytes());
    body.copy_from_slice(frame);
    Ok(needed)
}

int_enum! {
    /// What a control message says.
    open UcxControlKind: u32, other Unknown {
        /// The receiver released frames: the value is how many so far in all.
        Credit = 1,
        /// The sender closed its direction after the value's count of frames.
        SenderClosed = 2,
        /// The receiver closed its direction: the peer's frames are no longer read.
        ReceiverClosed = 3,
        /// Both of the peer's closes arrived, and every frame before them: the peer may hang up.
        CloseSeen = 4,
        /// The sender's end is gone without closing (as if its process died): the connection is
        /// dead. Sent where the end cannot hang up its endpoint alone (shared by other ends).
        Abort = 5,
    }
}

/// The header of a control message.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct UcxControl {
    /// A [`UcxControlKind`] code.
    pub kind: U32,
    /// Must be zero.
    pub reserved: U32,
    /// Depends on the kind; see the module documentation.
    pub value: U64,
}
assert_eq_size!(UcxControl, [u8; 16]);

/// Length of [`UcxControl`].
pub const UCX_CONTROL_LEN: usize = size_of::<UcxControl>();

/// A control message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UcxControlRepr {
    /// What it says.
    pub kind: UcxControlKind,
    /// Depends on the kind; see the module documentation.
    pub value: u64,
}

impl UcxControlRepr {
    /// Reads a control header; `bytes` must be exactly [`UCX_CONTROL_LEN`] bytes. Kinds this
    /// build does not know are kept in [`UcxControlKind::Unknown`].
    pub fn parse(bytes: &[u8]) -> Result<Self, DecodeError> {
        let wire: &UcxControl = exact(bytes)?;
        reserved_zero("ucx_control.reserved", wire.reserved.get().into())?;
        Ok(Self {
            kind: UcxControlKind::from_raw(wire.kind.get()),
            value: wire.value.get(),
        })
    }

    fn to_wire(self) -> UcxControl {
        UcxControl {
            kind: U32::new(self.kind.raw()),
            reserved: U32::ZERO,
            value: U64::new(self.value),
        }
    }

    /// The header's bytes.
    pub fn to_bytes(&self) -> [u8; UCX_CONTROL_LEN] {
        zerocopy::transmute!(self.to_wire())
    }

    /// Writes the header at the start of `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EncodeError> {
        put_whole(buf, &self.to_wire())
    }
}
