//! [`BufferPool::read_direct`] and [`BufferPool::write_direct`]: large reads straight
//! into the caller's buffer and large writes straight from it, around the cache, with
//! the pages the pool holds kept consistent with them.

use std::sync::Arc;

use super::copy::copy_bytes;
use super::rounds::{Round, Slot, SlotKind};
use super::stats;
use super::table::State;
use super::{BufferPool, ElementId, PoolRead, PoolWrite};
use crate::error::{Error, Result};

/// [`BufferPool::read_direct`] populates destinations of at least this many bytes.
const DIRECT_POPULATE: usize = 1 << 20;

impl BufferPool {
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
    pub fn read_direct(&self, transport: ElementId, addr: u64, dst: &mut [u8]) -> Result<()> {
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

    /// Writes `src` at `addr` of `transport` around the cache: the bytes move from
    /// `src` straight to the memory element in one transport call (no copy into a
    /// frame, no eviction, no write-back later), so a large write costs what the
    /// transport costs. The pages the pool holds in that range end up as
    /// [`BufferPool::write`] would leave them:
    /// - an idle cached page that the write covers (with any dirty bytes it had) is
    ///   dropped from the pool: its bytes are superseded;
    /// - a page the write only partly covers while it has dirty bytes elsewhere, a page
    ///   another request holds (pinned, loading, being written back), and a page
    ///   another thread cached while the direct write was in flight are written again
    ///   through the pool afterwards, so none keeps (or writes back) older bytes.
    ///
    /// Meant for large writes that will not be read back at once (writing out a whole
    /// array): they would otherwise stream through the pool, evicting everything and
    /// writing every page back one round at a time. Small writes are better served by
    /// [`BufferPool::write`], which batches them.
    ///
    /// # Errors
    /// As [`BufferPool::write_many`]. On error some of `src` may have reached the memory
    /// element; the pages the call dropped held nothing that `src` did not overwrite.
    pub fn write_direct(&self, transport: ElementId, addr: u64, src: &[u8]) -> Result<()> {
        let plan = self.plan(std::iter::once((transport, addr, src.len())))?;
        if plan.pieces.is_empty() {
            return Ok(());
        }
        let entry = Arc::clone(&plan.entries[transport.index()]);
        // Pieces to write through the pool after the direct write.
        let mut again: Vec<usize> = Vec::new();
        {
            let mut inner = self.lock();
            for (i, p) in plan.pieces.iter().enumerate() {
                let Some(&f) = inner.table.get(&p.key) else {
                    continue;
                };
                let fr = &inner.frames[f as usize];
                let idle = fr.key == Some(p.key) && fr.state == State::Valid && fr.pins == 0;
                let covered = fr.dirty.is_none_or(|d| {
                    d.lo as usize >= p.in_page as usize
                        && d.hi as usize <= (p.in_page + p.len) as usize
                });
                if idle && covered {
                    inner.forget(f, p.key);
                } else {
                    again.push(i);
                }
            }
        }
        entry
            .transport
            .write(addr, src)
            .map_err(|e| Error::transport("write", &entry.name, addr, src.len() as u64, e))?;
        stats::Counters::add(&self.counters.bytes_out, src.len() as u64);
        stats::Counters::add(&self.counters.bytes_direct_out, src.len() as u64);
        // Pages cached meanwhile (by another thread's request, from bytes fetched
        // before the write landed) get the new bytes too.
        {
            let inner = self.lock();
            for (i, p) in plan.pieces.iter().enumerate() {
                if inner.table.contains_key(&p.key) {
                    again.push(i);
                }
            }
        }
        if again.is_empty() {
            return Ok(());
        }
        again.sort_unstable();
        again.dedup();
        let writes: Vec<PoolWrite<'_>> = again
            .into_iter()
            .map(|i| {
                let p = plan.pieces[i];
                PoolWrite {
                    transport,
                    addr: addr + p.seg_off as u64,
                    src: &src[p.seg_off..p.seg_off + p.len as usize],
                }
            })
            .collect();
        self.write_many(&writes)
    }
}
