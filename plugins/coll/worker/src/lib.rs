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
//! * [`reduce`]: the reduction kernels, and the fixed reduction order;
//! * `sys`: shared memory, cross-memory attach and process descriptors, the only unsafe code.
//!
//! Built as `libworker_coll.so`; installed in a plugin directory as `worker_coll.so`.
#![deny(unsafe_code)]

pub mod engine;
pub mod reduce;
mod sys;

use urom_coll_wire::{BufferKind, CollCommand, Reason};
use urom_plugin::{Arm, Command, Notifier, Plugin, WakeFds};
use urom_wire::Status;

use engine::{Access, Answers, Fault, Liveness, Scratch, Team};
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
            } => {
                if nodes != 1 {
                    return Err(Fault::new(Reason::InterNode, rank));
                }
                let index = match self.team_index(team) {
                    Some(index) => index,
                    None => {
                        let pids: Vec<u32> = pids.iter().map(|p| p.get()).collect();
                        self.teams.push(Team::new(team, &pids));
                        self.teams.len() - 1
                    }
                };
                self.teams[index].join(
                    answers,
                    rank,
                    pid,
                    pids.iter().map(|p| p.get()),
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
        Ok(Self {
            teams: Vec::new(),
            scratch: Scratch::default(),
            liveness: Liveness::default(),
            next: 0,
            worker_pid: std::process::id(),
            words: Vec::with_capacity(4 * urom_coll_wire::MAX_TEAM_SIZE),
        })
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
        let mut answers = Answers {
            out,
            worker_pid: self.worker_pid,
        };
        let mut worked = false;
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
            worked |= self.teams[index].advance(&mut answers, &mut self.scratch);
        }
        if count > 0 {
            self.next = (self.next + 1) % count;
        }
        Ok(worked)
    }

    /// Busy while a collective is ready or running; otherwise the worker may sleep, woken by
    /// a command or by the exit of a rank some team waits for.
    fn arm(&mut self, wake: &mut WakeFds<'_>) -> Arm {
        if self.teams.iter().any(Team::busy) {
            return Arm::Busy;
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

urom_plugin::export_plugin!(Coll);
