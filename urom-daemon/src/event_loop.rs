//! The daemon's one event loop: every host connection (local and from other machines), the
//! listening sockets and the stop signals are served by one thread sleeping in `epoll` (`mio`),
//! so the daemon's threads do not grow with connections: an idle connection costs its socket
//! and a few hundred bytes, never a thread.
//!
//! What may block (discovering plugins, spawning or stopping a worker, asking workers for the
//! status report) runs on a small fixed pool of threads ([`POOL_THREADS`]); the connection
//! reads nothing more until its job is done, so a host's requests are answered in order and
//! each host has at most one job at a time. A spawn's job only starts the worker, and a
//! destroy's only signals it: one thread of the registry awaits every starting worker's socket
//! and every stopping worker's end and completes the job, so that workers that never start or
//! are slow to stop hold no pool thread.
//!
//! Each connection holds at most one frame of what it is sending, and a write queue of at most
//! [`WRITE_QUEUE_FRAMES`] frames of what it is sent. It is not read while more than a frame of
//! replies waits to be sent, so a host that never reads its replies stops itself; it is dropped
//! when its queue overflows (worker exit events keep coming) or nothing of it could be written
//! for [`WRITE_TIMEOUT`]. A host that stops halfway through a frame is given
//! [`FRAME_DEADLINE`], one that has not authenticated [`HELLO_TIMEOUT`], each on a timer.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use mio::{Events, Interest, Poll, Token, Waker};
use tracing::{error, warn};
use urom_transport::auth::{SessionKeys, Side};
use urom_transport::record::{Opener, Sealer};
use urom_wire::control::{ControlMessage, WorkerExit};
use urom_wire::frame::frame_length;
use urom_wire::{FRAME_HEADER_LEN, FrameRepr, MaxMsgSize};

use crate::Service;
use crate::discovery::PluginEntry;
use crate::gate::HELLO_TIMEOUT;
use crate::registry::{HostEvents, HostId, Reachable, ServiceError};
use crate::session::{self, End, FRAME_DEADLINE, Session, State, Step};
use crate::status::StatusPager;

/// Threads that run what may block.
pub(crate) const POOL_THREADS: usize = 4;
/// How long a host's write queue may wait without a byte taken before the host is given up on.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// The most frames (of the maximum message size) a host's write queue holds.
const WRITE_QUEUE_FRAMES: usize = 64;
/// How long what a refused host still sends is read and dropped before its connection closes.
const LINGER: Duration = Duration::from_secs(2);
/// How many bytes a refused host may still send to be read and dropped, at least (a frame of
/// the maximum message size, if that is more).
const LINGER_BYTES: usize = 64 * 1024;
/// How long accepting waits after it failed (out of open files) before it tries again.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);
/// Buffers kept by an idle connection at most; larger ones are given back.
const KEEP_BUFFER: usize = 4096;
/// Frames one connection may have handled before the others get their turn.
const FRAMES_PER_TURN: usize = 64;

const LISTENER: Token = Token(usize::MAX - 1);
const FRONT_DOOR: Token = Token(usize::MAX - 2);
const WAKER: Token = Token(usize::MAX - 3);
const STOP: Token = Token(usize::MAX - 4);

/// A job for the pool; what it returns goes back to its connection's session. A job that
/// returns nothing for a connection that awaits it has handed the answer on, to be sent with
/// [`LoopWake::done`].
pub(crate) type Job = Box<dyn FnOnce() -> Option<Done> + Send>;

/// What a job found, for the session that asked.
pub(crate) enum Done {
    /// The plugins offered to a host that authenticated.
    Authenticated(Arc<Vec<PluginEntry>>),
    /// A spawn or attach.
    Spawned {
        seq: u64,
        result: Result<Reachable, ServiceError>,
    },
    /// A destroy.
    Destroyed {
        seq: u64,
        result: Result<(), ServiceError>,
    },
    /// A page of the status report, as a whole frame.
    Status {
        seq: u64,
        pager: StatusPager,
        frame: Result<Vec<u8>, ServiceError>,
    },
}

/// What reaches the loop from other threads.
enum Wake {
    Done(HostId, Done),
    Exited(HostId, WorkerExit),
}

/// How other threads reach the loop.
pub(crate) struct LoopWake {
    tx: Mutex<mpsc::Sender<Wake>>,
    waker: Waker,
}

impl LoopWake {
    /// Hands `done` to host `host`'s session, as a job of the pool would.
    pub(crate) fn done(&self, host: HostId, done: Done) {
        self.send(Wake::Done(host, done));
    }

    fn send(&self, wake: Wake) {
        let sent = self
            .tx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(wake)
            .is_ok();
        if sent && let Err(e) = self.waker.wake() {
            error!("cannot wake the event loop: {e}");
        }
    }
}

/// Where the registry tells a host that a worker it is attached to has ended.
pub(crate) struct HostLink {
    host: HostId,
    wake: Arc<LoopWake>,
}

impl HostLink {
    pub(crate) fn new(host: HostId, wake: &Arc<LoopWake>) -> Self {
        Self {
            host,
            wake: Arc::clone(wake),
        }
    }
}

impl HostEvents for HostLink {
    fn worker_exited(&self, exit: WorkerExit) {
        self.wake.send(Wake::Exited(self.host, exit));
    }
}

/// The fixed pool that runs jobs.
struct Pool {
    jobs: mpsc::Sender<(HostId, Job)>,
}

impl Pool {
    fn new(wake: &Arc<LoopWake>) -> io::Result<Self> {
        let (jobs, queue) = mpsc::channel::<(HostId, Job)>();
        let queue = Arc::new(Mutex::new(queue));
        for n in 0..POOL_THREADS {
            let queue = Arc::clone(&queue);
            let wake = Arc::clone(wake);
            std::thread::Builder::new()
                .name(format!("urom-pool-{n}"))
                .spawn(move || {
                    loop {
                        let next = queue.lock().unwrap_or_else(|p| p.into_inner()).recv();
                        let Ok((host, job)) = next else { return };
                        if let Some(done) = job() {
                            wake.send(Wake::Done(host, done));
                        }
                    }
                })?;
        }
        Ok(Self { jobs })
    }

    fn submit(&self, host: HostId, job: Job) {
        if self.jobs.send((host, job)).is_err() {
            error!(host, "the pool is gone: a job was dropped");
        }
    }
}

/// A connection's socket.
enum Sock {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Sock {
    fn source(&mut self) -> &mut dyn mio::event::Source {
        match self {
            Self::Unix(s) => s,
            Self::Tcp(s) => s,
        }
    }

    fn shutdown(&self, how: Shutdown) {
        let _ = match self {
            Self::Unix(s) => s.shutdown(how),
            Self::Tcp(s) => s.shutdown(how),
        };
    }
}

impl Read for &Sock {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match *self {
            Sock::Unix(s) => (&*s).read(buf),
            Sock::Tcp(s) => (&*s).read(buf),
        }
    }
}

impl Write for &Sock {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match *self {
            Sock::Unix(s) => (&*s).write(buf),
            Sock::Tcp(s) => (&*s).write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A connection's socket with its write queue, and its records' keys once sealed.
pub(crate) struct Io {
    sock: Sock,
    max: MaxMsgSize,
    opener: Option<Box<Opener>>,
    sealer: Option<Box<Sealer>>,
    out: Vec<u8>,
    sent: usize,
    /// Since when what waits in `out` has not moved.
    stalled_since: Option<Instant>,
}

impl Io {
    fn new(sock: Sock, max: MaxMsgSize) -> Self {
        Self {
            sock,
            max,
            opener: None,
            sealer: None,
            out: Vec::new(),
            sent: 0,
            stalled_since: None,
        }
    }

    /// Queues `body` as a frame with sequence number `seq`.
    pub(crate) fn send(&mut self, seq: u64, body: ControlMessage<'_>) -> io::Result<()> {
        let frame = FrameRepr { seq, body };
        let start = self.out.len();
        self.out.resize(start + frame.buffer_len(), 0);
        match frame.emit(&mut self.out[start..], self.max) {
            Ok(len) => self.out.truncate(start + len),
            Err(e) => {
                self.out.truncate(start);
                return Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string()));
            }
        }
        if self.sealer.is_some() {
            let frame = self.out.split_off(start);
            return self.send_encoded(&frame);
        }
        self.queued(start)
    }

    /// Queues a frame encoded already.
    pub(crate) fn send_encoded(&mut self, frame: &[u8]) -> io::Result<()> {
        let start = self.out.len();
        match &mut self.sealer {
            Some(sealer) => {
                let mut rest = frame;
                while !rest.is_empty() {
                    let (n, record) = sealer.seal(rest);
                    self.out.extend_from_slice(record);
                    rest = &rest[n..];
                }
            }
            None => self.out.extend_from_slice(frame),
        }
        self.queued(start)
    }

    /// Checks the bound on what waits, with bytes from `start` just queued.
    fn queued(&mut self, start: usize) -> io::Result<()> {
        if start == self.sent {
            self.stalled_since = Some(Instant::now());
        }
        if self.pending() > WRITE_QUEUE_FRAMES * self.max.get() {
            return Err(io::Error::other(format!(
                "the host does not read what it is sent: more than {WRITE_QUEUE_FRAMES} frames wait"
            )));
        }
        Ok(())
    }

    /// From now on, reads and writes records with an integrity check.
    pub(crate) fn seal(&mut self, keys: &SessionKeys, max: MaxMsgSize) {
        let (ours, theirs) = keys.record_keys(Side::Accepting);
        self.sealer = Some(Box::new(Sealer::new(ours, max.get())));
        self.opener = Some(Box::new(Opener::new(theirs, max.get())));
    }

    fn pending(&self) -> usize {
        self.out.len() - self.sent
    }

    /// Writes what waits, as far as the socket takes it.
    fn flush(&mut self) -> io::Result<()> {
        while self.sent < self.out.len() {
            match (&self.sock).write(&self.out[self.sent..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.sent += n;
                    self.stalled_since = Some(Instant::now());
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.sent = 0;
        self.out.clear();
        if self.out.capacity() > KEEP_BUFFER {
            self.out = Vec::new();
        }
        self.stalled_since = None;
        Ok(())
    }

    /// Reads what the host sent (through its records, once sealed).
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &mut self.opener {
            Some(opener) => opener.read(&mut &self.sock, buf),
            None => (&self.sock).read(buf),
        }
    }
}

/// A refused connection on its way out.
struct Closing {
    until: Instant,
    dropped: usize,
    shut: bool,
    why: String,
}

/// One connection.
struct Conn {
    io: Io,
    session: Session,
    /// The frame being read, `have` bytes of it so far.
    rx: Vec<u8>,
    have: usize,
    frame_started: Option<Instant>,
    /// Whether the socket may have more to read.
    readable: bool,
    /// Whether a job of its session runs.
    busy: bool,
    /// Whether the host closed its end.
    peer_closed: bool,
    closing: Option<Closing>,
    /// Ended while a job ran: finished when the job is done.
    ended: Option<End>,
    /// The earliest timer set for it.
    scheduled: Option<Instant>,
}

impl Conn {
    /// Does what can be done now: writes, reads and handles up to [`FRAMES_PER_TURN`] frames;
    /// returns a job to run, and whether the connection may have more to do at once.
    fn drive(&mut self) -> Result<(Option<Job>, bool), End> {
        self.io.flush().map_err(End::Io)?;
        if self.closing.is_some() {
            return self.linger().map(|()| (None, false));
        }
        let max = self.io.max;
        let mut turn = 0;
        while !self.busy && !self.peer_closed && self.io.pending() <= max.get() {
            if turn == FRAMES_PER_TURN {
                return Ok((None, true));
            }
            turn += 1;
            let Some(len) = self.read_frame(max)? else {
                break;
            };
            let step = self.session.dispatch(&mut self.io, &self.rx[..len]);
            self.have = 0;
            self.frame_started = None;
            let step = step?;
            self.io.flush().map_err(End::Io)?;
            if let Step::Job(job) = step {
                self.busy = true;
                return Ok((Some(job), false));
            }
        }
        if self.peer_closed && !self.busy && self.io.pending() == 0 {
            return Err(End::Closed);
        }
        Ok((None, false))
    }

    /// Reads toward one whole frame; its length once it is all in `rx`. Garbage is refused as
    /// soon as its header has arrived.
    fn read_frame(&mut self, max: MaxMsgSize) -> Result<Option<usize>, End> {
        loop {
            let need = match frame_length(&self.rx[..self.have], max) {
                Ok(Some(len)) => len,
                Ok(None) => FRAME_HEADER_LEN,
                Err(error) => {
                    let seq = session::header_seq(&self.rx[..self.have]);
                    let status = urom_wire::Status::InvalidValue;
                    return Err(self
                        .session
                        .refuse(&mut self.io, seq, status, &error.to_string()));
                }
            };
            if self.have == need {
                return Ok(Some(need));
            }
            if !self.readable {
                return Ok(None);
            }
            if self.rx.len() < need {
                self.rx.resize(need, 0);
            }
            match self.io.read(&mut self.rx[self.have..need]) {
                Ok(0) if self.have == 0 => {
                    self.peer_closed = true;
                    return Ok(None);
                }
                Ok(0) => {
                    return Err(End::Misbehaved(format!(
                        "closed halfway through a frame ({} of {need} bytes)",
                        self.have
                    )));
                }
                Ok(n) => {
                    self.have += n;
                    self.frame_started.get_or_insert_with(Instant::now);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.readable = false;
                    // Half a record is half a frame: it has as long to complete.
                    if self
                        .io
                        .opener
                        .as_ref()
                        .is_some_and(|opener| opener.holds_partial_record())
                    {
                        self.frame_started.get_or_insert_with(Instant::now);
                    }
                    if self.have == 0 && self.rx.capacity() > 0 {
                        // Idle: an idle connection keeps no buffer.
                        self.rx = Vec::new();
                    }
                    return Ok(None);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(End::Io(e)),
            }
        }
    }

    /// Ends the connection of a host that was refused, so that it reads the error reply and
    /// then the end of the stream: once the reply is written, no more writes, then what the
    /// host still sends (the rest of a refused frame, requests sent after it) is read and
    /// dropped until the host closes, for at most [`LINGER`] and [`LINGER_BYTES`]. Closing a
    /// socket with unread bytes would reset the connection instead, and the host could lose
    /// the reply.
    fn linger(&mut self) -> Result<(), End> {
        let limit = LINGER_BYTES.max(self.io.max.get());
        let Some(closing) = &mut self.closing else {
            return Ok(());
        };
        let done = || End::Misbehaved(String::new());
        if self.io.pending() > 0 {
            return Ok(());
        }
        if !closing.shut {
            self.io.sock.shutdown(Shutdown::Write);
            closing.shut = true;
        }
        let mut chunk = [0u8; 4096];
        while closing.dropped < limit {
            match (&self.io.sock).read(&mut chunk) {
                Ok(0) => return Err(done()),
                Ok(n) => closing.dropped += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Err(done()),
            }
        }
        Err(done())
    }

    /// When something is due next.
    fn deadline(&self) -> Option<Instant> {
        if let Some(closing) = &self.closing {
            return Some(closing.until);
        }
        let mut due = self.io.stalled_since.map(|t| t + WRITE_TIMEOUT);
        let mut at = |t: Instant| due = Some(due.map_or(t, |d| d.min(t)));
        if !self.busy && self.session.state != State::Ready {
            at(self.session.handshake_deadline);
        }
        if let Some(started) = self.frame_started {
            at(started + FRAME_DEADLINE);
        }
        due
    }

    /// Acts on what is due at `now`.
    fn on_time(&mut self, now: Instant) -> Result<(), End> {
        if let Some(closing) = &self.closing {
            return if now >= closing.until {
                Err(End::Misbehaved(String::new()))
            } else {
                Ok(())
            };
        }
        if self
            .io
            .stalled_since
            .is_some_and(|t| now >= t + WRITE_TIMEOUT)
        {
            return Err(End::Io(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the host took nothing of what it was sent for {WRITE_TIMEOUT:?}"),
            )));
        }
        if !self.busy
            && self.session.state != State::Ready
            && now >= self.session.handshake_deadline
        {
            let reason =
                format!("no hello and authentication within {HELLO_TIMEOUT:?} of connecting");
            let status = urom_wire::Status::TimeOut;
            return Err(self.session.refuse(&mut self.io, 0, status, &reason));
        }
        if self
            .frame_started
            .is_some_and(|t| now >= t + FRAME_DEADLINE)
        {
            let reason = format!("frame not completed within {FRAME_DEADLINE:?}");
            let status = urom_wire::Status::TimeOut;
            return Err(self.session.refuse(&mut self.io, 0, status, &reason));
        }
        Ok(())
    }
}

/// The event loop and what it serves.
pub(crate) struct EventLoop {
    poll: Poll,
    service: Arc<Service>,
    conns: HashMap<HostId, Box<Conn>>,
    timers: BinaryHeap<Reverse<(Instant, HostId)>>,
    next_host: HostId,
    wake: Arc<LoopWake>,
    wakes: mpsc::Receiver<Wake>,
    pool: Pool,
    listener: UnixListener,
    front_door: Option<TcpListener>,
    /// Kept open and registered: a byte on it stops the loop.
    _stop: UnixStream,
    /// When accepting failed, when to try again.
    retry_accept: Option<Instant>,
    /// Connections that used their turn with more to do.
    again: Vec<HostId>,
}

impl EventLoop {
    /// A loop serving hosts on `listener` and, for hosts on other machines, `front_door`, until
    /// a byte arrives on `stop`.
    pub(crate) fn new(
        service: &Arc<Service>,
        listener: std::os::unix::net::UnixListener,
        front_door: Option<std::net::TcpListener>,
        stop: std::os::unix::net::UnixStream,
    ) -> io::Result<Self> {
        let poll = Poll::new()?;
        let registry = poll.registry();
        listener.set_nonblocking(true)?;
        let mut listener = UnixListener::from_std(listener);
        registry.register(&mut listener, LISTENER, Interest::READABLE)?;
        let front_door = match front_door {
            Some(front_door) => {
                front_door.set_nonblocking(true)?;
                let mut front_door = TcpListener::from_std(front_door);
                registry.register(&mut front_door, FRONT_DOOR, Interest::READABLE)?;
                Some(front_door)
            }
            None => None,
        };
        stop.set_nonblocking(true)?;
        let mut stop = UnixStream::from_std(stop);
        registry.register(&mut stop, STOP, Interest::READABLE)?;
        let (tx, wakes) = mpsc::channel();
        let wake = Arc::new(LoopWake {
            tx: Mutex::new(tx),
            waker: Waker::new(registry, WAKER)?,
        });
        let pool = Pool::new(&wake)?;
        Ok(Self {
            poll,
            service: Arc::clone(service),
            conns: HashMap::new(),
            timers: BinaryHeap::new(),
            next_host: 1,
            wake,
            wakes,
            pool,
            listener,
            front_door,
            _stop: stop,
            retry_accept: None,
            again: Vec::new(),
        })
    }

    /// Serves until stopped; then closes every connection.
    pub(crate) fn run(mut self) {
        let mut events = Events::with_capacity(1024);
        loop {
            let now = Instant::now();
            let next = self
                .timers
                .peek()
                .map(|Reverse((t, _))| *t)
                .into_iter()
                .chain(self.retry_accept)
                .min();
            let timeout = if self.again.is_empty() {
                next.map(|t| t.saturating_duration_since(now))
            } else {
                Some(Duration::ZERO)
            };
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() != io::ErrorKind::Interrupted {
                    error!("the event loop cannot wait: {e}");
                    std::thread::sleep(ACCEPT_RETRY);
                }
                continue;
            }
            let mut stopping = false;
            for event in &events {
                match event.token() {
                    LISTENER => self.accept_local(),
                    FRONT_DOOR => self.accept_remote(),
                    WAKER => self.woken(),
                    STOP => stopping = true,
                    Token(id) => {
                        let host = id as HostId;
                        if let Some(conn) = self.conns.get_mut(&host) {
                            if event.is_readable() || event.is_read_closed() || event.is_error() {
                                conn.readable = true;
                            }
                            self.drive(host);
                        }
                    }
                }
            }
            if stopping {
                break;
            }
            for host in std::mem::take(&mut self.again) {
                self.drive(host);
            }
            let now = Instant::now();
            if self.retry_accept.is_some_and(|t| t <= now) {
                self.retry_accept = None;
                self.accept_local();
                self.accept_remote();
            }
            while let Some(&Reverse((t, host))) = self.timers.peek() {
                if t > now {
                    break;
                }
                self.timers.pop();
                let Some(conn) = self.conns.get_mut(&host) else {
                    continue;
                };
                if conn.scheduled == Some(t) {
                    conn.scheduled = None;
                }
                if conn.ended.is_some() {
                    continue;
                }
                match conn.on_time(now) {
                    Ok(()) => self.drive(host),
                    Err(end) => self.failed(host, end),
                }
            }
        }
        self.service
            .stopping
            .store(true, std::sync::atomic::Ordering::Relaxed);
        for (_, conn) in self.conns.drain() {
            if conn.ended.is_none() {
                conn.session.finish(&End::Shutdown);
            }
        }
    }

    fn accept_local(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    let host = self.next_host();
                    if let Some(session) =
                        crate::local::admit(&self.service, host, &stream, &self.wake)
                    {
                        self.add(host, Sock::Unix(stream), session);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.accept_failed(&"the control socket", &e);
                    return;
                }
            }
        }
    }

    fn accept_remote(&mut self) {
        loop {
            let Some(front_door) = &self.front_door else {
                return;
            };
            match front_door.accept() {
                Ok((stream, from)) => {
                    let host = self.next_host();
                    if let Some(session) =
                        crate::remote::admit(&self.service, host, &stream, from, &self.wake)
                    {
                        self.add(host, Sock::Tcp(stream), session);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.accept_failed(&"the front door", &e);
                    return;
                }
            }
        }
    }

    /// Accepting failed (out of open files, most likely): tried again a little later, as
    /// the listening socket says nothing new until another host connects.
    fn accept_failed(&mut self, which: &dyn std::fmt::Display, e: &io::Error) {
        self.service
            .gate
            .log_refusal(which, &format!("accept failed: {e}"));
        self.retry_accept = Some(Instant::now() + ACCEPT_RETRY);
    }

    fn next_host(&mut self) -> HostId {
        let host = self.next_host;
        self.next_host += 1;
        host
    }

    fn add(&mut self, host: HostId, mut sock: Sock, session: Session) {
        let token = Token(host as usize);
        let interest = Interest::READABLE | Interest::WRITABLE;
        if let Err(e) = self
            .poll
            .registry()
            .register(sock.source(), token, interest)
        {
            warn!(host, "cannot watch a host connection: {e}; closed");
            return;
        }
        let conn = Conn {
            io: Io::new(sock, self.service.max_msg_size),
            session,
            rx: Vec::new(),
            have: 0,
            frame_started: None,
            readable: true,
            busy: false,
            peer_closed: false,
            closing: None,
            ended: None,
            scheduled: None,
        };
        self.conns.insert(host, Box::new(conn));
        self.drive(host);
    }

    /// Drives connection `host`: what can be done now, then its timer.
    fn drive(&mut self, host: HostId) {
        let Some(conn) = self.conns.get_mut(&host) else {
            return;
        };
        if conn.ended.is_some() {
            return;
        }
        match conn.drive() {
            Ok((Some(job), _)) => self.pool.submit(host, job),
            Ok((None, more)) => {
                if more {
                    self.again.push(host);
                }
            }
            Err(end) => return self.failed(host, end),
        }
        let Some(conn) = self.conns.get_mut(&host) else {
            return;
        };
        if let Some(due) = conn.deadline()
            && conn.scheduled.is_none_or(|s| s > due)
        {
            conn.scheduled = Some(due);
            self.timers.push(Reverse((due, host)));
        }
    }

    /// Connection `host` cannot go on: a host that was refused gets its reply and a moment to
    /// read it first.
    fn failed(&mut self, host: HostId, end: End) {
        let Some(conn) = self.conns.get_mut(&host) else {
            return;
        };
        match end {
            End::Misbehaved(why) if conn.closing.is_none() => {
                conn.closing = Some(Closing {
                    until: Instant::now() + LINGER,
                    dropped: 0,
                    shut: false,
                    why,
                });
                self.drive(host);
            }
            end => self.ended(host, end),
        }
    }

    /// Connection `host` ended: its session is finished, now or, while a job of it runs, when
    /// the job is done (so that a host that leaves is forgotten after what it asked for).
    fn ended(&mut self, host: HostId, end: End) {
        let Some(conn) = self.conns.get_mut(&host) else {
            return;
        };
        // A refused host's reason was given when it was refused.
        let end = match (end, &conn.closing) {
            (End::Misbehaved(_), Some(closing)) => End::Misbehaved(closing.why.clone()),
            (end, _) => end,
        };
        let _ = self.poll.registry().deregister(conn.io.sock.source());
        conn.io.sock.shutdown(Shutdown::Both);
        if conn.busy {
            conn.ended = Some(end);
            return;
        }
        if let Some(conn) = self.conns.remove(&host)
            && let Some(job) = conn.session.finish(&end)
        {
            self.pool.submit(host, job);
        }
    }

    /// What other threads sent: jobs done, workers that ended.
    fn woken(&mut self) {
        while let Ok(wake) = self.wakes.try_recv() {
            match wake {
                Wake::Done(host, done) => {
                    let Some(conn) = self.conns.get_mut(&host) else {
                        continue;
                    };
                    conn.busy = false;
                    if let Some(end) = conn.ended.take() {
                        if let Some(conn) = self.conns.remove(&host)
                            && let Some(job) = conn.session.finish(&end)
                        {
                            self.pool.submit(host, job);
                        }
                        continue;
                    }
                    match conn.session.complete(&mut conn.io, done) {
                        Ok(()) => self.drive(host),
                        Err(end) => self.failed(host, end),
                    }
                }
                Wake::Exited(host, exit) => {
                    let Some(conn) = self.conns.get_mut(&host) else {
                        continue;
                    };
                    if conn.ended.is_some() || conn.closing.is_some() {
                        continue;
                    }
                    match conn.io.send(0, ControlMessage::WorkerExited(exit)) {
                        Ok(()) => self.drive(host),
                        Err(e) => self.ended(host, End::Io(e)),
                    }
                }
            }
        }
    }
}
