//! Every byte format urom exchanges.
//!
//! The layers, from the outside in:
//!
//! * [`frame`]: the 24-byte header every urom frame starts with (magic, protocol version, kind,
//!   flags, length, sequence number), so a receiver rejects garbage before looking further, and
//!   [`FrameRepr`], a frame with a typed body;
//! * [`control`]: the bodies exchanged between a host and the daemon (hello, authentication,
//!   plugin list, cpuset, worker spawn / destroy / query, status report, errors, worker exit
//!   events);
//! * [`data`]: the bodies exchanged between a host and a worker: commands carrying the 24-byte
//!   `urom_worker_cmd` header and notifications carrying the 32-byte `urom_worker_notify` header;
//! * [`domain`]: what a host and its workers exchange to start a domain (plugin addresses, the
//!   table of the domain's members in chunks, acknowledgements) on the same data channel, the
//!   table's layout, and the blocks hosts allgather to build it; [`oob`]: the socket
//!   rendezvous, an allgather among hosts without MPI;
//! * [`report`]: the records of the daemon's status report (daemon, plugin directories and
//!   files, workers and their counters), read in pages over the control socket, and
//!   [`link`]: the counters request and reply between the daemon and each of its workers;
//! * [`shm`]: what the shared-memory transport exchanges below the frames: the handshake that
//!   passes a mapping over a Unix socket, and the 128-byte header at the start of the mapping;
//! * [`ucx`]: what the UCX transport exchanges below the frames: the handshake that agrees on
//!   message size and credits, and the headers of its data, credit and close messages;
//! * [`gpu`]: the big-endian format of the GPU remote-offload application, which has no urom
//!   frame header because it must interoperate with the original clients, and in
//!   [`gpu::channel`] the hellos between our offload server and orchestrator.
//!
//! Each plugin's own messages (the payload of those data-path messages) live in its folder,
//! `plugins/<name>/wire`, beside its host side and its worker side.
//!
//! Supporting types: [`Status`] (the DOCA error numbering, defined once for all of urom),
//! [`MaxMsgSize`] (the run-time bound on every frame), [`CpuSet`] and [`List`].
//!
//! Every family reads and writes its fields through one private codec module (fixed-size
//! zerocopy structs, length and reserved-field checks), and every wire struct's size is pinned
//! at compile time. Every decoder checks lengths before it reads, returns a [`DecodeError`] for
//! bad input, never panics and never allocates: the crate is `no_std` without `alloc`. Encoders
//! write into a caller's buffer and return an [`EncodeError`] when a value cannot be
//! represented. Code outside this crate never reads a urom format by byte offset: where a
//! receiver must answer bytes that failed validation, a lenient peek reads the one field it
//! needs ([`frame::peek_seq`], [`data::peek_command_identity`], [`gpu::peek_msg_id`]).
#![no_std]
#![forbid(unsafe_code)]

#[cfg(test)]
extern crate std;

#[macro_use]
mod macros;

mod codec;
pub mod control;
pub mod cpuset;
pub mod data;
pub mod domain;
mod error;
pub mod frame;
pub mod gpu;
mod limits;
pub mod link;
pub mod list;
pub mod oob;
pub mod report;
pub mod shm;
mod status;
mod text;
pub mod ucx;

pub use codec::copy_short;
pub use cpuset::CpuSet;
pub use error::{DecodeError, EncodeError, EnvEntryError};
pub use frame::{Body, FRAME_HEADER_LEN, Frame, FrameKind, FrameRepr, PROTOCOL_VERSION};
pub use limits::{MaxMsgSize, MaxMsgSizeError};
pub use list::List;
pub use status::Status;
pub use text::truncate_at_char_boundary;
