//! The socket rendezvous: an allgather among the ranks of a domain over a Unix or TCP socket,
//! with rank 0 in the middle.
//!
//! Rank 0 listens at the address every rank is given; the others connect to it (trying again
//! until it listens) and introduce themselves. In each allgather, every other rank sends its
//! block to rank 0, which sends everyone's blocks back to each rank once it has them all. The
//! byte format is [`urom_wire::oob`].
//!
//! Failures name the rank: a rank whose connection closes while rank 0 waits for its block
//! fails the allgather on rank 0, which tells every other rank which one it was before it
//! gives up; rank 0 going away fails the others' allgathers as rank 0's failure. Nothing
//! waits forever on a rank that died. A rank that is alive but never takes part is not a
//! failure: the caller decides how long to wait.
//!
//! Over a Unix socket, ranks run as one user: rank 0 takes joins only from processes of its own
//! user (or root), and a joining rank talks only to a rank 0 of its own user (or root), so
//! another user of the machine can neither join nor pose as rank 0 at a shared path such as
//! `/tmp`. Over TCP the rendezvous does not authenticate ranks: listen on a network only the
//! job's hosts reach.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::{Duration, Instant};

use super::{OobCollective, OobError, OobRequest};
use urom_wire::oob::{OOB_HEADER_LEN, OobKind, OobRepr, oob_message_len};

/// The longest rendezvous message taken from a peer.
const MAX_MESSAGE: usize = 1 << 30;
/// How long to wait between two tries while rank 0 does not listen yet, or a write is stuck.
const RETRY: Duration = Duration::from_millis(5);

/// Where rank 0 listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RendezvousAddr {
    /// A Unix socket; rank 0 replaces a stale socket there and removes it when done.
    Unix(PathBuf),
    /// A TCP address, `HOST:PORT`.
    Tcp(String),
}

impl FromStr for RendezvousAddr {
    type Err = OobError;

    /// `unix:PATH` or an absolute path: a Unix socket; `tcp:HOST:PORT` or `HOST:PORT`: TCP.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if let Some(path) = text.strip_prefix("unix:") {
            return Ok(Self::Unix(PathBuf::from(path)));
        }
        if text.starts_with('/') {
            return Ok(Self::Unix(PathBuf::from(text)));
        }
        let address = text.strip_prefix("tcp:").unwrap_or(text);
        if address
            .rsplit_once(':')
            .is_none_or(|(host, port)| host.is_empty() || port.parse::<u16>().is_err())
        {
            return Err(OobError::new(format!(
                "rendezvous address `{text}` is neither unix:PATH nor HOST:PORT"
            )));
        }
        Ok(Self::Tcp(address.to_owned()))
    }
}

impl fmt::Display for RendezvousAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unix(path) => write!(f, "unix:{}", path.display()),
            Self::Tcp(address) => write!(f, "tcp:{address}"),
        }
    }
}

/// A connection to a peer.
enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        match self {
            Self::Unix(s) => s.set_nonblocking(nonblocking),
            Self::Tcp(s) => s.set_nonblocking(nonblocking),
        }
    }

    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Self::Unix(s) => s.set_read_timeout(timeout),
            Self::Tcp(s) => s.set_read_timeout(timeout),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Self::Unix(s) => s.read(buf),
            Self::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            // Without SIGPIPE when the peer is gone (a host process must not die of it).
            Self::Unix(s) => {
                use std::os::fd::AsRawFd;
                nix::sys::socket::send(s.as_raw_fd(), buf, nix::sys::socket::MsgFlags::MSG_NOSIGNAL)
                    .map_err(io::Error::from)
            }
            // The standard library sends with MSG_NOSIGNAL already.
            Self::Tcp(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A peer: rank 0 for the others, each other rank for rank 0.
struct Link {
    rank: u32,
    stream: Stream,
    /// Bytes received and not yet a whole message.
    inbox: Vec<u8>,
    /// Bytes to send; `sent` of them are gone.
    outbox: Vec<u8>,
    sent: usize,
    /// Why the connection ended, once it has.
    closed: Option<String>,
}

/// A message taken off a link.
struct Received {
    kind: OobKind,
    rank: u32,
    ranks: u32,
    seq: u64,
    data: Vec<u8>,
}

impl Link {
    fn new(rank: u32, stream: Stream) -> Self {
        Self {
            rank,
            stream,
            inbox: Vec::new(),
            outbox: Vec::new(),
            sent: 0,
            closed: None,
        }
    }

    fn queue(&mut self, message: &OobRepr<'_>) {
        let start = self.outbox.len();
        self.outbox.resize(start + message.buffer_len(), 0);
        message
            .emit(&mut self.outbox[start..])
            .expect("sized by buffer_len");
    }

    /// Writes what the socket takes now; whether everything queued is gone.
    fn flush(&mut self) -> bool {
        while self.closed.is_none() && self.sent < self.outbox.len() {
            match self.stream.write(&self.outbox[self.sent..]) {
                Ok(0) => self.closed = Some("the connection closed".into()),
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => self.closed = Some(e.to_string()),
            }
        }
        self.outbox.clear();
        self.sent = 0;
        true
    }

    /// Reads what has arrived; returns the whole messages, or why the bytes are not ours.
    fn receive(&mut self) -> Result<Vec<Received>, String> {
        let mut chunk = [0u8; 64 * 1024];
        while self.closed.is_none() {
            match self.stream.read(&mut chunk) {
                Ok(0) => self.closed = Some("the connection closed".into()),
                Ok(n) => self.inbox.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => self.closed = Some(e.to_string()),
            }
        }
        let mut messages = Vec::new();
        loop {
            let len = match oob_message_len(&self.inbox, MAX_MESSAGE) {
                Ok(Some(len)) if len <= self.inbox.len() => len,
                Ok(_) => break,
                Err(e) => return Err(format!("sent bytes that are not a rendezvous message: {e}")),
            };
            let message = OobRepr::parse(&self.inbox[..len], MAX_MESSAGE)
                .map_err(|e| format!("sent a malformed rendezvous message: {e}"))?;
            messages.push(Received {
                kind: message.kind,
                rank: message.rank,
                ranks: message.ranks,
                seq: message.seq,
                data: message.data.to_vec(),
            });
            self.inbox.drain(..len);
        }
        Ok(messages)
    }
}

/// The socket rendezvous: an [`OobCollective`] over a Unix or TCP socket, rank 0 in the
/// middle. See the module documentation.
pub struct SocketOob {
    rank: u32,
    size: u32,
    address: RendezvousAddr,
    /// How long rank 0 waits for the others to take what it sends them.
    timeout: Duration,
    next_seq: u64,
    /// Rank 0: one per other rank, at `rank - 1`. The others: rank 0 alone.
    links: Vec<Link>,
    /// Rank 0: the blocks of each allgather not yet complete, by rank.
    blocks: HashMap<u64, Vec<Option<Vec<u8>>>>,
    /// The others: what rank 0 sent back for each allgather.
    gathered: HashMap<u64, Vec<u8>>,
    /// Once it failed, every later operation fails the same way.
    failure: Option<OobError>,
    /// Rank 0's Unix socket, removed when it is dropped.
    socket_path: Option<PathBuf>,
}

impl fmt::Debug for SocketOob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SocketOob")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("address", &self.address)
            .field("failure", &self.failure)
            .finish()
    }
}

impl SocketOob {
    /// Joins the rendezvous of `size` ranks at `address` as rank `rank`. Rank 0 listens there
    /// and returns once every other rank has joined; the others return once connected and
    /// introduced. Fails when that has not happened within `timeout`, naming a rank that did
    /// not join.
    pub fn join(
        address: &RendezvousAddr,
        size: u32,
        rank: u32,
        timeout: Duration,
    ) -> Result<Self, OobError> {
        if rank >= size {
            return Err(OobError::new(format!(
                "rank {rank} is not one of the {size} ranks of the rendezvous"
            )));
        }
        let mut oob = Self {
            rank,
            size,
            address: address.clone(),
            timeout,
            next_seq: 0,
            links: Vec::new(),
            blocks: HashMap::new(),
            gathered: HashMap::new(),
            failure: None,
            socket_path: None,
        };
        let deadline = Instant::now() + timeout;
        if rank == 0 {
            oob.accept_all(deadline)?;
        } else {
            oob.connect(deadline)?;
        }
        Ok(oob)
    }

    /// Rank 0: listens and takes every other rank's join.
    fn accept_all(&mut self, deadline: Instant) -> Result<(), OobError> {
        if self.size == 1 {
            return Ok(());
        }
        let cannot =
            |e: io::Error| OobError::of_rank(0, format!("cannot listen at {}: {e}", self.address));
        enum Listener {
            Unix(UnixListener),
            Tcp(TcpListener),
        }
        let listener = match &self.address {
            RendezvousAddr::Unix(path) => {
                if let Ok(meta) = std::fs::symlink_metadata(path) {
                    if !meta.file_type().is_socket() {
                        return Err(cannot(io::Error::new(
                            io::ErrorKind::AlreadyExists,
                            "a file that is not a socket is there",
                        )));
                    }
                    // A stale socket of an earlier run.
                    std::fs::remove_file(path).map_err(cannot)?;
                }
                let listener = UnixListener::bind(path).map_err(cannot)?;
                self.socket_path = Some(path.clone());
                Listener::Unix(listener)
            }
            RendezvousAddr::Tcp(address) => {
                Listener::Tcp(TcpListener::bind(address).map_err(cannot)?)
            }
        };
        match &listener {
            Listener::Unix(l) => l.set_nonblocking(true),
            Listener::Tcp(l) => l.set_nonblocking(true),
        }
        .map_err(cannot)?;
        let mut joined: Vec<Option<Link>> = (1..self.size).map(|_| None).collect();
        while joined.iter().any(Option::is_none) {
            let accepted = match &listener {
                Listener::Unix(l) => l.accept().map(|(s, _)| Stream::Unix(s)),
                Listener::Tcp(l) => l.accept().map(|(s, _)| {
                    let _ = s.set_nodelay(true);
                    Stream::Tcp(s)
                }),
            };
            match accepted {
                Ok(Stream::Unix(stream)) if same_user(&stream).is_err() => {
                    // Another user's connection is dropped like one that does not introduce
                    // itself: the rank it claims may still join.
                }
                Ok(stream) => {
                    // A connection that does not introduce itself properly is dropped.
                    if let Some(link) = self.introduction(stream, deadline)
                        && let Some(place) = joined.get_mut(link.rank as usize - 1)
                        && place.is_none()
                    {
                        *place = Some(link);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        let missing = joined.iter().position(Option::is_none).unwrap_or(0) + 1;
                        return Err(OobError::of_rank(
                            missing as u32,
                            format!(
                                "did not join the rendezvous at {} within {:?}",
                                self.address, self.timeout
                            ),
                        ));
                    }
                    std::thread::sleep(RETRY);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(cannot(e)),
            }
        }
        self.links = joined.into_iter().flatten().collect();
        Ok(())
    }

    /// Reads a joining rank's introduction; the link, once the rank is one of ours.
    fn introduction(&self, mut stream: Stream, deadline: Instant) -> Option<Link> {
        let left = deadline.saturating_duration_since(Instant::now());
        stream.set_nonblocking(false).ok()?;
        stream
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .ok()?;
        let mut header = [0u8; OOB_HEADER_LEN];
        stream.read_exact(&mut header).ok()?;
        let join = OobRepr::parse(&header, OOB_HEADER_LEN).ok()?;
        let ours = join.kind == OobKind::Join
            && join.ranks == self.size
            && join.rank > 0
            && join.rank < self.size;
        stream.set_nonblocking(true).ok()?;
        ours.then(|| Link::new(join.rank, stream))
    }

    /// A rank other than 0: connects to rank 0 (trying again while it does not listen yet)
    /// and introduces itself.
    fn connect(&mut self, deadline: Instant) -> Result<(), OobError> {
        let stream = loop {
            let attempt = match &self.address {
                RendezvousAddr::Unix(path) => match UnixStream::connect(path) {
                    Ok(stream) => {
                        if let Err(why) = same_user(&stream) {
                            return Err(OobError::of_rank(
                                0,
                                format!("the rendezvous at {}: {why}", self.address),
                            ));
                        }
                        Ok(Stream::Unix(stream))
                    }
                    Err(e) => Err(e),
                },
                RendezvousAddr::Tcp(address) => connect_tcp(address).map(Stream::Tcp),
            };
            match attempt {
                Ok(stream) => break stream,
                Err(e) if Instant::now() >= deadline => {
                    return Err(OobError::of_rank(
                        0,
                        format!(
                            "no rendezvous at {} within {:?}: {e}",
                            self.address, self.timeout
                        ),
                    ));
                }
                Err(_) => std::thread::sleep(RETRY),
            }
        };
        let mut link = Link::new(0, stream);
        link.queue(&OobRepr {
            kind: OobKind::Join,
            rank: self.rank,
            ranks: self.size,
            seq: 0,
            data: &[],
        });
        link.stream
            .set_nonblocking(true)
            .map_err(|e| OobError::of_rank(0, format!("the rendezvous connection: {e}")))?;
        self.links.push(link);
        self.flush_all(deadline);
        if let Some(why) = &self.links[0].closed {
            return Err(OobError::of_rank(
                0,
                format!(
                    "the rendezvous at {} refused this rank: {why}",
                    self.address
                ),
            ));
        }
        Ok(())
    }

    /// This rank's failure from now on; rank 0 tells the others who failed first.
    fn fail(&mut self, error: OobError) -> OobError {
        if self.rank == 0 {
            let reason = error.reason.clone();
            for link in &mut self.links {
                link.queue(&OobRepr {
                    kind: OobKind::Abort,
                    rank: error.rank.unwrap_or(0),
                    ranks: self.size,
                    seq: 0,
                    data: reason.as_bytes(),
                });
            }
            self.flush_all(Instant::now() + self.timeout.min(Duration::from_secs(1)));
        }
        self.failure = Some(error.clone());
        error
    }

    /// Writes what every link has queued, waiting until `deadline` at most; a link that
    /// fails meanwhile is closed.
    fn flush_all(&mut self, deadline: Instant) {
        loop {
            let mut done = true;
            for link in &mut self.links {
                done &= link.flush();
            }
            if done || Instant::now() >= deadline {
                return;
            }
            // Peers read while they wait for their allgather; take theirs meanwhile so that
            // neither side's buffers fill.
            for link in &mut self.links {
                if let Ok(messages) = link.receive() {
                    for message in messages {
                        stash(
                            &mut self.blocks,
                            &mut self.gathered,
                            self.size,
                            link.rank,
                            message,
                        );
                    }
                }
            }
            std::thread::sleep(RETRY);
        }
    }

    /// Sends and receives what can be now; the first peer that broke the protocol.
    fn pump(&mut self) -> Result<(), OobError> {
        for link in &mut self.links {
            link.flush();
            let messages = link
                .receive()
                .map_err(|why| OobError::of_rank(link.rank, why))?;
            for message in messages {
                if let Some(error) = check(self.rank, self.size, link.rank, &message) {
                    return Err(error);
                }
                if message.kind == OobKind::Abort {
                    let reason = String::from_utf8_lossy(&message.data).into_owned();
                    return Err(OobError::of_rank(message.rank, reason));
                }
                if !stash(
                    &mut self.blocks,
                    &mut self.gathered,
                    self.size,
                    link.rank,
                    message,
                ) {
                    return Err(OobError::of_rank(
                        link.rank,
                        "sent its block for one allgather twice",
                    ));
                }
            }
        }
        Ok(())
    }

    /// Rank 0's side of a test: complete once every block is in.
    fn test_root(&mut self, request: &mut OobRequest) -> Result<bool, OobError> {
        let seq = request.id();
        let size = self.size as usize;
        let blocks = self.blocks.entry(seq).or_insert_with(|| vec![None; size]);
        for (rank, block) in blocks.iter().enumerate().skip(1) {
            if let Some(block) = block
                && block.len() != request.len()
            {
                let reason = format!(
                    "sent a block of {} bytes to an allgather of {}-byte blocks",
                    block.len(),
                    request.len()
                );
                return Err(self.fail(OobError::of_rank(rank as u32, reason)));
            }
        }
        if blocks.iter().any(Option::is_none) {
            // A rank whose block is missing and whose connection is gone will never send it.
            let gone = blocks
                .iter()
                .zip(std::iter::once(None).chain(self.links.iter().map(Some)))
                .find_map(|(block, link)| match (block, link) {
                    (None, Some(link)) => link.closed.as_ref().map(|why| (link.rank, why.clone())),
                    _ => None,
                });
            if let Some((rank, why)) = gone {
                let reason = format!("left the rendezvous before its block arrived ({why})");
                return Err(self.fail(OobError::of_rank(rank, reason)));
            }
            return Ok(false);
        }
        let blocks = self.blocks.remove(&seq).unwrap_or_default();
        let all: Vec<u8> = blocks.into_iter().flatten().flatten().collect();
        request.recv_mut().copy_from_slice(&all);
        for link in &mut self.links {
            link.queue(&OobRepr {
                kind: OobKind::Gathered,
                rank: 0,
                ranks: self.size,
                seq,
                data: &all,
            });
        }
        // The others wait for this; make sure they get it even if nobody tests again here.
        self.flush_all(Instant::now() + self.timeout);
        Ok(true)
    }

    /// The side of a test of a rank other than 0: complete once rank 0 sent the blocks.
    fn test_leaf(&mut self, request: &mut OobRequest) -> Result<bool, OobError> {
        if let Some(all) = self.gathered.remove(&request.id()) {
            if all.len() != request.received().len() {
                let reason = format!(
                    "gathered {} bytes where {} ranks of {}-byte blocks make {}",
                    all.len(),
                    self.size,
                    request.len(),
                    request.received().len()
                );
                return Err(self.fail(OobError::of_rank(0, reason)));
            }
            request.recv_mut().copy_from_slice(&all);
            return Ok(true);
        }
        if let Some(why) = &self.links[0].closed {
            let reason = format!("left the rendezvous before the blocks arrived ({why})");
            return Err(self.fail(OobError::of_rank(0, reason)));
        }
        Ok(false)
    }
}

/// Why `message` from `from` is not one this rank accepts, if it is not.
fn check(rank: u32, size: u32, from: u32, message: &Received) -> Option<OobError> {
    let expected = if rank == 0 {
        OobKind::Block
    } else if message.kind == OobKind::Abort {
        OobKind::Abort
    } else {
        OobKind::Gathered
    };
    if message.kind != expected || message.ranks != size {
        return Some(OobError::of_rank(
            from,
            format!(
                "sent a {:?} message for {} ranks where a {expected:?} message for {size} was due",
                message.kind, message.ranks
            ),
        ));
    }
    if rank == 0 && message.rank != from {
        return Some(OobError::of_rank(
            from,
            format!("sent a block as rank {}", message.rank),
        ));
    }
    None
}

/// Keeps a block (rank 0) or a gathered result (the others) for its allgather; `false` when
/// that block was there already.
fn stash(
    blocks: &mut HashMap<u64, Vec<Option<Vec<u8>>>>,
    gathered: &mut HashMap<u64, Vec<u8>>,
    size: u32,
    from: u32,
    message: Received,
) -> bool {
    match message.kind {
        OobKind::Block => {
            let slots = blocks
                .entry(message.seq)
                .or_insert_with(|| vec![None; size as usize]);
            match slots.get_mut(from as usize) {
                Some(slot @ None) => {
                    *slot = Some(message.data);
                    true
                }
                _ => false,
            }
        }
        OobKind::Gathered => {
            gathered.insert(message.seq, message.data);
            true
        }
        OobKind::Join | OobKind::Abort => true,
    }
}

/// Whether the process at the other end of `stream` runs as this process's user (or as root):
/// the ranks of one job do.
fn same_user(stream: &UnixStream) -> Result<(), String> {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    let peer = getsockopt(stream, PeerCredentials)
        .map_err(|e| format!("cannot read the peer's user: {e}"))?
        .uid();
    let own = nix::unistd::geteuid().as_raw();
    if peer == own || peer == 0 {
        Ok(())
    } else {
        Err(format!(
            "the process there runs as user {peer}, not as this rank's user {own}"
        ))
    }
}

fn connect_tcp(address: &str) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "the name resolves to no address");
    for resolved in address.to_socket_addrs()? {
        match TcpStream::connect(resolved) {
            Ok(stream) => {
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

impl OobCollective for SocketOob {
    fn size(&self) -> u32 {
        self.size
    }

    fn rank(&self) -> u32 {
        self.rank
    }

    fn allgather(&mut self, send: &[u8]) -> Result<OobRequest, OobError> {
        if let Some(failure) = &self.failure {
            return Err(failure.clone());
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        if self.rank == 0 {
            let size = self.size as usize;
            let slots = self.blocks.entry(seq).or_insert_with(|| vec![None; size]);
            slots[0] = Some(send.to_vec());
        } else {
            let message = OobRepr {
                kind: OobKind::Block,
                rank: self.rank,
                ranks: self.size,
                seq,
                data: send,
            };
            self.links[0].queue(&message);
            self.links[0].flush();
        }
        Ok(OobRequest::new(seq, send.len(), self.size))
    }

    fn test(&mut self, request: &mut OobRequest) -> Result<bool, OobError> {
        if self.failure.is_none()
            && let Err(error) = self.pump()
        {
            self.fail(error);
        }
        // Blocks that arrived before a failure still complete their allgather: rank 0 may
        // report a rank that left in the next one while this rank has yet to test this one.
        if self.rank != 0 && self.gathered.contains_key(&request.id()) {
            return self.test_leaf(request);
        }
        if let Some(failure) = &self.failure {
            return Err(failure.clone());
        }
        if self.rank == 0 {
            self.test_root(request)
        } else {
            self.test_leaf(request)
        }
    }

    fn free(&mut self, request: OobRequest) {
        self.blocks.remove(&request.id());
        self.gathered.remove(&request.id());
    }
}

impl Drop for SocketOob {
    fn drop(&mut self) {
        if let Some(path) = &self.socket_path {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn address(name: &str) -> RendezvousAddr {
        let dir = std::env::temp_dir().join(format!("urom-oob-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        RendezvousAddr::Unix(dir.join("rendezvous.sock"))
    }

    /// Runs `ranks` ranks, each on a thread, each doing `body` with its collective.
    fn run<T: Send + 'static>(
        address: &RendezvousAddr,
        ranks: u32,
        body: impl Fn(SocketOob) -> T + Send + Sync + Clone + 'static,
    ) -> Vec<T> {
        let threads: Vec<_> = (0..ranks)
            .map(|rank| {
                let address = address.clone();
                let body = body.clone();
                std::thread::spawn(move || {
                    let oob = SocketOob::join(&address, ranks, rank, Duration::from_secs(30))
                        .unwrap_or_else(|e| panic!("rank {rank} did not join: {e}"));
                    body(oob)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    }

    fn gather(oob: &mut SocketOob, block: &[u8]) -> Result<Vec<u8>, OobError> {
        let mut request = oob.allgather(block)?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match oob.test(&mut request) {
                Ok(true) => break,
                Ok(false) => {
                    assert!(Instant::now() < deadline, "the allgather never completed");
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => {
                    oob.free(request);
                    return Err(e);
                }
            }
        }
        let all = request.received().to_vec();
        oob.free(request);
        Ok(all)
    }

    #[test]
    fn addresses_parse() {
        assert_eq!(
            "unix:/tmp/x".parse::<RendezvousAddr>(),
            Ok(RendezvousAddr::Unix("/tmp/x".into()))
        );
        assert_eq!(
            "/tmp/x".parse::<RendezvousAddr>(),
            Ok(RendezvousAddr::Unix("/tmp/x".into()))
        );
        assert_eq!(
            "tcp:127.0.0.1:7000".parse::<RendezvousAddr>(),
            Ok(RendezvousAddr::Tcp("127.0.0.1:7000".into()))
        );
        assert_eq!(
            "node-1:7000".parse::<RendezvousAddr>(),
            Ok(RendezvousAddr::Tcp("node-1:7000".into()))
        );
        assert!("node-1".parse::<RendezvousAddr>().is_err());
        assert!("node-1:http".parse::<RendezvousAddr>().is_err());
        assert_eq!(RendezvousAddr::Tcp("h:1".into()).to_string(), "tcp:h:1");
    }

    #[test]
    fn four_ranks_gather_several_rounds_in_rank_order() {
        let results = run(&address("four"), 4, |mut oob| {
            let rank = oob.rank();
            let first = gather(&mut oob, &[rank as u8; 3]).unwrap();
            // Large blocks, more than a socket buffer holds.
            let big = vec![rank as u8 + 1; 300_000];
            let second = gather(&mut oob, &big).unwrap();
            (first, second)
        });
        for (first, second) in results {
            assert_eq!(first, [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]);
            assert_eq!(second.len(), 1_200_000);
            for rank in 0..4 {
                assert!(
                    second[rank * 300_000..(rank + 1) * 300_000]
                        .iter()
                        .all(|&b| b == rank as u8 + 1)
                );
            }
        }
    }

    #[test]
    fn one_rank_gathers_alone_and_tcp_works() {
        let mut oob = SocketOob::join(
            &RendezvousAddr::Tcp("127.0.0.1:1".into()),
            1,
            0,
            Duration::from_secs(1),
        )
        .unwrap();
        assert_eq!(gather(&mut oob, b"alone").unwrap(), b"alone");

        // Find a free port, then rendezvous there over TCP.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let results = run(
            &RendezvousAddr::Tcp(format!("127.0.0.1:{port}")),
            2,
            |mut oob| {
                let block = [oob.rank() as u8 + 7];
                gather(&mut oob, &block).unwrap()
            },
        );
        assert_eq!(results, [vec![7, 8], vec![7, 8]]);
    }

    #[test]
    fn a_rank_that_leaves_is_named_on_every_rank_and_nothing_waits() {
        let results = run(&address("leave"), 3, |mut oob| {
            gather(&mut oob, &[1]).unwrap();
            if oob.rank() == 2 {
                // Rank 2 goes away in the second allgather, before its block.
                drop(oob);
                return None;
            }
            Some(gather(&mut oob, &[2]).unwrap_err())
        });
        for (rank, result) in results.into_iter().enumerate().take(2) {
            let error = result.unwrap();
            assert_eq!(error.rank, Some(2), "rank {rank}: {error}");
        }
    }

    #[test]
    fn rank_0_leaving_fails_the_others() {
        let results = run(&address("root"), 3, |mut oob| {
            gather(&mut oob, &[1]).unwrap();
            if oob.rank() == 0 {
                drop(oob);
                return None;
            }
            Some(gather(&mut oob, &[2]).unwrap_err())
        });
        for result in results.into_iter().skip(1) {
            let error = result.unwrap();
            assert_eq!(error.rank, Some(0), "{error}");
            assert!(error.reason.contains("left the rendezvous"), "{error}");
        }
    }

    #[test]
    fn blocks_of_different_lengths_fail_naming_the_odd_rank() {
        let results = run(&address("lengths"), 3, |mut oob| {
            let block = if oob.rank() == 1 {
                vec![0; 5]
            } else {
                vec![0; 4]
            };
            gather(&mut oob, &block).map(|_| ())
        });
        for result in results {
            let error = result.unwrap_err();
            assert_eq!(error.rank, Some(1), "{error}");
        }
    }

    #[test]
    fn a_rank_that_never_joins_is_named_by_rank_0() {
        let error =
            SocketOob::join(&address("late"), 2, 0, Duration::from_millis(100)).unwrap_err();
        assert_eq!(error.rank, Some(1));
        assert!(error.reason.contains("did not join"), "{error}");
        let error =
            SocketOob::join(&address("nobody"), 2, 1, Duration::from_millis(50)).unwrap_err();
        assert_eq!(error.rank, Some(0));
        assert!(
            error
                .to_string()
                .starts_with("rank 0: no rendezvous at unix:"),
            "{error}"
        );
    }
}
