//! Finds the system UCX with pkg-config and checks that the structs `src/lib.rs` binds have the
//! installed headers' layout.
//!
//! The check: a small C program, compiled against the installed headers, prints the size of
//! every bound struct and type, the offset and size of every bound field and the value of every
//! bound constant; this script turns those numbers into `const` assertions
//! (`$OUT_DIR/layout_check.rs`) that `src/lib.rs` includes. A UCX whose layout differs from the
//! bindings fails the build with a message naming the struct and field. A field or constant
//! the headers lack fails the C compilation, and the build stops with the compiler's message.

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::PathBuf;
use std::process::Command;

/// The oldest UCX whose API the bindings follow.
const MIN_VERSION: &str = "1.13";

/// Every struct passed to UCX, with the fields the bindings name.
const STRUCTS: &[(&str, &[&str])] = &[
    (
        "ucp_params_t",
        &[
            "field_mask",
            "features",
            "request_size",
            "request_init",
            "request_cleanup",
            "tag_sender_mask",
            "mt_workers_shared",
            "estimated_num_eps",
            "estimated_num_ppn",
            "name",
        ],
    ),
    (
        "ucp_worker_params_t",
        &[
            "field_mask",
            "thread_mode",
            "cpu_mask",
            "events",
            "user_data",
            "event_fd",
            "flags",
            "name",
            "am_alignment",
            "client_id",
        ],
    ),
    (
        "ucp_worker_attr_t",
        &[
            "field_mask",
            "thread_mode",
            "address_flags",
            "address",
            "address_length",
            "max_am_header",
            "name",
            "max_debug_string",
        ],
    ),
    (
        "ucp_ep_params_t",
        &[
            "field_mask",
            "address",
            "err_mode",
            "err_handler",
            "user_data",
            "flags",
            "sockaddr",
            "conn_request",
            "name",
            "local_sockaddr",
        ],
    ),
    ("ucp_err_handler_t", &["cb", "arg"]),
    ("ucs_sock_addr_t", &["addr", "addrlen"]),
    (
        "ucp_listener_params_t",
        &["field_mask", "sockaddr", "accept_handler", "conn_handler"],
    ),
    ("ucp_listener_accept_handler_t", &["cb", "arg"]),
    ("ucp_listener_conn_handler_t", &["cb", "arg"]),
    ("ucp_listener_attr_t", &["field_mask", "sockaddr"]),
    (
        "ucp_request_param_t",
        &[
            "op_attr_mask",
            "flags",
            "request",
            "cb",
            "datatype",
            "user_data",
            "reply_buffer",
            "memory_type",
            "recv_info",
            "memh",
        ],
    ),
    (
        "ucp_am_handler_param_t",
        &["field_mask", "id", "flags", "cb", "arg"],
    ),
    ("ucp_am_recv_param_t", &["recv_attr", "reply_ep"]),
    (
        "ucp_mem_map_params_t",
        &[
            "field_mask",
            "address",
            "length",
            "flags",
            "prot",
            "memory_type",
        ],
    ),
    ("ucp_tag_recv_info_t", &["sender_tag", "length"]),
];

/// Types bound by size only.
const TYPES: &[&str] = &[
    "ucs_status_t",
    "ucs_thread_mode_t",
    "ucp_err_handling_mode_t",
    "ucs_memory_type_t",
    "ucp_datatype_t",
    "ucp_tag_t",
    "ucs_cpu_set_t",
    "socklen_t",
];

/// Constants whose values the bindings repeat.
const CONSTANTS: &[&str] = &[
    "UCS_OK",
    "UCS_INPROGRESS",
    "UCS_ERR_NO_MESSAGE",
    "UCS_ERR_NO_RESOURCE",
    "UCS_ERR_IO_ERROR",
    "UCS_ERR_UNREACHABLE",
    "UCS_ERR_MESSAGE_TRUNCATED",
    "UCS_ERR_BUSY",
    "UCS_ERR_CANCELED",
    "UCS_ERR_TIMED_OUT",
    "UCS_ERR_REJECTED",
    "UCS_ERR_NOT_CONNECTED",
    "UCS_ERR_CONNECTION_RESET",
    "UCS_ERR_ENDPOINT_TIMEOUT",
    "UCS_ERR_LAST",
    "UCS_THREAD_MODE_SINGLE",
    "UCS_THREAD_MODE_SERIALIZED",
    "UCS_THREAD_MODE_MULTI",
    "UCS_MEMORY_TYPE_HOST",
    "UCP_PARAM_FIELD_FEATURES",
    "UCP_PARAM_FIELD_MT_WORKERS_SHARED",
    "UCP_PARAM_FIELD_NAME",
    "UCP_FEATURE_AM",
    "UCP_FEATURE_TAG",
    "UCP_FEATURE_RMA",
    "UCP_FEATURE_AMO64",
    "UCP_FEATURE_WAKEUP",
    "UCP_WORKER_PARAM_FIELD_THREAD_MODE",
    "UCP_WORKER_PARAM_FIELD_NAME",
    "UCP_WORKER_ATTR_FIELD_ADDRESS",
    "UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER",
    "UCP_EP_PARAM_FIELD_REMOTE_ADDRESS",
    "UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE",
    "UCP_EP_PARAM_FIELD_ERR_HANDLER",
    "UCP_EP_PARAM_FIELD_SOCK_ADDR",
    "UCP_EP_PARAM_FIELD_FLAGS",
    "UCP_EP_PARAM_FIELD_CONN_REQUEST",
    "UCP_EP_PARAM_FIELD_NAME",
    "UCP_EP_PARAMS_FLAGS_CLIENT_SERVER",
    "UCP_ERR_HANDLING_MODE_NONE",
    "UCP_ERR_HANDLING_MODE_PEER",
    "UCP_EP_CLOSE_FLAG_FORCE",
    "UCP_LISTENER_PARAM_FIELD_SOCK_ADDR",
    "UCP_LISTENER_PARAM_FIELD_CONN_HANDLER",
    "UCP_LISTENER_ATTR_FIELD_SOCKADDR",
    "UCP_OP_ATTR_FIELD_REQUEST",
    "UCP_OP_ATTR_FIELD_CALLBACK",
    "UCP_OP_ATTR_FIELD_USER_DATA",
    "UCP_OP_ATTR_FIELD_DATATYPE",
    "UCP_OP_ATTR_FIELD_FLAGS",
    "UCP_OP_ATTR_FIELD_MEMORY_TYPE",
    "UCP_OP_ATTR_FLAG_NO_IMM_CMPL",
    "UCP_OP_ATTR_FLAG_FORCE_IMM_CMPL",
    "UCP_AM_HANDLER_PARAM_FIELD_ID",
    "UCP_AM_HANDLER_PARAM_FIELD_FLAGS",
    "UCP_AM_HANDLER_PARAM_FIELD_CB",
    "UCP_AM_HANDLER_PARAM_FIELD_ARG",
    "UCP_AM_FLAG_WHOLE_MSG",
    "UCP_AM_SEND_FLAG_REPLY",
    "UCP_AM_SEND_FLAG_EAGER",
    "UCP_AM_SEND_FLAG_RNDV",
    "UCP_AM_RECV_ATTR_FIELD_REPLY_EP",
    "UCP_AM_RECV_ATTR_FLAG_DATA",
    "UCP_AM_RECV_ATTR_FLAG_RNDV",
    "UCP_DATATYPE_CONTIG",
    "UCP_MEM_MAP_PARAM_FIELD_ADDRESS",
    "UCP_MEM_MAP_PARAM_FIELD_LENGTH",
    "UCP_MEM_MAP_PARAM_FIELD_FLAGS",
    "UCP_MEM_MAP_PARAM_FIELD_PROT",
    "UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE",
    "UCP_MEM_MAP_PROT_LOCAL_READ",
    "UCP_MEM_MAP_PROT_LOCAL_WRITE",
    "UCP_MEM_MAP_PROT_REMOTE_READ",
    "UCP_MEM_MAP_PROT_REMOTE_WRITE",
];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    let required = env::var_os("CARGO_FEATURE_REQUIRED").is_some();
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo::rustc-check-cfg=cfg(ucx_missing)");

    let ucx = match pkg_config::Config::new()
        .atleast_version(MIN_VERSION)
        .probe("ucx")
    {
        Ok(ucx) => ucx,
        Err(e) => {
            let why = format!(
                "UCX >= {MIN_VERSION} was not found with pkg-config ({e}); install it with \
                 `apt-get install libucx-dev` (Debian, Ubuntu) or point PKG_CONFIG_PATH at \
                 its ucx.pc"
            );
            if required {
                panic!("{why}");
            }
            println!("cargo:warning=ucx-sys builds without UCX and links nothing: {why}");
            println!("cargo:rustc-cfg=ucx_missing");
            fs::write(out.join("layout_check.rs"), "").expect("write layout_check.rs");
            return;
        }
    };

    let host = env::var("HOST").unwrap_or_default();
    let target = env::var("TARGET").unwrap_or_default();
    let check = if host == target {
        layout_check(&ucx.include_paths, &out)
    } else {
        println!(
            "cargo:warning=ucx-sys: cross-compiling, so the layout of the bound structs is not \
             checked against the UCX headers"
        );
        String::new()
    };
    fs::write(out.join("layout_check.rs"), check).expect("write layout_check.rs");
}

/// Compiles and runs the layout probe; returns the Rust assertions.
fn layout_check(include_paths: &[PathBuf], out: &std::path::Path) -> String {
    let source = out.join("ucx_layout.c");
    fs::write(&source, probe_source()).expect("write ucx_layout.c");
    let exe = out.join("ucx_layout");
    let compiler = cc::Build::new()
        .includes(include_paths)
        .cargo_metadata(false)
        .cargo_warnings(false)
        .get_compiler();
    let mut cmd = compiler.to_command();
    for dir in include_paths {
        cmd.arg("-I").arg(dir);
    }
    cmd.arg(&source).arg("-o").arg(&exe);
    let built = cmd
        .output()
        .unwrap_or_else(|e| panic!("ucx-sys: cannot run the C compiler ({cmd:?}): {e}"));
    if !built.status.success() {
        panic!(
            "ucx-sys: the installed UCX headers do not declare what the bindings expect (a struct, \
             field or constant is missing or renamed); the C compiler said:\n{}",
            String::from_utf8_lossy(&built.stderr)
        );
    }
    let ran = Command::new(&exe)
        .output()
        .unwrap_or_else(|e| panic!("ucx-sys: cannot run the layout probe {exe:?}: {e}"));
    assert!(
        ran.status.success(),
        "ucx-sys: the layout probe failed: {}",
        String::from_utf8_lossy(&ran.stderr)
    );
    rust_assertions(&String::from_utf8_lossy(&ran.stdout))
}

/// The C program: one line per number, `size TYPE N`, `offset STRUCT FIELD N`,
/// `fieldsize STRUCT FIELD N`, `const NAME N`.
fn probe_source() -> String {
    let mut c = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include <ucp/api/ucp.h>\n\nint main(void)\n{\n",
    );
    for (ty, fields) in STRUCTS {
        writeln!(c, "    printf(\"size {ty} %zu\\n\", sizeof({ty}));").unwrap();
        for f in *fields {
            writeln!(
                c,
                "    printf(\"offset {ty} {f} %zu\\n\", offsetof({ty}, {f}));\n    \
                 printf(\"fieldsize {ty} {f} %zu\\n\", sizeof((({ty} *)0)->{f}));"
            )
            .unwrap();
        }
    }
    for ty in TYPES {
        writeln!(c, "    printf(\"size {ty} %zu\\n\", sizeof({ty}));").unwrap();
    }
    for name in CONSTANTS {
        writeln!(
            c,
            "    printf(\"const {name} %lld\\n\", (long long)({name}));"
        )
        .unwrap();
    }
    c.push_str("    return 0;\n}\n");
    c
}

/// Turns the probe's output into `const` assertions on the Rust bindings.
fn rust_assertions(probe: &str) -> String {
    let mut rs = String::from(
        "// Generated by build.rs from the installed UCX headers: the bindings' layout must match.\n",
    );
    for line in probe.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words[..] {
            ["size", ty, n] => writeln!(
                rs,
                "const _: () = assert!(::core::mem::size_of::<crate::{ty}>() == {n}, \
                 \"layout mismatch: {ty} is {n} bytes in the installed UCX headers, another size \
                 in ucx-sys\");"
            )
            .unwrap(),
            ["offset", ty, f, n] => writeln!(
                rs,
                "const _: () = assert!(::core::mem::offset_of!(crate::{ty}, {f}) == {n}, \
                 \"layout mismatch: {ty}.{f} is at offset {n} in the installed UCX headers, \
                 elsewhere in ucx-sys\");"
            )
            .unwrap(),
            ["fieldsize", ty, f, n] => writeln!(
                rs,
                "const _: () = assert!(crate::layout::field_size!(crate::{ty}, {f}) == {n}, \
                 \"layout mismatch: {ty}.{f} is {n} bytes in the installed UCX headers, another \
                 size in ucx-sys\");"
            )
            .unwrap(),
            ["const", name, n] => writeln!(
                rs,
                "const _: () = assert!(crate::{name} as i64 == {n}, \"constant mismatch: {name} \
                 is {n} in the installed UCX headers, another value in ucx-sys\");"
            )
            .unwrap(),
            _ => panic!("ucx-sys: unexpected line from the layout probe: {line:?}"),
        }
    }
    rs
}
