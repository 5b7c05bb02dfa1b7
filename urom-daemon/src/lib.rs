//! The urom service daemon.
//!
//! The one process an operator starts on an offload device. It listens on a Unix socket; each
//! host that connects is checked at once (its Unix credentials must belong to the daemon's
//! user, root or the allow list, and its user must be within the bounds on connections), says
//! hello (protocol version and maximum message size must match) and authenticates within a few
//! seconds, and then lists plugins, reads the CPU set, spawns or attaches to workers, destroys
//! them and lists them by group. One event loop serves every connection, and a fixed pool of
//! threads what may block (`event_loop`): the daemon's threads do not grow with hosts,
//! connections or workers. Plugins are discovered in `UROM_PLUGIN_PATH` on each host
//! connection ([`discovery`]); workers are `urom-worker` processes watched by the daemon
//! ([`registry`]), each running with no more rights than the host that asked for it. Whatever
//! hosts, plugins and workers do, the daemon stays up; on SIGTERM it stops every worker and
//! exits 0.
//!
//! An operator reads what the daemon is doing with `urom-ctl`: a status request on the control
//! socket answers the daemon's own numbers, the plugin directories and what became of every
//! `.so` file in them, and the workers with the counters each keeps ([`status`], asked of each
//! worker over a link the daemon gave it at spawn, [`link`]); `--metrics-listen` serves the same
//! numbers to Prometheus ([`metrics`]). At startup the daemon says which pages worker rings use
//! ([`hugepages`]).
#![deny(unsafe_code)]

pub mod args;
pub mod discovery;
mod event_loop;
mod gate;
pub mod hugepages;
pub mod link;
mod local;
pub mod metrics;
pub mod registry;
pub mod remote;
mod session;
pub mod status;
mod sys;

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use tracing::{info, warn};
use urom_contract::{default_service_socket, writable_dir};
use urom_wire::{CpuSet, MaxMsgSize};

pub use args::Args;
use discovery::{Discovery, PluginEntry};
use registry::{Registry, WorkerConfig};
pub use urom_cli::{ArgsError, JsonArgs};

/// The daemon's log file name.
pub const LOG_FILE: &str = "urom_daemon_dev.log";
/// The environment variable listing plugin directories.
pub const PLUGIN_PATH_VAR: &str = "UROM_PLUGIN_PATH";

/// Why the daemon could not run.
#[derive(Debug)]
pub enum DaemonRunError {
    /// A directory could not be created or used.
    Directory {
        /// The directory.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
    /// Logging could not be set up.
    Log(urom_cli::LogInitError),
    /// `--cpuset` names CPUs this process may not use.
    Cpuset {
        /// What was asked for, as a CPU list.
        requested: String,
        /// What the process may use, as a CPU list.
        allowed: String,
    },
    /// The CPUs this process may use could not be read.
    Affinity(nix::errno::Errno),
    /// The socket could not be created.
    Listen {
        /// Its path.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
    /// The stop signals could not be hooked.
    Signals(io::Error),
    /// Hosts on other machines cannot be served as asked.
    Remote(remote::RemoteSetupError),
    /// `--hugepages require` and none are free.
    HugePages(hugepages::HugePagesMissing),
    /// The metrics address could not be bound.
    Metrics {
        /// The address.
        addr: SocketAddr,
        /// What the OS said.
        source: io::Error,
    },
}

impl fmt::Display for DaemonRunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Directory { path, source } => {
                write!(f, "cannot use {}: {source}", path.display())
            }
            Self::Log(e) => write!(f, "{e}"),
            Self::Cpuset { requested, allowed } => write!(
                f,
                "--cpuset {requested} is not among the CPUs this process may use ({allowed})"
            ),
            Self::Affinity(e) => write!(f, "cannot read the CPUs this process may use: {e}"),
            Self::Listen { path, source } => {
                write!(f, "cannot listen on {}: {source}", path.display())
            }
            Self::Signals(e) => write!(f, "cannot install the SIGTERM handler: {e}"),
            Self::Remote(e) => write!(f, "{e}"),
            Self::HugePages(e) => write!(f, "{e}"),
            Self::Metrics { addr, source } => {
                write!(f, "cannot serve metrics on {addr}: {source}")
            }
        }
    }
}

impl std::error::Error for DaemonRunError {}

/// What every host session shares.
pub(crate) struct Service {
    max_msg_size: MaxMsgSize,
    cpuset: CpuSet,
    /// Who may connect, and how many at once.
    gate: Arc<gate::Gate>,
    discovery: Discovery,
    registry: Arc<Registry>,
    /// How hosts on other machines are let in, when the daemon listens for them.
    remote: Option<RemoteHosts>,
    stopping: AtomicBool,
    /// When the daemon started.
    started_at: Instant,
    /// The control socket.
    socket: PathBuf,
    /// The metrics address, if metrics are served.
    metrics: Option<SocketAddr>,
    /// The UCX listener for hosts on other machines, once it listens.
    ucx_listen: std::sync::OnceLock<SocketAddr>,
    /// Whether worker rings go on hugepages.
    hugepages: urom_transport::shm::HugePages,
    /// The most workers at once.
    max_workers: u32,
}

/// What the daemon needs to serve hosts on other machines.
pub(crate) struct RemoteHosts {
    /// The secret they must prove they hold.
    secret: urom_transport::auth::SharedSecret,
    /// The user their workers run as.
    uid: u32,
    /// Places of the connections that have not proved the secret yet, per source address.
    unproven: Arc<gate::Quota<std::net::IpAddr>>,
}

impl Service {
    /// Whether a peer running as `uid` may use the service.
    fn allows(&self, uid: u32) -> bool {
        self.gate.allows(uid)
    }

    /// The plugins `UROM_PLUGIN_PATH` offers now.
    fn discover(&self) -> Vec<PluginEntry> {
        self.discovery.scan(plugin_path().as_deref())
    }
}

/// The plugin directories: `UROM_PLUGIN_PATH`, or, when it is not set, `lib/urom/plugins` of
/// the prefix the daemon is installed in (`<prefix>/bin/urom-daemon`, as `scripts/install.sh`
/// lays it out) when that directory exists.
fn plugin_path() -> Option<std::ffi::OsString> {
    static INSTALLED: std::sync::OnceLock<Option<std::ffi::OsString>> = std::sync::OnceLock::new();
    std::env::var_os(PLUGIN_PATH_VAR).or_else(|| {
        INSTALLED
            .get_or_init(|| {
                let exe = std::env::current_exe().ok()?;
                let dir = exe.parent()?.parent()?.join("lib/urom/plugins");
                dir.is_dir().then(|| dir.into_os_string())
            })
            .clone()
    })
}

/// Runs the daemon until SIGTERM or SIGINT.
pub fn run(args: Args) -> Result<(), DaemonRunError> {
    let socket = args.listen.clone().unwrap_or_else(default_service_socket);
    let socket_dir = socket.parent().unwrap_or(Path::new(".")).to_owned();
    create_dir(&socket_dir)?;
    let log_dir = match &args.log_dir {
        Some(dir) => dir.clone(),
        None if writable_dir(Path::new("/var/log/doca/urom")) => "/var/log/doca/urom".into(),
        None => socket_dir.clone(),
    };
    create_dir(&log_dir)?;
    urom_cli::init_logging(args.log_level, Some(&log_dir), LOG_FILE, args.log_stderr)
        .map_err(DaemonRunError::Log)?;

    let started_at = Instant::now();
    let hugepages = hugepages::HugePagesPlan::new(args.hugepages, hugepages::HugePagePool::read())
        .map_err(DaemonRunError::HugePages)?;
    let max_workers = args.max_workers(args::machine_memory());
    let allowed = current_cpuset()?;
    let cpuset = match args.cpuset {
        Some(requested) if !requested.is_subset(&allowed) => {
            return Err(DaemonRunError::Cpuset {
                requested: requested.to_string(),
                allowed: allowed.to_string(),
            });
        }
        Some(requested) => requested,
        None => allowed,
    };
    let remote = remote::remote_hosts(&args).map_err(DaemonRunError::Remote)?;
    let worker_bin = args.worker_bin.clone().unwrap_or_else(default_worker_bin);
    let own_uid = nix::unistd::geteuid().as_raw();
    let mut allowed_uids = args.allow_uids.clone();
    allowed_uids.push(own_uid);
    let open_files = raise_open_file_limit();
    let limits = gate::Limits::fit(
        args.max_connections,
        args.max_connections_per_user,
        open_files,
    );
    if limits.total < args.max_connections as usize {
        warn!(
            open_files,
            "the open-file limit holds at most {} host connections (of users other than root)",
            limits.total
        );
    }
    // Only the daemon's user (and root) can connect unless other users are allowed: modes
    // cannot name a list of users, so then every local user can, and is checked at accept.
    let others_allowed = args
        .allow_uids
        .iter()
        .any(|&uid| uid != own_uid && uid != 0);
    let metrics_listener = match args.metrics_listen {
        Some(addr) => {
            Some(metrics::bind(addr).map_err(|source| DaemonRunError::Metrics { addr, source })?)
        }
        None => None,
    };
    let metrics_addr = metrics_listener
        .as_ref()
        .and_then(|listener| listener.local_addr().ok());
    // The stop signals write a byte to a socket the event loop sleeps on.
    let (stop, stop_signal) =
        std::os::unix::net::UnixStream::pair().map_err(DaemonRunError::Signals)?;
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        let end = stop_signal.try_clone().map_err(DaemonRunError::Signals)?;
        end.set_nonblocking(true).map_err(DaemonRunError::Signals)?;
        signal_hook::low_level::pipe::register(signal, end).map_err(DaemonRunError::Signals)?;
    }
    drop(stop_signal);
    let service = Arc::new(Service {
        max_msg_size: args.max_msg_size,
        cpuset,
        gate: Arc::new(gate::Gate::new(allowed_uids, limits)),
        discovery: Discovery::new(std::env::current_exe().unwrap_or_else(|_| "urom-daemon".into())),
        registry: Arc::new(Registry::new(WorkerConfig {
            worker_bin: worker_bin.clone(),
            max_msg_size: args.max_msg_size,
            log_dir: log_dir.clone(),
            log_level: args.sdk_log_level,
            socket_dir,
            cpuset,
            max_workers,
            busy_poll: args.worker_busy_poll,
            ucx_listen: args
                .listen_ucx
                .filter(|_| remote.is_some())
                .map(|address| address.ip()),
            hugepages: args.hugepages,
        })),
        remote,
        stopping: AtomicBool::new(false),
        started_at,
        socket: socket.clone(),
        metrics: metrics_addr,
        ucx_listen: std::sync::OnceLock::new(),
        hugepages: args.hugepages,
        max_workers,
    });
    // Probe in the background from now on, so that the first hosts find the plugins known.
    service.discovery.prefetch(plugin_path().as_deref());
    info!(
        socket = %socket.display(),
        log_dir = %log_dir.display(),
        %cpuset,
        max_workers,
        max_connections = limits.total,
        max_connections_per_user = limits.per_user,
        max_msg_size = args.max_msg_size.as_u32(),
        worker = %worker_bin.display(),
        "urom daemon started"
    );
    info!("{}", hugepages.describe());
    if let Some(listener) = metrics_listener {
        match metrics_addr {
            Some(addr) => info!("serving metrics at http://{addr}/metrics"),
            None => info!("serving metrics at /metrics"),
        }
        let service = Arc::clone(&service);
        std::thread::Builder::new()
            .name("urom-metrics".into())
            .spawn(move || metrics::serve(listener, &service))
            .map_err(DaemonRunError::Signals)?;
    }

    let front_door = match args.listen_ucx {
        Some(address) => {
            let (front_door, bound) = remote::bind(address).map_err(DaemonRunError::Remote)?;
            info!(address = %bound, "listening for hosts on other machines");
            let _ = service.ucx_listen.set(bound);
            Some(front_door)
        }
        None => None,
    };
    // Last, so that a socket there means every listener is up.
    let listener = bind(&socket, if others_allowed { 0o666 } else { 0o600 })?;
    let event_loop =
        event_loop::EventLoop::new(&service, listener, front_door, stop).map_err(|source| {
            DaemonRunError::Listen {
                path: socket.clone(),
                source,
            }
        })?;
    event_loop.run();
    info!("stopping: tearing down every worker");
    service.stopping.store(true, Ordering::Relaxed);
    service.registry.shutdown();
    let _ = std::fs::remove_file(&socket);
    info!("urom daemon stopped");
    Ok(())
}

fn create_dir(path: &Path) -> Result<(), DaemonRunError> {
    std::fs::create_dir_all(path).map_err(|source| DaemonRunError::Directory {
        path: path.to_owned(),
        source,
    })
}

/// The CPUs this process may run on.
fn current_cpuset() -> Result<CpuSet, DaemonRunError> {
    let mask = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))
        .map_err(DaemonRunError::Affinity)?;
    Ok((0..nix::sched::CpuSet::count())
        .filter(|&cpu| mask.is_set(cpu).unwrap_or(false))
        .collect())
}

/// `urom-worker` beside this program, else whatever `PATH` finds.
fn default_worker_bin() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("urom-worker")))
        .filter(|path| path.exists())
        .unwrap_or_else(|| "urom-worker".into())
}

/// Raises the soft limit on open files to the hard one (at most 2^20); returns the limit in
/// force.
fn raise_open_file_limit() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 1024;
    };
    let wanted = hard.min(1 << 20);
    if soft < wanted && setrlimit(Resource::RLIMIT_NOFILE, wanted, hard).is_ok() {
        wanted
    } else {
        soft
    }
}

/// Binds the socket with permissions `mode`, replacing a stale one nobody listens on.
fn bind(socket: &Path, mode: u32) -> Result<UnixListener, DaemonRunError> {
    let error = |source| DaemonRunError::Listen {
        path: socket.to_owned(),
        source,
    };
    if socket.exists() && std::os::unix::net::UnixStream::connect(socket).is_err() {
        let _ = std::fs::remove_file(socket);
    }
    urom_cli::listen_unix(socket, Some(mode)).map_err(error)
}
