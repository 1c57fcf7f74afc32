//! The page table: which page each frame holds and in what state, and how a frame is
//! claimed for a page (evicting another) or given up when its load fails.

use std::collections::HashMap;

use super::eviction::{Eviction, FrameId};
use super::pages::Span;
use super::stats;
use super::{BufferPool, ElementId};

/// A page's name: (transport, page number).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct PageKey {
    pub(super) t: ElementId,
    pub(super) page: u64,
}

/// Where a frame is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum State {
    /// In the free list.
    #[default]
    Free,
    /// Claimed for `key`: being written back, fetched or filled by its claimer.
    Loading,
    /// Holds `key`'s bytes.
    Valid,
    /// The load failed; waiters still hold pins. Freed when the last pin goes.
    Failed,
}

/// One frame's entry in the page table.
#[derive(Debug, Default)]
pub(super) struct Frame {
    pub(super) key: Option<PageKey>,
    pub(super) state: State,
    pub(super) pins: u32,
    pub(super) dirty: Option<Span>,
    /// Fetched by read-ahead and not used since.
    pub(super) prefetched: bool,
}

/// What the pool lock guards: the frames, the page table, the free list and the policy.
pub(super) struct Inner {
    pub(super) frames: Vec<Frame>,
    pub(super) table: HashMap<PageKey, FrameId>,
    pub(super) free: Vec<FrameId>,
    pub(super) policy: Box<dyn Eviction>,
    /// Per element id: the page after the last page the last read touched (grown
    /// when a request names an element registered since).
    pub(super) seq: Vec<u64>,
}

impl Inner {
    /// Drops idle frame `f`, which caches `key`, from the pool: out of the table and
    /// the policy, back on the free list.
    pub(super) fn forget(&mut self, f: FrameId, key: PageKey) {
        self.table.remove(&key);
        self.policy.removed(f);
        self.frames[f as usize] = Frame::default();
        self.free.push(f);
    }
}

/// A victim whose dirty bytes must be written back before its frame is refilled.
#[derive(Debug, Clone, Copy)]
pub(super) struct Dirty {
    pub(super) frame: FrameId,
    pub(super) key: PageKey,
    pub(super) span: Span,
}

impl BufferPool {
    /// Takes a frame for `key`: a free one, or the policy's victim. Leaves it loading,
    /// in the table, pinned once; a dirty victim goes to `evicted`. `None` when every
    /// frame is pinned or loading.
    pub(super) fn claim_frame(
        &self,
        inner: &mut Inner,
        key: PageKey,
        evicted: &mut Vec<Dirty>,
    ) -> Option<FrameId> {
        let f = match inner.free.pop() {
            Some(f) => f,
            None => {
                let Inner {
                    frames,
                    policy,
                    table,
                    ..
                } = inner;
                let v = policy.victim(&mut |f| {
                    let fr = &frames[f as usize];
                    fr.pins == 0 && fr.state == State::Valid
                })?;
                let fr = &mut frames[v as usize];
                stats::Counters::add(&self.counters.evictions, 1);
                if let Some(old) = fr.key {
                    match fr.dirty.take() {
                        // The old page stays in the table, its frame loading, until
                        // the write-back is done: nobody may fetch it meanwhile.
                        Some(span) => evicted.push(Dirty {
                            frame: v,
                            key: old,
                            span,
                        }),
                        None => {
                            table.remove(&old);
                        }
                    }
                }
                v
            }
        };
        let fr = &mut inner.frames[f as usize];
        fr.key = Some(key);
        fr.state = State::Loading;
        fr.pins = 1;
        fr.prefetched = false;
        fr.dirty = None;
        inner.table.insert(key, f);
        Some(f)
    }

    /// A claimed frame whose load failed: out of the table, freed once unpinned.
    pub(super) fn fail_frame(inner: &mut Inner, f: FrameId, key: PageKey) {
        if inner.table.get(&key) == Some(&f) {
            inner.table.remove(&key);
        }
        let fr = &mut inner.frames[f as usize];
        fr.pins -= 1;
        fr.state = State::Failed;
        fr.prefetched = false;
        fr.dirty = None;
        if fr.pins == 0 {
            fr.state = State::Free;
            fr.key = None;
            inner.free.push(f);
        }
    }
}
