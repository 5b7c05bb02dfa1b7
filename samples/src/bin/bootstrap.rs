//! The multi-worker bootstrap sample of the DOCA UROM guide, against a running urom-daemon.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::anyhow;
use clap::Parser;
use urom_host::{Idle, Service};

/// Starts four workers (group = id % 2) from four threads, sends each a graph loopback, lists
/// the even and odd groups, then waits for Ctrl-C and tears everything down.
#[derive(Parser)]
#[command(name = "urom-bootstrap", version)]
struct Args {
    /// The daemon's socket [default: from DOCA_UROM_SERVICE_FILE, else the default socket].
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Tear down as soon as the flow is done instead of waiting for Ctrl-C.
    #[arg(long)]
    once: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGINT, Arc::clone(&stop))?;
    let mut service = Service::<Idle>::new().set_identity("urom-bootstrap");
    if let Some(socket) = args.socket {
        service = service.set_socket(socket);
    }
    let service = service.start().map_err(|(_, e)| anyhow!("{e}"))?;
    println!(
        "UROM service started: {} plugins, CPUs {}",
        service.plugins().len(),
        service.cpuset()
    );
    urom_samples::bootstrap(&service, &stop, args.once, &|line| println!("{line}"))?;
    service.stop();
    println!("UROM service stopped");
    Ok(())
}
