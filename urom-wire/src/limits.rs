//! The run-time bound on every urom frame.

use core::fmt;

use crate::frame::FRAME_HEADER_LEN;

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
    pub const MIN: u32 = (FRAME_HEADER_LEN + crate::control::LARGEST_FIXED_BODY) as u32;
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
}
