//! Decimal division and averages as doubles, as DuckDB computes them.
//!
//! DataFusion divides decimals into a decimal of limited scale, truncating
//! (`0.0323197...` becomes `0.032318` after a sum of truncated quotients), and
//! averages a decimal column as a truncated decimal. DuckDB, the engine our answers
//! are checked against, and most analysts' expectations compute both in double
//! precision. This analyzer rule casts the operands of a division with a decimal
//! side, and the argument of `avg` over decimals (as an aggregate or a window
//! function), to `DOUBLE`; output names stay as written. It runs before type
//! coercion, which then coerces the expressions over those doubles (a decimal
//! minus an average) to doubles too.

use datafusion::arrow::datatypes::DataType;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{DFSchema, Result as DfResult};
use datafusion::logical_expr::expr::{AggregateFunction, WindowFunction};
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::{
    BinaryExpr, Cast, Expr, ExprSchemable, LogicalPlan, Operator, WindowFunctionDefinition,
};
use datafusion::optimizer::AnalyzerRule;

/// The rule; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct DecimalAsDouble;

impl AnalyzerRule for DecimalAsDouble {
    fn name(&self) -> &str {
        "scad_decimal_division_and_average_as_double"
    }

    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> DfResult<LogicalPlan> {
        rewrite_plan(plan).map(|t| t.data)
    }
}

/// Rewrites `node`'s subqueries and inputs, then its own expressions. Only a node
/// that divides or averages is typed (its inputs' schemas merged), and only a node
/// whose expressions or inputs changed has its schema derived anew: a child's output
/// types may have changed where this node's expressions did not. (Typing and
/// re-deriving every node took 2.5 % of planning the 99 TPC-DS queries.)
fn rewrite_plan(node: LogicalPlan) -> DfResult<Transformed<LogicalPlan>> {
    let below = node
        .map_subqueries(rewrite_plan)?
        .transform_sibling(|n| n.map_children(rewrite_plan))?;
    let inputs_changed = below.transformed;
    let node = below.data;
    let here = if divides_or_averages(&node)? {
        let schema = input_schema(&node)?;
        let names = NamePreserver::new(&node);
        node.map_expressions(|e| {
            let saved = names.save(&e);
            let t = e.transform_up(|x| Ok(rewrite(x, &schema)))?;
            Ok(t.update_data(|e| saved.restore(e)))
        })?
    } else {
        Transformed::no(node)
    };
    if inputs_changed || here.transformed {
        Ok(Transformed::yes(here.data.recompute_schema()?))
    } else {
        Ok(here)
    }
}

/// Whether any of `node`'s expressions divides or calls `avg` (what [`rewrite`]
/// may change), without typing them.
fn divides_or_averages(node: &LogicalPlan) -> DfResult<bool> {
    let mut found = false;
    node.apply_expressions(|e| {
        e.apply(|x| {
            found = divides_or_averages_here(x);
            Ok(if found {
                TreeNodeRecursion::Stop
            } else {
                TreeNodeRecursion::Continue
            })
        })
    })?;
    Ok(found)
}

/// The schema a node's expressions are evaluated against: its inputs' columns.
fn input_schema(plan: &LogicalPlan) -> DfResult<DFSchema> {
    let inputs = plan.inputs();
    let Some((first, rest)) = inputs.split_first() else {
        return Ok(plan.schema().as_ref().clone());
    };
    let mut schema = first.schema().as_ref().clone();
    for other in rest {
        schema.merge(other.schema());
    }
    Ok(schema)
}

fn is_decimal(e: &Expr, schema: &DFSchema) -> bool {
    matches!(
        e.get_type(schema),
        Ok(DataType::Decimal32(..)
            | DataType::Decimal64(..)
            | DataType::Decimal128(..)
            | DataType::Decimal256(..))
    )
}

fn double(e: Expr) -> Expr {
    Expr::Cast(Cast::new(Box::new(e), DataType::Float64))
}

/// Whether `e` itself (not its operands) divides or calls `avg`.
fn divides_or_averages_here(e: &Expr) -> bool {
    match e {
        Expr::BinaryExpr(b) => b.op == Operator::Divide,
        Expr::AggregateFunction(a) => a.func.name() == "avg",
        Expr::WindowFunction(w) => {
            matches!(&w.fun, WindowFunctionDefinition::AggregateUDF(f) if f.name() == "avg")
        }
        _ => false,
    }
}

fn rewrite(e: Expr, schema: &DFSchema) -> Transformed<Expr> {
    if !divides_or_averages_here(&e) {
        return Transformed::no(e);
    }
    // A division or an `avg`, as `divides_or_averages_here` says: doubles when an
    // operand or the argument is a decimal.
    match e {
        Expr::BinaryExpr(b) if is_decimal(&b.left, schema) || is_decimal(&b.right, schema) => {
            Transformed::yes(Expr::BinaryExpr(BinaryExpr::new(
                Box::new(double(*b.left)),
                Operator::Divide,
                Box::new(double(*b.right)),
            )))
        }
        Expr::AggregateFunction(mut a)
            if a.params.args.first().is_some_and(|x| is_decimal(x, schema)) =>
        {
            a.params.args = std::mem::take(&mut a.params.args)
                .into_iter()
                .map(double)
                .collect();
            Transformed::yes(Expr::AggregateFunction(AggregateFunction { ..a }))
        }
        Expr::WindowFunction(mut w)
            if w.params.args.first().is_some_and(|x| is_decimal(x, schema)) =>
        {
            w.params.args = std::mem::take(&mut w.params.args)
                .into_iter()
                .map(double)
                .collect();
            Transformed::yes(Expr::WindowFunction(Box::new(WindowFunction { ..*w })))
        }
        other => Transformed::no(other),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use datafusion::arrow::array::{Array, Float64Array};
    use polars::prelude::df;

    use super::*;
    use crate::frame::RemoteFrame;
    use crate::query::test_env::local_env;
    use crate::query::QuerySession;

    #[test]
    fn decimal_quotients_averages_and_arithmetic_over_them_are_doubles() {
        let env = local_env(1, 16 << 20);
        let t = df!("x" => [1i64, 2, 4]).unwrap();
        let session = QuerySession::new(&env).unwrap();
        session
            .register("t", &RemoteFrame::from_polars(&env, &t).unwrap())
            .unwrap();
        // A decimal quotient would be truncated to 2.333333; the difference of a
        // decimal sum and a double average needs both coerced to doubles (with this
        // rule after type coercion, it failed at run time).
        let out = session
            .sql(
                "SELECT sum(p) / 3 AS q, avg(p) AS a, sum(p) - avg(p) AS d \
                 FROM (SELECT CAST(x AS DECIMAL(7, 2)) AS p FROM t)",
            )
            .unwrap();
        let batch = &out.batches()[0];
        let value = |i: usize| {
            assert_eq!(batch.column(i).data_type(), &DataType::Float64);
            let column = batch.column(i).as_any().downcast_ref::<Float64Array>();
            column.unwrap().value(0)
        };
        assert_eq!(value(0), 7.0 / 3.0);
        assert_eq!(value(1), 7.0 / 3.0);
        assert_eq!(value(2), 7.0 - 7.0 / 3.0);
    }
}
