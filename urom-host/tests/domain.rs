//! Domains against a real daemon and real workers: ranks (each a thread with its own service,
//! engine and worker, or a process of its own) meet through the socket rendezvous; plugins in C
//! and in Rust look each other up; and every way a start fails names the rank, on every rank,
//! without hanging.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Instant;

use urom_host::oob::{RendezvousAddr, SocketOob};
use urom_host::{
    CompletedTask, Domain, DomainStartError, DomainStartProgress, Idle, ProgressEngine, Running,
    Service, Worker, WorkerState,
};
use urom_testkit::daemon::{Daemon, plugin_dir, start_daemon};
use urom_testkit::host::{TIMEOUT, run_worker};
use urom_testkit::process::{Signal, signal};
use urom_testkit::{ChildGuard, TempDir, binary};
use urom_wire::Status;

/// The C plugin's name on the daemon.
const LOOKUPS: &str = "worker_domain_lookups";
/// The Rust plugin's name.
const FAULTY: &str = "worker_faulty";

/// A daemon offering the faulty plugin (Rust SDK) and the C domain-lookups plugin.
fn daemon() -> (TempDir, Daemon) {
    let plugins = TempDir::new("urom-domain-plugins");
    let dir = plugin_dir(&plugins, &[("urom-plugin-faulty", "worker_faulty")]);
    let root = urom_testkit::workspace_root();
    let lookups = urom_testkit::c_shared_object(
        &root.join("plugins/c-domain-lookups/domain_lookups.c"),
        "worker_domain_lookups",
        &[&root.join("plugins/include")],
        &[],
    );
    std::fs::copy(lookups, dir.join(format!("{LOOKUPS}.so"))).unwrap();
    let daemon = start_daemon(
        binary("urom-daemon", "urom-daemon"),
        dir.to_str().unwrap(),
        &[],
        true,
    );
    (plugins, daemon)
}

fn service(socket: &Path) -> Service<Running> {
    Service::<Idle>::new()
        .set_socket(socket)
        .start()
        .map_err(|(_, e)| e)
        .unwrap_or_else(|e| panic!("the service did not start: {e}"))
}

/// A rendezvous address in `dir`.
fn rendezvous(dir: &TempDir) -> RendezvousAddr {
    RendezvousAddr::Unix(dir.path().join("rendezvous.sock"))
}

fn join(address: &RendezvousAddr, ranks: u32, rank: u32) -> SocketOob {
    SocketOob::join(address, ranks, rank, TIMEOUT)
        .unwrap_or_else(|e| panic!("rank {rank} did not join the rendezvous: {e}"))
}

/// Rank `rank`'s buffers: segment 0 with both keys, segment 1 with no memory handle (as UCX
/// 1.13 hosts add them).
fn buffers(rank: u32) -> [(u64, u64, Vec<u8>, Vec<u8>); 2] {
    let base = 0x10_0000 * u64::from(rank + 1);
    [
        (
            base,
            0x1000,
            format!("memh-{rank}-0").into_bytes(),
            format!("mkey-{rank}-0").into_bytes(),
        ),
        (
            base + 0x8000,
            0x1000,
            Vec::new(),
            format!("mkey-{rank}-1").into_bytes(),
        ),
    ]
}

/// An idle domain of `worker` as domain id `id`, with rank `rank`'s buffers.
fn domain(oob: SocketOob, id: u64, worker: &Worker<Running>, rank: u32) -> Domain<Idle> {
    let mut domain = Domain::new()
        .set_oob(oob)
        .set_workers(&[id], &[worker])
        .map_err(|(_, e)| e)
        .unwrap()
        .set_buffers_count(2)
        .map_err(|(_, e)| e)
        .unwrap();
    for (va, len, memh, mkey) in buffers(rank) {
        domain = domain
            .add_buffer(va, len, &memh, &mkey)
            .map_err(|(_, e)| e)
            .unwrap();
    }
    domain
}

fn wait_running(domain: Domain<Idle>, engine: &mut ProgressEngine) -> Domain<Running> {
    let starting = domain
        .start(engine)
        .map_err(|(_, e)| e)
        .unwrap_or_else(|e| panic!("the domain did not start: {e}"));
    match starting.wait_running(engine, TIMEOUT) {
        Ok(running) => running,
        Err(DomainStartProgress::Failed(_, e)) => panic!("the domain failed: {e}"),
        Err(DomainStartProgress::Starting(_)) => panic!("the domain did not start in time"),
    }
}

fn wait_failed(domain: Domain<Idle>, engine: &mut ProgressEngine) -> DomainStartError {
    let starting = match domain.start(engine) {
        Ok(starting) => starting,
        Err((_, e)) => return e,
    };
    match starting.wait_running(engine, TIMEOUT) {
        Ok(_) => panic!("the domain started"),
        Err(DomainStartProgress::Failed(_, e)) => e,
        Err(DomainStartProgress::Starting(_)) => panic!("the domain start hung"),
    }
}

thread_local! {
    static ANSWERS: RefCell<Vec<(Status, Vec<u8>)>> = const { RefCell::new(Vec::new()) };
}

fn collect(task: &CompletedTask<'_>) {
    ANSWERS.with(|a| a.borrow_mut().push((task.status, task.response.to_vec())));
}

/// Sends `payload` to `plugin` on `worker` and waits for the answer.
fn ask(
    engine: &mut ProgressEngine,
    worker: &Worker<Running>,
    plugin: u64,
    payload: &[u8],
) -> (Status, Vec<u8>) {
    worker
        .submit(plugin, |task| {
            task.payload_mut()[..payload.len()].copy_from_slice(payload);
            task.set_callback(collect);
            payload.len()
        })
        .unwrap();
    let deadline = Instant::now() + TIMEOUT;
    loop {
        engine.progress();
        if let Some(answer) = ANSWERS.with(|a| a.borrow_mut().pop()) {
            return answer;
        }
        assert!(Instant::now() < deadline, "no answer from the plugin");
    }
}

/// What the C plugin's 24-byte lookup command reports.
#[derive(Debug, PartialEq, Eq)]
struct Detail {
    statuses: [Status; 4],
    seg: i32,
    memh: Vec<u8>,
    mkey: Vec<u8>,
    addr: String,
}

fn detail(
    engine: &mut ProgressEngine,
    worker: &Worker<Running>,
    plugin: u64,
    id: u64,
    va: u64,
    seg: i32,
) -> Detail {
    let mut command = Vec::new();
    command.extend_from_slice(&id.to_le_bytes());
    command.extend_from_slice(&va.to_le_bytes());
    command.extend_from_slice(&seg.to_le_bytes());
    command.extend_from_slice(&[0; 4]);
    let (status, report) = ask(engine, worker, plugin, &command);
    assert_eq!(status, Status::Success);
    assert_eq!(report.len(), 160);
    let u32_at = |at: usize| u32::from_le_bytes(report[at..at + 4].try_into().unwrap());
    let memh_len = u32_at(20) as usize;
    let mkey_len = u32_at(24) as usize;
    let addr_len = u32_at(28) as usize;
    Detail {
        statuses: std::array::from_fn(|i| Status::from_raw(u32_at(i * 4) as i32)),
        seg: u32_at(16) as i32,
        addr: String::from_utf8(report[32..32 + addr_len].to_vec()).unwrap(),
        memh: report[96..96 + memh_len.min(32)].to_vec(),
        mkey: report[128..128 + mkey_len.min(32)].to_vec(),
    }
}

/// What the faulty plugin's `domain:` command reports (through the Rust SDK).
fn sdk(
    engine: &mut ProgressEngine,
    worker: &Worker<Running>,
    plugin: u64,
    id: u64,
    va: u64,
    seg: i32,
) -> String {
    let mut command = b"domain:".to_vec();
    command.extend_from_slice(&id.to_le_bytes());
    command.extend_from_slice(&va.to_le_bytes());
    command.extend_from_slice(&seg.to_le_bytes());
    let (status, text) = ask(engine, worker, plugin, &command);
    assert_eq!(status, Status::Success);
    String::from_utf8(text).unwrap()
}

/// What one rank saw.
struct Seen {
    rank: u32,
    /// Its worker's process id.
    pid: i32,
    /// For each domain id asked about: what the C plugin and the Rust plugin found.
    lookups: Vec<(u64, Detail, Detail, String)>,
}

/// The domain id of rank `rank`'s worker.
fn id_of(rank: u32) -> u64 {
    100 + u64::from(rank)
}

/// Runs `ranks` ranks, each a thread with its own service, engine and worker, through a domain
/// start, lookups of every member from both plugins, a stop and a second start.
fn ranks_find_each_other(ranks: u32) {
    let (_plugins, daemon) = daemon();
    let dir = TempDir::new("urom-domain");
    let address = rendezvous(&dir);
    let seen: Vec<Seen> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..ranks)
            .map(|rank| {
                let (daemon, address) = (&daemon, &address);
                scope.spawn(move || {
                    let service = service(&daemon.socket);
                    let lookups = service.plugin(LOOKUPS).unwrap().id;
                    let faulty = service.plugin(FAULTY).unwrap().id;
                    let mut engine = ProgressEngine::new();
                    let worker = run_worker(
                        &mut engine,
                        Worker::new()
                            .set_service(&service)
                            .set_plugins(lookups | faulty),
                    );
                    let pid = daemon.worker_pid(worker.id()).expect("the worker runs");
                    let oob = join(address, ranks, rank);
                    let running =
                        wait_running(domain(oob, id_of(rank), &worker, rank), &mut engine);
                    assert_eq!((running.ranks(), running.rank()), (ranks, rank));
                    let mut members: Vec<_> = running
                        .table()
                        .members()
                        .map(|m| (m.domain_id, m.rank))
                        .collect();
                    members.sort();
                    assert_eq!(
                        members,
                        (0..ranks).map(|r| (id_of(r), r)).collect::<Vec<_>>()
                    );
                    let mut lookups_seen = Vec::new();
                    for other in (0..ranks).map(id_of).chain([999]) {
                        let other_rank = other.saturating_sub(100) as u32;
                        let [seg0, seg1] = buffers(other_rank);
                        // Segment 1 holds va, has no memory handle; then segment 0 by number.
                        let first = detail(&mut engine, &worker, lookups, other, seg1.0 + 16, 1);
                        let second = detail(&mut engine, &worker, lookups, other, seg0.0 - 1, 0);
                        let text = sdk(&mut engine, &worker, faulty, other, seg1.0 + 16, 1);
                        lookups_seen.push((other, first, second, text));
                    }
                    // A stop and a second start on the same workers and collective.
                    let idle = running.stop();
                    let running = wait_running(idle, &mut engine);
                    assert_eq!(running.ranks(), ranks);
                    drop(running);
                    worker.stop().map_err(|(_, e)| e).unwrap();
                    Seen {
                        rank,
                        pid,
                        lookups: lookups_seen,
                    }
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let pids: Vec<i32> = seen.iter().map(|s| s.pid).collect();
    for rank_seen in &seen {
        for (id, first, second, text) in &rank_seen.lookups {
            let context = format!("rank {} about {id}", rank_seen.rank);
            if *id == 999 {
                assert_eq!(first.statuses, [Status::NotFound; 4], "{context}");
                assert_eq!((first.seg, first.addr.as_str()), (-1, ""), "{context}");
                assert_eq!(
                    text,
                    "addr=!DOCA_ERROR_NOT_FOUND;seg=!DOCA_ERROR_NOT_FOUND;\
                     memh=!DOCA_ERROR_NOT_FOUND;mkey=!DOCA_ERROR_NOT_FOUND",
                    "{context}"
                );
                continue;
            }
            let other = (*id - 100) as usize;
            let pid = pids[other];
            assert_eq!(
                *first,
                Detail {
                    statuses: [
                        Status::Success,
                        Status::Success,
                        Status::NotSupported,
                        Status::Success
                    ],
                    seg: 1,
                    memh: Vec::new(),
                    mkey: format!("mkey-{other}-1").into_bytes(),
                    addr: format!("domain-lookups@{pid}"),
                },
                "{context}"
            );
            assert_eq!(
                *second,
                Detail {
                    statuses: [
                        Status::Success,
                        Status::NotFound,
                        Status::Success,
                        Status::Success
                    ],
                    seg: -1,
                    memh: format!("memh-{other}-0").into_bytes(),
                    mkey: format!("mkey-{other}-0").into_bytes(),
                    addr: format!("domain-lookups@{pid}"),
                },
                "{context}"
            );
            assert_eq!(
                *text,
                format!(
                    "addr=faulty-address@{pid};seg=1;memh=!DOCA_ERROR_NOT_SUPPORTED;\
                     mkey=mkey-{other}-1"
                ),
                "{context}"
            );
        }
    }
}

#[test]
fn two_ranks_find_each_other() {
    ranks_find_each_other(2);
}

#[test]
fn four_ranks_find_each_other() {
    ranks_find_each_other(4);
}

#[test]
fn a_worker_that_no_longer_runs_cannot_join_a_domain() {
    let (_plugins, daemon) = daemon();
    let service = service(&daemon.socket);
    let lookups = service.plugin(LOOKUPS).unwrap().id;
    let mut engine = ProgressEngine::new();
    let worker = run_worker(
        &mut engine,
        Worker::new().set_service(&service).set_plugins(lookups),
    );
    let pid = daemon.worker_pid(worker.id()).unwrap();
    let idle = Domain::new()
        .set_oob(join(&RendezvousAddr::Tcp("127.0.0.1:1".into()), 1, 0))
        .set_workers(&[7], &[&worker])
        .map_err(|(_, e)| e)
        .unwrap();
    signal(pid, Signal::SIGKILL);
    let deadline = Instant::now() + TIMEOUT;
    while worker.state() == WorkerState::Running {
        engine.progress();
        assert!(Instant::now() < deadline, "the worker's death went unseen");
    }
    let (_, error) = idle.start(&mut engine).expect_err("a dead worker");
    assert!(
        matches!(
            error,
            DomainStartError::WorkerNotRunning {
                domain_id: 7,
                rank: 0,
                ..
            }
        ),
        "{error}"
    );
    assert_eq!(error.status(), Status::BadState);
    assert!(
        error
            .to_string()
            .starts_with("rank 0: the worker of domain id 7 does not run"),
        "{error}"
    );
}

#[test]
fn a_worker_that_dies_during_the_start_fails_every_rank_naming_its_rank() {
    let (_plugins, daemon) = daemon();
    let dir = TempDir::new("urom-domain");
    let address = rendezvous(&dir);
    let (dead_tx, dead_rx) = mpsc::channel::<()>();
    let errors: Vec<DomainStartError> = std::thread::scope(|scope| {
        let (daemon, address) = (&daemon, &address);
        let victim = scope.spawn(move || {
            let service = service(&daemon.socket);
            let lookups = service.plugin(LOOKUPS).unwrap().id;
            let mut engine = ProgressEngine::new();
            let worker = run_worker(
                &mut engine,
                Worker::new().set_service(&service).set_plugins(lookups),
            );
            let pid = daemon.worker_pid(worker.id()).unwrap();
            let idle = domain(join(address, 2, 1), id_of(1), &worker, 1);
            let starting = idle.start(&mut engine).map_err(|(_, e)| e).unwrap();
            signal(pid, Signal::SIGKILL);
            let deadline = Instant::now() + TIMEOUT;
            while worker.state() == WorkerState::Running {
                engine.progress();
                assert!(Instant::now() < deadline, "the worker's death went unseen");
            }
            dead_tx.send(()).unwrap();
            match starting.wait_running(&mut engine, TIMEOUT) {
                Err(DomainStartProgress::Failed(_, e)) => e,
                other => panic!("the start did not fail: {other:?}"),
            }
        });
        let survivor = scope.spawn(move || {
            let service = service(&daemon.socket);
            let lookups = service.plugin(LOOKUPS).unwrap().id;
            let mut engine = ProgressEngine::new();
            let worker = run_worker(
                &mut engine,
                Worker::new().set_service(&service).set_plugins(lookups),
            );
            let oob = join(address, 2, 0);
            dead_rx.recv().unwrap();
            wait_failed(domain(oob, id_of(0), &worker, 0), &mut engine)
        });
        vec![survivor.join().unwrap(), victim.join().unwrap()]
    });
    let [survivor, victim] = &errors[..] else {
        unreachable!()
    };
    assert!(
        matches!(
            survivor,
            DomainStartError::PeerFailed {
                rank: 1,
                status: Status::NotConnected
            }
        ),
        "{survivor}"
    );
    assert_eq!(
        survivor.to_string(),
        "rank 1 could not take part in the domain start: DOCA_ERROR_NOT_CONNECTED (14)"
    );
    assert!(
        matches!(
            victim,
            DomainStartError::WorkerFailed {
                domain_id: 101,
                rank: 1,
                ..
            }
        ),
        "{victim}"
    );
    assert!(
        victim
            .to_string()
            .starts_with("rank 1: the worker of domain id 101 failed during the domain start"),
        "{victim}"
    );
}

#[test]
fn a_domain_id_claimed_by_two_ranks_fails_both() {
    let (_plugins, daemon) = daemon();
    let dir = TempDir::new("urom-domain");
    let address = rendezvous(&dir);
    let errors: Vec<DomainStartError> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..2)
            .map(|rank| {
                let (daemon, address) = (&daemon, &address);
                scope.spawn(move || {
                    let service = service(&daemon.socket);
                    let lookups = service.plugin(LOOKUPS).unwrap().id;
                    let mut engine = ProgressEngine::new();
                    let worker = run_worker(
                        &mut engine,
                        Worker::new().set_service(&service).set_plugins(lookups),
                    );
                    let oob = join(address, 2, rank);
                    wait_failed(domain(oob, 5, &worker, rank), &mut engine)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for error in errors {
        assert_eq!(error.rank(), Some(1), "{error}");
        assert_eq!(
            error.to_string(),
            "domain id 5 is claimed by ranks 0 and 1; each worker of a domain needs an id of its own"
        );
    }
}

/// Starts rank `rank` of `ranks` as a process that kills itself as it starts allgather `die_at`.
fn dying_rank(
    daemon: &Daemon,
    address: &RendezvousAddr,
    ranks: u32,
    rank: u32,
    die_at: u32,
) -> ChildGuard {
    let program: PathBuf = binary("urom-testkit", "urom-domain-rank");
    let child = Command::new(program)
        .arg(&daemon.socket)
        .arg(address.to_string())
        .arg(ranks.to_string())
        .arg(rank.to_string())
        .arg(LOOKUPS)
        .arg("--die-in-allgather")
        .arg(die_at.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting urom-domain-rank");
    ChildGuard(child)
}

/// Three ranks, `victim` a process that dies as it starts allgather `die_at`; the others are
/// threads here, whose starts must fail naming the victim.
fn a_rank_killed_during_the_start(victim: u32, die_at: u32) {
    let (_plugins, daemon) = daemon();
    let dir = TempDir::new("urom-domain");
    let address = rendezvous(&dir);
    let mut child = dying_rank(&daemon, &address, 3, victim, die_at);
    let errors: Vec<DomainStartError> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..3)
            .filter(|&rank| rank != victim)
            .map(|rank| {
                let (daemon, address) = (&daemon, &address);
                scope.spawn(move || {
                    let service = service(&daemon.socket);
                    let lookups = service.plugin(LOOKUPS).unwrap().id;
                    let mut engine = ProgressEngine::new();
                    let worker = run_worker(
                        &mut engine,
                        Worker::new().set_service(&service).set_plugins(lookups),
                    );
                    let oob = join(address, 3, rank);
                    wait_failed(domain(oob, id_of(rank), &worker, rank), &mut engine)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let status = child.wait_timeout(TIMEOUT).expect("the rank process ended");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(9), "it killed itself: {status}");
    for error in errors {
        assert!(matches!(error, DomainStartError::Oob(_)), "{error}");
        assert_eq!(error.rank(), Some(victim), "{error}");
        assert!(
            error
                .to_string()
                .starts_with(&format!("the out-of-band exchange failed: rank {victim}: ")),
            "{error}"
        );
    }
}

#[test]
fn a_rank_killed_during_the_start_is_named_by_the_others() {
    // Rank 2 dies as the records are gathered, rank 0 as the acknowledgements are.
    a_rank_killed_during_the_start(2, 1);
    a_rank_killed_during_the_start(0, 2);
}

/// The directory on `PATH` holding `program`.
#[cfg(feature = "mpi")]
fn on_path(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|path| path.is_file())
}

/// Two ranks started by `mpirun`, each with its own worker, meet through the MPI collective.
#[cfg(feature = "mpi")]
#[test]
fn two_ranks_started_by_mpirun_meet_through_mpi() {
    use std::io::Read;

    let Some(mpirun) = on_path("mpirun") else {
        urom_testkit::skip("no mpirun on PATH (apt-get install openmpi-bin)");
        return;
    };
    let (_plugins, daemon) = daemon();
    let program = binary("urom-testkit", "urom-domain-rank");
    let mut child = ChildGuard(
        Command::new(mpirun)
            .args(["--allow-run-as-root", "--oversubscribe"])
            // MPI itself over shared memory, not over UCX.
            .args(["--mca", "pml", "ob1", "--mca", "btl", "self,vader"])
            .args(["-np", "2"])
            .arg(program)
            .args(["--oob", "mpi"])
            .arg(&daemon.socket)
            .arg(LOOKUPS)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting mpirun"),
    );
    let readers = [
        child
            .0
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
        child
            .0
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    ]
    .map(|stream| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut stream) = stream {
                let _ = stream.read_to_string(&mut text);
            }
            text
        })
    });
    let status = child.wait_timeout(TIMEOUT);
    // A start that hangs is killed here, so that its output can be shown.
    drop(child);
    let [stdout, stderr] = readers.map(|reader| reader.join().unwrap());
    let status = status
        .unwrap_or_else(|| panic!("mpirun did not end\nstdout:\n{stdout}\nstderr:\n{stderr}"));
    assert!(
        status.success(),
        "mpirun: {status}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        ["running 2", "running 2"],
        "each rank's domain runs with both ranks\nstderr:\n{stderr}"
    );
}
