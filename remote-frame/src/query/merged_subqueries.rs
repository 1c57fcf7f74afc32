//! One-row aggregates of the same table, read in one scan.
//!
//! q9 asks fifteen scalar subqueries of `store_sales`, each an aggregate without
//! GROUP BY over its own range of `ss_quantity`, and q28 cross-joins six derived
//! tables of the same kind: planned as they are, the table is scanned once for each
//! (167 MB moved by q9 for an answer of one row). [`MergedSubqueries`] computes such
//! aggregates of one table (`Aggregate` without groups over a `Filter` over a
//! `TableScan`, with column-only projections between) as one aggregate over the rows
//! any of them keeps, each of their aggregates restricted to its own rows with
//! `FILTER (WHERE ...)`. Scalar subqueries (those of the plan's projections and
//! filters) become one subquery whose answers are the fields of one struct, each
//! use reading its field (DataFusion runs identical subqueries once); a tree of
//! cross joins of such derived tables becomes a projection of the one aggregate,
//! each column under its derived table's name. An aggregate over no rows gives the
//! same answer either way (`count` 0, others NULL). Spark's `MergeScalarSubqueries`
//! does the same for the same queries.
//!
//! Aggregates over the same inner joins of the same tables, differing only in their
//! filters, merge the same way (q88 counts the sales of eight half hours, each over
//! `store_sales ⋈ household_demographics ⋈ time_dim ⋈ store`: 118 MB moved, 82 ms;
//! merged 15 MB, 22 ms; q90's two day parts likewise): the joins, their filters taken
//! out and every scan reading all its columns, are compared as plans; the merged
//! aggregate reads them under the disjunction of the members' filters (which the
//! optimizer's next pass pushes down to each scan as far as it can, and prunes the
//! columns), each member's aggregates restricted to its own conjunction.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{
    Column, DFSchemaRef, NullEquality, Result as DfResult, ScalarValue, Spans, TableReference,
};
use datafusion::functions::core::expr_fn::{get_field, named_struct};
use datafusion::logical_expr::expr::AggregateFunction;
use datafusion::logical_expr::utils::{conjunction, disjunction, split_conjunction};
use datafusion::logical_expr::{
    Aggregate, Expr, Filter, JoinType, Limit, LogicalPlan, LogicalPlanBuilder, Projection,
    Subquery, TableScan, TableScanBuilder,
};
use datafusion::optimizer::{OptimizerConfig, OptimizerRule};
use datafusion::prelude::lit;

/// The rule; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct MergedSubqueries;

impl OptimizerRule for MergedSubqueries {
    fn name(&self) -> &str {
        "scad_merged_subqueries"
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        _config: &dyn OptimizerConfig,
    ) -> DfResult<Transformed<LogicalPlan>> {
        // The subqueries of this plan's level (those inside a subquery are its own
        // plan's), from the nodes whose expressions can be rewritten in place.
        let mut members: Vec<Member> = Vec::new();
        plan.apply(|node| {
            if matches!(node, LogicalPlan::Projection(_) | LogicalPlan::Filter(_)) {
                for e in node.expressions() {
                    collect(&e, &mut members)?;
                }
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        let Some(merged) = merge(members)? else {
            return merge_cross_joins(plan);
        };
        plan.transform_up(|node| match node {
            LogicalPlan::Projection(p) => {
                // Each expression keeps its name: the node's schema stays as it was.
                let mut changed = false;
                let expr = p
                    .expr
                    .iter()
                    .map(|e| {
                        let rewritten = merged.rewrite(e.clone())?;
                        changed |= rewritten.transformed;
                        if rewritten.transformed {
                            let (qualifier, name) = e.qualified_name();
                            Ok(rewritten.data.alias_qualified(qualifier, name))
                        } else {
                            Ok(rewritten.data)
                        }
                    })
                    .collect::<DfResult<Vec<_>>>()?;
                if !changed {
                    return Ok(Transformed::no(LogicalPlan::Projection(p)));
                }
                let projection = Projection::try_new(expr, p.input)?;
                Ok(Transformed::yes(LogicalPlan::Projection(projection)))
            }
            LogicalPlan::Filter(f) => {
                let predicate = merged.rewrite(f.predicate.clone())?;
                if !predicate.transformed {
                    return Ok(Transformed::no(LogicalPlan::Filter(f)));
                }
                Ok(Transformed::yes(LogicalPlan::Filter(Filter::try_new(
                    predicate.data,
                    f.input,
                )?)))
            }
            other => Ok(Transformed::no(other)),
        })?
        .transform_data(merge_cross_joins)
    }
}

/// `plan` with each tree of cross joins of one-row aggregates of one table merged
/// (see [`merged_cross_join`]).
fn merge_cross_joins(plan: LogicalPlan) -> DfResult<Transformed<LogicalPlan>> {
    plan.transform_down(|node| {
        if !matches!(node, LogicalPlan::Join(_)) {
            return Ok(Transformed::no(node));
        }
        match merged_cross_join(&node)? {
            Some(merged) => Ok(Transformed::new(merged, true, TreeNodeRecursion::Jump)),
            None => Ok(Transformed::no(node)),
        }
    })
}

/// Adds the mergeable scalar subqueries of `expr` not yet in `members`.
fn collect(expr: &Expr, members: &mut Vec<Member>) -> DfResult<()> {
    expr.apply(|e| {
        if let Expr::ScalarSubquery(sq) = e {
            if !members.iter().any(|m| &m.subquery == sq) {
                if let Some(m) = Member::of(sq) {
                    members.push(m);
                }
            }
            return Ok(TreeNodeRecursion::Jump);
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(())
}

/// Expressions with the names of the columns they make.
type Columns = Vec<(Expr, String)>;

/// A plan that aggregates one table's rows, or those of inner joins, without groups
/// (so gives one row): `[Projection] [Limit] Aggregate [column-only Projection]
/// [Filter] TableScan`, or a tree of joins in place of the `TableScan`.
struct Shape {
    scan: TableScan,
    /// For an aggregate over inner joins: the joins with every filter taken out
    /// and every scan reading all its columns (then `scan` is the first of them).
    joins: Option<LogicalPlan>,
    /// The rows it aggregates (`None`: all).
    filter: Option<Expr>,
    aggregate: Aggregate,
    /// Its columns, over the aggregate's output.
    outputs: Columns,
}

impl Shape {
    fn of(plan: &LogicalPlan) -> Option<Shape> {
        let (outputs, mut below) = match plan {
            LogicalPlan::Projection(p) => {
                let outputs = p
                    .expr
                    .iter()
                    .map(|e| (e.clone().unalias(), e.schema_name().to_string()))
                    .collect();
                (Some(outputs), p.input.as_ref())
            }
            other => (None, other),
        };
        // A limit over one row (pushed down from above) changes nothing.
        if let LogicalPlan::Limit(limit) = below {
            if !keeps_one_row(limit) {
                return None;
            }
            below = limit.input.as_ref();
        }
        let LogicalPlan::Aggregate(aggregate) = below else {
            return None;
        };
        let functions_only = aggregate
            .aggr_expr
            .iter()
            .all(|a| matches!(a.clone().unalias(), Expr::AggregateFunction(_)));
        if !aggregate.group_expr.is_empty() || !functions_only {
            return None;
        }
        let mut input = aggregate.input.as_ref();
        if let LogicalPlan::Projection(p) = input {
            if !p.expr.iter().all(|e| matches!(e, Expr::Column(_))) {
                return None;
            }
            input = p.input.as_ref();
        }
        // The rows it aggregates: the filter's conjuncts, then those pushed into
        // the scans (or the joins) that it does not repeat.
        let mut conjuncts = Vec::new();
        if let LogicalPlan::Filter(f) = input {
            add_distinct(&mut conjuncts, split_conjunction(&f.predicate));
            input = f.input.as_ref();
        }
        let (scan, joins) = match input {
            LogicalPlan::Join(_) => {
                let joins = unfiltered(input, &mut conjuncts)?;
                (first_scan(&joins)?.clone(), Some(joins))
            }
            LogicalPlan::TableScan(scan) if scan.fetch.is_none() => {
                add_distinct(&mut conjuncts, &scan.filters);
                (scan.clone(), None)
            }
            _ => return None,
        };
        let outputs = outputs.unwrap_or_else(|| {
            (0..aggregate.aggr_expr.len())
                .map(|j| {
                    let column = output_column(&aggregate.schema, j);
                    let name = column.name.clone();
                    (Expr::Column(column), name)
                })
                .collect()
        });
        Some(Shape {
            scan,
            joins,
            filter: conjunction(conjuncts),
            aggregate: aggregate.clone(),
            outputs,
        })
    }

    /// Whether `self` and `other` read the same table, or join the same tables in
    /// the same way.
    fn same_table(&self, other: &Shape) -> bool {
        match (&self.joins, &other.joins) {
            (None, None) => {
                self.scan.table_name == other.scan.table_name
                    && Arc::ptr_eq(&self.scan.source, &other.scan.source)
            }
            (Some(a), Some(b)) => a == b,
            _ => false,
        }
    }
}

/// `plan`, a tree of inner equi-joins of table scans (under filters and column-only
/// projections), with its filters taken out into `conjuncts` and every scan reading
/// all its columns: what subqueries that differ only in their filters share. `None`
/// for any other plan.
fn unfiltered(plan: &LogicalPlan, conjuncts: &mut Vec<Expr>) -> Option<LogicalPlan> {
    match plan {
        LogicalPlan::TableScan(scan) if scan.fetch.is_none() => {
            add_distinct(conjuncts, &scan.filters);
            let all = TableScanBuilder::from(scan.clone())
                .with_projection(None)
                .with_filters(vec![])
                .build()
                .ok()?;
            Some(LogicalPlan::TableScan(all))
        }
        LogicalPlan::Filter(f) => {
            add_distinct(conjuncts, split_conjunction(&f.predicate));
            unfiltered(&f.input, conjuncts)
        }
        LogicalPlan::Projection(p) if p.expr.iter().all(|e| matches!(e, Expr::Column(_))) => {
            unfiltered(&p.input, conjuncts)
        }
        LogicalPlan::Join(j)
            if j.join_type == JoinType::Inner
                && j.null_equality == NullEquality::NullEqualsNothing
                && !j.null_aware =>
        {
            let left = unfiltered(&j.left, conjuncts)?;
            let right = unfiltered(&j.right, conjuncts)?;
            if let Some(filter) = &j.filter {
                add_distinct(conjuncts, split_conjunction(filter));
            }
            let (left_keys, right_keys): (Vec<Expr>, Vec<Expr>) = j.on.iter().cloned().unzip();
            LogicalPlanBuilder::from(left)
                .join_with_expr_keys(right, JoinType::Inner, (left_keys, right_keys), None)
                .and_then(LogicalPlanBuilder::build)
                .ok()
        }
        _ => None,
    }
}

/// Adds to `conjuncts` each of `more` it does not have yet.
fn add_distinct<'a>(conjuncts: &mut Vec<Expr>, more: impl IntoIterator<Item = &'a Expr>) {
    for c in more {
        if !conjuncts.contains(c) {
            conjuncts.push(c.clone());
        }
    }
}

/// The first table scan of `plan`.
fn first_scan(plan: &LogicalPlan) -> Option<&TableScan> {
    match plan {
        LogicalPlan::TableScan(scan) => Some(scan),
        other => other.inputs().into_iter().find_map(first_scan),
    }
}

/// Whether `limit` passes on the one row below it.
fn keeps_one_row(limit: &Limit) -> bool {
    let literal = |e: &Option<Box<Expr>>, keeps: fn(i64) -> bool| match e.as_deref() {
        None => true,
        Some(Expr::Literal(ScalarValue::Int64(Some(n)), _)) => keeps(*n),
        Some(_) => false,
    };
    literal(&limit.skip, |n| n == 0) && literal(&limit.fetch, |n| n >= 1)
}

/// An uncorrelated scalar subquery of one [`Shape`] (one column).
struct Member {
    subquery: Subquery,
    shape: Shape,
}

impl Member {
    fn of(subquery: &Subquery) -> Option<Member> {
        if !subquery.outer_ref_columns.is_empty() {
            return None;
        }
        let shape = Shape::of(&subquery.subquery)?;
        (shape.outputs.len() == 1).then(|| Member {
            subquery: subquery.clone(),
            shape,
        })
    }
}

/// The column of field `i` of `schema`.
fn output_column(schema: &DFSchemaRef, i: usize) -> Column {
    let (qualifier, field) = schema.qualified_field(i);
    Column::new(qualifier.cloned(), field.name())
}

/// What the subqueries of a node's expressions are replaced by.
struct Merged {
    replacements: HashMap<Subquery, Expr>,
}

impl Merged {
    /// `expr` with each merged subquery replaced by its field of the merged one.
    fn rewrite(&self, expr: Expr) -> DfResult<Transformed<Expr>> {
        expr.transform_up(|e| match e {
            Expr::ScalarSubquery(sq) => match self.replacements.get(&sq) {
                Some(field) => Ok(Transformed::yes(field.clone())),
                None => Ok(Transformed::no(Expr::ScalarSubquery(sq))),
            },
            other => Ok(Transformed::no(other)),
        })
    }
}

/// The merges of `members` (`None`: no two aggregate one table).
fn merge(mut members: Vec<Member>) -> DfResult<Option<Merged>> {
    let mut replacements = HashMap::new();
    while let Some(first) = members.pop() {
        let (mut group, rest): (Vec<Member>, Vec<Member>) = members
            .into_iter()
            .partition(|m| m.shape.same_table(&first.shape));
        members = rest;
        if group.is_empty() {
            continue;
        }
        group.insert(0, first);
        replacements.extend(merged(&group)?);
    }
    Ok((!replacements.is_empty()).then_some(Merged { replacements }))
}

/// One subquery for `group` (two or more members over one table), and what each
/// member's subquery becomes.
fn merged(group: &[Member]) -> DfResult<Vec<(Subquery, Expr)>> {
    let shapes: Vec<&Shape> = group.iter().map(|m| &m.shape).collect();
    let (aggregate, outputs) = one_aggregate(&shapes)?;
    let mut fields = Vec::new();
    for (i, mut output) in outputs.into_iter().enumerate() {
        fields.push(lit(format!("f{i}")));
        fields.push(output.remove(0).0);
    }
    let answers = Projection::try_new(
        vec![named_struct(fields).alias("__scad_merged")],
        Arc::new(aggregate),
    )?;
    let subquery = Subquery {
        subquery: Arc::new(LogicalPlan::Projection(answers)),
        outer_ref_columns: vec![],
        spans: Spans::new(),
    };
    Ok(group
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let field = get_field(Expr::ScalarSubquery(subquery.clone()), format!("f{i}"));
            (m.subquery.clone(), field)
        })
        .collect())
}

/// One aggregate for `shapes` (over one table, or the same joins): over the rows any
/// of them keeps, each one's aggregates over its own rows; and each one's outputs
/// over it.
fn one_aggregate(shapes: &[&Shape]) -> DfResult<(LogicalPlan, Vec<Columns>)> {
    let mut input = match &shapes[0].joins {
        Some(joins) => joins.clone(),
        None => {
            // The columns any of them reads.
            let projection = shapes
                .iter()
                .map(|m| m.scan.projection.clone())
                .collect::<Option<Vec<_>>>()
                .map(|all| {
                    all.into_iter()
                        .flatten()
                        .collect::<BTreeSet<usize>>()
                        .into_iter()
                        .collect::<Vec<_>>()
                });
            let scan = TableScanBuilder::from(shapes[0].scan.clone())
                .with_projection(projection)
                .with_filters(vec![])
                .build()?;
            LogicalPlan::TableScan(scan)
        }
    };
    let filters = shapes
        .iter()
        .map(|m| m.filter.clone())
        .collect::<Option<Vec<_>>>();
    if let Some(any) = filters.and_then(disjunction) {
        input = LogicalPlan::Filter(Filter::try_new(any, Arc::new(input))?);
    }
    let mut aggregates = Vec::new();
    let mut outputs = Vec::new();
    for (i, m) in shapes.iter().enumerate() {
        let mut renamed = HashMap::new();
        for (j, a) in m.aggregate.aggr_expr.iter().enumerate() {
            let name = format!("__scad_merged_{i}_{j}");
            aggregates.push(restricted(a.clone(), m.filter.as_ref()).alias(&name));
            renamed.insert(
                output_column(&m.aggregate.schema, j),
                Expr::Column(Column::from_name(name)),
            );
        }
        let rewritten = m
            .outputs
            .iter()
            .map(|(e, name)| {
                let e = e.clone().transform_up(|e| match e {
                    Expr::Column(c) => match renamed.get(&c) {
                        Some(new) => Ok(Transformed::yes(new.clone())),
                        None => Ok(Transformed::no(Expr::Column(c))),
                    },
                    other => Ok(Transformed::no(other)),
                })?;
                Ok((e.data, name.clone()))
            })
            .collect::<DfResult<Vec<_>>>()?;
        outputs.push(rewritten);
    }
    let aggregate = Aggregate::try_new(Arc::new(input), vec![], aggregates)?;
    Ok((LogicalPlan::Aggregate(aggregate), outputs))
}

/// The one-row aggregates of one table that a tree of cross joins (q28's six
/// derived tables) combines, as one aggregate: the tree's columns (each qualified by
/// its derived table's alias) over it. `None` when the leaves are not all such.
fn merged_cross_join(plan: &LogicalPlan) -> DfResult<Option<LogicalPlan>> {
    let mut leaves = Vec::new();
    if !cross_join_leaves(plan, &mut leaves) || leaves.len() < 2 {
        return Ok(None);
    }
    let mut shapes = Vec::new();
    for (_, leaf) in &leaves {
        match Shape::of(leaf) {
            Some(shape) if shapes.first().is_none_or(|s: &Shape| s.same_table(&shape)) => {
                shapes.push(shape);
            }
            _ => return Ok(None),
        }
    }
    let refs: Vec<&Shape> = shapes.iter().collect();
    let (aggregate, outputs) = one_aggregate(&refs)?;
    let columns = leaves
        .iter()
        .zip(outputs)
        .flat_map(|((alias, _), outputs)| {
            outputs
                .into_iter()
                .map(move |(e, name)| e.alias_qualified(Some(alias.clone()), name))
        })
        .collect();
    let projection = Projection::try_new(columns, Arc::new(aggregate))?;
    Ok(Some(LogicalPlan::Projection(projection)))
}

/// Collects the leaves of a tree of cross joins (through limits that keep one
/// row) in order, each a derived table (`SubqueryAlias`) with its alias; `false`
/// when a leaf is anything else.
fn cross_join_leaves<'a>(
    plan: &'a LogicalPlan,
    leaves: &mut Vec<(TableReference, &'a LogicalPlan)>,
) -> bool {
    match plan {
        LogicalPlan::Join(j)
            if j.join_type == JoinType::Inner && j.on.is_empty() && j.filter.is_none() =>
        {
            cross_join_leaves(&j.left, leaves) && cross_join_leaves(&j.right, leaves)
        }
        LogicalPlan::Limit(limit) if keeps_one_row(limit) => {
            cross_join_leaves(&limit.input, leaves)
        }
        LogicalPlan::SubqueryAlias(a) => {
            leaves.push((a.alias.clone(), a.input.as_ref()));
            true
        }
        _ => false,
    }
}

/// Aggregate `a` (an aggregate function, see [`Member::of`]) over only the rows
/// `filter` keeps (besides its own filter).
fn restricted(a: Expr, filter: Option<&Expr>) -> Expr {
    match (a.unalias(), filter) {
        (Expr::AggregateFunction(AggregateFunction { func, mut params }), Some(filter)) => {
            params.filter = Some(Box::new(match params.filter.take() {
                Some(own) => filter.clone().and(*own),
                None => filter.clone(),
            }));
            Expr::AggregateFunction(AggregateFunction { func, params })
        }
        (a, _) => a,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use polars::prelude::{df, AnyValue};

    use crate::frame::RemoteFrame;
    use crate::query::test_env::local_env;
    use crate::query::QuerySession;

    #[test]
    fn subqueries_aggregating_one_table_read_it_once_and_answer_as_before() {
        let env = local_env(1, 64 << 20);
        let rows = 50_000i64;
        let t = df!("k" => (0..rows).map(|i| i % 100).collect::<Vec<_>>(),
                    "v" => (0..rows).collect::<Vec<_>>())
        .unwrap();
        let u = df!("w" => [5i64, 7, 9]).unwrap();
        let session = QuerySession::new(&env).unwrap();
        session
            .register("t", &RemoteFrame::from_polars(&env, &t).unwrap())
            .unwrap();
        session
            .register("u", &RemoteFrame::from_polars(&env, &u).unwrap())
            .unwrap();
        // Three subqueries of t (one over rows none of which exist), one of u, one
        // in the WHERE clause.
        let sql = "SELECT (SELECT count(*) FROM t WHERE k < 10) AS a, \
                          (SELECT avg(v) FROM t WHERE k >= 10 AND k < 20) AS b, \
                          CASE WHEN (SELECT count(*) FROM t WHERE k > 1000) > 0 \
                               THEN 1 ELSE (SELECT sum(v) FROM t WHERE k > 1000) END AS c, \
                          (SELECT max(w) FROM u) AS d \
                   FROM u WHERE w > (SELECT min(k) + 6 FROM t)";
        let plan = session.explain(sql).unwrap();
        let scans_of_t = plan
            .lines()
            .filter(|l| l.contains("RemoteScanExec") && l.contains("rows=50000"))
            .count();
        assert_eq!(scans_of_t, 1, "{plan}");
        let out = session.sql(sql).unwrap().to_polars().unwrap();
        assert_eq!(out.height(), 2, "{out}");
        let first = out.get_row(0).unwrap().0;
        let want_b = (0..rows)
            .filter(|i| (10..20).contains(&(i % 100)))
            .sum::<i64>() as f64
            / (rows / 10) as f64;
        assert_eq!(first[0], AnyValue::Int64(rows / 10));
        assert_eq!(first[1], AnyValue::Float64(want_b));
        // No row has k > 1000: count 0, so the sum over no rows, NULL.
        assert_eq!(first[2], AnyValue::Null);
        assert_eq!(first[3], AnyValue::Int64(9));
    }

    #[test]
    fn cross_joined_aggregates_of_one_table_read_it_once_and_answer_as_before() {
        let env = local_env(1, 64 << 20);
        let rows = 50_000i64;
        let t = df!("k" => (0..rows).map(|i| i % 100).collect::<Vec<_>>(),
                    "v" => (0..rows).collect::<Vec<_>>())
        .unwrap();
        let session = QuerySession::new(&env).unwrap();
        session
            .register("t", &RemoteFrame::from_polars(&env, &t).unwrap())
            .unwrap();
        let sql = "SELECT * FROM \
                   (SELECT count(*) AS n1, avg(v) AS a1 FROM t WHERE k < 10) b1, \
                   (SELECT count(DISTINCT k) AS d2, avg(k) AS m2 FROM t WHERE k BETWEEN 50 AND 59) b2, \
                   (SELECT sum(v) AS s3 FROM t WHERE k > 1000) b3 LIMIT 10";
        let plan = session.explain(sql).unwrap();
        assert_eq!(plan.matches("RemoteScanExec").count(), 1, "{plan}");
        let out = session.sql(sql).unwrap().to_polars().unwrap();
        let names: Vec<_> = out
            .get_column_names()
            .iter()
            .map(|n| n.to_string())
            .collect();
        assert_eq!(names, ["n1", "a1", "d2", "m2", "s3"]);
        assert_eq!(out.height(), 1);
        let row = out.get_row(0).unwrap().0;
        let avg = (0..rows).filter(|i| i % 100 < 10).sum::<i64>() as f64 / (rows / 10) as f64;
        assert_eq!(row[0], AnyValue::Int64(rows / 10));
        assert_eq!(row[1], AnyValue::Float64(avg));
        assert_eq!(row[2], AnyValue::Int64(10));
        assert_eq!(row[3], AnyValue::Float64(54.5));
        assert_eq!(row[4], AnyValue::Null);
    }

    #[test]
    fn cross_joined_aggregates_of_the_same_joins_read_them_once_and_answer_as_before() {
        let env = local_env(1, 64 << 20);
        // q88's shape: counts of the sales joined to their hour and their store, each
        // of its own hours.
        let rows = 40_000i64;
        let sales = df!("s_time" => (0..rows).map(|i| (i * 7) % 1_440).collect::<Vec<_>>(),
                        "s_store" => (0..rows).map(|i| i % 12).collect::<Vec<_>>())
        .unwrap();
        let time = df!("t_sk" => (0..1_440i64).collect::<Vec<_>>(),
                       "t_hour" => (0..1_440i64).map(|m| m / 60).collect::<Vec<_>>())
        .unwrap();
        let store = df!("st_sk" => (0..12i64).collect::<Vec<_>>(),
                        "st_name" => (0..12i64).map(|i| format!("s{}", i % 3)).collect::<Vec<_>>())
        .unwrap();
        let session = QuerySession::new(&env).unwrap();
        for (name, frame) in [("sales", sales), ("time", time), ("store", store)] {
            session
                .register(name, &RemoteFrame::from_polars(&env, &frame).unwrap())
                .unwrap();
        }
        let count = |hour: i64| {
            format!(
                "(SELECT count(*) AS n{hour} FROM sales, time, store WHERE s_time = t_sk \
                 AND s_store = st_sk AND t_hour = {hour} AND st_name = 's1') h{hour}"
            )
        };
        let sql = format!("SELECT * FROM {}, {}, {}", count(8), count(9), count(30));
        let plan = session.explain(&sql).unwrap();
        let scans_of_sales = plan
            .lines()
            .filter(|l| l.contains("RemoteScanExec") && l.contains("rows=40000"))
            .count();
        assert_eq!(scans_of_sales, 1, "{plan}");
        let out = session.sql(&sql).unwrap().to_polars().unwrap();
        assert_eq!(out.height(), 1);
        let row = out.get_row(0).unwrap().0;
        let want = |hour: i64| {
            (0..rows)
                .filter(|i| ((i * 7) % 1_440) / 60 == hour && (i % 12) % 3 == 1)
                .count() as i64
        };
        assert!(want(8) > 0 && want(9) > 0);
        // Hour 30 does not exist: a count of nothing.
        assert_eq!(
            row.to_vec(),
            [
                AnyValue::Int64(want(8)),
                AnyValue::Int64(want(9)),
                AnyValue::Int64(0)
            ]
        );
    }
}
