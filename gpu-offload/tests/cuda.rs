//! The CUDA processor end to end, when this build has it and the machine has a GPU; otherwise
//! the test prints why it skipped.

mod common;

use common::*;

/// Why the CUDA processor cannot run here, if it cannot.
fn skip_reason() -> Option<String> {
    if !cfg!(feature = "cuda") {
        return Some("built without the `cuda` feature (cargo test --features cuda)".to_owned());
    }
    match gpu_offload::orchestrator::cuda::Gpu::open(None) {
        Ok(_) => None,
        Err(e) => Some(e.to_string()),
    }
}

#[test]
fn the_cuda_processor_reverses_every_message() {
    if let Some(reason) = skip_reason() {
        urom_testkit::skip(&reason);
        return;
    }
    let stack = Stack::start(&two_cpus(), 2, &[], &["--processor", "cuda"]);
    check_every_shape(&stack, &[0, 1, 2, 63, 64, 255, 256]);
    let log = stack.orchestrator_log();
    assert!(log.contains("kernel launched"), "{log}");
    let log = stack.stop_with(SIGINT, true);
    assert!(log.contains("kernel stopped"), "{log}");
}

#[test]
fn auto_falls_back_to_the_cpu_without_a_gpu() {
    if skip_reason().is_none() {
        urom_testkit::skip("this machine has a usable GPU, so `auto` picks CUDA");
        return;
    }
    let stack = Stack::start(&two_cpus()[..1], 1, &[], &["--processor", "auto"]);
    let output = run_client(stack.port, 1, 100, "ABC", "CBA", 8);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let log = stack.orchestrator_log();
    assert!(log.contains("using the CPU processor"), "{log}");
    stack.stop_with(SIGINT, true);
}
