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
//! `Aggregate(G, A')` over `Join(Aggregate(G∩X ∪ keys of X, A), R)` when (one large
//! lookup; few groups, below):
//! - `R` is a table scan without filters (the join keeps every row of `X` that has a
//!   match: it shrinks nothing the early aggregate could have skipped) with fewer
//!   rows than the largest table under `X` (q38, q87 and q97 take the distinct
//!   customers (and items) of sales joined to a range of dates: the sales are not a
//!   lookup of the dates, and taking them for one added an aggregate of the dates),
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
//! Lookups of any size are all taken at once when the early groups are few: q99 and
//! q62 group catalog and web sales by a warehouse's, a ship mode's and a call
//! centre's (or web site's) strings; q70 rolls store sales up by their store's state
//! and county, of the states a subquery picks (a semi join on the store's state). The
//! rule takes the lookups off the top of the aggregate's input (inner joins with a
//! whole scan smaller than the largest table below, through projections of plain
//! columns and semi joins), aggregates what is below them by the keys it looks them
//! up with (600, 3 000 and 7 groups, see [`FEW_EARLY_GROUPS`]), joins the lookups
//! back (each semi join now filters the relation whose column it reads: a lookup's,
//! or the early aggregate's input) and aggregates again by the original groups.
//! Projections right above the joins are folded into the aggregate's expressions
//! first (the common subexpressions DataFusion takes out of the sums). That needs
//! enough rows to reach the lookups for the early aggregate to pay for itself
//! ([`EAGER_ROWS`]).
//!
//! The result is cast back to the original types (a sum of sums is wider) under the
//! original names, so the plan above does not change.

use std::collections::{HashMap, HashSet};

use arrow_schema::DataType;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{Column, Result as DfResult};
use datafusion::functions_aggregate::expr_fn::{count, sum};
use datafusion::functions_aggregate::sum::sum_udaf;
use datafusion::logical_expr::expr::AggregateFunction;
use datafusion::logical_expr::{
    Aggregate, BinaryExpr, Expr, ExprSchemable, JoinType, LogicalPlan, LogicalPlanBuilder, Operator,
};
use datafusion::optimizer::push_down_filter::replace_cols_by_name;
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

/// A table scan without filters or a limit, under projections (q99's warehouse under
/// `SELECT substr(w_warehouse_name, 1, 20) w_substr, *`) and aliases or not.
/// Filters that read no column (`'c' = 'c'`, what a union's branch filter becomes
/// when pushed into a branch) keep all rows or none: they do not count.
fn is_whole_scan(plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::TableScan(scan) => {
            scan.filters.iter().all(|f| f.column_refs().is_empty()) && scan.fetch.is_none()
        }
        LogicalPlan::Filter(f) => f.predicate.column_refs().is_empty() && is_whole_scan(&f.input),
        LogicalPlan::Projection(p) => {
            !p.expr.iter().any(Expr::is_volatile) && is_whole_scan(&p.input)
        }
        LogicalPlan::SubqueryAlias(a) => is_whole_scan(&a.input),
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
    early_group_count(x, groups).is_some_and(|count| count * EARLY_SHRINK <= largest_table(x))
}

/// The groups of an aggregate of `x` by `groups` (columns of `x`): the product of
/// their distinct counts (columns taken as independent, an upper bound); `None` when
/// a count is unknown.
fn early_group_count(x: &LogicalPlan, groups: &[Expr]) -> Option<f64> {
    groups.iter().try_fold(1.0, |product: f64, g| match g {
        Expr::Column(c) => Some(product * distinct_count_below(x, c)?),
        _ => None,
    })
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

/// The columns `group_expr` groups by: its expressions, or the distinct ones of its
/// grouping set; `None` if one is not a plain column.
fn group_columns(group_expr: &[Expr]) -> Option<Vec<Column>> {
    let exprs: Vec<&Expr> = match group_expr {
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

/// An aggregate's expressions over the plan below the projections above its join.
struct Unprojected<'a> {
    group_expr: Vec<Expr>,
    aggr_expr: Vec<Expr>,
    input: &'a LogicalPlan,
}

/// `aggregate`'s group and aggregate expressions over the plan below the projections
/// right above it, each projected column replaced by what it computes (q99's
/// `cs_ship_date_sk - cs_sold_date_sk`, a common subexpression of its sums), with
/// that plan; `None` if that plan is not a join (nothing to look through: checked
/// before any expression is copied) or a projection computes something volatile.
fn through_projections(aggregate: &Aggregate) -> DfResult<Option<Unprojected<'_>>> {
    let mut projections = Vec::new();
    let mut input = aggregate.input.as_ref();
    while let LogicalPlan::Projection(p) = input {
        if p.expr.iter().any(Expr::is_volatile) {
            return Ok(None);
        }
        projections.push(p);
        input = p.input.as_ref();
    }
    if !matches!(input, LogicalPlan::Join(_)) {
        return Ok(None);
    }
    let mut group_expr = aggregate.group_expr.clone();
    let mut aggr_expr = aggregate.aggr_expr.clone();
    for p in projections {
        let computed: HashMap<String, &Expr> = p
            .schema
            .columns()
            .iter()
            .zip(&p.expr)
            .map(|(c, e)| (c.flat_name(), unaliased(e)))
            .collect();
        let replace = |e: Expr| replace_cols_by_name(e, &computed).map(|e| e.unalias_nested().data);
        group_expr = group_expr
            .into_iter()
            .map(replace)
            .collect::<DfResult<_>>()?;
        aggr_expr = aggr_expr
            .into_iter()
            .map(|e| match e {
                // The aggregate's own name stays.
                Expr::Alias(a) => Ok(replace(*a.expr)?.alias(a.name)),
                e => replace(e),
            })
            .collect::<DfResult<_>>()?;
    }
    Ok(Some(Unprojected {
        group_expr,
        aggr_expr,
        input,
    }))
}

/// A join that only looks up attributes of the rows of `x`: by `x_keys`, in `r`, a
/// table scan without filters that is smaller than the largest table under `x`.
#[derive(Clone)]
struct Lookup<'a> {
    x: &'a LogicalPlan,
    x_keys: Vec<Column>,
    r: &'a LogicalPlan,
    r_keys: Vec<Column>,
}

/// A semi join among the lookups: it keeps the rows whose `keys` are among
/// `right_keys` of `right` (q70's `s_state IN (the top five states)`).
#[derive(Clone)]
struct Semi<'a> {
    /// How many lookups are above it.
    under: usize,
    keys: Vec<Column>,
    right: &'a LogicalPlan,
    right_keys: Vec<Expr>,
}

/// An aggregate's input taken apart from the top: its lookups (the first on top),
/// the semi joins among them, and the plan below the last lookup.
struct Lookups<'a> {
    lookups: Vec<Lookup<'a>>,
    semis: Vec<Semi<'a>>,
    below: &'a LogicalPlan,
}

/// `plan`'s lookups, from the top through projections of plain columns, inner joins
/// with a lookup and semi joins, down to the first join that is neither.
fn lookups(plan: &LogicalPlan) -> Lookups<'_> {
    let mut found = Lookups {
        lookups: Vec::new(),
        semis: Vec::new(),
        below: plan,
    };
    loop {
        let node = found.below;
        match node {
            LogicalPlan::Projection(p) if is_column_projection(node) => found.below = &p.input,
            LogicalPlan::Join(j) if j.filter.is_none() && is_key_join(j, JoinType::LeftSemi) => {
                let Some(keys) = j.on.iter().map(|(l, _)| l.try_as_col().cloned()).collect() else {
                    break;
                };
                found.semis.push(Semi {
                    under: found.lookups.len(),
                    keys,
                    right: &j.right,
                    right_keys: j.on.iter().map(|(_, r)| r.clone()).collect(),
                });
                found.below = &j.left;
            }
            LogicalPlan::Join(j) if j.filter.is_none() && is_key_join(j, JoinType::Inner) => {
                let Some((left_keys, right_keys)) =
                    j.on.iter()
                        .map(|(l, r)| Some((l.try_as_col()?.clone(), r.try_as_col()?.clone())))
                        .collect::<Option<(Vec<Column>, Vec<Column>)>>()
                else {
                    break;
                };
                let is_lookup = |r: &LogicalPlan, x: &LogicalPlan| {
                    is_whole_scan(r) && estimate(r).1 < largest_table(x)
                };
                let lookup = if is_lookup(&j.right, &j.left) {
                    Lookup {
                        x: &j.left,
                        x_keys: left_keys,
                        r: &j.right,
                        r_keys: right_keys,
                    }
                } else if is_lookup(&j.left, &j.right) {
                    Lookup {
                        x: &j.right,
                        x_keys: right_keys,
                        r: &j.left,
                        r_keys: left_keys,
                    }
                } else {
                    break;
                };
                found.below = lookup.x;
                found.lookups.push(lookup);
            }
            _ => break,
        }
    }
    found
}

/// At most this many early groups (the product of their columns' distinct counts)
/// for an aggregate to be taken below every lookup whatever their size: q99 and q62
/// group catalog and web sales by the strings of a warehouse, a ship mode and a call
/// centre or web site (5, 20 and 6 or 30 rows), and hashed those strings for each of
/// 287-395 k sales after three joins had copied them; summed first by the sales'
/// three keys, they are 600 or 3 000 groups of integers, and the joins and the
/// strings' hashing see those. An aggregate with so few groups costs little however
/// many rows it reads.
const FEW_EARLY_GROUPS: f64 = 10_000.0;

/// At least this many rows estimated to reach the lookups (see [`filtered_rows`]) for
/// an aggregate to be taken below them for its few groups: q66 sums web and catalog
/// sales by warehouse and month after joins with a year, a time range and two ship
/// modes (its lookups saw about 30 k sales, estimated 3-5 k), and joining those rows
/// and hashing their warehouses' strings cost less (2-3 ms) than planning and running
/// the early aggregate's two phases of 24 sums.
const EAGER_ROWS: f64 = 65_536.0;

/// The rows of `plan`, a tree of inner and semi joins, estimated as its largest
/// table's rows times the fraction of its rows each relation's filters keep (a
/// filtered dimension keeps as large a part of the fact's rows, keys taken as
/// uniform); the largest table's rows for anything else.
fn filtered_rows(plan: &LogicalPlan) -> f64 {
    fn walk(plan: &LogicalPlan, largest: &mut f64, kept: &mut f64) -> bool {
        match plan {
            LogicalPlan::Join(j)
                if matches!(
                    j.join_type,
                    JoinType::Inner | JoinType::LeftSemi | JoinType::RightSemi
                ) =>
            {
                walk(&j.left, largest, kept) && walk(&j.right, largest, kept)
            }
            LogicalPlan::Projection(p) if is_column_projection(plan) => {
                walk(&p.input, largest, kept)
            }
            LogicalPlan::TableScan(_)
            | LogicalPlan::Filter(_)
            | LogicalPlan::Projection(_)
            | LogicalPlan::SubqueryAlias(_) => {
                let (rows, base) = estimate(plan);
                if base <= 0.0 {
                    return false;
                }
                *largest = largest.max(base);
                *kept *= rows / base;
                true
            }
            _ => false,
        }
    }
    let (mut largest, mut kept) = (0.0, 1.0);
    if walk(plan, &mut largest, &mut kept) {
        largest * kept
    } else {
        largest_table(plan)
    }
}

/// What an early aggregate is taken below: the relation it aggregates, the lookups
/// joined to its result (the first on top), the semi joins kept, with the relation
/// of each (`None`: the aggregated one; `Some(i)`: lookup `i`).
struct Placement<'a> {
    x: &'a LogicalPlan,
    lookups: Vec<Lookup<'a>>,
    semis: Vec<(Semi<'a>, Option<usize>)>,
}

/// Below every lookup, when the early groups are few (see [`FEW_EARLY_GROUPS`]) and
/// each semi join's keys are columns of one relation.
fn below_every_lookup<'a>(
    found: &Lookups<'a>,
    groups: &[Column],
) -> Option<(Placement<'a>, Vec<Expr>)> {
    if found.lookups.is_empty() {
        return None;
    }
    let x = found.below;
    let x_columns = columns(x);
    if is_aggregate(x)
        || !found
            .lookups
            .iter()
            .all(|l| l.x_keys.iter().all(|k| x_columns.contains(k)))
    {
        return None;
    }
    let mut semis = Vec::new();
    for semi in &found.semis {
        let owner = if semi.keys.iter().all(|k| x_columns.contains(k)) {
            None
        } else {
            let i = found.lookups.iter().position(|l| {
                let r_columns = columns(l.r);
                semi.keys.iter().all(|k| r_columns.contains(k))
            })?;
            Some(i)
        };
        semis.push((semi.clone(), owner));
    }
    let early_groups = early_groups(groups, &x_columns, found.lookups.iter());
    let few = early_group_count(x, &early_groups)?;
    let rows = filtered_rows(x);
    (few <= FEW_EARLY_GROUPS && few * EARLY_SHRINK <= rows && rows >= EAGER_ROWS).then_some((
        Placement {
            x,
            lookups: found.lookups.clone(),
            semis,
        },
        early_groups,
    ))
}

/// Below the top lookup alone, when it is large (see the module docs).
fn below_a_large_lookup<'a>(
    found: &Lookups<'a>,
    groups: &[Column],
    grouping_sets: bool,
) -> Option<(Placement<'a>, Vec<Expr>)> {
    // A semi join above the lookup filters what it looks up (those below it are
    // part of `X`).
    if found.semis.iter().any(|s| s.under == 0) {
        return None;
    }
    let top = found.lookups.first()?.clone();
    let (x, r) = (top.x, top.r);
    if is_aggregate(x) || (!grouping_sets && !is_large_lookup(x, r)) {
        return None;
    }
    let (x_columns, r_columns) = (columns(x), columns(r));
    let looked_up: Vec<&Column> = groups
        .iter()
        .filter(|g| r_columns.contains(g) && !top.r_keys.contains(g))
        .collect();
    // Grouped by the join's keys already, the early aggregate makes no more groups
    // than the late one, however coarse the rest.
    let keys_grouped = [&top.x_keys, &top.r_keys]
        .iter()
        .any(|keys| keys.iter().all(|k| groups.contains(k)));
    // Grouping sets hash each row once per set: an early aggregate that shrinks the
    // rows (checked below) saves that however coarse the groups.
    if !(grouping_sets || keys_grouped || groups_as_fine_as_keys(r, &looked_up, &top.r_keys)) {
        return None;
    }
    let early_groups = early_groups(groups, &x_columns, std::iter::once(&top));
    if grouping_sets && !early_aggregate_shrinks(x, &early_groups) {
        return None;
    }
    Some((
        Placement {
            x,
            lookups: vec![top],
            semis: Vec::new(),
        },
        early_groups,
    ))
}

/// The early aggregate's groups: the groups that are columns of `X`, then `X`'s keys
/// of every lookup.
fn early_groups<'a>(
    groups: &[Column],
    x_columns: &HashSet<Column>,
    lookups: impl Iterator<Item = &'a Lookup<'a>>,
) -> Vec<Expr> {
    let mut early: Vec<Expr> = Vec::new();
    let keys: Vec<&Column> = lookups.flat_map(|l| &l.x_keys).collect();
    for c in groups.iter().filter(|g| x_columns.contains(g)).chain(keys) {
        let e = Expr::Column(c.clone());
        if !early.contains(&e) {
            early.push(e);
        }
    }
    early
}

/// `aggregate` computed early below its lookups (see the module docs), or `None`.
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
    let Some(Unprojected {
        group_expr,
        aggr_expr,
        input,
    }) = through_projections(aggregate)?
    else {
        return Ok(None);
    };
    let grouping_sets = matches!(group_expr.as_slice(), [Expr::GroupingSet(_)]);
    let Some(groups) = group_columns(&group_expr) else {
        return Ok(None);
    };
    let found = lookups(input);
    let placed = below_every_lookup(&found, &groups)
        .or_else(|| below_a_large_lookup(&found, &groups, grouping_sets));
    let Some((placement, early_groups)) = placed else {
        return Ok(None);
    };
    let x = placement.x;
    let x_columns = columns(x);
    let r_columns: Vec<HashSet<Column>> = placement.lookups.iter().map(|l| columns(l.r)).collect();
    // Some group must be looked up: what the joins are for.
    let looked_up = groups.iter().any(|g| {
        !x_columns.contains(g)
            && placement
                .lookups
                .iter()
                .zip(&r_columns)
                .any(|(l, r)| r.contains(g) && !l.r_keys.contains(g))
    });
    let grouped = groups
        .iter()
        .all(|g| x_columns.contains(g) || r_columns.iter().any(|r| r.contains(g)));
    if !looked_up || !grouped {
        return Ok(None);
    }
    // Every aggregate: a plain decomposable function of X's columns.
    let mut parts = Vec::new();
    for expr in &aggr_expr {
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
    let partial_name = |i: usize| format!("{PARTIAL_PREFIX}{i}");
    let count_name = |i: usize| format!("{PARTIAL_PREFIX}{i}_count");
    let partial = |i: usize| Expr::Column(Column::from_name(partial_name(i)));
    let partial_count = |i: usize| Expr::Column(Column::from_name(count_name(i)));
    let mut early_aggregates: Vec<Expr> = Vec::new();
    let mut late_aggregates: Vec<Expr> = Vec::new();
    for (i, (e, (func, combine))) in aggr_expr.iter().zip(&parts).enumerate() {
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
    // Each semi join filters the relation whose columns it reads.
    let semi_joined = |plan: &LogicalPlan, owner: Option<usize>| -> DfResult<LogicalPlan> {
        let mut builder = LogicalPlanBuilder::from(plan.clone());
        for (semi, _) in placement.semis.iter().filter(|(_, o)| *o == owner) {
            builder = builder.join_with_expr_keys(
                semi.right.clone(),
                JoinType::LeftSemi,
                (
                    semi.keys
                        .iter()
                        .cloned()
                        .map(Expr::Column)
                        .collect::<Vec<_>>(),
                    semi.right_keys.clone(),
                ),
                None,
            )?;
        }
        builder.build()
    };
    let mut late = LogicalPlanBuilder::from(semi_joined(x, None)?)
        .aggregate(early_groups, early_aggregates)?;
    for (i, lookup) in placement.lookups.iter().enumerate().rev() {
        late = late.join_with_expr_keys(
            semi_joined(lookup.r, Some(i))?,
            JoinType::Inner,
            (
                lookup
                    .x_keys
                    .iter()
                    .cloned()
                    .map(Expr::Column)
                    .collect::<Vec<_>>(),
                lookup
                    .r_keys
                    .iter()
                    .cloned()
                    .map(Expr::Column)
                    .collect::<Vec<_>>(),
            ),
            None,
        )?;
    }
    let late = late.aggregate(group_expr, late_aggregates)?.build()?;
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
        register(
            &session,
            &env,
            vec![
                ("sales", sales),
                ("day", day),
                ("customer", customer),
                ("store", store),
            ],
        );
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
        register(
            &session,
            &env,
            vec![("inv", inventory), ("day", day), ("item", item)],
        );
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

    /// Registers `frames` with `session`.
    fn register(
        session: &QuerySession,
        env: &crate::FrameEnv,
        frames: Vec<(&str, polars::prelude::DataFrame)>,
    ) {
        for (name, frame) in frames {
            session
                .register(name, &RemoteFrame::from_polars(env, &frame).unwrap())
                .unwrap();
        }
    }

    #[test]
    fn sales_are_summed_by_the_keys_of_small_lookups_before_their_strings_are_joined() {
        let env = local_env(1, 64 << 20);
        let session = QuerySession::new(&env).unwrap();
        // q99's shape: sales by warehouse, ship mode and call centre (5, 7 and 3 of
        // them: 105 early groups), grouped by their strings (a warehouse's under a
        // computed name), 80 k sales (enough rows to be worth it).
        let rows = 80_000i64;
        let sales = df!(
            "s_wh" => (0..rows).map(|i| i % 5).collect::<Vec<_>>(),
            "s_sm" => (0..rows).map(|i| (i / 5) % 7).collect::<Vec<_>>(),
            "s_cc" => (0..rows).map(|i| (i / 35) % 3).collect::<Vec<_>>(),
            "s_sold" => (0..rows).map(|i| i % 20).collect::<Vec<_>>(),
            "s_ship" => (0..rows).map(|i| i % 61).collect::<Vec<_>>(),
            "s_amt" => (0..rows).map(|i| (i % 13 != 0).then_some(i % 97)).collect::<Vec<_>>()
        )
        .unwrap();
        let warehouse = df!(
            "w_sk" => (0..5i64).collect::<Vec<_>>(),
            "w_name" => (0..5i64).map(|k| format!("warehouse {} of the north", k % 4)).collect::<Vec<_>>()
        )
        .unwrap();
        let ship_mode = df!(
            "sm_sk" => (0..7i64).collect::<Vec<_>>(),
            "sm_type" => (0..7i64).map(|k| format!("type {}", k % 3)).collect::<Vec<_>>()
        )
        .unwrap();
        let call_center = df!(
            "cc_sk" => (0..3i64).collect::<Vec<_>>(),
            "cc_name" => ["east", "west", "east"]
        )
        .unwrap();
        register(
            &session,
            &env,
            vec![
                ("sales", sales),
                ("warehouse", warehouse),
                ("ship_mode", ship_mode),
                ("call_center", call_center),
            ],
        );
        let sql = "SELECT w_substr, sm_type, cc_name, \
                   sum(CASE WHEN s_ship - s_sold <= 30 THEN 1 ELSE 0 END) AS soon, \
                   sum(CASE WHEN s_ship - s_sold > 30 THEN 1 ELSE 0 END) AS late, \
                   count(s_amt) AS n, min(s_amt) AS lo, max(s_amt) AS hi, sum(s_amt) AS total \
                   FROM sales, (SELECT substr(w_name, 1, 11) AS w_substr, * FROM warehouse) AS w, \
                   ship_mode, call_center \
                   WHERE s_wh = w_sk AND s_sm = sm_sk AND s_cc = cc_sk \
                   GROUP BY w_substr, sm_type, cc_name ORDER BY w_substr, sm_type, cc_name";
        let plan = session.explain(sql).unwrap();
        // One aggregate by the sales' three keys below the three joins, one above.
        assert_eq!(final_aggregates(&plan), 2, "{plan}");
        let lines: Vec<&str> = plan.lines().collect();
        let early = lines
            .iter()
            .position(|l| l.contains("AggregateExec: mode=Final") && l.contains("s_wh"));
        let last_join = lines.iter().rposition(|l| l.contains("HashJoinExec"));
        assert!(early > last_join, "{plan}");
        let got = session.sql(sql).unwrap().to_polars().unwrap();
        type Sums = (i64, i64, i64, Option<i64>, Option<i64>, i64);
        let mut want: std::collections::BTreeMap<(String, String, String), Sums> =
            std::collections::BTreeMap::new();
        for i in 0..rows {
            let key = (
                format!("warehouse {}", (i % 5) % 4),
                format!("type {}", ((i / 5) % 7) % 3),
                ["east", "west", "east"][((i / 35) % 3) as usize].to_owned(),
            );
            let e = want.entry(key).or_insert((0, 0, 0, None, None, 0));
            if i % 61 - i % 20 <= 30 {
                e.0 += 1;
            } else {
                e.1 += 1;
            }
            if i % 13 != 0 {
                let amt = i % 97;
                e.2 += 1;
                e.3 = Some(e.3.map_or(amt, |v: i64| v.min(amt)));
                e.4 = Some(e.4.map_or(amt, |v: i64| v.max(amt)));
                e.5 += amt;
            }
        }
        assert_eq!(got.height(), want.len());
        let column = |name: &str| got.column(name).unwrap().i64().unwrap().clone();
        let (soon, late, n, lo, hi, total) = (
            column("soon"),
            column("late"),
            column("n"),
            column("lo"),
            column("hi"),
            column("total"),
        );
        let names = got.column("w_substr").unwrap().str().unwrap().clone();
        for (row, ((w, _, _), (s, l, c, min, max, t))) in want.iter().enumerate() {
            assert_eq!(names.get(row), Some(w.as_str()), "row {row}");
            assert_eq!(soon.get(row), Some(*s), "row {row}");
            assert_eq!(late.get(row), Some(*l), "row {row}");
            assert_eq!(n.get(row), Some(*c), "row {row}");
            assert_eq!(lo.get(row), *min, "row {row}");
            assert_eq!(hi.get(row), *max, "row {row}");
            assert_eq!(total.get(row), Some(*t), "row {row}");
        }
    }

    #[test]
    fn a_semi_join_on_a_lookups_column_filters_the_lookup_below_the_late_aggregate() {
        let env = local_env(1, 64 << 20);
        let session = QuerySession::new(&env).unwrap();
        // q70's shape: a roll-up of sales by their store's state and county, of the
        // states among some chosen by a subquery.
        let rows = 70_000i64;
        let sales = df!(
            "s_store" => (0..rows).map(|i| i % 9).collect::<Vec<_>>(),
            "s_profit" => (0..rows).map(|i| i % 101 - 50).collect::<Vec<_>>()
        )
        .unwrap();
        let store = df!(
            "st_sk" => (0..9i64).collect::<Vec<_>>(),
            "st_state" => (0..9i64).map(|k| format!("s{}", k % 4)).collect::<Vec<_>>(),
            "st_county" => (0..9i64).map(|k| format!("c{}", k % 2)).collect::<Vec<_>>()
        )
        .unwrap();
        register(&session, &env, vec![("sales", sales), ("store", store)]);
        let sql = "SELECT st_state, st_county, sum(s_profit) AS total, count(*) AS n \
                   FROM sales, store WHERE s_store = st_sk \
                   AND st_state IN (SELECT st_state FROM store WHERE st_sk IN (1, 2, 5)) \
                   GROUP BY ROLLUP(st_state, st_county) \
                   ORDER BY st_state NULLS FIRST, st_county NULLS FIRST";
        let plan = session.explain(sql).unwrap();
        assert_eq!(final_aggregates(&plan), 2, "{plan}");
        let got = session.sql(sql).unwrap().to_polars().unwrap();
        // States s1 and s2 (stores 1, 2, 5, 6).
        let mut want: std::collections::BTreeMap<(Option<String>, Option<String>), (i64, i64)> =
            std::collections::BTreeMap::new();
        for i in 0..rows {
            let store = i % 9;
            let state = format!("s{}", store % 4);
            if state != "s1" && state != "s2" {
                continue;
            }
            let county = format!("c{}", store % 2);
            for key in [
                (Some(state.clone()), Some(county)),
                (Some(state), None),
                (None, None),
            ] {
                let e = want.entry(key).or_insert((0, 0));
                e.0 += i % 101 - 50;
                e.1 += 1;
            }
        }
        assert_eq!(got.height(), want.len());
        let state = got.column("st_state").unwrap().str().unwrap();
        let county = got.column("st_county").unwrap().str().unwrap();
        let total = got.column("total").unwrap().i64().unwrap();
        let n = got.column("n").unwrap().i64().unwrap();
        for (row, ((s, c), (t, k))) in want.iter().enumerate() {
            assert_eq!(state.get(row), s.as_deref(), "row {row}");
            assert_eq!(county.get(row), c.as_deref(), "row {row}");
            assert_eq!(total.get(row), Some(*t), "row {row}");
            assert_eq!(n.get(row), Some(*k), "row {row}");
        }
    }

    #[test]
    fn neither_a_fact_nor_a_few_filtered_rows_are_looked_up() {
        let env = local_env(1, 64 << 20);
        let session = QuerySession::new(&env).unwrap();
        let rows = 80_000i64;
        let sales = df!(
            "s_day" => (0..rows).map(|i| i % 300).collect::<Vec<_>>(),
            "s_wh" => (0..rows).map(|i| i % 5).collect::<Vec<_>>(),
            "s_cust" => (0..rows).map(|i| i % 1000).collect::<Vec<_>>(),
            "s_amt" => (0..rows).map(|i| i % 97).collect::<Vec<_>>()
        )
        .unwrap();
        let day = df!(
            "d_day" => (0..300i64).collect::<Vec<_>>(),
            "d_month" => (0..300i64).map(|d| d / 30).collect::<Vec<_>>(),
            "d_moy" => (0..300i64).map(|d| (d / 30) % 12).collect::<Vec<_>>()
        )
        .unwrap();
        let warehouse = df!(
            "w_sk" => (0..5i64).collect::<Vec<_>>(),
            "w_name" => ["a", "b", "c", "d", "e"]
        )
        .unwrap();
        register(
            &session,
            &env,
            vec![("sales", sales), ("day", day), ("warehouse", warehouse)],
        );
        // The distinct customers of some months: the sales are not a lookup of the
        // filtered days (they are larger), so nothing is aggregated by day first.
        let plan = session
            .explain(
                "SELECT s_cust, s_wh FROM sales, day WHERE s_day = d_day AND d_month < 4 \
                 GROUP BY s_cust, s_wh",
            )
            .unwrap();
        assert_eq!(final_aggregates(&plan), 1, "{plan}");
        // q66's shape: the warehouse is a small lookup, but a day of the month and a
        // month of the year leave it few sales (estimated 80 k / 100: 800): joining
        // those costs less than the early aggregate.
        let plan = session
            .explain(
                "SELECT w_name, sum(s_amt) AS total FROM sales, day, warehouse \
                 WHERE s_day = d_day AND s_wh = w_sk AND d_month = 3 AND d_moy = 3 \
                 GROUP BY w_name",
            )
            .unwrap();
        assert_eq!(final_aggregates(&plan), 1, "{plan}");
    }
}
