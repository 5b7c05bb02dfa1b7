//! The samples of urom, as in the DOCA UROM guide.
//!
//! [`bootstrap`] is the multi-worker bootstrap: the main thread runs the service, four threads
//! each start a worker (group = id % 2) with their own progress engine and send it a graph
//! loopback, then the main thread lists the even and odd groups.
//!
//! `ping_pong` (feature `ucx`) is the ping-pong: ranks, each a process with a worker running the
//! sandbox plugin, pass a message worker to worker over UCX.
#![deny(unsafe_code)]

#[cfg(feature = "ucx")]
pub mod ping_pong;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use urom_graph::{GraphHost, loopback_result};
use urom_host::CompletedTask;
use urom_host::{Idle, ProgressEngine, Running, Service, StartProgress, Worker};

/// Workers the bootstrap starts.
pub const WORKERS: u64 = 4;
/// How long a worker may take to start or answer.
const TIMEOUT: Duration = Duration::from_secs(30);

/// Progresses `engine` until `worker` runs.
pub fn run_worker(engine: &mut ProgressEngine, worker: Worker<Idle>) -> Result<Worker<Running>> {
    let starting = worker.start(engine).map_err(|(_, e)| anyhow!("{e}"))?;
    match starting.wait_running(engine, TIMEOUT) {
        Ok(running) => Ok(running),
        Err(StartProgress::Starting(_)) => bail!("worker did not start within {TIMEOUT:?}"),
        Err(StartProgress::Failed(_, e)) => bail!("worker failed to start: {e}"),
    }
}

std::thread_local! {
    static ANSWER: std::cell::Cell<Option<Result<(u64, u64), i32>>> = const { std::cell::Cell::new(None) };
}

fn record_answer(task: &CompletedTask<'_>) {
    let answer = loopback_result(task)
        .map(|r| (r.data, r.cookie))
        .map_err(|s| s.raw());
    ANSWER.with(|cell| cell.set(Some(answer)));
}

/// Sends one graph loopback and waits for its answer.
pub fn loopback_once(
    engine: &mut ProgressEngine,
    graph: &GraphHost,
    worker: &Worker<Running>,
    data: u64,
) -> Result<u64> {
    ANSWER.with(|cell| cell.set(None));
    graph
        .loopback(worker, data, data, record_answer)
        .map_err(|e| anyhow!("{e}"))?;
    let deadline = Instant::now() + TIMEOUT;
    loop {
        engine.progress();
        if let Some(answer) = ANSWER.with(|cell| cell.take()) {
            let (received, _) =
                answer.map_err(|status| anyhow!("loopback failed with status {status}"))?;
            return Ok(received);
        }
        if Instant::now() > deadline {
            bail!("no loopback answer within {TIMEOUT:?}");
        }
    }
}

/// The graph plugin's host interface, checked against the service's version.
pub fn graph_host(service: &Service<Running>) -> Result<GraphHost> {
    let info = service
        .plugin(urom_graph::NAME)
        .context("the service does not offer the worker_graph plugin")?;
    Ok(GraphHost::init(info.id, info.version)?)
}

/// The multi-worker bootstrap. Workers stay up until `stop` is set (or at once with `once`);
/// prints the sample's log lines through `log`.
pub fn bootstrap(
    service: &Service<Running>,
    stop: &AtomicBool,
    once: bool,
    log: &(dyn Fn(String) + Sync),
) -> Result<()> {
    let graph = graph_host(service)?;
    log(format!(
        "graph plugin: id {:#x}, version {:#x}",
        graph.id(),
        urom_graph::VERSION
    ));
    let started = Barrier::new(WORKERS as usize + 1);
    let queried = Barrier::new(WORKERS as usize + 1);
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|scope| -> Result<()> {
        for id in 0..WORKERS {
            let (graph, started, queried, failures) = (&graph, &started, &queried, &failures);
            scope.spawn(move || {
                let result = (|| -> Result<()> {
                    let mut engine = ProgressEngine::new();
                    let gid = (id % 2) as u32;
                    let worker = Worker::new()
                        .set_service(service)
                        .set_id(id)
                        .set_gid(gid)
                        .set_plugins(graph.id());
                    let worker = run_worker(&mut engine, worker)?;
                    log(format!("worker {id} (group {gid}) is running"));
                    let received = loopback_once(&mut engine, graph, &worker, id)?;
                    if received != id {
                        bail!("worker {id}: sent {id}, received {received}");
                    }
                    log(format!(
                        "worker {id}: graph loopback sent {id}, received {received}"
                    ));
                    started.wait();
                    queried.wait();
                    worker.stop().map_err(|(_, e)| anyhow!("{e}"))?;
                    log(format!("worker {id} destroyed"));
                    Ok(())
                })();
                if let Err(e) = result {
                    failures
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(format!("{e:#}"));
                    // Do not leave the others waiting.
                    started.wait();
                    queried.wait();
                }
            });
        }
        started.wait();
        for (gid, parity) in [(0, "even"), (1, "odd")] {
            let ids = service.workers_by_gid(gid).map_err(|e| anyhow!("{e}"));
            match ids {
                Ok(ids) => log(format!("workers of group {gid} ({parity} ids): {ids:?}")),
                Err(e) => log(format!("group {gid} query failed: {e}")),
            }
        }
        if !once {
            log("waiting for Ctrl-C".to_owned());
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        queried.wait();
        Ok(())
    })?;
    let failures = failures.into_inner().unwrap_or_else(|p| p.into_inner());
    if !failures.is_empty() {
        bail!("{}", failures.join("; "));
    }
    Ok(())
}
