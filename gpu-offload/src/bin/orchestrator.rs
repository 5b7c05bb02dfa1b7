//! `gpu-offload-orchestrator`: see `gpu_offload::orchestrator`, or run with `--help`.

fn main() {
    gpu_offload::cli::exec_with_ucx_defaults(
        "gpu-offload-orchestrator",
        &[gpu_offload::cli::UCX_LOG_TO_STDERR],
    );
    gpu_offload::cli::main_with("gpu-offload-orchestrator", gpu_offload::orchestrator::run);
}
