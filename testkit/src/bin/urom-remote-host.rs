//! A host on another machine, for tests that run it inside a network namespace (a thread
//! cannot: UCX reads the network devices from `/sys`, which `ip netns exec` remounts for the
//! namespace). It reaches the service at ADDRESS over UCX with the key file KEY as IDENTITY:
//!
//! * `connect`: authenticates; prints `connected`.
//! * `spawn ID`: starts worker ID with the graph plugin, runs one loopback, prints
//!   `running ID`, and keeps the worker until its standard input ends.
//! * `attach ID`: tries to use worker ID; prints `attached ID`.
//! * `load ID1 ID2`: starts workers ID1 and ID2, prints `running`, then keeps up to 64
//!   loopbacks in flight to each, and prints `failing ID` when it first finds a worker failed
//!   (by then every task that worker had in flight has completed, with an error; a worker that
//!   died with none in flight fails none). Lines on its standard input steer the load on ID1:
//!   `drain` stops submitting to it and prints `drained` once none of its tasks is in flight;
//!   `fill` submits to it again and prints `filled N` once its N task slots are all in flight.
//!   Once its standard input ends it submits no more, prints `completed GOOD BAD SUBMITTED`
//!   when every one submitted has completed, then checks that a worker still answers and
//!   prints `answering`. The test ends the load, so however fast loopbacks run it lasts until
//!   the test has seen what it waits for.
//!
//! A refusal or failure prints `refused <reason>` and exits 3; a bad command line exits 2.

use std::cell::Cell;
use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use urom_graph::{GraphHost, loopback_result};
use urom_host::{
    CommandError, CompletedTask, Idle, ProgressEngine, Running, Service, Worker, WorkerState,
};

/// How long anything may take.
const PATIENCE: Duration = Duration::from_secs(60);

/// The most tasks in flight to a worker.
const MAX_INFLIGHT: usize = 64;

/// The cookie bit that says which of the load's two workers a task went to.
const SECOND: u64 = 1 << 63;

thread_local! {
    /// Tasks completed (succeeded, failed), for each of the load's two workers (the other
    /// commands' count as the first's).
    static DONE: Cell<[(u64, u64); 2]> = const { Cell::new([(0, 0); 2]) };
}

fn record(task: &CompletedTask<'_>) {
    let ok = loopback_result(task).is_ok();
    let cookie = u64::from_le_bytes(task.user_data[..8].try_into().expect("8 bytes"));
    let which = usize::from(cookie & SECOND != 0);
    DONE.with(|done| {
        let mut all = done.get();
        let (good, bad) = &mut all[which];
        if ok {
            *good += 1;
        } else {
            *bad += 1;
        }
        done.set(all);
    });
}

/// Tasks completed (succeeded, failed), in all.
fn tally() -> (u64, u64) {
    DONE.with(|done| {
        let [a, b] = done.get();
        (a.0 + b.0, a.1 + b.1)
    })
}

/// Tasks completed for the load's worker `which`.
fn completed_on(which: usize) -> u64 {
    DONE.with(|done| {
        let (good, bad) = done.get()[which];
        good + bad
    })
}

fn completed() -> u64 {
    let (good, bad) = tally();
    good + bad
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
        .set_max_inflight_tasks(MAX_INFLIGHT)
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

/// What the load does with its first worker.
#[derive(Clone, Copy, PartialEq, Eq)]
enum First {
    /// Keeps its tasks in flight.
    Load,
    /// Submits nothing to it; `drained` is said once none of its tasks is in flight.
    Drain { said: bool },
    /// Submits to it; `filled` is said once every slot is in flight.
    Fill { said: bool },
}

/// What the standard input says to the load.
enum Order {
    Drain,
    Fill,
    End,
}

fn load(service: &Service<Running>, ids: [u64; 2]) -> Result<(), String> {
    let graph = graph(service)?;
    let mut engine = ProgressEngine::new();
    let workers = [
        start(&mut engine, service, &graph, ids[0])?,
        start(&mut engine, service, &graph, ids[1])?,
    ];
    let (orders, input) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let order = match line.as_deref().map(str::trim) {
                Ok("drain") => Order::Drain,
                Ok("fill") => Order::Fill,
                _ => continue,
            };
            if orders.send(order).is_err() {
                return;
            }
        }
        let _ = orders.send(Order::End);
    });
    say("running");
    let deadline = Instant::now() + PATIENCE;
    let mut submitted = [0u64; 2];
    let mut first = First::Load;
    let mut failed = [false; 2];
    loop {
        match input.try_recv() {
            Ok(Order::Drain) => first = First::Drain { said: false },
            Ok(Order::Fill) => first = First::Fill { said: false },
            Ok(Order::End) | Err(mpsc::TryRecvError::Disconnected) => break,
            Err(mpsc::TryRecvError::Empty) => {}
        }
        for (which, worker) in workers.iter().enumerate() {
            if which == 0 && matches!(first, First::Drain { .. }) {
                continue;
            }
            let cookie = submitted[which] | if which == 1 { SECOND } else { 0 };
            match graph.loopback(worker, cookie, 0, record) {
                Ok(_) => submitted[which] += 1,
                Err(CommandError::Exhausted) if which == 0 => {
                    if let First::Fill { said: false } = first {
                        let in_flight = submitted[0] - completed_on(0);
                        say(&format!("filled {in_flight}"));
                        first = First::Fill { said: true };
                    }
                }
                Err(_) => {}
            }
        }
        engine.progress();
        if let First::Drain { said: false } = first
            && submitted[0] == completed_on(0)
        {
            say("drained");
            first = First::Drain { said: true };
        }
        for (worker, failed) in workers.iter().zip(&mut failed) {
            if !*failed && matches!(worker.state(), WorkerState::Failed(_)) {
                *failed = true;
                say(&format!("failing {}", worker.id()));
            }
        }
        if Instant::now() > deadline {
            let (good, bad) = tally();
            let states: Vec<String> = workers
                .iter()
                .zip(submitted)
                .enumerate()
                .map(|(which, (worker, submitted))| {
                    format!(
                        "worker {}: {:?}, {submitted} submitted, {} completed",
                        worker.id(),
                        worker.state(),
                        completed_on(which)
                    )
                })
                .collect();
            return Err(format!(
                "the load still ran after {PATIENCE:?} ({good} tasks succeeded, {bad} failed; {})",
                states.join("; ")
            ));
        }
    }
    let submitted = submitted[0] + submitted[1];
    wait_for(&mut engine, submitted)?;
    let (good, bad) = tally();
    say(&format!("completed {good} {bad} {submitted}"));
    // Some worker still answers.
    let answering = workers
        .iter()
        .any(|worker| graph.loopback(worker, 0, 0, record).is_ok());
    if !answering {
        return Err("no worker takes commands any more".into());
    }
    wait_for(&mut engine, submitted + 1)?;
    let (good_after, _) = tally();
    if good_after != good + 1 {
        return Err("the last loopback failed".into());
    }
    say("answering");
    Ok(())
}
