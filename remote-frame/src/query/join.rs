//! A hash join whose build side spills to memory elements.
//!
//! DataFusion's hash join holds its whole build side and fails when the memory pool
//! cannot take it. [`SpillingHashJoinExec`] wraps such a join and reads the build
//! side while its reservation grows (up to half the budget):
//! - if the whole side fits, the wrapped join runs as is on the rows read, or,
//!   where its output is the probe rows whose one integer key is among the build
//!   keys (no build column output), as a filter of the probe rows
//!   ([`super::probe_filter`]);
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
//! A partition still too large after [`MAX_LEVEL`] levels holds a key value more
//! frequent than the budget allows, which no hash splits (see [`super::skew`]). Its
//! join depends on the join type:
//! - where the output is a union over pieces of the build side (every build row's
//!   output depends on that row and the whole probe side: inner, left, left semi,
//!   left anti and left mark joins), a block nested loop: the build partition is read
//!   in pieces that fit, and the whole probe partition (a spill file, read again for
//!   each piece) streams through a hash join on each piece (metric `skew_pieces`);
//! - where the build side contributes only its keys (right semi, right anti and
//!   right mark joins without a filter on build columns), one build row per key value
//!   is all the join needs (metric `skew_duplicates`: build rows dropped);
//! - otherwise, or when the distinct keys do not fit either, the roles swap if the
//!   probe partition fits, and if not the join fails with [`Error::Skew`] naming the
//!   most frequent build key.
//!
//! A join that collects its build side once for all its partitions (one estimated
//! small, over several partitions) reads it once, in whichever partition asks
//! first ([`SharedBuild`]): held whole if it fits half the budget (most of it when
//! the join is the plan's only operator that holds memory), and then
//! DataFusion's join probes it from every partition; if not, it is a hybrid hash
//! join whose partitions in memory every partition probes, each partition routing
//! its probe rows of the spilled ones to files of its own and joining them with the
//! shared build files. Such a join is collected only where no build row's output
//! depends on the other partitions' probe rows (not left, full, left semi, left anti
//! or left mark joins, which are partitioned by key instead).
//!
//! Join semantics (every join type, filters, projections) stay DataFusion's: every
//! key lands in exactly one partition, which is all an equi-join needs. Null-aware
//! anti joins (`NOT IN`) depend on the whole build side and are left unwrapped.
//!
//! [`Error::Skew`]: crate::Error::Skew

use std::fmt;
use std::sync::{Arc, PoisonError};

use arrow_array::RecordBatch;
use arrow_schema::DataType;
use arrow_schema::SchemaRef;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::utils::memory::estimate_memory_size;
use datafusion::common::{
    DataFusionError, JoinSide, JoinType, NullEquality, Result as DfResult, ScalarValue,
};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::{SpillFile, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet, SpillMetrics,
};
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::spill::SpillManager;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
    ReplaceChildrenOptions, SendableRecordBatchStream,
};
use futures::future::{BoxFuture, Shared};
use futures::lock::Mutex as AsyncMutex;
use futures::{FutureExt, StreamExt, TryStreamExt};

use super::grace::{
    grow_within, level_seed, partition_stream, reserved_stream, split_fanout, HybridPartitions,
    OneShotExec, PartitionedBuild, Partitioner, ProbeRouter, JOIN_FANOUT, MAX_LEVEL, SPLIT_FANOUT,
};
use super::join_order;
use super::key_bounds::{greatest, least, min_max, JoinKeyFilter};
use super::operator::{
    budget_bytes, holder_cap, holds_memory, limit_rows, memory_holders, memory_holders_but,
    replace_each,
};
use super::owned::{owned_if_shared, take_rows};
use super::probe_filter::{ProbeFilter, ProbeFilterShape};
use super::reserved_pool::ReservedPool;
use super::skew::{most_frequent_key, skew_error, DistinctKeys};

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
        let sole = memory_holders(plan.as_ref()) == 1;
        replace_each(plan, |join: &HashJoinExec| {
            if join.null_aware {
                return Ok(None);
            }
            let copy =
                if collects_for_partitions(join) && keeps_unmatched_build_rows(*join.join_type()) {
                    by_key_partitions(join)?
                } else {
                    join.builder().reset_state().build()?
                };
            let Some(shared) = wrappable(&copy) else {
                return Ok(None);
            };
            // The wrapped join may see only some partitions of the build side, or
            // swapped roles: the wrapper publishes the probe keys' bounds itself.
            let repartitioned = *copy.partition_mode() == PartitionMode::Partitioned;
            let build_bytes = join_order::estimated_bytes(copy.left());
            let mut wrapped = SpillingHashJoinExec::new(Arc::new(copy), sole);
            // Each partition of a join partitioned by key builds on its share.
            wrapped.build_estimate = build_bytes.map(|b| match repartitioned {
                true => b / wrapped.ways,
                false => b,
            });
            let mut reporters = wrapped.ways;
            if shared {
                wrapped.shared = Some(Arc::new(SharedBuild::new(wrapped.ways)));
                reporters = 1;
            }
            wrapped.key_filter = JoinKeyFilter::of(join, reporters, repartitioned).map(Arc::new);
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

/// Whether an operator of a probe side other than a spilling join holds memory. A
/// spilling join below reads its own build side only once probing starts, and
/// spills what finds no room; a final aggregate, sort or window below needs room
/// then that build rows kept here would take.
fn probe_holds_memory_besides_joins(probe: &dyn ExecutionPlan) -> bool {
    memory_holders_but(probe, &|p| {
        p.downcast_ref::<SpillingHashJoinExec>().is_some()
    }) > 0
}

/// Whether `join` collects its build side once for several output partitions.
fn collects_for_partitions(join: &HashJoinExec) -> bool {
    *join.partition_mode() == PartitionMode::CollectLeft
        && join.left().properties().partitioning.partition_count() == 1
        && join.properties().partitioning.partition_count() > 1
}

/// A collecting join over several partitions as a join partitioned by its keys:
/// both inputs repartitioned by key hash, each partition joining its own. So that
/// it can spill where its output depends on the build rows no partition matched
/// (see [`wrappable`]): such a join collected was DataFusion's, which holds its
/// whole build side or fails (q75 at 25 MiB: three left joins' sales sides held at
/// once, estimated small).
fn by_key_partitions(join: &HashJoinExec) -> DfResult<HashJoinExec> {
    let partitions = join.properties().partitioning.partition_count();
    let by_keys = |input: &Arc<dyn ExecutionPlan>, keys: Vec<Arc<dyn PhysicalExpr>>| {
        RepartitionExec::try_new(input.clone(), Partitioning::Hash(keys, partitions))
            .map(|r| Arc::new(r) as Arc<dyn ExecutionPlan>)
    };
    let left = by_keys(join.left(), build_keys(join))?;
    let right = by_keys(join.right(), probe_keys(join))?;
    join.builder()
        .with_new_children(vec![left, right])?
        .with_partition_mode(PartitionMode::Partitioned)
        .reset_state()
        .recompute_properties()
        .build()
}

/// The join's keys on its build (left) side.
fn build_keys(join: &HashJoinExec) -> Vec<Arc<dyn PhysicalExpr>> {
    join.on().iter().map(|(l, _)| l.clone()).collect()
}

/// The join's keys on its probe (right) side.
fn probe_keys(join: &HashJoinExec) -> Vec<Arc<dyn PhysicalExpr>> {
    join.on().iter().map(|(_, r)| r.clone()).collect()
}

/// Whether `join` is wrapped (`Some`), and if so whether its build side is read
/// once for all its partitions (`Some(true)`).
fn wrappable(join: &HashJoinExec) -> Option<bool> {
    match join.partition_mode() {
        PartitionMode::Partitioned => Some(false),
        // DataFusion's own join collects the build side once for all its output
        // partitions; so does ours ([`SharedBuild`]), where the output does not
        // depend on which build rows no partition matched: a build row unmatched
        // in one partition's probe rows may be matched in another's, and spilled
        // partitions are joined by every partition apart. Such joins come here
        // partitioned ([`by_key_partitions`]). With several partitions only build
        // sides estimated small are collected (see `collected_build_threshold`); the
        // others are partitioned.
        PartitionMode::CollectLeft if collects_for_partitions(join) => {
            (!keeps_unmatched_build_rows(*join.join_type())).then_some(true)
        }
        PartitionMode::CollectLeft => {
            (join.left().properties().partitioning.partition_count() == 1).then_some(false)
        }
        PartitionMode::Auto => None,
    }
}

/// Whether a join's output depends on which build rows were never matched (the
/// left side is the build side).
fn keeps_unmatched_build_rows(join_type: JoinType) -> bool {
    matches!(
        join_type,
        JoinType::Left
            | JoinType::Full
            | JoinType::LeftSemi
            | JoinType::LeftAnti
            | JoinType::LeftMark
    )
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct SpillingHashJoinExec {
    join: Arc<HashJoinExec>,
    level: u32,
    /// How many runs of this join share the budget at once (the partitions of the
    /// join at level 0), each taking its share.
    ways: usize,
    /// Whether the join is the only operator of its plan that holds memory (see
    /// [`holder_cap`]).
    sole: bool,
    /// The partitions its build side is split into if it does not fit (at level 0
    /// worked out when it runs from `build_estimate`, see [`JoinRun::build_fanout`]).
    fanout: usize,
    /// The bytes of build side a run of this level-0 join reads, as estimated when
    /// planned (`None` below level 0, where the partition's size is known).
    build_estimate: Option<usize>,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
    /// The probe keys' dynamic filter, at level 0 (see [`super::key_bounds`]).
    key_filter: Option<Arc<JoinKeyFilter>>,
    /// The partition this join joins, by its index at each level (`3/17`; empty at
    /// level 0), for errors.
    path: String,
    /// The skew counters of the level-0 join this one runs inside (`None` at level 0,
    /// which makes its own): a nested join is no node of the plan, and its metrics
    /// would not be seen.
    skew: Option<SkewMetrics>,
    /// The build side read once for all partitions (a collecting join over several
    /// partitions, at level 0).
    shared: Option<Arc<SharedBuild>>,
}

/// Counters of the skewed partitions' joins.
#[derive(Debug, Clone)]
struct SkewMetrics {
    /// Build pieces joined by block nested loops.
    pieces: Count,
    /// Build rows dropped as duplicate keys.
    duplicates: Count,
}

impl SkewMetrics {
    fn new(metrics: &ExecutionPlanMetricsSet, partition: usize) -> Self {
        SkewMetrics {
            pieces: MetricBuilder::new(metrics).counter("skew_pieces", partition),
            duplicates: MetricBuilder::new(metrics).counter("skew_duplicates", partition),
        }
    }
}

impl SpillingHashJoinExec {
    /// The hash join it wraps.
    pub(crate) fn wrapped(&self) -> &HashJoinExec {
        &self.join
    }

    /// The join of a plan (`sole`: the only operator in it that holds memory): its
    /// partitions run at once.
    fn new(join: Arc<HashJoinExec>, sole: bool) -> Self {
        let ways = join.properties().partitioning.partition_count().max(1);
        Self::nested(join, 0, ways, sole, String::new(), None)
    }

    /// A join over partition `path` of a join partitioned `level` times, which runs
    /// beside `ways - 1` others and counts skew in `skew`.
    fn nested(
        join: Arc<HashJoinExec>,
        level: u32,
        ways: usize,
        sole: bool,
        path: String,
        skew: Option<SkewMetrics>,
    ) -> Self {
        let properties = join.properties().clone();
        SpillingHashJoinExec {
            join,
            level,
            ways,
            sole,
            fanout: JOIN_FANOUT,
            build_estimate: None,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
            key_filter: None,
            path,
            skew,
            shared: None,
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
            SpillingHashJoinExec::new(join, self.sole)
        } else {
            SpillingHashJoinExec::nested(
                join,
                self.level,
                self.ways,
                self.sole,
                self.path.clone(),
                self.skew.clone(),
            )
        };
        replaced.key_filter = self.key_filter.clone();
        replaced.fanout = self.fanout;
        replaced.build_estimate = self.build_estimate;
        replaced.shared = self
            .shared
            .as_ref()
            .map(|s| Arc::new(SharedBuild::new(s.partitions)));
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
        let mut run = JoinRun {
            join: self.join.clone(),
            level: self.level,
            ways: self.ways,
            sole: self.sole,
            fanout: self.fanout,
            partition,
            context,
            metrics: self.metrics.clone(),
            spilled_partitions: MetricBuilder::new(&self.metrics)
                .counter("spilled_partitions", partition),
            swapped_roles: MetricBuilder::new(&self.metrics).counter("swapped_roles", partition),
            probe_filtered: MetricBuilder::new(&self.metrics).counter("probe_filtered", partition),
            key_filter: self.key_filter.clone(),
            path: self.path.clone(),
            skew: self
                .skew
                .clone()
                .unwrap_or_else(|| SkewMetrics::new(&self.metrics, partition)),
            shared: self.shared.clone(),
        };
        run.fanout = run.build_fanout(self.build_estimate);
        let schema = self.join.schema();
        let stream = futures::stream::once(run.start()).try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

/// One partition's execution.
#[derive(Clone)]
struct JoinRun {
    join: Arc<HashJoinExec>,
    level: u32,
    ways: usize,
    sole: bool,
    /// See [`SpillingHashJoinExec::fanout`] (at level 0 set by
    /// [`JoinRun::build_fanout`]).
    fanout: usize,
    partition: usize,
    context: Arc<TaskContext>,
    metrics: ExecutionPlanMetricsSet,
    spilled_partitions: Count,
    swapped_roles: Count,
    /// Partitions that ran the join as a filter of their probe rows.
    probe_filtered: Count,
    key_filter: Option<Arc<JoinKeyFilter>>,
    path: String,
    skew: SkewMetrics,
    shared: Option<Arc<SharedBuild>>,
}

/// The build side of a collecting join over several partitions, read once by
/// whichever partition asks first and shared by all (DataFusion's own join collects
/// it so, but holds it whole or fails). See [`JoinRun::collect_shared`].
pub(crate) struct SharedBuild {
    read: std::sync::Mutex<Option<SharedRead>>,
    /// The join's partitions, and how many are done with the build side.
    partitions: usize,
    done: std::sync::atomic::AtomicUsize,
}

type SharedRead = Shared<BoxFuture<'static, Result<Arc<CollectedBuild>, Arc<DataFusionError>>>>;

impl SharedBuild {
    fn new(partitions: usize) -> Self {
        SharedBuild {
            read: std::sync::Mutex::new(None),
            partitions,
            done: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// The build side, read by `run` if no partition started reading it yet.
    async fn collected(&self, run: &JoinRun) -> DfResult<Arc<CollectedBuild>> {
        let read = {
            let mut read = self.read.lock().unwrap_or_else(PoisonError::into_inner);
            read.get_or_insert_with(|| {
                let run = run.clone();
                async move { run.collect_shared().await.map(Arc::new).map_err(Arc::new) }
                    .boxed()
                    .shared()
            })
            .clone()
        };
        read.await.map_err(DataFusionError::Shared)
    }
}

impl fmt::Debug for SharedBuild {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedBuild")
            .field("partitions", &self.partitions)
            .finish_non_exhaustive()
    }
}

/// A partition's hold on a [`SharedBuild`]: the last partition done with it lets
/// it go (the plan would keep it, and its memory, until it is dropped).
struct SharedBuildLease(Arc<SharedBuild>);

impl Drop for SharedBuildLease {
    fn drop(&mut self) {
        let build = &self.0;
        let done = build.done.fetch_add(1, std::sync::atomic::Ordering::AcqRel) + 1;
        if done >= build.partitions {
            build
                .read
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
        }
    }
}

/// A shared build side once read: DataFusion's join over its rows in memory (all
/// of them, or the partitions not spilled), which every partition probes with
/// its rows of those partitions, and the spilled partitions' files.
struct CollectedBuild {
    probed: Probed,
    /// The build side split by key hash, if it did not fit whole.
    split: Option<SplitBuild>,
    /// Whether the build side has no rows.
    empty: bool,
}

/// A shared build side split by key hash: which partitions were spilled, their
/// files, and the spill manager that wrote them.
struct SplitBuild {
    spilled: Vec<bool>,
    files: Vec<Option<Arc<dyn SpillFile>>>,
    spill: Arc<SpillManager>,
}

/// How the partitions probe a shared build side in memory.
enum Probed {
    /// Through DataFusion's join over the rows.
    Join {
        join: Arc<HashJoinExec>,
        /// The join's probe side: each partition puts its stream in before
        /// executing.
        probes: Arc<OneShotExec>,
        /// The context lending the rows' memory to the join's table.
        context: Arc<TaskContext>,
    },
    /// As a filter of their rows (see [`super::probe_filter`]), into batches of the
    /// rows given.
    Filter(Arc<ProbeFilter>, usize),
}

impl CollectedBuild {
    /// Partition `partition` of the join in memory, probed by `probe`.
    fn probe(
        &self,
        partition: usize,
        probe: SendableRecordBatchStream,
    ) -> DfResult<SendableRecordBatchStream> {
        match &self.probed {
            Probed::Join {
                join,
                probes,
                context,
            } => {
                probes.put(partition, probe)?;
                join.execute(partition, context.clone())
            }
            Probed::Filter(filter, batch_rows) => Ok(filter.clone().stream(probe, *batch_rows)),
        }
    }
}

/// Rows read from one input before deciding how to join: the batches held under
/// `reservation`, and the first batch that did not fit (`None`: the input ended).
struct Prefix {
    held: Vec<RecordBatch>,
    reservation: MemoryReservation,
    overflow: Option<RecordBatch>,
}

impl Prefix {
    /// Reads `input` while `reservation` grows within `cap` bytes; if it all fits,
    /// also the table a join builds on it, as `table` counts it.
    async fn read(
        input: &mut SendableRecordBatchStream,
        reservation: MemoryReservation,
        cap: usize,
        table: impl Fn(&[RecordBatch]) -> DfResult<usize>,
    ) -> DfResult<Self> {
        let mut held = Vec::new();
        while let Some(batch) = input.next().await {
            let batch = owned_if_shared(batch?)?;
            let need = build_cost(&batch);
            if grow_within(&reservation, need, cap) {
                held.push(batch);
            } else {
                return Ok(Prefix {
                    held,
                    reservation,
                    overflow: Some(batch),
                });
            }
        }
        // All of it was read: DataFusion's join built on it reserves the rows and its
        // table, which for narrow rows is larger than the rows (a hash table's 17
        // bytes a bucket, 8/7 to 16/7 buckets a row). Reserved now, out of whatever
        // the pool has free (as the join would take it), or the last batch read is
        // the first that does not fit: q72 at 12 MiB asked for 5.9 MB more than its
        // 384 k keys reserved, and failed. (Within the cap instead, q72 and q97 at
        // 25 MiB spilled 2.6 and 5 times the files, 0.17 -> 0.25 s and 0.11 ->
        // 0.14 s.)
        let need = held
            .iter()
            .map(RecordBatch::get_array_memory_size)
            .sum::<usize>()
            .saturating_add(table(&held)?);
        let short = need.saturating_sub(reservation.size());
        if short > 0 && reservation.try_grow(short).is_err() {
            if let Some(last) = held.pop() {
                reservation.shrink(build_cost(&last).min(reservation.size()));
                return Ok(Prefix {
                    held,
                    reservation,
                    overflow: Some(last),
                });
            }
        }
        Ok(Prefix {
            held,
            reservation,
            overflow: None,
        })
    }

    /// All the rows of an input that fitted (no overflow), as a build side.
    fn into_build(self, schema: SchemaRef) -> HeldBuild {
        debug_assert!(self.overflow.is_none(), "a build side is held whole");
        HeldBuild {
            schema,
            batches: self.held,
            reservation: self.reservation,
        }
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

/// A build side wholly in memory: its rows and the reservation they were read under.
struct HeldBuild {
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
    reservation: MemoryReservation,
}

impl HeldBuild {
    /// The rows as a one-shot input, and a task context for the join building on
    /// them that lends it the rows' reservation ([`ReservedPool::lend_rows`]). Given
    /// back batch by batch as the join took them, that memory went to whichever
    /// operator running beside it asked first, and the join then failed for want of
    /// the few bytes more its table needs (q80 at 25 MiB: three union branches of
    /// joins at once).
    fn lend(self, context: &TaskContext) -> DfResult<(OneShotExec, Arc<TaskContext>)> {
        ReservedPool::lend_rows(self.schema, self.batches, self.reservation, context)
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
        if let Some(shared) = self.shared.clone() {
            return self.start_shared(shared).await;
        }
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
        let limit = self.limit();
        // The join's hash table costs about as much again as the rows. A build side
        // read before anything is decided takes at most half the budget: the
        // operators feeding it (often other joins) keep room while it is read, and
        // the probe side room to be read for a swap of roles. Partitioned, it may
        // take more (see `build_cap`).
        let build = Prefix::read(&mut left, self.consumer("build"), limit / 2, |h| {
            self.table_bytes(h)
        })
        .await?;
        let mut right = self
            .join
            .right()
            .execute(self.partition, self.context.clone())?;
        if build.overflow.is_none() {
            if let Some(f) = &self.key_filter {
                f.report(
                    Some(f.bounds_of(&build.held, self.context.memory_pool())?),
                    self.context.memory_pool(),
                )?;
            }
            if build.held.iter().all(|b| b.num_rows() == 0)
                && self
                    .join
                    .join_type()
                    .empty_build_side_produces_empty_result()
            {
                return Ok(self.empty_output(right).await);
            }
            if let Some(filter) = self.probe_filter(&build.held)? {
                // The rows' memory goes back: the filter holds their keys' bitmap.
                drop(build);
                return Ok(filter.stream(right, self.batch_rows()));
            }
            // It fits: the wrapped join runs on the rows read, in the memory they
            // were read under.
            return self.inner_join(
                build.into_build(left_schema),
                OneShotExec::new(right_schema, right),
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
            let probe = Prefix::read(
                &mut right,
                self.consumer("probe"),
                limit / 4,
                hash_table_bytes,
            )
            .await?;
            if probe.overflow.is_none() {
                self.swapped_roles.add(1);
                // The probe side is read already; the build side never whole.
                if let Some(f) = &self.key_filter {
                    f.report(None, self.context.memory_pool())?;
                }
                let left = build.chain(left_schema, left);
                return self.swapped_join(left, probe.into_build(right_schema));
            }
            Some(probe)
        } else {
            None
        };
        // Both sides are large: a hybrid hash join. The build side is split into
        // partitions, as many kept in memory as fit and the rest spilled; the probe
        // side's rows of partitions in memory are joined at once, the others spilled
        // by partition and joined partition by partition afterwards.
        let rows = build.chain(left_schema.clone(), left);
        let cap = if probe_holds_memory {
            0
        } else {
            self.build_cap()
        };
        let (build, left_spill) = self.partition_build(rows, cap).await?;
        let spilled = build.spilled.iter().filter(|&&s| s).count();
        let right = match probe {
            Some(probe) => probe.chain(right_schema.clone(), right),
            None => right,
        };
        // Also without rows in memory: probe rows of partitions no build row fell
        // in may still be output (outer joins).
        let held = HeldBuild {
            schema: left_schema.clone(),
            batches: build.held,
            reservation: build.reservation,
        };
        if spilled == 0 {
            // Every partition stayed in memory: the probe side needs no routing.
            return self.inner_join(held, OneShotExec::new(right_schema, right));
        }
        self.join_routed(
            right,
            build.spilled,
            build.files,
            left_spill,
            |run, held_probe| run.inner_join(held, OneShotExec::new(right_schema, held_probe)),
        )
    }

    /// A partition of a join whose build side is read once for all partitions
    /// ([`SharedBuild`]): probes it in memory, or, if it was spilled, routes this
    /// partition's probe rows to files by the build side's partitions and joins
    /// each spilled partition from its files.
    async fn start_shared(self, shared: Arc<SharedBuild>) -> DfResult<SendableRecordBatchStream> {
        let lease = SharedBuildLease(shared.clone());
        let collected = shared.collected(&self).await?;
        let right = self
            .join
            .right()
            .execute(self.partition, self.context.clone())?;
        if collected.empty
            && self
                .join
                .join_type()
                .empty_build_side_produces_empty_result()
        {
            return Ok(self.empty_output(right).await);
        }
        let partition = self.partition;
        let joined = match &collected.split {
            Some(split) if split.spilled.contains(&true) => {
                let in_memory = collected.clone();
                self.join_routed(
                    right,
                    split.spilled.clone(),
                    split.files.clone(),
                    split.spill.clone(),
                    move |_, held_probe| in_memory.probe(partition, held_probe),
                )?
            }
            _ => collected.probe(partition, right)?,
        };
        // The plan lets the build side go once every partition's output is done
        // (the streams hold what they read meanwhile).
        let schema = joined.schema();
        let joined = joined.map(move |batch| {
            let _ = &lease;
            batch
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, joined)))
    }

    /// Reads the build side once for every partition: held whole if it fits its
    /// cap ([`holder_cap`] of the budget: half, most of it when the join is the
    /// plan's only holder), else split by key hash, as many partitions kept in
    /// memory as fit and the rest spilled.
    async fn collect_shared(self) -> DfResult<CollectedBuild> {
        let left_schema = self.join.left().schema();
        let mut left = self.join.left().execute(0, self.context.clone())?;
        let budget = self.budget();
        let cap = holder_cap(budget, self.sole);
        let build = Prefix::read(&mut left, self.consumer("shared build"), cap, |h| {
            self.table_bytes(h)
        })
        .await?;
        let (held, split) = if build.overflow.is_none() {
            if let Some(f) = &self.key_filter {
                f.report(
                    Some(f.bounds_of(&build.held, self.context.memory_pool())?),
                    self.context.memory_pool(),
                )?;
            }
            (build.into_build(left_schema), None)
        } else {
            // Estimated small enough to collect but not (or no room for it now): a
            // hybrid join, whose partitions in memory every partition probes. Kept
            // within half the budget, the other half for the spilled partitions'
            // joins; none kept if an operator below the probe side other than a
            // spilling join holds memory.
            let rows = build.chain(left_schema.clone(), left);
            let cap = if probe_holds_memory_besides_joins(self.join.right().as_ref()) {
                0
            } else {
                holder_cap(budget, false)
            };
            let (build, spill) = self.partition_build(rows, cap).await?;
            let held = HeldBuild {
                schema: left_schema,
                batches: build.held,
                reservation: build.reservation,
            };
            let split = SplitBuild {
                spilled: build.spilled,
                files: build.files,
                spill,
            };
            (held, Some(split))
        };
        let empty = split.is_none() && held.batches.iter().all(|b| b.num_rows() == 0);
        if split.is_none() && !empty {
            if let Some(filter) = self.probe_filter(&held.batches)? {
                return Ok(CollectedBuild {
                    probed: Probed::Filter(filter, self.batch_rows()),
                    split,
                    empty,
                });
            }
        }
        let (rows, context) = held.lend(&self.context)?;
        let partitions = self.join.properties().partitioning.partition_count();
        let probes = Arc::new(OneShotExec::slots(self.join.right().schema(), partitions));
        let join = self
            .join
            .builder()
            .with_new_children(vec![Arc::new(rows), probes.clone()])?
            .with_partition_mode(PartitionMode::CollectLeft)
            .reset_state()
            .recompute_properties()
            .build()?;
        Ok(CollectedBuild {
            probed: Probed::Join {
                join: Arc::new(join),
                probes,
                context,
            },
            split,
            empty,
        })
    }

    /// Splits the build side `rows` by key hash into [`JoinRun::fanout`]
    /// partitions, as many kept in memory as fit `cap` bytes and the rest spilled
    /// through the returned spill manager, and reports the keys' bounds.
    async fn partition_build(
        &self,
        mut rows: SendableRecordBatchStream,
        cap: usize,
    ) -> DfResult<(PartitionedBuild, Arc<SpillManager>)> {
        let left_keys = build_keys(&self.join);
        let left_spill = Arc::new(SpillManager::new(
            self.context.runtime_env(),
            SpillMetrics::new(&self.metrics, self.partition),
            self.join.left().schema(),
        ));
        let mut partitions = HybridPartitions::new(
            Partitioner::new(left_keys, level_seed(self.level), self.fanout),
            left_spill.clone(),
            "hash join build",
            self.consumer("build partitions"),
            cap,
            // The rows alone: the table built on the partitions kept is reserved
            // once they are known (`table_bytes`). The pieces own their buffers.
            |batch| batch.get_array_memory_size(),
        );
        // The rows read so far (see `Prefix::chain`) are handed to the partitions
        // one by one, each giving its share back as it goes, so nothing is counted
        // twice.
        let mut bounds = self
            .key_filter
            .as_ref()
            .map(|f| f.unlisted_bounds(self.context.memory_pool()));
        while let Some(batch) = rows.next().await {
            let batch = batch?;
            if let Some(b) = &mut bounds {
                b.add(&batch)?;
            }
            partitions.push(&batch)?;
        }
        drop(rows);
        let build = partitions.finish_with_state(|held| self.table_bytes(held))?;
        if let Some(f) = &self.key_filter {
            if let Some(b) = &mut bounds {
                if !build.spilled.contains(&true) {
                    b.list_held(&build.held)?;
                }
            }
            f.report(bounds, self.context.memory_pool())?;
        }
        self.spilled_partitions
            .add(build.spilled.iter().filter(|&&s| s).count());
        Ok((build, left_spill))
    }

    /// Joins probe side `right` with a build side split by key hash, the partitions
    /// marked in `spilled` in `build_files` and the others in memory: probe rows of
    /// partitions in memory go through `joined_in_memory`, those of spilled ones to a
    /// file per partition, and each spilled partition is then joined from its two
    /// files.
    fn join_routed(
        self,
        right: SendableRecordBatchStream,
        spilled: Vec<bool>,
        build_files: Vec<Option<Arc<dyn SpillFile>>>,
        left_spill: Arc<SpillManager>,
        joined_in_memory: impl FnOnce(
            &Self,
            SendableRecordBatchStream,
        ) -> DfResult<SendableRecordBatchStream>,
    ) -> DfResult<SendableRecordBatchStream> {
        let right_schema = self.join.right().schema();
        let right_keys = probe_keys(&self.join);
        let right_spill = Arc::new(SpillManager::new(
            self.context.runtime_env(),
            SpillMetrics::new(&self.metrics, self.partition),
            right_schema.clone(),
        ));
        let router = Arc::new(AsyncMutex::new(ProbeRouter::new(
            right,
            Partitioner::new(right_keys, level_seed(self.level), self.fanout),
            spilled,
            right_spill.clone(),
            "hash join probe",
        )));
        let held_probe = futures::stream::unfold(router.clone(), |router| async move {
            let next = router.lock().await.next_held().await;
            next.map(|batch| (batch, router))
        });
        // Probe rows the join does not ask for (nothing they could produce) are
        // read past by `files` below.
        let held_probe = Box::pin(RecordBatchStreamAdapter::new(
            right_schema.clone(),
            held_probe,
        ));
        let joined_in_memory = joined_in_memory(&self, held_probe)?;
        let batch_rows = self.context.session_config().batch_size();
        let schema = self.join.schema();
        let fetch = self.join.fetch();
        let run = Arc::new(self);
        let spilled_joins = futures::stream::once(async move {
            let probe_files = router.lock().await.files().await?;
            let parts = build_files
                .into_iter()
                .zip(probe_files)
                .enumerate()
                .filter(|(_, (l, _))| l.is_some());
            let joins = futures::stream::iter(parts).map(move |(p, (build, probe))| {
                run.clone().partition_join(SpilledPartition {
                    path: match run.path.as_str() {
                        "" => p.to_string(),
                        parent => format!("{parent}/{p}"),
                    },
                    build,
                    probe,
                    build_spill: left_spill.clone(),
                    probe_spill: right_spill.clone(),
                    batch_rows,
                })
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
        right: HeldBuild,
    ) -> DfResult<SendableRecordBatchStream> {
        let (right, context) = right.lend(&self.context)?;
        let join = self.over(OneShotExec::new(left.schema(), left), right)?;
        join.swap_inputs(PartitionMode::CollectLeft)?
            .execute(0, context)
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

    /// The output of a partition whose build side is empty, for a join type that
    /// then outputs nothing: the probe side is let go unread. It is polled once
    /// first, so that a repartition below hands this partition's channel over and
    /// closes it when the stream is dropped; a repartition's output never polled
    /// keeps its channel open, and the rows sent to it are held and then spilled
    /// until the query ends (q82 at 25 MiB: 8.8 MiB spilled for a partition that
    /// got none of the build side's few keys).
    async fn empty_output(
        &self,
        mut probe: SendableRecordBatchStream,
    ) -> SendableRecordBatchStream {
        let _first = futures::poll!(probe.next());
        drop(probe);
        Box::pin(RecordBatchStreamAdapter::new(
            self.join.schema(),
            futures::stream::empty(),
        ))
    }

    /// The join as a filter of its probe rows over the whole build side `held`, if
    /// it is one (see [`super::probe_filter`]).
    fn probe_filter(&self, held: &[RecordBatch]) -> DfResult<Option<Arc<ProbeFilter>>> {
        let Some(shape) = ProbeFilterShape::of(&self.join) else {
            return Ok(None);
        };
        let filter = shape.over(held, self.context.memory_pool())?;
        if filter.is_some() {
            self.probe_filtered.add(1);
        }
        Ok(filter)
    }

    /// Rows in a batch of the session.
    fn batch_rows(&self) -> usize {
        self.context.session_config().batch_size()
    }

    /// Runs the wrapped join on a build side in memory and a one-partition probe side.
    fn inner_join(
        &self,
        build: HeldBuild,
        probe: OneShotExec,
    ) -> DfResult<SendableRecordBatchStream> {
        let (build, context) = build.lend(&self.context)?;
        self.over(build, probe)?.execute(0, context)
    }

    /// What DataFusion's hash join reserves for its table over the build rows
    /// `held`, and the chain of row indices beside it: an array indexed by key
    /// when its one integer key's range is small or dense enough, else a hash
    /// table ([`hash_table_bytes`]).
    fn table_bytes(&self, held: &[RecordBatch]) -> DfResult<usize> {
        let rows: usize = held.iter().map(RecordBatch::num_rows).sum();
        if rows == 0 {
            return Ok(0);
        }
        if let Some(range) = self.dense_key_range(held, rows)? {
            let chain = rows * size_of::<u32>();
            return Ok((range + 1).saturating_mul(size_of::<u32>()) + chain);
        }
        hash_table_bytes(held)
    }

    /// The range of the join's one integer key over `held` (`rows` rows) when
    /// DataFusion builds its table as an array indexed by key (see
    /// `perfect_hash_join_*` in its execution options).
    fn dense_key_range(&self, held: &[RecordBatch], rows: usize) -> DfResult<Option<usize>> {
        let [(key, _)] = self.join.on() else {
            return Ok(None);
        };
        let mut bounds: Option<(ScalarValue, ScalarValue)> = None;
        for batch in held {
            let values = key.evaluate(batch)?.into_array(batch.num_rows())?;
            if !matches!(
                values.data_type(),
                DataType::Int8
                    | DataType::Int16
                    | DataType::Int32
                    | DataType::Int64
                    | DataType::UInt8
                    | DataType::UInt16
                    | DataType::UInt32
                    | DataType::UInt64
            ) || (values.null_count() > 0
                && self.join.null_equality() == NullEquality::NullEqualsNull)
            {
                return Ok(None);
            }
            let (lo, hi) = min_max(&values)?;
            bounds = Some(match bounds {
                Some((a, b)) => (least(a, lo), greatest(b, hi)),
                None => (lo, hi),
            });
        }
        let as_u64 = |v: &ScalarValue| match v {
            ScalarValue::Int8(Some(v)) => Some(*v as u64),
            ScalarValue::Int16(Some(v)) => Some(*v as u64),
            ScalarValue::Int32(Some(v)) => Some(*v as u64),
            ScalarValue::Int64(Some(v)) => Some(*v as u64),
            ScalarValue::UInt8(Some(v)) => Some(u64::from(*v)),
            ScalarValue::UInt16(Some(v)) => Some(u64::from(*v)),
            ScalarValue::UInt32(Some(v)) => Some(u64::from(*v)),
            ScalarValue::UInt64(Some(v)) => Some(*v),
            _ => None,
        };
        let Some((Some(lo), Some(hi))) = bounds.map(|(lo, hi)| (as_u64(&lo), as_u64(&hi))) else {
            return Ok(None);
        };
        let Ok(range) = usize::try_from(hi.wrapping_sub(lo)) else {
            return Ok(None);
        };
        if range == usize::MAX {
            return Ok(None);
        }
        let options = &self.context.session_config().options().execution;
        let dense = rows as f64 / (range as f64 + 1.0) > options.perfect_hash_join_min_key_density;
        Ok((range < options.perfect_hash_join_small_build_threshold || dense).then_some(range))
    }

    /// The partitions to split the build side into should it not fit: at level 0
    /// from its estimated size `build_estimate`, so that each part takes at most
    /// half of [`JoinRun::build_cap`] and one pass suffices (at least [`JOIN_FANOUT`],
    /// at most [`SPLIT_FANOUT`]); below, as the join above set it from the
    /// partition's size.
    fn build_fanout(&self, build_estimate: Option<usize>) -> usize {
        match build_estimate {
            Some(bytes) if self.level == 0 => (bytes.saturating_mul(2) / self.build_cap().max(1))
                .max(1)
                .next_power_of_two()
                .clamp(JOIN_FANOUT, SPLIT_FANOUT),
            _ => self.fanout,
        }
    }

    /// The most the partitions of a build side held in memory may take of
    /// [`JoinRun::limit`]: all but a margin when the join is alone in its plan.
    fn build_cap(&self) -> usize {
        holder_cap(self.limit(), self.sole)
    }

    /// This run's share of the budget: the join's partitions run at the same time.
    fn limit(&self) -> usize {
        match self.budget() {
            usize::MAX => usize::MAX,
            bytes => bytes / self.ways,
        }
    }

    /// The whole budget (`usize::MAX`: unlimited).
    fn budget(&self) -> usize {
        budget_bytes(&self.context)
    }

    /// Joins a spilled partition: one level deeper (so that a partition still too
    /// large is split again) while levels are left, else by [`JoinRun::final_join`].
    fn partition_join(
        self: Arc<Self>,
        part: SpilledPartition,
    ) -> DfResult<SendableRecordBatchStream> {
        if self.level < MAX_LEVEL {
            let join = self.over(
                OneShotExec::new(part.build_spill.schema().clone(), part.build_stream()?),
                OneShotExec::new(part.probe_spill.schema().clone(), part.probe_stream()?),
            )?;
            let build_bytes = part.build.as_ref().and_then(|f| f.size());
            let mut nested = SpillingHashJoinExec::nested(
                Arc::new(join),
                self.level + 1,
                self.ways,
                self.sole,
                part.path,
                Some(self.skew.clone()),
            );
            // Split by its size, should it not fit: a partition a little too large
            // cut 64 ways would spill dozens of files of a few rows.
            nested.fanout = build_bytes
                .and_then(|b| usize::try_from(b).ok())
                .map_or(JOIN_FANOUT, |b| split_fanout(b, self.build_cap()));
            return nested.execute(0, self.context.clone());
        }
        let schema = self.join.schema();
        let joined = futures::stream::once(self.final_join(part)).try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, joined)))
    }

    /// Joins a partition at the last level: as is if its build side fits; if not,
    /// it holds a key too frequent for the budget (see the module docs).
    async fn final_join(
        self: Arc<Self>,
        part: SpilledPartition,
    ) -> DfResult<SendableRecordBatchStream> {
        let limit = self.limit();
        // Half, sole or not: a piece of a skewed build side is joined with its whole
        // probe partition read again, beside the pieces' own reading.
        let cap = limit / 2;
        let build_schema = part.build_spill.schema().clone();
        let probe_schema = part.probe_spill.schema().clone();
        let mut rows = part.build_stream()?;
        let build = Prefix::read(&mut rows, self.consumer("build"), cap, |h| {
            self.table_bytes(h)
        })
        .await?;
        let fits = build.overflow.is_none();
        if fits {
            return self.inner_join(
                build.into_build(build_schema),
                OneShotExec::new(probe_schema, part.probe_stream()?),
            );
        }
        if union_over_build(*self.join.join_type()) {
            let rows = build.chain(build_schema.clone(), rows);
            return Ok(self.block_nested_loop(rows, part, cap));
        }
        // Memory goes back before the build side is read again.
        drop(build);
        drop(rows);
        if self.build_keys_only() {
            if let Some(distinct) = self.distinct_build(&part, cap).await? {
                return self.inner_join(
                    distinct,
                    OneShotExec::new(probe_schema, part.probe_stream()?),
                );
            }
        }
        if self.swappable() {
            let mut probe_rows = part.probe_stream()?;
            let probe = Prefix::read(
                &mut probe_rows,
                self.consumer("probe"),
                limit / 4,
                hash_table_bytes,
            )
            .await?;
            if probe.overflow.is_none() {
                self.swapped_roles.add(1);
                return self.swapped_join(part.build_stream()?, probe.into_build(probe_schema));
            }
        }
        Err(self.skew_error(&part).await)
    }

    /// The join of a build side too large for memory as the union of its pieces'
    /// joins (see [`union_over_build`]): pieces of `rows` up to `cap` bytes (as
    /// [`build_cost`] counts them), each joined with the whole probe partition, read
    /// again for each. A piece is read only once the previous one's join is done and
    /// has given its memory back.
    fn block_nested_loop(
        self: Arc<Self>,
        rows: SendableRecordBatchStream,
        part: SpilledPartition,
        cap: usize,
    ) -> SendableRecordBatchStream {
        let schema = self.join.schema();
        let state = Some((rows, None, self, part));
        let joins = futures::stream::unfold(state, move |state| async move {
            let (mut rows, mut pending, run, part) = state?;
            let piece = match run.next_piece(&mut rows, &mut pending, cap).await {
                Ok(Some(piece)) => piece,
                Ok(None) => return None,
                Err(e) => return Some((Err(e), None)),
            };
            run.skew.pieces.add(1);
            let (batches, reservation) = piece;
            let build = HeldBuild {
                schema: part.build_spill.schema().clone(),
                batches,
                reservation,
            };
            let joined = part.probe_stream().and_then(|probe| {
                run.inner_join(
                    build,
                    OneShotExec::new(part.probe_spill.schema().clone(), probe),
                )
            });
            match joined {
                Ok(joined) => Some((Ok(joined), Some((rows, pending, run, part)))),
                Err(e) => Some((Err(e), None)),
            }
        });
        Box::pin(RecordBatchStreamAdapter::new(schema, joins.try_flatten()))
    }

    /// The next piece of `rows` that fits `cap` bytes, under a reservation of its
    /// own (`None` once `rows` ended). `pending` is a batch not yet wholly taken and
    /// the offset of its first row left. A batch that does not fit whole is cut, its
    /// rows copied out: a slice would be counted at its whole batch's size.
    async fn next_piece(
        &self,
        rows: &mut SendableRecordBatchStream,
        pending: &mut Option<(RecordBatch, usize)>,
        cap: usize,
    ) -> DfResult<Option<(Vec<RecordBatch>, MemoryReservation)>> {
        let reservation = self.consumer("skewed build piece");
        let mut piece = Vec::new();
        loop {
            let (batch, offset) = match pending.take() {
                Some(p) => p,
                None => match rows.next().await {
                    Some(batch) => (owned_if_shared(batch?)?, 0),
                    None => break,
                },
            };
            let total = batch.num_rows();
            if offset >= total {
                continue;
            }
            let cost = build_cost(&batch);
            if offset == 0 && grow_within(&reservation, cost, cap) {
                piece.push(batch);
                continue;
            }
            let per_row = cost.div_ceil(total).max(1);
            let room = cap.saturating_sub(reservation.size());
            let mut take = (room / per_row).min(total - offset);
            if take == 0 {
                if !piece.is_empty() {
                    *pending = Some((batch, offset));
                    break;
                }
                // At least a row a piece, or the loop would not advance.
                take = 1;
            }
            let rows: Vec<u32> = (offset as u32..(offset + take) as u32).collect();
            let head = take_rows(&batch, &rows)?;
            match reservation.try_grow(build_cost(&head)) {
                Ok(()) => piece.push(head),
                Err(e) if piece.is_empty() => return Err(e),
                Err(_) => {
                    *pending = Some((batch, offset));
                    break;
                }
            }
            if offset + take < total {
                // The piece is full.
                *pending = Some((batch, offset + take));
                break;
            }
        }
        Ok((!piece.is_empty()).then_some((piece, reservation)))
    }

    /// Whether the build side contributes only its keys to the join: the output is
    /// probe rows (and a mark), and a filter, if any, reads no build column.
    fn build_keys_only(&self) -> bool {
        matches!(
            self.join.join_type(),
            JoinType::RightSemi | JoinType::RightAnti | JoinType::RightMark
        ) && self
            .join
            .filter()
            .is_none_or(|f| f.column_indices().iter().all(|c| c.side != JoinSide::Left))
    }

    /// The build partition with one row per key value, under a reservation, if
    /// those rows (and the set of keys) fit `cap` bytes.
    async fn distinct_build(
        &self,
        part: &SpilledPartition,
        cap: usize,
    ) -> DfResult<Option<HeldBuild>> {
        let schema = part.build_spill.schema().clone();
        let keys = build_keys(&self.join);
        let mut distinct = DistinctKeys::new(keys, &schema)?;
        let reservation = self.consumer("distinct build keys");
        let mut kept = Vec::new();
        let mut dropped = 0;
        let mut rows = part.build_stream()?;
        while let Some(batch) = rows.next().await {
            let batch = batch?;
            let (new, key_bytes) = distinct.filter(&batch)?;
            let need = new.as_ref().map_or(0, build_cost) + key_bytes;
            if reservation.size() + need > cap || reservation.try_grow(need).is_err() {
                return Ok(None);
            }
            dropped += batch.num_rows() - new.as_ref().map_or(0, RecordBatch::num_rows);
            kept.extend(new);
        }
        // The set of keys is dropped here and its share given back.
        drop(distinct);
        let rows: usize = kept.iter().map(build_cost).sum();
        reservation.shrink(reservation.size().saturating_sub(rows));
        self.skew.duplicates.add(dropped);
        Ok(Some(HeldBuild {
            schema,
            batches: kept,
            reservation,
        }))
    }

    /// [`crate::Error::Skew`] for a build partition that nothing lets this join
    /// run within the budget, naming its most frequent key.
    async fn skew_error(&self, part: &SpilledPartition) -> DataFusionError {
        let keys = build_keys(&self.join);
        let counted = match part.build_stream() {
            Ok(rows) => most_frequent_key(rows, &keys, self.consumer("skewed keys")).await,
            Err(e) => Err(e),
        };
        let budget = self.budget();
        match counted {
            Ok(Some(top)) => skew_error(
                join_kernel(*self.join.join_type()),
                &part.path,
                self.level,
                top,
                budget,
            ),
            // Not reached: a build partition too large has rows.
            Ok(None) => DataFusionError::Internal(format!(
                "hash join partition {} too large but without rows",
                part.path
            )),
            Err(e) => e,
        }
    }
}

/// A partition a hybrid join spilled: its build and probe rows' files (`None`: no
/// rows), which can be read more than once.
struct SpilledPartition {
    /// Its index at each level, `3/17`.
    path: String,
    build: Option<Arc<dyn SpillFile>>,
    probe: Option<Arc<dyn SpillFile>>,
    build_spill: Arc<SpillManager>,
    probe_spill: Arc<SpillManager>,
    /// Rows of the batches read back.
    batch_rows: usize,
}

impl SpilledPartition {
    fn build_stream(&self) -> DfResult<SendableRecordBatchStream> {
        partition_stream(&self.build_spill, self.build.clone(), self.batch_rows)
    }

    fn probe_stream(&self) -> DfResult<SendableRecordBatchStream> {
        partition_stream(&self.probe_spill, self.probe.clone(), self.batch_rows)
    }
}

/// Whether a join of this type is the union of the joins of its build side's
/// pieces with the whole probe side: each build row's output depends on that row
/// and the probe side only. Not so where a probe row's output depends on the whole
/// build side (right, full, right semi, right anti, right mark joins).
fn union_over_build(join_type: JoinType) -> bool {
    matches!(
        join_type,
        JoinType::Inner
            | JoinType::Left
            | JoinType::LeftSemi
            | JoinType::LeftAnti
            | JoinType::LeftMark
    )
}

/// The join, for [`crate::Error::Skew`]: DataFusion's join type, whose left input
/// is the build side (a SQL `LEFT JOIN` built on its right table is a `Right` join).
fn join_kernel(join_type: JoinType) -> &'static str {
    match join_type {
        JoinType::Inner => "hash join (Inner)",
        JoinType::Left => "hash join (Left)",
        JoinType::Right => "hash join (Right)",
        JoinType::Full => "hash join (Full)",
        JoinType::LeftSemi => "hash join (LeftSemi)",
        JoinType::RightSemi => "hash join (RightSemi)",
        JoinType::LeftAnti => "hash join (LeftAnti)",
        JoinType::RightAnti => "hash join (RightAnti)",
        JoinType::LeftMark => "hash join (LeftMark)",
        JoinType::RightMark => "hash join (RightMark)",
    }
}

/// What DataFusion's hash join reserves for a hash table over the build rows `held`,
/// and the chain of row indices beside it (hashbrown's buckets for the rows, a power
/// of two, each with its control byte).
fn hash_table_bytes(held: &[RecordBatch]) -> DfResult<usize> {
    let rows: usize = held.iter().map(RecordBatch::num_rows).sum();
    if rows == 0 {
        return Ok(0);
    }
    Ok(estimate_memory_size::<(u32, u64)>(rows, 0)? + rows * size_of::<u32>())
}

/// What a build-side batch reserves: the rows and about as much again for the join's
/// hash table. Counted as DataFusion's join counts them, once they own their buffers
/// ([`owned_if_shared`]).
fn build_cost(batch: &RecordBatch) -> usize {
    2 * batch.get_array_memory_size()
}

#[cfg(test)]
mod tests {
    use polars::prelude::{df, DataFrame, SortMultipleOptions};

    use super::*;
    use crate::budget::Budget;
    use crate::env::FrameEnv;
    use crate::error::Error;
    use crate::frame::RemoteFrame;
    use crate::query::test_env::local_env;
    use crate::query::{QueryOutput, QuerySession};
    use arrow_array::{ArrayRef, Int64Array, StringArray};
    use datafusion::arrow::row::{OwnedRow, RowConverter, SortField};
    use datafusion::execution::memory_pool::{GreedyMemoryPool, MemoryLimit, MemoryPool};

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

    /// The sum of metric `name` over the plan's operators named `operator`.
    fn plan_metric(out: &QueryOutput, name: &str, operator: &str) -> usize {
        out.operator_metrics
            .iter()
            .filter(|(op, _)| op == operator)
            .filter_map(|(_, metrics)| metrics.sum_by_name(name))
            .map(|v| v.as_usize())
            .sum()
    }

    /// The sum of a metric over the plan's spilling joins.
    fn join_metric(out: &QueryOutput, name: &str) -> usize {
        plan_metric(out, name, "SpillingHashJoinExec")
    }

    /// The chunks a query's scans skipped on dynamic filters.
    fn chunks_pruned(out: &QueryOutput) -> usize {
        plan_metric(out, "chunks_pruned", "RemoteScanExec")
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
    fn a_narrow_build_side_whose_hash_table_the_pool_cannot_hold_is_partitioned() {
        // 200 k sparse keys and nothing else: 1.6 MB of rows (3.2 MB as read), a
        // hash table of 4.5 MB and its chain of 0.8 MB beside them. The rows fit
        // half of 8 MiB, but with 2.5 MiB held by another operator the pool cannot
        // give the table: DataFusion's join asked for it and failed; the build side
        // is partitioned instead.
        let env = local_env(2, 128 << 20);
        let keys = 200_000i64;
        let narrow = df!("k" => (0..keys).map(|i| i * 1_000).collect::<Vec<_>>()).unwrap();
        let probe = df!(
            "p" => (0..keys).map(|i| i * 500).collect::<Vec<_>>(),
            "v" => (0..keys).collect::<Vec<_>>()
        )
        .unwrap();
        let frames = vec![
            ("narrow", RemoteFrame::from_polars(&env, &narrow).unwrap()),
            ("probe", RemoteFrame::from_polars(&env, &probe).unwrap()),
        ];
        let sql = "SELECT k, v FROM narrow JOIN probe ON k = p";
        let (_, want) = run(&env, &frames, None, sql);
        assert_eq!(want.height(), keys as usize / 2);
        let budget = 8 << 20;
        let budgeted = env.with_budget(Budget::bytes(budget).unwrap());
        let session = QuerySession::with_partitions(&budgeted, 1).unwrap();
        for (name, frame) in &frames {
            session.register(name, frame).unwrap();
        }
        let plan = session.explain(sql).unwrap();
        assert!(plan.contains("on=[(k@0, p@0)]"), "narrow is built: {plan}");
        let pool: Arc<dyn MemoryPool> = session.pool.clone();
        let other = MemoryConsumer::new("other operator").register(&pool);
        other.grow(5 << 19);
        let out = session.sql(sql).unwrap();
        let text = out.explain_analyze();
        let got = out.to_polars().unwrap();
        let got = got.sort(["k"], SortMultipleOptions::default()).unwrap();
        assert!(got.equals_missing(&want), "{text}");
        assert!(join_metric(&out, "spilled_partitions") > 0, "{text}");
        assert!(out.stats().peak_local_bytes <= budget, "{text}");
        drop(other);
        session.await_spill_release();
        assert_eq!(session.spill_bytes_held(), 0, "spill memory left behind");
        assert_eq!(session.reserved_bytes(), 0, "reservations left behind");
    }

    #[test]
    fn a_join_alone_in_its_plan_builds_on_most_of_the_budget_and_one_beside_others_on_half() {
        let (env, frames) = env_and_frames();
        // Read whole, the build side is counted at twice its rows: more than half
        // of a budget of 3.9 times its rows, so it is partitioned. Its partitions
        // with the table on them (an array by key: 1.25 times the rows) fit in what
        // they may hold beside the quarter the probe side's first rows take (read
        // for a swap of roles), so none is spilled.
        let rows = frames[1].1.data_bytes();
        let budget = Some(39 * rows / 10);
        let (_, want) = run(&env, &frames, None, SQL);
        let (out, got) = run(&env, &frames, budget, SQL);
        assert!(got.equals_missing(&want));
        let text = out.explain_analyze();
        assert_eq!(join_metric(&out, "spilled_partitions"), 0, "{text}");
        assert_eq!(out.stats().spill_files, 0, "{text}");
        // A sort above holds memory too: the join keeps to half and spills.
        let sorted = format!("{SQL} ORDER BY s_key");
        let (out, got) = run(&env, &frames, budget, &sorted);
        assert!(got.equals_missing(&want));
        let text = out.explain_analyze();
        assert!(join_metric(&out, "spilled_partitions") > 0, "{text}");
    }

    /// A pool in which an operator running beside the one under test takes all the
    /// free memory the moment anything is given back, and keeps it.
    #[derive(Debug)]
    struct GrabbingPool {
        inner: Arc<dyn MemoryPool>,
        limit: usize,
        grabbed: std::sync::Mutex<Option<MemoryReservation>>,
    }

    impl GrabbingPool {
        fn new(limit: usize) -> Arc<Self> {
            let inner: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(limit));
            let grabbed = MemoryConsumer::new("operator beside").register(&inner);
            Arc::new(GrabbingPool {
                inner,
                limit,
                grabbed: std::sync::Mutex::new(Some(grabbed)),
            })
        }

        fn grabbed(&self) -> usize {
            self.grabbed
                .lock()
                .unwrap()
                .as_ref()
                .map_or(0, |r| r.size())
        }
    }

    impl fmt::Display for GrabbingPool {
        fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
            write!(f, "grabbing({})", self.inner)
        }
    }

    impl MemoryPool for GrabbingPool {
        fn name(&self) -> &str {
            "grabbing"
        }
        fn grow(&self, reservation: &MemoryReservation, additional: usize) {
            self.inner.grow(reservation, additional);
        }
        fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
            self.inner.shrink(reservation, shrink);
            if let Some(grabbed) = self.grabbed.lock().unwrap().as_ref() {
                grabbed.grow(self.limit.saturating_sub(self.inner.reserved()));
            }
        }
        fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> DfResult<()> {
            self.inner.try_grow(reservation, additional)
        }
        fn reserved(&self) -> usize {
            self.inner.reserved()
        }
        fn memory_limit(&self) -> MemoryLimit {
            MemoryLimit::Finite(self.limit)
        }
    }

    #[test]
    fn a_build_side_that_fits_keeps_its_memory_for_the_join_building_on_it() {
        let (env, frames) = env_and_frames();
        let (_, want) = run(&env, &frames, None, SQL);
        // Small's rows cost 2 x 160 KB built: within half of 2 MiB.
        let budget = 2 << 20;
        let env = env.with_budget(Budget::from_limit(Some(budget as u64)).unwrap());
        let session = QuerySession::with_partitions(&env, 1).unwrap();
        for (name, frame) in &frames {
            session.register(name, frame).unwrap();
        }
        let (_, plan) = session.plan(SQL).unwrap();
        let pool = GrabbingPool::new(budget);
        let task = session.ctx.task_ctx();
        let runtime = datafusion::execution::runtime_env::RuntimeEnvBuilder::from_runtime_env(
            &task.runtime_env(),
        )
        .with_memory_pool(pool.clone())
        .build_arc()
        .unwrap();
        let task = Arc::try_unwrap(task).unwrap().with_runtime(runtime);
        let task = Arc::new(task);
        // Had the build side's memory been given back as the wrapped join took its
        // rows, the operator beside would have taken it and the join, which cannot
        // spill, would have failed to allocate its table.
        let batches = session
            .runtime
            .block_on(datafusion::physical_plan::collect(plan, task))
            .unwrap();
        let got = crate::interop::from_record_batches(&batches).unwrap();
        let first = got.get_column_names()[0].clone();
        let got = got.sort([first], SortMultipleOptions::default()).unwrap();
        assert!(got.equals_missing(&want));
        assert!(pool.grabbed() > 0, "the join's memory went back at its end");
        *pool.grabbed.lock().unwrap() = None;
        assert_eq!(pool.reserved(), 0, "nothing left reserved");
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
        // The build side's 320 KB cost 640 KB built: more than the seven eighths of
        // 512 KiB its partitions may hold (the join is alone in its plan).
        let (out, got) = run(&env, &frames, Some(512 << 10), sql);
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
            QuerySession::with_partitions(&env.with_budget(Budget::bytes(512 << 10).unwrap()), 1)
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
    fn a_partition_whose_build_side_is_empty_lets_its_probe_side_go_unread() {
        // Over two partitions the join is partitioned by key. Its build side is one
        // row, so one partition's build side is empty and that partition outputs
        // nothing without reading its probe side. Every chunk of `cycled` holds all
        // 16 keys (the join's dynamic filter skips none), so the repartition below
        // sends rows to both partitions: unless that partition takes its channel and
        // closes it, the repartition holds its share of `cycled`'s keys (about half,
        // 1.6 MB) for it and spills it all. Closed, it takes at most what was sent
        // before the partition had read its (empty) build side: a few batches.
        const CYCLED: i64 = 10 * ROWS;
        let (env, frames) = env_and_frames();
        let cycled = df!(
            "k" => (0..CYCLED).map(|i| i % 16).collect::<Vec<_>>(),
            "pad" => (0..CYCLED).collect::<Vec<_>>()
        )
        .unwrap();
        let session =
            QuerySession::with_partitions(&env.with_budget(Budget::bytes(256 << 10).unwrap()), 2)
                .unwrap();
        for (name, frame) in &frames {
            session.register(name, frame).unwrap();
        }
        let cycled = RemoteFrame::from_polars(&env, &cycled).unwrap();
        session.register("cycled", &cycled).unwrap();
        // A semi join keeping its build side's rows: partitioned even when its
        // build side is small (see `by_key_partitions`).
        let sql = "SELECT s.s_val FROM small s WHERE s.s_key + s.s_val = 0 \
                   AND EXISTS (SELECT 1 FROM cycled b WHERE b.k = s.s_key)";
        let out = session.sql(sql).unwrap();
        assert_eq!(out.stats.rows, 1);
        let plan = out.explain_analyze();
        assert!(plan.contains("mode=Partitioned"), "{plan}");
        let share = CYCLED as u64 / 2 * 8;
        assert!(out.stats.spill_bytes_written < share / 4, "{plan}");
        assert_eq!(
            session.release_timeouts(),
            0,
            "waited for spill files in vain"
        );
        assert_eq!(session.spill_bytes_held(), 0, "spill files left behind");
        assert_eq!(session.reserved_bytes(), 0);
    }

    #[test]
    fn a_partition_too_large_for_its_share_is_split_at_the_next_level() {
        // 200,000 unique keys joined with themselves at 64 KiB: the build side,
        // estimated at 1.6 MB, is split the most ways (64, not the 16 of a build
        // side estimated small); all 64 partitions spill (a file a side), and their
        // nested joins spill again.
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
        let (out, got) = run(&env, &frames, Some(64 << 10), sql);
        assert!(got.equals_missing(&want));
        let text = out.explain_analyze();
        assert_eq!(
            join_metric(&out, "spilled_partitions"),
            SPLIT_FANOUT,
            "{text}"
        );
        // Each nested join, split by its size into a few parts, keeps all but one
        // in memory and spills that one (a file a side).
        assert_eq!(
            out.stats().spill_files,
            (2 + 2) * SPLIT_FANOUT as u64,
            "{text}"
        );
        assert_eq!(
            out.stats().spill_bytes_written,
            out.stats().spill_bytes_read,
            "{text}"
        );
        assert!(out.stats().peak_local_bytes <= 64 << 10);
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
    fn the_probe_scan_drops_rows_outside_the_build_keys_when_few_pass() {
        // b_val takes every value of 0..999 in every chunk: no chunk can be skipped.
        // `b_pad < 300` keeps build keys 0..99, so a tenth of the probe rows can
        // match: the scan drops the others itself (the join would have probed them).
        let sql = "SELECT a.b_key, b.b_key AS probe FROM big a JOIN big b ON a.b_key = b.b_val \
                   WHERE a.b_pad < 300";
        let matching = (0..ROWS).filter(|i| i * 7 % 1000 < 100).count();
        let (env, frames) = env_and_frames();
        for budget in [None, Some(64 << 20)] {
            let (out, got) = run(&env, &frames, budget, sql);
            assert_eq!(got.height(), matching);
            let probe = got.column("probe").unwrap().i64().unwrap();
            assert!((0..probe.len()).all(|i| probe.get(i).is_some_and(|k| k * 7 % 1000 < 100)));
            assert_eq!(chunks_pruned(&out), 0, "{}", out.explain_analyze());
            let dropped = plan_metric(&out, "rows_filtered", "RemoteScanExec");
            assert_eq!(
                dropped,
                ROWS as usize - matching,
                "{}",
                out.explain_analyze()
            );
        }
        // Keys 0..999 pass every probe row: nothing is dropped (nor copied).
        let all = "SELECT a.b_key, b.b_key AS probe FROM big a JOIN big b ON a.b_key = b.b_val \
                   WHERE a.b_pad < 3000";
        let (out, got) = run(&env, &frames, Some(64 << 20), all);
        assert_eq!(got.height(), ROWS as usize);
        assert_eq!(plan_metric(&out, "rows_filtered", "RemoteScanExec"), 0);
    }

    #[test]
    fn the_probe_scan_drops_rows_whose_keys_the_sparse_build_keys_lack() {
        // Build keys 0, 100, ..., 900: their bounds pass 90 % of the probe rows
        // (b_val spans 0..999), too many to drop any; listed (10 keys over 901
        // values: sparse), they pass the 1 % that can match, and the scan drops the
        // rest although the join probes its probe side as it comes.
        let sql = "SELECT a.b_key, b.b_key AS probe FROM big a JOIN big b ON a.b_key = b.b_val \
                   WHERE a.b_pad < 3000 AND a.b_key % 100 = 0";
        let matching = (0..ROWS).filter(|i| i * 7 % 1000 % 100 == 0).count();
        let (env, frames) = env_and_frames();
        let (out, got) = run(&env, &frames, Some(64 << 20), sql);
        assert_eq!(got.height(), matching);
        let text = out.explain_analyze();
        assert!(text.contains("mode=CollectLeft"), "{text}");
        assert_eq!(
            plan_metric(&out, "rows_filtered", "RemoteScanExec"),
            ROWS as usize - matching,
            "{text}"
        );
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

    /// A frame of the arrow columns `cols`, in one record batch.
    fn frame_of(env: &FrameEnv, cols: Vec<(&str, ArrayRef)>) -> RemoteFrame {
        let batch = RecordBatch::try_from_iter(cols).unwrap();
        RemoteFrame::from_record_batches(env, &[batch]).unwrap()
    }

    /// The rows of `batches` as a multiset: encoded and sorted.
    fn row_multiset(batches: &[RecordBatch]) -> Vec<OwnedRow> {
        let Some(first) = batches.first() else {
            return Vec::new();
        };
        let fields = first
            .schema()
            .fields()
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect();
        let converter = RowConverter::new(fields).unwrap();
        let mut rows: Vec<OwnedRow> = batches
            .iter()
            .flat_map(|b| {
                let rows = converter.convert_columns(b.columns()).unwrap();
                rows.iter().map(|r| r.owned()).collect::<Vec<_>>()
            })
            .collect();
        rows.sort_unstable();
        rows
    }

    /// Key 7 repeated.
    const HOT: i64 = 7;
    const SKEWED_ROWS: i64 = 8_000;
    const PROBE_ROWS: i64 = 20_000;

    /// `s` (the smaller side, built): half its rows have key [`HOT`], the others
    /// unique keys. `p` (larger, probing): unique keys (those of `s`'s odd rows among
    /// them), and [`HOT`] on every 500th row: enough rows of it that its partition
    /// never fits a quarter of the budget, so roles never swap on the way down.
    fn skewed_frames() -> (FrameEnv, Vec<(&'static str, RemoteFrame)>) {
        let env = local_env(2, 128 << 20);
        let s_key = (0..SKEWED_ROWS).map(|i| if i % 2 == 0 { HOT } else { 100_000 + i });
        let s = frame_of(
            &env,
            vec![
                (
                    "k",
                    Arc::new(Int64Array::from_iter_values(s_key)) as ArrayRef,
                ),
                ("v", Arc::new(Int64Array::from_iter_values(0..SKEWED_ROWS))),
            ],
        );
        let p_key = (0..PROBE_ROWS).map(|i| if i % 500 == 0 { HOT } else { 100_000 + i });
        let pad = (0..PROBE_ROWS).map(|i| format!("{i:0>100}"));
        let p = frame_of(
            &env,
            vec![
                (
                    "k",
                    Arc::new(Int64Array::from_iter_values(p_key)) as ArrayRef,
                ),
                ("w", Arc::new(Int64Array::from_iter_values(0..PROBE_ROWS))),
                ("pad", Arc::new(StringArray::from_iter_values(pad))),
            ],
        );
        (env, vec![("s", s), ("p", p)])
    }

    /// A tenth of `s`'s bytes.
    fn skew_budget(frames: &[(&str, RemoteFrame)]) -> u64 {
        frames[0].1.data_bytes() / 10
    }

    /// A session over `frames` at `budget` (`None`: unlimited), in one partition.
    fn session_at(
        env: &FrameEnv,
        frames: &[(&str, RemoteFrame)],
        budget: Option<u64>,
    ) -> QuerySession {
        session_over(env, frames, budget, 1)
    }

    /// A session over `frames` at `budget` (`None`: unlimited) in `partitions`.
    fn session_over(
        env: &FrameEnv,
        frames: &[(&str, RemoteFrame)],
        budget: Option<u64>,
        partitions: usize,
    ) -> QuerySession {
        let env = env.with_budget(Budget::from_limit(budget).unwrap());
        let session = QuerySession::with_partitions(&env, partitions).unwrap();
        for (name, frame) in frames {
            session.register(name, frame).unwrap();
        }
        session
    }

    /// Runs `sql` unbudgeted and at `budget`; checks the answers are the same rows,
    /// the peak within the budget and nothing left allocated; returns the budgeted
    /// run.
    fn same_as_unbudgeted(
        env: &FrameEnv,
        frames: &[(&str, RemoteFrame)],
        budget: u64,
        sql: &str,
        rows: usize,
    ) -> QueryOutput {
        let want = session_at(env, frames, None).sql(sql).unwrap();
        assert_eq!(want.rows(), rows, "{sql}");
        let session = session_at(env, frames, Some(budget));
        let plan = session.explain(sql).unwrap();
        let got = session
            .sql(sql)
            .unwrap_or_else(|e| panic!("{sql}: {e}\n{plan}"));
        let text = got.explain_analyze();
        assert!(
            row_multiset(got.batches()) == row_multiset(want.batches()),
            "{sql}: answers differ\n{text}"
        );
        assert!(
            got.stats().peak_local_bytes <= budget,
            "{sql}: peak {} over {budget}\n{text}",
            got.stats().peak_local_bytes
        );
        assert_eq!(session.spill_bytes_held(), 0, "spill memory left behind");
        assert_eq!(session.reserved_bytes(), 0, "reservations left behind");
        got
    }

    #[test]
    fn a_key_too_frequent_for_the_budget_is_joined_piece_by_piece() {
        let (env, frames) = skewed_frames();
        let sql = "SELECT s.k, s.v, p.w, p.pad FROM s JOIN p ON s.k = p.k";
        // 4,000 build rows of HOT meet 40 probe rows; the 4,000 odd rows match once.
        let rows = 4_000 * 40 + 4_000;
        let out = same_as_unbudgeted(&env, &frames, skew_budget(&frames), sql, rows);
        let text = out.explain_analyze();
        assert!(join_metric(&out, "skew_pieces") > 1, "{text}");
        assert_eq!(join_metric(&out, "skew_duplicates"), 0, "{text}");
    }

    #[test]
    fn joins_preserving_build_rows_are_joined_piece_by_piece_too() {
        // Each build row's output depends on that row and the probe side only:
        // rows unmatched in a piece are unmatched in all. The filter leaves the half
        // of HOT's build rows with v % 4 = 0 (p's rows of HOT have w % 4 = 0) and
        // every odd row (v = w) unmatched. The filter on `pad` (always true) keeps
        // the probe rows wide, so that roles never swap on the way down.
        let (env, frames) = skewed_frames();
        let budget = skew_budget(&frames);
        let on = "p.k = s.k AND p.w % 4 <> s.v % 4 AND p.pad <> CAST(s.v AS VARCHAR)";
        for (sql, join_type, rows) in [
            (
                format!("SELECT s.k, s.v, p.w, p.pad FROM s LEFT JOIN p ON {on}"),
                "join_type=Left,",
                2_000 * 40 + 2_000 + 4_000,
            ),
            (
                format!("SELECT s.k, s.v FROM s WHERE EXISTS (SELECT 1 FROM p WHERE {on})"),
                "join_type=LeftSemi,",
                2_000,
            ),
            (
                format!("SELECT s.k, s.v FROM s WHERE NOT EXISTS (SELECT 1 FROM p WHERE {on})"),
                "join_type=LeftAnti,",
                2_000 + 4_000,
            ),
        ] {
            let out = same_as_unbudgeted(&env, &frames, budget, &sql, rows);
            let text = out.explain_analyze();
            assert!(text.contains(join_type), "{sql}: {text}");
            assert!(join_metric(&out, "skew_pieces") > 1, "{sql}: {text}");
        }
    }

    #[test]
    fn a_semi_or_anti_join_keeps_one_build_row_of_a_frequent_key() {
        let (env, frames) = skewed_frames();
        let budget = skew_budget(&frames);
        for (sql, rows) in [
            (
                "SELECT p.k, p.w, p.pad FROM p WHERE EXISTS (SELECT 1 FROM s WHERE s.k = p.k)",
                40 + 4_000,
            ),
            (
                "SELECT p.k, p.w, p.pad FROM p WHERE p.k IN (SELECT k FROM s)",
                40 + 4_000,
            ),
            (
                "SELECT p.k, p.w, p.pad FROM p \
                 WHERE NOT EXISTS (SELECT 1 FROM s WHERE s.k = p.k)",
                PROBE_ROWS as usize - 40 - 4_000,
            ),
        ] {
            let out = same_as_unbudgeted(&env, &frames, budget, sql, rows);
            let text = out.explain_analyze();
            assert!(text.contains("join_type=Right"), "{sql}: {text}");
            // All but one of the build rows of HOT dropped.
            assert!(
                join_metric(&out, "skew_duplicates") >= 3_999,
                "{sql}: {text}"
            );
            assert_eq!(join_metric(&out, "skew_pieces"), 0, "{sql}: {text}");
        }
    }

    #[test]
    fn a_left_join_built_on_a_frequent_key_fails_naming_it() {
        let (env, frames) = skewed_frames();
        // `p` is preserved and larger: `s` is built, as a right join's build side,
        // whose probe rows each depend on every build row of their key.
        let sql = "SELECT p.k, p.w, p.pad, s.v FROM p LEFT JOIN s ON p.k = s.k";
        let session = session_at(&env, &frames, Some(skew_budget(&frames)));
        let plan = session.explain(sql).unwrap();
        assert!(plan.contains("join_type=Right"), "{plan}");
        let err = session.sql(sql).unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(&err, Error::Skew { kernel, key, level, .. }
                if key == "k=7" && kernel.contains("hash join") && *level == MAX_LEVEL),
            "{text}"
        );
        assert_eq!(session.spill_bytes_held(), 0, "spill memory left behind");
        assert_eq!(session.reserved_bytes(), 0, "reservations left behind");
        // The session still answers.
        assert_eq!(session.sql("SELECT count(*) FROM s").unwrap().rows(), 1);
    }

    /// A session over two partitions whose joins all collect their build sides.
    fn collecting_session(
        env: &FrameEnv,
        frames: &[(&str, RemoteFrame)],
        budget: Option<u64>,
    ) -> QuerySession {
        let session = session_over(env, frames, budget, 2);
        let state = session.ctx.state_ref();
        let mut state = state.write();
        let optimizer = &mut state.config_mut().options_mut().optimizer;
        optimizer.hash_join_single_partition_threshold = usize::MAX;
        optimizer.hash_join_single_partition_threshold_rows = usize::MAX;
        drop(state);
        session
    }

    /// The plan of a join wrapped to read its build side once for all partitions.
    const SHARED_PLAN: &str = "SpillingHashJoinExec: level=0, wraps HashJoinExec: mode=CollectLeft";

    /// Runs `sql` over two partitions with every build side collected, unbudgeted
    /// and at `budget`; checks that its plan holds `planned` (a join reading its
    /// build side once for both partitions: [`SHARED_PLAN`]), the answers are the
    /// same rows, the peak is within the budget and nothing is left allocated.
    fn collected_as_unbudgeted(budget: u64, sql: &str, planned: &str) -> QueryOutput {
        let (env, frames) = env_and_frames();
        let want = collecting_session(&env, &frames, None).sql(sql).unwrap();
        let session = collecting_session(&env, &frames, Some(budget));
        let plan = session.explain(sql).unwrap();
        assert!(plan.contains(planned), "{plan}");
        let got = session
            .sql(sql)
            .unwrap_or_else(|e| panic!("{sql}: {e}\n{plan}"));
        let text = got.explain_analyze();
        assert!(
            row_multiset(got.batches()) == row_multiset(want.batches()),
            "{sql}: answers differ\n{text}"
        );
        assert!(got.stats().peak_local_bytes <= budget, "{text}");
        assert_eq!(session.spill_bytes_held(), 0, "spill memory left behind");
        assert_eq!(session.reserved_bytes(), 0, "reservations left behind");
        got
    }

    #[test]
    fn a_build_side_collected_for_all_partitions_is_read_once_and_kept_if_it_fits() {
        // Small's rows cost 2 x 400 KB built: within half of 4 MiB.
        let out = collected_as_unbudgeted(4 << 20, SQL, SHARED_PLAN);
        assert_eq!(out.rows(), ROWS as usize / 4);
        assert_eq!(out.stats().spill_files, 0, "{}", out.explain_analyze());
        assert_eq!(join_metric(&out, "spilled_partitions"), 0);
    }

    #[test]
    fn a_collected_build_side_too_large_to_share_is_partly_spilled_and_joined_by_each_partition() {
        // Big's rows cost 2 x 960 KB built, more than 7/8 of 1 MiB (the join is
        // its plan's only holder): the build side is split by key hash, partitions kept in memory within half the budget
        // and the others spilled, and each partition joins its probe rows of the
        // spilled ones partition by partition.
        let sql = "SELECT a.b_key, a.b_val, b.b_pad FROM big a JOIN big b ON a.b_key = b.b_key";
        let out = collected_as_unbudgeted(1 << 20, sql, SHARED_PLAN);
        assert_eq!(out.rows(), ROWS as usize);
        let text = out.explain_analyze();
        let spilled = join_metric(&out, "spilled_partitions");
        assert!(spilled > 0 && spilled < JOIN_FANOUT, "{spilled}\n{text}");
        // A spilled partition's build rows once, and each partition's probe rows.
        assert_eq!(out.stats().spill_files, 3 * spilled as u64, "{text}");
    }

    #[test]
    fn a_shared_build_dropped_midway_frees_its_spill_files_and_memory() {
        let sql = "SELECT a.b_key, a.b_val, b.b_pad FROM big a JOIN big b ON a.b_key = b.b_key";
        let (env, frames) = env_and_frames();
        let session = collecting_session(&env, &frames, Some(1 << 20));
        let (_, plan) = session.plan(sql).unwrap();
        let task = session.ctx.task_ctx();
        let mut first = plan.execute(0, task.clone()).unwrap();
        let second = plan.execute(1, task).unwrap();
        let batch = session.runtime.block_on(first.next()).unwrap().unwrap();
        assert!(batch.num_rows() > 0);
        // The build side is split by now, some partitions in memory elements.
        assert!(session.spill_bytes_held() > 0);
        drop((first, second, plan));
        session.await_spill_release();
        assert_eq!(session.spill_bytes_held(), 0, "spill files left behind");
        assert_eq!(session.reserved_bytes(), 0, "reservations left behind");
    }

    #[test]
    fn a_join_keeping_unmatched_build_rows_is_partitioned_instead_of_collected() {
        // Small is built and its rows are all output: over two partitions a row
        // unmatched in one partition's probe rows may be matched in the other's.
        let sql = "SELECT s.s_key, s.s_val, b.b_val FROM small s \
                   LEFT JOIN (SELECT * FROM big WHERE b_val < 500) b ON s.s_key = b.b_key";
        let planned = "wraps HashJoinExec: mode=Partitioned, join_type=Left";
        let out = collected_as_unbudgeted(1536 << 10, sql, planned);
        assert_eq!(out.rows(), ROWS as usize / 4);
    }

    #[test]
    fn a_probe_preserving_join_over_a_spilled_shared_build_keeps_every_probe_row() {
        // `a` is wider, so `b` is built and the left join runs as a right join with
        // `a` probing: b_pad = 3i matches a key for a third of the rows.
        let sql = "SELECT a.b_key, a.x, b.b_val FROM (SELECT *, b_pad + 1 AS x FROM big) a \
                   LEFT JOIN big b ON a.b_pad = b.b_key";
        let out = collected_as_unbudgeted(1 << 20, sql, SHARED_PLAN);
        assert!(
            out.explain_analyze()
                .contains("mode=CollectLeft, join_type=Right"),
            "{}",
            out.explain_analyze()
        );
        assert_eq!(out.rows(), ROWS as usize);
        assert!(
            join_metric(&out, "spilled_partitions") > 0,
            "{}",
            out.explain_analyze()
        );
    }

    /// `facts`: keys 0..ROWS, every tenth null, and a value; with `small` (every
    /// fourth key) as the dimension.
    fn with_null_keyed_facts() -> (FrameEnv, Vec<(&'static str, RemoteFrame)>) {
        let (env, mut frames) = env_and_frames();
        let facts = df!(
            "f_key" => (0..ROWS).map(|i| (i % 10 != 0).then_some(i)).collect::<Vec<_>>(),
            "f_val" => (0..ROWS).map(|i| i % 100).collect::<Vec<_>>()
        )
        .unwrap();
        frames.push(("facts", RemoteFrame::from_polars(&env, &facts).unwrap()));
        (env, frames)
    }

    /// Runs `sql` unbudgeted and at 64 MiB over one partition and over two (a build
    /// side shared by both), checks the answers are the same rows, and returns
    /// the joins' `probe_filtered` at one and at two partitions and the rows.
    fn probe_filtered(
        env: &FrameEnv,
        frames: &[(&str, RemoteFrame)],
        sql: &str,
    ) -> (usize, usize, usize) {
        let want = collecting_session(env, frames, None).sql(sql).unwrap();
        let (one, got) = run(env, frames, Some(64 << 20), sql);
        assert_eq!(
            got.height(),
            want.rows(),
            "{sql}\n{}",
            one.explain_analyze()
        );
        let session = collecting_session(env, frames, Some(64 << 20));
        let two = session.sql(sql).unwrap();
        let text = two.explain_analyze();
        assert!(
            row_multiset(two.batches()) == row_multiset(want.batches()),
            "{sql}: answers differ\n{text}"
        );
        assert_eq!(session.reserved_bytes(), 0, "reservations left behind");
        (
            join_metric(&one, "probe_filtered"),
            join_metric(&two, "probe_filtered"),
            want.rows(),
        )
    }

    #[test]
    fn a_join_that_only_filters_its_probe_rows_runs_as_a_filter() {
        let (env, frames) = with_null_keyed_facts();
        // Keys 4k with k % 13 < 5 pass; none of small's columns is output.
        let sql = "SELECT f_key, f_val FROM facts JOIN small ON f_key = s_key WHERE s_val < 5";
        let (one, two, rows) = probe_filtered(&env, &frames, sql);
        let want = (0..ROWS)
            .filter(|k| k % 4 == 0 && k % 10 != 0 && k % 13 < 5)
            .count();
        assert_eq!(rows, want);
        assert_eq!((one, two), (1, 1));
        // A join output no row of whose probe side passes: none.
        let none = "SELECT f_val FROM facts JOIN small ON f_key = s_key WHERE s_val > 100";
        assert_eq!(probe_filtered(&env, &frames, none).2, 0);
    }

    #[test]
    fn semi_and_anti_joins_filter_by_the_build_keys_and_anti_keeps_null_keys() {
        let (env, frames) = with_null_keyed_facts();
        let semi = "SELECT f_key, f_val FROM facts \
                    WHERE EXISTS (SELECT 1 FROM small WHERE s_key = f_key AND s_val < 5)";
        let (one, two, rows) = probe_filtered(&env, &frames, semi);
        let matched = (0..ROWS)
            .filter(|k| k % 4 == 0 && k % 10 != 0 && k % 13 < 5)
            .count();
        assert_eq!((one, two, rows), (1, 1, matched));
        let anti = "SELECT f_key, f_val FROM facts \
                    WHERE NOT EXISTS (SELECT 1 FROM small WHERE s_key = f_key AND s_val < 5)";
        let (one, two, rows) = probe_filtered(&env, &frames, anti);
        // The null keys (a tenth) match nothing and are kept.
        assert_eq!((one, two, rows), (1, 1, ROWS as usize - matched));
    }

    #[test]
    fn joins_that_output_build_rows_or_repeat_build_keys_stay_joins() {
        let (env, frames) = with_null_keyed_facts();
        // A build column output.
        let sql = "SELECT f_key, s_val FROM facts JOIN small ON f_key = s_key";
        let (one, two, _) = probe_filtered(&env, &frames, sql);
        assert_eq!((one, two), (0, 0));
        // Each build key twice: each matching probe row is output twice.
        let twice = "SELECT f_key FROM facts JOIN \
                     (SELECT s_key FROM small UNION ALL SELECT s_key FROM small) d \
                     ON f_key = d.s_key";
        let (one, two, rows) = probe_filtered(&env, &frames, twice);
        assert_eq!((one, two), (0, 0));
        let matched = (0..ROWS).filter(|k| k % 4 == 0 && k % 10 != 0).count();
        assert_eq!(rows, 2 * matched);
    }
}
