//! Opening plugin libraries and driving their interface: the one place urom calls `dlopen`.
//!
//! [`PluginLibrary::load`] checks the exported symbols, the version and the interface;
//! [`PluginLibrary::open`] creates the plugin's instance as a [`LoadedPlugin`], which the
//! worker feeds commands and polls for notifications. The instance cannot outlive the library:
//! it owns it, and closes the plugin before unloading it.

use core::ffi::c_void;
use core::ptr;
use std::fmt;
use std::path::{Path, PathBuf};

use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};

use std::sync::Arc;

use super::domain::{DomainSlot, LOOKUPS, NATIVE_DOMAIN, WorkerCtxExt};
use super::list::ListHead;
use super::{
    DOCA_RELEASES, DocaError, GET_IFACE_SYMBOL, GET_NATIVE_IFACE_SYMBOL, GET_VERSION_SYMBOL,
    GetIfaceFn, GetNativeIfaceFn, GetVersionFn, IfaceVersion, NATIVE_IFACE_VERSION,
    NATIVE_MAX_WAKE_FDS, NativeIface, NativeReply, NotifySink, PLUGIN_IFACE_VERSION, PluginIface,
    SET_NATIVE_DOMAIN_SYMBOL, SetNativeDomainFn, WorkerCmd, WorkerCmdDesc, WorkerCtx,
    WorkerNotifDesc, WorkerNotify, guard,
};
use crate::domain::DomainTable;
use crate::sdk::Arm;
use urom_transport::sys::WakeSet;
use urom_wire::data::{Notification, max_notify_payload};
use urom_wire::{MaxMsgSize, Status, data::Command};

/// Why a plugin library was not loaded.
#[derive(Debug)]
pub enum PluginLoadError {
    /// `dlopen` failed: not a shared object, missing dependencies, wrong architecture...
    Open {
        /// The library.
        path: PathBuf,
        /// What the dynamic loader said.
        reason: String,
    },
    /// A required symbol is not exported.
    MissingSymbol {
        /// The library.
        path: PathBuf,
        /// The symbol's name.
        symbol: &'static str,
    },
    /// `urom_plugin_get_version` or `urom_plugin_get_iface` returned an error.
    Call {
        /// The library.
        path: PathBuf,
        /// The function.
        symbol: &'static str,
        /// What it returned.
        status: Status,
    },
    /// The interface's version word is neither [`PLUGIN_IFACE_VERSION`] nor that of a DOCA
    /// release in [`DOCA_RELEASES`] (see [`IfaceVersion`]).
    UnsupportedInterface {
        /// The library.
        path: PathBuf,
        /// The version word the plugin reported.
        version: usize,
    },
    /// The interface lacks an operation.
    IncompleteInterface {
        /// The library.
        path: PathBuf,
        /// The missing operation.
        operation: &'static str,
    },
}

impl fmt::Display for PluginLoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Open { path, reason } => {
                write!(f, "cannot load plugin {}: {reason}", path.display())
            }
            Self::MissingSymbol { path, symbol } => write!(
                f,
                "{} is not a urom plugin: it does not export `{symbol}`",
                path.display()
            ),
            Self::Call {
                path,
                symbol,
                status,
            } => write!(
                f,
                "plugin {}: `{symbol}` failed with {status}",
                path.display()
            ),
            Self::UnsupportedInterface { path, version } => {
                write!(
                    f,
                    "plugin {} has interface version {version} ({version:#x}); this worker \
                     supports version {PLUGIN_IFACE_VERSION} (urom's headers) and plugins built \
                     with the headers of DOCA",
                    path.display()
                )?;
                for (i, (major, minor)) in DOCA_RELEASES.iter().enumerate() {
                    let separator = if i == 0 { " " } else { ", " };
                    write!(f, "{separator}{major}.{minor}")?;
                }
                Ok(())
            }
            Self::IncompleteInterface { path, operation } => write!(
                f,
                "plugin {}: its interface has no `{operation}` operation",
                path.display()
            ),
        }
    }
}

impl std::error::Error for PluginLoadError {}

/// Why a loaded plugin could not be opened.
#[derive(Debug)]
pub struct PluginOpenError {
    /// The library.
    pub path: PathBuf,
    /// What its `open` returned.
    pub status: Status,
}

impl fmt::Display for PluginOpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "plugin {}: `open` failed with {}",
            self.path.display(),
            self.status
        )
    }
}

impl std::error::Error for PluginOpenError {}

/// A plugin library that exports a valid interface.
pub struct PluginLibrary {
    path: PathBuf,
    version: u64,
    iface_version: IfaceVersion,
    iface: PluginIface,
    native: Option<NativeIface>,
    /// Where an SDK plugin takes the native domain lookups, when it exports it.
    set_native_domain: Option<SetNativeDomainFn>,
    // INVARIANTS: keeps the code `iface` and `native` point into mapped; it is never read, only
    // held, and it is the last field, so it is dropped after everything that may call into it.
    _library: Library,
}

impl fmt::Debug for PluginLibrary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PluginLibrary")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("iface_version", &self.iface_version)
            .field("native", &self.native.is_some())
            .finish()
    }
}

impl PluginLibrary {
    /// Loads the library at `path` and checks that it is a plugin: both symbols present, the
    /// version readable, an interface version word this worker accepts ([`IfaceVersion`]),
    /// every operation of the interface present.
    ///
    /// Loading runs the library's constructors in this process; the daemon therefore probes
    /// unknown plugins in a short-lived child process before anyone loads them for real.
    pub fn load(path: &Path) -> Result<Self, PluginLoadError> {
        // SAFETY: loading runs the library's initialisers; plugins are code the operator
        // installed for exactly this purpose (see the doc comment about probing).
        let library =
            unsafe { Library::open(Some(path), RTLD_NOW | RTLD_LOCAL) }.map_err(|error| {
                PluginLoadError::Open {
                    path: path.to_owned(),
                    reason: error_chain(&error),
                }
            })?;
        let get_version: GetVersionFn = symbol(&library, path, GET_VERSION_SYMBOL)?;
        let get_iface: GetIfaceFn = symbol(&library, path, GET_IFACE_SYMBOL)?;

        let mut version = 0u64;
        // SAFETY: the symbol has the ABI's signature; `version` is a writable u64.
        let status = guard_call(|| unsafe { get_version(&mut version) });
        check_call(path, GET_VERSION_SYMBOL, status)?;

        let mut iface = PluginIface::default();
        // SAFETY: the symbol has the ABI's signature; `iface` is a writable interface.
        let status = guard_call(|| unsafe { get_iface(&mut iface) });
        check_call(path, GET_IFACE_SYMBOL, status)?;
        let Some(iface_version) = IfaceVersion::from_word(iface.doca_api_version) else {
            return Err(PluginLoadError::UnsupportedInterface {
                path: path.to_owned(),
                version: iface.doca_api_version,
            });
        };
        let operations = [
            ("open", iface.open.is_some()),
            ("close", iface.close.is_some()),
            ("addr", iface.addr.is_some()),
            ("worker_cmd", iface.worker_cmd.is_some()),
            ("progress", iface.progress.is_some()),
            ("notif_pack", iface.notif_pack.is_some()),
        ];
        if let Some((operation, _)) = operations.iter().find(|(_, present)| !present) {
            return Err(PluginLoadError::IncompleteInterface {
                path: path.to_owned(),
                operation,
            });
        }

        let native = native_iface(&library, path);
        let set_native_domain = symbol(&library, path, SET_NATIVE_DOMAIN_SYMBOL).ok();
        Ok(Self {
            path: path.to_owned(),
            version,
            iface_version,
            iface,
            native,
            set_native_domain,
            _library: library,
        })
    }

    /// The library's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The version `urom_plugin_get_version` reported.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The headers the plugin was built with, from its interface version word.
    pub fn iface_version(&self) -> IfaceVersion {
        self.iface_version
    }

    /// The plugin's name: its file name without `.so`, as the service lists it and domain
    /// tables name its address.
    pub fn name(&self) -> &str {
        self.path
            .file_stem()
            .and_then(|stem| stem.to_str())
            .unwrap_or_default()
    }

    /// Whether the plugin offers the allocation-free native path.
    pub fn has_native_path(&self) -> bool {
        self.native.is_some()
    }

    /// Drives the plugin through the DOCA interface even when it offers the native path (to
    /// compare the two, or to test the DOCA entry points of SDK plugins).
    pub fn without_native_path(mut self) -> Self {
        self.native = None;
        self
    }

    /// Creates the plugin's instance for plugin id `id` (`open`). `max` bounds the packed
    /// notifications the instance can return.
    pub fn open(self, id: u64, max: MaxMsgSize) -> Result<LoadedPlugin, PluginOpenError> {
        let ctx = Box::into_raw(Box::new(WorkerCtxExt {
            ctx: WorkerCtx {
                iface: self.iface,
                domain_iface: LOOKUPS,
                plugin_ctx: ptr::null_mut(),
            },
            domain: DomainSlot::new(self.name()),
        }));
        let mut plugin = LoadedPlugin {
            id,
            ctx,
            cmd_list: ListHead::new(),
            notif_list: ListHead::new(),
            packed: vec![0; size_of::<WorkerNotify>() + max_notify_payload(max)].into_boxed_slice(),
            opened: false,
            library: self,
        };
        let open = plugin.library.iface.open.expect("checked at load");
        let ctx_ptr = plugin.ctx_ptr();
        // SAFETY: `open` has the ABI's signature; `ctx` is a valid context that stays at this
        // address for the instance's lifetime.
        let status = Status::from_raw(guard_call(|| unsafe { open(ctx_ptr) }));
        if status != Status::Success {
            let path = plugin.library.path.clone();
            return Err(PluginOpenError { path, status });
        }
        plugin.opened = true;
        if let Some(set_native_domain) = plugin.library.set_native_domain {
            // SAFETY: the native ABI: the context `open` succeeded on and an interface that
            // outlives the instance (a constant). A plugin that refuses it still runs; its
            // address lookups then have no length.
            guard_call(|| unsafe { set_native_domain(ctx_ptr, &NATIVE_DOMAIN) });
        }
        Ok(plugin)
    }
}

/// Where a plugin's notifications go: the worker routes each to host connection `dest_id`.
pub trait NotificationSink {
    /// Delivers one notification; an error when the connection is gone or cannot take it.
    fn notify(&mut self, dest_id: u64, notification: Notification<'_>) -> Result<(), Status>;
}

/// What a plugin did with a command ([`LoadedPlugin::command`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handled {
    /// An error when the plugin did not take the command: the caller answers it.
    pub status: Status,
    /// The answer the plugin wrote at the start of the lent buffer, if it did: its status and
    /// payload length.
    pub reply: Option<(Status, usize)>,
}

impl Handled {
    fn status(status: Status) -> Self {
        Self {
            status,
            reply: None,
        }
    }
}

/// An opened plugin instance.
pub struct LoadedPlugin {
    id: u64,
    // INVARIANTS: from `Box::into_raw`, freed in `drop` after `close`: its address stays fixed
    // and every access goes through this one pointer, the one the plugin is given (as a pointer
    // to its first field, the DOCA context) and may keep, so that the domain lookups reach the
    // rest.
    ctx: *mut WorkerCtxExt,
    cmd_list: ListHead,
    notif_list: ListHead,
    /// Room for one packed notification (header and largest payload).
    packed: Box<[u8]>,
    /// Whether `open` succeeded (and so `close` is due).
    opened: bool,
    library: PluginLibrary,
}

impl fmt::Debug for LoadedPlugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadedPlugin")
            .field("id", &self.id)
            .field("library", &self.library)
            .finish()
    }
}

impl LoadedPlugin {
    /// The plugin's id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The library it came from.
    pub fn library(&self) -> &PluginLibrary {
        &self.library
    }

    /// The context pointer the plugin is given: the DOCA context at the start of its
    /// extension, with the provenance of the whole.
    fn ctx_ptr(&mut self) -> *mut WorkerCtx {
        self.ctx.cast()
    }

    /// Answers the plugin's domain lookups from `table` from now on. What the plugin looked up
    /// in an earlier table stays valid until it closes. The member whose address for this
    /// plugin is the one the plugin gives now is its own (its `self_lookup`).
    pub fn set_domain(&mut self, table: Arc<DomainTable>) {
        let own = self.address().unwrap_or_default();
        // SAFETY: the context is live (INVARIANTS) and no call into the plugin is running: this
        // takes `&mut self`, and every call into the plugin does too.
        unsafe { (*self.ctx).domain.set(table, &own) };
    }

    /// The plugin's endpoint address, read with the two-call protocol of `addr`.
    pub fn address(&mut self) -> Result<Vec<u8>, Status> {
        let addr = self.library.iface.addr.expect("checked at load");
        let ctx = self.ctx_ptr();
        let mut len = 0usize;
        // SAFETY: `addr` has the ABI's signature; a zero capacity with a null buffer asks for
        // the length only.
        let status = Status::from_raw(guard_call(|| unsafe {
            addr(ctx, ptr::null_mut(), &mut len)
        }));
        if status == Status::Success && len == 0 {
            return Ok(Vec::new());
        }
        if status != Status::InvalidValue && status != Status::Success {
            return Err(status);
        }
        let mut buffer = vec![0u8; len];
        let mut capacity = len;
        // SAFETY: `buffer` has room for `capacity` bytes.
        let status = Status::from_raw(guard_call(|| unsafe {
            addr(ctx, buffer.as_mut_ptr().cast(), &mut capacity)
        }));
        status.into_result()?;
        buffer.truncate(capacity.min(len));
        Ok(buffer)
    }

    /// Hands one command from host connection `dest_id` to the plugin. Notifications it makes
    /// at once go to `sink`; later ones come out of [`LoadedPlugin::progress`]. An error
    /// status means the plugin did not take the command: the caller answers it.
    pub fn command(
        &mut self,
        dest_id: u64,
        command: &Command<'_>,
        sink: &mut dyn NotificationSink,
    ) -> Status {
        let mut reply = core::mem::take(&mut self.packed);
        let handled = self.command_into(dest_id, command, &mut reply, sink);
        if let Some((status, len)) = handled.reply {
            let answer = Notification {
                plugin: command.plugin,
                urom_context: command.urom_context,
                status,
                payload: &reply[..len],
            };
            // As a notification to a host that is gone: the sink has its say.
            let _ = sink.notify(dest_id, answer);
        }
        self.packed = reply;
        handled.status
    }

    /// [`LoadedPlugin::command`], where a plugin of the native path may answer the command at
    /// once by writing the answer's payload at the start of `reply` ([`Handled::reply`]) instead
    /// of calling back into `sink`: the worker then sends it from where it lies.
    pub fn command_into(
        &mut self,
        dest_id: u64,
        command: &Command<'_>,
        reply: &mut [u8],
        sink: &mut dyn NotificationSink,
    ) -> Handled {
        let header = WorkerCmd {
            plugin: command.plugin,
            urom_context: command.urom_context,
            len: command.payload.len() as u64,
        };
        let ctx = self.ctx_ptr();
        if let Some(native) = self.library.native {
            let mut sink: &mut dyn NotificationSink = sink;
            let c_sink = c_sink(&mut sink);
            let payload = command.payload.as_ptr();
            let Some(command_reply) = native.command_reply else {
                let native_command = native.command.expect("checked at load");
                // SAFETY: the native ABI: `header`, the payload and the sink are valid for the
                // call.
                let status = guard_call(|| unsafe {
                    native_command(ctx, dest_id, &header, payload, &c_sink)
                });
                return Handled::status(Status::from_raw(status));
            };
            let mut lent = NativeReply {
                buf: reply.as_mut_ptr(),
                capacity: reply.len(),
                len: 0,
                status: Status::Success.raw(),
                replied: 0,
            };
            // SAFETY: the native ABI: `header`, the payload, `reply.len()` writable bytes at
            // `lent.buf` and the sink are valid for the call.
            let status = guard_call(|| unsafe {
                command_reply(ctx, dest_id, &header, payload, &mut lent, &c_sink)
            });
            let answered = lent.replied != 0 && lent.len <= reply.len();
            return Handled {
                status: Status::from_raw(status),
                reply: answered.then(|| (Status::from_raw(lent.status), lent.len)),
            };
        }

        let desc = WorkerCmdDesc {
            entry: super::ListLink::unlinked(),
            dest_id,
            worker_cmd: header,
        };
        let desc = match super::list::malloc_desc(desc, command.payload) {
            Ok(desc) => desc,
            Err(status) => return Handled::status(status),
        };
        // SAFETY: the descriptor is valid and in no list; the plugin frees it once it takes it.
        unsafe { self.cmd_list.push_back(desc.cast()) };
        let worker_cmd = self.library.iface.worker_cmd.expect("checked at load");
        let cmd_list = self.cmd_list.as_ptr();
        // SAFETY: the ABI: a valid context and a valid list of malloc'ed command descriptors.
        let status = Status::from_raw(guard_call(|| unsafe { worker_cmd(ctx, cmd_list) }));
        // SAFETY: whatever the plugin left in the list is still ours.
        while let Some(link) = unsafe { self.cmd_list.pop_front() } {
            // SAFETY: malloc'ed above and not taken by the plugin.
            unsafe { libc::free(link.cast()) };
        }
        Handled::status(status)
    }

    /// Gives the plugin time for asynchronous work and delivers its finished notifications to
    /// `sink`; returns whether anything happened.
    pub fn progress(&mut self, sink: &mut dyn NotificationSink) -> Result<bool, Status> {
        let ctx = self.ctx_ptr();
        let status = if let Some(native) = self.library.native {
            let native_progress = native.progress.expect("checked at load");
            let mut sink: &mut dyn NotificationSink = sink;
            let c_sink = c_sink(&mut sink);
            // SAFETY: the native ABI: a valid context and a sink valid for the call.
            Status::from_raw(guard_call(|| unsafe { native_progress(ctx, &c_sink) }))
        } else {
            let progress = self.library.iface.progress.expect("checked at load");
            let notif_list = self.notif_list.as_ptr();
            // SAFETY: the ABI: a valid context and an empty list for the notifications.
            let status = Status::from_raw(guard_call(|| unsafe { progress(ctx, notif_list) }));
            self.deliver_packed(sink);
            status
        };
        match status {
            Status::Success => Ok(true),
            Status::Empty => Ok(false),
            error => Err(error),
        }
    }

    /// Readies the plugin to wake its worker, about to sleep: adds the plugin's wake-up
    /// descriptors to `wake` (see [`crate::sdk::Plugin::arm`]). Plugins without the native
    /// interface's `arm` (C plugins, older SDK plugins) cannot wake the worker:
    /// [`Arm::Unsupported`].
    pub fn arm(&mut self, wake: &mut WakeSet) -> Arm {
        let Some(arm) = self.library.native.and_then(|native| native.arm) else {
            return Arm::Unsupported;
        };
        let ctx = self.ctx_ptr();
        let mut fds = [-1 as core::ffi::c_int; NATIVE_MAX_WAKE_FDS];
        let mut count = 0usize;
        // SAFETY: the native ABI: a valid context, room for `NATIVE_MAX_WAKE_FDS` descriptors
        // and a writable count.
        let status = Status::from_raw(guard_call(|| unsafe {
            arm(ctx, fds.as_mut_ptr(), fds.len(), &mut count)
        }));
        match status {
            Status::Success => {
                for &fd in &fds[..count.min(fds.len())] {
                    wake.watch_raw(fd);
                }
                Arm::Armed
            }
            Status::Again => Arm::Busy,
            _ => Arm::Unsupported,
        }
    }

    /// Packs each notification descriptor the plugin returned, sends it, frees it.
    fn deliver_packed(&mut self, sink: &mut dyn NotificationSink) {
        let notif_pack = self.library.iface.notif_pack.expect("checked at load");
        // SAFETY: the plugin filled the list with malloc'ed notification descriptors that the
        // worker now owns.
        while let Some(link) = unsafe { self.notif_list.pop_front() } {
            let desc = link.cast::<WorkerNotifDesc>();
            // SAFETY: a valid descriptor (see above).
            let dest_id = unsafe { (*desc).dest_id };
            // SAFETY: as above; taking the field's address reads nothing.
            let notify = unsafe { &raw mut (*desc).worker_notif };
            let mut packed_len = self.packed.len();
            let packed = self.packed.as_mut_ptr();
            // SAFETY: the ABI: a valid notification and a buffer of `packed_len` bytes.
            let status = Status::from_raw(guard_call(|| unsafe {
                notif_pack(notify, &mut packed_len, packed.cast::<c_void>())
            }));
            // SAFETY: the header fields stay readable until the descriptor is freed.
            let header = unsafe { *notify };
            // SAFETY: the worker owns the descriptor, malloc'ed by the plugin.
            unsafe { libc::free(desc.cast()) };
            let notification = match self.packed.get(size_of::<WorkerNotify>()..packed_len) {
                Some(payload) if status == Status::Success => Notification {
                    plugin: header.plugin,
                    urom_context: header.urom_context,
                    status: Status::from_raw(header.status),
                    payload,
                },
                // The plugin could not pack it (too big, or a bad length): tell the host why
                // instead of dropping the answer.
                _ => Notification {
                    plugin: header.plugin,
                    urom_context: header.urom_context,
                    status: if status == Status::Success {
                        Status::TooBig
                    } else {
                        status
                    },
                    payload: &[],
                },
            };
            // A host that is gone cannot be told; the sink reports that itself.
            let _ = sink.notify(dest_id, notification);
        }
    }
}

impl Drop for LoadedPlugin {
    fn drop(&mut self) {
        if self.opened {
            let close = self.library.iface.close.expect("checked at load");
            let ctx = self.ctx_ptr();
            guard_call(|| {
                // SAFETY: the ABI: `close` once, with the context `open` succeeded on.
                unsafe { close(ctx) };
                Status::Success.raw()
            });
        }
        // SAFETY: descriptors still listed are ours to free (the lists are drained after each
        // call, so this only matters if a call panicked midway).
        while let Some(link) = unsafe { self.notif_list.pop_front() } {
            // SAFETY: malloc'ed by the plugin, owned by the worker.
            unsafe { libc::free(link.cast()) };
        }
        // SAFETY: from `Box::into_raw` in `PluginLibrary::open`, freed once, here, after the
        // plugin closed; the library is unloaded only after this (a later field).
        drop(unsafe { Box::from_raw(self.ctx) });
    }
}

/// Calls into a plugin; a panic that unwinds out of it (a Rust plugin without the SDK) is
/// stopped here.
#[inline(always)]
fn guard_call(call: impl FnOnce() -> DocaError) -> DocaError {
    guard("a plugin call", || Status::from_raw(call()))
}

fn check_call(path: &Path, symbol: &'static str, status: DocaError) -> Result<(), PluginLoadError> {
    match Status::from_raw(status) {
        Status::Success => Ok(()),
        status => Err(PluginLoadError::Call {
            path: path.to_owned(),
            symbol,
            status,
        }),
    }
}

/// Looks up a function symbol.
fn symbol<T: Copy>(
    library: &Library,
    path: &Path,
    name: &'static str,
) -> Result<T, PluginLoadError> {
    // SAFETY: every symbol looked up here has the signature `T` under the plugin ABI; the
    // pointer is used only while `library` stays loaded (PluginLibrary's invariant).
    unsafe { library.get::<T>(name.as_bytes()) }
        .map(|symbol| *symbol)
        .map_err(|_| PluginLoadError::MissingSymbol {
            path: path.to_owned(),
            symbol: name,
        })
}

/// The native interface, when the plugin offers a version this build speaks.
fn native_iface(library: &Library, path: &Path) -> Option<NativeIface> {
    let get_native: GetNativeIfaceFn = symbol(library, path, GET_NATIVE_IFACE_SYMBOL).ok()?;
    // Asks for the newest version; a plugin answers that or an older one (see
    // `NATIVE_IFACE_VERSION`).
    let mut native = NativeIface {
        version: NATIVE_IFACE_VERSION,
        command: None,
        progress: None,
        arm: None,
        command_reply: None,
    };
    // SAFETY: the symbol has the native ABI's signature; `native` is readable and writable and
    // of the version its word asks for.
    let status = guard_call(|| unsafe { get_native(&mut native) });
    // What an older version does not have stays `None`.
    match native.version {
        1 => {
            native.arm = None;
            native.command_reply = None;
        }
        2 => native.command_reply = None,
        NATIVE_IFACE_VERSION => {}
        _ => return None,
    }
    let usable = Status::from_raw(status) == Status::Success
        && native.command.is_some()
        && native.progress.is_some();
    usable.then_some(native)
}

/// The C view of a sink, valid while `sink` is borrowed.
fn c_sink(sink: &mut &mut dyn NotificationSink) -> NotifySink {
    NotifySink {
        ctx: (sink as *mut &mut dyn NotificationSink).cast::<c_void>(),
        notify: sink_trampoline,
    }
}

unsafe extern "C" fn sink_trampoline(
    ctx: *mut c_void,
    dest_id: u64,
    header: *const WorkerNotify,
    payload: *const u8,
) -> DocaError {
    guard("the notification sink", || {
        if ctx.is_null() || header.is_null() {
            return Status::InvalidValue;
        }
        // SAFETY: `ctx` is the `&mut &mut dyn NotificationSink` that `c_sink` wrapped, borrowed
        // for the duration of the plugin call that is calling us.
        let sink = unsafe { &mut *ctx.cast::<&mut dyn NotificationSink>() };
        // SAFETY: non-null; the plugin passes a valid header for the call.
        let header = unsafe { *header };
        // SAFETY: the plugin passes `len` readable bytes for the call.
        let Some(payload) = (unsafe { super::lent_bytes(payload, header.len) }) else {
            return Status::InvalidValue;
        };
        let notification = Notification {
            plugin: header.plugin,
            urom_context: header.urom_context,
            status: Status::from_raw(header.status),
            payload,
        };
        match sink.notify(dest_id, notification) {
            Ok(()) => Status::Success,
            Err(status) => status,
        }
    })
}

/// Flattens an error and its sources into one line.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
