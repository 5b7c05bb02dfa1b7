//! The sizes that bound every urom frame: the header, the largest fixed-size body, and the
//! run-time bound on a whole frame.
//!
//! This module sits below the message families: [`crate::frame`] pins its header to
//! [`FRAME_HEADER_LEN`], and [`crate::control`] and [`crate::data`] assert at compile time that
//! the fixed part of each of their bodies fits [`LARGEST_FIXED_BODY`].

use core::fmt;

/// Bytes of the header every urom frame starts with (`frame::FrameHeader` is pinned to it).
pub(crate) const FRAME_HEADER_LEN: usize = 24;

/// The largest fixed part of any frame body (a spawn request: 160 bytes). [`MaxMsgSize::MIN`] is
/// built from it, so that every message kind can be sent with an empty list or payload; each
/// message family asserts that its bodies' fixed parts fit.
pub(crate) const LARGEST_FIXED_BODY: usize = 160;

/// The largest frame, header included, that a connection carries.
///
/// Chosen at run time (the daemon's `-m`, the host's service setting) and checked by every
/// decoder and encoder. The smallest legal value fits the largest fixed-size message, so every
/// message kind can be sent with an empty list or payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MaxMsgSize(u32);

impl MaxMsgSize {
    /// The default, as in the DOCA UROM service: 4096 bytes.
    pub const DEFAULT: Self = Self(4096);
    /// The smallest legal value: a frame header plus the largest fixed-size body.
    pub const MIN: u32 = (FRAME_HEADER_LEN + LARGEST_FIXED_BODY) as u32;
    /// The largest legal value: 16 MiB.
    pub const MAX: u32 = 16 << 20;

    /// Checks that `bytes` lies in `MIN..=MAX`.
    pub const fn new(bytes: u32) -> Result<Self, MaxMsgSizeError> {
        if bytes < Self::MIN || bytes > Self::MAX {
            Err(MaxMsgSizeError { requested: bytes })
        } else {
            Ok(Self(bytes))
        }
    }

    /// The bound in bytes.
    pub const fn get(self) -> usize {
        self.0 as usize
    }

    /// The bound as the `u32` the hello message carries.
    pub const fn as_u32(self) -> u32 {
        self.0
    }
}

impl Default for MaxMsgSize {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl fmt::Display for MaxMsgSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} bytes", self.0)
    }
}

/// A maximum message size outside the legal range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxMsgSizeError {
    /// The value asked for.
    pub requested: u32,
}

impl fmt::Display for MaxMsgSizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "maximum message size {} is out of range: it must be between {} and {} bytes",
            self.requested,
            MaxMsgSize::MIN,
            MaxMsgSize::MAX
        )
    }
}

impl core::error::Error for MaxMsgSizeError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_enforced() {
        assert_eq!(MaxMsgSize::default().get(), 4096);
        assert!(MaxMsgSize::new(MaxMsgSize::MIN).is_ok());
        assert!(MaxMsgSize::new(MaxMsgSize::MAX).is_ok());
        assert_eq!(
            MaxMsgSize::new(MaxMsgSize::MIN - 1),
            Err(MaxMsgSizeError {
                requested: MaxMsgSize::MIN - 1
            })
        );
        assert!(MaxMsgSize::new(MaxMsgSize::MAX + 1).is_err());
        assert!(MaxMsgSize::new(0).is_err());
    }

    #[test]
    fn min_message_size_fits_the_largest_fixed_body() {
        assert_eq!(LARGEST_FIXED_BODY, 160);
        assert_eq!(MaxMsgSize::MIN, 184);
    }
}
