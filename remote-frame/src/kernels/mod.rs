//! Relational kernels over [`RemoteFrame`]s that keep to the env's local memory
//! budget: streaming per-batch work (filter, project, limit), hash joins and
//! group-bys that fall back to grace hash partitioning through remote memory, and
//! in-memory sort.
//!
//! Per-batch and per-partition work is done by Polars (lazy frames collected in
//! memory), so a partition is joined or aggregated at Polars' own speed.

use polars::prelude::{self as pl, col, DataFrame, Expr, IntoLazy, LazyFrame, PlSmallStr};

use crate::env::FrameEnv;
use crate::error::Result;
use crate::frame::{FrameWriter, RemoteFrame};

mod group_by;
mod join;
mod partition;
mod sort;

/// Deepest re-partitioning level before a kernel gives up.
pub const MAX_LEVEL: u32 = 8;
/// Most partitions one partitioning pass makes.
pub const MAX_PARTITIONS: usize = 256;
/// Largest batch a streaming kernel reads at once, whatever the budget.
const STREAM_CAP: u64 = 64 << 20;

/// The joins [`RemoteFrame::join`] performs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinType {
    /// Rows of both sides whose keys match.
    Inner,
    /// Every left row, with the matching right rows or nulls.
    Left,
    /// Left rows that have a match (each once).
    Semi,
    /// Left rows that have no match.
    Anti,
}

impl JoinType {
    fn polars(self) -> pl::JoinType {
        match self {
            JoinType::Inner => pl::JoinType::Inner,
            JoinType::Left => pl::JoinType::Left,
            JoinType::Semi => pl::JoinType::Semi,
            JoinType::Anti => pl::JoinType::Anti,
        }
    }

    fn name(self) -> &'static str {
        match self {
            JoinType::Inner => "inner join",
            JoinType::Left => "left join",
            JoinType::Semi => "semi join",
            JoinType::Anti => "anti join",
        }
    }

    /// Semi and anti joins need only the right side's distinct keys.
    fn keys_only(self) -> bool {
        matches!(self, JoinType::Semi | JoinType::Anti)
    }
}

fn est(df: &DataFrame) -> u64 {
    df.estimated_size() as u64
}

fn names<I, S>(it: I) -> Vec<String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    it.into_iter().map(|s| s.as_ref().to_owned()).collect()
}

fn exprs(cols: &[String]) -> Vec<Expr> {
    cols.iter().map(|c| col(c.as_str())).collect()
}

/// Columns an expression reads.
fn roots(e: &[Expr]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for x in e {
        for n in polars_plan::utils::expr_to_leaf_column_names(x) {
            if !out.iter().any(|o| o == n.as_str()) {
                out.push(n.to_string());
            }
        }
    }
    out
}

/// Partitions for one pass: enough for each to fit the budget, but no more than
/// keeps the pieces of one streamed batch at 16 rows or more on average (tiny
/// pieces cost more in per-chunk overhead than another level of partitioning).
fn parts_for(frame: &RemoteFrame, bytes: u64, need: u64, budget: u64, batch: u64) -> usize {
    let per = (budget / 10 * 8).max(1);
    let wanted = need.div_ceil(per) as usize;
    let row_bytes = (bytes / frame.rows().max(1) as u64).max(1);
    let batch_rows = (batch / row_bytes).max(1) as usize;
    wanted.min(batch_rows / 16).clamp(2, MAX_PARTITIONS)
}

/// One row per distinct value of `keys` (any of its rows).
fn distinct_on(df: DataFrame, keys: &[String]) -> Result<DataFrame> {
    let sel = pl::cols(
        keys.iter()
            .map(|s| PlSmallStr::from(s.as_str()))
            .collect::<Vec<_>>(),
    );
    Ok(df
        .lazy()
        .unique(Some(sel), pl::UniqueKeepStrategy::Any)
        .collect()?)
}

fn print_key(df: &DataFrame, keys: &[String]) -> String {
    keys.iter()
        .map(|k| {
            df.column(k)
                .ok()
                .and_then(|c| c.get(0).ok().map(|v| format!("{k}={v}")))
                .unwrap_or_default()
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn empty_of(frame: &RemoteFrame, cols: &[String]) -> Result<DataFrame> {
    frame.polars_chunks(&frame.column_indices(cols)?, 0..0)
}

impl RemoteFrame {
    /// The budget in bytes for sizing batches and partitions (no limit sizes as the
    /// largest).
    fn env_budget(&self) -> u64 {
        self.env().budget().saturating_bytes()
    }

    fn stream_bytes(&self) -> u64 {
        (self.env_budget() / 4).clamp(1, STREAM_CAP)
    }

    /// Applies `f` to every batch (a Polars lazy frame of a few chunks) and writes
    /// the results to a new frame: any row-wise Polars query (filters, projections,
    /// arithmetic) streams through the budget this way.
    ///
    /// # Errors
    /// Polars errors from `f`; transport and allocation errors.
    pub fn map_batches<F>(&self, f: F) -> Result<RemoteFrame>
    where
        F: Fn(LazyFrame) -> LazyFrame,
    {
        let _t = self.env().timer();
        self.map_batches_cols(&self.column_names(), &f)
    }

    fn map_batches_cols(
        &self,
        cols: &[String],
        f: &dyn Fn(LazyFrame) -> LazyFrame,
    ) -> Result<RemoteFrame> {
        let env = self.env();
        let mut w = FrameWriter::new(env).coalescing();
        for b in self.batches(Some(cols), self.stream_bytes())? {
            let b = b?;
            let mut held = env.hold(est(&b));
            let inb = est(&b);
            let out = f(b.lazy()).collect()?;
            held.set(inb + est(&out));
            w.push(&out)?;
        }
        if w.rows() == 0 {
            let out = f(empty_of(self, cols)?.lazy()).collect()?;
            w.push(&out)?;
        }
        w.finish()
    }

    /// Rows for which `predicate` is true, e.g. `col("d_year").eq(lit(2000))`.
    ///
    /// # Errors
    /// As [`RemoteFrame::map_batches`]; Polars reports unknown columns by name.
    pub fn filter(&self, predicate: Expr) -> Result<RemoteFrame> {
        self.check_columns(std::slice::from_ref(&predicate))?;
        self.map_batches(move |lf| lf.filter(predicate.clone()))
    }

    /// The given expressions as the new columns (a projection; only the columns the
    /// expressions read are moved).
    ///
    /// # Errors
    /// [`Error::UnknownColumn`], and as [`RemoteFrame::map_batches`].
    pub fn select<E: AsRef<[Expr]>>(&self, exprs: E) -> Result<RemoteFrame> {
        let e = exprs.as_ref().to_vec();
        let mut cols = self.check_columns(&e)?;
        if cols.is_empty() {
            // Literals only: still one row per input row, so read the narrowest column.
            cols = self.column_names().into_iter().take(1).collect();
        }
        let _t = self.env().timer();
        self.map_batches_cols(&cols, &move |lf| lf.select(e.clone()))
    }

    /// All columns plus (or replaced by) the given expressions.
    ///
    /// # Errors
    /// As [`RemoteFrame::select`].
    pub fn with_columns<E: AsRef<[Expr]>>(&self, exprs: E) -> Result<RemoteFrame> {
        let e = exprs.as_ref().to_vec();
        self.check_columns(&e)?;
        self.map_batches(move |lf| lf.with_columns(e.clone()))
    }

    fn check_columns(&self, e: &[Expr]) -> Result<Vec<String>> {
        let cols = roots(e);
        self.column_indices(&cols)?;
        Ok(cols)
    }

    /// The first `n` rows.
    ///
    /// # Errors
    /// Transport and allocation errors.
    pub fn limit(&self, n: usize) -> Result<RemoteFrame> {
        let _t = self.env().timer();
        let env = self.env();
        let mut w = FrameWriter::new(env);
        let mut left = n;
        for b in self.batches::<&str>(None, self.stream_bytes())? {
            if left == 0 {
                break;
            }
            let b = b?;
            let _held = env.hold(est(&b));
            let take = left.min(b.height());
            w.push(&b.slice(0, take))?;
            left -= take;
        }
        if w.rows() == 0 {
            w.push(&empty_of(self, &self.column_names())?)?;
        }
        w.finish()
    }

    pub(crate) fn from_polars_untimed(env: &FrameEnv, df: &DataFrame) -> Result<RemoteFrame> {
        let mut w = FrameWriter::new(env);
        w.push(df)?;
        w.finish()
    }
}
