//! A C program's non-blocking allgather, given as callbacks (`urom_coll_oob_t` of liburom_coll,
//! `struct doca_urom_domain_oob_coll` of libdoca_urom), as the host API's [`OobCollective`].
//! Both libraries build their collective from one of these.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::c_void;
use std::marker::PhantomData;

use urom_host::oob::{OobCollective, OobError, OobRequest};

/// Starts an allgather of `msglen` bytes from every member, storing its request in `req`.
pub type AllgatherFn = unsafe extern "C" fn(
    sbuf: *mut c_void,
    rbuf: *mut c_void,
    msglen: usize,
    coll_info: *mut c_void,
    req: *mut *mut c_void,
) -> i32;

/// Tests or releases a request of [`AllgatherFn`]'s.
pub type RequestFn = unsafe extern "C" fn(req: *mut c_void) -> i32;

/// A program's collective: its three callbacks, its context, how many members and which one
/// this is.
#[derive(Clone, Copy)]
pub struct OobCallbacks {
    allgather: AllgatherFn,
    req_test: RequestFn,
    req_free: RequestFn,
    coll_info: *mut c_void,
    size: u32,
    rank: u32,
}

impl OobCallbacks {
    /// The callbacks, or `None` when one is missing (NULL).
    ///
    /// # Safety
    ///
    /// Each callback must have its type's signature and keep the contract the library's header
    /// states: `allgather` reads `msglen` bytes at `sbuf` and writes `msglen` bytes for each of
    /// `size` members at `rbuf` until `req_test` says its request completed, and takes
    /// `coll_info`; `req_test` and `req_free` take a request `allgather` returned and
    /// `req_free` did not release.
    pub unsafe fn new(
        allgather: Option<AllgatherFn>,
        req_test: Option<RequestFn>,
        req_free: Option<RequestFn>,
        coll_info: *mut c_void,
        size: u32,
        rank: u32,
    ) -> Option<Self> {
        Some(Self {
            allgather: allgather?,
            req_test: req_test?,
            req_free: req_free?,
            coll_info,
            size,
            rank,
        })
    }
}

/// How a library's callbacks say how they did.
pub trait OobStatus {
    /// Done: the request completed (or the callback succeeded).
    const DONE: i32;
    /// The request is still running.
    const IN_PROGRESS: i32;
    /// `status` in words, for errors.
    fn describe(status: i32) -> String;
    /// req_free failed with `status` (nothing more can be done about it).
    fn free_failed(status: i32) {
        let _ = status;
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

/// The program's collective as the host API's [`OobCollective`], its statuses read as `S`
/// says.
pub struct CallbackOob<S: OobStatus> {
    calls: OobCallbacks,
    next_id: u64,
    in_flight: HashMap<u64, Gather>,
    statuses: PhantomData<S>,
}

impl<S: OobStatus> CallbackOob<S> {
    /// The collective of `calls`; its rank must be below its size (the caller checks, to
    /// say so in its own words).
    pub fn new(calls: OobCallbacks) -> Self {
        Self {
            calls,
            next_id: 0,
            in_flight: HashMap::new(),
            statuses: PhantomData,
        }
    }

    /// Releases `gather`'s request with the program's req_free.
    fn release(&self, gather: Gather) {
        // SAFETY: the program's req_free (see `OobCallbacks::new`), with the request its
        // allgather returned, released once.
        let status = unsafe { (self.calls.req_free)(gather.req) };
        if status != S::DONE {
            S::free_failed(status);
        }
        if !gather.done {
            // The program may still write into them.
            Box::leak(gather.send);
            Box::leak(gather.recv);
        }
    }
}

impl<S: OobStatus> OobCollective for CallbackOob<S> {
    fn size(&self) -> u32 {
        self.calls.size
    }

    fn rank(&self) -> u32 {
        self.calls.rank
    }

    fn allgather(&mut self, send: &[u8]) -> Result<OobRequest, OobError> {
        let received = send.len().saturating_mul(self.size() as usize);
        // At least a byte each, so that the program gets two distinct buffers.
        let mut storage = vec![0u8; send.len().max(1)];
        storage[..send.len()].copy_from_slice(send);
        let mut send_buf: Box<[u8]> = storage.into();
        let mut recv: Box<[u8]> = vec![0u8; received.max(1)].into();
        let mut req: *mut c_void = std::ptr::null_mut();
        // SAFETY: the program's allgather (see `OobCallbacks::new`). `send_buf` holds
        // `send.len()` bytes and `recv` that many for each member; both stay where they are
        // until the request completes (see `Gather`); `req` is a local.
        let status = unsafe {
            (self.calls.allgather)(
                send_buf.as_mut_ptr().cast(),
                recv.as_mut_ptr().cast(),
                send.len(),
                self.calls.coll_info,
                &mut req,
            )
        };
        if status != S::DONE {
            return Err(OobError::new(format!(
                "the out-of-band allgather returned {}",
                S::describe(status)
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
        let req_test = self.calls.req_test;
        let Some(gather) = self.in_flight.get_mut(&id) else {
            return Err(OobError::new(format!(
                "request {id} is not an allgather of this collective in flight"
            )));
        };
        if !gather.done {
            // SAFETY: the program's req_test (see `OobCallbacks::new`), with the request its
            // allgather returned, not yet released.
            let status = unsafe { req_test(gather.req) };
            if status == S::IN_PROGRESS {
                return Ok(false);
            }
            if status != S::DONE {
                return Err(OobError::new(format!(
                    "the out-of-band req_test returned {}",
                    S::describe(status)
                )));
            }
            gather.done = true;
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

impl<S: OobStatus> Drop for CallbackOob<S> {
    fn drop(&mut self) {
        for (_, gather) in std::mem::take(&mut self.in_flight) {
            self.release(gather);
        }
    }
}
