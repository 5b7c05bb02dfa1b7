//! Restarts over UCX (`-c ucx://IP:PORT`), the server in one network namespace and the
//! orchestrator and the clients in a second: a server killed under load is restarted on the
//! same address at once, every time, although the connections of its earlier run hold the
//! port in TCP TIME-WAIT; a server that cannot listen names the real cause. Skips with a
//! printed reason when not root or `ip` is missing.
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

#[test]
fn a_server_killed_under_load_is_restarted_on_the_same_ucx_address_every_time() {
    let network = match Network::create("gpurst", 2) {
        Ok(network) => network,
        Err(why) => {
            urom_testkit::skip(&why);
            return;
        }
    };
    let machines = Machines {
        network,
        dir: TempDir::new("gpu-offload-restart"),
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
