//! Names the shared library `libdoca_common.so.0` (its SONAME), the name libdoca_urom records as
//! the library it needs (`urom_build_support::soname`).

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    urom_build_support::soname("doca_common");
}
