//! Why a domain's settings or its start failed.

use std::fmt;

use urom_plugin::domain::DomainTableError;
use urom_wire::domain::MAX_TABLE_LEN;
use urom_wire::{DecodeError, Status};

use crate::WorkerFailure;
use crate::oob::OobError;

/// Why a domain setter refused its arguments. Never allocates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DomainConfigError {
    /// `set_workers` got a different number of ids and workers.
    WorkerCount {
        /// How many ids.
        ids: usize,
        /// How many workers.
        workers: usize,
    },
    /// `set_workers` got one domain id twice.
    DuplicateId(u64),
    /// `set_workers` got one worker twice.
    DuplicateWorker(u64),
    /// `add_buffer` before `set_buffers_count`.
    NoBufferCount,
    /// `add_buffer` after the count's buffers were added.
    BuffersFull {
        /// The count.
        count: usize,
    },
    /// `set_buffers_count` after buffers were added.
    BuffersAdded {
        /// How many were added.
        added: usize,
    },
    /// A buffer's memory handle or remote key is longer than a table holds.
    KeyTooLong {
        /// Its length.
        len: usize,
    },
}

impl DomainConfigError {
    /// The DOCA status for it.
    pub fn status(&self) -> Status {
        match self {
            Self::NoBufferCount | Self::BuffersAdded { .. } => Status::BadState,
            Self::BuffersFull { .. } => Status::Full,
            Self::WorkerCount { .. }
            | Self::DuplicateId(_)
            | Self::DuplicateWorker(_)
            | Self::KeyTooLong { .. } => Status::InvalidValue,
        }
    }
}

impl fmt::Display for DomainConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::WorkerCount { ids, workers } => write!(
                f,
                "{ids} domain ids for {workers} workers; give one id per worker"
            ),
            Self::DuplicateId(id) => write!(
                f,
                "domain id {id} is given twice; each worker needs an id of its own"
            ),
            Self::DuplicateWorker(id) => write!(f, "worker {id} is given twice"),
            Self::NoBufferCount => {
                f.write_str("a buffer was added before the buffer count was set")
            }
            Self::BuffersFull { count } => write!(
                f,
                "all {count} buffers of the buffer count are added already"
            ),
            Self::BuffersAdded { added } => write!(
                f,
                "the buffer count cannot change once buffers are added ({added} so far)"
            ),
            Self::KeyTooLong { len } => write!(
                f,
                "a packed key of {len} bytes is longer than a domain table holds"
            ),
        }
    }
}

impl std::error::Error for DomainConfigError {}

/// Why a domain did not start. Each one that concerns a rank names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DomainStartError {
    /// No out-of-band collective was set.
    NoOob,
    /// No worker was set.
    NoWorkers,
    /// Fewer buffers were added than the count said.
    BuffersMissing {
        /// How many were added.
        added: usize,
        /// The count.
        count: usize,
    },
    /// A worker was not running when the domain started.
    WorkerNotRunning {
        /// Its domain id.
        domain_id: u64,
        /// This host's rank.
        rank: u32,
        /// Why it no longer runs.
        failure: WorkerFailure,
    },
    /// A worker of this host failed while the domain started.
    WorkerFailed {
        /// Its domain id.
        domain_id: u64,
        /// This host's rank.
        rank: u32,
        /// How it failed.
        failure: WorkerFailure,
    },
    /// A plugin of this host's worker could not give its address.
    Address {
        /// The worker's domain id.
        domain_id: u64,
        /// This host's rank.
        rank: u32,
        /// The plugin's name.
        plugin: String,
        /// What its `addr` (or the worker) answered.
        status: Status,
    },
    /// A worker of this host refused the table.
    Refused {
        /// Its domain id.
        domain_id: u64,
        /// This host's rank.
        rank: u32,
        /// Its answer.
        status: Status,
    },
    /// This host's record is too large for a table.
    RecordTooLarge {
        /// This host's rank.
        rank: u32,
        /// Its length.
        len: usize,
    },
    /// The out-of-band collective failed (it names the rank when it knows it).
    Oob(OobError),
    /// Another rank could not take part.
    PeerFailed {
        /// Its rank.
        rank: u32,
        /// Why, as it said.
        status: Status,
    },
    /// A rank's record does not parse.
    BadRecord {
        /// Its rank.
        rank: u32,
        /// What is wrong with it.
        error: DecodeError,
    },
    /// The records do not make a table (two ranks claim one domain id).
    Table(DomainTableError),
}

impl DomainStartError {
    /// The DOCA status for it.
    pub fn status(&self) -> Status {
        match self {
            Self::NoOob
            | Self::NoWorkers
            | Self::BuffersMissing { .. }
            | Self::BadRecord { .. }
            | Self::Table(_) => Status::InvalidValue,
            Self::WorkerNotRunning { .. } => Status::BadState,
            Self::WorkerFailed { failure, .. } => failure.status(),
            Self::Address { status, .. }
            | Self::Refused { status, .. }
            | Self::PeerFailed { status, .. } => *status,
            Self::RecordTooLarge { .. } => Status::TooBig,
            Self::Oob(_) => Status::ConnectionAborted,
        }
    }

    /// The rank it concerns, when it concerns one.
    pub fn rank(&self) -> Option<u32> {
        match self {
            Self::WorkerNotRunning { rank, .. }
            | Self::WorkerFailed { rank, .. }
            | Self::Address { rank, .. }
            | Self::Refused { rank, .. }
            | Self::RecordTooLarge { rank, .. }
            | Self::PeerFailed { rank, .. }
            | Self::BadRecord { rank, .. } => Some(*rank),
            Self::Oob(e) => e.rank,
            Self::Table(DomainTableError::DuplicateId { second_rank, .. }) => Some(*second_rank),
            Self::NoOob | Self::NoWorkers | Self::BuffersMissing { .. } | Self::Table(_) => None,
        }
    }
}

impl fmt::Display for DomainStartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoOob => f.write_str("no out-of-band collective was set for the domain"),
            Self::NoWorkers => f.write_str("no worker was set for the domain"),
            Self::BuffersMissing { added, count } => write!(
                f,
                "{added} of the {count} buffers of the buffer count were added"
            ),
            Self::WorkerNotRunning {
                domain_id,
                rank,
                failure,
            } => write!(
                f,
                "rank {rank}: the worker of domain id {domain_id} does not run ({failure}); a \
                 domain's workers must be running"
            ),
            Self::WorkerFailed {
                domain_id,
                rank,
                failure,
            } => write!(
                f,
                "rank {rank}: the worker of domain id {domain_id} failed during the domain \
                 start: {failure}"
            ),
            Self::Address {
                domain_id,
                rank,
                plugin,
                status,
            } => write!(
                f,
                "rank {rank}: plugin {plugin} of the worker of domain id {domain_id} gave no \
                 address: {status}"
            ),
            Self::Refused {
                domain_id,
                rank,
                status,
            } => write!(
                f,
                "rank {rank}: the worker of domain id {domain_id} refused the domain table: \
                 {status}"
            ),
            Self::RecordTooLarge { rank, len } => write!(
                f,
                "rank {rank}: its record of {len} bytes exceeds the {MAX_TABLE_LEN} bytes of a \
                 domain table"
            ),
            Self::Oob(e) => write!(f, "the out-of-band exchange failed: {e}"),
            Self::PeerFailed { rank, status } => write!(
                f,
                "rank {rank} could not take part in the domain start: {status}"
            ),
            Self::BadRecord { rank, error } => {
                write!(f, "rank {rank} sent a malformed domain record: {error}")
            }
            Self::Table(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for DomainStartError {}
