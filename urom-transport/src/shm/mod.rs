//! The shared-memory transport: two processes on one machine exchange frames through two
//! single-producer single-consumer rings in one shared mapping.
//!
//! * `ring`: the ring of fixed-size slots and its index protocol;
//! * `layout`: where the header, control blocks and slots sit in the mapping;
//! * `mapping`: the sealed memfd, hugepages, the one `mmap`;
//! * `handshake`: how the two sides agree on a mapping over a Unix socket;
//! * `wait`: waiting for the peer (spinning, then sleeping on an eventfd) and waking it;
//! * `conn`: [`ShmConnection`] and its two halves, [`ShmSender`] and [`ShmReceiver`].
//!
//! This module, `sys` and `abi` are the only places in the crate with unsafe code.

mod conn;
mod handshake;
mod layout;
mod mapping;
pub(crate) mod ring;
mod wait;

pub use conn::{ShmConnection, ShmOffer, ShmReceiver, ShmSender};
pub use handshake::ShmConnectError;
pub use layout::{MAX_MAPPING_LEN, MAX_SLOTS, MIN_SLOTS, ShmLayoutError};
pub use mapping::HugePages;
pub use ring::ReadAhead;
pub use wait::FIRST_NAP;
