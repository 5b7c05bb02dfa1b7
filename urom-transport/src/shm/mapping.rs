//! The shared file and its mapping.
//!
//! The creator makes a memfd of fixed size, on hugepages when the system has some reserved
//! and the rings fill at least one (`MFD_HUGETLB`; with none free, mapping fails at once with
//! `ENOMEM` and we fall back), otherwise on normal pages (with `MADV_HUGEPAGE` when the
//! mapping spans a hugepage); it seals the size (`F_SEAL_SHRINK | F_SEAL_GROW |
//! F_SEAL_SEAL`) so that no one can cut the file short under a mapping (which would turn a later
//! access into `SIGBUS`). The acceptor checks the seals and the size before it maps anything.
//!
//! Neither side prefaults the mapping: a page of normal memory is given to it when first
//! touched, so a ring whose slots are not all used holds only the pages its frames reached (a
//! host with hundreds of mostly idle workers holds little), at the cost of one page fault per
//! page the first time round.

use core::ptr::NonNull;
use std::os::fd::{AsFd, OwnedFd};

use memmap2::{Advice, MmapOptions, MmapRaw};
use nix::errno::Errno;
use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};
use nix::sys::stat::{SFlag, fstat};

use super::layout::{HEADER_LEN, Layout, ShmLayoutError};
use super::ring::{RingCtl, RingMem};

/// Size of a hugepage on x86-64 and aarch64 with 4 KiB base pages.
const HUGEPAGE: usize = 2 << 20;
/// Size of a base page.
const PAGE: usize = 4096;
/// The seals the creator sets and the acceptor requires.
const SEALS: SealFlag = SealFlag::F_SEAL_SHRINK.union(SealFlag::F_SEAL_GROW);

/// Whether a mapping may, must or must not use hugepages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HugePages {
    /// Use hugepages when the system has some free and the rings fill at least one (smaller
    /// rings would hold a whole one each), normal pages otherwise.
    #[default]
    Auto,
    /// Use normal pages.
    Never,
    /// Fail when no hugepages are available.
    Require,
}

/// A failed system call while setting up a mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SysError {
    pub(crate) op: &'static str,
    pub(crate) errno: Errno,
}

fn sys<T>(op: &'static str, r: nix::Result<T>) -> Result<T, SysError> {
    r.map_err(|errno| SysError { op, errno })
}

/// A shared mapping, unmapped on drop.
pub(crate) struct Mapping {
    // INVARIANTS: a live `MAP_SHARED` read-write mapping of a file sealed against shrinking and
    // at least as long as the mapping; this value owns it.
    map: MmapRaw,
    huge: bool,
}

impl Mapping {
    /// Maps `len` bytes of `fd` read-write and shared (not prefaulted).
    ///
    /// `fd` must be a regular file of at least `len` bytes that cannot shrink (sealed with
    /// `F_SEAL_SHRINK`), so that no access inside the mapping can fault; the mapping is only
    /// accessed as described in `layout` (ring control blocks through atomics, slots through
    /// `shm::ring`).
    fn map(fd: &OwnedFd, len: usize, huge: bool) -> Result<Self, SysError> {
        if len == 0 {
            return Err(SysError {
                op: "mmap",
                errno: Errno::EINVAL,
            });
        }
        // A memfd made with `MFD_HUGETLB` lives on hugetlbfs: its mapping uses hugepages
        // without `MAP_HUGETLB` and fails at once with `ENOMEM` when none are free.
        let map = MmapOptions::new()
            .len(len)
            .map_raw(fd)
            .map_err(|e| SysError {
                op: "mmap",
                errno: Errno::from_raw(e.raw_os_error().unwrap_or(0)),
            })?;
        Ok(Self { map, huge })
    }

    /// Whether the mapping sits on hugepages.
    pub(crate) fn huge(&self) -> bool {
        self.huge
    }

    /// The two rings of `layout`, in mapping order (ring 0 = creator to acceptor).
    ///
    /// `layout` must have been checked against this mapping's file (by `create` or `open`).
    pub(crate) fn rings(&self, layout: &Layout) -> [RingMem; 2] {
        assert!(
            layout.total <= self.map.len(),
            "layout larger than its mapping"
        );
        [0, 1].map(|ring| {
            let at = |offset: usize| self.map.as_mut_ptr().wrapping_add(offset);
            let ctl = NonNull::new(at(layout.ctl[ring]).cast::<RingCtl>());
            let slots = NonNull::new(at(layout.slots[ring]));
            let (Some(ctl), Some(slots)) = (ctl, slots) else {
                unreachable!("an offset into a mapping is not null")
            };
            // SAFETY: the offsets come from `Layout` (see its offset table), which keeps the
            // control block (256 bytes, 128-aligned) and `slot_count * stride` slot bytes
            // (128-aligned, `stride >= 8 + slot_size`) inside `layout.total <= self.map.len()` bytes
            // of the live mapping; a zeroed control block is a valid initial `RingCtl`; each
            // half of the connection that uses a returned ring holds the mapping alive (an
            // `Arc` of its link) for as long as it has the ring; the
            // peer process is bound by the same ring protocol (and cannot break memory safety
            // here if it is not: every value it writes is checked by `shm::ring`).
            unsafe {
                RingMem::from_raw(
                    ctl,
                    slots,
                    layout.slot_count,
                    layout.stride,
                    layout.slot_size as usize,
                )
            }
        })
    }

    /// Writes the header (creator only, before the mapping is shared).
    fn write_header(&mut self, header: &[u8; HEADER_LEN]) {
        assert!(self.map.len() >= HEADER_LEN);
        // SAFETY: the first `HEADER_LEN <= len` bytes are inside the mapping; nobody else has
        // the file yet, and `&mut self` excludes every other access in this process.
        unsafe {
            core::ptr::copy_nonoverlapping(header.as_ptr(), self.map.as_mut_ptr(), HEADER_LEN)
        };
    }
}

/// Creates, sizes, seals, maps and initialises a new shared file for `layout`.
pub(crate) fn create(layout: &Layout, huge: HugePages) -> Result<(OwnedFd, Mapping), SysError> {
    // Rings smaller than a hugepage would hold a whole one each (hugetlbfs pages are taken
    // whole): `auto` leaves them on normal pages, touched only as used.
    let worth_it = layout.total >= HUGEPAGE;
    if huge == HugePages::Require || (huge == HugePages::Auto && worth_it) {
        match create_with(layout, true) {
            Ok(made) => return Ok(made),
            Err(e) if huge == HugePages::Require => return Err(e),
            Err(_) => {}
        }
    }
    create_with(layout, false)
}

fn create_with(layout: &Layout, huge: bool) -> Result<(OwnedFd, Mapping), SysError> {
    let mut flags = MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING;
    if huge {
        flags |= MFdFlags::MFD_HUGETLB;
    }
    let fd = sys("memfd_create", memfd_create(c"urom-shm", flags))?;
    let len = layout
        .total
        .next_multiple_of(if huge { HUGEPAGE } else { PAGE });
    sys("ftruncate", nix::unistd::ftruncate(&fd, len as i64))?;
    sys(
        "fcntl(F_ADD_SEALS)",
        fcntl(&fd, FcntlArg::F_ADD_SEALS(SEALS | SealFlag::F_SEAL_SEAL)),
    )?;
    // `fd` is the memfd we just made, `len` bytes long and sealed against shrinking.
    let mut mapping = Mapping::map(&fd, len, huge)?;
    mapping.write_header(&layout.encode());
    if !huge && len >= HUGEPAGE {
        // Transparent hugepages for shared memory when the system allows it; harmless if not.
        // Not for a smaller mapping, whose first touch would otherwise take a whole hugepage.
        let _ = mapping.map.advise(Advice::HugePage);
    }
    Ok((fd, mapping))
}

/// Why the acceptor could not use the file it was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OpenError {
    Sys(SysError),
    Layout(ShmLayoutError),
}

impl From<SysError> for OpenError {
    fn from(e: SysError) -> Self {
        OpenError::Sys(e)
    }
}

impl From<ShmLayoutError> for OpenError {
    fn from(e: ShmLayoutError) -> Self {
        OpenError::Layout(e)
    }
}

/// Checks a shared file received from a peer and maps it.
pub(crate) fn open(fd: &OwnedFd) -> Result<(Layout, Mapping), OpenError> {
    let stat = sys("fstat", fstat(fd.as_fd()))?;
    if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
        return Err(ShmLayoutError::NotAFile.into());
    }
    let seals = fcntl(fd, FcntlArg::F_GET_SEALS).map(SealFlag::from_bits_truncate);
    if !seals.is_ok_and(|s| s.contains(SEALS)) {
        return Err(ShmLayoutError::NotSealed.into());
    }
    let file_len = u64::try_from(stat.st_size).unwrap_or(0);
    let mut header = [0u8; HEADER_LEN];
    let read = sys("pread", nix::sys::uio::pread(fd, &mut header, 0))?;
    if read != HEADER_LEN {
        return Err(ShmLayoutError::Truncated {
            file_len,
            needed: HEADER_LEN as u64,
        }
        .into());
    }
    let layout = Layout::decode(&header, file_len)?;
    // A hugetlbfs file reports its hugepage block size; map the whole file in either case.
    let huge = stat.st_blksize as usize >= HUGEPAGE;
    // `fd` is a regular file sealed against shrinking (checked above) of `file_len` bytes, at
    // least `layout.total` (checked by `decode`) and at most `MAX_MAPPING_LEN`.
    let mapping = Mapping::map(fd, file_len as usize, huge)?;
    Ok((layout, mapping))
}
