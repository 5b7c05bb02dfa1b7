//! One data-path thread of the server: many TCP clients, one data connection to the
//! orchestrator.
//!
//! The thread owns, allocated once when it starts: the epoll set of its clients, the
//! in-flight table (a FIFO of `--max-concurrent-messages` entries naming the client of each
//! request sent to the orchestrator) and the data connection, whose ring slots are the
//! thread's pool of message buffers. Each client owns a read buffer and a write buffer,
//! allocated small when it connects ([`MIN_READ_BUFFER`], [`MIN_WRITE_BUFFER`]) and doubled,
//! with `try_reserve`, when what it has in flight needs more: the read buffer up to two
//! largest messages, the write buffer up to `--max-concurrent-messages` largest responses. A
//! client that cannot be given memory waits for its answers, or is closed when it has none
//! coming; no allocation failure ends the process.
//!
//! One turn of the loop:
//!
//! 1. collect readiness from epoll (edge-triggered); while answers are due and the last turn
//!    wrote to no client, only now and then ([`POLL_WHILE_AWAITING`]);
//! 2. take every response off the data connection: the orchestrator answers each thread's
//!    requests in order, so the FIFO's head names the client; write it to that client straight
//!    from the ring when nothing of the client's is unwritten, and keep what the socket does
//!    not take (or all of it, behind unwritten bytes) in its write buffer;
//! 3. for each readable client, read all that is there and forward every complete request,
//!    as the client sent it, to the orchestrator, as long as the thread has a free in-flight
//!    entry and the client has room for the response (otherwise the client waits: it alone,
//!    nobody else); the entries that step 2 freed serve at once;
//! 4. write each client's buffered responses with one `write`.
//!
//! The data connection's sends do not wake the processor one by one: after step 3 the thread
//! wakes it once for all the frames of the turn, with a system call only if it sleeps
//! (`flush_wakes`), so that it has its work before the writes of step 4 wake clients. With
//! answers due and nothing else to do, the thread polls for a short while
//! ([`POLL_BEFORE_SLEEP`]), yielding its CPU between polls, so that a processor thread on its
//! CPU runs at once and one on another CPU answers without a wake-up. Then, or with nothing in
//! flight at once, it sleeps in `epoll_wait` on its clients' sockets and the data connection's
//! wake-up descriptor (edge-triggered, so it is never read); the processor wakes it once after
//! each burst of answers, and only if it sleeps.
//!
//! A client whose packets arrive on the CPU of another data-path thread (`SO_INCOMING_CPU`,
//! looked at every [`LOOK_EVERY`] answered frames) is handed over to that thread, with its
//! buffers, once it has nothing in flight, buffered or unwritten: a thread and its clients on
//! one CPU wake each other without inter-processor interrupts. Nothing in the loop allocates
//! once a client's buffers have grown to what it keeps in flight.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::eventfd::EventFd;
use tracing::{debug, error, info, warn};
use urom_transport::{Armed, FrameReceiver, FrameSendError, FrameSender, Transport};
use urom_wire::DecodeError;
use urom_wire::gpu::{CLIENT_HEADER_LEN, GpuMessage, MsgId, fast_client_message, message_length};

use crate::limits::{MIN_READ_BUFFER, MIN_WRITE_BUFFER};

/// The epoll token of the thread's wake-up eventfd.
const WAKE_TOKEN: u64 = u64::MAX;
/// The epoll token of the data connection's wake-up descriptor.
const RING_TOKEN: u64 = u64::MAX - 1;
/// The epoll token of the data connection's socket, which hangs up when the orchestrator dies.
const PEER_TOKEN: u64 = u64::MAX - 2;
/// How long a draining thread waits for the orchestrator's answers before closing clients.
const DRAIN_LIMIT: Duration = Duration::from_secs(5);
/// How long a stopping thread waits for its clients to close after their last answers.
const LINGER: Duration = Duration::from_secs(1);
/// How long an idle thread sleeps in `epoll_wait` before looking at its flags again.
const IDLE_WAIT: u16 = 50;
/// How long a client's requests wait for a new orchestrator when the old one went away; then
/// the client gets the answers it was given and end of file, as if its requests were lost.
pub(crate) const HOLD_WITHOUT_ORCHESTRATOR: Duration = Duration::from_secs(10);
/// How long a thread polls for answers before it sleeps until the processor wakes it.
const POLL_BEFORE_SLEEP: Duration = Duration::from_micros(200);
/// How often the sockets are looked at while a thread polls for answers.
const POLL_WHILE_AWAITING: Duration = Duration::from_micros(20);
/// Reads that a closing client's unread bytes get, at most, before its socket is closed.
const DRAIN_READS: usize = 4;
/// Clients handed over by other threads that may wait for a thread at once.
const MOVED_CLIENTS: usize = 64;
/// Frames answered to a client between two looks at the CPU its packets arrive on.
const LOOK_EVERY: u32 = 16;
/// Looks in a row that must find a client's packets on another thread's CPU before the
/// client moves there.
const AWAY_LOOKS: u8 = 2;
/// Events taken from epoll per turn.
const EVENTS: usize = 256;

/// What a data-path thread needs, built by the server before it starts the thread. `T` is the
/// data connection's transport (shared memory or UCX): the thread is compiled for it, so a
/// frame costs no dispatch.
pub(crate) struct DataPathConfig<T> {
    pub index: usize,
    pub max_message_length: usize,
    pub max_concurrent: usize,
    pub frame_capacity: usize,
    pub channel: T,
    /// Every data-path thread's mailbox, in thread order; this thread's is at `index`.
    pub mailboxes: Arc<[Mailbox]>,
    pub draining: Arc<AtomicBool>,
    /// Raised by a thread whose data connection broke to its connection's epoch + 1 (see
    /// [`ChannelSlot`]): the main thread then waits for a new orchestrator.
    pub lost: Arc<AtomicUsize>,
    /// Where the main thread puts the data connection to a new orchestrator.
    pub slot: Arc<ChannelSlot<T>>,
}

/// Where the main thread puts a data-path thread's data connection to a new orchestrator,
/// with its epoch (how many orchestrators came before it).
pub(crate) struct ChannelSlot<T> {
    conn: Mutex<Option<(T, usize)>>,
    /// A connection is in `conn`; looked at once per turn of the thread's loop.
    ready: AtomicBool,
}

impl<T> ChannelSlot<T> {
    pub(crate) fn new() -> Self {
        Self {
            conn: Mutex::new(None),
            ready: AtomicBool::new(false),
        }
    }

    /// Hands `conn`, of orchestrator `epoch`, to the thread (which the caller then wakes).
    pub(crate) fn put(&self, conn: T, epoch: usize) {
        *self.conn.lock().unwrap_or_else(|e| e.into_inner()) = Some((conn, epoch));
        self.ready.store(true, Ordering::Release);
    }

    fn take(&self) -> Option<(T, usize)> {
        if !self.ready.swap(false, Ordering::Acquire) {
            return None;
        }
        self.conn.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// How clients reach a data-path thread: from the acceptor, and from another data-path thread
/// that hands over a client whose packets arrive on this thread's CPU.
pub(crate) struct Mailbox {
    /// The CPU the thread is pinned to.
    cpu: usize,
    /// Clients accepted for the thread.
    pub incoming: Arc<ArrayQueue<(TcpStream, SocketAddr)>>,
    /// Clients handed over by other threads, buffers and all.
    moved: ArrayQueue<Client>,
    /// Written after a push to either queue.
    pub wake: Arc<EventFd>,
}

impl Mailbox {
    /// The mailbox of a thread pinned to `cpu`, with room for `waiting` accepted clients.
    pub(crate) fn new(cpu: usize, waiting: usize) -> io::Result<Self> {
        Ok(Self {
            cpu,
            incoming: Arc::new(ArrayQueue::new(waiting)),
            moved: ArrayQueue::new(MOVED_CLIENTS),
            wake: Arc::new(EventFd::new()?),
        })
    }
}

/// How a data-path thread ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DataPathEnd {
    /// It drained as asked.
    Drained,
    /// It panicked (as the main thread reads a failed join).
    Panicked,
}

/// One TCP client.
pub(crate) struct Client {
    stream: TcpStream,
    peer: SocketAddr,
    /// Its length is its size (grown by [`grow`]).
    rbuf: Vec<u8>,
    rstart: usize,
    rend: usize,
    /// Its length is its size (grown by [`grow`]).
    wbuf: Vec<u8>,
    wstart: usize,
    wend: usize,
    /// Requests forwarded whose responses have not arrived.
    awaiting: usize,
    /// Bytes of those requests: the room their responses (as long as the requests, from a
    /// processor that reverses bytes) are sure to find in the write buffer.
    reserved: usize,
    /// Epoll said readable and `read` has not returned `WouldBlock` since.
    readable: bool,
    /// Epoll said the client closed its sending side (or the connection broke): reads return
    /// end of file once its data is taken, and no new edge will say so.
    hup: bool,
    /// The client closed its sending side.
    eof: bool,
    in_pending: bool,
    in_dirty: bool,
    /// While no orchestrator is connected: since when the client's requests wait.
    held_since: Option<Instant>,
    /// Frames answered since the thread last asked where the client's packets arrive.
    answered: u32,
    /// Looks in a row that found the client's packets arriving on another thread's CPU.
    away: u8,
}

impl Client {
    fn unwritten(&self) -> usize {
        self.wend - self.wstart
    }

    /// Whether the responses to `more` bytes of requests are sure to fit besides those
    /// already awaited, growing the write buffer (up to `cap` bytes) if they would not.
    fn has_room(&mut self, more: usize, cap: usize) -> bool {
        let need = self.unwritten() + self.reserved + more;
        need <= self.wbuf.len() || grow(&mut self.wbuf, need, cap)
    }

    fn done(&self) -> bool {
        self.eof && self.awaiting == 0 && self.unwritten() == 0
    }
}

/// Sets `channel` to defer its wake-ups and watches its wake-up descriptors with `epoll`.
fn register_channel<T: Transport>(epoll: &Epoll, channel: &mut T) -> io::Result<()> {
    let (tx, rx) = channel.split();
    // One wake-up per turn, after all its frames (`flush_wakes`).
    tx.defer_wakes(true);
    // Edge-triggered: every wake-up is an edge, so the descriptor is never read.
    for (fd, token) in rx.wake_fds().into_iter().zip([RING_TOKEN, PEER_TOKEN]) {
        if let Some(fd) = fd {
            let mut event = EpollEvent::new(
                EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP | EpollFlags::EPOLLET,
                token,
            );
            // A descriptor number of the old connection's may still be watched.
            if let Err(nix::errno::Errno::EEXIST) = epoll.add(fd, event) {
                epoll.modify(fd, &mut event)?;
            }
        }
    }
    Ok(())
}

/// Grows `buf` (whose length is its size) to at least `need` bytes, doubling, up to `cap`;
/// `false`, with `buf` unchanged, when `need` is over `cap` or the memory cannot be had.
fn grow(buf: &mut Vec<u8>, need: usize, cap: usize) -> bool {
    if need <= buf.len() {
        return true;
    }
    if need > cap {
        return false;
    }
    let size = need.max(buf.len().saturating_mul(2)).min(cap);
    if buf.try_reserve_exact(size - buf.len()).is_err() {
        return false;
    }
    buf.resize(size, 0);
    true
}

/// A zeroed buffer of `len` bytes, or an error when the memory cannot be had.
fn zeroed(len: usize) -> io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    if !grow(&mut buf, len, len) {
        return Err(io::Error::new(
            io::ErrorKind::OutOfMemory,
            format!("cannot allocate its {len}-byte buffer"),
        ));
    }
    Ok(buf)
}

/// An in-flight frame: the client's slot and generation, its requests and their bytes.
type FrameEntry = (u32, u32, u32, u32);

/// The in-flight table: which client (slot, generation) each forwarded frame came from, and
/// how many requests (and bytes) it holds, oldest first. Its storage is allocated once, for `capacity`
/// frames; the caller checks [`InFlight::is_full`] before each push, so it never grows.
struct InFlight {
    entries: VecDeque<FrameEntry>,
    capacity: usize,
    /// Requests in the frames in flight.
    messages: usize,
}

impl InFlight {
    fn new(capacity: usize) -> Self {
        Self {
            entries: VecDeque::with_capacity(capacity),
            capacity,
            messages: 0,
        }
    }

    /// Frames in flight.
    fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no frame is in flight.
    fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn is_full(&self) -> bool {
        self.entries.len() == self.capacity
    }

    fn push(&mut self, entry: FrameEntry) {
        debug_assert!(
            !self.is_full(),
            "the in-flight table grows past its capacity"
        );
        self.entries.push_back(entry);
        self.messages += entry.2 as usize;
    }

    fn pop(&mut self) -> Option<FrameEntry> {
        let entry = self.entries.pop_front()?;
        self.messages -= entry.2 as usize;
        Some(entry)
    }
}

/// Why reading a client stopped.
enum ReadOutcome {
    /// Nothing more to do until epoll reports the client again.
    Idle,
    /// Requests wait for an in-flight entry or room for responses.
    Blocked,
    /// The client must be closed.
    Close,
}

pub(crate) struct DataPath<T> {
    index: usize,
    max_len: usize,
    max_message: usize,
    max_concurrent: usize,
    frame_capacity: usize,
    channel: T,
    mailboxes: Arc<[Mailbox]>,
    draining: Arc<AtomicBool>,
    lost: Arc<AtomicUsize>,
    slot: Arc<ChannelSlot<T>>,
    /// The orchestrator the data connection goes to: 0 for the first, one more for each new.
    epoch: usize,
    /// The data connection broke: nothing is forwarded until a new one comes in `slot`.
    detached: bool,
    epoll: Epoll,
    events: Vec<EpollEvent>,
    clients: Vec<Option<Client>>,
    generations: Vec<u32>,
    free: Vec<u32>,
    inflight: InFlight,
    pending: Vec<u32>,
    dirty: Vec<u32>,
    served: u64,
    /// The data connection's socket hung up: the orchestrator may be gone.
    peer_hung_up: bool,
    /// Frames forwarded since the processor was last woken (`flush_wakes`).
    unflushed: usize,
    /// Responses went to a client straight from the ring since the last `flush`.
    wrote_directly: bool,
}

impl<T: Transport> DataPath<T> {
    /// Builds the thread's state; call it on the (pinned) thread itself.
    pub(crate) fn new(config: DataPathConfig<T>) -> io::Result<Self> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        epoll.add(
            config.mailboxes[config.index].wake.as_fd(),
            EpollEvent::new(EpollFlags::EPOLLIN, WAKE_TOKEN),
        )?;
        let mut channel = config.channel;
        register_channel(&epoll, &mut channel)?;
        Ok(Self {
            index: config.index,
            max_len: config.max_message_length,
            max_message: CLIENT_HEADER_LEN + config.max_message_length,
            max_concurrent: config.max_concurrent,
            frame_capacity: config.frame_capacity,
            channel,
            mailboxes: config.mailboxes,
            draining: config.draining,
            lost: config.lost,
            slot: config.slot,
            epoch: 0,
            detached: false,
            epoll,
            events: vec![EpollEvent::empty(); EVENTS],
            clients: Vec::with_capacity(64),
            generations: Vec::with_capacity(64),
            free: Vec::with_capacity(64),
            inflight: InFlight::new(config.max_concurrent),
            pending: Vec::with_capacity(64),
            dirty: Vec::with_capacity(64),
            served: 0,
            peer_hung_up: false,
            unflushed: 0,
            wrote_directly: false,
        })
    }

    /// Serves clients until drained (through orchestrators going away and new ones coming:
    /// [`Self::detach`], [`Self::attach`]), then closes every client
    /// cleanly.
    pub(crate) fn run(mut self) -> DataPathEnd {
        let mut drain_since: Option<Instant> = None;
        let mut progress = true;
        // Responses were written in the last turn: their clients may have sent more already.
        let mut wrote = true;
        let mut last_progress = Instant::now();
        let mut last_poll = last_progress;
        let end = loop {
            if self.draining.load(Ordering::Relaxed) {
                let since = *drain_since.get_or_insert_with(Instant::now);
                if self.inflight.is_empty() && self.dirty.is_empty() {
                    break DataPathEnd::Drained;
                }
                if since.elapsed() > DRAIN_LIMIT {
                    warn!(
                        thread = self.index,
                        in_flight = self.inflight.len(),
                        "drain time over: closing clients with requests unanswered"
                    );
                    break DataPathEnd::Drained;
                }
            }
            let now = Instant::now();
            if progress {
                last_progress = now;
            }
            // Answers due a short while: poll, looking at the sockets now and then (each look
            // is a system call) and yielding the CPU between polls, so that a processor thread
            // on this CPU runs at once and one on another CPU answers without a wake-up.
            // Longer: sleep until the processor's wake-up. A turn that forwarded requests goes
            // on polling for their answers without looking at the sockets again: each client
            // was read until its socket was empty, and its next bytes raise a new edge, which
            // the next look finds. Only clients just written to are likely to have sent more
            // at once.
            let polling =
                !wrote && !self.inflight.is_empty() && now - last_progress < POLL_BEFORE_SLEEP;
            progress = if polling {
                if now - last_poll >= POLL_WHILE_AWAITING {
                    last_poll = now;
                    self.poll_events(EpollTimeout::ZERO)
                } else {
                    false
                }
            } else {
                // With nothing in flight and no client waiting to be read, only epoll's events
                // can bring work: sleep at once, even after a busy turn (a look that finds
                // nothing costs a system call per burst, and events already there end the
                // sleep at once).
                let settled = self.inflight.is_empty() && self.pending.is_empty();
                let timeout = if progress && !settled {
                    EpollTimeout::ZERO
                } else if !self.inflight.is_empty() {
                    self.await_answers()
                } else if drain_since.is_some() {
                    // Only clients' unwritten answers are left: look again soon.
                    EpollTimeout::from(1u8)
                } else {
                    EpollTimeout::from(IDLE_WAIT)
                };
                last_poll = now;
                self.poll_events(timeout)
            };
            if self.slot.ready.load(Ordering::Relaxed) {
                if let Some((conn, epoch)) = self.slot.take() {
                    self.attach(conn, epoch);
                    progress = true;
                }
            }
            // Responses first: the in-flight entries and room they free let the requests
            // read next go out in this turn, before the writes below wake their clients.
            if !self.detached {
                match self.take_responses() {
                    Ok(took) => progress |= took,
                    Err(()) => self.detach(true),
                }
            }
            if !self.detached && drain_since.is_none() && self.read_clients() {
                progress = true;
            }
            if self.detached && self.end_held_clients(now) {
                progress = true;
            }
            if self.unflushed > 0 {
                // The frames forwarded in this turn cost the processor one wake-up, and only
                // if it sleeps; before the writes, so that it has its work when a client woken
                // by them hands the CPU on.
                self.channel.split().0.flush_wakes();
                self.unflushed = 0;
            }
            wrote = self.flush();
            progress |= wrote;
            if polling && !progress {
                std::thread::yield_now();
            }
        };
        self.close_all();
        info!(
            thread = self.index,
            requests = self.served,
            "data-path thread stopped"
        );
        end
    }

    /// The data connection broke (or a new one replaces it): the requests in flight are lost,
    /// so each client that had some gets the answers it was given, then end of file, and
    /// sends nothing more; the others keep their connection, and their requests wait for
    /// the new connection. With `report`, tells the main thread.
    fn detach(&mut self, report: bool) {
        self.detached = true;
        self.peer_hung_up = false;
        self.unflushed = 0;
        if report {
            self.lost.fetch_max(self.epoch + 1, Ordering::Relaxed);
        }
        let (mut requests, mut clients) = (0u64, 0u64);
        while let Some((slot, generation, count, _)) = self.inflight.pop() {
            requests += u64::from(count);
            if self.generations[slot as usize] != generation {
                continue;
            }
            if self.end_client(slot) {
                clients += 1;
            }
        }
        warn!(
            thread = self.index,
            requests_lost = requests,
            clients_closed = clients,
            "the data connection to the orchestrator broke: the clients whose requests were in flight get the answers they were given, then end of file; the others wait for a new orchestrator"
        );
    }

    /// Ends client `slot` as one whose requests were lost: it gets the answers it was given,
    /// then end of file, and nothing more is read from it. Whether it was still sending or
    /// awaiting answers.
    fn end_client(&mut self, slot: u32) -> bool {
        let Some(Some(client)) = self.clients.get_mut(slot as usize) else {
            return false;
        };
        let was_active = !client.eof || client.awaiting > 0;
        client.awaiting = 0;
        client.reserved = 0;
        client.eof = true;
        client.readable = false;
        client.rstart = 0;
        client.rend = 0;
        client.held_since = None;
        if !client.in_dirty {
            client.in_dirty = true;
            self.dirty.push(slot);
        }
        was_active
    }

    /// While no orchestrator is connected: ends the clients whose requests waited longer
    /// than [`HOLD_WITHOUT_ORCHESTRATOR`] for one; returns whether it ended any.
    fn end_held_clients(&mut self, now: Instant) -> bool {
        let mut ended = 0;
        for slot in 0..self.clients.len() {
            let Some(client) = &mut self.clients[slot] else {
                continue;
            };
            if client.eof || !(client.readable || client.rstart < client.rend) {
                continue;
            }
            let since = *client.held_since.get_or_insert(now);
            if now.duration_since(since) >= HOLD_WITHOUT_ORCHESTRATOR {
                self.end_client(slot as u32);
                ended += 1;
            }
        }
        if ended > 0 {
            warn!(
                thread = self.index,
                clients_closed = ended,
                "no orchestrator for {HOLD_WITHOUT_ORCHESTRATOR:?}: the clients whose requests waited get the answers they were given, then end of file"
            );
        }
        ended > 0
    }

    /// Serves the data connection `conn` to orchestrator `epoch` from now on; the old one's
    /// requests in flight are lost ([`Self::detach`]).
    fn attach(&mut self, mut conn: T, epoch: usize) {
        if !self.detached {
            self.detach(false);
        }
        if let Err(e) = register_channel(&self.epoll, &mut conn) {
            error!(
                thread = self.index,
                "cannot watch the new data connection: {e}"
            );
        }
        self.channel = conn;
        self.epoch = epoch;
        self.detached = false;
        info!(thread = self.index, "serving a new orchestrator");
        // Clients whose requests waited are read again.
        for slot in 0..self.clients.len() {
            if let Some(client) = &mut self.clients[slot] {
                client.held_since = None;
                if (client.readable || client.rstart < client.rend) && !client.in_pending {
                    client.in_pending = true;
                    self.pending.push(slot as u32);
                }
            }
        }
    }

    /// How long to sleep in `epoll_wait` while answers are due: arms the data connection so
    /// that the orchestrator's next frame wakes this thread.
    fn await_answers(&mut self) -> EpollTimeout {
        match self.channel.split().1.arm() {
            // The processor flushes its wake-ups after its frames (`flush_wakes`), so even a
            // fresh arming misses none: sleep long.
            Ok(Armed::Armed { .. }) => EpollTimeout::from(IDLE_WAIT),
            Ok(Armed::Ready) | Err(_) => EpollTimeout::ZERO,
            Ok(Armed::Unsupported) => {
                std::thread::yield_now();
                EpollTimeout::ZERO
            }
        }
    }

    /// Takes epoll's events; returns whether any arrived.
    fn poll_events(&mut self, timeout: EpollTimeout) -> bool {
        let n = match self.epoll.wait(&mut self.events, timeout) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => 0,
            Err(errno) => {
                error!(thread = self.index, "epoll_wait failed: {errno}");
                std::thread::sleep(Duration::from_millis(1));
                0
            }
        };
        for i in 0..n {
            let event = self.events[i];
            let token = event.data();
            if token == WAKE_TOKEN {
                let _ = self.mailboxes[self.index].wake.read();
                self.adopt_new_clients();
                continue;
            }
            if token == RING_TOKEN {
                continue;
            }
            if token == PEER_TOKEN {
                self.peer_hung_up = true;
                continue;
            }
            let slot = token as u32;
            let Some(Some(client)) = self.clients.get_mut(slot as usize) else {
                continue;
            };
            let flags = event.events();
            if flags.intersects(
                EpollFlags::EPOLLIN
                    | EpollFlags::EPOLLRDHUP
                    | EpollFlags::EPOLLHUP
                    | EpollFlags::EPOLLERR,
            ) {
                client.readable = true;
                if flags.intersects(EpollFlags::EPOLLRDHUP | EpollFlags::EPOLLHUP) {
                    client.hup = true;
                }
                if !client.in_pending {
                    client.in_pending = true;
                    self.pending.push(slot);
                }
            }
            if flags.contains(EpollFlags::EPOLLOUT) && client.unwritten() > 0 && !client.in_dirty {
                client.in_dirty = true;
                self.dirty.push(slot);
            }
        }
        n > 0
    }

    /// Takes the clients the acceptor assigned to this thread.
    fn adopt_new_clients(&mut self) {
        let mailboxes = Arc::clone(&self.mailboxes);
        let mailbox = &mailboxes[self.index];
        while let Some((stream, peer)) = mailbox.incoming.pop() {
            if let Err(e) = self.adopt(stream, peer) {
                warn!(thread = self.index, %peer, "cannot serve client: {e}");
            }
        }
        while let Some(client) = mailbox.moved.pop() {
            let peer = client.peer;
            if let Err(e) = self.take_in(client) {
                warn!(thread = self.index, %peer, "cannot serve client handed over: {e}");
            }
        }
    }

    /// Serves `client` from now on: registers it with this thread's epoll in a free slot and
    /// reads it at once (its packets may have arrived before registration).
    fn take_in(&mut self, mut client: Client) -> io::Result<()> {
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.clients.push(None);
                self.generations.push(0);
                (self.clients.len() - 1) as u32
            }
        };
        let flags = EpollFlags::EPOLLIN
            | EpollFlags::EPOLLOUT
            | EpollFlags::EPOLLRDHUP
            | EpollFlags::EPOLLET;
        if let Err(errno) = self.epoll.add(
            client.stream.as_fd(),
            EpollEvent::new(flags, u64::from(slot)),
        ) {
            self.free.push(slot);
            return Err(errno.into());
        }
        client.readable = true;
        client.in_pending = true;
        client.in_dirty = false;
        client.answered = 0;
        client.away = 0;
        self.clients[slot as usize] = Some(client);
        self.pending.push(slot);
        Ok(())
    }

    /// The thread whose CPU `client`'s packets arrive on, when that is another thread's and
    /// has been so for [`AWAY_LOOKS`] looks in a row. Looks only every [`LOOK_EVERY`] answered
    /// frames (each look is a system call), and only at a client with nothing in flight,
    /// buffered or unwritten, which can move to another thread as it is.
    fn destination(&mut self, slot: u32) -> Option<usize> {
        let client = self.clients.get_mut(slot as usize)?.as_mut()?;
        if client.answered < LOOK_EVERY
            || client.awaiting > 0
            || client.rstart < client.rend
            || client.unwritten() > 0
            || client.eof
            || client.hup
        {
            return None;
        }
        client.answered = 0;
        let cpu = urom_transport::sys::socket_incoming_cpu(client.stream.as_fd());
        let to = cpu.and_then(|cpu| self.mailboxes.iter().position(|m| m.cpu == cpu));
        match to {
            Some(to) if to != self.index => {
                client.away += 1;
                (client.away >= AWAY_LOOKS).then_some(to)
            }
            _ => {
                client.away = 0;
                None
            }
        }
    }

    /// Hands client `slot` over to thread `to`, which then serves it from its CPU; keeps it
    /// when `to`'s mailbox is full.
    fn hand_over(&mut self, slot: u32, to: usize) {
        let Some(client) = self.clients.get_mut(slot as usize).and_then(Option::take) else {
            return;
        };
        let _ = self.epoll.delete(client.stream.as_fd());
        self.generations[slot as usize] = self.generations[slot as usize].wrapping_add(1);
        self.pending.retain(|&s| s != slot);
        self.dirty.retain(|&s| s != slot);
        self.free.push(slot);
        let peer = client.peer;
        match self.mailboxes[to].moved.push(client) {
            Ok(()) => {
                let _ = self.mailboxes[to].wake.write(1);
                debug!(thread = self.index, %peer, to, "client handed over to the thread on its CPU");
            }
            Err(client) => {
                if let Err(e) = self.take_in(client) {
                    warn!(thread = self.index, %peer, "cannot serve client: {e}");
                }
            }
        }
    }

    /// Serves a newly accepted client from now on, through [`Self::take_in`].
    fn adopt(&mut self, stream: TcpStream, peer: SocketAddr) -> io::Result<()> {
        stream.set_nonblocking(true)?;
        stream.set_nodelay(true)?;
        self.take_in(Client {
            stream,
            peer,
            rbuf: zeroed(MIN_READ_BUFFER.min(self.read_cap()))?,
            rstart: 0,
            rend: 0,
            wbuf: zeroed(MIN_WRITE_BUFFER.min(self.write_cap()))?,
            wstart: 0,
            wend: 0,
            awaiting: 0,
            reserved: 0,
            // Data may have arrived before registration: read once without waiting for an
            // edge.
            readable: true,
            hup: false,
            eof: false,
            in_pending: true,
            held_since: None,
            in_dirty: false,
            answered: 0,
            away: 0,
        })?;
        debug!(thread = self.index, %peer, "client connected");
        Ok(())
    }

    /// The most a client's read buffer grows to: two largest messages (one being read behind
    /// one that waits), at least [`MIN_READ_BUFFER`].
    fn read_cap(&self) -> usize {
        MIN_READ_BUFFER.max(2 * self.max_message)
    }

    /// The most a client's write buffer grows to: a largest response for each request the
    /// thread may have in flight.
    fn write_cap(&self) -> usize {
        self.max_concurrent.saturating_mul(self.max_message)
    }

    /// Reads and forwards for every client that has something; returns whether anything was
    /// read or forwarded.
    fn read_clients(&mut self) -> bool {
        let mut progress = false;
        let mut i = 0;
        while i < self.pending.len() {
            let slot = self.pending[i];
            let (outcome, moved) = self.read_client(slot);
            progress |= moved;
            match outcome {
                ReadOutcome::Blocked => i += 1,
                ReadOutcome::Idle => {
                    if let Some(Some(client)) = self.clients.get_mut(slot as usize) {
                        client.in_pending = false;
                    }
                    self.pending.swap_remove(i);
                }
                ReadOutcome::Close => {
                    self.pending.swap_remove(i);
                    self.close(slot, false);
                }
            }
        }
        progress
    }

    /// Forwards the complete requests of client `slot`, reading more while it can; returns
    /// why it stopped and whether it moved anything.
    fn read_client(&mut self, slot: u32) -> (ReadOutcome, bool) {
        let generation = self.generations[slot as usize];
        let write_cap = self.write_cap();
        let read_cap = self.read_cap();
        let Some(Some(client)) = self.clients.get_mut(slot as usize) else {
            return (ReadOutcome::Idle, false);
        };
        let mut moved = false;
        loop {
            // Forward the complete requests already read, as many per frame as fit.
            let mut end = client.rstart;
            let mut count = 0usize;
            let mut stop = None;
            let mut frame_full = false;
            // A malformed message at `end`: what precedes it is answered, the rest dropped.
            let mut bad = false;
            while end < client.rend {
                let available = &client.rbuf[end..client.rend];
                let len = match fast_client_message(available, MsgId::ClientRequest, self.max_len) {
                    Some(len) => len,
                    None => match check_request(available, self.max_len, self.index, client.peer) {
                        Ok(Some(len)) => len,
                        Ok(None) => break,
                        Err(()) => {
                            bad = true;
                            break;
                        }
                    },
                };
                if count > 0 && end + len - client.rstart > self.frame_capacity {
                    frame_full = true;
                    break;
                }
                if self.inflight.messages + count >= self.max_concurrent || self.inflight.is_full()
                {
                    stop = Some(ReadOutcome::Blocked);
                    break;
                }
                if !client.has_room(end + len - client.rstart, write_cap) {
                    stop = Some(
                        if count == 0 && client.awaiting == 0 && client.unwritten() == 0 {
                            // Nothing will free memory for it: it cannot be served.
                            warn!(thread = self.index, peer = %client.peer, "cannot allocate the {}-byte write buffer this client's requests need; disconnecting it", client.reserved + len);
                            ReadOutcome::Close
                        } else {
                            ReadOutcome::Blocked
                        },
                    );
                    break;
                }
                end += len;
                count += 1;
            }
            if count > 0 {
                match self.channel.send(&client.rbuf[client.rstart..end]) {
                    Ok(()) => {}
                    Err(FrameSendError::Full) => return (ReadOutcome::Blocked, moved),
                    Err(e) => {
                        error!(
                            thread = self.index,
                            "cannot forward to the orchestrator: {e}"
                        );
                        return (ReadOutcome::Blocked, moved);
                    }
                }
                let bytes = end - client.rstart;
                self.inflight
                    .push((slot, generation, count as u32, bytes as u32));
                self.unflushed += 1;
                client.awaiting += count;
                client.reserved += bytes;
                client.rstart = end;
                moved = true;
            }
            if bad {
                // Read nothing more; close once the answers to what came before are written.
                client.rend = client.rstart;
                client.eof = true;
                client.readable = false;
            }
            if let Some(outcome) = stop {
                return (outcome, moved);
            }
            if frame_full {
                continue;
            }
            if client.rstart == client.rend {
                client.rstart = 0;
                client.rend = 0;
            }
            if client.eof {
                if client.rstart < client.rend {
                    warn!(thread = self.index, peer = %client.peer, bytes = client.rend - client.rstart, "client closed in the middle of a message");
                    return (ReadOutcome::Close, moved);
                }
                return if client.done() {
                    (ReadOutcome::Close, moved)
                } else {
                    (ReadOutcome::Idle, moved)
                };
            }
            if !client.readable {
                return (ReadOutcome::Idle, moved);
            }
            if client.rstart > 0 {
                client.rbuf.copy_within(client.rstart..client.rend, 0);
                client.rend -= client.rstart;
                client.rstart = 0;
            }
            if client.rend == client.rbuf.len() {
                // A message longer than the buffer so far.
                let need = client.rbuf.len().saturating_mul(2);
                if !grow(&mut client.rbuf, need.min(read_cap), read_cap) {
                    warn!(thread = self.index, peer = %client.peer, "cannot allocate a {need}-byte read buffer for this client's message; disconnecting it");
                    return (ReadOutcome::Close, moved);
                }
            }
            match client.stream.read(&mut client.rbuf[client.rend..]) {
                Ok(0) => {
                    client.eof = true;
                    client.readable = false;
                }
                Ok(n) => {
                    // A short read emptied the socket: the next arrival raises a new edge, so
                    // skip the read that would only say `WouldBlock`. Not after the peer's
                    // FIN, whose edge came before this read: only the next read sees the end
                    // of file, and no edge will ask for it.
                    if client.rend + n < client.rbuf.len() && !client.hup {
                        client.readable = false;
                    }
                    client.rend += n;
                    moved = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    client.readable = false;
                    return (ReadOutcome::Idle, moved);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    debug!(thread = self.index, peer = %client.peer, "read failed: {e}");
                    return (ReadOutcome::Close, moved);
                }
            }
        }
    }

    /// Takes every response off the data connection into its client's write buffer; `Err`
    /// when the orchestrator is gone.
    fn take_responses(&mut self) -> Result<bool, ()> {
        let mut took = false;
        let write_cap = self.write_cap();
        loop {
            let frame = match self.channel.recv() {
                Ok(Some(frame)) => frame,
                Ok(None) if self.peer_hung_up => match self.channel.check_peer() {
                    Ok(()) => return Ok(took),
                    Err(e) => {
                        error!(
                            thread = self.index,
                            "data connection to the orchestrator lost: {e}"
                        );
                        return Err(());
                    }
                },
                Ok(None) => return Ok(took),
                Err(e) => {
                    error!(
                        thread = self.index,
                        "data connection to the orchestrator lost: {e}"
                    );
                    return Err(());
                }
            };
            took = true;
            let Some((slot, generation, count, bytes)) = self.inflight.pop() else {
                error!(
                    thread = self.index,
                    "the orchestrator sent a response nobody asked for; dropped"
                );
                continue;
            };
            if self.generations[slot as usize] != generation {
                continue; // The client left before its answers came.
            }
            let Some(Some(client)) = self.clients.get_mut(slot as usize) else {
                continue;
            };
            client.awaiting -= count as usize;
            client.reserved -= bytes as usize;
            if !responses_valid(frame, count, self.max_len) {
                error!(thread = self.index, peer = %client.peer, "the orchestrator sent a malformed response; disconnecting its client");
                self.close(slot, false);
                continue;
            }
            // With nothing unwritten before them, the responses go to the socket straight
            // from the ring (the kernel's copy is their only one); what it does not take now
            // waits in the write buffer, as after an error, which `flush` meets again.
            let mut rest = frame;
            if client.unwritten() == 0 {
                if let Ok(n) = client.stream.write(frame) {
                    rest = &frame[n..];
                    self.wrote_directly = true;
                }
            }
            if client.wend + rest.len() > client.wbuf.len() {
                client.wbuf.copy_within(client.wstart..client.wend, 0);
                client.wend -= client.wstart;
                client.wstart = 0;
            }
            // Responses longer than their requests (from a processor that does not reverse
            // bytes) may need more room than was kept for them.
            let need = client.wend + rest.len() + client.reserved;
            if client.wend + rest.len() > client.wbuf.len()
                && !grow(&mut client.wbuf, need, need.max(write_cap))
            {
                error!(thread = self.index, peer = %client.peer, "cannot allocate the {need}-byte write buffer for this client's responses; disconnecting it");
                self.close(slot, false);
                continue;
            }
            client.wbuf[client.wend..client.wend + rest.len()].copy_from_slice(rest);
            client.wend += rest.len();
            self.served += u64::from(count);
            client.answered += 1;
            if !client.in_dirty {
                client.in_dirty = true;
                self.dirty.push(slot);
            }
            // Room for responses may unblock its reads.
            if (client.readable || client.rstart < client.rend) && !client.in_pending {
                client.in_pending = true;
                self.pending.push(slot);
            }
        }
    }

    /// Writes every client's pending responses, one `write` each; returns whether anything
    /// was written, in this call or straight from the ring since the last.
    fn flush(&mut self) -> bool {
        let mut wrote = std::mem::take(&mut self.wrote_directly);
        while let Some(slot) = self.dirty.pop() {
            let Some(Some(client)) = self.clients.get_mut(slot as usize) else {
                continue;
            };
            let mut close = false;
            while client.unwritten() > 0 {
                match client
                    .stream
                    .write(&client.wbuf[client.wstart..client.wend])
                {
                    Ok(n) => {
                        client.wstart += n;
                        wrote = true;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        // Epoll's EPOLLOUT edge puts it back on the list.
                        break;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        debug!(thread = self.index, peer = %client.peer, "write failed: {e}");
                        close = true;
                        break;
                    }
                }
            }
            let mut written = false;
            if client.unwritten() == 0 {
                client.wstart = 0;
                client.wend = 0;
                if client.done() {
                    close = true;
                } else if client.rstart < client.rend && !client.in_pending {
                    client.in_pending = true;
                    self.pending.push(slot);
                }
                written = true;
            }
            // Still unwritten: the socket is full, and epoll's EPOLLOUT edge puts the client
            // back on the list.
            client.in_dirty = false;
            if close {
                self.close(slot, true);
            } else if written && !self.draining.load(Ordering::Relaxed) {
                if let Some(to) = self.destination(slot) {
                    self.hand_over(slot, to);
                }
            }
        }
        wrote
    }

    /// Closes client `slot`: cleanly (FIN after what was written) or at once.
    fn close(&mut self, slot: u32, clean: bool) {
        let Some(mut client) = self.clients.get_mut(slot as usize).and_then(Option::take) else {
            return;
        };
        if clean {
            let _ = client.stream.shutdown(Shutdown::Write);
        }
        // Closing with unread bytes resets the connection, which can destroy answers the
        // client has not read yet: drop what is there first.
        for _ in 0..DRAIN_READS {
            match client.stream.read(&mut client.rbuf) {
                Ok(n) if n > 0 => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                _ => break,
            }
        }
        debug!(thread = self.index, peer = %client.peer, "client disconnected");
        self.generations[slot as usize] = self.generations[slot as usize].wrapping_add(1);
        self.pending.retain(|&s| s != slot);
        self.dirty.retain(|&s| s != slot);
        self.free.push(slot);
    }

    /// Writes what can still be written and closes every client cleanly: end of file after
    /// its last answer, then a short linger that reads and drops what it still sends, so that
    /// closing does not turn into a reset that could destroy answers it has not read yet.
    fn close_all(&mut self) {
        let mut lingering: Vec<TcpStream> = Vec::with_capacity(self.clients.len());
        for slot in 0..self.clients.len() {
            let Some(mut client) = self.clients[slot].take() else {
                continue;
            };
            let _ = client.stream.set_nonblocking(false);
            let _ = client
                .stream
                .set_write_timeout(Some(Duration::from_millis(100)));
            let _ = client
                .stream
                .write_all(&client.wbuf[client.wstart..client.wend]);
            let _ = client.stream.shutdown(Shutdown::Write);
            let _ = client.stream.set_nonblocking(true);
            lingering.push(client.stream);
        }
        // Clients assigned or handed over but not yet adopted get a clean close too (one
        // handed over had nothing unwritten).
        let mailbox = &self.mailboxes[self.index];
        while let Some((stream, _)) = mailbox.incoming.pop() {
            let _ = stream.shutdown(Shutdown::Write);
            let _ = stream.set_nonblocking(true);
            lingering.push(stream);
        }
        while let Some(client) = mailbox.moved.pop() {
            let _ = client.stream.shutdown(Shutdown::Write);
            let _ = client.stream.set_nonblocking(true);
            lingering.push(client.stream);
        }
        let deadline = Instant::now() + LINGER;
        let mut scratch = [0u8; 4096];
        while !lingering.is_empty() && Instant::now() < deadline {
            lingering.retain_mut(|stream| {
                loop {
                    match stream.read(&mut scratch) {
                        Ok(0) => return false,
                        Ok(_) => {}
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(_) => return false,
                    }
                }
            });
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// The full check of the message at the start of `available`, for what the fast read does not
/// take: its length once it is whole and a well-formed `client_request`, `None` while it is
/// incomplete, `Err` (logged) when it is anything else.
#[cold]
fn check_request(
    available: &[u8],
    max_len: usize,
    thread: usize,
    peer: SocketAddr,
) -> Result<Option<usize>, ()> {
    let len = match message_length(available, max_len) {
        Ok(Some(len)) if len <= available.len() => len,
        Ok(_) => return Ok(None),
        Err(DecodeError::TooLong { length, .. }) => {
            warn!(thread, %peer, "a request with a payload of {} bytes exceeds --max-message-length {max_len}; answering the requests before it, then disconnecting the client", length - CLIENT_HEADER_LEN);
            return Err(());
        }
        Err(DecodeError::LengthBelowHeader { length, header }) => {
            warn!(thread, %peer, "a request's wire_size (its first 4 bytes) says {length} bytes, less than its {header}-byte header; answering the requests before it, then disconnecting the client");
            return Err(());
        }
        Err(DecodeError::LengthMismatch { expected, length }) => {
            warn!(thread, %peer, "a message's wire_size (its first 4 bytes) says {length} bytes, but a message of its msg_id is always {expected}; answering the requests before it, then disconnecting the client");
            return Err(());
        }
        Err(e) => {
            warn!(thread, %peer, "malformed message from client: {e}; answering the requests before it, then disconnecting it");
            return Err(());
        }
    };
    match GpuMessage::parse(&available[..len], max_len) {
        Ok(GpuMessage::ClientRequest(_)) => Ok(Some(len)),
        Ok(other) => {
            warn!(thread, %peer, msg_id = ?other.msg_id(), "client sent a message other than client_request; answering the requests before it, then disconnecting it");
            Err(())
        }
        Err(DecodeError::LengthMismatch { expected, length }) => {
            warn!(thread, %peer, "malformed client_request: its payload length field (bytes 8 to 11) says {length} bytes, but its wire_size leaves {expected} for the payload; answering the requests before it, then disconnecting it");
            Err(())
        }
        Err(e) => {
            warn!(thread, %peer, "malformed client_request: {e}; answering the requests before it, then disconnecting it");
            Err(())
        }
    }
}

/// Whether `frame` holds exactly `count` well-formed `client_response` messages.
fn responses_valid(frame: &[u8], count: u32, max_len: usize) -> bool {
    let mut at = 0;
    for _ in 0..count {
        match fast_client_message(&frame[at..], MsgId::ClientResponse, max_len) {
            Some(len) => at += len,
            None => return false,
        }
    }
    at == frame.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use urom_wire::gpu::GpuMessage;

    fn frame_of(messages: &[GpuMessage<'_>]) -> Vec<u8> {
        let mut frame = vec![0u8; messages.iter().map(GpuMessage::buffer_len).sum()];
        let mut at = 0;
        for message in messages {
            at += message.emit(&mut frame[at..], 256).unwrap();
        }
        frame
    }

    #[test]
    fn response_frames_must_hold_exactly_their_count_of_responses() {
        let two = frame_of(&[
            GpuMessage::ClientResponse(b"ab"),
            GpuMessage::ClientResponse(b""),
        ]);
        assert!(responses_valid(&two, 2, 256));
        assert!(!responses_valid(&two, 1, 256));
        assert!(!responses_valid(&two, 3, 256));
        let mixed = frame_of(&[
            GpuMessage::ClientResponse(b"ab"),
            GpuMessage::ClientRequest(b"c"),
        ]);
        assert!(!responses_valid(&mixed, 2, 256));
        assert!(!responses_valid(&two[..two.len() - 1], 2, 256));
    }

    #[test]
    fn the_in_flight_table_counts_messages_and_keeps_order() {
        let mut table = InFlight::new(2);
        table.push((1, 0, 5, 60));
        table.push((2, 7, 1, 12));
        assert!(table.is_full());
        assert_eq!(table.messages, 6);
        assert_eq!(table.pop(), Some((1, 0, 5, 60)));
        table.push((3, 1, 2, 24));
        assert_eq!(table.pop(), Some((2, 7, 1, 12)));
        assert_eq!(table.pop(), Some((3, 1, 2, 24)));
        assert_eq!(table.pop(), None);
        assert_eq!(table.messages, 0);
    }

    #[test]
    fn buffers_grow_by_doubling_up_to_their_cap_and_fail_without_aborting() {
        let mut buf = zeroed(16).unwrap();
        assert!(grow(&mut buf, 10, 100));
        assert_eq!(buf.len(), 16);
        assert!(grow(&mut buf, 17, 100));
        assert_eq!(buf.len(), 32);
        assert!(grow(&mut buf, 90, 100));
        assert_eq!(buf.len(), 90);
        assert!(grow(&mut buf, 100, 100));
        assert_eq!(buf.len(), 100);
        assert!(!grow(&mut buf, 101, 100));
        assert_eq!(buf.len(), 100);
        // More than any machine has: refused, not an abort.
        assert!(!grow(&mut buf, usize::MAX / 2, usize::MAX));
        assert_eq!(
            zeroed(isize::MAX as usize).unwrap_err().kind(),
            io::ErrorKind::OutOfMemory
        );
    }
}
