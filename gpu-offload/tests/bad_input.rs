//! Bad input: each offending client is disconnected with a log line, the server stays up and
//! everybody else is served.

mod common;

use std::io::Write;
use std::time::Duration;

use common::*;

/// A client that sends `bytes` must be disconnected while a well-behaved one is served.
fn refused(stack: &Stack, bytes: &[u8], log_says: &str) {
    let mut bad = stack.connect();
    let mut good = stack.connect();
    bad.write_all(bytes).unwrap();
    assert!(
        closed_by_server(&mut bad),
        "the server kept a client that sent {bytes:?}"
    );
    good.write_all(&request_frame(b"still here")).unwrap();
    assert_eq!(read_exactly(&mut good, 22), frame(5, b"ereh llits"));
    let deadline = std::time::Instant::now() + TIMEOUT;
    while !stack.server_log().contains(log_says) {
        assert!(
            std::time::Instant::now() < deadline,
            "no `{log_says}` in\n{}",
            stack.server_log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn offending_clients_are_dropped_and_others_served() {
    let stack = Stack::two_threads();

    // wire_size claims 12 + 257 bytes with --max-message-length 256.
    let mut oversized = vec![0, 0, 1, 13, 0, 0, 0, 4, 0, 0, 1, 1];
    oversized.extend([b'x'; 257]);
    refused(
        &stack,
        &oversized,
        "a request with a payload of 257 bytes exceeds --max-message-length 256",
    );

    // msg_id 99 is no message.
    refused(
        &stack,
        &[0, 0, 0, 12, 0, 0, 0, 99, 0, 0, 0, 0],
        "unknown GPU offload message id 99",
    );

    // A well-formed client_response is not a request.
    refused(&stack, &frame(5, b"AB"), "other than client_request");

    // The length word disagrees with wire_size.
    refused(
        &stack,
        &[0, 0, 0, 16, 0, 0, 0, 4, 0, 0, 0, 9, 1, 2, 3, 4],
        "its payload length field (bytes 8 to 11) says 9 bytes, but its wire_size leaves 4",
    );

    // wire_size below the header.
    refused(
        &stack,
        &[0, 0, 0, 4, 0, 0, 0, 4],
        "a request's wire_size (its first 4 bytes) says 4 bytes, less than its 12-byte header",
    );

    // A start_shutdown (always 8 bytes) whose wire_size says 9.
    refused(
        &stack,
        &[0, 0, 0, 9, 0, 0, 0, 1, 0],
        "a message's wire_size (its first 4 bytes) says 9 bytes, but a message of its msg_id is \
         always 8",
    );

    stack.stop_with(SIGINT, true);
}

#[test]
fn a_truncated_frame_is_logged_and_its_client_closed() {
    let stack = Stack::two_threads();
    let mut truncated = stack.connect();
    truncated
        .write_all(&request_frame(b"abcdefgh")[..14])
        .unwrap();
    truncated.shutdown(std::net::Shutdown::Write).unwrap();
    assert!(closed_by_server(&mut truncated));
    round_trip(&stack, b"after truncation");
    let deadline = std::time::Instant::now() + TIMEOUT;
    while !stack
        .server_log()
        .contains("closed in the middle of a message")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            stack.server_log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    stack.stop_with(SIGINT, true);
}

#[test]
fn a_slow_loris_blocks_nobody() {
    // One data-path thread, so the slow client and the others share it.
    let stack = Stack::start(&two_cpus()[..1], 1, &[], &[]);
    let mut loris = stack.connect();
    let slow = request_frame(b"drip drip");
    // Half a frame, then a full client run on the same thread, then the rest byte by byte.
    loris.write_all(&slow[..5]).unwrap();
    let output = run_client(stack.port, 4, 2_000, "fast", "tsaf", 32);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for byte in &slow[5..] {
        loris.write_all(&[*byte]).unwrap();
        round_trip(&stack, b"meanwhile");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(read_exactly(&mut loris, slow.len()), frame(5, b"pird pird"));
    stack.stop_with(SIGINT, true);
}

#[test]
fn a_client_that_never_reads_blocks_nobody() {
    let stack = Stack::start(
        &two_cpus()[..1],
        1,
        &["--max-concurrent-messages", "8"],
        &[],
    );
    let mut hog = stack.connect();
    // Far more requests than the server may hold answers for; their answers are never read.
    let burst: Vec<u8> = request_frame(&[7u8; 200]).repeat(20_000);
    let writer = std::thread::spawn(move || {
        let _ = hog.set_write_timeout(Some(Duration::from_secs(5)));
        let _ = hog.write_all(&burst);
        hog
    });
    std::thread::sleep(Duration::from_millis(300));
    let output = run_client(stack.port, 2, 1_000, "ok", "ko", 8);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    drop(writer.join().unwrap());
    stack.stop_with(SIGINT, true);
}

#[test]
fn a_processor_that_answers_wrongly_costs_only_that_client() {
    use std::process::{Command, Stdio};
    use std::sync::atomic::AtomicBool;

    use gpu_offload::channel::{self, ChannelParams};
    use gpu_offload::orchestrator::cpu::reverse_frame;
    use urom_transport::Transport;

    let dir = urom_testkit::TempDir::new("gpu-offload-fake-processor");
    let socket = socket_path(&dir);
    let log = dir.path().join("server.log");
    let mut server = urom_testkit::ChildGuard(
        Command::new(SERVER)
            .args(["-c", socket.to_str().unwrap(), "-p", "0", "-a", "127.0.0.1"])
            .args(["--cpu", &two_cpus()[0].to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
            .spawn()
            .unwrap(),
    );
    // A processor of our own on the server's channel: the first frame gets a request back
    // instead of a response, the others their right answers.
    let params = ChannelParams {
        threads: 1,
        max_message_length: 256,
        max_concurrent: 128,
    };
    let endpoint = channel::Endpoint::Local(socket);
    let channel = channel::connect(&endpoint, &params, TIMEOUT, &AtomicBool::new(false)).unwrap();
    let mut conn = channel.data.into_channels().pop().unwrap();
    std::thread::spawn(move || {
        let mut out = vec![0u8; conn.max_msg_size().as_u32() as usize];
        let mut first = true;
        while conn.wait_recv(TIMEOUT).is_ok() {
            let len = match conn.recv() {
                Ok(Some(frame)) if first => {
                    out[..frame.len()].copy_from_slice(frame);
                    frame.len()
                }
                Ok(Some(frame)) => reverse_frame(frame, &mut out, 256).unwrap(),
                _ => continue,
            };
            first = false;
            if conn.send(&out[..len]).is_err() {
                return;
            }
        }
    });
    let stdout = server.0.stdout.take().unwrap();
    let line = std::io::BufRead::lines(std::io::BufReader::new(stdout))
        .next()
        .unwrap()
        .unwrap();
    let port: u16 = line.rsplit(':').next().unwrap().parse().unwrap();
    let connect = || {
        let stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream.set_read_timeout(Some(TIMEOUT)).unwrap();
        stream
    };
    let mut victim = connect();
    victim.write_all(&request_frame(b"first")).unwrap();
    assert!(closed_by_server(&mut victim));
    let mut other = connect();
    other.write_all(&request_frame(b"second")).unwrap();
    assert_eq!(read_exactly(&mut other, 18), frame(5, b"dnoces"));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("the orchestrator sent a malformed response"),
        "{text}"
    );
    drop(channel.control);
}

#[test]
fn requests_before_a_bad_one_are_answered_then_the_client_closed() {
    let stack = Stack::two_threads();
    let mut oversized = vec![0, 0, 1, 13, 0, 0, 0, 4, 0, 0, 1, 1];
    oversized.extend([b'x'; 257]);
    // One request, and more than a thread may have in flight (128), each followed by the bad
    // message in the same write.
    for count in [1usize, 3, 500] {
        let mut stream = stack.connect();
        let mut bytes = request_frame(b"valid").repeat(count);
        bytes.extend_from_slice(&oversized);
        stream.write_all(&bytes).unwrap();
        let answer = frame(5, b"dilav");
        let answers = read_exactly(&mut stream, answer.len() * count);
        assert!(
            answers.chunks(answer.len()).all(|a| a == answer),
            "{count} requests: a wrong answer"
        );
        assert!(
            closed_by_server(&mut stream),
            "{count} requests: the client was not closed after its answers"
        );
    }
    assert!(
        stack
            .server_log()
            .contains("payload of 257 bytes exceeds --max-message-length 256"),
        "{}",
        stack.server_log()
    );
    stack.stop_with(SIGINT, true);
}
