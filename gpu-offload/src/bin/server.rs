//! `gpu-offload-server`: see `gpu_offload::server`, or run with `--help`.

use gpu_offload::cli::JsonArgs;
use gpu_offload::server::{self, ServerArgs};

fn main() {
    let args = ServerArgs::parse_with_json(std::env::args_os()).unwrap_or_else(|e| e.exit());
    let stop = gpu_offload::stop_on_signals().unwrap_or_else(|e| {
        eprintln!("gpu-offload-server: cannot install signal handlers: {e}");
        std::process::exit(1)
    });
    if let Err(e) = server::run(args, &stop) {
        eprintln!("gpu-offload-server: {e}");
        std::process::exit(1);
    }
}
