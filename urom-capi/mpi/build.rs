//! Compiles the MPI interposition layer (`src/urom_mpi.c`) with Open MPI's flags and links it
//! into `liburom_mpi.so`.
//!
//! * `mpicc --showme:compile` and `--showme:link` give MPI's include and library flags (`MPICC`
//!   names another wrapper). Without them, a warning, and a library without MPI functions.
//! * The C objects are linked whole (`+whole-archive`: nothing in Rust calls them), and a
//!   version script exports their `MPI_*` symbols beside the ones rustc exports (GNU ld merges
//!   the two scripts).
//! * `liburom_coll.so.0` (package `urom-capi-coll`) is recorded as needed, linked against a
//!   stand-in with its SONAME, as libdoca_urom links libdoca_common: Cargo cannot build another
//!   package's cdylib first. The real one is found at load time through RUNPATH `$ORIGIN`
//!   (`urom_build_support::link_stand_in`).

use std::path::PathBuf;
use std::process::Command;

fn showme(mpicc: &str, what: &str) -> Option<Vec<String>> {
    let out = Command::new(mpicc)
        .arg(format!("--showme:{what}"))
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    Some(
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(str::to_owned)
            .collect(),
    )
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/urom_mpi.c");
    println!("cargo:rerun-if-changed=exports.map");
    println!("cargo:rerun-if-changed=../coll/include/urom_coll.h");
    println!("cargo:rerun-if-env-changed=MPICC");
    println!("cargo:rerun-if-env-changed=PATH");
    let mpicc = std::env::var("MPICC").unwrap_or_else(|_| "mpicc".to_owned());
    // Built again once the wrapper appears or changes (a path that does not exist reruns the
    // script at every build, which costs nothing here).
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(&mpicc))
            .find(|candidate| candidate.is_file())
    });
    println!(
        "cargo:rerun-if-changed={}",
        found.map_or_else(|| format!("/usr/bin/{mpicc}"), |p| p.display().to_string())
    );
    let (Some(compile), Some(link)) = (showme(&mpicc, "compile"), showme(&mpicc, "link")) else {
        println!(
            "cargo:warning=no Open MPI wrapper `{mpicc}` (apt-get install libopenmpi-dev): \
             liburom_mpi.so is built without its MPI functions"
        );
        return;
    };
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("set by cargo"));

    let mut build = cc::Build::new();
    build
        .file(manifest.join("src/urom_mpi.c"))
        .include(manifest.join("../coll/include"))
        .flag("-std=c11")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .cargo_metadata(false);
    for flag in &compile {
        match flag.strip_prefix("-I") {
            Some(dir) => {
                build.include(dir);
            }
            None => {
                build.flag(flag);
            }
        }
    }
    build.compile("urom_mpi_shim");
    println!("cargo:rustc-link-search=native={}", out.display());
    println!("cargo:rustc-link-lib=static:+whole-archive=urom_mpi_shim");

    urom_build_support::link_stand_in("urom_coll");
    for flag in &link {
        if flag.starts_with("-L") || flag.starts_with("-l") || flag.starts_with("-Wl,") {
            println!("cargo:rustc-cdylib-link-arg={flag}");
        }
    }
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        manifest.join("exports.map").display()
    );
    urom_build_support::soname("urom_mpi");
}
