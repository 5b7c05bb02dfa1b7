//! A host that stops taking its notifications never holds up the worker's other hosts, and gets
//! every one of them, once, when it comes back.
//!
//! `cargo test` pauses the slow host for 3 s; with `UROM_LONG_TESTS=1` also for 15 and 40 s
//! (`chaos/run.sh` sets it, and runs the chaos suite's slow hosts beside).

mod common;

use std::time::Duration;

use common::{GRAPH_ID, graph_and_faulty};
use urom_testkit::worker::pause_and_come_back;

/// Commands the slow host leaves in flight: more than its notification ring holds.
const IN_FLIGHT: u64 = 512;

fn pause_and_check(pause: Duration) {
    let worker = common::start_worker(&graph_and_faulty(), &[]);
    let run = pause_and_come_back(&worker.socket, GRAPH_ID, IN_FLIGHT, pause);
    let (median, worst) = run.median_and_worst();
    println!(
        "slow host paused {pause:?} with {IN_FLIGHT} commands in flight; meanwhile the other \
         host made {} round trips: median {median:?}, worst {worst:?}",
        run.round_trips.len()
    );
    assert!(
        !run.round_trips.is_empty(),
        "the other host made no round trip"
    );
    assert_eq!(run.errors, 0, "the slow host's tasks failed");
    assert!(
        run.answered.iter().all(|&count| count == 1),
        "every task answered exactly once: {:?}",
        run.answered
    );
    assert!(!run.more, "the slow host got more than its notifications");
    println!("the slow host then received all {IN_FLIGHT} notifications, each once");
}

fn long_tests() -> bool {
    std::env::var_os("UROM_LONG_TESTS").is_some_and(|v| v == "1")
}

#[test]
fn a_host_paused_3s_holds_up_no_one_and_loses_nothing() {
    pause_and_check(Duration::from_secs(3));
}

#[test]
fn a_host_paused_15s_and_40s_holds_up_no_one_and_loses_nothing() {
    if !long_tests() {
        urom_testkit::skip("set UROM_LONG_TESTS=1 to pause hosts for 15 and 40 s");
        return;
    }
    pause_and_check(Duration::from_secs(15));
    pause_and_check(Duration::from_secs(40));
}
