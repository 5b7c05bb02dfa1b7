//! Loopback commands through a real `urom-worker` process, beside the bare transport, in one
//! run:
//!
//! * `worker/transport_round_trip_64B`: a 64-byte frame to an echo process and back over a
//!   shared-memory connection, the least a worker round trip can cost;
//! * `worker/native_round_trip_64B`: a 64-byte graph loopback command (frame header, command
//!   header, 16-byte payload) through the worker and the graph plugin's native path, and its
//!   notification back;
//! * `worker/doca_round_trip_64B`: the same through the C loopback plugin (DOCA descriptor
//!   path: a `malloc` and a `free` per descriptor);
//! * `worker_rate/native_pipelined_64`: 64 commands kept in flight, in commands per second.
//!
//! This process runs on core 0, its peers on core 1, everything busy-polling, one peer at a
//! time. Because these benches run seconds apart and a VM's cores change speed and placement
//! over seconds, the binary then measures the three round trips again interleaved: all three
//! peers wait adaptively (asleep when not served), and batches of round trips alternate
//! between them; the median of the per-batch ratios is the comparison to trust.
//! `benches/run-worker-bench.sh` runs it and prints the medians and ratios.

use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use urom_benches::{
    HOST_CORE, PEER_CORE, batch_median, config, host_wait, loopback_frame, median, round_trip,
    worker,
};
use urom_testkit::{ChildGuard, TempDir, c_shared_object, cdylib, workspace_root};
use urom_transport::Channel;
use urom_transport::{Transport, WaitMode};

const ECHO_ENV: &str = "UROM_BENCH_ECHO_SOCKET";
const ECHO_WAIT_ENV: &str = "UROM_BENCH_ECHO_ADAPTIVE";
const IN_FLIGHT: u64 = 64;

/// Batches of the interleaved comparison.
const BATCHES: usize = 200;

/// The echo peer: this binary re-run with [`ECHO_ENV`] set; returns every frame it receives.
fn run_echo(socket: &Path) {
    urom_transport::sys::pin_current_thread(PEER_CORE).expect("pinning the echo process");
    let stream = UnixStream::connect(socket).expect("connecting to the benchmark");
    let wait = if std::env::var_os(ECHO_WAIT_ENV).is_some() {
        WaitMode::default()
    } else {
        WaitMode::BusyPoll
    };
    let mut conn = Channel::accept(stream, &config(wait)).expect("echo handshake");
    let mut frame = [0u8; 4096];
    loop {
        let len = match conn.recv() {
            Ok(Some(received)) => {
                frame[..received.len()].copy_from_slice(received);
                received.len()
            }
            Ok(None) => {
                if conn.wait_recv(Duration::from_millis(100)).is_err() {
                    return;
                }
                continue;
            }
            Err(_) => return,
        };
        while conn.send(&frame[..len]).is_err() {}
    }
}

/// A connection to an echo process, like a worker's but with nothing behind it.
fn echo_peer(dir: &TempDir, busy_poll: bool) -> (ChildGuard, Channel) {
    let socket = dir.path().join(format!("echo-{busy_poll}.sock"));
    let listener = UnixListener::bind(&socket).unwrap();
    let mut command = Command::new(std::env::current_exe().unwrap());
    command.env(ECHO_ENV, &socket);
    if !busy_poll {
        command.env(ECHO_WAIT_ENV, "1");
    }
    let child = command.spawn().expect("starting the echo process");
    let (stream, _) = listener.accept().unwrap();
    let conn = Channel::offer(stream, &config(host_wait())).expect("echo handshake");
    (ChildGuard(child), conn)
}

fn pipelined(conn: &mut Channel, frame: &[u8], count: u64) -> Duration {
    let start = Instant::now();
    let (mut sent, mut done) = (0, 0);
    while done < count {
        while sent < count && sent - done < IN_FLIGHT && conn.send(frame).is_ok() {
            sent += 1;
        }
        if conn.recv().expect("the peer went away").is_some() {
            done += 1;
        }
    }
    start.elapsed()
}

/// The three round trips in alternating batches; prints medians and per-batch ratios.
fn interleaved(dir: &TempDir, graph: &Path, c_loopback: &Path, frame: &[u8]) {
    let (_echo, mut bare) = echo_peer(dir, false);
    let (_native_worker, mut native) = worker(dir, "interleaved-native", graph, false);
    let (_doca_worker, mut doca) = worker(dir, "interleaved-doca", c_loopback, false);
    let mut rows = Vec::with_capacity(BATCHES);
    for _ in 0..BATCHES {
        let bare_ns = batch_median(|| round_trip(&mut bare, frame));
        let native_ns = batch_median(|| round_trip(&mut native, frame));
        let doca_ns = batch_median(|| round_trip(&mut doca, frame));
        rows.push([
            bare_ns,
            native_ns,
            doca_ns,
            native_ns / bare_ns,
            doca_ns / bare_ns,
        ]);
    }
    let column = |i: usize| median(&mut rows.iter().map(|row| row[i]).collect::<Vec<_>>());
    println!();
    println!("interleaved: {BATCHES} batches of bare / native / DOCA round trips, medians");
    println!("  bare shm round trip (echo process)  {:8.1} ns", column(0));
    println!("  graph plugin, native path           {:8.1} ns", column(1));
    println!("  C loopback plugin, DOCA path        {:8.1} ns", column(2));
    println!("  native / bare, per batch            {:8.2}", column(3));
    println!("  DOCA / bare, per batch              {:8.2}", column(4));
}

fn main() {
    if let Some(socket) = std::env::var_os(ECHO_ENV) {
        run_echo(&PathBuf::from(socket));
        return;
    }
    urom_transport::sys::pin_current_thread(HOST_CORE).expect("pinning the benchmark");
    let dir = TempDir::new("urom-worker-bench");
    let graph = cdylib("urom-plugin-graph", "worker_graph");
    let root = workspace_root();
    let c_loopback = c_shared_object(
        &root.join("plugins/c-loopback/loopback.c"),
        "c_loopback_bench",
        &[&root.join("plugins/include")],
        &[],
    );
    let frame = loopback_frame();
    let mut criterion = Criterion::default().configure_from_args();
    // One peer at a time: each busy-polls the peer core.
    let mut group = criterion.benchmark_group("worker");
    {
        let (_echo, mut conn) = echo_peer(&dir, true);
        group.bench_function("transport_round_trip_64B", |b| {
            b.iter(|| round_trip(&mut conn, &frame))
        });
    }
    {
        let (_worker, mut conn) = worker(&dir, "native", &graph, true);
        group.bench_function("native_round_trip_64B", |b| {
            b.iter(|| round_trip(&mut conn, &frame))
        });
    }
    {
        let (_worker, mut conn) = worker(&dir, "doca", &c_loopback, true);
        group.bench_function("doca_round_trip_64B", |b| {
            b.iter(|| round_trip(&mut conn, &frame))
        });
    }
    group.finish();
    let mut group = criterion.benchmark_group("worker_rate");
    group.throughput(Throughput::Elements(1));
    {
        let (_worker, mut conn) = worker(&dir, "native-rate", &graph, true);
        group.bench_function("native_pipelined_64", |b| {
            b.iter_custom(|count| pipelined(&mut conn, &frame, count))
        });
    }
    group.finish();
    criterion.final_summary();
    interleaved(&dir, &graph, &c_loopback, &frame);
}
