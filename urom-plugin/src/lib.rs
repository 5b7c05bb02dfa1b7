//! Plugins of urom: the plugin ABI, the Rust plugin SDK, plugin ids and the domain table.
//!
//! Read from the bottom up:
//!
//! * [`abi`]: the C types of the plugin interface (binary compatible with the DOCA UROM plugin
//!   interface), the loader a worker opens plugin libraries with, and the entry points the SDK
//!   exports;
//! * [`sdk`]: the safe Rust plugin SDK, [`Plugin`] and [`export_plugin!`], re-exported here;
//! * [`plugin_id`]: plugin ids are single bits, at most 62 plugins per service;
//! * [`domain`]: a domain's table (its members' plugin addresses and its hosts' buffers), as
//!   workers answer plugins' domain lookups from it;
//! * `ucx` (feature `ucx`): the UCX helpers plugins reach peer workers and their hosts' memory
//!   with (`PeerWorker`, `HostMemoryWorker`).
//!
//! A plugin crate depends on this crate alone (plus `urom-wire` for its byte formats):
//!
//! ```no_run
//! use urom_plugin::{Command, Notifier, Plugin, Status};
//!
//! struct Echo;
//!
//! impl Plugin for Echo {
//!     const VERSION: u64 = 1;
//!     fn open() -> Result<Self, Status> {
//!         Ok(Echo)
//!     }
//!     fn command(&mut self, command: &Command<'_>, out: &mut Notifier<'_>) -> Result<(), Status> {
//!         out.reply(command, Status::Success, command.payload)
//!     }
//! }
//!
//! urom_plugin::export_plugin!(Echo);
//! ```
//!
//! Unsafe code lives only in `abi`; everything else is safe Rust.
#![deny(unsafe_code)]

pub mod abi;
pub mod domain;
pub mod plugin_id;
pub mod sdk;

pub use sdk::{Arm, Command, Domain, Notifier, Plugin, Status, WakeFds};

/// The UCX helpers plugins use to reach peer workers and their hosts' memory.
#[cfg(feature = "ucx")]
pub mod ucx {
    pub use urom_transport::ucx::{
        Completion, HostMemoryWorker, ImportParams, MappedMemory, NO_EXPORTED_MEMH, OperationKind,
        OutOfBounds, PeerId, PeerWorker, RemoteKeyId, RemoteMemory, SlotId, UcxError,
        exported_memh_supported,
    };
}
