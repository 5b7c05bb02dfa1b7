//! Plugin ids: the rule the daemon, the worker and the host share.
//!
//! A plugin id is a single bit, `1 << index`, with an index below [`MAX_PLUGINS`]; a set of
//! plugins is therefore a mask, [`PluginMask`]. The daemon gives the plugins it discovers the
//! indexes 0, 1, 2, ... in a stable order ([`PluginId::from_index`]); the worker keeps its
//! plugins in a table indexed by [`PluginId::index`]; commands and notifications carry the id
//! as a `u64` ([`PluginId::new`] checks one).

use core::fmt;

/// The most plugins a service offers and a worker runs: ids are bits 0 to 61 of a mask.
pub const MAX_PLUGINS: usize = 62;

/// A plugin id: a single bit, `1 << index`, index below [`MAX_PLUGINS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PluginId(
    // INVARIANTS: exactly one bit set, below `1 << MAX_PLUGINS`.
    u64,
);

impl PluginId {
    /// The id of table index `index`; `None` from [`MAX_PLUGINS`] on.
    pub const fn from_index(index: usize) -> Option<Self> {
        if index < MAX_PLUGINS {
            Some(Self(1 << index))
        } else {
            None
        }
    }

    /// Checks that `raw` is a plugin id: a single bit below `1 << MAX_PLUGINS`.
    pub const fn new(raw: u64) -> Result<Self, PluginIdError> {
        if raw.count_ones() == 1 && (raw.trailing_zeros() as usize) < MAX_PLUGINS {
            Ok(Self(raw))
        } else {
            Err(PluginIdError { raw })
        }
    }

    /// The id as it travels in commands, notifications and plugin lists.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The index of the bit: where a table of [`MAX_PLUGINS`] entries keeps this plugin.
    pub const fn index(self) -> usize {
        self.0.trailing_zeros() as usize
    }
}

impl fmt::Display for PluginId {
    /// Hexadecimal, as the daemon and worker print ids: `0x4`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

impl From<PluginId> for u64 {
    fn from(id: PluginId) -> Self {
        id.0
    }
}

/// A value that is not a plugin id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PluginIdError {
    /// The value given.
    pub raw: u64,
}

impl fmt::Display for PluginIdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "plugin id {:#x} must be a single bit below 1 << {MAX_PLUGINS}",
            self.raw
        )
    }
}

impl core::error::Error for PluginIdError {}

bitflags::bitflags! {
    /// A set of plugins: an OR of [`PluginId`]s, as a host asks for them and a worker runs
    /// them.
    ///
    /// Which ids name a plugin is known only at run time (the daemon hands them out), so every
    /// bit below `1 << MAX_PLUGINS` is a flag; [`PluginMask::from_bits_retain`] keeps a
    /// host's bits above them too, so that they can be refused by name
    /// ([`PluginMask::stray_bits`]).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    pub struct PluginMask: u64 {
        const _ = (1 << MAX_PLUGINS) - 1;
    }
}

impl PluginMask {
    /// The plugin ids in the mask, lowest first; bits that are no plugin id are left out.
    pub fn ids(self) -> impl Iterator<Item = PluginId> {
        let mut rest = self.bits() & Self::all().bits();
        core::iter::from_fn(move || {
            let lowest = rest & rest.wrapping_neg();
            rest &= !lowest;
            PluginId::new(lowest).ok()
        })
    }

    /// Whether `id` is in the mask.
    pub const fn has(self, id: PluginId) -> bool {
        self.bits() & id.get() != 0
    }

    /// The bits of the mask that are no plugin id (bits 62 and 63); 0 for a mask made of ids.
    pub const fn stray_bits(self) -> u64 {
        self.bits() & !Self::all().bits()
    }
}

impl From<PluginId> for PluginMask {
    fn from(id: PluginId) -> Self {
        Self::from_bits_retain(id.get())
    }
}

impl FromIterator<PluginId> for PluginMask {
    fn from_iter<I: IntoIterator<Item = PluginId>>(ids: I) -> Self {
        ids.into_iter()
            .fold(Self::empty(), |mask, id| mask | id.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_single_bits_below_the_limit() {
        assert_eq!(PluginId::new(1).map(PluginId::index), Ok(0));
        assert_eq!(PluginId::new(1 << 61).map(PluginId::index), Ok(61));
        for raw in [0, 3, 1 << 62, 1 << 63, u64::MAX] {
            assert_eq!(PluginId::new(raw), Err(PluginIdError { raw }));
        }
        assert_eq!(
            PluginIdError { raw: 3 }.to_string(),
            "plugin id 0x3 must be a single bit below 1 << 62"
        );
        assert_eq!(PluginId::new(16).unwrap().to_string(), "0x10");
    }

    #[test]
    fn indexes_and_ids_convert_both_ways() {
        for index in 0..MAX_PLUGINS {
            let id = PluginId::from_index(index).unwrap();
            assert_eq!(id.index(), index);
            assert_eq!(PluginId::new(id.get()), Ok(id));
        }
        assert_eq!(PluginId::from_index(MAX_PLUGINS), None);
    }

    #[test]
    fn masks_list_their_ids_and_keep_stray_bits_apart() {
        let mask = PluginMask::from_bits_retain(0b1010 | 1 << 61 | 1 << 63);
        let ids: Vec<u64> = mask.ids().map(PluginId::get).collect();
        assert_eq!(ids, [0b10, 0b1000, 1 << 61]);
        assert_eq!(mask.stray_bits(), 1 << 63);
        assert_eq!(PluginMask::from_bits(mask.bits()), None);
        assert!(mask.has(PluginId::new(2).unwrap()));
        assert!(!mask.has(PluginId::new(4).unwrap()));
        let rebuilt: PluginMask = mask.ids().collect();
        assert_eq!(rebuilt.bits(), 0b1010 | 1 << 61);
        assert!(mask.contains(rebuilt));
        assert!(!rebuilt.contains(mask));
        assert_eq!(PluginMask::empty().ids().count(), 0);
        assert_eq!(PluginMask::all().ids().count(), MAX_PLUGINS);
        assert_eq!(format!("{:#x}", PluginMask::from_bits_retain(6)), "0x6");
    }
}
