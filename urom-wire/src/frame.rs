//! The frame header every urom message starts with, and frames with typed bodies.
//!
//! ```text
//! offset  size  field
//!      0     4  magic    "UROM"
//!      4     2  version  PROTOCOL_VERSION
//!      6     2  kind     FrameKind
//!      8     4  length   whole frame in bytes, header included
//!     12     4  flags    none defined in version 1: must be zero
//!     16     8  seq      sequence number; a reply carries its request's
//! ```
//!
//! All fields little-endian. A receiver checks magic, version, kind, flags and length against
//! the [`MaxMsgSize`] before it looks at the body.
//!
//! This module knows frame kinds, not bodies: a message family ([`crate::control`],
//! [`crate::data`]) implements [`Body`] for its message enum, and [`FrameRepr`] puts a header in
//! front of any of them. [`peek_seq`] reads the sequence number of a frame that failed
//! validation, so that the error reply can carry it.

use static_assertions::assert_eq_size;
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::codec::{check_exact_len, peek};
use crate::{DecodeError, EncodeError, MaxMsgSize};

/// The wire layout of the frame header.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct FrameHeader {
    /// [`MAGIC`].
    pub magic: U32,
    /// [`PROTOCOL_VERSION`].
    pub version: U16,
    /// A [`FrameKind`] code.
    pub kind: U16,
    /// The whole frame's length in bytes, header included.
    pub length: U32,
    /// Must be zero in version 1.
    pub flags: U32,
    /// Sequence number; a reply carries its request's.
    pub seq: U64,
}

/// Length of [`FrameHeader`].
pub const FRAME_HEADER_LEN: usize = crate::limits::FRAME_HEADER_LEN;
assert_eq_size!(FrameHeader, [u8; FRAME_HEADER_LEN]);
/// The first four bytes of every frame: `UROM`.
pub const MAGIC: u32 = u32::from_le_bytes(*b"UROM");
/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u16 = 1;

int_enum! {
    /// What a frame carries. Codes `0x01xx` travel between a host and the daemon, codes
    /// `0x02xx` between a host and a worker, codes `0x03xx` between the daemon and a worker.
    closed FrameKind: u16 {
        /// Host -> daemon: [`crate::control::Hello`].
        Hello = 0x0101,
        /// Daemon -> host: [`crate::control::AuthChallenge`].
        AuthChallenge = 0x0102,
        /// Host -> daemon: [`crate::control::AuthResponse`].
        AuthResponse = 0x0103,
        /// Daemon -> host: the request succeeded and has nothing else to say.
        Ack = 0x0104,
        /// Daemon -> host: [`crate::control::ErrorReply`].
        Error = 0x0105,
        /// Host -> daemon: [`crate::control::SecretProof`].
        SecretProof = 0x0106,
        /// Daemon -> host: [`crate::control::ServiceProof`].
        ServiceProof = 0x0107,
        /// Host -> daemon: which plugins are there?
        PluginListRequest = 0x0110,
        /// Daemon -> host: the plugin records.
        PluginListReply = 0x0111,
        /// Host -> daemon: which CPUs may workers use?
        CpusetRequest = 0x0112,
        /// Daemon -> host: the CPU set.
        CpusetReply = 0x0113,
        /// Host -> daemon: [`crate::control::SpawnWorker`].
        SpawnWorker = 0x0120,
        /// Daemon -> host: [`crate::control::SpawnResult`].
        SpawnResult = 0x0121,
        /// Host -> daemon: stop a worker.
        DestroyWorker = 0x0122,
        /// Host -> daemon: which workers are in a group?
        WorkersByGidRequest = 0x0123,
        /// Daemon -> host: the group's worker ids.
        WorkersByGidReply = 0x0124,
        /// Daemon -> host, unsolicited: [`crate::control::WorkerExit`].
        WorkerExited = 0x0125,
        /// Host -> daemon: a page of the status report.
        StatusRequest = 0x0130,
        /// Daemon -> host: [`crate::control::StatusReply`].
        StatusReply = 0x0131,
        /// Host -> worker: [`crate::data::Command`].
        Command = 0x0201,
        /// Worker -> host: [`crate::data::Notification`]. (Code `0x0202` carried an older
        /// layout whose header repeated the payload's length; it is no longer accepted.)
        Notify = 0x0203,
        /// Host -> worker: [`crate::domain::AddressRequest`].
        DomainAddressRequest = 0x0210,
        /// Worker -> host: [`crate::domain::AddressReply`].
        DomainAddressReply = 0x0211,
        /// Host -> worker: [`crate::domain::TableChunk`].
        DomainTableChunk = 0x0212,
        /// Worker -> host: [`crate::domain::TableAck`].
        DomainTableAck = 0x0213,
        /// Daemon -> worker, on the daemon's link: what are your counters?
        CountersRequest = 0x0301,
        /// Worker -> daemon: [`crate::link::CounterReport`].
        CountersReply = 0x0302,
    }
}

impl FrameKind {
    /// Whether frames of this kind travel between a host and the daemon.
    pub const fn is_control(self) -> bool {
        self.raw() >> 8 == 0x01
    }
}

/// A view of a frame in a buffer.
///
/// Build it with [`Frame::new_checked`] to validate a received buffer; after that no accessor
/// panics. [`Frame::new_unchecked`] is for writing into a buffer of at least
/// [`FRAME_HEADER_LEN`] bytes; the accessors panic on a shorter one.
#[derive(Debug, Clone)]
pub struct Frame<T> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Frame<T> {
    /// Wraps a buffer without looking at it.
    pub const fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }

    /// Wraps a buffer holding exactly one whole, valid frame header and its body bytes.
    pub fn new_checked(buffer: T, max: MaxMsgSize) -> Result<Self, DecodeError> {
        let frame = Self::new_unchecked(buffer);
        frame.check(max)?;
        Ok(frame)
    }

    /// Checks the header fields and that the buffer is exactly as long as the frame says.
    pub fn check(&self, max: MaxMsgSize) -> Result<(), DecodeError> {
        check_frame(self.buffer.as_ref(), max).map(|_| ())
    }

    fn header(&self) -> &FrameHeader {
        peek(self.buffer.as_ref()).expect("frame buffer shorter than its header")
    }

    /// The frame kind, or `None` for a code urom does not define.
    pub fn kind(&self) -> Option<FrameKind> {
        FrameKind::from_raw(self.header().kind.get())
    }

    /// The whole frame's length as the header states it.
    pub fn length(&self) -> usize {
        self.header().length.get() as usize
    }

    /// The sequence number.
    pub fn seq(&self) -> u64 {
        self.header().seq.get()
    }

    /// The bytes after the header.
    pub fn body(&self) -> &[u8] {
        &self.buffer.as_ref()[FRAME_HEADER_LEN..]
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Frame<T> {
    /// Writes a complete header: magic, version, `kind`, `length`, no flags, `seq`.
    pub fn fill_header(&mut self, kind: FrameKind, seq: u64, length: usize) {
        let header = FrameHeader {
            magic: U32::new(MAGIC),
            version: U16::new(PROTOCOL_VERSION),
            kind: U16::new(kind.raw()),
            length: U32::new(length as u32),
            flags: U32::ZERO,
            seq: U64::new(seq),
        };
        self.buffer.as_mut()[..FRAME_HEADER_LEN].copy_from_slice(header.as_bytes());
    }

    fn header_mut(&mut self) -> &mut FrameHeader {
        FrameHeader::mut_from_prefix(self.buffer.as_mut())
            .map(|(header, _)| header)
            .expect("frame buffer shorter than its header")
    }

    /// Sets the sequence number.
    pub fn set_seq(&mut self, seq: u64) {
        self.header_mut().seq = U64::new(seq);
    }

    /// The bytes after the header, for writing.
    pub fn body_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[FRAME_HEADER_LEN..]
    }
}

/// Validates the header at the start of `prefix` and returns the whole frame's length, or
/// `None` when fewer than [`FRAME_HEADER_LEN`] bytes have arrived.
///
/// For stream readers: call it as bytes arrive, then wait for the returned length. Garbage is
/// refused as soon as the header is in, before any body byte is awaited.
#[inline]
pub fn frame_length(prefix: &[u8], max: MaxMsgSize) -> Result<Option<usize>, DecodeError> {
    Ok(check_header(prefix, max)?.map(|checked| checked.length))
}

/// The sequence number of the header at the start of `bytes`, or `None` when fewer than
/// [`FRAME_HEADER_LEN`] bytes are there. Nothing else is checked.
///
/// For a receiver that must answer a frame that failed validation (an error reply carries the
/// request's sequence number), or that routes replies it has already parsed. Anything else
/// reads the header through [`Frame::new_checked`] or [`FrameRepr::parse`].
#[inline]
pub fn peek_seq(bytes: &[u8]) -> Option<u64> {
    peek::<FrameHeader>(bytes).map(|header| header.seq.get())
}

/// What [`check_header`] learned from a valid header.
struct CheckedHeader {
    length: usize,
    kind: FrameKind,
    seq: u64,
}

/// Checks magic, version, kind, flags and length, in that order; `None` when the header has
/// not fully arrived.
#[inline]
fn check_header(prefix: &[u8], max: MaxMsgSize) -> Result<Option<CheckedHeader>, DecodeError> {
    let Ok((header, _)) = FrameHeader::ref_from_prefix(prefix) else {
        return Ok(None);
    };
    if header.magic.get() != MAGIC {
        return Err(DecodeError::BadMagic(header.magic.get()));
    }
    if header.version.get() != PROTOCOL_VERSION {
        return Err(DecodeError::UnsupportedVersion(header.version.get()));
    }
    let kind = FrameKind::from_raw(header.kind.get())
        .ok_or(DecodeError::UnknownKind(header.kind.get()))?;
    if header.flags.get() != 0 {
        return Err(DecodeError::ReservedNotZero { field: "flags" });
    }
    let length = header.length.get() as usize;
    if length < FRAME_HEADER_LEN {
        return Err(DecodeError::LengthBelowHeader {
            length,
            header: FRAME_HEADER_LEN,
        });
    }
    if length > max.get() {
        return Err(DecodeError::TooLong {
            length,
            max: max.get(),
        });
    }
    Ok(Some(CheckedHeader {
        length,
        kind,
        seq: header.seq.get(),
    }))
}

/// Checks a whole frame: a valid header and exactly as many bytes as it claims.
#[inline]
fn check_frame(bytes: &[u8], max: MaxMsgSize) -> Result<CheckedHeader, DecodeError> {
    let checked = check_header(bytes, max)?.ok_or(DecodeError::Truncated {
        needed: FRAME_HEADER_LEN,
        available: bytes.len(),
    })?;
    check_exact_len(checked.length, bytes.len())?;
    Ok(checked)
}

/// The body of a family of frames (control or data path): how it maps to frame kinds and bytes.
pub trait Body<'a>: Sized {
    /// The frame kind this body travels as.
    fn kind(&self) -> FrameKind;
    /// Reads the body of a frame of `kind`; [`DecodeError::UnexpectedKind`] when `kind` is not
    /// of this family.
    fn parse(kind: FrameKind, body: &'a [u8]) -> Result<Self, DecodeError>;
    /// How many bytes [`Body::emit`] writes.
    fn body_len(&self) -> usize;
    /// Writes the body into `dst`, which is exactly [`Body::body_len`] bytes.
    fn emit(&self, dst: &mut [u8]) -> Result<(), EncodeError>;
}

/// A frame with a typed body: the sequence number and the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameRepr<B> {
    /// Sequence number; a reply carries its request's.
    pub seq: u64,
    /// The message.
    pub body: B,
}

impl<'a, B: Body<'a>> FrameRepr<B> {
    /// Reads a whole frame: header checks first, then the body.
    #[inline]
    pub fn parse(bytes: &'a [u8], max: MaxMsgSize) -> Result<Self, DecodeError> {
        let header = check_frame(bytes, max)?;
        Ok(Self {
            seq: header.seq,
            body: B::parse(header.kind, &bytes[FRAME_HEADER_LEN..])?,
        })
    }

    /// The whole frame's length.
    pub fn buffer_len(&self) -> usize {
        FRAME_HEADER_LEN + self.body.body_len()
    }

    /// Writes the frame at the start of `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8], max: MaxMsgSize) -> Result<usize, EncodeError> {
        let length = self.buffer_len();
        if length > max.get() {
            return Err(EncodeError::TooLong {
                length,
                max: max.get(),
            });
        }
        let available = buf.len();
        let frame_bytes = buf.get_mut(..length).ok_or(EncodeError::BufferTooSmall {
            needed: length,
            available,
        })?;
        let mut frame = Frame::new_unchecked(frame_bytes);
        frame.fill_header(self.body.kind(), self.seq, length);
        self.body.emit(frame.body_mut())?;
        Ok(length)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peek_seq_reads_any_whole_header() {
        let mut bytes = [0xa5; FRAME_HEADER_LEN + 3];
        Frame::new_unchecked(&mut bytes[..]).fill_header(FrameKind::Ack, 7, 24);
        assert_eq!(peek_seq(&bytes), Some(7));
        // Garbage in every other field is no matter.
        bytes[..16].fill(0xff);
        assert_eq!(peek_seq(&bytes[..FRAME_HEADER_LEN]), Some(7));
        assert_eq!(peek_seq(&bytes[..FRAME_HEADER_LEN - 1]), None);
        assert_eq!(peek_seq(&[]), None);
    }

    #[test]
    fn set_seq_writes_only_the_sequence_number() {
        let mut bytes = [0xa5; FRAME_HEADER_LEN + 2];
        let mut frame = Frame::new_unchecked(&mut bytes[..]);
        frame.fill_header(FrameKind::Ack, 1, FRAME_HEADER_LEN);
        frame.set_seq(0x0102_0304_0506_0708);
        assert_eq!(frame.seq(), 0x0102_0304_0506_0708);
        assert_eq!(&bytes[16..24], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(&bytes[24..], &[0xa5, 0xa5]);
        assert_eq!(&bytes[..4], b"UROM");
    }
}
