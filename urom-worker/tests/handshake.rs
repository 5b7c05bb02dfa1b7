//! Hosts setting up their channels with a real `urom-worker` process do not wait on each
//! other.

mod common;

use std::io::{ErrorKind, Read};
use std::os::unix::net::UnixStream;
use std::time::Instant;

use common::*;
use urom_wire::Status;

#[test]
fn a_connection_that_never_answers_the_offer_delays_no_other_host() {
    let worker = start_worker(&graph_and_faulty(), &[]);
    let deadline = Instant::now() + TIMEOUT;
    let mut silent = loop {
        match UnixStream::connect(&worker.socket) {
            Ok(stream) => break stream,
            Err(e) => assert!(Instant::now() < deadline, "the worker never listened: {e}"),
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    // The silent connection never answers the worker's offer; the next host connects anyway.
    let mut host = connect(&worker.socket);
    // ... while the worker is still waiting for the silent one: it has not given up on it yet
    // (the worker closes a connection whose handshake times out).
    silent.set_nonblocking(true).unwrap();
    let mut offer = [0u8; 64];
    loop {
        match silent.read(&mut offer) {
            Ok(0) => panic!("the worker gave up on the silent connection before the host got in"),
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) => panic!("the silent connection failed: {e}"),
        }
    }
    send_command(&mut host, 1, GRAPH_ID, 5, &loopback(5));
    assert_eq!(next_notification(&mut host).2, Status::Success);
    drop(silent);
}
