//! What the worker's software costs per command, on one thread with every line in its cache:
//! a host half and a worker share this thread and a shared-memory channel; bursts of graph
//! loopback commands go in, one worker turn dispatches them, the notifications come out. The
//! same bursts echoed by hand (receive, send back) give the channel's own cost beside it.
//!
//! `cargo run --release -p urom-worker --example dispatch_cost -- PATH/libworker_graph.so`
//!
//! `WORKER_ONLY=1` skips the hand-echoed channel, `ONCE=1` measures once instead of three times
//! and `BURSTS=N` sets the bursts of 64 per measurement: with all three, under
//! `valgrind --tool=callgrind`, the difference between two values of `BURSTS` counts the
//! instructions of one command, free of the noise of a shared machine.
//!
//! `HOST_API=1` makes the host half the host API instead (`GraphHost::loopback_batch`, then the
//! engine's progress and the completion callback, against a service of a `urom-daemon` this
//! starts; the worker still runs on this thread): the instructions outside `Worker::turn` are
//! then the host API's per command. Build `urom-daemon` and `urom-worker` first (same profile).

use std::hint::black_box;
use std::time::Instant;

use urom_graph::{GraphHost, loopback_result};
use urom_host::{CompletedTask, Idle, ProgressEngine, Service, Worker as HostWorker};
use urom_plugin::abi::PluginLibrary;
use urom_transport::shm::ShmConnection;
use urom_transport::{Channel, ChannelConfig, FrameSender, Transport, WaitMode};
use urom_wire::MaxMsgSize;

const BURST: usize = 64;
/// Bursts per measurement (`BURSTS` in the environment to change it).
fn bursts() -> usize {
    std::env::var("BURSTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(200_000)
}

fn config() -> ChannelConfig {
    ChannelConfig {
        wait: WaitMode::BusyPoll,
        ..ChannelConfig::new(MaxMsgSize::DEFAULT)
    }
}

fn main() {
    let path = std::env::args()
        .nth(1)
        .expect("usage: dispatch_cost PATH/libworker_graph.so");
    let mut frame = urom_testkit::worker::loopback_frame();
    let runs = if std::env::var_os("ONCE").is_some() {
        1
    } else {
        3
    };
    if std::env::var_os("HOST_API").is_some() {
        for _ in 0..runs {
            through_host_api(&path);
        }
        return;
    }
    for _ in 0..runs {
        // Through a worker.
        let plugin = PluginLibrary::load(path.as_ref())
            .expect("loading the plugin")
            .open(1, MaxMsgSize::DEFAULT)
            .expect("opening the plugin");
        let (host, worker_side) = ShmConnection::pair(&config()).expect("a channel");
        let mut host: Channel = host.into();
        let mut worker = urom_worker::Worker::new(vec![plugin], MaxMsgSize::DEFAULT, true, None);
        worker.admit(worker_side.into());
        let start = Instant::now();
        for _ in 0..bursts() {
            for _ in 0..BURST {
                // Numbered as the host API does: the frame is its own ready mark.
                let seq = host.split().0.next_seq();
                frame[16..24].copy_from_slice(&seq.to_le_bytes());
                host.send(&frame).expect("room");
            }
            worker.turn();
            for _ in 0..BURST {
                black_box(host.recv().expect("alive").expect("an answer"));
            }
        }
        let through_worker = start.elapsed().as_nanos() as f64 / (bursts() * BURST) as f64;
        if std::env::var_os("WORKER_ONLY").is_some() {
            println!("per command: through the worker {through_worker:5.1} ns");
            continue;
        }

        // Echoed by hand.
        let (a, b) = ShmConnection::pair(&config()).expect("a channel");
        let (mut a, mut b): (Channel, Channel) = (a.into(), b.into());
        let mut copy = [0u8; 72];
        let start = Instant::now();
        for _ in 0..bursts() {
            for _ in 0..BURST {
                a.send(&frame).expect("room");
            }
            for _ in 0..BURST {
                let got = b.recv().expect("alive").expect("a frame");
                copy[..got.len()].copy_from_slice(got);
                b.send(&copy).expect("room");
            }
            for _ in 0..BURST {
                black_box(a.recv().expect("alive").expect("an answer"));
            }
        }
        let echoed = start.elapsed().as_nanos() as f64 / (bursts() * BURST) as f64;
        println!(
            "per command: through the worker {through_worker:5.1} ns, echoed by hand {echoed:5.1} ns, the worker's own {:5.1} ns",
            through_worker - echoed
        );
    }
}

std::thread_local! {
    static COMPLETED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn completed(task: &CompletedTask<'_>) {
    black_box(loopback_result(task).expect("the loopback succeeds"));
    COMPLETED.with(|done| done.set(done.get() + 1));
}

/// Bursts of loopbacks through the host API and a worker, both on this thread.
fn through_host_api(path: &str) {
    let plugins = urom_testkit::TempDir::new("urom-dispatch-cost");
    let dir = urom_testkit::daemon::plugin_dir(&plugins, &[("urom-plugin-graph", "worker_graph")]);
    let daemon = urom_testkit::daemon::start_daemon(
        urom_testkit::binary("urom-daemon", "urom-daemon"),
        dir.to_str().expect("a UTF-8 path"),
        &[],
        true,
    );
    let service = Service::<Idle>::new()
        .set_socket(&daemon.socket)
        .start()
        .map_err(|(_, e)| e)
        .expect("a service");
    let info = service.plugin("worker_graph").expect("the graph plugin");
    let graph = GraphHost::init(info.id, info.version).expect("a known version");
    let plugin = PluginLibrary::load(path.as_ref())
        .expect("loading the plugin")
        .open(info.id, MaxMsgSize::DEFAULT)
        .expect("opening the plugin");
    let (host, worker_side) = ShmConnection::pair(&config()).expect("a channel");
    let mut worker = urom_worker::Worker::new(vec![plugin], MaxMsgSize::DEFAULT, true, None);
    worker.admit(worker_side.into());
    let mut engine = ProgressEngine::new();
    let host = HostWorker::new()
        .set_service(&service)
        .set_id(1)
        .set_plugins(graph.id())
        .set_max_inflight_tasks(BURST)
        .attach(&mut engine, host.into())
        .map_err(|(_, e)| e)
        .expect("attaching the worker");
    // Each measurement counts its own completions (`ONCE` unset measures three times).
    COMPLETED.with(|done| done.set(0));
    let start = Instant::now();
    let mut sent = 0u64;
    for _ in 0..bursts() {
        let went = graph
            .loopback_batch(&host, sent, BURST, completed)
            .expect("room for a burst");
        assert_eq!(went, BURST, "a whole burst goes");
        sent += BURST as u64;
        worker.turn();
        engine.progress();
        assert_eq!(
            COMPLETED.with(std::cell::Cell::get),
            sent,
            "one progress completes a burst"
        );
    }
    let ns = start.elapsed().as_nanos() as f64 / (bursts() * BURST) as f64;
    println!("per command: through the host API and the worker {ns:5.1} ns");
}
