//! The worker's side of a domain, driven frame by frame over a bare channel: it answers
//! requests for its plugins' addresses itself, takes a table in chunks, and its plugins' domain
//! lookups (a C plugin written against DOCA's headers) then answer from the table: several
//! ranks, segments, buffers without a memory handle, unknown ids. Tables out of order or
//! malformed are refused and leave the one installed in place. Domain frames the worker does not
//! take (malformed ones, replies sent by a host) get an error notification each.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use urom_transport::{Channel, FrameSendError, Transport};
use urom_wire::data::peek_command_identity;
use urom_wire::domain::{
    AddressReply, AddressRequest, Buffer, DomainMessage, MemberSpec, PluginAddress, RecordSpec,
    TableAck, TableChunk,
};
use urom_wire::{FrameRepr, MaxMsgSize, Status};

const LOOKUPS_ID: u64 = 1;

fn lookups_plugin() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let path = urom_testkit::c_shared_object(
        &root.join("plugins/c-domain-lookups/domain_lookups.c"),
        "worker_domain_lookups",
        &[&root.join("plugins/include")],
        &[],
    );
    format!("{}:{LOOKUPS_ID}", path.display())
}

fn send_domain(conn: &mut Channel, seq: u64, body: DomainMessage<'_>) {
    let frame = FrameRepr { seq, body };
    let mut bytes = vec![0; frame.buffer_len()];
    frame.emit(&mut bytes, MaxMsgSize::DEFAULT).unwrap();
    let deadline = Instant::now() + TIMEOUT;
    loop {
        match conn.send(&bytes) {
            Ok(()) => return,
            Err(FrameSendError::Full) => {
                assert!(Instant::now() < deadline, "the worker takes no frames");
                conn.wait_send(Duration::from_millis(10)).unwrap();
            }
            Err(e) => panic!("cannot send to the worker: {e}"),
        }
    }
}

/// A domain reply: an address reply `(request, plugin, status, address)` or an ack
/// `(request, 0, status, [])`.
fn next_reply(conn: &mut Channel) -> (u64, u64, Status, Vec<u8>) {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Some(frame) = conn.recv().unwrap() {
            let parsed = FrameRepr::<DomainMessage>::parse(frame, MaxMsgSize::DEFAULT)
                .unwrap_or_else(|e| panic!("not a domain reply: {e}"));
            return match parsed.body {
                DomainMessage::DomainAddressReply(AddressReply {
                    request,
                    plugin,
                    status,
                    address,
                }) => (request, plugin, status, address.to_vec()),
                DomainMessage::DomainTableAck(TableAck { request, status }) => {
                    (request, 0, status, Vec::new())
                }
                other => panic!("the worker sent a domain request: {other:?}"),
            };
        }
        assert!(Instant::now() < deadline, "no domain reply");
        conn.wait_recv(Duration::from_millis(10)).unwrap();
    }
}

/// Sends `table` as request `request` in chunks of `chunk` bytes.
fn send_table(conn: &mut Channel, request: u64, table: &[u8], chunk: usize) {
    for (i, bytes) in table.chunks(chunk).enumerate() {
        let body = DomainMessage::DomainTableChunk(TableChunk {
            request,
            table_len: table.len() as u64,
            offset: (i * chunk) as u64,
            bytes,
        });
        send_domain(conn, 100 + i as u64, body);
    }
}

/// Three ranks: rank 0 with member 0 (at "zero"); rank 1 with members 1 (at "one") and 2 (no
/// address of this plugin) and two buffers, the second without a memory handle; rank 2 with
/// member 3 (at "three") and no buffer.
fn three_ranks() -> Vec<u8> {
    let at = |address: &'static [u8]| {
        [PluginAddress {
            name: "worker_domain_lookups",
            address,
        }]
    };
    let (a0, a1, a3) = (at(b"zero\0"), at(b"one\0"), at(b"three\0"));
    let graph_only = [PluginAddress {
        name: "worker_graph",
        address: b"graph\0",
    }];
    let m0 = [MemberSpec {
        domain_id: 0,
        plugins: &a0,
    }];
    let m1 = [
        MemberSpec {
            domain_id: 1,
            plugins: &a1,
        },
        MemberSpec {
            domain_id: 2,
            plugins: &graph_only,
        },
    ];
    let m2 = [MemberSpec {
        domain_id: 3,
        plugins: &a3,
    }];
    let b0 = [Buffer {
        va: 0x1000,
        len: 0x1000,
        memh: b"memh-0",
        mkey: b"mkey-0",
    }];
    let b1 = [
        Buffer {
            va: 0x4000,
            len: 0x100,
            memh: b"memh-1a",
            mkey: b"mkey-1a",
        },
        Buffer {
            va: 0x9000,
            len: 0x1000,
            memh: b"",
            mkey: b"mkey-1b",
        },
    ];
    urom_testkit::domain::table_bytes(&[
        RecordSpec {
            rank: 0,
            members: &m0,
            buffers: &b0,
        },
        RecordSpec {
            rank: 1,
            members: &m1,
            buffers: &b1,
        },
        RecordSpec {
            rank: 2,
            members: &m2,
            buffers: &[],
        },
    ])
}

/// What the C plugin's lookup command found: statuses of addr, seg, memh, mkey; the segment;
/// the address; the memory handle; the remote key.
fn lookup(
    conn: &mut Channel,
    context: u64,
    id: u64,
    va: u64,
    seg: i32,
) -> ([Status; 4], i32, String, Vec<u8>, Vec<u8>) {
    let mut command = Vec::new();
    command.extend_from_slice(&id.to_le_bytes());
    command.extend_from_slice(&va.to_le_bytes());
    command.extend_from_slice(&seg.to_le_bytes());
    command.extend_from_slice(&[0; 4]);
    send_command(conn, context, LOOKUPS_ID, context, &command);
    let (plugin, got_context, status, report) = next_notification(conn);
    assert_eq!(
        (plugin, got_context, status),
        (LOOKUPS_ID, context, Status::Success)
    );
    assert_eq!(report.len(), 160);
    let u32_at = |at: usize| u32::from_le_bytes(report[at..at + 4].try_into().unwrap());
    (
        std::array::from_fn(|i| Status::from_raw(u32_at(i * 4) as i32)),
        u32_at(16) as i32,
        String::from_utf8(report[32..32 + u32_at(28) as usize].to_vec()).unwrap(),
        report[96..96 + (u32_at(20) as usize).min(32)].to_vec(),
        report[128..128 + (u32_at(24) as usize).min(32)].to_vec(),
    )
}

const OK: Status = Status::Success;
const NOT_FOUND: Status = Status::NotFound;

#[test]
fn the_worker_gives_its_plugins_addresses_and_answers_lookups_from_the_table() {
    let mut plugins = vec![lookups_plugin()];
    plugins.push(graph_and_faulty()[1].clone());
    let worker = start_worker(&plugins, &[]);
    let pid = worker.child.0.id();
    let mut host = connect(&worker.socket);

    // Addresses, answered by the worker through each plugin's `addr`.
    for (request, plugin) in [(1u64, LOOKUPS_ID), (2, FAULTY_ID), (3, 4), (4, 1 << 40)] {
        send_domain(
            &mut host,
            request,
            DomainMessage::DomainAddressRequest(AddressRequest { request, plugin }),
        );
    }
    let expected = [
        (
            1,
            LOOKUPS_ID,
            OK,
            format!("domain-lookups@{pid}\0").into_bytes(),
        ),
        (
            2,
            FAULTY_ID,
            OK,
            format!("faulty-address@{pid}").into_bytes(),
        ),
        (3, 4, NOT_FOUND, Vec::new()),
        (4, 1 << 40, NOT_FOUND, Vec::new()),
    ];
    for expected in expected {
        assert_eq!(next_reply(&mut host), expected);
    }

    // Before any table: unknown.
    let (statuses, seg, ..) = lookup(&mut host, 1, 1, 0x4000, 0);
    assert_eq!((statuses, seg), ([NOT_FOUND; 4], -1));

    // The table, in chunks of 100 bytes.
    let table = three_ranks();
    send_table(&mut host, 77, &table, 100);
    assert_eq!(next_reply(&mut host), (77, 0, OK, Vec::new()));

    let cases = [
        // Member 0 (rank 0): its address and its one buffer.
        (
            0,
            0x1fff,
            0,
            ([OK; 4], 0, "zero", &b"memh-0"[..], &b"mkey-0"[..]),
        ),
        // Member 1 (rank 1): va in segment 1, which has no memory handle.
        (
            1,
            0x9010,
            1,
            (
                [OK, OK, Status::NotSupported, OK],
                1,
                "one",
                &b""[..],
                &b"mkey-1b"[..],
            ),
        ),
        // Member 2 shares rank 1's buffers but runs no lookups plugin.
        (
            2,
            0x40ff,
            0,
            (
                [NOT_FOUND, OK, OK, OK],
                0,
                "",
                &b"memh-1a"[..],
                &b"mkey-1a"[..],
            ),
        ),
        // Past a buffer's end; a segment that is not there.
        (
            1,
            0x4100,
            2,
            (
                [OK, NOT_FOUND, NOT_FOUND, NOT_FOUND],
                -1,
                "one",
                &b""[..],
                &b""[..],
            ),
        ),
        // Member 3 (rank 2) has no buffer at all.
        (
            3,
            0x1000,
            0,
            (
                [OK, NOT_FOUND, NOT_FOUND, NOT_FOUND],
                -1,
                "three",
                &b""[..],
                &b""[..],
            ),
        ),
        // Unknown ids.
        (4, 0x1000, 0, ([NOT_FOUND; 4], -1, "", &b""[..], &b""[..])),
        (
            u64::MAX,
            0x1000,
            0,
            ([NOT_FOUND; 4], -1, "", &b""[..], &b""[..]),
        ),
    ];
    for (i, (id, va, seg, (statuses, found_seg, addr, memh, mkey))) in cases.into_iter().enumerate()
    {
        assert_eq!(
            lookup(&mut host, 10 + i as u64, id, va, seg),
            (
                statuses,
                found_seg,
                addr.to_owned(),
                memh.to_vec(),
                mkey.to_vec()
            ),
            "member {id}, va {va:#x}, segment {seg}"
        );
    }

    // A chunk out of order refuses its table, once; its later chunks are dropped.
    let first = DomainMessage::DomainTableChunk(TableChunk {
        request: 78,
        table_len: table.len() as u64,
        offset: 0,
        bytes: &table[..50],
    });
    send_domain(&mut host, 200, first);
    for offset in [60u64, 70] {
        let skipped = DomainMessage::DomainTableChunk(TableChunk {
            request: 78,
            table_len: table.len() as u64,
            offset,
            bytes: &table[offset as usize..offset as usize + 10],
        });
        send_domain(&mut host, 201, skipped);
    }
    assert_eq!(
        next_reply(&mut host),
        (78, 0, Status::InvalidValue, Vec::new())
    );
    // A table that does not parse is refused too.
    let mut garbage = table.clone();
    garbage[0] = b'X';
    send_table(&mut host, 79, &garbage, 4000);
    assert_eq!(
        next_reply(&mut host),
        (79, 0, Status::InvalidValue, Vec::new())
    );
    // No reply is left over, and the installed table still answers.
    assert!(!host.wait_recv(Duration::from_millis(100)).unwrap());
    let (statuses, _, addr, ..) = lookup(&mut host, 30, 3, 0, 0);
    assert_eq!((statuses[0], addr.as_str()), (OK, "three"));

    let log = std::fs::read_to_string(log_file(&worker)).unwrap();
    assert!(log.contains("domain table installed"), "{log}");
    assert!(log.contains("members=[0, 1, 2, 3]"), "{log}");
    assert!(log.contains("a domain table was refused"), "{log}");
}

/// `body` as a frame.
fn domain_frame(seq: u64, body: DomainMessage<'_>) -> Vec<u8> {
    let frame = FrameRepr { seq, body };
    let mut bytes = vec![0; frame.buffer_len()];
    let len = frame.emit(&mut bytes, MaxMsgSize::DEFAULT).unwrap();
    bytes.truncate(len);
    bytes
}

#[test]
fn domain_frames_the_worker_does_not_take_get_an_error_each() {
    let worker = start_worker(&graph_and_faulty(), &[]);
    let mut host = connect(&worker.socket);

    // Replies are the worker's to send: a host that sends one is answered with an error.
    let reply = domain_frame(
        1,
        DomainMessage::DomainAddressReply(AddressReply {
            request: 5,
            plugin: GRAPH_ID,
            status: OK,
            address: b"an address",
        }),
    );
    let ack = domain_frame(
        2,
        DomainMessage::DomainTableAck(TableAck {
            request: 6,
            status: OK,
        }),
    );
    // An address request whose body is cut short under a header that agrees with it.
    let mut short = domain_frame(
        3,
        DomainMessage::DomainAddressRequest(AddressRequest {
            request: 7,
            plugin: GRAPH_ID,
        }),
    );
    short.truncate(short.len() - 3);
    let len = short.len() as u32;
    short[8..12].copy_from_slice(&len.to_le_bytes());
    // A command frame whose kind was overwritten with the address reply's.
    let overwritten: [u8; 64] = [
        0x55, 0x52, 0x4f, 0x4d, 0x01, 0x00, 0x11, 0x02, 0x40, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x02, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x01,
        0x00, 0x00, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x80, 0x10, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x08, 0x01, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
    ];
    for frame in [&reply[..], &ack, &short, &overwritten] {
        host.send(frame).unwrap();
        let (plugin, context, status, payload) = next_notification(&mut host);
        assert_eq!(
            (plugin, context, status, payload),
            (
                peek_command_identity(frame).0,
                peek_command_identity(frame).1,
                Status::InvalidValue,
                Vec::new()
            ),
            "{frame:02x?}"
        );
    }

    // A chunk of a table that was never started refuses that table, once.
    for offset in [50u64, 60] {
        let stray = DomainMessage::DomainTableChunk(TableChunk {
            request: 9,
            table_len: 100,
            offset,
            bytes: &[0; 10],
        });
        send_domain(&mut host, 4, stray);
    }
    assert_eq!(
        next_reply(&mut host),
        (9, 0, Status::InvalidValue, Vec::new())
    );

    // The channel still carries commands, and nothing more was sent.
    send_command(&mut host, 5, GRAPH_ID, 11, &loopback(3));
    let (_, context, status, _) = next_notification(&mut host);
    assert_eq!((context, status), (11, OK));
    assert!(!host.wait_recv(Duration::from_millis(100)).unwrap());

    let log = std::fs::read_to_string(log_file(&worker)).unwrap();
    assert!(log.contains("a host sent a domain reply"), "{log}");
    assert!(log.contains("malformed domain frame from a host"), "{log}");
}
