//! One rank of a domain, as a process of its own, for tests that kill a rank or that start
//! ranks with `mpirun`:
//!
//! `urom-domain-rank SOCKET RENDEZVOUS RANKS RANK PLUGIN [--die-in-allgather N]`
//!
//! Connects to the daemon at SOCKET, starts a worker running the plugin called PLUGIN, joins
//! the socket rendezvous RENDEZVOUS (`unix:PATH` or `HOST:PORT`) as rank RANK of RANKS, and
//! starts a domain with the worker as domain id RANK. Prints `running <ranks>` and exits 0
//! once the domain runs, or `failed: <why>` and exits 1. With `--die-in-allgather N`, the
//! process kills itself with SIGKILL as it starts its allgather number N (from 0: the record
//! lengths, the records, the acknowledgements), so that the other ranks see it die in the
//! middle of the start. A bad command line exits 2.
//!
//! `urom-domain-rank --oob mpi SOCKET PLUGIN` (built with the `mpi` feature; run under
//! `mpirun`): the same with the MPI collective on `MPI_COMM_WORLD`, whose rank and size give
//! the rank, the number of ranks and the worker's domain id.

use std::process::ExitCode;
use std::time::Duration;

use urom_host::oob::{OobCollective, OobError, OobRequest, RendezvousAddr, SocketOob};
use urom_host::{Domain, DomainStartProgress, Idle, ProgressEngine, Service, Worker};

/// How long anything may take.
const TIMEOUT: Duration = Duration::from_secs(60);

/// A collective that dies at its `die_at`th allgather.
struct Dying {
    inner: SocketOob,
    die_at: Option<u64>,
    started: u64,
}

impl OobCollective for Dying {
    fn size(&self) -> u32 {
        self.inner.size()
    }

    fn rank(&self) -> u32 {
        self.inner.rank()
    }

    fn allgather(&mut self, send: &[u8]) -> Result<OobRequest, OobError> {
        if self.die_at == Some(self.started) {
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
        }
        self.started += 1;
        self.inner.allgather(send)
    }

    fn test(&mut self, request: &mut OobRequest) -> Result<bool, OobError> {
        self.inner.test(request)
    }

    fn free(&mut self, request: OobRequest) {
        self.inner.free(request)
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, kind, rest @ ..] = args.as_slice()
        && flag == "--oob"
    {
        return match (kind.as_str(), rest) {
            ("mpi", [socket, plugin]) => report(mpi_rank(socket, plugin)),
            _ => usage(),
        };
    }
    let (fixed, die_at) = match args.as_slice() {
        [fixed @ .., flag, n] if flag == "--die-in-allgather" => match n.parse() {
            Ok(n) => (fixed, Some(n)),
            Err(_) => return usage(),
        },
        fixed => (fixed, None),
    };
    let [socket, rendezvous, ranks, rank, plugin] = fixed else {
        return usage();
    };
    let (Ok(rendezvous), Ok(ranks), Ok(rank)) = (
        rendezvous.parse::<RendezvousAddr>(),
        ranks.parse::<u32>(),
        rank.parse::<u32>(),
    ) else {
        return usage();
    };
    report(socket_rank(
        socket,
        &rendezvous,
        ranks,
        rank,
        plugin,
        die_at,
    ))
}

/// Prints how the start ended and exits accordingly.
fn report(outcome: Result<u32, String>) -> ExitCode {
    match outcome {
        Ok(ranks) => {
            println!("running {ranks}");
            ExitCode::SUCCESS
        }
        Err(why) => {
            println!("failed: {why}");
            ExitCode::from(1)
        }
    }
}

fn usage() -> ExitCode {
    eprintln!(
        "usage: urom-domain-rank SOCKET RENDEZVOUS RANKS RANK PLUGIN [--die-in-allgather N]\n\
         \x20      urom-domain-rank --oob mpi SOCKET PLUGIN"
    );
    ExitCode::from(2)
}

/// A rank meeting the others through the socket rendezvous.
fn socket_rank(
    socket: &str,
    rendezvous: &RendezvousAddr,
    ranks: u32,
    rank: u32,
    plugin: &str,
    die_at: Option<u64>,
) -> Result<u32, String> {
    let oob = SocketOob::join(rendezvous, ranks, rank, TIMEOUT).map_err(|e| e.to_string())?;
    let oob = Dying {
        inner: oob,
        die_at,
        started: 0,
    };
    run(socket, plugin, oob)
}

/// A rank meeting the others through MPI.
#[cfg(feature = "mpi")]
fn mpi_rank(socket: &str, plugin: &str) -> Result<u32, String> {
    let oob = urom_host::oob::MpiOob::world().map_err(|e| e.to_string())?;
    run(socket, plugin, oob)
}

/// Without MPI built in.
#[cfg(not(feature = "mpi"))]
fn mpi_rank(_socket: &str, _plugin: &str) -> Result<u32, String> {
    Err("this urom-domain-rank is built without the `mpi` feature".to_owned())
}

/// Starts a worker running `plugin` on the service at `socket` and a domain of it, with this
/// rank's number as its domain id; the number of ranks once the domain runs.
fn run(socket: &str, plugin: &str, oob: impl OobCollective + 'static) -> Result<u32, String> {
    let rank = oob.rank();
    let service = Service::<Idle>::new()
        .set_socket(socket)
        .start()
        .map_err(|(_, e)| e.to_string())?;
    let plugin = service
        .plugin(plugin)
        .ok_or_else(|| format!("the service offers no plugin {plugin}"))?
        .id;
    let mut engine = ProgressEngine::new();
    let worker = Worker::new()
        .set_service(&service)
        .set_plugins(plugin)
        .start(&mut engine)
        .map_err(|(_, e)| e.to_string())?
        .wait_running(&mut engine, TIMEOUT)
        .map_err(|e| format!("the worker did not start: {e:?}"))?;
    let domain = Domain::new()
        .set_oob(oob)
        .set_workers(&[u64::from(rank)], &[&worker])
        .map_err(|(_, e)| e.to_string())?
        .start(&mut engine)
        .map_err(|(_, e)| e.to_string())?;
    match domain.wait_running(&mut engine, TIMEOUT) {
        Ok(running) => Ok(running.ranks()),
        Err(DomainStartProgress::Failed(_, e)) => Err(e.to_string()),
        Err(DomainStartProgress::Starting(_)) => {
            Err(format!("the domain did not start within {TIMEOUT:?}"))
        }
    }
}
