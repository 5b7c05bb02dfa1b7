//! The tables `urom-ctl` prints.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use crate::model::{Counters, Snapshot, Worker};

/// A table: left-aligned text columns, right-aligned number columns, two spaces between.
struct Table {
    headers: Vec<&'static str>,
    numeric: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(columns: &[(&'static str, bool)]) -> Self {
        Self {
            headers: columns.iter().map(|(name, _)| *name).collect(),
            numeric: columns.iter().map(|(_, numeric)| *numeric).collect(),
            rows: Vec::new(),
        }
    }

    fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    fn render(&self, indent: &str, out: &mut String) {
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let line = |cells: &mut dyn Iterator<Item = &str>, out: &mut String| {
            let mut text = String::from(indent);
            for (i, cell) in cells.enumerate() {
                if i > 0 {
                    text.push_str("  ");
                }
                let pad = widths[i].saturating_sub(cell.chars().count());
                if self.numeric[i] {
                    text.extend(std::iter::repeat_n(' ', pad));
                    text.push_str(cell);
                } else {
                    text.push_str(cell);
                    text.extend(std::iter::repeat_n(' ', pad));
                }
            }
            out.push_str(text.trim_end());
            out.push('\n');
        };
        line(&mut self.headers.iter().copied(), out);
        for row in &self.rows {
            line(&mut row.iter().map(String::as_str), out);
        }
    }
}

/// `1h02m03s`, `4m05s`, `6s`.
pub fn duration(d: Duration) -> String {
    let secs = d.as_secs();
    let (days, hours, minutes, seconds) =
        (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match (days, hours, minutes) {
        (0, 0, 0) => format!("{seconds}s"),
        (0, 0, _) => format!("{minutes}m{seconds:02}s"),
        (0, _, _) => format!("{hours}h{minutes:02}m{seconds:02}s"),
        _ => format!("{days}d{hours:02}h{minutes:02}m"),
    }
}

/// `512 B`, `1.5 KiB`, `3.2 MiB`, ...
pub fn bytes(n: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{value:.0} {}", UNITS[0])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// A count per second: `0`, `12.5`, `1234`.
pub fn rate(per_second: f64) -> String {
    if per_second >= 100.0 || per_second == 0.0 {
        format!("{per_second:.0}")
    } else {
        format!("{per_second:.1}")
    }
}

/// What `urom-ctl status` prints.
pub fn status(snapshot: &Snapshot) -> String {
    let d = &snapshot.daemon;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "urom-daemon {}, pid {}, up {}",
        d.version,
        d.pid,
        duration(Duration::from_millis(d.uptime_ms))
    );
    let listen: Vec<String> = snapshot
        .listen
        .iter()
        .map(|l| format!("{} ({})", l.address, l.kind))
        .collect();
    let mut field = |name: &str, value: String| {
        let _ = writeln!(out, "  {name:<14}{value}");
    };
    field("listening", listen.join(", "));
    field("message size", format!("{} bytes", d.max_msg_size));
    field("worker cpus", d.cpuset.clone());
    if let Some(h) = &snapshot.hugepages {
        let mounts = if h.mounts.is_empty() {
            String::new()
        } else {
            format!(", hugetlbfs at {}", h.mounts.join(", "))
        };
        let pages = if h.in_use {
            format!(
                "rings on hugepages: {} of {} free ({} KiB each){mounts}",
                h.free, h.total, h.page_kib
            )
        } else if h.total == 0 {
            format!("rings on normal pages (no hugepages reserved){mounts}")
        } else {
            format!(
                "rings on normal pages ({} of {} hugepages free){mounts}",
                h.free, h.total
            )
        };
        field("hugepages", format!("{}; {pages}", h.mode));
    }
    field("hosts", format!("{} connected", d.hosts));
    let mut states: Vec<(String, usize)> = Vec::new();
    for worker in &snapshot.workers {
        match states.iter_mut().find(|(state, _)| *state == worker.state) {
            Some((_, count)) => *count += 1,
            None => states.push((worker.state.clone(), 1)),
        }
    }
    let states: Vec<String> = states
        .iter()
        .map(|(state, count)| format!("{count} {state}"))
        .collect();
    let yours = if states.is_empty() {
        String::new()
    } else if snapshot.workers.len() == d.workers as usize {
        format!(" ({})", states.join(", "))
    } else {
        format!(
            " ({} of them yours: {})",
            snapshot.workers.len(),
            states.join(", ")
        )
    };
    field(
        "workers",
        format!("{} of at most {}{yours}", d.workers, d.max_workers),
    );
    let offered: Vec<String> = snapshot
        .offered()
        .map(|file| format!("{} {:#x}", file.name, file.id.unwrap_or(0)))
        .collect();
    let left_out = snapshot.left_out();
    let mut plugins = if offered.is_empty() {
        "none offered".to_owned()
    } else {
        format!("{} offered ({})", offered.len(), offered.join(", "))
    };
    let unreadable = snapshot.plugin_dirs.iter().filter(|d| !d.readable).count();
    let mut problems = Vec::new();
    if left_out > 0 {
        problems.push(plural(left_out, "file left out", "files left out"));
    }
    if unreadable > 0 {
        problems.push(plural(
            unreadable,
            "directory unreadable",
            "directories unreadable",
        ));
    }
    if !problems.is_empty() {
        let _ = write!(plugins, "; {}: see urom-ctl plugins", problems.join(", "));
    }
    if snapshot.plugin_dirs.is_empty() {
        plugins = "none: UROM_PLUGIN_PATH names no directory".to_owned();
    }
    field("plugins", plugins);
    out
}

/// `1 file`, `2 files`.
fn plural(count: usize, one: &str, many: &str) -> String {
    format!("{count} {}", if count == 1 { one } else { many })
}

/// What `urom-ctl plugins` prints.
pub fn plugins(snapshot: &Snapshot) -> String {
    let mut out = String::new();
    if snapshot.plugin_dirs.is_empty() {
        out.push_str("UROM_PLUGIN_PATH names no plugin directory\n");
        return out;
    }
    for dir in &snapshot.plugin_dirs {
        match &dir.error {
            Some(error) => {
                let _ = writeln!(out, "{}: cannot be read: {error}", dir.path);
                continue;
            }
            None if dir.files.is_empty() => {
                let _ = writeln!(out, "{}: no .so files", dir.path);
                continue;
            }
            None => {
                let _ = writeln!(out, "{}:", dir.path);
            }
        }
        let mut table = Table::new(&[
            ("NAME", false),
            ("ID", false),
            ("VERSION", true),
            ("STATUS", false),
            ("WHY", false),
        ]);
        for file in &dir.files {
            table.row(vec![
                file.name.clone(),
                file.id.map_or("-".to_owned(), |id| format!("{id:#x}")),
                file.version.map_or("-".to_owned(), |v| v.to_string()),
                file.status.clone(),
                file.reason.clone().unwrap_or_default(),
            ]);
        }
        table.render("  ", &mut out);
    }
    out
}

/// Per-second rates of a worker between two snapshots.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Rates {
    /// Commands per second.
    pub commands: f64,
    /// Notifications per second.
    pub notifications: f64,
    /// Error notifications per second.
    pub errors: f64,
    /// Bytes received per second.
    pub bytes_in: f64,
    /// Bytes sent per second.
    pub bytes_out: f64,
}

impl Rates {
    /// The rates from `before` to `now`, `seconds` apart.
    pub fn between(before: &Counters, now: &Counters, seconds: f64) -> Self {
        let per = |a: u64, b: u64| b.saturating_sub(a) as f64 / seconds.max(1e-3);
        Self {
            commands: per(before.commands, now.commands),
            notifications: per(before.notifications, now.notifications),
            errors: per(before.errors, now.errors),
            bytes_in: per(before.bytes_in, now.bytes_in),
            bytes_out: per(before.bytes_out, now.bytes_out),
        }
    }
}

/// The rates of each worker of `now` that was in `before` too (same id, same start).
pub fn rates(before: &Snapshot, now: &Snapshot, seconds: f64) -> Vec<(u64, Rates)> {
    now.workers
        .iter()
        .filter_map(|worker| {
            let earlier = before
                .workers
                .iter()
                .find(|w| w.id == worker.id && w.started_unix_ms == worker.started_unix_ms)?;
            Some((
                worker.id,
                Rates::between(
                    earlier.counters.as_ref()?,
                    worker.counters.as_ref()?,
                    seconds,
                ),
            ))
        })
        .collect()
}

/// What `urom-ctl workers` prints: totals, or with `rates` (from `--watch`) per second.
pub fn workers(snapshot: &Snapshot, now_unix_ms: u64, rates: Option<&[(u64, Rates)]>) -> String {
    let mut out = String::new();
    if snapshot.workers.is_empty() {
        out.push_str("no workers\n");
        return out;
    }
    let mut columns = vec![
        ("ID", true),
        ("PID", true),
        ("USER", false),
        ("GID", true),
        ("STATE", false),
        ("CPUS", false),
        ("PLUGINS", false),
        ("HOSTS", true),
        ("UPTIME", true),
    ];
    match rates {
        Some(_) => columns.extend([
            ("CMD/S", true),
            ("NOTIF/S", true),
            ("ERR/S", true),
            ("RX/S", true),
            ("TX/S", true),
        ]),
        None => columns.extend([
            ("COMMANDS", true),
            ("NOTIFS", true),
            ("ERRORS", true),
            ("RX", true),
            ("TX", true),
        ]),
    }
    columns.extend([("INFLIGHT", true), ("PEAK-RING", true)]);
    let mut table = Table::new(&columns);
    for worker in &snapshot.workers {
        let mut row = vec![
            worker.id.to_string(),
            worker.pid.to_string(),
            if worker.user.is_empty() {
                worker.uid.to_string()
            } else {
                worker.user.clone()
            },
            worker.gid.to_string(),
            worker.state.clone(),
            worker.cpuset.clone(),
            worker.plugins.join(","),
            worker.hosts.to_string(),
            duration(Duration::from_millis(
                now_unix_ms.saturating_sub(worker.started_unix_ms),
            )),
        ];
        row.extend(counter_cells(worker, rates));
        table.row(row);
    }
    table.render("", &mut out);
    for worker in &snapshot.workers {
        if worker.counters.is_none() {
            let _ = writeln!(
                out,
                "worker {}: counters unavailable (it did not answer the daemon in time)",
                worker.id
            );
        }
        if !worker.errors.is_empty() {
            let errors: Vec<String> = worker
                .errors
                .iter()
                .map(|(status, count)| format!("{status} {count}"))
                .collect();
            let _ = writeln!(out, "worker {} errors: {}", worker.id, errors.join(", "));
        }
    }
    out
}

fn counter_cells(worker: &Worker, rates: Option<&[(u64, Rates)]>) -> Vec<String> {
    let Some(counters) = &worker.counters else {
        return vec!["-".to_owned(); 7];
    };
    let mut cells = match rates {
        Some(rates) => match rates.iter().find(|(id, _)| *id == worker.id) {
            Some((_, r)) => vec![
                rate(r.commands),
                rate(r.notifications),
                rate(r.errors),
                format!("{}/s", bytes(r.bytes_in)),
                format!("{}/s", bytes(r.bytes_out)),
            ],
            None => vec!["-".to_owned(); 5],
        },
        None => vec![
            counters.commands.to_string(),
            counters.notifications.to_string(),
            counters.errors.to_string(),
            bytes(counters.bytes_in as f64),
            bytes(counters.bytes_out as f64),
        ],
    };
    cells.push(counters.in_flight.to_string());
    cells.push(counters.peak_ring.to_string());
    cells
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_well() {
        assert_eq!(duration(Duration::from_secs(5)), "5s");
        assert_eq!(duration(Duration::from_secs(65)), "1m05s");
        assert_eq!(duration(Duration::from_secs(3723)), "1h02m03s");
        assert_eq!(duration(Duration::from_secs(90_061)), "1d01h01m");
        assert_eq!(bytes(512.0), "512 B");
        assert_eq!(bytes(1536.0), "1.5 KiB");
        assert_eq!(bytes(3.0 * 1024.0 * 1024.0), "3.0 MiB");
        assert_eq!(rate(0.0), "0");
        assert_eq!(rate(12.345), "12.3");
        assert_eq!(rate(1234.5), "1234");
    }

    #[test]
    fn tables_align_text_left_and_numbers_right() {
        let mut table = Table::new(&[("NAME", false), ("N", true)]);
        table.row(vec!["a".into(), "100".into()]);
        table.row(vec!["long-name".into(), "7".into()]);
        let mut out = String::new();
        table.render("", &mut out);
        assert_eq!(out, "NAME         N\na          100\nlong-name    7\n");
    }

    #[test]
    fn rates_are_deltas_per_second() {
        let before = Counters {
            commands: 100,
            bytes_in: 1000,
            ..Counters::default()
        };
        let now = Counters {
            commands: 300,
            bytes_in: 5000,
            ..Counters::default()
        };
        let r = Rates::between(&before, &now, 2.0);
        assert_eq!(r.commands, 100.0);
        assert_eq!(r.bytes_in, 2000.0);
        assert_eq!(r.errors, 0.0);
    }
}
