//! Connections to a real daemon: users it does not serve are turned away at once, connections
//! that say nothing are closed after the hello timeout, and many idle connections keep no other
//! host out. Tests that need a second user run a peer as `nobody`, which only root may do;
//! without root they say so and skip.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use common::*;
use urom_testkit::control::ControlClient;
use urom_testkit::daemon::{plugin_dir, start_daemon_command, with_open_file_limit};
use urom_testkit::{NOBODY, TempDir, as_nobody, binary};

#[test]
fn without_other_users_allowed_only_the_daemons_user_can_connect() {
    let (_plugins, daemon) = graph_daemon(&[]);
    let mode = daemon.socket.metadata().unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    assert_eq!(client(&daemon).plugins().len(), 1);
}

#[test]
fn a_user_the_daemon_does_not_serve_is_turned_away_at_once() {
    if !is_root() {
        urom_testkit::skip("running a peer as another user needs root");
        return;
    }
    // With another user allowed, every local user can connect; nobody is not that user.
    let (_plugins, daemon) = graph_daemon(&["--allow-uid", "4242"]);
    let peer = Peer::start(&[&daemon.socket]);
    let refused = peer.line();
    assert_eq!(
        refused,
        "refused DOCA_ERROR_AUTHENTICATION: user 65534 may not use this service"
    );
    // Connections that say nothing are closed at once too, with the same answer.
    let peer = Peer::start(&[&"--silent", &"20", &daemon.socket]);
    assert_eq!(peer.line(), "connected 20");
    assert_eq!(peer.finish(), ["20 refused DOCA_ERROR_AUTHENTICATION"]);
    assert_eq!(client(&daemon).plugins().len(), 1);
    // The host library reports the daemon's reason.
    let output = as_nobody(
        Command::new(binary("urom-samples", "urom-bootstrap"))
            .args(["--once", "--socket"])
            .arg(&daemon.socket),
    )
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("user 65534 may not use this service"),
        "{stderr}"
    );
}

#[test]
fn a_connection_that_says_nothing_is_closed_after_the_hello_timeout() {
    let (_plugins, daemon) = graph_daemon(&[]);
    let mut silent = ControlClient::connect(&daemon.socket, TIMEOUT).unwrap();
    let mut half = ControlClient::connect(&daemon.socket, TIMEOUT).unwrap();
    half.send_raw(b"UROM").unwrap();
    // Other hosts are served meanwhile.
    assert_eq!(client(&daemon).plugins().len(), 1);
    for idle in [&mut silent, &mut half] {
        assert_timed_out(idle, "no hello");
    }
}

#[test]
fn many_idle_connections_leave_room_for_other_hosts() {
    if !is_root() {
        urom_testkit::skip("running a peer as another user needs root");
        return;
    }
    // Few open files, so that the idle connections would take them all.
    let plugins = TempDir::new("urom-security-plugins");
    let dir = plugin_dir(&plugins, &[("urom-plugin-graph", "worker_graph")]);
    let daemon = start_daemon_command(
        with_open_file_limit(&daemon_bin(), 256),
        dir.to_str().unwrap(),
        &["--allow-uid", &NOBODY.to_string()],
        true,
    );
    let peer = Peer::start(&[&"--silent", &"200", &daemon.socket]);
    assert_eq!(peer.line(), "connected 200");
    // While nobody holds them, root is served.
    let mut host = client(&daemon);
    assert_eq!(host.plugins().len(), 1);
    let ends = peer.finish();
    // Those beyond the bounds were refused; the others were closed when their time was up.
    assert!(
        ends.iter()
            .any(|end| end.ends_with("refused DOCA_ERROR_FULL")),
        "{ends:?}"
    );
    assert!(!ends.iter().any(|end| end.ends_with("open")), "{ends:?}");
    assert_eq!(host.plugins().len(), 1);
}
