//! `gpu-offload-server`: see `gpu_offload::server`, or run with `--help`.

fn main() {
    gpu_offload::cli::exec_with_ucx_defaults(
        "gpu-offload-server",
        &[
            gpu_offload::cli::UCX_LOG_TO_STDERR,
            gpu_offload::cli::UCX_REUSE_PORTS,
        ],
    );
    gpu_offload::cli::main_with("gpu-offload-server", gpu_offload::server::run);
}
