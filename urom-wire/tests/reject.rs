//! Every kind of bad input is refused with its own error value.

mod common;

use common::{golden, hex};
use urom_wire::control::{ControlMessage, PluginInfo, SpawnWorker, StatusReply};
use urom_wire::data::DataMessage;
use urom_wire::frame::frame_length;
use urom_wire::gpu::{GpuMessage, message_length};
use urom_wire::link::{LINK_MAX_MSG_SIZE, LinkMessage};
use urom_wire::report::{DirState, ListenKind, ListenStatus, PluginDirStatus, StatusRecord};
use urom_wire::{
    CpuSet, DecodeError, EncodeError, EnvEntryError, FrameRepr, List, MaxMsgSize, Status,
};

const MAX: MaxMsgSize = MaxMsgSize::DEFAULT;

fn parse_control(bytes: &[u8]) -> Result<FrameRepr<ControlMessage<'_>>, DecodeError> {
    FrameRepr::parse(bytes, MAX)
}

fn parse_link(bytes: &[u8]) -> Result<FrameRepr<LinkMessage<'_>>, DecodeError> {
    FrameRepr::parse(bytes, LINK_MAX_MSG_SIZE)
}

fn parse_data(bytes: &[u8]) -> Result<FrameRepr<DataMessage<'_>>, DecodeError> {
    FrameRepr::parse(bytes, MAX)
}

fn set_u32(bytes: &mut [u8], offset: usize, value: u32) {
    bytes[offset..offset + 4].copy_from_slice(&value.to_le_bytes());
}

fn set_u64(bytes: &mut [u8], offset: usize, value: u64) {
    bytes[offset..offset + 8].copy_from_slice(&value.to_le_bytes());
}

#[test]
fn a_frame_that_claims_more_bytes_than_it_has_is_truncated() {
    let mut bytes = golden("hello");
    bytes.pop();
    assert_eq!(
        parse_control(&bytes),
        Err(DecodeError::Truncated {
            needed: 96,
            available: 95
        })
    );
}

#[test]
fn fewer_bytes_than_a_header_are_truncated_and_not_yet_a_length() {
    let bytes = golden("ack");
    assert_eq!(
        parse_control(&bytes[..10]),
        Err(DecodeError::Truncated {
            needed: 24,
            available: 10
        })
    );
    assert_eq!(frame_length(&bytes[..23], MAX), Ok(None));
    assert_eq!(frame_length(&bytes, MAX), Ok(Some(24)));
}

#[test]
fn a_frame_longer_than_the_maximum_is_refused_from_its_header_alone() {
    let mut bytes = golden("ack");
    set_u32(&mut bytes, 8, 5000);
    let expected = DecodeError::TooLong {
        length: 5000,
        max: 4096,
    };
    assert_eq!(frame_length(&bytes, MAX), Err(expected));
    assert_eq!(parse_control(&bytes), Err(expected));
    // The same frame is fine under a larger maximum, once its bytes are there.
    bytes.resize(5000, 0);
    let large = MaxMsgSize::new(8192).unwrap();
    assert_eq!(frame_length(&bytes, large), Ok(Some(5000)));
}

#[test]
fn a_length_below_the_header_is_refused() {
    let mut bytes = golden("ack");
    set_u32(&mut bytes, 8, 10);
    assert_eq!(
        parse_control(&bytes),
        Err(DecodeError::LengthBelowHeader {
            length: 10,
            header: 24
        })
    );
}

#[test]
fn bytes_after_the_frame_are_refused() {
    let mut bytes = golden("ack");
    bytes.push(0);
    assert_eq!(
        parse_control(&bytes),
        Err(DecodeError::TrailingBytes {
            expected: 24,
            found: 25
        })
    );
}

#[test]
fn a_body_longer_than_its_message_is_refused() {
    // An ack whose frame length covers 4 body bytes.
    let mut bytes = golden("ack");
    bytes.extend_from_slice(&[0; 4]);
    set_u32(&mut bytes, 8, 28);
    assert_eq!(
        parse_control(&bytes),
        Err(DecodeError::TrailingBytes {
            expected: 0,
            found: 4
        })
    );
    // A plugin list that says one record but carries two.
    let mut bytes = golden("plugin_list_reply");
    set_u32(&mut bytes, 24, 1);
    assert_eq!(
        parse_control(&bytes),
        Err(DecodeError::TrailingBytes {
            expected: 72,
            found: 136
        })
    );
}

#[test]
fn a_list_longer_than_its_bytes_is_truncated() {
    let mut bytes = golden("workers_by_gid_reply");
    set_u32(&mut bytes, 24, 3);
    assert_eq!(
        parse_control(&bytes),
        Err(DecodeError::Truncated {
            needed: 8,
            available: 0
        })
    );
    let mut bytes = golden("workers_by_gid_reply");
    set_u32(&mut bytes, 24, u32::MAX);
    assert!(matches!(
        parse_control(&bytes),
        Err(DecodeError::Truncated { .. })
    ));
}

#[test]
fn bad_magic_is_refused_first() {
    let mut bytes = golden("hello");
    bytes[0] = b'X';
    set_u32(&mut bytes, 8, 1 << 30);
    assert_eq!(
        parse_control(&bytes),
        Err(DecodeError::BadMagic(u32::from_le_bytes(*b"XROM")))
    );
}

#[test]
fn another_protocol_version_is_refused() {
    let mut bytes = golden("hello");
    bytes[4] = 2;
    assert_eq!(
        parse_control(&bytes),
        Err(DecodeError::UnsupportedVersion(2))
    );
}

#[test]
fn an_unknown_kind_is_refused() {
    let mut bytes = golden("ack");
    bytes[6..8].copy_from_slice(&0x0199u16.to_le_bytes());
    assert_eq!(parse_control(&bytes), Err(DecodeError::UnknownKind(0x0199)));
    assert_eq!(
        frame_length(&bytes, MAX),
        Err(DecodeError::UnknownKind(0x0199))
    );
}

#[test]
fn a_frame_of_the_other_channel_is_refused() {
    let command = golden("command");
    assert_eq!(
        parse_control(&command),
        Err(DecodeError::UnexpectedKind(0x0201))
    );
    let hello = golden("hello");
    assert_eq!(parse_data(&hello), Err(DecodeError::UnexpectedKind(0x0101)));
}

#[test]
fn nonzero_flags_and_reserved_fields_are_refused() {
    let mut bytes = golden("ack");
    set_u32(&mut bytes, 12, 1);
    assert_eq!(
        parse_control(&bytes),
        Err(DecodeError::ReservedNotZero { field: "flags" })
    );

    let mut bytes = golden("hello");
    bytes[26] = 1;
    assert_eq!(
        parse_control(&bytes),
        Err(DecodeError::ReservedNotZero {
            field: "hello.reserved"
        })
    );
    let mut bytes = golden("notify");
    bytes[24 + 20] = 1;
    assert_eq!(
        parse_data(&bytes),
        Err(DecodeError::ReservedNotZero {
            field: "notify.reserved"
        })
    );
}

#[test]
fn a_name_that_is_not_utf8_is_refused() {
    let mut bytes = golden("plugin_list_reply");
    // First record's name starts at 24 + 8 + 16.
    bytes[48] = 0xff;
    assert_eq!(
        parse_control(&bytes),
        Err(DecodeError::TextNotUtf8 {
            field: "plugin name"
        })
    );
}

#[test]
fn a_name_that_is_not_nul_padded_is_refused() {
    // No terminator: all 48 bytes are text.
    let mut bytes = golden("plugin_list_reply");
    bytes[48..96].fill(b'a');
    assert_eq!(
        parse_control(&bytes),
        Err(DecodeError::TextNotNulPadded {
            field: "plugin name"
        })
    );
    // Text after the terminator.
    let mut bytes = golden("plugin_list_reply");
    bytes[95] = b'x';
    assert_eq!(
        parse_control(&bytes),
        Err(DecodeError::TextNotNulPadded {
            field: "plugin name"
        })
    );
    let mut bytes = golden("hello");
    bytes[24 + 8 + 63] = b'x';
    assert_eq!(
        parse_control(&bytes),
        Err(DecodeError::TextNotNulPadded { field: "identity" })
    );
}

#[test]
fn a_bad_environment_entry_is_refused_with_its_position() {
    let mut bytes = golden("spawn_worker");
    // Second entry "A=b" -> "A-b" (offset: 24 + 160 + 12 + 2 + 1).
    bytes[24 + 160 + 12 + 2 + 1] = b'-';
    assert_eq!(
        parse_control(&bytes),
        Err(DecodeError::InvalidEnvEntry {
            index: 1,
            reason: EnvEntryError::MissingEquals
        })
    );
    let mut bytes = golden("spawn_worker");
    bytes[24 + 160 + 2] = 0;
    assert_eq!(
        parse_control(&bytes),
        Err(DecodeError::InvalidEnvEntry {
            index: 0,
            reason: EnvEntryError::ContainsNul
        })
    );
}

/// Offsets in the `status_reply` golden vector: its first record (the daemon's) starts at 32,
/// its version text at 76; the hugepages record's body at 120.
const DAEMON_RECORD: usize = 32;
const DAEMON_VERSION: usize = 76;
const HUGEPAGES_BODY: usize = 120;

#[test]
fn status_records_that_disagree_with_their_length_are_refused() {
    // One byte more than the daemon record's fields account for.
    let mut bytes = golden("status_reply");
    bytes[DAEMON_RECORD + 2] = 0x35;
    assert_eq!(
        parse_control(&bytes),
        Err(DecodeError::TrailingBytes {
            expected: 52,
            found: 53
        })
    );
    // One byte less: the last text is cut.
    bytes[DAEMON_RECORD + 2] = 0x33;
    assert_eq!(
        parse_control(&bytes),
        Err(DecodeError::Truncated {
            needed: 3,
            available: 2
        })
    );
    // A count of ten records over nine.
    let mut bytes = golden("status_reply");
    set_u32(&mut bytes, 24, 10);
    assert_eq!(
        parse_control(&bytes),
        Err(DecodeError::Truncated {
            needed: 4,
            available: 0
        })
    );
    // A record longer than what is left of the frame.
    let mut bytes = golden("status_reply");
    bytes[DAEMON_RECORD + 2..DAEMON_RECORD + 4].copy_from_slice(&0xffffu16.to_le_bytes());
    assert!(matches!(
        parse_control(&bytes),
        Err(DecodeError::Truncated { .. })
    ));
}

#[test]
fn status_fields_are_checked() {
    let mut bytes = golden("status_reply");
    bytes[DAEMON_VERSION + 2] = 0xff;
    assert_eq!(
        parse_control(&bytes),
        Err(DecodeError::TextNotUtf8 {
            field: "daemon.version"
        })
    );
    let mut bytes = golden("status_reply");
    bytes[HUGEPAGES_BODY + 2] = 2;
    assert_eq!(
        parse_control(&bytes),
        Err(DecodeError::ReservedNotZero {
            field: "hugepages.usable"
        })
    );
    let mut bytes = golden("status_reply");
    bytes[DAEMON_RECORD + 4 + 36] = 1;
    assert_eq!(
        parse_control(&bytes),
        Err(DecodeError::ReservedNotZero {
            field: "daemon.reserved"
        })
    );
    let mut bytes = golden("status_request");
    bytes[28] = 1;
    assert_eq!(
        parse_control(&bytes),
        Err(DecodeError::ReservedNotZero {
            field: "status_request.reserved"
        })
    );
    let mut bytes = golden("counters_reply");
    bytes[24 + 68] = 1;
    assert_eq!(
        parse_link(&bytes),
        Err(DecodeError::ReservedNotZero {
            field: "counters.reserved"
        })
    );
    let mut bytes = golden("counters_reply");
    set_u32(&mut bytes, 24 + 72, 3);
    assert!(matches!(
        parse_link(&bytes),
        Err(DecodeError::Truncated { .. })
    ));
}

#[test]
fn link_and_control_frames_stay_on_their_channels() {
    assert_eq!(
        parse_control(&golden("counters_request")),
        Err(DecodeError::UnexpectedKind(0x0301))
    );
    assert_eq!(
        parse_link(&golden("status_request")),
        Err(DecodeError::UnexpectedKind(0x0130))
    );
}

#[test]
fn a_status_text_longer_than_its_length_field_is_refused() {
    let long = "x".repeat(70_000);
    let records = [StatusRecord::Listen(ListenStatus {
        kind: ListenKind::Control,
        address: &long,
    })];
    let frame = FrameRepr {
        seq: 1,
        body: ControlMessage::StatusReply(StatusReply {
            next_cursor: 0,
            records: List::new(&records),
        }),
    };
    let large = MaxMsgSize::new(1 << 20).unwrap();
    let mut buf = vec![0; 1 << 20];
    assert_eq!(
        frame.emit(&mut buf, large),
        Err(EncodeError::TooMany {
            field: "status record",
            count: 70_010,
            max: 65535
        })
    );
    let both = [StatusRecord::PluginDir(PluginDirStatus {
        state: DirState::Unreadable,
        path: &long[..40_000],
        error: &long[..40_000],
    })];
    let frame = FrameRepr {
        seq: 1,
        body: ControlMessage::StatusReply(StatusReply {
            next_cursor: 0,
            records: List::new(&both),
        }),
    };
    assert!(matches!(
        frame.emit(&mut buf, large),
        Err(EncodeError::TooMany {
            field: "status record",
            ..
        })
    ));
}

#[test]
fn a_command_length_that_disagrees_with_the_frame_is_refused() {
    let mut bytes = golden("command");
    set_u64(&mut bytes, 24 + 16, 17);
    assert_eq!(
        parse_data(&bytes),
        Err(DecodeError::Truncated {
            needed: 41,
            available: 40
        })
    );
    set_u64(&mut bytes, 24 + 16, 15);
    assert_eq!(
        parse_data(&bytes),
        Err(DecodeError::TrailingBytes {
            expected: 39,
            found: 40
        })
    );
    set_u64(&mut bytes, 24 + 16, u64::MAX);
    assert!(matches!(
        parse_data(&bytes),
        Err(DecodeError::Truncated { .. })
    ));
}

#[test]
fn a_body_shorter_than_its_header_is_truncated() {
    let bytes = hex("55524f4d 0100 0102 20000000 00000000 0000000000000000 0100000000000000");
    assert_eq!(
        parse_data(&bytes),
        Err(DecodeError::Truncated {
            needed: 24,
            available: 8
        })
    );
}

#[test]
fn gpu_oversized_wire_size_is_refused_from_the_header() {
    let bytes = hex("00000200 00000004");
    assert_eq!(
        message_length(&bytes, 256),
        Err(DecodeError::TooLong {
            length: 512,
            max: 268
        })
    );
    assert_eq!(message_length(&bytes[..7], 256), Ok(None));
}

#[test]
fn gpu_unknown_message_id_is_refused() {
    let bytes = hex("00000008 00000009");
    assert_eq!(
        GpuMessage::parse(&bytes, 256),
        Err(DecodeError::UnknownMessageId(9))
    );
}

#[test]
fn gpu_truncated_and_trailing_messages_are_refused() {
    let bytes = golden("client_request");
    assert_eq!(
        GpuMessage::parse(&bytes[..15], 256),
        Err(DecodeError::Truncated {
            needed: 16,
            available: 15
        })
    );
    assert_eq!(
        GpuMessage::parse(&bytes[..5], 256),
        Err(DecodeError::Truncated {
            needed: 8,
            available: 5
        })
    );
    let mut longer = bytes.clone();
    longer.push(0);
    assert_eq!(
        GpuMessage::parse(&longer, 256),
        Err(DecodeError::TrailingBytes {
            expected: 16,
            found: 17
        })
    );
}

#[test]
fn gpu_lengths_that_disagree_are_refused() {
    // The payload length field says 5 where the message carries 4.
    let bytes = hex("00000010 00000004 00000005 41424344");
    assert_eq!(
        GpuMessage::parse(&bytes, 256),
        Err(DecodeError::LengthMismatch {
            expected: 4,
            length: 5
        })
    );
    // A client message too short for its length field.
    let bytes = hex("0000000a 00000004 0000");
    assert_eq!(
        GpuMessage::parse(&bytes, 256),
        Err(DecodeError::LengthBelowHeader {
            length: 10,
            header: 12
        })
    );
    // A shutdown message of the wrong size.
    let bytes = hex("0000000c 00000000 00000000");
    assert_eq!(
        GpuMessage::parse(&bytes, 256),
        Err(DecodeError::LengthMismatch {
            expected: 8,
            length: 12
        })
    );
}

#[test]
fn encoders_refuse_what_cannot_be_represented() {
    let long_name = "x".repeat(48);
    let plugins = [PluginInfo {
        id: 1,
        version: 1,
        name: &long_name,
    }];
    let frame = FrameRepr {
        seq: 1,
        body: ControlMessage::PluginListReply(List::new(&plugins)),
    };
    let mut buf = [0; 4096];
    assert_eq!(
        frame.emit(&mut buf, MAX),
        Err(EncodeError::TextTooLong {
            field: "plugin name",
            length: 48,
            max: 47
        })
    );

    let many: Vec<PluginInfo> = (0..64)
        .map(|i| PluginInfo {
            id: 1 << i,
            version: 1,
            name: "p",
        })
        .collect();
    let frame = FrameRepr {
        seq: 1,
        body: ControlMessage::PluginListReply(List::new(&many)),
    };
    assert_eq!(
        frame.emit(&mut buf, MAX),
        Err(EncodeError::TooLong {
            length: 24 + 8 + 64 * 64,
            max: 4096
        })
    );

    let env = ["GOOD=1", "bad entry"];
    let spawn = SpawnWorker {
        worker_id: 0,
        plugins: 1,
        gid: 0,
        max_inflight_tasks: 1,
        cpuset: CpuSet::new(),
        env: List::new(&env),
    };
    let frame = FrameRepr {
        seq: 1,
        body: ControlMessage::SpawnWorker(spawn),
    };
    assert_eq!(
        frame.emit(&mut buf, MAX),
        Err(EncodeError::InvalidEnvEntry {
            index: 1,
            reason: EnvEntryError::MissingEquals
        })
    );

    let frame = FrameRepr {
        seq: 1,
        body: ControlMessage::Ack,
    };
    assert_eq!(
        frame.emit(&mut buf[..10], MAX),
        Err(EncodeError::BufferTooSmall {
            needed: 24,
            available: 10
        })
    );

    let payload = [0u8; 300];
    assert_eq!(
        GpuMessage::ClientRequest(&payload).emit(&mut buf, 256),
        Err(EncodeError::TooLong {
            length: 312,
            max: 268
        })
    );
}

#[test]
fn errors_read_well() {
    let text = DecodeError::TooLong {
        length: 5000,
        max: 4096,
    }
    .to_string();
    assert_eq!(
        text,
        "message of 5000 bytes exceeds the maximum message size of 4096 bytes"
    );
    let text = DecodeError::UnsupportedVersion(2).to_string();
    assert_eq!(
        text,
        "protocol version 2 is not supported (this build speaks 1)"
    );
    let text = DecodeError::InvalidEnvEntry {
        index: 3,
        reason: EnvEntryError::BadName,
    }
    .to_string();
    assert!(
        text.starts_with("environment entry 3: the name must be"),
        "{text}"
    );
    assert_eq!(
        Status::from_raw(28).to_string(),
        "DOCA_ERROR_AUTHENTICATION (28)"
    );
}
