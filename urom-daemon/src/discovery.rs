//! Plugin discovery: scan `UROM_PLUGIN_PATH`, probe each `.so` in a short-lived child process,
//! give the plugins ids.
//!
//! Loading a library runs its code, so the daemon never loads a plugin itself: it runs itself
//! again as `urom-daemon --probe-plugin PATH`, which loads the library, checks both symbols,
//! the version and the interface, prints `version N` and exits. A plugin that crashes or hangs
//! on load only takes the probe down. Results are cached by path, size and modification time.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use tracing::{info, warn};
use urom_core::abi::PluginLibrary;
use urom_core::plugin_id::{MAX_PLUGINS, PluginId};
use urom_wire::control::PLUGIN_NAME_MAX_LEN;

/// The flag that runs the daemon as a plugin probe.
pub const PROBE_FLAG: &str = "--probe-plugin";
/// How long a probe may take before it is killed.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

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

#[derive(Clone)]
struct Probed {
    size: u64,
    modified: SystemTime,
    outcome: Result<u64, Refusal>,
}

/// Finds plugins; remembers probe results across scans.
pub struct Discovery {
    probe_program: PathBuf,
    cache: Mutex<HashMap<PathBuf, Probed>>,
}

impl Discovery {
    /// A discovery that probes with `probe_program` (this daemon's own executable).
    pub fn new(probe_program: PathBuf) -> Self {
        Self {
            probe_program,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// Scans the directories of `plugin_path` (separated by `;`) in order, files in name order,
    /// and returns the plugins with their ids. Everything skipped is logged.
    pub fn scan(&self, plugin_path: Option<&OsStr>) -> Vec<PluginEntry> {
        let mut plugins: Vec<PluginEntry> = Vec::new();
        let Some(plugin_path) = plugin_path.and_then(OsStr::to_str) else {
            warn!("UROM_PLUGIN_PATH is not set (or not UTF-8): no plugins to offer");
            return plugins;
        };
        for dir in plugin_path.split(';').filter(|dir| !dir.is_empty()) {
            for path in shared_objects(Path::new(dir)) {
                let Some(version) = self.probe_cached(&path) else {
                    continue;
                };
                let name = path
                    .file_stem()
                    .and_then(OsStr::to_str)
                    .unwrap_or_default()
                    .to_owned();
                if name.is_empty() || name.len() >= PLUGIN_NAME_MAX_LEN {
                    warn!(path = %path.display(), "plugin name must be 1 to {} bytes of UTF-8; skipped", PLUGIN_NAME_MAX_LEN - 1);
                    continue;
                }
                if plugins.iter().any(|p| p.name == name) {
                    warn!(path = %path.display(), "a plugin named {name} was found earlier in UROM_PLUGIN_PATH; skipped");
                    continue;
                }
                let Some(id) = PluginId::from_index(plugins.len()) else {
                    warn!(path = %path.display(), "more than {MAX_PLUGINS} plugins: left out");
                    continue;
                };
                plugins.push(PluginEntry {
                    id,
                    version,
                    name,
                    path,
                });
            }
        }
        plugins
    }

    /// The probe result for `path`, from the cache while the file is unchanged.
    fn probe_cached(&self, path: &Path) -> Option<u64> {
        let metadata = match std::fs::metadata(path) {
            Ok(metadata) => metadata,
            Err(e) => {
                warn!(path = %path.display(), "cannot read plugin file: {e}; skipped");
                return None;
            }
        };
        let size = metadata.len();
        let modified = metadata.modified().unwrap_or(SystemTime::UNIX_EPOCH);
        let cached = {
            let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            cache
                .get(path)
                .filter(|p| p.size == size && p.modified == modified)
                .cloned()
        };
        let probed = match cached {
            Some(probed) => probed,
            None => {
                let outcome = self.probe(path);
                match &outcome {
                    Ok(version) => info!(path = %path.display(), version, "plugin found"),
                    Err(reason) => warn!(path = %path.display(), "not a usable plugin: {reason}"),
                }
                let probed = Probed {
                    size,
                    modified,
                    outcome,
                };
                let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
                cache.insert(path.to_owned(), probed.clone());
                probed
            }
        };
        probed.outcome.ok()
    }

    /// Runs the probe child for `path`.
    fn probe(&self, path: &Path) -> Result<u64, Refusal> {
        let mut child = Command::new(&self.probe_program)
            .arg(PROBE_FLAG)
            .arg(path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                format!(
                    "cannot start the probe {}: {e}",
                    self.probe_program.display()
                )
            })?;
        let deadline = Instant::now() + PROBE_TIMEOUT;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!(
                        "hung while loading (killed after {PROBE_TIMEOUT:?})"
                    ));
                }
                Err(e) => return Err(format!("cannot wait for the probe: {e}")),
            }
        };
        let mut stdout = String::new();
        let mut stderr = String::new();
        if let Some(mut out) = child.stdout.take() {
            let _ = out.read_to_string(&mut stdout);
        }
        if let Some(mut err) = child.stderr.take() {
            let _ = err.read_to_string(&mut stderr);
        }
        if let Some(signal) = std::os::unix::process::ExitStatusExt::signal(&status) {
            return Err(format!("crashed while loading (signal {signal})"));
        }
        if !status.success() {
            let reason = stderr.trim();
            return Err(if reason.is_empty() {
                format!("the probe failed with {status}")
            } else {
                reason.to_owned()
            });
        }
        stdout
            .trim()
            .strip_prefix("version ")
            .and_then(|version| version.parse().ok())
            .ok_or_else(|| format!("the probe answered {stdout:?}"))
    }
}

/// The `.so` files of `dir`, in name order; a missing directory is logged.
fn shared_objects(dir: &Path) -> Vec<PathBuf> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            warn!(dir = %dir.display(), "plugin directory skipped: {e}");
            return Vec::new();
        }
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension() == Some(OsStr::new("so")) && path.is_file())
        .collect();
    files.sort();
    files
}

/// The probe child: load the plugin, print its version. Exit code 0 for a usable plugin.
pub fn probe_main(path: &Path) -> ExitCode {
    match PluginLibrary::load(path) {
        Ok(library) => {
            println!("version {}", library.version());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
