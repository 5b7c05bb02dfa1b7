//! Two real processes over the shared-memory transport.
//!
//! The test binary re-runs itself as the sending child: [`child_sender`] does nothing unless
//! `UROM_TEST_SHM_CHILD` names the socket to connect to.

use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use urom_transport::ChannelConfig;
use urom_transport::shm::ShmConnection;
use urom_transport::{FrameRecvError, FrameSendError, PeerGoneError, Transport};
use urom_wire::MaxMsgSize;

const CHILD_ENV: &str = "UROM_TEST_SHM_CHILD";
const COUNT_ENV: &str = "UROM_TEST_SHM_COUNT";
const FRAMES: u64 = 1_000_000;
/// Bytes before the payload: sequence number, pool offset, checksum of both and the length.
const HEAD: usize = 24;
/// Generous bound for anything that should happen "soon"; never a performance assertion.
const SOON: Duration = Duration::from_secs(60);

fn config() -> ChannelConfig {
    ChannelConfig {
        max_msg_size: MaxMsgSize::DEFAULT,
        slots: 64,
        ..ChannelConfig::default()
    }
}

fn xorshift(mut x: u64) -> u64 {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
}

/// Pseudo-random bytes the payloads are cut from (same in both processes).
fn pool(max: usize) -> Vec<u8> {
    let mut r = 0x2545_f491_4f6c_dd1d_u64;
    (0..2 * max)
        .map(|_| {
            r = xorshift(r);
            r as u8
        })
        .collect()
}

fn check_word(seq: u64, offset: u64, len: u64) -> u64 {
    xorshift(seq ^ offset.rotate_left(20) ^ len.rotate_left(40) ^ 0x5555)
}

/// Frame `seq`: its length is random in `HEAD..=max`, its payload a random cut of `pool`.
fn fill(seq: u64, pool: &[u8], buf: &mut [u8]) -> usize {
    let max = buf.len();
    let r = xorshift(seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let len = HEAD + (r as usize % (max - HEAD + 1));
    let offset = (r >> 32) as usize % max;
    buf[..8].copy_from_slice(&seq.to_le_bytes());
    buf[8..16].copy_from_slice(&(offset as u64).to_le_bytes());
    buf[16..24].copy_from_slice(&check_word(seq, offset as u64, len as u64).to_le_bytes());
    buf[HEAD..len].copy_from_slice(&pool[offset..offset + len - HEAD]);
    len
}

/// Checks one received frame byte for byte; returns its sequence number.
fn verify(frame: &[u8], pool: &[u8]) -> u64 {
    assert!(frame.len() >= HEAD, "frame of {} bytes", frame.len());
    let word = |at: usize| u64::from_le_bytes(frame[at..at + 8].try_into().unwrap());
    let (seq, offset) = (word(0), word(8));
    assert_eq!(
        word(16),
        check_word(seq, offset, frame.len() as u64),
        "frame {seq}: bad header checksum"
    );
    let offset = offset as usize;
    assert!(
        frame[HEAD..] == pool[offset..offset + frame.len() - HEAD],
        "frame {seq}: payload corrupted"
    );
    seq
}

/// The sending child: connects, offers the mapping, sends frames, closes.
#[test]
fn child_sender() {
    let Ok(path) = std::env::var(CHILD_ENV) else {
        return;
    };
    let count: u64 = std::env::var(COUNT_ENV).unwrap().parse().unwrap();
    let stream = UnixStream::connect(path).unwrap();
    let mut conn = ShmConnection::create(stream, &config()).unwrap();
    let mut buf = vec![0u8; conn.max_msg_size().get()];
    let pool = pool(buf.len());
    for seq in 0..count {
        let len = fill(seq, &pool, &mut buf);
        loop {
            match conn.send(&buf[..len]) {
                Ok(()) => break,
                Err(FrameSendError::Full) => {
                    assert!(conn.wait_send(SOON).unwrap(), "receiver stalled");
                }
                Err(e) => panic!("send {seq}: {e}"),
            }
        }
    }
    conn.close();
}

/// A child process, killed and reaped when dropped.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn socket_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("urom-test-{}-{name}.sock", std::process::id()))
}

/// Starts the sending child and accepts its connection.
fn start_sender(name: &str, count: u64) -> (ChildGuard, ShmConnection) {
    let path = socket_path(name);
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).unwrap();
    listener.set_nonblocking(true).unwrap();
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_sender", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, &path)
        .env(COUNT_ENV, count.to_string())
        .spawn()
        .unwrap();
    let mut child = ChildGuard(child);
    let start = Instant::now();
    let stream = loop {
        match listener.accept() {
            Ok((stream, _)) => break stream,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(start.elapsed() < SOON, "child never connected");
                if let Some(status) = child.0.try_wait().unwrap() {
                    panic!("child exited early: {status}");
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => panic!("accept: {e}"),
        }
    };
    let _ = std::fs::remove_file(&path);
    stream.set_nonblocking(false).unwrap();
    let conn = ShmConnection::accept(stream, &config()).unwrap();
    (child, conn)
}

/// Receives until the peer is gone; checks order and contents; returns the frames received and
/// how the peer went.
fn receive_all(conn: &mut ShmConnection, stop_after: Option<u64>) -> (u64, PeerGoneError) {
    let pool = pool(conn.max_msg_size().get());
    let mut next = 0u64;
    loop {
        if stop_after == Some(next) {
            return (next, PeerGoneError::Closed);
        }
        match conn.recv() {
            Ok(Some(frame)) => {
                assert_eq!(
                    verify(frame, &pool),
                    next,
                    "frame lost, duplicated or reordered"
                );
                next += 1;
            }
            Ok(None) => match conn.wait_recv(SOON) {
                Ok(true) => {}
                Ok(false) => panic!("no frame and no hang-up after {next} frames"),
                Err(FrameRecvError::PeerGone(how)) => return (next, how),
                Err(e) => panic!("wait: {e}"),
            },
            Err(FrameRecvError::PeerGone(how)) => return (next, how),
            Err(e) => panic!("recv: {e}"),
        }
    }
}

#[test]
fn million_frames_between_processes() {
    let (mut child, mut conn) = start_sender("million", FRAMES);
    let (received, how) = receive_all(&mut conn, None);
    assert_eq!(received, FRAMES);
    assert_eq!(how, PeerGoneError::Closed);
    assert!(child.0.wait().unwrap().success());
}

#[test]
fn sender_killed_midway() {
    let (mut child, mut conn) = start_sender("killed", FRAMES);
    let (first, _) = receive_all(&mut conn, Some(FRAMES / 10));
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    // What the sender published before it died arrives intact, then its death is reported.
    let pool = pool(conn.max_msg_size().get());
    let mut next = first;
    let how = loop {
        match conn.recv() {
            Ok(Some(frame)) => {
                assert_eq!(verify(frame, &pool), next);
                next += 1;
            }
            Ok(None) => match conn.wait_recv(SOON) {
                Ok(true) => {}
                Ok(false) => panic!("death not noticed"),
                Err(FrameRecvError::PeerGone(how)) => break how,
                Err(e) => panic!("wait: {e}"),
            },
            Err(FrameRecvError::PeerGone(how)) => break how,
            Err(e) => panic!("recv: {e}"),
        }
    };
    assert_eq!(how, PeerGoneError::Died);
    assert!(next < FRAMES);
    assert_eq!(conn.check_peer(), Err(PeerGoneError::Died));
}
