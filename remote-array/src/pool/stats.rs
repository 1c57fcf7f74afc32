//! Counters of a [`crate::BufferPool`].

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of a pool's counters. Page counts are per distinct page per request: a
/// request that touches one page twice counts it once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolStats {
    /// Pages found in the pool (including pages another thread was loading).
    pub hits: u64,
    /// Pages not in the pool that a request had to fetch (or, for whole-page writes,
    /// to claim a frame for).
    pub misses: u64,
    /// Hits on pages that sequential read-ahead had fetched before they were asked for.
    pub read_ahead_hits: u64,
    /// Pages fetched by read-ahead or prefetch.
    pub read_ahead_pages: u64,
    /// Pages evicted to make room.
    pub evictions: u64,
    /// Dirty pages written back (on eviction or flush).
    pub write_backs: u64,
    /// Bytes fetched from memory elements.
    pub bytes_in: u64,
    /// Bytes written to memory elements: dirty pages written back, and direct writes.
    pub bytes_out: u64,
    /// Vectored fetch calls issued (one per memory element per batch).
    pub fetch_calls: u64,
    /// Bytes [`crate::BufferPool::read_direct`] moved straight from memory elements into
    /// callers' buffers, around the cache (also counted in `bytes_in`).
    pub bytes_direct: u64,
    /// Bytes [`crate::BufferPool::write_direct`] moved straight from callers' buffers to
    /// memory elements, around the cache (also counted in `bytes_out`).
    pub bytes_direct_out: u64,
}

impl PoolStats {
    /// Hits over hits plus misses (0 when nothing was asked).
    pub fn hit_ratio(&self) -> f64 {
        let total = self.hits + self.misses;
        if total == 0 {
            0.0
        } else {
            self.hits as f64 / total as f64
        }
    }

    /// The counters accumulated since `earlier` (a snapshot of the same pool).
    pub fn since(&self, earlier: &PoolStats) -> PoolStats {
        PoolStats {
            hits: self.hits.saturating_sub(earlier.hits),
            misses: self.misses.saturating_sub(earlier.misses),
            read_ahead_hits: self.read_ahead_hits.saturating_sub(earlier.read_ahead_hits),
            read_ahead_pages: self
                .read_ahead_pages
                .saturating_sub(earlier.read_ahead_pages),
            evictions: self.evictions.saturating_sub(earlier.evictions),
            write_backs: self.write_backs.saturating_sub(earlier.write_backs),
            bytes_in: self.bytes_in.saturating_sub(earlier.bytes_in),
            bytes_out: self.bytes_out.saturating_sub(earlier.bytes_out),
            fetch_calls: self.fetch_calls.saturating_sub(earlier.fetch_calls),
            bytes_direct: self.bytes_direct.saturating_sub(earlier.bytes_direct),
            bytes_direct_out: self
                .bytes_direct_out
                .saturating_sub(earlier.bytes_direct_out),
        }
    }
}

impl fmt::Display for PoolStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "hits {} ({:.1}%), misses {}, read-ahead {} pages fetched / {} hit, \
             evictions {}, write-backs {}, in {} in {} fetches, out {}",
            self.hits,
            100.0 * self.hit_ratio(),
            self.misses,
            self.read_ahead_pages,
            self.read_ahead_hits,
            self.evictions,
            self.write_backs,
            scad_core::fmt::bytes(self.bytes_in),
            self.fetch_calls,
            scad_core::fmt::bytes(self.bytes_out),
        )?;
        if self.bytes_direct > 0 {
            write!(f, ", direct {}", scad_core::fmt::bytes(self.bytes_direct))?;
        }
        if self.bytes_direct_out > 0 {
            write!(
                f,
                ", direct out {}",
                scad_core::fmt::bytes(self.bytes_direct_out)
            )?;
        }
        Ok(())
    }
}

/// Lock-free counters behind [`PoolStats`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub read_ahead_hits: AtomicU64,
    pub read_ahead_pages: AtomicU64,
    pub evictions: AtomicU64,
    pub write_backs: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub fetch_calls: AtomicU64,
    pub bytes_direct: AtomicU64,
    pub bytes_direct_out: AtomicU64,
}

impl Counters {
    pub fn add(counter: &AtomicU64, n: u64) {
        if n > 0 {
            counter.fetch_add(n, Ordering::Relaxed);
        }
    }

    pub fn snapshot(&self) -> PoolStats {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        PoolStats {
            hits: l(&self.hits),
            misses: l(&self.misses),
            read_ahead_hits: l(&self.read_ahead_hits),
            read_ahead_pages: l(&self.read_ahead_pages),
            evictions: l(&self.evictions),
            write_backs: l(&self.write_backs),
            bytes_in: l(&self.bytes_in),
            bytes_out: l(&self.bytes_out),
            fetch_calls: l(&self.fetch_calls),
            bytes_direct: l(&self.bytes_direct),
            bytes_direct_out: l(&self.bytes_direct_out),
        }
    }
}

/// How the pool's frames are used right now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolUsage {
    /// Frames the pool has.
    pub frames: usize,
    /// Frames holding a page (valid, loading or being written back).
    pub used: usize,
    /// Frames pinned by a request in progress.
    pub pinned: usize,
    /// Frames whose page has changes not yet written back.
    pub dirty: usize,
}

impl fmt::Display for PoolUsage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} of {} frames used, {} pinned, {} dirty",
            self.used, self.frames, self.pinned, self.dirty
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_is_readable() {
        let s = PoolStats {
            hits: 3,
            misses: 1,
            bytes_in: 3 << 20,
            ..Default::default()
        };
        let text = s.to_string();
        assert!(text.contains("hits 3 (75.0%)"), "{text}");
        assert!(text.contains("in 3.0 MiB"), "{text}");
        assert_eq!(scad_core::fmt::bytes(512), "512 B");
        assert_eq!(s.since(&s), PoolStats::default());
    }
}
