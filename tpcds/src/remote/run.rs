//! Running the pipelines over memory elements: loading base tables, running one step
//! from its inputs' handoffs (the way an element runs on a cluster), and running a
//! whole query step by step with per-step statistics.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use polars::prelude::DataFrame;
use scad_remote_frame::{KernelStats, RemoteFrame};
use serde::{Deserialize, Serialize};

use crate::data::DataSet;
use crate::pipeline::{Pipeline, RowOrder, Source, Step};
use crate::queries::pipeline_for;

use super::cluster::Cluster;
use super::error::{FrameContext, RemoteError};
use super::handoff::Handoff;
use super::steps::{steps_for, RemoteInputs, RemoteStepFn};

/// Base tables loaded into memory elements: one handoff per table.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TableHandoffs {
    /// Handoff per table name.
    pub tables: BTreeMap<String, Handoff>,
    /// Wall time of loading (Parquet read + writing to memory elements).
    pub load_secs: f64,
}

impl TableHandoffs {
    /// Bytes of the largest loaded table (the budget's reference).
    pub fn largest_bytes(&self) -> u64 {
        self.tables
            .values()
            .map(|h| h.frame.data_bytes())
            .max()
            .unwrap_or(0)
    }

    /// Frees every table.
    ///
    /// # Errors
    /// Transport and allocator errors.
    pub fn free(&self, cluster: &Cluster) -> Result<(), RemoteError> {
        self.tables.values().try_for_each(|h| h.free(cluster))
    }
}

/// Reads `tables` (each projected to its columns) from the data set's Parquet files
/// and writes them to the cluster's memory elements.
///
/// # Errors
/// Data set errors; allocation and transport errors.
pub fn load_tables(
    cluster: &Cluster,
    set: &DataSet,
    tables: &BTreeMap<&'static str, Vec<&'static str>>,
) -> Result<TableHandoffs, RemoteError> {
    let start = Instant::now();
    let mut out = BTreeMap::new();
    for (table, columns) in tables {
        let df = set.read_table(table, Some(columns.as_slice()))?;
        let frame = RemoteFrame::from_polars(cluster.env(), &df)
            .frame_ctx(|| format!("writing table {table} to memory elements"))?;
        drop(df);
        out.insert(
            (*table).to_string(),
            Handoff::seal(cluster, &format!("table/{table}"), &frame)?,
        );
    }
    Ok(TableHandoffs {
        tables: out,
        load_secs: start.elapsed().as_secs_f64(),
    })
}

/// The tables and columns all of `queries` read.
///
/// # Errors
/// Unknown query names.
pub fn tables_for(
    queries: &[String],
) -> Result<BTreeMap<&'static str, Vec<&'static str>>, RemoteError> {
    let mut out: BTreeMap<&'static str, Vec<&'static str>> = BTreeMap::new();
    for q in queries {
        for (t, cols) in pipeline_for(q)?.table_columns() {
            let e = out.entry(t).or_default();
            for c in cols {
                if !e.contains(&c) {
                    e.push(c);
                }
            }
        }
    }
    Ok(out)
}

/// A query as steps over memory elements: the Polars pipeline's structure (step
/// names, inputs, row order) with each step's remote logic.
pub struct RemotePipeline {
    /// The structure (and the Polars logic, unused here).
    pub pipeline: Pipeline,
    remote: BTreeMap<&'static str, RemoteStepFn>,
}

impl std::fmt::Debug for RemotePipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemotePipeline")
            .field("pipeline", &self.pipeline)
            .finish_non_exhaustive()
    }
}

/// Time, data moved and local memory of one step run over memory elements.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RemoteStepReport {
    /// Step name.
    pub step: String,
    /// Wall time of the step: checking and opening its inputs, kernels, sealing.
    pub secs: f64,
    /// Rows of the step's result.
    pub rows: u64,
    /// Bytes read from memory elements.
    pub bytes_in: u64,
    /// Bytes written to memory elements.
    pub bytes_out: u64,
    /// Peak local memory of the kernels (as `KernelStats` measures it).
    pub peak_local_bytes: u64,
    /// Hash partitions written (grace hash joins and aggregations).
    pub partitions: u64,
    /// The budget the step ran with.
    pub budget: u64,
}

impl RemoteStepReport {
    fn new(step: &str, secs: f64, rows: u64, stats: &KernelStats, budget: u64) -> Self {
        RemoteStepReport {
            step: step.to_string(),
            secs,
            rows,
            bytes_in: stats.bytes_in,
            bytes_out: stats.bytes_out,
            peak_local_bytes: stats.peak_local_bytes,
            partitions: stats.partitions,
            budget,
        }
    }
}

/// A whole query's run.
#[derive(Debug)]
pub struct RemoteRun {
    /// The last step's result, read back from memory elements.
    pub result: DataFrame,
    /// Per step, in run order.
    pub steps: Vec<RemoteStepReport>,
    /// Sum of the steps' wall times (query time; loading excluded).
    pub secs: f64,
}

impl RemoteRun {
    /// Largest per-step peak of local memory.
    pub fn peak_local_bytes(&self) -> u64 {
        self.steps
            .iter()
            .map(|s| s.peak_local_bytes)
            .max()
            .unwrap_or(0)
    }

    /// Bytes moved to and from memory elements by all steps.
    pub fn bytes_moved(&self) -> u64 {
        self.steps.iter().map(|s| s.bytes_in + s.bytes_out).sum()
    }
}

impl RemotePipeline {
    /// The pipeline of query `name` (`q1`, `q16`, `q94`, `q95`, or a `_wide` variant).
    ///
    /// # Errors
    /// Unknown query; [`RemoteError::Invalid`] if a step lacks its remote logic.
    pub fn for_query(name: &str) -> Result<Self, RemoteError> {
        let pipeline = pipeline_for(name)?;
        pipeline.validate()?;
        let remote = steps_for(name)?;
        for s in &pipeline.steps {
            if !remote.contains_key(s.name) {
                return Err(RemoteError::Invalid(format!(
                    "{name}: step {} has no remote implementation",
                    s.name
                )));
            }
        }
        Ok(RemotePipeline { pipeline, remote })
    }

    /// Query name.
    pub fn name(&self) -> &str {
        &self.pipeline.name
    }

    /// Whether the result's row order is defined.
    pub fn row_order(&self) -> RowOrder {
        self.pipeline.row_order
    }

    /// The step named `step`.
    ///
    /// # Errors
    /// [`RemoteError::Invalid`] listing the steps.
    pub fn step(&self, step: &str) -> Result<&Step, RemoteError> {
        self.pipeline
            .steps
            .iter()
            .find(|s| s.name == step)
            .ok_or_else(|| {
                RemoteError::Invalid(format!(
                    "{} has no step {step:?} (steps: {})",
                    self.name(),
                    self.pipeline
                        .steps
                        .iter()
                        .map(|s| s.name)
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })
    }

    /// Runs one step as an element does: opens its inputs — base tables from
    /// `tables`, parents from their handoff JSON in `parents` (by parent step name) —
    /// checking every handoff's seal, runs the step's kernels within `budget` bytes of
    /// local memory and seals its result. Returns the result's handoff and the report.
    ///
    /// # Errors
    /// [`RemoteError::Stale`], [`RemoteError::BadJson`] for bad handoffs; kernel
    /// errors (an unknown column, the budget) with the step and input named.
    pub fn run_step(
        &self,
        cluster: &Cluster,
        step: &str,
        tables: &TableHandoffs,
        parents: &HashMap<String, String>,
        budget: u64,
    ) -> Result<(Handoff, RemoteStepReport), RemoteError> {
        let def = self.step(step)?;
        let run = self.remote.get(def.name).ok_or_else(|| {
            RemoteError::Invalid(format!("step {step} has no remote implementation"))
        })?;
        let start = Instant::now();
        let env = cluster.env().with_budget(budget);
        let mut inputs = RemoteInputs::new(step);
        for (name, source) in &def.inputs {
            let context = format!("{}/{step}, input {name}", self.name());
            let frame = match source {
                Source::Table { table, columns } => {
                    let h = tables.tables.get(*table).ok_or_else(|| {
                        RemoteError::Invalid(format!("{context}: table {table} was not loaded"))
                    })?;
                    h.open_columns(cluster, &env, columns, &context)?
                }
                Source::Step(parent) => {
                    let json = parents.get(*parent).ok_or_else(|| {
                        RemoteError::Invalid(format!(
                            "{context}: no handoff of parent step {parent}"
                        ))
                    })?;
                    let h = Handoff::from_json(json, &context)?;
                    h.open(cluster, &env, &context)?
                }
            };
            inputs.insert(*name, frame);
        }
        let frame = run(&inputs).frame_ctx(|| format!("{}/{step}", self.name()))?;
        let rows = frame.rows() as u64;
        let handoff = Handoff::seal(cluster, &format!("{}/{step}", self.name()), &frame)?;
        let report = RemoteStepReport::new(
            step,
            start.elapsed().as_secs_f64(),
            rows,
            &env.stats(),
            budget,
        );
        Ok((handoff, report))
    }

    /// Runs every step in order, handing each result on as handoff JSON and freeing
    /// it after its last reader; reads the last step's result back and frees it.
    ///
    /// # Errors
    /// As [`RemotePipeline::run_step`].
    pub fn run(
        &self,
        cluster: &Cluster,
        tables: &TableHandoffs,
        budget: u64,
    ) -> Result<RemoteRun, RemoteError> {
        let steps = &self.pipeline.steps;
        let mut last_reader: HashMap<&str, usize> = HashMap::new();
        for (i, s) in steps.iter().enumerate() {
            for (_, src) in &s.inputs {
                if let Source::Step(p) = src {
                    last_reader.insert(p, i);
                }
            }
        }
        let mut live: HashMap<String, (Handoff, String)> = HashMap::new();
        let mut reports = Vec::with_capacity(steps.len());
        let mut result = None;
        let outcome = (|| -> Result<(), RemoteError> {
            for (i, s) in steps.iter().enumerate() {
                let parents: HashMap<String, String> = live
                    .iter()
                    .map(|(k, (_, json))| (k.clone(), json.clone()))
                    .collect();
                let (h, report) = self.run_step(cluster, s.name, tables, &parents, budget)?;
                tracing::debug!(query = self.name(), step = s.name, ?report, "step done");
                reports.push(report);
                let json = h.to_json()?;
                live.insert(s.name.to_string(), (h, json));
                let done: Vec<String> = live
                    .keys()
                    .filter(|k| {
                        k.as_str() != s.name && last_reader.get(k.as_str()).is_none_or(|&r| r <= i)
                    })
                    .cloned()
                    .collect();
                for k in done {
                    if let Some((h, _)) = live.remove(&k) {
                        h.free(cluster)?;
                    }
                }
            }
            if let Some(last) = steps.last() {
                if let Some((h, _)) = live.get(last.name) {
                    let frame =
                        h.open(cluster, cluster.env(), &format!("{} result", self.name()))?;
                    result = Some(
                        frame
                            .to_polars()
                            .frame_ctx(|| format!("{}: reading the result", self.name()))?,
                    );
                }
            }
            Ok(())
        })();
        for (_, (h, _)) in live.drain() {
            let _ = h.free(cluster);
        }
        outcome?;
        let result =
            result.ok_or_else(|| RemoteError::Invalid(format!("{} has no steps", self.name())))?;
        let secs = reports.iter().map(|r| r.secs).sum();
        Ok(RemoteRun {
            result,
            steps: reports,
            secs,
        })
    }
}

/// Parses a budget: bytes with an optional `K`/`M`/`G` suffix (binary), or a
/// percentage of `largest` (`25%`).
///
/// # Errors
/// [`RemoteError::Invalid`] for anything else or zero.
pub fn parse_budget(text: &str, largest: u64) -> Result<u64, RemoteError> {
    let t = text.trim();
    let bad = || {
        RemoteError::Invalid(format!(
            "budget {text:?}: expected bytes (e.g. 64M) or a percentage (e.g. 25%)"
        ))
    };
    let value = if let Some(p) = t.strip_suffix('%') {
        let p: f64 = p.trim().parse().map_err(|_| bad())?;
        if p.is_nan() || p <= 0.0 {
            return Err(bad());
        }
        (largest as f64 * p / 100.0) as u64
    } else {
        let (num, mult) = match t.chars().last() {
            Some('K' | 'k') => (&t[..t.len() - 1], 1u64 << 10),
            Some('M' | 'm') => (&t[..t.len() - 1], 1 << 20),
            Some('G' | 'g') => (&t[..t.len() - 1], 1 << 30),
            _ => (t, 1),
        };
        let n: f64 = num.trim().parse().map_err(|_| bad())?;
        if n.is_nan() || n <= 0.0 {
            return Err(bad());
        }
        (n * mult as f64) as u64
    };
    if value == 0 {
        return Err(bad());
    }
    Ok(value)
}

/// Human-readable bytes.
pub fn fmt_bytes(b: u64) -> String {
    if b >= 1 << 30 {
        format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
    } else if b >= 1 << 20 {
        format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
    } else if b >= 1 << 10 {
        format!("{:.1} KiB", b as f64 / 1024.0)
    } else {
        format!("{b} B")
    }
}

/// Seconds as a short string.
pub fn fmt_secs(d: f64) -> String {
    if d < 1.0 {
        format!("{:.1} ms", d * 1e3)
    } else {
        format!("{d:.2} s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_parse_as_bytes_or_percentages() {
        assert_eq!(parse_budget("25%", 1000).unwrap(), 250);
        assert_eq!(parse_budget("64M", 0).unwrap(), 64 << 20);
        assert_eq!(parse_budget("1G", 0).unwrap(), 1 << 30);
        assert_eq!(parse_budget("4096", 0).unwrap(), 4096);
        for bad in ["", "x", "-5%", "0", "0%", "12Q"] {
            assert!(parse_budget(bad, 1000).is_err(), "{bad}");
        }
    }

    #[test]
    fn every_query_has_remote_steps_for_all_its_steps() {
        for q in crate::queries::ALL_REFERENCES {
            let p = RemotePipeline::for_query(q).unwrap();
            assert_eq!(p.name(), q);
            assert!(p.step("no_such_step").is_err());
        }
        assert!(RemotePipeline::for_query("q2").is_err());
    }
}
