//! The urom service daemon.
//!
//! The one process an operator starts on an offload device: it discovers plugins in
//! `UROM_PLUGIN_PATH`, authenticates hosts, and spawns, attaches and tears down
//! `urom-worker` processes. Not implemented yet: see the README's status table.
#![deny(unsafe_code)]
