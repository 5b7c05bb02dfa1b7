//! What the worker tests share: starting this package's worker program; the rest (connecting
//! hosts, exchanging commands and notifications) is `urom_testkit::worker`'s.
#![allow(dead_code, unused_imports)]

use std::path::Path;

pub use urom_testkit::worker::{
    FAULTY_ID, GRAPH_ID, RunningWorker, TIMEOUT, connect, graph_and_faulty, log_file, loopback,
    next_notification, pipelined_loopbacks, send_command,
};

pub const SIGTERM: i32 = 15;

/// Starts a worker with `plugins` (`so_path:id`) and extra flags.
pub fn start_worker(plugins: &[String], extra: &[&str]) -> RunningWorker {
    start_worker_with_env(plugins, extra, &[])
}

/// Starts a worker with `plugins`, extra flags and extra environment variables.
pub fn start_worker_with_env(
    plugins: &[String],
    extra: &[&str],
    env: &[(&str, &Path)],
) -> RunningWorker {
    urom_testkit::worker::start_worker(
        Path::new(env!("CARGO_BIN_EXE_urom-worker")),
        plugins,
        extra,
        env,
    )
}
