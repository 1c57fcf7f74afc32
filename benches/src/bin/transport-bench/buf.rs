//! Buffers at a controlled position within a page.
//!
//! Where a buffer starts matters on this kind of machine: glibc's `memcpy` (and the
//! kernel's `copy_to_user`) use `rep movsb` for mid-sized copies, which on some CPUs
//! (AMD Zen with FSRM among them) is many times slower when the destination sits a
//! little past the source modulo 64. A `Vec<u8>` from `malloc` starts 16 bytes into a
//! page for large sizes, a registered buffer at a page boundary; the benchmark measures
//! both instead of whatever the allocator happens to return.

use std::ops::{Deref, DerefMut};

/// Page size assumed for alignment.
pub const PAGE_ALIGN: usize = 4096;

/// `len` bytes starting `offset` bytes after a page boundary, all pages faulted in.
#[derive(Debug, Clone)]
pub struct PlacedBuf {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl PlacedBuf {
    /// A buffer of `len` bytes of `fill`, starting `offset` (< 4096) bytes into a page.
    pub fn filled(len: usize, offset: usize, fill: u8) -> Self {
        let offset = offset % PAGE_ALIGN;
        // Writing every byte faults every page in, so no measurement pays for it.
        // (A non-zero fill first: a zero fill could come from untouched `calloc` pages.)
        let mut storage = vec![1u8; len + 2 * PAGE_ALIGN];
        if fill != 1 {
            storage.fill(fill);
        }
        let start = storage.as_ptr().align_offset(PAGE_ALIGN) + offset;
        PlacedBuf {
            storage,
            start,
            len,
        }
    }

    /// A copy of `data`, starting `offset` bytes into a page.
    pub fn copy_of(data: &[u8], offset: usize) -> Self {
        let mut buf = Self::filled(data.len(), offset, 0);
        buf.copy_from_slice(data);
        buf
    }
}

impl Deref for PlacedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }
}

impl DerefMut for PlacedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement() {
        for offset in [0, 16, 4095] {
            let b = PlacedBuf::filled(10_000, offset, 7);
            assert_eq!(b.as_ptr() as usize % PAGE_ALIGN, offset);
            assert_eq!(b.len(), 10_000);
            assert!(b.iter().all(|&x| x == 7));
        }
        let c = PlacedBuf::copy_of(&[1, 2, 3], 16);
        assert_eq!(&c[..], &[1, 2, 3]);
    }
}
