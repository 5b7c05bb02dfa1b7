//! The sandbox plugin's message timestamps: when it issued each tagged send and when each
//! tagged receive completed, on the machine's monotonic clock, so that the time between two
//! workers can be measured without the hosts in between.
//!
//! A worker whose environment names a directory in [`ENV`] (`UROM_SANDBOX_TIMESTAMPS=DIR`,
//! given through `Worker::set_env`) has its sandbox plugin record, into a [`Recorder`]
//! preallocated when the plugin opens ([`CAPACITY`] entries; nothing allocated and no system
//! call per message, `CLOCK_MONOTONIC` is read through the vDSO), one [`Stamp`] per tagged send
//! it issues (right before `ucp_tag_send_nbx`; in the buffer variant, before the fetch from the
//! host's memory that precedes it) and per tagged receive it completes (when its progress takes
//! the completion, with the sender's tag). Stamps that do not fit are counted, not kept. When
//! the plugin closes (the worker's shutdown: the host's `Worker::stop`, or SIGTERM), it writes
//! them to `DIR/sandbox-PID.timestamps` ([`file_name`]); [`read_log`] reads such a file back
//! and [`legs`] pairs one worker's sends with another's receives.
//!
//! `CLOCK_MONOTONIC` is one clock for every process of a machine, so stamps of two workers on
//! one machine compare directly; across machines they do not.
//!
//! The file is text, one entry a line (the pid, the count of stamps that did not fit, then one
//! line per stamp, in the order taken):
//!
//! ```text
//! # urom sandbox plugin timestamps (CLOCK_MONOTONIC nanoseconds)
//! pid 4242
//! dropped 0
//! send 4660 1234567890
//! recv 22136 1234599999
//! ```

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io::{self, BufWriter, Write as _};
use std::path::{Path, PathBuf};
use std::prelude::rust_2024::*;

use nix::time::{ClockId, clock_gettime};

/// The environment variable naming the directory a worker's sandbox plugin writes its
/// timestamps to; unset, nothing is recorded.
pub const ENV: &str = "UROM_SANDBOX_TIMESTAMPS";

/// How many stamps a worker keeps (24 bytes each, 3 MiB); later ones are counted as dropped.
pub const CAPACITY: usize = 1 << 17;

/// The first line of a timestamps file.
const HEADER: &str = "# urom sandbox plugin timestamps (CLOCK_MONOTONIC nanoseconds)";

/// What a stamp marks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The plugin issued a tagged send.
    Send,
    /// A tagged receive completed.
    Receive,
}

impl Event {
    fn word(self) -> &'static str {
        match self {
            Event::Send => "send",
            Event::Receive => "recv",
        }
    }
}

/// One send or receive, with its tag (a receive's: the sender's) and the monotonic clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// A send or a receive.
    pub event: Event,
    /// The message's tag.
    pub tag: u64,
    /// `CLOCK_MONOTONIC` in nanoseconds.
    pub ns: u64,
}

/// `CLOCK_MONOTONIC` now, in nanoseconds (one clock for every process of the machine).
pub fn monotonic_ns() -> u64 {
    // CLOCK_MONOTONIC exists on every Linux: with a valid clock id the call cannot fail.
    let Ok(now) = clock_gettime(ClockId::CLOCK_MONOTONIC) else {
        return 0;
    };
    (now.tv_sec() as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(now.tv_nsec() as u64)
}

/// The name of process `pid`'s timestamps file.
pub fn file_name(pid: u32) -> String {
    format!("sandbox-{pid}.timestamps")
}

/// A worker's stamps, kept in storage allocated (and touched) once.
pub struct Recorder {
    dir: PathBuf,
    // INVARIANTS: `len <= stamps.len()`; `stamps.len()` never changes after `new`.
    stamps: Vec<Stamp>,
    len: usize,
    dropped: u64,
}

impl fmt::Debug for Recorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Recorder")
            .field("dir", &self.dir)
            .field("recorded", &self.len)
            .field("dropped", &self.dropped)
            .finish()
    }
}

impl Recorder {
    /// A recorder writing to the directory [`ENV`] names, if it names one; an error when it
    /// names something that is not a directory (the plugin then refuses to open, rather than
    /// run without the timestamps asked for).
    pub fn from_env() -> Result<Option<Self>, TimestampsDirError> {
        let Some(dir) = std::env::var_os(ENV) else {
            return Ok(None);
        };
        let dir = PathBuf::from(dir);
        match std::fs::metadata(&dir) {
            Ok(meta) if meta.is_dir() => Ok(Some(Self::new(dir, CAPACITY))),
            Ok(_) => Err(TimestampsDirError {
                dir,
                error: io::Error::other("not a directory"),
            }),
            Err(error) => Err(TimestampsDirError { dir, error }),
        }
    }

    /// A recorder of at most `capacity` stamps, written to `dir`.
    pub fn new(dir: PathBuf, capacity: usize) -> Self {
        let blank = Stamp {
            event: Event::Send,
            tag: 0,
            ns: 0,
        };
        // Written, not merely reserved: every page is in place before the first message.
        let mut stamps = Vec::with_capacity(capacity);
        stamps.resize(capacity, blank);
        Self {
            dir,
            stamps,
            len: 0,
            dropped: 0,
        }
    }

    /// Records `event` for `tag` at `ns` ([`monotonic_ns`]); counted as dropped when full.
    #[inline]
    pub fn record(&mut self, event: Event, tag: u64, ns: u64) {
        match self.stamps.get_mut(self.len) {
            Some(stamp) => {
                *stamp = Stamp { event, tag, ns };
                self.len += 1;
            }
            None => self.dropped += 1,
        }
    }

    /// The stamps so far, in the order taken.
    pub fn stamps(&self) -> &[Stamp] {
        &self.stamps[..self.len]
    }

    /// How many stamps did not fit.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Writes the stamps to the directory's [`file_name`] of this process (through a
    /// temporary file renamed into place, so a reader never sees half of it); its path.
    pub fn write(&self) -> io::Result<PathBuf> {
        let pid = std::process::id();
        let path = self.dir.join(file_name(pid));
        let partial = self.dir.join(format!(".{}.partial", file_name(pid)));
        let mut out = BufWriter::new(std::fs::File::create(&partial)?);
        writeln!(out, "{HEADER}")?;
        writeln!(out, "pid {pid}")?;
        writeln!(out, "dropped {}", self.dropped)?;
        for stamp in self.stamps() {
            writeln!(out, "{} {} {}", stamp.event.word(), stamp.tag, stamp.ns)?;
        }
        out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        std::fs::rename(&partial, &path)?;
        Ok(path)
    }
}

/// [`ENV`] names something that is not a directory the plugin can use.
#[derive(Debug)]
pub struct TimestampsDirError {
    /// What the variable named.
    pub dir: PathBuf,
    /// Why it cannot be used.
    pub error: io::Error,
}

impl fmt::Display for TimestampsDirError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{ENV}={}: cannot write the sandbox plugin's timestamps there: {}",
            self.dir.display(),
            self.error
        )
    }
}

impl std::error::Error for TimestampsDirError {}

/// A timestamps file, read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimestampLog {
    /// The worker process that wrote it.
    pub pid: u32,
    /// How many stamps did not fit in the recorder.
    pub dropped: u64,
    /// The stamps, in the order taken.
    pub stamps: Vec<Stamp>,
}

/// A timestamps file could not be read.
#[derive(Debug)]
pub enum TimestampsReadError {
    /// The file could not be read.
    Io {
        /// The file.
        path: PathBuf,
        /// The system's error.
        error: io::Error,
    },
    /// A line is not what the sandbox plugin writes.
    Malformed {
        /// The file.
        path: PathBuf,
        /// The line's number, from 1.
        line: usize,
        /// The line.
        text: String,
    },
    /// The directory holds no timestamps file, or more than one.
    NotOne {
        /// The directory.
        dir: PathBuf,
        /// How many it holds.
        found: usize,
    },
}

impl fmt::Display for TimestampsReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io { path, error } => write!(f, "cannot read {}: {error}", path.display()),
            Self::Malformed { path, line, text } => write!(
                f,
                "{} line {line} is not a sandbox timestamp (\"send|recv TAG NS\", \"pid N\" or \
                 \"dropped N\"): {text:?}",
                path.display()
            ),
            Self::NotOne { dir, found } => write!(
                f,
                "{} holds {found} sandbox timestamps files, expected one (one worker per \
                 directory)",
                dir.display()
            ),
        }
    }
}

impl std::error::Error for TimestampsReadError {}

/// Reads a timestamps file the sandbox plugin wrote.
pub fn read_log(path: &Path) -> Result<TimestampLog, TimestampsReadError> {
    let text = std::fs::read_to_string(path).map_err(|error| TimestampsReadError::Io {
        path: path.to_owned(),
        error,
    })?;
    let mut log = TimestampLog {
        pid: 0,
        dropped: 0,
        stamps: Vec::new(),
    };
    for (at, line) in text.lines().enumerate() {
        let malformed = || TimestampsReadError::Malformed {
            path: path.to_owned(),
            line: at + 1,
            text: line.to_owned(),
        };
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let number = |field: &str| field.parse::<u64>().map_err(|_| malformed());
        match fields[..] {
            ["pid", pid] => log.pid = pid.parse().map_err(|_| malformed())?,
            ["dropped", n] => log.dropped = number(n)?,
            [word @ ("send" | "recv"), tag, ns] => log.stamps.push(Stamp {
                event: if word == "send" {
                    Event::Send
                } else {
                    Event::Receive
                },
                tag: number(tag)?,
                ns: number(ns)?,
            }),
            _ => return Err(malformed()),
        }
    }
    Ok(log)
}

/// Reads the one timestamps file in `dir` (give each worker a directory of its own).
pub fn read_dir_log(dir: &Path) -> Result<TimestampLog, TimestampsReadError> {
    let io = |error| TimestampsReadError::Io {
        path: dir.to_owned(),
        error,
    };
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let path = entry.map_err(io)?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with("sandbox-") && name.ends_with(".timestamps") {
            found.push(path);
        }
    }
    match &found[..] {
        [path] => read_log(path),
        _ => Err(TimestampsReadError::NotOne {
            dir: dir.to_owned(),
            found: found.len(),
        }),
    }
}

/// One message from a send to its receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leg {
    /// The sender's stamp when it issued the send.
    pub sent_ns: u64,
    /// The receiver's stamp when its receive completed.
    pub received_ns: u64,
}

impl Leg {
    /// From send to receive, in nanoseconds (negative only if the two stamps came from
    /// different clocks, that is different machines).
    pub fn latency_ns(&self) -> i64 {
        self.received_ns.wrapping_sub(self.sent_ns) as i64
    }
}

/// The messages with `tag` from the worker that wrote `sender` to the one that wrote
/// `receiver`: the k-th send with that tag paired with the k-th receive of it, in order
/// (as UCX delivers messages of one tag between two workers); as many legs as the fewer of
/// the two.
pub fn legs(sender: &TimestampLog, receiver: &TimestampLog, tag: u64) -> Vec<Leg> {
    let pick = |log: &TimestampLog, event: Event| -> VecDeque<u64> {
        log.stamps
            .iter()
            .filter(|s| s.event == event && s.tag == tag)
            .map(|s| s.ns)
            .collect()
    };
    let sent = pick(sender, Event::Send);
    let received = pick(receiver, Event::Receive);
    sent.into_iter()
        .zip(received)
        .map(|(sent_ns, received_ns)| Leg {
            sent_ns,
            received_ns,
        })
        .collect()
}

/// How many stamps of each tag a log holds: `(tag, sends, receives)`, by tag.
pub fn tally(log: &TimestampLog) -> Vec<(u64, usize, usize)> {
    let mut counts: HashMap<u64, (usize, usize)> = HashMap::new();
    for stamp in &log.stamps {
        let count = counts.entry(stamp.tag).or_default();
        match stamp.event {
            Event::Send => count.0 += 1,
            Event::Receive => count.1 += 1,
        }
    }
    let mut tally: Vec<_> = counts.into_iter().map(|(t, (s, r))| (t, s, r)).collect();
    tally.sort_unstable();
    tally
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("urom-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_full_recorder_counts_what_it_drops_and_the_file_reads_back() {
        let dir = temp_dir("stamps-roundtrip");
        let mut recorder = Recorder::new(dir.clone(), 3);
        recorder.record(Event::Send, 0x1234, 100);
        recorder.record(Event::Receive, u64::MAX, 250);
        recorder.record(Event::Send, 7, 300);
        recorder.record(Event::Send, 7, 400);
        recorder.record(Event::Receive, 7, 500);
        assert_eq!(recorder.stamps().len(), 3);
        assert_eq!(recorder.dropped(), 2);
        let path = recorder.write().unwrap();
        assert_eq!(path, dir.join(file_name(std::process::id())));
        let log = read_log(&path).unwrap();
        assert_eq!(log.pid, std::process::id());
        assert_eq!(log.dropped, 2);
        assert_eq!(log.stamps, recorder.stamps());
        assert_eq!(read_dir_log(&dir).unwrap(), log);
        assert_eq!(
            tally(&log),
            vec![(7, 1, 0), (0x1234, 1, 0), (u64::MAX, 0, 1)]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn legs_pair_sends_and_receives_of_a_tag_in_order() {
        let stamp = |event, tag, ns| Stamp { event, tag, ns };
        let sender = TimestampLog {
            pid: 1,
            dropped: 0,
            stamps: vec![
                stamp(Event::Send, 1, 10),
                stamp(Event::Receive, 2, 35),
                stamp(Event::Send, 1, 40),
                stamp(Event::Send, 1, 90),
            ],
        };
        let receiver = TimestampLog {
            pid: 2,
            dropped: 0,
            stamps: vec![
                stamp(Event::Receive, 1, 17),
                stamp(Event::Send, 2, 20),
                stamp(Event::Receive, 1, 49),
            ],
        };
        let there = legs(&sender, &receiver, 1);
        assert_eq!(
            there.iter().map(Leg::latency_ns).collect::<Vec<_>>(),
            [7, 9]
        );
        let back = legs(&receiver, &sender, 2);
        assert_eq!(
            back,
            [Leg {
                sent_ns: 20,
                received_ns: 35
            }]
        );
        assert!(legs(&sender, &receiver, 3).is_empty());
    }

    #[test]
    fn malformed_files_and_directories_say_what_is_wrong() {
        let dir = temp_dir("stamps-malformed");
        let path = dir.join(file_name(1));
        std::fs::write(&path, "pid 1\nsend 12\n").unwrap();
        let error = read_log(&path).unwrap_err().to_string();
        assert!(error.contains("line 2"), "{error}");
        assert!(error.contains("\"send 12\""), "{error}");
        std::fs::write(dir.join(file_name(2)), "pid 2\n").unwrap();
        let error = read_dir_log(&dir).unwrap_err().to_string();
        assert!(
            error.contains("holds 2 sandbox timestamps files"),
            "{error}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_clock_goes_forward() {
        let a = monotonic_ns();
        let b = monotonic_ns();
        assert!(a > 0 && b >= a);
    }
}
