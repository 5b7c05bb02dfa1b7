//! Graph loopbacks through the host library, counted task by task.
//!
//! A task's cookie numbers it within its thread; its data is derived from the cookie, so a
//! completion that carries another task's data is caught. Completion callbacks are plain
//! functions, so the counts live in a thread-local book: one per thread, across all the
//! workers that thread drives.

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use urom_graph::{GraphHost, loopback_result};
use urom_host::{CommandError, CompletedTask, ProgressEngine, Running, Worker, WorkerState};

use crate::{PATIENCE, Tally};

/// The data a loopback with `cookie` carries.
pub fn data_for(cookie: u64) -> u64 {
    cookie.rotate_left(29) ^ 0x6a09_e667_f3bc_c908
}

/// One thread's record of its tasks.
#[derive(Default)]
struct Book {
    /// Tasks submitted so far: the next task's cookie.
    submitted: u64,
    /// The cookie of `completions[0]`: every earlier task has completed once, and was retired.
    retired: u64,
    /// How often each task from `retired` on completed, by cookie.
    completions: VecDeque<u8>,
    /// Tasks completed at least once.
    completed: u64,
    ok: u64,
    error: u64,
    duplicated: u64,
    /// Completions for a cookie never submitted.
    unknown: u64,
    /// Successful completions with another task's data.
    wrong: u64,
    statuses: BTreeMap<&'static str, u64>,
}

thread_local! {
    static BOOK: RefCell<Book> = RefCell::new(Book::default());
}

fn on_loopback(task: &CompletedTask<'_>) {
    let cookie = u64::from_le_bytes(task.user_data[..8].try_into().expect("8 bytes"));
    let result = loopback_result(task);
    BOOK.with(|book| {
        let mut book = book.borrow_mut();
        // A retired task completing again is counted as unknown, like one never submitted.
        let Some(count) = cookie
            .checked_sub(book.retired)
            .and_then(|at| book.completions.get_mut(at as usize))
        else {
            book.unknown += 1;
            return;
        };
        *count = count.saturating_add(1);
        if *count > 1 {
            book.duplicated += 1;
            return;
        }
        book.completed += 1;
        while book.completions.front() == Some(&1) {
            book.completions.pop_front();
            book.retired += 1;
        }
        match result {
            Ok(done) if done.cookie == cookie && done.data == data_for(cookie) => book.ok += 1,
            Ok(_) => book.wrong += 1,
            Err(status) => {
                book.error += 1;
                *book.statuses.entry(status.name()).or_default() += 1;
            }
        }
    });
}

/// Submits one loopback; the task's cookie is the next in this thread's book.
fn submit(graph: GraphHost, worker: &Worker<Running>) -> Result<(), CommandError> {
    let cookie = BOOK.with(|book| book.borrow().submitted);
    graph.loopback(worker, cookie, data_for(cookie), on_loopback)?;
    BOOK.with(|book| {
        let mut book = book.borrow_mut();
        book.submitted += 1;
        book.completions.push_back(0);
    });
    Ok(())
}

/// What one worker's share of a load came to.
#[derive(Debug, Default, Clone)]
pub struct Load {
    /// The task counts.
    pub tally: Tally,
    /// Successful completions that carried another task's data.
    pub wrong: u64,
    /// Completions of tasks this thread never submitted, or that had completed already.
    pub unknown: u64,
    /// Error completions by status name.
    pub statuses: BTreeMap<&'static str, u64>,
    /// Whether the worker failed (died, or was stopped) during the load.
    pub failed: bool,
}

impl Load {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &Load) {
        self.tally.add(other.tally);
        self.wrong += other.wrong;
        self.unknown += other.unknown;
        for (status, count) in &other.statuses {
            *self.statuses.entry(status).or_default() += count;
        }
        self.failed |= other.failed;
    }

    /// The error statuses as `NAME:count,...` (`-` when none).
    pub fn statuses(&self) -> String {
        if self.statuses.is_empty() {
            return "-".to_owned();
        }
        self.statuses
            .iter()
            .map(|(status, count)| format!("{}:{count}", status.trim_start_matches("DOCA_ERROR_")))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// A snapshot of the book's counters.
#[derive(Clone, Copy)]
struct Marks {
    submitted: u64,
    completed: u64,
    ok: u64,
    error: u64,
    duplicated: u64,
    unknown: u64,
    wrong: u64,
}

fn marks() -> Marks {
    BOOK.with(|book| {
        let book = book.borrow();
        Marks {
            submitted: book.submitted,
            completed: book.completed,
            ok: book.ok,
            error: book.error,
            duplicated: book.duplicated,
            unknown: book.unknown,
            wrong: book.wrong,
        }
    })
}

fn statuses() -> BTreeMap<&'static str, u64> {
    BOOK.with(|book| book.borrow().statuses.clone())
}

/// Keeps up to `window` loopbacks in flight on `worker` until `stop` says so or the worker
/// fails, then waits for every task in flight (at most [`PATIENCE`] after the stop or the
/// failure; what is still in flight then is lost). `pause` is asked before each turn for how
/// long to stop progressing (a host that stops draining).
pub fn pipelined(
    engine: &mut ProgressEngine,
    graph: GraphHost,
    worker: &Worker<Running>,
    window: u64,
    stop: &dyn Fn() -> bool,
    pause: &mut dyn FnMut() -> Option<Duration>,
) -> Load {
    let before = marks();
    let statuses_before = statuses();
    let mut ended: Option<Instant> = None;
    let mut lost = 0;
    let mut failed = false;
    loop {
        if let Some(pause) = pause() {
            std::thread::sleep(pause);
        }
        let running = worker.state() == WorkerState::Running;
        failed |= !running;
        let stopping = stop() || !running;
        if stopping {
            ended.get_or_insert_with(Instant::now);
        } else {
            loop {
                let now = marks();
                let in_flight =
                    now.submitted - before.submitted - (now.completed - before.completed);
                if in_flight >= window || submit(graph, worker).is_err() {
                    break;
                }
            }
        }
        let progressed = engine.progress();
        let now = marks();
        let in_flight = now.submitted - before.submitted - (now.completed - before.completed);
        if stopping && in_flight == 0 {
            break;
        }
        if ended.is_some_and(|at| at.elapsed() > PATIENCE) {
            lost = in_flight;
            break;
        }
        if progressed == 0 {
            // Nothing came back: let the worker (and whatever else shares the machine) run.
            std::thread::sleep(Duration::from_micros(20));
        }
    }
    let after = marks();
    let mut statuses = statuses();
    for (status, count) in statuses_before {
        if let Some(now) = statuses.get_mut(status) {
            *now -= count;
        }
    }
    statuses.retain(|_, count| *count > 0);
    Load {
        tally: Tally {
            submitted: after.submitted - before.submitted,
            ok: after.ok - before.ok,
            error: after.error - before.error,
            lost,
            duplicated: after.duplicated - before.duplicated,
        },
        wrong: after.wrong - before.wrong,
        unknown: after.unknown - before.unknown,
        statuses,
        failed,
    }
}

/// One loopback through `worker`, waited for (at most [`PATIENCE`]); it must succeed with its
/// own data.
pub fn loopback_once(
    engine: &mut ProgressEngine,
    graph: GraphHost,
    worker: &Worker<Running>,
) -> Result<(), String> {
    let before = marks();
    let deadline = Instant::now() + PATIENCE;
    while let Err(e) = submit(graph, worker) {
        if !matches!(e, CommandError::Exhausted) || Instant::now() > deadline {
            return Err(format!("cannot submit a loopback: {e}"));
        }
        engine.progress();
    }
    while marks().completed == before.completed {
        engine.progress();
        if Instant::now() > deadline {
            return Err(format!("no answer to a loopback within {PATIENCE:?}"));
        }
    }
    let after = marks();
    if after.ok == before.ok + 1 {
        Ok(())
    } else if after.wrong > before.wrong {
        Err("the loopback came back with another task's data".to_owned())
    } else {
        let last = statuses();
        Err(format!(
            "the loopback failed ({last:?} so far on this thread)"
        ))
    }
}
