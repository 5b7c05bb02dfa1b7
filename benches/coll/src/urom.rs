//! The urom side of the benchmark: the one file to change when the collectives offload
//! (`plugins/coll`, the host crate `urom-coll`) is there.
//!
//! To plug it in:
//! 1. add `urom-coll` to `[dependencies]` of `benches/coll/Cargo.toml`;
//! 2. here, make [`available`] return `Ok(())` and [`backend`] build a [`Backend`]: in it, the
//!    service, workers, domain (the `MpiOob` of `urom-core`'s `mpi` feature over `world`) and a
//!    `Team` of all the ranks, created once; [`Backend::collective`] sets up one persistent
//!    collective of that kind and size on buffers registered once (filled with
//!    [`crate::kind::fill`]), whose [`Collective::start`] is the collective's `start()` and
//!    [`Collective::wait`] waits on the request it gave; [`Collective::blocking`] is start +
//!    wait; [`Collective::check`] is [`crate::kind::check`] on the receive buffer;
//!    [`Backend::worker_pids`] names this node's worker on one rank of the node (its CPU time is
//!    read from `/proc`), and [`Backend::describe`] says where the workers run.
//!
//! `WORKER_CPUS` (set by `benches/run-coll-bench.sh`, empty when not given) is the CPU list the
//! workers should be pinned to, so that they do not share the ranks' cores.
//!
//! [`Collective::start`]: crate::harness::Collective::start
//! [`Collective::wait`]: crate::harness::Collective::wait
//! [`Collective::blocking`]: crate::harness::Collective::blocking
//! [`Collective::check`]: crate::harness::Collective::check
//! [`Backend::collective`]: crate::harness::Backend::collective
//! [`Backend::worker_pids`]: crate::harness::Backend::worker_pids
//! [`Backend::describe`]: crate::harness::Backend::describe

use mpi::topology::SimpleCommunicator;

use crate::harness::Backend;

const NOT_BUILT: &str = "not built: needs the urom-coll crate (the collectives offload; \
                         plug it in benches/coll/src/urom.rs)";

/// Whether this build can run `--impl urom`; the error says why not. Called before MPI starts.
pub fn available() -> Result<(), String> {
    Err(NOT_BUILT.to_string())
}

/// The urom collectives over the ranks of `world`.
pub fn backend(world: &SimpleCommunicator) -> anyhow::Result<Box<dyn Backend>> {
    let _ = world;
    anyhow::bail!("{NOT_BUILT}")
}
