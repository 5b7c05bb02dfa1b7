//! The UCX transport's own behaviour, beyond the conformance suite: how setup fails (an
//! unreachable or silent listener, a maximum-message-size mismatch), frames on the eager and
//! rendezvous paths, connecting by worker address, a peer process that is killed, sleeping on
//! a receiving half's wake descriptors, no allocation per frame, and hundreds of connections
//! opened and closed at once.
//!
//! Every test stays on TCP over the loopback interface unless `UCX_TLS` / `UCX_NET_DEVICES`
//! say otherwise.
#![cfg(feature = "ucx")]

use std::net::{SocketAddr, TcpListener};
use std::os::fd::BorrowedFd;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use urom_testkit::counting::{Counting, allocations_in};
use urom_transport::ucx::{self, UcxConnectError, UcxConnection, UcxListener};
use urom_transport::{
    Armed, Channel, ChannelConfig, FrameReceiver, FrameRecvError, FrameSendError, FrameSender,
    HalfControl, PeerGoneError, Transport, WaitMode,
};
use urom_wire::MaxMsgSize;

/// Generous bound for anything that should happen promptly (CI machines can be slow).
const TIMEOUT: Duration = Duration::from_secs(60);

/// The environment variable that makes [`child_peer_for_the_killed_peer_test`] a peer.
const PEER_ENV: &str = "UROM_UCX_TEST_PEER";

/// Set in a child process that runs one test alone ([`in_a_process_of_its_own`]).
const ALONE_ENV: &str = "UROM_UCX_TEST_ALONE";

/// Whether this is the process of its own that `test` runs in; if not, runs it there (this
/// test binary, with only `test`) and checks that it passed. For tests that watch what their
/// own thread's progress of the process's shared UCX worker does (allocations, counted per
/// thread; a frame left in the socket) or that its descriptor stays quiet: another test's
/// connection on that worker, or an end of one lingering, would disturb them.
fn in_a_process_of_its_own(test: &str) -> bool {
    if std::env::var_os(ALONE_ENV).is_some() {
        return true;
    }
    let status = Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--test-threads=1", "--nocapture"])
        .env(ALONE_ENV, "1")
        .status()
        .unwrap();
    assert!(status.success(), "{test}, alone in a process: {status}");
    false
}

fn setup() {
    // Frames from 16 KiB take the rendezvous path on every UCX version (1.22's protocols would
    // send a 200 KB frame over tcp eagerly), so that the tests cover both receive paths.
    ucx::set_config_defaults(&[
        ("TLS", "tcp"),
        ("NET_DEVICES", "lo"),
        ("RNDV_THRESH", "16384"),
    ]);
}

fn config(max: u32, slots: u32) -> ChannelConfig {
    ChannelConfig {
        max_msg_size: MaxMsgSize::new(max).unwrap(),
        slots,
        handshake_timeout: TIMEOUT,
        ..ChannelConfig::default()
    }
}

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

fn pair(config: &ChannelConfig) -> (UcxConnection, UcxConnection) {
    setup();
    UcxConnection::pair(config).unwrap_or_else(|e| panic!("UCX pair: {e}"))
}

/// The bytes of frame `seq` of `len` bytes: its number, then a pattern that differs per frame.
fn fill(seq: u64, len: usize, buf: &mut [u8]) -> &[u8] {
    let frame = &mut buf[..len];
    for (i, byte) in frame.iter_mut().enumerate() {
        *byte = (seq as usize * 31 + i * 7) as u8;
    }
    let n = len.min(8);
    frame[..n].copy_from_slice(&seq.to_le_bytes()[..n]);
    frame
}

fn check(seq: u64, len: usize, got: &[u8], scratch: &mut [u8]) {
    assert_eq!(got.len(), len, "frame {seq} arrived with the wrong length");
    assert!(
        got == fill(seq, len, scratch),
        "frame {seq} ({len} bytes) arrived corrupted or out of order"
    );
}

/// Sends `frame`, waiting while every slot is taken.
fn send_all(tx: &mut impl FrameSender, frame: &[u8]) {
    loop {
        match tx.send(frame) {
            Ok(()) => return,
            Err(FrameSendError::Full) => assert!(tx.wait_send(TIMEOUT).unwrap(), "no credits"),
            Err(e) => panic!("send: {e}"),
        }
    }
}

/// Waits for and returns the next frame.
fn next(rx: &mut impl FrameReceiver) -> &[u8] {
    assert!(rx.wait_recv(TIMEOUT).unwrap(), "no frame arrived");
    rx.recv().unwrap().expect("a frame after wait_recv")
}

#[test]
fn a_listener_that_is_not_there_is_refused_at_once() {
    setup();
    // A port nobody listens on: bound, then given back.
    let port = TcpListener::bind(loopback())
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    // The handshake timeout is long: an error of the kind `Unreachable` (and not the
    // handshake's timeout) shows that the refusal was noticed, not waited out.
    let err = UcxConnection::connect(addr, &config(4096, 8))
        .err()
        .expect("connected to a port nobody listens on");
    assert!(
        matches!(&err, UcxConnectError::Unreachable { address, .. } if *address == addr.to_string()),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains(&addr.to_string()) && text.contains("UCX_TLS"),
        "{text}"
    );
}

#[test]
fn a_listener_that_never_answers_fails_after_the_handshake_timeout() {
    setup();
    let short = ChannelConfig {
        handshake_timeout: Duration::from_millis(500),
        ..config(4096, 8)
    };
    // A TCP listener that accepts and never speaks, and a UCX listener nobody accepts on.
    let silent = TcpListener::bind(loopback()).unwrap();
    let unattended = UcxListener::bind(loopback(), &short).unwrap();
    for addr in [silent.local_addr().unwrap(), unattended.local_addr()] {
        let start = Instant::now();
        let err = UcxConnection::connect(addr, &short)
            .err()
            .expect("connected to a listener that never answers");
        assert!(
            start.elapsed() >= short.handshake_timeout,
            "gave up early: {err}"
        );
        assert_eq!(
            err,
            UcxConnectError::Handshake("the listener did not answer in time"),
            "{addr}"
        );
    }
}

#[test]
fn a_maximum_message_size_mismatch_is_refused_on_both_sides() {
    setup();
    let ours = config(4096, 8);
    let theirs = config(8192, 8);
    let mut listener = UcxListener::bind(loopback(), &ours).unwrap();
    let addr = listener.local_addr();
    let client = std::thread::spawn(move || UcxConnection::connect(addr, &theirs).err());
    let server = listener.accept(TIMEOUT).err().expect("accepted a mismatch");
    let client = client
        .join()
        .unwrap()
        .expect("connected despite the mismatch");
    assert_eq!(
        server,
        UcxConnectError::MaxMsgSizeMismatch {
            ours: 4096,
            theirs: 8192
        }
    );
    assert_eq!(
        client,
        UcxConnectError::MaxMsgSizeMismatch {
            ours: 8192,
            theirs: 4096
        }
    );
    for err in [&server, &client] {
        let text = err.to_string();
        assert!(
            text.contains("maximum message size mismatch")
                && text.contains("4096")
                && text.contains("8192"),
            "{text}"
        );
    }

    // The listener goes on accepting peers that agree.
    let client = std::thread::spawn(move || UcxConnection::connect(addr, &ours));
    let mut server = listener.accept(TIMEOUT).unwrap().expect("no connection");
    let mut client = client.join().unwrap().unwrap();
    client.send(b"agreed").unwrap();
    assert_eq!(next(server.split().1), b"agreed");
}

/// Sends frames `0..FRAMES` of `len(seq)` bytes on `tx`, then keeps the end progressing (as
/// every user of a connection does: UCX moves a large frame as the receiver pulls it) until
/// the peer says it has them all.
fn send_frames<T: Transport>(end: &mut T, frames: u64, len: fn(u64) -> usize, max: usize) {
    let mut buf = vec![0u8; max];
    for seq in 0..frames {
        send_all(end.split().0, fill(seq, len(seq), &mut buf));
    }
    assert_eq!(next(end.split().1), b"all there");
}

/// Receives frames `0..FRAMES` on `rx` and checks each, then tells the peer.
fn receive_frames<T: Transport>(end: &mut T, frames: u64, len: fn(u64) -> usize, max: usize) {
    let mut scratch = vec![0u8; max];
    for seq in 0..frames {
        let got = next(end.split().1);
        check(seq, len(seq), got, &mut scratch);
    }
    assert_eq!(end.recv().unwrap(), None);
    send_all(end.split().0, b"all there");
}

#[test]
fn frames_of_the_maximum_size_and_of_one_byte_arrive_intact_and_in_order() {
    const MAX: usize = 1 << 20;
    const FRAMES: u64 = 240;
    fn len(seq: u64) -> usize {
        match seq % 3 {
            0 => MAX,
            1 => 1,
            _ => MAX - 1 - (seq as usize * 4099) % (MAX - 2),
        }
    }
    // Four slots: the rings wrap sixty times.
    let config = config(MAX as u32, 4);
    let (mut a, mut b) = pair(&config);
    let sender = std::thread::spawn(move || {
        send_frames(&mut a, FRAMES, len, MAX);
        a
    });
    receive_frames(&mut b, FRAMES, len, MAX);
    let mut a = sender.join().unwrap();
    // Large frames took the rendezvous path, small ones went eagerly.
    let rendezvous = b.rendezvous_frames();
    assert!(
        (FRAMES / 3..FRAMES).contains(&rendezvous),
        "{rendezvous} of {FRAMES} frames took the rendezvous path"
    );

    // And the other way.
    let receiver = std::thread::spawn(move || {
        receive_frames(&mut a, FRAMES, len, MAX);
        a
    });
    send_frames(&mut b, FRAMES, len, MAX);
    let a = receiver.join().unwrap();
    assert!(a.rendezvous_frames() >= FRAMES / 3);
}

/// `recv_arrived` hands out the frames that have already arrived and does not progress the
/// worker for more (that call into the network stack is what it spares): a frame still in the
/// socket waits for the next `recv`.
#[test]
fn recv_arrived_takes_what_arrived_without_looking_for_more() {
    if !in_a_process_of_its_own("recv_arrived_takes_what_arrived_without_looking_for_more") {
        return;
    }
    let (mut a, mut b) = pair(&config(256, 8));
    let mut buf = [0u8; 256];
    let mut scratch = [0u8; 256];
    for seq in 0..3 {
        send_all(a.split().0, fill(seq, 64, &mut buf));
    }
    // Once the frames are in b's socket, waiting progresses b's worker until nothing more
    // comes: all three arrive in their slots.
    std::thread::sleep(Duration::from_millis(200));
    assert!(b.wait_recv(TIMEOUT).unwrap());
    let rx = b.split().1;
    check(0, 64, rx.recv().unwrap().expect("frame 0"), &mut scratch);
    check(
        1,
        64,
        rx.recv_arrived().unwrap().expect("frame 1"),
        &mut scratch,
    );
    check(
        2,
        64,
        rx.recv_arrived().unwrap().expect("frame 2"),
        &mut scratch,
    );
    assert_eq!(rx.recv_arrived().unwrap(), None);

    // A frame that reached the socket since is left there by `recv_arrived`, and `recv` takes
    // it.
    send_all(a.split().0, fill(3, 64, &mut buf));
    std::thread::sleep(Duration::from_millis(200));
    let rx = b.split().1;
    assert_eq!(rx.recv_arrived().unwrap(), None);
    let deadline = Instant::now() + TIMEOUT;
    let frame = loop {
        if let Some(frame) = rx.recv().unwrap() {
            break frame;
        }
        assert!(Instant::now() < deadline, "frame 3 never arrived");
    };
    check(3, 64, frame, &mut scratch);
}

#[test]
fn connecting_by_worker_address_works() {
    setup();
    let config = config(4096, 8);
    let mut listener = UcxListener::bind(loopback(), &config).unwrap();
    let address = listener.worker_address().to_vec();
    assert!(!address.is_empty());
    let client = std::thread::spawn(move || UcxConnection::connect_worker(&address, &config));
    let mut server = listener.accept(TIMEOUT).unwrap().expect("no connection");
    let mut client = client.join().unwrap().unwrap();
    let mut buf = [0u8; 4096];
    let mut scratch = [0u8; 4096];
    for seq in 0..100 {
        let len = 1 + (seq as usize * 41) % 4096;
        send_all(client.split().0, fill(seq, len, &mut buf));
        check(seq, len, next(server.split().1), &mut scratch);
        send_all(server.split().0, fill(seq, len, &mut buf));
        check(seq, len, next(client.split().1), &mut scratch);
    }

    // The same through a channel, which takes bytes that are not `IP:PORT` for a worker
    // address.
    let address = listener.worker_address().to_vec();
    let client = std::thread::spawn(move || {
        Channel::connect(
            urom_wire::control::EndpointKind::Ucx,
            &address,
            &ChannelConfig {
                max_msg_size: MaxMsgSize::new(4096).unwrap(),
                slots: 8,
                ..ChannelConfig::default()
            },
        )
    });
    let mut server = listener.accept(TIMEOUT).unwrap().expect("no connection");
    let mut client = client.join().unwrap().unwrap();
    client.send(b"by address").unwrap();
    assert_eq!(next(server.split().1), b"by address");

    // Another maximum message size is refused on this path too.
    let address = listener.worker_address().to_vec();
    let client = std::thread::spawn(move || {
        UcxConnection::connect_worker(&address, &self::config(8192, 8)).err()
    });
    let server = listener.accept(TIMEOUT).err();
    assert_eq!(
        client.join().unwrap(),
        Some(UcxConnectError::MaxMsgSizeMismatch {
            ours: 8192,
            theirs: 4096
        })
    );
    assert_eq!(
        server,
        Some(UcxConnectError::MaxMsgSizeMismatch {
            ours: 4096,
            theirs: 8192
        })
    );
}

/// One frame each way on a fresh connection.
fn greet(a: &mut UcxConnection, b: &mut UcxConnection, n: u64) {
    let hello = n.to_le_bytes();
    send_all(a.split().0, &hello);
    assert_eq!(next(b.split().1), hello);
    send_all(b.split().0, &hello);
    assert_eq!(next(a.split().1), hello);
}

#[test]
fn many_connections_in_a_row_and_at_once_all_come_up() {
    setup();
    let config = config(4096, 8);
    // Each through a listener of its own, the ends dropped (and lingering) as the next comes.
    for n in 0..100 {
        let (mut a, mut b) = UcxConnection::pair(&config)
            .unwrap_or_else(|e| panic!("pair {n} of 100 in a row: {e}"));
        greet(&mut a, &mut b, n);
    }

    // One after another through one listener.
    let mut listener = UcxListener::bind(loopback(), &config).unwrap();
    let addr = listener.local_addr();
    for n in 0..100 {
        let client = std::thread::spawn(move || UcxConnection::connect(addr, &config));
        let mut server = listener
            .accept(TIMEOUT)
            .unwrap_or_else(|e| panic!("connection {n} of 100 to one listener: {e}"))
            .expect("the connection did not arrive");
        let mut client = client.join().unwrap().unwrap();
        greet(&mut client, &mut server, n);
    }

    // Several at once: requests that arrive together all wait for `accept`.
    const AT_ONCE: u64 = 6;
    for round in 0..8 {
        let clients: Vec<_> = (0..AT_ONCE)
            .map(|_| std::thread::spawn(move || UcxConnection::connect(addr, &config)))
            .collect();
        let mut servers: Vec<_> = (0..AT_ONCE)
            .map(|i| {
                listener
                    .accept(TIMEOUT)
                    .unwrap_or_else(|e| panic!("round {round}, connection {i}: {e}"))
                    .expect("a connection did not arrive")
            })
            .collect();
        let mut clients: Vec<_> = clients
            .into_iter()
            .map(|client| client.join().unwrap().unwrap())
            .collect();
        // Pair each client with its server by the number it sends.
        for (n, client) in clients.iter_mut().enumerate() {
            send_all(client.split().0, &(n as u64).to_le_bytes());
        }
        for server in &mut servers {
            let n = u64::from_le_bytes(next(server.split().1).try_into().unwrap());
            send_all(server.split().0, &n.to_le_bytes());
        }
        for (n, client) in clients.iter_mut().enumerate() {
            assert_eq!(next(client.split().1), (n as u64).to_le_bytes());
        }
    }
}

/// How many connections [`hundreds_of_connections_open_and_close_at_once`] holds at once.
const AT_ONCE_MANY: usize = 200;

/// Opens [`AT_ONCE_MANY`] connections at once in this process (half by socket address, half
/// by the listener's worker address), greets over each, and closes them all at once from
/// threads of their own while the next round opens: descriptors of closed connections are
/// reused by new ones while UCX still has events for them. With a worker per connection, UCX
/// 1.13 aborted such a process now and then (`async.c: Assertion 'handler->async == async'
/// failed`); all of them on the one shared worker, it must not.
#[test]
fn hundreds_of_connections_open_and_close_at_once() {
    setup();
    let config = config(4096, 8);
    let mut listener = UcxListener::bind(loopback(), &config).unwrap();
    let addr = listener.local_addr();
    let address = listener.worker_address().to_vec();
    let mut closing: Vec<std::thread::JoinHandle<()>> = Vec::new();
    for round in 0..3 {
        let clients: Vec<_> = (0..AT_ONCE_MANY)
            .map(|i| {
                let address = address.clone();
                std::thread::spawn(move || {
                    if i % 2 == 0 {
                        UcxConnection::connect(addr, &config)
                    } else {
                        UcxConnection::connect_worker(&address, &config)
                    }
                })
            })
            .collect();
        let mut servers: Vec<_> = (0..AT_ONCE_MANY)
            .map(|i| {
                listener
                    .accept(TIMEOUT)
                    .unwrap_or_else(|e| panic!("round {round}, connection {i}: {e}"))
                    .expect("a connection did not arrive")
            })
            .collect();
        for handle in closing.drain(..) {
            handle.join().unwrap();
        }
        let mut clients: Vec<_> = clients
            .into_iter()
            .enumerate()
            .map(|(i, client)| {
                client
                    .join()
                    .unwrap()
                    .unwrap_or_else(|e| panic!("round {round}, client {i}: {e}"))
            })
            .collect();
        for (n, client) in clients.iter_mut().enumerate() {
            send_all(client.split().0, &(n as u64).to_le_bytes());
        }
        for server in &mut servers {
            let n = u64::from_le_bytes(next(server.split().1).try_into().unwrap());
            send_all(server.split().0, &n.to_le_bytes());
        }
        for (n, client) in clients.iter_mut().enumerate() {
            assert_eq!(next(client.split().1), (n as u64).to_le_bytes());
        }
        // Close every end at once, each on a thread of its own, some as if it crashed; the
        // next round opens meanwhile.
        for (n, (client, server)) in clients.into_iter().zip(servers).enumerate() {
            closing.push(std::thread::spawn(move || drop(client)));
            closing.push(std::thread::spawn(move || {
                if n % 10 == 0 {
                    server.simulate_crash();
                } else {
                    drop(server);
                }
            }));
        }
    }
    for handle in closing {
        handle.join().unwrap();
    }
}

/// Not a test of its own: the peer process of [`a_killed_peer_process_is_reported_as_died`],
/// which runs this test binary with [`PEER_ENV`] set to its listener's address. Connects,
/// says "ready" and waits to be killed (a minute at most).
#[test]
fn child_peer_for_the_killed_peer_test() {
    let Ok(address) = std::env::var(PEER_ENV) else {
        return;
    };
    setup();
    let addr: SocketAddr = address.parse().unwrap();
    let mut conn = UcxConnection::connect(addr, &config(4096, 8)).unwrap();
    conn.send(b"ready").unwrap();
    let end = Instant::now() + TIMEOUT;
    while Instant::now() < end {
        // Keeps the worker progressing, as a live peer does.
        if conn.wait_recv(Duration::from_millis(100)).is_err() {
            break;
        }
    }
}

#[test]
fn a_killed_peer_process_is_reported_as_died() {
    setup();
    let config = config(4096, 8);
    let mut listener = UcxListener::bind(loopback(), &config).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_peer_for_the_killed_peer_test",
            "--test-threads=1",
            "--nocapture",
        ])
        .env(PEER_ENV, listener.local_addr().to_string())
        .env("UCX_WARN_UNUSED_ENV_VARS", "n")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let conn = listener
        .accept(TIMEOUT)
        .unwrap()
        .expect("the child did not connect");
    let (mut tx, mut rx) = conn.into_split();
    assert_eq!(next(&mut rx), b"ready");

    child.kill().unwrap();
    child.wait().unwrap();

    // Noticed within a bounded time, as a death (the child never closed).
    let deadline = Instant::now() + TIMEOUT;
    loop {
        match rx.wait_recv(Duration::from_millis(100)) {
            Err(FrameRecvError::PeerGone(how)) => {
                assert_eq!(how, PeerGoneError::Died);
                break;
            }
            Ok(false) => assert!(
                Instant::now() < deadline,
                "the receiving half did not notice the killed peer"
            ),
            other => panic!("after the peer was killed: {other:?}"),
        }
    }
    assert_eq!(tx.check_peer(), Err(PeerGoneError::Died));
    assert_eq!(
        tx.send(b"anyone?"),
        Err(FrameSendError::PeerGone(PeerGoneError::Died))
    );
}

/// The environment variable that makes [`child_that_exits_while_its_ends_linger`] run.
const EXITING_ENV: &str = "UROM_UCX_TEST_EXITING";
/// Connections the exiting child opens.
const EXITING_CONNS: usize = 48;

/// Not a test of its own: the child process of
/// [`a_process_that_exits_while_its_ends_linger_exits_cleanly`]. Opens connections to the
/// listener at [`EXITING_ENV`], sends a frame on each and drops them all (they linger: the
/// peer does not answer their closes); then, told to on its standard input, returns at once,
/// so that the process exits with its ends lingering while the peer hangs up on them.
#[test]
fn child_that_exits_while_its_ends_linger() {
    let Ok(address) = std::env::var(EXITING_ENV) else {
        return;
    };
    setup();
    let addr: SocketAddr = address.parse().unwrap();
    let conns: Vec<_> = (0..EXITING_CONNS)
        .map(|_| {
            let mut conn = UcxConnection::connect(addr, &config(4096, 8)).unwrap();
            conn.send(b"bye").unwrap();
            conn
        })
        .collect();
    drop(conns);
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).unwrap();
}

#[test]
fn a_process_that_exits_while_its_ends_linger_exits_cleanly() {
    setup();
    let config = config(4096, 8);
    let mut listener = UcxListener::bind(loopback(), &config).unwrap();
    for run in 0..2 {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "child_that_exits_while_its_ends_linger",
                "--test-threads=1",
            ])
            .env(EXITING_ENV, listener.local_addr().to_string())
            .env("UCX_WARN_UNUSED_ENV_VARS", "n")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        // Hold the child's connections without answering its closes, so that its ends linger.
        let mut held: Vec<_> = (0..EXITING_CONNS)
            .map(|_| {
                listener
                    .accept(TIMEOUT)
                    .unwrap()
                    .expect("the child did not connect")
            })
            .collect();
        for conn in &mut held {
            assert_eq!(next(conn.split().1), b"bye");
        }
        // Let the child exit and hang up on its ends meanwhile, so that UCX has events for
        // them while the process exits.
        let mut stdin = child.stdin.take().unwrap();
        std::io::Write::write_all(&mut stdin, b"go\n").unwrap();
        drop(stdin);
        for conn in held.drain(..) {
            conn.simulate_crash();
        }
        let status = child.wait().unwrap();
        assert!(
            status.success(),
            "run {run}: the child exited with {status} while its ends lingered"
        );
    }
}

/// Polls `rx`'s wake descriptor for at most `timeout`; whether it became readable.
fn poll_wake(rx: &impl FrameReceiver, timeout: Duration) -> bool {
    let fds: Vec<BorrowedFd<'_>> = rx.wake_fds().into_iter().flatten().collect();
    assert_eq!(
        fds.len(),
        1,
        "a UCX receiving half has one wake descriptor, its own"
    );
    let mut polled = [PollFd::new(fds[0], PollFlags::POLLIN)];
    let ms = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
    poll(&mut polled, PollTimeout::from(ms)).unwrap();
    polled[0].revents().is_some_and(|r| !r.is_empty())
}

/// Sleeps on `rx`'s wake descriptors until something comes; fails after [`TIMEOUT`].
fn sleep_until_woken(rx: &mut impl FrameReceiver) {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        match rx.arm().unwrap() {
            Armed::Ready => return,
            Armed::Armed { fresh } => {
                assert!(!fresh, "UCX's arming has no missed-wake window");
                let woke = poll_wake(rx, Duration::from_secs(10));
                rx.disarm();
                if woke {
                    return;
                }
                assert!(Instant::now() < deadline, "the armed half was never woken");
            }
            Armed::Unsupported => panic!("a UCX receiving half can be armed"),
        }
    }
}

/// Arms `rx`, which has nothing to receive: `Ready` only while the worker has events to
/// progress first (then nothing may have arrived), and then armed, never fresh.
fn arm_idle(rx: &mut impl FrameReceiver) {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        match rx.arm().unwrap() {
            Armed::Armed { fresh } => {
                assert!(!fresh, "UCX's arming has no missed-wake window");
                return;
            }
            Armed::Ready => assert_eq!(rx.recv().unwrap(), None),
            Armed::Unsupported => panic!("a UCX receiving half can be armed"),
        }
        assert!(Instant::now() < deadline, "the idle half never armed");
    }
}

/// The wake-up tests, for a UCX receiving half or a channel over UCX.
fn wakes_up<T: Transport + Send + 'static>(mut a: T, mut b: T) {
    let (_, rx) = b.split();

    // Nothing there: armed, and the descriptor stays quiet (after whatever UCX itself still
    // had to do right after setup), however busy other connections of the process are.
    let mut quiet = false;
    for _ in 0..5 {
        arm_idle(rx);
        quiet = !poll_wake(rx, Duration::from_millis(200));
        rx.disarm();
        if quiet {
            break;
        }
        assert_eq!(rx.recv().unwrap(), None);
    }
    assert!(quiet, "an idle armed half keeps being woken");

    // A frame sent while the half sleeps wakes it.
    let sender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        a.send(b"wake up").unwrap();
        a
    });
    sleep_until_woken(rx);
    assert_eq!(next(rx), b"wake up");
    let mut a = sender.join().unwrap();

    // A frame that is there already: ready at once, nothing to sleep for.
    a.send(b"already here").unwrap();
    sleep_until_woken(rx);
    assert!(rx.wait_recv(TIMEOUT).unwrap());
    assert_eq!(rx.arm().unwrap(), Armed::Ready);
    assert_eq!(rx.recv().unwrap().unwrap(), b"already here");

    // The peer's end wakes it too.
    arm_idle(rx);
    drop(a);
    sleep_until_woken(rx);
    let deadline = Instant::now() + TIMEOUT;
    loop {
        match rx.wait_recv(Duration::from_millis(100)) {
            Err(FrameRecvError::PeerGone(_)) => break,
            Ok(false) => assert!(Instant::now() < deadline, "the peer's end never showed"),
            other => panic!("after the peer went: {other:?}"),
        }
    }
}

#[test]
fn an_armed_receiving_half_sleeps_until_a_frame_or_the_peers_end() {
    // Among the other tests: the wake descriptor is the half's own, which other connections'
    // traffic does not touch.
    let config = config(4096, 8);
    let (a, b) = pair(&config);
    wakes_up(a, b);
    let (a, b) = pair(&config);
    wakes_up(Channel::from(a), Channel::from(b));
}

#[test]
fn the_sending_half_progressing_the_shared_worker_still_wakes_the_armed_receiver() {
    let (mut a, b) = pair(&config(4096, 8));
    let (tx, mut rx) = b.into_split();
    arm_idle(&mut rx);
    a.send(b"for the receiver").unwrap();
    // The sending half's progress (as another thread's would) runs the receive, so the
    // worker's descriptor may never fire for it: the receiver's own eventfd must. The far end
    // progresses too, as its process would: a send that could not go out at once (a busy
    // machine) leaves only with its worker's progress.
    let deadline = Instant::now() + TIMEOUT;
    while !poll_wake(&rx, Duration::ZERO) {
        a.check_peer().unwrap();
        tx.check_peer().unwrap();
        assert!(
            Instant::now() < deadline,
            "the receiving half's eventfd was never written"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    rx.disarm();
    assert_eq!(next(&mut rx), b"for the receiver");
    drop(a);
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Waits for the next frame on `to`, progressing `from` meanwhile (a large frame moves as
/// the receiver pulls it, which the sending end's worker must answer); its length.
fn pump(from: &mut UcxConnection, to: &mut UcxConnection) -> usize {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Some(frame) = to.recv().unwrap() {
            return frame.len();
        }
        from.check_peer().unwrap();
        assert!(Instant::now() < deadline, "no frame arrived");
    }
}

/// `rounds` round trips of the first `len(i)` bytes of `frame`, both ends on this thread:
/// waiting on the receiver alone for small frames, pumping both ends for large ones.
fn round_trips(
    a: &mut UcxConnection,
    b: &mut UcxConnection,
    frame: &[u8],
    rounds: u64,
    len: fn(u64) -> usize,
) {
    for i in 0..rounds {
        let n = len(i);
        a.send(&frame[..n]).unwrap();
        if n < 4096 {
            assert!(b.wait_recv(TIMEOUT).unwrap());
            assert_eq!(b.recv().unwrap().unwrap().len(), n);
        } else {
            assert_eq!(pump(a, b), n);
        }
        b.send(&frame[..n]).unwrap();
        if n < 4096 {
            assert!(a.wait_recv(TIMEOUT).unwrap());
            assert_eq!(a.recv().unwrap().unwrap().len(), n);
        } else {
            assert_eq!(pump(b, a), n);
        }
    }
}

#[test]
fn no_allocation_per_frame_on_a_ucx_pair() {
    if !in_a_process_of_its_own("no_allocation_per_frame_on_a_ucx_pair") {
        return;
    }
    // Sanity check of the counter itself.
    assert!(allocations_in(|| drop(std::hint::black_box(vec![1u8; 10]))) > 0);

    // Small frames (eager), sleeping and busy-polling receivers.
    let frame = vec![0x5au8; 200_000];
    let small = |i: u64| 1 + (i as usize * 37) % 256;
    let (mut a, mut b) = pair(&config(4096, 64));
    round_trips(&mut a, &mut b, &frame, 200, small);
    let n = allocations_in(|| round_trips(&mut a, &mut b, &frame, 10_000, small));
    assert_eq!(n, 0, "{n} allocations in 10000 round trips");
    a.set_wait_mode(WaitMode::BusyPoll);
    b.set_wait_mode(WaitMode::BusyPoll);
    let n = allocations_in(|| round_trips(&mut a, &mut b, &frame, 10_000, small));
    assert_eq!(n, 0, "{n} allocations in 10000 busy-polled round trips");

    // Large frames (rendezvous) between small ones.
    let large = |i: u64| if i % 2 == 0 { 200_000 } else { 1 };
    let (mut a, mut b) = pair(&config(256 << 10, 8));
    round_trips(&mut a, &mut b, &frame, 50, large);
    let n = allocations_in(|| round_trips(&mut a, &mut b, &frame, 1_000, large));
    assert_eq!(n, 0, "{n} allocations in 1000 round trips of large frames");
    assert!(b.rendezvous_frames() > 500);
}
