//! Shared-secret authentication of remote peers.
//!
//! A host on another machine cannot be identified by Unix credentials, so it and the service
//! prove to each other that they hold the same secret, read from a key file on each side. The
//! exchange, over the control channel:
//!
//! ```text
//! host    -> service  Hello { identity }
//! service -> host     AuthChallenge { SharedSecret, service nonce }
//! host    -> service  SecretProof { host nonce, HMAC(secret, "urom host proof" | transcript) }
//! service -> host     ServiceProof { HMAC(secret, "urom service proof" | transcript) }
//! transcript = service nonce | host nonce | identity length (u8) | identity
//! ```
//!
//! Each side picks a fresh 32-byte nonce per session, so neither proof can be replayed to the
//! other side or to a later session; the two labels keep a proof from being reflected back as the
//! other side's. Proofs are HMAC-SHA256 and compared in constant time.
//!
//! A worker that serves remote hosts has a key of its own, which its daemon made and gave it
//! when it started it. The daemon hands that key to each remote host it lets use the worker,
//! sealed with a pad only that host can compute ([`SharedSecret::worker_key_pad`]: a keyed hash
//! of the session's transcript and the worker's id), and the host then runs the same exchange
//! with the worker on the fresh data channel ([`challenge`] on the worker's side, [`prove`] on
//! the host's) before any command. So a worker serves only hosts its daemon vouched for, and an
//! eavesdropper learns nothing it could use.

use std::fmt;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::transport::{FrameReceiver, FrameSender, Transport};
use crate::wire::control::{
    AUTH_DATA_LEN, AuthChallenge, AuthMethod, ControlMessage, ErrorReply, SecretProof, ServiceProof,
};
use crate::wire::{FrameRepr, MaxMsgSize, Status};

/// The environment variable naming the key file of a host that talks to a remote service.
pub const KEY_FILE_VAR: &str = "UROM_KEY_FILE";
/// The fewest bytes a secret may have.
pub const MIN_SECRET_LEN: usize = 16;
/// Length of a worker key.
pub const AUTH_KEY_LEN: usize = AUTH_DATA_LEN;
/// The most bytes of a key file that are read.
const MAX_KEY_FILE_LEN: u64 = 4096;

const HOST_LABEL: &[u8] = b"urom host proof v1";
const SERVICE_LABEL: &[u8] = b"urom service proof v1";
const WORKER_KEY_LABEL: &[u8] = b"urom worker key v1";

/// A nonce or a proof.
pub type AuthBytes = [u8; AUTH_DATA_LEN];

/// The secret both sides of a remote connection hold. Never printed.
#[derive(Clone)]
pub struct SharedSecret(Vec<u8>);

impl fmt::Debug for SharedSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SharedSecret({} bytes)", self.0.len())
    }
}

/// Why a key file cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyFileError {
    /// It could not be opened or read.
    Unreadable {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        reason: String,
    },
    /// Users other than its owner may read or write it.
    Exposed {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// It belongs to a user other than the one reading it (or root).
    WrongOwner {
        /// The file.
        path: PathBuf,
        /// Its owner.
        owner: u32,
    },
    /// The secret in it is too short (surrounding white space is not counted).
    TooShort {
        /// The file.
        path: PathBuf,
        /// Bytes of secret found.
        len: usize,
    },
}

impl fmt::Display for KeyFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unreadable { path, reason } => {
                write!(f, "cannot read key file {}: {reason}", path.display())
            }
            Self::Exposed { path, mode } => write!(
                f,
                "key file {} may be read or written by other users (mode {:o}); run chmod 600 on it",
                path.display(),
                mode & 0o777
            ),
            Self::WrongOwner { path, owner } => write!(
                f,
                "key file {} belongs to user {owner}, not to this process's user or root",
                path.display()
            ),
            Self::TooShort { path, len } => write!(
                f,
                "key file {} holds a secret of {len} bytes; at least {MIN_SECRET_LEN} are needed \
                 (make one with: head -c 32 /dev/urandom | base64 > FILE)",
                path.display()
            ),
        }
    }
}

impl std::error::Error for KeyFileError {}

impl SharedSecret {
    /// Reads the secret from `path`: its contents without surrounding white space. The file
    /// must belong to this process's user or to root and be neither readable nor writable by
    /// anyone else, like an ssh private key.
    pub fn read(path: &Path) -> Result<Self, KeyFileError> {
        let unreadable = |e: std::io::Error| KeyFileError::Unreadable {
            path: path.to_owned(),
            reason: e.to_string(),
        };
        let file = std::fs::File::open(path).map_err(unreadable)?;
        let meta = file.metadata().map_err(unreadable)?;
        if meta.mode() & 0o077 != 0 {
            return Err(KeyFileError::Exposed {
                path: path.to_owned(),
                mode: meta.mode(),
            });
        }
        let me = nix::unistd::geteuid().as_raw();
        if meta.uid() != me && meta.uid() != 0 {
            return Err(KeyFileError::WrongOwner {
                path: path.to_owned(),
                owner: meta.uid(),
            });
        }
        let mut contents = Vec::new();
        file.take(MAX_KEY_FILE_LEN)
            .read_to_end(&mut contents)
            .map_err(unreadable)?;
        let secret = contents.trim_ascii();
        if secret.len() < MIN_SECRET_LEN {
            return Err(KeyFileError::TooShort {
                path: path.to_owned(),
                len: secret.len(),
            });
        }
        Ok(Self(secret.to_vec()))
    }

    /// A secret from bytes, for tests and for programs that keep it elsewhere.
    pub fn from_bytes(secret: &[u8]) -> Self {
        Self(secret.to_vec())
    }

    /// The host's proof for a session.
    pub fn host_proof(&self, transcript: &Transcript<'_>) -> AuthBytes {
        self.proof(HOST_LABEL, transcript)
    }

    /// The service's proof for a session.
    pub fn service_proof(&self, transcript: &Transcript<'_>) -> AuthBytes {
        self.proof(SERVICE_LABEL, transcript)
    }

    /// Whether `proof` is the host's proof for this session; constant time.
    pub fn check_host_proof(&self, transcript: &Transcript<'_>, proof: &AuthBytes) -> bool {
        self.check(HOST_LABEL, transcript, proof)
    }

    /// Whether `proof` is the service's proof for this session; constant time.
    pub fn check_service_proof(&self, transcript: &Transcript<'_>, proof: &AuthBytes) -> bool {
        self.check(SERVICE_LABEL, transcript, proof)
    }

    /// The pad that seals a worker's key for the host of this session: the daemon sends
    /// `key ^ pad`, and only a holder of the secret who took part in the session can compute
    /// the pad again ([`seal`] both seals and opens).
    pub fn worker_key_pad(&self, transcript: &Transcript<'_>, worker_id: u64) -> AuthBytes {
        let mut mac = self.mac(WORKER_KEY_LABEL, transcript);
        mac.update(&worker_id.to_le_bytes());
        mac.finalize().into_bytes().into()
    }

    /// A host's answer to a challenge with `service_nonce`: a fresh nonce of its own and the
    /// host's proof over both.
    pub fn answer(
        &self,
        service_nonce: &AuthBytes,
        identity: &str,
    ) -> Result<SecretProof, getrandom::Error> {
        let nonce = fresh_nonce()?;
        let transcript = Transcript {
            service_nonce,
            host_nonce: &nonce,
            identity,
        };
        Ok(SecretProof {
            nonce,
            proof: self.host_proof(&transcript),
        })
    }

    /// This secret's bytes as a worker key, when it is one (exactly 32 bytes).
    pub fn as_worker_key(&self) -> Option<&AuthBytes> {
        self.0.as_slice().try_into().ok()
    }

    fn mac(&self, label: &[u8], transcript: &Transcript<'_>) -> Hmac<Sha256> {
        let mut mac =
            <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(label);
        mac.update(transcript.service_nonce);
        mac.update(transcript.host_nonce);
        // The identity is at most 63 bytes (the hello's field), so its length fits a byte.
        mac.update(&[transcript.identity.len() as u8]);
        mac.update(transcript.identity.as_bytes());
        mac
    }

    fn proof(&self, label: &[u8], transcript: &Transcript<'_>) -> AuthBytes {
        self.mac(label, transcript).finalize().into_bytes().into()
    }

    fn check(&self, label: &[u8], transcript: &Transcript<'_>, proof: &AuthBytes) -> bool {
        self.mac(label, transcript).verify_slice(proof).is_ok()
    }
}

/// What both proofs of a session cover.
#[derive(Debug, Clone, Copy)]
pub struct Transcript<'a> {
    /// The service's nonce, from its challenge.
    pub service_nonce: &'a AuthBytes,
    /// The host's nonce, from its proof.
    pub host_nonce: &'a AuthBytes,
    /// The identity the host said hello with.
    pub identity: &'a str,
}

/// The identity both sides of the exchange with worker `id` use.
pub fn worker_identity(id: u64) -> String {
    format!("worker {id}")
}

/// `key` sealed with (or, sealed, opened with) `pad`.
pub fn seal(key: &AuthBytes, pad: &AuthBytes) -> AuthBytes {
    core::array::from_fn(|i| key[i] ^ pad[i])
}

/// Why a peer on a fresh channel was not let in, or could not get in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandshakeError {
    /// The channel failed.
    Channel(String),
    /// The peer did not answer within the time allowed.
    TimedOut,
    /// The peer's proof is wrong, or the peer refused ours.
    Refused(String),
    /// The peer sent something else than the exchange expects.
    Protocol(String),
}

impl fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Channel(e) => write!(f, "the channel failed during authentication: {e}"),
            Self::TimedOut => f.write_str("the peer did not authenticate in time"),
            Self::Refused(why) => write!(f, "authentication refused: {why}"),
            Self::Protocol(what) => write!(f, "unexpected message during authentication: {what}"),
        }
    }
}

impl std::error::Error for HandshakeError {}

/// The accepting side of the exchange on a fresh channel (a worker): challenges the peer to
/// prove `key`, checks its proof and proves `key` in turn. A peer that fails is told why.
pub fn challenge<T: Transport + ?Sized>(
    conn: &mut T,
    key: &SharedSecret,
    identity: &str,
    timeout: Duration,
) -> Result<(), HandshakeError> {
    let deadline = Instant::now() + timeout;
    let max = conn.max_msg_size();
    let nonce = fresh_nonce().map_err(|e| HandshakeError::Channel(e.to_string()))?;
    let challenge = AuthChallenge {
        method: AuthMethod::SharedSecret,
        nonce,
    };
    send(conn, 1, ControlMessage::AuthChallenge(challenge))?;
    let proof = receive(conn, max, deadline, |message| match message {
        ControlMessage::SecretProof(proof) => Some(proof),
        _ => None,
    })?;
    let transcript = Transcript {
        service_nonce: &nonce,
        host_nonce: &proof.nonce,
        identity,
    };
    if !key.check_host_proof(&transcript, &proof.proof) {
        let reason = "wrong proof of the worker's key: this host was not sent by its daemon";
        let error = ErrorReply {
            status: Status::Authentication,
            reason,
        };
        let _ = send(conn, 2, ControlMessage::Error(error));
        return Err(HandshakeError::Refused(reason.into()));
    }
    let answer = ServiceProof {
        proof: key.service_proof(&transcript),
    };
    send(conn, 2, ControlMessage::ServiceProof(answer))
}

/// The connecting side of the exchange on a fresh channel (a host): answers the peer's
/// challenge with a proof of `key` and checks the peer's proof.
pub fn prove<T: Transport + ?Sized>(
    conn: &mut T,
    key: &SharedSecret,
    identity: &str,
    timeout: Duration,
) -> Result<(), HandshakeError> {
    let deadline = Instant::now() + timeout;
    let max = conn.max_msg_size();
    let challenge = receive(conn, max, deadline, |message| match message {
        ControlMessage::AuthChallenge(c) if c.method == AuthMethod::SharedSecret => Some(c),
        _ => None,
    })?;
    let proof = key
        .answer(&challenge.nonce, identity)
        .map_err(|e| HandshakeError::Channel(e.to_string()))?;
    let transcript = Transcript {
        service_nonce: &challenge.nonce,
        host_nonce: &proof.nonce,
        identity,
    };
    send(conn, 2, ControlMessage::SecretProof(proof))?;
    let answer = receive(conn, max, deadline, |message| match message {
        ControlMessage::ServiceProof(answer) => Some(answer),
        _ => None,
    })?;
    if key.check_service_proof(&transcript, &answer.proof) {
        Ok(())
    } else {
        Err(HandshakeError::Refused(
            "the peer's proof of the key is wrong: it is not the worker the daemon named".into(),
        ))
    }
}

fn send<T: Transport + ?Sized>(
    conn: &mut T,
    seq: u64,
    body: ControlMessage<'_>,
) -> Result<(), HandshakeError> {
    let frame = FrameRepr { seq, body };
    let mut bytes = vec![0; frame.buffer_len()];
    let len = frame
        .emit(&mut bytes, conn.max_msg_size())
        .map_err(|e| HandshakeError::Protocol(e.to_string()))?;
    let (tx, _) = conn.split();
    // A fresh channel has room for the few frames of the exchange.
    tx.send(&bytes[..len])
        .map_err(|e| HandshakeError::Channel(e.to_string()))
}

/// Waits for the next frame until `deadline` and takes from it what `expect` picks; an error
/// reply is a refusal.
fn receive<T: Transport + ?Sized, M>(
    conn: &mut T,
    max: MaxMsgSize,
    deadline: Instant,
    expect: impl FnOnce(ControlMessage<'_>) -> Option<M>,
) -> Result<M, HandshakeError> {
    let (_, rx) = conn.split();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(HandshakeError::TimedOut);
        }
        let ready = rx
            .wait_recv(left)
            .map_err(|e| HandshakeError::Channel(e.to_string()))?;
        if !ready {
            continue;
        }
        let Some(bytes) = rx
            .recv()
            .map_err(|e| HandshakeError::Channel(e.to_string()))?
        else {
            continue;
        };
        let frame = FrameRepr::<ControlMessage>::parse(bytes, max)
            .map_err(|e| HandshakeError::Protocol(e.to_string()))?;
        if let ControlMessage::Error(error) = frame.body {
            return Err(HandshakeError::Refused(error.reason.to_owned()));
        }
        let kind = urom_wire::Body::kind(&frame.body);
        return expect(frame.body).ok_or_else(|| HandshakeError::Protocol(format!("{kind:?}")));
    }
}

/// Fresh random bytes from the operating system.
pub fn fresh_nonce() -> Result<AuthBytes, getrandom::Error> {
    let mut nonce = [0; AUTH_DATA_LEN];
    getrandom::fill(&mut nonce)?;
    Ok(nonce)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn transcript<'a>(s: &'a AuthBytes, h: &'a AuthBytes, identity: &'a str) -> Transcript<'a> {
        Transcript {
            service_nonce: s,
            host_nonce: h,
            identity,
        }
    }

    #[test]
    fn proofs_check_only_with_the_same_secret_nonces_and_identity() {
        let secret = SharedSecret::from_bytes(b"correct horse battery staple");
        let (s, h) = (fresh_nonce().unwrap(), fresh_nonce().unwrap());
        assert_ne!(s, h, "nonces are fresh");
        let session = transcript(&s, &h, "rank-0");
        let proof = secret.host_proof(&session);
        assert!(secret.check_host_proof(&session, &proof));

        let other_secret = SharedSecret::from_bytes(b"incorrect horse battery staple");
        assert!(!other_secret.check_host_proof(&session, &proof));
        let later = fresh_nonce().unwrap();
        let replayed = transcript(&later, &h, "rank-0");
        assert!(
            !secret.check_host_proof(&replayed, &proof),
            "a proof from one session does not pass in a session with a fresh service nonce"
        );
        assert!(!secret.check_host_proof(&transcript(&s, &h, "rank-1"), &proof));
        assert!(
            !secret.check_service_proof(&session, &proof),
            "the host's proof is not the service's"
        );
        let service = secret.service_proof(&session);
        assert!(secret.check_service_proof(&session, &service));
        assert!(!secret.check_host_proof(&session, &service));
    }

    #[test]
    fn key_files_must_be_private_and_long_enough() {
        let dir = std::env::temp_dir().join(format!("urom-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("key");
        std::fs::write(&path, "0123456789abcdef0123\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let error = SharedSecret::read(&path).unwrap_err();
        assert!(matches!(error, KeyFileError::Exposed { .. }), "{error}");
        assert!(error.to_string().contains("chmod 600"), "{error}");

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let secret = SharedSecret::read(&path).unwrap();
        assert_eq!(secret.0, b"0123456789abcdef0123", "white space is trimmed");

        std::fs::write(&path, " short \n").unwrap();
        let error = SharedSecret::read(&path).unwrap_err();
        assert_eq!(
            error,
            KeyFileError::TooShort {
                path: path.clone(),
                len: 5
            }
        );
        let missing = SharedSecret::read(&dir.join("missing")).unwrap_err();
        assert!(
            missing.to_string().contains("cannot read key file"),
            "{missing}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_sealed_worker_key_opens_only_with_the_sessions_pad() {
        let secret = SharedSecret::from_bytes(b"correct horse battery staple");
        let (s, h) = (fresh_nonce().unwrap(), fresh_nonce().unwrap());
        let session = transcript(&s, &h, "rank-0");
        let key = fresh_nonce().unwrap();
        let sealed = seal(&key, &secret.worker_key_pad(&session, 7));
        assert_ne!(sealed, key);
        assert_eq!(seal(&sealed, &secret.worker_key_pad(&session, 7)), key);
        assert_ne!(seal(&sealed, &secret.worker_key_pad(&session, 8)), key);
        let other = transcript(&h, &s, "rank-0");
        assert_ne!(seal(&sealed, &secret.worker_key_pad(&other, 7)), key);
    }

    fn channel_pair() -> (crate::transport::Channel, crate::transport::Channel) {
        let config = crate::transport::ChannelConfig::default();
        let (a, b) = crate::transport::shm::ShmConnection::pair(&config).unwrap();
        (a.into(), b.into())
    }

    #[test]
    fn a_host_with_the_workers_key_gets_in_and_one_without_is_refused() {
        const SOON: Duration = Duration::from_secs(10);
        let key = SharedSecret::from_bytes(&fresh_nonce().unwrap());
        let (mut worker, mut host) = channel_pair();
        let worker_key = key.clone();
        let accepting =
            std::thread::spawn(move || challenge(&mut worker, &worker_key, "worker 3", SOON));
        prove(&mut host, &key, "worker 3", SOON).expect("the host gets in");
        accepting.join().unwrap().expect("the worker lets it in");

        let (mut worker, mut host) = channel_pair();
        let worker_key = key.clone();
        let accepting =
            std::thread::spawn(move || challenge(&mut worker, &worker_key, "worker 3", SOON));
        let wrong = SharedSecret::from_bytes(&fresh_nonce().unwrap());
        let refused = prove(&mut host, &wrong, "worker 3", SOON).unwrap_err();
        assert!(
            matches!(&refused, HandshakeError::Refused(why) if why.contains("not sent by its daemon")),
            "{refused}"
        );
        assert!(matches!(
            accepting.join().unwrap(),
            Err(HandshakeError::Refused(_))
        ));

        let (_silent, mut host) = channel_pair();
        let error = prove(&mut host, &key, "worker 3", Duration::from_millis(50)).unwrap_err();
        assert_eq!(error, HandshakeError::TimedOut);
    }

    #[test]
    fn the_secret_is_never_printed() {
        let secret = SharedSecret::from_bytes(b"do-not-print-this-secret");
        assert_eq!(format!("{secret:?}"), "SharedSecret(24 bytes)");
    }
}
