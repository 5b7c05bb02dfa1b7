//! With the `ucx` feature and a UCX outside the system directories (ucx-sys's `UCX_DIR`), gives
//! what this package links (binaries, tests, benches, shared libraries) a hard rpath to that
//! UCX's library directory, so that it loads the UCX it was built against. Otherwise nothing.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=DEP_UCP_LIBDIR");
    if let Some(dir) = std::env::var_os("DEP_UCP_LIBDIR") {
        let dir = dir.to_string_lossy();
        println!("cargo:rustc-link-arg=-Wl,--disable-new-dtags,-rpath,{dir}");
    }
}
