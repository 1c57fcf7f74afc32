//! The RemoteFrame verbs: [`RemoteFrame::filter`], [`RemoteFrame::select`],
//! [`RemoteFrame::with_columns`], [`RemoteFrame::join`], [`RemoteFrame::group_by`],
//! [`RemoteFrame::distinct`], [`RemoteFrame::sort`], [`RemoteFrame::sort_limit`] and
//! [`RemoteFrame::limit`]. Each one plans a [`LazyQuery`] over the frame(s) in a
//! session of the frame's env and writes the answer to a new frame, so a verb runs
//! through the same planner, scans, operators, spilling and budget as SQL.
//!
//! Expressions are DataFusion's ([`crate::query::expr`]); column names and answers
//! follow Polars, whose frames the Python package's users compare with: joins keep
//! the left key columns (inner, left) or the right ones (right), give a right
//! column whose name is taken the suffix `_right`, and check that key types are
//! equal; row-wise verbs and sorts keep the frame's order (a sort is stable);
//! `first`/`last` aggregates take rows in the frame's order.

use std::collections::HashSet;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, DFSchema};
use datafusion::logical_expr::{Expr, JoinType, SortExpr};

use super::{LazyQuery, QuerySession};
use crate::error::{Error, Result};
use crate::frame::RemoteFrame;
use crate::meta::ColumnType;

/// The table name of the frame a verb runs on (its left side for joins).
const LEFT: &str = "__scad_left";
/// The table name of a join's right side.
const RIGHT: &str = "__scad_right";
/// The row index column verbs that need the frame's order add to their table.
const ROW: &str = "__scad_row";
/// The suffix Polars gives a right column whose name the output already has.
const RIGHT_SUFFIX: &str = "_right";

/// An unqualified column reference that takes `name` as it is (no parsing of
/// dots or quotes).
fn column(name: &str) -> Expr {
    Expr::Column(Column::new_unqualified(name))
}

fn qualified(table: &str, name: &str) -> Expr {
    Expr::Column(Column::new(Some(table), name))
}

/// Whether `e` contains an aggregate function.
pub(crate) fn has_aggregate(e: &Expr) -> bool {
    e.exists(|x| Ok(matches!(x, Expr::AggregateFunction(_))))
        .unwrap_or(false)
}

/// Whether `e` contains a `first_value` or `last_value` aggregate.
fn has_first_or_last(e: &Expr) -> bool {
    e.exists(|x| {
        Ok(matches!(x, Expr::AggregateFunction(f)
            if matches!(f.func.name(), "first_value" | "last_value")))
    })
    .unwrap_or(false)
}

/// The expression's output name: its alias, else DataFusion's name for it.
fn output_name(e: &Expr) -> String {
    match e {
        Expr::Alias(a) => a.name.clone(),
        Expr::Column(c) => c.name.clone(),
        other => other.schema_name().to_string(),
    }
}

/// Orders `first_value`/`last_value` aggregates without an ORDER BY by the row
/// index, so they take rows in the frame's order however the plan is partitioned.
fn in_frame_order(e: Expr) -> Result<Expr> {
    let ordered = e.transform_up(|x| match x {
        Expr::AggregateFunction(mut f)
            if matches!(f.func.name(), "first_value" | "last_value")
                && f.params.order_by.is_empty() =>
        {
            f.params.order_by = vec![column(ROW).sort(true, false)];
            Ok(Transformed::yes(Expr::AggregateFunction(f)))
        }
        other => Ok(Transformed::no(other)),
    });
    Ok(ordered.map_err(super::query_error)?.data)
}

/// The sides of a join: which left and right columns the output keeps, in order,
/// each with its output name (Polars' rules).
fn join_columns(
    how: JoinType,
    left: &[String],
    right: &[String],
    left_keys: &[String],
    right_keys: &[String],
) -> Result<Vec<Expr>> {
    let (keep_left, keep_right): (Vec<&String>, Vec<&String>) = match how {
        JoinType::Inner | JoinType::Left => (
            left.iter().collect(),
            right.iter().filter(|c| !right_keys.contains(c)).collect(),
        ),
        JoinType::Right => (
            left.iter().filter(|c| !left_keys.contains(c)).collect(),
            right.iter().collect(),
        ),
        JoinType::Full => (left.iter().collect(), right.iter().collect()),
        JoinType::LeftSemi | JoinType::LeftAnti => (left.iter().collect(), Vec::new()),
        JoinType::RightSemi | JoinType::RightAnti => (Vec::new(), right.iter().collect()),
        JoinType::LeftMark | JoinType::RightMark => {
            return Err(Error::InvalidArgument(format!(
                "{how} joins are not a RemoteFrame join: use inner, left, right, full, semi or anti"
            )))
        }
    };
    let mut taken: HashSet<String> = keep_left.iter().map(|c| (*c).clone()).collect();
    let mut out: Vec<Expr> = keep_left
        .into_iter()
        .map(|c| qualified(LEFT, c).alias(c))
        .collect();
    for c in keep_right {
        let mut name = c.clone();
        while taken.contains(&name) {
            name.push_str(RIGHT_SUFFIX);
        }
        taken.insert(name.clone());
        out.push(qualified(RIGHT, c).alias(name));
    }
    Ok(out)
}

/// A session for one verb: `ordered` ones run in one partition, so the answer keeps
/// the frame's row order.
fn session_for(frame: &RemoteFrame, ordered: bool) -> Result<QuerySession> {
    if ordered {
        QuerySession::with_partitions(frame.env(), 1)
    } else {
        QuerySession::new(frame.env())
    }
}

impl RemoteFrame {
    /// Runs `build` over this frame as table [`LEFT`] (with the row index column
    /// when `row_index`) and writes the answer to a new frame of this frame's env.
    fn run_verb(
        &self,
        ordered: bool,
        row_index: bool,
        build: impl for<'s> FnOnce(LazyQuery<'s>) -> Result<LazyQuery<'s>>,
    ) -> Result<RemoteFrame> {
        let _t = self.env().timer();
        let session = session_for(self, ordered)?;
        if row_index {
            session.register_with_row_index(LEFT, self, ROW)?;
        } else {
            session.register(LEFT, self)?;
        }
        let query = build(session.table(LEFT)?)?;
        Ok(query.collect_frame(self.env())?.0)
    }

    /// The frame's columns as expressions (without the row index).
    fn own_columns(&self) -> Vec<Expr> {
        self.column_names().iter().map(|c| column(c)).collect()
    }

    /// Rows for which `predicate` is true, in the frame's order, e.g.
    /// `col("d_year").eq(lit(2000))`.
    ///
    /// # Errors
    /// [`Error::UnknownName`] for unknown columns; [`Error::Query`] for a predicate
    /// that is not boolean; as [`QuerySession::sql`].
    pub fn filter(&self, predicate: Expr) -> Result<RemoteFrame> {
        self.run_verb(true, false, |q| q.filter(predicate.unalias()))
    }

    /// The given expressions as the new columns, in the frame's order (only the
    /// columns they read are moved). Expressions that are all aggregations give one
    /// row, as in Polars.
    ///
    /// # Errors
    /// As [`RemoteFrame::filter`].
    pub fn select<E: IntoIterator<Item = Expr>>(&self, exprs: E) -> Result<RemoteFrame> {
        let exprs: Vec<Expr> = exprs.into_iter().collect();
        if !exprs.is_empty() && exprs.iter().all(has_aggregate) {
            return self.aggregate(Vec::new(), exprs);
        }
        self.run_verb(true, false, |q| q.select(exprs))
    }

    /// All columns plus (or, by name, replaced by) the given expressions, all
    /// computed from this frame's columns, in the frame's order.
    ///
    /// # Errors
    /// As [`RemoteFrame::filter`].
    pub fn with_columns<E: IntoIterator<Item = Expr>>(&self, exprs: E) -> Result<RemoteFrame> {
        let mut added: Vec<(String, Expr)> = Vec::new();
        for e in exprs {
            let name = output_name(&e);
            let body = match e {
                Expr::Alias(a) => *a.expr,
                other => other,
            };
            match added.iter_mut().find(|(n, _)| *n == name) {
                Some(slot) => slot.1 = body,
                None => added.push((name, body)),
            }
        }
        let mut out: Vec<Expr> = Vec::new();
        for c in self.column_names() {
            match added.iter().position(|(n, _)| *n == c) {
                Some(at) => {
                    let (name, body) = added.remove(at);
                    out.push(body.alias(name));
                }
                None => out.push(column(&c)),
            }
        }
        out.extend(added.into_iter().map(|(name, body)| body.alias(name)));
        self.run_verb(true, false, |q| q.select(out))
    }

    /// The first `n` rows.
    ///
    /// # Errors
    /// As [`QuerySession::sql`].
    pub fn limit(&self, n: usize) -> Result<RemoteFrame> {
        self.run_verb(true, false, |q| q.limit(0, Some(n)))
    }

    /// Sorts by `by` (`col("x").sort(ascending, nulls_first)`); rows that tie keep
    /// the frame's order. A sort larger than the budget spills sorted runs to memory
    /// elements and merges them.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for no sort keys; as [`RemoteFrame::filter`].
    pub fn sort(&self, by: Vec<SortExpr>) -> Result<RemoteFrame> {
        self.sorted(by, None)
    }

    /// The first `n` rows of [`RemoteFrame::sort`]: a top-k that holds `n` rows, not
    /// the frame.
    ///
    /// # Errors
    /// As [`RemoteFrame::sort`].
    pub fn sort_limit(&self, by: Vec<SortExpr>, n: usize) -> Result<RemoteFrame> {
        self.sorted(by, Some(n))
    }

    fn sorted(&self, mut by: Vec<SortExpr>, limit: Option<usize>) -> Result<RemoteFrame> {
        if by.is_empty() {
            return Err(Error::InvalidArgument(
                "sort needs at least one sort key".into(),
            ));
        }
        // The row index breaks ties: the order is total, so partitions sorted apart
        // and merged give the frame's order among equal keys.
        by.push(column(ROW).sort(true, false));
        let columns = self.own_columns();
        self.run_verb(false, true, move |q| {
            let q = q.sort(by)?;
            let q = match limit {
                Some(n) => q.limit(0, Some(n))?,
                None => q,
            };
            q.select(columns)
        })
    }

    /// One row per distinct value of `subset` (any of its rows), or distinct rows
    /// when `subset` is `None`.
    ///
    /// # Errors
    /// As [`RemoteFrame::filter`].
    pub fn distinct<S: AsRef<str>>(&self, subset: Option<&[S]>) -> Result<RemoteFrame> {
        match subset {
            None => self.run_verb(false, false, |q| q.distinct()),
            Some(keys) => {
                let on: Vec<Expr> = keys.iter().map(|k| column(k.as_ref())).collect();
                let columns = self.own_columns();
                self.run_verb(false, false, move |q| q.distinct_on(on, columns))
            }
        }
    }

    /// Groups by the `keys` columns and computes `aggs` per group (e.g.
    /// `sum(col("qty")).alias("total")`): the key columns, then one column per
    /// aggregation. A group-by larger than the budget partitions its state by key to
    /// memory elements.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for no keys; as [`RemoteFrame::filter`].
    pub fn group_by<S, E>(&self, keys: &[S], aggs: E) -> Result<RemoteFrame>
    where
        S: AsRef<str>,
        E: IntoIterator<Item = Expr>,
    {
        if keys.is_empty() {
            return Err(Error::InvalidArgument(
                "group_by needs at least one key column".into(),
            ));
        }
        let keys: Vec<Expr> = keys.iter().map(|k| column(k.as_ref())).collect();
        self.aggregate(keys, aggs.into_iter().collect())
    }

    fn aggregate(&self, keys: Vec<Expr>, aggs: Vec<Expr>) -> Result<RemoteFrame> {
        let row_index = aggs.iter().any(has_first_or_last);
        let aggs = if row_index {
            aggs.into_iter()
                .map(in_frame_order)
                .collect::<Result<Vec<_>>>()?
        } else {
            aggs
        };
        // DataFusion takes aggregate calls inside casts and arithmetic as they are.
        self.run_verb(false, row_index, move |q| q.aggregate(keys, aggs))
    }

    /// Joins `right` where `left_on` equals `right_on` (pairwise, one or more
    /// columns of equal types; null keys match nothing). `how`: inner, left, right,
    /// full, left semi or left anti (and right semi/anti, keeping the right side's
    /// rows). Output columns as Polars gives them: left then right, the right key
    /// columns dropped for inner and left joins and the left ones for right joins,
    /// a right column whose name is taken suffixed `_right`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for key lists of different lengths or none, or a
    /// mark join; [`Error::UnknownColumn`] for an unknown key; [`Error::TypeMismatch`]
    /// for keys of different types; as [`RemoteFrame::filter`].
    pub fn join<L, R, S1, S2>(
        &self,
        right: &RemoteFrame,
        left_on: L,
        right_on: R,
        how: JoinType,
    ) -> Result<RemoteFrame>
    where
        L: IntoIterator<Item = S1>,
        R: IntoIterator<Item = S2>,
        S1: AsRef<str>,
        S2: AsRef<str>,
    {
        let left_keys: Vec<String> = left_on.into_iter().map(|s| s.as_ref().to_owned()).collect();
        let right_keys: Vec<String> = right_on
            .into_iter()
            .map(|s| s.as_ref().to_owned())
            .collect();
        if left_keys.is_empty() || left_keys.len() != right_keys.len() {
            return Err(Error::InvalidArgument(format!(
                "a join needs as many right key columns as left ones, at least one: {} left, {} right",
                left_keys.len(),
                right_keys.len()
            )));
        }
        let left_types = key_types(self, &left_keys)?;
        let right_types = key_types(right, &right_keys)?;
        for (i, (l, r)) in left_types.iter().zip(&right_types).enumerate() {
            if l != r {
                return Err(Error::TypeMismatch {
                    column: format!("{} = {}", left_keys[i], right_keys[i]),
                    expected: l.to_string(),
                    found: r.to_string(),
                });
            }
        }
        let output = join_columns(
            how,
            &self.column_names(),
            &right.column_names(),
            &left_keys,
            &right_keys,
        )?;
        let on: Vec<Expr> = left_keys
            .iter()
            .zip(&right_keys)
            .map(|(l, r)| qualified(LEFT, l).eq(qualified(RIGHT, r)))
            .collect();
        let _t = self.env().timer();
        let session = session_for(self, false)?;
        session.register(LEFT, self)?;
        session.register(RIGHT, right)?;
        let query = session
            .table(LEFT)?
            .join_on(session.table(RIGHT)?, how, on)?
            .select(output)?;
        Ok(query.collect_frame(self.env())?.0)
    }
}

/// The stored types of `frame`'s columns `keys`.
fn key_types(frame: &RemoteFrame, keys: &[String]) -> Result<Vec<ColumnType>> {
    let indices = frame.column_indices(keys)?;
    Ok(indices
        .into_iter()
        .map(|i| frame.meta().schema[i].dtype)
        .collect())
}

/// The schema a verb's expressions are typed against: `frame`'s columns,
/// unqualified.
///
/// # Errors
/// As [`RemoteFrame::arrow_schema`]; [`Error::Query`] when DataFusion refuses it.
pub fn frame_schema(frame: &RemoteFrame) -> Result<DFSchema> {
    let schema = frame.arrow_schema()?;
    DFSchema::try_from(schema.as_ref().clone()).map_err(super::query_error)
}
