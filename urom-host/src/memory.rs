//! Host memory that a domain's workers reach (feature `ucx`): buffers mapped with UCX, whose
//! packed remote keys go into the domain's `add_buffer`, and the host's memory worker, which
//! the progress engine progresses so that the workers' remote memory access completes.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let mut engine = urom_host::ProgressEngine::new();
//! use urom_host::{Domain, HostMemory};
//!
//! let memory = HostMemory::new(&mut engine)?;
//! let mut buffer = memory.map(4096)?;
//! buffer.write(0, b"bytes the workers may read")?;
//! let domain = Domain::new()
//!     .set_host_memory_address(memory.address())
//!     .set_buffers_count(1).map_err(|(_, e)| e)?
//!     .add_buffer(buffer.va(), buffer.len() as u64, &[], buffer.rkey()).map_err(|(_, e)| e)?;
//! # let _ = domain;
//! # Ok(())
//! # }
//! ```
//!
//! A plugin finds the buffer with the domain's lookups (`seg` and `mkey` of its own member, the
//! host's memory worker by [`urom_plugin::Domain::host_memory_address`]) and copies with UCX
//! RMA. Over TCP, UCX emulates RMA with active messages answered by the host's memory worker,
//! so the host keeps progressing its engine while workers use its memory (as it does while it
//! waits for their notifications). UCX 1.13 cannot export memory handles: buffers are added
//! with an empty one, whose lookup answers `DOCA_ERROR_NOT_SUPPORTED`.

use std::cell::RefCell;
use std::os::fd::BorrowedFd;
use std::rc::Rc;

use super::ProgressEngine;
use super::engine::Poll;
use urom_transport::Armed;
use urom_transport::ucx::{HostMemoryWorker, MappedMemory, UcxError};

/// The host's memory worker, progressed by the engine it was made with. See the module docs.
pub struct HostMemory {
    worker: Rc<RefCell<MemoryPoll>>,
    address: Vec<u8>,
}

impl std::fmt::Debug for HostMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostMemory")
            .field("address_len", &self.address.len())
            .finish()
    }
}

struct MemoryPoll {
    worker: HostMemoryWorker,
}

impl Poll for MemoryPoll {
    fn poll(&mut self) -> usize {
        self.worker.progress() as usize
    }

    fn arm(&mut self, watch: &mut dyn FnMut(BorrowedFd<'_>)) -> Armed {
        if self.worker.arm() {
            watch(self.worker.wake_fd());
            Armed::Armed { fresh: false }
        } else {
            Armed::Ready
        }
    }

    fn disarm(&mut self) {}
}

impl HostMemory {
    /// A memory worker, progressed from now on by `engine`.
    pub fn new(engine: &mut ProgressEngine) -> Result<Self, UcxError> {
        let worker = HostMemoryWorker::new()?;
        let address = worker.address().to_vec();
        let worker = Rc::new(RefCell::new(MemoryPoll { worker }));
        let poll: Rc<RefCell<dyn Poll>> = worker.clone();
        engine.connect(&poll);
        Ok(Self { worker, address })
    }

    /// The memory worker's UCP address, for [`super::Domain::set_host_memory_address`].
    pub fn address(&self) -> &[u8] {
        &self.address
    }

    /// `len` zeroed bytes mapped for the domain's workers to read and write, with the packed
    /// remote key to add them with.
    pub fn map(&self, len: usize) -> Result<MappedMemory, UcxError> {
        MappedMemory::new(len)
    }

    /// Progresses the memory worker once, outside an engine; how many events it handled.
    pub fn progress(&self) -> usize {
        self.worker
            .try_borrow_mut()
            .map_or(0, |mut worker| worker.poll())
    }
}
