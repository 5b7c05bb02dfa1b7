//! Field helpers every message family shares: reading and writing fixed-size wire structs,
//! length checks, reserved fields, counts.
//!
//! Every family module ([`crate::frame`], [`crate::control`], [`crate::data`], [`crate::gpu`],
//! [`crate::shm`], [`crate::graph`]) reads and writes its bytes through these helpers and
//! nothing else, so that the rules (lengths checked before reading, one error per kind of bad
//! input) live in one place.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::{DecodeError, EncodeError};

/// The body of one frame kind: its fixed wire part, and how it is read and written.
///
/// A message family (control, data path) is a table of variants, each naming the type that
/// implements this trait (see `message_family!`); the family's `kind`, `parse`, `body_len` and
/// `emit`, and the bound on its fixed parts, are generated from that table.
pub(crate) trait Message<'a>: Sized {
    /// Bytes of the fixed part: the whole body of a fixed-size message, the header before the
    /// list or payload of a variable one.
    const FIXED_LEN: usize;

    /// Reads a body that must be exactly this message.
    fn parse(body: &'a [u8]) -> Result<Self, DecodeError>;

    /// How many bytes [`Message::emit`] writes.
    #[inline]
    fn body_len(&self) -> usize {
        Self::FIXED_LEN
    }

    /// Writes the body into `dst`, which is exactly [`Message::body_len`] bytes.
    fn emit(&self, dst: &mut [u8]) -> Result<(), EncodeError>;
}

/// The empty body of a request or acknowledgement that carries nothing.
pub(crate) struct Empty;

impl Message<'_> for Empty {
    const FIXED_LEN: usize = 0;

    #[inline]
    fn parse(body: &[u8]) -> Result<Self, DecodeError> {
        check_exact_len(0, body.len()).map(|()| Empty)
    }

    #[inline]
    fn emit(&self, _dst: &mut [u8]) -> Result<(), EncodeError> {
        Ok(())
    }
}

/// Reads a fixed-size wire struct that must fill `bytes` exactly.
#[inline]
pub(crate) fn exact<W>(bytes: &[u8]) -> Result<&W, DecodeError>
where
    W: FromBytes + KnownLayout + Immutable + Unaligned,
{
    let (wire, rest) = prefix::<W>(bytes)?;
    if !rest.is_empty() {
        return Err(DecodeError::TrailingBytes {
            expected: size_of::<W>(),
            found: bytes.len(),
        });
    }
    Ok(wire)
}

/// Reads a fixed-size wire struct at the front of `bytes`; returns it and the bytes after it.
#[inline]
pub(crate) fn prefix<W>(bytes: &[u8]) -> Result<(&W, &[u8]), DecodeError>
where
    W: FromBytes + KnownLayout + Immutable + Unaligned,
{
    W::ref_from_prefix(bytes).map_err(|_| DecodeError::Truncated {
        needed: size_of::<W>(),
        available: bytes.len(),
    })
}

/// Reads a fixed-size wire struct at the front of `bytes`, or `None` when it is shorter: for
/// the lenient peeks, which check nothing else.
#[inline]
pub(crate) fn peek<W>(bytes: &[u8]) -> Option<&W>
where
    W: FromBytes + KnownLayout + Immutable + Unaligned,
{
    W::ref_from_prefix(bytes).ok().map(|(wire, _)| wire)
}

/// Writes a fixed-size wire struct at the front of `dst`; returns the bytes after it.
///
/// Callers size `dst` from the same struct, so it is always long enough.
#[inline]
pub(crate) fn put<'d, W: IntoBytes + Immutable>(dst: &'d mut [u8], wire: &W) -> &'d mut [u8] {
    let (head, tail) = dst.split_at_mut(size_of::<W>());
    head.copy_from_slice(wire.as_bytes());
    tail
}

/// Writes a fixed-size wire struct that is a whole message at the front of `buf`; returns its
/// length, or [`EncodeError::BufferTooSmall`] when `buf` is shorter.
#[inline]
pub(crate) fn put_whole<W: IntoBytes + Immutable>(
    buf: &mut [u8],
    wire: &W,
) -> Result<usize, EncodeError> {
    let needed = size_of::<W>();
    let available = buf.len();
    let out = buf
        .get_mut(..needed)
        .ok_or(EncodeError::BufferTooSmall { needed, available })?;
    out.copy_from_slice(wire.as_bytes());
    Ok(needed)
}

/// Splits `N` bytes off the front of `bytes`.
#[inline]
pub(crate) fn take<const N: usize>(bytes: &[u8]) -> Result<(&[u8; N], &[u8]), DecodeError> {
    bytes
        .split_first_chunk::<N>()
        .ok_or(DecodeError::Truncated {
            needed: N,
            available: bytes.len(),
        })
}

/// `Ok` when a reserved field is zero.
#[inline]
pub(crate) fn reserved_zero(field: &'static str, value: u64) -> Result<(), DecodeError> {
    if value == 0 {
        Ok(())
    } else {
        Err(DecodeError::ReservedNotZero { field })
    }
}

/// `Ok` when a reserved run of bytes is all zero.
#[inline]
pub(crate) fn reserved_bytes_zero(field: &'static str, bytes: &[u8]) -> Result<(), DecodeError> {
    if bytes.iter().all(|&b| b == 0) {
        Ok(())
    } else {
        Err(DecodeError::ReservedNotZero { field })
    }
}

/// `Ok` when a magic field holds the format's magic.
#[inline]
pub(crate) fn magic<const N: usize>(
    format: &'static str,
    found: &[u8; N],
    expected: &[u8; N],
) -> Result<(), DecodeError> {
    if found == expected {
        Ok(())
    } else {
        Err(DecodeError::WrongMagic { format })
    }
}

/// `Ok` when a format's version field holds the version this build speaks.
#[inline]
pub(crate) fn version(format: &'static str, found: u32, supported: u32) -> Result<(), DecodeError> {
    if found == supported {
        Ok(())
    } else {
        Err(DecodeError::UnsupportedFormatVersion {
            format,
            found,
            supported,
        })
    }
}

/// `Ok` when `found` bytes are exactly the `expected` ones.
#[inline]
pub(crate) fn check_exact_len(expected: usize, found: usize) -> Result<(), DecodeError> {
    match found.cmp(&expected) {
        core::cmp::Ordering::Less => Err(DecodeError::Truncated {
            needed: expected,
            available: found,
        }),
        core::cmp::Ordering::Greater => Err(DecodeError::TrailingBytes { expected, found }),
        core::cmp::Ordering::Equal => Ok(()),
    }
}

/// `Ok` when nothing of `body` is left after the last field (`rest` is what is left).
#[inline]
pub(crate) fn no_trailing(body: &[u8], rest: &[u8]) -> Result<(), DecodeError> {
    check_exact_len(body.len() - rest.len(), body.len())
}

/// `Ok` when a length field states exactly `expected`.
#[inline]
pub(crate) fn fixed_length(expected: usize, length: usize) -> Result<(), DecodeError> {
    if length == expected {
        Ok(())
    } else {
        Err(DecodeError::LengthMismatch { expected, length })
    }
}

/// `count` as a `u32` count field named `field`.
#[inline]
pub(crate) fn count_u32(field: &'static str, count: usize) -> Result<u32, EncodeError> {
    u32::try_from(count).map_err(|_| EncodeError::TooMany {
        field,
        count,
        max: u32::MAX as usize,
    })
}

/// `count` as a `u16` count or length field named `field`.
#[inline]
pub(crate) fn count_u16(field: &'static str, count: usize) -> Result<u16, EncodeError> {
    u16::try_from(count).map_err(|_| EncodeError::TooMany {
        field,
        count,
        max: u16::MAX.into(),
    })
}

/// The largest of `sizes` (for `const` bounds).
pub(crate) const fn largest(sizes: &[usize]) -> usize {
    let mut largest = 0;
    let mut i = 0;
    while i < sizes.len() {
        if sizes[i] > largest {
            largest = sizes[i];
        }
        i += 1;
    }
    largest
}

/// Copies `src` into `dst`, which has the same length: for up to 64 bytes as two (possibly
/// overlapping) moves of a size known at compile time, without the call to `memcpy` that a copy
/// of a length known only at run time costs. For the payloads of commands and notifications,
/// copied once per message.
///
/// # Panics
/// When the lengths differ, as [`slice::copy_from_slice`].
#[inline(always)]
pub fn copy_short(dst: &mut [u8], src: &[u8]) {
    #[inline(always)]
    fn ends<const N: usize>(dst: &mut [u8], src: &[u8]) {
        let len = src.len();
        dst[..N].copy_from_slice(&src[..N]);
        dst[len - N..].copy_from_slice(&src[len - N..]);
    }
    assert_eq!(dst.len(), src.len(), "copy_short needs equal lengths");
    match src.len() {
        0..=3 => dst.iter_mut().zip(src).for_each(|(d, s)| *d = *s),
        4..=7 => ends::<4>(dst, src),
        8..=15 => ends::<8>(dst, src),
        16..=31 => ends::<16>(dst, src),
        32..=64 => ends::<32>(dst, src),
        _ => dst.copy_from_slice(src),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::little_endian::U32;

    #[test]
    fn copy_short_copies_every_length() {
        let src: [u8; 100] = core::array::from_fn(|i| i as u8 + 1);
        for len in 0..=100 {
            let mut dst = [0u8; 100];
            copy_short(&mut dst[..len], &src[..len]);
            assert_eq!(dst[..len], src[..len], "length {len}");
            assert!(
                dst[len..].iter().all(|&b| b == 0),
                "length {len} wrote past the end"
            );
        }
    }

    #[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
    #[repr(C)]
    struct Two {
        a: U32,
        b: U32,
    }

    #[test]
    fn exact_and_prefix_check_lengths() {
        let bytes = [1, 0, 0, 0, 2, 0, 0, 0, 9];
        assert_eq!(
            exact::<Two>(&bytes).err(),
            Some(DecodeError::TrailingBytes {
                expected: 8,
                found: 9
            })
        );
        assert_eq!(
            exact::<Two>(&bytes[..7]).err(),
            Some(DecodeError::Truncated {
                needed: 8,
                available: 7
            })
        );
        let (two, rest) = prefix::<Two>(&bytes).unwrap();
        assert_eq!((two.a.get(), two.b.get(), rest), (1, 2, &[9][..]));
        assert!(peek::<Two>(&bytes[..7]).is_none());
        assert_eq!(peek::<Two>(&bytes).map(|two| two.b.get()), Some(2));
    }

    #[test]
    fn whole_messages_need_room() {
        let two = Two {
            a: U32::new(1),
            b: U32::new(2),
        };
        let mut buf = [0xa5; 9];
        assert_eq!(put_whole(&mut buf, &two), Ok(8));
        assert_eq!(buf, [1, 0, 0, 0, 2, 0, 0, 0, 0xa5]);
        assert_eq!(
            put_whole(&mut buf[..7], &two),
            Err(EncodeError::BufferTooSmall {
                needed: 8,
                available: 7
            })
        );
    }

    #[test]
    fn lengths_and_counts() {
        assert_eq!(check_exact_len(4, 4), Ok(()));
        assert_eq!(
            check_exact_len(4, 3),
            Err(DecodeError::Truncated {
                needed: 4,
                available: 3
            })
        );
        assert_eq!(
            check_exact_len(4, 5),
            Err(DecodeError::TrailingBytes {
                expected: 4,
                found: 5
            })
        );
        assert_eq!(
            fixed_length(8, 9),
            Err(DecodeError::LengthMismatch {
                expected: 8,
                length: 9
            })
        );
        assert_eq!(count_u16("f", 65535), Ok(65535));
        assert_eq!(
            count_u16("f", 65536),
            Err(EncodeError::TooMany {
                field: "f",
                count: 65536,
                max: 65535
            })
        );
        assert_eq!(largest(&[3, 9, 1]), 9);
        assert_eq!(largest(&[]), 0);
    }

    #[test]
    fn magic_version_and_reserved() {
        assert_eq!(magic("x", b"AB", b"AB"), Ok(()));
        assert_eq!(
            magic("x", b"AC", b"AB"),
            Err(DecodeError::WrongMagic { format: "x" })
        );
        assert_eq!(
            version("x", 1, 2),
            Err(DecodeError::UnsupportedFormatVersion {
                format: "x",
                found: 1,
                supported: 2
            })
        );
        assert_eq!(reserved_bytes_zero("r", &[0, 0]), Ok(()));
        assert_eq!(
            reserved_bytes_zero("r", &[0, 1]),
            Err(DecodeError::ReservedNotZero { field: "r" })
        );
    }
}
