//! Replays the fuzz targets' seeds and every crashing input kept in
//! `fuzz/regressions/<target>/` through the same harness the fuzzers run
//! (`fuzz/src/harness.rs`), on stable Rust, so a fixed crash stays fixed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../fuzz/src/harness.rs"]
#[allow(dead_code)]
mod harness;

use std::path::Path;

fn replay(dir: &str) -> usize {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz")
        .join(dir);
    let mut count = 0;
    for target in harness::TARGETS {
        let Ok(entries) = std::fs::read_dir(root.join(target)) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            if path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'))
            {
                continue;
            }
            let data = std::fs::read(&path).unwrap();
            let ran = std::panic::catch_unwind(|| harness::run(target, &data));
            assert!(
                matches!(ran, Ok(true)),
                "{target} fails on {} ({} bytes)",
                path.display(),
                data.len()
            );
            count += 1;
        }
    }
    count
}

#[test]
fn seeds_pass_every_harness() {
    assert!(replay("seeds") >= 4, "the seed corpus is missing");
}

#[test]
fn crashing_inputs_found_by_fuzzing_stay_fixed() {
    replay("regressions");
}

#[test]
fn the_harnesses_reject_nothing_they_should_accept() {
    // The harnesses themselves must not be vacuous: a valid durl and a valid request
    // go all the way through their round trips.
    harness::durl_parse(b"m;rdma_tcp;url,tcp://127.0.0.1:1;token,t;");
    let mut frame = Vec::new();
    scad_core::protocol::encode_read(
        &mut frame,
        3,
        &[scad_core::protocol::Segment { addr: 1, len: 2 }],
    );
    harness::protocol_decode(&frame[4..]);
    harness::array_meta(
        br#"{"dtype":"u8","item_size":1,"shape":[2,2],"extents":[{"transport":"mem0","addr":0,"bytes":4}]}"#,
    );
}
