//! GPU remote offload: the server, orchestrator and client of the DOCA DPU-GPU remote-offload
//! application, speaking its wire format ([`urom_wire::gpu`]) so that the original programs
//! and these interoperate.
//!
//! A client sends `client_request` messages over TCP to the server; the server forwards each,
//! through a channel, to the orchestrator, whose processor reverses the payload's bytes; the
//! response goes back the same way. Read from the bottom up:
//!
//! * [`limits`]: every limit of the three programs (message lengths, requests in flight,
//!   threads, batching, buffers);
//! * [`channel`]: the server <-> orchestrator channel (a Unix socket for control, one urom
//!   shared-memory connection per server data-path thread), its setup and shutdown messages;
//! * [`server`]: `gpu-offload-server`, the TCP front end with one pinned data-path thread per
//!   `--cpu`;
//! * [`orchestrator`]: `gpu-offload-orchestrator` and its processors, [`orchestrator::cpu`]
//!   (threads) and [`orchestrator::cuda`] (a persistent kernel, `cuda` feature);
//! * [`client`]: `gpu-offload-client`, threads x iterations x pipelined requests, every
//!   response checked;
//! * [`cli`]: what the three command lines share (numeric log levels, `-j` JSON files).
//!
//! Binaries are thin `main` functions over these modules, so tests can run any part in
//! process. Unsafe code lives only in the CUDA processor.
#![deny(unsafe_code)]

pub mod channel;
pub mod cli;
pub mod client;
pub mod limits;
pub mod orchestrator;
pub mod server;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// A flag that SIGINT and SIGTERM set.
pub fn stop_on_signals() -> std::io::Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, Arc::clone(&stop))?;
    }
    Ok(stop)
}
