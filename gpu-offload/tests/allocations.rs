//! Zero allocations per message in the server's and the orchestrator's data paths.
//!
//! Server, orchestrator (CPU processor) and client run in this process, under an allocator
//! that counts every allocation of every thread. The same client runs twice with different
//! message counts; the difference in allocations, divided by the difference in messages, is
//! the cost per message of the whole path: client, server data-path threads, data connections,
//! processor threads. With the `ucx` feature the same runs again with the channel over UCX on
//! the loopback interface (`-c ucx://127.0.0.1:PORT`); what UCX itself allocates (C `malloc`)
//! is not counted, our side of the connections is.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use clap::Parser;
use gpu_offload::client::{self, ClientConfig};
use gpu_offload::orchestrator::{self, OrchestratorArgs};
use gpu_offload::server::{PendingServer, ServerArgs};

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's obligations are passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const THREADS: usize = 2;
const FEW: u64 = 2_000;
const MANY: u64 = 42_000;

fn allocations_for(config: &ClientConfig, iterations: u64) -> u64 {
    let config = ClientConfig {
        iterations,
        ..config.clone()
    };
    let before = ALLOCATIONS.load(Ordering::SeqCst);
    let stats = client::run(&config).expect("client run");
    let after = ALLOCATIONS.load(Ordering::SeqCst);
    assert_eq!(stats.operations, iterations * THREADS as u64);
    after - before
}

#[test]
fn server_and_orchestrator_allocate_nothing_per_message() {
    let dir = urom_testkit::TempDir::new("gpu-offload-allocations");
    let socket = dir.path().join("channel.sock");
    per_message(socket.to_str().unwrap());
    // One after the other: the counter is the whole process's.
    #[cfg(feature = "ucx")]
    {
        urom_transport::ucx::set_config_defaults(&[("TLS", "tcp"), ("NET_DEVICES", "lo")]);
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        per_message(&format!("ucx://127.0.0.1:{port}"));
    }
}

/// Runs server, orchestrator and client in this process on `socket` (a channel name) and
/// checks that the path allocates nothing per message.
fn per_message(socket: &str) {
    let allowed = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).unwrap();
    let mut allowed_cpus =
        (0..nix::sched::CpuSet::count()).filter(|&cpu| allowed.is_set(cpu).unwrap_or(false));
    let first = allowed_cpus.next().unwrap();
    let cpus = [first, allowed_cpus.next().unwrap_or(first)];

    let server_args = ServerArgs::parse_from([
        "gpu-offload-server",
        "-c",
        socket,
        "-p",
        "0",
        "-a",
        "127.0.0.1",
        "--cpu",
        &cpus[0].to_string(),
        "--cpu",
        &cpus[1].to_string(),
    ]);
    let orchestrator_args = OrchestratorArgs::parse_from([
        "gpu-offload-orchestrator",
        "-c",
        socket,
        "-t",
        "2",
        "-l",
        "30",
    ]);
    let stop = Arc::new(AtomicBool::new(false));
    let pending = PendingServer::bind(server_args).expect("binding the channel");
    let orchestrator = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || orchestrator::run(orchestrator_args, &stop))
    };
    let server = pending.start(&stop).expect("starting the server");
    let addr = server.local_addr();
    let server = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || server.run(&stop))
    };
    let config = ClientConfig {
        server: addr,
        threads: THREADS,
        iterations: 0,
        message: b"0123456789abcdef0123456789abcdef0123456789abcdef0123".to_vec(),
        expected: b"3210fedcba9876543210fedcba9876543210fedcba9876543210".to_vec(),
        pipeline: 16,
        timeout: Duration::from_secs(60),
    };
    // Warm up: first connections grow the server's client table.
    allocations_for(&config, FEW);
    let few = allocations_for(&config, FEW);
    let many = allocations_for(&config, MANY);
    let messages = (MANY - FEW) * THREADS as u64;
    let per_message = (many as f64 - few as f64) / messages as f64;
    println!(
        "-c {socket}: {few} allocations for {FEW} messages per thread, {many} for {MANY}: {per_message:.5} per message"
    );
    stop.store(true, Ordering::Relaxed);
    server.join().unwrap().expect("server run");
    orchestrator.join().unwrap().expect("orchestrator run");
    assert!(
        per_message < 0.001,
        "-c {socket}: {per_message} allocations per message"
    );
}
