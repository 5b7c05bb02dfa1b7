//! The sandbox plugin: the DOCA UROM sample that offloads UCX tagged send and receive to
//! workers, the engine of the ping-pong sample. Written with the urom plugin SDK.
//!
//! Built as `libworker_sandbox.so`; installed in a plugin directory as `worker_sandbox.so`, the
//! daemon reports it as `worker_sandbox`. Its messages (`urom_sandbox_wire`, bytes in
//! `urom_sandbox_wire`) are the DOCA sample's:
//!
//! * `TAG_SEND` sends bytes to the worker with domain id `dest`, found by the domain's
//!   `addr_lookup` (this plugin's `addr` is its UCP worker's address); one endpoint per domain
//!   id, kept while the id's address stays the same;
//! * `TAG_RECV` receives a message whose tag matches under a mask, UCX's way;
//! * bytes travel inline (in the command and the notification) or, when `memh_id` is not 0,
//!   from and to the host's memory: the plugin looks up its own member's segment holding the
//!   address (both ends of the range), its remote key and its host's memory worker, and copies
//!   with UCX RMA (`ucp_get_nbx` before a send, `ucp_put_nbx` and a flush after a receive),
//!   never waiting: the copy advances with the plugin's progress, so a host slow to progress
//!   its memory worker delays only its own commands, never the worker;
//! * `MEM_MAP` maps the host memory an exported memory handle describes (`ucp_mem_map` with
//!   `exported_memh_buffer`) and answers with a `memh_id` (2, 3, ...; sends and receives with
//!   any non-zero `memh_id` reach the host's memory through the domain's keys). It works where
//!   UCX can import memory handles (`urom_plugin::ucx::exported_memh_supported`: UCX
//!   1.15 or later and a transport that exports, mlx5 with cross-function memory keys; only there
//!   does the plugin's UCP context ask for `UCP_FEATURE_EXPORTED_MEMH`, which elsewhere makes
//!   every endpoint unreachable). Elsewhere (UCX 1.13 and 1.14, every machine without mlx5),
//!   and for a `MEM_MAP` without a handle, it answers `DOCA_ERROR_NOT_SUPPORTED` and logs why.
//!
//! Commands come in both layouts of the DOCA sample's C struct, whose union holds UCX's
//! `ucp_mem_map_params_t`: 64 bytes as compiled against UCX 1.13, 72 against 1.14 and later
//! (NVIDIA's sandbox host built against DOCA's UCX sends those). The plugin tells them apart by
//! the command's length (`urom_sandbox_wire`), so hosts built against any UCX are understood.
//!
//! Errors as DOCA's plugin maps them: a command of neither layout's length or an unknown type
//! is `DOCA_ERROR_INVALID_VALUE` (the worker's log names the length each layout calls for), a
//! failed UCX call `DOCA_ERROR_DRIVER` (a send or receive that
//! UCX ends with an error is notified with `DOCA_ERROR_DRIVER` and UCX's status), a lookup's
//! error is passed on (`DOCA_ERROR_NOT_FOUND` for an unknown domain id or an address in no
//! buffer). Sends and receives complete from the plugin's progress. The plugin gives its
//! worker the UCP worker's event descriptor to sleep on (`Plugin::arm`, `ucp_worker_arm`), so
//! that a message arriving wakes a sleeping worker at once.
//!
//! Timestamps: when the worker's environment has `UROM_SANDBOX_TIMESTAMPS=DIR` (a host sets it
//! with `Worker::set_env`; the daemon passes it on), the plugin records the monotonic clock
//! (`CLOCK_MONOTONIC`, one clock for all processes of a machine) and the tag of every tagged
//! send it issues (right before `ucp_tag_send_nbx`; in the buffer variant before the fetch
//! from host memory that precedes it) and every tagged receive that completes (when its
//! progress takes the completion), into storage allocated when it opens (131,072 stamps; no
//! allocation or system call per message; stamps past that are counted as dropped). When it
//! closes (the worker's shutdown: `Worker::stop` or SIGTERM) it writes them to
//! `DIR/sandbox-PID.timestamps`. `urom_sandbox_wire::timestamps` reads such files and pairs
//! one worker's sends with another's receives: the time between workers without the hosts'
//! crossings (`benches/benches/sandbox.rs` reports it). A `DIR` that is not a directory keeps
//! the plugin from opening (a worker without another plugin then does not start; its log says
//! why). The messages themselves are unchanged.
//!
//! Without the `ucx` feature the plugin loads, has no address and answers every command
//! `DOCA_ERROR_NOT_SUPPORTED` (and records nothing).
#![deny(unsafe_code)]

use urom_plugin::{Arm, Command, Notifier, Plugin, WakeFds};
use urom_sandbox_wire::{NAME, VERSION};
use urom_wire::Status;

#[cfg(feature = "ucx")]
mod peer;

/// The name the daemon reports the plugin under.
pub const PLUGIN_NAME: &str = NAME;

/// The plugin's per-worker state.
pub struct Sandbox {
    #[cfg(feature = "ucx")]
    peer: peer::SandboxPeer,
}

impl Plugin for Sandbox {
    const VERSION: u64 = VERSION;

    fn open() -> Result<Self, Status> {
        Ok(Self {
            #[cfg(feature = "ucx")]
            peer: peer::SandboxPeer::open()?,
        })
    }

    fn close(&mut self) {
        #[cfg(feature = "ucx")]
        self.peer.close();
    }

    fn address(&self) -> &[u8] {
        #[cfg(feature = "ucx")]
        {
            self.peer.address()
        }
        #[cfg(not(feature = "ucx"))]
        {
            &[]
        }
    }

    fn command(&mut self, command: &Command<'_>, out: &mut Notifier<'_>) -> Result<(), Status> {
        #[cfg(feature = "ucx")]
        {
            self.peer.command(command, out)
        }
        #[cfg(not(feature = "ucx"))]
        {
            let _ = (command, out);
            Err(Status::NotSupported)
        }
    }

    fn progress(&mut self, out: &mut Notifier<'_>) -> Result<bool, Status> {
        #[cfg(feature = "ucx")]
        {
            self.peer.progress(out)
        }
        #[cfg(not(feature = "ucx"))]
        {
            let _ = out;
            Ok(false)
        }
    }

    fn arm(&mut self, wake: &mut WakeFds<'_>) -> Arm {
        #[cfg(feature = "ucx")]
        {
            self.peer.arm(wake)
        }
        #[cfg(not(feature = "ucx"))]
        {
            // Every command is answered at once: nothing to wake the worker for.
            let _ = wake;
            Arm::Armed
        }
    }
}

urom_plugin::export_plugin!(Sandbox);
