//! The sandbox plugin on the host side: [`SandboxHost`] submits tagged sends and receives (and
//! memory maps) to a worker's sandbox plugin, and [`tag_send_result`], [`tag_recv_result`] and
//! [`mem_map_result`] read their outcome in the task's callback: the DOCA UROM sample's
//! `urom_sandbox_init`, `urom_sandbox_tag_task_send`, `urom_sandbox_tag_task_recv` and
//! `urom_sandbox_task_mem_map`, typed.
//!
//! The plugin (`plugins/sandbox/worker`) sends worker to worker over UCX: a send goes to the worker
//! with domain id `dest` in the worker's domain, a receive matches UCX's way,
//! `(sender_tag & mask) == (tag & mask)`. Bytes travel inline (in the command and the
//! notification, up to what a message holds) or, in the buffer variant, from and to this host's
//! memory, mapped with `host::HostMemory` (feature `ucx`) and added to the domain: the worker reaches
//! them through the domain's keys with UCX remote memory access. Nothing here allocates.
//!
//! The byte format lives in [`urom_sandbox_wire`] and is re-exported here. Commands carry
//! UCX's `ucp_mem_map_params_t`, whose size depends on the UCX: this host writes
//! [`HOST_LAYOUT`], the layout of the UCX it was built against (64-byte commands on UCX 1.13,
//! 72-byte ones on 1.14 and later, and without the `ucx` feature); the plugin reads both, so a
//! host and a worker built against different UCX versions agree. [`timestamps`]
//! has the plugin's message timestamps (`UROM_SANDBOX_TIMESTAMPS`): its recorder, and the
//! reading and pairing of its files, to time messages between workers without the hosts.

pub use urom_sandbox_wire::timestamps;

use urom_host::{CommandError, CompletedTask, Running, TaskCallback, TaskHandle, Worker};
use urom_wire::Status;

pub use urom_sandbox_wire::{
    COMMAND_LEN_UCX_1_13, COMMAND_LEN_UCX_1_14, CommandLayout, DOMAIN_MEMH_ID,
    MEM_MAP_FIELD_EXPORTED_MEMH_BUFFER, MemMapParams, NAME, NOTIFICATION_LEN, SandboxCommand,
    SandboxError, SandboxNotification, VERSION, check_version,
};

/// The command layout this host writes: that of the UCX headers it was built against (ucx-sys's
/// version; 72-byte commands from UCX 1.14, 64-byte ones on 1.13), and without the `ucx`
/// feature the 72-byte layout of current UCX (what DOCA's sandbox plugin, built against DOCA's
/// UCX, reads). urom's plugin reads both.
#[cfg(feature = "ucx")]
pub const HOST_LAYOUT: CommandLayout =
    CommandLayout::for_ucx(ucx_sys::VERSION.0, ucx_sys::VERSION.1);
/// The command layout this host writes: that of the UCX headers it was built against (ucx-sys's
/// version; 72-byte commands from UCX 1.14, 64-byte ones on 1.13), and without the `ucx`
/// feature the 72-byte layout of current UCX (what DOCA's sandbox plugin, built against DOCA's
/// UCX, reads). urom's plugin reads both.
#[cfg(not(feature = "ucx"))]
pub const HOST_LAYOUT: CommandLayout = CommandLayout::Ucx114;

/// Where the bytes of a send come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendFrom<'a> {
    /// These bytes, carried in the command.
    Inline(&'a [u8]),
    /// `len` bytes at `va` in this host's memory, in a buffer of the domain.
    Memory {
        /// The address.
        va: u64,
        /// How many bytes.
        len: u64,
    },
}

/// Where the bytes of a receive go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecvInto {
    /// Back in the notification, at most `capacity` bytes.
    Inline {
        /// The most bytes to receive.
        capacity: u64,
    },
    /// At most `len` bytes to `va` in this host's memory, in a buffer of the domain.
    Memory {
        /// The address.
        va: u64,
        /// The most bytes to receive.
        len: u64,
    },
}

/// A finished send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TagSendResult {
    /// The cookie given when the send was submitted.
    pub cookie: u64,
    /// The context the notification carried back.
    pub context: u64,
    /// UCX's status (0: sent).
    pub ucs_status: i32,
}

/// What a receive got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received<'a> {
    /// These bytes (lent for the callback).
    Inline(&'a [u8]),
    /// This many bytes, written to the buffer in this host's memory.
    Memory {
        /// How many.
        len: u64,
    },
}

/// A finished receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TagRecvResult<'a> {
    /// The cookie given when the receive was submitted.
    pub cookie: u64,
    /// The context the notification carried back.
    pub context: u64,
    /// The bytes.
    pub data: Received<'a>,
    /// The sender's tag.
    pub sender_tag: u64,
    /// UCX's status (0: received).
    pub ucs_status: i32,
}

/// A finished memory map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemMapResult {
    /// The cookie given when the map was submitted.
    pub cookie: u64,
    /// The context the notification carried back.
    pub context: u64,
    /// The mapping's id.
    pub memh_id: u64,
}

/// The host side of the sandbox plugin: `init` once with the id and version the service
/// reported, then submit sends, receives and maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SandboxHost {
    id: u64,
}

/// Writes `command` into the task; its length (too long for the task when it does not fit,
/// which the submission refuses as too big).
fn fill(
    task: &mut urom_host::CommandTask<'_, '_>,
    cookie: u64,
    callback: TaskCallback,
    command: &SandboxCommand<'_>,
) -> usize {
    task.user_data_mut()[..8].copy_from_slice(&cookie.to_le_bytes());
    task.set_callback(callback);
    command
        .pack(HOST_LAYOUT, task.payload_mut())
        .unwrap_or(command.buffer_len(HOST_LAYOUT))
}

impl SandboxHost {
    /// The sandbox plugin with `id`, if the service's `version` is this host's (1).
    pub fn init(id: u64, version: u64) -> Result<Self, SandboxError> {
        check_version(version)?;
        Ok(Self { id })
    }

    /// The plugin id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Sends bytes to the worker with domain id `dest`, tagged `tag`; `callback` runs from the
    /// worker's progress engine and reads the outcome with [`tag_send_result`].
    #[allow(clippy::too_many_arguments)]
    pub fn tag_send(
        &self,
        worker: &Worker<Running>,
        cookie: u64,
        context: u64,
        dest: u64,
        from: SendFrom<'_>,
        tag: u64,
        callback: TaskCallback,
    ) -> Result<TaskHandle, CommandError> {
        let command = match from {
            SendFrom::Inline(data) => SandboxCommand::TagSend {
                context,
                dest,
                buffer: 0,
                count: data.len() as u64,
                tag,
                memh_id: 0,
                data,
            },
            SendFrom::Memory { va, len } => SandboxCommand::TagSend {
                context,
                dest,
                buffer: va,
                count: len,
                tag,
                memh_id: DOMAIN_MEMH_ID,
                data: &[],
            },
        };
        worker.submit(self.id, |task| fill(task, cookie, callback, &command))
    }

    /// Receives a message whose tag matches `tag` under `mask`; `callback` reads the outcome
    /// with [`tag_recv_result`].
    #[allow(clippy::too_many_arguments)]
    pub fn tag_recv(
        &self,
        worker: &Worker<Running>,
        cookie: u64,
        context: u64,
        into: RecvInto,
        tag: u64,
        mask: u64,
        callback: TaskCallback,
    ) -> Result<TaskHandle, CommandError> {
        let (buffer, count, memh_id) = match into {
            RecvInto::Inline { capacity } => (0, capacity, 0),
            RecvInto::Memory { va, len } => (va, len, DOMAIN_MEMH_ID),
        };
        let command = SandboxCommand::TagRecv {
            context,
            buffer,
            count,
            tag,
            tag_mask: mask,
            memh_id,
        };
        worker.submit(self.id, |task| fill(task, cookie, callback, &command))
    }

    /// Asks the worker to map memory from an exported memory handle (with the `ucx` feature,
    /// `MappedMemory::exported_memh`); `callback` reads the outcome with [`mem_map_result`]. A
    /// worker whose UCX cannot import memory handles (before 1.15, or no transport that can:
    /// every machine without mlx5) answers `DOCA_ERROR_NOT_SUPPORTED`, and its log says why.
    pub fn mem_map(
        &self,
        worker: &Worker<Running>,
        cookie: u64,
        context: u64,
        params: MemMapParams,
        exported_memh: &[u8],
        callback: TaskCallback,
    ) -> Result<TaskHandle, CommandError> {
        let command = SandboxCommand::MemMap {
            context,
            params,
            exported_memh,
        };
        worker.submit(self.id, |task| fill(task, cookie, callback, &command))
    }
}

fn cookie(task: &CompletedTask<'_>) -> u64 {
    u64::from_le_bytes(task.user_data[..8].try_into().expect("8 bytes"))
}

/// The outcome of a send task: the worker's status, or the send's result.
pub fn tag_send_result(task: &CompletedTask<'_>) -> Result<TagSendResult, Status> {
    task.status.into_result()?;
    match SandboxNotification::unpack(task.response)? {
        SandboxNotification::TagSend { context, status } => Ok(TagSendResult {
            cookie: cookie(task),
            context,
            ucs_status: status,
        }),
        _ => Err(Status::InvalidValue),
    }
}

/// The outcome of a receive task: the worker's status, or what was received (inline bytes
/// lent for the callback).
pub fn tag_recv_result<'a>(task: &CompletedTask<'a>) -> Result<TagRecvResult<'a>, Status> {
    task.status.into_result()?;
    match SandboxNotification::unpack(task.response)? {
        SandboxNotification::TagRecv {
            context,
            buffer,
            count,
            sender_tag,
            status,
            data,
        } => Ok(TagRecvResult {
            cookie: cookie(task),
            context,
            data: if buffer != 0 {
                Received::Inline(data)
            } else {
                Received::Memory { len: count }
            },
            sender_tag,
            ucs_status: status,
        }),
        _ => Err(Status::InvalidValue),
    }
}

/// The outcome of a memory-map task.
pub fn mem_map_result(task: &CompletedTask<'_>) -> Result<MemMapResult, Status> {
    task.status.into_result()?;
    match SandboxNotification::unpack(task.response)? {
        SandboxNotification::MemMap { context, memh_id } => Ok(MemMapResult {
            cookie: cookie(task),
            context,
            memh_id,
        }),
        _ => Err(Status::InvalidValue),
    }
}
