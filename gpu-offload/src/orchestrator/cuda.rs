//! The CUDA processor: a persistent kernel, one warp per server data-path thread, polling
//! request slots in pinned host memory mapped into the GPU's address space.
//!
//! Memory, one `cuMemHostAlloc(DEVICEMAP | PORTABLE)` allocation; channel `c` holds `slots`
//! slots of `stride` bytes from `c * slots * stride`, each:
//!
//! ```text
//! 0       u64 header: state (low 32 bits) | payload length << 32; states: 0 free (the CPU's),
//!         1 request and 3 stop (the GPU's), 2 response (the CPU's)
//! 16      request payload (the longest message, rounded up to 16 bytes)
//! 16 + P  response payload (as long)
//! ```
//!
//! The stride rounds that up to 128 bytes. Per channel, a CPU feeder thread takes frames of
//! requests off the data connection and posts each request in the next slot (payload, then the
//! header with Release). The kernel's warp for the channel works in slot order: lane 0 waits
//! for the oldest slot to be taken, then each lane reads the header of one slot from there on,
//! and the run of requests from the oldest is done at once, each lane reversing one payload
//! into its slot's response area with 16-byte accesses. The loads of a run overlap, so a run of
//! up to 32 requests costs about three PCIe round trips (the headers, the payloads, the fence
//! before the responses are published), where one request at a time cost four each. The feeder picks the responses up in slot order, frees each slot, and sends one
//! frame of responses per frame of requests: requests are answered in the order they came,
//! which the server relies on.
//!
//! One warp per channel, and one load per spin of its waiting lane: the polls share the PCIe
//! link with the work. Two, four and eight warps per channel, each taking every W-th group of
//! 32 slots, were measured on an H200 beside this design: two about the same, four slower at
//! up to 128 requests in flight, eight half the rate everywhere (see the package README).
//!
//! To stop, the CPU answers what is in flight and posts the stop state in each channel's next
//! slot, where the warp looks anyway; the main thread watches the kernel with `cuStreamQuery`
//! and stops waiting for it after [`KERNEL_STOP_WAIT`].
//!
//! Without a driver or NVRTC, [`Gpu::open`] says so in one line instead of failing inside
//! cudarc (which panics when the library is absent).
#![allow(unsafe_code)]

use core::fmt;
use std::collections::VecDeque;
use std::ffi::{CString, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cudarc::driver::{
    CudaContext, CudaModule, CudaStream, DriverError, LaunchConfig, PushKernelArg, result, sys,
};
use cudarc::nvrtc::CompileError;
use tracing::{error, info, warn};
use urom_transport::{FrameSender, Transport};
use urom_wire::gpu::{CLIENT_HEADER_LEN, GpuMessage, message_length, write_client_headers};

use super::StartError;
use crate::channel::ChannelParams;

/// Why the CUDA processor cannot run or stopped.
#[derive(Debug)]
pub enum CudaError {
    /// No CUDA driver library on this machine.
    NoDriver,
    /// No NVRTC library (CUDA 13) on this machine.
    NoNvrtc,
    /// The driver sees no GPU.
    NoGpu,
    /// No GPU at the `-g` address.
    NoSuchGpu(String),
    /// A driver call failed.
    Driver {
        /// The call.
        op: &'static str,
        /// The driver's error.
        source: DriverError,
    },
    /// NVRTC could not compile the kernel.
    Compile(CompileError),
    /// The feeder threads could not be started.
    Feeders(StartError),
    /// The kernel ended or failed while it should run.
    KernelFailed(String),
    /// The GPU cannot keep a warp running for every processor thread at once.
    TooManyThreads {
        /// Processor threads asked for (`-t`).
        threads: usize,
        /// Warps of the kernel the GPU runs at once.
        resident: usize,
    },
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CUDA processor unavailable: ")?;
        match self {
            Self::NoDriver => f.write_str("no CUDA driver (libcuda.so) on this machine"),
            Self::NoNvrtc => {
                f.write_str("no NVRTC library (libnvrtc.so.13, CUDA 13) on this machine")
            }
            Self::NoGpu => f.write_str("the CUDA driver sees no GPU"),
            Self::NoSuchGpu(addr) => write!(f, "no GPU at PCIe address {addr}"),
            Self::Driver { op, source } => write!(f, "{op} failed: {source}"),
            Self::Compile(e) => write!(f, "the kernel does not compile: {e}"),
            Self::Feeders(e) => write!(f, "starting the feeder threads failed: {e}"),
            Self::KernelFailed(reason) => write!(f, "the kernel stopped: {reason}"),
            Self::TooManyThreads { threads, resident } => write!(
                f,
                "-t {threads} needs {threads} warps running at once, and this GPU runs at most \
                 {resident} of this kernel"
            ),
        }
    }
}

impl std::error::Error for CudaError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Driver { source, .. } => Some(source),
            Self::Compile(e) => Some(e),
            Self::Feeders(e) => Some(e),
            _ => None,
        }
    }
}

fn driver(op: &'static str) -> impl FnOnce(DriverError) -> CudaError {
    move |source| CudaError::Driver { op, source }
}

const KERNEL_NAME: &str = "reverse_requests";
/// The kernel's CUDA C++ source, compiled at run time by NVRTC.
const KERNEL: &str = include_str!("kernel.cu");

/// Where a slot's request payload starts (the kernel's `REQUEST_OFFSET`).
const REQUEST_OFFSET: usize = 16;
/// Slot states: the low 32 bits of a slot's header (the kernel's `#define`s).
const FREE: u64 = 0;
const REQUEST: u64 = 1;
const RESPONSE: u64 = 2;
const STOP: u64 = 3;
/// A slot header's state.
fn state(header: u64) -> u64 {
    header & 0xffff_ffff
}

/// How long stopping waits for the kernel to answer what is in flight and end.
pub const KERNEL_STOP_WAIT: Duration = Duration::from_secs(5);

/// An opened GPU.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    ordinal: usize,
}

impl Gpu {
    /// Finds the driver, NVRTC and the GPU at `pci_addr` (GPU 0 without one), and opens it.
    pub fn open(pci_addr: Option<&str>) -> Result<Self, CudaError> {
        // SAFETY: only tries to load the driver library; nothing is called in it.
        if !unsafe { sys::is_culib_present() } {
            return Err(CudaError::NoDriver);
        }
        // SAFETY: as above, for NVRTC.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(CudaError::NoNvrtc);
        }
        result::init().map_err(driver("cuInit"))?;
        let count = CudaContext::device_count().map_err(driver("cuDeviceGetCount"))?;
        if count <= 0 {
            return Err(CudaError::NoGpu);
        }
        let ordinal = match pci_addr {
            None => 0,
            Some(addr) => {
                let name = CString::new(addr).map_err(|_| CudaError::NoSuchGpu(addr.to_owned()))?;
                let mut device: sys::CUdevice = 0;
                // SAFETY: `device` is a valid out-pointer and `name` a NUL-terminated string
                // that outlives the call.
                let found = unsafe { sys::cuDeviceGetByPCIBusId(&mut device, name.as_ptr()) };
                found
                    .result()
                    .map_err(|_| CudaError::NoSuchGpu(addr.to_owned()))?;
                usize::try_from(device).map_err(|_| CudaError::NoSuchGpu(addr.to_owned()))?
            }
        };
        let ctx = CudaContext::new(ordinal).map_err(driver("cuDevicePrimaryCtxRetain"))?;
        info!(ordinal, "GPU opened");
        Ok(Self { ctx, ordinal })
    }
}

/// The pinned, device-mapped host memory shared by the feeders and the kernel.
struct HostMemory {
    ctx: Arc<CudaContext>,
    // INVARIANTS: points to `len` bytes allocated by `cuMemHostAlloc`, alive until drop, 128-byte
    // aligned (the driver aligns to pages).
    host: *mut u8,
    len: usize,
    device: sys::CUdeviceptr,
}

// SAFETY: the memory is plain bytes shared on purpose between threads (and the GPU); every
// access goes through atomics for the state words and raw copies for payloads whose ownership
// the state word hands over.
unsafe impl Send for HostMemory {}
// SAFETY: as above.
unsafe impl Sync for HostMemory {}

impl HostMemory {
    fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<Self, CudaError> {
        ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: allocates `len` bytes; the contents are zeroed below before anyone reads.
        let host = unsafe { result::malloc_host(len, flags) }.map_err(driver("cuMemHostAlloc"))?
            as *mut u8;
        // SAFETY: `host` points to `len` writable bytes just allocated.
        unsafe { std::ptr::write_bytes(host, 0, len) };
        let mut device: sys::CUdeviceptr = 0;
        // SAFETY: `host` was allocated with DEVICEMAP; `device` is a valid out-pointer.
        let mapped =
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host as *mut c_void, 0) };
        let memory = Self {
            ctx: Arc::clone(ctx),
            host,
            len,
            device,
        };
        mapped
            .result()
            .map_err(driver("cuMemHostGetDevicePointer"))?;
        Ok(memory)
    }

    /// The slot header at `offset` as an atomic.
    fn header(&self, offset: usize) -> &AtomicU64 {
        assert!(offset % 8 == 0 && offset + 8 <= self.len);
        // SAFETY: in bounds and 8-byte aligned (checked above; the base is page aligned); the
        // memory lives as long as `self`; the GPU accesses headers only with volatile 64-bit
        // loads and stores, so treating one as an atomic is sound.
        unsafe { &*(self.host.wrapping_add(offset) as *const AtomicU64) }
    }

    /// Copies `src` to `offset`; the caller owns those bytes (its state word says so).
    fn write(&self, offset: usize, src: &[u8]) {
        assert!(offset + src.len() <= self.len);
        // SAFETY: in bounds; the state word gives these bytes to this thread alone.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.host.wrapping_add(offset), src.len())
        };
    }

    /// Copies from `offset` into `dst`; the caller owns those bytes (its state word says so).
    fn read(&self, offset: usize, dst: &mut [u8]) {
        assert!(offset + dst.len() <= self.len);
        // SAFETY: in bounds; the state word gives these bytes to this thread alone.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.host.wrapping_add(offset),
                dst.as_mut_ptr(),
                dst.len(),
            )
        };
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by `cuMemHostAlloc` in `new`; the kernel and feeders are done.
        if let Err(e) = unsafe { result::free_host(self.host as *mut c_void) } {
            warn!("cuMemFreeHost failed: {e}");
        }
    }
}

/// Where the slots of the channels sit.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    slots: usize,
    slot_stride: usize,
    channel_stride: usize,
    response_offset: usize,
    max_len: usize,
}

impl Geometry {
    fn new(max_len: usize, slots: usize) -> Self {
        let payload_area = max_len.next_multiple_of(16);
        let response_offset = REQUEST_OFFSET + payload_area;
        let slot_stride = (response_offset + payload_area).next_multiple_of(128);
        Self {
            slots,
            slot_stride,
            channel_stride: slots * slot_stride,
            response_offset,
            max_len,
        }
    }

    fn slot(&self, channel: usize, slot: usize) -> usize {
        channel * self.channel_stride + slot * self.slot_stride
    }
}

/// How far a feeder got: requests posted (`head`) and responses taken (`tail`), in slots.
#[derive(Clone, Copy, Debug, Default)]
struct RingPosition {
    head: usize,
    tail: usize,
}

/// The running kernel and its feeders.
pub struct CudaProcessor {
    gpu: Gpu,
    // Unloading a module waits for its kernels to end: it must outlive the kernel.
    _module: Arc<CudaModule>,
    stream: Arc<CudaStream>,
    memory: Arc<HostMemory>,
    geometry: Geometry,
    channels: usize,
    feeders_stop: Arc<AtomicBool>,
    feeders: Vec<JoinHandle<Option<RingPosition>>>,
}

impl CudaProcessor {
    /// Compiles and launches the kernel, one warp per data connection, and starts the feeders.
    pub fn start<T: Transport + Send + 'static>(
        gpu: Gpu,
        conns: Vec<T>,
        params: &ChannelParams,
        cpus: &[usize],
    ) -> Result<Self, CudaError> {
        let ctx = Arc::clone(&gpu.ctx);
        ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let ptx = cudarc::nvrtc::compile_ptx(KERNEL).map_err(CudaError::Compile)?;
        let module = ctx.load_module(ptx).map_err(driver("cuModuleLoadData"))?;
        let function = module
            .load_function(KERNEL_NAME)
            .map_err(driver("cuModuleGetFunction"))?;
        let geometry = Geometry::new(
            params.max_message_length as usize,
            params.max_concurrent as usize,
        );
        let channels = conns.len();
        // A persistent kernel's warps must all run at once: one that waited for another to
        // end would never start.
        let per_multiprocessor = function
            .occupancy_max_active_blocks_per_multiprocessor(32, 0, None)
            .map_err(driver("cuOccupancyMaxActiveBlocksPerMultiprocessor"))?;
        let multiprocessors = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver("cuDeviceGetAttribute"))?;
        let resident = per_multiprocessor as usize * multiprocessors.max(0) as usize;
        if resident < channels {
            return Err(CudaError::TooManyThreads {
                threads: channels,
                resident,
            });
        }
        let memory = Arc::new(HostMemory::new(&ctx, channels * geometry.channel_stride)?);
        let stream = ctx.new_stream().map_err(driver("cuStreamCreate"))?;
        // Messages are at most 16 MiB (`MaxMsgSize::MAX`), so a slot's offsets fit in a u32.
        let kernel_u32 = |value: usize| u32::try_from(value).expect("a slot of at most 32 MiB");
        let channel_stride = geometry.channel_stride as u64;
        let slot_stride = kernel_u32(geometry.slot_stride);
        let slots = kernel_u32(geometry.slots);
        let max_len = kernel_u32(geometry.max_len);
        let response_offset = kernel_u32(geometry.response_offset);
        let mut launch = stream.launch_builder(&function);
        launch
            .arg(&memory.device)
            .arg(&channel_stride)
            .arg(&slot_stride)
            .arg(&slots)
            .arg(&max_len)
            .arg(&response_offset);
        let config = LaunchConfig {
            grid_dim: (channels as u32, 1, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments match the kernel's parameters in number and type; the memory
        // they point to stays allocated until the kernel has ended (`stop`).
        unsafe { launch.launch(config) }.map_err(driver("cuLaunchKernel"))?;
        info!(
            ordinal = gpu.ordinal,
            warps = channels,
            slots = geometry.slots,
            "kernel launched"
        );
        let mut processor = Self {
            gpu,
            _module: module,
            stream,
            memory,
            geometry,
            channels,
            feeders_stop: Arc::new(AtomicBool::new(false)),
            feeders: Vec::with_capacity(channels),
        };
        for (index, conn) in conns.into_iter().enumerate() {
            let shared = Arc::clone(&processor.memory);
            let stop = Arc::clone(&processor.feeders_stop);
            let spawned = super::spawn_pinned(
                format!("cuda-feeder-{index}"),
                cpus.get(index).copied(),
                move || feed(conn, index, &shared, geometry, &stop),
            );
            match spawned {
                Ok(feeder) => processor.feeders.push(feeder),
                Err(e) => {
                    processor.stop();
                    return Err(CudaError::Feeders(e));
                }
            }
        }
        Ok(processor)
    }

    /// An error once the kernel ended or failed.
    pub fn check(&mut self) -> Result<(), CudaError> {
        match self.query() {
            Ok(false) => Ok(()),
            Ok(true) => Err(CudaError::KernelFailed(
                "it returned before being told to stop".to_owned(),
            )),
            Err(e) => Err(e),
        }
    }

    /// Whether the kernel has ended, or the error it ended with.
    fn query(&self) -> Result<bool, CudaError> {
        // SAFETY: the stream is alive (owned by `self`).
        match unsafe { sys::cuStreamQuery(self.stream.cu_stream()) } {
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            other => Err(CudaError::KernelFailed(format!("{other:?}"))),
        }
    }

    /// Stops the feeders, takes the responses still in flight, posts the stop state in each
    /// channel's next slot, and waits up to [`KERNEL_STOP_WAIT`] for the kernel to end.
    pub fn stop(mut self) {
        let deadline = Instant::now() + KERNEL_STOP_WAIT;
        self.feeders_stop.store(true, Ordering::Relaxed);
        let mut positions = vec![RingPosition::default(); self.channels];
        for (position, feeder) in positions.iter_mut().zip(std::mem::take(&mut self.feeders)) {
            if let Ok(Some(reached)) = feeder.join() {
                *position = reached;
            }
        }
        for (channel, position) in positions.into_iter().enumerate() {
            if !post_stop(&self.memory, self.geometry, channel, position, deadline) {
                warn!(
                    channel,
                    "the kernel did not answer the requests in flight in time"
                );
            }
        }
        let _ = self.gpu.ctx.bind_to_thread();
        loop {
            match self.query() {
                Ok(true) => break info!("kernel stopped"),
                Ok(false) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Ok(false) => {
                    error!(
                        "the kernel did not stop within {} s; the driver ends it with this process",
                        KERNEL_STOP_WAIT.as_secs()
                    );
                    // The kernel may still use the memory, and unloading its module would
                    // wait for it: leave both to the end of the process.
                    std::mem::forget(self);
                    return;
                }
                Err(e) => break error!("{e}"),
            }
        }
    }
}

/// Takes the responses of `channel` still in flight at `position` (until `deadline`), then
/// posts the stop state in its next slot; false if the responses did not come in time.
fn post_stop(
    memory: &HostMemory,
    geometry: Geometry,
    channel: usize,
    mut position: RingPosition,
    deadline: Instant,
) -> bool {
    while position.tail < position.head {
        let header = memory.header(geometry.slot(channel, position.tail % geometry.slots));
        if state(header.load(Ordering::Acquire)) == RESPONSE {
            header.store(FREE, Ordering::Release);
            position.tail += 1;
        } else if Instant::now() < deadline {
            std::hint::spin_loop();
        } else {
            return false;
        }
    }
    memory
        .header(geometry.slot(channel, position.head % geometry.slots))
        .store(STOP, Ordering::Release);
    true
}

/// One channel's feeder: posts each request of each frame to the kernel, and sends back one
/// frame of responses per frame of requests, in order. Returns how far it got.
fn feed<T: Transport>(
    mut conn: T,
    index: usize,
    memory: &HostMemory,
    geometry: Geometry,
    stop: &AtomicBool,
) -> RingPosition {
    let capacity = conn.max_msg_size().as_u32() as usize;
    // The frame being posted (copied out of the ring so the ring slot is free at once).
    let mut staged = vec![0u8; capacity].into_boxed_slice();
    let (mut staged_at, mut staged_len) = (0usize, 0usize);
    // Responses of the oldest frame, gathered as the kernel finishes them.
    let mut out = vec![0u8; capacity].into_boxed_slice();
    let mut out_len = 0usize;
    let mut gathered = 0u32;
    // Requests per frame, oldest first, for frames not yet answered.
    let mut frames: VecDeque<u32> = VecDeque::with_capacity(geometry.slots + 1);
    let mut position = RingPosition::default();
    'feed: while !stop.load(Ordering::Relaxed) {
        let mut progress = false;
        // Responses, in slot order; a frame goes back once all its requests are done.
        while position.tail < position.head {
            let slot = geometry.slot(index, position.tail % geometry.slots);
            let header = memory.header(slot).load(Ordering::Acquire);
            if state(header) != RESPONSE {
                break;
            }
            let len = (header >> 32) as usize;
            let Ok(total) = write_client_headers(&mut out[out_len..], true, len, geometry.max_len)
            else {
                error!(
                    thread = index,
                    len, "the kernel reported an impossible length"
                );
                break 'feed;
            };
            memory.read(
                slot + geometry.response_offset,
                &mut out[out_len + CLIENT_HEADER_LEN..out_len + total],
            );
            memory.header(slot).store(FREE, Ordering::Release);
            out_len += total;
            gathered += 1;
            position.tail += 1;
            progress = true;
            if frames.front() == Some(&gathered) {
                if !super::send_waiting(&mut conn, &out[..out_len], index) {
                    break 'feed;
                }
                // The server sleeps long once armed: wake it for sure.
                conn.split().0.flush_wakes();
                frames.pop_front();
                gathered = 0;
                out_len = 0;
            }
        }
        // Requests of the staged frame, while slots are free.
        while staged_at < staged_len && position.head - position.tail < geometry.slots {
            let Ok(Some(len)) = message_length(&staged[staged_at..staged_len], geometry.max_len)
            else {
                break;
            };
            let payload = &staged[staged_at + CLIENT_HEADER_LEN..staged_at + len];
            let slot = geometry.slot(index, position.head % geometry.slots);
            memory.write(slot + REQUEST_OFFSET, payload);
            memory
                .header(slot)
                .store((payload.len() as u64) << 32 | REQUEST, Ordering::Release);
            staged_at += len;
            position.head += 1;
            progress = true;
        }
        // The next frame, once the staged one is posted.
        if staged_at == staged_len {
            match conn.recv() {
                Ok(Some(frame)) => {
                    progress = true;
                    match count_requests(frame, geometry.max_len) {
                        Some(count) => {
                            staged[..frame.len()].copy_from_slice(frame);
                            staged_at = 0;
                            staged_len = frame.len();
                            frames.push_back(count);
                        }
                        None => {
                            // The server checks every request, so this does not happen; an
                            // empty answer keeps the frames in step (the server then drops
                            // the client), but only in order.
                            warn!(
                                thread = index,
                                "the server sent something other than well-formed client_requests; answered empty"
                            );
                            frames.push_back(0);
                        }
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    info!(thread = index, "data connection closed: {e}");
                    break 'feed;
                }
            }
        }
        // Frames with nothing left to wait for (empty answers) go back in turn.
        while gathered == 0 && frames.front() == Some(&0) {
            frames.pop_front();
            if !super::send_waiting(&mut conn, &[], index) {
                break 'feed;
            }
            conn.split().0.flush_wakes();
        }
        if !progress {
            if position.head == position.tail && staged_at == staged_len {
                let _ = conn.wait_recv(Duration::from_millis(50));
            } else {
                std::hint::spin_loop();
            }
        }
    }
    info!(thread = index, requests = position.tail, "feeder stopped");
    position
}

/// How many whole `client_request` messages `frame` holds; `None` unless it is one or more
/// of them and nothing else.
fn count_requests(frame: &[u8], max_len: usize) -> Option<u32> {
    let (mut at, mut count) = (0usize, 0u32);
    while at < frame.len() {
        match GpuMessage::parse(
            frame.get(at..at + message_length(&frame[at..], max_len).ok()??)?,
            max_len,
        ) {
            Ok(GpuMessage::ClientRequest(payload)) => at += CLIENT_HEADER_LEN + payload.len(),
            _ => return None,
        }
        count += 1;
    }
    (count > 0).then_some(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_compiles_where_nvrtc_is_present() {
        // SAFETY: only tries to load the library.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            urom_testkit::skip("no NVRTC library (libnvrtc.so.13) on this machine");
            return;
        }
        let ptx = cudarc::nvrtc::compile_ptx(KERNEL).expect("the kernel compiles");
        assert!(ptx.to_src().contains(KERNEL_NAME));
    }

    #[test]
    fn frames_count_their_requests() {
        let mut frame = [0u8; 64];
        let mut len = GpuMessage::ClientRequest(b"abc")
            .emit(&mut frame, 256)
            .unwrap();
        len += GpuMessage::ClientRequest(b"")
            .emit(&mut frame[len..], 256)
            .unwrap();
        assert_eq!(count_requests(&frame[..len], 256), Some(2));
        assert_eq!(count_requests(&frame[..len - 1], 256), None);
        assert_eq!(count_requests(&[], 256), None);
        let response = GpuMessage::ClientResponse(b"x")
            .emit(&mut frame, 256)
            .unwrap();
        assert_eq!(count_requests(&frame[..response], 256), None);
    }

    /// The kernel's device functions (everything before the kernel itself) as C for this
    /// machine's compiler, with the CUDA built-ins they use written out; the loads and stores
    /// abort outside the slot under test.
    const HOST_SHIMS: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define __device__ static
#define __forceinline__ inline
typedef struct { unsigned long long x, y; } ulonglong2;
static const unsigned char *slot_start, *slot_end;
static ulonglong2 make_ulonglong2(unsigned long long x, unsigned long long y)
{
    ulonglong2 v = { x, y };
    return v;
}
static unsigned int __byte_perm(unsigned int x, unsigned int y, unsigned int s)
{
    const unsigned long long bytes = (unsigned long long)y << 32 | x;
    unsigned int r = 0;
    for (int i = 0; i < 4; i++) {
        r |= (unsigned int)((bytes >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    }
    return r;
}
static void in_slot(const void *p)
{
    const unsigned char *at = p;
    if (at < slot_start || at + 16 > slot_end || (at - slot_start) % 16) {
        printf("access at %ld, slot of %ld bytes\n", (long)(at - slot_start),
               (long)(slot_end - slot_start));
        exit(2);
    }
}
static ulonglong2 __ldcv(const ulonglong2 *p) { in_slot(p); return *p; }
static void __stwt(ulonglong2 *p, ulonglong2 v) { in_slot(p); *p = v; }
"#;

    #[test]
    fn the_kernels_reversal_is_right_for_every_length_and_stays_in_its_slot() {
        let device_functions = &KERNEL[..KERNEL.find("extern \"C\" __global__").unwrap()];
        let mut cases = String::new();
        for max_len in [0, 1, 15, 16, 17, 31, 64, 255, 256, 1000] {
            let geometry = Geometry::new(max_len, 1);
            cases += &format!(
                "{{{max_len}, {}, {}}},",
                geometry.response_offset, geometry.slot_stride
            );
        }
        let main = format!(
            r#"
int main(void)
{{
    static const unsigned int cases[][3] = {{ {cases} }};
    for (unsigned int k = 0; k < sizeof cases / sizeof cases[0]; k++) {{
        const unsigned int max_len = cases[k][0], response = cases[k][1], stride = cases[k][2];
        unsigned char *slot = aligned_alloc(128, stride), request[1024];
        slot_start = slot;
        slot_end = slot + stride;
        for (unsigned int len = 0; len <= max_len; len++) {{
            for (unsigned int i = 0; i < stride; i++) slot[i] = (unsigned char)rand();
            memcpy(request, slot + {REQUEST_OFFSET}, len);
            reverse_payload(slot + {REQUEST_OFFSET}, slot + response, len);
            for (unsigned int i = 0; i < len; i++) {{
                if (slot[response + i] != request[len - 1 - i]) {{
                    printf("max_len %u, len %u: byte %u wrong\n", max_len, len, i);
                    return 1;
                }}
            }}
        }}
        free(slot);
    }}
    return 0;
}}
"#
        );
        let dir = urom_testkit::TempDir::new("cuda-kernel-on-the-host");
        let source = dir.path().join("kernel.c");
        let program = dir.path().join("kernel");
        std::fs::write(&source, format!("{HOST_SHIMS}{device_functions}{main}")).unwrap();
        let compiled = std::process::Command::new("cc")
            .args(["-std=c11", "-O1", "-Wall", "-Werror", "-o"])
            .arg(&program)
            .arg(&source)
            .output();
        let compiled = match compiled {
            Ok(output) => output,
            Err(e) => {
                urom_testkit::skip(&format!(
                    "no C compiler (cc) to run the kernel's functions here: {e}"
                ));
                return;
            }
        };
        assert!(
            compiled.status.success(),
            "{}",
            String::from_utf8_lossy(&compiled.stderr)
        );
        let ran = std::process::Command::new(&program).output().unwrap();
        assert!(
            ran.status.success(),
            "{}",
            String::from_utf8_lossy(&ran.stdout)
        );
    }

    #[test]
    fn every_access_of_the_kernel_stays_in_its_slot() {
        for max_len in (0..=300).chain([4095, 4096, 65535]) {
            let geometry = Geometry::new(max_len, 4);
            let stride = geometry.slot_stride;
            assert_eq!(stride % 128, 0, "{geometry:?}");
            assert_eq!(geometry.response_offset % 16, 0, "{geometry:?}");
            // The request area ends where the response area starts.
            assert!(REQUEST_OFFSET + max_len <= geometry.response_offset);
            // The kernel's loads for the longest payload: up to the 16 bytes after its last
            // whole chunk. Its stores: whole chunks from the response offset.
            assert!(
                REQUEST_OFFSET + 16 * (max_len / 16 + 1) <= stride,
                "{geometry:?}"
            );
            assert!(geometry.response_offset + max_len.next_multiple_of(16) <= stride);
            assert_eq!(geometry.slot(1, 0), geometry.slot(0, 3) + stride);
        }
    }
}
