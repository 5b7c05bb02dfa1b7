//! The processes tests start, seen through `/proc`: a daemon's workers by id, whether a process
//! still runs, its user and open files; and signals to them.

use std::path::Path;

use nix::sys::signal::kill;
use nix::unistd::Pid;

pub use nix::sys::signal::Signal;

/// The command line of `pid`, one string per argument; empty once it has gone.
pub fn cmdline(pid: i32) -> Vec<String> {
    let bytes = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    bytes
        .split(|&b| b == 0)
        .filter(|arg| !arg.is_empty())
        .map(|arg| String::from_utf8_lossy(arg).into_owned())
        .collect()
}

/// The state letter and parent of `pid` from `/proc/<pid>/stat`.
fn state_and_parent(pid: i32) -> Option<(char, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid ...`; the name may hold spaces and parentheses.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let parent = fields.next()?.parse().ok()?;
    Some((state, parent))
}

/// The processes whose parent is `parent`.
pub fn children(parent: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| state_and_parent(pid).is_some_and(|(_, ppid)| ppid == parent))
        .collect()
}

/// The worker process with id `worker_id` that the daemon `daemon_pid` started: a child of the
/// daemon running `urom-worker ... --id <worker_id>`.
pub fn worker_pid(daemon_pid: i32, worker_id: u64) -> Option<i32> {
    let id = worker_id.to_string();
    children(daemon_pid).into_iter().find(|&pid| {
        let args = cmdline(pid);
        let is_worker = args.first().is_some_and(|program| {
            Path::new(program)
                .file_name()
                .is_some_and(|name| name == "urom-worker")
        });
        is_worker
            && args
                .windows(2)
                .any(|pair| pair[0] == "--id" && pair[1] == id)
    })
}

/// Whether `pid` runs (and is not a zombie waiting to be reaped).
pub fn alive(pid: i32) -> bool {
    state_and_parent(pid).is_some_and(|(state, _)| state != 'Z' && state != 'X')
}

/// Whether `pid` is stopped by a signal (`SIGSTOP`): it runs nothing until `SIGCONT`.
pub fn stopped(pid: i32) -> bool {
    state_and_parent(pid).is_some_and(|(state, _)| state == 'T')
}

/// The real user of `pid`.
pub fn uid(pid: i32) -> Option<u32> {
    status_line(pid, "Uid")?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// How many files `pid` holds open.
pub fn open_files(pid: i32) -> Option<usize> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count())
}

/// Raises this process's soft limit on open files to hold `files`, if the hard limit allows;
/// whether it holds them now.
pub fn raise_open_file_limit(files: u64) -> bool {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return false;
    };
    soft >= files || (hard >= files && setrlimit(Resource::RLIMIT_NOFILE, files, hard).is_ok())
}

/// What follows `key:` on its line of `/proc/<pid>/status`, trimmed; `None` when the process
/// or the line is not there.
pub fn status_line(pid: i32, key: &str) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|line| {
        let value = line.strip_prefix(key)?.strip_prefix(':')?;
        Some(value.trim().to_owned())
    })
}

/// The values of the `/proc/<pid>/status` line `key`, split at white space; panics when the
/// process or the line is not there.
pub fn status_values(pid: i32, key: &str) -> Vec<String> {
    status_line(pid, key)
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"))
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// How many threads `pid` runs.
pub fn threads(pid: i32) -> usize {
    status_values(pid, "Threads")[0]
        .parse()
        .expect("a thread count")
}

/// The worker processes the daemon `daemon_pid` runs.
pub fn workers_of(daemon_pid: i32) -> Vec<i32> {
    children(daemon_pid)
        .into_iter()
        .filter(|&pid| {
            cmdline(pid)
                .first()
                .is_some_and(|p| p.ends_with("urom-worker"))
        })
        .collect()
}

/// Sends `signal` to `pid`; panics if it cannot be sent.
pub fn signal(pid: i32, signal: Signal) {
    kill(Pid::from_raw(pid), signal).unwrap_or_else(|e| panic!("kill -{signal} {pid}: {e}"));
}
