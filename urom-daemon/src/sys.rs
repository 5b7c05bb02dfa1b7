//! Operating-system glue that needs unsafe code: starting a program as another user, with
//! none of the daemon's descriptors.
#![allow(unsafe_code)]

use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::unistd::{Gid, Uid, setgid, setgroups, setuid};

/// The identity a program is started with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Credentials {
    /// Its user.
    pub uid: Uid,
    /// Its group.
    pub gid: Gid,
    /// Its supplementary groups.
    pub groups: Vec<Gid>,
}

/// Makes `command` take on `credentials` in the child, before the program is executed:
/// supplementary groups first, then the group, then the user, while the child still may. Run by
/// root, `setuid` sets the real, effective and saved user ids, so the program cannot become root
/// again, and a program whose user is not root starts without capabilities. A failure fails
/// the spawn.
pub(crate) fn run_as(command: &mut Command, credentials: Credentials) {
    let Credentials { uid, gid, groups } = credentials;
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe functions may be used: it makes three system calls through nix's thin
    // wrappers, allocates nothing (the group list was built before the fork and is only read)
    // and takes no lock.
    unsafe {
        command.pre_exec(move || {
            setgroups(&groups)?;
            setgid(gid)?;
            setuid(uid)?;
            Ok(())
        });
    }
}

/// Makes `command`'s program start with only the descriptors it is handed (standard input,
/// output and error): every other descriptor the daemon holds when it forks (a host's
/// connection, a listening socket, another worker's link) is marked close-on-exec in the child,
/// whoever opened it and however. Where the kernel lacks `close_range` (before 5.11), each
/// descriptor below the open-file limit is marked instead.
pub(crate) fn close_inherited(command: &mut Command) {
    use nix::sys::resource::{Resource, getrlimit};

    let open_files = getrlimit(Resource::RLIMIT_NOFILE).map_or(1 << 20, |(soft, _)| soft);
    let last = i32::try_from(open_files).unwrap_or(i32::MAX);
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe functions may be used: it makes `close_range` or `fcntl` system calls
    // only, allocates nothing and takes no lock. Marking instead of closing keeps the
    // descriptor through which the standard library reports a failed exec.
    unsafe {
        command.pre_exec(move || {
            mark_close_on_exec_from_3(last);
            Ok(())
        });
    }
}

/// Marks every descriptor from 3 up close-on-exec: with one `close_range`, else one by one
/// below `last`. Async-signal-safe.
fn mark_close_on_exec_from_3(last: i32) {
    use nix::libc;

    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets descriptor flags.
    let marked = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if marked != 0 {
        for fd in 3..last {
            // SAFETY: sets a flag of a descriptor that may not be open (EBADF then).
            unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        }
    }
}
