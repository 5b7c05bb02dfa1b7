//! `gpu-offload-server`: see `gpu_offload::server`, or run with `--help`.

fn main() {
    gpu_offload::server::exec_with_ucx_port_reuse();
    gpu_offload::cli::main_with("gpu-offload-server", gpu_offload::server::run);
}
