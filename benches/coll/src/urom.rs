//! The urom side of the benchmark: the collective offload (`plugins/coll`, host crate
//! `urom-coll`) over all the ranks of `mpirun`.
//!
//! Per program run: each rank connects to the node's daemon (the socket in
//! `UROM_SERVICE_SOCKET`, else the default one; `benches/run-coll-bench.sh` starts a daemon of
//! its own, with the `worker_coll` plugin, and stops it afterwards), the ranks share one worker
//! ([`urom_coll::node_worker_on`]: rank 0 starts it, pinned to `WORKER_CPUS` when that is set,
//! the others attach) and form one [`Team`] of all the ranks over the MPI out-of-band collective
//! ([`MpiOob`]). Per collective and size: buffers from [`Team::alloc`] (memory shared with the
//! worker, registered once), filled with [`crate::kind::fill`], and one persistent collective
//! over them; [`Collective::start`](crate::harness::Collective::start) is its `start()`,
//! [`Collective::wait`](crate::harness::Collective::wait) the library's wait (progress, then
//! sleep on the engine's descriptor while the worker works). The worker's process id is reported
//! by rank 0, whose `/proc` entry gives its CPU time.
//!
//! `WORKER_CPUS` (set by `benches/run-coll-bench.sh`, empty when not given) is the CPU list the
//! worker is pinned to, so that it does not share the ranks' cores.

use std::rc::Rc;

use anyhow::Context;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use urom_coll::{Buffer, CollHost, CpuSet, Datatype, ReduceOp, Team, node_worker_on};
use urom_host::oob::MpiOob;
use urom_host::{Idle, ProgressEngine, Running, Service, Worker};

use crate::harness::{Backend, Collective};
use crate::kind::{self, Kind};

/// The daemon's socket, when not the default one.
pub const SOCKET_VAR: &str = "UROM_SERVICE_SOCKET";
/// The CPUs the worker is pinned to (a Linux CPU list); empty or unset: anywhere.
pub const WORKER_CPUS_VAR: &str = "WORKER_CPUS";

/// Whether this build can run `--impl urom`; the error says why not. Called before MPI starts.
pub fn available() -> Result<(), String> {
    worker_cpus().map(|_| ())
}

/// `WORKER_CPUS` as a set (empty: not pinned) and as written.
fn worker_cpus() -> Result<(CpuSet, String), String> {
    let text = std::env::var(WORKER_CPUS_VAR).unwrap_or_default();
    let text = text.trim().to_owned();
    if text.is_empty() {
        return Ok((CpuSet::new(), text));
    }
    let set: CpuSet = text
        .parse()
        .map_err(|e| format!("{WORKER_CPUS_VAR}={text:?}: {e}"))?;
    Ok((set, text))
}

/// The urom collectives over the ranks of `world`.
pub fn backend(world: &SimpleCommunicator) -> anyhow::Result<Box<dyn Backend>> {
    let (cpus, cpus_text) = worker_cpus().map_err(anyhow::Error::msg)?;
    let mut service = Service::<Idle>::new();
    if let Some(socket) = std::env::var_os(SOCKET_VAR).filter(|s| !s.is_empty()) {
        service = service.set_socket(socket);
    }
    let service = service
        .start()
        .map_err(|(_, e)| anyhow::anyhow!("connecting to the urom daemon: {e}"))?;
    let host = CollHost::new(&service).context("the daemon's collective plugin")?;
    let mut oob = MpiOob::new(world).context("the MPI out-of-band collective")?;
    let mut engine = ProgressEngine::new();
    let worker = Rc::new(
        node_worker_on(&mut engine, &service, &host, &mut oob, &cpus)
            .context("the node's worker")?,
    );
    let team = Team::create(&mut engine, &worker, &host, &mut oob, None)
        .context("the team of all ranks")?
        .context("every rank is a member")?;
    let worker_pid = team.worker_pid();
    Ok(Box::new(Urom {
        rank: world.rank() as usize,
        ranks: world.size() as usize,
        where_workers: if cpus_text.is_empty() {
            "one worker (anywhere)".to_owned()
        } else {
            format!("one worker on CPUs {cpus_text}")
        },
        worker_pid,
        engine,
        team,
        _oob: oob,
        _worker: worker,
        _service: service,
    }))
}

/// The service, the node's worker and the team of all the ranks. Fields drop in order: the
/// team (which leaves the worker), then the worker connection, the out-of-band collective and
/// the service.
struct Urom {
    rank: usize,
    ranks: usize,
    where_workers: String,
    worker_pid: u32,
    engine: ProgressEngine,
    team: Team,
    _worker: Rc<Worker<Running>>,
    _oob: MpiOob,
    _service: Service<Running>,
}

/// With `UROM_WAIT_STATS=1`, each rank prints how its engine's waits went (see
/// [`urom_host::WaitStats`]) when it ends.
impl Drop for Urom {
    fn drop(&mut self) {
        if std::env::var_os("UROM_WAIT_STATS").is_some_and(|v| v == "1") {
            eprintln!("rank {}: {:?}", self.rank, self.engine.wait_stats());
        }
    }
}

impl Backend for Urom {
    fn name(&self) -> &'static str {
        "urom"
    }

    fn describe(&self) -> String {
        format!(
            "library: urom-coll {}; {} (pid {}) serving the {} ranks",
            env!("CARGO_PKG_VERSION"),
            self.where_workers,
            self.worker_pid,
            self.ranks
        )
    }

    fn collective<'a>(
        &'a mut self,
        kind: Kind,
        bytes: usize,
    ) -> anyhow::Result<Box<dyn Collective + 'a>> {
        let (send_len, recv_len) = kind.buffer_lens(bytes, self.ranks);
        let engine = &mut self.engine;
        let team = &self.team;
        // At least one byte each: a broadcast has no send buffer, and no buffer is empty.
        let mut send = team
            .alloc(engine, send_len.max(1))
            .context("allocating the send buffer")?;
        let mut recv = team
            .alloc(engine, recv_len.max(1))
            .context("allocating the receive buffer")?;
        {
            let mut s = send.bytes_mut()?;
            let mut r = recv.bytes_mut()?;
            kind::fill(
                kind,
                self.rank,
                self.ranks,
                bytes,
                &mut s[..send_len],
                &mut r[..recv_len],
            );
        }
        let coll = match kind {
            Kind::Allreduce => team.allreduce_init(
                engine,
                Some(&send),
                &recv,
                Kind::allreduce_count(bytes) as u64,
                Datatype::F32,
                ReduceOp::Sum,
            ),
            Kind::Alltoall => {
                team.alltoall_init(engine, Some(&send), &recv, bytes as u64, Datatype::U8)
            }
            Kind::Allgather => {
                team.allgather_init(engine, Some(&send), &recv, bytes as u64, Datatype::U8)
            }
            Kind::Bcast => team.bcast_init(engine, &recv, bytes as u64, Datatype::U8, 0),
        }
        .with_context(|| format!("setting up the {kind} of {bytes} B"))?;
        Ok(Box::new(UromCollective {
            engine,
            coll,
            _send: send,
            recv,
            kind,
            bytes,
            rank: self.rank,
            ranks: self.ranks,
            recv_len,
        }))
    }

    fn worker_pids(&self) -> Vec<u32> {
        // One worker per node, named once: by rank 0 (one node).
        if self.rank == 0 && self.worker_pid != 0 {
            vec![self.worker_pid]
        } else {
            Vec::new()
        }
    }
}

/// One persistent collective and its buffers (dropped after it: a buffer outlives the
/// collectives set up over it anyway).
struct UromCollective<'a> {
    engine: &'a mut ProgressEngine,
    coll: urom_coll::Collective,
    _send: Buffer,
    recv: Buffer,
    kind: Kind,
    bytes: usize,
    rank: usize,
    ranks: usize,
    recv_len: usize,
}

impl Collective for UromCollective<'_> {
    fn start(&mut self) {
        if let Err(e) = self.coll.start() {
            panic!("urom {} of {} B: start failed: {e}", self.kind, self.bytes);
        }
    }

    fn wait(&mut self) {
        if let Some(Err(e)) = self.coll.wait(self.engine) {
            panic!("urom {} of {} B failed: {e}", self.kind, self.bytes);
        }
    }

    fn blocking(&mut self) {
        self.start();
        self.wait();
    }

    fn check(&self) -> Result<(), String> {
        let recv = self.recv.bytes().map_err(|e| e.to_string())?;
        kind::check(
            self.kind,
            self.rank,
            self.ranks,
            self.bytes,
            &recv[..self.recv_len],
        )
    }
}
