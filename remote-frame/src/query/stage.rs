//! Query stages: a query's physical plan cut at its pipeline breakers and exchanges
//! into stages that can each run in their own compute elements, as tasks, handing their
//! outputs on through memory elements.
//!
//! A stage ends where the plan materializes or moves data anyway: at the build side of
//! a join (hash, cross and nested-loop joins read it whole before probing), at an exchange (a hash repartition, whose producer side
//! ends the stage below it), below a merge of partitions (coalesce, sort-preserving
//! merge: the merge reads the stage's output in its consumer) and at the query's root.
//! (The input of a scalar subquery's operator is never cut: its expressions wait for
//! values that operator fills in.) Stages are numbered children first, so running them
//! in order runs every stage after its inputs; the last is the root.
//!
//! A stage runs as [`Stage::tasks`] tasks that need nothing from each other: task `t`
//! runs partition `t` of the stage's plan (of the exchange's input, for a stage that
//! ends in an exchange, and then writes its rows already partitioned for the consumer)
//! — in one process or each in its own. A stage whose plan shares work between its
//! partitions (a repartition that could not be cut, inside a scalar subquery's input)
//! runs as one task that runs them all.
//!
//! A stage's output is, for each partition of its consumer, the frames the tasks wrote
//! for it ([`StageFrames`]), written batch by batch as they are produced. The stage that
//! reads it sees an operator with exactly the properties of the one it replaces
//! (schema, partitioning, ordering), which replays each partition's frames, so the rest
//! of the plan runs unchanged.
//!
//! Nothing of the plan is serialized: every process plans the same SQL over the same
//! tables with the same budget and partitions, and DataFusion's planning is
//! deterministic, so each finds the same stages ([`QuerySession::stages`] lists them; a
//! process whose plan differs is refused when an input's shape does not match).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, PoisonError};

use arrow_array::{new_null_array, ArrayRef, RecordBatch, RecordBatchOptions};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::compute::cast;
use datafusion::common::JoinType;
use datafusion::common::{DataFusionError, Result as DfResult, Statistics};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::joins::{HashJoinExec, NestedLoopJoinExec, PartitionMode};
use datafusion::physical_plan::metrics::{self as df_metrics, ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::repartition::{BatchPartitioner, RepartitionExec};
use datafusion::physical_plan::statistics::StatisticsArgs;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    displayable, DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
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
    /// Partitions of its output, as its consumer reads them.
    pub partitions: usize,
    /// Tasks it runs as ([`QuerySession::run_stage_task`]): its plan's partitions, or
    /// one when they share work.
    pub tasks: usize,
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

/// A stage's output in memory elements: for each partition of it (as its consumer
/// reads them), the frames that make up that partition, in task order. The output of
/// several tasks of one stage is their outputs' partitions concatenated.
///
/// Column names are the stage's, made unique (`name#2` for a second `name`) since a
/// frame's must be; columns of types frames do not store narrow are widened (8- and
/// 16-bit integers as 32-bit) and read back as they were. Frames with no rows are not
/// kept.
pub type StageFrames = Vec<Vec<RemoteFrame>>;

/// What one stage, or one task of it, wrote and did.
#[derive(Debug)]
pub struct StageOutput {
    /// Its output, by partition.
    pub frames: StageFrames,
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
        self.frames
            .into_iter()
            .flatten()
            .try_for_each(RemoteFrame::free)
    }
}

/// A stage's top operator and the stages it reads.
struct Cut {
    plan: Arc<dyn ExecutionPlan>,
    inputs: Vec<usize>,
}

/// Whether `parent`'s child number `k` starts a stage of its own.
fn is_cut(parent: &dyn ExecutionPlan, k: usize, child: &Arc<dyn ExecutionPlan>) -> bool {
    if is_merge(child.as_ref()) {
        // A merge stays with its consumer, which reads the frames of its input's
        // partitions one after another (or merged in order): its input is the stage.
        return false;
    }
    let build_side = k == 0
        && matches!(
            parent.name(),
            "HashJoinExec" | "SpillingHashJoinExec" | "CrossJoinExec" | "NestedLoopJoinExec"
        );
    (build_side || is_merge(parent) || exchange(child.as_ref()).is_some())
        && storable(&child.schema())
}

/// Whether frames can hold rows of `schema` (a partial aggregate's state may be a
/// list, which they cannot: such an output stays inside its stage).
fn storable(schema: &SchemaRef) -> bool {
    schema
        .fields()
        .iter()
        .all(|f| crate::codec::column_type(f.name(), &stored_type(f.data_type())).is_ok())
}

/// Whether the output partitions of `plan` share state that only the last of them
/// to finish completes: a join that collects its build side once for all partitions
/// and emits build rows by whether any partition matched them (left, full, semi,
/// anti and mark joins). Run apart, each would see only its own matches.
fn shares_build_state(plan: &dyn ExecutionPlan) -> bool {
    let by_build_matches = |t: &JoinType| {
        matches!(
            t,
            JoinType::Left
                | JoinType::Full
                | JoinType::LeftSemi
                | JoinType::LeftAnti
                | JoinType::LeftMark
        )
    };
    if plan.properties().partitioning.partition_count() < 2 {
        return false;
    }
    if let Some(j) = plan.downcast_ref::<HashJoinExec>() {
        *j.partition_mode() == PartitionMode::CollectLeft && by_build_matches(j.join_type())
    } else if let Some(j) = plan.downcast_ref::<NestedLoopJoinExec>() {
        by_build_matches(j.join_type())
    } else {
        false
    }
}

/// An operator that reads every partition of its input into one.
fn is_merge(plan: &dyn ExecutionPlan) -> bool {
    matches!(
        plan.name(),
        "CoalescePartitionsExec" | "SortPreservingMergeExec"
    )
}

/// `plan` as an exchange a stage can end in: a repartition by hash that keeps no
/// order, so its producers can partition their rows themselves and its consumer
/// partitions read theirs in any order.
fn exchange(plan: &dyn ExecutionPlan) -> Option<&RepartitionExec> {
    plan.downcast_ref::<RepartitionExec>()
        .filter(|r| !r.preserve_order() && matches!(r.partitioning(), Partitioning::Hash(..)))
}

/// Whether `parent`'s child number `k` is another stage's output (cut there, or
/// already replaced by its replay).
fn is_stage_input(parent: &dyn ExecutionPlan, k: usize, child: &Arc<dyn ExecutionPlan>) -> bool {
    child.name() == "StageInputExec" || (may_cut_below(parent, k) && is_cut(parent, k, child))
}

/// Whether running one partition of `plan` (within its stage) runs work its other partitions
/// share: a repartition or merge over operators of the stage, or a join whose
/// partitions complete each other's build side matches. Such a stage runs as one task.
/// A merge that only reads a stage input is cheap to repeat per task.
fn shares_work(plan: &Arc<dyn ExecutionPlan>) -> bool {
    if shares_build_state(plan.as_ref()) {
        return true;
    }
    let crosses = is_merge(plan.as_ref()) || plan.name() == "RepartitionExec";
    plan.children().into_iter().enumerate().any(|(k, child)| {
        if is_stage_input(plan.as_ref(), k, child) {
            plan.name() == "RepartitionExec"
        } else {
            crosses || shares_work(child)
        }
    })
}

/// How a stage's tasks split its work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TaskShape {
    /// One task runs every partition of the stage's top operator.
    Whole,
    /// Task `t` runs partition `t` of the top operator: consumer partition `t`.
    PerPartition,
    /// Task `t` runs partition `t` of the exchange's input and partitions its rows
    /// for the consumer.
    Exchange,
}

impl TaskShape {
    /// The shape of the stage whose top operator is `top` and its number of tasks.
    fn of(top: &Arc<dyn ExecutionPlan>) -> (TaskShape, usize) {
        if let Some(ex) = exchange(top.as_ref()) {
            if !shares_work(ex.input()) {
                let tasks = ex.input().properties().partitioning.partition_count();
                return (TaskShape::Exchange, tasks);
            }
        } else if !shares_work(top) {
            let tasks = top.properties().partitioning.partition_count();
            return (TaskShape::PerPartition, tasks);
        }
        (TaskShape::Whole, 1)
    }
}

/// Whether `parent`'s child number `k` may be cut below at all: the input of a
/// scalar subquery's operator holds expressions that the operator fills in with the
/// subqueries' values when it runs, so that input stays in its stage whole.
fn may_cut_below(parent: &dyn ExecutionPlan, k: usize) -> bool {
    !(k == 0 && parent.name() == "ScalarSubqueryExec")
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
    inputs: &BTreeMap<usize, StageFrames>,
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
        Ok(self.stage_plan(sql)?.0)
    }

    /// The stages of `sql` and the schema its answer is stored in (one planning).
    pub(super) fn stage_plan(&self, sql: &str) -> Result<(StagePlan, SchemaRef)> {
        let (logical, physical) = self.plan_for(sql, true)?;
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
                tasks: TaskShape::of(&c.plan).1,
                columns: c
                    .plan
                    .schema()
                    .fields()
                    .iter()
                    .map(|f| f.name().clone())
                    .collect(),
            })
            .collect();
        let plan = StagePlan {
            stages,
            ordered: is_ordered(&logical),
        };
        Ok((plan, StorageSchema::new(&physical.schema()).schema))
    }

    /// Runs every task of stage `stage` of `sql` here, at once, from its inputs'
    /// outputs (`inputs`: stage number → that stage's output, as earlier runs wrote it,
    /// in this process or others) and writes its output to memory elements, within the
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
        inputs: &BTreeMap<usize, StageFrames>,
    ) -> Result<StageOutput> {
        self.run_tasks(sql, stage, None, inputs)
    }

    /// Runs task `task` of stage `stage` of `sql` (one of [`Stage::tasks`]; the tasks of
    /// a stage need nothing from each other and may run in different processes at the
    /// same time) and writes its share of the stage's output: the frames it wrote for
    /// each partition. A stage's output is its tasks' outputs concatenated partition by
    /// partition, in task order. If the task fails, what it wrote is freed.
    ///
    /// # Errors
    /// As [`QuerySession::run_stage`]; [`Error::InvalidArgument`] for a task number
    /// the stage does not have.
    pub fn run_stage_task(
        &self,
        sql: &str,
        stage: usize,
        task: usize,
        inputs: &BTreeMap<usize, StageFrames>,
    ) -> Result<StageOutput> {
        self.run_tasks(sql, stage, Some(task), inputs)
    }

    /// Runs task `task` of stage `stage` (every task: None).
    fn run_tasks(
        &self,
        sql: &str,
        stage: usize,
        task: Option<usize>,
        inputs: &BTreeMap<usize, StageFrames>,
    ) -> Result<StageOutput> {
        let _running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        let before = self.measure_start();
        let (_, physical) = self.plan_for(sql, true)?;
        let cuts = cut(&physical);
        let count = cuts.len();
        let top = cuts.get(stage).map(|c| c.plan.clone()).ok_or_else(|| {
            Error::InvalidArgument(format!("stage {stage} of a query with {count} stages"))
        })?;
        let (shape, tasks) = TaskShape::of(&top);
        let tasks: Vec<usize> = match task {
            None => (0..tasks).collect(),
            Some(t) if t < tasks => vec![t],
            Some(t) => {
                return Err(Error::InvalidArgument(format!(
                    "task {t} of stage {stage}, which runs as {tasks} task(s)"
                )))
            }
        };
        let ids: HashMap<*const (), usize> = cuts
            .iter()
            .enumerate()
            .map(|(id, c)| (node_key(&c.plan), id))
            .collect();
        let wanted = &cuts[stage].inputs;
        if let Some(extra) = inputs.keys().find(|i| !wanted.contains(i)) {
            return Err(Error::InvalidArgument(format!(
                "stage {stage} reads stages {wanted:?}, not stage {extra}"
            )));
        }
        let batch_rows = self.ctx.state().config().batch_size();
        let mut plan = replace_inputs(&top, &ids, inputs, batch_rows)?;
        if shape == TaskShape::Whole {
            plan = self.one_writer_repartitions(plan, self.partitions())?;
        }
        let written = self.write_tasks(&plan, shape, &tasks);
        let scan_bytes = self.release_plan(plan);
        let frames = written?;
        let all = || frames.iter().flatten();
        let rows = all().map(RemoteFrame::rows).sum();
        let bytes_written = all().map(RemoteFrame::stored_bytes).sum();
        Ok(StageOutput {
            stats: self.measure_end(before, rows, scan_bytes),
            frames,
            bytes_written,
        })
    }

    /// Runs `tasks` of the stage whose plan (inputs replaced) is `plan`, all at once,
    /// and gathers what they wrote by partition.
    fn write_tasks(
        &self,
        plan: &Arc<dyn ExecutionPlan>,
        shape: TaskShape,
        tasks: &[usize],
    ) -> Result<StageFrames> {
        let partitions = plan.properties().partitioning.partition_count();
        let storage = StorageSchema::new(&plan.schema());
        let context = self.ctx.task_ctx();
        // (partition of the plan to execute, whether its rows are partitioned here)
        let units: Vec<(usize, bool)> = match shape {
            TaskShape::Whole => (0..partitions).map(|p| (p, false)).collect(),
            TaskShape::PerPartition => tasks.iter().map(|&t| (t, false)).collect(),
            TaskShape::Exchange => tasks.iter().map(|&t| (t, true)).collect(),
        };
        let spawned: Vec<_> = units
            .into_iter()
            .map(|(p, exchange_here)| {
                let (plan, context, storage) = (plan.clone(), context.clone(), storage.clone());
                let env = self.env().clone();
                self.runtime.spawn(async move {
                    // Operators may spawn tasks when executed: inside the runtime.
                    if exchange_here {
                        write_exchange(plan, p, context, storage, &env).await
                    } else {
                        let stream = plan.execute(p, context).map_err(super::query_error)?;
                        let writer = storage.writer(&env)?;
                        let frame = write_partition(stream, writer, storage).await?;
                        Ok(vec![(p, frame)])
                    }
                })
            })
            .collect();
        let results: Vec<Result<Vec<(usize, RemoteFrame)>>> = self.runtime.block_on(async {
            let mut out = Vec::with_capacity(spawned.len());
            for t in spawned {
                out.push(match t.await {
                    Ok(r) => r,
                    Err(e) => Err(Error::InvalidArgument(format!(
                        "a stage partition's task failed: {e}"
                    ))),
                });
            }
            out
        });
        let mut frames: StageFrames = (0..partitions).map(|_| Vec::new()).collect();
        let mut first_error = None;
        for r in results {
            match r {
                Ok(written) => {
                    for (q, f) in written {
                        match frames.get_mut(q) {
                            Some(list) if f.rows() > 0 => list.push(f),
                            _ => free_quietly(f),
                        }
                    }
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            None => Ok(frames),
            Some(e) => {
                frames.into_iter().flatten().for_each(free_quietly);
                Err(match e {
                    Error::Query(q) => self.run_error(*q),
                    other => other,
                })
            }
        }
    }
}

fn free_quietly(frame: RemoteFrame) {
    if let Err(free) = frame.free() {
        tracing::warn!(%free, "freeing a stage's output");
    }
}

/// Runs partition `p` of the input of the exchange `plan` and writes its rows
/// partitioned as the exchange would: one frame per partition of its output. On
/// failure frees what it wrote.
async fn write_exchange(
    plan: Arc<dyn ExecutionPlan>,
    p: usize,
    context: Arc<TaskContext>,
    storage: StorageSchema,
    env: &crate::env::FrameEnv,
) -> Result<Vec<(usize, RemoteFrame)>> {
    let ex = exchange(plan.as_ref()).ok_or_else(|| {
        Error::InvalidArgument(format!("stage top {} is not an exchange", plan.name()))
    })?;
    let partitioning = ex.partitioning().clone();
    let input = ex.input().clone();
    let outputs = partitioning.partition_count();
    let inputs = input.properties().partitioning.partition_count();
    let mut writers = (0..outputs)
        .map(|_| storage.writer(env))
        .collect::<Result<Vec<_>>>()?;
    let mut failure = None;
    let started = input
        .execute(p, context)
        .and_then(|stream| {
            BatchPartitioner::try_new(partitioning, df_metrics::Time::new(), p, inputs)
                .map(|partitioner| (stream, partitioner))
        })
        .map_err(super::query_error);
    match started {
        Err(e) => failure = Some(e),
        Ok((mut stream, mut partitioner)) => {
            while let Some(batch) = stream.next().await {
                let pushed = batch.map_err(super::query_error).and_then(|b| {
                    // The writer's own error, kept whole (the partitioner passes on
                    // only DataFusion errors).
                    let mut write_error = None;
                    let partitioned = partitioner.partition(b, |q, part| {
                        let done = storage.stored(&part).and_then(|part| {
                            tokio::task::block_in_place(|| match writers.get_mut(q) {
                                Some(w) => w.push_batch(&part),
                                None => Err(Error::InvalidArgument(format!(
                                    "exchange partition {q} of {outputs}"
                                ))),
                            })
                        });
                        done.map_err(|e| {
                            let text = e.to_string();
                            write_error = Some(e);
                            DataFusionError::Execution(text)
                        })
                    });
                    match write_error {
                        Some(e) => Err(e),
                        None => partitioned.map_err(super::query_error),
                    }
                });
                if let Err(e) = pushed {
                    failure = Some(e);
                    break;
                }
            }
        }
    }
    let mut frames = Vec::with_capacity(outputs);
    for (q, w) in writers.into_iter().enumerate() {
        match tokio::task::block_in_place(|| w.finish()) {
            Ok(f) => frames.push((q, f)),
            Err(e) => {
                failure.get_or_insert(e);
            }
        }
    }
    match failure {
        None => Ok(frames),
        Some(e) => {
            frames.into_iter().for_each(|(_, f)| free_quietly(f));
            Err(e)
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
    /// The frames of each partition.
    frames: StageFrames,
    schema: SchemaRef,
    batch_rows: usize,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl StageInputExec {
    fn new(
        stage: usize,
        replaced: &Arc<dyn ExecutionPlan>,
        frames: StageFrames,
        batch_rows: usize,
    ) -> Result<Self> {
        let schema = replaced.schema();
        let partitions = replaced.properties().partitioning.partition_count();
        if frames.len() != partitions {
            return Err(Error::InvalidArgument(format!(
                "stage {stage} has {partitions} output partitions here, its output has {} (was it planned with another budget, other partitions or other tables?)",
                frames.len()
            )));
        }
        let stored = StorageSchema::new(&schema).schema;
        // A frame listed twice would be read twice.
        let mut seen = std::collections::HashSet::new();
        for f in frames.iter().flatten() {
            if let Some(seal) = &f.meta().seal {
                if !seen.insert((seal.element.as_str(), seal.addr)) {
                    return Err(Error::InvalidArgument(format!(
                        "stage {stage}'s output lists frame {} twice",
                        f.label()
                    )));
                }
            }
        }
        for (k, f) in frames.iter().flatten().enumerate() {
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
            self.frames
                .iter()
                .flatten()
                .map(RemoteFrame::rows)
                .sum::<usize>()
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
            None => self.frames.iter().flatten().map(RemoteFrame::rows).sum(),
            Some(p) => self
                .frames
                .get(p)
                .map_or(0, |fs| fs.iter().map(RemoteFrame::rows).sum()),
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
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let frames = self.frames.get(partition).cloned().ok_or_else(|| {
            DataFusionError::Internal(format!(
                "StageInputExec has {} partitions, partition {partition} asked for",
                self.frames.len()
            ))
        })?;
        // No columns: the stored placeholder is not read, batches carry row counts.
        let columns: Arc<Vec<usize>> = Arc::new((0..self.schema.fields().len()).collect());
        let streams: Vec<SendableRecordBatchStream> = frames
            .into_iter()
            .map(|frame| {
                let chunks = frame.chunk_count();
                let reader = ChunkReader::new(
                    frame,
                    columns.clone(),
                    self.schema.clone(),
                    self.batch_rows,
                    None,
                    &context,
                )?;
                Ok(chunk_stream(
                    reader,
                    (0..chunks).collect(),
                    None,
                    &self.metrics,
                    partition,
                    None,
                ))
            })
            .collect::<DfResult<_>>()?;
        // The frames of a partition one after another.
        let stream = futures::stream::iter(streams).flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            stream,
        )))
    }
}
