//! Query stages: a query's physical plan cut at its pipeline breakers into stages that
//! can each run in their own compute element, handing their outputs on through
//! memory elements.
//!
//! A stage ends where the plan materializes data anyway: at the build side of a join
//! (hash, cross and nested-loop joins read it whole before probing), at the output of
//! a final aggregate, and at the query's root. (The input of a scalar subquery's
//! operator is never cut: its expressions wait for values that operator fills in.) Stages are numbered children first, so
//! running them in order runs every stage after its inputs; the last is the root.
//!
//! A stage's output is one [`RemoteFrame`] per output partition of its top operator,
//! written batch by batch as it is produced. The stage that reads it sees an operator
//! with exactly the properties of the one it replaces (schema, partitioning, ordering),
//! which replays each partition's frame, so the rest of the plan runs unchanged.
//!
//! Nothing of the plan is serialized: every process plans the same SQL over the same
//! tables with the same budget, and DataFusion's planning is deterministic, so each
//! finds the same stages ([`QuerySession::stages`] lists them; a process whose plan
//! differs is refused when an input's shape does not match).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, PoisonError};

use arrow_array::{new_null_array, ArrayRef, RecordBatch, RecordBatchOptions};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::compute::cast;
use datafusion::common::{DataFusionError, Result as DfResult, Statistics};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::statistics::StatisticsArgs;
use datafusion::physical_plan::{
    displayable, DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties,
    ReplaceChildrenOptions, SendableRecordBatchStream,
};
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use super::scan::{chunk_stream, ChunkReader};
use super::{is_ordered, QuerySession, QueryStats};
use crate::error::{Error, Result};
use crate::frame::{FrameWriter, RemoteFrame};

/// One stage of a query, as [`QuerySession::stages`] lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stage {
    /// Its number: stages are numbered children first; the last is the query's root.
    pub id: usize,
    /// The stages whose outputs it reads, in plan order.
    pub inputs: Vec<usize>,
    /// Its top operator, as EXPLAIN shows it.
    pub operator: String,
    /// Output partitions (frames of its output).
    pub partitions: usize,
    /// Output columns.
    pub columns: Vec<String>,
}

/// A query's stages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagePlan {
    /// The stages, inputs before the stages that read them; the last is the root.
    pub stages: Vec<Stage>,
    /// Whether the answer (the root's output) is ordered.
    pub ordered: bool,
}

/// What one stage wrote and did.
#[derive(Debug)]
pub struct StageOutput {
    /// Its output: one frame per output partition, in memory elements. Column names
    /// are the stage's, made unique (`name#2` for a second `name`) since a frame's
    /// must be; columns of types frames do not store narrow are widened (8- and
    /// 16-bit integers as 32-bit) and read back as they were.
    pub frames: Vec<RemoteFrame>,
    /// The stage's run: its own peak local memory, scans, spills.
    pub stats: QueryStats,
    /// Bytes of the output frames written to memory elements.
    pub bytes_written: u64,
}

impl StageOutput {
    /// Frees the output frames.
    ///
    /// # Errors
    /// Allocator errors.
    pub fn free(self) -> Result<()> {
        self.frames.into_iter().try_for_each(RemoteFrame::free)
    }
}

/// A stage's top operator and the stages it reads.
struct Cut {
    plan: Arc<dyn ExecutionPlan>,
    inputs: Vec<usize>,
}

/// Whether `parent`'s child number `k` starts a stage of its own.
fn is_cut(parent: &dyn ExecutionPlan, k: usize, child: &Arc<dyn ExecutionPlan>) -> bool {
    let build_side = k == 0
        && matches!(
            parent.name(),
            "HashJoinExec" | "SpillingHashJoinExec" | "CrossJoinExec" | "NestedLoopJoinExec"
        );
    build_side || is_final_aggregate(child.as_ref())
}

/// Whether `parent`'s child number `k` may be cut below at all: the input of a
/// scalar subquery's operator holds expressions that the operator fills in with the
/// subqueries' values when it runs, so that input stays in its stage whole.
fn may_cut_below(parent: &dyn ExecutionPlan, k: usize) -> bool {
    !(k == 0 && parent.name() == "ScalarSubqueryExec")
}

fn is_final_aggregate(plan: &dyn ExecutionPlan) -> bool {
    // SpillingAggregateExec wraps only final phases.
    plan.name() == "SpillingAggregateExec"
        || plan.downcast_ref::<AggregateExec>().is_some_and(|a| {
            matches!(
                a.mode(),
                AggregateMode::Final
                    | AggregateMode::FinalPartitioned
                    | AggregateMode::Single
                    | AggregateMode::SinglePartitioned
            )
        })
}

fn inputs_of(plan: &Arc<dyn ExecutionPlan>, cuts: &mut Vec<Cut>) -> Vec<usize> {
    let mut ids = Vec::new();
    for (k, child) in plan.children().into_iter().enumerate() {
        if !may_cut_below(plan.as_ref(), k) {
            continue;
        }
        if is_cut(plan.as_ref(), k, child) {
            ids.push(add_stage(child, cuts));
        } else {
            ids.extend(inputs_of(child, cuts));
        }
    }
    ids
}

fn add_stage(plan: &Arc<dyn ExecutionPlan>, cuts: &mut Vec<Cut>) -> usize {
    let inputs = inputs_of(plan, cuts);
    cuts.push(Cut {
        plan: plan.clone(),
        inputs,
    });
    cuts.len() - 1
}

/// The stages of `root`, children first.
fn cut(root: &Arc<dyn ExecutionPlan>) -> Vec<Cut> {
    let mut cuts = Vec::new();
    add_stage(root, &mut cuts);
    cuts
}

fn node_key(plan: &Arc<dyn ExecutionPlan>) -> *const () {
    Arc::as_ptr(plan) as *const ()
}

/// `plan` with every stage below it (by `ids`) replaced by a replay of its output.
fn replace_inputs(
    plan: &Arc<dyn ExecutionPlan>,
    ids: &HashMap<*const (), usize>,
    inputs: &BTreeMap<usize, Vec<RemoteFrame>>,
    batch_rows: usize,
) -> Result<Arc<dyn ExecutionPlan>> {
    let children = plan.children();
    if children.is_empty() {
        return Ok(plan.clone());
    }
    let mut new_children = Vec::with_capacity(children.len());
    for (k, child) in children.into_iter().enumerate() {
        let replaced = if !may_cut_below(plan.as_ref(), k) {
            child.clone()
        } else if is_cut(plan.as_ref(), k, child) {
            let id = ids.get(&node_key(child)).copied().ok_or_else(|| {
                Error::InvalidArgument("a stage input is missing from the stage list".into())
            })?;
            let frames = inputs.get(&id).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "the output of stage {id} is needed but was not given"
                ))
            })?;
            Arc::new(StageInputExec::new(id, child, frames.clone(), batch_rows)?)
                as Arc<dyn ExecutionPlan>
        } else {
            replace_inputs(child, ids, inputs, batch_rows)?
        };
        new_children.push(replaced);
    }
    plan.clone()
        .replace_children(
            new_children,
            ReplaceChildrenOptions::new(
                datafusion::physical_plan::ChildrenPropertiesMode::Recompute,
            ),
        )
        .map_err(super::query_error)
}

impl QuerySession {
    /// Plans `sql` and lists its stages (nothing runs).
    ///
    /// # Errors
    /// As [`QuerySession::sql`], for planning.
    pub fn stages(&self, sql: &str) -> Result<StagePlan> {
        let (logical, physical) = self.plan(sql)?;
        let stages = cut(&physical)
            .iter()
            .enumerate()
            .map(|(id, c)| Stage {
                id,
                inputs: c.inputs.clone(),
                operator: displayable(c.plan.as_ref())
                    .one_line()
                    .to_string()
                    .trim()
                    .to_owned(),
                partitions: c.plan.properties().partitioning.partition_count(),
                columns: c
                    .plan
                    .schema()
                    .fields()
                    .iter()
                    .map(|f| f.name().clone())
                    .collect(),
            })
            .collect();
        Ok(StagePlan {
            stages,
            ordered: is_ordered(&logical),
        })
    }

    /// Runs stage `stage` of `sql` from its inputs' outputs (`inputs`: stage number →
    /// that stage's frames, as an earlier [`QuerySession::run_stage`] wrote them, in
    /// this process or another) and writes its output to memory elements, within the
    /// session's budget. If the stage fails, what it wrote is freed.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an unknown stage, a missing input or an input
    /// whose shape differs from what this plan expects; otherwise as
    /// [`QuerySession::sql`].
    pub fn run_stage(
        &self,
        sql: &str,
        stage: usize,
        inputs: &BTreeMap<usize, Vec<RemoteFrame>>,
    ) -> Result<StageOutput> {
        let _running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        let before = self.measure_start();
        let (_, physical) = self.plan(sql)?;
        let cuts = cut(&physical);
        let count = cuts.len();
        let top = cuts.get(stage).map(|c| c.plan.clone()).ok_or_else(|| {
            Error::InvalidArgument(format!("stage {stage} of a query with {count} stages"))
        })?;
        let ids: HashMap<*const (), usize> = cuts
            .iter()
            .enumerate()
            .map(|(id, c)| (node_key(&c.plan), id))
            .collect();
        let batch_rows = self.ctx.state().config().batch_size();
        let plan = replace_inputs(&top, &ids, inputs, batch_rows)?;
        let written = self.write_partitions(plan.clone());
        self.await_spill_release();
        let frames = written?;
        let rows = frames.iter().map(RemoteFrame::rows).sum();
        let bytes_written = frames.iter().map(RemoteFrame::data_bytes).sum();
        Ok(StageOutput {
            frames,
            stats: self.measure_end(before, rows, plan.as_ref()),
            bytes_written,
        })
    }

    /// Executes every partition of `plan` at once, each written to its own frame.
    fn write_partitions(&self, plan: Arc<dyn ExecutionPlan>) -> Result<Vec<RemoteFrame>> {
        let partitions = plan.properties().partitioning.partition_count();
        let storage = StorageSchema::new(&plan.schema());
        let context = self.ctx.task_ctx();
        let tasks: Vec<_> = (0..partitions)
            .map(|p| {
                let writer = storage.writer(self.env())?;
                let (plan, context, storage) = (plan.clone(), context.clone(), storage.clone());
                Ok(self.runtime.spawn(async move {
                    // Operators may spawn tasks when executed: inside the runtime.
                    let stream = plan.execute(p, context).map_err(super::query_error)?;
                    write_partition(stream, writer, storage).await
                }))
            })
            .collect::<Result<_>>()?;
        let results: Vec<Result<RemoteFrame>> = self.runtime.block_on(async {
            let mut out = Vec::with_capacity(tasks.len());
            for t in tasks {
                out.push(match t.await {
                    Ok(r) => r,
                    Err(e) => Err(Error::InvalidArgument(format!(
                        "a stage partition's task failed: {e}"
                    ))),
                });
            }
            out
        });
        let mut frames = Vec::with_capacity(results.len());
        let mut first_error = None;
        for r in results {
            match r {
                Ok(f) => frames.push(f),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            None => Ok(frames),
            Some(e) => {
                for f in frames {
                    if let Err(free) = f.free() {
                        tracing::warn!(%free, "freeing a failed stage's output");
                    }
                }
                Err(match e {
                    Error::Query(q) => self.run_error(*q),
                    other => other,
                })
            }
        }
    }
}

/// Streams one partition into `writer`; on failure frees what it wrote.
async fn write_partition(
    mut stream: SendableRecordBatchStream,
    mut writer: FrameWriter,
    storage: StorageSchema,
) -> Result<RemoteFrame> {
    let mut failure = None;
    while let Some(batch) = stream.next().await {
        let pushed = batch
            .map_err(|e| Error::Query(Box::new(e)))
            .and_then(|b| storage.stored(&b))
            .and_then(|b| tokio::task::block_in_place(|| writer.push_batch(&b)));
        if let Err(e) = pushed {
            failure = Some(e);
            break;
        }
    }
    drop(stream);
    let frame = tokio::task::block_in_place(|| writer.finish())?;
    match failure {
        None => Ok(frame),
        Some(e) => {
            if let Err(free) = frame.free() {
                tracing::warn!(%free, "freeing a failed stage partition's output");
            }
            Err(e)
        }
    }
}

/// How a stage's output is stored: unique column names, narrow integers widened,
/// a placeholder column when there are none (so the frame keeps its row count).
#[derive(Clone)]
struct StorageSchema {
    schema: SchemaRef,
    /// No columns: one all-null placeholder column is stored.
    placeholder: bool,
}

impl StorageSchema {
    fn new(schema: &SchemaRef) -> Self {
        let mut seen: HashMap<&str, usize> = HashMap::new();
        let mut fields: Vec<Field> = schema
            .fields()
            .iter()
            .map(|f| {
                let n = seen.entry(f.name().as_str()).or_insert(0);
                *n += 1;
                let name = if *n == 1 {
                    f.name().clone()
                } else {
                    format!("{}#{n}", f.name())
                };
                Field::new(name, stored_type(f.data_type()), true)
            })
            .collect();
        let placeholder = fields.is_empty();
        if placeholder {
            fields.push(Field::new("__rows", DataType::Null, true));
        }
        StorageSchema {
            schema: Arc::new(Schema::new(fields)),
            placeholder,
        }
    }

    fn writer(&self, env: &crate::env::FrameEnv) -> Result<FrameWriter> {
        FrameWriter::with_arrow_schema(env, &self.schema)
    }

    /// `batch` in the storage schema.
    fn stored(&self, batch: &RecordBatch) -> Result<RecordBatch> {
        let columns: Vec<ArrayRef> = if self.placeholder {
            vec![new_null_array(&DataType::Null, batch.num_rows())]
        } else {
            batch
                .columns()
                .iter()
                .zip(self.schema.fields())
                .map(|(a, f)| {
                    if a.data_type() == f.data_type() {
                        Ok(a.clone())
                    } else {
                        cast(a, f.data_type()).map_err(Error::from)
                    }
                })
                .collect::<Result<_>>()?
        };
        Ok(RecordBatch::try_new_with_options(
            self.schema.clone(),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
        )?)
    }
}

/// The type a column is stored as (frames hold no 8- or 16-bit integers).
fn stored_type(t: &DataType) -> DataType {
    match t {
        DataType::Int8 | DataType::Int16 | DataType::UInt8 | DataType::UInt16 => DataType::Int32,
        other => other.clone(),
    }
}

/// Replays a stage's output in place of the operator that produced it: the same
/// schema, partitioning and ordering, partition `p` read from frame `p`.
#[derive(Debug)]
pub(crate) struct StageInputExec {
    stage: usize,
    frames: Vec<RemoteFrame>,
    schema: SchemaRef,
    batch_rows: usize,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl StageInputExec {
    fn new(
        stage: usize,
        replaced: &Arc<dyn ExecutionPlan>,
        frames: Vec<RemoteFrame>,
        batch_rows: usize,
    ) -> Result<Self> {
        let schema = replaced.schema();
        let partitions = replaced.properties().partitioning.partition_count();
        if frames.len() != partitions {
            return Err(Error::InvalidArgument(format!(
                "stage {stage} has {partitions} output partitions here, its output has {} frames (was it planned with another budget or other tables?)",
                frames.len()
            )));
        }
        let stored = StorageSchema::new(&schema).schema;
        for (k, f) in frames.iter().enumerate() {
            if f.meta().schema.len() != stored.fields().len() {
                return Err(Error::InvalidArgument(format!(
                    "stage {stage}'s output frame {k} has {} columns, the plan expects {} ({})",
                    f.meta().schema.len(),
                    stored.fields().len(),
                    stored
                        .fields()
                        .iter()
                        .map(|f| f.name().as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        }
        Ok(StageInputExec {
            stage,
            frames,
            schema,
            batch_rows,
            properties: replaced.properties().clone(),
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }
}

impl DisplayAs for StageInputExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "StageInputExec: stage={}, partitions={}, rows={}",
            self.stage,
            self.frames.len(),
            self.frames.iter().map(RemoteFrame::rows).sum::<usize>()
        )
    }
}

impl ExecutionPlan for StageInputExec {
    super::operator::leaf_plan_methods!("StageInputExec");

    fn statistics_from_inputs(
        &self,
        _input_stats: &[Arc<Statistics>],
        args: &StatisticsArgs,
    ) -> DfResult<Arc<Statistics>> {
        use datafusion::common::stats::Precision;
        let rows = match args.partition() {
            None => self.frames.iter().map(RemoteFrame::rows).sum(),
            Some(p) => self.frames.get(p).map_or(0, RemoteFrame::rows),
        };
        Ok(Arc::new(
            Statistics::new_unknown(&self.schema).with_num_rows(Precision::Exact(rows)),
        ))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let frame = self.frames.get(partition).cloned().ok_or_else(|| {
            DataFusionError::Internal(format!(
                "StageInputExec has {} partitions, partition {partition} asked for",
                self.frames.len()
            ))
        })?;
        let chunks = frame.chunk_count();
        // No columns: the stored placeholder is not read, batches carry row counts.
        let columns = (0..self.schema.fields().len()).collect();
        Ok(chunk_stream(
            ChunkReader {
                frame,
                columns: Arc::new(columns),
                schema: self.schema.clone(),
                batch_rows: self.batch_rows,
                row_index: None,
            },
            (0..chunks).collect(),
            None,
            &self.metrics,
            partition,
            None,
        ))
    }
}
