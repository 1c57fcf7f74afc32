//! `rdma_shm`: a memory element in POSIX shared memory, shared by processes on one host.
//!
//! The segment is `/scad-<shm_id>` (see `shm_open(3)`). The first process to open an id
//! creates and sizes the segment and unlinks it when its transport is dropped; later
//! openers must ask for the same size. Threads of one process are ordered by the
//! region's stripe locks; writes from other processes race like one-sided RDMA writes.

use std::ffi::CString;
use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

use super::{LocalTransport, ReadOp, Transport, TransportStats, WriteOp};
use crate::error::{Error, Result};
use crate::memory::MemoryRegion;

/// A mapped shared-memory segment; unmapped (and unlinked, if we created it) on drop.
#[derive(Debug)]
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    name: CString,
    created: bool,
}

// SAFETY: the mapping is plain memory; MemoryRegion synchronises in-process access.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly what mmap returned; nothing refers to the mapping
        // any more because the region that owns us is being dropped.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        if self.created {
            // SAFETY: name is a valid NUL-terminated string.
            unsafe { libc::shm_unlink(self.name.as_ptr()) };
        }
    }
}

fn shm_error(name: &str, reason: impl Into<String>, source: io::Error) -> Error {
    Error::Shm {
        name: name.to_owned(),
        reason: reason.into(),
        source: Some(source),
    }
}

/// Closes a file descriptor on drop.
struct Fd(libc::c_int);

impl Drop for Fd {
    fn drop(&mut self) {
        // SAFETY: the descriptor is owned by this guard and closed once.
        unsafe { libc::close(self.0) };
    }
}

fn map_segment(shm_id: &str, size: u64) -> Result<Mapping> {
    let seg = format!("/scad-{shm_id}");
    let name = CString::new(seg.clone()).map_err(|_| Error::Shm {
        name: seg.clone(),
        reason: "shm_id contains a NUL byte".into(),
        source: None,
    })?;
    let len = usize::try_from(size)
        .ok()
        .filter(|&l| l > 0 && libc::off_t::try_from(l).is_ok())
        .ok_or_else(|| Error::Shm {
            name: seg.clone(),
            reason: format!("size {size} is zero or too large"),
            source: None,
        })?;
    // SAFETY: name is NUL-terminated; flags and mode are valid constants.
    let fd = unsafe {
        libc::shm_open(
            name.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL,
            0o600,
        )
    };
    let (fd, created) = if fd >= 0 {
        (Fd(fd), true)
    } else {
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::AlreadyExists {
            return Err(shm_error(&seg, "cannot create", err));
        }
        // SAFETY: as above.
        let fd = unsafe { libc::shm_open(name.as_ptr(), libc::O_RDWR, 0o600) };
        if fd < 0 {
            return Err(shm_error(&seg, "cannot open", io::Error::last_os_error()));
        }
        (Fd(fd), false)
    };
    let unlink_on_error = |e: Error| {
        if created {
            // SAFETY: name is NUL-terminated; we created the segment and give it up.
            unsafe { libc::shm_unlink(name.as_ptr()) };
        }
        e
    };
    if created {
        // SAFETY: fd is an open shared-memory descriptor; len fits off_t (checked).
        if unsafe { libc::ftruncate(fd.0, len as libc::off_t) } != 0 {
            let err = shm_error(&seg, "cannot size", io::Error::last_os_error());
            return Err(unlink_on_error(err));
        }
    } else {
        // SAFETY: an all-zero `stat` is a valid value to be overwritten by fstat.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fd is open and st is a valid out-pointer.
        if unsafe { libc::fstat(fd.0, &mut st) } != 0 {
            return Err(shm_error(&seg, "cannot stat", io::Error::last_os_error()));
        }
        if st.st_size as u64 != size {
            return Err(Error::Shm {
                name: seg,
                reason: format!(
                    "segment exists with {} bytes but {size} were asked for",
                    st.st_size
                ),
                source: None,
            });
        }
    }
    // SAFETY: mapping `len` bytes of an fd of at least that size, shared, read-write.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.0,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        let err = shm_error(&seg, "cannot map", io::Error::last_os_error());
        return Err(unlink_on_error(err));
    }
    let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| Error::Shm {
        name: seg.clone(),
        reason: "mmap returned null".into(),
        source: None,
    })?;
    Ok(Mapping {
        ptr,
        len,
        name,
        created,
    })
}

/// A transport to a POSIX shared-memory segment: a [`LocalTransport`] over the mapping.
#[derive(Debug)]
pub struct ShmTransport {
    inner: LocalTransport,
    created: bool,
}

impl ShmTransport {
    /// Opens segment `shm_id` of `size` bytes, creating it if no process has.
    ///
    /// # Errors
    /// [`Error::Shm`] if the segment cannot be created or mapped, or exists with
    /// another size.
    pub fn open(shm_id: &str, size: u64) -> Result<Self> {
        let mapping = map_segment(shm_id, size)?;
        let (ptr, len, created) = (mapping.ptr, mapping.len, mapping.created);
        // SAFETY: the mapping is `len` bytes, readable and writable, and lives as long
        // as the region that owns it; no Rust reference into it exists elsewhere.
        let region = unsafe { MemoryRegion::from_raw_parts(ptr, len, Box::new(mapping)) };
        Ok(ShmTransport {
            inner: LocalTransport::with_region(Arc::new(region))
                .with_label(format!("shm(/scad-{shm_id})")),
            created,
        })
    }

    /// True if this transport created the segment (and will unlink it on drop).
    pub fn created(&self) -> bool {
        self.created
    }

    /// The mapped region, e.g. to serve it with a memory server.
    pub fn region(&self) -> &Arc<MemoryRegion> {
        self.inner.region()
    }
}

impl Transport for ShmTransport {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn remote_size(&self) -> Result<u64> {
        self.inner.remote_size()
    }
    fn read(&self, addr: u64, dst: &mut [u8]) -> Result<()> {
        self.inner.read(addr, dst)
    }
    fn write(&self, addr: u64, src: &[u8]) -> Result<()> {
        self.inner.write(addr, src)
    }
    fn read_vectored(&self, ops: &mut [ReadOp<'_>]) -> Result<()> {
        self.inner.read_vectored(ops)
    }
    fn write_vectored(&self, ops: &[WriteOp<'_>]) -> Result<()> {
        self.inner.write_vectored(ops)
    }
    fn stats(&self) -> TransportStats {
        self.inner.stats()
    }
}
