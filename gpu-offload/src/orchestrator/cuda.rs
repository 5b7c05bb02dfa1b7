//! The CUDA processor: a persistent kernel, one warp per server data-path thread, polling
//! request slots in pinned host memory mapped into the GPU's address space.
//!
//! Memory, one `cuMemHostAlloc(DEVICEMAP | PORTABLE)` allocation:
//!
//! ```text
//! 0                  u32 stop flag, set by the CPU to end the kernel (own 128-byte line)
//! 128 + c * CH       channel c: `slots` slots of SLOT bytes (SLOT = 16 + max length,
//!                    rounded up to 128), each:
//!                      0  u32 state   0 free (CPU's), 1 request (GPU's), 2 response (CPU's)
//!                      4  u32 length  payload bytes
//!                      16 payload
//! ```
//!
//! Per channel, a CPU feeder thread takes requests off the data connection and posts each in
//! the next slot (payload, length, then state 1 with Release); the kernel's warp for that
//! channel waits for state 1 in slot order, reverses the payload in place (the lanes share the
//! bytes), fences, and sets state 2; the feeder picks responses up in slot order, sends them to
//! the server and frees the slot (state 0). Requests are answered in the order they came, which
//! the server relies on. The kernel runs until the CPU sets the stop flag; the main thread
//! watches it with `cuStreamQuery`.
//!
//! Without a driver or NVRTC, [`Gpu::open`] says so in one line instead of failing inside
//! cudarc (which panics when the library is absent).
#![allow(unsafe_code)]

use core::fmt;
use std::ffi::{CString, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use cudarc::driver::{
    CudaContext, CudaStream, DriverError, LaunchConfig, PushKernelArg, result, sys,
};
use tracing::{error, info, warn};
use urom_core::shm::ShmConnection;
use urom_core::transport::{FrameSendError, Transport};
use urom_wire::gpu::{CLIENT_HEADER_LEN, GpuMessage, write_client_headers};

use crate::channel::ChannelParams;

/// Why the CUDA processor cannot run or stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
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
        reason: String,
    },
    /// NVRTC could not compile the kernel.
    Compile(String),
    /// The kernel ended or failed while it should run.
    KernelFailed(String),
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
            Self::Driver { op, reason } => write!(f, "{op} failed: {reason}"),
            Self::Compile(reason) => write!(f, "the kernel does not compile: {reason}"),
            Self::KernelFailed(reason) => write!(f, "the kernel stopped: {reason}"),
        }
    }
}

impl std::error::Error for CudaError {}

fn driver(op: &'static str) -> impl FnOnce(DriverError) -> CudaError {
    move |e| CudaError::Driver {
        op,
        reason: e.to_string(),
    }
}

const KERNEL_NAME: &str = "reverse_requests";
const KERNEL: &str = r#"
extern "C" __global__ void reverse_requests(unsigned char *base,
                                            unsigned long long channel_stride,
                                            unsigned int slot_stride,
                                            unsigned int slots,
                                            volatile unsigned int *stop)
{
    const unsigned int lane = threadIdx.x;
    unsigned char *ring = base + (unsigned long long)blockIdx.x * channel_stride;
    unsigned int next = 0;
    for (;;) {
        volatile unsigned int *state =
            (volatile unsigned int *)(ring + (unsigned long long)next * slot_stride);
        int go = 0;
        if (lane == 0) {
            for (;;) {
                if (*state == 1u) { go = 1; break; }
                if (*stop != 0u) { go = 2; break; }
            }
        }
        go = __shfl_sync(0xffffffffu, go, 0);
        if (go == 2) {
            return;
        }
        __threadfence_system();
        volatile unsigned char *slot = (volatile unsigned char *)state;
        const unsigned int len = ((volatile unsigned int *)slot)[1];
        volatile unsigned char *data = slot + 16;
        for (unsigned int i = lane; i < len / 2; i += 32) {
            const unsigned char a = data[i];
            const unsigned char b = data[len - 1 - i];
            data[i] = b;
            data[len - 1 - i] = a;
        }
        __syncwarp();
        __threadfence_system();
        if (lane == 0) {
            *state = 2u;
        }
        next = (next + 1 == slots) ? 0 : next + 1;
    }
}
"#;

const STOP_LINE: usize = 128;
const PAYLOAD_OFFSET: usize = 16;
const FREE: u32 = 0;
const REQUEST: u32 = 1;
const RESPONSE: u32 = 2;

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

    /// The `u32` at `offset` as an atomic.
    fn word(&self, offset: usize) -> &AtomicU32 {
        assert!(offset % 4 == 0 && offset + 4 <= self.len);
        // SAFETY: in bounds and 4-byte aligned (checked above; the base is page aligned); the
        // memory lives as long as `self`; the GPU accesses it only with volatile 32-bit loads
        // and stores, so treating it as an atomic is sound.
        unsafe { &*(self.host.wrapping_add(offset) as *const AtomicU32) }
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

/// Where the slots of a channel sit.
#[derive(Clone, Copy)]
struct Geometry {
    slots: usize,
    slot_stride: usize,
    channel_stride: usize,
    max_len: usize,
}

impl Geometry {
    fn slot(&self, channel: usize, slot: usize) -> usize {
        STOP_LINE + channel * self.channel_stride + slot * self.slot_stride
    }
}

/// The running kernel and its feeders.
pub struct CudaProcessor {
    gpu: Gpu,
    stream: Arc<CudaStream>,
    memory: Arc<HostMemory>,
    feeders_stop: Arc<AtomicBool>,
    feeders: Vec<JoinHandle<()>>,
}

impl CudaProcessor {
    /// Compiles and launches the kernel, one warp per data connection, and starts the feeders.
    pub fn start(
        gpu: Gpu,
        conns: Vec<ShmConnection>,
        params: &ChannelParams,
    ) -> Result<Self, CudaError> {
        let ctx = Arc::clone(&gpu.ctx);
        ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let ptx =
            cudarc::nvrtc::compile_ptx(KERNEL).map_err(|e| CudaError::Compile(e.to_string()))?;
        let module = ctx.load_module(ptx).map_err(driver("cuModuleLoadData"))?;
        let function = module
            .load_function(KERNEL_NAME)
            .map_err(driver("cuModuleGetFunction"))?;
        let max_len = params.max_message_length as usize;
        let slot_stride = (PAYLOAD_OFFSET + max_len).next_multiple_of(128);
        let slots = params.max_concurrent as usize;
        let geometry = Geometry {
            slots,
            slot_stride,
            channel_stride: slots * slot_stride,
            max_len,
        };
        let channels = conns.len();
        let memory = Arc::new(HostMemory::new(
            &ctx,
            STOP_LINE + channels * geometry.channel_stride,
        )?);
        let stream = ctx.new_stream().map_err(driver("cuStreamCreate"))?;
        let channel_stride = geometry.channel_stride as u64;
        let slot_stride_arg = slot_stride as u32;
        let slots_arg = slots as u32;
        let stop_ptr: u64 = memory.device;
        let mut launch = stream.launch_builder(&function);
        launch
            .arg(&memory.device)
            .arg(&channel_stride)
            .arg(&slot_stride_arg)
            .arg(&slots_arg)
            .arg(&stop_ptr);
        let config = LaunchConfig {
            grid_dim: (channels as u32, 1, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments match the kernel's parameters in number and type; the memory
        // they point to stays allocated until `stop` has synchronized the stream.
        unsafe { launch.launch(config) }.map_err(driver("cuLaunchKernel"))?;
        info!(
            ordinal = gpu.ordinal,
            warps = channels,
            slots,
            "kernel launched"
        );
        let feeders_stop = Arc::new(AtomicBool::new(false));
        let mut feeders = Vec::with_capacity(channels);
        for (index, conn) in conns.into_iter().enumerate() {
            let shared = Arc::clone(&memory);
            let stop = Arc::clone(&feeders_stop);
            let spawned = std::thread::Builder::new()
                .name(format!("cuda-feeder-{index}"))
                .spawn(move || feed(conn, index, &shared, geometry, &stop));
            match spawned {
                Ok(handle) => feeders.push(handle),
                Err(e) => {
                    feeders_stop.store(true, Ordering::Relaxed);
                    for feeder in feeders {
                        let _ = feeder.join();
                    }
                    memory.word(0).store(1, Ordering::Release);
                    let _ = stream.synchronize();
                    return Err(CudaError::Driver {
                        op: "starting a feeder thread",
                        reason: e.to_string(),
                    });
                }
            }
        }
        Ok(Self {
            gpu,
            stream,
            memory,
            feeders_stop,
            feeders,
        })
    }

    /// An error once the kernel ended or failed.
    pub fn check(&mut self) -> Result<(), CudaError> {
        // SAFETY: the stream is alive (owned by `self`).
        let status = unsafe { sys::cuStreamQuery(self.stream.cu_stream()) };
        match status {
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(()),
            sys::CUresult::CUDA_SUCCESS => Err(CudaError::KernelFailed(
                "it returned before being told to stop".to_owned(),
            )),
            other => Err(CudaError::KernelFailed(format!("{other:?}"))),
        }
    }

    /// Stops the feeders, then the kernel, and waits for it.
    pub fn stop(self) {
        self.feeders_stop.store(true, Ordering::Relaxed);
        for feeder in self.feeders {
            let _ = feeder.join();
        }
        self.memory.word(0).store(1, Ordering::Release);
        let _ = self.gpu.ctx.bind_to_thread();
        if let Err(e) = self.stream.synchronize() {
            error!("the kernel ended with an error: {e}");
        }
        info!("kernel stopped");
    }
}

/// One channel's feeder: posts requests to the kernel and returns its responses, in order.
fn feed(
    mut conn: ShmConnection,
    index: usize,
    memory: &HostMemory,
    geometry: Geometry,
    stop: &AtomicBool,
) {
    let mut out = vec![0u8; CLIENT_HEADER_LEN + geometry.max_len].into_boxed_slice();
    let (mut head, mut tail) = (0usize, 0usize);
    let mut served = 0u64;
    'feed: while !stop.load(Ordering::Relaxed) {
        let mut progress = false;
        // Responses, in slot order.
        while tail < head {
            let slot = geometry.slot(index, tail % geometry.slots);
            if memory.word(slot).load(Ordering::Acquire) != RESPONSE {
                break;
            }
            let len = memory.word(slot + 4).load(Ordering::Relaxed) as usize;
            let Ok(total) = write_client_headers(&mut out, true, len, geometry.max_len) else {
                error!(
                    thread = index,
                    len, "the kernel reported an impossible length"
                );
                break 'feed;
            };
            memory.read(slot + PAYLOAD_OFFSET, &mut out[CLIENT_HEADER_LEN..total]);
            memory.word(slot).store(FREE, Ordering::Release);
            loop {
                match conn.send(&out[..total]) {
                    Ok(()) => break,
                    Err(FrameSendError::Full) => {
                        if conn.wait_send(Duration::from_millis(50)).is_err() {
                            break 'feed;
                        }
                    }
                    Err(e) => {
                        info!(thread = index, "cannot answer: {e}");
                        break 'feed;
                    }
                }
            }
            tail += 1;
            served += 1;
            progress = true;
        }
        // Requests, while slots are free.
        while head - tail < geometry.slots {
            let slot = geometry.slot(index, head % geometry.slots);
            match conn.recv() {
                Ok(Some(frame)) => {
                    let Ok(GpuMessage::ClientRequest(payload)) =
                        GpuMessage::parse(frame, geometry.max_len)
                    else {
                        warn!(
                            thread = index,
                            "the server sent something other than a well-formed client_request; ignored"
                        );
                        continue;
                    };
                    memory.write(slot + PAYLOAD_OFFSET, payload);
                    memory
                        .word(slot + 4)
                        .store(payload.len() as u32, Ordering::Relaxed);
                    memory.word(slot).store(REQUEST, Ordering::Release);
                    head += 1;
                    progress = true;
                }
                Ok(None) => break,
                Err(e) => {
                    info!(thread = index, "data connection closed: {e}");
                    break 'feed;
                }
            }
        }
        if !progress {
            if head == tail {
                let _ = conn.wait_recv(Duration::from_millis(50));
            } else {
                std::hint::spin_loop();
            }
        }
    }
    info!(thread = index, requests = served, "feeder stopped");
}
