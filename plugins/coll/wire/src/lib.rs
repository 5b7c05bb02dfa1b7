//! The byte formats of urom's collective offload plugin (`worker_coll`), shared by the plugin
//! (`plugins/coll/worker`) and hosts (`plugins/coll/host`).
//!
//! Every command a rank sends starts with a 16-byte [`CommandHeader`] (an opcode and the team
//! it is about), then a fixed part per opcode, then, for some, trailing data whose length the
//! fixed part implies. Every answer is one 32-byte [`NotificationWire`]. All integers are
//! little-endian; offsets from the start of the message:
//!
//! ```text
//! header           0 u32 opcode | 4 u32 reserved (0) | 8 u64 team                    = 16
//! TEAM_CREATE     16 u32 rank | 20 u32 size | 24 u32 nodes | 28 u32 pid                = 32
//!                 then `size` u32: every member's process id, in team-rank order;
//!                 when `nodes` > 1, then `size` u32: every member's node index
//!                 (`0..nodes`), then `nodes` u64: each node's worker's domain id
//! TEAM_DESTROY    nothing more                                                          = 16
//! BUF_REGISTER    16 u32 buffer | 20 u32 kind (0 shared, 1 cross-memory)
//!                 24 u64 addr | 32 u64 len | 40 u32 name_len | 44 u32 reserved           = 48
//!                 then `name_len` bytes: the shared-memory object's name (kind 0)
//! BUF_DEREGISTER  16 u32 buffer | 20 u32 reserved                                       = 24
//! COLL_INIT       16 u32 coll | 20 u16 kind | 22 u8 datatype | 23 u8 op | 24 u32 root
//!                 28 u32 flags (1: in place) | 32 u32 send_buf | 36 u32 recv_buf
//!                 40 u64 send_off | 48 u64 recv_off | 56 u64 count | 64 u64 recv_count  = 72
//!                 then u64 words up to the end: a v-variant's counts and displacements
//! COLL_START      16 u32 coll | 20 u32 reserved                                         = 24
//! COLL_DESTROY    16 u32 coll | 20 u32 reserved                                         = 24
//!
//! notification     0 u32 opcode (the command's) | 4 i32 status | 8 u64 team
//!                 16 u32 id (buffer or collective) | 20 u32 rank (the one at fault, or
//!                 u32::MAX) | 24 u32 reason | 28 u32 worker_pid                          = 32
//! ```
//!
//! A team spanning several nodes is served by one worker per node; a worker serves the members
//! of its node (those whose node index is the joining rank's) and reaches the other nodes'
//! workers through the domain's addresses (their domain ids). The workers' own messages to
//! each other are described in the plugin (`urom-plugin-coll`'s `internode` module).
//!
//! Counts and offsets of a collective are in elements of its datatype; offsets are from the
//! start of the named registered buffer. A v-variant's words are, for a team of `n` ranks:
//! allgatherv `recvcounts[n], displs[n]`; alltoallv `sendcounts[n], sdispls[n],
//! recvcounts[n], rdispls[n]`; no other kind carries words.
//!
//! Opcodes are closed ([`Opcode`]: an unknown one means the bytes are not a command of ours);
//! kinds, datatypes, operations, buffer kinds and reasons are open (an `Unknown(n)` arm keeps
//! any other code, which the worker refuses with `DOCA_ERROR_INVALID_VALUE`). Decoders return
//! a [`CollWireError`], never panic.
#![no_std]
#![forbid(unsafe_code)]

use core::fmt;

use static_assertions::assert_eq_size;
use zerocopy::little_endian::{I32, U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// The plugin's name, as the daemon reports it (its file is `worker_coll.so`).
pub const NAME: &str = "worker_coll";
/// The plugin's version; hosts refuse a plugin of another version.
pub const VERSION: u64 = 0x01;
/// The most ranks a team of one node has (UCC's DOCA UROM plugin serves up to 32 per worker).
pub const MAX_TEAM_SIZE: usize = 64;
/// The longest shared-memory object name a registration carries.
pub const MAX_NAME_LEN: usize = 64;
/// A [`NotificationWire::rank`] that names no rank.
pub const NO_RANK: u32 = u32::MAX;
/// The COLL_INIT flag of an in-place collective (MPI_IN_PLACE).
pub const FLAG_IN_PLACE: u32 = 1;

/// Defines an integer-coded enum with an `Unknown(n)` arm for codes this version does not know.
macro_rules! open_enum {
    (
        $(#[$meta:meta])*
        $name:ident : $int:ty {
            $( $(#[$vmeta:meta])* $variant:ident = $value:expr, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
            /// A code this version of urom does not know.
            Unknown($int),
        }

        impl $name {
            /// Every known variant, in code order.
            pub const ALL: &'static [Self] = &[$( Self::$variant, )+];

            /// The enum for a code; unknown codes are kept.
            #[inline]
            pub const fn from_raw(raw: $int) -> Self {
                match raw {
                    $( $value => Self::$variant, )+
                    other => Self::Unknown(other),
                }
            }

            /// The code as it travels on the wire.
            #[inline]
            pub const fn raw(self) -> $int {
                match self {
                    $( Self::$variant => $value, )+
                    Self::Unknown(other) => other,
                }
            }
        }
    };
}

/// What a command asks for. Closed: an unknown opcode means the bytes are not a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Opcode {
    /// Join (create) a team.
    TeamCreate,
    /// Leave (destroy) a team.
    TeamDestroy,
    /// Register a buffer of this rank with a team.
    BufferRegister,
    /// Deregister a buffer.
    BufferDeregister,
    /// Set up a persistent collective.
    CollInit,
    /// Start a persistent collective.
    CollStart,
    /// Destroy a persistent collective.
    CollDestroy,
}

impl Opcode {
    /// Every opcode, in code order.
    pub const ALL: &'static [Self] = &[
        Self::TeamCreate,
        Self::TeamDestroy,
        Self::BufferRegister,
        Self::BufferDeregister,
        Self::CollInit,
        Self::CollStart,
        Self::CollDestroy,
    ];

    /// The opcode for a code, or `None` when it is not one.
    pub const fn from_raw(raw: u32) -> Option<Self> {
        match raw {
            1 => Some(Self::TeamCreate),
            2 => Some(Self::TeamDestroy),
            3 => Some(Self::BufferRegister),
            4 => Some(Self::BufferDeregister),
            5 => Some(Self::CollInit),
            6 => Some(Self::CollStart),
            7 => Some(Self::CollDestroy),
            _ => None,
        }
    }

    /// The code on the wire.
    pub const fn raw(self) -> u32 {
        match self {
            Self::TeamCreate => 1,
            Self::TeamDestroy => 2,
            Self::BufferRegister => 3,
            Self::BufferDeregister => 4,
            Self::CollInit => 5,
            Self::CollStart => 6,
            Self::CollDestroy => 7,
        }
    }
}

open_enum! {
    /// Which collective (MPI 4.0 semantics).
    CollKind: u16 {
        /// `MPI_Barrier`.
        Barrier = 0,
        /// `MPI_Bcast`.
        Bcast = 1,
        /// `MPI_Reduce`.
        Reduce = 2,
        /// `MPI_Allreduce`.
        Allreduce = 3,
        /// `MPI_Allgather`.
        Allgather = 4,
        /// `MPI_Allgatherv`.
        Allgatherv = 5,
        /// `MPI_Alltoall`.
        Alltoall = 6,
        /// `MPI_Alltoallv`.
        Alltoallv = 7,
        /// `MPI_Reduce_scatter_block`.
        ReduceScatterBlock = 8,
        /// `MPI_Gather`.
        Gather = 9,
        /// `MPI_Scatter`.
        Scatter = 10,
    }
}

impl CollKind {
    /// How many u64 words a COLL_INIT of this kind carries for a team of `size` ranks.
    pub const fn words(self, size: usize) -> usize {
        match self {
            Self::Allgatherv => 2 * size,
            Self::Alltoallv => 4 * size,
            _ => 0,
        }
    }

    /// Whether it reduces (takes a datatype's operation).
    pub const fn reduces(self) -> bool {
        matches!(
            self,
            Self::Reduce | Self::Allreduce | Self::ReduceScatterBlock
        )
    }

    /// Whether it has a root.
    pub const fn rooted(self) -> bool {
        matches!(
            self,
            Self::Bcast | Self::Reduce | Self::Gather | Self::Scatter
        )
    }
}

open_enum! {
    /// An element type.
    Datatype: u8 {
        /// `int8_t`.
        I8 = 0,
        /// `int16_t`.
        I16 = 1,
        /// `int32_t`.
        I32 = 2,
        /// `int64_t`.
        I64 = 3,
        /// `uint8_t`.
        U8 = 4,
        /// `uint16_t`.
        U16 = 5,
        /// `uint32_t`.
        U32 = 6,
        /// `uint64_t`.
        U64 = 7,
        /// IEEE 754 binary16.
        F16 = 8,
        /// bfloat16.
        Bf16 = 9,
        /// IEEE 754 binary32.
        F32 = 10,
        /// IEEE 754 binary64.
        F64 = 11,
    }
}

impl Datatype {
    /// Bytes per element; `None` for an unknown datatype.
    pub const fn size(self) -> Option<usize> {
        match self {
            Self::I8 | Self::U8 => Some(1),
            Self::I16 | Self::U16 | Self::F16 | Self::Bf16 => Some(2),
            Self::I32 | Self::U32 | Self::F32 => Some(4),
            Self::I64 | Self::U64 | Self::F64 => Some(8),
            Self::Unknown(_) => None,
        }
    }

    /// Whether it is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(self, Self::F16 | Self::Bf16 | Self::F32 | Self::F64)
    }
}

open_enum! {
    /// A reduction operation.
    ReduceOp: u8 {
        /// `MPI_SUM`.
        Sum = 0,
        /// `MPI_PROD`.
        Prod = 1,
        /// `MPI_MIN`.
        Min = 2,
        /// `MPI_MAX`.
        Max = 3,
        /// `MPI_BAND` (integers only).
        Band = 4,
        /// `MPI_BOR` (integers only).
        Bor = 5,
        /// `MPI_BXOR` (integers only).
        Bxor = 6,
        /// `MPI_LAND` (integers only): non-zero is true, the result 1 or 0.
        Land = 7,
        /// `MPI_LOR` (integers only).
        Lor = 8,
        /// `MPI_LXOR` (integers only).
        Lxor = 9,
    }
}

impl ReduceOp {
    /// Whether it applies to `datatype` (bitwise and logical operations do not apply to
    /// floating-point types).
    pub const fn applies_to(self, datatype: Datatype) -> bool {
        match self {
            Self::Sum | Self::Prod | Self::Min | Self::Max => datatype.size().is_some(),
            Self::Unknown(_) => false,
            _ => datatype.size().is_some() && !datatype.is_float(),
        }
    }
}

open_enum! {
    /// How the worker reaches a registered buffer.
    BufferKind: u32 {
        /// Memory urom allocated and shares with the worker: a shared-memory object named by
        /// the registration, mapped by both.
        Shared = 0,
        /// An existing buffer of the rank's process, reached with cross-memory attach
        /// (`process_vm_readv` / `process_vm_writev`) at `addr`.
        CrossMemory = 1,
    }
}

open_enum! {
    /// Why a command failed, beside its status: what the host reports.
    Reason: u32 {
        /// Nothing failed.
        None = 0,
        /// The command's bytes are not a valid command.
        Malformed = 1,
        /// The team is not one this connection is a member of.
        UnknownTeam = 2,
        /// The members disagree on the team (size, process ids), or this rank joined twice.
        TeamMismatch = 3,
        /// The buffer id is not registered by this rank (or is already).
        UnknownBuffer = 4,
        /// A range the collective touches lies outside the rank's registered buffer.
        OutOfBounds = 5,
        /// The shared-memory object cannot be opened, is not the user's, or is too small.
        SharedMemory = 6,
        /// The kernel or a container forbids cross-memory attach to the rank's process.
        CrossMemoryDenied = 7,
        /// The collective's arguments are invalid (kind, datatype, operation, root, counts).
        InvalidArgs = 8,
        /// The ranks' arguments of one collective disagree.
        ArgsMismatch = 9,
        /// The ranks started different collectives as their n-th.
        OrderMismatch = 10,
        /// A member's process exited.
        RankExited = 11,
        /// A member's connection to the worker is gone.
        RankDisconnected = 12,
        /// The team failed earlier (see the first error) or was destroyed.
        TeamFailed = 13,
        /// The collective id is not initialised, or is started while it runs.
        UnknownColl = 14,
        /// Too many collectives started and not complete on this team.
        QueueFull = 15,
        /// Teams spanning several nodes need a worker built with UCX.
        InterNode = 16,
        /// Copying to or from a rank's memory failed.
        CopyFailed = 17,
        /// The buffer is in use by a collective.
        BufferBusy = 18,
        /// The worker of another node of the team died, is unreachable, or did not answer in
        /// time; the notification's `rank` is that node's index, not a rank.
        PeerWorker = 19,
        /// This collective is not supported on teams spanning several nodes (workers of
        /// this version support every collective there and no longer send it).
        NotAcrossNodes = 20,
        /// The workers of the team's nodes disagree about a collective (its kind, counts or
        /// the order it was started in); the notification's `rank` is the other node's index.
        NodesDisagree = 21,
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            Self::None => "no error",
            Self::Malformed => "the command is malformed",
            Self::UnknownTeam => "the team is unknown to the worker",
            Self::TeamMismatch => "the members disagree on the team",
            Self::UnknownBuffer => "the buffer is not registered by that rank",
            Self::OutOfBounds => "a range lies outside that rank's registered buffers",
            Self::SharedMemory => "the shared-memory buffer cannot be mapped by the worker",
            Self::CrossMemoryDenied => {
                "cross-memory attach to that rank's process is forbidden (Yama ptrace_scope, a \
                 container's seccomp profile, or another user's process)"
            }
            Self::InvalidArgs => "the collective's arguments are invalid",
            Self::ArgsMismatch => "the ranks' arguments of the collective disagree",
            Self::OrderMismatch => "the ranks started different collectives in the same place",
            Self::RankExited => "that rank's process exited",
            Self::RankDisconnected => "that rank's connection to the worker is gone",
            Self::TeamFailed => "the team failed earlier or was destroyed",
            Self::UnknownColl => "the collective is not initialised, or still running",
            Self::QueueFull => "too many collectives in flight on the team",
            Self::InterNode => {
                "teams spanning several nodes need a worker built with UCX (feature `ucx`)"
            }
            Self::CopyFailed => "copying to or from that rank's memory failed",
            Self::BufferBusy => "the buffer is used by a collective",
            Self::PeerWorker => {
                "the worker of that node died, is unreachable, or did not answer in time"
            }
            Self::NotAcrossNodes => {
                "this collective is not supported yet on teams spanning several nodes"
            }
            Self::NodesDisagree => {
                "the workers of that node and this one disagree on the collective"
            }
            Self::Unknown(code) => return write!(f, "reason code {code}"),
        };
        f.write_str(text)
    }
}

/// The header of every command.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct CommandHeader {
    /// [`Opcode`].
    pub opcode: U32,
    /// Zero.
    pub reserved: U32,
    /// The team (its key, the same on every member).
    pub team: U64,
}
assert_eq_size!(CommandHeader, [u8; 16]);
/// Bytes of [`CommandHeader`].
pub const HEADER_LEN: usize = size_of::<CommandHeader>();

/// TEAM_CREATE's fixed part; `size` process ids (u32) follow.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct TeamCreateWire {
    /// This rank in the team.
    pub rank: U32,
    /// The team's size.
    pub size: U32,
    /// How many nodes the team spans (1: this worker serves all of it; more: the node
    /// indexes and the nodes' workers' domain ids follow the process ids).
    pub nodes: U32,
    /// This rank's process id.
    pub pid: U32,
}
assert_eq_size!(TeamCreateWire, [u8; 16]);

/// BUF_REGISTER's fixed part; `name_len` name bytes follow.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct BufferRegisterWire {
    /// The buffer's id, chosen by the rank.
    pub buffer: U32,
    /// [`BufferKind`].
    pub kind: U32,
    /// Cross-memory: its address in the rank's process; shared: 0.
    pub addr: U64,
    /// Its length in bytes.
    pub len: U64,
    /// Bytes of name that follow.
    pub name_len: U32,
    /// Zero.
    pub reserved: U32,
}
assert_eq_size!(BufferRegisterWire, [u8; 32]);

/// The fixed part of commands that name one id (BUF_DEREGISTER, COLL_START, COLL_DESTROY).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct IdWire {
    /// The buffer or collective id.
    pub id: U32,
    /// Zero.
    pub reserved: U32,
}
assert_eq_size!(IdWire, [u8; 8]);

/// COLL_INIT's fixed part; u64 words follow.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct CollInitWire {
    /// The collective's id on the team (the same on every rank).
    pub coll: U32,
    /// [`CollKind`].
    pub kind: U16,
    /// [`Datatype`].
    pub datatype: u8,
    /// [`ReduceOp`].
    pub op: u8,
    /// The root's team rank (rooted kinds).
    pub root: U32,
    /// [`FLAG_IN_PLACE`].
    pub flags: U32,
    /// The send buffer's id.
    pub send_buf: U32,
    /// The receive buffer's id.
    pub recv_buf: U32,
    /// Offset of the send data in the send buffer, in elements.
    pub send_off: U64,
    /// Offset of the receive data in the receive buffer, in elements.
    pub recv_off: U64,
    /// The count (send count where send and receive counts differ).
    pub count: U64,
    /// The receive count (gather, scatter, allgather: per rank).
    pub recv_count: U64,
}
assert_eq_size!(CollInitWire, [u8; 56]);

/// The notification every command is answered with.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct NotificationWire {
    /// The opcode of the command answered.
    pub opcode: U32,
    /// Its DOCA status (0 success).
    pub status: I32,
    /// The team.
    pub team: U64,
    /// The buffer or collective id of the command.
    pub id: U32,
    /// The rank at fault, or [`NO_RANK`].
    pub rank: U32,
    /// [`Reason`].
    pub reason: U32,
    /// The worker's process id (for `PR_SET_PTRACER`).
    pub worker_pid: U32,
}
assert_eq_size!(NotificationWire, [u8; 32]);
/// Bytes of a notification.
pub const NOTIFICATION_LEN: usize = size_of::<NotificationWire>();

/// Why bytes are not a command or a notification, or do not fit a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CollWireError {
    /// Shorter than its fixed part.
    Truncated {
        /// Bytes there are.
        len: usize,
        /// Bytes the fixed part needs.
        needed: usize,
    },
    /// The opcode is not one of ours.
    UnknownOpcode(u32),
    /// A reserved field is not zero.
    Reserved,
    /// The length is not what the fixed part says.
    BadLength {
        /// Bytes there are.
        len: usize,
        /// Bytes the command says it has.
        expected: usize,
    },
    /// A team's size is 0 or above [`MAX_TEAM_SIZE`], its rank is not below its size, its
    /// node count is 0 or above its size, or a member's node index is not below the count.
    BadTeam,
    /// A shared-memory name is longer than [`MAX_NAME_LEN`].
    NameTooLong(usize),
    /// A COLL_INIT's words are more than `4 * MAX_TEAM_SIZE`, or an unknown flag is set.
    BadCollInit,
    /// The buffer to emit into is too small.
    BufferTooSmall {
        /// Bytes needed.
        needed: usize,
        /// Bytes available.
        available: usize,
    },
}

impl fmt::Display for CollWireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Truncated { len, needed } => {
                write!(
                    f,
                    "collective message of {len} bytes; its fixed part needs {needed}"
                )
            }
            Self::UnknownOpcode(op) => write!(f, "unknown collective opcode {op}"),
            Self::Reserved => f.write_str("a reserved field of a collective message is not zero"),
            Self::BadLength { len, expected } => {
                write!(
                    f,
                    "collective command of {len} bytes; it says it has {expected}"
                )
            }
            Self::BadTeam => write!(
                f,
                "team size must be 1..={MAX_TEAM_SIZE}, the rank below it, and the nodes \
                 1..=size, every member's node below that"
            ),
            Self::NameTooLong(len) => {
                write!(
                    f,
                    "shared-memory name of {len} bytes; at most {MAX_NAME_LEN}"
                )
            }
            Self::BadCollInit => {
                f.write_str("a collective's init has unknown flags or too many words")
            }
            Self::BufferTooSmall { needed, available } => {
                write!(
                    f,
                    "{available} bytes cannot hold a {needed}-byte collective message"
                )
            }
        }
    }
}

impl core::error::Error for CollWireError {}

/// A collective's arguments as one rank gives them (COLL_INIT's fixed part, decoded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CollArgs {
    /// The collective's id on the team.
    pub coll: u32,
    /// Which collective.
    pub kind: CollKind,
    /// The element type.
    pub datatype: Datatype,
    /// The operation (reductions).
    pub op: ReduceOp,
    /// The root's team rank (rooted kinds).
    pub root: u32,
    /// [`FLAG_IN_PLACE`] or 0.
    pub flags: u32,
    /// The send buffer's id.
    pub send_buf: u32,
    /// The receive buffer's id.
    pub recv_buf: u32,
    /// Offset of the send data, in elements.
    pub send_off: u64,
    /// Offset of the receive data, in elements.
    pub recv_off: u64,
    /// The (send) count, in elements.
    pub count: u64,
    /// The receive count, in elements.
    pub recv_count: u64,
}

impl CollArgs {
    /// Whether the in-place flag is set.
    pub const fn in_place(&self) -> bool {
        self.flags & FLAG_IN_PLACE != 0
    }
}

/// A command, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CollCommand<'a> {
    /// Join team `team` as `rank`.
    TeamCreate {
        /// The team.
        team: u64,
        /// This rank.
        rank: u32,
        /// Nodes the team spans.
        nodes: u32,
        /// This rank's process id.
        pid: u32,
        /// Every member's process id, in rank order (the team's size is its length).
        pids: &'a [U32],
        /// Every member's node index, in rank order; empty when `nodes` is 1.
        node_of: &'a [U32],
        /// Each node's worker's domain id, in node order; empty when `nodes` is 1.
        node_workers: &'a [U64],
    },
    /// Leave team `team`.
    TeamDestroy {
        /// The team.
        team: u64,
    },
    /// Register a buffer.
    BufferRegister {
        /// The team.
        team: u64,
        /// The buffer's id.
        buffer: u32,
        /// How the worker reaches it.
        kind: BufferKind,
        /// Cross-memory: its address.
        addr: u64,
        /// Its length in bytes.
        len: u64,
        /// Shared: the object's name.
        name: &'a [u8],
    },
    /// Deregister a buffer.
    BufferDeregister {
        /// The team.
        team: u64,
        /// The buffer's id.
        buffer: u32,
    },
    /// Set up a persistent collective.
    CollInit {
        /// The team.
        team: u64,
        /// Its arguments.
        args: CollArgs,
        /// A v-variant's counts and displacements (see the module docs).
        words: &'a [U64],
    },
    /// Start a persistent collective.
    CollStart {
        /// The team.
        team: u64,
        /// The collective.
        coll: u32,
    },
    /// Destroy a persistent collective.
    CollDestroy {
        /// The team.
        team: u64,
        /// The collective.
        coll: u32,
    },
}

fn split<T: FromBytes + KnownLayout + Immutable + Unaligned>(
    bytes: &[u8],
) -> Result<(&T, &[u8]), CollWireError> {
    T::ref_from_prefix(bytes).map_err(|_| CollWireError::Truncated {
        len: bytes.len(),
        needed: size_of::<T>(),
    })
}

fn exact<T: FromBytes + KnownLayout + Immutable + Unaligned>(
    bytes: &[u8],
    total: usize,
) -> Result<&T, CollWireError> {
    let (wire, rest) = split::<T>(bytes)?;
    if rest.is_empty() {
        Ok(wire)
    } else {
        Err(CollWireError::BadLength {
            len: total,
            expected: total - rest.len(),
        })
    }
}

fn put(buf: &mut [u8], at: usize, bytes: &[u8]) -> Result<(), CollWireError> {
    let needed = at + bytes.len();
    let available = buf.len();
    buf.get_mut(at..needed)
        .ok_or(CollWireError::BufferTooSmall { needed, available })?
        .copy_from_slice(bytes);
    Ok(())
}

impl<'a> CollCommand<'a> {
    /// The opcode.
    pub const fn opcode(&self) -> Opcode {
        match self {
            Self::TeamCreate { .. } => Opcode::TeamCreate,
            Self::TeamDestroy { .. } => Opcode::TeamDestroy,
            Self::BufferRegister { .. } => Opcode::BufferRegister,
            Self::BufferDeregister { .. } => Opcode::BufferDeregister,
            Self::CollInit { .. } => Opcode::CollInit,
            Self::CollStart { .. } => Opcode::CollStart,
            Self::CollDestroy { .. } => Opcode::CollDestroy,
        }
    }

    /// The team.
    pub const fn team(&self) -> u64 {
        match *self {
            Self::TeamCreate { team, .. }
            | Self::TeamDestroy { team }
            | Self::BufferRegister { team, .. }
            | Self::BufferDeregister { team, .. }
            | Self::CollInit { team, .. }
            | Self::CollStart { team, .. }
            | Self::CollDestroy { team, .. } => team,
        }
    }

    /// The buffer or collective id it names (0 for team commands).
    pub const fn id(&self) -> u32 {
        match *self {
            Self::TeamCreate { .. } | Self::TeamDestroy { .. } => 0,
            Self::BufferRegister { buffer, .. } | Self::BufferDeregister { buffer, .. } => buffer,
            Self::CollInit { args, .. } => args.coll,
            Self::CollStart { coll, .. } | Self::CollDestroy { coll, .. } => coll,
        }
    }

    /// Reads one command; `bytes` must be exactly one.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, CollWireError> {
        let total = bytes.len();
        let (header, body) = split::<CommandHeader>(bytes)?;
        let opcode = Opcode::from_raw(header.opcode.get())
            .ok_or(CollWireError::UnknownOpcode(header.opcode.get()))?;
        if header.reserved.get() != 0 {
            return Err(CollWireError::Reserved);
        }
        let team = header.team.get();
        let id = |body: &[u8]| -> Result<u32, CollWireError> {
            let wire = exact::<IdWire>(body, total)?;
            if wire.reserved.get() != 0 {
                return Err(CollWireError::Reserved);
            }
            Ok(wire.id.get())
        };
        Ok(match opcode {
            Opcode::TeamCreate => {
                let (wire, rest) = split::<TeamCreateWire>(body)?;
                let size = wire.size.get() as usize;
                if size == 0 || size > MAX_TEAM_SIZE || wire.rank.get() as usize >= size {
                    return Err(CollWireError::BadTeam);
                }
                let nodes = wire.nodes.get() as usize;
                if nodes == 0 || nodes > size {
                    return Err(CollWireError::BadTeam);
                }
                let placed = if nodes > 1 { 4 * size + 8 * nodes } else { 0 };
                let expected = HEADER_LEN + size_of::<TeamCreateWire>() + 4 * size + placed;
                if rest.len() != 4 * size + placed {
                    return Err(CollWireError::BadLength {
                        len: total,
                        expected,
                    });
                }
                let bad = CollWireError::BadLength {
                    len: total,
                    expected,
                };
                let (pids, rest) =
                    <[U32]>::ref_from_prefix_with_elems(rest, size).map_err(|_| bad)?;
                let (node_of, rest) = if nodes > 1 {
                    <[U32]>::ref_from_prefix_with_elems(rest, size).map_err(|_| bad)?
                } else {
                    (&[][..], rest)
                };
                let node_workers = <[U64]>::ref_from_bytes(rest).map_err(|_| bad)?;
                if node_of.iter().any(|n| n.get() as usize >= nodes) {
                    return Err(CollWireError::BadTeam);
                }
                Self::TeamCreate {
                    team,
                    rank: wire.rank.get(),
                    nodes: wire.nodes.get(),
                    pid: wire.pid.get(),
                    pids,
                    node_of,
                    node_workers,
                }
            }
            Opcode::TeamDestroy => {
                if !body.is_empty() {
                    return Err(CollWireError::BadLength {
                        len: total,
                        expected: HEADER_LEN,
                    });
                }
                Self::TeamDestroy { team }
            }
            Opcode::BufferRegister => {
                let (wire, name) = split::<BufferRegisterWire>(body)?;
                if wire.reserved.get() != 0 {
                    return Err(CollWireError::Reserved);
                }
                let name_len = wire.name_len.get() as usize;
                if name_len > MAX_NAME_LEN {
                    return Err(CollWireError::NameTooLong(name_len));
                }
                if name.len() != name_len {
                    return Err(CollWireError::BadLength {
                        len: total,
                        expected: HEADER_LEN + size_of::<BufferRegisterWire>() + name_len,
                    });
                }
                Self::BufferRegister {
                    team,
                    buffer: wire.buffer.get(),
                    kind: BufferKind::from_raw(wire.kind.get()),
                    addr: wire.addr.get(),
                    len: wire.len.get(),
                    name,
                }
            }
            Opcode::BufferDeregister => Self::BufferDeregister {
                team,
                buffer: id(body)?,
            },
            Opcode::CollInit => {
                let (wire, rest) = split::<CollInitWire>(body)?;
                let words =
                    <[U64]>::ref_from_bytes(rest).map_err(|_| CollWireError::BadLength {
                        len: total,
                        expected: total - rest.len() % 8,
                    })?;
                if words.len() > 4 * MAX_TEAM_SIZE || wire.flags.get() & !FLAG_IN_PLACE != 0 {
                    return Err(CollWireError::BadCollInit);
                }
                Self::CollInit {
                    team,
                    args: CollArgs {
                        coll: wire.coll.get(),
                        kind: CollKind::from_raw(wire.kind.get()),
                        datatype: Datatype::from_raw(wire.datatype),
                        op: ReduceOp::from_raw(wire.op),
                        root: wire.root.get(),
                        flags: wire.flags.get(),
                        send_buf: wire.send_buf.get(),
                        recv_buf: wire.recv_buf.get(),
                        send_off: wire.send_off.get(),
                        recv_off: wire.recv_off.get(),
                        count: wire.count.get(),
                        recv_count: wire.recv_count.get(),
                    },
                    words,
                }
            }
            Opcode::CollStart => Self::CollStart {
                team,
                coll: id(body)?,
            },
            Opcode::CollDestroy => Self::CollDestroy {
                team,
                coll: id(body)?,
            },
        })
    }

    /// Bytes [`CollCommand::emit`] writes.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN
            + match self {
                Self::TeamCreate {
                    pids,
                    node_of,
                    node_workers,
                    ..
                } => {
                    size_of::<TeamCreateWire>()
                        + 4 * pids.len()
                        + 4 * node_of.len()
                        + 8 * node_workers.len()
                }
                Self::TeamDestroy { .. } => 0,
                Self::BufferRegister { name, .. } => size_of::<BufferRegisterWire>() + name.len(),
                Self::BufferDeregister { .. }
                | Self::CollStart { .. }
                | Self::CollDestroy { .. } => size_of::<IdWire>(),
                Self::CollInit { words, .. } => size_of::<CollInitWire>() + 8 * words.len(),
            }
    }

    /// Writes the command at the start of `buf`; returns its length. Writes every byte of it
    /// (reserved ones as 0), nothing past it.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, CollWireError> {
        let len = self.buffer_len();
        if buf.len() < len {
            return Err(CollWireError::BufferTooSmall {
                needed: len,
                available: buf.len(),
            });
        }
        let header = CommandHeader {
            opcode: U32::new(self.opcode().raw()),
            reserved: U32::new(0),
            team: U64::new(self.team()),
        };
        put(buf, 0, header.as_bytes())?;
        let id_wire = |id: u32| IdWire {
            id: U32::new(id),
            reserved: U32::new(0),
        };
        match *self {
            Self::TeamCreate {
                rank,
                nodes,
                pid,
                pids,
                node_of,
                node_workers,
                ..
            } => {
                let wire = TeamCreateWire {
                    rank: U32::new(rank),
                    size: U32::new(pids.len() as u32),
                    nodes: U32::new(nodes),
                    pid: U32::new(pid),
                };
                put(buf, HEADER_LEN, wire.as_bytes())?;
                let at = HEADER_LEN + size_of::<TeamCreateWire>();
                put(buf, at, pids.as_bytes())?;
                let at = at + 4 * pids.len();
                put(buf, at, node_of.as_bytes())?;
                put(buf, at + 4 * node_of.len(), node_workers.as_bytes())?;
            }
            Self::TeamDestroy { .. } => {}
            Self::BufferRegister {
                buffer,
                kind,
                addr,
                len,
                name,
                ..
            } => {
                let wire = BufferRegisterWire {
                    buffer: U32::new(buffer),
                    kind: U32::new(kind.raw()),
                    addr: U64::new(addr),
                    len: U64::new(len),
                    name_len: U32::new(name.len() as u32),
                    reserved: U32::new(0),
                };
                put(buf, HEADER_LEN, wire.as_bytes())?;
                put(buf, HEADER_LEN + size_of::<BufferRegisterWire>(), name)?;
            }
            Self::BufferDeregister { buffer: id, .. }
            | Self::CollStart { coll: id, .. }
            | Self::CollDestroy { coll: id, .. } => {
                put(buf, HEADER_LEN, id_wire(id).as_bytes())?;
            }
            Self::CollInit { args, words, .. } => {
                let wire = CollInitWire {
                    coll: U32::new(args.coll),
                    kind: U16::new(args.kind.raw()),
                    datatype: args.datatype.raw(),
                    op: args.op.raw(),
                    root: U32::new(args.root),
                    flags: U32::new(args.flags),
                    send_buf: U32::new(args.send_buf),
                    recv_buf: U32::new(args.recv_buf),
                    send_off: U64::new(args.send_off),
                    recv_off: U64::new(args.recv_off),
                    count: U64::new(args.count),
                    recv_count: U64::new(args.recv_count),
                };
                put(buf, HEADER_LEN, wire.as_bytes())?;
                put(
                    buf,
                    HEADER_LEN + size_of::<CollInitWire>(),
                    words.as_bytes(),
                )?;
            }
        }
        Ok(len)
    }
}

/// A notification, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CollNotification {
    /// The opcode of the command answered.
    pub opcode: Opcode,
    /// Its DOCA status (0 success).
    pub status: i32,
    /// The team.
    pub team: u64,
    /// The buffer or collective id.
    pub id: u32,
    /// The rank at fault, or [`NO_RANK`].
    pub rank: u32,
    /// Why it failed.
    pub reason: Reason,
    /// The worker's process id.
    pub worker_pid: u32,
}

impl CollNotification {
    /// Reads one notification; `bytes` must be exactly one.
    pub fn parse(bytes: &[u8]) -> Result<Self, CollWireError> {
        let wire = exact::<NotificationWire>(bytes, bytes.len())?;
        let opcode = Opcode::from_raw(wire.opcode.get())
            .ok_or(CollWireError::UnknownOpcode(wire.opcode.get()))?;
        Ok(Self {
            opcode,
            status: wire.status.get(),
            team: wire.team.get(),
            id: wire.id.get(),
            rank: wire.rank.get(),
            reason: Reason::from_raw(wire.reason.get()),
            worker_pid: wire.worker_pid.get(),
        })
    }

    /// Bytes [`CollNotification::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        NOTIFICATION_LEN
    }

    /// Writes the notification at the start of `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, CollWireError> {
        let wire = NotificationWire {
            opcode: U32::new(self.opcode.raw()),
            status: I32::new(self.status),
            team: U64::new(self.team),
            id: U32::new(self.id),
            rank: U32::new(self.rank),
            reason: U32::new(self.reason.raw()),
            worker_pid: U32::new(self.worker_pid),
        };
        put(buf, 0, wire.as_bytes())?;
        Ok(NOTIFICATION_LEN)
    }
}

/// `Ok` when the service's collective plugin speaks this host's version.
pub fn check_version(found: u64) -> Result<(), u64> {
    if found == VERSION { Ok(()) } else { Err(found) }
}

#[cfg(test)]
mod tests;
