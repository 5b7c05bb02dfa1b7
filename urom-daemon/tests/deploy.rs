//! The deployment files in `deploy/` against the daemon they deploy: the pod of the service
//! guide (every plugin directory mounted, SERVICE_ARGS accepted by the daemon's own parser,
//! hugepages, logs, a readiness probe), the systemd unit, the container's entry point run
//! outside a container, and the image where a container engine can run one.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_yaml_ng::Value;
use urom_daemon::{Args, JsonArgs};
use urom_graph::{GraphHost, loopback_result};
use urom_host::{CompletedTask, Idle, ProgressEngine, Service, Worker};
use urom_testkit::{ChildGuard, TempDir, binary, cdylib, profile_dir, workspace_root};

fn deploy(file: &str) -> PathBuf {
    workspace_root().join("deploy").join(file)
}

fn read(file: &str) -> String {
    std::fs::read_to_string(deploy(file)).unwrap_or_else(|e| panic!("deploy/{file}: {e}"))
}

fn str_of<'a>(value: &'a Value, what: &str) -> &'a str {
    value
        .as_str()
        .unwrap_or_else(|| panic!("{what} is not a string: {value:?}"))
}

fn seq<'a>(value: &'a Value, what: &str) -> &'a Vec<Value> {
    value
        .as_sequence()
        .unwrap_or_else(|| panic!("{what} is not a list: {value:?}"))
}

fn env_of<'a>(container: &'a Value, name: &str) -> &'a str {
    seq(&container["env"], "env")
        .iter()
        .find(|entry| entry["name"].as_str() == Some(name))
        .map(|entry| str_of(&entry["value"], name))
        .unwrap_or_else(|| panic!("no {name} in the container's env"))
}

/// The daemon's arguments from a SERVICE_ARGS value, as the entry point splits it.
fn service_args(value: &str) -> Args {
    let argv = std::iter::once("urom-daemon").chain(value.split_whitespace());
    Args::parse_with_json(argv).unwrap_or_else(|e| panic!("SERVICE_ARGS {value:?}: {e}"))
}

/// The directories of a UROM_PLUGIN_PATH value, without trailing slashes.
fn plugin_dirs(value: &str) -> Vec<String> {
    value
        .split(';')
        .filter(|dir| !dir.is_empty())
        .map(|dir| dir.trim_end_matches('/').to_owned())
        .collect()
}

#[test]
fn the_pod_mounts_every_plugin_directory_and_passes_arguments_the_daemon_accepts() {
    let pod: Value = serde_yaml_ng::from_str(&read("urom-service.yaml")).unwrap();
    assert_eq!(str_of(&pod["kind"], "kind"), "Pod");
    let spec = &pod["spec"];
    let volumes = seq(&spec["volumes"], "volumes");
    let volume = |name: &str| {
        volumes
            .iter()
            .find(|v| v["name"].as_str() == Some(name))
            .unwrap_or_else(|| panic!("no volume {name}"))
    };
    let containers = seq(&spec["containers"], "containers");
    assert_eq!(containers.len(), 1);
    let service = &containers[0];

    // SERVICE_ARGS as the service guide sets it, accepted by the daemon's parser.
    let args = service_args(env_of(service, "SERVICE_ARGS"));
    assert_eq!(args.log_level, 60);
    assert_eq!(args.max_msg_size.get(), 4096);

    // Every plugin directory is a hostPath volume mounted at the same path, in the service
    // container and in the init container that installs the bundled plugins.
    let path = env_of(service, "UROM_PLUGIN_PATH");
    let dirs = plugin_dirs(path);
    assert_eq!(dirs.len(), 2, "{path}");
    let init = &seq(&spec["initContainers"], "initContainers")[0];
    assert_eq!(env_of(init, "UROM_PLUGIN_PATH"), path);
    for container in [service, init] {
        let mounts = seq(&container["volumeMounts"], "volumeMounts");
        for dir in &dirs {
            let mount = mounts
                .iter()
                .find(|m| m["mountPath"].as_str().map(|p| p.trim_end_matches('/')) == Some(dir))
                .unwrap_or_else(|| panic!("plugin directory {dir} has no volume mount"));
            let host = &volume(str_of(&mount["name"], "mount name"))["hostPath"];
            assert_eq!(str_of(&host["path"], "hostPath"), dir);
            assert_eq!(str_of(&host["type"], "hostPath type"), "DirectoryOrCreate");
        }
    }
    let command: Vec<&str> = seq(&init["command"], "init command")
        .iter()
        .map(|w| str_of(w, "command word"))
        .collect();
    assert_eq!(command, ["/opt/urom/bin/entrypoint.sh", "install-plugins"]);

    // Hugepages: requested and limited alike, with the hugetlbfs mount of the guide.
    let resources = &service["resources"];
    for kind in ["requests", "limits"] {
        assert_eq!(
            str_of(&resources[kind]["hugepages-2Mi"], "hugepages-2Mi"),
            "1Gi",
            "{kind}"
        );
    }
    let mounts = seq(&service["volumeMounts"], "volumeMounts");
    let mount_of = |path: &str| {
        mounts
            .iter()
            .find(|m| m["mountPath"].as_str() == Some(path))
            .map(|m| volume(str_of(&m["name"], "mount name")))
            .unwrap_or_else(|| panic!("nothing mounted at {path}"))
    };
    assert_eq!(
        str_of(&mount_of("/mnt/huge")["emptyDir"]["medium"], "medium"),
        "HugePages-2Mi"
    );
    // The logs and the socket outlive the container, on the node.
    assert_eq!(
        str_of(
            &mount_of("/var/log/doca/urom")["hostPath"]["path"],
            "log dir"
        ),
        "/var/log/doca/urom"
    );
    assert_eq!(
        str_of(&mount_of("/run/urom")["hostPath"]["path"], "socket dir"),
        "/run/urom"
    );

    // Ready when urom-ctl gets an answer, through the entry point the image has.
    let probe: Vec<&str> = seq(&service["readinessProbe"]["exec"]["command"], "probe")
        .iter()
        .map(|w| str_of(w, "probe word"))
        .collect();
    assert_eq!(probe, ["/opt/urom/bin/entrypoint.sh", "status"]);
    let containerfile = read("Containerfile");
    assert!(
        containerfile.contains(r#"ENTRYPOINT ["/opt/urom/bin/entrypoint.sh"]"#),
        "{containerfile}"
    );
    assert!(containerfile.contains("deploy/entrypoint.sh /out/bin/"));
    assert!(containerfile.contains("/out/plugins/worker_graph/worker_graph.so"));
}

#[test]
fn the_systemd_unit_runs_the_daemon_with_arguments_it_accepts() {
    let unit = read("urom-daemon.service");
    let value_of = |key: &str| {
        unit.lines()
            .find_map(|line| line.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in the unit"))
    };
    let exec = value_of("ExecStart=");
    let mut words = exec.split_whitespace();
    assert_eq!(words.next(), Some("/usr/local/bin/urom-daemon"));
    let service = unit
        .lines()
        .find_map(|line| line.strip_prefix("Environment=\"SERVICE_ARGS="))
        .and_then(|rest| rest.strip_suffix('"'))
        .expect("a default SERVICE_ARGS");
    // ExecStart with SERVICE_ARGS put in, as systemd splits an unbraced $VARIABLE.
    let line = exec.replace("$SERVICE_ARGS", service);
    let args = service_args(line.trim_start_matches("/usr/local/bin/urom-daemon"));
    assert_eq!(args.listen, Some(PathBuf::from("/run/urom/urom.sock")));
    assert_eq!(args.log_dir, Some(PathBuf::from("/var/log/doca/urom")));
    assert_eq!(value_of("KillMode="), "mixed");
    assert_eq!(value_of("RuntimeDirectory="), "urom");
}

#[test]
fn the_grafana_dashboard_is_valid_json_over_urom_metrics() {
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("grafana-dashboard.json")).unwrap();
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 10);
    for panel in panels {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            assert!(expr.contains("urom_"), "{expr}");
        }
    }
}

/// The entry point of the image, run here with the binaries of this build.
struct Entrypoint {
    dir: TempDir,
    plugins: PathBuf,
}

impl Entrypoint {
    fn new() -> Self {
        let dir = TempDir::new("urom-entrypoint");
        let plugins = dir.path().join("plugins/worker_graph");
        std::fs::create_dir_all(&plugins).unwrap();
        std::fs::copy(
            cdylib("urom-plugin-graph", "worker_graph"),
            plugins.join("worker_graph.so"),
        )
        .unwrap();
        // Everything the entry point runs, from this build.
        binary("urom-worker", "urom-worker");
        binary("urom-ctl", "urom-ctl");
        Self { dir, plugins }
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("run/urom.sock")
    }

    fn logs(&self) -> PathBuf {
        self.dir.path().join("log")
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new("sh");
        command
            .arg(deploy("entrypoint.sh"))
            .args(args)
            .env("UROM_BIN_DIR", profile_dir())
            .env("UROM_LOG_DIR", self.logs())
            .env("UROM_SOCKET", self.socket())
            .env("SERVICE_ARGS", "-l 60 -m 4096")
            // As the pod sets it: a trailing slash, and a directory that is not there.
            .env(
                "UROM_PLUGIN_PATH",
                format!(
                    "{}/;{}",
                    self.plugins.display(),
                    self.dir.path().join("absent").display()
                ),
            );
        command
    }
}

static ANSWER: std::sync::Mutex<Option<u64>> = std::sync::Mutex::new(None);

fn record(task: &CompletedTask<'_>) {
    *ANSWER.lock().unwrap() = loopback_result(task).ok().map(|r| r.data);
}

#[test]
fn the_entrypoint_serves_the_demo_and_stops_its_workers_on_sigterm() {
    let entry = Entrypoint::new();
    let output = entry.dir.path().join("container.out");
    let mut child = ChildGuard(
        entry
            .command(&[])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&output).unwrap())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + TIMEOUT;
    while !entry.socket().exists() {
        assert!(
            Instant::now() < deadline,
            "the daemon did not come up:\n{}",
            std::fs::read_to_string(&output).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let said = std::fs::read_to_string(&output).unwrap();
    assert!(
        said.contains("starting urom-daemon -l 60 -m 4096"),
        "{said}"
    );
    assert!(
        said.contains("absent does not exist (is its volume mounted?)"),
        "{said}"
    );

    // The readiness probe.
    let probe = entry.command(&["status"]).output().unwrap();
    let text = String::from_utf8_lossy(&probe.stdout);
    assert!(
        probe.status.success() && text.contains("urom-daemon"),
        "{text}{}",
        String::from_utf8_lossy(&probe.stderr)
    );

    // The demo: a host connects, starts a worker and runs a graph loopback.
    let service = Service::<Idle>::new()
        .set_socket(entry.socket())
        .start()
        .map_err(|(_, e)| e)
        .unwrap();
    let info = service.plugin("worker_graph").expect("the graph plugin");
    let graph = GraphHost::init(info.id, info.version).unwrap();
    let mut engine = ProgressEngine::new();
    let worker = urom_testkit::host::run_worker(
        &mut engine,
        Worker::new().set_service(&service).set_plugins(graph.id()),
    );
    graph.loopback(&worker, 7, 42, record).unwrap();
    let deadline = Instant::now() + TIMEOUT;
    while ANSWER.lock().unwrap().is_none() {
        assert!(Instant::now() < deadline, "no loopback answer");
        engine.progress();
    }
    assert_eq!(*ANSWER.lock().unwrap(), Some(42));

    // The logs the service guide names, where the pod mounts them.
    let daemon_log = std::fs::read_to_string(entry.logs().join("urom_daemon_dev.log")).unwrap();
    assert!(daemon_log.contains("worker spawned"), "{daemon_log}");
    let worker_log = std::fs::read_dir(entry.logs())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|name| name.starts_with("urom_worker_") && name.ends_with("_dev.log"))
        .expect("a worker log");
    let pid: i32 = worker_log
        .trim_start_matches("urom_worker_")
        .trim_end_matches("_dev.log")
        .parse()
        .unwrap();
    assert!(Path::new(&format!("/proc/{pid}")).exists());
    // The daemon logs to the container's output too.
    assert!(
        std::fs::read_to_string(&output)
            .unwrap()
            .contains("urom daemon started")
    );

    // SIGTERM, as the container runtime sends it: the workers stop, the daemon exits 0.
    child.signal(15);
    let status = child
        .wait_timeout(TIMEOUT)
        .expect("the daemon did not stop");
    assert!(status.success(), "{status}");
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "worker {pid} still runs"
    );
    assert!(!entry.socket().exists());
    let daemon_log = std::fs::read_to_string(entry.logs().join("urom_daemon_dev.log")).unwrap();
    assert!(daemon_log.contains("urom daemon stopped"), "{daemon_log}");
    drop(worker);
}

#[test]
fn install_plugins_fills_only_empty_directories_it_has_a_plugin_for() {
    let entry = Entrypoint::new();
    let bundled = entry.dir.path().join("bundled/worker_graph");
    std::fs::create_dir_all(&bundled).unwrap();
    std::fs::write(bundled.join("worker_graph.so"), b"bundled").unwrap();
    let empty = entry.dir.path().join("node/worker_graph");
    let other = entry.dir.path().join("node/worker_sandbox");
    std::fs::write(entry.plugins.join("keep.so"), b"").unwrap();
    let path = format!(
        "{}/;{};{}/",
        empty.display(),
        other.display(),
        entry.plugins.display()
    );
    let output = entry
        .command(&["install-plugins"])
        .env("UROM_BUNDLED_PLUGINS", entry.dir.path().join("bundled"))
        .env("UROM_PLUGIN_PATH", &path)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{said}");
    assert_eq!(
        std::fs::read(empty.join("worker_graph.so")).unwrap(),
        b"bundled"
    );
    assert!(!other.exists(), "{said}");
    assert!(
        said.contains("no bundled plugin named worker_sandbox"),
        "{said}"
    );
    assert!(said.contains("already holds plugins"), "{said}");
    // The directory that had plugins keeps its own.
    assert_ne!(
        std::fs::read(entry.plugins.join("worker_graph.so")).unwrap(),
        b"bundled"
    );
}

/// Runs `engine args...` with a time limit; the output, or why it could not run.
fn engine_run(engine: &str, args: &[&str], limit: Duration) -> Result<String, String> {
    let mut child = Command::new("timeout")
        .arg(limit.as_secs().to_string())
        .arg(engine)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {engine}: {e}"))?;
    let mut out = String::new();
    let mut err = String::new();
    use std::io::Read;
    child.stdout.take().unwrap().read_to_string(&mut out).ok();
    child.stderr.take().unwrap().read_to_string(&mut err).ok();
    let status = child.wait().map_err(|e| e.to_string())?;
    if status.success() {
        Ok(out)
    } else {
        let why = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        Err(format!(
            "`{engine} {}` failed ({status}): {why}",
            args.join(" ")
        ))
    }
}

/// The first container engine that answers, or why none can be used.
fn container_engine() -> Result<&'static str, String> {
    let mut reasons = Vec::new();
    for engine in ["podman", "docker"] {
        if Command::new(engine).arg("--version").output().is_err() {
            reasons.push(format!("{engine} is not installed"));
            continue;
        }
        match engine_run(engine, &["info"], Duration::from_secs(30)) {
            Ok(_) => return Ok(engine),
            Err(why) => reasons.push(why),
        }
    }
    Err(reasons.join("; "))
}

#[test]
fn the_image_builds_and_serves_where_a_container_engine_can_run_it() {
    let engine = match container_engine() {
        Ok(engine) => engine,
        Err(why) => {
            urom_testkit::skip(&format!("no usable container engine: {why}"));
            return;
        }
    };
    let containerfile = read("Containerfile");
    let base = |arg: &str| {
        containerfile
            .lines()
            .find_map(|line| line.strip_prefix(&format!("ARG {arg}=")))
            .unwrap_or_else(|| panic!("no ARG {arg}"))
            .to_owned()
    };
    for image in [base("BUILD_IMAGE"), base("RUNTIME_IMAGE")] {
        if engine_run(
            engine,
            &["image", "inspect", &image],
            Duration::from_secs(30),
        )
        .is_err()
        {
            if let Err(why) = engine_run(engine, &["pull", &image], Duration::from_secs(120)) {
                urom_testkit::skip(&format!(
                    "base image {image} is not here and cannot be pulled: {why}"
                ));
                return;
            }
        }
    }
    let tag = "localhost/urom-service:test";
    let root = workspace_root();
    let containerfile = deploy("Containerfile");
    let built = engine_run(
        engine,
        &[
            "build",
            "-f",
            containerfile.to_str().unwrap(),
            "-t",
            tag,
            root.to_str().unwrap(),
        ],
        Duration::from_secs(1800),
    );
    if let Err(why) = built {
        panic!("the image does not build: {why}");
    }
    let name = format!("urom-test-{}", std::process::id());
    if let Err(why) = engine_run(
        engine,
        &[
            "run",
            "-d",
            "--name",
            &name,
            "-e",
            "SERVICE_ARGS=-l 60 -m 4096",
            tag,
        ],
        Duration::from_secs(60),
    ) {
        let _ = engine_run(engine, &["rm", "-f", &name], Duration::from_secs(30));
        urom_testkit::skip(&format!(
            "{engine} builds the image but cannot run a container here: {why}"
        ));
        return;
    }
    let deadline = Instant::now() + TIMEOUT;
    let ready = loop {
        match engine_run(
            engine,
            &["exec", &name, "/opt/urom/bin/entrypoint.sh", "status"],
            Duration::from_secs(30),
        ) {
            Ok(status) => break Ok(status),
            Err(why) if Instant::now() > deadline => break Err(why),
            Err(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    };
    let stopped = engine_run(
        engine,
        &["stop", "-t", "20", &name],
        Duration::from_secs(60),
    );
    let logs = engine_run(engine, &["logs", &name], Duration::from_secs(30)).unwrap_or_default();
    let _ = engine_run(engine, &["rm", "-f", &name], Duration::from_secs(30));
    let ready = ready.unwrap_or_else(|why| panic!("the container never got ready: {why}\n{logs}"));
    assert!(ready.contains("worker_graph"), "{ready}");
    stopped.unwrap();
    assert!(logs.contains("urom daemon stopped"), "{logs}");
}
