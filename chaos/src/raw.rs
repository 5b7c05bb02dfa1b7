//! Bare connections to a daemon: bytes sent as they are, and how the daemon ended the
//! connection (its replies, then the end of the stream, a reset, or nothing at all).

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use urom_wire::control::ControlMessage;
use urom_wire::frame::frame_length;
use urom_wire::{FrameRepr, MaxMsgSize, Status};

use crate::frames::{auth_response, hello};

/// How a connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum How {
    /// The end of the stream: an orderly close.
    Closed,
    /// The connection was reset.
    Reset,
    /// Neither within the time given.
    Open,
    /// The daemon sent bytes that are not a frame.
    Garbled,
}

/// What the daemon sent on a connection, and how the connection ended.
#[derive(Debug, Clone)]
pub struct Ending {
    /// The daemon's frames in order: `Ok` for a reply, `Err(status)` for an error reply.
    pub replies: Vec<Result<(), Status>>,
    /// How it ended.
    pub how: How,
}

impl Ending {
    /// The last reply's status when it was an error reply.
    pub fn refusal(&self) -> Option<Status> {
        self.replies.last().and_then(|reply| reply.err())
    }

    /// In a word or two: `refused <status>` (an error reply, then the end), `answered` (a
    /// reply that is not an error, then the end), `closed` (the end, no reply), `reset`, `open`,
    /// `garbled`.
    pub fn describe(&self) -> String {
        match (self.how, self.refusal()) {
            (How::Closed, Some(status)) => format!("refused {}", status.name()),
            (How::Closed, None) if self.replies.is_empty() => "closed".to_owned(),
            (How::Closed, None) => "answered".to_owned(),
            (How::Reset, _) => "reset".to_owned(),
            (How::Open, _) => "open".to_owned(),
            (How::Garbled, _) => "garbled".to_owned(),
        }
    }
}

/// The largest maximum message size: accepts whatever the daemon sends.
fn largest() -> MaxMsgSize {
    MaxMsgSize::new(MaxMsgSize::MAX).expect("MAX is legal")
}

/// Reads what the daemon sends until it ends the connection or `deadline` passes.
pub fn ending(stream: &mut UnixStream, deadline: Instant) -> Ending {
    let mut replies = Vec::new();
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    let how = loop {
        // Whole frames first.
        loop {
            match frame_length(&bytes, largest()) {
                Ok(Some(len)) if len <= bytes.len() => {
                    let reply = match FrameRepr::<ControlMessage>::parse(&bytes[..len], largest()) {
                        Ok(FrameRepr {
                            body: ControlMessage::Error(error),
                            ..
                        }) => Err(error.status),
                        Ok(_) => Ok(()),
                        Err(_) => {
                            return Ending {
                                replies,
                                how: How::Garbled,
                            };
                        }
                    };
                    replies.push(reply);
                    bytes.drain(..len);
                }
                Ok(_) => break,
                Err(_) => {
                    return Ending {
                        replies,
                        how: How::Garbled,
                    };
                }
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break How::Open;
        }
        let _ = stream.set_read_timeout(Some(left));
        match stream.read(&mut buf) {
            Ok(0) if bytes.is_empty() => break How::Closed,
            Ok(0) => break How::Garbled,
            Ok(n) => bytes.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => break How::Reset,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break How::Open,
        }
    };
    Ending { replies, how }
}

/// Connects to `socket`.
pub fn connect(socket: &Path) -> io::Result<UnixStream> {
    UnixStream::connect(socket)
}

/// Says hello and authenticates on `stream` with the daemon's message size `max`; an error
/// names what the daemon answered instead.
pub fn handshake(stream: &mut UnixStream, max: MaxMsgSize) -> Result<(), String> {
    for (what, frame) in [
        ("hello", hello(1, max)),
        ("authentication", auth_response(2, max)),
    ] {
        stream
            .write_all(&frame)
            .map_err(|e| format!("sending the {what}: {e}"))?;
        let reply = read_frame(stream).map_err(|e| format!("reading the {what}'s reply: {e}"))?;
        if let Ok(FrameRepr {
            body: ControlMessage::Error(error),
            ..
        }) = FrameRepr::<ControlMessage>::parse(&reply, largest())
        {
            return Err(format!("the {what} was refused: {}", error.reason));
        }
    }
    Ok(())
}

/// Reads one whole frame (within [`crate::PATIENCE`]).
fn read_frame(stream: &mut UnixStream) -> io::Result<Vec<u8>> {
    stream.set_read_timeout(Some(crate::PATIENCE))?;
    let mut bytes = vec![0u8; urom_wire::FRAME_HEADER_LEN];
    stream.read_exact(&mut bytes)?;
    let len = frame_length(&bytes, largest())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?
        .unwrap_or(bytes.len());
    bytes.resize(len, 0);
    stream.read_exact(&mut bytes[urom_wire::FRAME_HEADER_LEN..])?;
    Ok(bytes)
}

/// How a connection that said nothing ended, given until `patience` after `connected`.
pub fn how_idle_ended(mut stream: UnixStream, connected: Instant, patience: Duration) -> String {
    ending(&mut stream, connected + patience).describe()
}
