//! Three machines in one: the server in one network namespace, the orchestrator in a second and
//! the clients in a third, joined by veth pairs with never-routed benchmarking-range addresses
//! (the server's namespace is the hub: it reaches both others, they reach only it). The channel is UCX over
//! TCP (`-c ucx://IP:PORT`). Skips with a printed reason when not root or `ip` is missing.
//!
//! One test runs every case in turn on one set of namespaces. Every program runs as a process
//! started with `ip netns exec`: UCX reads the network devices from `/sys`, which only that
//! remounts for the namespace.
#![cfg(feature = "ucx")]

mod common;

use std::fs::File;
use std::net::Ipv4Addr;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{
    CLIENT, ORCHESTRATOR, SERVER, TIMEOUT, assert_thread_count_mismatch, check_shapes,
    listening_port, read,
};
use urom_testkit::netns::Network;
use urom_testkit::{ChildGuard, TempDir};

/// The server's machine (the hub), the orchestrator's, the clients'.
const SERVER_NS: usize = 0;
const ORCHESTRATOR_NS: usize = 1;
const CLIENTS_NS: usize = 2;
/// Payloads up to this long; 100 000-byte ones cross UCX by its rendezvous protocol.
const MAX_LEN: &str = "131072";

struct Machines {
    network: Network,
    dir: TempDir,
}

impl Machines {
    /// `program` on machine `ns`, with UCX on TCP over the device that leads towards `towards`.
    fn command(&self, ns: usize, towards: usize, program: &str) -> Command {
        let mut command = self.network.command(ns, program);
        command
            .env("UCX_TLS", "tcp")
            .env("UCX_NET_DEVICES", self.network.device(ns, towards))
            .env("UCX_WARN_UNUSED_ENV_VARS", "n");
        command
    }

    /// The server's address towards the orchestrator, and a port free there.
    fn channel(&self) -> String {
        let ip = self.network.hub_address(ORCHESTRATOR_NS);
        let port = self.network.run_in(SERVER_NS, || {
            std::net::TcpListener::bind((ip, 0))
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
        });
        format!("ucx://{ip}:{port}")
    }

    /// The server's address towards the clients.
    fn client_side(&self) -> Ipv4Addr {
        self.network.hub_address(CLIENTS_NS)
    }

    fn log(&self, name: &str) -> String {
        read(&self.dir.path().join(name))
    }
}

/// A server and an orchestrator on their two machines, the server serving clients.
struct Remote {
    server: ChildGuard,
    orchestrator: ChildGuard,
    port: u16,
    logs: (String, String),
}

impl Remote {
    /// Starts the server with two data-path threads and the orchestrator with `threads`, both
    /// allowing payloads of up to [`MAX_LEN`] bytes; waits until clients may connect.
    fn start(machines: &Machines, tag: &str) -> Self {
        let channel = machines.channel();
        let logs = (
            format!("{tag}-server.log"),
            format!("{tag}-orchestrator.log"),
        );
        let [a, b] = common::two_cpus();
        let mut server = ChildGuard(
            machines
                .command(SERVER_NS, ORCHESTRATOR_NS, SERVER)
                .args(["-c", &channel, "-p", "0"])
                .args(["-a", &machines.client_side().to_string()])
                .args(["--cpu", &a.to_string(), "--cpu", &b.to_string()])
                .args(["--max-message-length", MAX_LEN])
                .stdout(Stdio::piped())
                .stderr(log_file(machines, &logs.0))
                .spawn()
                .expect("starting the server"),
        );
        let orchestrator = ChildGuard(
            machines
                .command(ORCHESTRATOR_NS, SERVER_NS, ORCHESTRATOR)
                .args(["-c", &channel, "-t", "2"])
                .args(["--max-message-length", MAX_LEN])
                .stdout(Stdio::null())
                .stderr(log_file(machines, &logs.1))
                .spawn()
                .expect("starting the orchestrator"),
        );
        let port = listening_port(&mut server).unwrap_or_else(|| {
            panic!(
                "the server never listened; its log:\n{}\norchestrator:\n{}",
                machines.log(&logs.0),
                machines.log(&logs.1)
            )
        });
        Self {
            server,
            orchestrator,
            port,
            logs,
        }
    }

    fn logs(&self, machines: &Machines) -> String {
        format!(
            "server log:\n{}\norchestrator log:\n{}",
            machines.log(&self.logs.0),
            machines.log(&self.logs.1)
        )
    }
}

/// A client on the clients' machine against the server's `port`: `threads` x `iterations`
/// requests of `message`, `pipeline` in flight per thread, every response checked against
/// `expected`.
fn client(
    machines: &Machines,
    port: u16,
    threads: u32,
    iterations: u64,
    message: &str,
    expected: &str,
    pipeline: u32,
) -> Output {
    machines
        .network
        .command(CLIENTS_NS, CLIENT)
        .args(["-s", &machines.client_side().to_string()])
        .args(["-p", &port.to_string()])
        .args(["-t", &threads.to_string(), "-i", &iterations.to_string()])
        .args(["-m", message, "-e", expected])
        .args(["--max-concurrent-messages", &pipeline.to_string()])
        .args(["--response-timeout", "60"])
        .output()
        .expect("running the client")
}

fn log_file(machines: &Machines, name: &str) -> Stdio {
    Stdio::from(File::create(machines.dir.path().join(name)).unwrap())
}

#[test]
fn server_orchestrator_and_clients_on_three_machines() {
    let network = match Network::create("gpuoff", 3) {
        Ok(network) => network,
        Err(why) => {
            urom_testkit::skip(&why);
            return;
        }
    };
    let machines = Machines {
        network,
        dir: TempDir::new("gpu-offload-three-machines"),
    };
    every_response_is_right_across_machines(&machines);
    the_server_outlives_its_orchestrator_and_serves_the_next_across_machines(&machines);
    a_thread_count_mismatch_is_a_clear_error_on_both_machines(&machines);
    an_orchestrator_with_no_server_says_so(&machines);
}

/// Clients of 1 and 4 threads, 1 and 128 requests in flight, payloads from empty to 100 000
/// bytes: every response checked by the client; then Ctrl-C on the server stops both cleanly.
fn every_response_is_right_across_machines(machines: &Machines) {
    let mut remote = Remote::start(machines, "shapes");
    check_shapes(
        &[0, 1, 64, 4000, 100_000],
        |len, pipeline| match (len, pipeline) {
            (100_000, _) => 20,
            (_, 1) => 50,
            _ => 1_000,
        },
        |threads, iterations, message, expected, pipeline| {
            client(
                machines,
                remote.port,
                threads,
                iterations,
                message,
                expected,
                pipeline,
            )
        },
        || remote.logs(machines),
    );
    remote.server.signal(common::SIGINT);
    let server = remote.server.wait_timeout(TIMEOUT).expect("server stops");
    let orchestrator = remote
        .orchestrator
        .wait_timeout(TIMEOUT)
        .expect("orchestrator stops");
    assert!(
        server.success() && orchestrator.success(),
        "server {server}, orchestrator {orchestrator}\n{}",
        remote.logs(machines)
    );
    let logs = remote.logs(machines);
    assert!(
        logs.contains("orchestrator connected") && logs.contains("transport=\"UCX\""),
        "{logs}"
    );
}

/// The orchestrator's machine loses it under load: the client is told of the requests it
/// lost, the server stays up, and a new orchestrator on that machine serves clients again.
fn the_server_outlives_its_orchestrator_and_serves_the_next_across_machines(machines: &Machines) {
    let mut remote = Remote::start(machines, "killed");
    let running = std::thread::scope(|scope| {
        let port = remote.port;
        let client = scope.spawn(move || client(machines, port, 2, u64::MAX / 8, "xyz", "zyx", 64));
        std::thread::sleep(Duration::from_millis(500));
        let _ = remote.orchestrator.0.kill();
        client.join().unwrap()
    });
    assert_eq!(running.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&running.stderr);
    assert!(
        stderr.contains("the server closed the connection after")
            && stderr.contains("it lost the requests in flight when its orchestrator went away"),
        "{stderr}"
    );
    let _ = remote.orchestrator.0.wait();
    assert!(
        remote.server.0.try_wait().unwrap().is_none(),
        "the server ended with its orchestrator\n{}",
        remote.logs(machines)
    );
    let channel = machines
        .log(&remote.logs.0)
        .split("gpu-offload-orchestrator -c ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .map(str::to_owned)
        .expect("the server names its channel");
    remote.orchestrator = ChildGuard(
        machines
            .command(ORCHESTRATOR_NS, SERVER_NS, ORCHESTRATOR)
            .args(["-c", &channel, "-t", "2"])
            .args(["--max-message-length", MAX_LEN])
            .stdout(Stdio::null())
            .stderr(log_file(machines, "killed-second-orchestrator.log"))
            .spawn()
            .expect("starting the second orchestrator"),
    );
    let output = client(machines, remote.port, 2, 200, "again", "niaga", 8);
    common::assert_client_ok(&output, 400, &remote.logs(machines));
    remote.server.signal(common::SIGINT);
    let server = remote.server.wait_timeout(TIMEOUT).expect("server stops");
    let orchestrator = remote
        .orchestrator
        .wait_timeout(TIMEOUT)
        .expect("orchestrator stops");
    assert!(
        server.success() && orchestrator.success(),
        "server {server}, orchestrator {orchestrator}\n{}",
        remote.logs(machines)
    );
    let log = machines.log(&remote.logs.0);
    assert!(
        log.contains("the orchestrator went away")
            && log.contains("a new orchestrator connected; serving again"),
        "{log}"
    );
}

/// Two data-path threads against three processor threads, across machines: both refuse with
/// the same message naming both counts.
fn a_thread_count_mismatch_is_a_clear_error_on_both_machines(machines: &Machines) {
    let channel = machines.channel();
    let [a, b] = common::two_cpus();
    let server = ChildGuard(
        machines
            .command(SERVER_NS, ORCHESTRATOR_NS, SERVER)
            .args(["-c", &channel, "-p", "0"])
            .args(["--cpu", &a.to_string(), "--cpu", &b.to_string()])
            .stdout(Stdio::null())
            .stderr(log_file(machines, "mismatch-server.log"))
            .spawn()
            .unwrap(),
    );
    let orchestrator = machines
        .command(ORCHESTRATOR_NS, SERVER_NS, ORCHESTRATOR)
        .args(["-c", &channel, "-t", "3"])
        .output()
        .unwrap();
    let mut server = server;
    let status = server
        .wait_timeout(TIMEOUT)
        .expect("the server did not exit");
    assert_thread_count_mismatch(status, &machines.log("mismatch-server.log"), &orchestrator);
}

/// An orchestrator whose server is not there gives up after --connect-timeout, naming the
/// address.
fn an_orchestrator_with_no_server_says_so(machines: &Machines) {
    let channel = machines.channel();
    let started = Instant::now();
    let output = machines
        .command(ORCHESTRATOR_NS, SERVER_NS, ORCHESTRATOR)
        .args(["-c", &channel, "-t", "1", "--connect-timeout", "1"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("no server on channel {channel}"))
            && stderr.contains("start the server first"),
        "{stderr}"
    );
    assert!(started.elapsed() >= Duration::from_secs(1), "{stderr}");
}
