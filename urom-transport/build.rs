//! A hard rpath to the UCX this package was built against, when that is not the system's, and
//! `cfg(ucx_1_14)` / `cfg(ucx_1_15)` when that UCX reaches those versions: 1.14's headers declare
//! exported memory handles, 1.15 implements them (see `urom_build_support`).

fn main() {
    urom_build_support::rpath_to_ucx();
    urom_build_support::ucx_version_cfgs(&[14, 15]);
}
