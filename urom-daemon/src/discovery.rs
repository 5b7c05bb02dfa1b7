//! Plugin discovery: scan `UROM_PLUGIN_PATH`, probe each `.so` in a short-lived child process,
//! give the plugins ids.
//!
//! Loading a library runs its code, so the daemon never loads a plugin itself: it runs itself
//! again as `urom-daemon --probe-plugin PATH`, which loads the library, checks both symbols,
//! the version and the interface, writes `version N` (or `refused REASON`) on its standard
//! output and exits. Whatever the plugin itself prints goes to the probe's standard error, which
//! the daemon drains as it comes and keeps the last [`OUTPUT_TAIL`] bytes of for the log. A
//! plugin that crashes or hangs on load only takes the probe down. Results are cached by path,
//! size and modification time.
//!
//! Probes run in the background, each in a thread of its own, all at once: a file is probed once
//! however many hosts arrive meanwhile. A scan answers from what is known. It gives probes that
//! started less than [`PROBE_GRACE`] ago the rest of that time to finish (so that a host
//! arriving together with the daemon finds the good plugins), then leaves out whatever is still
//! being probed: a plugin that hangs while loading delays no host by more than that, and is
//! offered to none until its probe has answered.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use tracing::{info, warn};
use urom_plugin::abi::PluginLibrary;
use urom_plugin::plugin_id::{MAX_PLUGINS, PluginId};
use urom_wire::control::PLUGIN_NAME_MAX_LEN;

/// The flag that runs the daemon as a plugin probe.
pub const PROBE_FLAG: &str = "--probe-plugin";
/// How long a probe may take before it is killed.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long after a probe started a scan still waits for it.
pub const PROBE_GRACE: Duration = Duration::from_secs(1);
/// How many of the last bytes a probe printed are kept for the log.
pub const OUTPUT_TAIL: usize = 4096;
/// How long a probe's supervisor waits for output before it looks at the child again.
const PROBE_POLL: Duration = Duration::from_millis(20);

/// A plugin the service offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginEntry {
    /// Its id: `1 << index`, the index counting the plugins found before it.
    pub id: PluginId,
    /// What `urom_plugin_get_version` reported.
    pub version: u64,
    /// The file name without `.so`.
    pub name: String,
    /// The library.
    pub path: PathBuf,
}

/// Why a file was not taken as a plugin.
type Refusal = String;

/// Everything a scan looked at.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Survey {
    /// The directories of `UROM_PLUGIN_PATH`, in order.
    pub dirs: Vec<DirSurvey>,
    /// The plugins offered, with their ids (those of `dirs` that are [`FileOutcome::Offered`]).
    pub plugins: Vec<PluginEntry>,
}

/// One directory of `UROM_PLUGIN_PATH`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirSurvey {
    /// The directory as the path names it.
    pub path: PathBuf,
    /// Why it could not be listed, if it could not.
    pub error: Option<String>,
    /// Its `.so` files, those whose size could not be read first, then in name order.
    pub files: Vec<FileSurvey>,
}

/// One `.so` file of a plugin directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSurvey {
    /// The file.
    pub path: PathBuf,
    /// Its name without `.so`.
    pub name: String,
    /// What became of it.
    pub outcome: FileOutcome,
}

/// What became of a `.so` file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileOutcome {
    /// Offered to hosts.
    Offered {
        /// Its id.
        id: PluginId,
        /// Its version.
        version: u64,
    },
    /// Its probe refused it, for this reason.
    Refused(String),
    /// Its probe has not answered yet.
    Probing,
    /// A plugin of the same name came earlier in the path.
    DuplicateName {
        /// Its version.
        version: u64,
    },
    /// Its name is empty, not UTF-8 or too long.
    BadName {
        /// Its version.
        version: u64,
    },
    /// Every plugin id was taken by plugins found earlier.
    TooMany {
        /// Its version.
        version: u64,
    },
    /// Its size or modification time could not be read, for this reason.
    Unreadable(String),
}

/// A directory's `.so` files found by a scan.
struct DirCandidates {
    path: PathBuf,
    error: Option<String>,
    files: Vec<Candidate>,
    unreadable: Vec<(PathBuf, String)>,
}

/// Where the probe of one version of a file stands.
enum ProbeState {
    /// A probe child runs.
    Running {
        /// When it started.
        since: Instant,
    },
    /// The probe answered: the plugin's version, or why the file is not a plugin.
    Done(Result<u64, Refusal>),
}

/// The probe of a file as it was when the probe started.
struct Probed {
    size: u64,
    modified: SystemTime,
    state: ProbeState,
}

/// A `.so` file found by a scan.
struct Candidate {
    path: PathBuf,
    size: u64,
    modified: SystemTime,
}

impl Probed {
    fn is_of(&self, file: &Candidate) -> bool {
        self.size == file.size && self.modified == file.modified
    }
}

/// What the probe threads and the scans share.
struct Shared {
    probe_program: PathBuf,
    cache: Mutex<HashMap<PathBuf, Probed>>,
    /// Notified whenever a probe answers.
    answered: Condvar,
}

impl Shared {
    fn cache(&self) -> MutexGuard<'_, HashMap<PathBuf, Probed>> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Finds plugins; remembers probe results across scans.
pub struct Discovery {
    shared: Arc<Shared>,
}

impl Discovery {
    /// A discovery that probes with `probe_program` (this daemon's own executable).
    pub fn new(probe_program: PathBuf) -> Self {
        Self {
            shared: Arc::new(Shared {
                probe_program,
                cache: Mutex::new(HashMap::new()),
                answered: Condvar::new(),
            }),
        }
    }

    /// Starts probing, in the background, every file of `plugin_path` that is not known yet,
    /// and returns at once.
    pub fn prefetch(&self, plugin_path: Option<&OsStr>) {
        for dir in candidates(plugin_path, true) {
            for file in &dir.files {
                self.probe_unless_known(file);
            }
        }
    }

    /// Scans the directories of `plugin_path` (separated by `;`) in order, files in name order,
    /// and returns the plugins with their ids. Everything skipped is logged.
    ///
    /// Files not known yet are probed in the background. The scan waits for probes that started
    /// less than [`PROBE_GRACE`] ago, at most until that time has passed; a file still being
    /// probed then is left out of this answer. The answer is read from the cache at one
    /// instant, so it is consistent.
    pub fn scan(&self, plugin_path: Option<&OsStr>) -> Vec<PluginEntry> {
        self.survey(plugin_path, true).plugins
    }

    /// What [`Discovery::scan`] finds, with every directory and every `.so` file it looked at
    /// and what became of each; logs what it skips when `log` is set.
    pub fn survey(&self, plugin_path: Option<&OsStr>, log: bool) -> Survey {
        let mut survey = Survey::default();
        if plugin_path.and_then(OsStr::to_str).is_none() {
            if log {
                warn!("UROM_PLUGIN_PATH is not set (or not UTF-8): no plugins to offer");
            }
            return survey;
        }
        let dirs = candidates(plugin_path, log);
        for file in dirs.iter().flat_map(|dir| &dir.files) {
            self.probe_unless_known(file);
        }
        let all: Vec<&Candidate> = dirs.iter().flat_map(|dir| &dir.files).collect();
        let cache = self.wait_for_fresh_probes(&all);
        for dir in dirs {
            let mut files = Vec::new();
            for (path, error) in dir.unreadable {
                files.push(FileSurvey {
                    name: file_name(&path),
                    path,
                    outcome: FileOutcome::Unreadable(error),
                });
            }
            for file in dir.files {
                let outcome = self.judge(&cache, &file, &mut survey.plugins, log);
                files.push(FileSurvey {
                    name: file_name(&file.path),
                    path: file.path,
                    outcome,
                });
            }
            survey.dirs.push(DirSurvey {
                path: dir.path,
                error: dir.error,
                files,
            });
        }
        survey
    }

    /// What becomes of `file`, given the probes in `cache` and the plugins taken so far (to
    /// which it is added when offered).
    fn judge(
        &self,
        cache: &HashMap<PathBuf, Probed>,
        file: &Candidate,
        plugins: &mut Vec<PluginEntry>,
        log: bool,
    ) -> FileOutcome {
        let version = match cache.get(&file.path) {
            Some(probed) if probed.is_of(file) => match &probed.state {
                ProbeState::Done(Ok(version)) => *version,
                ProbeState::Done(Err(reason)) => {
                    return FileOutcome::Refused(reason.clone());
                }
                ProbeState::Running { since } => {
                    if log {
                        info!(
                            path = %file.path.display(),
                            "still being probed after {:.1?}: not offered yet",
                            since.elapsed()
                        );
                    }
                    return FileOutcome::Probing;
                }
            },
            // Changed since this scan started probing it: the next scan will know.
            _ => return FileOutcome::Probing,
        };
        let path = &file.path;
        let name = file_name(path);
        if name.is_empty() || name.len() >= PLUGIN_NAME_MAX_LEN {
            if log {
                warn!(path = %path.display(), "plugin name must be 1 to {} bytes of UTF-8; skipped", PLUGIN_NAME_MAX_LEN - 1);
            }
            return FileOutcome::BadName { version };
        }
        if plugins.iter().any(|p| p.name == name) {
            if log {
                warn!(path = %path.display(), "a plugin named {name} was found earlier in UROM_PLUGIN_PATH; skipped");
            }
            return FileOutcome::DuplicateName { version };
        }
        let Some(id) = PluginId::from_index(plugins.len()) else {
            if log {
                warn!(path = %path.display(), "more than {MAX_PLUGINS} plugins: left out");
            }
            return FileOutcome::TooMany { version };
        };
        plugins.push(PluginEntry {
            id,
            version,
            name,
            path: path.clone(),
        });
        FileOutcome::Offered { id, version }
    }

    /// Starts a probe of `file` in the background unless this version of it is known or being
    /// probed already.
    fn probe_unless_known(&self, file: &Candidate) {
        let mut cache = self.shared.cache();
        if cache
            .get(&file.path)
            .is_some_and(|probed| probed.is_of(file))
        {
            return;
        }
        cache.insert(
            file.path.clone(),
            Probed {
                size: file.size,
                modified: file.modified,
                state: ProbeState::Running {
                    since: Instant::now(),
                },
            },
        );
        drop(cache);
        let shared = Arc::clone(&self.shared);
        let (path, size, modified) = (file.path.clone(), file.size, file.modified);
        let spawned = std::thread::Builder::new()
            .name("urom-probe".into())
            .spawn(move || {
                let outcome = probe(&shared.probe_program, &path);
                match &outcome {
                    Ok(version) => info!(path = %path.display(), version, "plugin found"),
                    Err(reason) => warn!(path = %path.display(), "not a usable plugin: {reason}"),
                }
                let mut cache = shared.cache();
                match cache.get_mut(&path) {
                    Some(probed) if probed.size == size && probed.modified == modified => {
                        probed.state = ProbeState::Done(outcome);
                    }
                    // The file changed meanwhile; a probe of its new version answers for it.
                    _ => {}
                }
                drop(cache);
                shared.answered.notify_all();
            });
        if let Err(e) = spawned {
            let reason = format!("cannot start a thread to probe it: {e}");
            warn!(path = %file.path.display(), "{reason}");
            if let Some(probed) = self.shared.cache().get_mut(&file.path) {
                probed.state = ProbeState::Done(Err(reason));
            }
        }
    }

    /// Waits until no probe of `files` that started less than [`PROBE_GRACE`] ago is still
    /// running; returns the cache, locked.
    fn wait_for_fresh_probes(
        &self,
        files: &[&Candidate],
    ) -> MutexGuard<'_, HashMap<PathBuf, Probed>> {
        let mut cache = self.shared.cache();
        loop {
            let now = Instant::now();
            let until = files
                .iter()
                .filter_map(|file| match cache.get(&file.path) {
                    Some(Probed {
                        state: ProbeState::Running { since },
                        ..
                    }) => Some(*since + PROBE_GRACE),
                    _ => None,
                })
                .filter(|&until| until > now)
                .min();
            let Some(until) = until else {
                return cache;
            };
            cache = self
                .shared
                .answered
                .wait_timeout(cache, until - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// The directories of `plugin_path`, in order, each with its `.so` files and their sizes and
/// modification times; what cannot be read is logged when `log` is set.
fn candidates(plugin_path: Option<&OsStr>, log: bool) -> Vec<DirCandidates> {
    let Some(plugin_path) = plugin_path.and_then(OsStr::to_str) else {
        return Vec::new();
    };
    let mut dirs = Vec::new();
    for dir in plugin_path.split(';').filter(|dir| !dir.is_empty()) {
        let mut found = DirCandidates {
            path: dir.into(),
            error: None,
            files: Vec::new(),
            unreadable: Vec::new(),
        };
        let paths = match shared_objects(Path::new(dir)) {
            Ok(paths) => paths,
            Err(e) => {
                if log {
                    warn!(dir, "plugin directory skipped: {e}");
                }
                found.error = Some(e.to_string());
                dirs.push(found);
                continue;
            }
        };
        for path in paths {
            match std::fs::metadata(&path) {
                Ok(metadata) => found.files.push(Candidate {
                    size: metadata.len(),
                    modified: metadata.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                    path,
                }),
                Err(e) => {
                    if log {
                        warn!(path = %path.display(), "cannot read plugin file: {e}; skipped");
                    }
                    found.unreadable.push((path, e.to_string()));
                }
            }
        }
        dirs.push(found);
    }
    dirs
}

/// The file name of `path` without `.so`, or empty when it is not UTF-8.
fn file_name(path: &Path) -> String {
    path.file_stem()
        .and_then(OsStr::to_str)
        .unwrap_or_default()
        .to_owned()
}

/// The last [`OUTPUT_TAIL`] bytes of what a probe printed, and how much it printed.
#[derive(Default)]
struct Tail {
    bytes: Vec<u8>,
    total: u64,
}

impl Tail {
    fn push(&mut self, data: &[u8]) {
        self.total += data.len() as u64;
        self.bytes.extend_from_slice(data);
        if self.bytes.len() > 2 * OUTPUT_TAIL {
            self.bytes.drain(..self.bytes.len() - OUTPUT_TAIL);
        }
    }

    fn text(&self) -> String {
        let start = self.bytes.len().saturating_sub(OUTPUT_TAIL);
        String::from_utf8_lossy(&self.bytes[start..]).into_owned()
    }
}

/// One of a probe's output pipes, read without blocking as output arrives.
struct Drained {
    pipe: Option<File>,
    tail: Tail,
}

impl Drained {
    fn new(pipe: Option<impl Into<OwnedFd>>) -> Self {
        let pipe = pipe
            .map(|pipe| File::from(pipe.into()))
            .filter(|pipe| fcntl(pipe, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).is_ok());
        Self {
            pipe,
            tail: Tail::default(),
        }
    }

    /// Reads whatever is there now; closes the pipe at its end.
    fn drain(&mut self) {
        let Some(pipe) = &mut self.pipe else {
            return;
        };
        let mut chunk = [0u8; 16 * 1024];
        loop {
            match pipe.read(&mut chunk) {
                Ok(0) => {
                    self.pipe = None;
                    return;
                }
                Ok(n) => self.tail.push(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => {
                    self.pipe = None;
                    return;
                }
            }
        }
    }
}

/// Waits up to `timeout` for output on either pipe.
fn wait_for_output(pipes: [&Drained; 2], timeout: Duration) {
    let mut fds: Vec<PollFd<'_>> = pipes
        .iter()
        .filter_map(|drained| drained.pipe.as_ref())
        .map(|pipe| PollFd::new(pipe.as_fd(), PollFlags::POLLIN))
        .collect();
    let timeout = PollTimeout::try_from(timeout).unwrap_or(PollTimeout::NONE);
    if fds.is_empty() {
        std::thread::sleep(PROBE_POLL);
    } else {
        let _ = poll(&mut fds, timeout);
    }
}

/// Runs the probe child for `path`, draining its output as it comes.
fn probe(probe_program: &Path, path: &Path) -> Result<u64, Refusal> {
    let mut child = Command::new(probe_program)
        .arg(PROBE_FLAG)
        .arg(path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start the probe {}: {e}", probe_program.display()))?;
    let mut answer = Drained::new(child.stdout.take());
    let mut output = Drained::new(child.stderr.take());
    let deadline = Instant::now() + PROBE_TIMEOUT;
    let waited = loop {
        answer.drain();
        output.drain();
        match child.try_wait() {
            Ok(Some(status)) => break Ok(status),
            Ok(None) if Instant::now() < deadline => {
                wait_for_output([&answer, &output], PROBE_POLL);
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                break Err(format!(
                    "hung while loading (killed after {PROBE_TIMEOUT:?})"
                ));
            }
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                break Err(format!("cannot wait for the probe: {e}"));
            }
        }
    };
    // What the child wrote before it ended is still in the pipes.
    answer.drain();
    output.drain();
    if output.tail.total > 0 {
        info!(
            path = %path.display(),
            "the plugin printed {} bytes while loading; the last {} were: {:?}",
            output.tail.total,
            output.tail.total.min(OUTPUT_TAIL as u64),
            output.tail.text()
        );
    }
    verdict(waited?, &answer.tail.text(), &output.tail)
}

/// What a probe that ended with `status`, having answered `answer`, says about the plugin.
fn verdict(status: ExitStatus, answer: &str, output: &Tail) -> Result<u64, Refusal> {
    if let Some(signal) = std::os::unix::process::ExitStatusExt::signal(&status) {
        return Err(format!("crashed while loading (signal {signal})"));
    }
    let answer = answer.trim();
    if let Some(reason) = answer.strip_prefix("refused ") {
        return Err(reason.to_owned());
    }
    let version = answer
        .strip_prefix("version ")
        .and_then(|version| version.parse().ok());
    if let (true, Some(version)) = (status.success(), version) {
        return Ok(version);
    }
    let last_line = output.text();
    let last_line = last_line
        .trim()
        .lines()
        .last()
        .unwrap_or_default()
        .to_owned();
    Err(match (status.success(), last_line.is_empty()) {
        (true, _) => format!("the probe answered {answer:?}"),
        (false, true) => format!("the probe failed with {status}"),
        (false, false) => format!("the probe failed with {status}: {last_line}"),
    })
}

/// The `.so` files of `dir`, in name order.
fn shared_objects(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(dir)?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension() == Some(OsStr::new("so")) && path.is_file())
        .collect();
    files.sort();
    Ok(files)
}

/// The probe child: load the plugin, answer with its version on standard output. Exit code 0
/// for a usable plugin.
///
/// Whatever the plugin prints on standard output goes to standard error instead, so that the
/// answer is the only thing on standard output.
pub fn probe_main(path: &Path) -> ExitCode {
    // A probe outlives no daemon, even one that stops while the plugin hangs.
    let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
    let answer = match nix::unistd::dup(io::stdout()) {
        Ok(answer) => answer,
        Err(e) => {
            eprintln!("cannot keep standard output for the answer: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = nix::unistd::dup2_stdout(io::stderr()) {
        eprintln!("cannot point standard output at standard error: {e}");
        return ExitCode::FAILURE;
    }
    let mut answer = File::from(answer);
    let (line, code) = match PluginLibrary::load(path) {
        Ok(library) => (format!("version {}", library.version()), ExitCode::SUCCESS),
        Err(e) => (format!("refused {e}"), ExitCode::FAILURE),
    };
    match writeln!(answer, "{line}") {
        Ok(()) => code,
        Err(_) => ExitCode::FAILURE,
    }
}
