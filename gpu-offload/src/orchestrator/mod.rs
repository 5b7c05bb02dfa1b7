//! `gpu-offload-orchestrator`: connects to the server's channel and processes its requests.
//!
//! Control phase: pick the processor (`--processor cpu|cuda|auto`; for CUDA, find the driver,
//! NVRTC and the GPU before anything else), connect to the server ([`crate::channel`]: a Unix
//! socket and shared memory on one machine, UCX from another), agree
//! on the thread count and message length, answer each thread's consumer-id request, start the
//! processor. Processing phase: the main thread watches the control connection, the stop flag
//! and the processor.
//!
//! Shutdown: on SIGINT or SIGTERM the orchestrator sends `start_shutdown` and keeps processing
//! until the server, having answered everything in flight, replies `shutdown_complete`; then it
//! stops the processor. On `start_shutdown` from the server (which has drained already) it
//! stops the processor and answers `shutdown_complete`.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(not(feature = "cuda"))]
#[path = "no_cuda.rs"]
pub mod cuda;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use tracing::{error, info, warn};
use urom_transport::{
    Armed, FrameReceiver, FrameRecvError, FrameSendError, FrameSender, HalfControl, Transport,
};
use urom_wire::gpu::GpuMessage;

use crate::channel::{self, ChannelError, ChannelParams, ControlEvent, DataConnections};
use crate::cli::JsonArgs;
use crate::limits;
pub use cuda::CudaError;

/// How long the orchestrator waits for the server's `shutdown_complete` (the server drains
/// first, for up to five seconds).
const SHUTDOWN_WAIT: Duration = Duration::from_secs(15);

/// Which processor reverses the payloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ProcessorChoice {
    /// CPU threads, one per server data-path thread (always available).
    Cpu,
    /// A persistent CUDA kernel (needs the `cuda` build feature, a driver and NVRTC).
    Cuda,
    /// CUDA when it is available, else the CPU.
    Auto,
}

/// Connects to the server, then processes its clients' requests: each payload's bytes come
/// back in reverse order.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "gpu-offload-orchestrator",
    version,
    disable_version_flag = true,
    args_override_self = true
)]
pub struct OrchestratorArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: crate::cli::CommonArgs,

    /// Comch device PCIe address in the original; selects nothing here (the channel is shared
    /// memory, or UCX, see -c); accepted for compatibility.
    #[arg(short = 'd', long, value_name = "DEV ID")]
    pub device_id: Option<String>,

    /// PCIe address of the GPU for the CUDA processor, e.g. 0000:b5:00.0 [default: GPU 0].
    #[arg(short = 'g', long, value_name = "PCI ADDRESS")]
    pub gpu_pci_addr: Option<String>,

    #[command(flatten)]
    #[allow(missing_docs)]
    pub channel: crate::cli::ChannelArgs,

    /// Processor threads (GPU threads for CUDA); must equal the server's --cpu count.
    #[arg(short = 't', long, value_name = "NUM", required = true, value_parser = clap::value_parser!(u32).range(1..=i64::from(limits::MAX_PROCESSOR_THREADS)))]
    pub num_gpu_threads: u32,

    /// CPU to pin processor thread i to (the CPU processor's threads, the CUDA processor's
    /// feeders), in thread order; repeat for more. Threads without one are not pinned.
    #[arg(long = "cpu", value_name = "CPU")]
    pub cpus: Vec<usize>,

    /// After each frame of requests, keep polling this many microseconds (yielding the CPU
    /// between polls) before sleeping until the server wakes the thread.
    #[arg(long, value_name = "US", default_value_t = 200)]
    pub poll_us: u64,

    /// Which processor reverses the payloads.
    #[arg(long, value_enum, default_value = "cpu")]
    pub processor: ProcessorChoice,

    /// How long to wait for the server to appear on the channel (to listen on its socket or
    /// UCX address), in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    pub connect_timeout: u64,
}

impl JsonArgs for OrchestratorArgs {}

/// Why the orchestrator could not run or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum OrchestratorError {
    /// The CUDA processor was asked for and cannot run.
    #[error(transparent)]
    Cuda(CudaError),
    /// The channel to the server could not be set up.
    #[error(transparent)]
    Channel(ChannelError),
    /// A `--cpu` this process may not run on.
    #[error(transparent)]
    Cpu(crate::cli::CpuCheckError),
    /// The processor's threads could not be started.
    #[error(transparent)]
    Start(StartError),
    /// The server went away without shutting down.
    #[error("the server went away without shutting down")]
    ServerGone,
}

/// How the orchestrator's run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrchestratorEnd {
    /// A stop signal: the server drained and confirmed.
    Stopped,
    /// The server asked to shut down.
    ShutdownByServer,
}

/// A started processor.
enum Processor {
    Cpu(cpu::CpuProcessor),
    Cuda(cuda::CudaProcessor),
}

impl Processor {
    fn start<T: Transport + Send + 'static>(
        gpu: Option<cuda::Gpu>,
        conns: Vec<T>,
        params: &ChannelParams,
        cpus: &[usize],
        poll: Duration,
    ) -> Result<Self, OrchestratorError> {
        match gpu {
            Some(gpu) => cuda::CudaProcessor::start(gpu, conns, params, cpus)
                .map(Processor::Cuda)
                .map_err(OrchestratorError::Cuda),
            None => cpu::CpuProcessor::start(conns, params.max_message_length as usize, cpus, poll)
                .map(Processor::Cpu)
                .map_err(OrchestratorError::Start),
        }
    }

    /// An error once the processor failed on its own (the CUDA kernel died).
    fn check(&mut self) -> Result<(), CudaError> {
        match self {
            Processor::Cpu(_) => Ok(()),
            Processor::Cuda(p) => p.check(),
        }
    }

    fn stop(self) {
        match self {
            Processor::Cpu(p) => p.stop(),
            Processor::Cuda(p) => p.stop(),
        }
    }
}

/// Why processor threads could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A thread could not be created.
    #[error("cannot start a processor thread: {0}")]
    Thread(#[source] std::io::Error),
    /// A thread could not be pinned to its `--cpu`.
    #[error("{0} (is the --cpu online and allowed for this process?)")]
    Pin(#[source] urom_transport::sys::PinError),
}

/// Starts `body` on a thread called `name`, pinned to `cpu` when there is one, and returns
/// once it is pinned; `None` from the thread means it never ran `body`.
fn spawn_pinned<T: Send + 'static>(
    name: String,
    cpu: Option<usize>,
    body: impl FnOnce() -> T + Send + 'static,
) -> Result<std::thread::JoinHandle<Option<T>>, StartError> {
    let (pinned_tx, pinned) = std::sync::mpsc::sync_channel(1);
    let thread = std::thread::Builder::new()
        .name(name)
        .spawn(move || {
            if let Some(cpu) = cpu {
                if let Err(e) = urom_transport::sys::pin_current_thread(cpu) {
                    let _ = pinned_tx.send(Err(e));
                    return None;
                }
            }
            let _ = pinned_tx.send(Ok(()));
            Some(body())
        })
        .map_err(StartError::Thread)?;
    match pinned.recv() {
        Ok(Ok(())) => Ok(thread),
        Ok(Err(e)) => {
            let _ = thread.join();
            Err(StartError::Pin(e))
        }
        Err(_) => Err(StartError::Thread(std::io::ErrorKind::Other.into())),
    }
}

/// Sends `frame` to the server, waiting while the ring is full (it empties as the server
/// takes responses). `false`, with a log line, once the server is gone.
fn send_waiting<T: Transport>(conn: &mut T, frame: &[u8], thread: usize) -> bool {
    loop {
        match conn.send(frame) {
            Ok(()) => return true,
            Err(FrameSendError::Full) => {
                // The server must be awake to make room.
                conn.split().0.flush_wakes();
                if let Err(e) = conn.wait_send(Duration::from_millis(50)) {
                    info!(thread, "cannot answer: {e}");
                    return false;
                }
            }
            Err(e) => {
                info!(thread, "cannot answer: {e}");
                return false;
            }
        }
    }
}

/// Sleeps until the server's next frame, its end, or a timeout, on the data connection's
/// wake-up descriptors.
///
/// Unlike [`Transport::wait_recv`], it takes no short first nap: the server flushes its
/// wake-ups after its frames ([`FrameSender::flush_wakes`]), so none is missed, and a timer
/// shorter than the kernel's tick costs more than a wake-up on a virtual machine. The
/// descriptors sit in an epoll set, edge-triggered, so a wake-up is never read back.
struct Sleeper {
    epoll: Epoll,
}

/// The epoll tokens of the data connection's wake-up eventfd and socket.
const EVENT_TOKEN: u64 = 0;
const SOCKET_TOKEN: u64 = 1;

impl Sleeper {
    /// `None` when the connection has no wake-up descriptors (then use `wait_recv`).
    fn new<T: Transport>(conn: &mut T) -> std::io::Result<Option<Self>> {
        let rx = conn.split().1;
        let [Some(event), socket] = rx.wake_fds() else {
            return Ok(None);
        };
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        let flags = EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP | EpollFlags::EPOLLET;
        epoll.add(event, EpollEvent::new(flags, EVENT_TOKEN))?;
        if let Some(socket) = socket {
            epoll.add(socket, EpollEvent::new(flags, SOCKET_TOKEN))?;
        }
        Ok(Some(Self { epoll }))
    }

    /// Sleeps until the next frame, the server's end, or `timeout`.
    fn sleep<T: Transport>(&self, conn: &mut T, timeout: Duration) -> Result<(), FrameRecvError> {
        let rx = conn.split().1;
        match rx.arm()? {
            Armed::Ready => return Ok(()),
            Armed::Unsupported => return rx.wait_recv(timeout).map(drop),
            Armed::Armed { .. } => {}
        }
        let mut events = [EpollEvent::empty(); 2];
        let ms = timeout.as_millis().min(u128::from(u16::MAX)) as u16;
        let n = self.epoll.wait(&mut events, ms).unwrap_or(0);
        // The socket carries nothing after the setup: readable or hung up, the peer is gone.
        if events[..n].iter().any(|e| e.data() == SOCKET_TOKEN) {
            rx.check_peer()?;
        }
        Ok(())
    }
}

/// Finds the GPU when the choice asks for one; `None` means the CPU processor.
fn choose(args: &OrchestratorArgs) -> Result<Option<cuda::Gpu>, OrchestratorError> {
    match args.processor {
        ProcessorChoice::Cpu => Ok(None),
        ProcessorChoice::Cuda => cuda::Gpu::open(args.gpu_pci_addr.as_deref())
            .map(Some)
            .map_err(OrchestratorError::Cuda),
        ProcessorChoice::Auto => match cuda::Gpu::open(args.gpu_pci_addr.as_deref()) {
            Ok(gpu) => Ok(Some(gpu)),
            Err(e) => {
                info!("{e}; using the CPU processor");
                Ok(None)
            }
        },
    }
}

/// The orchestrator program: logs, sets up, processes until stopped. `stop` is the flag the
/// signal handlers set.
pub fn run(
    args: OrchestratorArgs,
    stop: &AtomicBool,
) -> Result<OrchestratorEnd, OrchestratorError> {
    crate::cli::init_logging(args.common.log_level);
    let ours = ChannelParams {
        threads: args.num_gpu_threads,
        max_message_length: args.channel.max_message_length,
        max_concurrent: args.channel.max_concurrent_messages,
    };
    // Flags that cannot work are refused now, not once the server is there.
    ours.channel_config().map_err(OrchestratorError::Channel)?;
    crate::cli::check_cpus(&args.cpus).map_err(OrchestratorError::Cpu)?;
    let gpu = choose(&args)?;
    let endpoint = args
        .channel
        .endpoint()
        .map_err(OrchestratorError::Channel)?;
    info!(
        channel = %endpoint,
        "waiting for the server (gpu-offload-server -c {} with {} --cpu flags) for up to {} s (--connect-timeout)",
        args.channel.comch_channel_name,
        ours.threads,
        args.connect_timeout
    );
    let channel = channel::connect(
        &endpoint,
        &ours,
        Duration::from_secs(args.connect_timeout),
        stop,
    )
    .map_err(OrchestratorError::Channel)?;
    if channel.params.max_concurrent != ours.max_concurrent {
        warn!(
            ours = ours.max_concurrent,
            server = channel.params.max_concurrent,
            "--max-concurrent-messages differs from the server's; using the server's"
        );
    }
    let mut control = channel.control;
    let params = channel.params;
    let transport = channel.data.transport();
    let poll = Duration::from_micros(args.poll_us);
    let mut processor = match channel.data {
        DataConnections::Shm(conns) => Processor::start(gpu, conns, &params, &args.cpus, poll),
        #[cfg(feature = "ucx")]
        DataConnections::Ucx(conns) => Processor::start(gpu, conns, &params, &args.cpus, poll),
    }?;
    info!(
        threads = params.threads,
        transport,
        processor = match processor {
            Processor::Cpu(_) => "cpu",
            Processor::Cuda(_) => "cuda",
        },
        "connected; processing"
    );
    println!("processing");
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    loop {
        if stop.load(Ordering::Relaxed) {
            info!("stopping: asking the server to drain and shut down");
            control.send(GpuMessage::StartShutdown);
            let deadline = Instant::now() + SHUTDOWN_WAIT;
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    warn!("the server did not confirm the shutdown in time");
                    break;
                }
                match control.wait(left.min(channel::TICK)) {
                    Some(ControlEvent::ShutdownComplete) | Some(ControlEvent::Gone) => break,
                    Some(ControlEvent::StartShutdown) => {
                        control.send(GpuMessage::ShutdownComplete);
                        break;
                    }
                    None => {}
                }
            }
            processor.stop();
            info!("orchestrator stopped");
            return Ok(OrchestratorEnd::Stopped);
        }
        match control.wait(channel::TICK) {
            Some(ControlEvent::StartShutdown) => {
                processor.stop();
                control.send(GpuMessage::ShutdownComplete);
                info!("the server shut down; orchestrator stopped");
                return Ok(OrchestratorEnd::ShutdownByServer);
            }
            Some(ControlEvent::Gone) => {
                processor.stop();
                error!("the server went away");
                return Err(OrchestratorError::ServerGone);
            }
            Some(ControlEvent::ShutdownComplete) => {
                warn!("unexpected shutdown_complete from the server ignored");
            }
            None => {}
        }
        if let Err(e) = processor.check() {
            error!("{e}; shutting down");
            control.send(GpuMessage::StartShutdown);
            let _ = control.wait(SHUTDOWN_WAIT);
            processor.stop();
            return Err(OrchestratorError::Cuda(e));
        }
    }
}
