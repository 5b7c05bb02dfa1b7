//! The worker's command line: the contract between the daemon, which starts `urom-worker`
//! processes, and the worker, which parses what it was started with.
//!
//! [`WorkerCommand`] is what a worker is told; [`WorkerCommand::to_args`] writes it as
//! arguments, named by the constants of [`flag`], which the worker's parser takes under the
//! same names (`urom-worker` tests that a written command line parses back to the same
//! [`WorkerCommand`]). Plugins are given as `so_path:id` ([`PluginSpec`]).

use core::fmt;
use core::str::FromStr;
use std::ffi::OsString;
use std::path::PathBuf;

use urom_wire::{CpuSet, MaxMsgSize};

use urom_plugin::plugin_id::{PluginId, PluginIdError};
use urom_transport::shm::HugePages;

/// The long names of the worker's options, without the leading `--`.
pub mod flag {
    /// A plugin to load, as `so_path:id`; repeated for more plugins.
    pub const PLUGIN: &str = "plugin";
    /// The worker's id.
    pub const ID: &str = "id";
    /// The worker's group.
    pub const GID: &str = "gid";
    /// The CPUs to run on, as a CPU list.
    pub const CPUSET: &str = "cpuset";
    /// The largest message, header included.
    pub const MAX_MSG_SIZE: &str = "max-msg-size";
    /// The numeric log level.
    pub const LOG_LEVEL: &str = "log-level";
    /// The directory of the log file.
    pub const LOG_DIR: &str = "log-dir";
    /// The Unix socket on which hosts connect.
    pub const LISTEN: &str = "listen";
    /// Spin instead of sleeping when idle.
    pub const BUSY_POLL: &str = "busy-poll";
    /// Another user whose hosts the worker serves; repeated for more.
    pub const ALLOW_UID: &str = "allow-uid";
    /// Stop when the process that started the worker ends.
    pub const EXIT_WITH_PARENT: &str = "exit-with-parent";
    /// Also accept hosts over UCX, at this `IP:PORT`.
    pub const LISTEN_UCX: &str = "listen-ucx";
    /// The file holding the key hosts over UCX must prove; read and removed at start.
    pub const UCX_KEY_FILE: &str = "ucx-key-file";
    /// The file the worker writes the UCX address it listens on to, as `IP:PORT`.
    pub const UCX_ADDRESS_FILE: &str = "ucx-address-file";
    /// Standard input is the daemon's link, on which it asks for the worker's counters.
    pub const DAEMON_LINK: &str = "daemon-link";
    /// Whether rings go on hugepages: `auto`, `never` or `require`.
    pub const HUGEPAGES: &str = "hugepages";
}

/// The name of a hugepages choice on the command line (`auto`, `never`, `require`).
pub fn hugepages_name(choice: HugePages) -> &'static str {
    match choice {
        HugePages::Auto => "auto",
        HugePages::Never => "never",
        HugePages::Require => "require",
    }
}

/// Reads a hugepages choice as [`hugepages_name`] writes it.
pub fn parse_hugepages(text: &str) -> Result<HugePages, String> {
    [HugePages::Auto, HugePages::Never, HugePages::Require]
        .into_iter()
        .find(|&choice| hugepages_name(choice) == text)
        .ok_or_else(|| format!("`{text}` is not one of auto, never, require"))
}

/// The log level a worker logs at unless told otherwise: 50, info.
pub const DEFAULT_LOG_LEVEL: u8 = 50;

/// A plugin to load, given on the command line as `so_path:id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginSpec {
    /// The plugin library.
    pub path: PathBuf,
    /// Its id.
    pub id: PluginId,
}

impl PluginSpec {
    /// The spec as one argument: `so_path:0x..`.
    pub fn to_arg(&self) -> OsString {
        let mut arg = self.path.clone().into_os_string();
        arg.push(format!(":{}", self.id));
        arg
    }
}

impl FromStr for PluginSpec {
    type Err = PluginSpecParseError;

    /// Parses `so_path:id`, the id in decimal or as `0x..`; the path may itself hold `:`.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (path, id) = text
            .rsplit_once(':')
            .ok_or_else(|| PluginSpecParseError::NoId(text.to_owned()))?;
        if path.is_empty() {
            return Err(PluginSpecParseError::NoPath(text.to_owned()));
        }
        let raw = match id.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => id.parse(),
        }
        .map_err(|_| PluginSpecParseError::NotANumber(id.to_owned()))?;
        Ok(Self {
            path: path.into(),
            id: PluginId::new(raw).map_err(PluginSpecParseError::NotAnId)?,
        })
    }
}

/// Why a `so_path:id` argument was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginSpecParseError {
    /// The argument has no `:` (the whole argument).
    NoId(String),
    /// Nothing stands before the `:` (the whole argument).
    NoPath(String),
    /// The id is not a decimal or `0x` hexadecimal number (the id as given).
    NotANumber(String),
    /// The id is a number but not a plugin id.
    NotAnId(PluginIdError),
}

impl fmt::Display for PluginSpecParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoId(text) => write!(f, "`{text}` is not of the form so_path:id"),
            Self::NoPath(text) => write!(f, "`{text}` has no library path before the `:`"),
            Self::NotANumber(id) => write!(f, "plugin id `{id}` is not a number"),
            Self::NotAnId(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for PluginSpecParseError {}

/// What a worker is started with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerCommand {
    /// The plugins to load (at least one).
    pub plugins: Vec<PluginSpec>,
    /// The worker's id.
    pub id: u64,
    /// The group the worker belongs to.
    pub gid: u32,
    /// The CPUs to run on; `None`: those the process may run on.
    pub cpuset: Option<CpuSet>,
    /// The largest message, header included; hosts must use the same value.
    pub max_msg_size: MaxMsgSize,
    /// The numeric log level (10 to 70).
    pub log_level: u8,
    /// The directory of the log file; `None`: log to stderr.
    pub log_dir: Option<PathBuf>,
    /// The Unix socket on which hosts connect.
    pub listen: PathBuf,
    /// Spin instead of sleeping when idle.
    pub busy_poll: bool,
    /// Other users whose hosts the worker serves.
    pub allow_uids: Vec<u32>,
    /// Stop when the process that started the worker ends.
    pub exit_with_parent: bool,
    /// Standard input is a socket on which the daemon asks for the worker's counters.
    pub daemon_link: bool,
    /// Whether the rings of host channels go on hugepages.
    pub hugepages: HugePages,
    /// Also accept hosts on other machines, over UCX.
    pub ucx: Option<UcxListen>,
}

/// How a worker accepts hosts on other machines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UcxListen {
    /// Where to listen, `IP:PORT` (port 0: any free port).
    pub address: std::net::SocketAddr,
    /// The file holding the worker's key (32 bytes), which every such host must prove; the
    /// worker reads it, then removes it.
    pub key_file: PathBuf,
    /// Where the worker writes the address it listens on, as `IP:PORT` text, before it
    /// accepts hosts on its Unix socket.
    pub address_file: PathBuf,
}

impl WorkerCommand {
    /// A worker loading `plugins` and listening on `listen`, everything else as the worker
    /// has it when not told: id 0, group 0, the process's CPUs, the default message size, log
    /// level [`DEFAULT_LOG_LEVEL`] to stderr, sleeping when idle, serving its own user, no
    /// daemon link, rings on hugepages when the system has some free.
    pub fn new(plugins: Vec<PluginSpec>, listen: PathBuf) -> Self {
        Self {
            plugins,
            id: 0,
            gid: 0,
            cpuset: None,
            max_msg_size: MaxMsgSize::DEFAULT,
            log_level: DEFAULT_LOG_LEVEL,
            log_dir: None,
            listen,
            busy_poll: false,
            allow_uids: Vec::new(),
            exit_with_parent: false,
            ucx: None,
            daemon_link: false,
            hugepages: HugePages::Auto,
        }
    }

    /// The arguments that start a worker with this command (without the program name).
    pub fn to_args(&self) -> Vec<OsString> {
        fn option(args: &mut Vec<OsString>, name: &str, value: impl Into<OsString>) {
            args.push(format!("--{name}").into());
            args.push(value.into());
        }
        fn switch(args: &mut Vec<OsString>, name: &str, on: bool) {
            if on {
                args.push(format!("--{name}").into());
            }
        }
        let mut args = Vec::new();
        for plugin in &self.plugins {
            option(&mut args, flag::PLUGIN, plugin.to_arg());
        }
        option(&mut args, flag::ID, self.id.to_string());
        option(&mut args, flag::GID, self.gid.to_string());
        if let Some(cpuset) = &self.cpuset {
            option(&mut args, flag::CPUSET, cpuset.to_string());
        }
        option(
            &mut args,
            flag::MAX_MSG_SIZE,
            self.max_msg_size.as_u32().to_string(),
        );
        option(&mut args, flag::LOG_LEVEL, self.log_level.to_string());
        if let Some(dir) = &self.log_dir {
            option(&mut args, flag::LOG_DIR, dir);
        }
        option(&mut args, flag::LISTEN, &self.listen);
        switch(&mut args, flag::BUSY_POLL, self.busy_poll);
        for uid in &self.allow_uids {
            option(&mut args, flag::ALLOW_UID, uid.to_string());
        }
        switch(&mut args, flag::EXIT_WITH_PARENT, self.exit_with_parent);
        switch(&mut args, flag::DAEMON_LINK, self.daemon_link);
        if self.hugepages != HugePages::Auto {
            option(&mut args, flag::HUGEPAGES, hugepages_name(self.hugepages));
        }
        if let Some(ucx) = &self.ucx {
            option(&mut args, flag::LISTEN_UCX, ucx.address.to_string());
            option(&mut args, flag::UCX_KEY_FILE, &ucx.key_file);
            option(&mut args, flag::UCX_ADDRESS_FILE, &ucx.address_file);
        }
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(text: &str) -> Result<PluginSpec, String> {
        text.parse()
            .map_err(|e: PluginSpecParseError| e.to_string())
    }

    #[test]
    fn plugin_specs_are_checked() {
        assert_eq!(
            spec("/a/b.so:4"),
            Ok(PluginSpec {
                path: "/a/b.so".into(),
                id: PluginId::new(4).unwrap(),
            })
        );
        assert_eq!(spec("c:/x.so:0x10").unwrap().id.get(), 16);
        assert!(spec("x.so").unwrap_err().contains("so_path:id"));
        assert!(spec("x.so:3").unwrap_err().contains("single bit"));
        assert!(spec("x.so:0").unwrap_err().contains("single bit"));
        assert!(spec(&format!("x.so:{}", 1u64 << 62)).is_err());
        assert!(spec("x.so:abc").unwrap_err().contains("not a number"));
        assert!(spec(":1").unwrap_err().contains("no library path"));
    }

    #[test]
    fn a_spec_written_as_an_argument_parses_back() {
        let plugin = PluginSpec {
            path: "/p/with:colon.so".into(),
            id: PluginId::from_index(61).unwrap(),
        };
        assert_eq!(plugin.to_arg(), "/p/with:colon.so:0x2000000000000000");
        assert_eq!(spec(plugin.to_arg().to_str().unwrap()), Ok(plugin));
    }

    #[test]
    fn every_option_is_written_under_its_flag() {
        let mut command = WorkerCommand::new(
            vec![spec("/p/a.so:1").unwrap(), spec("/p/b.so:4").unwrap()],
            "/tmp/w.sock".into(),
        );
        command.cpuset = Some("0-1".parse().unwrap());
        command.log_dir = Some("/tmp/logs".into());
        command.busy_poll = true;
        command.allow_uids = vec![1000, 1001];
        command.exit_with_parent = true;
        command.ucx = Some(UcxListen {
            address: "10.0.0.1:0".parse().unwrap(),
            key_file: "/tmp/w.key".into(),
            address_file: "/tmp/w.addr".into(),
        });
        command.daemon_link = true;
        command.hugepages = HugePages::Never;
        let args: Vec<String> = command
            .to_args()
            .into_iter()
            .map(|arg| arg.into_string().unwrap())
            .collect();
        assert_eq!(
            args.join(" "),
            "--plugin /p/a.so:0x1 --plugin /p/b.so:0x4 --id 0 --gid 0 --cpuset 0-1 \
             --max-msg-size 4096 --log-level 50 --log-dir /tmp/logs --listen /tmp/w.sock \
             --busy-poll --allow-uid 1000 --allow-uid 1001 --exit-with-parent --daemon-link \
             --hugepages never \
             --listen-ucx 10.0.0.1:0 --ucx-key-file /tmp/w.key --ucx-address-file /tmp/w.addr"
        );
        for choice in [HugePages::Auto, HugePages::Never, HugePages::Require] {
            assert_eq!(parse_hugepages(hugepages_name(choice)), Ok(choice));
        }
        assert!(
            parse_hugepages("always")
                .unwrap_err()
                .contains("auto, never, require")
        );
    }
}
