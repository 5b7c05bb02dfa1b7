//! `--metrics-listen ADDR`: the status report's numbers for Prometheus, in its text exposition
//! format (OpenMetrics), from a small HTTP responder on a thread of its own.
//!
//! `GET /metrics` gathers the report as root sees it (every worker) and encodes it with
//! `prometheus-client`; any other path is 404, any other method 405. One request at a time: a
//! request may take at most [`MAX_REQUEST`] bytes and [`READ_TIMEOUT`] to arrive, and a
//! scraper that holds its connection open longer is dropped, so a stuck client delays the
//! next scrape by at most that long and never touches hosts.

use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tracing::{debug, warn};
use urom_wire::report::WorkerState;

use crate::Service;
use crate::discovery::FileOutcome;
use crate::status::{Report, collect};

/// The most bytes of a request (line and headers) read.
pub const MAX_REQUEST: usize = 8 * 1024;
/// How long a client has to send its request.
pub const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// How many bytes of a refused request are read and dropped before its connection closes.
const LINGER_BYTES: u64 = 64 * 1024;
/// How long accepting waits after it failed before it tries again.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);
/// The content type of the exposition.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Binds `addr` for the metrics endpoint; the daemon answers scrapes on it from a thread of its
/// own.
pub fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    TcpListener::bind(addr)
}

/// Answers scrapes on `listener`, one at a time, sleeping in `accept` between them, for as long
/// as the daemon runs.
pub(crate) fn serve(listener: TcpListener, service: &Arc<Service>) {
    loop {
        match listener.accept() {
            Ok((stream, peer)) => {
                if let Err(e) = answer(stream, service) {
                    debug!(%peer, "metrics request failed: {e}");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                warn!("metrics accept failed: {e}");
                // Out of open files, most likely: try again a little later.
                std::thread::sleep(ACCEPT_RETRY);
            }
        }
    }
}

fn answer(mut stream: TcpStream, service: &Service) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(READ_TIMEOUT))?;
    stream.set_write_timeout(Some(READ_TIMEOUT))?;
    let request = match read_request(&mut stream) {
        Ok(request) => request,
        Err(e) if e.kind() == io::ErrorKind::InvalidData => {
            respond(
                &mut stream,
                "413 Content Too Large",
                "text/plain",
                &e.to_string(),
            )?;
            // Read what the client still sends (a little, for a little while) before closing,
            // so that it gets the answer rather than a reset.
            stream.shutdown(std::net::Shutdown::Write)?;
            let _ = io::copy(&mut (&stream).take(LINGER_BYTES), &mut io::sink());
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    let mut words = request
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace();
    let (method, path) = (
        words.next().unwrap_or_default(),
        words.next().unwrap_or("/"),
    );
    let path = path.split('?').next().unwrap_or(path);
    match (method, path) {
        ("GET", "/metrics") => {
            let body = exposition(&collect(service, &crate::registry::Owner::local(0)));
            respond(&mut stream, "200 OK", CONTENT_TYPE, &body)
        }
        ("GET", _) => respond(
            &mut stream,
            "404 Not Found",
            "text/plain",
            "urom-daemon serves its metrics at /metrics\n",
        ),
        _ => respond(
            &mut stream,
            "405 Method Not Allowed",
            "text/plain",
            "only GET is served\n",
        ),
    }
}

/// Reads until the blank line that ends the headers; at most [`MAX_REQUEST`] bytes.
fn read_request(stream: &mut TcpStream) -> io::Result<String> {
    let mut request = Vec::new();
    let mut chunk = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") && !request.ends_with(b"\n\n") {
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        request.extend_from_slice(&chunk[..n]);
        if request.len() > MAX_REQUEST {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("request longer than {MAX_REQUEST} bytes\n"),
            ));
        }
    }
    Ok(String::from_utf8_lossy(&request).into_owned())
}

fn respond(stream: &mut TcpStream, status: &str, content_type: &str, body: &str) -> io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    stream.flush()
}

type Labels = Vec<(String, String)>;

fn worker_labels(report: &crate::status::WorkerReport) -> Labels {
    let view = &report.view;
    let user = if report.user.is_empty() {
        view.owner.to_string()
    } else {
        report.user.clone()
    };
    vec![
        ("worker".into(), view.id.to_string()),
        ("gid".into(), view.gid.to_string()),
        ("user".into(), user),
    ]
}

fn state_name(state: WorkerState) -> String {
    match state {
        WorkerState::Starting => "starting".into(),
        WorkerState::Running => "running".into(),
        WorkerState::Stopping => "stopping".into(),
        WorkerState::Unknown(code) => format!("unknown_{code}"),
    }
}

/// The report in the Prometheus text exposition format.
pub fn exposition(report: &Report) -> String {
    let mut registry = Registry::with_prefix("urom");
    let d = &report.daemon;

    let info = Family::<Labels, Gauge>::default();
    info.get_or_create(&vec![("version".into(), d.version.into())])
        .set(1);
    registry.register("daemon_info", "The daemon's version (always 1)", info);
    let gauge = |registry: &mut Registry, name: &str, help: &str, value: i64| {
        let metric = Gauge::<i64>::default();
        metric.set(value);
        registry.register(name, help, metric);
    };
    gauge(
        &mut registry,
        "daemon_uptime_seconds",
        "Seconds since the daemon started",
        (d.uptime_ms / 1000) as i64,
    );
    gauge(
        &mut registry,
        "daemon_hosts",
        "Host connections now",
        d.hosts.into(),
    );
    gauge(
        &mut registry,
        "daemon_max_workers",
        "The most workers at once",
        d.max_workers.into(),
    );
    let files = report.survey.dirs.iter().flat_map(|dir| &dir.files);
    let left_out = files
        .filter(|file| !matches!(file.outcome, FileOutcome::Offered { .. }))
        .count();
    gauge(
        &mut registry,
        "plugins_offered",
        "Plugins offered to hosts",
        report.survey.plugins.len() as i64,
    );
    gauge(
        &mut registry,
        "plugin_files_left_out",
        "Plugin files found but not offered (see urom-ctl plugins for why)",
        left_out as i64,
    );
    let unreadable = report
        .survey
        .dirs
        .iter()
        .filter(|dir| dir.error.is_some())
        .count();
    gauge(
        &mut registry,
        "plugin_dirs_unreadable",
        "Directories of UROM_PLUGIN_PATH that cannot be read",
        unreadable as i64,
    );
    let pool = &report.hugepages.pool;
    gauge(
        &mut registry,
        "hugepages_total",
        "Hugepages reserved on the system",
        pool.total.into(),
    );
    gauge(
        &mut registry,
        "hugepages_free",
        "Hugepages free on the system",
        pool.free.into(),
    );

    let workers = Family::<Labels, Gauge>::default();
    for state in [
        WorkerState::Starting,
        WorkerState::Running,
        WorkerState::Stopping,
    ] {
        let count = report
            .workers
            .iter()
            .filter(|w| w.view.state == state)
            .count();
        workers
            .get_or_create(&vec![("state".into(), state_name(state))])
            .set(count as i64);
    }
    registry.register("workers", "Workers by state", workers);

    let commands = Family::<Labels, Counter>::default();
    let notifications = Family::<Labels, Counter>::default();
    let errors = Family::<Labels, Counter>::default();
    let received = Family::<Labels, Counter>::default();
    let sent = Family::<Labels, Counter>::default();
    let in_flight = Family::<Labels, Gauge>::default();
    let peak_ring = Family::<Labels, Gauge>::default();
    let peak_backlog = Family::<Labels, Gauge>::default();
    let channels = Family::<Labels, Gauge>::default();
    let started = Family::<Labels, Gauge>::default();
    let up = Family::<Labels, Gauge>::default();
    for worker in &report.workers {
        let labels = worker_labels(worker);
        let start = worker
            .view
            .started
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        started.get_or_create(&labels).set(start as i64);
        let Ok((counters, by_status)) = &worker.counters else {
            up.get_or_create(&labels).set(0);
            continue;
        };
        up.get_or_create(&labels).set(1);
        commands.get_or_create(&labels).inc_by(counters.commands);
        notifications
            .get_or_create(&labels)
            .inc_by(counters.notifications);
        received.get_or_create(&labels).inc_by(counters.bytes_in);
        sent.get_or_create(&labels).inc_by(counters.bytes_out);
        in_flight
            .get_or_create(&labels)
            .set(counters.in_flight.into());
        peak_ring
            .get_or_create(&labels)
            .set(counters.peak_ring.into());
        peak_backlog
            .get_or_create(&labels)
            .set(i64::try_from(counters.peak_backlog_bytes).unwrap_or(i64::MAX));
        channels.get_or_create(&labels).set(counters.hosts.into());
        for entry in by_status {
            let mut labels = labels.clone();
            labels.push(("status".into(), entry.status.name().into()));
            errors.get_or_create(&labels).inc_by(entry.count);
        }
    }
    registry.register(
        "worker_start_time_seconds",
        "When the worker was spawned, in seconds since the Unix epoch",
        started,
    );
    registry.register(
        "worker_counters_up",
        "1 when the worker answered the daemon's request for its counters",
        up,
    );
    registry.register(
        "worker_commands",
        "Command frames the worker received from hosts",
        commands,
    );
    registry.register(
        "worker_notifications",
        "Notifications the worker sent to hosts, errors included",
        notifications,
    );
    registry.register(
        "worker_errors",
        "Notifications the worker sent with an error status, by status",
        errors,
    );
    registry.register(
        "worker_received_bytes",
        "Bytes of command frames the worker received",
        received,
    );
    registry.register(
        "worker_sent_bytes",
        "Bytes of notification frames the worker sent",
        sent,
    );
    registry.register(
        "worker_in_flight",
        "Commands received whose notification has not been sent yet",
        in_flight,
    );
    registry.register(
        "worker_peak_ring_occupancy",
        "The most commands found waiting in one host's ring at once (counted up to 64 a pass)",
        peak_ring,
    );
    registry.register(
        "worker_peak_backlog_bytes",
        "The most bytes of notifications held for a host whose ring was full",
        peak_backlog,
    );
    registry.register(
        "worker_host_channels",
        "Host channels connected to the worker",
        channels,
    );

    let mut text = String::new();
    if encode(&mut text, &registry).is_err() {
        let _ = writeln!(text, "# the metrics could not be encoded");
    }
    text
}
