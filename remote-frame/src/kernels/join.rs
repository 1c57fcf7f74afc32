//! Hash joins (inner, left, semi, anti): broadcast when the right side fits, grace
//! hash partitioning when not, nested loops over pages for skewed keys.

use polars::prelude::{self as pl, DataFrame, IntoLazy, JoinArgs, PlSmallStr, UniqueKeepStrategy};

use crate::error::{Error, Result};
use crate::frame::{FrameWriter, RemoteFrame};

use super::partition::run_pairs;
use super::*;

impl RemoteFrame {
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
    /// [`Error::Skew`], [`Error::OutOfBudget`]; as [`RemoteFrame::check_seal`] for
    /// either frame; Polars, transport, allocation errors.
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
        self.check_seal()?;
        other.check_seal()?;
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
                empty_of(self, &self.column_names())?,
                empty_of(&right, &job.rcols)?,
            )?;
            w.push(&out)?;
        }
        w.finish()
    }
}

pub(super) struct Join {
    lk: Vec<String>,
    rk: Vec<String>,
    rcols: Vec<String>,
    how: JoinType,
}

impl Join {
    pub(super) fn join_dfs(&self, l: DataFrame, r: DataFrame) -> Result<DataFrame> {
        Ok(l.lazy()
            .join(
                r.lazy(),
                exprs(&self.lk),
                exprs(&self.rk),
                JoinArgs::new(self.how.polars()),
            )
            .collect()?)
    }

    pub(super) fn read_right(&self, right: &RemoteFrame) -> Result<DataFrame> {
        let df = right.select_columns(&self.rcols)?;
        if self.how.keys_only() {
            distinct_on(df, &self.rk)
        } else {
            Ok(df)
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn run(
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
        let budget = env.budget().saturating_bytes();
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
            return Err(Error::OutOfBudget {
                what: format!(
                    "{} partition {path} after {level} levels of partitioning",
                    self.how.name()
                ),
                need: Some(need),
                budget: env.budget(),
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
    pub(super) fn distinct_right_keys(&self, right: &RemoteFrame) -> Result<Option<DataFrame>> {
        let env = right.env();
        let limit = env.budget().saturating_bytes() / 10 * 4;
        let sel = || {
            pl::cols(
                self.rk
                    .iter()
                    .map(|s| PlSmallStr::from(s.as_str()))
                    .collect::<Vec<_>>(),
            )
        };
        let mut acc = empty_of(right, &self.rk)?;
        let mut held = env.hold(0);
        for b in right.batches(
            Some(&self.rk),
            (env.budget().saturating_bytes() / 5).clamp(1, STREAM_CAP),
        )? {
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
    pub(super) fn broadcast(
        &self,
        left: &RemoteFrame,
        r: DataFrame,
        w: &mut FrameWriter,
    ) -> Result<()> {
        let env = left.env();
        let rbytes = est(&r);
        let _held_r = env.hold(rbytes);
        let batch =
            (env.budget().saturating_bytes().saturating_sub(rbytes) / 4).clamp(1, STREAM_CAP);
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
    pub(super) fn nested_loop(
        &self,
        left: &RemoteFrame,
        right: &RemoteFrame,
        w: &mut FrameWriter,
    ) -> Result<()> {
        let env = left.env();
        env.add_nested();
        let page = (env.budget().saturating_bytes() / 10 * 3).max(1);
        let lbatch = (env.budget().saturating_bytes() / 10).max(1);
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
