//! `urom-ctl`: what the urom daemon is doing, for an operator.
//!
//! It connects to the daemon the way hosts do (the host library's service context: `--socket`,
//! else the service file `DOCA_UROM_SERVICE_FILE` names a local service, else the default
//! socket), reads the daemon's status report and shows it:
//!
//! * `urom-ctl status`: the daemon's version, uptime, addresses, hugepages, hosts, workers and
//!   plugins in a few lines;
//! * `urom-ctl workers`: each worker the user may see (root: all) with its counters, or with
//!   `--watch` its rates per second, refreshed;
//! * `urom-ctl plugins`: each plugin directory and `.so` file, offered or why not;
//! * `urom-ctl destroy ID`: stops a worker (one's own; root: any).
//!
//! `--json` prints the same as JSON for scripts (one object per refresh with `--watch`).
//! [`model`] turns the daemon's records into what is shown, [`render`] draws the tables.
#![deny(unsafe_code)]

pub mod model;
pub mod render;

use std::fmt;
use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::{Parser, Subcommand};
use serde::Serialize;
use urom_host::{ControlError, Idle, Running, Service, ServiceStartError};
use urom_wire::{MaxMsgSize, Status};

use model::Snapshot;
use render::Rates;

/// Shows what the urom daemon is doing: its status, workers and their counters, plugins and why
/// some were left out; stops workers.
///
/// The daemon is found as hosts find it: --socket, else the local service the service file
/// (DOCA_UROM_SERVICE_FILE) names for this host, else the default socket.
#[derive(Parser, Debug, Clone)]
#[command(name = "urom-ctl", version, disable_version_flag = true)]
pub struct Args {
    /// Print the version.
    #[arg(short = 'v', long, action = clap::ArgAction::Version)]
    pub version: (),

    /// The daemon's socket [default: from the service file, else /run/urom/urom.sock when /run
    /// is writable, else $XDG_RUNTIME_DIR/urom/urom.sock, else /tmp/urom-UID/urom.sock].
    #[arg(long, global = true, value_name = "PATH")]
    pub socket: Option<PathBuf>,

    /// The service file to find the daemon in [default: $DOCA_UROM_SERVICE_FILE].
    #[arg(long, global = true, value_name = "FILE")]
    pub service_file: Option<PathBuf>,

    /// The daemon's maximum message size (its -m): the daemon refuses a different one.
    #[arg(short = 'm', long, global = true, value_name = "BYTES", default_value = urom_cli::DEFAULT_MAX_MSG_SIZE, value_parser = urom_cli::parse_max_msg_size)]
    pub max_msg_size: MaxMsgSize,

    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,

    /// Refresh every SECS seconds (default 1) until interrupted; workers show rates per second.
    #[arg(long, global = true, value_name = "SECS", num_args = 0..=1, default_missing_value = "1", value_parser = parse_interval)]
    pub watch: Option<Duration>,

    /// With --watch: stop after this many refreshes.
    #[arg(long, global = true, value_name = "N", requires = "watch")]
    pub count: Option<u64>,

    /// What to show or do.
    #[command(subcommand)]
    pub command: CtlCommand,
}

/// The subcommands.
#[derive(Subcommand, Debug, Clone, PartialEq, Eq)]
pub enum CtlCommand {
    /// The daemon: version, uptime, addresses, hugepages, hosts, workers and plugins.
    Status,
    /// The workers this user may see (root: all), with their counters.
    Workers,
    /// Every plugin directory and .so file: offered, or why not.
    Plugins,
    /// Stop worker ID (one of this user's; root: any).
    Destroy {
        /// The worker's id, as `urom-ctl workers` shows it.
        id: u64,
    },
}

fn parse_interval(text: &str) -> Result<Duration, String> {
    let seconds: f64 = text
        .parse()
        .map_err(|_| format!("`{text}` is not a number of seconds"))?;
    if !(0.1..=3600.0).contains(&seconds) {
        return Err(format!("{seconds} s is outside 0.1 to 3600 seconds"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// Why `urom-ctl` could not do what it was asked.
#[derive(Debug)]
pub enum CtlError {
    /// The daemon's socket could not be found (a bad service file, a remote service).
    Locate(ServiceStartError),
    /// No daemon listens on the socket.
    NotRunning {
        /// The socket.
        socket: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// The daemon refused this user.
    UserRefused {
        /// The daemon's reason.
        reason: String,
    },
    /// The daemon runs with another maximum message size.
    MessageSize {
        /// The daemon's reason.
        reason: String,
    },
    /// A request was refused.
    Refused {
        /// The status of the refusal.
        status: Status,
        /// The daemon's reason.
        reason: String,
    },
    /// Talking to the daemon failed otherwise.
    Control(ControlError),
    /// The output could not be written.
    Output(io::Error),
}

impl CtlError {
    /// The exit code: 3 when no daemon runs, 1 for anything else.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::NotRunning { .. } => 3,
            _ => 1,
        }
    }
}

impl fmt::Display for CtlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Locate(e) => write!(f, "cannot find the daemon: {e}"),
            Self::NotRunning { socket, why } => write!(
                f,
                "the urom daemon is not running at {}: {why}; start urom-daemon, or point \
                 urom-ctl at its socket with --socket or DOCA_UROM_SERVICE_FILE",
                socket.display()
            ),
            Self::UserRefused { reason } => write!(f, "the daemon refused this user: {reason}"),
            Self::MessageSize { reason } => write!(
                f,
                "{reason}: pass the daemon's -m value to urom-ctl with -m"
            ),
            Self::Refused { status, reason } => write!(f, "{reason} ({})", status.name()),
            Self::Control(e) => write!(f, "{e}"),
            Self::Output(e) => write!(f, "cannot write the output: {e}"),
        }
    }
}

impl std::error::Error for CtlError {}

/// Connects to the daemon as `args` say.
pub fn connect(args: &Args) -> Result<Service<Running>, CtlError> {
    let mut service = Service::<Idle>::new()
        .set_identity(format!("urom-ctl pid {}", std::process::id()))
        .set_max_msg_size(args.max_msg_size.as_u32())
        .map_err(|e| CtlError::MessageSize {
            reason: e.to_string(),
        })?;
    if let Some(file) = &args.service_file {
        service = service.set_service_file(file);
    }
    if let Some(socket) = &args.socket {
        service = service.set_socket(socket);
    }
    let socket = service.resolve_socket().map_err(CtlError::Locate)?;
    if !socket.exists() {
        return Err(CtlError::NotRunning {
            socket,
            why: "there is no socket there".into(),
        });
    }
    service.start().map_err(|(_, error)| match error {
        ServiceStartError::Control(error) => classify(error, socket),
        other => CtlError::Locate(other),
    })
}

/// Names a failed connection by its cause.
fn classify(error: ControlError, socket: PathBuf) -> CtlError {
    match error {
        ControlError::NoDaemon { .. } => CtlError::NotRunning {
            socket,
            why: "nothing listens there (a socket left by a daemon that stopped)".into(),
        },
        ControlError::Refused {
            status: Status::Authentication,
            reason,
        } => CtlError::UserRefused { reason },
        ControlError::Refused {
            status: Status::BadConfig,
            reason,
        } => CtlError::MessageSize { reason },
        ControlError::Refused { status, reason } => CtlError::Refused { status, reason },
        other => CtlError::Control(other),
    }
}

fn request_error(error: ControlError) -> CtlError {
    match error {
        ControlError::Refused { status, reason } => CtlError::Refused { status, reason },
        other => CtlError::Control(other),
    }
}

/// Reads the daemon's status report.
pub fn snapshot(service: &Service<Running>) -> Result<Snapshot, CtlError> {
    let report = service.status().map_err(request_error)?;
    Ok(Snapshot::from_report(&report))
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// What a `--json` refresh of `workers --watch` prints: the workers and their rates.
#[derive(Serialize)]
struct WatchedWorkers<'a> {
    unix_ms: u64,
    workers: &'a [model::Worker],
    rates: Vec<WorkerRates>,
}

#[derive(Serialize)]
struct WorkerRates {
    id: u64,
    #[serde(flatten)]
    rates: Rates,
}

/// What `plugins --json` prints.
#[derive(Serialize)]
struct PluginsOutput<'a> {
    plugin_dirs: &'a [model::PluginDir],
}

/// What `workers --json` prints.
#[derive(Serialize)]
struct WorkersOutput<'a> {
    workers: &'a [model::Worker],
}

/// Runs `args`, writing to `out`; stops a `--watch` when `stop` is set.
pub fn run(args: &Args, out: &mut dyn Write, stop: &AtomicBool) -> Result<(), CtlError> {
    let service = connect(args)?;
    if let CtlCommand::Destroy { id } = args.command {
        service.destroy_worker(id).map_err(request_error)?;
        if args.json {
            writeln!(out, "{}", serde_json::json!({ "destroyed": id }))
        } else {
            writeln!(out, "worker {id} stopped")
        }
        .map_err(CtlError::Output)?;
        return Ok(());
    }
    let Some(interval) = args.watch else {
        let snapshot = snapshot(&service)?;
        return show(args, &snapshot, None, out);
    };
    let mut previous: Option<(Instant, Snapshot)> = None;
    let mut shown = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let taken = Instant::now();
        let snapshot = snapshot(&service)?;
        let rates = previous.as_ref().map(|(at, before)| {
            render::rates(before, &snapshot, taken.duration_since(*at).as_secs_f64())
        });
        if !args.json && io_is_terminal() {
            write!(out, "\x1b[2J\x1b[H").map_err(CtlError::Output)?;
        }
        show(args, &snapshot, Some(rates.as_deref().unwrap_or(&[])), out)?;
        if !args.json {
            writeln!(out).map_err(CtlError::Output)?;
        }
        out.flush().map_err(CtlError::Output)?;
        shown += 1;
        if args.count.is_some_and(|count| shown >= count) {
            break;
        }
        previous = Some((taken, snapshot));
        let deadline = taken + interval;
        while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50).min(interval));
        }
    }
    Ok(())
}

fn io_is_terminal() -> bool {
    use std::io::IsTerminal;
    io::stdout().is_terminal()
}

/// Prints one snapshot as `args` ask; `rates` is given when watching (empty at the first
/// refresh).
fn show(
    args: &Args,
    snapshot: &Snapshot,
    rates: Option<&[(u64, Rates)]>,
    out: &mut dyn Write,
) -> Result<(), CtlError> {
    let text = match (&args.command, args.json) {
        (CtlCommand::Status, true) => to_json(snapshot),
        (CtlCommand::Workers, true) => match rates {
            Some(rates) => to_json(&WatchedWorkers {
                unix_ms: now_unix_ms(),
                workers: &snapshot.workers,
                rates: rates
                    .iter()
                    .map(|&(id, rates)| WorkerRates { id, rates })
                    .collect(),
            }),
            None => to_json(&WorkersOutput {
                workers: &snapshot.workers,
            }),
        },
        (CtlCommand::Plugins, true) => to_json(&PluginsOutput {
            plugin_dirs: &snapshot.plugin_dirs,
        }),
        (CtlCommand::Status, false) => render::status(snapshot),
        (CtlCommand::Workers, false) => {
            let rates = rates.map(|rates| if rates.is_empty() { None } else { Some(rates) });
            match rates {
                // The first refresh of a watch has no rates yet: show the totals.
                Some(None) | None => render::workers(snapshot, now_unix_ms(), None),
                Some(Some(rates)) => render::workers(snapshot, now_unix_ms(), Some(rates)),
            }
        }
        (CtlCommand::Plugins, false) => render::plugins(snapshot),
        (CtlCommand::Destroy { .. }, _) => String::new(),
    };
    out.write_all(text.as_bytes()).map_err(CtlError::Output)
}

fn to_json<T: Serialize>(value: &T) -> String {
    let mut text = serde_json::to_string_pretty(value).unwrap_or_else(|e| {
        serde_json::json!({ "error": format!("cannot encode the output: {e}") }).to_string()
    });
    text.push('\n');
    text
}

/// The flag that `--watch` stops on: set by SIGINT or SIGTERM.
pub fn stop_flag() -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // Without the handler, the signal ends the process as usual: nothing is lost.
        let _ = signal_hook::flag::register(signal, Arc::clone(&stop));
    }
    stop
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_before_and_after_the_subcommand() {
        let args =
            Args::try_parse_from(["urom-ctl", "--json", "workers", "--watch", "--count", "2"])
                .unwrap();
        assert!(args.json);
        assert_eq!(args.command, CtlCommand::Workers);
        assert_eq!(args.watch, Some(Duration::from_secs(1)));
        assert_eq!(args.count, Some(2));
        let args =
            Args::try_parse_from(["urom-ctl", "destroy", "7", "--socket", "/tmp/s"]).unwrap();
        assert_eq!(args.command, CtlCommand::Destroy { id: 7 });
        assert_eq!(args.socket, Some(PathBuf::from("/tmp/s")));
        let error = Args::try_parse_from(["urom-ctl", "workers", "--watch", "0"])
            .unwrap_err()
            .to_string();
        assert!(error.contains("0.1 to 3600"), "{error}");
        let error = Args::try_parse_from(["urom-ctl", "status", "--count", "2"])
            .unwrap_err()
            .to_string();
        assert!(error.contains("--watch"), "{error}");
    }

    #[test]
    fn a_missing_socket_says_the_daemon_is_not_running() {
        let args = Args::try_parse_from([
            "urom-ctl",
            "status",
            "--socket",
            "/nonexistent/urom-ctl-test.sock",
        ])
        .unwrap();
        let error = connect(&args).err().expect("no daemon there");
        assert_eq!(error.exit_code(), 3);
        let text = error.to_string();
        assert!(
            text.contains("not running at /nonexistent/urom-ctl-test.sock")
                && text.contains("no socket there"),
            "{text}"
        );
    }
}
