//! urom's chaos suite: real daemons, workers and hosts, and everything that can go wrong around
//! them (workers killed under load, broken plugins, malformed frames on every socket, hosts that
//! stop draining, messages at the size limits, other users, connection floods). The scenarios
//! are the tests in `tests/`; this crate holds what they share:
//!
//! * [`Rng`]: a small seeded generator; every scenario prints its seed, and
//!   `UROM_CHAOS_SEED=<seed>` replays it;
//! * [`scale`]: `UROM_CHAOS_SCALE` (default 1) multiplies task counts, rounds and durations;
//!   `cargo test` runs the short form, `chaos/run.sh` the long one;
//! * [`Report`]: the one line each scenario prints, in a fixed format:
//!   `chaos <scenario>: seed=0x... scale=N submitted=N ok=N error=N lost=N duplicated=N
//!   key=value...`;
//! * [`load`]: pipelined graph loopbacks through the host library, counted task by task;
//! * [`frames`]: valid frames of every kind and the ways to break them; [`raw`]: bare
//!   connections to a daemon and how it ended them;
//! * [`graph_daemon`] and [`check_fresh_host`]: the daemon most scenarios run, and the check
//!   that ends every scenario: the daemon and the surviving workers still serve a new host.
#![deny(unsafe_code)]

pub mod frames;
pub mod load;
pub mod raw;

use std::fmt::Display;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use urom_graph::GraphHost;
use urom_host::{Idle, ProgressEngine, Service, Worker};
use urom_testkit::TempDir;
use urom_testkit::daemon::{self, Daemon};
use urom_testkit::host::try_run_worker;
use urom_wire::MaxMsgSize;

/// How long anything that should happen soon may take before a scenario calls it a hang.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// `UROM_CHAOS_SCALE`: how many times more tasks, rounds and time the scenarios spend than in
/// their short form (1, the default, up to 1000).
pub fn scale() -> u32 {
    std::env::var("UROM_CHAOS_SCALE")
        .ok()
        .and_then(|value| value.trim().parse::<u32>().ok())
        .unwrap_or(1)
        .clamp(1, 1000)
}

/// `base` times [`scale`].
pub fn scaled(base: u64) -> u64 {
    base.saturating_mul(u64::from(scale()))
}

/// `base` times [`scale`].
pub fn scaled_duration(base: Duration) -> Duration {
    base.saturating_mul(scale())
}

/// The seed of `scenario`: `UROM_CHAOS_SEED` (decimal or `0x` hexadecimal) when set, so that a
/// seed a scenario printed replays it; else taken from the clock and mixed with the scenario's
/// name, so that scenarios differ.
pub fn seed_for(scenario: &str) -> u64 {
    let given = std::env::var("UROM_CHAOS_SEED").ok().and_then(|value| {
        let value = value.trim();
        match value.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).ok(),
            None => value.parse().ok(),
        }
    });
    if let Some(seed) = given {
        return seed;
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let clock = now.as_secs() ^ u64::from(now.subsec_nanos()) << 20 ^ u64::from(std::process::id());
    let name = scenario
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        });
    clock ^ name
}

/// A small seeded pseudo-random generator (SplitMix64): the same seed gives the same run of
/// choices.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "an empty range");
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// An index into a slice of `len` (> 0) elements.
    pub fn index(&mut self, len: usize) -> usize {
        self.below(len as u64) as usize
    }

    /// A number in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.below(high - low + 1)
    }

    /// True `percent` times in a hundred.
    pub fn percent(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// One element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.index(items.len())]
    }

    /// A duration in `low..=high`, to the microsecond.
    pub fn duration(&mut self, low: Duration, high: Duration) -> Duration {
        let (low, high) = (low.as_micros() as u64, high.as_micros() as u64);
        Duration::from_micros(self.between(low, high))
    }

    /// Fills `bytes` with random bytes.
    pub fn fill(&mut self, bytes: &mut [u8]) {
        for chunk in bytes.chunks_mut(8) {
            let word = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
    }

    /// `len` random bytes.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut bytes = vec![0; len];
        self.fill(&mut bytes);
        bytes
    }
}

/// How the tasks of a scenario ended. A task is whatever the scenario sends and expects one
/// answer for: a command, a frame, a connection's request.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    /// Sent.
    pub submitted: u64,
    /// Answered once, with success.
    pub ok: u64,
    /// Answered once, with an error.
    pub error: u64,
    /// Never answered.
    pub lost: u64,
    /// Answered more than once (counted once per extra answer).
    pub duplicated: u64,
}

impl Tally {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: Tally) {
        self.submitted += other.submitted;
        self.ok += other.ok;
        self.error += other.error;
        self.lost += other.lost;
        self.duplicated += other.duplicated;
    }

    /// Whether every task was answered exactly once.
    pub fn exactly_once(&self) -> bool {
        self.lost == 0 && self.duplicated == 0 && self.ok + self.error == self.submitted
    }
}

/// The line a scenario prints, and what went wrong in it.
#[derive(Debug)]
pub struct Report {
    scenario: &'static str,
    seed: u64,
    /// The scenario's task counts.
    pub tally: Tally,
    extras: Vec<(&'static str, String)>,
    violations: Vec<String>,
}

impl Report {
    /// An empty report of `scenario`, run with `seed`.
    pub fn new(scenario: &'static str, seed: u64) -> Self {
        Self {
            scenario,
            seed,
            tally: Tally::default(),
            extras: Vec::new(),
            violations: Vec::new(),
        }
    }

    /// Adds `key=value` to the line (after the counts, in the order given).
    pub fn set(&mut self, key: &'static str, value: impl Display) {
        let value = value.to_string();
        match self.extras.iter_mut().find(|(k, _)| *k == key) {
            Some(entry) => entry.1 = value,
            None => self.extras.push((key, value)),
        }
    }

    /// Records that something went wrong, unless `ok`.
    pub fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            self.violations.push(what());
        }
    }

    /// Records that something went wrong.
    pub fn violation(&mut self, what: impl Into<String>) {
        self.violations.push(what.into());
    }

    /// The line: `chaos <scenario>: seed=0x... scale=N submitted=N ok=N error=N lost=N
    /// duplicated=N key=value...`.
    pub fn line(&self) -> String {
        let t = &self.tally;
        let mut line = format!(
            "chaos {}: seed={:#018x} scale={} submitted={} ok={} error={} lost={} duplicated={}",
            self.scenario,
            self.seed,
            scale(),
            t.submitted,
            t.ok,
            t.error,
            t.lost,
            t.duplicated
        );
        for (key, value) in &self.extras {
            line.push_str(&format!(" {key}={value}"));
        }
        line
    }

    /// Prints the line, then fails the test if any task was lost or duplicated, the counts do
    /// not add up, or anything else went wrong.
    pub fn finish(mut self) {
        println!("{}", self.line());
        let t = self.tally;
        self.check(t.lost == 0, || format!("{} tasks lost", t.lost));
        self.check(t.duplicated == 0, || {
            format!("{} tasks answered more than once", t.duplicated)
        });
        self.check(t.ok + t.error + t.lost == t.submitted, || {
            format!(
                "{} submitted, but {} ok + {} error + {} lost",
                t.submitted, t.ok, t.error, t.lost
            )
        });
        assert!(
            self.violations.is_empty(),
            "chaos {} (seed {:#018x}, replay with UROM_CHAOS_SEED): {} problem(s):\n  {}",
            self.scenario,
            self.seed,
            self.violations.len(),
            self.violations.join("\n  ")
        );
    }
}

/// A daemon offering the graph and faulty plugins (as `worker_graph` and `worker_faulty`),
/// started with `extra` flags.
pub fn graph_daemon(extra: &[&str]) -> (TempDir, Daemon) {
    daemon::graph_and_faulty(extra)
}

/// What ends every scenario: the daemon still runs, a new host (its own connection, at the
/// default message size) starts a service, a new worker, and a loopback through it, then
/// attaches to each of the `survivors` (worker ids) and runs a loopback through each.
pub fn check_fresh_host(daemon: &Daemon, survivors: &[u64]) -> Result<(), String> {
    check_fresh_host_at(daemon, MaxMsgSize::DEFAULT, survivors)
}

/// [`check_fresh_host`] for a daemon whose maximum message size is `max`.
pub fn check_fresh_host_at(
    daemon: &Daemon,
    max: MaxMsgSize,
    survivors: &[u64],
) -> Result<(), String> {
    if !daemon.is_running() {
        return Err(format!("the daemon is gone; its log:\n{}", daemon.log()));
    }
    let service = Service::<Idle>::new()
        .set_socket(&daemon.socket)
        .set_max_msg_size(max.as_u32())
        .map_err(|e| e.to_string())?
        .start()
        .map_err(|(_, e)| format!("a new host could not start a service: {e}"))?;
    let info = service
        .plugin("worker_graph")
        .ok_or("the daemon no longer offers worker_graph")?;
    let graph = GraphHost::init(info.id, info.version).map_err(|e| e.to_string())?;
    let mut engine = ProgressEngine::new();
    let idle = || {
        Worker::new()
            .set_service(&service)
            .set_plugins(graph.id())
            .set_max_inflight_tasks(4)
    };
    let fresh = try_run_worker(&mut engine, idle())
        .map_err(|e| format!("a new host could not start a worker: {e}"))?;
    load::loopback_once(&mut engine, graph, &fresh)
        .map_err(|e| format!("a new worker did not serve a new host: {e}"))?;
    for &id in survivors {
        let attached = try_run_worker(&mut engine, idle().set_id(id))
            .map_err(|e| format!("a new host could not attach to worker {id}: {e}"))?;
        load::loopback_once(&mut engine, graph, &attached)
            .map_err(|e| format!("worker {id} did not serve a new host: {e}"))?;
    }
    fresh
        .stop()
        .map_err(|(_, e)| format!("a new host could not stop its worker: {e}"))?;
    service.stop();
    Ok(())
}
