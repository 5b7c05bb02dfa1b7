//! The shared-memory transport: two processes on one machine exchange frames through two
//! single-producer single-consumer rings in one shared mapping.
//!
//! * `ring`: the ring of fixed-size slots and its index protocol;
//! * `layout`: where the header, control blocks and slots sit in the mapping;
//! * `mapping`: the sealed memfd, hugepages, the one `mmap`;
//! * `conn`: the handshake over a Unix socket, waiting, peer liveness, and
//!   [`ShmConnection`], the [`crate::transport::Transport`] built from all of it.
//!
//! This module and `sys` are the only places in the crate with unsafe code.
#![allow(unsafe_code)]

#[cfg(not(loom))]
mod conn;
#[cfg(not(loom))]
mod layout;
#[cfg(not(loom))]
mod mapping;
pub(crate) mod ring;

#[cfg(not(loom))]
pub use conn::{FIRST_NAP, ShmConfig, ShmConnectError, ShmConnection};
#[cfg(not(loom))]
pub use layout::{MAX_MAPPING_LEN, MAX_SLOTS, MIN_SLOTS, ShmLayoutError};
#[cfg(not(loom))]
pub use mapping::HugePages;
