//! The wire format of the DOCA DPU-GPU remote-offload application, as its client, server and
//! orchestrator speak it, so that the original programs and ours interoperate.
//!
//! All integers are big-endian. Every message starts with an 8-byte header:
//!
//! ```text
//! 0 u32 wire_size   the whole message, header included
//! 4 u32 msg_id      MsgId
//! ```
//!
//! then, by message id:
//!
//! ```text
//! start_shutdown, shutdown_complete            nothing                      wire_size = 8
//! exchange_consumer_id_request / _response     8 u32 consumer_id            wire_size = 12
//! client_request, client_response              8 u32 length, 12 payload     wire_size = 12 + length
//! ```
//!
//! The payload is bounded by the programs' `--max-message-length` (256 by default), which
//! excludes the headers. [`peek_msg_id`] reads the id of a message already delimited by
//! [`message_length`].
//!
//! [`channel`] holds the hellos that open the channel between our server and orchestrator.

use static_assertions::assert_eq_size;
use zerocopy::big_endian::U32;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::codec::{check_exact_len, exact, fixed_length, peek, prefix, put};
use crate::{DecodeError, EncodeError};

pub mod channel;

/// The wire layout of the message header.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct GpuHeader {
    /// The whole message's length, header included.
    pub wire_size: U32,
    /// A [`MsgId`] code.
    pub msg_id: U32,
}
assert_eq_size!(GpuHeader, [u8; 8]);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct WordWire {
    value: U32,
}
assert_eq_size!(WordWire, [u8; 4]);

/// Length of [`GpuHeader`].
pub const GPU_HEADER_LEN: usize = size_of::<GpuHeader>();
/// Length of the headers before a client payload: [`GpuHeader`] and the `u32` length.
pub const CLIENT_HEADER_LEN: usize = GPU_HEADER_LEN + 4;
/// Length of a consumer-id message.
pub const CONSUMER_ID_MESSAGE_LEN: usize = GPU_HEADER_LEN + 4;
/// The programs' default `--max-message-length`: payload bytes, headers excluded.
pub const DEFAULT_MAX_MESSAGE_LENGTH: usize = 256;

int_enum! {
    /// What a message is.
    closed MsgId: u32 {
        /// Either side asks the other to shut down.
        StartShutdown = 0,
        /// The answer to [`MsgId::StartShutdown`]: this side has shut down.
        ShutdownComplete = 1,
        /// Server -> orchestrator: a data-path thread's consumer id.
        ExchangeConsumerIdRequest = 2,
        /// Orchestrator -> server: the matching consumer id on the processor side.
        ExchangeConsumerIdResponse = 3,
        /// Client -> server -> processor: bytes to process.
        ClientRequest = 4,
        /// Processor -> server -> client: the processed bytes.
        ClientResponse = 5,
    }
}

/// One message of the remote-offload format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuMessage<'a> {
    /// `start_shutdown`.
    StartShutdown,
    /// `shutdown_complete`.
    ShutdownComplete,
    /// `exchange_consumer_id_request`.
    ConsumerIdRequest {
        /// The sender's consumer id.
        consumer_id: u32,
    },
    /// `exchange_consumer_id_response`.
    ConsumerIdResponse {
        /// The sender's consumer id.
        consumer_id: u32,
    },
    /// `client_request` and its payload.
    ClientRequest(&'a [u8]),
    /// `client_response` and its payload.
    ClientResponse(&'a [u8]),
}

/// Validates the header at the start of `prefix` and returns the whole message's length, or
/// `None` when fewer than [`GPU_HEADER_LEN`] bytes have arrived.
///
/// For stream readers (TCP): call it as bytes arrive, then wait for the returned length. An
/// unknown id or an impossible or oversized length is refused as soon as the header is in.
#[inline]
pub fn message_length(prefix: &[u8], max_payload: usize) -> Result<Option<usize>, DecodeError> {
    let Ok((header, _)) = GpuHeader::ref_from_prefix(prefix) else {
        return Ok(None);
    };
    let raw_id = header.msg_id.get();
    let id = MsgId::from_raw(raw_id).ok_or(DecodeError::UnknownMessageId(raw_id))?;
    let length = header.wire_size.get() as usize;
    match id {
        MsgId::StartShutdown | MsgId::ShutdownComplete => {
            fixed_length(GPU_HEADER_LEN, length).map(|()| Some(length))
        }
        MsgId::ExchangeConsumerIdRequest | MsgId::ExchangeConsumerIdResponse => {
            fixed_length(CONSUMER_ID_MESSAGE_LEN, length).map(|()| Some(length))
        }
        MsgId::ClientRequest | MsgId::ClientResponse => {
            let max = CLIENT_HEADER_LEN.saturating_add(max_payload);
            if length < CLIENT_HEADER_LEN {
                Err(DecodeError::LengthBelowHeader {
                    length,
                    header: CLIENT_HEADER_LEN,
                })
            } else if length > max {
                Err(DecodeError::TooLong { length, max })
            } else {
                Ok(Some(length))
            }
        }
    }
}

/// The raw message id of the header at the start of `bytes`, or `None` when fewer than
/// [`GPU_HEADER_LEN`] bytes are there. Nothing else is checked.
///
/// For a reader that has delimited a message with [`message_length`] (which checks the id) and
/// wants its kind without parsing it; compare with [`MsgId::raw`].
#[inline]
pub fn peek_msg_id(bytes: &[u8]) -> Option<u32> {
    peek::<GpuHeader>(bytes).map(|header| header.msg_id.get())
}

impl<'a> GpuMessage<'a> {
    /// Reads one whole message; `bytes` must hold exactly it.
    #[inline]
    pub fn parse(bytes: &'a [u8], max_payload: usize) -> Result<Self, DecodeError> {
        let length = message_length(bytes, max_payload)?.ok_or(DecodeError::Truncated {
            needed: GPU_HEADER_LEN,
            available: bytes.len(),
        })?;
        check_exact_len(length, bytes.len())?;
        let (header, body) = prefix::<GpuHeader>(bytes)?;
        let id = MsgId::from_raw(header.msg_id.get())
            .ok_or(DecodeError::UnknownMessageId(header.msg_id.get()))?;
        Ok(match id {
            MsgId::StartShutdown => Self::StartShutdown,
            MsgId::ShutdownComplete => Self::ShutdownComplete,
            MsgId::ExchangeConsumerIdRequest => Self::ConsumerIdRequest {
                consumer_id: exact::<WordWire>(body)?.value.get(),
            },
            MsgId::ExchangeConsumerIdResponse => Self::ConsumerIdResponse {
                consumer_id: exact::<WordWire>(body)?.value.get(),
            },
            MsgId::ClientRequest | MsgId::ClientResponse => {
                let (claimed, payload) = prefix::<WordWire>(body)?;
                let claimed = claimed.value.get() as usize;
                if claimed != payload.len() {
                    return Err(DecodeError::LengthMismatch {
                        expected: payload.len(),
                        length: claimed,
                    });
                }
                if id == MsgId::ClientRequest {
                    Self::ClientRequest(payload)
                } else {
                    Self::ClientResponse(payload)
                }
            }
        })
    }

    /// The message id.
    pub fn msg_id(&self) -> MsgId {
        match self {
            Self::StartShutdown => MsgId::StartShutdown,
            Self::ShutdownComplete => MsgId::ShutdownComplete,
            Self::ConsumerIdRequest { .. } => MsgId::ExchangeConsumerIdRequest,
            Self::ConsumerIdResponse { .. } => MsgId::ExchangeConsumerIdResponse,
            Self::ClientRequest(_) => MsgId::ClientRequest,
            Self::ClientResponse(_) => MsgId::ClientResponse,
        }
    }

    /// The whole message's length.
    pub fn buffer_len(&self) -> usize {
        match self {
            Self::StartShutdown | Self::ShutdownComplete => GPU_HEADER_LEN,
            Self::ConsumerIdRequest { .. } | Self::ConsumerIdResponse { .. } => {
                CONSUMER_ID_MESSAGE_LEN
            }
            Self::ClientRequest(payload) | Self::ClientResponse(payload) => {
                CLIENT_HEADER_LEN + payload.len()
            }
        }
    }

    /// Writes the message at the start of `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8], max_payload: usize) -> Result<usize, EncodeError> {
        let length = self.buffer_len();
        let max = CLIENT_HEADER_LEN
            .saturating_add(max_payload)
            .min(u32::MAX as usize);
        if length > max {
            return Err(EncodeError::TooLong { length, max });
        }
        let available = buf.len();
        let out = buf.get_mut(..length).ok_or(EncodeError::BufferTooSmall {
            needed: length,
            available,
        })?;
        let header = GpuHeader {
            wire_size: U32::new(length as u32),
            msg_id: U32::new(self.msg_id().raw()),
        };
        let body = put(out, &header);
        match self {
            Self::StartShutdown | Self::ShutdownComplete => {}
            Self::ConsumerIdRequest { consumer_id } | Self::ConsumerIdResponse { consumer_id } => {
                put(
                    body,
                    &WordWire {
                        value: U32::new(*consumer_id),
                    },
                );
            }
            Self::ClientRequest(payload) | Self::ClientResponse(payload) => {
                let length = U32::new(payload.len() as u32);
                put(body, &WordWire { value: length }).copy_from_slice(payload);
            }
        }
        Ok(length)
    }
}

/// Writes the headers of a client request or response whose `payload_len` bytes the caller
/// writes at [`CLIENT_HEADER_LEN`]; returns the message's length.
#[inline]
pub fn write_client_headers(
    buf: &mut [u8],
    response: bool,
    payload_len: usize,
    max_payload: usize,
) -> Result<usize, EncodeError> {
    let length = CLIENT_HEADER_LEN.saturating_add(payload_len);
    let max = CLIENT_HEADER_LEN
        .saturating_add(max_payload)
        .min(u32::MAX as usize);
    if length > max {
        return Err(EncodeError::TooLong { length, max });
    }
    if buf.len() < length {
        return Err(EncodeError::BufferTooSmall {
            needed: length,
            available: buf.len(),
        });
    }
    let id = if response {
        MsgId::ClientResponse
    } else {
        MsgId::ClientRequest
    };
    let header = GpuHeader {
        wire_size: U32::new(length as u32),
        msg_id: U32::new(id.raw()),
    };
    let rest = put(buf, &header);
    put(
        rest,
        &WordWire {
            value: U32::new(payload_len as u32),
        },
    );
    Ok(length)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peek_msg_id_reads_any_whole_header() {
        let mut buf = [0xa5; 16];
        let len = GpuMessage::ClientResponse(b"DCBA")
            .emit(&mut buf, 256)
            .unwrap();
        assert_eq!(peek_msg_id(&buf[..len]), Some(MsgId::ClientResponse.raw()));
        assert_eq!(peek_msg_id(&buf[..8]), Some(5));
        assert_eq!(peek_msg_id(&buf[..7]), None);
        assert_eq!(peek_msg_id(&[0, 0, 0, 0, 0, 0, 0, 99]), Some(99));
    }
}
