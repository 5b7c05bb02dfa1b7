//! A single-producer single-consumer ring of fixed-size slots in memory shared by two processes.
//!
//! One ring is a control block ([`RingCtl`]) and `count` slots of `stride` bytes (`count` a power
//! of two, `stride` a multiple of [`CACHE_LINE`] and at least `slot_size + 8`). Frame `n` (the
//! ring's `n`th, counted from 1) goes in slot `(n - 1) % count`:
//!
//! | bytes of a slot            | what                                                         |
//! |----------------------------|--------------------------------------------------------------|
//! | `0..len`                   | the frame, except bytes `16..24`                             |
//! | `16..24`                   | the mark, which says that the slot holds frame `n`; written last (Release) |
//! | `round_up(len, 8)..` (8)   | an unstamped frame's own bytes `16..24`, when it has any     |
//! | up to `stride`             | padding                                                      |
//!
//! A mark is one of two kinds:
//!
//! * **Stamped**: a frame that starts with a urom frame header ([`urom_wire::frame`]) whose
//!   `seq` field says `n` and whose `length` field says its length is its own mark: it is copied
//!   as it is, its `seq` field last, and the consumer reads the length from its header. The
//!   ready mark lies in the frame's first cache line, so a frame of up to 64 bytes moves between
//!   the processes in one line. Senders learn `n` from [`Producer::next_seq`].
//! * **Unstamped**, any other frame: the mark is [`UNSTAMPED`]` | len << 32 | (n as u32)`;
//!   the frame's own bytes `16..24` go after the frame, and the consumer puts them back before it
//!   lends the frame out (and clears the mark when it releases the slot, so that those bytes are
//!   never taken for a later mark).
//!
//! The producer writes the frame, then stores the mark with Release ordering; the consumer loads
//! the mark of the slot at its head with Acquire ordering and owns the frame once it matches.
//! A stale mark never matches: a stamped mark is `n` itself, and an unstamped one carries
//! `n` modulo 2^32, while `count <= 2^16`.
//!
//! The consumer publishes its head (how many frames it has released) on its own cache line, in
//! batches of a quarter of the ring and whenever it finds the ring empty; the producer caches it
//! and only reloads it when the cached value says the ring is full. Wait and close flags sit on a
//! third line that is written only when a side goes to sleep or closes.
//!
//! Both sides prefetch: the producer takes the lines of a slot a few frames ahead of its tail
//! for writing, the consumer fetches a slot a few frames ahead of its head whenever it finds a
//! frame ([`ReadAhead`]), so that the lines of a burst cross between the cores together rather
//! than one after another.
//!
//! Nothing the peer writes is trusted: a length larger than the slot (or a stamped frame too
//! short to hold its header) or a head that moves backwards or past the producer is reported as
//! [`RingCorrupt`], never followed.

use core::ptr::NonNull;

use urom_wire::frame::FrameHeader;

use crate::sync::{AtomicU32, AtomicU64, Ordering, fence};

/// Distance that keeps two fields off each other's cache line, including the adjacent line the
/// hardware prefetcher pulls in with it.
pub(crate) const CACHE_LINE: usize = 128;
/// Bytes a slot holds beyond its largest frame: room for an unstamped frame's displaced word.
pub(crate) const SLOT_RESERVE: usize = 8;
/// Where a slot's mark lies: the `seq` field of a urom frame header.
const MARK_AT: usize = core::mem::offset_of!(FrameHeader, seq);
/// The first byte after the mark.
const MARK_END: usize = MARK_AT + 8;
/// Where a stamped frame says its length: the `length` field of a urom frame header.
const LENGTH_AT: usize = core::mem::offset_of!(FrameHeader, length);
/// The bit that marks an unstamped frame's mark.
pub(crate) const UNSTAMPED: u64 = 1 << 63;

const _: () = assert!(MARK_AT % 8 == 0 && MARK_END <= 64 && LENGTH_AT + 4 <= MARK_AT);

/// Most slots the producer prefetches ahead of its tail.
const PREFETCH_DISTANCE: u64 = 8;
/// Slots the consumer prefetches ahead of its head with [`ReadAhead::Near`]. Well short of the
/// producer's [`PREFETCH_DISTANCE`]: at that distance the two sides take the same line from
/// each other at every frame (a stream of 64-byte frames fell from 61 to 24 M/s), and past it
/// the lines come too early for a fast producer (45 M/s at 16); at 4 the stream reached 80 M/s.
const NEAR_READ_AHEAD: u64 = 4;
/// Slots the consumer prefetches ahead of its head with [`ReadAhead::Far`]: past the
/// producer's [`PREFETCH_DISTANCE`] twice over. A consumer right behind its producer then
/// fetches a line the producer takes back with its own prefetch, long before it writes it, so
/// the producer never stalls on it; one that has fallen behind fetches frames already written.
/// Host-API loopbacks at 64 in flight went from 18 to 22 M/s with the host's notifications
/// read this far ahead, against 20 M/s with no read-ahead at all (16: 19 M/s, 28 and more: 21).
const FAR_READ_AHEAD: u64 = 20;

/// How far ahead of the next frame a receiving half asks the CPU to fetch, where its transport
/// keeps frames in a ring it can fetch from (shared memory; over UCX this changes nothing).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(loom, allow(dead_code))]
pub enum ReadAhead {
    /// A few frames: for a receiver that takes bursts its peer wrote while it was busy, or a
    /// stream it cannot keep up with.
    #[default]
    Near,
    /// Many frames: for a receiver that mostly reads right behind a peer sending one frame at
    /// a time (a host reading its worker's notifications, each sent as its command is
    /// dispatched). Fetching a few frames on would take the lines the peer is about to write
    /// and stall it.
    Far,
}

/// The distance in slots of `read_ahead` in a ring of `capacity` slots: at most a quarter of
/// the ring.
fn read_ahead_slots(read_ahead: ReadAhead, capacity: u64) -> u64 {
    let wanted = match read_ahead {
        ReadAhead::Near => NEAR_READ_AHEAD,
        ReadAhead::Far => FAR_READ_AHEAD,
    };
    wanted.clamp(1, (capacity / 4).max(1))
}

/// A value alone on its own cache-line pair.
#[repr(C, align(128))]
pub(crate) struct Line<T>(pub(crate) T);

/// Flags written only when a side sleeps, wakes or closes.
#[repr(C)]
pub(crate) struct RingFlags {
    /// Non-zero while the consumer sleeps (or is about to) waiting for a frame.
    pub(crate) consumer_waiting: AtomicU32,
    /// Non-zero while the producer sleeps (or is about to) waiting for a free slot.
    pub(crate) producer_waiting: AtomicU32,
    /// Non-zero once the producer closed the ring: no frame will follow those already in it.
    pub(crate) producer_closed: AtomicU32,
    /// Non-zero once the consumer closed the ring: frames sent now are never read.
    pub(crate) consumer_closed: AtomicU32,
}

/// The control block of one ring. All zeroes is the initial state.
#[repr(C)]
pub(crate) struct RingCtl {
    /// Frames the consumer has released (absolute count); written by the consumer only.
    pub(crate) head: Line<AtomicU64>,
    /// See [`RingFlags`].
    pub(crate) flags: Line<RingFlags>,
}

#[cfg(not(loom))]
const _: () = assert!(size_of::<RingCtl>() == 2 * CACHE_LINE);

impl RingCtl {
    /// A control block in its initial state (the same as all zeroes).
    #[cfg(any(test, loom))]
    pub(crate) fn new() -> Self {
        Self {
            head: Line(AtomicU64::new(0)),
            flags: Line(RingFlags {
                consumer_waiting: AtomicU32::new(0),
                producer_waiting: AtomicU32::new(0),
                producer_closed: AtomicU32::new(0),
                consumer_closed: AtomicU32::new(0),
            }),
        }
    }
}

/// Says that this half is about to sleep: sets `flag`, then a full fence, after which the
/// caller looks at the ring once more before it sleeps.
#[inline]
pub(crate) fn announce_sleep(flag: &AtomicU32) {
    flag.store(1, Ordering::Relaxed);
    fence(Ordering::SeqCst);
}

/// Whether the peer announced that it sleeps ([`announce_sleep`]), after a full fence that
/// orders this half's earlier ring writes before the look; clears the flag so one wake-up
/// suffices. With both fences, either the sleeper's last look at the ring sees those writes or
/// this sees its flag: a wake-up is never lost (the plain check after each frame, without the
/// fence, may miss a flag set at that very moment).
#[inline]
pub(crate) fn take_sleeper(flag: &AtomicU32) -> bool {
    fence(Ordering::SeqCst);
    flag.load(Ordering::Relaxed) != 0 && flag.swap(0, Ordering::Relaxed) != 0
}

/// The peer broke the ring protocol; the connection cannot be used any more.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RingCorrupt(pub(crate) &'static str);

/// Why [`Producer::push`] did not take a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PushError {
    /// Every slot holds a frame the consumer has not released.
    Full,
    /// The frame is larger than a slot.
    TooLarge,
    /// See [`RingCorrupt`].
    Corrupt(RingCorrupt),
}

impl From<RingCorrupt> for PushError {
    fn from(e: RingCorrupt) -> Self {
        PushError::Corrupt(e)
    }
}

/// Where an unstamped frame of `len` bytes keeps its own bytes `16..24`.
#[inline(always)]
fn displaced_at(len: usize) -> usize {
    len.next_multiple_of(8)
}

/// Whether `frame`, sent as frame `n`, is its own mark (see the module documentation).
#[inline(always)]
fn stamped(frame: &[u8], n: u64) -> bool {
    frame.len() >= MARK_END
        && frame[MARK_AT..MARK_END] == n.to_le_bytes()
        && frame[LENGTH_AT..LENGTH_AT + 4] == (frame.len() as u32).to_le_bytes()
}

/// Where one ring lives. Copies of it are handed to the producer and the consumer.
#[derive(Clone, Copy)]
pub(crate) struct RingMem {
    // INVARIANTS (from `from_raw`): `ctl` points to a live `RingCtl`; `slots` to `count * stride`
    // live bytes, 8-aligned; `stride >= max(SLOT_RESERVE + slot_size, 24)` and a multiple of 8; `mask ==
    // count - 1` with `count` a power of two no larger than `2^16`.
    ctl: NonNull<RingCtl>,
    slots: NonNull<u8>,
    stride: usize,
    mask: u64,
    slot_size: usize,
    #[cfg(loom)]
    marks: NonNull<AtomicU64>,
    #[cfg(loom)]
    cells: NonNull<loom::cell::UnsafeCell<()>>,
}

impl RingMem {
    /// Describes a ring over memory set up elsewhere.
    ///
    /// # Safety
    ///
    /// - `ctl` points to a `RingCtl` (all zeroes or left by earlier users of this ring) that stays
    ///   valid while any copy of the returned value is used;
    /// - `slots` points to `count * stride` bytes, 8-aligned, valid for reads and writes for as
    ///   long; `count` is a power of two no larger than `2^16`, `stride` a multiple of 8 and at
    ///   least `SLOT_RESERVE + slot_size` and 24 (the mark's end), `slot_size` below `2^31`;
    /// - at most one [`Producer`] and one [`Consumer`] use the ring at a time (in this process
    ///   or any other), and the memory is touched by nothing else except through atomics.
    pub(crate) unsafe fn from_raw(
        ctl: NonNull<RingCtl>,
        slots: NonNull<u8>,
        count: u32,
        stride: usize,
        slot_size: usize,
        #[cfg(loom)] marks: NonNull<AtomicU64>,
        #[cfg(loom)] cells: NonNull<loom::cell::UnsafeCell<()>>,
    ) -> Self {
        debug_assert!(count.is_power_of_two() && count <= 1 << 16);
        debug_assert!(stride % 8 == 0 && stride >= (SLOT_RESERVE + slot_size).max(MARK_END));
        debug_assert!(slot_size < 1 << 31);
        Self {
            ctl,
            slots,
            stride,
            mask: u64::from(count) - 1,
            slot_size,
            #[cfg(loom)]
            marks,
            #[cfg(loom)]
            cells,
        }
    }

    /// Number of slots.
    pub(crate) fn capacity(&self) -> u64 {
        self.mask + 1
    }

    pub(crate) fn ctl(&self) -> &RingCtl {
        // SAFETY: `ctl` is valid for as long as `self` is used (invariant from `from_raw`) and is
        // only ever accessed through its atomics.
        unsafe { self.ctl.as_ref() }
    }

    /// Byte offset of the slot holding `position`; always inside the slot area.
    #[inline(always)]
    fn slot_offset(&self, position: u64) -> usize {
        // `position & mask < count`, so the product is below `count * stride`, which fits.
        (position & self.mask) as usize * self.stride
    }

    /// The mark of the slot holding `position`.
    #[cfg(not(loom))]
    #[inline(always)]
    fn mark(&self, position: u64) -> &AtomicU64 {
        let word = self
            .slot_ptr(position)
            .wrapping_add(MARK_AT)
            .cast::<AtomicU64>();
        // SAFETY: `word` lies 16 bytes into a slot inside the slot area (see `slot_offset`;
        // `stride >= MARK_END`), 8-aligned because `slots` and `stride` are; the producer writes
        // these bytes only as this atomic, and the consumer touches them otherwise only while
        // it owns the slot (see `Consumer::peek`); they stay mapped while `self` is used.
        unsafe { &*word }
    }

    #[cfg(loom)]
    fn mark(&self, position: u64) -> &AtomicU64 {
        let word = self
            .marks
            .as_ptr()
            .wrapping_add((position & self.mask) as usize);
        // SAFETY: under loom the marks live in their own array of `count` atomics.
        unsafe { &*word }
    }

    /// Pointer to the first byte of the slot holding `position`.
    #[inline(always)]
    fn slot_ptr(&self, position: u64) -> *mut u8 {
        // `offset + stride <= count * stride`, so the result stays inside the slot area.
        self.slots.as_ptr().wrapping_add(self.slot_offset(position))
    }

    /// Hints the CPU to take the cache line `offset` bytes into the slot holding `position` for
    /// writing.
    #[inline(always)]
    fn prefetch_write(&self, position: u64, offset: usize) {
        #[cfg(all(target_arch = "x86_64", not(loom)))]
        {
            let line = self.slot_ptr(position).wrapping_add(offset);
            // SAFETY: `prefetchw` reads and writes nothing architecturally and never faults,
            // whatever the address (CPUs without it execute it as a no-op).
            unsafe {
                core::arch::asm!("prefetchw [{0}]", in(reg) line, options(nostack, preserves_flags, readonly))
            };
        }
        let _ = (position, offset);
    }

    /// Hints the CPU to fetch the first cache line of the slot holding `position`.
    #[inline(always)]
    fn prefetch_read(&self, position: u64) {
        #[cfg(all(target_arch = "x86_64", not(loom)))]
        {
            let line = self.slot_ptr(position);
            // SAFETY: `prefetcht0` reads and writes nothing architecturally and never faults,
            // whatever the address.
            unsafe {
                core::arch::asm!("prefetcht0 [{0}]", in(reg) line, options(nostack, preserves_flags, readonly))
            };
        }
        let _ = position;
    }

    #[cfg(loom)]
    fn cell(&self, position: u64) -> &loom::cell::UnsafeCell<()> {
        let cell = self
            .cells
            .as_ptr()
            .wrapping_add((position & self.mask) as usize);
        // SAFETY: under loom there is one access-tracking cell per slot.
        unsafe { &*cell }
    }
}

/// Copies `len` bytes from `src` to `dst`; up to 64 bytes inline, as two (possibly overlapping)
/// moves of the largest power of two that fits, rather than through a call to `memcpy`.
///
/// # Safety
///
/// As for [`core::ptr::copy_nonoverlapping`]: `src` readable and `dst` writable for `len` bytes,
/// not overlapping, and no other thread accesses `dst` meanwhile.
#[inline(always)]
unsafe fn copy(src: *const u8, dst: *mut u8, len: usize) {
    /// Copies the first and the last `N` bytes of the `len >= N` bytes.
    ///
    /// # Safety
    ///
    /// As for `copy`, with `N <= len`.
    #[inline(always)]
    unsafe fn ends<const N: usize>(src: *const u8, dst: *mut u8, len: usize) {
        // SAFETY: `src` is readable for `len >= N` bytes (the caller's obligation).
        let first = unsafe { src.cast::<[u8; N]>().read_unaligned() };
        // SAFETY: the last `N` of those `len` bytes.
        let last = unsafe { src.wrapping_add(len - N).cast::<[u8; N]>().read_unaligned() };
        // SAFETY: `dst` is writable for `len >= N` bytes and no one else touches it.
        unsafe { dst.cast::<[u8; N]>().write_unaligned(first) };
        // SAFETY: the last `N` of those `len` bytes.
        unsafe {
            dst.wrapping_add(len - N)
                .cast::<[u8; N]>()
                .write_unaligned(last)
        };
    }
    if len > 64 {
        // SAFETY: the caller's obligations are those of `copy_nonoverlapping`.
        unsafe { core::ptr::copy_nonoverlapping(src, dst, len) };
    } else if len > 32 {
        // SAFETY: the caller's obligations, and `32 <= len`.
        unsafe { ends::<32>(src, dst, len) };
    } else if len >= 16 {
        // SAFETY: the caller's obligations, and `16 <= len`.
        unsafe { ends::<16>(src, dst, len) };
    } else if len >= 8 {
        // SAFETY: the caller's obligations, and `8 <= len`.
        unsafe { ends::<8>(src, dst, len) };
    } else if len >= 4 {
        // SAFETY: the caller's obligations, and `4 <= len`.
        unsafe { ends::<4>(src, dst, len) };
    } else {
        for i in 0..len {
            // SAFETY: byte `i < len` of both ranges (the caller's obligations).
            let byte = unsafe { src.wrapping_add(i).read() };
            // SAFETY: as above.
            unsafe { dst.wrapping_add(i).write(byte) };
        }
    }
}

/// The writing side of a ring.
pub(crate) struct Producer {
    mem: RingMem,
    // INVARIANTS: `cached_head <= tail <= cached_head + capacity`; `cached_head` never exceeds the
    // consumer's published head.
    tail: u64,
    cached_head: u64,
    /// How many slots ahead of the tail to prefetch for writing.
    prefetch_distance: u64,
}

// SAFETY: a `Producer` only reaches the ring memory through `RingMem`, whose owner keeps it alive
// and which has no thread affinity; the protocol allows one producer, which `&mut self` enforces.
unsafe impl Send for Producer {}

impl Producer {
    pub(crate) fn new(mem: RingMem) -> Self {
        Self {
            mem,
            tail: 0,
            cached_head: 0,
            prefetch_distance: (mem.capacity() / 4).clamp(1, PREFETCH_DISTANCE),
        }
    }

    pub(crate) fn mem(&self) -> &RingMem {
        &self.mem
    }

    /// The number the next frame pushed will have (1 for the first): a frame whose urom header
    /// carries it in its `seq` field (and its length in its `length` field) is stamped.
    #[inline]
    pub(crate) fn next_seq(&self) -> u64 {
        self.tail + 1
    }

    /// Copies `frame` into the next slot and publishes it.
    #[inline]
    pub(crate) fn push(&mut self, frame: &[u8]) -> Result<(), PushError> {
        let len = frame.len();
        if len > self.mem.slot_size {
            return Err(PushError::TooLarge);
        }
        if self.tail - self.cached_head >= self.mem.capacity() && !self.has_space()? {
            return Err(PushError::Full);
        }
        let n = self.tail + 1;
        let slot = self.mem.slot_ptr(self.tail);
        let src = frame.as_ptr();
        #[cfg(loom)]
        self.mem.cell(self.tail).with_mut(|_| ());
        let mark = if stamped(frame, n) {
            n
        } else {
            UNSTAMPED | (len as u64) << 32 | u64::from(n as u32)
        };
        // SAFETY: (this copy and the two below) the slot is free: the consumer released it (`tail - head <
        // capacity`) and reads none of it but the mark until the mark below says so; every
        // range is inside the slot: `len <= slot_size` and `displaced_at(len) + 8 <= stride`
        // (`stride` is a multiple of 8 of at least `slot_size + 8`); `frame` cannot overlap
        // memory we only reach by pointer. The mark's bytes `16..24` are not written here.
        unsafe { copy(src, slot, len.min(MARK_AT)) };
        if len > MARK_END {
            // SAFETY: see above.
            unsafe {
                copy(
                    src.wrapping_add(MARK_END),
                    slot.wrapping_add(MARK_END),
                    len - MARK_END,
                )
            };
        }
        if mark != n && len > MARK_AT {
            // SAFETY: see above.
            unsafe {
                copy(
                    src.wrapping_add(MARK_AT),
                    slot.wrapping_add(displaced_at(len)),
                    len.min(MARK_END) - MARK_AT,
                )
            };
        }
        #[cfg(loom)]
        if mark == n {
            // Under loom the mark lives apart: the frame's bytes hold it too.
            // SAFETY: as above; under loom nothing else reads or writes the slot's bytes.
            unsafe { copy(src.wrapping_add(MARK_AT), slot.wrapping_add(MARK_AT), 8) };
        }
        self.mem.mark(self.tail).store(mark, Ordering::Release);
        self.tail = n;
        // Own the lines of a slot a few frames ahead before writing them: the transfer from the
        // consumer's cache then overlaps with this frame instead of stalling a later one.
        let ahead = self.tail + self.prefetch_distance;
        self.mem.prefetch_write(ahead, 0);
        self.mem.prefetch_write(ahead, 64);
        Ok(())
    }

    /// Reloads the consumer's head; whether a slot is free now.
    pub(crate) fn has_space(&mut self) -> Result<bool, RingCorrupt> {
        if self.tail - self.cached_head < self.mem.capacity() {
            return Ok(true);
        }
        let head = self.mem.ctl().head.0.load(Ordering::Acquire);
        if head < self.cached_head || head > self.tail {
            return Err(RingCorrupt(
                "the consumer's head moved backwards or past the producer",
            ));
        }
        self.cached_head = head;
        Ok(self.tail - head < self.mem.capacity())
    }
}

/// The frame at a consumer's head, once taken.
#[derive(Clone, Copy)]
struct Taken {
    len: usize,
    /// Its bytes `16..24` were put back over the mark, which must be cleared on release.
    restored: bool,
}

/// The reading side of a ring.
pub(crate) struct Consumer {
    mem: RingMem,
    // INVARIANTS: `published <= head`; `head - published <= batch` after every call returns;
    // slot `head` is the next frame to read; `taken` describes it once its mark matched.
    head: u64,
    published: u64,
    batch: u64,
    taken: Option<Taken>,
    /// How many slots ahead of its head the consumer prefetches once it finds a frame.
    read_ahead: u64,
}

// SAFETY: as for `Producer`: access goes through `RingMem` only, one consumer by `&mut self`.
unsafe impl Send for Consumer {}

impl Consumer {
    pub(crate) fn new(mem: RingMem) -> Self {
        Self {
            mem,
            head: 0,
            published: 0,
            batch: (mem.capacity() / 4).max(1),
            taken: None,
            read_ahead: read_ahead_slots(ReadAhead::Near, mem.capacity()),
        }
    }

    /// Sets how far ahead of its head the consumer prefetches.
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn set_read_ahead(&mut self, read_ahead: ReadAhead) {
        self.read_ahead = read_ahead_slots(read_ahead, self.mem.capacity());
    }

    pub(crate) fn mem(&self) -> &RingMem {
        &self.mem
    }

    /// What `mark` says about the slot at the head: nothing yet, or the frame's length and
    /// whether it is unstamped with bytes to put back.
    #[inline(always)]
    fn check(&self, mark: u64) -> Result<Option<Taken>, RingCorrupt> {
        let n = self.head + 1;
        if mark == n {
            let at = self.mem.slot_ptr(self.head).wrapping_add(LENGTH_AT);
            // SAFETY: `at` lies 8 bytes into the head's slot, inside the slot area; the Acquire
            // load of the mark made the producer's writes visible and it does not write the
            // slot again until we release it.
            let len = unsafe { at.cast::<u32>().read_unaligned() };
            let len = u32::from_le(len) as usize;
            if len < MARK_END || len > self.mem.slot_size {
                return Err(RingCorrupt(
                    "a stamped frame's length is shorter than its header or longer than a slot",
                ));
            }
            Ok(Some(Taken {
                len,
                restored: false,
            }))
        } else if mark & UNSTAMPED != 0 && mark as u32 == n as u32 {
            let len = ((mark & !UNSTAMPED) >> 32) as usize;
            if len > self.mem.slot_size {
                return Err(RingCorrupt("a frame is longer than a slot"));
            }
            Ok(Some(Taken {
                len,
                restored: len > MARK_AT,
            }))
        } else {
            Ok(None)
        }
    }

    /// The frame at the head, if the producer has published it. The bytes stay the consumer's
    /// until [`Consumer::advance`], which the borrow prevents while the slice lives.
    #[inline]
    pub(crate) fn peek(&mut self) -> Result<Option<&[u8]>, RingCorrupt> {
        let taken = match self.taken {
            Some(taken) => taken,
            None => {
                let mark = self.mem.mark(self.head).load(Ordering::Acquire);
                let Some(taken) = self.check(mark)? else {
                    return Ok(None);
                };
                // Slots lie a page or more apart, out of the hardware prefetcher's reach: while
                // frames keep coming, fetch the one a few slots on alongside this one (a line
                // the producer wrote, or one it has yet to write; see `ReadAhead`).
                self.mem.prefetch_read(self.head + self.read_ahead);
                #[cfg(loom)]
                self.mem.cell(self.head).with(|_| ());
                if taken.restored {
                    let slot = self.mem.slot_ptr(self.head);
                    // SAFETY: both ranges lie inside the head's slot (`len <= slot_size`, see
                    // `push`) and do not overlap (`displaced_at(len) >= len > 16`); the slot is
                    // ours until released (Acquire load above), the producer does not touch it,
                    // and we no longer read the mark as an atomic until we clear it on release.
                    unsafe {
                        copy(
                            slot.wrapping_add(displaced_at(taken.len)),
                            slot.wrapping_add(MARK_AT),
                            taken.len.min(MARK_END) - MARK_AT,
                        )
                    };
                }
                self.taken = Some(taken);
                taken
            }
        };
        let src = self.mem.slot_ptr(self.head);
        // SAFETY: `len <= slot_size` bytes from `src` are inside the slot (checked in `check`);
        // the Acquire load of the mark made the producer's writes visible, and the producer
        // does not touch the slot again until `advance` releases it, which needs `&mut self` and
        // so cannot happen while the returned slice is borrowed.
        Ok(Some(unsafe { core::slice::from_raw_parts(src, taken.len) }))
    }

    /// Whether a frame is ready at the head.
    #[inline]
    pub(crate) fn ready(&self) -> bool {
        if self.taken.is_some() {
            return true;
        }
        let mark = self.mem.mark(self.head).load(Ordering::Acquire);
        let n = self.head + 1;
        mark == n || (mark & UNSTAMPED != 0 && mark as u32 == n as u32)
    }

    /// Releases the frame at the head (taken with [`Consumer::peek`]). Returns whether the head
    /// was published and the producer waits for space (then it needs a wake-up).
    #[inline]
    pub(crate) fn advance(&mut self) -> bool {
        if let Some(Taken { restored: true, .. }) = self.taken {
            // The frame's own bytes lie where the mark was: they must never pass for one. The
            // head's publication (Release) orders this before the producer's next write.
            self.mem.mark(self.head).store(0, Ordering::Relaxed);
        }
        self.taken = None;
        self.head += 1;
        if self.head - self.published >= self.batch {
            self.publish()
        } else {
            false
        }
    }

    /// Publishes the head if it moved. Returns whether the producer waits for space.
    #[inline]
    pub(crate) fn publish(&mut self) -> bool {
        if self.head == self.published {
            return false;
        }
        self.mem.ctl().head.0.store(self.head, Ordering::Release);
        self.published = self.head;
        self.mem
            .ctl()
            .flags
            .0
            .producer_waiting
            .load(Ordering::Relaxed)
            != 0
    }
}

/// A ring in ordinary memory, for tests of the index logic.
#[cfg(any(test, loom))]
pub(crate) mod testing {
    use super::*;

    /// Owns the memory of one ring.
    pub(crate) struct TestRing {
        ctl: Box<RingCtl>,
        slots: Box<[Line<[u8; CACHE_LINE]>]>,
        #[cfg(loom)]
        marks: Box<[AtomicU64]>,
        #[cfg(loom)]
        cells: Box<[loom::cell::UnsafeCell<()>]>,
        count: u32,
        stride: usize,
        slot_size: usize,
    }

    // SAFETY: the memory is only reached through the producer and consumer, which follow the
    // ring protocol; the boxes themselves are plain owned memory.
    unsafe impl Send for TestRing {}
    // SAFETY: as above: shared access is only through `RingMem`, whose protocol is thread-safe.
    unsafe impl Sync for TestRing {}

    impl TestRing {
        pub(crate) fn new(count: u32, slot_size: usize) -> Self {
            let stride = (SLOT_RESERVE + slot_size).next_multiple_of(CACHE_LINE);
            let lines = count as usize * stride / CACHE_LINE;
            Self {
                ctl: Box::new(RingCtl::new()),
                slots: (0..lines).map(|_| Line([0; CACHE_LINE])).collect(),
                #[cfg(loom)]
                marks: (0..count).map(|_| AtomicU64::new(0)).collect(),
                #[cfg(loom)]
                cells: (0..count)
                    .map(|_| loom::cell::UnsafeCell::new(()))
                    .collect(),
                count,
                stride,
                slot_size,
            }
        }

        /// A producer and a consumer for this ring; `self` must outlive both.
        pub(crate) fn split(&self) -> (Producer, Consumer) {
            let slots = NonNull::from(&*self.slots).cast::<u8>();
            // SAFETY: `ctl` and `slots` are owned by `self` (boxes do not move), `slots` holds
            // `count * stride` bytes aligned to a cache line; the caller keeps `self` alive and
            // calls `split` once.
            let mem = unsafe {
                RingMem::from_raw(
                    NonNull::from(&*self.ctl),
                    slots,
                    self.count,
                    self.stride,
                    self.slot_size,
                    #[cfg(loom)]
                    NonNull::from(&*self.marks).cast(),
                    #[cfg(loom)]
                    NonNull::from(&*self.cells).cast(),
                )
            };
            (Producer::new(mem), Consumer::new(mem))
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::testing::TestRing;
    use super::*;

    #[test]
    fn push_until_full_then_drain_in_order() {
        let ring = TestRing::new(8, 64);
        let (mut tx, mut rx) = ring.split();
        for lap in 0..5u8 {
            for i in 0..8u8 {
                tx.push(&[lap, i, 7]).unwrap();
            }
            assert_eq!(tx.push(&[9]), Err(PushError::Full));
            for i in 0..8u8 {
                assert_eq!(rx.peek().unwrap().unwrap(), &[lap, i, 7]);
                rx.advance();
            }
            assert_eq!(rx.peek().unwrap(), None);
            rx.publish();
        }
    }

    #[test]
    fn read_ahead_stays_within_a_quarter_of_the_ring() {
        assert_eq!(read_ahead_slots(ReadAhead::Near, 256), NEAR_READ_AHEAD);
        assert_eq!(read_ahead_slots(ReadAhead::Far, 256), FAR_READ_AHEAD);
        assert_eq!(read_ahead_slots(ReadAhead::Far, 16), 4);
        assert_eq!(read_ahead_slots(ReadAhead::Near, 8), 2);
        assert_eq!(read_ahead_slots(ReadAhead::Far, 2), 1);
    }

    #[test]
    fn full_ring_frees_after_batched_publish() {
        let ring = TestRing::new(8, 16);
        let (mut tx, mut rx) = ring.split();
        for i in 0..8u8 {
            tx.push(&[i]).unwrap();
        }
        // One frame released but not yet published: still full to the producer.
        rx.advance();
        assert_eq!(tx.push(&[8]), Err(PushError::Full));
        // Batch of two (8 / 4) reached: published.
        rx.advance();
        tx.push(&[8]).unwrap();
        tx.push(&[9]).unwrap();
        assert_eq!(tx.push(&[10]), Err(PushError::Full));
    }

    #[test]
    fn sizes_up_to_the_slot_and_no_further() {
        let ring = TestRing::new(2, 100);
        let (mut tx, mut rx) = ring.split();
        tx.push(&[]).unwrap();
        tx.push(&[3; 100]).unwrap();
        assert_eq!(rx.peek().unwrap().unwrap().len(), 0);
        rx.advance();
        assert_eq!(rx.peek().unwrap().unwrap(), &[3; 100][..]);
        rx.advance();
        assert_eq!(tx.push(&[0; 101]), Err(PushError::TooLarge));
    }

    /// A frame with a urom header saying `seq` and its length, the rest `fill`.
    fn urom_frame(len: usize, seq: u64, fill: u8) -> Vec<u8> {
        let mut frame = vec![fill; len];
        frame[LENGTH_AT..LENGTH_AT + 4].copy_from_slice(&(len as u32).to_le_bytes());
        frame[MARK_AT..MARK_END].copy_from_slice(&seq.to_le_bytes());
        frame
    }

    #[test]
    fn stamped_frames_are_their_own_mark() {
        let ring = TestRing::new(4, 200);
        let (mut tx, mut rx) = ring.split();
        for lap in 0..6u8 {
            for i in 0..4u8 {
                let len = 24 + usize::from(lap * 4 + i) * 7;
                let frame = urom_frame(len, tx.next_seq(), lap ^ i);
                tx.push(&frame).unwrap();
                assert_eq!(
                    rx.mem().mark(tx.next_seq() - 2).load(Ordering::Relaxed),
                    tx.next_seq() - 1
                );
                assert_eq!(rx.peek().unwrap().unwrap(), &frame[..]);
                // A second look gives the same frame.
                assert_eq!(rx.peek().unwrap().unwrap(), &frame[..]);
                rx.advance();
                assert_eq!(rx.peek().unwrap(), None);
            }
        }
    }

    #[test]
    fn unstamped_frames_of_every_length_survive_stale_slots() {
        // Lengths around the mark, frames whose bytes 16..24 look like marks of later laps,
        // stamped and unstamped frames in the same slots: every frame arrives intact, once.
        let ring = TestRing::new(2, 64);
        let (mut tx, mut rx) = ring.split();
        for len in 0..=64usize {
            for kind in 0..3 {
                let n = tx.next_seq();
                let mut frame: Vec<u8> = (0..len).map(|i| (i * 13 + len) as u8).collect();
                if len >= MARK_END {
                    // 0: bytes 16..24 say the mark this slot expects a lap later; 1: a wrong
                    // length field; 2: stamped.
                    let length = len as u32 + u32::from(kind == 1);
                    frame[LENGTH_AT..LENGTH_AT + 4].copy_from_slice(&length.to_le_bytes());
                    let seq = if kind == 2 { n } else { n + 2 };
                    frame[MARK_AT..MARK_END].copy_from_slice(&seq.to_le_bytes());
                }
                tx.push(&frame).unwrap();
                assert_eq!(
                    rx.peek().unwrap().unwrap(),
                    &frame[..],
                    "len {len} kind {kind}"
                );
                rx.advance();
                assert_eq!(rx.peek().unwrap(), None, "len {len} kind {kind}");
                rx.publish();
            }
        }
    }

    #[test]
    fn bad_peer_values_are_errors() {
        let ring = TestRing::new(4, 16);
        let (mut tx, mut rx) = ring.split();
        // A length beyond the slot with a matching sequence number.
        rx.mem()
            .mark(0)
            .store(UNSTAMPED | 17 << 32 | 1, Ordering::Relaxed);
        assert!(rx.peek().is_err());
        // A stamped frame whose header says it is shorter than its header.
        rx.mem().mark(0).store(1, Ordering::Relaxed);
        assert!(rx.peek().is_err());
        rx.mem().mark(0).store(0, Ordering::Relaxed);
        // A head past the producer.
        for i in 0..4u8 {
            tx.push(&[i]).unwrap();
        }
        tx.mem().ctl().head.0.store(99, Ordering::Relaxed);
        assert!(matches!(tx.push(&[0]), Err(PushError::Corrupt(_))));
    }

    #[test]
    fn threads_exchange_many_frames() {
        let ring = TestRing::new(16, 32);
        let (mut tx, mut rx) = ring.split();
        const N: u32 = 200_000;
        std::thread::scope(|s| {
            s.spawn(move || {
                for i in 0..N {
                    let bytes = i.to_le_bytes();
                    let len = (i % 29) as usize;
                    let mut frame = [0u8; 32];
                    frame[..4].copy_from_slice(&bytes);
                    frame[4..4 + (len % 28)].fill(bytes[0]);
                    while tx.push(&frame[..4 + len % 28]) == Err(PushError::Full) {
                        std::hint::spin_loop();
                    }
                }
            });
            let mut next = 0u32;
            while next < N {
                let Some(frame) = rx.peek().unwrap() else {
                    rx.publish();
                    std::hint::spin_loop();
                    continue;
                };
                assert_eq!(frame[..4], next.to_le_bytes());
                assert_eq!(frame.len(), 4 + (next % 29) as usize % 28);
                assert!(frame[4..].iter().all(|&b| b == next.to_le_bytes()[0]));
                rx.advance();
                next += 1;
            }
        });
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::testing::TestRing;
    use super::*;
    use loom::sync::Arc;

    fn model(f: impl Fn() + Sync + Send + 'static) {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(3);
        builder.check(f);
    }

    /// Frames cross in order and intact, and a slot is never reused before its release, over
    /// every interleaving loom explores (two laps of a two-slot ring).
    #[test]
    fn loom_push_pop_in_order() {
        model(|| {
            let ring = Arc::new(TestRing::new(2, 8));
            let (mut tx, mut rx) = ring.split();
            let keep = ring.clone();
            let producer = loom::thread::spawn(move || {
                let _keep = keep;
                for i in 0..4u8 {
                    loop {
                        match tx.push(&[i, i]) {
                            Ok(()) => break,
                            Err(PushError::Full) => crate::sync::spin_hint(),
                            Err(e) => panic!("{e:?}"),
                        }
                    }
                }
            });
            let mut next = 0u8;
            while next < 4 {
                match rx.peek().unwrap() {
                    Some(frame) => {
                        assert_eq!(frame, &[next, next]);
                        rx.advance();
                        next += 1;
                    }
                    None => {
                        rx.publish();
                        crate::sync::spin_hint();
                    }
                }
            }
            producer.join().unwrap();
        });
    }

    /// Stamped frames, and unstamped ones whose bytes 16..24 move aside and come back, cross
    /// intact; the consumer's clearing of a put-back mark never hides a later frame.
    #[test]
    fn loom_stamped_and_displaced_frames() {
        model(|| {
            let ring = Arc::new(TestRing::new(2, 32));
            let (mut tx, mut rx) = ring.split();
            let keep = ring.clone();
            let frame = |n: u64| {
                let mut frame = [n as u8; 32];
                frame[8..12].copy_from_slice(&32u32.to_le_bytes());
                // Odd frames stamped, even ones carrying the mark of the next lap's frame.
                let seq = if n % 2 == 1 { n } else { n + 2 };
                frame[16..24].copy_from_slice(&seq.to_le_bytes());
                frame
            };
            let producer = loom::thread::spawn(move || {
                let _keep = keep;
                for n in 1..=4u64 {
                    loop {
                        match tx.push(&frame(n)) {
                            Ok(()) => break,
                            Err(PushError::Full) => crate::sync::spin_hint(),
                            Err(e) => panic!("{e:?}"),
                        }
                    }
                }
            });
            let mut n = 1u64;
            while n <= 4 {
                match rx.peek().unwrap() {
                    Some(got) => {
                        assert_eq!(got, &frame(n)[..]);
                        rx.advance();
                        n += 1;
                    }
                    None => {
                        rx.publish();
                        crate::sync::spin_hint();
                    }
                }
            }
            producer.join().unwrap();
        });
    }

    /// A consumer that announces its sleep and then looks at the ring, against a producer that
    /// pushes and then flushes its wake: in every interleaving, the look finds the frame or the
    /// flush finds the flag (and clears it), so the sleeper is never left waiting for a frame
    /// that is there.
    #[test]
    fn loom_flushed_wakes_are_never_lost() {
        model(|| {
            let ring = Arc::new(TestRing::new(2, 8));
            let (mut tx, mut rx) = ring.split();
            let keep = ring.clone();
            let producer = loom::thread::spawn(move || {
                let _keep = keep;
                tx.push(&[7]).unwrap();
                take_sleeper(&tx.mem().ctl().flags.0.consumer_waiting)
            });
            announce_sleep(&rx.mem().ctl().flags.0.consumer_waiting);
            let saw = rx.peek().unwrap().is_some();
            let woke = producer.join().unwrap();
            assert!(saw || woke, "the frame was missed and no wake-up sent");
            if woke {
                let flag = &rx.mem().ctl().flags.0.consumer_waiting;
                assert_eq!(flag.load(Ordering::Relaxed), 0);
            }
        });
    }

    /// The producer sees a full ring until the consumer publishes, and never a head beyond it.
    #[test]
    fn loom_full_until_published() {
        model(|| {
            let ring = Arc::new(TestRing::new(2, 8));
            let (mut tx, mut rx) = ring.split();
            tx.push(&[1]).unwrap();
            tx.push(&[2]).unwrap();
            let keep = ring.clone();
            let consumer = loom::thread::spawn(move || {
                let _keep = keep;
                assert_eq!(rx.peek().unwrap(), Some(&[1u8][..]));
                rx.advance();
                rx.publish();
            });
            match tx.push(&[3]) {
                Ok(()) | Err(PushError::Full) => {}
                Err(e) => panic!("{e:?}"),
            }
            consumer.join().unwrap();
        });
    }
}
