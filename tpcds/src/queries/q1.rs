//! TPC-DS query 1: customers whose store returns in a year exceed 1.2 times their
//! store's average.
//!
//! ```sql
//! WITH customer_total_return AS
//!   (SELECT sr_customer_sk AS ctr_customer_sk, sr_store_sk AS ctr_store_sk,
//!           sum(sr_return_amt) AS ctr_total_return
//!    FROM store_returns, date_dim
//!    WHERE sr_returned_date_sk = d_date_sk AND d_year = 2000
//!    GROUP BY sr_customer_sk, sr_store_sk)
//! SELECT c_customer_id
//! FROM customer_total_return ctr1, store, customer
//! WHERE ctr1.ctr_total_return > (SELECT avg(ctr_total_return)*1.2
//!                                FROM customer_total_return ctr2
//!                                WHERE ctr1.ctr_store_sk = ctr2.ctr_store_sk)
//!   AND s_store_sk = ctr1.ctr_store_sk AND s_state = 'TN'
//!   AND ctr1.ctr_customer_sk = c_customer_sk
//! ORDER BY c_customer_id
//! LIMIT 100;
//! ```

use polars::prelude::*;

use super::{collect, semi_join, step, sum_or_null};
use crate::pipeline::{JoinKind, Kernel, Pipeline, RowOrder, Source};

/// Query 1's substitution parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Q1Params {
    /// `d_year` of the returns.
    pub year: i64,
    /// `s_state` of the stores.
    pub state: String,
}

impl Q1Params {
    /// The official text's values: year 2000, state TN.
    pub fn official() -> Self {
        Q1Params {
            year: 2000,
            state: "TN".to_string(),
        }
    }
}

/// The scale of `sr_return_amt` (`DECIMAL(7,2)`).
const RETURN_AMT_SCALE: usize = 2;

/// Query 1 as a pipeline of nine steps.
pub fn q1(params: &Q1Params) -> Pipeline {
    let year = params.year;
    let state = params.state.clone();
    let steps = vec![
        step(
            "dates_in_year",
            vec![("date_dim", Source::table("date_dim", &["d_date_sk", "d_year"]))],
            &[Kernel::Filter, Kernel::Project],
            "SELECT d_date_sk FROM date_dim WHERE d_year = :year",
            move |inp| {
                let plan = inp
                    .get("date_dim")?
                    .lazy()
                    .filter(col("d_year").eq(lit(year)))
                    .select([col("d_date_sk")]);
                collect(plan, "dates_in_year")
            },
        ),
        step(
            "returns_in_year",
            vec![
                (
                    "store_returns",
                    Source::table(
                        "store_returns",
                        &[
                            "sr_returned_date_sk",
                            "sr_customer_sk",
                            "sr_store_sk",
                            "sr_return_amt",
                        ],
                    ),
                ),
                ("dates", Source::Step("dates_in_year")),
            ],
            // Inner join on date_dim's primary key without using its columns = semi join.
            &[Kernel::Join(JoinKind::Semi), Kernel::Project],
            "store_returns JOIN dates ON sr_returned_date_sk = d_date_sk",
            |inp| {
                let plan = semi_join(
                    inp.get("store_returns")?.lazy(),
                    inp.get("dates")?.lazy(),
                    "sr_returned_date_sk",
                    "d_date_sk",
                )
                .select([col("sr_customer_sk"), col("sr_store_sk"), col("sr_return_amt")]);
                collect(plan, "returns_in_year")
            },
        ),
        step(
            "customer_total_return",
            vec![("returns", Source::Step("returns_in_year"))],
            &[Kernel::GroupBy, Kernel::Project],
            "SELECT sr_customer_sk ctr_customer_sk, sr_store_sk ctr_store_sk, \
             sum(sr_return_amt) ctr_total_return GROUP BY sr_customer_sk, sr_store_sk",
            |inp| {
                let plan = inp
                    .get("returns")?
                    .lazy()
                    .group_by([col("sr_customer_sk"), col("sr_store_sk")])
                    .agg([
                        col("sr_return_amt").sum().alias("amt_sum"),
                        col("sr_return_amt").count().alias("amt_count"),
                    ])
                    .select([
                        col("sr_customer_sk").alias("ctr_customer_sk"),
                        col("sr_store_sk").alias("ctr_store_sk"),
                        sum_or_null("amt_sum", "amt_count", RETURN_AMT_SCALE, "ctr_total_return"),
                    ]);
                collect(plan, "customer_total_return")
            },
        ),
        step(
            "store_return_limit",
            vec![("ctr", Source::Step("customer_total_return"))],
            // avg = sum / count of non-NULL values; projected with * 1.2.
            &[Kernel::GroupBy, Kernel::Project],
            "SELECT ctr_store_sk, avg(ctr_total_return) * 1.2 AS return_limit GROUP BY ctr_store_sk",
            |inp| {
                let plan = inp
                    .get("ctr")?
                    .lazy()
                    .group_by([col("ctr_store_sk")])
                    .agg([
                        col("ctr_total_return").sum().alias("total_sum"),
                        col("ctr_total_return").count().alias("total_count"),
                    ])
                    .select([
                        col("ctr_store_sk").alias("limit_store_sk"),
                        // DuckDB: avg(DECIMAL) is DOUBLE = exact unscaled sum / (count * 10^scale),
                        // then DOUBLE * 1.2 (the literal becomes the DOUBLE nearest 1.2).
                        (when(col("total_count").eq(lit(0)))
                            .then(lit(NULL).cast(DataType::Float64))
                            .otherwise(
                                col("total_sum").to_physical().cast(DataType::Float64)
                                    / (col("total_count").cast(DataType::Float64)
                                        * lit(10f64.powi(RETURN_AMT_SCALE as i32))),
                            )
                            * lit(1.2f64))
                        .alias("return_limit"),
                    ]);
                collect(plan, "store_return_limit")
            },
        ),
        step(
            "stores_in_state",
            vec![("store", Source::table("store", &["s_store_sk", "s_state"]))],
            &[Kernel::Filter, Kernel::Project],
            "SELECT s_store_sk FROM store WHERE s_state = :state",
            move |inp| {
                let plan = inp
                    .get("store")?
                    .lazy()
                    .filter(col("s_state").eq(lit(state.as_str())))
                    .select([col("s_store_sk")]);
                collect(plan, "stores_in_state")
            },
        ),
        step(
            "high_returns",
            vec![
                ("ctr", Source::Step("customer_total_return")),
                ("limits", Source::Step("store_return_limit")),
            ],
            &[Kernel::Join(JoinKind::Inner), Kernel::Filter, Kernel::Project],
            "ctr1 JOIN limits ON ctr_store_sk WHERE ctr_total_return > return_limit",
            |inp| {
                let plan = inp
                    .get("ctr")?
                    .lazy()
                    .join(
                        inp.get("limits")?.lazy(),
                        [col("ctr_store_sk")],
                        [col("limit_store_sk")],
                        JoinArgs::new(JoinType::Inner),
                    )
                    // DECIMAL > DOUBLE compares as DOUBLE; NULL on either side drops the row.
                    .filter(
                        col("ctr_total_return")
                            .cast(DataType::Float64)
                            .gt(col("return_limit")),
                    )
                    .select([col("ctr_customer_sk"), col("ctr_store_sk")]);
                collect(plan, "high_returns")
            },
        ),
        step(
            "high_returns_in_state",
            vec![
                ("high", Source::Step("high_returns")),
                ("stores", Source::Step("stores_in_state")),
            ],
            // Inner join on store's primary key without using its columns = semi join.
            &[Kernel::Join(JoinKind::Semi)],
            "high JOIN store ON s_store_sk = ctr_store_sk (s_state filtered)",
            |inp| {
                let plan = semi_join(
                    inp.get("high")?.lazy(),
                    inp.get("stores")?.lazy(),
                    "ctr_store_sk",
                    "s_store_sk",
                );
                collect(plan, "high_returns_in_state")
            },
        ),
        step(
            "customer_ids",
            vec![
                ("high", Source::Step("high_returns_in_state")),
                (
                    "customer",
                    Source::table("customer", &["c_customer_sk", "c_customer_id"]),
                ),
            ],
            &[Kernel::Join(JoinKind::Inner), Kernel::Project],
            "SELECT c_customer_id FROM high JOIN customer ON ctr_customer_sk = c_customer_sk",
            |inp| {
                let plan = inp
                    .get("high")?
                    .lazy()
                    .join(
                        inp.get("customer")?.lazy(),
                        [col("ctr_customer_sk")],
                        [col("c_customer_sk")],
                        JoinArgs::new(JoinType::Inner),
                    )
                    .select([col("c_customer_id")]);
                collect(plan, "customer_ids")
            },
        ),
        step(
            "top_customers",
            vec![("ids", Source::Step("customer_ids"))],
            &[Kernel::Sort, Kernel::Limit],
            "ORDER BY c_customer_id LIMIT 100",
            |inp| {
                let plan = inp
                    .get("ids")?
                    .lazy()
                    .sort(
                        ["c_customer_id"],
                        SortMultipleOptions::default().with_nulls_last(true),
                    )
                    .limit(100);
                collect(plan, "top_customers")
            },
        ),
    ];
    Pipeline {
        name: "q1".to_string(),
        steps,
        // The only output column is the sort key, so tied rows are identical.
        row_order: RowOrder::Ordered,
    }
}
