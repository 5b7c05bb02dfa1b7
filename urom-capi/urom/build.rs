//! Links libdoca_urom to libdoca_common by name.
//!
//! libdoca_urom calls the `urom_capi_*` functions libdoca_common defines, and records
//! `libdoca_common.so.0` as a library it needs, so that loading it loads its core too. Cargo
//! cannot build the other library first, so the link uses a stand-in: an empty shared object
//! with the real library's SONAME, built here with the C compiler. The symbols stay undefined
//! in libdoca_urom and are found in the real libdoca_common when the program is loaded
//! (programs link both: `-ldoca_urom -ldoca_common`). The library's RUNPATH is `$ORIGIN`, so
//! the two are found together when they sit in one directory. Its own SONAME is
//! `libdoca_urom.so.0` (`urom_build_support::soname`).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let dir = out.join("link-stub");
    std::fs::create_dir_all(&dir).expect("creating the stub directory");
    let source = dir.join("empty.c");
    std::fs::write(
        &source,
        "/* stands in for libdoca_common.so at link time */\n",
    )
    .expect("writing the stub source");
    let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let status = Command::new(&compiler)
        .args(["-shared", "-fPIC"])
        .arg(format!(
            "-Wl,-soname,{}",
            urom_build_support::soname_of("doca_common")
        ))
        .arg("-o")
        .arg(dir.join("libdoca_common.so"))
        .arg(&source)
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{compiler}`: {e}"));
    assert!(
        status.success(),
        "building the libdoca_common stand-in failed"
    );
    // Only the library links it: the package's tests are C programs' drivers and need neither.
    println!("cargo:rustc-cdylib-link-arg=-L{}", dir.display());
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--push-state,--no-as-needed,-ldoca_common,--pop-state"
    );
    urom_build_support::soname("doca_urom");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-rpath,$ORIGIN");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=CC");
    // With the `ucx` feature and a UCX outside the system directories (ucx-sys's `UCX_DIR`): a
    // hard rpath to its library directory, for the library and the tests.
    urom_build_support::rpath_to_ucx();
}
