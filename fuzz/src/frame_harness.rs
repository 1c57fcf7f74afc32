//! The `frame_meta` fuzz target: `FrameMeta` JSON as one compute element hands it to the
//! next. Metadata that loads validates, round-trips through JSON, opens as a
//! `RemoteFrame` over two local memory elements, and reads (whole and a projection)
//! without panicking: bytes that do not fit the metadata must be an error. (The memory
//! holds a byte pattern, not the frame: the harness forges the seal the metadata names,
//! so that opening passes and the decoders see the bytes; it puts the pattern back.)
//!
//! Kept apart from `harness.rs` so the remote-array replay test does not need the
//! dataframe crate; `remote-frame/tests/fuzz_regressions.rs` includes this file by path
//! and replays `fuzz/seeds/frame_meta` and `fuzz/regressions/frame_meta`.

use std::sync::{Arc, OnceLock};

use scad_core::transport::LocalTransport;
use scad_remote_array::MemoryElements;
use scad_remote_frame::{seal, FrameEnv, FrameMeta, RemoteFrame, SEAL_BYTES};

/// Largest frame (in stored bytes) the harness reads back, so one input stays fast.
const READ_LIMIT: u64 = 1 << 20;

/// Two local memory elements named as the seeds name them (`mem0`, `mem1`), 4 MiB each,
/// filled with a byte pattern so reads see non-zero garbage as well as zeros.
fn env() -> Option<&'static FrameEnv> {
    static ENV: OnceLock<Option<FrameEnv>> = OnceLock::new();
    ENV.get_or_init(|| {
        let elements = Arc::new(MemoryElements::new());
        for (i, name) in ["mem0", "mem1"].into_iter().enumerate() {
            let t = LocalTransport::new(4 << 20).ok()?;
            let pattern: Vec<u8> = (0..4usize << 20)
                .map(|j| if j % 3 == i { (j % 251) as u8 } else { 0 })
                .collect();
            scad_core::Transport::write(&t, 0, &pattern).ok()?;
            elements.add(name, Arc::new(t)).ok()?;
        }
        Some(FrameEnv::new(elements))
    })
    .as_ref()
}

/// Loads `data` as frame metadata and uses it as a receiving element would.
pub fn frame_meta(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(mut meta) = FrameMeta::from_json(text) else {
        return;
    };
    if let Err(e) = meta.validate() {
        panic!("loaded metadata does not validate: {e}");
    }
    match meta.to_json().map(|j| FrameMeta::from_json(&j)) {
        Ok(Ok(again)) => assert_eq!(again, meta, "metadata changes through JSON"),
        Ok(Err(e)) | Err(e) => panic!("valid metadata does not round-trip: {e}"),
    }
    let Some(env) = env() else {
        return;
    };
    let Some(s) = meta.seal.clone() else {
        return;
    };
    let Ok(t) = env.elements().transport(&s.element) else {
        return;
    };
    let mut pattern = [0u8; SEAL_BYTES as usize];
    if t.read(s.addr, &mut pattern).is_err() {
        return;
    }
    if seal::forge(env, &mut meta).is_ok() {
        if let Ok(frame) = RemoteFrame::open(env, meta) {
            read(&frame);
        }
    }
    if let Err(e) = t.write(s.addr, &pattern) {
        panic!("cannot put the pattern back: {e}");
    }
}

fn read(frame: &RemoteFrame) {
    if frame.data_bytes() > READ_LIMIT {
        return;
    }
    if let Ok(df) = frame.to_polars() {
        assert_eq!(
            df.height(),
            frame.rows(),
            "read rows differ from the metadata"
        );
    }
    let names = frame.column_names();
    if let Some(first) = names.first() {
        if let Ok(df) = frame.select_columns(&[first.as_str()]) {
            assert_eq!(df.width(), 1);
        }
    }
}
