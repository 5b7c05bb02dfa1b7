//! The fuzzers' seed corpus: each target's golden vectors, one file each under
//! `fuzz/seeds/<target>/`; `UROM_BLESS=1` rewrites them.

use std::path::Path;

/// Checks (or with `UROM_BLESS=1`, writes) the seed files of `target`.
pub fn check(target: &str, vectors: &[(&str, Vec<u8>)]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/seeds")
        .join(target);
    let bless = std::env::var_os("UROM_BLESS").is_some();
    for (name, bytes) in vectors {
        let path = dir.join(name);
        if bless {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, bytes).unwrap();
        }
        let on_disk = std::fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e}; run with UROM_BLESS=1 to write the seed corpus",
                path.display()
            )
        });
        assert_eq!(
            &on_disk,
            bytes,
            "{} is stale; run with UROM_BLESS=1",
            path.display()
        );
    }
}

/// Emits with `emit` into a buffer of stale `0xa5` bytes, exactly sized and oversized, and
/// checks that exactly `expected` was written.
pub fn assert_emits(name: &str, expected: &[u8], emit: impl Fn(&mut [u8]) -> usize) {
    for extra in [0, 7] {
        let mut buf = vec![0xa5; expected.len() + extra];
        let written = emit(&mut buf);
        assert_eq!(written, expected.len(), "{name}: length");
        assert_eq!(&buf[..written], expected, "{name}: bytes");
        assert!(
            buf[written..].iter().all(|&b| b == 0xa5),
            "{name}: wrote past its end"
        );
    }
}
