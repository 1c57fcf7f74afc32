//! libFuzzer entry point; the checks live in `scad_fuzz::harness::rdma_exchange`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| scad_fuzz::harness::rdma_exchange(data));
