//! Host library of urom.
//!
//! An HPC or AI runtime embeds this crate to reach the urom service, spawn workers and offload
//! commands to their plugins. Read from the bottom up, the layers are:
//!
//! * the byte formats, re-exported from [`urom_wire`];
//! * [`abi`]: the plugin ABI (binary compatible with the DOCA UROM plugin interface) and its
//!   loader, and [`plugin`], the safe Rust plugin SDK built on it; [`graph`] holds the graph
//!   sample plugin's messages;
//! * transports, task rings, the progress engine and the typestate contexts `Service`, `Worker`
//!   and `Domain` will sit on top.
//!
//! Unsafe code lives only in `abi`; everything else is safe Rust.
#![deny(unsafe_code)]

pub use urom_wire as wire;

pub mod abi;
pub mod graph;
pub mod plugin;
