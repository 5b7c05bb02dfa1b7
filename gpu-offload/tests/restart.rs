//! Restarts over UCX (`-c ucx://IP:PORT`), the server in one network namespace and the
//! orchestrator and the clients in a second: a server killed under load is restarted on the
//! same address at once, every time, although the connections of its earlier run hold the
//! port in TCP TIME-WAIT; a server that cannot listen names the real cause; UCX's own log
//! lines go to stderr, not to stdout where scripts read. Skips with a printed reason when not
//! root or `ip` is missing.
#![cfg(feature = "ucx")]

mod common;

use std::fs::File;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{CLIENT, ORCHESTRATOR, SERVER, TIMEOUT, listening_port, read};
use urom_testkit::netns::Network;
use urom_testkit::{ChildGuard, TempDir};

const SERVER_NS: usize = 0;
const HOST_NS: usize = 1;

struct Machines {
    network: Network,
    dir: TempDir,
}

impl Machines {
    /// `program` on machine `ns`, UCX on TCP over the link between the two.
    fn command(&self, ns: usize, program: &str) -> Command {
        let mut command = self.network.command(ns, program);
        let towards = if ns == SERVER_NS { HOST_NS } else { SERVER_NS };
        command
            .env("UCX_TLS", "tcp")
            .env("UCX_NET_DEVICES", self.network.device(ns, towards))
            .env("UCX_WARN_UNUSED_ENV_VARS", "n");
        command
    }

    fn log_file(&self, name: &str) -> Stdio {
        Stdio::from(File::create(self.dir.path().join(name)).unwrap())
    }

    fn log(&self, name: &str) -> String {
        read(&self.dir.path().join(name))
    }

    /// A server on `channel`, its clients' port on the address the host reaches.
    fn server(&self, channel: &str, log: &str) -> Command {
        let mut server = self.command(SERVER_NS, SERVER);
        let cpu = common::two_cpus()[0].to_string();
        server
            .args(["-c", channel, "-p", "0", "--cpu", &cpu])
            .args(["-a", &self.network.hub_address(HOST_NS).to_string()])
            .stdout(Stdio::piped())
            .stderr(self.log_file(log));
        server
    }
}

/// Two machines, or why the test skips.
fn machines(tag: &str) -> Option<Machines> {
    match Network::create(tag, 2) {
        Ok(network) => Some(Machines {
            network,
            dir: TempDir::new("gpu-offload-restart"),
        }),
        Err(why) => {
            urom_testkit::skip(&why);
            None
        }
    }
}

#[test]
fn ucx_log_lines_go_to_stderr_and_stdout_keeps_only_what_scripts_read() {
    let Some(machines) = machines("gpulog") else {
        return;
    };
    let ip = machines.network.hub_address(HOST_NS);
    let channel = format!("ucx://{ip}:0");
    // An unknown UCX_* variable makes UCX warn in both programs.
    let mut server = ChildGuard(
        machines
            .server(&channel, "server.log")
            .env("UCX_GPU_OFFLOAD_TEST_UNKNOWN", "1")
            .env_remove("UCX_WARN_UNUSED_ENV_VARS")
            .spawn()
            .unwrap(),
    );
    let mut stdout = std::io::BufReader::new(server.0.stdout.take().unwrap());
    // Port 0 picks the channel's port: the server logs it.
    let deadline = std::time::Instant::now() + TIMEOUT;
    let channel = loop {
        let log = machines.log("server.log");
        if let Some(at) = log.find(&format!("ucx://{ip}:")) {
            let rest = &log[at..];
            let end = rest.find(|c: char| c.is_whitespace()).unwrap_or(rest.len());
            let found = rest[..end].to_owned();
            if !found.ends_with(":0") {
                break found;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no channel port in
{log}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let orchestrator = machines
        .command(HOST_NS, ORCHESTRATOR)
        .args(["-c", &channel, "-t", "1"])
        .env("UCX_GPU_OFFLOAD_TEST_UNKNOWN", "1")
        .env_remove("UCX_WARN_UNUSED_ENV_VARS")
        .stdout(Stdio::piped())
        .stderr(machines.log_file("orchestrator.log"))
        .spawn()
        .unwrap();
    let mut orchestrator = ChildGuard(orchestrator);
    use std::io::BufRead;
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    assert!(first.starts_with("listening on "), "{first:?}");
    let mut orchestrator_first = String::new();
    std::io::BufReader::new(orchestrator.0.stdout.take().unwrap())
        .read_line(&mut orchestrator_first)
        .unwrap();
    assert_eq!(orchestrator_first, "processing\n");
    server.signal(common::SIGINT);
    server.wait_timeout(TIMEOUT).expect("the server stops");
    orchestrator
        .wait_timeout(TIMEOUT)
        .expect("the orchestrator stops");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    assert_eq!(rest, "", "the server's stdout after `listening on`");
    for log in ["server.log", "orchestrator.log"] {
        let log = machines.log(log);
        assert!(
            log.contains("UCX_GPU_OFFLOAD_TEST_UNKNOWN") && log.contains("UCX  WARN"),
            "{log}"
        );
    }
}

#[test]
fn a_server_killed_under_load_is_restarted_on_the_same_ucx_address_every_time() {
    let Some(machines) = machines("gpurst") else {
        return;
    };
    let ip = machines.network.hub_address(HOST_NS);
    let port = machines.network.run_in(SERVER_NS, || {
        std::net::TcpListener::bind((ip, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    });
    let channel = format!("ucx://{ip}:{port}");
    let (mut time_wait_seen, rounds) = (0, 6);
    for round in 0..rounds {
        let log = format!("server-{round}.log");
        let orchestrator_log = format!("orchestrator-{round}.log");
        let mut server = ChildGuard(
            machines
                .server(&channel, &log)
                .spawn()
                .expect("starting the server"),
        );
        let mut orchestrator = ChildGuard(
            machines
                .command(HOST_NS, ORCHESTRATOR)
                .args(["-c", &channel, "-t", "1"])
                .stdout(Stdio::null())
                .stderr(machines.log_file(&orchestrator_log))
                .spawn()
                .expect("starting the orchestrator"),
        );
        let clients = listening_port(&mut server).unwrap_or_else(|| {
            panic!(
                "round {round}: the server restarted on {channel} never listened; its log:\n{}\n\
                 orchestrator:\n{}",
                machines.log(&log),
                machines.log(&orchestrator_log)
            )
        });
        if round == 0 {
            // A second server on the same channel while the first runs: the port is taken.
            let second = machines
                .server(&channel, "second-server.log")
                .stdout(Stdio::null())
                .output()
                .unwrap();
            let says = machines.log("second-server.log");
            assert_eq!(second.status.code(), Some(1), "{says}");
            assert!(
                says.contains("another program listens on that port")
                    && !says.contains("one of this machine's"),
                "{says}"
            );
        }
        if round == 1 {
            // A second orchestrator is told that the server has one.
            let second = machines
                .command(HOST_NS, ORCHESTRATOR)
                .args(["-c", &channel, "-t", "1"])
                .output()
                .unwrap();
            let says = String::from_utf8_lossy(&second.stderr);
            assert_eq!(second.status.code(), Some(1), "{says}");
            assert!(
                says.contains("the server on this channel already has an orchestrator"),
                "{says}"
            );
        }
        // Load, then a crash in the middle of it.
        let mut client = ChildGuard(
            machines
                .command(HOST_NS, CLIENT)
                .args(["-s", &ip.to_string(), "-p", &clients.to_string()])
                .args(["-t", "2", "-i", "100000000", "-m", "abc", "-e", "cba"])
                .args(["--max-concurrent-messages", "32"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        std::thread::sleep(Duration::from_millis(300));
        let _ = server.0.kill();
        let _ = server.0.wait();
        orchestrator
            .wait_timeout(TIMEOUT)
            .expect("the orchestrator did not notice its server's end");
        client
            .wait_timeout(TIMEOUT)
            .expect("the client did not end");
        // Told not to reuse the port, a server says why it cannot listen when TIME-WAIT holds
        // it (the kernel decides whether the crash left any).
        let refused = machines
            .server(&channel, "no-reuse.log")
            .env("UCX_TCP_CM_REUSEADDR", "n")
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let mut refused = ChildGuard(refused);
        if let Some(status) = refused.wait_timeout(Duration::from_secs(2)) {
            let says = machines.log("no-reuse.log");
            assert_eq!(status.code(), Some(1), "{says}");
            assert!(
                says.contains("connections of an earlier run still hold the port")
                    && says.contains("TIME-WAIT")
                    && !says.contains("one of this machine's"),
                "{says}"
            );
            time_wait_seen += 1;
        } else {
            let _ = refused.0.kill();
            let _ = refused.0.wait();
        }
    }
    println!(
        "{rounds} restarts on {channel} after a crash under load all listened; with \
         UCX_TCP_CM_REUSEADDR=n, {time_wait_seen} of them were refused naming TIME-WAIT"
    );
}
