//! ROLLUP aggregates over input sorted by their keys: every level in one pass.
//!
//! DataFusion plans `GROUP BY ROLLUP(k1, ..., kn)` as a hash aggregate over n + 1
//! grouping sets: the partial phase expands every input row n + 1 times and the final
//! phase merges the states by (keys, grouping id). q67 (a rollup of eight keys over
//! 541 k joined rows, 505 k groups in all) holds them all at once: at 25 MiB the
//! partial phase emits early (2.29 M states for its 4.9 M expanded rows), the
//! repartition between the phases spills 313 MB and the final phase 346 MB, 1.8 s of
//! DuckDB's 0.34.
//!
//! Sorted by the keys, the groups of every level are runs of consecutive rows: a group
//! of the level that keeps the first l keys ends where one of those keys changes.
//! [`SortedRollups`] replaces the two phases with a [`RollupExec`] over the input
//! sorted by the keys (the sort is planned by DataFusion's requirements and spills
//! like any sort); the rollup keeps one open group per level and emits each group as
//! soon as it ends, so it holds a batch's worth of state whatever the input's size.
//! Every level aggregates the input rows themselves (not the finer level's results),
//! so any aggregate without an order of its own works.
//!
//! Not for plans split into stages: a sort in one task would serialize what the
//! partitioned aggregate spreads over the cluster.

use std::fmt;
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, BooleanArray, RecordBatch, UInt32Array};
use arrow_schema::{DataType, SchemaRef, SortOptions};
use datafusion::arrow::compute::kernels::cmp::distinct;
use datafusion::arrow::compute::{concat, concat_batches, take};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{internal_err, DataFusionError, Result as DfResult, ScalarValue};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{EmitTo, GroupsAccumulator};
use datafusion::physical_expr::aggregate::AggregateFunctionExpr;
use datafusion::physical_expr::{
    EquivalenceProperties, GroupsAccumulatorAdapter, LexRequirement, OrderingRequirements,
    Partitioning, PhysicalExpr, PhysicalSortRequirement,
};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode, PhysicalGroupBy};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, Distribution, ExecutionPlan, PlanProperties,
    ReplaceChildrenOptions, SendableRecordBatchStream,
};
use futures::StreamExt;

use super::operator::{apply_each, only_child, replace_each};

/// Replaces each two-phase ROLLUP aggregate with a [`RollupExec`] over its input
/// sorted by the keys (see the module docs; a physical optimizer rule, run before
/// DataFusion enforces distributions and orderings).
#[derive(Debug, Default)]
pub(crate) struct SortedRollups;

impl SortedRollups {
    /// The rule's name, by which a stage's planning leaves it out.
    pub(crate) const NAME: &'static str = "scad_sorted_rollups";
}

impl PhysicalOptimizerRule for SortedRollups {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        replace_each(plan, |last: &AggregateExec| {
            if !matches!(
                last.mode(),
                AggregateMode::Final | AggregateMode::FinalPartitioned
            ) || last.limit_options().is_some()
            {
                return Ok(None);
            }
            let Some(first) = last.input().downcast_ref::<AggregateExec>() else {
                return Ok(None);
            };
            if *first.mode() != AggregateMode::Partial || first.limit_options().is_some() {
                return Ok(None);
            }
            Ok(RollupExec::try_new(first, last.schema())?
                .map(|rollup| Arc::new(rollup) as Arc<dyn ExecutionPlan>))
        })
    }

    fn name(&self) -> &str {
        Self::NAME
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// Grouping sets from which sorting the input beats expanding every row into each
/// set: q22 and q67 (5 and 9 sets) are faster sorted, q86 (3 sets) slower (10.7 ms
/// against 9.5).
const MIN_SORTED_SETS: usize = 4;

/// The widths of a grouping that is a rollup: for each grouping set, how many of the
/// leading keys it keeps (the others are NULL). `None` for any other grouping, or a
/// set given twice.
fn rollup_widths(group_by: &PhysicalGroupBy) -> Option<Vec<usize>> {
    if !group_by.has_grouping_set() || group_by.expr().is_empty() {
        return None;
    }
    let mut widths = Vec::with_capacity(group_by.groups().len());
    for nulls in group_by.groups() {
        let width = nulls.iter().take_while(|null| !**null).count();
        if nulls[width..].iter().any(|null| !null) || widths.contains(&width) {
            return None;
        }
        widths.push(width);
    }
    Some(widths)
}

/// The `__grouping_id` of a grouping set keeping the first `width` of `keys` keys,
/// as DataFusion computes it (a bit per key, the first key the highest, set where
/// the key is NULL), of the column's type.
fn grouping_id(width: usize, keys: usize, data_type: &DataType) -> DfResult<ScalarValue> {
    let nulls = keys - width;
    let id: u64 = if nulls >= 64 {
        u64::MAX
    } else {
        (1u64 << nulls) - 1
    };
    ScalarValue::UInt64(Some(id)).cast_to(data_type)
}

/// One grouping set of a [`RollupExec`]: its open group's accumulators.
struct Level {
    /// Leading keys the set keeps.
    width: usize,
    grouping_id: ScalarValue,
    accumulators: Vec<Box<dyn GroupsAccumulator>>,
}

/// Aggregates every grouping set of a rollup in one pass over input sorted by its
/// keys, emitting each group when it ends (see the module docs). Its output (one
/// partition, in no particular order) is the final aggregate's it replaces: the keys,
/// `__grouping_id`, then the aggregates.
#[derive(Debug)]
pub(crate) struct RollupExec {
    input: Arc<dyn ExecutionPlan>,
    keys: Vec<Arc<dyn PhysicalExpr>>,
    widths: Vec<usize>,
    aggregates: Vec<Arc<AggregateFunctionExpr>>,
    filters: Vec<Option<Arc<dyn PhysicalExpr>>>,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl RollupExec {
    /// The rollup doing what `partial` and the final aggregate over it (of output
    /// `schema`) do, if `partial` groups by a rollup of keys that sort and compare
    /// by value, its aggregates need no order of their own and produce the final
    /// aggregate's types.
    fn try_new(partial: &AggregateExec, schema: SchemaRef) -> DfResult<Option<Self>> {
        let group_by = partial.group_expr();
        let Some(widths) = rollup_widths(group_by).filter(|w| w.len() >= MIN_SORTED_SETS) else {
            return Ok(None);
        };
        let input_schema = partial.input().schema();
        let keys = group_by.input_exprs();
        let aggregates = partial.aggr_expr().to_vec();
        if schema.fields().len() != keys.len() + 1 + aggregates.len() {
            return Ok(None);
        }
        for (key, field) in keys.iter().zip(schema.fields()) {
            let data_type = key.data_type(&input_schema)?;
            if data_type.is_nested() || &data_type != field.data_type() {
                return Ok(None);
            }
        }
        for (aggregate, field) in aggregates.iter().zip(&schema.fields()[keys.len() + 1..]) {
            if aggregate.is_distinct()
                || !aggregate.order_bys().is_empty()
                || aggregate.field().data_type() != field.data_type()
            {
                return Ok(None);
            }
        }
        Ok(Some(Self::new(
            partial.input().clone(),
            keys,
            widths,
            aggregates,
            partial.filter_expr().to_vec(),
            schema,
        )))
    }

    fn new(
        input: Arc<dyn ExecutionPlan>,
        keys: Vec<Arc<dyn PhysicalExpr>>,
        widths: Vec<usize>,
        aggregates: Vec<Arc<AggregateFunctionExpr>>,
        filters: Vec<Option<Arc<dyn PhysicalExpr>>>,
        schema: SchemaRef,
    ) -> Self {
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        RollupExec {
            input,
            keys,
            widths,
            aggregates,
            filters,
            schema,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }

    /// The open state of a run: a level per grouping set, no group yet.
    fn start(&self) -> DfResult<Rollup> {
        let grouping_id_type = self.schema.field(self.keys.len()).data_type();
        let levels = self
            .widths
            .iter()
            .map(|&width| {
                Ok(Level {
                    width,
                    grouping_id: grouping_id(width, self.keys.len(), grouping_id_type)?,
                    accumulators: self
                        .aggregates
                        .iter()
                        .map(groups_accumulator)
                        .collect::<DfResult<_>>()?,
                })
            })
            .collect::<DfResult<_>>()?;
        Ok(Rollup {
            keys: self.keys.clone(),
            arguments: self.aggregates.iter().map(|a| a.expressions()).collect(),
            filters: self.filters.clone(),
            aggregates: self.aggregates.clone(),
            schema: self.schema.clone(),
            levels,
            last_keys: None,
        })
    }
}

/// The accumulator `aggregate` keeps its groups in (a row-at-a-time one adapted when
/// it has no grouped form).
fn groups_accumulator(
    aggregate: &Arc<AggregateFunctionExpr>,
) -> DfResult<Box<dyn GroupsAccumulator>> {
    if aggregate.groups_accumulator_supported() {
        aggregate.create_groups_accumulator()
    } else {
        let aggregate = aggregate.clone();
        Ok(Box::new(GroupsAccumulatorAdapter::new(move || {
            aggregate.create_accumulator()
        })))
    }
}

impl DisplayAs for RollupExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let keys: Vec<String> = self.keys.iter().map(|k| k.to_string()).collect();
        let aggregates: Vec<&str> = self.aggregates.iter().map(|a| a.name()).collect();
        write!(
            f,
            "RollupExec: keys=[{}], widths={:?}, aggr=[{}]",
            keys.join(", "),
            self.widths,
            aggregates.join(", ")
        )
    }
}

impl ExecutionPlan for RollupExec {
    fn name(&self) -> &str {
        "RollupExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn required_input_distribution(&self) -> Vec<Distribution> {
        vec![Distribution::SinglePartition]
    }

    fn required_input_ordering(&self) -> Vec<Option<OrderingRequirements>> {
        let requirement = LexRequirement::new(
            self.keys
                .iter()
                .map(|k| PhysicalSortRequirement::new(k.clone(), Some(SortOptions::default()))),
        );
        vec![requirement.map(OrderingRequirements::new)]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![false]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        let arguments = self.aggregates.iter().flat_map(|a| a.expressions());
        let filters = self.filters.iter().flatten().cloned();
        apply_each(self.keys.iter().cloned().chain(arguments).chain(filters), f)
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let input = only_child("RollupExec", children)?;
        Ok(Arc::new(RollupExec::new(
            input,
            self.keys.clone(),
            self.widths.clone(),
            self.aggregates.clone(),
            self.filters.clone(),
            self.schema.clone(),
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
        if partition != 0 {
            return internal_err!("RollupExec has one partition, asked for {partition}");
        }
        let input = self.input.execute(0, context.clone())?;
        let reservation = MemoryConsumer::new("RollupExec").register(context.memory_pool());
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let run = Run {
            input,
            rollup: self.start()?,
            reservation,
            baseline,
        };
        let stream = futures::stream::unfold(Some(run), |run| async move {
            let mut run = run?;
            match run.next().await {
                Ok(Some(batch)) => Some((Ok(batch), Some(run))),
                Ok(None) => None,
                Err(e) => Some((Err(e), None)),
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            stream,
        )))
    }
}

/// A running [`RollupExec`]: its input, state and accounting.
struct Run {
    input: SendableRecordBatchStream,
    rollup: Rollup,
    reservation: MemoryReservation,
    baseline: BaselineMetrics,
}

impl Run {
    /// The next batch of ended groups; `None` once the last groups are out.
    async fn next(&mut self) -> DfResult<Option<RecordBatch>> {
        loop {
            let Some(batch) = self.input.next().await.transpose()? else {
                if self.rollup.levels.is_empty() {
                    return Ok(None);
                }
                let _timer = self.baseline.elapsed_compute().timer();
                let out = self.rollup.finish()?;
                self.reservation.free();
                self.baseline.record_output(out.num_rows());
                return Ok(Some(out));
            };
            let _timer = self.baseline.elapsed_compute().timer();
            let out = self.rollup.push(&batch)?;
            self.reservation.try_resize(self.rollup.size())?;
            if out.num_rows() > 0 {
                self.baseline.record_output(out.num_rows());
                return Ok(Some(out));
            }
        }
    }
}

/// The state of a rollup between batches: each level's open group and the keys of
/// the last row seen (the open groups' keys).
struct Rollup {
    keys: Vec<Arc<dyn PhysicalExpr>>,
    arguments: Vec<Vec<Arc<dyn PhysicalExpr>>>,
    filters: Vec<Option<Arc<dyn PhysicalExpr>>>,
    aggregates: Vec<Arc<AggregateFunctionExpr>>,
    schema: SchemaRef,
    /// Emptied once the last groups are out.
    levels: Vec<Level>,
    /// One-row slices: the last row's keys; `None` before the first row.
    last_keys: Option<Vec<ArrayRef>>,
}

impl Rollup {
    /// Adds `batch` (the next rows in key order) and gives the groups that ended
    /// in it, of every level.
    fn push(&mut self, batch: &RecordBatch) -> DfResult<RecordBatch> {
        let rows = batch.num_rows();
        if rows == 0 {
            return Ok(RecordBatch::new_empty(self.schema.clone()));
        }
        let keys = self
            .keys
            .iter()
            .map(|k| k.evaluate(batch)?.into_array(rows))
            .collect::<DfResult<Vec<_>>>()?;
        // The keys with the previous batch's last row in front, so that row `i` of
        // the batch is row `i + 1` here and each row has the one before it.
        let (joined, first_row) = match &self.last_keys {
            Some(last) => (
                keys.iter()
                    .zip(last)
                    .map(|(k, l)| concat(&[l.as_ref(), k.as_ref()]))
                    .collect::<Result<Vec<_>, _>>()?,
                0,
            ),
            None => (keys.clone(), 1),
        };
        let first_change = first_changes(&joined, first_row, rows)?;
        let arguments = self
            .arguments
            .iter()
            .map(|args| {
                args.iter()
                    .map(|a| a.evaluate(batch)?.into_array(rows))
                    .collect::<DfResult<Vec<_>>>()
            })
            .collect::<DfResult<Vec<_>>>()?;
        let filters = self
            .filters
            .iter()
            .map(|f| f.as_ref().map(|f| filter_values(f, batch)).transpose())
            .collect::<DfResult<Vec<_>>>()?;
        let shift = u32::from(self.last_keys.is_some());
        let mut outputs = Vec::with_capacity(self.levels.len());
        for level in &mut self.levels {
            // Group `g` of this batch is the level's open group plus the `g` that
            // started since; a group ends at the row before a change in its keys.
            let mut groups = Vec::with_capacity(rows);
            let mut ended: Vec<u32> = Vec::new();
            for (i, &change) in first_change.iter().enumerate() {
                if change < level.width {
                    // Row `i - 1` of the batch, `i` with the last row in front.
                    ended.push(i as u32 + shift - 1);
                }
                groups.push(ended.len());
            }
            for ((accumulator, args), filter) in
                level.accumulators.iter_mut().zip(&arguments).zip(&filters)
            {
                accumulator.update_batch(args, &groups, filter.as_ref(), ended.len() + 1)?;
            }
            if !ended.is_empty() {
                let ended = UInt32Array::from(ended);
                outputs.push(level.emit(&self.schema, &joined, Some(&ended))?);
            }
        }
        self.last_keys = Some(keys.iter().map(|k| k.slice(rows - 1, 1)).collect());
        concat_batches(&self.schema, &outputs).map_err(DataFusionError::from)
    }

    /// The groups still open, of every level, once the input is done. Of an empty
    /// input, the grand total's one group (as DataFusion's aggregate gives it).
    fn finish(&mut self) -> DfResult<RecordBatch> {
        let levels = std::mem::take(&mut self.levels);
        let Some(last) = &self.last_keys else {
            // No group of a level that keeps a key, and the grand total of nothing.
            let nulls: Vec<ArrayRef> = self.schema.fields()[..self.keys.len()]
                .iter()
                .map(|f| arrow_array::new_null_array(f.data_type(), 1))
                .collect();
            let mut outputs = Vec::new();
            for level in levels.iter().filter(|l| l.width == 0) {
                let mut columns = nulls.clone();
                columns.push(level.grouping_id.to_array_of_size(1)?);
                for aggregate in &self.aggregates {
                    columns.push(
                        aggregate
                            .create_accumulator()?
                            .evaluate()?
                            .to_array_of_size(1)?,
                    );
                }
                outputs.push(RecordBatch::try_new(self.schema.clone(), columns)?);
            }
            return concat_batches(&self.schema, &outputs).map_err(DataFusionError::from);
        };
        let outputs = levels
            .into_iter()
            .map(|mut level| level.emit(&self.schema, last, None))
            .collect::<DfResult<Vec<_>>>()?;
        concat_batches(&self.schema, &outputs).map_err(DataFusionError::from)
    }

    /// Bytes the accumulators hold.
    fn size(&self) -> usize {
        self.levels
            .iter()
            .flat_map(|l| &l.accumulators)
            .map(|a| a.size())
            .sum()
    }
}

impl Level {
    /// The level's first groups as rows: `ended` picks each one's keys from `keys`
    /// (a row of each) and they are the first `ended.len()` groups; with no `ended`,
    /// the only group left, its keys the one row of `keys`.
    fn emit(
        &mut self,
        schema: &SchemaRef,
        keys: &[ArrayRef],
        ended: Option<&UInt32Array>,
    ) -> DfResult<RecordBatch> {
        let (count, emit_to) = match ended {
            Some(ended) => (ended.len(), EmitTo::First(ended.len())),
            None => (1, EmitTo::All),
        };
        let mut columns = Vec::with_capacity(schema.fields().len());
        for (i, key) in keys.iter().enumerate() {
            columns.push(match ended {
                _ if i >= self.width => {
                    arrow_array::new_null_array(schema.field(i).data_type(), count)
                }
                Some(ended) => take(key.as_ref(), ended, None)?,
                None => key.clone(),
            });
        }
        columns.push(self.grouping_id.to_array_of_size(count)?);
        for accumulator in &mut self.accumulators {
            columns.push(accumulator.evaluate(emit_to)?);
        }
        RecordBatch::try_new(schema.clone(), columns).map_err(DataFusionError::from)
    }
}

/// For each of the `rows` last rows of `keys`, the first key in which it differs
/// from the row before it (NULLs equal), or the number of keys if none; the rows
/// start at `first_row` (1 when there is no row before the first: it then changes
/// nothing).
fn first_changes(keys: &[ArrayRef], first_row: usize, rows: usize) -> DfResult<Vec<usize>> {
    let mut first_change = vec![keys.len(); rows];
    let compared = rows - first_row;
    if compared == 0 {
        return Ok(first_change);
    }
    let offset = keys.first().map_or(0, |k| k.len() - compared);
    for (index, key) in keys.iter().enumerate().rev() {
        let changed = distinct(
            &key.slice(offset, compared),
            &key.slice(offset - 1, compared),
        )?;
        for (i, change) in changed.values().iter().enumerate() {
            if change {
                first_change[first_row + i] = index;
            }
        }
    }
    Ok(first_change)
}

/// `filter` over `batch` as the rows an aggregate takes (NULL: not taken).
fn filter_values(filter: &Arc<dyn PhysicalExpr>, batch: &RecordBatch) -> DfResult<BooleanArray> {
    let values = filter.evaluate(batch)?.into_array(batch.num_rows())?;
    match values.as_any().downcast_ref::<BooleanArray>() {
        Some(values) => Ok(values.clone()),
        None => internal_err!(
            "an aggregate's filter gave {}, not booleans",
            values.data_type()
        ),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;

    use datafusion::arrow::util::pretty::pretty_format_batches;
    use datafusion::datasource::MemTable;
    use datafusion::prelude::SessionContext;
    use polars::prelude::{df, DataFrame};

    use super::*;
    use crate::budget::Budget;
    use crate::frame::RemoteFrame;
    use crate::query::test_env::local_env;
    use crate::query::QuerySession;

    /// 30 k rows: keys with NULLs and runs that cross batches, values with NULLs.
    fn table() -> DataFrame {
        let n = 30_000i64;
        let a: Vec<Option<i64>> = (0..n).map(|i| (i % 7 != 3).then_some(i % 5)).collect();
        let b: Vec<Option<String>> = (0..n)
            .map(|i| (i % 11 != 0).then(|| format!("b{}", (i / 3) % 4)))
            .collect();
        let v: Vec<Option<i64>> = (0..n).map(|i| (i % 13 != 0).then_some(i % 29)).collect();
        df!(
            "a" => a,
            "b" => b,
            "c" => (0..n).map(|i| (i / 1000) % 3).collect::<Vec<_>>(),
            "d" => (0..n).map(|i| i % 17).collect::<Vec<_>>(),
            "v" => v
        )
        .unwrap()
    }

    /// `sql`'s answer from DataFusion itself (its hash aggregate over grouping sets)
    /// over the rows of `session`'s table `t`, as text.
    fn reference(session: &QuerySession, sql: &str) -> String {
        let rows = session.sql("SELECT * FROM t").unwrap();
        let batches = rows.batches().to_vec();
        let ctx = SessionContext::new();
        let table = MemTable::try_new(batches[0].schema(), vec![batches]).unwrap();
        ctx.register_table("t", Arc::new(table)).unwrap();
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let out = runtime
            .block_on(async { ctx.sql(sql).await.unwrap().collect().await })
            .unwrap();
        pretty_format_batches(&out).unwrap().to_string()
    }

    /// Fails with the first lines that differ (the tables run to thousands of lines).
    fn assert_same_table(got: &str, want: &str) {
        let got: Vec<&str> = got.lines().collect();
        let want: Vec<&str> = want.lines().collect();
        let differing: Vec<String> = got
            .iter()
            .zip(&want)
            .enumerate()
            .filter(|(_, (g, w))| g != w)
            .take(6)
            .map(|(i, (g, w))| format!("line {i}:\n  got  {g}\n  want {w}"))
            .collect();
        assert!(
            differing.is_empty() && got.len() == want.len(),
            "{} lines against {}\n{}",
            got.len(),
            want.len(),
            differing.join("\n")
        );
    }

    const ROLLUP: &str = "SELECT a, b, c, d, sum(v) AS s, count(*) AS n, count(v) AS nv, \
        avg(v) AS m, max(v) FILTER (WHERE v > 10) AS top, grouping(a) AS ga, \
        grouping(b) AS gb, grouping(c) AS gc, grouping(d) AS gd FROM t \
        GROUP BY ROLLUP(a, b, c, d) ORDER BY a NULLS FIRST, b NULLS FIRST, c NULLS FIRST, \
        d NULLS FIRST, ga, gb, gc, gd";

    #[test]
    fn a_sorted_rollup_answers_as_the_grouping_sets_do() {
        let env = local_env(1, 256 << 20);
        let session = QuerySession::new(&env).unwrap();
        let t = RemoteFrame::from_polars(&env, &table()).unwrap();
        session.register("t", &t).unwrap();
        let plan = session.explain(ROLLUP).unwrap();
        assert!(plan.contains("RollupExec"), "{plan}");
        let got = session.sql(ROLLUP).unwrap();
        let got_text = pretty_format_batches(got.batches()).unwrap().to_string();
        assert_same_table(&got_text, &reference(&session, ROLLUP));
        // Every level is there: the grand total, and 5 values of a plus NULL.
        assert!(got.rows() > 1000, "{}", got.rows());
    }

    #[test]
    fn a_sorted_rollup_under_a_small_budget_sorts_by_spilling_and_answers_the_same() {
        let env = local_env(1, 256 << 20);
        let t = RemoteFrame::from_polars(&env, &table()).unwrap();
        let small = env.with_budget(Budget::from_limit(Some(1 << 20)).unwrap());
        let session = QuerySession::new(&small).unwrap();
        session.register("t", &t).unwrap();
        let got = session.sql(ROLLUP).unwrap();
        let analyzed = got.explain_analyze();
        assert!(analyzed.contains("RollupExec"), "{analyzed}");
        assert!(got.stats().spill_files > 0, "{analyzed}");
        let got_text = pretty_format_batches(got.batches()).unwrap().to_string();
        assert_same_table(&got_text, &reference(&session, ROLLUP));
    }

    #[test]
    fn an_empty_input_rolls_up_as_datafusion_does_and_other_groupings_are_left_alone() {
        let env = local_env(1, 64 << 20);
        let session = QuerySession::new(&env).unwrap();
        let t = RemoteFrame::from_polars(&env, &table()).unwrap();
        session.register("t", &t).unwrap();
        let empty = "SELECT a, b, c, d, sum(v) AS s, count(*) AS n FROM t WHERE v > 1000 \
            GROUP BY ROLLUP(a, b, c, d)";
        assert!(session.explain(empty).unwrap().contains("RollupExec"));
        let got = session.sql(empty).unwrap();
        let got_text = pretty_format_batches(got.batches()).unwrap().to_string();
        assert_same_table(&got_text, &reference(&session, empty));
        // A cube's sets are not prefixes of its keys; a rollup of two keys (three
        // sets) is expanded.
        let cube = "SELECT a, b, sum(v) FROM t GROUP BY CUBE(a, b, c)";
        let short = "SELECT a, b, sum(v) FROM t GROUP BY ROLLUP(a, b)";
        for sql in [cube, short] {
            assert!(
                !session.explain(sql).unwrap().contains("RollupExec"),
                "{sql}"
            );
        }
    }

    #[test]
    fn grouping_ids_are_datafusions() {
        // Two keys kept of three: the third key's bit (the lowest) set.
        assert_eq!(
            grouping_id(2, 3, &DataType::UInt8).unwrap(),
            ScalarValue::UInt8(Some(0b001))
        );
        assert_eq!(
            grouping_id(0, 9, &DataType::UInt16).unwrap(),
            ScalarValue::UInt16(Some(0x1ff))
        );
        assert_eq!(
            grouping_id(9, 9, &DataType::UInt16).unwrap(),
            ScalarValue::UInt16(Some(0))
        );
    }

    #[test]
    fn first_changes_compare_each_row_with_the_one_before() {
        let a: ArrayRef = Arc::new(arrow_array::Int64Array::from(vec![
            Some(1),
            Some(1),
            None,
            None,
            Some(2),
        ]));
        let b: ArrayRef = Arc::new(arrow_array::StringArray::from(vec![
            Some("x"),
            Some("y"),
            Some("y"),
            Some("y"),
            None,
        ]));
        // No row before the first: rows 1.. compared.
        assert_eq!(
            first_changes(&[a.clone(), b.clone()], 1, 5).unwrap(),
            vec![2, 1, 0, 2, 0]
        );
        // The last row of a batch before: all five compared with one in front.
        let front: Vec<ArrayRef> = vec![
            concat(&[a.slice(0, 1).as_ref(), a.as_ref()]).unwrap(),
            concat(&[b.slice(1, 1).as_ref(), b.as_ref()]).unwrap(),
        ];
        assert_eq!(first_changes(&front, 0, 5).unwrap(), vec![1, 1, 0, 2, 0]);
        // Dictionary-encoded keys compare by value.
        let d: ArrayRef = Arc::new(
            vec![Some("x"), Some("x"), None, Some("y")]
                .into_iter()
                .collect::<arrow_array::DictionaryArray<arrow_array::types::Int32Type>>(),
        );
        assert_eq!(first_changes(&[d], 1, 4).unwrap(), vec![1, 1, 0, 0]);
    }
}
