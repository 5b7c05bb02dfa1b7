//! The worker's command line: the parser side of [`urom_contract::worker_command`], which names
//! the options and writes them for the daemon.

use std::path::PathBuf;

use clap::Parser;
use urom_contract::worker_command::{
    DEFAULT_LOG_LEVEL, PluginSpec, UcxListen, WorkerCommand, flag, hugepages_name, parse_hugepages,
};
use urom_transport::shm::HugePages;
use urom_wire::{CpuSet, MaxMsgSize};

/// Runs urom plugins on behalf of hosts: loads each plugin, pins itself to its CPUs, accepts
/// host connections on a Unix socket and answers their commands.
#[derive(Parser, Debug, Clone)]
#[command(name = "urom-worker", version, disable_version_flag = true)]
pub struct Args {
    /// Print the version (`-v`, as the DOCA tools have it).
    #[arg(short = 'v', long, action = clap::ArgAction::Version)]
    pub version: (),

    /// A plugin to load, as `so_path:id` where id is a single bit (1, 2, 4, ... or 0x..);
    /// repeat for more plugins.
    #[arg(short = 'p', long = flag::PLUGIN, value_name = "SO_PATH:ID", required = true, value_parser = clap::value_parser!(PluginSpec))]
    pub plugins: Vec<PluginSpec>,

    /// This worker's id.
    #[arg(long = flag::ID, default_value_t = 0)]
    pub id: u64,

    /// The group this worker belongs to.
    #[arg(long = flag::GID, default_value_t = 0)]
    pub gid: u32,

    /// CPUs to run on, as a list like `2-3,6` [default: the CPUs this process may run on].
    #[arg(long = flag::CPUSET, value_name = "LIST", value_parser = urom_cli::parse_cpuset)]
    pub cpuset: Option<CpuSet>,

    /// Largest message, header included; hosts must use the same value.
    #[arg(short = 'm', long = flag::MAX_MSG_SIZE, value_name = "BYTES", default_value = urom_cli::DEFAULT_MAX_MSG_SIZE, value_parser = urom_cli::parse_max_msg_size)]
    pub max_msg_size: MaxMsgSize,

    /// Log level: 10 disable, 20 critical, 30 error, 40 warning, 50 info, 60 debug, 70 trace.
    #[arg(short = 'l', long = flag::LOG_LEVEL, value_name = "LEVEL", default_value_t = DEFAULT_LOG_LEVEL, value_parser = clap::value_parser!(u8).range(10..=70))]
    pub log_level: u8,

    /// Directory for the log file `urom_worker_<pid>_dev.log` [default: log to stderr].
    #[arg(long = flag::LOG_DIR, value_name = "DIR")]
    pub log_dir: Option<PathBuf>,

    /// Unix socket path on which hosts connect.
    #[arg(long = flag::LISTEN, value_name = "PATH")]
    pub listen: PathBuf,

    /// Never sleep when idle: spin on the channels, yielding only a core shared with another
    /// process (lowest latency; best on a dedicated core).
    #[arg(long = flag::BUSY_POLL)]
    pub busy_poll: bool,

    /// Also serve hosts run by this user (repeatable); makes the socket connectable by every
    /// local user, each host's user being checked when it connects. The worker's own user and
    /// root are always served.
    #[arg(long = flag::ALLOW_UID, value_name = "UID")]
    pub allow_uids: Vec<u32>,

    /// Stop when the process that started this worker ends (the daemon passes it, so that no
    /// worker outlives its daemon).
    #[arg(long = flag::EXIT_WITH_PARENT)]
    pub exit_with_parent: bool,

    /// Standard input is a socket on which the daemon asks for this worker's counters (the
    /// daemon passes it).
    #[arg(long = flag::DAEMON_LINK)]
    pub daemon_link: bool,

    /// Whether the rings of host channels go on hugepages: auto (when the system has some
    /// free and the rings fill at least one), never, or require (a host whose rings cannot
    /// get them is refused).
    #[arg(long = flag::HUGEPAGES, value_name = "CHOICE", default_value = hugepages_name(HugePages::Auto), value_parser = parse_hugepages)]
    pub hugepages: HugePages,

    /// Also accept hosts on other machines at a front door on TCP `IP:PORT` (port 0: any free
    /// one); each must prove the key in --ucx-key-file before the two connect over UCX. Needs a
    /// build with the `ucx` feature.
    #[arg(long = flag::LISTEN_UCX, value_name = "IP:PORT", requires_all = ["ucx_key_file", "ucx_address_file"])]
    pub listen_ucx: Option<std::net::SocketAddr>,

    /// The file holding the 32-byte key hosts over UCX must prove; read, then removed.
    #[arg(long = flag::UCX_KEY_FILE, value_name = "FILE", requires = "listen_ucx")]
    pub ucx_key_file: Option<PathBuf>,

    /// Where to write the front door's address, as `IP:PORT`.
    #[arg(long = flag::UCX_ADDRESS_FILE, value_name = "FILE", requires = "listen_ucx")]
    pub ucx_address_file: Option<PathBuf>,
}

impl From<Args> for WorkerCommand {
    fn from(args: Args) -> Self {
        let Args {
            version: (),
            plugins,
            id,
            gid,
            cpuset,
            max_msg_size,
            log_level,
            log_dir,
            listen,
            busy_poll,
            allow_uids,
            exit_with_parent,
            listen_ucx,
            ucx_key_file,
            ucx_address_file,
            daemon_link,
            hugepages,
        } = args;
        let ucx = match (listen_ucx, ucx_key_file, ucx_address_file) {
            (Some(address), Some(key_file), Some(address_file)) => Some(UcxListen {
                address,
                key_file,
                address_file,
            }),
            // The parser requires all three or none.
            _ => None,
        };
        Self {
            plugins,
            id,
            gid,
            cpuset,
            max_msg_size,
            log_level,
            log_dir,
            listen,
            busy_poll,
            allow_uids,
            exit_with_parent,
            ucx,
            daemon_link,
            hugepages,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    fn parse(args: Vec<OsString>) -> Result<WorkerCommand, clap::Error> {
        let argv = std::iter::once(OsString::from("urom-worker")).chain(args);
        Args::try_parse_from(argv).map(WorkerCommand::from)
    }

    #[test]
    fn a_command_line_written_for_a_worker_parses_back_to_the_same_command() {
        let plugin = |text: &str| text.parse::<PluginSpec>().unwrap();
        let mut command = WorkerCommand::new(
            vec![
                plugin("/p/a.so:1"),
                plugin("/p/b.so:0x4"),
                plugin("c:/d.so:0x2000000000000000"),
            ],
            "/tmp/w.sock".into(),
        );
        assert_eq!(parse(command.to_args()).unwrap(), command);
        command.id = 7;
        command.gid = 1;
        command.cpuset = Some("0-1,5".parse().unwrap());
        command.max_msg_size = MaxMsgSize::new(8192).unwrap();
        command.log_level = 60;
        command.log_dir = Some("/tmp/logs".into());
        command.busy_poll = true;
        command.allow_uids = vec![1000, 1001];
        command.exit_with_parent = true;
        command.daemon_link = true;
        command.hugepages = HugePages::Require;
        assert_eq!(parse(command.to_args()).unwrap(), command);
        command.ucx = Some(UcxListen {
            address: "[::1]:18515".parse().unwrap(),
            key_file: "/tmp/w.key".into(),
            address_file: "/tmp/w.addr".into(),
        });
        assert_eq!(parse(command.to_args()).unwrap(), command);
    }

    #[test]
    fn the_workers_defaults_are_the_commands_defaults() {
        let minimal = ["--plugin", "/p/a.so:1", "--listen", "/tmp/w.sock"];
        let parsed = parse(minimal.iter().map(OsString::from).collect()).unwrap();
        let plugins = vec!["/p/a.so:1".parse().unwrap()];
        assert_eq!(parsed, WorkerCommand::new(plugins, "/tmp/w.sock".into()));
    }

    #[test]
    fn flags_parse_and_bad_values_name_the_range() {
        let args = Args::try_parse_from([
            "urom-worker",
            "--plugin",
            "g.so:1",
            "--listen",
            "/tmp/s",
            "--cpuset",
            "0-1",
            "-m",
            "8192",
        ])
        .unwrap();
        assert_eq!(args.max_msg_size.get(), 8192);
        assert_eq!(args.cpuset.unwrap().len(), 2);
        let error =
            Args::try_parse_from(["urom-worker", "-p", "g.so:1", "--listen", "s", "-m", "10"])
                .unwrap_err()
                .to_string();
        assert!(error.contains("between 184 and"), "{error}");
        let error =
            Args::try_parse_from(["urom-worker", "-p", "g.so:1", "--listen", "s", "-l", "80"])
                .unwrap_err()
                .to_string();
        assert!(error.contains("10..=70"), "{error}");
        for (spec, reason) in [
            ("x.so:3", "single bit"),
            ("x.so", "so_path:id"),
            ("x.so:abc", "not a number"),
        ] {
            let error = Args::try_parse_from(["urom-worker", "-p", spec, "--listen", "s"])
                .unwrap_err()
                .to_string();
            assert!(
                error.contains("--plugin") && error.contains(reason),
                "{error}"
            );
        }
    }
}
