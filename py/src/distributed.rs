//! Distributed queries for Python: `DistributedQuery` (the driver's side of
//! `scad_remote_frame::DistributedQuery`: task specs out, task outputs in, the answer
//! at the end) and `run_task` (a worker's side: one task spec over a store's memory
//! elements). `scad.DistributedSession` drives them on Ray. Specs and outputs travel
//! as JSON; the rows stay in memory elements.

use std::sync::{Mutex, PoisonError};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict};
use scad_remote_frame::{DistributedQuery, Error as FrameError, TaskOutput, TaskSpec};

use crate::arrow_ffi::export_batches;
use crate::errors::detach;
use crate::frame::frame_err;
use crate::pool::PyStore;
use crate::query::PyQuerySession;

fn json_err(what: &str, e: serde_json::Error) -> PyErr {
    PyValueError::new_err(format!("{what}: {e}"))
}

/// A query being run as tasks: `next_task()` gives the spec (JSON) of a task ready
/// to run, `task_done(output)` / `task_failed(stage, task, message)` report its end,
/// `finish()` returns the answer once every task is done. Holds the memory its tasks
/// allocate in until finished or dropped.
#[pyclass(module = "scad._native", name = "DistributedQuery", frozen)]
pub struct PyDistributedQuery {
    inner: Mutex<Option<DistributedQuery>>,
}

impl PyDistributedQuery {
    fn with<T>(&self, f: impl FnOnce(&mut DistributedQuery) -> PyResult<T>) -> PyResult<T> {
        let mut guard = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        match guard.as_mut() {
            Some(q) => f(q),
            None => Err(PyValueError::new_err("the query is finished")),
        }
    }
}

#[pymethods]
impl PyDistributedQuery {
    /// Plans `query` in `session` (its tables, budget and partitions) and reserves
    /// memory for its tasks: a slot of `slot_bytes` per task in every memory element
    /// (None: the free space above the session's allocations, shared out).
    #[new]
    #[pyo3(signature = (session, query, slot_bytes=None))]
    fn new(
        py: Python<'_>,
        session: &PyQuerySession,
        query: &str,
        slot_bytes: Option<u64>,
    ) -> PyResult<Self> {
        let q = detach(py, || {
            DistributedQuery::new(&session.inner, query, slot_bytes).map_err(frame_err)
        })?;
        Ok(PyDistributedQuery {
            inner: Mutex::new(Some(q)),
        })
    }

    /// The stages as JSON (as `QuerySession.stages`).
    fn plan(&self) -> PyResult<String> {
        self.with(|q| serde_json::to_string(q.plan()).map_err(|e| json_err("the stage plan", e)))
    }

    /// A task ready to run: its stage, its number and its spec as JSON (it counts as
    /// running from now on); None while none is ready or after a failure. Without
    /// `with_tables` the spec leaves the tables out (the same for every task: hand
    /// them to the workers once, `tables()`, and to `run_task`).
    #[pyo3(signature = (with_tables=true))]
    fn next_task(&self, with_tables: bool) -> PyResult<Option<(usize, usize, String)>> {
        self.with(|q| {
            q.next_task()
                .map_err(frame_err)?
                .map(|mut spec| {
                    if !with_tables {
                        spec.tables.clear();
                    }
                    serde_json::to_string(&spec)
                        .map(|json| (spec.stage, spec.task, json))
                        .map_err(|e| json_err("a task spec", e))
                })
                .transpose()
        })
    }

    /// The tables every task reads, as JSON (name -> frame metadata JSON).
    fn tables(&self) -> PyResult<String> {
        self.with(|q| serde_json::to_string(q.tables()).map_err(|e| json_err("the tables", e)))
    }

    /// Seconds since the query started.
    fn clock(&self) -> PyResult<f64> {
        self.with(|q| Ok(q.clock()))
    }

    /// Tasks handed out and not reported yet.
    #[getter]
    fn running(&self) -> PyResult<usize> {
        self.with(|q| Ok(q.running()))
    }

    /// Whether no task runs and none will (all done, or a failure reported).
    #[getter]
    fn is_over(&self) -> PyResult<bool> {
        self.with(|q| Ok(q.is_over()))
    }

    /// Reports a task's output (JSON, as `run_task` returned it), handed out at
    /// `started_s` on `clock()`.
    fn task_done(&self, output: &str, started_s: f64) -> PyResult<()> {
        let output: TaskOutput =
            serde_json::from_str(output).map_err(|e| json_err("a task output", e))?;
        self.with(|q| q.task_done(output, started_s).map_err(frame_err))
    }

    /// Reports that task `task` of stage `stage` failed with `message`: no task is
    /// handed out after; `finish()` raises the first failure.
    fn task_failed(&self, stage: usize, task: usize, message: String) -> PyResult<()> {
        self.with(|q| {
            q.task_failed(
                stage,
                task,
                FrameError::TaskFailed {
                    stage,
                    task,
                    message,
                },
            );
            Ok(())
        })
    }

    /// The answer (an Arrow stream source) and what the query did (`ordered`,
    /// `stages`, `shuffle_bytes`, `elapsed_s`, `tasks`: the task log as JSON); frees
    /// the query's memory. Raises the first task failure.
    fn finish<'py>(&self, py: Python<'py>) -> PyResult<(PyAnswer, Bound<'py, PyDict>)> {
        let query = self
            .inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .ok_or_else(|| PyValueError::new_err("the query is finished"))?;
        let out = detach(py, move || query.finish().map_err(frame_err))?;
        let d = PyDict::new(py);
        d.set_item("ordered", out.ordered)?;
        d.set_item("stages", out.stages)?;
        d.set_item("shuffle_bytes", out.shuffle_bytes)?;
        d.set_item("elapsed_s", out.elapsed.as_secs_f64())?;
        d.set_item(
            "tasks",
            serde_json::to_string(&out.tasks).map_err(|e| json_err("the task log", e))?,
        )?;
        Ok((
            PyAnswer {
                schema: out.schema,
                batches: out.batches,
            },
            d,
        ))
    }

    /// Drops the query without an answer: frees its memory (the tasks still running
    /// must not write any more: stop them first).
    fn abandon(&self) {
        drop(
            self.inner
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
    }
}

/// A distributed query's answer: Arrow record batches in local memory, an Arrow
/// stream source (`pyarrow.table(answer)`).
#[pyclass(module = "scad._native", name = "DistributedAnswer", frozen)]
pub struct PyAnswer {
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
}

#[pymethods]
impl PyAnswer {
    /// Rows of the answer.
    #[getter]
    fn rows(&self) -> usize {
        self.batches.iter().map(RecordBatch::num_rows).sum()
    }

    /// The Arrow C stream interface (PyArrow, Polars).
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_stream__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let _ = requested_schema;
        export_batches(py, self.schema.clone(), self.batches.clone())
    }
}

/// Runs one task of a distributed query (`spec`: JSON from
/// `DistributedQuery.next_task`; `tables`: `DistributedQuery.tables()` when the spec
/// left them out) over the memory elements of `store` (a store of this worker alone:
/// its allocators are confined to the task's slot); returns the task's output as JSON
/// for `DistributedQuery.task_done`.
#[pyfunction]
#[pyo3(signature = (store, spec, tables=None))]
pub fn run_task(
    py: Python<'_>,
    store: &PyStore,
    spec: &str,
    tables: Option<&str>,
) -> PyResult<String> {
    let mut spec: TaskSpec = serde_json::from_str(spec).map_err(|e| json_err("a task spec", e))?;
    if let Some(tables) = tables {
        spec.tables = serde_json::from_str(tables).map_err(|e| json_err("the tables", e))?;
    }
    let elements = std::sync::Arc::clone(store.inner.elements());
    detach(py, move || {
        let out = scad_remote_frame::run_task(elements, &spec).map_err(frame_err)?;
        serde_json::to_string(&out).map_err(|e| json_err("a task output", e))
    })
}
