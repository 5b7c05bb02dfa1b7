//! A worker's front door (`--listen-ucx`) under peers that never prove its key: they cost the
//! worker no thread and hold up no host that does.
#![cfg(feature = "ucx")]

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use urom_testkit::TempDir;
use urom_testkit::daemon::write_key;
use urom_transport::auth::{self, SharedSecret};
use urom_transport::{Channel, ChannelConfig, stream};
use urom_wire::control::{ControlMessage, SecretProof};
use urom_wire::{FrameRepr, MaxMsgSize, Status};

/// Peers at the door that never prove the key.
const PEERS: usize = 64;
/// How long the worker may keep such a peer before the test calls it left open: the door's
/// deadline (10 s) with room to spare. A bound on waiting, not on speed.
const CLOSED_WITHIN: Duration = Duration::from_secs(30);

/// A host that proves `key` at `door` and connects to the worker over UCX.
fn remote_host(door: SocketAddr, key: &SharedSecret) -> Channel {
    let config = ChannelConfig::new(MaxMsgSize::DEFAULT);
    let mut halves = stream::connect_tcp(door, TIMEOUT).expect("reaching the front door");
    auth::prove(
        &mut halves,
        config.max_msg_size,
        key,
        &auth::worker_identity(0),
        config.handshake_timeout,
    )
    .expect("the worker lets a host with its key in");
    Channel::connect_through(&mut halves, &config).expect("connecting over UCX")
}

/// Runs one loopback task on `host` and checks its answer.
fn run_task(host: &mut Channel, seq: u64) {
    send_command(host, seq, GRAPH_ID, seq, &loopback(seq));
    let (plugin, context, status, _) = next_notification(host);
    assert_eq!((plugin, context, status), (GRAPH_ID, seq, Status::Success));
}

/// Reads what the worker sends `peer` until it has sent `want` bytes, or closed the
/// connection, or `within` passed; returns the bytes.
fn read_some(peer: &mut TcpStream, want: usize, within: Duration) -> (Vec<u8>, bool) {
    let deadline = Instant::now() + within;
    let mut got = Vec::new();
    let mut buf = [0; 512];
    while got.len() < want || want == 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return (got, false);
        }
        peer.set_read_timeout(Some(left)).unwrap();
        match peer.read(&mut buf) {
            Ok(0) => return (got, true),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return (got, true),
        }
    }
    (got, false)
}

#[test]
fn peers_that_never_prove_the_key_cost_no_thread_and_hold_up_no_host() {
    let ucx_env = [
        ("UCX_TLS", Path::new("tcp")),
        ("UCX_NET_DEVICES", Path::new("lo")),
        ("UCX_WARN_UNUSED_ENV_VARS", Path::new("n")),
    ];
    urom_transport::ucx::set_config_defaults(&[("TLS", "tcp"), ("NET_DEVICES", "lo")]);
    assert!(
        urom_testkit::process::raise_open_file_limit(PEERS as u64 + 256),
        "the test cannot hold {PEERS} connections open (RLIMIT_NOFILE)"
    );
    let dir = TempDir::new("urom-worker-front-door");
    let secret = auth::fresh_nonce().unwrap();
    let key_file = write_key(dir.path(), "key", &secret);
    let address_file = dir.path().join("door");
    let mut worker = start_worker_with_env(
        &graph_and_faulty(),
        &[
            "--listen-ucx",
            "127.0.0.1:0",
            "--ucx-key-file",
            key_file.to_str().unwrap(),
            "--ucx-address-file",
            address_file.to_str().unwrap(),
        ],
        &ucx_env,
    );
    let pid = worker.child.0.id();
    let deadline = Instant::now() + TIMEOUT;
    let door: SocketAddr = loop {
        if let Some(door) = std::fs::read_to_string(&address_file)
            .ok()
            .and_then(|text| text.parse().ok())
        {
            break door;
        }
        assert!(
            Instant::now() < deadline,
            "the worker never opened its door"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let key = SharedSecret::from_bytes(&secret);

    // A first host, so that what a connected host costs (UCX's own threads included) is in
    // the count the test compares with; it stays, so that no connection closes meanwhile.
    let mut first = remote_host(door, &key);
    run_task(&mut first, 1);
    let with_one_host = urom_testkit::process::threads(pid as i32);

    // Peers that connect and read the challenge, then say nothing or half a proof.
    let half_proof = {
        let frame = FrameRepr {
            seq: 2,
            body: ControlMessage::SecretProof(SecretProof {
                nonce: [7; 32],
                proof: [0; 32],
            }),
        };
        let mut bytes = vec![0; frame.buffer_len()];
        let len = frame.emit(&mut bytes, MaxMsgSize::DEFAULT).unwrap();
        bytes.truncate(len / 2);
        bytes
    };
    let mut peers: Vec<TcpStream> = (0..PEERS)
        .map(|_| TcpStream::connect(door).expect("connecting a peer"))
        .collect();
    let mut challenged = 0;
    for (i, peer) in peers.iter_mut().enumerate() {
        let (challenge, closed) = read_some(peer, 1, TIMEOUT);
        if !challenge.is_empty() && !closed {
            challenged += 1;
        }
        if i % 2 == 1 {
            let _ = peer.write_all(&half_proof);
        }
    }
    let during = urom_testkit::process::threads(pid as i32);
    println!(
        "{challenged} of {PEERS} peers challenged; worker threads: {with_one_host} with a host, \
         {during} with the peers at the door"
    );
    assert_eq!(
        challenged, PEERS,
        "every peer is challenged, none turned away"
    );

    // While they are all at the door, a host with the key gets in and gets its answer.
    let started = Instant::now();
    let mut host = remote_host(door, &key);
    run_task(&mut host, 2);
    let with_peers_and_a_host = urom_testkit::process::threads(pid as i32);
    println!(
        "a host ran a task in {:.1?} with {PEERS} peers at the door; worker threads: \
         {with_peers_and_a_host}",
        started.elapsed()
    );
    assert!(
        with_peers_and_a_host <= with_one_host,
        "the worker's threads grew from {with_one_host} to {with_peers_and_a_host} with \
         {PEERS} peers at its door"
    );

    // A host with another key is told why it is refused.
    let mut halves = stream::connect_tcp(door, TIMEOUT).expect("reaching the front door");
    let wrong = SharedSecret::from_bytes(&auth::fresh_nonce().unwrap());
    let refused = auth::prove(
        &mut halves,
        MaxMsgSize::DEFAULT,
        &wrong,
        &auth::worker_identity(0),
        TIMEOUT,
    )
    .unwrap_err();
    assert!(
        matches!(&refused, auth::HandshakeError::Refused(why) if why.contains("not sent by its daemon")),
        "{refused}"
    );

    // Each peer is closed by the door's deadline; the worker lives on and serves its host.
    for (i, peer) in peers.iter_mut().enumerate() {
        let (_, closed) = read_some(peer, 0, CLOSED_WITHIN);
        assert!(closed, "peer {i} left open after {CLOSED_WITHIN:?}");
    }
    run_task(&mut host, 3);
    run_task(&mut first, 4);
    assert!(
        worker
            .child
            .0
            .try_wait()
            .is_ok_and(|status| status.is_none()),
        "the worker lives"
    );
    drop((host, first));
}
