//! The ping-pong sample of the DOCA UROM guide, against a running urom-daemon offering the
//! sandbox plugin. `urom-ping-pong` alone starts two ranks (processes of this program) that
//! find each other through a socket rendezvous; `--ranks N` starts N, the message going round a
//! ring. A rank can also be started by another launcher: `--rank I --ranks N --rendezvous ADDR`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail};
use clap::{Parser, ValueEnum};
use urom_core::host::oob::{RendezvousAddr, SocketOob};
use urom_samples::ping_pong::{self, DEFAULT_MESSAGE, OobKind, RankConfig, SharedOob};

/// Out-of-band collectives, as `--oob` names them.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum Oob {
    /// A socket rendezvous: rank 0 listens at `--rendezvous` (chosen by the launcher).
    Socket,
    /// MPI, for ranks started by `mpirun` (needs a build with the MPI collective).
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
    /// How many ranks: started here as processes of this program, unless --rank is given.
    #[arg(long, default_value_t = 2, value_name = "N")]
    ranks: u32,
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
    match (oob, args.rank) {
        (OobKind::Mpi, _) => bail!(
            "this build has no MPI collective; start the ranks with `urom-ping-pong --ranks N` \
             (socket rendezvous) instead"
        ),
        (OobKind::Socket, None) => ping_pong::launch(args.ranks, &config),
        (OobKind::Socket, Some(rank)) => {
            let rendezvous = args
                .rendezvous
                .ok_or_else(|| anyhow!("--rank needs --rendezvous ADDR"))?;
            let address: RendezvousAddr = rendezvous.parse().map_err(|e| anyhow!("{e}"))?;
            let oob = SocketOob::join(&address, args.ranks, rank, config.timeout)
                .map_err(|e| anyhow!("rank {rank}: {e}"))?;
            ping_pong::run_rank(&config, SharedOob::new(oob), &|line| println!("{line}"))
        }
    }
}
