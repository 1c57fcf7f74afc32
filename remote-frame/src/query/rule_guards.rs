//! DataFusion logical rules skipped on plans they cannot change.
//!
//! The optimizer runs every rule over the whole plan in each of its passes (three
//! for nearly every TPC-DS query: the pushdowns and common subexpressions keep
//! changing it). Two rules rebuild the plan whatever they find: `rewrite_set_comparison`
//! merges the schemas of every node's inputs to look for `x op ANY (subquery)`, and
//! `eliminate_cross_join` flattens and rebuilds every tree of inner joins to turn
//! cross joins and the filters over them into keyed joins. On the 99 queries they
//! took 36 and 45 of the 300 ms the logical optimizer spent, nearly all of it on
//! plans with no set comparison and, after the first pass, no cross join left.
//! [`Guarded`] runs such a rule only on a plan with something it rewrites: planning
//! all 99 took 590 ms instead of 630, with the same plans.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::Result as DfResult;
use datafusion::logical_expr::{Expr, JoinType, LogicalPlan};
use datafusion::optimizer::{ApplyOrder, OptimizerConfig, OptimizerRule};

/// A logical rule run only on plans `may_change` says it may rewrite.
#[derive(Debug)]
pub(crate) struct Guarded {
    rule: Arc<dyn OptimizerRule + Send + Sync>,
    may_change: fn(&LogicalPlan) -> bool,
}

impl OptimizerRule for Guarded {
    fn name(&self) -> &str {
        self.rule.name()
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        // Only a rule that walks the plan itself is guarded: the guard looks at the
        // whole plan once.
        None
    }

    fn supports_rewrite(&self) -> bool {
        true
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        config: &dyn OptimizerConfig,
    ) -> DfResult<Transformed<LogicalPlan>> {
        if (self.may_change)(&plan) {
            self.rule.rewrite(plan, config)
        } else {
            Ok(Transformed::no(plan))
        }
    }
}

/// `rules` with those known to rebuild plans they do not change guarded (see the
/// module docs); a rule that recurses through the optimizer is left as it is.
pub(crate) fn guard(
    rules: Vec<Arc<dyn OptimizerRule + Send + Sync>>,
) -> Vec<Arc<dyn OptimizerRule + Send + Sync>> {
    rules
        .into_iter()
        .map(|rule| {
            let may_change: fn(&LogicalPlan) -> bool = match rule.name() {
                "rewrite_set_comparison" => has_set_comparison,
                "eliminate_cross_join" => has_cross_join,
                _ => return rule,
            };
            if rule.apply_order().is_some() {
                return rule;
            }
            Arc::new(Guarded { rule, may_change }) as Arc<dyn OptimizerRule + Send + Sync>
        })
        .collect()
}

/// Whether a node of `plan` or of its subqueries passes `test`.
fn any_node(plan: &LogicalPlan, mut test: impl FnMut(&LogicalPlan) -> bool) -> bool {
    stopped(plan.apply_with_subqueries(|node| Ok(stop_if(test(node)))))
}

/// Whether `plan` compares a value with a subquery's (`x > ALL (…)`).
fn has_set_comparison(plan: &LogicalPlan) -> bool {
    any_node(plan, |node| {
        stopped(node.apply_expressions(|e| {
            e.exists(|e| Ok(matches!(e, Expr::SetComparison(_))))
                .map(stop_if)
        }))
    })
}

/// Whether `plan` holds what `eliminate_cross_join` turns into keyed joins: an inner
/// join without keys or with a filter (pulled up, and its equalities made keys), or a
/// filter over an inner join.
fn has_cross_join(plan: &LogicalPlan) -> bool {
    any_node(plan, |node| match node {
        LogicalPlan::Join(j) => {
            j.join_type == JoinType::Inner && (j.on.is_empty() || j.filter.is_some())
        }
        LogicalPlan::Filter(f) => {
            matches!(f.input.as_ref(), LogicalPlan::Join(j) if j.join_type == JoinType::Inner)
        }
        _ => false,
    })
}

/// A walk that stops at what it looks for.
fn stop_if(found: bool) -> TreeNodeRecursion {
    match found {
        true => TreeNodeRecursion::Stop,
        false => TreeNodeRecursion::Continue,
    }
}

/// Whether a walk by [`stop_if`] found what it looked for; a walk that failed is
/// taken to have found it (the guarded rule then runs).
fn stopped(walk: DfResult<TreeNodeRecursion>) -> bool {
    walk.map_or(true, |r| r == TreeNodeRecursion::Stop)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use datafusion::logical_expr::expr::{SetComparison, SetQuantifier};
    use datafusion::logical_expr::{Operator, Subquery};
    use datafusion::optimizer::eliminate_cross_join::EliminateCrossJoin;
    use datafusion::optimizer::rewrite_set_comparison::RewriteSetComparison;
    use datafusion::optimizer::OptimizerContext;
    use datafusion::prelude::{col, lit};

    use super::*;
    use crate::query::test_env::key_value_scan as scan;

    fn guarded(rule: Arc<dyn OptimizerRule + Send + Sync>) -> Arc<dyn OptimizerRule + Send + Sync> {
        let mut rules = guard(vec![rule]);
        rules.remove(0)
    }

    fn joins_without_keys(plan: &LogicalPlan) -> usize {
        let mut n = 0;
        plan.apply_with_subqueries(|p| {
            n += usize::from(matches!(p, LogicalPlan::Join(j) if j.on.is_empty()));
            Ok(TreeNodeRecursion::Continue)
        })
        .unwrap();
        n
    }

    #[test]
    fn a_cross_join_under_an_equality_still_becomes_a_keyed_join() {
        let plan = scan("a")
            .cross_join(scan("b").build().unwrap())
            .unwrap()
            .filter(col("a.a_k").eq(col("b.b_k")))
            .unwrap()
            .build()
            .unwrap();
        assert!(has_cross_join(&plan));
        let rule = guarded(Arc::new(EliminateCrossJoin::new()));
        let out = rule.rewrite(plan, &OptimizerContext::new()).unwrap();
        assert!(out.transformed);
        assert_eq!(
            joins_without_keys(&out.data),
            0,
            "{}",
            out.data.display_indent()
        );
    }

    #[test]
    fn keyed_joins_are_left_as_they_are_without_a_walk() {
        let plan = scan("a")
            .join(
                scan("b").build().unwrap(),
                JoinType::Inner,
                (vec!["a_k"], vec!["b_k"]),
                None,
            )
            .unwrap()
            .project(vec![col("a.a_v")])
            .unwrap()
            .filter(col("a.a_v").gt(lit(1)))
            .unwrap()
            .build()
            .unwrap();
        // A filter over a projection of the join: nothing the rule rewrites.
        assert!(!has_cross_join(&plan));
        let rule = guarded(Arc::new(EliminateCrossJoin::new()));
        let before = format!("{}", plan.display_indent());
        let out = rule.rewrite(plan, &OptimizerContext::new()).unwrap();
        assert!(!out.transformed);
        assert_eq!(format!("{}", out.data.display_indent()), before);
        // A join filter is pulled up and its equalities made keys: not skipped.
        let filtered = scan("a")
            .join(
                scan("b").build().unwrap(),
                JoinType::Inner,
                (vec!["a_k"], vec!["b_k"]),
                Some(col("a.a_v").lt(col("b.b_v"))),
            )
            .unwrap()
            .build()
            .unwrap();
        assert!(has_cross_join(&filtered));
    }

    #[test]
    fn only_a_plan_comparing_with_a_subquery_is_rewritten() {
        let sub = Subquery {
            subquery: Arc::new(
                scan("b")
                    .project(vec![col("b.b_v")])
                    .unwrap()
                    .build()
                    .unwrap(),
            ),
            outer_ref_columns: vec![],
            spans: Default::default(),
        };
        let all = Expr::SetComparison(SetComparison::new(
            Box::new(col("a.a_v")),
            sub,
            Operator::Gt,
            SetQuantifier::All,
        ));
        let compared = scan("a").filter(all).unwrap().build().unwrap();
        let plain = scan("a")
            .filter(col("a.a_v").gt(lit(1)))
            .unwrap()
            .build()
            .unwrap();
        assert!(has_set_comparison(&compared));
        assert!(!has_set_comparison(&plain));
        let rule = guarded(Arc::new(RewriteSetComparison::new()));
        let out = rule.rewrite(compared, &OptimizerContext::new()).unwrap();
        assert!(out.transformed);
        assert!(
            !has_set_comparison(&out.data),
            "{}",
            out.data.display_indent()
        );
        assert!(
            !rule
                .rewrite(plain, &OptimizerContext::new())
                .unwrap()
                .transformed
        );
    }

    #[test]
    fn every_rule_stays_in_its_place() {
        let names = |rules: &[Arc<dyn OptimizerRule + Send + Sync>]| {
            rules
                .iter()
                .map(|r| r.name().to_owned())
                .collect::<Vec<_>>()
        };
        let rules = datafusion::optimizer::Optimizer::new().rules;
        assert_eq!(names(&guard(rules.clone())), names(&rules));
    }
}
