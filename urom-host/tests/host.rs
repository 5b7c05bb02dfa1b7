//! The host API against a real daemon and real workers: the bootstrap flow of the DOCA UROM
//! guide, attach by id, group queries, environment, and a worker killed with tasks in flight
//! (noticed by the channel, or by the daemon's word alone).

mod common;

use std::cell::RefCell;
use std::time::{Duration, Instant};

use common::{TIMEOUT, run_worker, start_daemon, start_service};
use urom_graph::{GraphHost, loopback_result};
use urom_host::CompletedTask;
use urom_host::{ProgressEngine, Worker, WorkerFailure, WorkerState};
use urom_testkit::process::{Signal, signal};
use urom_wire::Status;

thread_local! {
    static DONE: RefCell<Vec<(Status, u64, u64)>> = const { RefCell::new(Vec::new()) };
}

fn record(task: &CompletedTask<'_>) {
    let entry = match loopback_result(task) {
        Ok(result) => (Status::Success, result.data, result.cookie),
        Err(status) => (status, 0, 0),
    };
    DONE.with(|done| done.borrow_mut().push(entry));
}

fn wait_for(engine: &mut ProgressEngine, count: usize) -> Vec<(Status, u64, u64)> {
    let deadline = Instant::now() + TIMEOUT;
    while DONE.with(|done| done.borrow().len()) < count {
        engine.progress();
        assert!(Instant::now() < deadline, "tasks did not complete");
    }
    DONE.with(|done| done.borrow_mut().drain(..).collect())
}

fn echo(task: &CompletedTask<'_>) {
    let text = String::from_utf8_lossy(task.response).into_owned();
    ECHO.with(|echo| *echo.borrow_mut() = Some((task.status, text)));
}

thread_local! {
    static ECHO: RefCell<Option<(Status, String)>> = const { RefCell::new(None) };
}

#[test]
fn bootstrap_flow_with_four_worker_threads() {
    let (_plugins, daemon) = start_daemon();
    let service = start_service(&daemon);
    let info = service
        .plugin("worker_graph")
        .expect("the graph plugin is offered")
        .clone();
    let graph = GraphHost::init(info.id, info.version).unwrap();
    assert!(!service.cpuset().is_empty());

    std::thread::scope(|scope| {
        for id in 0..4u64 {
            let service = &service;
            scope.spawn(move || {
                let mut engine = ProgressEngine::new();
                let worker = Worker::new()
                    .set_service(service)
                    .set_id(id)
                    .set_gid((id % 2) as u32)
                    .set_plugins(graph.id());
                let worker = run_worker(&mut engine, worker);
                assert_eq!((worker.id(), worker.gid()), (id, (id % 2) as u32));
                graph.loopback(&worker, 100 + id, id, record).unwrap();
                assert_eq!(
                    wait_for(&mut engine, 1),
                    vec![(Status::Success, id, 100 + id)]
                );
                // Keep the worker until every thread has checked the groups.
                std::thread::sleep(Duration::from_millis(300));
            });
        }
        let deadline = Instant::now() + TIMEOUT;
        while service.workers_by_gid(0).unwrap().len() + service.workers_by_gid(1).unwrap().len()
            < 4
        {
            assert!(Instant::now() < deadline, "workers did not all start");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(service.workers_by_gid(0).unwrap(), vec![0, 2]);
        assert_eq!(service.workers_by_gid(1).unwrap(), vec![1, 3]);
    });

    // The same query as a task on the service's engine.
    thread_local! {
        static GIDS: RefCell<Option<Vec<u64>>> = const { RefCell::new(None) };
    }
    fn gids(_gid: u32, result: Result<&[u64], &urom_host::ControlError>) {
        GIDS.with(|g| *g.borrow_mut() = Some(result.unwrap().to_vec()));
    }
    let mut engine = ProgressEngine::new();
    service.workers_by_gid_task(&mut engine, 1, gids).unwrap();
    let deadline = Instant::now() + TIMEOUT;
    while GIDS.with(|g| g.borrow().is_none()) {
        engine.progress();
        assert!(Instant::now() < deadline);
    }
    service.stop();
}

#[test]
fn bursts_submitted_in_one_batch_complete_in_order_as_the_rings_wrap() {
    let (_plugins, daemon) = start_daemon();
    bursts_complete_in_order(start_service(&daemon));
}

/// The same over UCX (on 127.0.0.1): each burst travels in as few batch messages as it fits,
/// and so do the worker's answers to each pass.
#[cfg(feature = "ucx")]
#[test]
fn bursts_submitted_in_one_batch_over_ucx_complete_in_order() {
    let (_dir, _daemon, service) = urom_testkit::host::remote_service();
    bursts_complete_in_order(service);
}

/// 20,000 loopbacks in bursts of 1 to 256, with as many tasks in flight as the channel has
/// slots (256 each way): full bursts fill the rings, which they go round about 80 times. Every
/// one completes, in order, and the worker still runs.
fn bursts_complete_in_order(service: urom_host::Service<urom_host::Running>) {
    let graph = urom_testkit::host::graph_host(&service);
    let mut engine = ProgressEngine::new();
    let worker = run_worker(
        &mut engine,
        Worker::new()
            .set_service(&service)
            .set_plugins(graph.id())
            .set_max_inflight_tasks(256),
    );
    const TOTAL: u64 = 20_000;
    let (mut sent, mut next) = (0u64, 0u64);
    let mut burst = 1usize;
    let deadline = Instant::now() + TIMEOUT;
    while next < TOTAL {
        let want = burst.min((TOTAL - sent) as usize);
        if want > 0 {
            match graph.loopback_batch(&worker, sent, want, record) {
                Ok(went) => sent += went as u64,
                Err(urom_host::CommandError::Exhausted) => {}
                Err(e) => panic!("burst refused: {e}"),
            }
        }
        // Burst sizes from 1 to 256, in an order that keeps the rings' laps out of step.
        burst = burst * 7 % 257;
        engine.progress();
        for (status, data, cookie) in
            DONE.with(|done| done.borrow_mut().drain(..).collect::<Vec<_>>())
        {
            assert_eq!(
                (status, data, cookie),
                (Status::Success, next, next),
                "completion {next}"
            );
            next += 1;
        }
        assert!(
            Instant::now() < deadline,
            "{next} of {TOTAL} loopbacks completed in time"
        );
    }
    assert_eq!(sent, TOTAL);
    assert_eq!(worker.state(), WorkerState::Running);
    service.stop();
}

#[test]
fn attach_from_a_second_service_and_environment() {
    let (_plugins, daemon) = start_daemon();
    let first = start_service(&daemon);
    let faulty = first.plugin("worker_faulty").unwrap().id;
    let graph_info = first.plugin("worker_graph").unwrap().clone();
    let graph = GraphHost::init(graph_info.id, graph_info.version).unwrap();
    let mut engine = ProgressEngine::new();
    let worker = run_worker(
        &mut engine,
        Worker::new()
            .set_service(&first)
            .set_id(5)
            .set_plugins(faulty | graph.id())
            .set_env(["UROM_GREETING=hello from the host".to_owned()]),
    );
    worker
        .submit(faulty, |task| {
            task.set_callback(echo);
            let command = b"env:UROM_GREETING";
            task.payload_mut()[..command.len()].copy_from_slice(command);
            command.len()
        })
        .unwrap();
    let deadline = Instant::now() + TIMEOUT;
    while ECHO.with(|e| e.borrow().is_none()) {
        engine.progress();
        assert!(Instant::now() < deadline);
    }
    assert_eq!(
        ECHO.with(|e| e.borrow_mut().take()),
        Some((Status::Success, "hello from the host".to_owned()))
    );

    // A second service (another host connection) attaches to worker 5 by id.
    let second = start_service(&daemon);
    let mut engine2 = ProgressEngine::new();
    let attached = run_worker(
        &mut engine2,
        Worker::new()
            .set_service(&second)
            .set_id(5)
            .set_plugins(graph.id()),
    );
    assert_eq!(attached.id(), 5);
    graph.loopback(&attached, 1, 77, record).unwrap();
    assert_eq!(wait_for(&mut engine2, 1), vec![(Status::Success, 77, 1)]);

    // Too large a payload is an error, not a truncation.
    let capacity = worker.max_command_payload();
    let error = worker.submit(faulty, |_| capacity + 1).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "command payload of {} bytes exceeds the {capacity} bytes a message carries",
            capacity + 1
        )
    );
}

/// Each host's rings are its own size: a worker spawned by a host that keeps 2 tasks in flight
/// serves a second host that keeps 1,024 in flight, which submits them all at once and gets
/// every one back, and the first host still gets its own back. (Rings sized once, for the
/// spawning host, held the second host's 1,024 commands and their notifications in 2 slots.)
#[test]
fn a_host_with_more_in_flight_than_the_spawner_attaches_and_completes_all() {
    const MANY: usize = 1024;
    let (_plugins, daemon) = start_daemon();
    let first = start_service(&daemon);
    let graph = urom_testkit::host::graph_host(&first);
    let mut engine = ProgressEngine::new();
    let spawned = run_worker(
        &mut engine,
        Worker::new()
            .set_service(&first)
            .set_id(11)
            .set_plugins(graph.id())
            .set_max_inflight_tasks(2),
    );
    let second = start_service(&daemon);
    let mut engine2 = ProgressEngine::new();
    let attached = run_worker(
        &mut engine2,
        Worker::new()
            .set_service(&second)
            .set_id(11)
            .set_plugins(graph.id())
            .set_max_inflight_tasks(MANY),
    );
    for i in 0..MANY as u64 {
        graph.loopback(&attached, i, 1000 + i, record).unwrap();
    }
    let mut done = wait_for(&mut engine2, MANY);
    done.sort_by_key(|&(_, data, _)| data);
    let expected: Vec<_> = (0..MANY as u64)
        .map(|i| (Status::Success, 1000 + i, i))
        .collect();
    assert_eq!(done, expected);
    for i in 0..2 {
        graph.loopback(&spawned, i, i, record).unwrap();
    }
    assert_eq!(wait_for(&mut engine, 2).len(), 2);

    // A bare channel that asks for 64 slots puts 64 commands in its ring without taking any
    // answer, then takes them all: its rings are its own, not the spawner's 2 slots (in which
    // the worker, its answers held back, would take no third command).
    let mut control = urom_testkit::control::ControlClient::connect(&daemon.socket, TIMEOUT)
        .expect("the daemon's socket");
    control.handshake().unwrap();
    let (_, socket) = control.spawn(11, 0, graph.id(), "", &[]).unwrap();
    let wants = urom_transport::ChannelConfig {
        slots: 64,
        ..urom_transport::ChannelConfig::default()
    };
    let mut bare = urom_testkit::worker::connect_with(&socket, &wants);
    let mut payload = [0u8; 64];
    for i in 0..64u64 {
        let len = urom_graph::GraphCommand::Loopback { data: i }
            .pack(&mut payload)
            .unwrap();
        let mut frame = [0u8; 4096];
        let len = urom_wire::data::write_command_headers(
            &mut frame,
            i,
            graph.id(),
            i,
            len,
            urom_wire::MaxMsgSize::DEFAULT,
        )
        .unwrap();
        frame[urom_wire::data::COMMAND_PAYLOAD_OFFSET..len]
            .copy_from_slice(&payload[..len - urom_wire::data::COMMAND_PAYLOAD_OFFSET]);
        use urom_transport::Transport;
        bare.send(&frame[..len])
            .unwrap_or_else(|e| panic!("command {i} of 64 found no room: {e}"));
    }
    let mut contexts: Vec<u64> = (0..64)
        .map(|_| {
            let (_, context, status, _) = urom_testkit::worker::next_notification(&mut bare);
            assert_eq!(status, Status::Success);
            context
        })
        .collect();
    contexts.sort_unstable();
    assert_eq!(contexts, (0..64).collect::<Vec<_>>());
    attached.stop().map_err(|(_, e)| e).unwrap();
    spawned.stop().map_err(|(_, e)| e).unwrap();
}

#[test]
fn environment_that_changes_how_programs_load_is_refused_before_asking() {
    let (_plugins, daemon) = start_daemon();
    let service = start_service(&daemon);
    let graph = service.plugin("worker_graph").unwrap().id;
    let mut engine = ProgressEngine::new();
    let started = Worker::new()
        .set_service(&service)
        .set_plugins(graph)
        .set_env([
            "UROM_GREETING=hello".to_owned(),
            "LD_PRELOAD=/tmp/evil.so".to_owned(),
        ])
        .start(&mut engine);
    let error = match started {
        Ok(_) => panic!("a worker with LD_PRELOAD was asked for"),
        Err((_, error)) => error,
    };
    assert!(
        matches!(&error, urom_host::WorkerStartError::EnvRefused(e) if e.name == "LD_PRELOAD"),
        "{error}"
    );
    assert!(error.to_string().contains("LD_PRELOAD"), "{error}");
    service.stop();
}

#[test]
fn a_service_runs_at_most_its_max_workers() {
    let (_plugins, daemon) = start_daemon();
    let service = urom_host::Service::<urom_host::Idle>::new()
        .set_socket(&daemon.socket)
        .set_max_workers(2)
        .map_err(|_| "2 is a power of two")
        .unwrap()
        .start()
        .map_err(|(_, e)| e)
        .unwrap();
    let graph = service.plugin("worker_graph").unwrap().id;
    let worker = |id| {
        Worker::new()
            .set_service(&service)
            .set_id(id)
            .set_plugins(graph)
    };
    let mut engine = ProgressEngine::new();
    let first = run_worker(&mut engine, worker(20));
    let second = run_worker(&mut engine, worker(21));
    let (third, error) = match worker(22).start(&mut engine) {
        Ok(_) => panic!("a third worker started beyond max workers 2"),
        Err(refused) => refused,
    };
    assert!(
        matches!(error, urom_host::WorkerStartError::TooManyWorkers(2)),
        "{error}"
    );
    // A stopped worker and a dropped one each give their place back.
    first.stop().map_err(|(_, e)| e).unwrap();
    let third = run_worker(&mut engine, third);
    drop(second);
    let fourth = run_worker(&mut engine, worker(23));
    for worker in [third, fourth] {
        worker.stop().map_err(|(_, e)| e).unwrap();
    }
    service.stop();
}

#[test]
fn a_killed_worker_fails_every_task_in_flight_once() {
    let (_plugins, daemon) = start_daemon();
    let service = start_service(&daemon);
    let graph = urom_testkit::host::graph_host(&service);
    let mut engine = ProgressEngine::new();
    let doomed = run_worker(
        &mut engine,
        Worker::new()
            .set_service(&service)
            .set_id(9)
            .set_plugins(graph.id()),
    );
    let survivor = run_worker(
        &mut engine,
        Worker::new()
            .set_service(&service)
            .set_id(10)
            .set_plugins(graph.id()),
    );

    // Stop the worker's process first, so that none of the 64 tasks is answered.
    let pid = daemon.worker_pid(9).expect("worker 9 runs");
    signal(pid, Signal::SIGSTOP);
    for i in 0..64 {
        graph.loopback(&doomed, i, i, record).unwrap();
    }
    signal(pid, Signal::SIGKILL);
    let done = wait_for(&mut engine, 64);
    assert_eq!(done.len(), 64);
    assert!(
        done.iter()
            .all(|(status, _, _)| *status == Status::NotConnected),
        "{done:?}"
    );
    assert!(matches!(doomed.state(), WorkerState::Failed(_)));
    // Nothing completes twice.
    for _ in 0..100 {
        engine.progress();
    }
    assert_eq!(DONE.with(|d| d.borrow().len()), 0);
    assert!(doomed.submit(graph.id(), |_| 0).is_err());

    // The other worker still answers.
    graph.loopback(&survivor, 5, 55, record).unwrap();
    assert_eq!(wait_for(&mut engine, 1), vec![(Status::Success, 55, 5)]);
}

/// The daemon's word that a worker ended fails the tasks in flight on a channel to it that
/// says nothing (one this test holds open, silent), and wakes an engine asleep on it: a host
/// learns of a dead worker within a bounded time whatever its transport notices.
#[test]
fn the_daemons_word_fails_a_dead_workers_tasks_when_the_channel_says_nothing() {
    let (_plugins, daemon) = start_daemon();
    let service = start_service(&daemon);
    let graph = urom_testkit::host::graph_host(&service);
    // Worker 11, started through this service (so the daemon tells it when the worker ends) on
    // an engine of its own that nobody progresses: its channel's hang-up wakes nothing here.
    let mut other = ProgressEngine::new();
    let _spawned = run_worker(
        &mut other,
        Worker::new()
            .set_service(&service)
            .set_id(11)
            .set_plugins(graph.id()),
    );
    // A second context for worker 11, over a channel whose far end this test keeps.
    let (near, far) = std::os::unix::net::UnixStream::pair().unwrap();
    let config = urom_transport::ChannelConfig::new(urom_wire::MaxMsgSize::DEFAULT);
    let accepting = config;
    let far = std::thread::spawn(move || urom_transport::Channel::accept(far, &accepting));
    let near = urom_transport::Channel::offer(near, &config).unwrap();
    let _far = far.join().unwrap().unwrap();
    let mut engine = ProgressEngine::new();
    let silent = Worker::new()
        .set_service(&service)
        .set_id(11)
        .set_plugins(graph.id())
        .attach(&mut engine, near)
        .map_err(|(_, e)| e)
        .unwrap();
    for i in 0..8 {
        graph.loopback(&silent, i, i, record).unwrap();
    }
    engine.progress();
    assert_eq!(silent.state(), WorkerState::Running);

    signal(
        daemon.worker_pid(11).expect("worker 11 runs"),
        Signal::SIGKILL,
    );
    let start = Instant::now();
    while DONE.with(|done| done.borrow().len()) < 8 {
        assert!(start.elapsed() < TIMEOUT, "the tasks did not fail");
        engine.wait(TIMEOUT).unwrap();
        engine.progress();
    }
    let done = wait_for(&mut engine, 8);
    assert!(
        done.iter()
            .all(|(status, _, _)| *status == Status::NotConnected),
        "{done:?}"
    );
    let WorkerState::Failed(WorkerFailure::Exited(exit)) = silent.state() else {
        panic!("{:?}", silent.state());
    };
    assert_eq!((exit.worker_id, exit.signal), (11, 9));
}

/// A daemon that accepts and then says nothing: the host's error names what it waited for.
#[test]
fn a_silent_daemon_times_out_naming_the_hello() {
    let dir = urom_testkit::TempDir::new("urom-silent-daemon");
    let socket = dir.path().join("urom.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let silent = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        // Read the hello and keep the connection open without ever answering it.
        let mut sink = Vec::new();
        let _ = std::io::Read::read_to_end(&mut stream, &mut sink);
    });
    let error = match urom_host::Service::<urom_host::Idle>::new()
        .set_socket(&socket)
        .start()
    {
        Ok(_) => panic!("a daemon that never answers was taken for a service"),
        Err((_, error)) => error.to_string(),
    };
    assert!(
        error.contains("the daemon did not answer the hello within 10 s"),
        "{error}"
    );
    silent.join().unwrap();
}
