//! What each fuzz target checks. Every function takes arbitrary bytes and panics only
//! when a decoder panics or breaks one of its properties:
//!
//! - `protocol_decode`: the memory server's request and response decoders; whatever
//!   decodes re-encodes to the same request (canonical encoding: the same bytes).
//! - `durl_parse`: durl strings; a parsed durl prints to a string that parses back to
//!   the same durl, resolves without panicking and merges with itself unchanged.
//! - `rdma_exchange`: the `rdma_uverbs` connection-information frames; whatever decodes
//!   re-encodes to exactly the input bytes.
//! - `array_meta`: `ArrayMeta` JSON as one compute element hands it to the next; valid
//!   metadata slices, concatenates and round-trips through JSON, and opens (and, when
//!   small, materializes) as a `RemoteArray` over two local memory elements without
//!   panicking.
//!
//! RemoteFrame metadata has its own target, `frame_meta`, in `frame_harness.rs`.
//!
//! This file is also compiled into `remote-array/tests/fuzz_regressions.rs` (by path),
//! which replays every input kept under `fuzz/regressions/<target>/` on stable Rust.

use std::sync::{Arc, OnceLock};

use scad_core::durl::Durl;
use scad_core::protocol::{self, ErrorReply, HelloReply, Request};
use scad_core::rdma::exchange;
use scad_core::transport::LocalTransport;
use scad_remote_array::{ArrayMeta, BufferPool, RemoteArray, RemoteStore};

/// Names of the targets, as in `fuzz/Cargo.toml` and `fuzz/regressions/`.
pub const TARGETS: [&str; 4] = [
    "protocol_decode",
    "durl_parse",
    "rdma_exchange",
    "array_meta",
];

/// Runs the harness of target `name` on `data`; false for an unknown name.
pub fn run(name: &str, data: &[u8]) -> bool {
    match name {
        "protocol_decode" => protocol_decode(data),
        "durl_parse" => durl_parse(data),
        "rdma_exchange" => rdma_exchange(data),
        "array_meta" => array_meta(data),
        _ => return false,
    }
    true
}

/// Request and response decoders of the tcp wire protocol.
pub fn protocol_decode(data: &[u8]) {
    if let Ok((id, request)) = protocol::decode_request(data) {
        let mut out = Vec::new();
        match &request {
            Request::Hello { token, .. } => protocol::encode_hello(&mut out, id, token),
            Request::Read { segments } => protocol::encode_read(&mut out, id, segments),
            Request::Write { segments, data } => {
                protocol::encode_write_head(&mut out, id, segments);
                out.extend_from_slice(data);
            }
            Request::Size => protocol::encode_size(&mut out, id),
        }
        let len = u32::from_le_bytes([out[0], out[1], out[2], out[3]]) as usize;
        assert_eq!(len, out.len() - 4, "length prefix must count the body");
        let (id2, again) = match protocol::decode_request(&out[4..]) {
            Ok(r) => r,
            Err(e) => panic!("re-encoded request does not decode: {e}"),
        };
        assert_eq!(id, id2);
        match (&request, &again) {
            // The encoder always writes this crate's version; compare the rest.
            (Request::Hello { token: a, .. }, Request::Hello { token: b, .. }) => {
                assert_eq!(a, b);
            }
            _ => {
                assert_eq!(request, again);
                assert_eq!(&out[4..], data, "request encoding is not canonical");
            }
        }
    }
    // The client-side decoders see bytes from a possibly hostile server too.
    if let Some(head) = data.first_chunk::<{ protocol::RESPONSE_HEAD_BYTES }>() {
        if let Ok(head) = protocol::decode_response_head(head, protocol::DEFAULT_MAX_FRAME) {
            assert!(head.padding < protocol::RESPONSE_ALIGN);
            let rest = &data[protocol::RESPONSE_HEAD_BYTES..];
            if let Some(payload) = rest.get(..head.payload_len) {
                if !head.ok {
                    let _ = ErrorReply::decode(payload);
                }
            }
        }
    }
    if let Ok(reply) = ErrorReply::decode(data) {
        let mut out = Vec::new();
        reply.encode(&mut out, 9);
        assert_eq!(out.len() % protocol::RESPONSE_ALIGN, 0);
        let Some(head) = out.first_chunk::<{ protocol::RESPONSE_HEAD_BYTES }>() else {
            panic!("an encoded error reply of {} bytes has no head", out.len());
        };
        let head = protocol::decode_response_head(head, protocol::DEFAULT_MAX_FRAME);
        let head = match head {
            Ok(h) => h,
            Err(e) => panic!("an encoded error reply has a bad head: {e}"),
        };
        let payload = &out[protocol::RESPONSE_HEAD_BYTES..][..head.payload_len];
        match ErrorReply::decode(payload) {
            Ok(again) => {
                assert_eq!(
                    (again.code, again.addr, again.len, again.size),
                    (reply.code, reply.addr, reply.len, reply.size)
                );
            }
            Err(e) => panic!("re-encoded error reply does not decode: {e}"),
        }
    }
    if let Ok(hello) = HelloReply::decode(data) {
        let mut out = Vec::new();
        hello.encode(&mut out, 1);
        let payload = &out[protocol::RESPONSE_HEAD_BYTES..protocol::RESPONSE_HEAD_BYTES + 14];
        assert_eq!(HelloReply::decode(payload), Ok(hello));
    }
    let _ = protocol::decode_size_reply(data);
    if let Some(len) = data.first_chunk::<4>() {
        let _ = protocol::check_frame_len(
            u32::from_le_bytes(*len),
            protocol::DEFAULT_MAX_FRAME,
            protocol::REQUEST_HEADER,
        );
    }
}

/// The durl parser.
pub fn durl_parse(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        // Durls arrive as Rust strings; non-UTF-8 bytes cannot reach the parser.
        return;
    };
    let Ok(durl) = Durl::parse(text) else {
        return;
    };
    let printed = durl.to_string();
    match Durl::parse(&printed) {
        Ok(again) => assert_eq!(again, durl, "{text:?} printed as {printed:?}"),
        Err(e) => panic!("{text:?} printed as {printed:?}, which does not parse: {e}"),
    }
    let _ = durl.missing_keys();
    let _ = durl.resolve();
    let mut merged = durl.clone();
    if let Err(e) = merged.merge(&durl) {
        panic!("a durl does not merge with itself: {e}");
    }
    assert_eq!(merged, durl);
}

/// The `rdma_uverbs` connection-information codec.
pub fn rdma_exchange(data: &[u8]) {
    if let Ok(header) = exchange::decode_header(data) {
        assert!(header.body_len <= exchange::MAX_BODY);
    }
    if let Ok(message) = exchange::decode(data) {
        let mut out = Vec::new();
        if let Err(e) = exchange::encode(&message, &mut out) {
            panic!("a decoded message does not encode: {e}");
        }
        assert_eq!(out, data, "exchange encoding is not canonical");
    }
}

/// Two local memory elements of 64 KiB behind a small pool, shared by every run.
fn store() -> &'static Arc<RemoteStore> {
    static STORE: OnceLock<Arc<RemoteStore>> = OnceLock::new();
    STORE.get_or_init(|| {
        let pool = BufferPool::builder(256 * 1024)
            .page_size(4096)
            .build()
            .unwrap_or_else(|e| panic!("fuzz pool: {e}"));
        let store = Arc::new(RemoteStore::new(Arc::new(pool)));
        for (i, name) in ["mem0", "mem1"].into_iter().enumerate() {
            let t = LocalTransport::new(64 * 1024).unwrap_or_else(|e| panic!("fuzz element: {e}"));
            // Recognisable contents, so materialized arrays are not all zeros.
            let fill: Vec<u8> = (0..64 * 1024).map(|b| (b + i) as u8).collect();
            scad_core::Transport::write(&t, 0, &fill).unwrap_or_else(|e| panic!("{e}"));
            store
                .elements()
                .add(name, Arc::new(t))
                .unwrap_or_else(|e| panic!("fuzz store: {e}"));
        }
        store
    })
}

/// Bytes of metadata small enough to materialize in a fuzz run.
const MATERIALIZE_LIMIT: u64 = 64 * 1024;

fn open_as<T: bytemuck::Pod + Send + Sync, D: ndarray::Dimension>(meta: &ArrayMeta) {
    let Ok(array) = RemoteArray::<T, D>::from_meta(store(), meta) else {
        return;
    };
    assert_eq!(array.shape(), &meta.shape[..]);
    assert_eq!(array.meta().extents, meta.extents);
    if array.byte_len() <= MATERIALIZE_LIMIT {
        match array.materialize() {
            Ok(m) => assert_eq!(m.len(), array.len()),
            Err(e) => panic!("valid, in-range metadata does not materialize: {e}"),
        }
    }
    let rows = array.rows();
    if let Ok(part) = array.slice(rows / 3..rows - rows / 3) {
        assert_eq!(part.rows(), rows - 2 * (rows / 3));
    }
}

/// `ArrayMeta` JSON loading and what a loaded meta allows.
pub fn array_meta(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(meta) = ArrayMeta::from_json(text) else {
        return;
    };
    let bytes = match meta.data_bytes() {
        Ok(b) => b,
        Err(e) => panic!("validated metadata has no byte size: {e}"),
    };
    let total: u64 = meta.extents.iter().map(|e| e.bytes).sum();
    assert_eq!(bytes, total);
    match meta.to_json().map(|j| ArrayMeta::from_json(&j)) {
        Ok(Ok(again)) => assert_eq!(again, meta),
        Ok(Err(e)) | Err(e) => panic!("validated metadata does not round-trip: {e}"),
    }
    let rows = meta.shape[0];
    for range in [
        0..rows,
        rows / 2..rows,
        0..rows / 2,
        rows / 3..rows - rows / 3,
    ] {
        match meta.slice_rows(range.clone()) {
            Ok(part) => {
                assert_eq!(part.shape[0], range.len());
                if let Err(e) = part.validate() {
                    panic!("slice {range:?} of valid metadata is invalid: {e}");
                }
            }
            Err(e) => panic!("slice {range:?} of {rows} rows refused: {e}"),
        }
    }
    if let Ok(both) = ArrayMeta::concat(&[meta.clone(), meta.clone()]) {
        if let Err(e) = both.validate() {
            panic!("concatenation of valid metadata is invalid: {e}");
        }
    }
    open_as::<u8, ndarray::IxDyn>(&meta);
    open_as::<u16, ndarray::Ix2>(&meta);
    open_as::<f64, ndarray::Ix1>(&meta);
}
