//! The submission rule against a real worker: within the worker's max in-flight tasks,
//! `Worker::submit` and `Worker::submit_batch` never refuse a command for want of room on the
//! channel (whose ring holds 256 frames); what the channel cannot take waits in the task slots
//! and goes in order. Only a task beyond the limit is refused (`CommandError::Exhausted`).
//!
//! Each test keeps `IN_FLIGHT` loopbacks in flight without a retry loop: the first `IN_FLIGHT`
//! in one batch, then one more for each completion, alternately one at a time and in batches;
//! every submission must succeed. 1,000,000 loopbacks in a release build (`cargo test
//! --release`), 100,000 in a debug build (whose unoptimised host and worker take about ten
//! times as long); each completes once, successfully, in submission order.

mod common;

use std::cell::RefCell;
use std::time::Instant;

use common::{TIMEOUT, run_worker, start_daemon, start_service};
use urom_graph::loopback_result;
use urom_host::{CommandError, CompletedTask, ProgressEngine, Worker, WorkerState};

const TOTAL: u64 = if cfg!(debug_assertions) {
    100_000
} else {
    1_000_000
};

thread_local! {
    /// The cookies of the loopbacks completed since the last look, and whether all succeeded.
    static DONE: RefCell<(Vec<u64>, bool)> = const { RefCell::new((Vec::new(), true)) };
}

fn record(task: &CompletedTask<'_>) {
    DONE.with(|done| {
        let mut done = done.borrow_mut();
        match loopback_result(task) {
            Ok(result) if result.data == result.cookie => done.0.push(result.cookie),
            _ => done.1 = false,
        }
    });
}

fn keep_in_flight(in_flight: usize) {
    let (_plugins, daemon) = start_daemon();
    let service = start_service(&daemon);
    let graph = urom_testkit::host::graph_host(&service);
    let mut engine = ProgressEngine::new();
    let worker = run_worker(
        &mut engine,
        Worker::new()
            .set_service(&service)
            .set_plugins(graph.id())
            .set_max_inflight_tasks(in_flight),
    );
    DONE.with(|done| *done.borrow_mut() = (Vec::with_capacity(in_flight), true));

    // The limit, all at once: more than the channel holds when above 256.
    let first = in_flight.min(TOTAL as usize);
    assert_eq!(
        graph.loopback_batch(&worker, 0, first, record),
        Ok(first),
        "the first {first} went in one batch"
    );
    let mut sent = first as u64;
    // One beyond the limit is refused.
    assert_eq!(
        graph.loopback(&worker, u64::MAX, u64::MAX, record).err(),
        Some(CommandError::Exhausted)
    );

    let mut seen = vec![false; TOTAL as usize];
    let mut next = 0u64;
    let mut alternate = false;
    let deadline = Instant::now() + TIMEOUT * 20;
    while next < TOTAL {
        engine.progress();
        let (completed, ok) = DONE.with(|done| {
            let mut done = done.borrow_mut();
            let completed: Vec<u64> = done.0.drain(..).collect();
            (completed, done.1)
        });
        assert!(ok, "a loopback failed");
        for cookie in &completed {
            assert_eq!(*cookie, next, "completed in submission order");
            assert!(!seen[*cookie as usize], "loopback {cookie} completed twice");
            seen[*cookie as usize] = true;
            next += 1;
        }
        // As many new ones as completed, without a retry: each submission must succeed.
        let want = (completed.len() as u64).min(TOTAL - sent) as usize;
        if want > 0 {
            alternate = !alternate;
            if alternate {
                for i in 0..want as u64 {
                    let value = sent + i;
                    graph
                        .loopback(&worker, value, value, record)
                        .unwrap_or_else(|e| panic!("loopback {value} refused: {e}"));
                }
            } else {
                assert_eq!(
                    graph.loopback_batch(&worker, sent, want, record),
                    Ok(want),
                    "a batch of {want} from {sent}"
                );
            }
            sent += want as u64;
        }
        assert!(
            Instant::now() < deadline,
            "{next} of {TOTAL} loopbacks completed in time"
        );
    }
    assert!(seen.iter().all(|seen| *seen), "every loopback completed");
    assert_eq!(sent, TOTAL);
    assert_eq!(worker.state(), WorkerState::Running);
    drop(worker);
    service.stop();
}

#[test]
fn one_in_flight_never_refused() {
    keep_in_flight(1);
}

#[test]
fn sixty_four_in_flight_never_refused() {
    keep_in_flight(64);
}

#[test]
fn four_thousand_in_flight_never_refused_though_the_channel_holds_256() {
    keep_in_flight(4096);
}
