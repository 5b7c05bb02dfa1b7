//! `gpu-offload-client`: threads x iterations x pipelined requests against a server, every
//! response checked, then the statistics block.
//!
//! Each thread opens its own connection, keeps up to `--max-concurrent-messages` requests in
//! flight (sending a batch of requests with one `write` whenever responses came back), and
//! compares every response with the expected one byte for byte, header included. Responses
//! are parsed from a stream buffer, so one that straddles two reads is read correctly.
//!
//! Ctrl-C (or SIGTERM) ends a run early: each thread sends nothing more, takes and checks the
//! answers to what it already sent for at most [`STOP_GRACE`], and the statistics cover the
//! requests done. A thread never blocks for longer than [`STOP_POLL`] without looking at the
//! stop flag, so a stalled server cannot hold a stopped client.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use urom_wire::DecodeError;
use urom_wire::gpu::{CLIENT_HEADER_LEN, GpuMessage, message_length};

use crate::cli::JsonArgs;
use crate::limits::{self, MIN_READ_BUFFER};

/// Sends requests to a gpu-offload server, checks every response and prints throughput.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "gpu-offload-client",
    version,
    disable_version_flag = true,
    args_override_self = true
)]
pub struct ClientArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: crate::cli::CommonArgs,

    /// Server address (IP or host name).
    #[arg(short = 's', long, value_name = "IP ADDR")]
    pub server_ip_address: String,

    /// Server TCP port.
    #[arg(short = 'p', long, value_name = "IP PORT")]
    pub server_ip_port: u16,

    /// Threads, each with its own connection.
    #[arg(short = 't', long, value_name = "THREAD_COUNT", value_parser = clap::value_parser!(u32).range(1..=i64::from(limits::MAX_CLIENT_THREADS)))]
    pub thread_count: u32,

    /// Requests each thread sends.
    #[arg(short = 'i', long, value_name = "ITERATION_COUNT")]
    pub iteration_count: u64,

    /// The request's payload: text, or `hex:` and its bytes in hexadecimal (`hex:c3a9`).
    #[arg(short = 'm', long, value_name = "MESSAGE", allow_hyphen_values = true)]
    pub message_string: String,

    /// The payload every response must carry (the message's bytes reversed, for the
    /// byte-reversing processors): text, or `hex:` and its bytes in hexadecimal, for bytes
    /// that are no text (`-m é -e hex:a9c3`).
    #[arg(
        short = 'e',
        long,
        value_name = "EXPECTED RESPONSE",
        allow_hyphen_values = true
    )]
    pub expected_response: String,

    /// Requests each thread keeps in flight.
    #[arg(long, value_name = "NUM_MESSAGES", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=i64::from(limits::MAX_CLIENT_CONCURRENT)))]
    pub max_concurrent_messages: u32,

    /// Give up when no response arrives for this long, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    pub response_timeout: u64,
}

impl JsonArgs for ClientArgs {}

/// What a client run does.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// The server.
    pub server: SocketAddr,
    /// Threads, one connection each.
    pub threads: usize,
    /// Requests per thread.
    pub iterations: u64,
    /// Request payload.
    pub message: Vec<u8>,
    /// Expected response payload.
    pub expected: Vec<u8>,
    /// Requests in flight per thread.
    pub pipeline: usize,
    /// Longest wait for a response.
    pub timeout: Duration,
}

impl ClientConfig {
    /// The run the command line describes.
    pub fn from_args(args: &ClientArgs) -> Result<Self, ClientError> {
        let host = (args.server_ip_address.as_str(), args.server_ip_port);
        let server = host
            .to_socket_addrs()
            .ok()
            .and_then(|mut addrs| addrs.next())
            .ok_or_else(|| ClientError::Resolve(args.server_ip_address.clone()))?;
        Ok(Self {
            server,
            threads: args.thread_count as usize,
            iterations: args.iteration_count,
            message: payload("-m", &args.message_string)?,
            expected: payload("-e", &args.expected_response)?,
            pipeline: args.max_concurrent_messages as usize,
            timeout: Duration::from_secs(args.response_timeout),
        })
    }
}

/// A `-m` or `-e` value's bytes: its text's, or after `hex:` the bytes its hexadecimal
/// digits spell.
fn payload(flag: &'static str, value: &str) -> Result<Vec<u8>, ClientError> {
    let Some(digits) = value.strip_prefix(HEX_PREFIX) else {
        return Ok(value.as_bytes().to_vec());
    };
    let bad = |reason| ClientError::BadHex { flag, reason };
    if digits.len() % 2 != 0 {
        return Err(bad("an odd number of hexadecimal digits"));
    }
    digits
        .as_bytes()
        .chunks(2)
        .map(|pair| {
            std::str::from_utf8(pair)
                .ok()
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
                .ok_or(bad("a character that is no hexadecimal digit"))
        })
        .collect()
}

/// What starts a `-m` or `-e` value given as hexadecimal bytes.
pub const HEX_PREFIX: &str = "hex:";

/// What a run measured.
#[derive(Clone, Copy, Debug)]
pub struct Stats {
    /// From the first request to the last response.
    pub duration: Duration,
    /// Requests answered and validated.
    pub operations: u64,
    /// Bytes sent, headers included.
    pub tx_bytes: u64,
    /// Bytes received, headers included.
    pub rx_bytes: u64,
    /// The run was stopped before every thread sent all its requests.
    pub interrupted: bool,
    /// Requests sent whose answers had not come [`STOP_GRACE`] after the stop.
    pub unanswered: u64,
}

impl Stats {
    /// Millions of operations per second.
    pub fn miops(&self) -> f64 {
        self.operations as f64 / self.duration.as_secs_f64().max(1e-9) / 1e6
    }

    fn gib_per_s(&self, bytes: u64) -> f64 {
        bytes as f64 / self.duration.as_secs_f64().max(1e-9) / (1u64 << 30) as f64
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rule = "+================================================+";
        writeln!(f, "{rule}")?;
        writeln!(f, "| Stats")?;
        writeln!(f, "{rule}")?;
        writeln!(f, "| Duration:          {} us", self.duration.as_micros())?;
        writeln!(f, "| Operation count:   {}", self.operations)?;
        writeln!(
            f,
            "| Data rate (Tx):    {:.6} GiB/s",
            self.gib_per_s(self.tx_bytes)
        )?;
        writeln!(
            f,
            "| Data rate (Rx):    {:.6} GiB/s",
            self.gib_per_s(self.rx_bytes)
        )?;
        writeln!(f, "| IO rate:           {:.6} MIOP/s", self.miops())?;
        write!(f, "{rule}")
    }
}

/// What a new connection to the server finds, asked after the server closed one: whether the
/// server is still there tells a refused client from a server that went away.
#[derive(Debug)]
pub enum ServerProbe {
    /// The server accepted the connection: it is up, and closed this client alone (it
    /// refused it, or lost its requests with its orchestrator).
    Accepting,
    /// The connection was refused: the server stopped listening (it was stopped or ended).
    Refused,
    /// Neither could be told.
    Unknown(io::Error),
}

impl ServerProbe {
    /// Connects to `server` and hangs up.
    fn of(server: SocketAddr) -> Self {
        match TcpStream::connect_timeout(&server, PROBE_TIMEOUT) {
            Ok(_) => Self::Accepting,
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => Self::Refused,
            Err(e) => Self::Unknown(e),
        }
    }
}

/// How long the client waits for a connection that tells whether the server is still there.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest a thread blocks in a read or a write before it looks at the stop flag again.
pub const STOP_POLL: Duration = Duration::from_millis(10);

/// After a stop, how long a thread still takes the answers to what it sent.
pub const STOP_GRACE: Duration = Duration::from_millis(50);

/// Why a client run failed.
#[derive(Debug)]
pub enum ClientError {
    /// The server address did not resolve.
    Resolve(String),
    /// A `-m` or `-e` value after `hex:` is not hexadecimal bytes.
    BadHex {
        /// The flag.
        flag: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
    /// A message is longer than a `u32` length field holds.
    MessageTooLong(usize),
    /// A thread could not connect.
    Connect {
        /// The server.
        server: SocketAddr,
        /// What the OS said.
        source: io::Error,
    },
    /// A read or write failed.
    Io {
        /// The thread.
        thread: usize,
        /// What the OS said.
        source: io::Error,
    },
    /// No response arrived in time.
    Timeout {
        /// The thread.
        thread: usize,
        /// Responses it had received.
        received: u64,
    },
    /// The server closed the connection (or reset it) before answering everything.
    ServerClosed {
        /// The thread.
        thread: usize,
        /// Responses it had received.
        received: u64,
        /// Responses it expected.
        expected: u64,
        /// Requests it had sent.
        sent: u64,
        /// Payload bytes of each request.
        payload: usize,
        /// What a new connection to the server found just after.
        server: ServerProbe,
    },
    /// A response's header is impossible.
    Malformed {
        /// The thread.
        thread: usize,
        /// Which response (from 0).
        index: u64,
        /// What is wrong.
        error: DecodeError,
    },
    /// A response is well formed but not the expected one.
    Mismatch {
        /// The thread.
        thread: usize,
        /// Which response (from 0).
        index: u64,
        /// How it differs.
        reason: String,
    },
    /// A thread panicked.
    Panicked(usize),
    /// The run was stopped (Ctrl-C) before all requests were sent.
    Interrupted {
        /// Requests answered and checked.
        done: u64,
        /// Requests the run was to send.
        planned: u64,
        /// Requests sent whose answers had not come [`STOP_GRACE`] after the stop.
        unanswered: u64,
    },
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Resolve(host) => write!(f, "cannot resolve server address `{host}`"),
            Self::BadHex { flag, reason } => write!(
                f,
                "{flag} hex:...: {reason}; give two hexadecimal digits per byte, e.g. hex:c3a9"
            ),
            Self::MessageTooLong(len) => {
                write!(f, "a {len}-byte message does not fit the wire format")
            }
            Self::Connect { server, source } => write!(f, "cannot connect to {server}: {source}"),
            Self::Io { thread, source } => write!(f, "thread {thread}: {source}"),
            Self::Timeout { thread, received } => write!(
                f,
                "thread {thread}: no response in time after {received} responses"
            ),
            Self::ServerClosed {
                thread,
                received,
                expected,
                sent,
                payload,
                server,
            } => {
                write!(
                    f,
                    "thread {thread}: the server closed the connection after {received} of \
                     {expected} responses"
                )?;
                if sent > received {
                    write!(f, ", {} requests sent unanswered", sent - received)?;
                }
                match server {
                    ServerProbe::Refused => f.write_str(
                        "; it accepts no new connections: it was stopped, or it ended (for \
                         example because its orchestrator went away)",
                    ),
                    ServerProbe::Accepting => write!(
                        f,
                        "; it still accepts connections, so it closed this connection alone: \
                         it lost the requests in flight when its orchestrator went away, or it \
                         refused this client, for example for a request longer than its \
                         --max-message-length (these requests have {payload}-byte payloads) or \
                         for too many clients waiting (see the server's log)"
                    ),
                    ServerProbe::Unknown(e) => {
                        write!(f, "; whether it still runs is unknown: {e}")
                    }
                }
            }
            Self::Malformed {
                thread,
                index,
                error,
            } => write!(f, "thread {thread}: response {index} is malformed: {error}"),
            Self::Mismatch {
                thread,
                index,
                reason,
            } => write!(f, "thread {thread}: response {index} is wrong: {reason}"),
            Self::Panicked(thread) => write!(f, "thread {thread} panicked"),
            Self::Interrupted {
                done,
                planned,
                unanswered: 0,
            } => write!(
                f,
                "interrupted after {done} of {planned} requests, every one answered and checked"
            ),
            Self::Interrupted {
                done,
                planned,
                unanswered,
            } => write!(
                f,
                "interrupted after {done} of {planned} requests answered and checked; \
                 {unanswered} more were sent but not answered within {} ms of the stop (the \
                 server stalled or is slow)",
                STOP_GRACE.as_millis()
            ),
        }
    }
}

impl std::error::Error for ClientError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Connect { source, .. } | Self::Io { source, .. } => Some(source),
            Self::ServerClosed {
                server: ServerProbe::Unknown(e),
                ..
            } => Some(e),
            Self::Malformed { error, .. } => Some(error),
            _ => None,
        }
    }
}

/// Runs the threads and returns what they measured, or the first failure.
pub fn run(config: &ClientConfig) -> Result<Stats, ClientError> {
    run_until(config, &AtomicBool::new(false))
}

/// As [`run`], but ends early once `stop` is set: each thread sends nothing more and takes the
/// answers to what it sent; the statistics cover the requests done.
pub fn run_until(config: &ClientConfig, stop: &AtomicBool) -> Result<Stats, ClientError> {
    let request_len = CLIENT_HEADER_LEN + config.message.len();
    let response_len = CLIENT_HEADER_LEN + config.expected.len();
    if u32::try_from(request_len.max(response_len)).is_err() {
        return Err(ClientError::MessageTooLong(
            config.message.len().max(config.expected.len()),
        ));
    }
    let barrier = Barrier::new(config.threads);
    let results: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..config.threads)
            .map(|thread| {
                let barrier = &barrier;
                scope.spawn(move || run_thread(thread, config, barrier, stop))
            })
            .collect();
        handles.into_iter().map(|handle| handle.join()).collect()
    });
    let mut first: Option<Instant> = None;
    let mut last: Option<Instant> = None;
    let mut operations = 0;
    let mut unanswered = 0;
    let mut failure = None;
    for (thread, result) in results.into_iter().enumerate() {
        match result {
            Ok(Ok(done)) => {
                first = Some(first.map_or(done.start, |f| f.min(done.start)));
                last = Some(last.map_or(done.end, |l| l.max(done.end)));
                operations += done.answered;
                unanswered += done.unanswered;
            }
            Ok(Err(e)) => failure = failure.or(Some(e)),
            Err(_) => failure = failure.or(Some(ClientError::Panicked(thread))),
        }
    }
    if let Some(e) = failure {
        return Err(e);
    }
    Ok(Stats {
        duration: match (first, last) {
            (Some(first), Some(last)) => last - first,
            _ => Duration::ZERO,
        },
        operations,
        tx_bytes: operations * request_len as u64,
        rx_bytes: operations * response_len as u64,
        interrupted: operations < config.iterations * config.threads as u64,
        unanswered,
    })
}

/// What one thread did.
struct ThreadRun {
    start: Instant,
    end: Instant,
    /// Requests answered and checked.
    answered: u64,
    /// Requests sent whose answers had not come [`STOP_GRACE`] after the stop.
    unanswered: u64,
}

fn encode(message: GpuMessage<'_>) -> Vec<u8> {
    let mut frame = vec![0u8; message.buffer_len()];
    message
        .emit(&mut frame, usize::MAX)
        .expect("length checked by run");
    frame
}

/// One thread: connects, waits for the others, runs until done or `stop`.
fn run_thread(
    thread: usize,
    config: &ClientConfig,
    barrier: &Barrier,
    stop: &AtomicBool,
) -> Result<ThreadRun, ClientError> {
    let connected = TcpStream::connect(config.server).map_err(|source| ClientError::Connect {
        server: config.server,
        source,
    });
    // Wait for the others even after a failure, so that nobody waits forever.
    barrier.wait();
    let mut stream = connected?;
    let io_error = |source| ClientError::Io { thread, source };
    let server_closed = |received, sent| ClientError::ServerClosed {
        thread,
        received,
        expected: config.iterations,
        sent,
        payload: config.message.len(),
        server: ServerProbe::of(config.server),
    };
    stream.set_nodelay(true).map_err(io_error)?;
    // Short timeouts, so that a stalled server cannot keep this thread from the stop flag;
    // `config.timeout` is measured across them.
    stream.set_read_timeout(Some(STOP_POLL)).map_err(io_error)?;
    stream
        .set_write_timeout(Some(STOP_POLL))
        .map_err(io_error)?;
    let request = encode(GpuMessage::ClientRequest(&config.message));
    let expected = encode(GpuMessage::ClientResponse(&config.expected));
    let pipeline = config.pipeline.max(1);
    let batch: Vec<u8> = request
        .iter()
        .copied()
        .cycle()
        .take(request.len() * pipeline)
        .collect();
    let request_len = request.len();
    let mut rbuf = vec![0u8; MIN_READ_BUFFER.max(2 * expected.len())];
    let (mut rstart, mut rend) = (0usize, 0usize);
    // `queued` requests are committed to the stream, of which the last `unwritten` bytes are
    // not written yet; a request counts as sent once its last byte is written.
    let (mut queued, mut unwritten, mut received) = (0u64, 0usize, 0u64);
    let sent = |queued: u64, unwritten: usize| queued - unwritten.div_ceil(request_len) as u64;
    // Since when neither a read nor a write moved a byte.
    let mut idle_since: Option<Instant> = None;
    let mut stopped_at: Option<Instant> = None;
    let start = Instant::now();
    let mut total = config.iterations;
    while received < total {
        if stopped_at.is_none() && stop.load(Ordering::Relaxed) {
            // Send nothing more, not even the rest of a request half written.
            queued = sent(queued, unwritten);
            unwritten = 0;
            total = queued;
            stopped_at = Some(Instant::now());
            if received == total {
                break;
            }
        }
        if stopped_at.is_some_and(|at| at.elapsed() >= STOP_GRACE) {
            break;
        }
        let in_flight = (queued - received) as usize;
        let to_send = (pipeline - in_flight).min((total - queued) as usize);
        if to_send > 0 {
            queued += to_send as u64;
            unwritten += to_send * request_len;
        }
        if unwritten > 0 {
            // The stream holds identical requests: the next byte is at this offset of one.
            let at = (request_len - unwritten % request_len) % request_len;
            let len = unwritten.min(batch.len() - at);
            match stream.write(&batch[at..at + len]) {
                Ok(n) => {
                    unwritten -= n;
                    idle_since = None;
                }
                Err(e) if is_no_progress(&e) => {
                    idle_since.get_or_insert_with(Instant::now);
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
                    ) =>
                {
                    return Err(server_closed(received, sent(queued, unwritten)));
                }
                Err(e) => return Err(io_error(e)),
            }
        }
        if idle_since.is_some_and(|since| since.elapsed() >= config.timeout) {
            return Err(ClientError::Timeout { thread, received });
        }
        if unwritten > 0 && sent(queued, unwritten) == received {
            // Nothing can be answered before more is written.
            continue;
        }
        if rstart > 0 {
            rbuf.copy_within(rstart..rend, 0);
            rend -= rstart;
            rstart = 0;
        }
        let n = match stream.read(&mut rbuf[rend..]) {
            Ok(0) => return Err(server_closed(received, sent(queued, unwritten))),
            Ok(n) => {
                idle_since = None;
                n
            }
            Err(e) if is_no_progress(&e) => {
                let since = *idle_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= config.timeout {
                    return Err(ClientError::Timeout { thread, received });
                }
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                return Err(server_closed(received, sent(queued, unwritten)));
            }
            Err(e) => return Err(io_error(e)),
        };
        rend += n;
        loop {
            let available = &rbuf[rstart..rend];
            let len = match message_length(available, config.expected.len()) {
                Ok(Some(len)) if len <= available.len() => len,
                Ok(_) => break,
                Err(error) => {
                    return Err(ClientError::Malformed {
                        thread,
                        index: received,
                        error,
                    });
                }
            };
            if received >= sent(queued, unwritten) {
                return Err(ClientError::Mismatch {
                    thread,
                    index: received,
                    reason: "a response arrived for a request never sent".to_owned(),
                });
            }
            let response = &available[..len];
            if response != expected.as_slice() {
                return Err(ClientError::Mismatch {
                    thread,
                    index: received,
                    reason: describe_mismatch(response, &expected),
                });
            }
            received += 1;
            rstart += len;
        }
    }
    Ok(ThreadRun {
        start,
        end: Instant::now(),
        answered: received,
        unanswered: queued - received,
    })
}

/// How `response` differs from `expected` (both whole messages).
fn describe_mismatch(response: &[u8], expected: &[u8]) -> String {
    match GpuMessage::parse(response, usize::MAX) {
        Ok(GpuMessage::ClientResponse(payload)) => {
            let want = &expected[CLIENT_HEADER_LEN..];
            if payload.len() != want.len() {
                format!("{} payload bytes, expected {}", payload.len(), want.len())
            } else {
                let at = payload
                    .iter()
                    .zip(want)
                    .position(|(a, b)| a != b)
                    .unwrap_or(0);
                format!(
                    "payload {:?} differs from the expected {:?} at byte {at}",
                    String::from_utf8_lossy(payload),
                    String::from_utf8_lossy(want)
                )
            }
        }
        Ok(other) => format!("message id {:?}, expected ClientResponse", other.msg_id()),
        Err(e) => format!("cannot be parsed: {e}"),
    }
}

/// Whether a socket call that failed with `e` only made no progress this time (its timeout
/// passed, or a signal interrupted it): the caller goes on.
fn is_no_progress(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_block_names_every_figure() {
        let stats = Stats {
            duration: Duration::from_secs(2),
            operations: 2_000_000,
            tx_bytes: 1 << 31,
            rx_bytes: 1 << 30,
            interrupted: false,
            unanswered: 0,
        };
        let text = stats.to_string();
        assert!(text.contains("Duration:          2000000 us"), "{text}");
        assert!(text.contains("Operation count:   2000000"), "{text}");
        assert!(text.contains("Data rate (Tx):    1.000000 GiB/s"), "{text}");
        assert!(text.contains("Data rate (Rx):    0.500000 GiB/s"), "{text}");
        assert!(
            text.contains("IO rate:           1.000000 MIOP/s"),
            "{text}"
        );
    }

    #[test]
    fn payloads_are_text_or_hex_bytes() {
        assert_eq!(payload("-m", "abc").unwrap(), b"abc");
        assert_eq!(payload("-e", "hex:a9C3").unwrap(), [0xa9, 0xc3]);
        assert_eq!(payload("-e", "hex:").unwrap(), b"");
        assert!(
            payload("-e", "hex:a9c")
                .unwrap_err()
                .to_string()
                .contains("odd")
        );
        assert!(
            payload("-e", "hex:zz")
                .unwrap_err()
                .to_string()
                .contains("-e hex:")
        );
    }

    #[test]
    fn mismatches_say_what_differs() {
        let expected = encode(GpuMessage::ClientResponse(b"DCBA"));
        let wrong = encode(GpuMessage::ClientResponse(b"DCXA"));
        assert!(describe_mismatch(&wrong, &expected).contains("at byte 2"));
        let short = encode(GpuMessage::ClientResponse(b"DC"));
        assert!(describe_mismatch(&short, &expected).contains("2 payload bytes, expected 4"));
        let request = encode(GpuMessage::ClientRequest(b"DCBA"));
        assert!(describe_mismatch(&request, &expected).contains("ClientRequest"));
    }
}
