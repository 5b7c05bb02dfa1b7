//! A domain's table as workers and hosts hold it: every member's plugin addresses and every
//! rank's buffers, looked up by domain id.
//!
//! The bytes are those of [`urom_wire::domain`] (a header, then one record per rank), kept
//! 8-byte aligned, so that what a lookup returns (an address, a packed memory handle or
//! remote key) lies aligned in memory as the plugin's library expects. [`DomainTable::parse`]
//! checks the whole table and indexes it once; lookups then allocate nothing.
//!
//! Lookups answer as the DOCA plugin interface documents: `DOCA_ERROR_NOT_FOUND` for an
//! unknown domain id or segment (or a plugin the member does not run); a buffer added without
//! a memory handle or a remote key (UCX 1.13 cannot export memory handles) answers
//! `DOCA_ERROR_NOT_SUPPORTED` for that key rather than an empty one.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;

use zerocopy::IntoBytes;

use urom_wire::domain::{Buffer, PluginAddress, RecordRepr, TableRepr};
use urom_wire::{DecodeError, Status};

/// The name under which a host lists, for each of its members, the address of its memory
/// worker: the UCP worker through which peers reach that host's buffers with remote memory
/// access (`urom_host::HostMemory`). No plugin can have it: a file name holds no `/`.
pub const HOST_MEMORY_NAME: &str = "urom/host-memory";

/// Why bytes are not a usable table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DomainTableError {
    /// The bytes are not a table ([`urom_wire::domain`]).
    Malformed(DecodeError),
    /// Two ranks claim one domain id.
    DuplicateId {
        /// The id.
        domain_id: u64,
        /// The first rank that claims it.
        first_rank: u32,
        /// The other rank that claims it (the same rank when one rank lists it twice).
        second_rank: u32,
    },
}

impl DomainTableError {
    /// The status a worker answers for it.
    pub fn status(&self) -> Status {
        Status::InvalidValue
    }
}

impl fmt::Display for DomainTableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Malformed(e) => write!(f, "the domain table is malformed: {e}"),
            Self::DuplicateId {
                domain_id,
                first_rank,
                second_rank,
            } if first_rank == second_rank => write!(
                f,
                "rank {first_rank} lists domain id {domain_id} twice; each worker of a domain \
                 needs an id of its own"
            ),
            Self::DuplicateId {
                domain_id,
                first_rank,
                second_rank,
            } => write!(
                f,
                "domain id {domain_id} is claimed by ranks {first_rank} and {second_rank}; each \
                 worker of a domain needs an id of its own"
            ),
        }
    }
}

impl std::error::Error for DomainTableError {}

/// One member: the rank it belongs to and where its plugins' names and addresses lie.
#[derive(Debug)]
struct MemberIndex {
    rank: u32,
    plugins: Vec<(Range<usize>, Range<usize>)>,
}

/// One buffer: its bounds and where its packed keys lie.
#[derive(Debug)]
struct SegmentIndex {
    va: u64,
    len: u64,
    memh: Range<usize>,
    mkey: Range<usize>,
}

/// A member of a domain as [`DomainTable::members`] lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DomainMember {
    /// Its domain id.
    pub domain_id: u64,
    /// The rank of the host it belongs to.
    pub rank: u32,
}

/// A checked, indexed domain table.
pub struct DomainTable {
    // INVARIANTS: the first `len` bytes of `words` are a valid table; every range in `members`
    // and `segments` lies within them.
    words: Box<[u64]>,
    len: usize,
    ranks: u32,
    members: HashMap<u64, MemberIndex>,
    /// By rank, then segment.
    segments: Vec<Vec<SegmentIndex>>,
}

impl fmt::Debug for DomainTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DomainTable")
            .field("ranks", &self.ranks)
            .field("members", &self.members.len())
            .field("len", &self.len)
            .finish()
    }
}

/// Where `part` starts within `whole`, which holds it.
fn offset_in(whole: &[u8], part: &[u8]) -> Range<usize> {
    let start = part.as_ptr() as usize - whole.as_ptr() as usize;
    start..start + part.len()
}

impl DomainTable {
    /// Copies `bytes` into aligned memory, checks that they are a table whose domain ids are
    /// all distinct, and indexes it.
    pub fn parse(bytes: &[u8]) -> Result<Self, DomainTableError> {
        let mut words = vec![0u64; bytes.len().div_ceil(8)].into_boxed_slice();
        words.as_mut_bytes()[..bytes.len()].copy_from_slice(bytes);
        let whole = &words.as_bytes()[..bytes.len()];
        let table = TableRepr::parse(whole).map_err(DomainTableError::Malformed)?;
        let mut members: HashMap<u64, MemberIndex> = HashMap::new();
        let mut segments = Vec::with_capacity(table.ranks as usize);
        for record in table.records() {
            for member in record.members() {
                if let Some(first) = members.get(&member.domain_id) {
                    return Err(DomainTableError::DuplicateId {
                        domain_id: member.domain_id,
                        first_rank: first.rank,
                        second_rank: record.rank,
                    });
                }
                let plugins = member
                    .plugins()
                    .map(|PluginAddress { name, address }| {
                        (offset_in(whole, name.as_bytes()), offset_in(whole, address))
                    })
                    .collect();
                members.insert(
                    member.domain_id,
                    MemberIndex {
                        rank: record.rank,
                        plugins,
                    },
                );
            }
            segments.push(
                record
                    .buffers()
                    .map(
                        |Buffer {
                             va,
                             len,
                             memh,
                             mkey,
                         }| SegmentIndex {
                            va,
                            len,
                            memh: offset_in(whole, memh),
                            mkey: offset_in(whole, mkey),
                        },
                    )
                    .collect(),
            );
        }
        Ok(Self {
            len: bytes.len(),
            ranks: table.ranks,
            members,
            segments,
            words,
        })
    }

    /// The table's bytes (as [`urom_wire::domain::TableRepr`] reads them).
    pub fn as_bytes(&self) -> &[u8] {
        &self.words.as_bytes()[..self.len]
    }

    /// How many ranks (hosts) the domain has.
    pub fn ranks(&self) -> u32 {
        self.ranks
    }

    /// Every member, in no particular order.
    pub fn members(&self) -> impl Iterator<Item = DomainMember> + '_ {
        self.members
            .iter()
            .map(|(&domain_id, member)| DomainMember {
                domain_id,
                rank: member.rank,
            })
    }

    /// The record of `rank`, or `None` when the domain has no such rank.
    pub fn record(&self, rank: u32) -> Option<RecordRepr<'_>> {
        TableRepr::parse(self.as_bytes())
            .ok()?
            .records()
            .nth(rank as usize)
    }

    fn member(&self, domain_id: u64) -> Result<&MemberIndex, Status> {
        self.members.get(&domain_id).ok_or(Status::NotFound)
    }

    /// The rank of member `domain_id`.
    pub fn rank_of(&self, domain_id: u64) -> Result<u32, Status> {
        self.member(domain_id).map(|member| member.rank)
    }

    /// The address of plugin `plugin` (its name) of member `domain_id`: `NotFound` for an
    /// unknown id, or a plugin that member does not run or that gave no address.
    pub fn address(&self, plugin: &str, domain_id: u64) -> Result<&[u8], Status> {
        let bytes = self.as_bytes();
        self.member(domain_id)?
            .plugins
            .iter()
            .find(|(name, _)| &bytes[name.clone()] == plugin.as_bytes())
            .map(|(_, address)| &bytes[address.clone()])
            .ok_or(Status::NotFound)
    }

    /// The address of the memory worker of member `domain_id`'s host (listed under
    /// [`HOST_MEMORY_NAME`]): `NotFound` for an unknown id or a host that gave none.
    pub fn host_memory_address(&self, domain_id: u64) -> Result<&[u8], Status> {
        self.address(HOST_MEMORY_NAME, domain_id)
    }

    /// The member whose address for plugin `plugin` is `address`, if exactly one has it.
    pub fn member_with_address(&self, plugin: &str, address: &[u8]) -> Option<u64> {
        let mut found = self
            .members
            .keys()
            .filter(|&&id| self.address(plugin, id) == Ok(address));
        let first = *found.next()?;
        found.next().is_none().then_some(first)
    }

    /// The segment of member `domain_id` that holds `va`: the index of the buffer of its host
    /// that holds it. `NotFound` for an unknown id or when no buffer holds `va`.
    pub fn segment(&self, domain_id: u64, va: u64) -> Result<i32, Status> {
        let rank = self.member(domain_id)?.rank as usize;
        self.segments
            .get(rank)
            .into_iter()
            .flatten()
            .position(|segment| va >= segment.va && va - segment.va < segment.len)
            .and_then(|index| i32::try_from(index).ok())
            .ok_or(Status::NotFound)
    }

    fn segment_index(&self, domain_id: u64, seg: i32) -> Result<&SegmentIndex, Status> {
        let rank = self.member(domain_id)?.rank as usize;
        let seg = usize::try_from(seg).map_err(|_| Status::NotFound)?;
        self.segments
            .get(rank)
            .and_then(|segments| segments.get(seg))
            .ok_or(Status::NotFound)
    }

    /// The packed memory handle of segment `seg` of member `domain_id`: `NotFound` for an
    /// unknown id or segment, `NotSupported` when its host added the buffer without one.
    pub fn memory_handle(&self, domain_id: u64, seg: i32) -> Result<&[u8], Status> {
        let range = self.segment_index(domain_id, seg)?.memh.clone();
        match &self.as_bytes()[range] {
            [] => Err(Status::NotSupported),
            memh => Ok(memh),
        }
    }

    /// The packed remote key of segment `seg` of member `domain_id`: `NotFound` for an unknown
    /// id or segment, `NotSupported` when its host added the buffer without one.
    pub fn remote_key(&self, domain_id: u64, seg: i32) -> Result<&[u8], Status> {
        let range = self.segment_index(domain_id, seg)?.mkey.clone();
        match &self.as_bytes()[range] {
            [] => Err(Status::NotSupported),
            mkey => Ok(mkey),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use urom_wire::domain::{MemberSpec, RecordSpec};

    /// A table of `records`.
    pub(crate) fn table(records: &[RecordSpec<'_>]) -> Vec<u8> {
        let encoded: Vec<Vec<u8>> = records
            .iter()
            .map(|record| {
                let mut bytes = vec![0; record.buffer_len()];
                record.emit(&mut bytes).unwrap();
                bytes
            })
            .collect();
        let slices: Vec<&[u8]> = encoded.iter().map(Vec::as_slice).collect();
        let mut bytes = vec![0; TableRepr::buffer_len(&slices)];
        TableRepr::emit(&slices, &mut bytes).unwrap();
        bytes
    }

    /// Three ranks: rank 0 with members 10 and 11 and two buffers, rank 1 with member 20 and a
    /// buffer without a memory handle, rank 2 with member 30 and no buffer.
    pub(crate) fn three_ranks() -> Vec<u8> {
        let sandbox = |address: &'static [u8]| PluginAddress {
            name: "worker_sandbox",
            address,
        };
        let graph = PluginAddress {
            name: "worker_graph",
            address: b"graph-10",
        };
        let p10 = [sandbox(b"sandbox-10"), graph];
        let p11 = [sandbox(b"sandbox-11")];
        let p20 = [sandbox(b"sandbox-twenty")];
        let p30 = [sandbox(b"sandbox-30")];
        let m0 = [
            MemberSpec {
                domain_id: 10,
                plugins: &p10,
            },
            MemberSpec {
                domain_id: 11,
                plugins: &p11,
            },
        ];
        let b0 = [
            Buffer {
                va: 0x1000,
                len: 0x100,
                memh: b"memh-0",
                mkey: b"mkey-0",
            },
            Buffer {
                va: 0x8000,
                len: 0x1000,
                memh: b"memh-1-long",
                mkey: b"mkey-1",
            },
        ];
        let m1 = [MemberSpec {
            domain_id: 20,
            plugins: &p20,
        }];
        let b1 = [Buffer {
            va: 0x1000,
            len: 0x10,
            memh: b"",
            mkey: b"mkey-20",
        }];
        let m2 = [MemberSpec {
            domain_id: 30,
            plugins: &p30,
        }];
        table(&[
            RecordSpec {
                rank: 0,
                members: &m0,
                buffers: &b0,
            },
            RecordSpec {
                rank: 1,
                members: &m1,
                buffers: &b1,
            },
            RecordSpec {
                rank: 2,
                members: &m2,
                buffers: &[],
            },
        ])
    }

    #[test]
    fn lookups_answer_from_every_rank() {
        let table = DomainTable::parse(&three_ranks()).unwrap();
        assert_eq!(table.ranks(), 3);
        let mut members: Vec<_> = table.members().map(|m| (m.domain_id, m.rank)).collect();
        members.sort();
        assert_eq!(members, [(10, 0), (11, 0), (20, 1), (30, 2)]);
        assert_eq!(table.address("worker_sandbox", 10), Ok(&b"sandbox-10"[..]));
        assert_eq!(table.address("worker_graph", 10), Ok(&b"graph-10"[..]));
        assert_eq!(
            table.address("worker_sandbox", 20),
            Ok(&b"sandbox-twenty"[..])
        );
        assert_eq!(table.address("worker_sandbox", 30), Ok(&b"sandbox-30"[..]));
        // Member 11 runs no graph plugin; 12 is no member.
        assert_eq!(table.address("worker_graph", 11), Err(Status::NotFound));
        assert_eq!(table.address("worker_sandbox", 12), Err(Status::NotFound));

        // Buffers belong to every member of their host.
        for id in [10, 11] {
            assert_eq!(table.segment(id, 0x1000), Ok(0));
            assert_eq!(table.segment(id, 0x10ff), Ok(0));
            assert_eq!(table.segment(id, 0x1100), Err(Status::NotFound));
            assert_eq!(table.segment(id, 0x8fff), Ok(1));
            assert_eq!(table.memory_handle(id, 1), Ok(&b"memh-1-long"[..]));
            assert_eq!(table.remote_key(id, 0), Ok(&b"mkey-0"[..]));
            assert_eq!(table.remote_key(id, 2), Err(Status::NotFound));
            assert_eq!(table.remote_key(id, -1), Err(Status::NotFound));
        }
        assert_eq!(table.segment(20, 0x100f), Ok(0));
        assert_eq!(table.segment(20, 0x1010), Err(Status::NotFound));
        assert_eq!(table.memory_handle(20, 0), Err(Status::NotSupported));
        assert_eq!(table.remote_key(20, 0), Ok(&b"mkey-20"[..]));
        assert_eq!(table.segment(30, 0x1000), Err(Status::NotFound));
        assert_eq!(table.memory_handle(30, 0), Err(Status::NotFound));
        assert_eq!(table.segment(99, 0x1000), Err(Status::NotFound));
        assert_eq!(table.memory_handle(99, 0), Err(Status::NotFound));

        // Members are found by their plugin's address; hosts gave no memory worker here.
        assert_eq!(
            table.member_with_address("worker_sandbox", b"sandbox-twenty"),
            Some(20)
        );
        assert_eq!(table.member_with_address("worker_sandbox", b"nobody"), None);
        assert_eq!(
            table.member_with_address("worker_graph", b"sandbox-10"),
            None
        );
        assert_eq!(table.host_memory_address(10), Err(Status::NotFound));
    }

    #[test]
    fn what_lookups_return_lies_aligned() {
        // Parse from a deliberately misaligned copy.
        let bytes = three_ranks();
        let mut shifted = vec![0u8; bytes.len() + 1];
        shifted[1..].copy_from_slice(&bytes);
        let table = DomainTable::parse(&shifted[1..]).unwrap();
        for found in [
            table.address("worker_sandbox", 20).unwrap(),
            table.memory_handle(10, 1).unwrap(),
            table.remote_key(20, 0).unwrap(),
        ] {
            assert_eq!(found.as_ptr() as usize % 8, 0);
        }
        assert_eq!(table.as_bytes(), &bytes[..]);
        assert_eq!(table.record(1).unwrap().rank, 1);
        assert!(table.record(3).is_none());
    }

    #[test]
    fn a_domain_id_claimed_twice_is_refused() {
        let plugins = [PluginAddress {
            name: "worker_sandbox",
            address: b"a",
        }];
        let member = |domain_id| MemberSpec {
            domain_id,
            plugins: &plugins,
        };
        let (m0, m1) = ([member(4)], [member(5), member(4)]);
        let bytes = table(&[
            RecordSpec {
                rank: 0,
                members: &m0,
                buffers: &[],
            },
            RecordSpec {
                rank: 1,
                members: &m1,
                buffers: &[],
            },
        ]);
        let error = DomainTable::parse(&bytes).unwrap_err();
        assert_eq!(
            error,
            DomainTableError::DuplicateId {
                domain_id: 4,
                first_rank: 0,
                second_rank: 1
            }
        );
        assert_eq!(
            error.to_string(),
            "domain id 4 is claimed by ranks 0 and 1; each worker of a domain needs an id of its own"
        );
        let mut truncated = three_ranks();
        truncated.pop();
        assert!(matches!(
            DomainTable::parse(&truncated),
            Err(DomainTableError::Malformed(_))
        ));
    }
}
