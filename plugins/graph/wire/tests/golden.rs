//! The graph plugin's messages: golden vectors both ways, one refusal per bad field, and any
//! bytes either refused or packed back unchanged.

use proptest::prelude::*;
use urom_graph_wire::{
    CMD_LOOPBACK, GraphCommand, GraphError, GraphNotification, MESSAGE_LEN, NOTIFY_LOOPBACK,
    VERSION, check_version,
};
use urom_testkit::golden::assert_emits;
use urom_testkit::golden::hex;
use urom_wire::Status;

// type 0 (loopback), data 0x1122334455667788.
const LOOPBACK: &str = "0000000000000000 8877665544332211";

#[test]
fn loopbacks_unpack_and_pack_their_golden_bytes() {
    let golden = hex(LOOPBACK);
    assert_eq!(golden.len(), MESSAGE_LEN);
    assert_eq!((CMD_LOOPBACK, NOTIFY_LOOPBACK), (0, 0));
    let data = 0x1122_3344_5566_7788;
    let command = GraphCommand::Loopback { data };
    let notification = GraphNotification::Loopback { data };
    assert_eq!(GraphCommand::unpack(&golden), Ok(command));
    assert_eq!(GraphNotification::unpack(&golden), Ok(notification));
    assert_emits("command", &golden, |buf| command.pack(buf).unwrap());
    assert_emits("notification", &golden, |buf| {
        notification.pack(buf).unwrap()
    });
}

#[test]
fn bad_lengths_are_refused() {
    let golden = hex(LOOPBACK);
    assert_eq!(
        GraphCommand::unpack(&golden[..15]),
        Err(GraphError::BadLength(15))
    );
    let mut long = golden.clone();
    long.push(0);
    assert_eq!(
        GraphNotification::unpack(&long),
        Err(GraphError::BadLength(17))
    );
    assert_eq!(GraphCommand::unpack(&[]), Err(GraphError::BadLength(0)));
}

#[test]
fn unknown_types_are_refused() {
    let mut bytes = hex(LOOPBACK);
    bytes[7] = 0x80;
    let kind = 0x8000_0000_0000_0000;
    assert_eq!(
        GraphCommand::unpack(&bytes),
        Err(GraphError::UnknownType(kind))
    );
    assert_eq!(
        GraphNotification::unpack(&bytes),
        Err(GraphError::UnknownType(kind))
    );
}

#[test]
fn packing_into_a_short_buffer_is_refused() {
    assert_eq!(
        GraphCommand::Loopback { data: 1 }.pack(&mut [0; 15]),
        Err(GraphError::BufferTooSmall(15))
    );
    assert_eq!(
        GraphNotification::Loopback { data: 1 }.pack(&mut []),
        Err(GraphError::BufferTooSmall(0))
    );
}

#[test]
fn versions_and_errors() {
    assert_eq!(check_version(VERSION), Ok(()));
    assert_eq!(
        check_version(7),
        Err(GraphError::VersionMismatch { found: 7 })
    );
    assert_eq!(
        Status::from(GraphError::UnknownType(3)),
        Status::InvalidValue
    );
    assert_eq!(
        GraphError::BadLength(3).to_string(),
        "graph message of 3 bytes; it must be 16"
    );
    assert_eq!(
        GraphError::VersionMismatch { found: 2 }.to_string(),
        "the service's graph plugin has version 0x2, this host speaks 0x1"
    );
    let error: &dyn core::error::Error = &GraphError::UnknownType(1);
    assert_eq!(error.to_string(), "unknown graph message type 1");
}

fn assert_canonical(bytes: &[u8]) {
    let mut out = [0xa5u8; MESSAGE_LEN];
    if let Ok(command) = GraphCommand::unpack(bytes) {
        assert_eq!(command.pack(&mut out), Ok(MESSAGE_LEN));
        assert_eq!(out[..], bytes[..]);
    }
    if let Ok(notification) = GraphNotification::unpack(bytes) {
        assert_eq!(notification.pack(&mut out), Ok(MESSAGE_LEN));
        assert_eq!(out[..], bytes[..]);
    }
}

proptest! {
    #[test]
    fn loopbacks_round_trip(data in any::<u64>()) {
        let mut buf = [0u8; MESSAGE_LEN];
        GraphCommand::Loopback { data }.pack(&mut buf).unwrap();
        prop_assert_eq!(GraphCommand::unpack(&buf), Ok(GraphCommand::Loopback { data }));
        GraphNotification::Loopback { data }.pack(&mut buf).unwrap();
        prop_assert_eq!(
            GraphNotification::unpack(&buf),
            Ok(GraphNotification::Loopback { data })
        );
    }

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..24)) {
        assert_canonical(&bytes);
    }
}

#[test]
fn fuzz_seed_corpus_matches_the_golden_vectors() {
    urom_testkit::golden::check_fuzz_seeds("graph", &[("loopback", hex(LOOPBACK))]);
}
