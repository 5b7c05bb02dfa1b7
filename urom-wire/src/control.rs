//! Bodies exchanged between a host and the daemon over the control socket.
//!
//! A session: the host sends [`Hello`]; the daemon answers [`AuthChallenge`] (or an
//! [`ErrorReply`] when version or message size do not match). A local host answers
//! [`AuthResponse`] and the daemon `Ack` or an error; a remote host, challenged for a shared
//! secret, answers [`SecretProof`] and the daemon [`ServiceProof`] (so the host knows it reached
//! the real service) or an error. Then any number of requests, each
//! answered by the reply of its kind or by an [`ErrorReply`], with the request's sequence number.
//! [`WorkerExit`] events arrive unsolicited with sequence number 0.
//!
//! Body layouts (little-endian; offsets within the body):
//!
//! ```text
//! Hello               0 u16 protocol_version | 2 u16 reserved | 4 u32 max_msg_size
//!                     8 [64] identity (NUL-padded UTF-8)                          = 72
//! AuthChallenge       0 u32 method | 4 u32 reserved | 8 [32] nonce                = 40
//! AuthResponse        0 u32 method | 4 u32 reserved | 8 [32] proof                = 40
//! SecretProof         0 [32] host nonce | 32 [32] proof                           = 64
//! ServiceProof        0 [32] proof                                                = 32
//! Ack, PluginListRequest, CpusetRequest                                           = 0
//! Error               0 i32 status | 4 u32 reserved | 8 [120] reason (NUL-padded) = 128
//! PluginListReply     0 u32 count | 4 u32 reserved | 8 count x PluginInfo (64 each)
//!   PluginInfo        0 u64 id | 8 u64 version | 16 [48] name (NUL-padded)
//! CpusetReply         0 [128] cpuset                                              = 128
//! SpawnWorker         0 u64 worker_id | 8 u64 plugins | 16 u32 gid
//!                     20 u32 max_inflight_tasks | 24 u32 env_count | 28 u32 reserved
//!                     32 [128] cpuset | 160 env_count x (u16 len, len bytes NAME=value)
//! SpawnResult         0 u64 worker_id | 8 u16 endpoint | 10 u16 address_len
//!                     12 u32 reserved | 16 address_len bytes
//! DestroyWorker       0 u64 worker_id                                             = 8
//! WorkersByGidRequest 0 u32 gid | 4 u32 reserved                                  = 8
//! WorkersByGidReply   0 u32 count | 4 u32 reserved | 8 count x u64 worker id
//! WorkerExited        0 u64 worker_id | 8 i32 exit_code | 12 i32 signal           = 16
//! StatusRequest       0 u32 cursor | 4 u32 reserved                               = 8
//! StatusReply         0 u32 count | 4 u32 next_cursor | count x record (see crate::report)
//! ```
//!
//! A status report may be longer than one frame: it is read in pages. A request with cursor 0
//! makes the daemon take a fresh snapshot and answer its first records; a reply's
//! `next_cursor` is the index of the first record not yet sent, to be asked for next, or 0
//! when the report is complete.
//!
//! Each body type implements `codec::Message` next to its wire struct (its fixed part, parse,
//! emit); [`ControlMessage`] is generated from one table that maps each variant to its frame
//! kind and body type.

use static_assertions::assert_eq_size;
use zerocopy::little_endian::{I32, U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::codec::{
    Message, check_exact_len, count_u16, count_u32, exact, no_trailing, prefix, put, reserved_zero,
    take,
};
use crate::cpuset::CPUSET_BYTES;
use crate::error::EnvEntryError;
use crate::list::Item;
use crate::report::StatusRecord;
use crate::text::{decode_padded, encode_padded};
use crate::{CpuSet, DecodeError, EncodeError, List, Status};

/// The worker id that asks the daemon to pick a fresh one (`DOCA_UROM_WORKER_ID_ANY`).
pub const WORKER_ID_ANY: u64 = u64::MAX;
/// Size of a plugin name field (`DOCA_UROM_PLUGIN_NAME_MAX_LEN`); names hold one byte less.
pub const PLUGIN_NAME_MAX_LEN: usize = 48;
/// Size of the hello identity field; identities hold one byte less.
pub const IDENTITY_LEN: usize = 64;
/// Size of the error reason field; reasons hold one byte less.
pub const REASON_LEN: usize = 120;
/// Size of an authentication nonce or proof.
pub const AUTH_DATA_LEN: usize = 32;

message_family! {
    /// Every body that travels on the control socket.
    pub enum ControlMessage<'a> {
        /// [`Hello`].
        Hello(Hello<'a>),
        /// [`AuthChallenge`].
        AuthChallenge(AuthChallenge),
        /// [`AuthResponse`].
        AuthResponse(AuthResponse),
        /// [`SecretProof`].
        SecretProof(SecretProof),
        /// [`ServiceProof`].
        ServiceProof(ServiceProof),
        /// The request succeeded (authentication, destroy).
        Ack,
        /// [`ErrorReply`].
        Error(ErrorReply<'a>),
        /// Which plugins does the daemon offer?
        PluginListRequest,
        /// The plugins the daemon offers.
        PluginListReply(List<'a, PluginInfo<'a>>),
        /// Which CPUs may workers use?
        CpusetRequest,
        /// The CPUs workers may use.
        CpusetReply(CpuSet),
        /// [`SpawnWorker`].
        SpawnWorker(SpawnWorker<'a>),
        /// [`SpawnResult`].
        SpawnResult(SpawnResult<'a>),
        /// Stop a worker the host owns.
        DestroyWorker {
            /// The worker's id.
            worker_id: u64,
        } as DestroyWorkerBody,
        /// Which workers belong to a group?
        WorkersByGidRequest {
            /// The group id.
            gid: u32,
        } as WorkersByGidBody,
        /// The ids of the group's workers.
        WorkersByGidReply(List<'a, u64>),
        /// [`WorkerExit`].
        WorkerExited(WorkerExit),
        /// What is the daemon doing? A page of its status report, from record `cursor` on (0:
        /// take a fresh snapshot).
        StatusRequest {
            /// The index of the first record wanted; 0 starts a new report.
            cursor: u32,
        } as StatusRequestBody,
        /// [`StatusReply`].
        StatusReply(StatusReply<'a>),
    }
}

// The spawn request is the largest fixed-size body of all; the smallest maximum message size
// is built from it.
static_assertions::const_assert_eq!(
    ControlMessage::<'static>::LARGEST_FIXED,
    crate::limits::LARGEST_FIXED_BODY
);

/// Host -> daemon, first frame of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello<'a> {
    /// The protocol version the host speaks.
    pub protocol_version: u16,
    /// The host's maximum message size; must equal the daemon's.
    pub max_msg_size: u32,
    /// Who the host says it is (for logs and shared-secret authentication), at most 63 bytes.
    pub identity: &'a str,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct HelloWire {
    protocol_version: U16,
    reserved: U16,
    max_msg_size: U32,
    identity: [u8; IDENTITY_LEN],
}
assert_eq_size!(HelloWire, [u8; 72]);

impl<'a> Message<'a> for Hello<'a> {
    const FIXED_LEN: usize = size_of::<HelloWire>();

    fn parse(body: &'a [u8]) -> Result<Self, DecodeError> {
        let wire: &HelloWire = exact(body)?;
        reserved_zero("hello.reserved", wire.reserved.get().into())?;
        Ok(Hello {
            protocol_version: wire.protocol_version.get(),
            max_msg_size: wire.max_msg_size.get(),
            identity: decode_padded("identity", &wire.identity)?,
        })
    }

    fn emit(&self, dst: &mut [u8]) -> Result<(), EncodeError> {
        let mut wire = HelloWire {
            protocol_version: U16::new(self.protocol_version),
            reserved: U16::ZERO,
            max_msg_size: U32::new(self.max_msg_size),
            identity: [0; IDENTITY_LEN],
        };
        encode_padded("identity", &mut wire.identity, self.identity)?;
        put(dst, &wire);
        Ok(())
    }
}

int_enum! {
    /// How a host proves who it is.
    open AuthMethod: u32, other Unknown {
        /// A local peer: the daemon reads its Unix credentials from the socket; the proof is
        /// all zeros.
        PeerCredentials = 1,
        /// A remote peer: the proof is a keyed hash of the nonce with a shared secret.
        SharedSecret = 2,
    }
}

/// Daemon -> host, answering [`Hello`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthChallenge {
    /// The method the daemon expects.
    pub method: AuthMethod,
    /// Fresh random bytes the proof must cover.
    pub nonce: [u8; AUTH_DATA_LEN],
}

/// Host -> daemon, answering [`AuthChallenge`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthResponse {
    /// The method used.
    pub method: AuthMethod,
    /// The proof for that method.
    pub proof: [u8; AUTH_DATA_LEN],
}

/// Both authentication messages: a method and 32 bytes.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct AuthWire {
    method: U32,
    reserved: U32,
    data: [u8; AUTH_DATA_LEN],
}
assert_eq_size!(AuthWire, [u8; 40]);

fn parse_auth(body: &[u8]) -> Result<(AuthMethod, [u8; AUTH_DATA_LEN]), DecodeError> {
    let wire: &AuthWire = exact(body)?;
    reserved_zero("auth.reserved", wire.reserved.get().into())?;
    Ok((AuthMethod::from_raw(wire.method.get()), wire.data))
}

fn emit_auth(dst: &mut [u8], method: AuthMethod, data: &[u8; AUTH_DATA_LEN]) {
    put(
        dst,
        &AuthWire {
            method: U32::new(method.raw()),
            reserved: U32::ZERO,
            data: *data,
        },
    );
}

impl Message<'_> for AuthChallenge {
    const FIXED_LEN: usize = size_of::<AuthWire>();

    fn parse(body: &[u8]) -> Result<Self, DecodeError> {
        let (method, nonce) = parse_auth(body)?;
        Ok(Self { method, nonce })
    }

    fn emit(&self, dst: &mut [u8]) -> Result<(), EncodeError> {
        emit_auth(dst, self.method, &self.nonce);
        Ok(())
    }
}

impl Message<'_> for AuthResponse {
    const FIXED_LEN: usize = size_of::<AuthWire>();

    fn parse(body: &[u8]) -> Result<Self, DecodeError> {
        let (method, proof) = parse_auth(body)?;
        Ok(Self { method, proof })
    }

    fn emit(&self, dst: &mut [u8]) -> Result<(), EncodeError> {
        emit_auth(dst, self.method, &self.proof);
        Ok(())
    }
}

/// Remote host -> daemon, answering a [`AuthMethod::SharedSecret`] challenge: its own fresh
/// nonce, and a keyed hash of both nonces and its identity that only a holder of the secret can
/// compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SecretProof {
    /// Fresh random bytes the service's proof must cover.
    pub nonce: [u8; AUTH_DATA_LEN],
    /// The host's proof.
    pub proof: [u8; AUTH_DATA_LEN],
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct SecretProofWire {
    nonce: [u8; AUTH_DATA_LEN],
    proof: [u8; AUTH_DATA_LEN],
}
assert_eq_size!(SecretProofWire, [u8; 64]);

impl Message<'_> for SecretProof {
    const FIXED_LEN: usize = size_of::<SecretProofWire>();

    fn parse(body: &[u8]) -> Result<Self, DecodeError> {
        let wire: &SecretProofWire = exact(body)?;
        Ok(Self {
            nonce: wire.nonce,
            proof: wire.proof,
        })
    }

    fn emit(&self, dst: &mut [u8]) -> Result<(), EncodeError> {
        put(
            dst,
            &SecretProofWire {
                nonce: self.nonce,
                proof: self.proof,
            },
        );
        Ok(())
    }
}

/// Daemon -> remote host, accepting its [`SecretProof`]: the service's own proof of the secret,
/// over both nonces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceProof {
    /// The service's proof.
    pub proof: [u8; AUTH_DATA_LEN],
}

impl Message<'_> for ServiceProof {
    const FIXED_LEN: usize = AUTH_DATA_LEN;

    fn parse(body: &[u8]) -> Result<Self, DecodeError> {
        let proof: &[u8; AUTH_DATA_LEN] = exact(body)?;
        Ok(Self { proof: *proof })
    }

    fn emit(&self, dst: &mut [u8]) -> Result<(), EncodeError> {
        put(dst, &self.proof);
        Ok(())
    }
}

/// Daemon -> host: a request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorReply<'a> {
    /// What kind of failure.
    pub status: Status,
    /// A short explanation for an operator, at most 119 bytes; see
    /// [`crate::truncate_at_char_boundary`] for texts of run-time length.
    pub reason: &'a str,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct ErrorWire {
    status: I32,
    reserved: U32,
    reason: [u8; REASON_LEN],
}
assert_eq_size!(ErrorWire, [u8; 128]);

impl<'a> Message<'a> for ErrorReply<'a> {
    const FIXED_LEN: usize = size_of::<ErrorWire>();

    fn parse(body: &'a [u8]) -> Result<Self, DecodeError> {
        let wire: &ErrorWire = exact(body)?;
        reserved_zero("error.reserved", wire.reserved.get().into())?;
        Ok(ErrorReply {
            status: Status::from_raw(wire.status.get()),
            reason: decode_padded("reason", &wire.reason)?,
        })
    }

    fn emit(&self, dst: &mut [u8]) -> Result<(), EncodeError> {
        let mut wire = ErrorWire {
            status: I32::new(self.status.raw()),
            reserved: U32::ZERO,
            reason: [0; REASON_LEN],
        };
        encode_padded("reason", &mut wire.reason, self.reason)?;
        put(dst, &wire);
        Ok(())
    }
}

/// One plugin the daemon offers (`doca_urom_service_plugin_info`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PluginInfo<'a> {
    /// The plugin's id: a single bit, `1 << index`.
    pub id: u64,
    /// The plugin's version, as its `urom_plugin_get_version` reports it.
    pub version: u64,
    /// The `.so` file name without `.so`, at most 47 bytes.
    pub name: &'a str,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct PluginInfoWire {
    id: U64,
    version: U64,
    name: [u8; PLUGIN_NAME_MAX_LEN],
}
assert_eq_size!(PluginInfoWire, [u8; 64]);

/// Plugin records: 64 bytes each.
impl<'a> Item<'a> for PluginInfo<'a> {
    fn decode(bytes: &'a [u8], _index: usize) -> Result<(Self, &'a [u8]), DecodeError> {
        let (wire, rest) = prefix::<PluginInfoWire>(bytes)?;
        let info = PluginInfo {
            id: wire.id.get(),
            version: wire.version.get(),
            name: decode_padded("plugin name", &wire.name)?,
        };
        Ok((info, rest))
    }

    fn encoded_len(&self) -> usize {
        size_of::<PluginInfoWire>()
    }

    fn encode(&self, dst: &mut [u8], _index: usize) -> Result<(), EncodeError> {
        let mut wire = PluginInfoWire {
            id: U64::new(self.id),
            version: U64::new(self.version),
            name: [0; PLUGIN_NAME_MAX_LEN],
        };
        encode_padded("plugin name", &mut wire.name, self.name)?;
        put(dst, &wire);
        Ok(())
    }
}

/// The count in front of a list reply.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct CountWire {
    count: U32,
    reserved: U32,
}
assert_eq_size!(CountWire, [u8; 8]);

/// Elements of a list reply: a [`CountWire`], then the elements.
trait Counted {
    /// The list's name in errors.
    const FIELD: &'static str;
}

impl Counted for PluginInfo<'_> {
    const FIELD: &'static str = "plugins";
}

impl Counted for u64 {
    const FIELD: &'static str = "worker ids";
}

impl<'a, T: Item<'a> + Counted> Message<'a> for List<'a, T> {
    const FIXED_LEN: usize = size_of::<CountWire>();

    fn parse(body: &'a [u8]) -> Result<Self, DecodeError> {
        let (wire, rest) = prefix::<CountWire>(body)?;
        reserved_zero("count.reserved", wire.reserved.get().into())?;
        let (list, rest) = List::decode(rest, wire.count.get() as usize)?;
        no_trailing(body, rest)?;
        Ok(list)
    }

    fn body_len(&self) -> usize {
        Self::FIXED_LEN + self.encoded_len()
    }

    fn emit(&self, dst: &mut [u8]) -> Result<(), EncodeError> {
        let wire = CountWire {
            count: U32::new(count_u32(T::FIELD, self.len())?),
            reserved: U32::ZERO,
        };
        self.encode(put(dst, &wire))
    }
}

/// The CPU set reply: the set's 128 bytes.
impl Message<'_> for CpuSet {
    const FIXED_LEN: usize = CPUSET_BYTES;

    fn parse(body: &[u8]) -> Result<Self, DecodeError> {
        Ok(CpuSet::from_bytes(exact(body)?))
    }

    fn emit(&self, dst: &mut [u8]) -> Result<(), EncodeError> {
        dst.copy_from_slice(&self.to_bytes());
        Ok(())
    }
}

/// Host -> daemon: spawn a worker, or attach to an existing one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpawnWorker<'a> {
    /// The worker's id, or [`WORKER_ID_ANY`] for a fresh one.
    pub worker_id: u64,
    /// The plugins the worker loads: an OR of plugin ids.
    pub plugins: u64,
    /// The group the worker belongs to.
    pub gid: u32,
    /// How many commands the host keeps in flight at most.
    pub max_inflight_tasks: u32,
    /// The CPUs the worker may run on.
    pub cpuset: CpuSet,
    /// Environment entries for the worker, each `NAME=value`.
    pub env: List<'a, &'a str>,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct SpawnWire {
    worker_id: U64,
    plugins: U64,
    gid: U32,
    max_inflight_tasks: U32,
    env_count: U32,
    reserved: U32,
    cpuset: [u8; CPUSET_BYTES],
}
assert_eq_size!(SpawnWire, [u8; 160]);

impl<'a> Message<'a> for SpawnWorker<'a> {
    const FIXED_LEN: usize = size_of::<SpawnWire>();

    fn parse(body: &'a [u8]) -> Result<Self, DecodeError> {
        let (wire, rest) = prefix::<SpawnWire>(body)?;
        reserved_zero("spawn.reserved", wire.reserved.get().into())?;
        let (env, rest) = List::decode(rest, wire.env_count.get() as usize)?;
        no_trailing(body, rest)?;
        Ok(SpawnWorker {
            worker_id: wire.worker_id.get(),
            plugins: wire.plugins.get(),
            gid: wire.gid.get(),
            max_inflight_tasks: wire.max_inflight_tasks.get(),
            cpuset: CpuSet::from_bytes(&wire.cpuset),
            env,
        })
    }

    fn body_len(&self) -> usize {
        Self::FIXED_LEN + self.env.encoded_len()
    }

    fn emit(&self, dst: &mut [u8]) -> Result<(), EncodeError> {
        let wire = SpawnWire {
            worker_id: U64::new(self.worker_id),
            plugins: U64::new(self.plugins),
            gid: U32::new(self.gid),
            max_inflight_tasks: U32::new(self.max_inflight_tasks),
            env_count: U32::new(count_u32("env", self.env.len())?),
            reserved: U32::ZERO,
            cpuset: self.cpuset.to_bytes(),
        };
        self.env.encode(put(dst, &wire))
    }
}

/// Environment entries: a `u16` length, then that many bytes of `NAME=value`.
impl<'a> Item<'a> for &'a str {
    fn decode(bytes: &'a [u8], index: usize) -> Result<(Self, &'a [u8]), DecodeError> {
        let (len, rest) = take::<2>(bytes)?;
        let len = u16::from_le_bytes(*len) as usize;
        let (entry, rest) = rest.split_at_checked(len).ok_or(DecodeError::Truncated {
            needed: len,
            available: rest.len(),
        })?;
        let entry = check_env_entry(entry)
            .map_err(|reason| DecodeError::InvalidEnvEntry { index, reason })?;
        Ok((entry, rest))
    }

    fn encoded_len(&self) -> usize {
        2 + self.len()
    }

    fn encode(&self, dst: &mut [u8], index: usize) -> Result<(), EncodeError> {
        check_env_entry(self.as_bytes())
            .map_err(|reason| EncodeError::InvalidEnvEntry { index, reason })?;
        let len = count_u16("env entry", self.len())?;
        let (len_bytes, entry) = dst.split_at_mut(2);
        len_bytes.copy_from_slice(&len.to_le_bytes());
        entry.copy_from_slice(self.as_bytes());
        Ok(())
    }
}

/// Checks that `entry` is `NAME=value` with a portable name and no NUL byte.
pub fn check_env_entry(entry: &[u8]) -> Result<&str, EnvEntryError> {
    if entry.contains(&0) {
        return Err(EnvEntryError::ContainsNul);
    }
    let entry = core::str::from_utf8(entry).map_err(|_| EnvEntryError::NotUtf8)?;
    let (name, _value) = entry.split_once('=').ok_or(EnvEntryError::MissingEquals)?;
    let mut chars = name.bytes();
    let starts_well = chars
        .next()
        .is_some_and(|first| first == b'_' || first.is_ascii_alphabetic());
    if !starts_well || !chars.all(|c| c == b'_' || c.is_ascii_alphanumeric()) {
        return Err(EnvEntryError::BadName);
    }
    Ok(entry)
}

int_enum! {
    /// How a host reaches a worker's data channel.
    open EndpointKind: u16, other Unknown {
        /// A Unix socket path, in the address.
        UnixSocket = 1,
        /// A shared-memory channel whose descriptors travel with this frame (`SCM_RIGHTS`).
        SharedMemory = 2,
        /// A UCX listener, in the address: the UTF-8 text `IP:PORT` of its socket address
        /// (IPv4 `192.0.2.7:4000`, or IPv6 in brackets `[2001:db8::7]:4000`; an unspecified IP
        /// such as `0.0.0.0` means the address the host reached the daemon at), or else the
        /// bytes of its worker's UCX address.
        Ucx = 3,
        /// A worker on another machine, reached through its front door: a TCP socket where the
        /// host proves the worker's key before the two exchange UCX worker addresses. The
        /// address is the key sealed for this host's session ([`SEALED_KEY_LEN`] bytes, see
        /// [`SealedUcxAddress`]), then the front door's `IP:PORT` as for
        /// [`EndpointKind::Ucx`].
        UcxSealed = 4,
    }
}

/// Bytes of a worker key sealed for a host's session: a 12-byte nonce, the 32-byte key
/// encrypted, and a 16-byte tag (ChaCha20-Poly1305).
pub const SEALED_KEY_LEN: usize = 12 + AUTH_DATA_LEN + 16;

/// The address of an [`EndpointKind::UcxSealed`] endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SealedUcxAddress<'a> {
    /// The worker's key, sealed for the host.
    pub sealed_key: [u8; SEALED_KEY_LEN],
    /// The worker's front door, `IP:PORT`.
    pub listener: &'a str,
}

impl<'a> SealedUcxAddress<'a> {
    /// Splits a spawn result's address.
    pub fn parse(address: &'a [u8]) -> Result<Self, DecodeError> {
        let (key, listener) =
            address
                .split_first_chunk::<SEALED_KEY_LEN>()
                .ok_or(DecodeError::Truncated {
                    needed: SEALED_KEY_LEN,
                    available: address.len(),
                })?;
        let listener = core::str::from_utf8(listener).map_err(|_| DecodeError::TextNotUtf8 {
            field: "sealed_ucx_address.listener",
        })?;
        Ok(Self {
            sealed_key: *key,
            listener,
        })
    }

    /// Length of the address bytes.
    pub fn encoded_len(&self) -> usize {
        SEALED_KEY_LEN + self.listener.len()
    }

    /// Writes the address bytes of a spawn result at the front of `dst`; returns their length.
    pub fn emit(&self, dst: &mut [u8]) -> Result<usize, EncodeError> {
        let (available, needed) = (dst.len(), self.encoded_len());
        let out = dst
            .get_mut(..needed)
            .ok_or(EncodeError::BufferTooSmall { needed, available })?;
        let (key, listener) = out.split_at_mut(SEALED_KEY_LEN);
        key.copy_from_slice(&self.sealed_key);
        listener.copy_from_slice(self.listener.as_bytes());
        Ok(needed)
    }
}

/// Daemon -> host: the worker is running and this is how to reach it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpawnResult<'a> {
    /// The worker's id (the fresh one when [`WORKER_ID_ANY`] was asked for).
    pub worker_id: u64,
    /// The kind of endpoint.
    pub endpoint: EndpointKind,
    /// The endpoint's address, at most 65535 bytes; its meaning depends on the kind.
    pub address: &'a [u8],
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct SpawnResultWire {
    worker_id: U64,
    endpoint: U16,
    address_len: U16,
    reserved: U32,
}
assert_eq_size!(SpawnResultWire, [u8; 16]);

impl<'a> Message<'a> for SpawnResult<'a> {
    const FIXED_LEN: usize = size_of::<SpawnResultWire>();

    fn parse(body: &'a [u8]) -> Result<Self, DecodeError> {
        let (wire, address) = prefix::<SpawnResultWire>(body)?;
        reserved_zero("spawn_result.reserved", wire.reserved.get().into())?;
        let expected = size_of::<SpawnResultWire>() + wire.address_len.get() as usize;
        check_exact_len(expected, body.len())?;
        Ok(SpawnResult {
            worker_id: wire.worker_id.get(),
            endpoint: EndpointKind::from_raw(wire.endpoint.get()),
            address,
        })
    }

    fn body_len(&self) -> usize {
        Self::FIXED_LEN + self.address.len()
    }

    fn emit(&self, dst: &mut [u8]) -> Result<(), EncodeError> {
        let wire = SpawnResultWire {
            worker_id: U64::new(self.worker_id),
            endpoint: U16::new(self.endpoint.raw()),
            address_len: U16::new(count_u16("address", self.address.len())?),
            reserved: U32::ZERO,
        };
        put(dst, &wire).copy_from_slice(self.address);
        Ok(())
    }
}

/// The body of [`ControlMessage::DestroyWorker`].
struct DestroyWorkerBody {
    worker_id: u64,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct WorkerIdWire {
    worker_id: U64,
}
assert_eq_size!(WorkerIdWire, [u8; 8]);

impl Message<'_> for DestroyWorkerBody {
    const FIXED_LEN: usize = size_of::<WorkerIdWire>();

    fn parse(body: &[u8]) -> Result<Self, DecodeError> {
        Ok(Self {
            worker_id: exact::<WorkerIdWire>(body)?.worker_id.get(),
        })
    }

    fn emit(&self, dst: &mut [u8]) -> Result<(), EncodeError> {
        put(
            dst,
            &WorkerIdWire {
                worker_id: U64::new(self.worker_id),
            },
        );
        Ok(())
    }
}

/// The body of [`ControlMessage::WorkersByGidRequest`].
struct WorkersByGidBody {
    gid: u32,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct GidWire {
    gid: U32,
    reserved: U32,
}
assert_eq_size!(GidWire, [u8; 8]);

impl Message<'_> for WorkersByGidBody {
    const FIXED_LEN: usize = size_of::<GidWire>();

    fn parse(body: &[u8]) -> Result<Self, DecodeError> {
        let wire: &GidWire = exact(body)?;
        reserved_zero("gid.reserved", wire.reserved.get().into())?;
        Ok(Self {
            gid: wire.gid.get(),
        })
    }

    fn emit(&self, dst: &mut [u8]) -> Result<(), EncodeError> {
        put(
            dst,
            &GidWire {
                gid: U32::new(self.gid),
                reserved: U32::ZERO,
            },
        );
        Ok(())
    }
}

/// Daemon -> host, unsolicited: a worker the host is attached to has ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerExit {
    /// The worker's id.
    pub worker_id: u64,
    /// Its exit code, or 0 when a signal ended it.
    pub exit_code: i32,
    /// The signal that ended it, or 0.
    pub signal: i32,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct WorkerExitWire {
    worker_id: U64,
    exit_code: I32,
    signal: I32,
}
assert_eq_size!(WorkerExitWire, [u8; 16]);

impl Message<'_> for WorkerExit {
    const FIXED_LEN: usize = size_of::<WorkerExitWire>();

    fn parse(body: &[u8]) -> Result<Self, DecodeError> {
        let wire: &WorkerExitWire = exact(body)?;
        Ok(WorkerExit {
            worker_id: wire.worker_id.get(),
            exit_code: wire.exit_code.get(),
            signal: wire.signal.get(),
        })
    }

    fn emit(&self, dst: &mut [u8]) -> Result<(), EncodeError> {
        put(
            dst,
            &WorkerExitWire {
                worker_id: U64::new(self.worker_id),
                exit_code: I32::new(self.exit_code),
                signal: I32::new(self.signal),
            },
        );
        Ok(())
    }
}

/// The body of [`ControlMessage::StatusRequest`].
struct StatusRequestBody {
    cursor: u32,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct CursorWire {
    cursor: U32,
    reserved: U32,
}
assert_eq_size!(CursorWire, [u8; 8]);

impl Message<'_> for StatusRequestBody {
    const FIXED_LEN: usize = size_of::<CursorWire>();

    fn parse(body: &[u8]) -> Result<Self, DecodeError> {
        let wire: &CursorWire = exact(body)?;
        reserved_zero("status_request.reserved", wire.reserved.get().into())?;
        Ok(Self {
            cursor: wire.cursor.get(),
        })
    }

    fn emit(&self, dst: &mut [u8]) -> Result<(), EncodeError> {
        put(
            dst,
            &CursorWire {
                cursor: U32::new(self.cursor),
                reserved: U32::ZERO,
            },
        );
        Ok(())
    }
}

/// Daemon -> host: a page of the status report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusReply<'a> {
    /// The cursor of the next page, or 0 when this page ends the report.
    pub next_cursor: u32,
    /// The page's records.
    pub records: List<'a, StatusRecord<'a>>,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct StatusReplyWire {
    count: U32,
    next_cursor: U32,
}
assert_eq_size!(StatusReplyWire, [u8; 8]);

/// Bytes of a status reply before its records.
pub const STATUS_REPLY_HEADER_LEN: usize = size_of::<StatusReplyWire>();

impl<'a> Message<'a> for StatusReply<'a> {
    const FIXED_LEN: usize = STATUS_REPLY_HEADER_LEN;

    fn parse(body: &'a [u8]) -> Result<Self, DecodeError> {
        let (wire, rest) = prefix::<StatusReplyWire>(body)?;
        let (records, rest) = List::decode(rest, wire.count.get() as usize)?;
        no_trailing(body, rest)?;
        Ok(StatusReply {
            next_cursor: wire.next_cursor.get(),
            records,
        })
    }

    fn body_len(&self) -> usize {
        Self::FIXED_LEN + self.records.encoded_len()
    }

    fn emit(&self, dst: &mut [u8]) -> Result<(), EncodeError> {
        let wire = StatusReplyWire {
            count: U32::new(count_u32("status records", self.records.len())?),
            next_cursor: U32::new(self.next_cursor),
        };
        self.records.encode(put(dst, &wire))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_entries_are_checked() {
        assert_eq!(check_env_entry(b"UCX_TLS=rc,sm"), Ok("UCX_TLS=rc,sm"));
        assert_eq!(check_env_entry(b"_X="), Ok("_X="));
        assert_eq!(check_env_entry(b"A=b=c"), Ok("A=b=c"));
        assert_eq!(
            check_env_entry(b"NOEQUALS"),
            Err(EnvEntryError::MissingEquals)
        );
        assert_eq!(check_env_entry(b"=value"), Err(EnvEntryError::BadName));
        assert_eq!(check_env_entry(b"1A=x"), Err(EnvEntryError::BadName));
        assert_eq!(check_env_entry(b"A-B=x"), Err(EnvEntryError::BadName));
        assert_eq!(check_env_entry(b"A=x\0y"), Err(EnvEntryError::ContainsNul));
        assert_eq!(check_env_entry(b"A=\xff"), Err(EnvEntryError::NotUtf8));
    }

    #[test]
    fn min_message_size_fits_the_largest_fixed_body() {
        assert_eq!(ControlMessage::LARGEST_FIXED, 160);
        assert_eq!(crate::MaxMsgSize::MIN, 184);
    }

    #[test]
    fn a_sealed_ucx_address_is_the_key_then_the_listener() {
        let address = SealedUcxAddress {
            sealed_key: [0xa5; SEALED_KEY_LEN],
            listener: "169.254.77.1:18515",
        };
        let mut bytes = [0u8; 96];
        let len = address.emit(&mut bytes).unwrap();
        assert_eq!(len, 60 + 18);
        assert_eq!(&bytes[60..len], b"169.254.77.1:18515");
        assert_eq!(SealedUcxAddress::parse(&bytes[..len]), Ok(address));
        assert!(matches!(
            SealedUcxAddress::parse(&bytes[..59]),
            Err(DecodeError::Truncated { needed: 60, .. })
        ));
        bytes[70] = 0xff;
        assert!(SealedUcxAddress::parse(&bytes[..len]).is_err());
        assert!(address.emit(&mut [0u8; 70]).is_err());
    }
}
