//! The worker's command line.

use std::path::PathBuf;

use clap::Parser;
use urom_wire::{CpuSet, MaxMsgSize};

/// The most plugins a worker loads: plugin ids are bits 0 to 61 of a mask.
pub const MAX_PLUGINS: u32 = 62;

/// A plugin to load, given as `so_path:id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginSpec {
    /// The plugin library.
    pub path: PathBuf,
    /// Its id: a single bit, `1 << index`, index below [`MAX_PLUGINS`].
    pub id: u64,
}

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
    #[arg(short = 'p', long = "plugin", value_name = "SO_PATH:ID", required = true, value_parser = parse_plugin)]
    pub plugins: Vec<PluginSpec>,

    /// This worker's id.
    #[arg(long, default_value_t = 0)]
    pub id: u64,

    /// The group this worker belongs to.
    #[arg(long, default_value_t = 0)]
    pub gid: u32,

    /// CPUs to run on, as a list like `2-3,6` [default: the CPUs this process may run on].
    #[arg(long, value_name = "LIST", value_parser = urom_cli::parse_cpuset)]
    pub cpuset: Option<CpuSet>,

    /// Largest message, header included; hosts must use the same value.
    #[arg(short = 'm', long, value_name = "BYTES", default_value_t = MaxMsgSize::DEFAULT.as_u32(), value_parser = urom_cli::parse_max_msg_size)]
    pub max_msg_size: u32,

    /// Log level: 10 disable, 20 critical, 30 error, 40 warning, 50 info, 60 debug, 70 trace.
    #[arg(short = 'l', long, value_name = "LEVEL", default_value_t = 50, value_parser = clap::value_parser!(u8).range(10..=70))]
    pub log_level: u8,

    /// Directory for the log file `urom_worker_<pid>_dev.log` [default: log to stderr].
    #[arg(long, value_name = "DIR")]
    pub log_dir: Option<PathBuf>,

    /// Unix socket path on which hosts connect.
    #[arg(long, value_name = "PATH")]
    pub listen: PathBuf,

    /// Never sleep when idle: spin on the channels (lowest latency; use on dedicated cores).
    #[arg(long)]
    pub busy_poll: bool,

    /// Also serve hosts run by this user (repeatable); makes the socket connectable by every
    /// local user, each host's user being checked when it connects. The worker's own user and
    /// root are always served.
    #[arg(long = "allow-uid", value_name = "UID")]
    pub allow_uids: Vec<u32>,

    /// Stop when the process that started this worker ends (the daemon passes it, so that no
    /// worker outlives its daemon).
    #[arg(long)]
    pub exit_with_parent: bool,
}

impl Args {
    /// The maximum message size (checked when parsed).
    pub fn max_msg_size(&self) -> MaxMsgSize {
        MaxMsgSize::new(self.max_msg_size).expect("checked by the parser")
    }

    /// The command line that gives a worker these arguments (without the program name): what
    /// the daemon passes when it spawns a worker.
    pub fn command_line(&self) -> Vec<std::ffi::OsString> {
        let mut line: Vec<std::ffi::OsString> = Vec::new();
        for plugin in &self.plugins {
            line.push("--plugin".into());
            let mut spec = plugin.path.clone().into_os_string();
            spec.push(format!(":{:#x}", plugin.id));
            line.push(spec);
        }
        line.extend(["--id".into(), self.id.to_string().into()]);
        line.extend(["--gid".into(), self.gid.to_string().into()]);
        if let Some(cpuset) = &self.cpuset {
            line.extend(["--cpuset".into(), cpuset.to_string().into()]);
        }
        line.extend([
            "--max-msg-size".into(),
            self.max_msg_size.to_string().into(),
        ]);
        line.extend(["--log-level".into(), self.log_level.to_string().into()]);
        if let Some(dir) = &self.log_dir {
            line.extend(["--log-dir".into(), dir.clone().into_os_string()]);
        }
        line.extend(["--listen".into(), self.listen.clone().into_os_string()]);
        if self.busy_poll {
            line.push("--busy-poll".into());
        }
        for uid in &self.allow_uids {
            line.extend(["--allow-uid".into(), uid.to_string().into()]);
        }
        if self.exit_with_parent {
            line.push("--exit-with-parent".into());
        }
        line
    }
}

fn parse_plugin(text: &str) -> Result<PluginSpec, String> {
    let (path, id) = text
        .rsplit_once(':')
        .ok_or_else(|| format!("`{text}` is not of the form so_path:id"))?;
    if path.is_empty() {
        return Err(format!("`{text}` has no library path before the `:`"));
    }
    let id = match id.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => id.parse(),
    }
    .map_err(|_| format!("plugin id `{id}` is not a number"))?;
    if id.count_ones() != 1 || id.trailing_zeros() >= MAX_PLUGINS {
        return Err(format!(
            "plugin id {id:#x} must be a single bit below 1 << {MAX_PLUGINS}"
        ));
    }
    Ok(PluginSpec {
        path: path.into(),
        id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_specs_are_checked() {
        assert_eq!(
            parse_plugin("/a/b.so:4"),
            Ok(PluginSpec {
                path: "/a/b.so".into(),
                id: 4
            })
        );
        assert_eq!(parse_plugin("c:/x.so:0x10").unwrap().id, 16);
        assert!(parse_plugin("x.so").unwrap_err().contains("so_path:id"));
        assert!(parse_plugin("x.so:3").unwrap_err().contains("single bit"));
        assert!(parse_plugin("x.so:0").unwrap_err().contains("single bit"));
        assert!(parse_plugin(&format!("x.so:{}", 1u64 << 62)).is_err());
        assert!(
            parse_plugin("x.so:abc")
                .unwrap_err()
                .contains("not a number")
        );
        assert!(parse_plugin(":1").is_err());
    }

    #[test]
    fn the_command_line_parses_back_to_the_same_arguments() {
        let args = Args::try_parse_from([
            "urom-worker",
            "-p",
            "/p/a.so:1",
            "-p",
            "/p/b.so:0x4",
            "--listen",
            "/tmp/w.sock",
            "--id",
            "7",
            "--gid",
            "1",
            "--cpuset",
            "0-1",
            "--log-dir",
            "/tmp/logs",
            "--busy-poll",
            "--allow-uid",
            "1000",
            "--allow-uid",
            "1001",
            "--exit-with-parent",
        ])
        .unwrap();
        assert_eq!(args.allow_uids, vec![1000, 1001]);
        let again = Args::try_parse_from(
            std::iter::once(std::ffi::OsString::from("urom-worker")).chain(args.command_line()),
        )
        .unwrap();
        assert_eq!(format!("{again:?}"), format!("{args:?}"));
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
        assert_eq!(args.max_msg_size().get(), 8192);
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
    }
}
