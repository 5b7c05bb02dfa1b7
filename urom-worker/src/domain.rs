//! The worker's side of a domain start: it answers its host's requests for plugin addresses
//! itself (by each plugin's `addr`), takes the domain table in chunks, and from then on every
//! plugin's domain lookups answer from it.
//!
//! Each host connection assembles its own table; a table replaces the one before it (what
//! plugins looked up in an earlier table stays valid: see `urom_plugin::abi`). None of this is on
//! the command path: it runs once per domain start.

use std::collections::HashMap;
use std::sync::Arc;

use tracing::{info, warn};
use urom_plugin::abi::LoadedPlugin;
use urom_plugin::domain::DomainTable;
use urom_plugin::plugin_id::PluginId;
use urom_wire::domain::{
    ADDRESS_REPLY_HEADER_LEN, AddressReply, AddressRequest, DomainMessage, TableAck, TableChunk,
};
use urom_wire::{FRAME_HEADER_LEN, FrameRepr, MaxMsgSize, Status};

/// Where a domain reply goes: the host connection `dest_id`.
pub(crate) trait DomainReplies {
    /// Sends `body` to host connection `dest_id`; an error when it is gone.
    fn reply(&mut self, dest_id: u64, body: DomainMessage<'_>) -> Result<(), Status>;
}

/// A table on its way from one host.
enum Assembly {
    /// Chunks of request `request` arrive; `bytes` holds those so far.
    Receiving {
        request: u64,
        table_len: u64,
        bytes: Vec<u8>,
    },
    /// Request `request` was refused; its remaining chunks are dropped.
    Refused { request: u64 },
}

/// The tables being received, by host connection.
#[derive(Default)]
pub(crate) struct Domains {
    assemblies: HashMap<u64, Assembly>,
}

impl Domains {
    /// Handles one domain frame from host connection `dest_id`: answers it (a request at once,
    /// a table chunk with the acknowledgement of its table). A frame that gets no domain answer
    /// (a malformed one, or a reply: hosts send requests) is refused with the status of the
    /// error notification that must answer it instead.
    pub(crate) fn handle(
        &mut self,
        plugins: &mut [Option<LoadedPlugin>],
        replies: &mut dyn DomainReplies,
        max: MaxMsgSize,
        dest_id: u64,
        frame: &[u8],
    ) -> Result<(), Status> {
        let message = match FrameRepr::<DomainMessage>::parse(frame, max) {
            Ok(frame) => frame.body,
            Err(error) => {
                warn!(dest_id, "malformed domain frame from a host: {error}");
                return Err(Status::InvalidValue);
            }
        };
        match message {
            DomainMessage::DomainAddressRequest(request) => {
                address(plugins, replies, max, dest_id, request);
                Ok(())
            }
            DomainMessage::DomainTableChunk(chunk) => {
                if let Some((request, status)) = self.chunk(plugins, dest_id, chunk) {
                    let ack = DomainMessage::DomainTableAck(TableAck { request, status });
                    // A host that is gone cannot be answered.
                    let _ = replies.reply(dest_id, ack);
                }
                Ok(())
            }
            DomainMessage::DomainAddressReply(_) | DomainMessage::DomainTableAck(_) => {
                warn!(
                    dest_id,
                    "a host sent a domain reply; hosts send domain requests"
                );
                Err(Status::InvalidValue)
            }
        }
    }

    /// Forgets what host connection `dest_id` was sending.
    pub(crate) fn forget(&mut self, dest_id: u64) {
        self.assemblies.remove(&dest_id);
    }

    /// Takes one chunk; the request and status to acknowledge, once there is an answer.
    fn chunk(
        &mut self,
        plugins: &mut [Option<LoadedPlugin>],
        dest_id: u64,
        chunk: TableChunk<'_>,
    ) -> Option<(u64, Status)> {
        if chunk.offset == 0 {
            let receiving = Assembly::Receiving {
                request: chunk.request,
                table_len: chunk.table_len,
                bytes: Vec::with_capacity(chunk.table_len as usize),
            };
            self.assemblies.insert(dest_id, receiving);
        }
        let Some(assembly) = self.assemblies.get_mut(&dest_id) else {
            warn!(
                dest_id,
                request = chunk.request,
                offset = chunk.offset,
                "a domain table chunk of a table that was never started; the table is refused"
            );
            let refused = Assembly::Refused {
                request: chunk.request,
            };
            self.assemblies.insert(dest_id, refused);
            return Some((chunk.request, Status::InvalidValue));
        };
        match assembly {
            Assembly::Receiving {
                request,
                table_len,
                bytes,
            } if *request == chunk.request
                && *table_len == chunk.table_len
                && bytes.len() as u64 == chunk.offset =>
            {
                bytes.extend_from_slice(chunk.bytes);
                if (bytes.len() as u64) < *table_len {
                    return None;
                }
                let (request, bytes) = (*request, std::mem::take(bytes));
                self.assemblies.remove(&dest_id);
                Some((request, install(plugins, dest_id, &bytes)))
            }
            Assembly::Refused { request } if *request == chunk.request => None,
            _ => {
                warn!(
                    dest_id,
                    request = chunk.request,
                    offset = chunk.offset,
                    "a domain table chunk out of order; the table is refused"
                );
                *assembly = Assembly::Refused {
                    request: chunk.request,
                };
                Some((chunk.request, Status::InvalidValue))
            }
        }
    }
}

/// Answers a request for a plugin's address.
fn address(
    plugins: &mut [Option<LoadedPlugin>],
    replies: &mut dyn DomainReplies,
    max: MaxMsgSize,
    dest_id: u64,
    AddressRequest { request, plugin }: AddressRequest,
) {
    let loaded = PluginId::new(plugin)
        .ok()
        .and_then(|id| plugins.get_mut(id.index()))
        .and_then(Option::as_mut);
    let found = match loaded {
        Some(loaded) => loaded.address(),
        None => Err(Status::NotFound),
    };
    let room = max.get() - FRAME_HEADER_LEN - ADDRESS_REPLY_HEADER_LEN;
    let (status, address) = match &found {
        Ok(address) if address.len() > room => {
            warn!(
                plugin,
                len = address.len(),
                "a plugin's address does not fit a frame; raise the maximum message size"
            );
            (Status::TooBig, &[][..])
        }
        Ok(address) => (Status::Success, address.as_slice()),
        Err(status) => (*status, &[][..]),
    };
    let reply = DomainMessage::DomainAddressReply(AddressReply {
        request,
        plugin,
        status,
        address,
    });
    let _ = replies.reply(dest_id, reply);
}

/// Checks a whole table and hands it to every plugin; the status to acknowledge it with.
fn install(plugins: &mut [Option<LoadedPlugin>], dest_id: u64, bytes: &[u8]) -> Status {
    let table = match DomainTable::parse(bytes) {
        Ok(table) => Arc::new(table),
        Err(error) => {
            warn!(dest_id, "a domain table was refused: {error}");
            return error.status();
        }
    };
    let mut ids: Vec<u64> = table.members().map(|m| m.domain_id).collect();
    ids.sort_unstable();
    info!(
        dest_id,
        ranks = table.ranks(),
        members = ?ids,
        "domain table installed"
    );
    for plugin in plugins.iter_mut().flatten() {
        plugin.set_domain(Arc::clone(&table));
    }
    Status::Success
}
