//! Two machines in one: two network namespaces joined by a veth pair with addresses of the never-routed benchmarking range.
//! The daemon and its workers run in the first, hosts in the second, over UCX on TCP. Skips with
//! a printed reason when not root or `ip` is missing.
//!
//! One test runs every case in turn on one pair of namespaces. Hosts are processes started in
//! the second namespace with `ip netns exec` (the bootstrap sample, `urom-remote-host`): UCX
//! reads the network devices from `/sys`, which only that remounts for the namespace.
#![cfg(feature = "ucx")]

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use urom_testkit::daemon::{Daemon, plugin_dir, write_key};
use urom_testkit::host::TIMEOUT;
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
            urom_testkit::skip(&why);
            return None;
        }
    };
    let dir = TempDir::new("urom-two-machines");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let key = write_key(dir.path(), "key", b"a secret shared by both machines");
    let plugins = plugin_dir(&dir, &urom_testkit::daemon::GRAPH_AND_FAULTY);
    let (daemon, address) =
        urom_testkit::daemon::start_remote_daemon(&network, SERVICE, HOSTS, &plugins, &key);
    Some(Setup {
        daemon,
        address,
        key,
        _dir: dir,
        network,
    })
}

impl Setup {
    /// `urom-remote-host` on the hosts' machine, reaching the daemon with `key` as `identity`.
    fn remote_host(&self, key: &Path, identity: &str, command: &[&str]) -> Command {
        let mut host = self.host_program(binary("urom-testkit", "urom-remote-host"));
        host.arg(&self.address).arg(key).arg(identity).args(command);
        host
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

#[test]
fn two_machines() {
    let Some(setup) = setup("two") else {
        return;
    };
    the_bootstrap_sample_runs_against_a_daemon_on_another_machine(&setup);
    a_host_with_the_wrong_key_is_refused_on_both_sides(&setup);
    a_host_cannot_destroy_or_attach_to_another_hosts_worker(&setup);
    workers_hold_no_descriptor_of_the_daemon_or_of_another_session(&setup);
    a_worker_killed_under_load_fails_its_tasks_once_and_others_go_on(&setup);
    a_worker_killed_with_no_task_in_flight_is_found_failed(&setup);
}

fn the_bootstrap_sample_runs_against_a_daemon_on_another_machine(setup: &Setup) {
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

fn a_host_with_the_wrong_key_is_refused_on_both_sides(setup: &Setup) {
    let wrong = write_key(
        setup._dir.path(),
        "wrong",
        b"not the secret the daemon holds",
    );
    let output = setup
        .remote_host(&wrong, "intruder", &["connect"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(3), "{stdout}");
    assert!(
        stdout.contains("refused") && stdout.contains("wrong proof of the shared secret"),
        "{stdout}"
    );
    let deadline = Instant::now() + TIMEOUT;
    while !setup.daemon.log().contains("failed authentication") {
        assert!(Instant::now() < deadline, "{}", setup.daemon.log());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn a_host_cannot_destroy_or_attach_to_another_hosts_worker(setup: &Setup) {
    let mut owner = setup
        .remote_host(&setup.key, "rank-0", &["spawn", "5"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(owner.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert_eq!(first, "running 5", "{}", setup.daemon.log());

    let output = setup
        .remote_host(&setup.key, "rank-1", &["attach", "5"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("refused") && stdout.contains("belongs to another user"),
        "another identity attached to worker 5: {stdout}"
    );
    assert!(setup.daemon.worker_pid(5).is_some(), "worker 5 still runs");
    drop(owner.stdin.take());
    assert!(owner.wait().unwrap().success());
}

fn workers_hold_no_descriptor_of_the_daemon_or_of_another_session(setup: &Setup) {
    let start = |identity: &str, id: &str| {
        let mut host = setup
            .remote_host(&setup.key, identity, &["spawn", id])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(host.stdout.take().unwrap()).lines();
        let first = lines.next().unwrap().unwrap();
        assert_eq!(first, format!("running {id}"), "{}", setup.daemon.log());
        host
    };
    let mut hosts = [start("rank-0", "7"), start("rank-1", "8")];
    let daemon = open_sockets(setup.daemon.pid());
    let [seven, eight] = [7, 8].map(|id| {
        let pid = setup.daemon.worker_pid(id).expect("the worker runs");
        open_sockets(pid)
    });
    assert!(daemon.len() >= 3, "the daemon's own sockets: {daemon:?}");
    assert!(
        seven.is_disjoint(&daemon) && eight.is_disjoint(&daemon),
        "a worker holds a socket of the daemon's: daemon {daemon:?}, workers {seven:?} {eight:?}"
    );
    assert!(
        seven.is_disjoint(&eight),
        "workers of two identities share sockets: {seven:?} {eight:?}"
    );
    for host in &mut hosts {
        drop(host.stdin.take());
        assert!(host.wait().unwrap().success());
    }
}

/// The sockets process `pid` holds open, by inode (from `/proc/PID/fd`).
fn open_sockets(pid: i32) -> std::collections::BTreeSet<u64> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter_map(|target| {
            let target = target.to_str()?.to_owned();
            target
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect()
}

/// `urom-remote-host load` on workers `ids`, once it runs: the process, its standard input
/// (which steers it) and its lines.
struct Load {
    host: std::process::Child,
    input: std::process::ChildStdin,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl Load {
    fn start(setup: &Setup, ids: [u64; 2]) -> Self {
        let [a, b] = ids.map(|id| id.to_string());
        let mut host = setup
            .remote_host(&setup.key, "rank-0", &["load", &a, &b])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let input = host.stdin.take().unwrap();
        let lines = BufReader::new(host.stdout.take().unwrap()).lines();
        let mut load = Self { host, input, lines };
        load.expect("running", setup);
        load
    }

    /// The host's next line.
    fn line(&mut self) -> String {
        self.lines
            .next()
            .expect("the load host ended early")
            .unwrap()
    }

    fn expect(&mut self, line: &str, setup: &Setup) {
        assert_eq!(self.line(), line, "{}", setup.daemon.log());
    }

    fn order(&mut self, order: &str) {
        use std::io::Write;
        writeln!(self.input, "{order}").unwrap();
        self.input.flush().unwrap();
    }

    /// Ends the load: returns how many tasks succeeded and failed, after checking that every
    /// one submitted completed exactly once and that a worker still answers.
    fn end(mut self) -> (u64, u64) {
        drop(self.input);
        let completed = self.lines.next().unwrap().unwrap();
        let numbers: Vec<u64> = completed
            .strip_prefix("completed ")
            .unwrap_or_else(|| panic!("{completed}"))
            .split(' ')
            .map(|n| n.parse().unwrap())
            .collect();
        let [good, bad, submitted] = numbers[..] else {
            panic!("{completed}")
        };
        assert_eq!(good + bad, submitted, "every task completed exactly once");
        assert_eq!(self.lines.next().unwrap().unwrap(), "answering");
        assert!(self.host.wait().unwrap().success());
        (good, bad)
    }
}

/// Waits until `pid` is stopped by the `SIGSTOP` it was sent.
fn wait_stopped(pid: i32) {
    let deadline = Instant::now() + TIMEOUT;
    while !urom_testkit::process::stopped(pid) {
        assert!(Instant::now() < deadline, "process {pid} did not stop");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Worker 1 dies with a full window of its host's tasks in flight (stopped first, so none of
/// them can be answered): each of them fails, once, and the load on worker 2 goes on.
fn a_worker_killed_under_load_fails_its_tasks_once_and_others_go_on(setup: &Setup) {
    let mut load = Load::start(setup, [1, 2]);
    // Under load, then idle with none of its tasks in flight, then stopped: whatever the host
    // submits to it from now on stays in flight until it dies.
    load.order("drain");
    load.expect("drained", setup);
    let victim = setup.daemon.worker_pid(1).expect("worker 1 runs");
    signal(victim, Signal::SIGSTOP);
    wait_stopped(victim);
    load.order("fill");
    load.expect("filled 64", setup);
    signal(victim, Signal::SIGKILL);
    load.expect("failing 1", setup);
    let (_, bad) = load.end();
    assert_eq!(bad, 64, "each task in flight to the killed worker failed");
}

/// Worker 3 dies with nothing of its host's in flight (the race a kill under load can land
/// in: every task answered just before): the host still finds it failed, with no task
/// failed, and the load on worker 4 goes on.
fn a_worker_killed_with_no_task_in_flight_is_found_failed(setup: &Setup) {
    let mut load = Load::start(setup, [3, 4]);
    load.order("drain");
    load.expect("drained", setup);
    let victim = setup.daemon.worker_pid(3).expect("worker 3 runs");
    signal(victim, Signal::SIGKILL);
    load.expect("failing 3", setup);
    let (_, bad) = load.end();
    assert_eq!(bad, 0, "no task was in flight to the killed worker");
}
