//! `gpu-offload-server`: the TCP front end.
//!
//! Control phase: listen where the channel's `-c` name says (a Unix socket, or a UCX address
//! when the orchestrator runs on another machine), wait for the orchestrator, agree on the
//! thread count and message length, set up one data connection per thread and exchange consumer
//! ids ([`crate::channel`]); start one data-path thread per `--cpu`, pinned to it
//! (`datapath`, compiled for the channel's transport); then listen on TCP. Serving phase: the main thread accepts clients and hands
//! them to the data-path threads in turn, and watches the control connection and the stop flag.
//!
//! Shutdown: on SIGINT or SIGTERM the server stops accepting, lets each thread drain (answers
//! for every request already forwarded are written; clients then get a clean close), then sends
//! `start_shutdown` and waits for the orchestrator's `shutdown_complete`. On `start_shutdown`
//! from the orchestrator it drains the same way and answers `shutdown_complete`.
//!
//! An orchestrator that goes away (its control or a data connection breaks) does not end the
//! server: each thread closes the clients whose requests it had in flight (after the answers
//! they were given) and holds the others' requests; the main thread keeps accepting clients and
//! takes the next orchestrator that connects on the channel, whose data connections it hands
//! to the threads (`ChannelSlot`). While one is connected, another is told it is not wanted.

mod datapath;

use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use clap::Parser;
use crossbeam_queue::ArrayQueue;
use nix::sys::eventfd::EventFd;
use tracing::{error, info, warn};
use urom_cli::JsonArgs;
use urom_transport::Transport;
use urom_wire::gpu::GpuMessage;

use crate::channel::{
    self, ChannelError, ChannelListener, ChannelParams, ControlEvent, DataConnections, Endpoint,
};
use crate::limits::MAX_WAITING_CLIENTS;
use datapath::{ChannelSlot, DataPath, DataPathConfig, DataPathEnd, Mailbox};

/// How long the server waits for the orchestrator's `shutdown_complete`.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(10);
/// How long the server stops accepting after the first failed `accept` (out of descriptors and
/// the like); each failure in a row doubles it, up to [`ACCEPT_PAUSE_MAX`].
const ACCEPT_PAUSE_MIN: Duration = Duration::from_millis(10);
/// The longest pause in accepting.
const ACCEPT_PAUSE_MAX: Duration = Duration::from_secs(1);
/// A failing `accept` is logged at most once per this interval.
const ACCEPT_LOG_EVERY: Duration = Duration::from_secs(10);

/// Receives requests from TCP clients, has the orchestrator process them, and sends the
/// responses back.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "gpu-offload-server",
    version,
    disable_version_flag = true,
    args_override_self = true
)]
pub struct ServerArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: crate::cli::CommonArgs,

    /// Comch device PCIe address in the original. Here the channel is urom's shared memory
    /// (or UCX, see -c), so it selects nothing; accepted for compatibility.
    #[arg(short = 'd', long, value_name = "DEV ID")]
    pub device_id: Option<String>,

    /// Comch representor PCIe address in the original; selects nothing here (see
    /// --device-id).
    #[arg(short = 'r', long, value_name = "REPRESENTOR ID")]
    pub representor_id: Option<String>,

    #[command(flatten)]
    #[allow(missing_docs)]
    pub channel: crate::cli::ChannelArgs,

    /// TCP port to listen on for clients; 0 picks a free port (printed on stdout).
    #[arg(short = 'p', long, value_name = "PORT")]
    pub server_listen_port: u16,

    /// Address to listen on.
    #[arg(short = 'a', long, value_name = "IP", default_value = "0.0.0.0")]
    pub listen_address: IpAddr,

    /// CPU to run a data-path thread on, pinned; repeat for more threads.
    #[arg(long = "cpu", value_name = "CPU", required = true)]
    pub cpus: Vec<usize>,
}

impl JsonArgs for ServerArgs {}

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The channel to the orchestrator could not be set up.
    #[error(transparent)]
    Channel(#[from] ChannelError),
    /// The TCP socket could not be opened.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// What the OS said.
        source: io::Error,
    },
    /// A `--cpu` this process may not run on.
    #[error(transparent)]
    Cpu(crate::cli::CpuCheckError),
    /// More `--cpu` flags than the orchestrator can run processor threads for.
    #[error(
        "--cpu given {0} times: at most {max} data-path threads, as the orchestrator runs at most \
         {max} processor threads (-t)",
        max = crate::limits::MAX_PROCESSOR_THREADS
    )]
    TooManyThreads(usize),
    /// The responses the data-path threads may hold in flight need more memory than the
    /// machine has.
    #[error(
        "--max-concurrent-messages {concurrent} x --max-message-length {length} (+{header} \
         header bytes) x {threads} data-path threads: up to {need:.1} GiB of responses in \
         flight, more than this machine's {total:.1} GiB of memory; {largest}",
        header = urom_wire::gpu::CLIENT_HEADER_LEN,
        need = *need as f64 / GIB,
        total = *total as f64 / GIB,
    )]
    TooMuchMemory {
        /// `--max-concurrent-messages`.
        concurrent: u32,
        /// `--max-message-length`.
        length: u32,
        /// Data-path threads.
        threads: usize,
        /// Bytes the configuration may need.
        need: u64,
        /// Bytes of memory of this machine.
        total: u64,
        /// The largest configuration that fits, as flags.
        largest: String,
    },
    /// A data-path thread could not be pinned to its CPU.
    #[error("{0} (is the --cpu online and allowed for this process?)")]
    Pin(#[source] urom_transport::sys::PinError),
    /// A data-path thread could not be started.
    #[error("cannot start a data-path thread: {0}")]
    Thread(#[source] io::Error),
    /// A data-path thread ended without being asked to (it panicked).
    #[error("a data-path thread ended unexpectedly; clients closed (see the log)")]
    ThreadEnded,
}

/// How the server's run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerEnd {
    /// A stop signal: the server drained and shut the orchestrator down.
    Stopped,
    /// The orchestrator asked to shut down.
    ShutdownByOrchestrator,
}

/// The server after it checked its flags and bound its channel socket and TCP port, before
/// the orchestrator connected.
pub struct PendingServer {
    args: ServerArgs,
    listener: ChannelListener,
    /// The TCP socket, bound to the port but not listening yet: clients that come before the
    /// orchestrator are refused, not queued.
    tcp: OwnedFd,
}

/// A data-path thread as the main thread sees it.
struct ThreadHandle {
    /// Clients handed to the thread, which takes them when woken.
    incoming: Arc<ArrayQueue<(TcpStream, SocketAddr)>>,
    wake: Arc<EventFd>,
    join: JoinHandle<DataPathEnd>,
    /// Where a data connection to a new orchestrator goes.
    slot: AnySlot,
}

/// A thread's [`ChannelSlot`], of its transport.
enum AnySlot {
    Shm(Arc<ChannelSlot<urom_transport::shm::ShmConnection>>),
    #[cfg(feature = "ucx")]
    Ucx(Arc<ChannelSlot<urom_transport::ucx::UcxConnection>>),
}

/// A running server: channel set up, threads started, TCP listening.
pub struct Server {
    listener: TcpListener,
    /// None while no orchestrator is connected (the last went away).
    control: Option<channel::Control>,
    threads: Vec<ThreadHandle>,
    draining: Arc<AtomicBool>,
    /// A data-path thread's data connection broke.
    lost: Arc<AtomicUsize>,
    /// How many orchestrators came before the one served now.
    epoch: usize,
    /// Accepting pauses until then after `accept` failed.
    accept_paused_until: Option<Instant>,
    /// The next pause after a failed `accept`.
    accept_pause: Duration,
    accept_failed: urom_cli::LogEvery,
    /// Where another orchestrator would connect: answered that this server has one.
    channel_socket: ChannelListener,
    params: ChannelParams,
}

impl ServerArgs {
    fn params(&self) -> ChannelParams {
        ChannelParams {
            threads: self.cpus.len() as u32,
            max_message_length: self.channel.max_message_length,
            max_concurrent: self.channel.max_concurrent_messages,
        }
    }
}

impl PendingServer {
    /// Listens on the channel socket named by `args`.
    pub fn bind(args: ServerArgs) -> Result<Self, ServerError> {
        // Flags that cannot work are refused now, not once the orchestrator is there.
        if args.cpus.len() > crate::limits::MAX_PROCESSOR_THREADS as usize {
            return Err(ServerError::TooManyThreads(args.cpus.len()));
        }
        args.params().channel_config()?;
        if let Some(total) = memory_total() {
            check_memory(&args, total)?;
        }
        crate::cli::check_cpus(&args.cpus).map_err(ServerError::Cpu)?;
        let addr = SocketAddr::new(args.listen_address, args.server_listen_port);
        let tcp = bind_tcp(addr).map_err(|source| ServerError::Listen { addr, source })?;
        let endpoint = args.channel.endpoint()?;
        if args.device_id.is_some() || args.representor_id.is_some() {
            info!(
                device = args.device_id.as_deref().unwrap_or("-"),
                representor = args.representor_id.as_deref().unwrap_or("-"),
                "device and representor ids select nothing here: the channel is {}",
                match endpoint {
                    Endpoint::Local(_) => "shared memory",
                    Endpoint::Ucx(_) => "UCX",
                }
            );
        }
        let listener = ChannelListener::bind(&endpoint)?;
        Ok(Self {
            args,
            listener,
            tcp,
        })
    }

    /// Where the channel listens: what the orchestrator's `-c` must name.
    pub fn channel_endpoint(&self) -> Endpoint {
        self.listener.endpoint()
    }

    /// Waits for the orchestrator (until `stop`), starts the data-path threads and listens
    /// on TCP.
    pub fn start(mut self, stop: &AtomicBool) -> Result<Server, ServerError> {
        let params = self.args.params();
        let endpoint = self.listener.endpoint();
        info!(
            channel = %endpoint,
            "waiting for the orchestrator: gpu-offload-orchestrator -c {} -t {} --max-message-length {}; clients are accepted once it is connected",
            match endpoint {
                Endpoint::Local(_) => self.args.channel.comch_channel_name.clone(),
                Endpoint::Ucx(_) => endpoint.to_string(),
            },
            params.threads,
            params.max_message_length
        );
        let channel = self.listener.accept(&params, stop)?;
        info!(
            threads = params.threads,
            transport = channel.data.transport(),
            "orchestrator connected"
        );
        let draining = Arc::new(AtomicBool::new(false));
        let lost = Arc::new(AtomicUsize::new(0));
        let threads = match channel.data {
            DataConnections::Shm(conns) => spawn_threads(
                &self.args.cpus,
                conns,
                &params,
                &draining,
                &lost,
                AnySlot::Shm,
            ),
            #[cfg(feature = "ucx")]
            DataConnections::Ucx(conns) => spawn_threads(
                &self.args.cpus,
                conns,
                &params,
                &draining,
                &lost,
                AnySlot::Ucx,
            ),
        }?;
        let addr = SocketAddr::new(self.args.listen_address, self.args.server_listen_port);
        let listener = match listen_tcp(self.tcp) {
            Ok(listener) => listener,
            Err(source) => {
                stop_threads(&draining, threads);
                return Err(ServerError::Listen { addr, source });
            }
        };
        Ok(Server {
            listener,
            control: Some(channel.control),
            threads,
            draining,
            lost,
            epoch: 0,
            accept_paused_until: None,
            accept_pause: ACCEPT_PAUSE_MIN,
            accept_failed: urom_cli::LogEvery::new(ACCEPT_LOG_EVERY),
            channel_socket: self.listener,
            params,
        })
    }
}

/// Starts one data-path thread per CPU of `cpus`, pinned to it, serving the data connection
/// of the same index (of transport `T`, for which the thread is compiled); returns once each
/// has started, or stops them all on the first failure.
fn spawn_threads<T: Transport + Send + 'static>(
    cpus: &[usize],
    conns: Vec<T>,
    params: &ChannelParams,
    draining: &Arc<AtomicBool>,
    lost: &Arc<AtomicUsize>,
    any_slot: fn(Arc<ChannelSlot<T>>) -> AnySlot,
) -> Result<Vec<ThreadHandle>, ServerError> {
    let mut threads = Vec::with_capacity(cpus.len());
    let (ready_tx, ready_rx) = mpsc::channel();
    let mailboxes = cpus
        .iter()
        .map(|&cpu| Mailbox::new(cpu, MAX_WAITING_CLIENTS))
        .collect::<io::Result<Arc<[Mailbox]>>>()
        .map_err(ServerError::Thread)?;
    for (index, (cpu, conn)) in cpus.iter().zip(conns).enumerate() {
        let incoming = Arc::clone(&mailboxes[index].incoming);
        let wake = Arc::clone(&mailboxes[index].wake);
        let slot = Arc::new(ChannelSlot::new());
        let config = DataPathConfig {
            index,
            max_message_length: params.max_message_length as usize,
            max_concurrent: params.max_concurrent as usize,
            frame_capacity: params.frame_capacity(),
            channel: conn,
            mailboxes: Arc::clone(&mailboxes),
            draining: Arc::clone(draining),
            lost: Arc::clone(lost),
            slot: Arc::clone(&slot),
        };
        let cpu = *cpu;
        let ready = ready_tx.clone();
        let join = std::thread::Builder::new()
            .name(format!("data-path-{index}"))
            .spawn(move || {
                if let Err(e) = urom_transport::sys::pin_current_thread(cpu) {
                    let _ = ready.send(Err(ServerError::Pin(e)));
                    return DataPathEnd::Drained;
                }
                match DataPath::new(config) {
                    Ok(path) => {
                        let _ = ready.send(Ok(()));
                        path.run()
                    }
                    Err(e) => {
                        let _ = ready.send(Err(ServerError::Thread(e)));
                        DataPathEnd::Drained
                    }
                }
            })
            .map_err(ServerError::Thread)?;
        info!(thread = index, cpu, "data-path thread started");
        threads.push(ThreadHandle {
            incoming,
            wake,
            join,
            slot: any_slot(slot),
        });
    }
    drop(ready_tx);
    let mut failure = None;
    for _ in 0..threads.len() {
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failure = failure.or(Some(e)),
            Err(_) => failure = failure.or(Some(ServerError::Thread(io::ErrorKind::Other.into()))),
        }
    }
    if let Some(e) = failure {
        stop_threads(draining, threads);
        return Err(e);
    }
    Ok(threads)
}

/// Bytes in a GiB, for messages.
const GIB: f64 = (1u64 << 30) as f64;

/// This machine's memory (`MemTotal` of `/proc/meminfo`), if it can be read.
fn memory_total() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Refuses flags whose responses in flight (each data-path thread holds up to
/// `--max-concurrent-messages` largest responses in its clients' write buffers) need more
/// than `total` bytes, naming the largest `--max-concurrent-messages` (or, when not even one
/// fits, `--max-message-length`) that fits.
fn check_memory(args: &ServerArgs, total: u64) -> Result<(), ServerError> {
    let threads = args.cpus.len() as u64;
    let length = args.channel.max_message_length;
    let message = u64::from(length) + urom_wire::gpu::CLIENT_HEADER_LEN as u64;
    let concurrent = args.channel.max_concurrent_messages;
    let need = u64::from(concurrent) * message * threads;
    if need <= total {
        return Ok(());
    }
    let fits = total / (message * threads);
    let largest = if fits > 0 {
        format!("with this length, at most --max-concurrent-messages {fits}")
    } else {
        let longest = (total / threads).saturating_sub(urom_wire::gpu::CLIENT_HEADER_LEN as u64);
        format!("with one request in flight, at most --max-message-length {longest}")
    };
    Err(ServerError::TooMuchMemory {
        concurrent,
        length,
        threads: args.cpus.len(),
        need,
        total,
        largest,
    })
}

/// A TCP socket bound to `addr` (with `SO_REUSEADDR`, as `TcpListener::bind` sets it), not
/// listening yet.
fn bind_tcp(addr: SocketAddr) -> io::Result<OwnedFd> {
    use nix::sys::socket::{
        AddressFamily, SockFlag, SockType, SockaddrIn, SockaddrIn6, bind, setsockopt, socket,
        sockopt,
    };
    let family = match addr {
        SocketAddr::V4(_) => AddressFamily::Inet,
        SocketAddr::V6(_) => AddressFamily::Inet6,
    };
    let fd = socket(family, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)?;
    setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    match addr {
        SocketAddr::V4(addr) => bind(fd.as_raw_fd(), &SockaddrIn::from(addr))?,
        SocketAddr::V6(addr) => bind(fd.as_raw_fd(), &SockaddrIn6::from(addr))?,
    }
    Ok(fd)
}

/// Starts listening on the socket [`bind_tcp`] made.
fn listen_tcp(fd: OwnedFd) -> io::Result<TcpListener> {
    use nix::sys::socket::{Backlog, listen};
    listen(&fd, Backlog::new(1024).unwrap_or(Backlog::MAXCONN))?;
    let listener = TcpListener::from(fd);
    listener.set_nonblocking(true)?;
    Ok(listener)
}

fn stop_threads(draining: &AtomicBool, threads: Vec<ThreadHandle>) -> Vec<DataPathEnd> {
    draining.store(true, Ordering::Relaxed);
    for thread in &threads {
        let _ = thread.wake.write(1);
    }
    threads
        .into_iter()
        .map(|t| t.join.join().unwrap_or(DataPathEnd::Panicked))
        .collect()
}

impl Server {
    /// The TCP address clients connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// Serves clients until `stop` is set or the orchestrator shuts down. When the
    /// orchestrator goes away, the clients whose requests were in flight are closed after the
    /// answers they were given, the others keep their connections (their requests wait), new
    /// clients are still accepted, and the next orchestrator that connects is served.
    pub fn run(mut self, stop: &AtomicBool) -> Result<ServerEnd, ServerError> {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let mut next = 0usize;
        let cause = loop {
            if stop.load(Ordering::Relaxed) {
                break None;
            }
            // While accepting is paused, the listener is not polled: a client waiting in its
            // queue would wake the loop at once, over and over.
            let mut wait = channel::TICK;
            if let Some(until) = self.accept_paused_until {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    self.accept_paused_until = None;
                } else {
                    wait = wait.min(left);
                }
            }
            let accepting = self.accept_paused_until.is_none();
            let (listener_ready, control_ready) = {
                let listener = std::os::fd::AsFd::as_fd(&self.listener);
                let mut fds: [PollFd<'_>; 3] =
                    std::array::from_fn(|_| PollFd::new(listener, PollFlags::POLLIN));
                let mut polled = usize::from(accepting);
                // The control connection's descriptors; none means a message may be there
                // already (no sleep), or that the connection has none to sleep on (look at it
                // after the tick).
                let (control_now, control_blind) =
                    match self.control.as_mut().map(channel::Control::sleep_fds) {
                        None => (false, false),
                        Some(None) => (true, false),
                        Some(Some(control)) => {
                            for fd in control.into_iter().flatten() {
                                fds[polled] = PollFd::new(fd, PollFlags::POLLIN);
                                polled += 1;
                            }
                            (false, polled == usize::from(accepting))
                        }
                    };
                let timeout = if control_now {
                    0
                } else {
                    wait.as_millis().max(1) as u16
                };
                let _ = poll(&mut fds[..polled], PollTimeout::from(timeout));
                let ready = |fd: &PollFd<'_>| fd.revents().is_some_and(|r| !r.is_empty());
                let control_fds = &fds[usize::from(accepting)..polled];
                (
                    accepting && ready(&fds[0]),
                    control_now || control_blind || control_fds.iter().any(ready),
                )
            };
            let mut gone = false;
            if control_ready && let Some(control) = self.control.as_mut() {
                match control.poll() {
                    Some(ControlEvent::StartShutdown) => break Some(ControlEvent::StartShutdown),
                    Some(ControlEvent::Gone) => gone = true,
                    Some(ControlEvent::ShutdownComplete) => {
                        warn!("unexpected shutdown_complete from the orchestrator ignored")
                    }
                    None => {}
                }
            }
            if listener_ready {
                self.accept_clients(&mut next);
            }
            if self.threads.iter().any(|t| t.join.is_finished()) {
                // A thread only ends when asked to (or when it panicked).
                break Some(ControlEvent::Gone);
            }
            if self.lost.load(Ordering::Relaxed) > self.epoch {
                // A data connection of this orchestrator broke.
                gone = true;
            }
            if gone && self.control.take().is_some() {
                warn!(
                    channel = %self.channel_socket.endpoint(),
                    "the orchestrator went away: clients whose requests were in flight were closed after the answers they had; the others keep their connections, and new ones are accepted; waiting for a new orchestrator with the same -c"
                );
            }
            if self.control.is_some() {
                self.channel_socket.refuse_waiting(&self.params);
            } else {
                match self.channel_socket.try_accept(&self.params, stop) {
                    Ok(Some(channel)) => self.serve_new_orchestrator(channel),
                    Ok(None) => {}
                    Err(ChannelError::Stopped) => break None,
                    Err(e) => warn!("a new orchestrator could not connect: {e}"),
                }
            }
        };
        drop(self.listener);
        let ends = stop_threads(&self.draining, std::mem::take(&mut self.threads));
        let Some(mut control) = self.control.take() else {
            return match cause {
                None => {
                    info!("server stopped (no orchestrator was connected)");
                    Ok(ServerEnd::Stopped)
                }
                Some(_) => Err(ServerError::ThreadEnded),
            };
        };
        match cause {
            None => {
                info!("stopping: drained; asking the orchestrator to shut down");
                control.send(GpuMessage::StartShutdown);
                let deadline = Instant::now() + SHUTDOWN_WAIT;
                loop {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        warn!("the orchestrator did not confirm the shutdown in time");
                        break;
                    }
                    match control.wait(left.min(channel::TICK)) {
                        Some(ControlEvent::ShutdownComplete) | Some(ControlEvent::Gone) => break,
                        Some(ControlEvent::StartShutdown) => {
                            control.send(GpuMessage::ShutdownComplete);
                        }
                        None => {}
                    }
                }
                info!("server stopped");
                Ok(ServerEnd::Stopped)
            }
            Some(ControlEvent::StartShutdown) => {
                control.send(GpuMessage::ShutdownComplete);
                info!("the orchestrator shut down; server stopped");
                Ok(ServerEnd::ShutdownByOrchestrator)
            }
            Some(_) => {
                error!(
                    threads_panicked = ends.iter().filter(|e| **e == DataPathEnd::Panicked).count(),
                    "a data-path thread ended; clients closed"
                );
                Err(ServerError::ThreadEnded)
            }
        }
    }

    /// Hands the data connections of a new orchestrator to the threads.
    fn serve_new_orchestrator(&mut self, channel: channel::ServerChannel) {
        self.epoch += 1;
        let epoch = self.epoch;
        let put = |thread: &ThreadHandle, data: &mut DataConnections| -> bool {
            match (&thread.slot, data) {
                (AnySlot::Shm(slot), DataConnections::Shm(conns)) if !conns.is_empty() => {
                    slot.put(conns.remove(0), epoch);
                }
                #[cfg(feature = "ucx")]
                (AnySlot::Ucx(slot), DataConnections::Ucx(conns)) if !conns.is_empty() => {
                    slot.put(conns.remove(0), epoch);
                }
                _ => return false,
            }
            let _ = thread.wake.write(1);
            true
        };
        let mut data = channel.data;
        for thread in &self.threads {
            if !put(thread, &mut data) {
                error!("the new orchestrator's data connections do not fit the threads; ignored");
            }
        }
        self.control = Some(channel.control);
        info!(
            threads = self.threads.len(),
            transport = data.transport(),
            "a new orchestrator connected; serving again"
        );
    }

    /// Accepts every waiting client and hands each to the next thread in turn.
    fn accept_clients(&mut self, next: &mut usize) {
        loop {
            match self.listener.accept() {
                Ok((stream, peer)) => {
                    self.accept_pause = ACCEPT_PAUSE_MIN;
                    let index = *next % self.threads.len();
                    let thread = &self.threads[index];
                    *next = next.wrapping_add(1);
                    match thread.incoming.push((stream, peer)) {
                        Ok(()) => {
                            let _ = thread.wake.write(1);
                        }
                        // Dropping the stream closes it.
                        Err((_, peer)) => warn!(
                            %peer,
                            thread = index,
                            "{MAX_WAITING_CLIENTS} clients already wait for this data-path thread; client refused"
                        ),
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                    ) => {}
                Err(e) => {
                    // Out of descriptors and the like: the clients already served go on; new
                    // ones wait in the listener's queue while accepting pauses, longer after
                    // each failure in a row.
                    let pause = self.accept_pause;
                    self.accept_pause = (pause * 2).min(ACCEPT_PAUSE_MAX);
                    let now = Instant::now();
                    self.accept_paused_until = Some(now + pause);
                    if let Some(held_back) = self.accept_failed.allow(now) {
                        warn!(
                            "accept failed: {e}; accepting pauses for {} ms (longer after each failure in a row, up to {} ms); clients already accepted are served{}",
                            pause.as_millis(),
                            ACCEPT_PAUSE_MAX.as_millis(),
                            if held_back > 0 {
                                format!(
                                    "; {held_back} more failures since the last report, unlogged"
                                )
                            } else {
                                String::new()
                            }
                        );
                    }
                    return;
                }
            }
        }
    }
}

/// The server program: logs, sets up, serves until stopped. `stop` is the flag the
/// signal handlers set. Prints `listening on <addr>` on stdout once clients may connect.
pub fn run(args: ServerArgs, stop: &AtomicBool) -> Result<ServerEnd, ServerError> {
    crate::cli::init_logging(args.common.log_level);
    let pending = PendingServer::bind(args)?;
    let server = pending.start(stop)?;
    println!("listening on {}", server.local_addr());
    use std::io::Write as _;
    let _ = io::stdout().flush();
    info!(addr = %server.local_addr(), "accepting clients");
    server.run(stop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_come_from_a_doca_json_file_and_the_command_line_wins() {
        let path =
            std::env::temp_dir().join(format!("gpu-offload-args-{}.json", std::process::id()));
        std::fs::write(
            &path,
            r#"{"doca_general_flags": {"log-level": 60},
                "doca_program_flags": {"device-id": "03:00.0", "server-listen-port": 12345,
                                       "cpu": [1, 2], "max-message-length": 64}}"#,
        )
        .unwrap();
        let args = ServerArgs::parse_with_json([
            "gpu-offload-server",
            "-j",
            path.to_str().unwrap(),
            "--max-message-length",
            "128",
        ])
        .unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(args.common.log_level, 60);
        assert_eq!(args.device_id.as_deref(), Some("03:00.0"));
        assert_eq!(args.server_listen_port, 12345);
        assert_eq!(args.cpus, [1, 2]);
        assert_eq!(args.channel.max_message_length, 128);
        assert_eq!(args.channel.max_concurrent_messages, 128);
        assert_eq!(args.params().threads, 2);
    }

    #[test]
    fn flags_that_need_more_memory_than_the_machine_has_name_the_largest_that_fits() {
        let args = |concurrent: &str, length: &str| {
            ServerArgs::try_parse_from([
                "s",
                "-p",
                "1",
                "--cpu",
                "0",
                "--cpu",
                "1",
                "--max-concurrent-messages",
                concurrent,
                "--max-message-length",
                length,
            ])
            .unwrap()
        };
        let gib = 1u64 << 30;
        assert!(check_memory(&args("128", "256"), gib).is_ok());
        let error = check_memory(&args("2048", "16777204"), 24 * gib)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("up to 64.0 GiB")
                && error.contains("at most --max-concurrent-messages 768"),
            "{error}"
        );
        assert!(check_memory(&args("768", "16777204"), 24 * gib).is_ok());
        let error = check_memory(&args("1", "16777204"), 16 * (1 << 20))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("at most --max-message-length 8388596"),
            "{error}"
        );
    }

    #[test]
    fn bad_values_name_the_flag_and_range() {
        let error = ServerArgs::try_parse_from(["s", "-p", "1", "--cpu", "0", "-l", "80"])
            .unwrap_err()
            .to_string();
        assert!(error.contains("10..=70"), "{error}");
        let error = ServerArgs::try_parse_from([
            "s",
            "-p",
            "1",
            "--cpu",
            "0",
            "--max-concurrent-messages",
            "0",
        ])
        .unwrap_err()
        .to_string();
        assert!(error.contains("--max-concurrent-messages"), "{error}");
    }
}
