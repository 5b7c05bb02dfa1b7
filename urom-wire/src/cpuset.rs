//! A set of CPUs, as DOCA's `doca_cpu_set_t`: 1024 bits.
//!
//! On the wire it is 128 bytes; CPU `n` is bit `n % 8` of byte `n / 8`. As text it is the
//! Linux list format used by `taskset -c` and `/sys/devices/system/cpu/online`: `0-3,8,10-11`.

use core::{fmt, str::FromStr};

/// How many CPUs a set can name.
pub const CPUSET_BITS: usize = 1024;
/// The size of a set on the wire.
pub const CPUSET_BYTES: usize = CPUSET_BITS / 8;

const WORDS: usize = CPUSET_BITS / 64;

/// A set of CPU numbers below [`CPUSET_BITS`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CpuSet {
    words: [u64; WORDS],
}

impl CpuSet {
    /// The empty set.
    pub const fn new() -> Self {
        Self { words: [0; WORDS] }
    }

    /// Adds `cpu`; an error when it is not below [`CPUSET_BITS`].
    pub fn insert(&mut self, cpu: usize) -> Result<(), CpuSetError> {
        if cpu >= CPUSET_BITS {
            return Err(CpuSetError::OutOfRange { cpu });
        }
        self.words[cpu / 64] |= 1 << (cpu % 64);
        Ok(())
    }

    /// Removes `cpu` (nothing happens when it is not in the set).
    pub fn remove(&mut self, cpu: usize) {
        if cpu < CPUSET_BITS {
            self.words[cpu / 64] &= !(1 << (cpu % 64));
        }
    }

    /// Whether `cpu` is in the set.
    pub fn contains(&self, cpu: usize) -> bool {
        cpu < CPUSET_BITS && self.words[cpu / 64] & (1 << (cpu % 64)) != 0
    }

    /// How many CPUs the set holds.
    pub fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|&w| w == 0)
    }

    /// Whether every CPU of `self` is also in `other`.
    pub fn is_subset(&self, other: &Self) -> bool {
        self.words
            .iter()
            .zip(other.words.iter())
            .all(|(mine, theirs)| mine & !theirs == 0)
    }

    /// The CPUs in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        (0..CPUSET_BITS).filter(|&cpu| self.contains(cpu))
    }

    /// The wire form.
    pub fn to_bytes(&self) -> [u8; CPUSET_BYTES] {
        let mut bytes = [0; CPUSET_BYTES];
        for (chunk, word) in bytes.chunks_exact_mut(8).zip(self.words.iter()) {
            chunk.copy_from_slice(&word.to_le_bytes());
        }
        bytes
    }

    /// Reads the wire form; every bit pattern is a valid set.
    pub fn from_bytes(bytes: &[u8; CPUSET_BYTES]) -> Self {
        let mut words = [0; WORDS];
        for (word, chunk) in words.iter_mut().zip(bytes.chunks_exact(8)) {
            let mut le = [0; 8];
            le.copy_from_slice(chunk);
            *word = u64::from_le_bytes(le);
        }
        Self { words }
    }
}

impl FromIterator<usize> for CpuSet {
    /// Collects CPU numbers; numbers not below [`CPUSET_BITS`] are left out.
    fn from_iter<I: IntoIterator<Item = usize>>(cpus: I) -> Self {
        let mut set = Self::new();
        for cpu in cpus {
            // Out-of-range numbers cannot be represented; the set documents this.
            let _ = set.insert(cpu);
        }
        set
    }
}

/// Why a CPU number or list was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuSetError {
    /// A CPU number not below [`CPUSET_BITS`].
    OutOfRange {
        /// The number.
        cpu: usize,
    },
    /// The text is not a list like `0-3,8`: an empty item, a non-number, or a range whose end
    /// is below its start.
    BadList,
}

impl fmt::Display for CpuSetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::OutOfRange { cpu } => {
                write!(
                    f,
                    "CPU {cpu} is out of range (CPUs are numbered 0 to {})",
                    CPUSET_BITS - 1
                )
            }
            Self::BadList => f.write_str(
                "not a CPU list: expected numbers and ranges separated by commas, like 0-3,8",
            ),
        }
    }
}

impl core::error::Error for CpuSetError {}

impl FromStr for CpuSet {
    type Err = CpuSetError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut set = Self::new();
        let text = text.trim();
        if text.is_empty() {
            return Ok(set);
        }
        for item in text.split(',') {
            let item = item.trim();
            let (first, last) = match item.split_once('-') {
                Some((first, last)) => (parse_cpu(first)?, parse_cpu(last)?),
                None => {
                    let cpu = parse_cpu(item)?;
                    (cpu, cpu)
                }
            };
            if last < first {
                return Err(CpuSetError::BadList);
            }
            for cpu in first..=last {
                set.insert(cpu)?;
            }
        }
        Ok(set)
    }
}

fn parse_cpu(text: &str) -> Result<usize, CpuSetError> {
    let text = text.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(CpuSetError::BadList);
    }
    match text.parse() {
        Ok(cpu) if cpu < CPUSET_BITS => Ok(cpu),
        Ok(cpu) => Err(CpuSetError::OutOfRange { cpu }),
        Err(_) => Err(CpuSetError::OutOfRange { cpu: usize::MAX }),
    }
}

impl fmt::Display for CpuSet {
    /// The list format: `0-3,8`; the empty set prints nothing.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut cpus = self.iter().peekable();
        let mut first_item = true;
        while let Some(start) = cpus.next() {
            let mut end = start;
            while cpus.peek() == Some(&(end + 1)) {
                end += 1;
                cpus.next();
            }
            if !first_item {
                f.write_str(",")?;
            }
            first_item = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CpuSet({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::string::ToString;

    #[test]
    fn list_format_round_trips() {
        let set: CpuSet = "0-3, 8,10-11,1023".parse().unwrap();
        assert_eq!(set.len(), 8);
        assert!(set.contains(1023) && set.contains(2) && !set.contains(4));
        assert_eq!(set.to_string(), "0-3,8,10-11,1023");
        assert_eq!("".parse::<CpuSet>().unwrap(), CpuSet::new());
    }

    #[test]
    fn bad_lists_are_refused() {
        assert_eq!(
            "1024".parse::<CpuSet>(),
            Err(CpuSetError::OutOfRange { cpu: 1024 })
        );
        assert_eq!(
            "0-2000".parse::<CpuSet>(),
            Err(CpuSetError::OutOfRange { cpu: 2000 })
        );
        for bad in ["a", "1,,2", "3-1", "-1", "1-", "99999999999999999999999"] {
            assert!(bad.parse::<CpuSet>().is_err(), "{bad}");
        }
    }

    #[test]
    fn wire_form_is_little_endian_bits() {
        let set: CpuSet = [0, 9, 64, 1023].into_iter().collect();
        let bytes = set.to_bytes();
        assert_eq!(bytes[0], 0b1);
        assert_eq!(bytes[1], 0b10);
        assert_eq!(bytes[8], 0b1);
        assert_eq!(bytes[127], 0x80);
        assert_eq!(CpuSet::from_bytes(&bytes), set);
    }

    #[test]
    fn subset_and_insert_bounds() {
        let small: CpuSet = "1-2".parse().unwrap();
        let big: CpuSet = "0-3".parse().unwrap();
        assert!(small.is_subset(&big) && !big.is_subset(&small));
        let mut set = CpuSet::new();
        assert_eq!(set.insert(1024), Err(CpuSetError::OutOfRange { cpu: 1024 }));
        set.insert(5).unwrap();
        set.remove(5);
        assert!(set.is_empty());
    }
}
