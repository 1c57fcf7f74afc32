//! Protection domains (`ibv_pd`), one shared per device within the process.

use std::collections::HashMap;
use std::io;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};

use rdma_sys as ffi;

use super::context::Context;
use super::device::DeviceList;
use crate::error::{Error, Result};

/// A protection domain. Memory regions and queue pairs hold an `Arc` of it, so it is
/// deallocated after them, and it holds an `Arc` of its context, closed after it.
pub(crate) struct Pd {
    ptr: NonNull<ffi::ibv_pd>,
    ctx: Arc<Context>,
}

// SAFETY: a PD is an immutable handle once allocated; libibverbs allows using it from
// any thread (creating QPs and registering memory in it are thread-safe verbs).
unsafe impl Send for Pd {}
// SAFETY: as above.
unsafe impl Sync for Pd {}

impl std::fmt::Debug for Pd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pd")
            .field("device", &self.ctx.name())
            .finish()
    }
}

impl Pd {
    /// Allocates a protection domain on `ctx`.
    ///
    /// # Errors
    /// [`Error::Rdma`].
    pub(crate) fn alloc(ctx: Arc<Context>) -> Result<Arc<Pd>> {
        // SAFETY: the context is open for as long as `ctx` lives.
        let raw = unsafe { ffi::ibv_alloc_pd(ctx.as_ptr()) };
        let ptr = NonNull::new(raw).ok_or_else(|| Error::Rdma {
            op: "allocate protection domain",
            reason: format!("ibv_alloc_pd failed on device {:?}", ctx.name()),
            source: Some(io::Error::last_os_error()),
        })?;
        Ok(Arc::new(Pd { ptr, ctx }))
    }

    pub(crate) fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    pub(crate) fn as_ptr(&self) -> *mut ffi::ibv_pd {
        self.ptr.as_ptr()
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: allocated in `alloc`, freed once; every MR and QP in it holds an Arc of
        // this PD, so none is left.
        let rc = unsafe { ffi::ibv_dealloc_pd(self.ptr.as_ptr()) };
        if rc != 0 {
            tracing::warn!(device = %self.ctx.name(), rc, "ibv_dealloc_pd failed");
        }
    }
}

/// The protection domain of device `name` (the first device for `None`), shared by every
/// transport and server of this process that uses that device. It lives while any of
/// them does.
///
/// # Errors
/// [`Error::NoDevice`] naming the device asked for; [`Error::Rdma`] if it cannot be opened.
pub(crate) fn shared(name: Option<&str>) -> Result<Arc<Pd>> {
    static PDS: OnceLock<Mutex<HashMap<String, Weak<Pd>>>> = OnceLock::new();
    let list = DeviceList::get()?;
    let index = list.find(name)?;
    let device = list.name(index);
    let mut pds = PDS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(pd) = pds.get(&device).and_then(Weak::upgrade) {
        return Ok(pd);
    }
    let pd = Pd::alloc(Context::open(&list, index)?)?;
    pds.retain(|_, w| w.strong_count() > 0);
    pds.insert(device, Arc::downgrade(&pd));
    Ok(pd)
}
