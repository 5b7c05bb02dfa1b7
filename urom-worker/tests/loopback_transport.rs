//! A host `Worker` and the worker's dispatch joined by the in-process loopback transport: both
//! are written against the transport trait, so neither cares which transport carries frames.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use urom_graph::{GraphHost, loopback_result};
use urom_host::{CompletedTask, Idle, ProgressEngine, Service, Worker as HostWorker};
use urom_plugin::abi::PluginLibrary;
use urom_testkit::daemon::{self, plugin_dir};
use urom_testkit::{TempDir, binary, cdylib};
use urom_transport::loopback::LoopbackConnection;
use urom_wire::{MaxMsgSize, Status};
use urom_worker::Worker;

const LOOPBACKS: u64 = 1000;
const IN_FLIGHT: usize = 16;
const TIMEOUT: Duration = Duration::from_secs(60);

thread_local! {
    static DONE: RefCell<Vec<(Status, u64, u64)>> = const { RefCell::new(Vec::new()) };
}

fn record(task: &CompletedTask<'_>) {
    let entry = match loopback_result(task) {
        Ok(result) => (Status::Success, result.data, result.cookie),
        Err(status) => (status, 0, 0),
    };
    DONE.with(|done| done.borrow_mut().push(entry));
}

#[test]
fn host_worker_and_dispatch_over_the_loopback_transport() {
    // The host API needs a service; the worker itself runs here, in this process.
    let plugins = TempDir::new("urom-loopback-plugins");
    let dir = plugin_dir(&plugins, &[("urom-plugin-graph", "worker_graph")]);
    let daemon = daemon::start_daemon(
        binary("urom-daemon", "urom-daemon"),
        dir.to_str().unwrap(),
        &[],
        true,
    );
    let max = MaxMsgSize::DEFAULT;
    let (host_end, worker_end) = LoopbackConnection::pair(max, IN_FLIGHT);
    let graph_library = PluginLibrary::load(&cdylib("urom-plugin-graph", "worker_graph")).unwrap();
    let mut worker = Worker::new(vec![graph_library.open(1, max).unwrap()], max, false, None);
    worker.admit(host_end.into());

    let finished = Arc::new(AtomicBool::new(false));
    let host_finished = Arc::clone(&finished);
    let socket = daemon.socket.clone();
    let host = std::thread::spawn(move || {
        let service = Service::<Idle>::new()
            .set_socket(&socket)
            .start()
            .map_err(|(_, e)| e)
            .unwrap();
        let info = service.plugin("worker_graph").unwrap().clone();
        assert_eq!(info.id, 1, "the only plugin gets the first id");
        let graph = GraphHost::init(info.id, info.version).unwrap();
        let mut engine = ProgressEngine::new();
        let worker = HostWorker::new()
            .set_service(&service)
            .set_id(7)
            .set_plugins(graph.id())
            .set_max_inflight_tasks(IN_FLIGHT)
            .attach(&mut engine, worker_end.into())
            .map_err(|(_, e)| e)
            .unwrap();
        assert_eq!(worker.id(), 7);
        let deadline = Instant::now() + TIMEOUT;
        let mut sent = 0;
        let mut done = Vec::new();
        while (done.len() as u64) < LOOPBACKS {
            while sent < LOOPBACKS && graph.loopback(&worker, sent, sent + 1, record).is_ok() {
                sent += 1;
            }
            engine.progress();
            done.extend(DONE.with(|d| d.borrow_mut().drain(..).collect::<Vec<_>>()));
            assert!(Instant::now() < deadline, "loopbacks did not complete");
        }
        host_finished.store(true, Ordering::Relaxed);
        done
    });
    while !finished.load(Ordering::Relaxed) && !host.is_finished() {
        worker.turn();
    }
    let mut done = host.join().unwrap();
    // Each task's cookie is its number, its data the number plus one.
    done.sort_by_key(|&(_, _, cookie)| cookie);
    assert_eq!(done.len() as u64, LOOPBACKS);
    for (i, entry) in (0..).zip(&done) {
        assert_eq!(*entry, (Status::Success, i + 1, i), "loopback {i}");
    }
}
