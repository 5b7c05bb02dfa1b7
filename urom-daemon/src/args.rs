//! The daemon's command line, optionally completed from a JSON file (`-j`): options given on
//! the command line win over the file.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::{CommandFactory, FromArgMatches, Parser};
use urom_wire::{CpuSet, MaxMsgSize};

/// The DOCA UROM service: discovers plugins in `UROM_PLUGIN_PATH` (directories separated by
/// `;`), authenticates hosts on a Unix socket, and spawns, attaches and tears down
/// `urom-worker` processes for them.
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
    #[arg(short = 'm', long, value_name = "BYTES", default_value_t = MaxMsgSize::DEFAULT.as_u32(), value_parser = parse_max_msg_size)]
    pub max_msg_size: u32,

    /// Read options from a JSON object whose keys are the long option names, e.g.
    /// {"log-level": 60, "max-workers": 8}; options on the command line win.
    #[arg(short = 'j', long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// Unix socket hosts connect to [default: /run/urom/urom.sock when /run is writable, else
    /// $XDG_RUNTIME_DIR/urom/urom.sock, else /tmp/urom-<uid>/urom.sock].
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
    #[arg(long, value_name = "LIST", value_parser = parse_cpuset)]
    pub cpuset: Option<CpuSet>,

    /// Most workers at once.
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub max_workers: u32,

    /// Workers spin instead of napping when idle (lowest latency; give them their own cores).
    #[arg(long)]
    pub worker_busy_poll: bool,

    /// The worker program [default: urom-worker beside this program, else on PATH].
    #[arg(long, value_name = "PATH")]
    pub worker_bin: Option<PathBuf>,

    /// Also accept hosts running as this user id (repeatable); by default only the daemon's
    /// own user and root may connect.
    #[arg(long = "allow-uid", value_name = "UID")]
    pub allow_uids: Vec<u32>,
}

/// Why the command line or the JSON file was refused.
#[derive(Debug)]
pub enum ArgsError {
    /// clap's own message (it names the option and the allowed values).
    Clap(clap::Error),
    /// The JSON file could not be read or is not an object of options.
    Json {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

impl std::fmt::Display for ArgsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Clap(e) => write!(f, "{e}"),
            Self::Json { path, reason } => write!(f, "error: --json {}: {reason}", path.display()),
        }
    }
}

impl std::error::Error for ArgsError {}

impl Args {
    /// Parses `argv` (program name first), then the JSON file it names, if any.
    pub fn parse_with_json<I, T>(argv: I) -> Result<Self, ArgsError>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let argv: Vec<OsString> = argv.into_iter().map(Into::into).collect();
        let args = Self::try_parse_from(&argv).map_err(ArgsError::Clap)?;
        let Some(path) = &args.json else {
            return Ok(args);
        };
        let from_file = json_options(path)?;
        // Options from the file first, the command line after: with `args_override_self`,
        // the last occurrence of an option wins.
        let mut merged = vec![argv[0].clone()];
        merged.extend(from_file);
        merged.extend(argv[1..].iter().cloned());
        let matches = Self::command()
            .try_get_matches_from(merged)
            .map_err(ArgsError::Clap)?;
        Self::from_arg_matches(&matches).map_err(ArgsError::Clap)
    }

    /// The maximum message size (checked when parsed).
    pub fn max_msg_size(&self) -> MaxMsgSize {
        MaxMsgSize::new(self.max_msg_size).expect("checked by the parser")
    }
}

/// The options of a JSON object as command-line words.
fn json_options(path: &Path) -> Result<Vec<OsString>, ArgsError> {
    let error = |reason: String| ArgsError::Json {
        path: path.to_owned(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| error(e.to_string()))?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| error(e.to_string()))?;
    let object = value
        .as_object()
        .ok_or_else(|| error("expected a JSON object of options".to_owned()))?;
    let mut words = Vec::new();
    for (key, value) in object {
        if key == "json" {
            return Err(error("a JSON file cannot name another one".to_owned()));
        }
        let flag = OsString::from(format!("--{key}"));
        let scalar = |value: &serde_json::Value| match value {
            serde_json::Value::String(text) => Ok(text.clone()),
            serde_json::Value::Number(number) => Ok(number.to_string()),
            other => Err(error(format!("`{key}`: unsupported value {other}"))),
        };
        match value {
            serde_json::Value::Bool(true) => words.push(flag),
            serde_json::Value::Bool(false) => {}
            serde_json::Value::Array(items) => {
                for item in items {
                    words.push(flag.clone());
                    words.push(scalar(item)?.into());
                }
            }
            other => {
                words.push(flag);
                words.push(scalar(other)?.into());
            }
        }
    }
    Ok(words)
}

fn parse_cpuset(text: &str) -> Result<CpuSet, String> {
    let set: CpuSet = text.parse().map_err(|e| format!("{e}"))?;
    if set.is_empty() {
        return Err("the CPU list is empty".to_owned());
    }
    Ok(set)
}

fn parse_max_msg_size(text: &str) -> Result<u32, String> {
    let bytes: u32 = text
        .parse()
        .map_err(|_| format!("`{text}` is not a number of bytes"))?;
    MaxMsgSize::new(bytes)
        .map(MaxMsgSize::as_u32)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_wins_over_the_json_file() {
        let dir = std::env::temp_dir().join(format!("urom-daemon-args-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("options.json");
        std::fs::write(
            &file,
            r#"{"log-level": 60, "max-workers": 8, "allow-uid": [1000, 1001], "log-stderr": true}"#,
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
        assert_eq!(args.max_workers, 8);
        assert_eq!(args.allow_uids, vec![1000, 1001]);
        assert!(args.log_stderr);

        std::fs::write(&file, r#"{"max-workers": 0}"#).unwrap();
        let error = Args::parse_with_json(["urom-daemon", "-j", file.to_str().unwrap()])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("--max-workers") && error.contains("1..=4096"),
            "{error}"
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
