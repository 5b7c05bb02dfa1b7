//! Operating-system glue that needs unsafe code: starting a program as another user.
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
