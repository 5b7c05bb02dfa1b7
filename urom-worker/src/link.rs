//! The daemon's link: a socket the daemon handed the worker as its standard input, on which it
//! asks for the worker's counters (`urom_wire::link`). A thread of its own answers from the
//! counts the worker loop last published, so a busy loop never waits for the daemon, nor the
//! daemon for a busy loop.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use tracing::{debug, warn};
use urom_wire::frame::frame_length;
use urom_wire::link::{CounterReport, LINK_MAX_MSG_SIZE, LinkMessage};
use urom_wire::{FRAME_HEADER_LEN, FrameRepr, List};

use crate::counters::{Published, error_buffer};

/// The socket on this process's standard input, where the daemon put its end of the link.
pub fn stdin_link() -> io::Result<UnixStream> {
    use std::os::fd::AsFd;
    let fd = io::stdin().as_fd().try_clone_to_owned()?;
    let stream = UnixStream::from(fd);
    // Not a socket (a terminal, /dev/null): refused here rather than at the first read.
    stream.local_addr()?;
    Ok(stream)
}

/// Answers the daemon's requests on `link` until it closes the link or sends something that is
/// not a request.
pub fn serve(mut link: UnixStream, worker_id: u64, published: &Arc<Published>) {
    let mut frame = vec![0u8; LINK_MAX_MSG_SIZE.get()];
    let mut reply = vec![0u8; LINK_MAX_MSG_SIZE.get()];
    loop {
        let len = match read_frame(&mut link, &mut frame) {
            Ok(Some(len)) => len,
            Ok(None) => {
                debug!("the daemon closed its link");
                return;
            }
            Err(e) => {
                warn!("daemon link failed: {e}; counters are no longer reported");
                return;
            }
        };
        let seq = match FrameRepr::<LinkMessage>::parse(&frame[..len], LINK_MAX_MSG_SIZE) {
            Ok(FrameRepr {
                seq,
                body: LinkMessage::CountersRequest,
            }) => seq,
            Ok(other) => {
                warn!(
                    "unexpected {:?} on the daemon link; closing it",
                    urom_wire::Body::kind(&other.body)
                );
                return;
            }
            Err(e) => {
                warn!("malformed frame on the daemon link: {e}; closing it");
                return;
            }
        };
        let mut errors = error_buffer();
        let (counters, entries) = published.load(worker_id, &mut errors);
        let answer = FrameRepr {
            seq,
            body: LinkMessage::CountersReply(CounterReport {
                counters,
                errors: List::new(&errors[..entries]),
            }),
        };
        let written = match answer.emit(&mut reply, LINK_MAX_MSG_SIZE) {
            Ok(len) => len,
            Err(e) => {
                warn!("cannot write the counter report: {e}");
                return;
            }
        };
        if let Err(e) = link.write_all(&reply[..written]) {
            warn!("daemon link failed: {e}; counters are no longer reported");
            return;
        }
    }
}

/// Reads one frame into `buf`; `None` when the link closed between frames.
fn read_frame(link: &mut UnixStream, buf: &mut [u8]) -> io::Result<Option<usize>> {
    match link.read_exact(&mut buf[..FRAME_HEADER_LEN]) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = frame_length(&buf[..FRAME_HEADER_LEN], LINK_MAX_MSG_SIZE)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?
        .unwrap_or(FRAME_HEADER_LEN);
    link.read_exact(&mut buf[FRAME_HEADER_LEN..len])?;
    Ok(Some(len))
}
