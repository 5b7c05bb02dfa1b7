//! CPU time: this process's (`getrusage(RUSAGE_SELF)`, all its threads) and another process's by
//! pid (`/proc/<pid>/stat`), for a worker that serves the ranks.

use std::time::Duration;

/// User plus system CPU time of this process so far, all threads counted.
pub fn self_cpu() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a whole `rusage` into the pointer it is given, which points at
    // one; RUSAGE_SELF is a valid `who`.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    assert_eq!(rc, 0, "getrusage(RUSAGE_SELF) failed");
    // SAFETY: getrusage returned 0, so it filled the struct (which was zeroed before anyway).
    let usage = unsafe { usage.assume_init() };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// The same total as [`self_cpu`] (user plus system, all threads: the process's CPU clock) at
/// nanosecond resolution, from `clock_gettime(CLOCK_PROCESS_CPUTIME_ID)`; fine enough to time
/// one collective of a microsecond.
pub fn self_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the pointer, which points at one.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_PROCESS_CPUTIME_ID) failed");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// What reading [`self_cpu_ns`] twice costs in CPU time, in nanoseconds (the median of many
/// pairs): subtracted from each collective's reading.
pub fn self_cpu_overhead_ns() -> u64 {
    let mut pairs: Vec<f64> = (0..201)
        .map(|_| {
            let a = self_cpu_ns();
            (self_cpu_ns() - a) as f64
        })
        .collect();
    crate::stats::median(&mut pairs) as u64
}

/// User plus system CPU time of process `pid` so far (all its threads): its CPU clock
/// (`clock_getcpuclockid`, nanoseconds, fine enough for a worker's microsecond per small
/// collective), else `/proc/<pid>/stat` in clock ticks' resolution (`sysconf(_SC_CLK_TCK)`,
/// usually 10 ms); `None` when the process is gone or neither can be read.
pub fn process_cpu(pid: u32) -> Option<Duration> {
    if let Some(ns) = process_cpu_clock_ns(pid) {
        return Some(Duration::from_nanos(ns));
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat_ticks(&stat).map(ticks_to_duration)
}

/// The CPU clock of process `pid`, in nanoseconds.
fn process_cpu_clock_ns(pid: u32) -> Option<u64> {
    let pid = libc::pid_t::try_from(pid).ok()?;
    let mut clock: libc::clockid_t = 0;
    // SAFETY: clock_getcpuclockid writes one clockid_t into the pointer, which points at one.
    if unsafe { libc::clock_getcpuclockid(pid, &mut clock) } != 0 {
        return None;
    }
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the pointer, which points at one.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return None;
    }
    Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

/// utime + stime, in clock ticks, from the text of a `/proc/<pid>/stat` file. The command name
/// (field 2) is in parentheses and may hold spaces: fields are counted after its last `)`.
pub fn parse_stat_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // After the name: state is field 3; utime and stime are fields 14 and 15.
    let mut fields = rest.split_ascii_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

fn ticks_to_duration(ticks: u64) -> Duration {
    // SAFETY: sysconf only reads a configuration value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = if hz > 0 { hz as u64 } else { 100 };
    Duration::from_nanos(ticks.saturating_mul(1_000_000_000) / hz)
}

/// The summed CPU time of `pids` (each process's own, gone ones counted as zero).
pub fn processes_cpu(pids: &[u32]) -> Duration {
    pids.iter().filter_map(|&pid| process_cpu(pid)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_after_a_name_with_spaces() {
        let stat = "1234 (a (b) c) S 1 1234 1234 0 -1 4194560 100 0 0 0 7 5 0 0 20 0 1 0 99 0 0";
        assert_eq!(parse_stat_ticks(stat), Some(12));
        assert_eq!(parse_stat_ticks("garbage"), None);
    }

    #[test]
    fn own_cpu_grows_and_proc_agrees() {
        let before = self_cpu();
        let mut x = 1u64;
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        assert!(self_cpu() > before);
        let ns = self_cpu_ns();
        assert!(
            ns >= before.as_nanos() as u64,
            "{ns} ns, getrusage said {before:?} before"
        );
        assert!(self_cpu_overhead_ns() < 100_000);
        let proc_cpu = process_cpu(std::process::id()).expect("own /proc stat");
        assert!(proc_cpu >= Duration::from_millis(20), "{proc_cpu:?}");
    }
}
