//! Pipelines of steps: each step is a function from its named inputs (base tables or
//! parent steps' results) to one DataFrame, the way an element of a DAG runs.
//!
//! Every step records the remote-frame kernels (issue 5) its logic needs, so porting it
//! onto `RemoteFrame` is a matter of replacing the Polars calls kernel by kernel.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use polars::prelude::DataFrame;

use crate::error::TpcdsError;

/// A relational kernel of remote-frame (issue 5) that a step's logic maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// Row filter by a predicate over the row's columns.
    Filter,
    /// Column projection, renaming and per-row arithmetic / casts.
    Project,
    /// Hash join of the given kind on one or more equality keys.
    Join(JoinKind),
    /// Group-by (or a global aggregate) with sum, mean, count, count distinct, min, max.
    GroupBy,
    /// Sort by one or more columns.
    Sort,
    /// Distinct rows.
    Distinct,
    /// First n rows.
    Limit,
}

/// Join kinds of the hash-join kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinKind {
    /// Inner join.
    Inner,
    /// Left outer join.
    Left,
    /// Left semi join: left rows with at least one match (EXISTS / IN).
    Semi,
    /// Left anti join: left rows without a match (NOT EXISTS).
    Anti,
}

/// Where a step's input comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A base table, projected to the listed columns.
    Table {
        /// Table name, e.g. `store_returns`.
        table: &'static str,
        /// Columns the step reads.
        columns: Vec<&'static str>,
    },
    /// The result of an earlier step of the same pipeline.
    Step(&'static str),
}

impl Source {
    /// A base table with a projection.
    pub fn table(table: &'static str, columns: &[&'static str]) -> Self {
        Source::Table {
            table,
            columns: columns.to_vec(),
        }
    }
}

/// The named inputs handed to a step.
#[derive(Debug, Default)]
pub struct StepInputs {
    step: String,
    frames: BTreeMap<&'static str, DataFrame>,
}

impl StepInputs {
    /// Inputs for `step` (useful to call a step function directly).
    pub fn new(step: impl Into<String>) -> Self {
        StepInputs {
            step: step.into(),
            frames: BTreeMap::new(),
        }
    }

    /// Adds an input named `name`.
    pub fn with(mut self, name: &'static str, frame: DataFrame) -> Self {
        self.frames.insert(name, frame);
        self
    }

    /// The input named `name` (cheap clone: Polars columns are reference counted).
    ///
    /// # Errors
    /// [`TpcdsError::MissingInput`] if the step has no such input.
    pub fn get(&self, name: &str) -> Result<DataFrame, TpcdsError> {
        self.frames
            .get(name)
            .cloned()
            .ok_or_else(|| TpcdsError::MissingInput {
                step: self.step.clone(),
                input: name.to_string(),
            })
    }
}

/// A step's function.
pub type StepFn = Box<dyn Fn(&StepInputs) -> Result<DataFrame, TpcdsError> + Send + Sync>;

/// One step of a pipeline: an element that reads its inputs and writes one frame.
pub struct Step {
    /// Step name, unique within its pipeline.
    pub name: &'static str,
    /// Named inputs: the name the function uses and where the frame comes from.
    pub inputs: Vec<(&'static str, Source)>,
    /// The remote-frame kernels this step's logic maps to, in the order it applies them.
    pub kernels: &'static [Kernel],
    /// What the step computes, in SQL terms (for reports and the port).
    pub description: &'static str,
    /// The step's logic.
    pub run: StepFn,
}

impl std::fmt::Debug for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Step")
            .field("name", &self.name)
            .field("inputs", &self.inputs)
            .field("kernels", &self.kernels)
            .finish_non_exhaustive()
    }
}

/// Whether a query's result has a defined row order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowOrder {
    /// ORDER BY decides the order of all rows: compare in order.
    Ordered,
    /// No (total) order: compare as multisets.
    Unordered,
}

/// A query as a DAG of steps, listed in an order where parents come first.
#[derive(Debug)]
pub struct Pipeline {
    /// Query name, e.g. `q1`.
    pub name: String,
    /// Steps, parents before children; the last step's result is the query's result.
    pub steps: Vec<Step>,
    /// Whether the result's row order is defined.
    pub row_order: RowOrder,
}

/// Time and size of one step of a run.
#[derive(Debug, Clone)]
pub struct StepReport {
    /// Step name.
    pub name: &'static str,
    /// Wall time of the step's function.
    pub elapsed: Duration,
    /// Rows of the step's result.
    pub rows: usize,
    /// Estimated in-memory size of the step's result in bytes.
    pub bytes: usize,
}

/// The result of a pipeline run with per-step reports.
#[derive(Debug)]
pub struct PipelineRun {
    /// The last step's result.
    pub result: DataFrame,
    /// One report per step, in run order.
    pub steps: Vec<StepReport>,
    /// Total wall time of the steps (excluding table loading).
    pub elapsed: Duration,
}

/// Gives a pipeline its base tables.
pub trait TableSource {
    /// Table `table` with (at least) `columns`, in that order.
    ///
    /// # Errors
    /// When the table or a column does not exist or cannot be read.
    fn table(&self, table: &str, columns: &[&str]) -> Result<DataFrame, TpcdsError>;
}

/// Tables held in memory, e.g. loaded once from Parquet before timing queries.
#[derive(Debug, Default, Clone)]
pub struct InMemoryTables {
    tables: HashMap<String, DataFrame>,
}

impl InMemoryTables {
    /// An empty set of tables.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) a table.
    pub fn insert(&mut self, name: impl Into<String>, frame: DataFrame) {
        self.tables.insert(name.into(), frame);
    }

    /// Whether `name` is loaded.
    pub fn contains(&self, name: &str) -> bool {
        self.tables.contains_key(name)
    }

    /// Estimated in-memory bytes of all tables.
    pub fn estimated_bytes(&self) -> usize {
        self.tables.values().map(DataFrame::estimated_size).sum()
    }
}

impl TableSource for InMemoryTables {
    fn table(&self, table: &str, columns: &[&str]) -> Result<DataFrame, TpcdsError> {
        let frame = self
            .tables
            .get(table)
            .ok_or_else(|| TpcdsError::DataMissing {
                path: table.into(),
                hint: "table not loaded".to_string(),
            })?;
        frame
            .select(columns.iter().copied())
            .map_err(|source| TpcdsError::Polars {
                context: format!("selecting {columns:?} from {table}"),
                source,
            })
    }
}

impl Pipeline {
    /// Base tables and their columns this pipeline reads (each table once, columns merged).
    pub fn table_columns(&self) -> BTreeMap<&'static str, Vec<&'static str>> {
        let mut out: BTreeMap<&'static str, Vec<&'static str>> = BTreeMap::new();
        for step in &self.steps {
            for (_, source) in &step.inputs {
                if let Source::Table { table, columns } = source {
                    let entry = out.entry(table).or_default();
                    for c in columns {
                        if !entry.contains(c) {
                            entry.push(c);
                        }
                    }
                }
            }
        }
        out
    }

    /// Checks that step names are unique, parents come before children and there is a
    /// last step.
    ///
    /// # Errors
    /// [`TpcdsError::BadPipeline`] describing the first problem found.
    pub fn validate(&self) -> Result<(), TpcdsError> {
        let bad = |message: String| TpcdsError::BadPipeline {
            pipeline: self.name.clone(),
            message,
        };
        if self.steps.is_empty() {
            return Err(bad("no steps".to_string()));
        }
        let mut seen: Vec<&str> = Vec::new();
        for step in &self.steps {
            if seen.contains(&step.name) {
                return Err(bad(format!("duplicate step {}", step.name)));
            }
            for (_, source) in &step.inputs {
                if let Source::Step(parent) = source {
                    if !seen.contains(parent) {
                        return Err(bad(format!(
                            "step {} reads {parent}, which is not an earlier step",
                            step.name
                        )));
                    }
                }
            }
            seen.push(step.name);
        }
        Ok(())
    }

    /// Runs every step in order on tables from `tables`, keeping each intermediate only
    /// until its last reader has run.
    ///
    /// # Errors
    /// A malformed pipeline, a missing table or a failing step.
    pub fn run(&self, tables: &dyn TableSource) -> Result<PipelineRun, TpcdsError> {
        self.validate()?;
        // Index of the last step reading each step's result, so it can be dropped then.
        let mut last_reader: HashMap<&str, usize> = HashMap::new();
        for (i, step) in self.steps.iter().enumerate() {
            for (_, source) in &step.inputs {
                if let Source::Step(parent) = source {
                    last_reader.insert(parent, i);
                }
            }
        }
        let mut results: HashMap<&str, DataFrame> = HashMap::new();
        let mut reports = Vec::with_capacity(self.steps.len());
        let start = Instant::now();
        let mut last = None;
        for (i, step) in self.steps.iter().enumerate() {
            let mut inputs = StepInputs::new(step.name);
            for (name, source) in &step.inputs {
                let frame = match source {
                    Source::Table { table, columns } => tables.table(table, columns)?,
                    Source::Step(parent) => {
                        results
                            .get(parent)
                            .cloned()
                            .ok_or_else(|| TpcdsError::BadPipeline {
                                pipeline: self.name.clone(),
                                message: format!("result of {parent} is gone before {}", step.name),
                            })?
                    }
                };
                inputs = inputs.with(name, frame);
            }
            let step_start = Instant::now();
            let frame = (step.run)(&inputs)?;
            let elapsed = step_start.elapsed();
            tracing::debug!(
                step = step.name,
                rows = frame.height(),
                ?elapsed,
                "step done"
            );
            reports.push(StepReport {
                name: step.name,
                elapsed,
                rows: frame.height(),
                bytes: frame.estimated_size(),
            });
            drop(inputs);
            results.retain(|name, _| last_reader.get(name).is_some_and(|&r| r > i));
            if i + 1 == self.steps.len() {
                last = Some(frame);
            } else {
                results.insert(step.name, frame);
            }
        }
        let elapsed = start.elapsed();
        let result = last.ok_or_else(|| TpcdsError::BadPipeline {
            pipeline: self.name.clone(),
            message: "no steps".to_string(),
        })?;
        Ok(PipelineRun {
            result,
            steps: reports,
            elapsed,
        })
    }
}
