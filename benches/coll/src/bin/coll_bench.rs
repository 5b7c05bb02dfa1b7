//! The collective benchmark program, started by `mpirun`: one implementation (`--impl openmpi`
//! or `--impl urom`), every collective and size asked for; rank 0 prints one tab-separated line
//! per collective and size (`urom_coll_bench::record`). `benches/run-coll-bench.sh` runs it.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use mpi::traits::*;
use urom_coll_bench::harness::{self, Backend, Settings, Spin};
use urom_coll_bench::kind::Kind;
use urom_coll_bench::openmpi::OpenMpi;
use urom_coll_bench::{record, urom};

/// Exit status of a run whose implementation is not in this build.
const NOT_BUILT: u8 = 3;

#[derive(Parser, Debug)]
#[command(about = "Collective latency, overlap and CPU per collective, under mpirun")]
struct Args {
    /// The implementation: openmpi or urom.
    #[arg(long = "impl", default_value = "openmpi")]
    implementation: String,
    /// Only say whether IMPL is in this build (exit 0) or why not (exit 3); starts no MPI.
    #[arg(long, value_name = "IMPL")]
    impl_available: Option<String>,
    /// Collectives, separated by commas or spaces: allreduce, alltoall, allgather, bcast.
    #[arg(long, default_value = "allreduce,alltoall")]
    colls: String,
    /// Message sizes in bytes, separated by commas or spaces.
    #[arg(long, default_value = "8,64,512,4096,65536,1048576,16777216")]
    sizes: String,
    /// The round number written into the results.
    #[arg(long, default_value_t = 1)]
    round: u32,
    /// A fixed number of timed iterations per loop (default: from --budget-ms).
    #[arg(long)]
    iters: Option<usize>,
    /// About how long each timed loop runs, in milliseconds.
    #[arg(long, default_value_t = 200)]
    budget_ms: u64,
    /// About how long the CPU-time loop runs, in milliseconds.
    #[arg(long, default_value_t = 500)]
    cpu_budget_ms: u64,
    /// The fewest timed iterations per loop when they come from a budget (large collectives
    /// of slow implementations otherwise run for long).
    #[arg(long, default_value_t = Settings::default().min_iters)]
    min_iters: usize,
    /// Print the column header line first.
    #[arg(long)]
    header: bool,
}

fn list(text: &str) -> impl Iterator<Item = &str> {
    text.split([',', ' ']).filter(|s| !s.is_empty())
}

fn available(name: &str) -> Result<(), String> {
    match name {
        "openmpi" => Ok(()),
        "urom" => urom::available(),
        _ => Err(format!("unknown implementation {name:?} (openmpi or urom)")),
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(name) = &args.impl_available {
        return match available(name) {
            Ok(()) => {
                println!("{name}: available");
                ExitCode::SUCCESS
            }
            Err(why) => {
                println!("{name}: {why}");
                ExitCode::from(NOT_BUILT)
            }
        };
    }
    if let Err(why) = available(&args.implementation) {
        eprintln!("urom-coll-bench: --impl {}: {why}", args.implementation);
        return ExitCode::from(NOT_BUILT);
    }
    let mut plan = Vec::new();
    for c in list(&args.colls) {
        let Some(kind) = Kind::parse(c) else {
            eprintln!("urom-coll-bench: unknown collective {c:?}");
            return ExitCode::from(2);
        };
        for s in list(&args.sizes) {
            match s.parse::<usize>() {
                Ok(bytes) if bytes > 0 => plan.push((kind, bytes)),
                _ => {
                    eprintln!("urom-coll-bench: bad size {s:?} (bytes, at least 1)");
                    return ExitCode::from(2);
                }
            }
        }
    }
    let settings = Settings {
        round: args.round,
        iters: args.iters,
        budget: Duration::from_millis(args.budget_ms),
        cpu_budget: Duration::from_millis(args.cpu_budget_ms),
        min_iters: args.min_iters.max(1),
        ..Settings::default()
    };

    let Some(universe) = mpi::initialize() else {
        eprintln!("urom-coll-bench: MPI was already initialized");
        return ExitCode::FAILURE;
    };
    let world = universe.world();
    let root = world.rank() == 0;
    let spin = Spin::calibrate();
    // Let the launch settle (the first collective measured right after start-up was now and
    // then thousands of times slower): half a second of barriers before anything is timed.
    let settle = std::time::Instant::now();
    let mut settled = 0u8;
    while settled == 0 {
        world.barrier();
        let mut done = u8::from(settle.elapsed() >= Duration::from_millis(500));
        world.process_at_rank(0).broadcast_into(&mut done);
        settled = done;
    }
    let mut backend: Box<dyn Backend> = match args.implementation.as_str() {
        "urom" => match urom::backend(&world) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("urom-coll-bench: rank {}: {e:#}", world.rank());
                world.abort(1);
            }
        },
        _ => Box::new(OpenMpi::new(&world)),
    };
    let mut out = std::io::stdout().lock();
    if root {
        if args.header {
            let _ = writeln!(out, "{}", record::header());
        }
        let _ = writeln!(
            out,
            "# impl={} ranks={} round={} {}; busy loop {:.3} ns per unit",
            backend.name(),
            world.size(),
            args.round,
            backend.describe(),
            spin.ns_per_unit()
        );
        let _ = out.flush();
    }
    for (kind, bytes) in plan {
        match harness::measure(&world, backend.as_mut(), kind, bytes, &settings, &spin) {
            Ok(Some(row)) => {
                let _ = writeln!(out, "{}", row.to_line());
                let _ = out.flush();
            }
            Ok(None) => {}
            Err(e) => {
                eprintln!(
                    "urom-coll-bench: rank {}: {kind} of {bytes} B: {e:#}",
                    world.rank()
                );
                world.abort(1);
            }
        }
    }
    drop(backend);
    drop(universe);
    ExitCode::SUCCESS
}
