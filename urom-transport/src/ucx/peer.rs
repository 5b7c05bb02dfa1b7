//! UCP for worker-to-worker messages and host memory: [`PeerWorker`], a worker that plugins use
//! to send tagged messages to their peers and to reach their hosts' memory, and
//! [`HostMemoryWorker`] with [`MappedMemory`], the host's side of that memory.
//!
//! Both use a process-wide context of their own (tag matching, remote memory access, 64-bit
//! atomics, wake-up: what the DOCA sandbox plugin asks for), apart from the transport's
//! active-message context; `UCX_*` variables configure it the same way.
//!
//! # Operations and their buffers
//!
//! A tagged send or receive runs asynchronously in an *operation slot* of the worker: a buffer
//! the worker owns, so that nothing the caller holds must outlive the operation. A send copies
//! its bytes into the slot (or fetches them from a peer's memory); a receive lands in it. Slots
//! are reused: once every slot has grown to the largest message, nothing is allocated per
//! operation. Completions come out of [`PeerWorker::progress`] in the order UCX finished them,
//! each naming the caller's token and its slot, whose bytes stay readable until
//! [`PeerWorker::release`].
//!
//! Remote memory access runs the same way, never waiting: [`PeerWorker::tag_send_from`] fetches
//! a peer's bytes into a slot and sends them once they are there; [`PeerWorker::put`] copies a
//! finished receive's slot to a peer's memory and flushes it, completing from
//! [`PeerWorker::progress`] as [`OperationKind::Put`]. Over transports without hardware RMA
//! (TCP), UCX emulates it with active messages, so the memory's owner must progress its worker
//! meanwhile (a host does so from its progress engine); one that does not only leaves its own
//! operations running, never the caller waiting.
//!
//! # Memory on the host
//!
//! [`MappedMemory`] is zeroed memory this module allocates and maps with `ucp_mem_map`, with
//! its packed remote key (`ucp_rkey_pack`) for a domain's `add_buffer`. A peer may read and
//! write it at any time through its key, so the host reaches it only by copying in and out
//! ([`MappedMemory::write`], [`MappedMemory::read`]), never through a reference.
//!
//! # Exported memory handles
//!
//! Where UCX can export memory handles ([`exported_memh_supported`]: built against UCX 1.15 or
//! later, and a transport that exports, mlx5 with cross-function memory keys), the peer context
//! asks for `UCP_FEATURE_EXPORTED_MEMH`, [`MappedMemory`] also packs its handle for export
//! ([`MappedMemory::exported_memh`], the memory handle of a domain's `add_buffer`), and a
//! [`PeerWorker`] maps memory from such a handle ([`PeerWorker::import_memh`]). Elsewhere (UCX
//! 1.13 and 1.14, and every machine without such a transport, where UCX answers
//! `UCS_ERR_UNSUPPORTED` to an export) the feature is not asked for (with RMA it would make
//! every endpoint unreachable), the exported handle is empty (a buffer added with it has
//! memory-handle lookups answering `DOCA_ERROR_NOT_SUPPORTED`), and importing fails with
//! `UCS_ERR_UNSUPPORTED` and a reason.

use std::cell::Cell;
use std::ffi::c_void;
use std::fmt;
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;

use ucx_sys as sys;

use super::ucp::{Armed, Worker, check, init_op, peer_context, request_param};

/// Whether this process's UCX can export and import memory handles: built against UCX 1.15 or
/// later and a transport that can (mlx5 with cross-function memory keys), probed once with a
/// throwaway context. `false` on UCX 1.13 and 1.14 and on machines without such a transport,
/// where every transport answers `UCS_ERR_UNSUPPORTED`. See the module docs.
pub fn exported_memh_supported() -> bool {
    super::ucp::exported_memh_supported()
}

/// Why importing (or exporting) a memory handle is refused where [`exported_memh_supported`]
/// is `false`.
pub const NO_EXPORTED_MEMH: &str = "mapping an exported memory handle (needs UCX >= 1.15 and a \
     transport that exports memory, mlx5 with cross-function memory keys; this process has \
     neither or not both)";

/// The parameters of a mapping from an exported memory handle ([`PeerWorker::import_memh`]):
/// UCX's `ucp_mem_map_params_t` fields besides the handle, each counting when its
/// `UCP_MEM_MAP_PARAM_FIELD_*` bit is in `field_mask` (address 1, length 2, flags 4, prot 8,
/// memory type 16; others are ignored).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ImportParams {
    /// Which fields count.
    pub field_mask: u64,
    /// The memory's address (in the exporter's memory).
    pub address: u64,
    /// Its length.
    pub length: u64,
    /// `UCP_MEM_MAP_*` flags.
    pub flags: u32,
    /// `UCP_MEM_MAP_PROT_*` protection.
    pub prot: u32,
    /// `ucs_memory_type_t`.
    pub memory_type: u32,
}

/// A UCX call that failed, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UcxError {
    /// The UCX function (or step) that failed.
    pub op: &'static str,
    /// Its status.
    pub status: i8,
}

impl UcxError {
    fn new(op: &'static str, status: sys::ucs_status_t) -> Self {
        Self { op, status }
    }
}

impl fmt::Display for UcxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} failed: {} ({})",
            self.op,
            sys::status_text(self.status),
            self.status
        )
    }
}

impl std::error::Error for UcxError {}

/// An endpoint of a [`PeerWorker`], by index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PeerId(usize);

/// A remote key a [`PeerWorker`] unpacked for one of its peers, by index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteKeyId(usize);

/// An operation slot of a [`PeerWorker`]: its index and generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotId {
    index: usize,
    generation: u64,
}

/// Memory of a peer: where, through which endpoint and key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteMemory {
    /// The endpoint to the memory's owner.
    pub peer: PeerId,
    /// Its key, unpacked on that endpoint.
    pub key: RemoteKeyId,
    /// The address in the owner's memory.
    pub address: u64,
}

/// What a finished operation was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperationKind {
    /// A tagged send.
    Send,
    /// A tagged receive: the tag it matched and how many bytes arrived.
    Receive {
        /// The sender's tag.
        sender_tag: u64,
        /// Bytes received (in the slot).
        len: usize,
    },
    /// A [`PeerWorker::put`], complete at the target.
    Put {
        /// Bytes copied.
        len: usize,
    },
}

/// A finished tagged send or receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The token the operation was started with.
    pub token: u64,
    /// Its slot: [`PeerWorker::slot`] reads it, [`PeerWorker::release`] gives it back.
    pub slot: SlotId,
    /// What it was.
    pub kind: OperationKind,
    /// `Ok`, or the UCX error it ended with.
    pub result: Result<(), UcxError>,
}

/// Where a slot stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    /// On the free list.
    Free,
    /// An operation runs in it; UCX's callback finishes it.
    Running,
    /// UCX finished it; it waits in the ready list.
    Finished,
    /// Handed out as a completion, not yet released.
    Taken,
}

/// What a slot's operation is, and what follows when its current UCX request finishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// A tagged send or receive: complete.
    Tag,
    /// Fetching a send's bytes: then send them to `peer` with `tag`.
    Fetch { peer: PeerId, tag: u64 },
    /// A put: then flush the endpoint to `peer`, so that it completes at the target.
    Put { peer: PeerId },
    /// The put's flush: complete.
    Flush,
}

/// One operation slot. Boxed, so that its address (UCX's user data) never moves.
struct Slot {
    index: usize,
    generation: u64,
    state: SlotState,
    token: u64,
    receive: bool,
    stage: Stage,
    /// The request UCX returned (or passed to the callback), freed once harvested.
    request: *mut c_void,
    status: sys::ucs_status_t,
    sender_tag: u64,
    len: usize,
    buffer: Vec<u8>,
    /// Set by the callback: the worker's list of finished slots.
    ready: *const ReadyList,
}

/// Slots UCX finished, by index, in order; filled by the callbacks during progress.
struct ReadyList(std::cell::RefCell<std::collections::VecDeque<usize>>);

/// One endpoint and what its error handler writes.
struct Peer {
    ep: sys::ucp_ep_h,
    /// INVARIANTS: boxed so that its address, UCX's error-handler argument, never moves while
    /// the endpoint lives.
    failed: Box<Cell<Option<sys::ucs_status_t>>>,
}

/// A worker that reaches peer workers with tagged messages and their memory with remote
/// memory access. See the module docs.
///
/// INVARIANTS: every endpoint in `peers` and key in `keys` belongs to `worker`; slots whose
/// operations may still run (`Running`) keep their buffers until the worker is
/// destroyed. `worker` is the first field, so it is destroyed (after `drop` released the keys
/// and closed the endpoints) before the slots and the ready list its callbacks write.
pub struct PeerWorker {
    worker: Worker,
    address: Vec<u8>,
    peers: Vec<Peer>,
    keys: Vec<(sys::ucp_rkey_h, PeerId)>,
    // Each slot boxed: UCX holds its address (the operation's user data) while it runs.
    #[allow(clippy::vec_box)]
    slots: Vec<Box<Slot>>,
    free: Vec<usize>,
    /// Operations started whose completion was not handed out yet.
    active: usize,
    ready: Box<ReadyList>,
    /// Mappings of exported memory handles, unmapped on drop.
    imported: Vec<sys::ucp_mem_h>,
}

impl fmt::Debug for PeerWorker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerWorker")
            .field("peers", &self.peers.len())
            .field("keys", &self.keys.len())
            .field("slots", &self.slots.len())
            .finish()
    }
}

impl PeerWorker {
    /// A worker of the process-wide peer context.
    pub fn new() -> Result<Self, UcxError> {
        let context = peer_context().map_err(|status| UcxError::new(init_op(), status))?;
        let worker = Worker::in_context(context, c"urom-peer")
            .map_err(|(op, status)| UcxError::new(op, status))?;
        let address = worker_address(&worker)?;
        Ok(Self {
            worker,
            address,
            peers: Vec::new(),
            keys: Vec::new(),
            slots: Vec::new(),
            free: Vec::new(),
            active: 0,
            ready: Box::new(ReadyList(Default::default())),
            imported: Vec::new(),
        })
    }

    /// Maps the memory that `exported` (a memory handle packed for export by its owner,
    /// [`MappedMemory::exported_memh`]) describes, with `params`; returns the mapping's index
    /// among this worker's imports (from 0). The mapping lasts as long as the worker. Where
    /// [`exported_memh_supported`] is `false`, fails with `UCS_ERR_UNSUPPORTED` and
    /// [`NO_EXPORTED_MEMH`] as the reason, touching nothing.
    pub fn import_memh(
        &mut self,
        params: ImportParams,
        exported: &[u8],
    ) -> Result<usize, UcxError> {
        if !exported_memh_supported() || exported.is_empty() {
            let _ = params;
            return Err(UcxError::new(NO_EXPORTED_MEMH, sys::UCS_ERR_UNSUPPORTED));
        }
        #[cfg(ucx_1_15)]
        {
            let context = peer_context().map_err(|status| UcxError::new(init_op(), status))?;
            let named = sys::UCP_MEM_MAP_PARAM_FIELD_ADDRESS
                | sys::UCP_MEM_MAP_PARAM_FIELD_LENGTH
                | sys::UCP_MEM_MAP_PARAM_FIELD_FLAGS
                | sys::UCP_MEM_MAP_PARAM_FIELD_PROT
                | sys::UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
            let map = sys::ucp_mem_map_params_t {
                field_mask: (params.field_mask & named)
                    | sys::UCP_MEM_MAP_PARAM_FIELD_EXPORTED_MEMH_BUFFER,
                address: params.address as usize as *mut c_void,
                length: params.length as usize,
                flags: params.flags,
                prot: params.prot,
                memory_type: params.memory_type as sys::ucs_memory_type_t,
                exported_memh_buffer: exported.as_ptr().cast(),
            };
            let mut memh: sys::ucp_mem_h = std::ptr::null_mut();
            // SAFETY: the context is live (it has the exported-memh feature: supported); `map`
            // points to `exported`, readable for the call (UCX parses what it keeps), and names
            // memory in the exporter's address space, which UCX maps through the handle and
            // this process never dereferences; `memh` is a valid place for the result.
            let status = unsafe { sys::ucp_mem_map(context, &map, &mut memh) };
            check(status).map_err(|status| UcxError::new("ucp_mem_map (import)", status))?;
            self.imported.push(memh);
            Ok(self.imported.len() - 1)
        }
        #[cfg(not(ucx_1_15))]
        unreachable!("exported memory handles are never supported before UCX 1.15")
    }

    /// This worker's UCP address, for peers to connect to.
    pub fn address(&self) -> &[u8] {
        &self.address
    }

    /// The descriptor that wakes a sleeper once [`PeerWorker::arm`] said it may sleep.
    pub fn wake_fd(&self) -> BorrowedFd<'_> {
        self.worker.efd()
    }

    /// Prepares to sleep on [`PeerWorker::wake_fd`]: progresses the worker until it finds
    /// nothing more, then arms it; `false` when events wait or completions are still to be
    /// handed out by [`PeerWorker::progress`] (progress instead). Race-free: anything that
    /// arrives after it said `true` makes the descriptor readable.
    pub fn arm(&self) -> bool {
        self.ready.0.borrow().is_empty()
            && self.worker.progress_until_quiet()
            // The progress may have finished operations.
            && self.ready.0.borrow().is_empty()
            && matches!(self.worker.arm(), Armed::Yes)
    }

    /// An endpoint to the worker at `address` (a UCP worker address).
    pub fn connect(&mut self, address: &[u8]) -> Result<PeerId, UcxError> {
        let failed: Box<Cell<Option<sys::ucs_status_t>>> = Box::new(Cell::new(None));
        let arg = (&raw const *failed).cast_mut().cast::<c_void>();
        // SAFETY: `arg` points to the boxed cell, which lives (at the same address) as long as
        // the endpoint: both sit in one `Peer`, and `drop` closes endpoints before dropping
        // them. `on_peer_error` only writes that cell.
        let ep = unsafe {
            super::ucp::create_ep(
                &self.worker,
                super::ucp::Remote::Worker(address),
                on_peer_error,
                arg,
            )
        }
        .map_err(|status| UcxError::new("ucp_ep_create", status))?;
        self.peers.push(Peer { ep, failed });
        Ok(PeerId(self.peers.len() - 1))
    }

    /// Why the endpoint `peer` failed, if it did.
    pub fn peer_failure(&self, peer: PeerId) -> Option<UcxError> {
        let status = self.peers.get(peer.0)?.failed.get()?;
        Some(UcxError::new("the peer's endpoint", status))
    }

    fn ep(&self, peer: PeerId) -> Result<sys::ucp_ep_h, UcxError> {
        let peer = self.peers.get(peer.0).ok_or(UcxError::new(
            "an unknown endpoint",
            sys::UCS_ERR_NOT_CONNECTED,
        ))?;
        match peer.failed.get() {
            Some(status) => Err(UcxError::new("the peer's endpoint", status)),
            None => Ok(peer.ep),
        }
    }

    /// Unpacks `packed` (a remote key packed by the owner of `peer`'s worker) for `peer`.
    pub fn unpack_key(&mut self, peer: PeerId, packed: &[u8]) -> Result<RemoteKeyId, UcxError> {
        let ep = self.ep(peer)?;
        let mut rkey: sys::ucp_rkey_h = std::ptr::null_mut();
        // SAFETY: `ep` is a live endpoint of this worker; `packed` is readable for the call
        // (UCX reads the key's own length from it and copies what it keeps); `rkey` is a valid
        // place for the result. A buffer that is not a packed key is refused with a status.
        let status = unsafe { sys::ucp_ep_rkey_unpack(ep, packed.as_ptr().cast(), &mut rkey) };
        check(status).map_err(|status| UcxError::new("ucp_ep_rkey_unpack", status))?;
        self.keys.push((rkey, peer));
        Ok(RemoteKeyId(self.keys.len() - 1))
    }

    /// A free slot with room for `len` bytes, its state set to `Running`.
    fn take_slot(&mut self, token: u64, receive: bool, len: usize) -> usize {
        let index = match self.free.pop() {
            Some(index) => index,
            None => {
                let index = self.slots.len();
                self.slots.push(Box::new(Slot {
                    index,
                    generation: 0,
                    state: SlotState::Free,
                    token: 0,
                    receive: false,
                    stage: Stage::Tag,
                    request: std::ptr::null_mut(),
                    status: sys::UCS_OK,
                    sender_tag: 0,
                    len: 0,
                    buffer: Vec::new(),
                    ready: std::ptr::null(),
                }));
                index
            }
        };
        let ready: *const ReadyList = &*self.ready;
        self.active += 1;
        let slot = &mut self.slots[index];
        slot.generation += 1;
        slot.state = SlotState::Running;
        slot.token = token;
        slot.receive = receive;
        slot.stage = Stage::Tag;
        slot.request = std::ptr::null_mut();
        slot.status = sys::UCS_INPROGRESS;
        slot.sender_tag = 0;
        slot.len = len;
        slot.ready = ready;
        if slot.buffer.len() < len {
            slot.buffer.resize(len, 0);
        }
        index
    }

    /// The request parameters of an operation in `index`, its callback always called.
    fn op_param(&mut self, index: usize, receive: bool) -> sys::ucp_request_param_t {
        let user_data = (&raw mut *self.slots[index]).cast::<c_void>();
        let mut param = request_param(
            sys::UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
            if receive { None } else { Some(on_send_done) },
            user_data,
        );
        if receive {
            param.op_attr_mask |=
                sys::UCP_OP_ATTR_FIELD_CALLBACK | sys::UCP_OP_ATTR_FIELD_USER_DATA;
            param.cb = sys::ucp_request_param_cb {
                recv: Some(on_recv_done),
            };
        }
        param
    }

    /// Records what starting an operation in slot `index` returned.
    fn started(&mut self, index: usize, started: sys::ucs_status_ptr_t) {
        let slot = &mut self.slots[index];
        let status = match sys::status_ptr(started) {
            sys::StatusPtr::Request(request) => {
                // The callback may have run already, with the same request.
                slot.request = request;
                return;
            }
            sys::StatusPtr::Failed(status) => status,
            // Not with `NO_IMM_CMPL`, but harmless: done.
            sys::StatusPtr::Done => sys::UCS_OK,
        };
        if slot.state == SlotState::Running {
            slot.status = status;
            slot.state = SlotState::Finished;
            self.ready.0.borrow_mut().push_back(index);
        }
    }

    /// Sends `data` to `peer` with `tag`; completes (with `token`) from
    /// [`PeerWorker::progress`]. The bytes are copied first.
    pub fn tag_send(
        &mut self,
        peer: PeerId,
        tag: u64,
        data: &[u8],
        token: u64,
    ) -> Result<SlotId, UcxError> {
        let ep = self.ep(peer)?;
        let index = self.take_slot(token, false, data.len());
        self.slots[index].buffer[..data.len()].copy_from_slice(data);
        self.send_slot(ep, index, tag)
    }

    /// Sends the `len` bytes at `from` (a peer's memory) to `peer` with `tag`: fetches them into
    /// a slot, then sends them as [`PeerWorker::tag_send`] does; completes (with `token`, as a
    /// send) from [`PeerWorker::progress`]. Nothing waits: the fetch and the send advance as
    /// the worker progresses (and, over TCP, as the memory's owner does).
    pub fn tag_send_from(
        &mut self,
        peer: PeerId,
        tag: u64,
        from: RemoteMemory,
        len: usize,
        token: u64,
    ) -> Result<SlotId, UcxError> {
        self.ep(peer)?;
        let (ep, rkey) = self.remote(from)?;
        let index = self.take_slot(token, false, len);
        self.slots[index].stage = Stage::Fetch { peer, tag };
        let param = self.op_param(index, false);
        let buffer = self.slots[index].buffer.as_mut_ptr();
        // SAFETY: `ep` and `rkey` are live and belong together (`remote`); the slot has room for
        // `len` bytes, which stay allocated and untouched until the operation finishes (a
        // `Running` slot is not touched, and is freed only after the worker is destroyed);
        // `param`'s user data is the boxed slot, which `on_send_done` finishes.
        let started =
            unsafe { sys::ucp_get_nbx(ep, buffer.cast(), len, from.address, rkey, &param) };
        self.started(index, started);
        Ok(self.slot_id(index))
    }

    /// The endpoint and unpacked key of `remote`.
    fn remote(&self, remote: RemoteMemory) -> Result<(sys::ucp_ep_h, sys::ucp_rkey_h), UcxError> {
        let ep = self.ep(remote.peer)?;
        match self.keys.get(remote.key.0) {
            Some(&(rkey, owner)) if owner == remote.peer => Ok((ep, rkey)),
            _ => Err(UcxError::new(
                "a remote key of another endpoint",
                sys::UCS_ERR_NO_MESSAGE,
            )),
        }
    }

    fn send_slot(&mut self, ep: sys::ucp_ep_h, index: usize, tag: u64) -> Result<SlotId, UcxError> {
        let param = self.op_param(index, false);
        let slot = &self.slots[index];
        let (buffer, len) = (slot.buffer.as_ptr(), slot.len);
        // SAFETY: `ep` is a live endpoint of this worker; the slot's buffer holds `len` bytes
        // and stays allocated and unchanged until the operation finishes (a `Running` slot is
        // not touched, and is freed only after the worker is destroyed); `param`'s user data is
        // the boxed slot, which `on_send_done` finishes.
        let started = unsafe { sys::ucp_tag_send_nbx(ep, buffer.cast(), len, tag, &param) };
        self.started(index, started);
        Ok(self.slot_id(index))
    }

    /// Receives a message whose tag matches `tag` under `mask` (`(sender & mask) == (tag &
    /// mask)`), of at most `capacity` bytes; completes (with `token`) from
    /// [`PeerWorker::progress`].
    pub fn tag_recv(&mut self, tag: u64, mask: u64, capacity: usize, token: u64) -> SlotId {
        let index = self.take_slot(token, true, capacity);
        let param = self.op_param(index, true);
        let buffer = self.slots[index].buffer.as_mut_ptr();
        // SAFETY: the worker is live; the slot's buffer has room for `capacity` bytes and stays
        // allocated and untouched until the operation finishes (as for sends); `param`'s user
        // data is the boxed slot, which `on_recv_done` finishes.
        let started = unsafe {
            sys::ucp_tag_recv_nbx(
                self.worker.raw(),
                buffer.cast(),
                capacity,
                tag,
                mask,
                &param,
            )
        };
        self.started(index, started);
        self.slot_id(index)
    }

    fn slot_id(&self, index: usize) -> SlotId {
        SlotId {
            index,
            generation: self.slots[index].generation,
        }
    }

    /// Copies the first `len` bytes of the finished operation's slot `slot` to `to` (a peer's
    /// memory) and flushes them there; completes (with `token`, as [`OperationKind::Put`], in a
    /// slot named anew) from [`PeerWorker::progress`]. The slot is the operation's until then:
    /// `slot` no longer names it. Nothing waits. An error here leaves `slot` as it was.
    pub fn put(
        &mut self,
        slot: SlotId,
        to: RemoteMemory,
        len: usize,
        token: u64,
    ) -> Result<(), UcxError> {
        let index = self.check_taken(slot)?;
        let (ep, rkey) = self.remote(to)?;
        let ready: *const ReadyList = &*self.ready;
        self.active += 1;
        let s = &mut self.slots[index];
        let len = len.min(s.buffer.len());
        s.generation += 1;
        s.state = SlotState::Running;
        s.token = token;
        s.receive = false;
        s.stage = Stage::Put { peer: to.peer };
        s.request = std::ptr::null_mut();
        s.status = sys::UCS_INPROGRESS;
        s.len = len;
        s.ready = ready;
        let param = self.op_param(index, false);
        let buffer = self.slots[index].buffer.as_ptr();
        // SAFETY: `ep` and `rkey` are live and belong together (`remote`); the slot holds `len`
        // readable bytes that stay allocated and unchanged until the operation finishes (as for
        // the other operations); `param`'s user data is the boxed slot.
        let started = unsafe { sys::ucp_put_nbx(ep, buffer.cast(), len, to.address, rkey, &param) };
        self.started(index, started);
        Ok(())
    }

    /// Starts what follows the finished request of slot `index` (its stage), if anything:
    /// `true` when the slot runs again.
    fn advance(&mut self, index: usize) -> bool {
        let slot = &self.slots[index];
        if check(slot.status).is_err() {
            return false;
        }
        let (peer, then) = match slot.stage {
            Stage::Tag | Stage::Flush => return false,
            Stage::Fetch { peer, tag } => (peer, Some(tag)),
            Stage::Put { peer } => (peer, None),
        };
        let ep = match self.ep(peer) {
            Ok(ep) => ep,
            Err(error) => {
                self.slots[index].status = error.status;
                return false;
            }
        };
        let slot = &mut self.slots[index];
        slot.stage = if then.is_some() {
            Stage::Tag
        } else {
            Stage::Flush
        };
        slot.state = SlotState::Running;
        slot.status = sys::UCS_INPROGRESS;
        match then {
            // `send_slot` records what starting the send returned.
            Some(tag) => drop(self.send_slot(ep, index, tag)),
            None => {
                let param = self.op_param(index, false);
                // SAFETY: `ep` is a live endpoint of this worker; `param`'s user data is the
                // boxed slot, which `on_send_done` finishes.
                let started = unsafe { sys::ucp_ep_flush_nbx(ep, &param) };
                self.started(index, started);
            }
        }
        true
    }

    fn check_taken(&self, slot: SlotId) -> Result<usize, UcxError> {
        match self.slots.get(slot.index) {
            Some(s) if s.generation == slot.generation && s.state == SlotState::Taken => {
                Ok(slot.index)
            }
            _ => Err(UcxError::new(
                "a released operation slot",
                sys::UCS_ERR_NO_MESSAGE,
            )),
        }
    }

    /// The bytes of a finished operation's slot: what a receive got, what a send sent; empty
    /// once released.
    pub fn slot(&self, slot: SlotId) -> &[u8] {
        match self.check_taken(slot) {
            Ok(index) => {
                let s = &self.slots[index];
                &s.buffer[..s.len.min(s.buffer.len())]
            }
            Err(_) => &[],
        }
    }

    /// Gives a finished operation's slot back for reuse.
    pub fn release(&mut self, slot: SlotId) {
        if let Ok(index) = self.check_taken(slot) {
            self.slots[index].state = SlotState::Free;
            self.free.push(index);
        }
    }

    /// Progresses the worker and returns the next finished operation, if any. Its slot stays
    /// readable until released.
    pub fn progress(&mut self) -> Option<Completion> {
        if self.ready.0.borrow().is_empty() {
            self.worker.progress();
        }
        let index = loop {
            let index = self.ready.0.borrow_mut().pop_front()?;
            let slot = &mut self.slots[index];
            if !slot.request.is_null() {
                // SAFETY: the request finished (its callback ran) and is freed once, here.
                unsafe { sys::ucp_request_free(slot.request) };
                slot.request = std::ptr::null_mut();
            }
            if !self.advance(index) {
                break index;
            }
        };
        self.active -= 1;
        let slot = &mut self.slots[index];
        slot.state = SlotState::Taken;
        let (kind, op) = match slot.stage {
            _ if slot.receive => (
                OperationKind::Receive {
                    sender_tag: slot.sender_tag,
                    len: slot.len,
                },
                "ucp_tag_recv_nbx",
            ),
            Stage::Fetch { .. } => (OperationKind::Send, "ucp_get_nbx"),
            Stage::Tag => (OperationKind::Send, "ucp_tag_send_nbx"),
            Stage::Put { .. } => (OperationKind::Put { len: slot.len }, "ucp_put_nbx"),
            Stage::Flush => (OperationKind::Put { len: slot.len }, "ucp_ep_flush_nbx"),
        };
        Some(Completion {
            token: slot.token,
            slot: SlotId {
                index,
                generation: slot.generation,
            },
            kind,
            result: check(slot.status).map_err(|status| UcxError::new(op, status)),
        })
    }

    /// How many operations were started and not yet handed out by [`PeerWorker::progress`].
    pub fn running(&self) -> usize {
        self.active
    }
}

impl Drop for PeerWorker {
    fn drop(&mut self) {
        if let (false, Ok(context)) = (self.imported.is_empty(), peer_context()) {
            for memh in self.imported.drain(..) {
                // SAFETY: mapped in this context by `import_memh`, unmapped once.
                let _ = unsafe { sys::ucp_mem_unmap(context, memh) };
            }
        }
        for (rkey, _) in self.keys.drain(..) {
            // SAFETY: unpacked on an endpoint of this worker, destroyed once, before the
            // endpoints close.
            unsafe { sys::ucp_rkey_destroy(rkey) };
        }
        for peer in &self.peers {
            // SAFETY: a live endpoint of this worker, closed once; its error-handler argument
            // lives until the worker is destroyed below (the peers drop after that).
            unsafe { super::ucp::close_ep_now(peer.ep) };
        }
        // Running operations end with the worker, which is dropped first of the fields (before
        // the slots' buffers and the ready list its callbacks write).
        self.worker.progress_all();
    }
}

/// UCX's endpoint error handler: notes the failure for the endpoint's owner.
///
/// # Safety
/// `arg` is the endpoint's boxed cell (see [`PeerWorker::connect`]).
unsafe extern "C" fn on_peer_error(
    arg: *mut c_void,
    _ep: sys::ucp_ep_h,
    status: sys::ucs_status_t,
) {
    // SAFETY: `arg` is the live boxed cell of the endpoint (caller); UCX calls this from the
    // owner's progress, on the owner's thread.
    let failed = unsafe { &*arg.cast::<Cell<Option<sys::ucs_status_t>>>() };
    failed.set(Some(status));
}

/// Finishes slot `user_data` with `status`.
///
/// # Safety
/// `user_data` is a live boxed [`Slot`] of a worker on this thread, whose operation this is.
unsafe fn finish<'a>(
    request: *mut c_void,
    status: sys::ucs_status_t,
    user_data: *mut c_void,
) -> &'a mut Slot {
    // SAFETY: (caller) the slot lives and nothing else borrows it during UCX's progress.
    let slot = unsafe { &mut *user_data.cast::<Slot>() };
    slot.request = request;
    slot.status = status;
    slot.state = SlotState::Finished;
    // SAFETY: `ready` points to the worker's boxed list, which outlives its slots' operations.
    let ready = unsafe { &*slot.ready };
    ready.0.borrow_mut().push_back(slot.index);
    slot
}

unsafe extern "C" fn on_send_done(
    request: *mut c_void,
    status: sys::ucs_status_t,
    user_data: *mut c_void,
) {
    // SAFETY: UCX passes the user data of `PeerWorker::op_param`: a live boxed slot.
    unsafe { finish(request, status, user_data) };
}

unsafe extern "C" fn on_recv_done(
    request: *mut c_void,
    status: sys::ucs_status_t,
    info: *const sys::ucp_tag_recv_info_t,
    user_data: *mut c_void,
) {
    // SAFETY: UCX passes the user data of `PeerWorker::op_param`: a live boxed slot.
    let slot = unsafe { finish(request, status, user_data) };
    if !info.is_null() {
        // SAFETY: non-null: UCX's receive information, valid for the callback.
        let info = unsafe { *info };
        slot.sender_tag = info.sender_tag;
        slot.len = info.length.min(slot.len);
    } else {
        slot.len = 0;
    }
}

/// The address of `worker`.
fn worker_address(worker: &Worker) -> Result<Vec<u8>, UcxError> {
    worker.address().map_err(|e| match e {
        super::UcxConnectError::Ucx { op, status } => UcxError::new(op, status),
        _ => UcxError::new("ucp_worker_query", sys::UCS_ERR_NO_MESSAGE),
    })
}

/// The host's worker for its mapped memory: peers' remote memory access to it needs its
/// progress over transports that emulate RMA (TCP). See the module docs.
pub struct HostMemoryWorker {
    worker: Worker,
    address: Vec<u8>,
}

impl fmt::Debug for HostMemoryWorker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostMemoryWorker").finish_non_exhaustive()
    }
}

impl HostMemoryWorker {
    /// A worker of the process-wide peer context.
    pub fn new() -> Result<Self, UcxError> {
        let context = peer_context().map_err(|status| UcxError::new(init_op(), status))?;
        let worker = Worker::in_context(context, c"urom-host-memory")
            .map_err(|(op, status)| UcxError::new(op, status))?;
        let address = worker_address(&worker)?;
        Ok(Self { worker, address })
    }

    /// The worker's UCP address: peers reach the host's mapped memory through it.
    pub fn address(&self) -> &[u8] {
        &self.address
    }

    /// One round of progress; how many events it handled.
    pub fn progress(&self) -> u32 {
        self.worker.progress()
    }

    /// The descriptor that wakes a sleeper once [`HostMemoryWorker::arm`] said it may sleep.
    pub fn wake_fd(&self) -> BorrowedFd<'_> {
        self.worker.efd()
    }

    /// Prepares to sleep on [`HostMemoryWorker::wake_fd`]: progresses the worker until it
    /// finds nothing more, then arms it; `false` when events wait (progress instead).
    pub fn arm(&self) -> bool {
        self.worker.progress_until_quiet() && matches!(self.worker.arm(), Armed::Yes)
    }
}

/// Zeroed host memory mapped for remote access, with its packed remote key. See the module
/// docs.
///
/// INVARIANTS: `ptr` is a `len`-byte allocation of `layout` made here, registered as `memh`
/// with the peer context until `drop` unmaps it (before freeing it).
pub struct MappedMemory {
    ptr: NonNull<u8>,
    len: usize,
    memh: sys::ucp_mem_h,
    rkey: Vec<u8>,
    /// The handle packed for export; empty where UCX cannot export.
    exported_memh: Vec<u8>,
}

impl fmt::Debug for MappedMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MappedMemory")
            .field("va", &format_args!("{:#x}", self.va()))
            .field("len", &self.len)
            .field("rkey_len", &self.rkey.len())
            .field("exported_memh_len", &self.exported_memh.len())
            .finish()
    }
}

/// Why a copy into or out of [`MappedMemory`] was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfBounds {
    /// Where the copy started.
    pub offset: usize,
    /// How long it was.
    pub len: usize,
    /// The memory's length.
    pub size: usize,
}

impl fmt::Display for OutOfBounds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} bytes at offset {} do not fit {} bytes of mapped memory",
            self.len, self.offset, self.size
        )
    }
}

impl std::error::Error for OutOfBounds {}

// SAFETY: the memory is owned (a raw allocation nothing else refers to) and the memory handle
// belongs to the thread-safe peer context (`mt_workers_shared`); every access copies.
unsafe impl Send for MappedMemory {}

const PAGE: usize = 4096;

impl MappedMemory {
    /// `len` (at least 1) zeroed bytes, mapped for local and remote reading and writing.
    pub fn new(len: usize) -> Result<Self, UcxError> {
        let context = peer_context().map_err(|status| UcxError::new(init_op(), status))?;
        let layout = std::alloc::Layout::from_size_align(len.max(1), PAGE)
            .map_err(|_| UcxError::new("allocating memory to map", sys::UCS_ERR_NO_RESOURCE))?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or(UcxError::new(
            "allocating memory to map",
            sys::UCS_ERR_NO_RESOURCE,
        ))?;
        // SAFETY: all-zero is a valid `ucp_mem_map_params_t`; only the named fields are read.
        let mut params: sys::ucp_mem_map_params_t = unsafe { std::mem::zeroed() };
        params.field_mask = sys::UCP_MEM_MAP_PARAM_FIELD_ADDRESS
            | sys::UCP_MEM_MAP_PARAM_FIELD_LENGTH
            | sys::UCP_MEM_MAP_PARAM_FIELD_PROT;
        params.address = raw.cast();
        params.length = layout.size();
        params.prot = sys::UCP_MEM_MAP_PROT_LOCAL_READ
            | sys::UCP_MEM_MAP_PROT_LOCAL_WRITE
            | sys::UCP_MEM_MAP_PROT_REMOTE_READ
            | sys::UCP_MEM_MAP_PROT_REMOTE_WRITE;
        let mut memh: sys::ucp_mem_h = std::ptr::null_mut();
        // SAFETY: the context is live; `params` names memory allocated above, which stays
        // allocated until unmapped; `memh` is a valid place for the result.
        let status = unsafe { sys::ucp_mem_map(context, &params, &mut memh) };
        if let Err(status) = check(status) {
            // SAFETY: allocated above with `layout`, not mapped, freed once.
            unsafe { std::alloc::dealloc(raw, layout) };
            return Err(UcxError::new("ucp_mem_map", status));
        }
        let mut mapped = Self {
            ptr,
            len: layout.size(),
            memh,
            rkey: Vec::new(),
            exported_memh: Vec::new(),
        };
        let mut packed: *mut c_void = std::ptr::null_mut();
        let mut packed_len = 0usize;
        // SAFETY: the context is live and `memh` is its mapping; both outputs are valid.
        let status = unsafe { sys::ucp_rkey_pack(context, memh, &mut packed, &mut packed_len) };
        check(status).map_err(|status| UcxError::new("ucp_rkey_pack", status))?;
        if !packed.is_null() {
            // SAFETY: UCX packed `packed_len` readable bytes at `packed`, valid until released.
            let bytes = unsafe { std::slice::from_raw_parts(packed.cast::<u8>(), packed_len) };
            mapped.rkey = bytes.to_vec();
            // SAFETY: packed by ucp_rkey_pack, released once.
            unsafe { sys::ucp_rkey_buffer_release(packed) };
        }
        if exported_memh_supported() {
            mapped.exported_memh = mapped.pack_for_export()?;
        }
        Ok(mapped)
    }

    /// The memory handle packed for export (`ucp_memh_pack` with `UCP_MEMH_PACK_FLAG_EXPORT`).
    #[cfg(ucx_1_15)]
    fn pack_for_export(&self) -> Result<Vec<u8>, UcxError> {
        let params = sys::ucp_memh_pack_params_t {
            field_mask: sys::UCP_MEMH_PACK_PARAM_FIELD_FLAGS,
            flags: sys::UCP_MEMH_PACK_FLAG_EXPORT,
        };
        let mut packed: *mut c_void = std::ptr::null_mut();
        let mut packed_len = 0usize;
        // SAFETY: `memh` is the peer context's live mapping; `params` sets a flag (flags 0 is
        // fatal in UCX); both outputs are valid places.
        let status =
            unsafe { sys::ucp_memh_pack(self.memh, &params, &mut packed, &mut packed_len) };
        check(status).map_err(|status| UcxError::new("ucp_memh_pack (export)", status))?;
        if packed.is_null() {
            return Ok(Vec::new());
        }
        // SAFETY: UCX packed `packed_len` readable bytes at `packed`, valid until released.
        let bytes = unsafe { std::slice::from_raw_parts(packed.cast::<u8>(), packed_len) }.to_vec();
        let release = sys::ucp_memh_buffer_release_params_t::default();
        // SAFETY: packed by ucp_memh_pack, released once.
        unsafe { sys::ucp_memh_buffer_release(packed, &release) };
        Ok(bytes)
    }

    #[cfg(not(ucx_1_15))]
    fn pack_for_export(&self) -> Result<Vec<u8>, UcxError> {
        Ok(Vec::new())
    }

    /// Its address in this process (the `va` of a domain buffer).
    pub fn va(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty (never: at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Its packed remote key (`ucp_rkey_pack`), for a domain's `add_buffer`.
    pub fn rkey(&self) -> &[u8] {
        &self.rkey
    }

    /// Its memory handle packed for export (`ucp_memh_pack` with `UCP_MEMH_PACK_FLAG_EXPORT`),
    /// for a domain's `add_buffer` and the sandbox's MEM_MAP; empty where UCX cannot export
    /// ([`exported_memh_supported`]), and a buffer added with it then has memory-handle
    /// lookups answering `DOCA_ERROR_NOT_SUPPORTED`.
    pub fn exported_memh(&self) -> &[u8] {
        &self.exported_memh
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), OutOfBounds> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(OutOfBounds {
                offset,
                len,
                size: self.len,
            }),
        }
    }

    /// Copies `bytes` in at `offset`.
    pub fn write(&mut self, offset: usize, bytes: &[u8]) -> Result<(), OutOfBounds> {
        self.check(offset, bytes.len())?;
        // SAFETY: in bounds (checked); the memory is ours and only ever copied to and from, so
        // no reference to it exists; `bytes` cannot overlap it (no reference to it exists).
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.ptr.as_ptr().wrapping_add(offset),
                bytes.len(),
            )
        };
        Ok(())
    }

    /// Copies `out.len()` bytes out from `offset`.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), OutOfBounds> {
        self.check(offset, out.len())?;
        // SAFETY: in bounds (checked); as for `write`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().wrapping_add(offset),
                out.as_mut_ptr(),
                out.len(),
            )
        };
        Ok(())
    }
}

impl Drop for MappedMemory {
    fn drop(&mut self) {
        if let Ok(context) = peer_context() {
            // SAFETY: `memh` is this context's mapping, unmapped once.
            let _ = unsafe { sys::ucp_mem_unmap(context, self.memh) };
        }
        let layout = std::alloc::Layout::from_size_align(self.len, PAGE)
            .expect("the layout it was allocated with");
        // SAFETY: allocated in `new` with this layout (size `len`, page-aligned), unmapped above,
        // freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
    }
}
