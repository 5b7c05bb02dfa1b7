//! The start of a domain, step by step, as the progress engine drives it: the workers' plugin
//! addresses, the two allgathers, the table sent to each worker in chunks, and the last
//! allgather that says whether every rank's workers took it.

use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{Config, DomainBuffer, DomainStartError};
use crate::engine::Poll;
use crate::oob::{OobCollective, OobRequest};
use crate::worker::{DomainLink, DomainReply};
use urom_plugin::domain::DomainTable;
use urom_transport::{Armed, FrameSendError};
use urom_wire::domain::{
    AddressRequest, Buffer, DomainMessage, JOIN_BLOCK_LEN, JoinBlock, MAX_TABLE_LEN, MemberSpec,
    PluginAddress, READY_BLOCK_LEN, ReadyBlock, RecordRepr, RecordSpec, TABLE_CHUNK_HEADER_LEN,
    TableChunk, TableRepr,
};
use urom_wire::{DecodeError, FRAME_HEADER_LEN, MaxMsgSize, Status};

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
pub(super) struct Exchange {
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

/// How a finished start ended, with this rank and the collective, handed back once.
pub(super) type Finished = (
    Result<Arc<DomainTable>, DomainStartError>,
    u32,
    Option<Box<dyn OobCollective>>,
);

impl Exchange {
    pub(super) fn new(oob: Box<dyn OobCollective>, config: &Config) -> Self {
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

    /// The outcome once the start is over (running or failed), the first time it is asked.
    pub(super) fn finish(&mut self) -> Option<Finished> {
        let outcome = match &self.step {
            Step::Done(table) => Ok(Arc::clone(table)),
            Step::Failed(error) => Err(error.clone()),
            _ => return None,
        };
        self.step = Step::Over;
        Some((outcome, self.rank, self.oob.take()))
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
