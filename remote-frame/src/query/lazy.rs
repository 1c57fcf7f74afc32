//! The lazy API: [`LazyQuery`], a query built verb by verb (filter, select, join,
//! aggregate, sort, window, ...) over the session's tables, planned and run exactly as
//! SQL is — the same optimizer, scans, budget and spilling.
//!
//! Expressions are DataFusion's ([`expr`]: `col`, `lit`, the aggregate and window
//! functions), not an expression language of ours.
//!
//! ```
//! use std::sync::Arc;
//! use arrow_array::{Int64Array, RecordBatch};
//! use scad_core::transport::LocalTransport;
//! use scad_remote_array::MemoryElements;
//! use scad_remote_frame::query::expr::{col, lit, sum};
//! use scad_remote_frame::{Budget, FrameEnv, QuerySession, RemoteFrame};
//!
//! let elements = Arc::new(MemoryElements::new());
//! elements.add("mem0", Arc::new(LocalTransport::new(64 << 20)?))?;
//! let env = FrameEnv::new(elements).with_budget(Budget::bytes(16 << 20)?);
//! let sales = RecordBatch::try_from_iter([
//!     ("item", Arc::new(Int64Array::from(vec![1, 2, 2, 3])) as _),
//!     ("qty", Arc::new(Int64Array::from(vec![5, 1, 2, 7])) as _),
//! ])?;
//! let sales = RemoteFrame::from_record_batches(&env, &[sales])?;
//! let session = QuerySession::new(&env)?;
//! session.register("sales", &sales)?;
//! let out = session
//!     .table("sales")?
//!     .filter(col("qty").gt(lit(1i64)))?
//!     .aggregate(vec![col("item")], vec![sum(col("qty")).alias("total")])?
//!     .sort(vec![col("item").sort(true, false)])?
//!     .collect()?;
//! assert_eq!(out.rows(), 3);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use datafusion::dataframe::DataFrame;
use datafusion::logical_expr::{Expr, JoinType, SortExpr};

use super::{query_error, QueryOutput, QuerySession, QueryStats};
use crate::env::FrameEnv;
use crate::error::Result;
use crate::frame::RemoteFrame;

/// DataFusion's expression builders for [`LazyQuery`]: columns, literals, the
/// aggregate and window functions.
pub mod expr {
    pub use datafusion::functions_aggregate::expr_fn::{
        avg, count, count_distinct, first_value, last_value, max, median, min, stddev, sum,
        var_sample,
    };
    pub use datafusion::functions_window::expr_fn::{rank, row_number};
    pub use datafusion::logical_expr::{Expr, ExprFunctionExt, JoinType, SortExpr};
    pub use datafusion::prelude::{col, lit};
}

/// A query being built over a session's tables; nothing runs until
/// [`LazyQuery::collect`]. Each verb checks names and types at once and returns a new
/// query.
#[derive(Debug, Clone)]
pub struct LazyQuery<'s> {
    session: &'s QuerySession,
    df: DataFrame,
}

impl QuerySession {
    /// Table `name` as the start of a lazy query.
    ///
    /// # Errors
    /// [`crate::Error::UnknownName`] for an unknown table.
    pub fn table(&self, name: &str) -> Result<LazyQuery<'_>> {
        let df = self.runtime.block_on(self.ctx.table(name)).map_err(|e| {
            match self.ctx.table_exist(name) {
                Ok(false) => self.unknown_table_error(name.to_owned()),
                _ => query_error(e),
            }
        })?;
        Ok(LazyQuery { session: self, df })
    }
}

impl<'s> LazyQuery<'s> {
    fn next(
        self,
        verb: impl FnOnce(DataFrame) -> datafusion::error::Result<DataFrame>,
    ) -> Result<Self> {
        Ok(LazyQuery {
            session: self.session,
            df: verb(self.df).map_err(query_error)?,
        })
    }

    /// Rows where `predicate` holds.
    ///
    /// # Errors
    /// Unknown columns, a predicate that is not boolean.
    pub fn filter(self, predicate: Expr) -> Result<Self> {
        self.next(|df| df.filter(predicate))
    }

    /// These expressions as the columns.
    ///
    /// # Errors
    /// Unknown columns, type errors.
    pub fn select(self, exprs: Vec<Expr>) -> Result<Self> {
        self.next(|df| df.select(exprs))
    }

    /// Adds (or replaces) column `name` computed by `expr`.
    ///
    /// # Errors
    /// Unknown columns, type errors.
    pub fn with_column(self, name: &str, expr: Expr) -> Result<Self> {
        self.next(|df| df.with_column(name, expr))
    }

    /// Joins `right` on equal `left_cols` / `right_cols` (in pairs), of any kind
    /// (inner, left, right, full, semi, anti), with an optional extra `filter`.
    ///
    /// # Errors
    /// Unknown columns, key lists of different lengths, ambiguous names.
    pub fn join(
        self,
        right: LazyQuery<'_>,
        how: JoinType,
        left_cols: &[&str],
        right_cols: &[&str],
        filter: Option<Expr>,
    ) -> Result<Self> {
        self.next(|df| df.join(right.df, how, left_cols, right_cols, filter))
    }

    /// Joins `right` where the expressions `on` hold (equalities of a left and a
    /// right column become hash join keys; null keys match nothing), of any kind.
    ///
    /// # Errors
    /// Unknown or ambiguous columns.
    pub fn join_on(self, right: LazyQuery<'_>, how: JoinType, on: Vec<Expr>) -> Result<Self> {
        self.next(|df| df.join_on(right.df, how, on))
    }

    /// One row per distinct value of `on` (any of its rows), with the columns
    /// `select`.
    ///
    /// # Errors
    /// Unknown columns.
    pub fn distinct_on(self, on: Vec<Expr>, select: Vec<Expr>) -> Result<Self> {
        self.next(|df| df.distinct_on(on, select, None))
    }

    /// Groups by `group` and computes `aggregates` per group (no `group`: one row).
    ///
    /// # Errors
    /// Unknown columns, non-aggregate expressions among `aggregates`.
    pub fn aggregate(self, group: Vec<Expr>, aggregates: Vec<Expr>) -> Result<Self> {
        self.next(|df| df.aggregate(group, aggregates))
    }

    /// Adds window-function columns (e.g. `rank()` over a partition and order).
    ///
    /// # Errors
    /// Unknown columns, expressions that are not window functions.
    pub fn window(self, exprs: Vec<Expr>) -> Result<Self> {
        self.next(|df| df.window(exprs))
    }

    /// Sorts by `by` (`col("x").sort(ascending, nulls_first)`).
    ///
    /// # Errors
    /// Unknown columns.
    pub fn sort(self, by: Vec<SortExpr>) -> Result<Self> {
        self.next(|df| df.sort(by))
    }

    /// Distinct rows.
    ///
    /// # Errors
    /// Planning errors.
    pub fn distinct(self) -> Result<Self> {
        self.next(DataFrame::distinct)
    }

    /// Skips `skip` rows, then keeps at most `fetch` (`None`: all).
    ///
    /// # Errors
    /// Planning errors.
    pub fn limit(self, skip: usize, fetch: Option<usize>) -> Result<Self> {
        self.next(|df| df.limit(skip, fetch))
    }

    /// The rows of both (UNION ALL); `distinct`: without duplicates (UNION).
    ///
    /// # Errors
    /// Schemas that do not line up.
    pub fn union(self, other: LazyQuery<'_>, distinct: bool) -> Result<Self> {
        self.next(|df| {
            if distinct {
                df.union_distinct(other.df)
            } else {
                df.union(other.df)
            }
        })
    }

    /// The physical plan (EXPLAIN), without running.
    ///
    /// # Errors
    /// Planning errors.
    pub fn explain(&self) -> Result<String> {
        let (_, physical) = self.session.plan_logical(self.df.logical_plan(), false)?;
        let text = datafusion::physical_plan::displayable(physical.as_ref())
            .indent(true)
            .to_string();
        Ok(text)
    }

    /// Plans and runs the query as [`LazyQuery::collect`] does, writing the answer
    /// batch by batch to a new frame of `env` (its memory elements, chunk size and
    /// counters) instead of collecting it locally: an answer larger than the budget
    /// never passes through local memory whole.
    ///
    /// # Errors
    /// As [`QuerySession::sql`]; transport and allocation errors of the writes (the
    /// part written is freed).
    pub fn collect_frame(self, env: &FrameEnv) -> Result<(RemoteFrame, QueryStats)> {
        let plan = self.df.logical_plan().clone();
        self.session
            .run_to_frame(|| self.session.plan_logical(&plan, false), env)
    }

    /// The query's output schema (names and types), without running it.
    pub fn schema(&self) -> &datafusion::common::DFSchema {
        self.df.schema()
    }

    /// Plans and runs the query within the session's budget, as
    /// [`QuerySession::sql`] does.
    ///
    /// # Errors
    /// As [`QuerySession::sql`].
    pub fn collect(self) -> Result<QueryOutput> {
        let plan = self.df.logical_plan().clone();
        self.session.run(|| self.session.plan_logical(&plan, false))
    }
}
