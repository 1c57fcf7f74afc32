//! TPC-DS query 95: like query 94, but the multi-warehouse and returned conditions go
//! through the `ws_wh` self-join of `web_sales`.
//!
//! ```sql
//! WITH ws_wh AS
//!   (SELECT ws1.ws_order_number, ws1.ws_warehouse_sk wh1, ws2.ws_warehouse_sk wh2
//!    FROM web_sales ws1, web_sales ws2
//!    WHERE ws1.ws_order_number = ws2.ws_order_number
//!      AND ws1.ws_warehouse_sk <> ws2.ws_warehouse_sk)
//! SELECT count(DISTINCT ws_order_number) AS "order count",
//!        sum(ws_ext_ship_cost) AS "total shipping cost",
//!        sum(ws_net_profit) AS "total net profit"
//! FROM web_sales ws1, date_dim, customer_address, web_site
//! WHERE d_date BETWEEN '1999-02-01' AND cast('1999-04-02' AS date)
//!   AND ws1.ws_ship_date_sk = d_date_sk
//!   AND ws1.ws_ship_addr_sk = ca_address_sk AND ca_state = 'IL'
//!   AND ws1.ws_web_site_sk = web_site_sk AND web_company_name = 'pri'
//!   AND ws1.ws_order_number IN (SELECT ws_order_number FROM ws_wh)
//!   AND ws1.ws_order_number IN (SELECT wr_order_number FROM web_returns, ws_wh
//!                               WHERE wr_order_number = ws_wh.ws_order_number)
//! ORDER BY count(DISTINCT ws_order_number)
//! LIMIT 100;
//! ```
//!
//! Unlike query 94, a row qualifies through its order alone: its own warehouse may be
//! NULL. `ws_wh` is computed as written (self-join on the order number, filter
//! `wh1 <> wh2`), then reduced to its distinct order numbers, since both uses of it are
//! `IN` sets; an `IN (subquery)` in a conjunctive WHERE is a semi join.

use polars::prelude::*;

use super::exists_orders::{dimension_steps, filtered_sales_steps, totals_steps, WEB};
use super::{collect, semi_join, step, OrderQueryParams};
use crate::pipeline::{JoinKind, Kernel, Pipeline, RowOrder, Source};

/// Query 95 as a pipeline.
pub fn q95(params: &OrderQueryParams) -> Pipeline {
    let ch = WEB;
    let mut steps = dimension_steps(ch, params);
    steps.push(step(
        "ws_wh",
        vec![
            ("ws1", Source::table(ch.sales, &[ch.order, ch.warehouse])),
            ("ws2", Source::table(ch.sales, &[ch.order, ch.warehouse])),
        ],
        &[
            Kernel::Project,
            Kernel::Join(JoinKind::Inner),
            Kernel::Filter,
            Kernel::Project,
        ],
        "SELECT ws1.order, ws1.wh wh1, ws2.wh wh2 FROM web_sales ws1, web_sales ws2 \
         WHERE ws1.order = ws2.order AND ws1.wh <> ws2.wh",
        move |inp| {
            let ws1 = inp
                .get("ws1")?
                .lazy()
                .select([col(ch.order), col(ch.warehouse).alias("wh1")]);
            let ws2 = inp.get("ws2")?.lazy().select([
                col(ch.order).alias("order2"),
                col(ch.warehouse).alias("wh2"),
            ]);
            let plan = ws1
                .join(
                    ws2,
                    [col(ch.order)],
                    [col("order2")],
                    JoinArgs::new(JoinType::Inner),
                )
                // NULL <> x is not true: pairs with a NULL warehouse drop out.
                .filter(col("wh1").neq(col("wh2")))
                .select([col(ch.order), col("wh1"), col("wh2")]);
            collect(plan, "ws_wh")
        },
    ));
    steps.push(step(
        "ws_wh_orders",
        vec![("ws_wh", Source::Step("ws_wh"))],
        &[Kernel::Project, Kernel::Distinct],
        "SELECT DISTINCT ws_order_number FROM ws_wh",
        move |inp| {
            let plan = inp
                .get("ws_wh")?
                .lazy()
                .select([col(ch.order).alias("wh_order")])
                .unique(None, UniqueKeepStrategy::Any);
            collect(plan, "ws_wh_orders")
        },
    ));
    steps.push(step(
        "returned_ws_wh_orders",
        vec![
            ("returns", Source::table(ch.returns, &[ch.returns_order])),
            ("orders", Source::Step("ws_wh_orders")),
        ],
        &[Kernel::Join(JoinKind::Semi)],
        "SELECT wr_order_number FROM web_returns, ws_wh WHERE wr_order_number = ws_wh.ws_order_number",
        move |inp| {
            let plan = semi_join(
                inp.get("returns")?.lazy(),
                inp.get("orders")?.lazy(),
                ch.returns_order,
                "wh_order",
            );
            collect(plan, "returned_ws_wh_orders")
        },
    ));
    steps.extend(filtered_sales_steps(
        ch,
        &[
            ch.order,
            ch.ship_date,
            ch.ship_addr,
            ch.site,
            ch.ship_cost,
            ch.net_profit,
        ],
    ));
    steps.push(step(
        "sales_in_ws_wh",
        vec![
            ("sales", Source::Step("sales_at_sites")),
            ("orders", Source::Step("ws_wh_orders")),
        ],
        &[Kernel::Join(JoinKind::Semi)],
        "ws1.ws_order_number IN (SELECT ws_order_number FROM ws_wh)",
        move |inp| {
            let plan = semi_join(
                inp.get("sales")?.lazy(),
                inp.get("orders")?.lazy(),
                ch.order,
                "wh_order",
            );
            collect(plan, "sales_in_ws_wh")
        },
    ));
    steps.push(step(
        "sales_returned",
        vec![
            ("sales", Source::Step("sales_in_ws_wh")),
            ("returned", Source::Step("returned_ws_wh_orders")),
        ],
        &[Kernel::Join(JoinKind::Semi)],
        "ws1.ws_order_number IN (SELECT wr_order_number FROM web_returns, ws_wh ...)",
        move |inp| {
            let plan = semi_join(
                inp.get("sales")?.lazy(),
                inp.get("returned")?.lazy(),
                ch.order,
                ch.returns_order,
            );
            collect(plan, "sales_returned")
        },
    ));
    steps.extend(totals_steps(ch, "sales_returned"));
    Pipeline {
        name: "q95".to_string(),
        steps,
        row_order: RowOrder::Ordered,
    }
}
