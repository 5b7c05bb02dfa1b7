//! The UCP objects the transport holds, each with its one `unsafe` call site: the process-wide
//! context, workers, endpoints and requests.

use std::ffi::{CStr, CString, c_void};
use std::net::SocketAddr;
use std::os::fd::{BorrowedFd, RawFd};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use ucx_sys as sys;

use super::UcxConnectError;

/// Settings for the context, for `UCX_*` variables the environment does not set.
static DEFAULTS: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());
/// The process-wide context, created on first use.
static CONTEXT: OnceLock<Result<Context, sys::ucs_status_t>> = OnceLock::new();
/// The process-wide context for tagged messages and remote memory access (plugins' peer
/// workers, hosts' memory), created on first use.
static PEER_CONTEXT: OnceLock<Result<Context, sys::ucs_status_t>> = OnceLock::new();

/// Sets defaults for the process-wide UCX context, applied when it is created (on the first
/// connection or listener) to each `UCX_<NAME>` variable that the environment does not set.
///
/// `settings` holds `(NAME, value)` pairs without the `UCX_` prefix, e.g.
/// `[("TLS", "tcp"), ("NET_DEVICES", "lo")]` to keep tests on the loopback interface. Returns
/// `false` (and changes nothing) once the context exists. The environment always wins, so an
/// operator's `UCX_TLS` or `UCX_NET_DEVICES` is never overridden.
///
/// UCX warns about `UCX_*` variables it does not know; `UCX_WARN_UNUSED_ENV_VARS=n` in the
/// environment silences that (it cannot be set here: UCX reads it when the library loads).
pub fn set_config_defaults(settings: &[(&str, &str)]) -> bool {
    if CONTEXT.get().is_some() || PEER_CONTEXT.get().is_some() {
        return false;
    }
    let mut defaults = DEFAULTS.lock().unwrap_or_else(|e| e.into_inner());
    for (name, value) in settings {
        defaults.retain(|(n, _)| n != name);
        defaults.push(((*name).to_owned(), (*value).to_owned()));
    }
    CONTEXT.get().is_none() && PEER_CONTEXT.get().is_none()
}

/// The UCP context every connection and listener of this process shares.
struct Context(sys::ucp_context_h);

// SAFETY: the context is created with `mt_workers_shared`, which makes UCX guard the state its
// workers share with a lock of its own, so that workers driven by different threads may use it
// at the same time. The handle itself is only ever passed to UCX.
unsafe impl Send for Context {}
// SAFETY: as for `Send`: every use is a UCX call that UCX makes thread-safe.
unsafe impl Sync for Context {}

/// The process-wide context, created on first use with the active-message and wake-up
/// features; `UCX_*` variables from the environment choose transports and devices.
fn context() -> Result<sys::ucp_context_h, UcxConnectError> {
    let made = CONTEXT
        .get_or_init(|| create_context(sys::UCP_FEATURE_AM | sys::UCP_FEATURE_WAKEUP).map(Context));
    match made {
        Ok(context) => Ok(context.0),
        Err(status) => Err(UcxConnectError::Ucx {
            op: init_op(),
            status: *status,
        }),
    }
}

/// What failed when a context could not be created: `ucp_init`, with the reason when the UCX
/// library loaded is older than the headers this build was compiled against.
pub(super) fn init_op() -> &'static str {
    version_problem().unwrap_or("ucp_init")
}

/// `ucp_init (why)` when the UCX library loaded cannot serve this build; checked once.
fn version_problem() -> Option<&'static str> {
    static PROBLEM: OnceLock<Option<String>> = OnceLock::new();
    PROBLEM
        .get_or_init(|| {
            sys::check_runtime_version()
                .err()
                .map(|why| format!("ucp_init ({why})"))
        })
        .as_deref()
}

/// The features of the peer context: tag matching, remote memory access, 64-bit atomics and
/// wake-up, as the DOCA sandbox plugin asks for.
const PEER_FEATURES: u64 =
    sys::UCP_FEATURE_TAG | sys::UCP_FEATURE_RMA | sys::UCP_FEATURE_AMO64 | sys::UCP_FEATURE_WAKEUP;

/// The process-wide context of peer workers and host memory: [`PEER_FEATURES`], and exported
/// memory handles where a transport can export them ([`exported_memh_supported`]; asked for
/// where none can, UCX makes every endpoint of the context unreachable).
pub(super) fn peer_context() -> Result<sys::ucp_context_h, sys::ucs_status_t> {
    let made = PEER_CONTEXT.get_or_init(|| {
        let export = if exported_memh_supported() {
            exported_memh_feature()
        } else {
            0
        };
        create_context(PEER_FEATURES | export).map(Context)
    });
    match made {
        Ok(context) => Ok(context.0),
        Err(status) => Err(*status),
    }
}

/// `UCP_FEATURE_EXPORTED_MEMH` where this build's UCX implements it (1.15 and later).
fn exported_memh_feature() -> u64 {
    #[cfg(ucx_1_15)]
    {
        sys::UCP_FEATURE_EXPORTED_MEMH
    }
    #[cfg(not(ucx_1_15))]
    {
        0
    }
}

/// Whether this process's UCX can export memory handles (`ucp_memh_pack` with
/// `UCP_MEMH_PACK_FLAG_EXPORT`) and so import them (`ucp_mem_map` with `exported_memh_buffer`):
/// built against UCX 1.15 or later (1.14 declares the functions, 1.15 implements them), and a
/// transport that can (mlx5 with cross-function memory keys) exports a page mapped in a
/// throwaway context with the peer context's features and `UCP_FEATURE_EXPORTED_MEMH`. On
/// machines without one every transport answers `UCS_ERR_UNSUPPORTED`, and the peer context
/// does not ask for the feature. Probed once per process, with the same `UCX_*` settings as
/// the contexts; the throwaway context makes no endpoint.
pub(super) fn exported_memh_supported() -> bool {
    static SUPPORTED: OnceLock<bool> = OnceLock::new();
    *SUPPORTED.get_or_init(|| {
        #[cfg(ucx_1_15)]
        {
            probe_export().is_ok()
        }
        #[cfg(not(ucx_1_15))]
        {
            false
        }
    })
}

/// Maps a page in a throwaway context and packs its handle for export: `Ok` when UCX can.
#[cfg(ucx_1_15)]
fn probe_export() -> Result<(), sys::ucs_status_t> {
    let context = create_context(PEER_FEATURES | sys::UCP_FEATURE_EXPORTED_MEMH)?;
    let layout = std::alloc::Layout::from_size_align(4096, 4096).expect("a page");
    // SAFETY: the layout has a non-zero size.
    let page = unsafe { std::alloc::alloc_zeroed(layout) };
    let result = if page.is_null() {
        Err(sys::UCS_ERR_NO_RESOURCE)
    } else {
        let params = sys::ucp_mem_map_params_t {
            field_mask: sys::UCP_MEM_MAP_PARAM_FIELD_ADDRESS | sys::UCP_MEM_MAP_PARAM_FIELD_LENGTH,
            address: page.cast(),
            length: layout.size(),
            ..Default::default()
        };
        let mut memh: sys::ucp_mem_h = std::ptr::null_mut();
        // SAFETY: the context is live; `params` names the page allocated above, which stays
        // allocated until after the unmap below; `memh` is a valid place for the result.
        let mapped = check(unsafe { sys::ucp_mem_map(context, &params, &mut memh) });
        let packed = mapped.and_then(|()| {
            let pack = sys::ucp_memh_pack_params_t {
                field_mask: sys::UCP_MEMH_PACK_PARAM_FIELD_FLAGS,
                flags: sys::UCP_MEMH_PACK_FLAG_EXPORT,
            };
            let mut buffer: *mut std::ffi::c_void = std::ptr::null_mut();
            let mut len = 0usize;
            // SAFETY: `memh` is the context's live mapping; `pack` sets a flag (flags 0 is
            // fatal in UCX); both outputs are valid places.
            let status = unsafe { sys::ucp_memh_pack(memh, &pack, &mut buffer, &mut len) };
            if status == sys::UCS_OK && !buffer.is_null() {
                let release = sys::ucp_memh_buffer_release_params_t::default();
                // SAFETY: packed by ucp_memh_pack above, released once.
                unsafe { sys::ucp_memh_buffer_release(buffer, &release) };
            }
            check(status)
        });
        if mapped.is_ok() {
            // SAFETY: the context's mapping, unmapped once.
            let _ = unsafe { sys::ucp_mem_unmap(context, memh) };
        }
        // SAFETY: allocated above with `layout`, no longer mapped, freed once.
        unsafe { std::alloc::dealloc(page, layout) };
        packed
    };
    // SAFETY: the throwaway context, with no worker and no mapping left, cleaned up once.
    unsafe { sys::ucp_cleanup(context) };
    result
}

fn create_context(features: u64) -> Result<sys::ucp_context_h, sys::ucs_status_t> {
    if version_problem().is_some() {
        return Err(sys::UCS_ERR_UNSUPPORTED);
    }
    let mut config: *mut sys::ucp_config_t = std::ptr::null_mut();
    // SAFETY: NULL prefix and file mean "UCX_ from the environment"; `config` is a valid place
    // for the result.
    check(unsafe { sys::ucp_config_read(std::ptr::null(), std::ptr::null(), &mut config) })?;
    let defaults = DEFAULTS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    for (name, value) in defaults {
        if std::env::var_os(format!("UCX_{name}")).is_some() {
            continue;
        }
        let (Ok(name), Ok(value)) = (CString::new(name), CString::new(value)) else {
            continue;
        };
        // SAFETY: `config` came from ucp_config_read; both strings are NUL-terminated and live
        // for the call. An unknown name is refused with an error status, which we ignore: it
        // is a default, not a requirement.
        let _ = unsafe { sys::ucp_config_modify(config, name.as_ptr(), value.as_ptr()) };
    }
    // The fields this version of UCX added after those named here stay zero (unset).
    let params = sys::ucp_params_t {
        field_mask: sys::UCP_PARAM_FIELD_FEATURES
            | sys::UCP_PARAM_FIELD_MT_WORKERS_SHARED
            | sys::UCP_PARAM_FIELD_NAME,
        features,
        mt_workers_shared: 1,
        name: c"urom".as_ptr(),
        ..Default::default()
    };
    let mut context: sys::ucp_context_h = std::ptr::null_mut();
    // SAFETY: `params` is fully initialised and names only the fields set above; `config` came
    // from ucp_config_read; `context` is a valid place for the result.
    let status = unsafe {
        sys::ucp_init_version(
            sys::UCP_API_MAJOR,
            sys::UCP_API_MINOR,
            &params,
            config,
            &mut context,
        )
    };
    // SAFETY: `config` came from ucp_config_read and is not used after this.
    unsafe { sys::ucp_config_release(config) };
    check(status).map(|()| context)
}

/// `Ok` for `UCS_OK`, else the status.
pub(super) fn check(status: sys::ucs_status_t) -> Result<(), sys::ucs_status_t> {
    if status == sys::UCS_OK {
        Ok(())
    } else {
        Err(status)
    }
}

/// An active-message handler: UCX calls it from `ucp_worker_progress` with `arg`.
pub(super) type AmHandler = unsafe extern "C" fn(
    arg: *mut c_void,
    header: *const c_void,
    header_length: usize,
    data: *mut c_void,
    length: usize,
    param: *const sys::ucp_am_recv_param_t,
) -> sys::ucs_status_t;

/// An endpoint error handler: UCX calls it from `ucp_worker_progress` with `arg`.
pub(super) type ErrHandler =
    unsafe extern "C" fn(arg: *mut c_void, ep: sys::ucp_ep_h, status: sys::ucs_status_t);

/// Whether a worker may sleep now.
pub(super) enum Armed {
    /// Its descriptor will become readable on the next event.
    Yes,
    /// Events are waiting: progress again first.
    Busy,
}

/// A UCP worker, destroyed on drop, with everything it created.
///
/// INVARIANTS: `raw` is a live worker of the process-wide context, created in serialized
/// mode: any thread may call into it, one at a time (the owner's `&mut` or lock provides that);
/// `efd` is its event descriptor, valid while it lives.
pub(super) struct Worker {
    raw: sys::ucp_worker_h,
    efd: RawFd,
    /// Destroyed on drop. The shared worker's handles are not (see [`Shared`]); their
    /// progress and arming are counted for the wake thread (see `watch`).
    owned: bool,
}

impl Worker {
    /// A worker of `context` (a live process-wide context), named `name`; the failed call and
    /// its status on failure.
    pub(super) fn in_context(
        context: sys::ucp_context_h,
        name: &CStr,
    ) -> Result<Self, (&'static str, sys::ucs_status_t)> {
        // SAFETY: all-zero is a valid `ucp_worker_params_t` (integers, NULL pointers, an empty
        // CPU set); only the fields named in `field_mask` are read.
        let mut params: sys::ucp_worker_params_t = unsafe { std::mem::zeroed() };
        params.field_mask =
            sys::UCP_WORKER_PARAM_FIELD_THREAD_MODE | sys::UCP_WORKER_PARAM_FIELD_NAME;
        params.thread_mode = sys::UCS_THREAD_MODE_SERIALIZED;
        params.name = name.as_ptr();
        let mut raw: sys::ucp_worker_h = std::ptr::null_mut();
        // SAFETY: `context` is the live process-wide context; `params` is initialised and
        // `name` outlives the call (UCX copies it); `raw` is a valid place for the result.
        let status = unsafe { sys::ucp_worker_create(context, &params, &mut raw) };
        check(status).map_err(|status| ("ucp_worker_create", status))?;
        let mut efd: RawFd = -1;
        // SAFETY: `raw` is the live worker just created; `efd` is a valid place for the result.
        let status = unsafe { sys::ucp_worker_get_efd(raw, &mut efd) };
        let worker = Self {
            raw,
            efd,
            owned: true,
        };
        check(status).map_err(|status| ("ucp_worker_get_efd", status))?;
        Ok(worker)
    }

    pub(super) fn raw(&self) -> sys::ucp_worker_h {
        self.raw
    }

    /// The descriptor that becomes readable on an event once the worker is armed.
    pub(super) fn efd(&self) -> BorrowedFd<'_> {
        // SAFETY: the worker owns `efd` and keeps it open while it lives, which `&self` covers.
        unsafe { BorrowedFd::borrow_raw(self.efd) }
    }

    /// One round of progress: runs the callbacks of whatever arrived; how many events.
    #[inline]
    pub(super) fn progress(&self) -> u32 {
        if !self.owned {
            // The shared worker: the wake thread leaves it to threads that progress it.
            super::watch::progressed();
        }
        // SAFETY: `raw` is live; the caller is the only thread in this worker (see the type's
        // invariants).
        unsafe { sys::ucp_worker_progress(self.raw) }
    }

    /// Progress until nothing more happens (at most a bounded number of rounds, so that a
    /// peer sending without pause cannot keep the caller here).
    #[inline]
    pub(super) fn progress_all(&self) {
        for _ in 0..64 {
            if self.progress() == 0 {
                break;
            }
        }
    }

    /// Progress until a call finds nothing (`true`), or until the bound of
    /// [`Worker::progress_all`] passes with events still coming (`false`).
    ///
    /// `ucp_worker_arm` is only safe after that: an event UCX's progress thread saw on an
    /// interface that adaptive progress has switched off is taken by `ucp_worker_arm` (its
    /// internal eventfd, so "busy"), while what it calls for runs only on the following
    /// progress calls, which also turn the interface's wake-ups back on (UCX 1.13: a new TCP
    /// connection takes two). Arming after fewer leaves the descriptor deaf to that
    /// interface: a worker waiting only for peers' messages slept through the first one.
    pub(super) fn progress_until_quiet(&self) -> bool {
        (0..64).any(|_| self.progress() == 0)
    }

    /// Prepares the worker to sleep on [`Worker::efd`]. Call it once
    /// [`Worker::progress_until_quiet`] found nothing to do.
    pub(super) fn arm(&self) -> Armed {
        // SAFETY: `raw` is live; the caller is the only thread in this worker.
        match unsafe { sys::ucp_worker_arm(self.raw) } {
            sys::UCS_OK => {
                if !self.owned {
                    super::watch::armed();
                }
                Armed::Yes
            }
            // Anything else (UCS_ERR_BUSY: events are waiting) means "progress first".
            _ => Armed::Busy,
        }
    }

    /// The worker's address, for a peer to connect to.
    pub(super) fn address(&self) -> Result<Vec<u8>, UcxConnectError> {
        // SAFETY: all-zero is a valid `ucp_worker_attr_t`; only the named fields are written.
        let mut attr: sys::ucp_worker_attr_t = unsafe { std::mem::zeroed() };
        attr.field_mask = sys::UCP_WORKER_ATTR_FIELD_ADDRESS;
        // SAFETY: `raw` is live; `attr` is a valid place for the answer.
        let status = unsafe { sys::ucp_worker_query(self.raw, &mut attr) };
        check(status).map_err(|status| UcxConnectError::Ucx {
            op: "ucp_worker_query",
            status,
        })?;
        let bytes = if attr.address.is_null() {
            Vec::new()
        } else {
            // SAFETY: UCX returned `address_length` readable bytes at `address`, valid until
            // released below.
            unsafe { std::slice::from_raw_parts(attr.address.cast::<u8>(), attr.address_length) }
                .to_vec()
        };
        // SAFETY: the address came from ucp_worker_query on this worker and is released once.
        unsafe { sys::ucp_worker_release_address(self.raw, attr.address) };
        Ok(bytes)
    }

    /// Registers `cb` for active messages with `id`; UCX passes it `arg`.
    ///
    /// # Safety
    ///
    /// `arg` must stay valid, for what `cb` does with it, until the worker is destroyed or
    /// another handler is registered for `id`.
    pub(super) unsafe fn set_handler(
        &self,
        id: u32,
        cb: AmHandler,
        arg: *mut c_void,
    ) -> Result<(), UcxConnectError> {
        let param = sys::ucp_am_handler_param_t {
            field_mask: sys::UCP_AM_HANDLER_PARAM_FIELD_ID
                | sys::UCP_AM_HANDLER_PARAM_FIELD_FLAGS
                | sys::UCP_AM_HANDLER_PARAM_FIELD_CB
                | sys::UCP_AM_HANDLER_PARAM_FIELD_ARG,
            id,
            flags: sys::UCP_AM_FLAG_WHOLE_MSG,
            cb: Some(cb),
            arg,
        };
        // SAFETY: `raw` is live; `param` is initialised; the caller keeps `arg` valid.
        let status = unsafe { sys::ucp_worker_set_am_recv_handler(self.raw, &param) };
        check(status).map_err(|status| UcxConnectError::Ucx {
            op: "ucp_worker_set_am_recv_handler",
            status,
        })
    }

    /// Waits for `request` (as returned by a `_nbx` call) to complete, progressing the worker,
    /// until `until`. Frees the request either way (UCX frees one still running once it
    /// completes).
    pub(super) fn wait(
        &self,
        request: sys::ucs_status_ptr_t,
        until: Option<Instant>,
    ) -> Result<(), sys::ucs_status_t> {
        let request = match sys::status_ptr(request) {
            sys::StatusPtr::Done => return Ok(()),
            sys::StatusPtr::Failed(status) => return Err(status),
            sys::StatusPtr::Request(request) => request,
        };
        let status = loop {
            self.progress();
            // SAFETY: `request` is a live request of this worker, not yet freed.
            let status = unsafe { sys::ucp_request_check_status(request) };
            if status != sys::UCS_INPROGRESS {
                break status;
            }
            if until.is_some_and(|u| Instant::now() >= u) {
                break sys::UCS_ERR_TIMED_OUT;
            }
            std::hint::spin_loop();
        };
        // SAFETY: freed once; a request still running is released by UCX when it completes.
        unsafe { sys::ucp_request_free(request) };
        check(status)
    }

    /// Sends one active message with `header` and `data` to `id` on `ep`: at once when UCX can
    /// take it (it then keeps no pointer to them), else from where `queue` puts it (or not at
    /// all when `queue` has no room: [`Sent::Deferred`]). A queued send completes through its
    /// callback, or is waited for when it has none. Allocates nothing; `queue` runs between
    /// calls into UCX, so no callback of UCX's runs while it does.
    ///
    /// # Safety
    ///
    /// `ep` must be a live endpoint of this worker, and the caller the only thread in it.
    pub(super) unsafe fn send_or_queue(
        &self,
        ep: sys::ucp_ep_h,
        id: u32,
        header: &[u8],
        data: &[u8],
        flags: u32,
        queue: impl FnOnce() -> Option<Queued>,
    ) -> Result<Sent, sys::ucs_status_t> {
        // SAFETY: the caller guarantees `ep`; completing now, UCX keeps no pointer to the
        // buffers after the call.
        let sent = unsafe { am_send(ep, id, header, data, flags, Completion::Now) };
        match sys::status_ptr(sent) {
            sys::StatusPtr::Done => return Ok(Sent::Done),
            sys::StatusPtr::Failed(sys::UCS_ERR_NO_RESOURCE) => {}
            sys::StatusPtr::Failed(status) => return Err(status),
            // Not expected when completing now; wait so that the buffers are not used after
            // this returns.
            sys::StatusPtr::Request(_) => return self.wait(sent, None).map(|()| Sent::Done),
        }
        let Some(queued) = queue() else {
            return Ok(Sent::Deferred);
        };
        let completion = match queued.on_done {
            Some((on_done, ctx)) => Completion::Callback { on_done, ctx },
            None => Completion::Later,
        };
        // SAFETY: the caller guarantees `ep`; `Queued::new`'s caller keeps the buffers and the
        // callback's context valid and unchanged until the send completed, which without a
        // callback is waited for below.
        let sent = unsafe { am_send(ep, id, queued.header, queued.data, flags, completion) };
        match sys::status_ptr(sent) {
            sys::StatusPtr::Done => Ok(Sent::Done),
            sys::StatusPtr::Failed(status) => Err(status),
            sys::StatusPtr::Request(_) if queued.on_done.is_some() => Ok(Sent::Queued),
            sys::StatusPtr::Request(_) => self.wait(sent, None).map(|()| Sent::Done),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: `raw` is live and destroyed once; its endpoints were closed by their
            // owners (any left are released by UCX with the worker).
            unsafe { sys::ucp_worker_destroy(self.raw) };
        }
    }
}

/// When a send may complete, and what tells its sender.
#[derive(Clone, Copy)]
pub(super) enum Completion {
    /// Within the call or not at all: UCX keeps no pointer to the buffers after it, and fails
    /// with `UCS_ERR_NO_RESOURCE` when it cannot send at once.
    Now,
    /// Within the call or later, through the request returned (to wait for or release).
    Later,
    /// Within the call or later; if later, UCX calls `on_done` with `ctx`, which frees the
    /// request.
    Callback { on_done: SendDone, ctx: *mut c_void },
}

/// A send's completion callback: UCX passes the request, its status and the context.
pub(super) type SendDone = unsafe extern "C" fn(*mut c_void, sys::ucs_status_t, *mut c_void);

/// Where a message that UCX could not take at once stays put until its send completed, for
/// [`Worker::send_or_queue`].
pub(super) struct Queued {
    header: *const [u8],
    data: *const [u8],
    /// Called with its context when the send completes after the call; `None`: the sender
    /// waits for it instead.
    on_done: Option<(SendDone, *mut c_void)>,
}

impl Queued {
    /// `header` and `data`, their send's completion told to `on_done` (or waited for).
    ///
    /// # Safety
    ///
    /// `header` and `data` (and `on_done`'s context) must stay valid and unchanged until the
    /// send completed: until `on_done` ran, or, without it, until the sender's wait returned.
    pub(super) unsafe fn new(
        header: *const [u8],
        data: *const [u8],
        on_done: Option<(SendDone, *mut c_void)>,
    ) -> Self {
        Self {
            header,
            data,
            on_done,
        }
    }
}

/// What became of a message [`Worker::send_or_queue`] sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Sent {
    /// UCX is done with it.
    Done,
    /// UCX sends it from where it was queued and runs the queue's callback when done.
    Queued,
    /// UCX could not take it at once and the queue had no room for it: try again later.
    Deferred,
}

/// Starts sending one active message with `header` and `data` (UCP_AM_SEND_FLAG_* `flags`)
/// to `id` on `ep`, completing as `completion` says; the request or status (for
/// [`Worker::wait`], [`wait_unlocked`] or [`detach_request`]).
///
/// # Safety
///
/// `ep` must be a live endpoint of a worker that the caller alone is in (its lock held);
/// unless `completion` is [`Completion::Now`], `header` and `data` (and a callback's `ctx`)
/// must stay valid and unchanged until the send completed.
pub(super) unsafe fn am_send(
    ep: sys::ucp_ep_h,
    id: u32,
    header: *const [u8],
    data: *const [u8],
    flags: u32,
    completion: Completion,
) -> sys::ucs_status_ptr_t {
    let mut param = match completion {
        Completion::Now => request_param(
            sys::UCP_OP_ATTR_FLAG_FORCE_IMM_CMPL,
            None,
            std::ptr::null_mut(),
        ),
        Completion::Later => request_param(0, None, std::ptr::null_mut()),
        Completion::Callback { on_done, ctx } => request_param(0, Some(on_done), ctx),
    };
    if flags != 0 {
        param.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_FLAGS;
        param.flags = flags;
    }
    // SAFETY: the caller guarantees `ep` and the buffers' (and context's) lifetime; `param`
    // is initialised.
    unsafe {
        sys::ucp_am_send_nbx(
            ep,
            id,
            header.cast(),
            header.len(),
            data.cast(),
            data.len(),
            &param,
        )
    }
}

/// Request parameters: `op_attr_mask` plus the callback and user data when given.
pub(super) fn request_param(
    op_attr_mask: u32,
    send_cb: sys::ucp_send_nbx_callback_t,
    user_data: *mut c_void,
) -> sys::ucp_request_param_t {
    let mut mask = op_attr_mask;
    if send_cb.is_some() {
        mask |= sys::UCP_OP_ATTR_FIELD_CALLBACK | sys::UCP_OP_ATTR_FIELD_USER_DATA;
    }
    // The rest (and the fields newer versions of UCX added) zero: unset.
    sys::ucp_request_param_t {
        op_attr_mask: mask,
        cb: sys::ucp_request_param_cb { send: send_cb },
        datatype: sys::UCP_DATATYPE_CONTIG,
        user_data,
        memory_type: sys::UCS_MEMORY_TYPE_HOST,
        ..Default::default()
    }
}

/// Where an endpoint leads.
pub(super) enum Remote<'a> {
    /// A listener's socket address (client-server connection).
    Socket(SocketAddr),
    /// A worker's address.
    Worker(&'a [u8]),
    /// A connection request that arrived at our listener.
    Request(sys::ucp_conn_request_h),
}

/// `addr` in the C layout, for UCX to read, and its length.
pub(super) fn raw_sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*v4.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write((&raw mut storage).cast(), sin) };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { std::ptr::write((&raw mut storage).cast(), sin6) };
            size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

/// The socket address in `storage`, if it is IPv4 or IPv6.
pub(super) fn socket_addr(storage: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match i32::from(storage.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in, which it is large
            // enough and aligned for.
            let sin = unsafe { &*(&raw const *storage).cast::<libc::sockaddr_in>() };
            let ip = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            Some(SocketAddr::from((ip, u16::from_be(sin.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6, which it is large
            // enough and aligned for.
            let sin6 = unsafe { &*(&raw const *storage).cast::<libc::sockaddr_in6>() };
            let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::V6(std::net::SocketAddrV6::new(
                ip,
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// Creates an endpoint on `worker` to `remote`, with peer error handling: UCX calls
/// `on_error(err_arg, ..)` when the peer dies or cannot be reached.
///
/// # Safety
///
/// `err_arg` must stay valid, for what `on_error` does with it, until the endpoint is closed or
/// the worker destroyed; a connection request must not have been used before.
pub(super) unsafe fn create_ep(
    worker: &Worker,
    remote: Remote<'_>,
    on_error: ErrHandler,
    err_arg: *mut c_void,
) -> Result<sys::ucp_ep_h, sys::ucs_status_t> {
    let sockaddr;
    // SAFETY: all-zero is a valid `ucp_ep_params_t`; only the named fields are read.
    let mut params: sys::ucp_ep_params_t = unsafe { std::mem::zeroed() };
    params.field_mask = sys::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE
        | sys::UCP_EP_PARAM_FIELD_ERR_HANDLER
        | sys::UCP_EP_PARAM_FIELD_NAME;
    params.err_mode = sys::UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler = sys::ucp_err_handler_t {
        cb: Some(on_error),
        arg: err_arg,
    };
    params.name = c"urom".as_ptr();
    match remote {
        Remote::Socket(addr) => {
            sockaddr = raw_sockaddr(addr);
            params.field_mask |= sys::UCP_EP_PARAM_FIELD_SOCK_ADDR | sys::UCP_EP_PARAM_FIELD_FLAGS;
            params.flags = sys::UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
            params.sockaddr = sys::ucs_sock_addr_t {
                addr: (&raw const sockaddr.0).cast(),
                addrlen: sockaddr.1,
            };
        }
        Remote::Worker(address) => {
            params.field_mask |= sys::UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
            params.address = address.as_ptr().cast();
        }
        Remote::Request(request) => {
            params.field_mask |= sys::UCP_EP_PARAM_FIELD_CONN_REQUEST;
            params.conn_request = request;
        }
    }
    let mut ep: sys::ucp_ep_h = std::ptr::null_mut();
    // SAFETY: the worker is live; `params` is initialised, and what it points to (the socket
    // address, the worker address, the name) lives for the call, UCX copying what it keeps;
    // the caller guarantees `err_arg` and the request; `ep` is a valid place for the result.
    let status = unsafe { sys::ucp_ep_create(worker.raw(), &params, &mut ep) };
    check(status).map(|()| ep)
}

/// Closes `ep` at once without telling the peer and without waiting: the request, if any, is
/// released, and completes when the worker is next progressed or destroyed.
///
/// # Safety
///
/// `ep` must be a live endpoint, not used again.
pub(super) unsafe fn close_ep_now(ep: sys::ucp_ep_h) {
    let mut param = request_param(0, None, std::ptr::null_mut());
    param.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = sys::UCP_EP_CLOSE_FLAG_FORCE;
    // SAFETY: the caller guarantees `ep`; `param` is initialised.
    let closing = unsafe { sys::ucp_ep_close_nbx(ep, &param) };
    if let sys::StatusPtr::Request(request) = sys::status_ptr(closing) {
        // SAFETY: a live request, freed once; UCX releases it when it completes.
        unsafe { sys::ucp_request_free(request) };
    }
}

/// The first active-message id handed to connection ends and listeners; ids below it are the
/// process's own ([`AM_SOCKET_HELLO`]).
const AM_FIRST: u32 = 16;
/// Active-message ids per connection end (data, control, handshake, batch; see `state`).
pub(super) const AM_BLOCK: u32 = 4;
/// Ids are handed out fresh up to here, then reused, longest free first.
const AM_FRESH_END: u32 = 8192;
/// The id every process receives the hellos of connections by socket address on: the
/// connecting side cannot know the accepting end's ids yet; UCX tells which endpoint a hello
/// came over (`reply_ep`), and the accepting end looks for its own.
pub(super) const AM_SOCKET_HELLO: u32 = 1;

/// The process-wide UCP worker that every connection end and listener shares, with what goes
/// with it: the active-message ids handed out, and the endpoints to other processes' workers.
///
/// One worker, so that every socket UCX opens for a connection belongs to one UCX async
/// context: UCX before 1.18 hands an event it queued for a descriptor (by number) to whichever
/// handler holds that number when the worker is next progressed, and aborts when that handler
/// belongs to another worker (see the module documentation). Within one worker a reused
/// number meets a handler of the same context, which UCX allows.
///
/// INVARIANTS: `worker` is the live shared worker (serialized mode): every call into it, and
/// every use of a connection end's UCX objects or state, is made holding [`SHARED`]'s lock,
/// whose guard is a [`Guard`]. At exit the lock is taken for good and the worker destroyed.
pub(super) struct Shared {
    worker: Worker,
    /// Fresh ids start here.
    next: u32,
    /// Ids given back, in the order they were.
    free: std::collections::VecDeque<u32>,
    /// Endpoints to other processes' workers, by their address, shared by every connection
    /// between the two workers (see [`PeerEp`](super::state::PeerEp)).
    pub(super) peers: std::collections::HashMap<Vec<u8>, *mut super::state::PeerEp>,
    /// Endpoints that failed, kept (closed) so that their error callback's argument stays
    /// valid.
    retired: Vec<*mut super::state::PeerEp>,
}

/// The shared worker, its lock, and what may be read without the lock.
struct SharedCell {
    lock: Mutex<Shared>,
    address: Vec<u8>,
}

// SAFETY: everything UCX-side in `Shared` is used only under the mutex; the worker runs in
// serialized mode (any thread, one at a time); `address` is a plain value.
unsafe impl Send for SharedCell {}
// SAFETY: as for `Send`.
unsafe impl Sync for SharedCell {}

static SHARED: OnceLock<Result<SharedCell, UcxConnectError>> = OnceLock::new();

/// Whether a thread holds the shared worker's lock (the handlers check it in debug builds).
static HELD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether a thread holds the shared worker's lock now.
pub(super) fn held() -> bool {
    HELD.load(std::sync::atomic::Ordering::Relaxed)
}

fn shared_cell() -> Result<&'static SharedCell, UcxConnectError> {
    SHARED
        .get_or_init(|| {
            let context = context()?;
            let worker = Worker::in_context(context, c"urom")
                .map_err(|(op, status)| UcxConnectError::Ucx { op, status })?;
            let address = worker.address()?;
            // SAFETY: the handler ignores its argument; the worker lives as long as the process.
            unsafe {
                worker.set_handler(
                    AM_SOCKET_HELLO,
                    super::state::on_socket_hello,
                    std::ptr::null_mut(),
                )?
            };
            // SAFETY: `destroy_shared` is an `extern "C" fn()` that does not unwind (it catches
            // panics); registering it has no other precondition.
            let _ = unsafe { libc::atexit(destroy_shared) };
            super::watch::start(worker.efd)?;
            Ok(SharedCell {
                lock: Mutex::new(Shared {
                    worker,
                    next: AM_FIRST,
                    free: std::collections::VecDeque::new(),
                    peers: std::collections::HashMap::new(),
                    retired: Vec::new(),
                }),
                address,
            })
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// The shared worker's lock, creating the worker on first use.
pub(super) fn try_lock() -> Result<Guard, UcxConnectError> {
    Ok(Guard::new(&shared_cell()?.lock))
}

/// The shared worker's lock, once the worker exists (every connection end and listener made
/// it, or failed).
pub(super) fn lock() -> Guard {
    match SHARED.get() {
        Some(Ok(cell)) => Guard::new(&cell.lock),
        _ => unreachable!("the shared UCX worker is made before anything that locks it"),
    }
}

/// The shared worker's lock, or `None` while the worker is not made yet (or failed).
pub(super) fn lock_if_made() -> Option<Guard> {
    match SHARED.get() {
        Some(Ok(cell)) => Some(Guard::new(&cell.lock)),
        _ => None,
    }
}

/// The shared worker's UCX address.
pub(super) fn shared_address() -> Result<&'static [u8], UcxConnectError> {
    Ok(&shared_cell()?.address)
}

/// Holding the shared worker's lock.
pub(super) struct Guard(std::sync::MutexGuard<'static, Shared>);

impl Guard {
    #[inline]
    fn new(lock: &'static Mutex<Shared>) -> Self {
        let guard = lock.lock().unwrap_or_else(|e| e.into_inner());
        HELD.store(true, std::sync::atomic::Ordering::Relaxed);
        Self(guard)
    }
}

impl Drop for Guard {
    #[inline]
    fn drop(&mut self) {
        HELD.store(false, std::sync::atomic::Ordering::Relaxed);
    }
}

impl std::ops::Deref for Guard {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl std::ops::DerefMut for Guard {
    fn deref_mut(&mut self) -> &mut Shared {
        &mut self.0
    }
}

/// At exit: takes the shared worker's lock for good (a thread still using a connection then
/// waits until the process is gone) and destroys the worker, before UCX tears its global state
/// down (see the module documentation).
extern "C" fn destroy_shared() {
    let _ = std::panic::catch_unwind(|| {
        if let Some(Ok(cell)) = SHARED.get() {
            let guard = Guard::new(&cell.lock);
            // SAFETY: the worker is live; no thread can call into it again (the lock is never
            // released), so it is destroyed once, with what it still holds.
            unsafe { sys::ucp_worker_destroy(guard.worker.raw) };
            std::mem::forget(guard);
        }
    });
}

impl Shared {
    /// A handle on the shared worker, for an owner that uses it only under the lock.
    pub(super) fn worker(&self) -> Worker {
        Worker {
            raw: self.worker.raw,
            efd: self.worker.efd,
            owned: false,
        }
    }

    /// A block of [`AM_BLOCK`] active-message ids for a connection end or a listener.
    pub(super) fn take_ids(&mut self) -> Result<u32, UcxConnectError> {
        if self.next + AM_BLOCK <= AM_FRESH_END {
            let base = self.next;
            self.next += AM_BLOCK;
            return Ok(base);
        }
        self.free.pop_front().ok_or(UcxConnectError::Ucx {
            op: "ucp_worker_set_am_recv_handler (no active-message ids left)",
            status: sys::UCS_ERR_NO_RESOURCE,
        })
    }

    /// Gives back the ids from `base`: messages for them are dropped from now on.
    pub(super) fn give_ids(&mut self, base: u32) {
        for id in base..base + AM_BLOCK {
            // SAFETY: the handler ignores its argument.
            let _ = unsafe {
                self.worker
                    .set_handler(id, super::state::on_dead, std::ptr::null_mut())
            };
        }
        self.free.push_back(base);
    }

    /// Keeps a failed endpoint to another process's worker (closed) for good.
    pub(super) fn retire(&mut self, peer: *mut super::state::PeerEp) {
        self.retired.push(peer);
    }
}

/// Lets a request (as returned by a `_nbx` call) run on without waiting for it: UCX frees it
/// when done. The caller holds the lock of the worker it belongs to.
pub(super) fn detach_request(request: sys::ucs_status_ptr_t) -> Result<(), sys::ucs_status_t> {
    match sys::status_ptr(request) {
        sys::StatusPtr::Done => Ok(()),
        sys::StatusPtr::Failed(status) => Err(status),
        sys::StatusPtr::Request(request) => {
            // SAFETY: a live request, freed once; UCX releases it when it completes.
            unsafe { sys::ucp_request_free(request) };
            Ok(())
        }
    }
}

/// Waits, taking the shared worker's lock only to progress it, for `request` (as returned by a
/// `_nbx` call made under the lock) to complete, until `until`. Frees the request either way.
pub(super) fn wait_unlocked(
    request: sys::ucs_status_ptr_t,
    until: Option<Instant>,
) -> Result<(), sys::ucs_status_t> {
    let request = match sys::status_ptr(request) {
        sys::StatusPtr::Done => return Ok(()),
        sys::StatusPtr::Failed(status) => return Err(status),
        sys::StatusPtr::Request(request) => request,
    };
    loop {
        let guard = lock();
        guard.worker.progress_all();
        // SAFETY: `request` is a live request of the shared worker, not yet freed.
        let status = unsafe { sys::ucp_request_check_status(request) };
        let timed_out = until.is_some_and(|u| Instant::now() >= u);
        if status != sys::UCS_INPROGRESS || timed_out {
            // SAFETY: freed once; a request still running is released by UCX when it
            // completes.
            unsafe { sys::ucp_request_free(request) };
            drop(guard);
            return if status == sys::UCS_INPROGRESS {
                Err(sys::UCS_ERR_TIMED_OUT)
            } else {
                check(status)
            };
        }
        drop(guard);
        std::thread::yield_now();
    }
}

/// Starts flushing `ep` (everything sent on it leaves this side); the request for
/// [`wait_unlocked`].
///
/// # Safety
///
/// `ep` must be a live endpoint of the shared worker, and the caller must hold its lock.
pub(super) unsafe fn start_flush(ep: sys::ucp_ep_h) -> sys::ucs_status_ptr_t {
    let param = request_param(0, None, std::ptr::null_mut());
    // SAFETY: the caller guarantees `ep` and the lock; `param` is initialised.
    unsafe { sys::ucp_ep_flush_nbx(ep, &param) }
}

/// Starts closing `ep` at once without telling the peer; the request for [`wait_unlocked`]
/// (it completes once every operation on the endpoint is done or cancelled).
///
/// # Safety
///
/// `ep` must be a live endpoint, not used again, and the caller must hold the lock of its
/// worker.
pub(super) unsafe fn start_close(ep: sys::ucp_ep_h) -> sys::ucs_status_ptr_t {
    let mut param = request_param(0, None, std::ptr::null_mut());
    param.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = sys::UCP_EP_CLOSE_FLAG_FORCE;
    // SAFETY: the caller guarantees `ep`; `param` is initialised.
    unsafe { sys::ucp_ep_close_nbx(ep, &param) }
}
