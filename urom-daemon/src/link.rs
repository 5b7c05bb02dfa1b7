//! The daemon's end of the link to each worker: a socket pair made at spawn, whose other end is
//! the worker's standard input. The daemon asks for the worker's counters on it
//! (`urom_wire::link`); the worker answers from a thread of its own with what its loop last
//! published.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use urom_wire::frame::frame_length;
use urom_wire::link::{LINK_MAX_MSG_SIZE, LinkMessage};
use urom_wire::report::{ErrorEntry, WorkerCounters};
use urom_wire::{FRAME_HEADER_LEN, FrameRepr};

/// How long a worker has to answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(1);

/// A worker's counters and its notifications by error status.
pub type CounterSnapshot = (WorkerCounters, Vec<ErrorEntry>);

/// The daemon's end of a worker's link.
pub struct WorkerLink {
    /// The socket and the sequence number of the last request; one request at a time.
    inner: Mutex<(UnixStream, u64)>,
}

impl WorkerLink {
    /// A socket pair: the daemon's end, and the end for the worker's standard input.
    pub fn pair() -> io::Result<(Self, UnixStream)> {
        let (ours, theirs) = UnixStream::pair()?;
        ours.set_read_timeout(Some(ANSWER_TIMEOUT))?;
        ours.set_write_timeout(Some(ANSWER_TIMEOUT))?;
        Ok((
            Self {
                inner: Mutex::new((ours, 0)),
            },
            theirs,
        ))
    }

    /// Asks the worker for its counters; the answer is read with [`Asked::answer`]. The link
    /// is held, one request at a time, until then.
    pub fn ask(&self) -> Result<Asked<'_>, String> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let (stream, last_seq) = &mut *inner;
        *last_seq += 1;
        let seq = *last_seq;
        let request = FrameRepr {
            seq,
            body: LinkMessage::CountersRequest,
        };
        let mut buf = vec![0u8; LINK_MAX_MSG_SIZE.get()];
        let len = request
            .emit(&mut buf, LINK_MAX_MSG_SIZE)
            .map_err(|e| e.to_string())?;
        stream
            .write_all(&buf[..len])
            .map_err(|e| describe("cannot ask the worker", &e))?;
        Ok(Asked { inner, seq })
    }
}

/// Each worker's counters, in order: all are asked first, then their answers are awaited until
/// one deadline, so that workers that do not answer (their user stopped them) cost the caller
/// `ANSWER_TIMEOUT` in all, however many they are.
pub fn counters_of_all<'a>(
    links: impl IntoIterator<Item = Option<&'a WorkerLink>>,
) -> Vec<Result<CounterSnapshot, String>> {
    let asked: Vec<Result<Asked<'a>, String>> = links
        .into_iter()
        .map(|link| {
            link.ok_or_else(|| "the worker is starting".to_owned())?
                .ask()
        })
        .collect();
    let deadline = Instant::now() + ANSWER_TIMEOUT;
    asked
        .into_iter()
        .map(|asked| asked?.answer(deadline))
        .collect()
}

/// A worker's link with a request for its counters sent.
pub struct Asked<'a> {
    inner: MutexGuard<'a, (UnixStream, u64)>,
    seq: u64,
}

impl Asked<'_> {
    /// The worker's answer, awaited until `deadline` at most.
    pub fn answer(mut self, deadline: Instant) -> Result<CounterSnapshot, String> {
        let stream = &mut self.inner.0;
        let mut buf = vec![0u8; LINK_MAX_MSG_SIZE.get()];
        // An answer to an earlier request that timed out may come first: skip it.
        loop {
            // A timeout of zero means none: a deadline passed still gives the answer a moment.
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1));
            stream
                .set_read_timeout(Some(left))
                .map_err(|e| describe("no answer", &e))?;
            let len = read_frame(stream, &mut buf).map_err(|e| describe("no answer", &e))?;
            let frame = FrameRepr::<LinkMessage>::parse(&buf[..len], LINK_MAX_MSG_SIZE)
                .map_err(|e| format!("malformed answer: {e}"))?;
            match frame.body {
                LinkMessage::CountersReply(report) if frame.seq == self.seq => {
                    return Ok((report.counters, report.errors.iter().collect()));
                }
                LinkMessage::CountersReply(_) => continue,
                LinkMessage::CountersRequest => {
                    return Err("the worker sent a request instead of an answer".into());
                }
            }
        }
    }
}

fn describe(what: &str, e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            format!("{what}: the worker did not answer within {ANSWER_TIMEOUT:?}")
        }
        io::ErrorKind::UnexpectedEof | io::ErrorKind::BrokenPipe => {
            format!("{what}: the worker closed its link")
        }
        _ => format!("{what}: {e}"),
    }
}

fn read_frame(stream: &mut UnixStream, buf: &mut [u8]) -> io::Result<usize> {
    stream.read_exact(&mut buf[..FRAME_HEADER_LEN])?;
    let len = frame_length(&buf[..FRAME_HEADER_LEN], LINK_MAX_MSG_SIZE)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?
        .unwrap_or(FRAME_HEADER_LEN);
    stream.read_exact(&mut buf[FRAME_HEADER_LEN..len])?;
    Ok(len)
}

#[cfg(test)]
mod tests {
    use urom_wire::List;
    use urom_wire::link::CounterReport;

    use super::*;

    /// Answers one request on `link` with counters that say `commands`.
    fn answer_once(mut link: UnixStream, commands: u64) {
        let mut buf = vec![0u8; LINK_MAX_MSG_SIZE.get()];
        let len = read_frame(&mut link, &mut buf).unwrap();
        let seq = FrameRepr::<LinkMessage>::parse(&buf[..len], LINK_MAX_MSG_SIZE)
            .unwrap()
            .seq;
        let answer = FrameRepr {
            seq,
            body: LinkMessage::CountersReply(CounterReport {
                counters: WorkerCounters {
                    commands,
                    ..WorkerCounters::default()
                },
                errors: List::new(&[]),
            }),
        };
        let len = answer.emit(&mut buf, LINK_MAX_MSG_SIZE).unwrap();
        link.write_all(&buf[..len]).unwrap();
    }

    #[test]
    fn workers_that_do_not_answer_are_told_apart_from_those_that_do() {
        let (silent, _silent_peer) = WorkerLink::pair().unwrap();
        let (other_silent, _other_silent_peer) = WorkerLink::pair().unwrap();
        let (answering, peer) = WorkerLink::pair().unwrap();
        let answerer = std::thread::spawn(move || answer_once(peer, 7));
        let results = counters_of_all([Some(&silent), Some(&answering), None, Some(&other_silent)]);
        answerer.join().unwrap();
        assert_eq!(results.len(), 4);
        for silent in [&results[0], &results[3]] {
            let error = silent.as_ref().unwrap_err();
            assert!(error.contains("did not answer within"), "{error}");
        }
        assert_eq!(results[1].as_ref().unwrap().0.commands, 7);
        assert_eq!(results[2].as_ref().unwrap_err(), "the worker is starting");
    }
}
