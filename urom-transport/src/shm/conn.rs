//! A shared-memory connection and its two halves.

use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use urom_wire::MaxMsgSize;

use super::handshake::{self, Agreed, ShmConnectError};
use super::mapping::Mapping;
use super::ring::{Consumer, Producer, PushError, RingFlags};
use super::wait::{self, Half, PEER_CHECK_EVERY, Signals};
use crate::sync::{AtomicU32, Ordering};
use crate::{
    Armed, ChannelConfig, FrameReceiver, FrameRecvError, FrameSendError, FrameSender, HalfControl,
    PeerGoneError, ReadAhead, Transport, WaitMode,
};

/// What both halves of one side share: the mapping their rings live in and the socket whose
/// hang-up tells that the peer is gone. Dropped, and the peer told, once both halves are.
struct Link {
    socket: UnixStream,
    mapping: Mapping,
}

/// A connection offered to the peer whose answer has not been read yet
/// ([`ShmConnection::offer`]).
pub struct ShmOffer {
    offered: handshake::Offered,
    config: ChannelConfig,
}

impl ShmOffer {
    /// The socket the answer comes on: readable once it came or the peer hung up.
    pub fn socket(&self) -> BorrowedFd<'_> {
        self.offered.socket()
    }

    /// Reads the peer's answer (waiting for it at most the handshake timeout) and sets the
    /// connection up.
    pub fn finish(self) -> Result<ShmConnection, ShmConnectError> {
        let agreed = self.offered.finish(&self.config)?;
        Ok(ShmConnection::new(agreed, &self.config))
    }
}

/// One end of a shared-memory connection between two processes on one machine.
///
/// Frames are copied into a slot on send; `recv` lends the slot itself (no copy) until the next
/// `recv` or `wait_recv`. The peer's obligation is not to write a slot it has published until
/// it is released; every index and length it writes is checked, so a peer that breaks the
/// protocol gets [`FrameRecvError::Protocol`] or garbage bytes, never an out-of-bounds access.
/// Decode a received frame once (as `urom_wire` parsers do) rather than re-reading fields you
/// already validated.
///
/// Choose busy polling ([`WaitMode::BusyPoll`]) on a core of its own; the default adaptive
/// mode spins for a few microseconds, then sleeps.
pub struct ShmConnection {
    tx: ShmSender,
    rx: ShmReceiver,
}

/// The sending half of a [`ShmConnection`]: the producer of one ring.
pub struct ShmSender {
    ring: Producer,
    signals: Signals,
    max: MaxMsgSize,
    /// `send` leaves waking the peer to `flush_wakes`.
    defer_wakes: bool,
    closed: bool,
    link: Arc<Link>,
}

/// The receiving half of a [`ShmConnection`]: the consumer of the other ring.
pub struct ShmReceiver {
    ring: Consumer,
    signals: Signals,
    /// A frame returned by `recv` is still lent out.
    holding: bool,
    empty_polls: u32,
    closed: bool,
    link: Arc<Link>,
}

impl ShmConnection {
    /// Reads the peer's request on `stream`, creates the mapping of the size it asked for,
    /// offers it and waits for its answer.
    pub fn create(stream: UnixStream, config: &ChannelConfig) -> Result<Self, ShmConnectError> {
        Self::offer(stream, config)?.finish()
    }

    /// Reads the peer's request on `stream` (waiting at most the handshake timeout: call it
    /// once `stream` is readable), creates the mapping of the size it asked for and offers it
    /// without waiting for the answer: [`ShmOffer::finish`] reads it, at once when
    /// [`ShmOffer::socket`] is readable. One thread may so set up many connections, none
    /// waiting on another's peer.
    pub fn offer(stream: UnixStream, config: &ChannelConfig) -> Result<ShmOffer, ShmConnectError> {
        Ok(ShmOffer {
            offered: handshake::offer(stream, config)?,
            config: *config,
        })
    }

    /// Receives the peer's offer on `stream`, checks it and maps it.
    pub fn accept(stream: UnixStream, config: &ChannelConfig) -> Result<Self, ShmConnectError> {
        Ok(Self::new(handshake::accept(stream, config)?, config))
    }

    /// Both ends of a connection in this process (over a socket pair), for tests and tools.
    pub fn pair(config: &ChannelConfig) -> Result<(Self, Self), ShmConnectError> {
        let (a, b) = UnixStream::pair().map_err(|e| ShmConnectError::Sys {
            op: "socketpair",
            errno: nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(0)),
        })?;
        handshake::request(&b, config)?;
        let offered = handshake::offer(a, config)?;
        let accepted = handshake::accept_offer(b, config)?;
        let created = offered.finish(config)?;
        Ok((Self::new(created, config), Self::new(accepted, config)))
    }

    fn new(agreed: Agreed, config: &ChannelConfig) -> Self {
        let Agreed {
            layout,
            mapping,
            side,
            wakes,
            socket,
        } = agreed;
        let rings = mapping.rings(&layout);
        let link = Arc::new(Link { socket, mapping });
        let [out, inbound] = if side == 0 {
            wakes.rings
        } else {
            let [a, b] = wakes.rings;
            [b, a]
        };
        // Each half sleeps on its own role's eventfd and wakes the peer's opposite role.
        let (out_consumer, out_producer) = out;
        let (in_consumer, in_producer) = inbound;
        Self {
            tx: ShmSender {
                ring: Producer::new(rings[side]),
                signals: Signals::new(out_producer, out_consumer, config.wait),
                max: config.max_msg_size,
                defer_wakes: false,
                closed: false,
                link: Arc::clone(&link),
            },
            rx: ShmReceiver {
                ring: Consumer::new(rings[1 - side]),
                signals: Signals::new(in_consumer, in_producer, config.wait),
                holding: false,
                empty_polls: 0,
                closed: false,
                link,
            },
        }
    }

    /// Whether the mapping sits on hugepages.
    pub fn on_hugepages(&self) -> bool {
        self.tx.link.mapping.huge()
    }

    /// Ends this side as if its process had died (no close flag): the peer sees
    /// [`PeerGoneError::Died`]. For tests.
    pub fn simulate_crash(mut self) {
        self.tx.crash();
        self.rx.crash();
    }
}

impl Link {
    /// Hangs up as a dying process would, without closing the rings.
    fn crash(&self) {
        let _ = self.socket.shutdown(std::net::Shutdown::Both);
    }
}

impl Transport for ShmConnection {
    type Sender = ShmSender;
    type Receiver = ShmReceiver;

    #[inline]
    fn split(&mut self) -> (&mut ShmSender, &mut ShmReceiver) {
        (&mut self.tx, &mut self.rx)
    }

    fn into_split(self) -> (ShmSender, ShmReceiver) {
        (self.tx, self.rx)
    }

    fn max_msg_size(&self) -> MaxMsgSize {
        self.tx.max
    }
}

/// The controls both halves have; `$closed` is the ring flag by which the half says it closed.
macro_rules! half_control {
    ($half:ty, $closed:ident) => {
        impl HalfControl for $half {
            fn check_peer(&self) -> Result<(), PeerGoneError> {
                self.peer_gone().map_or(Ok(()), Err)
            }

            fn set_wait_mode(&mut self, mode: WaitMode) {
                self.signals.set_mode(mode);
            }

            fn close(&mut self) {
                if !self.closed {
                    self.closed = true;
                    self.flags().$closed.store(1, Ordering::Release);
                    self.signals.wake_peer();
                }
            }
        }

        impl $half {
            /// Ends this side as if its process had died. For tests.
            pub(crate) fn crash(&mut self) {
                self.closed = true;
                self.link.crash();
            }

            #[inline]
            fn flags(&self) -> &RingFlags {
                &self.ring.mem().ctl().flags.0
            }
        }

        impl Drop for $half {
            fn drop(&mut self) {
                self.close();
            }
        }
    };
}

half_control!(ShmSender, producer_closed);
half_control!(ShmReceiver, consumer_closed);

impl Half for ShmSender {
    fn ready(&mut self) -> Result<bool, FrameRecvError> {
        if self.flags().consumer_closed.load(Ordering::Acquire) != 0 {
            return Err(FrameRecvError::PeerGone(PeerGoneError::Closed));
        }
        self.ring
            .has_space()
            .map_err(|c| FrameRecvError::Protocol(c.0))
    }

    fn sleeping_flag(&self) -> &AtomicU32 {
        &self.flags().producer_waiting
    }

    fn closed_by_peer(&self) -> bool {
        self.flags().consumer_closed.load(Ordering::Acquire) != 0
    }

    fn signals(&self) -> &Signals {
        &self.signals
    }

    fn socket(&self) -> BorrowedFd<'_> {
        self.link.socket.as_fd()
    }
}

impl FrameSender for ShmSender {
    fn max_msg_size(&self) -> MaxMsgSize {
        self.max
    }

    #[inline]
    fn send(&mut self, frame: &[u8]) -> Result<(), FrameSendError> {
        if self.closed {
            return Err(FrameSendError::Closed);
        }
        if self.flags().consumer_closed.load(Ordering::Relaxed) != 0 {
            return Err(FrameSendError::PeerGone(PeerGoneError::Closed));
        }
        match self.ring.push(frame) {
            Ok(()) => {
                if !self.defer_wakes {
                    self.signals.wake_peer_if(&self.flags().consumer_waiting);
                }
                Ok(())
            }
            Err(PushError::Full) => match self.peer_gone() {
                Some(how) => Err(FrameSendError::PeerGone(how)),
                None => Err(FrameSendError::Full),
            },
            Err(PushError::TooLarge) => Err(FrameSendError::TooLarge {
                len: frame.len(),
                max: self.max.as_u32(),
            }),
            Err(PushError::Corrupt(c)) => Err(FrameSendError::Protocol(c.0)),
        }
    }

    fn wait_send(&mut self, timeout: Duration) -> Result<bool, FrameSendError> {
        if self.closed {
            return Err(FrameSendError::Closed);
        }
        wait::wait_for(self, timeout).map_err(|e| match e {
            FrameRecvError::Closed => FrameSendError::Closed,
            FrameRecvError::PeerGone(how) => FrameSendError::PeerGone(how),
            FrameRecvError::Protocol(what) => FrameSendError::Protocol(what),
        })
    }

    #[inline]
    fn next_seq(&self) -> u64 {
        self.ring.next_seq()
    }

    fn defer_wakes(&mut self, defer: bool) {
        self.defer_wakes = defer;
    }

    #[inline]
    fn flush_wakes(&mut self) {
        self.signals.flush_wake(&self.flags().consumer_waiting);
    }
}

impl ShmReceiver {
    // Inlined into `recv` in the caller's crate (the host, the worker) on every frame.
    #[inline]
    fn release_held(&mut self) {
        if self.holding {
            self.holding = false;
            if self.ring.advance() {
                self.signals.wake_peer_if(&self.flags().producer_waiting);
            }
        }
    }

    /// Called when nothing is ready: publishes our head, notices a peer that is gone (only
    /// after everything it sent has been received).
    fn idle(&mut self) -> Result<(), FrameRecvError> {
        if self.ring.publish() {
            self.signals.wake_peer_if(&self.flags().producer_waiting);
        }
        let gone = if self.closed_by_peer() {
            Some(PeerGoneError::Closed)
        } else {
            self.empty_polls = self.empty_polls.wrapping_add(1);
            if self.empty_polls % PEER_CHECK_EVERY == 0 {
                self.peer_gone_now_and_then()
            } else {
                None
            }
        };
        match gone {
            Some(how) if !self.ring.ready() => Err(FrameRecvError::PeerGone(how)),
            _ => Ok(()),
        }
    }
}

impl Half for ShmReceiver {
    fn ready(&mut self) -> Result<bool, FrameRecvError> {
        if self.ring.ready() {
            return Ok(true);
        }
        self.idle()?;
        Ok(self.ring.ready())
    }

    fn sleeping_flag(&self) -> &AtomicU32 {
        &self.flags().consumer_waiting
    }

    fn closed_by_peer(&self) -> bool {
        self.flags().producer_closed.load(Ordering::Acquire) != 0
    }

    fn signals(&self) -> &Signals {
        &self.signals
    }

    fn socket(&self) -> BorrowedFd<'_> {
        self.link.socket.as_fd()
    }
}

impl FrameReceiver for ShmReceiver {
    #[inline]
    fn recv(&mut self) -> Result<Option<&[u8]>, FrameRecvError> {
        if self.closed {
            return Err(FrameRecvError::Closed);
        }
        self.release_held();
        if !self.ring.ready() {
            self.idle()?;
            if !self.ring.ready() {
                return Ok(None);
            }
        }
        let frame = self
            .ring
            .peek()
            .map_err(|c| FrameRecvError::Protocol(c.0))?;
        self.holding = frame.is_some();
        Ok(frame)
    }

    /// One pass over the ring: each frame's mark is looked at once, and each frame is
    /// released as soon as `each` returns (the head published once per quarter ring, and when
    /// the pass finds the ring empty, as `recv` does).
    #[inline]
    fn recv_each<F>(&mut self, limit: usize, mut each: F) -> Result<usize, FrameRecvError>
    where
        F: FnMut(&[u8]) -> bool,
    {
        if self.closed {
            return Err(FrameRecvError::Closed);
        }
        self.release_held();
        let mut handed = 0;
        let mut looked_again = false;
        while handed < limit {
            let Some(frame) = self
                .ring
                .peek()
                .map_err(|c| FrameRecvError::Protocol(c.0))?
            else {
                // Empty: publish the head, notice a peer that is gone; look once more only
                // when nothing came yet (a frame may have arrived meanwhile).
                self.idle()?;
                if handed > 0 || looked_again {
                    break;
                }
                looked_again = true;
                continue;
            };
            handed += 1;
            let more = each(frame);
            if self.ring.advance() {
                self.signals.wake_peer_if(&self.flags().producer_waiting);
            }
            if !more {
                // The caller stops taking frames for a while (a host whose notifications
                // wait, say): every slot released so far goes back to the producer now, not
                // when a quarter of the ring has been read.
                if self.ring.publish() {
                    self.signals.wake_peer_if(&self.flags().producer_waiting);
                }
                break;
            }
        }
        Ok(handed)
    }

    fn wait_recv(&mut self, timeout: Duration) -> Result<bool, FrameRecvError> {
        if self.closed {
            return Err(FrameRecvError::Closed);
        }
        self.release_held();
        wait::wait_for(self, timeout)
    }

    fn arm(&mut self) -> Result<Armed, FrameRecvError> {
        if self.closed {
            return Err(FrameRecvError::Closed);
        }
        self.release_held();
        let flag = self.sleeping_flag();
        let fresh = flag.load(Ordering::Relaxed) == 0;
        if fresh {
            super::ring::announce_sleep(flag);
        }
        match self.ready() {
            Ok(false) => Ok(Armed::Armed { fresh }),
            Ok(true) | Err(FrameRecvError::PeerGone(_)) => {
                self.sleeping_flag().store(0, Ordering::Relaxed);
                self.signals.drain_own();
                Ok(Armed::Ready)
            }
            Err(e) => Err(e),
        }
    }

    fn wake_fds(&self) -> [Option<BorrowedFd<'_>>; 2] {
        [Some(self.signals.own_fd()), Some(self.link.socket.as_fd())]
    }

    /// Consumes the wake-up that came, if any. The flag stays set until the peer's next frame
    /// clears it, so that arming again is not fresh and the next sleep may be long.
    fn disarm(&mut self) {
        self.signals.drain_own();
    }

    fn set_read_ahead(&mut self, read_ahead: ReadAhead) {
        self.ring.set_read_ahead(read_ahead);
    }
}
