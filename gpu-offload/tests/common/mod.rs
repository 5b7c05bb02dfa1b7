//! What the gpu-offload process tests share: starting a server and an orchestrator as
//! processes on loopback, running clients, raw sockets.
#![allow(dead_code)]

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use urom_testkit::{ChildGuard, TempDir};
use urom_wire::gpu::CLIENT_HEADER_LEN;

pub const SIGINT: i32 = 2;
pub const SIGTERM: i32 = 15;
pub const SIGCONT: i32 = 18;
pub const SIGSTOP: i32 = 19;
pub const TIMEOUT: Duration = Duration::from_secs(60);

pub const SERVER: &str = env!("CARGO_BIN_EXE_gpu-offload-server");
pub const ORCHESTRATOR: &str = env!("CARGO_BIN_EXE_gpu-offload-orchestrator");
pub const CLIENT: &str = env!("CARGO_BIN_EXE_gpu-offload-client");

/// Two CPUs this process may run on, to pin the server's threads to: the first two allowed,
/// or the only one twice.
pub fn two_cpus() -> [usize; 2] {
    let allowed =
        nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).expect("sched_getaffinity");
    let mut cpus =
        (0..nix::sched::CpuSet::count()).filter(|&cpu| allowed.is_set(cpu).unwrap_or(false));
    let first = cpus.next().expect("no CPU allowed");
    [first, cpus.next().unwrap_or(first)]
}

pub struct Stack {
    pub server: ChildGuard,
    pub orchestrator: ChildGuard,
    pub port: u16,
    pub dir: TempDir,
}

impl Stack {
    /// Starts a server on loopback with one thread per entry of `cpus`, then an orchestrator
    /// with `threads` processor threads, and waits until clients may connect.
    pub fn start(cpus: &[usize], threads: u32, server_extra: &[&str], orch_extra: &[&str]) -> Self {
        Self::start_command(
            Command::new(SERVER),
            cpus,
            threads,
            server_extra,
            orch_extra,
        )
    }

    /// [`Stack::start`] with the server started by `server` (the server program and any
    /// arguments before its own), which must keep its process id.
    pub fn start_command(
        mut server: Command,
        cpus: &[usize],
        threads: u32,
        server_extra: &[&str],
        orch_extra: &[&str],
    ) -> Self {
        let dir = TempDir::new("gpu-offload-test");
        let socket = dir.path().join("channel.sock");
        server.args(["-c", socket.to_str().unwrap(), "-p", "0", "-a", "127.0.0.1"]);
        for cpu in cpus {
            server.arg("--cpu").arg(cpu.to_string());
        }
        server
            .args(server_extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::from(
                File::create(dir.path().join("server.log")).unwrap(),
            ));
        let mut server = ChildGuard(server.spawn().expect("starting the server"));
        let orchestrator = Command::new(ORCHESTRATOR)
            .args(["-c", socket.to_str().unwrap(), "-t", &threads.to_string()])
            .args(orch_extra)
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                File::create(dir.path().join("orchestrator.log")).unwrap(),
            ))
            .spawn()
            .expect("starting the orchestrator");
        let orchestrator = ChildGuard(orchestrator);
        let port = listening_port(&mut server).unwrap_or_else(|| {
            panic!(
                "the server never listened; its log:\n{}\norchestrator:\n{}",
                read(&dir.path().join("server.log")),
                read(&dir.path().join("orchestrator.log"))
            )
        });
        Self {
            server,
            orchestrator,
            port,
            dir,
        }
    }

    /// The default stack: two server threads, two processor threads.
    pub fn two_threads() -> Self {
        Self::start(&two_cpus(), 2, &[], &[])
    }

    pub fn server_log(&self) -> String {
        read(&self.dir.path().join("server.log"))
    }

    pub fn orchestrator_log(&self) -> String {
        read(&self.dir.path().join("orchestrator.log"))
    }

    pub fn connect(&self) -> TcpStream {
        let stream = TcpStream::connect(("127.0.0.1", self.port)).expect("connecting");
        stream.set_read_timeout(Some(TIMEOUT)).unwrap();
        stream.set_nodelay(true).unwrap();
        stream
    }

    /// Stops both with `signal` sent to the server or the orchestrator while a client of
    /// `threads` x `pipeline` runs endlessly; checks that both exit 0 and that the client,
    /// every answer it got having been right, saw a clean end of file (not a reset).
    pub fn stop_during_a_run(self, signal: i32, server_side: bool, threads: u32, pipeline: u32) {
        let port = self.port;
        let running = std::thread::spawn(move || {
            run_client(port, threads, u64::MAX / 8, "xyz", "zyx", pipeline)
        });
        std::thread::sleep(Duration::from_millis(500));
        self.stop_with(signal, server_side);
        let output = running.join().unwrap();
        assert_eq!(output.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("the server closed the connection after")
                && stderr.contains("it accepts no new connections: it was stopped")
                && !stderr.contains("--max-message-length"),
            "{stderr}"
        );
    }

    /// Stops both with `signal` sent to `which`, checks that both exit 0, and returns the
    /// orchestrator's log.
    pub fn stop_with(mut self, signal: i32, server_side: bool) -> String {
        if server_side {
            self.server.signal(signal);
        } else {
            self.orchestrator.signal(signal);
        }
        let server = self
            .server
            .wait_timeout(TIMEOUT)
            .expect("the server did not stop");
        let orchestrator = self
            .orchestrator
            .wait_timeout(TIMEOUT)
            .expect("the orchestrator did not stop");
        assert!(
            server.success() && orchestrator.success(),
            "server {server}, orchestrator {orchestrator}\nserver log:\n{}\norchestrator log:\n{}",
            self.server_log(),
            self.orchestrator_log()
        );
        self.orchestrator_log()
    }
}

/// The port of the server's `listening on <addr>` line, its first, waited for at most
/// [`TIMEOUT`]; keeps reading its output after, so that the pipe stays open while it runs.
pub fn listening_port(server: &mut ChildGuard) -> Option<u16> {
    let stdout = server.0.stdout.take()?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        let port = lines.next().and_then(Result::ok).and_then(|line| {
            line.strip_prefix("listening on ")
                .and_then(|addr| addr.rsplit(':').next())
                .and_then(|port| port.parse::<u16>().ok())
        });
        let _ = tx.send(port);
        for _ in lines {}
    });
    rx.recv_timeout(TIMEOUT).ok().flatten()
}

pub fn read(path: &std::path::Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Runs the client binary against the server at `port`: `threads` x `iterations` requests of
/// `message`, `pipeline` in flight per thread, every response checked against `expected`.
pub fn run_client(
    port: u16,
    threads: u32,
    iterations: u64,
    message: &str,
    expected: &str,
    pipeline: u32,
) -> Output {
    Command::new(CLIENT)
        .args(["-s", "127.0.0.1", "-p", &port.to_string()])
        .args(["-t", &threads.to_string(), "-i", &iterations.to_string()])
        .args(["-m", message, "-e", expected])
        .args(["--max-concurrent-messages", &pipeline.to_string()])
        .args(["--response-timeout", "60"])
        .output()
        .expect("running the client")
}

/// The standard output and error, read to their end, of a child started with both piped.
pub fn finished_output(child: &mut ChildGuard) -> (String, String) {
    let (mut stdout, mut stderr) = (String::new(), String::new());
    let out = child.0.stdout.take().expect("a piped standard output");
    BufReader::new(out).read_to_string(&mut stdout).unwrap();
    let err = child.0.stderr.take().expect("a piped standard error");
    BufReader::new(err).read_to_string(&mut stderr).unwrap();
    (stdout, stderr)
}

/// `len` letters, a to z over and over.
pub fn message_of(len: usize) -> String {
    (0..len).map(|i| (b'a' + (i % 26) as u8) as char).collect()
}

/// Checks that a client run succeeded, printed the statistics block and counted `operations`.
pub fn assert_client_ok(output: &Output, operations: u64, what: &str) {
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{what}: client failed: {}\n{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    for field in [
        "Duration:",
        "Data rate (Tx):",
        "Data rate (Rx):",
        "IO rate:",
        "MIOP/s",
    ] {
        assert!(stdout.contains(field), "{what}: no `{field}` in\n{stdout}");
    }
    assert!(
        stdout.contains(&format!("Operation count:   {operations}\n")),
        "{what}: wrong operation count in\n{stdout}"
    );
}

/// Clients of 1 and 4 threads, 1 and 128 requests in flight, payloads of every length in
/// `lens`: every response checked by the client.
pub fn check_every_shape(stack: &Stack, lens: &[usize]) {
    check_shapes(
        lens,
        |_, pipeline| if pipeline == 1 { 50 } else { 1_000 },
        |threads, iterations, message, expected, pipeline| {
            run_client(stack.port, threads, iterations, message, expected, pipeline)
        },
        || stack.orchestrator_log(),
    );
}

/// Clients of 1 and 4 threads, 1 and 128 requests in flight, payloads of every length in
/// `lens`, `iterations(len, pipeline)` requests per thread: each run by `client(threads,
/// iterations, message, expected, pipeline)`, every response checked by the client; a failure
/// shows what `logs` gives.
pub fn check_shapes(
    lens: &[usize],
    iterations: impl Fn(usize, u32) -> u64,
    client: impl Fn(u32, u64, &str, &str, u32) -> Output,
    logs: impl Fn() -> String,
) {
    for threads in [1u32, 4] {
        for pipeline in [1u32, 128] {
            for &len in lens {
                let message = message_of(len);
                let iterations = iterations(len, pipeline);
                let output = client(threads, iterations, &message, &reversed(&message), pipeline);
                assert_client_ok(
                    &output,
                    u64::from(threads) * iterations,
                    &format!(
                        "{threads} threads, pipeline {pipeline}, {len} bytes\n{}",
                        logs()
                    ),
                );
            }
        }
    }
}

/// Checks that a server of two data-path threads (`server`, which wrote `server_err`) and an
/// orchestrator of three (`orchestrator`) both refused, with the message naming both counts.
pub fn assert_thread_count_mismatch(server: ExitStatus, server_err: &str, orchestrator: &Output) {
    let orchestrator_err = String::from_utf8_lossy(&orchestrator.stderr);
    assert!(!server.success() && !orchestrator.status.success());
    for text in [server_err, &orchestrator_err[..]] {
        assert!(
            text.contains("thread count mismatch: the server has 2 data-path threads")
                && text.contains("(-t 3)"),
            "{text}"
        );
    }
}

pub fn reversed(message: &str) -> String {
    message.chars().rev().collect()
}

/// A big-endian request frame built by hand.
pub fn request_frame(payload: &[u8]) -> Vec<u8> {
    frame(4, payload)
}

/// A big-endian frame with `msg_id`, its length word and `payload`.
pub fn frame(msg_id: u32, payload: &[u8]) -> Vec<u8> {
    let mut frame = Vec::new();
    frame.extend_from_slice(&((CLIENT_HEADER_LEN + payload.len()) as u32).to_be_bytes());
    frame.extend_from_slice(&msg_id.to_be_bytes());
    frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    frame.extend_from_slice(payload);
    frame
}

/// Reads exactly `len` bytes or panics.
pub fn read_exactly(stream: &mut TcpStream, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    stream.read_exact(&mut buf).expect("reading a response");
    buf
}

/// Whether the server closes `stream` (end of file or reset) within the timeout, reading and
/// discarding anything before.
pub fn closed_by_server(stream: &mut TcpStream) -> bool {
    let deadline = Instant::now() + TIMEOUT;
    let mut buf = [0u8; 1024];
    while Instant::now() < deadline {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false;
            }
            Err(_) => return true,
        }
    }
    false
}

/// Sends one request on a fresh connection and checks the byte-for-byte answer.
pub fn round_trip(stack: &Stack, payload: &[u8]) {
    let mut stream = stack.connect();
    stream.write_all(&request_frame(payload)).unwrap();
    let mut want = frame(5, &payload.iter().rev().copied().collect::<Vec<_>>());
    want.shrink_to_fit();
    assert_eq!(read_exactly(&mut stream, want.len()), want);
    stream.shutdown(Shutdown::Write).unwrap();
    assert!(closed_by_server(&mut stream));
}

pub fn socket_path(dir: &TempDir) -> PathBuf {
    dir.path().join("channel.sock")
}
