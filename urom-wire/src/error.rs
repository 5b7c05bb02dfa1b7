//! Why bytes were rejected, or why a value could not be written.
//!
//! Both enums are `Copy` and carry only numbers and static names, so that producing one on a hot
//! path costs nothing.

use core::fmt;

/// Why a decoder rejected its input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    /// Fewer bytes are present than a header or a length field requires.
    Truncated {
        /// Bytes the frame or field needs.
        needed: usize,
        /// Bytes present.
        available: usize,
    },
    /// The length field claims fewer bytes than the header it is part of.
    LengthBelowHeader {
        /// The claimed length.
        length: usize,
        /// The header's own length.
        header: usize,
    },
    /// The frame claims more bytes than the negotiated maximum message size.
    TooLong {
        /// The claimed length.
        length: usize,
        /// The largest length allowed.
        max: usize,
    },
    /// More bytes are present than the frame or its last field accounts for.
    TrailingBytes {
        /// Bytes the frame accounts for.
        expected: usize,
        /// Bytes present.
        found: usize,
    },
    /// The length field does not match the only length this kind of message can have.
    LengthMismatch {
        /// The length this kind of message has.
        expected: usize,
        /// The claimed length.
        length: usize,
    },
    /// The frame does not start with the urom magic: these bytes are not a urom frame.
    BadMagic(u32),
    /// The frame's protocol version is not the one this build speaks.
    UnsupportedVersion(u16),
    /// The frame kind is not one urom defines.
    UnknownKind(u16),
    /// A fixed-layout message or header (shared-memory handshake, mapping header, GPU channel
    /// hello) does not start with its format's magic bytes: these bytes are not that format.
    WrongMagic {
        /// What the bytes were read as.
        format: &'static str,
    },
    /// A fixed-layout message or header carries a version of its format that this build does
    /// not speak; `found` lets the receiver name it in its answer.
    UnsupportedFormatVersion {
        /// What the bytes were read as.
        format: &'static str,
        /// The version the bytes carry.
        found: u32,
        /// The version this build speaks.
        supported: u32,
    },
    /// The frame kind is valid but does not belong on this channel (a data frame on the control
    /// socket, for example).
    UnexpectedKind(u16),
    /// A GPU offload message id that the format does not define.
    UnknownMessageId(u32),
    /// A field that must be zero in this protocol version is not.
    ReservedNotZero {
        /// The field's name.
        field: &'static str,
    },
    /// A text field is not valid UTF-8.
    TextNotUtf8 {
        /// The field's name.
        field: &'static str,
    },
    /// A text field lacks its NUL terminator, or has bytes other than NUL after it.
    TextNotNulPadded {
        /// The field's name.
        field: &'static str,
    },
    /// An environment entry is not of the form `NAME=value`.
    InvalidEnvEntry {
        /// Position of the entry in its list.
        index: usize,
        /// What is wrong with it.
        reason: EnvEntryError,
    },
    /// A domain table's records are not in rank order: the record at `expected` says it is
    /// rank `found`.
    RankMismatch {
        /// The rank the record's position gives it.
        expected: u32,
        /// The rank the record says.
        found: u32,
    },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Truncated { needed, available } => {
                write!(
                    f,
                    "truncated: needs {needed} bytes, only {available} present"
                )
            }
            Self::LengthBelowHeader { length, header } => write!(
                f,
                "length field says {length} bytes, less than the {header}-byte header"
            ),
            Self::TooLong { length, max } => write!(
                f,
                "message of {length} bytes exceeds the maximum message size of {max} bytes"
            ),
            Self::TrailingBytes { expected, found } => write!(
                f,
                "{found} bytes present where the message accounts for {expected}"
            ),
            Self::LengthMismatch { expected, length } => write!(
                f,
                "length field says {length} bytes, this message kind is always {expected}"
            ),
            Self::BadMagic(magic) => write!(f, "not a urom frame (magic {magic:#010x})"),
            Self::UnsupportedVersion(version) => write!(
                f,
                "protocol version {version} is not supported (this build speaks {})",
                crate::PROTOCOL_VERSION
            ),
            Self::UnknownKind(kind) => write!(f, "unknown frame kind {kind:#06x}"),
            Self::WrongMagic { format } => write!(f, "not a {format} (wrong magic bytes)"),
            Self::UnsupportedFormatVersion {
                format,
                found,
                supported,
            } => write!(
                f,
                "{format} version {found} is not supported (this build speaks {supported})"
            ),
            Self::UnexpectedKind(kind) => {
                write!(f, "frame kind {kind:#06x} does not belong on this channel")
            }
            Self::UnknownMessageId(id) => write!(f, "unknown GPU offload message id {id}"),
            Self::ReservedNotZero { field } => write!(f, "reserved field `{field}` is not zero"),
            Self::TextNotUtf8 { field } => write!(f, "text field `{field}` is not UTF-8"),
            Self::TextNotNulPadded { field } => write!(
                f,
                "text field `{field}` is not NUL-terminated and NUL-padded"
            ),
            Self::InvalidEnvEntry { index, reason } => {
                write!(f, "environment entry {index}: {reason}")
            }
            Self::RankMismatch { expected, found } => write!(
                f,
                "the domain record of rank {expected} says it is rank {found}"
            ),
        }
    }
}

impl core::error::Error for DecodeError {}

/// Why a value could not be written as bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncodeError {
    /// The output buffer is smaller than the encoded message.
    BufferTooSmall {
        /// Bytes the message needs.
        needed: usize,
        /// Bytes the buffer has.
        available: usize,
    },
    /// The encoded message would exceed the maximum message size.
    TooLong {
        /// The message's length.
        length: usize,
        /// The largest length allowed.
        max: usize,
    },
    /// A text is longer than its fixed-size field allows (one byte is kept for the terminator).
    TextTooLong {
        /// The field's name.
        field: &'static str,
        /// The text's length in bytes.
        length: usize,
        /// The longest text the field holds.
        max: usize,
    },
    /// A text contains a NUL byte, which would end it early for C readers.
    TextHasNul {
        /// The field's name.
        field: &'static str,
    },
    /// A list or byte string has more elements than its count field can express.
    TooMany {
        /// The field's name.
        field: &'static str,
        /// How many there are.
        count: usize,
        /// The most the field can express.
        max: usize,
    },
    /// An environment entry is not of the form `NAME=value`.
    InvalidEnvEntry {
        /// Position of the entry in its list.
        index: usize,
        /// What is wrong with it.
        reason: EnvEntryError,
    },
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::BufferTooSmall { needed, available } => write!(
                f,
                "buffer of {available} bytes is too small for a {needed}-byte message"
            ),
            Self::TooLong { length, max } => write!(
                f,
                "message of {length} bytes exceeds the maximum message size of {max} bytes"
            ),
            Self::TextTooLong { field, length, max } => write!(
                f,
                "`{field}` is {length} bytes long, the field holds at most {max}"
            ),
            Self::TextHasNul { field } => write!(f, "`{field}` contains a NUL byte"),
            Self::TooMany { field, count, max } => {
                write!(f, "`{field}` has {count} elements, at most {max} fit")
            }
            Self::InvalidEnvEntry { index, reason } => {
                write!(f, "environment entry {index}: {reason}")
            }
        }
    }
}

impl core::error::Error for EncodeError {}

/// What is wrong with an environment entry (`NAME=value`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnvEntryError {
    /// The entry has no `=`.
    MissingEquals,
    /// The name is empty, or has a character outside `[A-Za-z0-9_]`, or starts with a digit.
    BadName,
    /// The entry contains a NUL byte.
    ContainsNul,
    /// The entry is not UTF-8.
    NotUtf8,
}

impl fmt::Display for EnvEntryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::MissingEquals => "not of the form NAME=value (no `=`)",
            Self::BadName => "the name must be letters, digits and `_`, not starting with a digit",
            Self::ContainsNul => "contains a NUL byte",
            Self::NotUtf8 => "is not UTF-8",
        })
    }
}

impl core::error::Error for EnvEntryError {}
