//! The C entry points of SDK plugins, generic over the plugin type. The
//! [`export_plugin!`](crate::export_plugin) macro instantiates them; nothing else should call
//! them.
//!
//! Every entry point checks its pointers for null and runs the plugin's code under
//! `catch_unwind`: a panic becomes `DOCA_ERROR_UNEXPECTED` and a line on stderr.

use core::ffi::c_void;
use core::marker::PhantomData;
use core::ptr;
use std::os::fd::{AsRawFd, BorrowedFd};

use super::list::{self, ListHead};
use super::{
    DocaError, ListLink, NATIVE_DOMAIN_VERSION, NATIVE_IFACE_VERSION, NativeDomainIface,
    NativeIface, NativeIfaceV1, NativeIfaceV2, NativeReply, NotifySink, PLUGIN_IFACE_VERSION,
    PluginIface, WorkerCmdDesc, WorkerCtx, WorkerNotifDesc, WorkerNotify, guard,
};
use crate::sdk::{Arm, Command, Plugin};
use urom_wire::Status;

/// What `plugin_ctx` points to.
struct Instance<P> {
    plugin: P,
    /// Notifications made on the DOCA path, waiting for the next `progress`.
    pending: ListHead,
    /// The worker's address lookup with a length, when it offers one (a urom worker does).
    native_domain: Option<NativeDomainIface>,
}

enum Target<'a> {
    /// Native path: straight into the worker's send ring.
    Sink(&'a NotifySink),
    /// DOCA path: `malloc`ed descriptors on the instance's pending list.
    Pending(&'a mut ListHead),
}

/// Where a plugin sends its notifications, and through [`Notifier::domain`] what it may ask
/// its worker about its domain, for the duration of one call into the plugin.
pub struct Notifier<'a> {
    target: Target<'a>,
    domain: Domain<'a>,
    /// Room the worker lent for the answer to the command being handled (native path).
    lent: Option<LentReply<'a>>,
}

/// The worker's room for the answer to one command, and which command that is.
struct LentReply<'a> {
    reply: &'a mut NativeReply,
    dest_id: u64,
    urom_context: u64,
}

/// The plugin's view of its worker's domain: the members' plugin addresses and their hosts'
/// buffers, as the host that started the domain gave them (DOCA's domain lookups).
///
/// Errors as DOCA documents them: `DOCA_ERROR_NOT_FOUND` for a domain id the worker does not
/// know (every id, before any domain is started), a segment that is not there, or a member
/// that does not run this plugin; `DOCA_ERROR_NOT_SUPPORTED` for a buffer added without a
/// memory handle or remote key, and for addresses on a worker that does not give their length.
/// What a lookup returns stays valid for the whole call.
#[derive(Clone, Copy)]
pub struct Domain<'a> {
    /// The plugin's context, valid for the call.
    ctx: *mut WorkerCtx,
    native: Option<NativeDomainIface>,
    _call: PhantomData<&'a ()>,
}

impl core::fmt::Debug for Domain<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Domain")
            .field("native", &self.native.is_some())
            .finish()
    }
}

impl<'a> Domain<'a> {
    /// The view of the context `ctx`, for one call.
    fn new(ctx: *mut WorkerCtx, native: Option<NativeDomainIface>) -> Self {
        Self {
            ctx,
            native,
            _call: PhantomData,
        }
    }

    /// This plugin's address on member `domain_id` (what that member's instance of this plugin
    /// returned from its `addr`).
    pub fn address(&self, domain_id: u64) -> Result<&'a [u8], Status> {
        self.lookup_bytes(self.native.and_then(|native| native.addr_lookup), domain_id)
    }

    /// The domain id of this plugin's own worker: the member whose address for this plugin is
    /// the one this plugin gives. `NOT_FOUND` before a domain runs, or when this plugin gives
    /// no address; `NOT_SUPPORTED` on a worker that cannot say.
    pub fn own_id(&self) -> Result<u64, Status> {
        let lookup = self
            .native
            .and_then(|native| native.self_lookup)
            .ok_or(Status::NotSupported)?;
        let mut id = 0u64;
        // SAFETY: the native ABI: the worker's lookup, its context for this call, a valid
        // output.
        let status = unsafe { lookup(self.ctx, &mut id) };
        Status::from_raw(status).into_result().map(|()| id)
    }

    /// The address of the memory worker of member `domain_id`'s host: the UCP worker through
    /// which its buffers are reached with remote memory access. `NOT_FOUND` when that host
    /// gave none; `NOT_SUPPORTED` on a worker that cannot say.
    pub fn host_memory_address(&self, domain_id: u64) -> Result<&'a [u8], Status> {
        self.lookup_bytes(
            self.native.and_then(|native| native.host_memory_lookup),
            domain_id,
        )
    }

    /// The bytes a native lookup gives for member `domain_id`; `NOT_SUPPORTED` when the worker
    /// offers no such lookup.
    fn lookup_bytes(
        &self,
        lookup: Option<super::NativeAddrLookupFn>,
        domain_id: u64,
    ) -> Result<&'a [u8], Status> {
        let lookup = lookup.ok_or(Status::NotSupported)?;
        let mut addr: *const u8 = ptr::null();
        let mut len = 0usize;
        // SAFETY: the native ABI: the worker's lookup, the context it gave for this call, and
        // valid outputs.
        let status = unsafe { lookup(self.ctx, domain_id, &mut addr, &mut len) };
        Status::from_raw(status).into_result()?;
        // SAFETY: a successful lookup returns `len` bytes that stay valid at least for the
        // call (the worker keeps its tables until the plugin closes).
        unsafe { super::lent_bytes(addr, len as u64) }.ok_or(Status::Unexpected)
    }

    /// The index of the buffer of member `domain_id`'s host that holds `va`.
    pub fn segment(&self, domain_id: u64, va: u64) -> Result<i32, Status> {
        // SAFETY: the worker's context is valid for the call.
        let lookups = unsafe { (*self.ctx).domain_iface };
        let lookup = lookups.seg_lookup.ok_or(Status::NotSupported)?;
        let mut seg = -1i32;
        // SAFETY: the plugin ABI: the worker's lookup, its context, a valid output.
        let status = unsafe { lookup(self.ctx, domain_id, va, &mut seg) };
        Status::from_raw(status).into_result().map(|()| seg)
    }

    /// The packed memory handle of segment `seg` of member `domain_id`.
    pub fn memory_handle(&self, domain_id: u64, seg: i32) -> Result<&'a [u8], Status> {
        // SAFETY: the worker's context is valid for the call.
        let lookups = unsafe { (*self.ctx).domain_iface };
        self.key(lookups.memh_lookup, domain_id, seg)
    }

    /// The packed remote key of segment `seg` of member `domain_id`.
    pub fn remote_key(&self, domain_id: u64, seg: i32) -> Result<&'a [u8], Status> {
        // SAFETY: the worker's context is valid for the call.
        let lookups = unsafe { (*self.ctx).domain_iface };
        self.key(lookups.mkey_lookup, domain_id, seg)
    }

    fn key(
        &self,
        lookup: Option<super::MemhLookupFn>,
        domain_id: u64,
        seg: i32,
    ) -> Result<&'a [u8], Status> {
        let lookup = lookup.ok_or(Status::NotSupported)?;
        let mut key: *mut c_void = ptr::null_mut();
        let mut len = 0usize;
        // SAFETY: the plugin ABI: the worker's lookup, its context, valid outputs.
        let status = unsafe { lookup(self.ctx, domain_id, seg, &mut len, &mut key) };
        Status::from_raw(status).into_result()?;
        // SAFETY: a successful lookup returns `len` bytes valid at least for the call.
        unsafe { super::lent_bytes(key.cast::<u8>().cast_const(), len as u64) }
            .ok_or(Status::Unexpected)
    }
}

impl<'a> Notifier<'a> {
    /// What the plugin may ask about its worker's domain during this call.
    pub fn domain(&self) -> Domain<'a> {
        self.domain
    }

    /// Sends a notification to host connection `dest_id`.
    pub fn notify(
        &mut self,
        dest_id: u64,
        plugin: u64,
        urom_context: u64,
        status: Status,
        payload: &[u8],
    ) -> Result<(), Status> {
        let header = WorkerNotify {
            plugin,
            urom_context,
            len: payload.len() as u64,
            status: status.raw(),
            reserved: 0,
        };
        match &mut self.target {
            Target::Sink(sink) => {
                // SAFETY: the worker lends a valid sink for the duration of the call that
                // created this notifier; header and payload are valid for reads.
                let status = unsafe { (sink.notify)(sink.ctx, dest_id, &header, payload.as_ptr()) };
                Status::from_raw(status).into_result()
            }
            Target::Pending(pending) => {
                let desc = NotifDescBuf::new(dest_id, header, payload)?;
                // SAFETY: the descriptor is valid and in no list; the worker frees it after
                // `progress` hands it over, and `close` frees it otherwise.
                unsafe { pending.push_back(desc.into_link()) };
                Ok(())
            }
        }
    }

    /// Answers `command`. Inlined into the plugin: on the native path its answer goes into the
    /// room the worker lent, in a few stores.
    #[inline]
    pub fn reply(
        &mut self,
        command: &Command<'_>,
        status: Status,
        payload: &[u8],
    ) -> Result<(), Status> {
        if let Some(lent) = self.lent.take_if(|lent| {
            lent.reply.replied == 0
                && lent.dest_id == command.dest_id
                && lent.urom_context == command.urom_context
                && payload.len() <= lent.reply.capacity
        }) {
            // SAFETY: the worker lends `capacity` writable bytes at `buf`, which nothing else
            // reads or writes, for the call that created this notifier.
            let room = unsafe { core::slice::from_raw_parts_mut(lent.reply.buf, payload.len()) };
            urom_wire::copy_short(room, payload);
            lent.reply.len = payload.len();
            lent.reply.status = status.raw();
            lent.reply.replied = 1;
            return Ok(());
        }
        self.notify(
            command.dest_id,
            command.plugin,
            command.urom_context,
            status,
            payload,
        )
    }
}

/// A `malloc`ed notification descriptor with its payload, freed on drop unless handed over.
struct NotifDescBuf(*mut WorkerNotifDesc);

impl NotifDescBuf {
    fn new(dest_id: u64, header: WorkerNotify, payload: &[u8]) -> Result<Self, Status> {
        let desc = WorkerNotifDesc {
            entry: ListLink::unlinked(),
            dest_id,
            worker_notif: header,
        };
        list::malloc_desc(desc, payload).map(Self)
    }

    /// Gives up ownership; the link is the descriptor's first field.
    fn into_link(self) -> *mut ListLink {
        let link = self.0.cast::<ListLink>();
        core::mem::forget(self);
        link
    }
}

impl Drop for NotifDescBuf {
    fn drop(&mut self) {
        // SAFETY: the descriptor came from malloc and nobody else owns it.
        unsafe { libc::free(self.0.cast()) };
    }
}

/// A command descriptor taken off the worker's list, `free`d on drop as the ABI requires of
/// plugins.
struct CmdDescBox(*mut WorkerCmdDesc);

impl Drop for CmdDescBox {
    fn drop(&mut self) {
        // SAFETY: the worker `malloc`ed the descriptor and handed it to the plugin.
        unsafe { libc::free(self.0.cast()) };
    }
}

/// The instance `open::<P>` stored in `ctx`, if any.
///
/// # Safety
/// `ctx` is null or a valid worker context whose `plugin_ctx` is null or was set by
/// `open::<P>`, and no other reference to the instance is live.
unsafe fn instance<'a, P>(ctx: *mut WorkerCtx) -> Option<&'a mut Instance<P>> {
    if ctx.is_null() {
        return None;
    }
    // SAFETY: `ctx` is valid (caller).
    let raw = unsafe { (*ctx).plugin_ctx };
    // SAFETY: `raw` is null or a live `Box<Instance<P>>` with no other reference (caller).
    unsafe { raw.cast::<Instance<P>>().as_mut() }
}

/// `urom_plugin_get_version`.
///
/// # Safety
/// `version` is null or points to a writable `u64`.
pub unsafe fn get_version<P: Plugin>(version: *mut u64) -> DocaError {
    // SAFETY: the caller's contract.
    unsafe { write_out(version, P::VERSION) }
}

/// Writes `value` through `out`: `DOCA_ERROR_INVALID_VALUE` for a null pointer.
///
/// # Safety
/// `out` is null or points to a writable `T`.
unsafe fn write_out<T>(out: *mut T, value: T) -> DocaError {
    if out.is_null() {
        return Status::InvalidValue.raw();
    }
    // SAFETY: non-null and writable (caller).
    unsafe { out.write(value) };
    Status::Success.raw()
}

/// `urom_plugin_get_iface`.
///
/// # Safety
/// `iface` is null or points to a writable [`PluginIface`].
pub unsafe fn get_iface<P: Plugin>(iface: *mut PluginIface) -> DocaError {
    let value = PluginIface {
        doca_api_version: PLUGIN_IFACE_VERSION,
        open: Some(open::<P>),
        close: Some(close::<P>),
        addr: Some(addr::<P>),
        worker_cmd: Some(worker_cmd::<P>),
        progress: Some(progress::<P>),
        notif_pack: Some(notif_pack),
    };
    // SAFETY: the caller's contract.
    unsafe { write_out(iface, value) }
}

/// `urom_plugin_get_native_iface`: the newest interface the caller asked for in the version
/// word (see [`NATIVE_IFACE_VERSION`]), at least version 1.
///
/// # Safety
/// `iface` is null, or points to a readable and writable [`NativeIface`] of the version its
/// version word asks for (version 1 for a word below 2: its first 24 bytes; version 2: its
/// first 32).
pub unsafe fn get_native_iface<P: Plugin>(iface: *mut NativeIface) -> DocaError {
    if iface.is_null() {
        return Status::InvalidValue.raw();
    }
    // SAFETY: non-null and readable (caller); every version starts with the version word.
    let asked = unsafe { iface.cast::<u64>().read_unaligned() };
    if asked >= NATIVE_IFACE_VERSION {
        let value = NativeIface {
            version: NATIVE_IFACE_VERSION,
            command: Some(native_command::<P>),
            progress: Some(native_progress::<P>),
            arm: Some(native_arm::<P>),
            command_reply: Some(native_command_reply::<P>),
        };
        // SAFETY: the caller asked for this version, so `iface` holds all of it.
        unsafe { write_out(iface, value) }
    } else if asked == 2 {
        let value = NativeIfaceV2 {
            version: 2,
            command: Some(native_command::<P>),
            progress: Some(native_progress::<P>),
            arm: Some(native_arm::<P>),
        };
        // SAFETY: the caller asked for version 2, so `iface` holds all of it.
        unsafe { write_out(iface.cast::<NativeIfaceV2>(), value) }
    } else {
        let value = NativeIfaceV1 {
            version: 1,
            command: Some(native_command::<P>),
            progress: Some(native_progress::<P>),
        };
        // SAFETY: every caller has room for version 1 (caller).
        unsafe { write_out(iface.cast::<NativeIfaceV1>(), value) }
    }
}

unsafe extern "C" fn open<P: Plugin>(ctx: *mut WorkerCtx) -> DocaError {
    guard("open", || {
        if ctx.is_null() {
            return Status::InvalidValue;
        }
        match P::open() {
            Ok(plugin) => {
                let instance = Box::new(Instance {
                    plugin,
                    pending: ListHead::new(),
                    native_domain: None,
                });
                // SAFETY: `ctx` is the worker's valid context (plugin ABI).
                unsafe { (*ctx).plugin_ctx = Box::into_raw(instance).cast::<c_void>() };
                Status::Success
            }
            Err(status) => status,
        }
    })
}

unsafe extern "C" fn close<P: Plugin>(ctx: *mut WorkerCtx) {
    guard("close", || {
        // SAFETY: `ctx` comes from the worker, `plugin_ctx` from `open::<P>` (plugin ABI).
        let Some(instance) = (unsafe { instance::<P>(ctx) }) else {
            return Status::InvalidValue;
        };
        // SAFETY: the instance was created by `Box::into_raw` in `open::<P>`; the pointer is
        // cleared below so it is reclaimed once.
        let mut instance = unsafe { Box::from_raw(instance as *mut Instance<P>) };
        // SAFETY: `ctx` is valid (checked non-null by `instance`).
        unsafe { (*ctx).plugin_ctx = ptr::null_mut() };
        instance.plugin.close();
        // SAFETY: the pending list holds only descriptors this module allocated.
        while let Some(link) = unsafe { instance.pending.pop_front() } {
            drop(NotifDescBuf(link.cast()));
        }
        Status::Success
    });
}

unsafe extern "C" fn addr<P: Plugin>(
    ctx: *mut WorkerCtx,
    addr: *mut c_void,
    addr_len: *mut usize,
) -> DocaError {
    guard("addr", || {
        // SAFETY: `ctx` comes from the worker, `plugin_ctx` from `open::<P>` (plugin ABI).
        let Some(instance) = (unsafe { instance::<P>(ctx) }) else {
            return Status::InvalidValue;
        };
        if addr_len.is_null() {
            return Status::InvalidValue;
        }
        let address = instance.plugin.address();
        // SAFETY: non-null, and the worker passes a valid `size_t` (plugin ABI).
        let capacity = unsafe { addr_len.replace(address.len()) };
        if capacity < address.len() {
            // The first call of the two-call protocol: the length is now in `*addr_len`.
            return Status::InvalidValue;
        }
        if !address.is_empty() {
            if addr.is_null() {
                return Status::InvalidValue;
            }
            // SAFETY: `addr` has room for `capacity >= address.len()` bytes (plugin ABI).
            unsafe { ptr::copy_nonoverlapping(address.as_ptr(), addr.cast(), address.len()) };
        }
        Status::Success
    })
}

unsafe extern "C" fn worker_cmd<P: Plugin>(
    ctx: *mut WorkerCtx,
    cmd_list: *mut ListLink,
) -> DocaError {
    guard("worker_cmd", || {
        // SAFETY: `ctx` comes from the worker, `plugin_ctx` from `open::<P>` (plugin ABI).
        let Some(Instance {
            plugin,
            pending,
            native_domain,
        }) = (unsafe { instance::<P>(ctx) })
        else {
            return Status::InvalidValue;
        };
        if cmd_list.is_null() {
            return Status::InvalidValue;
        }
        // SAFETY: the worker passes a valid list of `malloc`ed command descriptors.
        while let Some(link) = unsafe { list::pop_front(cmd_list) } {
            let desc = CmdDescBox(link.cast::<WorkerCmdDesc>());
            // SAFETY: the descriptor is valid; its link is its first field.
            let desc_ref = unsafe { &*desc.0 };
            let (dest_id, header) = (desc_ref.dest_id, desc_ref.worker_cmd);
            // SAFETY: `plugin_cmd[]` follows the descriptor and holds `len` bytes (plugin ABI).
            let payload_ptr = unsafe { desc.0.add(1) }.cast::<u8>();
            // SAFETY: as above; the slice lives until `desc` is dropped at the end of the loop.
            let payload = unsafe { core::slice::from_raw_parts(payload_ptr, header.len as usize) };
            let command = Command {
                dest_id,
                plugin: header.plugin,
                urom_context: header.urom_context,
                payload,
            };
            let mut out = Notifier {
                target: Target::Pending(pending),
                domain: Domain::new(ctx, *native_domain),
                lent: None,
            };
            if let Err(status) = plugin.command(&command, &mut out) {
                // Answer the failed command here, so a list of several commands still gets
                // exactly one notification per command.
                if let Err(status) = out.reply(&command, status, &[]) {
                    return status;
                }
            }
        }
        Status::Success
    })
}

unsafe extern "C" fn progress<P: Plugin>(
    ctx: *mut WorkerCtx,
    notif_list: *mut ListLink,
) -> DocaError {
    guard("progress", || {
        // SAFETY: `ctx` comes from the worker, `plugin_ctx` from `open::<P>` (plugin ABI).
        let Some(Instance {
            plugin,
            pending,
            native_domain,
        }) = (unsafe { instance::<P>(ctx) })
        else {
            return Status::InvalidValue;
        };
        if notif_list.is_null() {
            return Status::InvalidValue;
        }
        let mut out = Notifier {
            target: Target::Pending(pending),
            domain: Domain::new(ctx, *native_domain),
            lent: None,
        };
        let result = plugin.progress(&mut out);
        let mut handed_over = false;
        // SAFETY: the pending list holds only descriptors this module allocated.
        while let Some(link) = unsafe { pending.pop_front() } {
            // SAFETY: the worker's list is valid; the descriptor is valid and now in no list.
            unsafe { list::push_back(notif_list, link) };
            handed_over = true;
        }
        match result {
            Err(status) => status,
            Ok(worked) if worked || handed_over => Status::Success,
            Ok(_) => Status::Empty,
        }
    })
}

/// Packs a notification as header and payload, exactly as it lies in memory.
unsafe extern "C" fn notif_pack(
    notif: *mut WorkerNotify,
    packed_notif_len: *mut usize,
    packed_notif: *mut c_void,
) -> DocaError {
    guard("notif_pack", || {
        if notif.is_null() || packed_notif_len.is_null() {
            return Status::InvalidValue;
        }
        // SAFETY: the worker passes a notification header followed by its payload.
        let len = unsafe { (*notif).len } as usize;
        let total = size_of::<WorkerNotify>() + len;
        // SAFETY: non-null and valid (plugin ABI).
        let capacity = unsafe { packed_notif_len.replace(total) };
        if capacity < total {
            return Status::InvalidValue;
        }
        if packed_notif.is_null() {
            return Status::InvalidValue;
        }
        // SAFETY: `notif` is followed by `len` payload bytes, so `total` bytes are readable;
        // `packed_notif` has room for `capacity >= total` bytes; the worker's buffer is its own.
        unsafe { ptr::copy_nonoverlapping(notif.cast::<u8>(), packed_notif.cast::<u8>(), total) };
        Status::Success
    })
}

unsafe extern "C" fn native_command<P: Plugin>(
    ctx: *mut WorkerCtx,
    dest_id: u64,
    cmd: *const super::WorkerCmd,
    payload: *const u8,
    sink: *const NotifySink,
) -> DocaError {
    // SAFETY: the caller's contract, with no room for the answer.
    unsafe { command_with_reply::<P>(ctx, dest_id, cmd, payload, ptr::null_mut(), sink) }
}

/// Version 3's command entry point: as [`native_command`], with room for the answer.
unsafe extern "C" fn native_command_reply<P: Plugin>(
    ctx: *mut WorkerCtx,
    dest_id: u64,
    cmd: *const super::WorkerCmd,
    payload: *const u8,
    reply: *mut NativeReply,
    sink: *const NotifySink,
) -> DocaError {
    // SAFETY: the caller's contract.
    unsafe { command_with_reply::<P>(ctx, dest_id, cmd, payload, reply, sink) }
}

/// Hands one command to the plugin; its answer goes to `reply` when that is not null and the
/// plugin answers at once, to `sink` otherwise.
///
/// # Safety
/// The native ABI: `ctx` from the worker, `cmd` and `len` payload bytes readable, `reply` null
/// or valid with `capacity` writable bytes at its `buf`, and `sink` valid, all for the call.
#[inline(always)]
unsafe fn command_with_reply<P: Plugin>(
    ctx: *mut WorkerCtx,
    dest_id: u64,
    cmd: *const super::WorkerCmd,
    payload: *const u8,
    reply: *mut NativeReply,
    sink: *const NotifySink,
) -> DocaError {
    guard("command", || {
        // SAFETY: `ctx` comes from the worker, `plugin_ctx` from `open::<P>` (native ABI).
        let Some(Instance {
            plugin,
            native_domain,
            ..
        }) = (unsafe { instance::<P>(ctx) })
        else {
            return Status::InvalidValue;
        };
        if cmd.is_null() || sink.is_null() {
            return Status::InvalidValue;
        }
        // SAFETY: non-null and valid for the call (native ABI).
        let header = unsafe { *cmd };
        // SAFETY: as above.
        let sink = unsafe { &*sink };
        // SAFETY: the worker lends `len` readable bytes for the call (native ABI).
        let Some(payload) = (unsafe { super::lent_bytes(payload, header.len) }) else {
            return Status::InvalidValue;
        };
        let command = Command {
            dest_id,
            plugin: header.plugin,
            urom_context: header.urom_context,
            payload,
        };
        // SAFETY: null or valid for the call (native ABI).
        let lent = unsafe { reply.as_mut() }.map(|reply| LentReply {
            reply,
            dest_id,
            urom_context: header.urom_context,
        });
        let mut out = Notifier {
            target: Target::Sink(sink),
            domain: Domain::new(ctx, *native_domain),
            lent,
        };
        match plugin.command(&command, &mut out) {
            Ok(()) => Status::Success,
            Err(status) => status,
        }
    })
}

unsafe extern "C" fn native_progress<P: Plugin>(
    ctx: *mut WorkerCtx,
    sink: *const NotifySink,
) -> DocaError {
    guard("progress", || {
        // SAFETY: `ctx` comes from the worker, `plugin_ctx` from `open::<P>` (native ABI).
        let Some(Instance {
            plugin,
            native_domain,
            ..
        }) = (unsafe { instance::<P>(ctx) })
        else {
            return Status::InvalidValue;
        };
        if sink.is_null() {
            return Status::InvalidValue;
        }
        let mut out = Notifier {
            // SAFETY: non-null and valid for the call (native ABI).
            target: Target::Sink(unsafe { &*sink }),
            domain: Domain::new(ctx, *native_domain),
            lent: None,
        };
        match plugin.progress(&mut out) {
            Ok(true) => Status::Success,
            Ok(false) => Status::Empty,
            Err(status) => status,
        }
    })
}

unsafe extern "C" fn native_arm<P: Plugin>(
    ctx: *mut WorkerCtx,
    fds: *mut core::ffi::c_int,
    capacity: usize,
    count: *mut usize,
) -> DocaError {
    guard("arm", || {
        // SAFETY: `ctx` comes from the worker, `plugin_ctx` from `open::<P>` (native ABI).
        let Some(Instance { plugin, .. }) = (unsafe { instance::<P>(ctx) }) else {
            return Status::InvalidValue;
        };
        if count.is_null() || (fds.is_null() && capacity > 0) {
            return Status::InvalidValue;
        }
        let slots = if capacity == 0 {
            &mut [][..]
        } else {
            // SAFETY: non-null with room for `capacity` descriptors, writable for the call
            // (native ABI).
            unsafe { core::slice::from_raw_parts_mut(fds, capacity) }
        };
        let mut wake = WakeFds { slots, count: 0 };
        let armed = plugin.arm(&mut wake);
        // SAFETY: non-null and writable (native ABI).
        unsafe { count.write(wake.count) };
        match armed {
            Arm::Armed => Status::Success,
            Arm::Busy => Status::Again,
            Arm::Unsupported => Status::NotSupported,
        }
    })
}

/// Where a plugin gives its worker the descriptors that wake it ([`Plugin::arm`]).
#[derive(Debug)]
pub struct WakeFds<'a> {
    slots: &'a mut [core::ffi::c_int],
    count: usize,
}

impl WakeFds<'_> {
    /// Wakes the sleeping worker when `fd` becomes readable. `fd` must stay open until the
    /// worker next calls into the plugin. `DOCA_ERROR_TOO_BIG` when the plugin already gave
    /// as many as its worker takes ([`crate::abi::NATIVE_MAX_WAKE_FDS`]).
    pub fn watch(&mut self, fd: BorrowedFd<'_>) -> Result<(), Status> {
        let slot = self.slots.get_mut(self.count).ok_or(Status::TooBig)?;
        *slot = fd.as_raw_fd();
        self.count += 1;
        Ok(())
    }

    /// How many descriptors were given.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether none was given.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
}

/// `urom_plugin_set_native_domain`: keeps the worker's native domain lookups for the plugin's
/// [`Domain`] view.
///
/// # Safety
/// `ctx` is null or the context `open::<P>` succeeded on; `iface` is null or valid for reads.
pub unsafe fn set_native_domain<P: Plugin>(
    ctx: *mut WorkerCtx,
    iface: *const NativeDomainIface,
) -> DocaError {
    guard("set_native_domain", || {
        // SAFETY: `ctx` comes from the worker, `plugin_ctx` from `open::<P>` (caller).
        let Some(instance) = (unsafe { instance::<P>(ctx) }) else {
            return Status::InvalidValue;
        };
        if iface.is_null() {
            return Status::InvalidValue;
        }
        // SAFETY: non-null and valid for reads (caller); every version starts with the version
        // word.
        let version = unsafe { iface.cast::<u64>().read_unaligned() };
        let iface = match version {
            // Version 1 ends after `addr_lookup`: read that much.
            1 => {
                let field = iface
                    .wrapping_byte_add(core::mem::offset_of!(NativeDomainIface, addr_lookup))
                    .cast::<Option<super::NativeAddrLookupFn>>();
                // SAFETY: a version-1 interface holds the version and `addr_lookup` (caller).
                let addr_lookup = unsafe { field.read_unaligned() };
                NativeDomainIface {
                    version,
                    addr_lookup,
                    self_lookup: None,
                    host_memory_lookup: None,
                }
            }
            // SAFETY: a version-2 (or later, a superset) interface holds all of this struct.
            v if v >= NATIVE_DOMAIN_VERSION => unsafe { *iface },
            _ => return Status::NotSupported,
        };
        instance.native_domain = Some(iface);
        Status::Success
    })
}

#[cfg(test)]
mod tests {
    use std::os::fd::{AsFd, AsRawFd, OwnedFd};

    use super::*;
    use crate::abi::{DomainLookupsIface, NATIVE_MAX_WAKE_FDS, NativeArmFn, NativeCommandReplyFn};
    use crate::sdk::Command;

    /// Gives an eventfd to sleep on, or says work waits.
    struct Waker {
        event: OwnedFd,
        busy: bool,
    }

    impl Plugin for Waker {
        const VERSION: u64 = 1;
        fn open() -> Result<Self, Status> {
            let event = urom_transport::sys::wake_event().map_err(|_| Status::Driver)?;
            Ok(Self { event, busy: false })
        }
        fn command(&mut self, _: &Command<'_>, _: &mut Notifier<'_>) -> Result<(), Status> {
            self.busy = true;
            Ok(())
        }
        fn arm(&mut self, wake: &mut WakeFds<'_>) -> Arm {
            if self.busy {
                return Arm::Busy;
            }
            wake.watch(self.event.as_fd())
                .expect("room for one descriptor");
            Arm::Armed
        }
    }

    /// Keeps the SDK's default: cannot wake its worker.
    struct Plain;

    impl Plugin for Plain {
        const VERSION: u64 = 1;
        fn open() -> Result<Self, Status> {
            Ok(Plain)
        }
        fn command(&mut self, _: &Command<'_>, _: &mut Notifier<'_>) -> Result<(), Status> {
            Ok(())
        }
    }

    /// Answers each command with its own payload, `n` times, where `n` is its first byte.
    struct Echo;

    impl Plugin for Echo {
        const VERSION: u64 = 1;
        fn open() -> Result<Self, Status> {
            Ok(Echo)
        }
        fn command(&mut self, command: &Command<'_>, out: &mut Notifier<'_>) -> Result<(), Status> {
            let times = command.payload.first().copied().unwrap_or(1);
            for _ in 0..times {
                out.reply(command, Status::Success, command.payload)?;
            }
            Ok(())
        }
    }

    /// What reached the sink: payloads.
    unsafe extern "C" fn collect(
        ctx: *mut c_void,
        _dest_id: u64,
        header: *const WorkerNotify,
        payload: *const u8,
    ) -> DocaError {
        // SAFETY: the test passes a `Vec<Vec<u8>>` as `ctx`.
        let seen = unsafe { &mut *ctx.cast::<Vec<Vec<u8>>>() };
        // SAFETY: the plugin passes a valid header.
        let header = unsafe { &*header };
        // SAFETY: `len` readable bytes (the sink's contract).
        let payload = unsafe { core::slice::from_raw_parts(payload, header.len as usize) };
        seen.push(payload.to_vec());
        Status::Success.raw()
    }

    /// Runs one command through `native_command_reply` with `capacity` bytes of room: what the
    /// room got (status and bytes) and what went to the sink.
    fn echo(payload: &[u8], capacity: usize) -> (Option<Vec<u8>>, Vec<Vec<u8>>) {
        let mut ctx = worker_ctx();
        // SAFETY: a valid context, opened once and closed below.
        assert_eq!(unsafe { open::<Echo>(&mut ctx) }, Status::Success.raw());
        let mut room = vec![0u8; capacity];
        let mut reply = NativeReply {
            buf: room.as_mut_ptr(),
            capacity,
            len: 0,
            status: Status::Success.raw(),
            replied: 0,
        };
        let mut seen: Vec<Vec<u8>> = Vec::new();
        let sink = NotifySink {
            ctx: (&mut seen as *mut Vec<Vec<u8>>).cast(),
            notify: collect,
        };
        let header = super::super::WorkerCmd {
            plugin: 1,
            urom_context: 9,
            len: payload.len() as u64,
        };
        // SAFETY: the native ABI: all pointers valid for the call.
        let status = unsafe {
            native_command_reply::<Echo>(&mut ctx, 3, &header, payload.as_ptr(), &mut reply, &sink)
        };
        assert_eq!(Status::from_raw(status), Status::Success);
        // SAFETY: opened above.
        unsafe { close::<Echo>(&mut ctx) };
        let answered = (reply.replied != 0).then(|| room[..reply.len].to_vec());
        (answered, seen)
    }

    #[test]
    fn the_first_answer_goes_to_the_lent_room_and_any_other_to_the_sink() {
        assert_eq!(echo(&[1, 2, 3], 16), (Some(vec![1, 2, 3]), vec![]));
        assert_eq!(
            echo(&[3, 2, 1], 16),
            (Some(vec![3, 2, 1]), vec![vec![3, 2, 1], vec![3, 2, 1]])
        );
        // An answer larger than the room goes to the sink.
        assert_eq!(echo(&[1; 20], 16), (None, vec![vec![1; 20]]));
    }

    fn worker_ctx() -> WorkerCtx {
        WorkerCtx {
            iface: PluginIface::default(),
            domain_iface: DomainLookupsIface {
                addr_lookup: None,
                seg_lookup: None,
                memh_lookup: None,
                mkey_lookup: None,
            },
            plugin_ctx: ptr::null_mut(),
        }
    }

    fn native<P: Plugin>(asked: u64) -> NativeIface {
        let mut iface = NativeIface {
            version: asked,
            command: None,
            progress: None,
            arm: None,
            command_reply: None,
        };
        // SAFETY: a readable and writable interface of the newest version.
        let status = unsafe { get_native_iface::<P>(&mut iface) };
        assert_eq!(Status::from_raw(status), Status::Success);
        iface
    }

    /// Arms the plugin through its native entry point: the status and the descriptors.
    fn arm(arm: NativeArmFn, ctx: &mut WorkerCtx) -> (Status, Vec<i32>) {
        let mut fds = [-1; NATIVE_MAX_WAKE_FDS];
        let mut count = usize::MAX;
        // SAFETY: the context `open` succeeded on, room for the descriptors and the count.
        let status = unsafe { arm(ctx, fds.as_mut_ptr(), fds.len(), &mut count) };
        (Status::from_raw(status), fds[..count].to_vec())
    }

    #[test]
    fn a_worker_of_version_1_gets_version_1_and_nothing_past_it() {
        // An older worker leaves the version word 0 and has no room past `progress`: the
        // plugin must leave those bytes alone.
        let untouched: NativeArmFn = native_arm::<Plain>;
        let mut iface = NativeIface {
            version: 0,
            command: None,
            progress: None,
            arm: Some(untouched),
            command_reply: None,
        };
        // SAFETY: a readable and writable interface (larger than version 1 needs).
        let status = unsafe { get_native_iface::<Waker>(&mut iface) };
        assert_eq!(Status::from_raw(status), Status::Success);
        assert_eq!(iface.version, 1);
        assert!(iface.command.is_some() && iface.progress.is_some());
        assert_eq!(iface.arm.map(|f| f as usize), Some(untouched as usize));
    }

    #[test]
    fn a_worker_of_version_2_gets_arm_and_nothing_past_it() {
        let untouched: NativeCommandReplyFn = native_command_reply::<Plain>;
        let mut iface = NativeIface {
            version: 2,
            command: None,
            progress: None,
            arm: None,
            command_reply: Some(untouched),
        };
        // SAFETY: a readable and writable interface (larger than version 2 needs).
        let status = unsafe { get_native_iface::<Waker>(&mut iface) };
        assert_eq!(Status::from_raw(status), Status::Success);
        assert_eq!(iface.version, 2);
        assert!(iface.arm.is_some());
        assert_eq!(
            iface.command_reply.map(|f| f as usize),
            Some(untouched as usize)
        );
    }

    #[test]
    fn a_worker_of_version_3_gets_command_reply() {
        let iface = native::<Waker>(NATIVE_IFACE_VERSION);
        assert_eq!(iface.version, 3);
        assert!(iface.arm.is_some() && iface.command_reply.is_some());
        // A newer worker gets the newest this plugin has.
        assert_eq!(native::<Waker>(7).version, NATIVE_IFACE_VERSION);
    }

    #[test]
    fn arm_gives_the_plugins_descriptors_or_says_work_waits() {
        let iface = native::<Waker>(NATIVE_IFACE_VERSION);
        let mut ctx = worker_ctx();
        // SAFETY: a valid context, opened once and closed below.
        assert_eq!(unsafe { open::<Waker>(&mut ctx) }, Status::Success.raw());
        // SAFETY: `open::<Waker>` set it.
        let event = unsafe { &*ctx.plugin_ctx.cast::<Instance<Waker>>() }
            .plugin
            .event
            .as_raw_fd();
        let (status, fds) = arm(iface.arm.unwrap(), &mut ctx);
        assert_eq!((status, fds), (Status::Success, vec![event]));

        // SAFETY: as above; nothing else refers to the instance now.
        unsafe { &mut *ctx.plugin_ctx.cast::<Instance<Waker>>() }
            .plugin
            .busy = true;
        let (status, fds) = arm(iface.arm.unwrap(), &mut ctx);
        assert_eq!((status, fds), (Status::Again, vec![]));
        // SAFETY: the context `open` succeeded on, closed once.
        unsafe { close::<Waker>(&mut ctx) };
    }

    #[test]
    fn a_plugin_that_keeps_the_default_cannot_wake_its_worker() {
        let iface = native::<Plain>(NATIVE_IFACE_VERSION);
        let mut ctx = worker_ctx();
        // SAFETY: a valid context, opened once and closed below.
        assert_eq!(unsafe { open::<Plain>(&mut ctx) }, Status::Success.raw());
        let (status, fds) = arm(iface.arm.unwrap(), &mut ctx);
        assert_eq!((status, fds), (Status::NotSupported, vec![]));
        // SAFETY: the context `open` succeeded on, closed once.
        unsafe { close::<Plain>(&mut ctx) };
    }

    #[test]
    fn arm_refuses_a_null_count() {
        let iface = native::<Waker>(NATIVE_IFACE_VERSION);
        let mut ctx = worker_ctx();
        // SAFETY: a valid context, opened once and closed below.
        assert_eq!(unsafe { open::<Waker>(&mut ctx) }, Status::Success.raw());
        let mut fds = [-1; 1];
        let arm = iface.arm.unwrap();
        // SAFETY: the entry point checks the null count itself.
        let status = unsafe { arm(&mut ctx, fds.as_mut_ptr(), 1, ptr::null_mut()) };
        assert_eq!(Status::from_raw(status), Status::InvalidValue);
        // SAFETY: the context `open` succeeded on, closed once.
        unsafe { close::<Waker>(&mut ctx) };
    }
}
