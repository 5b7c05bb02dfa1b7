//! The socket rendezvous: an out-of-band allgather among the hosts of a domain over a Unix or
//! TCP socket, for runs without MPI.
//!
//! Rank 0 listens at an address every rank knows; every other rank connects and sends
//! [`OobKind::Join`]. For each allgather (numbered from 0 by `seq`), every rank other than 0
//! sends its block to rank 0 ([`OobKind::Block`]); once rank 0 has every block it sends the
//! blocks, rank 0's first, to every rank ([`OobKind::Gathered`]). When a rank's connection
//! fails, rank 0 tells the others which rank it was ([`OobKind::Abort`]) and closes.
//!
//! Every message is a 32-byte header, little-endian, then `len` bytes:
//!
//! ```text
//! 0 [4] magic "UOOB" | 4 u16 version (1) | 6 u16 kind | 8 u32 rank | 12 u32 ranks
//! 16 u64 seq | 24 u64 len | 32 len bytes
//! ```
//!
//! `rank` is the sender's (for `Abort`, the rank that failed), `ranks` the size of the group
//! as the sender knows it. A `Join` has `seq` 0 and no bytes; an `Abort`'s bytes are a UTF-8
//! reason.

use static_assertions::assert_eq_size;
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::codec::{check_exact_len, magic, prefix, put, version};
use crate::{DecodeError, EncodeError};

/// The first bytes of every rendezvous message.
pub const OOB_MAGIC: [u8; 4] = *b"UOOB";
/// The rendezvous format this build speaks.
pub const OOB_VERSION: u16 = 1;

const FORMAT: &str = "urom rendezvous message";

/// The wire layout of a rendezvous message's header.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct OobHeader {
    /// [`OOB_MAGIC`].
    pub magic: [u8; 4],
    /// [`OOB_VERSION`].
    pub version: U16,
    /// An [`OobKind`] code.
    pub kind: U16,
    /// The sender's rank; for an abort, the rank that failed.
    pub rank: U32,
    /// The group's size.
    pub ranks: U32,
    /// Which allgather (0, 1, 2, ...).
    pub seq: U64,
    /// Bytes that follow.
    pub len: U64,
}
assert_eq_size!(OobHeader, [u8; 32]);

/// Length of [`OobHeader`].
pub const OOB_HEADER_LEN: usize = size_of::<OobHeader>();

int_enum! {
    /// What a rendezvous message is.
    closed OobKind: u16 {
        /// A rank other than 0 introduces itself to rank 0.
        Join = 1,
        /// A rank's block for allgather `seq`, to rank 0.
        Block = 2,
        /// Rank 0 to a rank: every block of allgather `seq`, rank 0's first.
        Gathered = 3,
        /// Rank 0 to the others: rank `rank` failed; the bytes say how.
        Abort = 4,
    }
}

/// A rendezvous message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OobRepr<'a> {
    /// What it is.
    pub kind: OobKind,
    /// The sender's rank (for an abort, the failed rank).
    pub rank: u32,
    /// The group's size.
    pub ranks: u32,
    /// Which allgather.
    pub seq: u64,
    /// The block, the gathered blocks, or an abort's reason.
    pub data: &'a [u8],
}

/// Checks the header at the start of `prefix` and returns the whole message's length, or
/// `None` when fewer than [`OOB_HEADER_LEN`] bytes have arrived. A message longer than `max`
/// bytes is refused from its header.
pub fn oob_message_len(prefix: &[u8], max: usize) -> Result<Option<usize>, DecodeError> {
    let Ok((header, _)) = OobHeader::ref_from_prefix(prefix) else {
        return Ok(None);
    };
    check_header(header, max).map(|(_, length)| Some(length))
}

fn check_header(header: &OobHeader, max: usize) -> Result<(OobKind, usize), DecodeError> {
    magic(FORMAT, &header.magic, &OOB_MAGIC)?;
    version(FORMAT, header.version.get().into(), OOB_VERSION.into())?;
    let kind =
        OobKind::from_raw(header.kind.get()).ok_or(DecodeError::UnknownKind(header.kind.get()))?;
    let length = usize::try_from(header.len.get())
        .ok()
        .and_then(|len| len.checked_add(OOB_HEADER_LEN))
        .unwrap_or(usize::MAX);
    if length > max {
        return Err(DecodeError::TooLong { length, max });
    }
    Ok((kind, length))
}

impl<'a> OobRepr<'a> {
    /// Reads one whole message that fills `bytes` exactly and is at most `max` bytes long.
    pub fn parse(bytes: &'a [u8], max: usize) -> Result<Self, DecodeError> {
        let (header, data) = prefix::<OobHeader>(bytes)?;
        let (kind, length) = check_header(header, max)?;
        check_exact_len(length, bytes.len())?;
        let repr = Self {
            kind,
            rank: header.rank.get(),
            ranks: header.ranks.get(),
            seq: header.seq.get(),
            data,
        };
        repr.check()?;
        Ok(repr)
    }

    fn check(&self) -> Result<(), DecodeError> {
        match self.kind {
            OobKind::Join if self.seq != 0 => Err(DecodeError::ReservedNotZero { field: "seq" }),
            OobKind::Join if !self.data.is_empty() => Err(DecodeError::TrailingBytes {
                expected: OOB_HEADER_LEN,
                found: OOB_HEADER_LEN + self.data.len(),
            }),
            OobKind::Abort if core::str::from_utf8(self.data).is_err() => {
                Err(DecodeError::TextNotUtf8 {
                    field: "abort reason",
                })
            }
            _ => Ok(()),
        }
    }

    /// The whole message's length.
    pub fn buffer_len(&self) -> usize {
        OOB_HEADER_LEN.saturating_add(self.data.len())
    }

    /// Writes the message at the start of `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EncodeError> {
        if self.check().is_err() {
            return Err(EncodeError::TooMany {
                field: "rendezvous message bytes",
                count: self.data.len(),
                max: 0,
            });
        }
        let length = self.buffer_len();
        let available = buf.len();
        let out = buf.get_mut(..length).ok_or(EncodeError::BufferTooSmall {
            needed: length,
            available,
        })?;
        let header = OobHeader {
            magic: OOB_MAGIC,
            version: U16::new(OOB_VERSION),
            kind: U16::new(self.kind.raw()),
            rank: U32::new(self.rank),
            ranks: U32::new(self.ranks),
            seq: U64::new(self.seq),
            len: U64::new(self.data.len() as u64),
        };
        put(out, &header).copy_from_slice(self.data);
        Ok(length)
    }
}
