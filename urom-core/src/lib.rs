//! Host library of urom.
//!
//! An HPC or AI runtime embeds this crate to reach the urom service, spawn workers and offload
//! commands to their plugins. Read from the bottom up, the layers are:
//!
//! * the byte formats, re-exported from [`urom_wire`];
//! * [`transport`]: the [`transport::Transport`] trait that moves frames between processes, with
//!   [`transport::shm`] (shared memory on one machine), `transport::ucx` (across machines, with
//!   the `ucx` feature) and an in-process loopback, and [`transport::Channel`], the one type the
//!   rest of urom holds;
//! * [`abi`]: the plugin ABI (binary compatible with the DOCA UROM plugin interface) and its
//!   loader, and [`plugin`], the safe Rust plugin SDK built on it; [`graph`] and [`sandbox`]
//!   hold the sample plugins' messages and host helpers;
//! * [`domain`]: a domain's table (its members' plugin addresses and its hosts' buffers), as
//!   workers answer plugins' domain lookups from it;
//! * [`host`]: the progress engine and the typestate contexts `Service`, `Worker` and
//!   `Domain`, whose commands are tasks from preallocated task slots, and the out-of-band
//!   collectives domains are built with;
//! * [`auth`]: how a remote host and the service prove to each other that they share a secret;
//! * beside them, the rules the daemon and the worker share: [`plugin_id`] (plugin ids are
//!   single bits, at most 62 plugins), [`worker_command`] (the worker's command line) and
//!   [`worker_env`] (the environment entries a host may give its worker).
//!
//! Unsafe code lives only in `abi`, `transport::shm`, `transport::ucx` and `sys`; everything
//! else is safe Rust.
#![deny(unsafe_code)]
// Under loom only the ring and its atomics are built and tested.
#![cfg_attr(loom, allow(dead_code, unused_imports))]

pub use urom_wire as wire;

#[cfg(not(loom))]
pub mod abi;
#[cfg(not(loom))]
pub mod auth;
#[cfg(not(loom))]
pub mod domain;
#[cfg(not(loom))]
pub mod graph;
#[cfg(not(loom))]
pub mod host;
#[cfg(not(loom))]
pub mod plugin;
#[cfg(not(loom))]
pub mod plugin_id;
#[cfg(not(loom))]
pub mod sandbox;
mod sync;
mod sys;
#[cfg(not(loom))]
pub mod transport;
// Under loom, the ring alone, model-checked.
#[cfg(loom)]
#[allow(unsafe_code)]
#[path = "transport/shm/ring.rs"]
mod ring;
#[cfg(not(loom))]
pub mod worker_command;
#[cfg(not(loom))]
pub mod worker_env;

pub use sys::{PinError, WakeSet, pin_current_thread, socket_incoming_cpu};
