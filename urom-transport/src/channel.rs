//! The one place that chooses a transport: [`Channel`], a connection over whichever transport
//! reaches the peer.
//!
//! The host, the worker and the GPU offload programs hold channels; they never name a transport.
//! Dispatch is a `match` per call, which the branch predictor makes free on a hot path that always
//! takes the same arm.

use core::fmt;
use std::os::fd::BorrowedFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use urom_wire::MaxMsgSize;
use urom_wire::control::EndpointKind;

use super::loopback::{LoopbackConnection, LoopbackReceiver, LoopbackSender};
use super::shm::{HugePages, MIN_SLOTS, ShmConnectError, ShmConnection, ShmReceiver, ShmSender};
#[cfg(feature = "ucx")]
use super::ucx::{UcxConnectError, UcxConnection, UcxReceiver, UcxSender};
use super::{
    Armed, FrameReceiver, FrameRecvError, FrameSendError, FrameSender, HalfControl, PeerGoneError,
    ReadAhead, Transport, WaitMode,
};

/// Settings of a channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelConfig {
    /// Largest frame; both sides must agree (the accepting side refuses a different one).
    pub max_msg_size: MaxMsgSize,
    /// Slots per direction, a power of two in `shm::MIN_SLOTS..=shm::MAX_SLOTS`. Over shared
    /// memory the accepting side asks for this many (a host: enough for the tasks it keeps in
    /// flight, [`ChannelConfig::slots_for_inflight`]) and the offering side gives at most its
    /// own. [`ChannelConfig::slots_for`] the maximum message size by default.
    pub slots: u32,
    /// How `wait_*` waits; can be changed later with [`Transport::set_wait_mode`].
    pub wait: WaitMode,
    /// Whether the offering side puts a shared mapping on hugepages.
    pub hugepages: HugePages,
    /// How long the setup may take.
    pub handshake_timeout: Duration,
}

impl Default for ChannelConfig {
    fn default() -> Self {
        Self {
            max_msg_size: MaxMsgSize::DEFAULT,
            slots: Self::slots_for(MaxMsgSize::DEFAULT),
            wait: WaitMode::default(),
            hugepages: HugePages::Auto,
            handshake_timeout: Duration::from_secs(10),
        }
    }
}

impl ChannelConfig {
    /// Bytes of slot space per direction that [`ChannelConfig::slots_for`] aims for: 64 MiB.
    pub const RING_BUDGET: usize = 64 << 20;
    /// Most slots per direction that [`ChannelConfig::slots_for`] gives.
    pub const MOST_SLOTS: u32 = 256;

    /// The default settings for frames of at most `max_msg_size` bytes, with
    /// [`ChannelConfig::slots_for`] that size.
    pub fn new(max_msg_size: MaxMsgSize) -> Self {
        Self {
            max_msg_size,
            slots: Self::slots_for(max_msg_size),
            ..Self::default()
        }
    }

    /// Slots per direction for a peer that keeps at most `inflight` commands in flight, with
    /// frames of at most `max` bytes: `inflight` rounded up to a power of two, at least
    /// `shm::MIN_SLOTS` and at most [`ChannelConfig::slots_for`] `max`. A host never has more
    /// commands in its ring than it has in flight, so more slots would only hold memory.
    pub const fn slots_for_inflight(max: MaxMsgSize, inflight: u32) -> u32 {
        let most = Self::slots_for(max);
        if inflight >= most {
            most
        } else if inflight <= MIN_SLOTS {
            MIN_SLOTS
        } else {
            inflight.next_power_of_two()
        }
    }

    /// Slots per direction for frames of at most `max` bytes: as many as fit in
    /// [`ChannelConfig::RING_BUDGET`], clamped to `shm::MIN_SLOTS..=`[`ChannelConfig::MOST_SLOTS`]
    /// and rounded down to a power of two. 256 up to 256 KiB, 64 at 1 MiB, 4 at 16 MiB; a
    /// shared-memory connection then maps about `2 * slots * max` bytes (128 MiB at most), well
    /// within what an accepting side agrees to map.
    pub const fn slots_for(max: MaxMsgSize) -> u32 {
        let fit = Self::RING_BUDGET / max.get();
        let slots = if fit >= Self::MOST_SLOTS as usize {
            Self::MOST_SLOTS
        } else if fit <= MIN_SLOTS as usize {
            MIN_SLOTS
        } else {
            fit as u32
        };
        1 << (u32::BITS - 1 - slots.leading_zeros())
    }
}

/// Why a channel could not be set up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConnectError {
    /// The peer's address could not be reached.
    Unreachable {
        /// The address, as text.
        address: String,
        /// What the OS said.
        errno: nix::errno::Errno,
    },
    /// The peer's address is not one this build can use.
    BadAddress(&'static str),
    /// The peer offered a kind of endpoint this build does not speak.
    Unsupported(EndpointKind),
    /// The shared-memory setup failed.
    Shm(ShmConnectError),
    /// The UCX setup failed.
    #[cfg(feature = "ucx")]
    Ucx(UcxConnectError),
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unreachable { address, errno } => write!(
                f,
                "{address}: {}",
                std::io::Error::from_raw_os_error(*errno as i32)
            ),
            Self::BadAddress(what) => write!(f, "unusable address: {what}"),
            Self::Unsupported(kind) => {
                write!(
                    f,
                    "the peer offers a {kind:?} endpoint, which this build does not speak"
                )
            }
            Self::Shm(e) => write!(f, "{e}"),
            #[cfg(feature = "ucx")]
            Self::Ucx(e) => write!(f, "{e}"),
        }
    }
}

impl core::error::Error for ConnectError {}

impl From<ShmConnectError> for ConnectError {
    fn from(e: ShmConnectError) -> Self {
        Self::Shm(e)
    }
}

#[cfg(feature = "ucx")]
impl From<UcxConnectError> for ConnectError {
    fn from(e: UcxConnectError) -> Self {
        Self::Ucx(e)
    }
}

/// A connection over whichever transport reaches the peer.
pub struct Channel {
    tx: ChannelSender,
    rx: ChannelReceiver,
}

/// The sending half of a [`Channel`].
pub enum ChannelSender {
    /// Over shared memory.
    Shm(ShmSender),
    /// Within this process.
    Loopback(LoopbackSender),
    /// Over UCX, to this or another machine.
    #[cfg(feature = "ucx")]
    Ucx(UcxSender),
}

/// The receiving half of a [`Channel`].
pub enum ChannelReceiver {
    /// Over shared memory.
    Shm(ShmReceiver),
    /// Within this process.
    Loopback(LoopbackReceiver),
    /// Over UCX, to this or another machine.
    #[cfg(feature = "ucx")]
    Ucx(UcxReceiver),
}

/// Runs `$body` with `$half` bound to the transport's own half, whichever it is.
macro_rules! each_half {
    ($value:expr, $half:ident => $body:expr) => {
        match $value {
            Self::Shm($half) => $body,
            Self::Loopback($half) => $body,
            #[cfg(feature = "ucx")]
            Self::Ucx($half) => $body,
        }
    };
}

impl Channel {
    /// Sets up a channel on a connected Unix socket as the offering side (which creates the
    /// shared memory: the worker, the GPU offload server).
    pub fn offer(stream: UnixStream, config: &ChannelConfig) -> Result<Self, ConnectError> {
        Ok(ShmConnection::create(stream, config)?.into())
    }

    /// Sets up a channel on a connected Unix socket as the accepting side.
    pub fn accept(stream: UnixStream, config: &ChannelConfig) -> Result<Self, ConnectError> {
        Ok(ShmConnection::accept(stream, config)?.into())
    }

    /// Connects to the endpoint a peer announced (a worker's spawn result) and accepts its
    /// offer.
    ///
    /// For [`EndpointKind::Ucx`] (feature `ucx`) the address is the text `IP:PORT` of a UCX
    /// listener (`192.0.2.7:4000`, `[2001:db8::7]:4000`), or else the bytes of its worker's UCX
    /// address.
    pub fn connect(
        endpoint: EndpointKind,
        address: &[u8],
        config: &ChannelConfig,
    ) -> Result<Self, ConnectError> {
        match endpoint {
            EndpointKind::UnixSocket => {
                let path = std::str::from_utf8(address)
                    .map_err(|_| ConnectError::BadAddress("the socket path is not UTF-8"))?;
                let stream = connect_unix(Path::new(path))?;
                Self::accept(stream, config)
            }
            #[cfg(feature = "ucx")]
            EndpointKind::Ucx => {
                let listener = std::str::from_utf8(address)
                    .ok()
                    .and_then(|text| text.parse::<std::net::SocketAddr>().ok());
                let conn = match listener {
                    Some(addr) => UcxConnection::connect(addr, config)?,
                    None if address.is_empty() => {
                        return Err(ConnectError::BadAddress("the UCX address is empty"));
                    }
                    None => UcxConnection::connect_worker(address, config)?,
                };
                Ok(conn.into())
            }
            other => Err(ConnectError::Unsupported(other)),
        }
    }
}

impl Channel {
    /// Sets up a UCX channel through `door`, a stream on which both sides already proved who
    /// they are (`ucx::UcxConnection::connect_through`); without the `ucx` feature, an error.
    pub fn connect_through(
        door: &mut (super::stream::StreamReader, super::stream::StreamWriter),
        config: &ChannelConfig,
    ) -> Result<Self, ConnectError> {
        #[cfg(feature = "ucx")]
        return Ok(UcxConnection::connect_through(door, config)?.into());
        #[cfg(not(feature = "ucx"))]
        {
            let _ = (door, config);
            Err(ConnectError::Unsupported(EndpointKind::UcxSealed))
        }
    }

    /// Ends this side as if its process had died: the peer sees [`PeerGoneError::Died`]. For
    /// tests.
    pub fn simulate_crash(mut self) {
        match &mut self.tx {
            ChannelSender::Shm(half) => half.crash(),
            ChannelSender::Loopback(half) => half.end(PeerGoneError::Died),
            #[cfg(feature = "ucx")]
            ChannelSender::Ucx(half) => half.crash(),
        }
        match &mut self.rx {
            ChannelReceiver::Shm(half) => half.crash(),
            ChannelReceiver::Loopback(half) => half.end(PeerGoneError::Died),
            #[cfg(feature = "ucx")]
            ChannelReceiver::Ucx(half) => half.crash(),
        }
    }
}

fn connect_unix(path: &Path) -> Result<UnixStream, ConnectError> {
    UnixStream::connect(path).map_err(|e| ConnectError::Unreachable {
        address: path.display().to_string(),
        errno: nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(0)),
    })
}

impl From<ShmConnection> for Channel {
    fn from(conn: ShmConnection) -> Self {
        let (tx, rx) = conn.into_split();
        Self {
            tx: ChannelSender::Shm(tx),
            rx: ChannelReceiver::Shm(rx),
        }
    }
}

#[cfg(feature = "ucx")]
impl From<UcxConnection> for Channel {
    fn from(conn: UcxConnection) -> Self {
        let (tx, rx) = conn.into_split();
        Self {
            tx: ChannelSender::Ucx(tx),
            rx: ChannelReceiver::Ucx(rx),
        }
    }
}

impl From<LoopbackConnection> for Channel {
    fn from(conn: LoopbackConnection) -> Self {
        let (tx, rx) = conn.into_split();
        Self {
            tx: ChannelSender::Loopback(tx),
            rx: ChannelReceiver::Loopback(rx),
        }
    }
}

impl Transport for Channel {
    type Sender = ChannelSender;
    type Receiver = ChannelReceiver;

    #[inline]
    fn split(&mut self) -> (&mut ChannelSender, &mut ChannelReceiver) {
        (&mut self.tx, &mut self.rx)
    }

    fn into_split(self) -> (ChannelSender, ChannelReceiver) {
        (self.tx, self.rx)
    }

    fn max_msg_size(&self) -> MaxMsgSize {
        self.tx.max_msg_size()
    }
}

/// Each half's controls, passed on to the transport's own half.
macro_rules! half_control {
    ($($half:ident),+) => {$(
        impl HalfControl for $half {
            fn check_peer(&self) -> Result<(), PeerGoneError> {
                each_half!(self, half => half.check_peer())
            }

            fn set_wait_mode(&mut self, mode: WaitMode) {
                each_half!(self, half => half.set_wait_mode(mode))
            }

            fn close(&mut self) {
                each_half!(self, half => half.close())
            }
        }
    )+};
}

half_control!(ChannelSender, ChannelReceiver);

impl FrameSender for ChannelSender {
    #[inline]
    fn max_msg_size(&self) -> MaxMsgSize {
        each_half!(self, half => half.max_msg_size())
    }

    #[inline]
    fn send(&mut self, frame: &[u8]) -> Result<(), FrameSendError> {
        each_half!(self, half => half.send(frame))
    }

    fn wait_send(&mut self, timeout: Duration) -> Result<bool, FrameSendError> {
        each_half!(self, half => half.wait_send(timeout))
    }

    #[inline]
    fn next_seq(&self) -> u64 {
        each_half!(self, half => half.next_seq())
    }

    fn defer_wakes(&mut self, defer: bool) {
        each_half!(self, half => half.defer_wakes(defer))
    }

    #[inline]
    fn flush_wakes(&mut self) {
        each_half!(self, half => half.flush_wakes())
    }

    #[inline]
    fn cork(&mut self) {
        each_half!(self, half => half.cork())
    }

    #[inline]
    fn uncork(&mut self) -> Result<(), FrameSendError> {
        each_half!(self, half => half.uncork())
    }
}

impl FrameReceiver for ChannelReceiver {
    #[inline]
    fn recv(&mut self) -> Result<Option<&[u8]>, FrameRecvError> {
        each_half!(self, half => half.recv())
    }

    #[inline]
    fn recv_arrived(&mut self) -> Result<Option<&[u8]>, FrameRecvError> {
        each_half!(self, half => half.recv_arrived())
    }

    #[inline]
    fn recv_each<F>(&mut self, limit: usize, each: F) -> Result<usize, FrameRecvError>
    where
        F: FnMut(&[u8]) -> bool,
    {
        each_half!(self, half => half.recv_each(limit, each))
    }

    fn wait_recv(&mut self, timeout: Duration) -> Result<bool, FrameRecvError> {
        each_half!(self, half => half.wait_recv(timeout))
    }

    fn arm(&mut self) -> Result<Armed, FrameRecvError> {
        each_half!(self, half => half.arm())
    }

    fn wake_fds(&self) -> [Option<BorrowedFd<'_>>; 2] {
        each_half!(self, half => half.wake_fds())
    }

    fn disarm(&mut self) {
        each_half!(self, half => half.disarm())
    }

    fn set_read_ahead(&mut self, read_ahead: ReadAhead) {
        each_half!(self, half => half.set_read_ahead(read_ahead))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn larger_messages_get_fewer_slots() {
        let slots = |max: u32| ChannelConfig::new(MaxMsgSize::new(max).unwrap()).slots;
        assert_eq!(ChannelConfig::default().slots, 256);
        assert_eq!(slots(MaxMsgSize::MIN), 256);
        assert_eq!(slots(4096), 256);
        assert_eq!(slots(256 << 10), 256);
        assert_eq!(slots((256 << 10) + 1), 128);
        assert_eq!(slots(1 << 20), 64);
        assert_eq!(slots(3 << 20), 16);
        assert_eq!(slots(4 << 20), 16);
        assert_eq!(slots(MaxMsgSize::MAX), 4);
    }

    /// With wakes deferred, sends leave an armed receiver asleep until `flush_wakes`, which
    /// wakes it once; a receiver that is not armed costs the flush no wake-up.
    #[test]
    fn deferred_wakes_come_once_per_flush() {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let woken = |rx: &ChannelReceiver| {
            let [Some(fd), _] = rx.wake_fds() else {
                panic!("a shared-memory half has a wake-up descriptor")
            };
            let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
            poll(&mut fds, PollTimeout::ZERO).unwrap() == 1
        };
        let (a, b) = ShmConnection::pair(&ChannelConfig::default()).unwrap();
        let (mut a, mut b) = (Channel::from(a), Channel::from(b));
        a.split().0.defer_wakes(true);
        let rx = b.split().1;
        assert_eq!(rx.arm().unwrap(), Armed::Armed { fresh: true });
        a.send(b"one").unwrap();
        a.send(b"two").unwrap();
        assert!(!woken(b.split().1), "a deferred send woke the receiver");
        a.split().0.flush_wakes();
        assert!(
            woken(b.split().1),
            "the flush did not wake the armed receiver"
        );
        b.split().1.disarm();
        assert_eq!(b.recv().unwrap(), Some(&b"one"[..]));
        assert_eq!(b.recv().unwrap(), Some(&b"two"[..]));
        // Not armed: the flush finds nobody asleep.
        a.send(b"three").unwrap();
        a.split().0.flush_wakes();
        assert!(!woken(b.split().1));
        assert_eq!(b.recv().unwrap(), Some(&b"three"[..]));
    }

    /// Every maximum message size a daemon or worker accepts gives a channel that carries
    /// frames of that size.
    #[test]
    fn every_allowed_message_size_makes_a_working_channel() {
        for max in [
            MaxMsgSize::MIN,
            4096,
            (1 << 20) + 1,
            4 << 20,
            (16 << 20) - 1,
            MaxMsgSize::MAX,
        ] {
            let config = ChannelConfig::new(MaxMsgSize::new(max).unwrap());
            let (mut offering, mut accepting) =
                ShmConnection::pair(&config).unwrap_or_else(|e| panic!("-m {max}: {e}"));
            let frame = vec![0x5a; max as usize];
            offering.send(&frame).unwrap();
            assert_eq!(accepting.recv().unwrap(), Some(&frame[..]), "-m {max}");
        }
    }
}
