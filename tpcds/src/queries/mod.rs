//! TPC-DS queries 1, 16, 94 and 95 as pipelines of steps, with the semantics of the
//! official query text as DuckDB runs it.
//!
//! Each step keeps to the kernels of remote-frame (filter, project with arithmetic and
//! casts, hash join inner/left/semi/anti on multi-column keys, group-by with sum, mean,
//! count, count distinct, min, max, sort, distinct, limit); its [`Step::kernels`] lists
//! them. SQL facts the steps rely on:
//!
//! * `sum` over no rows or only NULLs is NULL in SQL but 0 in Polars, so sums are
//!   computed together with a count of non-NULL values and projected to NULL where the
//!   count is 0 ([`sum_or_null`]).
//! * DuckDB's `sum(DECIMAL(p, s))` is `DECIMAL(38, s)`; `avg(DECIMAL)` is `DOUBLE`, the
//!   exact sum divided by the count; comparing a `DECIMAL` with a `DOUBLE` compares as
//!   `DOUBLE`; `count(DISTINCT x)` is `BIGINT` and ignores NULLs.
//! * An inner join with a dimension on its primary key (`d_date_sk`, `ca_address_sk`,
//!   `cc_call_center_sk`, `web_site_sk`, `s_store_sk`) keeps each fact row at most once,
//!   so when no dimension column is used afterwards it is a semi join.
//! * NULL keys never match in joins (SQL `=`), as in Polars' default join arguments.
//! * `ORDER BY x` sorts NULLs last in DuckDB; Polars is asked to do the same.

mod exists_orders;
mod q1;
mod q95;

use polars::prelude::*;

pub use exists_orders::{q16, q94, ChannelColumns, OrderQueryParams, CATALOG, WEB};
pub use q1::{q1, Q1Params};
pub use q95::q95;

use crate::error::{PolarsContext, TpcdsError};
use crate::pipeline::{Pipeline, Step};

/// The official queries.
pub const OFFICIAL: [&str; 4] = ["q1", "q16", "q94", "q95"];

/// Queries with a reference answer in every generated data set: the official ones and
/// variants whose literals differ so that small test data sets give non-empty results
/// (`tpcds/gen_data.py` derives the variants' SQL from the official text the same way).
pub const ALL_REFERENCES: [&str; 7] = [
    "q1", "q16", "q94", "q95", "q16_wide", "q94_wide", "q95_wide",
];

/// The pipeline for a query by name: `q1`, `q16`, `q94`, `q95` (official parameters) or
/// `q16_wide`, `q94_wide`, `q95_wide` (the test variants).
///
/// # Errors
/// [`TpcdsError::UnknownQuery`] for any other name.
pub fn pipeline_for(name: &str) -> Result<Pipeline, TpcdsError> {
    Ok(match name {
        "q1" => q1(&Q1Params::official()),
        "q16" => q16(&OrderQueryParams::q16_official()),
        "q16_wide" => named(q16(&OrderQueryParams::q16_wide()), name),
        "q94" => q94(&OrderQueryParams::q94_official()),
        "q94_wide" => named(q94(&OrderQueryParams::q94_wide()), name),
        "q95" => q95(&OrderQueryParams::q94_official()),
        "q95_wide" => named(q95(&OrderQueryParams::q94_wide()), name),
        other => return Err(TpcdsError::UnknownQuery(other.to_string())),
    })
}

fn named(mut pipeline: Pipeline, name: &str) -> Pipeline {
    pipeline.name = name.to_string();
    pipeline
}

/// A calendar date, as in the query text's date literals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CivilDate {
    /// Year.
    pub year: i32,
    /// Month, 1..=12.
    pub month: u32,
    /// Day of the month, 1..=31.
    pub day: u32,
}

impl CivilDate {
    /// The date `year-month-day`.
    pub const fn new(year: i32, month: u32, day: u32) -> Self {
        CivilDate { year, month, day }
    }

    /// Days since 1970-01-01 (Arrow's and Polars' `Date` representation).
    pub fn days_since_epoch(self) -> i32 {
        // Howard Hinnant's days_from_civil, on the proleptic Gregorian calendar.
        let y = self.year - i32::from(self.month <= 2);
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let m = self.month as i32;
        let mp = (m + 9) % 12;
        let doy = (153 * mp + 2) / 5 + self.day as i32 - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        era * 146_097 + doe - 719_468
    }
}

/// Runs a lazy plan built from a step's inputs.
pub(crate) fn collect(plan: LazyFrame, step: &str) -> Result<DataFrame, TpcdsError> {
    plan.collect().context(format!("step {step}"))
}

/// `column BETWEEN from AND to` on a `Date` column (inclusive, as SQL's BETWEEN).
pub(crate) fn date_between(column: &str, from: CivilDate, to: CivilDate) -> Expr {
    let days = col(column).cast(DataType::Int32);
    days.clone()
        .gt_eq(lit(from.days_since_epoch()))
        .and(days.lt_eq(lit(to.days_since_epoch())))
}

/// SQL `sum(x)` projected from a group-by's `sum` and non-NULL `count` columns: NULL
/// where the group had no non-NULL value, else the sum cast to `DECIMAL(38, scale)` as
/// DuckDB types a sum of decimals.
pub(crate) fn sum_or_null(sum: &str, count: &str, scale: usize, alias: &str) -> Expr {
    let dtype = DataType::Decimal(38, scale);
    when(col(count).eq(lit(0)))
        .then(lit(NULL).cast(dtype.clone()))
        .otherwise(col(sum).cast(dtype))
        .alias(alias)
}

/// A semi join keeping `left` rows whose `left_on` value occurs in `right`'s `right_on`.
pub(crate) fn semi_join(
    left: LazyFrame,
    right: LazyFrame,
    left_on: &str,
    right_on: &str,
) -> LazyFrame {
    left.join(
        right,
        [col(left_on)],
        [col(right_on)],
        JoinArgs::new(JoinType::Semi),
    )
}

/// Builds a step (shorthand used by the query modules).
pub(crate) fn step(
    name: &'static str,
    inputs: Vec<(&'static str, crate::pipeline::Source)>,
    kernels: &'static [crate::pipeline::Kernel],
    description: &'static str,
    run: impl Fn(&crate::pipeline::StepInputs) -> Result<DataFrame, TpcdsError> + Send + Sync + 'static,
) -> Step {
    Step {
        name,
        inputs,
        kernels,
        description,
        run: Box::new(run),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_since_epoch_matches_known_dates() {
        assert_eq!(CivilDate::new(1970, 1, 1).days_since_epoch(), 0);
        assert_eq!(CivilDate::new(1969, 12, 31).days_since_epoch(), -1);
        assert_eq!(CivilDate::new(2000, 3, 1).days_since_epoch(), 11_017);
        assert_eq!(CivilDate::new(2002, 2, 1).days_since_epoch(), 11_719);
        assert_eq!(CivilDate::new(1999, 4, 2).days_since_epoch(), 10_683);
    }

    #[test]
    fn every_reference_query_has_a_valid_pipeline() {
        for name in ALL_REFERENCES {
            let pipeline = pipeline_for(name).unwrap();
            assert_eq!(pipeline.name, name);
            pipeline.validate().unwrap();
            assert!(pipeline.steps.iter().all(|s| !s.kernels.is_empty()));
        }
        assert!(matches!(
            pipeline_for("q2"),
            Err(TpcdsError::UnknownQuery(_))
        ));
    }
}
