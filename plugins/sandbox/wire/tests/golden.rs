//! The sandbox plugin's messages: golden vectors of both command layouts (UCX 1.13's 64-byte
//! commands, the 72-byte commands of UCX 1.14 and later) both ways, the refusal of any other
//! length, and any bytes either refused or packed back to the same command.

use proptest::prelude::*;
use urom_sandbox_wire::{
    COMMAND_LEN_UCX_1_13, COMMAND_LEN_UCX_1_14, CommandLayout, MemMapParams, SandboxCommand,
    SandboxError, SandboxNotification,
};
use urom_testkit::golden::assert_emits;
use urom_testkit::golden::hex;
use urom_wire::Status;

// MEM_MAP in UCX 1.13's layout: type 0 | context 5 | field_mask 0x1f | address 0x1000 |
// length 0x2000 | flags 1, prot 0x303 | memory_type 0, pad | memh length 4 | "memh".
const MEM_MAP: &str = "0000000000000000 0500000000000000 1f00000000000000 0010000000000000
    0020000000000000 01000000 03030000 00000000 00000000 0400000000000000 6d656d68";
// MEM_MAP in the layout of UCX 1.14 and later: the same, with the field mask's
// EXPORTED_MEMH_BUFFER bit (0x20), then exported_memh_buffer (the sender's pointer
// 0x7f0000001000), then the memh length 4 | "memh".
const MEM_MAP_UCX114: &str = "0000000000000000 0500000000000000 3f00000000000000
    0010000000000000 0020000000000000 01000000 03030000 00000000 00000000 00100000007f0000
    0400000000000000 6d656d68";
// TAG_SEND inline: type 1 | context 0xbeef | dest 1 | buffer 0 | count 12 | tag 0x1234 |
// memh_id 0 | pad | "hello world\0".
const TAG_SEND_INLINE: &str = "0100000000000000 efbe000000000000 0100000000000000
    0000000000000000 0c00000000000000 3412000000000000 0000000000000000 0000000000000000
    68656c6c6f20776f726c6400";
// The same in the 1.14 layout: 8 more bytes of padding before the data.
const TAG_SEND_INLINE_UCX114: &str = "0100000000000000 efbe000000000000 0100000000000000
    0000000000000000 0c00000000000000 3412000000000000 0000000000000000 0000000000000000
    0000000000000000 68656c6c6f20776f726c6400";
// TAG_SEND from host memory: type 1 | context 1 | dest 2 | buffer 0x9000 | count 4096 | tag 7 |
// memh_id 1 | pad.
const TAG_SEND_BUFFER: &str = "0100000000000000 0100000000000000 0200000000000000
    0090000000000000 0010000000000000 0700000000000000 0100000000000000 0000000000000000";
// TAG_RECV: type 2 | context 0xdead | buffer 0 | count 100 | tag 0x1234 | mask 0xffff |
// memh_id 0 | pad.
const TAG_RECV: &str = "0200000000000000 adde000000000000 0000000000000000 6400000000000000
    3412000000000000 ffff000000000000 0000000000000000 0000000000000000";
const TAG_RECV_UCX114: &str = "0200000000000000 adde000000000000 0000000000000000
    6400000000000000 3412000000000000 ffff000000000000 0000000000000000 0000000000000000
    0000000000000000";
// Notifications (48 bytes whatever the UCX): MEM_MAP context 2, memh_id 7; TAG_SEND context 9,
// status 0; TAG_RECV context 0xbeef, buffer 1 (inline), count 12, sender tag 0x5678, status 0,
// "hello world\0".
const NOTIFY_MEM_MAP: &str = "0000000000000000 0200000000000000 0700000000000000
    0000000000000000 0000000000000000 0000000000000000";
const NOTIFY_TAG_SEND: &str = "0100000000000000 0900000000000000 0000000000000000
    0000000000000000 0000000000000000 0000000000000000";
const NOTIFY_TAG_RECV: &str = "0200000000000000 efbe000000000000 0100000000000000
    0c00000000000000 7856000000000000 0000000000000000 68656c6c6f20776f726c6400";

fn params(field_mask: u64, exported_memh_buffer: u64) -> MemMapParams {
    MemMapParams {
        field_mask,
        address: 0x1000,
        length: 0x2000,
        flags: 1,
        prot: 0x303,
        memory_type: 0,
        exported_memh_buffer,
    }
}

/// Each command vector, its command and its layout.
fn commands() -> Vec<(
    &'static str,
    &'static str,
    SandboxCommand<'static>,
    CommandLayout,
)> {
    let inline = SandboxCommand::TagSend {
        context: 0xbeef,
        dest: 1,
        buffer: 0,
        count: 12,
        tag: 0x1234,
        memh_id: 0,
        data: b"hello world\0",
    };
    let recv = SandboxCommand::TagRecv {
        context: 0xdead,
        buffer: 0,
        count: 100,
        tag: 0x1234,
        tag_mask: 0xffff,
        memh_id: 0,
    };
    vec![
        (
            "mem_map",
            MEM_MAP,
            SandboxCommand::MemMap {
                context: 5,
                params: params(0x1f, 0),
                exported_memh: b"memh",
            },
            CommandLayout::Ucx113,
        ),
        (
            "mem_map_ucx114",
            MEM_MAP_UCX114,
            SandboxCommand::MemMap {
                context: 5,
                params: params(0x3f, 0x7f00_0000_1000),
                exported_memh: b"memh",
            },
            CommandLayout::Ucx114,
        ),
        (
            "tag_send_inline",
            TAG_SEND_INLINE,
            inline,
            CommandLayout::Ucx113,
        ),
        (
            "tag_send_inline_ucx114",
            TAG_SEND_INLINE_UCX114,
            inline,
            CommandLayout::Ucx114,
        ),
        (
            "tag_send_buffer",
            TAG_SEND_BUFFER,
            SandboxCommand::TagSend {
                context: 1,
                dest: 2,
                buffer: 0x9000,
                count: 4096,
                tag: 7,
                memh_id: 1,
                data: &[],
            },
            CommandLayout::Ucx113,
        ),
        ("tag_recv", TAG_RECV, recv, CommandLayout::Ucx113),
        (
            "tag_recv_ucx114",
            TAG_RECV_UCX114,
            recv,
            CommandLayout::Ucx114,
        ),
    ]
}

fn notifications() -> Vec<(&'static str, &'static str, SandboxNotification<'static>)> {
    vec![
        (
            "notify_mem_map",
            NOTIFY_MEM_MAP,
            SandboxNotification::MemMap {
                context: 2,
                memh_id: 7,
            },
        ),
        (
            "notify_tag_send",
            NOTIFY_TAG_SEND,
            SandboxNotification::TagSend {
                context: 9,
                status: 0,
            },
        ),
        (
            "notify_tag_recv",
            NOTIFY_TAG_RECV,
            SandboxNotification::TagRecv {
                context: 0xbeef,
                buffer: 1,
                count: 12,
                sender_tag: 0x5678,
                status: 0,
                data: b"hello world\0",
            },
        ),
    ]
}

#[test]
fn commands_of_both_layouts_unpack_and_pack_their_golden_bytes() {
    for (name, golden, command, layout) in commands() {
        let golden = hex(golden);
        assert_eq!(
            SandboxCommand::unpack_with_layout(&golden),
            Ok((command, layout)),
            "{name}"
        );
        assert_eq!(command.buffer_len(layout), golden.len(), "{name}");
        assert_emits(name, &golden, |buf| command.pack(layout, buf).unwrap());
    }
}

#[test]
fn a_64_byte_and_a_72_byte_mem_map_are_both_understood() {
    let short = hex(MEM_MAP);
    let long = hex(MEM_MAP_UCX114);
    assert_eq!(short.len(), COMMAND_LEN_UCX_1_13 + 4);
    assert_eq!(long.len(), COMMAND_LEN_UCX_1_14 + 4);
    for bytes in [&short, &long] {
        match SandboxCommand::unpack(bytes) {
            Ok(SandboxCommand::MemMap {
                context: 5,
                params,
                exported_memh: b"memh",
            }) => assert_eq!((params.address, params.length), (0x1000, 0x2000)),
            other => panic!("{} bytes: {other:?}", bytes.len()),
        }
    }
}

#[test]
fn a_command_of_another_length_is_refused_naming_both_lengths() {
    // A 1.13 MEM_MAP whose memory handle lost a byte, and one with a byte too many.
    let short = hex(MEM_MAP);
    for len in [short.len() - 1, short.len() + 1] {
        let mut bytes = short.clone();
        bytes.resize(len, 0);
        let error = SandboxCommand::unpack(&bytes).unwrap_err();
        assert!(
            matches!(
                error,
                SandboxError::BadCommandLength { kind: 0, len: l, ucx_1_13: 68, .. } if l == len
            ),
            "{error:?}"
        );
        let text = error.to_string();
        assert!(
            text.contains(&format!("{len} bytes"))
                && text.contains("expected 68")
                && text.contains("64-byte")
                && text.contains("72-byte")
                && text.contains("UCX 1.13")
                && text.contains("UCX 1.14 and later"),
            "{text}"
        );
        assert_eq!(Status::from(error), Status::InvalidValue);
    }
    // A receive is 64 or 72 bytes, nothing in between or past.
    let recv = hex(TAG_RECV);
    for len in [63, 65, 70, 73, 80] {
        let mut bytes = recv.clone();
        bytes.resize(len, 0);
        let refused = SandboxCommand::unpack(&bytes);
        let expected = if len < 64 {
            Err(SandboxError::BadLength { len, expected: 0 })
        } else {
            Err(SandboxError::BadCommandLength {
                kind: 2,
                len,
                ucx_1_13: 64,
                ucx_1_14: 72,
            })
        };
        assert_eq!(refused, expected, "{len} bytes");
    }
    // An inline send of 12 bytes is 76 or 84 bytes.
    let mut send = hex(TAG_SEND_INLINE);
    send.extend_from_slice(&[0; 4]);
    assert_eq!(
        SandboxCommand::unpack(&send),
        Err(SandboxError::BadCommandLength {
            kind: 1,
            len: 80,
            ucx_1_13: 76,
            ucx_1_14: 84
        })
    );
}

#[test]
fn notifications_unpack_and_pack_their_golden_bytes() {
    for (name, golden, notification) in notifications() {
        let golden = hex(golden);
        assert_eq!(
            SandboxNotification::unpack(&golden),
            Ok(notification),
            "{name}"
        );
        assert_eq!(notification.buffer_len(), golden.len(), "{name}");
        assert_emits(name, &golden, |buf| notification.pack(buf).unwrap());
    }
}

#[test]
fn fuzz_seed_corpus_matches_the_golden_vectors() {
    let mut vectors: Vec<(&str, Vec<u8>)> = commands()
        .into_iter()
        .map(|(name, golden, _, _)| (name, hex(golden)))
        .collect();
    vectors.extend(
        notifications()
            .into_iter()
            .map(|(name, golden, _)| (name, hex(golden))),
    );
    urom_testkit::golden::check_fuzz_seeds("sandbox", &vectors);
}

/// A command read from `bytes` packs, in the layout it was read in, to `bytes`' length and
/// reads back the same.
fn assert_canonical(bytes: &[u8]) {
    if let Ok((command, layout)) = SandboxCommand::unpack_with_layout(bytes) {
        let mut out = vec![0xa5u8; bytes.len() + 1];
        let written = command.pack(layout, &mut out).unwrap();
        assert_eq!(written, bytes.len());
        assert_eq!(out[written], 0xa5);
        assert_eq!(
            SandboxCommand::unpack_with_layout(&out[..written]),
            Ok((command, layout))
        );
    }
}

proptest! {
    #[test]
    fn random_bytes_are_refused_or_canonical(bytes in prop::collection::vec(any::<u8>(), 0..120)) {
        assert_canonical(&bytes);
    }

    #[test]
    fn a_mem_map_reads_back_in_the_layout_it_was_packed_in(
        field_mask in any::<u64>(),
        pointer in any::<u64>(),
        memh in prop::collection::vec(any::<u8>(), 0..40),
        ucx114 in any::<bool>(),
    ) {
        let layout = if ucx114 { CommandLayout::Ucx114 } else { CommandLayout::Ucx113 };
        let command = SandboxCommand::MemMap {
            context: 1,
            params: params(field_mask, if ucx114 { pointer } else { 0 }),
            exported_memh: &memh,
        };
        let mut buf = vec![0u8; command.buffer_len(layout)];
        command.pack(layout, &mut buf).unwrap();
        let read = SandboxCommand::unpack_with_layout(&buf).unwrap();
        // Only when both layouts fit does the field mask decide; the command is then the one
        // the deciding layout reads, never a misread of the other's length.
        if read.1 == layout {
            prop_assert_eq!(read.0, command);
        } else {
            let (SandboxCommand::MemMap { exported_memh, .. }, _) = read else {
                panic!("not a MEM_MAP");
            };
            prop_assert_eq!(
                exported_memh.len() + read.1.fixed_len(),
                memh.len() + layout.fixed_len()
            );
        }
    }
}
