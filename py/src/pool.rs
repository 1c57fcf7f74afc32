//! The page pool, the store and byte-row remote arrays behind `disaggrt` and
//! `scad.RemoteArray`. Python keeps the NumPy dtype and shape; Rust moves rows of bytes.

use std::sync::Arc;

use ndarray::{ArrayView2, Ix2};
use numpy::{PyReadonlyArray1, PyReadwriteArray1};
use pyo3::exceptions::{PyKeyError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use scad_core::durl::Durl;
use scad_remote_array::{
    AllocationState, ArrayMeta, BufferPool, ElementId, EvictionPolicy, Placement, PoolRange,
    RemoteArray, RemoteStore,
};

use crate::action::PyEndpoint;
use crate::errors::{array_err, core_err, detach};

/// A page cache in front of named memory elements.
#[pyclass(module = "scad._native", name = "BufferPool", frozen)]
pub struct PyPool {
    pub(crate) inner: Arc<BufferPool>,
}

fn policy(name: &str) -> PyResult<EvictionPolicy> {
    match name.to_ascii_lowercase().as_str() {
        "clock" => Ok(EvictionPolicy::Clock),
        "lru" => Ok(EvictionPolicy::Lru),
        other => Err(PyValueError::new_err(format!(
            "unknown eviction policy {other:?} (clock or lru)"
        ))),
    }
}

impl PyPool {
    /// `read` (or its direct form) into `dst` from `addr` of `name`, without the GIL.
    fn read_with(
        &self,
        py: Python<'_>,
        name: &str,
        addr: u64,
        mut dst: PyReadwriteArray1<'_, u8>,
        read: fn(&BufferPool, ElementId, u64, &mut [u8]) -> scad_remote_array::Result<()>,
    ) -> PyResult<()> {
        let id = self.id(name)?;
        let pool = Arc::clone(&self.inner);
        let dst = dst
            .as_slice_mut()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        detach(py, move || read(&pool, id, addr, dst).map_err(array_err))
    }

    /// `write` (or its direct form) of `src` at `addr` of `name`, without the GIL.
    fn write_with(
        &self,
        py: Python<'_>,
        name: &str,
        addr: u64,
        src: PyReadonlyArray1<'_, u8>,
        write: fn(&BufferPool, ElementId, u64, &[u8]) -> scad_remote_array::Result<()>,
    ) -> PyResult<()> {
        let id = self.id(name)?;
        let pool = Arc::clone(&self.inner);
        let src = src
            .as_slice()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        detach(py, move || write(&pool, id, addr, src).map_err(array_err))
    }

    fn id(&self, name: &str) -> PyResult<ElementId> {
        let elements = self.inner.elements();
        elements.id(name).map_err(|_| {
            PyKeyError::new_err(format!(
                "the buffer pool has no transport {name:?} (known: {})",
                elements.names().join(", ")
            ))
        })
    }
}

fn stats_dict<'py>(py: Python<'py>, pool: &BufferPool) -> PyResult<Bound<'py, PyDict>> {
    let s = pool.stats();
    let d = PyDict::new(py);
    d.set_item("hits", s.hits)?;
    d.set_item("misses", s.misses)?;
    d.set_item("hit_ratio", s.hit_ratio())?;
    d.set_item("read_ahead_hits", s.read_ahead_hits)?;
    d.set_item("read_ahead_pages", s.read_ahead_pages)?;
    d.set_item("evictions", s.evictions)?;
    d.set_item("write_backs", s.write_backs)?;
    d.set_item("bytes_in", s.bytes_in)?;
    d.set_item("bytes_out", s.bytes_out)?;
    d.set_item("fetch_calls", s.fetch_calls)?;
    d.set_item("bytes_direct", s.bytes_direct)?;
    d.set_item("bytes_direct_out", s.bytes_direct_out)?;
    d.set_item("page_size", pool.page_size())?;
    d.set_item("frames", pool.frames())?;
    d.set_item("capacity", pool.capacity())?;
    Ok(d)
}

#[pymethods]
impl PyPool {
    /// A pool of `capacity` bytes in pages of `page_size` bytes.
    #[new]
    #[pyo3(signature = (capacity, page_size=65536, policy_name="clock", read_ahead=4))]
    fn new(
        capacity: usize,
        page_size: usize,
        policy_name: &str,
        read_ahead: usize,
    ) -> PyResult<Self> {
        let pool = BufferPool::builder(capacity)
            .page_size(page_size)
            .policy(policy(policy_name)?)
            .read_ahead(read_ahead)
            .build()
            .map_err(array_err)?;
        Ok(PyPool {
            inner: Arc::new(pool),
        })
    }

    /// Adds the transport behind a `disagg` endpoint (waits until it is configured).
    fn add_endpoint(&self, py: Python<'_>, name: String, endpoint: &PyEndpoint) -> PyResult<()> {
        let pool = Arc::clone(&self.inner);
        let ep = Arc::clone(&endpoint.inner);
        detach(py, move || {
            let t = ep.transport().map_err(core_err)?;
            pool.elements().add(&name, t).map(drop).map_err(array_err)
        })
    }

    /// True if the pool knows transport `name`.
    fn has_transport(&self, name: &str) -> bool {
        self.inner.elements().contains(name)
    }

    /// Bytes of memory element `name`.
    fn transport_size(&self, name: &str) -> PyResult<u64> {
        self.id(name)?;
        self.inner.elements().size(name).map_err(array_err)
    }

    /// Reads `dst.size` bytes at remote `addr` of `name` into the uint8 array `dst`.
    fn read(
        &self,
        py: Python<'_>,
        name: &str,
        addr: u64,
        dst: PyReadwriteArray1<'_, u8>,
    ) -> PyResult<()> {
        self.read_with(py, name, addr, dst, BufferPool::read)
    }

    /// Reads `dst.size` bytes at remote `addr` of `name` into `dst` around the cache:
    /// straight from the memory element, with the pool's cached (possibly dirty) pages
    /// copied over, so the result equals `read`'s. For large one-off reads.
    fn read_direct(
        &self,
        py: Python<'_>,
        name: &str,
        addr: u64,
        dst: PyReadwriteArray1<'_, u8>,
    ) -> PyResult<()> {
        self.read_with(py, name, addr, dst, BufferPool::read_direct)
    }

    /// Writes the uint8 array `src` to remote `addr` of `name` (through the cache).
    fn write(
        &self,
        py: Python<'_>,
        name: &str,
        addr: u64,
        src: PyReadonlyArray1<'_, u8>,
    ) -> PyResult<()> {
        self.write_with(py, name, addr, src, BufferPool::write)
    }

    /// Writes the uint8 array `src` to remote `addr` of `name` around the cache: straight
    /// to the memory element in one transport call, with the pool's cached pages of that
    /// range dropped or updated, so later reads see `src` as after `write`. For large
    /// writes that are not read back at once.
    fn write_direct(
        &self,
        py: Python<'_>,
        name: &str,
        addr: u64,
        src: PyReadonlyArray1<'_, u8>,
    ) -> PyResult<()> {
        self.write_with(py, name, addr, src, BufferPool::write_direct)
    }

    /// Writes every dirty page back.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let pool = Arc::clone(&self.inner);
        detach(py, move || pool.flush().map_err(array_err))
    }

    /// Page size in bytes.
    #[getter]
    fn page_size(&self) -> usize {
        self.inner.page_size()
    }

    /// Capacity in bytes.
    #[getter]
    fn capacity(&self) -> usize {
        self.inner.capacity()
    }

    /// Counters (hits, misses, evictions, write_backs, bytes_in, bytes_out, ...).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        stats_dict(py, &self.inner)
    }
}

/// Memory elements by name, with allocators, sharing one pool.
#[pyclass(module = "scad._native", name = "Store", frozen)]
pub struct PyStore {
    pub(crate) inner: Arc<RemoteStore>,
}

#[pymethods]
impl PyStore {
    /// A store over `pool`.
    #[new]
    fn new(pool: &PyPool) -> Self {
        PyStore {
            inner: Arc::new(RemoteStore::new(Arc::clone(&pool.inner))),
        }
    }

    /// Adds memory element `name` reached through `durl` (e.g.
    /// `"mem;rdma_tcp;url,tcp://127.0.0.1:2333;"`; the durl's own name is ignored).
    fn add_element(&self, py: Python<'_>, name: String, durl: String) -> PyResult<()> {
        let store = Arc::clone(&self.inner);
        detach(py, move || {
            let d: Durl = durl.parse().map_err(core_err)?;
            let config = d.resolve().map_err(core_err)?;
            let t = scad_core::transport::open(&name, &config).map_err(core_err)?;
            store.elements().add(&name, t).map(drop).map_err(array_err)
        })
    }

    /// Adds memory element `name` through a `disagg` endpoint (waits for configuration).
    fn add_endpoint(&self, py: Python<'_>, name: String, endpoint: &PyEndpoint) -> PyResult<()> {
        let store = Arc::clone(&self.inner);
        let ep = Arc::clone(&endpoint.inner);
        detach(py, move || {
            let t = ep.transport().map_err(core_err)?;
            store.elements().add(&name, t).map(drop).map_err(array_err)
        })
    }

    /// Names of the memory elements.
    fn element_names(&self) -> Vec<String> {
        self.inner.elements().names()
    }

    /// Allocation state as JSON (hand it to the next element).
    fn allocation_state(&self) -> PyResult<String> {
        self.inner
            .elements()
            .allocation_state()
            .to_json()
            .map_err(array_err)
    }

    /// Continues allocating where a previous element stopped.
    fn resume_allocation(&self, json: &str) -> PyResult<()> {
        let state = AllocationState::from_json(json).map_err(array_err)?;
        self.inner
            .elements()
            .resume_allocation(&state)
            .map_err(array_err)
    }

    /// The shared pool.
    fn pool(&self) -> PyPool {
        PyPool {
            inner: Arc::clone(self.inner.pool()),
        }
    }

    /// Writes every dirty page back.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let store = Arc::clone(&self.inner);
        detach(py, move || store.flush().map_err(array_err))
    }

    /// Writes `src` (rows of `row_bytes` bytes, uint8, C order) out, placed on
    /// `elements` (all when empty) in stripes of `stripe_bytes`, and flushes.
    #[pyo3(signature = (src, row_bytes, elements=Vec::new(), stripe_bytes=None))]
    fn put(
        &self,
        py: Python<'_>,
        src: PyReadonlyArray1<'_, u8>,
        row_bytes: usize,
        elements: Vec<String>,
        stripe_bytes: Option<u64>,
    ) -> PyResult<RemoteBytes> {
        let bytes = src
            .as_slice()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let view = rows_view(bytes, row_bytes)?;
        let placement = placement(elements, stripe_bytes);
        let store = Arc::clone(&self.inner);
        let arr = detach(py, move || {
            RemoteArray::from_array_with(&store, &view, &placement).map_err(array_err)
        })?;
        Ok(RemoteBytes { inner: arr })
    }

    /// Reserves room for `rows` rows of `row_bytes` bytes without writing them.
    #[pyo3(signature = (rows, row_bytes, elements=Vec::new(), stripe_bytes=None))]
    fn empty(
        &self,
        rows: usize,
        row_bytes: usize,
        elements: Vec<String>,
        stripe_bytes: Option<u64>,
    ) -> PyResult<RemoteBytes> {
        if row_bytes == 0 {
            return Err(PyValueError::new_err("rows need at least one byte"));
        }
        let placement = placement(elements, stripe_bytes);
        let arr =
            RemoteArray::empty(&self.inner, (rows, row_bytes), &placement).map_err(array_err)?;
        Ok(RemoteBytes { inner: arr })
    }

    /// Opens an array from metadata JSON of any element type (as `RemoteBytes.meta_json`
    /// or Rust's `ArrayMeta::to_json` printed it) as rows of bytes.
    fn open(&self, meta_json: &str) -> PyResult<RemoteBytes> {
        let meta = ArrayMeta::from_json(meta_json)
            .and_then(|m| m.as_byte_rows())
            .map_err(array_err)?;
        let arr = RemoteArray::from_meta(&self.inner, &meta).map_err(array_err)?;
        Ok(RemoteBytes { inner: arr })
    }
}

fn placement(elements: Vec<String>, stripe_bytes: Option<u64>) -> Placement {
    let p = if elements.is_empty() {
        Placement::all()
    } else {
        Placement::striped(elements)
    };
    match stripe_bytes {
        Some(b) => p.stripe_bytes(b),
        None => p,
    }
}

fn rows_view(bytes: &[u8], row_bytes: usize) -> PyResult<ArrayView2<'_, u8>> {
    if row_bytes == 0 || bytes.len() % row_bytes != 0 {
        return Err(PyValueError::new_err(format!(
            "{} bytes are not whole rows of {row_bytes} bytes",
            bytes.len()
        )));
    }
    ArrayView2::from_shape((bytes.len() / row_bytes, row_bytes), bytes)
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// A remote array of byte rows (the typed view lives in Python).
#[pyclass(module = "scad._native", frozen)]
pub struct RemoteBytes {
    inner: RemoteArray<u8, Ix2>,
}

#[pymethods]
impl RemoteBytes {
    /// Number of rows.
    #[getter]
    fn rows(&self) -> usize {
        self.inner.rows()
    }

    /// Bytes per row.
    #[getter]
    fn row_bytes(&self) -> u64 {
        self.inner.row_bytes()
    }

    /// Number of extents (pieces in memory elements).
    #[getter]
    fn extent_count(&self) -> usize {
        self.inner.extent_count()
    }

    /// Metadata as JSON: rows of bytes, or with `dtype` (a stable element type name,
    /// `u8`..`f64`) and `shape` what the bytes hold, so that Rust opens the array
    /// with its real element type.
    #[pyo3(signature = (dtype=None, shape=None))]
    fn meta_json(&self, dtype: Option<&str>, shape: Option<Vec<usize>>) -> PyResult<String> {
        let meta = self.inner.meta();
        let meta = match (dtype, shape) {
            (None, None) => meta,
            (Some(d), Some(s)) => meta.retyped(d, &s).map_err(array_err)?,
            _ => {
                return Err(PyValueError::new_err(
                    "meta_json takes dtype and shape together",
                ))
            }
        };
        meta.to_json().map_err(array_err)
    }

    /// Rows `[start, end)` without moving data.
    fn slice(&self, start: usize, end: usize) -> PyResult<RemoteBytes> {
        Ok(RemoteBytes {
            inner: self.inner.slice(start..end).map_err(array_err)?,
        })
    }

    /// Concatenates arrays along rows (no data moved).
    #[staticmethod]
    fn concat(parts: Vec<PyRef<'_, RemoteBytes>>) -> PyResult<RemoteBytes> {
        let refs: Vec<&RemoteArray<u8, Ix2>> = parts.iter().map(|p| &p.inner).collect();
        Ok(RemoteBytes {
            inner: RemoteArray::concat(&refs).map_err(array_err)?,
        })
    }

    /// Reads rows `[start, end)` into the uint8 array `dst` (exactly that many bytes).
    fn read_into(
        &self,
        py: Python<'_>,
        start: usize,
        end: usize,
        mut dst: PyReadwriteArray1<'_, u8>,
    ) -> PyResult<()> {
        let dst = dst
            .as_slice_mut()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let arr = self.inner.clone();
        detach(py, move || {
            arr.read_into(start..end, dst).map_err(array_err)
        })
    }

    /// Writes whole rows from the uint8 array `src` starting at row `first_row`.
    fn write_rows(
        &self,
        py: Python<'_>,
        first_row: usize,
        src: PyReadonlyArray1<'_, u8>,
    ) -> PyResult<()> {
        let bytes = src
            .as_slice()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let row_bytes = usize::try_from(self.inner.row_bytes())
            .map_err(|_| PyValueError::new_err("row too large"))?;
        let view = rows_view(bytes, row_bytes)?;
        let arr = self.inner.clone();
        detach(py, move || {
            arr.write_range(first_row, &view).map_err(array_err)
        })
    }

    /// Writes the pool's dirty pages back.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let arr = self.inner.clone();
        detach(py, move || arr.flush().map_err(array_err))
    }

    /// Loads the pages of rows `[start, end)` into the pool without copying them out
    /// (best effort: at most a quarter of the pool), so a later read finds them.
    fn prefetch(&self, py: Python<'_>, start: usize, end: usize) -> PyResult<()> {
        let part = self.inner.slice(start..end).map_err(array_err)?;
        let pool = Arc::clone(part.store().pool());
        let mut ranges = Vec::new();
        for e in part.meta().extents {
            let id = pool.elements().id(&e.transport).map_err(|_| {
                PyKeyError::new_err(format!("the pool has no transport {:?}", e.transport))
            })?;
            let len =
                usize::try_from(e.bytes).map_err(|_| PyValueError::new_err("extent too large"))?;
            ranges.push(PoolRange {
                transport: id,
                addr: e.addr,
                len,
            });
        }
        detach(py, move || pool.prefetch(&ranges).map_err(array_err))
    }
}
