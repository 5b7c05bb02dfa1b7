//! The collective benchmark: blocking latency, overlap as the OSU micro-benchmarks define it, and
//! the CPU time a rank (and a worker) spends per collective, for one implementation at a time
//! under `mpirun`, beside Open MPI's own collectives.
//!
//! - `harness` (feature `mpi`) holds the `Collective` trait every implementation provides and
//!   the measurement loops; `openmpi` is Open MPI's implementation, `urom` the urom collectives'.
//! - [`record`] is the tab-separated line rank 0 prints per collective and size; [`report`]
//!   turns the rounds' lines into medians of per-round ratios, [`chart`] into an SVG chart.
//!
//! `benches/run-coll-bench.sh` runs it all (see `benches/README.md`).

pub mod chart;
pub mod cpu;
pub mod kind;
pub mod record;
pub mod report;
pub mod stats;

#[cfg(feature = "mpi")]
pub mod harness;
#[cfg(feature = "mpi")]
pub mod openmpi;
#[cfg(feature = "mpi")]
pub mod urom;
