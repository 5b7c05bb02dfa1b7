//! Peer workers and mapped host memory (`transport::ucx::{PeerWorker, MappedMemory}`) in one
//! process: tagged messages matched UCX's way, completions naming their tokens, slots reused,
//! remote keys unpacked, bounds of mapped memory, remote memory access that waits for a slow
//! host without stalling its worker, and exported memory handles only where UCX can export
//! them (refused with `UCS_ERR_UNSUPPORTED` elsewhere, endpoints still reachable).
//!
//! Stays on TCP over the loopback interface unless `UCX_TLS` / `UCX_NET_DEVICES` say otherwise.
#![cfg(feature = "ucx")]

use std::time::{Duration, Instant};

use urom_transport::ucx::{
    self, Completion, ImportParams, MappedMemory, OperationKind, OutOfBounds, PeerWorker,
    RemoteMemory,
};

const TIMEOUT: Duration = Duration::from_secs(60);

fn setup() {
    ucx::set_config_defaults(&[("TLS", "tcp,self"), ("NET_DEVICES", "lo")]);
}

/// Progresses both workers until one of them finishes an operation.
fn next(a: &mut PeerWorker, b: &mut PeerWorker) -> (usize, Completion) {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Some(done) = a.progress() {
            return (0, done);
        }
        if let Some(done) = b.progress() {
            return (1, done);
        }
        assert!(Instant::now() < deadline, "no operation finished");
    }
}

#[test]
fn tagged_messages_match_under_the_mask_and_complete_with_their_tokens() {
    setup();
    let mut a = PeerWorker::new().unwrap();
    let mut b = PeerWorker::new().unwrap();
    assert!(!a.address().is_empty());
    let to_b = a.connect(b.address()).unwrap();

    // Posted before the message: matched under the mask (the high bits differ).
    let posted = b.tag_recv(0x1234, 0xffff, 64, 7);
    a.tag_send(to_b, 0xab_1234, b"hello", 8).unwrap();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        seen.push(next(&mut a, &mut b));
    }
    seen.sort_by_key(|(side, _)| *side);
    let (_, sent) = seen[0];
    assert_eq!(
        (sent.token, sent.kind, sent.result),
        (8, OperationKind::Send, Ok(()))
    );
    let (_, received) = seen[1];
    assert_eq!(received.token, 7);
    assert_eq!(received.slot, posted);
    assert_eq!(
        received.kind,
        OperationKind::Receive {
            sender_tag: 0xab_1234,
            len: 5
        }
    );
    assert_eq!(b.slot(received.slot), b"hello");
    b.release(received.slot);
    assert_eq!(b.slot(received.slot), b"", "a released slot reads empty");
    a.release(sent.slot);

    // Sent before the receive is posted (UCX keeps it), into a reused slot.
    a.tag_send(to_b, 0x99, b"early", 9).unwrap();
    let (side, sent) = next(&mut a, &mut b);
    assert_eq!((side, sent.token), (0, 9));
    a.release(sent.slot);
    let late = b.tag_recv(0x99, u64::MAX, 64, 10);
    let (side, received) = next(&mut a, &mut b);
    assert_eq!((side, received.token, received.slot), (1, 10, late));
    assert_eq!(b.slot(received.slot), b"early");
    b.release(received.slot);
    assert_eq!(a.running() + b.running(), 0);
}

/// Longer than any wake-up takes: a sleep that lasts it was not woken.
const SLEEP: Duration = Duration::from_secs(20);

/// A worker that waits for a peer's first message sleeps on its descriptor, as a urom worker
/// does: one progress that finds nothing, `arm`, then `poll`. The peer connects and sends only
/// once it sleeps, from another thread. Every sleep must end through the descriptor, never by
/// running out: UCX reports the new connection on an interface that adaptive progress switched
/// off, and an `arm` right after one progress call took that report and left the descriptor
/// deaf until the next progress, which never came.
#[test]
fn a_sleeping_worker_is_woken_by_a_new_peers_first_message() {
    use std::sync::mpsc;

    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

    setup();
    for round in 0..5 {
        let mut b = PeerWorker::new().unwrap();
        let posted = b.tag_recv(0x77, u64::MAX, 64, 1);
        let (address_tx, address_rx) = mpsc::channel::<Vec<u8>>();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let sender = std::thread::spawn(move || {
            let mut a = PeerWorker::new().unwrap();
            let address = address_rx.recv().unwrap();
            let to_b = a.connect(&address).unwrap();
            a.tag_send(to_b, 0x77, b"first", 2).unwrap();
            // Progressed until the receiver has it (its answers to the connection come here).
            while done_rx.try_recv().is_err() {
                if let Some(done) = a.progress() {
                    assert_eq!(done.result, Ok(()));
                    a.release(done.slot);
                }
            }
        });
        let mut sleeps = 0;
        let received = loop {
            if let Some(done) = b.progress() {
                break done;
            }
            if !b.arm() {
                continue;
            }
            if sleeps == 0 {
                // The peer starts only now, so that its connection finds this one asleep.
                address_tx.send(b.address().to_vec()).unwrap();
            }
            sleeps += 1;
            let mut fds = [PollFd::new(b.wake_fd(), PollFlags::POLLIN)];
            let timeout = PollTimeout::try_from(SLEEP.as_millis() as i32).unwrap();
            let woke = poll(&mut fds, timeout).unwrap();
            assert!(
                woke > 0,
                "round {round}: sleep {sleeps} missed its wake-up (nothing for {SLEEP:?})"
            );
        };
        assert_eq!((received.token, received.slot), (1, posted));
        assert_eq!(b.slot(received.slot), b"first");
        b.release(received.slot);
        done_tx.send(()).unwrap();
        sender.join().unwrap();
    }
}

#[test]
fn mapped_memory_has_a_key_and_keeps_copies_in_bounds() {
    setup();
    let mut memory = MappedMemory::new(100).unwrap();
    assert_eq!(memory.len(), 100);
    assert!(!memory.rkey().is_empty(), "a packed remote key");
    memory.write(90, b"0123456789").unwrap();
    let mut out = [0u8; 12];
    memory.read(88, &mut out).unwrap();
    assert_eq!(&out[..2], [0, 0]);
    assert_eq!(&out[2..], b"0123456789");
    assert_eq!(
        memory.write(95, b"too long"),
        Err(OutOfBounds {
            offset: 95,
            len: 8,
            size: 100
        })
    );
    assert!(memory.read(usize::MAX, &mut out).is_err());

    // A key is unpacked on an endpoint to its owner.
    let mut peer = PeerWorker::new().unwrap();
    let host = ucx::HostMemoryWorker::new().unwrap();
    let to_host = peer.connect(host.address()).unwrap();
    assert!(peer.unpack_key(to_host, memory.rkey()).is_ok());
}

#[test]
fn remote_memory_access_waits_for_a_slow_host_without_stalling_its_worker() {
    setup();
    let mut memory = MappedMemory::new(4096).unwrap();
    memory.write(100, b"from the host").unwrap();
    let host = ucx::HostMemoryWorker::new().unwrap();
    let mut a = PeerWorker::new().unwrap();
    let mut b = PeerWorker::new().unwrap();
    let to_b = a.connect(b.address()).unwrap();
    let to_host = a.connect(host.address()).unwrap();
    let key = a.unpack_key(to_host, memory.rkey()).unwrap();
    let from = RemoteMemory {
        peer: to_host,
        key,
        address: memory.va() + 100,
    };

    // The send fetches its bytes from the host, which does not progress yet: starting it
    // returns at once, and the workers go on progressing (and exchanging other messages).
    b.tag_recv(0x5, u64::MAX, 64, 1);
    a.tag_send_from(to_b, 0x5, from, 13, 2).unwrap();
    b.tag_recv(0x6, u64::MAX, 64, 3);
    a.tag_send(to_b, 0x6, b"meanwhile", 4).unwrap();
    let mut tokens = Vec::new();
    let deadline = Instant::now() + TIMEOUT;
    let step = |a: &mut PeerWorker, b: &mut PeerWorker, tokens: &mut Vec<u64>| {
        for done in [a.progress(), b.progress()].into_iter().flatten() {
            tokens.push(done.token);
            match done.token {
                1 => assert_eq!(b.slot(done.slot), b"from the host"),
                2 => assert_eq!((done.kind, done.result), (OperationKind::Send, Ok(()))),
                3 => assert_eq!(b.slot(done.slot), b"meanwhile"),
                _ => {}
            }
        }
    };
    while !tokens.contains(&3) {
        step(&mut a, &mut b, &mut tokens);
        assert!(
            Instant::now() < deadline,
            "the other message did not arrive"
        );
    }

    // Once the host progresses, the fetched bytes go out and arrive.
    while !tokens.contains(&1) || !tokens.contains(&2) {
        host.progress();
        step(&mut a, &mut b, &mut tokens);
        assert!(
            Instant::now() < deadline,
            "the fetched message did not arrive"
        );
    }

    // And a put to the host's memory completes once the host progresses.
    let mut c = PeerWorker::new().unwrap();
    let c_to_host = c.connect(host.address()).unwrap();
    let c_key = c.unpack_key(c_to_host, memory.rkey()).unwrap();
    let to_c = a.connect(c.address()).unwrap();
    let landed = c.tag_recv(0x7, u64::MAX, 64, 5);
    a.tag_send(to_c, 0x7, b"into host memory", 6).unwrap();
    let received = loop {
        a.progress();
        if let Some(done) = c.progress() {
            break done;
        }
        assert!(
            Instant::now() < deadline,
            "the message for the put did not arrive"
        );
    };
    assert_eq!(received.slot, landed);
    let to = RemoteMemory {
        peer: c_to_host,
        key: c_key,
        address: memory.va() + 1000,
    };
    c.put(received.slot, to, 16, 7).unwrap();
    assert_eq!(c.slot(received.slot), b"", "the slot is the put's now");
    let put = loop {
        host.progress();
        a.progress();
        if let Some(done) = c.progress() {
            break done;
        }
        assert!(Instant::now() < deadline, "the put did not complete");
    };
    assert_eq!(
        (put.token, put.kind, put.result),
        (7, OperationKind::Put { len: 16 }, Ok(()))
    );
    c.release(put.slot);
    let mut out = [0u8; 16];
    memory.read(1000, &mut out).unwrap();
    assert_eq!(&out, b"into host memory");
}

/// Whether this machine has an RDMA device (mlx5 and the like), the only kind whose UCX
/// transports can export memory handles.
fn has_rdma_device() -> bool {
    std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut devices| devices.next().is_some())
}

#[test]
fn memory_handles_are_exported_only_where_ucx_can_and_endpoints_stay_reachable() {
    setup();
    let supported = ucx::exported_memh_supported();
    if !has_rdma_device() || !ucx_sys::HAS_EXPORTED_MEMH {
        // Every CPU-only transport (and UCX 1.13) answers UNSUPPORTED to an export.
        assert!(!supported, "no transport here can export memory handles");
    }
    let memory = MappedMemory::new(4096).unwrap();
    let mut a = PeerWorker::new().unwrap();
    let params = ImportParams {
        field_mask: 0b11,
        address: memory.va(),
        length: memory.len() as u64,
        ..ImportParams::default()
    };
    if supported {
        assert!(!memory.exported_memh().is_empty(), "an exported handle");
        assert_eq!(a.import_memh(params, memory.exported_memh()), Ok(0));
    } else {
        assert_eq!(
            memory.exported_memh(),
            b"",
            "no handle where UCX cannot export"
        );
        let error = a.import_memh(params, b"not a memory handle").unwrap_err();
        assert_eq!(error.status, ucx_sys::UCS_ERR_UNSUPPORTED);
        assert_eq!(error.op, ucx::NO_EXPORTED_MEMH);
        assert!(error.to_string().contains("UCX >= 1.15"), "{error}");
    }
    assert!(
        a.import_memh(params, b"").is_err(),
        "no handle, nothing to map"
    );

    // The peer context asked for exported handles only where they work: endpoints and RMA
    // reach their peers (asked for on a machine without such a transport, UCX would make every
    // endpoint unreachable).
    let mut b = PeerWorker::new().unwrap();
    let host = ucx::HostMemoryWorker::new().unwrap();
    let to_b = a.connect(b.address()).unwrap();
    let to_host = a.connect(host.address()).unwrap();
    let key = a.unpack_key(to_host, memory.rkey()).unwrap();
    b.tag_recv(0x1, u64::MAX, 64, 1);
    let from = RemoteMemory {
        peer: to_host,
        key,
        address: memory.va(),
    };
    a.tag_send_from(to_b, 0x1, from, 8, 2).unwrap();
    let deadline = Instant::now() + TIMEOUT;
    let mut tokens = Vec::new();
    while tokens.len() < 2 {
        host.progress();
        for done in [a.progress(), b.progress()].into_iter().flatten() {
            assert_eq!(done.result, Ok(()), "{done:?}");
            tokens.push(done.token);
        }
        assert!(
            Instant::now() < deadline,
            "the peers did not reach each other"
        );
    }
    tokens.sort();
    assert_eq!(tokens, [1, 2]);
}
