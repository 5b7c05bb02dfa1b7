//! The worker's loop: host channels in, plugins, notifications out.
//!
//! Nothing here allocates, locks or makes a system call per command once a host is connected:
//! a received frame is parsed where it lies in the host's channel, handed to its plugin, and
//! each notification is written into a preallocated outbox and sent on the sending half of its
//! host's channel. Each host's channel is taken apart into its two halves, kept in two tables,
//! so that a command is read from one while notifications go out on the other. New hosts are
//! accepted and handshaken on a side thread and handed over through a queue.
//!
//! The loop counts what it does in plain fields it owns ([`Counters`]) and publishes the totals
//! now and then into a block other threads read ([`Published`]).

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::eventfd::{EfdFlags, EventFd};
use tracing::{debug, info, warn};
use urom_plugin::Arm;
use urom_plugin::abi::{LoadedPlugin, NotificationSink};
use urom_transport::shm::{FIRST_NAP, HugePages};
use urom_transport::sys::WakeSet;
use urom_transport::{
    Armed, Channel, ChannelConfig, ChannelReceiver, ChannelSender, FrameReceiver, FrameSendError,
    FrameSender, Transport, WaitMode,
};
use urom_wire::data::{
    DataMessage, NOTIFY_PAYLOAD_OFFSET, Notification, fast_command, peek_command_identity,
    write_notify_headers,
};
use urom_wire::{FrameRepr, MaxMsgSize, Status};

use crate::accept::{Arrive, accept_hosts};
use crate::backlog::{BACKLOG_LIMIT, Backlog};
use crate::counters::{Counters, Published};
use crate::domain::{DomainReplies, Domains};
use urom_plugin::plugin_id::{MAX_PLUGINS, PluginId};
use urom_wire::DecodeError;
use urom_wire::domain::DomainMessage;

/// Frames taken from one host per turn, so that one busy host cannot starve the others.
const FRAMES_PER_TURN: usize = 64;
/// How long an idle worker spins before it starts yielding its core between turns, while its
/// yields may hand the core over.
const PURE_SPIN: Duration = Duration::from_nanos(500);
/// A worker whose yields keep returning at once is alone on its core, where a yield costs a
/// system call and hands nothing over: every so many such yields in a row double how long it
/// spins before yielding, up to [`PURE_SPIN`] times `1 << MAX_SPIN_DOUBLINGS` (32 us), so that
/// the gaps of a ping-pong are spun through. A yield that hands the core over starts again
/// from [`PURE_SPIN`].
const QUICK_YIELDS_PER_DOUBLING: u32 = 8;
const MAX_SPIN_DOUBLINGS: u32 = 6;
/// A yield that lasts this long gave the core to another process for a while.
const HANDED_OVER: Duration = Duration::from_nanos(1500);
/// How many such yields an idle worker makes before it sleeps: it shares its core, and its
/// polling would only delay whoever runs there.
const HANDOVERS_BEFORE_SLEEP: u32 = 3;
/// How many idle turns a spinning worker makes between two reads of the clock.
const TURNS_PER_CLOCK_READ: u32 = 8;
/// How many idle turns a worker spins, then yields, before it sleeps (unless it busy-polls);
/// counted, so that a busy worker reads no clock.
const SPIN_TURNS_BEFORE_NAP: u32 = 4096;

/// Where an idle spell stands.
#[derive(Clone, Copy)]
struct Idle {
    /// Its first idle turn.
    since: Instant,
    /// Yields in it that handed the core over.
    handovers: u32,
    /// Whether it still spins (reading the clock only every [`TURNS_PER_CLOCK_READ`] turns).
    spinning: bool,
}
/// How long one sleep lasts at most while some host channel cannot wake the worker (or a
/// host's notifications wait for room in its ring), and the first sleep of an idle spell while
/// a plugin cannot wake it.
const NAP: Duration = Duration::from_millis(1);
/// While a plugin cannot wake the worker, each sleep of an idle spell that nothing ended
/// early doubles the next, up to this: an idle worker whose plugin cannot be woken still wakes
/// about once a second, and a plugin's own event (one its progress finds) is seen within about
/// the time since the spell began.
const UNARMED_NAP_MOST: Duration = Duration::from_secs(1);
/// How long one sleep lasts at most otherwise when a stop request or the parent's end could
/// not wake the worker ([`Worker::stop_on`]; no process descriptor of the parent), so that
/// they are seen in good time.
const LONG_SLEEP: Duration = Duration::from_millis(20);
/// How long one sleep lasts at most when everything that may end it can wake the worker: a
/// safety net only.
const DEEP_SLEEP: Duration = Duration::from_secs(10);
/// How many busy turns pass between two checks that the parent still runs.
const PARENT_CHECK_TURNS: u32 = 1 << 16;

/// The receiving half of a connected host's channel.
struct Inbound {
    rx: ChannelReceiver,
    /// Distinguishes this host from earlier ones in the same slot.
    generation: u32,
}

/// The sending half of a connected host's channel, and what its ring had no room for yet.
struct Outbound {
    tx: ChannelSender,
    generation: u32,
    /// Sent before any newer notification; while it holds anything, the host's commands wait.
    backlog: Backlog,
    /// The host left more than [`BACKLOG_LIMIT`] bytes undrained: its channel is to be failed.
    overflowed: bool,
}

/// Where new hosts come from: the acceptor thread, and how to stop it.
struct Arrivals {
    hosts: mpsc::Receiver<Channel>,
    /// Given to each acceptor.
    arrive: Arrive,
    /// Tells the acceptors to stop.
    stop: Arc<AtomicBool>,
    /// Written after `stop` is set, to wake an acceptor that sleeps.
    halt: Arc<EventFd>,
}

/// A worker: its plugins and host channels.
pub struct Worker {
    /// Indexed by the bit of the plugin id.
    plugins: Vec<Option<LoadedPlugin>>,
    /// Where in `plugins` the loaded ones are: a turn visits only those, not the whole table.
    loaded: Box<[usize]>,
    /// The receiving halves of the hosts' channels, by slot.
    inbound: Vec<Option<Inbound>>,
    /// The sending halves, by the same slots.
    outbound: Vec<Option<Outbound>>,
    next_generation: u32,
    arrivals: Option<Arrivals>,
    /// Where notifications handed to the worker are framed.
    outbox: Box<[u8]>,
    /// Where a plugin writes the answer to the command it is handling (the native path), and
    /// where the worker frames it.
    answer: Box<[u8]>,
    max: MaxMsgSize,
    busy_poll: bool,
    /// Whether host channels' rings go on hugepages.
    hugepages: HugePages,
    /// The process whose end stops this worker.
    parent: Option<nix::unistd::Pid>,
    /// A descriptor of `parent` that becomes readable when it ends (`pidfd`), when the system
    /// has them.
    parent_fd: Option<OwnedFd>,
    /// A descriptor that becomes readable when the worker is asked to stop
    /// ([`Worker::stop_on`]).
    stop_fd: Option<OwnedFd>,
    /// How long the next sleep lasts at most while a plugin cannot wake the worker.
    unarmed_nap: Duration,
    counters: Counters,
    /// Where the counts are published for other threads, if anyone reads them.
    published: Option<Arc<Published>>,
    /// Domain tables on their way from hosts.
    domains: Domains,
    /// What the worker sleeps on when idle (reused).
    wake: WakeSet,
    /// The current idle spell.
    idle: Idle,
    /// Yields in a row, over idle spells, that returned at once (see
    /// [`QUICK_YIELDS_PER_DOUBLING`]).
    quick_yields: u32,
}

impl Worker {
    /// A worker serving `plugins` to the hosts admitted with [`Worker::admit`] or accepted after
    /// [`Worker::listen`]; it stops by itself when `parent` is given and that process ends.
    pub fn new(
        plugins: Vec<LoadedPlugin>,
        max: MaxMsgSize,
        busy_poll: bool,
        parent: Option<nix::unistd::Pid>,
    ) -> Self {
        let mut table: Vec<Option<LoadedPlugin>> = (0..MAX_PLUGINS).map(|_| None).collect();
        for plugin in plugins {
            let id = PluginId::new(plugin.id()).expect("plugin ids are checked when parsed");
            table[id.index()] = Some(plugin);
        }
        let loaded = (0..table.len()).filter(|&i| table[i].is_some()).collect();
        Self {
            plugins: table,
            loaded,
            inbound: Vec::new(),
            outbound: Vec::new(),
            next_generation: 1,
            arrivals: None,
            outbox: vec![0; max.get()].into_boxed_slice(),
            answer: vec![0; max.get()].into_boxed_slice(),
            max,
            busy_poll,
            hugepages: HugePages::Auto,
            parent_fd: parent.and_then(|pid| urom_transport::sys::pidfd_open(pid).ok()),
            parent,
            stop_fd: None,
            unarmed_nap: NAP,
            counters: Counters::default(),
            published: None,
            domains: Domains::default(),
            wake: WakeSet::new(),
            idle: Idle {
                since: Instant::now(),
                handovers: 0,
                spinning: true,
            },
            quick_yields: 0,
        }
    }

    /// Publishes the worker's counts into `block` from now on, every so many commands while
    /// busy and when it goes idle.
    pub fn publish_to(&mut self, block: Arc<Published>) {
        self.counters.publish(&block);
        self.published = Some(block);
    }

    /// Whether the rings of hosts accepted after [`Worker::listen`] go on hugepages (by default
    /// when the system has some free).
    pub fn set_hugepages(&mut self, choice: HugePages) {
        self.hugepages = choice;
    }

    /// Tells the worker that `fd` becomes readable whenever the stop flag given to
    /// [`Worker::run`] is set (a pipe a signal handler writes, say): it then sleeps on it
    /// instead of waking now and then to look at the flag.
    pub fn stop_on(&mut self, fd: OwnedFd) {
        self.stop_fd = Some(fd);
    }

    /// What the worker has counted so far.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Accepts hosts on `listener` from now on, on a side thread: hosts run by this process's
    /// user, root or one of `allow_uids`.
    pub fn listen(&mut self, listener: UnixListener, allow_uids: Vec<u32>) {
        let config = ChannelConfig {
            wait: self.wait_mode(),
            hugepages: self.hugepages,
            ..ChannelConfig::new(self.max)
        };
        let (arrive, stop, halt) = self.acceptor();
        thread::Builder::new()
            .name("urom-accept".into())
            .spawn(move || accept_hosts(listener, config, &allow_uids, arrive, &stop, &halt))
            .expect("spawning the acceptor thread");
    }

    /// Accepts hosts on another machine at the front door `listener` from now on, on a side
    /// thread (and one more that connects the hosts that got in): hosts that prove `key` (see
    /// `urom_transport::auth`) under the identity `identity` get a UCX channel with the
    /// settings of `config`.
    #[cfg(feature = "ucx")]
    pub fn listen_ucx(
        &mut self,
        listener: std::net::TcpListener,
        mut config: urom_transport::ChannelConfig,
        key: urom_transport::auth::SharedSecret,
        identity: String,
    ) {
        let (arrive, stop, halt) = self.acceptor();
        config.wait = self.wait_mode();
        thread::Builder::new()
            .name("urom-accept-ucx".into())
            .spawn(move || {
                crate::accept::accept_ucx_hosts(
                    listener, config, &key, &identity, arrive, &stop, &halt,
                )
            })
            .expect("spawning the UCX acceptor thread");
    }

    /// Where a new acceptor thread hands over the hosts it accepted, the flag that stops it and
    /// the eventfd written once the flag is set (never read: it wakes every acceptor).
    fn acceptor(&mut self) -> (Arrive, Arc<AtomicBool>, Arc<EventFd>) {
        let arrivals = self.arrivals.get_or_insert_with(|| {
            let (arrive, hosts) = mpsc::channel();
            let wake =
                EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
                    .expect("creating the eventfd that wakes the worker for new hosts");
            Arrivals {
                hosts,
                arrive: Arrive {
                    hosts: arrive,
                    wake: Arc::new(wake),
                    pending: Arc::new(AtomicBool::new(false)),
                },
                stop: Arc::new(AtomicBool::new(false)),
                halt: Arc::new(
                    EventFd::from_value_and_flags(
                        0,
                        EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK,
                    )
                    .expect("creating the eventfd that stops the acceptor"),
                ),
            }
        });
        (
            arrivals.arrive.clone(),
            Arc::clone(&arrivals.stop),
            Arc::clone(&arrivals.halt),
        )
    }

    fn wait_mode(&self) -> WaitMode {
        if self.busy_poll {
            WaitMode::BusyPoll
        } else {
            WaitMode::default()
        }
    }

    /// Serves a host on `channel` from the next turn on.
    pub fn admit(&mut self, mut channel: Channel) {
        channel.set_wait_mode(self.wait_mode());
        let generation = self.next_generation;
        self.next_generation = self.next_generation.wrapping_add(1).max(1);
        let (tx, rx) = channel.into_split();
        let slot = match self.inbound.iter().position(Option::is_none) {
            Some(free) => free,
            None => {
                self.inbound.push(None);
                self.outbound.push(None);
                self.inbound.len() - 1
            }
        };
        self.inbound[slot] = Some(Inbound { rx, generation });
        self.outbound[slot] = Some(Outbound {
            tx,
            generation,
            backlog: Backlog::new(BACKLOG_LIMIT),
            overflowed: false,
        });
        self.counters.hosts += 1;
        info!(slot, "host connected");
    }

    /// Serves hosts until `stop` is set or the parent (when watched) ends.
    pub fn run(&mut self, stop: &AtomicBool) {
        let mut idle_turns = 0u32;
        let mut turns = 0u32;
        while !stop.load(Ordering::Relaxed) {
            turns = turns.wrapping_add(1);
            let worked = self.turn();
            idle_turns = if worked {
                0
            } else {
                idle_turns.saturating_add(1)
            };
            if let Some(block) = &self.published
                && self.counters.due(idle_turns)
            {
                self.counters.publish(block);
            }
            let slept = idle_turns > 0 && self.rest(idle_turns);
            // Checked once per sleep, or now and then when busy: never per command.
            if (slept || turns % PARENT_CHECK_TURNS == 0) && self.parent_gone() {
                warn!("the process that started this worker has ended; stopping");
                return;
            }
        }
    }

    fn parent_gone(&self) -> bool {
        self.parent
            .is_some_and(|parent| nix::unistd::getppid() != parent)
    }

    /// One pass over new hosts, every host channel and every plugin; whether anything happened.
    pub fn turn(&mut self) -> bool {
        let mut worked = self.admit_arrivals();
        for slot in 0..self.inbound.len() {
            worked |= self.drain_backlog(slot);
            worked |= self.serve_host(slot);
        }
        let mut router = Router {
            hosts: &mut self.outbound,
            outbox: &mut self.outbox,
            max: self.max,
            counters: &mut self.counters,
        };
        for &index in &self.loaded {
            let Some(plugin) = self.plugins[index].as_mut() else {
                continue;
            };
            match plugin.progress(&mut router) {
                Ok(progressed) => worked |= progressed,
                Err(Status::Unexpected) => {
                    warn!(id = plugin.id(), "plugin progress failed (did it panic?)")
                }
                Err(status) => debug!(id = plugin.id(), %status, "plugin progress failed"),
            }
        }
        for slot in 0..self.outbound.len() {
            if self.outbound[slot]
                .as_ref()
                .is_some_and(|host| host.overflowed)
            {
                self.drop_host(
                    slot,
                    "it left more notifications undrained than the backlog holds",
                );
            }
        }
        worked
    }

    /// Ends a host's channel: its tasks in flight complete with an error on its side.
    fn drop_host(&mut self, slot: usize, why: &str) {
        info!(slot, "host left: {why}");
        if let Some(host) = self.inbound[slot].take() {
            self.counters.hosts -= 1;
            self.domains.forget(dest_id(slot, host.generation));
        }
        self.outbound[slot] = None;
    }

    /// Sends what a host's ring had no room for, now that it may have.
    fn drain_backlog(&mut self, slot: usize) -> bool {
        let Some(host) = self.outbound[slot].as_mut() else {
            return false;
        };
        if host.backlog.is_empty() {
            return false;
        }
        let held = host.backlog.held();
        match host.backlog.flush(&mut host.tx) {
            Ok(()) => host.backlog.held() != held,
            Err(e) => {
                self.drop_host(slot, &e.to_string());
                true
            }
        }
    }

    /// How many hosts are connected.
    pub fn host_count(&self) -> usize {
        self.inbound.iter().flatten().count()
    }

    /// Admits the hosts the acceptors handed over; costs one load of a flag when there are none.
    fn admit_arrivals(&mut self) -> bool {
        let Some(arrivals) = &self.arrivals else {
            return false;
        };
        let pending = &arrivals.arrive.pending;
        if !(pending.load(Ordering::Relaxed) && pending.swap(false, Ordering::Acquire)) {
            return false;
        }
        let mut admitted = false;
        while let Some(channel) = self
            .arrivals
            .as_ref()
            .and_then(|arrivals| arrivals.hosts.try_recv().ok())
        {
            self.admit(channel);
            admitted = true;
        }
        admitted
    }

    /// Takes up to [`FRAMES_PER_TURN`] frames off one host channel, in one pass over those
    /// that have arrived, and dispatches each where it lies in the channel. A host whose
    /// notifications wait in its backlog is not served until it has drained them: its commands
    /// wait in its ring, the other hosts go on.
    fn serve_host(&mut self, slot: usize) -> bool {
        let Self {
            inbound,
            outbound,
            plugins,
            domains,
            outbox,
            answer,
            max,
            counters,
            ..
        } = self;
        let Some(host) = inbound[slot].as_mut() else {
            return false;
        };
        let caught_up = |hosts: &[Option<Outbound>]| {
            hosts[slot]
                .as_ref()
                .is_none_or(|host| host.backlog.is_empty())
        };
        if !caught_up(outbound) {
            return false;
        }
        let dest_id = dest_id(slot, host.generation);
        let mut router = Router {
            hosts: outbound,
            outbox,
            max: *max,
            counters,
        };
        // The pass's answers to this host leave together where that saves messages (UCX).
        if let Some(host) = router.hosts[slot].as_mut() {
            host.tx.cork();
        }
        let mut taken = 0u32;
        let received = host.rx.recv_each(FRAMES_PER_TURN, |frame| {
            taken += 1;
            router.counters.command(frame.len());
            dispatch(plugins, domains, &mut router, answer, dest_id, frame);
            caught_up(router.hosts)
        });
        let uncorked = outbound[slot]
            .as_mut()
            .map_or(Ok(()), |host| host.tx.uncork());
        self.counters.ring_batch(taken);
        if let Err(e) = received {
            self.drop_host(slot, &e.to_string());
        } else if let Err(e) = uncorked {
            self.drop_host(slot, &e.to_string());
        }
        taken > 0
    }

    /// Waits a little when there is nothing to do: spins for [`PURE_SPIN`] (longer while its
    /// yields keep returning at once, see [`QUICK_YIELDS_PER_DOUBLING`]), then yields the core
    /// between turns, then sleeps ([`Worker::sleep`]) after [`SPIN_TURNS_BEFORE_NAP`] idle
    /// turns, or as soon as [`HANDOVERS_BEFORE_SLEEP`] yields handed the core to another
    /// process: a worker alone on its core keeps polling, one that shares it (with the next
    /// party of an exchange, say) gets out of its way. A busy-polling worker spins and yields
    /// the same way but never sleeps. Returns whether it slept.
    fn rest(&mut self, idle_turns: u32) -> bool {
        // While it spins, a worker reads the clock only every few idle turns: a read costs as
        // much as a turn, and the next command waits for the turn it arrives in to end.
        if idle_turns > 1 && self.idle.spinning && idle_turns % TURNS_PER_CLOCK_READ != 0 {
            std::hint::spin_loop();
            return false;
        }
        // Only idle turns read the clock.
        let now = Instant::now();
        if idle_turns == 1 {
            self.idle = Idle {
                since: now,
                handovers: 0,
                spinning: true,
            };
            self.unarmed_nap = NAP;
        }
        // A busy-polling worker never sleeps (a wake-up costs more than its latency budget),
        // but still yields a core it shares: spinning there would hold the other party off
        // for a whole time slice.
        let may_sleep = !self.busy_poll;
        if may_sleep
            && (idle_turns >= SPIN_TURNS_BEFORE_NAP
                || self.idle.handovers >= HANDOVERS_BEFORE_SLEEP)
        {
            self.sleep();
            return true;
        }
        let doublings = (self.quick_yields / QUICK_YIELDS_PER_DOUBLING).min(MAX_SPIN_DOUBLINGS);
        if now.duration_since(self.idle.since) < PURE_SPIN * (1 << doublings) {
            std::hint::spin_loop();
        } else {
            self.idle.spinning = false;
            thread::yield_now();
            if now.elapsed() >= HANDED_OVER {
                self.idle.handovers += 1;
                self.quick_yields = 0;
            } else {
                self.quick_yields = self.quick_yields.saturating_add(1);
            }
        }
        false
    }

    /// Sleeps until a host channel, a plugin or a new host wakes the worker: every host
    /// channel and plugin is armed and their wake-up descriptors polled together, so that a
    /// frame from a host or a plugin's message (a UCX message, for a plugin that gives its UCP
    /// worker's descriptor) ends the sleep at once. It lasts at most [`NAP`] while some
    /// channel or plugin cannot wake the worker, or a host's notifications wait in its
    /// backlog; [`FIRST_NAP`] after a channel was armed afresh; [`LONG_SLEEP`] otherwise. It
    /// does not sleep at all when arming finds work waiting.
    fn sleep(&mut self) {
        // Counts that changed in the short spell before this sleep are not left unpublished.
        if let Some(block) = &self.published
            && self.counters.changed()
        {
            self.counters.publish(block);
        }
        self.wake.clear();
        let mut ready = false;
        // Deep when a stop request and the parent's end can both wake the worker.
        let deep = self.stop_fd.is_some() && (self.parent.is_none() || self.parent_fd.is_some());
        let mut timeout = if deep { DEEP_SLEEP } else { LONG_SLEEP };
        if let Some(arrivals) = &self.arrivals {
            self.wake.watch(arrivals.arrive.wake.as_fd());
        }
        for fd in [&self.stop_fd, &self.parent_fd].into_iter().flatten() {
            self.wake.watch(fd.as_fd());
        }
        let mut unarmed = false;
        for host in self.inbound.iter_mut().flatten() {
            match host.rx.arm() {
                Ok(Armed::Armed { fresh }) => {
                    if fresh {
                        timeout = timeout.min(FIRST_NAP);
                    }
                    for fd in host.rx.wake_fds().into_iter().flatten() {
                        self.wake.watch(fd);
                    }
                }
                Ok(Armed::Unsupported) => timeout = timeout.min(NAP),
                // A frame waits, or the host is gone (the next `recv` drops it).
                Ok(Armed::Ready) | Err(_) => ready = true,
            }
        }
        if self
            .outbound
            .iter()
            .flatten()
            .any(|host| !host.backlog.is_empty())
        {
            timeout = timeout.min(NAP);
        }
        if !ready {
            for plugin in self.plugins.iter_mut().flatten() {
                match plugin.arm(&mut self.wake) {
                    Arm::Armed => {}
                    Arm::Busy => {
                        ready = true;
                        break;
                    }
                    Arm::Unsupported => unarmed = true,
                }
            }
        }
        if unarmed && self.unarmed_nap < timeout {
            timeout = self.unarmed_nap;
            // Nothing that ends the sleep early comes back here: the idle spell's next turn
            // resets it.
            self.unarmed_nap = (self.unarmed_nap * 2).min(UNARMED_NAP_MOST);
        }
        let woke = !ready && self.wake.sleep(timeout);
        for host in self.inbound.iter_mut().flatten() {
            host.rx.disarm();
        }
        if woke && let Some(arrivals) = &self.arrivals {
            // Consumes the wake-up of new hosts, if it was theirs (non-blocking).
            let _ = arrivals.arrive.wake.read();
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Some(arrivals) = &self.arrivals {
            arrivals.stop.store(true, Ordering::Relaxed);
            let _ = arrivals.halt.write(1);
        }
        // Plugins are closed (dropped) before the host channels go away.
        self.plugins.clear();
    }
}

/// Hands one received frame to its plugin; anything that is not answered by a plugin is
/// answered here with an error. A plugin may write its answer into `answer`, after the room
/// for the headers.
fn dispatch(
    plugins: &mut [Option<LoadedPlugin>],
    domains: &mut Domains,
    router: &mut Router<'_>,
    answer: &mut [u8],
    dest_id: u64,
    frame: &[u8],
) {
    // A well-formed command, the one kind the hot path sees, is read in a few compares; any
    // other frame the full parse reads (and says what is wrong with it).
    let parsed = match fast_command(frame, router.max) {
        Some(command) => Ok(DataMessage::Command(command)),
        None => FrameRepr::<DataMessage>::parse(frame, router.max).map(|frame| frame.body),
    };
    let (plugin_id, urom_context, status) = match parsed {
        Ok(DataMessage::Command(command)) => {
            let plugin = PluginId::new(command.plugin)
                .ok()
                .and_then(|id| plugins.get_mut(id.index()))
                .and_then(Option::as_mut);
            let status = match plugin {
                Some(plugin) => {
                    let payload = &mut answer[NOTIFY_PAYLOAD_OFFSET..];
                    let handled = plugin.command_into(dest_id, &command, payload, router);
                    if let Some((status, len)) = handled.reply {
                        let head = NotifyHead {
                            plugin: command.plugin,
                            urom_context: command.urom_context,
                            status,
                        };
                        // A host that is gone cannot be answered; the router logs it.
                        let _ = router.send(dest_id, head, answer, len);
                    }
                    handled.status
                }
                None => {
                    warn!(
                        plugin = command.plugin,
                        "command for a plugin this worker does not run"
                    );
                    Status::NotFound
                }
            };
            (command.plugin, command.urom_context, status)
        }
        Ok(DataMessage::Notify(notify)) => {
            warn!("a host sent a notification; only commands are accepted");
            (notify.plugin, notify.urom_context, Status::InvalidValue)
        }
        Err(DecodeError::UnexpectedKind(kind)) if DomainMessage::is_domain_kind(kind) => {
            let max = router.max;
            match domains.handle(plugins, router, max, dest_id, frame) {
                Ok(()) => return,
                Err(status) => {
                    let (plugin, urom_context) = peek_command_identity(frame);
                    (plugin, urom_context, status)
                }
            }
        }
        Err(error) => {
            warn!("malformed frame from a host: {error}");
            let (plugin, urom_context) = peek_command_identity(frame);
            (plugin, urom_context, Status::InvalidValue)
        }
    };
    if status != Status::Success {
        let answer = Notification {
            plugin: plugin_id,
            urom_context,
            status,
            payload: &[],
        };
        // A host that is gone cannot be answered; the router logs it.
        let _ = router.notify(dest_id, answer);
    }
}

fn dest_id(slot: usize, generation: u32) -> u64 {
    (u64::from(generation) << 32) | slot as u64
}

/// Sends notifications to the host connection their `dest_id` names.
struct Router<'a> {
    hosts: &'a mut [Option<Outbound>],
    outbox: &'a mut Box<[u8]>,
    max: MaxMsgSize,
    counters: &'a mut Counters,
}

/// The headers of a notification.
#[derive(Clone, Copy)]
struct NotifyHead {
    plugin: u64,
    urom_context: u64,
    status: Status,
}

impl Router<'_> {
    /// Sends the notification whose `payload_len` payload bytes lie in `frame` at
    /// [`NOTIFY_PAYLOAD_OFFSET`], writing the headers in front of them.
    fn send(
        &mut self,
        dest_id: u64,
        head: NotifyHead,
        frame: &mut [u8],
        payload_len: usize,
    ) -> Result<(), Status> {
        let slot = (dest_id & u64::from(u32::MAX)) as usize;
        let generation = (dest_id >> 32) as u32;
        let host = match self.hosts.get_mut(slot) {
            Some(Some(host)) if host.generation == generation => host,
            _ => {
                debug!(dest_id, "notification for a host that has left");
                return Err(Status::NotConnected);
            }
        };
        // The channel's number for the frame makes it its own ready mark (one cache line
        // less over shared memory); a notification that waits in the backlog goes out under
        // another number, which costs only that.
        let seq = host.tx.next_seq();
        let Ok(len) = write_notify_headers(
            frame,
            seq,
            head.plugin,
            head.urom_context,
            head.status,
            payload_len,
            self.max,
        ) else {
            warn!(len = payload_len, "a notification does not fit its frame");
            return Err(Status::TooBig);
        };
        let sent = host.send(&frame[..len]);
        if sent.is_ok() {
            self.counters.notification(head.status, len);
            self.counters.backlog(host.backlog.held());
        }
        sent
    }
}

impl NotificationSink for Router<'_> {
    fn notify(&mut self, dest_id: u64, n: Notification<'_>) -> Result<(), Status> {
        let head = NotifyHead {
            plugin: n.plugin,
            urom_context: n.urom_context,
            status: n.status,
        };
        let mut outbox = core::mem::take(self.outbox);
        let (head, payload_len) =
            match outbox.get_mut(NOTIFY_PAYLOAD_OFFSET..NOTIFY_PAYLOAD_OFFSET + n.payload.len()) {
                Some(room) => {
                    urom_wire::copy_short(room, n.payload);
                    (head, n.payload.len())
                }
                None => {
                    warn!(
                        plugin = n.plugin,
                        len = n.payload.len(),
                        "notification too big for the channel"
                    );
                    let status = Status::TooBig;
                    (NotifyHead { status, ..head }, 0)
                }
            };
        let sent = self.send(dest_id, head, &mut outbox, payload_len);
        *self.outbox = outbox;
        sent
    }
}

impl DomainReplies for Router<'_> {
    fn reply(&mut self, dest_id: u64, body: DomainMessage<'_>) -> Result<(), Status> {
        let slot = (dest_id & u64::from(u32::MAX)) as usize;
        let generation = (dest_id >> 32) as u32;
        let host = match self.hosts.get_mut(slot) {
            Some(Some(host)) if host.generation == generation => host,
            _ => {
                debug!(dest_id, "domain reply for a host that has left");
                return Err(Status::NotConnected);
            }
        };
        let frame = FrameRepr {
            seq: host.tx.next_seq(),
            body,
        };
        let len = frame.emit(self.outbox, self.max).map_err(|e| {
            warn!("cannot write a domain reply: {e}");
            Status::TooBig
        })?;
        host.send(&self.outbox[..len])
    }
}

impl Outbound {
    /// Sends a notification, or keeps it in the backlog (after those already there) while the
    /// host's ring is full: a host that does not drain never holds up the others. Never drops
    /// one: a host that leaves more than the backlog holds has its channel failed instead.
    fn send(&mut self, frame: &[u8]) -> Result<(), Status> {
        if self.overflowed {
            return Err(Status::NotConnected);
        }
        if self.backlog.is_empty() {
            match self.tx.send(frame) {
                Ok(()) => return Ok(()),
                Err(FrameSendError::Full) => {}
                Err(error) => {
                    debug!("cannot send a notification: {error}");
                    return Err(Status::NotConnected);
                }
            }
        }
        if self.backlog.push(frame).is_err() {
            warn!(
                held = self.backlog.held(),
                "a host has left {BACKLOG_LIMIT} bytes of notifications undrained; failing its channel"
            );
            self.overflowed = true;
            return Err(Status::NotConnected);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_polling_worker_yields_its_core_but_never_sleeps() {
        let mut worker = Worker::new(Vec::new(), MaxMsgSize::DEFAULT, true, None);
        let start = Instant::now();
        let mut turns = 0;
        while turns < 2 * SPIN_TURNS_BEFORE_NAP || start.elapsed() < Duration::from_millis(5) {
            turns += 1;
            assert!(!worker.rest(turns), "it slept after {turns} idle turns");
        }
        assert!(
            worker.quick_yields > 0 || worker.idle.handovers > 0,
            "it never yielded its core in {turns} idle turns"
        );
    }

    #[test]
    fn an_adaptive_worker_sleeps_once_idle_long_enough() {
        let mut worker = Worker::new(Vec::new(), MaxMsgSize::DEFAULT, false, None);
        assert!((1..=SPIN_TURNS_BEFORE_NAP).any(|turn| worker.rest(turn)));
    }
}
