//! Operating-system glue: file-descriptor passing, wake-up events, sleeping, CPU pinning, the
//! CPU a socket's packets arrive on.
//!
//! Everything here is a thin, safe wrapper; the only unsafe operations are taking ownership of
//! the descriptors the kernel hands over with `SCM_RIGHTS` and `pidfd_open`, and reading
//! `SO_INCOMING_CPU`.

use core::fmt;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, ppoll};
use nix::sys::eventfd::EfdFlags;
use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use nix::sys::time::TimeSpec;

/// Most descriptors one message may carry that we accept.
pub(crate) const MAX_FDS: usize = 5;
/// Most descriptors the kernel passes in one message (`SCM_MAX_FD`): room for all of them means
/// none is ever dropped unseen (and leaked) by a truncated control buffer.
const SCM_MAX_FD: usize = 253;

/// A descriptor of process `pid` that becomes readable (to `poll`) once the process has ended
/// (`pidfd_open`, Linux 5.3 and later).
pub fn pidfd_open(pid: nix::unistd::Pid) -> nix::Result<OwnedFd> {
    // SAFETY: `pidfd_open(pid, 0)` reads and writes no memory of ours; it returns a new
    // descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid.as_raw(), 0) };
    if fd < 0 {
        return Err(Errno::last());
    }
    let fd = RawFd::try_from(fd).map_err(|_| Errno::EBADF)?;
    // SAFETY: the kernel just made `fd` for us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Sends `bytes` with `fds` attached (`SCM_RIGHTS`).
pub(crate) fn send_with_fds(
    stream: &UnixStream,
    bytes: &[u8],
    fds: &[BorrowedFd<'_>],
) -> nix::Result<()> {
    let raw: Vec<RawFd> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
    let cmsg = [ControlMessage::ScmRights(&raw)];
    let iov = [IoSlice::new(bytes)];
    let sent = sendmsg::<()>(
        stream.as_raw_fd(),
        &iov,
        &cmsg,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )?;
    if sent != bytes.len() {
        return Err(Errno::EMSGSIZE);
    }
    Ok(())
}

/// Receives one message into `buf`; returns its length and the descriptors it carried (at most
/// [`MAX_FDS`]; a message carrying more is refused with `EMSGSIZE`, its descriptors closed).
/// Setup only: allocates.
pub(crate) fn recv_with_fds(
    stream: &UnixStream,
    buf: &mut [u8],
) -> nix::Result<(usize, Vec<OwnedFd>)> {
    let mut iov = [IoSliceMut::new(buf)];
    let mut space = nix::cmsg_space!([RawFd; SCM_MAX_FD]);
    let msg = recvmsg::<()>(
        stream.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for cmsg in msg.cmsgs().map_err(|_| Errno::EMSGSIZE)? {
        if let ControlMessageOwned::ScmRights(raw) = cmsg {
            for fd in raw {
                // SAFETY: the kernel just installed `fd` in our table for this message; nothing
                // else in the process knows it, so we are its only owner.
                fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    if msg.flags.contains(MsgFlags::MSG_CTRUNC) || fds.len() > MAX_FDS {
        return Err(Errno::EMSGSIZE);
    }
    Ok((msg.bytes, fds))
}

/// A new non-blocking eventfd used to wake one end of a connection.
pub fn wake_event() -> nix::Result<OwnedFd> {
    nix::sys::eventfd::EventFd::from_value_and_flags(
        0,
        EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK,
    )
    .map(OwnedFd::from)
}

/// Wakes whoever sleeps on the eventfd `fd`. A full counter already means "wake up".
pub(crate) fn wake(fd: BorrowedFd<'_>) {
    let _ = nix::unistd::write(fd, &1u64.to_ne_bytes());
}

/// Resets the eventfd `fd` (non-blocking).
pub(crate) fn drain(fd: BorrowedFd<'_>) {
    let mut buf = [0u8; 8];
    let _ = nix::unistd::read(fd, &mut buf);
}

/// Why [`sleep`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Woke {
    /// The wake-up event fired.
    Event,
    /// The peer's socket hung up (or became readable, which it never does while the peer
    /// lives).
    HangUp,
    /// The timeout passed.
    Timeout,
}

const HANGUP: PollFlags = PollFlags::POLLIN
    .union(PollFlags::POLLHUP)
    .union(PollFlags::POLLERR);

/// Sleeps until `event` fires, `socket` hangs up, or `timeout` passes (`None`: no timeout).
pub(crate) fn sleep(
    event: BorrowedFd<'_>,
    socket: BorrowedFd<'_>,
    timeout: Option<Duration>,
) -> Woke {
    let mut fds = [
        PollFd::new(event, PollFlags::POLLIN),
        PollFd::new(socket, PollFlags::POLLIN),
    ];
    let timeout = timeout.map(TimeSpec::from_duration);
    match ppoll(&mut fds, timeout, None) {
        Ok(0) | Err(Errno::EINTR) => Woke::Timeout,
        Ok(_) => {
            let socket = fds[1].revents().unwrap_or(PollFlags::empty());
            if socket.intersects(HANGUP) {
                Woke::HangUp
            } else {
                Woke::Event
            }
        }
        // Polling two valid descriptors cannot fail otherwise; treat it as a lost peer rather
        // than spinning on the error.
        Err(_) => Woke::HangUp,
    }
}

/// Whether the peer's end of `socket` hung up. The peer never writes after the handshake, so
/// readable also means gone.
pub(crate) fn hung_up(socket: BorrowedFd<'_>) -> bool {
    let mut fds = [PollFd::new(socket, PollFlags::POLLIN)];
    match ppoll(
        &mut fds,
        Some(TimeSpec::from_duration(Duration::ZERO)),
        None,
    ) {
        Ok(0) | Err(Errno::EINTR) => false,
        Ok(_) => fds[0]
            .revents()
            .unwrap_or(PollFlags::empty())
            .intersects(HANGUP),
        Err(_) => true,
    }
}

/// The current thread could not be pinned to the requested core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PinError {
    /// The core asked for.
    pub core: usize,
    /// What the OS said.
    pub errno: Errno,
}

impl fmt::Display for PinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot pin this thread to CPU core {}: {} (is the core online and in this process's cpuset?)",
            self.core, self.errno
        )
    }
}

impl core::error::Error for PinError {}

/// The CPU that last processed packets arriving on socket `socket` (`SO_INCOMING_CPU`):
/// for a connection over loopback, the CPU its peer sends from. `None` before any arrived, or
/// where the kernel cannot tell.
pub fn socket_incoming_cpu(socket: BorrowedFd<'_>) -> Option<usize> {
    let mut cpu: libc::c_int = -1;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `socket` is an open descriptor for the call's duration (it is borrowed); `cpu`
    // and `len` are live locals, and `len` says how many bytes `cpu` holds.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_INCOMING_CPU,
            (&raw mut cpu).cast(),
            &raw mut len,
        )
    };
    usize::try_from(cpu).ok().filter(|_| rc == 0)
}

/// Pins the calling thread to one CPU core.
pub fn pin_current_thread(core: usize) -> Result<(), PinError> {
    // `core_affinity` indexes a fixed-size CPU set: a core past its end is refused here, as
    // the kernel refuses a core that does not exist.
    if core >= nix::sched::CpuSet::count() {
        return Err(PinError {
            core,
            errno: Errno::EINVAL,
        });
    }
    if core_affinity::set_for_current(core_affinity::CoreId { id: core }) {
        Ok(())
    } else {
        // It returns right after `sched_setaffinity` failed, so errno is that call's.
        Err(PinError {
            core,
            errno: Errno::last(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sched::{CpuSet, sched_getaffinity};
    use nix::unistd::Pid;

    /// Over loopback, a socket's packets arrive on the CPU its peer sends from.
    #[test]
    fn a_socket_knows_the_cpu_its_packets_arrive_on() {
        use std::io::{Read, Write};
        use std::os::fd::AsFd;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        let allowed = sched_getaffinity(Pid::from_raw(0)).unwrap();
        let cpus: Vec<usize> = (0..CpuSet::count())
            .filter(|&cpu| allowed.is_set(cpu).unwrap_or(false))
            .collect();
        let cpu = *cpus.last().unwrap();
        let mut client = std::thread::spawn(move || {
            pin_current_thread(cpu).unwrap();
            let mut client = client;
            client.write_all(b"x").unwrap();
            client
        })
        .join()
        .unwrap();
        let mut byte = [0u8; 1];
        server.read_exact(&mut byte).unwrap();
        assert_eq!(socket_incoming_cpu(server.as_fd()), Some(cpu));
        client.flush().unwrap();
    }

    #[test]
    fn a_thread_pins_to_one_allowed_core_and_an_impossible_core_is_an_error() {
        let allowed = sched_getaffinity(Pid::from_raw(0)).unwrap();
        let is_allowed = |core: usize| allowed.is_set(core).unwrap_or(false);
        let core = (0..CpuSet::count()).find(|&core| is_allowed(core)).unwrap();
        let missing = (0..CpuSet::count()).rev().find(|&core| !is_allowed(core));
        std::thread::spawn(move || {
            pin_current_thread(core).unwrap();
            let now = sched_getaffinity(Pid::from_raw(0)).unwrap();
            let pinned: Vec<usize> = (0..CpuSet::count())
                .filter(|&cpu| now.is_set(cpu).unwrap_or(false))
                .collect();
            assert_eq!(pinned, [core]);
            for core in missing.into_iter().chain([CpuSet::count(), usize::MAX]) {
                let error = pin_current_thread(core).unwrap_err();
                assert_eq!(
                    error,
                    PinError {
                        core,
                        errno: Errno::EINVAL
                    }
                );
            }
        })
        .join()
        .unwrap();
    }
}

/// Descriptors to sleep on together: the wake-up descriptors of host channels and plugins,
/// gathered each time a loop goes to sleep and polled in one system call.
///
/// The set keeps descriptor numbers, not borrows: a descriptor must stay open from
/// [`WakeSet::watch`] until the next [`WakeSet::sleep`] returns. One closed in between is
/// reported as ready (the kernel flags it invalid), so a sleeper never waits on it for nothing.
/// The set's storage grows to the most descriptors ever watched at once and is then reused:
/// sleeping allocates nothing.
#[derive(Debug, Default)]
pub struct WakeSet {
    fds: Vec<libc::pollfd>,
}

impl WakeSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Forgets every descriptor (keeps the storage).
    pub fn clear(&mut self) {
        self.fds.clear();
    }

    /// Wakes the next [`WakeSet::sleep`] when `fd` becomes readable or hangs up.
    pub fn watch(&mut self, fd: BorrowedFd<'_>) {
        self.watch_raw(fd.as_raw_fd());
    }

    /// [`WakeSet::watch`] by number, for descriptors a plugin lent across the ABI for this
    /// sleep.
    pub fn watch_raw(&mut self, fd: RawFd) {
        if fd < 0 || self.fds.iter().any(|watched| watched.fd == fd) {
            return;
        }
        self.fds.push(libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
    }

    /// How many descriptors are watched.
    pub fn len(&self) -> usize {
        self.fds.len()
    }

    /// Whether no descriptor is watched.
    pub fn is_empty(&self) -> bool {
        self.fds.is_empty()
    }

    /// Sleeps until a watched descriptor is readable (or hangs up, or was closed) or `timeout`
    /// passes; `true` when a descriptor woke it. A signal ends the sleep early (`false`). With
    /// no descriptor it sleeps the whole `timeout`.
    pub fn sleep(&mut self, timeout: Duration) -> bool {
        let timeout = libc::timespec {
            tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        for watched in &mut self.fds {
            watched.revents = 0;
        }
        // SAFETY: `fds` holds `len` initialized `pollfd`s, writable for the call (the kernel
        // writes only their `revents`); `timeout` is a valid timespec; no signal mask is
        // passed. Polling a descriptor number reads and writes no memory of the file's.
        let woke = unsafe {
            libc::ppoll(
                self.fds.as_mut_ptr(),
                self.fds.len() as libc::nfds_t,
                &timeout,
                std::ptr::null(),
            )
        };
        woke > 0
    }
}

#[cfg(test)]
mod wake_set_tests {
    use std::os::fd::AsFd;
    use std::time::Duration;

    use super::{WakeSet, drain, wake, wake_event};

    #[test]
    fn a_readable_descriptor_ends_the_sleep_and_a_quiet_one_does_not() {
        let quiet = wake_event().unwrap();
        let ringing = wake_event().unwrap();
        let mut set = WakeSet::new();
        set.watch(quiet.as_fd());
        assert!(!set.sleep(Duration::from_millis(1)), "nothing was readable");
        wake(ringing.as_fd());
        set.watch(ringing.as_fd());
        set.watch(ringing.as_fd());
        assert_eq!(set.len(), 2, "a descriptor is watched once");
        assert!(set.sleep(Duration::from_secs(60)));
        drain(ringing.as_fd());
        assert!(!set.sleep(Duration::ZERO), "drained: quiet again");
        set.clear();
        assert!(set.is_empty());
        assert!(
            !set.sleep(Duration::from_millis(1)),
            "an empty set sleeps the timeout"
        );
    }
}
