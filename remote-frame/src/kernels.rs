//! Relational kernels over [`RemoteFrame`]s that keep to the env's local memory
//! budget: streaming per-batch work (filter, project, limit), hash joins and
//! group-bys that fall back to grace hash partitioning through remote memory, and
//! in-memory sort.
//!
//! Per-batch and per-partition work is done by Polars (lazy frames collected in
//! memory), so a partition is joined or aggregated at Polars' own speed.

use polars::prelude::{
    self as pl, col, DataFrame, Expr, IntoLazy, JoinArgs, LazyFrame, PlSmallStr, Schema,
    SortMultipleOptions, UniqueKeepStrategy,
};

use rayon::prelude::*;

use crate::env::FrameEnv;
use crate::error::{Error, Result};
use crate::frame::{FrameWriter, RemoteFrame};

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

fn empty_of(frame: &RemoteFrame, cols: &[String]) -> DataFrame {
    let s = frame.schema();
    let sub: Schema = cols
        .iter()
        .filter_map(|c| s.get(c).map(|t| (PlSmallStr::from(c.as_str()), t.clone())))
        .collect();
    DataFrame::empty_with_schema(&sub)
}

impl RemoteFrame {
    fn env_budget(&self) -> u64 {
        self.env().budget()
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
            let out = f(empty_of(self, cols).lazy()).collect()?;
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
            w.push(&empty_of(self, &self.column_names()))?;
        }
        w.finish()
    }

    /// Sorts by the named columns. The frame (twice: input and sorted copy) must fit
    /// the budget; see [`RemoteFrame::sort_limit`] for a top-k that streams.
    ///
    /// # Errors
    /// [`Error::BudgetExceeded`] when the frame does not fit; [`Error::UnknownColumn`].
    pub fn sort<S: AsRef<str>>(
        &self,
        by: &[S],
        options: SortMultipleOptions,
    ) -> Result<RemoteFrame> {
        let _t = self.env().timer();
        let by = names(by);
        self.column_indices(&by)?;
        let need = 2 * self.data_bytes();
        if need > self.env_budget() {
            return Err(Error::BudgetExceeded {
                what: format!("sorting {} rows in memory", self.rows()),
                need,
                budget: self.env_budget(),
            });
        }
        let df = self.to_polars()?;
        let mut held = self.env().hold(est(&df));
        let out = df
            .lazy()
            .sort(
                by.iter()
                    .map(|s| PlSmallStr::from(s.as_str()))
                    .collect::<Vec<_>>(),
                options,
            )
            .collect()?;
        held.set(2 * est(&out));
        RemoteFrame::from_polars_untimed(self.env(), &out)
    }

    /// The first `n` rows in the order of `by`: keeps only the best `n` rows while
    /// streaming, so it needs little memory whatever the frame's size.
    ///
    /// # Errors
    /// [`Error::UnknownColumn`], Polars, transport and allocation errors.
    pub fn sort_limit<S: AsRef<str>>(
        &self,
        by: &[S],
        options: SortMultipleOptions,
        n: usize,
    ) -> Result<RemoteFrame> {
        let _t = self.env().timer();
        let by: Vec<PlSmallStr> = names(by)
            .iter()
            .map(|s| PlSmallStr::from(s.as_str()))
            .collect();
        self.column_indices(&by.iter().map(|s| s.as_str()).collect::<Vec<_>>())?;
        let env = self.env();
        let mut best = empty_of(self, &self.column_names());
        let mut held = env.hold(0);
        for b in self.batches::<&str>(None, self.stream_bytes())? {
            let b = b?;
            held.set(est(&best) + 2 * est(&b));
            let both = pl::concat([best.lazy(), b.lazy()], pl::UnionArgs::default())?;
            best = both
                .sort(by.clone(), options.clone())
                .limit(n as pl::IdxSize)
                .collect()?;
        }
        held.set(est(&best));
        RemoteFrame::from_polars_untimed(env, &best)
    }

    pub(crate) fn from_polars_untimed(env: &FrameEnv, df: &DataFrame) -> Result<RemoteFrame> {
        let mut w = FrameWriter::new(env);
        w.push(df)?;
        w.finish()
    }

    /// Distinct rows (over `subset` of the columns, keeping any one row per distinct
    /// subset; over all columns if `None`). Grace-partitioned like
    /// [`RemoteFrame::group_by`] when it does not fit the budget.
    ///
    /// # Errors
    /// As [`RemoteFrame::group_by`].
    pub fn distinct<S: AsRef<str>>(&self, subset: Option<&[S]>) -> Result<RemoteFrame> {
        let _t = self.env().timer();
        let all = self.column_names();
        let keys = subset.map(names).unwrap_or_else(|| all.clone());
        self.column_indices(&keys)?;
        let k2 = keys.clone();
        let f = move |df: DataFrame| -> Result<DataFrame> {
            let sel = pl::cols(
                k2.iter()
                    .map(|s| PlSmallStr::from(s.as_str()))
                    .collect::<Vec<_>>(),
            );
            Ok(df
                .lazy()
                .unique(Some(sel), UniqueKeepStrategy::Any)
                .collect()?)
        };
        self.partitioned("distinct", &keys, &all, &f, true)
    }

    /// Groups by `keys` and evaluates the aggregations, e.g.
    /// `[col("x").sum(), col("y").mean(), col("z").n_unique(), col("x").count()]`.
    /// When the grouped columns do not fit the budget, rows are hash-partitioned by
    /// key into remote memory and each partition is aggregated on its own (every
    /// group lives in exactly one partition, so any aggregation is exact).
    ///
    /// # Errors
    /// [`Error::UnknownColumn`]; [`Error::Skew`] when one group alone exceeds the
    /// budget; Polars, transport and allocation errors.
    pub fn group_by<S: AsRef<str>, E: AsRef<[Expr]>>(
        &self,
        keys: &[S],
        aggs: E,
    ) -> Result<RemoteFrame> {
        let _t = self.env().timer();
        let keys = names(keys);
        if keys.is_empty() {
            return Err(Error::InvalidArgument(
                "group_by needs at least one key".into(),
            ));
        }
        let aggs = aggs.as_ref().to_vec();
        let mut cols = keys.clone();
        for r in roots(&aggs) {
            if !cols.contains(&r) {
                cols.push(r);
            }
        }
        self.column_indices(&cols)?;
        let k2 = keys.clone();
        let f = move |df: DataFrame| -> Result<DataFrame> {
            Ok(df.lazy().group_by(exprs(&k2)).agg(aggs.clone()).collect()?)
        };
        self.partitioned("group-by", &keys, &cols, &f, false)
    }

    /// Runs `f` over the whole of `cols` if it fits the budget, else over hash
    /// partitions of `keys`, and writes the union of the results.
    fn partitioned(
        &self,
        kernel: &'static str,
        keys: &[String],
        cols: &[String],
        f: &dyn Fn(DataFrame) -> Result<DataFrame>,
        streamable: bool,
    ) -> Result<RemoteFrame> {
        let env = self.env();
        let mut w = FrameWriter::new(env).coalescing();
        let job = Partitioned {
            kernel,
            keys,
            cols,
            f,
            streamable,
        };
        job.run(self, 0, String::new(), None, &mut w)?;
        if w.rows() == 0 {
            let out = f(empty_of(self, cols))?;
            w.push(&out)?;
        }
        w.finish()
    }

    /// Fails with [`Error::Skew`] when the most frequent key of this (partition)
    /// frame holds too much of the budget to be split by hashing, or when the last
    /// partitioning pass put every row of the parent here (all rows share one key).
    fn check_skew(
        &self,
        kernel: &'static str,
        keys: &[String],
        bytes: u64,
        level: u32,
        path: &str,
        parent_rows: Option<usize>,
    ) -> Result<()> {
        if let Some((key, key_bytes)) = self.skewed_key(keys, bytes, parent_rows)? {
            return Err(Error::Skew {
                kernel,
                partition: if path.is_empty() {
                    "/".into()
                } else {
                    path.to_owned()
                },
                level,
                key,
                bytes: key_bytes,
                budget: self.env_budget(),
            });
        }
        Ok(())
    }

    /// The key (printed) and its bytes if one key is too large to split by hashing.
    fn skewed_key(
        &self,
        keys: &[String],
        bytes: u64,
        parent_rows: Option<usize>,
    ) -> Result<Option<(String, u64)>> {
        if parent_rows == Some(self.rows()) {
            // Re-hashing with a new seed moved nothing: one key (or a hash collision).
            return Ok(Some((self.first_key(keys)?, bytes)));
        }
        if let Some((key, count)) = self.top_key(keys)? {
            let key_bytes = bytes / self.rows().max(1) as u64 * count;
            if key_bytes.saturating_mul(5) > self.env_budget().saturating_mul(2) {
                return Ok(Some((key, key_bytes)));
            }
        }
        Ok(None)
    }

    /// The key of the first row, printed `k=v, ...`.
    fn first_key(&self, keys: &[String]) -> Result<String> {
        let idx = self.column_indices(keys)?;
        let df = self.read_chunks(&idx, 0..self.chunk_count().min(1))?;
        Ok(print_key(&df, keys))
    }

    /// The most frequent key in a sample (the first chunks, up to a third of the
    /// budget) and its estimated row count in the whole frame.
    fn top_key(&self, keys: &[String]) -> Result<Option<(String, u64)>> {
        let idx = self.column_indices(keys)?;
        let limit = self.env_budget() / 3;
        let mut end = 0;
        let mut bytes = 0;
        for c in &self.meta().chunks {
            let b = crate::meta::chunk_column_bytes(c, &idx);
            if end > 0 && bytes + b > limit {
                break;
            }
            bytes += b;
            end += 1;
        }
        let df = self.read_chunks(&idx, 0..end)?;
        let _held = self.env().hold(2 * est(&df));
        let sample_rows = df.height() as u64;
        if sample_rows == 0 {
            return Ok(None);
        }
        let top = df
            .lazy()
            .group_by(exprs(keys))
            .agg([pl::len().alias("__scad_count")])
            .sort(
                ["__scad_count"],
                SortMultipleOptions::default().with_order_descending(true),
            )
            .limit(1)
            .collect()?;
        if top.height() == 0 {
            return Ok(None);
        }
        let count = top
            .column("__scad_count")?
            .cast(&pl::DataType::UInt64)?
            .u64()?
            .get(0)
            .unwrap_or(0);
        let estimate = (count as u128 * self.rows() as u128 / sample_rows as u128) as u64;
        Ok(Some((print_key(&top, keys), estimate)))
    }

    /// Hash-partitions columns `cols` by `keys` into `parts` new frames.
    fn partition(
        &self,
        keys: &[String],
        cols: &[String],
        level: u32,
        parts: usize,
    ) -> Result<Vec<RemoteFrame>> {
        let env = self.env();
        let sub = empty_of(self, cols);
        let mut writers = (0..parts)
            .map(|_| FrameWriter::with_schema(env, sub.schema()))
            .collect::<Result<Vec<_>>>()?;
        let r: Result<()> = (|| {
            for b in self.batches(Some(cols), self.stream_bytes())? {
                let b = b?;
                let mut held = env.hold(est(&b));
                let pieces = crate::hash::split(&b, keys, level, parts)?;
                held.set(2 * est(&b));
                drop(b);
                // The partitions' writes are independent: overlap them.
                writers
                    .par_iter_mut()
                    .zip(pieces.par_iter())
                    .try_for_each(|(w, piece)| w.push(piece))?;
            }
            Ok(())
        })();
        let frames: Vec<RemoteFrame> = writers
            .into_iter()
            .map(FrameWriter::finish)
            .collect::<Result<Vec<_>>>()?;
        if let Err(e) = r {
            for f in frames {
                let _ = f.free();
            }
            return Err(e);
        }
        env.add_partitions(parts as u64, level + 1);
        Ok(frames)
    }

    /// Joins this frame (left) with `other` (right) on `left_on` = `right_on`.
    ///
    /// Within the budget the join is done by Polars in one go; when only the right
    /// side fits, the left side streams past it batch by batch; otherwise both sides
    /// are hash-partitioned by key into remote memory and joined partition by
    /// partition (recursively while a partition is too large). A partition that
    /// cannot be split because one key holds too many rows is joined by a nested loop
    /// over pages of both sides (inner joins; semi and anti joins only ever hold the
    /// right side's distinct keys), or reported as [`Error::Skew`] (left joins).
    ///
    /// The output has Polars' join schema (right key columns dropped, clashing right
    /// column names suffixed `_right`); its row order is unspecified.
    ///
    /// # Errors
    /// [`Error::UnknownColumn`]; [`Error::TypeMismatch`] for keys of different types;
    /// [`Error::InvalidArgument`] for key lists of different lengths or empty;
    /// [`Error::Skew`], [`Error::BudgetExceeded`]; Polars, transport, allocation errors.
    pub fn join<L, R, S1, S2>(
        &self,
        other: &RemoteFrame,
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
        let _t = self.env().timer();
        let lk = names(left_on);
        let rk = names(right_on);
        if lk.is_empty() || lk.len() != rk.len() {
            return Err(Error::InvalidArgument(format!(
                "a join needs the same number of keys on both sides, at least one (got {} and {})",
                lk.len(),
                rk.len()
            )));
        }
        let li = self.column_indices(&lk)?;
        let ri = other.column_indices(&rk)?;
        for ((l, r), name) in li.iter().zip(&ri).zip(&lk) {
            let lt = self.meta().schema[*l].dtype;
            let rt = other.meta().schema[*r].dtype;
            if lt != rt {
                return Err(Error::TypeMismatch {
                    column: format!("{name} = {}", other.meta().schema[*r].name),
                    expected: lt.to_string(),
                    found: rt.to_string(),
                });
            }
        }
        let right = other.with_env(self.env());
        let rcols = if how.keys_only() {
            rk.clone()
        } else {
            right.column_names()
        };
        let job = Join { lk, rk, rcols, how };
        let mut w = FrameWriter::new(self.env()).coalescing();
        job.run(self, &right, 0, String::new(), None, &mut w)?;
        if w.rows() == 0 {
            let out = job.join_dfs(
                empty_of(self, &self.column_names()),
                empty_of(&right, &job.rcols),
            )?;
            w.push(&out)?;
        }
        w.finish()
    }
}

/// A kernel that hash partitioning makes exact: group-by and distinct.
struct Partitioned<'a> {
    kernel: &'static str,
    keys: &'a [String],
    cols: &'a [String],
    f: &'a dyn Fn(DataFrame) -> Result<DataFrame>,
    /// `f` may be applied to partial results again (distinct): try streaming first.
    streamable: bool,
}

impl Partitioned<'_> {
    fn run(
        &self,
        frame: &RemoteFrame,
        level: u32,
        path: String,
        parent_rows: Option<usize>,
        w: &mut FrameWriter,
    ) -> Result<()> {
        if frame.rows() == 0 {
            return Ok(());
        }
        let env = frame.env();
        let budget = env.budget();
        let idx = frame.column_indices(self.cols)?;
        let bytes = frame.meta().column_bytes(&idx);
        let need = bytes.saturating_mul(2);
        if need <= budget {
            let df = frame.read_chunks(&idx, 0..frame.chunk_count())?;
            let mut held = env.hold(est(&df));
            let inb = est(&df);
            let out = (self.f)(df)?;
            held.set(inb + est(&out));
            return w.push(&out);
        }
        if self.streamable {
            if let Some(out) = self.stream(frame)? {
                let _held = env.hold(est(&out));
                return w.push(&out);
            }
        }
        if level > 0 {
            frame.check_skew(self.kernel, self.keys, bytes, level, &path, parent_rows)?;
        }
        if level >= MAX_LEVEL {
            return Err(Error::BudgetExceeded {
                what: format!(
                    "{} partition {path} after {level} levels of partitioning",
                    self.kernel
                ),
                need,
                budget,
            });
        }
        let p = parts_for(frame, bytes, need, budget, frame.stream_bytes());
        let parts = frame.partition(self.keys, self.cols, level, p)?;
        let rows = frame.rows();
        run_parts(parts, |k, part| {
            self.run(part, level + 1, format!("{path}/{k}"), Some(rows), w)
        })
    }

    /// Applies `f` batch by batch to the batch and the result so far, if the result
    /// stays within 40% of the budget (`None` as soon as it does not).
    fn stream(&self, frame: &RemoteFrame) -> Result<Option<DataFrame>> {
        let env = frame.env();
        let limit = env.budget() / 10 * 4;
        let mut acc = empty_of(frame, self.cols);
        let mut held = env.hold(0);
        for b in frame.batches(Some(self.cols), (env.budget() / 5).clamp(1, STREAM_CAP))? {
            let b = b?;
            held.set(est(&acc) + 2 * est(&b));
            acc =
                (self.f)(pl::concat([acc.lazy(), b.lazy()], pl::UnionArgs::default())?.collect()?)?;
            if est(&acc) > limit {
                return Ok(None);
            }
        }
        Ok(Some(acc))
    }
}

/// Runs `f` on every partition in turn, freeing each after use (and all the rest
/// when one fails).
fn run_parts(
    parts: Vec<RemoteFrame>,
    mut f: impl FnMut(usize, &RemoteFrame) -> Result<()>,
) -> Result<()> {
    let mut it = parts.into_iter().enumerate();
    while let Some((k, part)) = it.next() {
        let r = f(k, &part);
        let freed = part.free();
        if let Err(e) = r {
            for (_, rest) in it {
                let _ = rest.free();
            }
            return Err(e);
        }
        freed?;
    }
    Ok(())
}

fn run_pairs(
    left: Vec<RemoteFrame>,
    right: Vec<RemoteFrame>,
    mut f: impl FnMut(usize, &RemoteFrame, &RemoteFrame) -> Result<()>,
) -> Result<()> {
    let mut rights = right.into_iter();
    let r = run_parts(left, |k, l| match rights.next() {
        Some(r) => {
            let out = f(k, l, &r);
            let freed = r.free();
            out.and(freed)
        }
        None => Ok(()),
    });
    for rest in rights {
        let _ = rest.free();
    }
    r
}

struct Join {
    lk: Vec<String>,
    rk: Vec<String>,
    rcols: Vec<String>,
    how: JoinType,
}

impl Join {
    fn join_dfs(&self, l: DataFrame, r: DataFrame) -> Result<DataFrame> {
        Ok(l.lazy()
            .join(
                r.lazy(),
                exprs(&self.lk),
                exprs(&self.rk),
                JoinArgs::new(self.how.polars()),
            )
            .collect()?)
    }

    fn read_right(&self, right: &RemoteFrame) -> Result<DataFrame> {
        let df = right.select_columns(&self.rcols)?;
        if self.how.keys_only() {
            let sel = pl::cols(
                self.rk
                    .iter()
                    .map(|s| PlSmallStr::from(s.as_str()))
                    .collect::<Vec<_>>(),
            );
            Ok(df
                .lazy()
                .unique(Some(sel), UniqueKeepStrategy::Any)
                .collect()?)
        } else {
            Ok(df)
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        left: &RemoteFrame,
        right: &RemoteFrame,
        level: u32,
        path: String,
        parent_right_rows: Option<usize>,
        w: &mut FrameWriter,
    ) -> Result<()> {
        if left.rows() == 0 {
            return Ok(());
        }
        let env = left.env();
        let budget = env.budget();
        let lb = left.data_bytes();
        let rb = right
            .meta()
            .column_bytes(&right.column_indices(&self.rcols)?);
        let need = if self.how.keys_only() {
            lb.saturating_mul(2).saturating_add(rb)
        } else {
            lb.saturating_add(rb).saturating_mul(2)
        };
        if need <= budget {
            // Both sides at once: their transfers overlap.
            let (l, r) = std::thread::scope(|s| {
                let r = s.spawn(|| self.read_right(right));
                let l = left.to_polars();
                let r = r.join().unwrap_or_else(|_| {
                    Err(Error::InvalidArgument("a read thread panicked".into()))
                });
                Ok::<_, Error>((l?, r?))
            })?;
            let mut held = env.hold(est(&l) + est(&r));
            let base = est(&l) + est(&r);
            let out = self.join_dfs(l, r)?;
            held.set(base + est(&out));
            return w.push(&out);
        }
        if rb.saturating_mul(5) <= budget.saturating_mul(2) {
            return self.broadcast(left, self.read_right(right)?, w);
        }
        if self.how.keys_only() {
            // Semi and anti joins need only the distinct right keys, which collapse
            // any skew; if they fit, stream the left side past them.
            if let Some(r) = self.distinct_right_keys(right)? {
                return self.broadcast(left, r, w);
            }
        } else if level > 0 {
            if let Some((key, key_bytes)) = right.skewed_key(&self.rk, rb, parent_right_rows)? {
                return match self.how {
                    JoinType::Inner => self.nested_loop(left, right, w),
                    _ => Err(Error::Skew {
                        kernel: self.how.name(),
                        partition: path,
                        level,
                        key,
                        bytes: key_bytes,
                        budget,
                    }),
                };
            }
        }
        if level >= MAX_LEVEL {
            return Err(Error::BudgetExceeded {
                what: format!(
                    "{} partition {path} after {level} levels of partitioning",
                    self.how.name()
                ),
                need,
                budget,
            });
        }
        let batch = left.stream_bytes();
        let p =
            parts_for(left, lb, need, budget, batch).min(parts_for(right, rb, need, budget, batch));
        let p = p.max(2);
        let lparts = left.partition(&self.lk, &left.column_names(), level, p)?;
        let rparts = match right.partition(&self.rk, &self.rcols, level, p) {
            Ok(r) => r,
            Err(e) => {
                for l in lparts {
                    let _ = l.free();
                }
                return Err(e);
            }
        };
        let rrows = right.rows();
        run_pairs(lparts, rparts, |k, l, r| {
            self.run(l, r, level + 1, format!("{path}/{k}"), Some(rrows), w)
        })
    }

    /// The distinct right keys, gathered batch by batch, if they fit 40% of the
    /// budget (`None` as soon as they do not).
    fn distinct_right_keys(&self, right: &RemoteFrame) -> Result<Option<DataFrame>> {
        let env = right.env();
        let limit = env.budget() / 10 * 4;
        let sel = || {
            pl::cols(
                self.rk
                    .iter()
                    .map(|s| PlSmallStr::from(s.as_str()))
                    .collect::<Vec<_>>(),
            )
        };
        let mut acc = empty_of(right, &self.rk);
        let mut held = env.hold(0);
        for b in right.batches(Some(&self.rk), (env.budget() / 5).clamp(1, STREAM_CAP))? {
            let b = b?;
            held.set(est(&acc) + 2 * est(&b));
            acc = pl::concat([acc.lazy(), b.lazy()], pl::UnionArgs::default())?
                .unique(Some(sel()), UniqueKeepStrategy::Any)
                .collect()?;
            if est(&acc) > limit {
                return Ok(None);
            }
        }
        Ok(Some(acc))
    }

    /// The right side fits: stream the left side past it.
    fn broadcast(&self, left: &RemoteFrame, r: DataFrame, w: &mut FrameWriter) -> Result<()> {
        let env = left.env();
        let rbytes = est(&r);
        let _held_r = env.hold(rbytes);
        let batch = (env.budget().saturating_sub(rbytes) / 4).clamp(1, STREAM_CAP);
        for b in left.batches::<&str>(None, batch)? {
            let b = b?;
            let mut held = env.hold(est(&b));
            let inb = est(&b);
            let out = self.join_dfs(b, r.clone())?;
            held.set(inb + est(&out));
            w.push(&out)?;
        }
        Ok(())
    }

    /// Inner join of a partition whose right side is dominated by one key: every page
    /// of the right side against every batch of the left side.
    fn nested_loop(
        &self,
        left: &RemoteFrame,
        right: &RemoteFrame,
        w: &mut FrameWriter,
    ) -> Result<()> {
        let env = left.env();
        env.add_nested();
        let page = (env.budget() / 10 * 3).max(1);
        let lbatch = (env.budget() / 10).max(1);
        for rp in right.batches(Some(&self.rcols), page)? {
            let rp = rp?;
            let _held_r = env.hold(est(&rp));
            for b in left.batches::<&str>(None, lbatch)? {
                let b = b?;
                let mut held = env.hold(est(&b));
                let inb = est(&b);
                let out = self.join_dfs(b, rp.clone())?;
                held.set(inb + est(&out));
                w.push(&out)?;
            }
        }
        Ok(())
    }
}
