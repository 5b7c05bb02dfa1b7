//! The C boundary: the exported `urom_*` functions of `urom_coll.h`, and the caller's
//! out-of-band allgather (`urom_coll_oob_t`) as a [`CallbackOob`]. The crate's only unsafe
//! code: raw handles, C strings and arrays, C callbacks, memory registered by address.
//!
//! Every exported function runs its body in [`guard`] (no panic unwinds into C; a caught one
//! gives `UROM_ERR_INTERNAL`), takes handles as `Option<&T>` (NULL arrives as `None`) and
//! checks the object's magic word and thread before use, so NULL and destroyed handles give
//! `UROM_ERR_INVALID_PARAM` while their memory still holds one of ours. Handles come from
//! `Box::into_raw` and go back through `Box::from_raw` once, in the matching destroy call,
//! after their magic word is cleared.
#![allow(unsafe_code)]

use std::cell::Cell;
use std::ffi::{CStr, c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;

use urom_capi_abi::oob::{AllgatherFn, CallbackOob, OobCallbacks, OobStatus, RequestFn};

use crate::objects::{Args, BufferObj, ContextObj, Part, ReqObj, Shared, TeamObj, magic};
use crate::status::{Failure, RawStatus, UromStatus, last_error_ptr, report};

/// Runs an exported function's body: its status, `UROM_ERR_INTERNAL` if it panicked.
fn guard(body: impl FnOnce() -> Result<UromStatus, Failure>) -> RawStatus {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(result) => report(result),
        Err(_) => report(Err(Failure::new(
            UromStatus::Internal,
            "liburom_coll panicked (a bug); the call did nothing more",
        ))),
    }
}

fn invalid(why: &str) -> Failure {
    Failure::new(UromStatus::InvalidParam, why)
}

/// An object with a magic word and a context.
trait Handle {
    const MAGIC: u64;
    const NAME: &'static str;
    fn magic(&self) -> &Cell<u64>;
    fn shared(&self) -> &Shared;
}

macro_rules! handle {
    ($ty:ty, $magic:expr, $name:expr) => {
        impl Handle for $ty {
            const MAGIC: u64 = $magic;
            const NAME: &'static str = $name;
            fn magic(&self) -> &Cell<u64> {
                &self.magic
            }
            fn shared(&self) -> &Shared {
                &self.shared
            }
        }
    };
}

handle!(ContextObj, magic::CONTEXT, "context");
handle!(TeamObj, magic::TEAM, "team");
handle!(BufferObj, magic::BUFFER, "buffer");
handle!(ReqObj, magic::REQ, "collective");

/// The live object `handle` refers to, used from its context's thread.
fn live<T: Handle>(handle: Option<&T>) -> Result<&T, Failure> {
    let object = handle.ok_or_else(|| invalid(&format!("the {} handle is NULL", T::NAME)))?;
    if object.magic().get() != T::MAGIC {
        return Err(invalid(&format!(
            "the {} handle is not a live one (destroyed, or not from liburom_coll)",
            T::NAME
        )));
    }
    object.shared().on_my_thread()?;
    Ok(object)
}

/// Hands `object` to C.
fn export<T>(object: T, out: &mut *mut T) -> Result<UromStatus, Failure> {
    *out = Box::into_raw(Box::new(object));
    Ok(UromStatus::Ok)
}

/// Takes back the object `ptr` points to, after checking it (see [`live`]).
///
/// # Safety
///
/// `ptr` is NULL or a pointer [`export`] gave, not reclaimed since (a reclaimed one whose
/// memory still holds the magic word is refused only by luck: C must not reuse it).
unsafe fn reclaim<T: Handle>(ptr: *mut T) -> Result<Box<T>, Failure> {
    // SAFETY: the caller passes NULL or a live exported pointer.
    live(unsafe { ptr.as_ref() })?;
    // SAFETY: checked live just above; exported by `Box::into_raw`, reclaimed once (its magic
    // word is cleared before it is dropped).
    let object = unsafe { Box::from_raw(ptr) };
    object.magic().set(0);
    Ok(object)
}

// ---------------------------------------------------------------------------------------------
// The caller's out-of-band allgather.

/// `urom_coll_oob_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct OobColl {
    allgather: Option<AllgatherFn>,
    req_test: Option<RequestFn>,
    req_free: Option<RequestFn>,
    coll_info: *mut c_void,
    n_oob_eps: u32,
    oob_ep: u32,
}

impl OobColl {
    /// The collective, or why it cannot be used.
    fn collective(&self) -> Result<CallbackOob<CollStatus>, Failure> {
        // SAFETY: the caller's callbacks with urom_coll_oob_t's signatures and contract, which
        // are `OobCallbacks::new`'s.
        let calls = unsafe {
            OobCallbacks::new(
                self.allgather,
                self.req_test,
                self.req_free,
                self.coll_info,
                self.n_oob_eps,
                self.oob_ep,
            )
        };
        let calls = calls.ok_or_else(|| {
            invalid("the out-of-band collective needs its allgather, req_test and req_free")
        })?;
        if self.oob_ep >= self.n_oob_eps {
            return Err(invalid("oob_ep must be below n_oob_eps"));
        }
        Ok(CallbackOob::new(calls))
    }
}

/// How the caller's callbacks say how they did: `urom_status_t`.
struct CollStatus;

impl OobStatus for CollStatus {
    const DONE: RawStatus = UromStatus::Ok.raw();
    const IN_PROGRESS: RawStatus = UromStatus::InProgress.raw();

    fn describe(status: RawStatus) -> String {
        status.to_string()
    }
}

// ---------------------------------------------------------------------------------------------
// Statuses.

/// `urom_status_string()`.
#[unsafe(no_mangle)]
pub extern "C" fn urom_status_string(status: RawStatus) -> *const c_char {
    catch_unwind(|| match UromStatus::from_raw(status) {
        Some(status) => status.describe().as_ptr(),
        None => c"not a urom_status_t".as_ptr(),
    })
    .unwrap_or(c"".as_ptr())
}

/// `urom_coll_last_error()`.
#[unsafe(no_mangle)]
pub extern "C" fn urom_coll_last_error() -> *const c_char {
    catch_unwind(last_error_ptr).unwrap_or(c"".as_ptr())
}

// ---------------------------------------------------------------------------------------------
// Contexts.

/// `urom_coll_context_params_t`.
#[repr(C)]
pub struct ContextParams {
    oob: OobColl,
    service_socket: *const c_char,
}

/// `urom_coll_context_create()`.
#[unsafe(no_mangle)]
pub extern "C" fn urom_coll_context_create(
    params: Option<&ContextParams>,
    context: Option<&mut *mut ContextObj>,
) -> RawStatus {
    guard(|| {
        let params = params.ok_or_else(|| invalid("params is NULL"))?;
        let out = context.ok_or_else(|| invalid("context is NULL"))?;
        let socket = if params.service_socket.is_null() {
            None
        } else {
            // SAFETY: a non-NULL service_socket is a NUL-terminated string (the header's
            // contract), read here only.
            let text = unsafe { CStr::from_ptr(params.service_socket) };
            Some(PathBuf::from(
                text.to_str()
                    .map_err(|_| invalid("service_socket is not UTF-8"))?,
            ))
        };
        let mut oob = params.oob.collective()?;
        export(ContextObj::create(&mut oob, socket)?, out)
    })
}

/// `urom_coll_context_progress()`.
#[unsafe(no_mangle)]
pub extern "C" fn urom_coll_context_progress(context: Option<&ContextObj>) -> RawStatus {
    guard(|| live(context)?.progress())
}

/// `urom_coll_context_destroy()`.
///
/// # Safety
///
/// `context` is NULL or a handle from `urom_coll_context_create()` not destroyed since.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn urom_coll_context_destroy(context: *mut ContextObj) -> RawStatus {
    // SAFETY: the caller passes NULL or a live handle.
    guard(|| unsafe { reclaim(context) }.map(|_| UromStatus::Ok))
}

// ---------------------------------------------------------------------------------------------
// Teams.

/// `urom_coll_team_params_t`.
#[repr(C)]
pub struct TeamParams {
    oob: OobColl,
}

/// `urom_coll_team_create()`.
#[unsafe(no_mangle)]
pub extern "C" fn urom_coll_team_create(
    context: Option<&ContextObj>,
    params: Option<&TeamParams>,
    team: Option<&mut *mut TeamObj>,
) -> RawStatus {
    guard(|| {
        let context = live(context)?;
        let params = params.ok_or_else(|| invalid("params is NULL"))?;
        let out = team.ok_or_else(|| invalid("team is NULL"))?;
        let mut oob = params.oob.collective()?;
        export(TeamObj::create(&context.shared, &mut oob)?, out)
    })
}

/// `urom_coll_team_query()`.
#[unsafe(no_mangle)]
pub extern "C" fn urom_coll_team_query(
    team: Option<&TeamObj>,
    rank: Option<&mut u32>,
    size: Option<&mut u32>,
) -> RawStatus {
    guard(|| {
        let team = live(team)?;
        if let Some(rank) = rank {
            *rank = team.team.rank();
        }
        if let Some(size) = size {
            *size = team.team.size();
        }
        Ok(UromStatus::Ok)
    })
}

/// `urom_coll_team_worker_pid()`.
#[unsafe(no_mangle)]
pub extern "C" fn urom_coll_team_worker_pid(
    team: Option<&TeamObj>,
    pid: Option<&mut u32>,
) -> RawStatus {
    guard(|| {
        let team = live(team)?;
        *pid.ok_or_else(|| invalid("pid is NULL"))? = team.team.worker_pid();
        Ok(UromStatus::Ok)
    })
}

/// `urom_coll_team_destroy()`.
///
/// # Safety
///
/// `team` is NULL or a handle from `urom_coll_team_create()` not destroyed since.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn urom_coll_team_destroy(team: *mut TeamObj) -> RawStatus {
    // SAFETY: the caller passes NULL or a live handle.
    guard(|| unsafe { reclaim(team) }.map(|_| UromStatus::Ok))
}

// ---------------------------------------------------------------------------------------------
// Buffers.

/// `urom_coll_mem_alloc()`.
#[unsafe(no_mangle)]
pub extern "C" fn urom_coll_mem_alloc(
    team: Option<&TeamObj>,
    len: usize,
    ptr: Option<&mut *mut c_void>,
    buffer: Option<&mut *mut BufferObj>,
) -> RawStatus {
    guard(|| {
        let team = live(team)?;
        let ptr = ptr.ok_or_else(|| invalid("ptr is NULL"))?;
        let out = buffer.ok_or_else(|| invalid("buffer is NULL"))?;
        let object = team.alloc(len)?;
        *ptr = object.buffer.as_mut_ptr().cast();
        export(object, out)
    })
}

/// `urom_coll_mem_register()`.
///
/// # Safety
///
/// The header's contract: `len` bytes at `addr` stay mapped and writable until the buffer is
/// freed and every collective over it ended, and the program leaves them alone while a
/// collective using them runs.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn urom_coll_mem_register(
    team: Option<&TeamObj>,
    addr: *mut c_void,
    len: usize,
    buffer: Option<&mut *mut BufferObj>,
) -> RawStatus {
    guard(|| {
        let team = live(team)?;
        let out = buffer.ok_or_else(|| invalid("buffer is NULL"))?;
        if addr.is_null() && len > 0 {
            return Err(invalid("addr is NULL"));
        }
        let mut engine = team.shared.engine()?;
        // SAFETY: the caller keeps the memory mapped and leaves it to the worker while a
        // collective runs (this function's contract, which is `register_raw`'s).
        let registered = unsafe { team.team.register_raw(&mut engine, addr.cast(), len) };
        drop(engine);
        export(BufferObj::new(&team.shared, registered?), out)
    })
}

/// `urom_coll_mem_free()`.
///
/// # Safety
///
/// `buffer` is NULL or a handle from `urom_coll_mem_alloc()` or `urom_coll_mem_register()`
/// not freed since.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn urom_coll_mem_free(buffer: *mut BufferObj) -> RawStatus {
    // SAFETY: the caller passes NULL or a live handle.
    guard(|| unsafe { reclaim(buffer) }.map(|_| UromStatus::Ok))
}

// ---------------------------------------------------------------------------------------------
// Collectives.

/// `urom_coll_buffer_info_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct BufferInfo {
    buffer: *const BufferObj,
    offset: u64,
    count: u64,
}

/// `urom_coll_args_t`.
#[repr(C)]
pub struct CollArgs {
    coll_type: u32,
    datatype: u32,
    op: u32,
    root: u32,
    flags: u32,
    src: BufferInfo,
    dst: BufferInfo,
    counts: *const u64,
    counts_len: usize,
}

/// The part `info` names, its buffer checked.
///
/// # Safety
///
/// `info.buffer` is NULL or a buffer handle not freed since.
unsafe fn part<'a>(info: BufferInfo) -> Result<Part<'a>, Failure> {
    let buffer = if info.buffer.is_null() {
        None
    } else {
        // SAFETY: the caller passes NULL or a live handle.
        Some(live(unsafe { info.buffer.as_ref() })?)
    };
    Ok(Part {
        buffer,
        offset: info.offset,
        count: info.count,
    })
}

/// The collective `args` describes, its handles checked.
///
/// # Safety
///
/// `args.src.buffer` and `args.dst.buffer` are NULL or live buffer handles, and `args.counts`
/// holds `args.counts_len` words (the header's contract), read while the result lives.
unsafe fn parse<'a>(args: &'a CollArgs) -> Result<Args<'a>, Failure> {
    let counts: &[u64] = if args.counts_len == 0 {
        &[]
    } else if args.counts.is_null() {
        return Err(invalid("counts is NULL but counts_len is not 0"));
    } else {
        // SAFETY: the caller's contract: `counts` holds `counts_len` words, read during the
        // call only (copied into the command).
        unsafe { std::slice::from_raw_parts(args.counts, args.counts_len) }
    };
    // SAFETY: `args.src.buffer` is NULL or a live handle (the caller's contract; checked by
    // magic word).
    let src = unsafe { part(args.src)? };
    // SAFETY: as for `src`.
    let dst = unsafe { part(args.dst)? };
    Ok(Args {
        kind: args.coll_type,
        datatype: args.datatype,
        op: args.op,
        root: args.root,
        flags: args.flags,
        src,
        dst,
        counts,
    })
}

/// `urom_coll_init()`.
#[unsafe(no_mangle)]
pub extern "C" fn urom_coll_init(
    team: Option<&TeamObj>,
    args: Option<&CollArgs>,
    req: Option<&mut *mut ReqObj>,
) -> RawStatus {
    guard(|| {
        let team = live(team)?;
        let args = args.ok_or_else(|| invalid("args is NULL"))?;
        let out = req.ok_or_else(|| invalid("req is NULL"))?;
        // SAFETY: the header's contract for `args` (its buffers NULL or live, `counts_len`
        // words at `counts`).
        let parsed = unsafe { parse(args)? };
        export(ReqObj::init(team, &parsed)?, out)
    })
}

/// `urom_coll_rebind()`.
#[unsafe(no_mangle)]
pub extern "C" fn urom_coll_rebind(req: Option<&ReqObj>, args: Option<&CollArgs>) -> RawStatus {
    guard(|| {
        let req = live(req)?;
        let args = args.ok_or_else(|| invalid("args is NULL"))?;
        // SAFETY: the header's contract for `args`, as for urom_coll_init().
        let parsed = unsafe { parse(args)? };
        req.rebind(&parsed)?;
        Ok(UromStatus::Ok)
    })
}

/// `urom_coll_start()`.
#[unsafe(no_mangle)]
pub extern "C" fn urom_coll_start(req: Option<&ReqObj>) -> RawStatus {
    guard(|| live(req)?.start())
}

/// `urom_coll_test()`.
#[unsafe(no_mangle)]
pub extern "C" fn urom_coll_test(req: Option<&ReqObj>) -> RawStatus {
    guard(|| live(req)?.test())
}

/// `urom_coll_wait()`.
#[unsafe(no_mangle)]
pub extern "C" fn urom_coll_wait(req: Option<&ReqObj>) -> RawStatus {
    guard(|| live(req)?.wait())
}

/// `urom_coll_callback_t`.
pub type Callback = unsafe extern "C" fn(arg: *mut c_void, status: RawStatus);

/// `urom_coll_set_callback()`.
#[unsafe(no_mangle)]
pub extern "C" fn urom_coll_set_callback(
    req: Option<&ReqObj>,
    cb: Option<Callback>,
    arg: *mut c_void,
) -> RawStatus {
    guard(|| {
        let req = live(req)?;
        let callback = cb.map(|cb| {
            let arg = arg as usize;
            Box::new(move |status: UromStatus| {
                // SAFETY: the caller's callback with urom_coll_callback_t's signature and the
                // argument it gave, called from this context's progress on its thread.
                unsafe { cb(arg as *mut c_void, status.raw()) }
            }) as Box<dyn FnMut(UromStatus)>
        });
        req.set_callback(callback)?;
        Ok(UromStatus::Ok)
    })
}

/// `urom_coll_free()`.
///
/// # Safety
///
/// `req` is NULL or a handle from `urom_coll_init()` not freed since.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn urom_coll_free(req: *mut ReqObj) -> RawStatus {
    guard(|| {
        // SAFETY: the caller passes NULL or a live handle.
        live(unsafe { req.as_ref() })?.freeable()?;
        // SAFETY: as above; checked live and not running.
        unsafe { reclaim(req) }.map(|_| UromStatus::Ok)
    })
}
