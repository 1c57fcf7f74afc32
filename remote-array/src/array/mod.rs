//! [`RemoteArray`]: a typed n-dimensional array whose bytes live in memory elements.

mod chunks;
pub mod dtype;
mod meta;

use std::marker::PhantomData;
use std::ops::{Bound, Range, RangeBounds};
use std::sync::Arc;

use bytemuck::Pod;
use ndarray::{Array, ArrayBase, Data, Dimension, IntoDimension};
use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::pool::{PoolRange, PoolRead, PoolWrite};
use crate::store::{ElementRef, Placement, RemoteStore};

pub use chunks::Chunks;
pub use dtype::{dtype_name, dtype_size, DTYPES, RUST_PREFIX};
pub use meta::{ArrayMeta, Extent};

/// One extent, resolved to a pool transport, with its offset in the array's bytes.
#[derive(Debug, Clone)]
struct Ext {
    el: ElementRef,
    addr: u64,
    bytes: u64,
    /// Offset of the extent's first byte in the array's (row-major) bytes.
    start: u64,
}

/// A typed n-dimensional array of `T` whose data lives in remote memory elements,
/// read and written through the store's [`crate::BufferPool`].
///
/// Axis 0 is the row axis: [`RemoteArray::slice`] and [`RemoteArray::concat`] work
/// along it without moving data, and reads and writes address row ranges. A
/// `RemoteArray` is a cheap handle (clone it freely); several handles may view the
/// same bytes.
///
/// # Example
/// ```
/// use std::sync::Arc;
/// use ndarray::{array, s};
/// use scad_core::transport::LocalTransport;
/// use scad_remote_array::{BufferPool, RemoteArray, RemoteStore};
///
/// let pool = Arc::new(BufferPool::builder(1 << 20).page_size(4096).build()?);
/// let store = Arc::new(RemoteStore::new(pool));
/// store.elements().add("mem0", Arc::new(LocalTransport::new(1 << 20)?))?;
///
/// let a = array![[1.0f32, 2.0], [3.0, 4.0], [5.0, 6.0]];
/// let remote = RemoteArray::from_array(&store, &a)?;
/// let tail = remote.slice(1..)?; // a view: nothing moves
/// assert_eq!(tail.materialize()?, a.slice(s![1.., ..]));
/// let sum = remote.reduce_chunks(2, || 0.0, |_, c| c.sum(), |x, y| x + y)?;
/// assert_eq!(sum, 21.0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RemoteArray<T: Pod, D: Dimension> {
    store: Arc<RemoteStore>,
    dim: D,
    extents: Arc<[Ext]>,
    _t: PhantomData<fn() -> T>,
}

impl<T: Pod, D: Dimension> Clone for RemoteArray<T, D> {
    fn clone(&self) -> Self {
        RemoteArray {
            store: Arc::clone(&self.store),
            dim: self.dim.clone(),
            extents: Arc::clone(&self.extents),
            _t: PhantomData,
        }
    }
}

impl<T: Pod, D: Dimension> std::fmt::Debug for RemoteArray<T, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteArray")
            .field("dtype", &dtype_name::<T>())
            .field("shape", &self.dim.slice())
            .field("extents", &self.extents.len())
            .finish_non_exhaustive()
    }
}

fn row_range(what: &'static str, rows: impl RangeBounds<usize>, n: usize) -> Result<Range<usize>> {
    let start = match rows.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match rows.end_bound() {
        Bound::Included(&e) => e.saturating_add(1),
        Bound::Excluded(&e) => e,
        Bound::Unbounded => n,
    };
    if start > end || end > n {
        return Err(Error::OutOfRange {
            what,
            start,
            end,
            rows: n,
        });
    }
    Ok(start..end)
}

fn item_size<T>() -> Result<usize> {
    match std::mem::size_of::<T>() {
        0 => Err(Error::InvalidArgument(format!(
            "{} is zero-sized: remote arrays need elements with bytes",
            std::any::type_name::<T>()
        ))),
        n => Ok(n),
    }
}

impl<T: Pod + Send + Sync, D: Dimension> RemoteArray<T, D> {
    fn check_dim(dim: &D) -> Result<()> {
        item_size::<T>()?;
        if dim.ndim() == 0 {
            return Err(Error::Shape(
                "a remote array needs at least one axis (axis 0 is the row axis)".into(),
            ));
        }
        dim.slice()
            .iter()
            .try_fold(item_size::<T>()?, |a, &d| a.checked_mul(d))
            .ok_or_else(|| Error::Shape(format!("shape {:?} has too many bytes", dim.slice())))?;
        Ok(())
    }

    fn build(store: &Arc<RemoteStore>, dim: D, parts: Vec<(ElementRef, u64, u64)>) -> Self {
        let mut start = 0;
        let extents: Vec<Ext> = parts
            .into_iter()
            .map(|(el, addr, bytes)| {
                let e = Ext {
                    el,
                    addr,
                    bytes,
                    start,
                };
                start += bytes;
                e
            })
            .collect();
        RemoteArray {
            store: Arc::clone(store),
            dim,
            extents: extents.into(),
            _t: PhantomData,
        }
    }

    /// Allocates room for an array of `shape` placed by `placement`, without writing
    /// it: its contents are whatever the remote memory holds (zeros for memory never
    /// written). Fill it with [`RemoteArray::write_range`].
    ///
    /// # Errors
    /// [`Error::Shape`] for a shape without axes or too large; [`Error::UnknownElement`]
    /// for a placement naming an element the store lacks; [`Error::OutOfRemoteMemory`].
    pub fn empty<Sh>(store: &Arc<RemoteStore>, shape: Sh, placement: &Placement) -> Result<Self>
    where
        Sh: IntoDimension<Dim = D>,
    {
        let dim = shape.into_dimension();
        Self::check_dim(&dim)?;
        let size = item_size::<T>()? as u64;
        let bytes = dim.size() as u64 * size;
        let row = dim.slice()[1..].iter().product::<usize>() as u64 * size;
        let parts = store.allocate_extents(placement, bytes, row)?;
        Ok(Self::build(store, dim, parts))
    }

    /// Writes `array` out to remote memory, striped over every element of the store
    /// ([`Placement::all`]), and flushes it, so its metadata can be handed on at once.
    ///
    /// # Errors
    /// As [`RemoteArray::from_array_with`].
    pub fn from_array<S>(store: &Arc<RemoteStore>, array: &ArrayBase<S, D>) -> Result<Self>
    where
        S: Data<Elem = T>,
    {
        Self::from_array_with(store, array, &Placement::all())
    }

    /// Writes `array` out to remote memory placed by `placement`, and flushes it.
    ///
    /// # Errors
    /// As [`RemoteArray::empty`], and transport errors while writing; on error the
    /// remote space is given back.
    pub fn from_array_with<S>(
        store: &Arc<RemoteStore>,
        array: &ArrayBase<S, D>,
        placement: &Placement,
    ) -> Result<Self>
    where
        S: Data<Elem = T>,
    {
        let remote = Self::empty(store, array.raw_dim(), placement)?;
        let written = remote.write_range(0, array).and_then(|()| store.flush());
        if let Err(e) = written {
            remote.free_extents();
            return Err(e);
        }
        Ok(remote)
    }

    /// Gives back the space of an array just allocated by [`RemoteArray::empty`]
    /// (one allocation per element: from its lowest address, as many bytes as its
    /// extents hold). Best effort, for error paths.
    fn free_extents(&self) {
        let mut per_element: Vec<(&str, u64, u64)> = Vec::new();
        for e in self.extents.iter() {
            match per_element.iter_mut().find(|p| p.0 == &*e.el.name) {
                Some(p) => {
                    p.1 = p.1.min(e.addr);
                    p.2 += e.bytes;
                }
                None => per_element.push((&e.el.name, e.addr, e.bytes)),
            }
        }
        for (name, addr, bytes) in per_element {
            let _ = self.store.elements().free(name, addr, bytes);
        }
    }

    /// Opens an array described by `meta`, checking it against `T`, `D` and the
    /// store's memory elements.
    ///
    /// # Errors
    /// [`Error::TypeMismatch`] when `meta` holds another element type;
    /// [`Error::Shape`] when its shape has another number of axes than `D` or
    /// disagrees with its extents; [`Error::UnknownElement`] for an extent on an
    /// element the store lacks; [`Error::RemoteRange`] for one outside its element;
    /// [`Error::Meta`] for other inconsistencies.
    pub fn from_meta(store: &Arc<RemoteStore>, meta: &ArrayMeta) -> Result<Self> {
        let size = item_size::<T>()?;
        if !dtype::accepts::<T>(&meta.dtype) || meta.item_size != size {
            return Err(Error::TypeMismatch {
                expected: dtype_name::<T>().into_owned(),
                expected_size: size,
                found: meta.dtype.clone(),
                found_size: meta.item_size,
            });
        }
        if let Some(n) = D::NDIM {
            if n != meta.shape.len() {
                return Err(Error::Shape(format!(
                    "metadata shape {:?} has {} axes, the array type has {n}",
                    meta.shape,
                    meta.shape.len()
                )));
            }
        }
        meta.validate()?;
        let mut dim = D::zeros(meta.shape.len());
        dim.slice_mut().copy_from_slice(&meta.shape);
        let mut parts = Vec::with_capacity(meta.extents.len());
        for e in &meta.extents {
            let el = store.element(&e.transport)?;
            if e.addr + e.bytes > el.size {
                return Err(Error::RemoteRange {
                    element: e.transport.clone(),
                    addr: e.addr,
                    len: e.bytes,
                    size: el.size,
                });
            }
            parts.push((el, e.addr, e.bytes));
        }
        Ok(Self::build(store, dim, parts))
    }

    /// The metadata to hand to another element. Data written with
    /// [`RemoteArray::write_range`] reaches remote memory only on eviction or flush:
    /// call [`RemoteArray::flush`] before handing the metadata on.
    pub fn meta(&self) -> ArrayMeta {
        ArrayMeta {
            dtype: dtype_name::<T>().into_owned(),
            item_size: std::mem::size_of::<T>(),
            shape: self.dim.slice().to_vec(),
            extents: self
                .extents
                .iter()
                .map(|e| Extent {
                    transport: e.el.name.to_string(),
                    addr: e.addr,
                    bytes: e.bytes,
                })
                .collect(),
        }
    }

    /// The store the array lives in.
    pub fn store(&self) -> &Arc<RemoteStore> {
        &self.store
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        self.dim.slice()
    }

    /// The shape as ndarray's dimension type.
    pub fn raw_dim(&self) -> D {
        self.dim.clone()
    }

    /// Number of rows (length of axis 0).
    pub fn rows(&self) -> usize {
        self.dim.slice()[0]
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.dim.size()
    }

    /// True if the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Elements in one row.
    pub fn row_len(&self) -> usize {
        self.dim.slice()[1..].iter().product()
    }

    /// Bytes in one row.
    pub fn row_bytes(&self) -> u64 {
        (self.row_len() * std::mem::size_of::<T>()) as u64
    }

    /// Bytes of data.
    pub fn byte_len(&self) -> u64 {
        (self.len() * std::mem::size_of::<T>()) as u64
    }

    /// Number of extents (pieces in memory elements).
    pub fn extent_count(&self) -> usize {
        self.extents.len()
    }

    /// Rows `rows` as a new array handle over the same remote bytes (no data moves).
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for rows outside the array.
    pub fn slice(&self, rows: impl RangeBounds<usize>) -> Result<Self> {
        let r = row_range("slice", rows, self.rows())?;
        let rb = self.row_bytes();
        let parts = self
            .pieces(r.start as u64 * rb, r.end as u64 * rb)
            .map(|(e, addr, len, _)| (e.el.clone(), addr, len))
            .collect();
        let mut dim = self.dim.clone();
        dim.slice_mut()[0] = r.len();
        Ok(Self::build(&self.store, dim, parts))
    }

    /// Concatenates arrays along axis 0 into one handle (no data moves).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty list or arrays of different stores;
    /// [`Error::Shape`] when the shapes past axis 0 differ.
    pub fn concat(parts: &[&Self]) -> Result<Self> {
        let first = parts
            .first()
            .ok_or_else(|| Error::InvalidArgument("nothing to concatenate".into()))?;
        let mut dim = first.dim.clone();
        dim.slice_mut()[0] = 0;
        let mut all = Vec::new();
        for p in parts {
            if !Arc::ptr_eq(&p.store, &first.store) {
                return Err(Error::InvalidArgument(
                    "cannot concatenate arrays of different stores".into(),
                ));
            }
            if p.shape()[1..] != first.shape()[1..] {
                return Err(Error::Shape(format!(
                    "cannot concatenate shape {:?} to shape {:?} along axis 0",
                    p.shape(),
                    first.shape()
                )));
            }
            dim.slice_mut()[0] = dim.slice()[0]
                .checked_add(p.rows())
                .ok_or_else(|| Error::Shape("concatenated row count overflows".into()))?;
            all.extend(p.extents.iter().map(|e| (e.el.clone(), e.addr, e.bytes)));
        }
        Self::check_dim(&dim)?;
        Ok(Self::build(&first.store, dim, all))
    }

    /// The pieces of the array's bytes `[lo, hi)`: (extent, remote address, length,
    /// offset from `lo`).
    fn pieces(&self, lo: u64, hi: u64) -> impl Iterator<Item = (&Ext, u64, u64, u64)> + '_ {
        let first = self.extents.partition_point(|e| e.start + e.bytes <= lo);
        self.extents[first..]
            .iter()
            .take_while(move |e| e.start < hi)
            .filter_map(move |e| {
                let a = e.start.max(lo);
                let b = (e.start + e.bytes).min(hi);
                (a < b).then(|| (e, e.addr + (a - e.start), b - a, a - lo))
            })
    }

    /// The remote ranges of rows `rows`, for prefetching.
    fn ranges(&self, rows: Range<usize>) -> Vec<PoolRange> {
        let rb = self.row_bytes();
        self.pieces(rows.start as u64 * rb, rows.end as u64 * rb)
            .map(|(e, addr, len, _)| PoolRange {
                transport: e.el.id,
                addr,
                len: len as usize,
            })
            .collect()
    }

    /// Reads the whole array into a local `ndarray::Array`.
    ///
    /// # Errors
    /// As [`RemoteArray::materialize_range`].
    pub fn materialize(&self) -> Result<Array<T, D>> {
        self.materialize_range(..)
    }

    /// Reads rows `rows` into a local `ndarray::Array`, streaming through the pool (the
    /// range may be far larger than the pool).
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for rows outside the array; [`Error::Transport`] /
    /// [`Error::Timeout`] when a memory element cannot be read.
    pub fn materialize_range(&self, rows: impl RangeBounds<usize>) -> Result<Array<T, D>> {
        let r = row_range("materialize", rows, self.rows())?;
        let mut dim = self.dim.clone();
        dim.slice_mut()[0] = r.len();
        let mut data: Vec<T> = bytemuck::zeroed_vec(dim.size());
        self.read_rows(r, &mut data)?;
        Array::from_shape_vec(dim, data).map_err(|e| Error::Shape(e.to_string()))
    }

    /// Reads rows `rows` into `dst` (row-major), which must hold exactly that many
    /// elements. Reuses the caller's memory, unlike [`RemoteArray::materialize_range`].
    ///
    /// # Errors
    /// [`Error::Shape`] for a `dst` of the wrong length; as
    /// [`RemoteArray::materialize_range`].
    pub fn read_into(&self, rows: impl RangeBounds<usize>, dst: &mut [T]) -> Result<()> {
        let r = row_range("materialize", rows, self.rows())?;
        let want = r.len() * self.row_len();
        if dst.len() != want {
            return Err(Error::Shape(format!(
                "rows {r:?} hold {want} elements, the destination has room for {}",
                dst.len()
            )));
        }
        self.read_rows(r, dst)
    }

    fn read_rows(&self, r: Range<usize>, dst: &mut [T]) -> Result<()> {
        let rb = self.row_bytes();
        let mut rest: &mut [u8] = bytemuck::cast_slice_mut(dst);
        let mut reads = Vec::new();
        for (e, addr, len, _) in self.pieces(r.start as u64 * rb, r.end as u64 * rb) {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(len as usize);
            rest = tail;
            reads.push(PoolRead {
                transport: e.el.id,
                addr,
                dst: head,
            });
        }
        self.store.pool().read_many(&mut reads)
    }

    /// Writes `data` into rows `first_row..first_row + data.len_of(Axis(0))`. Write-back:
    /// the bytes reach remote memory on eviction or [`RemoteArray::flush`].
    ///
    /// # Errors
    /// [`Error::Shape`] when `data`'s shape past axis 0 differs from the array's;
    /// [`Error::OutOfRange`] for rows outside the array; transport errors.
    pub fn write_range<S>(&self, first_row: usize, data: &ArrayBase<S, D>) -> Result<()>
    where
        S: Data<Elem = T>,
    {
        if data.ndim() == 0 || data.shape()[1..] != self.shape()[1..] {
            return Err(Error::Shape(format!(
                "cannot write rows of shape {:?} into an array of shape {:?}",
                data.shape(),
                self.shape()
            )));
        }
        let n = data.shape()[0];
        let r = row_range("write", first_row..first_row.saturating_add(n), self.rows())?;
        let standard = data.as_standard_layout();
        let elems = standard
            .as_slice()
            .ok_or_else(|| Error::Shape("data is not contiguous after standardising".into()))?;
        let mut rest: &[u8] = bytemuck::cast_slice(elems);
        let rb = self.row_bytes();
        let mut writes = Vec::new();
        for (e, addr, len, _) in self.pieces(r.start as u64 * rb, r.end as u64 * rb) {
            let (head, tail) = rest.split_at(len as usize);
            rest = tail;
            writes.push(PoolWrite {
                transport: e.el.id,
                addr,
                src: head,
            });
        }
        self.store.pool().write_many(&writes)
    }

    /// Writes every dirty page of the store's pool back to remote memory.
    ///
    /// # Errors
    /// As [`crate::BufferPool::flush`].
    pub fn flush(&self) -> Result<()> {
        self.store.flush()
    }

    /// Iterates over the array in chunks of `rows_per_chunk` rows (the last may be
    /// shorter), each materialized locally; the next chunk is prefetched into the pool
    /// on a background thread while the caller works on the current one. Memory stays
    /// bounded by the pool plus one chunk, however large the array.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a chunk of zero rows.
    pub fn chunks(&self, rows_per_chunk: usize) -> Result<Chunks<T, D>> {
        if rows_per_chunk == 0 {
            return Err(Error::InvalidArgument(
                "a chunk needs at least one row".into(),
            ));
        }
        Ok(Chunks::new(self.clone(), rows_per_chunk))
    }

    fn chunk_ranges(&self, rows_per_chunk: usize) -> Result<Vec<Range<usize>>> {
        if rows_per_chunk == 0 {
            return Err(Error::InvalidArgument(
                "a chunk needs at least one row".into(),
            ));
        }
        let n = self.rows();
        Ok((0..n.div_ceil(rows_per_chunk))
            .map(|i| i * rows_per_chunk..((i + 1) * rows_per_chunk).min(n))
            .collect())
    }

    /// Applies `f` to every chunk of `rows_per_chunk` rows in parallel (rayon) and
    /// returns the results in chunk order. `f` gets the chunk's row range and data.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a chunk of zero rows; the first read error.
    pub fn map_chunks<R, F>(&self, rows_per_chunk: usize, f: F) -> Result<Vec<R>>
    where
        R: Send,
        F: Fn(Range<usize>, Array<T, D>) -> R + Sync + Send,
    {
        self.chunk_ranges(rows_per_chunk)?
            .into_par_iter()
            .map(|r| {
                let chunk = self.materialize_range(r.clone())?;
                Ok(f(r, chunk))
            })
            .collect()
    }

    /// Maps every chunk with `map` and combines the results with `reduce` in parallel
    /// (rayon); `identity` makes the neutral value (`reduce` must be associative).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a chunk of zero rows; the first read error.
    pub fn reduce_chunks<R, I, M, C>(
        &self,
        rows_per_chunk: usize,
        identity: I,
        map: M,
        reduce: C,
    ) -> Result<R>
    where
        R: Send,
        I: Fn() -> R + Sync + Send,
        M: Fn(Range<usize>, Array<T, D>) -> R + Sync + Send,
        C: Fn(R, R) -> R + Sync + Send,
    {
        self.chunk_ranges(rows_per_chunk)?
            .into_par_iter()
            .map(|r| {
                let chunk = self.materialize_range(r.clone())?;
                Ok(map(r, chunk))
            })
            .try_reduce(&identity, |a, b| Ok(reduce(a, b)))
    }

    /// Creates a new remote array whose every chunk is `f` applied to the matching
    /// chunk of this one (in parallel), placed by `placement`. `f` must keep the row
    /// count and may change the element type and the shape past axis 0, consistently
    /// for every chunk.
    ///
    /// # Errors
    /// [`Error::Shape`] if `f` returns chunks of inconsistent shapes; as
    /// [`RemoteArray::empty`] and [`RemoteArray::write_range`].
    pub fn map_to_remote<U, E, F>(
        &self,
        rows_per_chunk: usize,
        placement: &Placement,
        f: F,
    ) -> Result<RemoteArray<U, E>>
    where
        U: Pod + Send + Sync,
        E: Dimension,
        F: Fn(Array<T, D>) -> Array<U, E> + Sync + Send,
    {
        let ranges = self.chunk_ranges(rows_per_chunk)?;
        let Some(first) = ranges.first() else {
            // No rows: the output shape past axis 0 is unknown; map an empty chunk.
            let out = f(self.materialize_range(0..0)?);
            return RemoteArray::empty(&self.store, out.raw_dim(), placement);
        };
        let head = f(self.materialize_range(first.clone())?);
        let mut dim = head.raw_dim();
        if dim.ndim() == 0 || dim.slice()[0] != first.len() {
            return Err(Error::Shape(format!(
                "the mapped chunk of rows {first:?} has shape {:?}; it must keep the row count",
                dim.slice()
            )));
        }
        dim.slice_mut()[0] = self.rows();
        let out = RemoteArray::<U, E>::empty(&self.store, dim, placement)?;
        let wrote = out.write_range(0, &head).and_then(|()| {
            ranges[1..].par_iter().try_for_each(|r| {
                let mapped = f(self.materialize_range(r.clone())?);
                if mapped.shape().first() != Some(&r.len()) {
                    return Err(Error::Shape(format!(
                        "the mapped chunk of rows {r:?} has shape {:?}; it must keep the row count",
                        mapped.shape()
                    )));
                }
                out.write_range(r.start, &mapped)
            })
        });
        if let Err(e) = wrote {
            out.free_extents();
            return Err(e);
        }
        Ok(out)
    }
}
