//! Rows a rank filter above a window will drop, dropped before the window's sort.
//!
//! q67 keeps the 100 best rows per category: `rank() OVER (PARTITION BY i_category
//! ORDER BY sumsales DESC) AS rk ... WHERE rk <= 100`. DataFusion sorts all 505 k
//! groups of its ROLLUP (at 25 MiB, 191 MB spilled in 14 runs), numbers them and then
//! filters out all but 1.1 k. [`RankFilters`] puts a [`RankFilterExec`] under the
//! window's sort: it keeps, per partition, only the rows whose rank can still be at
//! most N, compacting what it holds as rows arrive, so the sort sees about N rows per
//! partition.
//!
//! Dropping a row whose rank among the rows seen so far is above N is safe: its rank
//! among all rows is no smaller, and no row of rank N or less ranks after it, so the
//! rows that stay keep their ranks (for `row_number`, ties fall in some order either
//! way; for `dense_rank`, the same holds of the distinct values). The window and the
//! filter above still run and decide. When what it holds does not fit the memory it
//! can reserve (very many partitions), the operator passes everything on as it comes.

use std::fmt;
use std::sync::Arc;

use arrow_array::RecordBatch;
use datafusion::arrow::compute::{concat_batches, lexsort_to_indices, partition, take, SortColumn};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Result as DfResult, ScalarValue};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::expressions::{BinaryExpr, Column, Literal};
use datafusion::physical_expr::{PhysicalExpr, PhysicalSortExpr};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::windows::BoundedWindowAggExec;
use datafusion::physical_plan::{
    ChildrenPropertiesMode, DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties,
    ReplaceChildrenOptions, SendableRecordBatchStream,
};
use futures::{Stream, StreamExt};

use super::operator::{apply_each, only_child, replace_each, unordered_properties};
use super::owned::take_rows;

/// Puts a [`RankFilterExec`] under the sort of each window whose rank a filter above
/// bounds (see the module docs; a physical optimizer rule).
#[derive(Debug, Default)]
pub(crate) struct RankFilters;

impl PhysicalOptimizerRule for RankFilters {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        replace_each(plan, |filter: &FilterExec| {
            let Some((mut column, limit)) = rank_bound(filter.predicate()) else {
                return Ok(None);
            };
            // Down through what passes rows on as they are (following the bounded
            // column through projections), to the window.
            let mut path: Vec<Arc<dyn ExecutionPlan>> = Vec::new();
            let mut node = filter.input().clone();
            loop {
                if let Some(projection) = node.downcast_ref::<ProjectionExec>() {
                    let Some(source) = projection
                        .expr()
                        .get(column)
                        .and_then(|e| e.expr.downcast_ref::<Column>())
                    else {
                        return Ok(None);
                    };
                    column = source.index();
                } else if node.downcast_ref::<RepartitionExec>().is_none() {
                    break;
                }
                let child = node.children()[0].clone();
                path.push(node);
                node = child;
            }
            let Some(window) = node.downcast_ref::<BoundedWindowAggExec>() else {
                return Ok(None);
            };
            let input_width = window.input().schema().fields().len();
            let [expr] = window.window_expr() else {
                return Ok(None);
            };
            if column != input_width {
                return Ok(None);
            }
            let kind = match expr.name().split('(').next() {
                Some("rank") => RankKind::Rank,
                Some("dense_rank") => RankKind::DenseRank,
                Some("row_number") => RankKind::RowNumber,
                _ => return Ok(None),
            };
            let Some(sort) = window.input().downcast_ref::<SortExec>() else {
                return Ok(None);
            };
            if sort.fetch().is_some() {
                return Ok(None);
            }
            let ranked = RankFilterExec::new(
                sort.input().clone(),
                expr.partition_by().to_vec(),
                expr.order_by().to_vec(),
                limit,
                kind,
            );
            let options = ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute);
            let sort = Arc::new(sort.clone()).replace_children(vec![Arc::new(ranked)], options)?;
            let mut rebuilt = Arc::new(window.clone()).replace_children(vec![sort], options)?;
            for above in path.into_iter().rev() {
                rebuilt = above.replace_children(vec![rebuilt], options)?;
            }
            Ok(Some(
                Arc::new(filter.clone()).replace_children(vec![rebuilt], options)?,
            ))
        })
    }

    fn name(&self) -> &str {
        "scad_rank_filters"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// `(column, n)` when `predicate` (or one of its conjuncts) is `column <= n` or
/// `column < n + 1` for an integer literal.
fn rank_bound(predicate: &Arc<dyn PhysicalExpr>) -> Option<(usize, usize)> {
    let binary = predicate.downcast_ref::<BinaryExpr>()?;
    if *binary.op() == Operator::And {
        return rank_bound(binary.left()).or_else(|| rank_bound(binary.right()));
    }
    let column = binary.left().downcast_ref::<Column>()?;
    let literal = binary.right().downcast_ref::<Literal>()?;
    let value = match literal.value() {
        ScalarValue::Int64(Some(v)) => *v,
        ScalarValue::UInt64(Some(v)) => i64::try_from(*v).ok()?,
        ScalarValue::Int32(Some(v)) => i64::from(*v),
        _ => return None,
    };
    let limit = match binary.op() {
        Operator::LtEq => value,
        Operator::Lt => value - 1,
        _ => return None,
    };
    Some((column.index(), usize::try_from(limit).ok()?))
}

/// Which numbering the filter bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RankKind {
    Rank,
    DenseRank,
    RowNumber,
}

/// Passes on, per window partition, only the rows whose rank can be at most `limit`
/// (see the module docs). Its output is in no particular order.
#[derive(Debug)]
pub(crate) struct RankFilterExec {
    input: Arc<dyn ExecutionPlan>,
    partition_by: Vec<Arc<dyn PhysicalExpr>>,
    order_by: Vec<PhysicalSortExpr>,
    limit: usize,
    kind: RankKind,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl RankFilterExec {
    fn new(
        input: Arc<dyn ExecutionPlan>,
        partition_by: Vec<Arc<dyn PhysicalExpr>>,
        order_by: Vec<PhysicalSortExpr>,
        limit: usize,
        kind: RankKind,
    ) -> Self {
        let properties = unordered_properties(&input);
        RankFilterExec {
            input,
            partition_by,
            order_by,
            limit,
            kind,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }
}

impl DisplayAs for RankFilterExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "RankFilterExec: {:?} <= {}", self.kind, self.limit)
    }
}

impl ExecutionPlan for RankFilterExec {
    fn name(&self) -> &str {
        "RankFilterExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        let order_by = self.order_by.iter().map(|s| &s.expr);
        apply_each(self.partition_by.iter().chain(order_by), f)
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let input = only_child("RankFilterExec", children)?;
        Ok(Arc::new(RankFilterExec::new(
            input,
            self.partition_by.clone(),
            self.order_by.clone(),
            self.limit,
            self.kind,
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
        let input = self.input.execute(partition, context.clone())?;
        let reservation = MemoryConsumer::new(format!("RankFilterExec[{partition}]"))
            .register(context.memory_pool());
        let ranker = Ranker {
            partition_by: self.partition_by.clone(),
            order_by: self.order_by.clone(),
            limit: self.limit,
            kind: self.kind,
        };
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let schema = self.schema();
        let stream = ranked(input, ranker, reservation, baseline);
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

/// Picks the rows that can rank at most `limit` from a batch.
struct Ranker {
    partition_by: Vec<Arc<dyn PhysicalExpr>>,
    order_by: Vec<PhysicalSortExpr>,
    limit: usize,
    kind: RankKind,
}

impl Ranker {
    /// The rows of `batch` whose rank among its rows of their partition is at most
    /// the limit.
    fn keep(&self, batch: &RecordBatch) -> DfResult<RecordBatch> {
        if batch.num_rows() == 0 {
            return Ok(batch.clone());
        }
        let rows = batch.num_rows();
        let keys = self
            .partition_by
            .iter()
            .map(|e| e.evaluate(batch)?.into_array(rows))
            .collect::<DfResult<Vec<_>>>()?;
        let orders = self
            .order_by
            .iter()
            .map(|s| s.expr.evaluate(batch)?.into_array(rows))
            .collect::<DfResult<Vec<_>>>()?;
        let mut columns: Vec<SortColumn> = keys
            .iter()
            .map(|k| SortColumn {
                values: k.clone(),
                options: None,
            })
            .collect();
        columns.extend(orders.iter().zip(&self.order_by).map(|(o, s)| SortColumn {
            values: o.clone(),
            options: Some(s.options),
        }));
        let sorted = lexsort_to_indices(&columns, None)?;
        let in_order = |arrays: &[arrow_array::ArrayRef]| {
            arrays
                .iter()
                .map(|a| take(a.as_ref(), &sorted, None))
                .collect::<Result<Vec<_>, _>>()
        };
        let keys = in_order(&keys)?;
        let orders = in_order(&orders)?;
        let parts = if keys.is_empty() {
            std::iter::once(0..rows).collect()
        } else {
            partition(&keys)?.ranges()
        };
        let mut kept: Vec<u32> = Vec::new();
        for part in parts {
            let peers = if orders.is_empty() {
                std::iter::once(0..part.len()).collect()
            } else {
                let slices: Vec<_> = orders
                    .iter()
                    .map(|o| o.slice(part.start, part.len()))
                    .collect();
                partition(&slices)?.ranges()
            };
            for (group, peer) in peers.into_iter().enumerate() {
                let keep = match self.kind {
                    RankKind::Rank => peer.start < self.limit,
                    RankKind::DenseRank => group < self.limit,
                    RankKind::RowNumber => peer.start < self.limit,
                };
                if !keep {
                    break;
                }
                let end = match self.kind {
                    RankKind::RowNumber => peer.end.min(self.limit),
                    _ => peer.end,
                };
                kept.extend((part.start + peer.start..part.start + end).map(|i| sorted.value(i)));
            }
        }
        take_rows(batch, &kept)
    }
}

/// Rows gathered before they are ranked together with those kept so far.
const GATHER_ROWS: usize = 1 << 16;

/// The stream of a [`RankFilterExec`] partition: the rows kept, once the input is
/// done; or, when they do not fit the reservation, everything as it comes.
fn ranked(
    mut input: SendableRecordBatchStream,
    ranker: Ranker,
    reservation: MemoryReservation,
    baseline: BaselineMetrics,
) -> impl Stream<Item = DfResult<RecordBatch>> + Send {
    let schema = input.schema();
    let gathered = async move {
        let mut held: Vec<RecordBatch> = Vec::new();
        let mut held_rows = 0usize;
        while let Some(batch) = input.next().await {
            let batch = batch?;
            if reservation.try_grow(batch.get_array_memory_size()).is_err() {
                // Rank what is held; if even that does not fit, pass everything on.
                held_rows = compact(&ranker, &schema, &mut held, &reservation, &baseline)?;
                if reservation.try_grow(batch.get_array_memory_size()).is_err() {
                    held.push(batch);
                    return Ok::<_, datafusion::common::DataFusionError>((held, Some(input)));
                }
            }
            held_rows += batch.num_rows();
            held.push(batch);
            if held_rows >= GATHER_ROWS {
                held_rows = compact(&ranker, &schema, &mut held, &reservation, &baseline)?;
            }
        }
        compact(&ranker, &schema, &mut held, &reservation, &baseline)?;
        Ok((held, None))
    };
    futures::stream::once(gathered)
        .map(move |result| match result {
            Ok((batches, rest)) => {
                let head = futures::stream::iter(batches.into_iter().map(Ok));
                match rest {
                    Some(rest) => head.chain(rest).boxed(),
                    None => head.boxed(),
                }
            }
            Err(e) => futures::stream::once(async move { Err(e) }).boxed(),
        })
        .flatten()
}

/// Replaces `held` by the rows of it that can still rank at most the limit, as one
/// batch, and resizes `reservation` to it; returns its rows.
fn compact(
    ranker: &Ranker,
    schema: &arrow_schema::SchemaRef,
    held: &mut Vec<RecordBatch>,
    reservation: &MemoryReservation,
    baseline: &BaselineMetrics,
) -> DfResult<usize> {
    let timer = baseline.elapsed_compute().timer();
    let all = concat_batches(schema, held.iter())?;
    let kept = ranker.keep(&all);
    timer.done();
    let kept = kept?;
    // The kept rows take less than those held: a shrink (were it refused, the
    // reservation would only stay larger than needed).
    reservation.try_resize(kept.get_array_memory_size()).ok();
    let rows = kept.num_rows();
    *held = vec![kept];
    Ok(rows)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeMap;

    use crate::frame::RemoteFrame;
    use crate::query::test_env::local_env;
    use crate::query::QuerySession;
    use polars::prelude::df;

    /// `(p, id)` of the rows `sql` returns (columns `p` and `id`), sorted.
    fn rows(session: &QuerySession, sql: &str) -> Vec<(i64, i64)> {
        let got = session.sql(sql).unwrap().to_polars().unwrap();
        let p = got.column("p").unwrap().i64().unwrap();
        let id = got.column("id").unwrap().i64().unwrap();
        let mut out: Vec<(i64, i64)> = (0..got.height())
            .map(|i| (p.get(i).unwrap(), id.get(i).unwrap()))
            .collect();
        out.sort();
        out
    }

    #[test]
    fn rank_filters_keep_exactly_the_rows_the_window_keeps() {
        let env = local_env(1, 64 << 20);
        let session = QuerySession::new(&env).unwrap();
        // 40 partitions, values with many ties, in an order the sort must fix.
        let n = 30_000i64;
        let t = df!(
            "id" => (0..n).collect::<Vec<_>>(),
            "p" => (0..n).map(|i| (i * 7) % 40).collect::<Vec<_>>(),
            "v" => (0..n).map(|i| (i * 13) % 23).collect::<Vec<_>>()
        )
        .unwrap();
        session
            .register("t", &RemoteFrame::from_polars(&env, &t).unwrap())
            .unwrap();
        // By hand: per partition, the ids by v descending.
        let mut by_p: BTreeMap<i64, Vec<(i64, i64)>> = BTreeMap::new();
        for i in 0..n {
            by_p.entry((i * 7) % 40)
                .or_default()
                .push(((i * 13) % 23, i));
        }
        let (mut rank3, mut dense2, mut first5) = (Vec::new(), Vec::new(), Vec::new());
        for (p, rows) in &by_p {
            for &(v, id) in rows {
                let better = rows.iter().filter(|(w, _)| *w > v).count();
                let mut distinct: Vec<i64> =
                    rows.iter().map(|(w, _)| *w).filter(|w| *w > v).collect();
                distinct.sort();
                distinct.dedup();
                if better < 3 {
                    rank3.push((*p, id));
                }
                if distinct.len() < 2 {
                    dense2.push((*p, id));
                }
            }
            let mut ordered = rows.clone();
            ordered.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
            first5.extend(ordered.iter().take(5).map(|&(_, id)| (*p, id)));
        }
        rank3.sort();
        dense2.sort();
        first5.sort();
        let cases = [
            (
                "rank() OVER (PARTITION BY p ORDER BY v DESC)",
                "r <= 3",
                rank3,
            ),
            (
                "dense_rank() OVER (PARTITION BY p ORDER BY v DESC)",
                "r < 3",
                dense2,
            ),
            (
                "row_number() OVER (PARTITION BY p ORDER BY v DESC, id)",
                "r <= 5",
                first5,
            ),
        ];
        for (window, bound, want) in cases {
            let sql =
                format!("SELECT p, id FROM (SELECT p, id, {window} AS r FROM t) WHERE {bound}");
            let plan = session.explain(&sql).unwrap();
            assert!(plan.contains("RankFilterExec"), "{plan}");
            assert_eq!(rows(&session, &sql), want, "{window} {bound}");
        }
        // A bound on something else than the numbering is left alone.
        let other =
            "SELECT p, id FROM (SELECT p, id, v, rank() OVER (PARTITION BY p ORDER BY v) AS r \
                     FROM t) WHERE v <= 3";
        assert!(!session.explain(other).unwrap().contains("RankFilterExec"));
    }
}
