//! [`BufferPoolBuilder`]: a pool's settings and their defaults, and the checks and
//! allocation that turn them into a [`BufferPool`].

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};

use scad_core::RegisteredBuffer;

use super::eviction::{EvictionPolicy, FrameId};
use super::stats;
use super::table::{Frame, Inner};
use super::BufferPool;
use crate::elements::MemoryElements;
use crate::error::{Error, Result};

/// Default page size: 64 KiB.
pub const DEFAULT_PAGE_SIZE: usize = 64 * 1024;
/// Default number of pages read ahead of a sequential stream.
pub const DEFAULT_READ_AHEAD: usize = 8;
/// Default largest amount of data one round of a request fetches at once.
pub const DEFAULT_BATCH_BYTES: usize = 4 << 20;

/// Settings of a [`BufferPool`]; made by [`BufferPool::builder`].
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until build() is called"]
pub struct BufferPoolBuilder {
    capacity: usize,
    page_size: usize,
    policy: EvictionPolicy,
    read_ahead: usize,
    batch_bytes: usize,
    elements: Option<Arc<MemoryElements>>,
}

impl BufferPoolBuilder {
    /// Page size in bytes: a power of two from 64 B to 1 GiB (default 64 KiB).
    pub fn page_size(mut self, bytes: usize) -> Self {
        self.page_size = bytes;
        self
    }

    /// Eviction policy (default [`EvictionPolicy::Clock`]).
    pub fn policy(mut self, policy: EvictionPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Pages fetched beyond the end of a sequential read that misses (default 8; 0
    /// turns read-ahead off). Read-ahead rides along with the fetch of the miss, in
    /// the same vectored call, and never takes more than a quarter of the frames.
    pub fn read_ahead(mut self, pages: usize) -> Self {
        self.read_ahead = pages;
        self
    }

    /// Largest amount of data one round of a request pins and fetches at once
    /// (default 4 MiB, always at most half the pool).
    pub fn batch_bytes(mut self, bytes: usize) -> Self {
        self.batch_bytes = bytes;
        self
    }

    /// The memory elements to cache pages of (default: a fresh, empty registry, to be
    /// filled through [`BufferPool::elements`]). Share one registry between the pool,
    /// a [`RemoteStore`](crate::RemoteStore) and anything else that reaches the same
    /// elements, so all of them use one transport per name.
    pub fn elements(mut self, elements: Arc<MemoryElements>) -> Self {
        self.elements = Some(elements);
        self
    }

    /// Allocates the frames and builds the pool.
    ///
    /// # Errors
    /// [`Error::Config`] for a page size that is not a power of two in range or a
    /// capacity smaller than one page; [`Error::PoolAlloc`] if the frames cannot be
    /// allocated.
    pub fn build(self) -> Result<BufferPool> {
        let ps = self.page_size;
        if !ps.is_power_of_two() || !(64..=1 << 30).contains(&ps) {
            return Err(Error::Config(format!(
                "page size {ps} is not a power of two between 64 B and 1 GiB"
            )));
        }
        let frames = self.capacity / ps;
        if frames == 0 {
            return Err(Error::Config(format!(
                "capacity of {} bytes holds no page of {ps} bytes",
                self.capacity
            )));
        }
        if frames > u32::MAX as usize / 2 {
            return Err(Error::Config(format!(
                "{frames} frames are too many; use larger pages"
            )));
        }
        let bytes = frames * ps;
        let buf = RegisteredBuffer::new(bytes).map_err(|source| Error::PoolAlloc {
            bytes,
            source: Box::new(source),
        })?;
        let batch_pages = (self.batch_bytes / ps).clamp(1, (frames / 2).max(1));
        let inner = Inner {
            frames: (0..frames).map(|_| Frame::default()).collect(),
            table: HashMap::with_capacity(frames),
            free: (0..frames as FrameId).rev().collect(),
            policy: self.policy.build(frames),
            seq: Vec::new(),
        };
        Ok(BufferPool {
            buf,
            page_size: ps,
            frames,
            policy: self.policy,
            read_ahead: self.read_ahead.min(frames / 4),
            batch_pages,
            inner: Mutex::new(inner),
            changed: Condvar::new(),
            elements: self
                .elements
                .unwrap_or_else(|| Arc::new(MemoryElements::new())),
            counters: stats::Counters::default(),
        })
    }
}

impl BufferPool {
    /// Starts configuring a pool of `capacity_bytes` bytes of frames (rounded down to
    /// whole pages).
    pub fn builder(capacity_bytes: usize) -> BufferPoolBuilder {
        BufferPoolBuilder {
            capacity: capacity_bytes,
            page_size: DEFAULT_PAGE_SIZE,
            policy: EvictionPolicy::default(),
            read_ahead: DEFAULT_READ_AHEAD,
            batch_bytes: DEFAULT_BATCH_BYTES,
            elements: None,
        }
    }
}
