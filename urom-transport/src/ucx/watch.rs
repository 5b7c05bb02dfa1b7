//! The process's wake thread: what lets a sleeping connection end or listener sleep on an
//! eventfd of its own rather than on the shared worker's event descriptor, which becomes
//! readable for every connection's traffic in the process.
//!
//! A half that goes to sleep arms the shared worker and marks itself asleep
//! ([`sleeper_in`]); while any half or listener sleeps, the wake thread sleeps on the worker's
//! descriptor (armed), and when it fires progresses the worker under the shared lock. The
//! callbacks that run write the eventfd of the half their message is for (only a sleeping
//! one: [`State::wake`](super::state::State::wake)), so a half is woken for its own traffic
//! only. With no sleeper the thread sleeps on its kick descriptor alone and costs nothing.
//!
//! Ends that busy-poll keep the worker progressed themselves: when the thread finds that
//! another thread progressed the worker since it was last armed, and still does, it leaves the
//! worker (and the lock) to them and looks again [`BACKOFF`] later, taking over only once they
//! stopped. Counting progress calls costs a busy-polling end two plain loads and a store per
//! call, under the lock it holds anyway.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use super::UcxConnectError;
use super::ucp;

/// How many halves and listeners sleep on descriptors of their own, counting on the thread.
/// Changed only under the shared worker's lock.
static SLEEPERS: AtomicUsize = AtomicUsize::new(0);
/// The thread sleeps on the worker's descriptor, the worker armed. Changed only under the lock.
static WATCHING: AtomicBool = AtomicBool::new(false);
/// Calls into the shared worker's progress so far. Changed only under the lock; the thread
/// also reads it without.
static PROGRESSED: AtomicU64 = AtomicU64::new(0);
/// [`PROGRESSED`] when the shared worker was last armed. Changed only under the lock.
static ARMED_AT: AtomicU64 = AtomicU64::new(u64::MAX);
/// The thread's kick descriptor: written when a half goes to sleep while the thread does not
/// watch the worker.
static KICK: OnceLock<OwnedFd> = OnceLock::new();

/// How long the thread leaves the worker to another thread that progresses it before it
/// looks again: the longest a sleeping half waits for a message that a busy thread's last
/// progress missed.
const BACKOFF: Duration = Duration::from_millis(1);

/// Starts the wake thread for the shared worker whose event descriptor is `efd` (open as long
/// as the process). Called once, while the shared worker is made: the thread takes the
/// worker's lock only once a sleeper kicked it, which needs the worker.
pub(super) fn start(efd: RawFd) -> Result<(), UcxConnectError> {
    let kick = crate::sys::wake_event().map_err(|errno| UcxConnectError::Sys {
        op: "eventfd",
        errno,
    })?;
    let kick = KICK.get_or_init(|| kick).as_fd();
    std::thread::Builder::new()
        .name("urom-ucx-wake".to_owned())
        .spawn(move || {
            // SAFETY: the shared worker's descriptor stays open as long as the process (the
            // worker is destroyed only at exit, and this thread then never polls again: it
            // waits for the lock, taken for good).
            let efd = unsafe { BorrowedFd::borrow_raw(efd) };
            run(kick, efd);
        })
        .map(drop)
        .map_err(|e| UcxConnectError::Sys {
            op: "spawning the UCX wake thread",
            errno: nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EAGAIN)),
        })
}

/// Counts a call into the shared worker's progress; the caller holds its lock.
#[inline]
pub(super) fn progressed() {
    // Only threads holding the lock write it: a plain increment, not an atomic one.
    let n = PROGRESSED.load(Ordering::Relaxed);
    PROGRESSED.store(n.wrapping_add(1), Ordering::Relaxed);
}

/// Notes that the shared worker was armed; the caller holds its lock.
pub(super) fn armed() {
    ARMED_AT.store(PROGRESSED.load(Ordering::Relaxed), Ordering::Relaxed);
}

/// A half or listener goes to sleep on its own descriptor, the shared worker armed; the
/// caller holds the lock. Kicks the thread when it does not watch the worker.
pub(super) fn sleeper_in() {
    SLEEPERS.fetch_add(1, Ordering::Relaxed);
    if !WATCHING.load(Ordering::Relaxed)
        && let Some(kick) = KICK.get()
    {
        crate::sys::wake(kick.as_fd());
    }
}

/// A sleeper is awake (or gone); the caller holds the lock.
pub(super) fn sleeper_out() {
    let _ = SLEEPERS.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
}

/// The thread: idle while nobody sleeps; otherwise it sleeps on the worker's descriptor, and
/// progresses the worker when it fires, unless another thread does.
fn run(kick: BorrowedFd<'static>, efd: BorrowedFd<'static>) {
    // The worker's descriptor fired and this thread has not progressed the worker since.
    let mut fired = false;
    // `PROGRESSED` when this thread last looked.
    let mut seen = u64::MAX;
    // Nobody sleeps: wait for a kick before taking the lock (the first time, the worker is
    // still being made).
    let mut idle = true;
    loop {
        if idle {
            wait(&[kick], None);
        } else {
            // Another thread progressed the worker since it was armed, and still did since
            // this one last looked: it receives what comes (and wakes the sleepers). Looked at
            // without the lock, which that thread wants.
            let now = PROGRESSED.load(Ordering::Relaxed);
            if now != ARMED_AT.load(Ordering::Relaxed) && now != seen {
                seen = now;
                wait(&[kick], Some(BACKOFF));
                continue;
            }
        }
        let Some(guard) = ucp::lock_if_made() else {
            continue;
        };
        WATCHING.store(false, Ordering::Relaxed);
        idle = SLEEPERS.load(Ordering::Relaxed) == 0;
        if idle {
            continue;
        }
        let now = PROGRESSED.load(Ordering::Relaxed);
        let armed_at = ARMED_AT.load(Ordering::Relaxed);
        if now != armed_at && now != seen {
            // As above, now under the lock.
            seen = now;
            drop(guard);
            wait(&[kick], Some(BACKOFF));
            continue;
        }
        if fired || now != armed_at {
            let worker = guard.worker();
            worker.progress_all();
            fired = false;
            if SLEEPERS.load(Ordering::Relaxed) == 0 {
                continue;
            }
            if let ucp::Armed::Busy = worker.arm() {
                continue;
            }
        }
        WATCHING.store(true, Ordering::Relaxed);
        seen = PROGRESSED.load(Ordering::Relaxed);
        drop(guard);
        fired = wait(&[efd, kick], None)[0];
    }
}

/// Sleeps until one of `fds` (at most two) is readable or `timeout` passes; drains the kick
/// descriptor (the last one) if it woke. Which descriptors were readable.
fn wait(fds: &[BorrowedFd<'_>], timeout: Option<Duration>) -> [bool; 2] {
    let mut polled = [
        PollFd::new(fds[0], PollFlags::POLLIN),
        PollFd::new(fds[fds.len() - 1], PollFlags::POLLIN),
    ];
    let polled = &mut polled[..fds.len()];
    let timeout = timeout.map_or(PollTimeout::NONE, |t| {
        PollTimeout::try_from(t.as_millis().max(1)).unwrap_or(PollTimeout::MAX)
    });
    let mut ready = [false; 2];
    match poll(polled, timeout) {
        Ok(_) => {
            for (i, fd) in polled.iter().enumerate() {
                ready[i] = fd.revents().is_some_and(|r| !r.is_empty());
            }
            if ready[fds.len() - 1] {
                crate::sys::drain(fds[fds.len() - 1]);
            }
        }
        Err(nix::errno::Errno::EINTR) => {}
        // Polling valid descriptors does not fail otherwise; do not spin on it.
        Err(_) => std::thread::sleep(Duration::from_millis(1)),
    }
    ready
}
