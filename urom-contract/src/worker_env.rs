//! Which environment entries a host may give a new worker.
//!
//! A host asks for its worker's environment (`NAME=value` entries), and the worker may run with
//! more rights than the host (the daemon's user, when the daemon cannot switch users). Entries
//! that change how a program is loaded or how the C library behaves would let a host run its
//! own code, or read and write files, with those rights; they are refused for every host, root
//! included. The rule follows the variables glibc strips from the environment of set-user-id
//! programs (`sysdeps/generic/unsecvars.h`), widened to whole families: every `LD_*` (the
//! dynamic loader's, `LD_PRELOAD`, `LD_LIBRARY_PATH`, `LD_AUDIT`...) and every `MALLOC_*`.
//! Anything else (`PATH`, `UCX_*`, `CUDA_*`, a plugin's own settings) is passed on.
//!
//! The daemon applies the rule ([`check_entry`]) before it starts a worker, and the host library
//! applies the same rule before it asks, to fail early.

use core::fmt;

/// Families of variables refused by prefix: the dynamic loader's and malloc's.
pub const REFUSED_PREFIXES: &[&str] = &["LD_", "MALLOC_"];

/// Variables refused by name: glibc's list for set-user-id programs, less those the prefixes
/// already cover.
pub const REFUSED_NAMES: &[&str] = &[
    "GCONV_PATH",
    "GETCONF_DIR",
    "GLIBC_TUNABLES",
    "HOSTALIASES",
    "LOCALDOMAIN",
    "LOCPATH",
    "NIS_PATH",
    "NLSPATH",
    "RESOLV_HOST_CONF",
    "RES_OPTIONS",
    "TMPDIR",
    "TZDIR",
];

/// Whether the variable `name` may not be set for a worker.
pub fn is_refused(name: &str) -> bool {
    REFUSED_PREFIXES
        .iter()
        .any(|prefix| name.starts_with(prefix))
        || REFUSED_NAMES.contains(&name)
}

/// Checks one `NAME=value` entry (an entry without `=` is checked as a name).
pub fn check_entry(entry: &str) -> Result<(), WorkerEnvError> {
    let name = entry.split_once('=').map_or(entry, |(name, _)| name);
    if is_refused(name) {
        return Err(WorkerEnvError {
            name: name.to_owned(),
        });
    }
    Ok(())
}

/// A worker's environment entry that changes how programs load or run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerEnvError {
    /// The variable's name.
    pub name: String,
}

impl fmt::Display for WorkerEnvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "environment variable {} may not be set for a worker: it changes how programs load \
             or run",
            self.name
        )
    }
}

impl std::error::Error for WorkerEnvError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loader_and_libc_variables_are_refused_by_name() {
        for entry in [
            "LD_PRELOAD=/home/u/evil.so",
            "LD_LIBRARY_PATH=/tmp",
            "LD_AUDIT=x.so",
            "LD_BIND_NOW=1",
            "MALLOC_ARENA_MAX=2",
            "MALLOC_CHECK_=3",
            "GCONV_PATH=/tmp",
            "GLIBC_TUNABLES=glibc.malloc.check=3",
            "HOSTALIASES=/tmp/h",
            "RES_OPTIONS=debug",
            "TMPDIR=/tmp/x",
            "NLSPATH=/tmp/%N",
        ] {
            let name = entry.split_once('=').unwrap().0;
            let error = check_entry(entry).unwrap_err();
            assert_eq!(error.name, name);
            assert!(error.to_string().contains(name), "{error}");
        }
        assert!(check_entry("LD_PRELOAD").is_err());
    }

    #[test]
    fn other_variables_pass() {
        for entry in [
            "PATH=/usr/bin",
            "UCX_TLS=rc",
            "UROM_GREETING=LD_PRELOAD=x",
            "OLD_PRELOAD=1",
            "ld_preload=x",
            "TZ=UTC",
            "MALLOC=1",
        ] {
            assert_eq!(check_entry(entry), Ok(()), "{entry}");
        }
    }
}
