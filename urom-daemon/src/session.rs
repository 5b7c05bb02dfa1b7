//! One host connection's protocol: hello, authentication, then requests until the host leaves.
//!
//! A session never blocks: the event loop ([`crate::event_loop`]) hands it each whole frame the
//! host sent, and it answers into the connection's write queue at once, or, for what may take a
//! while (discovering plugins at authentication, spawning, destroying, the status report), hands
//! a job to the daemon's pool and answers when the job is done (a spawn's, once the new worker
//! listens; a destroy's, once the worker has ended); meanwhile the connection reads nothing more, so its requests are answered in order. A host that sends garbage, stops halfway
//! through a frame or floods the socket only ever delays itself; it is answered with an error and
//! disconnected. A connection that has not said hello and authenticated within [`HELLO_TIMEOUT`]
//! of being accepted is answered with an error and closed.

use std::io;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{info, warn};

use urom_plugin::plugin_id::PluginMask;
use urom_transport::auth::{self, AuthBytes, SessionKeys, Transcript};
use urom_wire::control::{
    AuthChallenge, AuthMethod, AuthResponse, ControlMessage, ErrorReply, Hello, PluginInfo,
    SealedUcxAddress, SecretProof, ServiceProof, SpawnResult, StatusReply,
};
use urom_wire::{FrameRepr, List, MaxMsgSize, PROTOCOL_VERSION, Status};

use crate::Service;
use crate::discovery::PluginEntry;
use crate::event_loop::{Done, HostLink, Io, Job, LoopWake};
use crate::gate::{HELLO_TIMEOUT, Peer, Permit, Place};
use crate::registry::{
    DestroyReply, HostEvents, HostId, Owner, Reachable, ServiceError, SpawnReply, SpawnRequest,
};
use crate::status::StatusPager;

/// How long a host may take to finish a frame it started.
pub(crate) const FRAME_DEADLINE: Duration = Duration::from_secs(10);

/// Why a session ended.
#[derive(Debug)]
pub(crate) enum End {
    /// The host closed the connection between frames.
    Closed,
    /// The host broke the protocol; it was told why.
    Misbehaved(String),
    /// The daemon is stopping.
    Shutdown,
    /// The socket failed, or the host does not read what it is sent.
    Io(io::Error),
}

/// What handling a frame left to do.
pub(crate) enum Step {
    /// Nothing: read the next frame.
    Next,
    /// Run this job on the pool; the session goes on when it is done.
    Job(Job),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
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

/// An authentication that checked, waiting for plugin discovery before it is answered.
enum PendingAuth {
    /// A local host's: answered with an acknowledgement.
    Local { seq: u64 },
    /// A remote host's: answered with the service's proof, then sealed.
    Remote {
        seq: u64,
        answer: ServiceProof,
        keys: SessionKeys,
    },
}

/// One host's session.
pub(crate) struct Session {
    service: Arc<Service>,
    host: HostId,
    pub(crate) client: Client,
    /// Who the host is once it authenticated.
    owner: Owner,
    /// The nonce of the authentication challenge.
    challenge: AuthBytes,
    /// A remote host's place among the connections not authenticated yet, until it is.
    unproven: Option<Place<IpAddr>>,
    /// The connection's place within the bounds, given back with the session.
    _permit: Permit,
    /// A remote host's session keys, once it authenticated.
    keys: Option<Box<SessionKeys>>,
    /// Worker keys sealed for this session so far (each sealing's nonce).
    sealings: u64,
    /// The identity the host said hello with.
    identity: String,
    pub(crate) state: State,
    /// When a host that has not authenticated yet is given up on.
    pub(crate) handshake_deadline: Instant,
    plugins: Arc<Vec<PluginEntry>>,
    /// The status report this host is reading in pages (with a job while one runs).
    status: StatusPager,
    pending_auth: Option<Box<PendingAuth>>,
    /// Where worker exits are reported to the event loop.
    wake: Arc<LoopWake>,
}

impl Session {
    /// A session for host `host`, `client`, admitted with `permit`; a host on another machine
    /// also holds its source address's place among the connections that have not
    /// authenticated yet, `unproven`, until it does.
    pub(crate) fn new(
        service: &Arc<Service>,
        host: HostId,
        client: Client,
        (permit, unproven): (Permit, Option<Place<IpAddr>>),
        wake: &Arc<LoopWake>,
    ) -> Self {
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
        Self {
            service: Arc::clone(service),
            host,
            client,
            owner,
            challenge: [0; urom_wire::control::AUTH_DATA_LEN],
            unproven,
            _permit: permit,
            keys: None,
            sealings: 0,
            identity: String::new(),
            state: State::AwaitHello,
            handshake_deadline: Instant::now() + HELLO_TIMEOUT,
            plugins: Arc::default(),
            status: StatusPager::default(),
            pending_auth: None,
            wake: Arc::clone(wake),
        }
    }

    /// Logs how the session ended; a host that was served is forgotten by the registry (which
    /// may stop workers: a job for the pool, returned).
    pub(crate) fn finish(&self, end: &End) -> Option<Job> {
        let host = self.host;
        match (end, &self.client) {
            // Anyone can reach a remote port: what never authenticated is logged at a bounded rate.
            (End::Misbehaved(why), Client::Remote { address }) if self.state != State::Ready => {
                let why = format!("remote host failed authentication: {why}");
                self.service.gate.log_refusal(address, &why);
            }
            (End::Closed, _) => info!(host, "host disconnected"),
            (End::Shutdown, _) => info!(host, "closing the host's connection: the service stops"),
            (End::Misbehaved(why), client) => warn!(host, ?client, "host disconnected: {why}"),
            (End::Io(e), _) => warn!(host, "host connection failed: {e}"),
        }
        if self.state != State::Ready || matches!(end, End::Shutdown) {
            return None;
        }
        let service = Arc::clone(&self.service);
        Some(Box::new(move || {
            service.registry.remove_host(host);
            None
        }))
    }

    /// Tells the host why it is being disconnected.
    pub(crate) fn refuse(&self, io: &mut Io, seq: u64, status: Status, reason: &str) -> End {
        let reason_text =
            urom_wire::truncate_at_char_boundary(reason, urom_wire::control::REASON_LEN - 1);
        let _ = io.send(
            seq,
            ControlMessage::Error(ErrorReply {
                status,
                reason: reason_text,
            }),
        );
        End::Misbehaved(reason.to_owned())
    }

    /// Handles one frame: the handshake's messages in their order, then requests.
    pub(crate) fn dispatch(&mut self, io: &mut Io, bytes: &[u8]) -> Result<Step, End> {
        let max = self.service.max_msg_size;
        let frame = match FrameRepr::<ControlMessage>::parse(bytes, max) {
            Ok(frame) => frame,
            Err(error) => {
                let seq = header_seq(bytes);
                return Err(self.refuse(io, seq, Status::InvalidValue, &error.to_string()));
            }
        };
        let seq = frame.seq;
        match (self.state, frame.body) {
            (State::AwaitHello, ControlMessage::Hello(hello)) => self.on_hello(io, seq, hello),
            (State::AwaitAuth, ControlMessage::AuthResponse(response))
                if self.pending_auth.is_none() =>
            {
                self.on_peer_credentials(io, seq, response)
            }
            (State::AwaitAuth, ControlMessage::SecretProof(proof))
                if self.pending_auth.is_none() =>
            {
                self.on_secret_proof(io, seq, proof)
            }
            (State::Ready, request) => self.on_request(io, seq, request),
            (state, body) => Err(self.unexpected(io, seq, state, &body)),
        }
    }

    /// A job of this session is done: answers the host.
    pub(crate) fn complete(&mut self, io: &mut Io, done: Done) -> Result<(), End> {
        match done {
            Done::Authenticated(plugins) => {
                self.plugins = plugins;
                self.unproven = None;
                let link = Arc::new(HostLink::new(self.host, &self.wake));
                self.service
                    .registry
                    .add_host(self.host, link as Arc<dyn HostEvents>);
                self.state = State::Ready;
                match self.pending_auth.take().map(|pending| *pending) {
                    Some(PendingAuth::Local { seq }) => self.reply(io, seq, ControlMessage::Ack),
                    Some(PendingAuth::Remote { seq, answer, keys }) => {
                        self.reply(io, seq, ControlMessage::ServiceProof(answer))?;
                        // Everything after the proofs travels in records with an integrity
                        // check.
                        io.seal(&keys, self.service.max_msg_size);
                        self.keys = Some(Box::new(keys));
                        Ok(())
                    }
                    None => Ok(()),
                }
            }
            Done::Spawned { seq, result } => {
                match result.and_then(|worker| self.spawn_result(worker)) {
                    Ok((worker_id, endpoint, address)) => {
                        let result = SpawnResult {
                            worker_id,
                            endpoint,
                            address: &address,
                        };
                        self.reply(io, seq, ControlMessage::SpawnResult(result))
                    }
                    Err(error) => self.reply_error(io, seq, &error),
                }
            }
            Done::Destroyed { seq, result } => match result {
                Ok(()) => self.reply(io, seq, ControlMessage::Ack),
                Err(error) => self.reply_error(io, seq, &error),
            },
            Done::Status { seq, pager, frame } => {
                self.status = pager;
                match frame {
                    Ok(bytes) => io.send_encoded(&bytes).map_err(End::Io),
                    Err(error) => self.reply_error(io, seq, &error),
                }
            }
        }
    }

    /// The host's hello: checked, then answered with an authentication challenge.
    fn on_hello(&mut self, io: &mut Io, seq: u64, hello: Hello<'_>) -> Result<Step, End> {
        let max = self.service.max_msg_size;
        if hello.protocol_version != PROTOCOL_VERSION {
            return Err(self.refuse(
                io,
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
                io,
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
                    io,
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
        self.reply(io, seq, ControlMessage::AuthChallenge(challenge))?;
        self.state = State::AwaitAuth;
        Ok(Step::Next)
    }

    /// A local host's answer to the challenge: its Unix credentials, read at accept, decide.
    fn on_peer_credentials(
        &mut self,
        io: &mut Io,
        seq: u64,
        response: AuthResponse,
    ) -> Result<Step, End> {
        let Client::Local(peer) = &self.client else {
            return Err(self.refuse(
                io,
                seq,
                Status::Authentication,
                "a host on another machine must prove the shared secret",
            ));
        };
        if response.method != AuthMethod::PeerCredentials {
            return Err(self.refuse(
                io,
                seq,
                Status::Authentication,
                "only peer-credential authentication is offered on a local socket",
            ));
        }
        if !self.service.allows(peer.uid) {
            let reason = format!("user {} may not use this service", peer.uid);
            return Err(self.refuse(io, seq, Status::Authentication, &reason));
        }
        Ok(self.authenticated(PendingAuth::Local { seq }))
    }

    /// A remote host's proof of the shared secret: checked, answered with the service's proof,
    /// and from then on the session travels in records with an integrity check.
    fn on_secret_proof(&mut self, io: &mut Io, seq: u64, proof: SecretProof) -> Result<Step, End> {
        let (Client::Remote { address }, Some(remote)) = (&self.client, &self.service.remote)
        else {
            return Err(self.refuse(
                io,
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
                io,
                seq,
                Status::Authentication,
                "wrong proof of the shared secret: the host's key file differs from the service's",
            ));
        }
        let answer = ServiceProof {
            proof: remote.secret.service_proof(&transcript),
        };
        let keys = remote.secret.session_keys(&transcript);
        info!(
            host = self.host,
            address,
            identity = self.identity,
            "remote host authenticated"
        );
        self.owner = Owner {
            uid: remote.uid,
            remote: Some(self.identity.clone()),
        };
        Ok(self.authenticated(PendingAuth::Remote { seq, answer, keys }))
    }

    /// The host proved who it is: it may make requests once the plugins it is offered are
    /// known (a job: probes may still be running).
    fn authenticated(&mut self, pending: PendingAuth) -> Step {
        self.pending_auth = Some(Box::new(pending));
        let service = Arc::clone(&self.service);
        Step::Job(Box::new(move || {
            Some(Done::Authenticated(Arc::new(service.discover())))
        }))
    }

    /// A request of an authenticated host.
    fn on_request(
        &mut self,
        io: &mut Io,
        seq: u64,
        request: ControlMessage<'_>,
    ) -> Result<Step, End> {
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
                self.reply(io, seq, ControlMessage::PluginListReply(List::new(&infos)))?;
            }
            ControlMessage::CpusetRequest => {
                self.reply(io, seq, ControlMessage::CpusetReply(self.service.cpuset))?;
            }
            ControlMessage::SpawnWorker(spawn) => {
                let request = SpawnRequest {
                    worker_id: spawn.worker_id,
                    plugins: PluginMask::from_bits_retain(spawn.plugins),
                    gid: spawn.gid,
                    cpuset: spawn.cpuset,
                    env: spawn.env.iter().map(str::to_owned).collect(),
                };
                let (service, host) = (Arc::clone(&self.service), self.host);
                let (owner, plugins) = (self.owner.clone(), Arc::clone(&self.plugins));
                let wake = Arc::clone(&self.wake);
                // The job ends once the worker is started; the thread that awaits its socket
                // answers, and the connection stays busy until then.
                return Ok(Step::Job(Box::new(move || {
                    let reply = SpawnReply::new(move |result| {
                        wake.done(host, Done::Spawned { seq, result });
                    });
                    service
                        .registry
                        .spawn_or_attach(host, &owner, &request, &plugins, reply);
                    None
                })));
            }
            ControlMessage::DestroyWorker { worker_id } => {
                let (service, host, owner) =
                    (Arc::clone(&self.service), self.host, self.owner.clone());
                let wake = Arc::clone(&self.wake);
                // The job ends once the worker is told to stop; the thread that awaits
                // stopping workers answers once it has ended, and the connection stays busy
                // until then.
                return Ok(Step::Job(Box::new(move || {
                    let reply = DestroyReply::new(move |result| {
                        wake.done(host, Done::Destroyed { seq, result });
                    });
                    service.registry.destroy(host, &owner, worker_id, reply);
                    None
                })));
            }
            ControlMessage::WorkersByGidRequest { gid } => {
                let ids = self.service.registry.by_gid(&self.owner, gid);
                self.reply(io, seq, ControlMessage::WorkersByGidReply(List::new(&ids)))?;
            }
            ControlMessage::StatusRequest { cursor } => {
                let mut pager = std::mem::take(&mut self.status);
                let (service, owner) = (Arc::clone(&self.service), self.owner.clone());
                return Ok(Step::Job(Box::new(move || {
                    let frame =
                        pager
                            .page(&service, &owner, cursor)
                            .and_then(|(records, next_cursor)| {
                                let reply = StatusReply {
                                    next_cursor,
                                    records: List::new(&records),
                                };
                                encode(
                                    seq,
                                    ControlMessage::StatusReply(reply),
                                    service.max_msg_size,
                                )
                                .map_err(|e| ServiceError::new(Status::InvalidValue, e.to_string()))
                            });
                    Some(Done::Status { seq, pager, frame })
                })));
            }
            other => return Err(self.unexpected(io, seq, State::Ready, &other)),
        }
        Ok(Step::Next)
    }

    /// Refuses a message that has no place in `state`.
    fn unexpected(&self, io: &mut Io, seq: u64, state: State, body: &ControlMessage<'_>) -> End {
        let kind = urom_wire::Body::kind(body);
        let status = if state == State::Ready {
            Status::BadState
        } else {
            Status::Authentication
        };
        self.refuse(
            io,
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
    ) -> Result<(u64, urom_wire::control::EndpointKind, Vec<u8>), ServiceError> {
        use urom_wire::control::EndpointKind;
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

    fn reply(&self, io: &mut Io, seq: u64, body: ControlMessage<'_>) -> Result<(), End> {
        io.send(seq, body).map_err(End::Io)
    }

    fn reply_error(&self, io: &mut Io, seq: u64, error: &ServiceError) -> Result<(), End> {
        info!(host = self.host, status = %error.status, "request refused: {}", error.reason);
        let reason =
            urom_wire::truncate_at_char_boundary(&error.reason, urom_wire::control::REASON_LEN - 1);
        let body = ControlMessage::Error(ErrorReply {
            status: error.status,
            reason,
        });
        io.send(seq, body).map_err(End::Io)
    }
}

/// `body` as a frame with sequence number `seq`.
pub(crate) fn encode(seq: u64, body: ControlMessage<'_>, max: MaxMsgSize) -> io::Result<Vec<u8>> {
    let frame = FrameRepr { seq, body };
    let mut bytes = vec![0u8; frame.buffer_len()];
    let len = frame
        .emit(&mut bytes, max)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    bytes.truncate(len);
    Ok(bytes)
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
pub(crate) fn header_seq(bytes: &[u8]) -> u64 {
    urom_wire::frame::peek_seq(bytes).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::path::PathBuf;

    use std::io::Write;
    use std::os::unix::net::UnixStream;
    use std::sync::atomic::AtomicBool;

    use urom_host::{Service as HostService, ServiceStartError};
    use urom_testkit::control::ControlClient;
    use urom_transport::auth::SharedSecret;
    use urom_wire::CpuSet;

    use super::*;

    use crate::RemoteHosts;
    use crate::discovery::Discovery;
    use crate::event_loop::EventLoop;
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
                vec![nix::unistd::geteuid().as_raw()],
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

    /// A daemon's event loop serving `dir/urom.sock` and a front door, on a thread until the
    /// returned stop socket is written to; the front door's address.
    fn start_loop(
        dir: &std::path::Path,
    ) -> (
        std::net::SocketAddr,
        (UnixStream, std::thread::JoinHandle<()>),
    ) {
        let service = service(dir);
        let listener = std::os::unix::net::UnixListener::bind(dir.join("urom.sock")).unwrap();
        let front_door = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = front_door.local_addr().unwrap();
        let (stop, stop_end) = UnixStream::pair().unwrap();
        let event_loop = EventLoop::new(&service, listener, Some(front_door), stop_end).unwrap();
        let running = std::thread::spawn(move || event_loop.run());
        (address, (stop, running))
    }

    /// A host with `key` in its key file connecting to a daemon's front door.
    fn remote_host(
        key: &[u8],
        dir: &std::path::Path,
    ) -> (
        Result<HostService<urom_host::Running>, ServiceStartError>,
        (UnixStream, std::thread::JoinHandle<()>),
    ) {
        let (address, running) = start_loop(dir);
        let key_file = dir.join("key");
        std::fs::write(&key_file, key).unwrap();
        std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let host = HostService::new()
            .set_key_file(&key_file)
            .set_identity("rank-0")
            .set_remote(address.to_string())
            .start()
            .map_err(|(_, e)| e);
        (host, running)
    }

    fn stop((mut stop, running): (UnixStream, std::thread::JoinHandle<()>)) {
        stop.write_all(b"x").unwrap();
        running.join().unwrap();
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("urom-session-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    #[cfg_attr(
        not(feature = "ucx"),
        ignore = "the host library reaches a service on another machine only when built with ucx"
    )]
    fn a_remote_host_with_the_secret_is_served() {
        let dir = temp_dir("right");
        let (service, running) = remote_host(SECRET, &dir);
        let service = service.expect("the host authenticates");
        assert_eq!(service.cpuset(), "0".parse::<CpuSet>().unwrap());
        drop(service);
        stop(running);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    #[cfg_attr(
        not(feature = "ucx"),
        ignore = "the host library reaches a service on another machine only when built with ucx"
    )]
    fn a_remote_host_with_another_secret_is_refused() {
        let dir = temp_dir("wrong");
        let (service, running) = remote_host(b"not the service's shared secret", &dir);
        let error = service.err().expect("refused");
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
        stop(running);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_remote_host_that_stalls_halfway_through_a_record_is_dropped_and_delays_no_other() {
        let dir = temp_dir("stall");
        let (address, running) = start_loop(&dir);
        let max = MaxMsgSize::DEFAULT;
        let stream = std::net::TcpStream::connect(address).unwrap();
        let raw = stream.try_clone().unwrap();
        let mut halves = urom_transport::stream::split_tcp(stream).unwrap();
        let hello = Hello {
            protocol_version: PROTOCOL_VERSION,
            max_msg_size: max.as_u32(),
            identity: "rank-0",
        };
        let hello = encode(1, ControlMessage::Hello(hello), max).unwrap();
        halves.1.write_all(&hello).unwrap();
        let secret = SharedSecret::from_bytes(SECRET);
        auth::prove(&mut halves, max, &secret, "rank-0", Duration::from_secs(10)).unwrap();
        // A record whose length says 100 bytes, of which 10 come.
        (&raw).write_all(&[100, 0, 0, 0, 1, 2, 3, 4, 5, 6]).unwrap();

        // A host on this machine is served meanwhile.
        let mut local = ControlClient::connect(&dir.join("urom.sock"), Duration::from_secs(10))
            .expect("connecting to the daemon");
        local.handshake().expect("the local host authenticates");
        assert_eq!(local.cpuset(), "0".parse::<CpuSet>().unwrap());
        assert!(local.plugins().is_empty());

        // The stalled record is given up on like a stalled frame, in a sealed reply.
        let mut buf = Vec::new();
        let deadline = Some(Instant::now() + Duration::from_secs(60));
        let len = urom_transport::stream::read_frame(&mut halves.0, &mut buf, max, deadline)
            .expect("the daemon answered before the test gave up");
        let frame = FrameRepr::<ControlMessage>::parse(&buf[..len], max).unwrap();
        let ControlMessage::Error(error) = frame.body else {
            panic!("not an error reply: {:?}", frame.body);
        };
        assert_eq!(error.status, Status::TimeOut, "{}", error.reason);
        assert!(
            error.reason.contains("frame not completed"),
            "{}",
            error.reason
        );
        assert_eq!(local.cpuset(), "0".parse::<CpuSet>().unwrap());
        stop(running);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
