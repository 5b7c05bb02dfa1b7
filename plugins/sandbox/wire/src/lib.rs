//! The sandbox plugin's messages, shared by the plugin (`plugins/sandbox/worker`) and hosts: the DOCA
//! UROM sandbox sample's commands (memory map, tagged send, tagged receive) and notifications,
//! byte for byte.
//!
//! A command is a [`CommandWire`] (a `u64` type, then the C union), followed by the bytes the
//! command carries; a notification is a 48-byte [`NotificationWire`] (a `u64` type, then a
//! 40-byte union), followed by the bytes an inline receive got. Little-endian; offsets from
//! the start of the message.
//!
//! The command's union holds UCX's `ucp_mem_map_params_t`, so its size follows the UCX headers
//! the sender was compiled against: 40 bytes on UCX 1.13, 48 from 1.14 (which added
//! `exported_memh_buffer`). Every command, whatever its type, is then 64 bytes
//! ([`CommandLayout::Ucx113`]) or 72 bytes ([`CommandLayout::Ucx114`]) before what it carries:
//!
//! ```text
//! command          0 u64 type (0 MEM_MAP, 1 TAG_SEND, 2 TAG_RECV) | 8 union   = 64 or 72
//! MEM_MAP          8 u64 context | 16 ucp_mem_map_params_t:
//!                  16 u64 field_mask | 24 u64 address | 32 u64 length | 40 u32 flags
//!                  44 u32 prot | 48 u32 memory_type | 52 u32 pad
//!   UCX 1.13       56 u64 exported_memh_buffer_len                                   (64)
//!   UCX >= 1.14    56 u64 exported_memh_buffer (the sender's pointer; ignored)
//!                  64 u64 exported_memh_buffer_len                                   (72)
//!                  then that many bytes of exported memory handle
//! TAG_SEND         8 u64 context | 16 u64 dest (domain id) | 24 u64 buffer | 32 u64 count
//!                  40 u64 tag | 48 u64 memh_id (0: inline) | 56 pad (to 64 or 72);
//!                  then `count` bytes when inline, nothing otherwise
//! TAG_RECV         8 u64 context | 16 u64 buffer | 24 u64 count | 32 u64 tag
//!                  40 u64 tag_mask | 48 u64 memh_id (0: inline) | 56 pad (to 64 or 72)
//!
//! notification     0 u64 type (0 MEM_MAP, 1 TAG_SEND, 2 TAG_RECV) | 8 union         = 48
//! MEM_MAP          8 u64 context | 16 u64 memh_id
//! TAG_SEND         8 u64 context | 16 i32 status (UCX's)
//! TAG_RECV         8 u64 context | 16 u64 buffer (non-zero: the bytes follow) | 24 u64 count
//!                  32 u64 sender_tag | 40 i32 status (UCX's);
//!                  then `count` bytes when `buffer` is non-zero
//! ```
//!
//! [`SandboxCommand::unpack`] reads both layouts and tells them apart by the command's length
//! (the frame's length is known): a command is read in the layout whose fixed part plus the
//! bytes it says follow is exactly its length. For a send or a receive at most one layout can
//! fit (they differ by 8 bytes). A MEM_MAP fits both only when the word at 56 is the word at
//! 64 plus 8 (in the 1.14 layout that word is a pointer, so only for a pointer below a few
//! hundred, or a 1.13 memory handle whose first word is its length minus 8); then
//! `UCP_MEM_MAP_PARAM_FIELD_EXPORTED_MEMH_BUFFER` in its field mask, a field UCX 1.13 does not
//! have, picks the 1.14 layout, and its absence the 1.13 one. Any other length is refused
//! ([`SandboxError::BadCommandLength`], naming the length each layout calls for), as the
//! plugin answers `DOCA_ERROR_INVALID_VALUE`. [`SandboxCommand::pack`] writes the layout it is
//! given. The buffer variant of a send or receive (`memh_id` non-zero) names `count` bytes at
//! `buffer` in the host's memory, reached by the worker through the domain's keys; its
//! receive notification has `buffer` 0 (the bytes went to the host's memory).
//!
//! With the `timestamps` feature (which needs `std`), [`timestamps`] holds the plugin's
//! message timestamps: the recorder the plugin fills and the reading and pairing of its files.
#![no_std]
#![forbid(unsafe_code)]

#[cfg(feature = "timestamps")]
extern crate std;

#[cfg(feature = "timestamps")]
pub mod timestamps;

use core::fmt;

use static_assertions::assert_eq_size;
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use urom_wire::Status;

/// The `memh_id` of the buffer variant on workers whose UCX cannot import memory handles
/// (before 1.14): the buffer is in the sending host's memory, reached through the domain's
/// keys (any non-zero `memh_id` means the same there).
pub const DOMAIN_MEMH_ID: u64 = 1;

/// The plugin's name, as the daemon reports it (its file is `worker_sandbox.so`).
pub const NAME: &str = "worker_sandbox";
/// The plugin's version; hosts refuse a plugin of another version.
pub const VERSION: u64 = 0x01;

/// `UROM_WORKER_CMD_SANDBOX_MEM_MAP`.
pub const CMD_MEM_MAP: u64 = 0;
/// `UROM_WORKER_CMD_SANDBOX_TAG_SEND`.
pub const CMD_TAG_SEND: u64 = 1;
/// `UROM_WORKER_CMD_SANDBOX_TAG_RECV`.
pub const CMD_TAG_RECV: u64 = 2;
/// `UROM_WORKER_NOTIFY_SANDBOX_MEM_MAP`.
pub const NOTIFY_MEM_MAP: u64 = 0;
/// `UROM_WORKER_NOTIFY_SANDBOX_TAG_SEND`.
pub const NOTIFY_TAG_SEND: u64 = 1;
/// `UROM_WORKER_NOTIFY_SANDBOX_TAG_RECV`.
pub const NOTIFY_TAG_RECV: u64 = 2;

/// UCX 1.13's `ucp_mem_map_params_t`, as a MEM_MAP command carries it: also the first 40 bytes
/// of every later version's, which appends `exported_memh_buffer` (a pointer; 48 bytes in all).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct MemMapParamsWire {
    /// Which fields count (`UCP_MEM_MAP_PARAM_FIELD_*`).
    pub field_mask: U64,
    /// The memory's address.
    pub address: U64,
    /// Its length.
    pub length: U64,
    /// `UCP_MEM_MAP_*` flags.
    pub flags: U32,
    /// `UCP_MEM_MAP_PROT_*` protection.
    pub prot: U32,
    /// `ucs_memory_type_t`.
    pub memory_type: U32,
    /// Padding of the C struct.
    pub pad: U32,
}
assert_eq_size!(MemMapParamsWire, [u8; 40]);

/// The fixed part of every command and notification: its type, then the C union as `WORDS`
/// words (see the module docs for each type's fields).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct MessageWire<const WORDS: usize> {
    /// The type: `CMD_*` for a command, `NOTIFY_*` for a notification.
    pub kind: U64,
    /// The union, word by word.
    pub words: [U64; WORDS],
}

/// The fixed part of a command in the UCX 1.13 layout ([`CommandLayout::Ucx113`]):
/// [`CMD_MEM_MAP`], [`CMD_TAG_SEND`] or [`CMD_TAG_RECV`] and the union's 56 bytes as seven
/// words. Also the first 64 bytes of a command in the later layout.
pub type CommandWire = MessageWire<7>;
assert_eq_size!(CommandWire, [u8; 64]);

/// The fixed part of a command in the layout of UCX 1.14 and later
/// ([`CommandLayout::Ucx114`]): the type and the union's 64 bytes as eight words.
pub type CommandWireUcx114 = MessageWire<8>;
assert_eq_size!(CommandWireUcx114, [u8; 72]);

/// The fixed part of a notification: [`NOTIFY_MEM_MAP`], [`NOTIFY_TAG_SEND`] or
/// [`NOTIFY_TAG_RECV`] and the union's 40 bytes as five words.
pub type NotificationWire = MessageWire<5>;
assert_eq_size!(NotificationWire, [u8; 48]);

/// Bytes of a command before what it carries, in the UCX 1.13 layout.
pub const COMMAND_LEN_UCX_1_13: usize = size_of::<CommandWire>();
/// Bytes of a command before what it carries, in the layout of UCX 1.14 and later.
pub const COMMAND_LEN_UCX_1_14: usize = size_of::<CommandWireUcx114>();

/// `UCP_MEM_MAP_PARAM_FIELD_EXPORTED_MEMH_BUFFER` (UCX 1.14 and later): the field-mask bit of
/// a MEM_MAP that imports the exported memory handle it carries.
pub const MEM_MAP_FIELD_EXPORTED_MEMH_BUFFER: u64 = 1 << 5;

/// Which UCX's `ucp_mem_map_params_t` a command's union holds, and so how long its fixed part
/// is (see the module docs). A sender writes the layout of the UCX headers it was compiled
/// against; [`SandboxCommand::unpack`] reads both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CommandLayout {
    /// UCX 1.13: a 40-byte `ucp_mem_map_params_t`, 64-byte commands.
    Ucx113,
    /// UCX 1.14 and later: a 48-byte `ucp_mem_map_params_t` (with `exported_memh_buffer`),
    /// 72-byte commands; what DOCA's sandbox sample compiled against its UCX sends.
    Ucx114,
}

impl CommandLayout {
    /// The layout of a sender compiled against UCX `major.minor`.
    pub const fn for_ucx(major: u32, minor: u32) -> Self {
        if major > 1 || minor >= 14 {
            Self::Ucx114
        } else {
            Self::Ucx113
        }
    }

    /// Bytes of a command before what it carries: 64 or 72.
    pub const fn fixed_len(self) -> usize {
        match self {
            Self::Ucx113 => COMMAND_LEN_UCX_1_13,
            Self::Ucx114 => COMMAND_LEN_UCX_1_14,
        }
    }
}
/// Bytes of a notification before what it carries.
pub const NOTIFICATION_LEN: usize = size_of::<NotificationWire>();

/// The memory-map parameters of a MEM_MAP command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemMapParams {
    /// `field_mask`.
    pub field_mask: u64,
    /// `address`.
    pub address: u64,
    /// `length`.
    pub length: u64,
    /// `flags`.
    pub flags: u32,
    /// `prot`.
    pub prot: u32,
    /// `memory_type`.
    pub memory_type: u32,
    /// `exported_memh_buffer` (UCX 1.14 and later): the sender's pointer to the handle, which
    /// the receiver replaces with the bytes that follow the command; not in the 1.13 layout
    /// (0 when read from it).
    pub exported_memh_buffer: u64,
}

/// A sandbox command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxCommand<'a> {
    /// Map host memory from an exported memory handle (UCX 1.14 and later).
    MemMap {
        /// The host's context, returned in the notification.
        context: u64,
        /// The mapping's parameters.
        params: MemMapParams,
        /// The packed exported memory handle.
        exported_memh: &'a [u8],
    },
    /// Send `count` bytes to the worker with domain id `dest`, tagged `tag`.
    TagSend {
        /// The host's context.
        context: u64,
        /// The receiver's domain id.
        dest: u64,
        /// Where the bytes are in the host's memory (buffer variant); informational inline.
        buffer: u64,
        /// How many bytes.
        count: u64,
        /// The tag.
        tag: u64,
        /// 0: the bytes follow the command (`data`); else they are at `buffer`.
        memh_id: u64,
        /// The inline bytes (empty for the buffer variant).
        data: &'a [u8],
    },
    /// Receive at most `count` bytes tagged `tag` under `tag_mask`.
    TagRecv {
        /// The host's context.
        context: u64,
        /// Where the bytes go in the host's memory (buffer variant).
        buffer: u64,
        /// The most bytes to receive.
        count: u64,
        /// The tag to match.
        tag: u64,
        /// Which bits of the tag must match.
        tag_mask: u64,
        /// 0: the bytes come back in the notification; else they go to `buffer`.
        memh_id: u64,
    },
}

/// A sandbox notification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxNotification<'a> {
    /// A memory map finished.
    MemMap {
        /// The command's context.
        context: u64,
        /// The mapping's id, for the buffer variant of sends and receives.
        memh_id: u64,
    },
    /// A send finished.
    TagSend {
        /// The command's context.
        context: u64,
        /// UCX's status (0: sent).
        status: i32,
    },
    /// A receive finished.
    TagRecv {
        /// The command's context.
        context: u64,
        /// Non-zero when the bytes follow (inline); 0 when they went to the host's memory.
        buffer: u64,
        /// How many bytes arrived.
        count: u64,
        /// The sender's tag.
        sender_tag: u64,
        /// UCX's status (0: received).
        status: i32,
        /// The bytes, when inline.
        data: &'a [u8],
    },
}

/// Why sandbox bytes or a sandbox plugin were refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxError {
    /// A command's length is neither what the UCX 1.13 layout calls for nor what the layout of
    /// UCX 1.14 and later does (see the module docs).
    BadCommandLength {
        /// The command's type.
        kind: u64,
        /// Its length.
        len: usize,
        /// The length read in the UCX 1.13 layout: 64 plus the bytes it says follow.
        ucx_1_13: u64,
        /// The length read in the layout of UCX 1.14 and later: 72 plus the bytes it says
        /// follow (72 when it is too short to say).
        ucx_1_14: u64,
    },
    /// The message's length is not what its fixed part says.
    BadLength {
        /// Its length.
        len: usize,
        /// The length its fixed part calls for (0 when it is too short for one).
        expected: u64,
    },
    /// The message type is not one the sandbox plugin defines.
    UnknownType(u64),
    /// The buffer to pack into is too short.
    BufferTooSmall {
        /// Its length.
        len: usize,
        /// The message's length.
        needed: usize,
    },
    /// The service's sandbox plugin has another version than this host's.
    VersionMismatch {
        /// The version the service reported.
        found: u64,
    },
}

impl fmt::Display for SandboxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::BadLength { len, expected: 0 } => write!(
                f,
                "sandbox message of {len} bytes is shorter than its fixed part"
            ),
            Self::BadLength { len, expected } => write!(
                f,
                "sandbox message of {len} bytes; its header calls for {expected}"
            ),
            Self::BadCommandLength {
                kind,
                len,
                ucx_1_13,
                ucx_1_14,
            } => write!(
                f,
                "sandbox command of type {kind} is {len} bytes; expected {ucx_1_13} (a \
                 {COMMAND_LEN_UCX_1_13}-byte command, the layout of UCX 1.13's \
                 ucp_mem_map_params_t, and the bytes it says follow) or {ucx_1_14} (a \
                 {COMMAND_LEN_UCX_1_14}-byte command, the layout of UCX 1.14 and later)"
            ),
            Self::UnknownType(kind) => write!(f, "unknown sandbox message type {kind}"),
            Self::BufferTooSmall { len, needed } => write!(
                f,
                "buffer of {len} bytes cannot hold a {needed}-byte sandbox message"
            ),
            Self::VersionMismatch { found } => write!(
                f,
                "the service's sandbox plugin has version {found:#x}, this host speaks \
                 {VERSION:#x}"
            ),
        }
    }
}

impl core::error::Error for SandboxError {}

impl From<SandboxError> for Status {
    fn from(_: SandboxError) -> Self {
        Status::InvalidValue
    }
}

/// `Ok` when the service's sandbox plugin speaks this host's version.
pub fn check_version(found: u64) -> Result<(), SandboxError> {
    if found == VERSION {
        Ok(())
    } else {
        Err(SandboxError::VersionMismatch { found })
    }
}

/// The fixed part of `bytes` and what follows it.
fn split<T: FromBytes + KnownLayout + Immutable + Unaligned>(
    bytes: &[u8],
) -> Result<(&T, &[u8]), SandboxError> {
    T::ref_from_prefix(bytes).map_err(|_| SandboxError::BadLength {
        len: bytes.len(),
        expected: 0,
    })
}

/// `Ok` when `rest` is exactly `expected` bytes.
fn exact(fixed: usize, rest: &[u8], expected: u64) -> Result<(), SandboxError> {
    if rest.len() as u64 == expected {
        Ok(())
    } else {
        Err(SandboxError::BadLength {
            len: fixed + rest.len(),
            expected: (fixed as u64).saturating_add(expected),
        })
    }
}

/// Writes `fixed` then `data` at the start of `buf`; the length written.
fn put(buf: &mut [u8], fixed: &[u8], data: &[u8]) -> Result<usize, SandboxError> {
    let needed = fixed.len() + data.len();
    let Some(dst) = buf.get_mut(..needed) else {
        return Err(SandboxError::BufferTooSmall {
            len: buf.len(),
            needed,
        });
    };
    let (head, tail) = dst.split_at_mut(fixed.len());
    head.copy_from_slice(fixed);
    tail.copy_from_slice(data);
    Ok(needed)
}

fn words<const N: usize>(values: [u64; N]) -> [U64; N] {
    values.map(U64::new)
}

impl<'a> SandboxCommand<'a> {
    /// Its length packed in `layout`.
    pub fn buffer_len(&self, layout: CommandLayout) -> usize {
        layout.fixed_len()
            + match self {
                Self::MemMap { exported_memh, .. } => exported_memh.len(),
                Self::TagSend {
                    data, memh_id: 0, ..
                } => data.len(),
                Self::TagSend { .. } | Self::TagRecv { .. } => 0,
            }
    }

    /// Packs the command in `layout` into the start of `buf`, every byte of its fixed part
    /// written; returns its length. An inline send's `count` is written as its data's length.
    pub fn pack(&self, layout: CommandLayout, buf: &mut [u8]) -> Result<usize, SandboxError> {
        // The union's words; the last is padding (zero) for sends and receives.
        let mut w = [0u64; 8];
        let (kind, data) = match *self {
            Self::MemMap {
                context,
                params,
                exported_memh,
            } => {
                w[..6].copy_from_slice(&[
                    context,
                    params.field_mask,
                    params.address,
                    params.length,
                    u64::from(params.flags) | (u64::from(params.prot) << 32),
                    u64::from(params.memory_type),
                ]);
                let memh_len = exported_memh.len() as u64;
                match layout {
                    CommandLayout::Ucx113 => w[6] = memh_len,
                    CommandLayout::Ucx114 => {
                        w[6] = params.exported_memh_buffer;
                        w[7] = memh_len;
                    }
                }
                (CMD_MEM_MAP, exported_memh)
            }
            Self::TagSend {
                context,
                dest,
                buffer,
                count,
                tag,
                memh_id,
                data,
            } => {
                let (count, data) = if memh_id == 0 {
                    (data.len() as u64, data)
                } else {
                    (count, &[][..])
                };
                w[..6].copy_from_slice(&[context, dest, buffer, count, tag, memh_id]);
                (CMD_TAG_SEND, data)
            }
            Self::TagRecv {
                context,
                buffer,
                count,
                tag,
                tag_mask,
                memh_id,
            } => {
                w[..6].copy_from_slice(&[context, buffer, count, tag, tag_mask, memh_id]);
                (CMD_TAG_RECV, &[][..])
            }
        };
        let wire = CommandWireUcx114 {
            kind: U64::new(kind),
            words: words(w),
        };
        put(buf, &wire.as_bytes()[..layout.fixed_len()], data)
    }

    /// Reads a packed command of either layout; `bytes` must hold exactly one.
    pub fn unpack(bytes: &'a [u8]) -> Result<Self, SandboxError> {
        Self::unpack_with_layout(bytes).map(|(command, _)| command)
    }

    /// Reads a packed command of either layout, and says which it was (by its length: see the
    /// module docs); `bytes` must hold exactly one.
    pub fn unpack_with_layout(bytes: &'a [u8]) -> Result<(Self, CommandLayout), SandboxError> {
        let (wire, _) = split::<CommandWire>(bytes)?;
        let kind = wire.kind.get();
        let w = wire.words.map(|w| w.get());
        // The union's last word in the 1.14 layout, when there is one.
        let w7 = bytes
            .get(COMMAND_LEN_UCX_1_13..COMMAND_LEN_UCX_1_14)
            .and_then(|b| U64::read_from_bytes(b).ok())
            .map(|w| w.get());
        let fixed_113 = COMMAND_LEN_UCX_1_13 as u64;
        let fixed_114 = COMMAND_LEN_UCX_1_14 as u64;
        // The whole length each layout calls for.
        let (ucx_1_13, ucx_1_14) = match kind {
            CMD_MEM_MAP => (
                fixed_113.saturating_add(w[6]),
                w7.map(|memh_len| fixed_114.saturating_add(memh_len)),
            ),
            CMD_TAG_SEND => {
                let (count, memh_id) = (w[3], w[5]);
                let inline = if memh_id == 0 { count } else { 0 };
                (
                    fixed_113.saturating_add(inline),
                    Some(fixed_114.saturating_add(inline)),
                )
            }
            CMD_TAG_RECV => (fixed_113, Some(fixed_114)),
            kind => return Err(SandboxError::UnknownType(kind)),
        };
        let len = bytes.len() as u64;
        let layout = match (len == ucx_1_13, ucx_1_14 == Some(len)) {
            // Only a MEM_MAP can fit both: the field UCX 1.13 lacks decides.
            (true, true) if w[1] & MEM_MAP_FIELD_EXPORTED_MEMH_BUFFER != 0 => CommandLayout::Ucx114,
            (true, _) => CommandLayout::Ucx113,
            (false, true) => CommandLayout::Ucx114,
            (false, false) => {
                return Err(SandboxError::BadCommandLength {
                    kind,
                    len: bytes.len(),
                    ucx_1_13,
                    ucx_1_14: ucx_1_14.unwrap_or(fixed_114),
                });
            }
        };
        let rest = &bytes[layout.fixed_len()..];
        let command = match kind {
            CMD_MEM_MAP => Self::MemMap {
                context: w[0],
                params: MemMapParams {
                    field_mask: w[1],
                    address: w[2],
                    length: w[3],
                    flags: w[4] as u32,
                    prot: (w[4] >> 32) as u32,
                    memory_type: w[5] as u32,
                    exported_memh_buffer: match layout {
                        CommandLayout::Ucx113 => 0,
                        CommandLayout::Ucx114 => w[6],
                    },
                },
                exported_memh: rest,
            },
            CMD_TAG_SEND => {
                let [context, dest, buffer, count, tag, memh_id, _] = w;
                Self::TagSend {
                    context,
                    dest,
                    buffer,
                    count,
                    tag,
                    memh_id,
                    data: rest,
                }
            }
            _ => {
                let [context, buffer, count, tag, tag_mask, memh_id, _] = w;
                Self::TagRecv {
                    context,
                    buffer,
                    count,
                    tag,
                    tag_mask,
                    memh_id,
                }
            }
        };
        Ok((command, layout))
    }
}

impl<'a> SandboxNotification<'a> {
    /// Its length packed.
    pub fn buffer_len(&self) -> usize {
        NOTIFICATION_LEN
            + match self {
                Self::TagRecv { buffer, data, .. } if *buffer != 0 => data.len(),
                _ => 0,
            }
    }

    /// Packs the notification into the start of `buf`, every byte of its fixed part written;
    /// returns its length. An inline receive's `count` is written as its data's length.
    pub fn pack(&self, buf: &mut [u8]) -> Result<usize, SandboxError> {
        let status_word = |status: i32| u64::from(status as u32);
        let (wire, data) = match *self {
            Self::MemMap { context, memh_id } => (
                NotificationWire {
                    kind: U64::new(NOTIFY_MEM_MAP),
                    words: words([context, memh_id, 0, 0, 0]),
                },
                &[][..],
            ),
            Self::TagSend { context, status } => (
                NotificationWire {
                    kind: U64::new(NOTIFY_TAG_SEND),
                    words: words([context, status_word(status), 0, 0, 0]),
                },
                &[][..],
            ),
            Self::TagRecv {
                context,
                buffer,
                count,
                sender_tag,
                status,
                data,
            } => {
                let (count, data) = if buffer != 0 {
                    (data.len() as u64, data)
                } else {
                    (count, &[][..])
                };
                (
                    NotificationWire {
                        kind: U64::new(NOTIFY_TAG_RECV),
                        words: words([context, buffer, count, sender_tag, status_word(status)]),
                    },
                    data,
                )
            }
        };
        put(buf, wire.as_bytes(), data)
    }

    /// Reads a packed notification; `bytes` must hold exactly one.
    pub fn unpack(bytes: &'a [u8]) -> Result<Self, SandboxError> {
        let (wire, rest) = split::<NotificationWire>(bytes)?;
        let w = wire.words.map(|w| w.get());
        // The status is the low half of its word; the high half is the C struct's padding.
        let status = |word: u64| word as u32 as i32;
        match wire.kind.get() {
            NOTIFY_MEM_MAP => {
                exact(NOTIFICATION_LEN, rest, 0)?;
                Ok(Self::MemMap {
                    context: w[0],
                    memh_id: w[1],
                })
            }
            NOTIFY_TAG_SEND => {
                exact(NOTIFICATION_LEN, rest, 0)?;
                Ok(Self::TagSend {
                    context: w[0],
                    status: status(w[1]),
                })
            }
            NOTIFY_TAG_RECV => {
                let [context, buffer, count, sender_tag, status_raw] = w;
                exact(NOTIFICATION_LEN, rest, if buffer != 0 { count } else { 0 })?;
                Ok(Self::TagRecv {
                    context,
                    buffer,
                    count,
                    sender_tag,
                    status: status(status_raw),
                    data: rest,
                })
            }
            kind => Err(SandboxError::UnknownType(kind)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 8 little-endian bytes of `v`.
    fn le(v: u64) -> [u8; 8] {
        v.to_le_bytes()
    }

    fn concat(parts: &[&[u8]]) -> std::vec::Vec<u8> {
        parts.concat()
    }

    #[test]
    fn an_inline_send_packs_as_the_doca_struct_then_its_bytes() {
        let command = SandboxCommand::TagSend {
            context: 0xbeef,
            dest: 1,
            buffer: 0,
            count: 3,
            tag: 0x1234,
            memh_id: 0,
            data: b"hi\0",
        };
        let golden = concat(&[
            &le(CMD_TAG_SEND),
            &le(0xbeef),
            &le(1),
            &le(0),
            &le(3),
            &le(0x1234),
            &le(0),
            &le(0),
            b"hi\0",
        ]);
        let mut buf = [0xa5u8; 80];
        assert_eq!(command.pack(CommandLayout::Ucx113, &mut buf), Ok(67));
        assert_eq!(command.buffer_len(CommandLayout::Ucx113), 67);
        assert_eq!(&buf[..67], &golden[..]);
        assert_eq!(buf[67], 0xa5);
        assert_eq!(
            SandboxCommand::unpack_with_layout(&golden),
            Ok((command, CommandLayout::Ucx113))
        );

        // UCX 1.14 and later: the same words, the union padded to 64 bytes, then the bytes.
        let golden_114 = concat(&[&golden[..64], &[0; 8], b"hi\0"]);
        let mut buf = [0xa5u8; 80];
        assert_eq!(command.pack(CommandLayout::Ucx114, &mut buf), Ok(75));
        assert_eq!(command.buffer_len(CommandLayout::Ucx114), 75);
        assert_eq!(&buf[..75], &golden_114[..]);
        assert_eq!(buf[75], 0xa5);
        assert_eq!(
            SandboxCommand::unpack_with_layout(&golden_114),
            Ok((command, CommandLayout::Ucx114))
        );
    }

    #[test]
    fn a_receive_and_a_buffer_send_are_exactly_64_or_72_bytes() {
        let recv = SandboxCommand::TagRecv {
            context: 0xdead,
            buffer: 0x7000,
            count: 100,
            tag: 0x1234,
            tag_mask: 0xffff,
            memh_id: 0,
        };
        let golden = concat(&[
            &le(CMD_TAG_RECV),
            &le(0xdead),
            &le(0x7000),
            &le(100),
            &le(0x1234),
            &le(0xffff),
            &le(0),
            &le(0),
        ]);
        let mut buf = [0xa5u8; 64];
        assert_eq!(recv.pack(CommandLayout::Ucx113, &mut buf), Ok(64));
        assert_eq!(&buf[..], &golden[..]);
        assert_eq!(SandboxCommand::unpack(&golden), Ok(recv));
        let mut buf = [0xa5u8; 72];
        assert_eq!(recv.pack(CommandLayout::Ucx114, &mut buf), Ok(72));
        assert_eq!(&buf[..], &concat(&[&golden[..], &[0; 8]])[..]);
        assert_eq!(
            SandboxCommand::unpack_with_layout(&buf),
            Ok((recv, CommandLayout::Ucx114))
        );
        for len in [65, 71, 73] {
            let mut bytes = golden.clone();
            bytes.resize(len, 0);
            assert_eq!(
                SandboxCommand::unpack(&bytes),
                Err(SandboxError::BadCommandLength {
                    kind: CMD_TAG_RECV,
                    len,
                    ucx_1_13: 64,
                    ucx_1_14: 72
                })
            );
        }

        let send = SandboxCommand::TagSend {
            context: 1,
            dest: 2,
            buffer: 0x9000,
            count: 4096,
            tag: 7,
            memh_id: 1,
            data: &[],
        };
        let mut buf = [0xa5u8; 64];
        assert_eq!(send.pack(CommandLayout::Ucx113, &mut buf), Ok(64));
        assert_eq!(&buf[32..40], &le(4096));
        assert_eq!(SandboxCommand::unpack(&buf), Ok(send));
        let mut buf = [0xa5u8; 72];
        assert_eq!(send.pack(CommandLayout::Ucx114, &mut buf), Ok(72));
        assert_eq!(SandboxCommand::unpack(&buf), Ok(send));
    }

    #[test]
    fn a_mem_map_carries_the_ucx_113_params_then_the_memh() {
        let command = SandboxCommand::MemMap {
            context: 5,
            params: MemMapParams {
                field_mask: 0x1f,
                address: 0x1000,
                length: 0x2000,
                flags: 1,
                prot: 0x303,
                memory_type: 0,
                exported_memh_buffer: 0,
            },
            exported_memh: b"memh",
        };
        let golden = concat(&[
            &le(CMD_MEM_MAP),
            &le(5),
            &le(0x1f),
            &le(0x1000),
            &le(0x2000),
            &1u32.to_le_bytes(),
            &0x303u32.to_le_bytes(),
            &0u32.to_le_bytes(),
            &0u32.to_le_bytes(),
            &le(4),
            b"memh",
        ]);
        let mut buf = [0xa5u8; 68];
        assert_eq!(command.pack(CommandLayout::Ucx113, &mut buf), Ok(68));
        assert_eq!(&buf[..], &golden[..]);
        assert_eq!(
            SandboxCommand::unpack_with_layout(&golden),
            Ok((command, CommandLayout::Ucx113))
        );
    }

    #[test]
    fn a_mem_map_carries_the_ucx_114_params_then_the_memh() {
        let command = SandboxCommand::MemMap {
            context: 5,
            params: MemMapParams {
                field_mask: 0x3f,
                address: 0x1000,
                length: 0x2000,
                flags: 1,
                prot: 0x303,
                memory_type: 0,
                exported_memh_buffer: 0x7f00_0000_1000,
            },
            exported_memh: b"memh",
        };
        let golden = concat(&[
            &le(CMD_MEM_MAP),
            &le(5),
            &le(0x3f),
            &le(0x1000),
            &le(0x2000),
            &1u32.to_le_bytes(),
            &0x303u32.to_le_bytes(),
            &0u32.to_le_bytes(),
            &0u32.to_le_bytes(),
            &le(0x7f00_0000_1000),
            &le(4),
            b"memh",
        ]);
        let mut buf = [0xa5u8; 76];
        assert_eq!(command.pack(CommandLayout::Ucx114, &mut buf), Ok(76));
        assert_eq!(&buf[..], &golden[..]);
        assert_eq!(
            SandboxCommand::unpack_with_layout(&golden),
            Ok((command, CommandLayout::Ucx114))
        );
        // One byte short or long: neither layout, and the error names both lengths.
        let error = SandboxCommand::unpack(&golden[..75]).unwrap_err();
        assert_eq!(
            error,
            SandboxError::BadCommandLength {
                kind: CMD_MEM_MAP,
                len: 75,
                ucx_1_13: 64 + 0x7f00_0000_1000,
                ucx_1_14: 76
            }
        );
        let text = std::string::ToString::to_string(&error);
        assert!(
            text.contains("64-byte") && text.contains("72-byte"),
            "{text}"
        );
    }

    #[test]
    fn a_mem_map_both_layouts_fit_is_decided_by_the_114_field() {
        // 64 bytes + 16 of memh whose first word is 8: read as 1.13, the length word (16) is
        // the 1.14 reading's length (8) plus 8.
        let mut bytes = concat(&[
            &le(CMD_MEM_MAP),
            &le(1),
            &le(0x3),
            &le(0x1000),
            &le(0x2000),
            &le(0),
            &le(0),
            &le(16),
            &le(8),
            b"12345678",
        ]);
        let (command, layout) = SandboxCommand::unpack_with_layout(&bytes).unwrap();
        assert_eq!(layout, CommandLayout::Ucx113);
        assert!(
            matches!(command, SandboxCommand::MemMap { exported_memh, .. }
            if exported_memh.len() == 16)
        );
        bytes[16] |= MEM_MAP_FIELD_EXPORTED_MEMH_BUFFER as u8;
        let (command, layout) = SandboxCommand::unpack_with_layout(&bytes).unwrap();
        assert_eq!(layout, CommandLayout::Ucx114);
        assert!(
            matches!(command, SandboxCommand::MemMap { exported_memh, .. }
            if exported_memh == b"12345678")
        );
    }

    #[test]
    fn notifications_pack_as_the_doca_structs() {
        let recv = SandboxNotification::TagRecv {
            context: 0xbeef,
            buffer: 1,
            count: 3,
            sender_tag: 0x5678,
            status: 0,
            data: b"ok\0",
        };
        let golden = concat(&[
            &le(NOTIFY_TAG_RECV),
            &le(0xbeef),
            &le(1),
            &le(3),
            &le(0x5678),
            &le(0),
            b"ok\0",
        ]);
        let mut buf = [0xa5u8; 51];
        assert_eq!(recv.pack(&mut buf), Ok(51));
        assert_eq!(&buf[..], &golden[..]);
        assert_eq!(SandboxNotification::unpack(&golden), Ok(recv));

        let send = SandboxNotification::TagSend {
            context: 9,
            status: -3,
        };
        let mut buf = [0xa5u8; 48];
        assert_eq!(send.pack(&mut buf), Ok(48));
        assert_eq!(
            &buf[..],
            &concat(&[
                &le(NOTIFY_TAG_SEND),
                &le(9),
                &0xffff_fffdu32.to_le_bytes(),
                &[0; 4],
                &[0; 24]
            ])[..]
        );
        assert_eq!(SandboxNotification::unpack(&buf), Ok(send));

        let map = SandboxNotification::MemMap {
            context: 2,
            memh_id: 7,
        };
        assert_eq!(map.pack(&mut buf), Ok(48));
        assert_eq!(
            &buf[..24],
            &concat(&[&le(NOTIFY_MEM_MAP), &le(2), &le(7)])[..]
        );
        assert_eq!(SandboxNotification::unpack(&buf), Ok(map));

        // A receive into host memory carries no bytes.
        let into_memory = SandboxNotification::TagRecv {
            context: 1,
            buffer: 0,
            count: 4096,
            sender_tag: 3,
            status: 0,
            data: &[],
        };
        assert_eq!(into_memory.pack(&mut buf), Ok(48));
        assert_eq!(SandboxNotification::unpack(&buf), Ok(into_memory));
    }

    #[test]
    fn bad_messages_are_refused_without_panicking() {
        assert_eq!(
            SandboxCommand::unpack(&[0; 10]),
            Err(SandboxError::BadLength {
                len: 10,
                expected: 0
            })
        );
        let mut bytes = [0u8; 64];
        bytes[0] = 3;
        assert_eq!(
            SandboxCommand::unpack(&bytes),
            Err(SandboxError::UnknownType(3))
        );
        // An inline send claiming more bytes than follow, and one claiming u64::MAX.
        bytes[0] = CMD_TAG_SEND as u8;
        bytes[32..40].copy_from_slice(&le(5));
        assert_eq!(
            SandboxCommand::unpack(&bytes),
            Err(SandboxError::BadCommandLength {
                kind: CMD_TAG_SEND,
                len: 64,
                ucx_1_13: 69,
                ucx_1_14: 77
            })
        );
        bytes[32..40].copy_from_slice(&le(u64::MAX));
        assert!(SandboxCommand::unpack(&bytes).is_err());
        bytes[0] = CMD_MEM_MAP as u8;
        bytes[56..64].copy_from_slice(&le(u64::MAX));
        assert!(SandboxCommand::unpack(&bytes).is_err());
        assert_eq!(
            SandboxNotification::TagSend {
                context: 0,
                status: 0
            }
            .pack(&mut [0; 47]),
            Err(SandboxError::BufferTooSmall {
                len: 47,
                needed: 48
            })
        );
        assert!(check_version(VERSION).is_ok());
        assert_eq!(
            check_version(2),
            Err(SandboxError::VersionMismatch { found: 2 })
        );
        assert_eq!(
            Status::from(SandboxError::UnknownType(3)),
            Status::InvalidValue
        );
    }
}
