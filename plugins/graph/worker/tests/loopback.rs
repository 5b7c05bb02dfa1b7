//! The built `libworker_graph.so` loads through the worker's loader and loops commands back,
//! through both the native path and the DOCA interface.

use std::path::PathBuf;

use urom_graph::{self as graph, GraphCommand, GraphNotification};
use urom_plugin::abi::{NotificationSink, PluginLibrary};
use urom_wire::data::{Command, Notification};
use urom_wire::{MaxMsgSize, Status};

fn plugin_path() -> PathBuf {
    urom_testkit::cdylib("urom-plugin-graph", "worker_graph")
}

#[derive(Default)]
struct Collected(Vec<(u64, u64, Status, Vec<u8>)>);

impl NotificationSink for Collected {
    fn notify(&mut self, dest_id: u64, n: Notification<'_>) -> Result<(), Status> {
        self.0
            .push((dest_id, n.urom_context, n.status, n.payload.to_vec()));
        Ok(())
    }
}

fn round_trip(library: PluginLibrary) {
    assert_eq!(library.version(), graph::VERSION);
    let mut plugin = library.open(1 << 3, MaxMsgSize::DEFAULT).unwrap();
    assert_eq!(plugin.address().unwrap(), b"");
    let mut sink = Collected::default();
    let mut packed = [0u8; graph::MESSAGE_LEN];
    for data in 0..500u64 {
        GraphCommand::Loopback { data }.pack(&mut packed).unwrap();
        let command = Command {
            plugin: 1 << 3,
            urom_context: data + 1000,
            payload: &packed,
        };
        assert_eq!(
            plugin.command(data % 2, &command, &mut sink),
            Status::Success
        );
        plugin.progress(&mut sink).unwrap();
    }
    assert_eq!(sink.0.len(), 500);
    for (data, (dest_id, context, status, payload)) in sink.0.iter().enumerate() {
        let data = data as u64;
        assert_eq!(
            (*dest_id, *context, *status),
            (data % 2, data + 1000, Status::Success)
        );
        assert_eq!(
            GraphNotification::unpack(payload),
            Ok(GraphNotification::Loopback { data })
        );
    }

    // A malformed command is answered with an error, exactly once.
    let mut sink = Collected::default();
    let command = Command {
        plugin: 1 << 3,
        urom_context: 9,
        payload: b"not sixteen",
    };
    let status = plugin.command(0, &command, &mut sink);
    plugin.progress(&mut sink).unwrap();
    let answers = sink.0.len() + usize::from(status != Status::Success);
    assert_eq!(answers, 1, "status {status}, notifications {:?}", sink.0);
    if let Some((_, context, status, _)) = sink.0.first() {
        assert_eq!((*context, *status), (9, Status::InvalidValue));
    } else {
        assert_eq!(status, Status::InvalidValue);
    }
}

#[test]
fn graph_plugin_loops_back_on_the_native_path() {
    let library = PluginLibrary::load(&plugin_path()).unwrap();
    assert!(library.has_native_path());
    round_trip(library);
}

#[test]
fn graph_plugin_loops_back_through_the_doca_interface() {
    let library = PluginLibrary::load(&plugin_path())
        .unwrap()
        .without_native_path();
    round_trip(library);
}
