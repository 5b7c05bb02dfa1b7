//! Benchmarks of urom; the code is under `benches/`. Run `cargo bench -p urom-benches`.
