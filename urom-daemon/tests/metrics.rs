//! `--metrics-listen`: the endpoint serves Prometheus text that parses, its worker counters move
//! as commands go through, and requests other than a scrape are answered and bounded.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::*;
use urom_testkit::control::ControlClient;
use urom_testkit::worker::{connect, loopback, next_notification, send_command};
use urom_wire::Status;
use urom_wire::control::{ControlMessage, WORKER_ID_ANY};
use urom_wire::report::{ListenKind, StatusRecord};

/// One sample: name, labels, value.
type Sample = (String, BTreeMap<String, String>, f64);

/// Sends `request` and returns the status line, the headers and the body.
fn http(addr: SocketAddr, request: &[u8]) -> (String, String, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(TIMEOUT)).unwrap();
    stream.write_all(request).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("a head and a body");
    let (status, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    (status.to_owned(), headers.to_owned(), body.to_owned())
}

fn is_name(text: &str) -> bool {
    let mut chars = text.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Parses the text exposition format strictly: comments of the known kinds, then samples
/// `name{label="value",...} number`, and `# EOF` at the end; panics on anything else.
fn parse_exposition(text: &str) -> Vec<Sample> {
    let mut samples = Vec::new();
    let mut typed = BTreeMap::new();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.last(),
        Some(&"# EOF"),
        "the exposition ends with # EOF"
    );
    for line in &lines[..lines.len() - 1] {
        if let Some(comment) = line.strip_prefix("# ") {
            let mut words = comment.splitn(3, ' ');
            let (keyword, name) = (words.next().unwrap(), words.next().unwrap_or(""));
            assert!(
                matches!(keyword, "HELP" | "TYPE" | "UNIT") && is_name(name),
                "bad comment line: {line}"
            );
            if keyword == "TYPE" {
                let kind = words.next().unwrap_or("");
                assert!(matches!(kind, "counter" | "gauge" | "info"), "{line}");
                typed.insert(name.to_owned(), kind.to_owned());
            }
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("a sample has a value");
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value: {line}"));
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => (name, rest.strip_suffix('}').expect("labels end with }")),
            None => (series, ""),
        };
        assert!(is_name(name), "bad metric name: {line}");
        let family = name.strip_suffix("_total").unwrap_or(name);
        assert!(
            typed.contains_key(name) || typed.contains_key(family),
            "sample without a TYPE: {line}"
        );
        let mut parsed = BTreeMap::new();
        for pair in labels.split(',').filter(|pair| !pair.is_empty()) {
            let (key, quoted) = pair.split_once('=').expect("label=value");
            assert!(is_name(key), "bad label name: {line}");
            let value = quoted
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or_else(|| panic!("unquoted label value: {line}"));
            parsed.insert(key.to_owned(), value.to_owned());
        }
        samples.push((name.to_owned(), parsed, value));
    }
    samples
}

fn scrape(addr: SocketAddr) -> Vec<Sample> {
    let (status, headers, body) = http(addr, b"GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n");
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(
        headers.contains("Content-Type: application/openmetrics-text"),
        "{headers}"
    );
    parse_exposition(&body)
}

fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples
        .iter()
        .find(|(n, l, _)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|(_, _, value)| *value)
}

/// Scrapes until the worker's command count is `commands`.
fn scrape_until(addr: SocketAddr, worker: &str, commands: f64) -> Vec<Sample> {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let samples = scrape(addr);
        let seen = value(
            &samples,
            "urom_worker_commands_total",
            &[("worker", worker)],
        );
        if seen == Some(commands) {
            return samples;
        }
        assert!(
            Instant::now() < deadline,
            "commands never reached {commands}: {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_endpoint_serves_counters_that_move_with_commands() {
    let (_plugins, daemon) = graph_daemon(&["--metrics-listen", "127.0.0.1:0"]);
    let mut client = ControlClient::connect(&daemon.socket, TIMEOUT).unwrap();
    client.handshake().unwrap();
    // The port the daemon was given: the status report names it.
    let frame = client.request(ControlMessage::StatusRequest { cursor: 0 });
    let ControlMessage::StatusReply(page) = frame.message() else {
        panic!("not a status page");
    };
    let addr: SocketAddr = page
        .records
        .iter()
        .find_map(|record| match record {
            StatusRecord::Listen(l) if l.kind == ListenKind::Metrics => l.address.parse().ok(),
            _ => None,
        })
        .expect("the report names the metrics address");
    assert!(
        daemon
            .log()
            .contains(&format!("serving metrics at http://{addr}/metrics")),
        "{}",
        daemon.log()
    );

    let samples = scrape(addr);
    assert_eq!(
        value(
            &samples,
            "urom_daemon_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        Some(1.0)
    );
    assert_eq!(value(&samples, "urom_plugins_offered", &[]), Some(1.0));
    assert_eq!(
        value(&samples, "urom_workers", &[("state", "running")]),
        Some(0.0)
    );

    let (worker, socket) = client.spawn(WORKER_ID_ANY, 2, 1, "", &[]).unwrap();
    let id = worker.to_string();
    let mut channel = connect(&socket);
    for seq in 1..=5u64 {
        send_command(&mut channel, seq, 1, seq, &loopback(seq));
        let (_, context, status, _) = next_notification(&mut channel);
        assert_eq!((context, status), (seq, Status::Success));
    }
    let samples = scrape_until(addr, &id, 5.0);
    let labels = [("worker", id.as_str()), ("gid", "2")];
    assert_eq!(
        value(&samples, "urom_workers", &[("state", "running")]),
        Some(1.0)
    );
    assert_eq!(
        value(&samples, "urom_worker_notifications_total", &labels),
        Some(5.0)
    );
    assert_eq!(
        value(&samples, "urom_worker_counters_up", &labels),
        Some(1.0)
    );
    assert_eq!(
        value(&samples, "urom_worker_host_channels", &labels),
        Some(1.0)
    );
    assert_eq!(value(&samples, "urom_worker_in_flight", &labels), Some(0.0));
    let received = value(&samples, "urom_worker_received_bytes_total", &labels).unwrap();
    assert!(received >= 5.0 * 40.0, "{received}");

    // Three more, one refused by the plugin (an empty command): the counters move on.
    for seq in 6..=8u64 {
        let payload = if seq == 8 {
            Vec::new()
        } else {
            loopback(seq).to_vec()
        };
        send_command(&mut channel, seq, 1, seq, &payload);
        next_notification(&mut channel);
    }
    let samples = scrape_until(addr, &id, 8.0);
    assert_eq!(
        value(&samples, "urom_worker_notifications_total", &labels),
        Some(8.0)
    );
    assert_eq!(
        value(
            &samples,
            "urom_worker_errors_total",
            &[
                ("worker", id.as_str()),
                ("status", "DOCA_ERROR_INVALID_VALUE")
            ]
        ),
        Some(1.0)
    );
    let more = value(&samples, "urom_worker_received_bytes_total", &labels).unwrap();
    assert!(more > received, "{more} after {received}");

    // Every metric the example dashboard plots is one the daemon serves.
    let dashboard = std::fs::read_to_string(
        urom_testkit::workspace_root().join("deploy/grafana-dashboard.json"),
    )
    .unwrap();
    let mut plotted: Vec<&str> = dashboard
        .match_indices("urom_")
        .map(|(at, _)| {
            let rest = &dashboard[at..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .filter(|name| *name != "urom_")
        .collect();
    plotted.sort_unstable();
    plotted.dedup();
    assert!(plotted.len() >= 10, "{plotted:?}");
    for name in plotted {
        assert!(
            samples.iter().any(|(n, _, _)| n == name),
            "the dashboard plots {name}, which the daemon does not serve"
        );
    }
}

#[test]
fn requests_other_than_a_scrape_are_answered_and_bounded() {
    let (_plugins, daemon) = graph_daemon(&["--metrics-listen", "127.0.0.1:0"]);
    // The log names the port the daemon was given.
    let deadline = Instant::now() + TIMEOUT;
    let addr: SocketAddr = loop {
        let log = daemon.log();
        let found = log
            .lines()
            .find_map(|line| line.split("serving metrics at http://").nth(1))
            .and_then(|rest| rest.split("/metrics").next())
            .and_then(|addr| addr.parse().ok());
        if let Some(addr) = found {
            break addr;
        }
        assert!(
            Instant::now() < deadline,
            "no metrics address in the log:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let (status, _, body) = http(addr, b"GET / HTTP/1.1\r\n\r\n");
    assert_eq!(status, "HTTP/1.1 404 Not Found");
    assert!(body.contains("/metrics"), "{body}");
    let (status, _, _) = http(addr, b"POST /metrics HTTP/1.1\r\n\r\n");
    assert_eq!(status, "HTTP/1.1 405 Method Not Allowed");
    let mut huge = b"GET /metrics HTTP/1.1\r\nX-Padding: ".to_vec();
    huge.extend(std::iter::repeat_n(b'a', 16 * 1024));
    let (status, _, _) = http(addr, &huge);
    assert_eq!(status, "HTTP/1.1 413 Content Too Large");
    // A client that says nothing is dropped after the read timeout; scrapes go on.
    let silent = TcpStream::connect(addr).unwrap();
    let samples = scrape(addr);
    assert_eq!(value(&samples, "urom_plugins_offered", &[]), Some(1.0));
    drop(silent);
}
