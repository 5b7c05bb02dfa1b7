//! A single-producer single-consumer ring of fixed-size slots in memory shared by two processes.
//!
//! One ring is a control block ([`RingCtl`]) and `count` slots of `stride` bytes (`count` a power
//! of two, `stride` a multiple of [`CACHE_LINE`]):
//!
//! | bytes of a slot        | what                                                       |
//! |------------------------|------------------------------------------------------------|
//! | `0..8`                 | control word: `seq << 32 \| len`, written last (Release)   |
//! | `8..8 + slot_size`     | the frame, `len <= slot_size` bytes of it are meaningful   |
//! | up to `stride`         | padding                                                    |
//!
//! The producer writes the frame, then stores the control word with `seq = position + 1`
//! (truncated to 32 bits) and Release ordering; the consumer loads the control word of the slot
//! at its head with Acquire ordering and owns the frame once `seq` matches. Signal and frame
//! start in the same cache line, so one cache-line transfer delivers both.
//!
//! The consumer publishes its head (how many frames it has released) on its own cache line, in
//! batches of a quarter of the ring and whenever it finds the ring empty; the producer caches it
//! and only reloads it when the cached value says the ring is full. Wait and close flags sit on a
//! third line that is written only when a side goes to sleep or closes.
//!
//! Nothing the peer writes is trusted: a length larger than the slot or a head that moves
//! backwards or past the producer is reported as [`RingCorrupt`], never followed.

use core::ptr::NonNull;

use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// Distance that keeps two fields off each other's cache line, including the adjacent line the
/// hardware prefetcher pulls in with it.
pub(crate) const CACHE_LINE: usize = 128;
/// Bytes of a slot before its frame: the control word.
pub(crate) const SLOT_HEADER: usize = 8;

/// Most slots the producer prefetches ahead of its tail.
const PREFETCH_DISTANCE: u64 = 8;

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

/// Where one ring lives. Copies of it are handed to the producer and the consumer.
#[derive(Clone, Copy)]
pub(crate) struct RingMem {
    // INVARIANTS (from `from_raw`): `ctl` points to a live `RingCtl`; `slots` to `count * stride`
    // live bytes, 8-aligned; `stride >= SLOT_HEADER + slot_size` and a multiple of 8; `mask ==
    // count - 1` with `count` a power of two.
    ctl: NonNull<RingCtl>,
    slots: NonNull<u8>,
    stride: usize,
    mask: u64,
    slot_size: usize,
    #[cfg(loom)]
    ctrls: NonNull<AtomicU64>,
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
    ///   long; `count` is a power of two, `stride` a multiple of 8 and at least
    ///   `SLOT_HEADER + slot_size`;
    /// - at most one [`Producer`] and one [`Consumer`] use the ring at a time (in this process
    ///   or any other), and the memory is touched by nothing else except through atomics.
    pub(crate) unsafe fn from_raw(
        ctl: NonNull<RingCtl>,
        slots: NonNull<u8>,
        count: u32,
        stride: usize,
        slot_size: usize,
        #[cfg(loom)] ctrls: NonNull<AtomicU64>,
        #[cfg(loom)] cells: NonNull<loom::cell::UnsafeCell<()>>,
    ) -> Self {
        debug_assert!(count.is_power_of_two());
        debug_assert!(stride % 8 == 0 && stride >= SLOT_HEADER + slot_size);
        Self {
            ctl,
            slots,
            stride,
            mask: u64::from(count) - 1,
            slot_size,
            #[cfg(loom)]
            ctrls,
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

    /// The control word of the slot holding `position`.
    #[cfg(not(loom))]
    #[inline(always)]
    fn ctrl(&self, position: u64) -> &AtomicU64 {
        let word = self
            .slots
            .as_ptr()
            .wrapping_add(self.slot_offset(position))
            .cast::<AtomicU64>();
        // SAFETY: `word` is a slot start inside the slot area (see `slot_offset`), 8-aligned
        // because `slots` and `stride` are; the first 8 bytes of a slot are only ever accessed as
        // this atomic, by both sides, and stay mapped while `self` is used.
        unsafe { &*word }
    }

    #[cfg(loom)]
    fn ctrl(&self, position: u64) -> &AtomicU64 {
        let word = self
            .ctrls
            .as_ptr()
            .wrapping_add((position & self.mask) as usize);
        // SAFETY: under loom the control words live in their own array of `count` atomics.
        unsafe { &*word }
    }

    /// Pointer to the frame bytes of the slot holding `position`.
    #[inline(always)]
    fn frame_ptr(&self, position: u64) -> *mut u8 {
        // `offset + slot_size <= count * stride` (slot start plus header plus frame fit in a
        // stride), so the result stays inside the slot area.
        self.slots
            .as_ptr()
            .wrapping_add(self.slot_offset(position) + SLOT_HEADER)
    }

    /// Hints the CPU to take the cache line `offset` bytes into the slot holding `position` for
    /// writing.
    #[inline(always)]
    fn prefetch_write(&self, position: u64, offset: usize) {
        #[cfg(all(target_arch = "x86_64", not(loom)))]
        {
            let line = self
                .slots
                .as_ptr()
                .wrapping_add(self.slot_offset(position) + offset);
            // SAFETY: `prefetchw` reads and writes nothing architecturally and never faults,
            // whatever the address (CPUs without it execute it as a no-op).
            unsafe {
                core::arch::asm!("prefetchw [{0}]", in(reg) line, options(nostack, preserves_flags, readonly))
            };
        }
        let _ = (position, offset);
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

    /// Copies `frame` into the next slot and publishes it.
    #[inline]
    pub(crate) fn push(&mut self, frame: &[u8]) -> Result<(), PushError> {
        if frame.len() > self.mem.slot_size {
            return Err(PushError::TooLarge);
        }
        if self.tail - self.cached_head >= self.mem.capacity() && !self.has_space()? {
            return Err(PushError::Full);
        }
        let dst = self.mem.frame_ptr(self.tail);
        #[cfg(loom)]
        self.mem.cell(self.tail).with_mut(|_| ());
        // SAFETY: `dst` has room for `slot_size >= frame.len()` bytes (see `frame_ptr`); the slot
        // is free: the consumer released it (`tail - head < capacity`) and will not read it until
        // the control word below says so; `frame` cannot overlap memory we only reach by pointer.
        unsafe { core::ptr::copy_nonoverlapping(frame.as_ptr(), dst, frame.len()) };
        let seq = (self.tail as u32).wrapping_add(1);
        self.mem.ctrl(self.tail).store(
            (u64::from(seq) << 32) | frame.len() as u64,
            Ordering::Release,
        );
        self.tail += 1;
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

/// The reading side of a ring.
pub(crate) struct Consumer {
    mem: RingMem,
    // INVARIANTS: `published <= head`; `head - published <= batch` after every call returns;
    // slot `head` is the next frame to read.
    head: u64,
    published: u64,
    batch: u64,
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
        }
    }

    pub(crate) fn mem(&self) -> &RingMem {
        &self.mem
    }

    /// The frame at the head, if the producer has published it. The bytes stay the consumer's
    /// until [`Consumer::advance`], which the borrow prevents while the slice lives.
    #[inline]
    pub(crate) fn peek(&self) -> Result<Option<&[u8]>, RingCorrupt> {
        let ctrl = self.mem.ctrl(self.head).load(Ordering::Acquire);
        if (ctrl >> 32) as u32 != (self.head as u32).wrapping_add(1) {
            return Ok(None);
        }
        let len = (ctrl & 0xffff_ffff) as usize;
        if len > self.mem.slot_size {
            return Err(RingCorrupt("a frame is longer than a slot"));
        }
        #[cfg(loom)]
        self.mem.cell(self.head).with(|_| ());
        let src = self.mem.frame_ptr(self.head);
        // SAFETY: `len <= slot_size` bytes from `src` are inside the slot (checked just above);
        // the Acquire load of the control word makes the producer's writes visible, and the
        // producer does not touch the slot again until `advance` releases it, which needs
        // `&mut self` and so cannot happen while the returned slice is borrowed.
        Ok(Some(unsafe { core::slice::from_raw_parts(src, len) }))
    }

    /// Whether a frame is ready at the head.
    #[inline]
    pub(crate) fn ready(&self) -> bool {
        let ctrl = self.mem.ctrl(self.head).load(Ordering::Acquire);
        (ctrl >> 32) as u32 == (self.head as u32).wrapping_add(1)
    }

    /// Releases the frame at the head. Returns whether the head was published and the producer
    /// waits for space (then it needs a wake-up).
    #[inline]
    pub(crate) fn advance(&mut self) -> bool {
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
        ctrls: Box<[AtomicU64]>,
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
            let stride = (SLOT_HEADER + slot_size).next_multiple_of(CACHE_LINE);
            let lines = count as usize * stride / CACHE_LINE;
            Self {
                ctl: Box::new(RingCtl::new()),
                slots: (0..lines).map(|_| Line([0; CACHE_LINE])).collect(),
                #[cfg(loom)]
                ctrls: (0..count).map(|_| AtomicU64::new(0)).collect(),
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
                    NonNull::from(&*self.ctrls).cast(),
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

    #[test]
    fn bad_peer_values_are_errors() {
        let ring = TestRing::new(4, 16);
        let (mut tx, rx) = ring.split();
        // A length beyond the slot with a matching sequence number.
        rx.mem().ctrl(0).store((1 << 32) | 17, Ordering::Relaxed);
        assert!(rx.peek().is_err());
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
