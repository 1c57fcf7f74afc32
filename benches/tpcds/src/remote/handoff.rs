//! [`Handoff`]: what one process hands the next — its frame's metadata plus a seal that
//! proves the memory still holds that frame.
//!
//! A frame's metadata alone cannot tell whether its memory was freed and reused, or
//! overwritten, since it was written: the next stage would read someone else's bytes
//! as data (fixed-width columns have no structure to catch it). So every frame a stage
//! hands on gets a 64-byte *seal* in a memory element of its own: a magic word, a
//! random nonce, the row count and a hash of the metadata, plus in the handoff a
//! fingerprint of the first bytes of every chunk. Opening a handoff checks both (one
//! small read per chunk); freeing a frame through [`Handoff::free`] zeroes the seal
//! first. A handoff that does not match fails with [`RemoteError::Stale`].

use std::sync::atomic::{AtomicU64, Ordering};

use scad_remote_array::{AllocationState, RemoteAllocator};
use scad_remote_frame::{FrameEnv, FrameMeta, RemoteFrame};
use serde::{Deserialize, Serialize};

use super::cluster::{Cluster, ALIGN};
use super::error::{FrameContext, RemoteError};

/// Version of the handoff JSON.
pub const HANDOFF_VERSION: u32 = 1;
/// Bytes of a seal in remote memory.
pub const SEAL_BYTES: u64 = 64;
const SEAL_MAGIC: [u8; 8] = *b"SCADSEAL";
/// Bytes of every chunk's head that are fingerprinted.
const HEAD_BYTES: u64 = 64;

/// Where a frame's seal lives and what it and the chunks' heads must hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seal {
    /// Memory element of the seal.
    pub element: String,
    /// Address of the seal's 64 bytes.
    pub addr: u64,
    /// Random value written into the seal.
    pub nonce: u64,
    /// FNV-1a of the first (up to 64) bytes of every chunk, in chunk order.
    pub chunk_heads: Vec<u64>,
}

/// A frame handed from one stage (or the table loader) to the next, as JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Handoff {
    /// [`HANDOFF_VERSION`].
    pub version: u32,
    /// Who wrote the frame: `q1/dates_in_year`, `table/date_dim`.
    pub producer: String,
    /// The frame's metadata.
    pub frame: FrameMeta,
    /// The seal.
    pub seal: Seal,
}

/// 64-bit FNV-1a.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn nonce() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let c = COUNTER.fetch_add(1, Ordering::Relaxed);
    fnv1a(
        &[
            t.to_le_bytes(),
            u64::from(std::process::id()).to_le_bytes(),
            c.to_le_bytes(),
        ]
        .concat(),
    ) | 1
}

fn seal_bytes(nonce: u64, meta: &FrameMeta, meta_hash: u64) -> [u8; SEAL_BYTES as usize] {
    let mut b = [0u8; SEAL_BYTES as usize];
    b[..8].copy_from_slice(&SEAL_MAGIC);
    b[8..16].copy_from_slice(&nonce.to_le_bytes());
    b[16..24].copy_from_slice(&meta.rows.to_le_bytes());
    b[24..32].copy_from_slice(&meta_hash.to_le_bytes());
    b
}

fn meta_hash(meta: &FrameMeta) -> Result<u64, RemoteError> {
    let json = meta
        .to_json()
        .frame_ctx(|| "serializing frame metadata".into())?;
    Ok(fnv1a(json.as_bytes()))
}

fn chunk_heads(cluster: &Cluster, meta: &FrameMeta) -> Result<Vec<u64>, RemoteError> {
    let mut out = Vec::with_capacity(meta.chunks.len());
    let mut buf = [0u8; HEAD_BYTES as usize];
    for (k, c) in meta.chunks.iter().enumerate() {
        let n = c.bytes.min(HEAD_BYTES) as usize;
        if n == 0 {
            out.push(0);
            continue;
        }
        cluster
            .transport(&c.element)?
            .read(c.addr, &mut buf[..n])
            .map_err(|source| RemoteError::Transport {
                context: format!(
                    "reading the head of chunk {k} on {} at {:#x}",
                    c.element, c.addr
                ),
                source,
            })?;
        out.push(fnv1a(&buf[..n]));
    }
    Ok(out)
}

impl Handoff {
    /// Seals `frame` (written by `producer`): allocates and writes its seal, reads
    /// its chunks' heads.
    ///
    /// # Errors
    /// Allocation and transport errors.
    pub fn seal(
        cluster: &Cluster,
        producer: &str,
        frame: &RemoteFrame,
    ) -> Result<Self, RemoteError> {
        let meta = frame.meta().clone();
        let element = meta
            .chunks
            .first()
            .map(|c| c.element.clone())
            .unwrap_or_else(|| cluster.element_names().swap_remove(0));
        let addr = cluster
            .env()
            .elements()
            .allocate(&element, SEAL_BYTES)
            .map_err(|source| RemoteError::Alloc {
                context: format!("allocating the seal of {producer}'s frame on {element}"),
                source,
            })?;
        let nonce = nonce();
        let bytes = seal_bytes(nonce, &meta, meta_hash(&meta)?);
        cluster
            .transport(&element)?
            .write(addr, &bytes)
            .map_err(|source| RemoteError::Transport {
                context: format!("writing the seal of {producer}'s frame"),
                source,
            })?;
        let chunk_heads = chunk_heads(cluster, &meta)?;
        Ok(Handoff {
            version: HANDOFF_VERSION,
            producer: producer.to_string(),
            frame: meta,
            seal: Seal {
                element,
                addr,
                nonce,
                chunk_heads,
            },
        })
    }

    /// The handoff as JSON.
    ///
    /// # Errors
    /// Only if serde fails, which plain data does not.
    pub fn to_json(&self) -> Result<String, RemoteError> {
        serde_json::to_string(self).map_err(|source| RemoteError::BadJson {
            context: format!("serializing the handoff of {}", self.producer),
            source,
        })
    }

    /// Parses a handoff (`context` names it in errors, e.g. the stage input).
    ///
    /// # Errors
    /// [`RemoteError::BadJson`]; [`RemoteError::Frame`] for inconsistent metadata;
    /// [`RemoteError::Invalid`] for another handoff version.
    pub fn from_json(json: &str, context: &str) -> Result<Self, RemoteError> {
        let h: Handoff = serde_json::from_str(json).map_err(|source| RemoteError::BadJson {
            context: context.to_string(),
            source,
        })?;
        if h.version != HANDOFF_VERSION {
            return Err(RemoteError::Invalid(format!(
                "{context}: handoff version {} (this build reads {HANDOFF_VERSION})",
                h.version
            )));
        }
        h.frame
            .validate()
            .frame_ctx(|| format!("{context}: frame of {}", h.producer))?;
        if h.seal.chunk_heads.len() != h.frame.chunks.len() {
            return Err(RemoteError::Invalid(format!(
                "{context}: the seal lists {} chunks, the frame has {}",
                h.seal.chunk_heads.len(),
                h.frame.chunks.len()
            )));
        }
        Ok(h)
    }

    /// Checks that memory still holds this frame: the seal and every chunk's head.
    ///
    /// # Errors
    /// [`RemoteError::Stale`] describing the mismatch; transport errors.
    pub fn verify(&self, cluster: &Cluster, context: &str) -> Result<(), RemoteError> {
        let stale = |reason: String| RemoteError::Stale {
            context: context.to_string(),
            producer: self.producer.clone(),
            reason,
        };
        let mut got = [0u8; SEAL_BYTES as usize];
        cluster
            .transport(&self.seal.element)?
            .read(self.seal.addr, &mut got)
            .map_err(|source| RemoteError::Transport {
                context: format!("{context}: reading the seal of {}", self.producer),
                source,
            })?;
        if got[..8] != SEAL_MAGIC {
            return Err(stale(format!(
                "no seal at {}:{:#x} (the frame was freed, or its memory reused)",
                self.seal.element, self.seal.addr
            )));
        }
        let want = seal_bytes(self.seal.nonce, &self.frame, meta_hash(&self.frame)?);
        if got != want {
            return Err(stale(format!(
                "the seal at {}:{:#x} belongs to another frame or other metadata (the metadata was changed, or the frame rewritten)",
                self.seal.element, self.seal.addr
            )));
        }
        let heads = chunk_heads(cluster, &self.frame)?;
        if let Some(k) = heads
            .iter()
            .zip(&self.seal.chunk_heads)
            .position(|(a, b)| a != b)
        {
            let c = &self.frame.chunks[k];
            return Err(stale(format!(
                "chunk {k} at {}:{:#x} was overwritten since the frame was written",
                c.element, c.addr
            )));
        }
        Ok(())
    }

    /// Opens the frame (after [`Handoff::verify`]) in `env`.
    ///
    /// # Errors
    /// As [`Handoff::verify`]; [`RemoteError::Frame`] for unknown elements.
    pub fn open(
        &self,
        cluster: &Cluster,
        env: &FrameEnv,
        context: &str,
    ) -> Result<RemoteFrame, RemoteError> {
        self.verify(cluster, context)?;
        RemoteFrame::open(env, self.frame.clone())
            .frame_ctx(|| format!("{context}: opening the frame of {}", self.producer))
    }

    /// Zeroes the seal and gives the frame's and the seal's memory back.
    ///
    /// # Errors
    /// Transport and allocator errors.
    pub fn free(&self, cluster: &Cluster) -> Result<(), RemoteError> {
        cluster
            .transport(&self.seal.element)?
            .write(self.seal.addr, &[0u8; SEAL_BYTES as usize])
            .map_err(|source| RemoteError::Transport {
                context: format!("clearing the seal of {}", self.producer),
                source,
            })?;
        let elements = cluster.env().elements();
        let alloc = |source| RemoteError::Alloc {
            context: format!("freeing the frame of {}", self.producer),
            source,
        };
        elements
            .free(&self.seal.element, self.seal.addr, SEAL_BYTES)
            .map_err(alloc)?;
        for c in &self.frame.chunks {
            if c.bytes > 0 {
                elements
                    .free(&c.element, c.addr, c.bytes)
                    .map_err(|source| RemoteError::Alloc {
                        context: format!("freeing the frame of {}", self.producer),
                        source,
                    })?;
            }
        }
        Ok(())
    }
}

/// Allocation past handed-on frames: here rather than in `cluster.rs`, so that the
/// cluster does not depend on handoffs (handoffs depend on the cluster).
impl Cluster {
    /// Moves every element's allocator past the frames and seals of `handoffs`, so
    /// that a stage running in a new process does not allocate over frames other stages
    /// wrote (it knows them only by their handoffs).
    ///
    /// # Errors
    /// [`RemoteError::Alloc`] for an element the cluster lacks or a range beyond it.
    pub fn reserve_past(&self, handoffs: &[&Handoff]) -> Result<(), RemoteError> {
        let elements = self.env().elements();
        let mut next = AllocationState::default();
        for a in &elements.allocation_state().allocators {
            let end = handoffs
                .iter()
                .flat_map(|h| {
                    h.frame
                        .chunks
                        .iter()
                        .filter(|c| c.element == a.element())
                        .map(|c| c.addr.saturating_add(c.bytes))
                        .chain(
                            (h.seal.element == a.element())
                                .then(|| h.seal.addr.saturating_add(SEAL_BYTES)),
                        )
                })
                .max();
            let Some(end) = end else { continue };
            if end <= a.high_water() {
                continue;
            }
            let range = a.range();
            let alloc_err = |source| RemoteError::Alloc {
                context: format!("reserving {} up to {end:#x}", a.element()),
                source,
            };
            let mut fresh =
                RemoteAllocator::new(a.element(), range.clone(), ALIGN).map_err(alloc_err)?;
            fresh
                .allocate(end.saturating_sub(range.start))
                .map_err(|source| RemoteError::Alloc {
                    context: format!("reserving {} up to {end:#x}", a.element()),
                    source,
                })?;
            next.allocators.push(fresh);
        }
        elements
            .resume_allocation(&next)
            .map_err(|source| RemoteError::Alloc {
                context: "resuming allocation past the handed-on frames".into(),
                source,
            })
    }
}
