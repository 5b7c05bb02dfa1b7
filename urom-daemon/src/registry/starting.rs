//! Workers being started or stopped: one thread awaits them all, so that a worker that never
//! publishes its socket (a plugin that hangs at start, a worker its user stopped), or one slow
//! to end, holds none of the daemon's pool threads and delays no other host.
//!
//! The thread sleeps on one inotify instance, with a watch on each starting worker's directory
//! (a worker publishes its socket by linking it in), and on an eventfd rung when a worker is
//! handed to it. The instance lives as long as the thread: closing one waits for the kernel's
//! grace period, 10-20 ms. A worker that ends is noticed within [`DEATH_CHECK`]; one that has
//! not published its socket within [`START_TIMEOUT`] is stopped (SIGTERM, then SIGKILL after
//! [`STOP_GRACE`]) without any thread waiting for it, and its host is answered once it is gone.
//! A worker being destroyed is handed over once sent SIGTERM, and gets SIGKILL the same way;
//! its end is learnt from the reaper, which rings the thread.

use std::collections::HashSet;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Instant;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use nix::sys::signal::Signal;
use tracing::{error, warn};
use urom_wire::Status;

use super::{
    DEATH_CHECK, DestroyReply, POLL_WITHOUT_WATCH, Registry, START_TIMEOUT, STOP_GRACE,
    ServiceError, SpawnReply,
};

/// Where workers are handed to the thread that awaits them.
pub(super) struct Starter {
    /// Workers handed over, taken by the thread when `bell` rings.
    handed: Mutex<Vec<Starting>>,
    bell: EventFd,
    /// A worker ended since the thread last looked.
    ended: AtomicBool,
}

/// A worker whose host awaits its socket, or its end.
pub(super) struct Starting {
    id: u64,
    socket: PathBuf,
    reply: Awaiting,
    /// Its directory's watch; `None` until the thread has taken it, or when it cannot be
    /// watched (then it is looked at every [`POLL_WITHOUT_WATCH`]).
    watch: Option<WatchDescriptor>,
    /// Not looked at yet: its socket may have been published before the watch was added.
    fresh: bool,
    /// Found gone by the last check.
    ended: bool,
    phase: Phase,
    /// When its phase ends.
    due: Instant,
}

/// Who awaits the worker.
enum Awaiting {
    /// The host that spawned it, for its socket.
    Start(SpawnReply),
    /// The host that destroys it, if any, for its end.
    Stop(Option<DestroyReply>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Its socket is awaited.
    Awaiting,
    /// It was sent this signal (it did not start in time, or is destroyed).
    Stopping(Signal),
}

impl Starter {
    /// Starts the thread that awaits the starting workers of `registry`.
    pub(super) fn start(registry: Weak<Registry>) -> std::io::Result<Arc<Self>> {
        let bell = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)?;
        let starter = Arc::new(Self {
            handed: Mutex::default(),
            bell,
            ended: AtomicBool::new(false),
        });
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .inspect_err(|e| {
                warn!("cannot watch workers' directories ({e}): starting workers are polled");
            })
            .ok();
        let own = Arc::clone(&starter);
        std::thread::Builder::new()
            .name("urom-awaiting".into())
            .spawn(move || await_all(&own, inotify.as_ref(), &registry))?;
        Ok(starter)
    }

    /// Hands over worker `id`, whose socket will be `socket`, to answer `reply` once it listens,
    /// ended or did not start in time.
    pub(super) fn hand(&self, id: u64, socket: PathBuf, reply: SpawnReply) {
        self.push(Starting {
            id,
            socket,
            reply: Awaiting::Start(reply),
            watch: None,
            fresh: true,
            ended: false,
            phase: Phase::Awaiting,
            due: Instant::now() + START_TIMEOUT,
        });
    }

    /// Hands over worker `id`, just sent SIGTERM, to be killed if it has not ended within
    /// [`STOP_GRACE`], and to answer `reply` once it has ended.
    pub(super) fn stopping(&self, id: u64, reply: Option<DestroyReply>) {
        self.push(Starting {
            id,
            socket: PathBuf::new(),
            reply: Awaiting::Stop(reply),
            watch: None,
            fresh: false,
            ended: false,
            phase: Phase::Stopping(Signal::SIGTERM),
            due: Instant::now() + STOP_GRACE,
        });
    }

    /// A worker ended: the thread looks at once whether it was one it awaits.
    pub(super) fn worker_ended(&self) {
        self.ended.store(true, Ordering::Release);
        self.ring();
    }

    fn push(&self, entry: Starting) {
        self.handed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(entry);
        self.ring();
    }

    fn ring(&self) {
        if let Err(e) = self.bell.write(1) {
            error!("cannot wake the thread that awaits workers: {e}");
        }
    }
}

/// Awaits every starting worker of `registry` until the registry is gone.
fn await_all(starter: &Starter, inotify: Option<&Inotify>, registry: &Weak<Registry>) {
    let mut starting: Vec<Starting> = Vec::new();
    let mut touched = HashSet::new();
    let mut next_check = Instant::now();
    loop {
        let now = Instant::now();
        let unwatched = starting
            .iter()
            .any(|s| s.phase == Phase::Awaiting && s.watch.is_none());
        let wake_at = starting
            .iter()
            .map(|s| s.due)
            .chain((!starting.is_empty()).then_some(next_check))
            .chain(unwatched.then_some(now + POLL_WITHOUT_WATCH))
            .min();
        sleep(starter, inotify, wake_at, &mut touched);
        let Some(registry) = registry.upgrade() else {
            return;
        };
        let handed = std::mem::take(
            &mut *starter
                .handed
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        // A worker handed over to stop may have ended before it was: looked at at once.
        let stop_handed = handed
            .iter()
            .any(|new| matches!(new.reply, Awaiting::Stop(_)));
        for mut new in handed {
            new.watch = inotify.and_then(|inotify| watch(inotify, &new.socket));
            starting.push(new);
        }
        let now = Instant::now();
        // A worker's end rings the bell: whoever awaits it is answered at once.
        let check =
            starter.ended.swap(false, Ordering::Acquire) || stop_handed || now >= next_check;
        if check {
            next_check = now + DEATH_CHECK;
            // One look under the lock for all: spawns hold it while they fork.
            let inner = registry.lock();
            for entry in &mut starting {
                entry.ended = !inner.workers.contains_key(&entry.id);
            }
        }
        let mut i = 0;
        while i < starting.len() {
            let entry = &mut starting[i];
            // Every entry is also looked at with each check: an event the queue dropped
            // costs a moment, not the worker.
            let look = entry.fresh || check || entry.watch.is_none_or(|w| touched.contains(&w));
            entry.fresh = false;
            match entry.step(&registry, look, check && entry.ended, now) {
                None => i += 1,
                Some(result) => {
                    let done = starting.swap_remove(i);
                    // A directory shared with another host's wait (an attach) stays watched.
                    if let (Some(inotify), Some(wd)) = (inotify, done.watch)
                        && !starting.iter().any(|s| s.watch == Some(wd))
                    {
                        // Fails only when the directory is gone, which took the watch with it.
                        let _ = inotify.rm_watch(wd);
                    }
                    match done.reply {
                        Awaiting::Start(reply) => reply.send(result),
                        // Destroyed: gone, or left to the reaper after SIGKILL.
                        Awaiting::Stop(reply) => {
                            if let Some(reply) = reply {
                                reply.send(Ok(()));
                            }
                        }
                    }
                }
            }
        }
        touched.clear();
    }
}

/// Sleeps until a worker is handed over, an entry appears in a watched directory, or
/// `wake_at`; notes the watches that saw an entry appear in `touched`.
fn sleep(
    starter: &Starter,
    inotify: Option<&Inotify>,
    wake_at: Option<Instant>,
    touched: &mut HashSet<WatchDescriptor>,
) {
    // Rounded up: a wait that ends early only loops.
    let timeout = wake_at.map_or(PollTimeout::NONE, |at| {
        let left = at.saturating_duration_since(Instant::now());
        PollTimeout::try_from(left.as_micros().div_ceil(1000)).unwrap_or(PollTimeout::MAX)
    });
    let bell = PollFd::new(starter.bell.as_fd(), PollFlags::POLLIN);
    let (mut both, mut one);
    let fds: &mut [PollFd] = match inotify {
        Some(inotify) => {
            both = [bell, PollFd::new(inotify.as_fd(), PollFlags::POLLIN)];
            &mut both
        }
        None => {
            one = [bell];
            &mut one
        }
    };
    match poll(fds, timeout) {
        Ok(_) | Err(nix::errno::Errno::EINTR) => {}
        Err(e) => {
            error!("cannot wait for starting or stopping workers: {e}");
            std::thread::sleep(POLL_WITHOUT_WATCH);
        }
    }
    // Either may have something though poll said nothing (it was interrupted): both are
    // non-blocking.
    let _ = starter.bell.read();
    if let Some(inotify) = inotify {
        while let Ok(events) = inotify.read_events() {
            if events.is_empty() {
                break;
            }
            touched.extend(events.iter().map(|event| event.wd));
        }
    }
}

/// A watch for entries appearing in the directory of `socket`.
fn watch(inotify: &Inotify, socket: &Path) -> Option<WatchDescriptor> {
    let dir = socket.parent()?;
    inotify
        .add_watch(dir, AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO)
        .ok()
}

impl Starting {
    /// Moves the wait on at `now`: `look` whether the socket is there; the worker was found
    /// `ended`. The host's answer once there is one.
    fn step(
        &mut self,
        registry: &Registry,
        look: bool,
        ended: bool,
        now: Instant,
    ) -> Option<Result<super::Reachable, ServiceError>> {
        let id = self.id;
        match self.phase {
            Phase::Awaiting => {
                if ended {
                    return Some(Err(ServiceError::new(
                        Status::Initialization,
                        format!(
                            "worker {id} ended while starting; see its log in {}",
                            registry.config.log_dir.display()
                        ),
                    )));
                }
                if look && self.socket.exists() {
                    return Some(registry.listening(id, &self.socket));
                }
                if now >= self.due {
                    return self.stop(registry, Signal::SIGTERM, now);
                }
                None
            }
            Phase::Stopping(sent) => {
                if ended {
                    return Some(Err(not_started(id)));
                }
                if now < self.due {
                    return None;
                }
                if sent == Signal::SIGTERM {
                    warn!(
                        worker = id,
                        "did not stop within {STOP_GRACE:?}; killing it"
                    );
                    return self.stop(registry, Signal::SIGKILL, now);
                }
                error!(worker = id, "still running after SIGKILL");
                Some(Err(not_started(id)))
            }
        }
    }

    /// Sends the worker `signal`, to be answered once it has gone or after [`STOP_GRACE`]; it
    /// is answered at once when it has gone already.
    fn stop(
        &mut self,
        registry: &Registry,
        signal: Signal,
        now: Instant,
    ) -> Option<Result<super::Reachable, ServiceError>> {
        if !registry.signal_worker(self.id, signal) {
            return Some(Err(not_started(self.id)));
        }
        self.phase = Phase::Stopping(signal);
        self.due = now + STOP_GRACE;
        None
    }
}

fn not_started(id: u64) -> ServiceError {
    ServiceError::new(
        Status::TimeOut,
        format!("worker {id} did not start within {START_TIMEOUT:?}"),
    )
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::sync::mpsc;
    use std::time::Duration;

    use urom_plugin::plugin_id::{PluginId, PluginMask};
    use urom_wire::{CpuSet, MaxMsgSize};

    use super::*;
    use crate::discovery::PluginEntry;
    use crate::registry::{Owner, SpawnRequest, WorkerConfig};

    #[test]
    fn a_worker_that_does_not_start_in_time_is_stopped_then_killed_and_its_host_told() {
        let dir = std::env::temp_dir().join(format!("urom-starting-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // A worker that stops itself before it could listen: SIGTERM waits for a SIGCONT.
        let worker_bin = dir.join("stopping-worker");
        std::fs::write(&worker_bin, "#!/bin/sh\nkill -STOP $$\nexec sleep 600\n").unwrap();
        std::fs::set_permissions(&worker_bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let registry = Arc::new(Registry::new(WorkerConfig {
            worker_bin,
            max_msg_size: MaxMsgSize::DEFAULT,
            log_dir: dir.clone(),
            log_level: 50,
            socket_dir: dir.clone(),
            cpuset: "0".parse::<CpuSet>().unwrap(),
            max_workers: 4,
            busy_poll: false,
            ucx_listen: None,
            hugepages: urom_transport::shm::HugePages::Never,
        }));
        let offered = [PluginEntry {
            id: PluginId::from_index(0).unwrap(),
            version: 1,
            name: "p".into(),
            path: dir.join("p.so"),
        }];
        let request = SpawnRequest {
            worker_id: 7,
            plugins: PluginMask::from_bits_retain(1),
            gid: 0,
            cpuset: CpuSet::default(),
            env: Vec::new(),
        };
        let owner = Owner::local(nix::unistd::geteuid().as_raw());
        let (id, socket, starting) = registry
            .spawn_or_attach_now(1, &owner, &request, &offered)
            .unwrap();
        assert_eq!((id, starting), (7, true));
        let pid = registry.lock().workers[&id].pid;
        let stat = || std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !stat().contains(") T ") {
            assert!(
                Instant::now() < deadline,
                "the worker never stopped: {}",
                stat()
            );
            std::thread::sleep(Duration::from_millis(5));
        }

        let (tx, rx) = mpsc::channel();
        let reply = SpawnReply::new(move |result| tx.send(result).unwrap());
        let mut entry = Starting {
            id,
            socket,
            reply: Awaiting::Start(reply),
            watch: None,
            fresh: false,
            ended: false,
            phase: Phase::Awaiting,
            due: Instant::now() + START_TIMEOUT,
        };
        let start = entry.due;
        assert!(entry.step(&registry, true, false, start).is_none());
        assert_eq!(entry.phase, Phase::Stopping(Signal::SIGTERM));
        // Stopped, it cannot act on SIGTERM: still there within the grace period.
        assert!(entry.step(&registry, true, false, start).is_none());
        assert!(registry.lock().workers.contains_key(&id));
        let grace_over = entry.due;
        assert!(entry.step(&registry, true, false, grace_over).is_none());
        assert_eq!(entry.phase, Phase::Stopping(Signal::SIGKILL));
        // Killed; its host is answered once it is gone.
        while registry.lock().workers.contains_key(&id) {
            assert!(
                Instant::now() < deadline,
                "the killed worker was never reaped"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let result = entry.step(&registry, false, true, grace_over).unwrap();
        let Awaiting::Start(reply) = entry.reply else {
            unreachable!("a starting worker's entry")
        };
        reply.send(result);
        let error = rx.recv().unwrap().unwrap_err();
        assert_eq!(error.status, Status::TimeOut, "{}", error.reason);
        assert!(
            error.reason.contains("did not start within"),
            "{}",
            error.reason
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_reply_dropped_unanswered_answers_with_an_error() {
        let (tx, rx) = mpsc::channel();
        drop(SpawnReply::new(move |result| tx.send(result).unwrap()));
        let error = rx.recv().unwrap().unwrap_err();
        assert_eq!(error.status, Status::OperatingSystem, "{}", error.reason);
    }
}
