//! Every RemoteFrame verb (run on the query engine) against Polars on the same data,
//! at several budgets.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{assert_same, dim, env, fact, Backend};
use polars::prelude::{self as pl, df, DataFrame, DataType, IntoLazy, JoinArgs, NamedFrom, NULL};
use scad_remote_frame::query::expr::{avg, col, count, count_distinct, lit, max, median, min, sum};
use scad_remote_frame::{Budget, Error, FrameEnv, JoinType, NameKind, RemoteFrame};

fn polars_join(l: &DataFrame, r: &DataFrame, lk: &[&str], rk: &[&str], how: JoinType) -> DataFrame {
    use pl::col;
    let how = match how {
        JoinType::Inner => pl::JoinType::Inner,
        JoinType::Left => pl::JoinType::Left,
        JoinType::Right => pl::JoinType::Right,
        JoinType::Full => pl::JoinType::Full,
        JoinType::LeftSemi => pl::JoinType::Semi,
        JoinType::LeftAnti => pl::JoinType::Anti,
        other => panic!("no Polars join for {other}"),
    };
    let e = |k: &[&str]| k.iter().map(|c| col(*c)).collect::<Vec<_>>();
    l.clone()
        .lazy()
        .join(r.clone().lazy(), e(lk), e(rk), JoinArgs::new(how))
        .collect()
        .unwrap()
}

const HOWS: [JoinType; 6] = [
    JoinType::Inner,
    JoinType::Left,
    JoinType::Right,
    JoinType::Full,
    JoinType::LeftSemi,
    JoinType::LeftAnti,
];

/// Tables of every awkward shape: duplicates, nulls, empty, one row, all-null keys.
fn cases() -> Vec<(&'static str, DataFrame, DataFrame)> {
    use pl::lit;
    let f = fact(11, 400, 30);
    let d = dim(12, 150, 40);
    let all_null_keys = d
        .clone()
        .lazy()
        .with_columns([
            lit(NULL).cast(DataType::Int64).alias("d1"),
            lit(NULL).cast(DataType::String).alias("d2"),
        ])
        .collect()
        .unwrap();
    vec![
        ("random", f.clone(), d.clone()),
        ("empty left", f.clear(), d.clone()),
        ("empty right", f.clone(), d.clear()),
        ("one row", f.slice(3, 1), d.slice(0, 1)),
        ("all-null right keys", f.clone(), all_null_keys),
    ]
}

#[test]
fn joins_match_polars_on_awkward_tables() {
    let e = env(Backend::Local, 64 << 20);
    let env = e.env.with_chunk_rows(64);
    for (name, l, r) in cases() {
        let lf = RemoteFrame::from_polars(&env, &l).unwrap();
        let rf = RemoteFrame::from_polars(&env, &r).unwrap();
        for how in HOWS {
            for (lk, rk) in [
                (vec!["k1"], vec!["d1"]),
                (vec!["k1", "k2"], vec!["d1", "d2"]),
            ] {
                let got = lf.join(&rf, &lk, &rk, how).unwrap().to_polars().unwrap();
                let want = polars_join(&l, &r, &lk, &rk, how);
                assert_same(&got, &want, &format!("{name} {how:?} on {lk:?}"));
            }
        }
    }
}

#[test]
fn joins_at_100_25_and_5_percent_budgets_match_and_stay_under_budget() {
    // Every join type over local memory elements, inner joins also over tcp.
    for (backend, hows) in [(Backend::Local, &HOWS[..]), (Backend::Tcp, &HOWS[..1])] {
        let e = env(backend, 128 << 20);
        let base = e.env.with_chunk_rows(32);
        let l = fact(21, 3000, 2500)
            .select(["k1", "k2", "qty", "name"])
            .unwrap();
        let r = dim(22, 2500, 2500);
        let lf = RemoteFrame::from_polars(&base, &l).unwrap();
        let rf = RemoteFrame::from_polars(&base, &r).unwrap();
        let build = rf.data_bytes();
        for &how in hows {
            let want = polars_join(&l, &r, &["k1", "k2"], &["d1", "d2"], how);
            for pct in [100u64, 25, 5] {
                let budget = build * pct / 100;
                let env = base.with_budget(Budget::bytes(budget).unwrap());
                let got = lf
                    .with_env(&env)
                    .join(&rf, ["k1", "k2"], ["d1", "d2"], how)
                    .unwrap();
                let stats = env.stats();
                assert_same(
                    &got.to_polars().unwrap(),
                    &want,
                    &format!("{backend:?} {how:?} at {pct}%"),
                );
                assert!(
                    stats.peak_local_bytes <= budget,
                    "{backend:?} {how:?} at {pct}%: peak {} > budget {budget} ({stats})",
                    stats.peak_local_bytes
                );
                if pct == 5 && matches!(how, JoinType::Inner | JoinType::Left) {
                    assert!(stats.spill_files > 0, "{how:?} at 5% must spill ({stats})");
                }
                got.free().unwrap();
            }
        }
    }
}

#[test]
fn a_skewed_key_on_one_side_is_joined_building_on_the_other() {
    use pl::{col, lit, when};
    let e = env(Backend::Local, 256 << 20);
    let base = e.env.with_chunk_rows(32);
    // Half of the right side has key 7.
    let r = dim(31, 16_000, 16_000)
        .lazy()
        .with_row_index("i", None)
        .with_columns([when(col("i").lt(lit(8000)))
            .then(lit(7i64))
            .otherwise(col("d1"))
            .alias("d1")])
        .select([col("d1"), col("w"), col("label")])
        .collect()
        .unwrap();
    let l = fact(32, 1000, 16_000).select(["k1", "qty"]).unwrap();
    let lf = RemoteFrame::from_polars(&base, &l).unwrap();
    let rf = RemoteFrame::from_polars(&base, &r).unwrap();
    let budget = rf.data_bytes() / 10;
    let env = base.with_budget(Budget::bytes(budget).unwrap());
    // The side without the skewed key fits, so the join builds on it whatever
    // the planner estimated.
    for how in HOWS {
        let got = lf.with_env(&env).join(&rf, ["k1"], ["d1"], how).unwrap();
        let want = polars_join(&l, &r, &["k1"], &["d1"], how);
        assert_same(&got.to_polars().unwrap(), &want, &format!("skewed {how:?}"));
    }
}

#[test]
fn group_by_and_distinct_match_polars_at_all_budgets() {
    let e = env(Backend::Tcp, 128 << 20);
    let base = e.env.with_chunk_rows(64);
    let df = fact(41, 6000, 2500);
    let frame = RemoteFrame::from_polars(&base, &df).unwrap();
    let aggs = || {
        vec![
            sum(col("qty")).alias("sum_qty"),
            avg(col("price")).alias("avg_price"),
            count(col("qty")).alias("n"),
            count_distinct(col("name")).alias("names"),
            min(col("day")).alias("first"),
            max(col("cents")).alias("most"),
            count(lit(1)).alias("rows"),
        ]
    };
    let keys = ["k1", "k2"];
    let want = {
        use pl::{col, len, lit, when};
        // SQL's sum of no values is null; Polars' is 0.
        df.clone()
            .lazy()
            .group_by([col("k1"), col("k2")])
            .agg([
                when(col("qty").count().gt(lit(0)))
                    .then(col("qty").sum())
                    .otherwise(lit(NULL))
                    .alias("sum_qty"),
                col("price").mean().alias("avg_price"),
                col("qty").count().cast(DataType::Int64).alias("n"),
                col("name")
                    .drop_nulls()
                    .n_unique()
                    .cast(DataType::Int64)
                    .alias("names"),
                col("day").min().alias("first"),
                col("cents").max().alias("most"),
                len().cast(DataType::Int64).alias("rows"),
            ])
            .collect()
            .unwrap()
    };
    let want_distinct = {
        use pl::col;
        df.clone()
            .lazy()
            .select([col("k2"), col("flag")])
            .unique(None, pl::UniqueKeepStrategy::Any)
            .collect()
            .unwrap()
    };
    let bytes = frame.data_bytes();
    for pct in [100u64, 25, 5] {
        let budget = bytes * pct / 100;
        let env = base.with_budget(Budget::bytes(budget).unwrap());
        let f = frame.with_env(&env);
        let got = f.group_by(&keys, aggs()).unwrap().to_polars().unwrap();
        assert_same(&got, &want, &format!("group-by at {pct}%"));
        let got = f
            .select([col("k2"), col("flag")])
            .unwrap()
            .distinct::<&str>(None)
            .unwrap();
        assert_same(
            &got.to_polars().unwrap(),
            &want_distinct,
            &format!("distinct at {pct}%"),
        );
        let s = env.stats();
        assert!(s.peak_local_bytes <= budget, "at {pct}%: {s}");
        if pct == 5 {
            assert!(s.spill_files > 0, "at {pct}%: {s}");
        }
    }
    // Empty input keeps the output schema.
    let empty = RemoteFrame::from_polars(&base, &df.clear()).unwrap();
    let got = empty.group_by(&keys, aggs()).unwrap().to_polars().unwrap();
    assert_eq!(got.schema(), want.schema());
    assert_eq!(got.height(), 0);
    // Distinct on a subset: one row per key, each a row of the frame.
    let got = frame.distinct(Some(&["k2"])).unwrap().to_polars().unwrap();
    assert_eq!(got.height(), df.column("k2").unwrap().n_unique().unwrap());
    assert_eq!(got.width(), df.width());
}

#[test]
fn group_by_with_one_huge_group_reports_the_key() {
    let e = env(Backend::Local, 64 << 20);
    let base = e.env.with_chunk_rows(64);
    let df = df!("k" => vec![5i64; 4000], "v" => (0..4000i64).collect::<Vec<_>>()).unwrap();
    let frame = RemoteFrame::from_polars(&base, &df).unwrap();
    let env = base.with_budget(Budget::bytes(frame.data_bytes() / 10).unwrap());
    let before = common::available(&base);
    let err = frame
        .with_env(&env)
        // A median holds its group's values: one group cannot be split.
        .group_by(&["k"], [median(col("v"))])
        .unwrap_err();
    assert!(matches!(err, Error::Skew { .. }), "{err}");
    assert!(err.to_string().contains("k=5"), "{err}");
    assert_eq!(common::available(&base), before, "nothing left allocated");
    // A sum's state does not grow with its group: the same group is summed.
    let sums = frame
        .with_env(&env)
        .group_by(&["k"], [sum(col("v"))])
        .unwrap()
        .to_polars()
        .unwrap();
    assert_eq!(sums.height(), 1);
}

#[test]
fn filter_project_sort_limit_match_polars() {
    let e = env(Backend::Local, 64 << 20);
    let base = e.env.with_chunk_rows(500);
    let df = fact(51, 12_000, 100);
    let frame = RemoteFrame::from_polars(&base, &df).unwrap();
    let env = base.with_budget(Budget::bytes(frame.data_bytes() / 4).unwrap());
    let f = frame.with_env(&env);
    let day = |d: i32| lit(datafusion::common::ScalarValue::Date32(Some(d)));
    let pred = col("day")
        .gt_eq(day(10_100))
        .and(col("day").lt(day(10_400)))
        .and(col("k2").eq(lit("s3")));
    let got = f.filter(pred).unwrap();
    let want = {
        use pl::{col, lit};
        let day = |d: i32| lit(d).cast(DataType::Date);
        let pred = col("day")
            .gt_eq(day(10_100))
            .and(col("day").lt(day(10_400)))
            .and(col("k2").eq(lit("s3")));
        df.clone().lazy().filter(pred).collect().unwrap()
    };
    assert!(
        got.to_polars().unwrap().equals_missing(&want),
        "filter keeps order"
    );

    let got = f
        .select([
            col("k1"),
            (datafusion::prelude::cast(col("qty"), arrow_schema::DataType::Float64) * col("price")
                - lit(1.5))
            .alias("net"),
        ])
        .unwrap()
        .to_polars()
        .unwrap();
    let want = {
        use pl::{col, lit};
        df.clone()
            .lazy()
            .select([
                col("k1"),
                (col("qty").cast(DataType::Float64) * col("price") - lit(1.5)).alias("net"),
            ])
            .collect()
            .unwrap()
    };
    assert!(got.equals_missing(&want), "select keeps order and values");
    let got = f
        .with_columns([(col("qty") + lit(1i64)).alias("q1"), lit(0i64).alias("k1")])
        .unwrap()
        .to_polars()
        .unwrap();
    assert_eq!(got.width(), df.width() + 1);
    assert_eq!(
        got.get_column_names()[0].as_str(),
        "k1",
        "replaced in place"
    );
    let zeros = pl::Series::new("k1".into(), vec![0i64; got.height()]);
    assert!(got
        .column("k1")
        .unwrap()
        .as_materialized_series()
        .equals(&zeros));

    // Sorts are stable and spill rather than fail: the whole frame at a quarter of it.
    let by = vec![col("k2").sort(false, false), col("qty").sort(true, false)];
    let want = {
        df.clone()
            .lazy()
            .sort(
                ["k2", "qty"],
                pl::SortMultipleOptions::default()
                    .with_order_descending_multi([true, false])
                    .with_nulls_last(true)
                    .with_maintain_order(true),
            )
            .collect()
            .unwrap()
    };
    env.reset_stats();
    let got = f.sort(by.clone()).unwrap().to_polars().unwrap();
    assert!(got.equals_missing(&want), "stable sort");
    assert!(env.stats().spill_files > 0, "{}", env.stats());
    let got = f.sort_limit(by, 25).unwrap().to_polars().unwrap();
    assert!(got.equals_missing(&want.slice(0, 25)), "top 25");

    let got = f.limit(77).unwrap().to_polars().unwrap();
    assert!(got.equals_missing(&df.slice(0, 77)));
    assert_eq!(f.limit(50_000).unwrap().rows(), 12_000);
    assert!(
        env.budget().allows(env.stats().peak_local_bytes),
        "{}",
        env.stats()
    );
}

#[test]
fn verb_errors_are_clear() {
    let e = env(Backend::Local, 16 << 20);
    let env: FrameEnv = e.env.clone();
    let a =
        RemoteFrame::from_polars(&env, &df!("a" => [1i64, 2], "s" => ["x", "y"]).unwrap()).unwrap();
    let b = RemoteFrame::from_polars(&env, &df!("b" => [1i32, 2]).unwrap()).unwrap();
    let err = a.join(&b, ["a"], ["b"], JoinType::Inner).unwrap_err();
    assert!(matches!(err, Error::TypeMismatch { .. }), "{err}");
    assert!(
        err.to_string().contains("int64") && err.to_string().contains("int32"),
        "{err}"
    );
    let err = a.join(&b, ["zz"], ["b"], JoinType::Inner).unwrap_err();
    assert!(
        matches!(&err, Error::UnknownColumn { name, .. } if name == "zz"),
        "{err}"
    );
    let err = a.join(&b, ["a", "s"], ["b"], JoinType::Inner).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    let unknown = |err: &Error, col: &str| matches!(err, Error::UnknownName { kind: NameKind::Column, name, .. } if name.ends_with(col));
    let err = a.filter(col("nope").eq(lit(1))).unwrap_err();
    assert!(unknown(&err, "nope"), "{err}");
    let err = a.group_by(&["a"], [sum(col("missing"))]).unwrap_err();
    assert!(unknown(&err, "missing"), "{err}");
    let err = a.sort(vec![]).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    // Nothing is left allocated by the failed verbs.
    let before = common::available(&env);
    for _ in 0..3 {
        a.filter(col("nope").eq(lit(1))).unwrap_err();
        a.join(&b, ["a"], ["b"], JoinType::Inner).unwrap_err();
    }
    assert_eq!(common::available(&env), before);
}
