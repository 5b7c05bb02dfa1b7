//! What UCX calls back into, for one end of a connection: the receive slots, the send credits,
//! the peer's closes and failure, and the handshake's messages.
//!
//! A [`State`] lives at a fixed heap address (see [`StateBox`]) registered with the shared
//! worker as the argument of the handlers of the end's own active-message ids. UCX runs the
//! handlers only inside calls into the worker (`ucp_worker_progress` and the like), and a thread
//! calls into the worker, or touches any end's state, only while it holds the shared worker's
//! lock; so a handler and the code that holds the lock never touch the state at the same time,
//! and no Rust reference to the state is held across a call into the worker.

use std::ffi::c_void;
use std::os::fd::RawFd;

use ucx_sys as sys;
use urom_wire::ucx::{UcxBatchFrames, UcxControlKind, UcxControlRepr, UcxDataRepr};

use super::UcxConnectError;
use super::ucp::{self, Queued, Worker};
use crate::PeerGoneError;

/// Active-message ids, as offsets from an end's first id (`am_base`, exchanged in the
/// handshake).
pub(super) const AM_DATA: u32 = 0;
pub(super) const AM_CONTROL: u32 = 1;
pub(super) const AM_HANDSHAKE: u32 = 2;
/// Several frames in one message (a corked sender's burst).
pub(super) const AM_BATCH: u32 = 3;

/// Largest batch message: a corked sender's frames go out together in messages of at most
/// this many bytes, which UCX sends eagerly in one fragment over its usual transports (their
/// segments are 8 KiB, headers included).
pub(super) const BATCH_BYTES: usize = 8 * 1024 - 256;

/// Largest handshake message accepted (a hello or answer with a worker address).
pub(super) const MAX_HANDSHAKE_LEN: usize = 64 << 10;

/// The two halves of one end, as indexes.
pub(super) const TX: usize = 0;
pub(super) const RX: usize = 1;

/// A receive slot's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Slot {
    /// Free for the peer's next frame.
    Free,
    /// A rendezvous receive into it is under way.
    Filling,
    /// Holds a frame not yet handed out.
    Ready,
    /// Holds the frame `recv` lent out.
    Held,
}

/// What a send-completion or receive-completion callback is about: the state and which of its
/// cells.
pub(super) struct CallbackCtx {
    state: *mut State,
    index: usize,
}

/// A byte buffer at a fixed address, written and read through raw pointers only (UCX and a
/// lent frame may use parts of it while the connection's code uses others).
pub(super) struct RawBuf {
    ptr: *mut u8,
    len: usize,
}

impl RawBuf {
    /// `len` zeroed bytes (the allocator maps large ones lazily).
    fn new(len: usize) -> Self {
        let boxed = vec![0u8; len].into_boxed_slice();
        let len = boxed.len();
        let ptr = Box::into_raw(boxed).cast::<u8>();
        Self { ptr, len }
    }

    fn empty() -> Self {
        Self::new(0)
    }

    /// The address of byte `at`.
    pub(super) fn at(&self, at: usize) -> *mut u8 {
        debug_assert!(at <= self.len);
        self.ptr.wrapping_add(at)
    }
}

impl Drop for RawBuf {
    fn drop(&mut self) {
        let slice = std::ptr::slice_from_raw_parts_mut(self.ptr, self.len);
        // SAFETY: `ptr` and `len` came from `Box::into_raw` of a boxed slice in `new`, and are
        // freed once, here.
        drop(unsafe { Box::from_raw(slice) });
    }
}

/// The receiving side's state.
pub(super) struct Rx {
    /// Slots (our credits to the peer), each of `max` bytes in `buf`.
    pub(super) slots: usize,
    pub(super) buf: RawBuf,
    pub(super) len: Box<[usize]>,
    pub(super) slot: Box<[Slot]>,
    ctx: Box<[CallbackCtx]>,
    /// Frames whose bytes are all in their slot so far.
    pub(super) arrived: u64,
    /// Frames handed to `recv` so far (the next one's sequence number).
    pub(super) delivered: u64,
    /// Frames released so far: the peer may send frames up to `released + slots`.
    pub(super) released: u64,
    /// `released` as last told to the peer.
    pub(super) reported: u64,
    /// How many frames the peer sent in all, once it closed its sending half.
    pub(super) peer_total: Option<u64>,
    /// Our receiving half closed: frames that arrive are dropped.
    pub(super) closed: bool,
    /// Frames received through the rendezvous path (a test looks).
    pub(super) rendezvous: u64,
}

/// The sending side's state; sized once the peer's slot count is known.
pub(super) struct Tx {
    /// The peer's slots: our credits.
    pub(super) slots: usize,
    /// Frames sent so far (the next one's sequence number).
    pub(super) sent: u64,
    /// Frames the peer released so far.
    pub(super) peer_released: u64,
    /// Copies of frames whose send did not complete at once, with their headers; `busy` while
    /// UCX still uses them.
    pub(super) buf: RawBuf,
    pub(super) headers: Box<[[u8; 8]]>,
    pub(super) busy: Box<[bool]>,
    ctx: Box<[CallbackCtx]>,
    /// The peer closed its receiving half.
    pub(super) peer_closed: bool,
    /// Frames held for one batch message while the sender is corked: `batch_len` bytes of
    /// entries in `batch` ([`BATCH_BYTES`]), `batch_frames` of them, the first numbered
    /// `batch_first`. Only the sending code touches it; UCX reads it during a send that is
    /// waited for.
    pub(super) batch: RawBuf,
    pub(super) batch_len: usize,
    pub(super) batch_frames: usize,
    pub(super) batch_first: u64,
}

/// The control messages this end sends, each from a header cell of its own that stays put
/// while UCX sends it.
pub(super) struct Controls {
    pub(super) credit: [u8; 16],
    /// A credit message is being sent from `credit`.
    pub(super) credit_busy: bool,
    credit_ctx: CallbackCtx,
    pub(super) sender_closed: [u8; 16],
    pub(super) receiver_closed: [u8; 16],
    close_seen: [u8; 16],
    /// This end died on purpose (see `UcxControlKind::Abort`).
    pub(super) abort: [u8; 16],
    /// This end told the peer that its closes arrived.
    close_seen_sent: bool,
}

/// Everything UCX calls back into, for one end of a connection.
pub(super) struct State {
    pub(super) worker: sys::ucp_worker_h,
    /// The data endpoint, once the handshake made it.
    pub(super) ep: sys::ucp_ep_h,
    /// The peer end's first active-message id.
    pub(super) peer_am: u32,
    /// The peer received both of this end's closes and every frame before them.
    pub(super) peer_saw_close: bool,
    pub(super) max: usize,
    pub(super) rx: Rx,
    pub(super) tx: Tx,
    pub(super) controls: Controls,
    /// The data endpoint failed: the peer died or cannot be reached (UCX's status).
    pub(super) failed: Option<sys::ucs_status_t>,
    /// The peer broke the protocol.
    pub(super) protocol: Option<&'static str>,
    /// The last handshake message that arrived.
    pub(super) handshake_in: Option<Vec<u8>>,
    /// The handshake messages this end sent (kept as long as the state: UCX reads them).
    pub(super) handshake_out: Vec<Vec<u8>>,
    /// Which halves sleep and must be woken through their descriptor; changed only through
    /// [`State::sleep`] and [`State::awake`], which count them for the wake thread.
    sleeping: [bool; 2],
    pub(super) wakers: [RawFd; 2],
}

/// A [`State`] at a fixed heap address, freed on drop.
///
/// INVARIANTS: `ptr` came from `Box::into_raw` and is freed only by `drop`; a reference made from
/// it is never held across a call into the worker the state is registered with.
pub(super) struct StateBox {
    ptr: *mut State,
}

impl StateBox {
    /// The state of a connection carrying frames of at most `max` bytes, with `slots` receive
    /// slots, registered with `worker`'s active-message handlers for the ids from `am_base`.
    /// `wakers` are the descriptors that wake each half. The caller holds the worker's lock.
    pub(super) fn new(
        worker: &Worker,
        am_base: u32,
        max: usize,
        slots: usize,
        wakers: [RawFd; 2],
    ) -> Result<Self, UcxConnectError> {
        let state = Box::new(State {
            worker: worker.raw(),
            ep: std::ptr::null_mut(),
            peer_am: 0,
            peer_saw_close: false,
            max,
            rx: Rx {
                slots,
                buf: RawBuf::new(slots * max),
                len: vec![0; slots].into_boxed_slice(),
                slot: vec![Slot::Free; slots].into_boxed_slice(),
                ctx: Box::new([]),
                arrived: 0,
                delivered: 0,
                released: 0,
                reported: 0,
                peer_total: None,
                closed: false,
                rendezvous: 0,
            },
            tx: Tx {
                slots: 0,
                sent: 0,
                peer_released: 0,
                buf: RawBuf::empty(),
                headers: Box::new([]),
                busy: Box::new([]),
                ctx: Box::new([]),
                peer_closed: false,
                batch: RawBuf::empty(),
                batch_len: 0,
                batch_frames: 0,
                batch_first: 0,
            },
            controls: Controls {
                credit: [0; 16],
                credit_busy: false,
                credit_ctx: CallbackCtx {
                    state: std::ptr::null_mut(),
                    index: 0,
                },
                sender_closed: [0; 16],
                receiver_closed: [0; 16],
                close_seen: [0; 16],
                abort: [0; 16],
                close_seen_sent: false,
            },
            failed: None,
            protocol: None,
            handshake_in: None,
            handshake_out: Vec::new(),
            sleeping: [false; 2],
            wakers,
        });
        let ptr = Box::into_raw(state);
        let this = Self { ptr };
        {
            // SAFETY: just allocated, not yet shared with UCX.
            let state = unsafe { &mut *ptr };
            state.rx.ctx = (0..slots)
                .map(|index| CallbackCtx { state: ptr, index })
                .collect();
            state.controls.credit_ctx.state = ptr;
        }
        let arg = ptr.cast::<c_void>();
        for (id, handler) in [
            (AM_DATA, on_data as ucp::AmHandler),
            (AM_CONTROL, on_control),
            (AM_HANDSHAKE, on_handshake),
            (AM_BATCH, on_batch),
        ] {
            // SAFETY: the state lives until its owner registered other handlers for these ids
            // (`Shared::give_ids`).
            unsafe { worker.set_handler(am_base + id, handler, arg)? };
        }
        Ok(this)
    }

    /// The state's address, for UCX.
    pub(super) fn as_ptr(&self) -> *mut State {
        self.ptr
    }

    /// The state. Borrowing the box mutably is what makes this sound: the owner (a connection
    /// end, under the shared worker's lock) holds the box beside its worker handle, so the
    /// compiler keeps the reference from living across a call into the worker, where UCX's
    /// callbacks reach the state through the raw pointer. (A closure that holds the box, such
    /// as [`Worker::send_or_queue`]'s queue, makes the reference only while it runs, between
    /// calls into the worker.)
    pub(super) fn get(&mut self) -> &mut State {
        // SAFETY: see the type's invariants; `&mut self` excludes every other reference made
        // through the box, and callbacks run only inside calls into the worker, which need the
        // owner's worker borrowed while this reference is not.
        unsafe { &mut *self.ptr }
    }
}

impl Drop for StateBox {
    fn drop(&mut self) {
        // SAFETY: from Box::into_raw, freed once; its owner made sure nothing of UCX's still
        // calls back into it (its ids have other handlers, its requests completed), or forgot
        // the box instead.
        drop(unsafe { Box::from_raw(self.ptr) });
    }
}

impl State {
    /// Sizes the sending side for a peer with `slots` receive slots.
    pub(super) fn set_peer_slots(&mut self, slots: usize) {
        let ptr: *mut State = self;
        self.tx.slots = slots;
        self.tx.buf = RawBuf::new(slots * self.max);
        self.tx.headers = vec![[0; 8]; slots].into_boxed_slice();
        self.tx.busy = vec![false; slots].into_boxed_slice();
        self.tx.ctx = (0..slots)
            .map(|index| CallbackCtx { state: ptr, index })
            .collect();
        self.tx.batch = RawBuf::new(BATCH_BYTES);
    }

    /// Marks `half` asleep on its own descriptor, the shared worker armed: from now on a
    /// callback that receives for it wakes it, and the wake thread watches the worker (see
    /// `watch`). The caller holds the worker's lock.
    pub(super) fn sleep(&mut self, half: usize) {
        if !self.sleeping[half] {
            self.sleeping[half] = true;
            super::watch::sleeper_in();
        }
    }

    /// Marks `half` awake (it progresses the worker itself, or is gone). The caller holds the
    /// worker's lock.
    #[inline]
    pub(super) fn awake(&mut self, half: usize) {
        if self.sleeping[half] {
            self.sleeping[half] = false;
            super::watch::sleeper_out();
        }
    }

    /// Wakes `half` if it sleeps.
    #[inline]
    pub(super) fn wake(&mut self, half: usize) {
        if self.sleeping[half] {
            self.awake(half);
            crate::sys::wake(
                // SAFETY: the descriptor is owned by the connection, which outlives the state's
                // use by UCX.
                unsafe { std::os::fd::BorrowedFd::borrow_raw(self.wakers[half]) },
            );
        }
    }

    fn wake_both(&mut self) {
        self.wake(TX);
        self.wake(RX);
    }

    /// Once both of the peer's closes and every frame before them arrived, tells the peer,
    /// which may then hang up (see `conn`'s lingering close).
    fn maybe_confirm_close(&mut self) {
        let rx = &self.rx;
        let all_arrived = rx.closed || rx.peer_total.is_some_and(|total| rx.arrived >= total);
        if self.controls.close_seen_sent
            || self.ep.is_null()
            || self.failed.is_some()
            || !self.tx.peer_closed
            || !all_arrived
        {
            return;
        }
        self.controls.close_seen_sent = true;
        self.controls.close_seen = UcxControlRepr {
            kind: UcxControlKind::CloseSeen,
            value: 0,
        }
        .to_bytes();
        let header: *const [u8] = &raw const self.controls.close_seen;
        // SAFETY: `ep` is the live data endpoint; the header cell belongs to the state, which
        // lives until its sends completed, and is written only once (above). Sending from
        // inside a callback is allowed (only progressing the worker is not).
        let sent = unsafe {
            ucp::am_send(
                self.ep,
                self.peer_am + AM_CONTROL,
                header,
                &[],
                0,
                ucp::Completion::Later,
            )
        };
        // Nothing waits for it: without it the peer lingers until its close gives up.
        let _ = ucp::detach_request(sent);
    }

    /// Queues the frame numbered `seq` and its `header` in the frame's send slot (which the
    /// caller checked is free), copying the frame into the slot's send buffer; the slot is
    /// busy from when UCX takes it until [`on_sent`].
    pub(super) fn queue_frame(&mut self, seq: u64, header: [u8; 8], frame: &[u8]) -> Queued {
        let index = self.tx.slot(seq);
        self.tx.headers[index] = header;
        let dst = self.tx.buf.at(index * self.max);
        if !frame.is_empty() {
            // SAFETY: the send buffer has `max >= frame.len()` bytes for slot `index`, which is
            // not busy (the caller checked), so UCX does not read it now.
            unsafe { std::ptr::copy_nonoverlapping(frame.as_ptr(), dst, frame.len()) };
        }
        let ctx = self.tx.ctx(index);
        let header: *const [u8] = &raw const self.tx.headers[index];
        let data = std::ptr::slice_from_raw_parts(dst.cast_const(), frame.len());
        // SAFETY: header cell, buffer and callback context belong to the state, which lives
        // until its sends completed, and stay untouched while the slot is busy.
        unsafe { Queued::new(header, data, Some((on_sent, ctx))) }
    }

    /// Queues the credit message `bytes` in its header cell, unless a credit message is still
    /// being sent from there; the cell is busy from when UCX takes it until
    /// [`on_credit_sent`].
    pub(super) fn queue_credit(&mut self, bytes: [u8; 16]) -> Option<Queued> {
        let controls = &mut self.controls;
        if controls.credit_busy {
            return None;
        }
        controls.credit = bytes;
        let ctx = controls.credit_ctx();
        let header: *const [u8] = &raw const controls.credit;
        // SAFETY: the header cell and the callback context are fields of the state, which
        // lives until its sends completed; the cell is not written again until the callback
        // clears `credit_busy`.
        Some(unsafe { Queued::new(header, &[], Some((on_credit_sent, ctx))) })
    }

    /// The peer broke the protocol: the connection is unusable.
    pub(super) fn broken(&mut self, what: &'static str) {
        if self.protocol.is_none() {
            self.protocol = Some(what);
        }
        self.wake_both();
    }

    /// How the peer went away, if it did, as seen by the receiving half (only once every frame
    /// it sent has been received).
    pub(super) fn rx_gone(&self) -> Option<PeerGoneError> {
        if self
            .rx
            .peer_total
            .is_some_and(|total| self.rx.delivered >= total)
        {
            Some(PeerGoneError::Closed)
        } else if self.failed.is_some() {
            Some(PeerGoneError::Died)
        } else {
            None
        }
    }

    /// How the peer went away, if it did, as seen by the sending half.
    pub(super) fn tx_gone(&self) -> Option<PeerGoneError> {
        if self.tx.peer_closed {
            Some(PeerGoneError::Closed)
        } else if self.failed.is_some() {
            Some(PeerGoneError::Died)
        } else {
            None
        }
    }

    /// Whether the next frame in order is ready to be handed out.
    #[inline]
    pub(super) fn rx_ready(&self) -> bool {
        let slot = (self.rx.delivered % self.rx.slots as u64) as usize;
        self.rx.slot[slot] == Slot::Ready
    }

    /// Whether a frame may be sent now: a credit is left and its send buffer is free.
    #[inline]
    pub(super) fn tx_room(&self) -> bool {
        let tx = &self.tx;
        tx.sent < tx.peer_released + tx.slots as u64
            && !tx.busy[(tx.sent % tx.slots as u64) as usize]
    }
}

/// The `len` bytes UCX passed at `ptr` to a callback; empty when `len` is 0 or `ptr` NULL.
///
/// # Safety
///
/// Unless `len` is 0 or `ptr` is NULL, `ptr` must point to `len` readable bytes that stay
/// valid and unchanged for `'a` (for a callback's arguments: until the callback returns).
pub(super) unsafe fn callback_bytes<'a>(ptr: *const c_void, len: usize) -> &'a [u8] {
    if len == 0 || ptr.is_null() {
        return &[];
    }
    // SAFETY: `ptr` is not NULL and `len` not 0, so the caller's obligation applies: `len`
    // readable bytes, valid and unchanged for `'a`.
    unsafe { std::slice::from_raw_parts(ptr.cast(), len) }
}

/// Runs `f` on the state behind `arg`, catching a panic so that none unwinds into UCX.
///
/// # Safety
///
/// `arg` must be the address of a live [`State`] that no other reference is used for while
/// `f` runs (see the module documentation).
unsafe fn with_state<R>(arg: *mut c_void, fallback: R, f: impl FnOnce(&mut State) -> R) -> R {
    // SAFETY: the caller's obligation.
    let state = unsafe { &mut *arg.cast::<State>() };
    debug_assert!(
        ucp::held(),
        "UCX called back without the shared worker's lock held"
    );
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(state))).unwrap_or(fallback)
}

/// A data message: one frame into its slot (copied now, or received later for a rendezvous).
///
/// # Safety
///
/// Called by UCX only, with the arguments it documents; `arg` is the state registered with
/// the handler.
unsafe extern "C" fn on_data(
    arg: *mut c_void,
    header: *const c_void,
    header_length: usize,
    data: *mut c_void,
    length: usize,
    param: *const sys::ucp_am_recv_param_t,
) -> sys::ucs_status_t {
    // SAFETY: UCX passes the header it received, `header_length` bytes at `header`, valid
    // during this call, which the slice does not outlive.
    let header = unsafe { callback_bytes(header, header_length) };
    // SAFETY: UCX passes valid receive parameters.
    let attr = unsafe { (*param).recv_attr };
    // SAFETY: the registered state, called back while its lock is held.
    unsafe {
        with_state(arg, sys::UCS_OK, |state| {
            receive(state, header, data, length, attr)
        })
    }
}

fn receive(
    state: &mut State,
    header: &[u8],
    data: *mut c_void,
    length: usize,
    attr: u64,
) -> sys::ucs_status_t {
    let rendezvous = attr & sys::UCP_AM_RECV_ATTR_FLAG_RNDV != 0;
    // What to tell UCX about a message we do not take: a rendezvous sender then completes
    // with this status rather than sending the data.
    let refuse = if rendezvous {
        sys::UCS_ERR_REJECTED
    } else {
        sys::UCS_OK
    };
    if state.rx.closed {
        return refuse;
    }
    let Some(seq) = state.data_seq(header) else {
        return refuse;
    };
    let Some(index) = state.free_slot(seq, length) else {
        return refuse;
    };
    if rendezvous {
        let rx = &mut state.rx;
        let dst = rx.buf.at(index * state.max);
        rx.len[index] = length;
        rx.slot[index] = Slot::Filling;
        rx.rendezvous += 1;
        let ctx = (&raw mut rx.ctx[index]).cast::<c_void>();
        let mut param = ucp::request_param(0, None, ctx);
        param.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_CALLBACK | sys::UCP_OP_ATTR_FIELD_USER_DATA;
        param.cb = sys::ucp_request_param_cb {
            recv_am: Some(on_received),
        };
        // SAFETY: `data` is the rendezvous descriptor UCX just passed; `dst` has `length <=
        // max` bytes of the free slot, which nothing else touches until the slot is Ready;
        // `ctx` lives as long as the state, which outlives the receive (see `Ucp::drop`).
        let started =
            unsafe { sys::ucp_am_recv_data_nbx(state.worker, data, dst.cast(), length, &param) };
        match sys::status_ptr(started) {
            sys::StatusPtr::Done => {
                state.rx.slot[index] = Slot::Ready;
                state.rx.arrived += 1;
            }
            // `on_received` marks it Ready.
            sys::StatusPtr::Request(_) => return sys::UCS_OK,
            sys::StatusPtr::Failed(status) => {
                state.rx.slot[index] = Slot::Free;
                state.failed.get_or_insert(status);
            }
        }
    } else {
        // SAFETY: UCX passes `length` readable bytes at `data`, valid during this call, which
        // the slice does not outlive.
        let frame = unsafe { callback_bytes(data, length) };
        state.fill_slot(index, frame);
    }
    state.maybe_confirm_close();
    state.wake(RX);
    sys::UCS_OK
}

/// A batch message: several frames in order, each copied into its slot now.
///
/// # Safety
///
/// Called by UCX only, with the arguments it documents; `arg` is the state registered with
/// the handler.
unsafe extern "C" fn on_batch(
    arg: *mut c_void,
    header: *const c_void,
    header_length: usize,
    data: *mut c_void,
    length: usize,
    param: *const sys::ucp_am_recv_param_t,
) -> sys::ucs_status_t {
    // SAFETY: UCX passes valid receive parameters.
    let attr = unsafe { (*param).recv_attr };
    if attr & sys::UCP_AM_RECV_ATTR_FLAG_RNDV != 0 {
        // SAFETY: the registered state, called back while its lock is held.
        return unsafe {
            with_state(arg, sys::UCS_ERR_REJECTED, |state| {
                state.broken("the peer sent a batch by rendezvous");
                sys::UCS_ERR_REJECTED
            })
        };
    }
    // SAFETY: UCX passes the header it received, valid during this call, which the slice
    // does not outlive.
    let header = unsafe { callback_bytes(header, header_length) };
    // SAFETY: as above, for an eager message's `length` bytes of data.
    let data = unsafe { callback_bytes(data, length) };
    // SAFETY: the registered state, called back while its lock is held.
    unsafe { with_state(arg, sys::UCS_OK, |state| receive_batch(state, header, data)) }
}

fn receive_batch(state: &mut State, header: &[u8], data: &[u8]) -> sys::ucs_status_t {
    if state.rx.closed {
        return sys::UCS_OK;
    }
    let Some(first) = state.data_seq(header) else {
        return sys::UCS_OK;
    };
    let mut seq = first;
    for frame in UcxBatchFrames::new(data) {
        let Ok(frame) = frame else {
            state.broken("the peer sent a malformed batch");
            break;
        };
        let Some(index) = state.free_slot(seq, frame.len()) else {
            break;
        };
        state.fill_slot(index, frame);
        seq = seq.saturating_add(1);
    }
    if seq == first {
        state.broken("the peer sent an empty batch");
    }
    state.maybe_confirm_close();
    state.wake(RX);
    sys::UCS_OK
}

impl State {
    /// A data or batch message's sequence number; `None` (the protocol broken) when its header
    /// is not one.
    fn data_seq(&mut self, header: &[u8]) -> Option<u64> {
        match UcxDataRepr::parse(header) {
            Ok(UcxDataRepr { seq }) => Some(seq),
            Err(_) => {
                self.broken("a data message without a valid sequence number");
                None
            }
        }
    }

    /// The free slot for the frame numbered `seq` of `length` bytes; `None` (the protocol
    /// broken) when the peer had no credit for it, it is too long or its slot is in use.
    fn free_slot(&mut self, seq: u64, length: usize) -> Option<usize> {
        let rx = &self.rx;
        if seq < rx.released || seq >= rx.released + rx.slots as u64 {
            self.broken("the peer sent a frame beyond its credits");
            return None;
        }
        if length > self.max {
            self.broken("the peer sent a frame longer than the maximum message size");
            return None;
        }
        let index = (seq % rx.slots as u64) as usize;
        if rx.slot[index] != Slot::Free {
            self.broken("the peer sent a frame into a slot still in use");
            return None;
        }
        Some(index)
    }

    /// Copies an eagerly received frame into the free slot `index` and marks it ready.
    fn fill_slot(&mut self, index: usize, frame: &[u8]) {
        let dst = self.rx.buf.at(index * self.max);
        // SAFETY: slot `index` is free, so neither UCX nor a lent frame uses its `max >=
        // frame.len()` bytes at `dst` (checked by `free_slot`); `frame` is UCX's buffer, apart.
        unsafe { std::ptr::copy_nonoverlapping(frame.as_ptr(), dst, frame.len()) };
        self.rx.len[index] = frame.len();
        self.rx.slot[index] = Slot::Ready;
        self.rx.arrived += 1;
    }
}

/// A rendezvous receive completed.
///
/// # Safety
///
/// Called by UCX only; `user_data` is the slot's [`CallbackCtx`].
unsafe extern "C" fn on_received(
    request: *mut c_void,
    status: sys::ucs_status_t,
    length: usize,
    user_data: *mut c_void,
) {
    // SAFETY: the context UCX was given for this receive; it lives as long as the state.
    let ctx = unsafe { &*user_data.cast::<CallbackCtx>() };
    // SAFETY: the registered state, called back while its lock is held.
    unsafe {
        with_state(ctx.state.cast(), (), |state| {
            let index = ctx.index;
            if status == sys::UCS_OK && length == state.rx.len[index] {
                state.rx.slot[index] = Slot::Ready;
                state.rx.arrived += 1;
                state.maybe_confirm_close();
            } else if status == sys::UCS_OK {
                state.rx.slot[index] = Slot::Free;
                state.broken("a rendezvous frame arrived with another length than announced");
            } else {
                state.rx.slot[index] = Slot::Free;
                state.failed.get_or_insert(status);
            }
            state.wake(RX);
        });
    }
    // SAFETY: the request of this receive, freed once, after it completed.
    unsafe { sys::ucp_request_free(request) };
}

/// A frame send that did not complete at once completed: its send buffer is free again.
///
/// # Safety
///
/// Called by UCX only; `user_data` is the send slot's [`CallbackCtx`].
pub(super) unsafe extern "C" fn on_sent(
    request: *mut c_void,
    status: sys::ucs_status_t,
    user_data: *mut c_void,
) {
    // SAFETY: the callback's own contract.
    unsafe {
        send_completed(request, status, user_data, TX, |state, index| {
            state.tx.busy[index] = false;
        });
    }
}

/// A credit message that did not go out at once went out.
///
/// # Safety
///
/// Called by UCX only; `user_data` is the state's credit [`CallbackCtx`].
pub(super) unsafe extern "C" fn on_credit_sent(
    request: *mut c_void,
    status: sys::ucs_status_t,
    user_data: *mut c_void,
) {
    // SAFETY: the callback's own contract.
    unsafe {
        send_completed(request, status, user_data, RX, |state, _| {
            state.controls.credit_busy = false;
        });
    }
}

/// What a queued send's completion does: `done` frees what the send held (given the context's
/// index), a failure is recorded, `half` is woken and the request freed.
///
/// # Safety
///
/// Called from UCX's send callbacks only, with their arguments; `user_data` is the send's
/// [`CallbackCtx`].
unsafe fn send_completed(
    request: *mut c_void,
    status: sys::ucs_status_t,
    user_data: *mut c_void,
    half: usize,
    done: impl FnOnce(&mut State, usize),
) {
    // SAFETY: the context UCX was given for this send; it lives as long as the state.
    let ctx = unsafe { &*user_data.cast::<CallbackCtx>() };
    // SAFETY: the registered state, called back while its lock is held.
    unsafe {
        with_state(ctx.state.cast(), (), |state| {
            done(state, ctx.index);
            if status != sys::UCS_OK {
                state.failed.get_or_insert(status);
            }
            state.wake(half);
        });
    }
    // SAFETY: the request of this send, freed once, after it completed.
    unsafe { sys::ucp_request_free(request) };
}

impl Controls {
    /// The context the credit send's callback gets.
    pub(super) fn credit_ctx(&mut self) -> *mut c_void {
        (&raw mut self.credit_ctx).cast()
    }
}

impl Tx {
    /// The send slot of the frame numbered `seq`.
    pub(super) fn slot(&self, seq: u64) -> usize {
        (seq % self.slots as u64) as usize
    }

    /// The context the send of slot `index` gets.
    pub(super) fn ctx(&mut self, index: usize) -> *mut c_void {
        (&raw mut self.ctx[index]).cast()
    }
}

/// A control message: credits or a close.
///
/// # Safety
///
/// Called by UCX only, with the arguments it documents; `arg` is the registered state.
unsafe extern "C" fn on_control(
    arg: *mut c_void,
    header: *const c_void,
    header_length: usize,
    _data: *mut c_void,
    _length: usize,
    param: *const sys::ucp_am_recv_param_t,
) -> sys::ucs_status_t {
    // SAFETY: UCX passes the header it received, `header_length` bytes at `header`, valid
    // during this call, which the slice does not outlive.
    let header = unsafe { callback_bytes(header, header_length) };
    // SAFETY: UCX passes valid receive parameters.
    let rendezvous = unsafe { (*param).recv_attr } & sys::UCP_AM_RECV_ATTR_FLAG_RNDV != 0;
    // SAFETY: the registered state, called back while its lock is held.
    unsafe {
        with_state(arg, sys::UCS_OK, |state| {
            control(state, header);
            if rendezvous {
                sys::UCS_ERR_REJECTED
            } else {
                sys::UCS_OK
            }
        })
    }
}

fn control(state: &mut State, header: &[u8]) {
    let Ok(message) = UcxControlRepr::parse(header) else {
        state.broken("a malformed control message");
        return;
    };
    match message.kind {
        UcxControlKind::Credit => {
            let tx = &mut state.tx;
            if message.value > tx.sent || message.value < tx.peer_released {
                state.broken("the peer returned credits for frames never sent");
                return;
            }
            tx.peer_released = message.value;
            state.wake(TX);
        }
        UcxControlKind::SenderClosed => {
            let rx = &mut state.rx;
            if message.value < rx.delivered || rx.peer_total.is_some() {
                state.broken("the peer closed after fewer frames than it sent");
                return;
            }
            rx.peer_total = Some(message.value);
            state.maybe_confirm_close();
            state.wake(RX);
        }
        UcxControlKind::ReceiverClosed => {
            state.tx.peer_closed = true;
            state.maybe_confirm_close();
            state.wake(TX);
        }
        UcxControlKind::CloseSeen => {
            state.peer_saw_close = true;
            state.wake(TX);
        }
        UcxControlKind::Abort => {
            state.failed.get_or_insert(sys::UCS_ERR_CONNECTION_RESET);
            state.wake_both();
        }
        UcxControlKind::Unknown(_) => state.broken("a control message of an unknown kind"),
    }
}

/// A handshake message: kept whole for the handshake to read.
///
/// # Safety
///
/// Called by UCX only, with the arguments it documents; `arg` is the registered state.
unsafe extern "C" fn on_handshake(
    arg: *mut c_void,
    _header: *const c_void,
    _header_length: usize,
    data: *mut c_void,
    length: usize,
    param: *const sys::ucp_am_recv_param_t,
) -> sys::ucs_status_t {
    // SAFETY: UCX passes valid receive parameters.
    let rendezvous = unsafe { (*param).recv_attr } & sys::UCP_AM_RECV_ATTR_FLAG_RNDV != 0;
    if rendezvous || length > MAX_HANDSHAKE_LEN {
        return if rendezvous {
            sys::UCS_ERR_REJECTED
        } else {
            sys::UCS_OK
        };
    }
    // SAFETY: UCX passes `length` readable bytes at `data` (a message without the DATA or
    // RNDV flag), valid during this call, which the slice does not outlive.
    let bytes = unsafe { callback_bytes(data, length) };
    // SAFETY: the registered state, called back while its lock is held.
    unsafe {
        with_state(arg, sys::UCS_OK, |state| {
            state.handshake_in = Some(bytes.to_vec());
            state.wake(RX);
            sys::UCS_OK
        })
    }
}

/// The data endpoint failed: the peer died, hung up or cannot be reached.
///
/// # Safety
///
/// Called by UCX only; `arg` is the registered state.
pub(super) unsafe extern "C" fn on_ep_error(
    arg: *mut c_void,
    _ep: sys::ucp_ep_h,
    status: sys::ucs_status_t,
) {
    // SAFETY: the registered state, called back while its lock is held.
    unsafe {
        with_state(arg, (), |state| {
            state.failed.get_or_insert(status);
            state.wake_both();
        });
    }
}

/// Hellos of connections by socket address, by the endpoint they came over, until the
/// accepting end that made that endpoint takes its own.
pub(super) static SOCKET_HELLOS: std::sync::Mutex<Vec<(usize, Vec<u8>)>> =
    std::sync::Mutex::new(Vec::new());

/// A hello sent to [`ucp::AM_SOCKET_HELLO`]: kept with the endpoint it came over.
///
/// # Safety
///
/// Called by UCX only, with the arguments it documents.
pub(super) unsafe extern "C" fn on_socket_hello(
    _arg: *mut c_void,
    _header: *const c_void,
    _header_length: usize,
    data: *mut c_void,
    length: usize,
    param: *const sys::ucp_am_recv_param_t,
) -> sys::ucs_status_t {
    // SAFETY: UCX passes valid receive parameters.
    let param = unsafe { &*param };
    if param.recv_attr & sys::UCP_AM_RECV_ATTR_FLAG_RNDV != 0 {
        return sys::UCS_ERR_REJECTED;
    }
    if param.recv_attr & sys::UCP_AM_RECV_ATTR_FIELD_REPLY_EP == 0
        || param.reply_ep.is_null()
        || length > MAX_HANDSHAKE_LEN
    {
        return sys::UCS_OK;
    }
    // SAFETY: UCX passes `length` readable bytes at `data` (a message without the DATA or
    // RNDV flag), valid during this call, which the slice does not outlive.
    let bytes = unsafe { callback_bytes(data, length) };
    let ep = param.reply_ep as usize;
    let _ = std::panic::catch_unwind(|| {
        let mut hellos = SOCKET_HELLOS.lock().unwrap_or_else(|e| e.into_inner());
        hellos.retain(|(at, _)| *at != ep);
        hellos.push((ep, bytes.to_vec()));
    });
    sys::UCS_OK
}

/// The hello that came over `ep`, if one did.
pub(super) fn take_socket_hello(ep: sys::ucp_ep_h) -> Option<Vec<u8>> {
    let mut hellos = SOCKET_HELLOS.lock().unwrap_or_else(|e| e.into_inner());
    let at = hellos.iter().position(|(at, _)| *at == ep as usize)?;
    Some(hellos.swap_remove(at).1)
}

/// Forgets a hello that came over `ep` and was never taken.
pub(super) fn forget_socket_hello(ep: sys::ucp_ep_h) {
    let mut hellos = SOCKET_HELLOS.lock().unwrap_or_else(|e| e.into_inner());
    hellos.retain(|(at, _)| *at != ep as usize);
}

/// The handler of ids no end holds (given back by one that is gone): drops what arrives.
///
/// # Safety
///
/// Called by UCX only, with the arguments it documents.
pub(super) unsafe extern "C" fn on_dead(
    _arg: *mut c_void,
    _header: *const c_void,
    _header_length: usize,
    _data: *mut c_void,
    _length: usize,
    param: *const sys::ucp_am_recv_param_t,
) -> sys::ucs_status_t {
    // SAFETY: UCX passes valid receive parameters.
    let attr = unsafe { (*param).recv_attr };
    if attr & sys::UCP_AM_RECV_ATTR_FLAG_RNDV != 0 {
        sys::UCS_ERR_REJECTED
    } else {
        sys::UCS_OK
    }
}

/// An endpoint from the shared worker to another process's worker, by worker address, shared
/// by every connection between the two (connections made through a door or to a listener's
/// worker address). One endpoint per pair of workers, kept while both live: UCX pairs the
/// endpoints two workers create to each other by counting them, so one each way, never
/// closed, always pairs right. A connection's frames reach its end by the end's own
/// active-message ids. When the endpoint fails (the other process died or cannot be reached),
/// every end on it fails; the next connection makes a new one.
///
/// INVARIANTS: lives at a fixed heap address for the rest of the process (the error
/// callback's argument); touched only under the shared worker's lock; `ends` are the live
/// states of the ends that use `ep`.
pub(super) struct PeerEp {
    pub(super) ep: sys::ucp_ep_h,
    pub(super) ends: Vec<*mut State>,
    pub(super) failed: Option<sys::ucs_status_t>,
}

/// An endpoint to another process's worker failed: so did every end on it.
///
/// # Safety
///
/// Called by UCX only; `arg` is the endpoint's [`PeerEp`].
pub(super) unsafe extern "C" fn on_peer_ep_error(
    arg: *mut c_void,
    _ep: sys::ucp_ep_h,
    status: sys::ucs_status_t,
) {
    debug_assert!(
        ucp::held(),
        "UCX called back without the shared worker's lock"
    );
    let peer = arg.cast::<PeerEp>();
    // SAFETY: the registered `PeerEp`, live for the rest of the process, touched only under
    // the lock that this callback runs under; no other reference to it is live now.
    let peer = unsafe { &mut *peer };
    peer.failed.get_or_insert(status);
    for &end in &peer.ends {
        // SAFETY: a live state of an end on this endpoint (the `PeerEp`'s invariants), called
        // back under the lock.
        unsafe {
            with_state(end.cast(), (), |state| {
                state.failed.get_or_insert(status);
                state.wake_both();
            });
        }
    }
}
