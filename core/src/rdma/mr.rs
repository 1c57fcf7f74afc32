//! Memory regions (`ibv_mr`): memory registered with a device.

use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys as ffi;

use super::pd::Pd;
use crate::error::{Error, Result};

/// What a registered region allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// Local reads and writes only: the target of our RDMA READs, the source of WRITEs.
    Local,
    /// Also remote READ and WRITE by connected peers: a served address space.
    Remote,
}

/// A registered memory region. Holds an `Arc` of its protection domain, so it is
/// deregistered before the PD is deallocated.
pub(crate) struct Mr {
    ptr: NonNull<ffi::ibv_mr>,
    pd: Arc<Pd>,
    addr: u64,
    len: usize,
    lkey: u32,
    rkey: u32,
}

// SAFETY: an MR is an immutable handle once registered; its keys are plain integers and
// deregistration happens once, in Drop.
unsafe impl Send for Mr {}
// SAFETY: as above.
unsafe impl Sync for Mr {}

impl std::fmt::Debug for Mr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mr")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("lkey", &self.lkey)
            .finish_non_exhaustive()
    }
}

impl Mr {
    /// Registers `len` bytes at `addr` in `pd`.
    ///
    /// # Safety
    /// - `addr..addr + len` must be one live allocation when this is called.
    /// - With [`Access::Remote`], connected peers may read and write the memory at any
    ///   time while it is registered: it must stay allocated for as long as the returned
    ///   `Mr` lives, and no Rust reference to it may assume it does not change (as for
    ///   [`crate::MemoryRegion`], whose accessors only hand out short-lived slices).
    /// - With [`Access::Local`], the device touches the memory only through work requests
    ///   naming it, and whoever posts them answers for it (see `ConnectedQp::execute`).
    ///   The memory may even be freed while still registered: the registration keeps its
    ///   pages pinned, so nothing else is ever reached through it, as long as no further
    ///   work request names it.
    pub(crate) unsafe fn register(
        pd: &Arc<Pd>,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Mr> {
        if len == 0 {
            return Err(Error::InvalidArgument(
                "cannot register an empty memory region".into(),
            ));
        }
        let mut flags = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE;
        if access == Access::Remote {
            flags = flags
                | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ
                | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE;
        }
        let flags = libc::c_int::try_from(flags.0).unwrap_or(0);
        // SAFETY: the PD is alive; the caller guarantees the memory (see # Safety). The
        // kernel checks that the range is mapped and fails with EFAULT otherwise.
        let raw = unsafe { ffi::ibv_reg_mr(pd.as_ptr(), addr.cast(), len, flags) };
        let ptr = NonNull::new(raw).ok_or_else(|| Error::Rdma {
            op: "register memory",
            reason: format!(
                "ibv_reg_mr of {len} bytes at {addr:p} failed on device {:?} \
                 (is the locked-memory limit, `ulimit -l`, high enough?)",
                pd.context().name()
            ),
            source: Some(io::Error::last_os_error()),
        })?;
        // SAFETY: a successful ibv_reg_mr returns a valid ibv_mr whose keys stay fixed.
        let (lkey, rkey) = unsafe { ((*raw).lkey, (*raw).rkey) };
        Ok(Mr {
            ptr,
            pd: Arc::clone(pd),
            addr: addr as u64,
            len,
            lkey,
            rkey,
        })
    }

    pub(crate) fn addr(&self) -> u64 {
        self.addr
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn lkey(&self) -> u32 {
        self.lkey
    }

    pub(crate) fn rkey(&self) -> u32 {
        self.rkey
    }

    /// True when `addr..addr + len` lies inside the region.
    pub(crate) fn contains(&self, addr: u64, len: usize) -> bool {
        addr >= self.addr
            && (addr - self.addr)
                .checked_add(len as u64)
                .is_some_and(|end| end <= self.len as u64)
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered in `register`, deregistered once. Work requests naming it
        // have completed: they run inside `ConnectedQp::execute`, which waits for them
        // (or destroys its QP) before returning, and the caller holds an Arc of this MR.
        let rc = unsafe { ffi::ibv_dereg_mr(self.ptr.as_ptr()) };
        if rc != 0 {
            tracing::warn!(device = %self.pd.context().name(), rc, "ibv_dereg_mr failed");
        }
    }
}
