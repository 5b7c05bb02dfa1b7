//! A UCX connection and its two halves.

use std::cell::UnsafeCell;
use std::mem::ManuallyDrop;
use std::os::fd::AsRawFd;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, ppoll};
use nix::sys::time::TimeSpec;
use ucx_sys as sys;
use urom_wire::MaxMsgSize;
use urom_wire::ucx::{
    UCX_BATCH_ENTRY_HEADER_LEN, UcxControlKind, UcxControlRepr, UcxDataRepr, emit_batch_entry,
};

use super::UcxConnectError;
use super::state::{
    self, AM_BATCH, AM_CONTROL, AM_DATA, BATCH_BYTES, PeerEp, RX, Slot, State, StateBox, TX,
};
use super::ucp::{self, Queued, Remote, Sent, Shared, Worker};
use crate::sync::spin_hint;
use crate::{
    Armed, ChannelConfig, FrameReceiver, FrameRecvError, FrameSendError, FrameSender, HalfControl,
    PeerGoneError, Transport, WaitMode, deadline,
};

/// Which kind of endpoint an end sends on.
pub(super) enum EpKind {
    /// None yet.
    None,
    /// A client-server endpoint of its own (a connection by socket address), closed when the
    /// end goes.
    Own,
    /// The endpoint to the peer process's worker, shared with the other connections between
    /// the two (see [`PeerEp`]).
    Peer(*mut PeerEp),
}

/// One end's UCX objects: the endpoint to the peer, its active-message ids on the shared
/// worker, and the state that worker calls back into for them. Retired on drop (see
/// [`Ucp::drop`]), which must not happen while the dropping thread holds the shared worker's
/// lock.
///
/// INVARIANTS: every use of the fields below other than `linger` and `crashed` is made
/// holding the shared worker's lock (`worker` is a handle on that worker); `ep` is NULL or a
/// live endpoint of it (of `kind`); `state` is registered for the ids from `am_base` until the
/// end is retired, and then lives on until nothing of UCX's reaches it, or is never freed.
pub(super) struct Ucp {
    pub(super) ep: sys::ucp_ep_h,
    pub(super) kind: EpKind,
    /// The peer end's first active-message id.
    pub(super) peer_am: u32,
    /// How long dropping waits for what was sent to leave.
    linger: Duration,
    /// The end was crashed on purpose: close without flushing.
    crashed: bool,
    /// The handshake finished: the end lingers when dropped.
    connected: bool,
    pub(super) worker: Worker,
    pub(super) am_base: u32,
    pub(super) state: ManuallyDrop<StateBox>,
    /// The descriptors that wake each half (the state holds their numbers).
    wakers: ManuallyDrop<[OwnedFd; 2]>,
}

impl Ucp {
    /// A fresh end on the shared worker, with its ids and state, for a connection configured
    /// by `config`; the caller holds the worker's lock.
    fn new(config: &ChannelConfig, shared: &mut Shared) -> Result<Self, UcxConnectError> {
        let waker = || {
            crate::sys::wake_event().map_err(|errno| UcxConnectError::Sys {
                op: "eventfd",
                errno,
            })
        };
        let wakers = [waker()?, waker()?];
        let worker = shared.worker();
        let am_base = shared.take_ids()?;
        let fds = [
            std::os::fd::AsRawFd::as_raw_fd(&wakers[TX]),
            std::os::fd::AsRawFd::as_raw_fd(&wakers[RX]),
        ];
        let state = match StateBox::new(
            &worker,
            am_base,
            config.max_msg_size.get(),
            config.slots as usize,
            fds,
        ) {
            Ok(state) => state,
            Err(e) => {
                shared.give_ids(am_base);
                return Err(e);
            }
        };
        Ok(Self {
            ep: std::ptr::null_mut(),
            kind: EpKind::None,
            peer_am: 0,
            linger: config.handshake_timeout,
            crashed: false,
            connected: false,
            worker,
            am_base,
            state: ManuallyDrop::new(state),
            wakers: ManuallyDrop::new(wakers),
        })
    }

    /// Makes this end's endpoint the shared one to the worker at `address` (creating it when
    /// there is none, or only a failed one).
    pub(super) fn attach_peer(
        &mut self,
        shared: &mut Shared,
        address: &[u8],
    ) -> Result<(), sys::ucs_status_t> {
        self.detach_peer();
        let existing = shared.peers.get(address).copied();
        let peer = match existing {
            // SAFETY: a `PeerEp` of the map, live for good, used under the lock.
            Some(peer) if unsafe { (*peer).failed.is_none() } => peer,
            _ => {
                if let Some(failed) = existing {
                    shared.peers.remove(address);
                    // SAFETY: as above; its endpoint failed and is closed once, here.
                    let failed_ref = unsafe { &mut *failed };
                    let ep = failed_ref.ep;
                    for &end in &failed_ref.ends {
                        // SAFETY: a live state of an end on the endpoint (the `PeerEp`'s
                        // invariants), under the lock; its handlers must not send on it.
                        unsafe { (*end).ep = std::ptr::null_mut() };
                    }
                    // SAFETY: a live endpoint of the shared worker, under its lock, not used
                    // again.
                    unsafe { ucp::close_ep_now(ep) };
                    shared.retire(failed);
                }
                let peer = Box::into_raw(Box::new(PeerEp {
                    ep: std::ptr::null_mut(),
                    ends: Vec::new(),
                    failed: None,
                }));
                // SAFETY: the `PeerEp` is never freed (see its invariants).
                let ep = unsafe {
                    ucp::create_ep(
                        &self.worker,
                        Remote::Worker(address),
                        state::on_peer_ep_error,
                        peer.cast(),
                    )
                };
                let ep = match ep {
                    Ok(ep) => ep,
                    Err(status) => {
                        // SAFETY: from Box::into_raw just above, never shared.
                        drop(unsafe { Box::from_raw(peer) });
                        return Err(status);
                    }
                };
                // SAFETY: just made, used under the lock.
                unsafe { (*peer).ep = ep };
                shared.peers.insert(address.to_vec(), peer);
                peer
            }
        };
        let state = self.state.as_ptr();
        // SAFETY: a live `PeerEp`, used under the lock; no other reference to it is live.
        let peer_ref = unsafe { &mut *peer };
        peer_ref.ends.push(state);
        self.ep = peer_ref.ep;
        self.kind = EpKind::Peer(peer);
        Ok(())
    }

    /// Leaves the shared endpoint, if this end is on one.
    fn detach_peer(&mut self) {
        if let EpKind::Peer(peer) = self.kind {
            let state = self.state.as_ptr();
            // SAFETY: a live `PeerEp`, used under the lock; no other reference to it is live.
            let peer = unsafe { &mut *peer };
            peer.ends.retain(|&end| end != state);
            self.kind = EpKind::None;
            self.ep = std::ptr::null_mut();
        }
    }

    pub(super) fn state(&mut self) -> &mut State {
        self.state.get()
    }

    /// Sends a control message from `cell` (a header cell of the state that stays put).
    fn send_control(&mut self, kind: UcxControlKind, value: u64, cell: *mut [u8; 16]) {
        if self.ep.is_null() || self.state().failed.is_some() {
            return;
        }
        let bytes = UcxControlRepr { kind, value }.to_bytes();
        // SAFETY: `cell` is a field of the state, which lives until its sends completed;
        // nothing else writes or reads it now (each close is sent once, and not yet).
        unsafe { cell.write(bytes) };
        let (ep, id, header): (_, _, *const [u8]) = (self.ep, self.peer_am + AM_CONTROL, cell);
        // SAFETY: `ep` is live (invariants); the header cell lives until its send completed,
        // and from here on only UCX reads it.
        let sent = unsafe { ucp::am_send(ep, id, header, &[], 0, ucp::Completion::Later) };
        if let Err(status) = ucp::detach_request(sent) {
            self.state().failed.get_or_insert(status);
        }
        self.worker.progress();
    }

    /// Tells the peer how many frames this end released, if that changed.
    fn send_credits(&mut self) {
        let no_ep = self.ep.is_null();
        let state = self.state();
        if state.rx.released == state.rx.reported || state.failed.is_some() || no_ep {
            return;
        }
        let value = state.rx.released;
        let bytes = UcxControlRepr {
            kind: UcxControlKind::Credit,
            value,
        }
        .to_bytes();
        let (ep, id) = (self.ep, self.peer_am + AM_CONTROL);
        let state = &mut self.state;
        // SAFETY: `ep` is live (invariants).
        let sent = unsafe {
            self.worker
                .send_or_queue(ep, id, &bytes, &[], 0, || state.get().queue_credit(bytes))
        };
        let state = self.state();
        match sent {
            Ok(Sent::Done) => state.rx.reported = value,
            Ok(Sent::Queued) => {
                state.controls.credit_busy = true;
                state.rx.reported = value;
            }
            // Busy: tried again when the receiver next finds nothing to do.
            Ok(Sent::Deferred) => {}
            Err(status) => {
                state.failed.get_or_insert(status);
            }
        }
    }

    /// Sends the frame numbered `seq`; the caller checked that a credit and its send buffer
    /// are free. A frame UCX cannot take at once (a large or a queued one) goes from a copy in
    /// its send buffer, which stays busy until UCX is done with it.
    fn send_frame(&mut self, seq: u64, frame: &[u8]) -> Result<(), FrameSendError> {
        let header = UcxDataRepr { seq }.to_bytes();
        let (ep, id) = (self.ep, self.peer_am + AM_DATA);
        let state = &mut self.state;
        // SAFETY: `ep` is live (invariants).
        let sent = unsafe {
            self.worker.send_or_queue(ep, id, &header, frame, 0, || {
                Some(state.get().queue_frame(seq, header, frame))
            })
        };
        match sent {
            Ok(Sent::Queued) => {
                let tx = &mut self.state().tx;
                let index = tx.slot(seq);
                tx.busy[index] = true;
                Ok(())
            }
            Ok(Sent::Done | Sent::Deferred) => Ok(()),
            Err(status) => Err(self.send_failed(status)),
        }
    }

    /// Holds the frame numbered `seq` for the next batch message, sending the batch first
    /// when the frame does not fit, or sends it alone when no batch holds it; the caller
    /// checked that a credit is free.
    fn hold(&mut self, seq: u64, frame: &[u8]) -> Result<(), FrameSendError> {
        let entry = UCX_BATCH_ENTRY_HEADER_LEN + frame.len();
        if entry > BATCH_BYTES {
            self.send_batch()?;
            return self.send_frame(seq, frame);
        }
        if self.state().tx.batch_len + entry > BATCH_BYTES {
            self.send_batch()?;
        }
        let tx = &mut self.state().tx;
        if tx.batch_frames == 0 {
            tx.batch_first = seq;
        }
        // SAFETY: the batch buffer has `BATCH_BYTES` bytes, of which the `batch_len` first are
        // held entries; UCX reads it only during a send that `send_batch` waits for, so nothing
        // else uses the rest now.
        let room = unsafe {
            std::slice::from_raw_parts_mut(tx.batch.at(tx.batch_len), BATCH_BYTES - tx.batch_len)
        };
        let written = emit_batch_entry(room, frame).expect("room checked above");
        tx.batch_len += written;
        tx.batch_frames += 1;
        Ok(())
    }

    /// Sends the frames [`Ucp::hold`] holds: one as a data message, more as one batch message
    /// (eager, so that the receiver gets its bytes in one callback), waiting until UCX is done
    /// with the buffer.
    fn send_batch(&mut self) -> Result<(), FrameSendError> {
        let tx = &mut self.state().tx;
        let (frames, len, first) = (tx.batch_frames, tx.batch_len, tx.batch_first);
        if frames == 0 {
            return Ok(());
        }
        tx.batch_frames = 0;
        tx.batch_len = 0;
        let entries = tx.batch.at(0).cast_const();
        if frames == 1 {
            let frame = tx.batch.at(UCX_BATCH_ENTRY_HEADER_LEN).cast_const();
            // SAFETY: the buffer holds one entry of `len` bytes, its frame after the length
            // field; nothing writes the buffer until this send returned.
            let frame =
                unsafe { std::slice::from_raw_parts(frame, len - UCX_BATCH_ENTRY_HEADER_LEN) };
            return self.send_frame(first, frame);
        }
        let header = UcxDataRepr { seq: first }.to_bytes();
        // SAFETY: the buffer holds `len` bytes of entries; nothing writes it until this send
        // returned.
        let entries = unsafe { std::slice::from_raw_parts(entries, len) };
        // UCX cannot take it at once: send it from where it lies and wait until it left.
        // SAFETY: the header and the entries stay put and unchanged until that wait returned.
        let queue = || Some(unsafe { Queued::new(&header, entries, None) });
        let (ep, id, flags) = (
            self.ep,
            self.peer_am + AM_BATCH,
            sys::UCP_AM_SEND_FLAG_EAGER,
        );
        // SAFETY: `ep` is live (invariants).
        let sent = unsafe {
            self.worker
                .send_or_queue(ep, id, &header, entries, flags, queue)
        };
        sent.map(|_| ()).map_err(|status| self.send_failed(status))
    }

    /// Records that a send failed with `status` and says how the peer went.
    fn send_failed(&mut self, status: sys::ucs_status_t) -> FrameSendError {
        self.state().failed.get_or_insert(status);
        // What the peer said before it went (a close) tells how it went.
        self.worker.progress_all();
        FrameSendError::PeerGone(self.state().tx_gone().unwrap_or(PeerGoneError::Died))
    }

    /// Progresses the worker until the next frame in order is ready or nothing more happens
    /// (at most as many rounds as [`Worker::progress_all`]). Stopping at the frame spares the
    /// round that would only find nothing more: a call into the network stack on the path of
    /// every frame.
    #[inline]
    fn progress_for_rx(&mut self) {
        for _ in 0..64 {
            if self.worker.progress() == 0 || self.state().rx_ready() {
                break;
            }
        }
    }

    /// Hands the frame at the head back to the peer.
    fn release(&mut self) {
        let state = self.state();
        let rx = &mut state.rx;
        let index = (rx.released % rx.slots as u64) as usize;
        rx.slot[index] = Slot::Free;
        rx.released += 1;
        if rx.released - rx.reported >= (rx.slots as u64 / 2).max(1) {
            self.send_credits();
        }
    }

    /// Nothing to receive: return credits if the peer may be running short of them, and tell
    /// why nothing will come if so.
    ///
    /// Credits are returned only once half the peer's credits may be spent (frames arrived
    /// since the last report): a ping-pong then costs no credit message per frame, and a
    /// sender that is out of credits (every slot's frame arrived) always gets them.
    fn rx_idle(&mut self) -> Result<(), FrameRecvError> {
        let rx = &self.state().rx;
        if rx.arrived - rx.reported >= (rx.slots as u64 / 2).max(1) {
            self.send_credits();
        }
        let state = self.state();
        if let Some(what) = state.protocol {
            return Err(FrameRecvError::Protocol(what));
        }
        match state.rx_gone() {
            Some(how) => Err(FrameRecvError::PeerGone(how)),
            None => Ok(()),
        }
    }

    /// Whether the sending half can send; `Err` when it never will.
    fn tx_check(&mut self) -> Result<bool, FrameSendError> {
        let state = self.state();
        if let Some(what) = state.protocol {
            return Err(FrameSendError::Protocol(what));
        }
        if let Some(how) = state.tx_gone() {
            return Err(FrameSendError::PeerGone(how));
        }
        Ok(state.tx_room())
    }
}

impl Ucp {
    /// Whether nothing of UCX's still uses the state: no send from a buffer of it, no
    /// rendezvous receive into it.
    fn quiet(&mut self) -> bool {
        let state = self.state();
        !state.controls.credit_busy
            && !state.tx.busy.iter().any(|&busy| busy)
            && !state.rx.slot.contains(&Slot::Filling)
    }
}

impl Drop for Ucp {
    /// Retires the end: lets what it sent leave (unless it crashed or failed), closes its own
    /// endpoint (a shared one stays), waits until UCX no longer uses its state, and gives its
    /// ids back. The state and the wake descriptors are freed only if UCX is done with them
    /// in time; otherwise they are never freed (a few kilobytes, rather than memory UCX may
    /// still write).
    fn drop(&mut self) {
        let until = Instant::now() + self.linger;
        let mut clean = true;
        let flush = {
            let _guard = ucp::lock();
            let failed = self.state().failed.is_some();
            if self.crashed && !failed && matches!(self.kind, EpKind::Peer(_)) {
                // The shared endpoint stays: tell the peer that this end died.
                let cell: *mut [u8; 16] = &mut self.state().controls.abort;
                self.send_control(UcxControlKind::Abort, 0, cell);
            }
            let flush = match self.kind {
                EpKind::None => false,
                EpKind::Own => !self.crashed && !failed,
                EpKind::Peer(_) => !failed,
            };
            // SAFETY: a live endpoint of the shared worker, under its lock.
            flush.then(|| unsafe { ucp::start_flush(self.ep) })
        };
        if let Some(request) = flush {
            // Lets the closes and any frame still queued leave before the endpoint goes.
            if ucp::wait_unlocked(request, Some(until)) == Err(sys::UCS_ERR_TIMED_OUT) {
                clean = false;
            }
        }
        if let EpKind::Own = self.kind {
            let close = {
                let _guard = ucp::lock();
                self.kind = EpKind::None;
                let ep = std::mem::replace(&mut self.ep, std::ptr::null_mut());
                // The handlers, which may still run for this end, must not send on it.
                self.state().ep = std::ptr::null_mut();
                state::forget_socket_hello(ep);
                // SAFETY: a live endpoint of the shared worker, under its lock, not used again.
                unsafe { ucp::start_close(ep) }
            };
            // Every operation on the endpoint completes or is cancelled with the close.
            let closed = ucp::wait_unlocked(close, Some(Instant::now() + CLOSE_WAIT));
            clean = closed != Err(sys::UCS_ERR_TIMED_OUT);
        }
        let quiet_until = Instant::now() + CLOSE_WAIT;
        let mut guard = ucp::lock();
        loop {
            if self.quiet() {
                break;
            }
            if Instant::now() >= quiet_until {
                clean = false;
                break;
            }
            guard.worker().progress_all();
            drop(guard);
            std::thread::yield_now();
            guard = ucp::lock();
        }
        self.detach_peer();
        guard.give_ids(self.am_base);
        // A half armed by a caller that never disarmed it sleeps no more.
        self.state().awake(TX);
        self.state().awake(RX);
        self.state().ep = std::ptr::null_mut();
        drop(guard);
        if clean {
            // SAFETY: taken once, here; nothing of UCX's reaches the state or the descriptors
            // any more (its ids have other handlers, it left the shared endpoint, its own
            // endpoint is closed and its requests completed).
            unsafe {
                ManuallyDrop::drop(&mut self.state);
            }
            // SAFETY: as above, taken once.
            unsafe { ManuallyDrop::drop(&mut self.wakers) };
        }
    }
}

/// How long retiring an end waits for its endpoint's close and its requests.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// What both halves of one end share.
///
/// The end's UCX objects are used by whichever half calls, from whichever thread, holding the
/// shared worker's lock (see [`ucp::Shared`]): it gives UCX the "one thread at a time" its
/// serialized mode asks for, and keeps a callback for this end, run by any thread's progress,
/// from touching the state while another thread does. Uncontended it costs an atomic
/// operation per call, far below what a call into UCX costs.
pub(super) struct Link {
    /// Taken out on drop, to linger (see [`linger`]); used only under the shared lock.
    ucp: UnsafeCell<ManuallyDrop<Ucp>>,
    /// The halves' wake-up descriptors (owned by `ucp`, which lives as long as this).
    wakers: [std::os::fd::RawFd; 2],
    /// Where the receive slots are, for lending frames without the lock.
    rx_buf: *const u8,
    max: usize,
}

impl Drop for Link {
    fn drop(&mut self) {
        // SAFETY: taken once, here; `self.ucp` is not used again.
        let ucp = unsafe { ManuallyDrop::take(self.ucp.get_mut()) };
        linger(ucp);
    }
}

// SAFETY: the end's UCX objects are used under the shared worker's lock only (one thread at a
// time, which the worker's serialized mode allows from any thread), or by their one owner once
// the link is gone. The state and the buffers it points to move with it.
unsafe impl Send for Ucp {}

/// Closes an end both of whose halves are gone. Its closes are on their way; so that the peer
/// receives them, and every frame before them, before the endpoint goes (a hang-up can make the
/// peer's UCX drop what it has not read yet), the end lingers on a thread of its own until the
/// peer confirms, fails, or `linger` passes, then closes the endpoint and destroys the worker.
/// A crashed or failed end closes at once.
///
/// When the process exits, lingering ends close at once (see [`finish_lingering`]): UCX tears
/// its global state down after the process's exit handlers, and a worker still alive then
/// (with UCX's progress thread calling into it) crashes the exit.
fn linger(mut ucp: Ucp) {
    {
        let _guard = ucp::lock();
        if !ucp.connected || ucp.crashed || ucp.ep.is_null() || ucp.state().failed.is_some() {
            return;
        }
    }
    let Some(exit) = exit_waker() else {
        // No way to be woken at exit: close here, after a bounded flush.
        return;
    };
    {
        let mut count = LINGERING.count.lock().unwrap_or_else(|e| e.into_inner());
        if LINGERING.exiting.load(Ordering::Acquire) {
            ucp.linger = ucp.linger.min(EXIT_FLUSH);
            return;
        }
        *count += 1;
    }
    let until = Instant::now() + ucp.linger;
    let spawned = std::thread::Builder::new()
        .name("urom-ucx-close".to_owned())
        .spawn(move || {
            let _counted = Counted;
            loop {
                let guard = ucp::lock();
                ucp.state().awake(TX);
                ucp.worker.progress_all();
                let state = ucp.state();
                if state.peer_saw_close || state.failed.is_some() {
                    break;
                }
                let now = Instant::now();
                if now >= until {
                    break;
                }
                if LINGERING.exiting.load(Ordering::Acquire) {
                    ucp.linger = ucp.linger.min(EXIT_FLUSH);
                    break;
                }
                // The peer's confirmation is received by another thread's progress (the wake
                // thread's, or a busy end's), which then wakes this one through the sending
                // half's descriptor.
                let armed = ucp.worker.arm();
                if let ucp::Armed::Yes = armed {
                    ucp.state().sleep(TX);
                }
                drop(guard);
                if let ucp::Armed::Yes = armed {
                    // SAFETY: the sending half's eventfd, owned by `ucp`, which lives here.
                    let waker = unsafe { BorrowedFd::borrow_raw(ucp.wakers[TX].as_raw_fd()) };
                    let mut fds = [
                        PollFd::new(exit, PollFlags::POLLIN),
                        PollFd::new(waker, PollFlags::POLLIN),
                    ];
                    let _ = ppoll(&mut fds, Some(TimeSpec::from_duration(until - now)), None);
                    crate::sys::drain(waker);
                }
            }
            {
                let _guard = ucp::lock();
                ucp.state().awake(TX);
            }
            // The end is retired here, before `_counted` tells the exit handler.
            drop(ucp);
        });
    if spawned.is_err() {
        // The closure, and the end in it, was dropped: the end closed after a bounded flush.
        Counted::done();
    }
}

/// How long an end that closes while the process exits waits for what it sent to leave.
const EXIT_FLUSH: Duration = Duration::from_millis(200);
/// How long the exit handler waits for lingering ends to close.
const EXIT_WAIT: Duration = Duration::from_secs(2);

/// The ends lingering on threads of their own, for the exit handler.
struct Lingering {
    /// How many threads still hold an end.
    count: Mutex<usize>,
    /// Signalled when `count` drops to zero.
    gone: Condvar,
    /// The process is exiting: lingering ends close at once, new ones do not linger.
    exiting: AtomicBool,
}

static LINGERING: Lingering = Lingering {
    count: Mutex::new(0),
    gone: Condvar::new(),
    exiting: AtomicBool::new(false),
};

/// Readable once the process exits (written once, never drained): wakes lingering ends.
static EXIT_WAKER: OnceLock<Option<OwnedFd>> = OnceLock::new();

/// The exit waker, made (and the exit handler registered) on first use; `None` when neither
/// could be set up.
fn exit_waker() -> Option<BorrowedFd<'static>> {
    let waker = EXIT_WAKER.get_or_init(|| {
        let fd = crate::sys::wake_event().ok()?;
        // SAFETY: `finish_lingering` is an `extern "C" fn()` that does not unwind (it catches
        // panics); registering it has no other precondition.
        let registered = unsafe { libc::atexit(finish_lingering) };
        (registered == 0).then_some(fd)
    });
    waker.as_ref().map(|fd| fd.as_fd())
}

/// Counts a lingering thread out when dropped (also when its end's drop panics).
struct Counted;

impl Counted {
    fn done() {
        let mut count = LINGERING.count.lock().unwrap_or_else(|e| e.into_inner());
        *count = count.saturating_sub(1);
        if *count == 0 {
            LINGERING.gone.notify_all();
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        Self::done();
    }
}

/// The process exit handler: tells lingering ends to close now and waits (at most
/// [`EXIT_WAIT`]) until they are retired (the shared worker's own exit handler, registered
/// earlier, runs after this one and destroys it).
extern "C" fn finish_lingering() {
    let _ = std::panic::catch_unwind(|| {
        let count = LINGERING.count.lock().unwrap_or_else(|e| e.into_inner());
        LINGERING.exiting.store(true, Ordering::Release);
        if let Some(Some(waker)) = EXIT_WAKER.get() {
            crate::sys::wake(waker.as_fd());
        }
        let _ = LINGERING
            .gone
            .wait_timeout_while(count, EXIT_WAIT, |count| *count > 0);
    });
}

// SAFETY: everything UCX-side is reached only under the shared worker's lock (one thread at a
// time, which the worker's serialized mode allows from any thread); `rx_buf` is read only in
// the slot a receiving half holds, which neither UCX nor the other half writes until it is
// released.
unsafe impl Send for Link {}
// SAFETY: as for `Send`.
unsafe impl Sync for Link {}

/// The shared worker's lock, and with it this end's UCX objects; any end's handlers may run
/// while it is held.
pub(super) struct Held<'a> {
    guard: ucp::Guard,
    ucp: &'a mut Ucp,
}

impl Held<'_> {
    pub(super) fn ucp(&mut self) -> &mut Ucp {
        self.ucp
    }

    /// The shared worker's bookkeeping and this end.
    pub(super) fn parts(&mut self) -> (&mut Shared, &mut Ucp) {
        (&mut self.guard, self.ucp)
    }
}

impl Link {
    /// A fresh end on the shared worker (created on first use), for a connection configured by
    /// `config`; its handshake is the caller's.
    pub(super) fn new(config: &ChannelConfig) -> Result<Arc<Self>, UcxConnectError> {
        use std::os::fd::AsRawFd;
        let mut guard = ucp::try_lock()?;
        let mut ucp = Ucp::new(config, &mut guard)?;
        let wakers = [ucp.wakers[TX].as_raw_fd(), ucp.wakers[RX].as_raw_fd()];
        let rx_buf = ucp.state().rx.buf.at(0).cast_const();
        let max = ucp.state().max;
        drop(guard);
        Ok(Arc::new(Self {
            ucp: UnsafeCell::new(ManuallyDrop::new(ucp)),
            wakers,
            rx_buf,
            max,
        }))
    }

    #[inline]
    pub(super) fn lock(&self) -> Held<'_> {
        let guard = ucp::lock();
        // SAFETY: the end's objects are used only under the shared lock, now held until `Held`
        // is dropped, and `Held` is the only way to them: no other reference exists meanwhile.
        let ucp = unsafe { &mut **self.ucp.get() };
        Held { guard, ucp }
    }

    /// Waits, for `half`, until `check` says ready or fails, or the timeout passes.
    fn wait<E>(
        &self,
        half: usize,
        mode: WaitMode,
        timeout: Duration,
        mut check: impl FnMut(&mut Ucp) -> Result<bool, E>,
    ) -> Result<bool, E> {
        let start = Instant::now();
        let end = deadline(start, timeout);
        let spin_end = match mode {
            WaitMode::BusyPoll => end,
            WaitMode::Adaptive { spin } => deadline(start, spin.min(timeout)),
        };
        loop {
            {
                let mut held = self.lock();
                held.ucp().worker.progress_all();
                if check(held.ucp())? {
                    return Ok(true);
                }
            }
            let now = Instant::now();
            if end.is_some_and(|e| now >= e) {
                return Ok(false);
            }
            if spin_end.is_some_and(|e| now >= e) {
                break;
            }
            spin_hint();
        }
        loop {
            let left = {
                let mut held = self.lock();
                let ucp = held.ucp();
                ucp.state().awake(half);
                ucp.worker.progress_all();
                if check(ucp)? {
                    return Ok(true);
                }
                let now = Instant::now();
                let left = match end {
                    Some(end) if now >= end => return Ok(false),
                    Some(end) => Some(end - now),
                    None => None,
                };
                if let ucp::Armed::Busy = ucp.worker.arm() {
                    continue;
                }
                ucp.state().sleep(half);
                left
            };
            self.sleep(half, left);
        }
    }

    /// Sleeps until `half` is woken (a callback received something for it, run by the wake
    /// thread's progress or another end's) or `timeout` passes. The caller marked it asleep
    /// ([`State::sleep`](super::state::State::sleep)) with the worker armed.
    pub(super) fn sleep(&self, half: usize, timeout: Option<Duration>) {
        // SAFETY: the half's eventfd is owned by `ucp`, which lives as long as `self`.
        let waker = unsafe { BorrowedFd::borrow_raw(self.wakers[half]) };
        let mut fds = [PollFd::new(waker, PollFlags::POLLIN)];
        match ppoll(&mut fds, timeout.map(TimeSpec::from_duration), None) {
            Ok(_) => {
                if fds[0]
                    .revents()
                    .is_some_and(|r| r.contains(PollFlags::POLLIN))
                {
                    crate::sys::drain(waker);
                }
            }
            Err(Errno::EINTR) => {}
            // Polling a valid descriptor does not fail otherwise; do not spin on it.
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}

/// One end of a UCX connection: frames to and from a peer on this or another machine.
///
/// Frames are copied on send (into UCX, or into a preallocated send buffer when UCX cannot
/// take them at once); `recv` lends the receive slot the frame arrived in (no copy) until the
/// next `recv` or `wait_recv`. Nothing is allocated per frame after the handshake.
///
/// Every end of the process lives on one shared UCX worker, used under one lock, so a
/// connection and its halves can move to other threads (see the module documentation).
pub struct UcxConnection {
    tx: UcxSender,
    rx: UcxReceiver,
}

/// The sending half of a [`UcxConnection`].
pub struct UcxSender {
    link: Arc<Link>,
    mode: WaitMode,
    max: MaxMsgSize,
    closed: bool,
    /// Frames sent are held for a batch message ([`FrameSender::cork`]).
    corked: bool,
}

/// The receiving half of a [`UcxConnection`].
pub struct UcxReceiver {
    link: Arc<Link>,
    mode: WaitMode,
    /// A frame returned by `recv` is still lent out.
    holding: bool,
    /// Where the lent frame is.
    frame: (usize, usize),
    closed: bool,
}

impl UcxConnection {
    /// Wraps an end whose handshake is done: `peer_am` is the peer end's first id, `slots`
    /// its slot count.
    pub(super) fn from_link(
        link: Arc<Link>,
        peer_am: u32,
        slots: usize,
        config: &ChannelConfig,
    ) -> Self {
        {
            let mut held = link.lock();
            let ucp = held.ucp();
            ucp.peer_am = peer_am;
            ucp.connected = true;
            let ep = ucp.ep;
            let state = ucp.state();
            state.ep = ep;
            state.peer_am = peer_am;
            state.set_peer_slots(slots);
        }
        Self {
            tx: UcxSender {
                link: Arc::clone(&link),
                mode: config.wait,
                max: config.max_msg_size,
                closed: false,
                corked: false,
            },
            rx: UcxReceiver {
                link,
                mode: config.wait,
                holding: false,
                frame: (0, 0),
                closed: false,
            },
        }
    }

    /// Ends this side as if its process had died (no close messages, the endpoint closed
    /// without a flush): the peer sees [`PeerGoneError::Died`]. For tests.
    pub fn simulate_crash(mut self) {
        self.tx.crash();
        self.rx.crash();
    }

    /// How many frames arrived through UCX's rendezvous protocol (received straight into their
    /// slot after the sender announced them) rather than eagerly.
    pub fn rendezvous_frames(&self) -> u64 {
        self.rx.link.lock().ucp().state().rx.rendezvous
    }
}

impl Transport for UcxConnection {
    type Sender = UcxSender;
    type Receiver = UcxReceiver;

    #[inline]
    fn split(&mut self) -> (&mut UcxSender, &mut UcxReceiver) {
        (&mut self.tx, &mut self.rx)
    }

    fn into_split(self) -> (UcxSender, UcxReceiver) {
        (self.tx, self.rx)
    }

    fn max_msg_size(&self) -> MaxMsgSize {
        self.tx.max
    }
}

impl UcxSender {
    /// Ends this half as if its process had died. For tests.
    pub(crate) fn crash(&mut self) {
        self.closed = true;
        self.link.lock().ucp().crashed = true;
    }
}

impl UcxReceiver {
    /// Ends this half as if its process had died. For tests.
    pub(crate) fn crash(&mut self) {
        self.closed = true;
        self.link.lock().ucp().crashed = true;
    }
}

impl HalfControl for UcxSender {
    fn check_peer(&self) -> Result<(), PeerGoneError> {
        let mut held = self.link.lock();
        let ucp = held.ucp();
        ucp.worker.progress_all();
        ucp.state().tx_gone().map_or(Ok(()), Err)
    }

    fn set_wait_mode(&mut self, mode: WaitMode) {
        self.mode = mode;
    }

    fn close(&mut self) {
        if !self.closed {
            self.closed = true;
            let mut held = self.link.lock();
            let ucp = held.ucp();
            if !ucp.crashed {
                // A peer that cannot take them is gone, and learns nothing more anyway.
                let _ = ucp.send_batch();
            }
            let sent = ucp.state().tx.sent;
            let cell: *mut [u8; 16] = &mut ucp.state().controls.sender_closed;
            ucp.send_control(UcxControlKind::SenderClosed, sent, cell);
        }
    }
}

impl HalfControl for UcxReceiver {
    fn check_peer(&self) -> Result<(), PeerGoneError> {
        let mut held = self.link.lock();
        let ucp = held.ucp();
        ucp.worker.progress_all();
        let state = ucp.state();
        if state.rx.peer_total.is_some() {
            Err(PeerGoneError::Closed)
        } else if state.failed.is_some() {
            Err(PeerGoneError::Died)
        } else {
            Ok(())
        }
    }

    fn set_wait_mode(&mut self, mode: WaitMode) {
        self.mode = mode;
    }

    fn close(&mut self) {
        if !self.closed {
            self.closed = true;
            self.holding = false;
            let mut held = self.link.lock();
            let ucp = held.ucp();
            ucp.state().rx.closed = true;
            let cell: *mut [u8; 16] = &mut ucp.state().controls.receiver_closed;
            ucp.send_control(UcxControlKind::ReceiverClosed, 0, cell);
        }
    }
}

impl Drop for UcxSender {
    fn drop(&mut self) {
        self.close();
    }
}

impl Drop for UcxReceiver {
    fn drop(&mut self) {
        self.close();
    }
}

impl FrameSender for UcxSender {
    fn max_msg_size(&self) -> MaxMsgSize {
        self.max
    }

    #[inline]
    fn send(&mut self, frame: &[u8]) -> Result<(), FrameSendError> {
        if self.closed {
            return Err(FrameSendError::Closed);
        }
        if frame.len() > self.max.get() {
            return Err(FrameSendError::TooLarge {
                len: frame.len(),
                max: self.max.as_u32(),
            });
        }
        let mut held = self.link.lock();
        let ucp = held.ucp();
        if !ucp.tx_check()? {
            // Credits may be waiting in the worker, or (corked) for the frames held here.
            ucp.send_batch()?;
            ucp.worker.progress_all();
            if !ucp.tx_check()? {
                return Err(FrameSendError::Full);
            }
        }
        let seq = ucp.state().tx.sent;
        if self.corked {
            ucp.hold(seq, frame)?;
        } else {
            ucp.send_frame(seq, frame)?;
        }
        ucp.state().tx.sent = seq + 1;
        Ok(())
    }

    fn wait_send(&mut self, timeout: Duration) -> Result<bool, FrameSendError> {
        if self.closed {
            return Err(FrameSendError::Closed);
        }
        self.link.lock().ucp().send_batch()?;
        self.link.wait(TX, self.mode, timeout, |ucp| ucp.tx_check())
    }

    fn cork(&mut self) {
        self.corked = true;
    }

    fn uncork(&mut self) -> Result<(), FrameSendError> {
        self.corked = false;
        if self.closed {
            return Err(FrameSendError::Closed);
        }
        self.link.lock().ucp().send_batch()
    }
}

impl UcxReceiver {
    /// Releases the frame `recv` lent out, if any.
    fn release_held(&mut self, ucp: &mut Ucp) {
        if self.holding {
            self.holding = false;
            ucp.release();
        }
    }
}

impl UcxReceiver {
    /// The next frame in order, progressing the worker for it first when `progress` says so
    /// (until it is there or nothing more happens).
    #[inline]
    fn take(&mut self, progress: bool) -> Result<Option<&[u8]>, FrameRecvError> {
        if self.closed {
            return Err(FrameRecvError::Closed);
        }
        let link = Arc::clone(&self.link);
        let mut held = link.lock();
        let ucp = held.ucp();
        self.release_held(ucp);
        if let Some(what) = ucp.state().protocol {
            return Err(FrameRecvError::Protocol(what));
        }
        if !ucp.state().rx_ready() {
            if progress {
                ucp.progress_for_rx();
            }
            if !ucp.state().rx_ready() {
                ucp.rx_idle()?;
                return Ok(None);
            }
        }
        let rx = &mut ucp.state().rx;
        let index = (rx.delivered % rx.slots as u64) as usize;
        rx.slot[index] = Slot::Held;
        rx.delivered += 1;
        self.frame = (index * self.link.max, rx.len[index]);
        self.holding = true;
        drop(held);
        let (at, len) = self.frame;
        // SAFETY: `at` is `index * max` for a slot index below `slots`, so it lies inside the
        // receive buffer of `slots * max` bytes that `rx_buf` points to.
        let start = unsafe { self.link.rx_buf.add(at) };
        // SAFETY: the slot at `start` holds `len <= max` received bytes; it is Held, so neither
        // UCX (which only writes Free slots) nor the state touches it until this half releases
        // it, which needs `&mut self`, ending this borrow first. The buffer lives as long as
        // the link.
        Ok(Some(unsafe { std::slice::from_raw_parts(start, len) }))
    }
}

impl FrameReceiver for UcxReceiver {
    #[inline]
    fn recv(&mut self) -> Result<Option<&[u8]>, FrameRecvError> {
        self.take(true)
    }

    /// Frames that arrived with the last progress of the worker, without progressing it
    /// again: each progress calls into the network stack (over TCP, an `epoll_wait`), which
    /// right after a frame came would only find nothing more.
    #[inline]
    fn recv_arrived(&mut self) -> Result<Option<&[u8]>, FrameRecvError> {
        self.take(false)
    }

    fn wait_recv(&mut self, timeout: Duration) -> Result<bool, FrameRecvError> {
        if self.closed {
            return Err(FrameRecvError::Closed);
        }
        if self.holding {
            let link = Arc::clone(&self.link);
            let mut held = link.lock();
            self.release_held(held.ucp());
        }
        self.link.wait(RX, self.mode, timeout, |ucp| {
            if let Some(what) = ucp.state().protocol {
                return Err(FrameRecvError::Protocol(what));
            }
            if ucp.state().rx_ready() {
                return Ok(true);
            }
            ucp.rx_idle()?;
            Ok(false)
        })
    }

    /// Arms the shared worker (`ucp_worker_arm`) and marks this half asleep, after returning
    /// credits, so that the process's wake thread watches the worker and the progress that
    /// receives something for this half writes its eventfd (the wake descriptor);
    /// [`Armed::Ready`] when a frame, the peer's end, or an event the worker must progress
    /// first is already there. UCX's arming has no window in which an event is missed, so the
    /// half is never `fresh`.
    fn arm(&mut self) -> Result<Armed, FrameRecvError> {
        if self.closed {
            return Err(FrameRecvError::Closed);
        }
        let link = Arc::clone(&self.link);
        let mut held = link.lock();
        let ucp = held.ucp();
        self.release_held(ucp);
        ucp.state().awake(RX);
        ucp.worker.progress_all();
        if let Some(what) = ucp.state().protocol {
            return Err(FrameRecvError::Protocol(what));
        }
        if ucp.state().rx_ready() {
            return Ok(Armed::Ready);
        }
        match ucp.rx_idle() {
            Ok(()) => {}
            Err(FrameRecvError::PeerGone(_)) => return Ok(Armed::Ready),
            Err(e) => return Err(e),
        }
        match ucp.worker.arm() {
            ucp::Armed::Yes => {
                ucp.state().sleep(RX);
                Ok(Armed::Armed { fresh: false })
            }
            ucp::Armed::Busy => Ok(Armed::Ready),
        }
    }

    /// This half's own eventfd, written by whichever thread's progress (the wake thread's
    /// while the half sleeps) receives something for it; not the shared worker's descriptor,
    /// which every connection's traffic in the process makes readable.
    fn wake_fds(&self) -> [Option<BorrowedFd<'_>>; 2] {
        // SAFETY: the half's eventfd is owned by the link, which `&self` keeps alive.
        let waker = unsafe { BorrowedFd::borrow_raw(self.link.wakers[RX]) };
        [Some(waker), None]
    }

    /// Stops other threads' wake-ups for this half and consumes the one that came, if any.
    /// The worker needs no disarming: the next progress or arm consumes its events.
    fn disarm(&mut self) {
        let mut held = self.link.lock();
        held.ucp().state().awake(RX);
        drop(held);
        // SAFETY: the half's eventfd is owned by the link, which `self` keeps alive.
        crate::sys::drain(unsafe { BorrowedFd::borrow_raw(self.link.wakers[RX]) });
    }
}
