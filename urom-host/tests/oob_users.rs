//! A rendezvous over a Unix socket keeps to one user: rank 0 drops another user's join, and a
//! joining rank refuses a rank 0 that runs as another user. The other user is `nobody`, which
//! only root may run a process as; without root the tests say so and skip.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use urom_host::oob::{RendezvousAddr, SocketOob};
use urom_testkit::{NOBODY, TempDir, as_nobody};

/// Set in a child rank's environment: `RANK PATH`.
const CHILD_ENV: &str = "UROM_OOB_USERS_CHILD";

/// How long a rank waits for the others; the refusals under test come sooner.
const JOIN_TIMEOUT: Duration = Duration::from_secs(20);

/// Not a test of its own: a rank of two run as another process (as `nobody`) by the tests
/// below, with [`CHILD_ENV`] set. Prints `joined` or `failed: <why>`.
#[test]
fn child_rank() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (rank, path) = spec.split_once(' ').expect("RANK PATH");
    let address = RendezvousAddr::Unix(PathBuf::from(path));
    match SocketOob::join(&address, 2, rank.parse().unwrap(), JOIN_TIMEOUT) {
        Ok(_) => println!("joined"),
        Err(e) => println!("failed: {e}"),
    }
}

/// This test binary as rank `rank` of two at `path`, run as `nobody`.
fn child_as_nobody(rank: u32, path: &Path) -> Child {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["--exact", "child_rank", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, format!("{rank} {}", path.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    as_nobody(&mut command)
        .spawn()
        .expect("starting a rank as nobody")
}

/// A directory `nobody` may create sockets in, and the rendezvous path in it; `None` (after
/// saying why) when this process may not run another user's process.
fn setup() -> Option<(TempDir, PathBuf)> {
    if !nix::unistd::geteuid().is_root() {
        urom_testkit::skip("running a rank as another user needs root");
        return None;
    }
    let dir = TempDir::new("urom-oob-users");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let path = dir.path().join("rendezvous.sock");
    Some((dir, path))
}

/// Waits until the socket at `path` exists.
fn wait_for_socket(path: &Path) {
    let deadline = Instant::now() + JOIN_TIMEOUT;
    while !path.exists() {
        assert!(Instant::now() < deadline, "rank 0 did not listen");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn another_users_process_cannot_join() {
    let Some((_dir, path)) = setup() else {
        return;
    };
    let address = RendezvousAddr::Unix(path.clone());
    let rank0 = std::thread::spawn(move || {
        SocketOob::join(&address, 2, 0, Duration::from_secs(3)).map(|_| ())
    });
    wait_for_socket(&path);
    // Let `nobody` connect: only the rendezvous itself may turn it away.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut intruder = child_as_nobody(1, &path);
    let joined = rank0.join().unwrap();
    let _ = intruder.kill();
    let _ = intruder.wait();
    let error = joined.expect_err("rank 0 took a join from another user");
    assert!(
        error.to_string().contains("rank 1: did not join"),
        "{error}"
    );
}

#[test]
fn a_rank_0_of_another_user_is_refused() {
    let Some((_dir, path)) = setup() else {
        return;
    };
    let mut impostor = child_as_nobody(0, &path);
    wait_for_socket(&path);
    let joined = SocketOob::join(&RendezvousAddr::Unix(path), 2, 1, JOIN_TIMEOUT);
    let _ = impostor.kill();
    let _ = impostor.wait();
    let error = joined.expect_err("joined a rank 0 of another user");
    assert!(
        error
            .to_string()
            .contains(&format!("runs as user {NOBODY}, not as this rank's user 0")),
        "{error}"
    );
}
