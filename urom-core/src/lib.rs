//! urom for embedders: one dependency that re-exports the crates urom is built from.
//!
//! Read from the bottom up, the layers are:
//!
//! * [`wire`] (`urom-wire`): every byte format, `no_std`, no unsafe;
//! * [`transport`] (`urom-transport`): the [`transport::Transport`] trait that moves frames
//!   between processes, with [`transport::shm`] (shared memory on one machine),
//!   `transport::ucx` (across machines, with the `ucx` feature) and an in-process loopback,
//!   [`transport::Channel`], the one type the rest of urom holds, and [`auth`], how a remote
//!   host and the service prove to each other that they share a secret;
//! * [`abi`], [`plugin`], [`plugin_id`] and [`domain`] (`urom-plugin`): the plugin ABI (binary
//!   compatible with the DOCA UROM plugin interface) and its loader, the safe Rust plugin SDK
//!   built on it, plugin ids, and a domain's table as workers answer plugins' lookups from it;
//! * [`worker_command`] and [`worker_env`] (`urom-contract`): what the daemon, the worker and
//!   the host agree on;
//! * [`host`] (`urom-host`): the progress engine and the typestate contexts `Service`, `Worker`
//!   and `Domain`, whose commands are tasks from preallocated task slots, and the out-of-band
//!   collectives domains are built with.
//!
//! A program that needs one layer only depends on its crate: plugins on `urom-plugin`, the
//! GPU offload programs on `urom-transport`, hosts on `urom-host`. Each plugin's host-side
//! helper is a crate of its own in the plugin's folder (`urom-graph`, `urom-sandbox`).
#![forbid(unsafe_code)]

pub use urom_contract::{worker_command, worker_env};
pub use urom_host as host;
pub use urom_plugin::sdk as plugin;
pub use urom_plugin::{abi, domain, export_plugin, plugin_id};
pub use urom_transport as transport;
pub use urom_transport::auth;
pub use urom_transport::sys::{PinError, WakeSet, pin_current_thread, socket_incoming_cpu};
pub use urom_wire as wire;
