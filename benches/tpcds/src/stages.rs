//! Stage-per-process mode: every stage of a query's plan
//! ([`scad_remote_frame::QuerySession::stages`]) runs as its own process — a compute
//! element — over the same memory servers, reading its inputs' outputs from their
//! handoffs and handing its own on.
//!
//! A run directory holds what crosses process boundaries:
//! * `tables.json`: the base tables ([`TableHandoffs`]), written once by
//!   [`load_run_dir`];
//! * `<query>/stage-<k>.json`: stage `k`'s output, for each of its partitions the
//!   [`Handoff`]s (sealed frames' metadata) that make it up, written by
//!   [`run_stage_here`].
//!
//! A stage process moves its allocators past every frame handed on in the directory
//! before it writes, so it overwrites none; [`run_query_in_processes`] runs a query's
//! stages in order as child processes, checks the answer and frees the stage outputs
//! (their files go, so the next query's stages reuse the memory).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use std::sync::Arc;

use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use scad_remote_frame::{Budget, FrameEnv, QueryStats, RemoteFrame, StagePlan};
use serde::{Deserialize, Serialize};

use crate::compare::compare_values;
use crate::data::DataSet;
use crate::engine::{query_sql, session, QueryRun};
use crate::remote::{load_tables, Cluster, Handoff, RemoteError, TableHandoffs};

/// What one stage process did, printed by it as one JSON line.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StageReport {
    /// Query name.
    pub query: String,
    /// Stage number.
    pub stage: usize,
    /// Rows of its output.
    pub rows: usize,
    /// Wall time in the process (planning, running, writing the output).
    pub secs: f64,
    /// The most local memory its operators had reserved at once.
    pub peak_local_bytes: u64,
    /// Its budget.
    pub budget: u64,
    /// Bytes read from memory elements (tables and input stages).
    pub scan_bytes: u64,
    /// Spill files written.
    pub spill_files: u64,
    /// Bytes spilled to memory elements.
    pub spill_bytes_written: u64,
    /// Bytes of spill files read back.
    pub spill_bytes_read: u64,
    /// Bytes of its output written to memory elements.
    pub output_bytes: u64,
}

/// The cluster's env with a budget of `budget` bytes.
fn budget_env(cluster: &Cluster, budget: u64) -> Result<FrameEnv, RemoteError> {
    let budget = Budget::bytes(budget).map_err(|source| RemoteError::Frame {
        context: "the stages' budget".into(),
        source,
    })?;
    Ok(cluster.env().with_budget(budget))
}

fn read(path: &Path) -> Result<String, RemoteError> {
    std::fs::read_to_string(path)
        .map_err(|e| RemoteError::Invalid(format!("reading {}: {e}", path.display())))
}

fn write_atomic(path: &Path, text: &str) -> Result<(), RemoteError> {
    let io = |e: std::io::Error| RemoteError::Invalid(format!("writing {}: {e}", path.display()));
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, text).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// Loads every table of `set` into the cluster and writes `DIR/tables.json`.
///
/// # Errors
/// As [`load_tables`]; writing the file.
pub fn load_run_dir(
    cluster: &Cluster,
    set: &DataSet,
    dir: &Path,
) -> Result<TableHandoffs, RemoteError> {
    let tables = load_tables(cluster, set, None)?;
    let json = serde_json::to_string(&tables).map_err(|source| RemoteError::BadJson {
        context: "serializing tables.json".into(),
        source,
    })?;
    write_atomic(&dir.join("tables.json"), &json)?;
    Ok(tables)
}

/// The tables of a run directory.
///
/// # Errors
/// [`RemoteError::Invalid`] without `tables.json`; [`RemoteError::BadJson`].
pub fn read_tables(dir: &Path) -> Result<TableHandoffs, RemoteError> {
    let path = dir.join("tables.json");
    serde_json::from_str(&read(&path)?).map_err(|source| RemoteError::BadJson {
        context: path.display().to_string(),
        source,
    })
}

fn stage_path(dir: &Path, query: &str, stage: usize) -> PathBuf {
    dir.join(query).join(format!("stage-{stage}.json"))
}

/// The output handoffs of stage `stage` of `query` in the run directory, by partition.
///
/// # Errors
/// [`RemoteError::Invalid`] when the stage has not run; [`RemoteError::BadJson`].
pub fn read_stage(dir: &Path, query: &str, stage: usize) -> Result<Vec<Vec<Handoff>>, RemoteError> {
    let path = stage_path(dir, query, stage);
    let text = read(&path).map_err(|_| {
        RemoteError::Invalid(format!(
            "{query} stage {stage} has no output in {} (run it first)",
            dir.display()
        ))
    })?;
    let values: Vec<Vec<serde_json::Value>> =
        serde_json::from_str(&text).map_err(|source| RemoteError::BadJson {
            context: path.display().to_string(),
            source,
        })?;
    values
        .into_iter()
        .map(|part| {
            part.into_iter()
                .map(|v| Handoff::from_json(&v.to_string(), &path.display().to_string()))
                .collect()
        })
        .collect()
}

/// Every stage output handed on in the run directory (to allocate past them).
fn handed_on(dir: &Path) -> Result<Vec<Handoff>, RemoteError> {
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => {
            return Err(RemoteError::Invalid(format!(
                "listing {}: {e}",
                dir.display()
            )))
        }
    };
    for entry in entries.flatten() {
        let query_dir = entry.path();
        if !query_dir.is_dir() {
            continue;
        }
        let Ok(files) = std::fs::read_dir(&query_dir) else {
            continue;
        };
        for file in files.flatten() {
            let path = file.path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            if let Some(k) = name
                .strip_prefix("stage-")
                .and_then(|n| n.strip_suffix(".json"))
                .and_then(|n| n.parse::<usize>().ok())
            {
                let query = query_dir
                    .file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or_default();
                out.extend(read_stage(dir, query, k)?.into_iter().flatten());
            }
        }
    }
    Ok(out)
}

/// Runs stage `stage` of `query` in this process: opens the tables and the stage's
/// inputs from the run directory (checking their seals), runs it within `budget`,
/// and writes `DIR/<query>/stage-<stage>.json`.
///
/// # Errors
/// Stale or missing inputs, query errors, transport errors.
pub fn run_stage_here(
    cluster: &Cluster,
    set: &DataSet,
    dir: &Path,
    query: &str,
    stage: usize,
    budget: u64,
) -> Result<StageReport, RemoteError> {
    let start = Instant::now();
    let tables = read_tables(dir)?;
    let mut keep: Vec<Handoff> = handed_on(dir)?;
    keep.extend(tables.tables.values().cloned());
    cluster.reserve_past(&keep.iter().collect::<Vec<_>>())?;
    let env = budget_env(cluster, budget)?;
    let session = session(&env, &tables.open(cluster)?)?;
    let sql = query_sql(set, query)?;
    let frame_err = |what: String| {
        move |source| RemoteError::Frame {
            context: what,
            source,
        }
    };
    let plan = session
        .stages(&sql)
        .map_err(frame_err(format!("{query}: planning")))?;
    let this = plan.stages.get(stage).ok_or_else(|| {
        RemoteError::Invalid(format!(
            "{query} has {} stages; there is no stage {stage}",
            plan.stages.len()
        ))
    })?;
    let mut inputs = BTreeMap::new();
    for &i in &this.inputs {
        let frames = read_stage(dir, query, i)?
            .iter()
            .map(|part| {
                part.iter()
                    .map(|h| h.open(&env, &format!("{query} stage {stage}: input {i}")))
                    .collect::<Result<Vec<RemoteFrame>, _>>()
            })
            .collect::<Result<Vec<_>, _>>()?;
        inputs.insert(i, frames);
    }
    let out = session
        .run_stage(&sql, stage, &inputs)
        .map_err(frame_err(format!("{query} stage {stage}")))?;
    let handoffs: Vec<Vec<Handoff>> = out
        .frames
        .iter()
        .enumerate()
        .map(|(p, part)| {
            part.iter()
                .enumerate()
                .map(|(k, frame)| {
                    Handoff::new(&format!("{query}/stage-{stage}/part-{p}/{k}"), frame)
                })
                .collect()
        })
        .collect();
    let json = serde_json::to_string(&handoffs).map_err(|source| RemoteError::BadJson {
        context: format!("serializing {query} stage {stage}'s output"),
        source,
    })?;
    write_atomic(&stage_path(dir, query, stage), &json)?;
    let s = out.stats;
    Ok(StageReport {
        query: query.to_string(),
        stage,
        rows: s.rows,
        secs: start.elapsed().as_secs_f64(),
        peak_local_bytes: s.peak_local_bytes,
        budget,
        scan_bytes: s.scan_bytes,
        spill_files: s.spill_files,
        spill_bytes_written: s.spill_bytes_written,
        spill_bytes_read: s.spill_bytes_read,
        output_bytes: out.bytes_written,
    })
}

/// The answer of a query run stage by stage: its root stage's output, read back.
///
/// # Errors
/// Stale or missing output; transport errors.
pub fn read_answer(
    cluster: &Cluster,
    dir: &Path,
    query: &str,
    plan: &StagePlan,
) -> Result<RecordBatch, RemoteError> {
    let root = plan.stages.len().saturating_sub(1);
    let mut schema = None;
    let mut parts = Vec::new();
    for h in read_stage(dir, query, root)?.into_iter().flatten() {
        let frame = h.open(cluster.env(), &format!("{query} answer"))?;
        let read = |source| RemoteError::Frame {
            context: format!("reading {query}'s answer"),
            source,
        };
        if schema.is_none() {
            schema = Some(frame.arrow_schema().map_err(read)?);
        }
        parts.extend(frame.to_record_batches().map_err(read)?);
    }
    let schema = match schema {
        Some(s) => s,
        // No rows at all: the root's columns, as planned.
        None => Arc::new(empty_schema(plan)),
    };
    concat_batches(&schema, &parts)
        .map_err(|e| RemoteError::Invalid(format!("joining {query}'s answer partitions: {e}")))
}

/// An answer's schema when no partition has rows: the root stage's columns (as
/// planned; their types are unknown without a frame, and no rows need them).
fn empty_schema(plan: &StagePlan) -> Schema {
    let columns = plan.stages.last().map_or(&[][..], |s| &s.columns[..]);
    Schema::new(
        columns
            .iter()
            .map(|c| Field::new(c, DataType::Null, true))
            .collect::<Vec<_>>(),
    )
}

/// Frees the stage outputs of `query` and removes their files.
///
/// # Errors
/// Transport and allocator errors.
pub fn free_query(cluster: &Cluster, dir: &Path, query: &str) -> Result<(), RemoteError> {
    let query_dir = dir.join(query);
    if !query_dir.exists() {
        return Ok(());
    }
    let outputs: Vec<Handoff> = handed_on(dir)?
        .into_iter()
        .filter(|h| h.producer.starts_with(&format!("{query}/")))
        .collect();
    // This process allocated none of them: move its allocators past them first.
    cluster.reserve_past(&outputs.iter().collect::<Vec<_>>())?;
    for h in &outputs {
        h.free(cluster)?;
    }
    std::fs::remove_dir_all(&query_dir)
        .map_err(|e| RemoteError::Invalid(format!("removing {}: {e}", query_dir.display())))
}

/// How [`run_query_in_processes`] starts a stage process: `program` with `args`,
/// then `--query Q --stage K` appended.
#[derive(Debug, Clone)]
pub struct StageCommand {
    /// The executable (e.g. this binary).
    pub program: PathBuf,
    /// Arguments before the query and stage (e.g. `stage run --servers ... --dir ...`).
    pub args: Vec<String>,
}

/// Runs every stage of `query` as a child process (in order, each after its
/// inputs), reads the answer back and compares it with DuckDB's, then frees the
/// stage outputs. `cluster` must reach the same memory elements as the children.
///
/// # Errors
/// Only a missing query text or reference, or a failure to free; a failing stage
/// is reported in [`QueryRun::error`].
pub fn run_query_in_processes(
    cluster: &Cluster,
    set: &DataSet,
    dir: &Path,
    query: &str,
    budget: u64,
    command: &StageCommand,
) -> Result<(QueryRun, Vec<StageReport>), RemoteError> {
    let sql = query_sql(set, query)?;
    let reference = set.reference(query)?;
    let start = Instant::now();
    let tables = read_tables(dir)?;
    let env = budget_env(cluster, budget)?;
    let planner = session(&env, &tables.open(cluster)?)?;
    let outcome = (|| -> Result<(StagePlan, Vec<StageReport>), String> {
        let plan = planner.stages(&sql).map_err(|e| e.to_string())?;
        let mut reports = Vec::with_capacity(plan.stages.len());
        for stage in &plan.stages {
            let out = Command::new(&command.program)
                .args(&command.args)
                .args(["--query", query, "--stage", &stage.id.to_string()])
                .output()
                .map_err(|e| format!("starting {}: {e}", command.program.display()))?;
            if !out.status.success() {
                return Err(format!(
                    "stage {} ({}) failed: {}",
                    stage.id,
                    stage.operator,
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            let stdout = String::from_utf8_lossy(&out.stdout);
            let report: StageReport = stdout
                .lines()
                .rev()
                .find_map(|l| serde_json::from_str(l).ok())
                .ok_or_else(|| format!("stage {} printed no report: {stdout}", stage.id))?;
            reports.push(report);
        }
        Ok((plan, reports))
    })();
    let secs = start.elapsed().as_secs_f64();
    let (stats, reports, error) = match outcome {
        Ok((plan, reports)) => {
            let checked = read_answer(cluster, dir, query, &plan)
                .map_err(|e| e.to_string())
                .and_then(|df| {
                    compare_values(&df, &reference, plan.ordered).map_err(|e| e.to_string())
                });
            let stats = QueryStats {
                elapsed: start.elapsed(),
                rows: reports.last().map_or(0, |r| r.rows),
                peak_local_bytes: reports
                    .iter()
                    .map(|r| r.peak_local_bytes)
                    .max()
                    .unwrap_or(0),
                budget: env.budget(),
                scan_bytes: reports.iter().map(|r| r.scan_bytes).sum(),
                spill_files: reports.iter().map(|r| r.spill_files).sum(),
                spill_bytes_written: reports.iter().map(|r| r.spill_bytes_written).sum(),
                spill_bytes_read: reports.iter().map(|r| r.spill_bytes_read).sum(),
            };
            (Some(stats), reports, checked.err())
        }
        Err(e) => (None, Vec::new(), Some(e)),
    };
    free_query(cluster, dir, query)?;
    let handoff_bytes = reports.iter().map(|r| r.output_bytes).sum();
    Ok((
        QueryRun {
            query: query.to_string(),
            secs,
            stats,
            handoff_bytes,
            error,
        },
        reports,
    ))
}
