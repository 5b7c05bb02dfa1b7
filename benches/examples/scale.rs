//! Many workers on one daemon, from one host: what they cost while idle and how fast they start.
//!
//! Starts a daemon (release build beside this program) offering the graph plugin, then:
//!
//! 1. times a bare `fork` + `exec` of `urom-worker --version` until it exits (the floor of any
//!    spawn), several times;
//! 2. spawns `N` workers one after another, each timed from the request to running, or all at
//!    once with `--at-once` (each timed from the first request);
//! 3. runs one loopback on each worker, then lets everything idle and reads, from `/proc`, the
//!    CPU time all workers (and the daemon) used over `--idle-secs` seconds, each worker's
//!    private memory (`Private_Dirty` of `smaps_rollup`) and RSS, the daemon's threads and RSS,
//!    and this host's RSS;
//! 4. with `--rate`, the rate of loopbacks through 1, 16 and 256 (at most `N`) workers at once;
//! 5. stops every worker and the daemon.
//!
//! Prints `key: value` lines (`benches/run-scale-bench.sh` collects them).
//!
//! usage: scale N [--at-once] [--idle-secs S] [--max-inflight T] [--rate] [--busy-poll]

use std::cell::Cell;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use urom_graph::GraphHost;
use urom_host::{CompletedTask, Idle, ProgressEngine, Running, Service, Worker};
use urom_testkit::daemon::{plugin_dir, start_daemon};
use urom_testkit::{TempDir, binary, process};

const START_TIMEOUT: Duration = Duration::from_secs(120);

thread_local! {
    static DONE: Cell<u64> = const { Cell::new(0) };
}

fn count(_task: &CompletedTask<'_>) {
    DONE.with(|d| d.set(d.get() + 1));
}

fn done() -> u64 {
    DONE.with(Cell::get)
}

struct Options {
    workers: usize,
    at_once: bool,
    idle_secs: f64,
    max_inflight: usize,
    rate: bool,
    busy_poll: bool,
}

fn options() -> Options {
    let mut args = std::env::args().skip(1);
    let mut o = Options {
        workers: 64,
        at_once: false,
        idle_secs: 3.0,
        max_inflight: 64,
        rate: false,
        busy_poll: false,
    };
    while let Some(arg) = args.next() {
        let mut value = || args.next().expect("a value after the flag");
        match arg.as_str() {
            "--at-once" => o.at_once = true,
            "--rate" => o.rate = true,
            "--busy-poll" => o.busy_poll = true,
            "--idle-secs" => o.idle_secs = value().parse().expect("seconds"),
            "--max-inflight" => o.max_inflight = value().parse().expect("a number of tasks"),
            n => o.workers = n.parse().expect("usage: scale N [flags]"),
        }
    }
    o
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A `/proc/<pid>/status` field in KiB (or a plain count).
fn status_field(pid: i32, field: &str) -> u64 {
    process::status_line(pid, field)
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// This process's id, for [`status_field`].
fn own_pid() -> i32 {
    i32::try_from(std::process::id()).expect("a process id fits an i32")
}

/// `Private_Dirty` of `/proc/<pid>/smaps_rollup`, KiB.
fn private_dirty(pid: i32) -> u64 {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    rollup
        .lines()
        .find_map(|line| line.strip_prefix("Private_Dirty:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// CPU time of `pid`, all its threads, in nanoseconds (`schedstat` of each task), and the
/// times its threads went to sleep (voluntary context switches).
fn cpu_and_sleeps(pid: i32) -> (u64, u64) {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return (0, 0);
    };
    let mut ns = 0;
    let mut sleeps = 0;
    for task in tasks.flatten() {
        let path = task.path();
        let schedstat = std::fs::read_to_string(path.join("schedstat")).unwrap_or_default();
        ns += schedstat
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        let status = std::fs::read_to_string(path.join("status")).unwrap_or_default();
        sleeps += status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
    }
    (ns, sleeps)
}

fn median_u64(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

fn main() {
    let o = options();
    let worker_bin = binary("urom-worker", "urom-worker");

    // 1. The floor: fork + exec of the same binary, until it exits; one beside each spawn
    // below too, so that both see the same machine (as many processes, as warm caches).
    let fork_exec = || {
        let start = Instant::now();
        let status = Command::new(&worker_bin)
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .expect("running urom-worker --version");
        assert!(status.success());
        ms(start.elapsed())
    };
    let mut bare: Vec<f64> = (0..21).map(|_| fork_exec()).collect();

    let plugins = TempDir::new("urom-scale-plugins");
    let dir = plugin_dir(&plugins, &[("urom-plugin-graph", "worker_graph")]);
    let max_workers = (o.workers + 16).to_string();
    let mut extra = vec![
        "--max-workers",
        max_workers.as_str(),
        "--sdk-log-level",
        "30",
        "-l",
        "30",
    ];
    if o.busy_poll {
        extra.push("--worker-busy-poll");
    }
    let daemon = start_daemon(
        binary("urom-daemon", "urom-daemon"),
        dir.to_str().expect("a UTF-8 path"),
        &extra,
        true,
    );
    let daemon_pid = daemon.pid();
    let daemon_threads_before = status_field(daemon_pid, "Threads");
    let host_rss_before = status_field(own_pid(), "VmRSS");

    let service = Service::<Idle>::new()
        .set_socket(&daemon.socket)
        .set_max_workers(o.workers)
        .unwrap_or_else(|_| panic!("a host may not ask for {} workers", o.workers))
        .start()
        .map_err(|(_, e)| e)
        .expect("connecting to the daemon");
    let info = service
        .plugin("worker_graph")
        .expect("the graph plugin")
        .clone();
    let graph = GraphHost::init(info.id, info.version).expect("the graph plugin's host side");
    let mut engine = ProgressEngine::new();
    let idle = |_: usize| {
        Worker::new()
            .set_service(&service)
            .set_plugins(graph.id())
            .set_max_inflight_tasks(o.max_inflight)
    };

    // 2. Spawn.
    let mut spawn: Vec<f64> = Vec::with_capacity(o.workers);
    let mut running: Vec<Worker<Running>> = Vec::with_capacity(o.workers);
    let all_start = Instant::now();
    if o.at_once {
        let mut starting: Vec<_> = (0..o.workers)
            .map(|i| {
                idle(i)
                    .start(&mut engine)
                    .map_err(|(_, e)| e)
                    .expect("asking for a worker")
            })
            .collect();
        while !starting.is_empty() {
            engine.progress();
            let mut still = Vec::with_capacity(starting.len());
            for worker in starting {
                match worker.try_running() {
                    Ok(worker) => {
                        spawn.push(ms(all_start.elapsed()));
                        running.push(worker);
                    }
                    Err(urom_host::Progress::Starting(worker)) => still.push(worker),
                    Err(urom_host::Progress::Failed(_, e)) => panic!("a worker failed: {e}"),
                }
            }
            starting = still;
            assert!(all_start.elapsed() < START_TIMEOUT, "workers did not start");
            if !starting.is_empty() {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    } else {
        bare.clear();
        for i in 0..o.workers {
            bare.push(fork_exec());
            let start = Instant::now();
            let worker = idle(i)
                .start(&mut engine)
                .map_err(|(_, e)| e)
                .expect("asking for a worker")
                .wait_running(&mut engine, START_TIMEOUT)
                .map_err(|p| match p {
                    urom_host::Progress::Failed(_, e) => e.to_string(),
                    _ => "still starting".into(),
                })
                .expect("a worker running");
            spawn.push(ms(start.elapsed()));
            running.push(worker);
        }
    }
    let all_running = all_start.elapsed();
    // One after another: spawn over its round's fork+exec, overall and for the last tenth
    // spawned (with the most workers already running).
    let mut over: Vec<f64> = spawn.iter().zip(&bare).map(|(s, b)| s - b).collect();
    let mut over_last = over[over.len() - over.len().div_ceil(10)..].to_vec();
    over.sort_by(f64::total_cmp);
    over_last.sort_by(f64::total_cmp);
    bare.sort_by(f64::total_cmp);
    spawn.sort_by(f64::total_cmp);

    // 3. One loopback on each, then idle.
    let before = done();
    for (i, worker) in running.iter().enumerate() {
        graph
            .loopback(worker, i as u64, i as u64, count)
            .expect("submitting a loopback");
    }
    let deadline = Instant::now() + START_TIMEOUT;
    while done() - before < running.len() as u64 {
        engine.progress();
        assert!(Instant::now() < deadline, "loopbacks did not complete");
    }
    let host_rss = status_field(own_pid(), "VmRSS");
    let host_shmem = status_field(own_pid(), "RssShmem");
    let workers = process::workers_of(daemon_pid);
    assert_eq!(workers.len(), o.workers, "one process per worker");
    // Let every worker reach its idle sleep before measuring.
    std::thread::sleep(Duration::from_millis(500));
    let sum = |pids: &[i32]| {
        pids.iter()
            .map(|&p| cpu_and_sleeps(p))
            .fold((0, 0), |(a, b), (c, d)| (a + c, b + d))
    };
    let t0 = Instant::now();
    let (w0, s0) = sum(&workers);
    let (d0, _) = cpu_and_sleeps(daemon_pid);
    std::thread::sleep(Duration::from_secs_f64(o.idle_secs));
    let (w1, s1) = sum(&workers);
    let (d1, _) = cpu_and_sleeps(daemon_pid);
    let secs = t0.elapsed().as_secs_f64();
    let idle_cpu = (w1 - w0) as f64 / 1e9 / secs * 100.0;
    let daemon_cpu = (d1 - d0) as f64 / 1e9 / secs * 100.0;
    let wakeups = (s1 - s0) as f64 / secs / workers.len() as f64;
    let private = median_u64(workers.iter().map(|&p| private_dirty(p)).collect());
    let private_total: u64 = workers.iter().map(|&p| private_dirty(p)).sum();
    let worker_rss = median_u64(workers.iter().map(|&p| status_field(p, "VmRSS")).collect());
    let worker_threads = median_u64(
        workers
            .iter()
            .map(|&p| status_field(p, "Threads"))
            .collect(),
    );
    // What one progress call costs the host with every worker idle.
    const CALLS: u32 = 1000;
    let t0 = Instant::now();
    for _ in 0..CALLS {
        engine.progress();
    }
    let progress_us = t0.elapsed().as_secs_f64() * 1e6 / f64::from(CALLS);
    let daemon_threads = status_field(daemon_pid, "Threads");
    let daemon_rss = status_field(daemon_pid, "VmRSS");

    println!("workers: {}", o.workers);
    println!(
        "bare fork+exec (ms, median / p90): {:.2} / {:.2}",
        percentile(&bare, 0.5),
        percentile(&bare, 0.9)
    );
    println!(
        "spawn to running{} (ms, median / p90 / last): {:.2} / {:.2} / {:.2}",
        if o.at_once { ", all at once" } else { "" },
        percentile(&spawn, 0.5),
        percentile(&spawn, 0.9),
        spawn.last().copied().unwrap_or(f64::NAN)
    );
    if !o.at_once {
        println!(
            "spawn over its round's fork+exec (ms, median / p90 / median of the last tenth): \
             {:.2} / {:.2} / {:.2}",
            percentile(&over, 0.5),
            percentile(&over, 0.9),
            percentile(&over_last, 0.5)
        );
    }
    println!("all running after (ms): {:.0}", ms(all_running));
    println!("host progress call, every worker idle (us, mean of {CALLS}): {progress_us:.1}");
    println!("idle CPU of all workers (% of a core): {idle_cpu:.3} over {secs:.1} s");
    println!("idle wake-ups per worker per second: {wakeups:.1}");
    println!("idle CPU of the daemon (% of a core): {daemon_cpu:.3}");
    println!(
        "worker Private_Dirty (KiB, median / all): {private} / {}",
        private_total
    );
    println!("worker RSS (KiB, median): {worker_rss}");
    println!("worker threads (median): {worker_threads}");
    println!("daemon threads (before / with workers): {daemon_threads_before} / {daemon_threads}");
    println!("daemon RSS (KiB): {daemon_rss}");
    println!(
        "host RSS (KiB, before / with workers, of it shared memory): {host_rss_before} / {host_rss} / {host_shmem}"
    );

    // 4. Loopback rate through 1, 16 and 256 workers at once.
    if o.rate {
        for width in [1usize, 16, 256] {
            if width > running.len() {
                continue;
            }
            let window = o.max_inflight.min(16) as u64;
            let before = done();
            let mut sent = 0u64;
            let mut next = 0usize;
            let start = Instant::now();
            let run_for = Duration::from_secs(1);
            while start.elapsed() < run_for {
                // Round robin over the workers while fewer than `window` each are in flight.
                for _ in 0..width {
                    if sent - (done() - before) >= window * width as u64 {
                        break;
                    }
                    if graph.loopback(&running[next], sent, sent, count).is_ok() {
                        sent += 1;
                    }
                    next = (next + 1) % width;
                }
                engine.progress();
            }
            let total = sent;
            while done() - before < total {
                engine.progress();
            }
            let secs = start.elapsed().as_secs_f64();
            println!(
                "loopback rate through {width} workers (k/s): {:.1}",
                total as f64 / secs / 1e3
            );
        }
    }

    // 5. Stop everything.
    let stop_start = Instant::now();
    for worker in running {
        let _ = worker.stop();
    }
    println!("all stopped after (ms): {:.0}", ms(stop_start.elapsed()));
    drop(service.stop());
    drop(daemon);
}
