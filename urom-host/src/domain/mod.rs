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
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use crate::engine::Poll;
use crate::oob::OobCollective;
use crate::worker::DomainLink;
use crate::{Idle, ProgressEngine, Running, Starting, State, Worker};
use urom_plugin::domain::DomainTable;
use urom_wire::domain::MAX_TABLE_LEN;

mod error;
mod exchange;

pub use error::{DomainConfigError, DomainStartError};
use exchange::Exchange;

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
        let finished = self.data.exchange.borrow_mut().finish();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oob::OobError;
    use urom_wire::Status;

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
