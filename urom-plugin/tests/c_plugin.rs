//! A plugin written in C against `plugins/include/urom_plugin.h` loads and runs through the
//! loader the worker uses; broken variants are refused with errors that say what is wrong.
//! Compiling the plugin with the header proves the header and the Rust ABI types agree.

use std::path::{Path, PathBuf};

use urom_graph_wire::{GraphCommand, MESSAGE_LEN};
use urom_plugin::abi::{IfaceVersion, NotificationSink, PluginLibrary, PluginLoadError};
use urom_wire::data::{Command as WireCommand, Notification};
use urom_wire::{MaxMsgSize, Status};

const SOURCE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../plugins/c-loopback/loopback.c"
);
const INCLUDE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../plugins/include");

/// Compiles the C loopback plugin with `defines`.
fn build_c_plugin(name: &str, defines: &[&str]) -> PathBuf {
    urom_testkit::c_shared_object(Path::new(SOURCE), name, &[Path::new(INCLUDE)], defines)
}

/// Collects notifications as the worker would route them.
#[derive(Default)]
struct Collected(Vec<(u64, u64, u64, Status, Vec<u8>)>);

impl NotificationSink for Collected {
    fn notify(&mut self, dest_id: u64, n: Notification<'_>) -> Result<(), Status> {
        self.0.push((
            dest_id,
            n.plugin,
            n.urom_context,
            n.status,
            n.payload.to_vec(),
        ));
        Ok(())
    }
}

fn loopback_payload(data: u64) -> [u8; MESSAGE_LEN] {
    let mut payload = [0u8; MESSAGE_LEN];
    GraphCommand::Loopback { data }
        .pack(&mut payload)
        .expect("16 bytes");
    payload
}

#[test]
fn a_c_plugin_loads_and_loops_commands_back() {
    let path = build_c_plugin("c_loopback", &[]);
    let library = PluginLibrary::load(&path).unwrap();
    assert_eq!(library.version(), 1);
    assert!(!library.has_native_path());
    let mut plugin = library.open(1 << 2, MaxMsgSize::DEFAULT).unwrap();
    assert_eq!(plugin.address().unwrap(), b"c-loopback-endpoint\0");

    let mut sink = Collected::default();
    for i in 0..1000u64 {
        let payload = loopback_payload(i * 3);
        let command = WireCommand {
            plugin: 1 << 2,
            urom_context: i,
            payload: &payload,
        };
        assert_eq!(plugin.command(i % 3, &command, &mut sink), Status::Success);
        if i % 10 == 9 {
            assert_eq!(plugin.progress(&mut sink), Ok(true));
        }
    }
    assert_eq!(plugin.progress(&mut sink), Ok(false));
    assert_eq!(sink.0.len(), 1000);
    for (i, (dest_id, plugin_id, context, status, payload)) in sink.0.iter().enumerate() {
        let i = i as u64;
        assert_eq!(
            (*dest_id, *plugin_id, *context, *status),
            (i % 3, 1 << 2, i, Status::Success)
        );
        assert_eq!(payload, &loopback_payload(i * 3));
    }
}

#[test]
fn a_malformed_command_gets_an_error_notification() {
    let path = build_c_plugin("c_loopback_errors", &[]);
    let mut plugin = PluginLibrary::load(&path)
        .unwrap()
        .open(1, MaxMsgSize::DEFAULT)
        .unwrap();
    let mut sink = Collected::default();
    let command = WireCommand {
        plugin: 1,
        urom_context: 77,
        payload: b"short",
    };
    assert_eq!(plugin.command(5, &command, &mut sink), Status::Success);
    assert_eq!(plugin.progress(&mut sink), Ok(true));
    assert_eq!(sink.0, vec![(5, 1, 77, Status::InvalidValue, vec![])]);
}

#[test]
fn a_plugin_without_get_iface_is_refused() {
    let path = build_c_plugin("c_no_iface", &["OMIT_GET_IFACE"]);
    let error = PluginLibrary::load(&path).unwrap_err();
    assert!(
        matches!(
            error,
            PluginLoadError::MissingSymbol {
                symbol: "urom_plugin_get_iface",
                ..
            }
        ),
        "{error}"
    );
    assert!(
        error
            .to_string()
            .contains("does not export `urom_plugin_get_iface`"),
        "{error}"
    );
}

#[test]
fn a_plugin_with_another_interface_version_is_refused() {
    let path = build_c_plugin("c_iface_v7", &["IFACE_VERSION=7"]);
    let error = PluginLibrary::load(&path).unwrap_err();
    assert!(
        matches!(
            error,
            PluginLoadError::UnsupportedInterface { version: 7, .. }
        ),
        "{error}"
    );
    assert!(error.to_string().contains("interface version 7"), "{error}");
}

#[test]
fn plugins_stamped_by_doca_headers_of_accepted_releases_load() {
    // 0x0300003a is what DOCA_STRUCT_CTOR stores with the DOCA 3.0.0058 headers.
    for (name, word, version) in [
        ("c_iface_doca_3_0", "0x0300003a", (3, 0, 58)),
        ("c_iface_doca_3_3", "0x03030011", (3, 3, 17)),
        ("c_iface_doca_2_9", "0x02090048", (2, 9, 72)),
        ("c_iface_doca_3_2_1", "0x03020401", (3, 2, 1025)),
    ] {
        let path = build_c_plugin(name, &[&format!("IFACE_VERSION={word}")]);
        let library = PluginLibrary::load(&path).unwrap();
        let (major, minor, patch) = version;
        assert_eq!(
            library.iface_version(),
            IfaceVersion::Doca {
                major,
                minor,
                patch
            },
            "{word}"
        );
        let mut plugin = library.open(1, MaxMsgSize::DEFAULT).unwrap();
        let mut sink = Collected::default();
        let payload = loopback_payload(5);
        let command = WireCommand {
            plugin: 1,
            urom_context: 9,
            payload: &payload,
        };
        assert_eq!(plugin.command(0, &command, &mut sink), Status::Success);
        assert_eq!(plugin.progress(&mut sink), Ok(true));
        assert_eq!(sink.0, vec![(0, 1, 9, Status::Success, payload.to_vec())]);
    }
    let ours = PluginLibrary::load(&build_c_plugin("c_iface_urom", &[])).unwrap();
    assert_eq!(ours.iface_version(), IfaceVersion::Urom);
}

#[test]
fn plugins_stamped_by_other_doca_releases_are_refused() {
    // 2.8, 3.4, 4.0, and DOCA 3.0.0058's word with a bit set above the low 32.
    for (name, word) in [
        ("c_iface_doca_2_8", 0x0208_0000usize),
        ("c_iface_doca_3_4", 0x0304_0000),
        ("c_iface_doca_4_0", 0x0400_003a),
        ("c_iface_wide", 0x1_0300_003a),
    ] {
        let path = build_c_plugin(name, &[&format!("IFACE_VERSION={word:#x}")]);
        let error = PluginLibrary::load(&path).unwrap_err();
        assert!(
            matches!(error, PluginLoadError::UnsupportedInterface { version, .. } if version == word),
            "{error}"
        );
        let error = error.to_string();
        assert!(
            error.contains(&format!("has interface version {word} ({word:#x});")),
            "{error}"
        );
        assert!(
            error.ends_with(
                "this worker supports version 1 (urom's headers) and plugins built with the \
                 headers of DOCA 2.9, 2.10, 3.0, 3.1, 3.2, 3.3"
            ),
            "{error}"
        );
    }
}

#[test]
fn a_plugin_whose_version_cannot_be_read_is_refused() {
    let path = build_c_plugin("c_bad_version", &["GET_VERSION_FAILS"]);
    let error = PluginLibrary::load(&path).unwrap_err();
    assert!(
        matches!(
            error,
            PluginLoadError::Call {
                symbol: "urom_plugin_get_version",
                status: Status::NotSupported,
                ..
            }
        ),
        "{error}"
    );
}

#[test]
fn a_plugin_whose_open_fails_is_reported() {
    let path = build_c_plugin("c_open_fails", &["OPEN_FAILS"]);
    let error = PluginLibrary::load(&path)
        .unwrap()
        .open(1, MaxMsgSize::DEFAULT)
        .unwrap_err();
    assert_eq!(error.status, Status::Initialization);
    assert!(
        error
            .to_string()
            .contains("`open` failed with DOCA_ERROR_INITIALIZATION"),
        "{error}"
    );
}

#[test]
fn a_refused_command_reports_the_plugins_status() {
    let path = build_c_plugin("c_rejects", &["REJECT_COMMANDS"]);
    let mut plugin = PluginLibrary::load(&path)
        .unwrap()
        .open(1, MaxMsgSize::DEFAULT)
        .unwrap();
    let mut sink = Collected::default();
    let payload = loopback_payload(1);
    let command = WireCommand {
        plugin: 1,
        urom_context: 1,
        payload: &payload,
    };
    assert_eq!(plugin.command(0, &command, &mut sink), Status::NotSupported);
    assert_eq!(plugin.progress(&mut sink), Ok(false));
    assert!(sink.0.is_empty());
}

#[test]
fn a_file_that_is_not_a_shared_object_is_refused() {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("not_a_plugin.so");
    std::fs::write(&path, "just text\n").unwrap();
    let error = PluginLibrary::load(&path).unwrap_err();
    assert!(matches!(error, PluginLoadError::Open { .. }), "{error}");
    assert!(
        error.to_string().starts_with("cannot load plugin"),
        "{error}"
    );
}
