//! Over UCX on TCP: our 64-byte host -> worker -> graph plugin -> host round trip and our
//! pipelined loopback rate, beside `ucx_perftest`'s `ucp_am_lat` and `ucp_am_bw` with the same
//! `UCX_TLS`, in alternating short rounds; prints the median of the per-round ratios.
//!
//! Runs over loopback (127.0.0.1), and across two network namespaces joined by a veth pair when
//! run as root with `ip`. The daemon's worker runs on core 1 and this process on core 0, as do
//! `ucx_perftest`'s server and client.
//!
//! `benches/run-ucx-bench.sh [ROUNDS]`, or `UROM_BENCH_ROUNDS=N cargo bench -p urom-benches
//! --features ucx --bench ucx`.

use std::io::{BufRead, BufReader, Write};
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use urom_benches::{HOST_CORE, PEER_CORE, median};
use urom_graph::GraphHost;
use urom_host::{CompletedTask, Idle, ProgressEngine, Running, Service, Worker};
use urom_testkit::daemon::{Daemon, plugin_dir, start_daemon_command};
use urom_testkit::netns::Network;
use urom_testkit::{TempDir, binary};

/// Round trips per round; the round's figure is their median.
const ROUND_TRIPS: usize = 2000;
/// Loopbacks per rate round, and how many are in flight.
const STREAM: usize = 100_000;
const IN_FLIGHT: usize = 64;

static ANSWERED: AtomicUsize = AtomicUsize::new(0);

fn answered(_task: &CompletedTask<'_>) {
    ANSWERED.fetch_add(1, Ordering::Relaxed);
}

/// Where the daemon and the host run.
struct Place<'n> {
    label: &'static str,
    /// The namespaces of the service (0) and the host (1), or none.
    network: Option<&'n Network>,
    /// The address the daemon listens on.
    service_ip: IpAddr,
    /// `UCX_NET_DEVICES` on the service's side and the host's.
    devices: [String; 2],
}

impl Place<'_> {
    fn command(&self, side: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = match self.network {
            Some(network) => network.command(side, program),
            None => Command::new(program),
        };
        command
            .env("UCX_TLS", "tcp")
            .env("UCX_NET_DEVICES", &self.devices[side])
            .env("UCX_WARN_UNUSED_ENV_VARS", "n");
        command
    }
}

/// Set (to the service's address) in the host side's environment.
const HOST_SIDE: &str = "UROM_UCX_BENCH_HOST";

fn main() {
    if let Ok(address) = std::env::var(HOST_SIDE) {
        let key = std::env::var("UROM_BENCH_KEY").expect("the key file");
        host_side(&address, &key);
        return;
    }
    let rounds = std::env::var("UROM_BENCH_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10usize);
    urom_transport::ucx::set_config_defaults(&[("TLS", "tcp"), ("WARN_UNUSED_ENV_VARS", "n")]);
    let perftest = Command::new("ucx_perftest")
        .arg("-h")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !perftest {
        println!("ucx_perftest is not installed (apt-get install ucx-utils): no baseline");
    }
    let loopback = Place {
        label: "loopback (127.0.0.1)",
        network: None,
        service_ip: "127.0.0.1".parse().unwrap(),
        devices: ["lo".into(), "lo".into()],
    };
    let mut tables = vec![bench(&loopback, rounds, perftest)];
    match Network::create("bench", 2) {
        Ok(network) => {
            let across = Place {
                label: "two namespaces (veth)",
                network: Some(&network),
                service_ip: network.hub_address(1).into(),
                devices: [network.device(0, 1), network.device(1, 0)],
            };
            tables.push(bench(&across, rounds, perftest));
        }
        Err(why) => println!("two namespaces skipped: {why}"),
    }
    println!();
    println!("UCX over TCP, 64-byte messages, {rounds} alternating rounds, medians");
    for table in tables {
        println!("{table}");
    }
}

/// Alternating rounds of ours and of `ucx_perftest` in `place`; the table of medians.
fn bench(place: &Place<'_>, rounds: usize, perftest: bool) -> String {
    let dir = TempDir::new("urom-ucx-bench");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let key = dir.path().join("key");
    std::fs::write(&key, "the benchmark's shared secret").unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let plugins = plugin_dir(&dir, &[("urom-plugin-graph", "worker_graph")]);
    let port = free_port(place);
    let address = format!("{}:{port}", place.service_ip);
    let mut flags = vec![
        "--listen-ucx".to_owned(),
        address.clone(),
        "--key-file".to_owned(),
        key.to_str().unwrap().to_owned(),
        "--log-level".to_owned(),
        "30".to_owned(),
        "--sdk-log-level".to_owned(),
        "30".to_owned(),
    ];
    if nix::unistd::geteuid().is_root() {
        flags.extend(["--remote-user".to_owned(), "nobody".to_owned()]);
    }
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let daemon: Daemon = start_daemon_command(
        place.command(0, binary("urom-daemon", "urom-daemon")),
        plugins.to_str().unwrap(),
        &flags,
        true,
    );
    // The host side is this program again, started on the host's machine (`ip netns exec`
    // remounts `/sys`, where UCX finds the network devices); it measures a round when asked.
    let mut host = place
        .command(1, std::env::current_exe().expect("the benchmark's path"))
        .env(HOST_SIDE, &address)
        .env("UROM_BENCH_KEY", &key)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting the host side");
    let mut to_host = host.stdin.take().unwrap();
    let mut from_host = BufReader::new(host.stdout.take().unwrap()).lines();
    let ready = from_host.next().and_then(Result::ok);
    assert_eq!(
        ready.as_deref(),
        Some("ready"),
        "the host side did not start:\n{}",
        daemon.log()
    );
    let mut rows = Vec::with_capacity(rounds);
    for round in 0..rounds {
        writeln!(to_host, "round").unwrap();
        let line = from_host.next().unwrap().unwrap();
        let ours: Vec<f64> = line.split(' ').map(|n| n.parse().unwrap()).collect();
        let (ours_rt, ours_rate) = (ours[0], ours[1]);
        let (ucx_rt, ucx_rate) = if perftest {
            let port = 20_000 + (round as u16) * 2;
            (
                perftest_latency_ns(place, port),
                perftest_rate(place, port + 1),
            )
        } else {
            (f64::NAN, f64::NAN)
        };
        println!(
            "{} round {round}: round trip {:.1} / {:.1} us ({:.2}), pipelined {:.3} / {:.3} M/s ({:.2})",
            place.label,
            ours_rt / 1000.0,
            ucx_rt / 1000.0,
            ours_rt / ucx_rt,
            ours_rate / 1e6,
            ucx_rate / 1e6,
            ours_rate / ucx_rate,
        );
        rows.push([
            ours_rt,
            ucx_rt,
            ours_rt / ucx_rt,
            ours_rate,
            ucx_rate,
            ours_rate / ucx_rate,
        ]);
    }
    drop(to_host);
    let _ = host.wait();
    let column = |i: usize| median(&mut rows.iter().map(|row| row[i]).collect::<Vec<_>>());
    format!(
        "{}\n  round trip: ours {:8.1} us   ucp_am_lat (p50 one way x2) {:8.1} us   ours/ucx {:5.2}  (goal <= 1.15)\n  \
         pipelined:  ours {:8.3} M/s  ucp_am_bw {:8.3} M msg/s   ours/ucx {:5.2}  (goal >= 0.8)",
        place.label,
        column(0) / 1000.0,
        column(1) / 1000.0,
        column(2),
        column(3) / 1e6,
        column(4) / 1e6,
        column(5),
    )
}

/// The host side: a service at `address`, a worker, then one round of measurements for each
/// `round` line on standard input, answered with `ROUND_TRIP_NS RATE_PER_S`.
fn host_side(address: &str, key: &str) {
    urom_transport::sys::pin_current_thread(HOST_CORE).expect("pinning the benchmark");
    let service = Service::<Idle>::new()
        .set_remote(address)
        .set_key_file(key)
        .set_identity("bench")
        .start()
        .map_err(|(_, e)| e)
        .unwrap_or_else(|e| panic!("the service did not start: {e}"));
    let graph = urom_testkit::host::graph_host(&service);
    let mut engine = ProgressEngine::new();
    let worker = Worker::new()
        .set_service(&service)
        .set_plugins(graph.id())
        .set_max_inflight_tasks(IN_FLIGHT * 2)
        .set_cpuset([PEER_CORE].into_iter().collect())
        .start(&mut engine)
        .map_err(|(_, e)| e)
        .unwrap()
        .wait_running(&mut engine, Duration::from_secs(60))
        .unwrap_or_else(|p| panic!("the worker did not run: {p:?}"));
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready").unwrap();
    out.flush().unwrap();
    for line in std::io::stdin().lock().lines() {
        if line.is_err() {
            break;
        }
        let round_trip = round_trip_ns(&mut engine, &graph, &worker);
        let rate = rate(&mut engine, &graph, &worker);
        writeln!(out, "{round_trip} {rate}").unwrap();
        out.flush().unwrap();
    }
}

/// A port nobody listens on at the service's address.
fn free_port(place: &Place<'_>) -> u16 {
    let ip = place.service_ip;
    let pick = move || {
        std::net::TcpListener::bind((ip, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    match place.network {
        Some(network) => network.run_in(0, pick),
        None => pick(),
    }
}

/// The median of [`ROUND_TRIPS`] one-at-a-time loopbacks, in nanoseconds.
fn round_trip_ns(engine: &mut ProgressEngine, graph: &GraphHost, worker: &Worker<Running>) -> f64 {
    let mut times = Vec::with_capacity(ROUND_TRIPS);
    for i in 0..ROUND_TRIPS {
        let before = ANSWERED.load(Ordering::Relaxed);
        let start = Instant::now();
        graph
            .loopback(worker, i as u64, 0, answered)
            .expect("submit");
        while ANSWERED.load(Ordering::Relaxed) == before {
            engine.progress();
        }
        times.push(start.elapsed().as_secs_f64() * 1e9);
    }
    median(&mut times)
}

/// Loopbacks per second with [`IN_FLIGHT`] in flight, each free place refilled in one burst
/// (`loopback_batch`) after each progress.
fn rate(engine: &mut ProgressEngine, graph: &GraphHost, worker: &Worker<Running>) -> f64 {
    let first = ANSWERED.load(Ordering::Relaxed);
    let start = Instant::now();
    let mut submitted = 0;
    while ANSWERED.load(Ordering::Relaxed) - first < STREAM {
        let in_flight = submitted - (ANSWERED.load(Ordering::Relaxed) - first);
        let room = (IN_FLIGHT - in_flight).min(STREAM - submitted);
        if room > 0
            && let Ok(went) = graph.loopback_batch(worker, submitted as u64, room, answered)
        {
            submitted += went;
        }
        engine.progress();
    }
    STREAM as f64 / start.elapsed().as_secs_f64()
}

/// Runs one `ucx_perftest` test between a server on the service's side and a client on the
/// host's; the client's `Final:` line split in fields.
fn perftest(place: &Place<'_>, test: &str, iterations: u64, port: u16) -> Vec<f64> {
    let mut server = place
        .command(0, "ucx_perftest")
        .args(["-c", &PEER_CORE.to_string(), "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting the ucx_perftest server");
    std::thread::sleep(Duration::from_millis(300));
    let output = place
        .command(1, "ucx_perftest")
        .arg(place.service_ip.to_string())
        .args(["-p", &port.to_string(), "-t", test, "-s", "64"])
        .args(["-n", &iterations.to_string(), "-c", &HOST_CORE.to_string()])
        .output()
        .expect("running the ucx_perftest client");
    let _ = server.wait();
    let text = String::from_utf8_lossy(&output.stdout);
    text.lines()
        .find(|line| line.trim_start().starts_with("Final:"))
        .map(|line| {
            line.split_whitespace()
                .skip(1)
                .filter_map(|field| field.parse().ok())
                .collect()
        })
        .unwrap_or_else(|| panic!("ucx_perftest {test} printed no result:\n{text}"))
}

/// `ucp_am_lat`'s median one-way latency, doubled, in nanoseconds.
fn perftest_latency_ns(place: &Place<'_>, port: u16) -> f64 {
    // Final: iterations, latency p50 / avg / overall (us, one way), ...
    let fields = perftest(place, "ucp_am_lat", 20_000, port);
    2.0 * fields[1] * 1000.0
}

/// `ucp_am_bw`'s overall message rate, per second.
fn perftest_rate(place: &Place<'_>, port: u16) -> f64 {
    // Final: iterations, latency x3, bandwidth avg / overall, message rate avg / overall.
    let fields = perftest(place, "ucp_am_bw", 1_000_000, port);
    fields[7]
}
