//! The shared-memory handshake and mapping header: golden vectors both ways, one refusal per
//! bad field, and any bytes either refused or emitted back unchanged.

mod common;

use common::hex;
use proptest::prelude::*;
use urom_testkit::golden::assert_emits;
use urom_wire::shm::{
    MAPPING_HEADER_LEN, MappingHeaderRepr, SHM_ACK_LEN, SHM_HANDSHAKE_VERSION, SHM_HELLO_LEN,
    SHM_REQUEST_LEN, ShmAckRepr, ShmAckStatus, ShmHelloRepr, ShmRequestRepr,
};
use urom_wire::{DecodeError, EncodeError};

const HELLO: &str = "55524f4d48454c4f 03000000 00000000";
// 64 slots per ring asked for.
const REQUEST: &str = "55524f4d52515354 03000000 40000000";
const ACK_OK: &str = "55524f4d41434b00 00000000 00000000";
const ACK_BAD_LAYOUT: &str = "55524f4d41434b00 01000000 01000000";
const ACK_MAX_MSG_SIZE: &str = "55524f4d41434b00 02000000 00100000";
// 4096-byte slots, 64 per ring: stride 4224, control blocks at 128 and 384, slots at 640 and
// 270976, 541312 bytes in all.
const MAPPING: &str = "55524f4d53484d00 02000000 80000000 00100000 40000000 80100000
                       80000000 80010000 00000000
                       8002000000000000 8022040000000000 8042080000000000 00*64";

fn mapping() -> MappingHeaderRepr {
    MappingHeaderRepr {
        slot_size: 4096,
        slot_count: 64,
        stride: 4224,
        ctl: [128, 384],
        slots: [640, 270_976],
        total: 541_312,
    }
}

fn acks() -> [(&'static str, &'static str, ShmAckRepr); 3] {
    [
        ("ack_ok", ACK_OK, ShmAckRepr::OK),
        (
            "ack_bad_layout",
            ACK_BAD_LAYOUT,
            ShmAckRepr {
                status: ShmAckStatus::BadLayout,
                detail: 1,
            },
        ),
        (
            "ack_max_msg_size",
            ACK_MAX_MSG_SIZE,
            ShmAckRepr {
                status: ShmAckStatus::MaxMsgSize,
                detail: 4096,
            },
        ),
    ]
}

#[test]
fn hello_parses_and_emits_its_golden_bytes() {
    let golden = hex(HELLO);
    assert_eq!(golden.len(), SHM_HELLO_LEN);
    assert_eq!(SHM_HANDSHAKE_VERSION, 3);
    assert_eq!(ShmHelloRepr::parse(&golden), Ok(ShmHelloRepr));
    assert_emits("hello", &golden, |buf| ShmHelloRepr.emit(buf).unwrap());
    assert_eq!(ShmHelloRepr.to_bytes()[..], golden[..]);
    assert_eq!(ShmHelloRepr.buffer_len(), 16);
}

#[test]
fn request_parses_and_emits_its_golden_bytes() {
    let golden = hex(REQUEST);
    assert_eq!(golden.len(), SHM_REQUEST_LEN);
    let repr = ShmRequestRepr { slots: 64 };
    assert_eq!(ShmRequestRepr::parse(&golden), Ok(repr));
    assert_emits("request", &golden, |buf| repr.emit(buf).unwrap());
    assert_eq!(repr.to_bytes()[..], golden[..]);
    assert_eq!(repr.buffer_len(), 16);
    // A version-2 peer sends no request: its hello is no request either.
    let mut old = golden.clone();
    old[8] = 2;
    assert!(matches!(
        ShmRequestRepr::parse(&old),
        Err(DecodeError::UnsupportedFormatVersion { found: 2, .. })
    ));
    assert!(matches!(
        ShmRequestRepr::parse(&hex(HELLO)),
        Err(DecodeError::WrongMagic { .. })
    ));
}

#[test]
fn acks_parse_and_emit_their_golden_bytes() {
    for (name, golden, repr) in acks() {
        let golden = hex(golden);
        assert_eq!(golden.len(), SHM_ACK_LEN, "{name}");
        assert_eq!(ShmAckRepr::parse(&golden), Ok(repr), "{name}");
        assert_emits(name, &golden, |buf| repr.emit(buf).unwrap());
        assert_eq!(repr.to_bytes()[..], golden[..], "{name}");
    }
    let mut unknown = hex(ACK_OK);
    unknown[8] = 9;
    assert_eq!(
        ShmAckRepr::parse(&unknown).map(|ack| ack.status),
        Ok(ShmAckStatus::Unknown(9))
    );
    assert_eq!(ShmAckStatus::System.raw(), 3);
}

#[test]
fn mapping_header_parses_and_emits_its_golden_bytes() {
    let golden = hex(MAPPING);
    assert_eq!(golden.len(), MAPPING_HEADER_LEN);
    assert_eq!(MappingHeaderRepr::parse(&golden), Ok(mapping()));
    assert_emits("mapping", &golden, |buf| mapping().emit(buf).unwrap());
    assert_eq!(mapping().to_bytes()[..], golden[..]);
}

#[test]
fn short_and_long_inputs_are_refused() {
    let hello = hex(HELLO);
    assert_eq!(
        ShmHelloRepr::parse(&hello[..15]),
        Err(DecodeError::Truncated {
            needed: 16,
            available: 15
        })
    );
    let mut long = hello.clone();
    long.push(0);
    assert_eq!(
        ShmHelloRepr::parse(&long),
        Err(DecodeError::TrailingBytes {
            expected: 16,
            found: 17
        })
    );
    let ack = hex(ACK_OK);
    assert_eq!(
        ShmAckRepr::parse(&ack[..8]),
        Err(DecodeError::Truncated {
            needed: 16,
            available: 8
        })
    );
    let header = hex(MAPPING);
    assert_eq!(
        MappingHeaderRepr::parse(&header[..64]),
        Err(DecodeError::Truncated {
            needed: 128,
            available: 64
        })
    );
    let mut long = header.clone();
    long.push(0);
    assert_eq!(
        MappingHeaderRepr::parse(&long),
        Err(DecodeError::TrailingBytes {
            expected: 128,
            found: 129
        })
    );
}

#[test]
fn hello_fields_are_checked() {
    let mut bad = hex(HELLO);
    bad[3] = b'X';
    assert_eq!(
        ShmHelloRepr::parse(&bad),
        Err(DecodeError::WrongMagic {
            format: "urom shared-memory hello"
        })
    );
    // An ack is not a hello.
    assert!(matches!(
        ShmHelloRepr::parse(&hex(ACK_OK)),
        Err(DecodeError::WrongMagic { .. })
    ));
    // Another version is refused with the version found, for the ack's detail.
    let mut old = hex(HELLO);
    old[8] = 1;
    assert_eq!(
        ShmHelloRepr::parse(&old),
        Err(DecodeError::UnsupportedFormatVersion {
            format: "urom shared-memory hello",
            found: 1,
            supported: 3
        })
    );
    let mut reserved = hex(HELLO);
    reserved[15] = 1;
    assert_eq!(
        ShmHelloRepr::parse(&reserved),
        Err(DecodeError::ReservedNotZero {
            field: "shm_hello.reserved"
        })
    );
}

#[test]
fn ack_magic_is_checked() {
    let mut bad = hex(ACK_OK);
    bad[7] = b'!';
    assert_eq!(
        ShmAckRepr::parse(&bad),
        Err(DecodeError::WrongMagic {
            format: "urom shared-memory ack"
        })
    );
}

#[test]
fn mapping_header_fields_are_checked() {
    let with = |at: usize, byte: u8| {
        let mut bytes = hex(MAPPING);
        bytes[at] = byte;
        MappingHeaderRepr::parse(&bytes)
    };
    assert_eq!(
        with(0, b'X'),
        Err(DecodeError::WrongMagic {
            format: "urom shared-memory mapping"
        })
    );
    assert_eq!(
        with(8, 1),
        Err(DecodeError::UnsupportedFormatVersion {
            format: "urom shared-memory mapping",
            found: 1,
            supported: 2
        })
    );
    assert_eq!(
        with(12, 64),
        Err(DecodeError::LengthMismatch {
            expected: 128,
            length: 64
        })
    );
    assert_eq!(
        with(36, 1),
        Err(DecodeError::ReservedNotZero {
            field: "mapping.reserved0"
        })
    );
    for at in [64, 100, 127] {
        assert_eq!(
            with(at, 1),
            Err(DecodeError::ReservedNotZero {
                field: "mapping.reserved1"
            })
        );
    }
    // Whether the fields describe a consistent layout is the transport's business.
    assert_eq!(with(20, 3).map(|repr| repr.slot_count), Ok(3));
}

#[test]
fn emitting_into_a_short_buffer_is_refused() {
    let mut buf = [0u8; 15];
    assert_eq!(
        ShmHelloRepr.emit(&mut buf),
        Err(EncodeError::BufferTooSmall {
            needed: 16,
            available: 15
        })
    );
    assert_eq!(
        ShmAckRepr::OK.emit(&mut buf),
        Err(EncodeError::BufferTooSmall {
            needed: 16,
            available: 15
        })
    );
    assert_eq!(
        mapping().emit(&mut [0u8; 127]),
        Err(EncodeError::BufferTooSmall {
            needed: 128,
            available: 127
        })
    );
}

#[test]
fn errors_read_well() {
    let text = DecodeError::UnsupportedFormatVersion {
        format: "urom shared-memory hello",
        found: 1,
        supported: 2,
    }
    .to_string();
    assert_eq!(
        text,
        "urom shared-memory hello version 1 is not supported (this build speaks 2)"
    );
    let text = DecodeError::WrongMagic {
        format: "urom shared-memory ack",
    }
    .to_string();
    assert_eq!(text, "not a urom shared-memory ack (wrong magic bytes)");
}

/// Every parser over `bytes`: whatever parses emits back to exactly those bytes.
fn assert_canonical(bytes: &[u8]) {
    if let Ok(hello) = ShmHelloRepr::parse(bytes) {
        assert_eq!(hello.to_bytes()[..], bytes[..]);
    }
    if let Ok(ack) = ShmAckRepr::parse(bytes) {
        assert_eq!(ack.to_bytes()[..], bytes[..]);
    }
    if let Ok(header) = MappingHeaderRepr::parse(bytes) {
        assert_eq!(header.to_bytes()[..], bytes[..]);
    }
}

proptest! {
    #[test]
    fn acks_and_headers_round_trip(
        status in any::<u32>(),
        detail in any::<u32>(),
        words in any::<[u32; 5]>(),
        offsets in any::<[u64; 3]>(),
    ) {
        let ack = ShmAckRepr { status: ShmAckStatus::from_raw(status), detail };
        prop_assert_eq!(ShmAckRepr::parse(&ack.to_bytes()), Ok(ack));
        let header = MappingHeaderRepr {
            slot_size: words[0],
            slot_count: words[1],
            stride: words[2],
            ctl: [words[3], words[4]],
            slots: [offsets[0], offsets[1]],
            total: offsets[2],
        };
        prop_assert_eq!(MappingHeaderRepr::parse(&header.to_bytes()), Ok(header));
    }

    #[test]
    fn mutated_golden_vectors_never_panic(
        which in 0usize..5,
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let mut bytes = hex([HELLO, ACK_OK, ACK_BAD_LAYOUT, ACK_MAX_MSG_SIZE, MAPPING][which]);
        for (at, value) in edits {
            let at = at.index(bytes.len());
            bytes[at] = value;
        }
        assert_canonical(&bytes);
    }

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..160)) {
        assert_canonical(&bytes);
    }
}

#[test]
fn fuzz_seed_corpus_matches_the_golden_vectors() {
    let mut vectors = vec![
        ("request", hex(REQUEST)),
        ("hello", hex(HELLO)),
        ("mapping_header", hex(MAPPING)),
    ];
    vectors.extend(acks().map(|(name, golden, _)| (name, hex(golden))));
    urom_testkit::golden::check_fuzz_seeds("shm", &vectors);
}
