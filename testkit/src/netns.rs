//! Machines in one: network namespaces joined by veth pairs, with addresses that exist only
//! inside them.
//!
//! [`Network::create`] makes `n` namespaces; namespace 0 is the hub, joined to each other one
//! by a pair of its own (subnet `198.18.(76+i).0/24` of the benchmarking range, RFC 2544, which
//! is never routed: the hub side is `.1`, the other `.2`).
//! So "two machines" are namespaces 0 and 1, and clients on a third machine sit in namespace 2.
//! Not link-local addresses: newer UCX (1.22) leaves out a device whose only IPv4 address is
//! link-local, and with a second address on the device, UCX 1.22's client-server connections
//! between the two addresses stall (each side waits for the other to connect).
//! Everything is deleted when the [`Network`] is dropped. Creating namespaces needs root and
//! `ip`; without them, `create` says why so that the test can print it and skip.

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

/// Namespaces joined to a hub.
pub struct Network {
    names: Vec<String>,
}

impl Network {
    /// `n` (2 or more) namespaces named after `tag` and this process, or why they cannot be
    /// made here.
    pub fn create(tag: &str, n: usize) -> Result<Self, String> {
        assert!((2..=100).contains(&n), "between 2 and 100 machines");
        if !nix::unistd::geteuid().is_root() {
            return Err("network namespaces need root".into());
        }
        if Command::new("ip")
            .arg("-V")
            .stdout(Stdio::null())
            .status()
            .is_err()
        {
            return Err("the `ip` program (iproute2) is not installed".into());
        }
        let pid = std::process::id();
        let network = Self {
            names: (0..n).map(|i| format!("urom-{tag}-{pid}-{i}")).collect(),
        };
        for name in &network.names {
            ip(&["netns", "add", name])?;
            ip(&["-n", name, "link", "set", "lo", "up"])?;
        }
        let hub = &network.names[0];
        for (i, name) in network.names.iter().enumerate().skip(1) {
            let (hub_end, end) = (format!("hub{i}"), format!("eth{i}"));
            ip(&[
                "link", "add", &hub_end, "netns", hub, "type", "veth", "peer", "name", &end,
                "netns", name,
            ])?;
            ip(&[
                "-n",
                hub,
                "addr",
                "add",
                &format!("{}/24", network.hub_address(i)),
                "dev",
                &hub_end,
            ])?;
            ip(&[
                "-n",
                name,
                "addr",
                "add",
                &format!("{}/24", network.address(i)),
                "dev",
                &end,
            ])?;
            ip(&["-n", hub, "link", "set", &hub_end, "up"])?;
            ip(&["-n", name, "link", "set", &end, "up"])?;
        }
        // The kernel reports a new link up a moment later, and UCX leaves out devices that are
        // not up yet.
        for (i, name) in network.names.iter().enumerate().skip(1) {
            wait_until_up(hub, &network.device(0, i))?;
            wait_until_up(name, &network.device(i, 0))?;
        }
        Ok(network)
    }

    /// The hub's address on its link to namespace `i`.
    pub fn hub_address(&self, i: usize) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, 76 + i as u8, 1)
    }

    /// Namespace `i`'s address (on its link to the hub).
    pub fn address(&self, i: usize) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, 76 + i as u8, 2)
    }

    /// The name of namespace `i`.
    pub fn name(&self, i: usize) -> &str {
        &self.names[i]
    }

    /// The device of namespace `i` that leads to the hub (`eth<i>`), or, for the hub, the one
    /// that leads to namespace `towards`.
    pub fn device(&self, i: usize, towards: usize) -> String {
        if i == 0 {
            format!("hub{towards}")
        } else {
            format!("eth{i}")
        }
    }

    /// Runs `f` on a thread of its own inside namespace `i` (sockets it opens live there).
    pub fn run_in<T: Send>(&self, i: usize, f: impl FnOnce() -> T + Send) -> T {
        let path = format!("/run/netns/{}", self.names[i]);
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let namespace = std::fs::File::open(&path)
                        .unwrap_or_else(|e| panic!("cannot open {path}: {e}"));
                    nix::sched::setns(namespace, nix::sched::CloneFlags::CLONE_NEWNET)
                        .unwrap_or_else(|e| panic!("cannot enter {path}: {e}"));
                    f()
                })
                .join()
                .expect("the thread in the namespace panicked")
        })
    }

    /// `program` to be run inside namespace `i`.
    pub fn command(&self, i: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.names[i]]).arg(program);
        command
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        // Deleting a namespace deletes its ends of the pairs, and so the pairs.
        for name in &self.names {
            let _ = ip(&["netns", "del", name]);
        }
    }
}

/// Waits until `device` in namespace `namespace` is up, at most 10 s.
fn wait_until_up(namespace: &str, device: &str) -> Result<(), String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let output = Command::new("ip")
            .args(["-n", namespace, "-o", "link", "show", "dev", device])
            .output()
            .map_err(|e| format!("cannot run ip: {e}"))?;
        if String::from_utf8_lossy(&output.stdout).contains("state UP") {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            return Err(format!("{device} in {namespace} did not come up"));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Runs `ip` with `args`; its error output on failure.
fn ip(args: &[&str]) -> Result<(), String> {
    let output = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_machines_reach_each_other_only_inside_their_namespaces() {
        let network = match Network::create("selftest", 2) {
            Ok(network) => network,
            Err(why) => {
                crate::skip(&why);
                return;
            }
        };
        let hub = network.hub_address(1);
        let listener = network.run_in(0, || std::net::TcpListener::bind((hub, 0)).unwrap());
        let port = listener.local_addr().unwrap().port();
        network.run_in(1, || {
            std::net::TcpStream::connect((hub, port)).expect("namespace 1 reaches the hub")
        });
        listener.accept().expect("the hub sees the connection");
        assert!(
            std::net::TcpListener::bind((hub, 0)).is_err(),
            "the hub's address exists only inside the namespaces"
        );
        let names: Vec<String> = (0..2).map(|i| network.name(i).to_owned()).collect();
        drop(network);
        let list = Command::new("ip").args(["netns", "list"]).output().unwrap();
        let list = String::from_utf8_lossy(&list.stdout);
        for name in names {
            assert!(!list.contains(&name), "{name} was left behind");
        }
    }
}
