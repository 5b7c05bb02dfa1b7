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

/// The SONAME of urom's shared library `lib<name>.so` at the workspace's major version:
/// `lib<name>.so.<major>` (all of urom's C libraries share the workspace's version).
pub fn soname_of(name: &str) -> String {
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap_or_else(|_| "0".to_owned());
    format!("lib{name}.so.{major}")
}

/// Names the calling package's shared library `lib<name>.so` by its SONAME,
/// `lib<name>.so.<major>` ([`soname_of`]), and puts the link `lib<name>.so.<major>` ->
/// `lib<name>.so` in the profile directory Cargo writes the library to, so that programs
/// linked against it there (which record the SONAME) load it from there too. An installed
/// prefix holds the same names (`scripts/install.sh`).
pub fn soname(name: &str) {
    let soname = soname_of(name);
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");
    // OUT_DIR is <profile>/build/<package>-<hash>/out.
    let Some(profile) = std::env::var_os("OUT_DIR").and_then(|out| {
        std::path::Path::new(&out)
            .ancestors()
            .nth(3)
            .map(std::path::Path::to_owned)
    }) else {
        return;
    };
    let link = profile.join(&soname);
    // Dangling until the library is linked, a moment later.
    let _ = std::fs::remove_file(&link);
    if let Err(e) = std::os::unix::fs::symlink(format!("lib{name}.so"), &link) {
        println!(
            "cargo:warning=cannot link {} to lib{name}.so: {e}",
            link.display()
        );
    }
}

/// Makes the calling package's shared library need urom's library `lib<name>.so` (recorded by
/// its SONAME, [`soname_of`]) and find it beside itself (RUNPATH `$ORIGIN`). Cargo cannot
/// build another package's library first, so the link uses a stand-in: an empty shared object
/// with that SONAME, built in `OUT_DIR` with the C compiler (`CC`, else `cc`). The symbols the
/// library uses from it stay undefined until the real one is loaded.
pub fn link_stand_in(name: &str) {
    println!("cargo:rerun-if-env-changed=CC");
    let out = std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR");
    let dir = std::path::Path::new(&out).join("link-stub");
    std::fs::create_dir_all(&dir).expect("creating the stub directory");
    let source = dir.join(format!("{name}.c"));
    std::fs::write(
        &source,
        format!("/* stands in for lib{name}.so at link time */\n"),
    )
    .expect("writing the stub source");
    let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let status = std::process::Command::new(&compiler)
        .args(["-shared", "-fPIC"])
        .arg(format!("-Wl,-soname,{}", soname_of(name)))
        .arg("-o")
        .arg(dir.join(format!("lib{name}.so")))
        .arg(&source)
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{compiler}`: {e}"));
    assert!(status.success(), "building the lib{name} stand-in failed");
    // Only the library links it.
    println!("cargo:rustc-cdylib-link-arg=-L{}", dir.display());
    println!("cargo:rustc-cdylib-link-arg=-Wl,--push-state,--no-as-needed,-l{name},--pop-state");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-rpath,$ORIGIN");
}
