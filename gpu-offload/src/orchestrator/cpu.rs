//! The CPU processor: one thread per data connection that reverses each request's payload and
//! sends the responses back, one frame of responses per frame of requests, in the order the
//! requests came.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing::{error, info, warn};
use urom_transport::{FrameRecvError, FrameSender, Transport};
use urom_wire::gpu::{CLIENT_HEADER_LEN, MsgId, fast_client_message, put_response_headers};

/// How long a processor thread waits for a request before looking at its stop flag.
const WAIT: Duration = Duration::from_millis(50);

/// Writes the response to the `client_request` at the start of `requests` into `out`: the
/// payload's bytes in reverse order. Returns the request's length, which is the response's, or
/// `None` when no well-formed `client_request` starts `requests` or `out` is too small.
#[inline]
pub fn reverse_into(requests: &[u8], out: &mut [u8], max_len: usize) -> Option<usize> {
    let n = fast_client_message(requests, MsgId::ClientRequest, max_len)?;
    let (headers, body) = out.get_mut(..n)?.split_first_chunk_mut()?;
    put_response_headers(headers, (n - CLIENT_HEADER_LEN) as u32);
    copy_reversed(&requests[CLIENT_HEADER_LEN..n], body);
    Some(n)
}

/// Writes `from`'s bytes into `to` (of the same length) in reverse order, in one pass: sixteen
/// bytes at a time, each block taken from the other end with its bytes swapped (two `bswap`s on
/// x86-64, a third faster than eight-byte words).
#[inline]
fn copy_reversed(from: &[u8], to: &mut [u8]) {
    debug_assert_eq!(from.len(), to.len());
    let mut blocks = to.chunks_exact_mut(16);
    for (block, source) in (&mut blocks).zip(from.rchunks_exact(16)) {
        let source: [u8; 16] = source.try_into().unwrap_or_default();
        block.copy_from_slice(&u128::from_le_bytes(source).swap_bytes().to_le_bytes());
    }
    // The last bytes of `to` are the first bytes of `from`, those its blocks did not cover.
    let tail = blocks.into_remainder();
    let head = &from[..tail.len()];
    for (byte, source) in tail.iter_mut().zip(head.iter().rev()) {
        *byte = *source;
    }
}

/// Writes the responses to the requests of `frame` (one or more whole `client_request`
/// messages) into `out`, in order; returns their length, or `None` when `frame` is not such a
/// sequence or `out` is too small.
#[inline]
pub fn reverse_frame(frame: &[u8], out: &mut [u8], max_len: usize) -> Option<usize> {
    let mut len = 0;
    while len < frame.len() {
        len += reverse_into(&frame[len..], out.get_mut(len..)?, max_len)?;
    }
    (len > 0).then_some(len)
}

/// Why a processor thread ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessorEnd {
    /// Its stop flag was set.
    Stopped,
    /// The server's side of its data connection went away.
    ServerGone,
}

/// Serves one data connection until `stop` is set or the server goes away. Allocates nothing
/// per message: responses are built in one buffer made before the loop.
///
/// The thread answers every frame there is, then wakes the server once for the lot (a system
/// call only if the server sleeps). With nothing left it keeps polling for `poll`, yielding
/// its CPU between polls, then sleeps until the server's next frames wake it: a CPU this
/// thread shares with others is theirs while it waits. The loop is compiled for the
/// connection's transport `T`.
pub fn serve<T: Transport>(
    mut conn: T,
    index: usize,
    max_len: usize,
    poll: Duration,
    stop: &AtomicBool,
) -> ProcessorEnd {
    let mut out = vec![0u8; conn.max_msg_size().as_u32() as usize].into_boxed_slice();
    conn.split().0.defer_wakes(true);
    let sleeper = match super::Sleeper::new(&mut conn) {
        Ok(sleeper) => sleeper,
        Err(e) => {
            error!(thread = index, "cannot wait on the data connection: {e}");
            return ProcessorEnd::ServerGone;
        }
    };
    let mut served = 0u64;
    let mut last_work = Instant::now();
    let end = 'serve: loop {
        if stop.load(Ordering::Relaxed) {
            break ProcessorEnd::Stopped;
        }
        let mut worked = false;
        loop {
            let len = match conn.recv() {
                Ok(Some(requests)) => reverse_frame(requests, &mut out, max_len).unwrap_or_else(|| {
                    // The server checks every request, so this does not happen; an empty
                    // answer keeps the frames in step and makes the server drop the client.
                    warn!(thread = index, "the server sent something other than well-formed client_requests; answered empty");
                    0
                }),
                Ok(None) => break,
                Err(FrameRecvError::PeerGone(how)) => {
                    info!(thread = index, "data connection closed: {how}");
                    break 'serve ProcessorEnd::ServerGone;
                }
                Err(e) => {
                    error!(thread = index, "data connection broken: {e}");
                    break 'serve ProcessorEnd::ServerGone;
                }
            };
            if stop.load(Ordering::Relaxed) || !super::send_waiting(&mut conn, &out[..len], index) {
                break 'serve ProcessorEnd::ServerGone;
            }
            served += 1;
            worked = true;
        }
        if worked {
            conn.split().0.flush_wakes();
            last_work = Instant::now();
        } else if last_work.elapsed() < poll {
            std::thread::yield_now();
        } else {
            let slept = match &sleeper {
                Some(sleeper) => sleeper.sleep(&mut conn, WAIT),
                None => conn.wait_recv(WAIT).map(drop),
            };
            if let Err(e) = slept {
                info!(thread = index, "data connection closed: {e}");
                break ProcessorEnd::ServerGone;
            }
        }
    };
    info!(thread = index, frames = served, "processor thread stopped");
    end
}

/// The CPU processor's threads.
pub struct CpuProcessor {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<Option<ProcessorEnd>>>,
}

impl CpuProcessor {
    /// Starts one thread per data connection; thread `i` is pinned to `cpus[i]` when the list
    /// has that many entries.
    pub fn start<T: Transport + Send + 'static>(
        conns: Vec<T>,
        max_len: usize,
        cpus: &[usize],
        poll: Duration,
    ) -> Result<Self, super::StartError> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::with_capacity(conns.len());
        for (index, conn) in conns.into_iter().enumerate() {
            let thread_stop = Arc::clone(&stop);
            let spawned = super::spawn_pinned(
                format!("processor-{index}"),
                cpus.get(index).copied(),
                move || serve(conn, index, max_len, poll, &thread_stop),
            );
            match spawned {
                Ok(thread) => threads.push(thread),
                Err(e) => {
                    Self { stop, threads }.stop();
                    return Err(e);
                }
            }
        }
        Ok(Self { stop, threads })
    }

    /// Stops every thread and waits for them.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use urom_wire::gpu::GpuMessage;

    #[test]
    fn payloads_of_every_length_are_reversed() {
        let from: Vec<u8> = (0..=255u8).collect();
        for len in 0..from.len() {
            let mut to = vec![0xa5u8; len];
            copy_reversed(&from[..len], &mut to);
            let expected: Vec<u8> = from[..len].iter().rev().copied().collect();
            assert_eq!(to, expected, "length {len}");
        }
    }

    #[test]
    fn responses_carry_the_payload_reversed() {
        let mut request = [0u8; 32];
        let len = GpuMessage::ClientRequest(b"ABCD")
            .emit(&mut request, 256)
            .unwrap();
        let mut out = [0xa5u8; 32];
        let n = reverse_into(&request[..len], &mut out, 256).unwrap();
        assert_eq!(
            &out[..n],
            &[0, 0, 0, 16, 0, 0, 0, 5, 0, 0, 0, 4, b'D', b'C', b'B', b'A']
        );
        let empty = GpuMessage::ClientRequest(b"")
            .emit(&mut request, 256)
            .unwrap();
        assert_eq!(
            reverse_into(&request[..empty], &mut out, 256),
            Some(CLIENT_HEADER_LEN)
        );
        let other = GpuMessage::ClientResponse(b"AB")
            .emit(&mut request, 256)
            .unwrap();
        assert_eq!(reverse_into(&request[..other], &mut out, 256), None);
    }
}
