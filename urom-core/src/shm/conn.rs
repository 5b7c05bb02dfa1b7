//! A shared-memory connection: setup handshake, waiting, peer liveness.
//!
//! Handshake over a connected Unix stream socket:
//!
//! 1. the creator makes the mapping (see `mapping`) and two eventfds (one to wake each side),
//!    then sends a 16-byte hello (`b"UROMHELO"`, version `u32`, reserved `u32`) with the memfd,
//!    its own eventfd and the acceptor's eventfd attached (`SCM_RIGHTS`);
//! 2. the acceptor checks the file (seals, size, header) and its maximum message size, maps it
//!    and answers with a 16-byte ack (`b"UROMACK\0"`, status `u32`, detail `u32`);
//! 3. both keep the socket open and never write to it again: its hang-up is how each side learns
//!    that the other died.
//!
//! Waking: a consumer about to sleep sets its ring's `consumer_waiting` flag, issues a SeqCst
//! fence, checks the ring once more and sleeps in `ppoll` on its eventfd and the socket. The
//! producer checks the flag after each frame (a load from a line nobody writes while both sides
//! are busy) and writes the eventfd only when it is set. The producer does not fence, so a flag
//! set at the very moment of a frame can be missed; the consumer's first sleep is therefore
//! short ([`FIRST_NAP`]): by then any store is visible, the re-check finds the frame, and the
//! next sleep may be as long as the caller's timeout. The same scheme, with `producer_waiting`,
//! wakes a producer waiting for free slots.

use core::fmt;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use urom_wire::MaxMsgSize;

use super::layout::{Layout, ShmLayoutError};
use super::mapping::{self, HugePages, Mapping, OpenError, SysError};
use super::ring::{Consumer, Producer, PushError, RingFlags};
use crate::sync::{AtomicU32, Ordering, fence, spin_hint};
use crate::sys::{self, Woke};
use crate::transport::{
    FrameRecvError, FrameSendError, PeerGoneError, Transport, WaitMode, deadline,
};

const HELLO: [u8; 8] = *b"UROMHELO";
const ACK: [u8; 8] = *b"UROMACK\0";
const HANDSHAKE_VERSION: u32 = 1;
const STATUS_OK: u32 = 0;
const STATUS_BAD_LAYOUT: u32 = 1;
const STATUS_MAX_MSG_SIZE: u32 = 2;
const STATUS_SYSTEM: u32 = 3;

/// Length of the first sleep of a waiting side; see the module documentation.
pub const FIRST_NAP: Duration = Duration::from_micros(200);
/// How many empty polls pass between two looks at the clock.
const PEER_CHECK_EVERY: u32 = 1024;
/// Least time between two checks of the peer's socket (a system call) while polling.
const PEER_CHECK_INTERVAL: Duration = Duration::from_millis(5);
/// Spin iterations between two reads of the clock while spinning.
const CLOCK_EVERY: u32 = 64;

/// Settings of a shared-memory connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShmConfig {
    /// Largest frame; both sides must agree (the acceptor refuses a different one).
    pub max_msg_size: MaxMsgSize,
    /// Slots per direction, a power of two in `MIN_SLOTS..=MAX_SLOTS` (the creator's choice).
    pub slots: u32,
    /// How `wait_*` waits; can be changed later with [`Transport::set_wait_mode`].
    pub wait: WaitMode,
    /// Whether the creator puts the mapping on hugepages.
    pub hugepages: HugePages,
    /// How long the handshake may take.
    pub handshake_timeout: Duration,
}

impl Default for ShmConfig {
    fn default() -> Self {
        Self {
            max_msg_size: MaxMsgSize::DEFAULT,
            slots: 256,
            wait: WaitMode::default(),
            hugepages: HugePages::Auto,
            handshake_timeout: Duration::from_secs(10),
        }
    }
}

/// Why a shared-memory connection could not be set up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShmConnectError {
    /// A system call failed.
    Sys {
        /// The call.
        op: &'static str,
        /// What the OS said.
        errno: Errno,
    },
    /// The mapping the peer offered is unusable.
    Layout(ShmLayoutError),
    /// The two sides were configured with different maximum message sizes.
    MaxMsgSizeMismatch {
        /// This side's maximum message size.
        ours: u32,
        /// The peer's maximum message size.
        theirs: u32,
    },
    /// The peer does not speak this handshake, hung up, or did not answer in time.
    Handshake(&'static str),
    /// The peer could not use our mapping.
    Refused(&'static str),
}

impl fmt::Display for ShmConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShmConnectError::Sys { op, errno } => {
                write!(f, "shared-memory setup failed in {op}: {errno}")
            }
            ShmConnectError::Layout(e) => write!(f, "peer offered a bad shared mapping: {e}"),
            ShmConnectError::MaxMsgSizeMismatch { ours, theirs } => write!(
                f,
                "maximum message size mismatch: this side uses {ours} bytes, the peer {theirs}; \
                 configure both the same"
            ),
            ShmConnectError::Handshake(what) => write!(f, "shared-memory handshake failed: {what}"),
            ShmConnectError::Refused(what) => write!(f, "peer refused the shared mapping: {what}"),
        }
    }
}

impl core::error::Error for ShmConnectError {}

impl From<SysError> for ShmConnectError {
    fn from(e: SysError) -> Self {
        ShmConnectError::Sys {
            op: e.op,
            errno: e.errno,
        }
    }
}

fn sys_err(op: &'static str) -> impl FnOnce(Errno) -> ShmConnectError {
    move |errno| ShmConnectError::Sys { op, errno }
}

fn io_err(op: &'static str) -> impl FnOnce(std::io::Error) -> ShmConnectError {
    move |e| ShmConnectError::Sys {
        op,
        errno: Errno::from_raw(e.raw_os_error().unwrap_or(0)),
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
    tx: Producer,
    rx: Consumer,
    /// A frame returned by `recv` is still lent out.
    holding: bool,
    closed: bool,
    mode: WaitMode,
    max: MaxMsgSize,
    empty_polls: u32,
    last_peer_check: Instant,
    own_wake: OwnedFd,
    peer_wake: OwnedFd,
    socket: UnixStream,
    // Declared last: dropped after the rings that point into it.
    mapping: Mapping,
}

/// A creator's half-done connection: offer sent, ack not yet received.
struct Offer {
    conn: ShmConnection,
}

impl ShmConnection {
    /// Creates the mapping, offers it to the peer on `stream` and waits for its answer.
    pub fn create(stream: UnixStream, config: &ShmConfig) -> Result<Self, ShmConnectError> {
        Self::offer(stream, config)?.finish(config)
    }

    /// Receives the peer's offer on `stream`, checks it and maps it.
    pub fn accept(stream: UnixStream, config: &ShmConfig) -> Result<Self, ShmConnectError> {
        stream
            .set_read_timeout(Some(config.handshake_timeout))
            .map_err(io_err("setsockopt(SO_RCVTIMEO)"))?;
        let mut hello = [0u8; 16];
        let (n, mut fds) =
            sys::recv_with_fds(&stream, &mut hello).map_err(|errno| match errno {
                Errno::EAGAIN => ShmConnectError::Handshake("no offer arrived in time"),
                Errno::EMSGSIZE => ShmConnectError::Handshake("offer carried too many descriptors"),
                errno => ShmConnectError::Sys {
                    op: "recvmsg",
                    errno,
                },
            })?;
        if n == 0 {
            return Err(ShmConnectError::Handshake("peer hung up before offering"));
        }
        if n != hello.len() || hello[..8] != HELLO || fds.len() != 3 {
            return Err(ShmConnectError::Handshake(
                "peer's first message is not a urom shared-memory offer",
            ));
        }
        let version = u32::from_le_bytes([hello[8], hello[9], hello[10], hello[11]]);
        if version != HANDSHAKE_VERSION {
            answer(&stream, STATUS_BAD_LAYOUT, version);
            return Err(ShmConnectError::Layout(ShmLayoutError::Version {
                found: version,
            }));
        }
        let own_wake = fds.pop().unwrap_or_else(|| unreachable!());
        let peer_wake = fds.pop().unwrap_or_else(|| unreachable!());
        let memfd = fds.pop().unwrap_or_else(|| unreachable!());
        let (layout, mapping) = match mapping::open(&memfd) {
            Ok(opened) => opened,
            Err(OpenError::Layout(e)) => {
                answer(&stream, STATUS_BAD_LAYOUT, 0);
                return Err(ShmConnectError::Layout(e));
            }
            Err(OpenError::Sys(e)) => {
                answer(&stream, STATUS_SYSTEM, e.errno as u32);
                return Err(e.into());
            }
        };
        if layout.slot_size != config.max_msg_size.as_u32() {
            answer(&stream, STATUS_MAX_MSG_SIZE, config.max_msg_size.as_u32());
            return Err(ShmConnectError::MaxMsgSizeMismatch {
                ours: config.max_msg_size.as_u32(),
                theirs: layout.slot_size,
            });
        }
        answer(&stream, STATUS_OK, 0);
        Ok(Self::new(
            layout, mapping, 1, own_wake, peer_wake, stream, config,
        ))
    }

    /// Both ends of a connection in this process (over a socket pair), for tests and tools.
    pub fn pair(config: &ShmConfig) -> Result<(Self, Self), ShmConnectError> {
        let (a, b) = UnixStream::pair().map_err(io_err("socketpair"))?;
        let offer = Self::offer(a, config)?;
        let accepted = Self::accept(b, config)?;
        Ok((offer.finish(config)?, accepted))
    }

    fn offer(stream: UnixStream, config: &ShmConfig) -> Result<Offer, ShmConnectError> {
        let layout =
            Layout::new(config.max_msg_size, config.slots).map_err(ShmConnectError::Layout)?;
        let (memfd, mapping) = mapping::create(&layout, config.hugepages)?;
        let creator_wake = sys::wake_event().map_err(sys_err("eventfd"))?;
        let acceptor_wake = sys::wake_event().map_err(sys_err("eventfd"))?;
        let mut hello = [0u8; 16];
        hello[..8].copy_from_slice(&HELLO);
        hello[8..12].copy_from_slice(&HANDSHAKE_VERSION.to_le_bytes());
        sys::send_with_fds(
            &stream,
            &hello,
            &[memfd.as_fd(), creator_wake.as_fd(), acceptor_wake.as_fd()],
        )
        .map_err(|errno| match errno {
            Errno::EPIPE | Errno::ECONNRESET => {
                ShmConnectError::Handshake("peer hung up before the offer")
            }
            errno => ShmConnectError::Sys {
                op: "sendmsg",
                errno,
            },
        })?;
        Ok(Offer {
            conn: Self::new(
                layout,
                mapping,
                0,
                creator_wake,
                acceptor_wake,
                stream,
                config,
            ),
        })
    }

    fn new(
        layout: Layout,
        mapping: Mapping,
        side: usize,
        own_wake: OwnedFd,
        peer_wake: OwnedFd,
        socket: UnixStream,
        config: &ShmConfig,
    ) -> Self {
        let rings = mapping.rings(&layout);
        Self {
            tx: Producer::new(rings[side]),
            rx: Consumer::new(rings[1 - side]),
            holding: false,
            closed: false,
            mode: config.wait,
            max: config.max_msg_size,
            empty_polls: 0,
            last_peer_check: Instant::now(),
            own_wake,
            peer_wake,
            socket,
            mapping,
        }
    }

    /// Whether the mapping sits on hugepages.
    pub fn on_hugepages(&self) -> bool {
        self.mapping.huge()
    }

    /// Ends this side as if its process had died (no close flag): the peer sees
    /// [`PeerGoneError::Died`]. For tests.
    pub fn simulate_crash(mut self) {
        self.closed = true;
        let _ = self.socket.shutdown(std::net::Shutdown::Both);
    }

    fn tx_flags(&self) -> &RingFlags {
        &self.tx.mem().ctl().flags.0
    }

    fn rx_flags(&self) -> &RingFlags {
        &self.rx.mem().ctl().flags.0
    }

    /// Wakes the peer if `flag` says it sleeps; clears the flag so one wake-up suffices.
    #[inline]
    fn wake_if(&self, flag: &AtomicU32) {
        if flag.load(Ordering::Relaxed) != 0 && flag.swap(0, Ordering::Relaxed) != 0 {
            sys::wake(self.peer_wake.as_fd());
        }
    }

    fn closed_by_peer(&self) -> bool {
        self.rx_flags().producer_closed.load(Ordering::Acquire) != 0
            || self.tx_flags().consumer_closed.load(Ordering::Acquire) != 0
    }

    /// Whether the peer closed or died, asking the socket.
    fn peer_gone(&self) -> Option<PeerGoneError> {
        if self.closed_by_peer() {
            Some(PeerGoneError::Closed)
        } else if sys::hung_up(self.socket.as_fd()) {
            // Closing sets the flags before hanging up.
            Some(if self.closed_by_peer() {
                PeerGoneError::Closed
            } else {
                PeerGoneError::Died
            })
        } else {
            None
        }
    }

    /// [`Self::peer_gone`], but asks the socket at most every [`PEER_CHECK_INTERVAL`].
    fn peer_gone_now_and_then(&mut self) -> Option<PeerGoneError> {
        let now = Instant::now();
        if now.duration_since(self.last_peer_check) < PEER_CHECK_INTERVAL {
            return self.closed_by_peer().then_some(PeerGoneError::Closed);
        }
        self.last_peer_check = now;
        self.peer_gone()
    }

    fn release_held(&mut self) {
        if self.holding {
            self.holding = false;
            if self.rx.advance() {
                self.wake_if(&self.rx_flags().producer_waiting);
            }
        }
    }

    /// Called when nothing is ready: publishes our head, notices a peer that is gone (only
    /// after everything it sent has been received).
    fn idle(&mut self) -> Result<(), FrameRecvError> {
        if self.rx.publish() {
            self.wake_if(&self.rx_flags().producer_waiting);
        }
        let gone = if self.rx_flags().producer_closed.load(Ordering::Acquire) != 0 {
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
            Some(how) if !self.rx.ready() => Err(FrameRecvError::PeerGone(how)),
            _ => Ok(()),
        }
    }

    /// Sleeps on our eventfd and the socket until woken, hung up or `end`; `flag` is set
    /// meanwhile so that the peer wakes us, and `ready` says whether the wait is over.
    fn sleep_until(&mut self, end: Option<Instant>, what: Waiting) -> Result<bool, FrameRecvError> {
        let mut arm = true;
        let result = loop {
            if arm {
                self.wait_flag(what).store(1, Ordering::Relaxed);
                fence(Ordering::SeqCst);
            }
            if self.ready(what)? {
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
            match sys::sleep(self.own_wake.as_fd(), self.socket.as_fd(), nap) {
                Woke::Event => {
                    sys::drain(self.own_wake.as_fd());
                    arm = true;
                }
                Woke::HangUp => {
                    if self.ready(what)? {
                        break Ok(true);
                    }
                    let how = if self.closed_by_peer() {
                        PeerGoneError::Closed
                    } else {
                        PeerGoneError::Died
                    };
                    break Err(FrameRecvError::PeerGone(how));
                }
                Woke::Timeout => {}
            }
        };
        self.wait_flag(what).store(0, Ordering::Relaxed);
        result
    }

    /// Spins until `ready` or `until`; checks the peer now and then.
    fn spin_until(
        &mut self,
        until: Option<Instant>,
        what: Waiting,
    ) -> Result<bool, FrameRecvError> {
        let mut i = 0u32;
        loop {
            if self.ready(what)? {
                return Ok(true);
            }
            i = i.wrapping_add(1);
            if i % CLOCK_EVERY == 0 && until.is_some_and(|u| Instant::now() >= u) {
                return Ok(false);
            }
            if i % PEER_CHECK_EVERY == 0 {
                if let Some(how) = self.peer_gone_now_and_then() {
                    return if self.ready(what)? {
                        Ok(true)
                    } else {
                        Err(FrameRecvError::PeerGone(how))
                    };
                }
            }
            spin_hint();
        }
    }

    /// Spins, then (in adaptive mode) sleeps, until `ready` or the timeout.
    fn wait_for(&mut self, timeout: Duration, what: Waiting) -> Result<bool, FrameRecvError> {
        let start = Instant::now();
        let end = deadline(start, timeout);
        match self.mode {
            WaitMode::BusyPoll => self.spin_until(end, what),
            WaitMode::Adaptive { spin } => {
                let spin_end = deadline(start, spin.min(timeout));
                if self.spin_until(spin_end, what)? {
                    return Ok(true);
                }
                self.sleep_until(end, what)
            }
        }
    }
}

/// What a side waits for.
#[derive(Clone, Copy)]
enum Waiting {
    /// A frame to receive.
    ForFrame,
    /// A free slot to send into.
    ForSlot,
}

impl ShmConnection {
    /// The flag that tells the peer we sleep waiting for `what`.
    fn wait_flag(&self, what: Waiting) -> &AtomicU32 {
        match what {
            Waiting::ForFrame => &self.rx_flags().consumer_waiting,
            Waiting::ForSlot => &self.tx_flags().producer_waiting,
        }
    }

    /// Whether the wait for `what` is over; `Err` once the peer is gone (for frames: with
    /// nothing left to receive).
    fn ready(&mut self, what: Waiting) -> Result<bool, FrameRecvError> {
        match what {
            Waiting::ForFrame => {
                if self.rx.ready() {
                    return Ok(true);
                }
                self.idle()?;
                Ok(self.rx.ready())
            }
            Waiting::ForSlot => {
                if self.tx_flags().consumer_closed.load(Ordering::Acquire) != 0 {
                    return Err(FrameRecvError::PeerGone(PeerGoneError::Closed));
                }
                self.tx
                    .has_space()
                    .map_err(|c| FrameRecvError::Protocol(c.0))
            }
        }
    }
}

fn to_send_error(e: FrameRecvError) -> FrameSendError {
    match e {
        FrameRecvError::Closed => FrameSendError::Closed,
        FrameRecvError::PeerGone(how) => FrameSendError::PeerGone(how),
        FrameRecvError::Protocol(what) => FrameSendError::Protocol(what),
    }
}

impl Offer {
    /// Waits for the acceptor's answer.
    fn finish(self, config: &ShmConfig) -> Result<ShmConnection, ShmConnectError> {
        let conn = self.conn;
        conn.socket
            .set_read_timeout(Some(config.handshake_timeout))
            .map_err(io_err("setsockopt(SO_RCVTIMEO)"))?;
        let mut ack = [0u8; 16];
        let n = match sys::recv_with_fds(&conn.socket, &mut ack) {
            Ok((n, _)) => n,
            Err(Errno::EAGAIN) => {
                return Err(ShmConnectError::Handshake("peer did not answer in time"));
            }
            Err(errno) => {
                return Err(ShmConnectError::Sys {
                    op: "recvmsg",
                    errno,
                });
            }
        };
        if n == 0 {
            return Err(ShmConnectError::Handshake(
                "peer hung up without answering the offer",
            ));
        }
        if n != ack.len() || ack[..8] != ACK {
            return Err(ShmConnectError::Handshake(
                "peer's answer is not a urom shared-memory ack",
            ));
        }
        let status = u32::from_le_bytes([ack[8], ack[9], ack[10], ack[11]]);
        let detail = u32::from_le_bytes([ack[12], ack[13], ack[14], ack[15]]);
        match status {
            STATUS_OK => Ok(conn),
            STATUS_MAX_MSG_SIZE => Err(ShmConnectError::MaxMsgSizeMismatch {
                ours: conn.max.as_u32(),
                theirs: detail,
            }),
            STATUS_BAD_LAYOUT => Err(ShmConnectError::Refused(
                "it found the layout invalid (different urom versions?)",
            )),
            _ => Err(ShmConnectError::Refused(
                "it could not map the file (out of memory or address space?)",
            )),
        }
    }
}

/// Sends the acceptor's answer; a failure shows up on the creator's side.
fn answer(stream: &UnixStream, status: u32, detail: u32) {
    let mut ack = [0u8; 16];
    ack[..8].copy_from_slice(&ACK);
    ack[8..12].copy_from_slice(&status.to_le_bytes());
    ack[12..16].copy_from_slice(&detail.to_le_bytes());
    let _ = sys::send_with_fds(stream, &ack, &[]);
}

impl Transport for ShmConnection {
    fn max_msg_size(&self) -> MaxMsgSize {
        self.max
    }

    #[inline]
    fn send(&mut self, frame: &[u8]) -> Result<(), FrameSendError> {
        if self.closed {
            return Err(FrameSendError::Closed);
        }
        if self.tx_flags().consumer_closed.load(Ordering::Relaxed) != 0 {
            return Err(FrameSendError::PeerGone(PeerGoneError::Closed));
        }
        match self.tx.push(frame) {
            Ok(()) => {
                self.wake_if(&self.tx_flags().consumer_waiting);
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

    #[inline]
    fn recv(&mut self) -> Result<Option<&[u8]>, FrameRecvError> {
        if self.closed {
            return Err(FrameRecvError::Closed);
        }
        self.release_held();
        if !self.rx.ready() {
            self.idle()?;
            if !self.rx.ready() {
                return Ok(None);
            }
        }
        let frame = self.rx.peek().map_err(|c| FrameRecvError::Protocol(c.0))?;
        self.holding = frame.is_some();
        Ok(frame)
    }

    fn wait_recv(&mut self, timeout: Duration) -> Result<bool, FrameRecvError> {
        if self.closed {
            return Err(FrameRecvError::Closed);
        }
        self.release_held();
        self.wait_for(timeout, Waiting::ForFrame)
    }

    fn wait_send(&mut self, timeout: Duration) -> Result<bool, FrameSendError> {
        if self.closed {
            return Err(FrameSendError::Closed);
        }
        self.wait_for(timeout, Waiting::ForSlot)
            .map_err(to_send_error)
    }

    fn set_wait_mode(&mut self, mode: WaitMode) {
        self.mode = mode;
    }

    fn check_peer(&mut self) -> Result<(), PeerGoneError> {
        match self.peer_gone() {
            Some(how) => Err(how),
            None => Ok(()),
        }
    }

    fn close(&mut self) {
        if self.closed {
            return;
        }
        self.closed = true;
        self.tx_flags().producer_closed.store(1, Ordering::Release);
        self.rx_flags().consumer_closed.store(1, Ordering::Release);
        sys::wake(self.peer_wake.as_fd());
        let _ = self.socket.shutdown(std::net::Shutdown::Both);
    }
}

impl Drop for ShmConnection {
    fn drop(&mut self) {
        self.close();
    }
}
