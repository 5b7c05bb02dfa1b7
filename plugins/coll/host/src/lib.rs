//! The host side of urom's collective offload: the ranks of a node hand MPI-style collectives
//! to one worker, which moves and reduces the data in their registered buffers while they
//! compute.
//!
//! The walk, top down:
//!
//! 1. [`node_worker`]: the first rank (of the out-of-band group) starts the node's worker with
//!    the `worker_coll` plugin, the others attach to it by id; each rank is one connection.
//! 2. [`Team::create`]: all ranks of the out-of-band group (or a subset: a sub-team) form a
//!    team on that worker. Collective across the group, like `MPI_Comm_create`.
//! 3. Buffers are registered once: [`Team::alloc`] allocates memory the worker shares (like
//!    `MPI_Alloc_mem`), [`Team::register`] lends an existing buffer of this process, reached by
//!    cross-memory attach.
//! 4. Persistent collectives are set up once ([`Team::init`] with a [`CollSpec`], or
//!    [`Team::allreduce_init`] and friends); [`Collective::start`] returns a [`Request`] to
//!    [`Request::test`] or [`Request::wait`] on, or runs the collective's callback
//!    ([`Collective::set_callback`]). Completion arrives as a notification through the
//!    [`ProgressEngine`], whose notification descriptor wakes an event loop. A start allocates
//!    nothing.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use urom_coll::{CollHost, Datatype, ReduceOp, Team, node_worker};
//! use urom_host::oob::{RendezvousAddr, SocketOob};
//! use urom_host::{Idle, ProgressEngine, Service};
//!
//! let (rank, size) = (0, 2);
//! let mut oob = SocketOob::join(
//!     &RendezvousAddr::Unix("/tmp/rendezvous.sock".into()),
//!     size,
//!     rank,
//!     Duration::from_secs(30),
//! )?;
//! let mut engine = ProgressEngine::new();
//! let service = Service::<Idle>::new().start().map_err(|(_, e)| e)?;
//! let host = CollHost::new(&service)?;
//! let worker = std::rc::Rc::new(node_worker(&mut engine, &service, &host, &mut oob)?);
//! let team = Team::create(&mut engine, &worker, &host, &mut oob, None)?.expect("a member");
//! let mut data = team.alloc(&mut engine, 1024 * 4)?;
//! data.typed_mut::<f32>()?.fill(rank as f32);
//! let mut allreduce =
//!     team.allreduce_init(&mut engine, None, &data, 1024, Datatype::F32, ReduceOp::Sum)?;
//! allreduce.start()?.wait(&mut engine)?;
//! assert_eq!(data.typed::<f32>()?[0], 1.0);
//! # Ok(())
//! # }
//! ```
//!
//! Rules: every rank of a team creates its collectives in the same order and starts them in
//! the same order (MPI's rule); buffers are busy (their bytes cannot be borrowed) while a
//! collective using them runs; reductions fold ranks in rank order (see the plugin's
//! `reduce` module; on a team spanning nodes, each node's ranks so and then the nodes'
//! partials, the lower nodes' on the left: see the plugin's `internode` module), so float
//! results are deterministic.
//!
//! Teams spanning nodes: [`Team::create_in_domain`], with a running domain in which every
//! rank named its node's worker (`docs/collectives.md`, "Teams across nodes").
#![deny(unsafe_code)]

mod raw;
mod sys;

use std::cell::{Cell, Ref, RefCell, RefMut};
use std::fmt;
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use urom_coll_wire::{
    BufferKind, CollArgs, CollCommand, CollNotification, FLAG_IN_PLACE, NAME, NO_RANK, VERSION,
};
pub use urom_coll_wire::{CollKind, Datatype, Reason, ReduceOp};
use urom_host::oob::{OobCollective, OobError};
use urom_host::{
    CommandError, CompletedTask, Domain, Idle, ProgressEngine, Running, Service, StartProgress,
    Worker,
};
pub use urom_wire::CpuSet;
use urom_wire::Status;
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// How long set-up steps (team creation, registration, init) wait for the worker.
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a collective (or a set-up command) failed. `Copy`, never allocates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CollError {
    /// The worker answered with an error: what failed and which rank it names.
    Failed {
        /// The DOCA status.
        status: Status,
        /// What failed.
        reason: Reason,
        /// The rank at fault, when one is.
        rank: Option<u32>,
    },
    /// The worker refused the command's bytes (`DOCA_ERROR_INVALID_VALUE` without an answer).
    Malformed,
    /// The task ended without the plugin's answer: the worker died, was stopped, or its
    /// connection failed.
    Worker(Status),
    /// The command could not be submitted.
    Submit(urom_host::CommandError),
    /// The collective is already running: wait for it first.
    Busy,
    /// A buffer is used by a running collective.
    BufferBusy,
    /// The buffer's bytes are not a whole, aligned slice of the type asked for.
    Layout,
    /// The buffer is memory the caller registered by address ([`Team::register_raw`]): it
    /// has no byte view here; the caller reads it through its own pointer.
    Foreign,
}

impl fmt::Display for CollError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Failed {
                status,
                reason: reason @ (Reason::PeerWorker | Reason::NodesDisagree),
                rank: Some(node),
            } => write!(f, "node {node}: {reason} ({status})"),
            Self::Failed {
                status,
                reason,
                rank: Some(rank),
            } => write!(f, "rank {rank}: {reason} ({status})"),
            Self::Failed { status, reason, .. } => write!(f, "{reason} ({status})"),
            Self::Malformed => f.write_str("the worker refused a malformed collective command"),
            Self::Worker(status) => write!(
                f,
                "the node's worker failed before answering (it died, was stopped, or its \
                 connection closed): {status}"
            ),
            Self::Submit(e) => write!(f, "cannot submit to the worker: {e}"),
            Self::Busy => f.write_str("the collective is still running; wait for it first"),
            Self::BufferBusy => f.write_str("the buffer is used by a running collective"),
            Self::Layout => f.write_str("the buffer is not a whole, aligned slice of that type"),
            Self::Foreign => f.write_str(
                "the buffer was registered by address; read it through the caller's pointer",
            ),
        }
    }
}

impl std::error::Error for CollError {}

impl CollError {
    /// The node whose worker failed or disagreed, for a team spanning nodes
    /// ([`Reason::PeerWorker`], [`Reason::NodesDisagree`]: their `rank` is a node index).
    pub fn node(&self) -> Option<u32> {
        match *self {
            Self::Failed {
                reason: Reason::PeerWorker | Reason::NodesDisagree,
                rank,
                ..
            } => rank,
            _ => None,
        }
    }
}

/// Why setting up (a worker, a team, a buffer, a collective) failed.
#[derive(Debug)]
pub enum SetupError {
    /// The service offers no `worker_coll` plugin.
    NoPlugin,
    /// The service's plugin has another version.
    Version(u64),
    /// The out-of-band exchange failed.
    Oob(OobError),
    /// The node's worker did not start or attach.
    Worker(String),
    /// The members do not share one worker and no domain says where they live (use
    /// [`Team::create_in_domain`] for a team spanning nodes).
    NotOneNode,
    /// A member's domain id has no `worker_coll` address in the domain (its worker is not a
    /// member of the domain, or does not run the plugin).
    NotInDomain {
        /// The member's rank in the out-of-band group.
        rank: u32,
        /// Its domain id.
        domain_id: u64,
    },
    /// The members list is wrong (a rank twice, out of range, or none).
    Members,
    /// Shared memory could not be created.
    SharedMemory(std::io::Error),
    /// Cross-memory attach is forbidden here; says why.
    CrossMemory(String),
    /// The collective's description is inconsistent (says what).
    Spec(&'static str),
    /// The worker did not answer within [`SETUP_TIMEOUT`].
    Timeout,
    /// The worker refused, or failed.
    Coll(CollError),
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoPlugin => write!(f, "the service offers no {NAME} plugin"),
            Self::Version(found) => write!(
                f,
                "the service's {NAME} plugin has version {found:#x}; this host speaks {VERSION:#x}"
            ),
            Self::Oob(e) => write!(f, "out-of-band exchange failed: {e}"),
            Self::Worker(e) => write!(f, "the node's worker: {e}"),
            Self::NotOneNode => f.write_str(
                "the members do not share one worker: a team spanning nodes is created with \
                 Team::create_in_domain",
            ),
            Self::NotInDomain { rank, domain_id } => write!(
                f,
                "rank {rank}'s domain id {domain_id} has no {NAME} address in the domain (its \
                 worker is not a member, or does not run the plugin)"
            ),
            Self::Members => f.write_str("the members must be distinct ranks of the group"),
            Self::SharedMemory(e) => write!(f, "cannot create shared memory in /dev/shm: {e}"),
            Self::CrossMemory(why) => write!(f, "cross-memory attach is forbidden: {why}"),
            Self::Spec(why) => write!(f, "invalid collective: {why}"),
            Self::Timeout => write!(f, "the worker did not answer within {SETUP_TIMEOUT:?}"),
            Self::Coll(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for SetupError {}

impl From<CollError> for SetupError {
    fn from(e: CollError) -> Self {
        Self::Coll(e)
    }
}

impl From<OobError> for SetupError {
    fn from(e: OobError) -> Self {
        Self::Oob(e)
    }
}

/// The service's collective plugin: its id, checked to speak this host's version.
#[derive(Debug, Clone, Copy)]
pub struct CollHost {
    plugin: u64,
}

impl CollHost {
    /// Finds `worker_coll` on `service`.
    pub fn new(service: &Service<Running>) -> Result<Self, SetupError> {
        let info = service.plugin(NAME).ok_or(SetupError::NoPlugin)?;
        urom_coll_wire::check_version(info.version).map_err(SetupError::Version)?;
        Ok(Self { plugin: info.id })
    }

    /// The plugin's id.
    pub fn plugin(&self) -> u64 {
        self.plugin
    }
}

fn wait_running(
    engine: &mut ProgressEngine,
    worker: Worker<Idle>,
) -> Result<Worker<Running>, SetupError> {
    let starting = worker
        .start(engine)
        .map_err(|(_, e)| SetupError::Worker(e.to_string()))?;
    match starting.wait_running(engine, SETUP_TIMEOUT) {
        Ok(running) => Ok(running),
        Err(StartProgress::Starting(_)) => Err(SetupError::Timeout),
        Err(StartProgress::Failed(_, e)) => Err(SetupError::Worker(e.to_string())),
    }
}

/// Runs an allgather of `send` on `oob` to completion.
fn allgather(oob: &mut dyn OobCollective, send: &[u8]) -> Result<Vec<u8>, SetupError> {
    let mut request = oob.allgather(send)?;
    let deadline = Instant::now() + SETUP_TIMEOUT;
    loop {
        match oob.test(&mut request) {
            Ok(true) => break,
            Ok(false) if Instant::now() < deadline => std::thread::sleep(Duration::from_micros(50)),
            Ok(false) => {
                oob.free(request);
                return Err(SetupError::Timeout);
            }
            Err(e) => {
                oob.free(request);
                return Err(e.into());
            }
        }
    }
    let received = request.received().to_vec();
    oob.free(request);
    Ok(received)
}

/// The node's worker for this rank: rank 0 of `oob` starts it with the collective plugin, the
/// others attach to it by the id rank 0 shares through `oob`. Collective over `oob`. The worker
/// runs on any CPU the daemon allows; [`node_worker_on`] pins it.
pub fn node_worker(
    engine: &mut ProgressEngine,
    service: &Service<Running>,
    host: &CollHost,
    oob: &mut dyn OobCollective,
) -> Result<Worker<Running>, SetupError> {
    node_worker_on(engine, service, host, oob, &CpuSet::new())
}

/// [`node_worker`] with the worker pinned to `cpus` (rank 0's set counts; the empty set: any
/// CPU the daemon allows), so that it does not take the ranks' cores. The daemon refuses CPUs
/// outside its own `--cpuset`.
pub fn node_worker_on(
    engine: &mut ProgressEngine,
    service: &Service<Running>,
    host: &CollHost,
    oob: &mut dyn OobCollective,
    cpus: &CpuSet,
) -> Result<Worker<Running>, SetupError> {
    let base = Worker::new()
        .set_service(service)
        .set_plugins(host.plugin)
        .set_cpuset(*cpus)
        .set_max_inflight_tasks(128);
    let (id, started) = if oob.rank() == 0 {
        match wait_running(engine, base) {
            Ok(worker) => (worker.id(), Some(worker)),
            Err(e) => {
                // The others learn it failed: id u64::MAX.
                let _ = allgather(oob, &u64::MAX.to_le_bytes());
                return Err(e);
            }
        }
    } else {
        (0, None)
    };
    let ids = allgather(oob, &id.to_le_bytes())?;
    let id = u64::from_le_bytes(ids[..8].try_into().expect("8 bytes per rank"));
    if id == u64::MAX {
        return Err(SetupError::Worker(
            "rank 0 could not start the node's worker".into(),
        ));
    }
    match started {
        Some(worker) => Ok(worker),
        None => {
            let attach = Worker::new()
                .set_service(service)
                .set_plugins(host.plugin)
                .set_id(id)
                .set_max_inflight_tasks(128);
            wait_running(engine, attach)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Completions: a task's callback is a plain function with 32 bytes of user data, so the
// waiter it completes is found in a per-thread table (the engine and its workers are
// single-threaded: tasks complete on the thread that submitted them).

/// A collective's completion callback.
type Callback = Box<dyn FnMut(Result<(), CollError>)>;

/// What a submitted command waits for.
struct Completion {
    /// Whether a command is in flight.
    in_flight: Cell<bool>,
    /// The outcome of the last command, until taken.
    outcome: Cell<Option<Result<CollNotification, CollError>>>,
    /// How many commands completed (each exactly once).
    completed: Cell<u64>,
    /// Run at each completion.
    callback: RefCell<Option<Callback>>,
    /// The buffers a collective uses: busy while it runs.
    busy: Vec<Rc<BufferInner>>,
    /// Its place in the table.
    slot: Cell<(u32, u32)>,
}

struct Entry {
    generation: u32,
    waiter: std::rc::Weak<Completion>,
    /// Held while a command is in flight, so that its buffers outlive it.
    held: Option<Rc<Completion>>,
}

#[derive(Default)]
struct Table {
    entries: Vec<Entry>,
    free: Vec<u32>,
}

thread_local! {
    static TABLE: RefCell<Table> = RefCell::new(Table::default());
}

impl Completion {
    fn new(busy: Vec<Rc<BufferInner>>) -> Rc<Self> {
        let completion = Rc::new(Self {
            in_flight: Cell::new(false),
            outcome: Cell::new(None),
            completed: Cell::new(0),
            callback: RefCell::new(None),
            busy,
            slot: Cell::new((0, 0)),
        });
        let slot = TABLE.with(|table| {
            let mut table = table.borrow_mut();
            let waiter = Rc::downgrade(&completion);
            match table.free.pop() {
                Some(index) => {
                    let entry = &mut table.entries[index as usize];
                    entry.generation = entry.generation.wrapping_add(1);
                    entry.waiter = waiter;
                    (index, entry.generation)
                }
                None => {
                    table.entries.push(Entry {
                        generation: 0,
                        waiter,
                        held: None,
                    });
                    ((table.entries.len() - 1) as u32, 0)
                }
            }
        });
        completion.slot.set(slot);
        completion
    }

    /// Marks a command in flight: the table holds the completion until it completes.
    fn launch(self: &Rc<Self>) {
        self.in_flight.set(true);
        self.outcome.set(None);
        for buffer in &self.busy {
            buffer.busy.set(buffer.busy.get() + 1);
        }
        let (index, _) = self.slot.get();
        TABLE.with(|table| {
            table.borrow_mut().entries[index as usize].held = Some(Rc::clone(self));
        });
    }

    /// Undoes [`Completion::launch`] for a command that was not submitted.
    fn unlaunch(&self) {
        self.in_flight.set(false);
        for buffer in &self.busy {
            buffer.busy.set(buffer.busy.get() - 1);
        }
        let (index, _) = self.slot.get();
        let held = TABLE.with(|table| table.borrow_mut().entries[index as usize].held.take());
        drop(held);
    }

    fn user_data(&self) -> [u8; 8] {
        let (index, generation) = self.slot.get();
        (u64::from(generation) << 32 | u64::from(index)).to_le_bytes()
    }

    fn finish(&self, status: Status, response: &[u8]) {
        let parsed = CollNotification::parse(response);
        let outcome = match (status, parsed) {
            (Status::Success, Ok(n)) if n.status == 0 => Ok(n),
            (_, Ok(n)) => Err(CollError::Failed {
                status: Status::from_raw(n.status),
                reason: n.reason,
                rank: (n.rank != NO_RANK).then_some(n.rank),
            }),
            (Status::InvalidValue, Err(_)) => Err(CollError::Malformed),
            (Status::Success, Err(_)) => Err(CollError::Malformed),
            (status, Err(_)) => Err(CollError::Worker(status)),
        };
        for buffer in &self.busy {
            buffer.busy.set(buffer.busy.get().saturating_sub(1));
        }
        self.in_flight.set(false);
        self.completed.set(self.completed.get() + 1);
        self.outcome.set(Some(outcome));
        if let Ok(mut callback) = self.callback.try_borrow_mut() {
            if let Some(callback) = callback.as_mut() {
                callback(outcome.map(|_| ()));
            }
        }
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        let (index, _) = self.slot.get();
        let _ = TABLE.try_with(|table| {
            if let Ok(mut table) = table.try_borrow_mut() {
                table.free.push(index);
            }
        });
    }
}

/// The callback of every command task: completes its waiter.
fn on_done(task: &CompletedTask<'_>) {
    let word = u64::from_le_bytes(task.user_data[..8].try_into().expect("8 bytes"));
    let (index, generation) = (word as u32, (word >> 32) as u32);
    let waiter = TABLE.with(|table| {
        let mut table = table.borrow_mut();
        let entry = table.entries.get_mut(index as usize)?;
        if entry.generation != generation {
            return None;
        }
        entry.held.take().or_else(|| entry.waiter.upgrade())
    });
    if let Some(waiter) = waiter {
        waiter.finish(task.status, task.response);
    }
}

// ---------------------------------------------------------------------------------------------

static NEXT_KEY: AtomicU32 = AtomicU32::new(1);
static NEXT_SHM: AtomicU32 = AtomicU32::new(0);

struct TeamInner {
    /// The worker's command path; the team holds the worker context alive.
    worker: Rc<Worker<Running>>,
    plugin: u64,
    key: u64,
    rank: u32,
    size: u32,
    worker_pid: u32,
    next_buffer: Cell<u32>,
    /// Buffer ids deregistered, reused before new ones (ids are this rank's alone; the
    /// deregistration reaches the worker before the registration that reuses the id).
    free_buffers: RefCell<Vec<u32>>,
    next_coll: Cell<u32>,
    /// Which collective ids this rank holds ([`COLL_IDS`] bits). Ids are handed out in a
    /// cycle, the same sequence on every rank, so they match across ranks without an exchange.
    live_colls: RefCell<[u64; COLL_IDS as usize / 64]>,
    ptracer: Cell<bool>,
    /// Posted commands waiting for a task slot, oldest first.
    deferred: RefCell<std::collections::VecDeque<Vec<u8>>>,
}

/// How many collective ids a team has (the worker's table); ids are reused in a cycle.
pub const COLL_IDS: u32 = 4096;

impl TeamInner {
    /// The next collective id of the cycle; an error when that id is still held by a
    /// collective of this rank (4,096 alive at once).
    fn take_coll(&self) -> Result<u32, SetupError> {
        let coll = self.next_coll.get();
        let mut live = self.live_colls.borrow_mut();
        let (word, bit) = ((coll / 64) as usize, 1u64 << (coll % 64));
        if live[word] & bit != 0 {
            return Err(SetupError::Spec(
                "4,096 collectives of this team are alive: drop some first",
            ));
        }
        live[word] |= bit;
        self.next_coll.set((coll + 1) % COLL_IDS);
        Ok(coll)
    }

    /// Gives collective id `coll` back.
    fn release_coll(&self, coll: u32) {
        if let Ok(mut live) = self.live_colls.try_borrow_mut() {
            live[(coll / 64) as usize] &= !(1u64 << (coll % 64));
        }
    }

    /// Sends the commands [`TeamInner::post`] could not send yet, in order; whether none is
    /// left.
    fn flush(&self) -> bool {
        let Ok(mut deferred) = self.deferred.try_borrow_mut() else {
            return false;
        };
        while let Some(bytes) = deferred.front() {
            let sent = self.worker.submit(self.plugin, |task| {
                let out = task.payload_mut();
                match out.get_mut(..bytes.len()) {
                    Some(out) => {
                        out.copy_from_slice(bytes);
                        bytes.len()
                    }
                    None => 0,
                }
            });
            match sent {
                Err(CommandError::Exhausted) => return false,
                // Sent, or never will be (the worker is gone): either way done with it.
                _ => {
                    deferred.pop_front();
                }
            }
        }
        true
    }

    /// Submits `command` for `waiter`.
    fn submit(&self, command: &CollCommand<'_>, waiter: &Rc<Completion>) -> Result<(), CollError> {
        // Posted commands that waited for a task slot go first where they can.
        self.flush();
        waiter.launch();
        let user = waiter.user_data();
        let submitted = self.worker.submit(self.plugin, |task| {
            task.user_data_mut()[..8].copy_from_slice(&user);
            task.set_callback(on_done);
            command.emit(task.payload_mut()).unwrap_or(0)
        });
        match submitted {
            Ok(_) => Ok(()),
            Err(e) => {
                waiter.unlaunch();
                Err(CollError::Submit(e))
            }
        }
    }

    /// Submits `command` and progresses `engine` until it is answered.
    fn call(
        &self,
        engine: &mut ProgressEngine,
        command: &CollCommand<'_>,
    ) -> Result<CollNotification, SetupError> {
        if command.buffer_len() > self.worker.max_command_payload() {
            return Err(SetupError::Spec("the command does not fit a message"));
        }
        let waiter = Completion::new(Vec::new());
        // Every task slot may be in flight (collectives running, a burst of posted commands):
        // progress until one frees. Posted commands go first, so that the worker sees this
        // rank's commands in the order they were made.
        let deadline = Instant::now() + SETUP_TIMEOUT;
        loop {
            let sent = if self.flush() {
                match self.submit(command, &waiter) {
                    Err(CollError::Submit(CommandError::Exhausted)) => false,
                    other => {
                        other?;
                        true
                    }
                }
            } else {
                false
            };
            if sent {
                break;
            }
            if Instant::now() > deadline {
                return Err(SetupError::Timeout);
            }
            engine.progress();
        }
        wait_for(engine, &waiter, Some(SETUP_TIMEOUT))
            .ok_or(SetupError::Timeout)?
            .map_err(SetupError::Coll)
    }

    /// Sends `command` without waiting for its answer. When no task slot is free it waits,
    /// in order, for the next command this rank submits (or the next post).
    fn post(&self, command: &CollCommand<'_>) {
        let sent = self.flush()
            && !matches!(
                self.worker.submit(self.plugin, |task| {
                    command.emit(task.payload_mut()).unwrap_or(0)
                }),
                Err(CommandError::Exhausted)
            );
        if !sent {
            let mut bytes = vec![0; command.buffer_len()];
            if let (Ok(len), Ok(mut deferred)) =
                (command.emit(&mut bytes), self.deferred.try_borrow_mut())
            {
                bytes.truncate(len);
                deferred.push_back(bytes);
            }
        }
    }
}

impl Drop for TeamInner {
    fn drop(&mut self) {
        self.flush();
        self.post(&CollCommand::TeamDestroy { team: self.key });
    }
}

/// Progresses `engine` until `waiter` has an outcome (or `timeout` passes); sleeps on the
/// engine's descriptor between.
fn wait_for(
    engine: &mut ProgressEngine,
    waiter: &Completion,
    timeout: Option<Duration>,
) -> Option<Result<CollNotification, CollError>> {
    let deadline = timeout.map(|t| Instant::now() + t);
    let mut idle = 0u32;
    loop {
        if let Some(outcome) = waiter.outcome.take() {
            return Some(outcome);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return None;
        }
        if engine.progress() > 0 {
            idle = 0;
        } else {
            idle += 1;
            if idle > 1000 {
                let _ = engine.wait(Duration::from_millis(1));
            }
        }
    }
}

/// Why the worker could not reach a registered buffer, for Yama's `scope`.
fn cross_memory_denied(scope: Option<u32>) -> String {
    match scope {
        Some(scope) => format!(
            "the kernel refused process_vm_readv from the worker (Yama ptrace_scope is \
             {scope}; 2 needs CAP_SYS_PTRACE, 3 forbids it), or a container's seccomp \
             profile forbids it"
        ),
        None => "the kernel refused process_vm_readv from the worker (a container's seccomp \
                 profile, or another user's process)"
            .to_owned(),
    }
}

/// A team: ranks of one node whose collectives the node's worker runs.
pub struct Team {
    inner: Rc<TeamInner>,
}

impl fmt::Debug for Team {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Team")
            .field("key", &self.inner.key)
            .field("rank", &self.inner.rank)
            .field("size", &self.inner.size)
            .finish()
    }
}

/// What each rank tells the others when a team forms.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Clone, Copy)]
#[repr(C)]
struct Record {
    worker: U64,
    nonce: U32,
    pid: U32,
    /// The domain id of this rank's worker, for a team spanning nodes.
    domain_id: U64,
}

/// A v-variant's counts and displacements, one each per rank of `inner`'s team.
fn check_counts(inner: &TeamInner, spec: &CollSpec<'_>) -> Result<(), SetupError> {
    if spec.counts.len() != spec.kind.words(inner.size as usize) {
        return Err(SetupError::Spec(
            "a v-variant takes its counts and displacements for every rank",
        ));
    }
    Ok(())
}

/// Sets up this rank's part of collective `coll` on the worker (a round trip); the completion
/// that keeps its buffers registered.
fn set_up(
    inner: &TeamInner,
    engine: &mut ProgressEngine,
    spec: &CollSpec<'_>,
    coll: u32,
) -> Result<Rc<Completion>, SetupError> {
    let in_place = spec.in_place;
    // In place, a scatter's root keeps its send buffer and receives nothing; every other
    // in-place collective takes its input from the receive buffer.
    let scatter = spec.kind == CollKind::Scatter;
    let send = if in_place && !scatter {
        None
    } else {
        spec.send.or(spec.recv)
    };
    let recv = if in_place && scatter {
        None
    } else {
        spec.recv.or(spec.send)
    };
    let mut busy = Vec::new();
    for b in [send, recv].into_iter().flatten() {
        if !busy
            .iter()
            .any(|x: &Rc<BufferInner>| Rc::ptr_eq(x, &b.buffer.inner))
        {
            busy.push(Rc::clone(&b.buffer.inner));
        }
    }
    let args = CollArgs {
        coll,
        kind: spec.kind,
        datatype: spec.datatype,
        op: spec.op,
        root: spec.root,
        flags: if in_place { FLAG_IN_PLACE } else { 0 },
        send_buf: send.map_or(u32::MAX, |b| b.buffer.inner.id),
        recv_buf: recv.map_or(u32::MAX, |b| b.buffer.inner.id),
        send_off: send.map_or(0, |b| b.offset),
        recv_off: recv.map_or(0, |b| b.offset),
        count: spec.count,
        recv_count: spec.recv_count,
    };
    let words: Vec<U64> = spec.counts.iter().map(|&w| U64::new(w)).collect();
    let answer = inner.call(
        engine,
        &CollCommand::CollInit {
            team: inner.key,
            args,
            words: &words,
        },
    );
    answer?;
    Ok(Completion::new(busy))
}

impl Team {
    /// Forms a team on `worker` (this rank's connection to the node's worker, shared by
    /// reference counting with the team's buffers and collectives) of `members` (ranks of
    /// `oob`, in team-rank order; `None`: all of them). Every rank of `oob` calls it, like
    /// `MPI_Comm_create`; a rank that is not a member gets `None`.
    pub fn create(
        engine: &mut ProgressEngine,
        worker: &Rc<Worker<Running>>,
        host: &CollHost,
        oob: &mut dyn OobCollective,
        members: Option<&[u32]>,
    ) -> Result<Option<Self>, SetupError> {
        Self::form(engine, worker, host, oob, members, None)
    }

    /// Forms a team whose members may live on several nodes, as [`Team::create`] does: each
    /// node's worker (the one [`node_worker`] gave its ranks) serves that node's members and
    /// exchanges the rest with the other nodes' workers over UCX. `domain` is a running domain
    /// of every rank of `oob`, in which this rank's worker has domain id `domain_id` (each rank
    /// names its node's worker under an id of its own); members whose workers have the same
    /// `worker_coll` address in the domain share a node. Nodes are numbered in the order their
    /// first member appears in `members`. Where all members share one node, the team is a
    /// single-node team and never touches the network.
    pub fn create_in_domain(
        engine: &mut ProgressEngine,
        worker: &Rc<Worker<Running>>,
        host: &CollHost,
        oob: &mut dyn OobCollective,
        members: Option<&[u32]>,
        domain: &Domain<Running>,
        domain_id: u64,
    ) -> Result<Option<Self>, SetupError> {
        Self::form(
            engine,
            worker,
            host,
            oob,
            members,
            Some((domain, domain_id)),
        )
    }

    fn form(
        engine: &mut ProgressEngine,
        worker: &Rc<Worker<Running>>,
        host: &CollHost,
        oob: &mut dyn OobCollective,
        members: Option<&[u32]>,
        domain: Option<(&Domain<Running>, u64)>,
    ) -> Result<Option<Self>, SetupError> {
        let all: Vec<u32> = (0..oob.size()).collect();
        let members = members.unwrap_or(&all);
        let mut seen = vec![false; oob.size() as usize];
        for &m in members {
            match seen.get_mut(m as usize) {
                Some(s) if !*s => *s = true,
                _ => return Err(SetupError::Members),
            }
        }
        if members.is_empty() {
            return Err(SetupError::Members);
        }
        let record = Record {
            worker: U64::new(worker.id()),
            nonce: U32::new(NEXT_KEY.fetch_add(1, Ordering::Relaxed)),
            pid: U32::new(std::process::id()),
            domain_id: U64::new(domain.map_or(u64::MAX, |(_, id)| id)),
        };
        let records = allgather(oob, record.as_bytes())?;
        let record_of = |rank: u32| {
            let at = rank as usize * size_of::<Record>();
            Record::read_from_bytes(&records[at..at + size_of::<Record>()])
                .expect("a record per rank")
        };
        let Some(rank) = members.iter().position(|&m| m == oob.rank()) else {
            return Ok(None);
        };
        let leader = record_of(members[0]);
        // Nodes: members whose workers have one plugin address in the domain share one.
        let mut addresses: Vec<&[u8]> = Vec::new();
        let mut node_of: Vec<U32> = Vec::with_capacity(members.len());
        let mut node_workers: Vec<U64> = Vec::new();
        if let Some((domain, _)) = domain {
            for &m in members {
                let id = record_of(m).domain_id.get();
                let address =
                    domain
                        .table()
                        .address(NAME, id)
                        .map_err(|_| SetupError::NotInDomain {
                            rank: m,
                            domain_id: id,
                        })?;
                let node = match addresses.iter().position(|a| *a == address) {
                    Some(node) => node,
                    None => {
                        addresses.push(address);
                        node_workers.push(U64::new(id));
                        addresses.len() - 1
                    }
                };
                node_of.push(U32::new(node as u32));
            }
        }
        let nodes = addresses.len().max(1);
        let my_node = node_of.get(rank).map_or(0, |n| n.get());
        if members.iter().zip(0..).any(|(&m, i)| {
            record_of(m).worker.get() != record_of(oob.rank()).worker.get()
                && node_of.get(i).map_or(0, |n| n.get()) == my_node
        }) {
            return Err(SetupError::NotOneNode);
        }
        if nodes == 1 {
            node_of.clear();
            node_workers.clear();
        }
        let key = u64::from(leader.pid.get()) << 32 | u64::from(leader.nonce.get());
        let pids: Vec<U32> = members.iter().map(|&m| record_of(m).pid).collect();
        let mut inner = TeamInner {
            worker: Rc::clone(worker),
            plugin: host.plugin,
            key,
            rank: rank as u32,
            size: members.len() as u32,
            worker_pid: 0,
            next_buffer: Cell::new(0),
            free_buffers: RefCell::new(Vec::new()),
            next_coll: Cell::new(0),
            live_colls: RefCell::new([0; COLL_IDS as usize / 64]),
            ptracer: Cell::new(false),
            deferred: RefCell::new(std::collections::VecDeque::new()),
        };
        let answer = inner.call(
            engine,
            &CollCommand::TeamCreate {
                team: key,
                rank: rank as u32,
                nodes: nodes as u32,
                pid: std::process::id(),
                pids: &pids,
                node_of: &node_of,
                node_workers: &node_workers,
            },
        );
        match answer {
            Ok(n) => {
                inner.worker_pid = n.worker_pid;
                Ok(Some(Self {
                    inner: Rc::new(inner),
                }))
            }
            // Dropping `inner` leaves the team on the worker's side too.
            Err(e) => Err(e),
        }
    }

    /// This rank in the team.
    pub fn rank(&self) -> u32 {
        self.inner.rank
    }

    /// How many ranks the team has.
    pub fn size(&self) -> u32 {
        self.inner.size
    }

    /// The worker's process id.
    pub fn worker_pid(&self) -> u32 {
        self.inner.worker_pid
    }

    fn next_buffer(&self) -> u32 {
        if let Some(id) = self.inner.free_buffers.borrow_mut().pop() {
            return id;
        }
        let id = self.inner.next_buffer.get();
        self.inner.next_buffer.set(id + 1);
        id
    }

    /// Allocates `len` bytes of memory shared with the worker (a `/dev/shm` object of this
    /// user, mode 0600, whose name is removed as soon as the worker mapped it) and registers
    /// it. Zeroed.
    pub fn alloc(&self, engine: &mut ProgressEngine, len: usize) -> Result<Buffer, SetupError> {
        let name = format!(
            "urom-coll-{}-{}",
            std::process::id(),
            NEXT_SHM.fetch_add(1, Ordering::Relaxed)
        );
        let file = sys::SharedFile::create(name, len).map_err(SetupError::SharedMemory)?;
        let id = self.next_buffer();
        let answer = self.inner.call(
            engine,
            &CollCommand::BufferRegister {
                team: self.inner.key,
                buffer: id,
                kind: BufferKind::Shared,
                addr: 0,
                len: len as u64,
                name: file.name.as_bytes(),
            },
        );
        file.unlink();
        if let Err(e) = answer {
            self.inner.free_buffers.borrow_mut().push(id);
            return Err(e);
        }
        Ok(Buffer::new(&self.inner, id, len, Storage::Shared(file)))
    }

    /// Registers `data`, an existing buffer of this process, which the worker reaches by
    /// cross-memory attach (`process_vm_readv` / `process_vm_writev`). Where Yama's
    /// `ptrace_scope` is 1, this process first allows the worker to attach
    /// (`PR_SET_PTRACER`); where the kernel or a container forbids it, the error says so.
    pub fn register<T>(
        &self,
        engine: &mut ProgressEngine,
        mut data: Vec<T>,
    ) -> Result<Buffer, SetupError>
    where
        T: FromBytes + IntoBytes + Immutable + KnownLayout + 'static,
    {
        let scope = sys::ptrace_scope();
        if scope == Some(1) && !self.inner.ptracer.get() {
            sys::set_ptracer(self.inner.worker_pid).map_err(|e| {
                SetupError::CrossMemory(format!(
                    "PR_SET_PTRACER for the worker (pid {}) failed: {e}",
                    self.inner.worker_pid
                ))
            })?;
            self.inner.ptracer.set(true);
        }
        let bytes = data.as_mut_bytes();
        let (addr, len) = (bytes.as_mut_ptr() as u64, bytes.len());
        let id = self.next_buffer();
        let answer = self.inner.call(
            engine,
            &CollCommand::BufferRegister {
                team: self.inner.key,
                buffer: id,
                kind: BufferKind::CrossMemory,
                addr,
                len: len as u64,
                name: &[],
            },
        );
        match answer {
            Err(SetupError::Coll(CollError::Failed {
                reason: Reason::CrossMemoryDenied,
                ..
            })) => Err(SetupError::CrossMemory(cross_memory_denied(scope))),
            Err(e) => {
                self.inner.free_buffers.borrow_mut().push(id);
                Err(e)
            }
            Ok(_) => Ok(Buffer::new(
                &self.inner,
                id,
                len,
                Storage::User(Box::new(data)),
            )),
        }
    }

    /// Sets up a persistent collective. Collective over the team: every rank sets up the same
    /// collectives in the same order.
    pub fn init(
        &self,
        engine: &mut ProgressEngine,
        spec: &CollSpec<'_>,
    ) -> Result<Collective, SetupError> {
        check_counts(&self.inner, spec)?;
        let coll = self.inner.take_coll()?;
        match set_up(&self.inner, engine, spec, coll) {
            Ok(waiter) => Ok(Collective {
                team: Rc::clone(&self.inner),
                coll,
                waiter,
            }),
            Err(e) => {
                // Refused: the worker holds nothing under the id. (A command that timed out
                // may leave it there; the id comes round again only after 4,095 others.)
                self.inner.release_coll(coll);
                Err(e)
            }
        }
    }

    /// `MPI_Allreduce_init`: `count` elements of `send` (`None`: in place) reduced into
    /// `recv` on every rank.
    pub fn allreduce_init(
        &self,
        engine: &mut ProgressEngine,
        send: Option<&Buffer>,
        recv: &Buffer,
        count: u64,
        datatype: Datatype,
        op: ReduceOp,
    ) -> Result<Collective, SetupError> {
        let mut spec = CollSpec::new(CollKind::Allreduce, datatype, count);
        spec.op = op;
        spec.send = send.map(Buffer::whole);
        spec.recv = Some(recv.whole());
        spec.in_place = send.is_none();
        self.init(engine, &spec)
    }

    /// `MPI_Bcast_init`: `count` elements of `buffer` from `root`.
    pub fn bcast_init(
        &self,
        engine: &mut ProgressEngine,
        buffer: &Buffer,
        count: u64,
        datatype: Datatype,
        root: u32,
    ) -> Result<Collective, SetupError> {
        let mut spec = CollSpec::new(CollKind::Bcast, datatype, count);
        spec.root = root;
        spec.send = Some(buffer.whole());
        self.init(engine, &spec)
    }

    /// `MPI_Barrier_init`.
    pub fn barrier_init(&self, engine: &mut ProgressEngine) -> Result<Collective, SetupError> {
        self.init(engine, &CollSpec::new(CollKind::Barrier, Datatype::U8, 0))
    }

    /// `MPI_Alltoall_init`: block `j` of `count` elements of `send` (`None`: in place, from
    /// `recv`) goes to rank `j`.
    pub fn alltoall_init(
        &self,
        engine: &mut ProgressEngine,
        send: Option<&Buffer>,
        recv: &Buffer,
        count: u64,
        datatype: Datatype,
    ) -> Result<Collective, SetupError> {
        let mut spec = CollSpec::new(CollKind::Alltoall, datatype, count);
        spec.send = send.map(Buffer::whole);
        spec.recv = Some(recv.whole());
        spec.in_place = send.is_none();
        self.init(engine, &spec)
    }

    /// `MPI_Allgather_init`: `count` elements of `send` (`None`: in place, this rank's block
    /// of `recv`) from every rank into `recv`, rank order.
    pub fn allgather_init(
        &self,
        engine: &mut ProgressEngine,
        send: Option<&Buffer>,
        recv: &Buffer,
        count: u64,
        datatype: Datatype,
    ) -> Result<Collective, SetupError> {
        let mut spec = CollSpec::new(CollKind::Allgather, datatype, count);
        spec.send = send.map(Buffer::whole);
        spec.recv = Some(recv.whole());
        spec.in_place = send.is_none();
        self.init(engine, &spec)
    }
}

/// A part of a registered buffer: the buffer and an offset in elements.
#[derive(Clone, Copy)]
pub struct BufRef<'a> {
    buffer: &'a Buffer,
    offset: u64,
}

/// A collective, described as MPI describes it. Counts and offsets are in elements.
#[derive(Clone)]
pub struct CollSpec<'a> {
    /// Which collective.
    pub kind: CollKind,
    /// The element type.
    pub datatype: Datatype,
    /// The reduction (reductions only).
    pub op: ReduceOp,
    /// The root (rooted collectives only).
    pub root: u32,
    /// The send buffer (for a broadcast: the buffer).
    pub send: Option<BufRef<'a>>,
    /// The receive buffer.
    pub recv: Option<BufRef<'a>>,
    /// Whether this rank's send data is in the receive buffer (MPI_IN_PLACE).
    pub in_place: bool,
    /// The (send) count.
    pub count: u64,
    /// The receive count (per rank, for allgather, alltoall, gather, scatter and
    /// reduce-scatter-block).
    pub recv_count: u64,
    /// A v-variant's counts and displacements: allgatherv `recvcounts, displs`; alltoallv
    /// `sendcounts, sdispls, recvcounts, rdispls`, each one per rank.
    pub counts: Vec<u64>,
}

impl<'a> CollSpec<'a> {
    /// A collective of `kind` on `count` elements of `datatype` (receive count the same),
    /// sum, root 0, no buffers yet.
    pub fn new(kind: CollKind, datatype: Datatype, count: u64) -> Self {
        Self {
            kind,
            datatype,
            op: ReduceOp::Sum,
            root: 0,
            send: None,
            recv: None,
            in_place: false,
            count,
            recv_count: count,
            counts: Vec::new(),
        }
    }
}

enum Storage {
    Shared(sys::SharedFile),
    User(Box<dyn UserBytes>),
    /// Memory of the caller's, registered by address ([`Team::register_raw`]).
    Raw(raw::RawRegion),
}

trait UserBytes {
    fn bytes(&self) -> &[u8];
    fn bytes_mut(&mut self) -> &mut [u8];
}

impl<T: FromBytes + IntoBytes + Immutable + KnownLayout> UserBytes for Vec<T> {
    fn bytes(&self) -> &[u8] {
        self.as_bytes()
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        self.as_mut_bytes()
    }
}

struct BufferInner {
    team: Rc<TeamInner>,
    id: u32,
    len: usize,
    /// Collectives running over it.
    busy: Cell<u32>,
    storage: RefCell<Storage>,
}

impl Drop for BufferInner {
    fn drop(&mut self) {
        // No collective holds it any more, so none runs over it: deregister, then free.
        self.team.post(&CollCommand::BufferDeregister {
            team: self.team.key,
            buffer: self.id,
        });
        if let Ok(mut free) = self.team.free_buffers.try_borrow_mut() {
            free.push(self.id);
        }
    }
}

/// A buffer registered with a team. Its bytes can be borrowed while no collective using it
/// runs; it stays alive (and registered) while a collective set up over it exists.
pub struct Buffer {
    inner: Rc<BufferInner>,
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer")
            .field("id", &self.inner.id)
            .field("len", &self.inner.len)
            .finish()
    }
}

impl Buffer {
    fn new(team: &Rc<TeamInner>, id: u32, len: usize, storage: Storage) -> Self {
        Self {
            inner: Rc::new(BufferInner {
                team: Rc::clone(team),
                id,
                len,
                busy: Cell::new(0),
                storage: RefCell::new(storage),
            }),
        }
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// The address of its first byte in this process: where a C caller reads and writes
    /// memory urom allocated ([`Team::alloc`]), or the address given to
    /// [`Team::register_raw`]. Valid while the buffer lives; reading or writing through it
    /// while a collective using the buffer runs races with the worker.
    pub fn as_mut_ptr(&self) -> *mut u8 {
        match &mut *self.inner.storage.borrow_mut() {
            Storage::Shared(file) => file.map.as_mut_ptr(),
            Storage::User(data) => data.bytes_mut().as_mut_ptr(),
            Storage::Raw(region) => region.addr(),
        }
    }

    /// Whether a collective using it runs.
    pub fn is_busy(&self) -> bool {
        self.inner.busy.get() > 0
    }

    /// All of it, from element 0.
    pub fn whole(&self) -> BufRef<'_> {
        self.at(0)
    }

    /// From element `offset` of the collective's datatype.
    pub fn at(&self, offset: u64) -> BufRef<'_> {
        BufRef {
            buffer: self,
            offset,
        }
    }

    /// Its bytes; [`CollError::BufferBusy`] while a collective using it runs.
    pub fn bytes(&self) -> Result<Ref<'_, [u8]>, CollError> {
        if self.is_busy() {
            return Err(CollError::BufferBusy);
        }
        let storage = self
            .inner
            .storage
            .try_borrow()
            .map_err(|_| CollError::BufferBusy)?;
        if matches!(*storage, Storage::Raw(_)) {
            return Err(CollError::Foreign);
        }
        Ok(Ref::map(storage, |s| match s {
            Storage::Shared(file) => &file.map[..self.inner.len],
            Storage::User(data) => data.bytes(),
            Storage::Raw(_) => &[],
        }))
    }

    /// Its bytes, writable; [`CollError::BufferBusy`] while a collective using it runs.
    pub fn bytes_mut(&mut self) -> Result<RefMut<'_, [u8]>, CollError> {
        if self.is_busy() {
            return Err(CollError::BufferBusy);
        }
        let len = self.inner.len;
        let storage = self
            .inner
            .storage
            .try_borrow_mut()
            .map_err(|_| CollError::BufferBusy)?;
        if matches!(*storage, Storage::Raw(_)) {
            return Err(CollError::Foreign);
        }
        Ok(RefMut::map(storage, |s| match s {
            Storage::Shared(file) => &mut file.map[..len],
            Storage::User(data) => data.bytes_mut(),
            Storage::Raw(_) => &mut [],
        }))
    }

    /// Its bytes as elements of `T`.
    pub fn typed<T: FromBytes + Immutable + KnownLayout>(&self) -> Result<Ref<'_, [T]>, CollError> {
        Ref::filter_map(self.bytes()?, |b| <[T]>::ref_from_bytes(b).ok())
            .map_err(|_| CollError::Layout)
    }

    /// Its bytes as writable elements of `T`.
    pub fn typed_mut<T: FromBytes + IntoBytes + KnownLayout>(
        &mut self,
    ) -> Result<RefMut<'_, [T]>, CollError> {
        RefMut::filter_map(self.bytes_mut()?, |b| <[T]>::mut_from_bytes(b).ok())
            .map_err(|_| CollError::Layout)
    }
}

/// A persistent collective, set up once, started any number of times.
pub struct Collective {
    team: Rc<TeamInner>,
    coll: u32,
    waiter: Rc<Completion>,
}

impl fmt::Debug for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Collective")
            .field("coll", &self.coll)
            .finish()
    }
}

impl Collective {
    /// Runs `callback` each time the collective completes, from the engine's progress.
    /// Allocates once, here.
    pub fn set_callback(&mut self, callback: impl FnMut(Result<(), CollError>) + 'static) {
        *self.waiter.callback.borrow_mut() = Some(Box::new(callback));
    }

    /// Starts it; the request completes when every rank's part is done. Allocates nothing.
    pub fn start(&mut self) -> Result<Request<'_>, CollError> {
        if self.waiter.in_flight.get() {
            return Err(CollError::Busy);
        }
        self.team.submit(
            &CollCommand::CollStart {
                team: self.team.key,
                coll: self.coll,
            },
            &self.waiter,
        )?;
        Ok(Request { coll: self })
    }

    /// Progresses `engine` once; the outcome of the last start once it completed (`None`
    /// while it runs, or when it was never started). Like [`Request::test`], for callers
    /// that cannot keep the request's borrow (a C handle).
    pub fn test(&mut self, engine: &mut ProgressEngine) -> Option<Result<(), CollError>> {
        if self.waiter.in_flight.get() {
            engine.progress();
        }
        if self.waiter.in_flight.get() {
            return None;
        }
        let outcome = self.waiter.outcome.take();
        self.waiter.outcome.set(outcome);
        outcome.map(|o| o.map(|_| ()))
    }

    /// Progresses `engine` until the last start completed; its outcome (`None` when it was
    /// never started). Like [`Request::wait`].
    pub fn wait(&mut self, engine: &mut ProgressEngine) -> Option<Result<(), CollError>> {
        if !self.waiter.in_flight.get() {
            return self.test(engine);
        }
        let outcome = wait_for(engine, &self.waiter, None)?;
        self.waiter.outcome.set(Some(outcome));
        Some(outcome.map(|_| ()))
    }

    /// Whether it runs.
    pub fn is_running(&self) -> bool {
        self.waiter.in_flight.get()
    }

    /// Replaces this rank's part of the collective (its buffers, offsets, counts, in-place
    /// flag) with `spec`'s, keeping its id: this rank alone, no other rank takes part (a round
    /// trip to the worker). The other ranks keep their parts; the next start checks that all
    /// parts agree, as after [`Team::init`]. `spec`'s buffers must be the team's. Refused
    /// while it runs. When the worker refuses the new part, the collective keeps none for
    /// this rank: its next start fails.
    pub fn rebind(
        &mut self,
        engine: &mut ProgressEngine,
        spec: &CollSpec<'_>,
    ) -> Result<(), SetupError> {
        if self.waiter.in_flight.get() {
            return Err(SetupError::Coll(CollError::Busy));
        }
        check_counts(&self.team, spec)?;
        // The worker handles this rank's commands in order: the old part goes, the new one
        // comes, before any later start.
        self.team.post(&CollCommand::CollDestroy {
            team: self.team.key,
            coll: self.coll,
        });
        let waiter = set_up(&self.team, engine, spec, self.coll)?;
        waiter.completed.set(self.waiter.completed.get());
        let callback = self.waiter.callback.borrow_mut().take();
        *waiter.callback.borrow_mut() = callback;
        self.waiter = waiter;
        Ok(())
    }

    /// How many of its starts have completed (each exactly once).
    pub fn completions(&self) -> u64 {
        self.waiter.completed.get()
    }
}

impl Drop for Collective {
    fn drop(&mut self) {
        if !self.waiter.in_flight.get() {
            self.team.post(&CollCommand::CollDestroy {
                team: self.team.key,
                coll: self.coll,
            });
            self.team.release_coll(self.coll);
        }
    }
}

/// A started collective.
pub struct Request<'c> {
    coll: &'c mut Collective,
}

impl fmt::Debug for Request<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Request").field("coll", &self.coll).finish()
    }
}

impl Request<'_> {
    /// Progresses `engine` once; the outcome once the collective completed.
    pub fn test(&mut self, engine: &mut ProgressEngine) -> Option<Result<(), CollError>> {
        if self.coll.waiter.in_flight.get() {
            engine.progress();
        }
        if self.coll.waiter.in_flight.get() {
            return None;
        }
        let outcome = self.coll.waiter.outcome.take();
        self.coll.waiter.outcome.set(outcome);
        outcome.map(|o| o.map(|_| ()))
    }

    /// Progresses `engine` until the collective completes; its outcome. Every failure (a
    /// rank that died, the worker killed) completes it with an error naming what failed.
    pub fn wait(self, engine: &mut ProgressEngine) -> Result<(), CollError> {
        wait_for(engine, &self.coll.waiter, None)
            .expect("no deadline")
            .map(|_| ())
    }
}
