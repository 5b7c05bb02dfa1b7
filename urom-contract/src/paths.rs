//! Where the daemon's socket is when nothing says otherwise; the daemon, the host library and
//! `urom-ctl` all look here.

use std::path::{Path, PathBuf};

/// Where the daemon's socket is when nothing says otherwise: `/run/urom/urom.sock`, else
/// `$XDG_RUNTIME_DIR/urom/urom.sock`, else `/tmp/urom-<uid>/urom.sock`, the first whose
/// directory exists or can be created and written. The daemon picks its socket the same way.
pub fn default_service_socket() -> PathBuf {
    let uid = nix::unistd::geteuid().as_raw();
    let fallback = std::env::temp_dir().join(format!("urom-{uid}"));
    let candidates = [
        Some(PathBuf::from("/run/urom")),
        std::env::var_os("XDG_RUNTIME_DIR").map(|dir| PathBuf::from(dir).join("urom")),
        Some(fallback.clone()),
    ];
    candidates
        .into_iter()
        .flatten()
        .find(|dir| writable_dir(dir))
        .unwrap_or(fallback)
        .join("urom.sock")
}

/// Whether `dir` exists or can be created, and a file can be written in it.
pub fn writable_dir(dir: &Path) -> bool {
    if std::fs::create_dir_all(dir).is_err() {
        return false;
    }
    let probe = dir.join(format!(".urom-write-test-{}", std::process::id()));
    let writable = std::fs::write(&probe, b"").is_ok();
    let _ = std::fs::remove_file(&probe);
    writable
}
