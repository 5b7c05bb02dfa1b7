//! The flag table of `urom-ctl` in `docs/operating.md` against what the built program's
//! `--help` and its subcommands' `--help` print (see `urom_testkit::docs_flags`).

#[test]
fn the_flag_table_in_docs_operating_md_matches_help() {
    urom_testkit::docs_flags::check_flag_table(
        "urom-ctl",
        env!("CARGO_BIN_EXE_urom-ctl").as_ref(),
        &[
            &["--help"],
            &["status", "--help"],
            &["workers", "--help"],
            &["plugins", "--help"],
            &["destroy", "--help"],
        ],
        false,
    );
}
