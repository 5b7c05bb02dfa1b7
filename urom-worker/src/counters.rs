//! What the worker counts, and how the counts leave its loop.
//!
//! The loop owns a [`Counters`] and bumps its plain integer fields as commands come in and
//! notifications go out: no atomic read-modify-write, no lock, no system call on the hot path.
//! Now and then ([`Counters::due`]: every [`PUBLISH_EVERY`] commands, and once the worker has
//! been idle for [`PUBLISH_AFTER_IDLE_TURNS`] turns or is about to sleep after any change) the
//! loop copies the totals into a [`Published`] block; whoever wants the counts (the daemon
//! link's thread) loads them from there.
//! The block is a sequence lock: the loop never waits for a reader, and a reader that finds a
//! publication under way reads again, so every load is one publication's totals (the errors
//! agree with the notifications, the bytes with the commands).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

use urom_wire::Status;
use urom_wire::report::{ErrorEntry, WorkerCounters};

/// Slots of the error counts: one per DOCA status code from 1 to 30 (slot 0, success, stays
/// zero); a status outside them is counted as [`Status::Unknown`].
pub const STATUS_SLOTS: usize = 31;

/// Commands between two publications while the worker is busy.
pub const PUBLISH_EVERY: u64 = 256;
/// Idle turns in a row after which a change is published. A worker answering one command at a
/// time has a few idle turns between two commands: publishing on the first of them put a burst
/// of stores after every command (a tenth of such a worker's time) and delayed the next.
pub const PUBLISH_AFTER_IDLE_TURNS: u32 = 64;

/// The counts as the worker loop keeps them.
#[derive(Debug, Clone, Default)]
pub struct Counters {
    /// Frames received from hosts.
    pub commands: u64,
    /// Notifications sent or queued for hosts.
    pub notifications: u64,
    /// Bytes of frames received.
    pub bytes_in: u64,
    /// Bytes of notifications sent or queued.
    pub bytes_out: u64,
    /// Notifications by status code ([`STATUS_SLOTS`]).
    pub errors: [u64; STATUS_SLOTS],
    /// The most frames found waiting in one host's channel at once.
    pub peak_ring: u32,
    /// The most bytes held in one host's backlog at once.
    pub peak_backlog_bytes: u64,
    /// Host channels connected now.
    pub hosts: u32,
    /// `commands + notifications + hosts` at the last publication.
    published_at: u64,
}

impl Counters {
    /// Counts a frame received from a host.
    #[inline]
    pub fn command(&mut self, bytes: usize) {
        self.commands += 1;
        self.bytes_in += bytes as u64;
    }

    /// Counts a notification sent (or queued) with `status`.
    #[inline]
    pub fn notification(&mut self, status: Status, bytes: usize) {
        self.notifications += 1;
        self.bytes_out += bytes as u64;
        if !status.is_success() {
            self.errors[slot(status)] += 1;
        }
    }

    /// Notes that `frames` frames were waiting in one host's channel.
    #[inline]
    pub fn ring_batch(&mut self, frames: u32) {
        if frames > self.peak_ring {
            self.peak_ring = frames;
        }
    }

    /// Notes that a host's backlog holds `bytes`.
    #[inline]
    pub fn backlog(&mut self, bytes: usize) {
        if bytes as u64 > self.peak_backlog_bytes {
            self.peak_backlog_bytes = bytes as u64;
        }
    }

    fn mark(&self) -> u64 {
        self.commands + self.notifications + u64::from(self.hosts)
    }

    /// Whether the counts should be published now, `idle_turns` turns into an idle spell (0
    /// while busy): after [`PUBLISH_EVERY`] commands, or after any change once the worker has
    /// been idle for [`PUBLISH_AFTER_IDLE_TURNS`] turns.
    #[inline]
    pub fn due(&self, idle_turns: u32) -> bool {
        let changed = self.mark().wrapping_sub(self.published_at);
        changed >= PUBLISH_EVERY || (changed != 0 && idle_turns >= PUBLISH_AFTER_IDLE_TURNS)
    }

    /// Whether anything changed since the last publication.
    pub fn changed(&self) -> bool {
        self.mark() != self.published_at
    }

    /// Copies the totals into `block` (relaxed stores only).
    pub fn publish(&mut self, block: &Published) {
        self.published_at = self.mark();
        block.store(self);
    }

    /// The totals, for worker `worker_id`.
    pub fn totals(&self, worker_id: u64) -> WorkerCounters {
        WorkerCounters {
            worker_id,
            commands: self.commands,
            notifications: self.notifications,
            errors: self.errors.iter().sum(),
            bytes_in: self.bytes_in,
            bytes_out: self.bytes_out,
            peak_backlog_bytes: self.peak_backlog_bytes,
            in_flight: in_flight(self.commands, self.notifications),
            peak_ring: self.peak_ring,
            hosts: self.hosts,
        }
    }
}

/// Commands whose notification has not gone out yet, as the totals tell it (each command is
/// answered by one notification).
fn in_flight(commands: u64, notifications: u64) -> u32 {
    u32::try_from(commands.saturating_sub(notifications)).unwrap_or(u32::MAX)
}

/// The slot of a status in the error counts.
#[inline]
fn slot(status: Status) -> usize {
    match usize::try_from(status.raw()) {
        Ok(code) if (1..STATUS_SLOTS).contains(&code) => code,
        _ => Status::Unknown.raw() as usize,
    }
}

/// The counts as last published by the worker loop, for other threads.
#[derive(Debug, Default)]
pub struct Published {
    /// Odd while a publication is under way; bumped before and after each one.
    sequence: AtomicU64,
    commands: AtomicU64,
    notifications: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    peak_backlog_bytes: AtomicU64,
    peak_ring: AtomicU32,
    hosts: AtomicU32,
    errors: [AtomicU64; STATUS_SLOTS],
}

impl Published {
    fn store(&self, counters: &Counters) {
        // Only the worker loop publishes, so a plain load and store make the sequence odd.
        let sequence = self.sequence.load(Ordering::Relaxed);
        self.sequence.store(sequence + 1, Ordering::Relaxed);
        // The odd mark is seen before any field of this publication.
        fence(Ordering::Release);
        let store = |field: &AtomicU64, value| field.store(value, Ordering::Relaxed);
        store(&self.commands, counters.commands);
        store(&self.notifications, counters.notifications);
        store(&self.bytes_in, counters.bytes_in);
        store(&self.bytes_out, counters.bytes_out);
        store(&self.peak_backlog_bytes, counters.peak_backlog_bytes);
        self.peak_ring.store(counters.peak_ring, Ordering::Relaxed);
        self.hosts.store(counters.hosts, Ordering::Relaxed);
        for (field, &value) in self.errors.iter().zip(&counters.errors) {
            store(field, value);
        }
        self.sequence.store(sequence + 2, Ordering::Release);
    }

    /// The last published totals of worker `worker_id`, and each error status that occurred
    /// with its count, in code order, into `errors`; returns how many entries it wrote. All of
    /// it comes from one publication.
    pub fn load(
        &self,
        worker_id: u64,
        errors: &mut [ErrorEntry; STATUS_SLOTS],
    ) -> (WorkerCounters, usize) {
        loop {
            let before = self.sequence.load(Ordering::Acquire);
            if before % 2 == 0 {
                let loaded = self.load_fields(worker_id, errors);
                // The fields' loads are done before the sequence is read again.
                fence(Ordering::Acquire);
                if self.sequence.load(Ordering::Relaxed) == before {
                    return loaded;
                }
            }
            // A publication is a few dozen stores: let the loop finish it.
            std::thread::yield_now();
        }
    }

    fn load_fields(
        &self,
        worker_id: u64,
        errors: &mut [ErrorEntry; STATUS_SLOTS],
    ) -> (WorkerCounters, usize) {
        let load = |field: &AtomicU64| field.load(Ordering::Relaxed);
        let mut entries = 0;
        let mut total = 0;
        for (code, field) in self.errors.iter().enumerate() {
            let count = load(field);
            if count > 0 {
                errors[entries] = ErrorEntry {
                    status: Status::from_raw(code as i32),
                    count,
                };
                entries += 1;
                total += count;
            }
        }
        let commands = load(&self.commands);
        let notifications = load(&self.notifications);
        let counters = WorkerCounters {
            worker_id,
            commands,
            notifications,
            errors: total,
            bytes_in: load(&self.bytes_in),
            bytes_out: load(&self.bytes_out),
            peak_backlog_bytes: load(&self.peak_backlog_bytes),
            in_flight: in_flight(commands, notifications),
            peak_ring: self.peak_ring.load(Ordering::Relaxed),
            hosts: self.hosts.load(Ordering::Relaxed),
        };
        (counters, entries)
    }
}

/// An empty error list to load into.
pub fn error_buffer() -> [ErrorEntry; STATUS_SLOTS] {
    [ErrorEntry {
        status: Status::Success,
        count: 0,
    }; STATUS_SLOTS]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_published_when_due_and_read_back() {
        let mut counters = Counters::default();
        let block = Published::default();
        assert!(!counters.due(PUBLISH_AFTER_IDLE_TURNS));
        counters.command(64);
        counters.command(64);
        counters.notification(Status::Success, 72);
        counters.notification(Status::InvalidValue, 56);
        counters.notification(Status::Unrecognized(999), 56);
        counters.ring_batch(2);
        counters.ring_batch(1);
        counters.backlog(100);
        assert!(counters.changed());
        assert!(counters.due(PUBLISH_AFTER_IDLE_TURNS));
        assert!(
            !counters.due(0),
            "busy: not before {PUBLISH_EVERY} commands"
        );
        assert!(
            !counters.due(PUBLISH_AFTER_IDLE_TURNS - 1),
            "not in the first idle turns, which come between two commands"
        );
        counters.publish(&block);
        assert!(!counters.changed());
        assert!(!counters.due(PUBLISH_AFTER_IDLE_TURNS));

        let mut errors = error_buffer();
        let (totals, entries) = block.load(7, &mut errors);
        assert_eq!(totals, counters.totals(7));
        assert_eq!(totals.commands, 2);
        assert_eq!(totals.notifications, 3);
        assert_eq!(totals.errors, 2);
        assert_eq!(totals.bytes_in, 128);
        assert_eq!(totals.bytes_out, 184);
        assert_eq!(totals.in_flight, 0);
        assert_eq!(totals.peak_ring, 2);
        assert_eq!(totals.peak_backlog_bytes, 100);
        assert_eq!(
            &errors[..entries],
            &[
                ErrorEntry {
                    status: Status::Unknown,
                    count: 1
                },
                ErrorEntry {
                    status: Status::InvalidValue,
                    count: 1
                },
            ]
        );

        for _ in 0..PUBLISH_EVERY {
            counters.command(1);
        }
        assert!(counters.due(0));
        assert_eq!(counters.totals(7).in_flight, PUBLISH_EVERY as u32 - 1);
    }

    /// Each load is one publication's totals, even while the loop publishes without pause:
    /// here every publication has as many errors as notifications and commands.
    #[test]
    fn a_load_never_mixes_two_publications() {
        const PUBLICATIONS: u64 = 200_000;
        let block = std::sync::Arc::new(Published::default());
        let writer = {
            let block = block.clone();
            std::thread::spawn(move || {
                let mut counters = Counters::default();
                for _ in 0..PUBLICATIONS {
                    counters.command(8);
                    counters.notification(Status::InvalidValue, 8);
                    counters.publish(&block);
                }
            })
        };
        let mut errors = error_buffer();
        loop {
            let (totals, _) = block.load(1, &mut errors);
            assert_eq!(totals.commands, totals.notifications, "{totals:?}");
            assert_eq!(totals.errors, totals.commands, "{totals:?}");
            assert_eq!(totals.bytes_in, 8 * totals.commands, "{totals:?}");
            if totals.commands == PUBLICATIONS {
                break;
            }
        }
        writer.join().unwrap();
    }
}
