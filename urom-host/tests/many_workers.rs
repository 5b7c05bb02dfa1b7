//! A node's worth of workers on one daemon: 256 from two hosts, a loopback through each, the
//! daemon's threads the same with one worker per host as with all of them, and nothing left
//! behind once they stop.

mod common;

use std::cell::Cell;
use std::time::{Duration, Instant};

use common::{TIMEOUT, run_worker};
use urom_graph::loopback_result;
use urom_host::{CompletedTask, Idle, ProgressEngine, Service, Worker};
use urom_testkit::daemon::graph_and_faulty;
use urom_testkit::process;

/// Workers in all, half from each host.
const WORKERS: u64 = 256;
/// Descriptors a host holds per worker, with room to spare.
const FILES_PER_WORKER: u64 = 12;

thread_local! {
    static DONE: Cell<u64> = const { Cell::new(0) };
}

fn record(task: &CompletedTask<'_>) {
    assert!(loopback_result(task).is_ok(), "a loopback failed");
    DONE.with(|done| done.set(done.get() + 1));
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + TIMEOUT;
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn two_hosts_run_256_workers_on_one_daemon_with_a_constant_thread_count() {
    let files = WORKERS * FILES_PER_WORKER + 256;
    if !process::raise_open_file_limit(files) {
        urom_testkit::skip(&format!(
            "the open-file limit cannot be raised to {files} for {WORKERS} workers"
        ));
        return;
    }
    let max_workers = WORKERS.to_string();
    let (_plugins, daemon) = graph_and_faulty(&["--max-workers", &max_workers]);
    let per_host = WORKERS / 2;
    let first_running = std::sync::Barrier::new(3);
    let all_running = std::sync::Barrier::new(3);
    let stop = std::sync::Barrier::new(3);

    std::thread::scope(|scope| {
        for host in 0..2 {
            let (daemon, first_running, all_running, stop) =
                (&daemon, &first_running, &all_running, &stop);
            scope.spawn(move || {
                let service = Service::<Idle>::new()
                    .set_socket(&daemon.socket)
                    .set_max_workers(WORKERS as usize)
                    .map_err(|_| "256 is a power of two")
                    .unwrap()
                    .start()
                    .map_err(|(_, e)| e)
                    .unwrap();
                let graph = urom_testkit::host::graph_host(&service);
                let mut engine = ProgressEngine::new();
                let worker = |id| {
                    Worker::new()
                        .set_service(&service)
                        .set_id(id)
                        .set_plugins(graph.id())
                };
                let first_id = host * per_host;
                let mut workers = vec![run_worker(&mut engine, worker(first_id))];
                first_running.wait();
                workers.extend(
                    (first_id + 1..first_id + per_host)
                        .map(|id| run_worker(&mut engine, worker(id))),
                );
                for (cookie, worker) in workers.iter().enumerate() {
                    graph
                        .loopback(worker, cookie as u64, worker.id(), record)
                        .unwrap();
                }
                let deadline = Instant::now() + TIMEOUT;
                while DONE.with(Cell::get) < per_host {
                    engine.progress();
                    assert!(Instant::now() < deadline, "loopbacks did not complete");
                }
                all_running.wait();
                stop.wait();
                for worker in workers {
                    worker.stop().map_err(|(_, e)| e).unwrap();
                }
            });
        }
        first_running.wait();
        let threads_with_two = process::threads(daemon.pid());
        all_running.wait();
        assert_eq!(process::workers_of(daemon.pid()).len() as u64, WORKERS);
        // At most as many: a plugin probe's short-lived thread may have been counted then.
        let threads = process::threads(daemon.pid());
        assert!(
            threads <= threads_with_two,
            "the daemon's threads grew with its workers: {threads_with_two} with two, {threads} \
             with {WORKERS}"
        );
        stop.wait();
    });

    wait_until("workers still run after they were stopped", || {
        process::workers_of(daemon.pid()).is_empty()
    });
    wait_until("a stopped worker's directory is left behind", || {
        std::fs::read_dir(daemon.dir.path())
            .unwrap()
            .flatten()
            .all(|entry| {
                !entry
                    .file_name()
                    .to_string_lossy()
                    .starts_with("urom-worker-")
            })
    });
    assert!(daemon.is_running(), "{}", daemon.log());
}
