//! `npjoin.join`'s native functions: NumPy arrays in and out, dtype checks, and the
//! kernels of [`scad_npjoin`] run without the GIL.

use numpy::{
    PyArray1, PyArrayDescrMethods, PyArrayMethods, PyReadonlyArray1, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use scad_npjoin::{self as npjoin, codes, KeyType, NpJoinError};

use crate::errors::detach;

/// An intp NumPy array.
type Intp<'py> = Bound<'py, PyArray1<isize>>;
/// Two intp arrays (indexers, or sorter and bounds).
type IntpPair<'py> = (Intp<'py>, Intp<'py>);
/// What `prepare_join` returns.
type Prepared<'py> = (JoinTable, Intp<'py>, Intp<'py>, usize);

/// A key of the wrong type is a `TypeError`, every other kernel error a `ValueError`.
fn join_err(e: NpJoinError) -> PyErr {
    match e {
        NpJoinError::KeyTypeMismatch { .. } => PyTypeError::new_err(e.to_string()),
        _ => PyValueError::new_err(e.to_string()),
    }
}

/// The key codes ([`npjoin::KeyCode`]) of a one-dimensional float32, float64, int32 or
/// int64 array (of type `want` if given).
fn key_codes(
    arr: &Bound<'_, PyUntypedArray>,
    want: Option<KeyType>,
) -> PyResult<(KeyType, Vec<u64>)> {
    let dt = arr.dtype();
    let py = arr.py();
    if arr.ndim() != 1 {
        return Err(PyValueError::new_err(format!(
            "join keys must be one-dimensional, got {} dimensions",
            arr.ndim()
        )));
    }
    let kt = if dt.is_equiv_to(&numpy::dtype::<f32>(py)) {
        KeyType::F32
    } else if dt.is_equiv_to(&numpy::dtype::<f64>(py)) {
        KeyType::F64
    } else if dt.is_equiv_to(&numpy::dtype::<i32>(py)) {
        KeyType::I32
    } else if dt.is_equiv_to(&numpy::dtype::<i64>(py)) {
        KeyType::I64
    } else {
        return Err(PyTypeError::new_err(format!(
            "join keys must be float32, float64, int32 or int64, not {dt}"
        )));
    };
    if let Some(expected) = want.filter(|&w| w != kt) {
        return Err(join_err(NpJoinError::KeyTypeMismatch {
            expected,
            found: kt,
        }));
    }
    // `as_array` also reads strided views; the codes are a new contiguous vector.
    let v = match kt {
        KeyType::F32 => codes(
            arr.downcast::<PyArray1<f32>>()?
                .readonly()
                .as_array()
                .iter()
                .copied(),
        ),
        KeyType::F64 => codes(
            arr.downcast::<PyArray1<f64>>()?
                .readonly()
                .as_array()
                .iter()
                .copied(),
        ),
        KeyType::I32 => codes(
            arr.downcast::<PyArray1<i32>>()?
                .readonly()
                .as_array()
                .iter()
                .copied(),
        ),
        KeyType::I64 => codes(
            arr.downcast::<PyArray1<i64>>()?
                .readonly()
                .as_array()
                .iter()
                .copied(),
        ),
    };
    Ok((kt, v))
}

fn parse_key_type(s: Option<&str>) -> PyResult<Option<KeyType>> {
    s.map(str::parse).transpose().map_err(join_err)
}

/// The hash table of a prepared join: key code → group number (order of first
/// appearance in the left keys).
#[pyclass(module = "scad._native", frozen)]
pub struct JoinTable {
    inner: npjoin::JoinTable,
}

#[pymethods]
impl JoinTable {
    /// Number of groups (distinct left keys).
    fn __len__(&self) -> usize {
        self.inner.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "JoinTable({} keys of {} over {} rows)",
            self.inner.len(),
            self.inner.key_type(),
            self.inner.rows()
        )
    }
}

/// Groups the left keys: `(table, left_sorter, left_count, ngroups)`.
#[pyfunction]
#[pyo3(signature = (left, key_type=None))]
pub fn prepare_join<'py>(
    py: Python<'py>,
    left: &Bound<'py, PyUntypedArray>,
    key_type: Option<&str>,
) -> PyResult<Prepared<'py>> {
    let want = parse_key_type(key_type)?;
    let (kt, keys) = key_codes(left, want)?;
    let (inner, sorter, counts) = detach(py, move || {
        npjoin::JoinTable::build(kt, &keys).map_err(join_err)
    })?;
    let ngroups = inner.len();
    Ok((
        JoinTable { inner },
        PyArray1::from_vec(py, sorter),
        PyArray1::from_vec(py, counts),
        ngroups,
    ))
}

/// All inner-join pairs of `right` against a prepared table: `(left_indexer,
/// right_indexer)`, grouped by key in order of first appearance on the left.
#[pyfunction]
#[pyo3(signature = (table, left_sorter, left_count, ngroups, right, key_type=None))]
pub fn join_on_table<'py>(
    py: Python<'py>,
    table: &JoinTable,
    left_sorter: PyReadonlyArray1<'py, isize>,
    left_count: PyReadonlyArray1<'py, isize>,
    ngroups: usize,
    right: &Bound<'py, PyUntypedArray>,
    key_type: Option<&str>,
) -> PyResult<IntpPair<'py>> {
    let want = parse_key_type(key_type)?.or(Some(table.inner.key_type()));
    let (_, rkeys) = key_codes(right, want)?;
    let ls = left_sorter
        .as_slice()
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let lc = left_count
        .as_slice()
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    if ngroups != table.inner.len() {
        return Err(join_err(NpJoinError::GroupMismatch {
            ngroups,
            counts: lc.len(),
            groups: table.inner.len(),
        }));
    }
    let t = &table.inner;
    let (li, ri) = detach(py, move || t.probe(ls, lc, &rkeys).map_err(join_err))?;
    Ok((PyArray1::from_vec(py, li), PyArray1::from_vec(py, ri)))
}

/// Hash-partitions rows by one key column: `(sorter, bounds)`.
#[pyfunction]
#[pyo3(signature = (values, num_bins, key_type=None))]
pub fn partition_on<'py>(
    py: Python<'py>,
    values: &Bound<'py, PyUntypedArray>,
    num_bins: usize,
    key_type: Option<&str>,
) -> PyResult<IntpPair<'py>> {
    npjoin::check_bins(num_bins).map_err(join_err)?;
    let (_, keys) = key_codes(values, parse_key_type(key_type)?)?;
    let (s, b) = detach(py, move || {
        npjoin::partition(&keys, num_bins).map_err(join_err)
    })?;
    Ok((PyArray1::from_vec(py, s), PyArray1::from_vec(py, b)))
}

/// Hash-partitions rows by a pair of key columns: `(sorter, bounds)`.
#[pyfunction]
#[pyo3(signature = (v1, v2, num_bins, key_type=None))]
pub fn partition_on_pair<'py>(
    py: Python<'py>,
    v1: &Bound<'py, PyUntypedArray>,
    v2: &Bound<'py, PyUntypedArray>,
    num_bins: usize,
    key_type: Option<&str>,
) -> PyResult<IntpPair<'py>> {
    npjoin::check_bins(num_bins).map_err(join_err)?;
    let want = parse_key_type(key_type)?;
    let (_, k1) = key_codes(v1, want)?;
    let (_, k2) = key_codes(v2, want)?;
    let (s, b) = detach(py, move || {
        npjoin::partition_pair(&k1, &k2, num_bins).map_err(join_err)
    })?;
    Ok((PyArray1::from_vec(py, s), PyArray1::from_vec(py, b)))
}

/// Counting sort of group labels in `[-1, ngroups)`: `(indexer, counts)`, with
/// `counts[0]` counting label -1 (as pandas' `groupsort_indexer`).
#[pyfunction]
pub fn groupsort_indexer<'py>(
    py: Python<'py>,
    index: PyReadonlyArray1<'py, i64>,
    ngroups: usize,
) -> PyResult<IntpPair<'py>> {
    let idx = index
        .as_slice()
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let (s, c) = detach(py, move || {
        npjoin::groupsort_indexer(idx, ngroups).map_err(join_err)
    })?;
    Ok((PyArray1::from_vec(py, s), PyArray1::from_vec(py, c)))
}
