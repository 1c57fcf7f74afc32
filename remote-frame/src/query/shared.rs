//! Subplans computed once for all their uses.
//!
//! DataFusion inlines a common table expression wherever it is referenced: q47 computes
//! its `v1` (three joins, an aggregate and a window over store_sales) three times,
//! q23 its best customers twice, q64 its `cs_ui` twice. After physical planning the
//! copies are identical subtrees. [`SharedSubplans`] replaces each copy with a
//! [`SharedExec`] over one shared result: the first read runs the subtree once (all its
//! partitions at once) and keeps its output, reserved in the memory pool or, past
//! the budget, in spill files in the memory elements; every copy reads that output,
//! which is dropped when the last expected read ends (or with the plan).
//!
//! A copy runs before the dynamic filters are pushed down (the rule sits right before
//! DataFusion's `FilterPushdown(Post)`), and [`SharedExec`] passes no filter of its
//! parents into the subtree: a join above one copy must not narrow what every copy
//! reads. Subtrees with a volatile expression (`random()`) are never shared.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::config::ConfigOptions;
use datafusion::common::runtime::JoinSet;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::Statistics;
use datafusion::common::{DataFusionError, Result as DfResult};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryLimit};
use datafusion::execution::spill_file::SpillFile;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr_common::physical_expr::is_volatile;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::coop::make_cooperative;
use datafusion::physical_plan::execution_plan::{CardinalityEffect, EmissionType};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricsSet, SpillMetrics};
use datafusion::physical_plan::spill::SpillManager;
use datafusion::physical_plan::statistics::StatisticsArgs;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    displayable, DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties,
    ReplaceChildrenOptions, SendableRecordBatchStream,
};
use futures::{StreamExt, TryStreamExt};

use super::operator::only_child;
use super::spill::read_spilled;

/// Operators whose work is worth keeping rather than repeating: a subtree without one
/// (a scan, a filter over it) is cheaper to read again than to hold.
const WORK: [&str; 8] = [
    "AggregateExec",
    "HashJoinExec",
    "NestedLoopJoinExec",
    "CrossJoinExec",
    "SortMergeJoinExec",
    "BoundedWindowAggExec",
    "WindowAggExec",
    "SortExec",
];

/// Shared outputs hold at most this fraction of a budget in memory (the rest goes
/// to spill files in the memory elements): it is held while the rest of the query
/// runs, and the operators above it still need theirs. Writing and reading it back
/// costs far less than running the subtree again.
const HELD_SHARE: usize = 8;

/// Replaces every repeated subtree of a plan with [`SharedExec`]s over one result
/// (see the module docs; a physical optimizer rule).
#[derive(Debug, Default)]
pub(crate) struct SharedSubplans;

impl SharedSubplans {
    /// The rule's name, to find it among a session's rules.
    pub(crate) const NAME: &'static str = "scad_shared_subplans";
}

impl PhysicalOptimizerRule for SharedSubplans {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let mut ids = SubplanIds::default();
        let copies = repeated_subplans(&plan, &mut ids)?;
        if copies.is_empty() {
            return Ok(plan);
        }
        let outputs = copies.len();
        let mut results: HashMap<usize, Arc<SharedResult>> = HashMap::new();
        plan.transform_down(|node| {
            let id = ids.of(&node);
            let Some(&n) = copies.get(&id) else {
                return Ok(Transformed::no(node));
            };
            let number = results.len() + 1;
            let result = results
                .entry(id)
                .or_insert_with(|| Arc::new(SharedResult::new(number, n, outputs)))
                .clone();
            let shared: Arc<dyn ExecutionPlan> = Arc::new(SharedExec::new(node, result));
            Ok(Transformed::new(shared, true, TreeNodeRecursion::Jump))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        Self::NAME
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// Numbers the distinct subtrees of a plan: two subtrees get the same number when
/// their operators (each with its expressions, as EXPLAIN prints it) and output
/// schemas are the same, and so are their children's numbers. Linear in the plan:
/// each operator is printed once.
#[derive(Default)]
struct SubplanIds {
    /// By operator (its address: the plan is held while the numbers are used).
    by_node: HashMap<*const (), usize>,
    by_text: HashMap<String, usize>,
}

impl SubplanIds {
    fn of(&mut self, node: &Arc<dyn ExecutionPlan>) -> usize {
        let address = Arc::as_ptr(node).cast::<()>();
        if let Some(&id) = self.by_node.get(&address) {
            return id;
        }
        let children: Vec<usize> = node.children().into_iter().map(|c| self.of(c)).collect();
        let text = format!(
            "{} {:?} {children:?}",
            displayable(node.as_ref()).one_line(),
            node.schema().fields()
        );
        let next = self.by_text.len();
        let id = *self.by_text.entry(text).or_insert(next);
        self.by_node.insert(address, id);
        id
    }
}

/// The subtrees of `plan` to share (by their `ids`), each with the number of its
/// copies: subtrees that do some work, hold nothing volatile, and occur at least
/// twice where no larger shared subtree holds them.
fn repeated_subplans(
    plan: &Arc<dyn ExecutionPlan>,
    ids: &mut SubplanIds,
) -> DfResult<HashMap<usize, usize>> {
    // Two copies of a subtree hold two alike leaves: a plan whose leaves all differ
    // repeats nothing (most plans), and then only its leaves are printed.
    let mut leaves: HashSet<usize> = HashSet::new();
    let mut alike_leaves = false;
    plan.apply(|node| {
        if node.children().is_empty() && !leaves.insert(ids.of(node)) {
            alike_leaves = true;
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    if !alike_leaves {
        return Ok(HashMap::new());
    }
    let mut occurrences: HashMap<usize, usize> = HashMap::new();
    plan.apply(|node| {
        *occurrences.entry(ids.of(node)).or_default() += 1;
        Ok(TreeNodeRecursion::Continue)
    })?;
    let mut candidates: HashSet<usize> = HashSet::new();
    plan.apply(|node| {
        let id = ids.of(node);
        if occurrences[&id] >= 2 && !candidates.contains(&id) && worth_sharing(node)? {
            candidates.insert(id);
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    if candidates.is_empty() {
        return Ok(HashMap::new());
    }
    // A subtree inside a candidate that occurs more often is the better one to share:
    // q47's rank window occurs three times, twice under the same projection.
    let mut outshone: HashSet<usize> = HashSet::new();
    plan.apply(|node| {
        let id = ids.of(node);
        if candidates.contains(&id) {
            let mut more = false;
            for child in node.children() {
                child.apply(|inner| {
                    let inner_id = ids.of(inner);
                    more |=
                        candidates.contains(&inner_id) && occurrences[&inner_id] > occurrences[&id];
                    Ok(if more {
                        TreeNodeRecursion::Stop
                    } else {
                        TreeNodeRecursion::Continue
                    })
                })?;
            }
            if more {
                outshone.insert(id);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    candidates.retain(|id| !outshone.contains(id));
    // The outermost copy wins; a candidate left with one copy outside the others is
    // dropped, which may uncover candidates inside it: repeat until nothing changes.
    loop {
        let mut copies: HashMap<usize, usize> = HashMap::new();
        plan.apply(|node| {
            let id = ids.of(node);
            if candidates.contains(&id) {
                *copies.entry(id).or_default() += 1;
                return Ok(TreeNodeRecursion::Jump);
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        let before = candidates.len();
        candidates.retain(|id| copies.get(id).is_some_and(|&n| n >= 2));
        if candidates.len() == before {
            copies.retain(|id, _| candidates.contains(id));
            return Ok(copies);
        }
    }
}

/// Whether `node`'s subtree does work worth keeping and holds nothing volatile.
fn worth_sharing(node: &Arc<dyn ExecutionPlan>) -> DfResult<bool> {
    let mut works = false;
    let mut volatile = false;
    node.apply(|n| {
        works |= WORK.contains(&n.name());
        n.apply_expressions(&mut |e: &Arc<dyn PhysicalExpr>| {
            volatile |= is_volatile(e);
            Ok(if volatile {
                TreeNodeRecursion::Stop
            } else {
                TreeNodeRecursion::Continue
            })
        })?;
        Ok(if volatile {
            TreeNodeRecursion::Stop
        } else {
            TreeNodeRecursion::Continue
        })
    })?;
    Ok(works && !volatile)
}

/// The one output of a subtree shared by its copies.
struct SharedResult {
    /// Numbers the shared subtrees of a plan (for EXPLAIN).
    id: usize,
    /// Copies of the subtree in the plan.
    copies: usize,
    /// Shared outputs in the plan: they divide what outputs may hold in memory.
    outputs: usize,
    /// Held while the subtree runs, so that it runs once.
    running: tokio::sync::Mutex<()>,
    /// The output, once computed and until its last expected read ended.
    output: Mutex<Option<Arc<Output>>>,
    /// Reads (a copy's partition) that ended.
    reads_ended: AtomicUsize,
}

impl fmt::Debug for SharedResult {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.debug_struct("SharedResult")
            .field("id", &self.id)
            .field("copies", &self.copies)
            .finish_non_exhaustive()
    }
}

impl SharedResult {
    fn new(id: usize, copies: usize, outputs: usize) -> Self {
        SharedResult {
            id,
            copies,
            outputs,
            running: tokio::sync::Mutex::new(()),
            output: Mutex::new(None),
            reads_ended: AtomicUsize::new(0),
        }
    }

    fn held(&self) -> Option<Arc<Output>> {
        self.output
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The output of `input`, run now if no copy has run it.
    async fn output(
        &self,
        input: &Arc<dyn ExecutionPlan>,
        context: &Arc<TaskContext>,
        metrics: &ExecutionPlanMetricsSet,
    ) -> DfResult<Arc<Output>> {
        let _running = self.running.lock().await;
        if let Some(output) = self.held() {
            return Ok(output);
        }
        let output = Arc::new(Output::compute(self, input, context, metrics).await?);
        *self.output.lock().unwrap_or_else(PoisonError::into_inner) = Some(output.clone());
        Ok(output)
    }

    /// Counts one read as ended; after the last of all copies' partitions the output
    /// is dropped (a later read would run the subtree again).
    fn read_ended(&self, partitions: usize) {
        let ended = self.reads_ended.fetch_add(1, Ordering::AcqRel) + 1;
        if ended == self.copies * partitions {
            let output = self
                .output
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            drop(output);
        }
    }
}

/// A subtree's output, partition by partition.
struct Output {
    partitions: Vec<StoredPartition>,
    spill: Arc<SpillManager>,
}

/// One partition's batches: those the memory pool took, then (once it took no more)
/// a spill file with the rest.
struct StoredPartition {
    held: Vec<RecordBatch>,
    spilled: Option<Arc<dyn SpillFile>>,
    /// The pool's share of `held`; returned when the output drops.
    _reservation: datafusion::execution::memory_pool::MemoryReservation,
}

impl Output {
    /// Runs all partitions of `input` at once and stores their batches.
    async fn compute(
        result: &SharedResult,
        input: &Arc<dyn ExecutionPlan>,
        context: &Arc<TaskContext>,
        metrics: &ExecutionPlanMetricsSet,
    ) -> DfResult<Self> {
        let spill = Arc::new(SpillManager::new(
            context.runtime_env(),
            SpillMetrics::new(metrics, 0),
            input.schema(),
        ));
        let partitions = input.properties().partitioning.partition_count();
        // Each partition's share of what an output may hold in memory.
        let cap = match context.memory_pool().memory_limit() {
            MemoryLimit::Finite(bytes) => bytes / HELD_SHARE / result.outputs / partitions.max(1),
            _ => usize::MAX,
        };
        let mut tasks = JoinSet::new();
        for p in 0..partitions {
            let stream = input.execute(p, context.clone())?;
            let reservation =
                MemoryConsumer::new(format!("SharedExec[{}] partition {p}", result.id))
                    .with_can_spill(true)
                    .register(context.memory_pool());
            let spill = spill.clone();
            tasks.spawn(async move { (p, store(stream, reservation, cap, spill).await) });
        }
        let mut stored: Vec<Option<StoredPartition>> = (0..partitions).map(|_| None).collect();
        while let Some(joined) = tasks.join_next().await {
            let failure = match joined {
                Ok((p, Ok(part))) => {
                    stored[p] = Some(part);
                    continue;
                }
                Ok((_, Err(e))) => e,
                Err(e) => DataFusionError::External(Box::new(e)),
            };
            // The other partitions stop, and give back what they hold, before the
            // query reports its failure.
            tasks.shutdown().await;
            return Err(failure);
        }
        let stored = stored
            .into_iter()
            .map(|part| {
                part.ok_or_else(|| {
                    DataFusionError::Internal("a shared partition did not run".into())
                })
            })
            .collect::<DfResult<Vec<_>>>()?;
        Ok(Output {
            partitions: stored,
            spill,
        })
    }

    /// A stream of partition `p`'s batches.
    fn read(&self, p: usize) -> DfResult<SendableRecordBatchStream> {
        let part = self
            .partitions
            .get(p)
            .ok_or_else(|| DataFusionError::Internal(format!("SharedExec has no partition {p}")))?;
        let schema = self.spill.schema().clone();
        let held = futures::stream::iter(part.held.clone().into_iter().map(Ok));
        let stream: SendableRecordBatchStream = match &part.spilled {
            None => Box::pin(RecordBatchStreamAdapter::new(schema, held)),
            Some(file) => {
                let rest = read_spilled(file.clone(), schema.clone())?;
                Box::pin(RecordBatchStreamAdapter::new(schema, held.chain(rest)))
            }
        };
        // Batches in memory never make the reader wait: it yields by its task budget.
        Ok(make_cooperative(stream))
    }
}

/// Keeps the batches of `stream` while `reservation` can grow within `cap` bytes,
/// and spills the rest.
async fn store(
    mut stream: SendableRecordBatchStream,
    reservation: datafusion::execution::memory_pool::MemoryReservation,
    cap: usize,
    spill: Arc<SpillManager>,
) -> DfResult<StoredPartition> {
    let mut held = Vec::new();
    let mut file = None;
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        if batch.num_rows() == 0 {
            continue;
        }
        let size = batch.get_array_memory_size();
        if file.is_none()
            && reservation.size().saturating_add(size) <= cap
            && reservation.try_grow(size).is_ok()
        {
            held.push(batch);
            continue;
        }
        let file = match &mut file {
            Some(f) => f,
            slot => slot.insert(spill.create_in_progress_file("shared subplan")?),
        };
        file.append_batch(&batch)?;
    }
    let spilled = match file {
        Some(mut f) => f.finish()?,
        None => None,
    };
    Ok(StoredPartition {
        held,
        spilled,
        _reservation: reservation,
    })
}

/// One copy of a shared subtree: reads the output the first read of any copy made.
#[derive(Debug)]
pub(crate) struct SharedExec {
    input: Arc<dyn ExecutionPlan>,
    result: Arc<SharedResult>,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl SharedExec {
    fn new(input: Arc<dyn ExecutionPlan>, result: Arc<SharedResult>) -> Self {
        let given = input.properties();
        let properties = Arc::new(PlanProperties::new(
            given.eq_properties.clone(),
            given.partitioning.clone(),
            EmissionType::Final,
            given.boundedness,
        ));
        SharedExec {
            input,
            result,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }
}

impl DisplayAs for SharedExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "SharedExec: id={}, copies={}",
            self.result.id, self.result.copies
        )
    }
}

impl ExecutionPlan for SharedExec {
    fn name(&self) -> &str {
        "SharedExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn statistics_from_inputs(
        &self,
        input_stats: &[Arc<Statistics>],
        _args: &StatisticsArgs,
    ) -> DfResult<Arc<Statistics>> {
        Ok(match input_stats.first() {
            Some(stats) => stats.clone(),
            None => Arc::new(Statistics::new_unknown(&self.schema())),
        })
    }

    fn cardinality_effect(&self) -> CardinalityEffect {
        CardinalityEffect::Equal
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        // The copies of a subtree are rewritten one by one by later rules; each
        // stays a copy of the same result (only one of them runs).
        let input = only_child("SharedExec", children)?;
        Ok(Arc::new(SharedExec::new(input, self.result.clone())))
    }

    super::operator::with_new_children_by_replace!();

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let read = ReadGuard {
            result: self.result.clone(),
            partitions: self.properties.partitioning.partition_count(),
        };
        let input = self.input.clone();
        let metrics = self.metrics.clone();
        let result = self.result.clone();
        let stream = futures::stream::once(async move {
            let output = result.output(&input, &context, &metrics).await?;
            output.read(partition)
        })
        .try_flatten()
        .map(move |batch| {
            // The read ends when this stream drops.
            let _ = &read;
            batch
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema(),
            stream,
        )))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

/// Counts a read of a shared output as ended when dropped.
struct ReadGuard {
    result: Arc<SharedResult>,
    partitions: usize,
}

impl Drop for ReadGuard {
    fn drop(&mut self) {
        self.result.read_ended(self.partitions);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::execution::runtime_env::RuntimeEnvBuilder;
    use datafusion::execution::TaskContext;
    use datafusion::physical_plan::{collect_partitioned, ExecutionPlan};
    use datafusion::prelude::{SessionConfig, SessionContext};
    use polars::prelude::{df, SortMultipleOptions};

    use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};

    use super::{repeated_subplans, SharedExec, SharedResult, SubplanIds};
    use crate::budget::Budget;
    use crate::env::FrameEnv;
    use crate::frame::RemoteFrame;
    use crate::query::test_env::local_env;
    use crate::query::{QueryOutput, QuerySession};

    /// `k` = row % 1,000, `v` = row.
    fn table(env: &FrameEnv, rows: i64) -> RemoteFrame {
        let frame = df!("k" => (0..rows).map(|i| i % 1_000).collect::<Vec<_>>(),
                        "v" => (0..rows).collect::<Vec<_>>())
        .unwrap();
        RemoteFrame::from_polars(env, &frame).unwrap()
    }

    fn session(env: &FrameEnv, t: &RemoteFrame, budget: Option<u64>) -> QuerySession {
        let env = env.with_budget(Budget::from_limit(budget).unwrap());
        let s = QuerySession::with_partitions(&env, 2).unwrap();
        s.register("t", t).unwrap();
        s
    }

    fn sorted(out: &QueryOutput, by: &str) -> polars::prelude::DataFrame {
        out.to_polars()
            .unwrap()
            .sort([by], SortMultipleOptions::default())
            .unwrap()
    }

    /// A CTE referenced twice, and the same query with the copies made to differ
    /// (`k >= 0` holds for every row) so that nothing is shared.
    const SHARED: &str = "WITH a AS (SELECT k, sum(v) AS s FROM t GROUP BY k) \
         SELECT x.k, x.s, y.s AS next_s FROM a x JOIN a y ON x.k + 1 = y.k";
    const UNSHARED: &str = "WITH a AS (SELECT k, sum(v) AS s FROM t GROUP BY k), \
         b AS (SELECT k, sum(v) AS s FROM t WHERE k >= 0 GROUP BY k) \
         SELECT x.k, x.s, y.s AS next_s FROM a x JOIN b y ON x.k + 1 = y.k";

    #[test]
    fn a_cte_referenced_twice_runs_once() {
        let env = local_env(1, 64 << 20);
        let t = table(&env, 50_000);
        let s = session(&env, &t, None);
        let plan = s.explain(SHARED).unwrap();
        assert_eq!(
            plan.matches("SharedExec: id=1, copies=2").count(),
            2,
            "{plan}"
        );
        assert!(!s.explain(UNSHARED).unwrap().contains("SharedExec"));
        let once = s.sql("SELECT k, sum(v) AS s FROM t GROUP BY k").unwrap();
        let shared = s.sql(SHARED).unwrap();
        let unshared = s.sql(UNSHARED).unwrap();
        assert_eq!(shared.rows(), 999);
        assert!(sorted(&shared, "k").equals_missing(&sorted(&unshared, "k")));
        // The table is read once, not once per reference.
        assert_eq!(shared.stats().scan_bytes, once.stats().scan_bytes);
        assert_eq!(unshared.stats().scan_bytes, 2 * once.stats().scan_bytes);
        // The answers do not keep their plans' join build sides reserved.
        assert_eq!(s.reserved_bytes(), 0);
    }

    /// Two copies of a subtree hold alike leaves: a plan whose leaves all differ is
    /// told apart from its leaves alone, one that has alike leaves operator by
    /// operator.
    #[test]
    fn only_a_plan_with_alike_leaves_is_printed_whole() {
        let env = local_env(1, 64 << 20);
        let t = table(&env, 10_000);
        let s = session(&env, &t, None);
        s.register("u", &table(&env, 5_000)).unwrap();
        let printed = |sql: &str| {
            let (_, plan) = s.plan(sql).unwrap();
            let mut ids = SubplanIds::default();
            let repeated = repeated_subplans(&plan, &mut ids).unwrap();
            let (mut nodes, mut leaves) = (0, 0);
            plan.apply(|node| {
                nodes += 1;
                leaves += usize::from(node.children().is_empty());
                Ok(TreeNodeRecursion::Continue)
            })
            .unwrap();
            (repeated.len(), ids.by_node.len(), nodes, leaves)
        };
        let (repeated, printed_nodes, _, leaves) =
            printed("SELECT t.k, sum(u.v) AS s FROM t JOIN u ON t.k = u.k GROUP BY t.k");
        assert_eq!((repeated, printed_nodes, leaves), (0, 2, 2));
        let (_, printed_nodes, nodes, leaves) =
            printed("SELECT v FROM t WHERE k < 10 UNION ALL SELECT v FROM t WHERE k > 20");
        assert_eq!((printed_nodes, leaves), (nodes, 2));
        assert!(nodes > leaves);
    }

    #[test]
    fn a_shared_output_past_the_budget_spills_and_frees_everything() {
        let env = local_env(1, 256 << 20);
        let rows = 200_000;
        let t = table(&env, rows);
        // Every (k, v) is a group: the output is as large as the table, 4x the budget.
        let sql = "WITH a AS (SELECT k, v, count(*) AS n FROM t GROUP BY k, v) \
                   SELECT x.k, count(*) AS pairs FROM a x JOIN a y ON x.v + 1 = y.v \
                   GROUP BY x.k";
        let budget = t.data_bytes() / 4;
        let s = session(&env, &t, Some(budget));
        let got = s.sql(sql).unwrap();
        let text = got.explain_analyze();
        let shared_spills: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("SharedExec") && l.contains("spill_count="))
            .collect();
        assert!(
            shared_spills.iter().any(|l| !l.contains("spill_count=0,")),
            "{text}"
        );
        assert!(got.stats().peak_local_bytes <= budget, "{text}");
        let want = session(&env, &t, None).sql(sql).unwrap();
        assert!(sorted(&got, "k").equals_missing(&sorted(&want, "k")));
        assert_eq!(got.rows(), 1_000);
        assert_eq!(s.spill_bytes_held(), 0, "spill memory left behind");
        assert_eq!(s.reserved_bytes(), 0, "reservations left behind");
    }

    #[test]
    fn a_volatile_subtree_is_not_shared() {
        let env = local_env(1, 64 << 20);
        let t = table(&env, 10_000);
        let s = session(&env, &t, None);
        // random() inside the aggregate: nothing below the join is shared.
        let sql = "WITH a AS (SELECT k, sum(v * random()) AS s FROM t GROUP BY k) \
                   SELECT sum(x.s - y.s) FROM a x JOIN a y ON x.k = y.k";
        let plan = s.explain(sql).unwrap();
        assert!(!plan.contains("SharedExec"), "{plan}");
        // random() above the aggregate: the aggregate is shared, random() is drawn
        // in each copy above it.
        let sql = "WITH a AS (SELECT k, sum(v) + random() AS s FROM t GROUP BY k) \
                   SELECT sum(x.s - y.s) FROM a x JOIN a y ON x.k = y.k";
        let plan = s.explain(sql).unwrap();
        let lines: Vec<&str> = plan.lines().collect();
        let depth = |l: &str| l.len() - l.trim_start().len();
        let draws: Vec<usize> = (0..lines.len())
            .filter(|&i| lines[i].contains("random()"))
            .collect();
        assert_eq!(draws.len(), 2, "{plan}");
        for i in draws {
            assert!(lines[i + 1].contains("SharedExec"), "{plan}");
            assert!(depth(lines[i + 1]) > depth(lines[i]), "{plan}");
        }
    }

    #[test]
    fn a_failing_shared_subtree_fails_the_query_and_frees_everything() {
        let env = local_env(1, 64 << 20);
        let t = table(&env, 50_000);
        let s = session(&env, &t, Some(t.data_bytes()));
        // Integer division by zero in group 500.
        let sql = "WITH a AS (SELECT k, sum(v) / (k - 500) AS s FROM t GROUP BY k) \
                   SELECT sum(x.s + y.s) FROM a x JOIN a y ON x.k + 1 = y.k";
        assert!(s.explain(sql).unwrap().contains("SharedExec"));
        let Err(err) = s.sql(sql) else {
            panic!("the query succeeded");
        };
        assert!(err.to_string().contains("Divide by zero"), "{err}");
        assert_eq!(s.spill_bytes_held(), 0, "spill memory left behind");
        assert_eq!(s.reserved_bytes(), 0, "reservations left behind");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_output_is_kept_until_every_copy_read_it() {
        let runtime = RuntimeEnvBuilder::new()
            .with_memory_limit(64 << 20, 1.0)
            .build_arc()
            .unwrap();
        let ctx = SessionContext::new_with_config_rt(
            SessionConfig::new().with_target_partitions(2),
            runtime.clone(),
        );
        let input = ctx
            .sql("SELECT v % 7 AS k, count(*) AS n FROM generate_series(1, 10000) AS g(v) GROUP BY v % 7")
            .await
            .unwrap()
            .create_physical_plan()
            .await
            .unwrap();
        let result = Arc::new(SharedResult::new(1, 2, 1));
        let first = Arc::new(SharedExec::new(input.clone(), result.clone()));
        let second = Arc::new(SharedExec::new(input, result.clone()));
        let context: Arc<TaskContext> = ctx.task_ctx();
        let count = |parts: &[Vec<datafusion::arrow::record_batch::RecordBatch>]| {
            parts.iter().flatten().map(|b| b.num_rows()).sum::<usize>()
        };
        let a = collect_partitioned(first as Arc<dyn ExecutionPlan>, context.clone())
            .await
            .unwrap();
        assert_eq!(count(&a), 7);
        // Held for the second copy, reserved in the pool.
        assert!(result.held().is_some());
        assert!(runtime.memory_pool.reserved() > 0);
        let b = collect_partitioned(second as Arc<dyn ExecutionPlan>, context)
            .await
            .unwrap();
        assert_eq!(count(&b), 7);
        assert!(result.held().is_none());
        assert_eq!(runtime.memory_pool.reserved(), 0);
    }
}
