//! The domain context: what turns a set of workers, on this host and on others, into a team
//! whose plugins find each other.
//!
//! `Domain<Idle>` takes the out-of-band collective ([`OobCollective`]), this host's workers
//! with their domain ids, and the buffers the domain's plugins may reach (a count, then each
//! buffer's address, length, packed memory handle and packed remote key). `start()` returns
//! at once; the progress engine then drives the start, and [`Domain::try_running`] (or
//! [`Domain::wait_running`]) hands back `Domain<Running>` once it is done:
//!
//! 1. each worker is asked for the address of each of its plugins (the plugin's `addr`
//!    operation, called by the worker itself);
//! 2. the ranks allgather their records' lengths, then the records padded to the longest (this
//!    host's record: its workers' domain ids and plugin addresses, and its buffers);
//! 3. the table of every rank's record goes to each of this host's workers, in chunks, and
//!    each acknowledges it once it answers its plugins' domain lookups from it;
//! 4. the ranks allgather whether all their workers took the table: the domain runs on every
//!    rank or on none.
//!
//! A rank that cannot take part (one of its workers died, a plugin's address could not be
//! read, a worker refused the table) still takes part in the allgathers, saying so, so that
//! every rank fails naming it rather than waiting for it; a rank whose process dies is named
//! by the collective ([`crate::oob::SocketOob`] does). Byte formats: [`urom_wire::domain`].
//!
//! Errors follow DOCA's where DOCA has them: a buffer before a count is `DOCA_ERROR_BAD_STATE`,
//! more buffers than the count `DOCA_ERROR_FULL`, a worker that does not run at start
//! `DOCA_ERROR_BAD_STATE`; a setter after start does not exist (`Domain<Running>` has none).

use std::cell::RefCell;
use std::fmt;
use std::os::fd::BorrowedFd;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::engine::Poll;
use super::oob::{OobCollective, OobError, OobRequest};
use super::worker::{DomainLink, DomainReply, WorkerFailure};
use super::{Idle, ProgressEngine, Running, Starting, State, Worker};
use urom_plugin::domain::{DomainTable, DomainTableError};
use urom_transport::{Armed, FrameSendError};
use urom_wire::domain::{
    AddressRequest, Buffer, DomainMessage, JOIN_BLOCK_LEN, JoinBlock, MAX_TABLE_LEN, MemberSpec,
    PluginAddress, READY_BLOCK_LEN, ReadyBlock, RecordRepr, RecordSpec, TABLE_CHUNK_HEADER_LEN,
    TableChunk, TableRepr,
};
use urom_wire::{DecodeError, FRAME_HEADER_LEN, MaxMsgSize, Status};

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

/// A buffer the domain's plugins may reach, as the host added it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainBuffer {
    /// Its address in this host's memory.
    pub va: u64,
    /// Its length.
    pub len: u64,
    /// Its packed memory handle (empty when there is none to export: UCX 1.13 has none).
    pub memh: Vec<u8>,
    /// Its packed remote key.
    pub mkey: Vec<u8>,
}

/// One of this host's workers and its domain id.
struct Member {
    domain_id: u64,
    link: DomainLink,
}

/// Settings of a domain.
struct Config {
    oob: Option<Box<dyn OobCollective>>,
    members: Vec<Member>,
    buffer_count: Option<usize>,
    buffers: Vec<DomainBuffer>,
    /// The address of this host's memory worker, listed for each of its members.
    host_memory: Option<Vec<u8>>,
}

/// What an idle domain holds besides its settings: nothing.
pub struct Unstarted;

/// What a starting domain holds: the start, which the engine progresses.
pub struct Started {
    exchange: Rc<RefCell<Exchange>>,
}

/// What a running domain holds: the table every worker of it answers from.
pub struct Joined {
    table: Arc<DomainTable>,
    rank: u32,
}

/// A domain: this host's part of a team of workers across hosts. See the module docs.
pub struct Domain<S: State> {
    config: Box<Config>,
    data: S::Domain,
}

impl<S: State> fmt::Debug for Domain<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ids: Vec<u64> = self.config.members.iter().map(|m| m.domain_id).collect();
        f.debug_struct("Domain")
            .field("state", &core::any::type_name::<S>())
            .field("domain_ids", &ids)
            .field("buffers", &self.config.buffers.len())
            .finish()
    }
}

impl Default for Domain<Idle> {
    fn default() -> Self {
        Self::new()
    }
}

impl Domain<Idle> {
    /// A domain with no collective, no worker and no buffer.
    pub fn new() -> Self {
        Self {
            config: Box::new(Config {
                oob: None,
                members: Vec::new(),
                buffer_count: None,
                buffers: Vec::new(),
                host_memory: None,
            }),
            data: Unstarted,
        }
    }

    /// The out-of-band collective the hosts of the domain exchange their records with; its
    /// size is the number of hosts (ranks), its rank this host's.
    pub fn set_oob(mut self, oob: impl OobCollective + 'static) -> Self {
        self.config.oob = Some(Box::new(oob));
        self
    }

    /// This host's workers in the domain and the domain id of each (`ids[i]` for
    /// `workers[i]`): the ids plugins look members up by, unique across the domain. Replaces
    /// earlier ones. The domain holds on to the workers' channels (the start goes over them);
    /// a worker that is stopped or fails meanwhile fails the start.
    pub fn set_workers(
        mut self,
        ids: &[u64],
        workers: &[&Worker<Running>],
    ) -> Result<Self, (Self, DomainConfigError)> {
        if ids.len() != workers.len() {
            let error = DomainConfigError::WorkerCount {
                ids: ids.len(),
                workers: workers.len(),
            };
            return Err((self, error));
        }
        let mut members: Vec<Member> = Vec::with_capacity(ids.len());
        for (&domain_id, worker) in ids.iter().zip(workers) {
            let link = worker.domain_link();
            if members.iter().any(|m| m.domain_id == domain_id) {
                return Err((self, DomainConfigError::DuplicateId(domain_id)));
            }
            if members.iter().any(|m| m.link.same_worker(&link)) {
                return Err((self, DomainConfigError::DuplicateWorker(worker.id())));
            }
            members.push(Member { domain_id, link });
        }
        self.config.members = members;
        Ok(self)
    }

    /// How many buffers will be added (DOCA's `set_buffers_count`); before any is added.
    pub fn set_buffers_count(mut self, count: usize) -> Result<Self, (Self, DomainConfigError)> {
        if !self.config.buffers.is_empty() {
            let added = self.config.buffers.len();
            return Err((self, DomainConfigError::BuffersAdded { added }));
        }
        self.config.buffer_count = Some(count);
        Ok(self)
    }

    /// Adds a buffer the domain's plugins may reach: its address and length in this host's
    /// memory, its packed memory handle and packed remote key (either may be empty when there
    /// is none; lookups of it then answer `DOCA_ERROR_NOT_SUPPORTED`). Its segment number is
    /// the order it was added in, from 0.
    pub fn add_buffer(
        mut self,
        va: u64,
        len: u64,
        memh: &[u8],
        mkey: &[u8],
    ) -> Result<Self, (Self, DomainConfigError)> {
        let Some(count) = self.config.buffer_count else {
            return Err((self, DomainConfigError::NoBufferCount));
        };
        if self.config.buffers.len() >= count {
            return Err((self, DomainConfigError::BuffersFull { count }));
        }
        if let Some(len) = [memh.len(), mkey.len()]
            .into_iter()
            .find(|&len| len as u64 > MAX_TABLE_LEN)
        {
            return Err((self, DomainConfigError::KeyTooLong { len }));
        }
        self.config.buffers.push(DomainBuffer {
            va,
            len,
            memh: memh.to_vec(),
            mkey: mkey.to_vec(),
        });
        Ok(self)
    }

    /// The address of the worker through which peers reach this host's buffers with remote
    /// memory access (a UCP worker address: `HostMemory::address`, feature `ucx`). The
    /// domain lists it for each of this host's members under
    /// [`urom_plugin::domain::HOST_MEMORY_NAME`]; plugins find it with
    /// [`urom_plugin::Domain::host_memory_address`]. Replaces an earlier one.
    pub fn set_host_memory_address(mut self, address: &[u8]) -> Self {
        self.config.host_memory = Some(address.to_vec());
        self
    }

    /// The buffers added so far.
    pub fn buffers(&self) -> &[DomainBuffer] {
        &self.config.buffers
    }

    /// Starts the domain and returns at once; progress `engine` until
    /// [`Domain::try_running`] says it runs. The workers must be running.
    pub fn start(
        mut self,
        engine: &mut ProgressEngine,
    ) -> Result<Domain<Starting>, (Self, DomainStartError)> {
        if let Err(error) = self.check() {
            return Err((self, error));
        }
        let oob = self.config.oob.take().expect("checked");
        let rank = oob.rank();
        if let Some((domain_id, failure)) = self
            .config
            .members
            .iter()
            .find_map(|m| m.link.failure().map(|failure| (m.domain_id, failure)))
        {
            self.config.oob = Some(oob);
            let error = DomainStartError::WorkerNotRunning {
                domain_id,
                rank,
                failure,
            };
            return Err((self, error));
        }
        let exchange = Rc::new(RefCell::new(Exchange::new(oob, &self.config)));
        let poll: Rc<RefCell<dyn Poll>> = exchange.clone();
        engine.connect(&poll);
        Ok(Domain {
            config: self.config,
            data: Started { exchange },
        })
    }

    fn check(&self) -> Result<(), DomainStartError> {
        if self.config.oob.is_none() {
            return Err(DomainStartError::NoOob);
        }
        if self.config.members.is_empty() {
            return Err(DomainStartError::NoWorkers);
        }
        match self.config.buffer_count {
            Some(count) if self.config.buffers.len() < count => {
                Err(DomainStartError::BuffersMissing {
                    added: self.config.buffers.len(),
                    count,
                })
            }
            _ => Ok(()),
        }
    }
}

/// Where a starting domain is; failed, the idle domain keeps its collective, workers and
/// buffers.
pub type DomainStartProgress = super::Progress<Domain<Starting>, Domain<Idle>, DomainStartError>;

impl Domain<Starting> {
    /// Progresses `engine` until the domain runs or fails; still starting after `timeout`, it
    /// is handed back as [`DomainStartProgress::Starting`].
    pub fn wait_running(
        self,
        engine: &mut ProgressEngine,
        timeout: Duration,
    ) -> Result<Domain<Running>, DomainStartProgress> {
        super::start::wait_running(self, engine, timeout, Self::try_running)
    }

    /// The running domain once the engine's progress has started it.
    pub fn try_running(mut self) -> Result<Domain<Running>, DomainStartProgress> {
        let finished = {
            let mut exchange = self.data.exchange.borrow_mut();
            let outcome = match &exchange.step {
                Step::Done(table) => Some(Ok(Arc::clone(table))),
                Step::Failed(error) => Some(Err(error.clone())),
                _ => None,
            };
            outcome.map(|outcome| {
                exchange.step = Step::Over;
                (outcome, exchange.rank, exchange.oob.take())
            })
        };
        let Some((outcome, rank, oob)) = finished else {
            return Err(DomainStartProgress::Starting(self));
        };
        self.config.oob = oob;
        match outcome {
            Ok(table) => Ok(Domain {
                config: self.config,
                data: Joined { table, rank },
            }),
            Err(error) => Err(DomainStartProgress::Failed(
                Domain {
                    config: self.config,
                    data: Unstarted,
                },
                error,
            )),
        }
    }
}

impl Domain<Running> {
    /// The domain's table: every member and buffer of every rank, as the workers have it.
    pub fn table(&self) -> &DomainTable {
        &self.data.table
    }

    /// How many hosts (ranks) the domain has.
    pub fn ranks(&self) -> u32 {
        self.data.table.ranks()
    }

    /// This host's rank.
    pub fn rank(&self) -> u32 {
        self.data.rank
    }

    /// Leaves the domain: the idle domain comes back with its collective, workers and
    /// buffers. The workers keep answering lookups from the table until another domain starts
    /// on them.
    pub fn stop(self) -> Domain<Idle> {
        Domain {
            config: self.config,
            data: Unstarted,
        }
    }
}

/// Request ids, unique in this process, so that a reply to an abandoned start is never taken
/// for one of a later start.
static NEXT_REQUEST: AtomicU64 = AtomicU64::new(1);

fn next_request() -> u64 {
    NEXT_REQUEST.fetch_add(1, Ordering::Relaxed)
}

/// A worker's part in the start.
struct WorkerStart {
    domain_id: u64,
    link: DomainLink,
    /// Address requests not yet sent: (request id, plugin id, plugin name).
    to_ask: Vec<(u64, u64, String)>,
    /// Sent and not yet answered.
    asked: Vec<(u64, u64, String)>,
    /// The addresses it gave: (plugin name, address).
    addresses: Vec<(String, Vec<u8>)>,
    /// The table request's id, and how much of the table went out.
    table_request: u64,
    table_sent: usize,
    acked: bool,
}

/// The steps of a start.
enum Step {
    /// Asking the workers for their plugins' addresses.
    Addresses,
    /// The first allgather: record lengths.
    Join(OobRequest),
    /// The second: the records.
    Records(OobRequest, Vec<usize>),
    /// Sending the table to the workers and waiting for their acks.
    Table(Arc<DomainTable>),
    /// The last allgather: whether every rank's workers took the table.
    Ready(OobRequest, Arc<DomainTable>),
    /// Running.
    Done(Arc<DomainTable>),
    /// Failed.
    Failed(DomainStartError),
    /// Handed over to the domain context.
    Over,
}

/// A domain start, progressed by the engine.
struct Exchange {
    oob: Option<Box<dyn OobCollective>>,
    rank: u32,
    workers: Vec<WorkerStart>,
    buffers: Vec<DomainBuffer>,
    host_memory: Option<Vec<u8>>,
    step: Step,
    /// Why this rank cannot take part, once it knows; it still takes part in the allgathers
    /// to say so.
    local_failure: Option<DomainStartError>,
    /// The table's bytes while they are sent.
    table_bytes: Vec<u8>,
}

impl Exchange {
    fn new(oob: Box<dyn OobCollective>, config: &Config) -> Self {
        let rank = oob.rank();
        let workers = config
            .members
            .iter()
            .map(|member| {
                let link = member.link.clone();
                link.set_inbox_open(true);
                let to_ask = link
                    .plugins()
                    .into_iter()
                    .map(|(id, name)| (next_request(), id, name))
                    .collect();
                WorkerStart {
                    domain_id: member.domain_id,
                    link,
                    to_ask,
                    asked: Vec::new(),
                    addresses: Vec::new(),
                    table_request: next_request(),
                    table_sent: 0,
                    acked: false,
                }
            })
            .collect();
        Self {
            oob: Some(oob),
            rank,
            workers,
            buffers: config.buffers.clone(),
            host_memory: config.host_memory.clone(),
            step: Step::Addresses,
            local_failure: None,
            table_bytes: Vec::new(),
        }
    }

    fn oob(&mut self) -> &mut dyn OobCollective {
        self.oob
            .as_deref_mut()
            .expect("held until the start is over")
    }

    /// Notes why this rank cannot take part (the first reason wins).
    fn local_fail(&mut self, error: DomainStartError) {
        self.local_failure.get_or_insert(error);
    }

    /// Checks that every worker still runs.
    fn check_workers(&mut self) {
        let rank = self.rank;
        let failed = self
            .workers
            .iter()
            .find_map(|w| w.link.failure().map(|failure| (w.domain_id, failure)));
        if let Some((domain_id, failure)) = failed {
            self.local_fail(DomainStartError::WorkerFailed {
                domain_id,
                rank,
                failure,
            });
        }
    }

    /// Step 1: sends what it can of the address requests, takes the replies; true once every
    /// plugin answered (or this rank failed).
    fn addresses(&mut self) -> bool {
        let rank = self.rank;
        let mut failures = Vec::new();
        for worker in &mut self.workers {
            while let Some((request, plugin, name)) = worker.to_ask.last().cloned() {
                match worker
                    .link
                    .send(DomainMessage::DomainAddressRequest(AddressRequest {
                        request,
                        plugin,
                    })) {
                    Ok(()) => {
                        worker.to_ask.pop();
                        worker.asked.push((request, plugin, name));
                    }
                    Err(FrameSendError::Full) => break,
                    // The channel broke: the worker's failure says why.
                    Err(_) => break,
                }
            }
            while let Some(reply) = worker.link.take_reply() {
                let DomainReply::Address {
                    request,
                    status,
                    address,
                    ..
                } = reply
                else {
                    continue;
                };
                let Some(at) = worker.asked.iter().position(|(r, ..)| *r == request) else {
                    continue;
                };
                let (_, _, name) = worker.asked.swap_remove(at);
                match status {
                    Status::Success if !address.is_empty() => {
                        worker.addresses.push((name, address));
                    }
                    // No address to give: lookups of it answer NOT_FOUND.
                    Status::Success | Status::NotFound | Status::NotSupported => {}
                    status => failures.push(DomainStartError::Address {
                        domain_id: worker.domain_id,
                        rank,
                        plugin: name,
                        status,
                    }),
                }
            }
        }
        for failure in failures {
            self.local_fail(failure);
        }
        self.check_workers();
        self.local_failure.is_some()
            || self
                .workers
                .iter()
                .all(|w| w.to_ask.is_empty() && w.asked.is_empty())
    }

    /// This rank's record.
    fn record(&self) -> Result<Vec<u8>, DomainStartError> {
        let plugins: Vec<Vec<PluginAddress<'_>>> = self
            .workers
            .iter()
            .map(|worker| {
                let mut plugins: Vec<PluginAddress<'_>> = worker
                    .addresses
                    .iter()
                    .map(|(name, address)| PluginAddress { name, address })
                    .chain(self.host_memory.as_deref().map(|address| PluginAddress {
                        name: urom_plugin::domain::HOST_MEMORY_NAME,
                        address,
                    }))
                    .collect();
                plugins.sort_by(|a, b| a.name.cmp(b.name));
                plugins
            })
            .collect();
        let members: Vec<MemberSpec<'_>> = self
            .workers
            .iter()
            .zip(&plugins)
            .map(|(worker, plugins)| MemberSpec {
                domain_id: worker.domain_id,
                plugins,
            })
            .collect();
        let buffers: Vec<Buffer<'_>> = self
            .buffers
            .iter()
            .map(|b| Buffer {
                va: b.va,
                len: b.len,
                memh: &b.memh,
                mkey: &b.mkey,
            })
            .collect();
        let spec = RecordSpec {
            rank: self.rank,
            members: &members,
            buffers: &buffers,
        };
        let len = spec.buffer_len();
        let mut bytes = vec![0; len];
        spec.emit(&mut bytes)
            .map_err(|_| DomainStartError::RecordTooLarge {
                rank: self.rank,
                len,
            })?;
        Ok(bytes)
    }

    /// Starts the first allgather, with this rank's record length or its failure.
    fn start_join(&mut self) -> Step {
        let record = match &self.local_failure {
            Some(_) => None,
            None => match self.record() {
                Ok(record) => Some(record),
                Err(error) => {
                    self.local_fail(error);
                    None
                }
            },
        };
        let block = JoinBlock {
            record_len: record.as_ref().map_or(0, |r| r.len() as u64),
            status: self.local_status(),
        };
        self.table_bytes = record.unwrap_or_default();
        let mut bytes = [0u8; JOIN_BLOCK_LEN];
        block.emit(&mut bytes).expect("sized for it");
        match self.oob().allgather(&bytes) {
            Ok(request) => Step::Join(request),
            Err(e) => Step::Failed(DomainStartError::Oob(e)),
        }
    }

    fn local_status(&self) -> Status {
        self.local_failure
            .as_ref()
            .map_or(Status::Success, DomainStartError::status)
    }

    /// Tests `request`; `Some` with the next step when it completed or failed.
    fn test(&mut self, request: &mut OobRequest) -> Option<Result<(), DomainStartError>> {
        match self.oob().test(request) {
            Ok(true) => Some(Ok(())),
            Ok(false) => None,
            Err(e) => Some(Err(DomainStartError::Oob(e))),
        }
    }

    /// After the first allgather: every rank's record length, or the first rank that failed.
    fn after_join(&mut self, request: OobRequest) -> Step {
        let size = self.oob().size();
        let mut lens = Vec::with_capacity(size as usize);
        let mut failed = None;
        for rank in 0..size {
            match JoinBlock::parse(request.block(rank)) {
                Ok(block) if block.status.is_success() && block.record_len <= MAX_TABLE_LEN => {
                    lens.push(block.record_len as usize);
                }
                Ok(block) if block.status.is_success() => {
                    failed.get_or_insert(DomainStartError::RecordTooLarge {
                        rank,
                        len: block.record_len as usize,
                    });
                }
                Ok(block) => {
                    failed.get_or_insert(DomainStartError::PeerFailed {
                        rank,
                        status: block.status,
                    });
                }
                Err(error) => {
                    failed.get_or_insert(DomainStartError::BadRecord { rank, error });
                }
            }
        }
        self.oob().free(request);
        if let Some(local) = self.local_failure.take() {
            return Step::Failed(local);
        }
        if let Some(error) = failed {
            return Step::Failed(error);
        }
        let longest = lens.iter().copied().max().unwrap_or(0);
        let mut padded = std::mem::take(&mut self.table_bytes);
        padded.resize(longest, 0);
        match self.oob().allgather(&padded) {
            Ok(request) => Step::Records(request, lens),
            Err(e) => Step::Failed(DomainStartError::Oob(e)),
        }
    }

    /// After the second allgather: the table, checked.
    fn after_records(&mut self, request: OobRequest, lens: &[usize]) -> Step {
        let mut records = Vec::with_capacity(lens.len());
        for (rank, &len) in (0u32..).zip(lens) {
            let bytes = request.block(rank).get(..len).unwrap_or_default();
            match RecordRepr::parse(bytes) {
                Ok(record) if record.rank == rank => records.push(bytes),
                Ok(record) => {
                    let error = DecodeError::RankMismatch {
                        expected: rank,
                        found: record.rank,
                    };
                    return self.free_then(request, DomainStartError::BadRecord { rank, error });
                }
                Err(error) => {
                    return self.free_then(request, DomainStartError::BadRecord { rank, error });
                }
            }
        }
        let mut table = vec![0; TableRepr::buffer_len(&records)];
        let built = TableRepr::emit(&records, &mut table)
            .map_err(|_| DomainStartError::RecordTooLarge {
                rank: self.rank,
                len: table.len(),
            })
            .and_then(|_| DomainTable::parse(&table).map_err(DomainStartError::Table));
        self.oob().free(request);
        match built {
            Ok(parsed) => {
                self.table_bytes = table;
                Step::Table(Arc::new(parsed))
            }
            Err(error) => Step::Failed(error),
        }
    }

    fn free_then(&mut self, request: OobRequest, error: DomainStartError) -> Step {
        self.oob().free(request);
        Step::Failed(error)
    }

    /// Step 3: sends what it can of the table to each worker and takes their acks; true once
    /// every worker answered (or this rank failed).
    fn send_table(&mut self) -> bool {
        let rank = self.rank;
        let mut refusals = Vec::new();
        for worker in &mut self.workers {
            let room = chunk_room(worker.link.max_msg_size());
            while worker.table_sent < self.table_bytes.len() {
                let end = (worker.table_sent + room).min(self.table_bytes.len());
                let chunk = TableChunk {
                    request: worker.table_request,
                    table_len: self.table_bytes.len() as u64,
                    offset: worker.table_sent as u64,
                    bytes: &self.table_bytes[worker.table_sent..end],
                };
                match worker.link.send(DomainMessage::DomainTableChunk(chunk)) {
                    Ok(()) => worker.table_sent = end,
                    // Full: the next turn; broken: the worker's failure says why.
                    Err(_) => break,
                }
            }
            while let Some(reply) = worker.link.take_reply() {
                match reply {
                    DomainReply::Ack { request, status } if request == worker.table_request => {
                        worker.acked = true;
                        if !status.is_success() {
                            refusals.push(DomainStartError::Refused {
                                domain_id: worker.domain_id,
                                rank,
                                status,
                            });
                        }
                    }
                    _ => {}
                }
            }
        }
        for refusal in refusals {
            self.local_fail(refusal);
        }
        self.check_workers();
        self.local_failure.is_some() || self.workers.iter().all(|w| w.acked)
    }

    fn start_ready(&mut self, table: Arc<DomainTable>) -> Step {
        let block = ReadyBlock {
            status: self.local_status(),
        };
        let mut bytes = [0u8; READY_BLOCK_LEN];
        block.emit(&mut bytes).expect("sized for it");
        match self.oob().allgather(&bytes) {
            Ok(request) => Step::Ready(request, table),
            Err(e) => Step::Failed(DomainStartError::Oob(e)),
        }
    }

    fn after_ready(&mut self, request: OobRequest, table: Arc<DomainTable>) -> Step {
        let size = self.oob().size();
        let failed = (0..size).find_map(|rank| match ReadyBlock::parse(request.block(rank)) {
            Ok(block) if block.status.is_success() => None,
            Ok(block) => Some(DomainStartError::PeerFailed {
                rank,
                status: block.status,
            }),
            Err(error) => Some(DomainStartError::BadRecord { rank, error }),
        });
        self.oob().free(request);
        if let Some(local) = self.local_failure.take() {
            return Step::Failed(local);
        }
        match failed {
            Some(error) => Step::Failed(error),
            None => Step::Done(table),
        }
    }

    /// One turn: as far as the start can go now; whether anything happened.
    fn advance(&mut self) -> bool {
        let step = std::mem::replace(&mut self.step, Step::Over);
        let (next, worked) = match step {
            Step::Addresses => {
                if self.addresses() {
                    (self.start_join(), true)
                } else {
                    (Step::Addresses, false)
                }
            }
            Step::Join(mut request) => match self.test(&mut request) {
                None => (Step::Join(request), false),
                Some(Ok(())) => (self.after_join(request), true),
                Some(Err(e)) => (self.free_then(request, e), true),
            },
            Step::Records(mut request, lens) => match self.test(&mut request) {
                None => (Step::Records(request, lens), false),
                Some(Ok(())) => (self.after_records(request, &lens), true),
                Some(Err(e)) => (self.free_then(request, e), true),
            },
            Step::Table(table) => {
                if self.send_table() {
                    (self.start_ready(table), true)
                } else {
                    (Step::Table(table), false)
                }
            }
            Step::Ready(mut request, table) => match self.test(&mut request) {
                None => (Step::Ready(request, table), false),
                Some(Ok(())) => (self.after_ready(request, table), true),
                Some(Err(e)) => (self.free_then(request, e), true),
            },
            done @ (Step::Done(_) | Step::Failed(_) | Step::Over) => (done, false),
        };
        self.step = next;
        worked
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        // Replies to this start are not waited for any more.
        for worker in &self.workers {
            worker.link.set_inbox_open(false);
        }
    }
}

/// The most table bytes one chunk carries on a channel of `max`-byte frames.
fn chunk_room(max: MaxMsgSize) -> usize {
    max.get() - FRAME_HEADER_LEN - TABLE_CHUNK_HEADER_LEN
}

impl Poll for Exchange {
    fn poll(&mut self) -> usize {
        let mut work = 0;
        // Several steps may complete in one turn (a single rank gathers at once).
        while self.advance() {
            work += 1;
        }
        work
    }

    fn arm(&mut self, _watch: &mut dyn FnMut(BorrowedFd<'_>)) -> Armed {
        match self.step {
            // The workers' channels wake the engine on replies; the collective cannot be
            // watched: look again soon.
            Step::Addresses
            | Step::Join(_)
            | Step::Records(..)
            | Step::Table(_)
            | Step::Ready(..) => Armed::Unsupported,
            Step::Done(_) | Step::Failed(_) | Step::Over => Armed::Armed { fresh: false },
        }
    }

    fn disarm(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_need_a_count_first_and_no_more_than_it() {
        let domain = Domain::new();
        let (domain, error) = domain.add_buffer(0x1000, 64, b"", b"key").err().unwrap();
        assert_eq!(error, DomainConfigError::NoBufferCount);
        assert_eq!(error.status(), Status::BadState);
        let domain = domain.set_buffers_count(2).ok().unwrap();
        let domain = domain.add_buffer(0x1000, 64, b"", b"key").ok().unwrap();
        let domain = domain.add_buffer(0x2000, 64, b"mh", b"key").ok().unwrap();
        let (domain, error) = domain.add_buffer(0x3000, 64, b"", b"").err().unwrap();
        assert_eq!(error, DomainConfigError::BuffersFull { count: 2 });
        assert_eq!(error.status(), Status::Full);
        assert_eq!(
            error.to_string(),
            "all 2 buffers of the buffer count are added already"
        );
        let (domain, error) = domain.set_buffers_count(4).err().unwrap();
        assert_eq!(error, DomainConfigError::BuffersAdded { added: 2 });
        assert_eq!(error.status(), Status::BadState);
        assert_eq!(domain.buffers().len(), 2);
        assert_eq!(domain.buffers()[1].memh, b"mh");
    }

    #[test]
    fn a_domain_without_a_collective_or_workers_does_not_start() {
        let mut engine = ProgressEngine::new();
        let (domain, error) = Domain::new().start(&mut engine).err().unwrap();
        assert_eq!(error, DomainStartError::NoOob);
        assert_eq!(error.status(), Status::InvalidValue);
        let oob = crate::oob::SocketOob::join(
            &crate::oob::RendezvousAddr::Tcp("127.0.0.1:1".into()),
            1,
            0,
            Duration::from_secs(1),
        )
        .unwrap();
        let (domain, error) = domain.set_oob(oob).start(&mut engine).err().unwrap();
        assert_eq!(error, DomainStartError::NoWorkers);
        let domain = domain.set_buffers_count(1).ok().unwrap();
        let (_, error) = domain.set_workers(&[1], &[]).err().unwrap();
        assert_eq!(error, DomainConfigError::WorkerCount { ids: 1, workers: 0 });
        assert_eq!(error.status(), Status::InvalidValue);
    }

    #[test]
    fn errors_name_their_rank() {
        let error = DomainStartError::PeerFailed {
            rank: 3,
            status: Status::NotConnected,
        };
        assert_eq!(error.rank(), Some(3));
        assert_eq!(
            error.to_string(),
            "rank 3 could not take part in the domain start: DOCA_ERROR_NOT_CONNECTED (14)"
        );
        let error = DomainStartError::Oob(OobError::of_rank(2, "left the rendezvous"));
        assert_eq!(error.rank(), Some(2));
        assert_eq!(
            error.to_string(),
            "the out-of-band exchange failed: rank 2: left the rendezvous"
        );
    }
}
