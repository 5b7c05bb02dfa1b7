//! GPU remote offload: the server, orchestrator and client of the DOCA DPU-GPU remote-offload
//! application, speaking its wire format ([`urom_wire::gpu`]). Not implemented yet: see the
//! README's status table.
#![deny(unsafe_code)]
