//! Host library of urom.
//!
//! An HPC or AI runtime embeds this crate to reach the urom service, spawn workers and offload
//! commands to their plugins. Read from the bottom up, the layers are:
//!
//! * the byte formats, re-exported from [`urom_wire`];
//! * transports that move frames between processes (shared memory on one machine, UCX across
//!   machines);
//! * preallocated task rings and the progress engine;
//! * the typestate contexts `Service`, `Worker` and `Domain`.
//!
//! Only the wire layer exists so far; the README's status table says what is still to come.
#![deny(unsafe_code)]

pub use urom_wire as wire;
