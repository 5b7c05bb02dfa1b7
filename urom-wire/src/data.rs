//! Bodies exchanged between a host and a worker: commands and notifications.
//!
//! They carry the headers of the DOCA UROM plugin interface, little-endian:
//!
//! ```text
//! urom_worker_cmd     0 u64 type (plugin id) | 8 u64 urom_context | 16 u64 len
//!                     24 len bytes of plugin command                         header = 24
//! urom_worker_notify  0 u64 type (plugin id) | 8 u64 urom_context | 16 u64 len
//!                     24 i32 status | 28 u32 reserved | 32 len bytes          header = 32
//! ```
//!
//! `len` must account for exactly the bytes that follow. On the hot path, write the headers with
//! [`write_command_headers`] / [`write_notify_headers`] and the payload in place after them;
//! [`DataMessage`] reads both kinds without copying. A worker that must answer a command frame
//! that failed validation learns whom to answer from [`peek_command_identity`].

use static_assertions::assert_eq_size;
use zerocopy::little_endian::{I32, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::codec::{Message, check_exact_len, peek, prefix, put, reserved_zero};
use crate::frame::{FRAME_HEADER_LEN, Frame, FrameKind};
use crate::{DecodeError, EncodeError, MaxMsgSize, Status};

/// The wire layout of `struct urom_worker_cmd` without its payload.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct CommandHeader {
    /// `type`: the id of the plugin the command is for.
    pub plugin: U64,
    /// `urom_context`: the host's cookie, returned in the notification.
    pub urom_context: U64,
    /// `len`: bytes of plugin command that follow.
    pub len: U64,
}
assert_eq_size!(CommandHeader, [u8; 24]);

/// The wire layout of a notification without its payload: the fields of `struct
/// urom_worker_notify` but its `len`, which the frame's length already gives. Without it a
/// notification of up to 16 payload bytes fills one 64-byte frame: one cache line over shared
/// memory.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct NotifyHeader {
    /// `type`: the id of the plugin the notification is from.
    pub plugin: U64,
    /// `urom_context`: the cookie of the command this answers.
    pub urom_context: U64,
    /// `status`: a [`Status`] code.
    pub status: I32,
    /// Must be zero.
    pub reserved: U32,
}
assert_eq_size!(NotifyHeader, [u8; 24]);

/// Length of [`CommandHeader`].
pub const CMD_HEADER_LEN: usize = size_of::<CommandHeader>();
/// Length of [`NotifyHeader`].
pub const NOTIFY_HEADER_LEN: usize = size_of::<NotifyHeader>();
/// Where a command's payload starts in its frame.
pub const COMMAND_PAYLOAD_OFFSET: usize = FRAME_HEADER_LEN + CMD_HEADER_LEN;
/// Where a notification's payload starts in its frame.
pub const NOTIFY_PAYLOAD_OFFSET: usize = FRAME_HEADER_LEN + NOTIFY_HEADER_LEN;

/// The largest command payload a frame of at most `max` bytes carries.
pub const fn max_command_payload(max: MaxMsgSize) -> usize {
    max.get() - COMMAND_PAYLOAD_OFFSET
}

/// The largest notification payload a frame of at most `max` bytes carries.
pub const fn max_notify_payload(max: MaxMsgSize) -> usize {
    max.get() - NOTIFY_PAYLOAD_OFFSET
}

/// Host -> worker: a command for one plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Command<'a> {
    /// The plugin's id.
    pub plugin: u64,
    /// The host's cookie, returned in the notification.
    pub urom_context: u64,
    /// The plugin's command bytes.
    pub payload: &'a [u8],
}

/// Worker -> host: a plugin's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Notification<'a> {
    /// The plugin's id.
    pub plugin: u64,
    /// The cookie of the command this answers.
    pub urom_context: u64,
    /// The outcome.
    pub status: Status,
    /// The plugin's notification bytes.
    pub payload: &'a [u8],
}

message_family! {
    /// Every body that travels on a data channel.
    pub enum DataMessage<'a> {
        /// [`Command`].
        Command(Command<'a>),
        /// [`Notification`].
        Notify(Notification<'a>),
    }
}

impl<'a> Message<'a> for Command<'a> {
    const FIXED_LEN: usize = CMD_HEADER_LEN;

    #[inline]
    fn parse(body: &'a [u8]) -> Result<Self, DecodeError> {
        let (header, payload) = prefix::<CommandHeader>(body)?;
        check_payload_len(CMD_HEADER_LEN, header.len.get(), body.len())?;
        Ok(Command {
            plugin: header.plugin.get(),
            urom_context: header.urom_context.get(),
            payload,
        })
    }

    #[inline]
    fn body_len(&self) -> usize {
        CMD_HEADER_LEN + self.payload.len()
    }

    #[inline]
    fn emit(&self, dst: &mut [u8]) -> Result<(), EncodeError> {
        let header = command_header(self.plugin, self.urom_context, self.payload.len());
        put(dst, &header).copy_from_slice(self.payload);
        Ok(())
    }
}

impl<'a> Message<'a> for Notification<'a> {
    const FIXED_LEN: usize = NOTIFY_HEADER_LEN;

    #[inline]
    fn parse(body: &'a [u8]) -> Result<Self, DecodeError> {
        let (header, payload) = prefix::<NotifyHeader>(body)?;
        reserved_zero("notify.reserved", header.reserved.get().into())?;
        Ok(Notification {
            plugin: header.plugin.get(),
            urom_context: header.urom_context.get(),
            status: Status::from_raw(header.status.get()),
            payload,
        })
    }

    #[inline]
    fn body_len(&self) -> usize {
        NOTIFY_HEADER_LEN + self.payload.len()
    }

    #[inline]
    fn emit(&self, dst: &mut [u8]) -> Result<(), EncodeError> {
        let header = notify_header(self.plugin, self.urom_context, self.status);
        put(dst, &header).copy_from_slice(self.payload);
        Ok(())
    }
}

/// The plugin id and `urom_context` of the command in a whole data frame, each 0 when the
/// frame is too short to hold it. Nothing else is checked.
///
/// For a worker that must answer a command frame that failed validation: the error
/// notification goes to the plugin and cookie the frame names, as far as it names them.
#[inline]
pub fn peek_command_identity(frame: &[u8]) -> (u64, u64) {
    let word = |at: usize| {
        frame
            .get(at..)
            .and_then(peek::<U64>)
            .map_or(0, |word| word.get())
    };
    (word(FRAME_HEADER_LEN), word(FRAME_HEADER_LEN + 8))
}

#[inline]
fn check_payload_len(header_len: usize, len: u64, body_len: usize) -> Result<(), DecodeError> {
    let claimed = usize::try_from(len).unwrap_or(usize::MAX);
    check_exact_len(header_len.saturating_add(claimed), body_len)
}

#[inline]
fn command_header(plugin: u64, urom_context: u64, payload_len: usize) -> CommandHeader {
    CommandHeader {
        plugin: U64::new(plugin),
        urom_context: U64::new(urom_context),
        len: U64::new(payload_len as u64),
    }
}

#[inline]
fn notify_header(plugin: u64, urom_context: u64, status: Status) -> NotifyHeader {
    NotifyHeader {
        plugin: U64::new(plugin),
        urom_context: U64::new(urom_context),
        status: I32::new(status.raw()),
        reserved: U32::ZERO,
    }
}

/// Writes the frame and command headers of a command whose `payload_len` bytes the caller
/// writes at [`COMMAND_PAYLOAD_OFFSET`]; returns the frame's length.
#[inline]
pub fn write_command_headers(
    frame: &mut [u8],
    seq: u64,
    plugin: u64,
    urom_context: u64,
    payload_len: usize,
    max: MaxMsgSize,
) -> Result<usize, EncodeError> {
    let header = command_header(plugin, urom_context, payload_len);
    write_headers(frame, FrameKind::Command, seq, &header, payload_len, max)
}

/// Writes the frame and notification headers of a notification whose `payload_len` bytes the
/// caller writes at [`NOTIFY_PAYLOAD_OFFSET`]; returns the frame's length.
#[inline]
pub fn write_notify_headers(
    frame: &mut [u8],
    seq: u64,
    plugin: u64,
    urom_context: u64,
    status: Status,
    payload_len: usize,
    max: MaxMsgSize,
) -> Result<usize, EncodeError> {
    let header = notify_header(plugin, urom_context, status);
    write_headers(frame, FrameKind::Notify, seq, &header, payload_len, max)
}

/// Generic over the body's header so that its copy has a length known at compile time: a few
/// moves, not a call to `memcpy`, on the path of every command and notification.
#[inline(always)]
fn write_headers<H: IntoBytes + Immutable>(
    frame: &mut [u8],
    kind: FrameKind,
    seq: u64,
    body_header: &H,
    payload_len: usize,
    max: MaxMsgSize,
) -> Result<usize, EncodeError> {
    let body_header = body_header.as_bytes();
    let length = FRAME_HEADER_LEN
        .saturating_add(body_header.len())
        .saturating_add(payload_len);
    if length > max.get() {
        return Err(EncodeError::TooLong {
            length,
            max: max.get(),
        });
    }
    if frame.len() < length {
        return Err(EncodeError::BufferTooSmall {
            needed: length,
            available: frame.len(),
        });
    }
    let mut view = Frame::new_unchecked(&mut *frame);
    view.fill_header(kind, seq, length);
    view.body_mut()[..body_header.len()].copy_from_slice(body_header);
    Ok(length)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_identity_is_read_leniently() {
        let mut frame = [0u8; COMMAND_PAYLOAD_OFFSET + 4];
        let len = write_command_headers(&mut frame, 1, 4, 99, 4, MaxMsgSize::DEFAULT).unwrap();
        assert_eq!(len, frame.len());
        assert_eq!(peek_command_identity(&frame), (4, 99));
        // Whatever the header says, and however short the frame.
        frame[..FRAME_HEADER_LEN].fill(0xff);
        assert_eq!(peek_command_identity(&frame), (4, 99));
        assert_eq!(peek_command_identity(&frame[..40]), (4, 99));
        assert_eq!(peek_command_identity(&frame[..39]), (4, 0));
        assert_eq!(peek_command_identity(&frame[..30]), (0, 0));
        assert_eq!(peek_command_identity(&[]), (0, 0));
    }
}
