//! A plugin that fails, panics or answers late never takes the worker's loader down, and every
//! command gets exactly one answer, on the native path and through the DOCA interface alike.

use urom_plugin::abi::{LoadedPlugin, NotificationSink, PluginLibrary};
use urom_wire::data::{Command, Notification};
use urom_wire::{MaxMsgSize, Status};

#[derive(Default)]
struct Collected(Vec<(u64, u64, Status, Vec<u8>)>);

impl NotificationSink for Collected {
    fn notify(&mut self, dest_id: u64, n: Notification<'_>) -> Result<(), Status> {
        self.0
            .push((dest_id, n.urom_context, n.status, n.payload.to_vec()));
        Ok(())
    }
}

fn open(native: bool) -> LoadedPlugin {
    let path = urom_testkit::cdylib("urom-plugin-faulty", "worker_faulty");
    let library = PluginLibrary::load(&path).unwrap();
    assert_eq!(library.version(), worker_faulty::VERSION);
    assert!(library.has_native_path());
    let library = if native {
        library
    } else {
        library.without_native_path()
    };
    library.open(1, MaxMsgSize::DEFAULT).unwrap()
}

/// Sends one command and returns its one answer: the status the worker would notify the host
/// with, and the payload. Panics if the command got no answer or more than one.
fn answer(plugin: &mut LoadedPlugin, context: u64, payload: &[u8]) -> (Status, Vec<u8>) {
    let mut sink = Collected::default();
    let command = Command {
        plugin: 1,
        urom_context: context,
        payload,
    };
    let refused = plugin.command(7, &command, &mut sink);
    for _ in 0..3 {
        // A panicking progress reports an error but must not lose anything.
        let _ = plugin.progress(&mut sink);
    }
    let mut answers: Vec<(Status, Vec<u8>)> = sink
        .0
        .into_iter()
        .map(|(dest_id, got_context, status, payload)| {
            assert_eq!((dest_id, got_context), (7, context));
            (status, payload)
        })
        .collect();
    if refused != Status::Success {
        answers.push((refused, Vec::new()));
    }
    assert_eq!(answers.len(), 1, "command {payload:?}: answers {answers:?}");
    answers.remove(0)
}

fn survives_everything(native: bool) {
    let mut plugin = open(native);
    assert_eq!(
        plugin.address().unwrap(),
        format!("faulty-address@{}", std::process::id()).as_bytes()
    );
    assert_eq!(
        answer(&mut plugin, 1, b"hello"),
        (Status::Success, b"hello".to_vec())
    );
    assert_eq!(
        answer(&mut plugin, 2, b"fail"),
        (Status::NotSupported, vec![])
    );
    assert_eq!(
        answer(&mut plugin, 3, b"panic"),
        (Status::Unexpected, vec![])
    );
    assert_eq!(
        answer(&mut plugin, 4, b"later"),
        (Status::Success, b"late".to_vec())
    );
    // After all that, the plugin still works.
    assert_eq!(
        answer(&mut plugin, 5, b"again"),
        (Status::Success, b"again".to_vec())
    );

    // A panic in progress is reported as an error from progress, and progress goes on.
    let mut sink = Collected::default();
    let command = Command {
        plugin: 1,
        urom_context: 6,
        payload: b"panic-later",
    };
    assert_eq!(plugin.command(7, &command, &mut sink), Status::Success);
    assert_eq!(plugin.progress(&mut sink), Err(Status::Unexpected));
    assert_eq!(plugin.progress(&mut sink), Ok(false));
    assert_eq!(
        answer(&mut plugin, 8, b"still here"),
        (Status::Success, b"still here".to_vec())
    );
}

#[test]
fn native_path_survives_a_faulty_plugin() {
    survives_everything(true);
}

#[test]
fn doca_path_survives_a_faulty_plugin() {
    survives_everything(false);
}

/// A table of two ranks: member 3 (this plugin at "peer-3") with a buffer that has both keys,
/// member 4 (no address of this plugin) with a buffer that has no memory handle.
fn two_rank_table() -> std::sync::Arc<urom_plugin::domain::DomainTable> {
    use urom_wire::domain::{Buffer, MemberSpec, PluginAddress, RecordSpec};
    let ours = [PluginAddress {
        name: "libworker_faulty",
        address: b"peer-3",
    }];
    let other = [PluginAddress {
        name: "worker_graph",
        address: b"graph-4",
    }];
    let (m0, m1) = (
        [MemberSpec {
            domain_id: 3,
            plugins: &ours,
        }],
        [MemberSpec {
            domain_id: 4,
            plugins: &other,
        }],
    );
    let (b0, b1) = (
        [Buffer {
            va: 0x1000,
            len: 0x1000,
            memh: b"memh-3",
            mkey: b"mkey-3",
        }],
        [Buffer {
            va: 0x1000,
            len: 0x10,
            memh: b"",
            mkey: b"mkey-4",
        }],
    );
    let table = urom_testkit::domain::table_bytes(&[
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
    ]);
    std::sync::Arc::new(urom_plugin::domain::DomainTable::parse(&table).unwrap())
}

fn domain_command(id: u64, va: u64, seg: i32) -> Vec<u8> {
    let mut payload = b"domain:".to_vec();
    payload.extend_from_slice(&id.to_le_bytes());
    payload.extend_from_slice(&va.to_le_bytes());
    payload.extend_from_slice(&seg.to_le_bytes());
    payload
}

fn sdk_lookups(native: bool) {
    let mut plugin = open(native);
    let ask = |plugin: &mut LoadedPlugin, id: u64, va: u64, seg: i32| {
        let (status, text) = answer(plugin, 1, &domain_command(id, va, seg));
        assert_eq!(status, Status::Success);
        String::from_utf8(text).unwrap()
    };
    // No domain yet: every id is unknown.
    assert_eq!(
        ask(&mut plugin, 3, 0x1000, 0),
        "addr=!DOCA_ERROR_NOT_FOUND;seg=!DOCA_ERROR_NOT_FOUND;memh=!DOCA_ERROR_NOT_FOUND;\
         mkey=!DOCA_ERROR_NOT_FOUND"
    );
    plugin.set_domain(two_rank_table());
    assert_eq!(
        ask(&mut plugin, 3, 0x1fff, 0),
        "addr=peer-3;seg=0;memh=memh-3;mkey=mkey-3"
    );
    // Member 4 runs no faulty plugin; its buffer has no memory handle (UCX 1.13 exports none).
    assert_eq!(
        ask(&mut plugin, 4, 0x1000, 0),
        "addr=!DOCA_ERROR_NOT_FOUND;seg=0;memh=!DOCA_ERROR_NOT_SUPPORTED;mkey=mkey-4"
    );
    // An address no buffer holds, a segment that is not there, an unknown id.
    assert_eq!(
        ask(&mut plugin, 3, 0x2000, 1),
        "addr=peer-3;seg=!DOCA_ERROR_NOT_FOUND;memh=!DOCA_ERROR_NOT_FOUND;\
         mkey=!DOCA_ERROR_NOT_FOUND"
    );
    assert_eq!(
        ask(&mut plugin, 9, 0x1000, 0),
        "addr=!DOCA_ERROR_NOT_FOUND;seg=!DOCA_ERROR_NOT_FOUND;memh=!DOCA_ERROR_NOT_FOUND;\
         mkey=!DOCA_ERROR_NOT_FOUND"
    );
    // A malformed request is the plugin's error.
    assert_eq!(
        answer(&mut plugin, 2, b"domain:short"),
        (Status::InvalidValue, vec![])
    );
}

#[test]
fn sdk_plugins_look_up_their_domain_on_the_native_path() {
    sdk_lookups(true);
}

#[test]
fn sdk_plugins_look_up_their_domain_through_the_doca_interface() {
    sdk_lookups(false);
}
