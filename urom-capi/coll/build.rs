//! Names the shared library `liburom_coll.so` (its SONAME).

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,liburom_coll.so");
    println!("cargo:rerun-if-changed=build.rs");
}
