//! The plugin ABI: C types binary compatible with the public DOCA UROM plugin interface
//! (`doca_urom_plugin.h`), the loader that opens plugin libraries, and the entry points the
//! Rust SDK exports.
//!
//! `plugins/include/urom_plugin.h` declares the same types for C plugin authors; the layout
//! assertions below and the C plugin test keep the two in step.
//!
//! Ownership across the boundary follows the DOCA contract: the worker `malloc`s each command
//! descriptor and the plugin `free`s it; the plugin `malloc`s each notification descriptor and
//! the worker `free`s it. Rust plugins built with the SDK also export a native interface
//! ([`NativeIface`]) through which the worker hands commands and takes notifications without
//! any allocation.
#![allow(unsafe_code)]

use core::ffi::{c_char, c_void};
use core::mem::offset_of;
use std::io::Write;
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::wire::Status;

#[doc(hidden)]
pub mod export;
mod list;
mod loader;

pub use loader::{LoadedPlugin, NotificationSink, PluginLibrary, PluginLoadError};

/// The version word of [`PluginIface`] this build loads and exports.
pub const PLUGIN_IFACE_VERSION: usize = 1;

/// `doca_error_t`: a [`crate::wire::Status`] code.
pub type DocaError = i32;

/// `ucs_list_link_t`: a link of an intrusive, circular, doubly linked list.
///
/// A list head is a link whose `prev` and `next` point at itself when the list is empty.
#[repr(C)]
#[derive(Debug)]
pub struct ListLink {
    /// The previous link (the last element, for a head).
    pub prev: *mut ListLink,
    /// The next link (the first element, for a head).
    pub next: *mut ListLink,
}

/// `struct urom_worker_cmd`: a command header, followed in memory by `len` bytes of plugin
/// command (`plugin_cmd[]`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct WorkerCmd {
    /// `type`: the id of the plugin the command is for.
    pub plugin: u64,
    /// `urom_context`: the host's cookie, returned in the notification.
    pub urom_context: u64,
    /// `len`: bytes of plugin command that follow.
    pub len: u64,
}

/// `struct urom_worker_notify`: a notification header, followed in memory by `len` bytes of
/// plugin notification (`plugin_notif[]`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct WorkerNotify {
    /// `type`: the id of the plugin the notification is from.
    pub plugin: u64,
    /// `urom_context`: the cookie of the command this answers.
    pub urom_context: u64,
    /// `len`: bytes of plugin notification that follow.
    pub len: u64,
    /// `status`: a `doca_error_t`.
    pub status: DocaError,
    /// Padding; zero.
    pub reserved: u32,
}

/// `struct urom_worker_cmd_desc`: a command on its way to a plugin.
#[repr(C)]
#[derive(Debug)]
pub struct WorkerCmdDesc {
    /// `entry`: the list link.
    pub entry: ListLink,
    /// `dest_id`: the host connection the command came from; notifications answering it carry
    /// the same value.
    pub dest_id: u64,
    /// `worker_cmd`: the command, followed by its payload.
    pub worker_cmd: WorkerCmd,
}

/// `struct urom_worker_notif_desc`: a notification on its way back to a host.
#[repr(C)]
#[derive(Debug)]
pub struct WorkerNotifDesc {
    /// `entry`: the list link.
    pub entry: ListLink,
    /// `dest_id`: the host connection to send it to.
    pub dest_id: u64,
    /// `worker_notif`: the notification, followed by its payload.
    pub worker_notif: WorkerNotify,
}

/// `open`: creates the plugin's state for this worker and stores it in `ctx->plugin_ctx`.
pub type OpenFn = unsafe extern "C" fn(ctx: *mut WorkerCtx) -> DocaError;
/// `close`: releases what `open` created.
pub type CloseFn = unsafe extern "C" fn(ctx: *mut WorkerCtx);
/// `addr`: copies the plugin's endpoint address into `addr` when `*addr_len` is large enough;
/// otherwise stores the needed length in `*addr_len` and returns `DOCA_ERROR_INVALID_VALUE`.
pub type AddrFn =
    unsafe extern "C" fn(ctx: *mut WorkerCtx, addr: *mut c_void, addr_len: *mut u64) -> DocaError;
/// `worker_cmd`: takes the command descriptors off `cmd_list` and handles them.
pub type WorkerCmdFn =
    unsafe extern "C" fn(ctx: *mut WorkerCtx, cmd_list: *mut ListLink) -> DocaError;
/// `progress`: advances asynchronous work and appends finished notification descriptors to
/// `notif_list`; returns `DOCA_ERROR_EMPTY` when it had nothing to do.
pub type ProgressFn =
    unsafe extern "C" fn(ctx: *mut WorkerCtx, notif_list: *mut ListLink) -> DocaError;
/// `notif_pack`: serializes a notification (header and payload) into `packed_notif`, whose
/// capacity is `*packed_notif_len` on entry; stores the packed length there on return.
pub type NotifPackFn = unsafe extern "C" fn(
    notif: *mut WorkerNotify,
    packed_notif_len: *mut usize,
    packed_notif: *mut c_void,
) -> DocaError;

/// `struct urom_plugin_iface`: the operations a plugin implements.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PluginIface {
    /// The interface version word (`UROM_PLUGIN_IFACE_VERSION` for plugins built against
    /// our header).
    pub version: usize,
    /// `open`.
    pub open: Option<OpenFn>,
    /// `close`.
    pub close: Option<CloseFn>,
    /// `addr`.
    pub addr: Option<AddrFn>,
    /// `worker_cmd`.
    pub worker_cmd: Option<WorkerCmdFn>,
    /// `progress`.
    pub progress: Option<ProgressFn>,
    /// `notif_pack`.
    pub notif_pack: Option<NotifPackFn>,
}

/// `addr_lookup`: the address of a domain peer worker.
pub type AddrLookupFn = unsafe extern "C" fn(
    ctx: *mut WorkerCtx,
    domain_id: u64,
    addr: *mut *mut c_void,
    addr_len: *mut u64,
) -> DocaError;
/// `seg_lookup`: which registered segment of a domain peer holds the address `va`.
pub type SegLookupFn =
    unsafe extern "C" fn(ctx: *mut WorkerCtx, domain_id: u64, va: u64, seg: *mut i32) -> DocaError;
/// `memh_lookup`: the packed memory handle of a domain peer's segment.
pub type MemhLookupFn = unsafe extern "C" fn(
    ctx: *mut WorkerCtx,
    domain_id: u64,
    seg: i32,
    memh_len: *mut usize,
    memh: *mut *mut c_void,
) -> DocaError;
/// `mkey_lookup`: the remote key of a domain peer's segment.
pub type MkeyLookupFn = unsafe extern "C" fn(
    ctx: *mut WorkerCtx,
    domain_id: u64,
    seg: i32,
    rkey: *mut *mut c_void,
) -> DocaError;

/// `struct urom_worker_ctx`: what a plugin instance receives from the worker.
#[repr(C)]
#[derive(Debug)]
pub struct WorkerCtx {
    /// The plugin's own interface.
    pub iface: PluginIface,
    /// Domain peer address lookup.
    pub addr_lookup: Option<AddrLookupFn>,
    /// Domain segment lookup.
    pub seg_lookup: Option<SegLookupFn>,
    /// Domain memory handle lookup.
    pub memh_lookup: Option<MemhLookupFn>,
    /// Domain remote key lookup.
    pub mkey_lookup: Option<MkeyLookupFn>,
    /// The plugin's state, set by `open`.
    pub plugin_ctx: *mut c_void,
}

/// `struct doca_urom_service_plugin_info`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ServicePluginInfo {
    /// The plugin id.
    pub id: u64,
    /// The plugin version.
    pub version: u64,
    /// The `.so` file name without `.so`, NUL-terminated.
    pub plugin_name: [c_char; PLUGIN_NAME_MAX_LEN],
}

/// `DOCA_UROM_PLUGIN_NAME_MAX_LEN`.
pub const PLUGIN_NAME_MAX_LEN: usize = crate::wire::control::PLUGIN_NAME_MAX_LEN;

/// `urom_plugin_get_version`.
pub type GetVersionFn = unsafe extern "C" fn(version: *mut u64) -> DocaError;
/// `urom_plugin_get_iface`.
pub type GetIfaceFn = unsafe extern "C" fn(iface: *mut PluginIface) -> DocaError;

/// The symbol every plugin exports for its version.
pub const GET_VERSION_SYMBOL: &str = "urom_plugin_get_version";
/// The symbol every plugin exports for its interface.
pub const GET_IFACE_SYMBOL: &str = "urom_plugin_get_iface";
/// The extra symbol of plugins that offer the native fast path.
pub const GET_NATIVE_IFACE_SYMBOL: &str = "urom_plugin_get_native_iface";
/// The version of [`NativeIface`] this build speaks.
pub const NATIVE_IFACE_VERSION: u64 = 1;

/// The worker's side of the native fast path: where a plugin delivers notifications.
///
/// `notify` copies `len` payload bytes into the send ring of host connection `dest_id`; it
/// returns `DOCA_SUCCESS`, or an error when the connection is gone or full.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NotifySink {
    /// The worker's state for `notify`.
    pub ctx: *mut c_void,
    /// Delivers one notification.
    pub notify: unsafe extern "C" fn(
        ctx: *mut c_void,
        dest_id: u64,
        header: *const WorkerNotify,
        payload: *const u8,
    ) -> DocaError,
}

/// Handles one command whose payload the worker lends for the duration of the call.
pub type NativeCommandFn = unsafe extern "C" fn(
    ctx: *mut WorkerCtx,
    dest_id: u64,
    cmd: *const WorkerCmd,
    payload: *const u8,
    sink: *const NotifySink,
) -> DocaError;
/// Advances asynchronous work, delivering notifications to `sink`; `DOCA_ERROR_EMPTY` when
/// there was nothing to do.
pub type NativeProgressFn =
    unsafe extern "C" fn(ctx: *mut WorkerCtx, sink: *const NotifySink) -> DocaError;

/// The native fast path a Rust SDK plugin exports beside the DOCA interface.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NativeIface {
    /// [`NATIVE_IFACE_VERSION`].
    pub version: u64,
    /// Handles one command.
    pub command: Option<NativeCommandFn>,
    /// Advances asynchronous work.
    pub progress: Option<NativeProgressFn>,
}

/// `urom_plugin_get_native_iface`.
pub type GetNativeIfaceFn = unsafe extern "C" fn(iface: *mut NativeIface) -> DocaError;

/// `len` bytes at `ptr`, lent across the interface for one call: empty when `len` is 0,
/// whatever `ptr` is; `None` for a null pointer with a non-zero length.
///
/// # Safety
/// When `len > 0` and `ptr` is not null, `ptr` points to `len` readable bytes that stay valid
/// and unchanged for `'a`.
pub(crate) unsafe fn lent_bytes<'a>(ptr: *const u8, len: u64) -> Option<&'a [u8]> {
    if len == 0 {
        return Some(&[]);
    }
    if ptr.is_null() {
        return None;
    }
    // SAFETY: non-null with `len` readable bytes for `'a` (caller).
    Some(unsafe { core::slice::from_raw_parts(ptr, len as usize) })
}

/// Runs `body`; a panic becomes `DOCA_ERROR_UNEXPECTED` and a line on stderr.
pub(crate) fn guard(entry: &str, body: impl FnOnce() -> Status) -> DocaError {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(status) => status.raw(),
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
                .unwrap_or("(no message)");
            let _ = writeln!(
                std::io::stderr(),
                "urom plugin: panic in {entry}: {message}; returning {}",
                Status::Unexpected
            );
            Status::Unexpected.raw()
        }
    }
}

const _: () = {
    assert!(size_of::<ListLink>() == 16);
    assert!(size_of::<WorkerCmd>() == 24);
    assert!(offset_of!(WorkerCmd, len) == 16);
    assert!(size_of::<WorkerNotify>() == 32);
    assert!(offset_of!(WorkerNotify, status) == 24);
    assert!(size_of::<WorkerCmdDesc>() == 48);
    assert!(offset_of!(WorkerCmdDesc, dest_id) == 16);
    assert!(offset_of!(WorkerCmdDesc, worker_cmd) == 24);
    assert!(size_of::<WorkerNotifDesc>() == 56);
    assert!(offset_of!(WorkerNotifDesc, worker_notif) == 24);
    assert!(size_of::<PluginIface>() == 56);
    assert!(offset_of!(PluginIface, open) == 8);
    assert!(offset_of!(PluginIface, notif_pack) == 48);
    assert!(size_of::<WorkerCtx>() == 96);
    assert!(offset_of!(WorkerCtx, addr_lookup) == 56);
    assert!(offset_of!(WorkerCtx, mkey_lookup) == 80);
    assert!(offset_of!(WorkerCtx, plugin_ctx) == 88);
    assert!(size_of::<ServicePluginInfo>() == 64);
    assert!(size_of::<NativeIface>() == 24);
    // The wire headers are these structs, little-endian.
    assert!(size_of::<WorkerCmd>() == crate::wire::data::CMD_HEADER_LEN);
    assert!(size_of::<WorkerNotify>() == crate::wire::data::NOTIFY_HEADER_LEN);
};
