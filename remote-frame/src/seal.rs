//! Frame seals: what proves that memory still holds the frame its metadata describes.
//!
//! Metadata alone cannot tell whether a frame's memory was freed and reused, or
//! overwritten, since it was written: a reader would take someone else's bytes for
//! data (fixed-width columns have no structure to catch it). So every frame
//! [`crate::FrameWriter`] writes gets a *seal*: a separate 64-byte allocation on one
//! of its memory elements holding a magic word, a random nonce, the row count and a
//! hash of the metadata. The metadata records where the seal lives, its nonce, and a
//! fingerprint of the head of every chunk ([`Seal`]). The chunk data itself is not
//! changed.
//!
//! * Opening a frame from metadata ([`crate::RemoteFrame::open`]) reads the seal and
//!   every chunk's head (one vectored read per memory element) and refuses a frame
//!   that does not match with [`Error::Stale`].
//! * Reading a frame (`to_record_batches`, `record_batches`, each partition of a query's scan) reads
//!   the seal again first: 64 bytes.
//! * Freeing a frame zeroes its seal before its memory goes back to the allocators,
//!   so metadata of a freed frame no longer opens, in this process or another, even
//!   after the memory was reused. Every clone of a freed handle refuses to be used
//!   ([`Error::Freed`]).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use scad_core::ReadOp;
use serde::{Deserialize, Serialize};

use crate::env::FrameEnv;
use crate::error::{Error, Result};
use crate::meta::{ChunkMeta, ColumnMeta, FrameMeta};

/// Bytes of a seal in remote memory.
pub const SEAL_BYTES: u64 = 64;

/// Bytes of a chunk's head that are fingerprinted: at most this many bytes of the
/// chunk's buffer at offset 0 (see [`Seal::chunk_heads`]).
pub const HEAD_BYTES: u64 = 64;

const SEAL_MAGIC: [u8; 8] = *b"SCADSEAL";

/// Where a frame's seal lives and what it and the chunks' heads must hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seal {
    /// Memory element of the seal.
    pub element: String,
    /// Address of the seal's [`SEAL_BYTES`] bytes.
    pub addr: u64,
    /// Random value written into the seal; names the frame in errors.
    pub nonce: u64,
    /// Per chunk, in chunk order: FNV-1a of the first (up to [`HEAD_BYTES`]) bytes of
    /// the chunk's buffer at offset 0 (0 for a chunk without one).
    pub chunk_heads: Vec<u64>,
}

/// The seal's 64 bytes as stored.
pub(crate) type SealImage = [u8; SEAL_BYTES as usize];

/// 64-bit FNV-1a.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// A fresh nonce, never 0: SipHash under the process's random keys of the time, the
/// process id and a counter.
fn new_nonce() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    h.write_u128(t);
    h.write_u32(std::process::id());
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.finish() | 1
}

/// What the seal's hash covers: the metadata without the seal.
#[derive(Serialize)]
struct Hashed<'a> {
    version: u32,
    schema: &'a [ColumnMeta],
    rows: u64,
    chunks: &'a [ChunkMeta],
}

/// FNV-1a of the metadata's JSON, the seal left out.
fn meta_hash(meta: &FrameMeta) -> Result<u64> {
    let json = serde_json::to_vec(&Hashed {
        version: meta.version,
        schema: &meta.schema,
        rows: meta.rows,
        chunks: &meta.chunks,
    })
    .map_err(Error::MetaJson)?;
    Ok(fnv1a(&json))
}

/// The bytes a seal of `meta` with `nonce` holds: magic, nonce, rows, metadata hash,
/// then zeros.
pub(crate) fn image(meta: &FrameMeta, nonce: u64) -> Result<SealImage> {
    let mut b = [0u8; SEAL_BYTES as usize];
    b[..8].copy_from_slice(&SEAL_MAGIC);
    b[8..16].copy_from_slice(&nonce.to_le_bytes());
    b[16..24].copy_from_slice(&meta.rows.to_le_bytes());
    b[24..32].copy_from_slice(&meta_hash(meta)?.to_le_bytes());
    Ok(b)
}

/// Bytes of `chunk`'s head that are fingerprinted: of its non-empty buffer at offset
/// 0, at most [`HEAD_BYTES`] (0 when it has none, e.g. a chunk of nulls only).
pub(crate) fn head_len(chunk: &ChunkMeta) -> u64 {
    chunk
        .columns
        .iter()
        .flat_map(|c| c.buffers.iter())
        .find(|b| b.offset == 0 && b.len > 0)
        .map_or(0, |b| b.len.min(HEAD_BYTES))
}

/// The fingerprint of a chunk written as `pieces` (offset in the chunk, bytes): of
/// the non-empty piece at offset 0, as [`head_len`] finds it in the metadata.
pub(crate) fn head_of<'a>(pieces: impl IntoIterator<Item = (u64, &'a [u8])>) -> u64 {
    pieces
        .into_iter()
        .find(|(o, b)| *o == 0 && !b.is_empty())
        .map_or(0, |(_, b)| fnv1a(&b[..b.len().min(HEAD_BYTES as usize)]))
}

/// How errors name a frame: its nonce, rows, chunks and where its seal lives (frames
/// have no names; the nonce is what its metadata JSON shows).
pub(crate) fn label(meta: &FrameMeta) -> String {
    match &meta.seal {
        Some(s) => format!(
            "{:016x} ({} rows in {} chunks, seal at {}:{:#x})",
            s.nonce,
            meta.rows,
            meta.chunks.len(),
            s.element,
            s.addr
        ),
        None => format!(
            "({} rows in {} chunks, unsealed)",
            meta.rows,
            meta.chunks.len()
        ),
    }
}

fn transport_err(
    op: &'static str,
    element: &str,
    addr: u64,
    len: u64,
    e: scad_core::Error,
) -> Error {
    Error::Transport {
        op,
        element: element.to_owned(),
        addr,
        len,
        source: Box::new(e),
    }
}

/// Seals `meta` (written, its seal still `None`): allocates the seal on `element`
/// and writes it. Nothing stays allocated on failure.
///
/// # Errors
/// Allocation and transport errors.
pub(crate) fn write(
    env: &FrameEnv,
    meta: &mut FrameMeta,
    element: String,
    chunk_heads: Vec<u64>,
) -> Result<SealImage> {
    let nonce = new_nonce();
    let bytes = image(meta, nonce)?;
    let addr = env.elements().allocate(&element, SEAL_BYTES)?;
    let written = env.transport(&element).and_then(|t| {
        t.write(addr, &bytes)
            .map_err(|e| transport_err("write", &element, addr, SEAL_BYTES, e))
    });
    if let Err(e) = written {
        if let Err(free) = env.elements().free(&element, addr, SEAL_BYTES) {
            tracing::warn!(%free, "freeing the seal of a frame that failed to be sealed");
        }
        return Err(e);
    }
    meta.seal = Some(Seal {
        element,
        addr,
        nonce,
        chunk_heads,
    });
    Ok(bytes)
}

/// Reads `seal`'s bytes.
fn read_seal(env: &FrameEnv, seal: &Seal) -> Result<SealImage> {
    let mut got = [0u8; SEAL_BYTES as usize];
    env.transport(&seal.element)?
        .read(seal.addr, &mut got)
        .map_err(|e| transport_err("read", &seal.element, seal.addr, SEAL_BYTES, e))?;
    Ok(got)
}

/// Checks that `meta`'s seal holds `want` (one 64-byte read).
///
/// # Errors
/// [`Error::Stale`] when it does not; transport errors.
pub(crate) fn check(env: &FrameEnv, meta: &FrameMeta, want: &SealImage) -> Result<()> {
    let Some(seal) = &meta.seal else {
        return Err(unsealed(meta));
    };
    let got = read_seal(env, seal)?;
    if got == *want {
        return Ok(());
    }
    let reason = if got[..8] != SEAL_MAGIC {
        format!(
            "no seal at {}:{:#x}: the frame was freed, or its memory reused",
            seal.element, seal.addr
        )
    } else if got[8..16] != want[8..16] {
        format!(
            "the seal at {}:{:#x} belongs to another frame: the frame was freed and its memory reused, or the metadata names the wrong seal",
            seal.element, seal.addr
        )
    } else {
        format!(
            "the seal at {}:{:#x} was made for other metadata (rows or chunks were changed)",
            seal.element, seal.addr
        )
    };
    Err(Error::Stale {
        frame: label(meta),
        reason,
    })
}

fn unsealed(meta: &FrameMeta) -> Error {
    Error::Stale {
        frame: label(meta),
        reason: "its metadata carries no seal".into(),
    }
}

/// Checks `meta` against memory as a frame is opened: the seal (as [`check`]) and
/// every chunk's head, one vectored read per memory element. Returns the seal's
/// expected bytes for later checks.
///
/// # Errors
/// [`Error::Stale`] naming the first mismatch; transport errors.
pub(crate) fn verify(env: &FrameEnv, meta: &FrameMeta) -> Result<SealImage> {
    let Some(seal) = &meta.seal else {
        return Err(unsealed(meta));
    };
    let want = image(meta, seal.nonce)?;
    check(env, meta, &want)?;
    let heads = read_heads(env, meta)?;
    for (k, (got, want)) in heads.iter().zip(&seal.chunk_heads).enumerate() {
        if got != want {
            let c = &meta.chunks[k];
            return Err(Error::Stale {
                frame: label(meta),
                reason: format!(
                    "chunk {k} at {}:{:#x} was overwritten since the frame was written",
                    c.element, c.addr
                ),
            });
        }
    }
    Ok(want)
}

/// The fingerprints of the chunks' heads as memory holds them now, one vectored read
/// per memory element.
fn read_heads(env: &FrameEnv, meta: &FrameMeta) -> Result<Vec<u64>> {
    let mut heads: Vec<Vec<u8>> = meta
        .chunks
        .iter()
        .map(|c| vec![0u8; head_len(c) as usize])
        .collect();
    let mut by_element: Vec<(&str, Vec<ReadOp<'_>>)> = Vec::new();
    for (c, buf) in meta.chunks.iter().zip(heads.iter_mut()) {
        if buf.is_empty() {
            continue;
        }
        let op = ReadOp {
            addr: c.addr,
            dst: buf.as_mut_slice(),
        };
        match by_element.iter_mut().find(|(e, _)| *e == c.element) {
            Some((_, ops)) => ops.push(op),
            None => by_element.push((c.element.as_str(), vec![op])),
        }
    }
    for (element, mut ops) in by_element {
        let first = ops.first().map_or(0, |o| o.addr);
        let len = ops.iter().map(|o| o.dst.len() as u64).sum();
        env.transport(element)?
            .read_vectored(&mut ops)
            .map_err(|e| transport_err("read", element, first, len, e))?;
    }
    Ok(heads
        .iter()
        .map(|h| if h.is_empty() { 0 } else { fnv1a(h) })
        .collect())
}

/// Makes memory and `meta` agree whatever memory holds: writes the seal `meta` names
/// at its address and records the chunk heads memory has, so that
/// [`crate::RemoteFrame::open`] accepts metadata over arbitrary bytes. For the fuzz
/// harness and tests of the decoders only: it defeats the check seals exist for.
///
/// # Errors
/// [`Error::Meta`] for metadata without a seal; transport errors.
#[doc(hidden)]
pub fn forge(env: &FrameEnv, meta: &mut FrameMeta) -> Result<()> {
    let Some(seal) = &meta.seal else {
        return Err(Error::Meta("metadata without a seal".into()));
    };
    let bytes = image(meta, seal.nonce)?;
    env.transport(&seal.element)?
        .write(seal.addr, &bytes)
        .map_err(|e| transport_err("write", &seal.element, seal.addr, SEAL_BYTES, e))?;
    let heads = read_heads(env, meta)?;
    if let Some(seal) = meta.seal.as_mut() {
        seal.chunk_heads = heads;
    }
    Ok(())
}

/// Zeroes `seal`, so the frame's metadata no longer opens.
///
/// # Errors
/// Transport errors.
pub(crate) fn clear(env: &FrameEnv, seal: &Seal) -> Result<()> {
    env.transport(&seal.element)?
        .write(seal.addr, &[0u8; SEAL_BYTES as usize])
        .map_err(|e| transport_err("write", &seal.element, seal.addr, SEAL_BYTES, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonces_differ_and_are_never_zero() {
        let a: Vec<u64> = (0..1000).map(|_| new_nonce()).collect();
        let mut b = a.clone();
        b.sort_unstable();
        b.dedup();
        assert_eq!(b.len(), a.len());
        assert!(a.iter().all(|&n| n != 0));
    }

    #[test]
    fn the_head_is_the_buffer_at_offset_zero() {
        let long = [7u8; 100];
        let pieces: [(u64, &[u8]); 3] = [(0, &[]), (0, &long), (128, &[1, 2])];
        assert_eq!(head_of(pieces), fnv1a(&long[..64]));
        assert_eq!(head_of([(0, &[][..])]), 0);
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
    }
}
