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
        match AnonMap::zeroed(1 << 62) {
            Err(Error::Alloc { reason, .. }) => assert!(reason.contains("mmap"), "{reason}"),
            other => panic!("{other:?}"),
        }
    }
}
