//! The flag table of `urom-ctl` in `docs/operating.md` against what the built program's
//! `--help` and its subcommands' `--help` print: every long flag they print is documented, and
//! every documented flag is printed.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// The table lies between `<!-- flags: NAME -->` and `<!-- end of flags -->`.
const PROGRAM: &str = "urom-ctl";

/// The long flags `--help` prints: the first `--name` of each line that starts with a dash.
fn printed_flags(binary: &str, args: &[&str]) -> BTreeSet<String> {
    let output = Command::new(binary)
        .args(args)
        .output()
        .expect("running --help");
    assert!(output.status.success(), "{binary} {args:?} failed");
    let help = String::from_utf8(output.stdout).expect("UTF-8 help");
    help.lines()
        .map(str::trim_start)
        .filter(|line| line.starts_with('-'))
        .filter_map(|line| {
            let flag_column: Vec<&str> = line.split_whitespace().take(2).collect();
            long_flags(&flag_column.join(" ")).into_iter().next()
        })
        .collect()
}

/// Every `--name` in `text` (a name starts with a letter or digit, so `|---|` holds none).
fn long_flags(text: &str) -> Vec<String> {
    let mut flags = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("--") {
        let name: String = rest[at + 2..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        if name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
            flags.push(format!("--{name}"));
        }
        rest = &rest[at + 2 + name.len()..];
    }
    flags
}

/// The flags of the program's table in docs/operating.md, read from the first cell of each row.
fn documented_flags(program: &str) -> BTreeSet<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operating.md");
    let text = std::fs::read_to_string(&path).expect("reading docs/operating.md");
    let start = format!("<!-- flags: {program} -->");
    let table = text
        .split_once(&start)
        .unwrap_or_else(|| panic!("docs/operating.md has no {start}"))
        .1
        .split_once("<!-- end of flags -->")
        .expect("the flag table ends with <!-- end of flags -->")
        .0;
    let mut all = BTreeSet::new();
    for row in table.lines().filter(|line| line.starts_with('|')) {
        let first_cell = row.trim_start_matches('|').split('|').next().unwrap_or("");
        all.extend(long_flags(first_cell));
    }
    assert!(
        !all.is_empty(),
        "the {program} table in docs/operating.md lists no flags"
    );
    all
}

#[test]
fn the_flag_table_in_docs_operating_md_matches_help() {
    let mut printed = BTreeSet::new();
    for args in [
        &["--help"][..],
        &["status", "--help"],
        &["workers", "--help"],
        &["plugins", "--help"],
        &["destroy", "--help"],
    ] {
        printed.extend(printed_flags(env!("CARGO_BIN_EXE_urom-ctl"), args));
    }
    let documented = documented_flags(PROGRAM);
    let undocumented: Vec<_> = printed.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "{PROGRAM} --help prints {undocumented:?}, which docs/operating.md's table lacks"
    );
    let missing: Vec<_> = documented.difference(&printed).collect();
    assert!(
        missing.is_empty(),
        "docs/operating.md's {PROGRAM} table lists {missing:?}, which {PROGRAM} --help does not print"
    );
}
