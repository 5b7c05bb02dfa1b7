//! Helpers for urom's tests.
//!
//! `cargo test` builds a package's `rlib` but not its `cdylib`, so tests that load a plugin
//! build the plugin library themselves with [`cdylib`], into the same target directory and
//! profile as the running test.
//!
//! [`daemon`] starts a real daemon, [`control`] talks to it frame by frame, [`host`] drives it
//! through the host library, [`worker`] starts a worker process and talks to it over a bare
//! shared-memory channel, [`process`] finds and signals the processes they start.
#![deny(unsafe_code)]

// urom's own crates are left out under loom, which checks urom-transport's ring alone.
#[cfg(not(loom))]
pub mod control;
pub mod counting;
pub mod daemon;
pub mod docs_flags;
#[cfg(not(loom))]
pub mod domain;
pub mod golden;
#[cfg(not(loom))]
pub mod host;
pub mod netns;
pub mod process;
#[cfg(not(loom))]
pub mod worker;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

/// The profile directory of the running test binary (`target/debug`, `target/release`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    // Test binaries live in `<target>/<profile>/deps/`.
    exe.parent()
        .and_then(Path::parent)
        .expect("test binary outside a cargo target directory")
        .to_owned()
}

/// The file where tests that could not run here say so: `<target>/skipped-tests.log`, one line
/// each (the test, then why). `.ci/run` empties it first and prints it last, so that a skip is
/// counted and seen, never mistaken for a pass.
pub fn skipped_tests_log() -> PathBuf {
    profile_dir()
        .parent()
        .expect("a profile directory inside the target directory")
        .join("skipped-tests.log")
}

/// Records that the running test (or the part of it named by `what`) cannot run here and why,
/// in [`skipped_tests_log`] and on standard output; the test then returns.
pub fn skip(why: &str) {
    use std::io::Write;

    let thread = std::thread::current();
    let test = thread.name().unwrap_or("a test");
    // Cargo names test binaries `<name>-<16 hex digits>`.
    let binary = std::env::current_exe()
        .ok()
        .and_then(|exe| {
            exe.file_stem()
                .map(|stem| stem.to_string_lossy().into_owned())
        })
        .map(|stem| match stem.rsplit_once('-') {
            Some((name, hash)) if hash.len() == 16 => name.to_owned(),
            _ => stem,
        })
        .unwrap_or_default();
    println!("skipped: {why}");
    let line = format!("{binary} {test}: {why}\n");
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(skipped_tests_log())
        .and_then(|mut log| log.write_all(line.as_bytes()));
    if let Err(e) = written {
        println!(
            "(cannot record the skip in {}: {e})",
            skipped_tests_log().display()
        );
    }
}

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testkit lives in the workspace")
        .to_owned()
}

/// Builds `package` with cargo (once per test process) and returns the path of its shared
/// library `lib<lib_name>.so`.
pub fn cdylib(package: &str, lib_name: &str) -> PathBuf {
    build(package, &format!("lib{lib_name}.so"))
}

/// Builds `package` with cargo (once per test process) and returns the path of its binary
/// `name`.
pub fn binary(package: &str, name: &str) -> PathBuf {
    build(package, name)
}

/// The packages whose programs, plugins and libraries speak UCX when built with their `ucx`
/// feature (libdoca_urom reaches services on other machines with it).
const UCX_PACKAGES: [&str; 7] = [
    "urom-capi-urom",
    "urom-daemon",
    "urom-worker",
    "urom-samples",
    "urom-testkit",
    "urom-plugin-sandbox",
    "urom-plugin-coll",
];

/// Runs `cargo build -p package` in the running test's target directory and profile, once per
/// process, and returns the path of `artifact` in the profile directory (with
/// `UROM_TESTKIT_PREBUILT` set, builds nothing: the artifact must be there already). With this crate's
/// `ucx` feature, the [`UCX_PACKAGES`] are built with theirs; with its `mpi`
/// feature, this crate's programs and the samples are built with it.
fn build(package: &str, artifact: &str) -> PathBuf {
    static BUILT: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    let profile_dir = profile_dir();
    let path = profile_dir.join(artifact);
    let built = BUILT.get_or_init(Default::default);
    let mut built = built
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    // Programs built beforehand and copied beside the test (a machine without cargo).
    let prebuilt = std::env::var_os("UROM_TESTKIT_PREBUILT").is_some();
    if !prebuilt && !built.contains(package) {
        let target_dir = profile_dir
            .parent()
            .expect("profile directory inside the target directory");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let mut command = Command::new(&cargo);
        command
            .current_dir(workspace_root())
            .args(["build", "--quiet", "-p", package, "--target-dir"])
            .arg(target_dir);
        if profile_dir
            .file_name()
            .is_some_and(|name| name == "release")
        {
            command.arg("--release");
        }
        // Tests of the ucx feature need the programs they start built with it too.
        if cfg!(feature = "ucx") && UCX_PACKAGES.contains(&package) {
            command.args(["--features", "ucx"]);
        }
        // And those of the mpi feature, the rank programs built with MPI.
        if cfg!(feature = "mpi") && matches!(package, "urom-testkit" | "urom-samples") {
            command.args(["--features", "mpi"]);
        }
        let status = command
            .status()
            .unwrap_or_else(|e| panic!("cannot run `{cargo}` to build {package}: {e}"));
        assert!(status.success(), "building {package} failed");
        built.insert(package.to_owned());
    }
    assert!(path.exists(), "{} was not built", path.display());
    path
}

/// The user id of `nobody`, the other user tests run programs as.
pub const NOBODY: u32 = 65534;

/// Makes `command` run as `nobody` (user and group 65534, no supplementary groups); only root
/// may do so.
pub fn as_nobody(command: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    command.uid(NOBODY).gid(NOBODY)
}

/// A directory under the system's temporary directory, removed with its contents on drop: a
/// `tempfile` directory that every user may enter, as the programs tests run as `nobody` must.
pub struct TempDir(tempfile::TempDir);

impl TempDir {
    /// Creates a fresh directory whose name starts with `prefix`.
    pub fn new(prefix: &str) -> Self {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::Builder::new()
            .prefix(&format!("{prefix}-"))
            .permissions(std::fs::Permissions::from_mode(0o755))
            .tempdir()
            .expect("creating a temporary directory");
        Self(dir)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        self.0.path()
    }
}

/// A child process that is killed and reaped when dropped, so a failing test leaves nothing
/// running.
pub struct ChildGuard(pub std::process::Child);

impl ChildGuard {
    /// Starts `command` with its standard input piped (left in the child for the caller to
    /// take or drop) and its output lines delivered, as they come, on the returned receiver.
    pub fn spawn_with_lines(
        command: &mut Command,
    ) -> std::io::Result<(Self, std::sync::mpsc::Receiver<String>)> {
        use std::io::BufRead;

        let mut child = command
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()?;
        let stdout = child.stdout.take().expect("piped");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok((Self(child), lines))
    }

    /// Sends `signal` (e.g. `libc`'s SIGTERM number) to the child.
    pub fn signal(&self, signal: i32) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.0.id().to_string())
            .status()
            .expect("running kill");
        assert!(status.success(), "kill -{signal} {} failed", self.0.id());
    }

    /// Waits up to `timeout` for the child to exit.
    pub fn wait_timeout(
        &mut self,
        timeout: std::time::Duration,
    ) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.0.try_wait().expect("waiting for a child") {
                return Some(status);
            }
            if std::time::Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

impl Drop for ChildGuard {
    /// SIGTERM first, so that a daemon can stop its workers; SIGKILL after five seconds.
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = Command::new("kill").arg(self.0.id().to_string()).status();
            if self
                .wait_timeout(std::time::Duration::from_secs(5))
                .is_none()
            {
                let _ = self.0.kill();
            }
        }
        let _ = self.0.wait();
    }
}

/// Compiles C `source` into the shared object `<tmp>/<name>.so` with the system C compiler
/// (`$CC`, else `cc`), warnings as errors, `-I` for each of `include`, `-D` for each of
/// `defines`.
///
/// The object is written under a temporary name and renamed into place, so that a process
/// loading it (a worker with `LD_PRELOAD`, say) while another test rebuilds it never sees a
/// half-written file.
pub fn c_shared_object(source: &Path, name: &str, include: &[&Path], defines: &[&str]) -> PathBuf {
    compile_c(
        source,
        &format!("{name}.so"),
        &["-shared", "-fPIC"],
        include,
        defines,
    )
}

/// Compiles C `source` into the program `<tmp>/<name>` as [`c_shared_object`] compiles a
/// shared object.
pub fn c_program(source: &Path, name: &str, include: &[&Path], defines: &[&str]) -> PathBuf {
    compile_c(source, name, &[], include, defines)
}

fn compile_c(
    source: &Path,
    file_name: &str,
    kind: &[&str],
    include: &[&Path],
    defines: &[&str],
) -> PathBuf {
    static BUILDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let dir = profile_dir().join("c-objects");
    std::fs::create_dir_all(&dir).expect("creating the C object directory");
    let out = dir.join(file_name);
    let build = BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let partial = dir.join(format!(
        "{file_name}.{}-{build}.partial",
        std::process::id()
    ));
    let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let status = Command::new(&compiler)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O2"])
        .args(kind)
        .args(include.iter().map(|dir| format!("-I{}", dir.display())))
        .args(defines.iter().map(|define| format!("-D{define}")))
        .arg("-o")
        .arg(&partial)
        .arg(source)
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{compiler}`: {e}"));
    assert!(
        status.success(),
        "compiling {} with {defines:?} failed",
        source.display()
    );
    std::fs::rename(&partial, &out)
        .unwrap_or_else(|e| panic!("moving {} into place: {e}", partial.display()));
    out
}
