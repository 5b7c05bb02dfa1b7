//! Setting up a connection: the listener, the connecting side, and the hello and answer they
//! exchange (see the module documentation of `ucx` for the steps).

use core::fmt;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::io::{ErrorKind, Write};
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, ppoll};
use nix::sys::time::TimeSpec;
use ucx_sys as sys;
use urom_wire::DecodeError;
use urom_wire::ucx::{UCX_HANDSHAKE_VERSION, UcxAnswerRepr, UcxAnswerStatus, UcxHelloRepr};

use super::conn::{EpKind, Link, UcxConnection};
use super::state::{self, AM_HANDSHAKE, MAX_HANDSHAKE_LEN, RX};
use super::ucp::{self, AM_SOCKET_HELLO, Armed, Remote};
use crate::ChannelConfig;
use crate::shm::{MAX_SLOTS, MIN_SLOTS};
use crate::stream::{StreamReader, StreamWriter};

/// Most bytes of receive slots (slots times the maximum message size) one direction of a
/// connection may take.
pub const MAX_SLOT_BYTES: u64 = 1 << 30;
/// Most connection requests a listener keeps waiting for `accept`; more are refused.
const MAX_PENDING: usize = 128;

/// Why a UCX connection or listener could not be set up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UcxConnectError {
    /// A UCX call failed.
    Ucx {
        /// The call.
        op: &'static str,
        /// UCX's status code (`ucs_status_t`).
        status: i8,
    },
    /// A system call failed.
    Sys {
        /// The call.
        op: &'static str,
        /// What the OS said.
        errno: Errno,
    },
    /// The listener could not be set up on this address.
    Listen {
        /// The address, as text.
        address: String,
        /// UCX's status code.
        status: i8,
    },
    /// The peer could not be reached, or hung up during the handshake.
    Unreachable {
        /// The address, as text.
        address: String,
        /// UCX's status code.
        status: i8,
    },
    /// The two sides were configured with different maximum message sizes.
    MaxMsgSizeMismatch {
        /// This side's maximum message size.
        ours: u32,
        /// The peer's maximum message size.
        theirs: u32,
    },
    /// A slot count (ours or the peer's) is out of range.
    Slots {
        /// The slot count.
        found: u32,
    },
    /// The peer speaks another version of the handshake.
    Version {
        /// The version the peer speaks.
        found: u32,
    },
    /// The peer does not speak this handshake, or did not answer in time.
    Handshake(&'static str),
    /// The peer refused the connection.
    Refused(&'static str),
    /// The authenticated stream the two sides set the connection up through failed.
    Door(String),
}

impl fmt::Display for UcxConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ucx { op, status } => {
                write!(f, "UCX setup failed in {op}: {}", sys::status_text(*status))
            }
            Self::Sys { op, errno } => write!(f, "UCX connection setup failed in {op}: {errno}"),
            Self::Listen { address, status } => write!(
                f,
                "cannot listen for UCX connections on {address}: {}",
                sys::status_text(*status)
            ),
            Self::Unreachable { address, status } => write!(
                f,
                "{address}: cannot connect over UCX: {} (is a urom listener there, and do \
                 UCX_TLS / UCX_NET_DEVICES allow reaching it?)",
                sys::status_text(*status)
            ),
            Self::MaxMsgSizeMismatch { ours, theirs } => write!(
                f,
                "maximum message size mismatch: this side uses {ours} bytes, the peer {theirs}; \
                 configure both the same"
            ),
            Self::Slots { found } => write!(
                f,
                "slot count {found} is out of range: between {MIN_SLOTS} and {MAX_SLOTS}, and at \
                 most {MAX_SLOT_BYTES} bytes of slots per direction"
            ),
            Self::Version { found } => write!(
                f,
                "peer speaks version {found} of the UCX handshake, this build \
                 {UCX_HANDSHAKE_VERSION} (different urom versions?)"
            ),
            Self::Handshake(what) => write!(f, "UCX handshake failed: {what}"),
            Self::Refused(what) => write!(f, "peer refused the UCX connection: {what}"),
            Self::Door(what) => write!(f, "setting up the UCX connection failed: {what}"),
        }
    }
}

impl core::error::Error for UcxConnectError {}

/// Whether `slots` slots of `max` bytes are acceptable for one direction.
fn slots_ok(slots: u32, max: usize) -> bool {
    (MIN_SLOTS..=MAX_SLOTS).contains(&slots) && u64::from(slots) * max as u64 <= MAX_SLOT_BYTES
}

fn check_config(config: &ChannelConfig) -> Result<(), UcxConnectError> {
    if slots_ok(config.slots, config.max_msg_size.get()) {
        Ok(())
    } else {
        Err(UcxConnectError::Slots {
            found: config.slots,
        })
    }
}

/// Why waiting for a handshake message ended without one.
enum Waited {
    /// The endpoint failed (UCX's status).
    Failed(i8),
    TimedOut,
}

/// Waits, progressing the shared worker, until a handshake message for `link`'s end arrives;
/// `by_ep`: a hello sent to the process's socket-hello id over the end's endpoint.
fn wait_message(link: &Link, until: Instant, by_ep: bool) -> Result<Vec<u8>, Waited> {
    loop {
        let mut held = link.lock();
        let ucp = held.ucp();
        ucp.state().awake(RX);
        ucp.worker.progress_all();
        let ep = ucp.ep;
        let state = ucp.state();
        if let Some(bytes) = state.handshake_in.take() {
            return Ok(bytes);
        }
        if by_ep && let Some(bytes) = state::take_socket_hello(ep) {
            return Ok(bytes);
        }
        if let Some(status) = state.failed {
            return Err(Waited::Failed(status));
        }
        let now = Instant::now();
        if now >= until {
            return Err(Waited::TimedOut);
        }
        let armed = ucp.worker.arm();
        if let Armed::Yes = armed {
            ucp.state().sleep(RX);
        }
        drop(held);
        if let Armed::Yes = armed {
            // A socket hello wakes no end (another thread's progress may take it): look again
            // soon.
            let left = until - now;
            link.sleep(
                RX,
                Some(if by_ep {
                    left.min(SOCKET_HELLO_POLL)
                } else {
                    left
                }),
            );
        }
    }
}

/// How often an accepting end waiting for a hello by socket looks whether it came.
const SOCKET_HELLO_POLL: Duration = Duration::from_millis(5);

/// Sleeps until `fd` is readable or `timeout` passes.
fn poll_one(fd: BorrowedFd<'_>, timeout: Duration) {
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    if let Err(e) = ppoll(&mut fds, Some(TimeSpec::from_duration(timeout)), None) {
        if e != Errno::EINTR {
            // Polling a valid descriptor does not fail otherwise; do not spin on it.
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Sends a handshake message to the active message `id` on `link`'s endpoint, keeping its bytes
/// in the end's state until the end is retired. With `until`, waits until then for the message
/// to leave.
fn send_message(
    link: &Link,
    id: u32,
    bytes: Vec<u8>,
    flags: u32,
    until: Option<Instant>,
) -> Result<(), i8> {
    let mut held = link.lock();
    let ucp = held.ucp();
    let ep = ucp.ep;
    let state = ucp.state();
    // Never send on an endpoint known to have failed: UCX (1.22 at least) spins forever in a
    // send on an endpoint that failed before it connected, here a refused connection noticed
    // while another link progressed the shared worker. Failures are recorded under the lock
    // held here, so none slips in between.
    if let Some(status) = state.failed {
        return Err(status);
    }
    let (at, len) = (bytes.as_ptr(), bytes.len());
    // The Vec's heap buffer does not move with it: the bytes stay where they are, unchanged,
    // until the state is freed.
    state.handshake_out.push(bytes);
    // SAFETY: `len` bytes at `at`, kept in the state as said above; UCX's callbacks, which run
    // inside the send, reach only the state's own fields, never that buffer.
    let data = unsafe { std::slice::from_raw_parts(at, len) };
    // SAFETY: `ep` is a live endpoint of the shared worker, whose lock is held; `data` lives
    // until the state is freed, after every send of the end completed.
    let request = unsafe { ucp::am_send(ep, id, &[], data, flags, ucp::Completion::Later) };
    match until {
        None => {
            let sent = ucp::detach_request(request);
            drop(held);
            sent
        }
        Some(until) => {
            drop(held);
            ucp::wait_unlocked(request, Some(until))
        }
    }
}

/// Gives `link`'s end an endpoint of its own to `remote`, whose failure the end's state
/// records; returns the end's active-message base.
///
/// # Safety
///
/// A connection request must not have been used before.
unsafe fn open_own_ep(link: &Link, remote: Remote<'_>) -> Result<u32, sys::ucs_status_t> {
    let mut held = link.lock();
    let ucp = held.ucp();
    let arg = ucp.state.as_ptr().cast();
    // SAFETY: the state outlives the endpoint (the end is retired after closing it); the
    // caller guarantees a request's first use.
    ucp.ep = unsafe { ucp::create_ep(&ucp.worker, remote, state::on_ep_error, arg) }?;
    ucp.kind = EpKind::Own;
    Ok(ucp.am_base)
}

impl UcxConnection {
    /// Connects to the [`UcxListener`] at `addr` and sets up a connection with the settings of
    /// `config` (which the listener's must match), within `config.handshake_timeout`.
    pub fn connect(addr: SocketAddr, config: &ChannelConfig) -> Result<Self, UcxConnectError> {
        check_config(config)?;
        let address = addr.to_string();
        let until = Instant::now() + config.handshake_timeout;
        let link = Link::new(config)?;
        // SAFETY: no connection request.
        let am_base = unsafe { open_own_ep(&link, Remote::Socket(addr)) }.map_err(|status| {
            UcxConnectError::Unreachable {
                address: address.clone(),
                status,
            }
        })?;
        let hello = hello_bytes(config, &[], am_base);
        send_message(
            &link,
            AM_SOCKET_HELLO,
            hello,
            sys::UCP_AM_SEND_FLAG_REPLY,
            None,
        )
        .map_err(|status| UcxConnectError::Unreachable {
            address: address.clone(),
            status,
        })?;
        let answer = wait_message(&link, until, false).map_err(|w| match w {
            Waited::Failed(status) => UcxConnectError::Unreachable { address, status },
            Waited::TimedOut => UcxConnectError::Handshake("the listener did not answer in time"),
        })?;
        finish(link, &answer, config, false)
    }

    /// Connects to a [`UcxListener`] by the UCX address of its worker
    /// ([`UcxListener::worker_address`]) rather than a socket address.
    pub fn connect_worker(address: &[u8], config: &ChannelConfig) -> Result<Self, UcxConnectError> {
        check_config(config)?;
        const WHERE: &str = "the listener's UCX worker address";
        let Some((address, id)) = address.split_last_chunk::<4>() else {
            return Err(UcxConnectError::Handshake(
                "a listener's worker address is longer",
            ));
        };
        let id = u32::from_le_bytes(*id);
        let until = Instant::now() + config.handshake_timeout;
        let link = Link::new(config)?;
        let own = ucp::shared_address()?;
        let am_base = {
            let mut held = link.lock();
            let (shared, ucp) = held.parts();
            ucp.attach_peer(shared, address)
                .map_err(|status| UcxConnectError::Unreachable {
                    address: WHERE.to_owned(),
                    status,
                })?;
            ucp.am_base
        };
        let hello = hello_bytes(config, own, am_base);
        send_message(&link, id, hello, 0, None).map_err(|status| UcxConnectError::Unreachable {
            address: WHERE.to_owned(),
            status,
        })?;
        let answer = wait_message(&link, until, false).map_err(|w| match w {
            Waited::Failed(status) => UcxConnectError::Unreachable {
                address: WHERE.to_owned(),
                status,
            },
            Waited::TimedOut => UcxConnectError::Handshake("the listener did not answer in time"),
        })?;
        finish(link, &answer, config, true)
    }

    /// Both ends of a connection in this process, through a listener on `127.0.0.1:0` (so
    /// `UCX_TLS` must allow TCP on the loopback interface), for tests and tools.
    pub fn pair(config: &ChannelConfig) -> Result<(Self, Self), UcxConnectError> {
        let mut listener = UcxListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)), config)?;
        let addr = listener.local_addr();
        let client_config = *config;
        let client = std::thread::spawn(move || Self::connect(addr, &client_config));
        let server = listener.accept(config.handshake_timeout);
        let client = client
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        match server? {
            Some(server) => Ok((server, client?)),
            None => Err(client.err().unwrap_or(UcxConnectError::Handshake(
                "the connection did not arrive in time",
            ))),
        }
    }
}

fn hello_bytes(config: &ChannelConfig, address: &[u8], am_base: u32) -> Vec<u8> {
    let hello = UcxHelloRepr {
        max_msg_size: config.max_msg_size.as_u32(),
        slots: config.slots,
        address,
        am_base,
    };
    let mut bytes = vec![0; hello.buffer_len()];
    // The buffer has the hello's length; a worker address fits a u32 length.
    let _ = hello.emit(&mut bytes);
    bytes
}

/// The connecting side's last step: reads the answer; with `reconnect`, moves the end to the
/// endpoint to the worker address it carries.
fn finish(
    link: Arc<Link>,
    answer: &[u8],
    config: &ChannelConfig,
    reconnect: bool,
) -> Result<UcxConnection, UcxConnectError> {
    let ours = config.max_msg_size.as_u32();
    let answer = UcxAnswerRepr::parse(answer).map_err(|_| {
        UcxConnectError::Handshake("the listener's answer is not a urom UCX answer")
    })?;
    match answer.status {
        UcxAnswerStatus::Ok => {}
        UcxAnswerStatus::Version => {
            return Err(UcxConnectError::Version {
                found: answer.max_msg_size,
            });
        }
        UcxAnswerStatus::MaxMsgSize => {
            return Err(UcxConnectError::MaxMsgSizeMismatch {
                ours,
                theirs: answer.max_msg_size,
            });
        }
        UcxAnswerStatus::Slots => {
            return Err(UcxConnectError::Refused(
                "it found our slot count out of range",
            ));
        }
        _ => return Err(UcxConnectError::Refused("it could not set up its end")),
    }
    if answer.max_msg_size != ours {
        return Err(UcxConnectError::MaxMsgSizeMismatch {
            ours,
            theirs: answer.max_msg_size,
        });
    }
    if !slots_ok(answer.slots, config.max_msg_size.get()) {
        return Err(UcxConnectError::Slots {
            found: answer.slots,
        });
    }
    if reconnect {
        connect_to_worker(&link, answer.address, "the connection's UCX worker address")?;
    }
    Ok(UcxConnection::from_link(
        link,
        answer.am_base,
        answer.slots as usize,
        config,
    ))
}

/// Puts `link`'s end on the endpoint to the peer's UCX worker `address` (`what` names it in an
/// error).
fn connect_to_worker(link: &Link, address: &[u8], what: &str) -> Result<(), UcxConnectError> {
    let mut held = link.lock();
    let (shared, ucp) = held.parts();
    ucp.attach_peer(shared, address)
        .map_err(|status| UcxConnectError::Unreachable {
            address: what.to_owned(),
            status,
        })
}

/// What arrived at a listener and waits for `accept`.
struct Pending {
    listener: sys::ucp_listener_h,
    /// Connection requests on the socket address.
    requests: VecDeque<sys::ucp_conn_request_h>,
    /// Hellos sent to the listener's worker address.
    hellos: VecDeque<Vec<u8>>,
    /// Written when something arrives (another thread's progress may have received it).
    waker: RawFd,
}

/// A connection request arrived on the listener's socket.
///
/// # Safety
///
/// Called by UCX only, from the shared worker's progress; `arg` is the listener's [`Pending`].
unsafe extern "C" fn on_conn_request(request: sys::ucp_conn_request_h, arg: *mut c_void) {
    // SAFETY: the listener's `Pending`, which outlives its UCX listener and its ids; UCX calls
    // back only inside calls into the shared worker, under its lock, and the listener touches
    // its `Pending` only under that lock too.
    let pending = unsafe { &mut *arg.cast::<Pending>() };
    if pending.requests.len() >= MAX_PENDING {
        // SAFETY: a request of this listener, handed back once.
        let _ = unsafe { sys::ucp_listener_reject(pending.listener, request) };
        return;
    }
    let pushed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        pending.requests.push_back(request)
    }));
    if pushed.is_err() {
        // SAFETY: as above.
        let _ = unsafe { sys::ucp_listener_reject(pending.listener, request) };
        return;
    }
    // SAFETY: the listener's eventfd, open while its `Pending` is registered.
    crate::sys::wake(unsafe { BorrowedFd::borrow_raw(pending.waker) });
}

/// A hello arrived at the listener's worker address.
///
/// # Safety
///
/// Called by UCX only, with the arguments it documents; `arg` is the listener's [`Pending`].
unsafe extern "C" fn on_listener_hello(
    arg: *mut c_void,
    _header: *const c_void,
    _header_length: usize,
    data: *mut c_void,
    length: usize,
    param: *const sys::ucp_am_recv_param_t,
) -> sys::ucs_status_t {
    // SAFETY: UCX passes valid receive parameters.
    let attr = unsafe { (*param).recv_attr };
    if attr & sys::UCP_AM_RECV_ATTR_FLAG_RNDV != 0 {
        return sys::UCS_ERR_REJECTED;
    }
    // SAFETY: as in `on_conn_request`.
    let pending = unsafe { &mut *arg.cast::<Pending>() };
    if length > MAX_HANDSHAKE_LEN || data.is_null() || pending.hellos.len() >= MAX_PENDING {
        return sys::UCS_OK;
    }
    // SAFETY: UCX passes `length` readable bytes at `data`, valid during this call.
    let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), length) };
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        pending.hellos.push_back(bytes.to_vec())
    }));
    // SAFETY: the listener's eventfd, open while its `Pending` is registered.
    crate::sys::wake(unsafe { BorrowedFd::borrow_raw(pending.waker) });
    sys::UCS_OK
}

/// A [`Pending`] at a fixed heap address, freed on drop (after the listener and its ids are
/// gone from the shared worker).
struct PendingBox(*mut Pending);

impl PendingBox {
    /// The pending queue; `_held` proves the shared worker's lock is held, under which alone
    /// UCX calls back into it.
    fn get<'a>(&'a mut self, _held: &'a mut ucp::Guard) -> &'a mut Pending {
        // SAFETY: from Box::into_raw, live until drop; `&mut self` excludes other users of the
        // box, and the lock (borrowed for as long) keeps UCX's callbacks out.
        unsafe { &mut *self.0 }
    }
}

impl Drop for PendingBox {
    fn drop(&mut self) {
        // SAFETY: from Box::into_raw, freed once; nothing of UCX's calls back into it any more.
        drop(unsafe { Box::from_raw(self.0) });
    }
}

/// Accepts UCX connections on a socket address (and on its worker's UCX address).
///
/// The listener, like every connection end of the process, lives on the process's shared UCX
/// worker. Its descriptor ([`AsFd`]) becomes readable when a connection request may be
/// waiting, once `accept` returned `None`: poll it together with other descriptors, then call
/// `accept(Duration::ZERO)`.
///
/// INVARIANTS: `listener` is a live listener of the shared worker; `pending` is registered with
/// it and with the ids from `am_base`, and outlives both (fields drop in declaration order,
/// after `drop` destroyed the listener and gave the ids back); `waker` is `pending`'s eventfd,
/// and the listener counts as a sleeper for the wake thread while it lives.
pub struct UcxListener {
    listener: sys::ucp_listener_h,
    config: ChannelConfig,
    local_addr: SocketAddr,
    address: Vec<u8>,
    am_base: u32,
    pending: PendingBox,
    waker: OwnedFd,
}

// SAFETY: the listener is used only through `&mut self` or on drop, under the shared worker's
// lock; `Pending` is touched only then and in UCX's callbacks, which run under that lock too.
unsafe impl Send for UcxListener {}

impl UcxListener {
    /// Listens on `addr` (port 0: any free port, see [`UcxListener::local_addr`]) for
    /// connections with the settings of `config`.
    pub fn bind(addr: SocketAddr, config: &ChannelConfig) -> Result<Self, UcxConnectError> {
        check_config(config)?;
        let waker = crate::sys::wake_event().map_err(|errno| UcxConnectError::Sys {
            op: "eventfd",
            errno,
        })?;
        let mut guard = ucp::try_lock()?;
        let worker = guard.worker();
        let am_base = guard.take_ids()?;
        let pending = PendingBox(Box::into_raw(Box::new(Pending {
            listener: std::ptr::null_mut(),
            requests: VecDeque::new(),
            hellos: VecDeque::new(),
            waker: waker.as_raw_fd(),
        })));
        let arg = pending.0.cast::<c_void>();
        // SAFETY: `pending` outlives the handler (given back on drop, before it is freed).
        let registered =
            unsafe { worker.set_handler(am_base + AM_HANDSHAKE, on_listener_hello, arg) };
        if let Err(e) = registered {
            guard.give_ids(am_base);
            return Err(e);
        }
        let sockaddr = ucp::raw_sockaddr(addr);
        let params = sys::ucp_listener_params_t {
            field_mask: sys::UCP_LISTENER_PARAM_FIELD_SOCK_ADDR
                | sys::UCP_LISTENER_PARAM_FIELD_CONN_HANDLER,
            sockaddr: sys::ucs_sock_addr_t {
                addr: (&raw const sockaddr.0).cast(),
                addrlen: sockaddr.1,
            },
            accept_handler: sys::ucp_listener_accept_handler_t {
                cb: None,
                arg: std::ptr::null_mut(),
            },
            conn_handler: sys::ucp_listener_conn_handler_t {
                cb: Some(on_conn_request),
                arg,
            },
        };
        let mut listener: sys::ucp_listener_h = std::ptr::null_mut();
        // SAFETY: the worker is live, its lock held; `params` and the socket address it points
        // to live for the call; `pending` outlives the listener; `listener` is a valid place.
        let status = unsafe { sys::ucp_listener_create(worker.raw(), &params, &mut listener) };
        if let Err(status) = ucp::check(status) {
            guard.give_ids(am_base);
            return Err(UcxConnectError::Listen {
                address: addr.to_string(),
                status,
            });
        }
        let mut pending = pending;
        pending.get(&mut guard).listener = listener;
        drop(guard);
        let mut address = ucp::shared_address()?.to_vec();
        address.extend_from_slice(&(am_base + AM_HANDSHAKE).to_le_bytes());
        let mut this = Self {
            listener,
            config: *config,
            local_addr: addr,
            address,
            am_base,
            pending,
            waker,
        };
        // SAFETY: all-zero is a valid `ucp_listener_attr_t`.
        let mut attr: sys::ucp_listener_attr_t = unsafe { std::mem::zeroed() };
        attr.field_mask = sys::UCP_LISTENER_ATTR_FIELD_SOCKADDR;
        let guard = ucp::lock();
        // Counted as a sleeper for good (until dropped): whenever nobody else progresses the
        // worker, the wake thread does, and a request or hello for the listener writes its
        // descriptor.
        super::watch::sleeper_in();
        // SAFETY: the listener is live, the lock held; `attr` is a valid place for the answer.
        let status = unsafe { sys::ucp_listener_query(this.listener, &mut attr) };
        drop(guard);
        ucp::check(status).map_err(|status| UcxConnectError::Ucx {
            op: "ucp_listener_query",
            status,
        })?;
        if let Some(bound) = ucp::socket_addr(&attr.sockaddr) {
            this.local_addr = bound;
        }
        // Leave the worker armed, so the descriptor means something before the first accept.
        let mut guard = ucp::lock();
        this.progress_and_arm(&mut guard);
        Ok(this)
    }

    /// The address it listens on, with the real port when bound to port 0.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The UCX address of the listener's worker, for [`UcxConnection::connect_worker`] (the
    /// shared worker's, with the listener's active-message id after it).
    pub fn worker_address(&self) -> &[u8] {
        &self.address
    }

    /// Progresses the shared worker until something waits for `accept` or the worker is armed.
    fn progress_and_arm(&mut self, guard: &mut ucp::Guard) {
        crate::sys::drain(self.waker.as_fd());
        let worker = guard.worker();
        loop {
            worker.progress_all();
            let pending = self.pending.get(guard);
            if !pending.requests.is_empty() || !pending.hellos.is_empty() {
                return;
            }
            if let Armed::Yes = worker.arm() {
                return;
            }
        }
    }

    /// Waits up to `timeout` for a connection and sets it up (within the configuration's
    /// handshake timeout); `Ok(None)` when none arrived.
    ///
    /// A peer that fails the handshake (another maximum message size, no answer) is an error
    /// for this call only: the listener goes on accepting.
    pub fn accept(&mut self, timeout: Duration) -> Result<Option<UcxConnection>, UcxConnectError> {
        let end = Instant::now().checked_add(timeout);
        loop {
            let mut guard = ucp::lock();
            self.progress_and_arm(&mut guard);
            let pending = self.pending.get(&mut guard);
            if let Some(request) = pending.requests.pop_front() {
                drop(guard);
                return self.accept_request(request).map(Some);
            }
            if let Some(hello) = pending.hellos.pop_front() {
                drop(guard);
                return self.accept_hello(&hello).map(Some);
            }
            drop(guard);
            let now = Instant::now();
            let left = match end {
                Some(end) if now >= end => return Ok(None),
                Some(end) => end - now,
                None => Duration::from_secs(3600),
            };
            poll_one(self.waker.as_fd(), left);
        }
    }

    /// Sets up a connection from a request on the socket address: an endpoint from the
    /// request, then the hello and the answer.
    fn accept_request(
        &mut self,
        request: sys::ucp_conn_request_h,
    ) -> Result<UcxConnection, UcxConnectError> {
        let until = Instant::now() + self.config.handshake_timeout;
        let link = match Link::new(&self.config) {
            Ok(link) => link,
            Err(e) => {
                let _guard = ucp::lock();
                // SAFETY: a request of this listener, not used before, handed back once.
                let _ = unsafe { sys::ucp_listener_reject(self.listener, request) };
                return Err(e);
            }
        };
        // SAFETY: the request is used once, here.
        unsafe { open_own_ep(&link, Remote::Request(request)) }.map_err(|status| {
            UcxConnectError::Ucx {
                op: "ucp_ep_create",
                status,
            }
        })?;
        let hello = wait_message(&link, until, true).map_err(|w| match w {
            Waited::Failed(status) => UcxConnectError::Unreachable {
                address: "the connecting peer".to_owned(),
                status,
            },
            Waited::TimedOut => UcxConnectError::Handshake("no hello arrived in time"),
        })?;
        answer(
            link,
            &hello,
            &self.config,
            false,
            until,
            &mut reply_over_ucx,
        )
    }

    /// Sets up a connection from a hello sent to the worker address: the end on the endpoint
    /// to the address the hello carries, then the answer.
    fn accept_hello(&mut self, hello: &[u8]) -> Result<UcxConnection, UcxConnectError> {
        let address = match UcxHelloRepr::parse(hello) {
            Ok(parsed) => parsed.address,
            Err(_) => {
                return Err(UcxConnectError::Handshake(
                    "a message to the listener's worker that is not a urom UCX hello",
                ));
            }
        };
        let until = Instant::now() + self.config.handshake_timeout;
        let link = Link::new(&self.config)?;
        connect_to_worker(&link, address, "the connecting peer's UCX worker address")?;
        answer(link, hello, &self.config, true, until, &mut reply_over_ucx)
    }
}

/// How the accepting side's answer leaves: the bytes, the peer end's first id, and until when
/// to wait for them to leave (`None`: do not wait).
type Reply<'a> =
    dyn FnMut(&Link, Vec<u8>, u32, Option<Instant>) -> Result<(), UcxConnectError> + 'a;

/// Sends an answer on the connection's own endpoint, to the peer end's handshake id.
fn reply_over_ucx(
    link: &Link,
    bytes: Vec<u8>,
    peer_am: u32,
    until: Option<Instant>,
) -> Result<(), UcxConnectError> {
    send_message(link, peer_am + AM_HANDSHAKE, bytes, 0, until).map_err(|status| {
        UcxConnectError::Unreachable {
            address: "the connecting peer".to_owned(),
            status,
        }
    })
}

/// The handshake id of a peer whose hello could not be read: from where a hello keeps its
/// `am_base`, or the one fixed id of version 2 (each end on a worker of its own).
fn legacy_handshake_base(hello: &[u8]) -> u32 {
    const V2_HANDSHAKE_ID: u32 = 3;
    match hello.get(24..28) {
        Some(&[a, b, c, d]) if u32::from_le_bytes([a, b, c, d]) >= 16 => {
            u32::from_le_bytes([a, b, c, d])
        }
        _ => V2_HANDSHAKE_ID - AM_HANDSHAKE,
    }
}

/// The accepting side's last step: checks the hello and answers it through `reply`, waiting
/// until `until` for the answer to leave (the peer waits for it).
fn answer(
    link: Arc<Link>,
    hello: &[u8],
    config: &ChannelConfig,
    with_address: bool,
    until: Instant,
    reply: &mut Reply<'_>,
) -> Result<UcxConnection, UcxConnectError> {
    let ours = config.max_msg_size.as_u32();
    let am_base = link.lock().ucp().am_base;
    let mut reply = |status, max_msg_size, address: &[u8], peer_am, wait| {
        let answer = UcxAnswerRepr {
            status,
            max_msg_size,
            slots: config.slots,
            address,
            am_base,
        };
        let mut bytes = vec![0; answer.buffer_len()];
        // The buffer has the answer's length; a worker address fits a u32 length.
        let _ = answer.emit(&mut bytes);
        reply(&link, bytes, peer_am, wait)
    };
    let parsed = match UcxHelloRepr::parse(hello) {
        Ok(hello) => hello,
        Err(DecodeError::UnsupportedFormatVersion { found, .. }) => {
            let _ = reply(
                UcxAnswerStatus::Version,
                UCX_HANDSHAKE_VERSION,
                &[],
                legacy_handshake_base(hello),
                None,
            );
            return Err(UcxConnectError::Version { found });
        }
        Err(_) => {
            return Err(UcxConnectError::Handshake(
                "the peer's first message is not a urom UCX hello",
            ));
        }
    };
    let peer_am = parsed.am_base;
    if parsed.max_msg_size != ours {
        let _ = reply(UcxAnswerStatus::MaxMsgSize, ours, &[], peer_am, None);
        return Err(UcxConnectError::MaxMsgSizeMismatch {
            ours,
            theirs: parsed.max_msg_size,
        });
    }
    if !slots_ok(parsed.slots, config.max_msg_size.get()) {
        let _ = reply(UcxAnswerStatus::Slots, ours, &[], peer_am, None);
        return Err(UcxConnectError::Slots {
            found: parsed.slots,
        });
    }
    let address: &[u8] = if with_address {
        ucp::shared_address()?
    } else {
        &[]
    };
    reply(UcxAnswerStatus::Ok, ours, address, peer_am, Some(until))?;
    Ok(UcxConnection::from_link(
        link,
        peer_am,
        parsed.slots as usize,
        config,
    ))
}

/// The two halves of an authenticated stream (a worker's front door) that a connection is set
/// up through.
pub type Door = (StreamReader, StreamWriter);

impl UcxConnection {
    /// Sets up a connection with the peer at the other end of `door`, a stream on which both
    /// already proved who they are ([`auth::prove`](crate::auth::prove)): sends this end's
    /// settings and UCX worker address through it, and connects to the address the peer
    /// answers with. No byte of a peer that did not prove itself ever reaches UCX's connection
    /// handling, and the addresses travel under the stream's integrity check.
    pub fn connect_through(
        door: &mut Door,
        config: &ChannelConfig,
    ) -> Result<Self, UcxConnectError> {
        check_config(config)?;
        let until = Instant::now() + config.handshake_timeout;
        let link = Link::new(config)?;
        let own = ucp::shared_address()?;
        let am_base = link.lock().ucp().am_base;
        send_through(&mut door.1, &hello_bytes(config, own, am_base))?;
        let answer = receive_through(&mut door.0, until)?;
        finish(link, &answer, config, true)
    }

    /// The accepting side of [`UcxConnection::connect_through`]: reads the peer's settings and
    /// UCX worker address from `door`, puts a new end on the endpoint to it and answers with
    /// this process's worker address.
    pub fn accept_through(
        door: &mut Door,
        config: &ChannelConfig,
    ) -> Result<Self, UcxConnectError> {
        check_config(config)?;
        let until = Instant::now() + config.handshake_timeout;
        let hello = receive_through(&mut door.0, until)?;
        let address = UcxHelloRepr::parse(&hello)
            .map_err(|_| UcxConnectError::Handshake("the peer's hello is not a urom UCX hello"))?
            .address;
        let link = Link::new(config)?;
        connect_to_worker(&link, address, "the connecting peer's UCX worker address")?;
        let writer = &mut door.1;
        answer(link, &hello, config, true, until, &mut |_, bytes, _, _| {
            send_through(writer, &bytes)
        })
    }
}

/// Sends one handshake message through a door: its length (`u32`, little-endian), then it.
fn send_through(writer: &mut StreamWriter, message: &[u8]) -> Result<(), UcxConnectError> {
    let door = |e: std::io::Error| UcxConnectError::Door(e.to_string());
    // A handshake message is at most MAX_HANDSHAKE_LEN bytes.
    writer
        .write_all(&(message.len() as u32).to_le_bytes())
        .map_err(door)?;
    writer.write_all(message).map_err(door)
}

/// Reads one handshake message from a door, until `until`.
fn receive_through(reader: &mut StreamReader, until: Instant) -> Result<Vec<u8>, UcxConnectError> {
    let door = |e: std::io::Error| match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => {
            UcxConnectError::Handshake("the peer did not answer in time")
        }
        _ => UcxConnectError::Door(e.to_string()),
    };
    let mut len = [0; 4];
    reader
        .read_exact_until(&mut len, Some(until))
        .map_err(door)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_HANDSHAKE_LEN {
        return Err(UcxConnectError::Handshake(
            "the peer's handshake message is too long",
        ));
    }
    let mut message = vec![0; len];
    reader
        .read_exact_until(&mut message, Some(until))
        .map_err(door)?;
    Ok(message)
}

impl Drop for UcxListener {
    fn drop(&mut self) {
        let mut guard = ucp::lock();
        // Requests never accepted are refused, so their peers learn at once.
        while let Some(request) = self.pending.get(&mut guard).requests.pop_front() {
            // SAFETY: a request of this listener, not used before, handed back once.
            let _ = unsafe { sys::ucp_listener_reject(self.listener, request) };
        }
        // SAFETY: the listener is live (invariants) and destroyed once, under the lock; the
        // pending queue it calls back into is freed after this.
        unsafe { sys::ucp_listener_destroy(self.listener) };
        // Hellos that arrive later are dropped.
        guard.give_ids(self.am_base);
        super::watch::sleeper_out();
    }
}

impl AsFd for UcxListener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.waker.as_fd()
    }
}

impl AsRawFd for UcxListener {
    fn as_raw_fd(&self) -> RawFd {
        self.waker.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;
    use std::sync::mpsc;

    use super::*;

    /// A hello sent on an endpoint whose connection was refused before the send, as happens
    /// when another link's progress notices the refusal first, fails with the refusal; it once
    /// spun forever inside UCX 1.22.
    #[test]
    fn a_hello_on_an_endpoint_that_already_failed_fails() {
        ucp::set_config_defaults(&[("TLS", "tcp"), ("NET_DEVICES", "lo")]);
        // A port nobody listens on: bound, then given back.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let config = ChannelConfig::default();
        let link = Link::new(&config).unwrap();
        // SAFETY: no connection request.
        unsafe { open_own_ep(&link, Remote::Socket(addr)) }.unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut held = link.lock();
            let ucp = held.ucp();
            ucp.worker.progress_all();
            if ucp.state().failed.is_some() {
                break;
            }
            assert!(Instant::now() < deadline, "the refusal was never noticed");
            drop(held);
            std::thread::sleep(Duration::from_millis(1));
        }
        // On a thread of its own: a send that never returns fails the test rather than hang it.
        let (done, sent) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = done.send(send_message(&link, AM_SOCKET_HELLO, vec![0; 16], 0, None));
        });
        let sent = sent
            .recv_timeout(Duration::from_secs(30))
            .expect("a send on a failed endpoint never returned");
        assert!(sent.is_err(), "a send on a failed endpoint succeeded");
    }
}
