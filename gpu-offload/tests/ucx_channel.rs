//! The UCX channel's setup against a peer of another version, on the loopback interface: a
//! fake orchestrator against the real server, a fake server against the real orchestrator.
//! Each side that meets the other version says so and exits; the real server sends its own
//! hello first, so an orchestrator of another version learns it too.
#![cfg(feature = "ucx")]

mod common;

use std::fs::File;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Instant;

use common::{ORCHESTRATOR, SERVER, TIMEOUT, read, two_cpus};
use gpu_offload::channel::ucx_control_config;
use urom_testkit::{ChildGuard, TempDir};
use urom_transport::Transport;
use urom_transport::ucx::{UcxConnection, UcxListener, set_config_defaults};
use urom_wire::gpu::channel::{CHANNEL_HELLO_LEN, ChannelHelloRepr};

const LOOPBACK: [(&str, &str); 2] = [("TLS", "tcp"), ("NET_DEVICES", "lo")];

fn ucx_command(program: &str) -> Command {
    let mut command = Command::new(program);
    command
        .env("UCX_TLS", "tcp")
        .env("UCX_NET_DEVICES", "lo")
        .env("UCX_WARN_UNUSED_ENV_VARS", "n");
    command
}

/// A hello like `hello`'s but of channel version 2.
fn version_2(hello: ChannelHelloRepr) -> [u8; CHANNEL_HELLO_LEN] {
    let mut bytes = hello.to_bytes();
    bytes[8..12].copy_from_slice(&2u32.to_be_bytes());
    bytes
}

/// The first frame `conn` receives.
fn first_frame(conn: &mut UcxConnection) -> Vec<u8> {
    assert!(conn.wait_recv(TIMEOUT).unwrap(), "nothing arrived");
    conn.recv().unwrap().expect("a frame").to_vec()
}

/// Waits for `child` to exit and returns its exit code and its log.
fn exit_and_log(child: &mut ChildGuard, log: &std::path::Path) -> (Option<i32>, String) {
    let status = child
        .wait_timeout(TIMEOUT)
        .expect("the program did not exit");
    (status.code(), read(log))
}

#[test]
fn a_server_meeting_another_version_says_so_and_answers_with_its_own() {
    set_config_defaults(&LOOPBACK);
    let dir = TempDir::new("gpu-offload-ucx-version");
    let log = dir.path().join("server.log");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    let mut server = ChildGuard(
        ucx_command(SERVER)
            .args([
                "-c",
                &format!("ucx://{address}"),
                "-p",
                "0",
                "-a",
                "127.0.0.1",
            ])
            .args(["--cpu", &two_cpus()[0].to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::from(File::create(&log).unwrap()))
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + TIMEOUT;
    let mut conn = loop {
        match UcxConnection::connect(address, &ucx_control_config()) {
            Ok(conn) => break conn,
            Err(e) => {
                assert!(Instant::now() < deadline, "{e}\n{}", read(&log));
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
    };
    let ours = ChannelHelloRepr {
        threads: 1,
        max_message_length: 256,
        max_concurrent: 128,
    };
    conn.send(&version_2(ours)).unwrap();
    let answer = first_frame(&mut conn);
    assert_eq!(ChannelHelloRepr::parse(&answer), Ok(ours), "{}", read(&log));
    let (code, text) = exit_and_log(&mut server, &log);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("the peer speaks channel version 2, this program 1: use matching builds"),
        "{text}"
    );
}

#[test]
fn an_orchestrator_meeting_another_version_says_so() {
    set_config_defaults(&LOOPBACK);
    let dir = TempDir::new("gpu-offload-ucx-version");
    let log = dir.path().join("orchestrator.log");
    let mut listener =
        UcxListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)), &ucx_control_config()).unwrap();
    let address = listener.local_addr();
    let mut orchestrator = ChildGuard(
        ucx_command(ORCHESTRATOR)
            .args(["-c", &format!("ucx://{address}"), "-t", "1"])
            .stdout(Stdio::null())
            .stderr(Stdio::from(File::create(&log).unwrap()))
            .spawn()
            .unwrap(),
    );
    let mut conn = listener
        .accept(TIMEOUT)
        .unwrap()
        .unwrap_or_else(|| panic!("the orchestrator never came\n{}", read(&log)));
    let theirs = ChannelHelloRepr::parse(&first_frame(&mut conn)).expect("its hello");
    assert_eq!(theirs.threads, 1);
    conn.send(&version_2(theirs)).unwrap();
    let (code, text) = exit_and_log(&mut orchestrator, &log);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("the peer speaks channel version 2, this program 1: use matching builds"),
        "{text}"
    );
}
