//! The worker's front door: hosts on other machines knock over TCP, prove the worker's key and
//! only then connect over UCX.
//!
//! The acceptor thread drives every knocking host's challenge without blocking, each with a
//! deadline and buffers of a fixed size, so that hosts at the door cost memory, not threads,
//! and a peer that says nothing (or half of something) holds up no one but itself. Only a host
//! that proved the key reaches the one thread that sets up UCX connections: that part waits on
//! the peer, which by then is known to be one the daemon vouched for.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use nix::poll::PollFlags;
use nix::sys::eventfd::EventFd;
use tracing::warn;
use urom_transport::auth::{AuthBytes, SessionKeys, SharedSecret, Side, Transcript};
use urom_transport::ucx::UcxConnection;
use urom_transport::{Channel, ChannelConfig, Transport, stream};
use urom_wire::control::{
    AuthChallenge, AuthMethod, ControlMessage, ErrorReply, SecretProof, ServiceProof,
};
use urom_wire::frame::frame_length;
use urom_wire::{FRAME_HEADER_LEN, FrameRepr, MaxMsgSize, Status};

use super::{ACCEPT_RETRY, Arrive};

/// How long a host at the front door may take to prove the worker's key.
const UCX_HANDSHAKE: Duration = Duration::from_secs(10);
/// How many hosts may be at the door at once (proving the key, or proven and waiting for
/// their UCX connection); more are closed at once.
const MAX_AT_DOOR: usize = 1024;
/// How many of them may come from one network address and not have proved the key yet.
const MAX_UNPROVEN_PER_ADDRESS: usize = 256;
/// The longest frame a knocking host may send: its proof, or an error reply.
const KNOCK_FRAME_MAX: usize = 256;

/// Accepts hosts on another machine at the worker's front door, `listener`, until `stop` is
/// set (and `halt` is written). Each host must prove `key` under `identity` within
/// [`UCX_HANDSHAKE`], driven on this thread beside the others (at most [`MAX_AT_DOOR`] at
/// once, [`MAX_UNPROVEN_PER_ADDRESS`] from one address; more are closed at once); only then do
/// the two exchange UCX worker addresses through the authenticated stream and connect, on one
/// thread for all hosts. UCX never sees a byte of a host that did not prove the key. Refusals
/// are logged at most once a second, with counts.
pub(crate) fn accept_ucx_hosts(
    listener: TcpListener,
    config: ChannelConfig,
    key: &SharedSecret,
    identity: &str,
    arrive: Arrive,
    stop: &AtomicBool,
    halt: &EventFd,
) {
    if let Err(e) = listener.set_nonblocking(true) {
        warn!("cannot make the front door non-blocking: {e}; no remote host can connect");
        return;
    }
    let refusals = Arc::new(Refusals::default());
    // Proven hosts handed to the connecting thread and not connected yet.
    let proven = Arc::new(AtomicUsize::new(0));
    let connecting = {
        let (tx, rx) = mpsc::channel::<Proven>();
        let (refusals, proven) = (Arc::clone(&refusals), Arc::clone(&proven));
        let spawned = thread::Builder::new()
            .name("urom-ucx-connect".into())
            .spawn(move || connect_proven(&rx, &config, &arrive, &refusals, &proven));
        match spawned {
            Ok(_) => tx,
            Err(e) => {
                warn!("cannot start the front door's thread: {e}; no remote host can connect");
                return;
            }
        }
    };
    let mut door = Door {
        key,
        identity,
        max: config.max_msg_size,
        knocks: Vec::new(),
        per_address: HashMap::new(),
    };
    let mut ready = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let deadlines = door.knocks.iter().map(|k| k.deadline);
        let waiting = door.knocks.iter().map(|k| {
            let events = if k.sending() {
                PollFlags::POLLOUT
            } else {
                PollFlags::POLLIN
            };
            (k.stream.as_fd(), events)
        });
        let Some(listener_ready) = super::sleep_until_ready(
            &listener,
            halt,
            waiting,
            deadlines,
            &mut ready,
            "the front door",
        ) else {
            continue;
        };
        // From the back, so that `swap_remove` moves only knocks already looked at.
        let now = Instant::now();
        for i in (0..door.knocks.len()).rev() {
            let step = if ready.get(i).copied().unwrap_or(false) {
                door.step(i)
            } else if door.knocks[i].deadline <= now {
                Err(format!(
                    "it did not prove the worker's key within {UCX_HANDSHAKE:?}"
                ))
            } else {
                continue;
            };
            match step {
                Ok(false) => {}
                Ok(true) => {
                    // Done only once proven: the keys are there.
                    let (knock, Some(keys)) = door.remove(i) else {
                        continue;
                    };
                    proven.fetch_add(1, Ordering::AcqRel);
                    let from = knock.from;
                    let handed = connecting.send(Proven {
                        stream: knock.stream,
                        from,
                        keys,
                    });
                    if handed.is_err() {
                        proven.fetch_sub(1, Ordering::AcqRel);
                        refusals.log(&format!("{from}: the front door's thread is gone"));
                    }
                }
                Err(why) => {
                    let (knock, _) = door.remove(i);
                    refusals.log(&format!("{}: {why}", knock.from));
                }
            }
        }
        if listener_ready {
            door.accept_ready(&listener, &refusals, proven.load(Ordering::Acquire));
        }
    }
}

/// Where the hosts at the front door stand.
struct Door<'a> {
    key: &'a SharedSecret,
    identity: &'a str,
    max: MaxMsgSize,
    knocks: Vec<Knock>,
    /// Knocks under way from each address.
    per_address: HashMap<IpAddr, usize>,
}

/// A host at the door that has not proved the key yet, or whose proof of ours is still
/// leaving.
struct Knock {
    stream: TcpStream,
    from: SocketAddr,
    /// When it is given up on.
    deadline: Instant,
    /// The challenge's nonce.
    nonce: AuthBytes,
    /// Its frame, collected up to the length its header names.
    frame: [u8; KNOCK_FRAME_MAX],
    have: usize,
    /// What is to be sent (the challenge, then the worker's proof), from `sent` on.
    out: Vec<u8>,
    sent: usize,
    /// The session's keys, once it proved the key; it is done when `out` has left.
    keys: Option<SessionKeys>,
}

impl Knock {
    fn sending(&self) -> bool {
        self.sent < self.out.len()
    }
}

impl Door<'_> {
    /// Accepts every host waiting on `listener` and challenges each, while there is room;
    /// `proven` hosts are waiting for their UCX connection.
    fn accept_ready(&mut self, listener: &TcpListener, refusals: &Refusals, proven: usize) {
        loop {
            let (stream, from) = match listener.accept() {
                Ok(accepted) => accepted,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    refusals.log(&format!("accept failed: {e}"));
                    thread::sleep(ACCEPT_RETRY);
                    return;
                }
            };
            if self.knocks.len() + proven >= MAX_AT_DOOR {
                refusals.log(&format!(
                    "{from}: {MAX_AT_DOOR} hosts are already setting up their channels"
                ));
                continue;
            }
            let count = self.per_address.get(&from.ip()).copied().unwrap_or(0);
            if count >= MAX_UNPROVEN_PER_ADDRESS {
                refusals.log(&format!(
                    "{from}: {MAX_UNPROVEN_PER_ADDRESS} hosts from {} are already proving the key",
                    from.ip()
                ));
                continue;
            }
            match self.challenge(stream, from) {
                Ok(knock) => {
                    *self.per_address.entry(from.ip()).or_default() += 1;
                    self.knocks.push(knock);
                }
                Err(why) => refusals.log(&format!("{from}: {why}")),
            }
        }
    }

    /// A knock for a host just accepted, its challenge on the way.
    fn challenge(&self, stream: TcpStream, from: SocketAddr) -> Result<Knock, String> {
        stream
            .set_nonblocking(true)
            .and_then(|()| stream.set_nodelay(true))
            .map_err(|e| format!("cannot set up the connection: {e}"))?;
        let nonce = urom_transport::auth::fresh_nonce()
            .map_err(|e| format!("cannot draw a random challenge: {e}"))?;
        let challenge = AuthChallenge {
            method: AuthMethod::SharedSecret,
            nonce,
        };
        let mut knock = Knock {
            stream,
            from,
            deadline: Instant::now() + UCX_HANDSHAKE,
            nonce,
            frame: [0; KNOCK_FRAME_MAX],
            have: 0,
            out: encode(1, ControlMessage::AuthChallenge(challenge), self.max)?,
            sent: 0,
            keys: None,
        };
        flush(&mut knock)?;
        Ok(knock)
    }

    /// Goes on with knock `i`, whose socket is ready: `Ok(true)` once it proved the key and
    /// the worker's proof left, `Err` when it is to be closed.
    fn step(&mut self, i: usize) -> Result<bool, String> {
        let knock = &mut self.knocks[i];
        if knock.sending() {
            flush(knock)?;
            return Ok(!knock.sending() && knock.keys.is_some());
        }
        if knock.keys.is_some() {
            return Ok(true);
        }
        // Exactly the frame's bytes: nothing of what follows is taken from the stream.
        let need = if knock.have < FRAME_HEADER_LEN {
            FRAME_HEADER_LEN
        } else {
            frame_length(&knock.frame[..knock.have], self.max)
                .map_err(|e| format!("unexpected bytes instead of a proof: {e}"))?
                .ok_or("a short frame header")?
        };
        if need > KNOCK_FRAME_MAX {
            return Err(format!("a frame of {need} bytes instead of a proof"));
        }
        match knock.stream.read(&mut knock.frame[knock.have..need]) {
            Ok(0) => return Err("it closed the connection before proving the key".into()),
            Ok(n) => knock.have += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                return Ok(false);
            }
            Err(e) => return Err(format!("the connection failed: {e}")),
        }
        if knock.have < FRAME_HEADER_LEN {
            return Ok(false);
        }
        let len = frame_length(&knock.frame[..knock.have], self.max)
            .map_err(|e| format!("unexpected bytes instead of a proof: {e}"))?
            .ok_or("a short frame header")?;
        if len > KNOCK_FRAME_MAX {
            return Err(format!("a frame of {len} bytes instead of a proof"));
        }
        if knock.have < len {
            return Ok(false);
        }
        let proof = parse_proof(&knock.frame[..len], self.max)?;
        let transcript = Transcript {
            service_nonce: &knock.nonce,
            host_nonce: &proof.nonce,
            identity: self.identity,
        };
        if !self.key.check_host_proof(&transcript, &proof.proof) {
            let reason = "wrong proof of the worker's key: this host was not sent by its daemon";
            let error = ErrorReply {
                status: Status::Authentication,
                reason,
            };
            // The host is told why if its socket takes the reply at once; it is closed anyway.
            if let Ok(bytes) = encode(2, ControlMessage::Error(error), self.max) {
                let _ = knock.stream.write(&bytes);
            }
            return Err(reason.into());
        }
        let answer = ServiceProof {
            proof: self.key.service_proof(&transcript),
        };
        knock.out = encode(2, ControlMessage::ServiceProof(answer), self.max)?;
        knock.sent = 0;
        knock.keys = Some(self.key.session_keys(&transcript));
        flush(knock)?;
        Ok(!knock.sending())
    }

    /// Takes knock `i` off the door: its host and, if it proved the key, the session's keys.
    fn remove(&mut self, i: usize) -> (Knock, Option<SessionKeys>) {
        let mut knock = self.knocks.swap_remove(i);
        let ip = knock.from.ip();
        if let Some(count) = self.per_address.get_mut(&ip) {
            *count -= 1;
            if *count == 0 {
                self.per_address.remove(&ip);
            }
        }
        let keys = knock.keys.take();
        (knock, keys)
    }
}

/// Writes what the socket takes of what `knock` has to send.
fn flush(knock: &mut Knock) -> Result<(), String> {
    while knock.sending() {
        match knock.stream.write(&knock.out[knock.sent..]) {
            Ok(0) => return Err("the connection took no more bytes".into()),
            Ok(n) => knock.sent += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("the connection failed: {e}")),
        }
    }
    Ok(())
}

/// The host's proof in `bytes`, one whole frame; an error reply is its refusal.
fn parse_proof(bytes: &[u8], max: MaxMsgSize) -> Result<SecretProof, String> {
    let frame = FrameRepr::<ControlMessage>::parse(bytes, max)
        .map_err(|e| format!("unexpected bytes instead of a proof: {e}"))?;
    match frame.body {
        ControlMessage::SecretProof(proof) => Ok(proof),
        ControlMessage::Error(error) => Err(format!("it refused: {}", error.reason)),
        other => Err(format!(
            "unexpected {:?} message instead of a proof",
            urom_wire::Body::kind(&other)
        )),
    }
}

/// `body` as a frame with sequence number `seq`.
fn encode(seq: u64, body: ControlMessage<'_>, max: MaxMsgSize) -> Result<Vec<u8>, String> {
    let frame = FrameRepr { seq, body };
    let mut bytes = vec![0; frame.buffer_len()];
    let len = frame.emit(&mut bytes, max).map_err(|e| e.to_string())?;
    bytes.truncate(len);
    Ok(bytes)
}

/// A host that proved the key, for the connecting thread.
struct Proven {
    stream: TcpStream,
    from: SocketAddr,
    keys: SessionKeys,
}

/// Sets up the UCX connection of each proven host in turn, through its authenticated stream
/// (with the channel's own handshake timeout), and hands it to the worker; until the acceptor
/// is gone.
fn connect_proven(
    proven: &mpsc::Receiver<Proven>,
    config: &ChannelConfig,
    arrive: &Arrive,
    refusals: &Refusals,
    waiting: &AtomicUsize,
) {
    while let Ok(Proven { stream, from, keys }) = proven.recv() {
        let channel = stream
            .set_nonblocking(false)
            .and_then(|()| stream::split_tcp(stream))
            .map_err(|e| e.to_string())
            .and_then(|mut door| {
                // The stream holds nothing past the proofs: the host sends its settings only
                // once it read the worker's proof, sealed.
                keys.seal(
                    Side::Accepting,
                    &mut door.0,
                    &mut door.1,
                    config.max_msg_size,
                );
                UcxConnection::accept_through(&mut door, config)
                    .map(Channel::from)
                    .map_err(|e| e.to_string())
            });
        waiting.fetch_sub(1, Ordering::AcqRel);
        match channel {
            Ok(mut channel) => {
                channel.set_wait_mode(config.wait);
                arrive.send(channel);
            }
            Err(e) => refusals.log(&format!("{from}: {e}")),
        }
    }
}

/// Refusals at the front door, logged at most once a second with the count held back.
struct Refusals(Mutex<urom_cli::LogEvery>);

impl Default for Refusals {
    fn default() -> Self {
        Self(Mutex::new(urom_cli::LogEvery::new(Duration::from_secs(1))))
    }
}

impl Refusals {
    fn log(&self, why: &str) {
        let mut log = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(held_back) = log.allow(Instant::now()) {
            warn!(held_back, "refused a host at the front door: {why}");
        }
    }
}
