//! The urom worker process.
//!
//! Loads plugin `.so` files, pins itself to its cpuset, polls its host channels, dispatches
//! commands to plugins and routes their notifications back. Not implemented yet: see the
//! README's status table.
#![deny(unsafe_code)]
