//! Domain formats: the data-channel messages of a domain start, the table and its records, the
//! allgather blocks and the socket rendezvous. Golden vectors both ways, refusals of bad input,
//! and any bytes either refused or emitted back unchanged.

mod common;

use common::hex;
use proptest::prelude::*;
use urom_testkit::golden::assert_emits;
use urom_wire::domain::{
    AddressReply, AddressRequest, Buffer, DomainMessage, JoinBlock, MAX_TABLE_LEN, MemberSpec,
    PluginAddress, ReadyBlock, RecordRepr, RecordSpec, TableAck, TableChunk, TableRepr,
};
use urom_wire::oob::{OobKind, OobRepr, oob_message_len};
use urom_wire::{DecodeError, EncodeError, FrameRepr, MaxMsgSize, Status};

const MAX: MaxMsgSize = MaxMsgSize::DEFAULT;

// Frame header: magic "UROM" | version 1 | kind | length | flags | seq.
const ADDRESS_REQUEST: &str = "55524f4d 0100 1002 28000000 00000000 0100000000000000
    0700000000000000 0200000000000000";
const ADDRESS_REPLY: &str = "55524f4d 0100 1102 33000000 00000000 0200000000000000
    0700000000000000 0200000000000000 00000000 00000000 616263";
const ADDRESS_REPLY_NOT_FOUND: &str = "55524f4d 0100 1102 30000000 00000000 0300000000000000
    0800000000000000 0400000000000000 10000000 00000000";
const TABLE_CHUNK: &str = "55524f4d 0100 1202 34000000 00000000 0400000000000000
    0900000000000000 4000000000000000 1800000000000000 01020304";
const TABLE_ACK: &str = "55524f4d 0100 1302 28000000 00000000 0500000000000000
    0900000000000000 06000000 00000000";

// Two ranks: rank 0 with member 0 (worker_sandbox at "ucp0") and a buffer without a memory
// handle; rank 1 with member 1, no plugin address, no buffer.
const TABLE: &str = "55444f4d 0100 0000 02000000 00000000 c800000000000000
    8800000000000000 00000000 01000000 01000000 00000000
    0000000000000000 01000000 00000000
    776f726b65725f73616e64626f78 00*34 04000000 00000000 75637030 00000000
    0010000000000000 0001000000000000 00000000 03000000 726b3000 00000000
    2800000000000000 01000000 01000000 00000000 00000000
    0100000000000000 00000000 00000000";
/// Where the second record starts in [`TABLE`].
const RECORD_1_AT: usize = 24 + 136;

const JOIN: &str = "8800000000000000 00000000 00000000";
const JOIN_FAILED: &str = "0000000000000000 0e000000 00000000";
const READY: &str = "00000000 00000000";

// "UOOB" | version 1 | kind | rank | ranks | seq | len | bytes.
const OOB_JOIN: &str = "554f4f42 0100 0100 02000000 04000000 0000000000000000 0000000000000000";
const OOB_BLOCK: &str =
    "554f4f42 0100 0200 01000000 02000000 0300000000000000 0200000000000000 0102";
const OOB_GATHERED: &str =
    "554f4f42 0100 0300 00000000 02000000 0300000000000000 0400000000000000 aabb0102";
const OOB_ABORT: &str =
    "554f4f42 0100 0400 02000000 03000000 0000000000000000 0400000000000000 676f6e65";

fn messages() -> [(
    &'static str,
    &'static str,
    FrameRepr<DomainMessage<'static>>,
); 5] {
    [
        (
            "address_request",
            ADDRESS_REQUEST,
            FrameRepr {
                seq: 1,
                body: DomainMessage::DomainAddressRequest(AddressRequest {
                    request: 7,
                    plugin: 2,
                }),
            },
        ),
        (
            "address_reply",
            ADDRESS_REPLY,
            FrameRepr {
                seq: 2,
                body: DomainMessage::DomainAddressReply(AddressReply {
                    request: 7,
                    plugin: 2,
                    status: Status::Success,
                    address: b"abc",
                }),
            },
        ),
        (
            "address_reply_not_found",
            ADDRESS_REPLY_NOT_FOUND,
            FrameRepr {
                seq: 3,
                body: DomainMessage::DomainAddressReply(AddressReply {
                    request: 8,
                    plugin: 4,
                    status: Status::NotFound,
                    address: b"",
                }),
            },
        ),
        (
            "table_chunk",
            TABLE_CHUNK,
            FrameRepr {
                seq: 4,
                body: DomainMessage::DomainTableChunk(TableChunk {
                    request: 9,
                    table_len: 64,
                    offset: 24,
                    bytes: &[1, 2, 3, 4],
                }),
            },
        ),
        (
            "table_ack",
            TABLE_ACK,
            FrameRepr {
                seq: 5,
                body: DomainMessage::DomainTableAck(TableAck {
                    request: 9,
                    status: Status::InvalidValue,
                }),
            },
        ),
    ]
}

fn oob_messages() -> [(&'static str, &'static str, OobRepr<'static>); 4] {
    [
        (
            "oob_join",
            OOB_JOIN,
            OobRepr {
                kind: OobKind::Join,
                rank: 2,
                ranks: 4,
                seq: 0,
                data: b"",
            },
        ),
        (
            "oob_block",
            OOB_BLOCK,
            OobRepr {
                kind: OobKind::Block,
                rank: 1,
                ranks: 2,
                seq: 3,
                data: &[1, 2],
            },
        ),
        (
            "oob_gathered",
            OOB_GATHERED,
            OobRepr {
                kind: OobKind::Gathered,
                rank: 0,
                ranks: 2,
                seq: 3,
                data: &[0xaa, 0xbb, 1, 2],
            },
        ),
        (
            "oob_abort",
            OOB_ABORT,
            OobRepr {
                kind: OobKind::Abort,
                rank: 2,
                ranks: 3,
                seq: 0,
                data: b"gone",
            },
        ),
    ]
}

/// The records of [`TABLE`], as written.
fn table_records() -> [Vec<u8>; 2] {
    let plugins = [PluginAddress {
        name: "worker_sandbox",
        address: b"ucp0",
    }];
    let members_0 = [MemberSpec {
        domain_id: 0,
        plugins: &plugins,
    }];
    let buffers_0 = [Buffer {
        va: 0x1000,
        len: 0x100,
        memh: b"",
        mkey: b"rk0",
    }];
    let members_1 = [MemberSpec {
        domain_id: 1,
        plugins: &[],
    }];
    let specs = [
        RecordSpec {
            rank: 0,
            members: &members_0,
            buffers: &buffers_0,
        },
        RecordSpec {
            rank: 1,
            members: &members_1,
            buffers: &[],
        },
    ];
    specs.map(|spec| {
        let mut bytes = vec![0xa5; spec.buffer_len()];
        assert_eq!(spec.emit(&mut bytes), Ok(bytes.len()));
        bytes
    })
}

/// Writes a parsed record again from what its iterators give.
fn re_emit(record: &RecordRepr<'_>) -> Vec<u8> {
    let plugins: Vec<Vec<PluginAddress<'_>>> =
        record.members().map(|m| m.plugins().collect()).collect();
    let members: Vec<MemberSpec<'_>> = record
        .members()
        .zip(&plugins)
        .map(|(m, plugins)| MemberSpec {
            domain_id: m.domain_id,
            plugins,
        })
        .collect();
    let buffers: Vec<Buffer<'_>> = record.buffers().collect();
    let spec = RecordSpec {
        rank: record.rank,
        members: &members,
        buffers: &buffers,
    };
    let mut out = vec![0xa5; spec.buffer_len()];
    spec.emit(&mut out).unwrap();
    out
}

#[test]
fn data_channel_messages_parse_and_emit_their_golden_bytes() {
    for (name, golden, expected) in messages() {
        let bytes = hex(golden);
        assert_eq!(
            FrameRepr::<DomainMessage>::parse(&bytes, MAX),
            Ok(expected),
            "{name}"
        );
        assert_eq!(expected.buffer_len(), bytes.len(), "{name}");
        assert_emits(name, &bytes, |buf| expected.emit(buf, MAX).unwrap());
    }
}

#[test]
fn the_table_parses_and_its_records_emit_its_golden_bytes() {
    let golden = hex(TABLE);
    let records = table_records();
    assert_eq!(records[0], golden[24..RECORD_1_AT]);
    assert_eq!(records[1], golden[RECORD_1_AT..]);
    let slices = [records[0].as_slice(), records[1].as_slice()];
    assert_eq!(TableRepr::buffer_len(&slices), golden.len());
    assert_emits("table", &golden, |buf| {
        TableRepr::emit(&slices, buf).unwrap()
    });

    let table = TableRepr::parse(&golden).unwrap();
    assert_eq!(table.ranks, 2);
    let parsed: Vec<RecordRepr<'_>> = table.records().collect();
    assert_eq!(parsed.len(), 2);
    assert_eq!((parsed[0].rank, parsed[1].rank), (0, 1));
    assert_eq!(parsed[0].member_count(), 1);
    assert_eq!(parsed[0].buffer_count(), 1);
    let member = parsed[0].members().next().unwrap();
    assert_eq!(member.domain_id, 0);
    assert_eq!(
        member.plugins().collect::<Vec<_>>(),
        [PluginAddress {
            name: "worker_sandbox",
            address: b"ucp0"
        }]
    );
    assert_eq!(
        parsed[0].buffers().collect::<Vec<_>>(),
        [Buffer {
            va: 0x1000,
            len: 0x100,
            memh: b"",
            mkey: b"rk0"
        }]
    );
    let member = parsed[1].members().next().unwrap();
    assert_eq!((member.domain_id, member.plugin_count()), (1, 0));
    assert_eq!(parsed[1].buffers().count(), 0);
    for record in &parsed {
        assert_eq!(re_emit(record), record.as_bytes());
        assert_eq!(RecordRepr::parse(record.as_bytes()), Ok(*record));
    }
}

#[test]
fn blocks_parse_and_emit_their_golden_bytes() {
    let cases = [
        (
            JOIN,
            JoinBlock {
                record_len: 0x88,
                status: Status::Success,
            },
        ),
        (
            JOIN_FAILED,
            JoinBlock {
                record_len: 0,
                status: Status::NotConnected,
            },
        ),
    ];
    for (golden, block) in cases {
        let bytes = hex(golden);
        assert_eq!(JoinBlock::parse(&bytes), Ok(block));
        assert_emits("join", &bytes, |buf| block.emit(buf).unwrap());
    }
    let bytes = hex(READY);
    let ready = ReadyBlock {
        status: Status::Success,
    };
    assert_eq!(ReadyBlock::parse(&bytes), Ok(ready));
    assert_emits("ready", &bytes, |buf| ready.emit(buf).unwrap());
    let mut reserved = hex(JOIN);
    reserved[15] = 1;
    assert_eq!(
        JoinBlock::parse(&reserved),
        Err(DecodeError::ReservedNotZero {
            field: "join.reserved"
        })
    );
    assert!(matches!(
        ReadyBlock::parse(&hex(JOIN)),
        Err(DecodeError::TrailingBytes { .. })
    ));
}

#[test]
fn rendezvous_messages_parse_and_emit_their_golden_bytes() {
    for (name, golden, expected) in oob_messages() {
        let bytes = hex(golden);
        assert_eq!(OobRepr::parse(&bytes, 1024), Ok(expected), "{name}");
        assert_eq!(oob_message_len(&bytes, 1024), Ok(Some(bytes.len())));
        assert_eq!(oob_message_len(&bytes[..31], 1024), Ok(None));
        assert_emits(name, &bytes, |buf| expected.emit(buf).unwrap());
    }
}

#[test]
fn bad_data_channel_messages_are_refused() {
    let parse = |bytes: &[u8]| FrameRepr::<DomainMessage>::parse(bytes, MAX).map(|_| ());
    // A failed address reply carries no address.
    let mut bytes = hex(ADDRESS_REPLY);
    bytes[24 + 16] = 16;
    assert_eq!(
        parse(&bytes),
        Err(DecodeError::TrailingBytes {
            expected: 24,
            found: 27
        })
    );
    let mut reserved = hex(ADDRESS_REPLY);
    reserved[24 + 20] = 1;
    assert_eq!(
        parse(&reserved),
        Err(DecodeError::ReservedNotZero {
            field: "address_reply.reserved"
        })
    );
    let mut reserved = hex(TABLE_ACK);
    reserved[24 + 12] = 1;
    assert!(matches!(
        parse(&reserved),
        Err(DecodeError::ReservedNotZero { .. })
    ));
    // Chunks: beyond the table, empty, a table larger than a worker takes, one shorter than
    // a header.
    let chunk = |table_len: u64, offset: u64, bytes: &[u8]| {
        let mut out = hex("55524f4d 0100 1202 00000000 00000000 0100000000000000");
        out.extend_from_slice(&1u64.to_le_bytes());
        out.extend_from_slice(&table_len.to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
        out.extend_from_slice(bytes);
        let len = out.len() as u32;
        out[8..12].copy_from_slice(&len.to_le_bytes());
        out
    };
    assert_eq!(
        parse(&chunk(64, 62, &[1, 2, 3])),
        Err(DecodeError::TrailingBytes {
            expected: 2,
            found: 3
        })
    );
    assert_eq!(
        parse(&chunk(64, 80, &[1])),
        Err(DecodeError::TrailingBytes {
            expected: 0,
            found: 1
        })
    );
    assert_eq!(
        parse(&chunk(64, 0, &[])),
        Err(DecodeError::Truncated {
            needed: 1,
            available: 0
        })
    );
    assert!(matches!(
        parse(&chunk(MAX_TABLE_LEN + 1, 0, &[1])),
        Err(DecodeError::TooLong { .. })
    ));
    assert_eq!(
        parse(&chunk(8, 0, &[1])),
        Err(DecodeError::LengthBelowHeader {
            length: 8,
            header: 24
        })
    );
    // Emitting what would not parse is refused too.
    let bad = FrameRepr {
        seq: 1,
        body: DomainMessage::DomainTableChunk(TableChunk {
            request: 1,
            table_len: 64,
            offset: 60,
            bytes: &[0; 8],
        }),
    };
    let mut out = [0u8; 128];
    assert!(matches!(
        bad.emit(&mut out, MAX),
        Err(EncodeError::TooMany { .. })
    ));
    let bad = FrameRepr {
        seq: 1,
        body: DomainMessage::DomainAddressReply(AddressReply {
            request: 1,
            plugin: 1,
            status: Status::NotFound,
            address: b"x",
        }),
    };
    assert!(matches!(
        bad.emit(&mut out, MAX),
        Err(EncodeError::TooMany { .. })
    ));
    // A domain frame is not a data-path message, nor the other way round.
    assert_eq!(
        FrameRepr::<urom_wire::data::DataMessage>::parse(&hex(TABLE_ACK), MAX),
        Err(DecodeError::UnexpectedKind(0x0213))
    );
}

#[test]
fn bad_tables_are_refused() {
    let golden = hex(TABLE);
    let mut bytes = golden.clone();
    bytes[0] = b'X';
    assert!(matches!(
        TableRepr::parse(&bytes),
        Err(DecodeError::WrongMagic { .. })
    ));
    let mut bytes = golden.clone();
    bytes[4] = 2;
    assert!(matches!(
        TableRepr::parse(&bytes),
        Err(DecodeError::UnsupportedFormatVersion {
            found: 2,
            supported: 1,
            ..
        })
    ));
    // The length field and the bytes disagree.
    assert_eq!(
        TableRepr::parse(&golden[..golden.len() - 8]),
        Err(DecodeError::Truncated {
            needed: 200,
            available: 192
        })
    );
    // One rank fewer than the records there.
    let mut bytes = golden.clone();
    bytes[8] = 1;
    assert_eq!(
        TableRepr::parse(&bytes),
        Err(DecodeError::TrailingBytes {
            expected: RECORD_1_AT,
            found: 200
        })
    );
    // Records out of rank order.
    let mut bytes = golden.clone();
    bytes[RECORD_1_AT + 8] = 5;
    assert_eq!(
        TableRepr::parse(&bytes),
        Err(DecodeError::RankMismatch {
            expected: 1,
            found: 5
        })
    );
    // Non-zero padding after an address.
    let mut bytes = golden.clone();
    let address_at = 24 + 24 + 16 + 56;
    assert_eq!(&bytes[address_at..address_at + 4], b"ucp0");
    bytes[address_at + 5] = 1;
    assert_eq!(
        TableRepr::parse(&bytes),
        Err(DecodeError::ReservedNotZero {
            field: "address padding"
        })
    );
    // A plugin name that is not NUL-padded.
    let mut bytes = golden.clone();
    bytes[24 + 24 + 16 + 47] = b'x';
    assert_eq!(
        TableRepr::parse(&bytes),
        Err(DecodeError::TextNotNulPadded {
            field: "plugin name"
        })
    );
    // A record that claims less than its header, or more than is there.
    let record = &golden[RECORD_1_AT..];
    let mut short = record.to_vec();
    short[0] = 8;
    assert_eq!(
        RecordRepr::parse(&short),
        Err(DecodeError::LengthBelowHeader {
            length: 8,
            header: 24
        })
    );
    let mut long = record.to_vec();
    long[0] = 48;
    assert_eq!(
        RecordRepr::parse(&long),
        Err(DecodeError::Truncated {
            needed: 48,
            available: 40
        })
    );
    // A member count that runs past the record.
    let mut counts = record.to_vec();
    counts[12] = 2;
    assert!(matches!(
        RecordRepr::parse(&counts),
        Err(DecodeError::Truncated { .. })
    ));
    // Bytes the counts do not account for.
    let mut extra = record.to_vec();
    extra[0] = 48;
    extra.extend_from_slice(&[0; 8]);
    assert_eq!(
        RecordRepr::parse(&extra),
        Err(DecodeError::TrailingBytes {
            expected: 40,
            found: 48
        })
    );
    // A name too long to write.
    let plugins = [PluginAddress {
        name: "a-plugin-name-that-is-much-longer-than-forty-seven-bytes",
        address: b"",
    }];
    let members = [MemberSpec {
        domain_id: 0,
        plugins: &plugins,
    }];
    let spec = RecordSpec {
        rank: 0,
        members: &members,
        buffers: &[],
    };
    let mut out = vec![0; spec.buffer_len()];
    assert!(matches!(
        spec.emit(&mut out),
        Err(EncodeError::TextTooLong { .. })
    ));
}

#[test]
fn bad_rendezvous_messages_are_refused() {
    let mut bytes = hex(OOB_BLOCK);
    bytes[0] = b'X';
    assert!(matches!(
        OobRepr::parse(&bytes, 1024),
        Err(DecodeError::WrongMagic { .. })
    ));
    let mut bytes = hex(OOB_BLOCK);
    bytes[6] = 9;
    assert_eq!(
        OobRepr::parse(&bytes, 1024),
        Err(DecodeError::UnknownKind(9))
    );
    // Longer than the receiver takes: refused from the header alone.
    let bytes = hex(OOB_GATHERED);
    assert_eq!(
        oob_message_len(&bytes[..32], 35),
        Err(DecodeError::TooLong {
            length: 36,
            max: 35
        })
    );
    // A join carries nothing; an abort's reason is UTF-8.
    let mut bytes = hex(OOB_JOIN);
    bytes[16] = 1;
    assert_eq!(
        OobRepr::parse(&bytes, 1024),
        Err(DecodeError::ReservedNotZero { field: "seq" })
    );
    let mut bytes = hex(OOB_ABORT);
    bytes[32] = 0xff;
    assert_eq!(
        OobRepr::parse(&bytes, 1024),
        Err(DecodeError::TextNotUtf8 {
            field: "abort reason"
        })
    );
    let bytes = hex(OOB_BLOCK);
    assert_eq!(
        OobRepr::parse(&bytes[..bytes.len() - 1], 1024),
        Err(DecodeError::Truncated {
            needed: 34,
            available: 33
        })
    );
}

proptest! {
    #[test]
    fn any_bytes_are_refused_or_emit_back(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        if let Ok(frame) = FrameRepr::<DomainMessage>::parse(&bytes, MAX) {
            let mut out = vec![0; frame.buffer_len()];
            prop_assert_eq!(frame.emit(&mut out, MAX), Ok(bytes.len()));
            prop_assert_eq!(&out, &bytes);
        }
        if let Ok(record) = RecordRepr::parse(&bytes) {
            prop_assert_eq!(re_emit(&record), bytes.clone());
        }
        if let Ok(message) = OobRepr::parse(&bytes, 1024) {
            let mut out = vec![0; message.buffer_len()];
            prop_assert_eq!(message.emit(&mut out), Ok(bytes.len()));
            prop_assert_eq!(&out, &bytes);
        }
    }

    #[test]
    fn records_of_any_shape_emit_and_parse_back(
        rank in any::<u32>(),
        members in proptest::collection::vec(
            (any::<u64>(), proptest::collection::vec(
                ("[a-z_]{0,47}", proptest::collection::vec(any::<u8>(), 0..20)), 0..3)),
            0..4),
        buffers in proptest::collection::vec(
            (any::<u64>(), any::<u64>(),
             proptest::collection::vec(any::<u8>(), 0..17),
             proptest::collection::vec(any::<u8>(), 0..17)),
            0..4),
    ) {
        let plugins: Vec<Vec<PluginAddress<'_>>> = members
            .iter()
            .map(|(_, plugins)| plugins
                .iter()
                .map(|(name, address)| PluginAddress { name, address })
                .collect())
            .collect();
        let member_specs: Vec<MemberSpec<'_>> = members
            .iter()
            .zip(&plugins)
            .map(|((domain_id, _), plugins)| MemberSpec { domain_id: *domain_id, plugins })
            .collect();
        let buffer_specs: Vec<Buffer<'_>> = buffers
            .iter()
            .map(|(va, len, memh, mkey)| Buffer { va: *va, len: *len, memh, mkey })
            .collect();
        let spec = RecordSpec { rank, members: &member_specs, buffers: &buffer_specs };
        let mut bytes = vec![0xa5; spec.buffer_len()];
        prop_assert_eq!(spec.emit(&mut bytes), Ok(bytes.len()));
        prop_assert_eq!(bytes.len() % 8, 0);
        let record = RecordRepr::parse(&bytes).unwrap();
        prop_assert_eq!(record.rank, rank);
        prop_assert_eq!(record.buffers().collect::<Vec<_>>(), buffer_specs);
        prop_assert_eq!(re_emit(&record), bytes);
    }
}

#[test]
fn fuzz_seed_corpus_matches_the_golden_vectors() {
    let mut vectors: Vec<(&str, Vec<u8>)> = messages()
        .iter()
        .map(|(name, golden, _)| (*name, hex(golden)))
        .collect();
    vectors.extend(
        oob_messages()
            .iter()
            .map(|(name, golden, _)| (*name, hex(golden))),
    );
    vectors.push(("table", hex(TABLE)));
    vectors.push(("record", hex(TABLE)[24..RECORD_1_AT].to_vec()));
    vectors.push(("join", hex(JOIN)));
    vectors.push(("ready", hex(READY)));
    urom_testkit::golden::check_fuzz_seeds("domain", &vectors);
}
