//! `liburom_mpi.so` under `mpirun`: an MPI program (`tests/c/mpi_colls.c`) that checks every
//! offloaded collective against the MPI library's own (`PMPI_*`), run with and without
//! `LD_PRELOAD`, against a real daemon offering `worker_coll`.
//!
//! Open MPI 4.1 as Debian ships it, ranks over shared memory (`--mca pml ob1 --mca btl
//! self,vader`), oversubscribed. Without `mpicc` or `mpirun` on the path, each test says why it
//! skips.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use urom_testkit::daemon::{Daemon, plugin_dir, start_daemon};
use urom_testkit::{TempDir, binary, cdylib, profile_dir, workspace_root};

fn on_path(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(program))
            .find(|candidate| candidate.is_file())
    })
}

/// `mpirun` and `mpicc`, or `None` after recording why the test skips.
fn mpi() -> Option<(PathBuf, PathBuf)> {
    match (on_path("mpirun"), on_path("mpicc")) {
        (Some(mpirun), Some(mpicc)) => Some((mpirun, mpicc)),
        _ => {
            urom_testkit::skip(
                "no mpirun or mpicc on PATH (apt-get install openmpi-bin libopenmpi-dev)",
            );
            None
        }
    }
}

/// `liburom_mpi.so`, beside `liburom_coll.so`.
fn library() -> PathBuf {
    cdylib("urom-capi-coll", "urom_coll");
    cdylib("urom-capi-mpi", "urom_mpi")
}

/// The test program, compiled with `mpicc` (warnings as errors), once per test process.
fn program(mpicc: &Path) -> PathBuf {
    static PROGRAM: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PROGRAM.get_or_init(|| compile(mpicc)).clone()
}

fn compile(mpicc: &Path) -> PathBuf {
    let source = workspace_root().join("urom-capi/mpi/tests/c/mpi_colls.c");
    let dir = profile_dir().join("c-objects");
    std::fs::create_dir_all(&dir).expect("creating the C object directory");
    let out = dir.join("mpi-colls");
    let partial = dir.join(format!("mpi-colls.{}.partial", std::process::id()));
    let status = Command::new(mpicc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O2", "-o"])
        .arg(&partial)
        .arg(&source)
        .status()
        .expect("running mpicc");
    assert!(status.success(), "compiling {} failed", source.display());
    std::fs::rename(&partial, &out).expect("moving the program into place");
    out
}

fn daemon() -> (TempDir, Daemon) {
    let plugins = TempDir::new("urom-mpi-plugins");
    let dir = plugin_dir(&plugins, &[("urom-plugin-coll", "worker_coll")]);
    let daemon = start_daemon(
        binary("urom-daemon", "urom-daemon"),
        dir.to_str().expect("a UTF-8 path"),
        &[],
        true,
    );
    (plugins, daemon)
}

/// How a run is set up.
struct Run<'a> {
    ranks: u32,
    mode: &'a str,
    preload: bool,
    env: Vec<(&'a str, String)>,
}

/// Runs the program under `mpirun`; a safety net ends it if it hangs (not a time bound).
fn mpirun(mpirun: &Path, program: &Path, run: &Run<'_>) -> Output {
    // Each mpirun its own session directory: Open MPI 4.1's creation of the shared one races
    // between mpiruns started at once ("mkdir ... File exists").
    let session = TempDir::new("urom-mpi-session");
    let mut command = Command::new(mpirun);
    command
        .env("TMPDIR", session.path())
        .args(["--allow-run-as-root", "--oversubscribe", "-np"])
        .arg(run.ranks.to_string())
        .args(["--mca", "pml", "ob1", "--mca", "btl", "self,vader"]);
    let mut env = run.env.clone();
    env.push(("UROM_MPI_VERBOSE", "1".to_owned()));
    if run.preload {
        env.push(("LD_PRELOAD", library().display().to_string()));
    }
    for (name, value) in &env {
        command.arg("-x").arg(format!("{name}={value}"));
    }
    let mut child = command
        .arg(program)
        .arg(run.mode)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting mpirun");
    let deadline = Instant::now() + Duration::from_secs(900);
    while child.try_wait().expect("waiting for mpirun").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().expect("mpirun's output")
}

/// Asserts every rank finished `mode` and the verbose output says each of `lines`.
fn assert_ran(output: &Output, run: &Run<'_>, lines: &[&str], daemon: Option<&Daemon>) {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let ranks_ok = (0..run.ranks).all(|r| stdout.contains(&format!("rank {r}: {} ok", run.mode)));
    let missing: Vec<&&str> = lines.iter().filter(|l| !stderr.contains(**l)).collect();
    assert!(
        output.status.success() && ranks_ok && missing.is_empty(),
        "mpirun ({}), missing {missing:?}:\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n--- daemon\n{}",
        output.status,
        daemon.map(Daemon::log).unwrap_or_default()
    );
}

/// What the verbose output says when every collective was offloaded.
const OFFLOADED: &[&str] = &[
    "MPI_Init offload on",
    "MPI_Allreduce offloaded to urom",
    "MPI_Iallreduce offloaded to urom",
    "MPI_Reduce offloaded to urom",
    "MPI_Ireduce offloaded to urom",
    "MPI_Reduce_scatter_block offloaded to urom",
    "MPI_Ireduce_scatter_block offloaded to urom",
    "MPI_Bcast offloaded to urom",
    "MPI_Ibcast offloaded to urom",
    "MPI_Allgather offloaded to urom",
    "MPI_Iallgather offloaded to urom",
    "MPI_Allgatherv offloaded to urom",
    "MPI_Iallgatherv offloaded to urom",
    "MPI_Alltoall offloaded to urom",
    "MPI_Ialltoall offloaded to urom",
    "MPI_Alltoallv offloaded to urom",
    "MPI_Ialltoallv offloaded to urom",
    "MPI_Barrier offloaded to urom",
    "MPI_Ibarrier offloaded to urom",
    // The fallbacks, with their reasons.
    "MPI_Bcast passed to PMPI: a derived datatype with gaps",
    "MPI_Allreduce passed to PMPI: a user-defined or location operation",
    "MPI_Allreduce passed to PMPI: a datatype urom does not reduce in",
];

fn offloaded(ranks: u32) {
    let Some((launcher, mpicc)) = mpi() else {
        return;
    };
    let program = program(&mpicc);
    let (_plugins, daemon) = daemon();
    let run = Run {
        ranks,
        mode: "all",
        preload: true,
        env: vec![("UROM_SERVICE_SOCKET", daemon.socket.display().to_string())],
    };
    let output = mpirun(&launcher, &program, &run);
    assert_ran(&output, &run, OFFLOADED, Some(&daemon));
}

#[test]
fn every_collective_matches_pmpi_when_offloaded_on_two_ranks() {
    offloaded(2);
}

#[test]
fn every_collective_matches_pmpi_when_offloaded_on_three_ranks() {
    offloaded(3);
}

#[test]
fn every_collective_matches_pmpi_when_offloaded_on_four_ranks() {
    offloaded(4);
}

/// The same program without the library: the checks themselves hold against Open MPI alone.
#[test]
fn the_program_passes_without_the_library() {
    let Some((launcher, mpicc)) = mpi() else {
        return;
    };
    let program = program(&mpicc);
    let run = Run {
        ranks: 3,
        mode: "all",
        preload: false,
        env: Vec::new(),
    };
    let output = mpirun(&launcher, &program, &run);
    assert_ran(&output, &run, &[], None);
    assert!(
        !String::from_utf8_lossy(&output.stderr).contains("urom_mpi:"),
        "nothing of liburom_mpi without LD_PRELOAD"
    );
}

/// No service on the node: every collective goes to PMPI_*, with the same results.
#[test]
fn without_a_service_everything_falls_back_to_pmpi() {
    let Some((launcher, mpicc)) = mpi() else {
        return;
    };
    let program = program(&mpicc);
    let nowhere = TempDir::new("urom-mpi-nowhere");
    let run = Run {
        ranks: 2,
        mode: "all",
        preload: true,
        env: vec![(
            "UROM_SERVICE_SOCKET",
            nowhere.path().join("none.sock").display().to_string(),
        )],
    };
    let output = mpirun(&launcher, &program, &run);
    assert_ran(
        &output,
        &run,
        &[
            "MPI_Init offload off: no urom service on this node",
            "MPI_Allreduce passed to PMPI: no urom service on this node",
            "MPI_Ialltoall passed to PMPI: no urom service on this node",
        ],
        None,
    );
    assert!(!String::from_utf8_lossy(&output.stderr).contains("offloaded to urom"));
}

/// `UROM_MPI_OFFLOAD=0` turns the offload off, with a service running.
#[test]
fn offload_can_be_turned_off() {
    let Some((launcher, mpicc)) = mpi() else {
        return;
    };
    let program = program(&mpicc);
    let (_plugins, daemon) = daemon();
    let run = Run {
        ranks: 2,
        mode: "all",
        preload: true,
        env: vec![
            ("UROM_SERVICE_SOCKET", daemon.socket.display().to_string()),
            ("UROM_MPI_OFFLOAD", "0".to_owned()),
        ],
    };
    let output = mpirun(&launcher, &program, &run);
    assert_ran(
        &output,
        &run,
        &[
            "MPI_Init offload off: UROM_MPI_OFFLOAD=0",
            "MPI_Bcast passed to PMPI: UROM_MPI_OFFLOAD=0",
        ],
        Some(&daemon),
    );
    assert!(!String::from_utf8_lossy(&output.stderr).contains("offloaded to urom"));
}

/// The worker killed with SIGKILL during a 64 MiB `MPI_Iallreduce`: every rank's `MPI_Wait`
/// returns `MPI_ERR_OTHER` (the communicator's handler set to `MPI_ERRORS_RETURN`), no rank
/// hangs, and later collectives fall back to PMPI_*.
#[test]
fn a_worker_killed_during_a_collective_gives_an_mpi_error_and_later_ones_fall_back() {
    let Some((launcher, mpicc)) = mpi() else {
        return;
    };
    let program = program(&mpicc);
    let (_plugins, daemon) = daemon();
    let run = Run {
        ranks: 3,
        mode: "kill",
        preload: true,
        env: vec![
            ("UROM_SERVICE_SOCKET", daemon.socket.display().to_string()),
            ("UROM_TEST_DAEMON_PID", daemon.pid().to_string()),
        ],
    };
    let output = mpirun(&launcher, &program, &run);
    assert_ran(
        &output,
        &run,
        &[
            "MPI_Iallreduce offloaded to urom",
            "a collective failed: the node's worker failed before answering",
            "MPI_Allreduce passed to PMPI: the node's worker died",
        ],
        Some(&daemon),
    );
}

/// Runs `mode` offloaded on `ranks` ranks; the verbose output says each of `lines`.
fn offloaded_mode(ranks: u32, mode: &str, lines: &[&str]) {
    let Some((launcher, mpicc)) = mpi() else {
        return;
    };
    let program = program(&mpicc);
    let (_plugins, daemon) = daemon();
    let run = Run {
        ranks,
        mode,
        preload: true,
        env: vec![("UROM_SERVICE_SOCKET", daemon.socket.display().to_string())],
    };
    let output = mpirun(&launcher, &program, &run);
    assert_ran(&output, &run, lines, Some(&daemon));
}

/// What the verbose output says of the persistent collectives.
const PERSISTENT: &[&str] = &[
    "MPIX_Allreduce_init offloaded to urom: persistent: set up once",
    "MPIX_Alltoall_init offloaded to urom: persistent: set up once",
    "MPIX_Bcast_init offloaded to urom: persistent: set up once",
    "MPIX_Allgather_init offloaded to urom: persistent: set up once",
    "MPIX_Barrier_init offloaded to urom: persistent: set up once",
    "MPIX_Allreduce_init passed to PMPI: a user-defined or location operation",
    "MPI_Iallreduce offloaded to urom",
];

/// Persistent collectives started 1,000 times, through every completion call, mixed with
/// non-persistent and point-to-point requests, freed inactive and running.
#[test]
fn persistent_collectives_match_pmpi_on_two_ranks() {
    offloaded_mode(2, "persistent", PERSISTENT);
}

#[test]
fn persistent_collectives_match_pmpi_on_three_ranks() {
    offloaded_mode(3, "persistent", PERSISTENT);
}

/// The same checks hold against Open MPI's own persistent collectives.
#[test]
fn persistent_collectives_pass_without_the_library() {
    let Some((launcher, mpicc)) = mpi() else {
        return;
    };
    let program = program(&mpicc);
    let run = Run {
        ranks: 2,
        mode: "persistent",
        preload: false,
        env: Vec::new(),
    };
    let output = mpirun(&launcher, &program, &run);
    assert_ran(&output, &run, &[], None);
}

/// A repeated `MPI_Iallreduce` reuses the collective set up by its first call; a rank whose
/// buffers change rebinds alone; more in flight than the cache keeps per signature, and more
/// signatures than it keeps, still match PMPI.
#[test]
fn repeated_calls_reuse_their_set_up_collective() {
    offloaded_mode(
        3,
        "reuse",
        &[
            "MPI_Iallreduce reuses: a collective set up on the worker by an earlier call",
            "MPI_Iallreduce reuses: a collective set up on the worker, this rank's buffers rebound",
            "MPI_Allreduce offloaded to urom",
        ],
    );
}

/// With `UROM_MPI_CACHE_DEPTH=0` every call sets its collective up again, with the same
/// results.
#[test]
fn reuse_can_be_turned_off() {
    let Some((launcher, mpicc)) = mpi() else {
        return;
    };
    let program = program(&mpicc);
    let (_plugins, daemon) = daemon();
    let run = Run {
        ranks: 2,
        mode: "reuse",
        preload: true,
        env: vec![
            ("UROM_SERVICE_SOCKET", daemon.socket.display().to_string()),
            ("UROM_MPI_CACHE_DEPTH", "0".to_owned()),
        ],
    };
    let output = mpirun(&launcher, &program, &run);
    assert_ran(
        &output,
        &run,
        &["MPI_Iallreduce offloaded to urom"],
        Some(&daemon),
    );
    assert!(!String::from_utf8_lossy(&output.stderr).contains("reuses"));
}
