//! A peer of a daemon or a worker, run as another user by tests that need one:
//!
//! * `urom-test-host SOCKET`: connects to a daemon and authenticates; prints `accepted`, or
//!   `refused <status>: <reason>`; exits 0 or 3.
//! * `urom-test-host --spawn SOCKET [NAME=value...]`: then spawns a worker running plugin 1
//!   with those environment entries; prints `spawned <id> <socket>` and keeps the connection,
//!   and so the worker, until its standard input ends; or prints `refused <status>: <reason>`
//!   and exits 3.
//! * `urom-test-host --silent COUNT SOCKET`: opens up to COUNT connections to a daemon and
//!   sends nothing; prints `connected <n>`, keeps them until its standard input ends, then
//!   gives each up to 30 s to end and prints how they ended, one `<count> <how>` line per way:
//!   `refused <status>` (an error reply), `closed` (hung up without one) or `open`.
//! * `urom-test-host --worker SOCKET`: connects to a worker's socket; prints `offered` when the
//!   worker starts setting up a channel, `closed` when it hangs up instead, or
//!   `cannot connect: <error>`.
//!
//! Cannot connect (to a daemon) exits 1; a bad command line, 2.

use std::collections::BTreeMap;
use std::io::{self, BufRead, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use urom_testkit::control::ControlClient;

/// How long the daemon has to come up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `--silent` gives its connections to end, all together.
const SILENT_PATIENCE: Duration = Duration::from_secs(30);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    match words.as_slice() {
        [socket] => authenticate(socket.as_ref()).map_or_else(|code| code, |_| ExitCode::SUCCESS),
        ["--spawn", socket, env @ ..] => spawn(socket.as_ref(), env),
        ["--silent", count, socket] => match count.parse() {
            Ok(count) => silent(count, socket.as_ref()),
            Err(_) => usage(),
        },
        ["--worker", socket] => worker(socket.as_ref()),
        _ => usage(),
    }
}

fn usage() -> ExitCode {
    eprintln!(
        "usage: urom-test-host [--spawn SOCKET [NAME=value...] | --silent COUNT SOCKET | \
         --worker SOCKET | SOCKET]"
    );
    ExitCode::from(2)
}

/// Connects and authenticates; on failure, says why and returns the exit code.
fn authenticate(socket: &Path) -> Result<ControlClient, ExitCode> {
    let mut client = match ControlClient::connect(socket, CONNECT_TIMEOUT) {
        Ok(client) => client,
        Err(e) => {
            println!("cannot connect: {e}");
            return Err(ExitCode::FAILURE);
        }
    };
    match client.handshake() {
        Ok(()) => {
            println!("accepted");
            Ok(client)
        }
        Err((status, reason)) => {
            println!("refused {}: {reason}", status.name());
            Err(ExitCode::from(3))
        }
    }
}

fn spawn(socket: &Path, env: &[&str]) -> ExitCode {
    let mut client = match authenticate(socket) {
        Ok(client) => client,
        Err(code) => return code,
    };
    match client.spawn_any(env) {
        Ok((id, worker)) => {
            println!("spawned {id} {}", worker.display());
            let _ = io::stdout().flush();
            wait_for_stdin_to_end();
            ExitCode::SUCCESS
        }
        Err((status, reason)) => {
            println!("refused {}: {reason}", status.name());
            ExitCode::from(3)
        }
    }
}

fn silent(count: usize, socket: &Path) -> ExitCode {
    let mut connections = Vec::new();
    for _ in 0..count {
        match UnixStream::connect(socket) {
            Ok(stream) => connections.push(stream),
            Err(e) => {
                eprintln!("connection {} failed: {e}", connections.len());
                break;
            }
        }
    }
    println!("connected {}", connections.len());
    let _ = io::stdout().flush();
    wait_for_stdin_to_end();
    let deadline = Instant::now() + SILENT_PATIENCE;
    let mut ends: BTreeMap<String, usize> = BTreeMap::new();
    for stream in connections {
        let left = deadline.saturating_duration_since(Instant::now());
        *ends.entry(how_it_ended(stream, left)).or_default() += 1;
    }
    for (how, count) in ends {
        println!("{count} {how}");
    }
    ExitCode::SUCCESS
}

/// How a connection that said nothing ended within `patience`.
fn how_it_ended(stream: UnixStream, patience: Duration) -> String {
    let mut client = ControlClient::from_stream(stream);
    let _ = client.set_read_timeout(Some(patience.max(Duration::from_millis(1))));
    match client.try_read_frame() {
        Ok(Some(frame)) => match frame.refusal() {
            Err((status, _)) => format!("refused {}", status.name()),
            Ok(()) => "answered".to_owned(),
        },
        Ok(None) => "closed".to_owned(),
        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => "closed".to_owned(),
        Err(_) => "open".to_owned(),
    }
}

fn worker(socket: &Path) -> ExitCode {
    let mut stream = match UnixStream::connect(socket) {
        Ok(stream) => stream,
        Err(e) => {
            println!("cannot connect: {e}");
            return ExitCode::SUCCESS;
        }
    };
    let _ = stream.set_read_timeout(Some(SILENT_PATIENCE));
    let mut byte = [0u8; 1];
    match stream.read(&mut byte) {
        Ok(0) => println!("closed"),
        Ok(_) => println!("offered"),
        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => println!("closed"),
        Err(e) => println!("no answer: {e}"),
    }
    ExitCode::SUCCESS
}

fn wait_for_stdin_to_end() {
    for line in io::stdin().lock().lines() {
        if line.is_err() {
            break;
        }
    }
}
