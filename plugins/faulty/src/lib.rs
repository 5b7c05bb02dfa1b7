//! A plugin that misbehaves on request, to test that workers survive plugins.
//!
//! The command payload says what to do:
//!
//! * `fail`: refuse the command with `DOCA_ERROR_NOT_SUPPORTED`;
//! * `panic`: panic while handling the command;
//! * `later`: answer from the next `progress` instead of at once;
//! * `panic-later`: panic in the next `progress`;
//! * `env:NAME`: answer with the value of the worker's environment variable `NAME`;
//! * anything else: answer at once with the same bytes.
#![deny(unsafe_code)]

use urom_core::plugin::{Command, Notifier, Plugin};
use urom_core::wire::Status;

/// The version this plugin reports.
pub const VERSION: u64 = 0x0f;

/// A command held back for `progress`.
struct Deferred {
    dest_id: u64,
    plugin: u64,
    urom_context: u64,
}

/// The plugin's state.
#[derive(Default)]
pub struct Faulty {
    deferred: Vec<Deferred>,
    panic_in_progress: bool,
}

impl Plugin for Faulty {
    const VERSION: u64 = VERSION;

    fn open() -> Result<Self, Status> {
        Ok(Self::default())
    }

    fn address(&self) -> &[u8] {
        b"faulty-address"
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
            other => match other.strip_prefix(b"env:") {
                Some(name) => {
                    let name = std::str::from_utf8(name).map_err(|_| Status::InvalidValue)?;
                    let value = std::env::var(name).map_err(|_| Status::NotFound)?;
                    out.reply(command, Status::Success, value.as_bytes())
                }
                None => out.reply(command, Status::Success, other),
            },
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

urom_core::export_plugin!(Faulty);
