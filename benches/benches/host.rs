//! Graph loopbacks through the host API beside the worker-level round trip, in one run:
//!
//! * `host/worker_round_trip_64B`: a 64-byte loopback command frame written by hand to a worker
//!   process started directly, and its notification back (the worker bench's native path);
//! * `host/api_round_trip_64B`: the same loopback through the host API (task from its slots,
//!   graph pack, submit, progress, completion callback) to a worker the daemon spawned.
//!
//! Both workers run on core 1 and nap when not served; this process runs on core 0. After the
//! criterion runs, batches alternate between the two and the median of the per-batch ratios is
//! printed: the comparison to trust on a VM. `cargo bench -p urom-benches --bench host`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use criterion::Criterion;
use urom_benches::{
    HOST_CORE, PEER_CORE, batch_median, loopback_frame, median, round_trip, worker,
};
use urom_graph::GraphHost;
use urom_host::CompletedTask;
use urom_host::{Idle, ProgressEngine, Running, Service, Worker};
use urom_testkit::daemon::{plugin_dir, start_daemon};
use urom_testkit::{TempDir, binary, cdylib};

const BATCHES: usize = 200;

static ANSWERED: AtomicBool = AtomicBool::new(false);

fn answered(_task: &CompletedTask<'_>) {
    ANSWERED.store(true, Ordering::Relaxed);
}

/// One loopback through the host API, progressing until its callback ran.
fn api_round_trip(engine: &mut ProgressEngine, graph: &GraphHost, worker: &Worker<Running>) {
    ANSWERED.store(false, Ordering::Relaxed);
    graph.loopback(worker, 7, 42, answered).expect("submit");
    while !ANSWERED.load(Ordering::Relaxed) {
        engine.progress();
    }
}

fn main() {
    let dir = TempDir::new("urom-host-bench");
    let graph_path = cdylib("urom-plugin-graph", "worker_graph");
    let plugins = plugin_dir(&dir, &[("urom-plugin-graph", "worker_graph")]);
    // Started before this process pins itself, so that the daemon may use every core.
    let daemon = start_daemon(
        binary("urom-daemon", "urom-daemon"),
        plugins.to_str().unwrap(),
        &["--log-level", "30", "--sdk-log-level", "30"],
        true,
    );
    let socket = daemon.socket.clone();
    urom_transport::sys::pin_current_thread(HOST_CORE).expect("pinning the benchmark");
    let service = Service::<Idle>::new()
        .set_socket(&socket)
        .start()
        .map_err(|(_, e)| e)
        .unwrap();
    let graph = urom_testkit::host::graph_host(&service);
    let mut engine = ProgressEngine::new();
    let worker_config = Worker::new()
        .set_service(&service)
        .set_plugins(graph.id())
        .set_cpuset([PEER_CORE].into_iter().collect());
    let api_worker = worker_config
        .start(&mut engine)
        .map_err(|(_, e)| e)
        .unwrap()
        .wait_running(&mut engine, Duration::from_secs(60))
        .unwrap_or_else(|progress| panic!("the worker did not run: {progress:?}"));
    let (_raw_worker, mut raw) = worker(&dir, "raw", &graph_path, false);
    let frame = loopback_frame();

    let mut criterion = Criterion::default().configure_from_args();
    let mut group = criterion.benchmark_group("host");
    group.bench_function("worker_round_trip_64B", |b| {
        b.iter(|| round_trip(&mut raw, &frame))
    });
    group.bench_function("api_round_trip_64B", |b| {
        b.iter(|| api_round_trip(&mut engine, &graph, &api_worker))
    });
    group.finish();
    criterion.final_summary();

    let mut rows = Vec::with_capacity(BATCHES);
    for _ in 0..BATCHES {
        let raw_ns = batch_median(|| round_trip(&mut raw, &frame));
        let api_ns = batch_median(|| api_round_trip(&mut engine, &graph, &api_worker));
        rows.push([raw_ns, api_ns, api_ns / raw_ns]);
    }
    let column = |i: usize| median(&mut rows.iter().map(|row| row[i]).collect::<Vec<_>>());
    println!();
    println!("interleaved: {BATCHES} batches of worker-level / host API round trips, medians");
    println!("  worker-level loopback round trip    {:8.1} ns", column(0));
    println!("  host API loopback round trip        {:8.1} ns", column(1));
    println!("  host API / worker-level, per batch  {:8.2}", column(2));
}
