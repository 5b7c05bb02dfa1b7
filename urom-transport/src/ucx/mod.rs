//! The UCX transport (feature `ucx`): frames as UCP active messages, to a peer on this or
//! another machine, over whatever transports `UCX_TLS` / `UCX_NET_DEVICES` select (TCP,
//! RDMA, shared memory).
//!
//! * `ucp`: the process-wide UCP context and the workers, endpoints and requests;
//! * `watch`: the wake thread that progresses the shared worker while ends sleep;
//! * `state`: what UCX calls back into (receive slots, credits, closes, handshake messages);
//! * `conn`: [`UcxConnection`] and its halves, [`UcxSender`] and [`UcxReceiver`];
//! * `handshake`: [`UcxListener`], connecting, and [`UcxConnectError`];
//! * `peer`: beside the transport, [`PeerWorker`] (tagged messages between plugins' workers
//!   and remote access to their hosts' memory) and [`HostMemoryWorker`] with [`MappedMemory`]
//!   (the host's memory that peers reach); see below.
//!
//! # Context
//!
//! One UCP context per process, created on first use with the active-message and wake-up
//! features and `mt_workers_shared` (connections live on different threads). Its configuration
//! comes from the `UCX_*` environment; [`set_config_defaults`] supplies values for variables
//! the environment leaves unset (tests use it to stay on TCP over loopback). Peer error
//! handling and sleeping need a transport besides `sm,self` alone: include `tcp` in `UCX_TLS`.
//! `UCX_WARN_UNUSED_ENV_VARS=n` silences UCX's warnings about unknown `UCX_*` variables.
//!
//! # Workers, endpoints and active-message ids
//!
//! Every connection end and listener of a process lives on one shared UCP worker (serialized
//! mode), progressed under one process-wide lock: a thread calls into the worker, or touches any
//! end's state, only while it holds that lock. So a connection, or each of its halves, can move
//! to another thread, and every socket UCX opens for the process's connections belongs to one
//! UCX async context (see "UCX 1.13's queued events" below). The worker is destroyed when the
//! process exits.
//!
//! Each end receives on active-message ids of its own: a block of four (data, control,
//! handshake, batch) from `am_base`, handed out when the end is made, registered with the end's
//! state as the handlers' argument, and given back (to a handler that drops what arrives) when
//! the end is gone; fresh ids are handed out first, then those given back longest ago. The
//! peer learns an end's `am_base` in the handshake and sends to those ids.
//!
//! Endpoints: a connection by socket address has a client-server endpoint of its own on each
//! side, closed when its end goes. Connections by worker address (to a listener's worker
//! address, or through a door) share one endpoint per pair of workers, kept while both live:
//! UCX pairs the endpoints that two workers create to each other by counting them, so one each
//! way pairs right however many connections come and go between the two processes. When that
//! endpoint fails (the other process died or cannot be reached), every end on it fails; the
//! next connection makes a new one. An end on a shared endpoint that is crashed on purpose
//! (for tests) cannot hang it up: it tells its peer with an abort message instead.
//!
//! # Handshake
//!
//! By socket address ([`UcxConnection::connect`]):
//!
//! 1. the connecting side makes its end and a client-server endpoint to the listener's
//!    address, and sends a hello (`urom_wire::ucx`): its maximum message size, its slot count
//!    and its `am_base`. It goes to the one id every process keeps for such hellos, with UCX's
//!    reply flag, since the accepting end does not exist yet;
//! 2. the listener receives the connection request; `accept` makes a new end and creates the
//!    server endpoint from the request, and takes the hello that arrives over that endpoint;
//! 3. the accepting side checks the hello (version, maximum message size, slot count) and
//!    answers to the connecting end's handshake id with a status, its own maximum message
//!    size, slot count and `am_base`. On a mismatch it answers with the reason and both sides
//!    fail with the same error ([`UcxConnectError::MaxMsgSizeMismatch`]).
//!
//! By worker address ([`UcxConnection::connect_worker`]; a listener's worker address is the
//! shared worker's, with the listener's own hello id after it):
//!
//! 1. the connecting side makes its end on the endpoint to the listener's worker and sends a
//!    hello, which also carries its own worker's address, to the listener's id;
//! 2. `accept` makes a new end on the endpoint to the address in the hello and answers on it
//!    with its settings and its worker's address;
//! 3. the connecting side moves its end to the endpoint to that address (the same one, when
//!    the listener's worker answers).
//!
//! Through a door ([`UcxConnection::connect_through`]) the hello and the answer travel on the
//! authenticated stream instead, and each side puts its end on the endpoint to the other's
//! worker address.
//!
//! Each side waits for the other's message at most `handshake_timeout`. A listener that is not
//! there fails the connecting endpoint at once ([`UcxConnectError::Unreachable`]).
//!
//! # Frames and credits
//!
//! A frame travels as one active message whose header is its sequence number; UCX sends small
//! ones eagerly and large ones with its rendezvous protocol. The receiver keeps `slots`
//! buffers of the maximum message size, allocated at setup: an eager frame is copied into the
//! slot its sequence number names; a rendezvous frame is received straight into it
//! (`ucp_am_recv_data_nbx`). Frames are handed out in sequence order, so a small frame that
//! overtakes a large one waits for it. `recv` lends the slot until the next `recv` or
//! `wait_recv`.
//!
//! The sender starts with the peer's slot count as credits; each frame takes one, and `send`
//! answers [`FrameSendError::Full`](crate::FrameSendError::Full) when none is left.
//! The receiver returns credits in a small control message (the count of frames released so
//! far) after every `slots / 2` releases, and, when it finds nothing more to receive, once
//! `slots / 2` frames arrived since its last report: a stalled sender (every slot's frame
//! arrived) always gets them, and a ping-pong costs one credit message per `slots / 2` frames,
//! not one per frame. The sender copies a frame that UCX cannot take at once into
//! a send buffer of its credit's slot (allocated at setup). Nothing is allocated per frame.
//!
//! UCX moves frames from inside calls into the worker: a large frame leaves as the receiver
//! pulls it (the sender's worker answers), and over TCP what the socket could not take at once
//! leaves on later progress. So the sending end must keep calling into the connection (a
//! `send`, `recv`, `wait_*` or `check_peer` on either half, or keeping a half asleep, armed, for
//! which the wake thread progresses the worker) until its frames are received, as every user of
//! a connection does; an end that is dropped lingers until the peer has them (see below).
//!
//! # Closing and failures
//!
//! Closing a half sends a control message: the sending half's carries how many frames it sent,
//! so the peer reports [`PeerGoneError::Closed`](crate::PeerGoneError::Closed) only
//! after receiving every one of them; the receiving half's tells the peer's sender to stop.
//! Dropping the last half lingers until the peer confirmed (see below), then flushes the
//! endpoint (at most `handshake_timeout`), closes it if it is the end's own, waits until UCX is
//! done with the end's buffers and gives its ids back; an end whose buffers UCX still holds
//! then (a peer that never let a send complete) is never freed rather than freed under UCX.
//! Endpoints use UCX's peer error handling: a peer that dies, hangs up
//! or becomes unreachable fails the endpoint, reported as
//! [`PeerGoneError::Died`](crate::PeerGoneError::Died) (for a receiver, once the
//! frames that arrived are received). How fast a silent network failure is noticed follows
//! UCX's keepalive settings (`UCX_KEEPALIVE_INTERVAL`, TCP keepalive).
//!
//! # Waiting and threads
//!
//! Busy polling spins on `ucp_worker_progress`. Adaptive waiting spins for the configured time,
//! then arms the shared worker (`ucp_worker_arm`; "busy" means progress again first), marks the
//! half asleep and sleeps in `poll` on an eventfd of the half's own: never on the worker's event
//! descriptor, which every connection's traffic in the process makes readable. Any thread's
//! progress may run any end's callbacks, and a callback that receives something for a sleeping
//! half writes that half's eventfd; so an idle half uses no CPU however busy the process's
//! other connections are.
//!
//! While any half or listener sleeps, the process's wake thread (`watch`) sleeps on the shared
//! worker's descriptor, armed, and progresses the worker under the lock when it fires, so that
//! the callbacks of sleeping halves run with nobody else progressing. It is kicked (an eventfd
//! write) when a half goes to sleep while it does not watch, and sleeps on the kick alone when
//! no half sleeps. Threads that busy-poll do not pay for it: when it finds that another thread
//! progressed the worker since it was last armed, and still does, it leaves the worker and the
//! lock to them and looks again a millisecond later, taking over once they stopped; counting
//! progress calls costs a plain increment under the lock already held. Lock order: the shared
//! worker's lock, then nothing (the thread holds no other lock).
//!
//! A receiving half can also be armed for a caller that sleeps on many descriptors (the host's
//! progress engine): [`FrameReceiver::arm`](crate::FrameReceiver::arm) returns
//! credits, arms the shared worker and marks the half asleep; its one wake descriptor is the
//! half's eventfd. `ucp_worker_arm` answers "busy" when events are waiting, so an armed half
//! never misses a wake-up and is never `fresh`. A listener counts as asleep as long as it
//! lives (its descriptor is its own eventfd, written when a request or hello arrives).
//!
//! # UCX 1.13's queued events
//!
//! UCX before 1.18 keeps an event that its progress thread could not hand to a worker at once
//! (the worker was inside a UCX call) in a queue of that worker's async context, by descriptor
//! number, and delivers it on the worker's next progress call to whichever handler then holds
//! that number. With UCX's assertions on (Debian's build) it aborts the process when that
//! handler belongs to another worker (`Assertion 'handler->async == async' failed`): a
//! descriptor closed by one worker and reused by another's socket, as happened when every
//! connection had a worker of its own and a process opened and closed many. Upstream dropped
//! queued events with their handler in 1.18. With every connection and listener on the one
//! shared worker, a reused number meets a handler of the same context, which UCX allows (the
//! handler finds nothing to do). UCX 1.13 also caps a worker's async handlers at 1,024
//! (`UCX_ASYNC_MAX_EVENTS`): connections by worker address share one endpoint (a socket or
//! two) per peer process; each connection by socket address holds two or three sockets a side.
//!
//! # Exit
//!
//! UCX tears its global state down after the process's exit handlers; a worker still alive then
//! (while UCX's progress thread calls into it) can crash the exit. Ends lingering on their own
//! threads therefore close at once when the process exits: an exit handler registered with the
//! first lingering end wakes them and waits (at most two seconds) until they are retired; then
//! the shared worker's exit handler takes its lock for good (a thread still using a connection,
//! and the wake thread, wait until the process is gone) and destroys it. Connections and listeners the application
//! still holds at exit are the application's to drop first.

//! # Peer workers and host memory
//!
//! Plugins that talk worker to worker (the sandbox plugin's tagged sends and receives) and
//! hosts whose memory workers reach use a second process-wide context, with tag matching,
//! remote memory access, 64-bit atomics and wake-up. A [`PeerWorker`] runs each tagged send or
//! receive in an operation slot it owns (a buffer reused from one operation to the next) and
//! hands completions out of its progress; remote memory access waits for completion until a
//! deadline. [`MappedMemory`] is host memory mapped with `ucp_mem_map`, with its packed remote
//! key; its [`HostMemoryWorker`] must be progressed by the host (its progress engine does it)
//! for peers' access to complete over TCP, where UCX emulates RMA with active messages. Memory
//! handles are exported (and imported) only where [`exported_memh_supported`] (UCX >= 1.15 and
//! a transport that exports, mlx5); elsewhere a mapped buffer has none to give, and the context
//! does not ask for the feature.

mod conn;
mod handshake;
mod peer;
mod state;
mod ucp;
mod watch;

pub use conn::{UcxConnection, UcxReceiver, UcxSender};
pub use handshake::{Door, MAX_SLOT_BYTES, UcxConnectError, UcxListener};
pub use peer::{
    Completion, HostMemoryWorker, ImportParams, MappedMemory, NO_EXPORTED_MEMH, OperationKind,
    OutOfBounds, PeerId, PeerWorker, RemoteKeyId, RemoteMemory, SlotId, UcxError,
    exported_memh_supported,
};
pub use ucp::set_config_defaults;
