//! A host on another machine, for tests that run it inside a network namespace (a thread
//! cannot: UCX reads the network devices from `/sys`, which `ip netns exec` remounts for the
//! namespace). It reaches the service at ADDRESS over UCX with the key file KEY as IDENTITY:
//!
//! * `connect`: authenticates; prints `connected`.
//! * `spawn ID`: starts worker ID with the graph plugin, runs one loopback, prints
//!   `running ID`, and keeps the worker until its standard input ends.
//! * `attach ID`: tries to use worker ID; prints `attached ID`.
//! * `load ID1 ID2`: starts workers ID1 and ID2, prints `running`, then keeps up to 64
//!   loopbacks in flight to each, and prints `failing` when the first of them fails. Once its
//!   standard input ends it submits no more, prints `completed GOOD BAD SUBMITTED` when every
//!   one submitted has completed, then checks that a worker still answers and prints
//!   `answering`. The test ends the load, so however fast loopbacks run it lasts until the
//!   test has seen what it waits for.
//!
//! A refusal or failure prints `refused <reason>` and exits 3; a bad command line exits 2.

use std::cell::Cell;
use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use urom_graph::{GraphHost, loopback_result};
use urom_host::{CompletedTask, Idle, ProgressEngine, Running, Service, Worker};

/// How long anything may take.
const PATIENCE: Duration = Duration::from_secs(60);

thread_local! {
    static DONE: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

fn record(task: &CompletedTask<'_>) {
    let ok = loopback_result(task).is_ok();
    DONE.with(|done| {
        let (good, bad) = done.get();
        done.set(if ok { (good + 1, bad) } else { (good, bad + 1) });
    });
}

fn completed() -> u64 {
    DONE.with(|done| done.get().0 + done.get().1)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    let [address, key, identity, command @ ..] = words.as_slice() else {
        return usage();
    };
    let service = match Service::<Idle>::new()
        .set_remote(*address)
        .set_key_file(*key)
        .set_identity(*identity)
        .start()
    {
        Ok(service) => service,
        Err((_, e)) => return refused(e),
    };
    let number = |text: &str| text.parse::<u64>().ok();
    let result = match command {
        ["connect"] => {
            say("connected");
            Ok(())
        }
        ["spawn", id] => match number(id) {
            Some(id) => spawn(&service, id),
            None => return usage(),
        },
        ["attach", id] => match number(id) {
            Some(id) => attach(&service, id),
            None => return usage(),
        },
        ["load", a, b] => match (number(a), number(b)) {
            (Some(a), Some(b)) => load(&service, [a, b]),
            _ => return usage(),
        },
        _ => return usage(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(reason) => refused(reason),
    }
}

fn usage() -> ExitCode {
    eprintln!(
        "usage: urom-remote-host ADDRESS KEY IDENTITY (connect | spawn ID | attach ID | load ID1 ID2)"
    );
    ExitCode::from(2)
}

fn refused(reason: impl std::fmt::Display) -> ExitCode {
    say(&format!("refused {reason}"));
    ExitCode::from(3)
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn graph(service: &Service<Running>) -> Result<GraphHost, String> {
    let info = service
        .plugin("worker_graph")
        .ok_or("the graph plugin is not offered")?;
    GraphHost::init(info.id, info.version).map_err(|e| e.to_string())
}

fn start(
    engine: &mut ProgressEngine,
    service: &Service<Running>,
    graph: &GraphHost,
    id: u64,
) -> Result<Worker<Running>, String> {
    Worker::new()
        .set_service(service)
        .set_id(id)
        .set_plugins(graph.id())
        .set_max_inflight_tasks(64)
        .start(engine)
        .map_err(|(_, e)| e.to_string())?
        .wait_running(engine, PATIENCE)
        .map_err(|progress| format!("{progress:?}"))
}

/// Progresses until `count` tasks completed in all.
fn wait_for(engine: &mut ProgressEngine, count: u64) -> Result<(), String> {
    let deadline = Instant::now() + PATIENCE;
    while completed() < count {
        engine.progress();
        if Instant::now() > deadline {
            return Err(format!("only {} of {count} tasks completed", completed()));
        }
    }
    Ok(())
}

fn spawn(service: &Service<Running>, id: u64) -> Result<(), String> {
    let graph = graph(service)?;
    let mut engine = ProgressEngine::new();
    let worker = start(&mut engine, service, &graph, id)?;
    graph
        .loopback(&worker, id, 0, record)
        .map_err(|e| e.to_string())?;
    wait_for(&mut engine, 1)?;
    say(&format!("running {id}"));
    // Until the test is done with the worker.
    for _ in std::io::stdin().lock().lines() {}
    Ok(())
}

fn attach(service: &Service<Running>, id: u64) -> Result<(), String> {
    let graph = graph(service)?;
    let mut engine = ProgressEngine::new();
    start(&mut engine, service, &graph, id)?;
    say(&format!("attached {id}"));
    Ok(())
}

fn load(service: &Service<Running>, ids: [u64; 2]) -> Result<(), String> {
    let graph = graph(service)?;
    let mut engine = ProgressEngine::new();
    let workers = [
        start(&mut engine, service, &graph, ids[0])?,
        start(&mut engine, service, &graph, ids[1])?,
    ];
    let input_ended = Arc::new(AtomicBool::new(false));
    let watching = Arc::clone(&input_ended);
    std::thread::spawn(move || {
        for _ in std::io::stdin().lock().lines() {}
        watching.store(true, Ordering::Relaxed);
    });
    say("running");
    let deadline = Instant::now() + PATIENCE;
    let mut submitted = 0;
    let mut failing = false;
    while !input_ended.load(Ordering::Relaxed) {
        for worker in &workers {
            if graph.loopback(worker, submitted, 0, record).is_ok() {
                submitted += 1;
            }
        }
        engine.progress();
        if !failing && DONE.with(Cell::get).1 > 0 {
            failing = true;
            say("failing");
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the load still ran after {PATIENCE:?} ({submitted} tasks)"
            ));
        }
    }
    wait_for(&mut engine, submitted)?;
    let (good, bad) = DONE.with(Cell::get);
    say(&format!("completed {good} {bad} {submitted}"));
    // Some worker still answers.
    let answering = workers
        .iter()
        .any(|worker| graph.loopback(worker, 0, 0, record).is_ok());
    if !answering {
        return Err("no worker takes commands any more".into());
    }
    wait_for(&mut engine, submitted + 1)?;
    let (good_after, _) = DONE.with(Cell::get);
    if good_after != good + 1 {
        return Err("the last loopback failed".into());
    }
    say("answering");
    Ok(())
}
