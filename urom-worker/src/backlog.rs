//! Notifications a host's ring had no room for, kept in order until it has.

use urom_transport::{FrameSendError, FrameSender};

/// Bytes of notifications one host may leave undrained before its channel is failed.
pub(crate) const BACKLOG_LIMIT: usize = 64 << 20;

/// Frames waiting for room in one host's ring, oldest first: `u32` length and bytes, one after
/// the other in a buffer that grows only while the host lags and keeps its memory once drained,
/// so a host that lags again costs no allocation.
pub(crate) struct Backlog {
    bytes: Vec<u8>,
    /// Where the oldest frame starts.
    read: usize,
    limit: usize,
}

/// Holding one more frame would exceed the backlog's limit.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct BacklogFull;

const LEN: usize = size_of::<u32>();

impl Backlog {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            bytes: Vec::new(),
            read: 0,
            limit,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.read == self.bytes.len()
    }

    /// Bytes held, framing included.
    pub(crate) fn held(&self) -> usize {
        self.bytes.len() - self.read
    }

    /// Keeps `frame` after those already held.
    pub(crate) fn push(&mut self, frame: &[u8]) -> Result<(), BacklogFull> {
        if self.held() + LEN + frame.len() > self.limit {
            return Err(BacklogFull);
        }
        let len = u32::try_from(frame.len()).map_err(|_| BacklogFull)?;
        self.bytes.extend_from_slice(&len.to_le_bytes());
        self.bytes.extend_from_slice(frame);
        Ok(())
    }

    /// Sends the held frames on `tx`, oldest first, until its ring is full; an error other than
    /// a full ring is the channel's end.
    pub(crate) fn flush(&mut self, tx: &mut impl FrameSender) -> Result<(), FrameSendError> {
        while let Some(frame) = self.front() {
            match tx.send(frame) {
                Ok(()) => self.read += LEN + frame.len(),
                Err(FrameSendError::Full) => break,
                Err(e) => return Err(e),
            }
        }
        if self.is_empty() {
            self.bytes.clear();
            self.read = 0;
        }
        Ok(())
    }

    fn front(&self) -> Option<&[u8]> {
        let rest = &self.bytes[self.read..];
        let (len, rest) = rest.split_first_chunk::<LEN>()?;
        rest.get(..u32::from_le_bytes(*len) as usize)
    }
}

#[cfg(test)]
mod tests {
    use urom_transport::Transport;
    use urom_transport::loopback::LoopbackConnection;
    use urom_wire::MaxMsgSize;

    use super::*;

    #[test]
    fn held_frames_go_out_in_order_as_room_appears() {
        let (mut worker, mut host) = LoopbackConnection::pair(MaxMsgSize::DEFAULT, 2);
        let mut backlog = Backlog::new(1024);
        for frame in [&b"one"[..], b"two", b"three"] {
            backlog.push(frame).unwrap();
        }
        backlog.flush(worker.split().0).unwrap();
        assert!(!backlog.is_empty(), "only two fit");
        assert_eq!(host.recv().unwrap(), Some(&b"one"[..]));
        assert_eq!(host.recv().unwrap(), Some(&b"two"[..]));
        backlog.flush(worker.split().0).unwrap();
        assert!(backlog.is_empty());
        assert_eq!(host.recv().unwrap(), Some(&b"three"[..]));
        assert_eq!(backlog.held(), 0);
    }

    #[test]
    fn more_than_the_limit_is_refused() {
        let mut backlog = Backlog::new(16);
        backlog.push(b"12345678").unwrap();
        assert_eq!(backlog.push(b"x"), Err(BacklogFull));
        assert_eq!(backlog.held(), 12);
    }

    #[test]
    fn a_gone_host_ends_the_flush() {
        let (mut worker, host) = LoopbackConnection::pair(MaxMsgSize::DEFAULT, 2);
        drop(host);
        let mut backlog = Backlog::new(1024);
        backlog.push(b"late").unwrap();
        assert!(matches!(
            backlog.flush(worker.split().0),
            Err(FrameSendError::PeerGone(_))
        ));
    }
}
