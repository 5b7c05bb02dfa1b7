//! The built `libworker_sandbox.so`, loaded through the worker's loader (native path and DOCA
//! interface): commands of both layouts of the DOCA struct (64 bytes as compiled against UCX
//! 1.13, 72 against 1.14 and later) are understood, any other length is refused with
//! `DOCA_ERROR_INVALID_VALUE`, and a MEM_MAP of an exported memory handle is answered
//! `DOCA_ERROR_NOT_SUPPORTED` where UCX cannot import one (every machine without mlx5), at
//! once, while the plugin goes on working.

use std::path::PathBuf;

use urom_plugin::abi::{NotificationSink, PluginLibrary};
use urom_plugin::ucx::exported_memh_supported;
use urom_sandbox::{self as sandbox, CommandLayout, MemMapParams, SandboxCommand};
use urom_wire::data::{Command, Notification};
use urom_wire::{MaxMsgSize, Status};

const ID: u64 = 1 << 2;

fn plugin_path() -> PathBuf {
    urom_testkit::cdylib("urom-plugin-sandbox", "worker_sandbox")
}

#[derive(Default)]
struct Collected(Vec<(u64, Status, Vec<u8>)>);

impl NotificationSink for Collected {
    fn notify(&mut self, _dest_id: u64, n: Notification<'_>) -> Result<(), Status> {
        self.0.push((n.urom_context, n.status, n.payload.to_vec()));
        Ok(())
    }
}

/// The status `payload` is answered with: the command's own, or its notification's when it
/// answers one at once.
fn answer(plugin: &mut urom_plugin::abi::LoadedPlugin, context: u64, payload: &[u8]) -> Status {
    let mut sink = Collected::default();
    let command = Command {
        plugin: ID,
        urom_context: context,
        payload,
    };
    let status = plugin.command(0, &command, &mut sink);
    plugin.progress(&mut sink).unwrap();
    if status != Status::Success {
        assert!(sink.0.is_empty(), "answered twice: {status}, {:?}", sink.0);
        return status;
    }
    match sink.0.as_slice() {
        [] => Status::Success,
        [(c, status, _)] if *c == context => *status,
        other => panic!("unexpected notifications {other:?}"),
    }
}

fn packed(command: &SandboxCommand<'_>, layout: CommandLayout) -> Vec<u8> {
    let mut bytes = vec![0; command.buffer_len(layout)];
    command.pack(layout, &mut bytes).unwrap();
    bytes
}

fn commands(library: PluginLibrary) {
    assert_eq!(library.version(), sandbox::VERSION);
    let mut plugin = library.open(ID, MaxMsgSize::DEFAULT).unwrap();
    assert!(
        !plugin.address().unwrap().is_empty(),
        "a UCP worker address"
    );
    let map = SandboxCommand::MemMap {
        context: 1,
        params: MemMapParams {
            field_mask: 0b11 | sandbox::MEM_MAP_FIELD_EXPORTED_MEMH_BUFFER,
            address: 0x10_0000,
            length: 4096,
            ..MemMapParams::default()
        },
        exported_memh: b"an exported memory handle",
    };
    for layout in [CommandLayout::Ucx113, CommandLayout::Ucx114] {
        let bytes = packed(&map, layout);
        assert_eq!(bytes.len(), layout.fixed_len() + 25);
        let status = answer(&mut plugin, 10, &bytes);
        if exported_memh_supported() {
            // Understood, and the made-up handle refused by UCX.
            assert_eq!(status, Status::Driver, "{layout:?}");
        } else {
            assert_eq!(status, Status::NotSupported, "{layout:?}");
        }
        // A byte short of either layout: refused.
        assert_eq!(
            answer(&mut plugin, 11, &bytes[..bytes.len() - 1]),
            Status::InvalidValue,
            "{layout:?}"
        );
    }
    // 64 + 25 bytes claiming 33 follow (a 72-byte layout would need 8 more): neither.
    let mut bytes = packed(&map, CommandLayout::Ucx113);
    bytes[56..64].copy_from_slice(&33u64.to_le_bytes());
    assert_eq!(answer(&mut plugin, 12, &bytes), Status::InvalidValue);
    // A MEM_MAP without a handle would map the worker's own memory.
    let own = SandboxCommand::MemMap {
        context: 2,
        params: MemMapParams::default(),
        exported_memh: b"",
    };
    assert_eq!(
        answer(&mut plugin, 13, &packed(&own, CommandLayout::Ucx114)),
        Status::NotSupported
    );

    // Sends and receives of both layouts are read too: a send to an unknown member is not
    // found (the plugin runs in no domain), a receive is posted.
    let send = SandboxCommand::TagSend {
        context: 3,
        dest: 5,
        buffer: 0,
        count: 3,
        tag: 1,
        memh_id: 0,
        data: b"abc",
    };
    let recv = SandboxCommand::TagRecv {
        context: 4,
        buffer: 0,
        count: 64,
        tag: 1,
        tag_mask: u64::MAX,
        memh_id: 0,
    };
    for layout in [CommandLayout::Ucx113, CommandLayout::Ucx114] {
        let bytes = packed(&send, layout);
        assert_eq!(
            answer(&mut plugin, 20, &bytes),
            Status::NotFound,
            "{layout:?}"
        );
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(answer(&mut plugin, 21, &longer), Status::InvalidValue);
        let bytes = packed(&recv, layout);
        assert_eq!(
            answer(&mut plugin, 22, &bytes),
            Status::Success,
            "{layout:?}"
        );
    }
    // A receive of 68 bytes: neither 64 nor 72.
    let mut odd = vec![0u8; 68];
    odd[0] = 2;
    assert_eq!(answer(&mut plugin, 23, &odd), Status::InvalidValue);
}

#[test]
fn commands_of_both_layouts_on_the_native_path() {
    let library = PluginLibrary::load(&plugin_path()).unwrap();
    assert!(library.has_native_path());
    commands(library);
}

#[test]
fn commands_of_both_layouts_through_the_doca_interface() {
    let library = PluginLibrary::load(&plugin_path())
        .unwrap()
        .without_native_path();
    commands(library);
}
