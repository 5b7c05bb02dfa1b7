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

/// The length of the whole `client_request` (`client_response` when `id` says so) at the start
/// of `bytes`, when one is there complete and well formed with a payload of at most
/// `max_payload` bytes: what [`message_length`] and [`GpuMessage::parse`] together accept as
/// that kind, read in three word compares. `None` for anything else, a message not yet whole
/// included: the full parse then says what it is, or what is wrong with it.
///
/// For the data path, where every message is a client request or response.
#[inline]
pub fn fast_client_message(bytes: &[u8], id: MsgId, max_payload: usize) -> Option<usize> {
    let (headers, _) = bytes.split_first_chunk::<CLIENT_HEADER_LEN>()?;
    let word = |at: usize| {
        u32::from_be_bytes([
            headers[at],
            headers[at + 1],
            headers[at + 2],
            headers[at + 3],
        ])
    };
    let (wire_size, msg_id, payload_len) = (word(0) as usize, word(4), word(8) as usize);
    (msg_id == id.raw()
        && payload_len <= max_payload
        && wire_size == CLIENT_HEADER_LEN + payload_len
        && wire_size <= bytes.len())
    .then_some(wire_size)
}

/// Writes the headers of a `client_response` with a payload of `payload_len` bytes, which the
/// caller has checked against its limit, at the start of `buf` (at least
/// [`CLIENT_HEADER_LEN`] bytes); returns the whole response's length.
#[inline]
pub fn put_response_headers(buf: &mut [u8; CLIENT_HEADER_LEN], payload_len: u32) -> usize {
    let wire_size = CLIENT_HEADER_LEN as u32 + payload_len;
    buf[..4].copy_from_slice(&wire_size.to_be_bytes());
    buf[4..8].copy_from_slice(&MsgId::ClientResponse.raw().to_be_bytes());
    buf[8..].copy_from_slice(&payload_len.to_be_bytes());
    wire_size as usize
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

    /// Whatever bytes follow: the fast read of a client message says what the full parse of
    /// the message `message_length` delimits says, for both kinds.
    fn fast_agrees(bytes: &[u8], max: usize) {
        for id in [MsgId::ClientRequest, MsgId::ClientResponse] {
            let full = match message_length(bytes, max) {
                Ok(Some(len)) if len <= bytes.len() => {
                    match GpuMessage::parse(&bytes[..len], max) {
                        Ok(message) if message.msg_id() == id => Some(len),
                        _ => None,
                    }
                }
                _ => None,
            };
            assert_eq!(
                fast_client_message(bytes, id, max),
                full,
                "{id:?} {bytes:02x?}"
            );
        }
    }

    #[test]
    fn the_fast_read_of_client_messages_agrees_with_the_full_parse() {
        let mut cases: std::vec::Vec<std::vec::Vec<u8>> = std::vec::Vec::new();
        for payload in [&b""[..], b"A", b"ABCDEFGH", &[7u8; 16]] {
            for message in [
                GpuMessage::ClientRequest(payload),
                GpuMessage::ClientResponse(payload),
                GpuMessage::StartShutdown,
                GpuMessage::ConsumerIdRequest { consumer_id: 4 },
            ] {
                let mut buf = std::vec![0u8; message.buffer_len() + 3];
                let len = message.emit(&mut buf, 256).unwrap();
                cases.push(buf[..len].to_vec());
                // Followed by more bytes, cut short, and with each header byte changed.
                cases.push(buf.clone());
                cases.push(buf[..len - 1].to_vec());
                for at in 0..CLIENT_HEADER_LEN.min(len) {
                    for delta in [1u8, 0x80] {
                        let mut changed = buf[..len].to_vec();
                        changed[at] = changed[at].wrapping_add(delta);
                        cases.push(changed);
                    }
                }
            }
        }
        for case in &cases {
            for max in [0, 1, 8, 16, 256] {
                fast_agrees(case, max);
            }
        }
    }

    #[test]
    fn response_headers_are_those_the_encoder_writes() {
        let mut ours = [0u8; CLIENT_HEADER_LEN];
        let mut theirs = [0u8; CLIENT_HEADER_LEN + 256];
        for payload_len in [0u32, 1, 64, 256] {
            assert_eq!(
                put_response_headers(&mut ours, payload_len),
                write_client_headers(&mut theirs, true, payload_len as usize, 256).unwrap()
            );
            assert_eq!(ours[..], theirs[..CLIENT_HEADER_LEN]);
        }
    }

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
