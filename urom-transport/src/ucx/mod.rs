//! The UCX transport (feature `ucx`): frames as UCP active messages, to a peer on this or
//! another machine, over whatever transports `UCX_TLS` / `UCX_NET_DEVICES` select (TCP,
//! RDMA, shared memory).
//!
//! * `ucp`: the process-wide UCP context and the workers, endpoints and requests;
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
//! # Handshake
//!
//! Every connection end has a UCP worker of its own (serialized mode), so a connection, or
//! each of its halves, can move to another thread. A [`UcxListener`] has a worker too, on
//! which it listens on a socket address; its worker's own UCX address can be published as
//! well ([`UcxListener::worker_address`]).
//!
//! By socket address ([`UcxConnection::connect`]):
//!
//! 1. the connecting side makes its worker and a client-server endpoint to the listener's
//!    address, and sends a hello (`urom_wire::ucx`): its maximum message size and its slot
//!    count;
//! 2. the listener's worker receives the connection request; `accept` makes a new worker and
//!    creates the server endpoint from the request on that worker, so the connection is
//!    between the two per-connection workers from the start;
//! 3. the accepting side checks the hello (version, maximum message size, slot count) and
//!    answers with a status, its own maximum message size and slot count. On a mismatch it
//!    answers with the reason and both sides fail with the same error
//!    ([`UcxConnectError::MaxMsgSizeMismatch`]).
//!
//! By worker address ([`UcxConnection::connect_worker`]):
//!
//! 1. the connecting side makes its worker and an endpoint to the listener's worker address,
//!    and sends a hello that also carries its own worker's address;
//! 2. `accept` makes a new worker, an endpoint from it to the address in the hello, and
//!    answers on it with its settings and the new worker's address;
//! 3. the connecting side creates its endpoint to that address (UCX pairs it with the
//!    accepting side's endpoint) and closes the one to the listener.
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
//! `send`, `recv`, `wait_*` or `check_peer` on either half, or sleeping on the receiving half's
//! wake descriptors, which wake for this too) until its frames are received, as every user of a
//! connection does; an end that is dropped lingers until the peer has them (see below).
//!
//! # Closing and failures
//!
//! Closing a half sends a control message: the sending half's carries how many frames it sent,
//! so the peer reports [`PeerGoneError::Closed`](crate::PeerGoneError::Closed) only
//! after receiving every one of them; the receiving half's tells the peer's sender to stop.
//! Dropping the last half flushes the endpoint (at most `handshake_timeout`), closes it and
//! destroys the worker. Endpoints use UCX's peer error handling: a peer that dies, hangs up
//! or becomes unreachable fails the endpoint, reported as
//! [`PeerGoneError::Died`](crate::PeerGoneError::Died) (for a receiver, once the
//! frames that arrived are received). How fast a silent network failure is noticed follows
//! UCX's keepalive settings (`UCX_KEEPALIVE_INTERVAL`, TCP keepalive).
//!
//! # Waiting and threads
//!
//! Busy polling spins on `ucp_worker_progress`. Adaptive waiting spins for the configured time,
//! then arms the worker (`ucp_worker_arm`) and sleeps in `poll` on the worker's event
//! descriptor; an idle connection uses no CPU. Both halves of one end share the worker: every
//! call into it is made under the end's lock (one atomic operation when uncontended). Since
//! either half's progress may run the other's callbacks, each half also sleeps on an eventfd of
//! its own, which the other half writes (only when the sleeping half asked for it) when it
//! received something for it.
//!
//! A receiving half can also be armed for a caller that sleeps on many descriptors (the host's
//! progress engine): [`FrameReceiver::arm`](crate::FrameReceiver::arm) returns
//! credits, arms the worker and marks the half asleep; its wake descriptors are the worker's
//! event descriptor and the half's eventfd. `ucp_worker_arm` answers "busy" when events are
//! waiting, so an armed half never misses a wake-up and is never `fresh`.
//!
//! # UCX 1.13's queued events
//!
//! UCX before 1.18 keeps an event that its progress thread could not hand to a worker at once
//! (the worker was inside a UCX call) in a queue of that worker, by descriptor number, and
//! delivers it on the worker's next progress call, even if meanwhile the descriptor was closed
//! and its number reused by another worker's socket, or moved to another worker. With UCX's
//! assertions on (Debian's build) that aborts the process (`Assertion 'handler->async ==
//! async' failed`); upstream dropped queued events with their handler in 1.18. The transport
//! stays out of the windows it controls: the listener handles its worker's queued events just
//! before a connection request's socket moves to the new connection's worker, and an end's
//! worker is destroyed without being progressed again once its endpoint is closed. An end whose
//! progress handles the peer's hang-up (a peer that died or closed first) while other threads
//! open connections can still meet it; that has been seen only under stress (threads opening
//! and closing hundreds of connections a second). Where that matters, use UCX 1.18 or later.
//!
//! # Exit
//!
//! UCX tears its global state down after the process's exit handlers; a worker still alive then
//! (while UCX's progress thread calls into it) can crash the exit. Ends lingering on their own
//! threads therefore close at once when the process exits: an exit handler registered with the
//! first lingering end wakes them and waits (at most two seconds) until their workers are gone.
//! Connections and listeners the application still holds at exit are the application's to
//! drop first.

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

pub use conn::{UcxConnection, UcxReceiver, UcxSender};
pub use handshake::{Door, MAX_SLOT_BYTES, UcxConnectError, UcxListener};
pub use peer::{
    Completion, HostMemoryWorker, ImportParams, MappedMemory, NO_EXPORTED_MEMH, OperationKind,
    OutOfBounds, PeerId, PeerWorker, RemoteKeyId, RemoteMemory, SlotId, UcxError,
    exported_memh_supported,
};
pub use ucp::set_config_defaults;
