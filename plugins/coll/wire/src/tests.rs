use super::*;

const TEAM_CREATE: [u8; 40] = [
    1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, // header: TEAM_CREATE, team 1
    1, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0x34, 0x12, 0, 0, // rank 1, size 2, 1 node, pid
    0x11, 0x11, 0, 0, 0x34, 0x12, 0, 0, // the members' pids
];

const COLL_START: [u8; 24] = [
    6, 0, 0, 0, 0, 0, 0, 0, 8, 7, 6, 5, 4, 3, 2, 1, // header: COLL_START, team
    9, 0, 0, 0, 0, 0, 0, 0, // coll 9
];

const COLL_INIT: [u8; 88] = [
    5, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, // header: COLL_INIT, team 5
    2, 0, 0, 0, 5, 0, 10, 0, // coll 2, allgatherv, f32, sum
    3, 0, 0, 0, 1, 0, 0, 0, // root 3, in place
    1, 0, 0, 0, 2, 0, 0, 0, // buffers 1 and 2
    4, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, // offsets 4 and 5
    6, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, // counts 6 and 7
    0xff, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, // words 255, 257
];

const BUFFER_REGISTER: [u8; 51] = [
    3, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, // header: BUF_REGISTER, team 7
    4, 0, 0, 0, 0, 0, 0, 0, // buffer 4, shared
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0, // addr 0, len 4096
    3, 0, 0, 0, 0, 0, 0, 0, // name of 3 bytes
    b'a', b'b', b'c',
];

const NOTIFICATION: [u8; 32] = [
    6, 0, 0, 0, 12, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, // COLL_START, status 12, team 2
    3, 0, 0, 0, 1, 0, 0, 0, 11, 0, 0, 0, 0, 1, 0, 0, // coll 3, rank 1, exited, pid 256
];

fn round_trip(bytes: &[u8], expected: CollCommand<'_>) {
    assert_eq!(CollCommand::parse(bytes), Ok(expected));
    let mut buf = [0xa5u8; 512];
    assert_eq!(expected.buffer_len(), bytes.len());
    assert_eq!(expected.emit(&mut buf), Ok(bytes.len()));
    assert_eq!(&buf[..bytes.len()], bytes);
    assert!(
        buf[bytes.len()..].iter().all(|&b| b == 0xa5),
        "wrote past its end"
    );
    assert!(matches!(
        expected.emit(&mut buf[..bytes.len() - 1]),
        Err(CollWireError::BufferTooSmall { .. })
    ));
}

#[test]
fn team_create_matches_its_golden_bytes() {
    let pids = [U32::new(0x1111), U32::new(0x1234)];
    round_trip(
        &TEAM_CREATE,
        CollCommand::TeamCreate {
            team: 1,
            rank: 1,
            nodes: 1,
            pid: 0x1234,
            pids: &pids,
            node_of: &[],
            node_workers: &[],
        },
    );
}

/// A team of 3 ranks on 2 nodes: ranks 0 and 2 on node 0 (worker domain id 5), rank 1 on
/// node 1 (domain id 0x0102).
const TEAM_CREATE_NODES: [u8; 72] = [
    1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, // header: TEAM_CREATE, team 2
    2, 0, 0, 0, 3, 0, 0, 0, 2, 0, 0, 0, 0x30, 0, 0, 0, // rank 2, size 3, 2 nodes, pid
    0x10, 0, 0, 0, 0x20, 0, 0, 0, 0x30, 0, 0, 0, // the members' pids
    0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, // their nodes
    5, 0, 0, 0, 0, 0, 0, 0, 2, 1, 0, 0, 0, 0, 0, 0, // the nodes' workers
];

#[test]
fn a_team_spanning_nodes_matches_its_golden_bytes() {
    let pids = [U32::new(0x10), U32::new(0x20), U32::new(0x30)];
    let node_of = [U32::new(0), U32::new(1), U32::new(0)];
    let node_workers = [U64::new(5), U64::new(0x0102)];
    round_trip(
        &TEAM_CREATE_NODES,
        CollCommand::TeamCreate {
            team: 2,
            rank: 2,
            nodes: 2,
            pid: 0x30,
            pids: &pids,
            node_of: &node_of,
            node_workers: &node_workers,
        },
    );
    // A node index not below the count, no nodes, more nodes than ranks, a missing domain id.
    let mut bad = TEAM_CREATE_NODES;
    bad[44] = 2;
    assert_eq!(CollCommand::parse(&bad), Err(CollWireError::BadTeam));
    let mut bad = TEAM_CREATE_NODES;
    bad[24] = 0;
    assert_eq!(CollCommand::parse(&bad), Err(CollWireError::BadTeam));
    let mut bad = TEAM_CREATE_NODES;
    bad[24] = 4;
    assert_eq!(CollCommand::parse(&bad), Err(CollWireError::BadTeam));
    assert!(matches!(
        CollCommand::parse(&TEAM_CREATE_NODES[..64]),
        Err(CollWireError::BadLength { .. })
    ));
    // One node: nothing follows the process ids.
    let mut one = TEAM_CREATE_NODES;
    one[24] = 1;
    assert!(matches!(
        CollCommand::parse(&one),
        Err(CollWireError::BadLength { .. })
    ));
}

#[test]
fn coll_start_and_destroy_match_their_golden_bytes() {
    round_trip(
        &COLL_START,
        CollCommand::CollStart {
            team: 0x0102_0304_0506_0708,
            coll: 9,
        },
    );
    let mut destroy = COLL_START;
    destroy[0] = 7;
    round_trip(
        &destroy,
        CollCommand::CollDestroy {
            team: 0x0102_0304_0506_0708,
            coll: 9,
        },
    );
    let mut dereg = COLL_START;
    dereg[0] = 4;
    round_trip(
        &dereg,
        CollCommand::BufferDeregister {
            team: 0x0102_0304_0506_0708,
            buffer: 9,
        },
    );
    round_trip(
        &[2, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0],
        CollCommand::TeamDestroy { team: 3 },
    );
}

#[test]
fn coll_init_matches_its_golden_bytes() {
    let words = [U64::new(255), U64::new(257)];
    round_trip(
        &COLL_INIT,
        CollCommand::CollInit {
            team: 5,
            args: CollArgs {
                coll: 2,
                kind: CollKind::Allgatherv,
                datatype: Datatype::F32,
                op: ReduceOp::Sum,
                root: 3,
                flags: FLAG_IN_PLACE,
                send_buf: 1,
                recv_buf: 2,
                send_off: 4,
                recv_off: 5,
                count: 6,
                recv_count: 7,
            },
            words: &words,
        },
    );
}

#[test]
fn buffer_register_matches_its_golden_bytes() {
    round_trip(
        &BUFFER_REGISTER,
        CollCommand::BufferRegister {
            team: 7,
            buffer: 4,
            kind: BufferKind::Shared,
            addr: 0,
            len: 4096,
            name: b"abc",
        },
    );
}

#[test]
fn notification_matches_its_golden_bytes() {
    let n = CollNotification {
        opcode: Opcode::CollStart,
        status: 12,
        team: 2,
        id: 3,
        rank: 1,
        reason: Reason::RankExited,
        worker_pid: 256,
    };
    assert_eq!(CollNotification::parse(&NOTIFICATION), Ok(n));
    let mut buf = [0xa5u8; 40];
    assert_eq!(n.emit(&mut buf), Ok(32));
    assert_eq!(&buf[..32], &NOTIFICATION);
    assert!(buf[32..].iter().all(|&b| b == 0xa5));
    assert!(CollNotification::parse(&NOTIFICATION[..31]).is_err());
    let mut unknown = NOTIFICATION;
    unknown[24] = 200;
    assert_eq!(
        CollNotification::parse(&unknown).map(|n| n.reason),
        Ok(Reason::Unknown(200))
    );
}

#[test]
fn malformed_commands_are_refused() {
    assert_eq!(
        CollCommand::parse(&COLL_START[..10]),
        Err(CollWireError::Truncated {
            len: 10,
            needed: 16
        })
    );
    let mut bad = COLL_START;
    bad[0] = 99;
    assert_eq!(
        CollCommand::parse(&bad),
        Err(CollWireError::UnknownOpcode(99))
    );
    let mut bad = COLL_START;
    bad[4] = 1;
    assert_eq!(CollCommand::parse(&bad), Err(CollWireError::Reserved));
    let mut bad = COLL_START;
    bad[20] = 1;
    assert_eq!(CollCommand::parse(&bad), Err(CollWireError::Reserved));
    let mut long = [0u8; 25];
    long[..24].copy_from_slice(&COLL_START);
    assert_eq!(
        CollCommand::parse(&long),
        Err(CollWireError::BadLength {
            len: 25,
            expected: 24
        })
    );
    // A team create whose pids do not match its size.
    assert!(matches!(
        CollCommand::parse(&TEAM_CREATE[..36]),
        Err(CollWireError::BadLength { .. })
    ));
    // Rank not below size.
    let mut bad = TEAM_CREATE;
    bad[16] = 2;
    assert_eq!(CollCommand::parse(&bad), Err(CollWireError::BadTeam));
    // Size 0.
    let mut bad = TEAM_CREATE;
    bad[16] = 0;
    bad[20] = 0;
    assert_eq!(CollCommand::parse(&bad[..32]), Err(CollWireError::BadTeam));
    // Name length beyond what follows, and beyond the limit.
    assert!(matches!(
        CollCommand::parse(&BUFFER_REGISTER[..50]),
        Err(CollWireError::BadLength { .. })
    ));
    let mut bad = BUFFER_REGISTER;
    bad[40] = 200;
    assert_eq!(
        CollCommand::parse(&bad),
        Err(CollWireError::NameTooLong(200))
    );
    // Words not a multiple of 8, unknown flags.
    assert!(matches!(
        CollCommand::parse(&COLL_INIT[..87]),
        Err(CollWireError::BadLength { .. })
    ));
    let mut bad = COLL_INIT;
    bad[28] = 3;
    assert_eq!(CollCommand::parse(&bad), Err(CollWireError::BadCollInit));
}

#[test]
fn unknown_codes_are_kept() {
    let mut init = COLL_INIT;
    init[20] = 77;
    init[22] = 99;
    init[23] = 42;
    let Ok(CollCommand::CollInit { args, .. }) = CollCommand::parse(&init) else {
        panic!("an init with unknown codes parses");
    };
    assert_eq!(args.kind, CollKind::Unknown(77));
    assert_eq!(args.datatype, Datatype::Unknown(99));
    assert_eq!(args.op, ReduceOp::Unknown(42));
    let mut buf = [0xa5u8; 88];
    let words = [U64::new(255), U64::new(257)];
    let cmd = CollCommand::CollInit {
        team: 5,
        args,
        words: &words,
    };
    assert_eq!(cmd.emit(&mut buf), Ok(88));
    assert_eq!(buf, init);
}

#[test]
fn codes_round_trip_and_ops_apply_as_mpi_says() {
    for kind in CollKind::ALL {
        assert_eq!(CollKind::from_raw(kind.raw()), *kind);
    }
    for dt in Datatype::ALL {
        assert_eq!(Datatype::from_raw(dt.raw()), *dt);
        assert!(dt.size().is_some());
    }
    for op in Opcode::ALL {
        assert_eq!(Opcode::from_raw(op.raw()), Some(*op));
    }
    assert!(ReduceOp::Sum.applies_to(Datatype::F16));
    assert!(!ReduceOp::Band.applies_to(Datatype::F32));
    assert!(!ReduceOp::Lxor.applies_to(Datatype::Bf16));
    assert!(ReduceOp::Lxor.applies_to(Datatype::U8));
    assert!(!ReduceOp::Unknown(50).applies_to(Datatype::U8));
    assert!(!ReduceOp::Sum.applies_to(Datatype::Unknown(50)));
    assert_eq!(CollKind::Alltoallv.words(3), 12);
    assert_eq!(CollKind::Allgatherv.words(3), 6);
    assert_eq!(CollKind::Allreduce.words(3), 0);
}

#[test]
fn every_prefix_of_every_golden_is_refused_or_parsed_without_panic() {
    for golden in [
        &TEAM_CREATE[..],
        &TEAM_CREATE_NODES,
        &COLL_START,
        &COLL_INIT,
        &BUFFER_REGISTER,
        &NOTIFICATION,
    ] {
        for len in 0..golden.len() {
            let _ = CollCommand::parse(&golden[..len]);
            let _ = CollNotification::parse(&golden[..len]);
        }
    }
}
