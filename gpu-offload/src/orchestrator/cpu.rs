//! The CPU processor: one thread per data connection that reverses each request's payload and
//! sends the response back, in the order the requests came.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use tracing::{error, info, warn};
use urom_core::shm::ShmConnection;
use urom_core::transport::{FrameRecvError, FrameSendError, Transport};
use urom_wire::gpu::{CLIENT_HEADER_LEN, GpuMessage, write_client_headers};

/// How long a processor thread waits for a request before looking at its stop flag.
const WAIT: Duration = Duration::from_millis(50);

/// Writes the response to `request` into `out`: the payload's bytes in reverse order. Returns
/// the response's length, or `None` when `request` is not a well-formed `client_request`.
#[inline]
pub fn reverse_into(request: &[u8], out: &mut [u8], max_len: usize) -> Option<usize> {
    let Ok(GpuMessage::ClientRequest(payload)) = GpuMessage::parse(request, max_len) else {
        return None;
    };
    let len = write_client_headers(out, true, payload.len(), max_len).ok()?;
    for (dst, src) in out[CLIENT_HEADER_LEN..len]
        .iter_mut()
        .zip(payload.iter().rev())
    {
        *dst = *src;
    }
    Some(len)
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
/// per message: the response is built in one buffer made before the loop.
pub fn serve(
    mut conn: ShmConnection,
    index: usize,
    max_len: usize,
    stop: &AtomicBool,
) -> ProcessorEnd {
    let mut out = vec![0u8; CLIENT_HEADER_LEN + max_len].into_boxed_slice();
    let mut served = 0u64;
    let end = 'serve: loop {
        if stop.load(Ordering::Relaxed) {
            break ProcessorEnd::Stopped;
        }
        match conn.wait_recv(WAIT) {
            Ok(_) => {}
            Err(e) => {
                info!(thread = index, "data connection closed: {e}");
                break ProcessorEnd::ServerGone;
            }
        }
        loop {
            let len = match conn.recv() {
                Ok(Some(request)) => match reverse_into(request, &mut out, max_len) {
                    Some(len) => len,
                    None => {
                        warn!(
                            thread = index,
                            "the server sent something other than a well-formed client_request; ignored"
                        );
                        continue;
                    }
                },
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
            loop {
                match conn.send(&out[..len]) {
                    Ok(()) => break,
                    Err(FrameSendError::Full) => {
                        if conn.wait_send(WAIT).is_err() || stop.load(Ordering::Relaxed) {
                            break 'serve ProcessorEnd::ServerGone;
                        }
                    }
                    Err(e) => {
                        info!(thread = index, "cannot answer: {e}");
                        break 'serve ProcessorEnd::ServerGone;
                    }
                }
            }
            served += 1;
        }
    };
    info!(
        thread = index,
        requests = served,
        "processor thread stopped"
    );
    end
}

/// The CPU processor's threads.
pub struct CpuProcessor {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<ProcessorEnd>>,
}

impl CpuProcessor {
    /// Starts one thread per data connection.
    pub fn start(conns: Vec<ShmConnection>, max_len: usize) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::with_capacity(conns.len());
        for (index, conn) in conns.into_iter().enumerate() {
            let stop = Arc::clone(&stop);
            threads.push(
                std::thread::Builder::new()
                    .name(format!("processor-{index}"))
                    .spawn(move || serve(conn, index, max_len, &stop))?,
            );
        }
        Ok(Self { stop, threads })
    }

    /// Whether a thread ended on its own (its data connection broke).
    pub fn lost_a_thread(&self) -> bool {
        self.threads.iter().any(JoinHandle::is_finished)
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
        assert_eq!(reverse_into(&request[..empty], &mut out, 256), Some(12));
        let other = GpuMessage::ClientResponse(b"AB")
            .emit(&mut request, 256)
            .unwrap();
        assert_eq!(reverse_into(&request[..other], &mut out, 256), None);
    }
}
