//! What the host API tests share: a real daemon with the graph and faulty plugins; services and
//! workers on it come from `urom_testkit::host`.
#![allow(dead_code, unused_imports)]

use urom_testkit::daemon::{self, Daemon, plugin_dir};
pub use urom_testkit::host::{TIMEOUT, run_worker, start_service};
use urom_testkit::{TempDir, binary};

/// A daemon offering the graph and faulty plugins.
pub fn start_daemon() -> (TempDir, Daemon) {
    let plugins = TempDir::new("urom-host-plugins");
    let dir = plugin_dir(
        &plugins,
        &[
            ("urom-plugin-graph", "worker_graph"),
            ("urom-plugin-faulty", "worker_faulty"),
        ],
    );
    let daemon = daemon::start_daemon(
        binary("urom-daemon", "urom-daemon"),
        dir.to_str().unwrap(),
        &[],
        true,
    );
    (plugins, daemon)
}
