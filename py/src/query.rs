//! `QuerySession` and `QueryResult`: SQL over frames (the query engine of
//! scad-remote-frame) for Python; `scad.QuerySession`, `scad.sql` and `scad.explain`
//! wrap them. `scad.sql` and `scad.explain` run in one session per env
//! ([`EnvSession`]), with the tables of the call registered for that call only.
//!
//! Registering, planning and running release the GIL. An answer stays in local memory
//! as Arrow record batches; `__arrow_c_stream__` hands them to PyArrow or Polars
//! without copying, `to_frame` writes them to memory elements. Errors: see
//! [`crate::frame::frame_err`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict};
use scad_remote_frame::{Error as FrameError, FrameEnv, QueryOutput, QuerySession, RemoteFrame};

use crate::arrow_ffi::export_batches;
use crate::errors::{detach, FreedFrameError, StaleFrameError};
use crate::frame::{frame_err, PyFrame, PyFrameEnv};

/// Sessions [`EnvSession`]s have started in this process.
static ENV_SESSIONS_STARTED: AtomicU64 = AtomicU64::new(0);

/// The session `scad.sql` and `scad.explain` run in for one env: started by the first
/// call and kept with the env, so a call starts no session (and the process's query
/// runtime is shared by all sessions anyway). A call holds it throughout: it
/// registers its tables, runs, and deregisters them, so the calls on one env run one
/// at a time (as the queries of one session do, within one budget) and each sees
/// only its own tables.
#[derive(Default)]
pub struct EnvSession(Mutex<Option<QuerySession>>);

impl EnvSession {
    /// Runs `f` in the env's session with exactly `tables` registered.
    fn with<T>(
        &self,
        env: &FrameEnv,
        tables: &[(String, RemoteFrame)],
        f: impl FnOnce(&QuerySession) -> scad_remote_frame::Result<T>,
    ) -> PyResult<T> {
        let mut slot = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let session = match slot.take() {
            Some(s) => s,
            None => {
                let s = QuerySession::new(env).map_err(frame_err)?;
                ENV_SESSIONS_STARTED.fetch_add(1, Ordering::Relaxed);
                s
            }
        };
        let session = slot.insert(session);
        // A call that failed half-way (a panic caught at the boundary) may have left
        // its tables behind.
        deregister_all(session).map_err(frame_err)?;
        let result = tables
            .iter()
            .try_for_each(|(name, frame)| {
                session
                    .register(name, frame)
                    .map_err(|e| registration_err(name, e))
            })
            .and_then(|()| f(session).map_err(frame_err));
        let cleared = deregister_all(session).map_err(frame_err);
        let out = result?;
        cleared?;
        Ok(out)
    }
}

/// A table that could not be registered: a freed or stale frame's error names the
/// table it was given as.
fn registration_err(name: &str, e: FrameError) -> PyErr {
    match e {
        FrameError::Freed { .. } => FreedFrameError::new_err(format!("table '{name}': {e}")),
        FrameError::Stale { .. } => StaleFrameError::new_err(format!("table '{name}': {e}")),
        other => frame_err(other),
    }
}

fn deregister_all(session: &QuerySession) -> scad_remote_frame::Result<()> {
    for name in session.table_names() {
        session.deregister(&name)?;
    }
    Ok(())
}

/// The frames of a `scad.sql` call's tables, by name.
fn call_tables(tables: BTreeMap<String, PyRef<'_, PyFrame>>) -> Vec<(String, RemoteFrame)> {
    tables
        .into_iter()
        .map(|(name, frame)| (name, frame.inner.clone()))
        .collect()
}

/// Runs `f` in `env`'s session with `tables` (name -> frame) registered, without the GIL.
fn in_env_session<T: Send>(
    py: Python<'_>,
    env: &PyFrameEnv,
    tables: BTreeMap<String, PyRef<'_, PyFrame>>,
    f: impl FnOnce(&QuerySession) -> scad_remote_frame::Result<T> + Send,
) -> PyResult<T> {
    let tables = call_tables(tables);
    detach(py, || env.sql_session.with(&env.inner, &tables, f))
}

/// Runs `query` over `tables` (name -> frame) in `env`'s session (`scad.sql`).
#[pyfunction]
pub fn sql_in_env(
    py: Python<'_>,
    env: &PyFrameEnv,
    query: &str,
    tables: BTreeMap<String, PyRef<'_, PyFrame>>,
) -> PyResult<PyQueryResult> {
    let output = in_env_session(py, env, tables, |s| s.sql(query))?;
    Ok(PyQueryResult {
        output,
        env: env.inner.clone(),
    })
}

/// The physical plan of `query` over `tables` in `env`'s session (`scad.explain`).
#[pyfunction]
pub fn explain_in_env(
    py: Python<'_>,
    env: &PyFrameEnv,
    query: &str,
    tables: BTreeMap<String, PyRef<'_, PyFrame>>,
) -> PyResult<String> {
    in_env_session(py, env, tables, |s| s.explain(query))
}

/// How many sessions `scad.sql` and `scad.explain` have started in this process (one
/// per env they ran in); for tests.
#[pyfunction]
pub fn env_sessions_started() -> u64 {
    ENV_SESSIONS_STARTED.load(Ordering::Relaxed)
}

/// Tables (frames registered by name) and one local memory budget (the env's) that
/// the session's queries share; they spill to the env's memory elements.
#[pyclass(module = "scad._native", name = "QuerySession", frozen)]
pub struct PyQuerySession {
    pub(crate) inner: QuerySession,
}

#[pymethods]
impl PyQuerySession {
    /// A session whose queries stay within `env`'s budget and spill to its memory
    /// elements; `partitions` pins the number of partitions plans use (None: as many
    /// as the budget and this machine's cores give). Processes that run stages of one
    /// query must plan it with the same partitions.
    #[new]
    #[pyo3(signature = (env, partitions=None))]
    fn new(py: Python<'_>, env: &PyFrameEnv, partitions: Option<usize>) -> PyResult<Self> {
        if partitions == Some(0) {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "partitions must be at least 1",
            ));
        }
        let env = env.inner.clone();
        detach(py, move || {
            match partitions {
                Some(p) => QuerySession::with_partitions(&env, p),
                None => QuerySession::new(&env),
            }
            .map(|inner| PyQuerySession { inner })
            .map_err(frame_err)
        })
    }

    /// Makes `frame` queryable as table `name` (replacing a table of that name). A freed
    /// or stale frame is refused, the error naming the table.
    fn register(&self, py: Python<'_>, name: &str, frame: &PyFrame) -> PyResult<()> {
        let frame = frame.inner.clone();
        detach(py, || {
            self.inner
                .register(name, &frame)
                .map_err(|e| registration_err(name, e))
        })
    }

    /// Names of the registered tables, sorted.
    fn tables(&self) -> Vec<String> {
        self.inner.table_names()
    }

    /// Runs one read-only SQL statement (a query) and keeps its answer in local memory.
    fn sql(&self, py: Python<'_>, query: &str) -> PyResult<PyQueryResult> {
        detach(py, || {
            self.inner
                .sql(query)
                .map(|output| PyQueryResult {
                    output,
                    env: self.inner.env().clone(),
                })
                .map_err(frame_err)
        })
    }

    /// The physical plan of `query` as text (EXPLAIN), without running it.
    fn explain(&self, py: Python<'_>, query: &str) -> PyResult<String> {
        detach(py, || self.inner.explain(query).map_err(frame_err))
    }

    /// The stages of `query` (see `QuerySession::stages` in scad-remote-frame) as JSON:
    /// `{"stages": [{"id", "inputs", "operator", "partitions", "tasks", "columns"}],
    /// "ordered"}`.
    fn stages(&self, py: Python<'_>, query: &str) -> PyResult<String> {
        detach(py, || {
            let plan = self.inner.stages(query).map_err(frame_err)?;
            serde_json::to_string(&plan)
                .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))
        })
    }

    /// Runs every task of stage `stage` of `query` here from its inputs' outputs
    /// (`inputs`: stage number -> for each partition of its output, the frame metadata
    /// JSON of the frames that make it up) and writes its output to memory elements;
    /// returns the output in the same shape and what the stage did (as
    /// `QueryResult.stats`, plus `bytes_written`).
    fn run_stage<'py>(
        &self,
        py: Python<'py>,
        query: &str,
        stage: usize,
        inputs: StageMetas,
    ) -> PyResult<(Vec<Vec<String>>, Bound<'py, PyDict>)> {
        self.run(py, query, stage, None, inputs)
    }

    /// Runs task `task` of stage `stage` of `query` (the stage's tasks need nothing from
    /// each other: run them in any processes, at the same time); returns the frames it
    /// wrote for each partition of the stage's output and what it did. The stage's
    /// output is its tasks' outputs concatenated partition by partition.
    fn run_stage_task<'py>(
        &self,
        py: Python<'py>,
        query: &str,
        stage: usize,
        task: usize,
        inputs: StageMetas,
    ) -> PyResult<(Vec<Vec<String>>, Bound<'py, PyDict>)> {
        self.run(py, query, stage, Some(task), inputs)
    }

    /// Bytes of remote memory spill files hold now (0 between queries).
    #[getter]
    fn spill_bytes_held(&self) -> u64 {
        self.inner.spill_bytes_held()
    }

    /// The session's local memory budget in bytes (None: unlimited).
    #[getter]
    fn budget(&self) -> Option<u64> {
        self.inner.env().budget().limit()
    }
}

/// Stage number -> partition -> frame metadata JSON.
type StageMetas = std::collections::BTreeMap<usize, Vec<Vec<String>>>;

impl PyQuerySession {
    /// Runs task `task` of stage `stage` (every task: None).
    fn run<'py>(
        &self,
        py: Python<'py>,
        query: &str,
        stage: usize,
        task: Option<usize>,
        inputs: StageMetas,
    ) -> PyResult<(Vec<Vec<String>>, Bound<'py, PyDict>)> {
        let env = self.inner.env().clone();
        let (metas, stats, written) = detach(py, || {
            let mut frames = std::collections::BTreeMap::new();
            for (id, parts) in &inputs {
                let opened = parts
                    .iter()
                    .map(|metas| {
                        metas
                            .iter()
                            .map(|m| scad_remote_frame::RemoteFrame::from_json(&env, m))
                            .collect::<scad_remote_frame::Result<Vec<_>>>()
                    })
                    .collect::<scad_remote_frame::Result<Vec<_>>>()
                    .map_err(frame_err)?;
                frames.insert(*id, opened);
            }
            let out = match task {
                None => self.inner.run_stage(query, stage, &frames),
                Some(t) => self.inner.run_stage_task(query, stage, t, &frames),
            }
            .map_err(frame_err)?;
            let metas = out
                .frames
                .iter()
                .map(|part| part.iter().map(|f| f.to_json()).collect())
                .collect::<scad_remote_frame::Result<Vec<Vec<String>>>>()
                .map_err(frame_err)?;
            Ok::<_, PyErr>((metas, out.stats, out.bytes_written))
        })?;
        let d = PyDict::new(py);
        d.set_item("elapsed_s", stats.elapsed.as_secs_f64())?;
        d.set_item("rows", stats.rows)?;
        d.set_item("peak_local_bytes", stats.peak_local_bytes)?;
        d.set_item("budget", stats.budget.limit())?;
        d.set_item("scan_bytes", stats.scan_bytes)?;
        d.set_item("spill_files", stats.spill_files)?;
        d.set_item("bytes_written", written)?;
        Ok((metas, d))
    }
}

/// The answer of a query (Arrow record batches in local memory) and how it was
/// computed.
#[pyclass(module = "scad._native", name = "QueryResult", frozen)]
pub struct PyQueryResult {
    output: QueryOutput,
    /// The session's env: where `to_frame` writes by default.
    env: scad_remote_frame::FrameEnv,
}

#[pymethods]
impl PyQueryResult {
    /// Rows of the answer.
    #[getter]
    fn rows(&self) -> usize {
        self.output.rows()
    }

    fn __len__(&self) -> usize {
        self.output.rows()
    }

    /// Whether the query orders its answer (a top-level ORDER BY); otherwise rows come
    /// in no particular order.
    #[getter]
    fn ordered(&self) -> bool {
        self.output.ordered()
    }

    /// Column names in order.
    #[getter]
    fn columns(&self) -> Vec<String> {
        self.output
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect()
    }

    /// (name, Arrow type) pairs, types as arrow-rs prints them (`Int64`, `Utf8View`,
    /// `Decimal128(17, 2)`, ...).
    fn schema(&self) -> Vec<(String, String)> {
        self.output
            .schema()
            .fields()
            .iter()
            .map(|f| (f.name().clone(), f.data_type().to_string()))
            .collect()
    }

    /// What the query did: elapsed_s, rows, peak_local_bytes, budget (None:
    /// unlimited), scan_bytes, spill_files, spill_bytes_written, spill_bytes_read,
    /// bytes_moved (scanned + spilled + read back).
    #[getter]
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.output.stats();
        let d = PyDict::new(py);
        d.set_item("elapsed_s", s.elapsed.as_secs_f64())?;
        d.set_item("rows", s.rows)?;
        d.set_item("peak_local_bytes", s.peak_local_bytes)?;
        d.set_item("budget", s.budget.limit())?;
        d.set_item("scan_bytes", s.scan_bytes)?;
        d.set_item("spill_files", s.spill_files)?;
        d.set_item("spill_bytes_written", s.spill_bytes_written)?;
        d.set_item("spill_bytes_read", s.spill_bytes_read)?;
        d.set_item("bytes_moved", s.bytes_moved())?;
        Ok(d)
    }

    /// The physical plan with each operator's metrics from this run (EXPLAIN ANALYZE).
    fn explain_analyze(&self) -> String {
        self.output.explain_analyze()
    }

    /// Arrow PyCapsule interface: the answer's batches as an Arrow C stream, without
    /// copying (the consumer shares the buffers). `requested_schema` is not honoured;
    /// consumers check the schema. Each call makes a new stream.
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_stream__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let _ = requested_schema;
        export_batches(
            py,
            self.output.schema().clone(),
            self.output.batches().to_vec(),
        )
    }

    /// Writes the answer to memory elements as a new frame, under `env` (the session's
    /// if None).
    #[pyo3(signature = (env=None))]
    fn to_frame(&self, py: Python<'_>, env: Option<&PyFrameEnv>) -> PyResult<PyFrame> {
        let env = env.map_or_else(|| self.env.clone(), |e| e.inner.clone());
        detach(py, || {
            self.output
                .to_remote_frame(&env)
                .map(PyFrame::wrap)
                .map_err(frame_err)
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "QueryResult({} rows; {})",
            self.output.rows(),
            self.schema()
                .iter()
                .map(|(n, t)| format!("{n}: {t}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}
