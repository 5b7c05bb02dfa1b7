//! Helpers for urom's tests.
//!
//! `cargo test` builds a package's `rlib` but not its `cdylib`, so tests that load a plugin
//! build the plugin library themselves with [`cdylib`], into the same target directory and
//! profile as the running test.
#![deny(unsafe_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

/// The profile directory of the running test binary (`target/debug`, `target/release`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    // Test binaries live in `<target>/<profile>/deps/`.
    exe.parent()
        .and_then(Path::parent)
        .expect("test binary outside a cargo target directory")
        .to_owned()
}

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testkit lives in the workspace")
        .to_owned()
}

/// Builds `package` with cargo (once per test process) and returns the path of its shared
/// library `lib<lib_name>.so`.
pub fn cdylib(package: &str, lib_name: &str) -> PathBuf {
    static BUILT: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let built = BUILT.get_or_init(Default::default);
    let mut built = built
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(path) = built.get(package) {
        return path.clone();
    }
    let profile_dir = profile_dir();
    let target_dir = profile_dir
        .parent()
        .expect("profile directory inside the target directory");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut command = Command::new(&cargo);
    command
        .current_dir(workspace_root())
        .args(["build", "--quiet", "-p", package, "--target-dir"])
        .arg(target_dir);
    if profile_dir
        .file_name()
        .is_some_and(|name| name == "release")
    {
        command.arg("--release");
    }
    let status = command
        .status()
        .unwrap_or_else(|e| panic!("cannot run `{cargo}` to build {package}: {e}"));
    assert!(status.success(), "building {package} failed");
    let path = profile_dir.join(format!("lib{lib_name}.so"));
    assert!(path.exists(), "{} was not built", path.display());
    built.insert(package.to_owned(), path.clone());
    path
}
