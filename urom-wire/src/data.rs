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
//! [`DataMessage`] reads both kinds without copying, and [`fast_command`] / [`fast_notification`]
//! read the one kind each hot path expects in a few word compares. A worker that must answer a command frame
//! that failed validation learns whom to answer from [`peek_command_identity`].

use static_assertions::assert_eq_size;
use zerocopy::little_endian::{I32, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::codec::{Message, check_exact_len, peek, prefix, put, reserved_zero};
use crate::frame::{FRAME_HEADER_LEN, Frame, FrameKind, MAGIC, PROTOCOL_VERSION};
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

/// The command in a whole frame of at most `max` bytes, when it is a well-formed command frame:
/// the frames [`FrameRepr::<DataMessage>::parse`](crate::FrameRepr::parse) reads as a command,
/// with the same result, read in a few word compares. `None` for any other frame: the full parse
/// then says what it is, or what is wrong with it.
#[inline]
pub fn fast_command(frame: &[u8], max: MaxMsgSize) -> Option<Command<'_>> {
    let rest = fast_frame_header(frame, FrameKind::Command, max)?;
    let (header, payload) = prefix::<CommandHeader>(rest).ok()?;
    (header.len.get() == payload.len() as u64).then(|| Command {
        plugin: header.plugin.get(),
        urom_context: header.urom_context.get(),
        payload,
    })
}

/// [`fast_command`] for a notification frame.
#[inline]
pub fn fast_notification(frame: &[u8], max: MaxMsgSize) -> Option<Notification<'_>> {
    let rest = fast_frame_header(frame, FrameKind::Notify, max)?;
    let (header, payload) = prefix::<NotifyHeader>(rest).ok()?;
    (header.reserved.get() == 0).then(|| Notification {
        plugin: header.plugin.get(),
        urom_context: header.urom_context.get(),
        status: Status::from_raw(header.status.get()),
        payload,
    })
}

/// The body of `frame` when its header is valid, says `kind` and the frame's exact length, and
/// the frame fits `max`: the first eight bytes (magic, version, kind) compared as one word, the
/// next eight (length, flags) as another.
#[inline(always)]
fn fast_frame_header(frame: &[u8], kind: FrameKind, max: MaxMsgSize) -> Option<&[u8]> {
    let lead = u64::from(MAGIC) | u64::from(PROTOCOL_VERSION) << 32 | u64::from(kind.raw()) << 48;
    let (first, rest) = frame.split_first_chunk::<8>()?;
    let (second, rest) = rest.split_first_chunk::<8>()?;
    let (_seq, body) = rest.split_first_chunk::<8>()?;
    // `len <= max` first: the second word then says length `len` and zero flags.
    (frame.len() <= max.get()
        && u64::from_le_bytes(*first) == lead
        && u64::from_le_bytes(*second) == frame.len() as u64)
        .then_some(body)
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
    use crate::FrameRepr;
    use std::vec;
    use std::vec::Vec;

    /// Every frame the fast parses read, the full parse reads the same; every command or
    /// notification the full parse reads, the fast one reads too.
    fn fast_agrees(frame: &[u8], max: MaxMsgSize) {
        let full = FrameRepr::<DataMessage>::parse(frame, max).map(|repr| repr.body);
        assert_eq!(
            fast_command(frame, max).map(DataMessage::Command),
            full.ok()
                .filter(|body| matches!(body, DataMessage::Command(_))),
            "{frame:02x?}"
        );
        assert_eq!(
            fast_notification(frame, max).map(DataMessage::Notify),
            full.ok()
                .filter(|body| matches!(body, DataMessage::Notify(_))),
            "{frame:02x?}"
        );
    }

    #[test]
    fn fast_parses_agree_with_the_full_parse() {
        let max = MaxMsgSize::new(MaxMsgSize::MIN).unwrap();
        let mut frames = Vec::new();
        // The last payload makes frames one word longer than `max` allows.
        let largest = max.get() - COMMAND_PAYLOAD_OFFSET;
        for payload_len in [0usize, 1, 16, largest, largest + 8] {
            let mut frame = vec![0x5a; COMMAND_PAYLOAD_OFFSET + payload_len];
            let roomy = MaxMsgSize::DEFAULT;
            write_command_headers(&mut frame, 9, 4, 77, payload_len, roomy).unwrap();
            frames.push(frame);
            let mut frame = vec![0x5a; NOTIFY_PAYLOAD_OFFSET + payload_len];
            write_notify_headers(&mut frame, 9, 4, 77, Status::NotFound, payload_len, roomy)
                .unwrap();
            frames.push(frame);
        }
        for frame in &frames {
            let frame: &[u8] = frame;
            fast_agrees(frame, max);
            fast_agrees(frame, MaxMsgSize::DEFAULT);
            // Cut short, or one byte too many.
            fast_agrees(&frame[..frame.len() - 1], max);
            fast_agrees(&frame[..FRAME_HEADER_LEN], max);
            let mut longer = frame.to_vec();
            longer.push(0);
            fast_agrees(&longer, max);
            // Every header byte changed, one at a time, in a few ways.
            for at in 0..COMMAND_PAYLOAD_OFFSET.min(frame.len()) {
                for change in [0x01u8, 0x80, 0xff] {
                    let mut bad = frame.to_vec();
                    bad[at] ^= change;
                    fast_agrees(&bad, max);
                }
            }
        }
    }

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
