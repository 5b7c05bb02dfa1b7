//! Idle workers cost nothing: workers a daemon spawned, each having served a host, sleep on
//! their descriptors, and their CPU time over a few seconds of idleness (read from `/proc`)
//! stays far below what waking now and then costs. Not a timing: the bound is generous.

use std::cell::Cell;
use std::time::{Duration, Instant};

use urom_graph::GraphHost;
use urom_host::{CompletedTask, Idle, ProgressEngine, Service, Worker};
use urom_testkit::process;

const WORKERS: usize = 32;
const IDLE: Duration = Duration::from_secs(3);
/// All the workers together, in percent of one core. A worker that woke every 5 ms (its
/// acceptor did, before) costs about 0.3% of a core, so 32 of them about 10%.
const MOST_IDLE_CPU: f64 = 3.0;

thread_local! {
    static DONE: Cell<usize> = const { Cell::new(0) };
}

fn count(_: &CompletedTask<'_>) {
    DONE.with(|d| d.set(d.get() + 1));
}

/// CPU time of every thread of `pid`, in nanoseconds, and how many threads it has.
fn cpu_ns_and_threads(pid: i32) -> (u64, usize) {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return (0, 0);
    };
    let mut ns = 0;
    let mut threads = 0;
    for task in tasks.flatten() {
        threads += 1;
        ns += std::fs::read_to_string(task.path().join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0);
    }
    (ns, threads)
}

#[test]
fn idle_workers_sleep_on_their_descriptors() {
    let most = WORKERS.to_string();
    let (_plugins, daemon) = urom_testkit::daemon::graph_and_faulty(&["--max-workers", &most]);
    let service = Service::<Idle>::new()
        .set_socket(&daemon.socket)
        .set_max_workers(WORKERS)
        .unwrap_or_else(|_| panic!("{WORKERS} workers"))
        .start()
        .map_err(|(_, e)| e)
        .unwrap();
    let info = service.plugin("worker_graph").unwrap().clone();
    let graph = GraphHost::init(info.id, info.version).unwrap();
    let mut engine = ProgressEngine::new();
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            Worker::new()
                .set_service(&service)
                .set_plugins(graph.id())
                .start(&mut engine)
                .map_err(|(_, e)| e)
                .unwrap()
                .wait_running(&mut engine, Duration::from_secs(60))
                .map_err(|_| "a worker did not start")
                .unwrap()
        })
        .collect();
    for (i, worker) in workers.iter().enumerate() {
        graph.loopback(worker, i as u64, 1, count).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while DONE.with(Cell::get) < WORKERS {
        engine.progress();
        assert!(Instant::now() < deadline, "loopbacks did not complete");
    }
    let pids: Vec<i32> = (0..WORKERS)
        .filter_map(|i| daemon.worker_pid(workers[i].id()))
        .collect();
    assert_eq!(pids.len(), WORKERS, "a process per worker");
    // Past the short spin after the last command.
    std::thread::sleep(Duration::from_millis(300));
    let before: u64 = pids.iter().map(|&p| cpu_ns_and_threads(p).0).sum();
    let start = Instant::now();
    std::thread::sleep(IDLE);
    let after: Vec<(u64, usize)> = pids.iter().map(|&p| cpu_ns_and_threads(p)).collect();
    let secs = start.elapsed().as_secs_f64();
    let used: u64 = after.iter().map(|&(ns, _)| ns).sum::<u64>() - before;
    let percent = used as f64 / 1e9 / secs * 100.0;
    assert!(
        percent < MOST_IDLE_CPU,
        "{WORKERS} idle workers used {percent:.2}% of a core over {secs:.1} s"
    );
    // The loop, the acceptor and the daemon link: no thread per host or handshake.
    for (&pid, &(_, threads)) in pids.iter().zip(&after) {
        assert!(threads <= 3, "worker {pid} runs {threads} threads");
        assert!(process::alive(pid));
    }
    for worker in workers {
        worker.stop().map_err(|(_, e)| e).unwrap();
    }
}
