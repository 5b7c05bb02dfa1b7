//! Faults of the server's own making: descriptors kept after clients leave, spinning when it
//! runs out of descriptors, clients that find every frame slot taken.

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

#[test]
fn clients_that_find_every_frame_slot_taken_wait_and_get_their_answers() {
    // One data-path thread with 128 requests in flight has 32 frame slots each way; 100 clients
    // of one request each need 100 frames, so while the orchestrator is stopped the ring fills
    // and the rest wait for slots, not for in-flight entries.
    const CLIENTS: usize = 100;
    let stack = Stack::start(&two_cpus()[..1], 1, &[], &[]);
    round_trip(&stack, b"warm");
    stack.orchestrator.signal(SIGSTOP);
    let mut streams: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let mut stream = stack.connect();
            stream
                .write_all(&request_frame(format!("client {i:03}").as_bytes()))
                .unwrap();
            stream
        })
        .collect();
    // Time for the server to take every request and fill the ring.
    std::thread::sleep(Duration::from_millis(300));
    stack.orchestrator.signal(SIGCONT);
    for (i, stream) in streams.iter_mut().enumerate() {
        let reversed: Vec<u8> = format!("client {i:03}").bytes().rev().collect();
        let want = frame(5, &reversed);
        assert_eq!(
            read_exactly(stream, want.len()),
            want,
            "client {i}: a wrong answer"
        );
    }
    stack.stop_with(SIGINT, true);
}

/// The CPU time (user and system) process `pid` has used.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("reading its stat");
    // The fields after the command name: state is the first, utime the 12th, stime the 13th.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .expect("a stat line")
        .1
        .split_whitespace()
        .collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    let per_second = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .unwrap()
        .unwrap() as u64;
    Duration::from_millis(ticks * 1000 / per_second)
}

#[test]
fn out_of_descriptors_the_server_waits_and_serves_the_clients_it_has() {
    let stack = Stack::start_command(
        urom_testkit::daemon::with_open_file_limit(std::path::Path::new(SERVER), 64),
        &two_cpus(),
        2,
        &[],
        &[],
    );
    let pid = stack.server.0.id();
    // Far more clients than descriptors: the kernel queues those the server cannot accept.
    let mut clients: Vec<_> = (0..100).map(|_| stack.connect()).collect();
    let wall = Duration::from_secs(2);
    let cpu_before = cpu_time(pid);
    let started = Instant::now();
    std::thread::sleep(wall);
    let cpu = cpu_time(pid) - cpu_before;
    let wall = started.elapsed();
    // The first clients were accepted and are served.
    for (i, client) in clients.iter_mut().enumerate().take(3) {
        client.write_all(&request_frame(b"served")).unwrap();
        assert_eq!(read_exactly(client, 18), frame(5, b"devres"), "client {i}");
    }
    let log = stack.server_log();
    let failures = log.matches("accept failed").count();
    eprintln!("{cpu:?} of CPU in {wall:?}; {failures} `accept failed` lines");
    assert!(
        cpu < wall / 5,
        "the server used {cpu:?} of CPU in {wall:?} while out of descriptors"
    );
    assert!(
        (1..=3).contains(&failures),
        "{failures} `accept failed` lines in {wall:?}:\n{}",
        &log[..log.len().min(4096)]
    );
    // Descriptors freed, the clients that waited are accepted and served.
    let last = clients.pop().unwrap();
    clients.truncate(10);
    let mut last = last;
    last.write_all(&request_frame(b"at last")).unwrap();
    assert_eq!(read_exactly(&mut last, 19), frame(5, b"tsal ta"));
    drop(clients);
    stack.stop_with(SIGINT, true);
}
