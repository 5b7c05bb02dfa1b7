//! Links libdoca_urom to libdoca_common by name.
//!
//! libdoca_urom calls the `urom_capi_*` functions libdoca_common defines, and records
//! `libdoca_common.so.0` as a library it needs, so that loading it loads its core too. Cargo
//! cannot build the other library first, so the link uses a stand-in: an empty shared object
//! with the real library's SONAME, built here with the C compiler. The symbols stay undefined
//! in libdoca_urom and are found in the real libdoca_common when the program is loaded
//! (programs link both: `-ldoca_urom -ldoca_common`). The library's RUNPATH is `$ORIGIN`, so
//! the two are found together when they sit in one directory (all of this is
//! `urom_build_support::link_stand_in`). Its own SONAME is `libdoca_urom.so.0`
//! (`urom_build_support::soname`).

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    // Only the library links the stand-in: the package's tests are C programs' drivers.
    urom_build_support::link_stand_in("doca_common");
    urom_build_support::soname("doca_urom");
    // With the `ucx` feature and a UCX outside the system directories (ucx-sys's `UCX_DIR`): a
    // hard rpath to its library directory, for the library and the tests.
    urom_build_support::rpath_to_ucx();
}
