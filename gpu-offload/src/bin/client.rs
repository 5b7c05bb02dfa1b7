//! `gpu-offload-client`: see `gpu_offload::client`, or run with `--help`.

use gpu_offload::client::{self, ClientArgs, ClientConfig};

fn main() {
    gpu_offload::cli::main_with("gpu-offload-client", |args: ClientArgs, stop| {
        gpu_offload::cli::init_logging(args.common.log_level);
        let config = ClientConfig::from_args(&args)?;
        let stats = client::run_until(&config, stop)?;
        println!("{stats}");
        if stats.interrupted {
            return Err(client::ClientError::Interrupted {
                done: stats.operations,
                planned: config.iterations * config.threads as u64,
                unanswered: stats.unanswered,
            });
        }
        Ok(())
    });
}
