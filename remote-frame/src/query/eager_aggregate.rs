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
//! - every aggregate is a plain `sum`, `min`, `max` or `count` of columns of `X`
//!   (their partial results combine: sums and counts by `sum`, minima by `min`,
//!   maxima by `max`), and
//! - `X` is not an aggregate already, and the aggregate is not one the rule made
//!   (it takes one step, below the last join of a chain).
//!
//! The result is cast back to the original types (a sum of sums is wider) under the
//! original names, so the plan above does not change.

use std::collections::HashSet;

use datafusion::common::tree_node::Transformed;
use datafusion::common::{Column, Result as DfResult};
use datafusion::functions_aggregate::sum::sum_udaf;
use datafusion::logical_expr::expr::AggregateFunction;
use datafusion::logical_expr::{
    Aggregate, Expr, ExprSchemable, JoinType, LogicalPlan, LogicalPlanBuilder,
};
use datafusion::optimizer::{OptimizerConfig, OptimizerRule};

use super::chain_order::{estimate, is_column_projection, is_key_join};

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

/// At most this many rows of the largest table under `X` per row of `R`: a smaller
/// `R` is a dimension with few members (stores, items: 12 and 18 k rows under
/// 2.9 M sales), whose attributes the groups read are coarser than its key (q47
/// groups by brand: summed per item first, the sales made more groups, not fewer,
/// and q47 took 1.5x as long).
const LOOKUP_FANOUT: f64 = 64.0;

/// Whether `r` is large next to the tables under `x`: an entity with attributes of
/// its own (customers: 100 k rows under 2.9 M sales), whose groups are about as
/// many as its keys. Without distinct counts, the sizes stand in for them.
fn is_large_lookup(x: &LogicalPlan, r: &LogicalPlan) -> bool {
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
    estimate(r).1 * LOOKUP_FANOUT >= largest_table(x)
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
    let Some(groups) = aggregate
        .group_expr
        .iter()
        .map(|e| e.try_as_col().cloned())
        .collect::<Option<Vec<Column>>>()
    else {
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
    if is_aggregate(x) || !is_large_lookup(x, r) {
        return Ok(None);
    }
    let (x_columns, r_columns) = (columns(x), columns(r));
    let looks_up = groups
        .iter()
        .any(|g| r_columns.contains(g) && !r_keys.contains(g));
    if !looks_up {
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
    let partial_name = |i: usize| format!("{PARTIAL_PREFIX}{i}");
    let early_aggregates: Vec<Expr> = aggregate
        .aggr_expr
        .iter()
        .enumerate()
        .map(|(i, e)| unaliased(e).clone().alias(partial_name(i)))
        .collect();
    let late_aggregates: Vec<Expr> = parts
        .iter()
        .enumerate()
        .map(|(i, (func, combine))| {
            let func = match combine {
                Combine::Same => func.clone(),
                Combine::Sum => sum_udaf(),
            };
            Expr::AggregateFunction(AggregateFunction::new_udf(
                func,
                vec![Expr::Column(Column::from_name(partial_name(i)))],
                false,
                None,
                vec![],
                None,
            ))
            .alias(partial_name(i))
        })
        .collect();
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
        .aggregate(
            groups.iter().cloned().map(Expr::Column).collect::<Vec<_>>(),
            late_aggregates,
        )?
        .build()?;
    // The original output: the groups, then each aggregate as its type and name.
    let original = aggregate.schema.as_ref();
    let mut output: Vec<Expr> = groups.iter().cloned().map(Expr::Column).collect();
    for i in 0..aggregate.aggr_expr.len() {
        let field = original.field(groups.len() + i);
        let value = Expr::Column(Column::from_name(partial_name(i)));
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
        // Two customers share a name: the groups are by name.
        let customer = df!(
            "c_sk" => (0..400i64).collect::<Vec<_>>(),
            "c_name" => (0..400i64).map(|i| format!("name{}", i % 200)).collect::<Vec<_>>()
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
            let key = (format!("name{}", (i % 400) % 200), 2000 + (i % 730) / 365);
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
        // nor is a small one (its attributes are coarser than its keys).
        for once in [
            "SELECT c_name, sum(s_amt) AS total FROM sales, customer \
             WHERE s_cust = c_sk AND c_name = 'name7' GROUP BY c_name",
            "SELECT st_city, sum(s_amt) AS total FROM sales, store \
             WHERE s_store = st_sk GROUP BY st_city",
        ] {
            let plan = session.explain(once).unwrap();
            assert_eq!(final_aggregates(&plan), 1, "{plan}");
        }
    }
}
