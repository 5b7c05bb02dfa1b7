//! The urom worker process.
//!
//! A worker loads plugin libraries given on its command line as `so_path:id`, pins itself to its
//! CPUs, accepts host connections on a Unix socket (each a shared-memory channel whose rings the
//! worker allocates, on hugepages when the system has them) and then loops: take each command
//! off every host channel, hand it to the plugin its id names, give every plugin time to
//! progress, and route each notification back to the host connection it answers.
//!
//! A host that starts a domain asks the worker for its plugins' addresses and sends it the
//! domain's table, which the worker answers its plugins' domain lookups from.
//!
//! A plugin that fails to load or open is logged and left out; the others run. A command for an
//! unknown plugin, a malformed frame, a command a plugin refuses and a plugin that panics each
//! get an error notification, and the worker goes on. SIGTERM or SIGINT stop the worker: every
//! plugin is closed and the process exits 0.
#![deny(unsafe_code)]

mod accept;
mod args;
mod backlog;
pub mod counters;
mod dispatch;
mod domain;
mod link;
mod remote;

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use tracing::{error, info, warn};
use urom_contract::worker_command::{PluginSpec, WorkerCommand};
use urom_plugin::abi::{LoadedPlugin, PluginLibrary};
use urom_wire::{CpuSet, MaxMsgSize};

pub use args::Args;
pub use dispatch::Worker;
pub use urom_cli::{LogInitError, init_logging};

/// The worker's log file name for this process: `urom_worker_<pid>_dev.log`.
pub fn log_file_name() -> String {
    format!("urom_worker_{}_dev.log", std::process::id())
}

/// Why the worker could not run.
#[derive(Debug)]
pub enum WorkerRunError {
    /// Logging could not be set up.
    Log(LogInitError),
    /// The worker could not be pinned to its CPUs.
    Pin {
        /// The CPUs asked for.
        cpuset: Box<CpuSet>,
        /// What the OS said.
        errno: nix::errno::Errno,
    },
    /// No plugin could be loaded; each failure was logged.
    NoPlugins,
    /// The host socket could not be created.
    Listen {
        /// Its path.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
    /// The stop signals could not be hooked.
    Signals(io::Error),
    /// Hosts on other machines cannot be accepted as asked.
    Ucx(String),
}

impl fmt::Display for WorkerRunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Log(e) => write!(f, "{e}"),
            Self::Pin { cpuset, errno } => write!(
                f,
                "cannot run on CPUs {cpuset}: {errno} (are they online and allowed for this \
                 process?)"
            ),
            Self::NoPlugins => f.write_str("no plugin could be loaded; see the log for why"),
            Self::Listen { path, source } => {
                write!(f, "cannot listen on {}: {source}", path.display())
            }
            Self::Signals(e) => write!(f, "cannot install the SIGTERM handler: {e}"),
            Self::Ucx(e) => write!(f, "--listen-ucx: {e}"),
        }
    }
}

impl std::error::Error for WorkerRunError {}

/// Runs a worker as `args` tell it (its parsed command line, [`Args`], converts into a
/// [`WorkerCommand`]) until SIGTERM or SIGINT.
pub fn run(args: WorkerCommand) -> Result<(), WorkerRunError> {
    init_logging(
        args.log_level,
        args.log_dir.as_deref(),
        &log_file_name(),
        false,
    )
    .map_err(WorkerRunError::Log)?;
    info!(
        id = args.id,
        gid = args.gid,
        pid = std::process::id(),
        "urom worker starting"
    );
    if let Some(cpuset) = &args.cpuset {
        pin(cpuset)?;
        info!(%cpuset, "pinned");
    }
    let max = args.max_msg_size;
    let plugins = load_plugins(&args.plugins, max);
    if plugins.is_empty() {
        error!("no plugin could be loaded");
        return Err(WorkerRunError::NoPlugins);
    }
    let stop = Arc::new(AtomicBool::new(false));
    // The flag first, then a byte on a socket the idle worker sleeps on: woken, it finds the
    // flag set.
    let (stop_rx, stop_tx) =
        std::os::unix::net::UnixStream::pair().map_err(WorkerRunError::Signals)?;
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, Arc::clone(&stop)).map_err(WorkerRunError::Signals)?;
        let tx = stop_tx.try_clone().map_err(WorkerRunError::Signals)?;
        signal_hook::low_level::pipe::register(signal, tx).map_err(WorkerRunError::Signals)?;
    }
    drop(stop_tx);
    info!(
        socket = %args.listen.display(),
        hugepages = urom_contract::worker_command::hugepages_name(args.hugepages),
        "accepting hosts"
    );
    let parent = args.exit_with_parent.then(nix::unistd::getppid);
    let mut worker = Worker::new(plugins, max, args.busy_poll, parent);
    worker.stop_on(stop_rx.into());
    worker.set_hugepages(args.hugepages);
    if args.daemon_link {
        serve_daemon_link(&mut worker, args.id);
    }
    if let Some(ucx) = &args.ucx {
        remote::listen(&mut worker, ucx, args.id, max)?;
    }
    // Last: the daemon takes the socket's appearance for "ready", UCX address file included.
    // With an allow list every local user may connect; `accept_hosts` checks who did.
    let mode = (!args.allow_uids.is_empty()).then_some(0o666);
    let listener =
        urom_cli::listen_unix(&args.listen, mode).map_err(|source| WorkerRunError::Listen {
            path: args.listen.clone(),
            source,
        })?;
    worker.listen(listener, args.allow_uids.clone());
    worker.run(&stop);
    drop(worker);
    let _ = std::fs::remove_file(&args.listen);
    info!("urom worker stopped");
    Ok(())
}

/// Answers the daemon's counter requests on standard input, on a thread of its own, from the
/// counts `worker` publishes; without a link the worker runs on and only its counts are lost.
fn serve_daemon_link(worker: &mut Worker, id: u64) {
    let link = match link::stdin_link() {
        Ok(link) => link,
        Err(e) => {
            warn!("--daemon-link: standard input is not a socket ({e}); counters are not reported");
            return;
        }
    };
    let published = Arc::new(counters::Published::default());
    worker.publish_to(Arc::clone(&published));
    let spawned = std::thread::Builder::new()
        .name("urom-link".into())
        .spawn(move || link::serve(link, id, &published));
    if let Err(e) = spawned {
        warn!("cannot start the daemon link's thread: {e}; counters are not reported");
    }
}

/// Restricts this process to `cpuset`; an impossible set is an error, never ignored.
fn pin(cpuset: &CpuSet) -> Result<(), WorkerRunError> {
    let mut mask = nix::sched::CpuSet::new();
    let too_big = |_| WorkerRunError::Pin {
        cpuset: Box::new(*cpuset),
        errno: nix::errno::Errno::EINVAL,
    };
    for cpu in cpuset.iter() {
        mask.set(cpu).map_err(too_big)?;
    }
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &mask).map_err(|errno| {
        WorkerRunError::Pin {
            cpuset: Box::new(*cpuset),
            errno,
        }
    })
}

/// Loads and opens every plugin; failures are logged and left out.
fn load_plugins(specs: &[PluginSpec], max: MaxMsgSize) -> Vec<LoadedPlugin> {
    let mut plugins: Vec<LoadedPlugin> = Vec::new();
    for spec in specs {
        let id = spec.id.get();
        if plugins.iter().any(|p| p.id() == id) {
            warn!(path = %spec.path.display(), id, "plugin id given twice; left out");
            continue;
        }
        let opened = PluginLibrary::load(&spec.path)
            .map_err(|e| e.to_string())
            .and_then(|library| library.open(id, max).map_err(|e| e.to_string()));
        match opened {
            Ok(plugin) => {
                info!(
                    path = %spec.path.display(),
                    id,
                    version = plugin.library().version(),
                    built_with = %plugin.library().iface_version(),
                    native = plugin.library().has_native_path(),
                    "plugin loaded"
                );
                plugins.push(plugin);
            }
            Err(reason) => error!(id, "{reason}; plugin left out"),
        }
    }
    plugins
}
