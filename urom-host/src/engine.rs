//! The progress engine.
//!
//! An embedding runtime either calls [`ProgressEngine::progress`] from its own loop, or lets
//! the engine sleep until there is work: [`ProgressEngine::wait`] with a time-out, or, to sleep
//! in its own event loop, the notification descriptor of DOCA's progress engine
//! ([`ProgressEngine::notification_fd`]: request a notification, wait for the descriptor to be
//! readable among others, clear it, progress). The descriptor is an epoll set of the wake-up
//! descriptors of every connected context (see [`urom_transport::FrameReceiver::arm`]) and a
//! timer for the contexts that cannot be woken (a worker still starting, a query of the
//! service): those are looked at again after [`POLL_SOON`].

use std::cell::RefCell;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::rc::{Rc, Weak};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};

use urom_transport::Armed;
use urom_transport::shm::FIRST_NAP;

/// How soon a context that cannot be woken is looked at again while the engine sleeps.
pub const POLL_SOON: Duration = Duration::from_millis(1);

/// How many progress calls in a row find nothing before one yields the core (and as many after
/// that before the next): a few microseconds of polling, after which a worker sharing this
/// thread's core may be what the tasks in flight wait for.
const FRUITLESS_POLLS_BEFORE_YIELD: u32 = 256;

/// A context the engine polls.
pub(crate) trait Poll {
    /// Does what is ready (receive, complete tasks, run callbacks); returns how much.
    fn poll(&mut self) -> usize;

    /// Readies the context to wake a sleeping engine: passes each descriptor to `watch`.
    fn arm(&mut self, watch: &mut dyn FnMut(BorrowedFd<'_>)) -> Armed;

    /// Undoes [`Poll::arm`] once the engine is awake.
    fn disarm(&mut self);
}

/// A task the engine owns until it completes (control-path queries).
pub(crate) trait OneShot {
    /// Completes the task when its answer is there; `true` once done.
    fn poll(&mut self) -> bool;
}

/// The epoll data of a context's descriptor (the timer's is 0).
const CONTEXT_EVENT: u64 = 1;

/// What arming every context found.
enum Arming {
    /// Some context has work: progress.
    Ready,
    /// Sleep; `poll_soon`: some context cannot be woken and needs a look after [`POLL_SOON`].
    Asleep { poll_soon: bool },
}

/// What an engine sleeps on.
struct Notifier {
    epoll: Epoll,
    /// Ends a sleep when some context cannot be woken, or was armed just now.
    timer: TimerFd,
}

/// How the calls of [`ProgressEngine::wait`] went, counted since the engine was made: whether
/// a waiting thread really sleeps, and what ends its sleeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaitStats {
    /// Calls of [`ProgressEngine::wait`].
    pub calls: u64,
    /// Calls that returned without sleeping: some context had work when armed.
    pub ready: u64,
    /// Sleeps (`epoll_wait` calls with a time-out; one call may sleep more than once).
    pub sleeps: u64,
    /// Sleeps a context's descriptor ended.
    pub by_context: u64,
    /// Sleeps ended by the timer of a context that cannot be woken (after 1 ms).
    pub poll_soon: u64,
    /// Sleeps that ran to the call's time-out.
    pub timed_out: u64,
    /// Sleeps the timer of a fresh arm ended, after which the call slept again.
    pub first_naps: u64,
}

/// Polls the contexts connected to it. Single-threaded: create one per thread.
#[derive(Default)]
pub struct ProgressEngine {
    contexts: Vec<Weak<RefCell<dyn Poll>>>,
    tasks: Vec<Box<dyn OneShot>>,
    notifier: Option<Notifier>,
    /// Progress calls in a row that found nothing to do.
    fruitless: u32,
    stats: WaitStats,
}

impl ProgressEngine {
    /// An engine with no context.
    pub fn new() -> Self {
        Self::default()
    }

    pub(crate) fn connect(&mut self, context: &Rc<RefCell<dyn Poll>>) {
        self.contexts.push(Rc::downgrade(context));
    }

    pub(crate) fn add_task(&mut self, task: Box<dyn OneShot>) {
        self.tasks.push(task);
    }

    /// Polls every connected context once; returns how much work was done (frames received,
    /// tasks completed). Contexts that were dropped are disconnected. One call in every 256 in
    /// a row that find nothing yields the core (`sched_yield`), so that a loop of progress calls
    /// does not hold off a worker or another host that shares the core; alone on its core, a
    /// yield returns at once.
    pub fn progress(&mut self) -> usize {
        let mut work = 0;
        self.contexts.retain(|context| match context.upgrade() {
            Some(context) => {
                // A callback that progresses the same engine would re-enter; it is skipped.
                if let Ok(mut context) = context.try_borrow_mut() {
                    work += context.poll();
                }
                true
            }
            None => false,
        });
        let before = self.tasks.len();
        self.tasks.retain_mut(|task| !task.poll());
        let work = work + (before - self.tasks.len());
        if self.yield_due(work) {
            std::thread::yield_now();
        }
        work
    }

    /// Counts the progress calls in a row that did no work; whether this one should yield the
    /// core (every [`FRUITLESS_POLLS_BEFORE_YIELD`] of them).
    fn yield_due(&mut self, work: usize) -> bool {
        if work > 0 {
            self.fruitless = 0;
            return false;
        }
        self.fruitless = self.fruitless.wrapping_add(1);
        self.fruitless % FRUITLESS_POLLS_BEFORE_YIELD == 0
    }

    /// A descriptor that becomes readable when, after [`ProgressEngine::request_notification`],
    /// some context may have work. Made on first use; the same one every time.
    pub fn notification_fd(&mut self) -> io::Result<BorrowedFd<'_>> {
        Ok(self.notifier()?.epoll.0.as_fd())
    }

    /// Prepares to sleep on the notification descriptor: asks every context to make it
    /// readable on new work. `Ok(false)`: work is waiting already, so progress instead of
    /// sleeping (nothing needs clearing then).
    pub fn request_notification(&mut self) -> io::Result<bool> {
        Ok(match self.arm_all()? {
            Arming::Ready => false,
            Arming::Asleep { .. } => true,
        })
    }

    /// Arms every context and sets the timer; clears again when some context is ready.
    fn arm_all(&mut self) -> io::Result<Arming> {
        self.notifier()?;
        let Some(notifier) = &self.notifier else {
            unreachable!("made just above")
        };
        let mut poll_soon = !self.tasks.is_empty();
        let mut fresh = false;
        let mut ready = false;
        let mut failed = None;
        for context in self.contexts.iter().filter_map(Weak::upgrade) {
            let Ok(mut context) = context.try_borrow_mut() else {
                continue;
            };
            let mut watch = |fd: BorrowedFd<'_>| {
                let event = EpollEvent::new(EpollFlags::EPOLLIN, CONTEXT_EVENT);
                match notifier.epoll.add(fd, event) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => failed = Some(e),
                }
            };
            match context.arm(&mut watch) {
                Armed::Ready => ready = true,
                Armed::Armed { fresh: now } => fresh |= now,
                Armed::Unsupported => poll_soon = true,
            }
        }
        if let Some(e) = failed {
            self.clear_notification();
            return Err(e.into());
        }
        if ready {
            self.clear_notification();
            return Ok(Arming::Ready);
        }
        let wake_after = if poll_soon {
            Some(POLL_SOON)
        } else {
            fresh.then_some(FIRST_NAP)
        };
        match wake_after {
            Some(after) => notifier.timer.set(
                Expiration::OneShot(TimeSpec::from(after)),
                TimerSetTimeFlags::empty(),
            )?,
            None => notifier.timer.unset()?,
        }
        Ok(Arming::Asleep { poll_soon })
    }

    /// Ends a notification: the descriptor is quiet again. Call it after waking, before
    /// progressing.
    pub fn clear_notification(&mut self) {
        for context in self.contexts.iter().filter_map(Weak::upgrade) {
            if let Ok(mut context) = context.try_borrow_mut() {
                context.disarm();
            }
        }
        if let Some(notifier) = &self.notifier {
            let _ = notifier.timer.unset();
            // A non-blocking read consumes an expiry, if there was one.
            let mut expirations = [0u8; 8];
            let _ = nix::unistd::read(&notifier.timer, &mut expirations);
        }
    }

    /// Sleeps until some context may have work or `timeout` passes, using no CPU meanwhile;
    /// then call [`ProgressEngine::progress`]. Returns at once when work is waiting already.
    pub fn wait(&mut self, timeout: Duration) -> io::Result<()> {
        let deadline = Instant::now().checked_add(timeout);
        self.stats.calls += 1;
        loop {
            let Arming::Asleep { poll_soon } = self.arm_all()? else {
                self.stats.ready += 1;
                return Ok(());
            };
            self.stats.sleeps += 1;
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            // Whole milliseconds, rounded up: rounded down, a wait of 1 ms (the host
            // libraries' slice), a few nanoseconds gone already, would not sleep at all.
            let epoll_timeout = left
                .and_then(|left| EpollTimeout::try_from(whole_ms(left)).ok())
                .unwrap_or(EpollTimeout::MAX);
            let mut events = [EpollEvent::empty(); 4];
            let woke = match self.notifier()?.epoll.wait(&mut events, epoll_timeout) {
                Ok(n) => &events[..n],
                Err(Errno::EINTR) => &[][..],
                Err(e) => {
                    self.clear_notification();
                    return Err(e.into());
                }
            };
            let by_context = woke.iter().any(|event| event.data() == CONTEXT_EVENT);
            let timed_out = left.is_some_and(|left| left.is_zero()) || woke.is_empty();
            self.clear_notification();
            let stats = &mut self.stats;
            if by_context {
                stats.by_context += 1;
            } else if timed_out {
                stats.timed_out += 1;
            } else if poll_soon {
                stats.poll_soon += 1;
            } else {
                stats.first_naps += 1;
            }
            // The timer alone after a fresh arm: every wake-up is certain now; sleep on.
            if by_context || poll_soon || timed_out {
                return Ok(());
            }
        }
    }

    /// How the calls of [`ProgressEngine::wait`] went so far.
    pub fn wait_stats(&self) -> WaitStats {
        self.stats
    }

    fn notifier(&mut self) -> io::Result<&Notifier> {
        if self.notifier.is_none() {
            let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
            let timer = TimerFd::new(
                ClockId::CLOCK_MONOTONIC,
                TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
            )?;
            epoll.add(&timer, EpollEvent::new(EpollFlags::EPOLLIN, 0))?;
            self.notifier = Some(Notifier { epoll, timer });
        }
        Ok(self.notifier.as_ref().expect("made just above"))
    }
}

/// `d` rounded up to whole milliseconds (`epoll_wait`'s unit).
fn whole_ms(d: Duration) -> Duration {
    let ms = d.as_nanos().div_ceil(1_000_000);
    Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_of_fruitless_progress_calls_yields_now_and_then() {
        let mut engine = ProgressEngine::new();
        let mut yields =
            |calls: u32, work: usize| (0..calls).filter(|_| engine.yield_due(work)).count();
        assert_eq!(yields(FRUITLESS_POLLS_BEFORE_YIELD - 1, 0), 0);
        assert_eq!(yields(1, 0), 1);
        assert_eq!(yields(3 * FRUITLESS_POLLS_BEFORE_YIELD, 0), 3);
        // Work starts the count again.
        assert_eq!(yields(FRUITLESS_POLLS_BEFORE_YIELD - 1, 0), 0);
        assert_eq!(yields(1, 1), 0);
        assert_eq!(yields(FRUITLESS_POLLS_BEFORE_YIELD - 1, 0), 0);
        assert_eq!(yields(1, 0), 1);
    }

    /// A wait shorter than a millisecond, or not a whole number of them, sleeps at least as
    /// long as asked (it used to be cut to whole milliseconds: 1 ms less a few nanoseconds
    /// did not sleep at all, and a rank waiting for a long collective spun). Counted by the
    /// engine, and the time slept is only bounded below: nothing here depends on timing.
    #[test]
    fn a_wait_of_less_than_a_millisecond_sleeps() {
        assert_eq!(
            whole_ms(Duration::from_nanos(999_999)),
            Duration::from_millis(1)
        );
        assert_eq!(whole_ms(Duration::from_millis(2)), Duration::from_millis(2));
        assert_eq!(whole_ms(Duration::ZERO), Duration::ZERO);
        let mut engine = ProgressEngine::new();
        for wait in [Duration::from_micros(300), Duration::from_micros(1_500)] {
            let start = Instant::now();
            engine.wait(wait).unwrap();
            assert!(start.elapsed() >= wait, "{wait:?}: {:?}", start.elapsed());
        }
        let stats = engine.wait_stats();
        assert_eq!((stats.calls, stats.ready), (2, 0));
        assert_eq!(stats.sleeps, 2);
        assert_eq!(stats.timed_out, 2);
    }
}
