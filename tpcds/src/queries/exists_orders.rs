//! TPC-DS queries 16 (catalog channel) and 94 (web channel): orders shipped in a date
//! window to a state through a call center / web site, shipped from more than one
//! warehouse (`EXISTS`) and never returned (`NOT EXISTS`).
//!
//! ```sql
//! SELECT count(DISTINCT cs_order_number) AS "order count",
//!        sum(cs_ext_ship_cost) AS "total shipping cost",
//!        sum(cs_net_profit) AS "total net profit"
//! FROM catalog_sales cs1, date_dim, customer_address, call_center
//! WHERE d_date BETWEEN '2002-02-01' AND cast('2002-04-02' AS date)
//!   AND cs1.cs_ship_date_sk = d_date_sk
//!   AND cs1.cs_ship_addr_sk = ca_address_sk AND ca_state = 'GA'
//!   AND cs1.cs_call_center_sk = cc_call_center_sk AND cc_county = 'Williamson County'
//!   AND EXISTS (SELECT * FROM catalog_sales cs2
//!               WHERE cs1.cs_order_number = cs2.cs_order_number
//!                 AND cs1.cs_warehouse_sk <> cs2.cs_warehouse_sk)
//!   AND NOT EXISTS (SELECT * FROM catalog_returns cr1
//!                   WHERE cs1.cs_order_number = cr1.cr_order_number)
//! ORDER BY count(DISTINCT cs_order_number)
//! LIMIT 100;
//! ```
//!
//! Query 94 is the same over `web_sales`, `web_returns` and `web_site`
//! (`web_company_name = 'pri'`, ship dates 1999-02-01 to 1999-04-02, state IL).
//!
//! The `EXISTS` with `<>` is not an equi-join, so it is decided per order: a row `cs1`
//! with a non-NULL warehouse `w` has a row `cs2` of the same order with a non-NULL
//! warehouse other than `w` exactly when the order's non-NULL warehouses have
//! `min < max`. A row whose own warehouse is NULL never qualifies (`NULL <> x` is not
//! true). So `EXISTS` = filter `warehouse IS NOT NULL` + semi join with the orders whose
//! group-by `min(warehouse) < max(warehouse)`.

use polars::prelude::*;

use super::{collect, date_between, semi_join, step, sum_or_null, CivilDate};
use crate::pipeline::{JoinKind, Kernel, Pipeline, RowOrder, Source, Step};

/// Table and column names of one sales channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelColumns {
    /// Sales fact table.
    pub sales: &'static str,
    /// Order number column of the sales table.
    pub order: &'static str,
    /// Warehouse key column of the sales table.
    pub warehouse: &'static str,
    /// Ship date key column.
    pub ship_date: &'static str,
    /// Ship address key column.
    pub ship_addr: &'static str,
    /// Key column of the sales table pointing at the site (call center / web site).
    pub site: &'static str,
    /// Extended ship cost column (`DECIMAL(7,2)`).
    pub ship_cost: &'static str,
    /// Net profit column (`DECIMAL(7,2)`).
    pub net_profit: &'static str,
    /// Returns fact table.
    pub returns: &'static str,
    /// Order number column of the returns table.
    pub returns_order: &'static str,
    /// Site dimension table.
    pub site_table: &'static str,
    /// Primary key of the site table.
    pub site_key: &'static str,
    /// Site attribute the query filters on.
    pub site_attr: &'static str,
}

/// Query 16's catalog channel.
pub const CATALOG: ChannelColumns = ChannelColumns {
    sales: "catalog_sales",
    order: "cs_order_number",
    warehouse: "cs_warehouse_sk",
    ship_date: "cs_ship_date_sk",
    ship_addr: "cs_ship_addr_sk",
    site: "cs_call_center_sk",
    ship_cost: "cs_ext_ship_cost",
    net_profit: "cs_net_profit",
    returns: "catalog_returns",
    returns_order: "cr_order_number",
    site_table: "call_center",
    site_key: "cc_call_center_sk",
    site_attr: "cc_county",
};

/// Queries 94's and 95's web channel.
pub const WEB: ChannelColumns = ChannelColumns {
    sales: "web_sales",
    order: "ws_order_number",
    warehouse: "ws_warehouse_sk",
    ship_date: "ws_ship_date_sk",
    ship_addr: "ws_ship_addr_sk",
    site: "ws_web_site_sk",
    ship_cost: "ws_ext_ship_cost",
    net_profit: "ws_net_profit",
    returns: "web_returns",
    returns_order: "wr_order_number",
    site_table: "web_site",
    site_key: "web_site_sk",
    site_attr: "web_company_name",
};

/// The substitution parameters of queries 16, 94 and 95.
#[derive(Debug, Clone, PartialEq)]
pub struct OrderQueryParams {
    /// First ship date (inclusive).
    pub first_ship_date: CivilDate,
    /// Last ship date (inclusive).
    pub last_ship_date: CivilDate,
    /// `ca_state` of the ship address.
    pub state: String,
    /// Value of the site attribute (`cc_county` or `web_company_name`).
    pub site_value: String,
}

impl OrderQueryParams {
    /// Query 16's official values.
    pub fn q16_official() -> Self {
        OrderQueryParams {
            first_ship_date: CivilDate::new(2002, 2, 1),
            last_ship_date: CivilDate::new(2002, 4, 2),
            state: "GA".to_string(),
            site_value: "Williamson County".to_string(),
        }
    }

    /// `q16_wide` (gen_data.py): ship dates 1999-01-01 to 2002-12-31.
    pub fn q16_wide() -> Self {
        OrderQueryParams {
            first_ship_date: CivilDate::new(1999, 1, 1),
            last_ship_date: CivilDate::new(2002, 12, 31),
            ..Self::q16_official()
        }
    }

    /// Queries 94's and 95's official values.
    pub fn q94_official() -> Self {
        OrderQueryParams {
            first_ship_date: CivilDate::new(1999, 2, 1),
            last_ship_date: CivilDate::new(1999, 4, 2),
            state: "IL".to_string(),
            site_value: "pri".to_string(),
        }
    }

    /// `q94_wide` / `q95_wide` (gen_data.py): ship dates 1999-01-01 to 2002-12-31,
    /// state GA, company `cally`.
    pub fn q94_wide() -> Self {
        OrderQueryParams {
            first_ship_date: CivilDate::new(1999, 1, 1),
            last_ship_date: CivilDate::new(2002, 12, 31),
            state: "GA".to_string(),
            site_value: "cally".to_string(),
        }
    }
}

/// The scale of the summed columns (`DECIMAL(7,2)`).
const MONEY_SCALE: usize = 2;

/// Query 16 as a pipeline.
pub fn q16(params: &OrderQueryParams) -> Pipeline {
    exists_pipeline("q16", CATALOG, params)
}

/// Query 94 as a pipeline.
pub fn q94(params: &OrderQueryParams) -> Pipeline {
    exists_pipeline("q94", WEB, params)
}

/// The three dimension filters shared by queries 16, 94 and 95: ship dates in the
/// window, addresses in the state, sites with the attribute value.
pub(crate) fn dimension_steps(ch: ChannelColumns, params: &OrderQueryParams) -> Vec<Step> {
    let (from, to) = (params.first_ship_date, params.last_ship_date);
    let state = params.state.clone();
    let site_value = params.site_value.clone();
    vec![
        step(
            "ship_dates",
            vec![(
                "date_dim",
                Source::table("date_dim", &["d_date_sk", "d_date"]),
            )],
            &[Kernel::Filter, Kernel::Project],
            "SELECT d_date_sk FROM date_dim WHERE d_date BETWEEN :first AND :last",
            move |inp| {
                let plan = inp
                    .get("date_dim")?
                    .lazy()
                    .filter(date_between("d_date", from, to))
                    .select([col("d_date_sk")]);
                collect(plan, "ship_dates")
            },
        ),
        step(
            "state_addresses",
            vec![(
                "customer_address",
                Source::table("customer_address", &["ca_address_sk", "ca_state"]),
            )],
            &[Kernel::Filter, Kernel::Project],
            "SELECT ca_address_sk FROM customer_address WHERE ca_state = :state",
            move |inp| {
                let plan = inp
                    .get("customer_address")?
                    .lazy()
                    .filter(col("ca_state").eq(lit(state.as_str())))
                    .select([col("ca_address_sk")]);
                collect(plan, "state_addresses")
            },
        ),
        step(
            "sites",
            vec![(
                "site",
                Source::table(ch.site_table, &[ch.site_key, ch.site_attr]),
            )],
            &[Kernel::Filter, Kernel::Project],
            "SELECT site key FROM call_center / web_site WHERE attribute = :value",
            move |inp| {
                let plan = inp
                    .get("site")?
                    .lazy()
                    .filter(col(ch.site_attr).eq(lit(site_value.as_str())))
                    .select([col(ch.site_key)]);
                collect(plan, "sites")
            },
        ),
    ]
}

/// Sales rows in the window, state and sites: three semi joins with the dimension steps
/// (each an inner join on the dimension's primary key whose columns are not used).
/// `columns` are the sales columns read; the last step is named `sales_at_sites`.
pub(crate) fn filtered_sales_steps(ch: ChannelColumns, columns: &[&'static str]) -> Vec<Step> {
    vec![
        step(
            "sales_in_window",
            vec![
                ("sales", Source::table(ch.sales, columns)),
                ("dates", Source::Step("ship_dates")),
            ],
            &[Kernel::Join(JoinKind::Semi)],
            "sales JOIN date_dim ON ship_date_sk = d_date_sk",
            move |inp| {
                let plan = semi_join(
                    inp.get("sales")?.lazy(),
                    inp.get("dates")?.lazy(),
                    ch.ship_date,
                    "d_date_sk",
                );
                collect(plan, "sales_in_window")
            },
        ),
        step(
            "sales_in_state",
            vec![
                ("sales", Source::Step("sales_in_window")),
                ("addresses", Source::Step("state_addresses")),
            ],
            &[Kernel::Join(JoinKind::Semi)],
            "sales JOIN customer_address ON ship_addr_sk = ca_address_sk",
            move |inp| {
                let plan = semi_join(
                    inp.get("sales")?.lazy(),
                    inp.get("addresses")?.lazy(),
                    ch.ship_addr,
                    "ca_address_sk",
                );
                collect(plan, "sales_in_state")
            },
        ),
        step(
            "sales_at_sites",
            vec![
                ("sales", Source::Step("sales_in_state")),
                ("sites", Source::Step("sites")),
            ],
            &[Kernel::Join(JoinKind::Semi)],
            "sales JOIN site ON site_sk = site key",
            move |inp| {
                let plan = semi_join(
                    inp.get("sales")?.lazy(),
                    inp.get("sites")?.lazy(),
                    ch.site,
                    ch.site_key,
                );
                collect(plan, "sales_at_sites")
            },
        ),
    ]
}

/// The final aggregate and ORDER BY ... LIMIT 100 shared by queries 16, 94 and 95,
/// reading the step `input`.
pub(crate) fn totals_steps(ch: ChannelColumns, input: &'static str) -> Vec<Step> {
    vec![
        step(
            "order_totals",
            vec![("sales", Source::Step(input))],
            // A global group-by: count distinct, sums and counts; then NULL-for-empty sums.
            &[Kernel::GroupBy, Kernel::Project],
            "SELECT count(DISTINCT order) \"order count\", sum(ship_cost) \"total shipping cost\", \
             sum(net_profit) \"total net profit\"",
            move |inp| {
                let plan = inp
                    .get("sales")?
                    .lazy()
                    .select([
                        col(ch.order).drop_nulls().n_unique().alias("order_count"),
                        col(ch.ship_cost).sum().alias("cost_sum"),
                        col(ch.ship_cost).count().alias("cost_count"),
                        col(ch.net_profit).sum().alias("profit_sum"),
                        col(ch.net_profit).count().alias("profit_count"),
                    ])
                    .select([
                        // count(DISTINCT ...) is BIGINT in DuckDB; Polars counts in IdxSize.
                        col("order_count")
                            .cast(DataType::Int64)
                            .alias("order count"),
                        sum_or_null("cost_sum", "cost_count", MONEY_SCALE, "total shipping cost"),
                        sum_or_null("profit_sum", "profit_count", MONEY_SCALE, "total net profit"),
                    ]);
                collect(plan, "order_totals")
            },
        ),
        step(
            "sorted_totals",
            vec![("totals", Source::Step("order_totals"))],
            &[Kernel::Sort, Kernel::Limit],
            "ORDER BY count(DISTINCT order) LIMIT 100",
            |inp| {
                let plan = inp
                    .get("totals")?
                    .lazy()
                    .sort(
                        ["order count"],
                        SortMultipleOptions::default().with_nulls_last(true),
                    )
                    .limit(100);
                collect(plan, "sorted_totals")
            },
        ),
    ]
}

fn exists_pipeline(name: &str, ch: ChannelColumns, params: &OrderQueryParams) -> Pipeline {
    let mut steps = dimension_steps(ch, params);
    steps.push(step(
        "multi_warehouse_orders",
        vec![("sales", Source::table(ch.sales, &[ch.order, ch.warehouse]))],
        &[Kernel::GroupBy, Kernel::Filter, Kernel::Project],
        "SELECT order FROM sales GROUP BY order HAVING min(warehouse) < max(warehouse)",
        move |inp| {
            let plan = inp
                .get("sales")?
                .lazy()
                .group_by([col(ch.order)])
                .agg([
                    col(ch.warehouse).min().alias("wh_min"),
                    col(ch.warehouse).max().alias("wh_max"),
                ])
                .filter(col("wh_min").lt(col("wh_max")))
                .select([col(ch.order).alias("multi_wh_order")]);
            collect(plan, "multi_warehouse_orders")
        },
    ));
    steps.extend(filtered_sales_steps(
        ch,
        &[
            ch.order,
            ch.warehouse,
            ch.ship_date,
            ch.ship_addr,
            ch.site,
            ch.ship_cost,
            ch.net_profit,
        ],
    ));
    steps.push(step(
        "sales_multi_warehouse",
        vec![
            ("sales", Source::Step("sales_at_sites")),
            ("orders", Source::Step("multi_warehouse_orders")),
        ],
        &[Kernel::Filter, Kernel::Join(JoinKind::Semi)],
        "EXISTS (SELECT * FROM sales s2 WHERE s1.order = s2.order AND s1.warehouse <> s2.warehouse)",
        move |inp| {
            let plan = semi_join(
                inp.get("sales")?
                    .lazy()
                    .filter(col(ch.warehouse).is_not_null()),
                inp.get("orders")?.lazy(),
                ch.order,
                "multi_wh_order",
            );
            collect(plan, "sales_multi_warehouse")
        },
    ));
    steps.push(step(
        "sales_not_returned",
        vec![
            ("sales", Source::Step("sales_multi_warehouse")),
            ("returns", Source::table(ch.returns, &[ch.returns_order])),
        ],
        &[Kernel::Join(JoinKind::Anti)],
        "NOT EXISTS (SELECT * FROM returns r WHERE s1.order = r.order)",
        move |inp| {
            let plan = inp.get("sales")?.lazy().join(
                inp.get("returns")?.lazy(),
                [col(ch.order)],
                [col(ch.returns_order)],
                JoinArgs::new(JoinType::Anti),
            );
            collect(plan, "sales_not_returned")
        },
    ));
    steps.extend(totals_steps(ch, "sales_not_returned"));
    Pipeline {
        name: name.to_string(),
        steps,
        row_order: RowOrder::Ordered,
    }
}
