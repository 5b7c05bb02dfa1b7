//! `gpu-offload-client`: see `gpu_offload::client`, or run with `--help`.

use gpu_offload::cli::JsonArgs;
use gpu_offload::client::{self, ClientArgs, ClientConfig};

fn main() {
    let args = ClientArgs::parse_with_json(std::env::args_os()).unwrap_or_else(|e| e.exit());
    gpu_offload::cli::init_logging(args.log_level);
    match ClientConfig::from_args(&args).and_then(|config| client::run(&config)) {
        Ok(stats) => println!("{stats}"),
        Err(e) => {
            eprintln!("gpu-offload-client: {e}");
            std::process::exit(1);
        }
    }
}
