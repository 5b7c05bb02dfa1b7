//! Names the shared library `libdoca_common.so` (its SONAME), the name libdoca_urom records as
//! the library it needs.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libdoca_common.so");
}
