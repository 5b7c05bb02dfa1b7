//! Who may connect, and how many at once: the policy the accept loops (`local`, `remote`)
//! apply.
//!
//! The local accept loop reads each peer's credentials (`SO_PEERCRED`) as soon as it has
//! accepted it. A user the daemon does not serve is answered with an error and closed at once,
//! before anything is spent on it. An allowed peer then needs a [`Permit`]: connections of users
//! other than root are bounded per user and in total ([`Limits`]); beyond the bounds a peer is
//! answered with an error and closed too. Root is never counted, so the operator always gets
//! in (the total leaves it room in the open-file limit). Only a permitted connection gets a
//! session, and it must say hello and authenticate within [`HELLO_TIMEOUT`] (see `session`).
//!
//! Turning a peer away never blocks the accept loop: the error reply is written without
//! waiting, and lost if the peer's socket has no room for it. Refusals are logged at most once
//! a second, with a count of those left unlogged, so that a flood cannot fill the log.

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::io::Write;
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nix::fcntl::{FcntlArg, OFlag, fcntl};
use tracing::warn;
use urom_wire::control::{ControlMessage, ErrorReply, REASON_LEN};
use urom_wire::{FrameRepr, MaxMsgSize, Status};

/// How long a connection may take to say hello and authenticate before it is closed.
pub(crate) const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// Open files kept for everything but host connections (listening socket, logs, worker
/// spawns, plugin probes), at least; a quarter of the limit when that is more.
const RESERVED_FILES: u64 = 64;
/// Open files one host connection holds: its socket.
const FILES_PER_CONNECTION: u64 = 1;
/// How often a refusal is logged at most.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// Bounds on connections: of users other than root, or of hosts on other machines that have
/// not proved the secret yet (per source address then).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Connections at once, all such users together.
    pub total: usize,
    /// Connections at once of any one such user (or source address).
    pub per_user: usize,
}

impl Limits {
    /// The bounds asked for, lowered to what `open_files` descriptors can hold next to the
    /// daemon's own (at least one connection).
    pub(crate) fn fit(total: u32, per_user: u32, open_files: u64) -> Self {
        let reserved = RESERVED_FILES.max(open_files / 4);
        let room = (open_files.saturating_sub(reserved) / FILES_PER_CONNECTION).max(1);
        let total = u64::from(total).min(room) as usize;
        Self {
            total,
            per_user: (per_user as usize).min(total),
        }
    }
}

/// The process at the other end of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Peer {
    /// Its user.
    pub uid: u32,
    /// Its process id.
    pub pid: i32,
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "uid {} pid {}", self.uid, self.pid)
    }
}

/// Places for connections, bounded in total and per key (a user, a source address).
pub(crate) struct Quota<K> {
    limits: Limits,
    counts: Mutex<Counts<K>>,
}

struct Counts<K> {
    total: usize,
    per_key: HashMap<K, usize>,
}

/// A place taken from a [`Quota`], given back when dropped.
pub(crate) struct Place<K: Eq + Hash + Copy> {
    quota: Arc<Quota<K>>,
    key: K,
}

/// Why a [`Quota`] had no place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Full {
    /// The key holds this many places, its most.
    Key(usize),
    /// All keys together hold this many places, the most.
    Total(usize),
}

impl<K: Eq + Hash + Copy> Quota<K> {
    pub(crate) fn new(limits: Limits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            counts: Mutex::new(Counts {
                total: 0,
                per_key: HashMap::new(),
            }),
        })
    }

    /// A place for `key`, or which bound is reached.
    pub(crate) fn take(self: &Arc<Self>, key: K) -> Result<Place<K>, Full> {
        let mut counts = self.counts();
        let Counts { total, per_key } = &mut *counts;
        let mine = per_key.entry(key).or_insert(0);
        if *mine >= self.limits.per_user {
            return Err(Full::Key(*mine));
        }
        if *total >= self.limits.total {
            if *mine == 0 {
                per_key.remove(&key);
            }
            return Err(Full::Total(*total));
        }
        *mine += 1;
        *total += 1;
        Ok(Place {
            quota: Arc::clone(self),
            key,
        })
    }

    /// Places held now, in all.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.counts().total
    }

    fn counts(&self) -> MutexGuard<'_, Counts<K>> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<K: Eq + Hash + Copy> Drop for Place<K> {
    fn drop(&mut self) {
        let mut counts = self.quota.counts();
        counts.total -= 1;
        if let Some(mine) = counts.per_key.get_mut(&self.key) {
            *mine -= 1;
            if *mine == 0 {
                counts.per_key.remove(&self.key);
            }
        }
    }
}

/// The users the daemon serves and the connections they hold.
pub(crate) struct Gate {
    /// Users served besides root.
    allowed: Vec<u32>,
    connections: Arc<Quota<u32>>,
    refusals: Mutex<urom_cli::LogEvery>,
}

/// A connection's place within the bounds, given back when dropped; root's counts for nothing.
pub(crate) struct Permit {
    _place: Option<Place<u32>>,
}

impl Gate {
    /// A gate serving root and `allowed`, within `limits`.
    pub(crate) fn new(allowed: Vec<u32>, limits: Limits) -> Self {
        Self {
            allowed,
            connections: Quota::new(limits),
            refusals: Mutex::new(urom_cli::LogEvery::new(REFUSAL_LOG_INTERVAL)),
        }
    }

    /// Whether a peer running as `uid` may use the service.
    pub(crate) fn allows(&self, uid: u32) -> bool {
        uid == 0 || self.allowed.contains(&uid)
    }

    /// A place for one more connection of `uid`, or why there is none.
    pub(crate) fn permit(&self, uid: u32) -> Result<Permit, String> {
        if uid == 0 {
            return Ok(Permit { _place: None });
        }
        match self.connections.take(uid) {
            Ok(place) => Ok(Permit {
                _place: Some(place),
            }),
            Err(Full::Key(mine)) => Err(format!(
                "user {uid} already has {mine} connections, the most one user may have"
            )),
            Err(Full::Total(total)) => Err(format!(
                "the service already has {total} connections, the most it takes"
            )),
        }
    }

    /// Logs that a connection from `from` was turned away or failed to authenticate, unless one
    /// was logged less than [`REFUSAL_LOG_INTERVAL`] ago: those are counted and the count goes
    /// with the next one logged.
    pub(crate) fn log_refusal(&self, from: &dyn fmt::Display, reason: &str) {
        let mut log = self.refusals.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(unlogged) = log.allow(Instant::now()) {
            warn!(%from, unlogged, "connection turned away: {reason}");
        }
    }

    /// Turns `stream`, from `from`, away: logs why (see [`Gate::log_refusal`]), then answers
    /// with an error without waiting for room to write it (it is lost if the peer's socket has
    /// none), and closes it.
    pub(crate) fn turn_away<S: Write + AsFd>(
        &self,
        mut stream: S,
        from: &dyn fmt::Display,
        max: MaxMsgSize,
        (status, reason): (Status, &str),
    ) {
        self.log_refusal(from, reason);
        let nonblocking = fcntl(&stream, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).is_ok();
        if nonblocking {
            write_refusal(&mut stream, max, status, reason);
        }
    }
}

/// Writes an error reply with `status` and `reason` to `stream`, as far as it takes it.
fn write_refusal(stream: &mut impl Write, max: MaxMsgSize, status: Status, reason: &str) {
    let reason = urom_wire::truncate_at_char_boundary(reason, REASON_LEN - 1);
    let frame = FrameRepr {
        seq: 0,
        body: ControlMessage::Error(ErrorReply { status, reason }),
    };
    let mut bytes = vec![0u8; frame.buffer_len()];
    if let Ok(len) = frame.emit(&mut bytes, max) {
        let _ = stream.write(&bytes[..len]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_fit_in_the_open_file_limit() {
        assert_eq!(
            Limits::fit(1024, 256, 1 << 20),
            Limits {
                total: 1024,
                per_user: 256
            }
        );
        // A quarter of 256 files kept, one file a connection.
        assert_eq!(
            Limits::fit(1024, 256, 256),
            Limits {
                total: 192,
                per_user: 192
            }
        );
        assert_eq!(Limits::fit(1024, 256, 10).total, 1);
    }

    #[test]
    fn connections_are_bounded_per_user_and_in_total_but_root_is_not_counted() {
        let gate = Gate::new(
            vec![1000, 1001],
            Limits {
                total: 3,
                per_user: 2,
            },
        );
        assert!(gate.allows(0) && gate.allows(1001) && !gate.allows(1002));
        let first = gate.permit(1000).unwrap();
        let second = gate.permit(1000).unwrap();
        let reason = gate.permit(1000).err().unwrap();
        assert!(reason.contains("user 1000 already has 2"), "{reason}");
        let other = gate.permit(1001).unwrap();
        let reason = gate.permit(1001).err().unwrap();
        assert!(reason.contains("already has 3 connections"), "{reason}");
        let roots: Vec<Permit> = (0..10).map(|_| gate.permit(0).unwrap()).collect();
        drop(first);
        let again = gate.permit(1001).unwrap();
        drop((second, other, again, roots));
        assert_eq!(gate.connections.held(), 0);
        assert!(gate.connections.counts().per_key.is_empty());
    }
}
