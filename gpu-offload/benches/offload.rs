//! Requests through the GPU offload server and the CPU orchestrator, beside a bare TCP server,
//! with the same client, in one run:
//!
//! * `gpu_offload/ours_<T>t`: `gpu-offload-client`'s code (in this process) against
//!   `gpu-offload-server` and `gpu-offload-orchestrator --processor cpu` processes: TCP, the
//!   shared-memory hop to the orchestrator and back, TCP;
//! * `gpu_offload/bare_<T>t`: the same client against a bare echo-and-reverse TCP server
//!   written as a good server would be (this binary re-run as a child process: one thread per
//!   connection, reads all that is there, answers the whole batch with one write), the floor
//!   of the TCP part;
//! * `gpu_offload/cuda_<T>t` (feature `cuda`, on a machine with a GPU): the same server with
//!   `gpu-offload-orchestrator --processor cuda`, beside the CPU processor;
//! * `gpu_offload/remote_<T>t` (feature `ucx`, as root with `ip`): the same server and
//!   orchestrator on two machines, network namespaces joined by a veth pair, the channel over
//!   UCX on TCP (`-c ucx://IP:PORT`); the client runs on the server's machine, as for `ours`,
//!   so that only the channel differs;
//!
//! for T = 1 and 4 client threads, 128 requests in flight per thread, 64-byte payloads; the
//! throughput is in operations (requests answered and checked) per second. Server and
//! orchestrator run with `--max-concurrent-messages 512`, so that a data-path thread takes
//! every request the clients keep in flight, as the bare server does.
//!
//! A VM's cores change speed over seconds, so the binary then runs both again interleaved,
//! round after round, and prints the median MIOP/s of each and the median of the per-round
//! ratios, the comparison to trust.
//!
//! `GPU_OFFLOAD_BENCH_CPUS` lists the server's `--cpu`s (default: the first two CPUs this
//! process may use); the orchestrator gets as many threads, pinned to the CPUs listed in
//! `GPU_OFFLOAD_BENCH_ORCH_CPUS` (default: the server's list rotated by one, so that processor
//! thread `i` runs beside server thread `i + 1`, not its own, as on the original's two
//! machines; the server's list itself makes each share its server thread's CPU; an empty value
//! leaves them to the scheduler), with the extra arguments in
//! `GPU_OFFLOAD_BENCH_ORCH_ARGS` (for example `--poll-us 20`).
//! `GPU_OFFLOAD_BENCH_QUICK=1` skips the criterion part and runs five interleaved rounds. The
//! client threads are not pinned.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use criterion::{Criterion, Throughput};
use gpu_offload::client::{self, ClientConfig, Stats};
use urom_testkit::{ChildGuard, TempDir};
use urom_wire::gpu::{CLIENT_HEADER_LEN, message_length, write_client_headers};

const BARE_ENV: &str = "GPU_OFFLOAD_BENCH_BARE";
const CPUS_ENV: &str = "GPU_OFFLOAD_BENCH_CPUS";
const ORCH_CPUS_ENV: &str = "GPU_OFFLOAD_BENCH_ORCH_CPUS";
const QUICK_ENV: &str = "GPU_OFFLOAD_BENCH_QUICK";
const ORCH_ARGS_ENV: &str = "GPU_OFFLOAD_BENCH_ORCH_ARGS";
const PAYLOAD: usize = 64;
const PIPELINE: usize = 128;
/// Client thread counts measured.
const CLIENT_THREADS: [usize; 2] = [1, 4];
/// `--max-concurrent-messages` of server and orchestrator: every request the most client
/// threads keep in flight.
const SERVER_IN_FLIGHT: usize = 4 * PIPELINE;
const MAX_LEN: usize = 256;
/// Operations per client thread in one run of the interleaved comparison, and rounds.
const ROUND_OPS: u64 = 100_000;
const ROUNDS: usize = 15;

/// The bare server: one thread per connection, batch in, batch out.
fn run_bare() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding the bare server");
    println!("listening on {}", listener.local_addr().unwrap());
    let _ = std::io::stdout().flush();
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        std::thread::spawn(move || serve_bare(stream));
    }
}

fn serve_bare(mut stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let mut rbuf = vec![0u8; 64 * 1024];
    let mut wbuf = vec![0u8; 64 * 1024];
    let mut filled = 0;
    loop {
        let n = match stream.read(&mut rbuf[filled..]) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        filled += n;
        let (mut start, mut out) = (0, 0);
        while let Ok(Some(len)) = message_length(&rbuf[start..filled], MAX_LEN) {
            if start + len > filled {
                break;
            }
            let payload = &rbuf[start + CLIENT_HEADER_LEN..start + len];
            write_client_headers(&mut wbuf[out..], true, payload.len(), MAX_LEN).unwrap();
            for (dst, src) in wbuf[out + CLIENT_HEADER_LEN..out + len]
                .iter_mut()
                .zip(payload.iter().rev())
            {
                *dst = *src;
            }
            out += len;
            start += len;
        }
        if stream.write_all(&wbuf[..out]).is_err() {
            return;
        }
        rbuf.copy_within(start..filled, 0);
        filled -= start;
    }
}

/// Reads the `listening on <addr>` line of a child.
fn listening_addr(child: &mut ChildGuard) -> SocketAddr {
    let stdout = child.0.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let line = lines.next().expect("the child printed nothing").unwrap();
    std::thread::spawn(move || for _ in lines {});
    line.strip_prefix("listening on ")
        .and_then(|addr| addr.parse().ok())
        .unwrap_or_else(|| panic!("unexpected first line `{line}`"))
}

struct Ours {
    server: ChildGuard,
    orchestrator: ChildGuard,
    addr: SocketAddr,
    _dir: TempDir,
}

/// The server's `--cpu`s.
fn server_cpus() -> Vec<String> {
    let cpus = std::env::var(CPUS_ENV).unwrap_or_else(|_| {
        // The first two CPUs this process may run on.
        let allowed = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).unwrap();
        let allowed: Vec<String> = (0..nix::sched::CpuSet::count())
            .filter(|&cpu| allowed.is_set(cpu).unwrap_or(false))
            .take(2)
            .map(|cpu| cpu.to_string())
            .collect();
        allowed.join(",")
    });
    cpus.split(',').map(str::to_owned).collect()
}

const SERVER: &str = env!("CARGO_BIN_EXE_gpu-offload-server");
const ORCHESTRATOR: &str = env!("CARGO_BIN_EXE_gpu-offload-orchestrator");

/// Our server and orchestrator, started by `server` and `orchestrator` (the programs, with any
/// arguments before their own, the processor's among them) on `channel`.
fn start_ours(mut server: Command, mut orchestrator: Command, channel: &str, dir: TempDir) -> Ours {
    let cpus = server_cpus();
    let in_flight = SERVER_IN_FLIGHT.to_string();
    server.args(["-c", channel, "-p", "0", "-a", "127.0.0.1", "-l", "30"]);
    server.args(["--max-concurrent-messages", &in_flight]);
    for cpu in &cpus {
        server.args(["--cpu", cpu]);
    }
    let mut server = ChildGuard(
        server
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting the server"),
    );
    let orchestrator_cpus = std::env::var(ORCH_CPUS_ENV).unwrap_or_else(|_| {
        let mut rotated = cpus.clone();
        rotated.rotate_left(1);
        rotated.join(",")
    });
    for cpu in orchestrator_cpus.split(',').filter(|cpu| !cpu.is_empty()) {
        orchestrator.args(["--cpu", cpu]);
    }
    if let Ok(args) = std::env::var(ORCH_ARGS_ENV) {
        orchestrator.args(args.split_whitespace());
    }
    let orchestrator = ChildGuard(
        orchestrator
            .args(["-c", channel, "-t", &cpus.len().to_string(), "-l", "30"])
            .args(["--max-concurrent-messages", &in_flight])
            .stdout(Stdio::null())
            .spawn()
            .expect("starting the orchestrator"),
    );
    let addr = listening_addr(&mut server);
    Ours {
        server,
        orchestrator,
        addr,
        _dir: dir,
    }
}

/// Server and orchestrator on this machine, over shared memory, with `processor` (`cpu` or
/// `cuda`).
fn start_local(processor: &str) -> Ours {
    let dir = TempDir::new("gpu-offload-bench");
    let socket = dir.path().join("channel.sock");
    let socket = socket.to_str().unwrap().to_owned();
    let mut orchestrator = Command::new(ORCHESTRATOR);
    orchestrator.args(["--processor", processor]);
    start_ours(Command::new(SERVER), orchestrator, &socket, dir)
}

/// The CUDA processor's stack, where this build has it and this machine has a GPU.
#[cfg(feature = "cuda")]
fn start_cuda() -> Option<Ours> {
    match gpu_offload::orchestrator::cuda::Gpu::open(None) {
        Ok(_) => Some(start_local("cuda")),
        Err(why) => {
            println!("CUDA processor skipped: {why}");
            None
        }
    }
}

/// Without the `cuda` feature there are no CUDA figures.
#[cfg(not(feature = "cuda"))]
fn start_cuda() -> Option<Ours> {
    println!("CUDA processor skipped: built without the cuda feature (--features cuda)");
    None
}

/// Server and orchestrator on two machines (network namespaces), over UCX on TCP; clients run
/// on the server's machine. Only with the `ucx` feature.
struct Remote {
    ours: Ours,
    #[cfg(feature = "ucx")]
    network: urom_testkit::netns::Network,
}

#[cfg(feature = "ucx")]
impl Remote {
    const SERVER_NS: usize = 0;
    const ORCHESTRATOR_NS: usize = 1;

    /// Starts them, or says why it cannot here.
    fn start() -> Result<Self, String> {
        let network = urom_testkit::netns::Network::create("gpubench", 2)?;
        let ip = network.hub_address(Self::ORCHESTRATOR_NS);
        let port = network.run_in(Self::SERVER_NS, || {
            TcpListener::bind((ip, 0)).map(|l| l.local_addr().map(|a| a.port()))
        });
        let port = port
            .and_then(|port| port)
            .map_err(|e| format!("no free port: {e}"))?;
        let on = |ns: usize, towards: usize, program: &str| {
            let mut command = network.command(ns, program);
            command
                .env("UCX_TLS", "tcp")
                .env("UCX_NET_DEVICES", network.device(ns, towards))
                .env("UCX_WARN_UNUSED_ENV_VARS", "n");
            command
        };
        let ours = start_ours(
            on(Self::SERVER_NS, Self::ORCHESTRATOR_NS, SERVER),
            on(Self::ORCHESTRATOR_NS, Self::SERVER_NS, ORCHESTRATOR),
            &format!("ucx://{ip}:{port}"),
            TempDir::new("gpu-offload-bench-remote"),
        );
        Ok(Self { ours, network })
    }
}

impl Remote {
    /// A client run on the server's machine.
    fn run(&self, config: &ClientConfig) -> Stats {
        #[cfg(feature = "ucx")]
        let stats = self
            .network
            .run_in(Remote::SERVER_NS, || client::run(config));
        #[cfg(not(feature = "ucx"))]
        let stats = client::run(config);
        stats.expect("client run across machines")
    }

    fn stop(self) {
        self.ours.stop();
    }
}

/// Where the two-machine figures come from, if anywhere.
#[cfg(feature = "ucx")]
fn start_remote() -> Option<Remote> {
    Remote::start()
        .map_err(|why| println!("two machines skipped: {why}"))
        .ok()
}

/// Without the `ucx` feature there are no two-machine figures.
#[cfg(not(feature = "ucx"))]
fn start_remote() -> Option<Remote> {
    println!("two machines skipped: built without the ucx feature (--features ucx)");
    None
}

impl Ours {
    fn stop(self) {
        let Ours {
            mut server,
            mut orchestrator,
            ..
        } = self;
        server.signal(2);
        let _ = server.wait_timeout(Duration::from_secs(20));
        let _ = orchestrator.wait_timeout(Duration::from_secs(20));
    }
}

fn start_bare() -> (ChildGuard, SocketAddr) {
    let mut child = ChildGuard(
        Command::new(std::env::current_exe().unwrap())
            .env(BARE_ENV, "1")
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting the bare server"),
    );
    let addr = listening_addr(&mut child);
    (child, addr)
}

fn config(server: SocketAddr, threads: usize, iterations: u64) -> ClientConfig {
    let message: Vec<u8> = (0..PAYLOAD).map(|i| b'a' + (i % 26) as u8).collect();
    let expected = message.iter().rev().copied().collect();
    ClientConfig {
        server,
        threads,
        iterations,
        message,
        expected,
        pipeline: PIPELINE,
        timeout: Duration::from_secs(60),
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    if std::env::var_os(BARE_ENV).is_some() {
        run_bare();
        return;
    }
    let ours = start_local("cpu");
    let cuda = start_cuda();
    let (_bare, bare_addr) = start_bare();
    let remote = start_remote();
    let quick = std::env::var_os(QUICK_ENV).is_some();
    let mut criterion = Criterion::default()
        .configure_from_args()
        .sample_size(20)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    if !quick {
        let mut group = criterion.benchmark_group("gpu_offload");
        group.throughput(Throughput::Elements(1));
        for threads in CLIENT_THREADS {
            let cuda_addr = cuda.as_ref().map(|cuda| ("cuda", cuda.addr));
            for (name, addr) in [("ours", ours.addr), ("bare", bare_addr)]
                .into_iter()
                .chain(cuda_addr)
            {
                group.bench_function(format!("{name}_{threads}t"), |b| {
                    b.iter_custom(|iters| {
                        let per_thread = iters.div_ceil(threads as u64).max(1);
                        let stats =
                            client::run(&config(addr, threads, per_thread)).expect("client run");
                        stats
                            .duration
                            .mul_f64(iters as f64 / stats.operations as f64)
                    });
                });
            }
            if let Some(remote) = &remote {
                group.bench_function(format!("remote_{threads}t"), |b| {
                    b.iter_custom(|iters| {
                        let per_thread = iters.div_ceil(threads as u64).max(1);
                        let stats = remote.run(&config(remote_addr(remote), threads, per_thread));
                        stats
                            .duration
                            .mul_f64(iters as f64 / stats.operations as f64)
                    });
                });
            }
        }
        group.finish();
    }
    criterion.final_summary();

    let rounds = if quick { 5 } else { ROUNDS };
    println!();
    println!(
        "interleaved: {rounds} rounds of {ROUND_OPS} requests per client thread, {PAYLOAD}-byte \
         payloads, {PIPELINE} in flight per thread"
    );
    for threads in CLIENT_THREADS {
        let (mut ours_rates, mut bare_rates, mut ratios) = (vec![], vec![], vec![]);
        let (mut remote_rates, mut remote_ratios) = (vec![], vec![]);
        let (mut cuda_rates, mut cuda_ratios) = (vec![], vec![]);
        for _ in 0..rounds {
            let ours_rate = client::run(&config(ours.addr, threads, ROUND_OPS))
                .unwrap()
                .miops();
            let bare_rate = client::run(&config(bare_addr, threads, ROUND_OPS))
                .unwrap()
                .miops();
            ours_rates.push(ours_rate);
            bare_rates.push(bare_rate);
            ratios.push(ours_rate / bare_rate);
            if let Some(cuda) = &cuda {
                let cuda_rate = client::run(&config(cuda.addr, threads, ROUND_OPS))
                    .unwrap()
                    .miops();
                cuda_rates.push(cuda_rate);
                cuda_ratios.push(cuda_rate / ours_rate);
            }
            if let Some(remote) = &remote {
                let remote_rate = remote
                    .run(&config(remote_addr(remote), threads, ROUND_OPS))
                    .miops();
                remote_rates.push(remote_rate);
                remote_ratios.push(remote_rate / ours_rate);
            }
        }
        println!(
            "  {threads} client thread(s): ours {:.3} MIOP/s, bare TCP {:.3} MIOP/s, ours/bare {:.2} (median of per-round ratios)",
            median(&mut ours_rates),
            median(&mut bare_rates),
            median(&mut ratios)
        );
        if !cuda_rates.is_empty() {
            println!(
                "  {threads} client thread(s): ours with the CUDA processor {:.3} MIOP/s, cuda/cpu {:.2} (median of per-round ratios)",
                median(&mut cuda_rates),
                median(&mut cuda_ratios)
            );
        }
        if !remote_rates.is_empty() {
            println!(
                "  {threads} client thread(s): ours on two machines (UCX over TCP) {:.3} MIOP/s, two machines/one {:.2} (median of per-round ratios)",
                median(&mut remote_rates),
                median(&mut remote_ratios)
            );
        }
    }
    ours.stop();
    if let Some(cuda) = cuda {
        cuda.stop();
    }
    if let Some(remote) = remote {
        remote.stop();
    }
}

/// The address clients reach the two-machine server at (on its machine).
fn remote_addr(remote: &Remote) -> SocketAddr {
    remote.ours.addr
}
