//! Setting up a connection: the listener, the connecting side, and the hello and answer they
//! exchange (see the module documentation of `ucx` for the steps).

use core::fmt;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::io::{ErrorKind, Write};
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, ppoll};
use nix::sys::time::TimeSpec;
use ucx_sys as sys;
use urom_wire::DecodeError;
use urom_wire::ucx::{UCX_HANDSHAKE_VERSION, UcxAnswerRepr, UcxAnswerStatus, UcxHelloRepr};

use super::conn::{Ucp, UcxConnection};
use super::state::{self, AM_HANDSHAKE, MAX_HANDSHAKE_LEN};
use super::ucp::{self, Armed, Remote, Worker};
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

/// Waits on `ucp`'s worker until a handshake message arrives; `side` also watches the
/// endpoint to a listener's worker.
fn wait_message(ucp: &mut Ucp, until: Instant, side: bool) -> Result<Vec<u8>, Waited> {
    loop {
        ucp.worker.progress_all();
        let state = ucp.state();
        if let Some(bytes) = state.handshake_in.take() {
            return Ok(bytes);
        }
        if let Some(status) = state.failed {
            return Err(Waited::Failed(status));
        }
        if let (true, Some(status)) = (side, state.handshake_failed) {
            return Err(Waited::Failed(status));
        }
        let now = Instant::now();
        if now >= until {
            return Err(Waited::TimedOut);
        }
        if let Armed::Yes = ucp.worker.arm() {
            poll_one(ucp.worker.efd(), until - now);
        }
    }
}

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

/// Sends a handshake message on `ep`, keeping its bytes in the state until the worker is gone.
/// With `until`, waits until then for the message to leave.
fn send_message(
    ucp: &mut Ucp,
    ep: sys::ucp_ep_h,
    bytes: Vec<u8>,
    until: Option<Instant>,
) -> Result<(), i8> {
    let state = ucp.state();
    let (at, len) = (bytes.as_ptr(), bytes.len());
    // The Vec's heap buffer does not move with it: the bytes stay where they are, unchanged,
    // until the worker is destroyed.
    state.handshake_out.push(bytes);
    // SAFETY: `len` bytes at `at`, kept in the state as said above; UCX's callbacks, which run
    // inside the send, reach only the state's own fields, never that buffer.
    let data = unsafe { std::slice::from_raw_parts(at, len) };
    // SAFETY: `ep` is a live endpoint of this worker; `data` outlives the worker.
    unsafe {
        ucp.worker
            .send_detached(ep, AM_HANDSHAKE, &[], data, until.map(Some))
    }
}

impl UcxConnection {
    /// Connects to the [`UcxListener`] at `addr` and sets up a connection with the settings of
    /// `config` (which the listener's must match), within `config.handshake_timeout`.
    pub fn connect(addr: SocketAddr, config: &ChannelConfig) -> Result<Self, UcxConnectError> {
        check_config(config)?;
        let address = addr.to_string();
        let until = Instant::now() + config.handshake_timeout;
        let mut ucp = Ucp::new(config)?;
        let arg = ucp.state.as_ptr().cast();
        // SAFETY: the state outlives the endpoint (it is freed after the worker).
        ucp.ep =
            unsafe { ucp::create_ep(&ucp.worker, Remote::Socket(addr), state::on_ep_error, arg) }
                .map_err(|status| UcxConnectError::Unreachable {
                address: address.clone(),
                status,
            })?;
        let hello = hello_bytes(config, &[]);
        let ep = ucp.ep;
        send_message(&mut ucp, ep, hello, None).map_err(|status| UcxConnectError::Unreachable {
            address: address.clone(),
            status,
        })?;
        let answer = wait_message(&mut ucp, until, false).map_err(|w| match w {
            Waited::Failed(status) => UcxConnectError::Unreachable { address, status },
            Waited::TimedOut => UcxConnectError::Handshake("the listener did not answer in time"),
        })?;
        finish(ucp, &answer, config, false)
    }

    /// Connects to a [`UcxListener`] by the UCX address of its worker
    /// ([`UcxListener::worker_address`]) rather than a socket address.
    pub fn connect_worker(address: &[u8], config: &ChannelConfig) -> Result<Self, UcxConnectError> {
        check_config(config)?;
        const WHERE: &str = "the listener's UCX worker address";
        let until = Instant::now() + config.handshake_timeout;
        let mut ucp = Ucp::new(config)?;
        let arg = ucp.state.as_ptr().cast();
        // SAFETY: the state outlives the endpoint (it is freed after the worker).
        ucp.side_ep = unsafe {
            ucp::create_ep(
                &ucp.worker,
                Remote::Worker(address),
                state::on_handshake_ep_error,
                arg,
            )
        }
        .map_err(|status| UcxConnectError::Unreachable {
            address: WHERE.to_owned(),
            status,
        })?;
        let own = ucp.worker.address()?;
        let hello = hello_bytes(config, &own);
        let ep = ucp.side_ep;
        send_message(&mut ucp, ep, hello, None).map_err(|status| UcxConnectError::Unreachable {
            address: WHERE.to_owned(),
            status,
        })?;
        let answer = wait_message(&mut ucp, until, true).map_err(|w| match w {
            Waited::Failed(status) => UcxConnectError::Unreachable {
                address: WHERE.to_owned(),
                status,
            },
            Waited::TimedOut => UcxConnectError::Handshake("the listener did not answer in time"),
        })?;
        finish(ucp, &answer, config, true)
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

fn hello_bytes(config: &ChannelConfig, address: &[u8]) -> Vec<u8> {
    let hello = UcxHelloRepr {
        max_msg_size: config.max_msg_size.as_u32(),
        slots: config.slots,
        address,
    };
    let mut bytes = vec![0; hello.buffer_len()];
    // The buffer has the hello's length; a worker address fits a u32 length.
    let _ = hello.emit(&mut bytes);
    bytes
}

/// The connecting side's last step: reads the answer; with `reconnect`, connects to the
/// worker address it carries.
fn finish(
    mut ucp: Ucp,
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
        connect_to_worker(
            &mut ucp,
            answer.address,
            "the connection's UCX worker address",
        )?;
        ucp.close_side_ep();
    }
    ucp.state().set_peer_slots(answer.slots as usize);
    Ok(UcxConnection::from_ucp(ucp, config))
}

/// Makes `ucp`'s endpoint, to the peer's UCX worker `address` (`what` names it in an error).
fn connect_to_worker(ucp: &mut Ucp, address: &[u8], what: &str) -> Result<(), UcxConnectError> {
    let arg = ucp.state.as_ptr().cast();
    // SAFETY: the state outlives the endpoint (it is freed after the worker).
    ucp.ep = unsafe {
        ucp::create_ep(
            &ucp.worker,
            Remote::Worker(address),
            state::on_ep_error,
            arg,
        )
    }
    .map_err(|status| UcxConnectError::Unreachable {
        address: what.to_owned(),
        status,
    })?;
    Ok(())
}

/// What arrived at a listener and waits for `accept`.
struct Pending {
    listener: sys::ucp_listener_h,
    /// Connection requests on the socket address.
    requests: VecDeque<sys::ucp_conn_request_h>,
    /// Hellos sent to the listener's worker address.
    hellos: VecDeque<Vec<u8>>,
}

/// A connection request arrived on the listener's socket.
///
/// # Safety
///
/// Called by UCX only, from the listener worker's progress; `arg` is the listener's
/// [`Pending`].
unsafe extern "C" fn on_conn_request(request: sys::ucp_conn_request_h, arg: *mut c_void) {
    // SAFETY: the listener's `Pending`, which outlives its worker; UCX calls back only inside
    // the listener's own calls into the worker, which hold `&mut` to it.
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
    }
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
    sys::UCS_OK
}

/// A [`Pending`] at a fixed heap address, freed on drop (after the worker that calls back
/// into it).
struct PendingBox(*mut Pending);

impl PendingBox {
    fn get(&mut self) -> &mut Pending {
        // SAFETY: from Box::into_raw, live until drop; `&mut self` excludes other users, and
        // UCX calls back into it only inside calls the listener makes through `&mut self`.
        unsafe { &mut *self.0 }
    }
}

impl Drop for PendingBox {
    fn drop(&mut self) {
        // SAFETY: from Box::into_raw, freed once; the worker that called back into it is gone.
        drop(unsafe { Box::from_raw(self.0) });
    }
}

/// Accepts UCX connections on a socket address (and on its worker's UCX address).
///
/// `accept` sets up each connection on a worker of its own. The listener's descriptor
/// ([`AsFd`]) becomes readable when a connection request may be waiting, once `accept` returned
/// `None`: poll it together with other descriptors, then call `accept(Duration::ZERO)`.
///
/// INVARIANTS: `listener` is a live listener of `worker`; `pending` is registered with both and
/// outlives the worker (fields drop in declaration order, after `drop` destroyed the listener).
pub struct UcxListener {
    listener: sys::ucp_listener_h,
    config: ChannelConfig,
    local_addr: SocketAddr,
    address: Vec<u8>,
    worker: Worker,
    pending: PendingBox,
}

// SAFETY: the listener and its worker (serialized mode) are used only through `&mut self` or
// on drop, so one thread at a time; `Pending` is touched only there and in UCX's callbacks,
// which run inside those calls.
unsafe impl Send for UcxListener {}

impl UcxListener {
    /// Listens on `addr` (port 0: any free port, see [`UcxListener::local_addr`]) for
    /// connections with the settings of `config`.
    pub fn bind(addr: SocketAddr, config: &ChannelConfig) -> Result<Self, UcxConnectError> {
        check_config(config)?;
        let worker = Worker::new(c"urom listener")?;
        let mut pending = PendingBox(Box::into_raw(Box::new(Pending {
            listener: std::ptr::null_mut(),
            requests: VecDeque::new(),
            hellos: VecDeque::new(),
        })));
        let arg = pending.0.cast::<c_void>();
        // SAFETY: `pending` outlives the worker (dropped after it).
        unsafe { worker.set_handler(AM_HANDSHAKE, on_listener_hello, arg)? };
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
        // SAFETY: the worker is live; `params` and the socket address it points to live for
        // the call; `pending` outlives the listener; `listener` is a valid place.
        let status = unsafe { sys::ucp_listener_create(worker.raw(), &params, &mut listener) };
        ucp::check(status).map_err(|status| UcxConnectError::Listen {
            address: addr.to_string(),
            status,
        })?;
        pending.get().listener = listener;
        let mut this = Self {
            listener,
            config: *config,
            local_addr: addr,
            address: Vec::new(),
            worker,
            pending,
        };
        // SAFETY: all-zero is a valid `ucp_listener_attr_t`.
        let mut attr: sys::ucp_listener_attr_t = unsafe { std::mem::zeroed() };
        attr.field_mask = sys::UCP_LISTENER_ATTR_FIELD_SOCKADDR;
        // SAFETY: the listener is live; `attr` is a valid place for the answer.
        let status = unsafe { sys::ucp_listener_query(this.listener, &mut attr) };
        ucp::check(status).map_err(|status| UcxConnectError::Ucx {
            op: "ucp_listener_query",
            status,
        })?;
        if let Some(bound) = ucp::socket_addr(&attr.sockaddr) {
            this.local_addr = bound;
        }
        this.address = this.worker.address()?;
        // Leave the worker armed, so the descriptor means something before the first accept.
        this.progress_and_arm();
        Ok(this)
    }

    /// The address it listens on, with the real port when bound to port 0.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The UCX address of the listener's worker, for [`UcxConnection::connect_worker`].
    pub fn worker_address(&self) -> &[u8] {
        &self.address
    }

    fn progress_and_arm(&mut self) {
        loop {
            self.worker.progress_all();
            if !self.pending.get().requests.is_empty() || !self.pending.get().hellos.is_empty() {
                return;
            }
            if let Armed::Yes = self.worker.arm() {
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
            self.progress_and_arm();
            if let Some(request) = self.pending.get().requests.pop_front() {
                return self.accept_request(request).map(Some);
            }
            if let Some(hello) = self.pending.get().hellos.pop_front() {
                return self.accept_hello(&hello).map(Some);
            }
            let now = Instant::now();
            let left = match end {
                Some(end) if now >= end => return Ok(None),
                Some(end) => end - now,
                None => Duration::from_secs(3600),
            };
            poll_one(self.worker.efd(), left);
        }
    }

    /// Sets up a connection from a request on the socket address: an endpoint on a new
    /// worker, then the hello and the answer.
    fn accept_request(
        &mut self,
        request: sys::ucp_conn_request_h,
    ) -> Result<UcxConnection, UcxConnectError> {
        let until = Instant::now() + self.config.handshake_timeout;
        let mut ucp = match Ucp::new(&self.config) {
            Ok(ucp) => ucp,
            Err(e) => {
                // SAFETY: a request of this listener, not used before, handed back once.
                let _ = unsafe { sys::ucp_listener_reject(self.listener, request) };
                return Err(e);
            }
        };
        // UCX 1.13 moves the request's descriptor from this worker's event handling to the new
        // worker's; an event for it that this worker's progress thread queued earlier (while
        // this thread was inside the worker) would, if handled after the move, abort UCX. Handle
        // what is queued now, while the descriptor is still this worker's.
        self.worker.progress_all();
        let arg = ucp.state.as_ptr().cast();
        // SAFETY: the state outlives the endpoint; the request is used once, here.
        ucp.ep = unsafe {
            ucp::create_ep(
                &ucp.worker,
                Remote::Request(request),
                state::on_ep_error,
                arg,
            )
        }
        .map_err(|status| UcxConnectError::Ucx {
            op: "ucp_ep_create",
            status,
        })?;
        let hello = wait_message(&mut ucp, until, false).map_err(|w| match w {
            Waited::Failed(status) => UcxConnectError::Unreachable {
                address: "the connecting peer".to_owned(),
                status,
            },
            Waited::TimedOut => UcxConnectError::Handshake("no hello arrived in time"),
        })?;
        answer(ucp, &hello, &self.config, false, until, &mut reply_over_ucx)
    }

    /// Sets up a connection from a hello sent to the worker address: an endpoint on a new
    /// worker to the address the hello carries, then the answer.
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
        let mut ucp = Ucp::new(&self.config)?;
        connect_to_worker(
            &mut ucp,
            address,
            "the connecting peer's UCX worker address",
        )?;
        answer(ucp, hello, &self.config, true, until, &mut reply_over_ucx)
    }
}

/// How the accepting side's answer leaves: the bytes, and until when to wait for them to leave
/// (`None`: do not wait).
type Reply<'a> = dyn FnMut(&mut Ucp, Vec<u8>, Option<Instant>) -> Result<(), UcxConnectError> + 'a;

/// Sends an answer on the connection's own endpoint.
fn reply_over_ucx(
    ucp: &mut Ucp,
    bytes: Vec<u8>,
    until: Option<Instant>,
) -> Result<(), UcxConnectError> {
    let ep = ucp.ep;
    send_message(ucp, ep, bytes, until).map_err(|status| UcxConnectError::Unreachable {
        address: "the connecting peer".to_owned(),
        status,
    })
}

/// The accepting side's last step: checks the hello and answers it through `reply`, waiting
/// until `until` for the answer to leave (nothing else drives this end's worker before the
/// caller uses the connection, and the peer waits for it).
fn answer(
    mut ucp: Ucp,
    hello: &[u8],
    config: &ChannelConfig,
    with_address: bool,
    until: Instant,
    reply: &mut Reply<'_>,
) -> Result<UcxConnection, UcxConnectError> {
    let ours = config.max_msg_size.as_u32();
    let mut reply = |ucp: &mut Ucp, status, max_msg_size, address: &[u8], wait| {
        let answer = UcxAnswerRepr {
            status,
            max_msg_size,
            slots: config.slots,
            address,
        };
        let mut bytes = vec![0; answer.buffer_len()];
        // The buffer has the answer's length; a worker address fits a u32 length.
        let _ = answer.emit(&mut bytes);
        reply(ucp, bytes, wait)
    };
    let hello = match UcxHelloRepr::parse(hello) {
        Ok(hello) => hello,
        Err(DecodeError::UnsupportedFormatVersion { found, .. }) => {
            let _ = reply(
                &mut ucp,
                UcxAnswerStatus::Version,
                UCX_HANDSHAKE_VERSION,
                &[],
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
    if hello.max_msg_size != ours {
        let _ = reply(&mut ucp, UcxAnswerStatus::MaxMsgSize, ours, &[], None);
        return Err(UcxConnectError::MaxMsgSizeMismatch {
            ours,
            theirs: hello.max_msg_size,
        });
    }
    if !slots_ok(hello.slots, config.max_msg_size.get()) {
        let _ = reply(&mut ucp, UcxAnswerStatus::Slots, ours, &[], None);
        return Err(UcxConnectError::Slots { found: hello.slots });
    }
    let address = if with_address {
        ucp.worker.address()?
    } else {
        Vec::new()
    };
    reply(&mut ucp, UcxAnswerStatus::Ok, ours, &address, Some(until))?;
    ucp.state().set_peer_slots(hello.slots as usize);
    Ok(UcxConnection::from_ucp(ucp, config))
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
        let ucp = Ucp::new(config)?;
        let own = ucp.worker.address()?;
        send_through(&mut door.1, &hello_bytes(config, &own))?;
        let answer = receive_through(&mut door.0, until)?;
        finish(ucp, &answer, config, true)
    }

    /// The accepting side of [`UcxConnection::connect_through`]: reads the peer's settings and
    /// UCX worker address from `door`, connects to it from a new worker and answers with that
    /// worker's address.
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
        let mut ucp = Ucp::new(config)?;
        connect_to_worker(
            &mut ucp,
            address,
            "the connecting peer's UCX worker address",
        )?;
        let writer = &mut door.1;
        answer(ucp, &hello, config, true, until, &mut |_, bytes, _| {
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
        // Requests never accepted are refused, so their peers learn at once.
        while let Some(request) = self.pending.get().requests.pop_front() {
            // SAFETY: a request of this listener, not used before, handed back once.
            let _ = unsafe { sys::ucp_listener_reject(self.listener, request) };
        }
        // SAFETY: the listener is live (invariants) and destroyed once; the worker and the
        // pending queue it calls back into are dropped after this.
        unsafe { sys::ucp_listener_destroy(self.listener) };
    }
}

impl AsFd for UcxListener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.worker.efd()
    }
}

impl AsRawFd for UcxListener {
    fn as_raw_fd(&self) -> RawFd {
        self.worker.efd().as_raw_fd()
    }
}
