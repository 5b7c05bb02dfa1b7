//! The contract between urom's daemon, its workers and the hosts: what each of them must agree
//! on with the others, in one place.
//!
//! * [`worker_command`]: the worker's command line, as the daemon writes it and the worker
//!   reads it (plugins as `so_path:id`, id, group, cpuset, message size, channel setup);
//! * [`worker_env`]: the environment entries a host may give its worker, and those it may not
//!   (anything that changes how programs load);
//! * [`paths`]: where the daemon's socket is when nothing says otherwise.
#![forbid(unsafe_code)]

pub mod paths;
pub mod worker_command;
pub mod worker_env;

pub use paths::{default_service_socket, writable_dir};
