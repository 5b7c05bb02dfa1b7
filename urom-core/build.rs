//! With the `ucx` feature and a UCX outside the system directories (ucx-sys's `UCX_DIR`), gives
//! what this package links (binaries, tests, benches, shared libraries) a hard rpath to that
//! UCX's library directory, so that it loads the UCX it was built against. Otherwise nothing.
//!
//! With the `ucx` feature it also compiles the crate with `cfg(ucx_1_14)` and `cfg(ucx_1_15)`
//! when the UCX found is at least that version (ucx-sys's `DEP_UCP_VERSION`): 1.14's
//! headers declare exported memory handles, 1.15 implements them.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=DEP_UCP_LIBDIR");
    println!("cargo:rerun-if-env-changed=DEP_UCP_VERSION");
    println!("cargo::rustc-check-cfg=cfg(ucx_1_14, ucx_1_15)");
    if let Some(dir) = std::env::var_os("DEP_UCP_LIBDIR") {
        let dir = dir.to_string_lossy();
        println!("cargo:rustc-link-arg=-Wl,--disable-new-dtags,-rpath,{dir}");
    }
    // "major.minor.release", e.g. "1.22.0".
    let version: Option<(u32, u32)> = std::env::var("DEP_UCP_VERSION").ok().and_then(|v| {
        let mut parts = v.split('.').map(|part| part.parse::<u32>().ok());
        Some((parts.next()??, parts.next()??))
    });
    for since in [14, 15] {
        if version.is_some_and(|(major, minor)| major > 1 || minor >= since) {
            println!("cargo:rustc-cfg=ucx_1_{since}");
        }
    }
}
