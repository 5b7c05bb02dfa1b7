//! The ping-pong sample and the sandbox plugin against real daemons and workers over UCX (TCP
//! on the loopback device): 2 and 4 ranks as processes on one machine, two ranks on two
//! "machines" (network namespaces, each with its own daemon), sends and receives through
//! the hosts' memory, and the plugin's message timestamps (`UROM_SANDBOX_TIMESTAMPS`).
#![cfg(feature = "ucx")]

use std::cell::RefCell;
use std::io::Read as _;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use urom_host::oob::{RendezvousAddr, SocketOob};
use urom_host::{
    CompletedTask, Domain, DomainStartProgress, HostMemory, Idle, ProgressEngine, Running, Service,
    Worker,
};
use urom_sandbox::{
    self as sandbox, MemMapParams, Received, RecvInto, SandboxHost, SendFrom, tag_recv_result,
    tag_send_result,
};
use urom_testkit::daemon::{Daemon, plugin_dir, start_daemon_command};
use urom_testkit::host::{run_worker, try_run_worker};
use urom_testkit::netns::Network;
use urom_testkit::{ChildGuard, TempDir, binary};
use urom_wire::Status;

/// How long anything may take before the test fails (never a measure of speed).
const TIMEOUT: Duration = Duration::from_secs(60);

/// The UCX settings of every process here: TCP (peer error handling and wake-up need it).
const UCX_ENV: [(&str, &str); 2] = [("UCX_TLS", "tcp,self"), ("UCX_WARN_UNUSED_ENV_VARS", "n")];

/// A daemon offering the sandbox plugin, started by `command` (so that it can run in a network
/// namespace) with UCX on `device`.
fn sandbox_daemon(mut command: Command, device: &str) -> (TempDir, Daemon) {
    let plugins = TempDir::new("urom-sandbox-plugins");
    let dir = plugin_dir(&plugins, &[("urom-plugin-sandbox", "worker_sandbox")]);
    command.envs(UCX_ENV).env("UCX_NET_DEVICES", device);
    let daemon = start_daemon_command(command, dir.to_str().unwrap(), &[], true);
    (plugins, daemon)
}

fn local_daemon() -> (TempDir, Daemon) {
    sandbox_daemon(Command::new(binary("urom-daemon", "urom-daemon")), "lo")
}

/// Waits for `child` (its output piped) at most `TIMEOUT * 2`, reading its output meanwhile;
/// killed when it takes longer. Its status (`None`: killed), standard output and error.
fn finish(mut child: ChildGuard) -> (Option<std::process::ExitStatus>, String, String) {
    let read = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_string(&mut text);
            }
            text
        })
    };
    let stdout = read(child.0.stdout.take().map(|p| Box::new(p) as _));
    let stderr = read(child.0.stderr.take().map(|p| Box::new(p) as _));
    let status = child.wait_timeout(TIMEOUT * 2);
    // Killed (if still running) and reaped here, which closes the pipes.
    drop(child);
    (status, stdout.join().unwrap(), stderr.join().unwrap())
}

fn ping_pong(daemon: &Daemon, extra: &[&str]) -> (String, String, bool) {
    let mut command = Command::new(binary("urom-samples", "urom-ping-pong"));
    command
        .envs(UCX_ENV)
        .arg("--socket")
        .arg(&daemon.socket)
        .args(["--timeout", "30"])
        .args(extra);
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting urom-ping-pong");
    let (status, stdout, stderr) = finish(ChildGuard(child));
    (stdout, stderr, status.is_some_and(|s| s.success()))
}

fn count(haystack: &str, line: &str) -> usize {
    haystack.lines().filter(|l| *l == line).count()
}

/// Checks that the ranks' output says rank 0 received `message` once and that `clients` ranks
/// got it back.
fn assert_ping_pong(stdout: &str, message: &str, clients: usize) {
    assert_eq!(
        count(stdout, &format!("Server completed PING recv: {message}")),
        1,
        "{stdout}"
    );
    assert_eq!(
        count(stdout, &format!("Client received PONG recv: {message}")),
        clients,
        "{stdout}"
    );
}

#[test]
fn two_and_four_ranks_ping_pong_through_their_workers() {
    let (_plugins, daemon) = local_daemon();

    let (stdout, stderr, ok) = ping_pong(&daemon, &[]);
    assert!(ok, "{stdout}\n{stderr}\n{}", daemon.log());
    assert_ping_pong(&stdout, "hello world", 1);

    let message = "round the ring of four";
    let (stdout, stderr, ok) = ping_pong(&daemon, &["--ranks", "4", "-m", message]);
    assert!(ok, "{stdout}\n{stderr}\n{}", daemon.log());
    assert_ping_pong(&stdout, message, 3);

    // A message of 100 characters is refused before anything starts.
    let long = "x".repeat(100);
    let (stdout, stderr, ok) = ping_pong(&daemon, &["--message", &long]);
    assert!(!ok, "{stdout}");
    assert!(stderr.contains("at most 99"), "{stderr}");
    // Without MPI built in, `--oob mpi` says what is missing; with it, a rank started without
    // `mpirun` is a world of one, too few for a ping-pong.
    let (_, stderr, ok) = ping_pong(&daemon, &["--oob", "mpi"]);
    assert!(!ok);
    if cfg!(feature = "mpi") {
        assert!(
            stderr.contains("needs at least 2 ranks; MPI started 1"),
            "{stderr}"
        );
    } else {
        assert!(stderr.contains("no MPI collective"), "{stderr}");
    }
}

/// The directory entry of `program` on `PATH`.
#[cfg(feature = "mpi")]
fn on_path(program: &str) -> Option<std::path::PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|path| path.is_file())
}

/// `mpirun` run as root, MPI itself over shared memory rather than UCX, its output piped; the
/// ranks' arguments follow.
#[cfg(feature = "mpi")]
fn mpirun_command(mpirun: &std::path::Path) -> Command {
    let mut command = Command::new(mpirun);
    command
        .envs(UCX_ENV)
        .args(["--allow-run-as-root", "--oversubscribe"])
        .args(["--mca", "pml", "ob1", "--mca", "btl", "self,vader"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// Two ranks started by `mpirun`, rank and size from MPI, meet through the MPI collective and
/// ping-pong as DOCA's sample does.
#[cfg(feature = "mpi")]
#[test]
fn two_ranks_started_by_mpirun_ping_pong_through_mpi() {
    let Some(mpirun) = on_path("mpirun") else {
        urom_testkit::skip("no mpirun on PATH (apt-get install openmpi-bin)");
        return;
    };
    let (_plugins, daemon) = local_daemon();
    let program = binary("urom-samples", "urom-ping-pong");
    let message = "ranks of mpirun";
    let mut command = mpirun_command(&mpirun);
    command
        .args(["-np", "2"])
        .arg(&program)
        .args(["--oob", "mpi", "--timeout", "30", "-m", message])
        .arg("--socket")
        .arg(&daemon.socket);
    let (status, stdout, stderr) = finish(ChildGuard(command.spawn().expect("starting mpirun")));
    assert!(
        status.is_some_and(|s| s.success()),
        "mpirun failed or hung ({status:?})\nstdout:\n{stdout}\nstderr:\n{stderr}\n{}",
        daemon.log()
    );
    assert_ping_pong(&stdout, message, 1);

    // A rank that fails ends the job through MPI_Abort: rank 0 is given a socket where no
    // daemon listens, and rank 1, which would wait for it in the domain start, is ended too.
    let dir = TempDir::new("urom-ping-pong-mpi");
    let mut command = mpirun_command(&mpirun);
    command
        .args(["-np", "1"])
        .arg(&program)
        .args(["--oob", "mpi", "--timeout", "30", "--socket"])
        .arg(dir.path().join("nobody.sock"))
        .args([":", "-np", "1"])
        .arg(&program)
        .args(["--oob", "mpi", "--timeout", "30", "--socket"])
        .arg(&daemon.socket);
    let (status, stdout, stderr) = finish(ChildGuard(command.spawn().expect("starting mpirun")));
    assert!(
        status.is_some_and(|s| !s.success()),
        "mpirun of a failing rank: {status:?}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    // Open MPI 4.1 sometimes loses its own "MPI_ABORT was invoked" notice (a show_help
    // error instead), so the proof is that rank 1 did not fail by itself: without the abort it
    // would wait for rank 0 until its timeout and say so.
    assert!(
        stderr.contains("rank 0: the UROM service did not start"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("rank 1"),
        "rank 1 failed on its own: {stderr}"
    );
}

#[test]
fn two_ranks_on_two_machines_each_with_its_own_daemon() {
    let network = match Network::create("pingpong", 2) {
        Ok(network) => network,
        Err(why) => {
            urom_testkit::skip(&why);
            return;
        }
    };
    let program = binary("urom-samples", "urom-ping-pong");
    let daemon_bin = binary("urom-daemon", "urom-daemon");
    let daemons: Vec<(TempDir, Daemon)> = (0..2)
        .map(|i| sandbox_daemon(network.command(i, &daemon_bin), &network.device(i, 1 - i)))
        .collect();
    let hub = network.hub_address(1);
    let port = network.run_in(0, || {
        std::net::TcpListener::bind((hub, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    });
    let rendezvous = format!("{hub}:{port}");
    let ranks: Vec<ChildGuard> = (0..2)
        .map(|rank| {
            let mut command = network.command(rank, &program);
            command
                .envs(UCX_ENV)
                .env("UCX_NET_DEVICES", network.device(rank, 1 - rank))
                .arg("--socket")
                .arg(&daemons[rank].1.socket)
                .args(["--ranks", "2", "--rank", &rank.to_string()])
                .args(["--rendezvous", &rendezvous, "--timeout", "30"])
                .args(["-m", "across machines"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            ChildGuard(command.spawn().expect("starting a rank"))
        })
        .collect();
    let mut outputs = Vec::new();
    for rank in ranks {
        let (status, stdout, stderr) = finish(rank);
        let text = format!("{stdout}{stderr}");
        assert!(
            status.is_some_and(|s| s.success()),
            "a rank failed or hung ({status:?}): {text}\n{}\n{}",
            daemons[0].1.log(),
            daemons[1].1.log()
        );
        outputs.push(text);
    }
    assert!(
        outputs[0].contains("Server completed PING recv: across machines"),
        "{}",
        outputs[0]
    );
    assert!(
        outputs[1].contains("Client received PONG recv: across machines"),
        "{}",
        outputs[1]
    );
    // The daemons and their workers go before the namespaces.
    drop(daemons);
    drop(network);
}

/// What a rank's callbacks recorded: (cookie, outcome).
type Record = (u64, Result<Recorded, Status>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Recorded {
    Sent(i32),
    Inline(Vec<u8>, u64),
    Memory(u64, u64),
    Other,
}

std::thread_local! {
    static RECORDS: RefCell<Vec<Record>> = const { RefCell::new(Vec::new()) };
}

fn cookie_of(task: &CompletedTask<'_>) -> u64 {
    u64::from_le_bytes(task.user_data[..8].try_into().unwrap())
}

fn on_send(task: &CompletedTask<'_>) {
    let outcome = tag_send_result(task).map(|r| Recorded::Sent(r.ucs_status));
    RECORDS.with(|r| r.borrow_mut().push((cookie_of(task), outcome)));
}

fn on_recv(task: &CompletedTask<'_>) {
    let outcome = tag_recv_result(task).map(|r| match r.data {
        Received::Inline(bytes) => Recorded::Inline(bytes.to_vec(), r.sender_tag),
        Received::Memory { len } => Recorded::Memory(len, r.sender_tag),
    });
    RECORDS.with(|r| r.borrow_mut().push((cookie_of(task), outcome)));
}

fn on_other(task: &CompletedTask<'_>) {
    let outcome = task.status.into_result().map(|()| Recorded::Other);
    RECORDS.with(|r| r.borrow_mut().push((cookie_of(task), outcome)));
}

/// Progresses until the task `cookie` completed; its outcome.
fn wait(engine: &mut ProgressEngine, cookie: u64) -> Result<Recorded, Status> {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        engine.progress();
        let found = RECORDS.with(|r| {
            let mut r = r.borrow_mut();
            let at = r.iter().position(|(c, _)| *c == cookie)?;
            Some(r.swap_remove(at).1)
        });
        if let Some(found) = found {
            return found;
        }
        assert!(Instant::now() < deadline, "task {cookie} did not complete");
    }
}

/// A rank with a worker running the sandbox plugin, in a domain whose one buffer is `memory`'s
/// `len` bytes.
struct Rank {
    engine: ProgressEngine,
    worker: Worker<Running>,
    sandbox: SandboxHost,
    _service: Service<Running>,
}

fn rank_in_domain(
    socket: &std::path::Path,
    rendezvous: &RendezvousAddr,
    rank: u32,
    buffer_len: usize,
) -> (
    Rank,
    HostMemory,
    urom_transport::ucx::MappedMemory,
    Domain<Running>,
) {
    let (service, sandbox) = sandbox_service(socket);
    let mut engine = ProgressEngine::new();
    let worker = run_worker(
        &mut engine,
        Worker::new()
            .set_service(&service)
            .set_id(100 + u64::from(rank))
            .set_plugins(sandbox.id()),
    );
    let memory = HostMemory::new(&mut engine).expect("a host memory worker");
    let buffer = memory.map(buffer_len).expect("mapped memory");
    let oob = SocketOob::join(rendezvous, 2, rank, TIMEOUT).unwrap();
    let domain = Domain::new()
        .set_oob(oob)
        .set_host_memory_address(memory.address())
        .set_workers(&[u64::from(rank)], &[&worker])
        .unwrap()
        .set_buffers_count(1)
        .unwrap()
        .add_buffer(
            buffer.va(),
            buffer.len() as u64,
            buffer.exported_memh(),
            buffer.rkey(),
        )
        .unwrap()
        .start(&mut engine)
        .unwrap();
    let domain = match domain.wait_running(&mut engine, TIMEOUT) {
        Ok(domain) => domain,
        Err(DomainStartProgress::Failed(_, e)) => panic!("rank {rank}: {e}"),
        Err(DomainStartProgress::Starting(_)) => panic!("rank {rank}: the domain did not start"),
    };
    let rank = Rank {
        engine,
        worker,
        sandbox,
        _service: service,
    };
    (rank, memory, buffer, domain)
}

#[test]
fn bytes_only_the_senders_memory_held_reach_the_receiver() {
    urom_transport::ucx::set_config_defaults(&[("TLS", "tcp,self"), ("NET_DEVICES", "lo")]);
    let (_plugins, daemon) = local_daemon();
    let dir = TempDir::new("urom-sandbox-memory");
    let rendezvous = RendezvousAddr::Unix(dir.path().join("rendezvous.sock"));
    // Bytes made up here, written only into rank 0's mapped memory.
    let secret: Vec<u8> = (0..300u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 ^ std::process::id() as u8)
        .collect();
    let (done_tx, done_rx) = mpsc::channel::<Vec<u8>>();
    let socket = daemon.socket.clone();
    let rdv = rendezvous.clone();
    let secret_in = secret.clone();
    let sender = std::thread::spawn(move || {
        let (mut me, _memory, mut buffer, domain) = rank_in_domain(&socket, &rdv, 0, 4096);
        buffer.write(1000, &secret_in).unwrap();
        // The buffer's exported memory handle where UCX can export one (UCX >= 1.15 with
        // mlx5); elsewhere it has none and the lookup says so.
        let exported = urom_transport::ucx::exported_memh_supported();
        assert_eq!(
            domain.table().memory_handle(0, 0),
            if exported {
                Ok(buffer.exported_memh())
            } else {
                Err(Status::NotSupported)
            }
        );
        let va = buffer.va() + 1000;
        // The whole secret to rank 1's memory, then its first 40 bytes inline.
        for (cookie, len) in [(1, secret_in.len() as u64), (2, 40)] {
            let from = SendFrom::Memory { va, len };
            me.sandbox
                .tag_send(&me.worker, cookie, 7, 1, from, 0x40 + cookie, on_send)
                .unwrap();
            assert_eq!(wait(&mut me.engine, cookie), Ok(Recorded::Sent(0)));
        }
        // A range past the buffer's end is refused, as is memory nobody added.
        let past = SendFrom::Memory {
            va: buffer.va() + 4000,
            len: 200,
        };
        me.sandbox
            .tag_send(&me.worker, 3, 7, 1, past, 0x43, on_send)
            .unwrap();
        assert_eq!(wait(&mut me.engine, 3), Err(Status::InvalidValue));
        let nowhere = SendFrom::Memory { va: 0x10, len: 1 };
        me.sandbox
            .tag_send(&me.worker, 4, 7, 1, nowhere, 0x44, on_send)
            .unwrap();
        assert_eq!(wait(&mut me.engine, 4), Err(Status::NotFound));
        // MEM_MAP of the buffer's exported handle: mapped where UCX can import one; elsewhere
        // (every machine without mlx5) NOT_SUPPORTED at once, and the worker goes on.
        let params = MemMapParams {
            field_mask: 0b11 | sandbox::MEM_MAP_FIELD_EXPORTED_MEMH_BUFFER,
            address: buffer.va(),
            length: buffer.len() as u64,
            ..MemMapParams::default()
        };
        let memh = if exported {
            buffer.exported_memh()
        } else {
            b"memh"
        };
        me.sandbox
            .mem_map(&me.worker, 5, 7, params, memh, on_other)
            .unwrap();
        assert_eq!(
            wait(&mut me.engine, 5),
            if exported {
                Ok(Recorded::Other)
            } else {
                Err(Status::NotSupported)
            }
        );
        // A command of the wrong length.
        me.worker
            .submit(me.sandbox.id(), |task| {
                task.user_data_mut()[..8].copy_from_slice(&6u64.to_le_bytes());
                task.set_callback(on_other);
                task.payload_mut()[..10].fill(1);
                10
            })
            .unwrap();
        assert_eq!(wait(&mut me.engine, 6), Err(Status::InvalidValue));
        // A destination that is no member.
        me.sandbox
            .tag_send(&me.worker, 7, 7, 99, SendFrom::Inline(b"x"), 1, on_send)
            .unwrap();
        assert_eq!(wait(&mut me.engine, 7), Err(Status::NotFound));
        // Keep the memory worker progressing until the receiver is done with it.
        let deadline = Instant::now() + TIMEOUT;
        loop {
            me.engine.progress();
            if let Ok(received) = done_rx.try_recv() {
                return received;
            }
            assert!(Instant::now() < deadline, "the receiver did not finish");
        }
    });
    let (mut me, _memory, buffer, _domain) = rank_in_domain(&daemon.socket, &rendezvous, 1, 4096);
    let into = RecvInto::Memory {
        va: buffer.va() + 8,
        len: 512,
    };
    me.sandbox
        .tag_recv(&me.worker, 11, 9, into, 0x41, 0xffff, on_recv)
        .unwrap();
    assert_eq!(wait(&mut me.engine, 11), Ok(Recorded::Memory(300, 0x41)));
    let mut landed = vec![0u8; 300];
    buffer.read(8, &mut landed).unwrap();
    assert_eq!(landed, secret, "the bytes in the receiver's memory");
    me.sandbox
        .tag_recv(
            &me.worker,
            12,
            9,
            RecvInto::Inline { capacity: 100 },
            0x42,
            0xffff,
            on_recv,
        )
        .unwrap();
    assert_eq!(
        wait(&mut me.engine, 12),
        Ok(Recorded::Inline(secret[..40].to_vec(), 0x42))
    );
    done_tx.send(landed).unwrap();
    assert_eq!(sender.join().expect("the sending rank"), secret);
}

/// Round trips whose notifications the callbacks below count.
static PINGS_IN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static PONGS_IN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn on_ping_in(task: &CompletedTask<'_>) {
    assert_eq!(tag_recv_result(task).map(|r| r.ucs_status), Ok(0));
    PINGS_IN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

fn on_pong_in(task: &CompletedTask<'_>) {
    assert_eq!(tag_recv_result(task).map(|r| r.ucs_status), Ok(0));
    PONGS_IN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

fn on_sent_ok(task: &CompletedTask<'_>) {
    assert_eq!(tag_send_result(task).map(|r| r.ucs_status), Ok(0));
}

#[test]
fn workers_write_timestamps_that_pair_sends_with_receives() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use urom_sandbox::timestamps;

    const TRIPS: usize = 40;
    const PING: u64 = 0x1234;
    const PONG: u64 = 0x5678;
    let (_plugins, daemon) = local_daemon();
    let dir = TempDir::new("urom-sandbox-timestamps");
    let (service, host) = sandbox_service(&daemon.socket);
    let mut engine = ProgressEngine::new();
    let stamp_dirs: Vec<_> = (0..2)
        .map(|i| {
            let stamps = dir.path().join(format!("worker-{i}"));
            std::fs::create_dir(&stamps).unwrap();
            stamps
        })
        .collect();
    let workers: Vec<Worker<Running>> = (0..2)
        .map(|i| {
            let env = format!("{}={}", timestamps::ENV, stamp_dirs[i].display());
            run_worker(
                &mut engine,
                Worker::new()
                    .set_service(&service)
                    .set_plugins(host.id())
                    .set_env([env]),
            )
        })
        .collect();
    let domain = urom_testkit::domain::start_one_rank(
        &mut engine,
        dir.path(),
        &[&workers[0], &workers[1]],
        TIMEOUT,
    );
    let wait = |engine: &mut ProgressEngine, counter: &AtomicUsize, want: usize| {
        let deadline = Instant::now() + TIMEOUT;
        while counter.load(Ordering::Relaxed) < want {
            engine.progress();
            assert!(Instant::now() < deadline, "a message did not arrive");
        }
    };
    let recv = RecvInto::Inline { capacity: 64 };
    let (a, b) = (&workers[0], &workers[1]);
    for i in 0..TRIPS {
        host.tag_recv(b, 0, 0, recv, PING, u64::MAX, on_ping_in)
            .unwrap();
        host.tag_recv(a, 0, 0, recv, PONG, u64::MAX, on_pong_in)
            .unwrap();
        host.tag_send(a, 0, 0, 1, SendFrom::Inline(b"ping"), PING, on_sent_ok)
            .unwrap();
        wait(&mut engine, &PINGS_IN, i + 1);
        host.tag_send(b, 0, 0, 0, SendFrom::Inline(b"pong"), PONG, on_sent_ok)
            .unwrap();
        wait(&mut engine, &PONGS_IN, i + 1);
    }
    // The last sends' notifications.
    let settle = Instant::now() + Duration::from_millis(200);
    while Instant::now() < settle {
        engine.progress();
    }
    drop(domain);
    // Nothing is written while the workers run; stopping one closes its plugin, which writes.
    assert!(timestamps::read_dir_log(&stamp_dirs[0]).is_err());
    let pids: Vec<u32> = (0..2)
        .map(|i| {
            daemon
                .worker_pid(workers[i].id())
                .expect("a running worker") as u32
        })
        .collect();
    for worker in workers {
        worker.stop().map_err(|(_, e)| e).unwrap();
    }
    let logs: Vec<_> = stamp_dirs
        .iter()
        .map(|d| timestamps::read_dir_log(d).unwrap_or_else(|e| panic!("{e}\n{}", daemon.log())))
        .collect();
    for (log, pid) in logs.iter().zip(&pids) {
        assert_eq!(log.pid, *pid);
        assert_eq!(log.dropped, 0);
    }
    // Worker 0 sent every PING and received every PONG; worker 1 the other way round.
    assert_eq!(
        timestamps::tally(&logs[0]),
        vec![(PING, TRIPS, 0), (PONG, 0, TRIPS)]
    );
    assert_eq!(
        timestamps::tally(&logs[1]),
        vec![(PING, 0, TRIPS), (PONG, TRIPS, 0)]
    );
    let ping = timestamps::legs(&logs[0], &logs[1], PING);
    let pong = timestamps::legs(&logs[1], &logs[0], PONG);
    assert_eq!((ping.len(), pong.len()), (TRIPS, TRIPS));
    // One clock: each round trip's four stamps come in the order the messages made them, and
    // each round trip ends before the next begins.
    let mut last = 0;
    for (ping, pong) in ping.iter().zip(&pong) {
        let order = [
            ping.sent_ns,
            ping.received_ns,
            pong.sent_ns,
            pong.received_ns,
        ];
        assert!(
            last < order[0] && order.windows(2).all(|w| w[0] <= w[1]),
            "{ping:?} {pong:?} after {last}"
        );
        last = order[3];
    }
}

#[test]
fn a_timestamps_directory_that_is_not_one_keeps_the_worker_from_starting() {
    let (_plugins, daemon) = local_daemon();
    let dir = TempDir::new("urom-sandbox-timestamps-file");
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let (service, host) = sandbox_service(&daemon.socket);
    let mut engine = ProgressEngine::new();
    let env = format!("{}={}", urom_sandbox::timestamps::ENV, file.display());
    let error = try_run_worker(
        &mut engine,
        Worker::new()
            .set_service(&service)
            .set_plugins(host.id())
            .set_env([env]),
    )
    .map(drop)
    .expect_err("a worker whose only plugin cannot open");
    assert!(error.contains("see its log"), "{error}");
    // The worker's log says why.
    let logs: String = std::fs::read_dir(daemon.dir.path())
        .unwrap()
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            let name = path.file_name()?.to_str()?.to_owned();
            name.starts_with("urom_worker_")
                .then(|| std::fs::read_to_string(&path).ok())
                .flatten()
        })
        .collect();
    assert!(
        logs.contains("cannot write the sandbox plugin's timestamps there")
            && logs.contains(&file.display().to_string()),
        "{logs}"
    );
}

/// Starts a service on the daemon at `socket` and the sandbox plugin's host side.
fn sandbox_service(socket: &std::path::Path) -> (Service<Running>, SandboxHost) {
    let service = Service::<Idle>::new()
        .set_socket(socket)
        .start()
        .map_err(|(_, e)| e)
        .unwrap();
    let info = service.plugin(sandbox::NAME).expect("the sandbox plugin");
    let sandbox = SandboxHost::init(info.id, info.version).unwrap();
    (service, sandbox)
}
