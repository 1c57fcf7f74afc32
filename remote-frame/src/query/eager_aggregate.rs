//! Aggregating before the last join of a star, when that join only looks up
//! attributes.
//!
//! q4, q11 and q74 sum each customer's sales per year, grouped by the customer's
//! id, names, country, login and e-mail: `GROUP BY c_customer_id, c_first_name, ...,
//! d_year` over `store_sales ⋈ date_dim ⋈ customer`. As written, every sale is
//! joined to its customer's eight strings before the aggregate hashes them: at
//! 25 MiB the join built on customer's 100 k wide rows and spilled both sides
//! (60 MB per year and channel). Summed first per `(ss_customer_sk, d_year)`, the
//! sales shrink to one row per customer and year, narrow, and those few rows are
//! joined to their customers and summed again by the original groups.
//!
//! [`EagerAggregation`] rewrites `Aggregate(G, A)` over `Join(X, R)` into
//! `Aggregate(G, A')` over `Join(Aggregate(G∩X ∪ keys of X, A), R)` when:
//! - `R` is a table scan without filters (the join keeps every row of `X` that has a
//!   match: it shrinks nothing the early aggregate could have skipped),
//! - the groups read a column of `R` other than its keys (what the join is for),
//! - `R` is large next to the tables under `X` (see [`LOOKUP_FANOUT`]),
//! - the groups `R` adds are about as many as its keys, by the distinct counts of
//!   its frame's sketches (see [`KEYS_PER_GROUP`]), or the groups hold the keys,
//! - every aggregate is a plain `sum`, `min`, `max`, `count` or `avg` of columns of
//!   `X` (their partial results combine: sums and counts by `sum`, minima by `min`,
//!   maxima by `max`, an average as the sum of its sums over the sum of its counts;
//!   `avg` only of integers and floats, whose average is a double), and
//! - `X` is not an aggregate already, and the aggregate is not one the rule made
//!   (it takes one step, below the last join of a chain).
//!
//! Grouping sets (ROLLUP, CUBE) are rewritten the same way, the early aggregate by
//! every column of the sets that `X` has: q22 rolls inventory's average quantity up
//! over four item strings, `ROLLUP(i_product_name, i_brand, i_class, i_category)`,
//! and hashed those strings five times for each of 2.3 M inventory rows (0.6 s of
//! its 0.46 s on two cores); averaged per item first, the roll-up sees 18 k rows.
//! Instead of the lookup's size (items are small) and its groups' fineness (the sets'
//! coarser groups are the point), what makes it worth it there is that the early
//! groups are far fewer than `X`'s rows ([`EARLY_SHRINK`]).
//!
//! The result is cast back to the original types (a sum of sums is wider) under the
//! original names, so the plan above does not change.

use std::collections::HashSet;

use arrow_schema::DataType;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{Column, Result as DfResult};
use datafusion::functions_aggregate::expr_fn::{count, sum};
use datafusion::functions_aggregate::sum::sum_udaf;
use datafusion::logical_expr::expr::AggregateFunction;
use datafusion::logical_expr::{
    Aggregate, BinaryExpr, Expr, ExprSchemable, JoinType, LogicalPlan, LogicalPlanBuilder, Operator,
};
use datafusion::optimizer::{OptimizerConfig, OptimizerRule};

use super::chain_order::{estimate, is_column_projection, is_key_join, table_statistics};

/// The names of the aggregates the rule makes.
const PARTIAL_PREFIX: &str = "__scad_eager_";

/// The rule; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct EagerAggregation;

impl OptimizerRule for EagerAggregation {
    fn name(&self) -> &str {
        "scad_eager_aggregation"
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        _config: &dyn OptimizerConfig,
    ) -> DfResult<Transformed<LogicalPlan>> {
        plan.transform_up_with_subqueries(|node| match &node {
            LogicalPlan::Aggregate(aggregate) => match eager(aggregate)? {
                Some(rewritten) => Ok(Transformed::yes(rewritten)),
                None => Ok(Transformed::no(node)),
            },
            _ => Ok(Transformed::no(node)),
        })
    }
}

/// How an aggregate's partial results combine.
#[derive(Clone, Copy)]
enum Combine {
    /// With the function itself (`sum`, `min`, `max`).
    Same,
    /// By summing (`count`).
    Sum,
    /// As the sum of the partial sums over the sum of the partial counts (`avg`).
    Average,
}

/// The columns of `plan`'s output.
fn columns(plan: &LogicalPlan) -> HashSet<Column> {
    plan.schema().columns().into_iter().collect()
}

/// A table scan without filters or a limit, under a projection of its columns or not.
/// Filters that read no column (`'c' = 'c'`, what a union's branch filter becomes
/// when pushed into a branch) keep all rows or none: they do not count.
fn is_whole_scan(plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::TableScan(scan) => {
            scan.filters.iter().all(|f| f.column_refs().is_empty()) && scan.fetch.is_none()
        }
        LogicalPlan::Filter(f) => f.predicate.column_refs().is_empty() && is_whole_scan(&f.input),
        LogicalPlan::Projection(p) if is_column_projection(plan) => is_whole_scan(&p.input),
        _ => false,
    }
}

fn is_aggregate(plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::Aggregate(_) => true,
        LogicalPlan::Projection(p) => is_aggregate(&p.input),
        _ => false,
    }
}

/// At most this many of `R`'s keys per group its columns make: groups as coarse as
/// a dimension with few members' attributes (q47 groups items by category and
/// brand: 10 and 712 of 18 k items) made the early aggregate, by item, hash more
/// groups than the late one, and q47 took 1.5x as long; an entity's own attributes
/// (q4's customer ids, 100 k of 100 k customers; q38's first and last names,
/// 3.8 k and 4.9 k) are about as many as its keys.
const KEYS_PER_GROUP: f64 = 2.0;

/// At most this many rows of the largest table under `X` per row of `R`: a join
/// with a small `R` (stores, items: 12 and 18 k rows under 2.9 M sales) costs little,
/// and the early aggregate saves little of it (q29 and q21 took 1.3x to 2.8x as long
/// summed per item first); customers (100 k rows) are worth it.
const LOOKUP_FANOUT: f64 = 64.0;

/// Whether `r` is large next to the tables under `x` (see [`LOOKUP_FANOUT`]).
fn is_large_lookup(x: &LogicalPlan, r: &LogicalPlan) -> bool {
    estimate(r).1 * LOOKUP_FANOUT >= largest_table(x)
}

/// Whether the groups `R` adds are about as many as `R`'s keys: the product of the
/// distinct counts of `r_groups` (columns taken as independent) next to the keys'
/// largest, from the frames' sketches (true when a frame has none).
fn groups_as_fine_as_keys(r: &LogicalPlan, r_groups: &[&Column], r_keys: &[Column]) -> bool {
    let groups = r_groups
        .iter()
        .map(|c| distinct_count(r, c))
        .try_fold(1.0, |product: f64, d| Some(product * d?));
    let keys = r_keys
        .iter()
        .map(|c| distinct_count(r, c))
        .try_fold(0.0, |most: f64, d| Some(most.max(d?)));
    match (groups, keys) {
        (Some(groups), Some(keys)) => groups * KEYS_PER_GROUP >= keys,
        _ => true,
    }
}

/// The distinct values of `column` in the table scanned under `plan` (through
/// projections of plain columns and filters), from its frame's sketches.
fn distinct_count(plan: &LogicalPlan, column: &Column) -> Option<f64> {
    match plan {
        LogicalPlan::TableScan(scan) => {
            let index = scan.source.schema().index_of(&column.name).ok()?;
            let stats = table_statistics(scan)?;
            let distinct = stats.column_statistics.get(index)?.distinct_count;
            distinct.get_value().map(|&d| d as f64)
        }
        LogicalPlan::Projection(p) if is_column_projection(plan) => {
            distinct_count(&p.input, column)
        }
        LogicalPlan::Filter(f) => distinct_count(&f.input, column),
        _ => None,
    }
}

/// At least this many rows of the largest table under `X` per early group for an
/// aggregate by grouping sets to be rewritten (its lookup need not be large): the
/// early aggregate must shrink what the sets expand.
const EARLY_SHRINK: f64 = 8.0;

/// The distinct values of `column` in the table it comes from under `plan` (through
/// joins, filters and projections of plain columns), from its frame's sketches.
fn distinct_count_below(plan: &LogicalPlan, column: &Column) -> Option<f64> {
    match plan {
        LogicalPlan::TableScan(scan) => {
            if column
                .relation
                .as_ref()
                .is_some_and(|r| r != &scan.table_name)
            {
                return None;
            }
            distinct_count(plan, column)
        }
        LogicalPlan::Projection(p) if is_column_projection(plan) => {
            distinct_count_below(&p.input, column)
        }
        LogicalPlan::Filter(f) => distinct_count_below(&f.input, column),
        LogicalPlan::Join(j) => {
            distinct_count_below(&j.left, column).or_else(|| distinct_count_below(&j.right, column))
        }
        _ => None,
    }
}

/// Whether an aggregate of `x` by `groups` (columns of `x`) has far fewer groups than
/// the largest table under `x` has rows (see [`EARLY_SHRINK`]): the product of the
/// groups' distinct counts (columns taken as independent, an upper bound) next to
/// those rows. False when a count is unknown.
fn early_aggregate_shrinks(x: &LogicalPlan, groups: &[Expr]) -> bool {
    let mut counts = groups.iter().map(|g| match g {
        Expr::Column(c) => distinct_count_below(x, c),
        _ => None,
    });
    let Some(early_groups) = counts.try_fold(1.0, |product: f64, d| Some(product * d?)) else {
        return false;
    };
    early_groups * EARLY_SHRINK <= largest_table(x)
}

/// The rows of the largest table scanned under `plan` (before filters).
fn largest_table(plan: &LogicalPlan) -> f64 {
    match plan {
        LogicalPlan::TableScan(_) => estimate(plan).1,
        other => other
            .inputs()
            .into_iter()
            .map(largest_table)
            .fold(0.0, f64::max),
    }
}

/// The columns `aggregate` groups by: its group expressions, or the distinct ones of
/// its grouping set; `None` if one is not a plain column.
fn group_columns(aggregate: &Aggregate) -> Option<Vec<Column>> {
    let exprs: Vec<&Expr> = match aggregate.group_expr.as_slice() {
        [Expr::GroupingSet(set)] => set.distinct_expr(),
        plain => plain.iter().collect(),
    };
    exprs.into_iter().map(|e| e.try_as_col().cloned()).collect()
}

/// Whether `avg` of a `dtype` is a double that the sum of its sums over the sum of
/// its counts gives (integers and floats; a decimal's average is a decimal).
fn averages_as_double(dtype: &DataType) -> bool {
    dtype.is_integer() || dtype.is_floating()
}

fn unaliased(expr: &Expr) -> &Expr {
    match expr {
        Expr::Alias(a) => unaliased(&a.expr),
        other => other,
    }
}

/// `aggregate` computed early below its join (see the module docs), or `None`.
fn eager(aggregate: &Aggregate) -> DfResult<Option<LogicalPlan>> {
    // One step only: an aggregate this rule made (early or late) stays where it is,
    // or each unfiltered dimension below would add an aggregate by the fact's keys,
    // which shrinks little.
    let made_here = aggregate
        .aggr_expr
        .iter()
        .any(|e| matches!(e, Expr::Alias(a) if a.name.starts_with(PARTIAL_PREFIX)));
    if made_here {
        return Ok(None);
    }
    // The optimizer prunes the join's columns with projections in between.
    let mut input = aggregate.input.as_ref();
    while let LogicalPlan::Projection(p) = input {
        if !is_column_projection(input) {
            return Ok(None);
        }
        input = p.input.as_ref();
    }
    let LogicalPlan::Join(join) = input else {
        return Ok(None);
    };
    if !is_key_join(join, JoinType::Inner) || join.filter.is_some() {
        return Ok(None);
    }
    let grouping_sets = matches!(aggregate.group_expr.as_slice(), [Expr::GroupingSet(_)]);
    let Some(groups) = group_columns(aggregate) else {
        return Ok(None);
    };
    let Some((left_keys, right_keys)) = join
        .on
        .iter()
        .map(|(l, r)| Some((l.try_as_col()?.clone(), r.try_as_col()?.clone())))
        .collect::<Option<(Vec<Column>, Vec<Column>)>>()
    else {
        return Ok(None);
    };
    // The looked-up side: the right one if it qualifies, else the left.
    let (x, r, x_keys, r_keys) = if is_whole_scan(&join.right) {
        (
            join.left.as_ref(),
            join.right.as_ref(),
            left_keys,
            right_keys,
        )
    } else if is_whole_scan(&join.left) {
        (
            join.right.as_ref(),
            join.left.as_ref(),
            right_keys,
            left_keys,
        )
    } else {
        return Ok(None);
    };
    if is_aggregate(x) || (!grouping_sets && !is_large_lookup(x, r)) {
        return Ok(None);
    }
    let (x_columns, r_columns) = (columns(x), columns(r));
    let looked_up: Vec<&Column> = groups
        .iter()
        .filter(|g| r_columns.contains(g) && !r_keys.contains(g))
        .collect();
    // Grouped by the join's keys already, the early aggregate makes no more groups
    // than the late one, however coarse the rest.
    let keys_grouped = [&x_keys, &r_keys]
        .iter()
        .any(|keys| keys.iter().all(|k| groups.contains(k)));
    // Grouping sets hash each row once per set: an early aggregate that shrinks the
    // rows (checked below) saves that however coarse the groups.
    if looked_up.is_empty()
        || !(grouping_sets || keys_grouped || groups_as_fine_as_keys(r, &looked_up, &r_keys))
    {
        return Ok(None);
    }
    // Every aggregate: a plain decomposable function of X's columns.
    let mut parts = Vec::new();
    for expr in &aggregate.aggr_expr {
        let expr = unaliased(expr);
        let Expr::AggregateFunction(AggregateFunction { func, params }) = expr else {
            return Ok(None);
        };
        let combine = match func.name() {
            "sum" | "min" | "max" => Combine::Same,
            "count" => Combine::Sum,
            "avg" => match params.args.as_slice() {
                [arg] if averages_as_double(&arg.get_type(x.schema())?) => Combine::Average,
                _ => return Ok(None),
            },
            _ => return Ok(None),
        };
        if params.distinct
            || params.filter.is_some()
            || !params.order_by.is_empty()
            || params.null_treatment.is_some()
            || !expr.column_refs().iter().all(|c| x_columns.contains(c))
        {
            return Ok(None);
        }
        parts.push((func.clone(), combine));
    }
    // The early aggregate: by X's groups and X's join keys.
    let mut early_groups: Vec<Expr> = Vec::new();
    for c in groups
        .iter()
        .filter(|g| x_columns.contains(g))
        .chain(&x_keys)
    {
        let e = Expr::Column(c.clone());
        if !early_groups.contains(&e) {
            early_groups.push(e);
        }
    }
    if grouping_sets && !early_aggregate_shrinks(x, &early_groups) {
        return Ok(None);
    }
    let partial_name = |i: usize| format!("{PARTIAL_PREFIX}{i}");
    let count_name = |i: usize| format!("{PARTIAL_PREFIX}{i}_count");
    let partial = |i: usize| Expr::Column(Column::from_name(partial_name(i)));
    let partial_count = |i: usize| Expr::Column(Column::from_name(count_name(i)));
    let mut early_aggregates: Vec<Expr> = Vec::new();
    let mut late_aggregates: Vec<Expr> = Vec::new();
    for (i, (e, (func, combine))) in aggregate.aggr_expr.iter().zip(&parts).enumerate() {
        let e = unaliased(e);
        match combine {
            Combine::Same | Combine::Sum => {
                early_aggregates.push(e.clone().alias(partial_name(i)));
                let func = match combine {
                    Combine::Same => func.clone(),
                    _ => sum_udaf(),
                };
                let late =
                    AggregateFunction::new_udf(func, vec![partial(i)], false, None, vec![], None);
                late_aggregates.push(Expr::AggregateFunction(late).alias(partial_name(i)));
            }
            Combine::Average => {
                let Expr::AggregateFunction(AggregateFunction { params, .. }) = e else {
                    return Ok(None);
                };
                let arg = params.args[0].clone();
                early_aggregates.push(sum(arg.clone()).alias(partial_name(i)));
                early_aggregates.push(count(arg).alias(count_name(i)));
                late_aggregates.push(sum(partial(i)).alias(partial_name(i)));
                late_aggregates.push(sum(partial_count(i)).alias(count_name(i)));
            }
        }
    }
    let late = LogicalPlanBuilder::from(x.clone())
        .aggregate(early_groups, early_aggregates)?
        .join_with_expr_keys(
            r.clone(),
            JoinType::Inner,
            (
                x_keys.iter().cloned().map(Expr::Column).collect::<Vec<_>>(),
                r_keys.iter().cloned().map(Expr::Column).collect::<Vec<_>>(),
            ),
            None,
        )?
        .aggregate(aggregate.group_expr.clone(), late_aggregates)?
        .build()?;
    // The original output: the groups (and a grouping set's id), then each aggregate
    // as its type and name.
    let original = aggregate.schema.as_ref();
    let group_fields = original.fields().len() - aggregate.aggr_expr.len();
    let mut output: Vec<Expr> = (0..group_fields)
        .map(|j| Expr::Column(Column::from(late.schema().qualified_field(j))))
        .collect();
    for (i, (_, combine)) in parts.iter().enumerate() {
        let field = original.field(group_fields + i);
        let value = match combine {
            Combine::Average => Expr::BinaryExpr(BinaryExpr::new(
                Box::new(partial(i).cast_to(&DataType::Float64, late.schema())?),
                Operator::Divide,
                Box::new(partial_count(i).cast_to(&DataType::Float64, late.schema())?),
            )),
            _ => partial(i),
        };
        let value = if value.get_type(late.schema())? == *field.data_type() {
            value
        } else {
            value.cast_to(field.data_type(), late.schema())?
        };
        output.push(value.alias(field.name()));
    }
    Ok(Some(
        LogicalPlanBuilder::from(late).project(output)?.build()?,
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use crate::frame::RemoteFrame;
    use crate::query::test_env::local_env;
    use crate::query::QuerySession;
    use polars::prelude::df;

    /// Aggregates in `plan` (EXPLAIN text) that produce results: final (and
    /// final-partitioned) or single-phase ones.
    fn final_aggregates(plan: &str) -> usize {
        plan.matches("AggregateExec: mode=Final").count()
            + plan.matches("AggregateExec: mode=Single").count()
    }

    #[test]
    fn sales_are_summed_per_customer_before_their_names_are_joined() {
        let env = local_env(1, 64 << 20);
        let session = QuerySession::new(&env).unwrap();
        // q4's shape: sales by customer and year, grouped by the customer's strings.
        let sales = df!(
            "s_cust" => (0..20_000i64).map(|i| i % 400).collect::<Vec<_>>(),
            "s_store" => (0..20_000i64).map(|i| i % 5).collect::<Vec<_>>(),
            "s_day" => (0..20_000i64).map(|i| i % 730).collect::<Vec<_>>(),
            "s_amt" => (0..20_000i64).map(|i| i % 97).collect::<Vec<_>>(),
            "s_price" => (0..20_000i64).map(|i| (i % 13) as f64 * 0.5).collect::<Vec<_>>()
        )
        .unwrap();
        let day = df!(
            "d_day" => (0..730i64).collect::<Vec<_>>(),
            "d_year" => (0..730i64).map(|i| 2000 + i / 365).collect::<Vec<_>>()
        )
        .unwrap();
        // Some customers share a name: the groups are by name (300 of 400, about as
        // many as the customers), and each has a tier (4: coarse).
        let customer = df!(
            "c_sk" => (0..400i64).collect::<Vec<_>>(),
            "c_name" => (0..400i64).map(|i| format!("name{}", i % 300)).collect::<Vec<_>>(),
            "c_tier" => (0..400i64).map(|i| i % 4).collect::<Vec<_>>()
        )
        .unwrap();
        let store = df!(
            "st_sk" => (0..5i64).collect::<Vec<_>>(),
            "st_city" => ["a", "b", "a", "b", "c"]
        )
        .unwrap();
        for (name, frame) in [
            ("sales", sales),
            ("day", day),
            ("customer", customer),
            ("store", store),
        ] {
            session
                .register(name, &RemoteFrame::from_polars(&env, &frame).unwrap())
                .unwrap();
        }
        let sql = "SELECT c_name, d_year, sum(s_amt) AS total, count(*) AS n, \
                   min(s_price) AS lo, max(s_amt) AS hi, count(s_price) AS priced \
                   FROM sales, day, customer \
                   WHERE s_day = d_day AND s_cust = c_sk AND d_year < 2002 \
                   GROUP BY c_name, d_year ORDER BY c_name, d_year";
        let plan = session.explain(sql).unwrap();
        // An aggregate below the join with customer: two final ones in the plan.
        assert_eq!(final_aggregates(&plan), 2, "{plan}");
        let got = session.sql(sql).unwrap().to_polars().unwrap();
        // By hand, over (name, year).
        let mut want = std::collections::BTreeMap::new();
        for i in 0..20_000i64 {
            if (i % 730) / 365 >= 2 {
                continue;
            }
            let key = (format!("name{}", (i % 400) % 300), 2000 + (i % 730) / 365);
            let e = want.entry(key).or_insert((0i64, 0i64, f64::MAX, 0i64));
            e.0 += i % 97;
            e.1 += 1;
            e.2 = e.2.min((i % 13) as f64 * 0.5);
            e.3 = e.3.max(i % 97);
        }
        assert_eq!(got.height(), want.len());
        let total = got.column("total").unwrap().i64().unwrap();
        let n = got.column("n").unwrap().i64().unwrap();
        let lo = got.column("lo").unwrap().f64().unwrap();
        let hi = got.column("hi").unwrap().i64().unwrap();
        let priced = got.column("priced").unwrap().i64().unwrap();
        for (row, (_, (t, c, l, h))) in want.iter().enumerate() {
            assert_eq!(total.get(row), Some(*t));
            assert_eq!(n.get(row), Some(*c));
            assert_eq!(lo.get(row), Some(*l));
            assert_eq!(hi.get(row), Some(*h));
            assert_eq!(priced.get(row), Some(*c));
        }
        // Types as before the rewrite.
        assert_eq!(
            got.column("total").unwrap().dtype(),
            &polars::prelude::DataType::Int64
        );
        // A filtered dimension is not a lookup (its join shrinks the sales first),
        // nor is a small one (its join costs little), nor are a large one's groups
        // that its sketches show to be coarser than its keys (4 tiers of 400
        // customers: summed per customer first, the sales made more groups, not
        // fewer).
        for once in [
            "SELECT c_name, sum(s_amt) AS total FROM sales, customer \
             WHERE s_cust = c_sk AND c_name = 'name7' GROUP BY c_name",
            "SELECT st_city, sum(s_amt) AS total FROM sales, store \
             WHERE s_store = st_sk GROUP BY st_city",
            "SELECT c_tier, sum(s_amt) AS total FROM sales, customer \
             WHERE s_cust = c_sk GROUP BY c_tier",
        ] {
            let plan = session.explain(once).unwrap();
            assert_eq!(final_aggregates(&plan), 1, "{plan}");
        }
        // Grouped by the customer key as well, coarse tiers make no more groups.
        let by_key = "SELECT c_tier, s_cust, sum(s_amt) AS total FROM sales, customer \
                      WHERE s_cust = c_sk GROUP BY c_tier, s_cust";
        let plan = session.explain(by_key).unwrap();
        assert_eq!(final_aggregates(&plan), 2, "{plan}");
        let tiers = session.sql(by_key).unwrap().to_polars().unwrap();
        assert_eq!(tiers.height(), 400);
        let total = tiers.column("total").unwrap().i64().unwrap();
        assert_eq!(
            (0..total.len()).filter_map(|i| total.get(i)).sum::<i64>(),
            (0..20_000i64).map(|i| i % 97).sum::<i64>()
        );
    }

    #[test]
    fn a_rollup_over_a_small_lookup_is_averaged_per_key_before_the_join() {
        let env = local_env(1, 64 << 20);
        let session = QuerySession::new(&env).unwrap();
        // q22's shape: inventory by item and day, a filtered range of days, items'
        // strings rolled up; some quantities unknown.
        let quantity = |i: i64| (i % 11 != 0).then_some(i % 37);
        let inventory = df!(
            "inv_item" => (0..40_000i64).map(|i| i % 200).collect::<Vec<_>>(),
            "inv_day" => (0..40_000i64).map(|i| i % 100).collect::<Vec<_>>(),
            "inv_qty" => (0..40_000i64).map(quantity).collect::<Vec<_>>()
        )
        .unwrap();
        let day = df!(
            "d_day" => (0..100i64).collect::<Vec<_>>(),
            "d_month" => (0..100i64).map(|d| d / 10).collect::<Vec<_>>()
        )
        .unwrap();
        let item = df!(
            "i_sk" => (0..200i64).collect::<Vec<_>>(),
            "i_brand" => (0..200i64).map(|i| format!("b{}", i % 20)).collect::<Vec<_>>(),
            "i_cat" => (0..200i64).map(|i| format!("c{}", i % 4)).collect::<Vec<_>>()
        )
        .unwrap();
        for (name, frame) in [("inv", inventory), ("day", day), ("item", item)] {
            session
                .register(name, &RemoteFrame::from_polars(&env, &frame).unwrap())
                .unwrap();
        }
        let sql = "SELECT i_cat, i_brand, avg(inv_qty) AS qoh, count(*) AS n, \
                   max(inv_qty) AS hi \
                   FROM inv, day, item \
                   WHERE inv_day = d_day AND inv_item = i_sk AND d_month BETWEEN 2 AND 6 \
                   GROUP BY ROLLUP(i_cat, i_brand) \
                   ORDER BY i_cat NULLS FIRST, i_brand NULLS FIRST";
        let plan = session.explain(sql).unwrap();
        assert_eq!(final_aggregates(&plan), 2, "{plan}");
        let got = session.sql(sql).unwrap().to_polars().unwrap();
        // By hand: (sum, count) of the known quantities, rows, largest quantity, for
        // (category, brand), (category) and all.
        type Sums = (i64, i64, i64, Option<i64>);
        let mut want: std::collections::BTreeMap<(Option<String>, Option<String>), Sums> =
            std::collections::BTreeMap::new();
        for i in (0..40_000i64).filter(|i| (2..=6).contains(&((i % 100) / 10))) {
            let (cat, brand) = (
                format!("c{}", (i % 200) % 4),
                format!("b{}", (i % 200) % 20),
            );
            for key in [
                (Some(cat.clone()), Some(brand)),
                (Some(cat), None),
                (None, None),
            ] {
                let e = want.entry(key).or_insert((0, 0, 0, None));
                if let Some(q) = quantity(i) {
                    e.0 += q;
                    e.1 += 1;
                    e.3 = Some(e.3.map_or(q, |h: i64| h.max(q)));
                }
                e.2 += 1;
            }
        }
        assert_eq!(got.height(), want.len());
        let cat = got.column("i_cat").unwrap().str().unwrap();
        let brand = got.column("i_brand").unwrap().str().unwrap();
        let qoh = got.column("qoh").unwrap().f64().unwrap();
        let n = got.column("n").unwrap().i64().unwrap();
        let hi = got.column("hi").unwrap().i64().unwrap();
        for (row, ((c, b), (sum, known, rows, most))) in want.iter().enumerate() {
            assert_eq!(cat.get(row), c.as_deref(), "row {row}");
            assert_eq!(brand.get(row), b.as_deref(), "row {row}");
            let average = *sum as f64 / *known as f64;
            let got = qoh.get(row).unwrap();
            assert!(
                (got - average).abs() <= 1e-9 * average,
                "row {row}: {got} vs {average}"
            );
            assert_eq!(n.get(row), Some(*rows));
            assert_eq!(hi.get(row), *most);
        }
        // Types as before the rewrite.
        assert_eq!(
            got.column("qoh").unwrap().dtype(),
            &polars::prelude::DataType::Float64
        );
        // Early groups as many as the rows under them (by item and day: 20 k of
        // 40 k) shrink nothing: the roll-up stays above the join.
        let by_day = "SELECT i_cat, inv_day, avg(inv_qty) AS qoh FROM inv, item \
                      WHERE inv_item = i_sk GROUP BY ROLLUP(i_cat, inv_day)";
        let plan = session.explain(by_day).unwrap();
        assert_eq!(final_aggregates(&plan), 1, "{plan}");
    }
}
