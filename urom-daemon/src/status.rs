//! The daemon's status: what it is, where it listens, which pages worker rings use, every
//! plugin directory and `.so` file and what became of each, and the workers with their
//! counters.
//!
//! `collect` gathers a [`Report`] (for one user's eyes: a user sees its own workers, root
//! sees all); the control socket answers it as records in pages (`StatusPager`), and the
//! metrics endpoint (`crate::metrics`) serves the same numbers to Prometheus.

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

use nix::unistd::{Uid, User};
use urom_wire::control::STATUS_REPLY_HEADER_LEN;
use urom_wire::list::Item;
use urom_wire::report::{
    DaemonStatus, DirState, ErrorCount, HugePagesStatus, ListenKind, ListenStatus, PluginDirStatus,
    PluginFileStatus, PluginOutcome, StatusRecord, WorkerState, WorkerStatus,
};
use urom_wire::{FRAME_HEADER_LEN, Status};

use crate::Service;
use crate::discovery::{FileOutcome, Survey};
use crate::hugepages::{HugePagePool, HugePagesPlan};
use crate::link::CounterSnapshot;
use crate::registry::{Owner, ServiceError, WorkerView};

/// Everything the status report says, gathered at one time.
pub struct Report {
    /// The daemon's own record.
    pub daemon: DaemonInfo,
    /// Where it listens.
    pub listen: Vec<(ListenKind, String)>,
    /// The hugepage choice and the pool now.
    pub hugepages: HugePagesPlan,
    /// The plugin directories and files.
    pub survey: Survey,
    /// The workers the asking user may see, in id order.
    pub workers: Vec<WorkerReport>,
}

/// The daemon's own numbers.
pub struct DaemonInfo {
    /// Its process id.
    pub pid: u32,
    /// When it started, in milliseconds since the Unix epoch.
    pub started_unix_ms: u64,
    /// How long it has run, in milliseconds.
    pub uptime_ms: u64,
    /// Its version.
    pub version: &'static str,
    /// The maximum message size.
    pub max_msg_size: u32,
    /// The most workers at once.
    pub max_workers: u32,
    /// Workers running now (all users).
    pub workers: u32,
    /// Host connections now.
    pub hosts: u32,
    /// The CPUs workers may use.
    pub cpuset: String,
}

/// One worker and its counters.
pub struct WorkerReport {
    /// What the registry knows.
    pub view: WorkerView,
    /// The name of its user, or empty.
    pub user: String,
    /// Its counters, or why they could not be read.
    pub counters: Result<CounterSnapshot, String>,
}

/// Gathers the report as `owner` may see it.
pub(crate) fn collect(service: &Service, owner: &Owner) -> Report {
    let now = SystemTime::now();
    let uptime = service.started_at.elapsed();
    let (workers, hosts) = service.registry.counts();
    let daemon = DaemonInfo {
        pid: std::process::id(),
        started_unix_ms: unix_ms(now) - uptime.as_millis().min(u128::from(unix_ms(now))) as u64,
        uptime_ms: u64::try_from(uptime.as_millis()).unwrap_or(u64::MAX),
        version: env!("CARGO_PKG_VERSION"),
        max_msg_size: service.max_msg_size.as_u32(),
        max_workers: service.max_workers,
        workers: u32::try_from(workers).unwrap_or(u32::MAX),
        hosts: u32::try_from(hosts).unwrap_or(u32::MAX),
        cpuset: service.cpuset.to_string(),
    };
    let mut listen = vec![(ListenKind::Control, service.socket.display().to_string())];
    if let Some(ucx) = service.ucx_listen.get() {
        listen.push((ListenKind::Ucx, ucx.to_string()));
    }
    if let Some(metrics) = service.metrics {
        listen.push((ListenKind::Metrics, metrics.to_string()));
    }
    let hugepages = HugePagesPlan {
        choice: service.hugepages,
        pool: HugePagePool::read(),
    };
    let survey = service
        .discovery
        .survey(std::env::var_os(crate::PLUGIN_PATH_VAR).as_deref(), false);
    let mut names: HashMap<u32, String> = HashMap::new();
    let views = service.registry.views(owner);
    // A worker that has not started may never answer (it hangs, or its user stopped it):
    // nobody waits for it. The others are asked all at once: those that do not answer (their
    // user stopped them) cost the report one timeout in all.
    let counters = crate::link::counters_of_all(
        views
            .iter()
            .map(|view| (view.state != WorkerState::Starting).then_some(&*view.link)),
    );
    let workers = views
        .into_iter()
        .zip(counters)
        .map(|(view, counters)| {
            let user = names
                .entry(view.owner)
                .or_insert_with(|| user_name(view.owner))
                .clone();
            WorkerReport {
                view,
                user,
                counters,
            }
        })
        .collect();
    Report {
        daemon,
        listen,
        hugepages,
        survey,
        workers,
    }
}

fn unix_ms(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn user_name(uid: u32) -> String {
    User::from_uid(Uid::from_raw(uid))
        .ok()
        .flatten()
        .map(|user| user.name)
        .unwrap_or_default()
}

/// A status record that owns its texts: the record with empty texts, and the texts in the
/// order the record kind has them.
struct OwnedRecord {
    record: StatusRecord<'static>,
    texts: Vec<String>,
}

impl OwnedRecord {
    fn new(record: StatusRecord<'static>, texts: Vec<String>) -> Self {
        Self { record, texts }
    }

    /// The record, its texts filled in.
    fn view(&self) -> StatusRecord<'_> {
        let t = |i: usize| self.texts.get(i).map_or("", String::as_str);
        match self.record {
            StatusRecord::Daemon(d) => StatusRecord::Daemon(DaemonStatus {
                version: t(0),
                cpuset: t(1),
                ..d
            }),
            StatusRecord::Listen(l) => StatusRecord::Listen(ListenStatus { address: t(0), ..l }),
            StatusRecord::HugePages(h) => {
                StatusRecord::HugePages(HugePagesStatus { mounts: t(0), ..h })
            }
            StatusRecord::PluginDir(d) => StatusRecord::PluginDir(PluginDirStatus {
                path: t(0),
                error: t(1),
                ..d
            }),
            StatusRecord::PluginFile(f) => StatusRecord::PluginFile(PluginFileStatus {
                name: t(0),
                path: t(1),
                reason: t(2),
                ..f
            }),
            StatusRecord::Worker(w) => StatusRecord::Worker(WorkerStatus {
                user: t(0),
                cpuset: t(1),
                ..w
            }),
            other => other,
        }
    }

    fn len(&self) -> usize {
        self.view().encoded_len()
    }

    /// Shortens the longest texts until the record takes at most `room` bytes (only a message
    /// size near the smallest legal one needs it).
    fn fit(&mut self, room: usize) {
        while self.len() > room {
            let excess = self.len() - room;
            let Some(longest) = self.texts.iter_mut().max_by_key(|text| text.len()) else {
                return;
            };
            if longest.is_empty() {
                return;
            }
            let keep = longest.len().saturating_sub(excess);
            let cut = urom_wire::truncate_at_char_boundary(longest, keep).len();
            longest.truncate(cut);
        }
    }
}

/// The report as status records, in the order a reader expects them: the daemon, where it
/// listens, hugepages, each plugin directory followed by its files, each worker followed by
/// its counters and error counts.
fn records(report: &Report) -> Vec<OwnedRecord> {
    let d = &report.daemon;
    let mut records = vec![OwnedRecord::new(
        StatusRecord::Daemon(DaemonStatus {
            pid: d.pid,
            workers: d.workers,
            started_unix_ms: d.started_unix_ms,
            uptime_ms: d.uptime_ms,
            max_msg_size: d.max_msg_size,
            max_workers: d.max_workers,
            hosts: d.hosts,
            version: "",
            cpuset: "",
        }),
        vec![d.version.to_owned(), d.cpuset.clone()],
    )];
    for (kind, address) in &report.listen {
        records.push(OwnedRecord::new(
            StatusRecord::Listen(ListenStatus {
                kind: *kind,
                address: "",
            }),
            vec![address.clone()],
        ));
    }
    let plan = &report.hugepages;
    records.push(OwnedRecord::new(
        StatusRecord::HugePages(HugePagesStatus {
            mode: plan.mode(),
            usable: plan.usable(),
            page_kib: plan.pool.page_kib,
            total: plan.pool.total,
            free: plan.pool.free,
            mounts: "",
        }),
        vec![plan.pool.mounts.join(",")],
    ));
    for dir in &report.survey.dirs {
        let state = if dir.error.is_some() {
            DirState::Unreadable
        } else {
            DirState::Read
        };
        records.push(OwnedRecord::new(
            StatusRecord::PluginDir(PluginDirStatus {
                state,
                path: "",
                error: "",
            }),
            vec![
                dir.path.display().to_string(),
                dir.error.clone().unwrap_or_default(),
            ],
        ));
        for file in &dir.files {
            let (outcome, id, version, reason) = describe_file(&file.outcome);
            records.push(OwnedRecord::new(
                StatusRecord::PluginFile(PluginFileStatus {
                    outcome,
                    id,
                    version,
                    name: "",
                    path: "",
                    reason: "",
                }),
                vec![file.name.clone(), file.path.display().to_string(), reason],
            ));
        }
    }
    for worker in &report.workers {
        let view = &worker.view;
        records.push(OwnedRecord::new(
            StatusRecord::Worker(WorkerStatus {
                id: view.id,
                plugins: view.plugins.bits(),
                started_unix_ms: unix_ms(view.started),
                pid: view.pid.unsigned_abs(),
                uid: view.owner,
                gid: view.gid,
                state: view.state,
                hosts: u32::try_from(view.hosts).unwrap_or(u32::MAX),
                user: "",
                cpuset: "",
            }),
            vec![worker.user.clone(), view.cpuset.to_string()],
        ));
        if let Ok((counters, errors)) = &worker.counters {
            records.push(OwnedRecord::new(StatusRecord::Counters(*counters), vec![]));
            for entry in errors {
                records.push(OwnedRecord::new(
                    StatusRecord::ErrorCount(ErrorCount {
                        worker_id: view.id,
                        status: entry.status,
                        count: entry.count,
                    }),
                    vec![],
                ));
            }
        }
    }
    records
}

/// The outcome, id, version and reason a status record gives a file.
fn describe_file(outcome: &FileOutcome) -> (PluginOutcome, u64, u64, String) {
    let (outcome, id, version, reason): (_, _, _, &str) = match outcome {
        FileOutcome::Offered { id, version } => (PluginOutcome::Offered, id.get(), *version, ""),
        FileOutcome::Refused(reason) => (PluginOutcome::Refused, 0, 0, reason),
        FileOutcome::Probing => (
            PluginOutcome::Probing,
            0,
            0,
            "still being probed; offered once the probe answers",
        ),
        FileOutcome::DuplicateName { version } => (
            PluginOutcome::DuplicateName,
            0,
            *version,
            "a plugin of the same name comes earlier in UROM_PLUGIN_PATH",
        ),
        FileOutcome::BadName { version } => (
            PluginOutcome::BadName,
            0,
            *version,
            "the name must be 1 to 47 bytes of UTF-8",
        ),
        FileOutcome::TooMany { version } => (
            PluginOutcome::TooMany,
            0,
            *version,
            "more plugins than plugin ids (62)",
        ),
        FileOutcome::Unreadable(reason) => (PluginOutcome::Unreadable, 0, 0, reason),
    };
    (outcome, id, version, reason.to_owned())
}

/// One host connection's status report being read in pages.
#[derive(Default)]
pub(crate) struct StatusPager {
    snapshot: Vec<OwnedRecord>,
}

impl StatusPager {
    /// The page of the report from record `cursor` on, as much as fits a frame, and the cursor
    /// of the next page (0 after the last). Cursor 0 takes a fresh snapshot for `owner`.
    pub(crate) fn page(
        &mut self,
        service: &Service,
        owner: &Owner,
        cursor: u32,
    ) -> Result<(Vec<StatusRecord<'_>>, u32), ServiceError> {
        let room = service.max_msg_size.get() - FRAME_HEADER_LEN - STATUS_REPLY_HEADER_LEN;
        if cursor == 0 {
            self.snapshot = records(&collect(service, owner));
            for record in &mut self.snapshot {
                record.fit(room);
            }
        }
        let start = cursor as usize;
        if start >= self.snapshot.len() {
            return Err(ServiceError::new(
                Status::InvalidValue,
                format!(
                    "no status report is being read at record {cursor}; ask for record 0 to start one"
                ),
            ));
        }
        let mut used = 0;
        let mut end = start;
        while end < self.snapshot.len() {
            let len = self.snapshot[end].len();
            if end > start && used + len > room {
                break;
            }
            used += len;
            end += 1;
        }
        let next = if end == self.snapshot.len() {
            0
        } else {
            u32::try_from(end).unwrap_or(0)
        };
        let page = self.snapshot[start..end]
            .iter()
            .map(OwnedRecord::view)
            .collect();
        Ok((page, next))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_too_long_for_a_page_loses_text_not_fields() {
        let mut record = OwnedRecord::new(
            StatusRecord::PluginFile(PluginFileStatus {
                outcome: PluginOutcome::Refused,
                id: 0,
                version: 3,
                name: "",
                path: "",
                reason: "",
            }),
            vec!["p".into(), "/very/".repeat(40), "é".repeat(100)],
        );
        assert!(record.len() > 150);
        record.fit(150);
        assert!(record.len() <= 150, "{}", record.len());
        let StatusRecord::PluginFile(file) = record.view() else {
            panic!("not a plugin file");
        };
        assert_eq!(file.version, 3);
        assert_eq!(file.name, "p");
        assert!(file.reason.chars().all(|c| c == 'é'));
    }
}
