//! The chaos scenarios: a real daemon, real workers and hosts, and what goes wrong around them.
//!
//! Each scenario prints one line, `chaos <scenario>: seed=... scale=... submitted=... ok=...
//! error=... lost=... duplicated=... key=value...`, then fails on any task lost or answered
//! twice, any hang (every wait is bounded and says what it waited for), any crash (the daemon
//! and the surviving workers must serve a new host at the end), or anything else it names.
//! `UROM_CHAOS_SCALE` scales them (`chaos/run.sh`), `UROM_CHAOS_SEED` replays one.
//!
//! The foreign-user and connection-flood scenarios are in `users_and_floods.rs`.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use urom_chaos::frames::{self, control_seeds, loopback_command, mutate, random_frame};
use urom_chaos::load::{Load, pipelined};
use urom_chaos::raw::{self, How};
use urom_chaos::{
    PATIENCE, Report, Rng, Tally, check_fresh_host, check_fresh_host_at, graph_daemon, scale,
    scaled, scaled_duration, seed_for,
};
use urom_graph::GraphHost;
use urom_host::{CommandError, CompletedTask, Idle, ProgressEngine, Running, Service, Worker};
use urom_testkit::control::ControlClient;
use urom_testkit::daemon::{Daemon, plugin_dir, start_daemon};
use urom_testkit::host::{start_service, try_run_worker};
use urom_testkit::process::{self, Signal};
use urom_testkit::worker::{connect, connect_with, pause_and_come_back};
use urom_testkit::{TempDir, binary, c_shared_object, cdylib, workspace_root};
use urom_transport::{Channel, ChannelConfig, FrameSendError, Transport};
use urom_wire::data::{
    COMMAND_PAYLOAD_OFFSET, DataMessage, NOTIFY_PAYLOAD_OFFSET, max_command_payload,
    max_notify_payload, write_command_headers, write_notify_headers,
};
use urom_wire::frame::frame_length;
use urom_wire::{FRAME_HEADER_LEN, FrameRepr, MaxMsgSize, Status};

/// No worker yet.
const NONE: u64 = u64::MAX;

/// The graph plugin as the service offers it.
fn graph_of(service: &Service<Running>) -> GraphHost {
    let info = service
        .plugin("worker_graph")
        .expect("the daemon offers worker_graph");
    GraphHost::init(info.id, info.version).expect("the graph plugin's version")
}

/// What one load thread did.
#[derive(Default)]
struct Outcome {
    /// One load per worker it drove, in order.
    loads: Vec<Load>,
    /// What went wrong outside the tasks (a worker that would not start).
    errors: Vec<String>,
}

impl Outcome {
    fn total(&self) -> Load {
        let mut total = Load::default();
        for load in &self.loads {
            total.add(load);
        }
        total
    }
}

/// How a load thread runs.
struct LoadPlan<'a> {
    service: &'a Service<Running>,
    graph: GraphHost,
    /// The first worker's id; a failed worker is replaced by the next id when `replace`.
    first_id: u64,
    gid: u32,
    window: u64,
    replace: bool,
    /// Stop progressing once, for this long, this long after the load started.
    pause: Option<(Duration, Duration)>,
    /// The id of the worker it drives now ([`NONE`] between workers).
    current: &'a AtomicU64,
    stop: &'a AtomicBool,
    release: &'a AtomicBool,
}

/// Drives pipelined loopbacks through a worker of its own (started or attached by id) until
/// `stop`, replacing a failed worker when asked; sends what it did on `done`, then holds its
/// last worker until `release` (at most twice [`PATIENCE`]) and stops it unless `attach_only`.
fn load_thread(plan: LoadPlan<'_>, attach_only: bool, done: mpsc::Sender<Outcome>) {
    let mut engine = ProgressEngine::new();
    let mut outcome = Outcome::default();
    let mut id = plan.first_id;
    let mut held = None;
    let started = Instant::now();
    let mut pause = plan.pause;
    while !plan.stop.load(Ordering::Relaxed) {
        let idle = Worker::new()
            .set_service(plan.service)
            .set_id(id)
            .set_gid(plan.gid)
            .set_plugins(plan.graph.id())
            .set_max_inflight_tasks(plan.window.next_power_of_two() as usize);
        let worker = match try_run_worker(&mut engine, idle) {
            Ok(worker) => worker,
            Err(e) => {
                outcome.errors.push(format!("worker {id}: {e}"));
                break;
            }
        };
        plan.current.store(id, Ordering::SeqCst);
        let stop = || plan.stop.load(Ordering::Relaxed);
        let mut pauses = || match pause {
            Some((after, length)) if started.elapsed() >= after => {
                pause = None;
                Some(length)
            }
            _ => None,
        };
        let load = pipelined(
            &mut engine,
            plan.graph,
            &worker,
            plan.window,
            &stop,
            &mut pauses,
        );
        let failed = load.failed;
        outcome.loads.push(load);
        if failed && plan.replace {
            plan.current.store(NONE, Ordering::SeqCst);
            id += 1;
            continue;
        }
        held = Some(worker);
        break;
    }
    let _ = done.send(outcome);
    let deadline = Instant::now() + 2 * PATIENCE;
    while !plan.release.load(Ordering::Relaxed) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(10));
    }
    if let (Some(worker), false) = (held, attach_only) {
        let _ = worker.stop();
    }
}

/// Waits until every slot of `current` names a worker; false after [`PATIENCE`].
fn all_running(current: &[AtomicU64]) -> bool {
    let deadline = Instant::now() + PATIENCE;
    while current.iter().any(|id| id.load(Ordering::SeqCst) == NONE) {
        if Instant::now() > deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(5));
    }
    true
}

/// Collects `count` outcomes, each within twice [`PATIENCE`].
fn collect(done: &mpsc::Receiver<Outcome>, count: usize, report: &mut Report) -> Vec<Outcome> {
    let mut outcomes = Vec::new();
    for _ in 0..count {
        match done.recv_timeout(2 * PATIENCE) {
            Ok(outcome) => outcomes.push(outcome),
            Err(e) => report.violation(format!("a load thread never reported: {e}")),
        }
    }
    outcomes
}

/// Checks a load that no failure should have touched: every task answered once, with success
/// and its own data.
fn check_clean(report: &mut Report, who: &str, load: &Load) {
    report.check(load.tally.error == 0 && !load.failed, || {
        format!(
            "{who}: {} tasks failed ({})",
            load.tally.error,
            load.statuses()
        )
    });
    check_counts(report, who, load);
}

/// Checks a load's counts: nothing lost, duplicated, unknown or carrying another task's data.
fn check_counts(report: &mut Report, who: &str, load: &Load) {
    report.check(load.tally.exactly_once(), || {
        format!(
            "{who}: not every task was answered exactly once: {:?}",
            load.tally
        )
    });
    report.check(load.wrong == 0 && load.unknown == 0, || {
        format!(
            "{who}: {} answers carried another task's data, {} answered tasks never sent or \
             answered again after their answer",
            load.wrong, load.unknown
        )
    });
}

/// Waits (at most [`PATIENCE`]) until the daemon lists exactly `ids` in group `gid`.
fn daemon_lists(service: &Service<Running>, gid: u32, ids: &BTreeSet<u64>) -> Result<(), String> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let listed: BTreeSet<u64> = service
            .workers_by_gid(gid)
            .map_err(|e| e.to_string())?
            .into_iter()
            .collect();
        if &listed == ids {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the daemon lists workers {listed:?} in group {gid}, not {ids:?}"
            ));
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// kill -9 of workers at random moments while four threads, each with its own progress engine
/// and worker, keep 128 loopbacks in flight: every task completes exactly once (with
/// `DOCA_ERROR_NOT_CONNECTED` on a killed worker), the killed workers' threads go on with new
/// workers, the other threads never see an error, and the daemon reaps the dead.
#[test]
fn killed_workers_fail_their_tasks_once_and_the_others_go_on() {
    const SCENARIO: &str = "kill_workers";
    const THREADS: usize = 4;
    const WINDOW: u64 = 128;
    const KILLS: usize = 2;
    let round = Duration::from_millis(1500);
    let seed = seed_for(SCENARIO);
    let mut rng = Rng::new(seed);
    let mut report = Report::new(SCENARIO, seed);
    let (_plugins, daemon) = graph_daemon(&[]);
    let service = start_service(&daemon);
    let graph = graph_of(&service);

    let (mut victims_load, mut others_load) = (Load::default(), Load::default());
    let (mut kills, mut missed, mut workers) = (0u64, 0u64, 0u64);
    for r in 0..scale() {
        let gid = r + 1;
        let current: Vec<AtomicU64> = (0..THREADS).map(|_| AtomicU64::new(NONE)).collect();
        let (stop, release) = (AtomicBool::new(false), AtomicBool::new(false));
        let mut victims: Vec<usize> = (0..THREADS).collect();
        for i in 0..KILLS {
            let j = i + rng.index(THREADS - i);
            victims.swap(i, j);
        }
        victims.truncate(KILLS);
        let mut moments: Vec<Duration> = (0..KILLS)
            .map(|_| rng.duration(round / 10, round * 7 / 10))
            .collect();
        moments.sort();
        let (done_tx, done) = mpsc::channel();
        let outcomes = thread::scope(|scope| {
            let mut threads = Vec::new();
            for (t, slot) in current.iter().enumerate() {
                let plan = LoadPlan {
                    service: &service,
                    graph,
                    first_id: u64::from(gid) * 1000 + t as u64 * 100,
                    gid,
                    window: WINDOW,
                    replace: true,
                    pause: None,
                    current: slot,
                    stop: &stop,
                    release: &release,
                };
                let done = done_tx.clone();
                threads.push(scope.spawn(move || load_thread(plan, false, done)));
            }
            if !all_running(&current) {
                report.violation("the workers did not all start");
            }
            let start = Instant::now();
            for (&victim, &at) in victims.iter().zip(&moments) {
                thread::sleep(at.saturating_sub(start.elapsed()));
                let deadline = Instant::now() + Duration::from_secs(5);
                loop {
                    let id = current[victim].load(Ordering::SeqCst);
                    if let Some(pid) = (id != NONE).then(|| daemon.worker_pid(id)).flatten() {
                        process::signal(pid, Signal::SIGKILL);
                        kills += 1;
                        break;
                    }
                    if Instant::now() > deadline {
                        missed += 1;
                        break;
                    }
                    thread::sleep(Duration::from_millis(5));
                }
            }
            thread::sleep(round.saturating_sub(start.elapsed()));
            stop.store(true, Ordering::SeqCst);
            let outcomes = collect(&done, THREADS, &mut report);
            // The threads still hold their last workers: the daemon lists exactly those, and
            // each serves a new host.
            let live: BTreeSet<u64> = current
                .iter()
                .map(|id| id.load(Ordering::SeqCst))
                .filter(|&id| id != NONE)
                .collect();
            if let Err(e) = daemon_lists(&service, gid, &live) {
                report.violation(format!("round {r}: {e}"));
            }
            let live: Vec<u64> = live.into_iter().collect();
            if let Err(e) = check_fresh_host(&daemon, &live) {
                report.violation(format!("round {r}: {e}"));
            }
            release.store(true, Ordering::SeqCst);
            for thread in threads {
                if thread.join().is_err() {
                    report.violation("a load thread panicked");
                }
            }
            outcomes
        });
        for (t, outcome) in outcomes.iter().enumerate() {
            for error in &outcome.errors {
                report.violation(format!("round {r} thread {t}: {error}"));
            }
            workers += outcome.loads.len() as u64;
            let total = outcome.total();
            check_counts(&mut report, &format!("round {r} thread {t}"), &total);
            report.tally.add(total.tally);
        }
        for outcome in &outcomes {
            let total = outcome.total();
            if total.failed {
                victims_load.add(&total);
            } else {
                others_load.add(&total);
            }
        }
    }
    check_clean(
        &mut report,
        "the threads whose workers were not killed",
        &others_load,
    );
    report.check(victims_load.failed || kills == 0, || {
        "no killed worker's tasks failed".to_owned()
    });
    report.check(
        victims_load
            .statuses
            .keys()
            .all(|status| *status == Status::NotConnected.name()),
        || {
            format!(
                "killed workers' tasks failed with {}",
                victims_load.statuses()
            )
        },
    );
    report.check(missed == 0, || {
        format!("{missed} kills found no worker to kill")
    });
    report.set("threads", THREADS);
    report.set("window", WINDOW);
    report.set("rounds", scale());
    report.set("workers", workers);
    report.set("kills", kills);
    report.set("killed_threads_ok", victims_load.tally.ok);
    report.set("killed_threads_error", victims_load.tally.error);
    report.set("other_threads_ok", others_load.tally.ok);
    report.set("errors", victims_load.statuses());
    report.finish();
}

// ---------------------------------------------------------------------------------------------

thread_local! {
    /// (user data's first word, status, response) of each completed command.
    static ANSWERS: RefCell<Vec<(u64, Status, Vec<u8>)>> = const { RefCell::new(Vec::new()) };
}

fn on_answer(task: &CompletedTask<'_>) {
    let tag = u64::from_le_bytes(task.user_data[..8].try_into().expect("8 bytes"));
    ANSWERS.with(|answers| {
        answers
            .borrow_mut()
            .push((tag, task.status, task.response.to_vec()))
    });
}

/// Submits `payload` for `plugin` tagged `tag`, retrying (after progress) while the channel or
/// the task slots are full.
fn submit_tagged(
    engine: &mut ProgressEngine,
    worker: &Worker<Running>,
    plugin: u64,
    tag: u64,
    payload: &[u8],
) -> Result<(), CommandError> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let submitted = worker.submit(plugin, |task| {
            task.user_data_mut()[..8].copy_from_slice(&tag.to_le_bytes());
            task.set_callback(on_answer);
            let room = task.payload_mut();
            if payload.len() <= room.len() {
                room[..payload.len()].copy_from_slice(payload);
            }
            payload.len()
        });
        match submitted {
            Err(CommandError::Exhausted) if Instant::now() < deadline => {
                engine.progress();
            }
            other => return other.map(|_| ()),
        }
    }
}

/// Progresses until `count` answers are in (at most [`PATIENCE`]), then a little longer to
/// catch any extra one; returns them all.
fn answers(engine: &mut ProgressEngine, count: usize) -> Vec<(u64, Status, Vec<u8>)> {
    let deadline = Instant::now() + PATIENCE;
    while ANSWERS.with(|a| a.borrow().len()) < count && Instant::now() < deadline {
        engine.progress();
    }
    let extra = Instant::now() + Duration::from_millis(100);
    while Instant::now() < extra {
        engine.progress();
    }
    ANSWERS.with(|a| a.borrow_mut().drain(..).collect())
}

/// Counts answers against expectations: one answer per tag, with the expected status and, when
/// given, response.
fn tally_answers(
    report: &mut Report,
    expected: &[(u64, Status, Option<Vec<u8>>)],
    got: &[(u64, Status, Vec<u8>)],
    what: &dyn Fn(u64) -> String,
) -> Tally {
    let mut tally = Tally {
        submitted: expected.len() as u64,
        ..Tally::default()
    };
    for (tag, status, response) in expected {
        let mine: Vec<_> = got.iter().filter(|(t, _, _)| t == tag).collect();
        match mine.as_slice() {
            [] => tally.lost += 1,
            [(_, got_status, got_response), more @ ..] => {
                tally.duplicated += more.len() as u64;
                if *got_status == Status::Success {
                    tally.ok += 1;
                } else {
                    tally.error += 1;
                }
                report.check(got_status == status, || {
                    format!("{}: {got_status}, expected {status}", what(*tag))
                });
                if let Some(response) = response {
                    report.check(got_response == response, || {
                        format!(
                            "{}: a response of {} bytes differs",
                            what(*tag),
                            got_response.len()
                        )
                    });
                }
            }
        }
    }
    let known: BTreeSet<u64> = expected.iter().map(|(tag, _, _)| *tag).collect();
    let strays = got
        .iter()
        .filter(|(tag, _, _)| !known.contains(tag))
        .count();
    report.check(strays == 0, || {
        format!("{strays} answers to commands never sent")
    });
    tally
}

/// Whether a probe of `plugin` still runs.
fn probing(plugin: &Path) -> bool {
    let needle = plugin.display().to_string();
    std::fs::read_dir("/proc")
        .map(|entries| {
            entries.flatten().any(|entry| {
                let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse().ok()) else {
                    return false;
                };
                let args = process::cmdline(pid);
                args.windows(2)
                    .any(|pair| pair[0] == "--probe-plugin" && pair[1] == needle)
            })
        })
        .unwrap_or(false)
}

/// A kind of command of the broken-plugins scenario.
struct Kind {
    what: &'static str,
    plugin: u64,
    /// Empty for a loopback carrying the task's tag.
    payload: Vec<u8>,
    status: Status,
    /// The response, when checked (a loopback's is its own command).
    response: Option<Vec<u8>>,
}

/// How many bytes of an ELF64 shared object the loader maps: the end of its last `PT_LOAD`
/// segment in the file.
fn loaded_len(elf: &[u8]) -> usize {
    let word = |at: usize, len: usize| {
        let mut bytes = [0u8; 8];
        bytes[..len].copy_from_slice(&elf[at..at + len]);
        u64::from_le_bytes(bytes) as usize
    };
    let (table, entry, count) = (word(32, 8), word(54, 2), word(56, 2));
    (0..count)
        .map(|i| table + i * entry)
        .filter(|&header| word(header, 4) == 1)
        .map(|header| word(header + 8, 8) + word(header + 32, 8))
        .max()
        .expect("a shared object has a PT_LOAD segment")
}

/// The plugin names a new host is offered.
fn offered(daemon: &Daemon) -> Result<Vec<(u64, String)>, String> {
    let service = Service::<Idle>::new()
        .set_socket(&daemon.socket)
        .start()
        .map_err(|(_, e)| e.to_string())?;
    Ok(service
        .plugins()
        .iter()
        .map(|p| (p.id, p.name.clone()))
        .collect())
}

/// Broken plugins of every kind beside good ones: each broken one is left out (and logged),
/// hosts are served while probes still hang, commands through every good plugin complete, and
/// commands to plugins that fail, panic, refuse or could not open complete with an error.
#[test]
fn broken_plugins_are_left_out_and_hold_up_no_host() {
    const SCENARIO: &str = "broken_plugins";
    let seed = seed_for(SCENARIO);
    let mut rng = Rng::new(seed);
    let mut report = Report::new(SCENARIO, seed);
    let root = workspace_root();
    let plugins = TempDir::new("urom-chaos-broken");
    let dir = plugin_dir(&plugins, &urom_testkit::daemon::GRAPH_AND_FAULTY);
    let c_plugin = |name: &str, defines: &[&str]| {
        let built = c_shared_object(
            &root.join("plugins/c-loopback/loopback.c"),
            &format!("chaos_{name}"),
            &[&root.join("plugins/include")],
            defines,
        );
        let path = dir.join(format!("{name}.so"));
        std::fs::copy(built, &path).expect("copying a C plugin");
        path
    };
    // Offered: good, chatty while loading, failing to open, refusing every command.
    c_plugin("c_loopback", &[]);
    c_plugin("c_chatty", &["CHATTY_ON_LOAD"]);
    c_plugin("c_open_fails", &["OPEN_FAILS"]);
    c_plugin("c_rejects", &["REJECT_COMMANDS"]);
    // Never offered, each with the words the daemon's log gives for it.
    let mut broken: Vec<(PathBuf, &str)> = vec![
        (
            c_plugin("broken_crash", &["CRASH_ON_LOAD"]),
            "crashed while loading",
        ),
        (
            c_plugin("broken_hang", &["HANG_ON_LOAD"]),
            "hung while loading",
        ),
        (
            c_plugin("broken_no_iface", &["OMIT_GET_IFACE"]),
            "does not export `urom_plugin_get_iface`",
        ),
        (
            c_plugin("broken_no_version", &["GET_VERSION_FAILS"]),
            "`urom_plugin_get_version` failed",
        ),
        (
            c_plugin("broken_iface_v9", &["IFACE_VERSION=9"]),
            "not a usable plugin",
        ),
    ];
    let hanging = broken[1].0.clone();
    let file = |name: &str, bytes: &[u8]| {
        let path = dir.join(name);
        std::fs::write(&path, bytes).expect("writing a plugin file");
        path
    };
    let graph_so = std::fs::read(cdylib("urom-plugin-graph", "worker_graph")).expect("the graph");
    broken.push((
        file("broken_text.so", b"not a library\n"),
        "not a usable plugin",
    ));
    broken.push((file("broken_empty.so", b""), "not a usable plugin"));
    // Cut in the middle of what the loader maps (past that, only debug information lies).
    broken.push((
        file(
            "broken_truncated.so",
            &graph_so[..loaded_len(&graph_so) / 2],
        ),
        "not a usable plugin",
    ));
    let mut other_arch = graph_so.clone();
    let machine: u16 = if cfg!(target_arch = "x86_64") {
        183
    } else {
        62
    };
    other_arch[18..20].copy_from_slice(&machine.to_le_bytes());
    broken.push((file("broken_arch.so", &other_arch), "not a usable plugin"));
    if let Ok(program) = std::fs::read("/bin/true") {
        broken.push((file("broken_program.so", &program), "not a usable plugin"));
    }
    // A file whose every read fails (root included).
    std::os::unix::fs::symlink("/proc/self/mem", dir.join("broken_eio.so")).unwrap();
    broken.push((dir.join("broken_eio.so"), "not a usable plugin"));
    // Not plugin files at all: skipped.
    std::fs::create_dir(dir.join("broken_dir.so")).unwrap();
    std::fs::write(dir.join("broken_dir.so/inner.so"), b"").unwrap();
    std::os::unix::fs::symlink(dir.join("missing"), dir.join("broken_dangling.so")).unwrap();
    std::os::unix::fs::symlink(dir.join("broken_loop.so"), dir.join("broken_loop.so")).unwrap();
    let fifo = std::process::Command::new("mkfifo")
        .arg(dir.join("broken_fifo.so"))
        .status()
        .is_ok_and(|status| status.success());
    std::fs::write(dir.join("README.txt"), "plugins live here").unwrap();
    // Unreadable: a good plugin no one may read (root reads it anyway, and is offered it).
    let unreadable = c_plugin("x_unreadable", &[]);
    std::fs::set_permissions(
        &unreadable,
        std::os::unix::fs::PermissionsExt::from_mode(0o000),
    )
    .unwrap();
    let as_root = process::uid(std::process::id() as i32) == Some(0);
    if !as_root {
        broken.push((unreadable.clone(), "not a usable plugin"));
    }
    // A second directory holding a plugin of a name found earlier, an empty entry and a
    // directory that is not there.
    let shadow = plugins.path().join("shadow");
    std::fs::create_dir(&shadow).unwrap();
    std::fs::copy(dir.join("c_loopback.so"), shadow.join("worker_graph.so")).unwrap();
    let path = format!(
        "{};;{};{}",
        dir.display(),
        shadow.display(),
        plugins.path().join("missing").display()
    );
    let mut expected: Vec<&str> = vec![
        "c_chatty",
        "c_loopback",
        "c_open_fails",
        "c_rejects",
        "worker_faulty",
        "worker_graph",
    ];
    if as_root {
        expected.push("x_unreadable");
    }
    let files = std::fs::read_dir(&dir).unwrap().count();

    let daemon = start_daemon(binary("urom-daemon", "urom-daemon"), &path, &[], true);
    // The first host is answered from what is known, while a probe still hangs.
    let first = offered(&daemon);
    let served_while_hanging = probing(&hanging) && !daemon.log().contains("hung while loading");
    report.check(served_while_hanging, || {
        "the first host was answered only once the hanging probe had ended".to_owned()
    });
    match &first {
        Ok(list) => report.check(
            list.iter()
                .all(|(_, name)| expected.contains(&name.as_str())),
            || format!("the first host was offered {list:?}"),
        ),
        Err(e) => report.violation(format!("the first host was not served: {e}")),
    }
    // Every probe ends, and each broken plugin is named in the log.
    let deadline = Instant::now() + PATIENCE;
    for (plugin, words) in &broken {
        let name = plugin.file_name().unwrap().to_string_lossy().into_owned();
        loop {
            let log = daemon.log();
            if log
                .lines()
                .any(|line| line.contains(&name) && line.contains(words))
            {
                break;
            }
            if Instant::now() > deadline {
                report.violation(format!(
                    "the log never says why {name} was left out ({words})"
                ));
                break;
            }
            thread::sleep(Duration::from_millis(50));
        }
    }
    // Then a new host gets every good plugin (the chatty one once its probe has drained).
    let deadline = Instant::now() + PATIENCE;
    let list = loop {
        let list = offered(&daemon).unwrap_or_default();
        let names: Vec<&str> = list.iter().map(|(_, name)| name.as_str()).collect();
        if names == expected || Instant::now() > deadline {
            break list;
        }
        thread::sleep(Duration::from_millis(50));
    };
    let names: Vec<&str> = list.iter().map(|(_, name)| name.as_str()).collect();
    report.check(names == expected, || {
        format!("a host was offered {names:?}, not {expected:?}")
    });
    report.check(daemon.log().contains("found earlier"), || {
        "the second worker_graph.so was not logged as shadowed".to_owned()
    });

    // A worker with every offered plugin but the chatty one (whose megabytes would go to this
    // test's output); commands of every kind, in a random order.
    let service = start_service(&daemon);
    let id = |name: &str| service.plugin(name).map_or(0, |p| p.id);
    let mask = service.plugins().iter().fold(0, |mask, p| mask | p.id) & !id("c_chatty");
    let mut engine = ProgressEngine::new();
    let worker_id = 77;
    let worker = Worker::new()
        .set_service(&service)
        .set_id(worker_id)
        .set_plugins(mask)
        .set_max_inflight_tasks(64)
        // The faulty plugin's panics are meant; one line each is enough.
        .set_env(["RUST_BACKTRACE=0".to_owned()]);
    let worker = match try_run_worker(&mut engine, worker) {
        Ok(worker) => worker,
        Err(e) => {
            report.violation(format!("a worker with every offered plugin: {e}"));
            report.finish();
            return;
        }
    };
    let loopback = |data: u64| {
        frames::loopback_command(0, 0, data, MaxMsgSize::DEFAULT)[COMMAND_PAYLOAD_OFFSET..].to_vec()
    };
    // What to send to whom, what must come back: (what, plugin, payload (empty: a loopback
    // carrying the task's tag), status, response (of a payload that is not a loopback)).
    let kind = |what, plugin: &str, payload: &[u8], status, response: Option<&[u8]>| Kind {
        what,
        plugin: id(plugin),
        payload: payload.to_vec(),
        status,
        response: response.map(<[u8]>::to_vec),
    };
    let kinds = [
        kind("graph loopback", "worker_graph", b"", Status::Success, None),
        kind("C loopback", "c_loopback", b"", Status::Success, None),
        kind(
            "faulty echo",
            "worker_faulty",
            b"echo",
            Status::Success,
            Some(b"echo"),
        ),
        kind(
            "faulty later",
            "worker_faulty",
            b"later",
            Status::Success,
            Some(b"late"),
        ),
        kind(
            "faulty fail",
            "worker_faulty",
            b"fail",
            Status::NotSupported,
            None,
        ),
        kind(
            "faulty panic",
            "worker_faulty",
            b"panic",
            Status::Unexpected,
            None,
        ),
        kind(
            "C plugin refusing commands",
            "c_rejects",
            b"",
            Status::NotSupported,
            None,
        ),
        kind(
            "C plugin that did not open",
            "c_open_fails",
            b"",
            Status::NotFound,
            None,
        ),
    ];
    let commands = scaled(60);
    let mut expected_answers = Vec::new();
    let mut counts = vec![0u64; kinds.len()];
    for tag in 0..commands {
        let kind = rng.index(kinds.len());
        let Kind {
            what,
            plugin,
            payload,
            status,
            response,
        } = &kinds[kind];
        // Loopbacks carry their tag, and come back with it.
        let (payload, response) = if payload.is_empty() {
            let packed = loopback(tag);
            let back = (*status == Status::Success).then(|| packed.clone());
            (packed, back)
        } else {
            (payload.clone(), response.clone())
        };
        let tag = tag << 8 | kind as u64;
        match submit_tagged(&mut engine, &worker, *plugin, tag, &payload) {
            Ok(()) => {
                counts[kind] += 1;
                expected_answers.push((tag, *status, response));
            }
            Err(e) => report.violation(format!("submitting a {what}: {e}")),
        }
    }
    let got = answers(&mut engine, expected_answers.len());
    let what = |tag: u64| {
        format!(
            "a {} (task {})",
            kinds[(tag & 0xff) as usize].what,
            tag >> 8
        )
    };
    let tally = tally_answers(&mut report, &expected_answers, &got, &what);
    report.tally.add(tally);
    if let Err(e) = check_fresh_host(&daemon, &[worker_id]) {
        report.violation(e);
    }
    report.set("files", files + 2);
    report.set("offered", names.len());
    report.set("left_out", files + 2 - names.len());
    report.set("logged_broken", broken.len());
    report.set("fifo", fifo);
    report.set("first_host_while_probe_hangs", served_while_hanging);
    report.set(
        "per_kind",
        counts
            .iter()
            .map(|count| count.to_string())
            .collect::<Vec<_>>()
            .join(","),
    );
    report.finish();
}

// ---------------------------------------------------------------------------------------------

/// What became of one malformed frame sent to the daemon. (A request the daemon refuses, a
/// spawn of an unknown plugin say, gets an error reply without ending the session, so more
/// replies may follow it: to what came after the frame.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FrameEnd {
    /// Ending with an error reply, then the end of the stream.
    Refused,
    /// Still a valid frame: answered, then the end (we hung up).
    Answered,
    /// Cut short (we hung up mid-frame): the end, no reply needed.
    CutShort,
}

/// Sends `frame` on a new connection (after a hello and authentication when `authenticated`),
/// hangs up unless `keep_open`, and reads how the daemon ends the connection.
fn frame_to_daemon(
    socket: &Path,
    frame: &[u8],
    authenticated: bool,
    keep_open: bool,
) -> Result<FrameEnd, String> {
    let max = MaxMsgSize::DEFAULT;
    let mut stream = raw::connect(socket).map_err(|e| format!("cannot connect: {e}"))?;
    if authenticated {
        raw::handshake(&mut stream, max)?;
    }
    // The daemon may have refused and be draining already; what it reads is up to it.
    let _ = stream.write_all(frame);
    if !keep_open {
        let _ = stream.shutdown(Shutdown::Write);
    }
    let ending = raw::ending(&mut stream, Instant::now() + PATIENCE);
    let complete = frame.len() >= FRAME_HEADER_LEN
        && match frame_length(frame, max) {
            Err(_) => true,
            Ok(Some(len)) => len <= frame.len(),
            Ok(None) => false,
        };
    match ending.how {
        How::Reset => return Err("the connection was reset".to_owned()),
        How::Open => return Err(format!("neither answered nor closed within {PATIENCE:?}")),
        How::Garbled => return Err("the daemon sent something that is not a frame".to_owned()),
        How::Closed => {}
    }
    match (ending.refusal(), ending.replies.is_empty(), complete) {
        (Some(_), _, _) => Ok(FrameEnd::Refused),
        (None, false, _) => Ok(FrameEnd::Answered),
        (None, true, false) => Ok(FrameEnd::CutShort),
        (None, true, true) => Err("a whole frame was neither answered nor refused".to_owned()),
    }
}

/// Counts of what the daemon did with malformed frames.
#[derive(Default, Debug)]
struct DaemonFrames {
    sent: u64,
    refused: u64,
    answered: u64,
    cut_short: u64,
    problems: Vec<String>,
}

fn daemon_frames(socket: &Path, seed: u64, count: u64) -> DaemonFrames {
    let max = MaxMsgSize::DEFAULT;
    let mut rng = Rng::new(seed);
    let seeds = control_seeds(max);
    let mut counts = DaemonFrames::default();
    for n in 0..count {
        let frame = if rng.percent(25) {
            random_frame(&mut rng, 300)
        } else {
            let seed = rng.index(seeds.len());
            mutate(&mut rng, &seeds[seed], max)
        };
        let header_refused = frame.len() >= FRAME_HEADER_LEN && frame_length(&frame, max).is_err();
        let keep_open = header_refused && rng.percent(30);
        let authenticated = rng.percent(30);
        counts.sent += 1;
        match frame_to_daemon(socket, &frame, authenticated, keep_open) {
            Ok(FrameEnd::Refused) => counts.refused += 1,
            Ok(FrameEnd::Answered) => counts.answered += 1,
            Ok(FrameEnd::CutShort) => counts.cut_short += 1,
            Err(e) => counts.problems.push(format!(
                "frame {n} ({} bytes, {}authenticated{}): {e}: {frame:02x?}",
                frame.len(),
                if authenticated { "" } else { "not " },
                if keep_open { ", kept open" } else { "" },
            )),
        }
    }
    counts
}

/// A frame cut short and left so: the daemon gives up on it with `DOCA_ERROR_TIME_OUT`, then
/// ends the connection.
fn stalled_frame(socket: &Path, bytes: &[u8]) -> Result<(), String> {
    let mut stream = raw::connect(socket).map_err(|e| format!("cannot connect: {e}"))?;
    stream.write_all(bytes).map_err(|e| e.to_string())?;
    let ending = raw::ending(&mut stream, Instant::now() + PATIENCE);
    match (ending.how, ending.refusal()) {
        (How::Closed, Some(Status::TimeOut)) if ending.replies.len() == 1 => Ok(()),
        _ => Err(format!("half a frame ended as {ending:?}")),
    }
}

/// What a worker answered to garbage on a host's shared-memory channel.
#[derive(Default, Debug)]
struct ChannelFrames {
    tally: Tally,
    problems: Vec<String>,
}

/// Sends `count` random and broken frames on a channel to the worker at `socket`: each gets
/// exactly one notification, error or not; then a loopback still comes back.
fn channel_frames(socket: &Path, graph: u64, seed: u64, count: u64) -> ChannelFrames {
    const IN_FLIGHT: u64 = 32;
    let max = MaxMsgSize::DEFAULT;
    let mut rng = Rng::new(seed);
    let mut conn = connect(socket);
    let mut seeds = vec![
        loopback_command(1, graph, 7, max),
        loopback_command(2, 1 << 40, 8, max),
    ];
    let mut command = vec![0u8; COMMAND_PAYLOAD_OFFSET + 40];
    let len = write_command_headers(&mut command, 3, graph, 9, 40, max).unwrap();
    command.truncate(len);
    seeds.push(command);
    let mut notify = vec![0u8; NOTIFY_PAYLOAD_OFFSET + 8];
    let len = write_notify_headers(&mut notify, 4, graph, 10, Status::Success, 8, max).unwrap();
    notify.truncate(len);
    seeds.push(notify);

    let mut out = ChannelFrames::default();
    let mut received = 0u64;
    let take = |conn: &mut Channel, out: &mut ChannelFrames, received: &mut u64| loop {
        match conn.recv() {
            Ok(Some(frame)) => {
                *received += 1;
                match FrameRepr::<DataMessage>::parse(frame, max) {
                    Ok(FrameRepr {
                        body: DataMessage::Notify(notification),
                        ..
                    }) => {
                        if notification.status == Status::Success {
                            out.tally.ok += 1;
                        } else {
                            out.tally.error += 1;
                        }
                    }
                    other => out.problems.push(format!("the worker sent {other:?}")),
                }
            }
            Ok(None) => return true,
            Err(e) => {
                out.problems.push(format!("the channel failed: {e}"));
                return false;
            }
        }
    };
    for _ in 0..count {
        let frame = if rng.percent(30) {
            random_frame(&mut rng, max.get())
        } else {
            let seed = rng.index(seeds.len());
            mutate(&mut rng, &seeds[seed], max)
        };
        let deadline = Instant::now() + PATIENCE;
        loop {
            if out.tally.submitted - received < IN_FLIGHT {
                match conn.send(&frame) {
                    Ok(()) => {
                        out.tally.submitted += 1;
                        break;
                    }
                    Err(FrameSendError::Full) => {}
                    Err(e) => {
                        out.problems.push(format!("sending a frame: {e}"));
                        return out;
                    }
                }
            }
            if !take(&mut conn, &mut out, &mut received) {
                return out;
            }
            if Instant::now() > deadline {
                out.problems
                    .push(format!("the worker took no frame for {PATIENCE:?}"));
                return out;
            }
            let _ = conn.wait_recv(Duration::from_millis(1));
        }
    }
    let deadline = Instant::now() + PATIENCE;
    while received < out.tally.submitted && Instant::now() < deadline {
        if !take(&mut conn, &mut out, &mut received) {
            return out;
        }
        let _ = conn.wait_recv(Duration::from_millis(10));
    }
    // Anything more would be a duplicate.
    let _ = conn.wait_recv(Duration::from_millis(100));
    take(&mut conn, &mut out, &mut received);
    let answered = out.tally.ok + out.tally.error;
    out.tally.lost = out.tally.submitted.saturating_sub(answered);
    out.tally.duplicated = answered.saturating_sub(out.tally.submitted);
    out.tally.ok -= out.tally.duplicated.min(out.tally.ok);
    // The channel still carries a loopback.
    let last = loopback_command(u64::MAX, graph, 0xc0ffee, max);
    if conn.send(&last).is_err() {
        out.problems
            .push("the channel took no loopback after the garbage".to_owned());
        return out;
    }
    let deadline = Instant::now() + PATIENCE;
    loop {
        match conn.recv() {
            Ok(Some(frame)) => {
                match FrameRepr::<DataMessage>::parse(frame, max) {
                    Ok(FrameRepr {
                        body: DataMessage::Notify(n),
                        ..
                    }) if n.urom_context == 0xc0ffee && n.status == Status::Success => {}
                    other => out.problems.push(format!(
                        "a loopback after the garbage came back as {other:?}"
                    )),
                }
                break;
            }
            Ok(None) if Instant::now() < deadline => {
                let _ = conn.wait_recv(Duration::from_millis(10));
            }
            other => {
                out.problems.push(format!(
                    "no answer to a loopback after the garbage: {other:?}"
                ));
                break;
            }
        }
    }
    out
}

/// Garbage on the worker's socket before the channel handshake: the worker ends each
/// connection (reading the end of the stream or a reset), never hangs.
fn socket_garbage(socket: &Path, seed: u64, count: u64) -> (u64, Vec<String>) {
    let mut rng = Rng::new(seed);
    let mut problems = Vec::new();
    let mut ended = 0;
    for n in 0..count {
        let mut stream = match UnixStream::connect(socket) {
            Ok(stream) => stream,
            Err(e) => {
                problems.push(format!("connection {n}: cannot connect: {e}"));
                continue;
            }
        };
        let len = rng.between(1, 64) as usize;
        let garbage = rng.bytes(len);
        let _ = stream.write_all(&garbage);
        if rng.percent(70) {
            let _ = stream.shutdown(Shutdown::Write);
        }
        let _ = stream.set_read_timeout(Some(PATIENCE));
        let mut rest = Vec::new();
        match stream.read_to_end(&mut rest) {
            Ok(_) => ended += 1,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => ended += 1,
            Err(e) => problems.push(format!(
                "connection {n} ({} bytes of garbage): not ended: {e}",
                garbage.len()
            )),
        }
    }
    (ended, problems)
}

/// Malformed frames on every socket: random and broken frames to the daemon's socket (an error
/// reply, then an orderly end, never a reset), half frames left hanging (refused with
/// `DOCA_ERROR_TIME_OUT`), garbage on a host's shared-memory channel (one error notification per
/// frame) and on a worker's socket before the handshake, while a good host works on the same
/// worker unharmed.
#[test]
fn malformed_frames_on_every_socket_get_errors_and_hurt_no_one_else() {
    const SCENARIO: &str = "malformed_frames";
    const WORKER: u64 = 0x5eed;
    let seed = seed_for(SCENARIO);
    let mut rng = Rng::new(seed);
    let mut report = Report::new(SCENARIO, seed);
    let (_plugins, daemon) = graph_daemon(&[]);
    let service = start_service(&daemon);
    let graph = graph_of(&service);
    let (stop, release) = (AtomicBool::new(false), AtomicBool::new(false));
    let current = AtomicU64::new(NONE);
    let daemon_count = scaled(150);
    let channel_count = scaled(400);
    let socket_count = scaled(20);
    let seeds: Vec<u64> = (0..6).map(|_| rng.next_u64()).collect();
    let (done_tx, done) = mpsc::channel();
    let worker_socket = std::sync::OnceLock::new();

    thread::scope(|scope| {
        let plan = LoadPlan {
            service: &service,
            graph,
            first_id: WORKER,
            gid: 3,
            window: 32,
            replace: false,
            pause: None,
            current: &current,
            stop: &stop,
            release: &release,
        };
        let load = scope.spawn(move || load_thread(plan, false, done_tx));
        if !all_running(std::slice::from_ref(&current)) {
            report.violation("the good host's worker did not start");
        }
        // The worker's socket, as the daemon names it to another host of the same user.
        let mut control = ControlClient::connect(&daemon.socket, PATIENCE).unwrap();
        control.handshake().unwrap();
        let (_, socket) = control.spawn(WORKER, 3, graph.id(), "", &[]).unwrap();
        let worker_socket: &PathBuf = worker_socket.get_or_init(|| socket);
        let worker_pid = daemon
            .worker_pid(WORKER)
            .expect("the good host's worker runs");
        let files_before = process::open_files(worker_pid);

        let socket = &daemon.socket;
        let daemon_threads: Vec<_> = (0..3)
            .map(|t| {
                let seed = seeds[t];
                scope.spawn(move || daemon_frames(socket, seed, daemon_count / 3))
            })
            .collect();
        let stalls: Vec<_> = [frames::hello(1, MaxMsgSize::DEFAULT)[..10].to_vec(), {
            frames::hello(2, MaxMsgSize::DEFAULT)[..40].to_vec()
        }]
        .into_iter()
        .map(|bytes| scope.spawn(move || stalled_frame(socket, &bytes)))
        .collect();
        let (channel_seed, garbage_seed) = (seeds[3], seeds[4]);
        let channel = scope
            .spawn(move || channel_frames(worker_socket, graph.id(), channel_seed, channel_count));
        let garbage =
            scope.spawn(move || socket_garbage(worker_socket, garbage_seed, socket_count));

        let mut daemon_counts = DaemonFrames::default();
        for thread in daemon_threads {
            let counts = thread.join().expect("a frame thread panicked");
            daemon_counts.sent += counts.sent;
            daemon_counts.refused += counts.refused;
            daemon_counts.answered += counts.answered;
            daemon_counts.cut_short += counts.cut_short;
            daemon_counts.problems.extend(counts.problems);
        }
        let mut stalled_ok = 0;
        for stall in stalls {
            match stall.join().expect("a stall thread panicked") {
                Ok(()) => stalled_ok += 1,
                Err(e) => report.violation(format!("a stalled frame: {e}")),
            }
        }
        let channel = channel.join().expect("the channel thread panicked");
        let (socket_ended, socket_problems) = garbage.join().expect("the garbage thread panicked");
        stop.store(true, Ordering::SeqCst);
        let outcomes = collect(&done, 1, &mut report);
        let host = outcomes.first().map(Outcome::total).unwrap_or_default();
        for outcome in &outcomes {
            for error in &outcome.errors {
                report.violation(format!("the good host: {error}"));
            }
        }
        check_clean(&mut report, "the good host", &host);
        if let Err(e) = check_fresh_host(&daemon, &[WORKER]) {
            report.violation(e);
        }
        let files_after = process::open_files(worker_pid);
        report.check(process::alive(worker_pid), || "the worker died".to_owned());
        release.store(true, Ordering::SeqCst);
        drop(control);
        if load.join().is_err() {
            report.violation("the good host's thread panicked");
        }

        let problems = daemon_counts.problems.len();
        for problem in daemon_counts.problems.iter().take(10) {
            report.violation(format!("daemon: {problem}"));
        }
        for problem in channel.problems.iter().take(10) {
            report.violation(format!("channel: {problem}"));
        }
        for problem in socket_problems.iter().take(10) {
            report.violation(format!("worker socket: {problem}"));
        }
        // The tasks: frames to the daemon (an error or an answer each, or the end when cut
        // short), frames on the channel (one notification each), garbage connections to the
        // worker (ended each).
        report.tally.submitted =
            daemon_counts.sent + channel.tally.submitted + socket_count + stalled_ok;
        report.tally.ok = daemon_counts.answered + daemon_counts.cut_short + channel.tally.ok;
        report.tally.error =
            daemon_counts.refused + channel.tally.error + socket_ended + stalled_ok;
        report.tally.lost = problems as u64 + channel.tally.lost + socket_problems.len() as u64;
        report.tally.duplicated = channel.tally.duplicated;
        report.set("daemon_frames", daemon_counts.sent);
        report.set("daemon_refused", daemon_counts.refused);
        report.set("daemon_answered", daemon_counts.answered);
        report.set("daemon_cut_short", daemon_counts.cut_short);
        report.set("stalled_timed_out", stalled_ok);
        report.set("channel_frames", channel.tally.submitted);
        report.set("channel_errors", channel.tally.error);
        report.set("socket_garbage_ended", socket_ended);
        report.set(
            "worker_files",
            format!(
                "{}->{}",
                files_before.map_or("?".into(), |n| n.to_string()),
                files_after.map_or("?".into(), |n| n.to_string())
            ),
        );
        report.set("host_ok", host.tally.ok);
        report.set("host_error", host.tally.error);
        report.set("daemon_alive", daemon.is_running());
        report.check(daemon.is_running(), || "the daemon died".to_owned());
    });
    report.finish();
}

// ---------------------------------------------------------------------------------------------

/// Slow hosts: one leaves 512 loopbacks in flight on a bare channel and takes nothing for a
/// while, another (through the host library) stops progressing with 512 in flight, a third
/// fills its ring and never comes back; meanwhile one host measures round trips and another
/// keeps a pipeline full. The worker keeps the slow hosts' notifications and holds their
/// commands; the others see no error, the slow ones get every answer once, and the one that
/// never came back hurts no one.
#[test]
fn slow_and_vanished_hosts_hold_up_no_one_and_lose_nothing() {
    const SCENARIO: &str = "slow_hosts";
    const WORKER: u64 = 0x510;
    const IN_FLIGHT: u64 = 512;
    let pause = scaled_duration(Duration::from_secs(2));
    let seed = seed_for(SCENARIO);
    let mut report = Report::new(SCENARIO, seed);
    let (_plugins, daemon) = graph_daemon(&[]);
    let service = start_service(&daemon);
    let graph = graph_of(&service);
    let (stop, release) = (AtomicBool::new(false), AtomicBool::new(false));
    let current = [AtomicU64::new(NONE), AtomicU64::new(NONE)];
    let (done_tx, done) = mpsc::channel();

    thread::scope(|scope| {
        // A host keeping 32 loopbacks in flight, on the worker it starts.
        let quick = LoadPlan {
            service: &service,
            graph,
            first_id: WORKER,
            gid: 4,
            window: 32,
            replace: false,
            pause: None,
            current: &current[0],
            stop: &stop,
            release: &release,
        };
        let quick_done = done_tx.clone();
        let quick = scope.spawn(move || load_thread(quick, false, quick_done));
        if !all_running(&current[..1]) {
            report.violation("the first host's worker did not start");
        }
        // A host of the host library that attaches to it and stops progressing, with 512 in
        // flight, for the pause.
        let paused = LoadPlan {
            service: &service,
            graph,
            first_id: WORKER,
            gid: 4,
            window: IN_FLIGHT,
            replace: false,
            pause: Some((Duration::from_millis(300), pause)),
            current: &current[1],
            stop: &stop,
            release: &release,
        };
        let paused = scope.spawn(move || load_thread(paused, true, done_tx));
        let mut control = ControlClient::connect(&daemon.socket, PATIENCE).unwrap();
        control.handshake().unwrap();
        let (_, socket) = control.spawn(WORKER, 4, graph.id(), "", &[]).unwrap();

        // A host that fills its ring and never comes back.
        let mut vanished = connect(&socket);
        let mut abandoned = 0u64;
        loop {
            let command = loopback_command(abandoned, graph.id(), abandoned, MaxMsgSize::DEFAULT);
            match vanished.send(&command) {
                Ok(()) => abandoned += 1,
                Err(FrameSendError::Full)
                    if vanished
                        .wait_send(Duration::from_millis(200))
                        .unwrap_or(false) => {}
                Err(_) => break,
            }
            if abandoned >= 4 * IN_FLIGHT {
                break;
            }
        }
        // A bare host pauses with 512 in flight while another measures round trips.
        let run = pause_and_come_back(&socket, graph.id(), IN_FLIGHT, pause);
        // The vanished host dies without a word.
        vanished.simulate_crash();

        stop.store(true, Ordering::SeqCst);
        let outcomes = collect(&done, 2, &mut report);
        let mut hosts = Load::default();
        for outcome in &outcomes {
            for error in &outcome.errors {
                report.violation(format!("a host: {error}"));
            }
            let total = outcome.total();
            check_clean(&mut report, "a host of the host library", &total);
            hosts.add(&total);
        }
        if let Err(e) = check_fresh_host(&daemon, &[WORKER]) {
            report.violation(e);
        }
        release.store(true, Ordering::SeqCst);
        drop(control);
        for thread in [quick, paused] {
            if thread.join().is_err() {
                report.violation("a host thread panicked");
            }
        }

        let (median, worst) = run.median_and_worst();
        let answered_once = run.answered.iter().filter(|&&n| n == 1).count() as u64;
        let missing = run.answered.iter().filter(|&&n| n == 0).count() as u64;
        let extra: u64 = run
            .answered
            .iter()
            .map(|&n| u64::from(n.saturating_sub(1)))
            .sum();
        report.check(!run.round_trips.is_empty(), || {
            "the measuring host made no round trip".to_owned()
        });
        report.check(!run.more, || {
            "the paused host got more than its answers".to_owned()
        });
        report.tally = hosts.tally;
        report.tally.add(Tally {
            submitted: IN_FLIGHT + run.round_trips.len() as u64,
            ok: answered_once - run.errors.min(answered_once) + run.round_trips.len() as u64,
            error: run.errors,
            lost: missing,
            duplicated: extra,
        });
        report.set("pause", format!("{pause:?}"));
        report.set("slow_in_flight", IN_FLIGHT);
        report.set("round_trips", run.round_trips.len());
        report.set("median", format!("{median:?}"));
        report.set("worst", format!("{worst:?}"));
        report.set("abandoned", abandoned);
        report.set("pipelined_hosts_ok", hosts.tally.ok);
    });
    report.finish();
}

// ---------------------------------------------------------------------------------------------

/// Writes a command payload that the faulty plugin echoes (it starts with a byte no special
/// word starts with).
fn echo_payload(rng: &mut Rng, len: usize) -> Vec<u8> {
    let mut payload = rng.bytes(len);
    if let Some(first) = payload.first_mut() {
        *first = 0xff;
    }
    payload
}

/// The limits of the message size: daemons and workers at `-m 184` and `-m 16777216`; a
/// command of exactly the largest payload is sent and answered (its echo whole: a notification's
/// headers take as many bytes as a command's), one of the largest notification payload comes
/// back whole, and one byte more is refused on the host side with a clear error, never sent.
#[test]
fn commands_at_the_largest_payload_go_through_and_one_byte_more_is_refused() {
    const SCENARIO: &str = "message_size_limits";
    const WORKER: u64 = 0x11;
    let seed = seed_for(SCENARIO);
    let mut rng = Rng::new(seed);
    let mut report = Report::new(SCENARIO, seed);
    let mut refused = 0;
    for max in [MaxMsgSize::MIN, MaxMsgSize::MAX] {
        let size = MaxMsgSize::new(max).unwrap();
        let (_plugins, daemon) = graph_daemon(&["-m", &max.to_string()]);
        let service = Service::<Idle>::new()
            .set_socket(&daemon.socket)
            .set_max_msg_size(max)
            .unwrap()
            .start()
            .map_err(|(_, e)| e)
            .unwrap();
        let graph = graph_of(&service);
        let faulty = service.plugin("worker_faulty").unwrap().id;
        let mut engine = ProgressEngine::new();
        let worker = Worker::new()
            .set_service(&service)
            .set_id(WORKER)
            .set_plugins(graph.id() | faulty)
            .set_max_inflight_tasks(4);
        let worker = match try_run_worker(&mut engine, worker) {
            Ok(worker) => worker,
            Err(e) => {
                report.violation(format!("-m {max}: no worker: {e}"));
                continue;
            }
        };
        let command_max = max_command_payload(size);
        let notify_max = max_notify_payload(size);
        assert_eq!(worker.max_command_payload(), command_max);
        let mut expected = Vec::new();
        for round in 0..u64::from(scale()) {
            let tag = |n: u64| u64::from(max) << 20 | round << 4 | n;
            let whole = echo_payload(&mut rng, notify_max);
            let largest = echo_payload(&mut rng, command_max);
            let loopback = loopback_command(0, 0, tag(2), size)[COMMAND_PAYLOAD_OFFSET..].to_vec();
            for (n, plugin, payload, status, response) in [
                (0, faulty, whole.clone(), Status::Success, Some(whole)),
                (1, faulty, largest.clone(), Status::Success, Some(largest)),
                (
                    2,
                    graph.id(),
                    loopback.clone(),
                    Status::Success,
                    Some(loopback),
                ),
            ] {
                match submit_tagged(&mut engine, &worker, plugin, tag(n), &payload) {
                    Ok(()) => expected.push((tag(n), status, response)),
                    Err(e) => report.violation(format!("-m {max}: task {n}: {e}")),
                }
            }
            // One byte more: refused before anything is sent.
            let too_big = echo_payload(&mut rng, command_max + 1);
            match submit_tagged(&mut engine, &worker, faulty, tag(3), &too_big) {
                Err(e @ CommandError::TooBig { .. }) => {
                    refused += 1;
                    let wanted = format!(
                        "command payload of {} bytes exceeds the {command_max} bytes a message carries",
                        command_max + 1
                    );
                    report.check(e.to_string() == wanted, || {
                        format!("-m {max}: the refusal says {e:?}: {e}")
                    });
                }
                other => report.violation(format!(
                    "-m {max}: a payload one byte too big was {other:?}"
                )),
            }
        }
        let got = answers(&mut engine, expected.len());
        let what = |tag: u64| format!("-m {max}: task {}", tag & 0xf);
        let tally = tally_answers(&mut report, &expected, &got, &what);
        report.tally.add(tally);

        // The same on a bare channel: a frame of exactly the maximum is sent, one byte more is
        // refused by the channel; the next loopback is the next answer.
        let mut control = ControlClient::connect(&daemon.socket, PATIENCE).unwrap();
        control.handshake_with(max).unwrap();
        let (_, socket) = control.spawn(WORKER, 0, faulty, "", &[]).unwrap();
        let mut conn = connect_with(&socket, &ChannelConfig::new(size));
        let mut frame = vec![0u8; size.get() + 1];
        let len = write_command_headers(&mut frame, 1, faulty, 1, command_max, size).unwrap();
        assert_eq!(len, size.get());
        report.tally.submitted += 1;
        let sent = conn.send(&frame[..len]);
        report.check(sent.is_ok(), || {
            format!("-m {max}: a whole frame: {sent:?}")
        });
        let refusal = conn.send(&frame);
        report.check(
            refusal
                == Err(FrameSendError::TooLarge {
                    len: size.get() + 1,
                    max,
                }),
            || format!("-m {max}: a frame one byte too big: {refusal:?}"),
        );
        refused += 1;
        let next = loopback_command(2, graph.id(), 2, size);
        let _ = conn.send(&next);
        let mut contexts = Vec::new();
        let deadline = Instant::now() + PATIENCE;
        while contexts.len() < 2 && Instant::now() < deadline {
            match conn.recv() {
                Ok(Some(frame)) => match FrameRepr::<DataMessage>::parse(frame, size) {
                    Ok(FrameRepr {
                        body: DataMessage::Notify(n),
                        ..
                    }) => contexts.push((n.urom_context, n.status)),
                    other => report.violation(format!("-m {max}: the worker sent {other:?}")),
                },
                Ok(None) => {
                    let _ = conn.wait_recv(Duration::from_millis(10));
                }
                Err(e) => {
                    report.violation(format!("-m {max}: the channel failed: {e}"));
                    break;
                }
            }
        }
        report.check(
            contexts == [(1, Status::Success), (2, Status::Success)],
            || format!("-m {max}: a bare host got {contexts:?}"),
        );
        match contexts.first() {
            Some(_) => report.tally.ok += 1,
            None => report.tally.lost += 1,
        }
        if let Err(e) = check_fresh_host_at(&daemon, size, &[WORKER]) {
            report.violation(format!("-m {max}: {e}"));
        }
        drop(control);
        let _ = worker.stop();
        service.stop();
    }
    report.set("sizes", format!("{},{}", MaxMsgSize::MIN, MaxMsgSize::MAX));
    report.set("refused", refused);
    report.finish();
}
