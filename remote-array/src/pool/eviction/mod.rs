//! Eviction policies: which unpinned frame gives up its page when the pool is full.
//!
//! Each policy lives in its own file behind the [`Eviction`] trait and is chosen by
//! [`EvictionPolicy`]. The pool calls the policy under its own lock, so policies are
//! plain single-threaded data structures over frame numbers.

mod clock;
mod lru;

pub(crate) use clock::Clock;
pub(crate) use lru::Lru;

/// Index of a frame in the pool.
pub(crate) type FrameId = u32;

/// Which eviction policy a [`crate::BufferPool`] uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EvictionPolicy {
    /// CLOCK (second chance): a hand sweeps the frames, clearing reference bits, and
    /// takes the first unreferenced unpinned frame. Cheap on hits (one bit set).
    #[default]
    Clock,
    /// Least recently used: a list ordered by last access; the least recent unpinned
    /// frame is taken. Exact recency at the cost of relinking on every hit.
    Lru,
}

impl EvictionPolicy {
    /// A fresh policy state for `frames` frames.
    pub(crate) fn build(self, frames: usize) -> Box<dyn Eviction> {
        match self {
            EvictionPolicy::Clock => Box::new(Clock::new(frames)),
            EvictionPolicy::Lru => Box::new(Lru::new(frames)),
        }
    }
}

impl std::fmt::Display for EvictionPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EvictionPolicy::Clock => "CLOCK",
            EvictionPolicy::Lru => "LRU",
        })
    }
}

/// The bookkeeping of one eviction policy.
///
/// A frame is *tracked* from `inserted` until `removed` (or until `victim` returns it,
/// which also stops tracking it). The pool only asks for a victim among tracked frames
/// and tells the policy which of them may go right now (unpinned, not being loaded).
pub(crate) trait Eviction: Send + std::fmt::Debug {
    /// A page was loaded into `frame`.
    fn inserted(&mut self, frame: FrameId);
    /// The page in `frame` was used again.
    fn accessed(&mut self, frame: FrameId);
    /// `frame` no longer holds a page (dropped without eviction).
    fn removed(&mut self, frame: FrameId);
    /// Chooses a frame to evict among those `evictable` accepts and stops tracking it;
    /// `None` if no tracked frame is evictable.
    fn victim(&mut self, evictable: &mut dyn FnMut(FrameId) -> bool) -> Option<FrameId>;
}
