//! Logging (`doca_log.h`): sources, backends and levels, for the program's messages and for the
//! libraries' own ("SDK") messages.
//!
//! A program registers each source file (`DOCA_LOG_REGISTER`) and logs through `DOCA_LOG_*`,
//! which format the message in the caller and hand it to `app`. Application backends show the
//! messages whose level lies between their upper limit (the most severe shown; default critical)
//! and their lower limit (the most verbose; default info). The standard backend writes info and
//! more verbose messages to stdout and warnings and more severe ones to stderr. SDK backends show
//! urom's own messages (why a service did not start, why a worker failed) up to their level;
//! while none exists, urom's errors and critical messages go to stderr, so that no failure is
//! silent.
//!
//! A line reads `[HH:MM:SS:micro][pid][DOCA][LVL][file:line][function] message` for the
//! program's messages and `[HH:MM:SS:micro][pid][DOCA][LVL][urom::source] message` for urom's.

use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::{Mutex, MutexGuard};

use urom_capi_abi::{Status, level};

use crate::ffi;

pub(crate) use level::{CRIT, DEBUG, DISABLE, ERROR, INFO, TRACE, WARNING};

/// The most backends of each kind.
pub(crate) const MAX_BACKENDS: usize = 16;

/// Where a backend writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sink {
    Stdout,
    Stderr,
    /// A C `FILE *` (its address).
    File(usize),
    /// A file descriptor.
    Fd(i32),
}

/// An application backend.
#[derive(Debug, Clone, Copy)]
struct AppBackend {
    sink: Sink,
    lower: u32,
    upper: u32,
    lower_strict: bool,
    upper_strict: bool,
    /// The standard pair's two halves cannot be changed.
    fixed: bool,
}

/// An SDK backend.
#[derive(Debug, Clone, Copy)]
struct SdkBackend {
    sink: Sink,
    level: u32,
}

/// Which backend a `struct doca_log_backend *` names: its kind and index, plus one (so that no
/// handle is null).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handle {
    App(usize),
    Sdk(usize),
}

impl Handle {
    pub(crate) fn to_raw(self) -> usize {
        match self {
            Self::App(i) => (i + 1) << 1,
            Self::Sdk(i) => ((i + 1) << 1) | 1,
        }
    }

    pub(crate) fn from_raw(raw: usize) -> Option<Self> {
        let index = (raw >> 1).checked_sub(1)?;
        Some(if raw & 1 == 0 {
            Self::App(index)
        } else {
            Self::Sdk(index)
        })
    }
}

struct State {
    sources: Vec<String>,
    app: Vec<AppBackend>,
    sdk: Vec<SdkBackend>,
    global_lower: u32,
    global_upper: u32,
    global_sdk: u32,
}

static STATE: Mutex<State> = Mutex::new(State {
    sources: Vec::new(),
    app: Vec::new(),
    sdk: Vec::new(),
    global_lower: INFO,
    global_upper: CRIT,
    global_sdk: INFO,
});

fn state() -> MutexGuard<'static, State> {
    STATE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Whether `level` is a level a message or limit may have.
pub(crate) fn valid_level(level: u32) -> bool {
    (DISABLE..=TRACE).contains(&level) && level % 10 == 0
}

fn check_level(level: u32) -> Result<(), Status> {
    if valid_level(level) {
        Ok(())
    } else {
        Err(Status::InvalidValue)
    }
}

/// `doca_log_register_source()`.
pub(crate) fn register_source(name: &str) -> Result<i32, Status> {
    let mut state = state();
    let name: String = name.chars().take(255).collect();
    if let Some(index) = state.sources.iter().position(|s| *s == name) {
        return i32::try_from(index).map_err(|_| Status::NoMemory);
    }
    let index = i32::try_from(state.sources.len()).map_err(|_| Status::NoMemory)?;
    state.sources.push(name);
    Ok(index)
}

fn add_app(state: &mut State, sink: Sink, fixed: bool) -> Result<Handle, Status> {
    if state.app.len() >= MAX_BACKENDS {
        return Err(Status::NoMemory);
    }
    state.app.push(AppBackend {
        sink,
        lower: state.global_lower,
        upper: state.global_upper,
        lower_strict: false,
        upper_strict: false,
        fixed,
    });
    Ok(Handle::App(state.app.len() - 1))
}

/// An application backend writing to `sink`.
pub(crate) fn create_app(sink: Sink) -> Result<Handle, Status> {
    add_app(&mut state(), sink, false)
}

/// `doca_log_backend_create_standard()`: info and more verbose to stdout, warnings and more
/// severe to stderr.
pub(crate) fn create_standard() -> Result<(), Status> {
    let mut state = state();
    if state.app.len() + 2 > MAX_BACKENDS {
        return Err(Status::NoMemory);
    }
    let out = add_app(&mut state, Sink::Stdout, true)?;
    let err = add_app(&mut state, Sink::Stderr, true)?;
    if let Handle::App(i) = out {
        state.app[i].upper = INFO;
    }
    if let Handle::App(i) = err {
        state.app[i].lower = WARNING;
    }
    Ok(())
}

/// An SDK backend writing to `sink`.
pub(crate) fn create_sdk(sink: Sink) -> Result<Handle, Status> {
    let mut state = state();
    if state.sdk.len() >= MAX_BACKENDS {
        return Err(Status::NoMemory);
    }
    let level = state.global_sdk;
    state.sdk.push(SdkBackend { sink, level });
    Ok(Handle::Sdk(state.sdk.len() - 1))
}

/// Which limit of an application backend to set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Limit {
    Lower,
    Upper,
}

/// Sets a limit of an application backend.
pub(crate) fn set_app_limit(handle: Handle, limit: Limit, value: u32) -> Result<(), Status> {
    check_level(value)?;
    let mut state = state();
    let Handle::App(index) = handle else {
        return Err(Status::InvalidValue);
    };
    let backend = state.app.get_mut(index).ok_or(Status::InvalidValue)?;
    if backend.fixed {
        return Err(Status::NotPermitted);
    }
    match limit {
        Limit::Lower => backend.lower = value,
        Limit::Upper => backend.upper = value,
    }
    Ok(())
}

/// Marks a limit of an application backend as strict: global changes leave it alone.
pub(crate) fn set_app_strict(handle: Handle, limit: Limit) -> Result<(), Status> {
    let mut state = state();
    let Handle::App(index) = handle else {
        return Err(Status::InvalidValue);
    };
    let backend = state.app.get_mut(index).ok_or(Status::InvalidValue)?;
    match limit {
        Limit::Lower => backend.lower_strict = true,
        Limit::Upper => backend.upper_strict = true,
    }
    Ok(())
}

/// Sets a global limit for application messages and every backend's limit that is not strict.
pub(crate) fn set_global_limit(limit: Limit, value: u32) -> Result<(), Status> {
    check_level(value)?;
    let mut state = state();
    match limit {
        Limit::Lower => state.global_lower = value,
        Limit::Upper => state.global_upper = value,
    }
    for backend in state.app.iter_mut().filter(|b| !b.fixed) {
        match limit {
            Limit::Lower if !backend.lower_strict => backend.lower = value,
            Limit::Upper if !backend.upper_strict => backend.upper = value,
            _ => {}
        }
    }
    // The standard pair splits at info/warning; only its outer limits follow.
    for backend in state.app.iter_mut().filter(|b| b.fixed) {
        match (limit, backend.sink) {
            (Limit::Lower, Sink::Stdout) => backend.lower = value,
            (Limit::Upper, Sink::Stderr) => backend.upper = value,
            _ => {}
        }
    }
    Ok(())
}

pub(crate) fn global_limit(limit: Limit) -> u32 {
    let state = state();
    match limit {
        Limit::Lower => state.global_lower,
        Limit::Upper => state.global_upper,
    }
}

/// Sets an SDK backend's level.
pub(crate) fn set_sdk_level(handle: Handle, value: u32) -> Result<(), Status> {
    check_level(value)?;
    let mut state = state();
    let Handle::Sdk(index) = handle else {
        return Err(Status::InvalidValue);
    };
    state.sdk.get_mut(index).ok_or(Status::InvalidValue)?.level = value;
    Ok(())
}

/// Sets the SDK level of every SDK backend and of those created later.
pub(crate) fn set_global_sdk(value: u32) -> Result<(), Status> {
    check_level(value)?;
    let mut state = state();
    state.global_sdk = value;
    for backend in &mut state.sdk {
        backend.level = value;
    }
    Ok(())
}

pub(crate) fn global_sdk() -> u32 {
    state().global_sdk
}

fn shows(level: u32, lower: u32, upper: u32) -> bool {
    level > DISABLE && level <= lower && level >= upper
}

/// Whether any application backend would show a message of `level`.
pub(crate) fn app_enabled(level: u32) -> bool {
    state().app.iter().any(|b| shows(level, b.lower, b.upper))
}

fn level_name(level: u32) -> &'static str {
    match level {
        CRIT => "CRIT",
        ERROR => "ERR",
        WARNING => "WARN",
        INFO => "INFO",
        DEBUG => "DBG",
        _ => "TRC",
    }
}

fn prefix(level: u32) -> String {
    let (h, m, s, micros) = ffi::local_time();
    format!(
        "[{h:02}:{m:02}:{s:02}:{micros:06}][{}][DOCA][{}]",
        std::process::id(),
        level_name(level)
    )
}

fn write(sink: Sink, line: &[u8]) {
    match sink {
        Sink::Stdout => {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(line);
            let _ = out.flush();
        }
        Sink::Stderr => {
            let _ = std::io::stderr().lock().write_all(line);
        }
        Sink::File(file) => ffi::write_file(file, line),
        Sink::Fd(fd) => ffi::write_fd(fd, line),
    }
}

/// Logs a program's message (formatted by the caller): `DOCA_ERROR_INVALID_VALUE` for an
/// unregistered source or a bad level.
pub(crate) fn app(
    level: u32,
    source: i32,
    file: &str,
    line: i32,
    func: &str,
    message: &str,
) -> Result<(), Status> {
    check_level(level)?;
    let state = state();
    usize::try_from(source)
        .ok()
        .filter(|&s| s < state.sources.len())
        .ok_or(Status::InvalidValue)?;
    let sinks: Vec<Sink> = state
        .app
        .iter()
        .filter(|b| shows(level, b.lower, b.upper))
        .map(|b| b.sink)
        .collect();
    drop(state);
    if sinks.is_empty() {
        return Ok(());
    }
    let base = file.rsplit('/').next().unwrap_or(file);
    let mut text = prefix(level);
    let _ = writeln!(text, "[{base}:{line}][{func}] {message}");
    for sink in sinks {
        write(sink, text.as_bytes());
    }
    Ok(())
}

/// Logs one of urom's own messages from `source` (a short name: `service`, `worker`).
pub(crate) fn sdk(level: u32, source: &str, message: &str) {
    let state = state();
    let mut sinks: Vec<Sink> = state
        .sdk
        .iter()
        .filter(|b| level > DISABLE && level <= b.level)
        .map(|b| b.sink)
        .collect();
    if state.sdk.is_empty() && level <= ERROR {
        sinks.push(Sink::Stderr);
    }
    drop(state);
    if sinks.is_empty() {
        return;
    }
    let mut text = prefix(level);
    let _ = writeln!(text, "[urom::{source}] {message}");
    for sink in sinks {
        write(sink, text.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_name_their_backend() {
        for handle in [
            Handle::App(0),
            Handle::App(5),
            Handle::Sdk(0),
            Handle::Sdk(9),
        ] {
            assert_ne!(handle.to_raw(), 0);
            assert_eq!(Handle::from_raw(handle.to_raw()), Some(handle));
        }
        assert_eq!(Handle::from_raw(0), None);
        assert_eq!(Handle::from_raw(1), None);
    }

    #[test]
    fn limits_select_levels() {
        assert!(shows(INFO, INFO, CRIT));
        assert!(shows(CRIT, INFO, CRIT));
        assert!(!shows(DEBUG, INFO, CRIT));
        assert!(!shows(ERROR, INFO, INFO));
        assert!(valid_level(WARNING) && !valid_level(45) && !valid_level(80));
    }
}
