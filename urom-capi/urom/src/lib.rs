//! `libdoca_urom` for urom: DOCA UROM's host API in DOCA's C names, over `urom_host`.
//!
//! * [`service`]: `struct doca_urom_service` (`doca_urom_service_*`) and its workers-by-gid
//!   task, over `Service<Idle>` / `Service<Running>`.
//! * [`worker`]: `struct doca_urom_worker` (`doca_urom_worker_*`) and its command task
//!   (`doca_urom_worker_cmd_task_*`), over `Worker<Idle>` / `Worker<Starting>` /
//!   `Worker<Running>`.
//! * [`domain`]: `struct doca_urom_domain` (`doca_urom_domain_*`), over `Domain<Idle>` /
//!   `Domain<Starting>` / `Domain<Running>`, with the program's out-of-band collective
//!   (`struct doca_urom_domain_oob_coll`) as an `OobCollective`.
//!
//! All three are DOCA contexts: libdoca_common (package `urom-capi-common`) holds their generic
//! part and calls back into this library from `doca_ctx_start()`, `doca_ctx_stop()`,
//! `doca_pe_progress()` and `doca_task_submit()` (see `urom-capi-abi`). A C object keeps the Rust
//! typestate value of its current state in an enum and moves it from state to state.
#![deny(unsafe_code)]

mod borrow;
pub mod domain;
mod ffi;
mod log;
pub mod service;
pub mod worker;
