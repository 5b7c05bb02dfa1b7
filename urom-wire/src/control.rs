//! Bodies exchanged between a host and the daemon over the control socket.
//!
//! A session: the host sends [`Hello`]; the daemon answers [`AuthChallenge`] (or an
//! [`ErrorReply`] when version or message size do not match); the host answers
//! [`AuthResponse`]; the daemon answers `Ack` or an error. Then any number of requests, each
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
//! ```

use zerocopy::little_endian::{I32, U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::error::EnvEntryError;
use crate::frame::{exact, prefix, put, reserved_zero};
use crate::list::{Item, take};
use crate::text::{decode_padded, encode_padded};
use crate::{
    Body, CpuSet, DecodeError, EncodeError, FrameKind, List, Status, cpuset::CPUSET_BYTES,
};

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

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct HelloWire {
    protocol_version: U16,
    reserved: U16,
    max_msg_size: U32,
    identity: [u8; IDENTITY_LEN],
}
const _: () = assert!(size_of::<HelloWire>() == 72);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct AuthWire {
    method: U32,
    reserved: U32,
    data: [u8; AUTH_DATA_LEN],
}
const _: () = assert!(size_of::<AuthWire>() == 40);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct ErrorWire {
    status: I32,
    reserved: U32,
    reason: [u8; REASON_LEN],
}
const _: () = assert!(size_of::<ErrorWire>() == 128);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct CountWire {
    count: U32,
    reserved: U32,
}
const _: () = assert!(size_of::<CountWire>() == 8);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct PluginInfoWire {
    id: U64,
    version: U64,
    name: [u8; PLUGIN_NAME_MAX_LEN],
}
const _: () = assert!(size_of::<PluginInfoWire>() == 64);

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
const _: () = assert!(size_of::<SpawnWire>() == 160);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct SpawnResultWire {
    worker_id: U64,
    endpoint: U16,
    address_len: U16,
    reserved: U32,
}
const _: () = assert!(size_of::<SpawnResultWire>() == 16);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct WorkerIdWire {
    worker_id: U64,
}
const _: () = assert!(size_of::<WorkerIdWire>() == 8);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct GidWire {
    gid: U32,
    reserved: U32,
}
const _: () = assert!(size_of::<GidWire>() == 8);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct WorkerExitWire {
    worker_id: U64,
    exit_code: I32,
    signal: I32,
}
const _: () = assert!(size_of::<WorkerExitWire>() == 16);

/// The largest fixed part of any body: [`crate::MaxMsgSize::MIN`] is built from it.
pub(crate) const LARGEST_FIXED_BODY: usize = {
    let sizes = [
        size_of::<HelloWire>(),
        size_of::<AuthWire>(),
        size_of::<ErrorWire>(),
        size_of::<CountWire>(),
        CPUSET_BYTES,
        size_of::<SpawnWire>(),
        size_of::<SpawnResultWire>(),
        size_of::<WorkerExitWire>(),
        crate::data::NOTIFY_HEADER_LEN,
    ];
    let mut largest = 0;
    let mut i = 0;
    while i < sizes.len() {
        if sizes[i] > largest {
            largest = sizes[i];
        }
        i += 1;
    }
    largest
};

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

/// Daemon -> host: a request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorReply<'a> {
    /// What kind of failure.
    pub status: Status,
    /// A short explanation for an operator, at most 119 bytes; see
    /// [`crate::truncate_at_char_boundary`] for texts of run-time length.
    pub reason: &'a str,
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

int_enum! {
    /// How a host reaches a worker's data channel.
    open EndpointKind: u16, other Unknown {
        /// A Unix socket path, in the address.
        UnixSocket = 1,
        /// A shared-memory channel whose descriptors travel with this frame (`SCM_RIGHTS`).
        SharedMemory = 2,
        /// A UCX worker address, in the address.
        Ucx = 3,
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

/// Every body that travels on the control socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlMessage<'a> {
    /// [`Hello`].
    Hello(Hello<'a>),
    /// [`AuthChallenge`].
    AuthChallenge(AuthChallenge),
    /// [`AuthResponse`].
    AuthResponse(AuthResponse),
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
    },
    /// Which workers belong to a group?
    WorkersByGidRequest {
        /// The group id.
        gid: u32,
    },
    /// The ids of the group's workers.
    WorkersByGidReply(List<'a, u64>),
    /// [`WorkerExit`].
    WorkerExited(WorkerExit),
}

impl<'a> Body<'a> for ControlMessage<'a> {
    fn kind(&self) -> FrameKind {
        match self {
            Self::Hello(_) => FrameKind::Hello,
            Self::AuthChallenge(_) => FrameKind::AuthChallenge,
            Self::AuthResponse(_) => FrameKind::AuthResponse,
            Self::Ack => FrameKind::Ack,
            Self::Error(_) => FrameKind::Error,
            Self::PluginListRequest => FrameKind::PluginListRequest,
            Self::PluginListReply(_) => FrameKind::PluginListReply,
            Self::CpusetRequest => FrameKind::CpusetRequest,
            Self::CpusetReply(_) => FrameKind::CpusetReply,
            Self::SpawnWorker(_) => FrameKind::SpawnWorker,
            Self::SpawnResult(_) => FrameKind::SpawnResult,
            Self::DestroyWorker { .. } => FrameKind::DestroyWorker,
            Self::WorkersByGidRequest { .. } => FrameKind::WorkersByGidRequest,
            Self::WorkersByGidReply(_) => FrameKind::WorkersByGidReply,
            Self::WorkerExited(_) => FrameKind::WorkerExited,
        }
    }

    fn parse(kind: FrameKind, body: &'a [u8]) -> Result<Self, DecodeError> {
        Ok(match kind {
            FrameKind::Hello => {
                let wire: &HelloWire = exact(body)?;
                reserved_zero("hello.reserved", wire.reserved.get().into())?;
                Self::Hello(Hello {
                    protocol_version: wire.protocol_version.get(),
                    max_msg_size: wire.max_msg_size.get(),
                    identity: decode_padded("identity", &wire.identity)?,
                })
            }
            FrameKind::AuthChallenge => {
                let (method, nonce) = parse_auth(body)?;
                Self::AuthChallenge(AuthChallenge { method, nonce })
            }
            FrameKind::AuthResponse => {
                let (method, proof) = parse_auth(body)?;
                Self::AuthResponse(AuthResponse { method, proof })
            }
            FrameKind::Ack => empty(body, Self::Ack)?,
            FrameKind::Error => {
                let wire: &ErrorWire = exact(body)?;
                reserved_zero("error.reserved", wire.reserved.get().into())?;
                Self::Error(ErrorReply {
                    status: Status::from_raw(wire.status.get()),
                    reason: decode_padded("reason", &wire.reason)?,
                })
            }
            FrameKind::PluginListRequest => empty(body, Self::PluginListRequest)?,
            FrameKind::PluginListReply => Self::PluginListReply(parse_counted(body)?),
            FrameKind::CpusetRequest => empty(body, Self::CpusetRequest)?,
            FrameKind::CpusetReply => Self::CpusetReply(CpuSet::from_bytes(exact(body)?)),
            FrameKind::SpawnWorker => {
                let (wire, rest) = prefix::<SpawnWire>(body)?;
                reserved_zero("spawn.reserved", wire.reserved.get().into())?;
                let (env, rest) = List::decode(rest, wire.env_count.get() as usize)?;
                no_trailing(body, rest)?;
                Self::SpawnWorker(SpawnWorker {
                    worker_id: wire.worker_id.get(),
                    plugins: wire.plugins.get(),
                    gid: wire.gid.get(),
                    max_inflight_tasks: wire.max_inflight_tasks.get(),
                    cpuset: CpuSet::from_bytes(&wire.cpuset),
                    env,
                })
            }
            FrameKind::SpawnResult => {
                let (wire, address) = prefix::<SpawnResultWire>(body)?;
                reserved_zero("spawn_result.reserved", wire.reserved.get().into())?;
                let expected = size_of::<SpawnResultWire>() + wire.address_len.get() as usize;
                check_exact_len(expected, body.len())?;
                Self::SpawnResult(SpawnResult {
                    worker_id: wire.worker_id.get(),
                    endpoint: EndpointKind::from_raw(wire.endpoint.get()),
                    address,
                })
            }
            FrameKind::DestroyWorker => Self::DestroyWorker {
                worker_id: exact::<WorkerIdWire>(body)?.worker_id.get(),
            },
            FrameKind::WorkersByGidRequest => {
                let wire: &GidWire = exact(body)?;
                reserved_zero("gid.reserved", wire.reserved.get().into())?;
                Self::WorkersByGidRequest {
                    gid: wire.gid.get(),
                }
            }
            FrameKind::WorkersByGidReply => Self::WorkersByGidReply(parse_counted(body)?),
            FrameKind::WorkerExited => {
                let wire: &WorkerExitWire = exact(body)?;
                Self::WorkerExited(WorkerExit {
                    worker_id: wire.worker_id.get(),
                    exit_code: wire.exit_code.get(),
                    signal: wire.signal.get(),
                })
            }
            FrameKind::Command | FrameKind::Notify => {
                return Err(DecodeError::UnexpectedKind(kind.raw()));
            }
        })
    }

    fn body_len(&self) -> usize {
        match self {
            Self::Hello(_) => size_of::<HelloWire>(),
            Self::AuthChallenge(_) | Self::AuthResponse(_) => size_of::<AuthWire>(),
            Self::Ack | Self::PluginListRequest | Self::CpusetRequest => 0,
            Self::Error(_) => size_of::<ErrorWire>(),
            Self::PluginListReply(list) => size_of::<CountWire>() + list.encoded_len(),
            Self::CpusetReply(_) => CPUSET_BYTES,
            Self::SpawnWorker(spawn) => size_of::<SpawnWire>() + spawn.env.encoded_len(),
            Self::SpawnResult(result) => size_of::<SpawnResultWire>() + result.address.len(),
            Self::DestroyWorker { .. } => size_of::<WorkerIdWire>(),
            Self::WorkersByGidRequest { .. } => size_of::<GidWire>(),
            Self::WorkersByGidReply(list) => size_of::<CountWire>() + list.encoded_len(),
            Self::WorkerExited(_) => size_of::<WorkerExitWire>(),
        }
    }

    fn emit(&self, dst: &mut [u8]) -> Result<(), EncodeError> {
        match self {
            Self::Hello(hello) => {
                let mut wire = HelloWire {
                    protocol_version: U16::new(hello.protocol_version),
                    reserved: U16::ZERO,
                    max_msg_size: U32::new(hello.max_msg_size),
                    identity: [0; IDENTITY_LEN],
                };
                encode_padded("identity", &mut wire.identity, hello.identity)?;
                put(dst, &wire);
            }
            Self::AuthChallenge(challenge) => emit_auth(dst, challenge.method, &challenge.nonce),
            Self::AuthResponse(response) => emit_auth(dst, response.method, &response.proof),
            Self::Ack | Self::PluginListRequest | Self::CpusetRequest => {}
            Self::Error(error) => {
                let mut wire = ErrorWire {
                    status: I32::new(error.status.raw()),
                    reserved: U32::ZERO,
                    reason: [0; REASON_LEN],
                };
                encode_padded("reason", &mut wire.reason, error.reason)?;
                put(dst, &wire);
            }
            Self::PluginListReply(list) => emit_counted(dst, "plugins", list)?,
            Self::CpusetReply(cpuset) => dst.copy_from_slice(&cpuset.to_bytes()),
            Self::SpawnWorker(spawn) => {
                let wire = SpawnWire {
                    worker_id: U64::new(spawn.worker_id),
                    plugins: U64::new(spawn.plugins),
                    gid: U32::new(spawn.gid),
                    max_inflight_tasks: U32::new(spawn.max_inflight_tasks),
                    env_count: U32::new(count_u32("env", spawn.env.len())?),
                    reserved: U32::ZERO,
                    cpuset: spawn.cpuset.to_bytes(),
                };
                spawn.env.encode(put(dst, &wire))?;
            }
            Self::SpawnResult(result) => {
                let address_len =
                    u16::try_from(result.address.len()).map_err(|_| EncodeError::TooMany {
                        field: "address",
                        count: result.address.len(),
                        max: u16::MAX.into(),
                    })?;
                let wire = SpawnResultWire {
                    worker_id: U64::new(result.worker_id),
                    endpoint: U16::new(result.endpoint.raw()),
                    address_len: U16::new(address_len),
                    reserved: U32::ZERO,
                };
                put(dst, &wire).copy_from_slice(result.address);
            }
            Self::DestroyWorker { worker_id } => {
                put(
                    dst,
                    &WorkerIdWire {
                        worker_id: U64::new(*worker_id),
                    },
                );
            }
            Self::WorkersByGidRequest { gid } => {
                put(
                    dst,
                    &GidWire {
                        gid: U32::new(*gid),
                        reserved: U32::ZERO,
                    },
                );
            }
            Self::WorkersByGidReply(list) => emit_counted(dst, "worker ids", list)?,
            Self::WorkerExited(exit) => {
                put(
                    dst,
                    &WorkerExitWire {
                        worker_id: U64::new(exit.worker_id),
                        exit_code: I32::new(exit.exit_code),
                        signal: I32::new(exit.signal),
                    },
                );
            }
        }
        Ok(())
    }
}

/// `message` when the body is empty.
fn empty<'a>(body: &[u8], message: ControlMessage<'a>) -> Result<ControlMessage<'a>, DecodeError> {
    no_trailing(body, body).map(|()| message)
}

/// `Ok` when nothing is left after the last field.
fn no_trailing(body: &[u8], rest: &[u8]) -> Result<(), DecodeError> {
    check_exact_len(body.len() - rest.len(), body.len())
}

/// `Ok` when `found` bytes are exactly the `expected` ones.
#[inline]
pub(crate) fn check_exact_len(expected: usize, found: usize) -> Result<(), DecodeError> {
    match found.cmp(&expected) {
        core::cmp::Ordering::Less => Err(DecodeError::Truncated {
            needed: expected,
            available: found,
        }),
        core::cmp::Ordering::Greater => Err(DecodeError::TrailingBytes { expected, found }),
        core::cmp::Ordering::Equal => Ok(()),
    }
}

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

fn parse_counted<'a, T: Item<'a>>(body: &'a [u8]) -> Result<List<'a, T>, DecodeError> {
    let (wire, rest) = prefix::<CountWire>(body)?;
    reserved_zero("count.reserved", wire.reserved.get().into())?;
    let (list, rest) = List::decode(rest, wire.count.get() as usize)?;
    no_trailing(body, rest)?;
    Ok(list)
}

fn emit_counted<'a, T: Item<'a>>(
    dst: &mut [u8],
    field: &'static str,
    list: &List<'a, T>,
) -> Result<(), EncodeError> {
    let wire = CountWire {
        count: U32::new(count_u32(field, list.len())?),
        reserved: U32::ZERO,
    };
    list.encode(put(dst, &wire))
}

fn count_u32(field: &'static str, count: usize) -> Result<u32, EncodeError> {
    u32::try_from(count).map_err(|_| EncodeError::TooMany {
        field,
        count,
        max: u32::MAX as usize,
    })
}

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
        let len = u16::try_from(self.len()).map_err(|_| EncodeError::TooMany {
            field: "env entry",
            count: self.len(),
            max: u16::MAX.into(),
        })?;
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
        assert_eq!(LARGEST_FIXED_BODY, 160);
        assert_eq!(crate::MaxMsgSize::MIN, 184);
    }
}
