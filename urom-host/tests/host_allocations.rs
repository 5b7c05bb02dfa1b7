//! The host API's hot path (submit, progress, complete, callback) allocates nothing after the
//! worker runs: a counting global allocator sees every allocation of this process.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use common::{run_worker, start_daemon, start_service};
use urom_graph::{GraphHost, loopback_result};
use urom_host::CompletedTask;
use urom_host::{ProgressEngine, Worker};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call unchanged to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

static COMPLETED: AtomicU64 = AtomicU64::new(0);

fn done(task: &CompletedTask<'_>) {
    let result = loopback_result(task).expect("the loopback succeeds");
    assert_eq!(result.data, result.cookie);
    COMPLETED.fetch_add(1, Ordering::Relaxed);
}

fn loopbacks(
    engine: &mut ProgressEngine,
    graph: &GraphHost,
    worker: &Worker<urom_host::Running>,
    count: u64,
) {
    let target = COMPLETED.load(Ordering::Relaxed) + count;
    for i in 0..count {
        while graph.loopback(worker, i, i, done).is_err() {
            engine.progress();
        }
        if i % 16 == 15 {
            engine.progress();
        }
    }
    while COMPLETED.load(Ordering::Relaxed) < target {
        engine.progress();
    }
}

#[test]
fn loopback_tasks_allocate_nothing_after_start() {
    let (_plugins, daemon) = start_daemon();
    let service = start_service(&daemon);
    let graph = urom_testkit::host::graph_host(&service);
    let mut engine = ProgressEngine::new();
    let worker = run_worker(
        &mut engine,
        Worker::new().set_service(&service).set_plugins(graph.id()),
    );
    loopbacks(&mut engine, &graph, &worker, 1_000);

    let before = ALLOCATIONS.load(Ordering::Relaxed);
    loopbacks(&mut engine, &graph, &worker, 20_000);
    let after = ALLOCATIONS.load(Ordering::Relaxed);
    assert_eq!(
        after - before,
        0,
        "allocations during 20,000 loopback tasks"
    );
}
