//! `libdoca_common` for urom: the core of DOCA's C API that a UROM host uses, in DOCA's names.
//!
//! * [`ctx`]: progress engines (`doca_pe_*`), generic contexts (`doca_ctx_*`) and tasks
//!   (`doca_task_*`). libdoca_urom's service and worker are contexts of this kind.
//! * [`buf`]: buffers, memory maps and inventories (`doca_buf_*`, `doca_mmap_*`,
//!   `doca_buf_inventory_*`).
//! * [`dev`]: devices (`doca_devinfo_*`, `doca_dev_*`) as the UROM service file lists them.
//! * [`log`]: logging sources, backends and levels (`doca_log_*`).
//! * [`argp`]: argument parsing (`doca_argp_*`).
//! * `doca_error_get_name()` and `doca_error_get_descr()`.
//!
//! Every exported function lives in `ffi`, the one module with `unsafe`: it checks pointers,
//! runs the safe implementation inside a panic guard and returns DOCA's status codes. The
//! headers are in `urom-capi/include`.
#![deny(unsafe_code)]

pub mod argp;
pub mod buf;
pub mod ctx;
pub mod dev;
mod ffi;
pub mod log;
