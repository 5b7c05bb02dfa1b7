//! `urom_coll.h` driven from C against a real daemon offering `worker_coll`.
//!
//! Each test builds `liburom_coll.so`, compiles `tests/c/coll.c` against
//! `urom-capi/coll/include` (warnings as errors), starts a daemon with the collective plugin
//! and runs the program with `UROM_SERVICE_SOCKET` pointing at it. The program forks its
//! ranks, which bootstrap through their own out-of-band allgather (memory shared by the forked
//! processes), and checks every result:
//!
//! * 2 and 3 ranks: allreduce on shared memory (20 restarts, a completion callback, a call
//!   from another thread refused), in place, allgather / alltoall / bcast / reduce on user
//!   memory registered by address, a barrier, a zero count, NULL and foreign handles and bad
//!   arguments, a sub-team of the even ranks, handles destroyed in any order;
//! * 3 ranks, `kill`: the worker killed with SIGKILL during a 64 MiB allreduce: every rank's
//!   collective completes once with `UROM_ERR_WORKER`, and a later start fails.

use std::path::PathBuf;
use std::process::Command;

use urom_testkit::daemon::{Daemon, plugin_dir, start_daemon};
use urom_testkit::{TempDir, binary, cdylib, workspace_root};

/// The C program, compiled once per test process.
fn program() -> PathBuf {
    static PROGRAM: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PROGRAM.get_or_init(compile).clone()
}

fn compile() -> PathBuf {
    let lib = cdylib("urom-capi-coll", "urom_coll");
    let libs = lib.parent().expect("the profile directory").to_owned();
    let root = workspace_root();
    let source = root.join("urom-capi/coll/tests/c/coll.c");
    let dir = urom_testkit::profile_dir().join("c-objects");
    std::fs::create_dir_all(&dir).expect("creating the C object directory");
    let out = dir.join("capi-coll");
    let partial = dir.join(format!("capi-coll.{}.partial", std::process::id()));
    let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let status = Command::new(&compiler)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O2"])
        .arg(format!(
            "-I{}",
            root.join("urom-capi/coll/include").display()
        ))
        .arg("-o")
        .arg(&partial)
        .arg(&source)
        .arg(format!("-L{}", libs.display()))
        .args(["-lurom_coll", "-lpthread"])
        .arg(format!("-Wl,-rpath,{}", libs.display()))
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{compiler}`: {e}"));
    assert!(status.success(), "compiling {} failed", source.display());
    std::fs::rename(&partial, &out).expect("moving the program into place");
    out
}

fn daemon() -> (TempDir, Daemon) {
    let plugins = TempDir::new("urom-capi-coll-plugins");
    let dir = plugin_dir(&plugins, &[("urom-plugin-coll", "worker_coll")]);
    let daemon = start_daemon(
        binary("urom-daemon", "urom-daemon"),
        dir.to_str().expect("a UTF-8 path"),
        &[],
        true,
    );
    (plugins, daemon)
}

fn run(ranks: u32, mode: &str) {
    let program = program();
    let (_plugins, daemon) = daemon();
    let output = Command::new(&program)
        .args([ranks.to_string(), mode.to_owned()])
        .env("UROM_SERVICE_SOCKET", &daemon.socket)
        .output()
        .expect("running the C program");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains(&format!("coll ok: {ranks} ranks, {mode}")),
        "the program failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n--- daemon log\n{}",
        output.status,
        daemon.log()
    );
}

#[test]
fn two_ranks_run_every_kind_of_call_through_the_c_api() {
    run(2, "all");
}

#[test]
fn three_ranks_run_every_kind_of_call_and_a_sub_team_through_the_c_api() {
    run(3, "all");
}

#[test]
fn a_worker_killed_during_a_collective_fails_it_once_on_every_rank() {
    run(3, "kill");
}

/// Without a service, every rank's context creation fails the same way, at once.
#[test]
fn no_service_fails_every_rank_with_no_service() {
    let program = program();
    let dir = TempDir::new("urom-capi-coll-none");
    let output = Command::new(&program)
        .args(["2", "noservice"])
        .env("UROM_SERVICE_SOCKET", dir.path().join("nothing.sock"))
        .output()
        .expect("running the C program");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("coll ok: 2 ranks, noservice"),
        "({}):\n{stdout}\n{stderr}",
        output.status
    );
}
