//! The three programs as processes on loopback: every response validated, both shutdown
//! directions, a thread-count mismatch.

mod common;

use std::process::{Command, Stdio};

use common::*;

fn message_of(len: usize) -> String {
    (0..len).map(|i| (b'a' + (i % 26) as u8) as char).collect()
}

fn assert_client_ok(output: &std::process::Output, operations: u64, what: &str) {
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{what}: client failed: {}\n{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    for field in [
        "Duration:",
        "Data rate (Tx):",
        "Data rate (Rx):",
        "IO rate:",
        "MIOP/s",
    ] {
        assert!(stdout.contains(field), "{what}: no `{field}` in\n{stdout}");
    }
    assert!(
        stdout.contains(&format!("Operation count:   {operations}\n")),
        "{what}: wrong operation count in\n{stdout}"
    );
}

#[test]
fn clients_of_one_and_four_threads_get_every_response_right() {
    let stack = Stack::two_threads();
    for threads in [1u32, 4] {
        for pipeline in [1u32, 128] {
            for len in [0usize, 1, 2, 63, 64, 255, 256] {
                let message = message_of(len);
                let iterations = if pipeline == 1 { 50 } else { 1_000 };
                let output =
                    stack.client(threads, iterations, &message, &reversed(&message), pipeline);
                assert_client_ok(
                    &output,
                    u64::from(threads) * iterations,
                    &format!("{threads} threads, pipeline {pipeline}, {len} bytes"),
                );
            }
        }
    }
    // One byte over --max-message-length: the server drops that client, says why, serves on.
    let too_long = message_of(257);
    let output = stack.client(1, 1, &too_long, &reversed(&too_long), 1);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("closed the connection"), "{stderr}");
    let output = stack.client(2, 100, "ABCD", "DCBA", 8);
    assert_client_ok(&output, 200, "after a refused client");
    let log = stack.server_log();
    assert!(log.contains("malformed message from client"), "{log}");
    stack.stop_with(SIGINT, true);
}

#[test]
fn a_wrong_expected_response_fails_the_client_with_the_reason() {
    let stack = Stack::start(&[0], 1, &[], &[]);
    let output = stack.client(1, 10, "ABCD", "DCBX", 4);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("differs from the expected") && stderr.contains("at byte 3"),
        "{stderr}"
    );
    stack.stop_with(SIGTERM, true);
}

#[test]
fn ctrl_c_on_the_orchestrator_shuts_both_down_cleanly() {
    let stack = Stack::two_threads();
    let output = stack.client(2, 500, "hello", "olleh", 16);
    assert_client_ok(&output, 1_000, "before the shutdown");
    // A client in the middle of a long run: it is answered until the server drains, then its
    // connection is closed cleanly (end of file, not a reset or a timeout).
    let port = stack.port;
    let running = std::thread::spawn(move || run_client(port, 1, u64::MAX / 2, "xyz", "zyx", 64));
    std::thread::sleep(std::time::Duration::from_millis(500));
    stack.stop_with(SIGINT, false);
    let output = running.join().unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("the server closed the connection after"),
        "{stderr}"
    );
}

#[test]
fn ctrl_c_on_the_server_answers_what_is_in_flight_and_closes_cleanly() {
    let stack = Stack::two_threads();
    let port = stack.port;
    let running = std::thread::spawn(move || run_client(port, 2, u64::MAX / 4, "abc", "cba", 128));
    std::thread::sleep(std::time::Duration::from_millis(500));
    stack.stop_with(SIGINT, true);
    let output = running.join().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    // Every response received before the close was validated; the close itself is clean.
    assert!(
        stderr.contains("the server closed the connection after"),
        "{stderr}"
    );
}

#[test]
fn a_thread_count_mismatch_is_a_clear_error_on_both_sides() {
    let dir = urom_testkit::TempDir::new("gpu-offload-mismatch");
    let socket = socket_path(&dir);
    let [a, b] = two_cpus();
    let server = Command::new(SERVER)
        .args(["-c", socket.to_str().unwrap(), "-p", "0", "-a", "127.0.0.1"])
        .args(["--cpu", &a.to_string(), "--cpu", &b.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let server = urom_testkit::ChildGuard(server);
    let orchestrator = Command::new(ORCHESTRATOR)
        .args(["-c", socket.to_str().unwrap(), "-t", "3"])
        .output()
        .unwrap();
    let mut server = server;
    let status = server
        .wait_timeout(TIMEOUT)
        .expect("the server did not exit");
    let mut server_err = String::new();
    use std::io::Read;
    server
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut server_err)
        .unwrap();
    let orchestrator_err = String::from_utf8_lossy(&orchestrator.stderr);
    assert!(!status.success() && !orchestrator.status.success());
    for text in [&server_err[..], &orchestrator_err[..]] {
        assert!(
            text.contains("thread count mismatch: the server has 2 data-path threads")
                && text.contains("(-t 3)"),
            "{text}"
        );
    }
}

#[test]
fn the_cuda_processor_without_support_says_so_in_one_line() {
    let output = Command::new(ORCHESTRATOR)
        .args([
            "-t",
            "1",
            "--processor",
            "cuda",
            "-c",
            "/nonexistent/none.sock",
        ])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let line = stderr.lines().last().unwrap_or_default();
    assert!(line.contains("CUDA processor unavailable"), "{stderr}");
}

#[test]
fn bad_flags_name_the_flag() {
    let output = Command::new(SERVER).args(["-p", "1"]).output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--cpu"));
    let output = Command::new(CLIENT).args(["-v"]).output().unwrap();
    assert!(output.status.success());
    assert!(String::from_utf8_lossy(&output.stdout).contains("gpu-offload-client"));
}
