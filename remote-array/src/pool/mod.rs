//! [`BufferPool`]: a page cache in front of the memory elements of a
//! [`MemoryElements`] registry.
//!
//! # Layout
//! The pool owns one [`RegisteredBuffer`] cut into `frames` frames of `page_size`
//! bytes. Remote memory is cut into pages the same way; a page is named by
//! (element id, page number) and lives in at most one frame. A page table maps page
//! names to frames; each frame has a pin count, a dirty span and a state (free,
//! loading, valid, failed).
//!
//! # A request
//! [`BufferPool::read_many`] and [`BufferPool::write_many`] take many byte ranges at
//! once (one per extent of an array), cut them at page boundaries and work through the
//! pages in *rounds* of at most `batch` pages (never more than half the frames), so a
//! request of any size streams through the pool. A round
//! 1. under the pool lock, pins every page it finds (a hit), and claims a frame for
//!    every page it does not (a miss): a free frame, or the policy's victim, an
//!    unpinned valid frame;
//! 2. without the lock, writes dirty victims back (one vectored write per transport),
//!    then fetches every missing page (one vectored read per transport, the transports
//!    in parallel on scoped threads); whole-page writes claim a frame without fetching;
//! 3. under the lock, marks fetched frames valid and wakes anyone waiting for them;
//! 4. waits for pages other threads were loading, copies between frames and the
//!    caller's buffers (under the buffer's range guards), and unpins.
//!
//! Reads of more than one round are pipelined: a scoped helper thread acquires the
//! following rounds (up to two ahead) and hands them over a channel while the
//! caller's thread copies, so fetch and copy overlap. Transfers of pages that are
//! adjacent both remotely and in the frames are merged into one piece, so a
//! sequential scan moves large pieces.
//!
//! # Concurrency
//! One mutex guards the page table and frame states and is never held during I/O or
//! copying. A round never waits for anything while it holds a frame that is still
//! loading, and a thread waits for free frames only while it holds no pins at all, so
//! threads cannot deadlock on each other. A page another thread is loading is pinned
//! and waited for rather than fetched twice; if that load fails, the waiter retries
//! and reports its own error. Every path out of a round, error or panic, unpins what
//! the round pinned (the round is a guard that releases on drop).
//!
//! # Consistency
//! The pool is a write-back cache: writes change frames and mark them dirty; dirty
//! pages reach remote memory when they are evicted or on [`BufferPool::flush`]. Only
//! the bytes that were written (the dirty span of each page) are written back. Two
//! pools over the same remote memory are not coherent with each other, as with any
//! client-side cache over one-sided RDMA.
//!
//! # Files
//! `builder.rs` (settings, defaults, allocation), `table.rs` (page table and frame
//! claiming), `plan.rs` (cutting a request into page pieces), `rounds.rs` (pinning,
//! claiming and releasing a round's pages), `readahead.rs` (sequential read-ahead and
//! [`BufferPool::prefetch`]), `io.rs` (vectored fetches and write-backs per
//! transport), `copy.rs` (frames to and from callers' buffers), `direct.rs`
//! ([`BufferPool::read_direct`]), `eviction/` (one file per policy) and `stats.rs`.

mod builder;
mod copy;
mod direct;
mod eviction;
mod io;
mod pages;
mod plan;
mod readahead;
mod rounds;
mod stats;
mod table;

use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use scad_core::RegisteredBuffer;

pub use crate::elements::ElementId;
use crate::elements::MemoryElements;
use crate::error::{Error, Result};
use eviction::FrameId;
use pages::Span;
use rounds::{Mode, Round};
use table::{Dirty, Inner, State};

pub use builder::{BufferPoolBuilder, DEFAULT_BATCH_BYTES, DEFAULT_PAGE_SIZE, DEFAULT_READ_AHEAD};
pub use eviction::EvictionPolicy;
pub use stats::{PoolStats, PoolUsage};

/// One range of a [`BufferPool::read_many`] call: fill `dst` from `addr` of `transport`.
#[derive(Debug)]
pub struct PoolRead<'a> {
    /// Memory element to read from (its id in the pool's [`MemoryElements`]).
    pub transport: ElementId,
    /// Remote address.
    pub addr: u64,
    /// Destination; its length is the number of bytes read.
    pub dst: &'a mut [u8],
}

/// One range of a [`BufferPool::write_many`] call: store `src` at `addr` of `transport`.
#[derive(Debug, Clone, Copy)]
pub struct PoolWrite<'a> {
    /// Memory element to write to (its id in the pool's [`MemoryElements`]).
    pub transport: ElementId,
    /// Remote address.
    pub addr: u64,
    /// Source; its length is the number of bytes written.
    pub src: &'a [u8],
}

/// One remote range, for [`BufferPool::prefetch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolRange {
    /// Memory element the range lives on.
    pub transport: ElementId,
    /// Remote address.
    pub addr: u64,
    /// Length in bytes.
    pub len: usize,
}

/// What the pool knows of a memory element: the registry's entry.
pub(crate) type Entry = crate::elements::Element;

/// A page cache over the memory elements of a [`MemoryElements`] registry; see the
/// [module docs](self) for how a request moves through it and for the concurrency
/// story. Pages are keyed by [`ElementId`]; the pool keeps no transports of its own,
/// so elements registered with the registry after the pool was built are cached too.
/// `Send + Sync`: share it with an `Arc`.
///
/// # Example
/// ```
/// use std::sync::Arc;
/// use scad_core::transport::LocalTransport;
/// use scad_remote_array::{BufferPool, EvictionPolicy, MemoryElements};
///
/// let elements = Arc::new(MemoryElements::new());
/// let mem = elements.add("mem0", Arc::new(LocalTransport::new(1 << 22)?))?;
/// let pool = BufferPool::builder(1 << 20)
///     .page_size(4096)
///     .policy(EvictionPolicy::Lru)
///     .elements(elements)
///     .build()?;
/// pool.write(mem, 10_000, b"cached")?;
/// let mut back = [0u8; 6];
/// pool.read(mem, 10_000, &mut back)?;
/// assert_eq!(&back, b"cached");
/// pool.flush()?; // dirty pages reach the memory element
/// println!("{}", pool.stats());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct BufferPool {
    buf: RegisteredBuffer,
    page_size: usize,
    frames: usize,
    policy: EvictionPolicy,
    read_ahead: usize,
    batch_pages: usize,
    inner: Mutex<Inner>,
    changed: Condvar,
    elements: Arc<MemoryElements>,
    counters: stats::Counters,
}

impl fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferPool")
            .field("page_size", &self.page_size)
            .field("frames", &self.frames)
            .field("policy", &self.policy)
            .field("read_ahead", &self.read_ahead)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl fmt::Display for BufferPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "buffer pool {} ({} frames of {}, {}): {}",
            scad_core::fmt::bytes(self.capacity() as u64),
            self.frames,
            scad_core::fmt::bytes(self.page_size as u64),
            self.policy,
            self.stats()
        )
    }
}

impl BufferPool {
    /// The memory elements the pool caches pages of.
    pub fn elements(&self) -> &Arc<MemoryElements> {
        &self.elements
    }

    /// Page size in bytes.
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Number of frames.
    pub fn frames(&self) -> usize {
        self.frames
    }

    /// Bytes of frame memory (`frames * page_size`).
    pub fn capacity(&self) -> usize {
        self.frames * self.page_size
    }

    /// The eviction policy.
    pub fn policy(&self) -> EvictionPolicy {
        self.policy
    }

    /// Pages read ahead of a sequential stream (after capping to a quarter of the pool).
    pub fn read_ahead_pages(&self) -> usize {
        self.read_ahead
    }

    /// The counters so far.
    pub fn stats(&self) -> PoolStats {
        self.counters.snapshot()
    }

    /// How the frames are used right now.
    pub fn usage(&self) -> PoolUsage {
        let inner = self.lock();
        let mut u = PoolUsage {
            frames: self.frames,
            ..PoolUsage::default()
        };
        for f in &inner.frames {
            if f.state != State::Free {
                u.used += 1;
            }
            if f.pins > 0 {
                u.pinned += 1;
            }
            if f.dirty.is_some() {
                u.dirty += 1;
            }
        }
        u
    }

    /// Reads `dst.len()` bytes at `addr` of `transport` through the pool.
    ///
    /// # Errors
    /// As [`BufferPool::read_many`].
    pub fn read(&self, transport: ElementId, addr: u64, dst: &mut [u8]) -> Result<()> {
        self.read_many(&mut [PoolRead {
            transport,
            addr,
            dst,
        }])
    }

    /// Writes `src` at `addr` of `transport` through the pool (write-back: the bytes
    /// reach remote memory on eviction or [`BufferPool::flush`]).
    ///
    /// # Errors
    /// As [`BufferPool::write_many`].
    pub fn write(&self, transport: ElementId, addr: u64, src: &[u8]) -> Result<()> {
        self.write_many(&[PoolWrite {
            transport,
            addr,
            src,
        }])
    }

    /// Reads many ranges, possibly on different transports, in one request: the
    /// missing pages of each round are fetched with one vectored call per transport,
    /// the transports in parallel. Requests larger than the pool stream through it.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an unknown transport id, [`Error::RemoteRange`]
    /// for a range outside its transport (checked before anything moves),
    /// [`Error::Transport`] / [`Error::Timeout`] when a fetch or write-back fails. On
    /// error the contents of `dst` are unspecified and no page stays pinned.
    pub fn read_many(&self, reads: &mut [PoolRead<'_>]) -> Result<()> {
        let plan = self.plan(reads.iter().map(|r| (r.transport, r.addr, r.dst.len())))?;
        if plan.pieces.is_empty() {
            return Ok(());
        }
        let round = self.acquire_read(&plan, 0)?;
        if round.end == plan.pieces.len() {
            return self.copy_out(&plan, &round, reads);
        }
        // A helper thread acquires (fetches) the following rounds and hands them over
        // a channel while this thread copies: fetch and copy overlap, and the helper
        // may run up to two rounds ahead. It only ever waits for frames that this
        // thread releases without waiting on it, and stops when the channel closes.
        let plan = &plan;
        let first_end = round.end;
        std::thread::scope(|s| {
            let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Round<'_>>>(1);
            let spawned = std::thread::Builder::new()
                .name("scad-pool-fetch".into())
                .spawn_scoped(s, move || {
                    let mut start = first_end;
                    while start < plan.pieces.len() {
                        let next = self.acquire_read(plan, start);
                        let end = next.as_ref().map(|r| r.end).map_err(|_| ());
                        if tx.send(next).is_err() {
                            return; // the copier stopped (error): the round was dropped
                        }
                        match end {
                            Ok(end) => start = end,
                            Err(_) => return,
                        }
                    }
                });
            if spawned.is_err() {
                // No thread to be had: fetch and copy in turn on this one.
                let mut round = round;
                loop {
                    self.copy_out(plan, &round, reads)?;
                    let next = round.end;
                    drop(round);
                    if next == plan.pieces.len() {
                        return Ok(());
                    }
                    round = self.acquire_read(plan, next)?;
                }
            }
            let mut round = round;
            loop {
                let copied = self.copy_out(plan, &round, reads);
                let done = round.end == plan.pieces.len();
                drop(round);
                copied?;
                if done {
                    return Ok(());
                }
                round = match rx.recv() {
                    Ok(next) => next?,
                    // The helper is gone without a word: it panicked; the scope
                    // re-raises that panic when it joins.
                    Err(_) => {
                        return Err(Error::InvalidArgument(
                            "the fetch helper thread died".into(),
                        ))
                    }
                };
            }
        })
    }

    /// Writes many ranges in one request (write-back; see [`BufferPool::write`]).
    /// Whole pages that are not cached are claimed without being fetched; partly
    /// written pages are fetched first.
    ///
    /// # Errors
    /// As [`BufferPool::read_many`]. On error some ranges may have been written into
    /// the pool; none is lost that was.
    pub fn write_many(&self, writes: &[PoolWrite<'_>]) -> Result<()> {
        let plan = self.plan(writes.iter().map(|w| (w.transport, w.addr, w.src.len())))?;
        let mut start = 0;
        while start < plan.pieces.len() {
            let mut round = self.acquire(&plan, start, Mode::Write)?;
            self.copy_in(&plan, &mut round, writes, false)?;
            self.publish(&mut round);
            if !self.wait_loading(&mut round) {
                continue; // someone else's load failed: redo the round (copies are idempotent)
            }
            self.copy_in(&plan, &mut round, writes, true)?;
            start = round.end;
        }
        Ok(())
    }

    /// Writes every dirty page back to its memory element (one vectored write per
    /// transport, the transports in parallel). Pages stay cached, clean.
    ///
    /// # Errors
    /// [`Error::Transport`] / [`Error::Timeout`]; pages whose write-back failed stay
    /// dirty, so a later flush or eviction tries again.
    pub fn flush(&self) -> Result<()> {
        let entries = self.entries();
        let mut dirty = Vec::new();
        {
            let mut inner = self.lock();
            for (f, fr) in inner.frames.iter_mut().enumerate() {
                if fr.state != State::Valid {
                    continue;
                }
                if let (Some(key), Some(span)) = (fr.key, fr.dirty) {
                    fr.dirty = None;
                    fr.pins += 1;
                    dirty.push(Dirty {
                        frame: f as FrameId,
                        key,
                        span,
                    });
                }
            }
        }
        if dirty.is_empty() {
            return Ok(());
        }
        let (failed, err) = self.write_back(&entries, &dirty);
        {
            let mut inner = self.lock();
            for d in &dirty {
                let fr = &mut inner.frames[d.frame as usize];
                if failed.contains(&d.key.t) {
                    Span::merge(&mut fr.dirty, d.span);
                }
                fr.pins -= 1;
            }
        }
        self.changed.notify_all();
        err.map_or(Ok(()), Err)
    }

    /// Forgets the cached pages of `transport`, so the next read fetches them afresh
    /// (use it when another element may have changed that memory). Dirty pages are
    /// written back first; pages pinned by a request in progress stay.
    ///
    /// # Errors
    /// As [`BufferPool::flush`]; nothing is forgotten if the write-back fails.
    pub fn invalidate(&self, transport: ElementId) -> Result<()> {
        self.flush()?;
        let mut inner = self.lock();
        for f in 0..inner.frames.len() {
            let fr = &inner.frames[f];
            let Some(key) = fr.key else { continue };
            if key.t == transport && fr.state == State::Valid && fr.pins == 0 && fr.dirty.is_none()
            {
                inner.forget(f as FrameId, key);
            }
        }
        Ok(())
    }

    // ----- internals -------------------------------------------------------------

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn entries(&self) -> Vec<Arc<Entry>> {
        self.elements.list()
    }
}

impl Drop for BufferPool {
    fn drop(&mut self) {
        if let Err(e) = self.flush() {
            tracing::warn!(error = %e, "buffer pool dropped with dirty pages that could not be written back");
        }
    }
}

#[cfg(test)]
mod tests;
