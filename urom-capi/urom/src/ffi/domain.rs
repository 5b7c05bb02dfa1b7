//! `doca_urom_domain_*`, and the program's out-of-band collective
//! (`struct doca_urom_domain_oob_coll`) as the host API's collective.

use std::ffi::c_void;

use urom_capi_abi::oob::{AllgatherFn, OobCallbacks, OobStatus, RequestFn};
use urom_capi_abi::{DocaCtx, DocaError, Status};

use super::{arg, guard, guard_value};
use crate::domain::DomainObj;
use crate::log;
use crate::worker::WorkerObj;

/// `doca_urom_domain_allgather_cb_t`.
pub type AllgatherCb = AllgatherFn;

/// `doca_urom_domain_req_test_cb_t` and `doca_urom_domain_req_free_cb_t`.
pub type RequestCb = RequestFn;

/// `struct doca_urom_domain_oob_coll`: the program's non-blocking allgather.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct OobColl {
    /// Starts an allgather of `msglen` bytes from every rank; stores its request.
    pub allgather: Option<AllgatherCb>,
    /// `DOCA_SUCCESS` once the request completed, `DOCA_ERROR_IN_PROGRESS` before; anything
    /// else (UCC-based programs return negative codes) is an error.
    pub req_test: Option<RequestCb>,
    /// Releases a request.
    pub req_free: Option<RequestCb>,
    /// The program's context, passed to `allgather`.
    pub coll_info: *mut c_void,
    /// How many ranks.
    pub n_oob_indexes: u32,
    /// This rank.
    pub oob_index: u32,
}

impl OobColl {
    /// The collective, or why it cannot be used.
    pub(crate) fn collective(&self) -> Result<CallbackOob, String> {
        // SAFETY: the program gave the callbacks in doca_urom_domain_set_oob with DOCA's
        // signatures and contract, which are `OobCallbacks::new`'s.
        let calls = unsafe {
            OobCallbacks::new(
                self.allgather,
                self.req_test,
                self.req_free,
                self.coll_info,
                self.n_oob_indexes,
                self.oob_index,
            )
        };
        let Some(calls) = calls else {
            return Err(
                "the out-of-band collective needs its allgather, req_test and req_free callbacks"
                    .to_owned(),
            );
        };
        if self.oob_index >= self.n_oob_indexes {
            return Err(format!(
                "out-of-band index {} is not below the number of indexes {}",
                self.oob_index, self.n_oob_indexes
            ));
        }
        Ok(CallbackOob::new(calls))
    }
}

/// How DOCA's callbacks say how they did.
pub(crate) struct DocaStatus;

impl OobStatus for DocaStatus {
    const DONE: i32 = Status::Success.raw();
    const IN_PROGRESS: i32 = Status::InProgress.raw();

    fn describe(status: i32) -> String {
        format!(
            "{} ({status})",
            urom_capi_abi::name(Status::from_raw(status))
        )
    }

    fn free_failed(status: i32) {
        log::warn(
            "domain",
            &format!(
                "the out-of-band req_free returned {}",
                Self::describe(status)
            ),
        );
    }
}

/// The program's collective as the host API's [`OobCollective`](urom_host::oob::OobCollective).
pub(crate) type CallbackOob = urom_capi_abi::oob::CallbackOob<DocaStatus>;

#[unsafe(no_mangle)]
pub extern "C" fn doca_urom_domain_create(domain_ctx: Option<&mut *mut DomainObj>) -> DocaError {
    super::create(domain_ctx)
}

/// Destroys an idle domain.
///
/// # Safety
///
/// `domain_ctx` is NULL or a live domain from `doca_urom_domain_create`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn doca_urom_domain_destroy(domain_ctx: *mut DomainObj) -> DocaError {
    // SAFETY: the caller's contract is `destroy`'s.
    unsafe { super::destroy(domain_ctx) }
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_urom_domain_set_oob(
    domain_ctx: Option<&DomainObj>,
    oob: Option<&OobColl>,
) -> DocaError {
    guard(|| {
        let domain = DomainObj::check(domain_ctx)?;
        domain.set_oob(*arg(oob)?)
    })
}

/// Sets the domain's workers: `workers[i]` is domain id `domain_worker_ids[i]`.
///
/// # Safety
///
/// `domain_worker_ids` and `workers` are NULL or hold `workers_cnt` entries each; each worker
/// is NULL or a live worker.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn doca_urom_domain_set_workers(
    domain_ctx: Option<&DomainObj>,
    domain_worker_ids: *const u64,
    workers: *const *mut WorkerObj,
    workers_cnt: usize,
) -> DocaError {
    guard(|| {
        let domain = DomainObj::check(domain_ctx)?;
        if workers_cnt > 0 && (domain_worker_ids.is_null() || workers.is_null()) {
            return Err(Status::InvalidValue);
        }
        let (ids, handles) = if workers_cnt == 0 {
            (&[][..], &[][..])
        } else {
            // SAFETY: both arrays hold `workers_cnt` entries, as the caller guarantees, and
            // were checked for NULL above.
            let ids = unsafe { std::slice::from_raw_parts(domain_worker_ids, workers_cnt) };
            // SAFETY: as above.
            let handles = unsafe { std::slice::from_raw_parts(workers, workers_cnt) };
            (ids, handles)
        };
        let workers = handles
            .iter()
            .map(|&handle| {
                // SAFETY: each entry is NULL or a live worker, as the caller guarantees.
                WorkerObj::check(unsafe { handle.as_ref() })
            })
            .collect::<Result<Vec<&WorkerObj>, Status>>()?;
        domain.set_workers(ids, &workers)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_urom_domain_set_buffers_count(
    domain_ctx: Option<&DomainObj>,
    buffers_cnt: usize,
) -> DocaError {
    guard(|| DomainObj::check(domain_ctx)?.set_buffers_count(buffers_cnt))
}

/// The bytes of a packed key the program passed; NULL is empty only with length 0.
///
/// # Safety
///
/// `ptr` is NULL or points to `len` readable bytes.
unsafe fn key_bytes<'a>(ptr: *const c_void, len: usize) -> Result<&'a [u8], Status> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(Status::InvalidValue);
    }
    // SAFETY: `ptr` points to `len` readable bytes, as the caller guarantees.
    Ok(unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) })
}

/// Adds a buffer to the domain: its address and length, packed memory handle and remote key
/// (copied).
///
/// # Safety
///
/// `memh` and `mkey` are NULL or point to `memh_len` and `mkey_len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn doca_urom_domain_add_buffer(
    domain_ctx: Option<&DomainObj>,
    buffer: *mut c_void,
    buf_len: usize,
    memh: *mut c_void,
    memh_len: usize,
    mkey: *mut c_void,
    mkey_len: usize,
) -> DocaError {
    guard(|| {
        let domain = DomainObj::check(domain_ctx)?;
        // SAFETY: as the caller guarantees.
        let memh = unsafe { key_bytes(memh, memh_len) }?;
        // SAFETY: as the caller guarantees.
        let mkey = unsafe { key_bytes(mkey, mkey_len) }?;
        domain.add_buffer(buffer.addr() as u64, buf_len as u64, memh, mkey)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn doca_urom_domain_as_ctx(domain_ctx: Option<&DomainObj>) -> *mut DocaCtx {
    guard_value(std::ptr::null_mut(), || {
        DomainObj::check(domain_ctx).map_or(std::ptr::null_mut(), DomainObj::ctx)
    })
}
