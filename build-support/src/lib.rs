//! What urom's build scripts share.
//!
//! `ucx-sys` publishes, through Cargo's `links` metadata, the library directory of the UCX it
//! was built against when that is not a system directory (`DEP_UCP_LIBDIR`, from `UCX_DIR`)
//! and that UCX's version (`DEP_UCP_VERSION`); a package that depends on `ucx-sys` directly
//! (with its `ucx` feature) sees them in its build script.

/// Gives what the calling package links (binaries, tests, benches, shared libraries) a hard
/// rpath to the UCX it was built against, when that UCX lies outside the system directories,
/// so that it loads that UCX and no other; otherwise does nothing. A hard rpath
/// (`--disable-new-dtags`) wins over `LD_LIBRARY_PATH`.
pub fn rpath_to_ucx() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=DEP_UCP_LIBDIR");
    if let Some(dir) = std::env::var_os("DEP_UCP_LIBDIR") {
        let dir = dir.to_string_lossy();
        println!("cargo:rustc-link-arg=-Wl,--disable-new-dtags,-rpath,{dir}");
    }
}

/// Compiles the calling package with `cfg(ucx_1_N)` for each `N` of `minors` that the UCX it
/// was built against reaches (1.N or later); declares them all.
pub fn ucx_version_cfgs(minors: &[u32]) {
    println!("cargo:rerun-if-env-changed=DEP_UCP_VERSION");
    let names: Vec<String> = minors
        .iter()
        .map(|minor| format!("ucx_1_{minor}"))
        .collect();
    println!("cargo::rustc-check-cfg=cfg({})", names.join(", "));
    // "major.minor.release", e.g. "1.22.0".
    let version: Option<(u32, u32)> = std::env::var("DEP_UCP_VERSION").ok().and_then(|v| {
        let mut parts = v.split('.').map(|part| part.parse::<u32>().ok());
        Some((parts.next()??, parts.next()??))
    });
    for (minor, name) in minors.iter().zip(&names) {
        if version.is_some_and(|(major, found)| major > 1 || found >= *minor) {
            println!("cargo:rustc-cfg={name}");
        }
    }
}
