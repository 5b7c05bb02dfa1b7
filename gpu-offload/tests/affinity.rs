//! A client moves to the data-path thread on the CPU its packets arrive on.

mod common;

use std::io::Write;
use std::net::Shutdown;

use common::*;

/// Batches each client sends, one write of [`PER_BATCH`] requests each.
const BATCHES: usize = 96;
const PER_BATCH: usize = 8;

/// Two clients whose threads run on the second CPU: the acceptor gives one of them to the
/// thread on the first CPU, which hands it over to the thread on the second after a few
/// batches (logged at debug level), and every request, before, during and after the move, is
/// answered once and in order.
#[test]
fn a_client_moves_to_the_thread_on_its_cpu_and_loses_nothing() {
    let cpus = two_cpus();
    if cpus[0] == cpus[1] {
        urom_testkit::skip("this process may run on one CPU only");
        return;
    }
    let stack = Stack::start(&cpus, 2, &["-l", "60"], &[]);
    let clients: Vec<_> = (0..2)
        .map(|client| {
            let mut stream = stack.connect();
            let cpu = cpus[1];
            std::thread::spawn(move || {
                urom_transport::sys::pin_current_thread(cpu).expect("pinning the client");
                for batch in 0..BATCHES {
                    let payloads: Vec<Vec<u8>> = (0..PER_BATCH)
                        .map(|i| format!("client {client} batch {batch} request {i}").into_bytes())
                        .collect();
                    let requests: Vec<u8> =
                        payloads.iter().flat_map(|p| request_frame(p)).collect();
                    stream.write_all(&requests).unwrap();
                    let want: Vec<u8> = payloads
                        .iter()
                        .flat_map(|p| frame(5, &p.iter().rev().copied().collect::<Vec<_>>()))
                        .collect();
                    assert_eq!(
                        read_exactly(&mut stream, want.len()),
                        want,
                        "client {client}, batch {batch}"
                    );
                }
                stream.shutdown(Shutdown::Write).unwrap();
                assert!(
                    closed_by_server(&mut stream),
                    "client {client}: no end of file"
                );
            })
        })
        .collect();
    for client in clients {
        client.join().expect("a client failed");
    }
    let log = stack.server_log();
    assert!(
        log.contains("client handed over to the thread on its CPU"),
        "no client moved; the server's log:\n{log}"
    );
}
