//! `gpu-offload-orchestrator`: see `gpu_offload::orchestrator`, or run with `--help`.

use gpu_offload::cli::JsonArgs;
use gpu_offload::orchestrator::{self, OrchestratorArgs};

fn main() {
    let args = OrchestratorArgs::parse_with_json(std::env::args_os()).unwrap_or_else(|e| e.exit());
    let stop = gpu_offload::stop_on_signals().unwrap_or_else(|e| {
        eprintln!("gpu-offload-orchestrator: cannot install signal handlers: {e}");
        std::process::exit(1)
    });
    if let Err(e) = orchestrator::run(args, &stop) {
        eprintln!("gpu-offload-orchestrator: {e}");
        std::process::exit(1);
    }
}
