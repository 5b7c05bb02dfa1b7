//! One host connection: hello, authentication, then requests until the host leaves.
//!
//! Each connection the gate let in has its own thread, so a host that sends garbage, stops
//! halfway through a frame or floods the socket only ever delays itself; it is answered with an
//! error and disconnected. A connection that has not said hello and authenticated within
//! [`HELLO_TIMEOUT`] of being accepted is answered with an error and closed.

use std::io::{self, Read, Write};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use std::net::IpAddr;
use tracing::{debug, info, warn};

use urom_plugin::plugin_id::PluginMask;
use urom_transport::auth::{self, AuthBytes, SessionKeys, Side, Transcript};
use urom_transport::stream::{StreamReader, StreamWriter};
use urom_wire::control::{
    AuthChallenge, AuthMethod, AuthResponse, ControlMessage, EndpointKind, ErrorReply, Hello,
    PluginInfo, SealedUcxAddress, SecretProof, ServiceProof, SpawnResult, StatusReply, WorkerExit,
};
use urom_wire::frame::frame_length;
use urom_wire::{FRAME_HEADER_LEN, FrameRepr, List, MaxMsgSize, PROTOCOL_VERSION, Status};

use crate::Service;
use crate::discovery::PluginEntry;
use crate::gate::{HELLO_TIMEOUT, Peer, Permit, Place};
use crate::registry::{HostEvents, HostId, Owner, Reachable, ServiceError, SpawnRequest};
use crate::status::StatusPager;

/// How often a blocked read looks at the stop flag.
const READ_POLL: Duration = Duration::from_millis(200);
/// How long a host may take to finish a frame it started.
const FRAME_DEADLINE: Duration = Duration::from_secs(10);
/// How long a write to a host may block before the host is given up on.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long what a refused host still sends is read and dropped before its connection closes.
const LINGER: Duration = Duration::from_secs(2);
/// How many bytes a refused host may still send to be read and dropped, at least (a frame of
/// the maximum message size, if that is more).
const LINGER_BYTES: usize = 64 * 1024;

/// Why a session ended.
#[derive(Debug)]
enum End {
    /// The host closed the connection between frames.
    Closed,
    /// The host broke the protocol; it was told why.
    Misbehaved(String),
    /// The daemon is stopping.
    Shutdown,
    /// The socket failed.
    Io(io::Error),
}

/// The sending half of a host connection, shared with the threads that report worker exits.
struct HostLink {
    writer: Mutex<StreamWriter>,
    max: MaxMsgSize,
}

impl HostLink {
    fn send(&self, seq: u64, body: ControlMessage<'_>) -> io::Result<()> {
        let frame = FrameRepr { seq, body };
        let mut bytes = vec![0u8; frame.buffer_len()];
        let len = frame
            .emit(&mut bytes, self.max)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        let mut writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        writer.write_all(&bytes[..len])
    }

    fn send_error(&self, seq: u64, status: Status, reason: &str) -> io::Result<()> {
        let reason =
            urom_wire::truncate_at_char_boundary(reason, urom_wire::control::REASON_LEN - 1);
        self.send(seq, ControlMessage::Error(ErrorReply { status, reason }))
    }
}

impl HostEvents for HostLink {
    fn worker_exited(&self, exit: WorkerExit) {
        if let Err(e) = self.send(0, ControlMessage::WorkerExited(exit)) {
            debug!(
                "cannot tell a host that worker {} ended: {e}",
                exit.worker_id
            );
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    AwaitHello,
    AwaitAuth,
    Ready,
}

/// Who is at the other end of a connection.
#[derive(Debug, Clone)]
pub(crate) enum Client {
    /// A process on this machine, known by its socket's credentials.
    Local(Peer),
    /// A host on another machine, which must prove that it holds the shared secret.
    Remote {
        /// Its network address, for the log.
        address: String,
    },
}

/// Serves one host, `client`, admitted with `permit`, until it leaves or the daemon stops. A
/// host on another machine also holds its source address's place among the connections that
/// have not authenticated yet, `unproven`, until it does.
pub(crate) fn serve(
    service: &Service,
    host: HostId,
    (mut stream, mut writer): (StreamReader, StreamWriter),
    client: Client,
    (permit, unproven): (Permit, Option<Place<IpAddr>>),
) {
    let handshake_deadline = Instant::now() + HELLO_TIMEOUT;
    // The connection's place is given back when the session ends.
    let _permit = permit;
    let _ = writer.set_write_timeout(Some(WRITE_TIMEOUT));
    let _ = stream.set_read_timeout(Some(READ_POLL));
    let link = Arc::new(HostLink {
        writer: Mutex::new(writer),
        max: service.max_msg_size,
    });
    let owner = match &client {
        Client::Local(Peer { uid, pid }) => {
            info!(host, uid, pid, "host connected");
            Owner::local(*uid)
        }
        Client::Remote { address } => {
            info!(host, address, "remote host connected");
            // Nobody until it authenticates.
            Owner {
                uid: u32::MAX,
                remote: Some(String::new()),
            }
        }
    };
    let mut session = Session {
        service,
        host,
        client,
        owner,
        challenge: [0; urom_wire::control::AUTH_DATA_LEN],
        unproven,
        keys: None,
        sealings: 0,
        identity: String::new(),
        stream,
        link,
        buf: vec![0; service.max_msg_size.get()],
        state: State::AwaitHello,
        handshake_deadline,
        plugins: Vec::new(),
        status: StatusPager::default(),
    };
    let end = session.run();
    if session.state == State::Ready {
        service.registry.remove_host(host);
    }
    if matches!(end, End::Misbehaved(_)) {
        session.close_after_refusal();
    }
    match (end, &session.client) {
        // Anyone can reach a remote port: what never authenticated is logged at a bounded rate.
        (End::Misbehaved(why), Client::Remote { address }) if session.state != State::Ready => {
            let why = format!("remote host failed authentication: {why}");
            service.gate.log_refusal(address, &why);
        }
        (End::Closed, _) => info!(host, "host disconnected"),
        (End::Shutdown, _) => info!(host, "closing the host's connection: the service stops"),
        (End::Misbehaved(why), client) => warn!(host, ?client, "host disconnected: {why}"),
        (End::Io(e), _) => warn!(host, "host connection failed: {e}"),
    }
}

struct Session<'s> {
    service: &'s Service,
    host: HostId,
    client: Client,
    /// Who the host is once it authenticated.
    owner: Owner,
    /// The nonce of the authentication challenge.
    challenge: AuthBytes,
    /// A remote host's place among the connections not authenticated yet, until it is.
    unproven: Option<Place<IpAddr>>,
    /// A remote host's session keys, once it authenticated.
    keys: Option<SessionKeys>,
    /// Worker keys sealed for this session so far (each sealing's nonce).
    sealings: u64,
    /// The identity the host said hello with.
    identity: String,
    stream: StreamReader,
    link: Arc<HostLink>,
    buf: Vec<u8>,
    state: State,
    /// When a host that has not authenticated yet is given up on.
    handshake_deadline: Instant,
    plugins: Vec<PluginEntry>,
    /// The status report this host is reading in pages.
    status: StatusPager,
}

impl Session<'_> {
    fn run(&mut self) -> End {
        loop {
            let len = match self.read_frame() {
                Ok(len) => len,
                Err(end) => return end,
            };
            if let Err(end) = self.handle(len) {
                return end;
            }
        }
    }

    /// Reads one whole frame into `buf`; returns its length. Garbage is refused as soon as
    /// its header has arrived.
    fn read_frame(&mut self) -> Result<usize, End> {
        let max = self.service.max_msg_size;
        let mut have = 0;
        let mut started: Option<Instant> = None;
        loop {
            self.check_handshake_deadline()?;
            let need = match frame_length(&self.buf[..have], max) {
                Ok(Some(len)) => len,
                Ok(None) => FRAME_HEADER_LEN,
                Err(error) => {
                    let seq = header_seq(&self.buf[..have]);
                    return Err(self.refuse(seq, Status::InvalidValue, &error.to_string()));
                }
            };
            if have == need {
                return Ok(need);
            }
            match self.stream.read(&mut self.buf[have..need]) {
                Ok(0) if have == 0 => return Err(End::Closed),
                Ok(0) => {
                    return Err(End::Misbehaved(format!(
                        "closed halfway through a frame ({have} of {need} bytes)"
                    )));
                }
                Ok(n) => {
                    have += n;
                    started.get_or_insert_with(Instant::now);
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    if self.service.stopping.load(Ordering::Relaxed) {
                        return Err(End::Shutdown);
                    }
                    if started.is_some_and(|t| t.elapsed() > FRAME_DEADLINE) {
                        return Err(self.refuse(
                            0,
                            Status::TimeOut,
                            &format!("frame not completed within {FRAME_DEADLINE:?}"),
                        ));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(End::Io(e)),
            }
        }
    }

    /// Disconnects a host that has not authenticated within [`HELLO_TIMEOUT`], telling it why.
    fn check_handshake_deadline(&self) -> Result<(), End> {
        if self.state != State::Ready && Instant::now() > self.handshake_deadline {
            return Err(self.refuse(
                0,
                Status::TimeOut,
                &format!("no hello and authentication within {HELLO_TIMEOUT:?} of connecting"),
            ));
        }
        Ok(())
    }

    /// Tells the host why it is being disconnected.
    fn refuse(&self, seq: u64, status: Status, reason: &str) -> End {
        let _ = self.link.send_error(seq, status, reason);
        End::Misbehaved(reason.to_owned())
    }

    /// Ends the connection of a host that was refused, so that it reads the error reply and
    /// then the end of the stream: no more writes, then what the host still sends (the rest of
    /// a refused frame, requests sent after it) is read and dropped until the host closes, for
    /// at most [`LINGER`] and [`LINGER_BYTES`]. Closing a socket with unread bytes would reset
    /// the connection instead, and the host could lose the reply.
    fn close_after_refusal(&mut self) {
        self.link
            .writer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .shutdown();
        let deadline = Instant::now() + LINGER;
        let limit = LINGER_BYTES.max(self.buf.len());
        let mut dropped = 0;
        while dropped < limit && Instant::now() < deadline {
            match self.stream.read(&mut self.buf) {
                Ok(0) => return,
                Ok(n) => dropped += n,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    ) =>
                {
                    if self.service.stopping.load(Ordering::Relaxed) {
                        return;
                    }
                }
                Err(_) => return,
            }
        }
        debug!(
            host = self.host,
            "closing without waiting longer for the host to close ({dropped} bytes dropped)"
        );
    }

    fn handle(&mut self, len: usize) -> Result<(), End> {
        // The message borrows the buffer, the handlers borrow the session: lend the buffer out.
        let buf = std::mem::take(&mut self.buf);
        let handled = self.dispatch(&buf[..len]);
        self.buf = buf;
        handled
    }

    /// Handles one frame: the handshake's messages in their order, then requests.
    fn dispatch(&mut self, bytes: &[u8]) -> Result<(), End> {
        let frame = match FrameRepr::<ControlMessage>::parse(bytes, self.service.max_msg_size) {
            Ok(frame) => frame,
            Err(error) => {
                let seq = header_seq(bytes);
                return Err(self.refuse(seq, Status::InvalidValue, &error.to_string()));
            }
        };
        let seq = frame.seq;
        match (self.state, frame.body) {
            (State::AwaitHello, ControlMessage::Hello(hello)) => self.on_hello(seq, hello),
            (State::AwaitAuth, ControlMessage::AuthResponse(response)) => {
                self.on_peer_credentials(seq, response)
            }
            (State::AwaitAuth, ControlMessage::SecretProof(proof)) => {
                self.on_secret_proof(seq, proof)
            }
            (State::Ready, request) => self.on_request(seq, request),
            (state, body) => Err(self.unexpected(seq, state, &body)),
        }
    }

    /// The host's hello: checked, then answered with an authentication challenge.
    fn on_hello(&mut self, seq: u64, hello: Hello<'_>) -> Result<(), End> {
        let max = self.service.max_msg_size;
        if hello.protocol_version != PROTOCOL_VERSION {
            return Err(self.refuse(
                seq,
                Status::UnsupportedVersion,
                &format!(
                    "protocol version {} is not supported; the service speaks {PROTOCOL_VERSION}",
                    hello.protocol_version
                ),
            ));
        }
        if hello.max_msg_size != max.as_u32() {
            return Err(self.refuse(
                seq,
                Status::BadConfig,
                &format!(
                    "maximum message size {} does not match the service's {}",
                    hello.max_msg_size,
                    max.as_u32()
                ),
            ));
        }
        info!(host = self.host, identity = hello.identity, "hello");
        let method = match self.client {
            Client::Local(_) => AuthMethod::PeerCredentials,
            Client::Remote { .. } => AuthMethod::SharedSecret,
        };
        self.challenge = match auth::fresh_nonce() {
            Ok(nonce) => nonce,
            Err(e) => {
                return Err(self.refuse(
                    seq,
                    Status::OperatingSystem,
                    &format!("cannot draw a random challenge: {e}"),
                ));
            }
        };
        self.identity = hello.identity.to_owned();
        let challenge = AuthChallenge {
            method,
            nonce: self.challenge,
        };
        self.reply(seq, ControlMessage::AuthChallenge(challenge))?;
        self.state = State::AwaitAuth;
        Ok(())
    }

    /// A local host's answer to the challenge: its Unix credentials, read at accept, decide.
    fn on_peer_credentials(&mut self, seq: u64, response: AuthResponse) -> Result<(), End> {
        let Client::Local(peer) = &self.client else {
            return Err(self.refuse(
                seq,
                Status::Authentication,
                "a host on another machine must prove the shared secret",
            ));
        };
        if response.method != AuthMethod::PeerCredentials {
            return Err(self.refuse(
                seq,
                Status::Authentication,
                "only peer-credential authentication is offered on a local socket",
            ));
        }
        if !self.service.allows(peer.uid) {
            return Err(self.refuse(
                seq,
                Status::Authentication,
                &format!("user {} may not use this service", peer.uid),
            ));
        }
        self.authenticated();
        self.reply(seq, ControlMessage::Ack)?;
        Ok(())
    }

    /// A remote host's proof of the shared secret: checked, answered with the service's proof,
    /// and from then on the session travels in records with an integrity check.
    fn on_secret_proof(&mut self, seq: u64, proof: SecretProof) -> Result<(), End> {
        let max = self.service.max_msg_size;
        let (Client::Remote { address }, Some(remote)) = (&self.client, &self.service.remote)
        else {
            return Err(self.refuse(
                seq,
                Status::Authentication,
                "a local host authenticates with its Unix credentials",
            ));
        };
        let transcript = Transcript {
            service_nonce: &self.challenge,
            host_nonce: &proof.nonce,
            identity: &self.identity,
        };
        if !remote.secret.check_host_proof(&transcript, &proof.proof) {
            return Err(self.refuse(
                seq,
                Status::Authentication,
                "wrong proof of the shared secret: the host's key file differs from the service's",
            ));
        }
        let answer = ServiceProof {
            proof: remote.secret.service_proof(&transcript),
        };
        self.owner = Owner {
            uid: remote.uid,
            remote: Some(self.identity.clone()),
        };
        let keys = remote.secret.session_keys(&transcript);
        info!(
            host = self.host,
            address,
            identity = self.identity,
            "remote host authenticated"
        );
        self.authenticated();
        self.reply(seq, ControlMessage::ServiceProof(answer))?;
        // Everything after the proofs travels in records with an integrity check.
        let mut writer = self.link.writer.lock().unwrap_or_else(|p| p.into_inner());
        keys.seal(Side::Accepting, &mut self.stream, &mut writer, max);
        drop(writer);
        self.keys = Some(keys);
        Ok(())
    }

    /// A request of an authenticated host.
    fn on_request(&mut self, seq: u64, request: ControlMessage<'_>) -> Result<(), End> {
        match request {
            ControlMessage::PluginListRequest => {
                let infos: Vec<PluginInfo> = self
                    .plugins
                    .iter()
                    .map(|p| PluginInfo {
                        id: p.id.get(),
                        version: p.version,
                        name: &p.name,
                    })
                    .collect();
                self.reply(seq, ControlMessage::PluginListReply(List::new(&infos)))?;
            }
            ControlMessage::CpusetRequest => {
                self.reply(seq, ControlMessage::CpusetReply(self.service.cpuset))?;
            }
            ControlMessage::SpawnWorker(spawn) => {
                let request = SpawnRequest {
                    worker_id: spawn.worker_id,
                    plugins: PluginMask::from_bits_retain(spawn.plugins),
                    gid: spawn.gid,
                    cpuset: spawn.cpuset,
                    env: spawn.env.iter().map(str::to_owned).collect(),
                };
                let result = self.service.registry.spawn_or_attach(
                    self.host,
                    &self.owner,
                    &request,
                    &self.plugins,
                );
                match result.and_then(|worker| self.spawn_result(worker)) {
                    Ok((worker_id, endpoint, address)) => {
                        let result = SpawnResult {
                            worker_id,
                            endpoint,
                            address: &address,
                        };
                        self.reply(seq, ControlMessage::SpawnResult(result))?;
                    }
                    Err(error) => self.reply_error(seq, &error)?,
                }
            }
            ControlMessage::DestroyWorker { worker_id } => {
                match self
                    .service
                    .registry
                    .destroy(self.host, &self.owner, worker_id)
                {
                    Ok(()) => self.reply(seq, ControlMessage::Ack)?,
                    Err(error) => self.reply_error(seq, &error)?,
                }
            }
            ControlMessage::WorkersByGidRequest { gid } => {
                let ids = self.service.registry.by_gid(&self.owner, gid);
                self.reply(seq, ControlMessage::WorkersByGidReply(List::new(&ids)))?;
            }
            ControlMessage::StatusRequest { cursor } => {
                match self.status.page(self.service, &self.owner, cursor) {
                    Ok((records, next_cursor)) => {
                        let records = List::new(&records);
                        let reply = StatusReply {
                            next_cursor,
                            records,
                        };
                        self.link
                            .send(seq, ControlMessage::StatusReply(reply))
                            .map_err(End::Io)?;
                    }
                    Err(error) => self.reply_error(seq, &error)?,
                }
            }
            other => return Err(self.unexpected(seq, State::Ready, &other)),
        }
        Ok(())
    }

    /// Refuses a message that has no place in `state`.
    fn unexpected(&self, seq: u64, state: State, body: &ControlMessage<'_>) -> End {
        let kind = urom_wire::Body::kind(body);
        let status = if state == State::Ready {
            Status::BadState
        } else {
            Status::Authentication
        };
        self.refuse(
            seq,
            status,
            &format!("unexpected {kind:?} message while {}", state.describe()),
        )
    }

    /// How the host reaches `worker`: its Unix socket from this machine; from another, its UCX
    /// listener, with its key sealed for this session.
    fn spawn_result(
        &mut self,
        worker: Reachable,
    ) -> Result<(u64, EndpointKind, Vec<u8>), ServiceError> {
        let (Client::Remote { .. }, Some(keys)) = (&self.client, &self.keys) else {
            let address = worker.socket.as_os_str().as_encoded_bytes().to_vec();
            return Ok((worker.id, EndpointKind::UnixSocket, address));
        };
        let ucx = worker.ucx.ok_or_else(|| {
            ServiceError::new(
                Status::NotSupported,
                format!("worker {} does not listen over UCX", worker.id),
            )
        })?;
        let sealed = SealedUcxAddress {
            sealed_key: keys.seal_worker_key(worker.id, self.sealings, &ucx.key),
            listener: &ucx.listener,
        };
        self.sealings += 1;
        let mut address = vec![0; sealed.encoded_len()];
        sealed
            .emit(&mut address)
            .expect("the buffer has the address's length");
        Ok((worker.id, EndpointKind::UcxSealed, address))
    }

    /// The host proved who it is: it may make requests now.
    fn authenticated(&mut self) {
        self.unproven = None;
        self.service
            .registry
            .add_host(self.host, Arc::clone(&self.link) as Arc<dyn HostEvents>);
        self.plugins = self.service.discover();
        self.state = State::Ready;
    }

    fn reply(&self, seq: u64, body: ControlMessage<'_>) -> Result<(), End> {
        self.link.send(seq, body).map_err(End::Io)
    }

    fn reply_error(&self, seq: u64, error: &ServiceError) -> Result<(), End> {
        info!(host = self.host, status = %error.status, "request refused: {}", error.reason);
        self.link
            .send_error(seq, error.status, &error.reason)
            .map_err(End::Io)
    }
}

impl State {
    fn describe(self) -> &'static str {
        match self {
            State::AwaitHello => "waiting for hello",
            State::AwaitAuth => "waiting for authentication",
            State::Ready => "serving requests",
        }
    }
}

/// The sequence number of a frame header, or 0 when there is none.
fn header_seq(bytes: &[u8]) -> u64 {
    urom_wire::frame::peek_seq(bytes).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::path::PathBuf;

    use urom_host::{Service as HostService, ServiceStartError};
    use urom_transport::auth::SharedSecret;
    use urom_transport::shm::ShmConnection;
    use urom_transport::{Channel, ChannelConfig};
    use urom_wire::CpuSet;

    use super::*;
    use std::sync::atomic::AtomicBool;

    use crate::RemoteHosts;
    use crate::discovery::Discovery;
    use crate::gate::{Gate, Limits};
    use crate::registry::{Registry, WorkerConfig};

    const SECRET: &[u8] = b"the service's shared secret";

    fn service(dir: &std::path::Path) -> Arc<Service> {
        let config = WorkerConfig {
            worker_bin: PathBuf::from("urom-worker"),
            max_msg_size: MaxMsgSize::DEFAULT,
            log_dir: dir.to_owned(),
            log_level: 50,
            socket_dir: dir.to_owned(),
            cpuset: "0".parse::<CpuSet>().unwrap(),
            max_workers: 4,
            busy_poll: false,
            ucx_listen: None,
            hugepages: urom_transport::shm::HugePages::Never,
        };
        Arc::new(Service {
            max_msg_size: MaxMsgSize::DEFAULT,
            cpuset: config.cpuset,
            gate: Arc::new(Gate::new(
                Vec::new(),
                Limits {
                    total: 8,
                    per_user: 8,
                },
            )),
            discovery: Discovery::new(PathBuf::from("urom-daemon")),
            registry: Arc::new(Registry::new(config)),
            remote: Some(RemoteHosts::new(SharedSecret::from_bytes(SECRET), 0)),
            stopping: AtomicBool::new(false),
            started_at: std::time::Instant::now(),
            socket: dir.join("urom.sock"),
            metrics: None,
            ucx_listen: std::sync::OnceLock::new(),
            hugepages: urom_transport::shm::HugePages::Never,
            max_workers: 4,
        })
    }

    /// A host on the other end of a channel to a remote session, with `key` in its key file.
    fn remote_host(
        key: &[u8],
        dir: &std::path::Path,
    ) -> Result<HostService<urom_host::Running>, ServiceStartError> {
        let service = service(dir);
        let config = ChannelConfig::default();
        let (daemon_end, host_end) = ShmConnection::pair(&config).unwrap();
        let permit = service.gate.permit(0).unwrap();
        std::thread::spawn(move || {
            let client = Client::Remote {
                address: "test".into(),
            };
            let halves = urom_transport::stream::split_channel(daemon_end.into());
            serve(&service, 1, halves, client, (permit, None));
        });
        let key_file = dir.join("key");
        std::fs::write(&key_file, key).unwrap();
        std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600)).unwrap();
        HostService::new()
            .set_key_file(&key_file)
            .set_identity("rank-0")
            .start_on(Channel::from(host_end))
            .map_err(|(_, e)| e)
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("urom-session-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_remote_host_with_the_secret_is_served() {
        let dir = temp_dir("right");
        let service = remote_host(SECRET, &dir).expect("the host authenticates");
        assert_eq!(service.cpuset(), "0".parse::<CpuSet>().unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_remote_host_with_another_secret_is_refused() {
        let dir = temp_dir("wrong");
        let error = remote_host(b"not the service's shared secret", &dir)
            .err()
            .expect("refused");
        let text = error.to_string();
        assert!(
            matches!(
                error,
                ServiceStartError::Control(urom_host::ControlError::Refused {
                    status: Status::Authentication,
                    ..
                })
            ),
            "{text}"
        );
        assert!(text.contains("wrong proof of the shared secret"), "{text}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
