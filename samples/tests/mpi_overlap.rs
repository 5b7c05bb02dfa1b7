//! `samples/mpi/overlap.c`, an MPI program that knows nothing of urom, run under `mpirun` as
//! it is and with `liburom_mpi.so` preloaded: both print the same checksum, and the preloaded
//! run offloaded its `MPI_Iallreduce` and `MPI_Ialltoall`. Skips, saying why, without Open MPI.

use std::path::PathBuf;
use std::process::{Command, Output};

use urom_testkit::daemon::{plugin_dir, start_daemon};
use urom_testkit::{TempDir, binary, cdylib, profile_dir, workspace_root};

fn on_path(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(program))
            .find(|candidate| candidate.is_file())
    })
}

fn checksum(output: &Output) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "mpirun ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
        .lines()
        .find_map(|line| line.split("checksum ").nth(1))
        .and_then(|rest| rest.split(';').next())
        .unwrap_or_else(|| panic!("no checksum in:\n{stdout}"))
        .to_owned()
}

#[test]
fn the_overlap_sample_prints_the_same_results_with_and_without_the_library() {
    let (Some(mpirun), Some(mpicc)) = (on_path("mpirun"), on_path("mpicc")) else {
        urom_testkit::skip(
            "no mpirun or mpicc on PATH (apt-get install openmpi-bin libopenmpi-dev)",
        );
        return;
    };
    let dir = profile_dir().join("c-objects");
    std::fs::create_dir_all(&dir).expect("creating the C object directory");
    let program = dir.join("overlap");
    let status = Command::new(&mpicc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O2", "-o"])
        .arg(&program)
        .arg(workspace_root().join("samples/mpi/overlap.c"))
        .status()
        .expect("running mpicc");
    assert!(status.success(), "compiling the sample failed");
    cdylib("urom-capi-coll", "urom_coll");
    let library = cdylib("urom-capi-mpi", "urom_mpi");
    let plugins = TempDir::new("urom-overlap-plugins");
    let plugin_path = plugin_dir(&plugins, &[("urom-plugin-coll", "worker_coll")]);
    let daemon = start_daemon(
        binary("urom-daemon", "urom-daemon"),
        plugin_path.to_str().expect("a UTF-8 path"),
        &[],
        true,
    );
    // Its own session directory: Open MPI 4.1's shared one races between concurrent mpiruns.
    let session = TempDir::new("urom-overlap-session");
    let run = |preload: bool| {
        let mut command = Command::new(&mpirun);
        command
            .env("TMPDIR", session.path())
            .args(["--allow-run-as-root", "--oversubscribe", "-np", "2"])
            .args(["--mca", "pml", "ob1", "--mca", "btl", "self,vader"])
            .arg("-x")
            .arg(format!("UROM_SERVICE_SOCKET={}", daemon.socket.display()));
        if preload {
            command
                .arg("-x")
                .arg(format!("LD_PRELOAD={}", library.display()))
                .args(["-x", "UROM_MPI_VERBOSE=1"]);
        }
        command.arg(&program).output().expect("running mpirun")
    };
    let alone = run(false);
    let offloaded = run(true);
    assert_eq!(checksum(&alone), checksum(&offloaded));
    let stderr = String::from_utf8_lossy(&offloaded.stderr);
    for call in ["MPI_Iallreduce", "MPI_Ialltoall"] {
        assert!(
            stderr.contains(&format!("{call} offloaded to urom")),
            "{call} was not offloaded:\n{stderr}\n{}",
            daemon.log()
        );
    }
    println!(
        "Open MPI alone: {}",
        String::from_utf8_lossy(&alone.stdout).trim()
    );
    println!(
        "with liburom_mpi: {}",
        String::from_utf8_lossy(&offloaded.stdout).trim()
    );
}
