//! Golden vectors: each one parses to the expected message, and each expected message emits
//! exactly the golden bytes, even into a buffer full of stale bytes.

mod common;

use common::{Family, GOLDEN, golden};
use urom_testkit::golden::assert_emits;
use urom_wire::control::{
    AuthChallenge, AuthMethod, AuthResponse, ControlMessage, EndpointKind, ErrorReply, Hello,
    PluginInfo, SecretProof, ServiceProof, SpawnResult, SpawnWorker, StatusReply, WORKER_ID_ANY,
    WorkerExit,
};
use urom_wire::data::{Command, DataMessage, Notification};
use urom_wire::gpu::GpuMessage;
use urom_wire::link::{CounterReport, LINK_MAX_MSG_SIZE, LinkMessage};
use urom_wire::report::{
    DaemonStatus, DirState, ErrorCount, ErrorEntry, HugePagesMode, HugePagesStatus, ListenKind,
    ListenStatus, PluginDirStatus, PluginFileStatus, PluginOutcome, StatusRecord, WorkerCounters,
    WorkerState, WorkerStatus,
};
use urom_wire::{CpuSet, FrameRepr, List, MaxMsgSize, Status};

const MAX: MaxMsgSize = MaxMsgSize::DEFAULT;
const GPU_MAX_PAYLOAD: usize = 256;

fn nonce(start: u8) -> [u8; 32] {
    core::array::from_fn(|i| start + i as u8)
}

static PLUGINS: [PluginInfo<'static>; 2] = [
    PluginInfo {
        id: 1,
        version: 1,
        name: "worker_graph",
    },
    PluginInfo {
        id: 2,
        version: 0x0102,
        name: "worker_sandbox",
    },
];
static ENV: [&str; 2] = ["UCX_TLS=rc", "A=b"];
static GID_WORKERS: [u64; 2] = [1, 3];
const COUNTERS: WorkerCounters = WorkerCounters {
    worker_id: 7,
    commands: 100,
    notifications: 99,
    errors: 2,
    bytes_in: 6400,
    bytes_out: 7128,
    peak_backlog_bytes: 0,
    in_flight: 1,
    peak_ring: 12,
    hosts: 1,
};
static STATUS_RECORDS: [StatusRecord<'static>; 9] = [
    StatusRecord::Daemon(DaemonStatus {
        pid: 0x1234,
        workers: 1,
        started_unix_ms: 1_700_000_000_000,
        uptime_ms: 60_000,
        max_msg_size: 4096,
        max_workers: 64,
        hosts: 2,
        version: "0.1.0",
        cpuset: "0-3",
    }),
    StatusRecord::Listen(ListenStatus {
        kind: ListenKind::Control,
        address: "/run/urom.sock",
    }),
    StatusRecord::HugePages(HugePagesStatus {
        mode: HugePagesMode::Auto,
        usable: true,
        page_kib: 2048,
        total: 2048,
        free: 2040,
        mounts: "/mnt/huge",
    }),
    StatusRecord::PluginDir(PluginDirStatus {
        state: DirState::Read,
        path: "/p",
        error: "",
    }),
    StatusRecord::PluginFile(PluginFileStatus {
        outcome: PluginOutcome::Offered,
        id: 1,
        version: 1,
        name: "worker_graph",
        path: "/p/worker_graph.so",
        reason: "",
    }),
    StatusRecord::PluginFile(PluginFileStatus {
        outcome: PluginOutcome::Refused,
        id: 0,
        version: 0,
        name: "bad",
        path: "/p/bad.so",
        reason: "no iface",
    }),
    StatusRecord::Worker(WorkerStatus {
        id: 7,
        plugins: 1,
        started_unix_ms: 1_700_000_030_000,
        pid: 4242,
        uid: 1000,
        gid: 3,
        state: WorkerState::Running,
        hosts: 1,
        user: "alice",
        cpuset: "2-3",
    }),
    StatusRecord::Counters(COUNTERS),
    StatusRecord::ErrorCount(ErrorCount {
        worker_id: 7,
        status: Status::InvalidValue,
        count: 2,
    }),
];
static ERROR_ENTRIES: [ErrorEntry; 2] = [
    ErrorEntry {
        status: Status::InvalidValue,
        count: 1,
    },
    ErrorEntry {
        status: Status::NotFound,
        count: 1,
    },
];
static LOOPBACK_CMD: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 42, 0, 0, 0, 0, 0, 0, 0];

fn control(name: &str) -> FrameRepr<ControlMessage<'static>> {
    let (seq, body) = match name {
        "hello" => (
            1,
            ControlMessage::Hello(Hello {
                protocol_version: 1,
                max_msg_size: 4096,
                identity: "host-a",
            }),
        ),
        "auth_challenge" => (
            1,
            ControlMessage::AuthChallenge(AuthChallenge {
                method: AuthMethod::PeerCredentials,
                nonce: nonce(0),
            }),
        ),
        "auth_response" => (
            2,
            ControlMessage::AuthResponse(AuthResponse {
                method: AuthMethod::SharedSecret,
                proof: nonce(0x20),
            }),
        ),
        "secret_proof" => (
            2,
            ControlMessage::SecretProof(SecretProof {
                nonce: nonce(0x40),
                proof: nonce(0x60),
            }),
        ),
        "service_proof" => (
            2,
            ControlMessage::ServiceProof(ServiceProof { proof: nonce(0x80) }),
        ),
        "ack" => (2, ControlMessage::Ack),
        "error" => (
            3,
            ControlMessage::Error(ErrorReply {
                status: Status::InvalidValue,
                reason: "bad cpuset",
            }),
        ),
        "plugin_list_request" => (4, ControlMessage::PluginListRequest),
        "plugin_list_reply" => (4, ControlMessage::PluginListReply(List::new(&PLUGINS))),
        "cpuset_request" => (5, ControlMessage::CpusetRequest),
        "cpuset_reply" => (5, ControlMessage::CpusetReply("0-3,8".parse().unwrap())),
        "spawn_worker" => (
            6,
            ControlMessage::SpawnWorker(SpawnWorker {
                worker_id: WORKER_ID_ANY,
                plugins: 3,
                gid: 1,
                max_inflight_tasks: 64,
                cpuset: "0-1".parse().unwrap(),
                env: List::new(&ENV),
            }),
        ),
        "spawn_result" => (
            6,
            ControlMessage::SpawnResult(SpawnResult {
                worker_id: 7,
                endpoint: EndpointKind::UnixSocket,
                address: b"/tmp/w7",
            }),
        ),
        "destroy_worker" => (7, ControlMessage::DestroyWorker { worker_id: 7 }),
        "workers_by_gid_request" => (8, ControlMessage::WorkersByGidRequest { gid: 1 }),
        "workers_by_gid_reply" => (
            8,
            ControlMessage::WorkersByGidReply(List::new(&GID_WORKERS)),
        ),
        "worker_exited" => (
            0,
            ControlMessage::WorkerExited(WorkerExit {
                worker_id: 3,
                exit_code: 0,
                signal: 9,
            }),
        ),
        "status_request" => (9, ControlMessage::StatusRequest { cursor: 0 }),
        "status_reply" => (
            9,
            ControlMessage::StatusReply(StatusReply {
                next_cursor: 0,
                records: List::new(&STATUS_RECORDS),
            }),
        ),
        other => panic!("no expected control message for {other}"),
    };
    FrameRepr { seq, body }
}

fn link(name: &str) -> FrameRepr<LinkMessage<'static>> {
    let body = match name {
        "counters_request" => LinkMessage::CountersRequest,
        "counters_reply" => LinkMessage::CountersReply(CounterReport {
            counters: COUNTERS,
            errors: List::new(&ERROR_ENTRIES),
        }),
        other => panic!("no expected link message for {other}"),
    };
    FrameRepr { seq: 1, body }
}

fn data(name: &str) -> FrameRepr<DataMessage<'static>> {
    let (seq, body) = match name {
        "command" => (
            9,
            DataMessage::Command(Command {
                plugin: 1,
                urom_context: 0x1122_3344_5566_7788,
                payload: &LOOPBACK_CMD,
            }),
        ),
        "notify" => (
            9,
            DataMessage::Notify(Notification {
                plugin: 1,
                urom_context: 0x1122_3344_5566_7788,
                status: Status::Success,
                payload: &LOOPBACK_CMD,
            }),
        ),
        "notify_error_empty" => (
            10,
            DataMessage::Notify(Notification {
                plugin: 2,
                urom_context: 5,
                status: Status::InvalidValue,
                payload: &[],
            }),
        ),
        other => panic!("no expected data message for {other}"),
    };
    FrameRepr { seq, body }
}

fn gpu(name: &str) -> GpuMessage<'static> {
    match name {
        "start_shutdown" => GpuMessage::StartShutdown,
        "shutdown_complete" => GpuMessage::ShutdownComplete,
        "consumer_id_request" => GpuMessage::ConsumerIdRequest { consumer_id: 42 },
        "consumer_id_response" => GpuMessage::ConsumerIdResponse { consumer_id: 7 },
        "client_request" => GpuMessage::ClientRequest(b"ABCD"),
        "client_response" => GpuMessage::ClientResponse(b"DCBA"),
        "client_request_empty" => GpuMessage::ClientRequest(b""),
        other => panic!("no expected GPU message for {other}"),
    }
}

#[test]
fn every_golden_vector_parses_to_its_message_and_back() {
    for vector in GOLDEN {
        let bytes = vector.bytes();
        let name = vector.name;
        match vector.family {
            Family::Control => {
                let expected = control(name);
                let parsed = FrameRepr::<ControlMessage>::parse(&bytes, MAX).unwrap();
                assert_eq!(parsed, expected, "{name}");
                assert_eq!(expected.buffer_len(), bytes.len(), "{name}");
                assert_emits(name, &bytes, |buf| expected.emit(buf, MAX).unwrap());
                assert_emits(name, &bytes, |buf| parsed.emit(buf, MAX).unwrap());
            }
            Family::Link => {
                let expected = link(name);
                let parsed = FrameRepr::<LinkMessage>::parse(&bytes, LINK_MAX_MSG_SIZE).unwrap();
                assert_eq!(parsed, expected, "{name}");
                assert_emits(name, &bytes, |buf| {
                    expected.emit(buf, LINK_MAX_MSG_SIZE).unwrap()
                });
            }
            Family::Data => {
                let expected = data(name);
                let parsed = FrameRepr::<DataMessage>::parse(&bytes, MAX).unwrap();
                assert_eq!(parsed, expected, "{name}");
                assert_emits(name, &bytes, |buf| expected.emit(buf, MAX).unwrap());
            }
            Family::Gpu => {
                let expected = gpu(name);
                let parsed = GpuMessage::parse(&bytes, GPU_MAX_PAYLOAD).unwrap();
                assert_eq!(parsed, expected, "{name}");
                assert_emits(name, &bytes, |buf| {
                    expected.emit(buf, GPU_MAX_PAYLOAD).unwrap()
                });
            }
        }
    }
}

#[test]
fn parsed_lists_iterate_their_elements() {
    let bytes = golden("plugin_list_reply");
    let frame = FrameRepr::<ControlMessage>::parse(&bytes, MAX).unwrap();
    let ControlMessage::PluginListReply(plugins) = frame.body else {
        panic!("not a plugin list: {frame:?}");
    };
    assert!(matches!(plugins, List::Wire { count: 2, .. }));
    assert!(plugins.iter().eq(PLUGINS.iter().copied()));

    let bytes = golden("spawn_worker");
    let frame = FrameRepr::<ControlMessage>::parse(&bytes, MAX).unwrap();
    let ControlMessage::SpawnWorker(spawn) = frame.body else {
        panic!("not a spawn: {frame:?}");
    };
    assert!(spawn.env.iter().eq(ENV.iter().copied()));
    assert_eq!(spawn.cpuset, "0-1".parse::<CpuSet>().unwrap());

    let bytes = golden("status_reply");
    let frame = FrameRepr::<ControlMessage>::parse(&bytes, MAX).unwrap();
    let ControlMessage::StatusReply(reply) = frame.body else {
        panic!("not a status reply: {frame:?}");
    };
    assert!(matches!(reply.records, List::Wire { count: 9, .. }));
    assert!(reply.records.iter().eq(STATUS_RECORDS.iter().copied()));

    let bytes = golden("counters_reply");
    let frame = FrameRepr::<LinkMessage>::parse(&bytes, LINK_MAX_MSG_SIZE).unwrap();
    let LinkMessage::CountersReply(report) = frame.body else {
        panic!("not a counter report: {frame:?}");
    };
    assert!(report.errors.iter().eq(ERROR_ENTRIES.iter().copied()));
}

#[test]
fn a_record_of_an_unknown_kind_is_kept_as_it_is() {
    // A status reply holding one record of kind 0x0100 with a 3-byte body.
    let bytes = common::hex(
        "55524f4d 0100 3101 27000000 00000000 0200000000000000
         01000000 05000000
         0001 0300 616263",
    );
    let frame = FrameRepr::<ControlMessage>::parse(&bytes, MAX).unwrap();
    let ControlMessage::StatusReply(reply) = frame.body else {
        panic!("not a status reply: {frame:?}");
    };
    assert_eq!(reply.next_cursor, 5);
    let records: Vec<StatusRecord> = reply.records.iter().collect();
    assert_eq!(
        records,
        [StatusRecord::Unknown {
            kind: 0x0100,
            body: b"abc"
        }]
    );
    assert_emits("unknown record", &bytes, |buf| {
        frame.emit(buf, MAX).unwrap()
    });
}

#[test]
fn hot_path_writers_match_the_golden_frames() {
    use urom_wire::data::{
        COMMAND_PAYLOAD_OFFSET, NOTIFY_PAYLOAD_OFFSET, write_command_headers, write_notify_headers,
    };
    use urom_wire::gpu::{CLIENT_HEADER_LEN, write_client_headers};

    let expected = golden("command");
    assert_emits("command (in place)", &expected, |buf| {
        let len = write_command_headers(buf, 9, 1, 0x1122_3344_5566_7788, 16, MAX).unwrap();
        buf[COMMAND_PAYLOAD_OFFSET..len].copy_from_slice(&LOOPBACK_CMD);
        len
    });
    let expected = golden("notify");
    assert_emits("notify (in place)", &expected, |buf| {
        let len = write_notify_headers(buf, 9, 1, 0x1122_3344_5566_7788, Status::Success, 16, MAX)
            .unwrap();
        buf[NOTIFY_PAYLOAD_OFFSET..len].copy_from_slice(&LOOPBACK_CMD);
        len
    });
    let expected = golden("client_response");
    assert_emits("client_response (in place)", &expected, |buf| {
        let len = write_client_headers(buf, true, 4, GPU_MAX_PAYLOAD).unwrap();
        buf[CLIENT_HEADER_LEN..len].copy_from_slice(b"DCBA");
        len
    });
}

/// The fuzzers' seed corpus is the golden vectors; `UROM_BLESS=1` rewrites it.
#[test]
fn fuzz_seed_corpus_matches_the_golden_vectors() {
    let seeds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds");
    let bless = std::env::var_os("UROM_BLESS").is_some();
    for vector in GOLDEN {
        let dir = seeds.join(vector.family.fuzz_target());
        let path = dir.join(vector.name);
        if bless {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, vector.bytes()).unwrap();
        }
        let on_disk = std::fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e}; run with UROM_BLESS=1 to write the seed corpus",
                path.display()
            )
        });
        assert_eq!(
            on_disk,
            vector.bytes(),
            "{} is stale; run with UROM_BLESS=1",
            path.display()
        );
    }
}
