//! Domains: how a host hands its workers the table of a domain's members, and what the hosts
//! of a domain exchange to build it.
//!
//! A domain is a set of workers, each known by a *domain id*, whose plugins find one another
//! (and the hosts' buffers) through the table. Starting one, each host:
//!
//! 1. asks each of its workers for the address of each of its plugins
//!    ([`DomainMessage::DomainAddressRequest`], answered by the worker itself with a
//!    [`DomainMessage::DomainAddressReply`]);
//! 2. writes its *record* ([`RecordSpec`]): its workers' domain ids and plugin addresses, and
//!    its buffers;
//! 3. allgathers a [`JoinBlock`] (its record's length, or why it cannot take part), then the
//!    records padded to the longest (every rank passes the same length to an allgather);
//! 4. sends the table (a [`TableHeader`] and every rank's record, in rank order) to each of its
//!    workers in [`DomainMessage::DomainTableChunk`]s, each worker answering once with a
//!    [`DomainMessage::DomainTableAck`];
//! 5. allgathers a [`ReadyBlock`]: the domain runs when every rank's workers took the table.
//!
//! Data-channel bodies (frame kinds `0x0210` to `0x0213`; little-endian, offsets within the
//! body):
//!
//! ```text
//! DomainAddressRequest  0 u64 request | 8 u64 plugin                                   = 16
//! DomainAddressReply    0 u64 request | 8 u64 plugin | 16 i32 status | 20 u32 reserved
//!                       24 address (the rest of the body; empty unless status is 0)
//! DomainTableChunk      0 u64 request | 8 u64 table_len | 16 u64 offset
//!                       24 bytes offset..offset + n of the table (the rest of the body)
//! DomainTableAck        0 u64 request | 8 i32 status | 12 u32 reserved                 = 16
//! ```
//!
//! A request id is the host's; replies carry it back. A table longer than one frame travels in
//! chunks of one request, in order, from offset 0; the worker answers once, after the last
//! chunk (or at the first one it cannot take).
//!
//! The table, and each record in it (all offsets from the start of the struct; every struct is
//! a multiple of 8 bytes and every byte string is padded with zeros to a multiple of 8, so
//! that each piece lies 8-byte aligned in an aligned table):
//!
//! ```text
//! TableHeader   0 [4] magic "UDOM" | 4 u16 version (1) | 6 u16 reserved | 8 u32 ranks
//!               12 u32 reserved | 16 u64 length (the whole table)                      = 24
//!               then `ranks` records, rank 0 first
//! Record        0 u64 length (the whole record) | 8 u32 rank | 12 u32 members
//!               16 u32 buffers | 20 u32 reserved                                       = 24
//!               then `members` members, then `buffers` buffers
//! Member        0 u64 domain_id | 8 u32 plugins | 12 u32 reserved                      = 16
//!               then `plugins` plugin addresses
//! PluginAddress 0 [48] plugin name (NUL-padded) | 48 u32 len | 52 u32 reserved         = 56
//!               then len bytes of address, padded
//! Buffer        0 u64 va | 8 u64 len | 16 u32 memh_len | 20 u32 mkey_len               = 24
//!               then memh_len bytes of packed memory handle, padded,
//!               then mkey_len bytes of packed remote key, padded
//! ```
//!
//! Blocks of the out-of-band allgathers:
//!
//! ```text
//! JoinBlock     0 u64 record_len | 8 i32 status | 12 u32 reserved                      = 16
//! ReadyBlock    0 i32 status | 4 u32 reserved                                          = 8
//! ```
//!
//! Plugins are named, not numbered, in records: each daemon numbers its own plugins, so the
//! same plugin may have another id on another machine. A buffer belongs to every domain id of
//! the host that added it; its segment number is its index among that host's buffers.

use static_assertions::assert_eq_size;
use zerocopy::little_endian::{I32, U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::codec::{
    Message, count_u32, exact, magic, prefix, put, put_whole, reserved_zero, version,
};
use crate::text::{decode_padded, encode_padded};
use crate::{DecodeError, EncodeError, Status};

/// Size of a plugin name field in a record (as in the plugin list); names hold one byte less.
pub const PLUGIN_NAME_LEN: usize = crate::control::PLUGIN_NAME_MAX_LEN;
/// The first bytes of a table.
pub const TABLE_MAGIC: [u8; 4] = *b"UDOM";
/// The table format this build speaks.
pub const TABLE_VERSION: u16 = 1;
/// The longest table a worker takes, and the longest record a host takes from a peer.
pub const MAX_TABLE_LEN: u64 = 64 << 20;
/// Every piece of a table starts at a multiple of this many bytes.
pub const TABLE_ALIGN: usize = 8;

const TABLE: &str = "urom domain table";

message_family! {
    /// Every domain body that travels on a data channel.
    pub enum DomainMessage<'a> {
        /// [`AddressRequest`].
        DomainAddressRequest(AddressRequest),
        /// [`AddressReply`].
        DomainAddressReply(AddressReply<'a>),
        /// [`TableChunk`].
        DomainTableChunk(TableChunk<'a>),
        /// [`TableAck`].
        DomainTableAck(TableAck),
    }
}

impl DomainMessage<'_> {
    /// Whether frames of `kind` (a raw frame kind) belong to this family.
    pub const fn is_domain_kind(kind: u16) -> bool {
        kind >> 4 == 0x021
    }
}

/// Host -> worker: what is the address of your plugin `plugin`? The worker answers itself, by
/// the plugin's `addr` operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressRequest {
    /// The host's request id; the reply carries it.
    pub request: u64,
    /// The plugin's id on this worker.
    pub plugin: u64,
}

/// Worker -> host: a plugin's address, or why there is none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressReply<'a> {
    /// The request this answers.
    pub request: u64,
    /// The plugin asked about.
    pub plugin: u64,
    /// `Success`, `NotFound` (the worker does not run that plugin), the plugin's error, or
    /// `TooBig` (the address does not fit a frame).
    pub status: Status,
    /// The address; empty unless the status is `Success`.
    pub address: &'a [u8],
}

/// Host -> worker: bytes `offset..offset + bytes.len()` of a table of `table_len` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableChunk<'a> {
    /// The host's request id, the same for every chunk of one table; the ack carries it.
    pub request: u64,
    /// The whole table's length: at least a [`TableHeader`], at most [`MAX_TABLE_LEN`].
    pub table_len: u64,
    /// Where these bytes go in the table.
    pub offset: u64,
    /// At least one byte, and no more than the table has left after `offset`.
    pub bytes: &'a [u8],
}

/// Worker -> host: the table of a request was taken (`Success`), or why not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableAck {
    /// The request this answers.
    pub request: u64,
    /// The outcome.
    pub status: Status,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct AddressRequestWire {
    request: U64,
    plugin: U64,
}
assert_eq_size!(AddressRequestWire, [u8; 16]);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct AddressReplyWire {
    request: U64,
    plugin: U64,
    status: I32,
    reserved: U32,
}
assert_eq_size!(AddressReplyWire, [u8; 24]);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct TableChunkWire {
    request: U64,
    table_len: U64,
    offset: U64,
}
assert_eq_size!(TableChunkWire, [u8; 24]);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct TableAckWire {
    request: U64,
    status: I32,
    reserved: U32,
}
assert_eq_size!(TableAckWire, [u8; 16]);

/// Bytes of a [`DomainMessage::DomainTableChunk`] body before its table bytes.
pub const TABLE_CHUNK_HEADER_LEN: usize = size_of::<TableChunkWire>();
/// Bytes of a [`DomainMessage::DomainAddressReply`] body before the address.
pub const ADDRESS_REPLY_HEADER_LEN: usize = size_of::<AddressReplyWire>();

impl Message<'_> for AddressRequest {
    const FIXED_LEN: usize = size_of::<AddressRequestWire>();

    fn parse(body: &[u8]) -> Result<Self, DecodeError> {
        let wire = exact::<AddressRequestWire>(body)?;
        Ok(Self {
            request: wire.request.get(),
            plugin: wire.plugin.get(),
        })
    }

    fn emit(&self, dst: &mut [u8]) -> Result<(), EncodeError> {
        put(
            dst,
            &AddressRequestWire {
                request: U64::new(self.request),
                plugin: U64::new(self.plugin),
            },
        );
        Ok(())
    }
}

impl<'a> Message<'a> for AddressReply<'a> {
    const FIXED_LEN: usize = ADDRESS_REPLY_HEADER_LEN;

    fn parse(body: &'a [u8]) -> Result<Self, DecodeError> {
        let (wire, address) = prefix::<AddressReplyWire>(body)?;
        reserved_zero("address_reply.reserved", wire.reserved.get().into())?;
        let status = Status::from_raw(wire.status.get());
        if !status.is_success() && !address.is_empty() {
            return Err(DecodeError::TrailingBytes {
                expected: ADDRESS_REPLY_HEADER_LEN,
                found: body.len(),
            });
        }
        Ok(Self {
            request: wire.request.get(),
            plugin: wire.plugin.get(),
            status,
            address,
        })
    }

    fn body_len(&self) -> usize {
        ADDRESS_REPLY_HEADER_LEN + self.address.len()
    }

    fn emit(&self, dst: &mut [u8]) -> Result<(), EncodeError> {
        if !self.status.is_success() && !self.address.is_empty() {
            return Err(EncodeError::TooMany {
                field: "address of a failed address reply",
                count: self.address.len(),
                max: 0,
            });
        }
        let wire = AddressReplyWire {
            request: U64::new(self.request),
            plugin: U64::new(self.plugin),
            status: I32::new(self.status.raw()),
            reserved: U32::ZERO,
        };
        put(dst, &wire).copy_from_slice(self.address);
        Ok(())
    }
}

impl<'a> TableChunk<'a> {
    /// Checks the chunk's fields against one another.
    fn check(&self) -> Result<(), DecodeError> {
        if self.table_len > MAX_TABLE_LEN {
            return Err(DecodeError::TooLong {
                length: usize::try_from(self.table_len).unwrap_or(usize::MAX),
                max: MAX_TABLE_LEN as usize,
            });
        }
        let table_len = self.table_len as usize;
        if table_len < TABLE_HEADER_LEN {
            return Err(DecodeError::LengthBelowHeader {
                length: table_len,
                header: TABLE_HEADER_LEN,
            });
        }
        if self.bytes.is_empty() {
            return Err(DecodeError::Truncated {
                needed: 1,
                available: 0,
            });
        }
        let left = table_len.saturating_sub(usize::try_from(self.offset).unwrap_or(usize::MAX));
        if self.bytes.len() > left {
            return Err(DecodeError::TrailingBytes {
                expected: left,
                found: self.bytes.len(),
            });
        }
        Ok(())
    }
}

impl<'a> Message<'a> for TableChunk<'a> {
    const FIXED_LEN: usize = TABLE_CHUNK_HEADER_LEN;

    fn parse(body: &'a [u8]) -> Result<Self, DecodeError> {
        let (wire, bytes) = prefix::<TableChunkWire>(body)?;
        let chunk = Self {
            request: wire.request.get(),
            table_len: wire.table_len.get(),
            offset: wire.offset.get(),
            bytes,
        };
        chunk.check()?;
        Ok(chunk)
    }

    fn body_len(&self) -> usize {
        TABLE_CHUNK_HEADER_LEN + self.bytes.len()
    }

    fn emit(&self, dst: &mut [u8]) -> Result<(), EncodeError> {
        self.check().map_err(|_| EncodeError::TooMany {
            field: "table chunk bytes",
            count: self.bytes.len(),
            max: usize::try_from(self.table_len.saturating_sub(self.offset)).unwrap_or(usize::MAX),
        })?;
        let wire = TableChunkWire {
            request: U64::new(self.request),
            table_len: U64::new(self.table_len),
            offset: U64::new(self.offset),
        };
        put(dst, &wire).copy_from_slice(self.bytes);
        Ok(())
    }
}

impl Message<'_> for TableAck {
    const FIXED_LEN: usize = size_of::<TableAckWire>();

    fn parse(body: &[u8]) -> Result<Self, DecodeError> {
        let wire = exact::<TableAckWire>(body)?;
        reserved_zero("table_ack.reserved", wire.reserved.get().into())?;
        Ok(Self {
            request: wire.request.get(),
            status: Status::from_raw(wire.status.get()),
        })
    }

    fn emit(&self, dst: &mut [u8]) -> Result<(), EncodeError> {
        put(
            dst,
            &TableAckWire {
                request: U64::new(self.request),
                status: I32::new(self.status.raw()),
                reserved: U32::ZERO,
            },
        );
        Ok(())
    }
}

/// The wire layout of a table's header.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct TableHeader {
    /// [`TABLE_MAGIC`].
    pub magic: [u8; 4],
    /// [`TABLE_VERSION`].
    pub version: U16,
    /// Must be zero.
    pub reserved: U16,
    /// How many records follow, one per rank.
    pub ranks: U32,
    /// Must be zero.
    pub reserved2: U32,
    /// The whole table's length, header included.
    pub length: U64,
}
assert_eq_size!(TableHeader, [u8; 24]);

/// Length of [`TableHeader`].
pub const TABLE_HEADER_LEN: usize = size_of::<TableHeader>();

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct RecordHeader {
    length: U64,
    rank: U32,
    members: U32,
    buffers: U32,
    reserved: U32,
}
assert_eq_size!(RecordHeader, [u8; 24]);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct MemberHeader {
    domain_id: U64,
    plugins: U32,
    reserved: U32,
}
assert_eq_size!(MemberHeader, [u8; 16]);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct PluginAddressHeader {
    name: [u8; PLUGIN_NAME_LEN],
    len: U32,
    reserved: U32,
}
assert_eq_size!(PluginAddressHeader, [u8; 56]);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct BufferHeader {
    va: U64,
    len: U64,
    memh_len: U32,
    mkey_len: U32,
}
assert_eq_size!(BufferHeader, [u8; 24]);

/// Length of a record's fixed part.
pub const RECORD_HEADER_LEN: usize = size_of::<RecordHeader>();

/// `len` rounded up to [`TABLE_ALIGN`], or `None` on overflow.
const fn padded(len: usize) -> Option<usize> {
    match len.checked_add(TABLE_ALIGN - 1) {
        Some(n) => Some(n & !(TABLE_ALIGN - 1)),
        None => None,
    }
}

/// Splits a padded byte string of `len` bytes off the front of `bytes`: the string, and what
/// follows its padding. The padding must be zero.
fn take_padded<'a>(
    field: &'static str,
    bytes: &'a [u8],
    len: usize,
) -> Result<(&'a [u8], &'a [u8]), DecodeError> {
    let whole = padded(len).ok_or(DecodeError::Truncated {
        needed: usize::MAX,
        available: bytes.len(),
    })?;
    if bytes.len() < whole {
        return Err(DecodeError::Truncated {
            needed: whole,
            available: bytes.len(),
        });
    }
    let (string, rest) = bytes.split_at(whole);
    let (data, padding) = string.split_at(len);
    if padding.iter().any(|&b| b != 0) {
        return Err(DecodeError::ReservedNotZero { field });
    }
    Ok((data, rest))
}

/// Writes `data` and its zero padding at the front of `dst`; returns what follows.
fn put_padded<'d>(dst: &'d mut [u8], data: &[u8]) -> &'d mut [u8] {
    let whole = padded(data.len()).unwrap_or(data.len());
    let (string, rest) = dst.split_at_mut(whole);
    let (head, padding) = string.split_at_mut(data.len());
    head.copy_from_slice(data);
    padding.fill(0);
    rest
}

/// A plugin's address in a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PluginAddress<'a> {
    /// The plugin's name (`worker_sandbox`): its file name without `.so`.
    pub name: &'a str,
    /// What its `addr` operation returned.
    pub address: &'a [u8],
}

impl<'a> PluginAddress<'a> {
    fn parse(bytes: &'a [u8]) -> Result<(Self, &'a [u8]), DecodeError> {
        let (header, rest) = prefix::<PluginAddressHeader>(bytes)?;
        let name = decode_padded("plugin name", &header.name)?;
        reserved_zero("plugin_address.reserved", header.reserved.get().into())?;
        let (address, rest) = take_padded("address padding", rest, header.len.get() as usize)?;
        Ok((Self { name, address }, rest))
    }

    fn encoded_len(&self) -> usize {
        size_of::<PluginAddressHeader>().saturating_add(padded_len(self.address.len()))
    }

    fn emit<'d>(&self, dst: &'d mut [u8]) -> Result<&'d mut [u8], EncodeError> {
        let mut header = PluginAddressHeader {
            name: [0; PLUGIN_NAME_LEN],
            len: U32::new(count_u32("plugin address", self.address.len())?),
            reserved: U32::ZERO,
        };
        encode_padded("plugin name", &mut header.name, self.name)?;
        Ok(put_padded(put(dst, &header), self.address))
    }
}

fn padded_len(len: usize) -> usize {
    padded(len).unwrap_or(usize::MAX)
}

/// A buffer in a record: a host's memory that the domain's plugins may reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buffer<'a> {
    /// Its address in the host's memory.
    pub va: u64,
    /// Its length in bytes.
    pub len: u64,
    /// The packed memory handle (empty when the host has none to export).
    pub memh: &'a [u8],
    /// The packed remote key (empty when the host has none).
    pub mkey: &'a [u8],
}

impl<'a> Buffer<'a> {
    fn parse(bytes: &'a [u8]) -> Result<(Self, &'a [u8]), DecodeError> {
        let (header, rest) = prefix::<BufferHeader>(bytes)?;
        let (memh, rest) = take_padded("memh padding", rest, header.memh_len.get() as usize)?;
        let (mkey, rest) = take_padded("mkey padding", rest, header.mkey_len.get() as usize)?;
        let buffer = Self {
            va: header.va.get(),
            len: header.len.get(),
            memh,
            mkey,
        };
        Ok((buffer, rest))
    }

    fn encoded_len(&self) -> usize {
        size_of::<BufferHeader>()
            .saturating_add(padded_len(self.memh.len()))
            .saturating_add(padded_len(self.mkey.len()))
    }

    fn emit<'d>(&self, dst: &'d mut [u8]) -> Result<&'d mut [u8], EncodeError> {
        let header = BufferHeader {
            va: U64::new(self.va),
            len: U64::new(self.len),
            memh_len: U32::new(count_u32("memory handle", self.memh.len())?),
            mkey_len: U32::new(count_u32("remote key", self.mkey.len())?),
        };
        let rest = put_padded(put(dst, &header), self.memh);
        Ok(put_padded(rest, self.mkey))
    }
}

/// A worker of a record, as read from it: its domain id and its plugins' addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member<'a> {
    /// The id plugins look it up by.
    pub domain_id: u64,
    plugins: u32,
    /// The plugin addresses, validated.
    bytes: &'a [u8],
}

impl<'a> Member<'a> {
    /// Validates one member; returns it and what follows.
    fn parse(bytes: &'a [u8]) -> Result<(Self, &'a [u8]), DecodeError> {
        let (header, mut rest) = prefix::<MemberHeader>(bytes)?;
        reserved_zero("member.reserved", header.reserved.get().into())?;
        let start = rest;
        for _ in 0..header.plugins.get() {
            rest = PluginAddress::parse(rest)?.1;
        }
        let member = Self {
            domain_id: header.domain_id.get(),
            plugins: header.plugins.get(),
            bytes: &start[..start.len() - rest.len()],
        };
        Ok((member, rest))
    }

    /// How many plugin addresses it has.
    pub fn plugin_count(&self) -> usize {
        self.plugins as usize
    }

    /// Its plugins' addresses.
    pub fn plugins(&self) -> PluginAddresses<'a> {
        PluginAddresses {
            left: self.plugins,
            bytes: self.bytes,
        }
    }
}

/// The plugin addresses of a [`Member`].
#[derive(Debug, Clone)]
pub struct PluginAddresses<'a> {
    left: u32,
    bytes: &'a [u8],
}

impl<'a> Iterator for PluginAddresses<'a> {
    type Item = PluginAddress<'a>;

    fn next(&mut self) -> Option<Self::Item> {
        self.left = self.left.checked_sub(1)?;
        // Validated when the record was parsed.
        let (plugin, rest) = PluginAddress::parse(self.bytes).ok()?;
        self.bytes = rest;
        Some(plugin)
    }
}

/// The members of a record.
#[derive(Debug, Clone)]
pub struct Members<'a> {
    left: u32,
    bytes: &'a [u8],
}

impl<'a> Iterator for Members<'a> {
    type Item = Member<'a>;

    fn next(&mut self) -> Option<Self::Item> {
        self.left = self.left.checked_sub(1)?;
        let (member, rest) = Member::parse(self.bytes).ok()?;
        self.bytes = rest;
        Some(member)
    }
}

/// The buffers of a record.
#[derive(Debug, Clone)]
pub struct Buffers<'a> {
    left: u32,
    bytes: &'a [u8],
}

impl<'a> Iterator for Buffers<'a> {
    type Item = Buffer<'a>;

    fn next(&mut self) -> Option<Self::Item> {
        self.left = self.left.checked_sub(1)?;
        let (buffer, rest) = Buffer::parse(self.bytes).ok()?;
        self.bytes = rest;
        Some(buffer)
    }
}

/// One rank's record, as read: validated, its parts read through [`RecordRepr::members`] and
/// [`RecordRepr::buffers`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordRepr<'a> {
    /// The rank of the host that wrote it.
    pub rank: u32,
    members: u32,
    member_bytes: &'a [u8],
    buffers: u32,
    buffer_bytes: &'a [u8],
    /// The whole record.
    bytes: &'a [u8],
}

impl<'a> RecordRepr<'a> {
    /// Reads a record that fills `bytes` exactly.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, DecodeError> {
        let (record, rest) = Self::parse_prefix(bytes)?;
        if !rest.is_empty() {
            return Err(DecodeError::TrailingBytes {
                expected: record.bytes.len(),
                found: bytes.len(),
            });
        }
        Ok(record)
    }

    /// Reads the record at the front of `bytes`; returns it and the bytes after it.
    pub fn parse_prefix(bytes: &'a [u8]) -> Result<(Self, &'a [u8]), DecodeError> {
        let (header, _) = prefix::<RecordHeader>(bytes)?;
        let claimed = header.length.get();
        let length = usize::try_from(claimed).unwrap_or(usize::MAX);
        if length < RECORD_HEADER_LEN {
            return Err(DecodeError::LengthBelowHeader {
                length,
                header: RECORD_HEADER_LEN,
            });
        }
        if length > bytes.len() {
            return Err(DecodeError::Truncated {
                needed: length,
                available: bytes.len(),
            });
        }
        let (record, after) = bytes.split_at(length);
        reserved_zero("record.reserved", header.reserved.get().into())?;
        let body = &record[RECORD_HEADER_LEN..];
        let mut rest = body;
        for _ in 0..header.members.get() {
            rest = Member::parse(rest)?.1;
        }
        let member_bytes = &body[..body.len() - rest.len()];
        let buffers_start = rest;
        for _ in 0..header.buffers.get() {
            rest = Buffer::parse(rest)?.1;
        }
        let buffer_bytes = &buffers_start[..buffers_start.len() - rest.len()];
        if !rest.is_empty() {
            return Err(DecodeError::TrailingBytes {
                expected: length - rest.len(),
                found: length,
            });
        }
        let repr = Self {
            rank: header.rank.get(),
            members: header.members.get(),
            member_bytes,
            buffers: header.buffers.get(),
            buffer_bytes,
            bytes: record,
        };
        Ok((repr, after))
    }

    /// The record's bytes.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// How many members it has.
    pub fn member_count(&self) -> usize {
        self.members as usize
    }

    /// How many buffers it has.
    pub fn buffer_count(&self) -> usize {
        self.buffers as usize
    }

    /// Its members (the host's workers), in order.
    pub fn members(&self) -> Members<'a> {
        Members {
            left: self.members,
            bytes: self.member_bytes,
        }
    }

    /// Its buffers, in segment order.
    pub fn buffers(&self) -> Buffers<'a> {
        Buffers {
            left: self.buffers,
            bytes: self.buffer_bytes,
        }
    }
}

/// A worker to write into a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberSpec<'a> {
    /// Its domain id.
    pub domain_id: u64,
    /// Its plugins' addresses.
    pub plugins: &'a [PluginAddress<'a>],
}

/// A record to write: one rank's members and buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordSpec<'a> {
    /// The writer's rank.
    pub rank: u32,
    /// Its workers.
    pub members: &'a [MemberSpec<'a>],
    /// Its buffers, in segment order.
    pub buffers: &'a [Buffer<'a>],
}

impl RecordSpec<'_> {
    /// How many bytes [`RecordSpec::emit`] writes.
    pub fn buffer_len(&self) -> usize {
        let members = self.members.iter().fold(0usize, |sum, member| {
            member.plugins.iter().fold(
                sum.saturating_add(size_of::<MemberHeader>()),
                |sum, plugin| sum.saturating_add(plugin.encoded_len()),
            )
        });
        self.buffers
            .iter()
            .fold(RECORD_HEADER_LEN.saturating_add(members), |sum, buffer| {
                sum.saturating_add(buffer.encoded_len())
            })
    }

    /// Writes the record at the start of `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EncodeError> {
        let length = self.buffer_len();
        if length as u64 > MAX_TABLE_LEN {
            return Err(EncodeError::TooLong {
                length,
                max: MAX_TABLE_LEN as usize,
            });
        }
        let available = buf.len();
        let out = buf.get_mut(..length).ok_or(EncodeError::BufferTooSmall {
            needed: length,
            available,
        })?;
        let header = RecordHeader {
            length: U64::new(length as u64),
            rank: U32::new(self.rank),
            members: U32::new(count_u32("members", self.members.len())?),
            buffers: U32::new(count_u32("buffers", self.buffers.len())?),
            reserved: U32::ZERO,
        };
        let mut rest = put(out, &header);
        for member in self.members {
            let header = MemberHeader {
                domain_id: U64::new(member.domain_id),
                plugins: U32::new(count_u32("plugins", member.plugins.len())?),
                reserved: U32::ZERO,
            };
            rest = put(rest, &header);
            for plugin in member.plugins {
                rest = plugin.emit(rest)?;
            }
        }
        for buffer in self.buffers {
            rest = buffer.emit(rest)?;
        }
        debug_assert!(rest.is_empty());
        Ok(length)
    }
}

/// A whole table, as read: validated, its records in rank order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableRepr<'a> {
    /// How many ranks the domain has.
    pub ranks: u32,
    records: &'a [u8],
}

impl<'a> TableRepr<'a> {
    /// Reads a table that fills `bytes` exactly: header, then one valid record per rank, the
    /// record at position `i` being rank `i`'s.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, DecodeError> {
        let (header, mut rest) = prefix::<TableHeader>(bytes)?;
        magic(TABLE, &header.magic, &TABLE_MAGIC)?;
        version(TABLE, header.version.get().into(), TABLE_VERSION.into())?;
        reserved_zero("table.reserved", header.reserved.get().into())?;
        reserved_zero("table.reserved2", header.reserved2.get().into())?;
        let length = usize::try_from(header.length.get()).unwrap_or(usize::MAX);
        crate::codec::check_exact_len(length, bytes.len())?;
        let records = rest;
        for rank in 0..header.ranks.get() {
            let (record, after) = RecordRepr::parse_prefix(rest)?;
            if record.rank != rank {
                return Err(DecodeError::RankMismatch {
                    expected: rank,
                    found: record.rank,
                });
            }
            rest = after;
        }
        if !rest.is_empty() {
            return Err(DecodeError::TrailingBytes {
                expected: bytes.len() - rest.len(),
                found: bytes.len(),
            });
        }
        Ok(Self {
            ranks: header.ranks.get(),
            records,
        })
    }

    /// The records, rank 0 first.
    pub fn records(&self) -> Records<'a> {
        Records {
            left: self.ranks,
            bytes: self.records,
        }
    }

    /// The length of a table of `records` (each a whole record).
    pub fn buffer_len(records: &[&[u8]]) -> usize {
        records.iter().fold(TABLE_HEADER_LEN, |sum, record| {
            sum.saturating_add(record.len())
        })
    }

    /// Writes a table of `records` (each a whole, valid record, rank 0 first) at the start of
    /// `buf`; returns its length.
    pub fn emit(records: &[&[u8]], buf: &mut [u8]) -> Result<usize, EncodeError> {
        let length = Self::buffer_len(records);
        if length as u64 > MAX_TABLE_LEN {
            return Err(EncodeError::TooLong {
                length,
                max: MAX_TABLE_LEN as usize,
            });
        }
        let header = TableHeader {
            magic: TABLE_MAGIC,
            version: U16::new(TABLE_VERSION),
            reserved: U16::ZERO,
            ranks: U32::new(count_u32("ranks", records.len())?),
            reserved2: U32::ZERO,
            length: U64::new(length as u64),
        };
        let available = buf.len();
        let out = buf.get_mut(..length).ok_or(EncodeError::BufferTooSmall {
            needed: length,
            available,
        })?;
        let mut rest = put(out, &header);
        for record in records {
            let (head, tail) = rest.split_at_mut(record.len());
            head.copy_from_slice(record);
            rest = tail;
        }
        Ok(length)
    }
}

/// The records of a table.
#[derive(Debug, Clone)]
pub struct Records<'a> {
    left: u32,
    bytes: &'a [u8],
}

impl<'a> Iterator for Records<'a> {
    type Item = RecordRepr<'a>;

    fn next(&mut self) -> Option<Self::Item> {
        self.left = self.left.checked_sub(1)?;
        let (record, rest) = RecordRepr::parse_prefix(self.bytes).ok()?;
        self.bytes = rest;
        Some(record)
    }
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct JoinWire {
    record_len: U64,
    status: I32,
    reserved: U32,
}
assert_eq_size!(JoinWire, [u8; 16]);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct ReadyWire {
    status: I32,
    reserved: U32,
}
assert_eq_size!(ReadyWire, [u8; 8]);

/// Length of a [`JoinBlock`].
pub const JOIN_BLOCK_LEN: usize = size_of::<JoinWire>();
/// Length of a [`ReadyBlock`].
pub const READY_BLOCK_LEN: usize = size_of::<ReadyWire>();

/// A rank's block of the first allgather: the length of its record, or why it cannot take
/// part (then every rank gives up after this round).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JoinBlock {
    /// The length of the rank's record (0 when it failed).
    pub record_len: u64,
    /// `Success`, or why the rank cannot take part.
    pub status: Status,
}

impl JoinBlock {
    /// Reads a block of exactly [`JOIN_BLOCK_LEN`] bytes.
    pub fn parse(bytes: &[u8]) -> Result<Self, DecodeError> {
        let wire = exact::<JoinWire>(bytes)?;
        reserved_zero("join.reserved", wire.reserved.get().into())?;
        Ok(Self {
            record_len: wire.record_len.get(),
            status: Status::from_raw(wire.status.get()),
        })
    }

    /// Writes the block at the start of `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EncodeError> {
        put_whole(
            buf,
            &JoinWire {
                record_len: U64::new(self.record_len),
                status: I32::new(self.status.raw()),
                reserved: U32::ZERO,
            },
        )
    }
}

/// A rank's block of the last allgather: whether all its workers took the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadyBlock {
    /// `Success`, or why the rank's workers did not all take the table.
    pub status: Status,
}

impl ReadyBlock {
    /// Reads a block of exactly [`READY_BLOCK_LEN`] bytes.
    pub fn parse(bytes: &[u8]) -> Result<Self, DecodeError> {
        let wire = exact::<ReadyWire>(bytes)?;
        reserved_zero("ready.reserved", wire.reserved.get().into())?;
        Ok(Self {
            status: Status::from_raw(wire.status.get()),
        })
    }

    /// Writes the block at the start of `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EncodeError> {
        put_whole(
            buf,
            &ReadyWire {
                status: I32::new(self.status.raw()),
                reserved: U32::ZERO,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_rounds_up_to_eight() {
        assert_eq!(padded(0), Some(0));
        assert_eq!(padded(1), Some(8));
        assert_eq!(padded(8), Some(8));
        assert_eq!(padded(9), Some(16));
        assert_eq!(padded(usize::MAX), None);
    }

    #[test]
    fn only_the_domain_kinds_are_domain_kinds() {
        for kind in crate::FrameKind::ALL {
            let domain = matches!(
                kind,
                crate::FrameKind::DomainAddressRequest
                    | crate::FrameKind::DomainAddressReply
                    | crate::FrameKind::DomainTableChunk
                    | crate::FrameKind::DomainTableAck
            );
            assert_eq!(
                DomainMessage::is_domain_kind(kind.raw()),
                domain,
                "{kind:?}"
            );
        }
    }
}
