//! A hash aggregate whose state spills to memory elements by hash partitioning.
//!
//! DataFusion's hash aggregate spills by sorting its state, which needs memory of its
//! own; at a small budget that sort cannot get it and the query fails. Under a budget
//! the session keeps aggregation in two phases (a partial aggregate, which emits early
//! when its memory runs short, then a final one), and [`SpillingAggregateExec`] wraps
//! the final phase (or a single-phase aggregate over plain GROUP BY keys): it reads
//! its input while its reservation grows; if the whole input fits, the wrapped
//! aggregate runs as is on the rows read. If not, the input is hash-partitioned on the
//! group keys: the partitions that fit stay in memory (a final phase's as hash tables
//! of their groups, which take every later row of theirs without growing much, see
//! [`super::aggregate_groups`]; others as rows), the rest go to spill files in memory
//! elements, and the wrapped aggregate runs on the spilled ones partition by
//! partition, each again through a spilling aggregate with a new hash seed, so a
//! partition that is still too large is split again. Every group lands in exactly one
//! partition, so the answer is DataFusion's. Where the groups can be estimated from
//! the frames' distinct-count sketches, the first level splits into as few
//! partitions as that estimate needs, and a sole aggregate whose groups will not fit
//! has its partial phase pass rows on instead of aggregating them twice.
//!
//! After [`MAX_LEVEL`] levels the wrapped aggregate runs on the partition as is. A
//! partition still too large there holds a key value more frequent than the budget
//! allows. That is no failure in itself: the aggregate holds a state per group, not
//! its rows, and a group's count or sum stays small however many rows it has, so the
//! aggregate runs on. Only a group whose state grows with its rows (`array_agg`,
//! `string_agg`, a median, a single-phase `count(DISTINCT)`) can outgrow the budget,
//! and no partitioning splits one group: the aggregate's out-of-memory failure there
//! is reported as [`Error::Skew`] naming the partition's most frequent key.
//!
//! [`Error::Skew`]: crate::Error::Skew

use std::fmt;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::DataType;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::Result as DfResult;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryLimit, MemoryPool};
use datafusion::execution::{SpillFile, TaskContext};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet, SpillMetrics,
};
use datafusion::physical_plan::spill::SpillManager;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    ChildrenPropertiesMode, DisplayAs, DisplayFormatType, ExecutionPlan, InputOrderMode,
    PlanProperties, ReplaceChildrenOptions, SendableRecordBatchStream,
};
use futures::{StreamExt, TryStreamExt};

use super::aggregate_groups::{merges_states, HeldGroups, HybridGroups};
use super::grace::{
    aggregate_fanout, level_seed, partition_stream, split_fanout, HybridPartitions, OneShotExec,
    Partitioner, SizedBlocks, MAX_LEVEL,
};
use super::join_order;
use super::operator::{
    budget_bytes, estimated_row_width, holder_cap, memory_holders, only_child, replace_each,
    task_context_like,
};
use super::owned::{owned_batch, rows_bytes};
use super::reserved_pool::ReservedPool;
use super::scan::{column_distinct, passes_rows, rows_bound, semi_joined};
use super::skew::{memory_error_as, most_frequent_key, skew_error};
use super::spill::RemoteSpillFactory;
use super::unordered::{sorted_only_by_constants, UnorderedExec};

/// Replaces the final phase of DataFusion's hash aggregates by
/// [`SpillingAggregateExec`] (a physical optimizer rule, added when the session has a
/// budget).
#[derive(Debug, Default)]
pub(crate) struct SpillingAggregates;

impl PhysicalOptimizerRule for SpillingAggregates {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let sole = memory_holders(plan.as_ref()) == 1;
        replace_each(plan, |agg: &AggregateExec| {
            let agg = if holds_final_state(agg) && sorted_only_by_constants(agg) {
                // Sorted only on keys a filter made constant, DataFusion's ordered
                // final aggregate can emit nothing before its input ends, and spills
                // by sorting, which needs memory of its own (q4 and q11 at 16 MiB
                // failed in it): run it unordered, partitioned like the others.
                let input: Arc<dyn ExecutionPlan> =
                    Arc::new(UnorderedExec::new(agg.input().clone()));
                let options = ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute);
                let unordered = Arc::new(agg.clone()).replace_children(vec![input], options)?;
                match unordered.downcast_ref::<AggregateExec>() {
                    Some(a) => a.clone(),
                    None => return Ok(None),
                }
            } else {
                agg.clone()
            };
            Ok(wrappable(&agg).then(|| {
                let ways = agg.properties().partitioning.partition_count().max(1);
                let estimate = group_estimate(&agg);
                let mut exec =
                    SpillingAggregateExec::new(Arc::new(agg), 0, String::new(), ways, None, sole);
                exec.groups = estimate.as_ref().map(GroupEstimate::groups);
                exec.unreduced = estimate.is_some_and(|e| e.unreduced());
                Arc::new(exec) as _
            }))
        })
    }

    fn name(&self) -> &str {
        "scad_spilling_aggregates"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// Whether `agg` holds state per group that partitioning on its group keys splits:
/// a final phase (its keys are the partial phase's output columns, grouping sets
/// included as the grouping id), or a single phase over plain GROUP BY keys (with
/// grouping sets, one group takes rows of many key values). Aggregates over sorted
/// input stream and need no help; nor do those without keys or with a limit.
fn wrappable(agg: &AggregateExec) -> bool {
    holds_final_state(agg)
        && agg.group_expr().is_single()
        && !agg.group_expr().expr().is_empty()
        && *agg.input_order_mode() == InputOrderMode::Linear
        && agg.limit_options().is_none()
}

/// Whether `agg` holds each group's final state until its input ends (or its
/// order says a group is complete): a final or single phase.
fn holds_final_state(agg: &AggregateExec) -> bool {
    matches!(
        agg.mode(),
        AggregateMode::Final
            | AggregateMode::FinalPartitioned
            | AggregateMode::Single
            | AggregateMode::SinglePartitioned
    )
}

/// The bytes a row of a column of variable width is estimated to take (its view).
const VARIABLE_WIDTH: usize = 16;

/// See the module docs.
#[derive(Debug)]
pub(crate) struct SpillingAggregateExec {
    agg: Arc<AggregateExec>,
    level: u32,
    /// The partition this aggregate aggregates, by its index at each level (`3/7`;
    /// empty at level 0), for errors.
    path: String,
    /// Partitions of the level-0 aggregate, which run at once and share the budget.
    ways: usize,
    /// The partitions its input is split into if it does not fit (`None`: by its
    /// cap, [`aggregate_fanout`]).
    fanout: Option<usize>,
    /// Whether the aggregate is the only operator of its plan that holds memory (see
    /// [`holder_cap`]).
    sole: bool,
    /// The groups of the level-0 aggregate as the frames' sketches estimate them
    /// (see [`group_estimate`]; `None`: unknown, or a level below).
    groups: Option<usize>,
    /// Whether its keys are estimated to be distinct on nearly every row (see
    /// [`GroupEstimate::unreduced`]).
    unreduced: bool,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl SpillingAggregateExec {
    fn new(
        agg: Arc<AggregateExec>,
        level: u32,
        path: String,
        ways: usize,
        fanout: Option<usize>,
        sole: bool,
    ) -> Self {
        let properties = agg.properties().clone();
        SpillingAggregateExec {
            agg,
            level,
            path,
            ways,
            fanout,
            sole,
            groups: None,
            unreduced: false,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }

    /// What the groups of one partition of this aggregate are estimated to reserve
    /// (as [`state_cost`] counts them: a group's state is a row of a final phase's
    /// input), from [`SpillingAggregateExec::groups`] and the input's column widths.
    fn groups_cost(&self) -> Option<usize> {
        let groups = self.groups?.div_ceil(self.ways);
        let width = estimated_row_width(self.agg.input().schema().fields(), VARIABLE_WIDTH);
        Some(2usize.saturating_mul(groups).saturating_mul(width))
    }

    /// The wrapped aggregate over `input` (one partition).
    fn with_input(&self, input: Arc<dyn ExecutionPlan>) -> DfResult<Arc<AggregateExec>> {
        let agg = AggregateExec::try_new(
            *self.agg.mode(),
            self.agg.group_expr().clone(),
            self.agg.aggr_expr().to_vec(),
            self.agg.filter_expr().to_vec(),
            input,
            self.agg.input_schema(),
        )?;
        Ok(Arc::new(agg))
    }
}

impl DisplayAs for SpillingAggregateExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "SpillingAggregateExec: level={}, ", self.level)?;
        if let Some(groups) = self.groups {
            write!(f, "groups~{groups}, ")?;
        }
        write!(f, "wraps ")?;
        self.agg.fmt_as(t, f)
    }
}

impl ExecutionPlan for SpillingAggregateExec {
    fn name(&self) -> &str {
        "SpillingAggregateExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![self.agg.input()]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        self.agg.apply_expressions(f)
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let input = only_child("SpillingAggregateExec", children)?;
        let mut exec = SpillingAggregateExec::new(
            self.with_input(input)?,
            self.level,
            self.path.clone(),
            self.ways,
            self.fanout,
            self.sole,
        );
        exec.groups = self.groups;
        exec.unreduced = self.unreduced;
        Ok(Arc::new(exec))
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
        let run = AggregateRun {
            exec: SpillingAggregateExec {
                agg: self.agg.clone(),
                level: self.level,
                path: self.path.clone(),
                ways: self.ways,
                fanout: self.fanout,
                sole: self.sole,
                groups: self.groups,
                unreduced: self.unreduced,
                properties: self.properties.clone(),
                metrics: self.metrics.clone(),
            },
            partition,
            context,
            spilled_partitions: MetricBuilder::new(&self.metrics)
                .counter("spilled_partitions", partition),
        };
        let schema = self.agg.schema();
        let stream = futures::stream::once(run.start()).try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

/// One partition's execution.
struct AggregateRun {
    exec: SpillingAggregateExec,
    partition: usize,
    context: Arc<TaskContext>,
    spilled_partitions: Count,
}

impl AggregateRun {
    async fn start(self) -> DfResult<SendableRecordBatchStream> {
        let agg = &self.exec.agg;
        let input_schema = agg.input().schema();
        // This partition's share of the budget: the aggregate's partitions run at
        // once.
        let (cap, floor) = match self.context.memory_pool().memory_limit() {
            MemoryLimit::Finite(bytes) => {
                let share = bytes / self.exec.ways;
                (
                    holder_cap(share, self.exec.sole),
                    (share / 16).min(FLOOR_CAP),
                )
            }
            _ => (usize::MAX, 0),
        };
        let groups_cost = self.exec.groups_cost();
        let input_context = if self.exec.sole {
            let partials = match groups_cost {
                // Groups estimated not to fit the cap do not fit a partial phase
                // either (it has what the cap leaves): it would emit early again
                // and again, aggregating little at the cost of hashing every row
                // twice.
                Some(cost) if cost > cap => Partials::Skip,
                // Groups that fit leave the partial phase the memory its probe
                // needs to see what it reduces.
                Some(_) => Partials::Probe,
                None => Partials::Aggregate,
            };
            partials_context(&self.context, partials)
        } else if self.exec.unreduced {
            // Beside other holders partial phases never skip (one short of memory
            // emits early and its probe reads that as no reduction), unless their
            // keys are estimated distinct on every row: then they hash every row
            // for nothing (q97's customer and item pairs: 553 K groups of 554 K rows).
            partials_context(&self.context, Partials::Skip)
        } else {
            self.context.clone()
        };
        let mut input = agg.input().execute(self.partition, input_context)?;
        let reservation = MemoryConsumer::new(format!(
            "SpillingAggregate[{}] level {}",
            self.partition, self.exec.level
        ))
        .with_can_spill(true)
        .register(self.context.memory_pool());
        // Room kept from the start, before the input runs: an operator above that
        // takes all the memory free (a sort fed by this aggregate) would otherwise
        // leave its partitions none. Less if less is free.
        let _ = reservation.try_grow(floor);
        // A final phase that does not fit holds its groups, not its rows (see
        // below): it holds rows up to half its cap, so that its groups have the
        // other half to grow in while those rows are merged into them.
        let grows = state_grows_with_rows(agg);
        let holds_groups = merges_states(agg) && !grows;
        let rows_cap = if holds_groups { cap / 2 } else { cap };
        let mut held = Vec::new();
        let mut used = 0;
        let mut overflow = None;
        while let Some(batch) = input.next().await {
            let batch = batch?;
            // As a join's build side: at most half the budget, so that the
            // operators feeding this one keep room while it reads (all but a margin
            // when nothing else in the plan holds memory).
            let need = used + state_cost(&batch);
            let room = need <= reservation.size()
                || (need <= rows_cap && reservation.try_grow(need - reservation.size()).is_ok());
            if room {
                used = need;
                held.push(batch);
            } else {
                overflow = Some(batch);
                break;
            }
        }
        let Some(first_overflow) = overflow else {
            // It fits: the wrapped aggregate runs on the rows read, its state made
            // out of the memory they were read under (lent, as a join's build side
            // is: given back batch by batch it went to operators running beside).
            let (rows, context) =
                ReservedPool::lend_rows(input_schema, held, reservation, &self.context)?;
            let inner = self.exec.with_input(Arc::new(rows))?;
            return inner.execute(0, context);
        };
        // Too large: a hybrid partitioning of the input by group key. The
        // partitions kept in memory take the cap (of a partitioning of rows, all
        // but the room), the largest spilled to memory elements when they do not
        // fit; half the cap is kept as room for the spilled partitions' runs
        // (nothing above has had rows of this aggregate yet, and will take what
        // this aggregate gives back).
        let keys = agg.group_expr().input_exprs();
        let spill_metrics = SpillMetrics::new(&self.exec.metrics, self.partition);
        let spill = Arc::new(SpillManager::new(
            self.context.runtime_env(),
            spill_metrics.clone(),
            input_schema.clone(),
        ));
        let room = (cap / 2).max(floor).min(reservation.size());
        let partitioner = Partitioner::new(
            keys.clone(),
            level_seed(self.exec.level),
            self.exec
                .fanout
                .unwrap_or_else(|| aggregate_fanout(cap, groups_cost)),
        );
        let batch_rows = self.context.session_config().batch_size();
        // The rows read so far were reserved as read; the first that overflowed
        // was not, and gives nothing back when handed over.
        let held_rows = held
            .into_iter()
            .map(|b| (state_cost(&b), b))
            .chain([(0, first_overflow)]);
        let (in_memory, reservation, keep, spilled, files) = if holds_groups {
            // A final phase: the partitions in memory hold their groups, merged
            // as rows come, in the whole cap; their memory becomes the room as
            // their answers are handed on.
            // The spilled partitions' writers hold a block each: together at most
            // a quarter of the cap (as a join's 64 files with the session's blocks
            // keep a quarter of the budget), so fewer files write larger blocks.
            let sized = self
                .context
                .session_config()
                .get_extension::<RemoteSpillFactory>()
                .map(|factory| SizedBlocks {
                    factory,
                    block_bytes: cap / 4 / partitioner.fanout(),
                    metrics: spill_metrics.clone(),
                });
            let mut groups = HybridGroups::new(
                agg.clone(),
                partitioner,
                spill.clone(),
                reservation,
                cap,
                batch_rows,
                state_cost,
            )?
            .with_sized_blocks(sized);
            for (reserved, batch) in held_rows {
                groups.give_back(reserved);
                groups.push(&batch)?;
            }
            while let Some(batch) = input.next().await {
                groups.push(&batch?)?;
            }
            let build = groups.finish()?;
            let held = match build.held.is_empty() {
                true => InMemory::Nothing,
                false => InMemory::Groups(build.held),
            };
            // No room is kept for runs when nothing was spilled.
            let keep = if build.spilled.iter().any(|&s| s) {
                room
            } else {
                0
            };
            (held, build.reservation, keep, build.spilled, build.files)
        } else {
            // The partitions in memory hold their rows, in the cap less the room.
            // An aggregate whose state grows with its rows may outgrow what its
            // rows reserve: all its partitions are spilled and run one at a time
            // through the levels, where a group too large for the budget is found
            // and named.
            let later = reservation.split(room);
            let in_memory_cap = if grows { 0 } else { cap.saturating_sub(room) };
            let mut partitions = HybridPartitions::new(
                partitioner,
                spill.clone(),
                "hash aggregate",
                reservation,
                in_memory_cap,
                state_cost,
            );
            // The rows read so far are handed over one by one, each giving its
            // share back as its pieces reserve theirs.
            for (reserved, batch) in held_rows {
                partitions.give_back(reserved);
                partitions.push(&batch)?;
            }
            while let Some(batch) = input.next().await {
                partitions.push(&batch?)?;
            }
            let build = partitions.finish()?;
            let keep = later.size();
            drop(later);
            let rows = match build.held.is_empty() {
                true => InMemory::Nothing,
                false => InMemory::Rows(build.held),
            };
            (rows, build.reservation, keep, build.spilled, build.files)
        };
        self.spilled_partitions
            .add(spilled.iter().filter(|&&s| s).count());
        let schema = agg.schema();
        let level = self.exec.level;
        let budget = budget_bytes(&self.context);
        // The memory is lent to what runs inside: first the partitions kept in
        // memory, out of the memory they were read under (or their groups held), and
        // the room kept; then the spilled ones, one run after another in that room,
        // which the runs hand back to this aggregate, not to the pool, as each is done.
        let keep = match in_memory {
            // The groups' memory becomes the room as their answers are handed on.
            InMemory::Groups(_) => {
                let short = keep.saturating_sub(reservation.size());
                match reservation.try_grow(short) {
                    Ok(()) => keep,
                    Err(_) => reservation.size().min(keep),
                }
            }
            _ => match reservation.try_grow(keep) {
                Ok(()) => keep,
                Err(_) => 0,
            },
        };
        let limit = self.context.memory_pool().memory_limit();
        let lent = Arc::new(ReservedPool::new(reservation, keep, limit));
        let pool: Arc<dyn MemoryPool> = lent.clone();
        let context = ReservedPool::context(lent, &self.context)?;
        let in_memory = match in_memory {
            InMemory::Nothing => None,
            InMemory::Groups(held) => {
                let groups = MemoryConsumer::new(format!(
                    "SpillingAggregate[{}] level {} groups",
                    self.partition, self.exec.level
                ))
                .register(&pool);
                groups.grow(held.bytes());
                Some(Box::pin(held.answers(groups)) as BatchStream)
            }
            InMemory::Rows(held) => {
                let rows = futures::stream::iter(held.into_iter().map(Ok));
                let rows = OneShotExec::new(
                    input_schema.clone(),
                    Box::pin(RecordBatchStreamAdapter::new(input_schema, rows)),
                );
                let inner = self.exec.with_input(Arc::new(rows))?;
                Some(Box::pin(inner.execute(0, context.clone())?) as BatchStream)
            }
        };
        let exec = Arc::new(self.exec);
        let run_target = if grows { 0 } else { cap / 4 * 3 };
        let runs = futures::stream::iter(coalesced_runs(files, run_target)).map(
            move |run| -> DfResult<SendableRecordBatchStream> {
                let leaf = OneShotExec::new(
                    spill.schema().clone(),
                    run_stream(&spill, &run.files, batch_rows)?,
                );
                let inner = exec.with_input(Arc::new(leaf))?;
                let path = match exec.path.as_str() {
                    "" => run.name,
                    parent => format!("{parent}/{}", run.name),
                };
                if level < MAX_LEVEL {
                    return SpillingAggregateExec::new(
                        inner,
                        level + 1,
                        path,
                        exec.ways,
                        Some(split_fanout(run.cost, cap)),
                        exec.sole,
                    )
                    .execute(0, context.clone());
                }
                let rows = inner.execute(0, context.clone())?;
                // The last level: a group whose state outgrows the budget (see the
                // module docs). Its partition's files are still there to count keys in.
                let (spill, keys, pool) = (spill.clone(), keys.clone(), context.memory_pool());
                let pool = pool.clone();
                Ok(memory_error_as(rows, move |e| async move {
                    let counted = match run_stream(&spill, &run.files, batch_rows) {
                        Ok(rows) => {
                            let reservation = MemoryConsumer::new("SpillingAggregate skewed keys")
                                .register(&pool);
                            most_frequent_key(rows, &keys, reservation).await
                        }
                        Err(e) => Err(e),
                    };
                    match counted {
                        // A key is named only when it holds much of what the
                        // aggregate may take; otherwise the budget was taken by
                        // other operators, and the pool's error says by which.
                        Ok(Some(top)) if top.bytes.saturating_mul(4) >= cap as u64 => {
                            skew_error("group-by", &path, level, top, budget)
                        }
                        Ok(_) => e,
                        Err(e) => e,
                    }
                }))
            },
        );
        let spilled = runs.try_flatten();
        let groups: BatchStream = match in_memory {
            Some(rows) => Box::pin(rows.chain(spilled)),
            None => Box::pin(spilled),
        };
        // A run emits its groups as slices of one batch whose string values sit in
        // a few large blocks, each slice counted by an operator above (a sort) as
        // all of them: 12.7 MB a slice at 25 MiB, more than was free (q47). A
        // slice counted at more than a quarter of the budget beyond its rows is
        // copied to count its rows; smaller ones are left as DataFusion's own
        // aggregate hands them on (a sort filling the budget with batches counted
        // exactly had no room left to merge them when it spilled).
        let slack = budget / 4;
        let groups = groups.map(move |batch| {
            batch.and_then(|b| {
                if b.get_array_memory_size() > rows_bytes(&b).saturating_add(slack) {
                    owned_batch(&b)
                } else {
                    Ok(b)
                }
            })
        });
        // Dropped as soon as the last group is out, with the room the runs were
        // lent: an operator above (a sort merging its runs) needs it then.
        let groups = futures::stream::unfold(Some(groups), |groups| async move {
            let mut groups = groups?;
            let next = groups.next().await?;
            Some((next, Some(groups)))
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, groups)))
    }
}

/// A stream of batches handed on.
type BatchStream = futures::stream::BoxStream<'static, DfResult<RecordBatch>>;

/// What a partitioned aggregate kept in memory once its input ended.
enum InMemory {
    Nothing,
    /// The groups held (a final phase).
    Groups(HeldGroups),
    /// Rows, for the wrapped aggregate to aggregate.
    Rows(Vec<RecordBatch>),
}

/// Whether the partial aggregates below a sole final aggregate aggregate their rows.
enum Partials {
    /// They pass each row on as its state from their first batch.
    Skip,
    /// DataFusion's probe decides (its default thresholds).
    Probe,
    /// They never skip aggregating.
    Aggregate,
}

/// `context` with partial aggregates that do as `partials` says. A partial aggregate
/// whose first rows show little reduction passes rows on as states, each larger than
/// its row, for the final phase to buffer; with memory short, its probe reads an
/// early emission as no reduction. A sole final aggregate (nothing else competes
/// for memory) whose groups are unknown does better with its input aggregated as
/// far as memory allows, which the partial phase does, emitting early when it runs
/// short; one whose groups are estimated not to fit does better without (query-
/// bench's group-by at 25 %: the partial phase passed on 92 % of its rows, at 0.05 s
/// of 0.15); one whose groups fit, with the probe (at 100 %: it skips, 0.09 -> 0.07
/// s).
fn partials_context(context: &Arc<TaskContext>, partials: Partials) -> Arc<TaskContext> {
    let mut config = context.session_config().clone();
    let execution = &mut config.options_mut().execution;
    let defaults = datafusion::common::config::ExecutionOptions::default();
    match partials {
        Partials::Skip => {
            execution.skip_partial_aggregation_probe_rows_threshold = 0;
            execution.skip_partial_aggregation_probe_ratio_threshold = 0.0;
        }
        Partials::Probe => {
            execution.skip_partial_aggregation_probe_rows_threshold =
                defaults.skip_partial_aggregation_probe_rows_threshold;
            execution.skip_partial_aggregation_probe_ratio_threshold =
                defaults.skip_partial_aggregation_probe_ratio_threshold;
        }
        Partials::Aggregate => {
            execution.skip_partial_aggregation_probe_rows_threshold = usize::MAX;
        }
    }
    task_context_like(context, config, context.runtime_env())
}

/// What the frames' distinct-count sketches say of an aggregate's groups (see
/// [`group_estimate`]).
struct GroupEstimate {
    /// The product of its keys' distinct counts.
    key_values: usize,
    /// The rows its grouping phase reads, if known ([`rows_bound`]; through a semi
    /// join, as many as the join is estimated to keep).
    rows: Option<usize>,
}

impl GroupEstimate {
    /// The groups: the keys' combined distinct values, at most the rows read.
    fn groups(&self) -> usize {
        self.rows
            .map_or(self.key_values, |rows| self.key_values.min(rows.max(1)))
    }

    /// Whether the keys have nearly as many distinct values together as there are
    /// rows, [`NO_REDUCTION`] of them or more: a partial phase would aggregate next to
    /// nothing.
    fn unreduced(&self) -> bool {
        self.rows
            .is_some_and(|rows| self.key_values as f64 >= rows as f64 * NO_REDUCTION)
    }
}

/// The groups a partial phase is taken to leave unreduced, as a fraction of its
/// rows: DataFusion's probe's ratio. The sketches' estimates are a few percent off:
/// 100 000 distinct keys came to 98 545.
const NO_REDUCTION: f64 = 0.8;

/// The groups `agg` is estimated to have: the product of its keys' distinct counts
/// as the frames' sketches estimate them ([`column_distinct`]; a final phase's keys
/// followed to the partial phase's input), and the rows its grouping phase reads.
/// `None` where a key is not a plain column or its count is unknown. DataFusion's
/// own statistics carry no distinct counts here: the scans keep them to rows and
/// bytes, which its join modes follow.
fn group_estimate(agg: &AggregateExec) -> Option<GroupEstimate> {
    let mut grouping = agg;
    if !matches!(
        agg.mode(),
        AggregateMode::Single | AggregateMode::SinglePartitioned
    ) {
        let mut below = agg.input();
        grouping = loop {
            if let Some(partial) = below.downcast_ref::<AggregateExec>() {
                break partial;
            }
            match below.children().as_slice() {
                [child] if passes_rows(below.as_ref()) => below = child,
                _ => return None,
            }
        };
        if *grouping.mode() != AggregateMode::Partial {
            return None;
        }
    }
    let groups = grouping
        .group_expr()
        .expr()
        .iter()
        .try_fold(1usize, |groups, (expr, _)| {
            let column = expr.downcast_ref::<Column>()?;
            let distinct = column_distinct(grouping.input(), column.index())?;
            Some(groups.saturating_mul(distinct.max(1)))
        })?;
    let mut rows = rows_bound(grouping.input());
    if semi_joined(grouping.input()) {
        // The bound counts every row a semi join may keep: q97's store sales of a
        // year, 2.88 M against 554 K kept; the join estimate's share, 320 K, is
        // nearer, and splits the groups into 8 partitions, not 32 (at 25 MiB:
        // 62-75 ms over 32, 57 over 8).
        let kept = join_order::estimate(grouping.input().as_ref()).rows;
        if kept.is_finite() {
            rows = rows.map(|bound| bound.min(kept.ceil() as usize).max(1));
        }
    }
    Some(GroupEstimate {
        key_values: groups,
        rows,
    })
}

/// Spilled partitions aggregated in one run of the wrapped aggregate.
struct Run {
    /// The partitions' files.
    files: Vec<Arc<dyn SpillFile>>,
    /// What their rows reserve read back (as [`state_cost`] counts them).
    cost: usize,
    /// The partitions' indices (`5` or `5-9`), for errors.
    name: String,
}

/// The spilled partitions `files` (by index, `None` where a partition has no rows)
/// gathered into runs: consecutive partitions together while their rows' state fits
/// `target` (a partition larger than that runs alone, and is split again if it does
/// not fit). Every group lies in one partition, so a run of several answers as each
/// would; one run instead of many saves the wrapped aggregate's setup and output per
/// partition.
fn coalesced_runs(files: Vec<Option<Arc<dyn SpillFile>>>, target: usize) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    let mut first = 0;
    for (p, file) in files.into_iter().enumerate() {
        let Some(file) = file else { continue };
        let bytes = file.size().and_then(|b| usize::try_from(b).ok());
        let cost = bytes.map_or(usize::MAX, |b| b.saturating_mul(2));
        match runs.last_mut() {
            Some(run) if run.cost.saturating_add(cost) <= target => {
                run.files.push(file);
                run.cost += cost;
                run.name = format!("{first}-{p}");
            }
            _ => {
                first = p;
                runs.push(Run {
                    files: vec![file],
                    cost,
                    name: p.to_string(),
                });
            }
        }
    }
    runs
}

/// The rows of `files` one after another (see [`partition_stream`]).
fn run_stream(
    spill: &Arc<SpillManager>,
    files: &[Arc<dyn SpillFile>],
    batch_rows: usize,
) -> DfResult<SendableRecordBatchStream> {
    let streams = files
        .iter()
        .map(|f| partition_stream(spill, Some(f.clone()), batch_rows))
        .collect::<DfResult<Vec<_>>>()?;
    let rows = futures::stream::iter(streams).flatten();
    Ok(Box::pin(RecordBatchStreamAdapter::new(
        spill.schema().clone(),
        rows,
    )))
}

/// The most an aggregate keeps for itself before its input runs (a sixteenth of
/// the budget up to this).
const FLOOR_CAP: usize = 8 << 20;

/// Whether an aggregate function of `agg` keeps a state that grows with its group's
/// rows (a list: `array_agg`, a median, a distinct count), not a few numbers.
fn state_grows_with_rows(agg: &AggregateExec) -> bool {
    agg.aggr_expr().iter().any(|f| {
        f.state_fields().map_or(true, |fields| {
            fields.iter().any(|field| {
                matches!(
                    field.data_type(),
                    DataType::List(_)
                        | DataType::LargeList(_)
                        | DataType::ListView(_)
                        | DataType::LargeListView(_)
                        | DataType::FixedSizeList(..)
                        | DataType::Utf8
                        | DataType::LargeUtf8
                        | DataType::Utf8View
                        | DataType::Binary
                        | DataType::LargeBinary
                        | DataType::BinaryView
                )
            })
        })
    })
}

/// What an input batch reserves: the rows, and about as much again for the groups'
/// hash table and accumulators. The rows as they are, not the buffers they point into:
/// a partial aggregate hands its state on as slices of one batch, each of which
/// Arrow sizes as the whole.
fn state_cost(batch: &RecordBatch) -> usize {
    2 * rows_bytes(batch)
}

#[cfg(test)]
mod tests {
    use polars::prelude::{df, ChunkAgg, DataFrame, SortMultipleOptions};

    use super::*;
    use crate::env::FrameEnv;
    use crate::error::Error;
    use crate::frame::RemoteFrame;
    use crate::query::grace::AGGREGATE_FANOUT;
    use crate::query::test_env::{
        local_env, one_partition_session, skipped_aggregating, with_skipping_partials,
    };
    use crate::query::{QueryOutput, QuerySession};
    use arrow_array::Int64Array;

    const ROWS: i64 = 60_000;
    const GROUPS: i64 = 20_000;
    const SQL: &str = "SELECT g, count(*) AS n, sum(v) AS s FROM t GROUP BY g";

    /// A frame of `rows` rows in `env`: `g` = `group(i)` and `v` = `i` for row `i`.
    fn grouped_frame(env: &FrameEnv, rows: i64, group: impl Fn(i64) -> i64) -> RemoteFrame {
        let t = df!(
            "g" => (0..rows).map(group).collect::<Vec<_>>(),
            "v" => (0..rows).collect::<Vec<_>>()
        )
        .unwrap();
        RemoteFrame::from_polars(env, &t).unwrap()
    }

    fn env_and_table() -> (FrameEnv, RemoteFrame) {
        let env = local_env(1, 128 << 20);
        let frame = grouped_frame(&env, ROWS, |i| i * 7 % GROUPS);
        (env, frame)
    }

    /// The answer sorted by its group column `g`.
    fn by_group(out: &QueryOutput) -> DataFrame {
        out.to_polars()
            .unwrap()
            .sort(["g"], SortMultipleOptions::default())
            .unwrap()
    }

    /// Nothing of `session`'s queries is left in memory elements or reserved.
    fn assert_all_freed(session: &QuerySession) {
        assert_eq!(session.spill_bytes_held(), 0, "spill memory left behind");
        assert_eq!(session.reserved_bytes(), 0, "reservations left behind");
    }

    fn run(env: &FrameEnv, t: &RemoteFrame, budget: Option<u64>) -> (QueryOutput, u64) {
        let session = one_partition_session(env, budget, t);
        let out = session.sql(SQL).unwrap();
        assert_eq!(session.spill_bytes_held(), 0, "spill memory left behind");
        let got = by_group(&out);
        // Every group: three rows (i, i + GROUPS, i + 2 GROUPS share i * 7 % GROUPS).
        assert_eq!(got.height(), GROUPS as usize);
        let n = got.column("n").unwrap().i64().unwrap();
        assert_eq!((n.min(), n.max()), (Some(3), Some(3)));
        let s = got.column("s").unwrap().i64().unwrap();
        assert_eq!(s.sum(), Some((0..ROWS).sum::<i64>()));
        let spilled = out.stats().spill_files;
        (out, spilled)
    }

    #[test]
    fn an_aggregate_spills_only_what_does_not_fit_and_answers_the_same() {
        let (env, t) = env_and_table();
        let (_, unlimited) = run(&env, &t, None);
        assert_eq!(unlimited, 0);
        // Room for all groups: nothing spills.
        let (_, roomy) = run(&env, &t, Some(64 << 20));
        assert_eq!(roomy, 0);
        // Room for the partial phase's 20 K groups of state (480 KB, twice that
        // reserved), which it hands on as 20 slices of one batch: counted as the whole
        // batch each, they spilled 16 files here.
        let (out, fits) = run(&env, &t, Some(2 << 20));
        assert_eq!(fits, 0, "{}", out.explain_analyze());
        // A little too little: the final phase's input is partitioned once into
        // 4 partitions whose groups are held (its groups estimated at 19 K, 925 KB
        // as states, against a cap of 1.3 MB: as few partitions as leave each a
        // quarter of the cap); 2 stay in memory and 2 are spilled, a file each. (A
        // partition's groups take their hash table and accumulators besides their
        // keys, about 66 bytes a group here against the 48 a row of a partition of
        // rows is counted at, and no row adds to a group already held: the partial
        // phase aggregated them all.) 16 partitions, before the estimate: 6 spilled.
        let (out, little) = run(&env, &t, Some(1536 << 10));
        assert_eq!(little, 2, "{}", out.explain_analyze());
        // A third of that, less than the groups' estimate: the partial phase passes
        // its rows on as they come, and 16 partitions (the most for the cap) of
        // which 11 spilled; they fit then, several to a run. (10 while the first
        // row batch that did not fit gave back memory it never reserved.)
        let (out, tight) = run(&env, &t, Some(512 << 10));
        assert_eq!(tight, 11, "{}", out.explain_analyze());
        assert_eq!(
            out.stats().spill_bytes_written,
            out.stats().spill_bytes_read,
            "{}",
            out.explain_analyze()
        );
        // Less again: all 16 spilled, and each still too large for a run: split
        // by its size at the second level (8 or 16 ways, each part about half the
        // memory share), where the parts that do not stay in memory, 176 in all,
        // are spilled again (168 before the fix above).
        let (out, two_levels) = run(&env, &t, Some(48 << 10));
        assert_eq!(
            two_levels,
            (AGGREGATE_FANOUT + 176) as u64,
            "{}",
            out.explain_analyze()
        );
        assert!(out.stats().peak_local_bytes <= 48 << 10);
        let text = out.explain_analyze();
        assert!(text.contains("spilled_partitions=16]"), "{text}");
    }

    #[test]
    fn an_aggregate_alone_in_its_plan_with_unknown_groups_has_its_partial_phase_aggregate_every_row(
    ) {
        // The first rows are all distinct keys: the partial phase's probe sees no
        // reduction and, beside other operators, passes rows on unaggregated. A
        // computed key has no estimate of its groups.
        let env = local_env(1, 256 << 20);
        let rows: i64 = 300_000;
        let groups: i64 = 150_000;
        let t = grouped_frame(&env, rows, |i| i % groups);
        let session = with_skipping_partials(one_partition_session(&env, Some(64 << 20), &t));
        let alone = session
            .sql("SELECT g * 2 AS g2, count(*) AS n FROM t GROUP BY g * 2")
            .unwrap();
        assert!(!skipped_aggregating(&alone), "{}", alone.explain_analyze());
        assert_eq!(alone.rows(), groups as usize);
        // Under a sort (which holds memory too) the probe decides as DataFusion's.
        let sorted = session
            .sql("SELECT g * 2 AS g2, count(*) AS n FROM t GROUP BY g * 2 ORDER BY n, g2")
            .unwrap();
        assert!(skipped_aggregating(&sorted), "{}", sorted.explain_analyze());
        assert_eq!(sorted.rows(), groups as usize);
    }

    /// Runs `sql` and checks that its aggregate's shown estimate is within
    /// `within` of `near` and that it answers `rows` rows.
    fn assert_estimate_near(
        session: &QuerySession,
        sql: &str,
        near: usize,
        within: usize,
        rows: usize,
    ) {
        let out = session.sql(sql).unwrap();
        let estimate = shown_estimate(&out).expect("an estimate");
        assert!(estimate.abs_diff(near) < within, "{estimate}");
        assert_eq!(out.rows(), rows);
    }

    /// The `groups~N` estimate the explained plan of `out` shows, if any.
    fn shown_estimate(out: &QueryOutput) -> Option<usize> {
        let text = out.explain_analyze();
        let at = text.find("groups~")? + "groups~".len();
        let digits: String = text[at..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    }

    #[test]
    fn a_sole_aggregate_skips_its_partial_phase_by_its_estimated_groups() {
        let env = local_env(1, 256 << 20);
        let rows: i64 = 300_000;
        let groups: i64 = 150_000;
        let t = grouped_frame(&env, rows, |i| i % groups);
        let sql = "SELECT g, count(*) AS n, sum(v) AS s FROM t GROUP BY g";
        let unbudgeted = by_group(&one_partition_session(&env, None, &t).sql(sql).unwrap());
        // The groups fit (150 K, 7.2 MB as states against a cap of 56 MB): the
        // partial phase's probe decides, and skips (its first rows are distinct).
        let session = one_partition_session(&env, Some(64 << 20), &t);
        let roomy = session.sql(sql).unwrap();
        let estimate = shown_estimate(&roomy).expect("an estimate");
        assert!(
            estimate.abs_diff(groups as usize) < groups as usize / 20,
            "{estimate}"
        );
        assert!(skipped_aggregating(&roomy), "{}", roomy.explain_analyze());
        assert_eq!(by_group(&roomy), unbudgeted);
        assert_eq!(roomy.stats().spill_files, 0);
        // They do not fit 4 MiB: the partial phase passes every row on at once, and
        // the final phase, its groups estimated, splits them 16 ways (as few as
        // leave each partition's groups a quarter of its cap, at most its cap's).
        let tight = one_partition_session(&env, Some(4 << 20), &t);
        let out = tight.sql(sql).unwrap();
        assert!(skipped_aggregating(&out), "{}", out.explain_analyze());
        assert_eq!(by_group(&out), unbudgeted);
        assert!(out.stats().peak_local_bytes <= 4 << 20);
        assert_all_freed(&tight);
        // A key that is not a plain column has no estimate: the partial phase
        // aggregates every row, as memory allows.
        let computed = tight
            .sql("SELECT g * 2 AS g2, count(*) AS n FROM t GROUP BY g * 2")
            .unwrap();
        assert_eq!(shown_estimate(&computed), None);
        assert!(
            !skipped_aggregating(&computed),
            "{}",
            computed.explain_analyze()
        );
        assert_eq!(computed.rows(), groups as usize);
    }

    #[test]
    fn estimated_groups_follow_keys_through_unions_and_semi_joins_not_joins() {
        let env = local_env(1, 256 << 20);
        let t = grouped_frame(&env, 40_000, |i| i % 10_000);
        let session = one_partition_session(&env, Some(64 << 20), &t);
        // A union's keys: the sum of its inputs' estimates (an upper bound).
        let union = "SELECT g FROM t UNION SELECT v FROM t";
        assert_estimate_near(&session, union, 50_000, 2_500, 40_000);
        // A join's output has no estimate.
        let joined = session
            .sql("SELECT a.g, count(*) AS n FROM t a JOIN t b ON a.v = b.v GROUP BY a.g")
            .unwrap();
        assert_eq!(
            shown_estimate(&joined),
            None,
            "{}",
            joined.explain_analyze()
        );
        assert_eq!(joined.rows(), 10_000);
        // A semi join keeps some of one side's rows, as a filter does: its keys are
        // followed to that side's scan.
        let semi =
            "SELECT g, count(*) AS n FROM t WHERE v IN (SELECT v FROM t WHERE g < 5000) GROUP BY g";
        assert_estimate_near(&session, semi, 10_000, 1_000, 5_000);
        // Keys distinct on every row are bounded by the rows the semi join is
        // estimated to keep (a third of the filtered side: 13 333), not by all
        // 40 000 of its scan.
        let t = grouped_frame(&env, 40_000, |i| i);
        let session = one_partition_session(&env, Some(64 << 20), &t);
        let semi =
            "SELECT g, count(*) AS n FROM t WHERE v IN (SELECT v FROM t WHERE g < 4000) GROUP BY g";
        assert_estimate_near(&session, semi, 13_334, 100, 4_000);
    }

    #[test]
    fn partial_phases_beside_other_holders_skip_only_keys_distinct_on_every_row() {
        // Two aggregates and a join above them hold memory: partial phases there
        // aggregate every row, unless their keys' estimated distinct values are as
        // many as the rows (q97's customer and item pairs).
        let env = local_env(1, 256 << 20);
        let rows: i64 = 100_000;
        let sql = "SELECT count(*) AS n FROM \
                   (SELECT g FROM t WHERE v IN (SELECT v FROM t WHERE v % 2 = 0) GROUP BY g) a \
                   JOIN (SELECT g, count(*) AS c FROM t GROUP BY g) b ON a.g = b.g";
        for (distinct, skips, want) in [(true, true, rows / 2), (false, false, 500)] {
            let t = grouped_frame(&env, rows, |i| if distinct { i } else { i % 1_000 });
            let session = one_partition_session(&env, Some(64 << 20), &t);
            let out = session.sql(sql).unwrap();
            assert_eq!(
                skipped_aggregating(&out),
                skips,
                "{}",
                out.explain_analyze()
            );
            let n = out.to_polars().unwrap();
            assert_eq!(n.column("n").unwrap().i64().unwrap().get(0), Some(want));
        }
    }

    #[test]
    fn a_sort_fed_by_a_spilling_aggregate_leaves_its_partitions_room() {
        // More groups than the budget holds, sorted as a whole above the aggregate:
        // the sort fills the pool while partitions are still to be aggregated (before
        // the aggregate lent its memory to them, the next partition's hash table got
        // no memory at all).
        let env = local_env(1, 256 << 20);
        let rows: i64 = 400_000;
        let groups: i64 = 200_000;
        let t = grouped_frame(&env, rows, |i| i * 7 % groups);
        let session = one_partition_session(&env, Some(2 << 20), &t);
        let out = session
            .sql("SELECT g, sum(v) AS s FROM t GROUP BY g ORDER BY s, g")
            .unwrap();
        assert_eq!(session.spill_bytes_held(), 0, "spill memory left behind");
        assert!(out.stats().peak_local_bytes <= 2 << 20);
        let got = out.to_polars().unwrap();
        assert_eq!(got.height(), groups as usize);
        let s = got.column("s").unwrap().i64().unwrap();
        // g = i * 7 % groups takes rows i and i + groups: s = 2i + groups for the
        // i with that g, so the sums are groups, groups + 2, ... in order.
        let want: Vec<i64> = (0..groups).map(|i| 2 * i + groups).collect();
        assert_eq!(s.into_no_null_iter().collect::<Vec<_>>(), want);
        assert!(out.stats().spill_files > 0, "{}", out.explain_analyze());
    }

    #[test]
    fn a_final_phase_sorted_only_on_a_constant_key_spills_by_partitioning() {
        // `y = 2001` makes `y` constant, and DataFusion counts a constant as sorted:
        // its final phase ran ordered, could emit nothing before its input ended,
        // and failed to get memory to sort its state at 512 KiB (q4 and q11 of
        // TPC-DS at 16 MiB did so).
        let env = local_env(1, 128 << 20);
        let t = df!(
            "y" => (0..ROWS).map(|i| 2000 + i % 2).collect::<Vec<_>>(),
            "g" => (0..ROWS).map(|i| i * 7 % GROUPS).collect::<Vec<_>>(),
            "v" => (0..ROWS).collect::<Vec<_>>()
        )
        .unwrap();
        let t = RemoteFrame::from_polars(&env, &t).unwrap();
        let sql = "SELECT y, g, count(*) AS n, sum(v) AS s FROM t WHERE y = 2001 GROUP BY y, g";
        let want = one_partition_session(&env, None, &t).sql(sql).unwrap();
        let budget = 512 << 10;
        let session = one_partition_session(&env, Some(budget), &t);
        let plan = session.explain(sql).unwrap();
        assert!(
            plan.contains("SpillingAggregateExec") && plan.contains("UnorderedExec"),
            "{plan}"
        );
        let got = session.sql(sql).unwrap();
        let text = got.explain_analyze();
        assert!(got.stats().spill_files > 0, "{text}");
        assert!(got.stats().peak_local_bytes <= budget, "{text}");
        assert!(by_group(&got).equals_missing(&by_group(&want)));
        assert_eq!(got.rows(), (GROUPS / 2) as usize);
        assert_all_freed(&session);
    }

    #[test]
    fn an_aggregate_left_no_memory_by_others_fails_out_of_budget_naming_no_key() {
        // Another consumer holds all but 16 KiB of the budget: the aggregate's
        // partitions go down every level and fail there for memory, with keys of a
        // few bytes each. That is no skew, and the error is the pool's (naming who
        // holds the memory), not one naming a key.
        let (env, t) = env_and_table();
        let budget = 1 << 20;
        let session = one_partition_session(&env, Some(budget), &t);
        let pool: Arc<dyn MemoryPool> = session.pool.clone();
        let hog = MemoryConsumer::new("other operator").register(&pool);
        hog.grow(budget as usize - (16 << 10));
        let err = session.sql(SQL).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, Error::OutOfBudget { .. }), "{text}");
        assert!(text.contains("other operator"), "{text}");
        drop(hog);
        assert_all_freed(&session);
    }

    /// `t` with `rows` rows: `g` is 7 on every `every`th row and unique on the
    /// others, `v` the row number.
    fn skewed_table(env: &FrameEnv, rows: i64, every: i64) -> RemoteFrame {
        let g = (0..rows).map(|i| if i % every == 0 { 7 } else { 1_000_000 + i });
        let batch = RecordBatch::try_from_iter([
            (
                "g",
                Arc::new(Int64Array::from_iter_values(g)) as arrow_array::ArrayRef,
            ),
            ("v", Arc::new(Int64Array::from_iter_values(0..rows))),
        ])
        .unwrap();
        RemoteFrame::from_record_batches(env, &[batch]).unwrap()
    }

    #[test]
    fn a_group_whose_state_outgrows_the_budget_fails_naming_its_key() {
        let env = local_env(1, 128 << 20);
        let t = skewed_table(&env, 60_000, 2);
        let budget = t.data_bytes() / 10;
        let session = one_partition_session(&env, Some(budget), &t);
        // Group 7's list holds 30,000 values: no partitioning splits one group.
        let err = session
            .sql("SELECT g, array_agg(v) AS vs FROM t GROUP BY g")
            .unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(&err, Error::Skew { kernel: "group-by", key, level, .. }
                if key == "g=7" && *level == MAX_LEVEL),
            "{text}"
        );
        assert_all_freed(&session);
    }

    #[test]
    fn a_distinct_count_is_aggregated_a_partition_at_a_time() {
        // As the Python verbs test (Polars' `n_unique`, which counts a null as one
        // more value): 40,000 rows in chunks of 256, 20,000 keys, 977 names, 80 KB.
        // A distinct count's state (the values seen) outgrows what its rows
        // reserve: two spilled partitions in one run failed out of the budget.
        let env = local_env(1, 128 << 20).with_chunk_rows(256);
        let rows: i64 = 40_000;
        let t = df!(
            "g" => (0..rows).map(|i| (i * 7_919 + 13) % 20_000).collect::<Vec<_>>(),
            "v" => (0..rows).map(|i| i % 100).collect::<Vec<_>>(),
            "name" => (0..rows).map(|i| format!("item-{}", i % 977)).collect::<Vec<_>>()
        )
        .unwrap();
        let t = RemoteFrame::from_polars(&env, &t).unwrap();
        let sql = "SELECT g, sum(v) AS s, \
                   count(DISTINCT name) + CAST(count(1) > count(name) AS BIGINT) AS names \
                   FROM t GROUP BY g";
        let want = one_partition_session(&env, None, &t).sql(sql).unwrap();
        let session = one_partition_session(&env, Some(80_000), &t);
        let got = session.sql(sql).unwrap();
        let text = got.explain_analyze();
        assert!(got.stats().spill_files > 0, "{text}");
        assert!(got.stats().peak_local_bytes <= 80_000, "{text}");
        assert!(by_group(&got).equals_missing(&by_group(&want)));
        assert_all_freed(&session);
    }

    #[test]
    fn a_frequent_group_with_small_state_is_aggregated_within_the_budget() {
        // Counts and sums: group 7's state is two numbers, however many rows it
        // has, and its partition (a tenth of the rows are group 7) is aggregated in
        // one run like the others (its partitions are split once more by their
        // size: 102 files in all; 98 while the partial phase aggregated what it
        // could, 78 while the first row batch that did not fit gave back memory it
        // never reserved; the groups, 180 K, are estimated not to fit, so the
        // partial phase passes group 7's rows on one by one now).
        let env = local_env(1, 128 << 20);
        let rows = 200_000;
        let t = skewed_table(&env, rows, 10);
        let budget = t.data_bytes() / 10;
        let sql = "SELECT g, count(*) AS n, sum(v) AS s FROM t GROUP BY g";
        let want = one_partition_session(&env, None, &t).sql(sql).unwrap();
        let session = one_partition_session(&env, Some(budget), &t);
        let got = session.sql(sql).unwrap();
        let text = got.explain_analyze();
        assert_eq!(got.stats().spill_files, 102, "{text}");
        assert!(got.stats().peak_local_bytes <= budget, "{text}");
        assert!(by_group(&got).equals_missing(&by_group(&want)));
        assert_eq!(got.rows(), (rows - rows / 10 + 1) as usize);
        assert_all_freed(&session);
    }
}
