//! The results line: one per round, implementation, collective and size, tab-separated, printed
//! by rank 0. Lines starting with `#` are comments (the header, the library, the placement).

use crate::kind::Kind;

/// The column names, in order, as the header line lists them after its `#`.
pub const COLUMNS: [&str; 14] = [
    "round",
    "impl",
    "coll",
    "bytes",
    "ranks",
    "iters",
    "lat_us",
    "pure_us",
    "total_us",
    "compute_us",
    "overlap_pct",
    "cpu_us",
    "cpu_loop_us",
    "worker_cpu_us",
];

/// The header line.
pub fn header() -> String {
    format!("#{}", COLUMNS.join("\t"))
}

/// One collective and size, measured by one implementation in one round. Times are the medians
/// over the iterations of each rank, averaged over the ranks.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// Round number (1-based), so that ratios pair measurements of the same round.
    pub round: u32,
    /// Implementation: `openmpi` or `urom`.
    pub implementation: String,
    /// The collective.
    pub kind: Kind,
    /// Message size in bytes (see [`Kind`]).
    pub bytes: usize,
    /// Ranks taking part.
    pub ranks: usize,
    /// Timed iterations of each loop.
    pub iters: usize,
    /// Blocking latency: start and wait (Open MPI: the blocking collective), microseconds.
    pub lat_us: f64,
    /// The non-blocking collective alone, post and wait (t_pure), microseconds.
    pub pure_us: f64,
    /// Post, compute, wait (t_total), microseconds.
    pub total_us: f64,
    /// The compute part of it (t_compute), microseconds.
    pub compute_us: f64,
    /// max(0, 100 - 100 (t_total - t_compute) / t_pure).
    pub overlap_pct: f64,
    /// CPU time (user + system, all the rank's threads: the process's CPU clock) per blocking
    /// collective, microseconds: the median over the latency loop's collectives, each timed on
    /// its own.
    pub cpu_us: f64,
    /// CPU time per blocking collective from `getrusage` over back-to-back collectives (batches
    /// of them, the median over the batches), microseconds. On a machine shared with other work
    /// this one also counts a rank spinning while its peer is off its core.
    pub cpu_loop_us: f64,
    /// CPU time of the workers serving the ranks, all of them together, per collective; `None`
    /// when the implementation has no worker process.
    pub worker_cpu_us: Option<f64>,
}

/// OSU's overlap, in percent, from the pure, total and compute times.
pub fn overlap_pct(pure: f64, total: f64, compute: f64) -> f64 {
    if pure <= 0.0 {
        return 0.0;
    }
    (100.0 - 100.0 * (total - compute) / pure).max(0.0)
}

impl Row {
    /// The tab-separated line.
    pub fn to_line(&self) -> String {
        let worker = match self.worker_cpu_us {
            Some(v) => format!("{v:.3}"),
            None => "-".to_string(),
        };
        format!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{:.3}\t{:.3}\t{:.3}\t{:.3}\t{:.2}\t{:.3}\t{:.3}\t{}",
            self.round,
            self.implementation,
            self.kind,
            self.bytes,
            self.ranks,
            self.iters,
            self.lat_us,
            self.pure_us,
            self.total_us,
            self.compute_us,
            self.overlap_pct,
            self.cpu_us,
            self.cpu_loop_us,
            worker
        )
    }

    /// Parses a line [`Row::to_line`] wrote; `Ok(None)` for a comment or blank line.
    pub fn parse(line: &str) -> Result<Option<Row>, String> {
        let line = line.trim_end();
        if line.is_empty() || line.starts_with('#') {
            return Ok(None);
        }
        let f: Vec<&str> = line.split('\t').collect();
        if f.len() != COLUMNS.len() {
            return Err(format!(
                "{} fields, expected {}: {line:?}",
                f.len(),
                COLUMNS.len()
            ));
        }
        let num = |i: usize| -> Result<f64, String> {
            f[i].parse::<f64>()
                .map_err(|e| format!("{}: {e} in {:?}", COLUMNS[i], f[i]))
        };
        let int = |i: usize| -> Result<usize, String> {
            f[i].parse::<usize>()
                .map_err(|e| format!("{}: {e} in {:?}", COLUMNS[i], f[i]))
        };
        Ok(Some(Row {
            round: int(0)? as u32,
            implementation: f[1].to_string(),
            kind: Kind::parse(f[2]).ok_or_else(|| format!("unknown collective {:?}", f[2]))?,
            bytes: int(3)?,
            ranks: int(4)?,
            iters: int(5)?,
            lat_us: num(6)?,
            pure_us: num(7)?,
            total_us: num(8)?,
            compute_us: num(9)?,
            overlap_pct: num(10)?,
            cpu_us: num(11)?,
            cpu_loop_us: num(12)?,
            worker_cpu_us: if f[13] == "-" { None } else { Some(num(13)?) },
        }))
    }

    /// Every row of a results file's text.
    pub fn parse_all(text: &str) -> Result<Vec<Row>, String> {
        let mut rows = Vec::new();
        for (n, line) in text.lines().enumerate() {
            if let Some(row) = Row::parse(line).map_err(|e| format!("line {}: {e}", n + 1))? {
                rows.push(row);
            }
        }
        Ok(rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_round_trip() {
        let row = Row {
            round: 2,
            implementation: "openmpi".into(),
            kind: Kind::Alltoall,
            bytes: 65536,
            ranks: 2,
            iters: 100,
            lat_us: 12.5,
            pure_us: 13.0,
            total_us: 25.0,
            compute_us: 13.0,
            overlap_pct: overlap_pct(13.0, 25.0, 13.0),
            cpu_us: 12.0,
            cpu_loop_us: 14.0,
            worker_cpu_us: None,
        };
        let text = format!("{}\n# a comment\n{}\n", header(), row.to_line());
        let rows = Row::parse_all(&text).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].kind, Kind::Alltoall);
        assert_eq!(rows[0].worker_cpu_us, None);
        assert!((rows[0].overlap_pct - 7.69).abs() < 0.01);
        let with_worker = Row {
            worker_cpu_us: Some(3.25),
            ..row
        };
        assert_eq!(
            Row::parse(&with_worker.to_line())
                .unwrap()
                .unwrap()
                .worker_cpu_us,
            Some(3.25)
        );
        assert!(Row::parse("1\t2").is_err());
    }

    #[test]
    fn overlap_definition() {
        // No overlap at all: total = compute + pure.
        assert_eq!(overlap_pct(10.0, 20.0, 10.0), 0.0);
        // Full overlap: total = compute.
        assert_eq!(overlap_pct(10.0, 10.0, 10.0), 100.0);
        // Worse than none is 0.
        assert_eq!(overlap_pct(10.0, 30.0, 10.0), 0.0);
    }
}
