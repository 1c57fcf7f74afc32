//! A hash join whose build side spills to memory elements.
//!
//! DataFusion's hash join holds its whole build side and fails when the memory pool
//! cannot take it. [`SpillingHashJoinExec`] wraps such a join and reads the build
//! side while its reservation grows (up to half the budget):
//! - if the whole side fits, the wrapped join runs as is on the rows read;
//! - if not, and the probe side turns out to fit (a quarter of the budget), the
//!   roles swap: the probe side is built, the build side probes. Build sides are
//!   chosen on estimates, which can be far off; this costs no spilling at all;
//! - otherwise it is a hybrid hash join: the build side is split by key hash into
//!   [`JOIN_FANOUT`] partitions, as many kept in memory as fit and the largest
//!   spilled to memory elements when memory runs short; the probe side's rows of
//!   partitions in memory are joined at once, those of spilled partitions written
//!   to a spill file per partition; then each spilled partition is joined from its
//!   two files, again through a spilling join (with a new hash seed), so that only a
//!   partition still too large (skew) is split again. Every spilled row is written
//!   once and read once.
//!
//! Join semantics (every join type, filters, projections) stay DataFusion's: every
//! key lands in exactly one partition, which is all an equi-join needs. Null-aware
//! anti joins (`NOT IN`) depend on the whole build side and are left unwrapped.

use std::fmt;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result as DfResult};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryLimit, MemoryReservation};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
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
use futures::lock::Mutex as AsyncMutex;
use futures::{StreamExt, TryStreamExt};

use super::grace::{
    level_seed, partition_stream, reserved_stream, HybridPartitions, OneShotExec, Partitioner,
    ProbeRouter, JOIN_FANOUT, MAX_LEVEL,
};
use super::key_bounds::JoinKeyFilter;
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
            // The wrapped join may see only some partitions of the build side, or
            // swapped roles: the wrapper publishes the probe keys' bounds itself.
            let copy = join.builder().reset_state().build()?;
            let mut wrapped = SpillingHashJoinExec::new(Arc::new(copy));
            wrapped.key_filter = JoinKeyFilter::of(join, wrapped.ways).map(Arc::new);
            Ok(Some(Arc::new(wrapped) as _))
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
        // partition. (Making such joins partitioned is left undone: with two
        // partitions it made a query hang, cause not found.)
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
    /// How many runs of this join share the budget at once (the partitions of the
    /// join at level 0), each taking its share.
    ways: usize,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
    /// The probe keys' dynamic filter, at level 0 (see [`super::key_bounds`]).
    key_filter: Option<Arc<JoinKeyFilter>>,
}

impl SpillingHashJoinExec {
    /// The join of a plan: its partitions run at once.
    fn new(join: Arc<HashJoinExec>) -> Self {
        let ways = join.properties().partitioning.partition_count().max(1);
        Self::nested(join, 0, ways)
    }

    /// A join over one partition of a join partitioned `level` times, which runs
    /// beside `ways - 1` others.
    fn nested(join: Arc<HashJoinExec>, level: u32, ways: usize) -> Self {
        let properties = join.properties().clone();
        SpillingHashJoinExec {
            join,
            level,
            ways,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
            key_filter: None,
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
        let join = Arc::new(join);
        let mut replaced = if self.level == 0 {
            SpillingHashJoinExec::new(join)
        } else {
            SpillingHashJoinExec::nested(join, self.level, self.ways)
        };
        replaced.key_filter = self.key_filter.clone();
        Ok(Arc::new(replaced))
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
            ways: self.ways,
            partition,
            context,
            metrics: self.metrics.clone(),
            spilled_partitions: MetricBuilder::new(&self.metrics)
                .counter("spilled_partitions", partition),
            swapped_roles: MetricBuilder::new(&self.metrics).counter("swapped_roles", partition),
            key_filter: self.key_filter.clone(),
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
    ways: usize,
    partition: usize,
    context: Arc<TaskContext>,
    metrics: ExecutionPlanMetricsSet,
    spilled_partitions: Count,
    swapped_roles: Count,
    key_filter: Option<Arc<JoinKeyFilter>>,
}

/// Rows read from one input before deciding how to join: the batches held under
/// `reservation`, and the first batch that did not fit (`None`: the input ended).
struct Prefix {
    held: Vec<RecordBatch>,
    reservation: MemoryReservation,
    overflow: Option<RecordBatch>,
}

impl Prefix {
    /// Reads `input` while `reservation` grows within `cap` bytes.
    async fn read(
        input: &mut SendableRecordBatchStream,
        reservation: MemoryReservation,
        cap: usize,
    ) -> DfResult<Self> {
        let mut held = Vec::new();
        while let Some(batch) = input.next().await {
            let batch = batch?;
            let need = build_cost(&batch);
            if reservation.size() + need <= cap && reservation.try_grow(need).is_ok() {
                held.push(batch);
            } else {
                return Ok(Prefix {
                    held,
                    reservation,
                    overflow: Some(batch),
                });
            }
        }
        Ok(Prefix {
            held,
            reservation,
            overflow: None,
        })
    }

    /// The rows read, then the rest of `rest`, as one stream that gives the held
    /// rows' memory back as it hands them on.
    fn chain(
        self,
        schema: SchemaRef,
        rest: SendableRecordBatchStream,
    ) -> SendableRecordBatchStream {
        let held = reserved_stream(schema.clone(), self.held, self.reservation, build_cost);
        let stream = held
            .chain(futures::stream::iter(self.overflow.map(Ok)))
            .chain(rest);
        Box::pin(RecordBatchStreamAdapter::new(schema, stream))
    }
}

impl JoinRun {
    fn consumer(&self, what: &str) -> MemoryReservation {
        MemoryConsumer::new(format!(
            "SpillingHashJoin[{}] {what} level {}",
            self.partition, self.level
        ))
        .with_can_spill(true)
        .register(self.context.memory_pool())
    }

    async fn start(self) -> DfResult<SendableRecordBatchStream> {
        let left_partition = match self.join.partition_mode() {
            PartitionMode::CollectLeft => 0,
            _ => self.partition,
        };
        let left_schema = self.join.left().schema();
        let right_schema = self.join.right().schema();
        let mut left = self
            .join
            .left()
            .execute(left_partition, self.context.clone())?;
        // The join's partitions run at the same time: the share of one.
        let limit = match self.context.memory_pool().memory_limit() {
            MemoryLimit::Finite(bytes) => bytes / self.ways,
            _ => usize::MAX,
        };
        // The join's hash table costs about as much again as the rows. A build side
        // may take at most half the budget, so that the operators feeding it (often
        // other joins) keep room while it is read.
        let build = Prefix::read(&mut left, self.consumer("build"), limit / 2).await?;
        let mut right = self
            .join
            .right()
            .execute(self.partition, self.context.clone())?;
        if build.overflow.is_none() {
            if let Some(f) = &self.key_filter {
                f.report(Some(f.bounds_of(&build.held)?))?;
            }
            // It fits: the wrapped join runs on the rows read. Its own reservation
            // takes over from ours batch by batch.
            let left = build.chain(left_schema, left);
            return self.inner_join(
                OneShotExec::new(left.schema(), left),
                OneShotExec::new(right_schema, right),
                false,
            );
        }
        // Operators below the probe side that hold memory of their own (joins,
        // final aggregates, sorts, windows) run only once the probe side is read:
        // rows kept here meanwhile would starve them. Then the build side is
        // spilled whole and its memory given back first.
        let probe_holds_memory = holds_memory(self.join.right().as_ref());
        // The build side is large. Estimates said it was the smaller side, but they
        // can be far off: if the probe side turns out to fit, the roles swap and
        // nothing spills.
        let probe = if self.swappable() && !probe_holds_memory {
            let probe = Prefix::read(&mut right, self.consumer("probe"), limit / 4).await?;
            if probe.overflow.is_none() {
                self.swapped_roles.add(1);
                // The probe side is read already; the build side never whole.
                if let Some(f) = &self.key_filter {
                    f.report(None)?;
                }
                let left = build.chain(left_schema, left);
                let right = probe.chain(right_schema, right);
                return self.swapped_join(left, right);
            }
            Some(probe)
        } else {
            None
        };
        // Both sides are large: a hybrid hash join. The build side is split into
        // partitions, as many kept in memory as fit and the rest spilled; the probe
        // side's rows of partitions in memory are joined at once, the others spilled
        // by partition and joined partition by partition afterwards.
        let seed = level_seed(self.level);
        let left_keys: Vec<_> = self.join.on().iter().map(|(l, _)| l.clone()).collect();
        let right_keys: Vec<_> = self.join.on().iter().map(|(_, r)| r.clone()).collect();
        let left_spill = Arc::new(SpillManager::new(
            self.context.runtime_env(),
            SpillMetrics::new(&self.metrics, self.partition),
            left_schema.clone(),
        ));
        let right_spill = Arc::new(SpillManager::new(
            self.context.runtime_env(),
            SpillMetrics::new(&self.metrics, self.partition),
            right_schema.clone(),
        ));
        let mut partitions = HybridPartitions::new(
            Partitioner::new(left_keys, seed, JOIN_FANOUT),
            left_spill.clone(),
            "hash join build",
            self.consumer("build partitions"),
            if probe_holds_memory { 0 } else { limit / 2 },
            build_cost,
        );
        // The rows read so far are handed to the partitions one by one, each giving
        // its share back as it goes, so nothing is counted twice.
        let mut rows = build.chain(left_schema.clone(), left);
        let mut bounds = self.key_filter.as_ref().map(|f| f.bounds());
        while let Some(batch) = rows.next().await {
            let batch = batch?;
            if let Some(b) = &mut bounds {
                b.add(&batch)?;
            }
            partitions.push(&batch)?;
        }
        drop(rows);
        let build = partitions.finish()?;
        if let Some(f) = &self.key_filter {
            f.report(bounds)?;
        }
        let spilled = build.spilled.iter().filter(|&&s| s).count();
        self.spilled_partitions.add(spilled);
        let right = match probe {
            Some(probe) => probe.chain(right_schema.clone(), right),
            None => right,
        };
        let router = Arc::new(AsyncMutex::new(ProbeRouter::new(
            right,
            Partitioner::new(right_keys, seed, JOIN_FANOUT),
            build.spilled.clone(),
            right_spill.clone(),
            "hash join probe",
        )));
        let held_probe = futures::stream::unfold(router.clone(), |router| async move {
            let next = router.lock().await.next_held().await;
            next.map(|batch| (batch, router))
        });
        // Also without rows in memory: probe rows of partitions no build row fell
        // in may still be output (outer joins). Rows the join does not ask for
        // (nothing they could produce) are read past by `files` below.
        let held = reserved_stream(
            left_schema.clone(),
            build.held,
            build.reservation,
            build_cost,
        );
        let held_probe = Box::pin(RecordBatchStreamAdapter::new(
            right_schema.clone(),
            held_probe,
        ));
        let joined_in_memory = self.inner_join(
            OneShotExec::new(left_schema.clone(), held),
            OneShotExec::new(right_schema.clone(), held_probe),
            false,
        )?;
        let build_files = build.files;
        let batch_rows = self.context.session_config().batch_size();
        let schema = self.join.schema();
        let fetch = self.join.fetch();
        let run = Arc::new(self);
        let spilled_joins = futures::stream::once(async move {
            let probe_files = router.lock().await.files().await?;
            let parts = build_files
                .into_iter()
                .zip(probe_files)
                .filter(|(l, _)| l.is_some());
            let joins = futures::stream::iter(parts).map(move |(l, r)| {
                run.inner_join(
                    OneShotExec::new(
                        left_schema.clone(),
                        partition_stream(&left_spill, l, batch_rows)?,
                    ),
                    OneShotExec::new(
                        right_schema.clone(),
                        partition_stream(&right_spill, r, batch_rows)?,
                    ),
                    true,
                )
            });
            Ok::<_, DataFusionError>(joins.try_flatten())
        })
        .try_flatten();
        let joined = joined_in_memory.chain(spilled_joins);
        Ok(match fetch {
            // Each partition's join stops at the limit on its own.
            Some(rows) => Box::pin(RecordBatchStreamAdapter::new(
                schema,
                limit_rows(joined, rows),
            )),
            None => Box::pin(RecordBatchStreamAdapter::new(schema, joined)),
        })
    }

    /// Whether the join may run with its inputs' roles swapped: its type allows it
    /// and nothing above relies on the probe side's order.
    fn swappable(&self) -> bool {
        !self.join.null_aware
            && self.join.join_type().supports_swap()
            && self.join.properties().output_ordering().is_none()
    }

    /// The join with `right` (which fits) as its build side and `left` probing it.
    fn swapped_join(
        &self,
        left: SendableRecordBatchStream,
        right: SendableRecordBatchStream,
    ) -> DfResult<SendableRecordBatchStream> {
        let join = self.over(
            OneShotExec::new(left.schema(), left),
            OneShotExec::new(right.schema(), right),
        )?;
        join.swap_inputs(PartitionMode::CollectLeft)?
            .execute(0, self.context.clone())
    }

    /// The wrapped join over one-partition inputs.
    fn over(&self, left: OneShotExec, right: OneShotExec) -> DfResult<HashJoinExec> {
        self.join
            .builder()
            .with_new_children(vec![Arc::new(left), Arc::new(right)])?
            .with_partition_mode(PartitionMode::CollectLeft)
            .reset_state()
            .recompute_properties()
            .build()
    }

    /// Runs the wrapped join on one-partition inputs; `nested` wraps it again one
    /// level deeper so that a partition still too large is split again.
    fn inner_join(
        &self,
        left: OneShotExec,
        right: OneShotExec,
        nested: bool,
    ) -> DfResult<SendableRecordBatchStream> {
        let join = self.over(left, right)?;
        let plan: Arc<dyn ExecutionPlan> = if nested && self.level < MAX_LEVEL {
            Arc::new(SpillingHashJoinExec::nested(
                Arc::new(join),
                self.level + 1,
                self.ways,
            ))
        } else {
            Arc::new(join)
        };
        plan.execute(0, self.context.clone())
    }
}

/// Whether running `plan` holds memory beyond a batch at a time: a join's build
/// side, a final aggregate's groups, a sort's runs, a window's partitions.
fn holds_memory(plan: &dyn ExecutionPlan) -> bool {
    let own = match plan.downcast_ref::<AggregateExec>() {
        // Partial aggregates emit early when memory runs short.
        Some(agg) => *agg.mode() != AggregateMode::Partial,
        None => matches!(
            plan.name(),
            "HashJoinExec"
                | "SpillingHashJoinExec"
                | "SortMergeJoinExec"
                | "NestedLoopJoinExec"
                | "CrossJoinExec"
                | "SymmetricHashJoinExec"
                | "SortExec"
                | "SpillingAggregateExec"
                | "WindowAggExec"
                | "PartitionedWindowExec"
        ),
    };
    own || plan
        .children()
        .into_iter()
        .any(|c| holds_memory(c.as_ref()))
}

/// The first `rows` rows of `input`.
fn limit_rows<S>(input: S, rows: usize) -> impl futures::Stream<Item = DfResult<RecordBatch>>
where
    S: futures::Stream<Item = DfResult<RecordBatch>>,
{
    input.scan(rows, |left, batch| {
        let out = match batch {
            Ok(_) if *left == 0 => None,
            Ok(b) => {
                let take = b.num_rows().min(*left);
                *left -= take;
                Some(Ok(b.slice(0, take)))
            }
            Err(e) => Some(Err(e)),
        };
        futures::future::ready(out)
    })
}

/// What a build-side batch reserves: the rows and about as much again for the join's
/// hash table.
fn build_cost(batch: &RecordBatch) -> usize {
    2 * batch.get_array_memory_size()
}

#[cfg(test)]
mod tests {
    use polars::prelude::{df, DataFrame, SortMultipleOptions};

    use super::*;
    use crate::budget::Budget;
    use crate::env::FrameEnv;
    use crate::frame::RemoteFrame;
    use crate::query::test_env::local_env;
    use crate::query::{QueryOutput, QuerySession};

    /// Rows of each table.
    const ROWS: i64 = 40_000;

    /// `big` (keys 0..ROWS, a payload) and `small` (every fourth key), in local
    /// memory elements.
    fn env_and_frames() -> (FrameEnv, Vec<(&'static str, RemoteFrame)>) {
        let env = local_env(2, 128 << 20);
        let big = df!(
            "b_key" => (0..ROWS).collect::<Vec<_>>(),
            "b_val" => (0..ROWS).map(|i| i * 7 % 1000).collect::<Vec<_>>(),
            "b_pad" => (0..ROWS).map(|i| i * 3).collect::<Vec<_>>()
        )
        .unwrap();
        let small = df!(
            "s_key" => (0..ROWS).step_by(4).collect::<Vec<_>>(),
            "s_val" => (0..ROWS).step_by(4).map(|i| i % 13).collect::<Vec<_>>()
        )
        .unwrap();
        let frames = vec![
            ("big", RemoteFrame::from_polars(&env, &big).unwrap()),
            ("small", RemoteFrame::from_polars(&env, &small).unwrap()),
        ];
        (env, frames)
    }

    /// Runs `sql` at `budget` (`None`: unlimited); returns the output and its rows
    /// sorted by the first column (the queries have no ORDER BY: a sort could spill
    /// too).
    fn run(
        env: &FrameEnv,
        frames: &[(&str, RemoteFrame)],
        budget: Option<u64>,
        sql: &str,
    ) -> (QueryOutput, DataFrame) {
        let env = env.with_budget(Budget::from_limit(budget).unwrap());
        let session = QuerySession::with_partitions(&env, 1).unwrap();
        for (name, frame) in frames {
            session.register(name, frame).unwrap();
        }
        let out = session.sql(sql).unwrap();
        assert_eq!(session.spill_bytes_held(), 0, "spill memory left behind");
        let got = out.to_polars().unwrap();
        let first = got.get_column_names()[0].clone();
        let got = got.sort([first], SortMultipleOptions::default()).unwrap();
        (out, got)
    }

    /// The sum of metric `name` over the plan's operators that `pick` chooses.
    fn plan_metric(out: &QueryOutput, name: &str, pick: fn(&dyn ExecutionPlan) -> bool) -> usize {
        fn walk(
            plan: &dyn ExecutionPlan,
            name: &str,
            pick: fn(&dyn ExecutionPlan) -> bool,
        ) -> usize {
            let own = if pick(plan) {
                plan.metrics()
                    .and_then(|m| m.sum_by_name(name))
                    .map_or(0, |v| v.as_usize())
            } else {
                0
            };
            own + plan
                .children()
                .into_iter()
                .map(|c| walk(c.as_ref(), name, pick))
                .sum::<usize>()
        }
        walk(out.plan.as_ref(), name, pick)
    }

    /// The sum of a metric over the plan's spilling joins.
    fn join_metric(out: &QueryOutput, name: &str) -> usize {
        plan_metric(out, name, |p| {
            p.downcast_ref::<SpillingHashJoinExec>().is_some()
        })
    }

    /// The chunks a query's scans skipped on dynamic filters.
    fn chunks_pruned(out: &QueryOutput) -> usize {
        plan_metric(out, "chunks_pruned", |p| p.name() == "RemoteScanExec")
    }

    // Every key of `small` matches once in `big`: ROWS / 4 rows.
    const SQL: &str = "SELECT s_key, s_val, b_val FROM small JOIN big ON s_key = b_key";

    #[test]
    fn a_build_side_that_fits_spills_nothing() {
        let (env, frames) = env_and_frames();
        let (_, want) = run(&env, &frames, None, SQL);
        assert_eq!(want.height(), ROWS as usize / 4);
        let (out, got) = run(&env, &frames, Some(64 << 20), SQL);
        assert!(got.equals_missing(&want));
        assert_eq!(out.stats().spill_files, 0);
        assert_eq!(join_metric(&out, "swapped_roles"), 0);
        assert_eq!(join_metric(&out, "spilled_partitions"), 0);
    }

    #[test]
    fn a_build_side_estimated_small_but_large_swaps_roles_instead_of_spilling() {
        // `b_pad >= 0` keeps every row of big; estimated from the predicate's shape
        // it keeps a third, so big (filtered) looks smaller than small and is built.
        let sql = "SELECT s_key, s_val, b_val FROM small JOIN \
                   (SELECT * FROM big WHERE b_pad >= 0 AND b_val >= 0) b ON s_key = b_key";
        let (env, frames) = env_and_frames();
        let (_, want) = run(&env, &frames, None, sql);
        // Big's three columns cost 2 x 960 KB built, beyond half of 1.5 MB; small's
        // two, 2 x 160 KB, fit in a quarter.
        let (out, got) = run(&env, &frames, Some(1536 << 10), sql);
        assert!(got.equals_missing(&want));
        assert_eq!(
            join_metric(&out, "swapped_roles"),
            1,
            "{}",
            out.explain_analyze()
        );
        assert_eq!(out.stats().spill_files, 0, "{}", out.explain_analyze());
    }

    #[test]
    fn a_hybrid_join_spills_some_partitions_once_and_keeps_the_rest_in_memory() {
        // Both sides large: big joined with itself.
        let sql = "SELECT a.b_key, b.b_pad FROM big a JOIN big b ON a.b_key = b.b_key";
        let (env, frames) = env_and_frames();
        let (_, want) = run(&env, &frames, None, sql);
        assert_eq!(want.height(), ROWS as usize);
        let (out, got) = run(&env, &frames, Some(1 << 20), sql);
        assert!(got.equals_missing(&want));
        let text = out.explain_analyze();
        let spilled = join_metric(&out, "spilled_partitions");
        assert_eq!(join_metric(&out, "swapped_roles"), 0, "{text}");
        // Some partitions stay in memory; each spilled one is one file a side, no
        // partition is split again.
        assert!(spilled > 0 && spilled < JOIN_FANOUT, "{spilled}: {text}");
        assert_eq!(out.stats().spill_files, 2 * spilled as u64, "{text}");
        // Every spilled row is written once and read once.
        assert_eq!(
            out.stats().spill_bytes_written,
            out.stats().spill_bytes_read,
            "{text}"
        );
    }

    #[test]
    fn probe_sides_with_their_own_breakers_are_told_apart_from_pipelines() {
        let (env, frames) = env_and_frames();
        let session =
            QuerySession::with_partitions(&env.with_budget(Budget::bytes(1 << 20).unwrap()), 1)
                .unwrap();
        for (name, frame) in &frames {
            session.register(name, frame).unwrap();
        }
        let holds = |sql: &str| holds_memory(session.plan(sql).unwrap().1.as_ref());
        assert!(!holds("SELECT b_key, b_val + 1 FROM big WHERE b_val > 3"));
        assert!(holds("SELECT b_val, sum(b_pad) FROM big GROUP BY b_val"));
        assert!(holds("SELECT b_key FROM big ORDER BY b_pad"));
        assert!(holds(SQL));
    }

    #[test]
    fn a_hybrid_join_dropped_midway_frees_its_spill_files() {
        let sql = "SELECT a.b_key, b.b_pad FROM big a JOIN big b ON a.b_key = b.b_key";
        let (env, frames) = env_and_frames();
        let session =
            QuerySession::with_partitions(&env.with_budget(Budget::bytes(1 << 20).unwrap()), 1)
                .unwrap();
        for (name, frame) in &frames {
            session.register(name, frame).unwrap();
        }
        let (_, plan) = session.plan(sql).unwrap();
        let mut stream = plan.execute(0, session.ctx.task_ctx()).unwrap();
        let first = session.runtime.block_on(stream.next()).unwrap().unwrap();
        assert!(first.num_rows() > 0);
        // The build side is partitioned by now, some partitions in memory elements.
        assert!(session.spill_bytes_held() > 0);
        drop(stream);
        session.await_spill_release();
        assert_eq!(session.spill_bytes_held(), 0, "spill files left behind");
    }

    #[test]
    fn a_partition_too_large_for_its_share_is_split_at_the_next_level() {
        // 200,000 unique keys joined with themselves at 96 KiB: all 64 partitions
        // spill (a file a side), and their nested joins spill again.
        let sql = "SELECT a.k, b.v FROM t a JOIN t b ON a.k = b.k";
        let (env, _) = env_and_frames();
        let rows = 200_000i64;
        let t = df!(
            "k" => (0..rows).collect::<Vec<_>>(),
            "v" => (0..rows).map(|i| i * 3).collect::<Vec<_>>()
        )
        .unwrap();
        let frames = vec![("t", RemoteFrame::from_polars(&env, &t).unwrap())];
        let (_, want) = run(&env, &frames, None, sql);
        assert_eq!(want.height(), rows as usize);
        let (out, got) = run(&env, &frames, Some(96 << 10), sql);
        assert!(got.equals_missing(&want));
        let text = out.explain_analyze();
        assert_eq!(
            join_metric(&out, "spilled_partitions"),
            JOIN_FANOUT,
            "{text}"
        );
        assert_eq!(out.stats().spill_files, 4 * JOIN_FANOUT as u64, "{text}");
        assert_eq!(
            out.stats().spill_bytes_written,
            out.stats().spill_bytes_read,
            "{text}"
        );
        assert!(out.stats().peak_local_bytes <= 96 << 10);
    }

    #[test]
    fn the_probe_scan_skips_chunks_outside_the_build_keys() {
        // big is stored in key order, 4,096 rows a chunk (10 chunks). `b_pad < 3000`
        // keeps keys 0..999 of the build side, which the planner cannot tell from
        // the predicate: the probe side's scan learns it when the build side is read
        // and reads the first chunk only.
        let sql = "SELECT a.b_key, b.b_val FROM big a JOIN big b ON a.b_key = b.b_key \
                   WHERE a.b_pad < 3000";
        let (env, frames) = env_and_frames();
        let (out, want) = run(&env, &frames, None, sql);
        assert_eq!(want.height(), 1000);
        assert_eq!(chunks_pruned(&out), 9, "{}", out.explain_analyze());
        let (out, got) = run(&env, &frames, Some(64 << 20), sql);
        assert!(got.equals_missing(&want));
        assert_eq!(chunks_pruned(&out), 9, "{}", out.explain_analyze());
    }

    #[test]
    fn a_hybrid_join_publishes_bounds_over_all_its_partitions() {
        // Keys 0..9,999 built (30,000 rows of big filtered on b_pad, too many for
        // the budget): a hybrid join, whose in-memory partitions alone would give
        // narrower bounds. The probe scan skips chunks 3..9 and the answer is whole.
        let sql = "SELECT a.b_key, b.b_val FROM big a JOIN big b ON a.b_key = b.b_key \
                   WHERE a.b_pad < 30000";
        let (env, frames) = env_and_frames();
        let (_, want) = run(&env, &frames, None, sql);
        assert_eq!(want.height(), 10_000);
        let (out, got) = run(&env, &frames, Some(128 << 10), sql);
        assert!(got.equals_missing(&want));
        let text = out.explain_analyze();
        assert!(join_metric(&out, "spilled_partitions") > 0, "{text}");
        assert_eq!(chunks_pruned(&out), 7, "{text}");
    }
}
