//! Names the shared library `liburom_coll.so.0` (its SONAME; `urom_build_support::soname`).

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    urom_build_support::soname("urom_coll");
}
