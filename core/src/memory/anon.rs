//! Anonymous memory mappings: the only place this crate asks the kernel for memory.
//!
//! A mapping reserves address space at once and commits nothing: the kernel backs a
//! page with memory on its first write, and a read of a page never written maps the
//! shared zero page. So a memory element of any size starts in the time one `mmap`
//! takes, and its resident size grows only with the bytes clients write.
//! `MAP_NORESERVE` keeps the kernel from charging the whole size against its
//! overcommit limit up front (where the overcommit policy allows that).

use std::ptr::NonNull;

use crate::error::{Error, Result};

/// A private, anonymous, zero-filled, page-aligned mapping of `len` bytes; unmapped on
/// drop. Hands out only its pointer: the types built on it decide who may touch which
/// bytes when.
#[derive(Debug)]
pub(crate) struct AnonMap {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; the types built on it
// synchronise every access to its bytes.
unsafe impl Send for AnonMap {}
// SAFETY: as above; a shared reference exposes only the raw pointer, never the bytes.
unsafe impl Sync for AnonMap {}

impl AnonMap {
    /// Maps `len` zero bytes (no mapping at all for `len == 0`).
    ///
    /// # Errors
    /// [`Error::Alloc`] when `len` does not fit this machine's address space or the
    /// kernel refuses the mapping (naming its reason).
    pub(crate) fn zeroed(len: u64) -> Result<Self> {
        let size = usize::try_from(len)
            .ok()
            .filter(|&s| isize::try_from(s).is_ok())
            .ok_or_else(|| Error::Alloc {
                size: len,
                reason: "larger than the address space of this machine".into(),
            })?;
        if size == 0 {
            return Ok(AnonMap {
                ptr: NonNull::dangling(),
                len: 0,
            });
        }
        // SAFETY: a fresh anonymous mapping (no fd, no fixed address) touches no
        // existing memory; the kernel checks the length and returns MAP_FAILED if it
        // cannot map it.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(Error::Alloc {
                size: len,
                reason: format!("mmap failed: {}", std::io::Error::last_os_error()),
            });
        }
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| Error::Alloc {
            size: len,
            reason: "mmap returned a null mapping".into(),
        })?;
        Ok(AnonMap { ptr, len: size })
    }

    /// Start of the mapping (dangling, but non-null and aligned, for length 0).
    pub(crate) fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for AnonMap {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: exactly the mapping `zeroed` made; its owners borrow this value,
            // so no reference into it outlives it.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        }
    }
}

/// `MADV_POPULATE_WRITE` (Linux 5.14); not in every libc crate release.
const MADV_POPULATE_WRITE: libc::c_int = 23;

/// Asks the kernel to back the whole pages inside `buf` with memory now, in one call,
/// as a write would, leaving every byte as it is. Filling a freshly allocated buffer
/// otherwise takes one page fault per 4 KiB page inside the copy (or the socket
/// receive) that fills it; populating first is cheaper per page. Best effort: older
/// kernels refuse the advice and the pages fault in as usual.
pub(crate) fn populate_for_write(buf: &mut [u8]) {
    const PAGE: usize = 4096;
    let start = buf.as_mut_ptr() as usize;
    let first = start.next_multiple_of(PAGE);
    let end = (start + buf.len()) & !(PAGE - 1);
    if end <= first {
        return;
    }
    // SAFETY: [first, end) lies inside `buf`, which we borrow mutably, so it is mapped
    // writable memory of this process that nothing else accesses meanwhile;
    // MADV_POPULATE_WRITE only faults its pages in and changes no byte of it.
    let _ = unsafe { libc::madvise(first as *mut libc::c_void, end - first, MADV_POPULATE_WRITE) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_zeroed_page_aligned_memory_and_refuses_impossible_sizes() {
        let m = AnonMap::zeroed(3 * 4096 + 1).unwrap();
        assert_eq!(m.len(), 3 * 4096 + 1);
        assert_eq!(m.ptr().as_ptr() as usize % 4096, 0);
        // SAFETY: the mapping is `len` readable bytes and nothing else refers to it.
        let bytes = unsafe { std::slice::from_raw_parts(m.ptr().as_ptr(), m.len()) };
        assert!(bytes.iter().all(|&b| b == 0));
        assert_eq!(AnonMap::zeroed(0).unwrap().len(), 0);
        assert!(matches!(
            AnonMap::zeroed(u64::MAX),
            Err(Error::Alloc { .. })
        ));
        // Larger than any real address space: the kernel says no, and we say why.
        let mut v = vec![9u8; 5 * 4096 + 17];
        populate_for_write(&mut v[3..]);
        assert!(v.iter().all(|&b| b == 9), "populating changes no byte");
        populate_for_write(&mut []);
        match AnonMap::zeroed(1 << 62) {
            Err(Error::Alloc { reason, .. }) => assert!(reason.contains("mmap"), "{reason}"),
            other => panic!("{other:?}"),
        }
    }
}
