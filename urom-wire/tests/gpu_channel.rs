//! The GPU offload channel hellos and the data listener record: golden vectors both ways, one refusal per bad field, and
//! any bytes either refused or emitted back unchanged.

mod common;

use common::hex;
use proptest::prelude::*;
use urom_testkit::golden::assert_emits;
use urom_wire::gpu::channel::{
    CHANNEL_HELLO_LEN, CHANNEL_VERSION, ChannelHelloRepr, DATA_HELLO_LEN, DATA_LISTENER_LEN,
    DataHelloRepr, DataListenerRepr,
};
use urom_wire::{DecodeError, EncodeError};

// Big-endian: version 1, 2 threads, 256-byte payloads, 128 in flight.
const CHANNEL_HELLO: &str = "4750554f46464c44 00000001 00000002 00000100 00000080";
// Thread 3.
const DATA_HELLO: &str = "4750554f46444154 00000003 00000000";
// Port 4000.
const DATA_LISTENER: &str = "4750554f464c534e 0fa0 000000000000";

const HELLO: ChannelHelloRepr = ChannelHelloRepr {
    threads: 2,
    max_message_length: 256,
    max_concurrent: 128,
};
const DATA: DataHelloRepr = DataHelloRepr { thread: 3 };
const LISTENER: DataListenerRepr = DataListenerRepr { port: 4000 };

#[test]
fn hellos_parse_and_emit_their_golden_bytes() {
    let golden = hex(CHANNEL_HELLO);
    assert_eq!(golden.len(), CHANNEL_HELLO_LEN);
    assert_eq!(CHANNEL_VERSION, 1);
    assert_eq!(ChannelHelloRepr::parse(&golden), Ok(HELLO));
    assert_emits("channel hello", &golden, |buf| HELLO.emit(buf).unwrap());
    assert_eq!(HELLO.to_bytes()[..], golden[..]);
    assert_eq!(HELLO.buffer_len(), 24);

    let golden = hex(DATA_HELLO);
    assert_eq!(golden.len(), DATA_HELLO_LEN);
    assert_eq!(DataHelloRepr::parse(&golden), Ok(DATA));
    assert_emits("data hello", &golden, |buf| DATA.emit(buf).unwrap());
    assert_eq!(DATA.to_bytes()[..], golden[..]);
    assert_eq!(DATA.buffer_len(), 16);

    let golden = hex(DATA_LISTENER);
    assert_eq!(golden.len(), DATA_LISTENER_LEN);
    assert_eq!(DataListenerRepr::parse(&golden), Ok(LISTENER));
    assert_emits("data listener", &golden, |buf| LISTENER.emit(buf).unwrap());
    assert_eq!(LISTENER.to_bytes()[..], golden[..]);
    assert_eq!(LISTENER.buffer_len(), 16);
}

#[test]
fn data_listener_fields_are_checked() {
    let mut bad = hex(DATA_LISTENER);
    bad[5] = b'X';
    assert_eq!(
        DataListenerRepr::parse(&bad),
        Err(DecodeError::WrongMagic {
            format: "GPU offload data listener"
        })
    );
    let mut reserved = hex(DATA_LISTENER);
    reserved[15] = 1;
    assert_eq!(
        DataListenerRepr::parse(&reserved),
        Err(DecodeError::ReservedNotZero {
            field: "data_listener.reserved"
        })
    );
    // A data hello is not a data listener record, though as long.
    assert!(matches!(
        DataListenerRepr::parse(&hex(DATA_HELLO)),
        Err(DecodeError::WrongMagic { .. })
    ));
    assert_eq!(
        LISTENER.emit(&mut [0u8; 15]),
        Err(EncodeError::BufferTooSmall {
            needed: 16,
            available: 15
        })
    );
}

#[test]
fn short_and_long_hellos_are_refused() {
    let hello = hex(CHANNEL_HELLO);
    assert_eq!(
        ChannelHelloRepr::parse(&hello[..23]),
        Err(DecodeError::Truncated {
            needed: 24,
            available: 23
        })
    );
    let mut long = hello.clone();
    long.push(0);
    assert_eq!(
        ChannelHelloRepr::parse(&long),
        Err(DecodeError::TrailingBytes {
            expected: 24,
            found: 25
        })
    );
    let data = hex(DATA_HELLO);
    assert_eq!(
        DataHelloRepr::parse(&data[..12]),
        Err(DecodeError::Truncated {
            needed: 16,
            available: 12
        })
    );
    // A control hello is not a data hello, even cut to its length.
    assert!(matches!(
        DataHelloRepr::parse(&hello[..16]),
        Err(DecodeError::WrongMagic { .. })
    ));
}

#[test]
fn channel_hello_fields_are_checked() {
    let mut bad = hex(CHANNEL_HELLO);
    bad[0] = b'X';
    assert_eq!(
        ChannelHelloRepr::parse(&bad),
        Err(DecodeError::WrongMagic {
            format: "GPU offload channel hello"
        })
    );
    let mut newer = hex(CHANNEL_HELLO);
    newer[11] = 2;
    assert_eq!(
        ChannelHelloRepr::parse(&newer),
        Err(DecodeError::UnsupportedFormatVersion {
            format: "GPU offload channel hello",
            found: 2,
            supported: 1
        })
    );
    // Any counts parse: whether the two sides agree is the programs' business.
    let mut zero = hex(CHANNEL_HELLO);
    zero[12..].fill(0);
    assert_eq!(
        ChannelHelloRepr::parse(&zero),
        Ok(ChannelHelloRepr {
            threads: 0,
            max_message_length: 0,
            max_concurrent: 0
        })
    );
}

#[test]
fn data_hello_fields_are_checked() {
    let mut bad = hex(DATA_HELLO);
    bad[7] = b'X';
    assert_eq!(
        DataHelloRepr::parse(&bad),
        Err(DecodeError::WrongMagic {
            format: "GPU offload data connection hello"
        })
    );
    let mut reserved = hex(DATA_HELLO);
    reserved[12] = 1;
    assert_eq!(
        DataHelloRepr::parse(&reserved),
        Err(DecodeError::ReservedNotZero {
            field: "data_hello.reserved"
        })
    );
}

#[test]
fn emitting_into_a_short_buffer_is_refused() {
    assert_eq!(
        HELLO.emit(&mut [0u8; 20]),
        Err(EncodeError::BufferTooSmall {
            needed: 24,
            available: 20
        })
    );
    assert_eq!(
        DATA.emit(&mut [0u8; 0]),
        Err(EncodeError::BufferTooSmall {
            needed: 16,
            available: 0
        })
    );
}

fn assert_canonical(bytes: &[u8]) {
    if let Ok(hello) = ChannelHelloRepr::parse(bytes) {
        assert_eq!(hello.to_bytes()[..], bytes[..]);
    }
    if let Ok(hello) = DataHelloRepr::parse(bytes) {
        assert_eq!(hello.to_bytes()[..], bytes[..]);
    }
    if let Ok(listener) = DataListenerRepr::parse(bytes) {
        assert_eq!(listener.to_bytes()[..], bytes[..]);
    }
}

proptest! {
    #[test]
    fn hellos_round_trip(words in any::<[u32; 4]>()) {
        let hello = ChannelHelloRepr {
            threads: words[0],
            max_message_length: words[1],
            max_concurrent: words[2],
        };
        prop_assert_eq!(ChannelHelloRepr::parse(&hello.to_bytes()), Ok(hello));
        let data = DataHelloRepr { thread: words[3] };
        prop_assert_eq!(DataHelloRepr::parse(&data.to_bytes()), Ok(data));
        let listener = DataListenerRepr { port: words[3] as u16 };
        prop_assert_eq!(DataListenerRepr::parse(&listener.to_bytes()), Ok(listener));
    }

    #[test]
    fn mutated_golden_vectors_never_panic(
        which in 0usize..3,
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let mut bytes = hex([CHANNEL_HELLO, DATA_HELLO, DATA_LISTENER][which]);
        for (at, value) in edits {
            let at = at.index(bytes.len());
            bytes[at] = value;
        }
        assert_canonical(&bytes);
    }

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..40)) {
        assert_canonical(&bytes);
    }
}

#[test]
fn fuzz_seed_corpus_matches_the_golden_vectors() {
    urom_testkit::golden::check_fuzz_seeds(
        "gpu_channel",
        &[
            ("channel_hello", hex(CHANNEL_HELLO)),
            ("data_hello", hex(DATA_HELLO)),
            ("data_listener", hex(DATA_LISTENER)),
        ],
    );
}
