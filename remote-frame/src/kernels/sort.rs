//! Sorts within the budget: in memory, or the first rows only.

use polars::prelude::{self as pl, IntoLazy, PlSmallStr, SortMultipleOptions};

use crate::error::{Error, Result};
use crate::frame::RemoteFrame;

use super::*;

impl RemoteFrame {
    /// Sorts by the named columns. The frame (twice: input and sorted copy) must fit
    /// the budget; see [`RemoteFrame::sort_limit`] for a top-k that streams.
    ///
    /// # Errors
    /// [`Error::OutOfBudget`] when the frame does not fit; [`Error::UnknownColumn`].
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
            return Err(Error::OutOfBudget {
                what: format!("sorting {} rows in memory", self.rows()),
                need: Some(need),
                budget: self.env().budget(),
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
        let mut best = empty_of(self, &self.column_names())?;
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
}
