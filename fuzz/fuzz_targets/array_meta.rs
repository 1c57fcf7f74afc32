//! libFuzzer entry point; the checks live in `scad_fuzz::harness::array_meta`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| scad_fuzz::harness::array_meta(data));
