//! What every implementation provides ([`Backend`], [`Collective`]) and the measurement, the
//! OSU micro-benchmarks' way: blocking latency, overlap with a calibrated busy loop, and CPU
//! time per collective.
//!
//! Every rank runs the same loops; a barrier (MPI's, for both implementations) comes before each
//! timed collective, as in OSU. Times are each rank's medians over the iterations, averaged over
//! the ranks; iteration counts are the same on every rank.

use std::hint::black_box;
use std::time::{Duration, Instant};

use anyhow::bail;
use mpi::collective::SystemOperation;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use crate::cpu;
use crate::kind::Kind;
use crate::record::{Row, overlap_pct};
use crate::stats::median;

/// One persistent collective of one kind and size, its buffers set up and filled with the
/// rank's input ([`crate::kind::fill`]). The harness calls `start` then `wait`, or `blocking`,
/// never two collectives at once, and calls nothing between `start` and `wait` but its compute
/// loop.
pub trait Collective {
    /// Posts the collective (Open MPI: `MPI_Iallreduce` and the like; urom: the persistent
    /// collective's `start()`). Returns without waiting for it.
    fn start(&mut self);
    /// Waits until the collective `start` posted is complete on this rank.
    fn wait(&mut self);
    /// The blocking collective (Open MPI: `MPI_Allreduce` and the like; urom: start + wait).
    fn blocking(&mut self);
    /// Checks the receive buffer after a completed collective ([`crate::kind::check`]).
    fn check(&self) -> Result<(), String>;
}

/// An implementation of the collectives: the one `--impl` names. Made once per program run (a
/// urom backend creates its domain and team here), then asked for one collective per kind and
/// size.
pub trait Backend {
    /// The name in the results: `openmpi` or `urom`.
    fn name(&self) -> &'static str;
    /// A line for the results' comments: the library and version, where workers run.
    fn describe(&self) -> String;
    /// A persistent collective of `kind` moving `bytes` (see [`Kind`]) over all the ranks,
    /// its buffers filled with this rank's input.
    fn collective<'a>(
        &'a mut self,
        kind: Kind,
        bytes: usize,
    ) -> anyhow::Result<Box<dyn Collective + 'a>>;
    /// The worker processes whose CPU time this rank reports (read from `/proc/<pid>/stat`):
    /// each worker named by exactly one rank (say the lowest rank of its node), so that the sum
    /// over the ranks counts each worker once. Empty when the implementation has no workers.
    fn worker_pids(&self) -> Vec<u32> {
        Vec::new()
    }
}

/// How long and how often to measure.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The round number written into the results.
    pub round: u32,
    /// A fixed number of timed iterations per loop; `None`: from `budget`.
    pub iters: Option<usize>,
    /// About how long each timed loop runs, when `iters` is `None`.
    pub budget: Duration,
    /// About how long the CPU-time loop runs, all its batches (long enough for `/proc`'s clock
    /// ticks).
    pub cpu_budget: Duration,
    /// Bounds on the iterations chosen from a budget.
    pub min_iters: usize,
    /// See `min_iters`.
    pub max_iters: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            round: 1,
            iters: None,
            budget: Duration::from_millis(200),
            cpu_budget: Duration::from_millis(500),
            min_iters: 20,
            max_iters: 1000,
        }
    }
}

/// The compute the overlap measurement runs between posting and waiting: a busy loop with no
/// call into any library, as in OSU's `dummy_compute`: chunks of arithmetic calibrated to about a
/// microsecond each, repeated until the wanted wall time has passed (the clock is read through
/// the vDSO, no system call). On a shared core a helper's CPU time therefore shows as less work
/// done, not as a longer compute: the rank's CPU time is reported beside the overlap for that.
#[derive(Clone, Copy, Debug)]
pub struct Spin {
    ns_per_unit: f64,
}

fn spin_units(units: u64) -> u64 {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..units {
        x = black_box(x)
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
    }
    x
}

impl Spin {
    /// Times the arithmetic: enough units for 20 ms, the fastest of five runs (the one least
    /// disturbed).
    pub fn calibrate() -> Spin {
        let mut units = 1u64 << 12;
        loop {
            let t = Instant::now();
            black_box(spin_units(units));
            if t.elapsed() >= Duration::from_millis(20) {
                break;
            }
            units *= 2;
        }
        let best = (0..5)
            .map(|_| {
                let t = Instant::now();
                black_box(spin_units(units));
                t.elapsed()
            })
            .min()
            .expect("five runs");
        Spin {
            ns_per_unit: best.as_nanos() as f64 / units as f64,
        }
    }

    /// Nanoseconds per unit of arithmetic, as calibrated.
    pub fn ns_per_unit(&self) -> f64 {
        self.ns_per_unit
    }

    /// Computes for `d` of wall time, in chunks of at most a microsecond (and at most an eighth
    /// of `d`); returns the units of arithmetic done.
    pub fn compute(&self, d: Duration) -> u64 {
        let chunk_ns = (d.as_nanos() as f64 / 8.0).min(1000.0);
        let chunk = ((chunk_ns / self.ns_per_unit) as u64).max(1);
        let start = Instant::now();
        let mut done = 0;
        while start.elapsed() < d {
            black_box(spin_units(chunk));
            done += chunk;
        }
        done
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Sum over the ranks.
fn sum_all(world: &SimpleCommunicator, v: f64) -> f64 {
    let mut out = 0f64;
    world.all_reduce_into(&v, &mut out, SystemOperation::sum());
    out
}

/// Mean over the ranks.
fn mean_all(world: &SimpleCommunicator, v: f64) -> f64 {
    sum_all(world, v) / f64::from(world.size())
}

/// Maximum over the ranks.
fn max_all(world: &SimpleCommunicator, v: f64) -> f64 {
    let mut out = 0f64;
    world.all_reduce_into(&v, &mut out, SystemOperation::max());
    out
}

/// Batches of the CPU-time loop.
const CPU_BATCHES: usize = 10;

/// The median, in microseconds, of `iters` runs of `op`, each after a barrier.
fn timed(world: &SimpleCommunicator, iters: usize, mut op: impl FnMut()) -> f64 {
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters {
        world.barrier();
        let t = Instant::now();
        op();
        times.push(us(t.elapsed()));
    }
    median(&mut times)
}

/// Measures one collective of `kind` and `bytes` from `backend`; every rank calls it, rank 0
/// gets the results line.
pub fn measure(
    world: &SimpleCommunicator,
    backend: &mut dyn Backend,
    kind: Kind,
    bytes: usize,
    settings: &Settings,
    spin: &Spin,
) -> anyhow::Result<Option<Row>> {
    let ranks = world.size() as usize;
    let name = backend.name();
    let workers = backend.worker_pids();
    let mut c = backend.collective(kind, bytes)?;

    // How many iterations: from the slowest rank's median of a few, unless fixed.
    let probe = max_all(world, timed(world, 11, || c.blocking()));
    let from_budget = |budget: Duration| -> usize {
        let n = (budget.as_secs_f64() * 1e6 / probe.max(0.01)) as usize;
        n.clamp(settings.min_iters, settings.max_iters)
    };
    let iters = settings
        .iters
        .unwrap_or_else(|| from_budget(settings.budget));
    let cpu_iters = settings
        .iters
        .unwrap_or_else(|| from_budget(settings.cpu_budget));

    // Warm-up, both ways, then the results checked once.
    let warm = (iters / 10).max(3);
    for _ in 0..warm {
        c.blocking();
    }
    for _ in 0..warm {
        c.start();
        c.wait();
    }
    if let Err(e) = c.check() {
        bail!("{name}: wrong result: {e}");
    }

    // Blocking latency, and the rank's CPU time for each of those collectives (the process's
    // CPU clock around it, less what reading the clock costs).
    let overhead = cpu::self_cpu_overhead_ns();
    let (mut lats, mut cpus) = (Vec::with_capacity(iters), Vec::with_capacity(iters));
    for _ in 0..iters {
        world.barrier();
        let c0 = cpu::self_cpu_ns();
        let t = Instant::now();
        c.blocking();
        lats.push(us(t.elapsed()));
        let c1 = cpu::self_cpu_ns();
        cpus.push(c1.saturating_sub(c0).saturating_sub(overhead) as f64 / 1e3);
    }
    let lat = mean_all(world, median(&mut lats));
    let cpu_us = mean_all(world, median(&mut cpus));

    // The non-blocking collective alone: t_pure.
    let pure = mean_all(
        world,
        timed(world, iters, || {
            c.start();
            c.wait();
        }),
    );

    // Post, compute for t_pure (the mean over the ranks), wait.
    let compute_for = Duration::from_secs_f64(pure / 1e6);
    let (mut totals, mut computes) = (Vec::with_capacity(iters), Vec::with_capacity(iters));
    for _ in 0..iters {
        world.barrier();
        let t0 = Instant::now();
        c.start();
        let tc = Instant::now();
        spin.compute(compute_for);
        let compute = tc.elapsed();
        c.wait();
        totals.push(us(t0.elapsed()));
        computes.push(us(compute));
    }
    let total = mean_all(world, median(&mut totals));
    let compute = mean_all(world, median(&mut computes));

    // CPU time per collective over a loop: back-to-back blocking collectives, no barrier in
    // between, in batches; `getrusage` per batch, the median over the batches of each batch's
    // CPU time per collective (a batch where another process took the core from a rank, and
    // its peer spun, counts once). The workers' CPU time, in /proc's clock ticks, is taken over
    // all the batches.
    let batches = CPU_BATCHES.min(cpu_iters);
    let per_batch = cpu_iters / batches;
    let mut rank_cpu = Vec::with_capacity(batches);
    world.barrier();
    let workers0 = cpu::processes_cpu(&workers);
    for _ in 0..batches {
        world.barrier();
        let before = cpu::self_cpu();
        for _ in 0..per_batch {
            c.blocking();
        }
        rank_cpu.push(us(cpu::self_cpu() - before) / per_batch as f64);
    }
    let workers1 = cpu::processes_cpu(&workers);
    world.barrier();
    let cpu_loop_us = mean_all(world, median(&mut rank_cpu));
    let worker_total = sum_all(world, us(workers1.saturating_sub(workers0)));
    let with_workers = sum_all(world, workers.len() as f64) > 0.0;
    let cpu_iters = batches * per_batch;

    if let Err(e) = c.check() {
        bail!("{name}: wrong result after the loops: {e}");
    }
    Ok((world.rank() == 0).then(|| Row {
        round: settings.round,
        implementation: name.to_string(),
        kind,
        bytes,
        ranks,
        iters,
        lat_us: lat,
        pure_us: pure,
        total_us: total,
        compute_us: compute,
        overlap_pct: overlap_pct(pure, total, compute),
        cpu_us,
        cpu_loop_us,
        worker_cpu_us: with_workers.then(|| worker_total / cpu_iters as f64),
    }))
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compute_lasts_as_long_as_asked() {
        let spin = Spin::calibrate();
        assert!(spin.ns_per_unit() > 0.0);
        for wanted in [Duration::from_micros(5), Duration::from_micros(300)] {
            let mut took: Vec<f64> = (0..21)
                .map(|_| {
                    let t = Instant::now();
                    assert!(spin.compute(wanted) > 0);
                    us(t.elapsed())
                })
                .collect();
            let took = median(&mut took);
            let wanted = us(wanted);
            // At least as long; not much longer (a chunk is at most an eighth), with room for a
            // busy machine.
            assert!(
                took >= wanted && took < wanted * 2.0,
                "{took} us for {wanted} us"
            );
        }
    }
}
