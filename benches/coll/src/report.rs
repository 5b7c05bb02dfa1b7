//! Medians over the rounds, and the medians of the per-round ratios ours / Open MPI, per
//! collective and size.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::kind::Kind;
use crate::record::Row;
use crate::stats::median_of;

/// The baseline implementation's name in the results.
pub const BASELINE: &str = "openmpi";
/// Our implementation's name in the results.
pub const OURS: &str = "urom";

/// One implementation's medians over the rounds, for one collective and size.
#[derive(Clone, Debug, PartialEq)]
pub struct Medians {
    /// Rounds measured.
    pub rounds: usize,
    /// Blocking latency, microseconds.
    pub lat_us: f64,
    /// The non-blocking collective alone, microseconds.
    pub pure_us: f64,
    /// Overlap, percent.
    pub overlap_pct: f64,
    /// The rank's CPU time per collective, microseconds.
    pub cpu_us: f64,
    /// The workers' CPU time per collective, microseconds, where there are workers.
    pub worker_cpu_us: Option<f64>,
}

impl Medians {
    fn of(rows: &[&Row]) -> Option<Medians> {
        if rows.is_empty() {
            return None;
        }
        let workers: Vec<f64> = rows.iter().filter_map(|r| r.worker_cpu_us).collect();
        Some(Medians {
            rounds: rows.len(),
            lat_us: median_of(rows, |r| r.lat_us),
            pure_us: median_of(rows, |r| r.pure_us),
            overlap_pct: median_of(rows, |r| r.overlap_pct),
            cpu_us: median_of(rows, |r| r.cpu_us),
            worker_cpu_us: (!workers.is_empty()).then(|| median_of(&workers, |v| *v)),
        })
    }
}

/// One collective and size: each side's medians and the medians of the per-round ratios.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    /// The collective.
    pub kind: Kind,
    /// Message size, bytes.
    pub bytes: usize,
    /// Ranks.
    pub ranks: usize,
    /// Open MPI's medians.
    pub baseline: Option<Medians>,
    /// Ours.
    pub ours: Option<Medians>,
    /// Median over the rounds of ours / Open MPI's blocking latency.
    pub lat_ratio: Option<f64>,
    /// Median over the rounds of ours / Open MPI's rank CPU per collective.
    pub cpu_ratio: Option<f64>,
    /// The name "ours" goes by in the results ([`OURS`] unless [`summarise_as`] says).
    pub ours_name: String,
}

/// Groups the rows by collective, size and ranks (in [`Kind::ALL`] order, then by size).
pub fn summarise(rows: &[Row]) -> Vec<Summary> {
    summarise_as(rows, OURS)
}

/// [`summarise`], with `ours` the implementation compared with Open MPI (for example
/// `openmpi+urom_mpi`: Open MPI with `liburom_mpi.so` preloaded).
pub fn summarise_as(rows: &[Row], ours: &str) -> Vec<Summary> {
    let ours_name = ours;
    let mut groups: BTreeMap<(Kind, usize, usize), Vec<&Row>> = BTreeMap::new();
    for row in rows {
        groups
            .entry((row.kind, row.bytes, row.ranks))
            .or_default()
            .push(row);
    }
    groups
        .into_iter()
        .map(|((kind, bytes, ranks), rows)| {
            let side = |name: &str| -> Vec<&Row> {
                rows.iter()
                    .copied()
                    .filter(|r| r.implementation == name)
                    .collect()
            };
            let (base, ours) = (side(BASELINE), side(ours_name));
            let ratio = |f: fn(&Row) -> f64| -> Option<f64> {
                let per_round: Vec<f64> = ours
                    .iter()
                    .filter_map(|o| {
                        let b = base.iter().find(|b| b.round == o.round)?;
                        (f(b) > 0.0).then(|| f(o) / f(b))
                    })
                    .collect();
                (!per_round.is_empty()).then(|| median_of(&per_round, |v| *v))
            };
            Summary {
                kind,
                bytes,
                ranks,
                baseline: Medians::of(&base),
                ours: Medians::of(&ours),
                lat_ratio: ratio(|r| r.lat_us),
                cpu_ratio: ratio(|r| r.cpu_us),
                ours_name: ours_name.to_string(),
            }
        })
        .collect()
}

/// A size as people write it: 8 B, 64 KiB, 16 MiB.
pub fn human_bytes(bytes: usize) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = bytes;
    let mut unit = 0;
    while value >= 1024 && value % 1024 == 0 && unit + 1 < UNITS.len() {
        value /= 1024;
        unit += 1;
    }
    format!("{value} {}", UNITS[unit])
}

fn cell(value: Option<f64>, decimals: usize) -> String {
    match value {
        Some(v) if v.is_finite() => format!("{v:.decimals$}"),
        _ => "-".to_string(),
    }
}

/// The table the script prints: per collective and size, latency (each side and the median
/// ratio), overlap (each side), the rank's CPU per collective (each side and the ratio) and the
/// workers' CPU. Times in microseconds, medians over the rounds.
pub fn table(summaries: &[Summary]) -> String {
    let mut out = String::new();
    // "urom", or a short form of another name ("openmpi+urom_mpi": "+urom_mpi").
    let name = summaries.first().map_or(OURS, |s| s.ours_name.as_str());
    let short = name.strip_prefix(BASELINE).unwrap_or(name);
    let col = |what: &str| format!("{what} {short}");
    let _ = writeln!(
        out,
        "{:<10} {:>8} {:>3} | {:>10} {:>10} {:>6} | {:>10} {:>10} | {:>9} {:>9} | {:>9} {:>9} {:>6} | {:>9}",
        "coll",
        "size",
        "np",
        "lat ompi",
        col("lat"),
        "ratio",
        "pure ompi",
        col("pure"),
        "ovl% ompi",
        col("ovl%"),
        "cpu ompi",
        col("cpu"),
        "ratio",
        "cpu wrk"
    );
    for s in summaries {
        let b = s.baseline.as_ref();
        let o = s.ours.as_ref();
        let _ = writeln!(
            out,
            "{:<10} {:>8} {:>3} | {:>10} {:>10} {:>6} | {:>10} {:>10} | {:>9} {:>9} | {:>9} {:>9} {:>6} | {:>9}",
            s.kind.name(),
            human_bytes(s.bytes),
            s.ranks,
            cell(b.map(|m| m.lat_us), 2),
            cell(o.map(|m| m.lat_us), 2),
            cell(s.lat_ratio, 2),
            cell(b.map(|m| m.pure_us), 2),
            cell(o.map(|m| m.pure_us), 2),
            cell(b.map(|m| m.overlap_pct), 1),
            cell(o.map(|m| m.overlap_pct), 1),
            cell(b.map(|m| m.cpu_us), 2),
            cell(o.map(|m| m.cpu_us), 2),
            cell(s.cpu_ratio, 3),
            cell(o.and_then(|m| m.worker_cpu_us), 2),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(round: u32, implementation: &str, lat: f64, cpu: f64) -> Row {
        Row {
            round,
            implementation: implementation.into(),
            kind: Kind::Allreduce,
            bytes: 65536,
            ranks: 2,
            iters: 10,
            lat_us: lat,
            pure_us: lat,
            total_us: 2.0 * lat,
            compute_us: lat,
            overlap_pct: 0.0,
            cpu_us: cpu,
            cpu_loop_us: cpu,
            worker_cpu_us: None,
        }
    }

    #[test]
    fn ratios_pair_rounds() {
        // Round 1: ratio 2; round 2: ratio 1 (the machine got slower for both); round 3: 1.5.
        let rows = vec![
            row(1, "openmpi", 10.0, 10.0),
            row(1, "urom", 20.0, 1.0),
            row(2, "urom", 40.0, 2.0),
            row(2, "openmpi", 40.0, 20.0),
            row(3, "openmpi", 20.0, 10.0),
            row(3, "urom", 30.0, 1.0),
        ];
        let s = summarise(&rows);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].lat_ratio, Some(1.5));
        assert_eq!(s[0].cpu_ratio, Some(0.1));
        assert_eq!(s[0].baseline.as_ref().unwrap().lat_us, 20.0);
        assert_eq!(s[0].ours.as_ref().unwrap().rounds, 3);
        assert!(table(&s).contains("allreduce"));
    }

    #[test]
    fn baseline_alone_has_no_ratios() {
        let s = summarise(&[row(1, "openmpi", 10.0, 10.0)]);
        assert_eq!(s[0].ours, None);
        assert_eq!(s[0].lat_ratio, None);
        let t = table(&s);
        assert!(t.lines().nth(1).unwrap().contains(" - "), "{t}");
    }

    #[test]
    fn sizes() {
        assert_eq!(human_bytes(8), "8 B");
        assert_eq!(human_bytes(65536), "64 KiB");
        assert_eq!(human_bytes(16 << 20), "16 MiB");
        assert_eq!(human_bytes(1536), "1536 B");
    }
}
