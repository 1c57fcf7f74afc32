//! A hash join whose build side spills to memory elements.
//!
//! DataFusion's hash join holds its whole build side and fails when the memory pool
//! cannot take it. [`SpillingHashJoinExec`] wraps such a join: it reads the build side
//! while its reservation grows; if the whole side fits, the wrapped join runs as is on
//! the rows read. If not, both sides are hash-partitioned on the join keys into spill
//! files in memory elements (a grace hash join), and the wrapped join runs partition by
//! partition, each partition again through a spilling join with a new hash seed, so a
//! partition that is still too large is split again. Join semantics (every join type,
//! filters, projections) stay DataFusion's: every key lands in exactly one partition,
//! which is all an equi-join needs. Null-aware anti joins (`NOT IN`) depend on the
//! whole build side and are left unwrapped.

use std::fmt;
use std::sync::Arc;

use arrow_array::RecordBatch;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::Result as DfResult;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryLimit};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet, SpillMetrics,
};
use datafusion::physical_plan::spill::SpillManager;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, ReplaceChildrenOptions,
    SendableRecordBatchStream,
};
use futures::{StreamExt, TryStreamExt};

use super::grace::{
    level_seed, partition_stream, reserved_stream, spill_partitioned, OneShotExec, FANOUT,
    MAX_LEVEL,
};
use super::operator::replace_each;

/// Replaces DataFusion's hash joins by [`SpillingHashJoinExec`] (a physical optimizer
/// rule, added when the session has a budget).
#[derive(Debug, Default)]
pub(crate) struct SpillingJoins;

impl PhysicalOptimizerRule for SpillingJoins {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        replace_each(plan, |join: &HashJoinExec| {
            if join.null_aware || !wrappable(join) {
                return Ok(None);
            }
            let copy = join.builder().build()?;
            Ok(Some(
                Arc::new(SpillingHashJoinExec::new(Arc::new(copy), 0)) as _
            ))
        })
    }

    fn name(&self) -> &str {
        "scad_spilling_hash_joins"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

fn wrappable(join: &HashJoinExec) -> bool {
    match join.partition_mode() {
        PartitionMode::Partitioned => true,
        // One output partition only: DataFusion's own join collects the build side
        // once for all its output partitions, ours would read (and hold) it once per
        // partition. (Turning such joins into partitioned ones made q21 hang at SF 1
        // with two partitions; left for the join-order work.)
        PartitionMode::CollectLeft => {
            join.left().properties().partitioning.partition_count() == 1
                && join.properties().partitioning.partition_count() == 1
        }
        PartitionMode::Auto => false,
    }
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct SpillingHashJoinExec {
    join: Arc<HashJoinExec>,
    level: u32,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl SpillingHashJoinExec {
    fn new(join: Arc<HashJoinExec>, level: u32) -> Self {
        let properties = join.properties().clone();
        SpillingHashJoinExec {
            join,
            level,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }
}

impl DisplayAs for SpillingHashJoinExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "SpillingHashJoinExec: level={}, wraps ", self.level)?;
        self.join.fmt_as(t, f)
    }
}

impl ExecutionPlan for SpillingHashJoinExec {
    fn name(&self) -> &str {
        "SpillingHashJoinExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![self.join.left(), self.join.right()]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        self.join.apply_expressions(f)
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let join = self
            .join
            .builder()
            .with_new_children(children)?
            .recompute_properties()
            .build()?;
        Ok(Arc::new(SpillingHashJoinExec::new(
            Arc::new(join),
            self.level,
        )))
    }

    super::operator::with_new_children_by_replace!();

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let run = JoinRun {
            join: self.join.clone(),
            level: self.level,
            partition,
            context,
            metrics: self.metrics.clone(),
            spilled_partitions: MetricBuilder::new(&self.metrics)
                .counter("spilled_partitions", partition),
        };
        let schema = self.join.schema();
        let stream = futures::stream::once(run.start()).try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

/// One partition's execution.
struct JoinRun {
    join: Arc<HashJoinExec>,
    level: u32,
    partition: usize,
    context: Arc<TaskContext>,
    metrics: ExecutionPlanMetricsSet,
    spilled_partitions: Count,
}

impl JoinRun {
    async fn start(self) -> DfResult<SendableRecordBatchStream> {
        let left_partition = match self.join.partition_mode() {
            PartitionMode::CollectLeft => 0,
            _ => self.partition,
        };
        let left_schema = self.join.left().schema();
        let mut left = self
            .join
            .left()
            .execute(left_partition, self.context.clone())?;
        let reservation = MemoryConsumer::new(format!(
            "SpillingHashJoin[{}] build level {}",
            self.partition, self.level
        ))
        .with_can_spill(true)
        .register(self.context.memory_pool());
        let build_cap = match self.context.memory_pool().memory_limit() {
            MemoryLimit::Finite(bytes) => bytes / 2,
            _ => usize::MAX,
        };
        let mut build = Vec::new();
        let mut overflow = None;
        while let Some(batch) = left.next().await {
            let batch = batch?;
            // The join's hash table costs about as much again as the rows. A build
            // side may take at most half the budget, so that the operators feeding
            // it (often other joins) keep room while it is read.
            let need = build_cost(&batch);
            if reservation.size() + need <= build_cap && reservation.try_grow(need).is_ok() {
                build.push(batch);
            } else {
                overflow = Some(batch);
                break;
            }
        }
        let right = self
            .join
            .right()
            .execute(self.partition, self.context.clone())?;
        let Some(first_overflow) = overflow else {
            // It fits: the wrapped join runs on the rows read. Its own reservation
            // takes over from ours batch by batch.
            let left = OneShotExec::new(
                left_schema.clone(),
                reserved_stream(left_schema, build, reservation, build_cost),
            );
            return self.inner_join(
                left,
                OneShotExec::new(self.join.right().schema(), right),
                false,
            );
        };
        // Too large: partition both sides into memory elements.
        self.spilled_partitions.add(FANOUT);
        let seed = level_seed(self.level);
        let left_keys: Vec<_> = self.join.on().iter().map(|(l, _)| l.clone()).collect();
        let right_keys: Vec<_> = self.join.on().iter().map(|(_, r)| r.clone()).collect();
        let left_spill = SpillManager::new(
            self.context.runtime_env(),
            SpillMetrics::new(&self.metrics, self.partition),
            left_schema.clone(),
        );
        let buffered = futures::stream::iter(build.into_iter().chain([first_overflow]).map(Ok));
        let left_files = spill_partitioned(
            &left_spill,
            &left_keys,
            seed,
            "hash join build",
            buffered.chain(left),
        )
        .await?;
        reservation.free();
        let right_schema = self.join.right().schema();
        let right_spill = SpillManager::new(
            self.context.runtime_env(),
            SpillMetrics::new(&self.metrics, self.partition),
            right_schema,
        );
        let right_files =
            spill_partitioned(&right_spill, &right_keys, seed, "hash join probe", right).await?;
        let spills = Arc::new((left_spill, right_spill));
        let schema = self.join.schema();
        let parts = left_files.into_iter().zip(right_files);
        let runs = futures::stream::iter(parts).map(move |(l, r)| {
            let (ls, rs) = &*spills;
            self.inner_join(
                OneShotExec::new(ls.schema().clone(), partition_stream(ls, l)?),
                OneShotExec::new(rs.schema().clone(), partition_stream(rs, r)?),
                true,
            )
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            schema,
            runs.try_flatten(),
        )))
    }

    /// Runs the wrapped join on one-partition inputs; `nested` wraps it again one
    /// level deeper so that a partition still too large is split again.
    fn inner_join(
        &self,
        left: OneShotExec,
        right: OneShotExec,
        nested: bool,
    ) -> DfResult<SendableRecordBatchStream> {
        let join = self
            .join
            .builder()
            .with_new_children(vec![Arc::new(left), Arc::new(right)])?
            .with_partition_mode(PartitionMode::CollectLeft)
            .reset_state()
            .recompute_properties()
            .build()?;
        let plan: Arc<dyn ExecutionPlan> = if nested && self.level < MAX_LEVEL {
            Arc::new(SpillingHashJoinExec::new(Arc::new(join), self.level + 1))
        } else {
            Arc::new(join)
        };
        plan.execute(0, self.context.clone())
    }
}

/// What a build-side batch reserves: the rows and about as much again for the join's
/// hash table.
fn build_cost(batch: &RecordBatch) -> usize {
    2 * batch.get_array_memory_size()
}
