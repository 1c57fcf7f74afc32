//! Task processes: a query run distributed
//! ([`QuerySession::run_distributed`]) with every task of every stage in a child
//! process of this binary (`tpcds-main stage task`), against the same memory servers
//! over tcp. A task process reads its [`TaskSpec`] (JSON) on stdin, runs it over a
//! registry of its own confined to the task's memory slot, and prints its
//! [`TaskOutput`] (JSON) on stdout; only that metadata passes through the driver.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::compute::concat_batches;
use scad_remote_frame::{
    run_task, Error as FrameError, QuerySession, QueryStats, TaskOutput, TaskRecord, TaskRunner,
    TaskSpec,
};

use crate::compare::compare_values;
use crate::data::DataSet;
use crate::engine::{query_sql, QueryRun};
use crate::remote::{Cluster, RemoteError};

/// Runs tasks as child processes: `program` with `args` (e.g. `stage task --servers
/// ...`), the spec on stdin.
#[derive(Debug, Clone)]
pub struct ProcessRunner {
    /// The executable (e.g. this binary).
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
}

impl TaskRunner for ProcessRunner {
    fn run(&self, spec: &TaskSpec) -> scad_remote_frame::Result<TaskOutput> {
        let failed = |message: String| FrameError::TaskFailed {
            stage: spec.stage,
            task: spec.task,
            message,
        };
        let json = serde_json::to_string(spec).map_err(|e| failed(e.to_string()))?;
        let mut child = Command::new(&self.program)
            .args(&self.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| failed(format!("starting {}: {e}", self.program.display())))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(json.as_bytes())
                .map_err(|e| failed(format!("handing the spec over: {e}")))?;
        }
        let out = child
            .wait_with_output()
            .map_err(|e| failed(format!("waiting for the task process: {e}")))?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            return Err(failed(format!(
                "task process {}: {}",
                out.status,
                stderr.trim()
            )));
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        stdout
            .lines()
            .rev()
            .find_map(|l| serde_json::from_str(l).ok())
            .ok_or_else(|| failed(format!("the task process printed no output: {stdout}")))
    }
}

/// A task process: runs the spec `spec` (JSON) over the memory servers `servers` and
/// returns its output as JSON.
///
/// # Errors
/// Connecting to the servers; a malformed spec; the task's own errors.
pub fn run_task_here(servers: &[String], spec: &str) -> Result<String, RemoteError> {
    let spec: TaskSpec = serde_json::from_str(spec).map_err(|source| RemoteError::BadJson {
        context: "the task spec on stdin".into(),
        source,
    })?;
    let cluster = Cluster::connect_tcp(servers)?;
    let out = run_task(Arc::clone(cluster.env().elements()), &spec).map_err(|source| {
        RemoteError::Frame {
            context: format!("stage {} task {}", spec.stage, spec.task),
            source,
        }
    })?;
    serde_json::to_string(&out).map_err(|source| RemoteError::BadJson {
        context: "the task output".into(),
        source,
    })
}

/// Runs `query` distributed from `session` (its tables, budget and partitions), every
/// task on `runner`, at most `workers` at once, and compares the answer with
/// DuckDB's. Returns the run (its stats summed over the tasks; the peak: the highest
/// task's) and the task log.
///
/// # Errors
/// Only a missing query text or reference; a failing task is reported in
/// [`QueryRun::error`].
pub fn run_query_distributed(
    session: &QuerySession,
    set: &DataSet,
    query: &str,
    runner: &dyn TaskRunner,
    workers: usize,
) -> Result<(QueryRun, Vec<TaskRecord>), RemoteError> {
    let sql = query_sql(set, query)?;
    let reference = set.reference(query)?;
    let start = Instant::now();
    let outcome = session.run_distributed(&sql, runner, workers);
    let secs = start.elapsed().as_secs_f64();
    Ok(match outcome {
        Err(e) => (
            QueryRun {
                query: query.to_string(),
                secs,
                stats: None,
                handoff_bytes: 0,
                error: Some(e.to_string()),
            },
            Vec::new(),
        ),
        Ok(out) => {
            let checked = concat_batches(&out.schema, &out.batches)
                .map_err(|e| e.to_string())
                .and_then(|answer| {
                    compare_values(&answer, &reference, out.ordered).map_err(|e| e.to_string())
                });
            let tasks = out.tasks.iter().map(|t| &t.output);
            let stats = QueryStats {
                elapsed: out.elapsed,
                rows: out.rows(),
                peak_local_bytes: tasks.clone().map(|t| t.peak_local_bytes).max().unwrap_or(0),
                budget: session.env().budget(),
                scan_bytes: tasks.clone().map(|t| t.scan_bytes).sum(),
                spill_files: tasks.clone().map(|t| t.spill_files).sum(),
                spill_bytes_written: tasks.clone().map(|t| t.spill_bytes_written).sum(),
                spill_bytes_read: tasks.map(|t| t.spill_bytes_read).sum(),
            };
            (
                QueryRun {
                    query: query.to_string(),
                    secs,
                    stats: Some(stats),
                    handoff_bytes: out.shuffle_bytes,
                    error: checked.err(),
                },
                out.tasks,
            )
        }
    })
}
