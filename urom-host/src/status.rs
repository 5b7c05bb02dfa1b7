//! What an operator asks the daemon: its status report, read in pages, and stopping a worker by
//! id. `urom-ctl` is built on these.

use super::control::{ControlError, Reply};
use super::{Running, Service};
use urom_wire::control::ControlMessage;
use urom_wire::report::StatusRecord;

/// The daemon's status report: every page of it, kept as received.
pub struct StatusReport {
    pages: Vec<Reply>,
}

impl StatusReport {
    /// The report's records, in order: the daemon, where it listens, hugepages, each plugin
    /// directory followed by its files, each worker followed by its counters and error counts.
    pub fn records(&self) -> impl Iterator<Item = StatusRecord<'_>> {
        self.pages.iter().flat_map(|page| {
            let records = match page.message() {
                ControlMessage::StatusReply(reply) => Some(reply.records.iter()),
                _ => None,
            };
            records.into_iter().flatten()
        })
    }
}

impl Service<Running> {
    /// Reads the daemon's status report (as this host's user may see it: its own workers, or
    /// every worker for root), page after page.
    pub fn status(&self) -> Result<StatusReport, ControlError> {
        let channel = &self.shared_handle().channel;
        let mut pages = Vec::new();
        let mut cursor = 0;
        loop {
            let reply = channel.call(ControlMessage::StatusRequest { cursor })?;
            let next = match reply.message() {
                ControlMessage::StatusReply(page) => page.next_cursor,
                other => {
                    return Err(ControlError::Protocol(format!(
                        "expected a status page, got {other:?}"
                    )));
                }
            };
            pages.push(reply);
            match next {
                0 => return Ok(StatusReport { pages }),
                next if next > cursor => cursor = next,
                next => {
                    return Err(ControlError::Protocol(format!(
                        "the status page at record {cursor} points back to record {next}"
                    )));
                }
            }
        }
    }

    /// Stops worker `id`: one of this user's workers, or any worker for root. Hosts attached to
    /// it are told that it ended.
    pub fn destroy_worker(&self, id: u64) -> Result<(), ControlError> {
        let reply = self
            .shared_handle()
            .channel
            .call(ControlMessage::DestroyWorker { worker_id: id })?;
        match reply.message() {
            ControlMessage::Ack => Ok(()),
            other => Err(ControlError::Protocol(format!(
                "expected an acknowledgement, got {other:?}"
            ))),
        }
    }
}
