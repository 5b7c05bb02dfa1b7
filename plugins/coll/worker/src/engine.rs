//! The collective engine: teams of the node's ranks, their registered buffers, their persistent
//! collectives, and the execution of started collectives in chunks.
//!
//! A team runs its collectives one after the other, in the order its ranks started them (MPI's
//! rule: every rank starts the same collectives in the same order); a rank may have up to
//! [`QUEUE`] started and not complete. Once every member started the one at the head, the
//! engine moves at most [`CHUNK`] bytes of it per [`Team::advance`] (small blocks batched, large
//! ones in chunks), copying through the plugin's two preallocated scratch buffers, so that a
//! 64 MiB allreduce does not keep the worker from its other teams and hosts. Nothing is allocated per start: queues, scratch and
//! the collectives' arguments are allocated when teams, buffers and collectives are set up.
//!
//! Every collective is a sequence of *blocks* (one per source rank, per pair of ranks, or one
//! for the whole vector), each copied or reduced chunk by chunk. Reductions fold the ranks in
//! rank order, `((x0 op x1) op x2) ...` (see [`crate::reduce`]).
//!
//! A team spanning several nodes has a [`Span`]: this worker serves the members on its node,
//! and each collective runs in windows: the node's part of a window (the local ranks folded in
//! rank order, or the root's data) goes into the span's accumulator, the span exchanges it with
//! the other nodes' workers ([`crate::internode`]), and the window is written back to the local
//! ranks. A single-node team has no span and never touches the network.

use std::time::Instant;

use urom_coll_wire::{
    CollArgs, CollKind, CollNotification, Datatype, NO_RANK, Opcode, Reason, ReduceOp,
};
use urom_plugin::Notifier;
use urom_wire::Status;

use crate::internode::{
    ABORT_TAG, CONTROL_SERIAL, Exchange, Links, Net, NetError, SMALL, Span, TOKEN_ABORT_OUT, token,
};
use crate::reduce;
use std::sync::Mutex;

use crate::sys::{
    CrossMemoryError, PidFd, Pool, SharedMap, allowed_cores, cma_read, cma_write, online_cpus,
};

/// Bytes a collective moves per step.
pub const CHUNK: usize = 256 * 1024;
/// Collectives a rank may have started and not complete on one team.
pub const QUEUE: usize = 64;
/// The most collective ids of a team.
pub const MAX_COLLS: u32 = 4096;
/// The most buffer ids of a rank on a team.
pub const MAX_BUFFERS: u32 = 1024;

/// What failed, and which rank it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// Why.
    pub reason: Reason,
    /// The rank at fault, or [`NO_RANK`].
    pub rank: u32,
}

impl Fault {
    /// A fault of `rank` for `reason`.
    pub fn new(reason: Reason, rank: u32) -> Self {
        Self { reason, rank }
    }

    /// A fault that names no rank.
    pub fn plain(reason: Reason) -> Self {
        Self::new(reason, NO_RANK)
    }

    /// The DOCA status it is reported with.
    pub fn status(&self) -> Status {
        match self.reason {
            Reason::None => Status::Success,
            Reason::RankExited | Reason::RankDisconnected | Reason::PeerWorker => {
                Status::ConnectionAborted
            }
            Reason::TeamFailed | Reason::UnknownColl => Status::BadState,
            Reason::CrossMemoryDenied => Status::NotPermitted,
            Reason::QueueFull => Status::Full,
            Reason::InterNode | Reason::NotAcrossNodes => Status::NotSupported,
            Reason::CopyFailed => Status::IoFailed,
            Reason::BufferBusy => Status::InUse,
            Reason::UnknownTeam => Status::NotFound,
            _ => Status::InvalidValue,
        }
    }
}

/// How the worker reaches a registered buffer.
pub enum Access {
    /// Shared memory, mapped here.
    Shared(SharedMap),
    /// The rank's own memory at `addr`, by cross-memory attach.
    Cross {
        /// Its address in the rank's process.
        addr: u64,
    },
}

/// A registered buffer.
pub struct Buffer {
    access: Access,
    len: u64,
}

#[derive(Clone, Copy, Default)]
struct Start {
    coll: u32,
    ctx: u64,
}

/// A rank's started collectives, oldest first; fixed capacity.
struct Ring {
    slots: Box<[Start]>,
    head: usize,
    len: usize,
}

impl Ring {
    fn new() -> Self {
        Self {
            slots: vec![Start::default(); QUEUE].into_boxed_slice(),
            head: 0,
            len: 0,
        }
    }

    fn push(&mut self, start: Start) -> bool {
        if self.len == self.slots.len() {
            return false;
        }
        let at = (self.head + self.len) % self.slots.len();
        self.slots[at] = start;
        self.len += 1;
        true
    }

    fn front(&self) -> Option<Start> {
        (self.len > 0).then(|| self.slots[self.head])
    }

    fn pop(&mut self) -> Option<Start> {
        let front = self.front()?;
        self.head = (self.head + 1) % self.slots.len();
        self.len -= 1;
        Some(front)
    }

    fn contains(&self, coll: u32) -> bool {
        (0..self.len).any(|i| self.slots[(self.head + i) % self.slots.len()].coll == coll)
    }
}

/// One rank of a team: its connection, process, buffers and started collectives.
pub struct Member {
    dest_id: u64,
    plugin: u64,
    pid: u32,
    buffers: Vec<Option<Buffer>>,
    queue: Ring,
    /// Its TEAM_CREATE, answered once every member joined.
    create_ctx: Option<u64>,
}

/// One rank's arguments of a collective.
struct RankColl {
    args: CollArgs,
    words: Vec<u64>,
}

/// A persistent collective: each rank's arguments.
struct CollState {
    ranks: Vec<Option<RankColl>>,
    /// The cross-rank check, once made.
    checked: Option<Result<(), Fault>>,
    /// On a team spanning nodes: the digest of its arguments this node sends each node
    /// (computed with the check).
    digests: Vec<u64>,
}

/// Where a block starts: a rank's buffer and a byte offset in it.
#[derive(Clone, Copy, Debug)]
struct Loc {
    rank: usize,
    buf: u32,
    off: u64,
}

impl Loc {
    fn at(self, off: u64) -> Self {
        Self {
            off: self.off + off,
            ..self
        }
    }
}

/// What a block does.
enum Mode {
    /// Nothing (an in-place rank's own block, the lower half of an in-place exchange).
    Skip,
    /// Copy from `src` to every destination.
    Copy(Loc),
    /// Reduce every rank's source into every destination.
    Reduce,
    /// Exchange two ranges.
    Swap(Loc, Loc),
}

/// What moves between two ranks of this node (copy collectives on a team spanning nodes).
enum Move {
    /// From the first range to the second.
    Copy(Loc, Loc),
    /// Exchange two ranges (in-place alltoall).
    Swap(Loc, Loc),
}

/// Folds words into a 64-bit digest (FNV-1a over their bytes).
struct Digest(u64);

impl Digest {
    fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }

    fn add(&mut self, word: u64) {
        for byte in word.to_le_bytes() {
            self.0 = (self.0 ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// The collective running on a team.
struct Active {
    coll: u32,
    block: u64,
    off: u64,
}

/// Where the running collective of a team spanning nodes is.
struct Flight {
    exchange: Exchange,
    /// Bytes of the vector.
    len: u64,
    /// Where the current window starts, its length and its number.
    pos: u64,
    win: usize,
    window: u64,
    stage: Stage,
    /// The local pass of a copy collective: (block, byte).
    local: (usize, u64),
}

/// The stage of a window.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// The local ranks' part goes into the accumulator.
    Gather,
    /// The accumulator is exchanged with the other nodes.
    Exchange,
    /// The accumulator goes to the local ranks (once every node's digest matched).
    Scatter,
    /// Every window is done: wait for the nodes' digests (a collective with nothing to move).
    Verify,
    /// Copy collectives: the blocks between ranks of this node.
    Local,
}

/// Where a rank lives, for a team spanning nodes: this worker's node, every rank's node, each
/// node's worker's domain id.
pub struct Placement<'a> {
    /// This worker's node.
    pub me: usize,
    /// Every rank's node.
    pub node_of: &'a [zerocopy::little_endian::U32],
    /// Each node's worker's domain id.
    pub workers: &'a [zerocopy::little_endian::U64],
}

/// A team of the node's ranks.
pub struct Team {
    key: u64,
    serial: u32,
    /// The ranks this worker serves, in rank order (all of them on a single-node team).
    local: Vec<usize>,
    span: Option<Box<Span>>,
    flight: Option<Flight>,
    pids: Vec<u32>,
    pidfds: Vec<Option<PidFd>>,
    members: Vec<Option<Member>>,
    joined: usize,
    left: usize,
    formed: bool,
    failed: Option<Fault>,
    colls: Vec<Option<CollState>>,
    active: Option<Active>,
    /// A failure the other nodes' workers must be told about (an abort message).
    tell: Option<Fault>,
    /// Whether the other nodes were told (or told this one) already.
    told: bool,
}

/// The scratch the engine copies through: two chunks, 8-byte aligned; and, once a large step
/// needs them, the helper threads and a pair of chunks for each thread (see [`Threads`]).
pub struct Scratch {
    a: Vec<u64>,
    b: Vec<u64>,
    threads: Threads,
}

impl Default for Scratch {
    fn default() -> Self {
        Self {
            a: vec![0; CHUNK / 8],
            b: vec![0; CHUNK / 8],
            threads: Threads::default(),
        }
    }
}

/// A step of at least this many bytes is split among the worker's threads (smaller ones run
/// on the worker's thread alone).
pub const PARALLEL_MIN: u64 = 64 * 1024;

/// The fewest bytes of one part of a split step.
const PART_MIN: u64 = 16 * 1024;

/// The worker's threads: as many as its cpuset has cores (or `UROM_COLL_THREADS`), started
/// when the first step of at least [`PARALLEL_MIN`] bytes comes.
#[derive(Default)]
pub struct Threads {
    /// Whether the pool was started (or found not needed).
    started: bool,
    pool: Option<Pool>,
    /// Each thread's pair of chunks (a part locks its own: never contended).
    parts: Vec<Part>,
}

impl Threads {
    /// Uses `cores` (the first for the calling thread, one helper on each other); an empty
    /// list or a single core keeps every step on the calling thread.
    pub fn start_on(&mut self, cores: &[usize]) {
        self.started = true;
        self.pool = Pool::start(cores);
        let n = self.pool.as_ref().map_or(0, Pool::threads);
        self.parts = (0..n)
            .map(|_| Mutex::new((vec![0; CHUNK / 8], vec![0; CHUNK / 8])))
            .collect();
    }

    /// The pool and each thread's chunks, started on the worker's cpuset at the first call.
    fn pool(&mut self) -> Option<(&Pool, &[Part])> {
        if !self.started {
            let cores = allowed_cores();
            let limit = std::env::var("UROM_COLL_THREADS")
                .ok()
                .and_then(|v| v.parse::<usize>().ok());
            self.start_on(&cores[..threads_for(cores.len(), online_cpus(), limit)]);
        }
        Some((self.pool.as_ref()?, &self.parts))
    }
}

/// A thread's pair of chunks.
type Part = Mutex<(Vec<u64>, Vec<u64>)>;

/// The most threads the worker uses without `UROM_COLL_THREADS`.
const MAX_THREADS: usize = 8;

/// How many threads a worker whose cpuset has `allowed` cores uses, on a machine of `online`
/// CPUs, `limit` being `UROM_COLL_THREADS`: the cores of its cpuset (at most [`MAX_THREADS`])
/// when the host gave it cores of its own, a cpuset smaller than the machine; one when it may
/// run anywhere, where it shares its cores with the ranks and helpers would take them from
/// the ranks (and from itself). `UROM_COLL_THREADS` decides either way (up to the cpuset).
fn threads_for(allowed: usize, online: Option<usize>, limit: Option<usize>) -> usize {
    let own = online.is_some_and(|online| allowed < online);
    let n = match limit {
        Some(n) => n,
        None if own => MAX_THREADS,
        None => 1,
    };
    n.clamp(1, allowed.max(1)).min(allowed)
}

/// Where answers go: the plugin's notifier and what every notification carries.
pub struct Answers<'o, 'n> {
    /// The notifier of the call.
    pub out: &'o mut Notifier<'n>,
    /// The worker's process id.
    pub worker_pid: u32,
}

impl Answers<'_, '_> {
    /// Sends the answer to a command of `opcode` on `team` to connection `dest_id`.
    #[allow(clippy::too_many_arguments)]
    pub fn send(
        &mut self,
        dest_id: u64,
        plugin: u64,
        ctx: u64,
        opcode: Opcode,
        team: u64,
        id: u32,
        result: Result<(), Fault>,
    ) -> Result<(), Status> {
        let fault = result.err().unwrap_or(Fault::plain(Reason::None));
        let notification = CollNotification {
            opcode,
            status: fault.status().raw(),
            team,
            id,
            rank: fault.rank,
            reason: fault.reason,
            worker_pid: self.worker_pid,
        };
        let mut bytes = [0u8; urom_coll_wire::NOTIFICATION_LEN];
        notification
            .emit(&mut bytes)
            .map_err(|_| Status::Unexpected)?;
        self.out
            .notify(dest_id, plugin, ctx, fault.status(), &bytes)
    }
}

fn elems(count: u64, size: u64) -> Result<u64, Fault> {
    count
        .checked_mul(size)
        .ok_or(Fault::plain(Reason::InvalidArgs))
}

impl Team {
    /// A team `key` of the ranks whose processes are `pids`, in rank order; `serial` names it
    /// in the plugin. On a team spanning nodes (`placement`), this worker serves the ranks of
    /// its node only.
    pub fn new(key: u64, serial: u32, pids: &[u32], placement: Option<Placement<'_>>) -> Self {
        let local: Vec<usize> = match &placement {
            None => (0..pids.len()).collect(),
            Some(p) => (0..pids.len())
                .filter(|&r| p.node_of[r].get() as usize == p.me)
                .collect(),
        };
        let span = placement.map(|p| {
            Box::new(Span::new(
                key,
                serial,
                p.me,
                p.node_of.iter().map(|n| n.get()).collect(),
                p.workers.iter().map(|w| w.get()).collect(),
            ))
        });
        Self {
            key,
            serial,
            pidfds: (0..pids.len())
                .map(|r| local.contains(&r).then(|| PidFd::open(pids[r])).flatten())
                .collect(),
            local,
            span,
            flight: None,
            pids: pids.to_vec(),
            members: pids.iter().map(|_| None).collect(),
            joined: 0,
            left: 0,
            formed: false,
            failed: None,
            colls: Vec::new(),
            active: None,
            tell: None,
            told: false,
        }
    }

    /// Its key.
    pub fn key(&self) -> u64 {
        self.key
    }

    /// Its serial in the plugin (the high word of its network tokens).
    pub fn serial(&self) -> u32 {
        self.serial
    }

    /// Whether it spans several nodes.
    pub fn spans_nodes(&self) -> bool {
        self.span.is_some()
    }

    /// Takes a finished network operation of this team.
    pub fn on_net(&mut self, kind: u32, result: Result<Option<&[u8]>, NetError>) {
        if let Some(span) = self.span.as_mut() {
            span.on_net(kind, result);
        }
    }

    /// While its exchange waits for a peer: when it must look at its peers again.
    pub fn net_deadline(&self) -> Option<Instant> {
        self.span.as_ref().and_then(|s| s.deadline())
    }

    /// Whether every member left.
    pub fn is_empty(&self) -> bool {
        self.joined > 0 && self.left == self.joined
    }

    fn size(&self) -> usize {
        self.pids.len()
    }

    /// The rank connection `dest_id` has on it.
    pub fn rank_of(&self, dest_id: u64) -> Option<usize> {
        self.members
            .iter()
            .position(|m| m.as_ref().is_some_and(|m| m.dest_id == dest_id))
    }

    /// Rank `rank` joins over connection `dest_id`; answered once every member joined.
    #[allow(clippy::too_many_arguments)]
    pub fn join(
        &mut self,
        answers: &mut Answers<'_, '_>,
        rank: u32,
        pid: u32,
        pids: impl ExactSizeIterator<Item = u32> + Clone,
        placement: Option<Placement<'_>>,
        dest_id: u64,
        plugin: u64,
        ctx: u64,
    ) -> Result<(), Fault> {
        let mismatch = Fault::new(Reason::TeamMismatch, rank);
        if pids.len() != self.size() || !pids.clone().eq(self.pids.iter().copied()) {
            return Err(mismatch);
        }
        let same_place = match (&self.span, &placement) {
            (None, None) => true,
            (Some(span), Some(p)) => {
                span.me == p.me
                    && span
                        .node_of
                        .iter()
                        .copied()
                        .eq(p.node_of.iter().map(|n| n.get()))
                    && span
                        .workers
                        .iter()
                        .copied()
                        .eq(p.workers.iter().map(|w| w.get()))
            }
            _ => false,
        };
        if !same_place || !self.local.contains(&(rank as usize)) {
            return Err(mismatch);
        }
        if let Some(fault) = self.failed {
            return Err(fault);
        }
        let r = rank as usize;
        if self.pids[r] != pid || self.members[r].is_some() || self.rank_of(dest_id).is_some() {
            return Err(mismatch);
        }
        self.members[r] = Some(Member {
            dest_id,
            plugin,
            pid,
            buffers: Vec::new(),
            queue: Ring::new(),
            create_ctx: Some(ctx),
        });
        self.joined += 1;
        if self.joined == self.local.len() {
            self.formed = true;
            let key = self.key;
            let mut gone = None;
            for (rank, member) in self.members.iter_mut().enumerate() {
                let Some(member) = member.as_mut() else {
                    continue;
                };
                if let Some(ctx) = member.create_ctx.take() {
                    let sent = answers.send(
                        member.dest_id,
                        member.plugin,
                        ctx,
                        Opcode::TeamCreate,
                        key,
                        0,
                        Ok(()),
                    );
                    if sent.is_err() {
                        gone = Some(rank as u32);
                    }
                }
            }
            if let Some(rank) = gone {
                self.fail(answers, Fault::new(Reason::RankDisconnected, rank));
            }
        }
        Ok(())
    }

    /// Rank `rank` leaves. Collectives in flight fail, naming it; so does every later start.
    pub fn leave(&mut self, answers: &mut Answers<'_, '_>, rank: usize) {
        // Leaving is not a fault the other nodes hear of: their last collective may still be
        // finishing (its messages sent, not yet received).
        self.told = true;
        if self.failed.is_none() {
            self.fail(answers, Fault::new(Reason::TeamFailed, rank as u32));
        }
        if let Some(member) = self.members[rank].as_mut() {
            member.buffers.clear();
        }
        self.pidfds[rank] = None;
        self.left += 1;
    }

    /// Registers buffer `id` of `rank`.
    pub fn register(
        &mut self,
        rank: usize,
        id: u32,
        access: Access,
        len: u64,
    ) -> Result<(), Fault> {
        let fault = |reason| Fault::new(reason, rank as u32);
        if id >= MAX_BUFFERS {
            return Err(fault(Reason::InvalidArgs));
        }
        let member = self.members[rank]
            .as_mut()
            .ok_or(fault(Reason::UnknownTeam))?;
        let slot = id as usize;
        if member.buffers.len() <= slot {
            member.buffers.resize_with(slot + 1, || None);
        }
        if member.buffers[slot].is_some() {
            return Err(fault(Reason::UnknownBuffer));
        }
        member.buffers[slot] = Some(Buffer { access, len });
        Ok(())
    }

    /// The process id of `rank`.
    pub fn pid(&self, rank: usize) -> u32 {
        self.pids[rank]
    }

    /// Deregisters buffer `id` of `rank`, unless one of its collectives uses it.
    pub fn deregister(&mut self, rank: usize, id: u32) -> Result<(), Fault> {
        let fault = |reason| Fault::new(reason, rank as u32);
        let used = self.colls.iter().flatten().any(|c| {
            c.ranks[rank]
                .as_ref()
                .is_some_and(|rc| rc.args.send_buf == id || rc.args.recv_buf == id)
        });
        if used {
            return Err(fault(Reason::BufferBusy));
        }
        let member = self.members[rank]
            .as_mut()
            .ok_or(fault(Reason::UnknownTeam))?;
        member
            .buffers
            .get_mut(id as usize)
            .and_then(Option::take)
            .map(|_| ())
            .ok_or(fault(Reason::UnknownBuffer))
    }

    /// Checks that `count` elements of `size` bytes at element `off` of `rank`'s buffer `buf`
    /// lie inside it.
    fn need(&self, rank: usize, buf: u32, off: u64, count: u64, size: u64) -> Result<(), Fault> {
        let fault = |reason| Fault::new(reason, rank as u32);
        let bytes = elems(count, size).map_err(|_| fault(Reason::InvalidArgs))?;
        if bytes == 0 {
            return Ok(());
        }
        let start = elems(off, size).map_err(|_| fault(Reason::InvalidArgs))?;
        let end = start.checked_add(bytes).ok_or(fault(Reason::OutOfBounds))?;
        let member = self.members[rank]
            .as_ref()
            .ok_or(fault(Reason::UnknownTeam))?;
        let buffer = member
            .buffers
            .get(buf as usize)
            .and_then(Option::as_ref)
            .ok_or(fault(Reason::UnknownBuffer))?;
        if end > buffer.len {
            return Err(fault(Reason::OutOfBounds));
        }
        Ok(())
    }

    /// Sets up `rank`'s part of collective `args.coll`, after checking every range it touches
    /// lies inside a buffer that rank registered.
    pub fn init(&mut self, rank: usize, args: CollArgs, words: &[u64]) -> Result<(), Fault> {
        let fault = |reason| Fault::new(reason, rank as u32);
        let invalid = fault(Reason::InvalidArgs);
        let n = self.size() as u64;
        let r = rank as u64;
        if args.coll >= MAX_COLLS || words.len() != args.kind.words(self.size()) {
            return Err(invalid);
        }
        if matches!(args.kind, CollKind::Unknown(_)) {
            return Err(invalid);
        }
        if args.kind.rooted() && u64::from(args.root) >= n {
            return Err(invalid);
        }
        if args.kind.reduces() && !args.op.applies_to(args.datatype) {
            return Err(invalid);
        }
        let es = match (args.kind, args.datatype.size()) {
            (CollKind::Barrier, _) => 1,
            (_, Some(size)) => size as u64,
            (_, None) => return Err(invalid),
        };
        let ip = args.in_place();
        let is_root = u64::from(args.root) == r;
        if ip
            && matches!(
                args.kind,
                CollKind::Reduce | CollKind::Gather | CollKind::Scatter
            )
            && !is_root
        {
            return Err(invalid);
        }
        if ip && args.kind == CollKind::Bcast {
            return Err(invalid);
        }
        let (sb, so, rb, ro) = (args.send_buf, args.send_off, args.recv_buf, args.recv_off);
        let (count, rc) = (args.count, args.recv_count);
        let max_end = |counts: &[u64], displs: &[u64]| -> Result<u64, Fault> {
            counts
                .iter()
                .zip(displs)
                .filter(|(c, _)| **c > 0)
                .try_fold(0u64, |end, (c, d)| {
                    c.checked_add(*d).map(|e| end.max(e)).ok_or(invalid)
                })
        };
        let times_n = |c: u64| c.checked_mul(n).ok_or(invalid);
        match args.kind {
            CollKind::Barrier | CollKind::Unknown(_) => {}
            CollKind::Bcast => self.need(rank, sb, so, count, es)?,
            CollKind::Reduce => {
                if !(ip && is_root) {
                    self.need(rank, sb, so, count, es)?;
                }
                if is_root {
                    self.need(rank, rb, ro, count, es)?;
                }
            }
            CollKind::Allreduce => {
                if !ip {
                    self.need(rank, sb, so, count, es)?;
                }
                self.need(rank, rb, ro, count, es)?;
            }
            CollKind::ReduceScatterBlock => {
                if ip {
                    self.need(rank, rb, ro, times_n(rc)?, es)?;
                } else {
                    self.need(rank, sb, so, times_n(rc)?, es)?;
                    self.need(rank, rb, ro, rc, es)?;
                }
            }
            CollKind::Allgather => {
                if !ip {
                    self.need(rank, sb, so, count, es)?;
                }
                self.need(rank, rb, ro, times_n(rc)?, es)?;
            }
            CollKind::Allgatherv => {
                let n = self.size();
                if !ip {
                    self.need(rank, sb, so, count, es)?;
                }
                self.need(rank, rb, ro, max_end(&words[..n], &words[n..])?, es)?;
            }
            CollKind::Alltoall => {
                if !ip {
                    self.need(rank, sb, so, times_n(count)?, es)?;
                }
                self.need(rank, rb, ro, times_n(rc)?, es)?;
            }
            CollKind::Alltoallv => {
                let n = self.size();
                if !ip {
                    self.need(rank, sb, so, max_end(&words[..n], &words[n..2 * n])?, es)?;
                }
                let recv_end = max_end(&words[2 * n..3 * n], &words[3 * n..])?;
                self.need(rank, rb, ro, recv_end, es)?;
            }
            CollKind::Gather => {
                if !(ip && is_root) {
                    self.need(rank, sb, so, count, es)?;
                }
                if is_root {
                    self.need(rank, rb, ro, times_n(rc)?, es)?;
                }
            }
            CollKind::Scatter => {
                if is_root {
                    self.need(rank, sb, so, times_n(count)?, es)?;
                }
                if !(ip && is_root) {
                    self.need(rank, rb, ro, rc, es)?;
                }
            }
        }
        let slot = args.coll as usize;
        if self.colls.len() <= slot {
            self.colls.resize_with(slot + 1, || None);
        }
        let size = self.size();
        let nodes = self.span.as_ref().map_or(0, |s| s.nodes());
        let state = self.colls[slot].get_or_insert_with(|| CollState {
            ranks: (0..size).map(|_| None).collect(),
            checked: None,
            digests: vec![0; nodes],
        });
        if state.ranks[rank].is_some() {
            return Err(invalid);
        }
        state.ranks[rank] = Some(RankColl {
            args,
            words: words.to_vec(),
        });
        state.checked = None;
        Ok(())
    }

    /// Destroys `rank`'s part of collective `coll`, unless it is started.
    pub fn destroy_coll(&mut self, rank: usize, coll: u32) -> Result<(), Fault> {
        let fault = |reason| Fault::new(reason, rank as u32);
        let member = self.members[rank]
            .as_ref()
            .ok_or(fault(Reason::UnknownTeam))?;
        if member.queue.contains(coll) {
            return Err(fault(Reason::UnknownColl));
        }
        let slot = self
            .colls
            .get_mut(coll as usize)
            .ok_or(fault(Reason::UnknownColl))?;
        let state = slot.as_mut().ok_or(fault(Reason::UnknownColl))?;
        state.ranks[rank].take().ok_or(fault(Reason::UnknownColl))?;
        state.checked = None;
        if state.ranks.iter().all(Option::is_none) {
            *slot = None;
        }
        Ok(())
    }

    /// `rank` starts collective `coll`; its answer comes when the collective completes.
    pub fn start(&mut self, rank: usize, coll: u32, ctx: u64) -> Result<(), Fault> {
        if let Some(fault) = self.failed {
            return Err(fault);
        }
        let fault = |reason| Fault::new(reason, rank as u32);
        let initialised = self
            .colls
            .get(coll as usize)
            .and_then(Option::as_ref)
            .is_some_and(|c| c.ranks[rank].is_some());
        let member = self.members[rank]
            .as_mut()
            .ok_or(fault(Reason::UnknownTeam))?;
        if !initialised || member.queue.contains(coll) {
            return Err(fault(Reason::UnknownColl));
        }
        if !member.queue.push(Start { coll, ctx }) {
            return Err(fault(Reason::QueueFull));
        }
        Ok(())
    }

    /// Fails the team: every started collective and pending join of every member completes
    /// with `fault`, and so will every later start.
    pub fn fail(&mut self, answers: &mut Answers<'_, '_>, fault: Fault) {
        if self.failed.is_none() {
            self.failed = Some(fault);
        }
        if self.span.is_some() && !self.told {
            self.told = true;
            self.tell = Some(fault);
        }
        self.active = None;
        let key = self.key;
        for member in self.members.iter_mut().flatten() {
            if let Some(ctx) = member.create_ctx.take() {
                let _ = answers.send(
                    member.dest_id,
                    member.plugin,
                    ctx,
                    Opcode::TeamCreate,
                    key,
                    0,
                    Err(fault),
                );
            }
            while let Some(start) = member.queue.pop() {
                let _ = answers.send(
                    member.dest_id,
                    member.plugin,
                    start.ctx,
                    Opcode::CollStart,
                    key,
                    start.coll,
                    Err(fault),
                );
            }
        }
    }

    /// Another node's worker says the team failed there with `fault`: it fails here too (not
    /// told back).
    pub fn aborted(&mut self, answers: &mut Answers<'_, '_>, fault: Fault) {
        self.told = true;
        if self.failed.is_none() {
            self.flight = None;
            self.fail(answers, fault);
        }
    }

    /// Sends the other nodes' workers the abort of a failure of this node, if one is due
    /// (making endpoints to them where the team had none yet); whether it sent any.
    pub fn tell_peers(&mut self, answers: &mut Answers<'_, '_>, links: &mut Links) -> bool {
        let Some(fault) = self.tell.take() else {
            return false;
        };
        let key = self.key;
        let Some(span) = self.span.as_mut() else {
            return false;
        };
        let domain = answers.out.domain();
        let message = span.abort_message(key, fault);
        for node in (0..span.nodes()).filter(|&node| node != span.me) {
            if span.peers[node].is_none() {
                let id = span.workers[node];
                if let Ok(address) = domain.address(id)
                    && let Ok(peer) = links.peer(id, address)
                {
                    span.peers[node] = Some(peer);
                }
            }
            if let Some(peer) = span.peers[node] {
                // A peer that cannot be reached learns of the failure from its own checks.
                let _ = links.net.send(
                    peer,
                    ABORT_TAG,
                    &message,
                    token(CONTROL_SERIAL, TOKEN_ABORT_OUT),
                );
            }
        }
        true
    }

    /// Whether the team waits for something (a join, a start) and so for its ranks' lives.
    pub fn waiting(&self) -> bool {
        self.failed.is_none()
            && (!self.formed
                || self
                    .members
                    .iter()
                    .flatten()
                    .any(|member| member.queue.len > 0))
    }

    /// Whether it has a collective ready or running (and not merely waiting for another node's
    /// worker, which wakes this one with its message).
    pub fn busy(&self) -> bool {
        if self.failed.is_some() {
            return false;
        }
        match self.active {
            Some(_) => !self.span.as_ref().is_some_and(|s| s.waiting()),
            None => self.ready(),
        }
    }

    fn ready(&self) -> bool {
        self.formed
            && self
                .local
                .iter()
                .all(|&r| self.members[r].as_ref().is_some_and(|m| m.queue.len > 0))
    }

    /// The descriptors of its members' processes.
    pub fn pidfds(&self) -> impl Iterator<Item = &PidFd> {
        self.pidfds.iter().flatten()
    }

    /// Fails the team when a member's process exited.
    pub fn check_lives(&mut self, answers: &mut Answers<'_, '_>) -> bool {
        if self.failed.is_some() {
            return false;
        }
        let dead = self
            .pidfds
            .iter()
            .position(|fd| fd.as_ref().is_some_and(PidFd::exited));
        match dead {
            Some(rank) => {
                self.fail(answers, Fault::new(Reason::RankExited, rank as u32));
                true
            }
            None => false,
        }
    }

    /// Runs one step: starts the collective every member started next, or moves one chunk of
    /// the running one, or completes it. Returns whether it did anything.
    pub fn advance(
        &mut self,
        answers: &mut Answers<'_, '_>,
        scratch: &mut Scratch,
        links: Option<&mut Links>,
    ) -> bool {
        if self.failed.is_some() {
            return false;
        }
        if self.span.is_some() {
            return match links {
                Some(links) => self.advance_across(answers, scratch, links),
                None => {
                    self.fail(answers, Fault::plain(Reason::InterNode));
                    true
                }
            };
        }
        if self.active.is_none() {
            if !self.ready() {
                return false;
            }
            match self.activate() {
                Ok(coll) => {
                    self.active = Some(Active {
                        coll,
                        block: 0,
                        off: 0,
                    })
                }
                Err(fault) => {
                    self.complete(answers, Err(fault));
                    return true;
                }
            }
        }
        let Some(mut active) = self.active.take() else {
            return false;
        };
        match self.step(&mut active, scratch) {
            Ok(false) => self.active = Some(active),
            Ok(true) => self.complete(answers, Ok(())),
            Err(fault) if matches!(fault.reason, Reason::RankExited) => {
                self.fail(answers, fault);
            }
            Err(fault) => self.complete(answers, Err(fault)),
        }
        true
    }

    /// [`Team::advance`] for a team spanning nodes: starts the next collective (resolving the
    /// other nodes' workers through the domain at the first), or moves its running one by one
    /// stage of a window. Any failure fails the team: the nodes' sequence of collectives is
    /// broken.
    fn advance_across(
        &mut self,
        answers: &mut Answers<'_, '_>,
        scratch: &mut Scratch,
        links: &mut Links,
    ) -> bool {
        if self.active.is_none() {
            if !self.ready() {
                return false;
            }
            let begun = self
                .activate()
                .and_then(|coll| self.connect(answers, links).map(|()| coll))
                .and_then(|coll| self.begin_flight(coll, links.net.as_mut()).map(|()| coll));
            match begun {
                Ok(coll) => {
                    self.active = Some(Active {
                        coll,
                        block: 0,
                        off: 0,
                    })
                }
                Err(fault) => {
                    self.fail(answers, fault);
                    return true;
                }
            }
        }
        let before = self.flight.as_ref().map(|f| (f.stage, f.pos, f.local));
        match self.fly(scratch, links) {
            Ok(true) => {
                self.flight = None;
                self.complete(answers, Ok(()));
                true
            }
            Ok(false) => self.flight.as_ref().map(|f| (f.stage, f.pos, f.local)) != before,
            Err(fault) => {
                self.flight = None;
                self.fail(answers, fault);
                true
            }
        }
    }

    /// Makes the endpoints to the other nodes' workers, from the domain's addresses.
    fn connect(&mut self, answers: &mut Answers<'_, '_>, links: &mut Links) -> Result<(), Fault> {
        let Some(span) = self.span.as_mut() else {
            return Ok(());
        };
        let domain = answers.out.domain();
        for node in 0..span.nodes() {
            if node == span.me || span.peers[node].is_some() {
                continue;
            }
            let id = span.workers[node];
            let fault = Fault::new(Reason::PeerWorker, node as u32);
            let address = domain.address(id).map_err(|_| fault)?;
            span.peers[node] = Some(links.peer(id, address).map_err(|_| fault)?);
        }
        Ok(())
    }

    /// Sets up the flight of collective `coll` on a team spanning nodes, and sends the other
    /// nodes the digest of its arguments.
    fn begin_flight(&mut self, coll: u32, net: &mut dyn Net) -> Result<(), Fault> {
        let n = self.size();
        let state = self
            .colls
            .get(coll as usize)
            .and_then(Option::as_ref)
            .ok_or(Fault::plain(Reason::UnknownColl))?;
        let plan = Plan::new(state, n);
        let span = self.span.as_mut().ok_or(Fault::plain(Reason::InterNode))?;
        span.next_collective(plan.datatype(), plan.op());
        let args = plan.args(plan.lead);
        let (exchange, len) = match plan.kind() {
            CollKind::Barrier => (Exchange::Barrier, 0),
            CollKind::Allreduce | CollKind::Reduce => {
                let len = elems(args.count, plan.es)?;
                (
                    Exchange::Reduce {
                        doubling: len <= SMALL,
                    },
                    len,
                )
            }
            CollKind::ReduceScatterBlock => {
                let len = elems(elems(args.recv_count, n as u64)?, plan.es)?;
                (
                    Exchange::Reduce {
                        doubling: len <= SMALL,
                    },
                    len,
                )
            }
            CollKind::Bcast => (
                Exchange::Bcast {
                    from: span.node_of[plan.root()] as usize,
                },
                elems(args.count, plan.es)?,
            ),
            _ => {
                let me = span.me;
                let mut longest = 0;
                for node in (0..span.nodes()).filter(|&node| node != me) {
                    let out: u64 = (0..plan.stream_blocks(span, me, node))
                        .map(|k| {
                            let (s, d) = plan.stream_pair(span, me, node, k);
                            plan.stream_src(s, d).1
                        })
                        .sum();
                    let into: u64 = (0..plan.stream_blocks(span, node, me))
                        .map(|k| {
                            let (s, d) = plan.stream_pair(span, node, me, k);
                            plan.stream_len(s, d)
                        })
                        .sum();
                    span.out_total[node] = out;
                    span.in_total[node] = into;
                    longest = longest.max(out).max(into);
                }
                (Exchange::Streams, longest)
            }
        };
        span.start_digests(net, &state.digests)?;
        self.flight = Some(Flight {
            exchange,
            len,
            pos: 0,
            win: 0,
            window: 0,
            stage: Stage::Gather,
            local: (0, 0),
        });
        Ok(())
    }

    /// Moves the flight by one stage; `true` once the collective is done.
    fn fly(&mut self, scratch: &mut Scratch, links: &mut Links) -> Result<bool, Fault> {
        let Some(mut flight) = self.flight.take() else {
            return Ok(true);
        };
        let result = self.fly_stage(&mut flight, scratch, links);
        self.flight = Some(flight);
        result
    }

    fn fly_stage(
        &mut self,
        flight: &mut Flight,
        scratch: &mut Scratch,
        links: &mut Links,
    ) -> Result<bool, Fault> {
        let coll = self
            .active
            .as_ref()
            .map(|a| a.coll)
            .ok_or(Fault::plain(Reason::UnknownColl))?;
        let mut span = self.span.take().ok_or(Fault::plain(Reason::InterNode))?;
        let result = (|| {
            let state = self
                .colls
                .get(coll as usize)
                .and_then(Option::as_ref)
                .ok_or(Fault::plain(Reason::UnknownColl))?;
            let plan = Plan::new(state, self.size());
            match flight.stage {
                Stage::Gather => {
                    if flight.len == 0 && flight.exchange != Exchange::Barrier {
                        // Nothing crosses nodes: only the digests.
                        flight.stage = Stage::Verify;
                        return Ok(false);
                    }
                    let room = span.window_len(flight.exchange) as u64;
                    let win = (flight.len - flight.pos).min(room) as usize;
                    flight.win = win;
                    let pos = flight.pos;
                    match flight.exchange {
                        Exchange::Reduce { .. } => {
                            let b: &mut [u8] =
                                zerocopy::IntoBytes::as_mut_bytes(&mut scratch.b[..]);
                            let acc = span.acc_mut(win);
                            let mut sub = 0;
                            while sub < win {
                                let piece = (win - sub).min(CHUNK);
                                let dst = &mut acc[sub..sub + piece];
                                let at = pos + sub as u64;
                                let (first, rest) = self.local.split_first().expect("a member");
                                self.read(plan.src(0, *first).at(at), dst)?;
                                for &r in rest {
                                    let b = &mut b[..piece];
                                    self.read(plan.src(0, r).at(at), b)?;
                                    reduce::reduce(plan.datatype(), plan.op(), dst, b)
                                        .map_err(|_| Fault::plain(Reason::InvalidArgs))?;
                                }
                                sub += piece;
                            }
                        }
                        Exchange::Bcast { .. } => {
                            let root = plan.root();
                            if self.local.contains(&root) {
                                self.read(plan.send(root, 0).at(pos), span.acc_mut(win))?;
                            }
                        }
                        Exchange::Streams => {
                            let me = span.me;
                            for node in (0..span.nodes()).filter(|&node| node != me) {
                                let out = span.out_total[node].saturating_sub(pos);
                                let out = out.min(CHUNK as u64) as usize;
                                self.fill(&plan, &mut span, node, out)?;
                                span.out_len[node] = out;
                                let into = span.in_total[node].saturating_sub(pos);
                                span.in_len[node] = into.min(CHUNK as u64) as usize;
                            }
                        }
                        Exchange::Barrier | Exchange::Nothing => {}
                    }
                    span.begin(flight.exchange, 0, flight.window, win);
                    flight.stage = Stage::Exchange;
                    Ok(false)
                }
                Stage::Exchange => {
                    if span.pump(links.net.as_mut())? {
                        flight.stage = Stage::Scatter;
                    }
                    Ok(false)
                }
                Stage::Scatter => {
                    // Nothing reaches a rank's buffer before every node agreed on the
                    // collective.
                    if !span.digests_ready(links.net.as_mut())? {
                        return Ok(false);
                    }
                    let win = flight.win;
                    let pos = flight.pos;
                    match (flight.exchange, plan.kind()) {
                        (Exchange::Streams, _) => {
                            let me = span.me;
                            for node in (0..span.nodes()).filter(|&node| node != me) {
                                let have = span.in_len[node];
                                self.drain(&plan, &mut span, node, have)?;
                            }
                        }
                        (Exchange::Reduce { .. }, CollKind::ReduceScatterBlock) => {
                            let acc = span.acc_mut(win);
                            let (lo, hi) = (pos, pos + win as u64);
                            for &q in &self.local {
                                let block = elems(plan.args(q).recv_count, plan.es)?;
                                let (b0, b1) = (q as u64 * block, (q as u64 + 1) * block);
                                let (from, to) = (b0.max(lo), b1.min(hi));
                                if from < to {
                                    let data = &acc[(from - lo) as usize..(to - lo) as usize];
                                    self.write(plan.recv(q, 0).at(from - b0), data)?;
                                }
                            }
                        }
                        _ => {
                            for &q in &self.local {
                                if let Some(dst) = plan.dst(0, q) {
                                    self.write(dst.at(pos), span.acc_mut(win))?;
                                }
                            }
                        }
                    }
                    flight.pos += win as u64;
                    flight.window += 1;
                    flight.stage = if flight.pos >= flight.len {
                        Stage::Verify
                    } else {
                        Stage::Gather
                    };
                    Ok(false)
                }
                Stage::Verify => {
                    if span.digests_ready(links.net.as_mut())? {
                        flight.stage = Stage::Local;
                    }
                    Ok(false)
                }
                Stage::Local => {
                    if flight.exchange != Exchange::Streams {
                        return Ok(true);
                    }
                    self.local_pass(&plan, &mut flight.local, scratch)
                }
            }
        })();
        self.span = Some(span);
        result
    }

    /// The collective at the head of every member's queue, checked: the same on every rank,
    /// its arguments consistent.
    fn activate(&mut self) -> Result<u32, Fault> {
        let mut coll = None;
        for &rank in &self.local {
            let head = self.members[rank].as_ref().and_then(|m| m.queue.front());
            match (coll, head) {
                (_, None) => return Err(Fault::new(Reason::TeamFailed, rank as u32)),
                (None, Some(start)) => coll = Some(start.coll),
                (Some(c), Some(start)) if c != start.coll => {
                    return Err(Fault::new(Reason::OrderMismatch, rank as u32));
                }
                _ => {}
            }
        }
        let coll = coll.ok_or(Fault::plain(Reason::TeamFailed))?;
        let checked = {
            let state = self
                .colls
                .get(coll as usize)
                .and_then(Option::as_ref)
                .ok_or(Fault::plain(Reason::UnknownColl))?;
            match state.checked {
                Some(result) => result,
                None => check(state, &self.local),
            }
        };
        let fresh = self
            .colls
            .get(coll as usize)
            .and_then(Option::as_ref)
            .is_some_and(|state| state.checked.is_none());
        let mut digests = [0u64; urom_coll_wire::MAX_TEAM_SIZE];
        if let (true, Ok(()), Some(span), Some(Some(state))) = (
            fresh,
            checked,
            self.span.as_ref(),
            self.colls.get(coll as usize),
        ) {
            let plan = Plan::new(state, self.pids.len());
            for (node, digest) in digests.iter_mut().enumerate().take(span.nodes()) {
                *digest = plan.digest(span, node);
            }
        }
        if let Some(Some(state)) = self.colls.get_mut(coll as usize) {
            if fresh && checked.is_ok() {
                let nodes = state.digests.len();
                state.digests.copy_from_slice(&digests[..nodes]);
            }
            state.checked = Some(checked);
        }
        checked.map(|()| coll)
    }

    /// Completes the collective at the head of every member's queue with `result`.
    fn complete(&mut self, answers: &mut Answers<'_, '_>, result: Result<(), Fault>) {
        self.active = None;
        let key = self.key;
        let mut gone = None;
        for (rank, member) in self.members.iter_mut().enumerate() {
            let Some(member) = member.as_mut() else {
                continue;
            };
            if let Some(start) = member.queue.pop() {
                let sent = answers.send(
                    member.dest_id,
                    member.plugin,
                    start.ctx,
                    Opcode::CollStart,
                    key,
                    start.coll,
                    result,
                );
                if sent.is_err() {
                    gone = Some(rank as u32);
                }
            }
        }
        if let Some(rank) = gone {
            self.fail(answers, Fault::new(Reason::RankDisconnected, rank));
        }
    }

    /// Copy collectives: reads the next `want` bytes of the stream to `node` into its slot of
    /// the accumulator.
    fn fill(
        &self,
        plan: &Plan<'_>,
        span: &mut Span,
        node: usize,
        want: usize,
    ) -> Result<(), Fault> {
        let me = span.me;
        let (mut k, mut off) = span.out_cursor[node];
        let blocks = plan.stream_blocks(span, me, node);
        let mut filled = 0;
        while filled < want {
            if k >= blocks {
                return Err(Fault::new(Reason::NodesDisagree, node as u32));
            }
            let (s, d) = plan.stream_pair(span, me, node, k);
            let (src, len) = plan.stream_src(s, d);
            if off >= len {
                k += 1;
                off = 0;
                continue;
            }
            let piece = ((len - off) as usize).min(want - filled);
            let at = node * CHUNK + filled;
            let acc = span.acc_mut(span.nodes() * CHUNK);
            self.read(src.at(off), &mut acc[at..at + piece])?;
            filled += piece;
            off += piece as u64;
        }
        span.out_cursor[node] = (k, off);
        Ok(())
    }

    /// Copy collectives: writes the `have` bytes of the stream from `node` that arrived in
    /// its inbox slot to the local ranks they are for.
    fn drain(
        &self,
        plan: &Plan<'_>,
        span: &mut Span,
        node: usize,
        have: usize,
    ) -> Result<(), Fault> {
        let me = span.me;
        let (mut k, mut off) = span.in_cursor[node];
        let blocks = plan.stream_blocks(span, node, me);
        let mut done = 0;
        while done < have {
            if k >= blocks {
                return Err(Fault::new(Reason::NodesDisagree, node as u32));
            }
            let (s, d) = plan.stream_pair(span, node, me, k);
            let len = plan.stream_len(s, d);
            if off >= len {
                k += 1;
                off = 0;
                continue;
            }
            let piece = ((len - off) as usize).min(have - done);
            let data = &span.inbox(node, done + piece)[done..];
            for &q in &self.local {
                if let Some(dst) = plan.stream_dst(s, d, q) {
                    self.write(dst.at(off), data)?;
                }
            }
            done += piece;
            off += piece as u64;
        }
        span.in_cursor[node] = (k, off);
        Ok(())
    }

    /// Copy collectives on a team spanning nodes: moves up to a chunk of the blocks between
    /// this node's ranks; `true` once all moved.
    fn local_pass(
        &self,
        plan: &Plan<'_>,
        cursor: &mut (usize, u64),
        scratch: &mut Scratch,
    ) -> Result<bool, Fault> {
        let m = self.local.len();
        let a: &mut [u8] = zerocopy::IntoBytes::as_mut_bytes(&mut scratch.a[..]);
        let b: &mut [u8] = zerocopy::IntoBytes::as_mut_bytes(&mut scratch.b[..]);
        let mut budget = CHUNK as u64;
        loop {
            let (k, off) = *cursor;
            if k >= m * m {
                return Ok(true);
            }
            if budget == 0 {
                return Ok(false);
            }
            let (s, q) = (self.local[k / m], self.local[k % m]);
            let Some((len, step)) = plan.local_move(s, q) else {
                *cursor = (k + 1, 0);
                continue;
            };
            if off >= len {
                *cursor = (k + 1, 0);
                continue;
            }
            let piece = (len - off).min(budget) as usize;
            budget -= piece as u64;
            let (a, b) = (&mut a[..piece], &mut b[..piece]);
            match step {
                Move::Copy(src, dst) => self.copy(src.at(off), dst.at(off), a)?,
                Move::Swap(x, y) => {
                    self.read(x.at(off), a)?;
                    self.read(y.at(off), b)?;
                    self.write(y.at(off), a)?;
                    self.write(x.at(off), b)?;
                }
            }
            *cursor = (k, off + piece as u64);
        }
    }

    /// Copies `tmp.len()` bytes from `src` to `dst` in one copy where one side is shared
    /// memory: mapping to mapping, `process_vm_readv` into a mapping, or `process_vm_writev`
    /// from one; through `tmp` only between two cross-memory buffers. Every range is checked
    /// against the rank's registered buffer first, as [`Team::read`] and [`Team::write`] do.
    fn copy(&self, src: Loc, dst: Loc, tmp: &mut [u8]) -> Result<(), Fault> {
        let len = tmp.len();
        let (from, pid_from) = self.buffer(src, len)?;
        let (to, pid_to) = self.buffer(dst, len)?;
        match (&from.access, &to.access) {
            (Access::Shared(a), Access::Shared(b)) => a
                .copy_to(src.off, b, dst.off, len)
                .then_some(())
                .ok_or(Fault::new(Reason::OutOfBounds, dst.rank as u32)),
            (Access::Cross { addr }, Access::Shared(b)) => b
                .cma_read_into(pid_from, addr + src.off, dst.off, len)
                .map_err(|e| cma_fault(e, src.rank)),
            (Access::Shared(a), Access::Cross { addr }) => a
                .cma_write_from(pid_to, addr + dst.off, src.off, len)
                .map_err(|e| cma_fault(e, dst.rank)),
            (Access::Cross { .. }, Access::Cross { .. }) => {
                self.read(src, tmp)?;
                self.write(dst, tmp)
            }
        }
    }

    /// Whether `loc`'s buffer is shared memory.
    fn shared(&self, loc: Loc) -> bool {
        self.members[loc.rank]
            .as_ref()
            .and_then(|m| m.buffers.get(loc.buf as usize))
            .and_then(Option::as_ref)
            .is_some_and(|b| matches!(b.access, Access::Shared(_)))
    }

    fn read(&self, loc: Loc, out: &mut [u8]) -> Result<(), Fault> {
        let (buffer, pid) = self.buffer(loc, out.len())?;
        match &buffer.access {
            Access::Shared(map) => map
                .read(loc.off, out)
                .then_some(())
                .ok_or(Fault::new(Reason::OutOfBounds, loc.rank as u32)),
            Access::Cross { addr } => {
                cma_read(pid, addr + loc.off, out).map_err(|e| cma_fault(e, loc.rank))
            }
        }
    }

    fn write(&self, loc: Loc, data: &[u8]) -> Result<(), Fault> {
        let (buffer, pid) = self.buffer(loc, data.len())?;
        match &buffer.access {
            Access::Shared(map) => map
                .write(loc.off, data)
                .then_some(())
                .ok_or(Fault::new(Reason::OutOfBounds, loc.rank as u32)),
            Access::Cross { addr } => {
                cma_write(pid, addr + loc.off, data).map_err(|e| cma_fault(e, loc.rank))
            }
        }
    }

    fn buffer(&self, loc: Loc, len: usize) -> Result<(&Buffer, u32), Fault> {
        let fault = |reason| Fault::new(reason, loc.rank as u32);
        let member = self.members[loc.rank]
            .as_ref()
            .ok_or(fault(Reason::RankDisconnected))?;
        let buffer = member
            .buffers
            .get(loc.buf as usize)
            .and_then(Option::as_ref)
            .ok_or(fault(Reason::UnknownBuffer))?;
        let end = loc.off.checked_add(len as u64);
        if end.is_none_or(|end| end > buffer.len) {
            return Err(fault(Reason::OutOfBounds));
        }
        Ok((buffer, member.pid))
    }

    /// Moves at most [`CHUNK`] bytes of the running collective: one chunk of a large block, or
    /// as many small blocks as fit (an 8-byte alltoall of 12 ranks, 144 blocks, is one step, not
    /// 144 turns of the worker); `true` once it is done. A step of at least [`PARALLEL_MIN`]
    /// bytes is split into disjoint byte ranges (whole elements), one per thread of the worker
    /// (see [`Threads`]): each element is still reduced in rank order, so the result is the
    /// same bytes as on one thread.
    fn step(&self, active: &mut Active, scratch: &mut Scratch) -> Result<bool, Fault> {
        let state = self
            .colls
            .get(active.coll as usize)
            .and_then(Option::as_ref)
            .ok_or(Fault::plain(Reason::UnknownColl))?;
        let plan = Plan::new(state, self.size());
        let from = (active.block, active.off);
        // Bytes this step may move (whole elements: blocks and CHUNK are multiples of the
        // element size).
        let budget = CHUNK as u64;
        let (end, total) = self.walk(&plan, from, 0, budget, None)?;
        let pool = if total >= PARALLEL_MIN {
            scratch.threads.pool()
        } else {
            None
        };
        match pool {
            Some((pool, slots)) => {
                let threads = pool.threads() as u64;
                let parts = threads.min(total / PART_MIN).max(1);
                // Part boundaries on whole elements (and cache lines) of every block.
                let align = 64 * plan.es.max(1);
                let part = total.div_ceil(parts).div_ceil(align) * align;
                let fault: Mutex<Option<(usize, Fault)>> = Mutex::new(None);
                let run = |i: usize| {
                    let skip = i as u64 * part;
                    let take = part.min(total.saturating_sub(skip));
                    if take == 0 {
                        return;
                    }
                    let Ok(mut bufs) = slots[i].lock() else {
                        return;
                    };
                    let (a, b) = &mut *bufs;
                    let a: &mut [u8] = zerocopy::IntoBytes::as_mut_bytes(&mut a[..]);
                    let b: &mut [u8] = zerocopy::IntoBytes::as_mut_bytes(&mut b[..]);
                    if let Err(f) = self.walk(&plan, from, skip, take, Some((a, b))) {
                        let mut first = fault.lock().unwrap_or_else(|e| e.into_inner());
                        if first.as_ref().is_none_or(|(j, _)| i < *j) {
                            *first = Some((i, f));
                        }
                    }
                };
                pool.run(parts as usize, &run);
                if let Some((_, f)) = fault.into_inner().unwrap_or_else(|e| e.into_inner()) {
                    return Err(f);
                }
            }
            None => {
                let a: &mut [u8] = zerocopy::IntoBytes::as_mut_bytes(&mut scratch.a[..]);
                let b: &mut [u8] = zerocopy::IntoBytes::as_mut_bytes(&mut scratch.b[..]);
                self.walk(&plan, from, 0, total, Some((a, b)))?;
            }
        }
        (active.block, active.off) = end;
        Ok(active.block >= plan.blocks())
    }

    /// Walks the blocks from `from` (block, byte), passes `skip` bytes of them, then moves the
    /// next `take` (with `work`'s two chunks, each at least `take` long; without, only
    /// counts); returns where it stopped and how many bytes it took.
    fn walk(
        &self,
        plan: &Plan<'_>,
        from: (u64, u64),
        mut skip: u64,
        take: u64,
        mut work: Option<(&mut [u8], &mut [u8])>,
    ) -> Result<((u64, u64), u64), Fault> {
        let (mut block, mut off) = from;
        let mut left = take;
        let blocks = plan.blocks();
        while block < blocks && left > 0 {
            let (len, mode) = plan.block(block);
            if len == 0 || matches!(mode, Mode::Skip) || off >= len {
                block += 1;
                off = 0;
                continue;
            }
            if skip >= len - off {
                skip -= len - off;
                block += 1;
                off = 0;
                continue;
            }
            off += skip;
            skip = 0;
            let piece = (len - off).min(left);
            if let Some((a, b)) = work.as_mut() {
                let n = piece as usize;
                self.move_piece(plan, block, mode, off, &mut a[..n], &mut b[..n])?;
            }
            left -= piece;
            off += piece;
            if off >= len {
                block += 1;
                off = 0;
            }
        }
        Ok(((block, off), take - left))
    }

    /// Moves `a.len()` bytes at `off` of block `block` (`b`: a second chunk as long).
    fn move_piece(
        &self,
        plan: &Plan<'_>,
        block: u64,
        mode: Mode,
        off: u64,
        a: &mut [u8],
        b: &mut [u8],
    ) -> Result<(), Fault> {
        match mode {
            Mode::Skip => {}
            Mode::Copy(src) => {
                let mut dsts = (0..self.size()).filter_map(|q| plan.dst(block, q));
                // One copy per destination straight from a shared source, or from a user
                // buffer to its only destination; else read once, write to each.
                let direct = self.shared(src) || {
                    let mut probe = dsts.clone();
                    probe.next().is_some() && probe.next().is_none()
                };
                if direct {
                    for dst in dsts {
                        self.copy(src.at(off), dst.at(off), a)?;
                    }
                } else {
                    self.read(src.at(off), a)?;
                    for dst in &mut dsts {
                        self.write(dst.at(off), a)?;
                    }
                }
            }
            Mode::Reduce => {
                self.read(plan.src(block, 0).at(off), a)?;
                for r in 1..self.size() {
                    self.read(plan.src(block, r).at(off), b)?;
                    reduce::reduce(plan.datatype(), plan.op(), a, b)
                        .map_err(|_| Fault::plain(Reason::InvalidArgs))?;
                }
                for q in 0..self.size() {
                    if let Some(dst) = plan.dst(block, q) {
                        self.write(dst.at(off), a)?;
                    }
                }
            }
            Mode::Swap(x, y) => {
                self.read(x.at(off), a)?;
                self.read(y.at(off), b)?;
                self.write(y.at(off), a)?;
                self.write(x.at(off), b)?;
            }
        }
        Ok(())
    }
}

fn cma_fault(error: CrossMemoryError, rank: usize) -> Fault {
    let reason = match error {
        CrossMemoryError::Denied => Reason::CrossMemoryDenied,
        CrossMemoryError::Gone => Reason::RankExited,
        CrossMemoryError::Failed => Reason::CopyFailed,
    };
    Fault::new(reason, rank as u32)
}

/// A collective's blocks, sources and destinations, from every rank's arguments.
struct Plan<'a> {
    ranks: &'a [Option<RankColl>],
    n: usize,
    es: u64,
    /// A rank whose arguments are here (the first served by this worker): kind, datatype,
    /// operation and root are read from it.
    lead: usize,
}

impl<'a> Plan<'a> {
    fn new(state: &'a CollState, n: usize) -> Self {
        let lead = state.ranks.iter().position(Option::is_some).unwrap_or(0);
        let es = state.ranks[lead]
            .as_ref()
            .and_then(|rc| rc.args.datatype.size())
            .unwrap_or(1) as u64;
        Self {
            ranks: &state.ranks,
            n,
            es,
            lead,
        }
    }

    fn rc(&self, r: usize) -> &RankColl {
        // Every rank's part exists once the collective was started by every rank.
        self.ranks[r].as_ref().expect("every rank initialised it")
    }

    fn args(&self, r: usize) -> &CollArgs {
        &self.rc(r).args
    }

    fn words(&self, r: usize) -> &[u64] {
        &self.rc(r).words
    }

    fn kind(&self) -> CollKind {
        self.args(self.lead).kind
    }

    fn datatype(&self) -> Datatype {
        self.args(self.lead).datatype
    }

    fn op(&self) -> ReduceOp {
        self.args(self.lead).op
    }

    fn root(&self) -> usize {
        self.args(self.lead).root as usize
    }

    fn ip(&self, r: usize) -> bool {
        self.args(r).in_place()
    }

    fn send(&self, r: usize, e: u64) -> Loc {
        let a = self.args(r);
        Loc {
            rank: r,
            buf: a.send_buf,
            off: (a.send_off + e) * self.es,
        }
    }

    fn recv(&self, r: usize, e: u64) -> Loc {
        let a = self.args(r);
        Loc {
            rank: r,
            buf: a.recv_buf,
            off: (a.recv_off + e) * self.es,
        }
    }

    fn blocks(&self) -> u64 {
        let n = self.n as u64;
        match self.kind() {
            CollKind::Barrier | CollKind::Unknown(_) => 0,
            CollKind::Bcast | CollKind::Reduce | CollKind::Allreduce => 1,
            CollKind::Alltoall | CollKind::Alltoallv => n * n,
            _ => n,
        }
    }

    /// A block's length in bytes and what it does.
    fn block(&self, b: u64) -> (u64, Mode) {
        let n = self.n;
        let bu = b as usize;
        let es = self.es;
        match self.kind() {
            CollKind::Barrier | CollKind::Unknown(_) => (0, Mode::Skip),
            CollKind::Bcast => {
                let root = self.root();
                (self.args(root).count * es, Mode::Copy(self.send(root, 0)))
            }
            CollKind::Reduce | CollKind::Allreduce => (self.args(0).count * es, Mode::Reduce),
            CollKind::ReduceScatterBlock => (self.args(0).recv_count * es, Mode::Reduce),
            CollKind::Allgather => {
                let s = bu;
                let src = if self.ip(s) {
                    self.recv(s, s as u64 * self.args(s).recv_count)
                } else {
                    self.send(s, 0)
                };
                (self.args(s).count * es, Mode::Copy(src))
            }
            CollKind::Allgatherv => {
                let s = bu;
                let src = if self.ip(s) {
                    self.recv(s, self.words(s)[n + s])
                } else {
                    self.send(s, 0)
                };
                (self.words(s)[s] * es, Mode::Copy(src))
            }
            CollKind::Gather => {
                let (s, root) = (bu, self.root());
                if s == root && self.ip(root) {
                    return (0, Mode::Skip);
                }
                (self.args(s).count * es, Mode::Copy(self.send(s, 0)))
            }
            CollKind::Scatter => {
                let (d, root) = (bu, self.root());
                if d == root && self.ip(root) {
                    return (0, Mode::Skip);
                }
                let count = self.args(root).count;
                (count * es, Mode::Copy(self.send(root, d as u64 * count)))
            }
            CollKind::Alltoall => {
                let (i, j) = (bu / n, bu % n);
                if self.ip(0) {
                    if i >= j {
                        return (0, Mode::Skip);
                    }
                    let (rci, rcj) = (self.args(i).recv_count, self.args(j).recv_count);
                    let x = self.recv(i, j as u64 * rci);
                    let y = self.recv(j, i as u64 * rcj);
                    return (rci * es, Mode::Swap(x, y));
                }
                let count = self.args(i).count;
                (count * es, Mode::Copy(self.send(i, j as u64 * count)))
            }
            CollKind::Alltoallv => {
                let (i, j) = (bu / n, bu % n);
                let (wi, wj) = (self.words(i), self.words(j));
                if self.ip(0) {
                    if i >= j {
                        return (0, Mode::Skip);
                    }
                    let x = self.recv(i, wi[3 * n + j]);
                    let y = self.recv(j, wj[3 * n + i]);
                    return (wi[2 * n + j] * es, Mode::Swap(x, y));
                }
                (wi[j] * es, Mode::Copy(self.send(i, wi[n + j])))
            }
        }
    }

    /// Copy collectives across nodes: how many blocks the stream from node `from` to node
    /// `to` carries.
    fn stream_blocks(&self, span: &Span, from: usize, to: usize) -> usize {
        let (rf, rt) = (&span.ranks[from], &span.ranks[to]);
        let root_node = || span.node_of[self.root()] as usize;
        match self.kind() {
            CollKind::Allgather | CollKind::Allgatherv => rf.len(),
            CollKind::Gather if to == root_node() && from != to => rf.len(),
            CollKind::Scatter if from == root_node() && from != to => rt.len(),
            CollKind::Alltoall | CollKind::Alltoallv => rf.len() * rt.len(),
            _ => 0,
        }
    }

    /// Block `k` of the stream from node `from` to node `to`: its source rank and its
    /// destination rank (`None`: every rank of `to`). An alltoall's two streams between two
    /// nodes list the pairs of ranks in the same order (the lower node's rank first), so that
    /// in place, each window overwrites only ranges already sent.
    fn stream_pair(&self, span: &Span, from: usize, to: usize, k: usize) -> (usize, Option<usize>) {
        match self.kind() {
            CollKind::Allgather | CollKind::Allgatherv => (span.ranks[from][k], None),
            CollKind::Gather => (span.ranks[from][k], Some(self.root())),
            CollKind::Scatter => (self.root(), Some(span.ranks[to][k])),
            _ => {
                let (lo, hi) = (from.min(to), from.max(to));
                let m = span.ranks[hi].len();
                let (x, y) = (span.ranks[lo][k / m], span.ranks[hi][k % m]);
                if from == lo {
                    (x, Some(y))
                } else {
                    (y, Some(x))
                }
            }
        }
    }

    /// The sender's side of block `s` → `d` of a stream: where it starts, its bytes.
    fn stream_src(&self, s: usize, d: Option<usize>) -> (Loc, u64) {
        let (n, es) = (self.n, self.es);
        let d = d.unwrap_or(0);
        match self.kind() {
            CollKind::Allgather => {
                let a = self.args(s);
                let src = if self.ip(s) {
                    self.recv(s, s as u64 * a.recv_count)
                } else {
                    self.send(s, 0)
                };
                (src, a.count * es)
            }
            CollKind::Allgatherv => {
                let w = self.words(s);
                let src = if self.ip(s) {
                    self.recv(s, w[n + s])
                } else {
                    self.send(s, 0)
                };
                (src, w[s] * es)
            }
            CollKind::Gather => (self.send(s, 0), self.args(s).count * es),
            CollKind::Scatter => {
                let count = self.args(s).count;
                (self.send(s, d as u64 * count), count * es)
            }
            CollKind::Alltoall => {
                let a = self.args(s);
                if self.ip(s) {
                    (self.recv(s, d as u64 * a.recv_count), a.recv_count * es)
                } else {
                    (self.send(s, d as u64 * a.count), a.count * es)
                }
            }
            CollKind::Alltoallv => {
                let w = self.words(s);
                if self.ip(s) {
                    (self.recv(s, w[3 * n + d]), w[2 * n + d] * es)
                } else {
                    (self.send(s, w[n + d]), w[d] * es)
                }
            }
            _ => (self.send(s, 0), 0),
        }
    }

    /// The receiver's side: the bytes of block `s` → `d` as this node's ranks expect them.
    fn stream_len(&self, s: usize, d: Option<usize>) -> u64 {
        let (n, es) = (self.n, self.es);
        let d = d.unwrap_or(self.lead);
        match self.kind() {
            CollKind::Allgather => self.args(self.lead).recv_count * es,
            CollKind::Allgatherv => self.words(self.lead)[s] * es,
            CollKind::Gather => self.args(self.root()).recv_count * es,
            CollKind::Scatter | CollKind::Alltoall => self.args(d).recv_count * es,
            CollKind::Alltoallv => self.words(d)[2 * n + s] * es,
            _ => 0,
        }
    }

    /// Where block `s` → `d` lands on this node's rank `q`, if there.
    fn stream_dst(&self, s: usize, d: Option<usize>, q: usize) -> Option<Loc> {
        if d.is_some_and(|d| d != q) {
            return None;
        }
        let n = self.n;
        match self.kind() {
            CollKind::Allgather | CollKind::Gather | CollKind::Alltoall => {
                Some(self.recv(q, s as u64 * self.args(q).recv_count))
            }
            CollKind::Allgatherv => Some(self.recv(q, self.words(q)[n + s])),
            CollKind::Alltoallv => Some(self.recv(q, self.words(q)[3 * n + s])),
            CollKind::Scatter => Some(self.recv(q, 0)),
            _ => None,
        }
    }

    /// What moves from this node's rank `s` to its rank `q` (copy collectives on a team
    /// spanning nodes), and its bytes.
    fn local_move(&self, s: usize, q: usize) -> Option<(u64, Move)> {
        let root = self.root();
        match self.kind() {
            CollKind::Allgather | CollKind::Allgatherv => {
                if q == s && self.ip(s) {
                    return None;
                }
                let (src, len) = self.stream_src(s, None);
                Some((len, Move::Copy(src, self.stream_dst(s, None, q)?)))
            }
            CollKind::Gather => {
                if q != root || (s == root && self.ip(root)) {
                    return None;
                }
                let (src, len) = self.stream_src(s, Some(q));
                Some((len, Move::Copy(src, self.stream_dst(s, Some(q), q)?)))
            }
            CollKind::Scatter => {
                if s != root || (q == root && self.ip(root)) {
                    return None;
                }
                let (src, len) = self.stream_src(s, Some(q));
                Some((len, Move::Copy(src, self.stream_dst(s, Some(q), q)?)))
            }
            CollKind::Alltoall | CollKind::Alltoallv => {
                let (src, len) = self.stream_src(s, Some(q));
                if self.ip(s) {
                    if s >= q {
                        return None;
                    }
                    let (other, _) = self.stream_src(q, Some(s));
                    return Some((len, Move::Swap(src, other)));
                }
                Some((len, Move::Copy(src, self.stream_dst(s, Some(q), q)?)))
            }
            _ => None,
        }
    }

    /// The digest of the collective's arguments as this node's ranks give them, for node
    /// `peer`: what the nodes must agree on (kind, datatype, operation, root, the counts of
    /// the blocks that cross nodes; for an alltoallv, those between this node and `peer`).
    fn digest(&self, span: &Span, peer: usize) -> u64 {
        let n = self.n;
        let a = self.args(self.lead);
        let mut h = Digest::new();
        h.add(u64::from(a.kind.raw()));
        if a.kind != CollKind::Barrier {
            h.add(u64::from(a.datatype.raw()));
        }
        if a.kind.reduces() {
            h.add(u64::from(a.op.raw()));
        }
        if a.kind.rooted() {
            h.add(u64::from(a.root));
        }
        let local = |r: usize| span.node_of[r] as usize == span.me;
        match a.kind {
            CollKind::Barrier | CollKind::Unknown(_) => {}
            CollKind::Bcast | CollKind::Reduce | CollKind::Allreduce | CollKind::Allgather => {
                h.add(a.count)
            }
            CollKind::ReduceScatterBlock | CollKind::Alltoall => h.add(a.recv_count),
            CollKind::Allgatherv => self.words(self.lead)[..n].iter().for_each(|&w| h.add(w)),
            CollKind::Gather => h.add(if local(self.root()) {
                self.args(self.root()).recv_count
            } else {
                a.count
            }),
            CollKind::Scatter => h.add(if local(self.root()) {
                self.args(self.root()).count
            } else {
                a.recv_count
            }),
            CollKind::Alltoallv => {
                let (lo, hi) = (span.me.min(peer), span.me.max(peer));
                for (from, to) in [(lo, hi), (hi, lo)] {
                    for &i in &span.ranks[from] {
                        for &j in &span.ranks[to] {
                            let count = if local(i) {
                                let w = self.words(i);
                                if self.ip(i) { w[2 * n + j] } else { w[j] }
                            } else {
                                self.words(j)[2 * n + i]
                            };
                            h.add(count);
                        }
                    }
                }
            }
        }
        h.0
    }

    /// Rank `r`'s source of a reduction block.
    fn src(&self, b: u64, r: usize) -> Loc {
        let e = match self.kind() {
            CollKind::ReduceScatterBlock => b * self.args(r).recv_count,
            _ => 0,
        };
        let in_place = self.ip(r) && (self.kind() != CollKind::Reduce || r == self.root());
        if in_place {
            self.recv(r, e)
        } else {
            self.send(r, e)
        }
    }

    /// Where block `b` goes on rank `q`, if anywhere.
    fn dst(&self, b: u64, q: usize) -> Option<Loc> {
        let bu = b as usize;
        let n = self.n;
        match self.kind() {
            CollKind::Barrier | CollKind::Unknown(_) => None,
            CollKind::Bcast => (q != self.root()).then(|| self.send(q, 0)),
            CollKind::Reduce => (q == self.root()).then(|| self.recv(q, 0)),
            CollKind::Allreduce => Some(self.recv(q, 0)),
            CollKind::ReduceScatterBlock => (q == bu).then(|| self.recv(q, 0)),
            CollKind::Allgather => (!(q == bu && self.ip(bu)))
                .then(|| self.recv(q, bu as u64 * self.args(q).recv_count)),
            CollKind::Allgatherv => {
                (!(q == bu && self.ip(bu))).then(|| self.recv(q, self.words(q)[n + bu]))
            }
            CollKind::Gather => {
                (q == self.root()).then(|| self.recv(q, bu as u64 * self.args(q).recv_count))
            }
            CollKind::Scatter => (q == bu).then(|| self.recv(q, 0)),
            CollKind::Alltoall => {
                let (i, j) = (bu / n, bu % n);
                (q == j).then(|| self.recv(j, i as u64 * self.args(j).recv_count))
            }
            CollKind::Alltoallv => {
                let (i, j) = (bu / n, bu % n);
                (q == j).then(|| self.recv(j, self.words(j)[3 * n + i]))
            }
        }
    }
}

/// Checks that every rank's arguments of a collective agree (MPI requires matching kinds,
/// datatypes, operations, roots and counts).
///
/// On a team spanning nodes only the ranks of this node (`local`) are checked, against each
/// other.
fn check(state: &CollState, local: &[usize]) -> Result<(), Fault> {
    let n = state.ranks.len();
    let mut args = [None; urom_coll_wire::MAX_TEAM_SIZE];
    for &r in local {
        args[r] = Some(
            state.ranks[r]
                .as_ref()
                .ok_or(Fault::new(Reason::UnknownColl, r as u32))?
                .args,
        );
    }
    let all = local.len() == n;
    let arg = |r: usize| args[r].expect("filled above");
    let words = |r: usize| -> &[u64] { &state.ranks[r].as_ref().expect("checked above").words };
    let a0 = arg(local[0]);
    let mismatch = |r: usize| Err(Fault::new(Reason::ArgsMismatch, r as u32));
    for &r in local {
        let a = arg(r);
        if a.kind != a0.kind
            || (a.kind != CollKind::Barrier && a.datatype != a0.datatype)
            || (a.kind.reduces() && a.op != a0.op)
            || (a.kind.rooted() && a.root != a0.root)
        {
            return mismatch(r);
        }
        let ok = match a0.kind {
            CollKind::Barrier | CollKind::Unknown(_) => true,
            CollKind::Bcast | CollKind::Reduce | CollKind::Allreduce => a.count == a0.count,
            CollKind::ReduceScatterBlock => a.recv_count == a0.recv_count,
            CollKind::Allgather => a.count == a0.count && a.recv_count == a0.count,
            CollKind::Alltoall => {
                a.count == a0.count && a.recv_count == a0.count && a.in_place() == a0.in_place()
            }
            CollKind::Gather if !all => {
                let root = a0.root as usize;
                match args[root] {
                    Some(root_args) => {
                        (r == root && a.in_place()) || a.count == root_args.recv_count
                    }
                    None => a.count == a0.count,
                }
            }
            CollKind::Scatter if !all => {
                let root = a0.root as usize;
                match args[root] {
                    Some(root_args) => {
                        (r == root && a.in_place()) || a.recv_count == root_args.count
                    }
                    None => a.recv_count == a0.recv_count,
                }
            }
            CollKind::Allgatherv if !all => {
                let own = &words(local[0])[..n];
                (!local.contains(&r) || a.in_place() || a.count == words(r)[r])
                    && words(r)[..n] == *own
            }
            CollKind::Gather => {
                let root = arg(a0.root as usize);
                (r == a0.root as usize && a.in_place()) || a.count == root.recv_count
            }
            CollKind::Scatter => {
                let root = arg(a0.root as usize);
                (r == a0.root as usize && a.in_place()) || a.recv_count == root.count
            }
            CollKind::Allgatherv => {
                let own = words(r)[r];
                (a.in_place() || a.count == own) && local.iter().all(|&q| words(q)[r] == own)
            }
            CollKind::Alltoallv => {
                a.in_place() == a0.in_place()
                    && local.iter().all(|&j| {
                        let (wi, wj) = (words(r), words(j));
                        if a.in_place() {
                            wi[2 * n + j] == wj[2 * n + r]
                        } else {
                            wi[j] == wj[2 * n + r]
                        }
                    })
            }
        };
        if !ok {
            return mismatch(r);
        }
    }
    Ok(())
}

/// When the liveness of ranks was last looked at.
pub struct Liveness {
    last: Instant,
}

impl Default for Liveness {
    fn default() -> Self {
        Self {
            last: Instant::now(),
        }
    }
}

impl Liveness {
    /// Whether it is time to look again (every 2 ms at most).
    pub fn due(&mut self) -> bool {
        let now = Instant::now();
        if now.duration_since(self.last).as_micros() >= 2000 {
            self.last = now;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs::{File, OpenOptions};
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    static NEXT: AtomicU32 = AtomicU32::new(0);

    /// A `/dev/shm` object of `len` bytes holding `data`, mapped as the worker maps a rank's
    /// buffer; the file stays open to read the result back.
    fn shared(data: &[u8]) -> (Access, File) {
        let name = format!(
            "urom-coll-engine-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let path = format!("/dev/shm/{name}");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .expect("creating a shared-memory object");
        file.set_len(data.len() as u64).unwrap();
        file.write_all_at(data, 0).unwrap();
        let map = SharedMap::open(name.as_bytes(), data.len());
        std::fs::remove_file(&path).unwrap();
        (Access::Shared(map.expect("mapping it")), file)
    }

    /// Runs one collective of `args` over `n` ranks (all this process) step by step, each
    /// rank sending `sends[r]` and receiving into a buffer of `recv_len` bytes, with the
    /// helper threads on `cores` (empty: the worker's thread alone); the steps it took and
    /// every rank's receive buffer.
    fn run_steps(
        args: CollArgs,
        sends: &[Vec<u8>],
        recv_len: usize,
        cores: &[usize],
    ) -> (usize, Vec<Vec<u8>>) {
        let n = sends.len();
        let pid = std::process::id();
        let mut team = Team::new(1, 0, &vec![pid; n], None);
        let mut recvs = Vec::new();
        for (r, send) in sends.iter().enumerate() {
            team.members[r] = Some(Member {
                dest_id: r as u64,
                plugin: 0,
                pid,
                buffers: Vec::new(),
                queue: Ring::new(),
                create_ctx: None,
            });
            let (send_buf, _file) = shared(send);
            let (recv, file) = shared(&vec![0xee; recv_len]);
            team.register(r, 0, send_buf, send.len() as u64).unwrap();
            team.register(r, 1, recv, recv_len as u64).unwrap();
            recvs.push(file);
        }
        team.joined = n;
        team.formed = true;
        for r in 0..n {
            team.init(r, args, &[]).unwrap();
            team.start(r, 0, 0).unwrap();
        }
        let coll = team.activate().unwrap();
        let mut active = Active {
            coll,
            block: 0,
            off: 0,
        };
        let mut scratch = Scratch::default();
        scratch.threads.start_on(cores);
        let mut steps = 0;
        loop {
            steps += 1;
            if team.step(&mut active, &mut scratch).unwrap() {
                break;
            }
        }
        let got = recvs
            .iter()
            .map(|file| {
                let mut got = vec![0; recv_len];
                file.read_exact_at(&mut got, 0).unwrap();
                got
            })
            .collect();
        (steps, got)
    }

    fn args(kind: CollKind, datatype: Datatype, count: u64) -> CollArgs {
        CollArgs {
            coll: 0,
            kind,
            datatype,
            op: ReduceOp::Sum,
            root: 0,
            flags: 0,
            send_buf: 0,
            recv_buf: 1,
            send_off: 0,
            recv_off: 0,
            count,
            recv_count: count,
        }
    }

    /// An alltoall of `bytes` per block over `n` ranks run step by step; the steps it took,
    /// after checking every rank's result.
    fn alltoall_steps(n: usize, bytes: usize) -> usize {
        let pattern = |from: usize, to: usize, j: usize| (from * 31 + to * 7 + j) as u8;
        let sends: Vec<Vec<u8>> = (0..n)
            .map(|r| {
                (0..n * bytes)
                    .map(|k| pattern(r, k / bytes, k % bytes))
                    .collect()
            })
            .collect();
        let args = args(CollKind::Alltoall, Datatype::U8, bytes as u64);
        let (steps, got) = run_steps(args, &sends, n * bytes, &[]);
        for (r, got) in got.iter().enumerate() {
            for (k, &b) in got.iter().enumerate() {
                assert_eq!(b, pattern(k / bytes, r, k % bytes), "rank {r}, byte {k}");
            }
        }
        steps
    }

    /// A step split among threads gives exactly the bytes of one thread: every float element
    /// is still summed in rank order (values of mixed magnitude, where the order shows), and
    /// every block of an alltoall lands where it does on one thread; with uneven parts (a
    /// count that is no multiple of the part size) and more threads than cores.
    #[test]
    fn parallel_steps_give_the_single_threaded_bytes() {
        let core = allowed_cores().first().copied().unwrap_or(0);
        let many = [core; 4];
        let n = 5;
        // 300,007 f32 per rank: 1.2 MB, five steps, the last one short.
        let count = 300_007usize;
        let sends: Vec<Vec<u8>> = (0..n)
            .map(|r| {
                (0..count)
                    .flat_map(|i| {
                        let x = ((i * 7919 + r * 104_729) % 1000) as f32;
                        let v = if (i + r) % 3 == 0 {
                            x * 1.0e7
                        } else {
                            x * 1.0e-3 + 0.1
                        };
                        let v = if (i + r) % 2 == 0 { v } else { -v };
                        v.to_le_bytes()
                    })
                    .collect()
            })
            .collect();
        let reduce = args(CollKind::Allreduce, Datatype::F32, count as u64);
        let (steps1, one) = run_steps(reduce, &sends, count * 4, &[]);
        let (steps4, four) = run_steps(reduce, &sends, count * 4, &many);
        assert_eq!(steps1, steps4);
        assert!(one == four, "the parallel allreduce differs");
        // And it is the rank-order sum.
        for i in (0..count).step_by(997) {
            let mut acc = f32::from_le_bytes(sends[0][4 * i..4 * i + 4].try_into().unwrap());
            for send in &sends[1..] {
                acc += f32::from_le_bytes(send[4 * i..4 * i + 4].try_into().unwrap());
            }
            let got = f32::from_le_bytes(one[n - 1][4 * i..4 * i + 4].try_into().unwrap());
            assert_eq!(got.to_bits(), acc.to_bits(), "element {i}");
        }
        // An alltoall of 12 ranks, 40,001 bytes per block: steps across many blocks.
        let n = 12;
        let bytes = 40_001usize;
        let sends: Vec<Vec<u8>> = (0..n)
            .map(|r| (0..n * bytes).map(|k| (k * 13 + r * 101) as u8).collect())
            .collect();
        let exchange = args(CollKind::Alltoall, Datatype::U8, bytes as u64);
        let (_, one) = run_steps(exchange, &sends, n * bytes, &[]);
        let (_, four) = run_steps(exchange, &sends, n * bytes, &many);
        assert!(one == four, "the parallel alltoall differs");
        for (r, got) in one.iter().enumerate() {
            for s in 0..n {
                assert!(got[s * bytes..(s + 1) * bytes] == sends[s][r * bytes..(r + 1) * bytes]);
            }
        }
    }

    /// The cpuset decides the threads: cores of its own (fewer than the machine's), up to 8;
    /// anywhere, one; `UROM_COLL_THREADS` decides either way, within the cpuset.
    #[test]
    fn the_cpuset_decides_the_threads() {
        assert_eq!(threads_for(4, Some(16), None), 4);
        assert_eq!(threads_for(1, Some(16), None), 1);
        assert_eq!(threads_for(12, Some(16), None), MAX_THREADS);
        assert_eq!(threads_for(16, Some(16), None), 1);
        assert_eq!(threads_for(2, None, None), 1);
        assert_eq!(threads_for(16, Some(16), Some(4)), 4);
        assert_eq!(threads_for(4, Some(16), Some(1)), 1);
        assert_eq!(threads_for(4, Some(16), Some(0)), 1);
        assert_eq!(threads_for(4, Some(16), Some(64)), 4);
        assert_eq!(threads_for(0, Some(16), None), 0);
    }

    /// Small blocks are batched into one step; large ones move CHUNK bytes per step.
    #[test]
    fn a_step_moves_up_to_a_chunk_across_blocks() {
        // 144 blocks of 8 bytes: one step.
        assert_eq!(alltoall_steps(12, 8), 1);
        // 144 blocks of 4 KiB (576 KiB): three steps of at most 256 KiB.
        assert_eq!(alltoall_steps(12, 4096), 3);
        // 4 blocks of 1 MiB: four chunks each.
        assert_eq!(alltoall_steps(2, 1 << 20), 16);
    }
}
