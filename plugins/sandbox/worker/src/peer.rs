//! The plugin's UCX side: a peer worker, endpoints by domain id, the hosts' memory, and the
//! sends and receives in flight.

use std::collections::HashMap;

use urom_plugin::ucx::{
    ImportParams, NO_EXPORTED_MEMH, OperationKind, PeerId, PeerWorker, RemoteKeyId, RemoteMemory,
    UcxError, exported_memh_supported,
};
use urom_plugin::{Arm, Command, Domain, Notifier, WakeFds};
use urom_sandbox_wire::timestamps::{Event, Recorder, monotonic_ns};
use urom_sandbox_wire::{
    MemMapParams, NOTIFICATION_LEN, SandboxCommand, SandboxError, SandboxNotification,
};
use urom_wire::Status;

/// The most bytes an inline receive may ask for: the largest message a channel carries.
const MAX_INLINE_RECV: u64 = 16 << 20;

/// The `memh_id` of the first memory handle a MEM_MAP imports (then 3, 4, ...): never 0
/// (inline) nor `urom_sandbox_wire::DOMAIN_MEMH_ID`. Sends and receives with any non-zero
/// `memh_id` reach the host's memory through the domain's keys.
const FIRST_IMPORTED_MEMH_ID: u64 = 2;

/// An endpoint to a domain member, and the address it was made for.
struct Endpoint {
    address: Vec<u8>,
    peer: PeerId,
}

/// An endpoint to a host's memory worker, and the keys unpacked on it.
struct Host {
    address: Vec<u8>,
    peer: PeerId,
    keys: Vec<(Vec<u8>, RemoteKeyId)>,
}

/// What a finished operation answers.
#[derive(Clone, Copy)]
enum Waiting {
    Send,
    RecvInline,
    /// A receive whose bytes then go to the host's memory.
    RecvMemory(RemoteMemory),
    /// Those bytes on their way there.
    Putting {
        sender_tag: u64,
    },
}

/// A command whose operation runs.
#[derive(Clone, Copy)]
struct Pending {
    dest_id: u64,
    plugin: u64,
    urom_context: u64,
    context: u64,
    waiting: Waiting,
}

/// The sandbox plugin's state with UCX.
pub(crate) struct SandboxPeer {
    worker: PeerWorker,
    endpoints: HashMap<u64, Endpoint>,
    hosts: Vec<Host>,
    /// By token; `free` lists the empty entries.
    pending: Vec<Option<Pending>>,
    free: Vec<usize>,
    /// Where notifications are packed (reused).
    notification: Vec<u8>,
    /// The sends' and receives' timestamps, when `UROM_SANDBOX_TIMESTAMPS` asks for them.
    stamps: Option<Recorder>,
}

/// UCX failed: the plugin says `DOCA_ERROR_DRIVER`.
fn driver(error: UcxError) -> Status {
    let _ = error;
    Status::Driver
}

impl SandboxPeer {
    pub(crate) fn open() -> Result<Self, Status> {
        let stamps = Recorder::from_env().map_err(|error| {
            // The worker logs its standard error; the plugin stays out of the worker.
            eprintln!("worker_sandbox: {error}");
            Status::InvalidValue
        })?;
        Ok(Self {
            worker: PeerWorker::new().map_err(driver)?,
            endpoints: HashMap::new(),
            hosts: Vec::new(),
            pending: Vec::new(),
            free: Vec::new(),
            notification: vec![0; NOTIFICATION_LEN],
            stamps,
        })
    }

    /// Writes the timestamps, if recorded (`close`).
    pub(crate) fn close(&mut self) {
        if let Some(stamps) = self.stamps.take()
            && let Err(error) = stamps.write()
        {
            eprintln!("worker_sandbox: cannot write the timestamps: {error}");
        }
    }

    pub(crate) fn address(&self) -> &[u8] {
        self.worker.address()
    }

    /// The endpoint to member `dest`, made on first use and again when its address changed.
    fn endpoint(&mut self, domain: &Domain<'_>, dest: u64) -> Result<PeerId, Status> {
        let address = domain.address(dest)?;
        if let Some(endpoint) = self.endpoints.get(&dest)
            && endpoint.address == address
            && self.worker.peer_failure(endpoint.peer).is_none()
        {
            return Ok(endpoint.peer);
        }
        let peer = self.worker.connect(address).map_err(driver)?;
        self.endpoints.insert(
            dest,
            Endpoint {
                address: address.to_vec(),
                peer,
            },
        );
        Ok(peer)
    }

    /// The `len` bytes at `va` in this worker's host's memory: a buffer of the domain holds
    /// both ends; reached through its remote key and the host's memory worker.
    fn host_memory(
        &mut self,
        domain: &Domain<'_>,
        va: u64,
        len: u64,
    ) -> Result<RemoteMemory, Status> {
        let own = domain.own_id()?;
        let seg = domain.segment(own, va)?;
        if len > 0 {
            let last = va.checked_add(len - 1).ok_or(Status::InvalidValue)?;
            if domain.segment(own, last) != Ok(seg) {
                return Err(Status::InvalidValue);
            }
        }
        let rkey = domain.remote_key(own, seg)?;
        let address = domain.host_memory_address(own)?;
        let at = match self
            .hosts
            .iter()
            .position(|h| h.address == address && self.worker.peer_failure(h.peer).is_none())
        {
            Some(at) => at,
            None => {
                let peer = self.worker.connect(address).map_err(driver)?;
                self.hosts.push(Host {
                    address: address.to_vec(),
                    peer,
                    keys: Vec::new(),
                });
                self.hosts.len() - 1
            }
        };
        let host = &mut self.hosts[at];
        let key = match host.keys.iter().find(|(packed, _)| packed == rkey) {
            Some(&(_, key)) => key,
            None => {
                let key = self.worker.unpack_key(host.peer, rkey).map_err(driver)?;
                host.keys.push((rkey.to_vec(), key));
                key
            }
        };
        Ok(RemoteMemory {
            peer: host.peer,
            key,
            address: va,
        })
    }

    fn pend(&mut self, command: &Command<'_>, context: u64, waiting: Waiting) -> u64 {
        let pending = Pending {
            dest_id: command.dest_id,
            plugin: command.plugin,
            urom_context: command.urom_context,
            context,
            waiting,
        };
        match self.free.pop() {
            Some(at) => {
                self.pending[at] = Some(pending);
                at as u64
            }
            None => {
                self.pending.push(Some(pending));
                (self.pending.len() - 1) as u64
            }
        }
    }

    /// The command of operation `token`, left in place.
    fn pending_at(&self, token: u64) -> Option<Pending> {
        let at = usize::try_from(token).ok()?;
        *self.pending.get(at)?
    }

    fn unpend(&mut self, token: u64) -> Option<Pending> {
        let at = usize::try_from(token).ok()?;
        let pending = self.pending.get_mut(at)?.take()?;
        self.free.push(at);
        Some(pending)
    }

    pub(crate) fn command(
        &mut self,
        command: &Command<'_>,
        out: &mut Notifier<'_>,
    ) -> Result<(), Status> {
        let domain = out.domain();
        let unpacked = SandboxCommand::unpack(command.payload).map_err(|error: SandboxError| {
            // The status cannot say why; the worker's log can.
            eprintln!("worker_sandbox: refused: {error}");
            Status::from(error)
        })?;
        match unpacked {
            SandboxCommand::MemMap {
                context,
                params,
                exported_memh,
            } => self.mem_map(command, out, context, params, exported_memh),
            SandboxCommand::TagSend {
                context,
                dest,
                buffer,
                count,
                tag,
                memh_id,
                data,
            } => {
                let peer = self.endpoint(&domain, dest)?;
                let from = if memh_id == 0 {
                    None
                } else {
                    let len = usize::try_from(count).map_err(|_| Status::InvalidValue)?;
                    Some((self.host_memory(&domain, buffer, count)?, len))
                };
                let token = self.pend(command, context, Waiting::Send);
                let issued = if self.stamps.is_some() {
                    monotonic_ns()
                } else {
                    0
                };
                let started = match from {
                    None => self.worker.tag_send(peer, tag, data, token),
                    Some((from, len)) => self.worker.tag_send_from(peer, tag, from, len, token),
                };
                match started {
                    Ok(_) => {
                        if let Some(stamps) = &mut self.stamps {
                            stamps.record(Event::Send, tag, issued);
                        }
                        Ok(())
                    }
                    Err(error) => {
                        self.unpend(token);
                        Err(driver(error))
                    }
                }
            }
            SandboxCommand::TagRecv {
                context,
                buffer,
                count,
                tag,
                tag_mask,
                memh_id,
            } => {
                let waiting = if memh_id == 0 {
                    if count > MAX_INLINE_RECV {
                        return Err(Status::InvalidValue);
                    }
                    Waiting::RecvInline
                } else {
                    Waiting::RecvMemory(self.host_memory(&domain, buffer, count)?)
                };
                let capacity = usize::try_from(count).map_err(|_| Status::InvalidValue)?;
                let token = self.pend(command, context, waiting);
                self.worker.tag_recv(tag, tag_mask, capacity, token);
                Ok(())
            }
        }
    }

    /// MEM_MAP: maps the host memory an exported memory handle describes and answers with its
    /// `memh_id`. Where this worker's UCX cannot import memory handles, and for a MEM_MAP
    /// without one (which would map the worker's own memory), `DOCA_ERROR_NOT_SUPPORTED`; a
    /// handle UCX refuses is `DOCA_ERROR_DRIVER`. The log says why.
    fn mem_map(
        &mut self,
        command: &Command<'_>,
        out: &mut Notifier<'_>,
        context: u64,
        params: MemMapParams,
        exported_memh: &[u8],
    ) -> Result<(), Status> {
        if exported_memh.is_empty() {
            eprintln!(
                "worker_sandbox: MEM_MAP without an exported memory handle (it would map the \
                 worker's own memory) is not supported"
            );
            return Err(Status::NotSupported);
        }
        if !exported_memh_supported() {
            eprintln!("worker_sandbox: MEM_MAP not supported: {NO_EXPORTED_MEMH}");
            return Err(Status::NotSupported);
        }
        let import = ImportParams {
            field_mask: params.field_mask,
            address: params.address,
            length: params.length,
            flags: params.flags,
            prot: params.prot,
            memory_type: params.memory_type,
        };
        let index = self
            .worker
            .import_memh(import, exported_memh)
            .map_err(|error| {
                eprintln!("worker_sandbox: MEM_MAP: {error}");
                driver(error)
            })?;
        let notification = SandboxNotification::MemMap {
            context,
            memh_id: FIRST_IMPORTED_MEMH_ID + index as u64,
        };
        let n = notification.pack(&mut self.notification)?;
        out.notify(
            command.dest_id,
            command.plugin,
            command.urom_context,
            Status::Success,
            &self.notification[..n],
        )
    }

    pub(crate) fn progress(&mut self, out: &mut Notifier<'_>) -> Result<bool, Status> {
        let mut worked = false;
        while let Some(done) = self.worker.progress() {
            worked = true;
            if let (Some(stamps), OperationKind::Receive { sender_tag, .. }, Ok(())) =
                (&mut self.stamps, done.kind, done.result)
            {
                stamps.record(Event::Receive, sender_tag, monotonic_ns());
            }
            let Some(pending) = self.pending_at(done.token) else {
                self.worker.release(done.slot);
                continue;
            };
            let mut result = done.result;
            // A receive into the host's memory: put the bytes there, then answer.
            if let (Waiting::RecvMemory(to), OperationKind::Receive { sender_tag, len }, Ok(())) =
                (pending.waiting, done.kind, result)
            {
                match self.worker.put(done.slot, to, len, done.token) {
                    Ok(()) => {
                        self.pending[done.token as usize] = Some(Pending {
                            waiting: Waiting::Putting { sender_tag },
                            ..pending
                        });
                        continue;
                    }
                    Err(error) => result = Err(error),
                }
            }
            self.unpend(done.token);
            let notification = match (pending.waiting, done.kind) {
                (Waiting::Send, _) | (_, OperationKind::Send) => SandboxNotification::TagSend {
                    context: pending.context,
                    status: ucs_status(result),
                },
                (Waiting::RecvInline, OperationKind::Receive { sender_tag, .. }) => {
                    SandboxNotification::TagRecv {
                        context: pending.context,
                        buffer: NOTIFICATION_LEN as u64,
                        count: 0,
                        sender_tag,
                        status: ucs_status(result),
                        data: if result.is_ok() {
                            self.worker.slot(done.slot)
                        } else {
                            &[]
                        },
                    }
                }
                (Waiting::Putting { sender_tag }, OperationKind::Put { len })
                | (
                    Waiting::RecvMemory(_) | Waiting::Putting { .. },
                    OperationKind::Receive { sender_tag, len },
                ) => SandboxNotification::TagRecv {
                    context: pending.context,
                    buffer: 0,
                    count: if result.is_ok() { len as u64 } else { 0 },
                    sender_tag,
                    status: ucs_status(result),
                    data: &[],
                },
                // A put for a command that did not ask for one: cannot happen.
                (_, OperationKind::Put { .. }) => SandboxNotification::TagRecv {
                    context: pending.context,
                    buffer: 0,
                    count: 0,
                    sender_tag: 0,
                    status: ucs_status(result),
                    data: &[],
                },
            };
            let len = notification.buffer_len();
            if self.notification.len() < len {
                self.notification.resize(len, 0);
            }
            let packed = notification.pack(&mut self.notification);
            let status = if result.is_ok() {
                Status::Success
            } else {
                Status::Driver
            };
            if let Ok(n) = packed {
                // A host that is gone cannot be told; the others go on.
                let _ = out.notify(
                    pending.dest_id,
                    pending.plugin,
                    pending.urom_context,
                    status,
                    &self.notification[..n],
                );
            }
            self.worker.release(done.slot);
        }
        Ok(worked)
    }

    /// Lets the worker sleep on the UCP worker's event descriptor, unless UCX has events
    /// waiting (`ucp_worker_arm` answered `UCS_ERR_BUSY`).
    pub(crate) fn arm(&mut self, wake: &mut WakeFds<'_>) -> Arm {
        if !self.worker.arm() {
            return Arm::Busy;
        }
        match wake.watch(self.worker.wake_fd()) {
            Ok(()) => Arm::Armed,
            Err(_) => Arm::Unsupported,
        }
    }
}

/// UCX's status of an operation, as the notification carries it.
fn ucs_status(result: Result<(), UcxError>) -> i32 {
    result.err().map_or(0, |error| i32::from(error.status))
}
