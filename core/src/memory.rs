//! Owned memory: the address space a memory element serves ([`MemoryRegion`]) and the
//! registered local buffer transports move data into and out of ([`RegisteredBuffer`]).
//!
//! Both are one zeroed, page-aligned anonymous mapping shared between threads: address
//! space is reserved at once and the kernel commits a page only when it is first
//! written (reads of unwritten bytes see the shared zero page), so a memory element of
//! any size starts at once and holds only what was written. This module is where the
//! raw-pointer code lives (the mapping itself in `anon`); everything it exports is
//! safe. Concurrency:
//! - a `MemoryRegion` is split into stripes, each behind a `RwLock`, so concurrent
//!   clients may read and write disjoint stripes in parallel and an access never sees
//!   a half-done write to the same stripe;
//! - a `RegisteredBuffer` hands out guards over byte ranges; overlapping mutable ranges
//!   wait for each other, so a transport filling one page never races a reader of it.

mod anon;

use std::ops::{Deref, DerefMut, Range};
use std::ptr::NonNull;
use std::sync::{Condvar, Mutex, PoisonError, RwLock};

use crate::error::{Error, Result};
use anon::AnonMap;

/// Backs the memory of `buf` with pages now, as if it were written, without changing
/// a byte: a large fresh destination (a new NumPy array, a new `Vec`) is then filled
/// without a page fault per 4 KiB inside the copy or socket receive that fills it,
/// which is cheaper. Only worth it just before `buf` is overwritten whole. Best effort
/// (Linux 5.14 or later; does nothing elsewhere).
pub fn populate_for_write(buf: &mut [u8]) {
    anon::populate_for_write(buf);
}

/// Stripe size of a [`MemoryRegion`]: the unit of locking between concurrent clients.
pub const STRIPE: usize = 256 * 1024;

/// Copies of at least this many bytes lock all their stripes and copy in one call.
const WHOLE_COPY: usize = 512 * 1024;

/// The address space of one memory element: `size` zeroed bytes, readable and writable
/// by many threads at once. Every access is bounds-checked. Pages are committed on
/// first write; a fresh region of any size costs address space, not memory.
pub struct MemoryRegion {
    mem: RawParts,
    stripes: Box<[RwLock<()>]>,
    /// Keeps the memory alive: an anonymous or a shared-memory mapping.
    _owner: Box<dyn std::any::Any + Send + Sync>,
}

/// Pointer and length of a region's memory (owned elsewhere in the region).
#[derive(Debug, Clone, Copy)]
struct RawParts {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: RawParts is a pointer into memory kept alive by the region's owner; the
// region synchronises access through its stripe locks.
unsafe impl Send for RawParts {}
// SAFETY: as above.
unsafe impl Sync for RawParts {}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("size", &self.mem.len)
            .finish()
    }
}

impl MemoryRegion {
    /// Maps a zeroed region of `size` bytes. Nothing is committed until written, so
    /// this takes the same (short) time at any size, and the resident size grows only
    /// with the pages clients write.
    ///
    /// # Errors
    /// [`Error::Alloc`] when the size does not fit this machine's address space or the
    /// kernel refuses the mapping.
    pub fn new(size: u64) -> Result<Self> {
        let map = AnonMap::zeroed(size)?;
        let (ptr, len) = (map.ptr(), map.len());
        // SAFETY: the mapping is `len` bytes, lives as long as `map`, which the region
        // owns, and nothing else refers to it.
        Ok(unsafe { Self::from_raw_parts(ptr, len, Box::new(map)) })
    }

    /// A region over memory owned by `owner` (a shared-memory mapping).
    ///
    /// # Safety
    /// `ptr..ptr+len` must be valid for reads and writes for as long as `owner` lives,
    /// and no Rust reference to it may exist outside this region. Other processes may
    /// write it concurrently (shared memory); their writes race with ours exactly as
    /// one-sided RDMA writes do.
    pub(crate) unsafe fn from_raw_parts(
        ptr: NonNull<u8>,
        len: usize,
        owner: Box<dyn std::any::Any + Send + Sync>,
    ) -> Self {
        let stripes = (0..len.div_ceil(STRIPE)).map(|_| RwLock::new(())).collect();
        MemoryRegion {
            mem: RawParts { ptr, len },
            stripes,
            _owner: owner,
        }
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.mem.len as u64
    }

    /// Start of the region's memory, for registering it with an RDMA device.
    ///
    /// The pointer is valid for `size()` bytes for as long as the region lives. Writing
    /// through it bypasses the stripe locks: only foreign writers that are unordered
    /// with Rust code anyway (RDMA hardware, other processes) may use it, exactly as
    /// with [`MemoryRegion::from_raw_parts`]'s shared memory.
    #[cfg(feature = "rdma")]
    pub(crate) fn as_mut_ptr(&self) -> *mut u8 {
        self.mem.ptr.as_ptr()
    }

    /// Checks that `[addr, addr + len)` lies inside the region.
    ///
    /// # Errors
    /// [`Error::OutOfRange`].
    pub fn check(&self, op: &'static str, addr: u64, len: u64) -> Result<Range<usize>> {
        let size = self.size();
        match addr.checked_add(len) {
            Some(end) if end <= size => Ok(addr as usize..end as usize),
            _ => Err(Error::OutOfRange {
                op,
                addr,
                len,
                size,
            }),
        }
    }

    /// Calls `f` on consecutive pieces of `[addr, addr + len)`, each under its stripe's
    /// read lock, in address order.
    ///
    /// # Errors
    /// [`Error::OutOfRange`], or the first error `f` returns.
    pub fn read_with<E: From<Error>>(
        &self,
        addr: u64,
        len: u64,
        mut f: impl FnMut(&[u8]) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        let range = self.check("read", addr, len)?;
        let mut pos = range.start;
        while pos < range.end {
            let stripe = pos / STRIPE;
            let end = range.end.min((stripe + 1) * STRIPE);
            let _guard = self.stripes[stripe]
                .read()
                .unwrap_or_else(PoisonError::into_inner);
            // SAFETY: pos..end lies inside the allocation (checked above) and inside one
            // stripe whose read lock we hold, so no writer mutates these bytes meanwhile.
            let piece =
                unsafe { std::slice::from_raw_parts(self.mem.ptr.as_ptr().add(pos), end - pos) };
            f(piece)?;
            pos = end;
        }
        Ok(())
    }

    /// Calls `f` on consecutive mutable pieces of `[addr, addr + len)`, each under its
    /// stripe's write lock, in address order.
    ///
    /// # Errors
    /// [`Error::OutOfRange`], or the first error `f` returns.
    pub fn write_with<E: From<Error>>(
        &self,
        addr: u64,
        len: u64,
        mut f: impl FnMut(&mut [u8]) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        let range = self.check("write", addr, len)?;
        let mut pos = range.start;
        while pos < range.end {
            let stripe = pos / STRIPE;
            let end = range.end.min((stripe + 1) * STRIPE);
            let _guard = self.stripes[stripe]
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            // SAFETY: pos..end lies inside the allocation and inside one stripe whose
            // write lock we hold: no other reference to these bytes exists meanwhile.
            let piece = unsafe {
                std::slice::from_raw_parts_mut(self.mem.ptr.as_ptr().add(pos), end - pos)
            };
            f(piece)?;
            pos = end;
        }
        Ok(())
    }

    /// Calls `f` once with the bytes of each of `ranges` (address and length), in
    /// order, holding the read lock of every stripe they touch: taken in address order
    /// (as large copies take theirs), so lockers never wait in a cycle.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for the first range outside the region, or what `f`
    /// returns.
    pub fn read_ranges<T, E: From<Error>>(
        &self,
        ranges: &[(u64, u64)],
        f: impl FnOnce(&[&[u8]]) -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E> {
        let checked = ranges
            .iter()
            .map(|&(addr, len)| self.check("read", addr, len))
            .collect::<Result<Vec<_>>>()?;
        let mut stripes: Vec<usize> = checked
            .iter()
            .filter(|r| !r.is_empty())
            .flat_map(|r| r.start / STRIPE..r.end.div_ceil(STRIPE))
            .collect();
        stripes.sort_unstable();
        stripes.dedup();
        let _guards: Vec<_> = stripes
            .iter()
            .filter_map(|&i| self.stripes.get(i))
            .map(|l| l.read().unwrap_or_else(PoisonError::into_inner))
            .collect();
        let pieces: Vec<&[u8]> = checked
            .iter()
            .map(|r| {
                // SAFETY: each range is inside the allocation (checked above) and we
                // hold the read lock of every stripe the ranges touch until `f`
                // returns, so no writer mutates these bytes while the slices live.
                unsafe { std::slice::from_raw_parts(self.mem.ptr.as_ptr().add(r.start), r.len()) }
            })
            .collect();
        f(&pieces)
    }

    /// Copies `dst.len()` bytes from `addr` into `dst`.
    ///
    /// Large copies take every stripe's lock first (in address order, so lockers never
    /// wait in a cycle) and copy in one call: glibc copies one large block at full
    /// speed into a destination at any alignment, but 256 KiB pieces into a destination
    /// that is not 64-byte aligned at a fraction of it.
    ///
    /// # Errors
    /// [`Error::OutOfRange`].
    pub fn read(&self, addr: u64, dst: &mut [u8]) -> Result<()> {
        if dst.len() >= WHOLE_COPY {
            let range = self.check("read", addr, dst.len() as u64)?;
            let _guards: Vec<_> = self.stripes[range.start / STRIPE..range.end.div_ceil(STRIPE)]
                .iter()
                .map(|l| l.read().unwrap_or_else(PoisonError::into_inner))
                .collect();
            // SAFETY: the range is inside the allocation and we hold the read lock of
            // every stripe it touches, so no writer mutates it meanwhile; `dst` is a
            // separate &mut slice, so the two cannot overlap.
            let src = unsafe {
                std::slice::from_raw_parts(self.mem.ptr.as_ptr().add(range.start), range.len())
            };
            dst.copy_from_slice(src);
            return Ok(());
        }
        let mut done = 0;
        self.read_with(addr, dst.len() as u64, |piece| {
            dst[done..done + piece.len()].copy_from_slice(piece);
            done += piece.len();
            Ok::<_, Error>(())
        })
    }

    /// Copies `src` to `addr` (large copies in one call, as [`MemoryRegion::read`]).
    ///
    /// # Errors
    /// [`Error::OutOfRange`].
    pub fn write(&self, addr: u64, src: &[u8]) -> Result<()> {
        if src.len() >= WHOLE_COPY {
            let range = self.check("write", addr, src.len() as u64)?;
            let _guards: Vec<_> = self.stripes[range.start / STRIPE..range.end.div_ceil(STRIPE)]
                .iter()
                .map(|l| l.write().unwrap_or_else(PoisonError::into_inner))
                .collect();
            // SAFETY: inside the allocation, and we hold the write lock of every stripe
            // the range touches: no other reference to these bytes exists meanwhile.
            let dst = unsafe {
                std::slice::from_raw_parts_mut(self.mem.ptr.as_ptr().add(range.start), range.len())
            };
            dst.copy_from_slice(src);
            return Ok(());
        }
        let mut done = 0;
        self.write_with(addr, src.len() as u64, |piece| {
            let n = piece.len();
            piece.copy_from_slice(&src[done..done + n]);
            done += n;
            Ok::<_, Error>(())
        })
    }
}

/// The local buffer a transport reads into and writes from, as in the original libd:
/// one zeroed, page-aligned mapping that several transports may share (committed page
/// by page as it is first written).
///
/// Rust code reaches its bytes through guards over ranges: any number of shared guards,
/// or one mutable guard, may cover a byte at a time; asking for a conflicting guard
/// waits until the range is free. Foreign code (NumPy, RDMA hardware) uses
/// [`RegisteredBuffer::as_ptr`] and is responsible for its own ordering, exactly as
/// with an RDMA memory region.
#[derive(Debug)]
pub struct RegisteredBuffer {
    mem: AnonMap,
    /// Unique for the life of the process, so a cache keyed by it (RDMA memory
    /// registrations) never mistakes a new buffer at a reused address for an old one.
    id: u64,
    locks: Mutex<Vec<(Range<usize>, bool)>>,
    freed: Condvar,
}

impl RegisteredBuffer {
    /// Maps a zeroed buffer of `len` bytes.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero length, [`Error::Alloc`] if allocation fails.
    pub fn new(len: usize) -> Result<Self> {
        if len == 0 {
            return Err(Error::InvalidArgument(
                "a registered buffer needs at least one byte".into(),
            ));
        }
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Ok(RegisteredBuffer {
            mem: AnonMap::zeroed(len as u64)?,
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            locks: Mutex::new(Vec::new()),
            freed: Condvar::new(),
        })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.mem.len()
    }

    /// Always false: buffers have at least one byte.
    pub fn is_empty(&self) -> bool {
        self.mem.len() == 0
    }

    /// Start of the buffer, for foreign code (the Python buffer protocol, RDMA memory
    /// registration). Valid as long as the buffer lives.
    pub fn as_ptr(&self) -> *mut u8 {
        self.mem.ptr().as_ptr()
    }

    /// An identifier no other buffer of this process ever has.
    #[cfg_attr(not(feature = "rdma"), allow(dead_code))]
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    fn check(&self, offset: usize, len: usize) -> Result<Range<usize>> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => Ok(offset..end),
            _ => Err(Error::BufferRange {
                offset,
                len,
                size: self.len(),
            }),
        }
    }

    fn acquire(&self, ranges: &[Range<usize>], exclusive: bool) {
        let mut held = self.locks.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            let conflict = ranges.iter().any(|r| {
                held.iter()
                    .any(|(h, h_excl)| (exclusive || *h_excl) && r.start < h.end && h.start < r.end)
            });
            if !conflict {
                held.extend(ranges.iter().map(|r| (r.clone(), exclusive)));
                return;
            }
            held = self
                .freed
                .wait(held)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn release(&self, range: &Range<usize>, exclusive: bool) {
        let mut held = self.locks.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(i) = held.iter().position(|(h, e)| h == range && *e == exclusive) {
            held.swap_remove(i);
        }
        drop(held);
        self.freed.notify_all();
    }

    /// Shared access to `len` bytes at `offset`; waits while a mutable guard overlaps.
    ///
    /// # Errors
    /// [`Error::BufferRange`] if the range is outside the buffer.
    pub fn range(&self, offset: usize, len: usize) -> Result<BufferRef<'_>> {
        let range = self.check(offset, len)?;
        self.acquire(std::slice::from_ref(&range), false);
        Ok(BufferRef { buf: self, range })
    }

    /// Exclusive access to `len` bytes at `offset`; waits while any guard overlaps.
    ///
    /// # Errors
    /// [`Error::BufferRange`] if the range is outside the buffer.
    pub fn range_mut(&self, offset: usize, len: usize) -> Result<BufferMut<'_>> {
        Ok(self
            .ranges_mut(&[(offset, len)])?
            .pop()
            .unwrap_or_else(|| unreachable!("one range asked, one returned")))
    }

    /// Exclusive access to several disjoint ranges at once (taken atomically, so two
    /// threads asking for overlapping sets cannot deadlock).
    ///
    /// # Errors
    /// [`Error::BufferRange`] for a range outside the buffer, [`Error::InvalidArgument`]
    /// if two of the ranges overlap.
    pub fn ranges_mut(&self, ranges: &[(usize, usize)]) -> Result<Vec<BufferMut<'_>>> {
        let checked: Vec<Range<usize>> = ranges
            .iter()
            .map(|&(o, l)| self.check(o, l))
            .collect::<Result<_>>()?;
        let mut sorted = checked.clone();
        sorted.sort_by_key(|r| r.start);
        if let Some(w) = sorted.windows(2).find(|w| w[0].end > w[1].start) {
            return Err(Error::InvalidArgument(format!(
                "buffer ranges {:?} and {:?} overlap",
                w[0], w[1]
            )));
        }
        self.acquire(&checked, true);
        Ok(checked
            .into_iter()
            .map(|range| BufferMut { buf: self, range })
            .collect())
    }

    /// Copies `dst.len()` bytes at `offset` into `dst`.
    ///
    /// # Errors
    /// [`Error::BufferRange`].
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        dst.copy_from_slice(&self.range(offset, dst.len())?);
        Ok(())
    }

    /// Copies `src` into the buffer at `offset`.
    ///
    /// # Errors
    /// [`Error::BufferRange`].
    pub fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.range_mut(offset, src.len())?.copy_from_slice(src);
        Ok(())
    }
}

/// Shared access to a range of a [`RegisteredBuffer`]; released on drop.
#[derive(Debug)]
pub struct BufferRef<'a> {
    buf: &'a RegisteredBuffer,
    range: Range<usize>,
}

impl Deref for BufferRef<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the range is inside the allocation (checked when the guard was made),
        // and the lock table guarantees no mutable guard overlaps it while we live.
        unsafe {
            std::slice::from_raw_parts(self.buf.as_ptr().add(self.range.start), self.range.len())
        }
    }
}

impl Drop for BufferRef<'_> {
    fn drop(&mut self) {
        self.buf.release(&self.range, false);
    }
}

/// Exclusive access to a range of a [`RegisteredBuffer`]; released on drop.
#[derive(Debug)]
pub struct BufferMut<'a> {
    buf: &'a RegisteredBuffer,
    range: Range<usize>,
}

impl BufferMut<'_> {
    /// Offset of this range in the buffer.
    pub fn offset(&self) -> usize {
        self.range.start
    }
}

impl Deref for BufferMut<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: inside the allocation, and no other guard overlaps an exclusive one.
        unsafe {
            std::slice::from_raw_parts(self.buf.as_ptr().add(self.range.start), self.range.len())
        }
    }
}

impl DerefMut for BufferMut<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: inside the allocation; this guard is the only one over the range, and
        // `&mut self` makes the returned slice the only reference through it.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.buf.as_ptr().add(self.range.start),
                self.range.len(),
            )
        }
    }
}

impl Drop for BufferMut<'_> {
    fn drop(&mut self) {
        self.buf.release(&self.range, true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn region_round_trip_across_stripes() {
        let region = MemoryRegion::new(3 * STRIPE as u64 + 10).unwrap();
        let data: Vec<u8> = (0..2 * STRIPE + 7).map(|i| (i * 31 % 251) as u8).collect();
        region.write(STRIPE as u64 - 3, &data).unwrap();
        let mut back = vec![0; data.len()];
        region.read(STRIPE as u64 - 3, &mut back).unwrap();
        assert_eq!(back, data);
        let mut head = [1u8; 4];
        region.read(0, &mut head).unwrap();
        assert_eq!(head, [0; 4], "untouched bytes stay zero");
    }

    #[test]
    fn piecewise_copies_cross_stripes() {
        let region = MemoryRegion::new(2 * STRIPE as u64).unwrap();
        let data: Vec<u8> = (0..STRIPE + 999).map(|i| (i % 241) as u8).collect();
        assert!(data.len() < WHOLE_COPY);
        region.write(STRIPE as u64 / 2, &data).unwrap();
        let mut back = vec![0; data.len()];
        region.read(STRIPE as u64 / 2, &mut back).unwrap();
        assert_eq!(back, data);
    }

    #[test]
    fn ranges_are_read_whole_under_their_stripes_locks_in_order() {
        let region = MemoryRegion::new(3 * STRIPE as u64).unwrap();
        let data: Vec<u8> = (0..3 * STRIPE).map(|i| (i % 239) as u8).collect();
        region.write(0, &data).unwrap();
        // Across a stripe, within one, before the first (out of address order),
        // overlapping another, and empty.
        let ranges = [
            (STRIPE as u64 - 5, 10),
            (2 * STRIPE as u64 + 7, 100),
            (3, 4),
            (STRIPE as u64 - 2, 3),
            (9, 0),
        ];
        let got: Vec<Vec<u8>> = region
            .read_ranges(&ranges, |pieces| {
                Ok::<_, Error>(pieces.iter().map(|p| p.to_vec()).collect())
            })
            .unwrap();
        let want: Vec<Vec<u8>> = ranges
            .iter()
            .map(|&(a, l)| data[a as usize..(a + l) as usize].to_vec())
            .collect();
        assert_eq!(got, want);
        // A range outside the region fails before `f` runs; the locks are free after.
        let err = region
            .read_ranges(&[(0, 1), (3 * STRIPE as u64, 1)], |_| -> Result<()> {
                panic!("called on a bad range")
            })
            .unwrap_err();
        assert!(matches!(err, Error::OutOfRange { .. }), "{err}");
        region.write(0, &[1]).unwrap();
    }

    #[test]
    fn region_rejects_out_of_range() {
        let region = MemoryRegion::new(100).unwrap();
        let mut buf = [0u8; 10];
        assert!(matches!(
            region.read(95, &mut buf),
            Err(Error::OutOfRange {
                addr: 95,
                len: 10,
                size: 100,
                ..
            })
        ));
        assert!(region.write(u64::MAX - 2, &buf).is_err());
        region.read(90, &mut buf).unwrap();
        region.read(100, &mut []).unwrap();
        assert!(region.read(101, &mut []).is_err());
    }

    #[test]
    fn huge_region_is_refused_cleanly() {
        assert!(matches!(
            MemoryRegion::new(u64::MAX),
            Err(Error::Alloc { .. })
        ));
    }

    #[test]
    fn buffer_ranges_are_checked_and_exclusive() {
        let buf = Arc::new(RegisteredBuffer::new(64).unwrap());
        assert!(RegisteredBuffer::new(0).is_err());
        assert!(matches!(buf.range(60, 5), Err(Error::BufferRange { .. })));
        assert!(matches!(
            buf.range_mut(usize::MAX, 2),
            Err(Error::BufferRange { .. })
        ));
        assert!(matches!(
            buf.ranges_mut(&[(0, 8), (4, 8)]),
            Err(Error::InvalidArgument(_))
        ));
        let mut guards = buf.ranges_mut(&[(0, 8), (8, 8)]).unwrap();
        guards[0].fill(1);
        guards[1].fill(2);
        let buf2 = Arc::clone(&buf);
        let waiter = std::thread::spawn(move || {
            // Blocks until the main thread drops its guards.
            let r = buf2.range(4, 8).unwrap();
            r.to_vec()
        });
        std::thread::sleep(std::time::Duration::from_millis(20));
        guards[1][0] = 9;
        drop(guards);
        assert_eq!(waiter.join().unwrap(), vec![1, 1, 1, 1, 9, 2, 2, 2]);
        let shared_a = buf.range(0, 4).unwrap();
        let shared_b = buf.range(2, 4).unwrap();
        assert_eq!(&shared_a[2..4], &shared_b[..2], "shared guards may overlap");
    }
}
