//! Finds UCX, reads its version from the headers and checks that the structs `src/lib.rs` binds
//! have those headers' layout.
//!
//! Where UCX comes from: `UCX_DIR` (a prefix holding `include/` and `lib/`) when set, else
//! pkg-config's `ucx`. The version is `UCP_API_MAJOR.UCP_API_MINOR` from
//! `ucp/api/ucp_version.h`; older than 1.13 is refused. For each minor version 1.N from 1.14 up
//! to the one found, the crate is compiled with `--cfg ucx_1_N`, which turns on the fields,
//! constants and functions that version added (`src/lib.rs` gates them), and
//! `$OUT_DIR/version.rs` holds the version as constants.
//!
//! The check: a small C program, compiled against the headers, prints the size of every bound
//! struct and type, the offset and size of every bound field and the value of every bound
//! constant (those the version has); this script turns those numbers into `const` assertions
//! (`$OUT_DIR/layout_check.rs`) that `src/lib.rs` includes. A UCX whose layout differs from the
//! bindings fails the build with a message naming the struct and field. A field or constant
//! the headers lack fails the C compilation, and the build stops with the compiler's message.
//!
//! Linking: the library directory goes to the linker (`rustc-link-search`) and, when it is not
//! a system directory, to the crates that depend on this one as `DEP_UCP_LIBDIR` (the package
//! `links = "ucp"`): their build scripts give the binaries they link a hard rpath to it (this
//! crate does so for its own tests), so that a program finds the UCX it was built against.

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The oldest UCX whose API the bindings follow: `(major, minor)`.
const MIN_VERSION: (u32, u32) = (1, 13);
/// The newest minor version whose additions `src/lib.rs` knows (`cfg(ucx_1_N)` up to this N).
const NEWEST_KNOWN_MINOR: u32 = 22;

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
    "UCS_ERR_UNSUPPORTED",
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

/// Fields that newer UCX versions added to bound structs (at their ends), with the minor
/// version 1.N whose headers first have them; `src/lib.rs` declares each under `cfg(ucx_1_N)`.
const NEWER_FIELDS: &[(u32, &str, &str)] = &[
    (14, "ucp_mem_map_params_t", "exported_memh_buffer"),
    (20, "ucp_params_t", "node_local_id"),
    (22, "ucp_request_param_t", "remote_datatype"),
    (22, "ucp_request_param_t", "remote"),
    (22, "ucp_request_param_t", "remote_count"),
];

/// Structs that newer UCX versions added, as [`STRUCTS`], with the minor version.
const NEWER_STRUCTS: &[(u32, &str, &[&str])] = &[
    (14, "ucp_memh_pack_params_t", &["field_mask", "flags"]),
    (14, "ucp_memh_buffer_release_params_t", &["field_mask"]),
];

/// Constants that newer UCX versions added, with the minor version.
const NEWER_CONSTANTS: &[(u32, &str)] = &[
    (14, "UCP_FEATURE_EXPORTED_MEMH"),
    (14, "UCP_MEM_MAP_PARAM_FIELD_EXPORTED_MEMH_BUFFER"),
    (14, "UCP_MEMH_PACK_PARAM_FIELD_FLAGS"),
    (14, "UCP_MEMH_PACK_FLAG_EXPORT"),
    (14, "UCP_AM_SEND_FLAG_COPY_HEADER"),
    (20, "UCP_PARAM_FIELD_NODE_LOCAL_ID"),
    (22, "UCP_OP_ATTR_FIELD_REMOTE_DATATYPE"),
    (22, "UCP_OP_ATTR_FIELD_REMOTE"),
    (22, "UCP_OP_ATTR_FIELD_REMOTE_COUNT"),
];

/// A UCX version read from the headers.
#[derive(Clone, Copy)]
struct Version {
    major: u32,
    minor: u32,
    /// `UCT_VERNO_PATCH` (the release), for messages only.
    release: u32,
}

impl Version {
    /// Whether these headers have what UCX 1.`minor` added.
    fn has(self, minor: u32) -> bool {
        self.major > 1 || (self.major == 1 && self.minor >= minor)
    }
}

/// Where UCX's headers and library are.
struct Ucx {
    include: Vec<PathBuf>,
    /// The library directory when it is not one the dynamic loader searches anyway.
    rpath: Option<PathBuf>,
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=UCX_DIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    let required = env::var_os("CARGO_FEATURE_REQUIRED").is_some();
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let cfgs: Vec<String> = (MIN_VERSION.1 + 1..=NEWEST_KNOWN_MINOR)
        .map(|minor| format!("ucx_1_{minor}"))
        .collect();
    println!(
        "cargo::rustc-check-cfg=cfg(ucx_missing, {})",
        cfgs.join(", ")
    );

    let found = find_ucx().and_then(|ucx| {
        let version = header_version(&ucx.include)?;
        if !version.has(MIN_VERSION.1) {
            return Err(format!(
                "found UCX {}.{}.{}, but ucx-sys needs UCX >= {}.{}",
                version.major, version.minor, version.release, MIN_VERSION.0, MIN_VERSION.1
            ));
        }
        Ok((ucx, version))
    });
    let (ucx, version) = match found {
        Ok(found) => found,
        Err(why) => {
            let why = format!(
                "{why}; install UCX >= {}.{} (`apt-get install libucx-dev` on Debian and \
                 Ubuntu) or point UCX_DIR at a UCX prefix (holding include/ and lib/)",
                MIN_VERSION.0, MIN_VERSION.1
            );
            if required {
                panic!("ucx-sys: {why}");
            }
            println!("cargo:warning=ucx-sys builds without UCX and links nothing: {why}");
            println!("cargo:rustc-cfg=ucx_missing");
            let minimum = Version {
                major: MIN_VERSION.0,
                minor: MIN_VERSION.1,
                release: 0,
            };
            write_version(&out, minimum);
            fs::write(out.join("layout_check.rs"), "").expect("write layout_check.rs");
            return;
        }
    };

    for minor in MIN_VERSION.1 + 1..=NEWEST_KNOWN_MINOR {
        if version.has(minor) {
            println!("cargo:rustc-cfg=ucx_1_{minor}");
        }
    }
    write_version(&out, version);
    println!(
        "cargo:version={}.{}.{}",
        version.major, version.minor, version.release
    );
    println!("cargo:version_minor={}", version.minor);
    if let Some(dir) = &ucx.rpath {
        // For dependents' build scripts (`DEP_UCP_LIBDIR`), and for this crate's own tests.
        println!("cargo:libdir={}", dir.display());
        println!(
            "cargo:rustc-link-arg=-Wl,--disable-new-dtags,-rpath,{}",
            dir.display()
        );
    }

    let host = env::var("HOST").unwrap_or_default();
    let target = env::var("TARGET").unwrap_or_default();
    let check = if host == target {
        layout_check(&ucx.include, version, &out)
    } else {
        println!(
            "cargo:warning=ucx-sys: cross-compiling, so the layout of the bound structs is not \
             checked against the UCX headers"
        );
        String::new()
    };
    fs::write(out.join("layout_check.rs"), check).expect("write layout_check.rs");
}

/// Finds UCX through `UCX_DIR`, else pkg-config, and tells Cargo to link it.
fn find_ucx() -> Result<Ucx, String> {
    if let Some(prefix) = env::var_os("UCX_DIR").filter(|dir| !dir.is_empty()) {
        let prefix = PathBuf::from(prefix);
        let include = prefix.join("include");
        let header = include.join("ucp/api/ucp_version.h");
        if !header.is_file() {
            return Err(format!(
                "UCX_DIR={} holds no include/ucp/api/ucp_version.h",
                prefix.display()
            ));
        }
        println!("cargo:rerun-if-changed={}", header.display());
        let lib = ["lib", "lib64"]
            .iter()
            .map(|dir| prefix.join(dir))
            .find(|dir| dir.join("libucp.so").exists())
            .ok_or_else(|| {
                format!(
                    "UCX_DIR={} holds no lib/libucp.so (nor lib64/libucp.so)",
                    prefix.display()
                )
            })?;
        // The prefix's own ucx.pc may name another prefix (the one UCX was built in): not used.
        println!("cargo:rustc-link-search=native={}", lib.display());
        println!("cargo:rustc-link-lib=ucp");
        println!("cargo:rustc-link-lib=ucs");
        let rpath = (!is_system_dir(&lib)).then_some(lib);
        return Ok(Ucx {
            include: vec![include],
            rpath,
        });
    }
    let found = pkg_config::Config::new()
        .atleast_version(&format!("{}.{}", MIN_VERSION.0, MIN_VERSION.1))
        .probe("ucx")
        .map_err(|e| format!("UCX_DIR is not set and pkg-config did not find UCX ({e})"))?;
    let rpath = found
        .link_paths
        .iter()
        .find(|dir| dir.join("libucp.so").exists() && !is_system_dir(dir))
        .cloned();
    for dir in &found.include_paths {
        let header = dir.join("ucp/api/ucp_version.h");
        if header.is_file() {
            println!("cargo:rerun-if-changed={}", header.display());
        }
    }
    Ok(Ucx {
        include: found.include_paths,
        rpath,
    })
}

/// Whether the dynamic loader searches `dir` without being told (no rpath needed).
fn is_system_dir(dir: &Path) -> bool {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let parent = dir.parent().and_then(Path::to_str).unwrap_or("");
    let name = dir.file_name().and_then(|name| name.to_str()).unwrap_or("");
    matches!(
        dir.to_str().unwrap_or(""),
        "/lib" | "/lib64" | "/usr/lib" | "/usr/lib64"
    ) || (matches!(parent, "/lib" | "/usr/lib") && name.contains("-linux-"))
}

/// Reads `UCP_API_MAJOR`, `UCP_API_MINOR` (`ucp/api/ucp_version.h`) and `UCT_VERNO_PATCH`
/// (`uct/api/version.h`) with the C preprocessor, so that the headers are found as the layout
/// probe finds them.
fn header_version(include: &[PathBuf]) -> Result<Version, String> {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let source = out.join("ucx_version.c");
    fs::write(
        &source,
        "#include <ucp/api/ucp_version.h>\n#include <uct/api/version.h>\n\
         ucx_sys_version UCP_API_MAJOR UCP_API_MINOR UCT_VERNO_PATCH\n",
    )
    .expect("write ucx_version.c");
    let mut cmd = compiler(include);
    cmd.arg("-E").arg("-P").arg(&source);
    let ran = cmd
        .output()
        .map_err(|e| format!("cannot run the C preprocessor ({cmd:?}): {e}"))?;
    if !ran.status.success() {
        return Err(format!(
            "the C preprocessor cannot read the UCX version headers: {}",
            String::from_utf8_lossy(&ran.stderr).trim()
        ));
    }
    let text = String::from_utf8_lossy(&ran.stdout);
    let numbers: Option<Vec<u32>> = text
        .lines()
        .find_map(|line| line.trim().strip_prefix("ucx_sys_version "))
        .map(|rest| {
            rest.split_whitespace()
                .map(|n| n.trim_end_matches(['u', 'U', 'l', 'L']).parse().ok())
                .collect::<Option<Vec<u32>>>()
        })
        .and_then(|numbers| numbers);
    match numbers.as_deref() {
        Some(&[major, minor, release]) => Ok(Version {
            major,
            minor,
            release,
        }),
        _ => Err(format!(
            "cannot read the UCX version from ucp/api/ucp_version.h (the preprocessor gave \
             {text:?})"
        )),
    }
}

/// `$OUT_DIR/version.rs`: the version as constants for `src/lib.rs`.
fn write_version(out: &Path, version: Version) {
    let Version {
        major,
        minor,
        release,
    } = version;
    let rs = format!(
        "// Generated by build.rs from the UCX headers this build uses.\n\
         /// The UCP API version of the headers this build was compiled against: `(major, \
         minor)`.\n\
         pub const VERSION: (u32, u32) = ({major}, {minor});\n\
         /// The release of the headers this build was compiled against (`UCT_VERNO_PATCH`).\n\
         pub const VERSION_RELEASE: u32 = {release};\n\
         /// The UCP API major version of the headers, passed to [`ucp_init_version`].\n\
         pub const UCP_API_MAJOR: c_uint = {major};\n\
         /// The UCP API minor version of the headers, passed to [`ucp_init_version`].\n\
         pub const UCP_API_MINOR: c_uint = {minor};\n"
    );
    fs::write(out.join("version.rs"), rs).expect("write version.rs");
}

/// The C compiler, with `include` on its search path (ahead of the system's).
fn compiler(include: &[PathBuf]) -> Command {
    let mut cmd = cc::Build::new()
        .cargo_metadata(false)
        .cargo_warnings(false)
        .get_compiler()
        .to_command();
    for dir in include {
        cmd.arg("-I").arg(dir);
    }
    cmd
}

/// Compiles and runs the layout probe; returns the Rust assertions.
fn layout_check(include: &[PathBuf], version: Version, out: &Path) -> String {
    let source = out.join("ucx_layout.c");
    fs::write(&source, probe_source(version)).expect("write ucx_layout.c");
    let exe = out.join("ucx_layout");
    let mut cmd = compiler(include);
    cmd.arg(&source).arg("-o").arg(&exe);
    let built = cmd
        .output()
        .unwrap_or_else(|e| panic!("ucx-sys: cannot run the C compiler ({cmd:?}): {e}"));
    if !built.status.success() {
        panic!(
            "ucx-sys: the UCX {}.{}.{} headers do not declare what the bindings expect (a struct, \
             field or constant is missing or renamed); the C compiler said:\n{}",
            version.major,
            version.minor,
            version.release,
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
    rust_assertions(&String::from_utf8_lossy(&ran.stdout), version)
}

/// The C program: one line per number, `size TYPE N`, `offset STRUCT FIELD N`,
/// `fieldsize STRUCT FIELD N`, `const NAME N`; only what `version` has.
fn probe_source(version: Version) -> String {
    let mut c = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include <ucp/api/ucp.h>\n\nint main(void)\n{\n",
    );
    let newer = NEWER_STRUCTS
        .iter()
        .filter(|(minor, _, _)| version.has(*minor))
        .map(|(_, ty, fields)| (*ty, *fields));
    for (ty, fields) in STRUCTS.iter().copied().chain(newer) {
        writeln!(c, "    printf(\"size {ty} %zu\\n\", sizeof({ty}));").unwrap();
        let added = NEWER_FIELDS
            .iter()
            .filter(|(minor, t, _)| *t == ty && version.has(*minor))
            .map(|(_, _, f)| *f);
        for f in fields.iter().copied().chain(added) {
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
    let newer = NEWER_CONSTANTS
        .iter()
        .filter(|(minor, _)| version.has(*minor))
        .map(|(_, name)| *name);
    for name in CONSTANTS.iter().copied().chain(newer) {
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
fn rust_assertions(probe: &str, version: Version) -> String {
    let ucx = format!(
        "the UCX {}.{}.{} headers",
        version.major, version.minor, version.release
    );
    let mut rs = String::from(
        "// Generated by build.rs from the UCX headers: the bindings' layout must match.\n",
    );
    for line in probe.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words[..] {
            ["size", ty, n] => writeln!(
                rs,
                "const _: () = assert!(::core::mem::size_of::<crate::{ty}>() == {n}, \
                 \"layout mismatch: {ty} is {n} bytes in {ucx}, another size in ucx-sys (if the \
                 fields ucx-sys binds keep their offsets, this UCX added fields at the end that \
                 ucx-sys does not know yet: add them under cfg(ucx_1_{minor}))\");",
                minor = version.minor
            )
            .unwrap(),
            ["offset", ty, f, n] => writeln!(
                rs,
                "const _: () = assert!(::core::mem::offset_of!(crate::{ty}, {f}) == {n}, \
                 \"layout mismatch: {ty}.{f} is at offset {n} in {ucx}, elsewhere in \
                 ucx-sys\");"
            )
            .unwrap(),
            ["fieldsize", ty, f, n] => writeln!(
                rs,
                "const _: () = assert!(crate::layout::field_size!(crate::{ty}, {f}) == {n}, \
                 \"layout mismatch: {ty}.{f} is {n} bytes in {ucx}, another size in \
                 ucx-sys\");"
            )
            .unwrap(),
            ["const", name, n] => writeln!(
                rs,
                "const _: () = assert!(crate::{name} as i64 == {n}, \"constant mismatch: {name} \
                 is {n} in {ucx}, another value in ucx-sys\");"
            )
            .unwrap(),
            _ => panic!("ucx-sys: unexpected line from the layout probe: {line:?}"),
        }
    }
    rs
}
