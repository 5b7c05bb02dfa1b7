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
//! Both sides then derive the session's keys from the secret and both nonces with HKDF-SHA256
//! ([`SessionKeys`]): one per direction for the records that carry every later control message
//! with an integrity check (see [`record`](crate::record)), and one that seals
//! worker keys.
//!
//! A worker that serves remote hosts has a key of its own, which its daemon made and gave it
//! when it started it. The daemon hands that key to each remote host it lets use the worker,
//! sealed for that host's session with ChaCha20-Poly1305 ([`SessionKeys::seal_worker_key`]: a
//! fresh nonce per sealing, the worker's id bound in), and the host then runs the same exchange
//! with the worker at the worker's front door ([`challenge`] on the worker's side, [`prove`] on
//! the host's) before anything else. So a worker serves only hosts its daemon vouched for, and an
//! eavesdropper learns nothing it could use.

use std::fmt;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Nonce};
use hkdf::Hkdf;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::record::RecordKey;
use crate::stream::{self, StreamReader, StreamWriter};
use urom_wire::control::{
    AUTH_DATA_LEN, AuthChallenge, AuthMethod, ControlMessage, ErrorReply, SEALED_KEY_LEN,
    SecretProof, ServiceProof,
};
use urom_wire::{FrameRepr, MaxMsgSize, Status};

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
const HOST_RECORDS_LABEL: &[u8] = b"urom records host to service v1";
const SERVICE_RECORDS_LABEL: &[u8] = b"urom records service to host v1";
const WORKER_KEY_LABEL: &[u8] = b"urom worker key seal v1";
/// Bytes of a sealing's nonce, at the front of a sealed key.
const SEAL_NONCE_LEN: usize = 12;

/// A nonce or a proof.
pub type AuthBytes = [u8; AUTH_DATA_LEN];
/// A worker key sealed for one session: the sealing's nonce, the encrypted key and its tag.
pub type SealedKey = [u8; SEALED_KEY_LEN];

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

    /// The keys of the session `transcript` describes.
    pub fn session_keys(&self, transcript: &Transcript<'_>) -> SessionKeys {
        let mut salt = [0; 2 * AUTH_DATA_LEN];
        salt[..AUTH_DATA_LEN].copy_from_slice(transcript.service_nonce);
        salt[AUTH_DATA_LEN..].copy_from_slice(transcript.host_nonce);
        let hkdf = Hkdf::<Sha256>::new(Some(&salt), &self.0);
        let key = |label: &[u8]| {
            let mut okm = [0; 32];
            // The identity is at most 63 bytes (the hello's field), so its length fits a byte.
            let info = [
                label,
                &[transcript.identity.len() as u8],
                transcript.identity.as_bytes(),
            ];
            hkdf.expand_multi_info(&info, &mut okm)
                .expect("32 bytes is a valid HKDF-SHA256 output length");
            okm
        };
        SessionKeys {
            host_records: RecordKey(key(HOST_RECORDS_LABEL)),
            service_records: RecordKey(key(SERVICE_RECORDS_LABEL)),
            worker_key_seal: key(WORKER_KEY_LABEL),
        }
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

/// The keys both sides of an authenticated session derived from the secret and the session's
/// nonces and identity. Never printed.
#[derive(Clone)]
pub struct SessionKeys {
    host_records: RecordKey,
    service_records: RecordKey,
    worker_key_seal: [u8; 32],
}

impl fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SessionKeys(..)")
    }
}

/// Which side of a session seals its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The side that connected and proved itself first: a host.
    Connecting,
    /// The side that accepted and challenged: the daemon, or a worker.
    Accepting,
}

impl SessionKeys {
    /// Seals both halves of the session's stream for `side`: from now on every message each way
    /// travels as a record with an integrity check.
    pub fn seal(
        &self,
        side: Side,
        reader: &mut StreamReader,
        writer: &mut StreamWriter,
        max: MaxMsgSize,
    ) {
        let (ours, theirs) = match side {
            Side::Connecting => (&self.host_records, &self.service_records),
            Side::Accepting => (&self.service_records, &self.host_records),
        };
        writer.seal(ours, max);
        reader.seal(theirs, max);
    }

    /// The record keys of `side`: the one it writes with, and the one it reads with (for a
    /// stream driven without blocking, see [`Sealer`](crate::record::Sealer) and
    /// [`Opener`](crate::record::Opener)).
    pub fn record_keys(&self, side: Side) -> (&RecordKey, &RecordKey) {
        match side {
            Side::Connecting => (&self.host_records, &self.service_records),
            Side::Accepting => (&self.service_records, &self.host_records),
        }
    }

    /// `key` of worker `worker_id`, sealed for this session. `sealing` must differ for every key
    /// sealed in one session (a counter): it is the nonce.
    pub fn seal_worker_key(&self, worker_id: u64, sealing: u64, key: &AuthBytes) -> SealedKey {
        let mut nonce = [0; SEAL_NONCE_LEN];
        nonce[..8].copy_from_slice(&sealing.to_le_bytes());
        let sealed = self
            .cipher()
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: key,
                    aad: &worker_id.to_le_bytes(),
                },
            )
            .expect("ChaCha20-Poly1305 seals 32 bytes");
        let mut out = [0; SEALED_KEY_LEN];
        out[..SEAL_NONCE_LEN].copy_from_slice(&nonce);
        out[SEAL_NONCE_LEN..].copy_from_slice(&sealed);
        out
    }

    /// The key of worker `worker_id` that [`SessionKeys::seal_worker_key`] sealed; `None` if it
    /// was sealed for another session or worker, or changed on the way.
    pub fn open_worker_key(&self, worker_id: u64, sealed: &SealedKey) -> Option<AuthBytes> {
        let (nonce, sealed) = sealed.split_at(SEAL_NONCE_LEN);
        let key = self
            .cipher()
            .decrypt(
                Nonce::from_slice(nonce),
                Payload {
                    msg: sealed,
                    aad: &worker_id.to_le_bytes(),
                },
            )
            .ok()?;
        key.try_into().ok()
    }

    fn cipher(&self) -> ChaCha20Poly1305 {
        ChaCha20Poly1305::new(&self.worker_key_seal.into())
    }
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

/// The accepting side of the exchange on a fresh stream (a worker's front door): challenges
/// the peer to prove `key`, checks its proof and proves `key` in turn, all within `timeout`. A
/// peer that fails is told why. On success both halves are sealed with the session's keys.
pub fn challenge(
    (reader, writer): &mut (StreamReader, StreamWriter),
    max: MaxMsgSize,
    key: &SharedSecret,
    identity: &str,
    timeout: Duration,
) -> Result<SessionKeys, HandshakeError> {
    let deadline = Instant::now() + timeout;
    let nonce = fresh_nonce().map_err(|e| HandshakeError::Channel(e.to_string()))?;
    let challenge = AuthChallenge {
        method: AuthMethod::SharedSecret,
        nonce,
    };
    send(writer, max, 1, ControlMessage::AuthChallenge(challenge))?;
    let proof = receive(reader, max, deadline, |message| match message {
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
        let _ = send(writer, max, 2, ControlMessage::Error(error));
        return Err(HandshakeError::Refused(reason.into()));
    }
    let answer = ServiceProof {
        proof: key.service_proof(&transcript),
    };
    send(writer, max, 2, ControlMessage::ServiceProof(answer))?;
    let keys = key.session_keys(&transcript);
    keys.seal(Side::Accepting, reader, writer, max);
    Ok(keys)
}

/// The connecting side of the exchange on a fresh stream (a host at a worker's front door):
/// answers the peer's challenge with a proof of `key` and checks the peer's proof, within
/// `timeout`. On success both halves are sealed with the session's keys.
pub fn prove(
    (reader, writer): &mut (StreamReader, StreamWriter),
    max: MaxMsgSize,
    key: &SharedSecret,
    identity: &str,
    timeout: Duration,
) -> Result<SessionKeys, HandshakeError> {
    let deadline = Instant::now() + timeout;
    let challenge = receive(reader, max, deadline, |message| match message {
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
    send(writer, max, 2, ControlMessage::SecretProof(proof))?;
    let answer = receive(reader, max, deadline, |message| match message {
        ControlMessage::ServiceProof(answer) => Some(answer),
        _ => None,
    })?;
    if !key.check_service_proof(&transcript, &answer.proof) {
        return Err(HandshakeError::Refused(
            "the peer's proof of the key is wrong: it is not the worker the daemon named".into(),
        ));
    }
    let keys = key.session_keys(&transcript);
    keys.seal(Side::Connecting, reader, writer, max);
    Ok(keys)
}

fn send(
    writer: &mut StreamWriter,
    max: MaxMsgSize,
    seq: u64,
    body: ControlMessage<'_>,
) -> Result<(), HandshakeError> {
    let frame = FrameRepr { seq, body };
    let mut bytes = vec![0; frame.buffer_len()];
    let len = frame
        .emit(&mut bytes, max)
        .map_err(|e| HandshakeError::Protocol(e.to_string()))?;
    writer
        .write_all(&bytes[..len])
        .map_err(|e| HandshakeError::Channel(e.to_string()))
}

/// Reads the next frame until `deadline` and takes from it what `expect` picks; an error reply
/// is a refusal.
fn receive<M>(
    reader: &mut StreamReader,
    max: MaxMsgSize,
    deadline: Instant,
    expect: impl FnOnce(ControlMessage<'_>) -> Option<M>,
) -> Result<M, HandshakeError> {
    let mut bytes = Vec::new();
    stream::read_frame(reader, &mut bytes, max, Some(deadline)).map_err(|e| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => HandshakeError::TimedOut,
        std::io::ErrorKind::InvalidData => HandshakeError::Protocol(e.to_string()),
        _ => HandshakeError::Channel(e.to_string()),
    })?;
    let frame = FrameRepr::<ControlMessage>::parse(&bytes, max)
        .map_err(|e| HandshakeError::Protocol(e.to_string()))?;
    if let ControlMessage::Error(error) = frame.body {
        return Err(HandshakeError::Refused(error.reason.to_owned()));
    }
    let kind = urom_wire::Body::kind(&frame.body);
    expect(frame.body).ok_or_else(|| HandshakeError::Protocol(format!("{kind:?}")))
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
    fn a_sealed_worker_key_opens_only_in_its_session_for_its_worker() {
        let secret = SharedSecret::from_bytes(b"correct horse battery staple");
        let (s, h) = (fresh_nonce().unwrap(), fresh_nonce().unwrap());
        let keys = secret.session_keys(&transcript(&s, &h, "rank-0"));
        let key = fresh_nonce().unwrap();
        let sealed = keys.seal_worker_key(7, 0, &key);
        assert!(!sealed.windows(key.len()).any(|w| w == key));
        assert_eq!(keys.open_worker_key(7, &sealed), Some(key));
        assert_eq!(keys.open_worker_key(8, &sealed), None, "another worker");
        let again = keys.seal_worker_key(7, 1, &key);
        assert_ne!(again, sealed, "each sealing has its own nonce");
        assert_eq!(keys.open_worker_key(7, &again), Some(key));
        for at in 0..sealed.len() {
            let mut flipped = sealed;
            flipped[at] ^= 1;
            assert_eq!(keys.open_worker_key(7, &flipped), None, "flipped byte {at}");
        }
        let other = secret.session_keys(&transcript(&h, &s, "rank-0"));
        assert_eq!(other.open_worker_key(7, &sealed), None, "another session");
        let renamed = secret.session_keys(&transcript(&s, &h, "rank-1"));
        assert_eq!(
            renamed.open_worker_key(7, &sealed),
            None,
            "another identity"
        );
    }

    type Halves = (StreamReader, StreamWriter);

    fn stream_pair() -> (Halves, Halves) {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        (
            stream::split_unix(a).unwrap(),
            stream::split_unix(b).unwrap(),
        )
    }

    #[test]
    fn a_host_with_the_workers_key_gets_in_and_one_without_is_refused() {
        const SOON: Duration = Duration::from_secs(10);
        let max = MaxMsgSize::DEFAULT;
        let key = SharedSecret::from_bytes(&fresh_nonce().unwrap());
        let (mut worker, mut host) = stream_pair();
        let worker_key = key.clone();
        let accepting = std::thread::spawn(move || {
            challenge(&mut worker, max, &worker_key, "worker 3", SOON).map(|_| worker)
        });
        prove(&mut host, max, &key, "worker 3", SOON).expect("the host gets in");
        let (mut reader, _writer) = accepting.join().unwrap().expect("the worker lets it in");
        host.1.write_all(b"sealed").unwrap();
        let mut got = [0; 6];
        reader.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"sealed", "both sides sealed with the same keys");

        let (mut worker, mut host) = stream_pair();
        let worker_key = key.clone();
        let accepting = std::thread::spawn(move || {
            challenge(&mut worker, max, &worker_key, "worker 3", SOON).map(|_| ())
        });
        let wrong = SharedSecret::from_bytes(&fresh_nonce().unwrap());
        let refused = prove(&mut host, max, &wrong, "worker 3", SOON).unwrap_err();
        assert!(
            matches!(&refused, HandshakeError::Refused(why) if why.contains("not sent by its daemon")),
            "{refused}"
        );
        assert!(matches!(
            accepting.join().unwrap(),
            Err(HandshakeError::Refused(_))
        ));

        let (_silent, mut host) = stream_pair();
        let error = prove(&mut host, max, &key, "worker 3", Duration::from_millis(50)).unwrap_err();
        assert_eq!(error, HandshakeError::TimedOut);
    }

    #[test]
    fn the_secret_is_never_printed() {
        let secret = SharedSecret::from_bytes(b"do-not-print-this-secret");
        assert_eq!(format!("{secret:?}"), "SharedSecret(24 bytes)");
    }
}
