//! The steps of queries 1, 16, 94 and 95 on [`RemoteFrame`]s: the same logic as the
//! Polars steps in [`crate::queries`] (same step names, inputs and output schemas),
//! expressed with remote-frame kernels, so that every step keeps to the local memory
//! budget and writes its result to memory elements.
//!
//! Row-wise work (filters, projections, the NULL-for-empty-sum projection) is one
//! streaming pass ([`RemoteFrame::map_batches`]); joins, group-bys and distinct are the
//! kernels' budgeted hash joins and aggregations; `ORDER BY ... LIMIT` is the streaming
//! top-k ([`RemoteFrame::sort_limit`]). Temporary frames inside a step are freed before
//! the step returns.
//!
//! One step differs in content, not in schema: q95's `ws_wh` writes one
//! `(order, min warehouse, max warehouse)` row per order shipped from two warehouses
//! instead of the self-join's every pair, since the join's output (quadratic in an
//! order's lines) is not bounded by the budget and its only reader keeps the distinct
//! order numbers, which are the same.

use std::collections::BTreeMap;

use polars::prelude::*;
use scad_remote_frame::{JoinType as RJoin, RemoteFrame, Result as FrameResult};

use crate::queries::{
    date_between, sum_or_null, ChannelColumns, OrderQueryParams, Q1Params, CATALOG, WEB,
};

use super::error::RemoteError;

/// The named input frames of one step.
#[derive(Debug)]
pub struct RemoteInputs {
    step: String,
    frames: BTreeMap<String, RemoteFrame>,
}

impl RemoteInputs {
    /// Inputs of step `step`.
    pub fn new(step: impl Into<String>) -> Self {
        RemoteInputs {
            step: step.into(),
            frames: BTreeMap::new(),
        }
    }

    /// Adds the input `name`.
    pub fn insert(&mut self, name: impl Into<String>, frame: RemoteFrame) {
        self.frames.insert(name.into(), frame);
    }

    /// The input named `name`.
    ///
    /// # Errors
    /// [`scad_remote_frame::Error::InvalidArgument`] naming the step and input.
    pub fn get(&self, name: &str) -> FrameResult<&RemoteFrame> {
        self.frames.get(name).ok_or_else(|| {
            scad_remote_frame::Error::InvalidArgument(format!(
                "step {} has no input named {name}",
                self.step
            ))
        })
    }
}

/// A step's logic over memory elements.
pub type RemoteStepFn = Box<dyn Fn(&RemoteInputs) -> FrameResult<RemoteFrame> + Send + Sync>;

/// Runs `f` on `tmp` and frees `tmp` whatever happens.
fn then_free(
    tmp: RemoteFrame,
    f: impl FnOnce(&RemoteFrame) -> FrameResult<RemoteFrame>,
) -> FrameResult<RemoteFrame> {
    let out = f(&tmp);
    let freed = tmp.free();
    let out = out?;
    freed?;
    Ok(out)
}

fn semi(left: &RemoteFrame, right: &RemoteFrame, lk: &str, rk: &str) -> FrameResult<RemoteFrame> {
    left.join(right, [lk], [rk], RJoin::Semi)
}

fn nulls_last() -> SortMultipleOptions {
    SortMultipleOptions::default().with_nulls_last(true)
}

/// The remote steps of query 1 by step name.
pub fn q1_steps(params: &Q1Params) -> BTreeMap<&'static str, RemoteStepFn> {
    const SCALE: usize = 2;
    let year = params.year;
    let state = params.state.clone();
    let mut m: BTreeMap<&'static str, RemoteStepFn> = BTreeMap::new();
    m.insert(
        "dates_in_year",
        Box::new(move |inp: &RemoteInputs| {
            inp.get("date_dim")?.map_batches(|lf| {
                lf.filter(col("d_year").eq(lit(year)))
                    .select([col("d_date_sk")])
            })
        }),
    );
    m.insert(
        "returns_in_year",
        Box::new(|inp: &RemoteInputs| {
            let j = semi(
                inp.get("store_returns")?,
                inp.get("dates")?,
                "sr_returned_date_sk",
                "d_date_sk",
            )?;
            then_free(j, |j| {
                j.select([
                    col("sr_customer_sk"),
                    col("sr_store_sk"),
                    col("sr_return_amt"),
                ])
            })
        }),
    );
    m.insert(
        "customer_total_return",
        Box::new(|inp: &RemoteInputs| {
            let g = inp.get("returns")?.group_by(
                &["sr_customer_sk", "sr_store_sk"],
                [
                    col("sr_return_amt").sum().alias("amt_sum"),
                    col("sr_return_amt").count().alias("amt_count"),
                ],
            )?;
            then_free(g, |g| {
                g.select([
                    col("sr_customer_sk").alias("ctr_customer_sk"),
                    col("sr_store_sk").alias("ctr_store_sk"),
                    sum_or_null("amt_sum", "amt_count", SCALE, "ctr_total_return"),
                ])
            })
        }),
    );
    m.insert(
        "store_return_limit",
        Box::new(|inp: &RemoteInputs| {
            let g = inp.get("ctr")?.group_by(
                &["ctr_store_sk"],
                [
                    col("ctr_total_return").sum().alias("total_sum"),
                    col("ctr_total_return").count().alias("total_count"),
                ],
            )?;
            then_free(g, |g| {
                g.select([
                    col("ctr_store_sk").alias("limit_store_sk"),
                    // As the Polars step: DuckDB's avg(DECIMAL) is a DOUBLE, times 1.2.
                    (when(col("total_count").eq(lit(0)))
                        .then(lit(NULL).cast(DataType::Float64))
                        .otherwise(
                            col("total_sum").to_physical().cast(DataType::Float64)
                                / (col("total_count").cast(DataType::Float64)
                                    * lit(10f64.powi(SCALE as i32))),
                        )
                        * lit(1.2f64))
                    .alias("return_limit"),
                ])
            })
        }),
    );
    m.insert(
        "stores_in_state",
        Box::new(move |inp: &RemoteInputs| {
            let state = state.clone();
            inp.get("store")?.map_batches(move |lf| {
                lf.filter(col("s_state").eq(lit(state.as_str())))
                    .select([col("s_store_sk")])
            })
        }),
    );
    m.insert(
        "high_returns",
        Box::new(|inp: &RemoteInputs| {
            let j = inp.get("ctr")?.join(
                inp.get("limits")?,
                ["ctr_store_sk"],
                ["limit_store_sk"],
                RJoin::Inner,
            )?;
            then_free(j, |j| {
                j.map_batches(|lf| {
                    lf.filter(
                        col("ctr_total_return")
                            .cast(DataType::Float64)
                            .gt(col("return_limit")),
                    )
                    .select([col("ctr_customer_sk"), col("ctr_store_sk")])
                })
            })
        }),
    );
    m.insert(
        "high_returns_in_state",
        Box::new(|inp: &RemoteInputs| {
            semi(
                inp.get("high")?,
                inp.get("stores")?,
                "ctr_store_sk",
                "s_store_sk",
            )
        }),
    );
    m.insert(
        "customer_ids",
        Box::new(|inp: &RemoteInputs| {
            let j = inp.get("high")?.join(
                inp.get("customer")?,
                ["ctr_customer_sk"],
                ["c_customer_sk"],
                RJoin::Inner,
            )?;
            then_free(j, |j| j.select([col("c_customer_id")]))
        }),
    );
    m.insert(
        "top_customers",
        Box::new(|inp: &RemoteInputs| {
            inp.get("ids")?
                .sort_limit(&["c_customer_id"], nulls_last(), 100)
        }),
    );
    m
}

/// The dimension, filter and totals steps shared by queries 16, 94 and 95.
fn order_query_common(
    ch: ChannelColumns,
    params: &OrderQueryParams,
) -> BTreeMap<&'static str, RemoteStepFn> {
    const MONEY_SCALE: usize = 2;
    let (from, to) = (params.first_ship_date, params.last_ship_date);
    let state = params.state.clone();
    let site_value = params.site_value.clone();
    let mut m: BTreeMap<&'static str, RemoteStepFn> = BTreeMap::new();
    m.insert(
        "ship_dates",
        Box::new(move |inp: &RemoteInputs| {
            inp.get("date_dim")?.map_batches(move |lf| {
                lf.filter(date_between("d_date", from, to))
                    .select([col("d_date_sk")])
            })
        }),
    );
    m.insert(
        "state_addresses",
        Box::new(move |inp: &RemoteInputs| {
            let state = state.clone();
            inp.get("customer_address")?.map_batches(move |lf| {
                lf.filter(col("ca_state").eq(lit(state.as_str())))
                    .select([col("ca_address_sk")])
            })
        }),
    );
    m.insert(
        "sites",
        Box::new(move |inp: &RemoteInputs| {
            let v = site_value.clone();
            inp.get("site")?.map_batches(move |lf| {
                lf.filter(col(ch.site_attr).eq(lit(v.as_str())))
                    .select([col(ch.site_key)])
            })
        }),
    );
    m.insert(
        "sales_in_window",
        Box::new(move |inp: &RemoteInputs| {
            semi(
                inp.get("sales")?,
                inp.get("dates")?,
                ch.ship_date,
                "d_date_sk",
            )
        }),
    );
    m.insert(
        "sales_in_state",
        Box::new(move |inp: &RemoteInputs| {
            semi(
                inp.get("sales")?,
                inp.get("addresses")?,
                ch.ship_addr,
                "ca_address_sk",
            )
        }),
    );
    m.insert(
        "sales_at_sites",
        Box::new(move |inp: &RemoteInputs| {
            semi(inp.get("sales")?, inp.get("sites")?, ch.site, ch.site_key)
        }),
    );
    m.insert(
        "order_totals",
        Box::new(move |inp: &RemoteInputs| {
            let sales = inp.get("sales")?;
            // A global aggregate over a frame of any size: per-batch partial sums and
            // counts (one row per batch), added up; count(DISTINCT) as the row count of
            // the budgeted distinct of the non-NULL order numbers.
            let partial = sales.select([
                col(ch.ship_cost).sum().alias("cost_sum"),
                col(ch.ship_cost)
                    .count()
                    .cast(DataType::Int64)
                    .alias("cost_count"),
                col(ch.net_profit).sum().alias("profit_sum"),
                col(ch.net_profit)
                    .count()
                    .cast(DataType::Int64)
                    .alias("profit_count"),
            ])?;
            let partial = {
                let df = partial.to_polars();
                partial.free()?;
                df?
            };
            let orders = sales.map_batches(|lf| {
                lf.select([col(ch.order)])
                    .filter(col(ch.order).is_not_null())
            })?;
            let order_count = then_free(orders, |o| o.distinct(None::<&[&str]>))?;
            let n = order_count.rows() as i64;
            order_count.free()?;
            let totals = partial
                .lazy()
                .select([
                    col("cost_sum").sum(),
                    col("cost_count").sum(),
                    col("profit_sum").sum(),
                    col("profit_count").sum(),
                    lit(n).alias("order_count"),
                ])
                .select([
                    col("order_count")
                        .cast(DataType::Int64)
                        .alias("order count"),
                    sum_or_null("cost_sum", "cost_count", MONEY_SCALE, "total shipping cost"),
                    sum_or_null(
                        "profit_sum",
                        "profit_count",
                        MONEY_SCALE,
                        "total net profit",
                    ),
                ])
                .collect()?;
            RemoteFrame::from_polars(sales.env(), &totals)
        }),
    );
    m.insert(
        "sorted_totals",
        Box::new(|inp: &RemoteInputs| {
            inp.get("totals")?
                .sort_limit(&["order count"], nulls_last(), 100)
        }),
    );
    m
}

/// The remote steps of query 16 (catalog) or 94 (web) by step name.
pub fn exists_steps(
    ch: ChannelColumns,
    params: &OrderQueryParams,
) -> BTreeMap<&'static str, RemoteStepFn> {
    let mut m = order_query_common(ch, params);
    m.insert(
        "multi_warehouse_orders",
        Box::new(move |inp: &RemoteInputs| {
            let g = inp.get("sales")?.group_by(
                &[ch.order],
                [
                    col(ch.warehouse).min().alias("wh_min"),
                    col(ch.warehouse).max().alias("wh_max"),
                ],
            )?;
            then_free(g, |g| {
                g.map_batches(|lf| {
                    lf.filter(col("wh_min").lt(col("wh_max")))
                        .select([col(ch.order).alias("multi_wh_order")])
                })
            })
        }),
    );
    m.insert(
        "sales_multi_warehouse",
        Box::new(move |inp: &RemoteInputs| {
            let with_wh = inp.get("sales")?.filter(col(ch.warehouse).is_not_null())?;
            then_free(with_wh, |s| {
                semi(s, inp.get("orders")?, ch.order, "multi_wh_order")
            })
        }),
    );
    m.insert(
        "sales_not_returned",
        Box::new(move |inp: &RemoteInputs| {
            inp.get("sales")?.join(
                inp.get("returns")?,
                [ch.order],
                [ch.returns_order],
                RJoin::Anti,
            )
        }),
    );
    m
}

/// The remote steps of query 95 by step name.
pub fn q95_steps(params: &OrderQueryParams) -> BTreeMap<&'static str, RemoteStepFn> {
    let ch = WEB;
    let mut m = order_query_common(ch, params);
    m.insert(
        "ws_wh",
        Box::new(move |inp: &RemoteInputs| {
            // The self-join's output grows with the square of an order's lines (and
            // of its warehouses even after removing duplicate pairs), and the join
            // kernel's budget covers its inputs, not its output. The only reader of
            // `ws_wh` takes its distinct order numbers: the orders with two different
            // non-NULL warehouses, i.e. min(warehouse) < max(warehouse). So this step
            // writes one row of `ws_wh` per such order, (order, min, max) — a row the
            // self-join also yields — with a budgeted group-by whose output is never
            // larger than its input. Same schema, same set of orders.
            let g = inp.get("ws1")?.group_by(
                &[ch.order],
                [
                    col(ch.warehouse).min().alias("wh1"),
                    col(ch.warehouse).max().alias("wh2"),
                ],
            )?;
            then_free(g, |g| {
                g.map_batches(|lf| {
                    lf.filter(col("wh1").lt(col("wh2"))).select([
                        col(ch.order),
                        col("wh1"),
                        col("wh2"),
                    ])
                })
            })
        }),
    );
    m.insert(
        "ws_wh_orders",
        Box::new(move |inp: &RemoteInputs| {
            let orders = inp
                .get("ws_wh")?
                .select([col(ch.order).alias("wh_order")])?;
            then_free(orders, |o| o.distinct(None::<&[&str]>))
        }),
    );
    m.insert(
        "returned_ws_wh_orders",
        Box::new(move |inp: &RemoteInputs| {
            semi(
                inp.get("returns")?,
                inp.get("orders")?,
                ch.returns_order,
                "wh_order",
            )
        }),
    );
    m.insert(
        "sales_in_ws_wh",
        Box::new(move |inp: &RemoteInputs| {
            semi(inp.get("sales")?, inp.get("orders")?, ch.order, "wh_order")
        }),
    );
    m.insert(
        "sales_returned",
        Box::new(move |inp: &RemoteInputs| {
            semi(
                inp.get("sales")?,
                inp.get("returned")?,
                ch.order,
                ch.returns_order,
            )
        }),
    );
    m
}

/// The remote steps of a query by name (as [`crate::queries::pipeline_for`]).
///
/// # Errors
/// [`RemoteError::Tpcds`] with an unknown-query error.
pub fn steps_for(name: &str) -> Result<BTreeMap<&'static str, RemoteStepFn>, RemoteError> {
    Ok(match name {
        "q1" => q1_steps(&Q1Params::official()),
        "q16" => exists_steps(CATALOG, &OrderQueryParams::q16_official()),
        "q16_wide" => exists_steps(CATALOG, &OrderQueryParams::q16_wide()),
        "q94" => exists_steps(WEB, &OrderQueryParams::q94_official()),
        "q94_wide" => exists_steps(WEB, &OrderQueryParams::q94_wide()),
        "q95" => q95_steps(&OrderQueryParams::q94_official()),
        "q95_wide" => q95_steps(&OrderQueryParams::q94_wide()),
        other => return Err(crate::TpcdsError::UnknownQuery(other.to_string()).into()),
    })
}
