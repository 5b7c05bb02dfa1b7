//! What idle host connections cost a daemon: its threads and resident memory with 0, then more
//! and more connections open (each authenticated, then idle), and how long `urom-ctl status`
//! takes meanwhile.
//!
//! `idle_connections DAEMON URON_CTL COUNT...` starts DAEMON with an empty plugin directory,
//! opens connections until COUNT are open for each COUNT in turn, and prints one line per
//! COUNT; then closes them all and prints the daemon's threads again. Run it with an open-file
//! limit above the largest COUNT (as root: `ulimit -n 65536` first).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use urom_testkit::TempDir;
use urom_testkit::control::ControlClient;
use urom_testkit::daemon::start_daemon;

fn status_value(pid: i32, key: &str) -> String {
    urom_testkit::process::status_line(pid, key).unwrap_or_default()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [daemon_bin, ctl, counts @ ..] = args.as_slice() else {
        eprintln!("usage: idle_connections DAEMON UROM_CTL COUNT...");
        std::process::exit(2);
    };
    let plugins = TempDir::new("urom-idle-plugins");
    let daemon = start_daemon(
        PathBuf::from(daemon_bin),
        plugins.path().to_str().unwrap(),
        &[],
        true,
    );
    let pid = daemon.pid();
    let mut open = Vec::new();
    let measure = |open: usize| {
        std::thread::sleep(Duration::from_millis(500));
        let mut times: Vec<Duration> = (0..5)
            .map(|_| {
                let start = Instant::now();
                let output = Command::new(ctl)
                    .arg("status")
                    .arg("--socket")
                    .arg(&daemon.socket)
                    .output()
                    .unwrap();
                assert!(output.status.success(), "{output:?}");
                start.elapsed()
            })
            .collect();
        times.sort();
        println!(
            "connections {open:>6}  threads {:>6}  rss {:>10}  status median {:.1?} max {:.1?}",
            status_value(pid, "Threads"),
            status_value(pid, "VmRSS"),
            times[2],
            times[4]
        );
    };
    for count in counts {
        let count: usize = count.parse().expect("a count");
        while open.len() < count {
            let mut client =
                ControlClient::connect(&daemon.socket, Duration::from_secs(10)).unwrap();
            client.handshake().unwrap();
            open.push(client);
        }
        measure(open.len());
    }
    open.clear();
    std::thread::sleep(Duration::from_secs(2));
    println!(
        "closed all: threads {}  rss {}",
        status_value(pid, "Threads"),
        status_value(pid, "VmRSS")
    );
}
