//! What the three programs' command lines share: the DOCA numeric log levels, options from a
//! JSON file (`-j`), and logging to stderr.

use std::fmt;
use std::path::PathBuf;

use clap::ArgAction;
pub use urom_cli::{ArgsError, JsonArgs};

use crate::limits;

/// The DOCA general flags every program takes.
#[derive(clap::Args, Debug, Clone)]
pub struct CommonArgs {
    /// Print version information.
    #[arg(short = 'v', long = "version", action = ArgAction::Version)]
    pub version: Option<bool>,

    /// Log level: 10 disable, 20 critical, 30 error, 40 warning, 50 info, 60 debug, 70 trace.
    #[arg(short = 'l', long, value_name = "LEVEL", default_value_t = 50, value_parser = clap::value_parser!(u8).range(10..=70))]
    pub log_level: u8,

    /// SDK log level in the original (same scale); accepted for compatibility, urom logs
    /// through --log-level.
    #[arg(long, value_name = "LEVEL", default_value_t = 50, value_parser = clap::value_parser!(u8).range(10..=70))]
    pub sdk_log_level: u8,

    /// Read options from a JSON file: the DOCA layout {"doca_general_flags": {...},
    /// "doca_program_flags": {...}} or one flat object, keys being long option names, arrays
    /// repeating an option; the command line wins.
    #[arg(short = 'j', long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// What the server and the orchestrator must agree on, as flags.
#[derive(clap::Args, Debug, Clone)]
pub struct ChannelArgs {
    /// Channel name, the same on server and orchestrator. On one machine, a NAME: the control
    /// socket is $XDG_RUNTIME_DIR/gpu-offload-NAME.sock (or /tmp/...), or NAME itself if it
    /// has a `/`, and data moves over shared memory. On two machines, ucx://IP:PORT (builds
    /// with the `ucx` feature): the server listens for UCX connections on that address of its
    /// machine (0.0.0.0: all of them), the orchestrator connects to it; UCX_TLS and
    /// UCX_NET_DEVICES choose the network (e.g. UCX_TLS=tcp or rc).
    #[arg(short = 'c', long, value_name = "NAME|ucx://IP:PORT", default_value = crate::channel::DEFAULT_CHANNEL_NAME, value_parser = crate::channel::check_name)]
    pub comch_channel_name: String,

    /// Requests in flight per data-path thread (the server's value wins).
    #[arg(long, value_name = "NUM_MESSAGES", default_value_t = limits::DEFAULT_MAX_CONCURRENT, value_parser = clap::value_parser!(u32).range(1..=i64::from(limits::MAX_CONCURRENT)))]
    pub max_concurrent_messages: u32,

    /// Largest payload of a message, headers excluded; the same on server and orchestrator.
    #[arg(long, value_name = "LENGTH", default_value_t = urom_wire::gpu::DEFAULT_MAX_MESSAGE_LENGTH as u32, value_parser = clap::value_parser!(u32).range(0..=i64::from(limits::MAX_MESSAGE_LENGTH)))]
    pub max_message_length: u32,
}

impl ChannelArgs {
    /// Where the channel is (`-c`).
    pub fn endpoint(&self) -> Result<crate::channel::Endpoint, crate::channel::ChannelError> {
        crate::channel::Endpoint::parse(&self.comch_channel_name)
    }
}

/// Runs a program's `main`: parses its command line (with `-j`), hooks SIGINT and SIGTERM to
/// a stop flag, runs `run`, and on an error prints it after the program's `name` and exits 1.
pub fn main_with<A: JsonArgs, T, E: fmt::Display>(
    name: &str,
    run: impl FnOnce(A, &std::sync::atomic::AtomicBool) -> Result<T, E>,
) {
    let args = A::parse_with_json(std::env::args_os()).unwrap_or_else(|e| e.exit());
    let stop = crate::stop_on_signals().unwrap_or_else(|e| {
        eprintln!("{name}: cannot install signal handlers: {e}");
        std::process::exit(1)
    });
    if let Err(e) = run(args, &stop) {
        eprintln!("{name}: {e}");
        std::process::exit(1);
    }
}

/// UCX's log lines (its warnings and errors) go to stderr, with ours, not to stdout, where
/// scripts read `listening on` and `processing`.
pub const UCX_LOG_TO_STDERR: (&str, &str) = ("UCX_LOG_FILE", "stderr");

/// A UCX listener may take a port that connections of an earlier run still hold in TCP
/// TIME-WAIT, so that a server restarted after a crash gets its `-c ucx://` address back.
pub const UCX_REUSE_PORTS: (&str, &str) = ("UCX_TCP_CM_REUSEADDR", "y");

/// In a build with the `ucx` feature, runs this program again (`exec`: same process id,
/// arguments and descriptors) with each of `defaults` (`(variable, value)`) that the
/// environment does not set, so that the operator's settings win. UCX reads these variables
/// only from the environment, some when its library loads (`UCX_LOG_FILE`), others not through
/// `ucp_config_modify` (`UCX_TCP_CM_REUSEADDR` in UCX 1.13), and a program cannot change its
/// own environment safely. Returns when every variable is set already, without the feature,
/// or when the `exec` fails (said on stderr after `name`; UCX's defaults then apply).
pub fn exec_with_ucx_defaults(name: &str, defaults: &[(&str, &str)]) {
    #[cfg(feature = "ucx")]
    {
        use std::os::unix::process::CommandExt;
        let missing: Vec<_> = defaults
            .iter()
            .filter(|(variable, _)| std::env::var_os(variable).is_none())
            .collect();
        if missing.is_empty() {
            return;
        }
        let Ok(exe) = std::env::current_exe() else {
            return;
        };
        let mut args = std::env::args_os();
        let arg0 = args.next().unwrap_or_else(|| exe.clone().into_os_string());
        let error = std::process::Command::new(&exe)
            .arg0(arg0)
            .args(args)
            .envs(missing.iter().map(|&&(variable, value)| (variable, value)))
            .exec();
        eprintln!("{name}: cannot run again with UCX's settings {missing:?} ({error})");
    }
    #[cfg(not(feature = "ucx"))]
    let _ = (name, defaults);
}

/// Logs to stderr at the numeric `level`. Does nothing when a logger is already installed (a
/// program run inside a test).
pub fn init_logging(level: u8) {
    // Without a directory nothing can fail.
    let _ = urom_cli::init_logging(level, None, "", false);
}

/// A `--cpu` this process may not run on.
#[derive(Debug, Clone)]
pub struct CpuCheckError {
    /// The `--cpu`.
    pub cpu: usize,
    /// The CPUs this process may run on, as a list like `0-3,6`.
    pub allowed: String,
}

impl fmt::Display for CpuCheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "--cpu {} cannot be used: this process may run only on CPUs {}",
            self.cpu, self.allowed
        )
    }
}

impl std::error::Error for CpuCheckError {}

/// Checks that this process may run on every one of `cpus`, so that a `--cpu` that cannot
/// work is refused at start rather than when its thread is pinned. Passes when the allowed
/// set cannot be read.
pub fn check_cpus(cpus: &[usize]) -> Result<(), CpuCheckError> {
    use nix::sched::{CpuSet, sched_getaffinity};
    let Ok(allowed) = sched_getaffinity(nix::unistd::Pid::from_raw(0)) else {
        return Ok(());
    };
    let may_run = |cpu: usize| cpu < CpuSet::count() && allowed.is_set(cpu).unwrap_or(false);
    match cpus.iter().copied().find(|&cpu| !may_run(cpu)) {
        None => Ok(()),
        Some(cpu) => {
            let mut set = urom_wire::CpuSet::new();
            for allowed in (0..CpuSet::count()).filter(|&c| may_run(c)) {
                let _ = set.insert(allowed);
            }
            Err(CpuCheckError {
                cpu,
                allowed: set.to_string(),
            })
        }
    }
}
