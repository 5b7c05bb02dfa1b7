//! `doca_urom_domain_*`, and the program's out-of-band collective
//! (`struct doca_urom_domain_oob_coll`) as an [`OobCollective`].

use std::collections::HashMap;
use std::ffi::c_void;

use urom_capi_abi::{DocaCtx, DocaError, Status};
use urom_host::oob::{OobCollective, OobError, OobRequest};

use super::{arg, guard, guard_value};
use crate::domain::DomainObj;
use crate::log;
use crate::worker::WorkerObj;

/// `doca_urom_domain_allgather_cb_t`.
pub type AllgatherCb = unsafe extern "C" fn(
    sbuf: *mut c_void,
    rbuf: *mut c_void,
    msglen: usize,
    coll_info: *mut c_void,
    req: *mut *mut c_void,
) -> DocaError;

/// `doca_urom_domain_req_test_cb_t` and `doca_urom_domain_req_free_cb_t`.
pub type RequestCb = unsafe extern "C" fn(req: *mut c_void) -> DocaError;

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
    /// Why it cannot be used, if it cannot.
    pub(crate) fn check(&self) -> Result<(), String> {
        if self.allgather.is_none() || self.req_test.is_none() || self.req_free.is_none() {
            return Err(
                "the out-of-band collective needs its allgather, req_test and req_free callbacks"
                    .to_owned(),
            );
        }
        if self.oob_index >= self.n_oob_indexes {
            return Err(format!(
                "out-of-band index {} is not below the number of indexes {}",
                self.oob_index, self.n_oob_indexes
            ));
        }
        Ok(())
    }
}

/// An allgather of the program's in flight, with the buffers it reads and writes.
struct Gather {
    // INVARIANTS: the program may read `send` and write `recv` until its req_test said the
    // request completed (`done`); until then neither is freed (a request released before it
    // completed leaks them).
    req: *mut c_void,
    send: Box<[u8]>,
    recv: Box<[u8]>,
    /// How many bytes of `recv` the allgather fills.
    received: usize,
    done: bool,
}

/// The program's collective as the host API's [`OobCollective`].
pub(crate) struct CallbackOob {
    coll: OobColl,
    next_id: u64,
    in_flight: HashMap<u64, Gather>,
}

impl CallbackOob {
    /// `coll` has passed [`OobColl::check`].
    pub(crate) fn new(coll: OobColl) -> Self {
        Self {
            coll,
            next_id: 0,
            in_flight: HashMap::new(),
        }
    }

    /// Releases `gather`'s request with the program's req_free.
    fn release(&self, gather: Gather) {
        if let Some(req_free) = self.coll.req_free {
            // SAFETY: the program gave req_free in doca_urom_domain_set_oob with DOCA's
            // signature; `gather.req` is the request its allgather returned, released once.
            let status = unsafe { req_free(gather.req) };
            if status != Status::Success.raw() {
                log::warn(
                    "domain",
                    &format!(
                        "the out-of-band req_free returned {}",
                        urom_capi_abi::name(Status::from_raw(status))
                    ),
                );
            }
        }
        if !gather.done {
            // The program may still write into them.
            Box::leak(gather.send);
            Box::leak(gather.recv);
        }
    }
}

impl OobCollective for CallbackOob {
    fn size(&self) -> u32 {
        self.coll.n_oob_indexes
    }

    fn rank(&self) -> u32 {
        self.coll.oob_index
    }

    fn allgather(&mut self, send: &[u8]) -> Result<OobRequest, OobError> {
        let allgather = self
            .coll
            .allgather
            .ok_or_else(|| OobError::new("the out-of-band collective has no allgather"))?;
        let received = send.len().saturating_mul(self.size() as usize);
        // At least a byte each, so that the program gets two distinct buffers.
        let mut storage = vec![0u8; send.len().max(1)];
        storage[..send.len()].copy_from_slice(send);
        let mut send_buf: Box<[u8]> = storage.into();
        let mut recv: Box<[u8]> = vec![0u8; received.max(1)].into();
        let mut req: *mut c_void = std::ptr::null_mut();
        // SAFETY: the program gave `allgather` in doca_urom_domain_set_oob with DOCA's
        // signature. `send_buf` holds `send.len()` bytes and `recv` that many for each rank; both
        // stay where they are until the request completes (see `Gather`); `req` is a local.
        let status = unsafe {
            allgather(
                send_buf.as_mut_ptr().cast(),
                recv.as_mut_ptr().cast(),
                send.len(),
                self.coll.coll_info,
                &mut req,
            )
        };
        if status != Status::Success.raw() {
            return Err(OobError::new(format!(
                "the out-of-band allgather returned {}",
                urom_capi_abi::name(Status::from_raw(status))
            )));
        }
        let id = self.next_id;
        self.next_id += 1;
        self.in_flight.insert(
            id,
            Gather {
                req,
                send: send_buf,
                recv,
                received,
                done: false,
            },
        );
        Ok(OobRequest::new(id, send.len(), self.size()))
    }

    fn test(&mut self, request: &mut OobRequest) -> Result<bool, OobError> {
        let id = request.id();
        let req_test = self.coll.req_test;
        let Some(gather) = self.in_flight.get_mut(&id) else {
            return Err(OobError::new(format!(
                "request {id} is not an allgather of this collective in flight"
            )));
        };
        if !gather.done {
            let Some(req_test) = req_test else {
                return Err(OobError::new("the out-of-band collective has no req_test"));
            };
            // SAFETY: the program gave req_test in doca_urom_domain_set_oob with DOCA's
            // signature; `gather.req` is the request its allgather returned, not yet released.
            let status = unsafe { req_test(gather.req) };
            match Status::from_raw(status) {
                Status::Success => gather.done = true,
                Status::InProgress => return Ok(false),
                other => {
                    return Err(OobError::new(format!(
                        "the out-of-band req_test returned {} ({status})",
                        urom_capi_abi::name(other)
                    )));
                }
            }
        }
        let Some(blocks) = gather.recv.get(..gather.received) else {
            return Err(OobError::new("the allgather's receive buffer is short"));
        };
        request.fill(blocks)?;
        Ok(true)
    }

    fn free(&mut self, request: OobRequest) {
        if let Some(gather) = self.in_flight.remove(&request.id()) {
            self.release(gather);
        }
    }
}

impl Drop for CallbackOob {
    fn drop(&mut self) {
        let gathers: Vec<Gather> = self.in_flight.drain().map(|(_, g)| g).collect();
        for gather in gathers {
            self.release(gather);
        }
    }
}

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
