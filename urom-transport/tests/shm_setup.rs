//! Setting up a shared-memory connection: a peer that offers something bad gets an error,
//! never undefined behaviour; mismatched settings are refused on both sides.

use std::io::{IoSlice, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};
use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
use urom_transport::ChannelConfig;
use urom_transport::Transport;
use urom_transport::shm::{HugePages, ShmConnectError, ShmConnection, ShmLayoutError};
use urom_wire::MaxMsgSize;
use urom_wire::shm::{MappingHeaderRepr, ShmHelloRepr};
use zerocopy::IntoBytes;

const SLOTS: u32 = 8;
const STRIDE: u64 = 4224;
const TOTAL: u64 = 640 + 2 * SLOTS as u64 * STRIDE;

/// The header of a valid mapping, built from the documented layout (4096-byte slots, 8 of them).
fn header_repr() -> MappingHeaderRepr {
    MappingHeaderRepr {
        slot_size: 4096,
        slot_count: SLOTS,
        stride: STRIDE as u32,
        ctl: [128, 384],
        slots: [640, 640 + SLOTS as u64 * STRIDE],
        total: TOTAL,
    }
}

fn header() -> [u8; 128] {
    header_repr().to_bytes()
}

fn memfd(header: &[u8], len: u64, seal: bool) -> OwnedFd {
    let fd = memfd_create(c"test", MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING).unwrap();
    let mut file = std::fs::File::from(fd.try_clone().unwrap());
    file.write_all(header).unwrap();
    nix::unistd::ftruncate(&fd, len as i64).unwrap();
    if seal {
        let seals = SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL;
        fcntl(&fd, FcntlArg::F_ADD_SEALS(seals)).unwrap();
    }
    fd
}

fn hello() -> [u8; 16] {
    ShmHelloRepr.to_bytes()
}

fn offer(stream: &UnixStream, message: &[u8], fds: &[&OwnedFd]) {
    let raw: Vec<i32> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
    let cmsg = [ControlMessage::ScmRights(&raw)];
    let cmsgs: &[ControlMessage] = if raw.is_empty() { &[] } else { &cmsg };
    sendmsg::<()>(
        stream.as_raw_fd(),
        &[IoSlice::new(message)],
        cmsgs,
        MsgFlags::empty(),
        None,
    )
    .unwrap();
}

fn eventfd() -> OwnedFd {
    nix::sys::eventfd::EventFd::new().unwrap().into()
}

fn config() -> ChannelConfig {
    ChannelConfig {
        handshake_timeout: Duration::from_secs(5),
        ..ChannelConfig::default()
    }
}

/// Offers `file` (with four eventfds) to an acceptor; returns what it says.
fn accept_file(file: &OwnedFd) -> Result<ShmConnection, ShmConnectError> {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let events: Vec<OwnedFd> = (0..4).map(|_| eventfd()).collect();
    offer(
        &ours,
        &hello(),
        &[file, &events[0], &events[1], &events[2], &events[3]],
    );
    ShmConnection::accept(theirs, &config())
}

#[test]
fn hand_made_offer_following_the_documented_layout_is_accepted() {
    let conn = accept_file(&memfd(&header(), TOTAL, true)).unwrap();
    assert_eq!(conn.max_msg_size(), MaxMsgSize::DEFAULT);
}

#[test]
fn bad_files_are_refused() {
    let layout = |e| Some(ShmConnectError::Layout(e));
    let mut bad_magic = header_repr().to_wire();
    bad_magic.magic.set(u64::from_le_bytes(*b"XROMSHM\0"));
    assert_eq!(
        accept_file(&memfd(bad_magic.as_bytes(), TOTAL, true)).err(),
        layout(ShmLayoutError::Magic)
    );
    assert_eq!(
        accept_file(&memfd(&header(), TOTAL, false)).err(),
        layout(ShmLayoutError::NotSealed)
    );
    assert_eq!(
        accept_file(&memfd(&header(), 4096, true)).err(),
        layout(ShmLayoutError::Truncated {
            file_len: 4096,
            needed: TOTAL
        })
    );
    assert_eq!(
        accept_file(&memfd(&header(), 64, true)).err(),
        layout(ShmLayoutError::Truncated {
            file_len: 64,
            needed: 128
        })
    );
    let three_slots = MappingHeaderRepr {
        slot_count: 3,
        ..header_repr()
    };
    assert_eq!(
        accept_file(&memfd(&three_slots.to_bytes(), TOTAL, true)).err(),
        layout(ShmLayoutError::SlotCount { found: 3 })
    );
    let bad_offset = MappingHeaderRepr {
        slots: [0, header_repr().slots[1]],
        ..header_repr()
    };
    assert_eq!(
        accept_file(&memfd(&bad_offset.to_bytes(), TOTAL, true)).err(),
        layout(ShmLayoutError::Field {
            name: "slots_offset[0]"
        })
    );
    let (read_end, _write_end) = nix::unistd::pipe().unwrap();
    assert_eq!(
        accept_file(&read_end).err(),
        layout(ShmLayoutError::NotAFile)
    );
}

#[test]
fn bad_handshakes_are_refused() {
    let handshake = |stream: UnixStream| match ShmConnection::accept(stream, &config()) {
        Err(ShmConnectError::Handshake(what)) => what,
        other => panic!("expected a handshake error, got {:?}", other.err()),
    };
    // No descriptors.
    let (ours, theirs) = UnixStream::pair().unwrap();
    offer(&ours, &hello(), &[]);
    handshake(theirs);
    // Not a hello.
    let (ours, theirs) = UnixStream::pair().unwrap();
    let file = memfd(&header(), TOTAL, true);
    offer(&ours, b"GET / HTTP/1.1\r\n", &[&file, &eventfd()]);
    handshake(theirs);
    // Too many descriptors.
    let (ours, theirs) = UnixStream::pair().unwrap();
    let extra: Vec<OwnedFd> = (0..6).map(|_| eventfd()).collect();
    offer(&ours, &hello(), &extra.iter().collect::<Vec<_>>());
    handshake(theirs);
    // Hang-up before the offer.
    let (ours, theirs) = UnixStream::pair().unwrap();
    drop(ours);
    handshake(theirs);
    // Silence.
    let (_ours, theirs) = UnixStream::pair().unwrap();
    let quick = ChannelConfig {
        handshake_timeout: Duration::from_millis(50),
        ..config()
    };
    assert!(matches!(
        ShmConnection::accept(theirs, &quick),
        Err(ShmConnectError::Handshake(_))
    ));
    // A creator whose peer never answers.
    let (ours, _theirs) = UnixStream::pair().unwrap();
    assert!(matches!(
        ShmConnection::create(ours, &quick),
        Err(ShmConnectError::Handshake(_))
    ));
}

#[test]
fn max_msg_size_mismatch_is_refused_on_both_sides() {
    let (a, b) = UnixStream::pair().unwrap();
    let creator = std::thread::spawn(move || ShmConnection::create(a, &config()).err());
    let big = ChannelConfig {
        max_msg_size: MaxMsgSize::new(8192).unwrap(),
        ..config()
    };
    let mismatch = ShmConnectError::MaxMsgSizeMismatch {
        ours: 8192,
        theirs: 4096,
    };
    assert_eq!(ShmConnection::accept(b, &big).err(), Some(mismatch));
    assert_eq!(
        creator.join().unwrap(),
        Some(ShmConnectError::MaxMsgSizeMismatch {
            ours: 4096,
            theirs: 8192
        })
    );
    assert!(mismatch.to_string().contains("8192"));
}

#[test]
fn hugepages_are_used_only_when_available() {
    let reserved: u64 = std::fs::read_to_string("/proc/sys/vm/nr_hugepages")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    let (a, _b) = ShmConnection::pair(&config()).unwrap();
    if reserved == 0 {
        assert!(!a.on_hugepages());
    }
    let never = ChannelConfig {
        hugepages: HugePages::Never,
        ..config()
    };
    assert!(!ShmConnection::pair(&never).unwrap().0.on_hugepages());
    let require = ChannelConfig {
        hugepages: HugePages::Require,
        ..config()
    };
    match ShmConnection::pair(&require) {
        Ok((a, b)) => assert!(a.on_hugepages() && b.on_hugepages()),
        Err(e) => {
            assert!(matches!(e, ShmConnectError::Sys { .. }), "{e}");
            eprintln!("no hugepages here ({reserved} reserved): {e}");
        }
    }
}

/// How many frames `conn` sends before its ring is full (nobody receives).
fn ring_slots(conn: &mut ShmConnection) -> u32 {
    let mut sent = 0u32;
    loop {
        let mut frame = [0u8; 16];
        frame[..4].copy_from_slice(&sent.to_le_bytes());
        match conn.send(&frame) {
            Ok(()) => sent += 1,
            Err(urom_transport::FrameSendError::Full) => return sent,
            Err(e) => panic!("send: {e}"),
        }
    }
}

#[test]
fn each_acceptor_gets_rings_of_the_size_it_asks_for() {
    let most = config().slots;
    // Asked, given: the default for 0, a power of two at least MIN_SLOTS, the creator's most.
    for (asked, given) in [(0, most), (1, 2), (3, 4), (64, 64), (most * 4, most)] {
        let (a, b) = UnixStream::pair().unwrap();
        let creator = std::thread::spawn(move || ShmConnection::create(a, &config()).unwrap());
        let wants = ChannelConfig {
            slots: asked,
            ..config()
        };
        let mut accepted = ShmConnection::accept(b, &wants).unwrap();
        let mut created = creator.join().unwrap();
        assert_eq!(ring_slots(&mut created), given, "asked for {asked}: to it");
        assert_eq!(
            ring_slots(&mut accepted),
            given,
            "asked for {asked}: from it"
        );
    }
}

#[test]
fn a_peer_that_asks_for_nothing_is_refused_in_time() {
    // A version-2 acceptor waits for the hello without asking first.
    let (ours, _theirs) = UnixStream::pair().unwrap();
    let quick = ChannelConfig {
        handshake_timeout: Duration::from_millis(50),
        ..config()
    };
    assert!(matches!(
        ShmConnection::create(ours, &quick),
        Err(ShmConnectError::Handshake(_))
    ));
    // One whose request is of another version is told so.
    let (ours, theirs) = UnixStream::pair().unwrap();
    let mut old = urom_wire::shm::ShmRequestRepr { slots: 8 }.to_bytes();
    old[8] = 2;
    (&theirs).write_all(&old).unwrap();
    assert_eq!(
        ShmConnection::create(ours, &config()).err(),
        Some(ShmConnectError::Version { found: 2 })
    );
}
