//! Allocations per command in a real worker process, counted by a preloaded allocator shim that
//! sees every `malloc` of the process: the worker's, the plugin's and the C library's.
//!
//! The worker runs twice with the same setup and different numbers of commands; the difference
//! in allocations, divided by the difference in commands, is the cost per command.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use urom_testkit::{TempDir, c_shared_object, cdylib};

const FEW: u64 = 1_000;
const MANY: u64 = 21_000;
const SIGTERM: i32 = 15;

fn shim() -> std::path::PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/malloc_count.c");
    c_shared_object(&source, "malloc_count", &[], &[])
}

/// Allocations of a worker process running `plugin` (`so_path:id` with id 1) through `count`
/// loopback commands. The worker has a daemon link, so its counters are published as it runs
/// (every so many commands and when idle) and read once at the end: that costs nothing per
/// command either.
fn allocations_for(plugin: &str, count: u64) -> u64 {
    let dir = TempDir::new("urom-allocations");
    let count_file = dir.path().join("count");
    let shim = shim();
    let (mut worker, mut link) = start_worker_with_link(
        &[plugin.to_owned()],
        &[],
        &[
            ("LD_PRELOAD", &shim),
            ("UROM_MALLOC_COUNT_FILE", &count_file),
        ],
    );
    pipelined_loopbacks(connect(&worker.socket), 0, count);
    let (counters, errors) = counters_after(&mut link, count);
    assert_eq!(counters.notifications, count);
    assert!(errors.is_empty(), "{errors:?}");
    worker.child.signal(SIGTERM);
    let status = worker
        .child
        .wait_timeout(Duration::from_secs(30))
        .expect("worker did not stop");
    assert!(status.success(), "{status}");
    std::fs::read_to_string(&count_file)
        .expect("the shim reports at exit")
        .trim()
        .parse()
        .unwrap()
}

fn per_command(plugin: &str) -> f64 {
    let few = allocations_for(plugin, FEW);
    let many = allocations_for(plugin, MANY);
    let per_command = (many as f64 - few as f64) / (MANY - FEW) as f64;
    println!(
        "{plugin}: {few} allocations for {FEW} commands, {many} for {MANY}: {per_command:.4} per command"
    );
    per_command
}

#[test]
fn the_native_path_allocates_nothing_per_command() {
    let graph = cdylib("urom-plugin-graph", "worker_graph");
    let per_command = per_command(&format!("{}:1", graph.display()));
    assert!(per_command < 0.001, "{per_command} allocations per command");
}

#[test]
fn the_doca_path_allocates_descriptors_and_the_count_sees_them() {
    // The C loopback plugin takes the DOCA path: a command descriptor and a notification
    // descriptor per command. Seeing them proves the count covers plugin allocations.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let plugin = c_shared_object(
        &root.join("plugins/c-loopback/loopback.c"),
        "c_loopback_for_allocations",
        &[&root.join("plugins/include")],
        &[],
    );
    let per_command = per_command(&format!("{}:1", plugin.display()));
    assert!(
        (1.9..2.1).contains(&per_command),
        "{per_command} allocations per command"
    );
}
