//! Rounds: the pages of one slice of a request pinned or claimed under the lock, their
//! I/O done without it, and their pins released (on every path, by drop).

use std::collections::HashMap;
use std::sync::PoisonError;

use super::eviction::FrameId;
use super::pages::Span;
use super::plan::Plan;
use super::stats;
use super::table::{Dirty, Inner, PageKey, State};
use super::BufferPool;
use crate::error::Result;

/// Whether a round reads or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    Read,
    Write,
}

/// How a round holds a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SlotKind {
    /// Found valid.
    Hit,
    /// Found loading by another thread.
    Wait,
    /// Claimed and fetched by this round.
    Fetch,
    /// Claimed for a whole-page write: filled by this round, never fetched.
    Claim,
    /// Already unpinned (an error path settled it).
    Dead,
}

/// One page a round pinned or claimed.
#[derive(Debug, Clone, Copy)]
pub(super) struct Slot {
    pub(super) frame: FrameId,
    pub(super) key: PageKey,
    pub(super) kind: SlotKind,
    /// Another thread was loading the page when the round found it.
    pub(super) waited: bool,
    pub(super) dirty: Option<Span>,
}

/// The pages one round of a request pinned. Releases its pins when dropped.
pub(super) struct Round<'p> {
    pub(super) pool: &'p BufferPool,
    pub(super) start: usize,
    pub(super) end: usize,
    /// Slot of each piece in `start..end`.
    pub(super) piece_slot: Vec<u32>,
    pub(super) slots: Vec<Slot>,
}

impl Drop for Round<'_> {
    fn drop(&mut self) {
        self.pool.release(&mut self.slots);
    }
}

/// What one classification under the lock decided.
pub(super) struct Claimed<'p> {
    pub(super) round: Round<'p>,
    pub(super) evicted: Vec<Dirty>,
    /// Read-ahead frames (pinned by this round until settled).
    pub(super) ahead: Vec<(FrameId, PageKey)>,
}

impl BufferPool {
    /// Pins or claims the pages of one round starting at piece `start`. `None` if the
    /// very first page can be neither (every frame busy, or the page is being evicted
    /// by another thread): the caller holds nothing and may wait.
    pub(super) fn classify<'p>(
        &'p self,
        inner: &mut Inner,
        plan: &Plan,
        start: usize,
        mode: Mode,
    ) -> Option<Claimed<'p>> {
        let mut round = Round {
            pool: self,
            start,
            end: start,
            piece_slot: Vec::new(),
            slots: Vec::new(),
        };
        let mut evicted = Vec::new();
        let mut local: HashMap<PageKey, u32> = HashMap::new();
        let (mut hits, mut misses, mut ra_hits) = (0u64, 0u64, 0u64);
        let mut i = start;
        while i < plan.pieces.len() {
            let p = plan.pieces[i];
            if let Some(&s) = local.get(&p.key) {
                round.piece_slot.push(s);
                i += 1;
                continue;
            }
            if round.slots.len() >= self.batch_pages {
                break;
            }
            let kind = match inner.table.get(&p.key).copied() {
                Some(f) => {
                    let fr = &mut inner.frames[f as usize];
                    let kind = match fr.state {
                        _ if fr.key != Some(p.key) => None, // being evicted: in flux
                        State::Valid => Some(SlotKind::Hit),
                        State::Loading => Some(SlotKind::Wait),
                        State::Free | State::Failed => None,
                    };
                    let Some(kind) = kind else { break };
                    fr.pins += 1;
                    hits += 1;
                    if std::mem::take(&mut fr.prefetched) {
                        ra_hits += 1;
                    }
                    if kind == SlotKind::Hit {
                        inner.policy.accessed(f);
                    }
                    (f, kind)
                }
                None => {
                    let whole = mode == Mode::Write && p.in_page == 0 && p.len == p.page_len;
                    let Some(f) = self.claim_frame(inner, p.key, &mut evicted) else {
                        break;
                    };
                    misses += 1;
                    (
                        f,
                        if whole {
                            SlotKind::Claim
                        } else {
                            SlotKind::Fetch
                        },
                    )
                }
            };
            let s = round.slots.len() as u32;
            round.slots.push(Slot {
                frame: kind.0,
                key: p.key,
                kind: kind.1,
                waited: kind.1 == SlotKind::Wait,
                dirty: None,
            });
            local.insert(p.key, s);
            round.piece_slot.push(s);
            i += 1;
        }
        round.end = i;
        if round.slots.is_empty() {
            // Nothing pinned, nothing claimed (a deduplicated piece always follows a
            // slotted one, so no piece was taken either).
            return None;
        }
        let mut ahead = Vec::new();
        if mode == Mode::Read && i == plan.pieces.len() {
            let any_miss = round.slots.iter().any(|s| s.kind == SlotKind::Fetch);
            self.claim_read_ahead(inner, plan, any_miss, &mut evicted, &mut ahead);
        }
        stats::Counters::add(&self.counters.hits, hits);
        stats::Counters::add(&self.counters.misses, misses);
        stats::Counters::add(&self.counters.read_ahead_hits, ra_hits);
        Some(Claimed {
            round,
            evicted,
            ahead,
        })
    }

    /// Classifies a round (waiting for frames if none can be had) and does its I/O.
    pub(super) fn acquire<'p>(
        &'p self,
        plan: &Plan,
        start: usize,
        mode: Mode,
    ) -> Result<Round<'p>> {
        let claimed = {
            let mut inner = self.lock();
            loop {
                if let Some(c) = self.classify(&mut inner, plan, start, mode) {
                    break c;
                }
                inner = self
                    .changed
                    .wait(inner)
                    .unwrap_or_else(PoisonError::into_inner);
            }
        };
        let Claimed {
            mut round,
            evicted,
            ahead,
        } = claimed;
        self.transfer(plan, &mut round, &evicted, &ahead)?;
        Ok(round)
    }

    /// A read round: acquired, and every page it waits for loaded by its owner.
    pub(super) fn acquire_read<'p>(&'p self, plan: &Plan, start: usize) -> Result<Round<'p>> {
        loop {
            let mut round = self.acquire(plan, start, Mode::Read)?;
            if self.wait_loading(&mut round) {
                return Ok(round);
            }
        }
    }

    /// Writes back dirty victims, fetches missing pages, and settles the frames.
    pub(super) fn transfer(
        &self,
        plan: &Plan,
        round: &mut Round<'_>,
        evicted: &[Dirty],
        ahead: &[(FrameId, PageKey)],
    ) -> Result<()> {
        let (wb_failed, wb_err) = if evicted.is_empty() {
            (Vec::new(), None)
        } else {
            self.write_back(&plan.entries, evicted)
        };
        let mut fetch: Vec<(FrameId, PageKey)> = round
            .slots
            .iter()
            .filter(|s| s.kind == SlotKind::Fetch)
            .map(|s| (s.frame, s.key))
            .collect();
        fetch.extend_from_slice(ahead);
        let (f_failed, f_err) = if wb_err.is_some() || fetch.is_empty() {
            (Vec::new(), None)
        } else {
            self.fetch(&plan.entries, &fetch)
        };
        stats::Counters::add(&self.counters.read_ahead_pages, ahead.len() as u64);

        let aborted = wb_err.is_some();
        let mut inner = self.lock();
        // Victims: their old page leaves the table once written back; if the write-back
        // failed, the frame goes back to holding the old (still dirty) page.
        for d in evicted {
            let Inner {
                frames,
                table,
                policy,
                ..
            } = &mut *inner;
            let fr = &mut frames[d.frame as usize];
            if wb_failed.contains(&d.key.t) {
                if let Some(new) = fr.key {
                    if table.get(&new) == Some(&d.frame) {
                        table.remove(&new);
                    }
                }
                fr.key = Some(d.key);
                fr.state = State::Valid;
                Span::merge(&mut fr.dirty, d.span);
                fr.pins -= 1;
                policy.inserted(d.frame);
                for s in round.slots.iter_mut().filter(|s| s.frame == d.frame) {
                    s.kind = SlotKind::Dead;
                }
            } else if table.get(&d.key) == Some(&d.frame) {
                table.remove(&d.key);
            }
        }
        let restored = |f: FrameId| {
            evicted
                .iter()
                .any(|d| d.frame == f && wb_failed.contains(&d.key.t))
        };
        for s in round.slots.iter_mut() {
            if !matches!(s.kind, SlotKind::Fetch | SlotKind::Claim) {
                continue;
            }
            if aborted || f_failed.contains(&s.key.t) {
                Self::fail_frame(&mut inner, s.frame, s.key);
                s.kind = SlotKind::Dead;
            } else if s.kind == SlotKind::Fetch {
                inner.frames[s.frame as usize].state = State::Valid;
                inner.policy.inserted(s.frame);
            }
        }
        for &(f, key) in ahead {
            if restored(f) {
                continue;
            }
            if aborted || f_failed.contains(&key.t) {
                Self::fail_frame(&mut inner, f, key);
            } else {
                let fr = &mut inner.frames[f as usize];
                fr.state = State::Valid;
                fr.prefetched = true;
                fr.pins -= 1;
                inner.policy.inserted(f);
            }
        }
        drop(inner);
        self.changed.notify_all();
        match wb_err.or(f_err) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Waits until every page of `round` that another thread was loading is valid.
    /// False if one of those loads failed: the round is then released.
    pub(super) fn wait_loading(&self, round: &mut Round<'_>) -> bool {
        if !round.slots.iter().any(|s| s.kind == SlotKind::Wait) {
            return true;
        }
        let mut inner = self.lock();
        loop {
            let mut pending = false;
            let mut failed = false;
            for s in round.slots.iter().filter(|s| s.kind == SlotKind::Wait) {
                let fr = &inner.frames[s.frame as usize];
                match fr.state {
                    State::Valid if fr.key == Some(s.key) => {}
                    State::Loading if fr.key == Some(s.key) => pending = true,
                    _ => failed = true,
                }
            }
            if failed {
                drop(inner);
                self.release(&mut round.slots);
                return false;
            }
            if !pending {
                for s in round.slots.iter_mut().filter(|s| s.kind == SlotKind::Wait) {
                    s.kind = SlotKind::Hit;
                }
                return true;
            }
            inner = self
                .changed
                .wait(inner)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Marks the whole-page claims of a write round valid once they are filled.
    pub(super) fn publish(&self, round: &mut Round<'_>) {
        if !round.slots.iter().any(|s| s.kind == SlotKind::Claim) {
            return;
        }
        let mut inner = self.lock();
        for s in round.slots.iter_mut().filter(|s| s.kind == SlotKind::Claim) {
            inner.frames[s.frame as usize].state = State::Valid;
            inner.policy.inserted(s.frame);
            s.kind = SlotKind::Hit;
        }
        drop(inner);
        self.changed.notify_all();
    }

    /// Unpins every live slot, recording dirty spans; unfilled claims are failed.
    pub(super) fn release(&self, slots: &mut [Slot]) {
        if slots.iter().all(|s| s.kind == SlotKind::Dead) {
            return;
        }
        let mut inner = self.lock();
        for s in slots.iter_mut() {
            match s.kind {
                SlotKind::Dead => continue,
                SlotKind::Claim | SlotKind::Fetch
                    if inner.frames[s.frame as usize].state == State::Loading =>
                {
                    Self::fail_frame(&mut inner, s.frame, s.key);
                }
                _ => {
                    let fr = &mut inner.frames[s.frame as usize];
                    if let Some(span) = s.dirty {
                        Span::merge(&mut fr.dirty, span);
                    }
                    fr.pins -= 1;
                    if fr.state == State::Failed && fr.pins == 0 {
                        fr.state = State::Free;
                        fr.key = None;
                        inner.free.push(s.frame);
                    }
                }
            }
            s.kind = SlotKind::Dead;
        }
        drop(inner);
        self.changed.notify_all();
    }
}
