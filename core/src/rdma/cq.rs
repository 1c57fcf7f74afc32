//! Completion queues (`ibv_cq`).

use std::ffi::CStr;
use std::io;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys as ffi;

use super::context::Context;
use crate::error::{Error, Result};

/// A completion queue. Queue pairs hold an `Arc` of it, so it is destroyed after them.
pub(crate) struct Cq {
    ptr: NonNull<ffi::ibv_cq>,
    ctx: Arc<Context>,
}

// SAFETY: a CQ handle may move between threads; polling it is thread-safe in
// libibverbs (providers lock the CQ), and we poll each CQ from one owner at a time.
unsafe impl Send for Cq {}
// SAFETY: as above.
unsafe impl Sync for Cq {}

impl std::fmt::Debug for Cq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cq")
            .field("device", &self.ctx.name())
            .finish()
    }
}

/// One work completion, in safe types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Completion {
    pub(crate) wr_id: u64,
    pub(crate) status: u32,
    pub(crate) vendor_err: u32,
}

impl Completion {
    pub(crate) fn is_ok(&self) -> bool {
        self.status == ffi::ibv_wc_status::IBV_WC_SUCCESS
    }

    /// The status as `ibv_wc_status_str` names it.
    pub(crate) fn status_str(&self) -> String {
        status_str(self.status)
    }
}

/// `ibv_wc_status_str` of a status value.
pub(crate) fn status_str(status: u32) -> String {
    // SAFETY: ibv_wc_status_str accepts any value and returns a static string.
    let s = unsafe { ffi::ibv_wc_status_str(status) };
    if s.is_null() {
        return format!("status {status}");
    }
    // SAFETY: non-NULL static NUL-terminated string from libibverbs.
    unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
}

impl Cq {
    /// A completion queue of at least `depth` entries on `ctx`.
    ///
    /// # Errors
    /// [`Error::Rdma`].
    pub(crate) fn new(ctx: &Arc<Context>, depth: u32) -> Result<Arc<Cq>> {
        let max = ctx.caps().max_cqe.max(1);
        let cqe = libc::c_int::try_from(depth.clamp(1, max)).unwrap_or(libc::c_int::MAX);
        // SAFETY: the context is open; no completion channel, no user context.
        let raw = unsafe {
            ffi::ibv_create_cq(
                ctx.as_ptr(),
                cqe,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        let ptr = NonNull::new(raw).ok_or_else(|| Error::Rdma {
            op: "create completion queue",
            reason: format!("ibv_create_cq({cqe}) failed on device {:?}", ctx.name()),
            source: Some(io::Error::last_os_error()),
        })?;
        Ok(Arc::new(Cq {
            ptr,
            ctx: Arc::clone(ctx),
        }))
    }

    pub(crate) fn as_ptr(&self) -> *mut ffi::ibv_cq {
        self.ptr.as_ptr()
    }

    /// Takes one completion, if one is ready.
    ///
    /// # Errors
    /// [`Error::Rdma`] if polling itself fails (a broken device).
    pub(crate) fn poll(&self) -> Result<Option<Completion>> {
        let mut wc = MaybeUninit::<ffi::ibv_wc>::zeroed();
        // SAFETY: the CQ is alive; `wc` has room for the one entry asked for.
        let n = unsafe { ffi::ibv_poll_cq(self.ptr.as_ptr(), 1, wc.as_mut_ptr()) };
        match n {
            0 => Ok(None),
            1 => {
                // SAFETY: ibv_poll_cq filled exactly one entry.
                let wc = unsafe { wc.assume_init() };
                Ok(Some(Completion {
                    wr_id: wc.wr_id,
                    status: wc.status,
                    vendor_err: wc.vendor_err,
                }))
            }
            rc => Err(Error::Rdma {
                op: "poll completion queue",
                reason: format!("ibv_poll_cq returned {rc} on device {:?}", self.ctx.name()),
                source: None,
            }),
        }
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once; QPs using it hold an Arc of it, so
        // none is left.
        let rc = unsafe { ffi::ibv_destroy_cq(self.ptr.as_ptr()) };
        if rc != 0 {
            tracing::warn!(device = %self.ctx.name(), rc, "ibv_destroy_cq failed");
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn status_strings_come_from_libibverbs() {
        assert_eq!(super::status_str(0), "success");
        assert_eq!(
            super::status_str(rdma_sys::ibv_wc_status::IBV_WC_REM_ACCESS_ERR),
            "remote access error"
        );
    }
}
