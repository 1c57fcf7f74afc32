//! Outer joins that an inner join above them makes inner.
//!
//! `FROM store_sales LEFT JOIN store_returns ON ..., reason WHERE sr_reason_sk =
//! r_reason_sk` (q93) keeps only the sales whose return has a reason: the inner
//! join's key on `sr_reason_sk` drops every row the left join padded with nulls, so
//! the left join is an inner join. DataFusion's `EliminateOuterJoin` sees this for a
//! filter above an outer join, not for the keys of a join above it; left outer, the
//! join must be built on all of `store_returns` and probed by all the sales (at
//! 25 MiB it spilled 1.1 M rows), where inner, [`super::chain_order`] is free to join
//! the one reason to its returns first and probe with the sales into that.
//!
//! [`NullRejectingJoinKeys`] makes a left (right, full) join inner (or one-sided) when
//! an inner equi-join above it, through column-only projections, has a key that is a
//! column of its null-padded side. Keys match only when both are non-null (not
//! null-equal joins), so a padded row never passes.

use datafusion::common::tree_node::Transformed;
use datafusion::common::{Column, Result as DfResult};
use datafusion::logical_expr::{JoinType, LogicalPlan, Projection};
use datafusion::optimizer::{OptimizerConfig, OptimizerRule};

use super::chain_order::{is_column_projection, is_key_join};

/// The rule; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct NullRejectingJoinKeys;

impl OptimizerRule for NullRejectingJoinKeys {
    fn name(&self) -> &str {
        "scad_null_rejecting_join_keys"
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        _config: &dyn OptimizerConfig,
    ) -> DfResult<Transformed<LogicalPlan>> {
        plan.transform_down_with_subqueries(|node| match node {
            LogicalPlan::Join(join) if is_key_join(&join, JoinType::Inner) => {
                let mut join = join;
                let mut changed = false;
                let left_keys: Vec<&Column> =
                    join.on.iter().filter_map(|(l, _)| l.try_as_col()).collect();
                if let Some(input) = tightened(&join.left, &left_keys) {
                    join.left = input.into();
                    changed = true;
                }
                let right_keys: Vec<&Column> =
                    join.on.iter().filter_map(|(_, r)| r.try_as_col()).collect();
                if let Some(input) = tightened(&join.right, &right_keys) {
                    join.right = input.into();
                    changed = true;
                }
                Ok(Transformed::new_transformed(
                    LogicalPlan::Join(join),
                    changed,
                ))
            }
            other => Ok(Transformed::no(other)),
        })
    }
}

/// `plan` with the outer join at its top (under column-only projections) made
/// tighter, when one of `keys` (columns a parent inner join drops null rows of) is a
/// column of a side that join pads with nulls; `None` if nothing changes.
fn tightened(plan: &LogicalPlan, keys: &[&Column]) -> Option<LogicalPlan> {
    match plan {
        LogicalPlan::Projection(p) if is_column_projection(plan) => {
            let input = tightened(&p.input, keys)?;
            // Same expressions over an input of the same columns: the schema stands.
            Projection::try_new_with_schema(p.expr.clone(), input.into(), p.schema.clone())
                .ok()
                .map(LogicalPlan::Projection)
        }
        LogicalPlan::Join(j) => {
            let from = |side: &LogicalPlan| keys.iter().any(|c| side.schema().has_column(c));
            let join_type = match j.join_type {
                JoinType::Left if from(&j.right) => JoinType::Inner,
                JoinType::Right if from(&j.left) => JoinType::Inner,
                JoinType::Full => match (from(&j.left), from(&j.right)) {
                    (true, true) => JoinType::Inner,
                    // Rows padded on the left are dropped: the right side's go.
                    (true, false) => JoinType::Left,
                    (false, true) => JoinType::Right,
                    (false, false) => return None,
                },
                _ => return None,
            };
            // The schema is kept (as EliminateOuterJoin keeps it): columns marked
            // nullable that hold no null.
            let mut j = j.clone();
            j.join_type = join_type;
            Some(LogicalPlan::Join(j))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use crate::frame::RemoteFrame;
    use crate::query::test_env::local_env;
    use crate::query::QuerySession;
    use polars::prelude::df;

    #[test]
    fn an_outer_join_under_an_inner_key_on_its_padded_side_becomes_inner() {
        let env = local_env(1, 64 << 20);
        let session = QuerySession::new(&env).unwrap();
        // q93's shape: sales, their returns (some), the returns' reasons.
        let sales = df!(
            "s_item" => (0..2_000i64).collect::<Vec<_>>(),
            "s_qty" => (0..2_000i64).map(|i| i % 7 + 1).collect::<Vec<_>>()
        )
        .unwrap();
        let returns = df!(
            "r_item" => (0..2_000i64).filter(|i| i % 3 == 0).collect::<Vec<_>>(),
            "r_reason" => (0..2_000i64).filter(|i| i % 3 == 0).map(|i| i % 5).collect::<Vec<_>>()
        )
        .unwrap();
        let reasons = df!(
            "re_sk" => (0..5i64).collect::<Vec<_>>(),
            "re_desc" => ["a", "b", "c", "d", "e"]
        )
        .unwrap();
        for (name, frame) in [("sales", sales), ("returns", returns), ("reasons", reasons)] {
            session
                .register(name, &RemoteFrame::from_polars(&env, &frame).unwrap())
                .unwrap();
        }
        let sql = "SELECT count(*) AS n, sum(s_qty) AS q \
                   FROM sales LEFT JOIN returns ON r_item = s_item, reasons \
                   WHERE r_reason = re_sk AND re_desc = 'c'";
        let plan = session.explain(sql).unwrap();
        assert!(!plan.contains("join_type=Left"), "{plan}");
        assert!(!plan.contains("join_type=Right"), "{plan}");
        // By hand: the items that are multiples of 3 with item % 5 == 2.
        let hits: Vec<i64> = (0..2_000i64).filter(|i| i % 3 == 0 && i % 5 == 2).collect();
        let got = session.sql(sql).unwrap().to_polars().unwrap();
        assert_eq!(
            got.column("n").unwrap().i64().unwrap().get(0),
            Some(hits.len() as i64)
        );
        assert_eq!(
            got.column("q").unwrap().i64().unwrap().get(0),
            Some(hits.iter().map(|i| i % 7 + 1).sum())
        );
        // A key on the preserved side keeps the outer join (and its padded rows).
        let kept = "SELECT count(*) AS n FROM sales LEFT JOIN returns ON r_item = s_item \
                    JOIN reasons ON s_qty = re_sk + 1";
        let plan = session.explain(kept).unwrap();
        assert!(
            plan.contains("join_type=Left") || plan.contains("join_type=Right"),
            "{plan}"
        );
        let got = session.sql(kept).unwrap().to_polars().unwrap();
        let want = (0..2_000i64)
            .filter(|i| (1..=5).contains(&(i % 7 + 1)))
            .count() as i64;
        assert_eq!(got.column("n").unwrap().i64().unwrap().get(0), Some(want));
    }
}
