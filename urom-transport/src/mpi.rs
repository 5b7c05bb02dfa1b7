//! MPI glue for the out-of-band collective: a non-blocking allgather of bytes that owns its
//! buffers, and the error handling of a communicator.
//!
//! The `mpi` crate's own non-blocking collectives borrow their buffers for the request's
//! lifetime, which a request kept across calls (as the host's out-of-band collective keeps
//! it) cannot express. [`Iallgather`] instead owns both buffers on the heap and hands MPI their
//! addresses; the buffers are released only once MPI says the operation completed, and leaked
//! if it never does.

use std::ffi::c_int;
use std::fmt;

use mpi::datatype::Equivalence;
use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::{Communicator, SimpleCommunicator};

/// An MPI call that failed: its name and what MPI says about the error code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpiError {
    /// The MPI function.
    pub call: &'static str,
    /// MPI's error code.
    pub code: c_int,
    /// MPI's text for the code.
    pub text: String,
}

impl fmt::Display for MpiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} failed: {} (MPI error {})",
            self.call, self.text, self.code
        )
    }
}

impl MpiError {
    /// `Ok` for `MPI_SUCCESS`, the error of `call` otherwise.
    pub fn check(call: &'static str, code: c_int) -> Result<(), Self> {
        if code == ffi::MPI_SUCCESS as c_int {
            return Ok(());
        }
        Err(Self {
            call,
            code,
            text: error_text(code),
        })
    }
}

/// MPI's description of error code `code`.
fn error_text(code: c_int) -> String {
    // Open MPI aborts the process on an MPI call outside MPI_Init .. MPI_Finalize.
    if !mpi::environment::is_initialized() || mpi::environment::is_finalized() {
        return format!("MPI error {code} while MPI is not initialized");
    }
    let mut text = vec![0u8; ffi::MPI_MAX_ERROR_STRING as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: MPI is initialized; `text` holds MPI_MAX_ERROR_STRING + 1 bytes, as much as
    // MPI_Error_string writes; `len` is a valid int to write the length into.
    let rc = unsafe { ffi::MPI_Error_string(code, text.as_mut_ptr().cast(), &mut len) };
    if rc != ffi::MPI_SUCCESS as c_int {
        return format!("unknown MPI error {code}");
    }
    text.truncate(usize::try_from(len).unwrap_or(0).min(text.len()));
    String::from_utf8_lossy(&text).into_owned()
}

/// Makes MPI calls on `comm` return their errors instead of aborting the job.
pub fn errors_return(comm: &SimpleCommunicator) -> Result<(), MpiError> {
    // SAFETY: reading the predefined error-handler handle that the `mpi` crate's C shim
    // defines once, as a constant.
    let handler = unsafe { ffi::RSMPI_ERRORS_RETURN };
    // SAFETY: `comm` is a live communicator (the value owns or names it) and `handler` a
    // predefined error handler.
    let rc = unsafe { ffi::MPI_Comm_set_errhandler(comm.as_raw(), handler) };
    MpiError::check("MPI_Comm_set_errhandler", rc)
}

/// An `MPI_Iallgather` of bytes in flight, owning its send and receive buffers.
pub struct Iallgather {
    // INVARIANTS: while `active`, MPI reads `send` and writes `recv` through the addresses it
    // was given at start: neither boxed slice is touched, reallocated or freed until MPI_Test
    // says the request completed (if it never does, `Drop` leaks them). Once not `active`,
    // `request` is MPI_REQUEST_NULL and the buffers are ours again.
    request: ffi::MPI_Request,
    active: bool,
    send: Box<[u8]>,
    recv: Box<[u8]>,
    /// How many bytes of `recv` the allgather fills.
    received: usize,
}

impl fmt::Debug for Iallgather {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Iallgather")
            .field("active", &self.active)
            .field("received", &self.received)
            .finish()
    }
}

impl Iallgather {
    /// Starts gathering `send` from every rank of `comm` (each rank passes the same length).
    pub fn start(comm: &SimpleCommunicator, send: &[u8]) -> Result<Self, MpiError> {
        let size = usize::try_from(comm.size()).unwrap_or(0);
        let count = c_int::try_from(send.len()).map_err(|_| MpiError {
            call: "MPI_Iallgather",
            code: ffi::MPI_ERR_COUNT as c_int,
            text: format!("a block of {} bytes is more than MPI counts", send.len()),
        })?;
        // At least a byte each, so that two empty buffers are distinct allocations (MPI refuses
        // a send buffer that is the receive buffer).
        let received = send.len().saturating_mul(size);
        let mut storage = vec![0u8; send.len().max(1)];
        storage[..send.len()].copy_from_slice(send);
        let send: Box<[u8]> = storage.into();
        let mut recv: Box<[u8]> = vec![0u8; received.max(1)].into();
        let bytes = u8::equivalent_datatype().as_raw();
        let mut request = std::mem::MaybeUninit::<ffi::MPI_Request>::uninit();
        // SAFETY: `send` holds `count` bytes and `recv` `count` bytes for each of the `size`
        // ranks of `comm`, both on the heap where they stay, untouched, until the request
        // completes (see the struct's invariants); `bytes` is MPI's one-byte datatype, `comm`
        // a live communicator and `request` room for the request handle.
        let rc = unsafe {
            ffi::MPI_Iallgather(
                send.as_ptr().cast(),
                count,
                bytes,
                recv.as_mut_ptr().cast(),
                count,
                bytes,
                comm.as_raw(),
                request.as_mut_ptr(),
            )
        };
        MpiError::check("MPI_Iallgather", rc)?;
        // SAFETY: MPI_Iallgather returned MPI_SUCCESS, so it wrote the request handle.
        let request = unsafe { request.assume_init() };
        Ok(Self {
            request,
            active: true,
            send,
            recv,
            received,
        })
    }

    /// Tests the request once: every rank's block (rank `i`'s at `i * len`) once complete,
    /// `None` while it is in progress.
    pub fn test(&mut self) -> Result<Option<&[u8]>, MpiError> {
        if self.active {
            let mut flag: c_int = 0;
            // SAFETY: `self.request` is the active request MPI_Iallgather returned; `flag` is an
            // int to write to; MPI_STATUS_IGNORE (null) asks for no status.
            let rc = unsafe { ffi::MPI_Test(&mut self.request, &mut flag, std::ptr::null_mut()) };
            if rc != ffi::MPI_SUCCESS as c_int {
                // A failed non-blocking collective is complete: MPI no longer uses the buffers.
                self.active = false;
                return Err(MpiError {
                    call: "MPI_Test",
                    code: rc,
                    text: error_text(rc),
                });
            }
            if flag == 0 {
                return Ok(None);
            }
            self.active = false;
        }
        Ok(Some(&self.recv[..self.received]))
    }

    /// Whether MPI may still use the buffers.
    pub fn is_active(&self) -> bool {
        self.active
    }
}

impl Drop for Iallgather {
    fn drop(&mut self) {
        if self.active && !matches!(self.test(), Ok(Some(_)) | Err(_)) {
            // MPI may still read `send` and write `recv` (a non-blocking collective can be
            // neither cancelled nor freed): leave both to it.
            Box::leak(std::mem::take(&mut self.send));
            Box::leak(std::mem::take(&mut self.recv));
        }
    }
}
