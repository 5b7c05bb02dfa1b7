//! `liburom_coll`: urom's collective offload from C, declared in `include/urom_coll.h`, in
//! the shape of UCC's init/post/test/finalize, over the host crate `urom-coll`.
//!
//! The walk, top down:
//!
//! 1. [`status`]: `urom_status_t`, what every call returns, mapped from `urom-coll`'s errors,
//!    and the calling thread's last error message.
//! 2. [`objects`]: what the C handles point to: a context (the service, the progress engine,
//!    the node's worker), teams, registered buffers and persistent collectives; safe Rust,
//!    reference counted, so that a handle destroyed before the ones made from it frees
//!    nothing they still use.
//! 3. `ffi` (private): the exported `urom_*` functions and the caller's out-of-band allgather;
//!    the only unsafe code. Every function checks its handles (NULL and destroyed ones give
//!    `UROM_ERR_INVALID_PARAM`) and catches panics, so nothing unwinds into C.
//!
//! Threads: a context and everything made from it belong to the thread that created the
//! context (urom-coll's completions are per thread); a call from another thread gives
//! `UROM_ERR_WRONG_THREAD`.
#![deny(unsafe_code)]

mod ffi;
pub mod objects;
pub mod status;
