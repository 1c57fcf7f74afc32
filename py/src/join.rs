//! Join kernels of `npjoin.join`: hash join on numeric keys, hash partitioning and
//! counting sort, on NumPy arrays, without the GIL.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use numpy::{
    PyArray1, PyArrayDescrMethods, PyArrayMethods, PyReadonlyArray1, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use crate::errors::detach;

/// The splitmix64 finalizer: a fixed, well-mixing hash, the same in every process.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Hasher for keys that are already 64-bit key codes.
#[derive(Default)]
struct MixHasher(u64);

impl Hasher for MixHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = mix(self.0 ^ u64::from(b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = mix(n);
    }
}

type KeyMap = HashMap<u64, u32, BuildHasherDefault<MixHasher>>;

/// An intp NumPy array.
type Intp<'py> = Bound<'py, PyArray1<isize>>;
/// Two intp arrays (indexers, or sorter and bounds).
type IntpPair<'py> = (Intp<'py>, Intp<'py>);
/// What `prepare_join` returns.
type Prepared<'py> = (JoinTable, Intp<'py>, Intp<'py>, usize);

/// Key element types the kernels accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyType {
    F32,
    F64,
    I32,
    I64,
}

impl KeyType {
    fn name(self) -> &'static str {
        match self {
            KeyType::F32 => "float32",
            KeyType::F64 => "float64",
            KeyType::I32 => "int32",
            KeyType::I64 => "int64",
        }
    }
}

/// Equal keys get equal codes: `-0.0` and `0.0` match, every NaN matches every NaN
/// (as in pandas `merge`).
fn codes(arr: &Bound<'_, PyUntypedArray>, want: Option<KeyType>) -> PyResult<(KeyType, Vec<u64>)> {
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
    if let Some(w) = want {
        if w != kt {
            return Err(PyTypeError::new_err(format!(
                "join keys must be {}, not {}",
                w.name(),
                kt.name()
            )));
        }
    }
    let v = match kt {
        KeyType::F32 => {
            let a = arr.downcast::<PyArray1<f32>>()?.readonly();
            let s = a.as_array();
            s.iter()
                .map(|&x| {
                    if x.is_nan() {
                        u64::from(f32::NAN.to_bits())
                    } else if x == 0.0 {
                        0
                    } else {
                        u64::from(x.to_bits())
                    }
                })
                .collect()
        }
        KeyType::F64 => {
            let a = arr.downcast::<PyArray1<f64>>()?.readonly();
            let s = a.as_array();
            s.iter()
                .map(|&x| {
                    if x.is_nan() {
                        f64::NAN.to_bits()
                    } else if x == 0.0 {
                        0
                    } else {
                        x.to_bits()
                    }
                })
                .collect()
        }
        KeyType::I32 => {
            let a = arr.downcast::<PyArray1<i32>>()?.readonly();
            let s = a.as_array();
            s.iter().map(|&x| x as u32 as u64).collect()
        }
        KeyType::I64 => {
            let a = arr.downcast::<PyArray1<i64>>()?.readonly();
            let s = a.as_array();
            s.iter().map(|&x| x as u64).collect()
        }
    };
    Ok((kt, v))
}

/// The hash table of a prepared join: key code → group number (order of first
/// appearance in the left keys).
#[pyclass(module = "scad._native", frozen)]
pub struct JoinTable {
    map: KeyMap,
    key_type: KeyType,
    rows: usize,
}

#[pymethods]
impl JoinTable {
    /// Number of groups (distinct left keys).
    fn __len__(&self) -> usize {
        self.map.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "JoinTable({} keys of {} over {} rows)",
            self.map.len(),
            self.key_type.name(),
            self.rows
        )
    }
}

/// Stable counting sort of `labels` (each `< ngroups`): (sorter, counts).
fn counting_sort(labels: &[u32], ngroups: usize) -> (Vec<isize>, Vec<isize>) {
    let mut counts = vec![0isize; ngroups];
    for &l in labels {
        counts[l as usize] += 1;
    }
    let mut next = Vec::with_capacity(ngroups);
    let mut acc = 0isize;
    for &c in &counts {
        next.push(acc);
        acc += c;
    }
    let mut sorter = vec![0isize; labels.len()];
    for (i, &l) in labels.iter().enumerate() {
        let slot = &mut next[l as usize];
        sorter[*slot as usize] = i as isize;
        *slot += 1;
    }
    (sorter, counts)
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
    let (kt, keys) = codes(left, want)?;
    let (map, sorter, counts) = detach(py, move || {
        let mut map = KeyMap::default();
        let mut labels = Vec::with_capacity(keys.len());
        for &k in &keys {
            let next = map.len() as u32;
            labels.push(*map.entry(k).or_insert(next));
        }
        let (sorter, counts) = counting_sort(&labels, map.len());
        Ok((map, sorter, counts))
    })?;
    let ngroups = map.len();
    let rows = sorter.len();
    Ok((
        JoinTable {
            map,
            key_type: kt,
            rows,
        },
        PyArray1::from_vec(py, sorter),
        PyArray1::from_vec(py, counts),
        ngroups,
    ))
}

fn parse_key_type(s: Option<&str>) -> PyResult<Option<KeyType>> {
    Ok(match s {
        None => None,
        Some("float32") => Some(KeyType::F32),
        Some("float64") => Some(KeyType::F64),
        Some("int32") => Some(KeyType::I32),
        Some("int64") => Some(KeyType::I64),
        Some(other) => return Err(PyValueError::new_err(format!("unknown key type {other:?}"))),
    })
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
    let want = parse_key_type(key_type)?.or(Some(table.key_type));
    let (_, rkeys) = codes(right, want)?;
    let ls = left_sorter
        .as_slice()
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let lc = left_count
        .as_slice()
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    if ngroups != table.map.len() || lc.len() != ngroups {
        return Err(PyValueError::new_err(format!(
            "ngroups {ngroups} and left_count of length {} do not match the table's {} groups",
            lc.len(),
            table.map.len()
        )));
    }
    if lc.iter().any(|&c| c < 0) || lc.iter().sum::<isize>() as usize != ls.len() {
        return Err(PyValueError::new_err(
            "left_count must be non-negative and add up to the length of left_sorter",
        ));
    }
    let map = &table.map;
    let (li, ri) = detach(py, move || {
        // Right rows by group, stable.
        let mut rlabels: Vec<(u32, u32)> = Vec::new();
        let mut rc = vec![0usize; ngroups];
        for (i, k) in rkeys.iter().enumerate() {
            if let Some(&g) = map.get(k) {
                rc[g as usize] += 1;
                rlabels.push((g, i as u32));
            }
        }
        let mut rstart = Vec::with_capacity(ngroups + 1);
        let mut acc = 0usize;
        for &c in &rc {
            rstart.push(acc);
            acc += c;
        }
        rstart.push(acc);
        let mut rsorted = vec![0isize; acc];
        let mut next = rstart.clone();
        for &(g, i) in &rlabels {
            rsorted[next[g as usize]] = i as isize;
            next[g as usize] += 1;
        }
        let total: usize = lc.iter().zip(&rc).map(|(&l, &r)| l as usize * r).sum();
        let mut li = Vec::with_capacity(total);
        let mut ri = Vec::with_capacity(total);
        let mut lpos = 0usize;
        for g in 0..ngroups {
            let n = lc[g] as usize;
            let rights = &rsorted[rstart[g]..rstart[g + 1]];
            if !rights.is_empty() {
                for &l in &ls[lpos..lpos + n] {
                    for &r in rights {
                        li.push(l);
                        ri.push(r);
                    }
                }
            }
            lpos += n;
        }
        Ok((li, ri))
    })?;
    Ok((PyArray1::from_vec(py, li), PyArray1::from_vec(py, ri)))
}

fn partition(bins: Vec<u32>, num_bins: usize) -> (Vec<isize>, Vec<isize>) {
    let (sorter, counts) = counting_sort(&bins, num_bins);
    let mut bounds = Vec::with_capacity(num_bins + 1);
    let mut acc = 0isize;
    bounds.push(0);
    for c in counts {
        acc += c;
        bounds.push(acc);
    }
    (sorter, bounds)
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
    check_bins(num_bins)?;
    let (_, keys) = codes(values, parse_key_type(key_type)?)?;
    let (s, b) = detach(py, move || {
        let bins = keys
            .iter()
            .map(|&k| (mix(k) % num_bins as u64) as u32)
            .collect();
        Ok(partition(bins, num_bins))
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
    check_bins(num_bins)?;
    let want = parse_key_type(key_type)?;
    let (_, k1) = codes(v1, want)?;
    let (_, k2) = codes(v2, want)?;
    if k1.len() != k2.len() {
        return Err(PyValueError::new_err(format!(
            "key columns differ in length: {} and {}",
            k1.len(),
            k2.len()
        )));
    }
    let (s, b) = detach(py, move || {
        let bins = k1
            .iter()
            .zip(&k2)
            .map(|(&a, &b)| (mix(mix(a) ^ b.rotate_left(17)) % num_bins as u64) as u32)
            .collect();
        Ok(partition(bins, num_bins))
    })?;
    Ok((PyArray1::from_vec(py, s), PyArray1::from_vec(py, b)))
}

fn check_bins(num_bins: usize) -> PyResult<()> {
    if num_bins == 0 || num_bins > u32::MAX as usize {
        return Err(PyValueError::new_err(format!(
            "num_bins must be between 1 and {}, not {num_bins}",
            u32::MAX
        )));
    }
    Ok(())
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
    if ngroups >= u32::MAX as usize {
        return Err(PyValueError::new_err("too many groups"));
    }
    let (s, c) = detach(py, move || {
        let mut labels = Vec::with_capacity(idx.len());
        for &l in idx {
            if l < -1 || l >= ngroups as i64 {
                return Err(PyValueError::new_err(format!(
                    "label {l} outside [-1, {ngroups})"
                )));
            }
            labels.push((l + 1) as u32);
        }
        Ok(counting_sort(&labels, ngroups + 1))
    })?;
    Ok((PyArray1::from_vec(py, s), PyArray1::from_vec(py, c)))
}
