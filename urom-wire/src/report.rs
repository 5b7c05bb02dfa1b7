//! What the daemon reports about itself: the records of a status reply
//! ([`crate::control::ControlMessage::StatusReply`]) and the counters a worker keeps
//! ([`WorkerCounters`], which also travel on the daemon's link to each worker, [`crate::link`]).
//!
//! A status reply is a page of records; each record is a 4-byte head (`u16 kind`, `u16 len`:
//! the bytes after the head) and a body: a fixed part, then the record's texts, each a `u16`
//! length and that many bytes of UTF-8. A record kind this build does not know is kept as
//! [`StatusRecord::Unknown`], so that a newer daemon's reply still reads.
//!
//! Bodies (little-endian; offsets within the body, before the texts):
//!
//! ```text
//! 1 Daemon      0 u32 pid | 4 u32 workers | 8 u64 started_unix_ms | 16 u64 uptime_ms
//!               24 u32 max_msg_size | 28 u32 max_workers | 32 u32 hosts | 36 u32 reserved
//!               texts: version, cpuset                                                   = 40
//! 2 Listen      0 u16 kind | 2 u16 reserved | 4 u32 reserved; texts: address               = 8
//! 3 HugePages   0 u16 mode | 2 u16 usable (0 or 1) | 4 u32 page_kib | 8 u32 total
//!               12 u32 free; texts: hugetlbfs mounts                                     = 16
//! 4 PluginDir   0 u16 state | 2 u16 reserved | 4 u32 reserved; texts: path, error         = 8
//! 5 PluginFile  0 u16 outcome | 2 u16 reserved | 4 u32 reserved | 8 u64 id | 16 u64 version
//!               texts: name, path, reason                                                = 24
//! 6 Worker      0 u64 id | 8 u64 plugins | 16 u64 started_unix_ms | 24 u32 pid | 28 u32 uid
//!               32 u32 gid | 36 u16 state | 38 u16 reserved | 40 u32 hosts | 44 u32 reserved
//!               texts: user, cpuset                                                      = 48
//! 7 Counters    WorkerCounters (below), no texts                                         = 72
//! 8 ErrorCount  0 u64 worker_id | 8 i32 status | 12 u32 reserved | 16 u64 count           = 24
//!
//! WorkerCounters 0 u64 worker_id | 8 u64 commands | 16 u64 notifications | 24 u64 errors
//!               32 u64 bytes_in | 40 u64 bytes_out | 48 u64 peak_backlog_bytes
//!               56 u32 in_flight | 60 u32 peak_ring | 64 u32 hosts | 68 u32 reserved      = 72
//! ```

use static_assertions::assert_eq_size;
use zerocopy::little_endian::{I32, U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::codec::{count_u16, no_trailing, prefix, put, reserved_zero, take};
use crate::list::Item;
use crate::{DecodeError, EncodeError, Status};

int_enum! {
    /// What a listening address serves.
    open ListenKind: u16, other Unknown {
        /// The control socket hosts and `urom-ctl` connect to.
        Control = 1,
        /// The Prometheus metrics endpoint (`--metrics-listen`).
        Metrics = 2,
        /// The UCX listener hosts on other machines connect to (`--listen-ucx`).
        Ucx = 3,
    }
}

int_enum! {
    /// Whether worker rings may, must or must not use hugepages.
    open HugePagesMode: u16, other Unknown {
        /// Hugepages when some are free, normal pages otherwise.
        Auto = 1,
        /// Normal pages.
        Never = 2,
        /// Hugepages or nothing.
        Require = 3,
    }
}

int_enum! {
    /// Whether a plugin directory could be read.
    open DirState: u16, other Unknown {
        /// Its `.so` files were listed.
        Read = 1,
        /// It could not be listed; the error says why.
        Unreadable = 2,
    }
}

int_enum! {
    /// What became of a `.so` file found in a plugin directory.
    open PluginOutcome: u16, other Unknown {
        /// Offered to hosts under its id.
        Offered = 1,
        /// Its probe refused it (missing symbols, bad version, crash, hang); the reason says
        /// what.
        Refused = 2,
        /// Its probe has not answered yet; offered once it has.
        Probing = 3,
        /// A plugin of the same name was found earlier in the path.
        DuplicateName = 4,
        /// Its name is empty or too long.
        BadName = 5,
        /// More plugins than ids.
        TooMany = 6,
        /// Its size or modification time could not be read.
        Unreadable = 7,
    }
}

int_enum! {
    /// Where a worker is in its life.
    open WorkerState: u16, other Unknown {
        /// Started, not listening yet.
        Starting = 1,
        /// Serving hosts.
        Running = 2,
        /// Told to stop.
        Stopping = 3,
    }
}

/// The daemon itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DaemonStatus<'a> {
    /// The daemon's process id.
    pub pid: u32,
    /// Workers running now, all users.
    pub workers: u32,
    /// When it started, in milliseconds since the Unix epoch.
    pub started_unix_ms: u64,
    /// How long it has run, in milliseconds.
    pub uptime_ms: u64,
    /// The maximum message size of every channel.
    pub max_msg_size: u32,
    /// The most workers at once.
    pub max_workers: u32,
    /// Host connections now (this one included).
    pub hosts: u32,
    /// The daemon's version.
    pub version: &'a str,
    /// The CPUs workers may use, as a CPU list.
    pub cpuset: &'a str,
}

/// An address the daemon listens on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenStatus<'a> {
    /// What it serves.
    pub kind: ListenKind,
    /// A socket path or `host:port`.
    pub address: &'a str,
}

/// The hugepages worker rings use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HugePagesStatus<'a> {
    /// What the daemon was told to use.
    pub mode: HugePagesMode,
    /// Whether new rings go on hugepages.
    pub usable: bool,
    /// The default hugepage size in KiB (0 when the system has none).
    pub page_kib: u32,
    /// Hugepages reserved on the system.
    pub total: u32,
    /// Of those, free.
    pub free: u32,
    /// The hugetlbfs mount points, separated by `,`.
    pub mounts: &'a str,
}

/// A directory of `UROM_PLUGIN_PATH`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PluginDirStatus<'a> {
    /// Whether it could be read.
    pub state: DirState,
    /// The directory.
    pub path: &'a str,
    /// Why it could not be read; empty when it could.
    pub error: &'a str,
}

/// A `.so` file found in a plugin directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PluginFileStatus<'a> {
    /// Offered, or why not.
    pub outcome: PluginOutcome,
    /// Its plugin id when offered, else 0.
    pub id: u64,
    /// Its version when its probe answered, else 0.
    pub version: u64,
    /// The file name without `.so`.
    pub name: &'a str,
    /// The file.
    pub path: &'a str,
    /// Why it is not offered; empty when it is.
    pub reason: &'a str,
}

/// A worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerStatus<'a> {
    /// Its id.
    pub id: u64,
    /// Its plugins: an OR of plugin ids.
    pub plugins: u64,
    /// When it was spawned, in milliseconds since the Unix epoch.
    pub started_unix_ms: u64,
    /// Its process id.
    pub pid: u32,
    /// The user it serves (whose host spawned it).
    pub uid: u32,
    /// Its group.
    pub gid: u32,
    /// Where it is in its life.
    pub state: WorkerState,
    /// Host connections attached to it through the daemon.
    pub hosts: u32,
    /// The name of user `uid`, or empty when unknown.
    pub user: &'a str,
    /// Its CPUs, as a CPU list.
    pub cpuset: &'a str,
}

/// What a worker has done since it started, as it last published it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerCounters {
    /// The worker's id.
    pub worker_id: u64,
    /// Command frames received from hosts.
    pub commands: u64,
    /// Notification frames sent to hosts (error answers included).
    pub notifications: u64,
    /// Notifications whose status was not success.
    pub errors: u64,
    /// Bytes of command frames received.
    pub bytes_in: u64,
    /// Bytes of notification frames sent.
    pub bytes_out: u64,
    /// The most bytes of notifications held at once for a host whose ring was full.
    pub peak_backlog_bytes: u64,
    /// Commands received whose notification has not been sent yet.
    pub in_flight: u32,
    /// The most commands found waiting in one host's ring at once (counted up to the number
    /// a worker takes from one host per pass).
    pub peak_ring: u32,
    /// Host channels connected to the worker now.
    pub hosts: u32,
}

/// How many notifications of a worker carried one error status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorCount {
    /// The worker's id.
    pub worker_id: u64,
    /// The status.
    pub status: Status,
    /// How many.
    pub count: u64,
}

/// One record of a status reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusRecord<'a> {
    /// The daemon itself (first record of a report).
    Daemon(DaemonStatus<'a>),
    /// An address the daemon listens on.
    Listen(ListenStatus<'a>),
    /// The hugepages worker rings use.
    HugePages(HugePagesStatus<'a>),
    /// A plugin directory.
    PluginDir(PluginDirStatus<'a>),
    /// A `.so` file of the plugin directory before it.
    PluginFile(PluginFileStatus<'a>),
    /// A worker.
    Worker(WorkerStatus<'a>),
    /// A worker's counters.
    Counters(WorkerCounters),
    /// A worker's count of one error status.
    ErrorCount(ErrorCount),
    /// A record of a kind this build does not know: its kind and body, kept as they are.
    Unknown {
        /// The record kind.
        kind: u16,
        /// The bytes after the record head.
        body: &'a [u8],
    },
}

/// The bytes in front of every record.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct RecordHead {
    kind: U16,
    len: U16,
}
assert_eq_size!(RecordHead, [u8; 4]);

/// Bytes of the head in front of every record (`u16 kind`, `u16 len`).
pub const RECORD_HEAD_LEN: usize = 4;

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct DaemonWire {
    pid: U32,
    workers: U32,
    started_unix_ms: U64,
    uptime_ms: U64,
    max_msg_size: U32,
    max_workers: U32,
    hosts: U32,
    reserved: U32,
}
assert_eq_size!(DaemonWire, [u8; 40]);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct KindWire {
    kind: U16,
    reserved: U16,
    reserved2: U32,
}
assert_eq_size!(KindWire, [u8; 8]);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct HugePagesWire {
    mode: U16,
    usable: U16,
    page_kib: U32,
    total: U32,
    free: U32,
}
assert_eq_size!(HugePagesWire, [u8; 16]);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct PluginFileWire {
    outcome: U16,
    reserved: U16,
    reserved2: U32,
    id: U64,
    version: U64,
}
assert_eq_size!(PluginFileWire, [u8; 24]);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct WorkerWire {
    id: U64,
    plugins: U64,
    started_unix_ms: U64,
    pid: U32,
    uid: U32,
    gid: U32,
    state: U16,
    reserved: U16,
    hosts: U32,
    reserved2: U32,
}
assert_eq_size!(WorkerWire, [u8; 48]);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct CountersWire {
    worker_id: U64,
    commands: U64,
    notifications: U64,
    errors: U64,
    bytes_in: U64,
    bytes_out: U64,
    peak_backlog_bytes: U64,
    in_flight: U32,
    peak_ring: U32,
    hosts: U32,
    reserved: U32,
}
assert_eq_size!(CountersWire, [u8; 72]);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct ErrorCountWire {
    worker_id: U64,
    status: I32,
    reserved: U32,
    count: U64,
}
assert_eq_size!(ErrorCountWire, [u8; 24]);

/// Bytes of [`WorkerCounters`] on the wire.
pub const COUNTERS_LEN: usize = size_of::<CountersWire>();

/// Reads a `u16`-length-prefixed text off the front of `bytes`.
fn text<'a>(field: &'static str, bytes: &mut &'a [u8]) -> Result<&'a str, DecodeError> {
    let (len, rest) = take::<2>(bytes)?;
    let len = u16::from_le_bytes(*len) as usize;
    let (text, rest) = rest.split_at_checked(len).ok_or(DecodeError::Truncated {
        needed: len,
        available: rest.len(),
    })?;
    *bytes = rest;
    core::str::from_utf8(text).map_err(|_| DecodeError::TextNotUtf8 { field })
}

/// Bytes a text takes: its length and itself.
fn text_len(text: &str) -> usize {
    2 + text.len()
}

/// Writes a `u16`-length-prefixed text at the front of `dst`; returns the bytes after it.
fn put_text<'d>(
    field: &'static str,
    dst: &'d mut [u8],
    text: &str,
) -> Result<&'d mut [u8], EncodeError> {
    let len = count_u16(field, text.len())?;
    let (len_bytes, rest) = dst.split_at_mut(2);
    len_bytes.copy_from_slice(&len.to_le_bytes());
    let (head, rest) = rest.split_at_mut(text.len());
    head.copy_from_slice(text.as_bytes());
    Ok(rest)
}

/// A 0-or-1 field: `true` for 1; anything else is refused, so that one encoding stands for
/// each value.
fn flag(field: &'static str, value: u16) -> Result<bool, DecodeError> {
    match value {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(DecodeError::ReservedNotZero { field }),
    }
}

impl WorkerCounters {
    fn from_wire(wire: &CountersWire) -> Result<Self, DecodeError> {
        reserved_zero("counters.reserved", wire.reserved.get().into())?;
        Ok(Self {
            worker_id: wire.worker_id.get(),
            commands: wire.commands.get(),
            notifications: wire.notifications.get(),
            errors: wire.errors.get(),
            bytes_in: wire.bytes_in.get(),
            bytes_out: wire.bytes_out.get(),
            peak_backlog_bytes: wire.peak_backlog_bytes.get(),
            in_flight: wire.in_flight.get(),
            peak_ring: wire.peak_ring.get(),
            hosts: wire.hosts.get(),
        })
    }

    fn to_wire(self) -> CountersWire {
        CountersWire {
            worker_id: U64::new(self.worker_id),
            commands: U64::new(self.commands),
            notifications: U64::new(self.notifications),
            errors: U64::new(self.errors),
            bytes_in: U64::new(self.bytes_in),
            bytes_out: U64::new(self.bytes_out),
            peak_backlog_bytes: U64::new(self.peak_backlog_bytes),
            in_flight: U32::new(self.in_flight),
            peak_ring: U32::new(self.peak_ring),
            hosts: U32::new(self.hosts),
            reserved: U32::ZERO,
        }
    }

    /// Reads counters at the front of `bytes`; returns them and the bytes after them.
    pub(crate) fn decode(bytes: &[u8]) -> Result<(Self, &[u8]), DecodeError> {
        let (wire, rest) = prefix::<CountersWire>(bytes)?;
        Ok((Self::from_wire(wire)?, rest))
    }

    /// Writes the counters at the front of `dst`; returns the bytes after them.
    pub(crate) fn encode(self, dst: &mut [u8]) -> &mut [u8] {
        put(dst, &self.to_wire())
    }
}

impl StatusRecord<'_> {
    /// The record's kind code.
    pub fn kind(&self) -> u16 {
        match self {
            Self::Daemon(_) => 1,
            Self::Listen(_) => 2,
            Self::HugePages(_) => 3,
            Self::PluginDir(_) => 4,
            Self::PluginFile(_) => 5,
            Self::Worker(_) => 6,
            Self::Counters(_) => 7,
            Self::ErrorCount(_) => 8,
            Self::Unknown { kind, .. } => *kind,
        }
    }

    /// Bytes of the record's body (after its head).
    fn body_len(&self) -> usize {
        match self {
            Self::Daemon(d) => size_of::<DaemonWire>() + text_len(d.version) + text_len(d.cpuset),
            Self::Listen(l) => size_of::<KindWire>() + text_len(l.address),
            Self::HugePages(h) => size_of::<HugePagesWire>() + text_len(h.mounts),
            Self::PluginDir(d) => size_of::<KindWire>() + text_len(d.path) + text_len(d.error),
            Self::PluginFile(f) => {
                size_of::<PluginFileWire>()
                    + text_len(f.name)
                    + text_len(f.path)
                    + text_len(f.reason)
            }
            Self::Worker(w) => size_of::<WorkerWire>() + text_len(w.user) + text_len(w.cpuset),
            Self::Counters(_) => COUNTERS_LEN,
            Self::ErrorCount(_) => size_of::<ErrorCountWire>(),
            Self::Unknown { body, .. } => body.len(),
        }
    }
}

impl<'a> StatusRecord<'a> {
    fn decode_body(kind: u16, body: &'a [u8]) -> Result<Self, DecodeError> {
        let record = match kind {
            1 => {
                let (wire, mut rest) = prefix::<DaemonWire>(body)?;
                reserved_zero("daemon.reserved", wire.reserved.get().into())?;
                let version = text("daemon.version", &mut rest)?;
                let cpuset = text("daemon.cpuset", &mut rest)?;
                no_trailing(body, rest)?;
                Self::Daemon(DaemonStatus {
                    pid: wire.pid.get(),
                    workers: wire.workers.get(),
                    started_unix_ms: wire.started_unix_ms.get(),
                    uptime_ms: wire.uptime_ms.get(),
                    max_msg_size: wire.max_msg_size.get(),
                    max_workers: wire.max_workers.get(),
                    hosts: wire.hosts.get(),
                    version,
                    cpuset,
                })
            }
            2 => {
                let (wire, mut rest) = prefix::<KindWire>(body)?;
                check_kind_reserved("listen.reserved", wire)?;
                let address = text("listen.address", &mut rest)?;
                no_trailing(body, rest)?;
                Self::Listen(ListenStatus {
                    kind: ListenKind::from_raw(wire.kind.get()),
                    address,
                })
            }
            3 => {
                let (wire, mut rest) = prefix::<HugePagesWire>(body)?;
                let usable = flag("hugepages.usable", wire.usable.get())?;
                let mounts = text("hugepages.mounts", &mut rest)?;
                no_trailing(body, rest)?;
                Self::HugePages(HugePagesStatus {
                    mode: HugePagesMode::from_raw(wire.mode.get()),
                    usable,
                    page_kib: wire.page_kib.get(),
                    total: wire.total.get(),
                    free: wire.free.get(),
                    mounts,
                })
            }
            4 => {
                let (wire, mut rest) = prefix::<KindWire>(body)?;
                check_kind_reserved("plugin_dir.reserved", wire)?;
                let path = text("plugin_dir.path", &mut rest)?;
                let error = text("plugin_dir.error", &mut rest)?;
                no_trailing(body, rest)?;
                Self::PluginDir(PluginDirStatus {
                    state: DirState::from_raw(wire.kind.get()),
                    path,
                    error,
                })
            }
            5 => {
                let (wire, mut rest) = prefix::<PluginFileWire>(body)?;
                reserved_zero("plugin_file.reserved", wire.reserved.get().into())?;
                reserved_zero("plugin_file.reserved", wire.reserved2.get().into())?;
                let name = text("plugin_file.name", &mut rest)?;
                let path = text("plugin_file.path", &mut rest)?;
                let reason = text("plugin_file.reason", &mut rest)?;
                no_trailing(body, rest)?;
                Self::PluginFile(PluginFileStatus {
                    outcome: PluginOutcome::from_raw(wire.outcome.get()),
                    id: wire.id.get(),
                    version: wire.version.get(),
                    name,
                    path,
                    reason,
                })
            }
            6 => {
                let (wire, mut rest) = prefix::<WorkerWire>(body)?;
                reserved_zero("worker.reserved", wire.reserved.get().into())?;
                reserved_zero("worker.reserved", wire.reserved2.get().into())?;
                let user = text("worker.user", &mut rest)?;
                let cpuset = text("worker.cpuset", &mut rest)?;
                no_trailing(body, rest)?;
                Self::Worker(WorkerStatus {
                    id: wire.id.get(),
                    plugins: wire.plugins.get(),
                    started_unix_ms: wire.started_unix_ms.get(),
                    pid: wire.pid.get(),
                    uid: wire.uid.get(),
                    gid: wire.gid.get(),
                    state: WorkerState::from_raw(wire.state.get()),
                    hosts: wire.hosts.get(),
                    user,
                    cpuset,
                })
            }
            7 => {
                let (counters, rest) = WorkerCounters::decode(body)?;
                no_trailing(body, rest)?;
                Self::Counters(counters)
            }
            8 => {
                let (wire, rest) = prefix::<ErrorCountWire>(body)?;
                reserved_zero("error_count.reserved", wire.reserved.get().into())?;
                no_trailing(body, rest)?;
                Self::ErrorCount(ErrorCount {
                    worker_id: wire.worker_id.get(),
                    status: Status::from_raw(wire.status.get()),
                    count: wire.count.get(),
                })
            }
            kind => Self::Unknown { kind, body },
        };
        Ok(record)
    }

    fn encode_body(&self, dst: &mut [u8]) -> Result<(), EncodeError> {
        match self {
            Self::Daemon(d) => {
                let wire = DaemonWire {
                    pid: U32::new(d.pid),
                    workers: U32::new(d.workers),
                    started_unix_ms: U64::new(d.started_unix_ms),
                    uptime_ms: U64::new(d.uptime_ms),
                    max_msg_size: U32::new(d.max_msg_size),
                    max_workers: U32::new(d.max_workers),
                    hosts: U32::new(d.hosts),
                    reserved: U32::ZERO,
                };
                let rest = put_text("daemon.version", put(dst, &wire), d.version)?;
                put_text("daemon.cpuset", rest, d.cpuset)?;
            }
            Self::Listen(l) => {
                let rest = put(dst, &kind_wire(l.kind.raw()));
                put_text("listen.address", rest, l.address)?;
            }
            Self::HugePages(h) => {
                let wire = HugePagesWire {
                    mode: U16::new(h.mode.raw()),
                    usable: U16::new(h.usable.into()),
                    page_kib: U32::new(h.page_kib),
                    total: U32::new(h.total),
                    free: U32::new(h.free),
                };
                put_text("hugepages.mounts", put(dst, &wire), h.mounts)?;
            }
            Self::PluginDir(d) => {
                let rest = put(dst, &kind_wire(d.state.raw()));
                let rest = put_text("plugin_dir.path", rest, d.path)?;
                put_text("plugin_dir.error", rest, d.error)?;
            }
            Self::PluginFile(f) => {
                let wire = PluginFileWire {
                    outcome: U16::new(f.outcome.raw()),
                    reserved: U16::ZERO,
                    reserved2: U32::ZERO,
                    id: U64::new(f.id),
                    version: U64::new(f.version),
                };
                let rest = put_text("plugin_file.name", put(dst, &wire), f.name)?;
                let rest = put_text("plugin_file.path", rest, f.path)?;
                put_text("plugin_file.reason", rest, f.reason)?;
            }
            Self::Worker(w) => {
                let wire = WorkerWire {
                    id: U64::new(w.id),
                    plugins: U64::new(w.plugins),
                    started_unix_ms: U64::new(w.started_unix_ms),
                    pid: U32::new(w.pid),
                    uid: U32::new(w.uid),
                    gid: U32::new(w.gid),
                    state: U16::new(w.state.raw()),
                    reserved: U16::ZERO,
                    hosts: U32::new(w.hosts),
                    reserved2: U32::ZERO,
                };
                let rest = put_text("worker.user", put(dst, &wire), w.user)?;
                put_text("worker.cpuset", rest, w.cpuset)?;
            }
            Self::Counters(c) => {
                c.encode(dst);
            }
            Self::ErrorCount(e) => {
                put(
                    dst,
                    &ErrorCountWire {
                        worker_id: U64::new(e.worker_id),
                        status: I32::new(e.status.raw()),
                        reserved: U32::ZERO,
                        count: U64::new(e.count),
                    },
                );
            }
            Self::Unknown { body, .. } => dst.copy_from_slice(body),
        }
        Ok(())
    }
}

fn kind_wire(kind: u16) -> KindWire {
    KindWire {
        kind: U16::new(kind),
        reserved: U16::ZERO,
        reserved2: U32::ZERO,
    }
}

fn check_kind_reserved(field: &'static str, wire: &KindWire) -> Result<(), DecodeError> {
    reserved_zero(field, wire.reserved.get().into())?;
    reserved_zero(field, wire.reserved2.get().into())
}

/// Records: a head, then the body the head's length names.
impl<'a> Item<'a> for StatusRecord<'a> {
    fn decode(bytes: &'a [u8], _index: usize) -> Result<(Self, &'a [u8]), DecodeError> {
        let (head, rest) = prefix::<RecordHead>(bytes)?;
        let len = head.len.get() as usize;
        let (body, rest) = rest.split_at_checked(len).ok_or(DecodeError::Truncated {
            needed: len,
            available: rest.len(),
        })?;
        Ok((Self::decode_body(head.kind.get(), body)?, rest))
    }

    fn encoded_len(&self) -> usize {
        RECORD_HEAD_LEN + self.body_len()
    }

    fn encode(&self, dst: &mut [u8], _index: usize) -> Result<(), EncodeError> {
        let head = RecordHead {
            kind: U16::new(self.kind()),
            len: U16::new(count_u16("status record", self.body_len())?),
        };
        self.encode_body(put(dst, &head))
    }
}

/// One error status and how many notifications carried it (the counter report's list).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorEntry {
    /// The status.
    pub status: Status,
    /// How many notifications carried it.
    pub count: u64,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct ErrorEntryWire {
    status: I32,
    reserved: U32,
    count: U64,
}
assert_eq_size!(ErrorEntryWire, [u8; 16]);

/// Error entries: 16 bytes each.
impl<'a> Item<'a> for ErrorEntry {
    fn decode(bytes: &'a [u8], _index: usize) -> Result<(Self, &'a [u8]), DecodeError> {
        let (wire, rest) = prefix::<ErrorEntryWire>(bytes)?;
        reserved_zero("error_entry.reserved", wire.reserved.get().into())?;
        Ok((
            ErrorEntry {
                status: Status::from_raw(wire.status.get()),
                count: wire.count.get(),
            },
            rest,
        ))
    }

    fn encoded_len(&self) -> usize {
        size_of::<ErrorEntryWire>()
    }

    fn encode(&self, dst: &mut [u8], _index: usize) -> Result<(), EncodeError> {
        put(
            dst,
            &ErrorEntryWire {
                status: I32::new(self.status.raw()),
                reserved: U32::ZERO,
                count: U64::new(self.count),
            },
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_are_length_prefixed() {
        let mut buf = [0xa5; 7];
        let rest = put_text("t", &mut buf, "abc").unwrap();
        assert_eq!(rest.len(), 2);
        assert_eq!(&buf[..5], &[3, 0, b'a', b'b', b'c']);
        let mut bytes = &buf[..5];
        assert_eq!(text("t", &mut bytes), Ok("abc"));
        assert!(bytes.is_empty());
        let mut short = &buf[..4];
        assert_eq!(
            text("t", &mut short),
            Err(DecodeError::Truncated {
                needed: 3,
                available: 2
            })
        );
        let mut bad: &[u8] = &[1, 0, 0xff];
        assert_eq!(
            text("t", &mut bad),
            Err(DecodeError::TextNotUtf8 { field: "t" })
        );
    }

    #[test]
    fn a_flag_is_zero_or_one() {
        assert_eq!(flag("f", 0), Ok(false));
        assert_eq!(flag("f", 1), Ok(true));
        assert_eq!(
            flag("f", 2),
            Err(DecodeError::ReservedNotZero { field: "f" })
        );
    }
}
