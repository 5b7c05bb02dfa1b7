//! Peer workers and mapped host memory (`transport::ucx::{PeerWorker, MappedMemory}`) in one
//! process: tagged messages matched UCX's way, completions naming their tokens, slots reused,
//! remote keys unpacked, and bounds of mapped memory.
//!
//! Stays on TCP over the loopback interface unless `UCX_TLS` / `UCX_NET_DEVICES` say otherwise.
#![cfg(feature = "ucx")]

use std::time::{Duration, Instant};

use urom_core::transport::ucx::{
    self, Completion, MappedMemory, OperationKind, OutOfBounds, PeerWorker,
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
