//! The collective offload plugin (`worker_coll`): one worker serves every rank of a node, each
//! rank over its own host connection, and runs MPI-style collectives over the buffers the ranks
//! registered, so that the ranks compute meanwhile.
//!
//! Layers, top down:
//!
//! * this file: the [`Plugin`] — decodes each command ([`urom_coll_wire`]), finds the team and
//!   the rank the connection is, answers set-up commands at once and starts from
//!   [`Plugin::progress`];
//! * [`engine`]: teams, buffers, persistent collectives, and their chunked execution;
//! * [`internode`]: for teams spanning nodes, the exchange with the other nodes' workers, and
//!   how a dead or silent one is noticed;
//! * [`reduce`]: the reduction kernels, and the fixed reduction order;
//! * `net` (feature `ucx`): the node workers' network, UCX tagged messages;
//! * `sys`: shared memory, cross-memory attach and process descriptors, the only unsafe code.
//!
//! Built as `libworker_coll.so`; installed in a plugin directory as `worker_coll.so`. Without
//! the `ucx` feature the plugin has no network and refuses teams spanning nodes with
//! [`Reason::InterNode`]; with it, it opens a UCP worker whose address the domain hands to the
//! other nodes' workers, and connects to them only for teams that span nodes.
#![deny(unsafe_code)]

pub mod engine;
pub mod internode;
#[cfg(feature = "ucx")]
mod net;
pub mod reduce;
mod sys;

use std::os::fd::AsFd;

use urom_coll_wire::{BufferKind, CollCommand, Reason};
use urom_plugin::{Arm, Command, Notifier, Plugin, WakeFds};
use urom_wire::Status;

use engine::{Access, Answers, Fault, Liveness, Placement, Scratch, Team};
use internode::{
    ABORT_LEN, ABORT_TAG, CONTROL_SERIAL, KIND_MASK, Links, PING_LEN, PING_TAG, TOKEN_ABORT_IN,
    TOKEN_PING_IN, TOKEN_PONG_OUT, token,
};
use sys::{CrossMemoryError, SharedMap, SharedOpenError, cma_read};

/// The plugin's state in one worker.
pub struct Coll {
    teams: Vec<Team>,
    scratch: Scratch,
    liveness: Liveness,
    /// Where the round over teams starts next, so that no team waits behind another.
    next: usize,
    worker_pid: u32,
    /// A v-variant's words, decoded (allocated once).
    words: Vec<u64>,
    /// The network to other nodes' workers (feature `ucx`), once it opened.
    links: Option<Links>,
    /// Wakes the sleeping worker when an exchange must look at its peers again.
    timer: Option<nix::sys::timerfd::TimerFd>,
    /// The serial of the last team made.
    serial: u32,
    /// Pings received in a progress call, answered after it: (domain id, pong tag).
    pings: Vec<(u64, u64)>,
    /// Aborts received in a progress call, handled after it: (team key, fault), or
    /// `(u64::MAX, _)` where the next abort needs its receive posted again.
    aborts: Vec<(u64, Fault)>,
}

impl Coll {
    fn team_index(&self, key: u64) -> Option<usize> {
        self.teams.iter().position(|t| t.key() == key)
    }

    /// The team `key` and the rank connection `dest_id` is on it.
    fn member(&mut self, key: u64, dest_id: u64) -> Result<(&mut Team, usize), Fault> {
        let team = self
            .teams
            .iter_mut()
            .find(|t| t.key() == key)
            .ok_or(Fault::plain(Reason::UnknownTeam))?;
        let rank = team
            .rank_of(dest_id)
            .ok_or(Fault::plain(Reason::UnknownTeam))?;
        Ok((team, rank))
    }

    /// Handles a decoded command; `Ok(true)` when it is answered later (a start, a join).
    fn handle(
        &mut self,
        command: &Command<'_>,
        parsed: &CollCommand<'_>,
        answers: &mut Answers<'_, '_>,
    ) -> Result<bool, Fault> {
        let dest = command.dest_id;
        match *parsed {
            CollCommand::TeamCreate {
                team,
                rank,
                nodes,
                pid,
                pids,
                node_of,
                node_workers,
            } => {
                let placement = || {
                    (nodes > 1).then(|| Placement {
                        me: node_of[rank as usize].get() as usize,
                        node_of,
                        workers: node_workers,
                    })
                };
                if nodes > 1 && self.links.is_none() {
                    return Err(Fault::new(Reason::InterNode, rank));
                }
                let index = match self.team_index(team) {
                    Some(index) => index,
                    None => {
                        let pids: Vec<u32> = pids.iter().map(|p| p.get()).collect();
                        self.serial = self.serial.wrapping_add(1) % CONTROL_SERIAL;
                        self.teams
                            .push(Team::new(team, self.serial, &pids, placement()));
                        self.teams.len() - 1
                    }
                };
                self.teams[index].join(
                    answers,
                    rank,
                    pid,
                    pids.iter().map(|p| p.get()),
                    placement(),
                    dest,
                    command.plugin,
                    command.urom_context,
                )?;
                Ok(true)
            }
            CollCommand::TeamDestroy { team } => {
                let index = self
                    .team_index(team)
                    .ok_or(Fault::plain(Reason::UnknownTeam))?;
                let rank = self.teams[index]
                    .rank_of(dest)
                    .ok_or(Fault::plain(Reason::UnknownTeam))?;
                self.teams[index].leave(answers, rank);
                if self.teams[index].is_empty() {
                    self.teams.swap_remove(index);
                }
                Ok(false)
            }
            CollCommand::BufferRegister {
                team,
                buffer,
                kind,
                addr,
                len,
                name,
            } => {
                let (team, rank) = self.member(team, dest)?;
                let fault = |reason| Fault::new(reason, rank as u32);
                let access = match kind {
                    BufferKind::Shared => {
                        let len = usize::try_from(len).map_err(|_| fault(Reason::InvalidArgs))?;
                        let map = SharedMap::open(name, len).map_err(|e| match e {
                            SharedOpenError::NotPrivate => fault(Reason::CrossMemoryDenied),
                            SharedOpenError::BadName
                            | SharedOpenError::Io(_)
                            | SharedOpenError::TooSmall => fault(Reason::SharedMemory),
                        })?;
                        Access::Shared(map)
                    }
                    BufferKind::CrossMemory => {
                        addr.checked_add(len).ok_or(fault(Reason::InvalidArgs))?;
                        if len > 0 {
                            let mut probe = [0u8; 1];
                            cma_read(team.pid(rank), addr, &mut probe).map_err(|e| match e {
                                CrossMemoryError::Denied => fault(Reason::CrossMemoryDenied),
                                CrossMemoryError::Gone => fault(Reason::RankExited),
                                CrossMemoryError::Failed => fault(Reason::OutOfBounds),
                            })?;
                        }
                        Access::Cross { addr }
                    }
                    BufferKind::Unknown(_) => return Err(fault(Reason::InvalidArgs)),
                };
                team.register(rank, buffer, access, len)?;
                Ok(false)
            }
            CollCommand::BufferDeregister { team, buffer } => {
                let (team, rank) = self.member(team, dest)?;
                team.deregister(rank, buffer)?;
                Ok(false)
            }
            CollCommand::CollInit { team, args, words } => {
                self.words.clear();
                self.words.extend(words.iter().map(|w| w.get()));
                let words = core::mem::take(&mut self.words);
                let result = self
                    .member(team, dest)
                    .and_then(|(team, rank)| team.init(rank, args, &words));
                self.words = words;
                result.map(|()| false)
            }
            CollCommand::CollStart { team, coll } => {
                let (team, rank) = self.member(team, dest)?;
                team.start(rank, coll, command.urom_context)?;
                Ok(true)
            }
            CollCommand::CollDestroy { team, coll } => {
                let (team, rank) = self.member(team, dest)?;
                team.destroy_coll(rank, coll)?;
                Ok(false)
            }
        }
    }
}

impl Plugin for Coll {
    const VERSION: u64 = urom_coll_wire::VERSION;

    fn open() -> Result<Self, Status> {
        let mut links = open_links();
        if let Some(links) = links.as_mut() {
            post_ping_receive(links);
            post_abort_receive(links);
        }
        let timer = links.as_ref().and_then(|_| {
            use nix::sys::timerfd::{ClockId, TimerFd, TimerFlags};
            TimerFd::new(
                ClockId::CLOCK_MONOTONIC,
                TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
            )
            .ok()
        });
        Ok(Self {
            teams: Vec::new(),
            scratch: Scratch::default(),
            liveness: Liveness::default(),
            next: 0,
            worker_pid: std::process::id(),
            words: Vec::with_capacity(4 * urom_coll_wire::MAX_TEAM_SIZE),
            links,
            timer,
            serial: 0,
            pings: Vec::with_capacity(16),
            aborts: Vec::with_capacity(16),
        })
    }

    fn address(&self) -> &[u8] {
        self.links.as_ref().map_or(&[], |l| l.net.address())
    }

    fn command(&mut self, command: &Command<'_>, out: &mut Notifier<'_>) -> Result<(), Status> {
        // Malformed bytes: the worker answers them with DOCA_ERROR_INVALID_VALUE.
        let parsed = CollCommand::parse(command.payload).map_err(|_| Status::InvalidValue)?;
        let mut answers = Answers {
            out,
            worker_pid: self.worker_pid,
        };
        let result = self.handle(command, &parsed, &mut answers);
        match result {
            Ok(true) => Ok(()),
            Ok(false) => answers.send(
                command.dest_id,
                command.plugin,
                command.urom_context,
                parsed.opcode(),
                parsed.team(),
                parsed.id(),
                Ok(()),
            ),
            Err(fault) => answers.send(
                command.dest_id,
                command.plugin,
                command.urom_context,
                parsed.opcode(),
                parsed.team(),
                parsed.id(),
                Err(fault),
            ),
        }
    }

    fn progress(&mut self, out: &mut Notifier<'_>) -> Result<bool, Status> {
        let mut worked = false;
        if let Some(links) = self.links.as_mut() {
            let (teams, pings, aborts) = (&mut self.teams, &mut self.pings, &mut self.aborts);
            worked |= links.net.poll(&mut |token, result| {
                let (serial, kind) = ((token >> 32) as u32, token as u32);
                if serial != CONTROL_SERIAL {
                    if let Some(team) = teams.iter_mut().find(|t| t.serial() == serial) {
                        team.on_net(kind, result);
                    }
                    return;
                }
                if kind == TOKEN_ABORT_IN {
                    if let Ok(Some(abort)) = result
                        && abort.len() == ABORT_LEN
                        && aborts.len() + 1 < aborts.capacity()
                    {
                        let word = |at: usize| {
                            u32::from_le_bytes(abort[at..at + 4].try_into().unwrap_or_default())
                        };
                        let key = u64::from_le_bytes(abort[..8].try_into().unwrap_or_default());
                        let (reason, rank, from) = (Reason::from_raw(word(8)), word(12), word(16));
                        // A disagreement names the other node: from here, the sender.
                        let rank = if reason == Reason::NodesDisagree {
                            from
                        } else {
                            rank
                        };
                        aborts.push((key, Fault::new(reason, rank)));
                    }
                    aborts.push((u64::MAX, Fault::plain(Reason::None)));
                    return;
                }
                if kind != TOKEN_PING_IN {
                    return;
                }
                if let Ok(Some(ping)) = result
                    && ping.len() == PING_LEN
                    && pings.len() + 1 < pings.capacity()
                {
                    let word = |at: usize| {
                        u64::from_le_bytes(ping[at..at + 8].try_into().unwrap_or_default())
                    };
                    pings.push((word(0), word(8)));
                }
                // Taken (or failed): the next ping needs a receive again, posted after the poll.
                pings.push((u64::MAX, 0));
            });
            let domain = out.domain();
            for (id, tag) in self.pings.drain(..) {
                if id == u64::MAX {
                    post_ping_receive(links);
                    continue;
                }
                // A ping from a node worker: answer whatever this worker's ranks do. One this
                // worker cannot reach gets no answer; that node then gives up on this one.
                if let Ok(address) = domain.address(id)
                    && let Ok(peer) = links.peer(id, address)
                {
                    let _ = links
                        .net
                        .send(peer, tag, &[], token(CONTROL_SERIAL, TOKEN_PONG_OUT));
                }
            }
        }
        let mut answers = Answers {
            out,
            worker_pid: self.worker_pid,
        };
        for (key, fault) in self.aborts.drain(..) {
            worked = true;
            if key == u64::MAX {
                if let Some(links) = self.links.as_mut() {
                    post_abort_receive(links);
                }
                continue;
            }
            // Another node's worker failed this team there: fail it here (a team this worker
            // does not know, or a single-node one, is not concerned).
            if let Some(team) = self
                .teams
                .iter_mut()
                .find(|t| t.key() == key && t.spans_nodes())
            {
                team.aborted(&mut answers, fault);
            }
        }
        if self.liveness.due() {
            for team in &mut self.teams {
                if team.waiting() || team.busy() {
                    worked |= team.check_lives(&mut answers);
                }
            }
        }
        let count = self.teams.len();
        for i in 0..count {
            let index = (self.next + i) % count;
            worked |=
                self.teams[index].advance(&mut answers, &mut self.scratch, self.links.as_mut());
        }
        if count > 0 {
            self.next = (self.next + 1) % count;
        }
        // Failures of this node the other nodes of a team must hear of.
        if let Some(links) = self.links.as_mut() {
            for team in &mut self.teams {
                worked |= team.tell_peers(&mut answers, links);
            }
        }
        Ok(worked)
    }

    /// Busy while a collective is ready or running; otherwise the worker may sleep, woken by
    /// a command, by the exit of a rank some team waits for, by a message of another node's
    /// worker (the UCP worker's descriptor), or by the timer of an exchange that must look at
    /// its peers again.
    fn arm(&mut self, wake: &mut WakeFds<'_>) -> Arm {
        if self.teams.iter().any(Team::busy) {
            return Arm::Busy;
        }
        if let Some(links) = self.links.as_mut() {
            if !links.net.arm() {
                return Arm::Busy;
            }
            if let Some(fd) = links.net.wake_fd()
                && wake.watch(fd).is_err()
            {
                return Arm::Unsupported;
            }
        }
        let deadline = self.teams.iter().filter_map(Team::net_deadline).min();
        if let Some(deadline) = deadline {
            use nix::sys::time::TimeSpec;
            use nix::sys::timerfd::{Expiration, TimerSetTimeFlags};
            let Some(timer) = self.timer.as_ref() else {
                return Arm::Unsupported;
            };
            let after = deadline
                .saturating_duration_since(std::time::Instant::now())
                .max(std::time::Duration::from_micros(100));
            let set = timer.set(
                Expiration::OneShot(TimeSpec::from_duration(after)),
                TimerSetTimeFlags::empty(),
            );
            if set.is_err() || wake.watch(timer.as_fd()).is_err() {
                return Arm::Unsupported;
            }
        }
        for team in self.teams.iter().filter(|t| t.waiting()) {
            for fd in team.pidfds() {
                if wake.watch(fd.as_fd()).is_err() {
                    // More descriptors than the worker watches: poll instead.
                    return Arm::Unsupported;
                }
            }
        }
        Arm::Armed
    }
}

/// The network to other nodes' workers: UCX with the `ucx` feature, when a UCP worker opens.
fn open_links() -> Option<Links> {
    #[cfg(feature = "ucx")]
    {
        match net::UcxNet::new() {
            Ok(net) => Some(Links::new(Box::new(net))),
            Err(error) => {
                // The worker logs its standard error; single-node teams work without it.
                eprintln!("worker_coll: no UCX worker, teams spanning nodes are refused: {error}");
                None
            }
        }
    }
    #[cfg(not(feature = "ucx"))]
    {
        None
    }
}

/// Posts the receive of the next abort from another node's worker.
fn post_abort_receive(links: &mut Links) {
    links.net.recv(
        ABORT_TAG,
        KIND_MASK,
        ABORT_LEN,
        token(CONTROL_SERIAL, TOKEN_ABORT_IN),
    );
}

/// Posts the receive of the next ping from another node's worker.
fn post_ping_receive(links: &mut Links) {
    links.net.recv(
        PING_TAG,
        KIND_MASK,
        PING_LEN,
        token(CONTROL_SERIAL, TOKEN_PING_IN),
    );
}

urom_plugin::export_plugin!(Coll);
