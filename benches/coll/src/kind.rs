//! The collectives measured, their buffer sizes, and the data every implementation sends and
//! checks, so that each measures the same collective and each result is verified once.

use std::fmt;

/// A collective the benchmark measures. The message size is, as in the OSU micro-benchmarks, the
/// whole vector for allreduce and broadcast, and what one rank sends to each other rank (or
/// contributes) for alltoall and allgather.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// Sum of `f32` vectors, result on every rank.
    Allreduce,
    /// Every rank sends its own block to every rank (bytes).
    Alltoall,
    /// Every rank's block to every rank (bytes).
    Allgather,
    /// Rank 0's buffer to every rank (bytes).
    Bcast,
}

impl Kind {
    /// Every kind, in the order tables and charts list them.
    pub const ALL: [Kind; 4] = [
        Kind::Allreduce,
        Kind::Alltoall,
        Kind::Allgather,
        Kind::Bcast,
    ];

    /// The name used on the command line and in the results.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Allreduce => "allreduce",
            Kind::Alltoall => "alltoall",
            Kind::Allgather => "allgather",
            Kind::Bcast => "bcast",
        }
    }

    /// The kind of that name.
    pub fn parse(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Number of `f32` elements of an allreduce of `bytes` (at least one).
    pub fn allreduce_count(bytes: usize) -> usize {
        (bytes / 4).max(1)
    }

    /// Lengths in bytes of the send and receive buffers of one rank among `ranks` (broadcast
    /// has one buffer: the receive one, send length 0).
    pub fn buffer_lens(self, bytes: usize, ranks: usize) -> (usize, usize) {
        match self {
            Kind::Allreduce => {
                let len = Kind::allreduce_count(bytes) * 4;
                (len, len)
            }
            Kind::Alltoall => (bytes * ranks, bytes * ranks),
            Kind::Allgather => (bytes, bytes * ranks),
            Kind::Bcast => (0, bytes),
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Byte `j` of the block rank `from` sends to rank `to`.
fn pattern(from: usize, to: usize, j: usize) -> u8 {
    (from.wrapping_mul(31) ^ to.wrapping_mul(7)).wrapping_add(j) as u8
}

/// Element `i` of rank `rank`'s allreduce input: small integers, so that any order of the sum
/// is exact in `f32`.
fn allreduce_input(rank: usize, i: usize) -> f32 {
    (rank + 1 + i % 7) as f32
}

/// Fills rank `rank`'s buffers (of [`Kind::buffer_lens`]) with its input; the receive buffer
/// with a value no correct result leaves (except broadcast's root, whose buffer is its input).
pub fn fill(kind: Kind, rank: usize, ranks: usize, bytes: usize, send: &mut [u8], recv: &mut [u8]) {
    recv.fill(0xee);
    match kind {
        Kind::Allreduce => {
            for (i, chunk) in send.chunks_exact_mut(4).enumerate() {
                chunk.copy_from_slice(&allreduce_input(rank, i).to_ne_bytes());
            }
        }
        Kind::Alltoall => {
            for (to, block) in send.chunks_exact_mut(bytes.max(1)).enumerate().take(ranks) {
                for (j, b) in block.iter_mut().enumerate() {
                    *b = pattern(rank, to, j);
                }
            }
        }
        Kind::Allgather => {
            for (j, b) in send.iter_mut().enumerate() {
                *b = pattern(rank, 0, j);
            }
        }
        Kind::Bcast => {
            if rank == 0 {
                for (j, b) in recv.iter_mut().enumerate() {
                    *b = pattern(0, 0, j);
                }
            }
        }
    }
}

/// Checks rank `rank`'s receive buffer after the collective; the error names the first wrong
/// byte or element.
pub fn check(
    kind: Kind,
    rank: usize,
    ranks: usize,
    bytes: usize,
    recv: &[u8],
) -> Result<(), String> {
    let (_, recv_len) = kind.buffer_lens(bytes, ranks);
    if recv.len() != recv_len {
        return Err(format!(
            "{kind} of {bytes} B: receive buffer of {} bytes, expected {recv_len}",
            recv.len()
        ));
    }
    match kind {
        Kind::Allreduce => {
            for (i, chunk) in recv.chunks_exact(4).enumerate() {
                let got = f32::from_ne_bytes(chunk.try_into().expect("4 bytes"));
                let want: f32 = (0..ranks).map(|r| allreduce_input(r, i)).sum();
                if got != want {
                    return Err(format!(
                        "allreduce of {bytes} B on rank {rank}: element {i} is {got}, expected {want}"
                    ));
                }
            }
        }
        Kind::Alltoall | Kind::Allgather | Kind::Bcast => {
            for (j, &got) in recv.iter().enumerate() {
                let block = bytes.max(1);
                let (from, to, at) = match kind {
                    Kind::Alltoall => (j / block, rank, j % block),
                    Kind::Allgather => (j / block, 0, j % block),
                    _ => (0, 0, j),
                };
                let want = pattern(from, to, at);
                if got != want {
                    return Err(format!(
                        "{kind} of {bytes} B on rank {rank}: byte {j} is {got:#x}, expected {want:#x}"
                    ));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The collectives done by hand on three ranks' buffers pass the check, and a wrong byte
    /// fails it.
    #[test]
    fn reference_results_pass_and_a_wrong_byte_fails() {
        let ranks = 3;
        let bytes = 24;
        for kind in Kind::ALL {
            let (send_len, recv_len) = kind.buffer_lens(bytes, ranks);
            let mut sends = vec![vec![0u8; send_len]; ranks];
            let mut recvs = vec![vec![0u8; recv_len]; ranks];
            for r in 0..ranks {
                fill(kind, r, ranks, bytes, &mut sends[r], &mut recvs[r]);
            }
            let root = recvs[0].clone();
            for r in 0..ranks {
                let out = &mut recvs[r];
                match kind {
                    Kind::Allreduce => {
                        for i in 0..send_len / 4 {
                            let sum: f32 = sends
                                .iter()
                                .map(|s| {
                                    f32::from_ne_bytes(s[i * 4..i * 4 + 4].try_into().unwrap())
                                })
                                .sum();
                            out[i * 4..i * 4 + 4].copy_from_slice(&sum.to_ne_bytes());
                        }
                    }
                    Kind::Alltoall => {
                        for (from, s) in sends.iter().enumerate() {
                            out[from * bytes..(from + 1) * bytes]
                                .copy_from_slice(&s[r * bytes..(r + 1) * bytes]);
                        }
                    }
                    Kind::Allgather => {
                        for (from, s) in sends.iter().enumerate() {
                            out[from * bytes..(from + 1) * bytes].copy_from_slice(s);
                        }
                    }
                    Kind::Bcast => out.copy_from_slice(&root),
                }
                check(kind, r, ranks, bytes, out).unwrap();
                out[5] ^= 1;
                assert!(check(kind, r, ranks, bytes, out).is_err(), "{kind}");
            }
        }
    }

    #[test]
    fn names_round_trip() {
        for kind in Kind::ALL {
            assert_eq!(Kind::parse(kind.name()), Some(kind));
        }
        assert_eq!(Kind::parse("reduce"), None);
        assert_eq!(Kind::Allreduce.buffer_lens(8, 2), (8, 8));
        assert_eq!(Kind::Allreduce.buffer_lens(2, 2), (4, 4));
        assert_eq!(Kind::Alltoall.buffer_lens(8, 4), (32, 32));
    }
}
