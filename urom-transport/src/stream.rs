//! Byte streams for the control protocol: a Unix socket on one machine, a TCP connection to a
//! service on another, or a [`Channel`].
//!
//! The control protocol (host <-> daemon) is a stream of frames that each side reads with
//! [`Read`] and writes with [`Write`]. Over a channel, every `write` goes out as one transport
//! frame and `read` hands out the bytes of received frames in order, so the same reader and
//! writer code serves both. It copies each frame once; the control path is not a hot path.
//!
//! Once a remote peer authenticated, both halves are [sealed](StreamWriter::seal): from then on
//! every `write` is one record with an integrity check (see [`record`](super::record)), and a
//! read hands out only bytes whose record checked.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use super::record::{Opener, RecordKey, Sealer};
use super::{
    Channel, ChannelReceiver, ChannelSender, FrameReceiver, FrameRecvError, FrameSendError,
    FrameSender, HalfControl, PeerGoneError, Transport,
};
use urom_wire::frame::frame_length;
use urom_wire::{FRAME_HEADER_LEN, MaxMsgSize};

/// How long a read or write without a timeout waits between looks (it then waits again).
const FOREVER_STEP: Duration = Duration::from_secs(3600);

/// The reading half of a control stream.
pub struct StreamReader {
    inner: Inner<UnixStream, TcpStream, ChannelReader>,
    /// Set once sealed.
    opener: Option<Opener>,
}

/// The writing half of a control stream.
pub struct StreamWriter {
    inner: Inner<UnixStream, TcpStream, ChannelWriter>,
    /// Set once sealed.
    sealer: Option<Sealer>,
}

/// What a stream half runs over.
enum Inner<U, T, C> {
    Unix(U),
    Tcp(T),
    Channel(C),
}

impl<U: Read, T: Read, C: Read> Read for Inner<U, T, C> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Self::Unix(stream) => stream.read(buf),
            Self::Tcp(stream) => stream.read(buf),
            Self::Channel(reader) => reader.read(buf),
        }
    }
}

impl<U: Write, T: Write, C: Write> Write for Inner<U, T, C> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Self::Unix(stream) => stream.write(buf),
            Self::Tcp(stream) => stream.write(buf),
            Self::Channel(writer) => writer.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn halves(
    reader: Inner<UnixStream, TcpStream, ChannelReader>,
    writer: Inner<UnixStream, TcpStream, ChannelWriter>,
) -> (StreamReader, StreamWriter) {
    (
        StreamReader {
            inner: reader,
            opener: None,
        },
        StreamWriter {
            inner: writer,
            sealer: None,
        },
    )
}

/// A stream's two halves.
pub fn split_unix(stream: UnixStream) -> io::Result<(StreamReader, StreamWriter)> {
    let writer = stream.try_clone()?;
    Ok(halves(Inner::Unix(stream), Inner::Unix(writer)))
}

/// A TCP connection's two halves; small frames leave at once (no Nagle delay).
pub fn split_tcp(stream: TcpStream) -> io::Result<(StreamReader, StreamWriter)> {
    stream.set_nodelay(true)?;
    let writer = stream.try_clone()?;
    Ok(halves(Inner::Tcp(stream), Inner::Tcp(writer)))
}

/// Connects to `address` over TCP within `timeout`; the connection's two halves.
pub fn connect_tcp(
    address: std::net::SocketAddr,
    timeout: Duration,
) -> io::Result<(StreamReader, StreamWriter)> {
    split_tcp(TcpStream::connect_timeout(&address, timeout)?)
}

/// A channel's two halves, as a stream.
pub fn split_channel(channel: Channel) -> (StreamReader, StreamWriter) {
    let (tx, rx) = channel.into_split();
    halves(
        Inner::Channel(ChannelReader {
            rx,
            frame: Vec::new(),
            offset: 0,
            timeout: None,
        }),
        Inner::Channel(ChannelWriter { tx, timeout: None }),
    )
}

impl StreamReader {
    /// How long a `read` waits before it fails with [`io::ErrorKind::WouldBlock`]; `None`
    /// waits for ever.
    pub fn set_read_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        match &mut self.inner {
            Inner::Unix(stream) => stream.set_read_timeout(timeout),
            Inner::Tcp(stream) => stream.set_read_timeout(timeout),
            Inner::Channel(reader) => {
                reader.timeout = timeout;
                Ok(())
            }
        }
    }

    /// Reads exactly `buf.len()` bytes, giving up with [`io::ErrorKind::TimedOut`] (or
    /// `WouldBlock`) at `deadline`; `None` waits as the read timeout says.
    pub fn read_exact_until(
        &mut self,
        buf: &mut [u8],
        deadline: Option<Instant>,
    ) -> io::Result<()> {
        if let Some(deadline) = deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::ErrorKind::TimedOut.into());
            }
            self.set_read_timeout(Some(left))?;
        }
        self.read_exact(buf)
    }

    /// From now on, reads only records of at most `max` bytes sealed with `key`.
    pub fn seal(&mut self, key: &RecordKey, max: MaxMsgSize) {
        self.opener = Some(Opener::new(key, max.get()));
    }
}

impl StreamWriter {
    /// How long a `write` may wait for room before it fails with [`io::ErrorKind::TimedOut`];
    /// `None` waits for ever.
    pub fn set_write_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        match &mut self.inner {
            Inner::Unix(stream) => stream.set_write_timeout(timeout),
            Inner::Tcp(stream) => stream.set_write_timeout(timeout),
            Inner::Channel(writer) => {
                writer.timeout = timeout;
                Ok(())
            }
        }
    }

    /// From now on, writes each `write` (of at most `max` bytes) as a record sealed with
    /// `key`.
    pub fn seal(&mut self, key: &RecordKey, max: MaxMsgSize) {
        self.sealer = Some(Sealer::new(key, max.get()));
    }

    /// Ends the stream in this direction: the peer reads what was written, then the end.
    pub fn shutdown(&mut self) {
        match &mut self.inner {
            Inner::Unix(stream) => {
                let _ = stream.shutdown(std::net::Shutdown::Write);
            }
            Inner::Tcp(stream) => {
                let _ = stream.shutdown(std::net::Shutdown::Write);
            }
            Inner::Channel(writer) => writer.tx.close(),
        }
    }

    /// Ends the stream both ways at once, waking a thread blocked reading the other half (on a
    /// channel, the reader wakes once the peer closes in turn).
    pub fn hang_up(&mut self) {
        match &mut self.inner {
            Inner::Unix(stream) => {
                let _ = stream.shutdown(std::net::Shutdown::Both);
            }
            Inner::Tcp(stream) => {
                let _ = stream.shutdown(std::net::Shutdown::Both);
            }
            Inner::Channel(writer) => writer.tx.close(),
        }
    }
}

impl Read for StreamReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &mut self.opener {
            Some(opener) => opener.read(&mut self.inner, buf),
            None => self.inner.read(buf),
        }
    }
}

impl Write for StreamWriter {
    /// Unsealed, writes what the stream takes; sealed, writes one whole record of up to the
    /// maximum of `buf`'s bytes.
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &mut self.sealer {
            Some(sealer) if !buf.is_empty() => {
                let (n, record) = sealer.seal(buf);
                self.inner.write_all(record)?;
                Ok(n)
            }
            _ => self.inner.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Reads one whole control frame into `buf` (grown as needed) within `deadline`; returns its
/// length. Reads exactly the frame's bytes, so that what follows it stays in the stream.
pub fn read_frame(
    reader: &mut StreamReader,
    buf: &mut Vec<u8>,
    max: MaxMsgSize,
    deadline: Option<Instant>,
) -> io::Result<usize> {
    buf.resize(FRAME_HEADER_LEN, 0);
    reader.read_exact_until(buf, deadline)?;
    let len = frame_length(buf, max)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "short frame header"))?;
    buf.resize(len, 0);
    reader.read_exact_until(&mut buf[FRAME_HEADER_LEN..], deadline)?;
    Ok(len)
}

/// A channel's receiving half read as a byte stream.
pub struct ChannelReader {
    rx: ChannelReceiver,
    /// The frame being handed out, and how much of it has been.
    frame: Vec<u8>,
    offset: usize,
    timeout: Option<Duration>,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let deadline = self.timeout.map(|t| Instant::now() + t);
        while self.offset == self.frame.len() {
            match self.rx.recv() {
                Ok(Some(frame)) => {
                    self.frame.clear();
                    self.frame.extend_from_slice(frame);
                    self.offset = 0;
                }
                Ok(None) => {
                    let wait = match deadline {
                        Some(deadline) => deadline.saturating_duration_since(Instant::now()),
                        None => FOREVER_STEP,
                    };
                    if wait.is_zero() {
                        return Err(io::ErrorKind::WouldBlock.into());
                    }
                    match self.rx.wait_recv(wait) {
                        Ok(_) => {}
                        Err(FrameRecvError::PeerGone(PeerGoneError::Closed)) => return Ok(0),
                        Err(e) => return Err(recv_error(e)),
                    }
                }
                Err(FrameRecvError::PeerGone(PeerGoneError::Closed)) => return Ok(0),
                Err(e) => return Err(recv_error(e)),
            }
        }
        let n = buf.len().min(self.frame.len() - self.offset);
        buf[..n].copy_from_slice(&self.frame[self.offset..self.offset + n]);
        self.offset += n;
        Ok(n)
    }
}

/// A channel's sending half written as a byte stream.
pub struct ChannelWriter {
    tx: ChannelSender,
    timeout: Option<Duration>,
}

impl Write for ChannelWriter {
    /// Sends up to one maximum-size frame of `buf` as one transport frame.
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = buf.len().min(self.tx.max_msg_size().get());
        let deadline = self.timeout.map(|t| Instant::now() + t);
        loop {
            match self.tx.send(&buf[..n]) {
                Ok(()) => return Ok(n),
                Err(FrameSendError::Full) => {
                    let wait = match deadline {
                        Some(deadline) => deadline.saturating_duration_since(Instant::now()),
                        None => FOREVER_STEP,
                    };
                    if wait.is_zero() {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "the peer does not take what is sent to it",
                        ));
                    }
                    self.tx.wait_send(wait).map_err(send_error)?;
                }
                Err(e) => return Err(send_error(e)),
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn recv_error(e: FrameRecvError) -> io::Error {
    let kind = match e {
        FrameRecvError::PeerGone(PeerGoneError::Closed) => io::ErrorKind::UnexpectedEof,
        FrameRecvError::PeerGone(PeerGoneError::Died) => io::ErrorKind::ConnectionReset,
        FrameRecvError::Closed => io::ErrorKind::NotConnected,
        FrameRecvError::Protocol(_) => io::ErrorKind::InvalidData,
    };
    io::Error::new(kind, e.to_string())
}

fn send_error(e: FrameSendError) -> io::Error {
    let kind = match e {
        FrameSendError::PeerGone(_) => io::ErrorKind::BrokenPipe,
        FrameSendError::Closed => io::ErrorKind::NotConnected,
        FrameSendError::TooLarge { .. } | FrameSendError::Protocol(_) => io::ErrorKind::InvalidData,
        FrameSendError::Full => io::ErrorKind::WouldBlock,
    };
    io::Error::new(kind, e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ChannelConfig;
    use crate::shm::ShmConnection;
    use urom_wire::MaxMsgSize;

    fn channels() -> (Channel, Channel) {
        let config = ChannelConfig {
            slots: 4,
            ..ChannelConfig::new(MaxMsgSize::new(MaxMsgSize::MIN).unwrap())
        };
        let (a, b) = ShmConnection::pair(&config).unwrap();
        (a.into(), b.into())
    }

    fn pair() -> ((StreamReader, StreamWriter), (StreamReader, StreamWriter)) {
        let (a, b) = channels();
        (split_channel(a), split_channel(b))
    }

    #[test]
    fn bytes_written_are_read_in_order_across_frame_boundaries() {
        let ((_, mut writer), (mut reader, _)) = pair();
        let message: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        let sender = std::thread::spawn(move || {
            writer.write_all(&message).unwrap();
            writer.shutdown();
            message
        });
        let mut received = Vec::new();
        reader.read_to_end(&mut received).unwrap();
        assert_eq!(received, sender.join().unwrap());
    }

    #[test]
    fn a_read_times_out_and_a_dead_peer_is_an_error() {
        let (a, peer) = channels();
        let (mut reader, _writer) = split_channel(a);
        reader
            .set_read_timeout(Some(Duration::from_millis(10)))
            .unwrap();
        let error = reader.read(&mut [0; 8]).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::WouldBlock);
        peer.simulate_crash();
        reader.set_read_timeout(None).unwrap();
        let error = reader.read(&mut [0; 8]).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::ConnectionReset, "{error}");
    }

    #[test]
    fn a_write_to_a_peer_that_reads_nothing_times_out() {
        let ((_, mut writer), _peer) = pair();
        writer
            .set_write_timeout(Some(Duration::from_millis(10)))
            .unwrap();
        let frame = [0u8; 64];
        let error = (0..100)
            .find_map(|_| writer.write_all(&frame).err())
            .expect("the rings fill up");
        assert_eq!(error.kind(), io::ErrorKind::TimedOut, "{error}");
    }
}
