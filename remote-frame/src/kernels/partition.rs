//! Grace hash partitioning through remote memory: splitting frames by key hash,
//! skew detection, and running the partitions (pairs of them, for joins).

use polars::prelude::{self as pl, DataFrame, IntoLazy, SortMultipleOptions};

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::frame::{FrameWriter, RemoteFrame};

use super::*;

impl RemoteFrame {
    /// Runs `f` over the whole of `cols` if it fits the budget, else over hash
    /// partitions of `keys`, and writes the union of the results.
    pub(super) fn partitioned(
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
            let out = f(empty_of(self, cols)?)?;
            w.push(&out)?;
        }
        w.finish()
    }

    /// Fails with [`Error::Skew`] when the most frequent key of this (partition)
    /// frame holds too much of the budget to be split by hashing, or when the last
    /// partitioning pass put every row of the parent here (all rows share one key).
    pub(super) fn check_skew(
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
    pub(super) fn skewed_key(
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
    pub(super) fn first_key(&self, keys: &[String]) -> Result<String> {
        let idx = self.column_indices(keys)?;
        let df = self.polars_chunks(&idx, 0..self.chunk_count().min(1))?;
        Ok(print_key(&df, keys))
    }

    /// The most frequent key in a sample (the first chunks, up to a third of the
    /// budget) and its estimated row count in the whole frame.
    pub(super) fn top_key(&self, keys: &[String]) -> Result<Option<(String, u64)>> {
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
        let df = self.polars_chunks(&idx, 0..end)?;
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
    pub(super) fn partition(
        &self,
        keys: &[String],
        cols: &[String],
        level: u32,
        parts: usize,
    ) -> Result<Vec<RemoteFrame>> {
        let env = self.env();
        let sub = empty_of(self, cols)?;
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
}

/// A kernel that hash partitioning makes exact: group-by and distinct.
pub(super) struct Partitioned<'a> {
    kernel: &'static str,
    keys: &'a [String],
    cols: &'a [String],
    f: &'a dyn Fn(DataFrame) -> Result<DataFrame>,
    /// `f` may be applied to partial results again (distinct): try streaming first.
    streamable: bool,
}

impl Partitioned<'_> {
    pub(super) fn run(
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
        let budget = env.budget().saturating_bytes();
        let idx = frame.column_indices(self.cols)?;
        let bytes = frame.meta().column_bytes(&idx);
        let need = bytes.saturating_mul(2);
        if need <= budget {
            let df = frame.polars_chunks(&idx, 0..frame.chunk_count())?;
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
            return Err(Error::OutOfBudget {
                what: format!(
                    "{} partition {path} after {level} levels of partitioning",
                    self.kernel
                ),
                need: Some(need),
                budget: env.budget(),
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
    pub(super) fn stream(&self, frame: &RemoteFrame) -> Result<Option<DataFrame>> {
        let env = frame.env();
        let limit = env.budget().saturating_bytes() / 10 * 4;
        let mut acc = empty_of(frame, self.cols)?;
        let mut held = env.hold(0);
        for b in frame.batches(
            Some(self.cols),
            (env.budget().saturating_bytes() / 5).clamp(1, STREAM_CAP),
        )? {
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
pub(super) fn run_parts(
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

pub(super) fn run_pairs(
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
