//! Both ends of a connection in one process: a reference [`Transport`] for unit tests.
//!
//! Each direction is a bounded queue of preallocated slots behind a mutex, so it behaves like a
//! ring (same `Full`, ordering and peer-gone rules) without any shared memory or unsafe code.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use urom_wire::MaxMsgSize;

use super::{
    FrameReceiver, FrameRecvError, FrameSendError, FrameSender, HalfControl, PeerGoneError,
    Transport, WaitMode, deadline,
};

struct Queue {
    // INVARIANTS: `tail - head <= lens.len()`; slot `i % capacity` holds `lens[i % capacity]`
    // meaningful bytes for `head <= i < tail`.
    bytes: Box<[u8]>,
    lens: Box<[usize]>,
    head: usize,
    tail: usize,
    writer_gone: Option<PeerGoneError>,
    reader_gone: Option<PeerGoneError>,
}

struct Direction {
    queue: Mutex<Queue>,
    changed: Condvar,
}

impl Direction {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One end of an in-process connection. Create both ends with [`LoopbackConnection::pair`].
pub struct LoopbackConnection {
    tx: LoopbackSender,
    rx: LoopbackReceiver,
}

/// The sending half of a [`LoopbackConnection`].
pub struct LoopbackSender {
    dir: Arc<Direction>,
    max: MaxMsgSize,
    closed: bool,
    /// Frames sent so far.
    sent: u64,
}

/// The receiving half of a [`LoopbackConnection`].
pub struct LoopbackReceiver {
    dir: Arc<Direction>,
    max: MaxMsgSize,
    received: Box<[u8]>,
    closed: bool,
}

impl LoopbackConnection {
    /// Two connected ends, each direction holding `capacity` frames of at most `max` bytes.
    pub fn pair(max: MaxMsgSize, capacity: usize) -> (Self, Self) {
        let capacity = capacity.max(1);
        let dir = || {
            Arc::new(Direction {
                queue: Mutex::new(Queue {
                    bytes: vec![0; capacity * max.get()].into_boxed_slice(),
                    lens: vec![0; capacity].into_boxed_slice(),
                    head: 0,
                    tail: 0,
                    writer_gone: None,
                    reader_gone: None,
                }),
                changed: Condvar::new(),
            })
        };
        let dirs = [dir(), dir()];
        let end = |side: usize| LoopbackConnection {
            tx: LoopbackSender {
                dir: Arc::clone(&dirs[side]),
                max,
                closed: false,
                sent: 0,
            },
            rx: LoopbackReceiver {
                dir: Arc::clone(&dirs[1 - side]),
                max,
                received: vec![0; max.get()].into_boxed_slice(),
                closed: false,
            },
        };
        (end(0), end(1))
    }

    /// Ends this side as if its process had died: the peer sees [`PeerGoneError::Died`].
    pub fn simulate_crash(mut self) {
        self.tx.end(PeerGoneError::Died);
        self.rx.end(PeerGoneError::Died);
    }
}

impl Transport for LoopbackConnection {
    type Sender = LoopbackSender;
    type Receiver = LoopbackReceiver;

    fn split(&mut self) -> (&mut LoopbackSender, &mut LoopbackReceiver) {
        (&mut self.tx, &mut self.rx)
    }

    fn into_split(self) -> (LoopbackSender, LoopbackReceiver) {
        (self.tx, self.rx)
    }

    fn max_msg_size(&self) -> MaxMsgSize {
        self.tx.max
    }

    fn check_peer(&mut self) -> Result<(), PeerGoneError> {
        self.rx.check_peer()
    }
}

/// The controls both halves have: `$mine` is the queue field by which the half says it is
/// gone, `$peers` the one by which the peer's opposite half does.
macro_rules! half_control {
    ($half:ident, $mine:ident, $peers:ident) => {
        impl $half {
            /// Marks this half gone, `how`, and wakes whoever waits on its queue.
            pub(crate) fn end(&mut self, how: PeerGoneError) {
                if !self.closed {
                    self.closed = true;
                    self.dir.lock().$mine = Some(how);
                    self.dir.changed.notify_all();
                }
            }
        }

        impl HalfControl for $half {
            fn check_peer(&self) -> Result<(), PeerGoneError> {
                self.dir.lock().$peers.map_or(Ok(()), Err)
            }

            fn set_wait_mode(&mut self, _mode: WaitMode) {
                // Always sleeps on a condition variable: there is nothing to spin on.
            }

            fn close(&mut self) {
                self.end(PeerGoneError::Closed);
            }
        }

        impl Drop for $half {
            fn drop(&mut self) {
                self.close();
            }
        }
    };
}

half_control!(LoopbackSender, writer_gone, reader_gone);
half_control!(LoopbackReceiver, reader_gone, writer_gone);

impl FrameSender for LoopbackSender {
    fn max_msg_size(&self) -> MaxMsgSize {
        self.max
    }

    fn send(&mut self, frame: &[u8]) -> Result<(), FrameSendError> {
        if self.closed {
            return Err(FrameSendError::Closed);
        }
        let slot_size = self.max.get();
        if frame.len() > slot_size {
            return Err(FrameSendError::TooLarge {
                len: frame.len(),
                max: self.max.as_u32(),
            });
        }
        let mut q = self.dir.lock();
        if let Some(how) = q.reader_gone {
            return Err(FrameSendError::PeerGone(how));
        }
        let capacity = q.lens.len();
        if q.tail - q.head == capacity {
            return Err(FrameSendError::Full);
        }
        let index = q.tail % capacity;
        q.bytes[index * slot_size..][..frame.len()].copy_from_slice(frame);
        q.lens[index] = frame.len();
        q.tail += 1;
        drop(q);
        self.sent += 1;
        self.dir.changed.notify_all();
        Ok(())
    }

    fn next_seq(&self) -> u64 {
        self.sent + 1
    }

    fn wait_send(&mut self, timeout: Duration) -> Result<bool, FrameSendError> {
        if self.closed {
            return Err(FrameSendError::Closed);
        }
        wait_until(&self.dir, timeout, |q| match q.reader_gone {
            Some(how) => Some(Err(FrameSendError::PeerGone(how))),
            None if q.tail - q.head < q.lens.len() => Some(Ok(())),
            None => None,
        })
    }
}

impl FrameReceiver for LoopbackReceiver {
    fn recv(&mut self) -> Result<Option<&[u8]>, FrameRecvError> {
        if self.closed {
            return Err(FrameRecvError::Closed);
        }
        let slot_size = self.max.get();
        let mut q = self.dir.lock();
        if q.head == q.tail {
            return match q.writer_gone {
                Some(how) => Err(FrameRecvError::PeerGone(how)),
                None => Ok(None),
            };
        }
        let index = q.head % q.lens.len();
        let len = q.lens[index];
        self.received[..len].copy_from_slice(&q.bytes[index * slot_size..][..len]);
        q.head += 1;
        drop(q);
        self.dir.changed.notify_all();
        Ok(Some(&self.received[..len]))
    }

    fn wait_recv(&mut self, timeout: Duration) -> Result<bool, FrameRecvError> {
        if self.closed {
            return Err(FrameRecvError::Closed);
        }
        wait_until(&self.dir, timeout, |q| match q.writer_gone {
            _ if q.head != q.tail => Some(Ok(())),
            Some(how) => Some(Err(FrameRecvError::PeerGone(how))),
            None => None,
        })
    }
}

/// Waits on `dir` until `done` says the wait is over (`Ok(true)`, or its error) or `timeout`
/// passes (`Ok(false)`).
fn wait_until<E>(
    dir: &Direction,
    timeout: Duration,
    done: impl Fn(&Queue) -> Option<Result<(), E>>,
) -> Result<bool, E> {
    let end = deadline(Instant::now(), timeout);
    let mut q = dir.lock();
    loop {
        if let Some(result) = done(&q) {
            return result.map(|()| true);
        }
        q = match end {
            None => dir.changed.wait(q).unwrap_or_else(PoisonError::into_inner),
            Some(end) => {
                let left = end.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(false);
                }
                dir.changed
                    .wait_timeout(q, left)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0
            }
        };
    }
}
