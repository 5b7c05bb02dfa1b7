//! Waiting for the peer and waking it.
//!
//! Each ring has two eventfds: one its consumer sleeps on, one its producer sleeps on, so each
//! half of a connection sleeps on an eventfd of its own and the two halves may wait at the same
//! time, on different threads.
//!
//! A half about to sleep sets its flag in the ring (`consumer_waiting` or `producer_waiting`),
//! issues a SeqCst fence, checks the ring once more and sleeps in `ppoll` on its eventfd and the
//! socket. The other side checks the flag after each frame it publishes or releases (a load from
//! a line nobody writes while both sides are busy) and writes the eventfd only when the flag is
//! set. That side does not fence, so a flag set at the very moment of a frame can be missed; the
//! first sleep is therefore short ([`FIRST_NAP`]): by then any store is visible, the re-check
//! finds the frame, and the next sleep may be as long as the caller's timeout. A sender that
//! defers its wakes issues one per burst instead, after a fence of its own
//! ([`take_sleeper`]), which no sleeper can miss.
//!
//! The socket carries nothing after the handshake: its hang-up is how a side learns that the
//! other died without closing.

use std::cell::Cell;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use super::ring::{announce_sleep, take_sleeper};
use crate::sync::{AtomicU32, Ordering, spin_hint};
use crate::sys::{self, Woke};
use crate::{FrameRecvError, PeerGoneError, WaitMode, deadline};

/// Length of the first sleep of a waiting side; see the module documentation.
pub const FIRST_NAP: Duration = Duration::from_micros(200);
/// How many empty polls pass between two looks at the clock.
pub(super) const PEER_CHECK_EVERY: u32 = 1024;
/// Least time between two checks of the peer's socket (a system call) while polling.
const PEER_CHECK_INTERVAL: Duration = Duration::from_millis(5);
/// Spin iterations between two reads of the clock while spinning.
const CLOCK_EVERY: u32 = 64;

/// The waiting and waking state of one half of a connection.
pub(super) struct Signals {
    /// The eventfd this half sleeps on; the peer writes it.
    own: OwnedFd,
    /// The eventfd the peer's half across the same ring sleeps on.
    peer: OwnedFd,
    mode: WaitMode,
    last_peer_check: Cell<Instant>,
}

impl Signals {
    pub(super) fn new(own: OwnedFd, peer: OwnedFd, mode: WaitMode) -> Self {
        Self {
            own,
            peer,
            mode,
            last_peer_check: Cell::new(Instant::now()),
        }
    }

    pub(super) fn set_mode(&mut self, mode: WaitMode) {
        self.mode = mode;
    }

    /// Wakes the peer if `flag` says it sleeps; clears the flag so one wake-up suffices.
    #[inline]
    pub(super) fn wake_peer_if(&self, flag: &AtomicU32) {
        if flag.load(Ordering::Relaxed) != 0 && flag.swap(0, Ordering::Relaxed) != 0 {
            self.wake_peer();
        }
    }

    /// [`Signals::wake_peer_if`] after a full fence: see [`take_sleeper`].
    #[inline]
    pub(super) fn flush_wake(&self, flag: &AtomicU32) {
        if take_sleeper(flag) {
            self.wake_peer();
        }
    }

    /// The eventfd this half sleeps on.
    pub(super) fn own_fd(&self) -> BorrowedFd<'_> {
        self.own.as_fd()
    }

    /// Consumes a wake-up that came.
    pub(super) fn drain_own(&self) {
        sys::drain(self.own.as_fd());
    }

    /// Wakes the peer's half whatever it is doing (closing).
    pub(super) fn wake_peer(&self) {
        sys::wake(self.peer.as_fd());
    }
}

/// A half that waits: the sender for a free slot, the receiver for a frame.
pub(super) trait Half {
    /// Whether the wait is over; `Err` once the peer is gone (for frames: with nothing left to
    /// receive).
    fn ready(&mut self) -> Result<bool, FrameRecvError>;
    /// The flag in the ring that tells the peer this half sleeps.
    fn sleeping_flag(&self) -> &AtomicU32;
    /// Whether the peer closed its end of this half's ring.
    fn closed_by_peer(&self) -> bool;
    fn signals(&self) -> &Signals;
    /// The handshake socket, whose hang-up means the peer is gone.
    fn socket(&self) -> BorrowedFd<'_>;

    /// Whether the peer closed or died, asking the socket.
    fn peer_gone(&self) -> Option<PeerGoneError> {
        if self.closed_by_peer() {
            Some(PeerGoneError::Closed)
        } else if sys::hung_up(self.socket()) {
            // Closing sets the flags before hanging up.
            Some(self.how_gone())
        } else {
            None
        }
    }

    /// [`Half::peer_gone`], but asks the socket at most every [`PEER_CHECK_INTERVAL`].
    fn peer_gone_now_and_then(&self) -> Option<PeerGoneError> {
        let now = Instant::now();
        let last = &self.signals().last_peer_check;
        if now.duration_since(last.get()) < PEER_CHECK_INTERVAL {
            return self.closed_by_peer().then_some(PeerGoneError::Closed);
        }
        last.set(now);
        self.peer_gone()
    }

    /// How a peer whose socket hung up went away.
    fn how_gone(&self) -> PeerGoneError {
        if self.closed_by_peer() {
            PeerGoneError::Closed
        } else {
            PeerGoneError::Died
        }
    }
}

/// Spins, then (in adaptive mode) sleeps, until `half` is ready or the timeout passes.
pub(super) fn wait_for<H: Half>(half: &mut H, timeout: Duration) -> Result<bool, FrameRecvError> {
    let start = Instant::now();
    let end = deadline(start, timeout);
    match half.signals().mode {
        WaitMode::BusyPoll => spin_until(half, end),
        WaitMode::Adaptive { spin } => {
            let spin_end = deadline(start, spin.min(timeout));
            if spin_until(half, spin_end)? {
                return Ok(true);
            }
            sleep_until(half, end)
        }
    }
}

/// Spins until `half` is ready or `until`; checks the peer now and then.
fn spin_until<H: Half>(half: &mut H, until: Option<Instant>) -> Result<bool, FrameRecvError> {
    let mut i = 0u32;
    loop {
        if half.ready()? {
            return Ok(true);
        }
        i = i.wrapping_add(1);
        if i % CLOCK_EVERY == 0 && until.is_some_and(|u| Instant::now() >= u) {
            return Ok(false);
        }
        if i % PEER_CHECK_EVERY == 0 {
            if let Some(how) = half.peer_gone_now_and_then() {
                return if half.ready()? {
                    Ok(true)
                } else {
                    Err(FrameRecvError::PeerGone(how))
                };
            }
        }
        spin_hint();
    }
}

/// Sleeps on the half's eventfd and the socket until ready, hung up or `end`; the half's flag
/// is set meanwhile so that the peer wakes it.
fn sleep_until<H: Half>(half: &mut H, end: Option<Instant>) -> Result<bool, FrameRecvError> {
    let mut arm = true;
    let result = loop {
        if arm {
            announce_sleep(half.sleeping_flag());
        }
        if half.ready()? {
            break Ok(true);
        }
        let now = Instant::now();
        let left = match end {
            Some(end) if now >= end => break Ok(false),
            Some(end) => Some(end - now),
            None => None,
        };
        let nap = if arm {
            Some(left.map_or(FIRST_NAP, |l| l.min(FIRST_NAP)))
        } else {
            left
        };
        arm = false;
        let own = half.signals().own.as_fd();
        match sys::sleep(own, half.socket(), nap) {
            Woke::Event => {
                sys::drain(own);
                arm = true;
            }
            Woke::HangUp => {
                if half.ready()? {
                    break Ok(true);
                }
                break Err(FrameRecvError::PeerGone(half.how_gone()));
            }
            Woke::Timeout => {}
        }
    };
    half.sleeping_flag().store(0, Ordering::Relaxed);
    result
}
