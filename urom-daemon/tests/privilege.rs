//! Workers run with no more rights than the host that asked for them, against a real daemon:
//! another user's worker runs as that user, environment entries that change how programs load
//! are refused, and a worker's socket is out of other users' reach. Tests that need a second
//! user run a peer as `nobody`, which only root may do; without root they say so and skip.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use urom_testkit::NOBODY;
use urom_testkit::process::status_values;
use urom_wire::Status;

#[test]
fn a_root_daemon_runs_another_users_worker_as_that_user() {
    if !is_root() {
        urom_testkit::skip("running a host as another user needs root");
        return;
    }
    let (_plugins, daemon) = graph_daemon(&["--allow-uid", &NOBODY.to_string()]);
    let peer = Peer::start(&[&"--spawn", &daemon.socket]);
    assert_eq!(peer.line(), "accepted");
    let spawned = peer.line();
    let socket = spawned
        .strip_prefix("spawned ")
        .and_then(|rest| rest.split_once(' '))
        .map(|(_, socket)| socket.to_owned())
        .unwrap_or_else(|| panic!("{spawned}\ndaemon log:\n{}", daemon.log()));
    let pid = pid_of(&socket);

    let nobody = vec![NOBODY.to_string(); 4];
    assert_eq!(
        status_values(pid, "Uid"),
        nobody,
        "real, effective, saved, fs"
    );
    assert_eq!(status_values(pid, "Gid"), nobody);
    let name = std::ffi::CString::new("nobody").unwrap();
    let mut expected: Vec<String> =
        nix::unistd::getgrouplist(&name, nix::unistd::Gid::from_raw(NOBODY))
            .unwrap()
            .iter()
            .map(|gid| gid.as_raw().to_string())
            .collect();
    expected.sort();
    let mut groups = status_values(pid, "Groups");
    groups.sort();
    assert_eq!(groups, expected, "the user's own groups, not the daemon's");
    for capabilities in ["CapPrm", "CapEff", "CapAmb"] {
        assert_eq!(
            status_values(pid, capabilities),
            ["0000000000000000"],
            "{capabilities}"
        );
    }

    // Its socket sits in a directory only that user may enter.
    let dir = Path::new(&socket).parent().unwrap().metadata().unwrap();
    assert_eq!(dir.uid(), NOBODY);
    assert_eq!(dir.permissions().mode() & 0o777, 0o700);
    // It still logs, to the file the daemon opened for it.
    let log = daemon.dir.path().join(format!("urom_worker_{pid}_dev.log"));
    let deadline = Instant::now() + TIMEOUT;
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("urom worker starting")
    {
        assert!(
            Instant::now() < deadline,
            "{} never said it started",
            log.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    peer.finish();

    // The same user may not preload its own library into a worker.
    let peer = Peer::start(&[&"--spawn", &daemon.socket, &"LD_PRELOAD=/tmp/evil.so"]);
    assert_eq!(peer.line(), "accepted");
    let refused = peer.line();
    assert!(
        refused.starts_with("refused DOCA_ERROR_NOT_PERMITTED") && refused.contains("LD_PRELOAD"),
        "{refused}"
    );
}

#[test]
fn environment_entries_that_change_how_programs_load_are_refused() {
    let (_plugins, daemon) = graph_daemon(&[]);
    let mut host = client(&daemon);
    for env in [
        &["LD_PRELOAD=/tmp/evil.so"][..],
        &["UROM_TEST=1", "LD_LIBRARY_PATH=/tmp"],
        &["LD_AUDIT=/tmp/audit.so"],
        &["GCONV_PATH=/tmp"],
        &["GLIBC_TUNABLES=glibc.malloc.check=3"],
        &["MALLOC_ARENA_MAX=1"],
        &["TMPDIR=/tmp/elsewhere"],
    ] {
        let name = env.last().unwrap().split_once('=').unwrap().0;
        let (status, reason) = host.spawn_any(env).unwrap_err();
        assert_eq!(status, Status::NotPermitted, "{reason}");
        assert!(reason.contains(name), "{reason}");
    }
    assert!(host.by_gid(0).is_empty(), "a refused worker was started");
    // Other entries are passed on.
    host.spawn_any(&["UROM_TEST=1", "PATH=/usr/bin:/bin"])
        .unwrap();
}

#[test]
fn another_users_worker_socket_is_out_of_reach() {
    if !is_root() {
        urom_testkit::skip("running a peer as another user needs root");
        return;
    }
    let (_plugins, daemon) = graph_daemon(&["--allow-uid", &NOBODY.to_string()]);
    let mut host = client(&daemon);
    let (_, socket) = host.spawn_any(&[]).unwrap();
    // nobody may use the service, but not root's worker.
    let peer = Peer::start(&[&"--worker", &socket]);
    let answer = peer.line();
    assert!(
        answer.starts_with("cannot connect") || answer == "closed",
        "nobody reached root's worker: {answer}"
    );
    let dir = socket.parent().unwrap().metadata().unwrap();
    assert_eq!((dir.uid(), dir.permissions().mode() & 0o777), (0, 0o700));
}
