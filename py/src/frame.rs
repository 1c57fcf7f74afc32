//! `FrameEnv` and `Frame`: the remote-frame crate for Python (`scad.RemoteFrame` wraps
//! them). Data enters and leaves as Arrow C streams (PyCapsules, see
//! [`crate::arrow_ffi`]), expressions arrive as JSON trees (parsed by
//! [`scad_remote_frame::expr_json`]), and every kernel runs with the GIL released.

use std::collections::VecDeque;
use std::sync::Arc;

use arrow_array::{RecordBatch, RecordBatchReader};
use arrow_schema::{ArrowError, SchemaRef};
use datafusion::common::DFSchema;
use datafusion::logical_expr::{ident, SortExpr};
use pyo3::exceptions::{PyKeyError, PyNotImplementedError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict};
use scad_remote_frame::expr_json::{self, ExprJsonError};
use scad_remote_frame::query::frame_schema;
use scad_remote_frame::{
    Batches, Budget, Error as FrameError, FrameEnv, FrameMeta, FrameWriter, JoinType, RemoteFrame,
};

use crate::arrow_ffi::{export_batches, export_stream, import_stream};
use crate::errors::{
    array_err, detach, unknown_name_error, BudgetExceededError, FreedFrameError, QueryError,
    ScadError, StaleFrameError,
};
use crate::pool::PyStore;

/// Largest batch a stream read for Python holds at once.
const STREAM_BATCH_CAP: u64 = 64 << 20;

/// The Python exception for a scad-remote-frame error.
///
/// `OutOfBudget` (a kernel's or a query operator's) and `Skew` are a
/// `BudgetExceededError`; query errors: `UnknownName` an `UnknownNameError` (a
/// `QueryError` and a `KeyError`), `Unsupported` a `NotImplementedError`, `Query` a
/// `QueryError`. A freed handle raises `FreedFrameError`, metadata whose memory no
/// longer holds the frame `StaleFrameError`.
pub fn frame_err(e: FrameError) -> PyErr {
    let msg = e.to_string();
    match e {
        FrameError::Freed { .. } => FreedFrameError::new_err(msg),
        FrameError::Stale { .. } => StaleFrameError::new_err(msg),
        FrameError::Array(a) => array_err(*a),
        FrameError::UnknownColumn { .. } => PyKeyError::new_err(msg),
        FrameError::TypeMismatch { .. } | FrameError::UnsupportedType { .. } => {
            PyTypeError::new_err(msg)
        }
        FrameError::MetaJson(_) | FrameError::Meta(_) | FrameError::InvalidArgument(_) => {
            PyValueError::new_err(msg)
        }
        FrameError::OutOfBudget { .. } | FrameError::Skew { .. } => {
            BudgetExceededError::new_err(msg)
        }
        FrameError::Arrow(_) => PyValueError::new_err(msg),
        FrameError::Query(_) => QueryError::new_err(msg),
        FrameError::UnknownName { .. } => unknown_name_err(msg),
        FrameError::Unsupported(_) => PyNotImplementedError::new_err(msg),
        _ => ScadError::new_err(msg),
    }
}

fn unknown_name_err(msg: String) -> PyErr {
    Python::with_gil(|py| match unknown_name_error(py) {
        Ok(class) => PyErr::from_type(class.clone(), msg),
        Err(_) => QueryError::new_err(msg),
    })
}

/// A malformed expression tree is a `ValueError`.
fn expr_err(e: ExprJsonError) -> PyErr {
    PyValueError::new_err(e.to_string())
}

fn arrow_err(e: ArrowError) -> PyErr {
    PyValueError::new_err(format!("arrow: {e}"))
}

/// Where frames live, the local memory budget of kernels, and their counters.
#[pyclass(module = "scad._native", name = "FrameEnv", frozen)]
pub struct PyFrameEnv {
    pub(crate) inner: FrameEnv,
    /// Where `scad.sql` and `scad.explain` run over this env.
    pub(crate) sql_session: crate::query::EnvSession,
}

#[pymethods]
impl PyFrameEnv {
    /// An environment over `store`'s memory elements; `budget` bytes of local memory for
    /// kernels (unlimited if None), `chunk_rows` rows per stored chunk, new frames placed
    /// on `elements` (all if None).
    #[new]
    #[pyo3(signature = (store, budget=None, chunk_rows=None, elements=None))]
    fn new(
        store: &PyStore,
        budget: Option<u64>,
        chunk_rows: Option<usize>,
        elements: Option<Vec<String>>,
    ) -> PyResult<Self> {
        let budget = Budget::from_limit(budget).map_err(frame_err)?;
        let mut env = FrameEnv::new(Arc::clone(store.inner.elements())).with_budget(budget);
        if let Some(r) = chunk_rows {
            if r == 0 {
                return Err(PyValueError::new_err("chunk_rows must be at least 1"));
            }
            env = env.with_chunk_rows(r);
        }
        if let Some(names) = elements {
            let known = store.inner.elements().names();
            if let Some(bad) = names.iter().find(|n| !known.contains(n)) {
                return Err(PyKeyError::new_err(format!(
                    "no memory element {bad:?} in the store (known: {})",
                    known.join(", ")
                )));
            }
            env = env.with_elements(names);
        }
        Ok(PyFrameEnv {
            inner: env,
            sql_session: Default::default(),
        })
    }

    /// The local memory budget in bytes (None: unlimited).
    #[getter]
    fn budget(&self) -> Option<u64> {
        self.inner.budget().limit()
    }

    /// Rows per stored chunk of new frames.
    #[getter]
    fn chunk_rows(&self) -> usize {
        self.inner.chunk_rows()
    }

    /// Bytes of local memory kernels hold right now.
    #[getter]
    fn local_bytes(&self) -> u64 {
        self.inner.local_bytes()
    }

    /// Counters of the frame operations: time_s, bytes_in, bytes_out,
    /// peak_local_bytes, spill_files.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats();
        let d = PyDict::new(py);
        d.set_item("time_s", s.time.as_secs_f64())?;
        d.set_item("bytes_in", s.bytes_in)?;
        d.set_item("bytes_out", s.bytes_out)?;
        d.set_item("peak_local_bytes", s.peak_local_bytes)?;
        d.set_item("spill_files", s.spill_files)?;
        Ok(d)
    }

    /// Zeroes the counters.
    fn reset_stats(&self) {
        self.inner.reset_stats();
    }

    /// Moves the allocators past the given frames (metadata JSON texts), so new frames
    /// do not overwrite them; for an element that received frames but no allocation state.
    fn reserve_frames(&self, metas: Vec<String>) -> PyResult<()> {
        let parsed = metas
            .iter()
            .map(|m| FrameMeta::from_json(m).map_err(frame_err))
            .collect::<PyResult<Vec<_>>>()?;
        let refs: Vec<&FrameMeta> = parsed.iter().collect();
        self.inner.reserve_frames(&refs).map_err(frame_err)
    }
}

/// Streams a frame batch by batch to an Arrow consumer.
struct FrameReader {
    schema: SchemaRef,
    batches: Batches<Vec<RecordBatch>>,
    pending: VecDeque<RecordBatch>,
}

impl Iterator for FrameReader {
    type Item = Result<RecordBatch, ArrowError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(b) = self.pending.pop_front() {
                return Some(Ok(b));
            }
            match self.batches.next()? {
                Ok(bs) => self.pending.extend(bs),
                Err(e) => return Some(Err(ArrowError::ExternalError(Box::new(e)))),
            }
        }
    }
}

impl RecordBatchReader for FrameReader {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
}

fn join_type(how: &str) -> PyResult<JoinType> {
    Ok(match how {
        "inner" => JoinType::Inner,
        "left" => JoinType::Left,
        "right" => JoinType::Right,
        "full" => JoinType::Full,
        "semi" => JoinType::LeftSemi,
        "anti" => JoinType::LeftAnti,
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown join type {other:?} (inner, left, right, full, semi or anti)"
            )))
        }
    })
}

/// A table in memory elements (see `scad.RemoteFrame`).
#[pyclass(module = "scad._native", name = "Frame", frozen)]
pub struct PyFrame {
    pub(crate) inner: RemoteFrame,
}

impl PyFrame {
    /// The frame's schema, to type the expressions sent as JSON against.
    fn expr_schema(&self) -> PyResult<DFSchema> {
        frame_schema(&self.inner).map_err(frame_err)
    }

    pub(crate) fn wrap(inner: RemoteFrame) -> Self {
        PyFrame { inner }
    }

    fn column_list(&self, columns: Option<Vec<String>>) -> PyResult<Vec<usize>> {
        match columns {
            Some(names) => self.inner.column_indices(&names).map_err(frame_err),
            None => Ok((0..self.inner.meta().schema.len()).collect()),
        }
    }

    fn batch_bytes(&self) -> u64 {
        self.inner
            .env()
            .budget()
            .limit()
            .map_or(STREAM_BATCH_CAP, |b| (b / 4).clamp(1, STREAM_BATCH_CAP))
    }
}

#[pymethods]
impl PyFrame {
    /// Writes the Arrow C stream in `capsule` (from `__arrow_c_stream__`) as a new frame,
    /// batch by batch.
    #[staticmethod]
    fn from_stream(
        py: Python<'_>,
        env: &PyFrameEnv,
        capsule: &Bound<'_, PyCapsule>,
    ) -> PyResult<Self> {
        let reader = import_stream(capsule)?;
        let env = env.inner.clone();
        detach(py, move || {
            let mut writer = FrameWriter::with_arrow_schema(&env, &reader.schema())
                .map_err(frame_err)?
                .coalescing();
            for batch in reader {
                writer
                    .push_batch(&batch.map_err(arrow_err)?)
                    .map_err(frame_err)?;
            }
            writer.finish().map(PyFrame::wrap).map_err(frame_err)
        })
    }

    /// Opens a frame from its metadata JSON (nothing is read).
    #[staticmethod]
    fn open(env: &PyFrameEnv, meta_json: &str) -> PyResult<Self> {
        RemoteFrame::from_json(&env.inner, meta_json)
            .map(PyFrame::wrap)
            .map_err(frame_err)
    }

    /// The same frame in another environment (its budget and counters apply to the
    /// kernels run on the result; the data must be reachable from it).
    fn with_env(&self, env: &PyFrameEnv) -> Self {
        PyFrame::wrap(self.inner.with_env(&env.inner))
    }

    /// The metadata as JSON: all another element needs to open the frame.
    fn meta_json(&self) -> PyResult<String> {
        self.inner.to_json().map_err(frame_err)
    }

    /// Number of rows.
    #[getter]
    fn rows(&self) -> usize {
        self.inner.rows()
    }

    /// Whether the frame was freed (through this handle or another handle of it).
    #[getter]
    fn freed(&self) -> bool {
        self.inner.is_freed()
    }

    /// How errors name the frame: its seal's nonce, rows, chunks and seal location.
    #[getter]
    fn label(&self) -> String {
        self.inner.label()
    }

    /// Number of stored chunks.
    #[getter]
    fn chunk_count(&self) -> usize {
        self.inner.chunk_count()
    }

    /// Bytes of the columns in local memory once read.
    #[getter]
    fn data_bytes(&self) -> u64 {
        self.inner.data_bytes()
    }

    /// Bytes of the columns as stored in the memory elements (integers, dates and
    /// decimals of a small range are packed).
    #[getter]
    fn stored_bytes(&self) -> u64 {
        self.inner.stored_bytes()
    }

    /// Column names in order.
    #[getter]
    fn columns(&self) -> Vec<String> {
        self.inner.column_names()
    }

    /// (name, type) pairs; types as `int64`, `string`, `decimal(7,2)`, `date`, ...
    fn schema(&self) -> Vec<(String, String)> {
        self.inner
            .meta()
            .schema
            .iter()
            .map(|c| (c.name.clone(), c.dtype.to_string()))
            .collect()
    }

    /// A lazy Arrow C stream of the (named) columns: batches are read from memory
    /// elements as the consumer asks for them.
    #[pyo3(signature = (columns=None))]
    fn stream<'py>(
        &self,
        py: Python<'py>,
        columns: Option<Vec<String>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let cols = self.column_list(columns)?;
        let schema = self.inner.arrow_schema_of(&cols).map_err(frame_err)?;
        let names: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
        let batches = self
            .inner
            .record_batches(Some(names.as_slice()), self.batch_bytes())
            .map_err(frame_err)?;
        let reader = FrameReader {
            schema,
            batches,
            pending: VecDeque::new(),
        };
        export_stream(py, Box::new(reader))
    }

    /// Reads the (named) columns now, with the GIL released, and returns them as an
    /// Arrow C stream over local memory.
    #[pyo3(signature = (columns=None))]
    fn read<'py>(
        &self,
        py: Python<'py>,
        columns: Option<Vec<String>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let cols = self.column_list(columns)?;
        let schema = self.inner.arrow_schema_of(&cols).map_err(frame_err)?;
        let names: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
        let frame = self.inner.clone();
        let batches = detach(py, move || {
            frame.select_record_batches(&names).map_err(frame_err)
        })?;
        export_batches(py, schema, batches)
    }

    /// Rows where the predicate (expression JSON) is true.
    fn filter(&self, py: Python<'_>, predicate: &str) -> PyResult<Self> {
        let e = expr_json::from_json(predicate, &self.expr_schema()?).map_err(expr_err)?;
        let f = self.inner.clone();
        detach(py, move || {
            f.filter(e).map(PyFrame::wrap).map_err(frame_err)
        })
    }

    /// The expressions (JSON list) as the new columns.
    fn select(&self, py: Python<'_>, exprs: &str) -> PyResult<Self> {
        let es = expr_json::list_from_json(exprs, &self.expr_schema()?).map_err(expr_err)?;
        let f = self.inner.clone();
        detach(py, move || {
            f.select(es).map(PyFrame::wrap).map_err(frame_err)
        })
    }

    /// All columns plus (or replaced by) the expressions (JSON list).
    fn with_columns(&self, py: Python<'_>, exprs: &str) -> PyResult<Self> {
        let es = expr_json::list_from_json(exprs, &self.expr_schema()?).map_err(expr_err)?;
        let f = self.inner.clone();
        detach(py, move || {
            f.with_columns(es).map(PyFrame::wrap).map_err(frame_err)
        })
    }

    /// Joins with `other` on `left_on` = `right_on`; `how` in inner, left, semi, anti.
    fn join(
        &self,
        py: Python<'_>,
        other: &PyFrame,
        left_on: Vec<String>,
        right_on: Vec<String>,
        how: &str,
    ) -> PyResult<Self> {
        let how = join_type(how)?;
        let l = self.inner.clone();
        let r = other.inner.clone();
        detach(py, move || {
            l.join(&r, &left_on, &right_on, how)
                .map(PyFrame::wrap)
                .map_err(frame_err)
        })
    }

    /// Groups by `keys` and evaluates the aggregations (JSON list).
    fn group_by(&self, py: Python<'_>, keys: Vec<String>, aggs: &str) -> PyResult<Self> {
        if keys.is_empty() {
            return Err(PyValueError::new_err(
                "group_by needs at least one key column",
            ));
        }
        let es = expr_json::list_from_json(aggs, &self.expr_schema()?).map_err(expr_err)?;
        let f = self.inner.clone();
        detach(py, move || {
            f.group_by(&keys, es).map(PyFrame::wrap).map_err(frame_err)
        })
    }

    /// Sorts by the columns `by`; with `limit`, keeps the first `limit` rows (a top-k
    /// that streams through the budget).
    #[pyo3(signature = (by, descending, nulls_last=false, limit=None))]
    fn sort(
        &self,
        py: Python<'_>,
        by: Vec<String>,
        descending: Vec<bool>,
        nulls_last: bool,
        limit: Option<usize>,
    ) -> PyResult<Self> {
        if by.is_empty() {
            return Err(PyValueError::new_err("sort needs at least one column"));
        }
        if descending.len() != by.len() {
            return Err(PyValueError::new_err(format!(
                "descending has {} entries for {} sort columns",
                descending.len(),
                by.len()
            )));
        }
        // As Polars: nulls first unless `nulls_last`, in either direction; ties keep
        // the frame's order.
        let keys: Vec<SortExpr> = by
            .iter()
            .zip(descending)
            .map(|(name, desc)| ident(name).sort(!desc, !nulls_last))
            .collect();
        let f = self.inner.clone();
        detach(py, move || {
            match limit {
                Some(n) => f.sort_limit(keys, n),
                None => f.sort(keys),
            }
            .map(PyFrame::wrap)
            .map_err(frame_err)
        })
    }

    /// Distinct rows (over `subset`, all columns if None).
    #[pyo3(signature = (subset=None))]
    fn distinct(&self, py: Python<'_>, subset: Option<Vec<String>>) -> PyResult<Self> {
        let f = self.inner.clone();
        detach(py, move || {
            f.distinct(subset.as_deref())
                .map(PyFrame::wrap)
                .map_err(frame_err)
        })
    }

    /// The first `n` rows.
    fn limit(&self, py: Python<'_>, n: usize) -> PyResult<Self> {
        let f = self.inner.clone();
        detach(py, move || f.limit(n).map(PyFrame::wrap).map_err(frame_err))
    }

    /// Gives the frame's remote memory back, zeroing its seal first; every later use of
    /// any handle of it (freeing again included) raises `FreedFrameError`, and its
    /// metadata no longer opens (`StaleFrameError`).
    fn free(&self, py: Python<'_>) -> PyResult<()> {
        let f = self.inner.clone();
        detach(py, move || f.free().map_err(frame_err))
    }
}
