//! What the command lines of urom's programs share: the DOCA tools' numeric log levels and
//! logging, options from a JSON file (`-j`) with the command line winning, and value parsers
//! for message sizes and CPU lists.
#![deny(unsafe_code)]

use std::ffi::OsString;
use std::fmt;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use clap::Parser;
use tracing::level_filters::LevelFilter;
use tracing_subscriber::fmt::writer::MakeWriterExt;
use urom_wire::{CpuSet, MaxMsgSize};

/// The help text of the numeric log levels.
pub const LOG_LEVELS: &str =
    "10 disable, 20 critical, 30 error, 40 warning, 50 info, 60 debug, 70 trace";

/// Why a command line or its JSON file was refused.
#[derive(Debug)]
pub enum ArgsError {
    /// clap's own message (it names the option and the allowed values), or the help and
    /// version texts.
    Clap(clap::Error),
    /// The JSON file could not be read or is not an object of options.
    Json {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

impl fmt::Display for ArgsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Clap(e) => write!(f, "{e}"),
            Self::Json { path, reason } => write!(f, "error: --json {}: {reason}", path.display()),
        }
    }
}

impl std::error::Error for ArgsError {}

impl ArgsError {
    /// Prints the error (or the help text) and exits: 0 for `--help` and `--version`, 2 for
    /// a bad command line.
    pub fn exit(self) -> ! {
        match self {
            Self::Clap(e) => e.exit(),
            Self::Json { .. } => {
                eprintln!("{self}");
                std::process::exit(2)
            }
        }
    }
}

/// A command line whose options may also come from a JSON file named by `-j/--json`.
pub trait JsonArgs: Parser {
    /// Parses `argv` (program name first) together with the JSON file it names, if any:
    /// options on the command line win over the file, and options required on the command
    /// line may come from the file instead.
    fn parse_with_json<I, T>(argv: I) -> Result<Self, ArgsError>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let argv: Vec<OsString> = argv.into_iter().map(Into::into).collect();
        let Some(path) = json_file(&argv) else {
            return Self::try_parse_from(&argv).map_err(ArgsError::Clap);
        };
        let from_file = json_words(&path)?;
        // The file's options first, the command line's after: with `args_override_self` the
        // last occurrence of a single-valued option wins.
        let mut merged = argv[..1].to_vec();
        merged.extend(from_file);
        merged.extend(argv[1..].iter().cloned());
        Self::try_parse_from(merged).map_err(ArgsError::Clap)
    }
}

/// The file named by `-j FILE`, `-jFILE`, `--json FILE` or `--json=FILE`, the last one given.
fn json_file(argv: &[OsString]) -> Option<PathBuf> {
    let mut found = None;
    let mut words = argv.iter().skip(1);
    while let Some(word) = words.next() {
        let Some(word) = word.to_str() else { continue };
        if word == "--" {
            break;
        }
        if word == "-j" || word == "--json" {
            found = words.next().map(PathBuf::from);
        } else if let Some(path) = word.strip_prefix("--json=") {
            found = Some(PathBuf::from(path));
        } else if let Some(path) = word.strip_prefix("-j").filter(|p| !p.is_empty()) {
            found = Some(PathBuf::from(path));
        }
    }
    found
}

/// The options of a JSON file as command-line words.
///
/// Accepts the DOCA applications' layout, `{"doca_general_flags": {...}, "doca_program_flags":
/// {...}}`, as well as one flat object; keys are long option names without the dashes
/// (`"server-listen-port": 12345`); arrays repeat an option (`"cpu": [0, 1]`); `true` gives a
/// flag without a value.
fn json_words(path: &Path) -> Result<Vec<OsString>, ArgsError> {
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
        match (key.as_str(), value) {
            ("doca_general_flags" | "doca_program_flags", serde_json::Value::Object(section)) => {
                for (key, value) in section {
                    push_option(&mut words, key, value).map_err(error)?;
                }
            }
            _ => push_option(&mut words, key, value).map_err(error)?,
        }
    }
    Ok(words)
}

fn push_option(
    words: &mut Vec<OsString>,
    key: &str,
    value: &serde_json::Value,
) -> Result<(), String> {
    if key == "json" || key == "j" {
        return Err("a JSON file cannot name another one".to_owned());
    }
    let flag = OsString::from(format!("--{key}"));
    let scalar = |value: &serde_json::Value| match value {
        serde_json::Value::String(text) => Ok(text.clone()),
        serde_json::Value::Number(number) => Ok(number.to_string()),
        other => Err(format!("`{key}`: unsupported value {other}")),
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
    Ok(())
}

/// The filter for a DOCA numeric level: 10 disable, 20 critical, 30 error, 40 warning,
/// 50 info, 60 debug, 70 trace.
pub fn level_filter(level: u8) -> LevelFilter {
    match level {
        ..20 => LevelFilter::OFF,
        20..40 => LevelFilter::ERROR,
        40..50 => LevelFilter::WARN,
        50..60 => LevelFilter::INFO,
        60..70 => LevelFilter::DEBUG,
        _ => LevelFilter::TRACE,
    }
}

/// Why logging could not be set up.
#[derive(Debug)]
pub struct LogInitError {
    /// The log file.
    pub path: PathBuf,
    /// What the OS said.
    pub source: io::Error,
}

impl fmt::Display for LogInitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot open log file {}: {}",
            self.path.display(),
            self.source
        )
    }
}

impl std::error::Error for LogInitError {}

/// Sends the log to `dir/file_name` (appending) and, with `also_stderr`, to stderr; to stderr
/// alone without a directory; at the numeric `level`. Does nothing when a logger is already
/// installed (a program run inside a test).
pub fn init_logging(
    level: u8,
    dir: Option<&Path>,
    file_name: &str,
    also_stderr: bool,
) -> Result<(), LogInitError> {
    let builder = tracing_subscriber::fmt()
        .with_max_level(level_filter(level))
        .with_ansi(false)
        .with_target(false);
    let _ = match dir {
        Some(dir) => {
            let path = dir.join(file_name);
            let file = File::options()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(|source| LogInitError { path, source })?;
            let stderr = io::stderr.with_filter(move |_| also_stderr);
            builder.with_writer(file.and(stderr)).try_init()
        }
        None => builder.with_writer(io::stderr).try_init(),
    };
    Ok(())
}

/// Holds back a log line that repeats: the first occurrence is logged, then at most one per
/// `interval`, which says how many were held back since the last one logged. Time is given by
/// the caller.
///
/// ```
/// # use std::time::{Duration, Instant};
/// let mut accept_failed = urom_cli::LogEvery::new(Duration::from_secs(5));
/// let now = Instant::now();
/// if let Some(held_back) = accept_failed.allow(now) {
///     tracing::warn!(held_back, "accept failed");
/// }
/// ```
#[derive(Debug, Clone)]
pub struct LogEvery {
    interval: std::time::Duration,
    last: Option<std::time::Instant>,
    held_back: u64,
}

impl LogEvery {
    /// Logs at most once per `interval`.
    pub const fn new(interval: std::time::Duration) -> Self {
        Self {
            interval,
            last: None,
            held_back: 0,
        }
    }

    /// An occurrence at `now`: `Some(n)` when it is to be logged, `n` being the occurrences
    /// held back since the last one logged; `None` when it is to be held back.
    pub fn allow(&mut self, now: std::time::Instant) -> Option<u64> {
        match self.last {
            Some(last) if now.saturating_duration_since(last) < self.interval => {
                self.held_back += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.held_back))
            }
        }
    }
}

/// Value parser for a CPU list like `2-3,6`; an empty list is refused.
pub fn parse_cpuset(text: &str) -> Result<CpuSet, String> {
    let set: CpuSet = text.parse().map_err(|e| format!("{e}"))?;
    if set.is_empty() {
        return Err("the CPU list is empty".to_owned());
    }
    Ok(set)
}

/// Value parser for a maximum message size in bytes (`-m/--max-msg-size`): a number within
/// [`MaxMsgSize::MIN`]`..=`[`MaxMsgSize::MAX`].
pub fn parse_max_msg_size(text: &str) -> Result<MaxMsgSize, String> {
    let bytes: u32 = text
        .parse()
        .map_err(|_| format!("`{text}` is not a number of bytes"))?;
    MaxMsgSize::new(bytes).map_err(|e| e.to_string())
}

/// [`MaxMsgSize::DEFAULT`] as a command-line default (`default_value`): clap shows it in the
/// help and hands it to [`parse_max_msg_size`] when the option is absent.
pub const DEFAULT_MAX_MSG_SIZE: &str = "4096";

/// Listens on the Unix socket `path`, with permissions `mode` when given (`0o666`: every local
/// user may connect; who did is checked after). The socket is bound and set up under a
/// temporary name in the same directory, then linked to `path`, so that whoever sees `path` can
/// connect at once, with the final permissions. Fails if `path` exists.
pub fn listen_unix(path: &Path, mode: Option<u32>) -> io::Result<std::os::unix::net::UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    let staging = path
        .parent()
        .unwrap_or(Path::new("."))
        .join(format!(".urom-{}.binding", std::process::id()));
    let _ = std::fs::remove_file(&staging);
    let listener = std::os::unix::net::UnixListener::bind(&staging)?;
    let published = (|| {
        if let Some(mode) = mode {
            std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(mode))?;
        }
        std::fs::hard_link(&staging, path)
    })();
    let _ = std::fs::remove_file(&staging);
    published.map(|()| listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_every_logs_the_first_then_once_per_interval_with_the_count_held_back() {
        use std::time::{Duration, Instant};
        let mut log = LogEvery::new(Duration::from_secs(5));
        let start = Instant::now();
        assert_eq!(log.allow(start), Some(0));
        for ms in 1..=1000 {
            assert_eq!(log.allow(start + Duration::from_millis(ms)), None);
        }
        assert_eq!(log.allow(start + Duration::from_secs(5)), Some(1000));
        assert_eq!(log.allow(start + Duration::from_secs(6)), None);
        assert_eq!(log.allow(start + Duration::from_secs(60)), Some(1));
        assert_eq!(log.allow(start + Duration::from_secs(66)), Some(0));
    }

    #[test]
    fn a_unix_socket_appears_listening_with_its_mode_and_never_over_another() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("urom-cli-listen-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        let _ = std::fs::remove_file(&path);
        let listener = listen_unix(&path, Some(0o666)).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o666);
        std::os::unix::net::UnixStream::connect(&path).unwrap();
        listener.accept().unwrap();
        let error = listen_unix(&path, None).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::AlreadyExists);
        // Only the socket is left in the directory: no staging name.
        let names: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
        assert_eq!(names.len(), 1, "{names:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn numeric_levels_map_to_filters() {
        assert_eq!(level_filter(10), LevelFilter::OFF);
        assert_eq!(level_filter(20), LevelFilter::ERROR);
        assert_eq!(level_filter(30), LevelFilter::ERROR);
        assert_eq!(level_filter(40), LevelFilter::WARN);
        assert_eq!(level_filter(50), LevelFilter::INFO);
        assert_eq!(level_filter(60), LevelFilter::DEBUG);
        assert_eq!(level_filter(70), LevelFilter::TRACE);
    }

    #[test]
    fn value_parsers_explain_refusals() {
        assert_eq!(parse_cpuset("0-1").unwrap().len(), 2);
        assert!(parse_cpuset("").unwrap_err().contains("empty"));
        assert_eq!(parse_max_msg_size("8192").map(MaxMsgSize::get), Ok(8192));
        assert_eq!(
            parse_max_msg_size(DEFAULT_MAX_MSG_SIZE),
            Ok(MaxMsgSize::DEFAULT)
        );
        assert!(
            parse_max_msg_size("10")
                .unwrap_err()
                .contains("between 184")
        );
        assert!(
            parse_max_msg_size("x")
                .unwrap_err()
                .contains("not a number")
        );
    }
}
