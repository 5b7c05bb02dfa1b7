//! The Rust plugin SDK: write a plugin as a safe Rust type, export it with
//! [`export_plugin!`](crate::export_plugin), build it as a `cdylib` (see the crate's example).
//!
//! The macro generates the DOCA UROM entry points (`urom_plugin_get_version`,
//! `urom_plugin_get_iface`), so the plugin loads in any worker that speaks that interface, plus
//! the native fast path (`urom_plugin_get_native_iface`) through which a urom worker hands
//! commands over and takes notifications back without allocating. A panic inside the plugin
//! is caught at the boundary and becomes `DOCA_ERROR_UNEXPECTED`; it never unwinds into the
//! worker.
//!
//! While it handles a command or progresses, a plugin reaches the other members of its
//! worker's domain through [`Notifier::domain`]: their plugin addresses and their hosts'
//! buffers, safely, as the DOCA domain lookups give them to C plugins.

pub use crate::abi::export::{Domain, Notifier, WakeFds};
pub use urom_wire::Status;

/// One command for the plugin.
#[derive(Debug, Clone, Copy)]
pub struct Command<'a> {
    /// The host connection it came from; a notification for it goes back there.
    pub dest_id: u64,
    /// The plugin's id, as the daemon assigned it.
    pub plugin: u64,
    /// The host's cookie; the notification carries it back.
    pub urom_context: u64,
    /// The plugin's command bytes.
    pub payload: &'a [u8],
}

/// A plugin, instantiated once per worker.
pub trait Plugin: Sized + 'static {
    /// The version `urom_plugin_get_version` reports; hosts check it against their side.
    const VERSION: u64;

    /// Creates the plugin's state (`open`). An error keeps the plugin out of the worker.
    fn open() -> Result<Self, Status>;

    /// Releases resources before the state is dropped (`close`).
    fn close(&mut self) {}

    /// The plugin's endpoint address (`addr`), for example a UCX worker address; empty when it
    /// has none.
    fn address(&self) -> &[u8] {
        &[]
    }

    /// Handles one command. It may answer at once through `out`, or remember the command and
    /// answer from [`Plugin::progress`]. An error makes the worker answer the command with that
    /// status; the plugin then must not answer it itself.
    fn command(&mut self, command: &Command<'_>, out: &mut Notifier<'_>) -> Result<(), Status>;

    /// Advances asynchronous work; returns whether there was any.
    fn progress(&mut self, out: &mut Notifier<'_>) -> Result<bool, Status> {
        let _ = out;
        Ok(false)
    }

    /// Readies the plugin to wake its worker, which is about to sleep: gives `wake` the
    /// descriptors that become readable when the plugin has work again (for UCX, the worker's
    /// event descriptor after `ucp_worker_arm` said `UCS_OK`), and says whether the worker may
    /// sleep at all ([`Arm`]). Called only after a [`Plugin::progress`] that found nothing to
    /// do, never on the busy path.
    ///
    /// It must leave no window: arm first, then look for work once more ([`Arm::Busy`] if
    /// any), so that whatever comes after it returned [`Arm::Armed`] makes a descriptor
    /// readable. The worker may sleep for seconds on them. For UCX that means progressing the
    /// UCP worker until `ucp_worker_progress` returns 0 before `ucp_worker_arm`, as
    /// `ucx::PeerWorker::arm` (feature `ucx`) does: UCX may hand an event to the arming call while
    /// the work it stands for needs more progress calls.
    ///
    /// The default, [`Arm::Unsupported`], makes the worker nap briefly and poll again, as it
    /// must for a plugin whose work can arrive without waking anything.
    fn arm(&mut self, wake: &mut WakeFds<'_>) -> Arm {
        let _ = wake;
        Arm::Unsupported
    }
}

/// Whether a plugin lets its worker sleep ([`Plugin::arm`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arm {
    /// Work waits already (UCX's `ucp_worker_arm` answered `UCS_ERR_BUSY`): progress again
    /// instead of sleeping.
    Busy,
    /// The descriptors given to [`WakeFds`] become readable when work arrives; with none, only
    /// the worker's commands bring the plugin work.
    Armed,
    /// The plugin cannot wake its worker: the worker naps briefly and polls again.
    Unsupported,
}

/// Exports a [`Plugin`] type through the plugin ABI: call it once in the plugin's `cdylib`.
#[macro_export]
macro_rules! export_plugin {
    ($plugin:ty) => {
        /// `urom_plugin_get_version` of the DOCA UROM plugin interface.
        ///
        /// # Safety
        /// `version` is null or points to a writable `u64`.
        #[allow(unsafe_code)]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn urom_plugin_get_version(version: *mut u64) -> i32 {
            // SAFETY: forwarded under this function's own contract.
            unsafe { $crate::abi::export::get_version::<$plugin>(version) }
        }

        /// `urom_plugin_get_iface` of the DOCA UROM plugin interface.
        ///
        /// # Safety
        /// `iface` is null or points to a writable `struct urom_plugin_iface`.
        #[allow(unsafe_code)]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn urom_plugin_get_iface(
            iface: *mut $crate::abi::PluginIface,
        ) -> i32 {
            // SAFETY: forwarded under this function's own contract.
            unsafe { $crate::abi::export::get_iface::<$plugin>(iface) }
        }

        /// The native domain lookups of urom workers.
        ///
        /// # Safety
        /// `ctx` is null or the context `open` succeeded on; `iface` is null or valid for
        /// reads.
        #[allow(unsafe_code)]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn urom_plugin_set_native_domain(
            ctx: *mut $crate::abi::WorkerCtx,
            iface: *const $crate::abi::NativeDomainIface,
        ) -> i32 {
            // SAFETY: forwarded under this function's own contract.
            unsafe { $crate::abi::export::set_native_domain::<$plugin>(ctx, iface) }
        }

        /// The native fast path of urom workers.
        ///
        /// # Safety
        /// `iface` is null or points to a writable `NativeIface`.
        #[allow(unsafe_code)]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn urom_plugin_get_native_iface(
            iface: *mut $crate::abi::NativeIface,
        ) -> i32 {
            // SAFETY: forwarded under this function's own contract.
            unsafe { $crate::abi::export::get_native_iface::<$plugin>(iface) }
        }
    };
}
