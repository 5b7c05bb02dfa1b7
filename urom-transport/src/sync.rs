//! The atomics every ring uses, in one place so that loom can stand in for them.
//!
//! Built with `RUSTFLAGS="--cfg loom"`, these names resolve to loom's model-checked types and
//! the ring's index logic runs under loom's scheduler (see `shm::ring`'s loom tests).

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

/// Tells the CPU (or loom's scheduler) that this thread is spinning.
#[inline(always)]
pub(crate) fn spin_hint() {
    #[cfg(not(loom))]
    std::hint::spin_loop();
    #[cfg(loom)]
    loom::thread::yield_now();
}
