//! `gpu-offload-client`: see `gpu_offload::client`, or run with `--help`.

use gpu_offload::client::{self, ClientArgs, ClientConfig};

fn main() {
    gpu_offload::cli::main_with("gpu-offload-client", |args: ClientArgs, _stop| {
        gpu_offload::cli::init_logging(args.common.log_level);
        let stats = client::run(&ClientConfig::from_args(&args)?)?;
        println!("{stats}");
        Ok::<_, client::ClientError>(())
    });
}
