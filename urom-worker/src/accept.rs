//! Accepting hosts on the worker's socket: who may connect, and each host's channel set up
//! beside the others' on the one acceptor thread, so that no host's handshake waits on
//! another's and the worker's threads do not grow with the hosts connecting.

use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::eventfd::EventFd;
use tracing::warn;
use urom_transport::shm::{ShmConnection, ShmOffer};
use urom_transport::{Channel, ChannelConfig};

#[cfg(feature = "ucx")]
mod front_door;
#[cfg(feature = "ucx")]
pub(crate) use front_door::accept_ucx_hosts;

/// Where acceptor threads hand over the hosts they accepted: the worker's queue, and the
/// descriptor that wakes the worker if it sleeps.
#[derive(Clone)]
pub(crate) struct Arrive {
    pub(crate) hosts: mpsc::Sender<Channel>,
    pub(crate) wake: Arc<EventFd>,
    /// Set after each host handed over, so that the worker's turn looks at `hosts` only then.
    pub(crate) pending: Arc<AtomicBool>,
}

impl Arrive {
    /// Hands `channel` to the worker and wakes it. A worker that is gone drops it (and so
    /// closes it: the host learns it is gone).
    fn send(&self, channel: Channel) {
        if self.hosts.send(channel).is_ok() {
            self.pending.store(true, Ordering::Release);
            // A full counter already wakes it.
            let _ = self.wake.write(1);
        }
    }
}

/// How long the acceptor waits before it accepts again after accepting failed (out of
/// descriptors, say).
const ACCEPT_RETRY: Duration = Duration::from_millis(5);
/// How many hosts may be setting up their channels at once.
const MAX_HANDSHAKES: usize = 16;

/// Where a host's handshake stands.
enum Stage {
    /// Its request (the size of its rings) is awaited.
    Asking(UnixStream),
    /// The offer went out; its answer is awaited.
    Offered(ShmOffer),
}

impl Stage {
    fn socket(&self) -> std::os::fd::BorrowedFd<'_> {
        match self {
            Stage::Asking(stream) => stream.as_fd(),
            Stage::Offered(offer) => offer.socket(),
        }
    }
}

/// A host whose handshake is under way, until `deadline`.
struct Handshake {
    stage: Stage,
    deadline: Instant,
}

/// Accepts hosts until `stop` is set (and `halt` is written), each host's channel set up
/// beside the others on this one thread; sleeps while nothing happens.
///
/// A host whose user this worker does not serve is closed at once. Each host's request (the
/// size of its rings), the offer made to it and its answer come and go beside the others',
/// bounded by the channel's handshake timeout, so that a host that connects and then says
/// nothing delays no one else; at most [`MAX_HANDSHAKES`] are under way at once, and a host
/// connecting beyond them is closed at once.
pub(crate) fn accept_hosts(
    listener: UnixListener,
    config: ChannelConfig,
    allow_uids: &[u32],
    arrive: Arrive,
    stop: &AtomicBool,
    halt: &EventFd,
) {
    let own_uid = nix::unistd::geteuid().as_raw();
    if let Err(e) = listener.set_nonblocking(true) {
        warn!("cannot make the host socket non-blocking: {e}; no host can connect");
        return;
    }
    let mut handshakes: Vec<Handshake> = Vec::with_capacity(MAX_HANDSHAKES);
    let mut ready = Vec::with_capacity(MAX_HANDSHAKES);
    while !stop.load(Ordering::Relaxed) {
        // Sleep until a host connects, one awaited answers, the first deadline passes or the
        // worker stops.
        let deadlines = handshakes.iter().map(|h| h.deadline);
        let waiting = handshakes
            .iter()
            .map(|h| (h.stage.socket(), PollFlags::POLLIN));
        if sleep_until_ready(&listener, halt, waiting, deadlines, &mut ready, "hosts").is_none() {
            continue;
        }
        // Requests and answers that came (or hang-ups), and those that did not come in time;
        // from the back, so that `swap_remove` moves only handshakes already looked at.
        let now = Instant::now();
        for i in (0..handshakes.len()).rev() {
            if ready.get(i).copied().unwrap_or(false) {
                let Handshake { stage, deadline } = handshakes.swap_remove(i);
                match stage {
                    Stage::Asking(stream) => match ShmConnection::offer(stream, &config) {
                        Ok(offer) => handshakes.push(Handshake {
                            stage: Stage::Offered(offer),
                            deadline,
                        }),
                        Err(reason) => warn!("a host could not connect: {reason}"),
                    },
                    Stage::Offered(offer) => match offer.finish() {
                        // The worker may be gone by now; then so is the host.
                        Ok(conn) => arrive.send(Channel::from(conn)),
                        Err(reason) => warn!("a host could not connect: {reason}"),
                    },
                }
            } else if handshakes[i].deadline <= now {
                match handshakes.swap_remove(i).stage {
                    Stage::Asking(_) => warn!(
                        "a host could not connect: it asked for no rings in time (a host \
                         library older than this worker?)"
                    ),
                    Stage::Offered(_) => {
                        warn!("a host could not connect: it did not answer the offer in time")
                    }
                }
            }
        }
        accept_ready(&listener, &config, own_uid, allow_uids, &mut handshakes);
    }
}

/// Accepts every host waiting on `listener` and offers each a channel.
fn accept_ready(
    listener: &UnixListener,
    config: &ChannelConfig,
    own_uid: u32,
    allow_uids: &[u32],
    handshakes: &mut Vec<Handshake>,
) {
    loop {
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                warn!("accepting a host failed: {e}");
                thread::sleep(ACCEPT_RETRY);
                return;
            }
        };
        match host_uid(&stream) {
            Ok(uid) if may_serve(uid, own_uid, allow_uids) => {}
            Ok(uid) => {
                warn!(
                    "refused a host of user {uid}: not this worker's user, root or an --allow-uid"
                );
                continue;
            }
            Err(e) => {
                warn!("refused a host whose user cannot be read: {e}");
                continue;
            }
        }
        if handshakes.len() >= MAX_HANDSHAKES {
            warn!(
                "turned a host away: {MAX_HANDSHAKES} hosts are already setting up their channels"
            );
            continue;
        }
        handshakes.push(Handshake {
            stage: Stage::Asking(stream),
            deadline: Instant::now() + config.handshake_timeout,
        });
    }
}

/// Whether a host run by `uid` may use a worker run by `own_uid` that allows `allow_uids`.
fn may_serve(uid: u32, own_uid: u32, allow_uids: &[u32]) -> bool {
    uid == own_uid || uid == 0 || allow_uids.contains(&uid)
}

/// The user of the process at the other end of `stream`.
fn host_uid(stream: &UnixStream) -> nix::Result<u32> {
    nix::sys::socket::getsockopt(stream, nix::sys::socket::sockopt::PeerCredentials)
        .map(|credentials| credentials.uid())
}

/// Sleeps in poll until the listener or `halt` is readable, one of `waiting` is ready for what
/// it waits for, the earliest of `deadlines` passes, or a signal comes: marks in `ready` (cleared
/// first) which of `waiting` are ready, and says whether the listener is. `None` when the poll
/// failed (logged as waiting for `what`, after a short pause) or a signal ended it.
fn sleep_until_ready<'a>(
    listener: &impl AsFd,
    halt: &EventFd,
    waiting: impl Iterator<Item = (BorrowedFd<'a>, PollFlags)>,
    deadlines: impl Iterator<Item = Instant>,
    ready: &mut Vec<bool>,
    what: &str,
) -> Option<bool> {
    let now = Instant::now();
    let timeout = deadlines
        .map(|deadline| deadline.saturating_duration_since(now))
        .min()
        .map_or(PollTimeout::NONE, |left| {
            // Rounded up, so that a deadline is not polled for in a burst of zero waits.
            let ms = left.as_millis().saturating_add(1);
            PollTimeout::try_from(ms.min(i32::MAX as u128) as i32).unwrap_or(PollTimeout::MAX)
        });
    ready.clear();
    let mut fds = vec![
        PollFd::new(listener.as_fd(), PollFlags::POLLIN),
        PollFd::new(halt.as_fd(), PollFlags::POLLIN),
    ];
    fds.extend(waiting.map(|(fd, events)| PollFd::new(fd, events)));
    match poll(&mut fds, timeout) {
        Ok(_) => {}
        Err(nix::errno::Errno::EINTR) => return None,
        Err(e) => {
            warn!("waiting for {what} failed: {e}");
            thread::sleep(ACCEPT_RETRY);
            return None;
        }
    }
    let readable = |fd: &PollFd<'_>| fd.revents().is_some_and(|r| !r.is_empty());
    ready.extend(fds[2..].iter().map(readable));
    Some(readable(&fds[0]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_of_the_workers_user_root_and_allowed_users_are_served() {
        assert!(may_serve(1000, 1000, &[]));
        assert!(may_serve(0, 1000, &[]));
        assert!(may_serve(1001, 1000, &[1001, 1002]));
        assert!(!may_serve(1003, 1000, &[1001, 1002]));
        assert!(!may_serve(1001, 1000, &[]));
    }
}
