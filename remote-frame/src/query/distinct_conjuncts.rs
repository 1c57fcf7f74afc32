//! Filters and join filters without repeated conjuncts.
//!
//! DataFusion's `PushDownFilter` derives, from a disjunction over several tables, the
//! part that one join can check early (q13: `(price 100-150 AND dep_count = 3) OR
//! ...` from the `store_sales ⋈ household_demographics` columns of a three-way OR)
//! and adds it to that join's filter; a later optimizer pass adds it again, and the
//! optimizer's passes end with the copy in place (it was gone only when the whole
//! optimizer ran a second time), evaluated twice for every joined row.
//! [`DistinctConjuncts`] runs right after the pushdown and keeps the first of equal
//! conjuncts (volatile ones all stay).

use std::collections::HashSet;

use datafusion::common::tree_node::Transformed;
use datafusion::common::Result as DfResult;
use datafusion::logical_expr::utils::{conjunction, split_conjunction};
use datafusion::logical_expr::{Expr, Filter, LogicalPlan};
use datafusion::optimizer::{ApplyOrder, OptimizerConfig, OptimizerRule};

/// The rule; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct DistinctConjuncts;

impl OptimizerRule for DistinctConjuncts {
    fn name(&self) -> &str {
        "scad_distinct_conjuncts"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::BottomUp)
    }

    fn supports_rewrite(&self) -> bool {
        true
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        _config: &dyn OptimizerConfig,
    ) -> DfResult<Transformed<LogicalPlan>> {
        match plan {
            LogicalPlan::Filter(filter) => match distinct(&filter.predicate) {
                Some(predicate) => Filter::try_new(predicate, filter.input)
                    .map(|f| Transformed::yes(LogicalPlan::Filter(f))),
                None => Ok(Transformed::no(LogicalPlan::Filter(filter))),
            },
            LogicalPlan::Join(mut join) => match join.filter.as_ref().and_then(distinct) {
                Some(predicate) => {
                    join.filter = Some(predicate);
                    Ok(Transformed::yes(LogicalPlan::Join(join)))
                }
                None => Ok(Transformed::no(LogicalPlan::Join(join))),
            },
            other => Ok(Transformed::no(other)),
        }
    }
}

/// `predicate` with each repeated conjunct after its first occurrence removed;
/// `None` if it has no repeats.
fn distinct(predicate: &Expr) -> Option<Expr> {
    let conjuncts = split_conjunction(predicate);
    if conjuncts.len() < 2 {
        return None;
    }
    let mut seen = HashSet::with_capacity(conjuncts.len());
    let kept: Vec<Expr> = conjuncts
        .iter()
        .filter(|c| c.is_volatile() || seen.insert(**c))
        .map(|c| (*c).clone())
        .collect();
    if kept.len() == conjuncts.len() {
        return None;
    }
    conjunction(kept)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use datafusion::common::tree_node::TreeNode;
    use datafusion::common::JoinType;
    use datafusion::functions::math::expr_fn::random;
    use datafusion::optimizer::OptimizerContext;
    use datafusion::prelude::{col, lit};

    use super::*;
    use crate::query::test_env::key_value_scan as scan;

    #[test]
    fn a_join_filter_and_a_filter_keep_one_of_each_conjunct() {
        let derived = col("a.a_v").eq(lit(1)).or(col("b.b_v").eq(lit(2)));
        let twice = derived.clone().and(derived.clone());
        let plan = scan("a")
            .join(
                scan("b").build().unwrap(),
                JoinType::Inner,
                (vec!["a_k"], vec!["b_k"]),
                Some(twice.clone()),
            )
            .unwrap()
            .filter(twice)
            .unwrap()
            .build()
            .unwrap();
        let rewritten = plan
            .transform_up(|node| DistinctConjuncts.rewrite(node, &OptimizerContext::new()))
            .unwrap();
        assert!(rewritten.transformed);
        let LogicalPlan::Filter(filter) = &rewritten.data else {
            panic!("{}", rewritten.data.display_indent());
        };
        assert_eq!(filter.predicate, derived);
        let LogicalPlan::Join(join) = filter.input.as_ref() else {
            panic!("{}", rewritten.data.display_indent());
        };
        assert_eq!(join.filter, Some(derived));
    }

    #[test]
    fn a_repeated_conjunct_is_kept_once_in_its_first_place() {
        let x = col("a").eq(lit(3)).or(col("b").lt(lit(1)));
        let y = col("c").gt(lit(7));
        let predicate = x.clone().and(y.clone()).and(x.clone()).and(y.clone());
        assert_eq!(distinct(&predicate), Some(x.and(y)));
    }

    #[test]
    fn distinct_conjuncts_and_volatile_repeats_stay() {
        let distinct_already = col("a").eq(lit(3)).and(col("a").eq(lit(4)));
        assert_eq!(distinct(&distinct_already), None);
        // Two draws of random() are two different conditions.
        let draw = random().lt(lit(0.5));
        assert_eq!(distinct(&draw.clone().and(draw)), None);
        assert_eq!(distinct(&col("a").eq(lit(3))), None);
    }
}
