//! The urom demo: `cargo run --release -p urom-samples --bin urom-demo`.
//!
//! Builds the daemon, the worker and the graph plugin, starts the daemon with the plugin in a
//! temporary directory, runs the multi-worker bootstrap, measures graph loopback round trips
//! and the pipelined rate through the host API, prints a summary and tears everything down.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use urom_graph::loopback_result;
use urom_host::CompletedTask;
use urom_host::{Idle, ProgressEngine, Service, Worker};
use urom_samples::{bootstrap, graph_host, loopback_once, run_worker};
use urom_wire::CpuSet;

const ROUND_TRIPS: usize = 20_000;
const PIPELINED: u64 = 200_000;
const IN_FLIGHT: u64 = 64;

/// The daemon, stopped with SIGTERM (which stops its workers) when dropped.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg(self.0.id().to_string()).status();
        let _ = self.0.wait();
    }
}

/// A temporary directory removed when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Builds the programs the demo needs into this program's own target directory and profile.
fn build_companions() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let profile_dir = exe.parent().context("the demo's directory")?.to_owned();
    let target_dir = profile_dir.parent().context("the target directory")?;
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("the workspace")?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    println!("building urom-daemon, urom-worker and the graph plugin ...");
    let mut command = Command::new(&cargo);
    command
        .current_dir(workspace)
        .args([
            "build",
            "--quiet",
            "-p",
            "urom-daemon",
            "-p",
            "urom-worker",
            "-p",
            "urom-plugin-graph",
            "--target-dir",
        ])
        .arg(target_dir);
    if profile_dir
        .file_name()
        .is_some_and(|name| name == "release")
    {
        command.arg("--release");
    }
    let status = command
        .status()
        .with_context(|| format!("running {cargo}"))?;
    if !status.success() {
        bail!("building the demo's programs failed");
    }
    Ok(profile_dir)
}

fn start_daemon(bin: &Path, scratch: &Path) -> Result<(Daemon, PathBuf)> {
    let plugins = scratch.join("plugins");
    std::fs::create_dir_all(&plugins)?;
    std::fs::copy(
        bin.join("libworker_graph.so"),
        plugins.join("worker_graph.so"),
    )?;
    let socket = scratch.join("urom.sock");
    let child = Command::new(bin.join("urom-daemon"))
        .arg("--listen")
        .arg(&socket)
        .arg("--log-dir")
        .arg(scratch)
        .arg("--worker-bin")
        .arg(bin.join("urom-worker"))
        .args(["--log-level", "40", "--sdk-log-level", "40"])
        .env("UROM_PLUGIN_PATH", &plugins)
        .stdout(Stdio::null())
        .spawn()
        .context("starting urom-daemon")?;
    let daemon = Daemon(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        if Instant::now() > deadline {
            bail!(
                "the daemon did not come up; see {}",
                scratch.join("urom_daemon_dev.log").display()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok((daemon, socket))
}

static COMPLETED: AtomicU64 = AtomicU64::new(0);

fn count(task: &CompletedTask<'_>) {
    if loopback_result(task).is_ok() {
        COMPLETED.fetch_add(1, Ordering::Relaxed);
    }
}

struct Measurements {
    median_round_trip: Duration,
    p99_round_trip: Duration,
    rate: f64,
    pinned: bool,
}

/// Loopback round trips one at a time, then `IN_FLIGHT` at a time.
fn measure(service: &Service<urom_host::Running>) -> Result<Measurements> {
    let graph = graph_host(service)?;
    let cpus: Vec<usize> = service.cpuset().iter().collect();
    let pinned = cpus.len() >= 2;
    let mut worker = Worker::new()
        .set_service(service)
        .set_plugins(graph.id())
        .set_max_inflight_tasks(IN_FLIGHT as usize);
    if pinned {
        urom_transport::sys::pin_current_thread(cpus[0]).map_err(|e| anyhow!("{e}"))?;
        worker = worker.set_cpuset([cpus[1]].into_iter().collect::<CpuSet>());
    }
    let mut engine = ProgressEngine::new();
    let worker = run_worker(&mut engine, worker)?;
    for data in 0..1_000 {
        loopback_once(&mut engine, &graph, &worker, data)?;
    }
    let mut times = Vec::with_capacity(ROUND_TRIPS);
    for data in 0..ROUND_TRIPS as u64 {
        let start = Instant::now();
        loopback_once(&mut engine, &graph, &worker, data)?;
        times.push(start.elapsed());
    }
    times.sort_unstable();

    let start = Instant::now();
    let mut submitted = 0;
    while COMPLETED.load(Ordering::Relaxed) < PIPELINED {
        while submitted < PIPELINED
            && submitted - COMPLETED.load(Ordering::Relaxed) < IN_FLIGHT
            && graph.loopback(&worker, submitted, submitted, count).is_ok()
        {
            submitted += 1;
        }
        engine.progress();
    }
    let rate = PIPELINED as f64 / start.elapsed().as_secs_f64();
    worker.stop().map_err(|(_, e)| anyhow!("{e}"))?;
    Ok(Measurements {
        median_round_trip: times[times.len() / 2],
        p99_round_trip: times[times.len() * 99 / 100],
        rate,
        pinned,
    })
}

fn main() -> Result<()> {
    let bin = build_companions()?;
    let scratch = Scratch(std::env::temp_dir().join(format!("urom-demo-{}", std::process::id())));
    std::fs::create_dir_all(&scratch.0)?;
    let (daemon, socket) = start_daemon(&bin, &scratch.0)?;
    println!("urom-daemon running (socket {})", socket.display());

    let service = Service::<Idle>::new()
        .set_socket(&socket)
        .set_identity("urom-demo")
        .start()
        .map_err(|(_, e)| anyhow!("{e}"))?;
    println!(
        "service started: plugins {:?}, CPUs {}",
        service
            .plugins()
            .iter()
            .map(|p| p.name.as_str())
            .collect::<Vec<_>>(),
        service.cpuset()
    );
    println!("\n== multi-worker bootstrap ==");
    bootstrap(&service, &AtomicBool::new(true), true, &|line| {
        println!("  {line}")
    })?;

    println!("\n== graph loopback through the host API ==");
    let measured = measure(&service)?;
    service.stop();
    drop(daemon);

    println!("\n== summary ==");
    println!("  bootstrap: 4 workers in 2 groups started, looped back, listed and destroyed");
    println!(
        "  round trip (host -> worker -> graph plugin -> host, 64-byte frames{}): median {:.2} us, p99 {:.2} us over {ROUND_TRIPS}",
        if measured.pinned {
            ", host and worker on their own cores"
        } else {
            ""
        },
        measured.median_round_trip.as_secs_f64() * 1e6,
        measured.p99_round_trip.as_secs_f64() * 1e6,
    );
    println!(
        "  pipelined, {IN_FLIGHT} in flight: {:.2} M loopbacks/s over {PIPELINED}",
        measured.rate / 1e6
    );
    println!(
        "  daemon and workers stopped; logs were in {}",
        scratch.0.display()
    );
    Ok(())
}
