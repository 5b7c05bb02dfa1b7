//! A progress engine that sleeps: an idle host uses no CPU, wakes when a notification arrives,
//! and the notification descriptor works inside a caller's own event loop. Prints the wake-up
//! latency beside the busy-poll round trip (speed is measured, never asserted).

mod common;

use std::cell::Cell;
use std::time::{Duration, Instant};

use common::{TIMEOUT, run_worker, start_daemon, start_service};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use urom_graph::GraphHost;
use urom_host::{CompletedTask, ProgressEngine, Running, Worker};

thread_local! {
    static DONE: Cell<usize> = const { Cell::new(0) };
}

fn count(_: &CompletedTask<'_>) {
    DONE.with(|done| done.set(done.get() + 1));
}

fn done() -> usize {
    DONE.with(Cell::get)
}

/// CPU time this thread has used.
fn thread_cpu() -> Duration {
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_THREAD)
        .expect("getrusage");
    let (user, system) = (usage.user_time(), usage.system_time());
    Duration::from_micros(
        (user.tv_sec() as u64 + system.tv_sec() as u64) * 1_000_000
            + user.tv_usec() as u64
            + system.tv_usec() as u64,
    )
}

/// Runs `rounds` loopbacks one at a time, waiting for each with `wait`; the median round trip.
fn round_trips(
    engine: &mut ProgressEngine,
    worker: &Worker<Running>,
    graph: &GraphHost,
    rounds: usize,
    mut wait: impl FnMut(&mut ProgressEngine),
) -> Duration {
    let mut times = Vec::with_capacity(rounds);
    for i in 0..rounds {
        let before = done();
        let start = Instant::now();
        graph.loopback(worker, i as u64, 0, count).unwrap();
        let deadline = start + TIMEOUT;
        while done() == before {
            wait(engine);
            engine.progress();
            assert!(Instant::now() < deadline, "a loopback did not complete");
        }
        times.push(start.elapsed());
    }
    times.sort();
    times[rounds / 2]
}

#[test]
fn an_idle_engine_sleeps_and_wakes_on_a_notification() {
    let (_plugins, daemon) = start_daemon();
    let service = start_service(&daemon);
    let graph = urom_testkit::host::graph_host(&service);
    let mut engine = ProgressEngine::new();
    let worker = run_worker(
        &mut engine,
        Worker::new().set_service(&service).set_plugins(graph.id()),
    );

    // Nothing in flight: a wait of 300 ms sleeps through it.
    let (wall, cpu) = (Instant::now(), thread_cpu());
    engine.wait(Duration::from_millis(300)).unwrap();
    engine.progress();
    let (wall, cpu) = (wall.elapsed(), thread_cpu() - cpu);
    assert!(
        cpu < wall / 4,
        "an idle wait used {cpu:?} of CPU in {wall:?}: it spins instead of sleeping"
    );

    // A loopback in flight: the wait ends when its notification arrives.
    let sleeping = round_trips(&mut engine, &worker, &graph, 200, |engine| {
        engine.wait(TIMEOUT).unwrap();
    });
    let busy = round_trips(&mut engine, &worker, &graph, 200, |_| {});
    println!(
        "loopback round trip, median of 200: sleeping on the engine {sleeping:?}, busy polling {busy:?} ({:.1}x)",
        sleeping.as_secs_f64() / busy.as_secs_f64()
    );
    assert_eq!(done(), 400);
}

#[test]
fn the_notification_descriptor_works_in_a_callers_event_loop() {
    let (_plugins, daemon) = start_daemon();
    let service = start_service(&daemon);
    let graph = urom_testkit::host::graph_host(&service);
    let mut engine = ProgressEngine::new();
    let worker = run_worker(
        &mut engine,
        Worker::new().set_service(&service).set_plugins(graph.id()),
    );
    for i in 0..50 {
        graph.loopback(&worker, i, 0, count).unwrap();
    }
    let deadline = Instant::now() + TIMEOUT;
    while done() < 50 {
        if engine.request_notification().unwrap() {
            let fd = engine.notification_fd().unwrap();
            let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
            poll(&mut fds, PollTimeout::from(1000u16)).unwrap();
            engine.clear_notification();
        }
        engine.progress();
        assert!(Instant::now() < deadline, "loopbacks did not complete");
    }
    assert_eq!(done(), 50);
}
