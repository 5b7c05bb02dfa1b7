//! Faults of the server's own making: descriptors kept after clients leave, spinning when it
//! runs out of descriptors.

mod common;

use std::io::{Read, Write};
use std::net::Shutdown;
use std::time::{Duration, Instant};

use common::*;

/// How many descriptors process `pid` has open.
fn open_descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("reading the server's descriptors")
        .count()
}

/// Waits until process `pid` has `want` descriptors open; returns the last count seen.
fn settle_descriptors(pid: u32, want: usize) -> usize {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let now = open_descriptors(pid);
        if now == want || Instant::now() > deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn clients_that_half_close_get_every_answer_then_eof_and_are_released() {
    let stack = Stack::two_threads();
    let pid = stack.server.0.id();
    let before = open_descriptors(pid);
    // Bursts beyond the requests a thread may have in flight (128), so the end of file arrives
    // while the server holds the client back.
    for (round, count) in [700usize, 1_000, 5_000, 1].into_iter().enumerate() {
        let mut stream = stack.connect();
        let burst = request_frame(b"half-closed").repeat(count);
        let mut writer = stream.try_clone().unwrap();
        let sending = std::thread::spawn(move || {
            writer.write_all(&burst).unwrap();
            writer.shutdown(Shutdown::Write).unwrap();
        });
        let answer = frame(5, b"desolc-flah");
        let answers = read_exactly(&mut stream, answer.len() * count);
        sending.join().unwrap();
        assert!(
            answers.chunks(answer.len()).all(|a| a == answer),
            "round {round}: a wrong answer"
        );
        let mut rest = [0u8; 64];
        assert_eq!(
            stream
                .read(&mut rest)
                .unwrap_or_else(|e| panic!("round {round}: no end of file: {e}")),
            0,
            "round {round}: more than {count} answers"
        );
    }
    let after = settle_descriptors(pid, before);
    assert_eq!(
        after, before,
        "the server kept descriptors of clients that had left"
    );
    stack.stop_with(SIGINT, true);
}
