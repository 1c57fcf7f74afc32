//! Group-bys and distinct rows, by grace hash partitioning when they do not fit.

use polars::prelude::{DataFrame, Expr, IntoLazy};

use crate::error::{Error, Result};
use crate::frame::RemoteFrame;

use super::*;

impl RemoteFrame {
    /// Distinct rows (over `subset` of the columns, keeping any one row per distinct
    /// subset; over all columns if `None`). Grace-partitioned like
    /// [`RemoteFrame::group_by`] when it does not fit the budget.
    ///
    /// # Errors
    /// As [`RemoteFrame::group_by`].
    pub fn distinct<S: AsRef<str>>(&self, subset: Option<&[S]>) -> Result<RemoteFrame> {
        let _t = self.env().timer();
        self.check_seal()?;
        let all = self.column_names();
        let keys = subset.map(names).unwrap_or_else(|| all.clone());
        self.column_indices(&keys)?;
        let k2 = keys.clone();
        let f = move |df: DataFrame| -> Result<DataFrame> { distinct_on(df, &k2) };
        self.partitioned("distinct", &keys, &all, &f, true)
    }

    /// Groups by `keys` and evaluates the aggregations, e.g.
    /// `[col("x").sum(), col("y").mean(), col("z").n_unique(), col("x").count()]`.
    /// When the grouped columns do not fit the budget, rows are hash-partitioned by
    /// key into remote memory and each partition is aggregated on its own (every
    /// group lives in exactly one partition, so any aggregation is exact).
    ///
    /// # Errors
    /// As [`RemoteFrame::check_seal`]; [`Error::UnknownColumn`]; [`Error::Skew`] when
    /// one group alone exceeds the budget; Polars, transport and allocation errors.
    pub fn group_by<S: AsRef<str>, E: AsRef<[Expr]>>(
        &self,
        keys: &[S],
        aggs: E,
    ) -> Result<RemoteFrame> {
        let _t = self.env().timer();
        self.check_seal()?;
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
}
