//! Shared-memory transport between two pinned processes, beside the hardware floor.
//!
//! * `floor/cache_line_round_trip`: two processes ping-pong one cache line through a shared
//!   mapping, the least any round trip between them can cost;
//! * `floor/two_lines_round_trip`: the same with one line per direction, the least a protocol
//!   whose two directions use separate memory (like a pair of rings) can cost;
//! * `floor/frame_64B_round_trip`: 64 bytes and a ready word each way (two lines per
//!   direction), written and read with plain loads and stores: the least moving a 64-byte frame
//!   each way through separate memory per direction can cost, with no transport around it;
//! * `shm/round_trip_64B`: a 64-byte frame to the other process and back over a
//!   [`ShmConnection`]; like every frame here it carries the connection's number for it where
//!   a urom frame header keeps its sequence number, which makes it its own ready mark (one
//!   cache line per frame);
//! * `shm/stream_64B`: one-way streaming of 64-byte frames (throughput in frames per second);
//! * `shm/same_thread_send_recv_64B`: the software cost alone, both ends on one thread.
//!
//! This process runs on core 0, the peer (this same binary, re-run with `UROM_BENCH_CHILD` set)
//! on core 1. `benches/run-shm-bench.sh` runs it and prints the medians, ratios and ucx_perftest
//! numbers side by side: `cargo bench -p urom-benches --bench shm`.

use std::hint::black_box;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::process::{Child, Command};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use nix::fcntl::{FcntlArg, FdFlag, fcntl};
use nix::sys::mman::{MapFlags, ProtFlags, mmap};
use urom_transport::ChannelConfig;
use urom_transport::shm::ShmConnection;
use urom_transport::{FrameSendError, FrameSender, Transport, WaitMode};

const CHILD_ENV: &str = "UROM_BENCH_CHILD";
const FD_ENV: &str = "UROM_BENCH_FD";
const PARENT_CORE: usize = 0;
const CHILD_CORE: usize = 1;
const FRAME: usize = 64;
/// Sentinel the parent stores in the floor's cache line to stop the child.
const STOP: u64 = u64::MAX;
/// First byte of a frame the child must echo; other frames it only consumes.
const ECHO: u8 = 1;

/// Writes what makes `frame` its own ready mark as frame `seq`: its length and `seq` where a
/// urom frame header keeps them.
fn stamp(frame: &mut [u8], seq: u64) {
    let len = frame.len() as u32;
    frame[8..12].copy_from_slice(&len.to_le_bytes());
    frame[16..24].copy_from_slice(&seq.to_le_bytes());
}

fn config() -> ChannelConfig {
    ChannelConfig {
        slots: 256,
        wait: WaitMode::BusyPoll,
        ..ChannelConfig::default()
    }
}

/// A descriptor the child inherits, with its number.
fn inheritable(fd: &impl AsFd) -> RawFd {
    fcntl(fd, FcntlArg::F_SETFD(FdFlag::empty())).expect("clear FD_CLOEXEC");
    fd.as_fd().as_raw_fd()
}

fn spawn_child(role: &str, fd: RawFd) -> ChildGuard {
    let child = Command::new(std::env::current_exe().unwrap())
        .env(CHILD_ENV, role)
        .env(FD_ENV, fd.to_string())
        .spawn()
        .expect("spawn the peer process");
    ChildGuard(child)
}

/// The peer process, killed and reaped when dropped.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn inherited_fd() -> OwnedFd {
    let fd: RawFd = std::env::var(FD_ENV).unwrap().parse().unwrap();
    // SAFETY: the parent passed this descriptor down for us alone; nothing else in this process
    // has opened or owns it.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Shared cache lines (128 bytes apart) in a memfd both processes map.
struct SharedLine {
    line: NonNull<AtomicU64>,
    _fd: OwnedFd,
}

impl SharedLine {
    fn create() -> Self {
        let fd = nix::sys::memfd::memfd_create(c"urom-floor", nix::sys::memfd::MFdFlags::empty())
            .expect("memfd_create");
        nix::unistd::ftruncate(&fd, 4096).expect("ftruncate");
        Self::map(fd)
    }

    fn map(fd: OwnedFd) -> Self {
        let len = NonZeroUsize::new(4096).unwrap();
        let prot = ProtFlags::PROT_READ | ProtFlags::PROT_WRITE;
        // SAFETY: a fresh shared mapping of a 4096-byte file at an address the kernel picks;
        // the file is never shrunk (only this benchmark knows it); it stays mapped for the
        // process's life (never unmapped).
        let ptr = unsafe { mmap(None, len, prot, MapFlags::MAP_SHARED, &fd, 0) }.expect("mmap");
        Self {
            line: ptr.cast(),
            _fd: fd,
        }
    }

    /// The 16 words (128 bytes, two cache lines) at line pair `index` (0 or 1).
    fn block(&self, index: usize) -> &[AtomicU64; 16] {
        assert!(index < 2);
        let block = self.line.as_ptr().wrapping_add(index * 16);
        // SAFETY: the mapping is page-aligned, 4096 bytes long and live for the process's life;
        // `block` is 128-aligned at byte 0 or 128, and its words are only ever accessed as
        // these atomics, by both processes.
        unsafe { &*block.cast::<[AtomicU64; 16]>() }
    }
}

/// Words of a floor frame after its ready word: 64 bytes.
const FRAME_WORDS: core::ops::RangeInclusive<usize> = 1..=8;

/// Writes a floor frame: 64 bytes, then the ready word `value`.
fn write_frame(block: &[AtomicU64; 16], value: u64) {
    for word in &block[FRAME_WORDS] {
        word.store(value, Ordering::Relaxed);
    }
    block[0].store(value, Ordering::Release);
}

/// Reads the 64 bytes of a floor frame whose ready word said it is there.
fn read_frame(block: &[AtomicU64; 16]) -> u64 {
    block[FRAME_WORDS].iter().fold(0, |sum, word| {
        sum.wrapping_add(word.load(Ordering::Relaxed))
    })
}

/// The floor's peer: answers every odd value `v` in `ping` with `v + 1` in `pong`; with
/// `frames`, each value comes and goes with 64 bytes.
fn floor_child(lines: usize, frames: bool) {
    let shared = SharedLine::map(inherited_fd());
    let (ping, pong) = (shared.block(0), shared.block(lines - 1));
    let mut last = 0;
    loop {
        let v = ping[0].load(Ordering::Acquire);
        if v == STOP {
            return;
        }
        if v != last && v % 2 == 1 {
            if frames {
                black_box(read_frame(ping));
                write_frame(pong, v + 1);
            } else {
                pong[0].store(v + 1, Ordering::Release);
            }
            last = v;
        }
        std::hint::spin_loop();
    }
}

/// The connection's peer: echoes frames that ask for it, consumes the others.
fn shm_child() {
    let stream = UnixStream::from(inherited_fd());
    let mut conn = ShmConnection::accept(stream, &config()).expect("accept the offer");
    let mut buf = [0u8; FRAME];
    loop {
        match conn.recv() {
            Ok(Some(frame)) if frame.first() == Some(&ECHO) => {
                let len = frame.len().min(FRAME);
                buf[..len].copy_from_slice(&frame[..len]);
                if len == FRAME {
                    stamp(&mut buf, conn.split().0.next_seq());
                }
                while let Err(FrameSendError::Full) = conn.send(&buf[..len]) {
                    std::hint::spin_loop();
                }
            }
            Ok(_) => {}
            Err(_) => return,
        }
    }
}

/// Round trips of a counter between two processes through shared cache lines: one line for
/// both directions (the floor), one line per direction (the least a protocol with separate
/// lines per direction can cost), or a 64-byte frame and its ready word each way.
fn floor(c: &mut Criterion) {
    let mut group = c.benchmark_group("floor");
    for (role, name) in [
        ("floor", "cache_line_round_trip"),
        ("floor2", "two_lines_round_trip"),
        ("floor64", "frame_64B_round_trip"),
    ] {
        let (lines, frames) = floor_shape(role);
        let shared = SharedLine::create();
        let _child = spawn_child(role, inheritable(&shared._fd));
        let (ping, pong) = (shared.block(0), shared.block(lines - 1));
        let mut next = 1u64;
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    if frames {
                        write_frame(ping, next);
                    } else {
                        ping[0].store(next, Ordering::Release);
                    }
                    while pong[0].load(Ordering::Acquire) != next + 1 {
                        std::hint::spin_loop();
                    }
                    if frames {
                        black_box(read_frame(pong));
                    }
                    next += 2;
                }
                start.elapsed()
            })
        });
        ping[0].store(STOP, Ordering::Release);
    }
    group.finish();
}

/// Lines the floor `role` uses (1: both directions share one) and whether it carries frames.
fn floor_shape(role: &str) -> (usize, bool) {
    match role {
        "floor" => (1, false),
        "floor2" => (2, false),
        _ => (2, true),
    }
}

fn shm(c: &mut Criterion) {
    let (ours, theirs) = UnixStream::pair().expect("socketpair");
    let _child = spawn_child("shm", inheritable(&theirs));
    drop(theirs);
    let mut conn = ShmConnection::create(ours, &config()).expect("create the connection");
    let mut group = c.benchmark_group("shm");

    let mut ping = [0u8; FRAME];
    ping[0] = ECHO;
    let mut reply = [0u8; FRAME];
    group.bench_function("round_trip_64B", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for i in 0..iters {
                ping[1] = i as u8;
                stamp(&mut ping, conn.split().0.next_seq());
                conn.send(black_box(&ping)).expect("send");
                loop {
                    match conn.recv().expect("recv") {
                        Some(pong) => {
                            // Read the answer, as any receiver does.
                            let len = pong.len().min(FRAME);
                            reply[..len].copy_from_slice(&pong[..len]);
                            black_box(&reply);
                            break;
                        }
                        None => std::hint::spin_loop(),
                    }
                }
            }
            start.elapsed()
        })
    });

    let mut data = [0u8; FRAME];
    group.throughput(Throughput::Elements(1));
    group.bench_function("stream_64B", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                stamp(&mut data, conn.split().0.next_seq());
                loop {
                    match conn.send(black_box(&data)) {
                        Ok(()) => break,
                        Err(FrameSendError::Full) => std::hint::spin_loop(),
                        Err(e) => panic!("send: {e}"),
                    }
                }
            }
            // The peer has consumed everything once it echoes a frame sent after the rest.
            while let Err(FrameSendError::Full) = conn.send(&[ECHO]) {
                std::hint::spin_loop();
            }
            while conn.recv().expect("recv").is_none() {
                std::hint::spin_loop();
            }
            start.elapsed()
        })
    });
    group.finish();
    conn.close();
}

/// Software cost alone: send and receive on one thread, no cache line crosses cores.
fn same_thread(c: &mut Criterion) {
    let (mut a, mut b) = ShmConnection::pair(&config()).expect("shared-memory pair");
    let mut frame = [1u8; FRAME];
    let mut group = c.benchmark_group("shm");
    group.bench_function("same_thread_send_recv_64B", |bench| {
        bench.iter(|| {
            stamp(&mut frame, a.split().0.next_seq());
            a.send(black_box(&frame)).expect("send");
            black_box(b.recv().expect("recv"));
        })
    });
    group.finish();
}

fn main() {
    if let Ok(role) = std::env::var(CHILD_ENV) {
        if let Err(e) = urom_transport::sys::pin_current_thread(CHILD_CORE) {
            eprintln!("peer not pinned: {e}");
        }
        match role.as_str() {
            "floor" | "floor2" | "floor64" => {
                let (lines, frames) = floor_shape(&role);
                floor_child(lines, frames)
            }
            "shm" => shm_child(),
            other => panic!("unknown role {other}"),
        }
        return;
    }
    if let Err(e) = urom_transport::sys::pin_current_thread(PARENT_CORE) {
        eprintln!("benchmark not pinned: {e}");
    }
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .sample_size(60)
        .configure_from_args();
    same_thread(&mut c);
    floor(&mut c);
    shm(&mut c);
    c.final_summary();
}
