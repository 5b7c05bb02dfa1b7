//! The daemon's command line, optionally completed from a JSON file (`-j`): options given on
//! the command line win over the file.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use urom_contract::worker_command::{hugepages_name, parse_hugepages};
use urom_transport::shm::HugePages;
use urom_wire::{CpuSet, MaxMsgSize};

/// The DOCA UROM service: discovers plugins in `UROM_PLUGIN_PATH` (directories separated by
/// `;`; unset: `lib/urom/plugins` of the prefix it is installed in), authenticates hosts on a
/// Unix socket, and spawns, attaches and tears down `urom-worker` processes for them.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "urom-daemon",
    version,
    disable_version_flag = true,
    args_override_self = true
)]
pub struct Args {
    /// Print the version (`-v`, as the DOCA tools have it).
    #[arg(short = 'v', long, action = clap::ArgAction::Version)]
    pub version: (),

    /// Log level: 10 disable, 20 critical, 30 error, 40 warning, 50 info, 60 debug, 70 trace.
    #[arg(short = 'l', long, value_name = "LEVEL", default_value_t = 50, value_parser = clap::value_parser!(u8).range(10..=70))]
    pub log_level: u8,

    /// Log level of the workers the daemon spawns (same scale as --log-level).
    #[arg(long, value_name = "LEVEL", default_value_t = 50, value_parser = clap::value_parser!(u8).range(10..=70))]
    pub sdk_log_level: u8,

    /// Largest message on every channel, header included; hosts must use the same value.
    #[arg(short = 'm', long, value_name = "BYTES", default_value = urom_cli::DEFAULT_MAX_MSG_SIZE, value_parser = urom_cli::parse_max_msg_size)]
    pub max_msg_size: MaxMsgSize,

    /// Read options from a JSON object whose keys are the long option names, e.g.
    /// {"log-level": 60, "max-workers": 8}; options on the command line win.
    #[arg(short = 'j', long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// Unix socket hosts connect to [default: /run/urom/urom.sock when /run is writable, else
    /// $XDG_RUNTIME_DIR/urom/urom.sock, else /tmp/urom-UID/urom.sock].
    #[arg(long, value_name = "PATH")]
    pub listen: Option<PathBuf>,

    /// Directory for urom_daemon_dev.log and the workers' logs [default: /var/log/doca/urom
    /// when writable, else the listening socket's directory].
    #[arg(long, value_name = "DIR")]
    pub log_dir: Option<PathBuf>,

    /// Also log to stderr.
    #[arg(long)]
    pub log_stderr: bool,

    /// CPUs workers may run on, as a list like `2-7` [default: the CPUs this process may run
    /// on].
    #[arg(long, value_name = "LIST", value_parser = urom_cli::parse_cpuset)]
    pub cpuset: Option<CpuSet>,

    /// Most workers at once [default: one per 16 MiB of the machine's memory, from 64 to
    /// 4096].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=MAX_WORKERS as i64))]
    pub max_workers: Option<u32>,

    /// Workers never sleep when idle: they spin, yielding only a core they share with another
    /// process (lowest latency; best with a core each).
    #[arg(long)]
    pub worker_busy_poll: bool,

    /// The worker program [default: urom-worker beside this program, else on PATH].
    #[arg(long, value_name = "PATH")]
    pub worker_bin: Option<PathBuf>,

    /// Also accept hosts running as this user id (repeatable); by default only the daemon's
    /// own user and root may connect.
    #[arg(long = "allow-uid", value_name = "UID")]
    pub allow_uids: Vec<u32>,

    /// Most host connections at once from users other than root (fewer when the open-file
    /// limit cannot hold them); one more is answered with an error and closed.
    #[arg(long, value_name = "N", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections: u32,

    /// Most host connections at once from one user other than root.
    #[arg(long, value_name = "N", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections_per_user: u32,

    /// Also serve hosts on other machines at a front door on this TCP address, `IP:PORT` (e.g.
    /// `0.0.0.0:13340`; port 0 picks a free one, logged at startup); their workers reach them
    /// over UCX. Needs a build with the `ucx` feature, `--key-file`, and, when the daemon runs
    /// as root, `--remote-user`.
    #[arg(long, value_name = "IP:PORT")]
    pub listen_ucx: Option<std::net::SocketAddr>,

    /// The secret hosts on other machines must prove they hold: a file only the daemon's user
    /// may read (mode 600), of at least 16 bytes.
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,

    /// The user (name or id) that workers of hosts on other machines run as; never root.
    /// [default: the daemon's own user, when it is not root]
    #[arg(long, value_name = "USER")]
    pub remote_user: Option<String>,
    /// Whether worker rings go on hugepages: auto (when the system has some reserved and free),
    /// never, or require (the daemon refuses to start without free hugepages).
    #[arg(long, value_name = "CHOICE", default_value = hugepages_name(HugePages::Auto), value_parser = parse_hugepages)]
    pub hugepages: HugePages,

    /// Serve the daemon's and workers' counters for Prometheus at http://ADDR/metrics (e.g.
    /// 127.0.0.1:9464); off unless given.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
}

impl urom_cli::JsonArgs for Args {}

/// The most `--max-workers` allows.
pub const MAX_WORKERS: u32 = 4096;
/// Memory the default `--max-workers` counts per worker: its own pages (about a third of a
/// MiB), its share of the rings of a few host channels at the default sizes, and headroom.
const MEMORY_PER_WORKER: u64 = 16 << 20;
/// The fewest workers the default allows, however small the machine.
const MIN_DEFAULT_WORKERS: u32 = 64;

impl Args {
    /// `--max-workers`, or its default for a machine of `memory` bytes.
    pub fn max_workers(&self, memory: u64) -> u32 {
        self.max_workers.unwrap_or_else(|| {
            let fits = u32::try_from(memory / MEMORY_PER_WORKER).unwrap_or(MAX_WORKERS);
            fits.clamp(MIN_DEFAULT_WORKERS, MAX_WORKERS)
        })
    }
}

/// The machine's memory in bytes (0 when the system does not say).
pub fn machine_memory() -> u64 {
    use nix::unistd::{SysconfVar, sysconf};
    let value = |var| {
        sysconf(var)
            .ok()
            .flatten()
            .and_then(|v| u64::try_from(v).ok())
    };
    match (value(SysconfVar::_PHYS_PAGES), value(SysconfVar::PAGE_SIZE)) {
        (Some(pages), Some(page)) => pages.saturating_mul(page),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use urom_cli::JsonArgs;

    #[test]
    fn the_command_line_wins_over_the_json_file() {
        let dir = std::env::temp_dir().join(format!("urom-daemon-args-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("options.json");
        std::fs::write(
            &file,
            r#"{"log-level": 60, "max-workers": 8, "allow-uid": [1000, 1001], "log-stderr": true,
                "metrics-listen": "127.0.0.1:9464", "hugepages": "never"}"#,
        )
        .unwrap();
        let args = Args::parse_with_json([
            "urom-daemon",
            "-j",
            file.to_str().unwrap(),
            "--log-level",
            "30",
        ])
        .unwrap();
        assert_eq!(args.log_level, 30);
        assert_eq!(args.max_workers(1 << 40), 8);
        assert_eq!(args.allow_uids, vec![1000, 1001]);
        assert!(args.log_stderr);
        assert_eq!(args.metrics_listen, Some("127.0.0.1:9464".parse().unwrap()));
        assert_eq!(args.hugepages, HugePages::Never);

        std::fs::write(&file, r#"{"max-workers": 0}"#).unwrap();
        let error = Args::parse_with_json(["urom-daemon", "-j", file.to_str().unwrap()])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("--max-workers") && error.contains("1..=4096"),
            "{error}"
        );

        let default = Args::parse_with_json(["urom-daemon"]).unwrap();
        assert_eq!(default.max_workers(0), 64, "the fewest on a small machine");
        assert_eq!(default.max_workers(24 << 30), 1536, "one per 16 MiB");
        assert_eq!(
            default.max_workers(1 << 40),
            MAX_WORKERS,
            "at most the limit"
        );
        assert!(
            machine_memory() > 0,
            "this machine says how much memory it has"
        );

        std::fs::write(&file, "[1, 2]").unwrap();
        let error = Args::parse_with_json(["urom-daemon", "-j", file.to_str().unwrap()])
            .unwrap_err()
            .to_string();
        assert!(error.contains("expected a JSON object"), "{error}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_values_name_the_flag_and_range() {
        let error = Args::parse_with_json(["urom-daemon", "-l", "5"])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("--log-level") && error.contains("10..=70"),
            "{error}"
        );
        let error = Args::parse_with_json(["urom-daemon", "-m", "100"])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("--max-msg-size") && error.contains("between 184"),
            "{error}"
        );
    }
}
