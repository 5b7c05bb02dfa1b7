//! Flags that cannot work are refused when a program starts, before it waits for its peer,
//! with a message that names what would work.

mod common;

use std::io::Write;
use std::process::{Command, Output, Stdio};

use common::*;
use urom_testkit::ChildGuard;

/// Runs `program` with `args` on a channel nobody else uses; it must exit on its own.
fn run_alone(program: &str, args: &[&str]) -> Output {
    let dir = urom_testkit::TempDir::new("gpu-offload-flags");
    let socket = socket_path(&dir);
    let mut child = ChildGuard(
        Command::new(program)
            .args(["-c", socket.to_str().unwrap()])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let status = child.wait_timeout(TIMEOUT);
    assert!(
        status.is_some(),
        "{program} {args:?} went on waiting for its peer"
    );
    let mut output = Output {
        status: status.unwrap(),
        stdout: Vec::new(),
        stderr: Vec::new(),
    };
    use std::io::Read;
    let _ = child
        .0
        .stdout
        .take()
        .unwrap()
        .read_to_end(&mut output.stdout);
    let _ = child
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_end(&mut output.stderr);
    output
}

fn assert_refused(output: &Output, says: &[&str]) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    for words in says {
        assert!(stderr.contains(words), "no `{words}` in\n{stderr}");
    }
}

#[test]
fn a_message_length_beyond_the_wire_is_refused_at_start_naming_the_largest() {
    let cpu = two_cpus()[0].to_string();
    let length = "16777205";
    let server = run_alone(
        SERVER,
        &["-p", "0", "--cpu", &cpu, "--max-message-length", length],
    );
    let orchestrator = run_alone(
        ORCHESTRATOR,
        &[
            "-t",
            "1",
            "--connect-timeout",
            "5",
            "--max-message-length",
            length,
        ],
    );
    for output in [server, orchestrator] {
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains("--max-message-length") && stderr.contains("0..=16777204"),
            "{stderr}"
        );
    }
}

#[test]
fn the_largest_message_length_works_with_the_default_requests_in_flight() {
    let largest = "16777204";
    let stack = Stack::start(
        &two_cpus()[..1],
        1,
        &["--max-message-length", largest],
        &["--max-message-length", largest],
    );
    round_trip(&stack, b"small");
    let payload: Vec<u8> = (0..16_777_204u32).map(|i| (i % 251) as u8).collect();
    let mut stream = stack.connect();
    let request = request_frame(&payload);
    let mut writer = stream.try_clone().unwrap();
    let sending = std::thread::spawn(move || writer.write_all(&request).unwrap());
    let reversed: Vec<u8> = payload.iter().rev().copied().collect();
    let want = frame(5, &reversed);
    assert!(
        read_exactly(&mut stream, want.len()) == want,
        "a wrong answer"
    );
    sending.join().unwrap();
    stack.stop_with(SIGINT, true);
}

#[test]
fn an_unusable_cpu_or_a_busy_port_is_refused_at_start() {
    for cpu in ["99999999999", "1000000"] {
        let server = run_alone(SERVER, &["-p", "0", "--cpu", cpu]);
        assert_refused(
            &server,
            &[&format!(
                "--cpu {cpu} cannot be used: this process may run only on CPUs"
            )],
        );
        let orchestrator = run_alone(
            ORCHESTRATOR,
            &["-t", "1", "--cpu", cpu, "--connect-timeout", "5"],
        );
        assert_refused(
            &orchestrator,
            &[&format!(
                "--cpu {cpu} cannot be used: this process may run only on CPUs"
            )],
        );
    }
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port().to_string();
    let cpu = two_cpus()[0].to_string();
    let server = run_alone(SERVER, &["-p", &port, "-a", "127.0.0.1", "--cpu", &cpu]);
    assert_refused(
        &server,
        &[&format!("cannot listen on 127.0.0.1:{port}"), "in use"],
    );
}

#[test]
fn each_program_says_what_it_waits_for() {
    let dir = urom_testkit::TempDir::new("gpu-offload-waiting");
    let socket = socket_path(&dir);
    let cpu = two_cpus()[0].to_string();
    for (program, args, says) in [
        (
            SERVER,
            vec!["-p", "0", "--cpu", &cpu],
            "waiting for the orchestrator: gpu-offload-orchestrator -c",
        ),
        (
            ORCHESTRATOR,
            vec!["-t", "1"],
            "waiting for the server (gpu-offload-server -c",
        ),
    ] {
        let log = dir.path().join("log");
        let _child = ChildGuard(
            Command::new(program)
                .args(["-c", socket.to_str().unwrap()])
                .args(&args)
                .stdout(Stdio::null())
                .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
                .spawn()
                .unwrap(),
        );
        let deadline = std::time::Instant::now() + TIMEOUT;
        while !read(&log).contains(says) {
            assert!(
                std::time::Instant::now() < deadline,
                "no `{says}` in\n{}",
                read(&log)
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

#[test]
fn a_ucx_channel_that_cannot_work_is_refused_at_start() {
    let cpu = two_cpus()[0].to_string();
    // A name that starts like a UCX address must be one.
    let output = run_alone(SERVER, &["-p", "0", "--cpu", &cpu, "-c", "ucx://dpu:7000"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("ucx://dpu:7000") && stderr.contains("ucx://IP:PORT"),
        "{stderr}"
    );
    #[cfg(not(feature = "ucx"))]
    for (program, args) in [
        (SERVER, vec!["-p", "0", "--cpu", &cpu]),
        (ORCHESTRATOR, vec!["-t", "1"]),
    ] {
        let mut args = args;
        args.extend(["-c", "ucx://127.0.0.1:7000"]);
        assert_refused(
            &run_alone(program, &args),
            &["-c ucx://127.0.0.1:7000", "no UCX", "--features ucx"],
        );
    }
    // An address that is not this machine's (TEST-NET-1).
    #[cfg(feature = "ucx")]
    assert_refused(
        &run_alone(
            SERVER,
            &["-p", "0", "--cpu", &cpu, "-c", "ucx://192.0.2.1:7000"],
        ),
        &[
            "channel ucx://192.0.2.1:7000: cannot listen for the orchestrator",
            "one of this machine's",
        ],
    );
}

#[test]
fn more_threads_than_the_orchestrator_runs_are_refused_at_start_by_both() {
    let cpu = two_cpus()[0].to_string();
    let mut args = vec!["-p", "0"];
    for _ in 0..1025 {
        args.extend(["--cpu", &cpu]);
    }
    let server = run_alone(SERVER, &args);
    assert_refused(
        &server,
        &["--cpu given 1025 times: at most 1024 data-path threads"],
    );
    let orchestrator = run_alone(ORCHESTRATOR, &["-t", "1025", "--connect-timeout", "5"]);
    let stderr = String::from_utf8_lossy(&orchestrator.stderr);
    assert!(
        !orchestrator.status.success() && stderr.contains("1..=1024"),
        "{stderr}"
    );
}

/// Bytes of this machine's memory, from `/proc/meminfo`.
fn memory_total() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let line = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

/// The virtual size of process `pid`, in bytes.
fn virtual_size(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmSize:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

#[test]
fn requests_in_flight_beyond_this_machines_memory_are_refused_at_start_naming_the_largest() {
    const LARGEST: &str = "16777204";
    let message = 16_777_216u64;
    let beyond = memory_total() / message + 1;
    if beyond > u64::from(gpu_offload::limits::MAX_CONCURRENT) {
        urom_testkit::skip(
            "this machine has memory for the most requests in flight that can be given",
        );
        return;
    }
    let cpu = two_cpus()[0].to_string();
    let beyond = beyond.to_string();
    let server = run_alone(
        SERVER,
        &["-p", "0", "--cpu", &cpu, "--max-message-length", LARGEST]
            .into_iter()
            .chain(["--max-concurrent-messages", &beyond])
            .collect::<Vec<_>>(),
    );
    assert_refused(&server, &["more than this machine's", "GiB of memory"]);
    let stderr = String::from_utf8_lossy(&server.stderr);
    let largest = stderr
        .split("at most --max-concurrent-messages ")
        .nth(1)
        .and_then(|rest| rest.trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no largest named in\n{stderr}"));
    // The largest named is served: clients get memory for what they have in flight only.
    let largest = largest.to_string();
    let flags = [
        "--max-message-length",
        LARGEST,
        "--max-concurrent-messages",
        &largest,
    ];
    let stack = Stack::start(&two_cpus()[..1], 1, &flags, &flags);
    round_trip(&stack, b"first");
    let before = virtual_size(stack.server.0.id());
    let mut clients: Vec<_> = (0..8).map(|_| stack.connect()).collect();
    for (i, client) in clients.iter_mut().enumerate() {
        client
            .write_all(&request_frame(format!("client {i}").as_bytes()))
            .unwrap();
        let want = frame(5, format!("{i} tneilc").as_bytes());
        assert_eq!(read_exactly(client, want.len()), want);
    }
    let grown = virtual_size(stack.server.0.id()).saturating_sub(before);
    println!(
        "--max-concurrent-messages {largest} x --max-message-length {LARGEST}: 8 clients of one \
         small request each grew the server by {} KiB of virtual memory",
        grown / 1024
    );
    assert!(grown < 1 << 30, "8 small clients took {grown} bytes");
    let payload: Vec<u8> = (0..16_777_204u32).map(|i| (i % 251) as u8).collect();
    let mut stream = stack.connect();
    let request = request_frame(&payload);
    let mut writer = stream.try_clone().unwrap();
    let sending = std::thread::spawn(move || writer.write_all(&request).unwrap());
    let want = frame(5, &payload.iter().rev().copied().collect::<Vec<_>>());
    assert!(
        read_exactly(&mut stream, want.len()) == want,
        "a wrong answer"
    );
    sending.join().unwrap();
    drop(clients);
    stack.stop_with(SIGINT, true);
}
