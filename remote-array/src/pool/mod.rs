//! [`BufferPool`]: a page cache in front of one or more transports.
//!
//! # Layout
//! The pool owns one [`RegisteredBuffer`] cut into `frames` frames of `page_size`
//! bytes. Remote memory is cut into pages the same way; a page is named by
//! (transport, page number) and lives in at most one frame. A page table maps page
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

mod eviction;
mod pages;
mod stats;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, RwLock};

use scad_core::{ReadOp, RegisteredBuffer, Transport, WriteOp};

use crate::error::{Error, Result};
use eviction::{Eviction, FrameId};
use pages::{page_count, page_len, split, Span};

pub use eviction::EvictionPolicy;
pub use stats::{PoolStats, PoolUsage};

pub(crate) use stats::human_bytes;

/// Names a transport registered with one [`BufferPool`] (see
/// [`BufferPool::add_transport`]). Only meaningful for the pool that returned it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TransportId(u32);

impl TransportId {
    /// The index of the transport in its pool, in registration order.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for TransportId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// One range of a [`BufferPool::read_many`] call: fill `dst` from `addr` of `transport`.
#[derive(Debug)]
pub struct PoolRead<'a> {
    /// Transport to read from.
    pub transport: TransportId,
    /// Remote address.
    pub addr: u64,
    /// Destination; its length is the number of bytes read.
    pub dst: &'a mut [u8],
}

/// One range of a [`BufferPool::write_many`] call: store `src` at `addr` of `transport`.
#[derive(Debug, Clone, Copy)]
pub struct PoolWrite<'a> {
    /// Transport to write to.
    pub transport: TransportId,
    /// Remote address.
    pub addr: u64,
    /// Source; its length is the number of bytes written.
    pub src: &'a [u8],
}

/// One remote range, for [`BufferPool::prefetch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolRange {
    /// Transport the range lives on.
    pub transport: TransportId,
    /// Remote address.
    pub addr: u64,
    /// Length in bytes.
    pub len: usize,
}

/// [`BufferPool::read_direct`] populates destinations of at least this many bytes.
const DIRECT_POPULATE: usize = 1 << 20;

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
            transports: RwLock::new(Vec::new()),
            counters: stats::Counters::default(),
        })
    }
}

/// A page's name: (transport, page number).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct PageKey {
    t: TransportId,
    page: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum State {
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

#[derive(Debug, Default)]
struct Frame {
    key: Option<PageKey>,
    state: State,
    pins: u32,
    dirty: Option<Span>,
    /// Fetched by read-ahead and not used since.
    prefetched: bool,
}

struct Inner {
    frames: Vec<Frame>,
    table: HashMap<PageKey, FrameId>,
    free: Vec<FrameId>,
    policy: Box<dyn Eviction>,
    /// Per transport: the page after the last page the last read touched.
    seq: Vec<u64>,
}

/// A registered transport.
#[derive(Debug)]
struct Entry {
    name: String,
    transport: Arc<dyn Transport>,
    size: u64,
}

/// A page cache over one or more transports; see the [module docs](self) for how a
/// request moves through it and for the concurrency story. `Send + Sync`: share it
/// with an `Arc`.
///
/// # Example
/// ```
/// use std::sync::Arc;
/// use scad_core::transport::LocalTransport;
/// use scad_remote_array::{BufferPool, EvictionPolicy};
///
/// let pool = BufferPool::builder(1 << 20)
///     .page_size(4096)
///     .policy(EvictionPolicy::Lru)
///     .build()?;
/// let mem = pool.add_transport("mem0", Arc::new(LocalTransport::new(1 << 22)?))?;
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
    transports: RwLock<Vec<Arc<Entry>>>,
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
            human_bytes(self.capacity() as u64),
            self.frames,
            human_bytes(self.page_size as u64),
            self.policy,
            self.stats()
        )
    }
}

/// One piece of a request: the part of one range that falls in one page.
#[derive(Debug, Clone, Copy)]
struct Piece {
    key: PageKey,
    in_page: u32,
    len: u32,
    /// Bytes of the page inside the remote space.
    page_len: u32,
    /// Index of the request range and offset inside it.
    seg: u32,
    seg_off: usize,
}

/// A request cut into pieces.
struct Plan {
    pieces: Vec<Piece>,
    entries: Vec<Arc<Entry>>,
    /// Per transport touched: (transport, first page, last page).
    spans: Vec<(TransportId, u64, u64)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Read,
    Write,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotKind {
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

#[derive(Debug, Clone, Copy)]
struct Slot {
    frame: FrameId,
    key: PageKey,
    kind: SlotKind,
    /// Another thread was loading the page when the round found it.
    waited: bool,
    dirty: Option<Span>,
}

/// A victim whose dirty bytes must be written back before its frame is refilled.
#[derive(Debug, Clone, Copy)]
struct Dirty {
    frame: FrameId,
    key: PageKey,
    span: Span,
}

/// The pages one round of a request pinned. Releases its pins when dropped.
struct Round<'p> {
    pool: &'p BufferPool,
    start: usize,
    end: usize,
    /// Slot of each piece in `start..end`.
    piece_slot: Vec<u32>,
    slots: Vec<Slot>,
}

impl Drop for Round<'_> {
    fn drop(&mut self) {
        self.pool.release(&mut self.slots);
    }
}

/// What one classification under the lock decided.
struct Claimed<'p> {
    round: Round<'p>,
    evicted: Vec<Dirty>,
    /// Read-ahead frames (pinned by this round until settled).
    ahead: Vec<(FrameId, PageKey)>,
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
        }
    }

    /// Registers a transport under `name` (used in error messages and by
    /// [`BufferPool::find_transport`]) and returns its id. Asks the transport for its
    /// remote size once, so requests can be checked locally.
    ///
    /// # Errors
    /// [`Error::DuplicateElement`] if the name is taken; [`Error::Transport`] or
    /// [`Error::Timeout`] if the size cannot be had.
    pub fn add_transport(&self, name: &str, transport: Arc<dyn Transport>) -> Result<TransportId> {
        let size = transport
            .remote_size()
            .map_err(|e| Error::transport("size", name, 0, 0, e))?;
        let mut list = self
            .transports
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if list.iter().any(|e| e.name == name) {
            return Err(Error::DuplicateElement {
                name: name.to_owned(),
            });
        }
        let id = TransportId(list.len() as u32);
        list.push(Arc::new(Entry {
            name: name.to_owned(),
            transport,
            size,
        }));
        self.lock().seq.push(u64::MAX);
        Ok(id)
    }

    /// The id of the transport registered as `name`.
    pub fn find_transport(&self, name: &str) -> Option<TransportId> {
        self.entries()
            .iter()
            .position(|e| e.name == name)
            .map(|i| TransportId(i as u32))
    }

    /// The transport registered as `id`.
    pub fn transport(&self, id: TransportId) -> Option<Arc<dyn Transport>> {
        self.entry(id).map(|e| Arc::clone(&e.transport))
    }

    /// The name `id` was registered under.
    pub fn transport_name(&self, id: TransportId) -> Option<String> {
        self.entry(id).map(|e| e.name.clone())
    }

    /// The remote size of transport `id`, as it was when registered.
    pub fn transport_size(&self, id: TransportId) -> Option<u64> {
        self.entry(id).map(|e| e.size)
    }

    /// Names of the registered transports, in id order.
    pub fn transport_names(&self) -> Vec<String> {
        self.entries().iter().map(|e| e.name.clone()).collect()
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
    pub fn read(&self, transport: TransportId, addr: u64, dst: &mut [u8]) -> Result<()> {
        self.read_many(&mut [PoolRead {
            transport,
            addr,
            dst,
        }])
    }

    /// Reads `dst.len()` bytes at `addr` of `transport` into `dst` around the cache:
    /// the bytes move from the memory element straight into `dst` in one transport
    /// call (no copy through a frame, no eviction, nothing cached), and then every page
    /// the pool holds in that range (dirty or not) is copied over them from its frame,
    /// so `dst` ends up exactly as [`BufferPool::read`] would fill it. Pages another
    /// thread is loading or writing back are read through the pool once that is done.
    ///
    /// Meant for large reads that will not be repeated (materializing a whole array):
    /// it saves the copy out of the frames and leaves the cache to the data in use.
    /// Small or repeated reads are better served by [`BufferPool::read`].
    ///
    /// # Errors
    /// As [`BufferPool::read_many`]. On error the contents of `dst` are unspecified and
    /// no page stays pinned.
    pub fn read_direct(&self, transport: TransportId, addr: u64, dst: &mut [u8]) -> Result<()> {
        let plan = self.plan(std::iter::once((transport, addr, dst.len())))?;
        if plan.pieces.is_empty() {
            return Ok(());
        }
        let entry = Arc::clone(&plan.entries[transport.index()]);
        // Pin the pages the pool holds now: their frames are what a read must return,
        // and pinned they cannot be evicted (written back) under us. Pages in flux
        // (loading, or on their way out with dirty bytes) are read through the pool
        // afterwards, which waits for them; every other page is current remotely.
        let mut pinned = Round {
            pool: self,
            start: 0,
            end: 0,
            piece_slot: Vec::new(),
            slots: Vec::new(),
        };
        let mut in_flux = Vec::new();
        {
            let mut inner = self.lock();
            for (i, p) in plan.pieces.iter().enumerate() {
                let Some(&f) = inner.table.get(&p.key) else {
                    continue;
                };
                let fr = &mut inner.frames[f as usize];
                if fr.key == Some(p.key) && fr.state == State::Valid {
                    fr.pins += 1;
                    pinned.piece_slot.push(i as u32);
                    pinned.slots.push(Slot {
                        frame: f,
                        key: p.key,
                        kind: SlotKind::Hit,
                        waited: false,
                        dirty: None,
                    });
                } else {
                    in_flux.push(i);
                }
            }
        }
        // A large destination is usually fresh (a new array): fault its pages in with
        // one call rather than one fault per page inside the transport's copy.
        if dst.len() >= DIRECT_POPULATE {
            scad_core::memory::populate_for_write(dst);
        }
        entry
            .transport
            .read(addr, dst)
            .map_err(|e| Error::transport("read", &entry.name, addr, dst.len() as u64, e))?;
        stats::Counters::add(&self.counters.bytes_in, dst.len() as u64);
        stats::Counters::add(&self.counters.bytes_direct, dst.len() as u64);
        stats::Counters::add(&self.counters.fetch_calls, 1);
        for (slot, &i) in pinned.slots.iter().zip(&pinned.piece_slot) {
            let p = plan.pieces[i as usize];
            let off = self.frame_off(slot.frame) + p.in_page as usize;
            let g = self
                .buf
                .range(off, p.len as usize)
                .map_err(|source| Error::Frame {
                    source: Box::new(source),
                })?;
            copy_bytes(&mut dst[p.seg_off..p.seg_off + p.len as usize], &g);
        }
        stats::Counters::add(&self.counters.hits, pinned.slots.len() as u64);
        drop(pinned);
        if in_flux.is_empty() {
            return Ok(());
        }
        // Disjoint pieces of `dst`, in address order, for the pool to fill.
        let mut reads = Vec::with_capacity(in_flux.len());
        let mut rest: &mut [u8] = dst;
        let mut consumed = 0;
        for i in in_flux {
            let p = plan.pieces[i];
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(p.seg_off - consumed);
            let (piece, tail) = tail.split_at_mut(p.len as usize);
            reads.push(PoolRead {
                transport,
                addr: addr + p.seg_off as u64,
                dst: piece,
            });
            rest = tail;
            consumed = p.seg_off + p.len as usize;
        }
        self.read_many(&mut reads)
    }

    /// Writes `src` at `addr` of `transport` through the pool (write-back: the bytes
    /// reach remote memory on eviction or [`BufferPool::flush`]).
    ///
    /// # Errors
    /// As [`BufferPool::write_many`].
    pub fn write(&self, transport: TransportId, addr: u64, src: &[u8]) -> Result<()> {
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
    pub fn invalidate(&self, transport: TransportId) -> Result<()> {
        self.flush()?;
        let mut inner = self.lock();
        let Inner {
            frames,
            table,
            free,
            policy,
            ..
        } = &mut *inner;
        for (f, fr) in frames.iter_mut().enumerate() {
            let Some(key) = fr.key else { continue };
            if key.t != transport || fr.state != State::Valid || fr.pins > 0 || fr.dirty.is_some() {
                continue;
            }
            table.remove(&key);
            policy.removed(f as FrameId);
            *fr = Frame::default();
            free.push(f as FrameId);
        }
        Ok(())
    }

    // ----- internals -------------------------------------------------------------

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn entries(&self) -> Vec<Arc<Entry>> {
        self.transports
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn entry(&self, id: TransportId) -> Option<Arc<Entry>> {
        self.transports
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id.index())
            .cloned()
    }

    /// Cuts a request into page pieces, checking every range first.
    fn plan(&self, ranges: impl Iterator<Item = (TransportId, u64, usize)>) -> Result<Plan> {
        let entries = self.entries();
        let mut pieces = Vec::new();
        let mut spans: Vec<(TransportId, u64, u64)> = Vec::new();
        for (seg, (t, addr, len)) in ranges.enumerate() {
            let e = entries.get(t.index()).ok_or_else(|| {
                Error::InvalidArgument(format!("transport {t} is not registered with this pool"))
            })?;
            match addr.checked_add(len as u64) {
                Some(end) if end <= e.size => {}
                _ => {
                    return Err(Error::RemoteRange {
                        element: e.name.clone(),
                        addr,
                        len: len as u64,
                        size: e.size,
                    })
                }
            }
            if len == 0 {
                continue;
            }
            let seg = u32::try_from(seg).map_err(|_| {
                Error::InvalidArgument("more than 2^32 ranges in one request".into())
            })?;
            let first = addr / self.page_size as u64;
            let last = (addr + len as u64 - 1) / self.page_size as u64;
            match spans.iter_mut().find(|s| s.0 == t) {
                Some(s) => {
                    s.1 = s.1.min(first);
                    s.2 = s.2.max(last);
                }
                None => spans.push((t, first, last)),
            }
            pieces.extend(split(addr, len, self.page_size).map(|p| Piece {
                key: PageKey { t, page: p.page },
                in_page: p.in_page as u32,
                len: p.len as u32,
                page_len: page_len(p.page, self.page_size, e.size) as u32,
                seg,
                seg_off: p.range_off,
            }));
        }
        Ok(Plan {
            pieces,
            entries,
            spans,
        })
    }

    /// Takes a frame for `key`: a free one, or the policy's victim. Leaves it loading,
    /// in the table, pinned once; a dirty victim goes to `evicted`. `None` when every
    /// frame is pinned or loading.
    fn claim_frame(
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

    /// Pins or claims the pages of one round starting at piece `start`. `None` if the
    /// very first page can be neither (every frame busy, or the page is being evicted
    /// by another thread): the caller holds nothing and may wait.
    fn classify<'p>(
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
            for &(t, first, last) in &plan.spans {
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
                    match self.claim_frame(inner, key, &mut evicted) {
                        Some(f) => ahead.push((f, key)),
                        None => break,
                    }
                }
            }
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
    fn acquire<'p>(&'p self, plan: &Plan, start: usize, mode: Mode) -> Result<Round<'p>> {
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
    fn acquire_read<'p>(&'p self, plan: &Plan, start: usize) -> Result<Round<'p>> {
        loop {
            let mut round = self.acquire(plan, start, Mode::Read)?;
            if self.wait_loading(&mut round) {
                return Ok(round);
            }
        }
    }

    /// Writes back dirty victims, fetches missing pages, and settles the frames.
    fn transfer(
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

    /// A claimed frame whose load failed: out of the table, freed once unpinned.
    fn fail_frame(inner: &mut Inner, f: FrameId, key: PageKey) {
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

    /// Waits until every page of `round` that another thread was loading is valid.
    /// False if one of those loads failed: the round is then released.
    fn wait_loading(&self, round: &mut Round<'_>) -> bool {
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
    fn publish(&self, round: &mut Round<'_>) {
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
    fn release(&self, slots: &mut [Slot]) {
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

    fn frame_off(&self, f: FrameId) -> usize {
        f as usize * self.page_size
    }

    /// Copies a read round's pieces out of their frames.
    fn copy_out(&self, plan: &Plan, round: &Round<'_>, reads: &mut [PoolRead<'_>]) -> Result<()> {
        for (k, p) in plan.pieces[round.start..round.end].iter().enumerate() {
            let slot = &round.slots[round.piece_slot[k] as usize];
            let off = self.frame_off(slot.frame) + p.in_page as usize;
            let g = self
                .buf
                .range(off, p.len as usize)
                .map_err(|source| Error::Frame {
                    source: Box::new(source),
                })?;
            let dst = &mut reads[p.seg as usize].dst;
            copy_bytes(&mut dst[p.seg_off..p.seg_off + p.len as usize], &g);
        }
        Ok(())
    }

    /// Copies a write round's pieces into their frames: those whose page was waited
    /// for (`waited`), or all the others.
    fn copy_in(
        &self,
        plan: &Plan,
        round: &mut Round<'_>,
        writes: &[PoolWrite<'_>],
        waited: bool,
    ) -> Result<()> {
        for (k, p) in plan.pieces[round.start..round.end].iter().enumerate() {
            let slot = &mut round.slots[round.piece_slot[k] as usize];
            if slot.waited != waited || slot.kind == SlotKind::Dead {
                continue;
            }
            let off = self.frame_off(slot.frame) + p.in_page as usize;
            let mut g = self
                .buf
                .range_mut(off, p.len as usize)
                .map_err(|source| Error::Frame {
                    source: Box::new(source),
                })?;
            let src = writes[p.seg as usize].src;
            copy_bytes(&mut g, &src[p.seg_off..p.seg_off + p.len as usize]);
            let lo = p.in_page as usize;
            Span::merge(&mut slot.dirty, Span::new(lo, lo + p.len as usize));
        }
        Ok(())
    }

    /// Fetches pages into their frames: one vectored read per transport, transports
    /// in parallel. Returns the transports whose fetch failed and the first error.
    fn fetch(
        &self,
        entries: &[Arc<Entry>],
        pages: &[(FrameId, PageKey)],
    ) -> (Vec<TransportId>, Option<Error>) {
        let groups = group_by_transport(pages.iter().map(|&(f, key)| {
            let len = page_len(key.page, self.page_size, entries[key.t.index()].size);
            (
                key.t,
                key.page * self.page_size as u64,
                self.frame_off(f),
                len,
            )
        }));
        self.run_groups(entries, groups, "fetch", |entry, items| {
            let ranges: Vec<(usize, usize)> = items.iter().map(|i| (i.1, i.2)).collect();
            let mut guards = self
                .buf
                .ranges_mut(&ranges)
                .map_err(|source| Error::Frame {
                    source: Box::new(source),
                })?;
            let mut ops: Vec<ReadOp<'_>> = guards
                .iter_mut()
                .zip(items)
                .map(|(g, i)| ReadOp {
                    addr: i.0,
                    dst: &mut g[..],
                })
                .collect();
            entry.transport.read_vectored(&mut ops)?;
            let bytes: usize = items.iter().map(|i| i.2).sum();
            stats::Counters::add(&self.counters.bytes_in, bytes as u64);
            stats::Counters::add(&self.counters.fetch_calls, 1);
            Ok(())
        })
    }

    /// Writes dirty spans back: one vectored write per transport, transports in
    /// parallel. Returns the transports whose write-back failed and the first error.
    fn write_back(
        &self,
        entries: &[Arc<Entry>],
        dirty: &[Dirty],
    ) -> (Vec<TransportId>, Option<Error>) {
        let groups = group_by_transport(dirty.iter().map(|d| {
            let lo = d.span.lo as usize;
            (
                d.key.t,
                d.key.page * self.page_size as u64 + lo as u64,
                self.frame_off(d.frame) + lo,
                d.span.len(),
            )
        }));
        let (failed, err) = self.run_groups(entries, groups, "write-back", |entry, items| {
            let guards = items
                .iter()
                .map(|i| self.buf.range(i.1, i.2))
                .collect::<scad_core::Result<Vec<_>>>()
                .map_err(|source| Error::Frame {
                    source: Box::new(source),
                })?;
            let ops: Vec<WriteOp<'_>> = guards
                .iter()
                .zip(items)
                .map(|(g, i)| WriteOp {
                    addr: i.0,
                    src: &g[..],
                })
                .collect();
            entry.transport.write_vectored(&ops)?;
            let bytes: usize = items.iter().map(|i| i.2).sum();
            stats::Counters::add(&self.counters.bytes_out, bytes as u64);
            Ok(())
        });
        let pages = dirty.iter().filter(|d| !failed.contains(&d.key.t)).count();
        stats::Counters::add(&self.counters.write_backs, pages as u64);
        (failed, err)
    }

    /// Runs `op` for each transport's group, in parallel when there are several.
    fn run_groups(
        &self,
        entries: &[Arc<Entry>],
        groups: Vec<(TransportId, Vec<Item>)>,
        what: &'static str,
        op: impl Fn(&Entry, &[Item]) -> std::result::Result<(), GroupError> + Sync,
    ) -> (Vec<TransportId>, Option<Error>) {
        let run = |(t, items): &(TransportId, Vec<Item>)| -> Result<()> {
            let entry = &entries[t.index()];
            op(entry, items).map_err(|e| match e {
                GroupError::Pool(e) => e,
                GroupError::Core(source) => {
                    let addr = items.first().map_or(0, |i| i.0);
                    let len: usize = items.iter().map(|i| i.2).sum();
                    Error::transport(what, &entry.name, addr, len as u64, source)
                }
            })
        };
        let results: Vec<Result<()>> = if groups.len() <= 1 {
            groups.iter().map(run).collect()
        } else {
            std::thread::scope(|s| {
                let handles: Vec<_> = groups[1..]
                    .iter()
                    .map(|g| {
                        std::thread::Builder::new()
                            .name("scad-pool-io".into())
                            .spawn_scoped(s, move || run(g))
                            .map_err(|_| g)
                    })
                    .collect();
                let mut out = vec![run(&groups[0])];
                for h in handles {
                    out.push(match h {
                        Ok(h) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
                        Err(g) => run(g),
                    });
                }
                out
            })
        };
        let mut failed = Vec::new();
        let mut first = None;
        for (g, r) in groups.iter().zip(results) {
            if let Err(e) = r {
                failed.push(g.0);
                first.get_or_insert(e);
            }
        }
        (failed, first)
    }
}

impl Drop for BufferPool {
    fn drop(&mut self) {
        if let Err(e) = self.flush() {
            tracing::warn!(error = %e, "buffer pool dropped with dirty pages that could not be written back");
        }
    }
}

/// Copies `src` into `dst` (of the same length).
///
/// `memcpy` implementations that use `rep movsb` for mid-sized copies run several
/// times slower on some CPUs (AMD Zen among them) when the destination lies just after
/// the source modulo 4 KiB ("4K aliasing"). Frames are page aligned and large heap
/// buffers start 16 bytes into a page, so a pool hits exactly that case when copying
/// into a fresh `Vec`; there, copy in 512-byte pieces, which take the vector loop.
fn copy_bytes(dst: &mut [u8], src: &[u8]) {
    const PIECE: usize = 512;
    let rel = (dst.as_ptr() as usize).wrapping_sub(src.as_ptr() as usize) % 4096;
    if (1..64).contains(&rel) && src.len() > PIECE {
        for (d, s) in dst.chunks_mut(PIECE).zip(src.chunks(PIECE)) {
            d.copy_from_slice(s);
        }
    } else {
        dst.copy_from_slice(src);
    }
}

/// (remote address, frame offset, length) of one page transfer.
type Item = (u64, usize, usize);

/// Error of one transport group: already a pool error, or a transport error to wrap.
enum GroupError {
    Pool(Error),
    Core(scad_core::Error),
}

impl From<Error> for GroupError {
    fn from(e: Error) -> Self {
        GroupError::Pool(e)
    }
}

impl From<scad_core::Error> for GroupError {
    fn from(e: scad_core::Error) -> Self {
        GroupError::Core(e)
    }
}

/// Groups transfers by transport, each group sorted by remote address.
fn group_by_transport(
    items: impl Iterator<Item = (TransportId, u64, usize, usize)>,
) -> Vec<(TransportId, Vec<Item>)> {
    let mut groups: Vec<(TransportId, Vec<Item>)> = Vec::new();
    for (t, addr, off, len) in items {
        match groups.iter_mut().find(|g| g.0 == t) {
            Some(g) => g.1.push((addr, off, len)),
            None => groups.push((t, vec![(addr, off, len)])),
        }
    }
    for g in &mut groups {
        g.1.sort_unstable_by_key(|i| i.0);
        g.1 = coalesce(&g.1);
    }
    groups
}

/// Merges transfers that are adjacent both remotely and in the frames (consecutive
/// pages in consecutive frames, as a sequential scan usually gets them) into one, so
/// the transport moves fewer, larger pieces.
fn coalesce(items: &[Item]) -> Vec<Item> {
    let mut out: Vec<Item> = Vec::with_capacity(items.len());
    for &(addr, off, len) in items {
        match out.last_mut() {
            Some(last) if last.0 + last.2 as u64 == addr && last.1 + last.2 == off => last.2 += len,
            _ => out.push((addr, off, len)),
        }
    }
    out
}

#[cfg(test)]
mod tests;
