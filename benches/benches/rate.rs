//! Message rate through the whole command path, beside the transport it runs on and UCX, in
//! alternating rounds:
//!
//! * (a) `stream`: our raw shared-memory stream, 64-byte urom frames (each its own ready mark,
//!   so one cache line) from this process to a pinned consumer process;
//! * (b) `api`: graph loopbacks through the host API (`GraphHost::loopback_batch`, progress,
//!   completion callback) to a worker the daemon spawned, pipelined with 64 and with 256 in
//!   flight, one host thread and one worker; and two host threads, each with its own engine
//!   and worker, 64 in flight each (rates added);
//! * (c) `ucx_perftest ucp_am_bw` over `UCX_TLS=posix`, 64-byte messages on the same two cores
//!   (two pairs at once beside the two-thread case), when `ucx_perftest` is installed;
//! * (e) `echo`: the raw stream's consumer answering every frame as it arrives, 64 and 256 in
//!   flight: the loopback of the transport alone, with no work on either side, which (b) runs
//!   on (each side sends and receives a frame per loopback, twice the frames of (a) per op);
//! * the round trip of a lone 64-byte command through the host API against the floor of one
//!   cache line per direction (two processes, plain stores and loads) and the shared-memory
//!   round trip of a 64-byte urom frame.
//!
//! Each round measures everything once, in turn; the medians of the per-round ratios are the
//! numbers to trust on a VM whose cores change speed over seconds. This process (the host side)
//! runs on core 0, its peers on core 1 (in the two-thread case, one host and one worker on
//! each core). `benches/run-rate-bench.sh [rounds]` runs it; with `UROM_RATE_PROFILE` set, the
//! binary measures only the host-API rate at 64 in flight, `rounds` times, for a profiler
//! (`UROM_RATE_PROFILE=pair`: the two-thread case instead; `echo`: the bare echo at 64 in
//! flight; `lone`: the lone command's round trip).

use std::cell::Cell;
use std::hint::black_box;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::fcntl::{FcntlArg, FdFlag, fcntl};
use nix::sys::mman::{MapFlags, ProtFlags, mmap};
use urom_benches::{HOST_CORE, PEER_CORE, median};
use urom_graph::GraphHost;
use urom_host::{CompletedTask, Idle, ProgressEngine, Running, Service, Worker};
use urom_testkit::daemon::{plugin_dir, start_daemon};
use urom_testkit::{ChildGuard, TempDir, binary};
use urom_transport::shm::ShmConnection;
use urom_transport::{
    ChannelConfig, FrameReceiver, FrameSendError, FrameSender, ReadAhead, Transport, WaitMode,
};
use urom_wire::MaxMsgSize;
use urom_wire::data::write_command_headers;

const CHILD_ENV: &str = "UROM_RATE_CHILD";
const FD_ENV: &str = "UROM_RATE_FD";
/// Frames per stream measurement.
const STREAM_FRAMES: u64 = 4_000_000;
/// Loopbacks per host-API rate measurement (per thread in the two-thread case).
const API_COMMANDS: u64 = 2_000_000;
/// Messages per `ucx_perftest` run.
const UCX_MESSAGES: u64 = 3_000_000;
/// Round trips per latency measurement (the median of samples of 10 is kept).
const ROUND_TRIPS: usize = 5_000;
/// First byte of the frame after which the stream's consumer answers.
const LAST: u8 = 0xff;
/// Sentinel the parent stores in the floor's line to stop the child.
const STOP: u64 = u64::MAX;
/// The port of the next `ucx_perftest` server.
static NEXT_PORT: AtomicU16 = AtomicU16::new(13381);

thread_local! {
    static COMPLETED: Cell<u64> = const { Cell::new(0) };
}

fn completed(_task: &CompletedTask<'_>) {
    COMPLETED.with(|done| done.set(done.get() + 1));
}

fn config() -> ChannelConfig {
    ChannelConfig {
        slots: 256,
        wait: WaitMode::BusyPoll,
        ..ChannelConfig::default()
    }
}

/// A 64-byte graph loopback command frame stamped with `seq`.
fn command_frame(frame: &mut [u8; 64], seq: u64) {
    let len = write_command_headers(frame, seq, 1, 7, 16, MaxMsgSize::DEFAULT).unwrap();
    debug_assert_eq!(len, 64);
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

fn inherited_fd() -> OwnedFd {
    let fd: RawFd = std::env::var(FD_ENV).unwrap().parse().unwrap();
    // SAFETY: the parent passed this descriptor down for us alone; nothing else in this process
    // has opened or owns it.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// The stream's consumer: takes every frame, answers each that starts with [`LAST`] and
/// echoes any other frame of another length than 64 bytes.
fn stream_child() {
    let stream = UnixStream::from(inherited_fd());
    let mut conn = ShmConnection::accept(stream, &config()).expect("accept the offer");
    let mut answer = [0u8; 64];
    loop {
        let reply = match conn.recv() {
            Ok(Some(frame)) => frame.first() == Some(&LAST) || frame.len() != 64,
            Ok(None) => false,
            Err(_) => return,
        };
        if reply {
            let (tx, _) = conn.split();
            command_frame(&mut answer, tx.next_seq());
            while let Err(FrameSendError::Full) = tx.send(&answer) {
                std::hint::spin_loop();
            }
        }
    }
}

/// The raw stream and the round trip of one 64-byte frame over one connection.
struct Stream {
    conn: ShmConnection,
    _child: ChildGuard,
}

impl Stream {
    fn new() -> Self {
        let (ours, theirs) = UnixStream::pair().expect("socketpair");
        let child = spawn_child("stream", inheritable(&theirs));
        drop(theirs);
        let conn = ShmConnection::create(ours, &config()).expect("create the connection");
        Self {
            conn,
            _child: child,
        }
    }

    /// Frames per second, one way.
    fn rate(&mut self) -> f64 {
        let mut frame = [0u8; 64];
        let start = Instant::now();
        for i in 0..STREAM_FRAMES {
            let (tx, _) = self.conn.split();
            command_frame(&mut frame, tx.next_seq());
            if i + 1 == STREAM_FRAMES {
                frame[0] = LAST;
            }
            loop {
                match tx.send(black_box(&frame)) {
                    Ok(()) => break,
                    Err(FrameSendError::Full) => std::hint::spin_loop(),
                    Err(e) => panic!("send: {e}"),
                }
            }
        }
        while self.conn.recv().expect("recv").is_none() {
            std::hint::spin_loop();
        }
        STREAM_FRAMES as f64 / start.elapsed().as_secs_f64()
    }

    /// Frames echoed per second with `depth` in flight, each answered by the consumer as it
    /// arrives: the loopback of the transport alone, with no work on either side.
    fn echo_rate(&mut self, depth: u64) -> f64 {
        let mut frame = [0u8; 64];
        let (mut sent, mut back) = (0u64, 0u64);
        // Answers read as the host API reads notifications (right behind their sender).
        self.conn.split().1.set_read_ahead(ReadAhead::Far);
        let start = Instant::now();
        while back < API_COMMANDS {
            while sent - back < depth && sent < API_COMMANDS {
                let (tx, _) = self.conn.split();
                command_frame(&mut frame, tx.next_seq());
                frame[0] = LAST;
                match tx.send(black_box(&frame)) {
                    Ok(()) => sent += 1,
                    Err(FrameSendError::Full) => break,
                    Err(e) => panic!("send: {e}"),
                }
            }
            while self.conn.recv().expect("recv").is_some() {
                back += 1;
            }
        }
        API_COMMANDS as f64 / start.elapsed().as_secs_f64()
    }

    /// Median round trip of a 64-byte urom frame (the answer read), in nanoseconds.
    fn round_trip(&mut self) -> f64 {
        let mut frame = [0u8; 64];
        let mut reply = [0u8; 64];
        let conn = &mut self.conn;
        latency(|| {
            let (tx, _) = conn.split();
            command_frame(&mut frame, tx.next_seq());
            frame[0] = LAST;
            tx.send(&frame).expect("send");
            loop {
                if let Some(answer) = conn.recv().expect("recv") {
                    reply.copy_from_slice(&answer[..64]);
                    black_box(&reply);
                    return;
                }
            }
        })
    }
}

/// The median time of `once`, over samples of 10, after a warm-up.
fn latency(mut once: impl FnMut()) -> f64 {
    for _ in 0..1000 {
        once();
    }
    let mut samples: Vec<f64> = (0..ROUND_TRIPS / 10)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..10 {
                once();
            }
            start.elapsed().as_nanos() as f64 / 10.0
        })
        .collect();
    median(&mut samples)
}

/// Two cache lines, one per direction, in a memfd both processes map.
struct Floor {
    words: NonNull<AtomicU64>,
    _fd: OwnedFd,
    _child: Option<ChildGuard>,
}

impl Floor {
    fn map(fd: OwnedFd) -> Self {
        let len = NonZeroUsize::new(4096).unwrap();
        let prot = ProtFlags::PROT_READ | ProtFlags::PROT_WRITE;
        // SAFETY: a fresh shared mapping of a 4096-byte file at an address the kernel picks;
        // the file is never shrunk (only this benchmark knows it); it stays mapped for the
        // process's life (never unmapped).
        let ptr = unsafe { mmap(None, len, prot, MapFlags::MAP_SHARED, &fd, 0) }.expect("mmap");
        Self {
            words: ptr.cast(),
            _fd: fd,
            _child: None,
        }
    }

    fn new() -> Self {
        let fd = nix::sys::memfd::memfd_create(c"urom-floor", nix::sys::memfd::MFdFlags::empty())
            .expect("memfd_create");
        nix::unistd::ftruncate(&fd, 4096).expect("ftruncate");
        let mut floor = Self::map(fd);
        floor._child = Some(spawn_child("floor", inheritable(&floor._fd)));
        floor
    }

    /// The word at the start of line pair `index` (0: towards the child, 1: back).
    fn word(&self, index: usize) -> &AtomicU64 {
        assert!(index < 2);
        // SAFETY: the mapping is page-aligned, 4096 bytes long and live for the process's life;
        // the word is at byte 0 or 128, and only ever accessed as this atomic, by both
        // processes.
        unsafe { &*self.words.as_ptr().wrapping_add(index * 16) }
    }

    /// Median round trip of a value, one line each way, in nanoseconds.
    fn round_trip(&mut self, next: &mut u64) -> f64 {
        // A fresh peer: let it settle on its core first.
        let settle = Instant::now() + Duration::from_millis(50);
        while Instant::now() < settle {
            self.word(0).store(*next, Ordering::Release);
            while self.word(1).load(Ordering::Acquire) != *next + 1 {
                std::hint::spin_loop();
            }
            *next += 2;
        }
        latency(|| {
            self.word(0).store(*next, Ordering::Release);
            while self.word(1).load(Ordering::Acquire) != *next + 1 {
                std::hint::spin_loop();
            }
            *next += 2;
        })
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        self.word(0).store(STOP, Ordering::Release);
    }
}

/// The floor's peer: answers every odd value `v` with `v + 1` on the other line.
fn floor_child() {
    let floor = Floor::map(inherited_fd());
    let mut last = 0;
    loop {
        let v = floor.word(0).load(Ordering::Acquire);
        if v == STOP {
            return;
        }
        if v != last && v % 2 == 1 {
            floor.word(1).store(v + 1, Ordering::Release);
            last = v;
        }
        std::hint::spin_loop();
    }
}

/// Loopbacks per second through the host API with `depth` in flight.
fn api_rate(
    engine: &mut ProgressEngine,
    graph: &GraphHost,
    worker: &Worker<Running>,
    depth: u64,
) -> f64 {
    COMPLETED.with(|done| done.set(0));
    let start = Instant::now();
    let mut sent = 0u64;
    loop {
        let done = COMPLETED.with(Cell::get);
        if done == API_COMMANDS {
            break;
        }
        let room = (depth - (sent - done)).min(API_COMMANDS - sent);
        if room > 0 {
            if let Ok(went) = graph.loopback_batch(worker, sent, room as usize, completed) {
                sent += went as u64;
            }
        }
        engine.progress();
    }
    API_COMMANDS as f64 / start.elapsed().as_secs_f64()
}

/// Median round trip of one loopback through the host API, in nanoseconds.
fn api_round_trip(engine: &mut ProgressEngine, graph: &GraphHost, worker: &Worker<Running>) -> f64 {
    latency(|| {
        let before = COMPLETED.with(Cell::get);
        graph.loopback(worker, 7, 42, completed).expect("submit");
        while COMPLETED.with(Cell::get) == before {
            engine.progress();
        }
    })
}

/// A running worker for the graph plugin on `core`.
fn start_worker(
    engine: &mut ProgressEngine,
    service: &Service<Running>,
    graph: &GraphHost,
    core: usize,
) -> Worker<Running> {
    Worker::new()
        .set_service(service)
        .set_plugins(graph.id())
        .set_cpuset([core].into_iter().collect())
        .set_max_inflight_tasks(256)
        .start(engine)
        .map_err(|(_, e)| e)
        .expect("starting a worker")
        .wait_running(engine, Duration::from_secs(60))
        .unwrap_or_else(|progress| panic!("the worker did not run: {progress:?}"))
}

/// `ucx_perftest ucp_am_bw` over shared memory, 64-byte messages, with `pairs` client/server
/// pairs at once (client on core `i % 2`, server on the other); messages per second, summed.
fn ucx_rate(pairs: usize) -> Option<f64> {
    let perftest = |args: &[String]| {
        let mut command = Command::new("ucx_perftest");
        command
            .args(args)
            .env("UCX_TLS", "posix")
            .env("UCX_WARN_UNUSED_ENV_VARS", "n")
            .stderr(Stdio::null());
        command
    };
    // A fresh port each time: a port just used may not be free again yet.
    let base = NEXT_PORT.fetch_add(pairs as u16, Ordering::Relaxed);
    let mut servers = Vec::new();
    for pair in 0..pairs {
        let port = (base + pair as u16).to_string();
        let core = ((pair + 1) % 2).to_string();
        let server = perftest(&["-c".into(), core, "-p".into(), port])
            .stdout(Stdio::null())
            .spawn()
            .ok()?;
        servers.push(ChildGuard(server));
    }
    std::thread::sleep(Duration::from_millis(700));
    let clients: Vec<_> = (0..pairs)
        .map(|pair| {
            let args: Vec<String> = [
                "localhost",
                "-p",
                &(base + pair as u16).to_string(),
                "-t",
                "ucp_am_bw",
                "-s",
                "64",
                "-n",
                &UCX_MESSAGES.to_string(),
                "-c",
                &(pair % 2).to_string(),
            ]
            .map(str::to_owned)
            .to_vec();
            perftest(&args).stdout(Stdio::piped()).spawn().ok()
        })
        .collect::<Option<_>>()?;
    let mut total = 0.0;
    let deadline = Instant::now() + Duration::from_secs(60);
    for mut client in clients {
        while client.try_wait().ok()?.is_none() {
            if Instant::now() > deadline {
                let _ = client.kill();
                let _ = client.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let output = client.wait_with_output().ok()?;
        let text = String::from_utf8_lossy(&output.stdout);
        // Final: iterations, latency p50 / avg / overall, bandwidth avg / overall, message
        // rate avg / overall.
        let line = text.lines().find(|line| line.starts_with("Final:"))?;
        total += line.split_whitespace().nth(8)?.parse::<f64>().ok()?;
    }
    drop(servers);
    Some(total)
}

/// What a second host thread is asked to do.
enum Job {
    Rate,
    Stop,
}

fn main() {
    if let Ok(role) = std::env::var(CHILD_ENV) {
        urom_transport::sys::pin_current_thread(PEER_CORE).expect("pinning the peer");
        match role.as_str() {
            "stream" => stream_child(),
            "floor" => floor_child(),
            other => panic!("unknown role {other}"),
        }
        return;
    }
    let rounds: usize = std::env::args()
        .skip(1)
        .find_map(|arg| arg.parse().ok())
        .unwrap_or(10);
    let ucx = Command::new("ucx_perftest")
        .arg("-h")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !ucx {
        println!(
            "ucx_perftest not installed (apt-get install ucx-utils): the UCX column is skipped"
        );
    }

    let dir = TempDir::new("urom-rate-bench");
    let plugins = plugin_dir(&dir, &[("urom-plugin-graph", "worker_graph")]);
    // Started before this process pins itself, so that the daemon may use every core.
    let daemon = start_daemon(
        binary("urom-daemon", "urom-daemon"),
        plugins.to_str().unwrap(),
        &["--log-level", "30", "--sdk-log-level", "30"],
        true,
    );
    let service = Service::<Idle>::new()
        .set_socket(&daemon.socket)
        .start()
        .map_err(|(_, e)| e)
        .expect("starting the service");
    let graph = urom_testkit::host::graph_host(&service);

    std::thread::scope(|scope| {
        // The second host thread of the two-thread case, on core 1 with its worker on core 0.
        let (jobs, job) = mpsc::channel::<Job>();
        let (rates, rate) = mpsc::channel::<f64>();
        let (up, is_up) = mpsc::channel::<()>();
        let (service, graph) = (&service, &graph);
        scope.spawn(move || {
            urom_transport::sys::pin_current_thread(PEER_CORE)
                .expect("pinning the second host thread");
            let mut engine = ProgressEngine::new();
            let worker = start_worker(&mut engine, service, graph, HOST_CORE);
            let _ = up.send(());
            while let Ok(Job::Rate) = job.recv() {
                let _ = rates.send(api_rate(&mut engine, graph, &worker, 64));
            }
        });
        urom_transport::sys::pin_current_thread(HOST_CORE).expect("pinning the benchmark");
        let mut engine = ProgressEngine::new();
        let worker = start_worker(&mut engine, service, graph, PEER_CORE);
        let mut pair_engine = ProgressEngine::new();
        let pair_worker = start_worker(&mut pair_engine, service, graph, PEER_CORE);
        is_up
            .recv()
            .expect("the second host thread failed to start its worker");
        let mut next = 1u64;
        // Both host threads at 64 in flight: the commands of both over the time until both
        // were done.
        let mut pair_rate = || {
            jobs.send(Job::Rate).expect("the second host thread runs");
            let start = Instant::now();
            api_rate(&mut pair_engine, graph, &pair_worker, 64);
            rate.recv().expect("the second host thread's rate");
            (2 * API_COMMANDS) as f64 / start.elapsed().as_secs_f64()
        };

        if std::env::var_os("UROM_RATE_PROFILE").is_some() {
            // Only the host-API rate (or the lone command), for a profiler to watch.
            let mode = std::env::var("UROM_RATE_PROFILE").unwrap_or_default();
            for _ in 0..rounds {
                if mode == "pair" {
                    let b2 = pair_rate();
                    println!("(b) 2x2: {:5.1} M/s", b2 / 1e6);
                    std::thread::sleep(Duration::from_millis(300));
                } else if mode == "echo" {
                    let e64 = Stream::new().echo_rate(64);
                    println!("(e) 64 in flight: {:5.1} M/s", e64 / 1e6);
                } else if mode == "lone" {
                    let lone_ns = api_round_trip(&mut engine, graph, &worker);
                    println!("lone command: {lone_ns:5.1} ns");
                } else {
                    let b64 = api_rate(&mut engine, graph, &worker, 64);
                    println!("(b) 64 in flight: {:5.1} M/s", b64 / 1e6);
                }
            }
            let _ = jobs.send(Job::Stop);
            return;
        }
        let mut rows: Vec<[f64; 11]> = Vec::with_capacity(rounds);
        for round in 0..rounds {
            // The peers of the floor and the stream spin: they run only while measured.
            let floor_ns = Floor::new().round_trip(&mut next);
            let lone_ns = api_round_trip(&mut engine, graph, &worker);
            let mut stream = Stream::new();
            let a = stream.rate();
            let frame_ns = stream.round_trip();
            let e64 = stream.echo_rate(64);
            let e256 = stream.echo_rate(256);
            drop(stream);
            let b64 = api_rate(&mut engine, graph, &worker, 64);
            let b256 = api_rate(&mut engine, graph, &worker, 256);
            let c = if ucx {
                ucx_rate(1).unwrap_or(f64::NAN)
            } else {
                f64::NAN
            };
            let b2 = pair_rate();
            let c2 = if ucx {
                ucx_rate(2).unwrap_or(f64::NAN)
            } else {
                f64::NAN
            };
            // Four busy processes on two cores may leave the scheduler uneven for a moment.
            std::thread::sleep(Duration::from_millis(300));
            println!(
                "round {round:2}: (a) {:6.1} M/s  (b) 64: {:5.1}  256: {:5.1}  2x2: {:5.1} M/s  \
                 (c) {:5.1}  2 pairs: {:5.1} M/s  (e) 64: {:5.1}  256: {:5.1} M/s  \
                 floor {:5.1} ns  frame {:5.1} ns  lone {:5.1} ns",
                a / 1e6,
                b64 / 1e6,
                b256 / 1e6,
                b2 / 1e6,
                c / 1e6,
                c2 / 1e6,
                e64 / 1e6,
                e256 / 1e6,
                floor_ns,
                frame_ns,
                lone_ns
            );
            rows.push([
                a, b64, b256, b2, c, c2, floor_ns, frame_ns, lone_ns, e64, e256,
            ]);
        }
        let _ = jobs.send(Job::Stop);
        let column =
            |f: &dyn Fn(&[f64; 11]) -> f64| median(&mut rows.iter().map(f).collect::<Vec<_>>());
        println!();
        println!(
            "message rate, 64-byte commands, medians of {rounds} rounds (ratios: medians of per-round ratios)"
        );
        println!(
            "  (a) raw shm stream                     {:7.1} M frames/s",
            column(&|r| r[0]) / 1e6
        );
        for (name, i, ci, ei) in [
            ("64 in flight", 1, 4, Some(9)),
            ("256 in flight", 2, 4, Some(10)),
            ("2 hosts x 2 workers", 3, 5, None),
        ] {
            print!(
                "  (b) host API loopback, {name:<20}{:6.1} M/s   (b)/(c) = {:5.2}   (b)/(a) = {:4.2}",
                column(&|r| r[i]) / 1e6,
                column(&|r| r[i] / r[ci]),
                column(&|r| r[i] / r[0]),
            );
            match ei {
                Some(ei) => println!("   (b)/(e) = {:4.2}", column(&|r| r[i] / r[ei])),
                None => println!(),
            }
        }
        println!(
            "  (c) ucx_perftest ucp_am_bw (posix)     {:7.1} M msg/s",
            column(&|r| r[4]) / 1e6
        );
        println!(
            "  (c) the same, two pairs at once        {:7.1} M msg/s",
            column(&|r| r[5]) / 1e6
        );
        for (name, i) in [("64 in flight", 9), ("256 in flight", 10)] {
            println!(
                "  (e) raw shm echo, {name:<25}{:6.1} M/s   (e)/(a) = {:4.2}",
                column(&|r| r[i]) / 1e6,
                column(&|r| r[i] / r[0]),
            );
        }
        println!(
            "  floor: one cache line per direction    {:7.1} ns",
            column(&|r| r[6])
        );
        println!(
            "  shm round trip, 64-byte urom frame     {:7.1} ns   x{:.2} of the floor",
            column(&|r| r[7]),
            column(&|r| r[7] / r[6])
        );
        println!(
            "  lone command through the host API      {:7.1} ns   x{:.2} of the floor",
            column(&|r| r[8]),
            column(&|r| r[8] / r[6])
        );
    });
    service.stop();
}
