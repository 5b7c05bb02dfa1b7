//! Property tests: any message emits and parses back to itself; any bytes either fail to parse
//! or parse to a message that emits back to exactly those bytes (one encoding per message).

mod common;

use proptest::prelude::*;
use urom_wire::control::{
    AuthChallenge, AuthMethod, AuthResponse, ControlMessage, EndpointKind, ErrorReply, Hello,
    PluginInfo, SecretProof, ServiceProof, SpawnResult, SpawnWorker, StatusReply, WorkerExit,
};
use urom_wire::data::{Command, DataMessage, Notification, max_notify_payload};
use urom_wire::gpu::{DEFAULT_MAX_MESSAGE_LENGTH, GpuMessage};
use urom_wire::link::{CounterReport, LINK_MAX_MSG_SIZE, LinkMessage};
use urom_wire::report::{
    DaemonStatus, DirState, ErrorCount, ErrorEntry, HugePagesMode, HugePagesStatus, ListenKind,
    ListenStatus, PluginDirStatus, PluginFileStatus, PluginOutcome, StatusRecord, WorkerCounters,
    WorkerState, WorkerStatus,
};
use urom_wire::{CpuSet, FrameRepr, List, MaxMsgSize, Status};

const MAX: MaxMsgSize = MaxMsgSize::DEFAULT;

/// Owned inputs from which a borrowed [`ControlMessage`] is built.
#[derive(Debug, Clone)]
enum Spec {
    Hello(u16, u32, String),
    AuthChallenge(u32, [u8; 32]),
    AuthResponse(u32, [u8; 32]),
    SecretProof([u8; 32], [u8; 32]),
    ServiceProof([u8; 32]),
    Ack,
    Error(i32, String),
    PluginListRequest,
    PluginList(Vec<(u64, u64, String)>),
    CpusetRequest,
    Cpuset(Vec<usize>),
    Spawn(u64, u64, u32, u32, Vec<usize>, Vec<String>),
    SpawnResult(u64, u16, Vec<u8>),
    Destroy(u64),
    GidRequest(u32),
    GidReply(Vec<u64>),
    Exit(u64, i32, i32),
    StatusRequest(u32),
    StatusReply(u32, Vec<RecordSpec>),
}

/// Owned inputs of one status record: a kind (1 to 8 are known, others are kept as they are),
/// numbers and texts that the record takes what it needs of.
type RecordSpec = (u16, [u64; 4], [u16; 2], [String; 3]);

fn record_spec() -> impl Strategy<Value = RecordSpec> {
    (
        prop_oneof![1u16..=8, any::<u16>()],
        any::<[u64; 4]>(),
        any::<[u16; 2]>(),
        [text(60), text(60), text(60)],
    )
}

fn record((kind, n, small, texts): &RecordSpec) -> StatusRecord<'_> {
    let [a, b, c] = texts;
    let [x, y, z, w] = *n;
    let [s, t] = *small;
    match kind {
        1 => StatusRecord::Daemon(DaemonStatus {
            pid: x as u32,
            workers: y as u32,
            started_unix_ms: z,
            uptime_ms: w,
            max_msg_size: (x >> 32) as u32,
            max_workers: (y >> 32) as u32,
            hosts: (z >> 32) as u32,
            version: a,
            cpuset: b,
        }),
        2 => StatusRecord::Listen(ListenStatus {
            kind: ListenKind::from_raw(s),
            address: a,
        }),
        3 => StatusRecord::HugePages(HugePagesStatus {
            mode: HugePagesMode::from_raw(s),
            usable: t % 2 == 1,
            page_kib: x as u32,
            total: y as u32,
            free: z as u32,
            mounts: a,
        }),
        4 => StatusRecord::PluginDir(PluginDirStatus {
            state: DirState::from_raw(s),
            path: a,
            error: b,
        }),
        5 => StatusRecord::PluginFile(PluginFileStatus {
            outcome: PluginOutcome::from_raw(s),
            id: x,
            version: y,
            name: a,
            path: b,
            reason: c,
        }),
        6 => StatusRecord::Worker(WorkerStatus {
            id: x,
            plugins: y,
            started_unix_ms: z,
            pid: w as u32,
            uid: (w >> 32) as u32,
            gid: x as u32,
            state: WorkerState::from_raw(s),
            hosts: t.into(),
            user: a,
            cpuset: b,
        }),
        7 => StatusRecord::Counters(counters(n)),
        8 => StatusRecord::ErrorCount(ErrorCount {
            worker_id: x,
            status: Status::from_raw(y as i32),
            count: z,
        }),
        &kind => StatusRecord::Unknown {
            kind,
            body: a.as_bytes(),
        },
    }
}

fn counters(n: &[u64; 4]) -> WorkerCounters {
    let [x, y, z, w] = *n;
    WorkerCounters {
        worker_id: x,
        commands: y,
        notifications: z,
        errors: w,
        bytes_in: x ^ y,
        bytes_out: y ^ z,
        peak_backlog_bytes: z ^ w,
        in_flight: x as u32,
        peak_ring: y as u32,
        hosts: z as u32,
    }
}

fn text(max_bytes: usize) -> impl Strategy<Value = String> {
    "\\PC{0,24}".prop_filter("fits its field", move |s| s.len() <= max_bytes)
}

fn spec() -> impl Strategy<Value = Spec> {
    let env_entry = "[A-Za-z_][A-Za-z0-9_]{0,8}=[ -~]{0,20}";
    let cpus = prop::collection::vec(0usize..1024, 0..16);
    prop_oneof![
        (any::<u16>(), any::<u32>(), text(63)).prop_map(|(v, m, i)| Spec::Hello(v, m, i)),
        (any::<u32>(), any::<[u8; 32]>()).prop_map(|(m, n)| Spec::AuthChallenge(m, n)),
        (any::<u32>(), any::<[u8; 32]>()).prop_map(|(m, p)| Spec::AuthResponse(m, p)),
        (any::<[u8; 32]>(), any::<[u8; 32]>()).prop_map(|(n, p)| Spec::SecretProof(n, p)),
        any::<[u8; 32]>().prop_map(Spec::ServiceProof),
        Just(Spec::Ack),
        (any::<i32>(), text(119)).prop_map(|(s, r)| Spec::Error(s, r)),
        Just(Spec::PluginListRequest),
        prop::collection::vec((any::<u64>(), any::<u64>(), text(47)), 0..20)
            .prop_map(Spec::PluginList),
        Just(Spec::CpusetRequest),
        cpus.clone().prop_map(Spec::Cpuset),
        (
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
            cpus,
            prop::collection::vec(env_entry, 0..8)
        )
            .prop_map(|(w, p, g, m, c, e)| Spec::Spawn(w, p, g, m, c, e)),
        (
            any::<u64>(),
            any::<u16>(),
            prop::collection::vec(any::<u8>(), 0..200)
        )
            .prop_map(|(w, k, a)| Spec::SpawnResult(w, k, a)),
        any::<u64>().prop_map(Spec::Destroy),
        any::<u32>().prop_map(Spec::GidRequest),
        prop::collection::vec(any::<u64>(), 0..100).prop_map(Spec::GidReply),
        (any::<u64>(), any::<i32>(), any::<i32>()).prop_map(|(w, c, s)| Spec::Exit(w, c, s)),
        any::<u32>().prop_map(Spec::StatusRequest),
        (any::<u32>(), prop::collection::vec(record_spec(), 0..12))
            .prop_map(|(c, r)| Spec::StatusReply(c, r)),
    ]
}

/// Builds the message from `spec` and hands it to `check` (the message borrows from `spec`).
fn with_message(spec: &Spec, check: impl FnOnce(ControlMessage<'_>)) {
    let plugins: Vec<PluginInfo>;
    let env: Vec<&str>;
    let records: Vec<StatusRecord>;
    let message = match spec {
        Spec::Hello(protocol_version, max_msg_size, identity) => ControlMessage::Hello(Hello {
            protocol_version: *protocol_version,
            max_msg_size: *max_msg_size,
            identity,
        }),
        Spec::AuthChallenge(method, nonce) => ControlMessage::AuthChallenge(AuthChallenge {
            method: AuthMethod::from_raw(*method),
            nonce: *nonce,
        }),
        Spec::AuthResponse(method, proof) => ControlMessage::AuthResponse(AuthResponse {
            method: AuthMethod::from_raw(*method),
            proof: *proof,
        }),
        Spec::SecretProof(nonce, proof) => ControlMessage::SecretProof(SecretProof {
            nonce: *nonce,
            proof: *proof,
        }),
        Spec::ServiceProof(proof) => ControlMessage::ServiceProof(ServiceProof { proof: *proof }),
        Spec::Ack => ControlMessage::Ack,
        Spec::Error(status, reason) => ControlMessage::Error(ErrorReply {
            status: Status::from_raw(*status),
            reason,
        }),
        Spec::PluginListRequest => ControlMessage::PluginListRequest,
        Spec::PluginList(records) => {
            plugins = records
                .iter()
                .map(|(id, version, name)| PluginInfo {
                    id: *id,
                    version: *version,
                    name,
                })
                .collect();
            ControlMessage::PluginListReply(List::new(&plugins))
        }
        Spec::CpusetRequest => ControlMessage::CpusetRequest,
        Spec::Cpuset(cpus) => ControlMessage::CpusetReply(cpus.iter().copied().collect()),
        Spec::Spawn(worker_id, plugins, gid, max_inflight_tasks, cpus, entries) => {
            env = entries.iter().map(String::as_str).collect();
            ControlMessage::SpawnWorker(SpawnWorker {
                worker_id: *worker_id,
                plugins: *plugins,
                gid: *gid,
                max_inflight_tasks: *max_inflight_tasks,
                cpuset: cpus.iter().copied().collect::<CpuSet>(),
                env: List::new(&env),
            })
        }
        Spec::SpawnResult(worker_id, endpoint, address) => {
            ControlMessage::SpawnResult(SpawnResult {
                worker_id: *worker_id,
                endpoint: EndpointKind::from_raw(*endpoint),
                address,
            })
        }
        Spec::Destroy(worker_id) => ControlMessage::DestroyWorker {
            worker_id: *worker_id,
        },
        Spec::GidRequest(gid) => ControlMessage::WorkersByGidRequest { gid: *gid },
        Spec::GidReply(ids) => ControlMessage::WorkersByGidReply(List::new(ids)),
        Spec::Exit(worker_id, exit_code, signal) => ControlMessage::WorkerExited(WorkerExit {
            worker_id: *worker_id,
            exit_code: *exit_code,
            signal: *signal,
        }),
        Spec::StatusRequest(cursor) => ControlMessage::StatusRequest { cursor: *cursor },
        Spec::StatusReply(next_cursor, specs) => {
            records = specs.iter().map(record).collect();
            ControlMessage::StatusReply(StatusReply {
                next_cursor: *next_cursor,
                records: List::new(&records),
            })
        }
    };
    check(message);
}

/// Parses `bytes` with every decoder; whatever parses must emit back to the same bytes.
fn assert_canonical(bytes: &[u8]) {
    if let Ok(frame) = FrameRepr::<ControlMessage>::parse(bytes, MAX) {
        let mut out = vec![0xa5; bytes.len()];
        assert_eq!(frame.emit(&mut out, MAX), Ok(bytes.len()));
        assert_eq!(out, bytes);
    }
    if let Ok(frame) = FrameRepr::<LinkMessage>::parse(bytes, LINK_MAX_MSG_SIZE) {
        let mut out = vec![0xa5; bytes.len()];
        assert_eq!(frame.emit(&mut out, LINK_MAX_MSG_SIZE), Ok(bytes.len()));
        assert_eq!(out, bytes);
    }
    if let Ok(frame) = FrameRepr::<DataMessage>::parse(bytes, MAX) {
        let mut out = vec![0xa5; bytes.len()];
        assert_eq!(frame.emit(&mut out, MAX), Ok(bytes.len()));
        assert_eq!(out, bytes);
    }
    if let Ok(message) = GpuMessage::parse(bytes, DEFAULT_MAX_MESSAGE_LENGTH) {
        let mut out = vec![0xa5; bytes.len()];
        assert_eq!(
            message.emit(&mut out, DEFAULT_MAX_MESSAGE_LENGTH),
            Ok(bytes.len())
        );
        assert_eq!(out, bytes);
    }
}

proptest! {
    #[test]
    fn control_messages_round_trip(spec in spec(), seq in any::<u64>()) {
        with_message(&spec, |body| {
            let frame = FrameRepr { seq, body };
            let large = MaxMsgSize::new(MaxMsgSize::MAX).unwrap();
            let mut buf = vec![0xa5; frame.buffer_len()];
            assert_eq!(frame.emit(&mut buf, large), Ok(buf.len()));
            let parsed = FrameRepr::<ControlMessage>::parse(&buf, large).unwrap();
            assert_eq!(parsed, frame);
            assert_canonical(&buf);
        });
    }

    #[test]
    fn counter_reports_round_trip(
        n in any::<[u64; 4]>(),
        errors in prop::collection::vec((any::<i32>(), any::<u64>()), 0..40),
        seq in any::<u64>(),
    ) {
        let entries: Vec<ErrorEntry> = errors
            .iter()
            .map(|&(status, count)| ErrorEntry { status: Status::from_raw(status), count })
            .collect();
        let frame = FrameRepr {
            seq,
            body: LinkMessage::CountersReply(CounterReport {
                counters: counters(&n),
                errors: List::new(&entries),
            }),
        };
        let mut buf = vec![0xa5; frame.buffer_len()];
        prop_assert_eq!(frame.emit(&mut buf, LINK_MAX_MSG_SIZE), Ok(buf.len()));
        prop_assert_eq!(FrameRepr::<LinkMessage>::parse(&buf, LINK_MAX_MSG_SIZE), Ok(frame));
        assert_canonical(&buf);
    }

    #[test]
    fn data_messages_round_trip(
        plugin in any::<u64>(),
        urom_context in any::<u64>(),
        status in any::<i32>(),
        seq in any::<u64>(),
        payload in prop::collection::vec(any::<u8>(), 0..=max_notify_payload(MAX)),
        notify in any::<bool>(),
    ) {
        let body = if notify {
            DataMessage::Notify(Notification {
                plugin, urom_context, status: Status::from_raw(status), payload: &payload,
            })
        } else {
            DataMessage::Command(Command { plugin, urom_context, payload: &payload })
        };
        let frame = FrameRepr { seq, body };
        let mut buf = vec![0xa5; frame.buffer_len()];
        prop_assert_eq!(frame.emit(&mut buf, MAX), Ok(buf.len()));
        prop_assert_eq!(FrameRepr::<DataMessage>::parse(&buf, MAX), Ok(frame));
    }

    #[test]
    fn gpu_messages_round_trip(
        kind in 0u8..6,
        consumer_id in any::<u32>(),
        payload in prop::collection::vec(any::<u8>(), 0..=DEFAULT_MAX_MESSAGE_LENGTH),
    ) {
        let message = match kind {
            0 => GpuMessage::StartShutdown,
            1 => GpuMessage::ShutdownComplete,
            2 => GpuMessage::ConsumerIdRequest { consumer_id },
            3 => GpuMessage::ConsumerIdResponse { consumer_id },
            4 => GpuMessage::ClientRequest(&payload),
            _ => GpuMessage::ClientResponse(&payload),
        };
        let mut buf = vec![0xa5; message.buffer_len()];
        prop_assert_eq!(message.emit(&mut buf, DEFAULT_MAX_MESSAGE_LENGTH), Ok(buf.len()));
        prop_assert_eq!(GpuMessage::parse(&buf, DEFAULT_MAX_MESSAGE_LENGTH), Ok(message));
    }

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        assert_canonical(&bytes);
    }

    #[test]
    fn mutated_golden_vectors_never_panic(
        index in any::<prop::sample::Index>(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let mut bytes = common::GOLDEN[index.index(common::GOLDEN.len())].bytes();
        for (at, value) in edits {
            let at = at.index(bytes.len());
            bytes[at] = value;
        }
        assert_canonical(&bytes);
    }
}
