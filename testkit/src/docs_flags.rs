//! Flag tables in `docs/operating.md` against what a program's `--help` prints.
//!
//! A table lies between `<!-- flags: NAME -->` and `<!-- end of flags -->`; each row names its
//! flags in its first cell. Rows marked "(feature ucx)" are flags only a build with that feature
//! prints.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// What marks a row whose flags only a build with the `ucx` feature has.
const FEATURE_MARK: &str = "(feature ucx)";

/// Checks that every long flag `binary` prints for each of `helps` (argument lists such as
/// `["--help"]`) is in `program`'s table, and that every flag of the table is printed, except
/// feature-only rows when `with_ucx` is false.
pub fn check_flag_table(program: &str, binary: &Path, helps: &[&[&str]], with_ucx: bool) {
    let printed: BTreeSet<String> = helps
        .iter()
        .flat_map(|args| printed_flags(binary, args))
        .collect();
    let (documented, feature_only) = documented_flags(program);
    let undocumented: Vec<_> = printed.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "{program} --help prints {undocumented:?}, which docs/operating.md's table lacks"
    );
    let missing: Vec<_> = documented
        .difference(&printed)
        .filter(|flag| with_ucx || !feature_only.contains(*flag))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/operating.md's {program} table lists {missing:?}, which {program} --help does not print"
    );
}

/// The long flags `--help` prints: the first `--name` of each line that starts with a dash.
fn printed_flags(binary: &Path, args: &[&str]) -> BTreeSet<String> {
    let output = Command::new(binary)
        .args(args)
        .output()
        .expect("running --help");
    assert!(
        output.status.success(),
        "{} {args:?} failed",
        binary.display()
    );
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

/// The flags of `program`'s table: (every flag, those marked feature-only).
fn documented_flags(program: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let path = crate::workspace_root().join("docs/operating.md");
    let text = std::fs::read_to_string(&path).expect("reading docs/operating.md");
    let start = format!("<!-- flags: {program} -->");
    let table = text
        .split_once(&start)
        .unwrap_or_else(|| panic!("docs/operating.md has no {start}"))
        .1
        .split_once("<!-- end of flags -->")
        .expect("the flag table ends with <!-- end of flags -->")
        .0;
    let (mut all, mut feature_only) = (BTreeSet::new(), BTreeSet::new());
    for row in table.lines().filter(|line| line.starts_with('|')) {
        let first_cell = row.trim_start_matches('|').split('|').next().unwrap_or("");
        for flag in long_flags(first_cell) {
            if row.contains(FEATURE_MARK) {
                feature_only.insert(flag.clone());
            }
            all.insert(flag);
        }
    }
    assert!(
        !all.is_empty(),
        "the {program} table in docs/operating.md lists no flags"
    );
    (all, feature_only)
}
