//! Optimizer passes that converge: a pass that changes nothing repeats the plan it was
//! given, and DataFusion's optimizer, which stops when a pass repeats a plan, stops.
//!
//! Two things kept every pass changing the plan of nearly every query, so the optimizer
//! always ran all three of its passes:
//!
//! - DataFusion's `CommonSubexprEliminate` computes an expression used several times
//!   once, as `__common_expr_N` with N from the session's counter, and in the next pass
//!   `PushDownFilter` pushes the filter that uses it back through the projection that
//!   computes it: every pass finds the same expressions again under new names
//!   (DataFusion issue 14540). [`CommonExprNames`], the last rule of each pass, numbers
//!   them 1, 2, ... in the order a walk from the root meets them in the nodes' schemas.
//! - `PushDownLimit` gives a sort under a limit the limit's fetch in one pass and
//!   removes the limit, now redundant, only in the next. [`LimitsInSorts`], right after
//!   it, removes it in the same pass.
//!
//! q41 (a scalar subquery over an OR of sixteen conjunctions) took a third pass that
//! only renamed `__common_expr_3` to `__common_expr_4`; with both rules it takes two,
//! and its planning took 6.9 ms instead of 7.7 (interleaved, fastest of 6 rounds).

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{DFSchemaRef, Result as DfResult};
use datafusion::logical_expr::{Expr, FetchType, LogicalPlan, SkipType};
use datafusion::optimizer::{ApplyOrder, OptimizerConfig, OptimizerRule};

/// How DataFusion's common subexpressions are named, before their number.
const PREFIX: &str = "__common_expr_";

/// Numbers common subexpressions by where they are in the plan; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct CommonExprNames;

impl OptimizerRule for CommonExprNames {
    fn name(&self) -> &str {
        "scad_common_expr_names"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        // The numbering is over the whole plan: the rule walks it itself.
        None
    }

    fn supports_rewrite(&self) -> bool {
        true
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        _config: &dyn OptimizerConfig,
    ) -> DfResult<Transformed<LogicalPlan>> {
        let Some(numbers) = renumbering(&plan) else {
            return Ok(Transformed::no(plan));
        };
        Ok(match renamed(&plan, &numbers)? {
            Some(renamed) => Transformed::yes(renamed),
            None => Transformed::no(plan),
        })
    }
}

/// Removes a limit that only repeats its sort's fetch; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct LimitsInSorts;

impl OptimizerRule for LimitsInSorts {
    fn name(&self) -> &str {
        "scad_limits_in_sorts"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::TopDown)
    }

    fn supports_rewrite(&self) -> bool {
        true
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        _config: &dyn OptimizerConfig,
    ) -> DfResult<Transformed<LogicalPlan>> {
        let LogicalPlan::Limit(limit) = &plan else {
            return Ok(Transformed::no(plan));
        };
        let LogicalPlan::Sort(sort) = limit.input.as_ref() else {
            return Ok(Transformed::no(plan));
        };
        // A sort with fetch N returns its first N rows: `LIMIT N` without an offset
        // over it returns them all.
        let redundant = matches!(limit.get_skip_type(), Ok(SkipType::Literal(0)))
            && matches!(limit.get_fetch_type(), Ok(FetchType::Literal(Some(n))) if sort.fetch == Some(n));
        if redundant {
            return Ok(Transformed::yes(limit.input.as_ref().clone()));
        }
        Ok(Transformed::no(plan))
    }
}

/// The new number of each common subexpression number in `plan`'s schemas: 1, 2, ...
/// in the order a walk from the root meets them. `None` when they are numbered so
/// already, or when renaming could change what the plan means or returns: a node that
/// holds names outside its expressions or its own schema (see [`renames_by_expressions`]),
/// a subquery (its outer references), a table or a result with such a column, or a
/// number beyond `u64`.
fn renumbering(plan: &LogicalPlan) -> Option<HashMap<u64, u64>> {
    if plan
        .schema()
        .fields()
        .iter()
        .any(|f| !tokens(f.name()).is_empty())
    {
        return None;
    }
    let mut numbers: HashMap<u64, u64> = HashMap::new();
    let mut renamable = true;
    let walked = plan.apply(|node| {
        let mut has_subquery = false;
        node.apply_subqueries(|_| {
            has_subquery = true;
            Ok(TreeNodeRecursion::Stop)
        })?;
        if has_subquery || !renames_by_expressions(node) {
            renamable = false;
            return Ok(TreeNodeRecursion::Stop);
        }
        for field in node.schema().fields() {
            let found = tokens(field.name());
            if !found.is_empty() && matches!(node, LogicalPlan::TableScan(_)) {
                renamable = false;
                return Ok(TreeNodeRecursion::Stop);
            }
            for (_, number) in found {
                let Some(number) = number else {
                    renamable = false;
                    return Ok(TreeNodeRecursion::Stop);
                };
                let next = numbers.len() as u64 + 1;
                numbers.entry(number).or_insert(next);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    });
    if walked.is_err() || !renamable || numbers.iter().all(|(old, new)| old == new) {
        return None;
    }
    Some(numbers)
}

/// Whether every name `node` refers to is in its expressions and every name it
/// produces comes from them or from its inputs' schemas (or, for a table scan or
/// literal rows, cannot be a common subexpression's): the kinds whose names renaming
/// the expressions and recomputing the schema renames. Anything else (unnest, recursive
/// queries, extensions, statements) is left alone.
fn renames_by_expressions(node: &LogicalPlan) -> bool {
    matches!(
        node,
        LogicalPlan::Projection(_)
            | LogicalPlan::Filter(_)
            | LogicalPlan::Window(_)
            | LogicalPlan::Aggregate(_)
            | LogicalPlan::Sort(_)
            | LogicalPlan::Join(_)
            | LogicalPlan::Repartition(_)
            | LogicalPlan::Union(_)
            | LogicalPlan::TableScan(_)
            | LogicalPlan::EmptyRelation(_)
            | LogicalPlan::SubqueryAlias(_)
            | LogicalPlan::Limit(_)
            | LogicalPlan::Distinct(_)
            | LogicalPlan::Values(_)
    )
}

/// Where `name` holds common subexpression names: the span of each one's number and
/// the number (`None`: too large for `u64`).
fn tokens(name: &str) -> Vec<(Range<usize>, Option<u64>)> {
    let mut found = Vec::new();
    for (at, _) in name.match_indices(PREFIX) {
        let start = at + PREFIX.len();
        let digits = name[start..].bytes().take_while(u8::is_ascii_digit).count();
        if digits > 0 {
            let span = start..start + digits;
            found.push((span.clone(), name[span].parse().ok()));
        }
    }
    found
}

/// `name` with each common subexpression's number replaced by its new one in
/// `numbers`; `None` if that changes nothing. A number's digits run to the end of the
/// name or to a character that is not a digit, which stays: distinct names stay
/// distinct.
fn rename(name: &str, numbers: &HashMap<u64, u64>) -> Option<String> {
    // Most names hold no number to change: they are not copied.
    let changes: Vec<(Range<usize>, u64)> = tokens(name)
        .into_iter()
        .filter_map(|(span, number)| {
            let new = *numbers.get(&number?)?;
            (number != Some(new)).then_some((span, new))
        })
        .collect();
    if changes.is_empty() {
        return None;
    }
    let mut renamed = String::with_capacity(name.len());
    let mut copied = 0;
    for (span, new) in changes {
        renamed.push_str(&name[copied..span.start]);
        renamed.push_str(&new.to_string());
        copied = span.end;
    }
    renamed.push_str(&name[copied..]);
    Some(renamed)
}

/// `plan` with its common subexpressions renumbered by `numbers` in every expression
/// and every schema; `None` if some node's schema did not come out as its old one
/// renamed (a node that keeps a schema of its own, as a union may), in which case the
/// plan is left as it was.
fn renamed(plan: &LogicalPlan, numbers: &HashMap<u64, u64>) -> DfResult<Option<LogicalPlan>> {
    let rewritten = plan
        .clone()
        .transform_up(|node| {
            // Only a node with a renamed name in its expressions or its schema (from
            // its inputs) changes; the others keep their schemas.
            let stale = node
                .schema()
                .fields()
                .iter()
                .any(|f| rename(f.name(), numbers).is_some());
            let node = node.map_expressions(|e| e.transform(|e| renamed_expr(e, numbers)))?;
            if !(stale || node.transformed) {
                return Ok(node);
            }
            node.data.recompute_schema().map(Transformed::yes)
        })?
        .data;
    Ok(renamed_alike(plan, &rewritten, numbers).then_some(rewritten))
}

/// Whether every node of `after` has the names of the same node of `before`, renamed
/// by `numbers`.
fn renamed_alike(before: &LogicalPlan, after: &LogicalPlan, numbers: &HashMap<u64, u64>) -> bool {
    let (before, after) = (schemas(before), schemas(after));
    before.len() == after.len()
        && before.iter().zip(&after).all(|(b, a)| {
            b.fields().len() == a.fields().len()
                && b.fields().iter().zip(a.fields().iter()).all(|(b, a)| {
                    match rename(b.name(), numbers) {
                        Some(renamed) => &renamed == a.name(),
                        None => b.name() == a.name(),
                    }
                })
        })
}

/// Every node's schema, nodes from the root down.
fn schemas(plan: &LogicalPlan) -> Vec<DFSchemaRef> {
    let mut schemas = Vec::new();
    // The closure never fails.
    let _ = plan.apply(|node| {
        schemas.push(Arc::clone(node.schema()));
        Ok(TreeNodeRecursion::Continue)
    });
    schemas
}

/// A column reference or an alias renamed by `numbers`.
fn renamed_expr(expr: Expr, numbers: &HashMap<u64, u64>) -> DfResult<Transformed<Expr>> {
    Ok(match expr {
        Expr::Column(mut column) => match rename(&column.name, numbers) {
            Some(name) => {
                column.name = name;
                Transformed::yes(Expr::Column(column))
            }
            None => Transformed::no(Expr::Column(column)),
        },
        Expr::Alias(mut alias) => match rename(&alias.name, numbers) {
            Some(name) => {
                alias.name = name;
                Transformed::yes(Expr::Alias(alias))
            }
            None => Transformed::no(Expr::Alias(alias)),
        },
        other => Transformed::no(other),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use datafusion::optimizer::OptimizerContext;
    use datafusion::prelude::{col, lit};
    use polars::prelude::df;

    use super::*;
    use crate::frame::RemoteFrame;
    use crate::query::test_env::{key_value_scan as scan, local_env};
    use crate::query::QuerySession;

    fn numbers(pairs: &[(u64, u64)]) -> HashMap<u64, u64> {
        pairs.iter().copied().collect()
    }

    #[test]
    fn numbers_in_names_are_replaced_whole() {
        let map = numbers(&[(3, 1), (12, 2), (1, 3)]);
        assert_eq!(
            rename("__common_expr_3", &map).as_deref(),
            Some("__common_expr_1")
        );
        assert_eq!(
            rename("sum(__common_expr_12 + __common_expr_1)", &map).as_deref(),
            Some("sum(__common_expr_2 + __common_expr_3)")
        );
        // 12 is not 1 followed by a 2.
        assert_eq!(
            rename("__common_expr_12x", &map).as_deref(),
            Some("__common_expr_2x")
        );
        assert_eq!(rename("__common_expr_7", &map), None);
        assert_eq!(rename("__common_expr_", &map), None);
        assert_eq!(rename("i_category", &map), None);
        assert_eq!(
            tokens("__common_expr_99999999999999999999999"),
            vec![(14..37, None)]
        );
    }

    /// `a_k + 1` as `__common_expr_{n}` below a filter using it twice, and a
    /// projection of the key above (what the eliminator leaves).
    fn eliminated(n: u64) -> LogicalPlan {
        let name = format!("{PREFIX}{n}");
        scan("a")
            .project(vec![
                (col("a_k") + lit(1)).alias(&name),
                col("a_k"),
                col("a_v"),
            ])
            .unwrap()
            .filter(col(&name).gt(lit(3)).and(col(&name).lt(col("a_v"))))
            .unwrap()
            .aggregate(
                vec![col(&name)],
                vec![datafusion::functions_aggregate::expr_fn::count(col("a_v"))],
            )
            .unwrap()
            .project(vec![col("count(a.a_v)")])
            .unwrap()
            .build()
            .unwrap()
    }

    #[test]
    fn plans_that_differ_only_in_the_numbers_come_out_equal() {
        let rule = CommonExprNames;
        let config = OptimizerContext::new();
        let from_pass_two = rule.rewrite(eliminated(2), &config).unwrap();
        let from_pass_three = rule.rewrite(eliminated(3), &config).unwrap();
        assert!(from_pass_two.transformed && from_pass_three.transformed);
        assert_eq!(from_pass_two.data, from_pass_three.data);
        assert_eq!(from_pass_two.data, eliminated(1));
        // Numbered so already: nothing to do.
        assert!(!rule.rewrite(eliminated(1), &config).unwrap().transformed);
    }

    /// The optimizer passes `sql`'s plan took in `session` and its final logical plan.
    fn passes(session: &QuerySession, sql: &str) -> (usize, String) {
        let verbose = session
            .sql(&format!("EXPLAIN VERBOSE {sql}"))
            .unwrap()
            .to_polars()
            .unwrap();
        let kinds: Vec<&str> = verbose
            .column("plan_type")
            .unwrap()
            .str()
            .unwrap()
            .iter()
            .map(Option::unwrap_or_default)
            .collect();
        let plans = verbose.column("plan").unwrap().str().unwrap();
        let passes = kinds
            .iter()
            .filter(|k| **k == "logical_plan after rewrite_set_comparison")
            .count();
        let at = kinds.iter().position(|k| *k == "logical_plan").unwrap();
        let last = plans.get(at).unwrap().to_owned();
        (passes, last)
    }

    #[test]
    fn common_subexpressions_under_a_top_n_take_two_passes_and_keep_the_answer() {
        let env = local_env(1, 16 << 20);
        let session = QuerySession::new(&env).unwrap();
        let n = 2_000i64;
        let colour = |i: i64| ["red", "blue", "green"][(i % 3) as usize];
        let size = |i: i64| ["S", "M", "L", "XL"][(i % 4) as usize];
        let t = df!(
            "k" => (0..n).collect::<Vec<_>>(),
            "c" => (0..n).map(colour).collect::<Vec<_>>(),
            "s" => (0..n).map(size).collect::<Vec<_>>()
        )
        .unwrap();
        session
            .register("t", &RemoteFrame::from_polars(&env, &t).unwrap())
            .unwrap();
        // As q41: conjunctions sharing their first conditions, under ORDER BY .. LIMIT
        // (the first one's first condition is always evaluated, so it is computed once).
        let sql = "SELECT k FROM t WHERE (c = 'red' AND (s = 'S' OR s = 'M')) \
                   OR (c = 'blue' AND (s = 'S' OR s = 'L')) OR (c = 'red' AND s = 'XL') \
                   OR (c = 'blue' AND s = 'XL') ORDER BY k DESC LIMIT 7";
        let (passes_taken, plan) = passes(&session, sql);
        // The filter's repeated conditions are computed once ...
        assert!(plan.contains("__common_expr_1"), "{plan}");
        // ... and the second pass repeats the first: before, three passes each found
        // them again under new names, and the limit went only in the second.
        assert_eq!(passes_taken, 2, "{plan}");
        assert!(!plan.contains("Limit:"), "{plan}");
        let expected: Vec<i64> = (0..n)
            .rev()
            .filter(|&i| {
                let (c, s) = (colour(i), size(i));
                (c == "red" && matches!(s, "S" | "M" | "XL"))
                    || (c == "blue" && matches!(s, "S" | "L" | "XL"))
            })
            .take(7)
            .collect();
        let got = session.sql(sql).unwrap().to_polars().unwrap();
        let got: Vec<i64> = got
            .column("k")
            .unwrap()
            .i64()
            .unwrap()
            .into_no_null_iter()
            .collect();
        assert_eq!(got, expected);
    }

    #[test]
    fn a_limit_with_an_offset_or_a_smaller_fetch_stays() {
        let config = OptimizerContext::new();
        let sorted = |fetch: usize| {
            let mut plan = scan("a")
                .sort(vec![col("a_k").sort(true, false)])
                .unwrap()
                .build()
                .unwrap();
            if let LogicalPlan::Sort(sort) = &mut plan {
                sort.fetch = Some(fetch);
            }
            plan
        };
        let limited = |skip: usize, fetch: usize, sort_fetch: usize| {
            datafusion::logical_expr::LogicalPlanBuilder::from(sorted(sort_fetch))
                .limit(skip, Some(fetch))
                .unwrap()
                .build()
                .unwrap()
        };
        let removed = LimitsInSorts.rewrite(limited(0, 10, 10), &config).unwrap();
        assert!(removed.transformed);
        assert_eq!(removed.data, sorted(10));
        for (skip, fetch, sort_fetch) in [(5, 10, 15), (0, 5, 10)] {
            let kept = LimitsInSorts
                .rewrite(limited(skip, fetch, sort_fetch), &config)
                .unwrap();
            assert!(!kept.transformed, "{skip} {fetch} {sort_fetch}");
        }
    }

    #[test]
    fn a_table_or_a_result_with_such_a_column_is_left_alone() {
        let config = OptimizerContext::new();
        // The result's column is the common subexpression itself.
        let shown = scan("a")
            .project(vec![(col("a_k") + lit(1)).alias("__common_expr_5")])
            .unwrap()
            .build()
            .unwrap();
        assert!(!CommonExprNames.rewrite(shown, &config).unwrap().transformed);
        // A stored column of that name.
        let schema = datafusion::arrow::datatypes::Schema::new(vec![
            datafusion::arrow::datatypes::Field::new(
                "__common_expr_5",
                datafusion::arrow::datatypes::DataType::Int64,
                false,
            ),
        ]);
        let stored = datafusion::logical_expr::table_scan(Some("t"), &schema, None)
            .unwrap()
            .project(vec![lit(1).alias("one")])
            .unwrap()
            .build()
            .unwrap();
        assert!(
            !CommonExprNames
                .rewrite(stored, &config)
                .unwrap()
                .transformed
        );
    }
}
