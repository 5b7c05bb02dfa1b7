//! The three programs as processes on loopback: every response validated, both shutdown
//! directions, a thread-count mismatch.

mod common;

use std::io::{Read, Write};
use std::process::{Command, Stdio};

use common::*;

#[test]
fn clients_of_one_and_four_threads_get_every_response_right() {
    let stack = Stack::two_threads();
    check_every_shape(&stack, &[0, 1, 2, 63, 64, 255, 256]);
    // One byte over --max-message-length: the server drops that client, says why, serves on.
    let too_long = message_of(257);
    let output = run_client(stack.port, 1, 1, &too_long, &reversed(&too_long), 1);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("the server closed the connection after 0 of 1 responses")
            && stderr.contains("still accepts connections")
            && stderr.contains("257-byte payloads"),
        "{stderr}"
    );
    let output = run_client(stack.port, 2, 100, "ABCD", "DCBA", 8);
    assert_client_ok(&output, 200, "after a refused client");
    let log = stack.server_log();
    assert!(
        log.contains("a request with a payload of 257 bytes exceeds --max-message-length 256"),
        "{log}"
    );
    stack.stop_with(SIGINT, true);
}

#[test]
fn a_wrong_expected_response_fails_the_client_with_the_reason() {
    let stack = Stack::start(&two_cpus()[..1], 1, &[], &[]);
    let output = run_client(stack.port, 1, 10, "ABCD", "DCBX", 4);
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
    let output = run_client(stack.port, 2, 500, "hello", "olleh", 16);
    assert_client_ok(&output, 1_000, "before the shutdown");
    // A client in the middle of a long run is answered until the server drains, then its
    // connection is closed cleanly (end of file, not a reset or a timeout).
    stack.stop_during_a_run(SIGINT, false, 1, 64);
}

#[test]
fn ctrl_c_on_the_client_ends_its_run_with_every_sent_request_answered() {
    let stack = Stack::two_threads();
    let client = Command::new(CLIENT)
        .args(["-s", "127.0.0.1", "-p", &stack.port.to_string()])
        .args(["-t", "2", "-i", &(u64::MAX / 8).to_string()])
        .args([
            "-m",
            "hello",
            "-e",
            "olleh",
            "--max-concurrent-messages",
            "32",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the client");
    let mut client = urom_testkit::ChildGuard(client);
    std::thread::sleep(std::time::Duration::from_millis(500));
    client.signal(SIGINT);
    let status = client
        .wait_timeout(std::time::Duration::from_secs(30))
        .expect("the client did not stop on Ctrl-C");
    assert_eq!(status.code(), Some(1));
    let (stdout, stderr) = finished_output(&mut client);
    assert!(
        stderr.contains("interrupted after") && stderr.contains("every one answered and checked"),
        "{stderr}"
    );
    let done: u64 = stdout
        .lines()
        .find_map(|line| line.strip_prefix("| Operation count:"))
        .and_then(|count| count.trim().parse().ok())
        .unwrap_or_else(|| panic!("no operation count in\n{stdout}"));
    assert!(done > 0, "{stdout}");
    stack.stop_with(SIGTERM, true);
}

#[test]
fn sigterm_on_the_server_answers_what_is_in_flight_and_closes_cleanly() {
    let stack = Stack::two_threads();
    // Every response received before the close was validated; the close itself is clean.
    stack.stop_during_a_run(SIGTERM, true, 2, 128);
}

#[test]
fn a_server_that_dies_makes_the_orchestrator_exit_with_an_error() {
    let mut stack = Stack::two_threads();
    let _ = stack.server.0.kill();
    let status = stack
        .orchestrator
        .wait_timeout(TIMEOUT)
        .expect("the orchestrator did not exit");
    assert_eq!(status.code(), Some(1));
    let log = stack.orchestrator_log();
    assert!(log.contains("the server went away"), "{log}");
}

#[test]
fn the_server_outlives_its_orchestrator_and_serves_the_next() {
    let mut stack = Stack::two_threads();
    let port = stack.port;
    // A client with requests in flight when the orchestrator dies loses those alone.
    let running = std::thread::spawn(move || run_client(port, 2, u64::MAX / 8, "xyz", "zyx", 64));
    // A client between requests keeps its connection.
    let mut idle = stack.connect();
    idle.write_all(&request_frame(b"before")).unwrap();
    assert_eq!(read_exactly(&mut idle, 18), frame(5, b"erofeb"));
    std::thread::sleep(std::time::Duration::from_millis(500));
    let _ = stack.orchestrator.0.kill();
    let _ = stack.orchestrator.0.wait();
    let output = running.join().unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("the server closed the connection after")
            && stderr.contains("requests sent unanswered")
            && stderr.contains("it lost the requests in flight when its orchestrator went away"),
        "{stderr}"
    );
    // No orchestrator: the server keeps listening, and requests wait.
    let mut waiting = stack.connect();
    idle.write_all(&request_frame(b"while alone")).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(
        stack.server.0.try_wait().unwrap().is_none(),
        "the server ended with its orchestrator:\n{}",
        stack.server_log()
    );
    // A new orchestrator: the waiting requests are answered, new clients served.
    let socket = socket_path(&stack.dir);
    stack.orchestrator = urom_testkit::ChildGuard(
        Command::new(ORCHESTRATOR)
            .args(["-c", socket.to_str().unwrap(), "-t", "2"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert_eq!(read_exactly(&mut idle, 23), frame(5, b"enola elihw"));
    let output = run_client(stack.port, 2, 500, "again", "niaga", 16);
    assert_client_ok(&output, 1_000, "with the new orchestrator");
    waiting.write_all(&request_frame(b"late")).unwrap();
    assert_eq!(read_exactly(&mut waiting, 16), frame(5, b"etal"));
    let log = stack.server_log();
    assert!(
        log.contains("the orchestrator went away")
            && log.contains("a new orchestrator connected; serving again"),
        "{log}"
    );
    drop((idle, waiting));
    stack.stop_with(SIGINT, true);
}

#[test]
fn requests_that_wait_too_long_for_a_new_orchestrator_end_their_client_alone() {
    let mut stack = Stack::two_threads();
    let mut idle = stack.connect();
    idle.write_all(&request_frame(b"before")).unwrap();
    assert_eq!(read_exactly(&mut idle, 18), frame(5, b"erofeb"));
    let _ = stack.orchestrator.0.kill();
    let _ = stack.orchestrator.0.wait();
    // A request sent while no orchestrator is there waits, then its client is let go.
    let mut waiting = stack.connect();
    let sent = std::time::Instant::now();
    waiting.write_all(&request_frame(b"alone")).unwrap();
    assert!(
        closed_by_server(&mut waiting),
        "a held request's client was not let go:\n{}",
        stack.server_log()
    );
    println!(
        "a held request's client was let go after {:?}",
        sent.elapsed()
    );
    // A client between requests keeps its connection, and the server its listener.
    idle.set_read_timeout(Some(std::time::Duration::from_millis(200)))
        .unwrap();
    let mut byte = [0u8; 1];
    let kept = matches!(
        idle.read(&mut byte),
        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
    );
    assert!(
        kept,
        "the idle client was let go too:\n{}",
        stack.server_log()
    );
    assert!(
        stack.server.0.try_wait().unwrap().is_none(),
        "{}",
        stack.server_log()
    );
    let log = stack.server_log();
    assert!(log.contains("the clients whose requests waited"), "{log}");
    drop((idle, waiting));
    stack.server.signal(SIGINT);
    let status = stack
        .server
        .wait_timeout(TIMEOUT)
        .expect("the server did not stop");
    assert!(status.success(), "server {status}:\n{}", stack.server_log());
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
    server
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut server_err)
        .unwrap();
    assert_thread_count_mismatch(status, &server_err, &orchestrator);
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

/// A server that accepts one client and never answers: it reads and drops what comes when
/// `reads`, else reads nothing. Returns its port and a receiver told the number of bytes read
/// (0 when it does not read) once the client is connected and has sent something.
fn stalled_server(reads: bool) -> (u16, std::sync::mpsc::Receiver<usize>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        if !reads {
            let _ = tx.send(0);
            // Hold the connection, unread, until the client is gone.
            std::thread::sleep(std::time::Duration::from_secs(120));
            return;
        }
        let mut buf = vec![0u8; 1 << 16];
        let mut total = 0;
        while let Ok(n) = stream.read(&mut buf) {
            if n == 0 {
                break;
            }
            total += n;
            let _ = tx.send(total);
        }
    });
    (port, rx)
}

#[test]
fn ctrl_c_stops_a_client_whose_server_stalls_printing_the_statistics() {
    // Blocked in a read (the server took the requests and never answers), and blocked in a
    // write (the server reads nothing, 64 requests of 60,000 bytes fill the socket).
    for (reads, signal, length, pipeline) in [(true, SIGINT, 5, 4), (false, SIGTERM, 60_000, 64)] {
        let (port, sent) = stalled_server(reads);
        let message = message_of(length);
        let client = Command::new(CLIENT)
            .args(["-s", "127.0.0.1", "-p", &port.to_string(), "-t", "1"])
            .args(["-i", "1000000", "-m", &message, "-e", &reversed(&message)])
            .args(["--max-concurrent-messages", &pipeline.to_string()])
            .args(["--response-timeout", "60"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting the client");
        let mut client = urom_testkit::ChildGuard(client);
        sent.recv_timeout(TIMEOUT)
            .expect("the client never connected or sent");
        std::thread::sleep(std::time::Duration::from_millis(300));
        let signalled = std::time::Instant::now();
        client.signal(signal);
        let status = client
            .wait_timeout(std::time::Duration::from_secs(5))
            .expect("the client did not stop within 5 s of the signal");
        let took = signalled.elapsed();
        println!(
            "stalled server ({}): the client stopped {} ms after the signal",
            if reads { "reading" } else { "not reading" },
            took.as_millis()
        );
        assert_eq!(status.code(), Some(1));
        let (stdout, stderr) = finished_output(&mut client);
        assert!(stdout.contains("| Operation count:   0\n"), "{stdout}");
        assert!(
            stderr.contains("interrupted after 0 of 1000000 requests")
                && stderr.contains("not answered within"),
            "{stderr}"
        );
    }
}

#[test]
fn the_reversed_bytes_of_a_non_ascii_message_can_be_expected_in_hex() {
    let stack = Stack::start(&two_cpus()[..1], 1, &[], &[]);
    let message = "héllo wörld ✓";
    let hex = |bytes: &mut dyn Iterator<Item = u8>| -> String {
        bytes.map(|b| format!("{b:02x}")).collect()
    };
    // The reversed bytes are no UTF-8: only hex can name them.
    let expected = format!("hex:{}", hex(&mut message.bytes().rev()));
    let output = run_client(stack.port, 1, 20, message, &expected, 4);
    assert_client_ok(&output, 20, "-m text, -e hex");
    let request = format!("hex:{}", hex(&mut [0u8, 0xff, 0x80, 7].into_iter()));
    let output = run_client(stack.port, 2, 20, &request, "hex:0780ff00", 4);
    assert_client_ok(&output, 40, "-m hex, -e hex");
    let output = run_client(stack.port, 1, 1, "abc", "hex:63626", 1);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.code() == Some(1) && stderr.contains("-e hex:...: an odd number"),
        "{stderr}"
    );
    stack.stop_with(SIGTERM, true);
}

#[test]
fn a_second_orchestrator_is_told_the_server_already_has_one() {
    let stack = Stack::start(&two_cpus()[..1], 1, &[], &[]);
    let socket = socket_path(&stack.dir);
    let second = Command::new(ORCHESTRATOR)
        .args(["-c", socket.to_str().unwrap(), "-t", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut second = urom_testkit::ChildGuard(second);
    let status = second
        .wait_timeout(TIMEOUT)
        .expect("the second orchestrator went on waiting");
    let mut stderr = String::new();
    second
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("the server on this channel already has an orchestrator"),
        "{stderr}"
    );
    // The first is untouched.
    let output = run_client(stack.port, 1, 100, "abc", "cba", 8);
    assert_client_ok(&output, 100, "after a second orchestrator");
    let log = stack.server_log();
    assert!(log.contains("another orchestrator connected"), "{log}");
    stack.stop_with(SIGTERM, true);
}
