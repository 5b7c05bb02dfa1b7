//! The graph plugin on the host side: [`GraphHost`] submits loopbacks, [`loopback_result`]
//! reads their outcome (the DOCA UROM guide's `urom_graph_init` and `urom_graph_task_loopback`).
//!
//! The plugin's byte format (16-byte `{type, data}` commands and notifications, the plugin's
//! name and version) lives in [`urom_graph_wire`] and is re-exported here, so that the plugin
//! (`plugins/graph/worker`) and hosts share one definition.

use urom_wire::Status;

pub use urom_graph_wire::{
    CMD_LOOPBACK, GraphCommand, GraphError, GraphMessage, GraphNotification, MESSAGE_LEN, NAME,
    NOTIFY_LOOPBACK, VERSION, check_version,
};

/// The host side of the graph plugin: `init` once with the id and version the service
/// reported, then submit loopbacks (the DOCA UROM guide's `urom_graph_init` and
/// `urom_graph_task_loopback`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphHost {
    id: u64,
}

/// A finished loopback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoopbackResult {
    /// The data the plugin sent back.
    pub data: u64,
    /// The cookie given when the loopback was submitted.
    pub cookie: u64,
}

impl GraphHost {
    /// The graph plugin with `id`, if the service's `version` is this host's.
    pub fn init(id: u64, version: u64) -> Result<Self, GraphError> {
        check_version(version)?;
        Ok(Self { id })
    }

    /// The plugin id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Sends `data` to the plugin and back; `callback` runs from the worker's progress engine
    /// and reads the outcome with [`loopback_result`]. Allocates nothing.
    pub fn loopback(
        &self,
        worker: &urom_host::Worker<urom_host::Running>,
        cookie: u64,
        data: u64,
        callback: urom_host::TaskCallback,
    ) -> Result<urom_host::TaskHandle, urom_host::CommandError> {
        worker.submit(self.id, |task| {
            task.user_data_mut()[..8].copy_from_slice(&cookie.to_le_bytes());
            task.set_callback(callback);
            GraphCommand::Loopback { data }
                .pack(task.payload_mut())
                .unwrap_or(0)
        })
    }
}

impl GraphHost {
    /// Sends `count` loopbacks in one burst ([`urom_host::Worker::submit_batch`]): the `i`th
    /// carries the data and the cookie `first + i`. Returns how many went (fewer when the task
    /// slots or the channel filled up), or why none did. Allocates nothing.
    pub fn loopback_batch(
        &self,
        worker: &urom_host::Worker<urom_host::Running>,
        first: u64,
        count: usize,
        callback: urom_host::TaskCallback,
    ) -> Result<usize, urom_host::CommandError> {
        worker.submit_batch(self.id, count, |i, task| {
            let value = first + i as u64;
            task.user_data_mut()[..8].copy_from_slice(&value.to_le_bytes());
            task.set_callback(callback);
            GraphCommand::Loopback { data: value }
                .pack(task.payload_mut())
                .unwrap_or(0)
        })
    }
}

/// The outcome of a loopback task: the data and cookie, or the status it failed with.
pub fn loopback_result(task: &urom_host::CompletedTask<'_>) -> Result<LoopbackResult, Status> {
    task.status.into_result()?;
    let cookie = u64::from_le_bytes(task.user_data[..8].try_into().expect("8 bytes"));
    match GraphNotification::unpack(task.response) {
        Ok(GraphNotification::Loopback { data }) => Ok(LoopbackResult { data, cookie }),
        Err(_) => Err(Status::InvalidValue),
    }
}
