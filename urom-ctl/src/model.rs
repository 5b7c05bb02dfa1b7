//! The status report as `urom-ctl` shows it: owned, named, serializable (the `--json` output),
//! built from the records the daemon sends.

use std::collections::BTreeMap;

use serde::Serialize;
use urom_host::StatusReport;
use urom_wire::report::{
    DirState, HugePagesMode, ListenKind, PluginOutcome, StatusRecord, WorkerState,
};

/// Everything the daemon reported.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Snapshot {
    /// The daemon itself.
    pub daemon: Daemon,
    /// Where it listens.
    pub listen: Vec<Listen>,
    /// The pages worker rings use.
    pub hugepages: Option<HugePages>,
    /// The directories of `UROM_PLUGIN_PATH`, each with its `.so` files.
    pub plugin_dirs: Vec<PluginDir>,
    /// The workers this user may see.
    pub workers: Vec<Worker>,
}

/// The daemon's own numbers.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Daemon {
    /// Its version.
    pub version: String,
    /// Its process id.
    pub pid: u32,
    /// When it started, in milliseconds since the Unix epoch.
    pub started_unix_ms: u64,
    /// How long it has run, in milliseconds.
    pub uptime_ms: u64,
    /// The maximum message size of every channel.
    pub max_msg_size: u32,
    /// The most workers at once.
    pub max_workers: u32,
    /// Workers running now, every user's.
    pub workers: u32,
    /// Host connections now (this one included).
    pub hosts: u32,
    /// The CPUs workers may use.
    pub cpuset: String,
}

/// An address the daemon listens on.
#[derive(Debug, Clone, Serialize)]
pub struct Listen {
    /// `control` or `metrics`.
    pub kind: String,
    /// A socket path or `host:port`.
    pub address: String,
}

/// The pages worker rings use.
#[derive(Debug, Clone, Serialize)]
pub struct HugePages {
    /// `auto`, `never` or `require`.
    pub mode: String,
    /// Whether new rings go on hugepages.
    pub in_use: bool,
    /// The hugepage size in KiB.
    pub page_kib: u32,
    /// Hugepages reserved.
    pub total: u32,
    /// Hugepages free.
    pub free: u32,
    /// Where hugetlbfs is mounted.
    pub mounts: Vec<String>,
}

/// A plugin directory.
#[derive(Debug, Clone, Serialize)]
pub struct PluginDir {
    /// The directory.
    pub path: String,
    /// Whether it could be listed.
    pub readable: bool,
    /// Why not, if not.
    pub error: Option<String>,
    /// Its `.so` files.
    pub files: Vec<PluginFile>,
}

/// A `.so` file of a plugin directory.
#[derive(Debug, Clone, Serialize)]
pub struct PluginFile {
    /// The file name without `.so`.
    pub name: String,
    /// The file.
    pub path: String,
    /// `offered`, or why not: `refused`, `probing`, `duplicate-name`, `bad-name`,
    /// `too-many`, `unreadable`.
    pub status: String,
    /// Its plugin id, when offered.
    pub id: Option<u64>,
    /// Its version, when its probe answered.
    pub version: Option<u64>,
    /// Why it is not offered.
    pub reason: Option<String>,
}

/// A worker.
#[derive(Debug, Clone, Serialize)]
pub struct Worker {
    /// Its id.
    pub id: u64,
    /// Its process id.
    pub pid: u32,
    /// The user it serves.
    pub uid: u32,
    /// That user's name, when known.
    pub user: String,
    /// Its group id.
    pub gid: u32,
    /// `starting`, `running` or `stopping`.
    pub state: String,
    /// Its CPUs.
    pub cpuset: String,
    /// Its plugins, an OR of plugin ids.
    pub plugin_mask: u64,
    /// The names of its plugins (by the ids the daemon offers now; `0x..` for an id no
    /// plugin has now).
    pub plugins: Vec<String>,
    /// When it was spawned, in milliseconds since the Unix epoch.
    pub started_unix_ms: u64,
    /// Host connections attached to it through the daemon.
    pub hosts: u32,
    /// Its counters, when it answered the daemon in time.
    pub counters: Option<Counters>,
    /// Its notifications by error status name.
    pub errors: BTreeMap<String, u64>,
}

/// What a worker has done.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    /// Commands received.
    pub commands: u64,
    /// Notifications sent.
    pub notifications: u64,
    /// Notifications with an error status.
    pub errors: u64,
    /// Bytes received.
    pub bytes_in: u64,
    /// Bytes sent.
    pub bytes_out: u64,
    /// Commands whose notification has not been sent yet.
    pub in_flight: u32,
    /// The most commands found waiting in one host's ring at once.
    pub peak_ring: u32,
    /// The most bytes of notifications held for a host whose ring was full.
    pub peak_backlog_bytes: u64,
    /// Host channels connected to the worker.
    pub host_channels: u32,
}

impl Snapshot {
    /// The snapshot of a report.
    pub fn from_report(report: &StatusReport) -> Self {
        let mut snapshot = Snapshot::default();
        for record in report.records() {
            snapshot.add(record);
        }
        snapshot.name_plugins();
        snapshot
    }

    fn add(&mut self, record: StatusRecord<'_>) {
        match record {
            StatusRecord::Daemon(d) => {
                self.daemon = Daemon {
                    version: d.version.to_owned(),
                    pid: d.pid,
                    started_unix_ms: d.started_unix_ms,
                    uptime_ms: d.uptime_ms,
                    max_msg_size: d.max_msg_size,
                    max_workers: d.max_workers,
                    workers: d.workers,
                    hosts: d.hosts,
                    cpuset: d.cpuset.to_owned(),
                }
            }
            StatusRecord::Listen(l) => self.listen.push(Listen {
                kind: match l.kind {
                    ListenKind::Control => "control".to_owned(),
                    ListenKind::Metrics => "metrics".to_owned(),
                    ListenKind::Ucx => "ucx".to_owned(),
                    ListenKind::Unknown(code) => format!("kind {code}"),
                },
                address: l.address.to_owned(),
            }),
            StatusRecord::HugePages(h) => {
                self.hugepages = Some(HugePages {
                    mode: match h.mode {
                        HugePagesMode::Auto => "auto".to_owned(),
                        HugePagesMode::Never => "never".to_owned(),
                        HugePagesMode::Require => "require".to_owned(),
                        HugePagesMode::Unknown(code) => format!("mode {code}"),
                    },
                    in_use: h.usable,
                    page_kib: h.page_kib,
                    total: h.total,
                    free: h.free,
                    mounts: h
                        .mounts
                        .split(',')
                        .filter(|m| !m.is_empty())
                        .map(str::to_owned)
                        .collect(),
                })
            }
            StatusRecord::PluginDir(d) => self.plugin_dirs.push(PluginDir {
                path: d.path.to_owned(),
                readable: d.state == DirState::Read,
                error: (!d.error.is_empty()).then(|| d.error.to_owned()),
                files: Vec::new(),
            }),
            StatusRecord::PluginFile(f) => {
                let offered = f.outcome == PluginOutcome::Offered;
                let probed = !matches!(
                    f.outcome,
                    PluginOutcome::Refused | PluginOutcome::Probing | PluginOutcome::Unreadable
                );
                let file = PluginFile {
                    name: f.name.to_owned(),
                    path: f.path.to_owned(),
                    status: outcome_name(f.outcome),
                    id: offered.then_some(f.id),
                    version: probed.then_some(f.version),
                    reason: (!f.reason.is_empty()).then(|| f.reason.to_owned()),
                };
                if let Some(dir) = self.plugin_dirs.last_mut() {
                    dir.files.push(file);
                }
            }
            StatusRecord::Worker(w) => self.workers.push(Worker {
                id: w.id,
                pid: w.pid,
                uid: w.uid,
                user: w.user.to_owned(),
                gid: w.gid,
                state: match w.state {
                    WorkerState::Starting => "starting".to_owned(),
                    WorkerState::Running => "running".to_owned(),
                    WorkerState::Stopping => "stopping".to_owned(),
                    WorkerState::Unknown(code) => format!("state {code}"),
                },
                cpuset: w.cpuset.to_owned(),
                plugin_mask: w.plugins,
                plugins: Vec::new(),
                started_unix_ms: w.started_unix_ms,
                hosts: w.hosts,
                counters: None,
                errors: BTreeMap::new(),
            }),
            StatusRecord::Counters(c) => {
                if let Some(worker) = self.workers.iter_mut().find(|w| w.id == c.worker_id) {
                    worker.counters = Some(Counters {
                        commands: c.commands,
                        notifications: c.notifications,
                        errors: c.errors,
                        bytes_in: c.bytes_in,
                        bytes_out: c.bytes_out,
                        in_flight: c.in_flight,
                        peak_ring: c.peak_ring,
                        peak_backlog_bytes: c.peak_backlog_bytes,
                        host_channels: c.hosts,
                    });
                }
            }
            StatusRecord::ErrorCount(e) => {
                if let Some(worker) = self.workers.iter_mut().find(|w| w.id == e.worker_id) {
                    worker.errors.insert(e.status.name().to_owned(), e.count);
                }
            }
            // A record of a newer daemon: nothing to show.
            StatusRecord::Unknown { .. } => {}
        }
    }

    /// The plugins offered now: name and id.
    pub fn offered(&self) -> impl Iterator<Item = &PluginFile> {
        self.plugin_dirs
            .iter()
            .flat_map(|dir| &dir.files)
            .filter(|file| file.id.is_some())
    }

    /// Files found but not offered.
    pub fn left_out(&self) -> usize {
        self.plugin_dirs
            .iter()
            .flat_map(|dir| &dir.files)
            .filter(|file| file.id.is_none())
            .count()
    }

    fn name_plugins(&mut self) {
        let names: Vec<(u64, String)> = self
            .offered()
            .filter_map(|file| Some((file.id?, file.name.clone())))
            .collect();
        for worker in &mut self.workers {
            worker.plugins = (0..64)
                .map(|bit| 1u64 << bit)
                .filter(|id| worker.plugin_mask & id != 0)
                .map(|id| {
                    names
                        .iter()
                        .find(|(offered, _)| *offered == id)
                        .map_or_else(|| format!("{id:#x}"), |(_, name)| name.clone())
                })
                .collect();
        }
    }
}

fn outcome_name(outcome: PluginOutcome) -> String {
    match outcome {
        PluginOutcome::Offered => "offered".to_owned(),
        PluginOutcome::Refused => "refused".to_owned(),
        PluginOutcome::Probing => "probing".to_owned(),
        PluginOutcome::DuplicateName => "duplicate-name".to_owned(),
        PluginOutcome::BadName => "bad-name".to_owned(),
        PluginOutcome::TooMany => "too-many".to_owned(),
        PluginOutcome::Unreadable => "unreadable".to_owned(),
        PluginOutcome::Unknown(code) => format!("outcome {code}"),
    }
}
