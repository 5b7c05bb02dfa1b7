//! The graph plugin: the loopback sample of the DOCA UROM guide, written with the urom plugin
//! SDK. Each loopback command comes back as a notification carrying the same data.
//!
//! Built as `libworker_graph.so`; installed in a plugin directory as `worker_graph.so`, the
//! daemon reports it as `worker_graph`. The message formats live in `urom_graph_wire`, shared
//! with hosts.
#![deny(unsafe_code)]

use urom_graph_wire::{self as graph, GraphCommand, GraphNotification, MESSAGE_LEN};
use urom_plugin::{Arm, Command, Notifier, Plugin, WakeFds};
use urom_wire::Status;

/// The plugin's per-worker state: it keeps none.
pub struct Graph;

impl Plugin for Graph {
    const VERSION: u64 = graph::VERSION;

    fn open() -> Result<Self, Status> {
        Ok(Graph)
    }

    fn command(&mut self, command: &Command<'_>, out: &mut Notifier<'_>) -> Result<(), Status> {
        let GraphCommand::Loopback { data } = GraphCommand::unpack(command.payload)?;
        let mut notification = [0u8; MESSAGE_LEN];
        GraphNotification::Loopback { data }.pack(&mut notification)?;
        out.reply(command, Status::Success, &notification)
    }

    /// Every command is answered at once: nothing to wake the worker for.
    fn arm(&mut self, _wake: &mut WakeFds<'_>) -> Arm {
        Arm::Armed
    }
}

urom_plugin::export_plugin!(Graph);
