//! Every kernel against Polars on the same data, at several budgets.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{assert_same, dim, env, fact, Backend};
use polars::prelude::*;
use scad_remote_frame::{Budget, Error, FrameEnv, JoinType, RemoteFrame};

fn polars_join(l: &DataFrame, r: &DataFrame, lk: &[&str], rk: &[&str], how: JoinType) -> DataFrame {
    let how = match how {
        JoinType::Inner => polars::prelude::JoinType::Inner,
        JoinType::Left => polars::prelude::JoinType::Left,
        JoinType::Semi => polars::prelude::JoinType::Semi,
        JoinType::Anti => polars::prelude::JoinType::Anti,
    };
    let e = |k: &[&str]| k.iter().map(|c| col(*c)).collect::<Vec<_>>();
    l.clone()
        .lazy()
        .join(r.clone().lazy(), e(lk), e(rk), JoinArgs::new(how))
        .collect()
        .unwrap()
}

const HOWS: [JoinType; 4] = [
    JoinType::Inner,
    JoinType::Left,
    JoinType::Semi,
    JoinType::Anti,
];

/// Tables of every awkward shape: duplicates, nulls, empty, one row, all-null keys.
fn cases() -> Vec<(&'static str, DataFrame, DataFrame)> {
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
                if pct == 5 {
                    assert!(
                        stats.partitions > 0,
                        "{how:?} at 5% must partition ({stats})"
                    );
                }
                got.free().unwrap();
            }
        }
    }
}

#[test]
fn skewed_keys_use_a_nested_loop_or_name_the_key() {
    let e = env(Backend::Local, 256 << 20);
    let base = e.env.with_chunk_rows(32);
    // Half of the right side has key 7.
    let r = dim(31, 1600, 1600)
        .lazy()
        .with_row_index("i", None)
        .with_columns([when(col("i").lt(lit(800)))
            .then(lit(7i64))
            .otherwise(col("d1"))
            .alias("d1")])
        .select([col("d1"), col("w"), col("label")])
        .collect()
        .unwrap();
    let l = fact(32, 1000, 1600).select(["k1", "qty"]).unwrap();
    let lf = RemoteFrame::from_polars(&base, &l).unwrap();
    let rf = RemoteFrame::from_polars(&base, &r).unwrap();
    let budget = rf.data_bytes() / 10;
    let env = base.with_budget(Budget::bytes(budget).unwrap());
    for how in [JoinType::Inner, JoinType::Semi, JoinType::Anti] {
        let got = lf.with_env(&env).join(&rf, ["k1"], ["d1"], how).unwrap();
        let want = polars_join(&l, &r, &["k1"], &["d1"], how);
        assert_same(&got.to_polars().unwrap(), &want, &format!("skewed {how:?}"));
    }
    assert!(env.stats().nested_loop_partitions > 0, "{}", env.stats());
    let err = lf
        .with_env(&env)
        .join(&rf, ["k1"], ["d1"], JoinType::Left)
        .unwrap_err();
    assert!(matches!(err, Error::Skew { .. }), "{err}");
    assert!(err.to_string().contains("d1=7"), "{err}");
}

#[test]
fn group_by_and_distinct_match_polars_at_all_budgets() {
    let e = env(Backend::Tcp, 128 << 20);
    let base = e.env.with_chunk_rows(64);
    let df = fact(41, 6000, 2500);
    let frame = RemoteFrame::from_polars(&base, &df).unwrap();
    let aggs = || {
        [
            col("qty").sum().alias("sum_qty"),
            col("price").mean().alias("avg_price"),
            col("qty").count().alias("n"),
            col("name").n_unique().alias("names"),
            col("day").min().alias("first"),
            col("cents").max().alias("most"),
            len().alias("rows"),
        ]
    };
    let keys = ["k1", "k2"];
    let want = df
        .clone()
        .lazy()
        .group_by([col("k1"), col("k2")])
        .agg(aggs())
        .collect()
        .unwrap();
    let want_distinct = df
        .clone()
        .lazy()
        .select([col("k2"), col("flag")])
        .unique(None, UniqueKeepStrategy::Any)
        .collect()
        .unwrap();
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
        if pct < 100 {
            assert!(s.partitions > 0, "at {pct}%: {s}");
        }
    }
    // Empty input keeps the output schema.
    let empty = RemoteFrame::from_polars(&base, &df.clear()).unwrap();
    let got = empty.group_by(&keys, aggs()).unwrap().to_polars().unwrap();
    assert_eq!(got.schema(), want.schema());
    assert_eq!(got.height(), 0);
}

#[test]
fn group_by_with_one_huge_group_reports_the_key() {
    let e = env(Backend::Local, 64 << 20);
    let base = e.env.with_chunk_rows(64);
    let df = df!("k" => vec![5i64; 4000], "v" => (0..4000i64).collect::<Vec<_>>()).unwrap();
    let frame = RemoteFrame::from_polars(&base, &df).unwrap();
    let env = base.with_budget(Budget::bytes(frame.data_bytes() / 10).unwrap());
    let err = frame
        .with_env(&env)
        .group_by(&["k"], [col("v").sum()])
        .unwrap_err();
    assert!(matches!(err, Error::Skew { .. }), "{err}");
    assert!(err.to_string().contains("k=5"), "{err}");
}

#[test]
fn filter_project_sort_limit_match_polars() {
    let e = env(Backend::Local, 64 << 20);
    let base = e.env.with_chunk_rows(50);
    let df = fact(51, 1200, 100);
    let frame = RemoteFrame::from_polars(&base, &df).unwrap();
    let env = base.with_budget(Budget::bytes(frame.data_bytes() / 4).unwrap());
    let f = frame.with_env(&env);
    let day = |y: i32| lit(y).cast(DataType::Date);
    let pred = col("day")
        .gt_eq(day(10_100))
        .and(col("day").lt(day(10_400)))
        .and(col("k2").eq(lit("s3")));
    let got = f.filter(pred.clone()).unwrap();
    let want = df.clone().lazy().filter(pred).collect().unwrap();
    assert!(
        got.to_polars().unwrap().equals_missing(&want),
        "filter keeps order"
    );

    let proj = [
        col("k1"),
        (col("qty").cast(DataType::Float64) * col("price") - lit(1.5)).alias("net"),
        (col("cents") * lit(2)).alias("twice"),
    ];
    let got = f.select(proj.clone()).unwrap().to_polars().unwrap();
    let want = df.clone().lazy().select(proj).collect().unwrap();
    assert_same(&got, &want, "select");
    let got = f
        .with_columns([(col("qty") + lit(1)).alias("q1")])
        .unwrap()
        .to_polars()
        .unwrap();
    assert_eq!(got.width(), df.width() + 1);

    let opts = SortMultipleOptions::default()
        .with_order_descending_multi([true, false])
        .with_nulls_last(true);
    let small = f.filter(col("k1").lt(lit(5))).unwrap();
    let got = small
        .sort(&["k2", "qty"], opts.clone())
        .unwrap()
        .to_polars()
        .unwrap();
    let want = df
        .clone()
        .lazy()
        .filter(col("k1").lt(lit(5)))
        .sort(["k2", "qty"], opts.clone())
        .collect()
        .unwrap();
    assert!(
        got.select(["k2", "qty"])
            .unwrap()
            .equals_missing(&want.select(["k2", "qty"]).unwrap()),
        "sort order"
    );
    let err = f.sort(&["k2"], opts.clone()).unwrap_err();
    assert!(
        matches!(err, Error::OutOfBudget { need: Some(_), .. }),
        "{err}"
    );

    let got = f
        .sort_limit(
            &["price", "k1"],
            opts.clone().with_order_descending_multi([false, true]),
            25,
        )
        .unwrap();
    let want = df
        .clone()
        .lazy()
        .sort(
            ["price", "k1"],
            opts.with_order_descending_multi([false, true]),
        )
        .limit(25)
        .collect()
        .unwrap();
    assert!(got
        .to_polars()
        .unwrap()
        .select(["price", "k1"])
        .unwrap()
        .equals_missing(&want.select(["price", "k1"]).unwrap()));

    let got = f.limit(77).unwrap().to_polars().unwrap();
    assert!(got.equals_missing(&df.slice(0, 77)));
    assert_eq!(f.limit(5000).unwrap().rows(), 1200);
    assert!(
        env.budget().allows(env.stats().peak_local_bytes),
        "{}",
        env.stats()
    );
}

#[test]
fn kernel_errors_are_clear() {
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
    let err = a.filter(col("nope").eq(lit(1))).unwrap_err();
    assert!(
        matches!(&err, Error::UnknownColumn { name, .. } if name == "nope"),
        "{err}"
    );
    let err = a.group_by(&["a"], [col("missing").sum()]).unwrap_err();
    assert!(
        matches!(&err, Error::UnknownColumn { name, .. } if name == "missing"),
        "{err}"
    );
}
