//! The operating-system glue of the collective plugin, and its only unsafe code: the shared
//! memory a rank registered (mapped here, copied to and from with bounds checked first), the
//! cross-memory attach to a rank's own buffers, and a rank's process descriptor (`pidfd`),
//! readable once that process exited.
//!
//! Bytes another process may write are never lent out as `&[u8]`: [`SharedMap`] copies them
//! into the caller's buffer and back.
#![allow(unsafe_code)]

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};

use memmap2::{MmapOptions, MmapRaw};
use nix::sys::uio::{RemoteIoVec, process_vm_readv, process_vm_writev};
use nix::unistd::Pid;

/// A shared-memory object a rank registered, mapped read-write.
pub struct SharedMap {
    // INVARIANTS: `map` is a shared mapping of exactly `len` bytes, valid until dropped.
    map: MmapRaw,
    len: usize,
}

/// Why a shared-memory object is refused.
#[derive(Debug)]
pub enum SharedOpenError {
    /// The name is empty, too long, or holds a `/` or a NUL.
    BadName,
    /// It cannot be opened or mapped.
    Io(io::Error),
    /// It belongs to another user, or others may open it.
    NotPrivate,
    /// It is shorter than the registration says.
    TooSmall,
}

impl SharedMap {
    /// Opens `/dev/shm/<name>` and maps its first `len` bytes, after checking that it is this
    /// user's, private to it (mode 0600 or stricter) and at least `len` long.
    pub fn open(name: &[u8], len: usize) -> Result<Self, SharedOpenError> {
        let name = std::str::from_utf8(name).map_err(|_| SharedOpenError::BadName)?;
        if name.is_empty() || name.contains('/') || name.contains('\0') || name.starts_with('.') {
            return Err(SharedOpenError::BadName);
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(format!("/dev/shm/{name}"))
            .map_err(SharedOpenError::Io)?;
        let meta = file.metadata().map_err(SharedOpenError::Io)?;
        if meta.uid() != nix::unistd::geteuid().as_raw() || meta.mode() & 0o077 != 0 {
            return Err(SharedOpenError::NotPrivate);
        }
        if meta.len() < len as u64 {
            return Err(SharedOpenError::TooSmall);
        }
        let map = MmapOptions::new()
            .len(len.max(1))
            .map_raw(&file)
            .map_err(SharedOpenError::Io)?;
        Ok(Self { map, len })
    }

    /// Copies `out.len()` bytes at `offset` into `out`; `false` when that range is not
    /// inside the mapping.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> bool {
        if !in_range(offset, out.len(), self.len) {
            return false;
        }
        let src = self.map.as_ptr().wrapping_add(offset as usize);
        // SAFETY: `offset..offset + out.len()` lies inside the mapping (checked above), which
        // stays mapped while `self` lives; `out` is a distinct, writable buffer of ours. The
        // mapped bytes may be written by the rank at the same time (a race it created); that
        // yields unspecified bytes in `out`, never an access outside either buffer.
        unsafe { core::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len()) };
        true
    }

    /// Copies `data` to `offset`; `false` when that range is not inside the mapping.
    pub fn write(&self, offset: u64, data: &[u8]) -> bool {
        if !in_range(offset, data.len(), self.len) {
            return false;
        }
        let dst = self.map.as_mut_ptr().wrapping_add(offset as usize);
        // SAFETY: as in `read`: the range lies inside the writable shared mapping, and `data`
        // is our own buffer, distinct from it.
        unsafe { core::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
        true
    }

    /// Copies `len` bytes at `offset` straight into `dst` at `dst_offset` (one copy, no
    /// scratch); `false` when either range is not inside its mapping.
    pub fn copy_to(&self, offset: u64, dst: &SharedMap, dst_offset: u64, len: usize) -> bool {
        if !in_range(offset, len, self.len) || !in_range(dst_offset, len, dst.len) {
            return false;
        }
        let src = self.map.as_ptr().wrapping_add(offset as usize);
        let to = dst.map.as_mut_ptr().wrapping_add(dst_offset as usize);
        // SAFETY: both ranges lie inside their mappings (checked above), which stay mapped
        // while `self` and `dst` live. `copy` (memmove) allows the ranges to overlap, as they
        // may when both are one mapping. The ranks may write the bytes meanwhile (a race they
        // created): unspecified bytes, never an access outside either mapping.
        unsafe { core::ptr::copy(src, to, len) };
        true
    }

    /// Copies `len` bytes from address `addr` of process `pid` straight into this mapping at
    /// `offset` (`process_vm_readv` into the mapping).
    pub fn cma_read_into(
        &self,
        pid: u32,
        addr: u64,
        offset: u64,
        len: usize,
    ) -> Result<(), CrossMemoryError> {
        if len == 0 {
            return Ok(());
        }
        if !in_range(offset, len, self.len) {
            return Err(CrossMemoryError::Failed);
        }
        let local = libc::iovec {
            iov_base: self.map.as_mut_ptr().wrapping_add(offset as usize).cast(),
            iov_len: len,
        };
        let remote = libc::iovec {
            iov_base: addr as usize as *mut libc::c_void,
            iov_len: len,
        };
        // SAFETY: `local` describes `len` bytes inside this writable mapping (checked above),
        // mapped while `self` lives; the kernel writes at most that many bytes there and reads
        // the other process's memory, never ours. `remote` is only an address in `pid`.
        let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
        cma_result(n, len)
    }

    /// Copies `len` bytes of this mapping at `offset` straight to address `addr` of process
    /// `pid` (`process_vm_writev` from the mapping).
    pub fn cma_write_from(
        &self,
        pid: u32,
        addr: u64,
        offset: u64,
        len: usize,
    ) -> Result<(), CrossMemoryError> {
        if len == 0 {
            return Ok(());
        }
        if !in_range(offset, len, self.len) {
            return Err(CrossMemoryError::Failed);
        }
        let local = libc::iovec {
            iov_base: self.map.as_mut_ptr().wrapping_add(offset as usize).cast(),
            iov_len: len,
        };
        let remote = libc::iovec {
            iov_base: addr as usize as *mut libc::c_void,
            iov_len: len,
        };
        // SAFETY: `local` describes `len` bytes inside this mapping (checked above), mapped
        // while `self` lives, which the kernel only reads; it writes only `pid`'s memory.
        let n = unsafe { libc::process_vm_writev(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
        cma_result(n, len)
    }
}

fn cma_result(n: isize, want: usize) -> Result<(), CrossMemoryError> {
    if n < 0 {
        return Err(cma_error(nix::Error::last()));
    }
    if n as usize == want {
        Ok(())
    } else {
        Err(CrossMemoryError::Failed)
    }
}

fn in_range(offset: u64, len: usize, size: usize) -> bool {
    offset
        .checked_add(len as u64)
        .is_some_and(|end| end <= size as u64)
}

/// Why a cross-memory copy failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrossMemoryError {
    /// The kernel refused (`EPERM`: Yama, a container's seccomp profile, another user).
    Denied,
    /// The process is gone (`ESRCH`).
    Gone,
    /// Another failure (a bad address: `EFAULT`, or a short copy).
    Failed,
}

fn cma_error(errno: nix::Error) -> CrossMemoryError {
    match errno {
        nix::Error::EPERM | nix::Error::ENOSYS | nix::Error::EACCES => CrossMemoryError::Denied,
        nix::Error::ESRCH => CrossMemoryError::Gone,
        _ => CrossMemoryError::Failed,
    }
}

/// Copies `out.len()` bytes from address `addr` of process `pid` into `out`.
pub fn cma_read(pid: u32, addr: u64, out: &mut [u8]) -> Result<(), CrossMemoryError> {
    if out.is_empty() {
        return Ok(());
    }
    let want = out.len();
    let remote = [RemoteIoVec {
        base: addr as usize,
        len: want,
    }];
    let mut local = [IoSliceMut::new(out)];
    match process_vm_readv(Pid::from_raw(pid as i32), &mut local, &remote) {
        Ok(n) if n == want => Ok(()),
        Ok(_) => Err(CrossMemoryError::Failed),
        Err(e) => Err(cma_error(e)),
    }
}

/// Copies `data` to address `addr` of process `pid`.
pub fn cma_write(pid: u32, addr: u64, data: &[u8]) -> Result<(), CrossMemoryError> {
    if data.is_empty() {
        return Ok(());
    }
    let remote = [RemoteIoVec {
        base: addr as usize,
        len: data.len(),
    }];
    let local = [IoSlice::new(data)];
    match process_vm_writev(Pid::from_raw(pid as i32), &local, &remote) {
        Ok(n) if n == data.len() => Ok(()),
        Ok(_) => Err(CrossMemoryError::Failed),
        Err(e) => Err(cma_error(e)),
    }
}

/// A process descriptor: readable once the process exited.
pub struct PidFd(OwnedFd);

impl PidFd {
    /// The descriptor of process `pid`; `None` where the kernel has no `pidfd_open` (before
    /// 5.3) or the process is already gone.
    pub fn open(pid: u32) -> Option<Self> {
        // SAFETY: `pidfd_open(pid, 0)` takes two integers and returns a new descriptor or -1;
        // it touches no memory of ours.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        let fd = i32::try_from(fd).ok().filter(|fd| *fd >= 0)?;
        // SAFETY: `fd` is a descriptor the kernel just opened for us, owned by nothing else.
        Some(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Whether the process exited (its descriptor is readable).
    pub fn exited(&self) -> bool {
        let mut fds = [nix::poll::PollFd::new(
            self.0.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        matches!(
            nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO),
            Ok(n) if n > 0
        )
    }

    /// The descriptor, for the worker to sleep on.
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl std::fmt::Debug for PidFd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PidFd({})", self.0.as_raw_fd())
    }
}

/// Helper threads that run the parts of one step in parallel with the worker's thread, each
/// pinned to one core of the worker's cpuset (see [`Pool::start`]).
///
/// [`Pool::run`] publishes a job (a closure over part indexes) and takes parts itself; each
/// part is claimed exactly once, by whichever thread gets to it first, so a helper that is not
/// running (a busy or oversubscribed core) never holds the step up: the worker's thread then
/// runs its parts. An idle helper spins briefly for the next job, then parks (a futex), so an
/// idle worker costs nothing.
pub struct Pool {
    shared: std::sync::Arc<PoolShared>,
    helpers: Vec<std::thread::JoinHandle<()>>,
}

/// What the worker's thread and the helpers share.
struct PoolShared {
    /// `epoch << 16 | next part << 8 | parts`: a job is claimed part by part with a
    /// compare-and-swap on this word, so a helper late for one job cannot claim a part of the
    /// next with the previous job's closure.
    word: std::sync::atomic::AtomicU64,
    /// Points at the current job's `&dyn Fn(usize) + Sync`, on the stack of [`Pool::run`].
    job: std::sync::atomic::AtomicPtr<()>,
    /// Parts of the current job finished.
    done: std::sync::atomic::AtomicUsize,
    /// Whether a part panicked.
    panicked: std::sync::atomic::AtomicBool,
    /// Per helper: parked, to be unparked by the next job.
    parked: Vec<std::sync::atomic::AtomicBool>,
    stop: std::sync::atomic::AtomicBool,
}

/// The most parts of one job (the `parts` field of [`PoolShared::word`] is 8 bits).
pub const MAX_PARTS: usize = 64;

/// How long an idle helper spins before it parks: the next step of a large collective, or the
/// next large collective of a loop, comes sooner.
const IDLE_SPIN: std::time::Duration = std::time::Duration::from_micros(50);

type Job<'a> = &'a (dyn Fn(usize) + Sync);

impl PoolShared {
    /// Claims the next part of job `epoch`; `None` when all are claimed or the job changed.
    fn claim(&self, epoch: u64) -> Option<usize> {
        use std::sync::atomic::Ordering::*;
        let mut word = self.word.load(Acquire);
        loop {
            let (e, next, parts) = (word >> 16, (word >> 8) & 0xff, word & 0xff);
            if e != epoch || next >= parts {
                return None;
            }
            match self
                .word
                .compare_exchange_weak(word, word + (1 << 8), AcqRel, Acquire)
            {
                Ok(_) => return Some(next as usize),
                Err(now) => word = now,
            }
        }
    }

    /// Runs part `part` of the job published with the epoch it was claimed under.
    fn run_part(&self, part: usize) {
        use std::sync::atomic::Ordering::*;
        let job = self.job.load(Acquire).cast::<Job<'static>>().cast_const();
        // SAFETY: the part was claimed under the current epoch (`claim`), and `Pool::run`
        // published `job` (a pointer to its local `&dyn Fn`) before that epoch and does not
        // return, nor let the closure go, until `done` counts every part, this one included
        // (incremented below, after the call). So the pointer and the closure it points to
        // are alive here. The lifetime written `'static` is never relied upon past that.
        let f: Job<'_> = unsafe { *job };
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(part))).is_ok();
        if !ok {
            self.panicked.store(true, Relaxed);
        }
        self.done.fetch_add(1, Release);
    }
}

impl Pool {
    /// Starts one helper per core of `cores` after the first, each pinned to its core, and
    /// pins the calling thread (the worker's) to the first, so that it never shares a helper's
    /// core while another stays idle. `None` with fewer than two cores.
    pub fn start(cores: &[usize]) -> Option<Self> {
        use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize};
        let cores = &cores[..cores.len().min(MAX_PARTS)];
        if cores.len() < 2 {
            return None;
        }
        let _ = pin(cores[0]);
        let shared = std::sync::Arc::new(PoolShared {
            word: AtomicU64::new(0),
            job: AtomicPtr::new(core::ptr::null_mut()),
            done: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            parked: (1..cores.len()).map(|_| AtomicBool::new(false)).collect(),
            stop: AtomicBool::new(false),
        });
        let mut helpers = Vec::with_capacity(cores.len() - 1);
        for (i, &core) in cores[1..].iter().enumerate() {
            let shared = shared.clone();
            let helper = std::thread::Builder::new()
                .name(format!("coll-helper-{i}"))
                .spawn(move || {
                    let _ = pin(core);
                    helper(&shared, i);
                });
            match helper {
                Ok(handle) => helpers.push(handle),
                Err(_) => break,
            }
        }
        Some(Self { shared, helpers })
    }

    /// Threads a job runs on: the helpers and the caller.
    pub fn threads(&self) -> usize {
        self.helpers.len() + 1
    }

    /// Runs `f(0)`, ..., `f(parts - 1)`, each once, on the helpers and the calling thread;
    /// returns once all returned. The parts must touch disjoint memory where they write (the
    /// engine gives each a disjoint byte range of the step, and its own scratch).
    pub fn run(&self, parts: usize, f: &(dyn Fn(usize) + Sync)) {
        use std::sync::atomic::Ordering::*;
        let parts = parts.min(MAX_PARTS);
        if parts == 0 {
            return;
        }
        let shared = &*self.shared;
        let job: Job<'_> = f;
        shared.done.store(0, Relaxed);
        shared
            .job
            .store((&raw const job).cast_mut().cast(), Release);
        let epoch = (shared.word.load(Relaxed) >> 16) + 1;
        shared.word.store(epoch << 16 | parts as u64, SeqCst);
        for (i, handle) in self.helpers.iter().enumerate().take(parts - 1) {
            if shared.parked[i].load(SeqCst) {
                handle.thread().unpark();
            }
        }
        while let Some(part) = shared.claim(epoch) {
            shared.run_part(part);
        }
        let mut spins = 0u32;
        while shared.done.load(Acquire) < parts {
            spins += 1;
            if spins % 1024 == 0 {
                std::thread::yield_now();
            } else {
                core::hint::spin_loop();
            }
        }
        shared.job.store(core::ptr::null_mut(), Release);
        if shared.panicked.swap(false, Relaxed) {
            panic!("a part of a parallel step panicked");
        }
    }
}

fn helper(shared: &PoolShared, index: usize) {
    use std::sync::atomic::Ordering::*;
    let mut seen = 0u64;
    loop {
        let idle = std::time::Instant::now();
        let mut spins = 0u32;
        let epoch = loop {
            if shared.stop.load(Relaxed) {
                return;
            }
            let epoch = shared.word.load(Acquire) >> 16;
            if epoch != seen {
                break epoch;
            }
            spins = spins.wrapping_add(1);
            if spins % 64 != 0 || idle.elapsed() < IDLE_SPIN {
                core::hint::spin_loop();
                continue;
            }
            shared.parked[index].store(true, SeqCst);
            if shared.word.load(SeqCst) >> 16 == seen && !shared.stop.load(SeqCst) {
                std::thread::park();
            }
            shared.parked[index].store(false, SeqCst);
        };
        seen = epoch;
        while let Some(part) = shared.claim(epoch) {
            shared.run_part(part);
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared
            .stop
            .store(true, std::sync::atomic::Ordering::SeqCst);
        for handle in self.helpers.drain(..) {
            handle.thread().unpark();
            let _ = handle.join();
        }
    }
}

/// Pins the calling thread to `core`.
fn pin(core: usize) -> nix::Result<()> {
    let mut set = nix::sched::CpuSet::new();
    set.set(core)?;
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
}

/// The number of online CPUs of the machine, if known.
pub fn online_cpus() -> Option<usize> {
    nix::unistd::sysconf(nix::unistd::SysconfVar::_NPROCESSORS_ONLN)
        .ok()
        .flatten()
        .and_then(|n| usize::try_from(n).ok())
}

/// The cores this process may run on (its cpuset), in order.
pub fn allowed_cores() -> Vec<usize> {
    match nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)) {
        Ok(set) => (0..nix::sched::CpuSet::count())
            .filter(|&c| set.is_set(c).unwrap_or(false))
            .collect(),
        Err(_) => Vec::new(),
    }
}
