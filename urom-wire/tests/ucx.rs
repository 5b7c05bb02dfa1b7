//! The UCX handshake and active-message headers: golden vectors both ways, refusals of bad
//! input, and any bytes either refused or emitted back unchanged.

mod common;

use common::hex;
use proptest::prelude::*;
use urom_testkit::golden::assert_emits;
use urom_wire::DecodeError;
use urom_wire::ucx::{
    UCX_BATCH_ENTRY_HEADER_LEN, UCX_CONTROL_LEN, UCX_DATA_HEADER_LEN, UCX_HANDSHAKE_LEN,
    UCX_HANDSHAKE_VERSION, UcxAnswerRepr, UcxAnswerStatus, UcxBatchFrames, UcxControlKind,
    UcxControlRepr, UcxDataRepr, UcxHelloRepr, emit_batch_entry,
};

// max 4096, 256 slots, no address.
const HELLO: &str = "55524f4d55435848 03000000 00100000 00010000 00000000 10000000 00000000";
// max 1 MiB, 64 slots, a 3-byte address.
const HELLO_ADDRESS: &str =
    "55524f4d55435848 03000000 00001000 40000000 03000000 14010000 00000000 aabbcc";
const ANSWER_OK: &str = "55524f4d55435841 00000000 00100000 08000000 00000000 18000000 00000000";
const ANSWER_MAX: &str =
    "55524f4d55435841 02000000 00200000 08000000 02000000 00000000 00000000 0102";
const DATA: &str = "0807060504030201";
const CREDIT: &str = "01000000 00000000 2000000000000000";
const SENDER_CLOSED: &str = "02000000 00000000 0300000000000000";

fn hellos() -> [(&'static str, &'static str, UcxHelloRepr<'static>); 2] {
    [
        (
            "hello",
            HELLO,
            UcxHelloRepr {
                max_msg_size: 4096,
                slots: 256,
                address: &[],
                am_base: 16,
            },
        ),
        (
            "hello_address",
            HELLO_ADDRESS,
            UcxHelloRepr {
                max_msg_size: 1 << 20,
                slots: 64,
                address: &[0xaa, 0xbb, 0xcc],
                am_base: 0x114,
            },
        ),
    ]
}

fn answers() -> [(&'static str, &'static str, UcxAnswerRepr<'static>); 2] {
    [
        (
            "answer_ok",
            ANSWER_OK,
            UcxAnswerRepr {
                status: UcxAnswerStatus::Ok,
                max_msg_size: 4096,
                slots: 8,
                address: &[],
                am_base: 24,
            },
        ),
        (
            "answer_max_msg_size",
            ANSWER_MAX,
            UcxAnswerRepr {
                status: UcxAnswerStatus::MaxMsgSize,
                max_msg_size: 8192,
                slots: 8,
                address: &[1, 2],
                am_base: 0,
            },
        ),
    ]
}

fn controls() -> [(&'static str, &'static str, UcxControlRepr); 2] {
    [
        (
            "credit",
            CREDIT,
            UcxControlRepr {
                kind: UcxControlKind::Credit,
                value: 32,
            },
        ),
        (
            "sender_closed",
            SENDER_CLOSED,
            UcxControlRepr {
                kind: UcxControlKind::SenderClosed,
                value: 3,
            },
        ),
    ]
}

#[test]
fn handshake_messages_parse_and_emit_their_golden_bytes() {
    assert_eq!(UCX_HANDSHAKE_VERSION, 3);
    for (name, golden, repr) in hellos() {
        let golden = hex(golden);
        assert_eq!(
            golden.len(),
            UCX_HANDSHAKE_LEN + repr.address.len(),
            "{name}"
        );
        assert_eq!(UcxHelloRepr::parse(&golden), Ok(repr), "{name}");
        assert_eq!(repr.buffer_len(), golden.len(), "{name}");
        assert_emits(name, &golden, |buf| repr.emit(buf).unwrap());
    }
    for (name, golden, repr) in answers() {
        let golden = hex(golden);
        assert_eq!(UcxAnswerRepr::parse(&golden), Ok(repr), "{name}");
        assert_eq!(repr.buffer_len(), golden.len(), "{name}");
        assert_emits(name, &golden, |buf| repr.emit(buf).unwrap());
    }
    let mut unknown = hex(ANSWER_OK);
    unknown[8] = 9;
    assert_eq!(
        UcxAnswerRepr::parse(&unknown).map(|a| a.status),
        Ok(UcxAnswerStatus::Unknown(9))
    );
}

#[test]
fn headers_parse_and_emit_their_golden_bytes() {
    let golden = hex(DATA);
    assert_eq!(golden.len(), UCX_DATA_HEADER_LEN);
    let data = UcxDataRepr {
        seq: 0x0102_0304_0506_0708,
    };
    assert_eq!(UcxDataRepr::parse(&golden), Ok(data));
    assert_eq!(data.to_bytes()[..], golden[..]);
    assert_emits("data", &golden, |buf| data.emit(buf).unwrap());
    for (name, golden, repr) in controls() {
        let golden = hex(golden);
        assert_eq!(golden.len(), UCX_CONTROL_LEN, "{name}");
        assert_eq!(UcxControlRepr::parse(&golden), Ok(repr), "{name}");
        assert_eq!(repr.to_bytes()[..], golden[..], "{name}");
        assert_emits(name, &golden, |buf| repr.emit(buf).unwrap());
    }
    assert_eq!(UcxControlKind::ReceiverClosed.raw(), 3);
    assert_eq!(UcxControlKind::CloseSeen.raw(), 4);
}

// A batch's data: the frames "abc", "" and "z".
const BATCH: &str = "03000000 616263 00000000 01000000 7a";

#[test]
fn batch_entries_parse_and_emit_their_golden_bytes() {
    let golden = hex(BATCH);
    let frames: Vec<&[u8]> = UcxBatchFrames::new(&golden)
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(frames, [&b"abc"[..], b"", b"z"]);
    assert_emits("batch", &golden, |buf| {
        frames.iter().fold(0, |at, frame| {
            at + emit_batch_entry(&mut buf[at..], frame).unwrap()
        })
    });
    assert_eq!(UcxBatchFrames::new(&[]).count(), 0);
}

#[test]
fn bad_batches_end_with_an_error_after_the_good_entries() {
    let golden = hex(BATCH);
    // The last entry claims one byte more than is there.
    let mut long = golden.clone();
    long[11] = 2;
    let read: Vec<_> = UcxBatchFrames::new(&long).collect();
    assert_eq!(
        read,
        [
            Ok(&b"abc"[..]),
            Ok(b""),
            Err(DecodeError::Truncated {
                needed: 2,
                available: 1
            })
        ]
    );
    // A length field cut short.
    let read: Vec<_> = UcxBatchFrames::new(&golden[..9]).collect();
    assert_eq!(
        read.last(),
        Some(&Err(DecodeError::Truncated {
            needed: UCX_BATCH_ENTRY_HEADER_LEN,
            available: 2
        }))
    );
    assert!(matches!(
        emit_batch_entry(&mut [0; 6], b"abc"),
        Err(urom_wire::EncodeError::BufferTooSmall {
            needed: 7,
            available: 6
        })
    ));
}

#[test]
fn bad_handshakes_are_refused() {
    let hello = hex(HELLO_ADDRESS);
    assert_eq!(
        UcxHelloRepr::parse(&hello[..20]),
        Err(DecodeError::Truncated {
            needed: 32,
            available: 20
        })
    );
    // The address is shorter or longer than its length says.
    assert_eq!(
        UcxHelloRepr::parse(&hello[..34]),
        Err(DecodeError::Truncated {
            needed: 35,
            available: 34
        })
    );
    let mut long = hello.clone();
    long.push(0);
    assert_eq!(
        UcxHelloRepr::parse(&long),
        Err(DecodeError::TrailingBytes {
            expected: 35,
            found: 36
        })
    );
    let mut other_version = hello.clone();
    other_version[8] = 7;
    assert!(matches!(
        UcxHelloRepr::parse(&other_version),
        Err(DecodeError::UnsupportedFormatVersion { found: 7, .. })
    ));
    let mut reserved = hello.clone();
    reserved[31] = 1;
    assert!(matches!(
        UcxHelloRepr::parse(&reserved),
        Err(DecodeError::ReservedNotZero { .. })
    ));
    // An answer is not a hello, nor the other way round.
    assert!(matches!(
        UcxHelloRepr::parse(&hex(ANSWER_OK)),
        Err(DecodeError::WrongMagic { .. })
    ));
    assert!(matches!(
        UcxAnswerRepr::parse(&hex(HELLO)),
        Err(DecodeError::WrongMagic { .. })
    ));
    let mut control = hex(CREDIT);
    control[4] = 1;
    assert!(matches!(
        UcxControlRepr::parse(&control),
        Err(DecodeError::ReservedNotZero { .. })
    ));
    assert!(UcxDataRepr::parse(&hex(DATA)[..7]).is_err());
}

proptest! {
    #[test]
    fn any_bytes_are_refused_or_emit_back(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        if let Ok(hello) = UcxHelloRepr::parse(&bytes) {
            let mut out = vec![0; hello.buffer_len()];
            prop_assert_eq!(hello.emit(&mut out), Ok(bytes.len()));
            prop_assert_eq!(&out, &bytes);
        }
        if let Ok(answer) = UcxAnswerRepr::parse(&bytes) {
            let mut out = vec![0; answer.buffer_len()];
            prop_assert_eq!(answer.emit(&mut out), Ok(bytes.len()));
            prop_assert_eq!(&out, &bytes);
        }
        if let Ok(control) = UcxControlRepr::parse(&bytes) {
            prop_assert_eq!(&control.to_bytes()[..], &bytes[..]);
        }
        let frames: Result<Vec<&[u8]>, _> = UcxBatchFrames::new(&bytes).collect();
        if let Ok(frames) = frames {
            let mut out = vec![0; bytes.len()];
            let written = frames.iter().fold(0, |at, frame| {
                at + emit_batch_entry(&mut out[at..], frame).unwrap()
            });
            prop_assert_eq!(written, bytes.len());
            prop_assert_eq!(&out, &bytes);
        }
    }
}

#[test]
fn fuzz_seed_corpus_matches_the_golden_vectors() {
    let mut vectors = vec![("data", hex(DATA)), ("batch", hex(BATCH))];
    vectors.extend(hellos().map(|(name, golden, _)| (name, hex(golden))));
    vectors.extend(answers().map(|(name, golden, _)| (name, hex(golden))));
    vectors.extend(controls().map(|(name, golden, _)| (name, hex(golden))));
    urom_testkit::golden::check_fuzz_seeds("ucx", &vectors);
}
