//! Out-of-band collectives: how the hosts of a domain exchange what each of them knows before
//! their workers can talk to each other.
//!
//! [`OobCollective`] has the shape of DOCA's `struct doca_urom_domain_oob_coll`: the group's
//! size and this host's rank, a non-blocking allgather that returns a request, a test of the
//! request and its release. Every rank passes the same length to an allgather; rank `i`'s
//! bytes land at `i * len` in the request's receive buffer.
//!
//! Implementations:
//!
//! * [`SocketOob`]: a rendezvous over a Unix or TCP socket, needing nothing but an address all
//!   ranks know (rank 0 listens there). Works in any build.
//! * `MpiOob` (feature `mpi`): `MPI_Iallgather` of bytes on a communicator (the world by
//!   default: `MpiOob::world()`), polled with `MPI_Test`; rank and size are the
//!   communicator's.
//!
//! Any other runtime (a collectives library's own out-of-band exchange, a job launcher's
//! key-value store) can implement the trait itself.

#[cfg(feature = "mpi")]
mod mpi;
mod socket;

use std::fmt;

#[cfg(feature = "mpi")]
pub use self::mpi::MpiOob;
pub use socket::{RendezvousAddr, SocketOob};

/// Why an out-of-band operation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OobError {
    /// The rank that failed or left, when known.
    pub rank: Option<u32>,
    /// What happened.
    pub reason: String,
}

impl OobError {
    /// A failure of rank `rank`.
    pub fn of_rank(rank: u32, reason: impl Into<String>) -> Self {
        Self {
            rank: Some(rank),
            reason: reason.into(),
        }
    }

    /// A failure not tied to one rank.
    pub fn new(reason: impl Into<String>) -> Self {
        Self {
            rank: None,
            reason: reason.into(),
        }
    }
}

impl fmt::Display for OobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.rank {
            Some(rank) => write!(f, "rank {rank}: {}", self.reason),
            None => f.write_str(&self.reason),
        }
    }
}

impl std::error::Error for OobError {}

/// An allgather in flight: an id of the implementation's choosing and the receive buffer,
/// `size * len` bytes, which the implementation fills.
#[derive(Debug)]
pub struct OobRequest {
    id: u64,
    len: usize,
    recv: Vec<u8>,
}

impl OobRequest {
    /// A request `id` for blocks of `len` bytes from `size` ranks; its receive buffer starts
    /// zeroed.
    pub fn new(id: u64, len: usize, size: u32) -> Self {
        Self {
            id,
            len,
            recv: vec![0; len.saturating_mul(size as usize)],
        }
    }

    /// The implementation's id for it.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The length of each rank's block.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the blocks are empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The receive buffer, for the implementation to fill: rank `i`'s block at `i * len`.
    pub fn recv_mut(&mut self) -> &mut [u8] {
        &mut self.recv
    }

    /// Fills the receive buffer with every rank's block, `blocks` as an allgather gathered them
    /// (rank 0 first); an error names both lengths when they differ.
    pub fn fill(&mut self, blocks: &[u8]) -> Result<(), OobError> {
        if self.recv.len() != blocks.len() {
            return Err(OobError::new(format!(
                "request {} takes {} bytes, the allgather gathered {}",
                self.id,
                self.recv.len(),
                blocks.len()
            )));
        }
        self.recv.copy_from_slice(blocks);
        Ok(())
    }

    /// Every rank's block, rank 0 first; meaningful once the test said complete.
    pub fn received(&self) -> &[u8] {
        &self.recv
    }

    /// Rank `rank`'s block.
    pub fn block(&self, rank: u32) -> &[u8] {
        let start = (rank as usize).saturating_mul(self.len);
        self.recv
            .get(start..start.saturating_add(self.len))
            .unwrap_or_default()
    }
}

/// A non-blocking allgather among the hosts of a domain (DOCA's `doca_urom_domain_oob_coll`).
pub trait OobCollective {
    /// How many ranks the group has (DOCA's `n_oob_indexes`).
    fn size(&self) -> u32;

    /// This host's rank, `0..size` (DOCA's `oob_index`).
    fn rank(&self) -> u32;

    /// Starts gathering `send` from every rank (DOCA's `allgather`); every rank passes the
    /// same length. Returns at once.
    fn allgather(&mut self, send: &[u8]) -> Result<OobRequest, OobError>;

    /// Advances `request` (DOCA's `req_test`): `Ok(true)` once every rank's block is in its
    /// receive buffer, `Ok(false)` while it is in progress.
    fn test(&mut self, request: &mut OobRequest) -> Result<bool, OobError>;

    /// Releases a request, complete or not (DOCA's `req_free`).
    fn free(&mut self, request: OobRequest);
}

#[cfg(test)]
mod tests {
    use super::OobRequest;

    #[test]
    fn fill_takes_every_rank_block_of_the_request_length() {
        let mut request = OobRequest::new(7, 2, 3);
        request
            .fill(&[1, 2, 3, 4, 5, 6])
            .expect("six bytes for three blocks of two");
        assert_eq!(request.received(), &[1, 2, 3, 4, 5, 6]);
        assert_eq!(request.block(1), &[3, 4]);

        let error = request.fill(&[1, 2, 3]).expect_err("three bytes for six");
        assert_eq!(
            error.to_string(),
            "request 7 takes 6 bytes, the allgather gathered 3"
        );
        assert_eq!(
            request.received(),
            &[1, 2, 3, 4, 5, 6],
            "a refused fill changes nothing"
        );
    }
}
