//! Chaos from other users and idle connections, against the rules of DESIGN.md §6 and the
//! README's daemon and worker sections:
//!
//! * a foreign user (`nobody`, so these need root; they say so and skip otherwise) reaches no
//!   service that does not serve it and no worker it does not own, gets workers with its own
//!   rights only, and cannot give them environment that changes how programs load;
//! * idle connections by the hundred, to the daemon (of this user and of another) and to a
//!   worker, hold up no host: the host at work goes on, a new host is served while they are
//!   held, and the daemon and the worker end every one of them in bounded time.
//!
//! Each prints its `chaos <scenario>: ...` line like the scenarios of `chaos.rs`.

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use urom_chaos::load::{Load, pipelined};
use urom_chaos::raw::how_idle_ended;
use urom_chaos::{PATIENCE, Report, check_fresh_host, graph_daemon, scaled, seed_for};
use urom_graph::GraphHost;
use urom_host::{ProgressEngine, Running, Service, Worker};
use urom_testkit::control::ControlClient;
use urom_testkit::daemon::Daemon;
use urom_testkit::host::{start_service, try_run_worker};
use urom_testkit::process;
use urom_testkit::{ChildGuard, NOBODY, as_nobody};

/// The worker the host at work uses in the flood.
const WORKER: u64 = 0xf100d;

fn is_root() -> bool {
    process::uid(std::process::id() as i32) == Some(0)
}

fn graph_of(service: &Service<Running>) -> GraphHost {
    let info = service
        .plugin("worker_graph")
        .expect("the daemon offers worker_graph");
    GraphHost::init(info.id, info.version).expect("the graph plugin's version")
}

/// The peer program, to be run as `nobody`.
fn peer(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_urom-chaos-peer"));
    as_nobody(&mut command).args(args);
    command
}

/// A peer that runs while the test goes on: its output lines as they come.
struct Peer {
    child: ChildGuard,
    lines: mpsc::Receiver<String>,
}

impl Peer {
    fn start(args: &[&str]) -> Self {
        let (child, lines) =
            ChildGuard::spawn_with_lines(&mut peer(args)).expect("starting the peer as nobody");
        Self { child, lines }
    }

    /// The next line, waited for at most twice [`PATIENCE`].
    fn line(&self) -> String {
        self.lines
            .recv_timeout(2 * PATIENCE)
            .unwrap_or_else(|e| format!("no answer from the peer: {e}"))
    }

    /// Ends its standard input (it lets go of what it holds) and returns the rest of its lines.
    fn finish(mut self) -> Vec<String> {
        drop(self.child.0.stdin.take());
        let mut rest = Vec::new();
        while let Ok(line) = self.lines.recv_timeout(2 * PATIENCE) {
            rest.push(line);
        }
        let _ = self.child.wait_timeout(PATIENCE);
        rest
    }
}

/// Runs the peer to its end; its first line.
fn ask(args: &[&str]) -> String {
    Peer::start(args)
        .finish()
        .into_iter()
        .next()
        .unwrap_or_default()
}

/// Whether a line says the peer did not get in.
fn kept_out(line: &str) -> bool {
    line.starts_with("cannot connect") || line.starts_with("refused")
}

/// Counts one attempt as a task: ok when let in, error when kept out, lost when unanswered;
/// a violation unless let in exactly when `allowed`.
fn attempt(report: &mut Report, allowed: bool, what: &str, line: &str) {
    report.tally.submitted += 1;
    let unanswered = line.starts_with("no answer") || line.starts_with("unanswered");
    let got_in = !kept_out(line) && !unanswered;
    if unanswered {
        report.tally.lost += 1;
    } else if got_in {
        report.tally.ok += 1;
    } else {
        report.tally.error += 1;
    }
    report.check(got_in == allowed, || {
        format!(
            "{what}: {} ({line})",
            if allowed { "kept out" } else { "let in" }
        )
    });
}

/// The answer to a `spawn`: the refusal when not even accepted, else the spawn's outcome.
fn spawn_answer(peer: &Peer) -> String {
    let accepted = peer.line();
    if accepted == "accepted" {
        peer.line()
    } else {
        accepted
    }
}

/// A foreign user: kept out of a daemon that does not serve it and out of every worker it does
/// not own; under a daemon that allows it, served with workers of its own rights only, refused
/// another user's worker, refused `LD_PRELOAD`; root reaches its workers.
#[test]
fn a_foreign_user_reaches_nothing_it_does_not_own() {
    const SCENARIO: &str = "foreign_user";
    if !is_root() {
        urom_testkit::skip(&format!(
            "chaos {SCENARIO}: running a peer as another user needs root"
        ));
        return;
    }
    let seed = seed_for(SCENARIO);
    let mut report = Report::new(SCENARIO, seed);

    // A daemon serving its own user (and root) only, with a worker of root's.
    let (_plugins, closed) = graph_daemon(&[]);
    let root_service = start_service(&closed);
    let graph = graph_of(&root_service);
    let id = graph.id().to_string();
    let mut control = ControlClient::connect(&closed.socket, PATIENCE).unwrap();
    control.handshake().unwrap();
    let (_, root_worker) = control.spawn(1, 0, graph.id(), "", &[]).unwrap();
    let root_worker = root_worker.display().to_string();
    let socket = closed.socket.display().to_string();
    attempt(
        &mut report,
        false,
        "nobody to a daemon that does not serve it",
        &ask(&["daemon", &socket]),
    );
    attempt(
        &mut report,
        false,
        "nobody to root's worker",
        &ask(&["worker", &root_worker, &id]),
    );

    // A daemon that serves nobody too.
    let (_plugins2, open) = graph_daemon(&["--allow-uid", &NOBODY.to_string()]);
    let mut control2 = ControlClient::connect(&open.socket, PATIENCE).unwrap();
    control2.handshake().unwrap();
    let (_, root_worker2) = control2.spawn(2, 0, graph.id(), "", &[]).unwrap();
    let root_worker2 = root_worker2.display().to_string();
    let socket2 = open.socket.display().to_string();
    attempt(
        &mut report,
        true,
        "nobody to a daemon that allows it",
        &ask(&["daemon", &socket2]),
    );
    // Its own worker: with its rights, reachable by it and by root.
    let own = Peer::start(&["spawn", &socket2, "any", &id]);
    let spawned = spawn_answer(&own);
    attempt(&mut report, true, "nobody asking for a worker", &spawned);
    let mut own_uid = None;
    if let ["spawned", worker_id, worker_socket] = spawned.split(' ').collect::<Vec<_>>().as_slice()
    {
        let worker_id: u64 = worker_id.parse().unwrap_or(u64::MAX);
        own_uid = open.worker_pid(worker_id).and_then(process::uid);
        report.check(own_uid == Some(NOBODY), || {
            format!("nobody's worker runs as user {own_uid:?}, not {NOBODY}")
        });
        attempt(
            &mut report,
            true,
            "nobody to its own worker",
            &ask(&["worker", worker_socket, &id]),
        );
        let by_root = probe_as_root(Path::new(worker_socket), graph.id());
        attempt(&mut report, true, "root to nobody's worker", &by_root);
    }
    // Another user's worker: neither attached to through the daemon nor reached directly.
    let attach = Peer::start(&["spawn", &socket2, "2", &id]);
    let attached = spawn_answer(&attach);
    drop(attach.finish());
    attempt(
        &mut report,
        false,
        "nobody attaching to root's worker",
        &attached,
    );
    attempt(
        &mut report,
        false,
        "nobody to root's worker under a daemon that allows it",
        &ask(&["worker", &root_worker2, &id]),
    );
    // Environment that changes how programs load.
    let preload = Peer::start(&[
        "spawn",
        &socket2,
        "any",
        &id,
        "LD_PRELOAD=/tmp/urom-chaos.so",
    ]);
    let preloaded = spawn_answer(&preload);
    drop(preload.finish());
    attempt(
        &mut report,
        false,
        "nobody asking for a worker with LD_PRELOAD",
        &preloaded,
    );
    drop(own.finish());

    for (daemon, survivor) in [(&closed, 1), (&open, 2)] {
        if let Err(e) = check_fresh_host(daemon, &[survivor]) {
            report.violation(e);
        }
    }
    report.set(
        "nobody_worker_uid",
        own_uid.map_or("?".to_owned(), |uid| uid.to_string()),
    );
    report.finish();
}

/// Whether this process (root) is served by the worker at `socket`: the peer's words.
fn probe_as_root(socket: &Path, graph: u64) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_urom-chaos-peer"));
    let output = command
        .args(["worker", &socket.display().to_string(), &graph.to_string()])
        .output();
    match output {
        Ok(output) => String::from_utf8_lossy(&output.stdout).trim().to_owned(),
        Err(e) => format!("cannot run the peer: {e}"),
    }
}

/// Counts of how idle connections ended.
#[derive(Default, Debug)]
struct Ends {
    closed: u64,
    refused: u64,
    open: u64,
    other: Vec<String>,
}

impl Ends {
    fn add(&mut self, how: &str, count: u64) {
        match how {
            "closed" => self.closed += count,
            "open" => self.open += count,
            how if how.starts_with("refused") => self.refused += count,
            how => self.other.push(format!("{count} {how}")),
        }
    }
}

/// Opens `count` connections to `socket` that say nothing; with the time each was made.
fn idle_connections(socket: &Path, count: u64) -> Vec<(Instant, UnixStream)> {
    (0..count)
        .filter_map(|_| {
            UnixStream::connect(socket)
                .ok()
                .map(|stream| (Instant::now(), stream))
        })
        .collect()
}

/// How a silent connection to a worker ended within [`PATIENCE`] of `connected`: `closed`
/// (after the worker's offer, or without it, or reset) or `open`.
fn worker_idle_ended(mut stream: UnixStream, connected: Instant) -> &'static str {
    let left = (connected + PATIENCE).saturating_duration_since(Instant::now());
    let _ = stream.set_read_timeout(Some(left.max(Duration::from_millis(1))));
    let mut rest = Vec::new();
    match stream.read_to_end(&mut rest) {
        Ok(_) => "closed",
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => "closed",
        Err(_) => "open",
    }
}

/// Idle connections by the hundred to the daemon (this user's, and `nobody`'s when running as
/// root) and to a worker, while a host keeps loopbacks in flight: it goes on unharmed, a new
/// host is served and reaches the worker while they are held, and every one of them is ended
/// in bounded time.
#[test]
fn idle_connection_floods_hold_up_no_host() {
    const SCENARIO: &str = "connection_floods";
    let seed = seed_for(SCENARIO);
    let mut report = Report::new(SCENARIO, seed);
    let root = is_root();
    let allow = NOBODY.to_string();
    let flags: &[&str] = if root { &["--allow-uid", &allow] } else { &[] };
    let (_plugins, daemon) = graph_daemon(flags);
    let service = start_service(&daemon);
    let graph = graph_of(&service);
    let (stop, current) = (AtomicBool::new(false), AtomicU64::new(u64::MAX));
    let own_count = scaled(200).min(1000);
    let nobody_count = scaled(300).min(2000);
    // A few idle connections to the worker while a new host arrives, then many.
    let few = 12;
    let many = scaled(64).min(500);

    let host = thread::scope(|scope| {
        let worker = scope.spawn(|| {
            let mut engine = ProgressEngine::new();
            let idle = Worker::new()
                .set_service(&service)
                .set_id(WORKER)
                .set_plugins(graph.id())
                .set_max_inflight_tasks(32);
            let worker = try_run_worker(&mut engine, idle)?;
            current.store(WORKER, Ordering::SeqCst);
            let stop = || stop.load(Ordering::Relaxed);
            let load = pipelined(&mut engine, graph, &worker, 32, &stop, &mut || None);
            let _ = worker.stop();
            Ok::<Load, String>(load)
        });
        let deadline = Instant::now() + PATIENCE;
        while current.load(Ordering::SeqCst) != WORKER && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
        let mut control = ControlClient::connect(&daemon.socket, PATIENCE).unwrap();
        control.handshake().unwrap();
        let (_, worker_socket) = control.spawn(WORKER, 0, graph.id(), "", &[]).unwrap();

        flood(
            &mut report,
            &daemon,
            &worker_socket,
            root,
            own_count,
            nobody_count,
            few,
            many,
        );

        stop.store(true, Ordering::SeqCst);
        let load = worker.join();
        drop(control);
        load
    });
    match host {
        Ok(Ok(load)) => {
            report.check(load.tally.error == 0 && load.tally.exactly_once(), || {
                format!("the host at work: {:?} ({})", load.tally, load.statuses())
            });
            report.set("host_ok", load.tally.ok);
        }
        Ok(Err(e)) => report.violation(format!("the host at work: {e}")),
        Err(_) => report.violation("the host at work panicked"),
    }
    // Once the floods are over, too.
    if let Err(e) = check_fresh_host(&daemon, &[]) {
        report.violation(format!("after the floods: {e}"));
    }
    report.finish();
}

/// The floods, and what a new host sees meanwhile.
#[allow(clippy::too_many_arguments)]
fn flood(
    report: &mut Report,
    daemon: &Daemon,
    worker_socket: &Path,
    root: bool,
    own_count: u64,
    nobody_count: u64,
    few: u64,
    many: u64,
) {
    // Another user's flood first, so that it holds whatever it can get.
    let nobody = root.then(|| {
        let socket = daemon.socket.display().to_string();
        let peer = Peer::start(&["idle", &nobody_count.to_string(), &socket]);
        let connected = peer.line();
        (peer, connected)
    });
    let own = idle_connections(&daemon.socket, own_count);
    let worker_few = idle_connections(worker_socket, few);
    // A new host while they are all held: served by the daemon, and by the worker.
    if let Err(e) = check_fresh_host(daemon, &[WORKER]) {
        report.violation(format!(
            "with {} idle connections to the daemon and {few} to the worker: {e}",
            own.len()
        ));
    }
    // Then many more to the worker.
    let worker_many = idle_connections(worker_socket, many);

    // Each is given until [`PATIENCE`] after it connected: waiting for them one after the other
    // takes no longer than that.
    let mut daemon_ends = Ends::default();
    for (connected, stream) in own {
        daemon_ends.add(&how_idle_ended(stream, connected, PATIENCE), 1);
    }
    let mut worker_ends = Ends::default();
    for (connected, stream) in worker_few.into_iter().chain(worker_many) {
        worker_ends.add(worker_idle_ended(stream, connected), 1);
    }
    let mut nobody_ends = Ends::default();
    let mut nobody_connected = 0;
    if let Some((peer, connected)) = nobody {
        nobody_connected = connected
            .strip_prefix("connected ")
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        for line in peer.finish() {
            let mut words = line.splitn(3, ' ');
            match (
                words.next(),
                words.next().and_then(|n| n.parse().ok()),
                words.next(),
            ) {
                (Some("ended"), Some(count), Some(how)) => nobody_ends.add(how, count),
                _ => nobody_ends.other.push(line),
            }
        }
        report.check(nobody_connected > 0, || {
            format!("nobody's flood: {connected}")
        });
    }

    for (who, ends) in [
        ("this user's idle connections to the daemon", &daemon_ends),
        ("nobody's idle connections to the daemon", &nobody_ends),
        ("idle connections to the worker", &worker_ends),
    ] {
        report.check(ends.open == 0, || {
            format!("{who}: {} still open after {PATIENCE:?}", ends.open)
        });
        report.check(ends.other.is_empty(), || format!("{who}: {:?}", ends.other));
        report.tally.submitted += ends.closed + ends.refused + ends.open + ends.other.len() as u64;
        report.tally.ok += ends.closed;
        report.tally.error += ends.refused;
        report.tally.lost += ends.open + ends.other.len() as u64;
    }
    report.set("daemon_idle", own_count);
    report.set(
        "daemon_idle_ended",
        format!(
            "closed:{},refused:{},open:{}",
            daemon_ends.closed, daemon_ends.refused, daemon_ends.open
        ),
    );
    report.set("nobody_idle", nobody_connected);
    report.set(
        "nobody_idle_ended",
        format!(
            "closed:{},refused:{},open:{}",
            nobody_ends.closed, nobody_ends.refused, nobody_ends.open
        ),
    );
    report.set("worker_idle", few + many);
    report.set(
        "worker_idle_ended",
        format!("closed:{},open:{}", worker_ends.closed, worker_ends.open),
    );
}
