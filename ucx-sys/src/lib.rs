//! Hand-written bindings to UCX (1.13 and newer): the part of UCP (and two UCS helpers) that urom's
//! UCX transport uses, and nothing more.
//!
//! * context: [`ucp_config_read`], [`ucp_config_modify`], [`ucp_init_version`] (`ucp_init` is an
//!   inline function in the headers);
//! * workers: create, destroy, query the address, progress, sleep ([`ucp_worker_get_efd`],
//!   [`ucp_worker_arm`]), active-message handlers;
//! * listeners: create on a socket address, query the port, reject;
//! * endpoints: create (from a socket address, a worker address or a connection request),
//!   flush, close;
//! * active messages: [`ucp_am_send_nbx`], [`ucp_am_recv_data_nbx`]; requests;
//! * tagged messages: [`ucp_tag_send_nbx`], [`ucp_tag_recv_nbx`];
//! * memory: [`ucp_mem_map`], remote keys ([`ucp_rkey_pack`], [`ucp_ep_rkey_unpack`]) and
//!   remote memory access ([`ucp_get_nbx`], [`ucp_put_nbx`]).
//!
//! The library comes from `UCX_DIR` (a prefix holding `include/` and `lib/`) when set, else
//! from pkg-config (`ucx >= 1.13`, Debian's `libucx-dev`); `README.md` says more. The build
//! script reads the version from the headers ([`VERSION`]), compiles a small C program against
//! them and turns what it prints into `const` assertions on every struct, field, type and
//! constant bound here, so a UCX whose layout differs fails the build with a message naming the
//! struct and field.
//!
//! What newer versions added is bound only when the headers have it: the crate is compiled with
//! `cfg(ucx_1_N)` for every minor version 1.N from 1.14 up to the one found. The structs UCX
//! grew at their ends carry the new fields for that version (so that they have the size UCX
//! reads); build them with `..Default::default()` (all zero) so that code compiles against
//! every version. [`HAS_EXPORTED_MEMH`] and [`HAS_AM_SEND_FLAG_COPY_HEADER`] say what the
//! version offers; `check_runtime_version` refuses a library older than the headers.
//!
//! Without UCX installed the crate still builds (with a warning) but links nothing, so that a
//! workspace-wide build needs no UCX; the `required` feature makes a missing UCX a build
//! error instead.
//!
//! Names, types and layouts follow the C headers (`ucp/api/ucp.h`, `ucp/api/ucp_def.h`); the
//! documentation there is the reference. Everything here is `unsafe` FFI.

#![allow(non_camel_case_types)]
#![allow(missing_docs)]
#![no_std]

extern crate alloc;

use alloc::format;
use alloc::string::String;
use core::ffi::{c_char, c_int, c_uint, c_void};
use core::marker::{PhantomData, PhantomPinned};

/// What the layout check needs besides the standard library.
#[doc(hidden)]
pub mod layout {
    /// The size of `$ty`'s field `$field`, in a `const` context.
    #[doc(hidden)]
    #[macro_export]
    macro_rules! __ucx_sys_field_size {
        ($ty:ty, $field:ident) => {{
            const fn pointee_size<F>(_: *const F) -> usize {
                ::core::mem::size_of::<F>()
            }
            let value = ::core::mem::MaybeUninit::<$ty>::uninit();
            let base = value.as_ptr();
            // SAFETY: `base` points to a (not initialised) value of the struct, so projecting
            // to one of its fields stays in bounds; nothing is read.
            pointee_size(unsafe { &raw const (*base).$field })
        }};
    }
    pub use crate::__ucx_sys_field_size as field_size;
}

include!(concat!(env!("OUT_DIR"), "/layout_check.rs"));
include!(concat!(env!("OUT_DIR"), "/version.rs"));

/// Whether the headers declare exported memory handles: `ucp_memh_pack` with
/// `UCP_MEMH_PACK_FLAG_EXPORT`, `UCP_FEATURE_EXPORTED_MEMH` and
/// `ucp_mem_map_params_t::exported_memh_buffer` (UCX >= 1.14; bound only then, so not linked
/// here). Declared is not implemented:
/// UCX implements export from 1.15, and only on transports that support it (mlx5 with xGVMI);
/// elsewhere packing for export answers `UCS_ERR_UNSUPPORTED`.
pub const HAS_EXPORTED_MEMH: bool = cfg!(ucx_1_14);
/// Whether the headers have `UCP_AM_SEND_FLAG_COPY_HEADER` (UCX >= 1.14; bound only then).
pub const HAS_AM_SEND_FLAG_COPY_HEADER: bool = cfg!(ucx_1_14);

macro_rules! opaque {
    ($($name:ident),+) => {$(
        /// An opaque UCX object, only ever behind a pointer.
        #[repr(C)]
        pub struct $name {
            _private: [u8; 0],
            _marker: PhantomData<(*mut u8, PhantomPinned)>,
        }
    )+};
}

opaque!(
    ucp_context,
    ucp_config,
    ucp_worker,
    ucp_ep,
    ucp_listener,
    ucp_conn_request,
    ucp_address,
    ucp_mem,
    ucp_rkey
);

pub type ucp_context_h = *mut ucp_context;
pub type ucp_config_t = ucp_config;
pub type ucp_worker_h = *mut ucp_worker;
pub type ucp_ep_h = *mut ucp_ep;
pub type ucp_listener_h = *mut ucp_listener;
pub type ucp_conn_request_h = *mut ucp_conn_request;
pub type ucp_address_t = ucp_address;
pub type ucp_mem_h = *mut ucp_mem;
pub type ucp_rkey_h = *mut ucp_rkey;
pub type ucp_tag_t = u64;

/// `ucs_status_t`: a packed enum, one byte.
pub type ucs_status_t = i8;
/// A request handle, NULL (done), or a status in disguise; see [`status_ptr`].
pub type ucs_status_ptr_t = *mut c_void;
pub type ucs_thread_mode_t = c_uint;
pub type ucp_err_handling_mode_t = c_uint;
pub type ucs_memory_type_t = c_uint;
pub type ucp_datatype_t = u64;
pub type socklen_t = libc::socklen_t;

/// `ucs_cpu_set_t`: 1024 bits.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ucs_cpu_set_t {
    pub ucs_bits: [libc::c_ulong; 1024 / (8 * core::mem::size_of::<libc::c_ulong>())],
}

pub const UCS_OK: ucs_status_t = 0;
pub const UCS_INPROGRESS: ucs_status_t = 1;
pub const UCS_ERR_NO_MESSAGE: ucs_status_t = -1;
pub const UCS_ERR_NO_RESOURCE: ucs_status_t = -2;
pub const UCS_ERR_IO_ERROR: ucs_status_t = -3;
pub const UCS_ERR_UNREACHABLE: ucs_status_t = -6;
pub const UCS_ERR_MESSAGE_TRUNCATED: ucs_status_t = -9;
pub const UCS_ERR_BUSY: ucs_status_t = -15;
pub const UCS_ERR_CANCELED: ucs_status_t = -16;
pub const UCS_ERR_TIMED_OUT: ucs_status_t = -20;
pub const UCS_ERR_UNSUPPORTED: ucs_status_t = -22;
pub const UCS_ERR_REJECTED: ucs_status_t = -23;
pub const UCS_ERR_NOT_CONNECTED: ucs_status_t = -24;
pub const UCS_ERR_CONNECTION_RESET: ucs_status_t = -25;
pub const UCS_ERR_ENDPOINT_TIMEOUT: ucs_status_t = -80;
pub const UCS_ERR_LAST: ucs_status_t = -100;

pub const UCS_THREAD_MODE_SINGLE: ucs_thread_mode_t = 0;
pub const UCS_THREAD_MODE_SERIALIZED: ucs_thread_mode_t = 1;
pub const UCS_THREAD_MODE_MULTI: ucs_thread_mode_t = 2;

pub const UCS_MEMORY_TYPE_HOST: ucs_memory_type_t = 0;

pub const UCP_PARAM_FIELD_FEATURES: u64 = 1 << 0;
pub const UCP_PARAM_FIELD_MT_WORKERS_SHARED: u64 = 1 << 5;
pub const UCP_PARAM_FIELD_NAME: u64 = 1 << 8;
#[cfg(ucx_1_20)]
pub const UCP_PARAM_FIELD_NODE_LOCAL_ID: u64 = 1 << 9;

pub const UCP_FEATURE_TAG: u64 = 1 << 0;
pub const UCP_FEATURE_RMA: u64 = 1 << 1;
pub const UCP_FEATURE_AMO64: u64 = 1 << 3;
pub const UCP_FEATURE_WAKEUP: u64 = 1 << 4;
pub const UCP_FEATURE_AM: u64 = 1 << 6;
/// Asking for it together with RMA where no transport exports memory makes endpoints
/// unreachable (see [`HAS_EXPORTED_MEMH`]).
#[cfg(ucx_1_14)]
pub const UCP_FEATURE_EXPORTED_MEMH: u64 = 1 << 7;

pub const UCP_WORKER_PARAM_FIELD_THREAD_MODE: u64 = 1 << 0;
pub const UCP_WORKER_PARAM_FIELD_NAME: u64 = 1 << 6;

pub const UCP_WORKER_ATTR_FIELD_ADDRESS: u64 = 1 << 1;
pub const UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER: u64 = 1 << 3;

pub const UCP_EP_PARAM_FIELD_REMOTE_ADDRESS: u64 = 1 << 0;
pub const UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE: u64 = 1 << 1;
pub const UCP_EP_PARAM_FIELD_ERR_HANDLER: u64 = 1 << 2;
pub const UCP_EP_PARAM_FIELD_SOCK_ADDR: u64 = 1 << 4;
pub const UCP_EP_PARAM_FIELD_FLAGS: u64 = 1 << 5;
pub const UCP_EP_PARAM_FIELD_CONN_REQUEST: u64 = 1 << 6;
pub const UCP_EP_PARAM_FIELD_NAME: u64 = 1 << 7;

pub const UCP_EP_PARAMS_FLAGS_CLIENT_SERVER: c_uint = 1 << 0;

pub const UCP_ERR_HANDLING_MODE_NONE: ucp_err_handling_mode_t = 0;
pub const UCP_ERR_HANDLING_MODE_PEER: ucp_err_handling_mode_t = 1;

pub const UCP_EP_CLOSE_FLAG_FORCE: u32 = 1 << 0;

pub const UCP_LISTENER_PARAM_FIELD_SOCK_ADDR: u64 = 1 << 0;
pub const UCP_LISTENER_PARAM_FIELD_CONN_HANDLER: u64 = 1 << 2;

pub const UCP_LISTENER_ATTR_FIELD_SOCKADDR: u64 = 1 << 0;

pub const UCP_OP_ATTR_FIELD_REQUEST: u32 = 1 << 0;
pub const UCP_OP_ATTR_FIELD_CALLBACK: u32 = 1 << 1;
pub const UCP_OP_ATTR_FIELD_USER_DATA: u32 = 1 << 2;
pub const UCP_OP_ATTR_FIELD_DATATYPE: u32 = 1 << 3;
pub const UCP_OP_ATTR_FIELD_FLAGS: u32 = 1 << 4;
pub const UCP_OP_ATTR_FIELD_MEMORY_TYPE: u32 = 1 << 6;
#[cfg(ucx_1_22)]
pub const UCP_OP_ATTR_FIELD_REMOTE_DATATYPE: u32 = 1 << 9;
#[cfg(ucx_1_22)]
pub const UCP_OP_ATTR_FIELD_REMOTE: u32 = 1 << 10;
#[cfg(ucx_1_22)]
pub const UCP_OP_ATTR_FIELD_REMOTE_COUNT: u32 = 1 << 11;
pub const UCP_OP_ATTR_FLAG_NO_IMM_CMPL: u32 = 1 << 16;
pub const UCP_OP_ATTR_FLAG_FORCE_IMM_CMPL: u32 = 1 << 18;

pub const UCP_AM_HANDLER_PARAM_FIELD_ID: u64 = 1 << 0;
pub const UCP_AM_HANDLER_PARAM_FIELD_FLAGS: u64 = 1 << 1;
pub const UCP_AM_HANDLER_PARAM_FIELD_CB: u64 = 1 << 2;
pub const UCP_AM_HANDLER_PARAM_FIELD_ARG: u64 = 1 << 3;

pub const UCP_AM_FLAG_WHOLE_MSG: u32 = 1 << 0;

pub const UCP_AM_SEND_FLAG_REPLY: u32 = 1 << 0;
pub const UCP_AM_SEND_FLAG_EAGER: u32 = 1 << 1;
pub const UCP_AM_SEND_FLAG_RNDV: u32 = 1 << 2;
#[cfg(ucx_1_14)]
pub const UCP_AM_SEND_FLAG_COPY_HEADER: u32 = 1 << 3;

pub const UCP_AM_RECV_ATTR_FIELD_REPLY_EP: u64 = 1 << 0;
pub const UCP_AM_RECV_ATTR_FLAG_DATA: u64 = 1 << 16;
pub const UCP_AM_RECV_ATTR_FLAG_RNDV: u64 = 1 << 17;

pub const UCP_DATATYPE_CONTIG: ucp_datatype_t = 0;

pub const UCP_MEM_MAP_PARAM_FIELD_ADDRESS: u64 = 1 << 0;
pub const UCP_MEM_MAP_PARAM_FIELD_LENGTH: u64 = 1 << 1;
pub const UCP_MEM_MAP_PARAM_FIELD_FLAGS: u64 = 1 << 2;
pub const UCP_MEM_MAP_PARAM_FIELD_PROT: u64 = 1 << 3;
pub const UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE: u64 = 1 << 4;
#[cfg(ucx_1_14)]
pub const UCP_MEM_MAP_PARAM_FIELD_EXPORTED_MEMH_BUFFER: u64 = 1 << 5;

pub const UCP_MEM_MAP_PROT_LOCAL_READ: c_uint = 1 << 0;
pub const UCP_MEM_MAP_PROT_LOCAL_WRITE: c_uint = 1 << 1;
pub const UCP_MEM_MAP_PROT_REMOTE_READ: c_uint = 1 << 8;
pub const UCP_MEM_MAP_PROT_REMOTE_WRITE: c_uint = 1 << 9;

#[cfg(ucx_1_14)]
pub const UCP_MEMH_PACK_PARAM_FIELD_FLAGS: u64 = 1 << 0;
#[cfg(ucx_1_14)]
pub const UCP_MEMH_PACK_FLAG_EXPORT: u64 = 1 << 0;

pub type ucp_request_init_callback_t = Option<unsafe extern "C" fn(request: *mut c_void)>;
pub type ucp_request_cleanup_callback_t = Option<unsafe extern "C" fn(request: *mut c_void)>;
pub type ucp_err_handler_cb_t =
    Option<unsafe extern "C" fn(arg: *mut c_void, ep: ucp_ep_h, status: ucs_status_t)>;
pub type ucp_listener_accept_callback_t =
    Option<unsafe extern "C" fn(ep: ucp_ep_h, arg: *mut c_void)>;
pub type ucp_listener_conn_callback_t =
    Option<unsafe extern "C" fn(conn_request: ucp_conn_request_h, arg: *mut c_void)>;
pub type ucp_send_nbx_callback_t = Option<
    unsafe extern "C" fn(request: *mut c_void, status: ucs_status_t, user_data: *mut c_void),
>;
pub type ucp_am_recv_data_nbx_callback_t = Option<
    unsafe extern "C" fn(
        request: *mut c_void,
        status: ucs_status_t,
        length: usize,
        user_data: *mut c_void,
    ),
>;
pub type ucp_tag_recv_nbx_callback_t = Option<
    unsafe extern "C" fn(
        request: *mut c_void,
        status: ucs_status_t,
        tag_info: *const ucp_tag_recv_info_t,
        user_data: *mut c_void,
    ),
>;
pub type ucp_am_recv_callback_t = Option<
    unsafe extern "C" fn(
        arg: *mut c_void,
        header: *const c_void,
        header_length: usize,
        data: *mut c_void,
        length: usize,
        param: *const ucp_am_recv_param_t,
    ) -> ucs_status_t,
>;

#[repr(C)]
pub struct ucp_params_t {
    pub field_mask: u64,
    pub features: u64,
    pub request_size: usize,
    pub request_init: ucp_request_init_callback_t,
    pub request_cleanup: ucp_request_cleanup_callback_t,
    pub tag_sender_mask: u64,
    pub mt_workers_shared: c_int,
    pub estimated_num_eps: usize,
    pub estimated_num_ppn: usize,
    pub name: *const c_char,
    /// UCX >= 1.20.
    #[cfg(ucx_1_20)]
    pub node_local_id: usize,
}

#[repr(C)]
pub struct ucp_worker_params_t {
    pub field_mask: u64,
    pub thread_mode: ucs_thread_mode_t,
    pub cpu_mask: ucs_cpu_set_t,
    pub events: c_uint,
    pub user_data: *mut c_void,
    pub event_fd: c_int,
    pub flags: u64,
    pub name: *const c_char,
    pub am_alignment: usize,
    pub client_id: u64,
}

/// `UCP_ENTITY_NAME_MAX`.
pub const UCP_ENTITY_NAME_MAX: usize = 32;

#[repr(C)]
pub struct ucp_worker_attr_t {
    pub field_mask: u64,
    pub thread_mode: ucs_thread_mode_t,
    pub address_flags: u32,
    pub address: *mut ucp_address_t,
    pub address_length: usize,
    pub max_am_header: usize,
    pub name: [c_char; UCP_ENTITY_NAME_MAX],
    pub max_debug_string: usize,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ucs_sock_addr_t {
    pub addr: *const libc::sockaddr,
    pub addrlen: socklen_t,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ucp_err_handler_t {
    pub cb: ucp_err_handler_cb_t,
    pub arg: *mut c_void,
}

#[repr(C)]
pub struct ucp_ep_params_t {
    pub field_mask: u64,
    pub address: *const ucp_address_t,
    pub err_mode: ucp_err_handling_mode_t,
    pub err_handler: ucp_err_handler_t,
    pub user_data: *mut c_void,
    pub flags: c_uint,
    pub sockaddr: ucs_sock_addr_t,
    pub conn_request: ucp_conn_request_h,
    pub name: *const c_char,
    pub local_sockaddr: ucs_sock_addr_t,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ucp_listener_accept_handler_t {
    pub cb: ucp_listener_accept_callback_t,
    pub arg: *mut c_void,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ucp_listener_conn_handler_t {
    pub cb: ucp_listener_conn_callback_t,
    pub arg: *mut c_void,
}

#[repr(C)]
pub struct ucp_listener_params_t {
    pub field_mask: u64,
    pub sockaddr: ucs_sock_addr_t,
    pub accept_handler: ucp_listener_accept_handler_t,
    pub conn_handler: ucp_listener_conn_handler_t,
}

#[repr(C)]
pub struct ucp_listener_attr_t {
    pub field_mask: u64,
    pub sockaddr: libc::sockaddr_storage,
}

#[repr(C)]
pub struct ucp_mem_map_params_t {
    pub field_mask: u64,
    pub address: *mut c_void,
    pub length: usize,
    pub flags: c_uint,
    pub prot: c_uint,
    pub memory_type: ucs_memory_type_t,
    /// UCX >= 1.14.
    #[cfg(ucx_1_14)]
    pub exported_memh_buffer: *const c_void,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ucp_tag_recv_info_t {
    pub sender_tag: ucp_tag_t,
    pub length: usize,
}

/// The callback union of [`ucp_request_param_t`]: which member counts depends on the call.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ucp_request_param_cb {
    pub send: ucp_send_nbx_callback_t,
    pub recv_am: ucp_am_recv_data_nbx_callback_t,
    pub recv: ucp_tag_recv_nbx_callback_t,
}

/// The receive-information union of [`ucp_request_param_t`].
#[repr(C)]
#[derive(Clone, Copy)]
pub union ucp_request_param_recv_info {
    pub length: *mut usize,
    pub tag_info: *mut c_void,
}

#[repr(C)]
pub struct ucp_request_param_t {
    pub op_attr_mask: u32,
    pub flags: u32,
    pub request: *mut c_void,
    pub cb: ucp_request_param_cb,
    pub datatype: ucp_datatype_t,
    pub user_data: *mut c_void,
    pub reply_buffer: *mut c_void,
    pub memory_type: ucs_memory_type_t,
    pub recv_info: ucp_request_param_recv_info,
    pub memh: ucp_mem_h,
    /// UCX >= 1.22.
    #[cfg(ucx_1_22)]
    pub remote_datatype: ucp_datatype_t,
    /// UCX >= 1.22.
    #[cfg(ucx_1_22)]
    pub remote: *const c_void,
    /// UCX >= 1.22.
    #[cfg(ucx_1_22)]
    pub remote_count: usize,
}

#[repr(C)]
pub struct ucp_am_handler_param_t {
    pub field_mask: u64,
    pub id: c_uint,
    pub flags: u32,
    pub cb: ucp_am_recv_callback_t,
    pub arg: *mut c_void,
}

#[repr(C)]
pub struct ucp_am_recv_param_t {
    pub recv_attr: u64,
    pub reply_ep: ucp_ep_h,
}

/// UCX >= 1.14.
#[cfg(ucx_1_14)]
#[repr(C)]
pub struct ucp_memh_pack_params_t {
    pub field_mask: u64,
    pub flags: u64,
}

/// UCX >= 1.14.
#[cfg(ucx_1_14)]
#[repr(C)]
pub struct ucp_memh_buffer_release_params_t {
    pub field_mask: u64,
}

/// `Default` for parameter structs: all zero, i.e. an empty `field_mask` and every field
/// unset, NULL or `None`. Setting the fields named in `field_mask` and taking the rest from
/// `..Default::default()` builds a struct that compiles against every UCX version, whatever
/// fields that version added.
macro_rules! zeroed_default {
    ($($ty:ty),+ $(,)?) => {$(
        impl Default for $ty {
            fn default() -> Self {
                // SAFETY: every field of the struct is an integer, a raw pointer, an
                // `Option` of a function pointer, an array or `repr(C)` struct of those, or a
                // union of pointers: all-zero bytes are a valid value of each (0, NULL, None).
                unsafe { core::mem::zeroed() }
            }
        }
    )+};
}

zeroed_default!(
    ucp_params_t,
    ucp_worker_params_t,
    ucp_worker_attr_t,
    ucp_ep_params_t,
    ucp_listener_params_t,
    ucp_listener_attr_t,
    ucp_mem_map_params_t,
    ucp_request_param_t,
    ucp_am_handler_param_t,
);
#[cfg(ucx_1_14)]
zeroed_default!(ucp_memh_pack_params_t, ucp_memh_buffer_release_params_t);

#[cfg_attr(not(ucx_missing), link(name = "ucp"))]
#[cfg_attr(not(ucx_missing), link(name = "ucs"))]
unsafe extern "C" {
    pub fn ucs_status_string(status: ucs_status_t) -> *const c_char;

    pub fn ucp_get_version(major: *mut c_uint, minor: *mut c_uint, release: *mut c_uint);
    pub fn ucp_config_read(
        env_prefix: *const c_char,
        filename: *const c_char,
        config_p: *mut *mut ucp_config_t,
    ) -> ucs_status_t;
    pub fn ucp_config_modify(
        config: *mut ucp_config_t,
        name: *const c_char,
        value: *const c_char,
    ) -> ucs_status_t;
    pub fn ucp_config_release(config: *mut ucp_config_t);
    pub fn ucp_init_version(
        api_major_version: c_uint,
        api_minor_version: c_uint,
        params: *const ucp_params_t,
        config: *const ucp_config_t,
        context_p: *mut ucp_context_h,
    ) -> ucs_status_t;
    pub fn ucp_cleanup(context_p: ucp_context_h);

    pub fn ucp_worker_create(
        context: ucp_context_h,
        params: *const ucp_worker_params_t,
        worker_p: *mut ucp_worker_h,
    ) -> ucs_status_t;
    pub fn ucp_worker_destroy(worker: ucp_worker_h);
    pub fn ucp_worker_query(worker: ucp_worker_h, attr: *mut ucp_worker_attr_t) -> ucs_status_t;
    pub fn ucp_worker_release_address(worker: ucp_worker_h, address: *mut ucp_address_t);
    pub fn ucp_worker_progress(worker: ucp_worker_h) -> c_uint;
    pub fn ucp_worker_get_efd(worker: ucp_worker_h, fd: *mut c_int) -> ucs_status_t;
    pub fn ucp_worker_arm(worker: ucp_worker_h) -> ucs_status_t;
    pub fn ucp_worker_set_am_recv_handler(
        worker: ucp_worker_h,
        param: *const ucp_am_handler_param_t,
    ) -> ucs_status_t;

    pub fn ucp_listener_create(
        worker: ucp_worker_h,
        params: *const ucp_listener_params_t,
        listener_p: *mut ucp_listener_h,
    ) -> ucs_status_t;
    pub fn ucp_listener_destroy(listener: ucp_listener_h);
    pub fn ucp_listener_query(
        listener: ucp_listener_h,
        attr: *mut ucp_listener_attr_t,
    ) -> ucs_status_t;
    pub fn ucp_listener_reject(
        listener: ucp_listener_h,
        conn_request: ucp_conn_request_h,
    ) -> ucs_status_t;

    pub fn ucp_ep_create(
        worker: ucp_worker_h,
        params: *const ucp_ep_params_t,
        ep_p: *mut ucp_ep_h,
    ) -> ucs_status_t;
    pub fn ucp_ep_close_nbx(ep: ucp_ep_h, param: *const ucp_request_param_t) -> ucs_status_ptr_t;
    pub fn ucp_ep_flush_nbx(ep: ucp_ep_h, param: *const ucp_request_param_t) -> ucs_status_ptr_t;

    pub fn ucp_am_send_nbx(
        ep: ucp_ep_h,
        id: c_uint,
        header: *const c_void,
        header_length: usize,
        buffer: *const c_void,
        count: usize,
        param: *const ucp_request_param_t,
    ) -> ucs_status_ptr_t;
    pub fn ucp_am_recv_data_nbx(
        worker: ucp_worker_h,
        data_desc: *mut c_void,
        buffer: *mut c_void,
        count: usize,
        param: *const ucp_request_param_t,
    ) -> ucs_status_ptr_t;

    pub fn ucp_tag_send_nbx(
        ep: ucp_ep_h,
        buffer: *const c_void,
        count: usize,
        tag: ucp_tag_t,
        param: *const ucp_request_param_t,
    ) -> ucs_status_ptr_t;
    pub fn ucp_tag_recv_nbx(
        worker: ucp_worker_h,
        buffer: *mut c_void,
        count: usize,
        tag: ucp_tag_t,
        tag_mask: ucp_tag_t,
        param: *const ucp_request_param_t,
    ) -> ucs_status_ptr_t;

    pub fn ucp_mem_map(
        context: ucp_context_h,
        params: *const ucp_mem_map_params_t,
        memh_p: *mut ucp_mem_h,
    ) -> ucs_status_t;
    pub fn ucp_mem_unmap(context: ucp_context_h, memh: ucp_mem_h) -> ucs_status_t;
    pub fn ucp_rkey_pack(
        context: ucp_context_h,
        memh: ucp_mem_h,
        rkey_buffer_p: *mut *mut c_void,
        size_p: *mut usize,
    ) -> ucs_status_t;
    pub fn ucp_rkey_buffer_release(rkey_buffer: *mut c_void);
    /// UCX >= 1.14. `params` must set a flag: flags 0 is a fatal error in UCX.
    #[cfg(ucx_1_14)]
    pub fn ucp_memh_pack(
        memh: ucp_mem_h,
        params: *const ucp_memh_pack_params_t,
        buffer_p: *mut *mut c_void,
        buffer_size_p: *mut usize,
    ) -> ucs_status_t;
    /// UCX >= 1.14.
    #[cfg(ucx_1_14)]
    pub fn ucp_memh_buffer_release(
        buffer: *mut c_void,
        params: *const ucp_memh_buffer_release_params_t,
    );
    pub fn ucp_ep_rkey_unpack(
        ep: ucp_ep_h,
        rkey_buffer: *const c_void,
        rkey_p: *mut ucp_rkey_h,
    ) -> ucs_status_t;
    pub fn ucp_rkey_destroy(rkey: ucp_rkey_h);
    pub fn ucp_put_nbx(
        ep: ucp_ep_h,
        buffer: *const c_void,
        count: usize,
        remote_addr: u64,
        rkey: ucp_rkey_h,
        param: *const ucp_request_param_t,
    ) -> ucs_status_ptr_t;
    pub fn ucp_get_nbx(
        ep: ucp_ep_h,
        buffer: *mut c_void,
        count: usize,
        remote_addr: u64,
        rkey: ucp_rkey_h,
        param: *const ucp_request_param_t,
    ) -> ucs_status_ptr_t;
    pub fn ucp_request_cancel(worker: ucp_worker_h, request: *mut c_void);

    pub fn ucp_request_check_status(request: *mut c_void) -> ucs_status_t;
    pub fn ucp_request_free(request: *mut c_void);
}

/// What a [`ucs_status_ptr_t`] holds (the `UCS_PTR_IS_ERR` / `UCS_PTR_STATUS` macros).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusPtr {
    /// NULL: the operation completed at once.
    Done,
    /// The operation failed at once with this status.
    Failed(ucs_status_t),
    /// The operation goes on; the request handle tracks it.
    Request(*mut c_void),
}

/// Decodes a [`ucs_status_ptr_t`].
pub fn status_ptr(ptr: ucs_status_ptr_t) -> StatusPtr {
    let raw = ptr as usize;
    // Errors are the small negative numbers UCS_ERR_LAST..=-1 cast to a pointer.
    if raw == 0 {
        StatusPtr::Done
    } else if raw >= (UCS_ERR_LAST as isize) as usize {
        StatusPtr::Failed(raw as isize as ucs_status_t)
    } else {
        StatusPtr::Request(ptr)
    }
}

/// UCX's text for `status` (a static string).
pub fn status_text(status: ucs_status_t) -> &'static str {
    #[cfg(not(ucx_missing))]
    {
        // SAFETY: ucs_status_string accepts any status and returns a pointer to a static,
        // NUL-terminated string (or NULL, checked below).
        let text = unsafe { ucs_status_string(status) };
        if !text.is_null() {
            // SAFETY: non-NULL, NUL-terminated and static, as above.
            let text = unsafe { core::ffi::CStr::from_ptr(text) };
            if let Ok(text) = text.to_str() {
                return text;
            }
        }
    }
    let _ = status;
    "unknown UCX status"
}

/// The version of the UCP library loaded at run time: `(major, minor, release)`.
#[cfg(not(ucx_missing))]
pub fn version() -> (u32, u32, u32) {
    let (mut major, mut minor, mut release) = (0, 0, 0);
    // SAFETY: the three pointers are valid for writes of a `c_uint` each.
    unsafe { ucp_get_version(&mut major, &mut minor, &mut release) };
    (major, minor, release)
}

/// Whether this build found UCX and links it.
pub const AVAILABLE: bool = cfg!(not(ucx_missing));

/// Checks that the UCX library loaded at run time is not older than the headers this build
/// was compiled against ([`VERSION`]): the structs here have those headers' sizes and the
/// functions their signatures, which an older library does not know. Call it once before
/// creating a context. The error says which library was loaded from where, and what to do.
#[cfg(not(ucx_missing))]
pub fn check_runtime_version() -> Result<(), String> {
    match version_mismatch(VERSION, VERSION_RELEASE, version(), loaded_from) {
        Some(why) => Err(why),
        None => Ok(()),
    }
}

/// The error [`check_runtime_version`] reports when `loaded` is older than `built` (only the
/// API version, major and minor, counts); `path` says where the library came from.
#[cfg_attr(ucx_missing, allow(dead_code))]
fn version_mismatch(
    built: (u32, u32),
    built_release: u32,
    loaded: (u32, u32, u32),
    path: impl FnOnce() -> Option<String>,
) -> Option<String> {
    let (major, minor, release) = loaded;
    if (major, minor) >= built {
        return None;
    }
    let from = path().unwrap_or_else(|| String::from("an unknown path"));
    Some(format!(
        "this build of urom needs UCX >= {}.{} (it was built against {}.{}.{}), but loaded UCX \
         {major}.{minor}.{release} from {from}; set LD_LIBRARY_PATH to the newer UCX's lib \
         directory, or rebuild with UCX_DIR pointing at the UCX to use",
        built.0, built.1, built.0, built.1, built_release
    ))
}

/// The file the UCP library was loaded from, as the dynamic loader names it.
#[cfg(not(ucx_missing))]
fn loaded_from() -> Option<String> {
    let mut info = libc::Dl_info {
        dli_fname: core::ptr::null(),
        dli_fbase: core::ptr::null_mut(),
        dli_sname: core::ptr::null(),
        dli_saddr: core::ptr::null_mut(),
    };
    let function = ucp_get_version as unsafe extern "C" fn(*mut c_uint, *mut c_uint, *mut c_uint);
    // SAFETY: dladdr only looks the address up among the loaded objects; `info` is a valid
    // place for the answer.
    let found = unsafe { libc::dladdr(function as *const c_void, &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr answered with a NUL-terminated file name owned by the loader, valid while
    // the object stays loaded (libucp is never unloaded: the program links it).
    let name = unsafe { core::ffi::CStr::from_ptr(info.dli_fname) };
    Some(String::from(name.to_string_lossy()))
}

#[cfg(all(test, not(ucx_missing)))]
mod tests {
    use super::*;

    #[test]
    fn loads_a_library_as_new_as_the_headers() {
        let (major, minor, release) = version();
        // The test binary's rpath (UCX_DIR) or the system's library: never an older one.
        assert!(
            (major, minor) >= VERSION && VERSION >= (1, 13),
            "loaded UCX {major}.{minor}.{release} from {:?}, built against {VERSION:?}",
            loaded_from()
        );
        assert_eq!(check_runtime_version(), Ok(()));
        let path = loaded_from().expect("dladdr finds libucp");
        assert!(path.contains("libucp"), "{path}");
        extern crate std;
        std::println!(
            "loaded UCX {major}.{minor}.{release} from {path}; built against {VERSION:?}"
        );
    }

    #[test]
    fn refuses_a_library_older_than_the_headers() {
        let path = || Some(String::from("/usr/lib/libucp.so.0"));
        let why = version_mismatch((1, 22), 0, (1, 13, 1), path).expect("older is refused");
        assert!(why.contains("needs UCX >= 1.22"), "{why}");
        assert!(why.contains("built against 1.22.0"), "{why}");
        assert!(
            why.contains("loaded UCX 1.13.1 from /usr/lib/libucp.so.0"),
            "{why}"
        );
        assert!(why.contains("UCX_DIR"), "{why}");
        assert_eq!(version_mismatch((1, 22), 0, (1, 22, 0), path), None);
        assert_eq!(version_mismatch((1, 22), 3, (1, 22, 0), path), None);
        assert_eq!(version_mismatch((1, 13), 1, (1, 22, 0), path), None);
        assert!(version_mismatch((1, 22), 0, (0, 30, 0), path).is_some());
        assert!(version_mismatch((1, 14), 0, (1, 13, 9), || None).is_some());
    }

    #[test]
    fn default_parameters_are_empty() {
        let params = ucp_params_t::default();
        assert_eq!(params.field_mask, 0);
        assert!(params.name.is_null());
        let param = ucp_request_param_t::default();
        assert_eq!(param.op_attr_mask, 0);
        assert!(param.memh.is_null());
        let map = ucp_mem_map_params_t::default();
        assert_eq!(map.field_mask, 0);
        assert!(map.address.is_null());
    }

    #[test]
    fn version_gates_follow_the_headers() {
        assert_eq!(HAS_EXPORTED_MEMH, VERSION >= (1, 14));
        assert_eq!(HAS_AM_SEND_FLAG_COPY_HEADER, VERSION >= (1, 14));
        // The structs UCX grew have that version's size (the layout check proves it against
        // the headers; this pins the history it encodes).
        let grown = |since: (u32, u32), extra: usize| if VERSION >= since { extra } else { 0 };
        assert_eq!(
            core::mem::size_of::<ucp_mem_map_params_t>(),
            40 + grown((1, 14), 8)
        );
        assert_eq!(core::mem::size_of::<ucp_params_t>(), 80 + grown((1, 20), 8));
        assert_eq!(
            core::mem::size_of::<ucp_request_param_t>(),
            72 + grown((1, 22), 24)
        );
    }

    #[test]
    fn decodes_status_pointers() {
        assert_eq!(status_ptr(core::ptr::null_mut()), StatusPtr::Done);
        let err = UCS_ERR_NO_RESOURCE as isize as usize as *mut c_void;
        assert_eq!(status_ptr(err), StatusPtr::Failed(UCS_ERR_NO_RESOURCE));
        let last = UCS_ERR_LAST as isize as usize as *mut c_void;
        assert_eq!(status_ptr(last), StatusPtr::Failed(UCS_ERR_LAST));
        let mut x = 0u64;
        let req = (&raw mut x).cast::<c_void>();
        assert_eq!(status_ptr(req), StatusPtr::Request(req));
        assert_ne!(status_text(UCS_ERR_NO_RESOURCE), "unknown UCX status");
    }
}
