//! Replays the `frame_meta` fuzz target's seeds and kept crashing inputs
//! (`fuzz/seeds/frame_meta`, `fuzz/regressions/frame_meta`) through the same harness the
//! fuzzer runs (`fuzz/src/frame_harness.rs`) on stable Rust, and checks that the harness
//! accepts real metadata and survives damaged copies of it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../fuzz/src/frame_harness.rs"]
mod frame_harness;

use std::path::Path;
use std::sync::Arc;

use polars::prelude::*;
use scad_core::transport::LocalTransport;
use scad_remote_array::MemoryElements;
use scad_remote_frame::{FrameEnv, RemoteFrame};

fn replay(dir: &str) -> usize {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz")
        .join(dir)
        .join("frame_meta");
    let Ok(entries) = std::fs::read_dir(&root) else {
        return 0;
    };
    let mut count = 0;
    for entry in entries {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        let ran = std::panic::catch_unwind(|| frame_harness::frame_meta(&data));
        assert!(ran.is_ok(), "frame_meta fails on {}", path.display());
        count += 1;
    }
    count
}

/// Metadata of a small real frame on elements named as the harness names them.
fn real_meta_json() -> String {
    let elements = Arc::new(MemoryElements::new());
    for name in ["mem0", "mem1"] {
        elements
            .add(name, Arc::new(LocalTransport::new(4 << 20).unwrap()))
            .unwrap();
    }
    let env = FrameEnv::new(elements).with_chunk_rows(4);
    let df = df!(
        "k" => [Some(1i64), None, Some(3), Some(4), Some(5), Some(6)],
        "s" => ["a", "bb", "", "dddd", "e", "ffffff"],
        "x" => [1.5f64, 2.5, 3.5, 4.5, 5.5, 6.5]
    )
    .unwrap();
    RemoteFrame::from_polars(&env, &df)
        .unwrap()
        .to_json()
        .unwrap()
}

#[test]
fn seeds_and_regressions_replay_cleanly() {
    let seeds = replay("seeds");
    assert!(seeds > 0, "no frame_meta seeds found");
    replay("regressions");
}

#[test]
fn real_and_damaged_metadata_never_panic() {
    let json = real_meta_json();
    frame_harness::frame_meta(json.as_bytes());
    let bytes = json.as_bytes();
    // Every truncation, and every digit turned into another, must be handled.
    for cut in (0..bytes.len()).step_by(7) {
        frame_harness::frame_meta(&bytes[..cut]);
    }
    for (i, b) in bytes.iter().enumerate().filter(|(_, b)| b.is_ascii_digit()) {
        let mut damaged = bytes.to_vec();
        damaged[i] = if *b == b'9' { b'0' } else { b + 1 };
        let ran = std::panic::catch_unwind(|| frame_harness::frame_meta(&damaged));
        assert!(
            ran.is_ok(),
            "panics with digit {i} changed: {}",
            String::from_utf8_lossy(&damaged)
        );
    }
    if std::env::var_os("SCAD_WRITE_FUZZ_SEEDS").is_some() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/frame_meta");
        std::fs::write(dir.join("meta0"), &json).unwrap();
    }
}
