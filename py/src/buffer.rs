//! The Python buffer protocol over a [`RegisteredBuffer`]: `memoryview(trans.buf)`,
//! `np.asarray(...)` and `struct.pack_into` reach the registered bytes without a copy.

use std::os::raw::{c_int, c_void};
use std::sync::Arc;

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyMemoryView;
use scad_core::RegisteredBuffer;

/// A writable, zero-copy view of a transport's registered buffer.
#[pyclass(module = "scad._native", frozen)]
pub struct RegisteredBytes {
    pub(crate) buf: Arc<RegisteredBuffer>,
}

#[pymethods]
impl RegisteredBytes {
    fn __len__(&self) -> usize {
        self.buf.len()
    }

    /// `trans.buf()` as in the original README: a memoryview of the whole buffer.
    fn __call__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyMemoryView>> {
        PyMemoryView::from(slf.as_any())
    }

    /// `trans.buf[i]` / `trans.buf[a:b]`, through a memoryview (no copy for slices).
    fn __getitem__<'py>(
        slf: &Bound<'py, Self>,
        key: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        PyMemoryView::from(slf.as_any())?.get_item(key)
    }

    /// `trans.buf[a:b] = bytes`.
    fn __setitem__<'py>(
        slf: &Bound<'py, Self>,
        key: &Bound<'py, PyAny>,
        value: &Bound<'py, PyAny>,
    ) -> PyResult<()> {
        PyMemoryView::from(slf.as_any())?.set_item(key, value)
    }

    /// # Safety
    /// Called by the interpreter with a valid `Py_buffer` to fill.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("a buffer view was not given"));
        }
        let (ptr, len) = {
            let me = slf.get();
            (me.buf.as_ptr(), me.buf.len())
        };
        let len = ffi::Py_ssize_t::try_from(len)
            .map_err(|_| PyBufferError::new_err("buffer too large for Python"))?;
        // SAFETY: `view` is non-null and owned by the caller for this call; `ptr` points
        // at `len` live bytes owned by the `RegisteredBuffer`, which this object keeps
        // alive, and `PyBuffer_FillInfo` stores a new reference to this object in the
        // view, so the bytes outlive every exported view. The buffer is writable
        // (readonly = 0): the original libd exposed it the same way, and concurrent
        // writers order themselves as with RDMA memory.
        let rc = unsafe {
            ffi::PyBuffer_FillInfo(view, slf.as_ptr(), ptr.cast::<c_void>(), len, 0, flags)
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(PyErr::fetch(slf.py()))
        }
    }

    /// # Safety
    /// Called by the interpreter; nothing to release (the view holds a reference).
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}
