//! Golden byte vectors for the wire tests of urom and of its plugins: hex text to bytes, the
//! check that an emitter writes exactly its vector, and the fuzzers' seed corpus, one file per
//! vector under `fuzz/seeds/<target>/` (`UROM_BLESS=1` rewrites them).

/// Bytes from hex digits; spaces, newlines and `|` are ignored, and `00*N` repeats a byte.
pub fn hex(text: &str) -> Vec<u8> {
    let mut bytes = Vec::new();
    for token in text.split(|c: char| c.is_whitespace() || c == '|') {
        if token.is_empty() {
            continue;
        }
        let (digits, repeat) = match token.split_once('*') {
            Some((digits, repeat)) => (digits, repeat.parse::<usize>().unwrap()),
            None => (token, 1),
        };
        assert!(digits.len() % 2 == 0, "odd hex token {token}");
        let chunk: Vec<u8> = (0..digits.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&digits[i..i + 2], 16).unwrap())
            .collect();
        for _ in 0..repeat {
            bytes.extend_from_slice(&chunk);
        }
    }
    bytes
}

/// Checks (or with `UROM_BLESS=1`, writes) the seed files of `target`.
pub fn check_fuzz_seeds(target: &str, vectors: &[(&str, Vec<u8>)]) {
    let dir = crate::workspace_root().join("fuzz/seeds").join(target);
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
