//! The flag table of `urom-worker` in `docs/operating.md` against what the built program's
//! `--help` prints (see `urom_testkit::docs_flags`).

#[test]
fn the_flag_table_in_docs_operating_md_matches_help() {
    urom_testkit::docs_flags::check_flag_table(
        "urom-worker",
        env!("CARGO_BIN_EXE_urom-worker").as_ref(),
        &[&["--help"]],
        cfg!(feature = "ucx"),
    );
}
