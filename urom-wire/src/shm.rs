//! The shared-memory transport's byte formats: the handshake on the Unix socket that passes a
//! mapping, and the header at the start of that mapping.
//!
//! All integers little-endian. Handshake messages (16 bytes each):
//!
//! ```text
//! request 0 [8] magic "UROMRQST" | 8 u32 version (SHM_HANDSHAKE_VERSION) | 12 u32 slots
//! hello   0 [8] magic "UROMHELO" | 8 u32 version (SHM_HANDSHAKE_VERSION) | 12 u32 reserved (zero)
//! ack     0 [8] magic "UROMACK\0" | 8 u32 status (ShmAckStatus) | 12 u32 detail
//! ```
//!
//! The side that will accept the mapping speaks first: its request says how many slots per
//! ring it wants (the most frames it keeps in flight; 0: the creator's default), so that each
//! peer of a creator that serves many (a worker and its hosts) gets rings of its own size. The
//! creator of a mapping then sends the hello with [`SHM_HELLO_DESCRIPTORS`] descriptors attached
//! (`SCM_RIGHTS`; the struct does not encode them: which they are is the transport's business).
//! The acceptor answers with the ack; `detail` qualifies the status: the version found for a
//! hello of another version ([`ShmAckStatus::BadLayout`]), the acceptor's maximum message size
//! ([`ShmAckStatus::MaxMsgSize`]), the OS error number ([`ShmAckStatus::System`]), else 0.
//! [`ShmHelloRepr::parse`] reports a hello of another version as
//! [`DecodeError::UnsupportedFormatVersion`], whose `found` is that version.
//!
//! The mapping header (128 bytes at offset 0 of the mapping, written by the creator before it
//! shares the mapping):
//!
//! ```text
//! offset  size  field
//!      0     8  magic        "UROMSHM\0"
//!      8     4  version      MAPPING_VERSION
//!     12     4  header_len   128
//!     16     4  slot_size    bytes a slot holds (the maximum message size)
//!     20     4  slot_count   slots per ring
//!     24     4  stride       bytes from one slot to the next
//!     28     4  ctl[0]       offset of ring 0's control block
//!     32     4  ctl[1]       offset of ring 1's control block
//!     36     4  reserved     zero
//!     40     8  slots[0]     offset of ring 0's slots
//!     48     8  slots[1]     offset of ring 1's slots
//!     56     8  total        bytes of the whole layout
//!     64    64  reserved     zero
//! ```
//!
//! [`MappingHeaderRepr::parse`] checks magic, version, `header_len` and the reserved bytes;
//! whether the other fields agree with each other (the layout that `slot_size` and
//! `slot_count` imply) is for the transport to check. Read the header into private memory
//! before parsing it: the peer can write the mapping at any time.

use static_assertions::assert_eq_size;
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::codec::{
    exact, fixed_length, magic, put_whole, reserved_bytes_zero, reserved_zero, version,
};
use crate::{DecodeError, EncodeError};

/// The first bytes of a handshake request.
pub const SHM_REQUEST_MAGIC: [u8; 8] = *b"UROMRQST";
/// The first bytes of a handshake hello.
pub const SHM_HELLO_MAGIC: [u8; 8] = *b"UROMHELO";
/// The first bytes of a handshake ack.
pub const SHM_ACK_MAGIC: [u8; 8] = *b"UROMACK\0";
/// The handshake version this build speaks (3: the acceptor's request comes first).
pub const SHM_HANDSHAKE_VERSION: u32 = 3;
/// How many descriptors travel with a hello of [`SHM_HANDSHAKE_VERSION`].
pub const SHM_HELLO_DESCRIPTORS: usize = 5;
/// The first bytes of a mapping: `b"UROMSHM\0"` as a little-endian integer.
pub const MAPPING_MAGIC: u64 = u64::from_le_bytes(*b"UROMSHM\0");
/// The mapping layout version this build speaks (2: slots marked by the frame's own sequence
/// number, see `urom_core`'s shared-memory ring).
pub const MAPPING_VERSION: u32 = 2;

const REQUEST: &str = "urom shared-memory request";
const HELLO: &str = "urom shared-memory hello";
const ACK: &str = "urom shared-memory ack";
const MAPPING: &str = "urom shared-memory mapping";

/// The wire layout of the handshake request.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct ShmRequest {
    /// [`SHM_REQUEST_MAGIC`].
    pub magic: [u8; 8],
    /// [`SHM_HANDSHAKE_VERSION`].
    pub version: U32,
    /// Slots per ring the acceptor asks for; 0 for the creator's default.
    pub slots: U32,
}
assert_eq_size!(ShmRequest, [u8; 16]);

/// Length of [`ShmRequest`].
pub const SHM_REQUEST_LEN: usize = size_of::<ShmRequest>();

/// The wire layout of the handshake hello.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct ShmHello {
    /// [`SHM_HELLO_MAGIC`].
    pub magic: [u8; 8],
    /// [`SHM_HANDSHAKE_VERSION`].
    pub version: U32,
    /// Must be zero.
    pub reserved: U32,
}
assert_eq_size!(ShmHello, [u8; 16]);

/// Length of [`ShmHello`].
pub const SHM_HELLO_LEN: usize = size_of::<ShmHello>();

/// The wire layout of the handshake ack.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct ShmAck {
    /// [`SHM_ACK_MAGIC`].
    pub magic: [u8; 8],
    /// A [`ShmAckStatus`] code.
    pub status: U32,
    /// Qualifies the status; see the module documentation.
    pub detail: U32,
}
assert_eq_size!(ShmAck, [u8; 16]);

/// Length of [`ShmAck`].
pub const SHM_ACK_LEN: usize = size_of::<ShmAck>();

int_enum! {
    /// The acceptor's answer to a hello.
    open ShmAckStatus: u32, other Unknown {
        /// The mapping is mapped; the connection is up.
        Ok = 0,
        /// The hello's version or the mapping's layout is unusable.
        BadLayout = 1,
        /// The mapping's slot size is not the acceptor's maximum message size (in `detail`).
        MaxMsgSize = 2,
        /// A system call failed on the acceptor's side (its error number in `detail`).
        System = 3,
    }
}

/// A request: the slots per ring the acceptor asks for (0: the creator's default). The
/// creator gives at most as many as its own maximum message size allows, and at least
/// `MIN_SLOTS` of the transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ShmRequestRepr {
    /// Slots per ring asked for.
    pub slots: u32,
}

impl ShmRequestRepr {
    /// Reads a request; `bytes` must hold exactly one. One of another version is
    /// [`DecodeError::UnsupportedFormatVersion`]; bytes with another magic are
    /// [`DecodeError::WrongMagic`].
    pub fn parse(bytes: &[u8]) -> Result<Self, DecodeError> {
        let wire: &ShmRequest = exact(bytes)?;
        magic(REQUEST, &wire.magic, &SHM_REQUEST_MAGIC)?;
        version(REQUEST, wire.version.get(), SHM_HANDSHAKE_VERSION)?;
        Ok(Self {
            slots: wire.slots.get(),
        })
    }

    /// The length of a request: [`SHM_REQUEST_LEN`].
    pub const fn buffer_len(&self) -> usize {
        SHM_REQUEST_LEN
    }

    /// The wire struct of this request.
    pub fn to_wire(&self) -> ShmRequest {
        ShmRequest {
            magic: SHM_REQUEST_MAGIC,
            version: U32::new(SHM_HANDSHAKE_VERSION),
            slots: U32::new(self.slots),
        }
    }

    /// The request's bytes.
    pub fn to_bytes(&self) -> [u8; SHM_REQUEST_LEN] {
        zerocopy::transmute!(self.to_wire())
    }

    /// Writes the request at the start of `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EncodeError> {
        put_whole(buf, &self.to_wire())
    }
}

/// A hello: it carries nothing but the handshake version, always [`SHM_HANDSHAKE_VERSION`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ShmHelloRepr;

impl ShmHelloRepr {
    /// Reads a hello; `bytes` must hold exactly one.
    ///
    /// A hello of another version is [`DecodeError::UnsupportedFormatVersion`], whose `found`
    /// the acceptor sends back in a [`ShmAckStatus::BadLayout`] ack; bytes with another magic
    /// are [`DecodeError::WrongMagic`].
    pub fn parse(bytes: &[u8]) -> Result<Self, DecodeError> {
        let wire: &ShmHello = exact(bytes)?;
        magic(HELLO, &wire.magic, &SHM_HELLO_MAGIC)?;
        version(HELLO, wire.version.get(), SHM_HANDSHAKE_VERSION)?;
        reserved_zero("shm_hello.reserved", wire.reserved.get().into())?;
        Ok(Self)
    }

    /// The length of a hello: [`SHM_HELLO_LEN`].
    pub const fn buffer_len(&self) -> usize {
        SHM_HELLO_LEN
    }

    /// The wire struct of a hello.
    pub fn to_wire(&self) -> ShmHello {
        ShmHello {
            magic: SHM_HELLO_MAGIC,
            version: U32::new(SHM_HANDSHAKE_VERSION),
            reserved: U32::ZERO,
        }
    }

    /// The hello's bytes.
    pub fn to_bytes(&self) -> [u8; SHM_HELLO_LEN] {
        zerocopy::transmute!(self.to_wire())
    }

    /// Writes the hello at the start of `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EncodeError> {
        put_whole(buf, &self.to_wire())
    }
}

/// An ack: the acceptor's status and its detail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ShmAckRepr {
    /// The outcome.
    pub status: ShmAckStatus,
    /// Qualifies the status; see the module documentation.
    pub detail: u32,
}

impl ShmAckRepr {
    /// The ack of an accepted mapping.
    pub const OK: Self = Self {
        status: ShmAckStatus::Ok,
        detail: 0,
    };

    /// Reads an ack; `bytes` must hold exactly one. Statuses this build does not know are kept
    /// in [`ShmAckStatus::Unknown`].
    pub fn parse(bytes: &[u8]) -> Result<Self, DecodeError> {
        let wire: &ShmAck = exact(bytes)?;
        magic(ACK, &wire.magic, &SHM_ACK_MAGIC)?;
        Ok(Self {
            status: ShmAckStatus::from_raw(wire.status.get()),
            detail: wire.detail.get(),
        })
    }

    /// The length of an ack: [`SHM_ACK_LEN`].
    pub const fn buffer_len(&self) -> usize {
        SHM_ACK_LEN
    }

    /// The wire struct of this ack.
    pub fn to_wire(&self) -> ShmAck {
        ShmAck {
            magic: SHM_ACK_MAGIC,
            status: U32::new(self.status.raw()),
            detail: U32::new(self.detail),
        }
    }

    /// The ack's bytes.
    pub fn to_bytes(&self) -> [u8; SHM_ACK_LEN] {
        zerocopy::transmute!(self.to_wire())
    }

    /// Writes the ack at the start of `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EncodeError> {
        put_whole(buf, &self.to_wire())
    }
}

/// The wire layout of the header at the start of a mapping.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct MappingHeader {
    /// [`MAPPING_MAGIC`].
    pub magic: U64,
    /// [`MAPPING_VERSION`].
    pub version: U32,
    /// [`MAPPING_HEADER_LEN`].
    pub header_len: U32,
    /// Bytes a slot holds.
    pub slot_size: U32,
    /// Slots per ring.
    pub slot_count: U32,
    /// Bytes from one slot to the next.
    pub stride: U32,
    /// Offsets of the two rings' control blocks.
    pub ctl: [U32; 2],
    /// Must be zero.
    pub reserved0: U32,
    /// Offsets of the two rings' slots.
    pub slots: [U64; 2],
    /// Bytes of the whole layout.
    pub total: U64,
    /// Must be zero.
    pub reserved1: [u8; 64],
}
assert_eq_size!(MappingHeader, [u8; 128]);

/// Length of [`MappingHeader`].
pub const MAPPING_HEADER_LEN: usize = size_of::<MappingHeader>();

/// What a mapping header says; magic, version and length are implied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MappingHeaderRepr {
    /// Bytes a slot holds (the maximum message size).
    pub slot_size: u32,
    /// Slots per ring.
    pub slot_count: u32,
    /// Bytes from one slot to the next.
    pub stride: u32,
    /// Offsets of the two rings' control blocks.
    pub ctl: [u32; 2],
    /// Offsets of the two rings' slots.
    pub slots: [u64; 2],
    /// Bytes of the whole layout.
    pub total: u64,
}

impl MappingHeaderRepr {
    /// Reads a header; `bytes` must be exactly [`MAPPING_HEADER_LEN`] bytes.
    ///
    /// Checks magic ([`DecodeError::WrongMagic`]), version
    /// ([`DecodeError::UnsupportedFormatVersion`]), `header_len`
    /// ([`DecodeError::LengthMismatch`]) and that the reserved bytes are zero, in that order;
    /// not whether the other fields describe a consistent layout.
    pub fn parse(bytes: &[u8]) -> Result<Self, DecodeError> {
        let wire: &MappingHeader = exact(bytes)?;
        magic(
            MAPPING,
            &wire.magic.get().to_le_bytes(),
            &MAPPING_MAGIC.to_le_bytes(),
        )?;
        version(MAPPING, wire.version.get(), MAPPING_VERSION)?;
        fixed_length(MAPPING_HEADER_LEN, wire.header_len.get() as usize)?;
        reserved_zero("mapping.reserved0", wire.reserved0.get().into())?;
        reserved_bytes_zero("mapping.reserved1", &wire.reserved1)?;
        Ok(Self {
            slot_size: wire.slot_size.get(),
            slot_count: wire.slot_count.get(),
            stride: wire.stride.get(),
            ctl: [wire.ctl[0].get(), wire.ctl[1].get()],
            slots: [wire.slots[0].get(), wire.slots[1].get()],
            total: wire.total.get(),
        })
    }

    /// The length of a header: [`MAPPING_HEADER_LEN`].
    pub const fn buffer_len(&self) -> usize {
        MAPPING_HEADER_LEN
    }

    /// The wire struct of this header.
    pub fn to_wire(&self) -> MappingHeader {
        MappingHeader {
            magic: U64::new(MAPPING_MAGIC),
            version: U32::new(MAPPING_VERSION),
            header_len: U32::new(MAPPING_HEADER_LEN as u32),
            slot_size: U32::new(self.slot_size),
            slot_count: U32::new(self.slot_count),
            stride: U32::new(self.stride),
            ctl: [U32::new(self.ctl[0]), U32::new(self.ctl[1])],
            reserved0: U32::ZERO,
            slots: [U64::new(self.slots[0]), U64::new(self.slots[1])],
            total: U64::new(self.total),
            reserved1: [0; 64],
        }
    }

    /// The header's bytes.
    pub fn to_bytes(&self) -> [u8; MAPPING_HEADER_LEN] {
        zerocopy::transmute!(self.to_wire())
    }

    /// Writes the header at the start of `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EncodeError> {
        put_whole(buf, &self.to_wire())
    }
}
