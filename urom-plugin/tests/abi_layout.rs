//! The Rust types of the plugin ABI have exactly the layout `plugins/include/doca_urom_plugin.h`
//! declares: a C program compiled against the header prints every size and offset, and each
//! must equal the Rust one. The status codes of `doca_error.h` must be urom's.

use std::collections::BTreeMap;
use std::mem::{offset_of, size_of};
use std::path::Path;
use std::process::Command;

use urom_plugin::abi::{
    DomainLookupsIface, ListLink, PLUGIN_IFACE_VERSION, PLUGIN_NAME_MAX_LEN, PluginIface,
    ServicePluginInfo, WorkerCmd, WorkerCmdDesc, WorkerCtx, WorkerNotifDesc, WorkerNotify,
};
use urom_wire::Status;

const SOURCE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/abi_layout.c");
const INCLUDE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../plugins/include");

/// The C program's output, split into its lines.
fn c_layout() -> Vec<String> {
    let program =
        urom_testkit::c_program(Path::new(SOURCE), "abi_layout", &[Path::new(INCLUDE)], &[]);
    let output = Command::new(&program).output().expect("running abi_layout");
    assert!(output.status.success(), "abi_layout failed: {output:?}");
    String::from_utf8(output.stdout)
        .expect("abi_layout prints text")
        .lines()
        .map(str::to_owned)
        .collect()
}

/// What the Rust side says for each key the C program prints.
fn rust_layout() -> BTreeMap<String, usize> {
    macro_rules! size {
        ($c:literal, $rust:ty) => {
            (format!("sizeof({})", $c), size_of::<$rust>())
        };
    }
    macro_rules! offset {
        ($c:literal, $c_field:literal, $rust:ty, $field:ident) => {
            (
                format!("offsetof({}, {})", $c, $c_field),
                offset_of!($rust, $field),
            )
        };
    }
    [
        size!("ucs_list_link_t", ListLink),
        offset!("ucs_list_link_t", "prev", ListLink, prev),
        offset!("ucs_list_link_t", "next", ListLink, next),
        size!("struct urom_worker_cmd", WorkerCmd),
        offset!("struct urom_worker_cmd", "type", WorkerCmd, plugin),
        offset!(
            "struct urom_worker_cmd",
            "urom_context",
            WorkerCmd,
            urom_context
        ),
        offset!("struct urom_worker_cmd", "len", WorkerCmd, len),
        // The payload starts right after the header.
        (
            "offsetof(struct urom_worker_cmd, plugin_cmd)".to_owned(),
            size_of::<WorkerCmd>(),
        ),
        size!("struct urom_worker_notify", WorkerNotify),
        offset!("struct urom_worker_notify", "type", WorkerNotify, plugin),
        offset!(
            "struct urom_worker_notify",
            "urom_context",
            WorkerNotify,
            urom_context
        ),
        offset!("struct urom_worker_notify", "len", WorkerNotify, len),
        offset!("struct urom_worker_notify", "status", WorkerNotify, status),
        offset!(
            "struct urom_worker_notify",
            "reserved",
            WorkerNotify,
            reserved
        ),
        (
            "offsetof(struct urom_worker_notify, plugin_notif)".to_owned(),
            size_of::<WorkerNotify>(),
        ),
        size!("struct urom_worker_cmd_desc", WorkerCmdDesc),
        offset!("struct urom_worker_cmd_desc", "entry", WorkerCmdDesc, entry),
        offset!(
            "struct urom_worker_cmd_desc",
            "dest_id",
            WorkerCmdDesc,
            dest_id
        ),
        offset!(
            "struct urom_worker_cmd_desc",
            "worker_cmd",
            WorkerCmdDesc,
            worker_cmd
        ),
        size!("struct urom_worker_notif_desc", WorkerNotifDesc),
        offset!(
            "struct urom_worker_notif_desc",
            "entry",
            WorkerNotifDesc,
            entry
        ),
        offset!(
            "struct urom_worker_notif_desc",
            "dest_id",
            WorkerNotifDesc,
            dest_id
        ),
        offset!(
            "struct urom_worker_notif_desc",
            "worker_notif",
            WorkerNotifDesc,
            worker_notif
        ),
        size!("struct urom_plugin_iface", PluginIface),
        offset!(
            "struct urom_plugin_iface",
            "__doca_api_version",
            PluginIface,
            doca_api_version
        ),
        offset!("struct urom_plugin_iface", "open", PluginIface, open),
        offset!("struct urom_plugin_iface", "close", PluginIface, close),
        offset!("struct urom_plugin_iface", "addr", PluginIface, addr),
        offset!(
            "struct urom_plugin_iface",
            "worker_cmd",
            PluginIface,
            worker_cmd
        ),
        offset!(
            "struct urom_plugin_iface",
            "progress",
            PluginIface,
            progress
        ),
        offset!(
            "struct urom_plugin_iface",
            "notif_pack",
            PluginIface,
            notif_pack
        ),
        size!("struct urom_domain_lookups_iface", DomainLookupsIface),
        offset!(
            "struct urom_domain_lookups_iface",
            "addr_lookup",
            DomainLookupsIface,
            addr_lookup
        ),
        offset!(
            "struct urom_domain_lookups_iface",
            "seg_lookup",
            DomainLookupsIface,
            seg_lookup
        ),
        offset!(
            "struct urom_domain_lookups_iface",
            "memh_lookup",
            DomainLookupsIface,
            memh_lookup
        ),
        offset!(
            "struct urom_domain_lookups_iface",
            "mkey_lookup",
            DomainLookupsIface,
            mkey_lookup
        ),
        size!("struct urom_worker_ctx", WorkerCtx),
        offset!("struct urom_worker_ctx", "iface", WorkerCtx, iface),
        offset!(
            "struct urom_worker_ctx",
            "domain_iface",
            WorkerCtx,
            domain_iface
        ),
        offset!(
            "struct urom_worker_ctx",
            "plugin_ctx",
            WorkerCtx,
            plugin_ctx
        ),
        size!("struct doca_urom_service_plugin_info", ServicePluginInfo),
        offset!(
            "struct doca_urom_service_plugin_info",
            "id",
            ServicePluginInfo,
            id
        ),
        offset!(
            "struct doca_urom_service_plugin_info",
            "version",
            ServicePluginInfo,
            version
        ),
        offset!(
            "struct doca_urom_service_plugin_info",
            "plugin_name",
            ServicePluginInfo,
            plugin_name
        ),
        size!("doca_error_t", i32),
        (
            "DOCA_UROM_PLUGIN_NAME_MAX_LEN".to_owned(),
            PLUGIN_NAME_MAX_LEN,
        ),
        ("DOCA_STRUCT_CTOR".to_owned(), PLUGIN_IFACE_VERSION),
    ]
    .into_iter()
    .collect()
}

#[test]
fn the_rust_abi_types_have_the_c_headers_layout() {
    let c: BTreeMap<String, usize> = c_layout()
        .iter()
        .filter(|line| !line.starts_with("code "))
        .map(|line| {
            let (key, value) = line.rsplit_once(' ').expect("`key value` lines");
            (key.to_owned(), value.parse().expect("a number"))
        })
        .collect();
    assert_eq!(c, rust_layout());
}

#[test]
fn the_headers_status_codes_are_uroms() {
    let lines = c_layout();
    let codes: Vec<(&str, i32, &str)> = lines
        .iter()
        .filter_map(|line| line.strip_prefix("code "))
        .map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let [constant, value, name] = fields[..] else {
                panic!("a `code CONSTANT value name` line: {line}");
            };
            (constant, value.parse().expect("a number"), name)
        })
        .collect();
    let (unnamed, codes) = codes.split_last().expect("status code lines");
    assert_eq!(*unnamed, ("(none)", 32, "DOCA_ERROR_UNRECOGNIZED"));
    assert_eq!(codes.len(), 32, "{lines:?}");
    for (i, (constant, value, name)) in codes.iter().enumerate() {
        assert_eq!(*value, i as i32, "{constant} is out of order");
        assert_eq!(constant, name, "doca_error_get_name({value})");
        let status = Status::from_raw(*value);
        assert_eq!(status.name(), *constant, "Status::from_raw({value})");
    }
    assert!(matches!(Status::from_raw(32), Status::Unrecognized(32)));
}
