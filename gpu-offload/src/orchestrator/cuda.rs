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
//! Per channel, a CPU feeder thread takes frames of requests off the data connection and posts
//! each request in the next slot (payload, length, then state 1 with Release); the kernel's
//! warp for that channel waits for state 1 in slot order, reverses the payload in place (the
//! lanes share the bytes), fences, and sets state 2; the feeder picks responses up in slot
//! order, frees each slot (state 0), and sends one frame of responses per frame of requests.
//! Requests are answered in the order they came, which the server relies on. The kernel runs until the CPU sets the stop flag; the main thread
//! watches it with `cuStreamQuery`.
//!
//! Without a driver or NVRTC, [`Gpu::open`] says so in one line instead of failing inside
//! cudarc (which panics when the library is absent).
#![allow(unsafe_code)]

use core::fmt;
use std::collections::VecDeque;
use std::ffi::{CString, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use cudarc::driver::{
    CudaContext, CudaStream, DriverError, LaunchConfig, PushKernelArg, result, sys,
};
use tracing::{error, info, warn};
use urom_core::transport::{FrameSender, Transport};
use urom_wire::gpu::{CLIENT_HEADER_LEN, GpuMessage, message_length, write_client_headers};

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
    feeders: Vec<JoinHandle<Option<()>>>,
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
            let spawned = super::spawn_pinned(
                format!("cuda-feeder-{index}"),
                cpus.get(index).copied(),
                move || feed(conn, index, &shared, geometry, &stop),
            );
            match spawned {
                Ok(feeder) => feeders.push(feeder),
                Err(e) => {
                    feeders_stop.store(true, Ordering::Relaxed);
                    for feeder in feeders {
                        let _ = feeder.join();
                    }
                    memory.word(0).store(1, Ordering::Release);
                    let _ = stream.synchronize();
                    return Err(CudaError::Driver {
                        op: "starting the feeder threads",
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

/// One channel's feeder: posts each request of each frame to the kernel, and sends back one
/// frame of responses per frame of requests, in order.
fn feed<T: Transport>(
    mut conn: T,
    index: usize,
    memory: &HostMemory,
    geometry: Geometry,
    stop: &AtomicBool,
) {
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
    let (mut head, mut tail) = (0usize, 0usize);
    let mut served = 0u64;
    'feed: while !stop.load(Ordering::Relaxed) {
        let mut progress = false;
        // Responses, in slot order; a frame goes back once all its requests are done.
        while tail < head {
            let slot = geometry.slot(index, tail % geometry.slots);
            if memory.word(slot).load(Ordering::Acquire) != RESPONSE {
                break;
            }
            let len = memory.word(slot + 4).load(Ordering::Relaxed) as usize;
            let Ok(total) = write_client_headers(&mut out[out_len..], true, len, geometry.max_len)
            else {
                error!(
                    thread = index,
                    len, "the kernel reported an impossible length"
                );
                break 'feed;
            };
            memory.read(
                slot + PAYLOAD_OFFSET,
                &mut out[out_len + CLIENT_HEADER_LEN..out_len + total],
            );
            memory.word(slot).store(FREE, Ordering::Release);
            out_len += total;
            gathered += 1;
            tail += 1;
            served += 1;
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
        while staged_at < staged_len && head - tail < geometry.slots {
            let Ok(Some(len)) = message_length(&staged[staged_at..staged_len], geometry.max_len)
            else {
                break;
            };
            let payload = &staged[staged_at + CLIENT_HEADER_LEN..staged_at + len];
            let slot = geometry.slot(index, head % geometry.slots);
            memory.write(slot + PAYLOAD_OFFSET, payload);
            memory
                .word(slot + 4)
                .store(payload.len() as u32, Ordering::Relaxed);
            memory.word(slot).store(REQUEST, Ordering::Release);
            staged_at += len;
            head += 1;
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
            if head == tail && staged_at == staged_len {
                let _ = conn.wait_recv(Duration::from_millis(50));
            } else {
                std::hint::spin_loop();
            }
        }
    }
    info!(thread = index, requests = served, "feeder stopped");
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
            println!("skipped: no NVRTC library (libnvrtc.so.13) on this machine");
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

    #[test]
    fn slots_do_not_overlap() {
        let geometry = Geometry {
            slots: 4,
            slot_stride: (PAYLOAD_OFFSET + 256).next_multiple_of(128),
            channel_stride: 4 * (PAYLOAD_OFFSET + 256).next_multiple_of(128),
            max_len: 256,
        };
        assert_eq!(geometry.slot(0, 0), STOP_LINE);
        assert!(geometry.slot(0, 1) >= geometry.slot(0, 0) + PAYLOAD_OFFSET + 256);
        assert_eq!(
            geometry.slot(1, 0),
            geometry.slot(0, 3) + geometry.slot_stride
        );
    }
}
