//! The layout of a connection's mapping, and the header that describes it.
//!
//! Offset table (bytes from the start of the mapping; `S` = slot stride, `N` = slot count):
//!
//! | offset                | size     | what                                                 |
//! |-----------------------|----------|------------------------------------------------------|
//! | `0`                   | 128      | header (below), written by the creator before sharing |
//! | `128`                 | 256      | control block of ring 0 (creator -> acceptor)         |
//! | `384`                 | 256      | control block of ring 1 (acceptor -> creator)         |
//! | `640`                 | `N * S`  | slots of ring 0                                       |
//! | `640 + N * S`         | `N * S`  | slots of ring 1                                       |
//! | `640 + 2 * N * S`     |          | end (the file is rounded up to its page size)         |
//!
//! `S = round_up(slot_size + 8, 128)`; control blocks and slots are laid out by `shm::ring`.
//!
//! The header's byte format is `urom_wire::shm::MappingHeader`; this module decides what its
//! fields must say.
//!
//! The acceptor reads the header into its own memory, checks every field against the values it
//! recomputes from `slot_size` and `slot_count`, and never reads it from the mapping again.

use core::fmt;

use urom_wire::shm::{MAPPING_HEADER_LEN, MAPPING_VERSION, MappingHeaderRepr};
use urom_wire::{DecodeError, MaxMsgSize};

use super::ring::{CACHE_LINE, SLOT_RESERVE};

/// Bytes of the header.
pub(crate) const HEADER_LEN: usize = MAPPING_HEADER_LEN;
/// Bytes of one ring control block.
pub(crate) const CTL_LEN: usize = 2 * CACHE_LINE;
/// Fewest slots per ring.
pub const MIN_SLOTS: u32 = 2;
/// Most slots per ring.
pub const MAX_SLOTS: u32 = 1 << 16;
/// Largest mapping an acceptor agrees to map.
pub const MAX_MAPPING_LEN: u64 = 1 << 31;

/// Where everything sits in one connection's mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    pub(crate) slot_size: u32,
    pub(crate) slot_count: u32,
    pub(crate) stride: usize,
    pub(crate) ctl: [usize; 2],
    pub(crate) slots: [usize; 2],
    pub(crate) total: usize,
}

/// The mapping offered by the peer is not a usable urom connection mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShmLayoutError {
    /// The header does not start with the urom magic number.
    Magic,
    /// The header has a layout version this build does not speak.
    Version {
        /// The version found.
        found: u32,
    },
    /// The slot size is outside the range of maximum message sizes.
    SlotSize {
        /// The slot size found.
        found: u32,
    },
    /// The slot count is not a power of two between [`MIN_SLOTS`] and [`MAX_SLOTS`].
    SlotCount {
        /// The slot count found.
        found: u32,
    },
    /// A field of the header disagrees with the layout its sizes imply.
    Field {
        /// The field's name.
        name: &'static str,
    },
    /// The mapping would exceed [`MAX_MAPPING_LEN`].
    TooLarge {
        /// Bytes the layout needs.
        needed: u64,
    },
    /// The shared file is shorter than the layout.
    Truncated {
        /// Bytes in the file.
        file_len: u64,
        /// Bytes the layout needs.
        needed: u64,
    },
    /// The shared file is not sealed against shrinking and growing, so it could be cut short
    /// under us.
    NotSealed,
    /// The descriptor is not a regular (memfd) file.
    NotAFile,
}

impl fmt::Display for ShmLayoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShmLayoutError::Magic => {
                f.write_str("not a urom shared-memory mapping (bad magic number)")
            }
            ShmLayoutError::Version { found } => write!(
                f,
                "shared-memory layout version {found} is not supported (this build speaks {MAPPING_VERSION})"
            ),
            ShmLayoutError::SlotSize { found } => write!(
                f,
                "slot size of {found} bytes is outside {}..={} bytes",
                MaxMsgSize::MIN,
                MaxMsgSize::MAX
            ),
            ShmLayoutError::SlotCount { found } => write!(
                f,
                "slot count {found} is not a power of two between {MIN_SLOTS} and {MAX_SLOTS}"
            ),
            ShmLayoutError::Field { name } => {
                write!(
                    f,
                    "header field `{name}` disagrees with the slot size and count"
                )
            }
            ShmLayoutError::TooLarge { needed } => write!(
                f,
                "mapping of {needed} bytes exceeds the limit of {MAX_MAPPING_LEN} bytes"
            ),
            ShmLayoutError::Truncated { file_len, needed } => write!(
                f,
                "shared file holds {file_len} bytes but the layout needs {needed}"
            ),
            ShmLayoutError::NotSealed => f.write_str(
                "shared file is not sealed against resizing (F_SEAL_SHRINK | F_SEAL_GROW)",
            ),
            ShmLayoutError::NotAFile => f.write_str("shared descriptor is not a regular file"),
        }
    }
}

impl core::error::Error for ShmLayoutError {}

impl Layout {
    /// The layout for `slot_count` slots of `max` bytes per direction.
    pub(crate) fn new(max: MaxMsgSize, slot_count: u32) -> Result<Self, ShmLayoutError> {
        if !slot_count.is_power_of_two() || !(MIN_SLOTS..=MAX_SLOTS).contains(&slot_count) {
            return Err(ShmLayoutError::SlotCount { found: slot_count });
        }
        let stride = (SLOT_RESERVE + max.get()).next_multiple_of(CACHE_LINE);
        let ring_bytes = slot_count as usize * stride;
        let ctl0 = HEADER_LEN;
        let ctl1 = ctl0 + CTL_LEN;
        let slots0 = ctl1 + CTL_LEN;
        let slots1 = slots0 + ring_bytes;
        let total = slots1 + ring_bytes;
        if total as u64 > MAX_MAPPING_LEN {
            return Err(ShmLayoutError::TooLarge {
                needed: total as u64,
            });
        }
        Ok(Self {
            slot_size: max.as_u32(),
            slot_count,
            stride,
            ctl: [ctl0, ctl1],
            slots: [slots0, slots1],
            total,
        })
    }

    /// The header describing this layout.
    pub(crate) fn encode(&self) -> [u8; HEADER_LEN] {
        MappingHeaderRepr {
            slot_size: self.slot_size,
            slot_count: self.slot_count,
            stride: self.stride as u32,
            ctl: self.ctl.map(|offset| offset as u32),
            slots: self.slots.map(|offset| offset as u64),
            total: self.total as u64,
        }
        .to_bytes()
    }

    /// Checks a header read from a peer's file of `file_len` bytes.
    pub(crate) fn decode(h: &[u8; HEADER_LEN], file_len: u64) -> Result<Self, ShmLayoutError> {
        let header = MappingHeaderRepr::parse(h).map_err(|e| match e {
            DecodeError::WrongMagic { .. } => ShmLayoutError::Magic,
            DecodeError::UnsupportedFormatVersion { found, .. } => {
                ShmLayoutError::Version { found }
            }
            DecodeError::LengthMismatch { .. } => ShmLayoutError::Field { name: "header_len" },
            _ => ShmLayoutError::Field { name: "reserved" },
        })?;
        let max = MaxMsgSize::new(header.slot_size).map_err(|_| ShmLayoutError::SlotSize {
            found: header.slot_size,
        })?;
        let layout = Self::new(max, header.slot_count)?;
        let fields: [(&'static str, u64, u64); 6] = [
            ("slot_stride", header.stride.into(), layout.stride as u64),
            ("ctl_offset[0]", header.ctl[0].into(), layout.ctl[0] as u64),
            ("ctl_offset[1]", header.ctl[1].into(), layout.ctl[1] as u64),
            ("slots_offset[0]", header.slots[0], layout.slots[0] as u64),
            ("slots_offset[1]", header.slots[1], layout.slots[1] as u64),
            ("total_len", header.total, layout.total as u64),
        ];
        if let Some(&(name, _, _)) = fields.iter().find(|(_, found, want)| found != want) {
            return Err(ShmLayoutError::Field { name });
        }
        if file_len < layout.total as u64 {
            return Err(ShmLayoutError::Truncated {
                file_len,
                needed: layout.total as u64,
            });
        }
        if file_len > MAX_MAPPING_LEN {
            return Err(ShmLayoutError::TooLarge { needed: file_len });
        }
        Ok(layout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout::new(MaxMsgSize::DEFAULT, 64).unwrap()
    }

    #[test]
    fn offsets_follow_the_table() {
        let l = layout();
        assert_eq!(l.stride, 4224);
        assert_eq!(l.ctl, [128, 384]);
        assert_eq!(l.slots, [640, 640 + 64 * 4224]);
        assert_eq!(l.total, 640 + 2 * 64 * 4224);
        assert!(l.slots.iter().all(|s| s % CACHE_LINE == 0));
    }

    #[test]
    fn header_round_trips() {
        let l = layout();
        assert_eq!(Layout::decode(&l.encode(), l.total as u64), Ok(l));
    }

    #[test]
    fn every_bad_header_is_refused() {
        let l = layout();
        let good = l.encode();
        let total = l.total as u64;
        let with = |at: usize, bytes: &[u8]| {
            let mut h = good;
            h[at..at + bytes.len()].copy_from_slice(bytes);
            Layout::decode(&h, total)
        };
        assert_eq!(with(0, b"X"), Err(ShmLayoutError::Magic));
        assert_eq!(with(8, &[1]), Err(ShmLayoutError::Version { found: 1 }));
        assert_eq!(
            with(16, &[0, 0, 0, 0]),
            Err(ShmLayoutError::SlotSize { found: 0 })
        );
        assert_eq!(
            with(20, &[3, 0, 0, 0]),
            Err(ShmLayoutError::SlotCount { found: 3 })
        );
        assert_eq!(
            with(20, &[0, 0, 0, 1]),
            Err(ShmLayoutError::SlotCount { found: 1 << 24 })
        );
        assert_eq!(
            with(24, &[0, 1]),
            Err(ShmLayoutError::Field {
                name: "slot_stride"
            })
        );
        assert_eq!(
            with(56, &[0]),
            Err(ShmLayoutError::Field { name: "total_len" })
        );
        assert_eq!(
            Layout::decode(&good, total - 1),
            Err(ShmLayoutError::Truncated {
                file_len: total - 1,
                needed: total
            })
        );
        // 16 MiB slots x 65536 would be far beyond the limit.
        let huge = Layout::new(MaxMsgSize::new(MaxMsgSize::MAX).unwrap(), MAX_SLOTS);
        assert!(matches!(huge, Err(ShmLayoutError::TooLarge { .. })));
    }
}
