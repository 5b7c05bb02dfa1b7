//! The domain lookups a worker gives its plugins (`urom_worker_ctx.domain_iface`), answered
//! from the domain table the worker's host sent it.
//!
//! A lookup receives nothing but the plugin's context pointer. The worker therefore hands each
//! plugin a pointer to the `ctx` field of a larger `#[repr(C)]` struct, [`WorkerCtxExt`], whose
//! first field it is; the lookups reach the plugin's name and the table through it.
//!
//! What a lookup returns points into a table; a table the worker replaces is kept until the
//! plugin closes, so that what plugins looked up stays valid for as long as they may hold it.

use core::ffi::c_void;
use core::ptr;
use std::sync::Arc;

use super::DocaError;
use super::{DomainLookupsIface, NATIVE_DOMAIN_VERSION, NativeDomainIface, WorkerCtx, guard};
use crate::domain::DomainTable;
use urom_wire::Status;

/// What the worker keeps for one plugin instance: the context the plugin sees, then the
/// domain state its lookups read.
#[repr(C)]
pub(crate) struct WorkerCtxExt {
    /// What the plugin sees. First, so that a pointer to it is a pointer to the whole.
    pub(crate) ctx: WorkerCtx,
    /// The plugin's name and the domain table, for the lookups.
    pub(crate) domain: DomainSlot,
}

/// A plugin's view of its worker's domain.
pub(crate) struct DomainSlot {
    /// The plugin's name (its file name without `.so`): the name its address goes by in a
    /// table.
    name: Box<str>,
    /// The current table, once a host started a domain.
    table: Option<Arc<DomainTable>>,
    /// Tables replaced since: kept so that what plugins looked up in them stays valid.
    retired: Vec<Arc<DomainTable>>,
    /// The plugin's own member in the current table, when its address names one.
    self_id: Option<u64>,
}

impl DomainSlot {
    pub(crate) fn new(name: &str) -> Self {
        Self {
            name: name.into(),
            table: None,
            retired: Vec::new(),
            self_id: None,
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Answers lookups from `table` from now on; `own_address` is what the plugin's `addr`
    /// gives, which names its own member (none when it is empty or names none).
    pub(crate) fn set(&mut self, table: Arc<DomainTable>, own_address: &[u8]) {
        self.self_id = if own_address.is_empty() {
            None
        } else {
            table.member_with_address(&self.name, own_address)
        };
        if let Some(old) = self.table.replace(table) {
            self.retired.push(old);
        }
    }

    /// The plugin's own domain id in the current table.
    pub(crate) fn self_id(&self) -> Option<u64> {
        self.self_id
    }

    fn table(&self) -> Result<&DomainTable, Status> {
        // No domain started yet: every domain id is unknown.
        self.table.as_deref().ok_or(Status::NotFound)
    }
}

/// The lookups of every plugin a urom worker runs.
pub(crate) const LOOKUPS: DomainLookupsIface = DomainLookupsIface {
    addr_lookup: Some(addr_lookup),
    seg_lookup: Some(seg_lookup),
    memh_lookup: Some(memh_lookup),
    mkey_lookup: Some(mkey_lookup),
};

/// What a urom worker hands SDK plugins.
pub(crate) const NATIVE_DOMAIN: NativeDomainIface = NativeDomainIface {
    version: NATIVE_DOMAIN_VERSION,
    addr_lookup: Some(native_addr_lookup),
    self_lookup: Some(native_self_lookup),
    host_memory_lookup: Some(native_host_memory_lookup),
};

/// The domain state behind `ctx`, or `None` for a null context.
///
/// # Safety
/// `ctx` is null or the `ctx` field of a live [`WorkerCtxExt`], reached through a pointer to
/// the whole struct, that nothing mutates while the returned reference lives (the worker
/// changes it only between calls into the plugin).
unsafe fn slot<'a>(ctx: *mut WorkerCtx) -> Option<&'a DomainSlot> {
    if ctx.is_null() {
        return None;
    }
    let ext = ctx.cast::<WorkerCtxExt>();
    // SAFETY: `ctx` is the first field of a live `WorkerCtxExt` (caller), so `ext` points to
    // it, and nothing mutates it meanwhile (caller).
    Some(unsafe { &(*ext).domain })
}

/// Stores `value` through `out` when it is not null.
///
/// # Safety
/// `out` is null or points to a writable `T`.
unsafe fn store<T>(out: *mut T, value: T) {
    if !out.is_null() {
        // SAFETY: non-null and writable (caller).
        unsafe { out.write(value) };
    }
}

/// What a lookup found, or why not: `DOCA_ERROR_INVALID_VALUE` for a null context or output
/// (`outputs_present` false), else what `find` says of the context's table.
fn look_up<'a, T>(
    ctx: *mut WorkerCtx,
    outputs_present: bool,
    find: impl FnOnce(&'a DomainSlot, &'a DomainTable) -> Result<T, Status>,
) -> Result<T, Status> {
    if !outputs_present {
        return Err(Status::InvalidValue);
    }
    // SAFETY: the plugin ABI: `ctx` is null or the context the worker gave the plugin, which
    // the worker leaves alone while the plugin runs.
    let slot = unsafe { slot(ctx) }.ok_or(Status::InvalidValue)?;
    find(slot, slot.table()?)
}

/// `bytes` as the `void *` a lookup returns; what it points to must not be written.
fn out_ptr(bytes: &[u8]) -> *mut c_void {
    bytes.as_ptr().cast_mut().cast()
}

/// The status of a lookup's result.
fn status_of<T>(found: &Result<T, Status>) -> Status {
    match found {
        Ok(_) => Status::Success,
        Err(status) => *status,
    }
}

unsafe extern "C" fn addr_lookup(
    ctx: *mut WorkerCtx,
    domain_id: u64,
    addr: *mut *mut c_void,
) -> DocaError {
    guard("addr_lookup", || {
        let found = look_up(ctx, !addr.is_null(), |slot, table| {
            table.address(slot.name(), domain_id)
        });
        let value = found.as_ref().map_or(ptr::null_mut(), |a| out_ptr(a));
        // SAFETY: the ABI: `addr` is null or a writable pointer.
        unsafe { store(addr, value) };
        status_of(&found)
    })
}

unsafe extern "C" fn seg_lookup(
    ctx: *mut WorkerCtx,
    domain_id: u64,
    va: u64,
    seg: *mut i32,
) -> DocaError {
    guard("seg_lookup", || {
        let found = look_up(ctx, !seg.is_null(), |_, table| table.segment(domain_id, va));
        // SAFETY: the ABI: `seg` is null or a writable int.
        unsafe { store(seg, *found.as_ref().unwrap_or(&-1)) };
        status_of(&found)
    })
}

/// A lookup of a segment's packed key: `which` picks it from the table.
fn key_lookup(
    ctx: *mut WorkerCtx,
    domain_id: u64,
    seg: i32,
    len: *mut usize,
    out: *mut *mut c_void,
    which: for<'t> fn(&'t DomainTable, u64, i32) -> Result<&'t [u8], Status>,
) -> Status {
    let found = look_up(ctx, !len.is_null() && !out.is_null(), |_, table| {
        which(table, domain_id, seg)
    });
    let (value, bytes) = found
        .as_ref()
        .map_or((ptr::null_mut(), 0), |key| (out_ptr(key), key.len()));
    // SAFETY: the ABI: `len` is null or a writable size_t.
    unsafe { store(len, bytes) };
    // SAFETY: the ABI: `out` is null or a writable pointer.
    unsafe { store(out, value) };
    status_of(&found)
}

unsafe extern "C" fn memh_lookup(
    ctx: *mut WorkerCtx,
    domain_id: u64,
    seg: i32,
    len: *mut usize,
    memh: *mut *mut c_void,
) -> DocaError {
    guard("memh_lookup", || {
        key_lookup(ctx, domain_id, seg, len, memh, DomainTable::memory_handle)
    })
}

unsafe extern "C" fn mkey_lookup(
    ctx: *mut WorkerCtx,
    domain_id: u64,
    seg: i32,
    len: *mut usize,
    rkey: *mut *mut c_void,
) -> DocaError {
    guard("mkey_lookup", || {
        key_lookup(ctx, domain_id, seg, len, rkey, DomainTable::remote_key)
    })
}

unsafe extern "C" fn native_addr_lookup(
    ctx: *mut WorkerCtx,
    domain_id: u64,
    addr: *mut *const u8,
    len: *mut usize,
) -> DocaError {
    guard("native addr_lookup", || {
        address_lookup(ctx, addr, len, |slot, table| {
            table.address(slot.name(), domain_id)
        })
    })
}

unsafe extern "C" fn native_host_memory_lookup(
    ctx: *mut WorkerCtx,
    domain_id: u64,
    addr: *mut *const u8,
    len: *mut usize,
) -> DocaError {
    guard("native host_memory_lookup", || {
        address_lookup(ctx, addr, len, |_, table| {
            table.host_memory_address(domain_id)
        })
    })
}

unsafe extern "C" fn native_self_lookup(ctx: *mut WorkerCtx, domain_id: *mut u64) -> DocaError {
    guard("native self_lookup", || {
        let found = look_up(ctx, !domain_id.is_null(), |slot, _| {
            slot.self_id().ok_or(Status::NotFound)
        });
        // SAFETY: the native ABI: `domain_id` is null or a writable u64.
        unsafe { store(domain_id, *found.as_ref().unwrap_or(&0)) };
        status_of(&found)
    })
}

/// An address lookup with a length: `find` picks the address from the context's table.
fn address_lookup<'a>(
    ctx: *mut WorkerCtx,
    addr: *mut *const u8,
    len: *mut usize,
    find: impl FnOnce(&'a DomainSlot, &'a DomainTable) -> Result<&'a [u8], Status>,
) -> Status {
    {
        let found = look_up(ctx, !addr.is_null() && !len.is_null(), find);
        let (value, bytes) = found.as_ref().map_or((ptr::null(), 0), |address| {
            (address.as_ptr(), address.len())
        });
        // SAFETY: the native ABI: `len` is null or a writable size_t.
        unsafe { store(len, bytes) };
        // SAFETY: the native ABI: `addr` is null or a writable pointer.
        unsafe { store(addr, value) };
        status_of(&found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::PluginIface;

    fn ext(name: &str) -> Box<WorkerCtxExt> {
        Box::new(WorkerCtxExt {
            ctx: WorkerCtx {
                iface: PluginIface::default(),
                domain_iface: LOOKUPS,
                plugin_ctx: ptr::null_mut(),
            },
            domain: DomainSlot::new(name),
        })
    }

    fn ctx_of(ext: &mut WorkerCtxExt) -> *mut WorkerCtx {
        let whole: *mut WorkerCtxExt = ext;
        whole.cast()
    }

    /// What each lookup answered about (`id`, `va`, `seg`), with outputs that start non-zero:
    /// statuses, then the address, segment, memh and mkey they returned.
    #[allow(clippy::type_complexity)]
    fn lookups(
        ctx: *mut WorkerCtx,
        id: u64,
        va: u64,
        seg: i32,
    ) -> (
        [Status; 4],
        Option<Vec<u8>>,
        i32,
        Option<Vec<u8>>,
        Option<Vec<u8>>,
    ) {
        let mut addr: *mut c_void = ptr::NonNull::dangling().as_ptr();
        let mut index = 99i32;
        let (mut memh, mut memh_len) = (ptr::NonNull::<c_void>::dangling().as_ptr(), 99usize);
        let (mut rkey, mut rkey_len) = (ptr::NonNull::<c_void>::dangling().as_ptr(), 99usize);
        let statuses = [
            // SAFETY: the outputs are valid; `ctx` is null or an ext context.
            unsafe { addr_lookup(ctx, id, &mut addr) },
            // SAFETY: as above.
            unsafe { seg_lookup(ctx, id, va, &mut index) },
            // SAFETY: as above.
            unsafe { memh_lookup(ctx, id, seg, &mut memh_len, &mut memh) },
            // SAFETY: as above.
            unsafe { mkey_lookup(ctx, id, seg, &mut rkey_len, &mut rkey) },
        ]
        .map(Status::from_raw);
        let bytes = |p: *mut c_void, len: usize| {
            // SAFETY: a successful lookup returns `len` readable bytes.
            (!p.is_null())
                .then(|| unsafe { core::slice::from_raw_parts(p.cast::<u8>(), len) }.to_vec())
        };
        let address = (!addr.is_null()).then(|| {
            // SAFETY: the test's addresses end with a NUL.
            unsafe { core::ffi::CStr::from_ptr(addr.cast()) }
                .to_bytes()
                .to_vec()
        });
        if memh.is_null() {
            assert_eq!(memh_len, 0);
        }
        if rkey.is_null() {
            assert_eq!(rkey_len, 0);
        }
        (
            statuses,
            address,
            index,
            bytes(memh, memh_len),
            bytes(rkey, rkey_len),
        )
    }

    const NOT_FOUND: [Status; 4] = [Status::NotFound; 4];

    #[test]
    fn without_a_domain_every_lookup_is_not_found_and_clears_its_outputs() {
        let mut ext = ext("worker_sandbox");
        assert_eq!(
            lookups(ctx_of(&mut ext), 7, 0x1000, 0),
            (NOT_FOUND, None, -1, None, None)
        );
    }

    #[test]
    fn a_null_context_or_output_is_an_invalid_value() {
        assert_eq!(
            lookups(ptr::null_mut(), 7, 0, 0),
            ([Status::InvalidValue; 4], None, -1, None, None)
        );
        let mut ext = ext("worker_sandbox");
        ext.domain.set(
            Arc::new(DomainTable::parse(&crate::domain::tests::three_ranks()).unwrap()),
            b"",
        );
        let ctx = ctx_of(&mut ext);
        let mut len = 5usize;
        let mut out: *mut c_void = ptr::NonNull::dangling().as_ptr();
        let null_ptr = ptr::null_mut::<*mut c_void>();
        let statuses = [
            // SAFETY: every pointer is null or valid.
            unsafe { addr_lookup(ctx, 10, null_ptr) },
            // SAFETY: as above.
            unsafe { seg_lookup(ctx, 10, 0x1000, ptr::null_mut()) },
            // SAFETY: as above.
            unsafe { memh_lookup(ctx, 10, 0, ptr::null_mut(), &mut out) },
            // SAFETY: as above.
            unsafe { mkey_lookup(ctx, 10, 0, &mut len, null_ptr) },
        ];
        assert_eq!(statuses, [Status::InvalidValue.raw(); 4]);
        // The outputs that were given are cleared.
        assert!(out.is_null());
        assert_eq!(len, 0);
    }

    #[test]
    fn lookups_answer_from_the_table_for_the_plugins_own_name() {
        let with_nul = |text: &str| {
            let mut bytes = text.as_bytes().to_vec();
            bytes.push(0);
            bytes
        };
        // Addresses with a NUL so the test can read them back as C strings.
        let sandbox = [
            ("worker_sandbox", with_nul("sandbox-10")),
            ("worker_graph", with_nul("graph-10")),
        ];
        let plugins: Vec<_> = sandbox
            .iter()
            .map(|(name, address)| urom_wire::domain::PluginAddress {
                name,
                address: address.as_slice(),
            })
            .collect();
        let members = [urom_wire::domain::MemberSpec {
            domain_id: 10,
            plugins: &plugins,
        }];
        let buffers = [urom_wire::domain::Buffer {
            va: 0x1000,
            len: 0x100,
            memh: b"",
            mkey: b"mkey-0",
        }];
        let bytes = crate::domain::tests::table(&[urom_wire::domain::RecordSpec {
            rank: 0,
            members: &members,
            buffers: &buffers,
        }]);
        let table = Arc::new(DomainTable::parse(&bytes).unwrap());
        let mut sandbox_ext = ext("worker_sandbox");
        let mut graph_ext = ext("worker_graph");
        let mut other_ext = ext("worker_other");
        for ext in [&mut sandbox_ext, &mut graph_ext, &mut other_ext] {
            ext.domain.set(Arc::clone(&table), b"");
        }
        let (statuses, address, seg, memh, mkey) = lookups(ctx_of(&mut sandbox_ext), 10, 0x10ff, 0);
        assert_eq!(
            statuses,
            [
                Status::Success,
                Status::Success,
                Status::NotSupported,
                Status::Success
            ]
        );
        assert_eq!(address.as_deref(), Some(&b"sandbox-10"[..]));
        assert_eq!((seg, memh), (0, None));
        assert_eq!(mkey.as_deref(), Some(&b"mkey-0"[..]));
        let graph = lookups(ctx_of(&mut graph_ext), 10, 0x2000, 1);
        assert_eq!(graph.0[..2], [Status::Success, Status::NotFound]);
        assert_eq!(graph.1.as_deref(), Some(&b"graph-10"[..]));
        assert_eq!(graph.0[2..], [Status::NotFound; 2]);
        // A plugin the member does not run has no address there.
        assert_eq!(
            lookups(ctx_of(&mut other_ext), 10, 0, 5).0[0],
            Status::NotFound
        );
        // Unknown ids.
        assert_eq!(
            lookups(ctx_of(&mut sandbox_ext), 11, 0x1000, 0),
            (NOT_FOUND, None, -1, None, None)
        );

        // The native lookup gives the length too.
        let mut ptr_out: *const u8 = ptr::null();
        let mut len = 0usize;
        let ctx = ctx_of(&mut sandbox_ext);
        // SAFETY: valid outputs, an ext context.
        let status = unsafe { native_addr_lookup(ctx, 10, &mut ptr_out, &mut len) };
        assert_eq!(Status::from_raw(status), Status::Success);
        // SAFETY: the lookup returned `len` bytes.
        let found = unsafe { core::slice::from_raw_parts(ptr_out, len) };
        assert_eq!(found, b"sandbox-10\0");
        // SAFETY: as above.
        let status = unsafe { native_addr_lookup(ctx, 12, &mut ptr_out, &mut len) };
        assert_eq!(Status::from_raw(status), Status::NotFound);
        assert!(ptr_out.is_null());
        assert_eq!(len, 0);

        // A replaced table stays alive for what was looked up in it.
        let old = lookups(ctx_of(&mut sandbox_ext), 10, 0, 0).1;
        sandbox_ext.domain.set(
            Arc::new(DomainTable::parse(&crate::domain::tests::three_ranks()).unwrap()),
            b"",
        );
        assert_eq!(sandbox_ext.domain.retired.len(), 1);
        assert_eq!(old.as_deref(), Some(&b"sandbox-10"[..]));
        let new = lookups(ctx_of(&mut sandbox_ext), 20, 0x1000, 0);
        assert_eq!(new.0[0], Status::Success);
    }

    #[test]
    fn native_lookups_name_the_plugins_own_member_and_its_hosts_memory() {
        use urom_wire::domain::{MemberSpec, PluginAddress, RecordSpec};
        let plugins = [
            PluginAddress {
                name: crate::domain::HOST_MEMORY_NAME,
                address: b"host-0",
            },
            PluginAddress {
                name: "worker_sandbox",
                address: b"me",
            },
        ];
        let members = [MemberSpec {
            domain_id: 7,
            plugins: &plugins,
        }];
        let bytes = crate::domain::tests::table(&[RecordSpec {
            rank: 0,
            members: &members,
            buffers: &[],
        }]);
        let mut ext = ext("worker_sandbox");
        let ctx = ctx_of(&mut ext);
        let mut id = 99u64;
        // SAFETY: a live context and a valid output.
        let status = unsafe { native_self_lookup(ctx, &mut id) };
        assert_eq!(Status::from_raw(status), Status::NotFound);

        ext.domain
            .set(Arc::new(DomainTable::parse(&bytes).unwrap()), b"me");
        let ctx = ctx_of(&mut ext);
        // SAFETY: as above.
        let status = unsafe { native_self_lookup(ctx, &mut id) };
        assert_eq!(Status::from_raw(status), Status::Success);
        assert_eq!(id, 7);
        let (mut addr, mut len) = (ptr::null(), 0usize);
        // SAFETY: a live context and valid outputs.
        let status = unsafe { native_host_memory_lookup(ctx, 7, &mut addr, &mut len) };
        assert_eq!(Status::from_raw(status), Status::Success);
        // SAFETY: the lookup returned `len` bytes.
        assert_eq!(unsafe { core::slice::from_raw_parts(addr, len) }, b"host-0");
        // SAFETY: as above.
        let status = unsafe { native_host_memory_lookup(ctx, 8, &mut addr, &mut len) };
        assert_eq!(Status::from_raw(status), Status::NotFound);
        // SAFETY: a null output is refused.
        let status = unsafe { native_self_lookup(ctx, ptr::null_mut()) };
        assert_eq!(Status::from_raw(status), Status::InvalidValue);

        // An address that names no member: no own id.
        ext.domain.set(
            Arc::new(DomainTable::parse(&bytes).unwrap()),
            b"someone else",
        );
        let ctx = ctx_of(&mut ext);
        // SAFETY: as above.
        let status = unsafe { native_self_lookup(ctx, &mut id) };
        assert_eq!(Status::from_raw(status), Status::NotFound);
    }
}
