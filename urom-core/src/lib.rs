//! Host library of urom.
//!
//! An HPC or AI runtime embeds this crate to reach the urom service, spawn workers and offload
//! commands to their plugins. Read from the bottom up, the layers are:
//!
//! * the byte formats, re-exported from [`urom_wire`];
//! * [`transport`]: the [`transport::Transport`] trait that moves frames between processes, with
//!   [`shm`] (shared memory on one machine) and an in-process loopback; UCX across machines
//!   will follow;
//! * [`task`]: the preallocated task ring of the host API;
//! * [`abi`]: the plugin ABI (binary compatible with the DOCA UROM plugin interface) and its
//!   loader, and [`plugin`], the safe Rust plugin SDK built on it; [`graph`] holds the graph
//!   sample plugin's messages;
//! * the progress engine and the typestate contexts `Service`, `Worker` and `Domain` will sit on
//!   top;
//! * beside them, the rules the daemon and the worker share: [`plugin_id`] (plugin ids are
//!   single bits, at most 62 plugins) and [`worker_command`] (the worker's command line).
//!
//! Unsafe code lives only in `abi`, `shm` and `sys`; everything else is safe Rust.
#![deny(unsafe_code)]
// Under loom only the ring and its atomics are built and tested.
#![cfg_attr(loom, allow(dead_code, unused_imports))]

pub use urom_wire as wire;

#[cfg(not(loom))]
pub mod abi;
#[cfg(not(loom))]
pub mod graph;
#[cfg(not(loom))]
pub mod host;
#[cfg(not(loom))]
pub mod plugin;
#[cfg(not(loom))]
pub mod plugin_id;
pub mod shm;
mod sync;
mod sys;
#[cfg(not(loom))]
pub mod task;
#[cfg(not(loom))]
pub mod transport;
#[cfg(not(loom))]
pub mod worker_command;

pub use sys::{PinError, pin_current_thread};
