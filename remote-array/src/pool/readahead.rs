//! Read-ahead: pages fetched before they are asked for, past the end of a sequential
//! read (riding along with its fetch) or named by [`BufferPool::prefetch`].

use super::eviction::FrameId;
use super::pages::page_count;
use super::plan::Plan;
use super::rounds::Round;
use super::table::{Dirty, Inner, PageKey};
use super::{BufferPool, PoolRange};
use crate::error::Result;

impl BufferPool {
    /// Loads the pages of `ranges` that are not cached yet, without copying them
    /// anywhere, so a later read finds them. Best effort: it stops at a quarter of
    /// the pool, and when every frame is pinned; pages prefetched count as read-ahead.
    ///
    /// # Errors
    /// As [`BufferPool::read_many`].
    pub fn prefetch(&self, ranges: &[PoolRange]) -> Result<()> {
        let plan = self.plan(ranges.iter().map(|r| (r.transport, r.addr, r.len)))?;
        let limit = (self.frames / 4).max(1);
        let mut evicted = Vec::new();
        let mut ahead = Vec::new();
        {
            let mut inner = self.lock();
            for p in &plan.pieces {
                if ahead.len() >= limit {
                    break;
                }
                if inner.table.contains_key(&p.key) {
                    continue;
                }
                match self.claim_frame(&mut inner, p.key, &mut evicted) {
                    Some(f) => ahead.push((f, p.key)),
                    None => break,
                }
            }
        }
        let mut round = Round {
            pool: self,
            start: 0,
            end: 0,
            piece_slot: Vec::new(),
            slots: Vec::new(),
        };
        self.transfer(&plan, &mut round, &evicted, &ahead)
    }

    /// Claims frames for up to `read_ahead` pages past each transport's span of a read
    /// that reached its last piece, where the transport is read sequentially and the
    /// round missed; records where each transport's stream now ends.
    pub(super) fn claim_read_ahead(
        &self,
        inner: &mut Inner,
        plan: &Plan,
        any_miss: bool,
        evicted: &mut Vec<Dirty>,
        ahead: &mut Vec<(FrameId, PageKey)>,
    ) {
        for &(t, first, last) in &plan.spans {
            if inner.seq.len() <= t.index() {
                // An element registered since the pool last saw one: no stream yet.
                inner.seq.resize(t.index() + 1, u64::MAX);
            }
            let seq = std::mem::replace(&mut inner.seq[t.index()], last + 1);
            let sequential = seq != u64::MAX && (first == seq || first + 1 == seq);
            if !(any_miss && sequential && self.read_ahead > 0) {
                continue;
            }
            let size = plan.entries[t.index()].size;
            let end = (last + 1 + self.read_ahead as u64).min(page_count(self.page_size, size));
            for page in last + 1..end {
                let key = PageKey { t, page };
                if inner.table.contains_key(&key) {
                    continue;
                }
                match self.claim_frame(inner, key, evicted) {
                    Some(f) => ahead.push((f, key)),
                    None => break,
                }
            }
        }
    }
}
