//! Fixed-size, NUL-padded UTF-8 text fields (names, identities, reasons).
//!
//! A field of `N` bytes holds at most `N - 1` bytes of text followed by at least one NUL, and
//! only NULs after the first one, so a C reader can treat it as a string and a Rust reader gets
//! exactly one valid encoding.

use crate::{DecodeError, EncodeError};

/// Reads a NUL-padded field.
pub(crate) fn decode_padded<'a>(
    field: &'static str,
    bytes: &'a [u8],
) -> Result<&'a str, DecodeError> {
    let end = bytes
        .iter()
        .position(|&b| b == 0)
        .ok_or(DecodeError::TextNotNulPadded { field })?;
    if bytes[end..].iter().any(|&b| b != 0) {
        return Err(DecodeError::TextNotNulPadded { field });
    }
    core::str::from_utf8(&bytes[..end]).map_err(|_| DecodeError::TextNotUtf8 { field })
}

/// Writes `text` into the whole of `dst`, NUL-padded.
pub(crate) fn encode_padded(
    field: &'static str,
    dst: &mut [u8],
    text: &str,
) -> Result<(), EncodeError> {
    let max = dst.len().saturating_sub(1);
    if text.len() > max {
        return Err(EncodeError::TextTooLong {
            field,
            length: text.len(),
            max,
        });
    }
    if text.bytes().any(|b| b == 0) {
        return Err(EncodeError::TextHasNul { field });
    }
    let (head, tail) = dst.split_at_mut(text.len());
    head.copy_from_slice(text.as_bytes());
    tail.fill(0);
    Ok(())
}

/// The longest prefix of `text` that is at most `max` bytes and ends on a character boundary.
///
/// For texts of run-time length (error reasons) that must fit a fixed-size field.
pub fn truncate_at_char_boundary(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_accepts_padded_text_and_rejects_the_rest() {
        assert_eq!(decode_padded("f", b"abc\0\0\0"), Ok("abc"));
        assert_eq!(decode_padded("f", b"\0\0"), Ok(""));
        assert_eq!(
            decode_padded("f", b"abcd"),
            Err(DecodeError::TextNotNulPadded { field: "f" })
        );
        assert_eq!(
            decode_padded("f", b"ab\0c"),
            Err(DecodeError::TextNotNulPadded { field: "f" })
        );
        assert_eq!(
            decode_padded("f", b"\xff\xfe\0\0"),
            Err(DecodeError::TextNotUtf8 { field: "f" })
        );
    }

    #[test]
    fn encode_pads_and_checks() {
        let mut buf = [0xa5; 6];
        encode_padded("f", &mut buf, "abc").unwrap();
        assert_eq!(&buf, b"abc\0\0\0");
        assert_eq!(
            encode_padded("f", &mut buf, "abcdef"),
            Err(EncodeError::TextTooLong {
                field: "f",
                length: 6,
                max: 5
            })
        );
        assert_eq!(
            encode_padded("f", &mut buf, "a\0b"),
            Err(EncodeError::TextHasNul { field: "f" })
        );
    }

    #[test]
    fn truncation_keeps_whole_characters() {
        assert_eq!(truncate_at_char_boundary("héllo", 2), "h");
        assert_eq!(truncate_at_char_boundary("héllo", 3), "hé");
        assert_eq!(truncate_at_char_boundary("abc", 10), "abc");
    }
}
