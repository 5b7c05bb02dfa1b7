//! The status report on the control socket, frame by frame: it is read in pages that each fit
//! the maximum message size, it says what became of every plugin file, and only an
//! authenticated host may ask for it.

mod common;

use common::*;
use urom_testkit::control::ControlClient;
use urom_wire::Status;
use urom_wire::control::ControlMessage;
use urom_wire::report::{DirState, PluginOutcome, StatusRecord, WorkerState};

/// Kinds of records, in report order, as short names.
fn kind(record: &StatusRecord<'_>) -> &'static str {
    match record {
        StatusRecord::Daemon(_) => "daemon",
        StatusRecord::Listen(_) => "listen",
        StatusRecord::HugePages(_) => "hugepages",
        StatusRecord::PluginDir(_) => "dir",
        StatusRecord::PluginFile(_) => "file",
        StatusRecord::Worker(_) => "worker",
        StatusRecord::Counters(_) => "counters",
        StatusRecord::ErrorCount(_) => "error",
        StatusRecord::Unknown { .. } => "unknown",
    }
}

/// Reads the whole report page by page; returns each page's records as owned debug text and
/// kinds, and how many pages it took.
fn read_report(client: &mut ControlClient, max: usize) -> (Vec<String>, Vec<&'static str>, usize) {
    let mut cursor = 0;
    let mut texts = Vec::new();
    let mut kinds = Vec::new();
    let mut pages = 0;
    loop {
        let frame = client.request(ControlMessage::StatusRequest { cursor });
        assert!(frame.0.len() <= max, "a page of {} bytes", frame.0.len());
        let ControlMessage::StatusReply(reply) = frame.message() else {
            panic!("not a status page: {:?}", frame.message());
        };
        pages += 1;
        for record in reply.records.iter() {
            kinds.push(kind(&record));
            texts.push(format!("{record:?}"));
        }
        if reply.next_cursor == 0 {
            return (texts, kinds, pages);
        }
        assert!(reply.next_cursor > cursor);
        cursor = reply.next_cursor;
    }
}

#[test]
fn the_report_comes_in_pages_that_fit_the_message_size() {
    let plugins = urom_testkit::TempDir::new("urom-status-plugins");
    let dir = urom_testkit::daemon::plugin_dir(&plugins, &[("urom-plugin-graph", "worker_graph")]);
    // A long name that is no library, and a directory that is not there.
    let long = "x".repeat(40);
    std::fs::write(dir.join(format!("{long}.so")), b"junk").unwrap();
    let missing = plugins.path().join("missing");
    let path = format!("{};{}", dir.display(), missing.display());
    let daemon = urom_testkit::daemon::start_daemon(daemon_bin(), &path, &["-m", "256"], true);
    let mut client = ControlClient::connect(&daemon.socket, TIMEOUT).unwrap();
    client.handshake_with(256).unwrap();
    let (worker, _) = client
        .spawn(urom_wire::control::WORKER_ID_ANY, 9, 1, "", &[])
        .unwrap();

    let (texts, kinds, pages) = read_report(&mut client, 256);
    assert!(pages > 2, "{pages} pages: {kinds:?}");
    assert_eq!(kinds[..3], ["daemon", "listen", "hugepages"], "{kinds:?}");
    assert_eq!(
        kinds[3..],
        ["dir", "file", "file", "dir", "worker", "counters"],
        "{texts:#?}"
    );

    // Read again to look at the records themselves.
    let frame = client.request(ControlMessage::StatusRequest { cursor: 0 });
    let ControlMessage::StatusReply(first) = frame.message() else {
        panic!("not a status page");
    };
    let StatusRecord::Daemon(daemon_record) = first.records.iter().next().unwrap() else {
        panic!("the report starts with the daemon");
    };
    assert_eq!(daemon_record.pid, daemon.pid() as u32);
    assert_eq!(daemon_record.max_msg_size, 256);
    assert_eq!(daemon_record.workers, 1);
    assert_eq!(daemon_record.version, env!("CARGO_PKG_VERSION"));
    let all = texts.join("\n");
    assert!(all.contains("outcome: Refused"), "{all}");
    assert!(
        all.contains(&format!("state: {:?}", DirState::Unreadable)),
        "{all}"
    );
    assert!(
        all.contains(&format!("outcome: {:?}", PluginOutcome::Offered)),
        "{all}"
    );
    assert!(
        all.contains(&format!("state: {:?}", WorkerState::Running)),
        "{all}"
    );
    assert!(all.contains(&format!("id: {worker}")), "{all}");
    assert!(all.contains("gid: 9"), "{all}");

    // A cursor past the report is refused, and the connection goes on.
    let frame = client.request(ControlMessage::StatusRequest { cursor: 1000 });
    let (status, reason) = frame.refusal().unwrap_err();
    assert_eq!(status, Status::InvalidValue);
    assert!(reason.contains("ask for record 0"), "{reason}");
    assert_eq!(client.by_gid(9), [worker]);
}

#[test]
fn only_an_authenticated_host_may_ask_for_the_status() {
    let (_plugins, daemon) = graph_daemon(&[]);
    let mut client = ControlClient::connect(&daemon.socket, TIMEOUT).unwrap();
    let frame = client.request(ControlMessage::StatusRequest { cursor: 0 });
    let (status, reason) = frame.refusal().unwrap_err();
    assert_eq!(status, Status::Authentication);
    assert!(reason.contains("StatusRequest"), "{reason}");
}
