//! Logging with the numeric levels of the DOCA tools.

use std::fmt;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use tracing::level_filters::LevelFilter;
use tracing_subscriber::fmt::writer::MakeWriterExt;

/// The worker's log file name for this process: `urom_worker_<pid>_dev.log`.
pub fn log_file_name() -> String {
    format!("urom_worker_{}_dev.log", std::process::id())
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

/// The filter for a numeric level: 10 disable, 20 critical, 30 error, 40 warning, 50 info,
/// 60 debug, 70 trace.
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

/// Sends the log to `dir/file_name` (appending) and, with `also_stderr`, to stderr; to stderr
/// alone without a directory; at the numeric `level`. Does nothing when a logger is already
/// installed (a worker run inside a test). The daemon uses it too, with its own file name.
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
