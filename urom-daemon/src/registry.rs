//! The workers: spawn, attach, destroy, watch.
//!
//! Every worker is a child process with a watcher thread that waits for it to end without
//! reaping it (`waitid` with `WNOWAIT`), then, under the registry lock, forgets it and reaps it.
//! Signals are only sent under that lock to workers still registered, so a signal never
//! reaches a process id the system has already reused. When a worker ends, every host attached
//! to it is told and its id becomes free. A new worker's host is answered once the worker
//! listens, by the one thread that awaits every starting or stopping worker (`starting`), so
//! that a worker that never starts holds no other thread; a destroyed worker's host is answered
//! by the same thread once the worker has ended.
//!
//! A worker never has more rights than the host that asked for it: a daemon running as root
//! starts another user's worker as that user (its primary group and its supplementary groups),
//! and no host may set environment variables that change how programs load or run
//! ([`urom_contract::worker_env`]). Each worker listens in a directory of its own, which only the
//! worker's user may enter (and, when the daemon cannot switch users and runs a worker for
//! another user, only search, to reach the socket); its log is opened by the daemon and
//! handed to it as its standard error.

use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant, SystemTime};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid, waitpid};
use nix::unistd::{Pid, Uid, User};
use tracing::{error, info, warn};
use urom_contract::worker_command::{PluginSpec, UcxListen, WorkerCommand};
use urom_plugin::plugin_id::PluginMask;
use urom_transport::auth::AuthBytes;
use urom_transport::shm::HugePages;
use urom_wire::control::{WORKER_ID_ANY, WorkerExit};
use urom_wire::report::WorkerState;
use urom_wire::{CpuSet, MaxMsgSize, Status};

use crate::discovery::PluginEntry;
use crate::link::WorkerLink;
use crate::sys::Credentials;

mod starting;

/// How long a worker has to stop after SIGTERM before it gets SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// How long a new worker has to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// The name of a worker's socket inside its directory.
const WORKER_SOCKET: &str = "worker.sock";
/// How often a starting worker is checked for having ended while its socket is awaited.
const DEATH_CHECK: Duration = Duration::from_millis(50);
/// How often a starting worker's socket is looked for when its directory cannot be watched.
const POLL_WITHOUT_WATCH: Duration = Duration::from_millis(2);
/// The worker's key for hosts on other machines, in its directory until it has read it.
const WORKER_UCX_KEY: &str = "ucx.key";
/// Where in its directory the worker says where it listens over UCX.
const WORKER_UCX_ADDRESS: &str = "ucx.address";

/// Identifies one host connection.
pub type HostId = u64;

/// A request refused, with the status and reason the host gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceError {
    /// The status of the error reply.
    pub status: Status,
    /// The reason, for the host's operator.
    pub reason: String,
}

impl ServiceError {
    pub(crate) fn new(status: Status, reason: impl Into<String>) -> Self {
        Self {
            status,
            reason: reason.into(),
        }
    }
}

/// Where the outcome of a request about a worker goes once known: of a spawn or attach (for a
/// new worker: once it listens, ended, or did not start in time), or of a destroy (once the
/// worker has ended). Dropped unanswered, it answers with an error, so that no host waits for
/// ever.
pub struct Reply<T>(Option<Answer<T>>);

type Answer<T> = Box<dyn FnOnce(Result<T, ServiceError>) + Send>;

/// Where the outcome of a spawn or attach goes.
pub type SpawnReply = Reply<Reachable>;

/// Where the outcome of a destroy goes.
pub type DestroyReply = Reply<()>;

impl<T> Reply<T> {
    /// A reply that hands the outcome to `answer`.
    pub fn new(answer: impl FnOnce(Result<T, ServiceError>) + Send + 'static) -> Self {
        Self(Some(Box::new(answer)))
    }

    fn send(mut self, result: Result<T, ServiceError>) {
        if let Some(answer) = self.0.take() {
            answer(result);
        }
    }
}

impl<T> Drop for Reply<T> {
    fn drop(&mut self) {
        if let Some(answer) = self.0.take() {
            answer(Err(ServiceError::new(
                Status::OperatingSystem,
                "the service stopped awaiting the worker",
            )));
        }
    }
}

/// Where a host learns that a worker it is attached to has ended.
pub trait HostEvents: Send + Sync {
    /// The worker ended.
    fn worker_exited(&self, exit: WorkerExit);
}

/// How workers are started.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The `urom-worker` program.
    pub worker_bin: PathBuf,
    /// The channels' maximum message size.
    pub max_msg_size: MaxMsgSize,
    /// Where workers write their logs.
    pub log_dir: PathBuf,
    /// The workers' log level.
    pub log_level: u8,
    /// Where workers put their sockets.
    pub socket_dir: PathBuf,
    /// The CPUs workers may use.
    pub cpuset: CpuSet,
    /// The most workers at once.
    pub max_workers: u32,
    /// Where workers also listen for hosts on other machines over UCX (port 0: any free one),
    /// when the daemon serves such hosts.
    pub ucx_listen: Option<std::net::IpAddr>,
    /// Whether workers spin when idle.
    pub busy_poll: bool,
    /// Whether workers put their rings on hugepages.
    pub hugepages: HugePages,
}

/// What a host asks for when it spawns or attaches.
#[derive(Debug, Clone)]
pub struct SpawnRequest {
    /// A worker id, or [`WORKER_ID_ANY`].
    pub worker_id: u64,
    /// The plugins, as an OR of ids (as the host sent them: bits that are no plugin id
    /// included, to be refused).
    pub plugins: PluginMask,
    /// The group.
    pub gid: u32,
    /// The CPUs; empty for all the service's.
    pub cpuset: CpuSet,
    /// `NAME=value` entries for a new worker.
    pub env: Vec<String>,
}

struct Worker {
    pid: Pid,
    gid: u32,
    owner: Owner,
    plugins: PluginMask,
    /// The directory that holds its socket, removed when it ends.
    dir: PathBuf,
    socket: PathBuf,
    hosts: HashSet<HostId>,
    state: WorkerState,
    started: SystemTime,
    cpuset: CpuSet,
    /// Where the daemon asks for its counters.
    link: Arc<WorkerLink>,
    /// How hosts on other machines reach it.
    ucx: Option<WorkerUcx>,
    /// Its process descriptor, in the reaper's epoll set (closed, and so out of the set, with
    /// the entry).
    _pidfd: Option<OwnedFd>,
}

/// How hosts on other machines reach a worker.
#[derive(Debug, Clone)]
pub struct WorkerUcx {
    /// The key they must prove to it.
    pub key: AuthBytes,
    /// Its UCX listener, `IP:PORT`.
    pub listener: String,
}

/// A worker a host may now connect to.
#[derive(Debug, Clone)]
pub struct Reachable {
    /// Its id.
    pub id: u64,
    /// Its Unix socket.
    pub socket: PathBuf,
    /// How to reach it from another machine, when it can be.
    pub ucx: Option<WorkerUcx>,
}

/// Who a host is, for deciding which workers it may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// The Unix user its workers run as: a local host's own, a remote host's the one the daemon
    /// was told to give remote hosts.
    pub uid: u32,
    /// For a host on another machine, the identity it authenticated with.
    pub remote: Option<String>,
}

impl Owner {
    /// A host on this machine running as `uid`.
    pub fn local(uid: u32) -> Self {
        Self { uid, remote: None }
    }

    /// Whether a host that is `self` may use a worker that `owner` started: its own, or any
    /// when it is local root. A remote host is never root.
    pub(crate) fn may_use(&self, owner: &Owner) -> bool {
        self == owner || (self.uid == 0 && self.remote.is_none())
    }
}

/// What the status report says of a worker.
#[derive(Clone)]
pub struct WorkerView {
    /// Its id.
    pub id: u64,
    /// Its process.
    pub pid: i32,
    /// Its group.
    pub gid: u32,
    /// The user it runs for (a remote host's workers: the remote user).
    pub owner: u32,
    /// Its plugins.
    pub plugins: PluginMask,
    /// Where it is in its life.
    pub state: WorkerState,
    /// When it was spawned.
    pub started: SystemTime,
    /// Its CPUs.
    pub cpuset: CpuSet,
    /// Host connections attached to it.
    pub hosts: usize,
    /// Where to ask for its counters.
    pub link: Arc<WorkerLink>,
}

/// A user a worker runs as, other than the daemon's.
struct WorkerUser {
    credentials: Credentials,
    name: String,
    home: PathBuf,
}

#[derive(Default)]
struct Inner {
    workers: HashMap<u64, Worker>,
    next_id: u64,
    /// Workers spawned so far: numbers each worker's socket, so that a worker started again
    /// with the same id never shares a path with its predecessor, whose cleanup at exit would
    /// remove the new socket.
    spawned: u64,
    hosts: HashMap<HostId, Arc<dyn HostEvents>>,
}

/// The service's workers.
pub struct Registry {
    config: WorkerConfig,
    /// The daemon's user.
    own_uid: u32,
    inner: Mutex<Inner>,
    /// Signalled whenever a worker is forgotten.
    exited: Condvar,
    /// The epoll set of the workers' process descriptors that one thread waits on, started
    /// with the first worker; `None` inside when it could not be (a thread per worker then).
    reaper: OnceLock<Option<Arc<Epoll>>>,
    /// Where new workers are handed to the thread that awaits their sockets, started with the
    /// first worker; `None` inside when it could not be.
    starter: OnceLock<Option<Arc<starting::Starter>>>,
}

impl Registry {
    /// An empty registry.
    pub fn new(config: WorkerConfig) -> Self {
        Self {
            config,
            own_uid: nix::unistd::geteuid().as_raw(),
            inner: Mutex::default(),
            exited: Condvar::new(),
            reaper: OnceLock::new(),
            starter: OnceLock::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Registers a host connection.
    pub fn add_host(&self, host: HostId, events: Arc<dyn HostEvents>) {
        self.lock().hosts.insert(host, events);
    }

    /// Forgets a host connection; workers only it was attached to are stopped (without
    /// waiting for them to end).
    pub fn remove_host(self: &Arc<Self>, host: HostId) {
        let orphans: Vec<u64> = {
            let mut inner = self.lock();
            inner.hosts.remove(&host);
            inner
                .workers
                .iter_mut()
                .filter_map(|(&id, worker)| {
                    (worker.hosts.remove(&host) && worker.hosts.is_empty()).then_some(id)
                })
                .collect()
        };
        for id in orphans {
            info!(worker = id, "its last host left: stopping it");
            self.stop_later(id, None);
        }
    }

    /// Spawns a worker, or attaches the host to an existing one, and answers `reply` with its id
    /// and socket: at once, unless the worker is starting; then once it listens, by the thread
    /// that awaits starting workers.
    pub fn spawn_or_attach(
        self: &Arc<Self>,
        host: HostId,
        owner: &Owner,
        request: &SpawnRequest,
        offered: &[PluginEntry],
        reply: SpawnReply,
    ) {
        let (id, socket, starting) = match self.spawn_or_attach_now(host, owner, request, offered) {
            Ok(found) => found,
            Err(error) => return reply.send(Err(error)),
        };
        if !starting {
            let result = self.ucx_of(id).map(|ucx| Reachable { id, socket, ucx });
            return reply.send(result);
        }
        match self.starter() {
            Some(starter) => starter.hand(id, socket, reply),
            None => {
                reply.send(Err(ServiceError::new(
                    Status::OperatingSystem,
                    format!("cannot await worker {id}'s start: no thread to do so"),
                )));
                self.stop(id);
            }
        }
    }

    /// The checks, and the new worker's start; the worker's id and socket, and whether it is
    /// starting.
    fn spawn_or_attach_now(
        self: &Arc<Self>,
        host: HostId,
        owner: &Owner,
        request: &SpawnRequest,
        offered: &[PluginEntry],
    ) -> Result<(u64, PathBuf, bool), ServiceError> {
        if let Some(refused) = request
            .env
            .iter()
            .find_map(|entry| urom_contract::worker_env::check_entry(entry).err())
        {
            return Err(ServiceError::new(Status::NotPermitted, refused.to_string()));
        }
        // Before the lock: the user database may be slow to answer.
        let run_as = self.worker_user(owner.uid)?;
        let mut inner = self.lock();
        match inner.workers.get_mut(&request.worker_id) {
            Some(worker) => {
                attach(request, worker, owner)?;
                worker.hosts.insert(host);
                info!(worker = request.worker_id, host, "host attached");
                let starting = worker.state == WorkerState::Starting;
                Ok((request.worker_id, worker.socket.clone(), starting))
            }
            None => {
                let (id, socket) = self.spawn(&mut inner, host, owner, run_as, request, offered)?;
                Ok((id, socket, true))
            }
        }
    }

    /// The thread that awaits starting workers, started on first use; `None` when it cannot be.
    fn starter(self: &Arc<Self>) -> Option<&Arc<starting::Starter>> {
        self.starter
            .get_or_init(|| {
                starting::Starter::start(Arc::downgrade(self))
                    .inspect_err(|e| error!("cannot start the thread that awaits workers: {e}"))
                    .ok()
            })
            .as_ref()
    }

    /// Worker `id` published its socket: it runs, and this is how hosts reach it.
    fn listening(&self, id: u64, socket: &Path) -> Result<Reachable, ServiceError> {
        let mut inner = self.lock();
        if let Some(worker) = inner.workers.get_mut(&id)
            && worker.state == WorkerState::Starting
        {
            worker.state = WorkerState::Running;
        }
        let ucx = self.ucx_of_locked(&mut inner, id)?;
        Ok(Reachable {
            id,
            socket: socket.to_owned(),
            ucx,
        })
    }

    /// Sends `signal` to worker `id`, marked stopping, without waiting; whether it was still
    /// registered.
    fn signal_worker(&self, id: u64, signal: Signal) -> bool {
        let mut inner = self.lock();
        let Some(worker) = inner.workers.get_mut(&id) else {
            return false;
        };
        worker.state = WorkerState::Stopping;
        let _ = kill(worker.pid, signal);
        true
    }

    /// How hosts on other machines reach worker `id`: read from the address file it wrote
    /// before its Unix socket, the first time it is asked for.
    fn ucx_of(&self, id: u64) -> Result<Option<WorkerUcx>, ServiceError> {
        self.ucx_of_locked(&mut self.lock(), id)
    }

    fn ucx_of_locked(&self, inner: &mut Inner, id: u64) -> Result<Option<WorkerUcx>, ServiceError> {
        let Some(worker) = inner.workers.get_mut(&id) else {
            return Err(ServiceError::new(
                Status::Initialization,
                format!("worker {id} ended while starting"),
            ));
        };
        if let Some(ucx) = &mut worker.ucx
            && ucx.listener.is_empty()
        {
            let file = worker.dir.join(WORKER_UCX_ADDRESS);
            ucx.listener = std::fs::read_to_string(&file).map_err(|e| {
                ServiceError::new(
                    Status::Initialization,
                    format!(
                        "worker {id} did not say where it listens over UCX ({}: {e})",
                        file.display()
                    ),
                )
            })?;
        }
        Ok(worker.ucx.clone())
    }

    /// The user a worker for a host of user `uid` runs as, when not the daemon's: the host's,
    /// when the daemon runs as root and the host does not.
    fn worker_user(&self, uid: u32) -> Result<Option<WorkerUser>, ServiceError> {
        if self.own_uid != 0 || uid == 0 {
            return Ok(None);
        }
        let user = match User::from_uid(Uid::from_raw(uid)) {
            Ok(Some(user)) => user,
            Ok(None) => {
                return Err(ServiceError::new(
                    Status::NotPermitted,
                    format!(
                        "user {uid} is not in the user database, so a worker cannot run as \
                         that user"
                    ),
                ));
            }
            Err(e) => {
                return Err(ServiceError::new(
                    Status::OperatingSystem,
                    format!("cannot look up user {uid}: {e}"),
                ));
            }
        };
        let groups = CString::new(user.name.clone())
            .ok()
            .and_then(|name| nix::unistd::getgrouplist(&name, user.gid).ok())
            .ok_or_else(|| {
                ServiceError::new(
                    Status::OperatingSystem,
                    format!("cannot read the groups of user {}", user.name),
                )
            })?;
        Ok(Some(WorkerUser {
            credentials: Credentials {
                uid: user.uid,
                gid: user.gid,
                groups,
            },
            name: user.name,
            home: user.dir,
        }))
    }

    fn spawn(
        self: &Arc<Self>,
        inner: &mut Inner,
        host: HostId,
        owner: &Owner,
        run_as: Option<WorkerUser>,
        request: &SpawnRequest,
        offered: &[PluginEntry],
    ) -> Result<(u64, PathBuf), ServiceError> {
        if inner.workers.len() >= self.config.max_workers as usize {
            return Err(ServiceError::new(
                Status::Full,
                format!(
                    "the service already runs its maximum of {} workers",
                    self.config.max_workers
                ),
            ));
        }
        let cpuset = if request.cpuset.is_empty() {
            self.config.cpuset
        } else if request.cpuset.is_subset(&self.config.cpuset) {
            request.cpuset
        } else {
            return Err(ServiceError::new(
                Status::InvalidValue,
                format!(
                    "CPUs {} are outside the service's CPUs {}",
                    request.cpuset, self.config.cpuset
                ),
            ));
        };
        let plugins = plugin_specs(request.plugins, offered)?;
        let id = if request.worker_id == WORKER_ID_ANY {
            let mut id = inner.next_id;
            while inner.workers.contains_key(&id) || id == WORKER_ID_ANY {
                id = id.wrapping_add(1);
            }
            inner.next_id = id.wrapping_add(1);
            id
        } else {
            request.worker_id
        };
        inner.spawned += 1;
        // The worker serves its own user and root; a host of another user only when the
        // daemon could not make the worker run as that user.
        let process_uid = run_as
            .as_ref()
            .map_or(self.own_uid, |user| user.credentials.uid.as_raw());
        let uid = owner.uid;
        let allow_uids = if uid == process_uid || uid == 0 {
            Vec::new()
        } else {
            vec![uid]
        };
        let dir = self
            .config
            .socket_dir
            .join(format!("urom-worker-{id}-{}", inner.spawned));
        let dir_owner = run_as
            .as_ref()
            .map(|user| (user.credentials.uid, user.credentials.gid));
        worker_dir(&dir, dir_owner, !allow_uids.is_empty()).map_err(|e| {
            ServiceError::new(
                Status::OperatingSystem,
                format!(
                    "cannot create the worker's directory {}: {e}",
                    dir.display()
                ),
            )
        })?;
        let socket = dir.join(WORKER_SOCKET);
        let ucx = match self.config.ucx_listen {
            Some(ip) => Some(self.worker_key(&dir, dir_owner, ip).inspect_err(|_| {
                let _ = std::fs::remove_dir_all(&dir);
            })?),
            None => None,
        };
        let (log, staged_log) = match self.worker_log(id, inner.spawned) {
            Ok(log) => log,
            Err(error) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(error);
            }
        };
        let (link, link_end) = match WorkerLink::pair() {
            Ok(pair) => pair,
            Err(e) => {
                let _ = std::fs::remove_file(&staged_log);
                let _ = std::fs::remove_dir_all(&dir);
                return Err(ServiceError::new(
                    Status::OperatingSystem,
                    format!("cannot make the worker's link: {e}"),
                ));
            }
        };
        let worker = WorkerCommand {
            plugins,
            id,
            gid: request.gid,
            cpuset: Some(cpuset),
            max_msg_size: self.config.max_msg_size,
            log_level: self.config.log_level,
            // It logs to its standard error, the file opened for it.
            log_dir: None,
            listen: socket.clone(),
            busy_poll: self.config.busy_poll,
            allow_uids,
            exit_with_parent: true,
            ucx: ucx.as_ref().map(|(_, listen)| listen.clone()),
            daemon_link: true,
            hugepages: self.config.hugepages,
        };
        let mut command = Command::new(&self.config.worker_bin);
        command
            .args(worker.to_args())
            .stdin(Stdio::from(std::os::fd::OwnedFd::from(link_end)))
            .stdout(Stdio::null())
            .stderr(log);
        crate::sys::close_inherited(&mut command);
        if let Some(user) = run_as {
            command
                .env("HOME", &user.home)
                .env("USER", &user.name)
                .env("LOGNAME", &user.name);
            crate::sys::run_as(&mut command, user.credentials);
        }
        for entry in &request.env {
            let (name, value) = entry.split_once('=').expect("checked by the wire decoder");
            command.env(name, value);
        }
        let spawned = command.spawn();
        // The child has its own copy of the log's descriptor.
        drop(command);
        let child = match spawned {
            Ok(child) => child,
            Err(e) => {
                let _ = std::fs::remove_file(&staged_log);
                let _ = std::fs::remove_dir_all(&dir);
                return Err(ServiceError::new(
                    Status::OperatingSystem,
                    format!("cannot start {}: {e}", self.config.worker_bin.display()),
                ));
            }
        };
        let pid = Pid::from_raw(child.id() as i32);
        // The watcher reaps the worker; the handle is not needed.
        drop(child);
        // One thread watches every worker through its process descriptor; where there are
        // none, a thread of its own does.
        let pidfd = self.reaper().and_then(|epoll| {
            let fd = urom_transport::sys::pidfd_open(pid).ok()?;
            let event = EpollEvent::new(EpollFlags::EPOLLIN, id);
            epoll.add(&fd, event).ok()?;
            Some(fd)
        });
        let watched = pidfd.is_some();
        self.name_worker_log(&staged_log, pid);
        inner.workers.insert(
            id,
            Worker {
                pid,
                gid: request.gid,
                owner: owner.clone(),
                plugins: request.plugins,
                dir,
                socket: socket.clone(),
                hosts: HashSet::from([host]),
                ucx: ucx.map(|(key, _)| WorkerUcx {
                    key,
                    listener: String::new(),
                }),
                state: WorkerState::Starting,
                started: SystemTime::now(),
                cpuset,
                link: Arc::new(link),
                _pidfd: pidfd,
            },
        );
        info!(worker = id, pid = pid.as_raw(), gid = request.gid, %cpuset, plugins = format_args!("{:#x}", request.plugins), "worker spawned");
        if !watched {
            let registry = Arc::clone(self);
            std::thread::Builder::new()
                .name(format!("urom-watch-{id}"))
                .spawn(move || registry.watch(id, pid))
                .map_err(|e| {
                    ServiceError::new(
                        Status::OperatingSystem,
                        format!("cannot watch the worker: {e}"),
                    )
                })?;
        }
        Ok((id, socket))
    }

    /// Creates a new worker's log file under a name of its own, to be renamed after the worker's
    /// process id once it runs; returns the file and that name.
    fn worker_log(&self, id: u64, spawned: u64) -> Result<(File, PathBuf), ServiceError> {
        let staged = self.config.log_dir.join(format!(
            ".urom_worker_{}-{id}-{spawned}.log",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&staged);
        // A new file, never one that is there already (nor a link someone left there).
        File::options()
            .append(true)
            .create_new(true)
            .mode(0o644)
            .open(&staged)
            .map(|file| (file, staged.clone()))
            .map_err(|e| {
                ServiceError::new(
                    Status::OperatingSystem,
                    format!("cannot create the worker's log {}: {e}", staged.display()),
                )
            })
    }

    /// Gives a started worker's log its name, `urom_worker_<pid>_dev.log`; when a file of that
    /// name is left from an earlier process, the log keeps the name it was created under.
    fn name_worker_log(&self, staged: &Path, pid: Pid) {
        let name = self
            .config
            .log_dir
            .join(format!("urom_worker_{pid}_dev.log"));
        match std::fs::hard_link(staged, &name) {
            Ok(()) => {
                let _ = std::fs::remove_file(staged);
            }
            Err(e) => warn!(
                "worker {pid} logs to {}: cannot name it {}: {e}",
                staged.display(),
                name.display()
            ),
        }
    }

    /// Makes a fresh key for a worker that listens over UCX and writes it where only the
    /// worker's user can read it (the worker removes it once read).
    fn worker_key(
        &self,
        dir: &std::path::Path,
        owner: Option<(Uid, nix::unistd::Gid)>,
        ip: std::net::IpAddr,
    ) -> Result<(AuthBytes, UcxListen), ServiceError> {
        let failed = |what: &str, e: &dyn std::fmt::Display| {
            ServiceError::new(Status::OperatingSystem, format!("cannot {what}: {e}"))
        };
        let key =
            urom_transport::auth::fresh_nonce().map_err(|e| failed("make a worker key", &e))?;
        let key_file = dir.join(WORKER_UCX_KEY);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&key_file)
            .map_err(|e| failed("write the worker key", &e))?;
        file.write_all(&key)
            .map_err(|e| failed("write the worker key", &e))?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::fchown(&file, Some(uid.as_raw()), Some(gid.as_raw()))
                .map_err(|e| failed("give the worker its key", &e))?;
        }
        let listen = UcxListen {
            address: std::net::SocketAddr::new(ip, 0),
            key_file,
            address_file: dir.join(WORKER_UCX_ADDRESS),
        };
        Ok((key, listen))
    }

    /// Stops a worker the host owns, gracefully then forcefully, and answers `reply` once it
    /// has ended, from the thread that awaits workers: no thread waits for it meanwhile.
    pub fn destroy(self: &Arc<Self>, host: HostId, owner: &Owner, id: u64, reply: DestroyReply) {
        let found = {
            let mut inner = self.lock();
            match inner.workers.get_mut(&id) {
                None => Err(ServiceError::new(
                    Status::NotFound,
                    format!("there is no worker {id}"),
                )),
                Some(worker) if !owner.may_use(&worker.owner) => Err(not_yours(id)),
                Some(worker) => {
                    // The host asking is answered directly, not with an exit event.
                    worker.hosts.remove(&host);
                    Ok(())
                }
            }
        };
        match found {
            Ok(()) => self.stop_later(id, Some(reply)),
            Err(error) => reply.send(Err(error)),
        }
    }

    /// Sends worker `id` SIGTERM and hands it to the thread that awaits workers, which kills
    /// it after the grace period and answers `reply` once it has ended. Without that thread,
    /// waits here.
    fn stop_later(self: &Arc<Self>, id: u64, reply: Option<DestroyReply>) {
        let Some(starter) = self.starter() else {
            self.stop(id);
            return reply.into_iter().for_each(|reply| reply.send(Ok(())));
        };
        if self.signal_worker(id, Signal::SIGTERM) {
            starter.stopping(id, reply);
        } else if let Some(reply) = reply {
            // Already gone.
            reply.send(Ok(()));
        }
    }

    /// The ids of the workers of group `gid` that `owner` may see, in order.
    pub fn by_gid(&self, owner: &Owner, gid: u32) -> Vec<u64> {
        let inner = self.lock();
        let mut ids: Vec<u64> = inner
            .workers
            .iter()
            .filter(|(_, w)| w.gid == gid && owner.may_use(&w.owner))
            .map(|(&id, _)| id)
            .collect();
        ids.sort_unstable();
        ids
    }

    /// The workers `owner` may see (local root sees all), in id order.
    pub fn views(&self, owner: &Owner) -> Vec<WorkerView> {
        let inner = self.lock();
        let mut views: Vec<WorkerView> = inner
            .workers
            .iter()
            .filter(|(_, w)| owner.may_use(&w.owner))
            .map(|(&id, w)| WorkerView {
                id,
                pid: w.pid.as_raw(),
                gid: w.gid,
                owner: w.owner.uid,
                plugins: w.plugins,
                state: w.state,
                started: w.started,
                cpuset: w.cpuset,
                hosts: w.hosts.len(),
                link: Arc::clone(&w.link),
            })
            .collect();
        views.sort_unstable_by_key(|view| view.id);
        views
    }

    /// How many workers run, and how many host connections are registered.
    pub fn counts(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.workers.len(), inner.hosts.len())
    }

    /// Stops every worker: SIGTERM, then SIGKILL after the grace period.
    pub fn shutdown(&self) {
        let ids: Vec<u64> = self.lock().workers.keys().copied().collect();
        self.signal_and_wait(&ids);
    }

    fn stop(&self, id: u64) {
        self.signal_and_wait(&[id]);
    }

    fn signal_and_wait(&self, ids: &[u64]) {
        for (signal, grace) in [(Signal::SIGTERM, STOP_GRACE), (Signal::SIGKILL, STOP_GRACE)] {
            let mut inner = self.lock();
            for id in ids {
                if let Some(worker) = inner.workers.get_mut(id) {
                    worker.state = WorkerState::Stopping;
                    if signal == Signal::SIGKILL {
                        warn!(
                            worker = id,
                            "did not stop within {STOP_GRACE:?}; killing it"
                        );
                    }
                    let _ = kill(worker.pid, signal);
                }
            }
            let deadline = Instant::now() + grace;
            while ids.iter().any(|id| inner.workers.contains_key(id)) {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                inner = self
                    .exited
                    .wait_timeout(inner, left)
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .0;
            }
            if !ids.iter().any(|id| inner.workers.contains_key(id)) {
                return;
            }
        }
        error!(?ids, "workers still running after SIGKILL");
    }

    /// Waits for worker `id` to end, then forgets it, reaps it and tells its hosts.
    fn watch(&self, id: u64, pid: Pid) {
        // Wait without reaping, so the pid stays ours until the entry is gone.
        loop {
            match waitid(Id::Pid(pid), WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT) {
                Ok(_) => break,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => {
                    error!(worker = id, "cannot wait for the worker: {e}");
                    break;
                }
            }
        }
        self.reap(id, pid);
    }

    /// The epoll set the reaper thread waits on, the thread started on first use; `None` when
    /// it cannot be made.
    fn reaper(self: &Arc<Self>) -> Option<&Arc<Epoll>> {
        self.reaper
            .get_or_init(|| {
                let epoll = Arc::new(Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).ok()?);
                let registry = Arc::downgrade(self);
                let set = Arc::clone(&epoll);
                std::thread::Builder::new()
                    .name("urom-reaper".into())
                    .spawn(move || reap_all(&set, &registry))
                    .ok()?;
                Some(epoll)
            })
            .as_ref()
    }

    /// Reaps worker `id` once its process `pid` has ended (a zombie), tells its hosts and
    /// forgets it.
    fn reap(&self, id: u64, pid: Pid) {
        // Reaped, cleaned up and forgotten in one step under the lock: nobody signals a pid that
        // could be reused, and whoever sees the entry gone (a daemon that stops) finds the
        // process and its directory gone too.
        let (hosts, (exit_code, signal)) = {
            let mut inner = self.lock();
            let status = match waitpid(pid, None) {
                Ok(WaitStatus::Exited(_, code)) => (code, 0),
                Ok(WaitStatus::Signaled(_, signal, _)) => (0, signal as i32),
                _ => (0, 0),
            };
            let worker = inner.workers.remove(&id);
            if let Some(worker) = &worker {
                let _ = std::fs::remove_dir_all(&worker.dir);
            }
            let hosts: Vec<Arc<dyn HostEvents>> = worker
                .iter()
                .flat_map(|w| w.hosts.iter())
                .filter_map(|host| inner.hosts.get(host).cloned())
                .collect();
            (hosts, status)
        };
        self.exited.notify_all();
        if let Some(Some(starter)) = self.starter.get() {
            starter.worker_ended();
        }
        if signal == 0 && exit_code == 0 {
            info!(worker = id, "worker exited");
        } else {
            warn!(worker = id, exit_code, signal, "worker ended abnormally");
        }
        let exit = WorkerExit {
            worker_id: id,
            exit_code,
            signal,
        };
        for host in hosts {
            host.worker_exited(exit);
        }
    }
}

/// Waits on `set`, the workers' process descriptors, and reaps each worker that ends, until
/// the registry is gone.
fn reap_all(set: &Epoll, registry: &Weak<Registry>) {
    let mut events = [EpollEvent::empty(); 64];
    loop {
        let n = match set.wait(&mut events, EpollTimeout::NONE) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => {
                error!("cannot wait for workers to end: {e}");
                return;
            }
        };
        let Some(registry) = registry.upgrade() else {
            return;
        };
        for event in &events[..n] {
            let id = event.data();
            let pid = registry.lock().workers.get(&id).map(|worker| worker.pid);
            // Only a process that has ended: an event that outlived its worker (whose id a new
            // one took meanwhile) reaps nothing.
            let ended = |pid| {
                let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT | WaitPidFlag::WNOHANG;
                !matches!(
                    waitid(Id::Pid(pid), flags),
                    Ok(WaitStatus::StillAlive) | Err(nix::errno::Errno::EINTR)
                )
            };
            if let Some(pid) = pid.filter(|&pid| ended(pid)) {
                registry.reap(id, pid);
            }
        }
    }
}

/// Creates a worker's own directory at `path` (replacing one a predecessor left): only its
/// owner may enter it, or, with `others_search`, others may reach the socket inside by name
/// but not list it. `owner` is the worker's user and group when not the daemon's.
fn worker_dir(
    path: &Path,
    owner: Option<(Uid, nix::unistd::Gid)>,
    others_search: bool,
) -> io::Result<()> {
    let _ = std::fs::remove_dir_all(path);
    std::fs::create_dir(path)?;
    // Set up through a descriptor of the directory just made, never through a link that could
    // have replaced it meanwhile.
    let dir = File::options()
        .read(true)
        .custom_flags((nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_NOFOLLOW).bits())
        .open(path)?;
    let mode = if others_search { 0o711 } else { 0o700 };
    dir.set_permissions(std::fs::Permissions::from_mode(mode))?;
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::fchown(&dir, Some(uid.as_raw()), Some(gid.as_raw()))?;
    }
    Ok(())
}

fn not_yours(id: u64) -> ServiceError {
    ServiceError::new(
        Status::NotPermitted,
        format!("worker {id} belongs to another user"),
    )
}

/// Checks that a host may attach to `worker` as asked.
fn attach(request: &SpawnRequest, worker: &Worker, owner: &Owner) -> Result<(), ServiceError> {
    let id = request.worker_id;
    if !owner.may_use(&worker.owner) {
        return Err(not_yours(id));
    }
    if !request.env.is_empty() {
        return Err(ServiceError::new(
            Status::AlreadyExist,
            format!("worker {id} already runs: environment entries apply only to a new worker"),
        ));
    }
    if !worker.plugins.contains(request.plugins) {
        return Err(ServiceError::new(
            Status::InvalidValue,
            format!(
                "worker {id} runs plugins {:#x}; {:#x} was asked for",
                worker.plugins, request.plugins
            ),
        ));
    }
    Ok(())
}

/// The libraries of the plugins in `mask`.
fn plugin_specs(
    mask: PluginMask,
    offered: &[PluginEntry],
) -> Result<Vec<PluginSpec>, ServiceError> {
    if mask.is_empty() {
        return Err(ServiceError::new(
            Status::InvalidValue,
            "no plugin was asked for",
        ));
    }
    let not_offered = |id: u64| {
        ServiceError::new(
            Status::NotFound,
            format!("plugin id {id:#x} is not offered by this service"),
        )
    };
    let specs = mask
        .ids()
        .map(|id| {
            offered
                .iter()
                .find(|plugin| plugin.id == id)
                .map(|plugin| PluginSpec {
                    path: plugin.path.clone(),
                    id,
                })
                .ok_or_else(|| not_offered(id.get()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    // Bits above the plugin ids are refused like ids nobody offers (after them: they are
    // higher, and the lowest bad bit is the one named).
    match mask.stray_bits() {
        0 => Ok(specs),
        stray => Err(not_offered(stray & stray.wrapping_neg())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use urom_plugin::plugin_id::PluginId;

    #[test]
    fn a_mask_names_offered_plugins_and_the_lowest_bit_nobody_offers() {
        let offered: Vec<PluginEntry> = (0..2)
            .map(|index| PluginEntry {
                id: PluginId::from_index(index).unwrap(),
                version: 1,
                name: format!("p{index}"),
                path: format!("/p/p{index}.so").into(),
            })
            .collect();
        let specs = plugin_specs(PluginMask::from_bits_retain(0b11), &offered).unwrap();
        let specs: Vec<String> = specs
            .iter()
            .map(|spec| spec.to_arg().into_string().unwrap())
            .collect();
        assert_eq!(specs, ["/p/p0.so:0x1", "/p/p1.so:0x2"]);
        for (mask, reason) in [
            (0, "no plugin was asked for"),
            (0b101, "plugin id 0x4 is not offered"),
            (1 | 1 << 63, "plugin id 0x8000000000000000 is not offered"),
            (
                1 << 62 | 1 << 63,
                "plugin id 0x4000000000000000 is not offered",
            ),
        ] {
            let error = plugin_specs(PluginMask::from_bits_retain(mask), &offered).unwrap_err();
            assert!(error.reason.contains(reason), "{mask:#x}: {}", error.reason);
        }
    }
}
