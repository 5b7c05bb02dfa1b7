//! A hard rpath to the UCX this package was built against, when that is not the system's (see
//! `urom_build_support::rpath_to_ucx`).

fn main() {
    urom_build_support::rpath_to_ucx();
}
