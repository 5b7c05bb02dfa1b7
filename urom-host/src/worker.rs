//! The worker context: a worker process and the channel to it, with its task slots.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::fmt;
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::rc::Rc;
use std::sync::{Arc, mpsc};
use std::time::Duration;

use super::control::{ControlError, ExitWatch, Reply};
use super::engine::Poll;
use super::service::{Shared, WorkerSlot};
use super::task::{
    TaskCallback, TaskCompleteError, TaskHandle, TaskLoan, TaskSlots, USER_DATA_LEN,
};
use super::{Idle, ProgressEngine, Running, Service, Starting, State};
use urom_transport::auth;
use urom_transport::stream;
use urom_transport::{
    Armed, Channel, ChannelConfig, FrameReceiver, FrameRecvError, FrameSendError, FrameSender,
    ReadAhead, Transport,
};
use urom_wire::control::{
    ControlMessage, EndpointKind, SealedUcxAddress, SpawnWorker, WORKER_ID_ANY, WorkerExit,
};
use urom_wire::data::{
    COMMAND_PAYLOAD_OFFSET, DataMessage, fast_notification, max_command_payload,
    max_notify_payload, write_command_headers,
};
use urom_wire::domain::{AddressReply, DomainMessage, TableAck};
use urom_wire::{CpuSet, DecodeError, FrameRepr, List, MaxMsgSize, Status};

/// Why a worker did not start.
#[derive(Debug, Clone)]
pub enum WorkerStartError {
    /// No running service was set.
    NoService,
    /// The in-flight task limit is not a power of two (or above 2^31).
    MaxInflight(usize),
    /// The service already runs its `set_max_workers` worker contexts.
    TooManyWorkers(usize),
    /// An environment entry is not `NAME=value`.
    Env(String),
    /// An environment entry changes how programs load or run; the service would refuse it
    /// ([`urom_contract::worker_env`]).
    EnvRefused(urom_contract::worker_env::WorkerEnvError),
    /// The service refused or failed.
    Control(ControlError),
    /// The worker's channel could not be set up.
    Connect(String),
    /// The worker was reached, then failed before [`Worker::try_running`] saw it running (it
    /// exited at once, for example).
    Failed(WorkerFailure),
}

impl fmt::Display for WorkerStartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoService => f.write_str("no running service was given to the worker"),
            Self::MaxInflight(n) => write!(
                f,
                "max in-flight tasks {n} is not a power of two between 1 and 2^31"
            ),
            Self::TooManyWorkers(n) => write!(
                f,
                "the service already runs its {n} workers (its max workers); stop one first"
            ),
            Self::Env(entry) => write!(f, "environment entry `{entry}` is not NAME=value"),
            Self::EnvRefused(e) => write!(f, "{e}"),
            Self::Control(e) => write!(f, "{e}"),
            Self::Connect(e) => write!(f, "cannot reach the worker: {e}"),
            Self::Failed(failure) => write!(f, "the worker failed as it started: {failure}"),
        }
    }
}

impl std::error::Error for WorkerStartError {}

/// Why a running worker stopped working. By then every task it had in flight has completed
/// once, with [`WorkerFailure::status`]. Never allocates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerFailure {
    /// The worker process ended.
    Exited(WorkerExit),
    /// The channel to the worker broke (the worker closed it, died, or corrupted it).
    Lost(FrameRecvError),
    /// The worker sent something the data protocol does not allow; the host closed the
    /// channel.
    Protocol(WorkerProtocolError),
    /// [`Worker::stop`] stopped it.
    Stopped,
}

impl WorkerFailure {
    /// The status the worker's tasks in flight completed with: `DOCA_ERROR_SHUTDOWN` when it
    /// was stopped, `DOCA_ERROR_NOT_CONNECTED` otherwise.
    pub fn status(&self) -> Status {
        match self {
            Self::Stopped => Status::Shutdown,
            Self::Exited(_) | Self::Lost(_) | Self::Protocol(_) => Status::NotConnected,
        }
    }
}

impl fmt::Display for WorkerFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exited(exit) if exit.signal != 0 => write!(
                f,
                "worker {} was killed by signal {}",
                exit.worker_id, exit.signal
            ),
            Self::Exited(exit) => write!(
                f,
                "worker {} exited with code {}",
                exit.worker_id, exit.exit_code
            ),
            Self::Lost(e) => write!(f, "the channel to the worker broke: {e}"),
            Self::Protocol(e) => write!(f, "the worker broke the data protocol: {e}"),
            Self::Stopped => f.write_str("the worker was stopped"),
        }
    }
}

impl std::error::Error for WorkerFailure {}

/// What a worker sent that the host cannot accept. Each one fails the channel
/// ([`WorkerFailure::Protocol`]): a worker sends a host nothing but notifications, one per
/// command, so anything else means the two no longer agree on which tasks are in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerProtocolError {
    /// A frame that does not parse.
    Malformed(DecodeError),
    /// A command: workers do not send hosts commands.
    Command,
    /// A notification for a task that is not in flight: already completed, or never
    /// submitted.
    NotInFlight(TaskHandle),
    /// A notification whose payload exceeds the task's response space.
    ResponseTooLarge {
        /// Bytes offered.
        len: usize,
        /// Bytes of response space.
        capacity: usize,
    },
    /// A domain reply (a frame of this kind) while no domain start was waiting for one, or a
    /// domain request: workers send hosts only replies.
    UnexpectedDomainFrame(u16),
}

impl fmt::Display for WorkerProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Malformed(e) => write!(f, "a frame from the worker does not parse: {e}"),
            Self::Command => f.write_str("the worker sent a command; workers send notifications"),
            Self::NotInFlight(handle) => write!(
                f,
                "a notification for a task that is not in flight: {handle}"
            ),
            Self::ResponseTooLarge { len, capacity } => write!(
                f,
                "a notification of {len} bytes exceeds the task's response space of {capacity} bytes"
            ),
            Self::UnexpectedDomainFrame(kind) => write!(
                f,
                "a domain frame (kind {kind:#06x}) that no domain start asked for"
            ),
        }
    }
}

impl std::error::Error for WorkerProtocolError {}

/// Where a worker context is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerState {
    /// Waiting for the service to spawn it.
    Starting,
    /// Accepting command tasks.
    Running,
    /// Failed; every task it had in flight completed with an error.
    Failed(WorkerFailure),
}

/// Why a command task was not submitted. Never allocates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandError {
    /// The worker is not running (it failed, or stopped).
    NotRunning,
    /// Every task slot is in flight (the worker's max in-flight tasks): progress first. The
    /// only refusal of a well-formed command to a running worker: a command the channel cannot
    /// take now waits in the task's slot and goes, in order, as the worker frees room.
    Exhausted,
    /// The payload does not fit a message.
    TooBig {
        /// Its length.
        len: usize,
        /// The most a command carries.
        capacity: usize,
    },
    /// The channel failed.
    Send(FrameSendError),
}

impl fmt::Display for CommandError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotRunning => f.write_str("the worker is not running"),
            Self::Exhausted => {
                f.write_str("every task slot is in flight; progress to complete some")
            }
            Self::TooBig { len, capacity } => {
                write!(
                    f,
                    "command payload of {len} bytes exceeds the {capacity} bytes a message carries"
                )
            }
            Self::Send(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for CommandError {}

/// A command being written: its payload buffer, user data and completion callback.
pub struct CommandTask<'a, 'r> {
    loan: &'a mut TaskLoan<'r>,
}

impl CommandTask<'_, '_> {
    /// The payload buffer: the plugin's command goes at its start. Its length is the most a
    /// command carries (the message size minus the headers).
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.loan.payload_mut()[COMMAND_PAYLOAD_OFFSET..]
    }

    /// 32 bytes the completion callback gets back.
    pub fn user_data_mut(&mut self) -> &mut [u8; USER_DATA_LEN] {
        self.loan.user_data_mut()
    }

    /// Runs once when the task completes, with the status and the notification's payload.
    pub fn set_callback(&mut self, callback: TaskCallback) {
        self.loan.set_callback(callback);
    }
}

#[derive(Debug, Clone)]
struct Config {
    id: u64,
    gid: u32,
    plugins: u64,
    cpuset: CpuSet,
    env: Vec<String>,
    max_inflight: usize,
}

/// What an idle worker holds besides its settings.
pub struct Unstarted {
    /// The service it will run on, once set.
    service: Option<Arc<Shared>>,
}

/// What a starting or running worker holds besides its settings.
pub struct Started {
    /// Its core, which the engine polls.
    core: Rc<RefCell<Core>>,
}

/// A started worker: its phase and what it shares with the service.
struct Core {
    phase: Phase,
    id: u64,
    shared: Arc<Shared>,
    /// Its place among the service's max workers.
    _slot: WorkerSlot,
    max_inflight: usize,
}

// One per worker, held in place: the running variant's size costs nothing.
#[allow(clippy::large_enum_variant)]
enum Phase {
    /// Asked the service for the worker.
    Starting(Spawn),
    /// Reached: commands go out, notifications come back.
    Running(Link),
    /// It failed once reached; every task it had in flight has completed.
    Failed(WorkerFailure),
}

/// A spawn request to the service.
enum Spawn {
    /// Sent; the service's answer arrives here.
    Asked(mpsc::Receiver<Reply>),
    /// The service refused or went away, or the worker could not be reached.
    Failed(WorkerStartError),
}

/// A reached worker: the channel, the tasks in flight on it and the watch on its process.
struct Link {
    conn: Channel,
    tasks: TaskSlots,
    /// The daemon's word that the process ended: a second way to learn that the worker died,
    /// which does not depend on the channel noticing.
    exit: Arc<ExitWatch>,
    /// Replies to a domain start, while one waits for them.
    domain: DomainInbox,
}

impl Link {
    /// The link to worker `id` over `conn`: task slots for `max_inflight` tasks and the watch on
    /// its process.
    fn new(
        shared: &Shared,
        id: u64,
        max_inflight: usize,
        mut conn: Channel,
    ) -> Result<Self, WorkerStartError> {
        // The worker answers each command as it dispatches it, one notification at a time, and
        // this host reads them right behind it.
        conn.split().1.set_read_ahead(ReadAhead::Far);
        let max = shared.max_msg_size;
        let tasks = TaskSlots::new(max_inflight, max.get(), max_notify_payload(max))
            .map_err(|_| WorkerStartError::MaxInflight(max_inflight))?;
        let exit = shared
            .channel
            .watch_exit(id)
            .map_err(|e| WorkerStartError::Connect(format!("an event descriptor: {e}")))?;
        Ok(Self {
            conn,
            tasks,
            exit,
            domain: DomainInbox::default(),
        })
    }

    /// Completes the tasks answered so far, then checks that the worker still runs. Returns
    /// how many tasks completed, or that and why the link must be failed.
    fn poll(&mut self) -> Result<usize, (usize, WorkerFailure)> {
        let completed = receive(&mut self.conn, &mut self.tasks, &mut self.domain)?;
        // Commands queued while the channel was full go as the worker frees room.
        self.flush()
            .map_err(|e| (completed, WorkerFailure::Lost(send_failure(e))))?;
        // A worker that answers still runs: its exit is looked for when it is quiet (its
        // death also hangs up the channel, which `receive` reports at once, but the daemon's
        // word does not depend on the channel noticing).
        if completed > 0 {
            return Ok(completed);
        }
        match self.exit.exited() {
            Some(exit) => Err((completed, WorkerFailure::Exited(exit))),
            None => Ok(0),
        }
    }
}

/// Completes the task of every notification waiting on `conn` (and hands domain replies to
/// `domain`); returns how many completed, or that count and why the channel must be failed: it
/// broke, or the worker sent a frame that is not a notification for a task in flight
/// ([`WorkerProtocolError`]).
fn receive(
    conn: &mut (impl Transport + ?Sized),
    tasks: &mut TaskSlots,
    domain: &mut DomainInbox,
) -> Result<usize, (usize, WorkerFailure)> {
    let max = conn.max_msg_size();
    let mut completed = 0;
    let mut broken = None;
    // Every notification that has arrived, in one pass.
    let received = conn.split().1.recv_each(usize::MAX, |frame| {
        match complete(tasks, frame, max) {
            Ok(()) => completed += 1,
            Err(WorkerProtocolError::Malformed(DecodeError::UnexpectedKind(kind)))
                if DomainMessage::is_domain_kind(kind) =>
            {
                if let Err(e) = domain.accept(frame, max) {
                    broken = Some(WorkerFailure::Protocol(e));
                }
            }
            Err(e) => broken = Some(WorkerFailure::Protocol(e)),
        }
        broken.is_none()
    });
    match (broken, received) {
        (Some(failure), _) => Err((completed, failure)),
        (None, Err(e)) => Err((completed, WorkerFailure::Lost(e))),
        (None, Ok(_)) => Ok(completed),
    }
}

/// Completes the task `frame` answers, running its callback.
#[inline]
fn complete(
    tasks: &mut TaskSlots,
    frame: &[u8],
    max: MaxMsgSize,
) -> Result<(), WorkerProtocolError> {
    // A well-formed notification, the one kind the hot path sees, is read in a few compares;
    // any other frame the full parse reads (and says what is wrong with it).
    let parsed = match fast_notification(frame, max) {
        Some(notify) => Ok(DataMessage::Notify(notify)),
        None => FrameRepr::<DataMessage>::parse(frame, max).map(|frame| frame.body),
    };
    let notify = match parsed {
        Ok(DataMessage::Notify(notify)) => notify,
        Ok(DataMessage::Command(_)) => return Err(WorkerProtocolError::Command),
        Err(e) => return Err(WorkerProtocolError::Malformed(e)),
    };
    let handle = TaskHandle::from_u64(notify.urom_context);
    tasks
        .complete(handle, notify.status, notify.payload)
        .map_err(|e| match e {
            TaskCompleteError::NotInFlight(handle) => WorkerProtocolError::NotInFlight(handle),
            TaskCompleteError::ResponseTooLarge { len, capacity } => {
                WorkerProtocolError::ResponseTooLarge { len, capacity }
            }
        })
}

impl Link {
    /// Loans a task, lets `fill` write it, puts the headers in front (the frame's `seq` is the
    /// channel's number for it, which makes the frame its own ready mark) and sends it.
    #[inline]
    fn submit_one<F>(
        &mut self,
        plugin: u64,
        max: MaxMsgSize,
        fill: F,
    ) -> Result<TaskHandle, CommandError>
    where
        F: FnOnce(&mut CommandTask<'_, '_>) -> usize,
    {
        let Link { conn, tasks, .. } = self;
        let mut loan = tasks.loan().map_err(|_| CommandError::Exhausted)?;
        let handle = loan.handle();
        let payload_len = fill(&mut CommandTask { loan: &mut loan });
        let too_big = CommandError::TooBig {
            len: payload_len,
            capacity: max_command_payload(max),
        };
        let seq = conn.split().0.next_seq();
        let len = write_command_headers(
            loan.payload_mut(),
            seq,
            plugin,
            handle.to_u64(),
            payload_len,
            max,
        )
        .map_err(|_| too_big)?;
        loan.set_len(len).map_err(|_| too_big)?;
        loan.submit_or_queue(conn, stamp_seq)
            .map_err(CommandError::Send)
    }

    /// Sends the commands queued while the channel was full, as far as it takes them now.
    #[inline]
    fn flush(&mut self) -> Result<usize, FrameSendError> {
        if self.tasks.queued() == 0 {
            return Ok(0);
        }
        let Link { conn, tasks, .. } = self;
        conn.split().0.cork();
        let sent = tasks.flush_queued(conn, stamp_seq);
        let uncorked = conn.split().0.uncork();
        let sent = sent?;
        uncorked.map(|()| sent)
    }
}

/// A channel that failed while sending, as a receiving end reports it.
fn send_failure(e: FrameSendError) -> FrameRecvError {
    match e {
        FrameSendError::Closed => FrameRecvError::Closed,
        FrameSendError::PeerGone(gone) => FrameRecvError::PeerGone(gone),
        FrameSendError::Protocol(what) => FrameRecvError::Protocol(what),
        FrameSendError::Full | FrameSendError::TooLarge { .. } => {
            FrameRecvError::Protocol("a queued command did not fit the channel")
        }
    }
}

/// Writes a command frame's sequence number as it leaves the queue.
fn stamp_seq(frame: &mut [u8], seq: u64) {
    if frame.len() >= urom_wire::FRAME_HEADER_LEN {
        urom_wire::Frame::new_unchecked(frame).set_seq(seq);
    }
}

impl Core {
    /// The running link and the message size, or why commands cannot go.
    #[inline]
    fn running(&mut self) -> Result<(&mut Link, MaxMsgSize), CommandError> {
        let max = self.shared.max_msg_size;
        match &mut self.phase {
            Phase::Running(link) => Ok((link, max)),
            _ => Err(CommandError::NotRunning),
        }
    }

    /// Completes every task in flight with the failure's status and moves to `Failed`; the
    /// channel closes.
    fn fail(&mut self, failure: WorkerFailure) {
        if let Phase::Running(link) = &mut self.phase {
            link.tasks.fail_in_flight(failure.status());
        }
        self.phase = Phase::Failed(failure);
    }

    fn connect(&mut self, reply: &Reply) -> Result<Link, WorkerStartError> {
        reply.refusal().map_err(WorkerStartError::Control)?;
        let ControlMessage::SpawnResult(result) = reply.message() else {
            return Err(WorkerStartError::Control(ControlError::Protocol(
                "expected a spawn result".into(),
            )));
        };
        self.id = result.worker_id;
        let max = self.shared.max_msg_size;
        let config = ChannelConfig::new(max);
        let conn = if result.endpoint == EndpointKind::UcxSealed {
            self.connect_sealed(result.address, &config)?
        } else {
            // Shared-memory rings of this host's own size, whoever spawned the worker: the
            // host never has more commands in them than tasks in flight.
            let inflight = u32::try_from(self.max_inflight).unwrap_or(u32::MAX);
            let config = if result.endpoint == EndpointKind::UnixSocket {
                ChannelConfig {
                    slots: ChannelConfig::slots_for_inflight(max, inflight),
                    ..config
                }
            } else {
                config
            };
            Channel::connect(result.endpoint, result.address, &config)
                .map_err(|e| WorkerStartError::Connect(e.to_string()))?
        };
        Link::new(&self.shared, self.id, self.max_inflight, conn)
    }

    /// Connects to a worker on another machine through its front door: proves the worker's
    /// key, which the daemon sealed for this host's session, then sets up the UCX connection
    /// through the authenticated stream.
    fn connect_sealed(
        &self,
        address: &[u8],
        config: &ChannelConfig,
    ) -> Result<Channel, WorkerStartError> {
        let protocol = |what: String| WorkerStartError::Control(ControlError::Protocol(what));
        let sealed = SealedUcxAddress::parse(address).map_err(|e| protocol(e.to_string()))?;
        let key = self
            .shared
            .channel
            .open_worker_key(self.id, &sealed.sealed_key)
            .map_err(|why| protocol(why.into()))?;
        let door = self.shared.channel.resolve_listener(sealed.listener);
        let door: SocketAddr = door
            .parse()
            .map_err(|_| protocol(format!("the worker's front door {door:?} is not IP:PORT")))?;
        let failed = |e: &dyn std::fmt::Display| {
            WorkerStartError::Connect(format!("worker {} at {door}: {e}", self.id))
        };
        let mut halves =
            stream::connect_tcp(door, config.handshake_timeout).map_err(|e| failed(&e))?;
        auth::prove(
            &mut halves,
            config.max_msg_size,
            &key,
            &auth::worker_identity(self.id),
            config.handshake_timeout,
        )
        .map_err(|e| failed(&e))?;
        Channel::connect_through(&mut halves, config).map_err(|e| failed(&e))
    }
}

impl Poll for Core {
    fn poll(&mut self) -> usize {
        match &mut self.phase {
            Phase::Starting(Spawn::Asked(reply)) => {
                self.phase = match reply.try_recv() {
                    Ok(reply) => match self.connect(&reply) {
                        Ok(link) => Phase::Running(link),
                        Err(error) => Phase::Starting(Spawn::Failed(error)),
                    },
                    Err(mpsc::TryRecvError::Empty) => return 0,
                    Err(mpsc::TryRecvError::Disconnected) => Phase::Starting(Spawn::Failed(
                        WorkerStartError::Control(ControlError::Closed),
                    )),
                };
                1
            }
            Phase::Running(link) => match link.poll() {
                Ok(completed) => completed,
                Err((completed, failure)) => {
                    self.fail(failure);
                    completed + 1
                }
            },
            Phase::Starting(Spawn::Failed(_)) | Phase::Failed(_) => 0,
        }
    }

    fn arm(&mut self, watch: &mut dyn FnMut(BorrowedFd<'_>)) -> Armed {
        match &mut self.phase {
            // The daemon's answer comes through the service's reader thread.
            Phase::Starting(Spawn::Asked(_)) => Armed::Unsupported,
            Phase::Running(link) => {
                // A worker that dies hangs up the channel, which wakes the engine; and the
                // daemon says so, which wakes it too, whether or not the channel noticed.
                if link.exit.exited().is_some() {
                    return Armed::Ready;
                }
                let (_, rx) = link.conn.split();
                let armed = rx.arm().unwrap_or(Armed::Ready);
                if matches!(armed, Armed::Armed { .. }) {
                    for fd in rx.wake_fds().into_iter().flatten() {
                        watch(fd);
                    }
                    // Readable already if the word came since the look above.
                    watch(link.exit.wake_fd());
                }
                armed
            }
            // Nothing more will happen.
            Phase::Starting(Spawn::Failed(_)) | Phase::Failed(_) => Armed::Armed { fresh: false },
        }
    }

    fn disarm(&mut self) {
        if let Phase::Running(link) = &mut self.phase {
            link.conn.split().1.disarm();
            // The word itself stays for the next poll.
            link.exit.quiet();
        }
    }
}

/// A worker: a process the service runs plugins in, and the channel to it.
pub struct Worker<S: State> {
    config: Box<Config>,
    /// When idle, the service, once set; once started, the core.
    data: S::Worker,
}

impl Default for Worker<Idle> {
    fn default() -> Self {
        Self::new()
    }
}

impl Worker<Idle> {
    /// A worker with a fresh id (`WORKER_ID_ANY`), group 0, no plugin, the service's CPUs and
    /// 64 tasks in flight at most.
    pub fn new() -> Self {
        Self {
            config: Box::new(Config {
                id: WORKER_ID_ANY,
                gid: 0,
                plugins: 0,
                cpuset: CpuSet::new(),
                env: Vec::new(),
                max_inflight: 64,
            }),
            data: Unstarted { service: None },
        }
    }

    /// The service that runs it.
    pub fn set_service(mut self, service: &Service<Running>) -> Self {
        self.data.service = Some(service.shared_handle());
        self
    }

    /// Its id: an existing worker's to attach to it, or `WORKER_ID_ANY` for a fresh one.
    pub fn set_id(mut self, id: u64) -> Self {
        self.config.id = id;
        self
    }

    /// Its group.
    pub fn set_gid(mut self, gid: u32) -> Self {
        self.config.gid = gid;
        self
    }

    /// Its plugins: an OR of plugin ids.
    pub fn set_plugins(mut self, plugins: u64) -> Self {
        self.config.plugins = plugins;
        self
    }

    /// Its CPUs (a subset of the service's).
    pub fn set_cpuset(mut self, cpuset: CpuSet) -> Self {
        self.config.cpuset = cpuset;
        self
    }

    /// Environment entries `NAME=value` for a new worker.
    pub fn set_env<I: IntoIterator<Item = String>>(mut self, env: I) -> Self {
        self.config.env = env.into_iter().collect();
        self
    }

    /// The most tasks in flight at once; a power of two.
    pub fn set_max_inflight_tasks(mut self, tasks: usize) -> Self {
        self.config.max_inflight = tasks;
        self
    }

    /// Asks the service for the worker and returns at once; progress `engine` until
    /// [`Worker::try_running`] says it runs.
    pub fn start(
        self,
        engine: &mut ProgressEngine,
    ) -> Result<Worker<Starting>, (Self, WorkerStartError)> {
        let env_ok = |config: &Config| match config
            .env
            .iter()
            .find(|entry| urom_wire::control::check_env_entry(entry.as_bytes()).is_err())
        {
            Some(bad) => Err(WorkerStartError::Env(bad.clone())),
            None => config
                .env
                .iter()
                .find_map(|entry| urom_contract::worker_env::check_entry(entry).err())
                .map_or(Ok(()), |refused| Err(WorkerStartError::EnvRefused(refused))),
        };
        let (shared, slot) = match self.claim(env_ok) {
            Ok(claimed) => claimed,
            Err(error) => return Err((self, error)),
        };
        let env: Vec<&str> = self.config.env.iter().map(String::as_str).collect();
        let request = SpawnWorker {
            worker_id: self.config.id,
            plugins: self.config.plugins,
            gid: self.config.gid,
            max_inflight_tasks: self.config.max_inflight as u32,
            cpuset: self.config.cpuset,
            env: List::new(&env),
        };
        let reply = match shared.channel.request(ControlMessage::SpawnWorker(request)) {
            Ok(reply) => reply,
            Err(error) => return Err((self, WorkerStartError::Control(error))),
        };
        let core = self.core(shared, slot, Phase::Starting(Spawn::Asked(reply)));
        Ok(self.started(engine, core))
    }

    /// Runs over `channel` to a worker this process reached by other means than the service's
    /// spawn (one it serves in-process, say); the worker's id is the one set with
    /// [`Worker::set_id`]. Returns the running worker at once.
    pub fn attach(
        self,
        engine: &mut ProgressEngine,
        channel: Channel,
    ) -> Result<Worker<Running>, (Self, WorkerStartError)> {
        let link = self.claim(|_| Ok(())).and_then(|(shared, slot)| {
            let link = Link::new(&shared, self.config.id, self.config.max_inflight, channel)?;
            Ok((shared, slot, link))
        });
        let (shared, slot, link) = match link {
            Ok(claimed) => claimed,
            Err(error) => return Err((self, error)),
        };
        let core = self.core(shared, slot, Phase::Running(link));
        let Worker { config, data } = self.started(engine, core);
        Ok(Worker { config, data })
    }

    /// The service and a place among its workers, once the settings (and `check`) are fine.
    fn claim(
        &self,
        check: impl FnOnce(&Config) -> Result<(), WorkerStartError>,
    ) -> Result<(Arc<Shared>, WorkerSlot), WorkerStartError> {
        let shared = self
            .data
            .service
            .clone()
            .ok_or(WorkerStartError::NoService)?;
        if !self.config.max_inflight.is_power_of_two() {
            return Err(WorkerStartError::MaxInflight(self.config.max_inflight));
        }
        check(&self.config)?;
        let slot = shared
            .take_worker_slot()
            .ok_or_else(|| WorkerStartError::TooManyWorkers(shared.max_workers()))?;
        Ok((shared, slot))
    }

    fn core(&self, shared: Arc<Shared>, slot: WorkerSlot, phase: Phase) -> Rc<RefCell<Core>> {
        Rc::new(RefCell::new(Core {
            phase,
            id: self.config.id,
            shared,
            _slot: slot,
            max_inflight: self.config.max_inflight,
        }))
    }

    /// The started worker, its core polled by `engine`.
    fn started(self, engine: &mut ProgressEngine, core: Rc<RefCell<Core>>) -> Worker<Starting> {
        let poll: Rc<RefCell<dyn Poll>> = core.clone();
        engine.connect(&poll);
        Worker {
            config: self.config,
            data: Started { core },
        }
    }
}

/// A started worker's settings as an idle worker on the same service; the core goes (the
/// engine forgets it).
fn idle_again(config: Box<Config>, started: Started) -> Worker<Idle> {
    let service = Arc::clone(&started.core.borrow().shared);
    Worker {
        config,
        data: Unstarted {
            service: Some(service),
        },
    }
}

/// Where a starting worker is.
pub type StartProgress = super::Progress<Worker<Starting>, Worker<Idle>, WorkerStartError>;

impl Worker<Starting> {
    /// Progresses `engine` until the worker runs or fails; still starting after `timeout`, it
    /// is handed back as [`StartProgress::Starting`].
    pub fn wait_running(
        self,
        engine: &mut ProgressEngine,
        timeout: Duration,
    ) -> Result<Worker<Running>, StartProgress> {
        super::start::wait_running(self, engine, timeout, Self::try_running)
    }

    /// The running worker once the engine's progress has set it up.
    pub fn try_running(self) -> Result<Worker<Running>, StartProgress> {
        let outcome = match &self.data.core.borrow().phase {
            Phase::Starting(Spawn::Asked(_)) => None,
            Phase::Running(_) => Some(Ok(())),
            Phase::Starting(Spawn::Failed(error)) => Some(Err(error.clone())),
            Phase::Failed(failure) => Some(Err(WorkerStartError::Failed(*failure))),
        };
        match outcome {
            Some(Ok(())) => Ok(Worker {
                config: self.config,
                data: self.data,
            }),
            None => Err(StartProgress::Starting(self)),
            Some(Err(error)) => Err(StartProgress::Failed(
                idle_again(self.config, self.data),
                error,
            )),
        }
    }
}

impl Worker<Running> {
    /// What a domain keeps of the worker: its core and its plugins.
    pub(crate) fn domain_link(&self) -> DomainLink {
        DomainLink {
            core: Rc::clone(&self.data.core),
            plugins: self.config.plugins,
        }
    }

    /// Its id (the fresh one when it was started with `WORKER_ID_ANY`).
    pub fn id(&self) -> u64 {
        self.data.core.borrow().id
    }

    /// Its group.
    pub fn gid(&self) -> u32 {
        self.config.gid
    }

    /// Whether it still runs; after a failure every task it had in flight has completed with
    /// an error.
    pub fn state(&self) -> WorkerState {
        match &self.data.core.borrow().phase {
            // Not seen: a worker is handed out running once its phase is, which never goes back.
            Phase::Starting(_) => WorkerState::Starting,
            Phase::Running(_) => WorkerState::Running,
            Phase::Failed(failure) => WorkerState::Failed(*failure),
        }
    }

    /// The most a command's payload carries.
    pub fn max_command_payload(&self) -> usize {
        max_command_payload(self.data.core.borrow().shared.max_msg_size)
    }

    /// Submits a command for `plugin`: `fill` writes the payload (returning its length), the
    /// user data and the callback. Allocates nothing.
    ///
    /// Within the worker's max in-flight tasks, submission does not fail for want of room: a
    /// command the channel to the worker cannot take now (its ring is full) waits, copied into
    /// its task's slot, and is sent in submission order as the worker frees room (at the next
    /// [`ProgressEngine::progress`] or submission); it counts as in flight meanwhile. Only a
    /// command beyond that limit is refused ([`CommandError::Exhausted`]).
    pub fn submit<F>(&self, plugin: u64, fill: F) -> Result<TaskHandle, CommandError>
    where
        F: FnOnce(&mut CommandTask<'_, '_>) -> usize,
    {
        let mut core = self.data.core.borrow_mut();
        let (link, max) = core.running()?;
        link.submit_one(plugin, max, fill)
    }

    /// Submits up to `count` commands for `plugin` in one go: `fill(i, task)` writes the `i`th
    /// as for [`Worker::submit`]. A burst costs one look at the worker's state, and its
    /// commands reach the worker in order, each in as few cache lines as its size allows over
    /// shared memory, and together in as few messages as fit over UCX
    /// ([`FrameSender::cork`]). Commands the channel cannot take now wait as with
    /// [`Worker::submit`]. Stops at the first command that cannot be submitted (every task
    /// slot in flight, a payload too big): returns how many were, or that command's error when
    /// none was. Allocates nothing.
    pub fn submit_batch<F>(
        &self,
        plugin: u64,
        count: usize,
        mut fill: F,
    ) -> Result<usize, CommandError>
    where
        F: FnMut(usize, &mut CommandTask<'_, '_>) -> usize,
    {
        let mut core = self.data.core.borrow_mut();
        let (link, max) = core.running()?;
        link.conn.split().0.cork();
        let mut went = 0;
        let mut refused = None;
        while went < count {
            match link.submit_one(plugin, max, |task| fill(went, task)) {
                Ok(_) => went += 1,
                Err(error) => {
                    refused = Some(error);
                    break;
                }
            }
        }
        // The commands that went are in flight whatever this says: a channel that fails here
        // fails their tasks at the next progress, once each.
        let _ = link.conn.split().0.uncork();
        match refused {
            Some(error) if went == 0 => Err(error),
            _ => Ok(went),
        }
    }

    /// Completes its in-flight tasks with `DOCA_ERROR_SHUTDOWN`, asks the service to destroy
    /// the worker and waits for that; returns the idle context.
    pub fn stop(self) -> Result<Worker<Idle>, (Worker<Idle>, ControlError)> {
        self.begin_stop().wait()
    }

    /// [`Worker::stop`] without waiting: completes its in-flight tasks with
    /// `DOCA_ERROR_SHUTDOWN` (their callbacks run now), asks the service to destroy the worker
    /// and returns at once. [`WorkerStop::try_stopped`] says when the service has answered; no
    /// engine needs progressing meanwhile (the answer comes through the service's reader).
    pub fn begin_stop(self) -> WorkerStop {
        let (id, shared) = {
            let mut core = self.data.core.borrow_mut();
            core.fail(WorkerFailure::Stopped);
            (core.id, Arc::clone(&core.shared))
        };
        let idle = idle_again(self.config, self.data);
        let reply = shared
            .channel
            .request(ControlMessage::DestroyWorker { worker_id: id });
        WorkerStop { idle, reply }
    }
}

/// A worker whose stop was asked for ([`Worker::begin_stop`]), waiting for the service's answer.
pub struct WorkerStop {
    idle: Worker<Idle>,
    reply: Result<mpsc::Receiver<Reply>, ControlError>,
}

/// Where a stop is: still waiting, or done with the idle worker (and why the service refused,
/// if it did; the worker is idle either way).
pub enum StopProgress {
    /// The service has not answered yet.
    Stopping(WorkerStop),
    /// The service answered.
    Stopped(Result<Worker<Idle>, (Worker<Idle>, ControlError)>),
}

impl WorkerStop {
    /// The idle worker once the service has answered; never blocks.
    pub fn try_stopped(self) -> StopProgress {
        let answer = match &self.reply {
            Err(_) => None,
            Ok(reply) => match reply.try_recv() {
                Ok(reply) => Some(reply.refusal()),
                Err(mpsc::TryRecvError::Empty) => return StopProgress::Stopping(self),
                Err(mpsc::TryRecvError::Disconnected) => Some(Err(ControlError::Closed)),
            },
        };
        StopProgress::Stopped(self.finish(answer))
    }

    /// Waits for the service's answer.
    pub fn wait(self) -> Result<Worker<Idle>, (Worker<Idle>, ControlError)> {
        let answer = match &self.reply {
            Err(_) => None,
            Ok(reply) => Some(
                reply
                    .recv()
                    .map_err(|_| ControlError::Closed)
                    .and_then(|reply| reply.refusal()),
            ),
        };
        self.finish(answer)
    }

    /// The idle worker, given the answer (`None`: the request was never sent).
    fn finish(
        self,
        answer: Option<Result<(), ControlError>>,
    ) -> Result<Worker<Idle>, (Worker<Idle>, ControlError)> {
        let result = match answer {
            Some(result) => result,
            None => match self.reply {
                Err(error) => Err(error),
                Ok(_) => Ok(()),
            },
        };
        match result {
            Ok(()) => Ok(self.idle),
            // Already gone (it failed, or another host destroyed it): nothing to stop.
            Err(ControlError::Refused {
                status: Status::NotFound,
                ..
            }) => Ok(self.idle),
            Err(error) => Err((self.idle, error)),
        }
    }
}

/// A domain's hold on one of its workers: the data channel its start goes over.
#[derive(Clone)]
pub(crate) struct DomainLink {
    core: Rc<RefCell<Core>>,
    plugins: u64,
}

impl DomainLink {
    /// Whether both hold the same worker.
    pub(crate) fn same_worker(&self, other: &DomainLink) -> bool {
        Rc::ptr_eq(&self.core, &other.core)
    }

    /// The worker's plugins, by id and name.
    pub(crate) fn plugins(&self) -> Vec<(u64, String)> {
        let core = self.core.borrow();
        core.shared
            .plugins()
            .iter()
            .filter(|plugin| plugin.id & self.plugins != 0)
            .map(|plugin| (plugin.id, plugin.name.clone()))
            .collect()
    }

    /// The worker's message size.
    pub(crate) fn max_msg_size(&self) -> MaxMsgSize {
        self.core.borrow().shared.max_msg_size
    }

    /// Why the worker no longer runs, if it does not.
    pub(crate) fn failure(&self) -> Option<WorkerFailure> {
        match &self.core.borrow().phase {
            Phase::Running(_) => None,
            Phase::Failed(failure) => Some(*failure),
            // Not seen: a domain holds only workers handed out running.
            Phase::Starting(_) => Some(WorkerFailure::Stopped),
        }
    }

    /// Takes domain replies from now on (`open`), or no more (and forgets those not taken).
    pub(crate) fn set_inbox_open(&self, open: bool) {
        if let Phase::Running(link) = &mut self.core.borrow_mut().phase {
            link.domain.set_open(open);
        }
    }

    /// The next domain reply the worker sent, if any.
    pub(crate) fn take_reply(&self) -> Option<DomainReply> {
        match &mut self.core.borrow_mut().phase {
            Phase::Running(link) => link.domain.take(),
            _ => None,
        }
    }

    /// Sends a domain request; `Err(FrameSendError::Full)` when the channel is full.
    pub(crate) fn send(&self, body: DomainMessage<'_>) -> Result<(), FrameSendError> {
        let mut core = self.core.borrow_mut();
        let Core { phase, shared, .. } = &mut *core;
        let Phase::Running(link) = phase else {
            return Err(FrameSendError::Closed);
        };
        // The channel's own frame number: the frame is its own ready mark (see `next_seq`).
        let seq = link.conn.split().0.next_seq();
        let frame = FrameRepr { seq, body };
        let mut bytes = vec![0; frame.buffer_len()];
        frame
            .emit(&mut bytes, shared.max_msg_size)
            .map_err(|_| FrameSendError::TooLarge {
                len: bytes.len(),
                max: shared.max_msg_size.as_u32(),
            })?;
        link.conn.send(&bytes)
    }
}

/// A reply a worker sent to a domain start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DomainReply {
    /// A plugin's address, or why there is none.
    Address {
        request: u64,
        plugin: u64,
        status: Status,
        address: Vec<u8>,
    },
    /// The table was taken, or why not.
    Ack { request: u64, status: Status },
}

/// Where a worker's domain replies wait for the domain start that asked for them.
#[derive(Debug, Default)]
pub(crate) struct DomainInbox {
    open: bool,
    replies: VecDeque<DomainReply>,
}

impl DomainInbox {
    pub(crate) fn set_open(&mut self, open: bool) {
        self.open = open;
        if !open {
            self.replies.clear();
        }
    }

    pub(crate) fn take(&mut self) -> Option<DomainReply> {
        self.replies.pop_front()
    }

    /// Keeps a domain reply from the worker; a frame that is not one, or one no domain start
    /// waits for, breaks the data protocol.
    pub(crate) fn accept(
        &mut self,
        frame: &[u8],
        max: MaxMsgSize,
    ) -> Result<(), WorkerProtocolError> {
        let parsed = FrameRepr::<DomainMessage>::parse(frame, max)
            .map_err(WorkerProtocolError::Malformed)?;
        let kind = urom_wire::frame::Body::kind(&parsed.body).raw();
        let reply = match parsed.body {
            DomainMessage::DomainAddressReply(AddressReply {
                request,
                plugin,
                status,
                address,
            }) => DomainReply::Address {
                request,
                plugin,
                status,
                address: address.to_vec(),
            },
            DomainMessage::DomainTableAck(TableAck { request, status }) => {
                DomainReply::Ack { request, status }
            }
            DomainMessage::DomainAddressRequest(_) | DomainMessage::DomainTableChunk(_) => {
                return Err(WorkerProtocolError::UnexpectedDomainFrame(kind));
            }
        };
        if !self.open {
            return Err(WorkerProtocolError::UnexpectedDomainFrame(kind));
        }
        self.replies.push_back(reply);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CompletedTask;
    use urom_transport::loopback::LoopbackConnection;
    use urom_wire::data::{Command, Notification};
    use urom_wire::domain::AddressRequest;

    thread_local! {
        static DONE: RefCell<Vec<(u8, Status)>> = const { RefCell::new(Vec::new()) };
    }

    fn record(task: &CompletedTask<'_>) {
        DONE.with(|done| done.borrow_mut().push((task.user_data[0], task.status)));
    }

    /// A host end with tasks 0 and 1 in flight, the worker end, and the tasks' handles.
    fn two_in_flight() -> (
        LoopbackConnection,
        LoopbackConnection,
        TaskSlots,
        [TaskHandle; 2],
    ) {
        let max = MaxMsgSize::DEFAULT;
        let (mut host, mut worker) = LoopbackConnection::pair(max, 8);
        let mut tasks = TaskSlots::new(4, max.get(), max_notify_payload(max)).unwrap();
        let handles = [0u8, 1].map(|n| {
            let mut loan = tasks.loan().unwrap();
            loan.user_data_mut()[0] = n;
            loan.set_callback(record);
            loan.write(b"command").unwrap();
            let handle = loan.submit(&mut host).unwrap();
            assert!(worker.recv().unwrap().is_some());
            handle
        });
        (host, worker, tasks, handles)
    }

    fn send(conn: &mut LoopbackConnection, body: DataMessage<'_>) {
        let frame = FrameRepr { seq: 1, body };
        let mut bytes = vec![0; frame.buffer_len()];
        frame.emit(&mut bytes, MaxMsgSize::DEFAULT).unwrap();
        conn.send(&bytes).unwrap();
    }

    fn notify(handle: TaskHandle) -> DataMessage<'static> {
        DataMessage::Notify(Notification {
            plugin: 1,
            urom_context: handle.to_u64(),
            status: Status::Success,
            payload: b"answer",
        })
    }

    #[test]
    fn a_notification_completes_its_task() {
        let (mut host, mut worker, mut tasks, [first, _]) = two_in_flight();
        send(&mut worker, notify(first));
        assert_eq!(
            receive(&mut host, &mut tasks, &mut DomainInbox::default()),
            Ok(1)
        );
        assert_eq!(DONE.with(|d| d.take()), [(0, Status::Success)]);
        assert_eq!(
            receive(&mut host, &mut tasks, &mut DomainInbox::default()),
            Ok(0)
        );
        assert_eq!(tasks.in_flight(), 1);
    }

    #[test]
    fn a_frame_that_does_not_parse_fails_the_channel() {
        let (mut host, mut worker, mut tasks, [first, _]) = two_in_flight();
        send(&mut worker, notify(first));
        worker.send(&[0xa5; 40]).unwrap();
        let error = FrameRepr::<DataMessage>::parse(&[0xa5; 40], MaxMsgSize::DEFAULT).unwrap_err();
        assert_eq!(
            receive(&mut host, &mut tasks, &mut DomainInbox::default()),
            Err((
                1,
                WorkerFailure::Protocol(WorkerProtocolError::Malformed(error))
            ))
        );
    }

    #[test]
    fn a_command_from_the_worker_fails_the_channel() {
        let (mut host, mut worker, mut tasks, [first, _]) = two_in_flight();
        let command = Command {
            plugin: 1,
            urom_context: first.to_u64(),
            payload: b"",
        };
        send(&mut worker, DataMessage::Command(command));
        assert_eq!(
            receive(&mut host, &mut tasks, &mut DomainInbox::default()),
            Err((0, WorkerFailure::Protocol(WorkerProtocolError::Command)))
        );
        assert_eq!(tasks.in_flight(), 2);
    }

    #[test]
    fn a_notification_for_a_task_not_in_flight_fails_the_channel() {
        let (mut host, mut worker, mut tasks, [first, second]) = two_in_flight();
        // The same task answered twice.
        send(&mut worker, notify(first));
        send(&mut worker, notify(first));
        let failure = WorkerFailure::Protocol(WorkerProtocolError::NotInFlight(first));
        assert_eq!(
            receive(&mut host, &mut tasks, &mut DomainInbox::default()),
            Err((1, failure))
        );
        assert_eq!(
            failure.to_string(),
            "the worker broke the data protocol: a notification for a task that is not in \
             flight: task 0 (generation 0)"
        );
        // A task never submitted.
        let never = TaskHandle::from_u64(second.to_u64() + 2);
        send(&mut worker, notify(never));
        assert_eq!(
            receive(&mut host, &mut tasks, &mut DomainInbox::default()),
            Err((
                0,
                WorkerFailure::Protocol(WorkerProtocolError::NotInFlight(never))
            ))
        );
        // Failing the channel completes what is left once, with the failure's status.
        assert_eq!(tasks.fail_in_flight(failure.status()), 1);
        assert_eq!(
            DONE.with(|d| d.take()),
            [(0, Status::Success), (1, Status::NotConnected)]
        );
    }

    #[test]
    fn a_broken_channel_is_lost() {
        let (mut host, worker, mut tasks, _) = two_in_flight();
        worker.simulate_crash();
        assert!(matches!(
            receive(&mut host, &mut tasks, &mut DomainInbox::default()),
            Err((0, WorkerFailure::Lost(FrameRecvError::PeerGone(_))))
        ));
    }

    #[test]
    fn a_stray_domain_reply_breaks_the_protocol_and_an_awaited_one_is_kept() {
        let max = MaxMsgSize::DEFAULT;
        let frame = FrameRepr {
            seq: 1,
            body: DomainMessage::DomainTableAck(TableAck {
                request: 9,
                status: Status::Success,
            }),
        };
        let mut bytes = vec![0; frame.buffer_len()];
        frame.emit(&mut bytes, max).unwrap();
        let mut inbox = DomainInbox::default();
        assert_eq!(
            inbox.accept(&bytes, max),
            Err(WorkerProtocolError::UnexpectedDomainFrame(0x0213))
        );
        inbox.set_open(true);
        assert_eq!(inbox.accept(&bytes, max), Ok(()));
        assert_eq!(
            inbox.take(),
            Some(DomainReply::Ack {
                request: 9,
                status: Status::Success
            })
        );
        assert_eq!(inbox.take(), None);
        // A request from a worker is never right.
        let frame = FrameRepr {
            seq: 2,
            body: DomainMessage::DomainAddressRequest(AddressRequest {
                request: 1,
                plugin: 1,
            }),
        };
        let mut bytes = vec![0; frame.buffer_len()];
        frame.emit(&mut bytes, max).unwrap();
        assert_eq!(
            inbox.accept(&bytes, max),
            Err(WorkerProtocolError::UnexpectedDomainFrame(0x0210))
        );
    }
}
