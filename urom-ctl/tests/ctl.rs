//! `urom-ctl` against a real daemon: what `status`, `workers` and `plugins` print, that
//! `--json` parses, that a user stops its own workers and not another user's, and what it says
//! when no daemon runs.

use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use urom_graph::GraphHost;
use urom_host::{CompletedTask, ProgressEngine, Running, Worker};
use urom_testkit::daemon::{Daemon, graph_and_faulty};
use urom_testkit::host::{run_worker, start_service};
use urom_testkit::{NOBODY, TempDir, as_nobody, binary};

const TIMEOUT: Duration = Duration::from_secs(30);

fn ctl() -> Command {
    Command::new(env!("CARGO_BIN_EXE_urom-ctl"))
}

/// Runs `urom-ctl --socket <daemon's> args...`.
fn run(daemon: &Daemon, args: &[&str]) -> Output {
    let mut command = ctl();
    command.arg("--socket").arg(&daemon.socket).args(args);
    command.output().expect("running urom-ctl")
}

fn stdout_of(output: &Output) -> String {
    assert!(
        output.status.success(),
        "urom-ctl failed: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).expect("UTF-8 output")
}

fn json(daemon: &Daemon, args: &[&str]) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    serde_json::from_str(&stdout_of(&run(daemon, &all))).expect("urom-ctl --json prints JSON")
}

static ANSWERS: AtomicU64 = AtomicU64::new(0);

fn count(_task: &CompletedTask<'_>) {
    ANSWERS.fetch_add(1, Ordering::Relaxed);
}

/// Sends `good` graph loopbacks and `bad` empty graph commands (refused by the plugin) and
/// waits for every answer.
fn send_commands(
    engine: &mut ProgressEngine,
    graph: &GraphHost,
    worker: &Worker<Running>,
    good: u64,
    bad: u64,
) {
    let start = ANSWERS.load(Ordering::Relaxed);
    for data in 0..good {
        graph.loopback(worker, data, data, count).unwrap();
        while ANSWERS.load(Ordering::Relaxed) < start + data + 1 {
            engine.progress();
        }
    }
    for _ in 0..bad {
        worker
            .submit(graph.id(), |task| {
                task.set_callback(count);
                0
            })
            .unwrap();
    }
    let deadline = Instant::now() + TIMEOUT;
    while ANSWERS.load(Ordering::Relaxed) < start + good + bad {
        assert!(Instant::now() < deadline, "answers missing");
        engine.progress();
    }
}

/// The worker `id` of `urom-ctl --json workers`, once its counters show `commands`.
fn worker_with_commands(daemon: &Daemon, id: u64, commands: u64) -> Value {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let workers = json(daemon, &["workers"]);
        let worker = workers["workers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("worker {id} missing: {workers}"));
        if worker["counters"]["commands"] == commands {
            return worker;
        }
        assert!(
            Instant::now() < deadline,
            "the counters never reached {commands}: {worker}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn status_workers_and_plugins_describe_a_real_daemon() {
    let (plugins, daemon) = graph_and_faulty(&["--max-workers", "64"]);
    std::fs::write(plugins.path().join("plugins/broken.so"), b"not a library").unwrap();
    let service = start_service(&daemon);
    let info = service.plugin("worker_graph").unwrap();
    let graph = GraphHost::init(info.id, info.version).unwrap();
    let mut engine = ProgressEngine::new();
    let worker = run_worker(
        &mut engine,
        Worker::new()
            .set_service(&service)
            .set_plugins(graph.id())
            .set_gid(5),
    );
    send_commands(&mut engine, &graph, &worker, 10, 2);

    let status = stdout_of(&run(&daemon, &["status"]));
    println!("{status}");
    let socket = daemon.socket.display().to_string();
    for expected in [
        format!("urom-daemon {}", env!("CARGO_PKG_VERSION")),
        format!("{socket} (control)"),
        "message size  4096 bytes".to_owned(),
        "1 of at most 64 (1 running)".to_owned(),
        "2 offered (worker_faulty 0x1, worker_graph 0x2)".to_owned(),
        "1 file left out: see urom-ctl plugins".to_owned(),
    ] {
        assert!(status.contains(&expected), "no `{expected}` in:\n{status}");
    }

    let listing = stdout_of(&run(&daemon, &["plugins"]));
    println!("{listing}");
    assert!(listing.contains("NAME"), "{listing}");
    let broken = listing
        .lines()
        .find(|line| line.trim_start().starts_with("broken "))
        .unwrap_or_else(|| panic!("no broken.so in:\n{listing}"));
    assert!(broken.contains("refused"), "{broken}");

    // Counters are published when the worker goes idle: they reach what was sent.
    let id = worker.id();
    let shown = worker_with_commands(&daemon, id, 12);
    assert_eq!(shown["gid"], 5);
    assert_eq!(shown["state"], "running");
    assert_eq!(shown["plugins"], serde_json::json!(["worker_graph"]));
    assert_eq!(shown["hosts"], 1);
    let counters = &shown["counters"];
    assert_eq!(counters["notifications"], 12);
    assert_eq!(counters["errors"], 2);
    assert_eq!(counters["in_flight"], 0);
    assert_eq!(counters["host_channels"], 1);
    assert!(counters["bytes_in"].as_u64().unwrap() >= 12 * 24);
    assert!(counters["peak_ring"].as_u64().unwrap() >= 1);
    assert_eq!(
        shown["errors"],
        serde_json::json!({ "DOCA_ERROR_INVALID_VALUE": 2 })
    );

    let table = stdout_of(&run(&daemon, &["workers"]));
    println!("{table}");
    let header = table.lines().next().unwrap();
    for column in [
        "ID", "PID", "USER", "GID", "STATE", "CPUS", "PLUGINS", "COMMANDS",
    ] {
        assert!(header.contains(column), "{header}");
    }
    let row = table.lines().nth(1).unwrap();
    assert!(
        row.contains("running") && row.contains("worker_graph") && row.contains(" 12 "),
        "{row}"
    );
    assert!(
        table.contains(&format!("worker {id} errors: DOCA_ERROR_INVALID_VALUE 2")),
        "{table}"
    );

    let whole = json(&daemon, &["status"]);
    assert_eq!(whole["daemon"]["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(whole["daemon"]["workers"], 1);
    assert_eq!(whole["listen"][0]["address"], socket.as_str());
    let files = whole["plugin_dirs"][0]["files"].as_array().unwrap();
    let broken = files.iter().find(|f| f["name"] == "broken").unwrap();
    assert_eq!(broken["status"], "refused");
    assert!(broken["reason"].as_str().unwrap().contains("broken.so"));
    let listed = json(&daemon, &["plugins"]);
    assert_eq!(listed["plugin_dirs"], whole["plugin_dirs"]);

    // --watch: a refresh per interval, rates from the second on.
    let output = stdout_of(&run(
        &daemon,
        &["--json", "workers", "--watch", "0.2", "--count", "2"],
    ));
    let refreshes: Vec<Value> = serde_json::Deserializer::from_str(&output)
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(refreshes.len(), 2, "{output}");
    assert_eq!(refreshes[0]["rates"], serde_json::json!([]));
    assert_eq!(refreshes[1]["rates"][0]["id"], id);
    assert_eq!(refreshes[1]["rates"][0]["commands"], 0.0);
    let watched = stdout_of(&run(
        &daemon,
        &["workers", "--watch", "0.2", "--count", "2"],
    ));
    assert!(watched.contains("CMD/S"), "{watched}");
    drop(worker);
}

#[test]
fn a_user_stops_its_own_workers_and_not_another_users() {
    let root = nix::unistd::geteuid().is_root();
    let extra = ["--allow-uid", &NOBODY.to_string()];
    let (_plugins, daemon) = graph_and_faulty(if root { &extra } else { &[] });
    let service = start_service(&daemon);
    let graph = service.plugin("worker_graph").unwrap().id;
    let mut engine = ProgressEngine::new();
    let mine = run_worker(
        &mut engine,
        Worker::new().set_service(&service).set_plugins(graph),
    );
    let kept = run_worker(
        &mut engine,
        Worker::new().set_service(&service).set_plugins(graph),
    );
    let ids = |workers: &Value| -> Vec<u64> {
        workers["workers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["id"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(ids(&json(&daemon, &["workers"])), [mine.id(), kept.id()]);

    let output = stdout_of(&run(&daemon, &["destroy", &mine.id().to_string()]));
    assert_eq!(output, format!("worker {} stopped\n", mine.id()));
    assert_eq!(ids(&json(&daemon, &["workers"])), [kept.id()]);
    let output = run(&daemon, &["destroy", "999"]);
    assert_eq!(output.status.code(), Some(1));
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(
        error.contains("there is no worker 999") && error.contains("DOCA_ERROR_NOT_FOUND"),
        "{error}"
    );

    if !root {
        urom_testkit::skip("the part with a second user: running urom-ctl as nobody needs root");
        return;
    }
    // Another user sees none of root's workers and may not stop them.
    let as_nobody_run = |args: &[&str]| {
        let mut command = ctl();
        command.arg("--socket").arg(&daemon.socket).args(args);
        as_nobody(&mut command).output().unwrap()
    };
    let theirs = as_nobody_run(&["--json", "workers"]);
    let theirs: Value = serde_json::from_str(&stdout_of(&theirs)).unwrap();
    assert_eq!(ids(&theirs), Vec::<u64>::new());
    let refused = as_nobody_run(&["destroy", &kept.id().to_string()]);
    assert_eq!(refused.status.code(), Some(1));
    let error = String::from_utf8_lossy(&refused.stderr);
    assert!(
        error.contains("belongs to another user") && error.contains("NOT_PERMITTED"),
        "{error}"
    );
    assert_eq!(ids(&json(&daemon, &["workers"])), [kept.id()]);

    // A worker of nobody's own: nobody sees it and stops it; root sees it too.
    let mut peer = Command::new(binary("urom-testkit", "urom-test-host"));
    peer.arg("--spawn").arg(&daemon.socket);
    let mut peer = as_nobody(&mut peer)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(peer.stdout.take().unwrap()));
    assert_eq!(lines.next().unwrap().unwrap(), "accepted");
    let spawned = lines.next().unwrap().unwrap();
    let id: u64 = spawned
        .split_whitespace()
        .nth(1)
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("{spawned}"));
    let theirs: Value =
        serde_json::from_str(&stdout_of(&as_nobody_run(&["--json", "workers"]))).unwrap();
    assert_eq!(ids(&theirs), [id]);
    assert_eq!(theirs["workers"][0]["uid"], NOBODY);
    let mut all = ids(&json(&daemon, &["workers"]));
    all.sort_unstable();
    assert!(all.contains(&id) && all.contains(&kept.id()), "{all:?}");
    let stopped = as_nobody_run(&["destroy", &id.to_string()]);
    assert_eq!(stdout_of(&stopped), format!("worker {id} stopped\n"));
    drop(peer.stdin.take());
    let _ = peer.wait();
}

#[test]
fn a_daemon_that_is_not_there_is_named_plainly() {
    let dir = TempDir::new("urom-ctl-down");
    let missing = dir.path().join("urom.sock");
    let output = ctl()
        .arg("status")
        .arg("--socket")
        .arg(&missing)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(3));
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(
        error.contains(&format!(
            "the urom daemon is not running at {}: there is no socket there",
            missing.display()
        )),
        "{error}"
    );

    // A socket left behind by a daemon that stopped.
    drop(std::os::unix::net::UnixListener::bind(&missing).unwrap());
    assert!(missing.exists());
    let output = ctl()
        .args(["workers", "--socket"])
        .arg(&missing)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(3));
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(error.contains("nothing listens there"), "{error}");

    // A service file that names no service for this host.
    let file = dir.path().join("service.txt");
    std::fs::write(&file, "some-other-host dpu dpu-a 0000:03:00.0 eth0\n").unwrap();
    let output = ctl()
        .arg("status")
        .env("DOCA_UROM_SERVICE_FILE", &file)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(
        error.contains("cannot find the daemon") && error.contains("no line for host"),
        "{error}"
    );

    // A daemon with another message size.
    let (_plugins, daemon) = graph_and_faulty(&[]);
    let output = run(&daemon, &["-m", "8192", "status"]);
    assert_eq!(output.status.code(), Some(1));
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(
        error.contains("does not match") && error.contains("pass the daemon's -m value"),
        "{error}"
    );
}
