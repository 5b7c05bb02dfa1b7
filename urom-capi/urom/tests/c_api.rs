//! urom's DOCA-named C API, driven from C against a real daemon.
//!
//! Each test builds `libdoca_common.so` and `libdoca_urom.so`, compiles a C program of
//! `tests/c/` with `-I urom-capi/include -ldoca_urom -ldoca_common` (warnings as errors), starts
//! a daemon offering the graph and faulty plugins, writes a service file whose line for this host
//! names two devices, `mlx5_0` and `mlx5_1` at `03:00.0`, and runs the program with
//! `DOCA_UROM_SERVICE_FILE` and `UROM_SERVICE_SOCKET` pointing at them:
//!
//! * `bootstrap.c`: the multi-worker bootstrap (service, plugin list, four workers on their own
//!   threads and progress engines, graph loopbacks, the faulty plugin's answers, groups queried
//!   with tasks, everything stopped and destroyed);
//! * `flood.c`: 1, 64 and 4,096 command tasks kept in flight through 1,000,000 loopbacks
//!   (100,000 in a debug build), each submitted again from its callback: no submission within
//!   the limit fails (DOCA_ERROR_AGAIN is never returned), one beyond it is refused;
//! * `notify.c`: an event loop sleeping in `epoll_wait` on the progress engine's notification
//!   handle (nested in the program's own epoll set) starts a worker, wakes for each of 100
//!   loopbacks and stops it; idle, it sleeps (little CPU time over a second);
//! * `stopping.c`: `doca_ctx_stop()` of a worker while the daemon is paused returns, and so
//!   does every progress call, the context STOPPING until the daemon answers (then IDLE); a
//!   worker killed with SIGKILL is reported through the state-changed callback (RUNNING,
//!   STOPPING, IDLE) and starts again;
//! * `misuse.c`: every call with NULL arguments, in the wrong state or with bad values returns its
//!   documented error;
//! * `domain.c`: a domain of two ranks (two processes, an out-of-band allgather of the program's
//!   own over a socket pair) runs, and each rank's worker finds the other's through the domain
//!   lookups (daemon offering the C domain-lookups plugin too);
//! * `ping_pong.c` (with this crate's `ucx` feature, which builds the daemon, its workers and
//!   the sandbox plugin with UCX; skipped with a note otherwise): DOCA's ping-pong flow between
//!   two forked ranks through `doca_urom_service_*`, `doca_urom_worker_*` command tasks carrying
//!   the sandbox plugin's bytes, and `doca_urom_domain_*`;
//! * `start_fails.c`: a service-file line naming another machine; without the `ucx` feature the
//!   service's start gives `DOCA_ERROR_NOT_SUPPORTED`, saying the library was built without UCX;
//! * `flood.c` and `start_fails.c` on two machines (with the `ucx` feature, as root; skipped
//!   with a note otherwise): two network namespaces, the daemon with its front door in one,
//!   the C host in the other reaching it through its service file's line and the key file;
//!   a wrong key and a missing key file fail the start with their own statuses.

use std::path::PathBuf;
use std::process::{Command, Output};

use urom_testkit::daemon::{Daemon, graph_and_faulty, plugin_dir, start_daemon};
use urom_testkit::{TempDir, binary, cdylib, profile_dir, workspace_root};

/// The directory holding both libraries, built for this test's profile.
fn libraries() -> PathBuf {
    cdylib("urom-capi-common", "doca_common");
    let urom = cdylib("urom-capi-urom", "doca_urom");
    urom.parent().expect("the profile directory").to_owned()
}

/// Compiles `tests/c/<name>.c` into a program linked with both libraries.
fn compile(name: &str) -> PathBuf {
    compile_with(name, &[])
}

/// [`compile`] with extra compiler flags.
fn compile_with(name: &str, flags: &[String]) -> PathBuf {
    let libs = libraries();
    let root = workspace_root();
    let source = root
        .join("urom-capi/urom/tests/c")
        .join(format!("{name}.c"));
    let dir = profile_dir().join("c-objects");
    std::fs::create_dir_all(&dir).expect("creating the C object directory");
    let out = dir.join(format!("capi-{name}"));
    // Tests of one process may compile the same program at once.
    static BUILDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let build = BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let partial = dir.join(format!(
        "capi-{name}.{}-{build}.partial",
        std::process::id()
    ));
    let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let status = Command::new(&compiler)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O2"])
        .arg("-DDOCA_ALLOW_EXPERIMENTAL_API")
        .arg(format!("-I{}", root.join("urom-capi/include").display()))
        .args(flags)
        .arg("-o")
        .arg(&partial)
        .arg(&source)
        .arg(format!("-L{}", libs.display()))
        .args(["-ldoca_urom", "-ldoca_common", "-lpthread", "-ldl"])
        .arg(format!("-Wl,-rpath,{}", libs.display()))
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{compiler}`: {e}"));
    assert!(status.success(), "compiling {} failed", source.display());
    std::fs::rename(&partial, &out).expect("moving the program into place");
    out
}

/// This host's name, as the service file's lines name hosts.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .expect("reading this host's name")
        .trim()
        .to_owned()
}

/// A service file whose line for this host names `mlx5_0` and `mlx5_1` at `03:00.0`.
fn service_file(dir: &TempDir) -> PathBuf {
    let hostname = hostname();
    let path = dir.path().join("urom_service.txt");
    let text = format!(
        "# the daemon of this host\nother-host dpu other-bf 04:00.0 mlx5_9:1\n{hostname} dpu {hostname} 03:00.0 mlx5_0:1,mlx5_1:1\n"
    );
    std::fs::write(&path, text).expect("writing the service file");
    path
}

/// Runs `program` against `daemon`.
fn run(program: &PathBuf, daemon: &Daemon, dir: &TempDir) -> Output {
    run_with(program, &[], daemon, dir)
}

/// Runs `program` with `args` against `daemon`.
fn run_with(program: &PathBuf, args: &[&str], daemon: &Daemon, dir: &TempDir) -> Output {
    Command::new(program)
        .args(args)
        .current_dir(dir.path())
        .env("DOCA_UROM_SERVICE_FILE", service_file(dir))
        .env("UROM_SERVICE_SOCKET", &daemon.socket)
        .output()
        .expect("running the C program")
}

fn assert_ran(output: &Output, daemon: &Daemon, expected: &str) {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains(expected),
        "the program failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n--- daemon log\n{}",
        output.status,
        daemon.log()
    );
}

#[test]
fn the_multi_worker_bootstrap_runs_through_the_c_api() {
    let program = compile("bootstrap");
    let (_plugins, daemon) = graph_and_faulty(&[]);
    let dir = TempDir::new("urom-capi-bootstrap");
    let output = run(&program, &daemon, &dir);
    assert_ran(
        &output,
        &daemon,
        "bootstrap ok: 4 workers, 200 loopbacks each",
    );
    // The program's messages went through the standard backend.
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("[DOCA][INFO][bootstrap.c:") && stdout.contains("group 1: 2 workers"),
        "{stdout}"
    );
}

/// `flood.c`: `in_flight` command tasks kept in flight through 1,000,000 graph loopbacks
/// (100,000 in a debug build, whose unoptimised libraries and worker take about ten times as
/// long), every `doca_task_submit()` succeeding without a retry, each loopback completing once.
fn flood(in_flight: u32) {
    let total: u64 = if cfg!(debug_assertions) {
        100_000
    } else {
        1_000_000
    };
    let program = compile("flood");
    let (_plugins, daemon) = graph_and_faulty(&[]);
    let dir = TempDir::new("urom-capi-flood");
    let output = run_with(
        &program,
        &[&in_flight.to_string(), &total.to_string()],
        &daemon,
        &dir,
    );
    assert_ran(
        &output,
        &daemon,
        &format!("flood ok: {total} loopbacks, {in_flight} in flight"),
    );
}

#[test]
fn submission_never_fails_with_one_task_in_flight() {
    flood(1);
}

#[test]
fn submission_never_fails_with_64_tasks_in_flight() {
    flood(64);
}

#[test]
fn submission_never_fails_with_4096_tasks_in_flight_beyond_the_channel() {
    flood(4096);
}

#[test]
fn misuse_gets_the_documented_errors() {
    let program = compile("misuse");
    let (_plugins, daemon) = graph_and_faulty(&[]);
    let dir = TempDir::new("urom-capi-misuse");
    let output = run(&program, &daemon, &dir);
    assert_ran(&output, &daemon, "misuse ok");
}

#[test]
fn an_event_loop_sleeps_on_the_notification_handle_until_a_task_completes() {
    let program = compile("notify");
    let (_plugins, daemon) = graph_and_faulty(&[]);
    let dir = TempDir::new("urom-capi-notify");
    let output = run(&program, &daemon, &dir);
    assert_ran(&output, &daemon, "notify ok: 100 loopbacks");
    // The wake-up counts, for whoever reads the test's output.
    eprint!("{}", String::from_utf8_lossy(&output.stdout));
}

#[test]
fn stopping_a_worker_does_not_wait_for_the_daemon_in_progress() {
    let program = compile("stopping");
    let (_plugins, daemon) = graph_and_faulty(&[]);
    let dir = TempDir::new("urom-capi-stopping");
    let pid = daemon.pid().to_string();
    let output = run_with(&program, &["paused", &pid], &daemon, &dir);
    // Whatever happened, the daemon goes on (a failed check may have left it paused).
    let _ = Command::new("kill").args(["-CONT", &pid]).status();
    assert_ran(&output, &daemon, "stopping ok: paused");
}

#[test]
fn a_killed_worker_is_reported_through_the_state_changed_callback() {
    let program = compile("stopping");
    let (_plugins, daemon) = graph_and_faulty(&[]);
    let dir = TempDir::new("urom-capi-killed");
    let pid = daemon.pid().to_string();
    let output = run_with(&program, &["killed", &pid], &daemon, &dir);
    assert_ran(&output, &daemon, "stopping ok: killed");
}

/// A daemon offering the graph plugin and the C domain-lookups plugin.
fn graph_and_lookups() -> (TempDir, Daemon) {
    let plugins = TempDir::new("urom-capi-plugins");
    let dir = plugin_dir(&plugins, &[("urom-plugin-graph", "worker_graph")]);
    let root = workspace_root();
    let lookups = urom_testkit::c_shared_object(
        &root.join("plugins/c-domain-lookups/domain_lookups.c"),
        "worker_domain_lookups",
        &[&root.join("plugins/include")],
        &[],
    );
    std::fs::copy(lookups, dir.join("worker_domain_lookups.so"))
        .expect("copying the domain-lookups plugin");
    let daemon = start_daemon(
        binary("urom-daemon", "urom-daemon"),
        dir.to_str().expect("a UTF-8 path"),
        &[],
        true,
    );
    (plugins, daemon)
}

#[test]
fn a_domain_of_two_ranks_runs_through_the_c_api() {
    let program = compile("domain");
    let (_plugins, daemon) = graph_and_lookups();
    let dir = TempDir::new("urom-capi-domain");
    let output = run(&program, &daemon, &dir);
    assert_ran(&output, &daemon, "domain ok");
    let stdout = String::from_utf8_lossy(&output.stdout);
    for rank in 0..2 {
        assert!(
            stdout.contains(&format!("rank {rank}: the domain of 2 ranks ran")),
            "{stdout}"
        );
    }
}

/// The sandbox plugin's ping-pong between two ranks, as DOCA's sample runs it, from C.
#[test]
#[cfg_attr(
    not(feature = "ucx"),
    ignore = "the sandbox plugin talks over UCX: run with `--features urom-capi-urom/ucx` (needs libucx-dev)"
)]
fn the_ping_pong_runs_through_the_c_api() {
    let cflags = Command::new("pkg-config")
        .args(["--cflags", "ucx"])
        .output()
        .expect("running pkg-config for UCX's headers");
    assert!(cflags.status.success(), "pkg-config finds no ucx");
    let flags: Vec<String> = String::from_utf8_lossy(&cflags.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    let program = compile_with("ping_pong", &flags);
    let plugins = TempDir::new("urom-capi-plugins");
    let dir = plugin_dir(&plugins, &[("urom-plugin-sandbox", "worker_sandbox")]);
    let mut command = Command::new(binary("urom-daemon", "urom-daemon"));
    // The workers' UCX over TCP on the loopback device (peer error handling needs TCP).
    command.envs([
        ("UCX_TLS", "tcp,self"),
        ("UCX_NET_DEVICES", "lo"),
        ("UCX_WARN_UNUSED_ENV_VARS", "n"),
    ]);
    let daemon = urom_testkit::daemon::start_daemon_command(
        command,
        dir.to_str().expect("a UTF-8 path"),
        &[],
        true,
    );
    let dir = TempDir::new("urom-capi-ping-pong");
    let output = run(&program, &daemon, &dir);
    assert_ran(&output, &daemon, "ping-pong ok");
    let stdout = String::from_utf8_lossy(&output.stdout);
    for line in [
        "Server completed PING recv: hello from C",
        "Client received PONG recv: hello from C",
    ] {
        assert_eq!(
            stdout.lines().filter(|l| *l == line).count(),
            1,
            "{line}\n{stdout}"
        );
    }
}

/// How long a C program may run before it counts as hung (and is killed): far beyond what
/// any of them needs, only so that a hang fails the test instead of stalling it.
const HANG: std::time::Duration = std::time::Duration::from_secs(300);

/// Runs `command` to its end and returns its output; kills it and fails if it hangs.
fn output_unless_hung(command: &mut Command) -> Output {
    use std::io::Read;
    use std::process::Stdio;

    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    let mut guard = urom_testkit::ChildGuard(child);
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    };
    let stdout = drain(Box::new(guard.0.stdout.take().expect("piped")));
    let stderr = drain(Box::new(guard.0.stderr.take().expect("piped")));
    let status = guard.wait_timeout(HANG);
    // Killed here if it hung, which closes its pipes.
    drop(guard);
    Output {
        status: status.unwrap_or_else(|| panic!("{command:?} hung (killed after {HANG:?})")),
        stdout: stdout.join().expect("reading the program's output"),
        stderr: stderr.join().expect("reading the program's errors"),
    }
}

/// A service-file line naming another machine. Without the `ucx` feature the service's start
/// says that this libdoca_urom was built without UCX (`DOCA_ERROR_NOT_SUPPORTED`); with it, the
/// library goes to that machine, here an address where nothing listens
/// (`DOCA_ERROR_NOT_CONNECTED`, naming the address).
#[test]
fn a_service_file_line_for_another_machine_needs_the_ucx_feature() {
    let program = compile("start_fails");
    let dir = TempDir::new("urom-capi-remote-line");
    let services = dir.path().join("services");
    std::fs::write(
        &services,
        format!("{} dpu 127.0.0.2:1 0000:03:00.0 lo\n", hostname()),
    )
    .expect("writing the service file");
    let (expected, says) = if cfg!(feature = "ucx") {
        ("DOCA_ERROR_NOT_CONNECTED", "connecting to 127.0.0.2:1")
    } else {
        ("DOCA_ERROR_NOT_SUPPORTED", "built without UCX")
    };
    let output = output_unless_hung(
        Command::new(&program)
            .arg(expected)
            .current_dir(dir.path())
            .env("DOCA_UROM_SERVICE_FILE", &services)
            .env_remove("UROM_SERVICE_SOCKET")
            .env_remove("UROM_KEY_FILE"),
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains(&format!("start failed: {expected}")),
        "{}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        output.status
    );
    assert!(
        stderr.contains(says),
        "the log does not say `{says}`:\n{stderr}"
    );
}

/// A C host on one machine and its service on another: two network namespaces joined by a
/// veth pair (`urom_testkit::netns`), the daemon with its front door and its workers in the
/// first, the C programs in the second, started with `ip netns exec`, over UCX on TCP. The
/// service file's line for this host names the daemon's address and the device towards it;
/// `UROM_KEY_FILE` the shared key. `flood.c` keeps 64 command tasks in flight through 10,000
/// graph loopbacks on a worker of that daemon, each completing once; `start_fails.c` with a
/// wrong key is refused (`DOCA_ERROR_AUTHENTICATION`, saying why, the daemon logging the failed
/// authentication), and without a key file fails at once (`DOCA_ERROR_BAD_CONFIG`). Skips with a
/// printed reason when not root or `ip` is missing.
#[test]
#[cfg_attr(
    not(feature = "ucx"),
    ignore = "a service on another machine is reached over UCX: run with `--features urom-capi-urom/ucx` (needs libucx-dev)"
)]
fn a_c_host_uses_a_service_on_another_machine() {
    use std::os::unix::fs::PermissionsExt;

    const SERVICE: usize = 0;
    const HOSTS: usize = 1;
    let network = match urom_testkit::netns::Network::create("capi", 2) {
        Ok(network) => network,
        Err(why) => {
            urom_testkit::skip(&why);
            return;
        }
    };
    let flood = compile("flood");
    let start_fails = compile("start_fails");
    let dir = TempDir::new("urom-capi-two-machines");
    // The workers' user (`nobody`) reads the plugins from here.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("opening the directory to the workers' user");
    let write_key = |name, secret| urom_testkit::daemon::write_key(dir.path(), name, secret);
    let key = write_key("key", b"a secret shared by both machines");
    let wrong = write_key("wrong", b"not the secret the daemon holds");
    let plugins = plugin_dir(&dir, &urom_testkit::daemon::GRAPH_AND_FAULTY);
    let (daemon, address) =
        urom_testkit::daemon::start_remote_daemon(&network, SERVICE, HOSTS, &plugins, &key);
    let services = dir.path().join("services");
    std::fs::write(
        &services,
        format!(
            "{} dpu {address} 0000:03:00.0 {}\n",
            hostname(),
            network.device(HOSTS, SERVICE)
        ),
    )
    .expect("writing the service file");
    // A C program on the hosts' machine, with `key` when given.
    let host = |program: &PathBuf, key: Option<&PathBuf>, args: &[&str]| {
        let mut command = network.command(HOSTS, program);
        command
            .args(args)
            .current_dir(dir.path())
            .env("DOCA_UROM_SERVICE_FILE", &services)
            .env_remove("UROM_SERVICE_SOCKET")
            .env_remove("UROM_KEY_FILE")
            .env("UCX_TLS", "tcp")
            .env("UCX_WARN_UNUSED_ENV_VARS", "n");
        if let Some(key) = key {
            command.env("UROM_KEY_FILE", key);
        }
        output_unless_hung(&mut command)
    };

    let output = host(&flood, Some(&key), &["64", "10000"]);
    assert_ran(&output, &daemon, "flood ok: 10000 loopbacks, 64 in flight");
    assert!(
        daemon.log().contains("remote host authenticated"),
        "{}",
        daemon.log()
    );

    for (key, expected, says) in [
        (
            Some(&wrong),
            "DOCA_ERROR_AUTHENTICATION",
            "wrong proof of the shared secret",
        ),
        (None, "DOCA_ERROR_BAD_CONFIG", "no key file given"),
    ] {
        let output = host(&start_fails, key, &[expected]);
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success()
                && stdout.contains(&format!("start failed: {expected}"))
                && stderr.contains(says),
            "{expected}, saying `{says}` ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n--- daemon log\n{}",
            output.status,
            daemon.log()
        );
    }
    let deadline = std::time::Instant::now() + HANG;
    while !daemon.log().contains("failed authentication") {
        assert!(
            std::time::Instant::now() < deadline,
            "the daemon did not log the failed authentication:\n{}",
            daemon.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // The daemon and its workers go before their namespaces do.
    drop(daemon);
    drop(network);
}
