//! The ping-pong sample of the DOCA UROM guide, against a running urom-daemon offering the
//! sandbox plugin. `urom-ping-pong` alone starts two ranks (processes of this program) that
//! find each other through a socket rendezvous; `--ranks N` starts N, the message going round a
//! ring. A rank can also be started by another launcher: `--rank I --ranks N --rendezvous ADDR`;
//! or, in a build with the `mpi` feature, by `mpirun -np N urom-ping-pong --oob mpi`, each rank
//! taking its rank and the size from MPI as DOCA's sample does.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::anyhow;
use clap::{Parser, ValueEnum};
use urom_host::oob::{RendezvousAddr, SocketOob};
use urom_samples::ping_pong::{self, DEFAULT_MESSAGE, OobKind, RankConfig, SharedOob};

/// Out-of-band collectives, as `--oob` names them.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum Oob {
    /// A socket rendezvous: rank 0 listens at `--rendezvous` (chosen by the launcher).
    Socket,
    /// MPI, for ranks started by `mpirun` (needs a build with the `mpi` feature): rank and size
    /// come from `MPI_COMM_WORLD`.
    Mpi,
}

/// Ping-pong between workers: rank 0 receives PING and answers PONG; the others send PING and
/// receive PONG, each through its own worker's sandbox plugin.
#[derive(Parser)]
#[command(name = "urom-ping-pong", version)]
struct Args {
    /// The message (at most 99 characters).
    #[arg(short = 'm', long, default_value = DEFAULT_MESSAGE)]
    message: String,
    /// The network device the workers' UCX uses (sets their UCX_NET_DEVICES, e.g. mlx5_0:1 or
    /// eth0) [default: any].
    #[arg(short = 'd', long, value_name = "DEVICE")]
    device: Option<String>,
    /// The daemon's socket [default: from DOCA_UROM_SERVICE_FILE, else the default socket].
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// How many ranks: started here as processes of this program, unless --rank is given
    /// [default: 2; with --oob mpi, MPI's size].
    #[arg(long, value_name = "N")]
    ranks: Option<u32>,
    /// Run only this rank (of --ranks), joining the others through --oob.
    #[arg(long, value_name = "I")]
    rank: Option<u32>,
    /// How the ranks exchange their records.
    #[arg(long, value_enum, default_value = "socket")]
    oob: Oob,
    /// With --rank and --oob socket: where rank 0 listens (unix:PATH or HOST:PORT).
    #[arg(long, value_name = "ADDR")]
    rendezvous: Option<String>,
    /// Seconds any one step may take.
    #[arg(long, default_value_t = 60, value_name = "SECONDS")]
    timeout: u64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let config = RankConfig {
        message: args.message,
        device: args.device,
        socket: args.socket,
        timeout: Duration::from_secs(args.timeout.max(1)),
    };
    ping_pong::check_message(&config.message)?;
    let oob = match args.oob {
        Oob::Socket => OobKind::Socket,
        Oob::Mpi => OobKind::Mpi,
    };
    let ranks = args.ranks.unwrap_or(2);
    match (oob, args.rank) {
        (OobKind::Mpi, _) => with_mpi(args.ranks, args.rank, &config),
        (OobKind::Socket, None) => ping_pong::launch(ranks, &config),
        (OobKind::Socket, Some(rank)) => {
            let rendezvous = args
                .rendezvous
                .ok_or_else(|| anyhow!("--rank needs --rendezvous ADDR"))?;
            let address: RendezvousAddr = rendezvous.parse().map_err(|e| anyhow!("{e}"))?;
            let oob = SocketOob::join(&address, ranks, rank, config.timeout)
                .map_err(|e| anyhow!("rank {rank}: {e}"))?;
            ping_pong::run_rank(&config, SharedOob::new(oob), &|line| println!("{line}"))
        }
    }
}

/// Runs this process's rank of a job started by `mpirun`: rank and size from `MPI_COMM_WORLD`,
/// the domain's allgather and the last barrier over MPI. A rank that fails ends the whole job
/// with `MPI_Abort`, as DOCA's sample does, so that no rank waits for it.
#[cfg(feature = "mpi")]
fn with_mpi(ranks: Option<u32>, rank: Option<u32>, config: &RankConfig) -> anyhow::Result<()> {
    use anyhow::bail;
    use mpi::topology::{Communicator, SimpleCommunicator};
    use urom_host::oob::{MpiOob, OobCollective};

    let oob = MpiOob::world().map_err(|e| anyhow!("MPI did not start: {e}"))?;
    let (me, size) = (oob.rank(), oob.size());
    if size < 2 {
        bail!(
            "a ping-pong needs at least 2 ranks; MPI started {size} (run it as \
             `mpirun -np 2 urom-ping-pong --oob mpi`)"
        );
    }
    if let Some(ranks) = ranks.filter(|&ranks| ranks != size) {
        bail!("--ranks {ranks} disagrees with MPI, which started {size} ranks");
    }
    if let Some(rank) = rank.filter(|&rank| rank != me) {
        bail!("--rank {rank} disagrees with MPI, which made this process rank {me}");
    }
    // This handle keeps MPI initialized until the end: dropping the last holder of the
    // collective (this one, after the domain's) finalizes MPI.
    let oob = SharedOob::new(oob);
    let result = ping_pong::run_rank(config, oob.clone(), &|line| println!("{line}"));
    if let Err(error) = &result {
        eprintln!("Error: {error:#}");
        SimpleCommunicator::world().abort(1);
    }
    drop(oob);
    result
}

/// Without the MPI collective built in.
#[cfg(not(feature = "mpi"))]
fn with_mpi(_ranks: Option<u32>, _rank: Option<u32>, _config: &RankConfig) -> anyhow::Result<()> {
    anyhow::bail!(
        "this build has no MPI collective (build urom-samples with the `mpi` feature); start \
         the ranks with `urom-ping-pong --ranks N` (socket rendezvous) instead"
    )
}
