//! How frames and bytes move between urom's processes.
//!
//! A [`Transport`] is one connection to one peer, made of two halves: a [`FrameSender`] and a
//! [`FrameReceiver`]. Frames are opaque byte strings of at most the connection's [`MaxMsgSize`];
//! the transport neither parses nor allocates them. The halves can be borrowed together
//! ([`Transport::split`]) so that a received frame is processed in place while answers go out
//! on the other half, or taken apart for good ([`Transport::into_split`]).
//!
//! Implementations:
//! * [`shm`]: two processes on one machine, rings in a shared mapping;
//! * `ucx` (feature `ucx`): a peer on this or another machine, over UCX; beside it the
//!   plugin-facing helpers for peer workers and remote host memory;
//! * [`loopback`]: both ends in one process, for tests;
//! * [`Channel`]: whichever of them reaches the peer; the host, the worker and the GPU offload
//!   programs hold channels and never name a transport;
//! * [`stream`]: a Unix socket or a channel as a byte stream, for the control protocol, and
//!   [`record`]: that stream with a MAC on every message once both sides are proven.
//!
//! Beside them: [`auth`] (how a remote host and the service prove to each other that they share
//! a secret), [`sys`] (the descriptor helpers every layer above sleeps and wakes with) and, with
//! the `mpi` feature, `mpi` (MPI's non-blocking allgather, for the host's out-of-band
//! collective).
//!
//! The same conformance suite (`tests/conformance.rs`) runs against each transport.
//!
//! Every call is non-blocking except the two `wait_*` methods, which take a timeout. A peer
//! that closes or dies is reported as [`PeerGoneError`], after every frame it sent before has
//! been received.
//!
//! Unsafe code lives only in `shm`, `ucx`, `sys` and `mpi`.
#![deny(unsafe_code)]
// Under loom only the ring and its atomics are built and tested.
#![cfg_attr(loom, allow(dead_code, unused_imports))]

use core::fmt;
use std::os::fd::BorrowedFd;
use std::time::Duration;

use urom_wire::MaxMsgSize;

#[cfg(not(loom))]
pub mod auth;
#[cfg(not(loom))]
mod channel;
#[cfg(not(loom))]
pub mod loopback;
#[cfg(feature = "mpi")]
#[allow(unsafe_code)]
pub mod mpi;
#[cfg(not(loom))]
pub mod record;
#[cfg(not(loom))]
#[allow(unsafe_code)]
pub mod shm;
#[cfg(not(loom))]
pub mod stream;
mod sync;
#[cfg(not(loom))]
#[allow(unsafe_code)]
pub mod sys;
#[cfg(feature = "ucx")]
#[allow(unsafe_code)]
pub mod ucx;
// Under loom, the ring alone, model-checked.
#[cfg(loom)]
#[allow(unsafe_code)]
#[path = "shm/ring.rs"]
mod ring;

#[cfg(not(loom))]
pub use channel::{Channel, ChannelConfig, ChannelReceiver, ChannelSender, ConnectError};
#[cfg(not(loom))]
pub use shm::ReadAhead;

/// What either half of a connection can be asked besides moving frames.
pub trait HalfControl {
    /// Whether the peer is still there: `Err` once it closed or died. Cheap enough to call
    /// from a progress loop now and then, not on every frame.
    fn check_peer(&self) -> Result<(), PeerGoneError>;

    /// Chooses how this half's `wait_*` method waits.
    fn set_wait_mode(&mut self, mode: WaitMode);

    /// Closes this half's direction: the peer receives what was sent before, then learns that
    /// this end is gone. Later calls on this half fail with `Closed`. Dropping a half closes
    /// it.
    fn close(&mut self);
}

/// The sending half of a connection.
pub trait FrameSender: HalfControl {
    /// The largest frame this connection carries, agreed with the peer at connect time.
    fn max_msg_size(&self) -> MaxMsgSize;

    /// Queues one frame for the peer without blocking.
    ///
    /// When every slot is taken the frame is refused with [`FrameSendError::Full`] and stays
    /// the caller's: send it again after [`FrameSender::wait_send`] or after doing other work.
    fn send(&mut self, frame: &[u8]) -> Result<(), FrameSendError>;

    /// Waits until a frame can be sent (`Ok(true)`) or `timeout` passes (`Ok(false)`).
    fn wait_send(&mut self, timeout: Duration) -> Result<bool, FrameSendError>;

    /// The number of the next frame this half sends, counting from 1 (0 where the transport
    /// does not count). A urom frame whose header carries this number in its `seq` field
    /// travels in the fewest cache lines over shared memory: it is its own ready mark.
    fn next_seq(&self) -> u64 {
        0
    }

    /// Stops (`true`) or resumes (`false`) [`FrameSender::send`] waking a sleeping peer
    /// itself. With wakes deferred, a burst of sends costs the peer at most one wake-up,
    /// issued by [`FrameSender::flush_wakes`], which the caller must call after each burst.
    /// Transports whose frames reach a waiting peer by themselves ignore this.
    fn defer_wakes(&mut self, defer: bool) {
        let _ = defer;
    }

    /// Holds the frames sent from now on until [`FrameSender::uncork`], so that a transport
    /// that pays per message (UCX: a call into the network stack and a packet each) sends a
    /// burst as one. Each frame still takes its credit at `send`. A corked sender sends what
    /// it holds before it answers [`FrameSendError::Full`] and before `wait_send` waits, so a
    /// burst larger than the credits never holds itself up. Transports whose frames reach the
    /// peer one by one at no extra cost (shared memory) ignore this.
    fn cork(&mut self) {}

    /// Sends the frames held since [`FrameSender::cork`] and stops holding them. An error
    /// means the peer can no longer receive them, as from `send`.
    fn uncork(&mut self) -> Result<(), FrameSendError> {
        Ok(())
    }

    /// Wakes the peer if it sleeps (or is about to) waiting for a frame: a system call only
    /// then, none while the peer is busy. It orders every frame sent before it against the
    /// peer's going to sleep with a full fence, so a peer that armed at the very moment of the
    /// last send is woken too: when its sender calls this after every burst, a receiver never
    /// misses a frame and may sleep long from its first sleep on (see [`Armed::Armed`]).
    fn flush_wakes(&mut self) {}
}

/// The receiving half of a connection.
pub trait FrameReceiver: HalfControl {
    /// The next received frame, if one is there, without blocking.
    ///
    /// The frame stays valid until the next call to `recv` or `wait_recv`, which hand its
    /// space back to the peer. `Ok(None)` means nothing has arrived yet; once the peer closed or
    /// died and every frame it sent has been received, this returns
    /// [`FrameRecvError::PeerGone`].
    fn recv(&mut self) -> Result<Option<&[u8]>, FrameRecvError>;

    /// The next frame that has already arrived, like [`FrameReceiver::recv`] but without
    /// asking the network for more: for the rest of a batch after `recv` returned a frame.
    /// `Ok(None)` then means only that nothing more arrived with it; the next `recv` looks
    /// again. Where looking costs nothing (shared memory) this is `recv`; over UCX it spares
    /// the call into the network stack that would only find nothing more.
    #[inline]
    fn recv_arrived(&mut self) -> Result<Option<&[u8]>, FrameRecvError> {
        self.recv()
    }

    /// Hands every frame that has arrived, up to `limit`, to `each` in order, looking for the
    /// first like [`FrameReceiver::recv`] and taking the rest like
    /// [`FrameReceiver::recv_arrived`]; stops after a frame for which `each` returns `false`.
    /// Returns how many frames it handed; each is released once `each` returns. An error ends
    /// the pass after the frames handed before it (whom `each` saw).
    ///
    /// Over shared memory this is one pass over the ring: one look at each frame's ready mark
    /// and no per-frame bookkeeping of a lent frame.
    #[inline]
    fn recv_each<F>(&mut self, limit: usize, mut each: F) -> Result<usize, FrameRecvError>
    where
        Self: Sized,
        F: FnMut(&[u8]) -> bool,
    {
        let mut handed = 0;
        while handed < limit {
            let frame = if handed == 0 {
                self.recv()?
            } else {
                self.recv_arrived()?
            };
            let Some(frame) = frame else { break };
            handed += 1;
            if !each(frame) {
                break;
            }
        }
        Ok(handed)
    }

    /// Waits until a frame can be received (`Ok(true)`) or `timeout` passes (`Ok(false)`).
    ///
    /// Releases the frame returned by the last `recv`, like `recv` does. How it waits (spin or
    /// sleep) follows [`Transport::set_wait_mode`].
    fn wait_recv(&mut self, timeout: Duration) -> Result<bool, FrameRecvError>;

    /// Asks the peer to make this half's [`FrameReceiver::wake_fds`] readable when the next
    /// frame arrives or it goes away, so that a caller can sleep on them among other
    /// descriptors (the progress engine's notification). Undo with
    /// [`FrameReceiver::disarm`] once awake. Halves without wake descriptors answer
    /// [`Armed::Unsupported`].
    fn arm(&mut self) -> Result<Armed, FrameRecvError> {
        Ok(Armed::Unsupported)
    }

    /// The descriptors an armed half's peer makes readable (or hangs up).
    fn wake_fds(&self) -> [Option<BorrowedFd<'_>>; 2] {
        [None, None]
    }

    /// Consumes the wake-up that came, if any (the peer may still wake the descriptors once
    /// more, which costs it one system call).
    fn disarm(&mut self) {}

    /// Sets how far ahead of the next frame this half fetches ([`ReadAhead::Near`] unless
    /// set); a hint, which transports without a ring ignore.
    #[cfg(not(loom))]
    fn set_read_ahead(&mut self, read_ahead: ReadAhead) {
        let _ = read_ahead;
    }
}

/// How a receiving half stands after [`FrameReceiver::arm`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Armed {
    /// A frame, or the peer's end, is there already: receive instead of sleeping.
    Ready,
    /// The peer will wake the half's descriptors. `fresh`: the half was not armed before, and
    /// a frame sent at this very moment may not wake it, so the first sleep should be short
    /// (at most [`shm::FIRST_NAP`]); after that, wake-ups are never missed. A peer that calls
    /// [`FrameSender::flush_wakes`] after its sends never misses a fresh half either.
    Armed {
        /// Armed just now.
        fresh: bool,
    },
    /// This half has no wake descriptors; poll it again soon instead.
    Unsupported,
}

/// One connection to one peer: a sending and a receiving half.
///
/// The frame-moving methods here borrow the matching half; use [`Transport::split`] to hold a
/// received frame while sending.
pub trait Transport {
    /// The sending half.
    type Sender: FrameSender;
    /// The receiving half.
    type Receiver: FrameReceiver;

    /// Both halves at once, e.g. to answer a received frame without copying it first.
    fn split(&mut self) -> (&mut Self::Sender, &mut Self::Receiver);

    /// Takes the connection apart. Each half closes its direction when dropped; the peer learns
    /// that this end is gone once both are.
    fn into_split(self) -> (Self::Sender, Self::Receiver)
    where
        Self: Sized;

    /// The largest frame this connection carries, agreed with the peer at connect time.
    fn max_msg_size(&self) -> MaxMsgSize;

    /// Chooses how the `wait_*` methods wait.
    fn set_wait_mode(&mut self, mode: WaitMode) {
        let (tx, rx) = self.split();
        tx.set_wait_mode(mode);
        rx.set_wait_mode(mode);
    }

    /// Whether the peer is still there: `Err` once it closed or died. Cheap enough to call
    /// from a progress loop now and then, not on every frame.
    fn check_peer(&mut self) -> Result<(), PeerGoneError> {
        self.split().0.check_peer()
    }

    /// Closes this end: the peer receives what was sent before, then [`PeerGoneError::Closed`].
    /// Later calls on this end fail with `Closed`. Dropping a connection closes it.
    fn close(&mut self) {
        let (tx, rx) = self.split();
        tx.close();
        rx.close();
    }

    /// [`FrameSender::send`] on the sending half.
    #[inline]
    fn send(&mut self, frame: &[u8]) -> Result<(), FrameSendError> {
        self.split().0.send(frame)
    }

    /// [`FrameReceiver::recv`] on the receiving half.
    #[inline]
    fn recv(&mut self) -> Result<Option<&[u8]>, FrameRecvError> {
        self.split().1.recv()
    }

    /// [`FrameReceiver::recv_arrived`] on the receiving half.
    #[inline]
    fn recv_arrived(&mut self) -> Result<Option<&[u8]>, FrameRecvError> {
        self.split().1.recv_arrived()
    }

    /// [`FrameReceiver::wait_recv`] on the receiving half.
    fn wait_recv(&mut self, timeout: Duration) -> Result<bool, FrameRecvError> {
        self.split().1.wait_recv(timeout)
    }

    /// [`FrameSender::wait_send`] on the sending half.
    fn wait_send(&mut self, timeout: Duration) -> Result<bool, FrameSendError> {
        self.split().0.wait_send(timeout)
    }
}

/// How a connection waits for frames or free slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitMode {
    /// Spin on the ring until the timeout, never sleep: lowest latency, one busy core. For
    /// workers pinned to their own cores.
    BusyPoll,
    /// Spin for at most `spin`, then sleep until the peer wakes this end. The peer only pays for
    /// a wake-up (a system call) when this end actually sleeps; an idle connection uses no CPU.
    Adaptive {
        /// How long to spin before going to sleep.
        spin: Duration,
    },
}

impl Default for WaitMode {
    fn default() -> Self {
        WaitMode::Adaptive {
            spin: Duration::from_micros(50),
        }
    }
}

/// Why the peer can no longer be reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerGoneError {
    /// The peer closed the connection.
    Closed,
    /// The peer disappeared without closing: its process died or its socket hung up.
    Died,
}

impl fmt::Display for PeerGoneError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerGoneError::Closed => f.write_str("the peer closed the connection"),
            PeerGoneError::Died => {
                f.write_str("the peer went away without closing (process died or socket hung up)")
            }
        }
    }
}

impl core::error::Error for PeerGoneError {}

/// Why [`Transport::send`] or [`Transport::wait_send`] failed. Never allocates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameSendError {
    /// Every slot towards the peer is taken; the frame was not sent. Retry later.
    Full,
    /// The frame is longer than the connection's maximum message size.
    TooLarge {
        /// Length of the refused frame.
        len: usize,
        /// The connection's maximum message size.
        max: u32,
    },
    /// This end was closed.
    Closed,
    /// The peer closed or died.
    PeerGone(PeerGoneError),
    /// The peer broke the transport protocol (e.g. wrote impossible ring indices); the
    /// connection is unusable.
    Protocol(&'static str),
}

impl fmt::Display for FrameSendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameSendError::Full => {
                f.write_str("the send ring is full: the peer has not consumed earlier frames yet")
            }
            FrameSendError::TooLarge { len, max } => write!(
                f,
                "frame of {len} bytes exceeds the connection's maximum message size of {max} bytes"
            ),
            FrameSendError::Closed => f.write_str("cannot send on a closed connection"),
            FrameSendError::PeerGone(e) => write!(f, "cannot send: {e}"),
            FrameSendError::Protocol(what) => {
                write!(f, "peer broke the transport protocol: {what}")
            }
        }
    }
}

impl core::error::Error for FrameSendError {}

/// Why [`Transport::recv`] or [`Transport::wait_recv`] failed. Never allocates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameRecvError {
    /// This end was closed.
    Closed,
    /// The peer closed or died, and every frame it sent has been received.
    PeerGone(PeerGoneError),
    /// The peer broke the transport protocol (e.g. announced a frame longer than a slot); the
    /// connection is unusable.
    Protocol(&'static str),
}

impl fmt::Display for FrameRecvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameRecvError::Closed => f.write_str("cannot receive on a closed connection"),
            FrameRecvError::PeerGone(e) => write!(f, "nothing more to receive: {e}"),
            FrameRecvError::Protocol(what) => {
                write!(f, "peer broke the transport protocol: {what}")
            }
        }
    }
}

impl core::error::Error for FrameRecvError {}

impl From<PeerGoneError> for FrameSendError {
    fn from(e: PeerGoneError) -> Self {
        FrameSendError::PeerGone(e)
    }
}

impl From<PeerGoneError> for FrameRecvError {
    fn from(e: PeerGoneError) -> Self {
        FrameRecvError::PeerGone(e)
    }
}

/// Deadline `timeout` from `start`; "never" when it does not fit an `Instant`.
pub(crate) fn deadline(start: std::time::Instant, timeout: Duration) -> Option<std::time::Instant> {
    start.checked_add(timeout)
}
