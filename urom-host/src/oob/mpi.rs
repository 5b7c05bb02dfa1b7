//! The MPI collective: `MPI_Iallgather` of bytes on a communicator, polled with `MPI_Test`.
//!
//! [`MpiOob`] works on its own duplicate of the communicator it is given (the world by
//! default), so its allgathers never match a collective the program runs itself, and with
//! `MPI_ERRORS_RETURN` on that duplicate, so an MPI error fails the allgather instead of
//! aborting the job. The ranks and the size are the communicator's.
//!
//! Each allgather owns its buffers until MPI completes it; a request freed while in flight is
//! kept, and tested again at each later call, until MPI is done with its buffers. A rank that
//! dies is not named: MPI (Open MPI's `mpirun` in particular) ends the whole job instead.

use std::collections::HashMap;
use std::fmt;

use mpi::environment::Universe;
use mpi::topology::{Communicator, SimpleCommunicator};

use super::{OobCollective, OobError, OobRequest};
use urom_transport::mpi::{Iallgather, MpiError, errors_return};

impl From<MpiError> for OobError {
    fn from(error: MpiError) -> Self {
        OobError::new(error.to_string())
    }
}

/// An out-of-band collective over MPI (feature `mpi`).
///
/// ```no_run
/// use urom_host::Domain;
/// use urom_host::oob::{MpiOob, OobCollective};
///
/// let oob = MpiOob::world()?; // initializes MPI unless the program did
/// let rank = u64::from(oob.rank()); // a natural domain id for this rank's worker
/// let domain = Domain::new().set_oob(oob);
/// # let _ = (rank, domain);
/// # Ok::<(), urom_host::oob::OobError>(())
/// ```
pub struct MpiOob {
    // Fields drop in this order: requests first, then the communicator (freed while MPI
    // runs), then MPI itself when this collective initialized it.
    /// Allgathers the caller holds a request for, by request id.
    in_flight: HashMap<u64, Iallgather>,
    /// Allgathers whose request was freed before MPI completed them.
    abandoned: Vec<Iallgather>,
    comm: SimpleCommunicator,
    rank: u32,
    size: u32,
    next_id: u64,
    /// MPI's environment when this collective initialized MPI: finalized on drop.
    universe: Option<Universe>,
}

impl fmt::Debug for MpiOob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MpiOob")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("in_flight", &self.in_flight.len())
            .field("abandoned", &self.abandoned.len())
            .field("owns_mpi", &self.universe.is_some())
            .finish()
    }
}

impl MpiOob {
    /// A collective among every process of the job (`MPI_COMM_WORLD`).
    ///
    /// Initializes MPI when the program has not: MPI is then finalized when this collective is
    /// dropped (MPI cannot be initialized twice in a process, so such a program makes one).
    /// A program that uses MPI itself initializes it first; it then finalizes it too.
    pub fn world() -> Result<Self, OobError> {
        if mpi::environment::is_finalized() {
            return Err(OobError::new(
                "MPI was finalized already; a process can initialize it only once",
            ));
        }
        let universe = mpi::initialize();
        let world = SimpleCommunicator::world();
        let mut oob = Self::new(&world)?;
        oob.universe = universe;
        Ok(oob)
    }

    /// A collective among the processes of `comm`, which the program made (MPI is
    /// initialized, and stays so while the collective lives).
    pub fn new(comm: &impl Communicator) -> Result<Self, OobError> {
        let comm = comm.duplicate();
        errors_return(&comm)?;
        let (rank, size) = (comm.rank(), comm.size());
        let (Ok(rank), Ok(size)) = (u32::try_from(rank), u32::try_from(size)) else {
            return Err(OobError::new(format!(
                "the communicator gives rank {rank} of {size}"
            )));
        };
        Ok(Self {
            in_flight: HashMap::new(),
            abandoned: Vec::new(),
            comm,
            rank,
            size,
            next_id: 0,
            universe: None,
        })
    }

    /// Releases the abandoned allgathers that MPI has completed.
    fn reap(&mut self) {
        self.abandoned.retain_mut(|gather| {
            // An error completes the request as well; nobody waits for it any more.
            matches!(gather.test(), Ok(None))
        });
    }
}

impl OobCollective for MpiOob {
    fn size(&self) -> u32 {
        self.size
    }

    fn rank(&self) -> u32 {
        self.rank
    }

    fn allgather(&mut self, send: &[u8]) -> Result<OobRequest, OobError> {
        self.reap();
        let gather = Iallgather::start(&self.comm, send)?;
        let id = self.next_id;
        self.next_id += 1;
        self.in_flight.insert(id, gather);
        Ok(OobRequest::new(id, send.len(), self.size))
    }

    fn test(&mut self, request: &mut OobRequest) -> Result<bool, OobError> {
        let Some(gather) = self.in_flight.get_mut(&request.id()) else {
            return Err(OobError::new(format!(
                "request {} is not an allgather of this collective in flight",
                request.id()
            )));
        };
        match gather.test()? {
            None => Ok(false),
            Some(blocks) => {
                request.fill(blocks)?;
                Ok(true)
            }
        }
    }

    fn free(&mut self, request: OobRequest) {
        if let Some(gather) = self.in_flight.remove(&request.id())
            && gather.is_active()
        {
            self.abandoned.push(gather);
        }
        self.reap();
    }
}

impl Drop for MpiOob {
    fn drop(&mut self) {
        self.reap();
        let pending = self
            .in_flight
            .values_mut()
            .any(|gather| gather.is_active() && matches!(gather.test(), Ok(None)))
            || !self.abandoned.is_empty();
        if pending && let Some(universe) = self.universe.take() {
            // Finalizing MPI with a collective in flight is erroneous (it may never return):
            // leave MPI initialized, as a process that exits without finalizing does.
            std::mem::forget(universe);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // MPI initializes once per process: this is the one test of this crate that does.
    #[test]
    fn a_world_of_one_gathers_its_own_blocks_and_releases_freed_requests() {
        let mut oob = MpiOob::world().expect("MPI initializes as a singleton");
        assert_eq!((oob.rank(), oob.size()), (0, 1));

        let mut request = oob.allgather(b"block of rank 0").unwrap();
        while !oob.test(&mut request).unwrap() {}
        assert_eq!(request.block(0), b"block of rank 0");
        assert_eq!(request.received(), b"block of rank 0");
        oob.free(request);

        // A request freed before it was tested is released once MPI completes it.
        let request = oob.allgather(&[7; 64]).unwrap();
        let id = request.id();
        oob.free(request);
        assert!(oob.in_flight.is_empty());
        let mut next = oob.allgather(&[]).unwrap();
        assert_ne!(next.id(), id);
        while !oob.test(&mut next).unwrap() {}
        assert!(next.received().is_empty());
        oob.free(next);
        assert!(oob.abandoned.is_empty(), "{oob:?}");

        // MPI's errors name the call and say what MPI says.
        let error = MpiError::check("MPI_Test", ::mpi::ffi::MPI_ERR_COUNT as i32).unwrap_err();
        assert!(
            error.to_string().starts_with("MPI_Test failed: "),
            "{error}"
        );
        assert!(
            error
                .to_string()
                .ends_with(&format!("(MPI error {})", error.code)),
            "{error}"
        );
        assert_ne!(error.text, format!("unknown MPI error {}", error.code));
        assert!(MpiError::check("MPI_Test", ::mpi::ffi::MPI_SUCCESS as i32).is_ok());

        // A request of another collective is refused by name.
        let mut foreign = OobRequest::new(99, 4, 1);
        let error = oob.test(&mut foreign).unwrap_err();
        assert_eq!(
            error.to_string(),
            "request 99 is not an allgather of this collective in flight"
        );
        drop(oob);
        assert!(mpi::environment::is_finalized());
        assert_eq!(
            MpiOob::world().unwrap_err().to_string(),
            "MPI was finalized already; a process can initialize it only once"
        );
    }
}
