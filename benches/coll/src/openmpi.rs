//! Open MPI's collectives: `MPI_Allreduce` / `MPI_Alltoall` / `MPI_Allgather` / `MPI_Bcast`
//! blocking, and their `MPI_I*` forms with `MPI_Wait`, on `MPI_COMM_WORLD`.

use std::ffi::c_int;

use mpi::collective::SystemOperation;
use mpi::datatype::Equivalence;
use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use crate::harness::{Backend, Collective};
use crate::kind::{self, Kind};

/// Open MPI over the world communicator.
pub struct OpenMpi {
    comm: ffi::MPI_Comm,
    rank: usize,
    ranks: usize,
}

impl OpenMpi {
    /// Open MPI's collectives over `world`.
    pub fn new(world: &SimpleCommunicator) -> OpenMpi {
        OpenMpi {
            comm: world.as_raw(),
            rank: world.rank() as usize,
            ranks: world.size() as usize,
        }
    }
}

impl Backend for OpenMpi {
    fn name(&self) -> &'static str {
        "openmpi"
    }

    fn describe(&self) -> String {
        let version = mpi::environment::library_version().unwrap_or_else(|_| "unknown".into());
        // The version string may end in NULs; the first line names the library and version.
        let version = version.trim_end_matches('\0');
        let first = version.lines().next().unwrap_or("").trim_end_matches(',');
        format!("library: {first}; no worker (progress only inside MPI calls)")
    }

    fn collective<'a>(
        &'a mut self,
        kind: Kind,
        bytes: usize,
    ) -> anyhow::Result<Box<dyn Collective + 'a>> {
        let (send_len, recv_len) = kind.buffer_lens(bytes, self.ranks);
        let count = match kind {
            Kind::Allreduce => Kind::allreduce_count(bytes),
            _ => bytes,
        };
        let count = c_int::try_from(count)
            .map_err(|_| anyhow::anyhow!("{bytes} bytes: more than MPI counts"))?;
        // At least one byte each, so that the two buffers are distinct allocations.
        let mut send = vec![0u8; send_len.max(1)];
        let mut recv = vec![0u8; recv_len.max(1)];
        kind::fill(
            kind,
            self.rank,
            self.ranks,
            bytes,
            &mut send[..send_len],
            &mut recv[..recv_len],
        );
        // SAFETY: reads an immutable handle constant the MPI library defines.
        let request = unsafe { ffi::RSMPI_REQUEST_NULL };
        Ok(Box::new(OmpiCollective {
            comm: self.comm,
            kind,
            bytes,
            rank: self.rank,
            ranks: self.ranks,
            count,
            datatype: match kind {
                Kind::Allreduce => f32::equivalent_datatype().as_raw(),
                _ => u8::equivalent_datatype().as_raw(),
            },
            op: SystemOperation::sum().as_raw(),
            send,
            recv,
            recv_len,
            request,
        }))
    }
}

/// One collective's buffers and its request. The buffers are never touched while a request is
/// active (between `start` and `wait`), and never reallocated.
struct OmpiCollective {
    comm: ffi::MPI_Comm,
    kind: Kind,
    bytes: usize,
    rank: usize,
    ranks: usize,
    count: c_int,
    datatype: ffi::MPI_Datatype,
    op: ffi::MPI_Op,
    send: Vec<u8>,
    recv: Vec<u8>,
    recv_len: usize,
    request: ffi::MPI_Request,
}

fn ok(call: &str, rc: c_int) {
    assert_eq!(rc, ffi::MPI_SUCCESS as c_int, "{call} failed: {rc}");
}

impl Collective for OmpiCollective {
    fn start(&mut self) {
        let (s, r) = (self.send.as_ptr().cast(), self.recv.as_mut_ptr().cast());
        let (n, t, comm, req) = (self.count, self.datatype, self.comm, &mut self.request);
        let rc = match self.kind {
            // SAFETY: `s` holds the send length and `r` the receive length of
            // `Kind::buffer_lens` for `n` elements of `t` per rank, both heap buffers owned by
            // `self` that stay untouched until `wait` completes the request written to `req`;
            // `comm` is the live world communicator, `t` and `self.op` predefined handles.
            Kind::Allreduce => unsafe { ffi::MPI_Iallreduce(s, r, n, t, self.op, comm, req) },
            // SAFETY: as above.
            Kind::Alltoall => unsafe { ffi::MPI_Ialltoall(s, n, t, r, n, t, comm, req) },
            // SAFETY: as above.
            Kind::Allgather => unsafe { ffi::MPI_Iallgather(s, n, t, r, n, t, comm, req) },
            // SAFETY: as above; broadcast uses the receive buffer only, rank 0's as the source.
            Kind::Bcast => unsafe { ffi::MPI_Ibcast(r, n, t, 0, comm, req) },
        };
        ok("MPI_I*", rc);
    }

    fn wait(&mut self) {
        // SAFETY: reads an immutable constant the MPI library defines.
        let ignore = unsafe { ffi::RSMPI_STATUS_IGNORE };
        // SAFETY: `self.request` is the request `start` wrote (or the null request, which
        // MPI_Wait returns at once for); `ignore` asks for no status.
        let rc = unsafe { ffi::MPI_Wait(&mut self.request, ignore) };
        ok("MPI_Wait", rc);
    }

    fn blocking(&mut self) {
        let (s, r) = (self.send.as_ptr().cast(), self.recv.as_mut_ptr().cast());
        let (n, t, comm) = (self.count, self.datatype, self.comm);
        let rc = match self.kind {
            // SAFETY: the buffers, counts and handles as in `start`, the buffers used only for
            // the call's duration.
            Kind::Allreduce => unsafe { ffi::MPI_Allreduce(s, r, n, t, self.op, comm) },
            // SAFETY: as above.
            Kind::Alltoall => unsafe { ffi::MPI_Alltoall(s, n, t, r, n, t, comm) },
            // SAFETY: as above.
            Kind::Allgather => unsafe { ffi::MPI_Allgather(s, n, t, r, n, t, comm) },
            // SAFETY: as above.
            Kind::Bcast => unsafe { ffi::MPI_Bcast(r, n, t, 0, comm) },
        };
        ok("MPI blocking collective", rc);
    }

    fn check(&self) -> Result<(), String> {
        kind::check(
            self.kind,
            self.rank,
            self.ranks,
            self.bytes,
            &self.recv[..self.recv_len],
        )
    }
}
