//! The transport conformance suite: every [`Transport`] must pass each of these, unchanged.
//!
//! A transport joins by implementing [`Pair`] and adding one `conformance!` line at the bottom.

use std::time::{Duration, Instant};

use urom_transport::loopback::LoopbackConnection;
use urom_transport::shm::ShmConnection;
use urom_transport::{Channel, ChannelConfig};
use urom_transport::{
    FrameReceiver, FrameRecvError, FrameSendError, FrameSender, PeerGoneError, ReadAhead,
    Transport, WaitMode,
};
use urom_wire::MaxMsgSize;

/// Generous bound for anything that should happen "soon"; never a performance assertion.
const SOON: Duration = Duration::from_secs(20);
/// Slots per direction in every connection of the suite.
const SLOTS: usize = 8;

/// How the suite makes connected pairs of one transport.
trait Pair {
    type Conn: Transport<Sender: Send + 'static, Receiver: Send + 'static> + Send + 'static;
    fn pair(max: MaxMsgSize, slots: usize) -> (Self::Conn, Self::Conn);
    /// Ends `conn` as if its process died.
    fn crash(conn: Self::Conn);
}

struct Loopback;

impl Pair for Loopback {
    type Conn = LoopbackConnection;
    fn pair(max: MaxMsgSize, slots: usize) -> (Self::Conn, Self::Conn) {
        LoopbackConnection::pair(max, slots)
    }
    fn crash(conn: Self::Conn) {
        conn.simulate_crash();
    }
}

struct Shm;

impl Pair for Shm {
    type Conn = ShmConnection;
    fn pair(max: MaxMsgSize, slots: usize) -> (Self::Conn, Self::Conn) {
        let config = ChannelConfig {
            max_msg_size: max,
            slots: slots as u32,
            ..ChannelConfig::default()
        };
        ShmConnection::pair(&config).expect("shared-memory pair")
    }
    fn crash(conn: Self::Conn) {
        conn.simulate_crash();
    }
}

/// Shared memory behind the [`Channel`] every part of urom holds.
struct ChannelOverShm;

impl Pair for ChannelOverShm {
    type Conn = Channel;
    fn pair(max: MaxMsgSize, slots: usize) -> (Self::Conn, Self::Conn) {
        let (a, b) = Shm::pair(max, slots);
        (a.into(), b.into())
    }
    fn crash(conn: Self::Conn) {
        conn.simulate_crash();
    }
}

/// Over UCX (feature `ucx`): both ends in this process, through a listener on 127.0.0.1, on
/// TCP over the loopback interface unless `UCX_TLS` / `UCX_NET_DEVICES` say otherwise.
#[cfg(feature = "ucx")]
struct Ucx;

#[cfg(feature = "ucx")]
impl Pair for Ucx {
    type Conn = urom_transport::ucx::UcxConnection;
    fn pair(max: MaxMsgSize, slots: usize) -> (Self::Conn, Self::Conn) {
        urom_transport::ucx::set_config_defaults(&[("TLS", "tcp"), ("NET_DEVICES", "lo")]);
        let config = ChannelConfig {
            max_msg_size: max,
            slots: slots as u32,
            ..ChannelConfig::default()
        };
        Self::Conn::pair(&config).unwrap_or_else(|e| panic!("UCX pair: {e}"))
    }
    fn crash(conn: Self::Conn) {
        conn.simulate_crash();
    }
}

/// UCX behind the [`Channel`].
#[cfg(feature = "ucx")]
struct ChannelOverUcx;

#[cfg(feature = "ucx")]
impl Pair for ChannelOverUcx {
    type Conn = Channel;
    fn pair(max: MaxMsgSize, slots: usize) -> (Self::Conn, Self::Conn) {
        let (a, b) = Ucx::pair(max, slots);
        (a.into(), b.into())
    }
    fn crash(conn: Self::Conn) {
        conn.simulate_crash();
    }
}

fn pattern(seq: u32, len: usize) -> impl Iterator<Item = u8> {
    (0..len).map(move |i| (seq as usize * 31 + i * 7) as u8)
}

fn frame(seq: u32, len: usize, buf: &mut [u8]) -> &[u8] {
    buf[..4].copy_from_slice(&seq.to_le_bytes());
    for (b, v) in buf[4..len].iter_mut().zip(pattern(seq, len)) {
        *b = v;
    }
    &buf[..len]
}

fn check(seq: u32, got: &[u8], len: usize) {
    assert_eq!(got.len(), len, "frame {seq}: length");
    assert_eq!(got[..4], seq.to_le_bytes(), "frame {seq}: sequence number");
    assert!(
        got[4..].iter().zip(pattern(seq, len)).all(|(a, b)| *a == b),
        "frame {seq}: contents"
    );
}

/// Receives one frame, waiting for it.
fn recv_one<C: Transport>(conn: &mut C, out: &mut Vec<u8>) -> Result<(), FrameRecvError> {
    let start = Instant::now();
    loop {
        if let Some(f) = conn.recv()? {
            out.clear();
            out.extend_from_slice(f);
            return Ok(());
        }
        assert!(start.elapsed() < SOON, "no frame arrived");
        conn.wait_recv(SOON)?;
    }
}

fn len_for(seq: u32, max: usize) -> usize {
    4 + (seq as usize * 977) % (max - 3)
}

fn in_order_and_intact<P: Pair>() {
    let max = MaxMsgSize::new(512).unwrap();
    let (mut a, mut b) = P::pair(max, SLOTS);
    assert_eq!(a.max_msg_size(), max);
    let mut buf = vec![0u8; 512];
    let mut got = Vec::new();
    let mut sent = 0u32;
    let mut received = 0u32;
    while received < 1000 {
        // Send bursts of varying size, then drain some.
        for _ in 0..(received % 11) {
            let len = len_for(sent, 512);
            match a.send(frame(sent, len, &mut buf)) {
                Ok(()) => sent += 1,
                Err(FrameSendError::Full) => break,
                Err(e) => panic!("send: {e}"),
            }
        }
        if sent == received {
            let len = len_for(sent, 512);
            a.send(frame(sent, len, &mut buf)).unwrap();
            sent += 1;
        }
        recv_one(&mut b, &mut got).unwrap();
        check(received, &got, len_for(received, 512));
        received += 1;
    }
}

/// `recv_each` hands the frames that arrived in order and intact, at most `limit` of them,
/// stops after the frame its closure refuses more after, releases a frame `recv` still lent,
/// and loses none as a ring of `slots` fills and wraps lap after lap, with the receiver
/// fetching `read_ahead` (far differs from near only in a ring of more than 16 slots).
fn batched_receive<P: Pair>(slots: usize, read_ahead: ReadAhead) {
    let max = MaxMsgSize::new(512).unwrap();
    let (mut a, mut b) = P::pair(max, slots);
    b.split().1.set_read_ahead(read_ahead);
    let mut buf = vec![0u8; 512];
    let (mut sent, mut received) = (0u32, 0u32);
    let mut passes = 0usize;
    let start = Instant::now();
    while received < 1000 {
        // As many as fit: every lap of the ring wraps it.
        loop {
            match a.send(frame(sent, len_for(sent, 512), &mut buf)) {
                Ok(()) => sent += 1,
                Err(FrameSendError::Full) => break,
                Err(e) => panic!("send: {e}"),
            }
        }
        passes += 1;
        if passes % 7 == 0 {
            // A frame lent by `recv` first; the pass below releases it.
            if let Some(got) = b.recv().unwrap() {
                check(received, got, len_for(received, 512));
                received += 1;
            }
        }
        let limit = 1 + passes % (slots + 2);
        let stop_after = 1 + passes % 3;
        let mut in_pass = 0;
        let handed = b
            .split()
            .1
            .recv_each(limit, |got| {
                check(received, got, len_for(received, 512));
                received += 1;
                in_pass += 1;
                in_pass != stop_after
            })
            .unwrap();
        assert_eq!(handed, in_pass, "pass {passes}");
        assert!(
            handed <= limit.min(stop_after),
            "pass {passes}: {handed} frames"
        );
        if handed == 0 {
            assert!(start.elapsed() < SOON, "no frame arrived");
            b.wait_recv(SOON).unwrap();
        }
    }
    // Everything sent arrives, nothing more.
    while received < sent {
        let handed = b
            .split()
            .1
            .recv_each(usize::MAX, |got| {
                check(received, got, len_for(received, 512));
                received += 1;
                true
            })
            .unwrap();
        if handed == 0 {
            assert!(start.elapsed() < SOON, "frames were lost");
            b.wait_recv(SOON).unwrap();
        }
    }
    assert_eq!(b.split().1.recv_each(usize::MAX, |_| true), Ok(0));
    // After the peer closes, a pass reports it once everything was received.
    a.close();
    let deadline = Instant::now() + SOON;
    loop {
        match b
            .split()
            .1
            .recv_each(usize::MAX, |_| panic!("no frame was left"))
        {
            Err(FrameRecvError::PeerGone(PeerGoneError::Closed)) => break,
            Ok(0) => assert!(Instant::now() < deadline, "the close was not seen"),
            other => panic!("after the close: {other:?}"),
        }
        let _ = b.wait_recv(Duration::from_millis(1));
    }
}

/// Receives until `received` reaches `sent`, checking each frame against `len`.
fn receive_up_to<C: Transport>(
    conn: &mut C,
    received: &mut u32,
    sent: u32,
    len: impl Fn(u32) -> usize,
) {
    let start = Instant::now();
    while *received < sent {
        match conn.recv().unwrap() {
            Some(got) => {
                check(*received, got, len(*received));
                *received += 1;
            }
            None => {
                assert!(
                    start.elapsed() < SOON,
                    "frame {received} of {sent} did not arrive"
                );
                conn.wait_recv(Duration::from_millis(1)).unwrap();
            }
        }
    }
}

/// A corked sender's frames arrive in order and intact once it uncorks, whatever their sizes
/// (small ones that share a message, ones too large to share one), and it never holds back
/// what the receiver needs to return credits: a burst that fills every slot reaches the peer
/// by the time `send` answers `Full`, and a close sends what is held first.
fn corked_bursts<P: Pair>() {
    const MAX: usize = 20_000;
    let (mut a, mut b) = P::pair(MaxMsgSize::new(MAX as u32).unwrap(), SLOTS);
    let len = |seq: u32| {
        if seq % 13 == 5 {
            4 + (seq as usize * 4099) % (MAX - 3)
        } else {
            len_for(seq, 200)
        }
    };
    let mut buf = vec![0u8; MAX];
    let (mut sent, mut received) = (0u32, 0u32);
    for burst in 0..60 {
        a.split().0.cork();
        let mut full = false;
        for _ in 0..1 + burst % (SLOTS + 3) {
            match a.send(frame(sent, len(sent), &mut buf)) {
                Ok(()) => sent += 1,
                Err(FrameSendError::Full) => {
                    full = true;
                    break;
                }
                Err(e) => panic!("send: {e}"),
            }
        }
        if full {
            receive_up_to(&mut b, &mut received, sent, len);
        }
        a.split().0.uncork().unwrap();
        receive_up_to(&mut b, &mut received, sent, len);
    }
    a.split().0.cork();
    for _ in 0..3 {
        a.send(frame(sent, len(sent), &mut buf)).unwrap();
        sent += 1;
    }
    a.close();
    receive_up_to(&mut b, &mut received, sent, len);
    assert_eq!(
        b.wait_recv(SOON),
        Err(FrameRecvError::PeerGone(PeerGoneError::Closed))
    );
}

fn empty_and_timeout<P: Pair>() {
    let (mut a, mut b) = P::pair(MaxMsgSize::DEFAULT, SLOTS);
    assert_eq!(b.recv().unwrap(), None);
    for mode in [
        WaitMode::BusyPoll,
        WaitMode::Adaptive {
            spin: Duration::from_micros(10),
        },
    ] {
        b.set_wait_mode(mode);
        let start = Instant::now();
        assert!(!b.wait_recv(Duration::from_millis(5)).unwrap());
        assert!(start.elapsed() >= Duration::from_millis(5));
    }
    assert!(a.wait_send(Duration::ZERO).unwrap());
    a.check_peer().unwrap();
    b.check_peer().unwrap();
}

fn full_keeps_the_frame<P: Pair>() {
    let (mut a, mut b) = P::pair(MaxMsgSize::DEFAULT, SLOTS);
    let mut n = 0;
    while a.send(&[n as u8; 10]).is_ok() {
        n += 1;
        assert!(n <= SLOTS, "more frames accepted than slots");
    }
    assert_eq!(n, SLOTS);
    assert_eq!(a.send(&[99]), Err(FrameSendError::Full));
    assert!(!a.wait_send(Duration::from_millis(2)).unwrap());
    // Draining frees slots again (possibly after the receiver publishes in a batch).
    for i in 0..SLOTS {
        assert_eq!(b.recv().unwrap(), Some(&[i as u8; 10][..]));
    }
    assert_eq!(b.recv().unwrap(), None);
    assert!(a.wait_send(SOON).unwrap());
    a.send(&[99]).unwrap();
    assert_eq!(b.recv().unwrap(), Some(&[99u8][..]));
}

fn sizes_up_to_the_maximum<P: Pair>() {
    let max = MaxMsgSize::new(300).unwrap();
    let (mut a, mut b) = P::pair(max, SLOTS);
    a.send(&[]).unwrap();
    a.send(&[1; 300]).unwrap();
    assert_eq!(
        a.send(&[2; 301]),
        Err(FrameSendError::TooLarge { len: 301, max: 300 })
    );
    assert_eq!(b.recv().unwrap(), Some(&[][..]));
    assert_eq!(b.recv().unwrap(), Some(&[1u8; 300][..]));
    assert_eq!(b.recv().unwrap(), None);
}

fn close_delivers_then_reports<P: Pair>() {
    let (mut a, mut b) = P::pair(MaxMsgSize::DEFAULT, SLOTS);
    for i in 0..3u8 {
        a.send(&[i]).unwrap();
    }
    a.close();
    assert_eq!(a.send(&[9]), Err(FrameSendError::Closed));
    assert_eq!(a.recv(), Err(FrameRecvError::Closed));
    for i in 0..3u8 {
        assert_eq!(b.recv().unwrap(), Some(&[i][..]));
    }
    let gone = FrameRecvError::PeerGone(PeerGoneError::Closed);
    assert_eq!(b.recv(), Err(gone));
    assert_eq!(b.wait_recv(SOON), Err(gone));
    assert_eq!(b.check_peer(), Err(PeerGoneError::Closed));
    // Sending to a closed peer fails (at the latest once its slots are used up).
    let mut result = Ok(());
    for _ in 0..=SLOTS {
        result = b.send(&[1]);
        if result.is_err() {
            break;
        }
    }
    assert_eq!(result, Err(FrameSendError::PeerGone(PeerGoneError::Closed)));
}

fn drop_closes_the_connection<P: Pair>() {
    let (a, mut b) = P::pair(MaxMsgSize::DEFAULT, SLOTS);
    drop(a);
    assert_eq!(
        b.wait_recv(SOON),
        Err(FrameRecvError::PeerGone(PeerGoneError::Closed))
    );
}

fn crash_is_noticed<P: Pair>() {
    let (mut a, mut b) = P::pair(MaxMsgSize::DEFAULT, SLOTS);
    a.send(b"last words").unwrap();
    P::crash(a);
    assert_eq!(b.recv().unwrap(), Some(&b"last words"[..]));
    let died = FrameRecvError::PeerGone(PeerGoneError::Died);
    b.set_wait_mode(WaitMode::BusyPoll);
    assert_eq!(b.wait_recv(SOON), Err(died));
    b.set_wait_mode(WaitMode::default());
    assert_eq!(b.wait_recv(SOON), Err(died));
    // Polling alone notices it too, after a bounded number of empty polls.
    let start = Instant::now();
    loop {
        match b.recv() {
            Ok(None) => assert!(start.elapsed() < SOON, "death not noticed by recv"),
            other => {
                assert_eq!(other, Err(died));
                break;
            }
        }
    }
    assert_eq!(b.check_peer(), Err(PeerGoneError::Died));
    // A sender notices at the latest when the ring fills.
    let mut result = Ok(());
    for _ in 0..=SLOTS {
        result = b.send(&[1]);
        if result.is_err() {
            break;
        }
    }
    assert_eq!(result, Err(FrameSendError::PeerGone(PeerGoneError::Died)));
    assert_eq!(
        b.wait_send(SOON),
        Err(FrameSendError::PeerGone(PeerGoneError::Died))
    );
}

/// Both directions at once on two threads, with sleeping waits that must never lose a wake-up.
fn threads_stream_both_ways<P: Pair>(mode: WaitMode) {
    const N: u32 = 20_000;
    let max = MaxMsgSize::new(256).unwrap();
    let (a, b) = P::pair(max, SLOTS);
    let run = move |mut conn: P::Conn| {
        conn.set_wait_mode(mode);
        let mut buf = vec![0u8; 256];
        let mut got = Vec::new();
        let (mut sent, mut received) = (0u32, 0u32);
        while sent < N || received < N {
            if sent < N {
                let len = len_for(sent, 256);
                match conn.send(frame(sent, len, &mut buf)) {
                    Ok(()) => sent += 1,
                    Err(FrameSendError::Full) => {}
                    Err(e) => panic!("send: {e}"),
                }
            }
            if received < N {
                match conn.recv().unwrap() {
                    Some(f) => {
                        got.clear();
                        got.extend_from_slice(f);
                        check(received, &got, len_for(received, 256));
                        received += 1;
                    }
                    None if sent == N => {
                        assert!(conn.wait_recv(SOON).unwrap(), "lost wake-up (receive)");
                    }
                    None => {}
                }
            }
            if sent < N && received == N {
                assert!(conn.wait_send(SOON).unwrap(), "lost wake-up (send)");
            }
        }
        // Keep the connection open until the peer has everything.
        conn
    };
    let other = std::thread::spawn(move || run(b));
    let a = run(a);
    let b = other.join().unwrap();
    drop((a, b));
}

/// A consumer asleep in `wait_recv` is woken by a frame sent from another thread.
fn sleeper_is_woken<P: Pair>() {
    let (mut a, mut b) = P::pair(MaxMsgSize::DEFAULT, SLOTS);
    b.set_wait_mode(WaitMode::Adaptive {
        spin: Duration::ZERO,
    });
    let sender = std::thread::spawn(move || {
        for i in 0..50u8 {
            std::thread::sleep(Duration::from_millis(1));
            // The receiver may be descheduled long enough for the ring to fill.
            loop {
                match a.send(&[i]) {
                    Ok(()) => break,
                    Err(FrameSendError::Full) => assert!(a.wait_send(SOON).unwrap()),
                    Err(e) => panic!("send: {e}"),
                }
            }
        }
        a
    });
    for i in 0..50u8 {
        assert!(b.wait_recv(SOON).unwrap());
        assert_eq!(b.recv().unwrap(), Some(&[i][..]));
    }
    drop(sender.join().unwrap());
}

/// The two halves of one end wait at the same time on two threads (one for a free slot, one
/// for a frame), and each is woken by what it waits for.
fn halves_wait_on_their_own_threads<P: Pair>() {
    let (a, mut b) = P::pair(MaxMsgSize::DEFAULT, SLOTS);
    let (mut tx, mut rx) = a.into_split();
    for i in 0..SLOTS {
        tx.send(&[i as u8]).unwrap();
    }
    assert_eq!(tx.send(b"full"), Err(FrameSendError::Full));
    let sender = std::thread::spawn(move || {
        let room = tx.wait_send(SOON);
        (room, tx)
    });
    let receiver = std::thread::spawn(move || {
        let frame = rx.wait_recv(SOON);
        (frame, rx)
    });
    // Let both fall asleep, then give each what it waits for, one after the other.
    std::thread::sleep(Duration::from_millis(50));
    b.send(b"for the receiver").unwrap();
    let (frame, mut rx) = receiver.join().unwrap();
    assert_eq!(frame, Ok(true));
    assert_eq!(rx.recv().unwrap(), Some(&b"for the receiver"[..]));
    std::thread::sleep(Duration::from_millis(50));
    let mut out = Vec::new();
    for i in 0..SLOTS {
        recv_one(&mut b, &mut out).unwrap();
        assert_eq!(out, [i as u8]);
    }
    // Releases the last frame received.
    assert_eq!(b.recv().unwrap(), None);
    let (room, mut tx) = sender.join().unwrap();
    assert_eq!(room, Ok(true));
    tx.send(b"more").unwrap();
}

/// Each half closes its own direction when dropped: the peer receives what was sent, then
/// learns the end is gone, while the other direction still works.
fn halves_close_their_own_direction<P: Pair>() {
    let (a, mut b) = P::pair(MaxMsgSize::DEFAULT, SLOTS);
    let (mut tx, mut rx) = a.into_split();
    tx.send(b"last").unwrap();
    drop(tx);
    let mut out = Vec::new();
    recv_one(&mut b, &mut out).unwrap();
    assert_eq!(out, b"last");
    assert_eq!(
        recv_one(&mut b, &mut out),
        Err(FrameRecvError::PeerGone(PeerGoneError::Closed))
    );
    b.send(b"still open").unwrap();
    assert!(rx.wait_recv(SOON).unwrap());
    assert_eq!(rx.recv().unwrap(), Some(&b"still open"[..]));
    drop(rx);
    let refused = (0..=SLOTS).find_map(|_| b.send(b"x").err());
    assert_eq!(
        refused,
        Some(FrameSendError::PeerGone(PeerGoneError::Closed))
    );
}

/// CPU time this thread has used so far.
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant the kernel knows.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0);
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// An idle receiver in the default (adaptive) mode sleeps: it uses next to no CPU while it
/// waits (a spinning one would use all of the wait).
fn idle_wait_sleeps<P: Pair>() {
    let (_a, mut b) = P::pair(MaxMsgSize::DEFAULT, SLOTS);
    b.set_wait_mode(WaitMode::default());
    let wait = Duration::from_millis(300);
    let before = thread_cpu_time();
    assert!(!b.wait_recv(wait).unwrap());
    let used = thread_cpu_time() - before;
    assert!(
        used < wait / 10,
        "an idle wait of {wait:?} used {used:?} of CPU"
    );
}

macro_rules! conformance {
    ($name:ident, $pair:ty) => {
        mod $name {
            use super::*;

            #[test]
            fn frames_arrive_in_order_and_intact() {
                in_order_and_intact::<$pair>();
            }
            #[test]
            fn batched_receive_in_order_as_the_ring_wraps() {
                batched_receive::<$pair>(SLOTS, ReadAhead::Near);
            }
            #[test]
            fn batched_receive_reading_far_ahead_in_order_as_the_ring_wraps() {
                batched_receive::<$pair>(128, ReadAhead::Far);
            }
            #[test]
            fn corked_bursts_arrive_in_order_and_never_hold_back() {
                corked_bursts::<$pair>();
            }
            #[test]
            fn empty_recv_and_wait_timeout() {
                empty_and_timeout::<$pair>();
            }
            #[test]
            fn full_ring_keeps_the_frame() {
                full_keeps_the_frame::<$pair>();
            }
            #[test]
            fn frame_sizes_up_to_the_maximum() {
                sizes_up_to_the_maximum::<$pair>();
            }
            #[test]
            fn close_delivers_pending_frames_then_reports() {
                close_delivers_then_reports::<$pair>();
            }
            #[test]
            fn drop_closes() {
                drop_closes_the_connection::<$pair>();
            }
            #[test]
            fn crashed_peer_is_noticed() {
                crash_is_noticed::<$pair>();
            }
            #[test]
            fn sleeping_receiver_is_woken() {
                sleeper_is_woken::<$pair>();
            }
            #[test]
            fn halves_wait_on_their_own_threads() {
                super::halves_wait_on_their_own_threads::<$pair>();
            }
            #[test]
            fn halves_close_their_own_direction() {
                super::halves_close_their_own_direction::<$pair>();
            }
            #[test]
            fn idle_receiver_uses_no_cpu() {
                idle_wait_sleeps::<$pair>();
            }
            #[test]
            fn threads_stream_both_ways_busy() {
                threads_stream_both_ways::<$pair>(WaitMode::BusyPoll);
            }
            #[test]
            fn threads_stream_both_ways_sleeping() {
                threads_stream_both_ways::<$pair>(WaitMode::Adaptive {
                    spin: Duration::ZERO,
                });
            }
        }
    };
}

/// A pass that stops early (its closure wants no more, as a worker's does for a host whose
/// notifications wait) hands every frame it took back to the sender at once: the sender can
/// fill the ring again. Over shared memory the consumer otherwise publishes its head a quarter
/// of the ring at a time. (Over UCX, credits go back in halves of the window, by message.)
fn early_stop_gives_back_its_slots<P: Pair>() {
    const RING: usize = 16;
    let max = MaxMsgSize::new(512).unwrap();
    let (mut a, mut b) = P::pair(max, RING);
    let mut buf = vec![0u8; 512];
    let mut sent = 0u32;
    while a.send(frame(sent, 64, &mut buf)) == Ok(()) {
        sent += 1;
    }
    assert_eq!(sent as usize, RING, "the ring holds {RING} frames");
    let mut received = 0u32;
    let handed = b
        .split()
        .1
        .recv_each(usize::MAX, |got| {
            check(received, got, 64);
            received += 1;
            received < 3
        })
        .unwrap();
    assert_eq!(handed, 3);
    for _ in 0..3 {
        assert_eq!(
            a.send(frame(sent, 64, &mut buf)),
            Ok(()),
            "frame {sent}: the slots the pass took were not given back"
        );
        sent += 1;
    }
}

#[test]
fn loopback_early_stop_gives_back_its_slots() {
    early_stop_gives_back_its_slots::<Loopback>();
}

#[test]
fn shm_early_stop_gives_back_its_slots() {
    early_stop_gives_back_its_slots::<Shm>();
}

#[test]
fn channel_over_shm_early_stop_gives_back_its_slots() {
    early_stop_gives_back_its_slots::<ChannelOverShm>();
}

conformance!(loopback, Loopback);
conformance!(shm, Shm);
conformance!(channel_over_shm, ChannelOverShm);
#[cfg(feature = "ucx")]
conformance!(ucx, Ucx);
#[cfg(feature = "ucx")]
conformance!(channel_over_ucx, ChannelOverUcx);
