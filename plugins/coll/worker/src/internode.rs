//! The inter-node part of a team spanning several nodes: the node workers' messages to each
//! other, the exchange algorithms, and how a dead or silent peer worker is noticed.
//!
//! Each node's worker serves the team's ranks on its node (the memory pass over their buffers
//! is the engine's, as for a single-node team) and exchanges only node-level data with the
//! other nodes' workers, over UCX tagged messages ([`Net`]), endpoints made from the domain's
//! addresses of the nodes' workers (their domain ids come with the team). A collective runs
//! in *windows*: the engine folds (or reads) one window of the local ranks' data into the
//! team's preallocated accumulator, the [`Span`] runs the window's exchange rounds, and the
//! engine writes the window back to the local ranks. Every step is driven from the plugin's
//! progress and never waits: sends copy their bytes out at once, receives are polled.
//!
//! Algorithms (`n` nodes, `P` the largest power of two not above `n`):
//!
//! * reductions (allreduce, reduce) up to [`SMALL`] bytes: recursive doubling, whole vector in
//!   one window. Nodes `P..n` first hand their partial to node `i - P` and get the result back
//!   at the end. When two partials meet, the one of the lower nodes is the left operand, so
//!   every node computes the same expression: for two nodes `P0 op P1`, for four
//!   `(P0 op P1) op (P2 op P3)`;
//! * larger reductions: ring reduce-scatter then ring allgather, in windows of up to
//!   `n * CHUNK` bytes split into `n` segments (so each message is at most one chunk);
//!   segment `k` is folded along the ring starting at node `k`, the arriving partial on the
//!   left where it comes from a lower node, on the right where the ring wraps past the last
//!   node (for two nodes again exactly `P0 op P1`);
//! * broadcast: the root's node sends each window to every other node;
//! * barrier: dissemination, `ceil(log2 n)` rounds of empty messages;
//! * copy collectives ([`Exchange::Streams`]): one stream of blocks per ordered pair of nodes
//!   (the engine decides what each carries); in every window each node sends every other node
//!   up to one chunk of its stream to it and receives up to one chunk of each stream to it.
//!
//! Every collective also begins with a digest round ([`Span::start_digests`]): each node sends
//! every other node the digest of the collective's arguments it computed for that node, and
//! compares the one it gets with its own; results reach the ranks only once all matched.
//!
//! Message tags (64 bits): `[63:62]` kind (0 data, 1 ping, 2 pong, 3 abort), `[61:42]` the team
//! (a 20-bit hash of its key), `[41:34]` the collective's sequence number on the team, `[33:22]`
//! the block (for streams the sending node; `0xfff` for digests), `[21:8]` the window, `[7:0]`
//! the round. In every round a node expects exactly one message per tag from one node (digests,
//! which share a tag, carry their sender), so the tag alone matches it; UCX keeps messages that
//! arrive before their receive is posted (a node ahead of another), and messages with one tag
//! from one peer arrive in order, so the wrap-around of the short fields is harmless.
//!
//! Aborts: a node where a team spanning nodes fails for a reason of its own sends every other
//! node's worker an abort ([`ABORT_TAG`], [`ABORT_LEN`] bytes: the team's key, the reason, the
//! rank or node it names, the sender), and the receivers fail the team the same way, so no node
//! waits for a node that has given up.
//!
//! Liveness: a node waiting for a peer's message longer than [`PING_AFTER`] sends that peer's
//! worker a ping, which its worker answers from its own progress whatever its ranks do; a peer
//! whose endpoint failed (UCX's peer error handling: its process died, its connection broke),
//! or that answers no ping for [`PEER_TIMEOUT`], fails the team on this node with
//! [`Reason::PeerWorker`] naming that node. Ranks that are merely slow to start a collective
//! keep their worker answering pings, so they are never mistaken for a failure.

use std::time::{Duration, Instant};

use urom_coll_wire::{Datatype, Reason, ReduceOp};

use crate::engine::{CHUNK, Fault};
use crate::reduce;

/// Allreduce and reduce up to this many bytes use recursive doubling; larger ones the ring.
pub const SMALL: u64 = 64 * 1024;
/// How long a node waits for a peer's message before it pings that peer's worker.
pub const PING_AFTER: Duration = Duration::from_millis(500);
/// How long a peer's worker may stay silent (no message, no answer to pings) before the team
/// fails naming its node.
pub const PEER_TIMEOUT: Duration = Duration::from_secs(5);

const KIND_DATA: u64 = 0;
const KIND_PING: u64 = 1;
const KIND_PONG: u64 = 2;
const KIND_ABORT: u64 = 3;
const KIND_SHIFT: u32 = 62;
/// The tag bits of the kind.
pub const KIND_MASK: u64 = 3 << KIND_SHIFT;
/// The tag of every ping (the rest of the tag is free).
pub const PING_TAG: u64 = KIND_PING << KIND_SHIFT;
/// The most bytes of a ping: the pinging node worker's domain id and the pong's tag.
pub const PING_LEN: usize = 16;
/// The tag of every abort (the rest of the tag is free).
pub const ABORT_TAG: u64 = KIND_ABORT << KIND_SHIFT;
/// The bytes of an abort: the team's key (u64), the fault's reason and rank (u32 each), the
/// sending node's index (u32) and 4 reserved bytes, little-endian.
pub const ABORT_LEN: usize = 24;
/// The bytes of a digest message: the digest (u64), the sending node's index (u32), 4
/// reserved bytes.
const DIGEST_LEN: usize = 16;
/// The block field of digest messages (real blocks are node indices, below 64).
const DIGEST_BLOCK: u64 = 0xfff;

/// Token of the plugin's own operations (pings received, pongs sent), beside teams' serials.
pub const CONTROL_SERIAL: u32 = u32::MAX;
/// Token kinds (the low 32 bits of a token; the high 32 are the team's serial).
pub const TOKEN_SEND: u32 = 1;
/// A data receive of the round.
pub const TOKEN_RECV: u32 = 2;
/// A ping this team sent.
pub const TOKEN_PING: u32 = 3;
/// A pong this team waits for (`| node << 8`).
pub const TOKEN_PONG: u32 = 4;
/// A ping received (control).
pub const TOKEN_PING_IN: u32 = 5;
/// A pong sent (control).
pub const TOKEN_PONG_OUT: u32 = 6;
/// A digest received (`| node << 8` unused: the sender is in the bytes).
pub const TOKEN_DIGEST: u32 = 7;
/// A window of a stream received (`| node << 8`).
pub const TOKEN_STREAM: u32 = 8;
/// An abort received (control).
pub const TOKEN_ABORT_IN: u32 = 9;
/// An abort sent (control).
pub const TOKEN_ABORT_OUT: u32 = 10;

/// A token: the team's serial and the kind.
pub fn token(serial: u32, kind: u32) -> u64 {
    u64::from(serial) << 32 | u64::from(kind)
}

/// The 20-bit tag of a team key (never 0xfffff, kept apart for nothing).
pub fn team_bits(key: u64) -> u64 {
    let h = key.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (h >> 44) & 0xf_fffe
}

fn data_tag(team: u64, seq: u8, block: u64, window: u64, round: u32) -> u64 {
    KIND_DATA << KIND_SHIFT
        | team << 42
        | u64::from(seq) << 34
        | (block & 0xfff) << 22
        | (window & 0x3fff) << 8
        | u64::from(round & 0xff)
}

/// The tag of the pong answering a ping numbered `nonce`.
pub fn pong_tag(nonce: u64) -> u64 {
    KIND_PONG << KIND_SHIFT | (nonce & !KIND_MASK)
}

/// Why an operation of the network failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetError;

/// What a finished operation gives: for a receive its bytes, for a send `None`.
pub type NetOutcome<'a> = Result<Option<&'a [u8]>, NetError>;

/// Takes each finished operation of [`Net::poll`]: its token and outcome.
pub type OnDone<'f> = dyn FnMut(u64, NetOutcome<'_>) + 'f;

/// The messages between node workers: UCX tagged messages in the plugin (`PeerWorker`), a
/// loopback in tests.
pub trait Net {
    /// An endpoint to the worker at `address`.
    fn connect(&mut self, address: &[u8]) -> Result<usize, NetError>;
    /// Whether endpoint `peer` failed (its peer died or became unreachable).
    fn failed(&self, peer: usize) -> bool;
    /// Sends `data` (copied at once) to `peer` with `tag`; completes with `token`.
    fn send(&mut self, peer: usize, tag: u64, data: &[u8], token: u64) -> Result<(), NetError>;
    /// Receives a message of at most `capacity` bytes whose tag matches `tag` under `mask`;
    /// completes with `token`.
    fn recv(&mut self, tag: u64, mask: u64, capacity: usize, token: u64);
    /// Hands each finished operation to `f` (its token, and for a receive the bytes, for a
    /// send `None`); whether there was any.
    fn poll(&mut self, f: &mut OnDone<'_>) -> bool;
    /// This worker's address, for the domain.
    fn address(&self) -> &[u8];
    /// Readies the descriptor that wakes a sleeping worker when a message arrives: `false`
    /// when events wait already (progress instead of sleeping).
    fn arm(&mut self) -> bool;
    /// That descriptor, if there is one.
    fn wake_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>>;
}

/// One endpoint to a node worker, by its domain id.
struct Link {
    domain_id: u64,
    address: Vec<u8>,
    peer: usize,
}

/// The plugin's endpoints to other node workers, shared by its teams.
pub struct Links {
    /// The network.
    pub net: Box<dyn Net>,
    links: Vec<Link>,
}

impl Links {
    /// Endpoints over `net`.
    pub fn new(net: Box<dyn Net>) -> Self {
        Self {
            net,
            links: Vec::new(),
        }
    }

    /// The endpoint to node worker `domain_id`, whose address is `address`: made on first use
    /// and again when the address changed.
    pub fn peer(&mut self, domain_id: u64, address: &[u8]) -> Result<usize, NetError> {
        if let Some(link) = self
            .links
            .iter()
            .find(|l| l.domain_id == domain_id && l.address == address)
        {
            return Ok(link.peer);
        }
        let peer = self.net.connect(address)?;
        self.links.retain(|l| l.domain_id != domain_id);
        self.links.push(Link {
            domain_id,
            address: address.to_vec(),
            peer,
        });
        Ok(peer)
    }

    /// How many endpoints were made (a single-node team makes none).
    pub fn endpoints(&self) -> usize {
        self.links.len()
    }
}

/// What a window's exchange does with the node's accumulator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exchange {
    /// Nothing crosses nodes.
    Nothing,
    /// Reduce the node partials into every node's accumulator.
    Reduce {
        /// Whether by recursive doubling (else the ring).
        doubling: bool,
    },
    /// Copy the accumulator of node `from` to every node.
    Bcast {
        /// The source node.
        from: usize,
    },
    /// Synchronise (no data).
    Barrier,
    /// Every node sends node `p` the `out_len[p]` bytes at accumulator slot `p` and receives
    /// `in_len[p]` bytes from it into inbox slot `p` (copy collectives: one stream of blocks
    /// per ordered pair of nodes, a window of at most one chunk of each stream at a time).
    Streams,
}

/// What an arriving message does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Into {
    /// Copy into the accumulator at `off`.
    Copy,
    /// `acc = msg op acc`.
    Left,
    /// `acc = acc op msg`.
    Right,
}

/// The round a window is in.
#[derive(Debug, Clone, Copy)]
struct Round {
    index: u32,
    /// The receive still expected in it: (from node, offset, length, what it does).
    expect: Option<(usize, usize, usize, Into)>,
}

/// A team's nodes, endpoints, accumulator, and the exchange running on it.
pub struct Span {
    /// This node.
    pub me: usize,
    /// Every rank's node.
    pub node_of: Vec<u32>,
    /// Each node's worker's domain id.
    pub workers: Vec<u64>,
    /// Endpoints to the nodes' workers, made at the first collective.
    pub peers: Vec<Option<usize>>,
    /// The team's tag bits.
    team: u64,
    /// The team's serial in the plugin (tokens).
    pub serial: u32,
    /// Collectives begun on the team.
    seq: u8,
    /// The accumulator: `nodes * CHUNK` bytes, 8-byte aligned.
    pub acc: Vec<u64>,
    /// Where arriving messages are aligned: `CHUNK` bytes.
    rbuf: Vec<u64>,
    /// The exchange running: what, its window, its length.
    exchange: Exchange,
    block: u64,
    window: u64,
    win: usize,
    es: usize,
    datatype: Datatype,
    op: ReduceOp,
    round: Option<Round>,
    /// Sends started and not complete.
    sends: u32,
    /// A failure an operation reported.
    failed: Option<Fault>,
    /// Per node: when it last showed life, and the ping it has not answered.
    alive: Vec<Instant>,
    pinged: Vec<Option<Instant>>,
    pings: u64,
    /// Every node's ranks, in rank order.
    pub ranks: Vec<Vec<usize>>,
    /// The digest of the running collective's arguments each node must send (per node: the
    /// pairwise ones differ), whether it arrived, how many are missing.
    digest: Vec<u64>,
    digest_in: Vec<bool>,
    digest_want: usize,
    /// The flight waits for missing digests (the worker may sleep).
    hold: bool,
    /// A node whose data message was malformed before its digest arrived: the digest decides
    /// whether the nodes disagree or that node's worker misbehaves.
    bad_data: Option<usize>,
    /// Streams: bytes of this window to send to and to receive from each node.
    pub out_len: Vec<usize>,
    /// Bytes of this window expected from each node.
    pub in_len: Vec<usize>,
    awaiting: Vec<bool>,
    pending: usize,
    /// Streams: where each node's window arrives, `nodes * CHUNK` bytes.
    inbox: Vec<u64>,
    /// Streams: the cursor (block, byte) of the stream to and from each node.
    pub out_cursor: Vec<(usize, u64)>,
    /// The cursor of the stream from each node.
    pub in_cursor: Vec<(usize, u64)>,
    /// Total bytes of the stream to and from each node.
    pub out_total: Vec<u64>,
    /// Total bytes of the stream from each node.
    pub in_total: Vec<u64>,
}

impl Span {
    /// The span of a team `key` whose rank `r` lives on node `node_of[r]`, this worker being
    /// node `me`, the nodes' workers being `workers`.
    pub fn new(key: u64, serial: u32, me: usize, node_of: Vec<u32>, workers: Vec<u64>) -> Self {
        let nodes = workers.len();
        let now = Instant::now();
        let mut ranks = vec![Vec::new(); nodes];
        for (r, &node) in node_of.iter().enumerate() {
            if let Some(list) = ranks.get_mut(node as usize) {
                list.push(r);
            }
        }
        Self {
            me,
            node_of,
            peers: vec![None; nodes],
            workers,
            team: team_bits(key),
            serial,
            seq: 0,
            acc: vec![0; nodes * CHUNK / 8],
            rbuf: vec![0; CHUNK / 8],
            exchange: Exchange::Nothing,
            block: 0,
            window: 0,
            win: 0,
            es: 1,
            datatype: Datatype::U8,
            op: ReduceOp::Sum,
            round: None,
            sends: 0,
            failed: None,
            alive: vec![now; nodes],
            pinged: vec![None; nodes],
            pings: 0,
            ranks,
            digest: vec![0; nodes],
            digest_in: vec![true; nodes],
            digest_want: 0,
            hold: false,
            bad_data: None,
            out_len: vec![0; nodes],
            in_len: vec![0; nodes],
            awaiting: vec![false; nodes],
            pending: 0,
            inbox: vec![0; nodes * CHUNK / 8],
            out_cursor: vec![(0, 0); nodes],
            in_cursor: vec![(0, 0); nodes],
            out_total: vec![0; nodes],
            in_total: vec![0; nodes],
        }
    }

    /// How many nodes.
    pub fn nodes(&self) -> usize {
        self.workers.len()
    }

    /// The bytes a window may hold for a reduction of `len` bytes: one chunk for recursive
    /// doubling, a chunk per node for the ring.
    pub fn window_len(&self, exchange: Exchange) -> usize {
        match exchange {
            Exchange::Reduce { doubling: false } => self.nodes() * CHUNK,
            _ => CHUNK,
        }
    }

    /// Starts a new collective on the team (its sequence number goes up).
    pub fn next_collective(&mut self, datatype: Datatype, op: ReduceOp) {
        self.seq = self.seq.wrapping_add(1);
        self.datatype = datatype;
        self.op = op;
        self.es = datatype.size().unwrap_or(1);
        self.failed = None;
        self.bad_data = None;
        self.hold = false;
        self.pending = 0;
        self.awaiting.fill(false);
        self.out_cursor.fill((0, 0));
        self.in_cursor.fill((0, 0));
        self.out_total.fill(0);
        self.in_total.fill(0);
        let now = Instant::now();
        for (alive, pinged) in self.alive.iter_mut().zip(&mut self.pinged) {
            *alive = now;
            *pinged = None;
        }
    }

    /// Sends every other node the digest of the collective's arguments meant for it
    /// (`digests[node]`) and posts the receives of theirs: the first exchange of every
    /// collective. A node whose digest differs from the one this node computed for it fails
    /// the collective with [`Reason::NodesDisagree`] naming it; the results are written to the
    /// local ranks only once every digest arrived and matched.
    pub fn start_digests(&mut self, net: &mut dyn Net, digests: &[u64]) -> Result<(), Fault> {
        let n = self.nodes();
        self.digest_want = 0;
        let tag = data_tag(self.team, self.seq, DIGEST_BLOCK, 0x3fff, 0xff);
        for node in 0..n {
            self.digest[node] = digests.get(node).copied().unwrap_or(0);
            self.digest_in[node] = node == self.me;
            if node == self.me {
                continue;
            }
            self.digest_want += 1;
            net.recv(tag, u64::MAX, DIGEST_LEN, token(self.serial, TOKEN_DIGEST));
        }
        for node in (0..n).filter(|&node| node != self.me) {
            let peer = self.peer(node)?;
            let mut bytes = [0u8; DIGEST_LEN];
            bytes[..8].copy_from_slice(&self.digest[node].to_le_bytes());
            bytes[8..12].copy_from_slice(&(self.me as u32).to_le_bytes());
            net.send(
                peer,
                tag,
                &bytes,
                token(self.serial, TOKEN_SEND | (node as u32) << 8),
            )
            .map_err(|_| self.fault(node))?;
            self.sends += 1;
        }
        Ok(())
    }

    /// Whether every other node's digest arrived (and matched); while some is missing, checks
    /// that node's life and marks the span as holding.
    pub fn digests_ready(&mut self, net: &mut dyn Net) -> Result<bool, Fault> {
        if let Some(fault) = self.failed {
            return Err(fault);
        }
        if self.digest_want == 0 {
            self.hold = false;
            return Ok(true);
        }
        self.hold = true;
        if let Some(node) = self.digest_in.iter().position(|&d| !d) {
            self.check_peer(net, node)?;
        }
        Ok(false)
    }

    /// A data message from `from` was malformed: the nodes disagree if its digest says so,
    /// else its worker misbehaves.
    fn data_error(&mut self, from: usize) {
        if self.digest_in.get(from).copied().unwrap_or(true) {
            if self.failed.is_none() {
                self.failed = Some(self.fault(from));
            }
        } else {
            self.bad_data = Some(from);
        }
    }

    /// Inbox slot `node`'s first `len` bytes.
    pub fn inbox(&self, node: usize, len: usize) -> &[u8] {
        let bytes: &[u8] = zerocopy::IntoBytes::as_bytes(&self.inbox[..]);
        &bytes[node * CHUNK..node * CHUNK + len]
    }

    /// The abort message telling the other nodes that team `key` failed here with `fault`.
    pub fn abort_message(&self, key: u64, fault: Fault) -> [u8; ABORT_LEN] {
        let mut bytes = [0u8; ABORT_LEN];
        bytes[..8].copy_from_slice(&key.to_le_bytes());
        bytes[8..12].copy_from_slice(&fault.reason.raw().to_le_bytes());
        bytes[12..16].copy_from_slice(&fault.rank.to_le_bytes());
        bytes[16..20].copy_from_slice(&(self.me as u32).to_le_bytes());
        bytes
    }

    /// The accumulator's first `len` bytes.
    pub fn acc_mut(&mut self, len: usize) -> &mut [u8] {
        &mut zerocopy::IntoBytes::as_mut_bytes(&mut self.acc[..])[..len]
    }

    /// Begins the exchange of window `window` of block `block`, `win` bytes in the
    /// accumulator.
    pub fn begin(&mut self, exchange: Exchange, block: u64, window: u64, win: usize) {
        self.exchange = exchange;
        self.block = block;
        self.window = window;
        self.win = win;
        self.round = None;
        self.hold = false;
        let now = Instant::now();
        for (alive, pinged) in self.alive.iter_mut().zip(&mut self.pinged) {
            *alive = now;
            *pinged = None;
        }
    }

    /// Whether the exchange waits for a peer's message (the worker may sleep meanwhile).
    pub fn waiting(&self) -> bool {
        self.round.is_some_and(|r| r.expect.is_some()) || self.pending > 0 || self.hold
    }

    /// The node whose message the span waits for, if any.
    fn watched(&self) -> Option<usize> {
        if let Some(Round {
            expect: Some((from, ..)),
            ..
        }) = self.round
        {
            return Some(from);
        }
        if self.pending > 0 {
            return self.awaiting.iter().position(|&a| a);
        }
        if self.hold {
            return self.digest_in.iter().position(|&d| !d);
        }
        None
    }

    fn fault(&self, node: usize) -> Fault {
        Fault::new(Reason::PeerWorker, node as u32)
    }

    /// The endpoint to node `node`.
    fn peer(&self, node: usize) -> Result<usize, Fault> {
        self.peers[node].ok_or(self.fault(node))
    }

    fn send(
        &mut self,
        net: &mut dyn Net,
        to: usize,
        round: u32,
        off: usize,
        len: usize,
    ) -> Result<(), Fault> {
        let peer = self.peer(to)?;
        let tag = data_tag(self.team, self.seq, self.block, self.window, round);
        let bytes: &[u8] = zerocopy::IntoBytes::as_bytes(&self.acc[..]);
        let kind = TOKEN_SEND | (to as u32) << 8;
        net.send(peer, tag, &bytes[off..off + len], token(self.serial, kind))
            .map_err(|_| self.fault(to))?;
        self.sends += 1;
        Ok(())
    }

    fn expect(
        &mut self,
        net: &mut dyn Net,
        from: usize,
        round: u32,
        off: usize,
        len: usize,
        into: Into,
    ) {
        let tag = data_tag(self.team, self.seq, self.block, self.window, round);
        net.recv(tag, u64::MAX, len, token(self.serial, TOKEN_RECV));
        self.round = Some(Round {
            index: round,
            expect: Some((from, off, len, into)),
        });
    }

    /// Segment `k` of the window for the ring: its offset and length.
    fn segment(&self, k: usize) -> (usize, usize) {
        let n = self.nodes();
        let elems = self.win / self.es;
        let per = elems.div_ceil(n) * self.es;
        let start = (k * per).min(self.win);
        let end = ((k + 1) * per).min(self.win);
        (start, end - start)
    }

    /// Posts round `index` of the exchange; `false` when there is no such round (the exchange
    /// is done).
    fn post(&mut self, net: &mut dyn Net, index: u32) -> Result<bool, Fault> {
        let n = self.nodes();
        let me = self.me;
        let win = self.win;
        self.round = Some(Round {
            index,
            expect: None,
        });
        match self.exchange {
            Exchange::Nothing => Ok(false),
            Exchange::Streams => {
                if index > 0 {
                    return Ok(false);
                }
                let bytes: &[u8] = zerocopy::IntoBytes::as_bytes(&self.acc[..]);
                for node in (0..n).filter(|&node| node != me) {
                    let len = self.in_len[node];
                    if len > 0 {
                        let tag = data_tag(self.team, self.seq, node as u64, self.window, 0);
                        net.recv(
                            tag,
                            u64::MAX,
                            len,
                            token(self.serial, TOKEN_STREAM | (node as u32) << 8),
                        );
                        self.awaiting[node] = true;
                        self.pending += 1;
                    }
                }
                for node in (0..n).filter(|&node| node != me) {
                    let len = self.out_len[node];
                    if len == 0 {
                        continue;
                    }
                    let peer = self.peer(node)?;
                    let tag = data_tag(self.team, self.seq, me as u64, self.window, 0);
                    let kind = TOKEN_SEND | (node as u32) << 8;
                    net.send(
                        peer,
                        tag,
                        &bytes[node * CHUNK..node * CHUNK + len],
                        token(self.serial, kind),
                    )
                    .map_err(|_| self.fault(node))?;
                    self.sends += 1;
                }
                Ok(true)
            }
            Exchange::Barrier => {
                let dist = 1usize.checked_shl(index).unwrap_or(usize::MAX);
                if dist >= n {
                    return Ok(false);
                }
                self.send(net, (me + dist) % n, index, 0, 0)?;
                self.expect(net, (me + n - dist) % n, index, 0, 0, Into::Copy);
                Ok(true)
            }
            Exchange::Bcast { from } => {
                if index > 0 {
                    return Ok(false);
                }
                if me == from {
                    for to in (0..n).filter(|&to| to != me) {
                        self.send(net, to, 0, 0, win)?;
                    }
                } else {
                    self.expect(net, from, 0, 0, win, Into::Copy);
                }
                Ok(true)
            }
            Exchange::Reduce { doubling: true } => {
                let p = 1usize << (usize::BITS - 1 - n.leading_zeros());
                let rem = n - p;
                let log = p.trailing_zeros();
                if index == 0 {
                    if me >= p {
                        self.send(net, me - p, 0, 0, win)?;
                    } else if me < rem {
                        self.expect(net, me + p, 0, 0, win, Into::Right);
                    }
                    Ok(true)
                } else if index <= log {
                    if me < p {
                        let partner = me ^ (1 << (index - 1));
                        self.send(net, partner, index, 0, win)?;
                        let into = if partner < me {
                            Into::Left
                        } else {
                            Into::Right
                        };
                        self.expect(net, partner, index, 0, win, into);
                    }
                    Ok(true)
                } else if index == log + 1 {
                    if me < rem {
                        self.send(net, me + p, index, 0, win)?;
                    } else if me >= p {
                        self.expect(net, me - p, index, 0, win, Into::Copy);
                    }
                    Ok(true)
                } else {
                    Ok(false)
                }
            }
            Exchange::Reduce { doubling: false } => {
                let steps = (n - 1) as u32;
                let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
                if index < steps {
                    let t = index as usize;
                    let (so, sl) = self.segment((me + n - t % n) % n);
                    self.send(net, next, index, so, sl)?;
                    let (ro, rl) = self.segment((me + 2 * n - t - 1) % n);
                    let into = if prev < me { Into::Left } else { Into::Right };
                    self.expect(net, prev, index, ro, rl, into);
                    Ok(true)
                } else if index < 2 * steps {
                    let t = (index - steps) as usize;
                    let (so, sl) = self.segment((me + 1 + n - t % n) % n);
                    self.send(net, next, index, so, sl)?;
                    let (ro, rl) = self.segment((me + n - t % n) % n);
                    self.expect(net, prev, index, ro, rl, Into::Copy);
                    Ok(true)
                } else {
                    Ok(false)
                }
            }
        }
    }

    /// Advances the window's exchange: posts rounds whose receives are in, checks the peers'
    /// lives. `Ok(true)` once the window's exchange is complete.
    pub fn pump(&mut self, net: &mut dyn Net) -> Result<bool, Fault> {
        loop {
            if let Some(fault) = self.failed {
                return Err(fault);
            }
            if self.pending > 0 {
                if let Some(node) = self.awaiting.iter().position(|&a| a) {
                    self.check_peer(net, node)?;
                }
                return Ok(false);
            }
            let next = match self.round {
                None => 0,
                Some(Round {
                    expect: None,
                    index,
                }) => index + 1,
                Some(Round {
                    expect: Some((from, ..)),
                    ..
                }) => {
                    self.check_peer(net, from)?;
                    return Ok(false);
                }
            };
            if !self.post(net, next)? {
                self.round = None;
                return Ok(true);
            }
        }
    }

    /// Fails when node `from`'s endpoint failed or it stayed silent too long; pings it when it
    /// has been quiet for a while.
    fn check_peer(&mut self, net: &mut dyn Net, from: usize) -> Result<(), Fault> {
        let peer = self.peer(from)?;
        if net.failed(peer) {
            return Err(self.fault(from));
        }
        let now = Instant::now();
        let quiet = now.duration_since(self.alive[from]);
        if quiet >= PEER_TIMEOUT {
            return Err(self.fault(from));
        }
        let due = match self.pinged[from] {
            None => quiet >= PING_AFTER,
            Some(at) => now.duration_since(at) >= PING_AFTER,
        };
        if due {
            self.pings += 1;
            let nonce = u64::from(self.serial) << 24 | (from as u64) << 16 | (self.pings & 0xffff);
            let mut ping = [0u8; PING_LEN];
            ping[..8].copy_from_slice(&self.workers[self.me].to_le_bytes());
            ping[8..].copy_from_slice(&pong_tag(nonce).to_le_bytes());
            net.recv(
                pong_tag(nonce),
                u64::MAX,
                0,
                token(self.serial, TOKEN_PONG | (from as u32) << 8),
            );
            net.send(peer, PING_TAG, &ping, token(self.serial, TOKEN_PING))
                .map_err(|_| self.fault(from))?;
            self.pinged[from] = Some(now);
        }
        Ok(())
    }

    /// The next moment the exchange must look at its peers again, while it waits.
    pub fn deadline(&self) -> Option<Instant> {
        let from = self.watched()?;
        let base = self.pinged[from].unwrap_or(self.alive[from]);
        Some((base + PING_AFTER).min(self.alive[from] + PEER_TIMEOUT))
    }

    /// Takes a finished operation of this team: `kind` the token's low word.
    pub fn on_net(&mut self, kind: u32, result: Result<Option<&[u8]>, NetError>) {
        match kind & 0xff {
            TOKEN_SEND => {
                self.sends = self.sends.saturating_sub(1);
                if result.is_err() && self.failed.is_none() {
                    self.failed = Some(self.fault((kind >> 8) as usize));
                }
            }
            TOKEN_PING => {}
            TOKEN_DIGEST => {
                let Ok(Some(bytes)) = result else {
                    // A failed receive: the peer's endpoint failure is noticed by its checks.
                    return;
                };
                if bytes.len() != DIGEST_LEN {
                    return;
                }
                let word = u64::from_le_bytes(bytes[..8].try_into().unwrap_or_default());
                let node = u32::from_le_bytes(bytes[8..12].try_into().unwrap_or_default());
                let node = node as usize;
                if node >= self.nodes() || self.digest_in[node] {
                    return;
                }
                self.digest_in[node] = true;
                self.digest_want -= 1;
                self.alive[node] = Instant::now();
                self.pinged[node] = None;
                if word != self.digest[node] {
                    // Disagreement comes first, whatever else failed meanwhile.
                    if self
                        .failed
                        .is_none_or(|f| f.reason != Reason::NodesDisagree)
                    {
                        self.failed = Some(Fault::new(Reason::NodesDisagree, node as u32));
                    }
                } else if self.bad_data == Some(node) && self.failed.is_none() {
                    self.failed = Some(self.fault(node));
                }
            }
            TOKEN_STREAM => {
                let from = (kind >> 8) as usize;
                if from >= self.nodes() || !self.awaiting[from] {
                    return;
                }
                let len = self.in_len[from];
                match result {
                    Ok(Some(bytes)) if bytes.len() == len => {
                        let inbox: &mut [u8] =
                            zerocopy::IntoBytes::as_mut_bytes(&mut self.inbox[..]);
                        inbox[from * CHUNK..from * CHUNK + len].copy_from_slice(bytes);
                        self.awaiting[from] = false;
                        self.pending -= 1;
                        self.alive[from] = Instant::now();
                        self.pinged[from] = None;
                    }
                    _ => self.data_error(from),
                }
            }
            TOKEN_PONG => {
                let node = (kind >> 8) as usize;
                if result.is_ok() && node < self.alive.len() {
                    self.alive[node] = Instant::now();
                    self.pinged[node] = None;
                }
            }
            TOKEN_RECV => {
                let Some(Round {
                    expect: Some((from, off, len, into)),
                    index,
                }) = self.round
                else {
                    return;
                };
                let bytes = match result {
                    Ok(Some(bytes)) if bytes.len() == len => bytes,
                    _ => {
                        self.data_error(from);
                        return;
                    }
                };
                self.alive[from] = Instant::now();
                self.pinged[from] = None;
                let rbuf: &mut [u8] = zerocopy::IntoBytes::as_mut_bytes(&mut self.rbuf[..]);
                let acc: &mut [u8] = zerocopy::IntoBytes::as_mut_bytes(&mut self.acc[..]);
                let dst = &mut acc[off..off + len];
                let folded = match into {
                    Into::Copy => {
                        dst.copy_from_slice(bytes);
                        Ok(())
                    }
                    Into::Right => {
                        let r = &mut rbuf[..len];
                        r.copy_from_slice(bytes);
                        reduce::reduce(self.datatype, self.op, dst, r)
                    }
                    Into::Left => {
                        let r = &mut rbuf[..len];
                        r.copy_from_slice(bytes);
                        let folded = reduce::reduce(self.datatype, self.op, r, dst);
                        dst.copy_from_slice(r);
                        folded
                    }
                };
                if folded.is_err() {
                    self.failed = Some(Fault::plain(Reason::InvalidArgs));
                }
                self.round = Some(Round {
                    index,
                    expect: None,
                });
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::collections::VecDeque;
    use std::rc::Rc;

    use super::*;

    /// Messages between nodes in one process: node `i`'s sends land in the fabric, its
    /// receives match by tag.
    #[derive(Default)]
    struct Fabric {
        /// (to node, tag, bytes)
        wire: Vec<(usize, u64, Vec<u8>)>,
    }

    struct Loop {
        me: usize,
        fabric: Rc<RefCell<Fabric>>,
        /// Endpoint i: node addresses[i].
        peers: Vec<usize>,
        recvs: Vec<(u64, u64, u64)>,
        done: VecDeque<(u64, Option<Vec<u8>>)>,
        dead: Vec<bool>,
    }

    impl Net for Loop {
        fn connect(&mut self, address: &[u8]) -> Result<usize, NetError> {
            self.peers.push(address[0] as usize);
            Ok(self.peers.len() - 1)
        }
        fn failed(&self, peer: usize) -> bool {
            self.dead[self.peers[peer]]
        }
        fn send(&mut self, peer: usize, tag: u64, data: &[u8], token: u64) -> Result<(), NetError> {
            let to = self.peers[peer];
            if self.dead[to] {
                return Err(NetError);
            }
            self.fabric.borrow_mut().wire.push((to, tag, data.to_vec()));
            self.done.push_back((token, None));
            Ok(())
        }
        fn recv(&mut self, tag: u64, mask: u64, _capacity: usize, token: u64) {
            self.recvs.push((tag, mask, token));
        }
        fn poll(&mut self, f: &mut OnDone<'_>) -> bool {
            let mut any = false;
            let mut fabric = self.fabric.borrow_mut();
            let mut i = 0;
            while i < self.recvs.len() {
                let (tag, mask, token) = self.recvs[i];
                let me = self.me;
                if let Some(at) = fabric
                    .wire
                    .iter()
                    .position(|(to, t, _)| *to == me && t & mask == tag & mask)
                {
                    let (_, _, bytes) = fabric.wire.remove(at);
                    self.recvs.remove(i);
                    self.done.push_back((token, Some(bytes)));
                } else {
                    i += 1;
                }
            }
            drop(fabric);
            while let Some((token, result)) = self.done.pop_front() {
                any = true;
                f(token, Ok(result.as_deref()));
            }
            any
        }
        fn address(&self) -> &[u8] {
            &[]
        }
        fn arm(&mut self) -> bool {
            true
        }
        fn wake_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
            None
        }
    }

    /// Runs one window's exchange on `n` nodes whose accumulators start as `input(node)`;
    /// their accumulators after it.
    fn run(
        n: usize,
        exchange: Exchange,
        datatype: Datatype,
        op: ReduceOp,
        inputs: Vec<Vec<u8>>,
    ) -> Vec<Vec<u8>> {
        let fabric = Rc::new(RefCell::new(Fabric::default()));
        let win = inputs[0].len();
        let mut nodes: Vec<(Span, Loop)> = (0..n)
            .map(|me| {
                let mut net = Loop {
                    me,
                    fabric: Rc::clone(&fabric),
                    peers: Vec::new(),
                    recvs: Vec::new(),
                    done: VecDeque::new(),
                    dead: vec![false; n],
                };
                let mut span = Span::new(7, 1, me, vec![], (0..n as u64).collect());
                for node in 0..n {
                    span.peers[node] = Some(net.connect(&[node as u8]).unwrap());
                }
                span.next_collective(datatype, op);
                span.acc_mut(win).copy_from_slice(&inputs[me]);
                span.begin(exchange, 0, 0, win);
                (span, net)
            })
            .collect();
        let mut done = vec![false; n];
        for _ in 0..10_000 {
            for (i, (span, net)) in nodes.iter_mut().enumerate() {
                net.poll(&mut |token, result| span.on_net(token as u32, result));
                if !done[i] {
                    done[i] = span.pump(net).expect("no failure");
                }
            }
            if done.iter().all(|&d| d) {
                return nodes
                    .iter_mut()
                    .map(|(s, _)| s.acc_mut(win).to_vec())
                    .collect();
            }
        }
        panic!("the exchange did not finish");
    }

    fn f64s(v: &[f64]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn both_reductions_give_every_node_the_same_sum_in_the_documented_order() {
        for n in [2usize, 3, 4, 5, 8] {
            for doubling in [true, false] {
                let elems = 37;
                let inputs: Vec<Vec<u8>> = (0..n)
                    .map(|node| {
                        f64s(
                            &(0..elems)
                                .map(|i| (i * 7 + node * 13) as f64 * 0.1)
                                .collect::<Vec<_>>(),
                        )
                    })
                    .collect();
                let out = run(
                    n,
                    Exchange::Reduce { doubling },
                    Datatype::F64,
                    ReduceOp::Sum,
                    inputs.clone(),
                );
                for node in 1..n {
                    assert_eq!(out[node], out[0], "{n} nodes, doubling {doubling}");
                }
                let got: Vec<f64> = out[0]
                    .chunks(8)
                    .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                    .collect();
                for (i, g) in got.iter().enumerate() {
                    let exact: f64 = (0..n).map(|node| (i * 7 + node * 13) as f64 * 0.1).sum();
                    assert!(
                        (g - exact).abs() < 1e-9,
                        "{n} nodes element {i}: {g} vs {exact}"
                    );
                }
                if n == 2 {
                    // Exactly P0 + P1.
                    let want: Vec<u8> = (0..elems)
                        .flat_map(|i| {
                            ((i * 7) as f64 * 0.1 + (i * 7 + 13) as f64 * 0.1).to_le_bytes()
                        })
                        .collect();
                    assert_eq!(out[0], want);
                }
            }
        }
    }

    #[test]
    fn bcast_and_barrier_reach_every_node() {
        for n in [2usize, 3, 5] {
            let inputs: Vec<Vec<u8>> = (0..n).map(|node| vec![node as u8; 9]).collect();
            let out = run(
                n,
                Exchange::Bcast { from: n - 1 },
                Datatype::U8,
                ReduceOp::Sum,
                inputs,
            );
            assert!(out.iter().all(|o| *o == vec![(n - 1) as u8; 9]));
            run(
                n,
                Exchange::Barrier,
                Datatype::U8,
                ReduceOp::Sum,
                vec![vec![]; n],
            );
        }
    }

    #[test]
    fn a_dead_peer_fails_the_exchange_naming_its_node() {
        let fabric = Rc::new(RefCell::new(Fabric::default()));
        let mut net = Loop {
            me: 0,
            fabric,
            peers: Vec::new(),
            recvs: Vec::new(),
            done: VecDeque::new(),
            dead: vec![false, true],
        };
        let mut span = Span::new(7, 1, 0, vec![], vec![0, 1]);
        for node in 0..2 {
            span.peers[node] = Some(net.connect(&[node as u8]).unwrap());
        }
        span.next_collective(Datatype::U8, ReduceOp::Sum);
        span.begin(Exchange::Barrier, 0, 0, 0);
        assert_eq!(span.pump(&mut net), Err(Fault::new(Reason::PeerWorker, 1)));
    }

    /// Node `me`'s loopback network and span on a fabric of `n` nodes, connected to all.
    fn node(n: usize, me: usize, fabric: &Rc<RefCell<Fabric>>) -> (Span, Loop) {
        let mut net = Loop {
            me,
            fabric: Rc::clone(fabric),
            peers: Vec::new(),
            recvs: Vec::new(),
            done: VecDeque::new(),
            dead: vec![false; n],
        };
        let mut span = Span::new(7, 1, me, (0..n as u32).collect(), (0..n as u64).collect());
        for node in 0..n {
            span.peers[node] = Some(net.connect(&[node as u8]).unwrap());
        }
        (span, net)
    }

    #[test]
    fn streams_carry_each_pair_of_nodes_its_own_bytes() {
        let n = 3;
        let fabric = Rc::new(RefCell::new(Fabric::default()));
        let byte = |from: usize, to: usize, i: usize| (from * 50 + to * 7 + i) as u8;
        let len = |from: usize, to: usize| {
            if from == 2 && to == 0 {
                0
            } else {
                5 + from * 3 + to
            }
        };
        let mut nodes: Vec<(Span, Loop)> = (0..n).map(|me| node(n, me, &fabric)).collect();
        for (me, (span, net)) in nodes.iter_mut().enumerate() {
            span.next_collective(Datatype::U8, ReduceOp::Sum);
            span.start_digests(net, &[9; 3]).unwrap();
            let acc = span.acc_mut(n * CHUNK);
            for to in (0..n).filter(|&to| to != me) {
                for i in 0..len(me, to) {
                    acc[to * CHUNK + i] = byte(me, to, i);
                }
            }
            for p in (0..n).filter(|&p| p != me) {
                span.out_len[p] = len(me, p);
                span.in_len[p] = len(p, me);
            }
            span.begin(Exchange::Streams, 0, 0, CHUNK);
        }
        let mut done = [false; 3];
        for _ in 0..1000 {
            for (i, (span, net)) in nodes.iter_mut().enumerate() {
                net.poll(&mut |token, result| span.on_net(token as u32, result));
                if !done[i] {
                    done[i] = span.pump(net).unwrap() && span.digests_ready(net).unwrap();
                }
            }
        }
        assert!(done.iter().all(|&d| d));
        for (me, (span, _)) in nodes.iter().enumerate() {
            for from in (0..n).filter(|&from| from != me) {
                let want: Vec<u8> = (0..len(from, me)).map(|i| byte(from, me, i)).collect();
                assert_eq!(span.inbox(from, len(from, me)), &want[..], "{from} to {me}");
            }
        }
    }

    #[test]
    fn differing_digests_fail_both_nodes_naming_the_other() {
        let fabric = Rc::new(RefCell::new(Fabric::default()));
        let mut nodes: Vec<(Span, Loop)> = (0..2).map(|me| node(2, me, &fabric)).collect();
        for (me, (span, net)) in nodes.iter_mut().enumerate() {
            span.next_collective(Datatype::U8, ReduceOp::Sum);
            span.start_digests(net, &[me as u64; 2]).unwrap();
        }
        let mut results = [None, None];
        for _ in 0..100 {
            for (i, (span, net)) in nodes.iter_mut().enumerate() {
                net.poll(&mut |token, result| span.on_net(token as u32, result));
                if results[i].is_none() {
                    match span.digests_ready(net) {
                        Ok(false) => assert!(span.waiting()),
                        other => results[i] = Some(other),
                    }
                }
            }
        }
        assert_eq!(results[0], Some(Err(Fault::new(Reason::NodesDisagree, 1))));
        assert_eq!(results[1], Some(Err(Fault::new(Reason::NodesDisagree, 0))));
    }
}
