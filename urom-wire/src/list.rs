//! Counted lists inside a message: plugin records, worker ids, environment entries.
//!
//! A [`List`] is either borrowed from received bytes (already validated, decoded lazily while
//! iterating, so parsing needs no allocation) or borrowed from the sender's slice of items.

use core::fmt;

use crate::codec::take;
use crate::{DecodeError, EncodeError};

/// One element of a [`List`]: how it is read from and written to the wire.
pub trait Item<'a>: Copy {
    /// Reads the element at the front of `bytes`; returns it and the bytes after it.
    /// `index` is the element's position, for error messages.
    fn decode(bytes: &'a [u8], index: usize) -> Result<(Self, &'a [u8]), DecodeError>;
    /// How many bytes [`Item::encode`] writes.
    fn encoded_len(&self) -> usize;
    /// Writes the element into `dst`, which is exactly [`Item::encoded_len`] bytes.
    fn encode(&self, dst: &mut [u8], index: usize) -> Result<(), EncodeError>;
}

/// A list of `T` inside a message.
#[derive(Clone, Copy)]
pub enum List<'a, T> {
    /// Received bytes holding `count` elements, each already validated.
    Wire {
        /// How many elements.
        count: usize,
        /// Their encoding, exactly.
        bytes: &'a [u8],
    },
    /// Elements to send.
    Items(&'a [T]),
}

impl<'a, T: Item<'a>> List<'a, T> {
    /// A list to send.
    pub const fn new(items: &'a [T]) -> Self {
        Self::Items(items)
    }

    /// Validates `count` elements at the front of `bytes`; returns the list and what follows.
    pub(crate) fn decode(bytes: &'a [u8], count: usize) -> Result<(Self, &'a [u8]), DecodeError> {
        let mut rest = bytes;
        for index in 0..count {
            rest = T::decode(rest, index)?.1;
        }
        let used = bytes.len() - rest.len();
        Ok((
            Self::Wire {
                count,
                bytes: &bytes[..used],
            },
            rest,
        ))
    }

    /// How many elements.
    pub fn len(&self) -> usize {
        match self {
            Self::Wire { count, .. } => *count,
            Self::Items(items) => items.len(),
        }
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements in order.
    pub fn iter(&self) -> Iter<'a, T> {
        match *self {
            Self::Wire { count, bytes } => Iter::Wire {
                bytes,
                index: 0,
                count,
            },
            Self::Items(items) => Iter::Items(items.iter()),
        }
    }

    /// How many bytes the elements take on the wire.
    pub(crate) fn encoded_len(&self) -> usize {
        match self {
            Self::Wire { bytes, .. } => bytes.len(),
            Self::Items(items) => items.iter().map(Item::encoded_len).sum(),
        }
    }

    /// Writes the elements into `dst`, which is exactly [`List::encoded_len`] bytes.
    pub(crate) fn encode(&self, dst: &mut [u8]) -> Result<(), EncodeError> {
        let mut rest = dst;
        for (index, item) in self.iter().enumerate() {
            let (head, tail) = rest.split_at_mut(item.encoded_len());
            item.encode(head, index)?;
            rest = tail;
        }
        Ok(())
    }
}

impl<'a, T: Item<'a>> From<&'a [T]> for List<'a, T> {
    fn from(items: &'a [T]) -> Self {
        Self::new(items)
    }
}

impl<'a, T: Item<'a> + PartialEq> PartialEq for List<'a, T> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl<'a, T: Item<'a> + Eq> Eq for List<'a, T> {}

impl<'a, T: Item<'a> + fmt::Debug> fmt::Debug for List<'a, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// Iterator over a [`List`].
pub enum Iter<'a, T> {
    /// Decoding received bytes.
    Wire {
        /// What is left to decode.
        bytes: &'a [u8],
        /// Position of the next element.
        index: usize,
        /// How many elements in all.
        count: usize,
    },
    /// Walking the sender's slice.
    Items(core::slice::Iter<'a, T>),
}

impl<'a, T: Item<'a>> Iterator for Iter<'a, T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        match self {
            Self::Wire {
                bytes,
                index,
                count,
            } => {
                if *index == *count {
                    return None;
                }
                // Validated when the list was decoded, so this does not fail.
                let (item, rest) = T::decode(bytes, *index).ok()?;
                *bytes = rest;
                *index += 1;
                Some(item)
            }
            Self::Items(items) => items.next().copied(),
        }
    }
}

/// Worker ids: 8 bytes each, little-endian.
impl<'a> Item<'a> for u64 {
    fn decode(bytes: &'a [u8], _index: usize) -> Result<(Self, &'a [u8]), DecodeError> {
        let (value, rest) = take::<8>(bytes)?;
        Ok((u64::from_le_bytes(*value), rest))
    }

    fn encoded_len(&self) -> usize {
        8
    }

    fn encode(&self, dst: &mut [u8], _index: usize) -> Result<(), EncodeError> {
        dst.copy_from_slice(&self.to_le_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_and_item_lists_compare_equal() {
        let ids = [1u64, 2, u64::MAX];
        let sent = List::new(&ids[..]);
        let mut buf = [0xa5; 24];
        sent.encode(&mut buf).unwrap();
        let (received, rest) = List::<u64>::decode(&buf, 3).unwrap();
        assert!(rest.is_empty());
        assert_eq!(received, sent);
        assert_eq!(received.encoded_len(), 24);
        assert!(received.iter().eq(ids.iter().copied()));
    }

    #[test]
    fn a_short_list_is_truncated() {
        assert_eq!(
            List::<u64>::decode(&[0; 12], 2).unwrap_err(),
            DecodeError::Truncated {
                needed: 8,
                available: 4
            }
        );
        // A huge count over a small buffer stops at the first missing element.
        assert!(List::<u64>::decode(&[0; 16], usize::MAX).is_err());
    }
}
