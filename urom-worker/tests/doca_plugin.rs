//! A C plugin written against DOCA's header names (`doca_error.h` first, then
//! `doca_urom_plugin.h`, `DOCA_STRUCT_CTOR`, the `doca_urom_worker_domain_*_lookup` helpers,
//! `doca_log.h`) runs in a real worker process; its domain lookups answer as documented for a
//! worker on which no domain has been started. Plugins stamped with the interface version word
//! of a DOCA release the worker accepts run too; others are left out with the reason logged.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use urom_wire::Status;

/// Builds `plugins/c-domain-lookups/domain_lookups.c` with `defines` into `name.so`.
fn build(name: &str, defines: &[&str]) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    urom_testkit::c_shared_object(
        &root.join("plugins/c-domain-lookups/domain_lookups.c"),
        name,
        &[&root.join("plugins/include")],
        defines,
    )
}

/// What the plugin reported for one command (its 56-byte notification).
#[derive(Debug, PartialEq)]
struct Report {
    /// addr, seg, memh, mkey lookups with valid outputs, then with a NULL output.
    statuses: [Status; 8],
    /// Bit i: lookup i left its outputs cleared.
    cleared: u32,
    /// The interface version word the worker handed back in `ctx->iface`.
    api_version: u64,
    /// Commands the plugin handled so far.
    commands: u64,
}

impl Report {
    fn parse(payload: &[u8]) -> Self {
        assert_eq!(payload.len(), 56, "{payload:?}");
        let u32_at = |at: usize| u32::from_le_bytes(payload[at..at + 4].try_into().unwrap());
        let u64_at = |at: usize| u64::from_le_bytes(payload[at..at + 8].try_into().unwrap());
        assert_eq!(u32_at(36), 0, "reserved");
        Self {
            statuses: std::array::from_fn(|i| Status::from_raw(u32_at(i * 4) as i32)),
            cleared: u32_at(32),
            api_version: u64_at(40),
            commands: u64_at(48),
        }
    }

    /// What a worker without a domain answers, to the `commands`th command.
    fn no_domain(api_version: u64, commands: u64) -> Self {
        Self {
            statuses: [
                Status::NotFound,
                Status::NotFound,
                Status::NotFound,
                Status::NotFound,
                Status::InvalidValue,
                Status::InvalidValue,
                Status::InvalidValue,
                Status::InvalidValue,
            ],
            cleared: 0b1111,
            api_version,
            commands,
        }
    }
}

/// Asks the plugin `plugin` about domain ids 0, 7 and `u64::MAX`; every lookup must report
/// that no domain exists.
fn check_lookups(host: &mut urom_transport::Channel, plugin: u64, api_version: u64) {
    for (i, domain_id) in [0u64, 7, u64::MAX].into_iter().enumerate() {
        let context = 1000 + i as u64;
        send_command(host, i as u64, plugin, context, &domain_id.to_le_bytes());
        let (got_plugin, got_context, status, payload) = next_notification(host);
        assert_eq!(
            (got_plugin, got_context, status),
            (plugin, context, Status::Success)
        );
        assert_eq!(
            Report::parse(&payload),
            Report::no_domain(api_version, i as u64 + 1),
            "domain id {domain_id}"
        );
    }
}

#[test]
fn a_plugin_written_for_doca_runs_and_its_domain_lookups_answer_not_found() {
    let ours = build("worker_domain_lookups", &[]);
    let worker = start_worker(&[format!("{}:1", ours.display())], &[]);
    let mut host = connect(&worker.socket);
    check_lookups(&mut host, 1, 1);

    // A command of the wrong size is answered with the plugin's error.
    send_command(&mut host, 9, 1, 77, b"short");
    assert_eq!(
        next_notification(&mut host),
        (1, 77, Status::InvalidValue, Vec::new())
    );

    let log = std::fs::read_to_string(log_file(&worker)).unwrap();
    assert!(log.contains("built_with=urom interface 1"), "{log}");

    // The plugin logs to the worker's standard error (which a daemon-spawned worker has
    // pointed at its log file): its DOCA_LOG_INFO line, made with doca_error_get_name and
    // doca_error_get_descr, is there; its DOCA_LOG_DBG line is not, at the default level.
    let stderr = stop_and_read_stderr(worker);
    assert!(
        stderr.lines().any(|line| {
            line.starts_with("[plugin UROM::WORKER::DOMAIN_LOOKUPS] INFO domain_lookups.c:")
                && line.ends_with("lookup_all: domain member 7: DOCA_ERROR_NOT_FOUND (Not found)")
        }),
        "{stderr}"
    );
    assert!(!stderr.contains("interface version word"), "{stderr}");
}

#[test]
fn a_plugins_debug_lines_show_at_the_level_its_environment_asks_for() {
    let ours = build("worker_domain_lookups_debug", &[]);
    let worker = start_worker_with_env(
        &[format!("{}:1", ours.display())],
        &[],
        &[("UROM_PLUGIN_LOG_LEVEL", Path::new("60"))],
    );
    let mut host = connect(&worker.socket);
    check_lookups(&mut host, 1, 1);
    let stderr = stop_and_read_stderr(worker);
    assert!(
        stderr.lines().any(|line| {
            line.starts_with("[plugin UROM::WORKER::DOMAIN_LOOKUPS] DEBUG domain_lookups.c:")
                && line.ends_with("lookups_open: opened, interface version word 0x1")
        }),
        "{stderr}"
    );
}

/// Stops the worker with SIGTERM and returns what it wrote to its standard error.
fn stop_and_read_stderr(mut worker: RunningWorker) -> String {
    use std::io::Read;
    worker.child.signal(SIGTERM);
    let status = worker
        .child
        .wait_timeout(TIMEOUT)
        .expect("the worker did not stop");
    assert!(status.success(), "{status}");
    let mut stderr = String::new();
    worker
        .child
        .0
        .stderr
        .take()
        .expect("the worker's standard error is piped")
        .read_to_string(&mut stderr)
        .unwrap();
    stderr
}

#[test]
fn plugins_built_with_accepted_doca_headers_run_and_others_are_left_out() {
    // DOCA 3.0.0058 (the word DOCA_STRUCT_CTOR stores with those headers), a 3.3 and a 2.9
    // build; then 2.8, 3.4 and a word that is no DOCA version at all.
    let doca_3_0 = build("worker_lookups_doca_3_0", &["IFACE_WORD=0x0300003a"]);
    let doca_3_3 = build("worker_lookups_doca_3_3", &["IFACE_WORD=0x03030000"]);
    let doca_2_9 = build("worker_lookups_doca_2_9", &["IFACE_WORD=0x02090048"]);
    let doca_2_8 = build("worker_lookups_doca_2_8", &["IFACE_WORD=0x02080000"]);
    let doca_3_4 = build("worker_lookups_doca_3_4", &["IFACE_WORD=0x03040000"]);
    let unknown = build("worker_lookups_word_7", &["IFACE_WORD=7"]);
    let plugins = [
        (&doca_3_0, 1),
        (&doca_3_3, 2),
        (&doca_2_9, 4),
        (&doca_2_8, 8),
        (&doca_3_4, 16),
        (&unknown, 32),
    ]
    .map(|(path, id)| format!("{}:{id}", path.display()));
    let worker = start_worker(&plugins, &[]);
    let mut host = connect(&worker.socket);
    check_lookups(&mut host, 1, 0x0300_003a);
    check_lookups(&mut host, 2, 0x0303_0000);
    check_lookups(&mut host, 4, 0x0209_0048);
    for (i, refused) in [8u64, 16, 32].into_iter().enumerate() {
        send_command(&mut host, 20 + i as u64, refused, 50, &7u64.to_le_bytes());
        let (plugin, context, status, _) = next_notification(&mut host);
        assert_eq!((plugin, context, status), (refused, 50, Status::NotFound));
    }

    let log = std::fs::read_to_string(log_file(&worker)).unwrap();
    assert!(log.contains("built_with=DOCA 3.0.0058"), "{log}");
    assert!(log.contains("built_with=DOCA 3.3.0000"), "{log}");
    assert!(log.contains("built_with=DOCA 2.9.0072"), "{log}");
    for (path, word) in [
        (&doca_2_8, "34078720 (0x2080000)"),
        (&doca_3_4, "50593792 (0x3040000)"),
        (&unknown, "7 (0x7)"),
    ] {
        let line = format!("plugin {} has interface version {word}", path.display());
        assert!(log.contains(&line), "no `{line}` in {log}");
    }
    assert!(
        log.contains("plugins built with the headers of DOCA 2.9, 2.10, 3.0, 3.1, 3.2, 3.3"),
        "{log}"
    );
}
