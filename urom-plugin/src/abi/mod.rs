//! The plugin ABI: C types binary compatible with the public DOCA UROM plugin interface
//! (`doca_urom_plugin.h`), the loader that opens plugin libraries, and the entry points the
//! Rust SDK exports.
//!
//! `plugins/include/` declares the same types for C plugin authors under DOCA's header names
//! (`doca_urom_plugin.h`, `doca_error.h`, `doca_compat.h`, `doca_log.h`); the layout
//! assertions below and the layout test that compiles the header (`tests/abi_layout.rs`) keep
//! the two in step.
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

use urom_wire::Status;

mod domain;
#[doc(hidden)]
pub mod export;
mod list;
mod loader;

pub use loader::{Handled, LoadedPlugin, NotificationSink, PluginLibrary, PluginLoadError};

/// The interface version word of plugins built against urom's headers or with the Rust SDK:
/// what `DOCA_STRUCT_CTOR` in `plugins/include/doca_compat.h` stores and what the SDK exports.
pub const PLUGIN_IFACE_VERSION: usize = 1;

/// The DOCA release series (major, minor) whose plugin interface has exactly the layout of
/// [`PluginIface`] and [`WorkerCtx`]: a `size_t` version word and six operations, then the
/// domain lookups with a 3-argument `addr_lookup` and 5-argument `memh_lookup` and
/// `mkey_lookup`.
///
/// The list comes from the public sources: the DOCA 3.0.0058 headers (`doca_urom_plugin.h`,
/// `doca_compat.h`, `doca_version.h`) have this layout; the plugins NVIDIA publishes with each
/// release from 2.9.0072 to 3.3.0 (NVIDIA-DOCA/doca-samples: `worker_rdmo` throughout,
/// `worker_graph` and `worker_sandbox` from 3.2.2) are written against it, as is UCC's DOCA
/// UROM plugin, which calls all four lookups with these signatures. Earlier and later
/// releases are refused: no public source pins their layout.
pub const DOCA_RELEASES: &[(u8, u8)] = &[(2, 9), (2, 10), (3, 0), (3, 1), (3, 2), (3, 3)];

/// What an interface version word says about the headers a plugin was built with.
///
/// A plugin built with DOCA's own headers stores `DOCA_VERSION_EXACT` of its SDK, built as
/// `major << 24 | minor << 16 | patch` (the patch being the four digits after the minor in
/// the version string: `3.0.0058` is `0x0300003a`, `3.1.0105` is `0x03010069`, `3.2.1025` is
/// `0x03020401`). A plugin built against urom's headers or with the Rust SDK stores
/// [`PLUGIN_IFACE_VERSION`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IfaceVersion {
    /// [`PLUGIN_IFACE_VERSION`]: urom's headers or the Rust SDK.
    Urom,
    /// `DOCA_VERSION_EXACT` of a release in [`DOCA_RELEASES`].
    Doca {
        /// Major version.
        major: u8,
        /// Minor version.
        minor: u8,
        /// Patch (build) number.
        patch: u16,
    },
}

impl IfaceVersion {
    /// The version of an accepted word; `None` for a word this worker refuses.
    pub fn from_word(word: usize) -> Option<Self> {
        if word == PLUGIN_IFACE_VERSION {
            return Some(Self::Urom);
        }
        let word = u32::try_from(word).ok()?;
        let [major, minor, patch_hi, patch_lo] = word.to_be_bytes();
        DOCA_RELEASES
            .contains(&(major, minor))
            .then_some(Self::Doca {
                major,
                minor,
                patch: u16::from_be_bytes([patch_hi, patch_lo]),
            })
    }

    /// The word this version is stored as.
    pub fn word(self) -> usize {
        match self {
            Self::Urom => PLUGIN_IFACE_VERSION,
            Self::Doca {
                major,
                minor,
                patch,
            } => (usize::from(major) << 24) | (usize::from(minor) << 16) | usize::from(patch),
        }
    }
}

impl core::fmt::Display for IfaceVersion {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Urom => write!(f, "urom interface {PLUGIN_IFACE_VERSION}"),
            Self::Doca {
                major,
                minor,
                patch,
            } => write!(f, "DOCA {major}.{minor}.{patch:04}"),
        }
    }
}

/// `doca_error_t`: a [`urom_wire::Status`] code.
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
    unsafe extern "C" fn(ctx: *mut WorkerCtx, addr: *mut c_void, addr_len: *mut usize) -> DocaError;
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
    /// `__doca_api_version`: the interface version word, set by `DOCA_STRUCT_CTOR` (see
    /// [`IfaceVersion`]).
    pub doca_api_version: usize,
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

/// `addr_lookup`: the plugin address of domain member `domain_id` (bytes that carry their
/// own length, such as a UCP worker address).
pub type AddrLookupFn =
    unsafe extern "C" fn(ctx: *mut WorkerCtx, domain_id: u64, addr: *mut *mut c_void) -> DocaError;
/// `seg_lookup`: the index of the buffer of domain member `domain_id` that holds `va`.
pub type SegLookupFn =
    unsafe extern "C" fn(ctx: *mut WorkerCtx, domain_id: u64, va: u64, seg: *mut i32) -> DocaError;
/// `memh_lookup`: the packed memory handle of buffer `seg` of domain member `domain_id`.
pub type MemhLookupFn = unsafe extern "C" fn(
    ctx: *mut WorkerCtx,
    domain_id: u64,
    seg: i32,
    len: *mut usize,
    memh: *mut *mut c_void,
) -> DocaError;
/// `mkey_lookup`: the packed remote key of buffer `seg` of domain member `domain_id`.
pub type MkeyLookupFn = unsafe extern "C" fn(
    ctx: *mut WorkerCtx,
    domain_id: u64,
    seg: i32,
    len: *mut usize,
    rkey: *mut *mut c_void,
) -> DocaError;

/// `struct urom_domain_lookups_iface`: how a plugin finds the other members of its host's
/// domain. The worker fills it in; C plugins call it through the
/// `doca_urom_worker_domain_*_lookup` helpers of `doca_urom_plugin.h`.
///
/// Each lookup returns `DOCA_ERROR_INVALID_VALUE` for a null context or output pointer and
/// `DOCA_ERROR_NOT_FOUND` for a domain id or segment the worker does not know; on failure it
/// clears the outputs (null pointers, zero lengths, segment -1).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DomainLookupsIface {
    /// `addr_lookup`.
    pub addr_lookup: Option<AddrLookupFn>,
    /// `seg_lookup`.
    pub seg_lookup: Option<SegLookupFn>,
    /// `memh_lookup`.
    pub memh_lookup: Option<MemhLookupFn>,
    /// `mkey_lookup`.
    pub mkey_lookup: Option<MkeyLookupFn>,
}

/// `struct urom_worker_ctx`: what a plugin instance receives from the worker.
#[repr(C)]
#[derive(Debug)]
pub struct WorkerCtx {
    /// `iface`: the plugin's own interface.
    pub iface: PluginIface,
    /// `domain_iface`: the domain lookups.
    pub domain_iface: DomainLookupsIface,
    /// `plugin_ctx`: the plugin's state, set by `open`.
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
pub const PLUGIN_NAME_MAX_LEN: usize = urom_wire::control::PLUGIN_NAME_MAX_LEN;

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
/// The version of [`NativeIface`] this build speaks: 3 added `command_reply`, 2 added `arm`;
/// version 2 ends after `arm`, version 1 after `progress`.
///
/// The worker asks for a version: it stores the highest it speaks in the `version` word before
/// calling `urom_plugin_get_native_iface`, and the plugin writes an interface of at most that
/// version (stating which in the same word). A plugin built for version 1 ignores the request
/// and writes version 1; a worker built for version 1 leaves the word 0, and a newer plugin
/// then writes version 1 only. So either side may be older.
pub const NATIVE_IFACE_VERSION: u64 = 3;

/// The most wake-up descriptors one plugin may give its worker ([`NativeArmFn`]).
pub const NATIVE_MAX_WAKE_FDS: usize = 4;

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
/// Room the worker lends a plugin, with one command, for that command's answer: the plugin
/// writes the answer's payload to `buf` and sets `len`, `status` and `replied`, instead of
/// handing a notification to the sink. The worker then puts the headers in front of the
/// payload where it lies, so that a command answered at once costs no call back into the worker.
#[repr(C)]
#[derive(Debug)]
pub struct NativeReply {
    /// Where the answer's payload goes: `capacity` writable bytes, lent for the call.
    pub buf: *mut u8,
    /// How many bytes `buf` holds.
    pub capacity: usize,
    /// The payload's length, once answered.
    pub len: usize,
    /// The answer's status, once answered.
    pub status: DocaError,
    /// Non-zero once the plugin answered here (at most once per command).
    pub replied: u32,
}

/// [`NativeCommandFn`] with room for the command's answer (version 3). The return value means
/// the same: an error when the plugin did not take the command.
pub type NativeCommandReplyFn = unsafe extern "C" fn(
    ctx: *mut WorkerCtx,
    dest_id: u64,
    cmd: *const WorkerCmd,
    payload: *const u8,
    reply: *mut NativeReply,
    sink: *const NotifySink,
) -> DocaError;
/// Advances asynchronous work, delivering notifications to `sink`; `DOCA_ERROR_EMPTY` when
/// there was nothing to do.
pub type NativeProgressFn =
    unsafe extern "C" fn(ctx: *mut WorkerCtx, sink: *const NotifySink) -> DocaError;

/// Readies the plugin to wake its sleeping worker: writes at most `capacity` descriptors to
/// `fds` and their number to `*count`, each to become readable (`POLLIN`) when the plugin has
/// work again, and open until the worker's next call into the plugin.
///
/// Returns `DOCA_SUCCESS` when the worker may sleep on them (none: only commands bring the
/// plugin work); `DOCA_ERROR_AGAIN` when work waits already (UCX's `ucp_worker_arm` answered
/// `UCS_ERR_BUSY`): progress instead of sleeping; `DOCA_ERROR_NOT_SUPPORTED` when the plugin
/// cannot wake its worker, which then naps briefly and polls again. `DOCA_SUCCESS` promises
/// that anything arriving afterwards makes a descriptor readable: the worker may sleep on
/// them for seconds (see [`crate::sdk::Plugin::arm`]).
pub type NativeArmFn = unsafe extern "C" fn(
    ctx: *mut WorkerCtx,
    fds: *mut core::ffi::c_int,
    capacity: usize,
    count: *mut usize,
) -> DocaError;

/// The native fast path a Rust SDK plugin exports beside the DOCA interface.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NativeIface {
    /// The version this interface has (at most the one the worker asked for; see
    /// [`NATIVE_IFACE_VERSION`]).
    pub version: u64,
    /// Handles one command.
    pub command: Option<NativeCommandFn>,
    /// Advances asynchronous work.
    pub progress: Option<NativeProgressFn>,
    /// Version 2: readies the plugin to wake its worker; `None` when it cannot.
    pub arm: Option<NativeArmFn>,
    /// Version 3: handles one command with room for its answer.
    pub command_reply: Option<NativeCommandReplyFn>,
}

/// Version 2 of [`NativeIface`]: what a plugin writes for a worker that asks for version 2.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct NativeIfaceV2 {
    pub(crate) version: u64,
    pub(crate) command: Option<NativeCommandFn>,
    pub(crate) progress: Option<NativeProgressFn>,
    pub(crate) arm: Option<NativeArmFn>,
}

/// Version 1 of [`NativeIface`]: what a plugin writes for a worker that asks for no newer one.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct NativeIfaceV1 {
    pub(crate) version: u64,
    pub(crate) command: Option<NativeCommandFn>,
    pub(crate) progress: Option<NativeProgressFn>,
}

/// `urom_plugin_get_native_iface`.
pub type GetNativeIfaceFn = unsafe extern "C" fn(iface: *mut NativeIface) -> DocaError;

/// The optional symbol through which a urom worker hands an SDK plugin [`NativeDomainIface`].
pub const SET_NATIVE_DOMAIN_SYMBOL: &str = "urom_plugin_set_native_domain";
/// The version of [`NativeDomainIface`] this build speaks: 2 added `self_lookup` and
/// `host_memory_lookup`; version 1 ends after `addr_lookup`.
pub const NATIVE_DOMAIN_VERSION: u64 = 2;

/// `addr_lookup` with the address's length: the plugin address of domain member `domain_id`
/// and its length in bytes. Errors as [`AddrLookupFn`]'s.
pub type NativeAddrLookupFn = unsafe extern "C" fn(
    ctx: *mut WorkerCtx,
    domain_id: u64,
    addr: *mut *const u8,
    len: *mut usize,
) -> DocaError;

/// `self_lookup`: the domain id of the plugin's own worker in the current table (the member
/// whose address for this plugin is the one the plugin gave), written to `domain_id`.
/// `DOCA_ERROR_NOT_FOUND` when there is no table or the plugin gave no address that names a
/// member; `DOCA_ERROR_INVALID_VALUE` for a null argument.
pub type NativeSelfLookupFn =
    unsafe extern "C" fn(ctx: *mut WorkerCtx, domain_id: *mut u64) -> DocaError;

/// `host_memory_lookup`: the address of the memory worker of member `domain_id`'s host (the
/// UCP worker through which peers reach that host's buffers), and its length.
/// `DOCA_ERROR_NOT_FOUND` for an unknown id or a host that gave none.
pub type NativeHostMemoryLookupFn = unsafe extern "C" fn(
    ctx: *mut WorkerCtx,
    domain_id: u64,
    addr: *mut *const u8,
    len: *mut usize,
) -> DocaError;

/// What a urom worker offers SDK plugins beside the DOCA domain lookups: the address lookup
/// with a length (DOCA's `addr_lookup` has none, as UCX addresses carry their own), so that
/// the SDK can hand plugins the address as a byte slice; and (version 2) which member the
/// plugin's worker is and where its members' hosts' memory is reached.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NativeDomainIface {
    /// [`NATIVE_DOMAIN_VERSION`].
    pub version: u64,
    /// The address lookup with a length.
    pub addr_lookup: Option<NativeAddrLookupFn>,
    /// Version 2: the worker's own domain id.
    pub self_lookup: Option<NativeSelfLookupFn>,
    /// Version 2: a member's host's memory worker address.
    pub host_memory_lookup: Option<NativeHostMemoryLookupFn>,
}

/// `urom_plugin_set_native_domain`: called by a urom worker right after `open` succeeded, with
/// the plugin's context and the worker's [`NativeDomainIface`], valid until `close`.
pub type SetNativeDomainFn =
    unsafe extern "C" fn(ctx: *mut WorkerCtx, iface: *const NativeDomainIface) -> DocaError;

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
///
/// Inlined: it wraps every call across the plugin ABI, commands included, and costs nothing
/// but the call to `body` while nothing panics.
#[inline(always)]
pub(crate) fn guard(entry: &str, body: impl FnOnce() -> Status) -> DocaError {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(status) => status.raw(),
        Err(panic) => caught(entry, panic),
    }
}

/// Reports a panic [`guard`] caught.
#[cold]
#[inline(never)]
fn caught(entry: &str, panic: Box<dyn core::any::Any + Send>) -> DocaError {
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
    assert!(offset_of!(PluginIface, doca_api_version) == 0);
    assert!(offset_of!(PluginIface, open) == 8);
    assert!(offset_of!(PluginIface, notif_pack) == 48);
    assert!(size_of::<DomainLookupsIface>() == 32);
    assert!(offset_of!(DomainLookupsIface, mkey_lookup) == 24);
    assert!(size_of::<WorkerCtx>() == 96);
    assert!(offset_of!(WorkerCtx, domain_iface) == 56);
    assert!(offset_of!(WorkerCtx, plugin_ctx) == 88);
    assert!(size_of::<ServicePluginInfo>() == 64);
    assert!(size_of::<NativeIface>() == 40);
    assert!(size_of::<NativeIfaceV2>() == 32);
    assert!(size_of::<NativeIfaceV1>() == 24);
    assert!(offset_of!(NativeIface, progress) == offset_of!(NativeIfaceV1, progress));
    assert!(offset_of!(NativeIface, arm) == offset_of!(NativeIfaceV2, arm));
    assert!(offset_of!(NativeIface, command_reply) == 32);
    assert!(size_of::<NativeReply>() == 32);
    assert!(size_of::<NativeDomainIface>() == 32);
    // The command's wire header is this struct, little-endian (a notification's drops `len`).
    assert!(size_of::<WorkerCmd>() == urom_wire::data::CMD_HEADER_LEN);
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_words_of_accepted_doca_releases_decode() {
        let cases = [
            (0x0300_003a, (3, 0, 58), "DOCA 3.0.0058"),
            (0x0301_0069, (3, 1, 105), "DOCA 3.1.0105"),
            (0x0302_0401, (3, 2, 1025), "DOCA 3.2.1025"),
            (0x0209_0048, (2, 9, 72), "DOCA 2.9.0072"),
            (0x020a_0057, (2, 10, 87), "DOCA 2.10.0087"),
            (0x0303_0000, (3, 3, 0), "DOCA 3.3.0000"),
        ];
        for (word, (major, minor, patch), text) in cases {
            let version = IfaceVersion::from_word(word).expect("accepted");
            assert_eq!(
                version,
                IfaceVersion::Doca {
                    major,
                    minor,
                    patch
                }
            );
            assert_eq!(version.word(), word);
            assert_eq!(version.to_string(), text);
        }
        let ours = IfaceVersion::from_word(PLUGIN_IFACE_VERSION).unwrap();
        assert_eq!(ours, IfaceVersion::Urom);
        assert_eq!(ours.word(), 1);
        assert_eq!(ours.to_string(), "urom interface 1");
    }

    #[test]
    fn every_accepted_release_decodes_and_nothing_else_does() {
        for &(major, minor) in DOCA_RELEASES {
            for patch in [0u16, 1, 58, 9999, u16::MAX] {
                let word =
                    (usize::from(major) << 24) | (usize::from(minor) << 16) | usize::from(patch);
                assert_eq!(
                    IfaceVersion::from_word(word),
                    Some(IfaceVersion::Doca {
                        major,
                        minor,
                        patch
                    })
                );
            }
        }
        for word in [
            0,
            2,
            7,
            0x0208_0055, // 2.8
            0x0207_0055, // 2.7
            0x0304_0000, // 3.4
            0x0400_0000,
            0x1_0300_003a,
            usize::MAX,
        ] {
            assert_eq!(IfaceVersion::from_word(word), None, "{word:#x}");
        }
    }
}
