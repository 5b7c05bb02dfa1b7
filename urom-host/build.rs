//! A hard rpath to the UCX this package was built against (its tests and examples run with it,
//! not with the system's), when that is not the system's (see `urom_build_support`).

fn main() {
    urom_build_support::rpath_to_ucx();
}
