//! The host side's operating-system glue and its only unsafe code: mapping the shared-memory
//! buffers urom allocates, and granting the node's worker cross-memory attach under Yama.
#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::path::PathBuf;

use memmap2::MmapMut;

/// A shared-memory object of this user (mode 0600) under `/dev/shm`, mapped read-write. Its
/// name is removed by [`SharedFile::unlink`] once the worker opened it.
pub struct SharedFile {
    /// The mapping.
    pub map: MmapMut,
    path: PathBuf,
    /// The name the worker opens.
    pub name: String,
}

impl SharedFile {
    /// Creates `/dev/shm/<name>` (it must not exist) of `len` bytes and maps it.
    pub fn create(name: String, len: usize) -> io::Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = PathBuf::from("/dev/shm").join(&name);
        let file: File = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)?;
        let mapped = file.set_len(len as u64).and_then(|()| {
            // SAFETY: the file was just created by us (O_EXCL, mode 0600) and is mapped
            // shared; only the node's worker, running as this user, opens it besides us, and it
            // writes into it only while a collective using the buffer runs, during which the
            // host library lends no reference to its bytes (the buffer is busy). Its length is
            // fixed above and never truncated, so the mapping stays backed.
            unsafe { memmap2::MmapOptions::new().len(len.max(1)).map_mut(&file) }
        });
        match mapped {
            Ok(map) => Ok(Self { map, path, name }),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                Err(e)
            }
        }
    }

    /// Removes the name; the mappings stay.
    pub fn unlink(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for SharedFile {
    fn drop(&mut self) {
        self.unlink();
    }
}

/// Yama's `ptrace_scope`, when Yama is there.
pub fn ptrace_scope() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// Lets process `pid` attach to this one (`PR_SET_PTRACER`), as Yama's scope 1 requires for
/// cross-memory attach by a process that is not an ancestor.
pub fn set_ptracer(pid: u32) -> io::Result<()> {
    // SAFETY: `prctl(PR_SET_PTRACER, pid)` takes integers only and changes only who may
    // attach to this process.
    let rc = unsafe { libc::prctl(libc::PR_SET_PTRACER, libc::c_ulong::from(pid), 0, 0, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
