//! A peer of a daemon or a worker that the chaos suite runs as another user (`nobody`). Each
//! mode prints one line per outcome on standard output:
//!
//! * `urom-chaos-peer daemon SOCKET`: connect and authenticate: `accepted`,
//!   `refused <status>: <reason>` or `cannot connect: <error>`.
//! * `urom-chaos-peer spawn SOCKET ID PLUGINS [NAME=value...]`: authenticate, then spawn (or
//!   attach to) worker ID (`any` for a fresh one) with the PLUGINS mask: `spawned <id> <socket>`,
//!   then hold the connection (and so the worker) until standard input ends; or `refused ...` /
//!   `cannot connect: ...`.
//! * `urom-chaos-peer worker SOCKET GRAPH_ID`: set up a shared-memory channel with a worker and
//!   send a graph loopback: `served`, `refused: <error>` (the worker hung up or would not set up
//!   a channel), `unanswered` or `cannot connect: <error>`.
//! * `urom-chaos-peer idle COUNT SOCKET`: open COUNT connections that say nothing, print
//!   `connected <n>`, hold them until standard input ends, then give each until 30 s after it
//!   connected to end and print one `ended <count> <how>` line per way they ended (as
//!   `urom_chaos::raw::Ending::describe` words it: `refused <status>`, `closed`, `answered`,
//!   `reset`, `open`, `garbled`).

use std::collections::BTreeMap;
use std::io::{self, BufRead, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use urom_chaos::raw::how_idle_ended;
use urom_testkit::control::ControlClient;
use urom_transport::{Channel, ChannelConfig, Transport};
use urom_wire::control::WORKER_ID_ANY;
use urom_wire::data::{DataMessage, Notification};
use urom_wire::{FrameRepr, MaxMsgSize, Status};

/// How long connecting and answers may take.
const PATIENCE: Duration = Duration::from_secs(30);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    match words.as_slice() {
        ["daemon", socket] => {
            authenticate(Path::new(socket));
            ExitCode::SUCCESS
        }
        ["spawn", socket, id, plugins, env @ ..] => {
            let id = if *id == "any" {
                Some(WORKER_ID_ANY)
            } else {
                id.parse().ok()
            };
            match (id, parse_u64(plugins)) {
                (Some(id), Some(plugins)) => spawn(Path::new(socket), id, plugins, env),
                _ => usage(),
            }
        }
        ["worker", socket, graph] => match parse_u64(graph) {
            Some(graph) => {
                println!("{}", worker(Path::new(socket), graph));
                ExitCode::SUCCESS
            }
            None => usage(),
        },
        ["idle", count, socket] => match count.parse() {
            Ok(count) => idle(count, Path::new(socket)),
            Err(_) => usage(),
        },
        _ => usage(),
    }
}

fn usage() -> ExitCode {
    eprintln!(
        "usage: urom-chaos-peer daemon SOCKET | spawn SOCKET ID|any PLUGINS [NAME=value...] | \
         worker SOCKET GRAPH_ID | idle COUNT SOCKET"
    );
    ExitCode::from(2)
}

fn parse_u64(text: &str) -> Option<u64> {
    match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// Connects and authenticates, printing the outcome; the client when accepted.
fn authenticate(socket: &Path) -> Option<ControlClient> {
    let mut client = match ControlClient::connect(socket, Duration::from_secs(1)) {
        Ok(client) => client,
        Err(e) => {
            println!("cannot connect: {e}");
            return None;
        }
    };
    match client.handshake() {
        Ok(()) => {
            println!("accepted");
            Some(client)
        }
        Err((status, reason)) => {
            println!("refused {}: {reason}", status.name());
            None
        }
    }
}

fn spawn(socket: &Path, id: u64, plugins: u64, env: &[&str]) -> ExitCode {
    let Some(mut client) = authenticate(socket) else {
        return ExitCode::SUCCESS;
    };
    match client.spawn(id, 0, plugins, "", env) {
        Ok((id, worker)) => {
            println!("spawned {id} {}", worker.display());
            let _ = io::stdout().flush();
            for line in io::stdin().lock().lines() {
                if line.is_err() {
                    break;
                }
            }
        }
        Err((status, reason)) => println!("refused {}: {reason}", status.name()),
    }
    ExitCode::SUCCESS
}

/// Whether a worker serves this user: what happened.
fn worker(socket: &Path, graph: u64) -> String {
    let stream = match UnixStream::connect(socket) {
        Ok(stream) => stream,
        Err(e) => return format!("cannot connect: {e}"),
    };
    let mut channel = match Channel::accept(stream, &ChannelConfig::default()) {
        Ok(channel) => channel,
        Err(e) => return format!("refused: {e}"),
    };
    let command = urom_chaos::frames::loopback_command(1, graph, 42, MaxMsgSize::DEFAULT);
    if let Err(e) = channel.send(&command) {
        return format!("refused: {e}");
    }
    let deadline = Instant::now() + PATIENCE;
    while Instant::now() < deadline {
        match channel.recv() {
            Ok(Some(frame)) => {
                return match FrameRepr::<DataMessage>::parse(frame, MaxMsgSize::DEFAULT) {
                    Ok(FrameRepr {
                        body:
                            DataMessage::Notify(Notification {
                                status: Status::Success,
                                ..
                            }),
                        ..
                    }) => "served".to_owned(),
                    other => format!("refused: answered {other:?}"),
                };
            }
            Ok(None) => {
                let _ = channel.wait_recv(Duration::from_millis(10));
            }
            Err(e) => return format!("refused: {e}"),
        }
    }
    "unanswered".to_owned()
}

fn idle(count: usize, socket: &Path) -> ExitCode {
    let mut connections = Vec::new();
    for _ in 0..count {
        match UnixStream::connect(socket) {
            Ok(stream) => connections.push((Instant::now(), stream)),
            Err(e) => {
                println!("connect failed: {e}");
                break;
            }
        }
    }
    println!("connected {}", connections.len());
    let _ = io::stdout().flush();
    for line in io::stdin().lock().lines() {
        if line.is_err() {
            break;
        }
    }
    let mut ends: BTreeMap<String, usize> = BTreeMap::new();
    for (connected, stream) in connections {
        *ends
            .entry(how_idle_ended(stream, connected, PATIENCE))
            .or_default() += 1;
    }
    for (how, count) in ends {
        println!("ended {count} {how}");
    }
    ExitCode::SUCCESS
}
