//! Hash-join build sides chosen by estimated cardinality.
//!
//! DataFusion's `JoinSelection` puts the smaller input of a hash join on the build
//! (left) side, but past the first join its sizes are guesses that go wrong in the
//! worst way for star schemas: without distinct counts it takes a column's distinct
//! count to be the row count, so a fact ⋈ dimension join is estimated at
//! min(fact, dimension) rows, the size of the *dimension*. Each later join of a
//! chain then keeps the fact side as its build side (a hash table of millions of
//! fact rows, probed by a few hundred dimension rows). [`JoinOrder`] runs right after `JoinSelection` and, before
//! repartitioning is planned, swaps a hash join's inputs when its build side is
//! estimated [`SWAP_RATIO`] times larger than its probe side.
//!
//! The estimates ([`estimate`]) work bottom-up from the scans' exact row counts:
//! - a filter keeps a fixed fraction of its input per predicate (equality 1/10,
//!   range 1/3, ...); the frames carry no min/max or distinct counts yet;
//! - an inner equi-join under the foreign-key assumption: every row of the side with
//!   the larger key domain finds its partner, so the output is the larger side scaled
//!   by the fraction of the other side's base relation that survived its filters —
//!   `|L| × |R| / min(base L, base R)`, where *base* is the row count of the relation
//!   whose rows the side's keys come from (a scan's rows; unchanged by filters; the
//!   larger of a join's two; an aggregate's own output);
//! - outer joins at least their preserved sides, semi and anti joins at most theirs;
//! - an aggregate with groups a tenth of its input, without groups one row;
//! - limits (and every operator's `fetch`) cap; unions add; the rest keep their
//!   input's rows.
//!
//! A join `JoinSelection` partitioned by key (both inputs repartitioned) is
//! collected instead (its build side read once for all partitions, the probe side
//! read where it is) when its build side only scans, filters and joins and is
//! estimated below the collect threshold: DataFusion's statistics have no size past
//! a join, so it partitioned joins of a few hundred dimension rows, repartitioning
//! the million-row probe side (q84, q91). A build side with an aggregate or a
//! window is left as planned: its estimate is a guess.
//!
//! Only the sides and modes of joins are chosen here; the order of a chain of inner
//! joins was chosen on the logical plan ([`super::chain_order`]).

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{JoinType, Result as DfResult};
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::expressions::{
    BinaryExpr, InListExpr, IsNotNullExpr, IsNullExpr, LikeExpr, NotExpr,
};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::joins::{
    CrossJoinExec, HashJoinExec, NestedLoopJoinExec, PartitionMode, SortMergeJoinExec,
    SymmetricHashJoinExec,
};
use datafusion::physical_plan::limit::{GlobalLimitExec, LocalLimitExec};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
use datafusion::physical_plan::union::{InterleaveExec, UnionExec};
use datafusion::physical_plan::ExecutionPlan;

use super::join::SpillingHashJoinExec;
use super::operator::estimated_row_width;
use super::scan::passes_rows;

/// A hash join's inputs are swapped when the build side is estimated this many times
/// larger than the probe side. A margin rather than any difference: the estimates are
/// rough, and where both inputs are scans `JoinSelection` already compared their exact
/// byte sizes.
pub(crate) const SWAP_RATIO: f64 = 2.0;

/// Bytes assumed for a value of a column of no fixed width.
const VARIABLE_WIDTH: usize = 32;

/// Rows assumed for a leaf operator that reports no row count.
const UNKNOWN_ROWS: f64 = 1_000_000.0;

/// Fraction of its input an aggregate with groups is assumed to keep.
const GROUP_FRACTION: f64 = 0.1;

/// The least fraction a filter, or an anti join, is assumed to keep: estimates
/// multiply, and a chain of guesses must not reach zero.
const MIN_FRACTION: f64 = 1e-3;

/// Swaps hash-join inputs so that the side estimated smaller is built, and collects
/// small build sides of joined scans (see the module docs). A physical optimizer
/// rule, to run after DataFusion's `JoinSelection` and before its distribution and
/// sorting requirements are enforced.
#[derive(Debug, Default)]
pub(crate) struct JoinOrder;

impl PhysicalOptimizerRule for JoinOrder {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        if !config.optimizer.join_reordering {
            return Ok(plan);
        }
        let collect_bytes = config.optimizer.hash_join_single_partition_threshold as f64;
        // Bottom-up, so that a join's inputs have their sides chosen (and their
        // output estimated as they will run) before the join itself.
        plan.transform_up(|node| {
            let Some(join) = node.downcast_ref::<HashJoinExec>() else {
                return Ok(Transformed::no(node));
            };
            let build = estimate(join.left().as_ref()).rows;
            let probe = estimate(join.right().as_ref()).rows;
            // A null-aware anti join (NOT IN) needs the subquery on its build side.
            let swap = !join.null_aware
                && join.join_type().supports_swap()
                && build > SWAP_RATIO * probe;
            let (built, built_rows) = if swap {
                (join.right(), probe)
            } else {
                (join.left(), build)
            };
            let mode = match join.partition_mode() {
                PartitionMode::Partitioned
                    if joins_of_scans(built.as_ref())
                        && built_rows * row_bytes(built) < collect_bytes =>
                {
                    PartitionMode::CollectLeft
                }
                mode => *mode,
            };
            if swap {
                tracing::debug!(build, probe, join_type = %join.join_type(), "swapping hash join inputs");
                return Ok(Transformed::yes(join.swap_inputs(mode)?));
            }
            if mode == *join.partition_mode() {
                return Ok(Transformed::no(node));
            }
            tracing::debug!(build, join_type = %join.join_type(), "collecting a small build side");
            Ok(Transformed::yes(
                join.builder().with_partition_mode(mode).build_exec()?,
            ))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "scad_join_order"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// Whether `plan` only scans, filters, projects and joins: where the estimates
/// follow rows through filters and key relationships rather than guessing an
/// aggregate's groups or a window's output.
fn joins_of_scans(plan: &dyn ExecutionPlan) -> bool {
    let own = plan.children().is_empty()
        || plan.downcast_ref::<HashJoinExec>().is_some()
        || plan.downcast_ref::<FilterExec>().is_some()
        || plan.downcast_ref::<ProjectionExec>().is_some()
        || passes_rows(plan);
    own && plan.children().iter().all(|c| joins_of_scans(c.as_ref()))
}

/// Bytes a row of `plan`'s output is assumed to take (strings [`VARIABLE_WIDTH`]).
fn row_bytes(plan: &Arc<dyn ExecutionPlan>) -> f64 {
    estimated_row_width(plan.schema().fields(), VARIABLE_WIDTH) as f64
}

/// The bytes `plan` is estimated to output: [`estimate`]'s rows at [`row_bytes`]
/// each (`None` when the estimate is not a finite number).
pub(crate) fn estimated_bytes(plan: &Arc<dyn ExecutionPlan>) -> Option<usize> {
    let bytes = estimate(plan.as_ref()).rows * row_bytes(plan);
    // `as` saturates at usize::MAX.
    bytes.is_finite().then_some(bytes.ceil() as usize)
}

/// Estimated output of an operator.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Estimate {
    /// Rows it produces.
    pub(crate) rows: f64,
    /// Rows of the relation its join keys come from (see the module docs): the
    /// output divided by this is the fraction that survived filters and joins.
    pub(crate) base: f64,
}

impl Estimate {
    fn relation(rows: f64) -> Self {
        Estimate { rows, base: rows }
    }

    fn with_rows(self, rows: f64) -> Self {
        Estimate {
            rows: rows.max(0.0),
            base: self.base.max(rows),
        }
    }
}

/// Estimated output of `plan` (see the module docs).
pub(crate) fn estimate(plan: &dyn ExecutionPlan) -> Estimate {
    let children: Vec<Estimate> = plan
        .children()
        .into_iter()
        .map(|c| estimate(c.as_ref()))
        .collect();
    let own = estimate_node(plan, &children);
    match plan.fetch() {
        Some(fetch) => own.with_rows(own.rows.min(fetch as f64)),
        None => own,
    }
}

fn estimate_node(plan: &dyn ExecutionPlan, children: &[Estimate]) -> Estimate {
    let first = children.first().copied();
    if let Some(filter) = plan.downcast_ref::<FilterExec>() {
        let input = first.unwrap_or(Estimate::relation(UNKNOWN_ROWS));
        return input.with_rows(input.rows * selectivity(filter.predicate()));
    }
    if let Some(join) = plan.downcast_ref::<HashJoinExec>() {
        return join_estimate(*join.join_type(), children);
    }
    if let Some(join) = plan.downcast_ref::<SpillingHashJoinExec>() {
        return join_estimate(*join.wrapped().join_type(), children);
    }
    if let Some(join) = plan.downcast_ref::<SortMergeJoinExec>() {
        return join_estimate(join.join_type(), children);
    }
    if let Some(join) = plan.downcast_ref::<SymmetricHashJoinExec>() {
        return join_estimate(*join.join_type(), children);
    }
    if let Some(join) = plan.downcast_ref::<NestedLoopJoinExec>() {
        // Usually an inequality join or a cross join with a filter.
        let (l, r) = pair(children);
        let product = Estimate {
            rows: l.rows * r.rows * 0.5,
            base: l.base.max(r.base),
        };
        return type_bounds(*join.join_type(), product, l, r);
    }
    if plan.downcast_ref::<CrossJoinExec>().is_some() {
        let (l, r) = pair(children);
        return Estimate::relation(l.rows * r.rows);
    }
    if let Some(agg) = plan.downcast_ref::<AggregateExec>() {
        let input = first.unwrap_or(Estimate::relation(UNKNOWN_ROWS));
        return match agg.mode() {
            // Partial aggregates reduce within a batch stream only; the final
            // aggregate above says what is left.
            AggregateMode::Partial => input,
            _ if agg.group_expr().is_empty() => Estimate::relation(1.0),
            _ => Estimate::relation((input.rows * GROUP_FRACTION).max(1.0).min(input.rows)),
        };
    }
    if let Some(limit) = plan.downcast_ref::<GlobalLimitExec>() {
        let input = first.unwrap_or(Estimate::relation(UNKNOWN_ROWS));
        let left = (input.rows - limit.skip() as f64).max(0.0);
        return input.with_rows(limit.fetch().map_or(left, |f| left.min(f as f64)));
    }
    if let Some(limit) = plan.downcast_ref::<LocalLimitExec>() {
        let input = first.unwrap_or(Estimate::relation(UNKNOWN_ROWS));
        return input.with_rows(input.rows.min(limit.fetch() as f64));
    }
    if plan.downcast_ref::<UnionExec>().is_some() || plan.downcast_ref::<InterleaveExec>().is_some()
    {
        return sum(children);
    }
    match children {
        // Scans (ours report exact row counts), values, empty relations.
        [] => Estimate::relation(reported_rows(plan).unwrap_or(UNKNOWN_ROWS)),
        // Projections, sorts, repartitions, windows, coalescing: rows unchanged.
        [only] => *only,
        more => sum(more),
    }
}

/// The row count the operator reports through DataFusion's statistics, if any.
fn reported_rows(plan: &dyn ExecutionPlan) -> Option<f64> {
    let stats = StatisticsContext::new()
        .compute(plan, &StatisticsArgs::new())
        .ok()?;
    stats.num_rows.get_value().map(|&n| n as f64)
}

fn pair(children: &[Estimate]) -> (Estimate, Estimate) {
    let unknown = Estimate::relation(UNKNOWN_ROWS);
    (
        children.first().copied().unwrap_or(unknown),
        children.get(1).copied().unwrap_or(unknown),
    )
}

fn sum(children: &[Estimate]) -> Estimate {
    children.iter().fold(
        Estimate {
            rows: 0.0,
            base: 0.0,
        },
        |acc, e| Estimate {
            rows: acc.rows + e.rows,
            base: acc.base + e.base,
        },
    )
}

/// An equi-join: the inner estimate under the foreign-key assumption, then bounded
/// by what the join type preserves.
fn join_estimate(join_type: JoinType, children: &[Estimate]) -> Estimate {
    let (l, r) = pair(children);
    let domain = l.base.min(r.base);
    let rows = if domain <= 0.0 {
        0.0
    } else {
        l.rows * r.rows / domain
    };
    let inner = Estimate {
        rows,
        base: l.base.max(r.base),
    };
    type_bounds(join_type, inner, l, r)
}

fn type_bounds(join_type: JoinType, inner: Estimate, l: Estimate, r: Estimate) -> Estimate {
    match join_type {
        JoinType::Inner => inner,
        JoinType::Left => inner.with_rows(inner.rows.max(l.rows)),
        JoinType::Right => inner.with_rows(inner.rows.max(r.rows)),
        JoinType::Full => {
            inner.with_rows(inner.rows.max(l.rows) + inner.rows.max(r.rows) - inner.rows)
        }
        JoinType::LeftSemi => l.with_rows(inner.rows.min(l.rows)),
        JoinType::RightSemi => r.with_rows(inner.rows.min(r.rows)),
        JoinType::LeftAnti => l.with_rows((l.rows - inner.rows).max(l.rows * MIN_FRACTION)),
        JoinType::RightAnti => r.with_rows((r.rows - inner.rows).max(r.rows * MIN_FRACTION)),
        JoinType::LeftMark => l,
        JoinType::RightMark => r,
    }
}

/// Fraction of rows a predicate is assumed to keep, from its shape alone.
fn selectivity(predicate: &Arc<dyn PhysicalExpr>) -> f64 {
    predicate_fraction(predicate.as_ref()).clamp(MIN_FRACTION, 1.0)
}

fn predicate_fraction(expr: &dyn PhysicalExpr) -> f64 {
    if let Some(binary) = expr.downcast_ref::<BinaryExpr>() {
        return match binary.op() {
            Operator::And => {
                predicate_fraction(binary.left().as_ref())
                    * predicate_fraction(binary.right().as_ref())
            }
            Operator::Or => {
                let a = predicate_fraction(binary.left().as_ref());
                let b = predicate_fraction(binary.right().as_ref());
                (a + b - a * b).min(1.0)
            }
            Operator::Eq | Operator::IsNotDistinctFrom => 0.1,
            Operator::NotEq | Operator::IsDistinctFrom => 0.9,
            Operator::Lt | Operator::LtEq | Operator::Gt | Operator::GtEq => 1.0 / 3.0,
            Operator::LikeMatch | Operator::ILikeMatch => 0.25,
            Operator::NotLikeMatch | Operator::NotILikeMatch => 0.75,
            _ => 0.5,
        };
    }
    if let Some(list) = expr.downcast_ref::<InListExpr>() {
        let hit = (0.1 * list.list().len() as f64).min(0.5);
        return if list.negated() { 1.0 - hit } else { hit };
    }
    if let Some(like) = expr.downcast_ref::<LikeExpr>() {
        return if like.negated() { 0.75 } else { 0.25 };
    }
    if expr.downcast_ref::<IsNullExpr>().is_some() {
        return 0.1;
    }
    if expr.downcast_ref::<IsNotNullExpr>().is_some() {
        return 0.9;
    }
    if let Some(not) = expr.downcast_ref::<NotExpr>() {
        return 1.0 - predicate_fraction(not.arg().as_ref()).min(0.9);
    }
    0.5
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use datafusion::execution::SessionStateBuilder;
    use datafusion::physical_plan::displayable;
    use polars::prelude::df;
    use scad_core::transport::LocalTransport;
    use scad_remote_array::MemoryElements;

    use super::*;
    use crate::env::FrameEnv;
    use crate::frame::RemoteFrame;
    use crate::query::chain_order::ChainOrder;
    use crate::query::QuerySession;
    use arrow_schema::Schema;
    use datafusion::optimizer::OptimizerRule;

    const FACT_ROWS: usize = 20_000;

    fn session() -> QuerySession {
        let elements = Arc::new(MemoryElements::new());
        elements
            .add("mem0", Arc::new(LocalTransport::new(64 << 20).unwrap()))
            .unwrap();
        let env = FrameEnv::new(elements);
        let n = FACT_ROWS as i64;
        let fact = df!(
            "f_a" => (0..n).map(|i| i % 10).collect::<Vec<_>>(),
            "f_b" => (0..n).map(|i| i % 50).collect::<Vec<_>>(),
            "f_x" => (0..n).collect::<Vec<_>>()
        )
        .unwrap();
        let dim1 = df!("d1_a" => (0..10i64).collect::<Vec<_>>()).unwrap();
        let dim2 = df!(
            "d2_b" => (0..50i64).collect::<Vec<_>>(),
            "d2_cat" => (0..50i64).map(|i| i % 5).collect::<Vec<_>>()
        )
        .unwrap();
        let session = QuerySession::new(&env).unwrap();
        for (name, df) in [("fact", fact), ("dim1", dim1), ("dim2", dim2)] {
            session
                .register(name, &RemoteFrame::from_polars(&env, &df).unwrap())
                .unwrap();
        }
        session
    }

    /// Whether a subtree reads the fact table (the only scan of that many rows).
    fn reads_fact(plan: &dyn ExecutionPlan) -> bool {
        let children = plan.children();
        if children.is_empty() {
            return reported_rows(plan) == Some(FACT_ROWS as f64);
        }
        children.into_iter().any(|c| reads_fact(c.as_ref()))
    }

    /// Hash joins whose build side reads the fact table.
    fn fact_builds(plan: &dyn ExecutionPlan) -> usize {
        let own = match plan.downcast_ref::<HashJoinExec>() {
            Some(join) => usize::from(reads_fact(join.left().as_ref())),
            None => 0,
        };
        own + plan
            .children()
            .into_iter()
            .map(|c| fact_builds(c.as_ref()))
            .sum::<usize>()
    }

    const SQL: &str = "SELECT sum(f_x) AS s FROM fact, dim1, dim2 \
                       WHERE f_a = d1_a AND f_b = d2_b AND d2_cat = 3";

    #[test]
    fn the_fact_side_of_a_join_chain_is_probed_not_built() {
        let session = session();
        let (_, physical) = session.plan(SQL).unwrap();
        let plan = displayable(physical.as_ref()).indent(true).to_string();
        assert_eq!(fact_builds(physical.as_ref()), 0, "{plan}");

        // DataFusion alone (the same session without this rule and the chain order)
        // builds the second join's hash table on the fact ⋈ dim1 side: it estimates
        // that join at min(20,000, 10) rows. If it stops doing so, this test no longer
        // tests the rule.
        let mut without = SessionStateBuilder::new_from_existing(session.ctx.state());
        if let Some(optimizer) = without.physical_optimizers() {
            optimizer.rules.retain(|r| r.name() != JoinOrder.name());
        }
        if let Some(optimizer) = without.optimizer() {
            optimizer.rules.retain(|r| r.name() != ChainOrder.name());
        }
        let without = without.build();
        let df_plan = session
            .runtime
            .block_on(async {
                let logical = without.create_logical_plan(SQL).await?;
                without.create_physical_plan(&logical).await
            })
            .unwrap();
        let df_text = displayable(df_plan.as_ref()).indent(true).to_string();
        assert!(fact_builds(df_plan.as_ref()) > 0, "{df_text}");

        // The swapped plan's answer: f_b in {3, 8, ..., 48} keeps every f_x with
        // f_x % 50 % 5 == 3, i.e. f_x % 5 == 3.
        let out = session.sql(SQL).unwrap();
        let want: i64 = (0..FACT_ROWS as i64).filter(|x| x % 5 == 3).sum();
        let got = out.to_polars().unwrap();
        let got = got.column("s").unwrap().i64().unwrap().get(0);
        assert_eq!(got, Some(want));
    }

    #[test]
    fn estimates_follow_foreign_keys_through_filters() {
        let fact = Estimate::relation(1_000_000.0);
        let dim = Estimate::relation(1_000.0);
        let filtered = dim.with_rows(10.0);
        // Every fact row finds its dimension row...
        assert_eq!(
            join_estimate(JoinType::Inner, &[fact, dim]).rows,
            1_000_000.0
        );
        // ...and a filtered dimension keeps its fraction of them, whichever side.
        assert_eq!(
            join_estimate(JoinType::Inner, &[filtered, fact]).rows,
            10_000.0
        );
        let semi = join_estimate(JoinType::LeftSemi, &[fact, filtered]);
        assert_eq!(semi.rows, 10_000.0);
        assert_eq!(semi.base, 1_000_000.0);
    }

    /// The hash join of `sql` whose probe side reads `fact`, from the unbudgeted
    /// session with a large dimension `dim3` (20 rows of each of 1,000 categories).
    fn fact_join(sql: &str) -> Arc<dyn ExecutionPlan> {
        let session = session();
        let n = FACT_ROWS as i64;
        let dim3 = df!(
            "d3_b" => (0..n).map(|i| i % 50).collect::<Vec<_>>(),
            "d3_cat" => (0..n).map(|i| i % 1000).collect::<Vec<_>>()
        )
        .unwrap();
        let dim3 = RemoteFrame::from_polars(session.env(), &dim3).unwrap();
        session.register("dim3", &dim3).unwrap();
        let (_, physical) = session.plan(sql).unwrap();
        let mut found = None;
        physical
            .apply(|node| {
                if let Some(join) = node.downcast_ref::<HashJoinExec>() {
                    if reads_fact(join.right().as_ref()) {
                        found = Some(node.clone());
                    }
                }
                Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
            })
            .unwrap();
        found.unwrap()
    }

    /// The mode `JoinOrder` gives `join` planned partitioned, at a collect threshold
    /// of 64 KiB.
    fn mode_of_partitioned(join: &Arc<dyn ExecutionPlan>) -> PartitionMode {
        let join = join.downcast_ref::<HashJoinExec>().unwrap();
        let partitioned = join
            .builder()
            .with_partition_mode(PartitionMode::Partitioned)
            .build_exec()
            .unwrap();
        let mut config = ConfigOptions::new();
        config.optimizer.hash_join_single_partition_threshold = 64 << 10;
        let planned = JoinOrder.optimize(partitioned, &config).unwrap();
        *planned
            .downcast_ref::<HashJoinExec>()
            .unwrap()
            .partition_mode()
    }

    #[test]
    fn a_partitioned_join_whose_build_side_of_joined_scans_is_estimated_small_is_collected() {
        // 20 build rows, estimated at 200: DataFusion knows no size past a join and
        // partitions both sides by key at SF 1 (q84, q91: 36-210 build rows against
        // 1.9 M probe rows of customer_demographics, repartitioned).
        let join = fact_join(
            "SELECT sum(f_x) FROM fact JOIN \
             (SELECT d3_b AS k, d1_a AS a FROM dim3 JOIN dim1 ON d3_cat = d1_a \
              WHERE d3_cat = 3) b ON f_b = b.k AND f_a < b.a",
        );
        assert_eq!(mode_of_partitioned(&join), PartitionMode::CollectLeft);
        // The fact table itself is no small build side (20,000 rows of 24 bytes).
        let join = fact_join(
            "SELECT sum(f.f_x) FROM fact f JOIN fact g ON f.f_x = g.f_x WHERE f.f_b = g.f_b",
        );
        assert_eq!(mode_of_partitioned(&join), PartitionMode::Partitioned);
        // An aggregate's output is a guess (a tenth of its input): never collected
        // on this rule's word.
        let aggregate = AggregateExec::try_new(
            AggregateMode::Single,
            datafusion::physical_plan::aggregates::PhysicalGroupBy::default(),
            vec![],
            vec![],
            Arc::new(datafusion::physical_plan::empty::EmptyExec::new(Arc::new(
                Schema::empty(),
            ))),
            Arc::new(Schema::empty()),
        )
        .unwrap();
        assert!(!joins_of_scans(&aggregate));
    }
}
