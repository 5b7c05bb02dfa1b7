//! A plugin that misbehaves on request, to test that workers survive plugins.
//!
//! The command payload says what to do:
//!
//! * `fail`: refuse the command with `DOCA_ERROR_NOT_SUPPORTED`;
//! * `panic`: panic while handling the command;
//! * `later`: answer from the next `progress` instead of at once;
//! * `panic-later`: panic in the next `progress`;
//! * `env:NAME`: answer with the value of the worker's environment variable `NAME`;
//! * `domain:` then a `u64` domain id, a `u64` address and an `i32` segment (little-endian):
//!   answer with what the SDK's domain lookups found, as text:
//!   `addr=<address>;seg=<segment>;memh=<memory handle>;mkey=<remote key>`, each item either
//!   its bytes (as UTF-8, lossily) or a segment number, or `!` and the DOCA status name;
//! * anything else: answer at once with the same bytes.
//!
//! Its address (what `addr` returns) is `faulty-address@<pid>`.
#![deny(unsafe_code)]

use urom_plugin::{Command, Notifier, Plugin};
use urom_wire::Status;

/// The version this plugin reports.
pub const VERSION: u64 = 0x0f;

/// A command held back for `progress`.
struct Deferred {
    dest_id: u64,
    plugin: u64,
    urom_context: u64,
}

/// The plugin's state.
pub struct Faulty {
    deferred: Vec<Deferred>,
    panic_in_progress: bool,
    address: Vec<u8>,
}

/// What the domain lookups found, as the `domain:` command answers it.
fn domain_report(domain: &urom_plugin::Domain<'_>, args: &[u8]) -> Result<String, Status> {
    let (id, rest) = args.split_first_chunk::<8>().ok_or(Status::InvalidValue)?;
    let (va, rest) = rest.split_first_chunk::<8>().ok_or(Status::InvalidValue)?;
    let seg: [u8; 4] = rest.try_into().map_err(|_| Status::InvalidValue)?;
    let (id, va, seg) = (
        u64::from_le_bytes(*id),
        u64::from_le_bytes(*va),
        i32::from_le_bytes(seg),
    );
    let text = |found: Result<&[u8], Status>| match found {
        Ok(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Err(status) => format!("!{}", status.name()),
    };
    let segment = match domain.segment(id, va) {
        Ok(seg) => seg.to_string(),
        Err(status) => format!("!{}", status.name()),
    };
    Ok(format!(
        "addr={};seg={segment};memh={};mkey={}",
        text(domain.address(id)),
        text(domain.memory_handle(id, seg)),
        text(domain.remote_key(id, seg)),
    ))
}

impl Plugin for Faulty {
    const VERSION: u64 = VERSION;

    fn open() -> Result<Self, Status> {
        Ok(Self {
            deferred: Vec::new(),
            panic_in_progress: false,
            address: format!("faulty-address@{}", std::process::id()).into_bytes(),
        })
    }

    fn address(&self) -> &[u8] {
        &self.address
    }

    fn command(&mut self, command: &Command<'_>, out: &mut Notifier<'_>) -> Result<(), Status> {
        match command.payload {
            b"fail" => Err(Status::NotSupported),
            b"panic" => panic!("asked to panic while handling a command"),
            b"panic-later" => {
                self.panic_in_progress = true;
                Ok(())
            }
            b"later" => {
                self.deferred.push(Deferred {
                    dest_id: command.dest_id,
                    plugin: command.plugin,
                    urom_context: command.urom_context,
                });
                Ok(())
            }
            other => {
                if let Some(name) = other.strip_prefix(b"env:") {
                    let name = std::str::from_utf8(name).map_err(|_| Status::InvalidValue)?;
                    let value = std::env::var(name).map_err(|_| Status::NotFound)?;
                    return out.reply(command, Status::Success, value.as_bytes());
                }
                if let Some(args) = other.strip_prefix(b"domain:") {
                    let report = domain_report(&out.domain(), args)?;
                    return out.reply(command, Status::Success, report.as_bytes());
                }
                out.reply(command, Status::Success, other)
            }
        }
    }

    fn progress(&mut self, out: &mut Notifier<'_>) -> Result<bool, Status> {
        if std::mem::take(&mut self.panic_in_progress) {
            panic!("asked to panic in progress");
        }
        let worked = !self.deferred.is_empty();
        for held in self.deferred.drain(..) {
            out.notify(
                held.dest_id,
                held.plugin,
                held.urom_context,
                Status::Success,
                b"late",
            )?;
        }
        Ok(worked)
    }
}

urom_plugin::export_plugin!(Faulty);
