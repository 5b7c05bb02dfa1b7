//! The hellos that open the channel between our GPU offload server and orchestrator (the
//! original application ran DOCA Comch there; ours runs a Unix socket and shared memory on one
//! machine, UCX across machines).
//!
//! Big-endian, like the rest of the GPU offload format:
//!
//! ```text
//! control hello   0 [8] magic "GPUOFFLD" | 8 u32 version (CHANNEL_VERSION)
//!                 12 u32 threads | 16 u32 max_message_length | 20 u32 max_concurrent   = 24
//! data hello      0 [8] magic "GPUOFDAT" | 8 u32 thread index | 12 u32 reserved (zero) = 16
//! data listener   0 [8] magic "GPUOFLSN" | 8 u16 port | 10 [6] reserved (zero)         = 16
//! ```
//!
//! Each side sends the control hello first on the control connection. Over UCX the server then
//! sends a data listener record: the port of the listener that takes the data connections (on
//! the address the control connection reached). The orchestrator then opens one data
//! connection per thread, in thread order, each starting with a data hello.
//! `threads` is the server's `--cpu` count or the orchestrator's `-t`, `max_message_length`
//! the programs' `--max-message-length` (payload bytes), `max_concurrent` their
//! `--max-concurrent-messages`. Agreeing on them is the programs' business.

use static_assertions::assert_eq_size;
use zerocopy::big_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::codec::{exact, magic, put_whole, reserved_bytes_zero, reserved_zero, version};
use crate::{DecodeError, EncodeError};

/// The first bytes of a control hello.
pub const CHANNEL_HELLO_MAGIC: [u8; 8] = *b"GPUOFFLD";
/// The first bytes of a data hello.
pub const DATA_HELLO_MAGIC: [u8; 8] = *b"GPUOFDAT";
/// The first bytes of a data listener record.
pub const DATA_LISTENER_MAGIC: [u8; 8] = *b"GPUOFLSN";
/// The version of this setup that this build speaks.
pub const CHANNEL_VERSION: u32 = 1;

const CHANNEL_HELLO: &str = "GPU offload channel hello";
const DATA_HELLO: &str = "GPU offload data connection hello";
const DATA_LISTENER: &str = "GPU offload data listener";

/// The wire layout of the control hello.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct ChannelHello {
    /// [`CHANNEL_HELLO_MAGIC`].
    pub magic: [u8; 8],
    /// [`CHANNEL_VERSION`].
    pub version: U32,
    /// Data-path threads.
    pub threads: U32,
    /// Largest payload, headers excluded.
    pub max_message_length: U32,
    /// Requests in flight per thread.
    pub max_concurrent: U32,
}
assert_eq_size!(ChannelHello, [u8; 24]);

/// Length of [`ChannelHello`].
pub const CHANNEL_HELLO_LEN: usize = size_of::<ChannelHello>();

/// The wire layout of the data hello.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct DataHello {
    /// [`DATA_HELLO_MAGIC`].
    pub magic: [u8; 8],
    /// The index of the data-path thread this connection serves.
    pub thread: U32,
    /// Must be zero.
    pub reserved: U32,
}
assert_eq_size!(DataHello, [u8; 16]);

/// Length of [`DataHello`].
pub const DATA_HELLO_LEN: usize = size_of::<DataHello>();

/// The wire layout of the data listener record.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct DataListener {
    /// [`DATA_LISTENER_MAGIC`].
    pub magic: [u8; 8],
    /// The port of the server's data listener.
    pub port: U16,
    /// Must be zero.
    pub reserved: [u8; 6],
}
assert_eq_size!(DataListener, [u8; 16]);

/// Length of [`DataListener`].
pub const DATA_LISTENER_LEN: usize = size_of::<DataListener>();

/// What a control hello says; its version is always [`CHANNEL_VERSION`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChannelHelloRepr {
    /// Data-path threads (server `--cpu` count, orchestrator `-t`).
    pub threads: u32,
    /// Largest payload, headers excluded (`--max-message-length`).
    pub max_message_length: u32,
    /// Requests in flight per thread (`--max-concurrent-messages`).
    pub max_concurrent: u32,
}

impl ChannelHelloRepr {
    /// Reads a control hello; `bytes` must hold exactly one.
    ///
    /// A hello of another version is [`DecodeError::UnsupportedFormatVersion`], which carries
    /// the version found; bytes with another magic are [`DecodeError::WrongMagic`].
    pub fn parse(bytes: &[u8]) -> Result<Self, DecodeError> {
        let wire: &ChannelHello = exact(bytes)?;
        magic(CHANNEL_HELLO, &wire.magic, &CHANNEL_HELLO_MAGIC)?;
        version(CHANNEL_HELLO, wire.version.get(), CHANNEL_VERSION)?;
        Ok(Self {
            threads: wire.threads.get(),
            max_message_length: wire.max_message_length.get(),
            max_concurrent: wire.max_concurrent.get(),
        })
    }

    /// The length of the hello: [`CHANNEL_HELLO_LEN`].
    pub const fn buffer_len(&self) -> usize {
        CHANNEL_HELLO_LEN
    }

    /// The wire struct of this hello.
    pub fn to_wire(&self) -> ChannelHello {
        ChannelHello {
            magic: CHANNEL_HELLO_MAGIC,
            version: U32::new(CHANNEL_VERSION),
            threads: U32::new(self.threads),
            max_message_length: U32::new(self.max_message_length),
            max_concurrent: U32::new(self.max_concurrent),
        }
    }

    /// The hello's bytes.
    pub fn to_bytes(&self) -> [u8; CHANNEL_HELLO_LEN] {
        zerocopy::transmute!(self.to_wire())
    }

    /// Writes the hello at the start of `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EncodeError> {
        put_whole(buf, &self.to_wire())
    }
}

/// What a data hello says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DataHelloRepr {
    /// The index of the data-path thread the connection serves.
    pub thread: u32,
}

impl DataHelloRepr {
    /// Reads a data hello; `bytes` must hold exactly one.
    pub fn parse(bytes: &[u8]) -> Result<Self, DecodeError> {
        let wire: &DataHello = exact(bytes)?;
        magic(DATA_HELLO, &wire.magic, &DATA_HELLO_MAGIC)?;
        reserved_zero("data_hello.reserved", wire.reserved.get().into())?;
        Ok(Self {
            thread: wire.thread.get(),
        })
    }

    /// The length of the hello: [`DATA_HELLO_LEN`].
    pub const fn buffer_len(&self) -> usize {
        DATA_HELLO_LEN
    }

    /// The wire struct of this hello.
    pub fn to_wire(&self) -> DataHello {
        DataHello {
            magic: DATA_HELLO_MAGIC,
            thread: U32::new(self.thread),
            reserved: U32::ZERO,
        }
    }

    /// The hello's bytes.
    pub fn to_bytes(&self) -> [u8; DATA_HELLO_LEN] {
        zerocopy::transmute!(self.to_wire())
    }

    /// Writes the hello at the start of `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EncodeError> {
        put_whole(buf, &self.to_wire())
    }
}

/// What a data listener record says: where the data connections go (over UCX).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DataListenerRepr {
    /// The port of the server's data listener, on the address the control connection reached.
    pub port: u16,
}

impl DataListenerRepr {
    /// Reads a data listener record; `bytes` must hold exactly one.
    pub fn parse(bytes: &[u8]) -> Result<Self, DecodeError> {
        let wire: &DataListener = exact(bytes)?;
        magic(DATA_LISTENER, &wire.magic, &DATA_LISTENER_MAGIC)?;
        reserved_bytes_zero("data_listener.reserved", &wire.reserved)?;
        Ok(Self {
            port: wire.port.get(),
        })
    }

    /// The length of the record: [`DATA_LISTENER_LEN`].
    pub const fn buffer_len(&self) -> usize {
        DATA_LISTENER_LEN
    }

    /// The wire struct of this record.
    pub fn to_wire(&self) -> DataListener {
        DataListener {
            magic: DATA_LISTENER_MAGIC,
            port: U16::new(self.port),
            reserved: [0; 6],
        }
    }

    /// The record's bytes.
    pub fn to_bytes(&self) -> [u8; DATA_LISTENER_LEN] {
        zerocopy::transmute!(self.to_wire())
    }

    /// Writes the record at the start of `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EncodeError> {
        put_whole(buf, &self.to_wire())
    }
}
