//! Benchmarks of urom; the benches are under `benches/`. Run `cargo bench -p urom-benches`.
//!
//! What several benches share: the peers they measure against and the interleaved batches
//! that compare them on a VM whose cores change speed over seconds.

use std::hint::black_box;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use urom_contract::worker_command::{PluginSpec, WorkerCommand};
use urom_plugin::plugin_id::PluginId;
use urom_testkit::{ChildGuard, TempDir, binary};
use urom_transport::{Channel, ChannelConfig};
use urom_transport::{Transport, WaitMode};

/// The core the measuring process runs on.
pub const HOST_CORE: usize = 0;
/// The core its peer runs on.
pub const PEER_CORE: usize = 1;
/// Round trips per timed sample, and samples per batch, of [`batch_median`].
const ROUND_TRIPS_PER_SAMPLE: u32 = 10;
const SAMPLES_PER_BATCH: usize = 51;

/// Shared-memory settings with wait mode `wait`.
pub fn config(wait: WaitMode) -> ChannelConfig {
    ChannelConfig {
        wait,
        ..ChannelConfig::default()
    }
}

/// The host side always spins: it is the one measuring.
pub fn host_wait() -> WaitMode {
    WaitMode::BusyPoll
}

/// A worker process running `plugin` as id 1 on [`PEER_CORE`], and a host connection to it.
pub fn worker(dir: &TempDir, name: &str, plugin: &Path, busy_poll: bool) -> (ChildGuard, Channel) {
    let socket = dir.path().join(format!("{name}.sock"));
    let plugin = PluginSpec {
        path: plugin.to_owned(),
        id: PluginId::from_index(0).expect("index 0 is a plugin id"),
    };
    let mut worker = WorkerCommand::new(vec![plugin], socket.clone());
    worker.cpuset = Some([PEER_CORE].into_iter().collect());
    worker.log_level = 30;
    worker.busy_poll = busy_poll;
    let child = Command::new(binary("urom-worker", "urom-worker"))
        .args(worker.to_args())
        .stdout(Stdio::null())
        .spawn()
        .expect("starting urom-worker");
    let child = ChildGuard(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    let stream = loop {
        match UnixStream::connect(&socket) {
            Ok(stream) => break stream,
            Err(e) if Instant::now() > deadline => panic!("the worker did not come up: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let conn = Channel::accept(stream, &config(host_wait())).expect("worker handshake");
    (child, conn)
}

pub use urom_testkit::worker::loopback_frame;

/// Sends `frame` and waits for the answer, spinning.
pub fn round_trip(conn: &mut Channel, frame: &[u8]) {
    while conn.send(frame).is_err() {}
    loop {
        if let Some(answer) = conn.recv().expect("the peer went away") {
            black_box(answer);
            return;
        }
    }
}

/// Median time of one round trip over `ROUND_TRIPS_PER_SAMPLE`-round-trip samples, after a
/// warm-up that wakes the peer.
pub fn batch_median(mut round_trip: impl FnMut()) -> f64 {
    for _ in 0..100 {
        round_trip();
    }
    let mut samples = [0f64; SAMPLES_PER_BATCH];
    for sample in &mut samples {
        let start = Instant::now();
        for _ in 0..ROUND_TRIPS_PER_SAMPLE {
            round_trip();
        }
        *sample = start.elapsed().as_nanos() as f64 / f64::from(ROUND_TRIPS_PER_SAMPLE);
    }
    median(&mut samples)
}

/// The median of `values` (sorts them).
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
