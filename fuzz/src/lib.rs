//! The fuzz harnesses, shared by the libFuzzer targets and by the regression tests
//! (`remote-array/tests/fuzz_regressions.rs` includes `harness.rs` by path, so the
//! crashing inputs kept in `fuzz/regressions/` run under plain `cargo test`).
pub mod harness;
