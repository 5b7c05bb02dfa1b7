//! `scripts/install.sh` into a temporary prefix, used as a DOCA programmer uses an installation:
//!
//! * what it lays out: the libraries under their SONAMEs with version links, the programs,
//!   plugins, headers and pkg-config files, and a manifest that `--uninstall` empties the
//!   prefix with;
//! * a C host program (`tests/c/installed.c`) and a C plugin (`plugins/c-loopback`) built with
//!   nothing but `pkg-config --cflags --libs` over the prefix (`PKG_CONFIG_PATH`), the plugin
//!   put beside the installed ones, and the program run against the installed daemon (which
//!   finds the plugins in its prefix and its worker beside it);
//! * the same program built by meson with `dependency('doca-urom')`, `dependency('doca-argp')`
//!   (skipped, and said so, where meson or ninja is missing: `apt-get install meson
//!   ninja-build`), and run.
//!
//! The script installs what this test's profile built (`--from`), so that it builds nothing
//! itself.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use urom_testkit::{ChildGuard, TempDir, binary, cdylib, profile_dir, skip, workspace_root};

/// Everything the script installs, built for this test's profile.
fn build_all() {
    for (package, lib) in [
        ("urom-capi-common", "doca_common"),
        ("urom-capi-urom", "doca_urom"),
        ("urom-capi-coll", "urom_coll"),
        ("urom-capi-mpi", "urom_mpi"),
        ("urom-plugin-graph", "worker_graph"),
        ("urom-plugin-sandbox", "worker_sandbox"),
        ("urom-plugin-coll", "worker_coll"),
    ] {
        cdylib(package, lib);
    }
    for (package, name) in [
        ("urom-daemon", "urom-daemon"),
        ("urom-worker", "urom-worker"),
        ("urom-ctl", "urom-ctl"),
    ] {
        binary(package, name);
    }
}

fn run(command: &mut Command) -> Output {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn script() -> Command {
    let mut command = Command::new("bash");
    command.arg(workspace_root().join("scripts/install.sh"));
    command
}

/// `pkg-config --cflags --libs packages` over the prefix, split into arguments.
fn pkg_config(prefix: &Path, packages: &[&str]) -> Vec<String> {
    let output = run(Command::new("pkg-config")
        .args(["--cflags", "--libs"])
        .args(packages)
        .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))
        .env_remove("PKG_CONFIG_LIBDIR"));
    String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// Every file and link under `dir`.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        match entry.file_type() {
            Ok(kind) if kind.is_dir() => found.extend(files_under(&path)),
            _ => found.push(path),
        }
    }
    found
}

/// The installed daemon, with no `UROM_PLUGIN_PATH` and no `--worker-bin`: it finds the plugins
/// in its prefix and the worker beside it.
fn start_installed_daemon(prefix: &Path, dir: &TempDir) -> (ChildGuard, PathBuf) {
    let socket = dir.path().join("urom.sock");
    let child = Command::new(prefix.join("bin/urom-daemon"))
        .arg("--listen")
        .arg(&socket)
        .arg("--log-dir")
        .arg(dir.path())
        .env_remove("UROM_PLUGIN_PATH")
        .stdout(Stdio::null())
        .spawn()
        .expect("starting the installed urom-daemon");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !socket.exists() {
        assert!(
            Instant::now() < deadline,
            "the installed daemon did not come up"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    (ChildGuard(child), socket)
}

/// Runs an installed-prefix host program against the daemon's socket, the prefix's libraries
/// found through `LD_LIBRARY_PATH` (a prefix outside the loader's directories).
fn run_host(program: &Path, prefix: &Path, socket: &Path, daemon_dir: &TempDir) {
    let output = Command::new(program)
        .args(["--plugin", "worker_c_loopback"])
        .env("LD_LIBRARY_PATH", prefix.join("lib"))
        .env("UROM_SERVICE_SOCKET", socket)
        .output()
        .expect("running the host program");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("installed ok"),
        "{} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{}\n--- daemon log\n{}",
        program.display(),
        output.status,
        String::from_utf8_lossy(&output.stderr),
        std::fs::read_to_string(daemon_dir.path().join("urom_daemon_dev.log")).unwrap_or_default()
    );
}

#[test]
fn an_installed_prefix_builds_and_runs_c_hosts_and_plugins_through_pkg_config() {
    build_all();
    let tmp = TempDir::new("urom-install");
    let prefix = tmp.path().join("prefix");
    let out = run(script()
        .arg("--prefix")
        .arg(&prefix)
        .arg("--from")
        .arg(profile_dir()));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("installed in"),
        "{out:?}"
    );

    // Libraries under their SONAMEs, each with its version and development links.
    let lib = prefix.join("lib");
    for name in ["doca_urom", "doca_common", "urom_coll", "urom_mpi"] {
        let versioned = lib.join(format!("lib{name}.so.{}", env!("CARGO_PKG_VERSION")));
        assert!(versioned.is_file(), "{}", versioned.display());
        let major = format!("lib{name}.so.{}", env!("CARGO_PKG_VERSION_MAJOR"));
        assert_eq!(
            std::fs::read_link(lib.join(&major)).expect("the SONAME link"),
            Path::new(versioned.file_name().unwrap())
        );
        assert_eq!(
            std::fs::read_link(lib.join(format!("lib{name}.so"))).expect("the link to build with"),
            Path::new(&major)
        );
        let dynamic = run(Command::new("readelf").arg("-d").arg(&versioned));
        assert!(
            String::from_utf8_lossy(&dynamic.stdout).contains(&format!("[{major}]")),
            "lib{name}'s SONAME is {major}"
        );
    }
    for path in [
        "bin/urom-daemon",
        "bin/urom-worker",
        "bin/urom-ctl",
        "lib/libdoca_argp.so",
        "lib/urom/plugins/worker_graph.so",
        "lib/urom/plugins/worker_sandbox.so",
        "lib/urom/plugins/worker_coll.so",
        "include/doca_urom.h",
        "include/doca_version.h",
        "include/doca_urom_plugin.h",
        "include/urom_coll.h",
        "include/urom/plugin/doca_urom_plugin.h",
        "lib/pkgconfig/doca-urom.pc",
        "lib/pkgconfig/doca-common.pc",
        "lib/pkgconfig/doca-argp.pc",
        "lib/pkgconfig/urom.pc",
        "lib/pkgconfig/urom-plugin.pc",
    ] {
        assert!(prefix.join(path).exists(), "{path} is installed");
    }

    let root = workspace_root();
    let objects = profile_dir().join("c-objects");
    std::fs::create_dir_all(&objects).expect("creating the C object directory");
    let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());

    // A C plugin from the plugin headers alone, put beside the installed plugins.
    let plugin = prefix.join("lib/urom/plugins/worker_c_loopback.so");
    run(Command::new(&compiler)
        .args([
            "-std=c11", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-o",
        ])
        .arg(&plugin)
        .arg(root.join("plugins/c-loopback/loopback.c"))
        .args(pkg_config(&prefix, &["urom-plugin"])));

    // A C host from pkg-config alone.
    let host = objects.join(format!("installed-{}", std::process::id()));
    run(Command::new(&compiler)
        .args([
            "-std=c11",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-DDOCA_ALLOW_EXPERIMENTAL_API",
            "-o",
        ])
        .arg(&host)
        .arg(root.join("urom-capi/urom/tests/c/installed.c"))
        .args(pkg_config(
            &prefix,
            &["doca-urom", "doca-argp", "doca-common"],
        )));
    let dynamic = run(Command::new("readelf").arg("-d").arg(&host));
    let dynamic = String::from_utf8_lossy(&dynamic.stdout);
    assert!(
        dynamic.contains("[libdoca_urom.so.0]") && dynamic.contains("[libdoca_common.so.0]"),
        "the program records the SONAMEs:\n{dynamic}"
    );

    let daemon_dir = TempDir::new("urom-install-daemon");
    let (_daemon, socket) = start_installed_daemon(&prefix, &daemon_dir);
    run_host(&host, &prefix, &socket, &daemon_dir);
    std::fs::remove_file(&host).ok();

    // The same program from a meson project.
    match (which("meson"), which("ninja")) {
        (Some(meson), Some(_)) => {
            let project = tmp.path().join("meson-project");
            std::fs::create_dir_all(&project).expect("creating the meson project");
            std::fs::copy(
                root.join("urom-capi/urom/tests/c/installed.c"),
                project.join("installed.c"),
            )
            .expect("copying the program");
            std::fs::copy(
                root.join("urom-capi/urom/tests/c/check.h"),
                project.join("check.h"),
            )
            .expect("copying its checks");
            std::fs::write(
                project.join("meson.build"),
                "project('urom_installed', 'c', default_options: ['c_std=c11', 'werror=true'])\n\
                 add_project_arguments('-D DOCA_ALLOW_EXPERIMENTAL_API', language: 'c')\n\
                 deps = [dependency('doca-common'), dependency('doca-urom'), dependency('doca-argp')]\n\
                 executable('installed', 'installed.c', dependencies: deps)\n",
            )
            .expect("writing meson.build");
            let build = project.join("build");
            run(Command::new(&meson)
                .arg("setup")
                .arg(&build)
                .arg(&project)
                .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig")));
            run(Command::new(&meson).arg("compile").arg("-C").arg(&build));
            run_host(&build.join("installed"), &prefix, &socket, &daemon_dir);
        }
        _ => skip("meson or ninja is not installed (apt-get install meson ninja-build)"),
    }
    drop(_daemon);

    // Uninstalled: the C plugin is the user's own to remove; then nothing is left.
    std::fs::remove_file(&plugin).expect("removing the C plugin");
    run(script().arg("--uninstall").arg("--prefix").arg(&prefix));
    let left = files_under(&prefix);
    assert!(left.is_empty(), "left after --uninstall: {left:?}");
}

/// The program `name` on `PATH`.
fn which(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
}
