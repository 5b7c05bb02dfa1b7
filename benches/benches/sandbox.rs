//! The sandbox plugin's tag round trip between two workers, beside `ucx_perftest`'s `tag_lat`
//! with the same `UCX_TLS` (TCP over loopback), in alternating rounds; prints each round and
//! the median of the per-round ratios.
//!
//! Ours, timed by the host: one host (this process, pinned to core 0) holds two workers of one
//! daemon in one domain (domain ids 0 and 1): worker 0 on the host's core, worker 1 alone on
//! core 1, as a user placing three processes on two cores for latency would. The workers
//! busy-poll (`--worker-busy-poll`: they never sleep, and yield only a core they share) and
//! the host yields its core after each empty poll, so worker 0 polls whenever the host has
//! nothing to do. `UROM_SANDBOX_HOST_WAIT`, `UROM_SANDBOX_WORKER_CORE`,
//! `UROM_SANDBOX_WORKER_WAIT` and `UROM_SANDBOX_SPREAD` try other arrangements and print the
//! spread; see `main`. A round trip: the host asks worker 0 to send a
//! 64-byte PING to worker 1 (and to receive the PONG); worker 1's receive completes at the
//! host, which asks worker 1 to send the PONG back; worker 0's receive completes at the host.
//! So it holds two UCX tagged messages and four host <-> worker crossings (shared memory).
//! `ucx_perftest -t tag_lat` is one UCX tagged message each way between two processes;
//! its one-way p50 is doubled.
//!
//! Ours, timed inside the plugins, from the same round trips: each worker runs with
//! `UROM_SANDBOX_TIMESTAMPS` (a directory of its own), so its sandbox plugin records the
//! monotonic clock when it issues each tagged send and when each tagged receive completes, and
//! writes the stamps when the worker stops (`urom_sandbox::timestamps`). Worker 0's k-th
//! PING send pairs with worker 1's k-th PING receive, worker 1's k-th PONG send with worker 0's
//! k-th PONG receive; a round trip is the sum of its two legs (the hosts' crossings left out,
//! the workers' wake-ups kept), and the round's figure is their median.
//!
//! `benches/run-sandbox-bench.sh [ROUNDS]`, or `UROM_BENCH_ROUNDS=N cargo bench -p
//! urom-benches --features ucx --bench sandbox`.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use urom_benches::{HOST_CORE, PEER_CORE, median};
use urom_host::{CompletedTask, Idle, ProgressEngine, Running, Service, Worker};
use urom_sandbox::timestamps::{self, Leg, TimestampLog};
use urom_sandbox::{
    self as sandbox, RecvInto, SandboxHost, SendFrom, tag_recv_result, tag_send_result,
};
use urom_testkit::daemon::{plugin_dir, start_daemon_command};
use urom_testkit::{TempDir, binary};

/// Round trips per round; the round's figure is their median.
const ROUND_TRIPS: usize = 2000;
/// `ucx_perftest` iterations per round.
const PERFTEST_ITERATIONS: u64 = 20_000;
/// The message.
const MESSAGE: [u8; 64] = [0x5a; 64];
const PING: u64 = 0x1234;
const PONG: u64 = 0x5678;
const TIMEOUT: Duration = Duration::from_secs(60);

static PONGS: AtomicUsize = AtomicUsize::new(0);
static PINGS: AtomicUsize = AtomicUsize::new(0);

fn on_pong(task: &CompletedTask<'_>) {
    let result = tag_recv_result(task).expect("worker 0 received the PONG");
    assert_eq!(result.ucs_status, 0);
    PONGS.fetch_add(1, Ordering::Relaxed);
}

fn on_ping(task: &CompletedTask<'_>) {
    let result = tag_recv_result(task).expect("worker 1 received the PING");
    assert_eq!(result.ucs_status, 0);
    PINGS.fetch_add(1, Ordering::Relaxed);
}

fn on_sent(task: &CompletedTask<'_>) {
    let result = tag_send_result(task).expect("a send completed");
    assert_eq!(result.ucs_status, 0);
}

fn ucx_env(command: &mut Command) -> &mut Command {
    command
        .env("UCX_TLS", "tcp")
        .env("UCX_NET_DEVICES", "lo")
        .env("UCX_WARN_UNUSED_ENV_VARS", "n")
}

fn main() {
    let rounds = std::env::var("UROM_BENCH_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(3usize)
        .max(1);
    let perftest = Command::new("ucx_perftest")
        .arg("-h")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !perftest {
        println!("ucx_perftest is not installed (apt-get install ucx-utils): no baseline");
    }
    let dir = TempDir::new("urom-sandbox-bench");
    let plugins = plugin_dir(&dir, &[("urom-plugin-sandbox", "worker_sandbox")]);
    let mut command = Command::new(binary("urom-daemon", "urom-daemon"));
    ucx_env(&mut command);
    let daemon = start_daemon_command(
        command,
        plugins.to_str().unwrap(),
        // Busy-polling workers by default (`UROM_SANDBOX_WORKER_WAIT=adaptive` lets them sleep).
        match std::env::var("UROM_SANDBOX_WORKER_WAIT").as_deref() {
            Ok("busy") | Err(_) => &[
                "--log-level",
                "30",
                "--sdk-log-level",
                "30",
                "--worker-busy-poll",
            ][..],
            Ok("adaptive") => &["--log-level", "30", "--sdk-log-level", "30"][..],
            Ok(other) => panic!("UROM_SANDBOX_WORKER_WAIT={other}: expected busy or adaptive"),
        },
        true,
    );
    urom_transport::sys::pin_current_thread(HOST_CORE).expect("pinning the benchmark");
    let service = Service::<Idle>::new()
        .set_socket(&daemon.socket)
        .start()
        .map_err(|(_, e)| e)
        .unwrap_or_else(|e| panic!("the service did not start: {e}"));
    let info = service.plugin(sandbox::NAME).expect("the sandbox plugin");
    let host = SandboxHost::init(info.id, info.version).unwrap();
    let mut engine = ProgressEngine::new();
    // Worker 0 on the host's core and worker 1 alone on the other by default (`split`);
    // `UROM_SANDBOX_WORKER_CORE=N` puts both on core N (they take turns there: only one has
    // work at a time), `any` on every core the daemon may use.
    let placement = std::env::var("UROM_SANDBOX_WORKER_CORE");
    let worker_core = |i: usize| -> Option<usize> {
        match placement.as_deref() {
            Ok("split") | Err(_) => Some([HOST_CORE, PEER_CORE][i]),
            Ok("any") => None,
            Ok(core) => Some(
                core.parse()
                    .expect("UROM_SANDBOX_WORKER_CORE: a core number, any or split"),
            ),
        }
    };
    println!(
        "host on core {HOST_CORE}; worker 0 on {}, worker 1 on {}",
        worker_core(0).map_or("any core".to_owned(), |c| format!("core {c}")),
        worker_core(1).map_or("any core".to_owned(), |c| format!("core {c}")),
    );
    // Each worker's sandbox plugin writes its message timestamps into a directory of its own.
    let stamp_dirs: Vec<_> = (0..2)
        .map(|i| {
            let stamps = dir.path().join(format!("timestamps-{i}"));
            std::fs::create_dir(&stamps).expect("a timestamps directory");
            stamps
        })
        .collect();
    let workers: Vec<Worker<Running>> = (0..2)
        .map(|i| {
            let worker =
                Worker::new().set_env([format!("{}={}", timestamps::ENV, stamp_dirs[i].display())]);
            let worker = match worker_core(i) {
                Some(core) => worker.set_cpuset([core].into_iter().collect()),
                None => worker,
            };
            worker
                .set_service(&service)
                .set_plugins(host.id())
                .set_max_inflight_tasks(16)
                .start(&mut engine)
                .map_err(|(_, e)| e)
                .unwrap()
                .wait_running(&mut engine, TIMEOUT)
                .unwrap_or_else(|p| panic!("a worker did not run: {p:?}"))
        })
        .collect();
    let domain = urom_testkit::domain::start_one_rank(
        &mut engine,
        dir.path(),
        &[&workers[0], &workers[1]],
        TIMEOUT,
    );

    let mut rows = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let ours = round_trip_ns(&mut engine, &host, &workers);
        let ucx = if perftest {
            perftest_latency_ns(20_000 + round as u16)
        } else {
            f64::NAN
        };
        println!(
            "round {round}: sandbox tag round trip {:8.1} us   ucx_perftest tag_lat (p50 one way x2) \
             {:8.1} us   ours/ucx {:5.2}",
            ours / 1000.0,
            ucx / 1000.0,
            ours / ucx
        );
        rows.push(vec![ours, ucx, ours / ucx]);
    }
    drop(domain);
    // Stopping a worker closes its plugin, which writes the timestamps.
    for worker in workers {
        worker
            .stop()
            .map_err(|(_, e)| e)
            .unwrap_or_else(|e| panic!("a worker did not stop: {e}"));
    }
    let logs: Vec<TimestampLog> = stamp_dirs
        .iter()
        .map(|dir| timestamps::read_dir_log(dir).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let inside = plugin_round_trips(&logs, rounds);
    println!();
    println!(
        "timed inside the plugins (worker 0's PING send to worker 1's receive, plus worker 1's PONG send to worker 0's receive):"
    );
    for (round, (row, [trip, ping, pong])) in rows.iter_mut().zip(&inside).enumerate() {
        println!(
            "round {round}: sandbox worker-to-worker round trip {:8.1} us (PING {:5.1} + PONG \
             {:5.1})   ucx_perftest tag_lat (p50 one way x2) {:8.1} us   ours/ucx {:5.2}",
            trip / 1000.0,
            ping / 1000.0,
            pong / 1000.0,
            row[1] / 1000.0,
            trip / row[1]
        );
        row.extend([*trip, trip / row[1]]);
    }
    let column = |i: usize| median(&mut rows.iter().map(|row| row[i]).collect::<Vec<_>>());
    println!();
    println!(
        "sandbox tag round trip between two workers, UCX over TCP (lo), 64 bytes, {rounds} \
         alternating rounds, medians\n  timed by the host        {:8.1} us   ucx_perftest \
         tag_lat x2 {:8.1} us   ours/ucx {:5.2}\n  timed inside the plugins {:8.1} us   \
         ucx_perftest tag_lat x2 {:8.1} us   ours/ucx {:5.2}",
        column(0) / 1000.0,
        column(1) / 1000.0,
        column(2),
        column(3) / 1000.0,
        column(1) / 1000.0,
        column(4)
    );
}

/// Per round, from the workers' timestamps: the median worker-to-worker round trip (PING leg
/// plus PONG leg of the same round trip), and the medians of the PING and PONG legs, in
/// nanoseconds.
fn plugin_round_trips(logs: &[TimestampLog], rounds: usize) -> Vec<[f64; 3]> {
    for (i, log) in logs.iter().enumerate() {
        assert_eq!(
            log.dropped, 0,
            "worker {i} dropped timestamps: more messages than its recorder holds"
        );
    }
    let ping = timestamps::legs(&logs[0], &logs[1], PING);
    let pong = timestamps::legs(&logs[1], &logs[0], PONG);
    let expected = rounds * ROUND_TRIPS;
    assert!(
        ping.len() == expected && pong.len() == expected,
        "the timestamps hold {} PING and {} PONG legs, not {expected} of each",
        ping.len(),
        pong.len()
    );
    let ns = |leg: &Leg| {
        let ns = leg.latency_ns();
        assert!(ns >= 0, "a receive stamped before its send: {leg:?}");
        ns as f64
    };
    ping.chunks(ROUND_TRIPS)
        .zip(pong.chunks(ROUND_TRIPS))
        .map(|(ping, pong)| {
            let mut trips: Vec<f64> = ping.iter().zip(pong).map(|(a, b)| ns(a) + ns(b)).collect();
            let mut ping: Vec<f64> = ping.iter().map(ns).collect();
            let mut pong: Vec<f64> = pong.iter().map(ns).collect();
            [median(&mut trips), median(&mut ping), median(&mut pong)]
        })
        .collect()
}

/// How the host waits for a notification: `UROM_SANDBOX_HOST_WAIT` = `spin` (progress
/// without pause), `yield` (the default: yield the core after each empty poll, so that a
/// worker sharing it polls in between; spinning first only delays that worker) or `sleep`
/// (after one empty poll, sleep in [`ProgressEngine::wait`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HostWait {
    Spin,
    Yield,
    Sleep,
}

impl HostWait {
    fn from_env() -> Self {
        match std::env::var("UROM_SANDBOX_HOST_WAIT").as_deref() {
            Ok("spin") => Self::Spin,
            Ok("yield") | Err(_) => Self::Yield,
            Ok("sleep") => Self::Sleep,
            Ok(other) => panic!("UROM_SANDBOX_HOST_WAIT={other}: expected spin, yield or sleep"),
        }
    }
}

/// The median of [`ROUND_TRIPS`] PING-PONG round trips between the two workers, in
/// nanoseconds.
fn round_trip_ns(
    engine: &mut ProgressEngine,
    host: &SandboxHost,
    workers: &[Worker<Running>],
) -> f64 {
    let (a, b) = (&workers[0], &workers[1]);
    let recv = RecvInto::Inline {
        capacity: MESSAGE.len() as u64,
    };
    let host_wait = HostWait::from_env();
    let wait = |engine: &mut ProgressEngine, counter: &AtomicUsize, before: usize| {
        let deadline = Instant::now() + TIMEOUT;
        while counter.load(Ordering::Relaxed) == before {
            if engine.progress() > 0 {
                continue;
            }
            match host_wait {
                HostWait::Spin => std::hint::spin_loop(),
                HostWait::Yield => std::thread::yield_now(),
                HostWait::Sleep => engine
                    .wait(Duration::from_millis(10))
                    .expect("the progress engine's wait"),
            }
            assert!(Instant::now() < deadline, "a message did not arrive");
        }
    };
    host.tag_recv(b, 0, 0, recv, PING, u64::MAX, on_ping)
        .expect("worker 1's first receive");
    let mut times = Vec::with_capacity(ROUND_TRIPS);
    for i in 0..ROUND_TRIPS {
        let (pings, pongs) = (PINGS.load(Ordering::Relaxed), PONGS.load(Ordering::Relaxed));
        let start = Instant::now();
        host.tag_recv(a, 0, 0, recv, PONG, u64::MAX, on_pong)
            .expect("worker 0's receive");
        host.tag_send(a, 0, 0, 1, SendFrom::Inline(&MESSAGE), PING, on_sent)
            .expect("worker 0's send");
        wait(engine, &PINGS, pings);
        host.tag_send(b, 0, 0, 0, SendFrom::Inline(&MESSAGE), PONG, on_sent)
            .expect("worker 1's send");
        if i + 1 < ROUND_TRIPS {
            host.tag_recv(b, 0, 0, recv, PING, u64::MAX, on_ping)
                .expect("worker 1's next receive");
        }
        wait(engine, &PONGS, pongs);
        times.push(start.elapsed().as_secs_f64() * 1e9);
    }
    // Let the last sends' notifications come in.
    let settle = Instant::now() + Duration::from_millis(100);
    while Instant::now() < settle {
        engine.progress();
    }
    if std::env::var_os("UROM_SANDBOX_SPREAD").is_some() {
        times.sort_by(f64::total_cmp);
        let at = |q: f64| times[((times.len() - 1) as f64 * q) as usize] / 1000.0;
        println!(
            "  p10 {:.1} us  p50 {:.1} us  p90 {:.1} us  p99 {:.1} us",
            at(0.1),
            at(0.5),
            at(0.9),
            at(0.99)
        );
    }
    median(&mut times)
}

/// `ucx_perftest -t tag_lat` over 127.0.0.1 (server on core 1, client on core 0): the p50
/// one-way latency, doubled, in nanoseconds.
fn perftest_latency_ns(port: u16) -> f64 {
    let mut server = ucx_env(&mut Command::new("ucx_perftest"))
        .args(["-c", &PEER_CORE.to_string(), "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting the ucx_perftest server");
    std::thread::sleep(Duration::from_millis(300));
    let output = ucx_env(&mut Command::new("ucx_perftest"))
        .arg("127.0.0.1")
        .args(["-p", &port.to_string(), "-t", "tag_lat", "-s", "64"])
        .args(["-n", &PERFTEST_ITERATIONS.to_string()])
        .args(["-c", &HOST_CORE.to_string()])
        .output()
        .expect("running the ucx_perftest client");
    let _ = server.wait();
    let text = String::from_utf8_lossy(&output.stdout);
    // Final: iterations, latency p50 / avg / overall (us, one way), ...
    let fields: Vec<f64> = text
        .lines()
        .find(|line| line.trim_start().starts_with("Final:"))
        .map(|line| {
            line.split_whitespace()
                .skip(1)
                .filter_map(|field| field.parse().ok())
                .collect()
        })
        .unwrap_or_else(|| panic!("ucx_perftest tag_lat printed no result:\n{text}"));
    2.0 * fields[1] * 1000.0
}
