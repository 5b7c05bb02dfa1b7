//! What the host API tests share: a real daemon with the graph and faulty plugins; services and
//! workers on it come from `urom_testkit::host`.
#![allow(dead_code, unused_imports)]

use urom_testkit::daemon::{self, Daemon, plugin_dir};
pub use urom_testkit::host::{TIMEOUT, run_worker, start_service};
use urom_testkit::{TempDir, binary};

/// A daemon offering the graph and faulty plugins.
pub fn start_daemon() -> (TempDir, Daemon) {
    daemon::graph_and_faulty(&[])
}
