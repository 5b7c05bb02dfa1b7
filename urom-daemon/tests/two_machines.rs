//! Two machines in one: two network namespaces joined by a veth pair with link-local addresses.
//! The daemon and its workers run in the first, hosts in the second, over UCX on TCP. Skips with
//! a printed reason when not root or `ip` is missing.
//!
//! Every host call of this test binary runs on threads inside the second namespace (UCX's
//! process-wide context is made there), or in processes started there.
#![cfg(feature = "ucx")]

use std::cell::Cell;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use urom_core::graph::{GraphHost, loopback_result};
use urom_core::host::{
    CompletedTask, ControlError, Idle, ProgressEngine, Running, Service, ServiceStartError, Worker,
};
use urom_core::wire::Status;
use urom_testkit::daemon::{Daemon, plugin_dir, start_daemon_command};
use urom_testkit::host::{TIMEOUT, run_worker};
use urom_testkit::netns::Network;
use urom_testkit::process::{Signal, signal};
use urom_testkit::{TempDir, binary};

/// The daemon's machine and the hosts' machine.
const SERVICE: usize = 0;
const HOSTS: usize = 1;

/// The daemon on one machine, listening over UCX, and what hosts need to reach it.
struct Setup {
    daemon: Daemon,
    address: String,
    key: PathBuf,
    _dir: TempDir,
    // Last: the daemon and its workers go before their namespaces do.
    network: Network,
}

fn setup(tag: &str) -> Option<Setup> {
    let network = match Network::create(tag, 2) {
        Ok(network) => network,
        Err(why) => {
            println!("skipped: {why}");
            return None;
        }
    };
    let dir = TempDir::new("urom-two-machines");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let key = write_key(dir.path(), "key", b"a secret shared by both machines");
    let plugins = plugin_dir(
        &dir,
        &[
            ("urom-plugin-graph", "worker_graph"),
            ("urom-plugin-faulty", "worker_faulty"),
        ],
    );
    let ip = network.hub_address(HOSTS);
    let port = network.run_in(SERVICE, || {
        std::net::TcpListener::bind((ip, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    });
    let address = format!("{ip}:{port}");
    let mut command = network.command(SERVICE, binary("urom-daemon", "urom-daemon"));
    command
        .env("UCX_TLS", "tcp")
        .env("UCX_NET_DEVICES", network.device(SERVICE, HOSTS))
        .env("UCX_WARN_UNUSED_ENV_VARS", "n");
    let daemon = start_daemon_command(
        command,
        plugins.to_str().unwrap(),
        &[
            "--listen-ucx",
            &address,
            "--key-file",
            key.to_str().unwrap(),
            "--remote-user",
            "nobody",
        ],
        true,
    );
    Some(Setup {
        daemon,
        address,
        key,
        _dir: dir,
        network,
    })
}

fn write_key(dir: &Path, name: &str, secret: &[u8]) -> PathBuf {
    let key = dir.join(name);
    std::fs::write(&key, secret).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    key
}

impl Setup {
    /// Runs `f` on a host thread on the hosts' machine, with UCX kept on its link.
    fn on_host<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        urom_core::transport::ucx::set_config_defaults(&[
            ("TLS", "tcp"),
            ("WARN_UNUSED_ENV_VARS", "n"),
        ]);
        self.network.run_in(HOSTS, f)
    }

    fn service(&self, identity: &str, key: &Path) -> Result<Service<Running>, ServiceStartError> {
        Service::<Idle>::new()
            .set_remote(&self.address)
            .set_key_file(key)
            .set_identity(identity)
            .start()
            .map_err(|(_, e)| e)
    }

    /// A host program started on the hosts' machine.
    fn host_program(&self, program: PathBuf) -> Command {
        let mut command = self.network.command(HOSTS, program);
        command
            .env("UCX_TLS", "tcp")
            .env("UCX_WARN_UNUSED_ENV_VARS", "n");
        command
    }
}

thread_local! {
    static DONE: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
}

fn record(task: &CompletedTask<'_>) {
    let ok = loopback_result(task).is_ok();
    DONE.with(|done| {
        let (good, bad) = done.get();
        done.set(if ok { (good + 1, bad) } else { (good, bad + 1) });
    });
}

fn graph_of(service: &Service<Running>) -> GraphHost {
    let info = service.plugin("worker_graph").unwrap().clone();
    GraphHost::init(info.id, info.version).unwrap()
}

#[test]
fn the_bootstrap_sample_runs_against_a_daemon_on_another_machine() {
    let Some(setup) = setup("bootstrap") else {
        return;
    };
    let hostname = nix::unistd::gethostname().unwrap().into_string().unwrap();
    let services = setup._dir.path().join("services");
    std::fs::write(
        &services,
        format!(
            "{hostname} dpu {} 0000:03:00.0 {}\n",
            setup.address,
            setup.network.device(HOSTS, SERVICE)
        ),
    )
    .unwrap();
    let output = setup
        .host_program(binary("urom-samples", "urom-bootstrap"))
        .arg("--once")
        .env("DOCA_UROM_SERVICE_FILE", &services)
        .env("UROM_KEY_FILE", &setup.key)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{stdout}\n{stderr}\n{}",
        setup.daemon.log()
    );
    for id in 0..4 {
        assert!(
            stdout.contains(&format!(
                "worker {id}: graph loopback sent {id}, received {id}"
            )),
            "{stdout}"
        );
    }
    assert!(setup.daemon.log().contains("remote host authenticated"));
}

#[test]
fn a_host_with_the_wrong_key_is_refused_on_both_sides() {
    let Some(setup) = setup("wrongkey") else {
        return;
    };
    let wrong = write_key(
        setup._dir.path(),
        "wrong",
        b"not the secret the daemon holds",
    );
    let error = setup
        .on_host(|| setup.service("intruder", &wrong).err())
        .expect("refused");
    assert!(
        matches!(
            &error,
            ServiceStartError::Control(ControlError::Refused {
                status: Status::Authentication,
                ..
            })
        ),
        "{error}"
    );
    assert!(error.to_string().contains("wrong proof"), "{error}");
    let deadline = Instant::now() + TIMEOUT;
    while !setup.daemon.log().contains("failed authentication") {
        assert!(Instant::now() < deadline, "{}", setup.daemon.log());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_host_cannot_destroy_or_attach_to_another_hosts_worker() {
    let Some(setup) = setup("owners") else {
        return;
    };
    setup.on_host(|| {
        let owner = setup.service("rank-0", &setup.key).unwrap();
        let graph = graph_of(&owner);
        let mut engine = ProgressEngine::new();
        let worker = run_worker(
            &mut engine,
            Worker::new()
                .set_service(&owner)
                .set_id(5)
                .set_plugins(graph.id()),
        );
        let other = setup.service("rank-1", &setup.key).unwrap();
        assert!(
            other.workers_by_gid(0).unwrap().is_empty(),
            "another host's workers are not listed"
        );
        let mut other_engine = ProgressEngine::new();
        let attach = Worker::new()
            .set_service(&other)
            .set_id(5)
            .set_plugins(graph.id())
            .start(&mut other_engine)
            .map_err(|(_, e)| e.to_string())
            .and_then(|starting| {
                starting
                    .wait_running(&mut other_engine, TIMEOUT)
                    .map(|_| ())
                    .map_err(|progress| format!("{progress:?}"))
            });
        let refused = attach.expect_err("attached to another host's worker");
        assert!(refused.contains("belongs to another user"), "{refused}");

        graph.loopback(&worker, 1, 0, record).unwrap();
        let deadline = Instant::now() + TIMEOUT;
        while DONE.with(Cell::get).0 < 1 {
            engine.progress();
            assert!(
                Instant::now() < deadline,
                "the owner's worker stopped answering"
            );
        }
    });
}

#[test]
fn a_worker_killed_under_load_fails_its_tasks_once_and_others_go_on() {
    let Some(setup) = setup("kill") else {
        return;
    };
    setup.on_host(|| {
        let service = setup.service("rank-0", &setup.key).unwrap();
        let graph = graph_of(&service);
        let mut engine = ProgressEngine::new();
        let config = |id| {
            Worker::new()
                .set_service(&service)
                .set_id(id)
                .set_plugins(graph.id())
                .set_max_inflight_tasks(64)
        };
        let victim = run_worker(&mut engine, config(1));
        let survivor = run_worker(&mut engine, config(2));
        let victim_pid = setup.daemon.worker_pid(1).expect("worker 1 runs");
        let mut submitted = 0;
        let deadline = Instant::now() + TIMEOUT;
        let mut killed = false;
        while submitted < 2000 {
            for worker in [&victim, &survivor] {
                if graph.loopback(worker, submitted, 0, record).is_ok() {
                    submitted += 1;
                }
            }
            engine.progress();
            if !killed && submitted >= 500 {
                signal(victim_pid, Signal::SIGKILL);
                killed = true;
            }
            assert!(Instant::now() < deadline, "tasks did not flow");
        }
        // Every task submitted completes exactly once: with success, or with the worker's
        // failure.
        while {
            let (good, bad) = DONE.with(Cell::get);
            good + bad < submitted as usize
        } {
            engine.progress();
            assert!(Instant::now() < deadline, "some tasks never completed");
        }
        let (good, bad) = DONE.with(Cell::get);
        assert_eq!(good + bad, submitted as usize);
        assert!(bad > 0, "the killed worker's tasks failed");
        let before = good;
        graph.loopback(&survivor, 7, 0, record).unwrap();
        while DONE.with(Cell::get).0 == before {
            engine.progress();
            assert!(
                Instant::now() < deadline,
                "the other worker stopped answering"
            );
        }
    });
}
