//! A plugin that fails, panics or answers late never takes the worker's loader down, and every
//! command gets exactly one answer, on the native path and through the DOCA interface alike.

use urom_core::abi::{LoadedPlugin, NotificationSink, PluginLibrary};
use urom_core::wire::data::{Command, Notification};
use urom_core::wire::{MaxMsgSize, Status};

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
    assert_eq!(plugin.address().unwrap(), b"faulty-address");
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
