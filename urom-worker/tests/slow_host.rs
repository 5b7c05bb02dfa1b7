//! A host that stops taking its notifications never holds up the worker's other hosts, and gets
//! every one of them, once, when it comes back.
//!
//! `cargo test` pauses the slow host for 3 s; with `UROM_LONG_TESTS=1` also for 15 and 40 s
//! (`tests/chaos.sh` sets it).

mod common;

use std::time::{Duration, Instant};

use common::{GRAPH_ID, connect, graph_and_faulty, loopback, next_notification, send_command};
use urom_core::transport::Transport;
use urom_wire::Status;

/// Commands the slow host leaves in flight: more than its notification ring holds.
const IN_FLIGHT: u64 = 512;

fn pause_and_come_back(pause: Duration) {
    let worker = common::start_worker(&graph_and_faulty(), &[]);
    let mut slow = connect(&worker.socket);
    let mut quick = connect(&worker.socket);

    for task in 0..IN_FLIGHT {
        send_command(&mut slow, task, GRAPH_ID, task, &loopback(task));
    }
    // The slow host now takes nothing for `pause`; the quick one measures its round trips.
    let start = Instant::now();
    let mut round_trips = Vec::new();
    let mut seq = 0;
    while start.elapsed() < pause {
        seq += 1;
        let sent = Instant::now();
        send_command(&mut quick, seq, GRAPH_ID, seq, &loopback(seq));
        let (plugin, context, status, _) = next_notification(&mut quick);
        assert_eq!((plugin, context, status), (GRAPH_ID, seq, Status::Success));
        round_trips.push(sent.elapsed());
    }
    round_trips.sort();
    let median = round_trips[round_trips.len() / 2];
    let worst = round_trips[round_trips.len() - 1];
    println!(
        "slow host paused {pause:?} with {IN_FLIGHT} commands in flight; meanwhile the other \
         host made {} round trips: median {median:?}, worst {worst:?}",
        round_trips.len()
    );

    let mut answered = vec![0u32; IN_FLIGHT as usize];
    for _ in 0..IN_FLIGHT {
        let (plugin, context, status, _) = next_notification(&mut slow);
        assert_eq!(
            (plugin, status),
            (GRAPH_ID, Status::Success),
            "task {context}"
        );
        answered[context as usize] += 1;
    }
    assert!(
        answered.iter().all(|&count| count == 1),
        "every task answered exactly once: {answered:?}"
    );
    assert!(!slow.wait_recv(Duration::from_millis(200)).unwrap());
    println!("the slow host then received all {IN_FLIGHT} notifications, each once");
}

fn long_tests() -> bool {
    std::env::var_os("UROM_LONG_TESTS").is_some_and(|v| v == "1")
}

#[test]
fn a_host_paused_3s_holds_up_no_one_and_loses_nothing() {
    pause_and_come_back(Duration::from_secs(3));
}

#[test]
fn a_host_paused_15s_and_40s_holds_up_no_one_and_loses_nothing() {
    if !long_tests() {
        println!("skipped: set UROM_LONG_TESTS=1 to pause hosts for 15 and 40 s");
        return;
    }
    pause_and_come_back(Duration::from_secs(15));
    pause_and_come_back(Duration::from_secs(40));
}
