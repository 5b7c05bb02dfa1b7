//! Registration of memory by address, for callers that hold raw pointers (the C API, the MPI
//! interposition library): the only place a buffer's memory is not owned by a Rust value.
#![allow(unsafe_code)]

use urom_coll_wire::{BufferKind, CollCommand, Reason};
use urom_host::ProgressEngine;

use crate::{Buffer, CollError, SetupError, Storage, Team, sys};

/// A region of the caller's memory, named by address.
pub(crate) struct RawRegion {
    // INVARIANTS: the caller of `Team::register_raw` keeps `len` bytes at `addr` mapped and
    // writable while the buffer lives and lets no one else use them while a collective
    // over the buffer runs; this crate never dereferences `addr`.
    addr: usize,
}

impl RawRegion {
    /// Its address.
    pub(crate) fn addr(&self) -> *mut u8 {
        self.addr as *mut u8
    }
}

impl Team {
    /// Registers `len` bytes of this process at `addr`, which the worker reaches by
    /// cross-memory attach, as [`Team::register`] does for a `Vec`; the buffer has no byte
    /// view ([`Buffer::bytes`] gives [`CollError::Foreign`]): the caller reads and writes
    /// through its own pointer. Where the kernel or a container forbids cross-memory attach,
    /// [`SetupError::CrossMemory`] says why.
    ///
    /// # Safety
    ///
    /// While the returned buffer (and any collective set up over it) lives, the `len` bytes
    /// at `addr` stay mapped and writable in this process; while a collective using the
    /// buffer runs, nothing in this process reads or writes them (the worker does), as MPI
    /// requires of a buffer handed to a non-blocking collective.
    pub unsafe fn register_raw(
        &self,
        engine: &mut ProgressEngine,
        addr: *mut u8,
        len: usize,
    ) -> Result<Buffer, SetupError> {
        let scope = sys::ptrace_scope();
        if scope == Some(1) && !self.inner.ptracer.get() {
            sys::set_ptracer(self.inner.worker_pid).map_err(|e| {
                SetupError::CrossMemory(format!(
                    "PR_SET_PTRACER for the worker (pid {}) failed: {e}",
                    self.inner.worker_pid
                ))
            })?;
            self.inner.ptracer.set(true);
        }
        let id = self.next_buffer();
        let answer = self.inner.call(
            engine,
            &CollCommand::BufferRegister {
                team: self.inner.key,
                buffer: id,
                kind: BufferKind::CrossMemory,
                addr: addr as u64,
                len: len as u64,
                name: &[],
            },
        );
        match answer {
            Ok(_) => Ok(Buffer::new(
                &self.inner,
                id,
                len,
                Storage::Raw(RawRegion {
                    addr: addr as usize,
                }),
            )),
            Err(e) => {
                self.inner.free_buffers.borrow_mut().push(id);
                Err(match e {
                    SetupError::Coll(CollError::Failed {
                        reason: Reason::CrossMemoryDenied,
                        ..
                    }) => SetupError::CrossMemory(crate::cross_memory_denied(scope)),
                    other => other,
                })
            }
        }
    }
}
