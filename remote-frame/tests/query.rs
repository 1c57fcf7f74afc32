//! The query engine against Polars in memory, on random tables with nulls, duplicate
//! and skewed keys, at budgets of 100 %, 25 % and 5 % of the input; its errors; and
//! that a failing query leaves no remote memory behind.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{assert_same, available, dim, env, fact, Backend};
use polars::prelude::*;
use scad_remote_frame::{Budget, Error, FrameEnv, QuerySession, RemoteFrame};

struct Fixture {
    _env: common::Env,
    env: FrameEnv,
    fact: DataFrame,
    dim: DataFrame,
    frames: Vec<(&'static str, RemoteFrame)>,
    input_bytes: u64,
}

fn fixture(fact_rows: usize, dim_rows: usize, fact_keys: i64, dim_keys: i64) -> Fixture {
    let e = env(Backend::Tcp, 256 << 20);
    let env = e.env.with_chunk_rows(4096);
    let f = fact(1, fact_rows, fact_keys);
    let d = dim(2, dim_rows, dim_keys);
    let ff = RemoteFrame::from_polars(&env, &f).unwrap();
    let df = RemoteFrame::from_polars(&env, &d).unwrap();
    let input_bytes = ff.data_bytes() + df.data_bytes();
    Fixture {
        env,
        _env: e,
        fact: f,
        dim: d,
        frames: vec![("fact", ff), ("dim", df)],
        input_bytes,
    }
}

impl Fixture {
    /// A session at `fraction` of the inputs' bytes (`None`: unlimited).
    fn session(&self, fraction: Option<f64>) -> QuerySession {
        self.session_with(fraction, None)
    }

    /// A session at `fraction` of the input as its budget, planning `partitions`
    /// partitions (None: as many as the budget and cores give).
    fn session_with(&self, fraction: Option<f64>, partitions: Option<usize>) -> QuerySession {
        let env = match fraction {
            Some(f) => self
                .env
                .with_budget(Budget::bytes((self.input_bytes as f64 * f) as u64).unwrap()),
            None => self.env.clone(),
        };
        let s = match partitions {
            Some(p) => QuerySession::with_partitions(&env, p).unwrap(),
            None => QuerySession::new(&env).unwrap(),
        };
        for (name, frame) in &self.frames {
            s.register(name, frame).unwrap();
        }
        s
    }

    /// Runs `sql` at each budget and checks its answer against `want`, the peak
    /// against the budget and that no spill memory stays allocated; returns how many
    /// spill files the smallest budget wrote.
    fn check(&self, what: &str, sql: &str, want: &DataFrame, ordered: bool) -> u64 {
        self.check_at(&[1.0, 0.25, 0.05], what, sql, want, ordered)
    }

    fn check_at(
        &self,
        fractions: &[f64],
        what: &str,
        sql: &str,
        want: &DataFrame,
        ordered: bool,
    ) -> u64 {
        let mut spills = 0;
        for &fraction in fractions {
            let s = self.session(Some(fraction));
            let out = s
                .sql(sql)
                .unwrap_or_else(|e| panic!("{what} at {fraction}: {e}"));
            let got = out.to_polars().unwrap();
            if ordered {
                assert!(out.ordered(), "{what}: the plan should be ordered");
                assert_eq!(got.height(), want.height(), "{what} at {fraction}: rows");
                for (g, w) in got.columns().iter().zip(want.columns()) {
                    assert!(
                        g.as_materialized_series()
                            .equals_missing(w.as_materialized_series()),
                        "{what} at {fraction}: column {} differs",
                        g.name()
                    );
                }
            } else {
                assert_same(&got, want, &format!("{what} at {fraction}"));
            }
            let stats = out.stats();
            assert!(
                stats.budget.allows(stats.peak_local_bytes),
                "{what} at {fraction}: peak {} over budget {}",
                stats.peak_local_bytes,
                stats.budget
            );
            assert_eq!(s.spill_bytes_held(), 0, "{what}: spill memory left behind");
            spills = stats.spill_files;
        }
        spills
    }
}

fn polars_join(f: &Fixture, how: JoinType) -> LazyFrame {
    f.fact.clone().lazy().join(
        f.dim.clone().lazy(),
        [col("k1")],
        [col("d1")],
        JoinArgs::new(how),
    )
}

#[test]
fn joins_of_every_kind_match_polars_and_spill_within_the_budget() {
    let f = fixture(60_000, 20_000, 5_000, 5_000);
    let inner = polars_join(&f, JoinType::Inner)
        .select([col("k1"), col("qty"), col("w")])
        .collect()
        .unwrap();
    let spills = f.check(
        "inner join",
        "SELECT f.k1, f.qty, d.w FROM fact f JOIN dim d ON f.k1 = d.d1",
        &inner,
        false,
    );
    assert!(spills > 0, "the inner join should spill at 5 %");
    let left = polars_join(&f, JoinType::Left)
        .select([col("k1"), col("qty"), col("w")])
        .collect()
        .unwrap();
    f.check(
        "left join",
        "SELECT f.k1, f.qty, d.w FROM fact f LEFT JOIN dim d ON f.k1 = d.d1",
        &left,
        false,
    );
    let full = polars_join(&f, JoinType::Full)
        .select([col("qty"), col("w")])
        .collect()
        .unwrap();
    f.check(
        "full join",
        "SELECT f.qty, d.w FROM fact f FULL JOIN dim d ON f.k1 = d.d1",
        &full,
        false,
    );
    let semi = polars_join(&f, JoinType::Semi)
        .select([col("k1"), col("qty")])
        .collect()
        .unwrap();
    f.check(
        "semi join",
        "SELECT k1, qty FROM fact WHERE k1 IN (SELECT d1 FROM dim)",
        &semi,
        false,
    );
    let anti = polars_join(&f, JoinType::Anti)
        .select([col("k1"), col("qty")])
        .collect()
        .unwrap();
    f.check(
        "anti join",
        "SELECT k1, qty FROM fact f WHERE NOT EXISTS (SELECT 1 FROM dim d WHERE d.d1 = f.k1)",
        &anti,
        false,
    );
}

#[test]
fn skewed_probe_keys_join_correctly() {
    // Three key values on the probe side, a thousand on the build side.
    let f = fixture(40_000, 20_000, 3, 1_000);
    let want = polars_join(&f, JoinType::Inner)
        .select([col("k1"), col("qty"), col("label")])
        .collect()
        .unwrap();
    f.check(
        "skewed join",
        "SELECT f.k1, f.qty, d.label FROM fact f JOIN dim d ON f.k1 = d.d1",
        &want,
        false,
    );
}

#[test]
fn group_by_matches_polars() {
    let f = fixture(60_000, 10, 20_000, 10);
    let want = f
        .fact
        .clone()
        .lazy()
        .group_by([col("k1")])
        .agg([
            len().cast(DataType::Int64).alias("n"),
            col("qty").sum().alias("s"),
            col("price").min().alias("lo"),
            col("day").max().alias("hi"),
            col("k2")
                .drop_nulls()
                .n_unique()
                .cast(DataType::Int64)
                .alias("nd"),
        ])
        .collect()
        .unwrap();
    // 20,000 groups do not fit 5 %: the final phase partitions into memory elements.
    let spills = f.check(
        "group-by",
        "SELECT k1, count(*) AS n, CAST(coalesce(sum(qty), 0) AS BIGINT) AS s, min(price) AS lo, \
         max(day) AS hi, count(DISTINCT k2) AS nd FROM fact GROUP BY k1",
        &want,
        false,
    );
    assert!(spills > 0, "the group-by should spill at 5 %");
}

#[test]
fn order_by_matches_polars() {
    let f = fixture(60_000, 10, 1_000, 10);
    let want = f
        .fact
        .clone()
        .lazy()
        .select([col("k1"), col("qty"), col("price"), col("name")])
        .sort(
            ["price", "qty", "k1", "name"],
            SortMultipleOptions::default().with_nulls_last(true),
        )
        .collect()
        .unwrap();
    f.check(
        "order by",
        "SELECT k1, qty, price, name FROM fact ORDER BY price, qty, k1, name",
        &want,
        true,
    );
}

#[test]
fn window_functions_match_polars() {
    let f = fixture(60_000, 10, 2_000, 10);
    let want = f
        .fact
        .clone()
        .lazy()
        .select([
            col("k1"),
            col("qty"),
            col("qty").sum().over([col("k1")]).unwrap().alias("tot"),
        ])
        .collect()
        .unwrap();
    f.check(
        "window",
        "SELECT k1, qty, CAST(coalesce(sum(qty) OVER (PARTITION BY k1), 0) AS BIGINT) AS tot \
         FROM fact",
        &want,
        false,
    );
    // A second window over the first one's output, on other partitions: each holds
    // a partition at a time under the budget, each sort keeps what it needs to merge
    // its runs. With DataFusion's sorts this failed at 5 % (the second sort could not
    // get one batch beside the windows' reserved quarters) and now and then at 100 %
    // (the second sort took the memory the first one's merge then asked for).
    let want = f
        .fact
        .clone()
        .lazy()
        .with_columns([
            (col("k1") % lit(97i64)).alias("g"),
            col("qty").sum().over([col("k1")]).unwrap().alias("tot"),
        ])
        .select([
            col("k1"),
            col("qty"),
            col("tot"),
            col("tot").sum().over([col("g")]).unwrap().alias("gt"),
        ])
        .collect()
        .unwrap();
    f.check_at(
        &[1.0, 0.25, 0.05],
        "two windows",
        "SELECT k1, qty, tot, CAST(sum(tot) OVER (PARTITION BY g) AS BIGINT) AS gt FROM \
         (SELECT k1, qty, k1 % 97 AS g, \
          CAST(coalesce(sum(qty) OVER (PARTITION BY k1), 0) AS BIGINT) AS tot FROM fact) t",
        &want,
        false,
    );
}

#[test]
fn a_window_partition_larger_than_the_budget_fails_naming_the_window_and_key() {
    let f = fixture(60_000, 10, 2_000, 10);
    // One partition (no PARTITION BY) of the whole table at 5 % of it.
    let before = available(&f.env);
    let s = f.session(Some(0.05));
    let e = s
        .sql("SELECT k1, sum(qty) OVER () AS total FROM fact")
        .unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, Error::OutOfBudget { .. }), "{text}");
    assert!(
        text.contains("window") && text.contains("no PARTITION BY"),
        "{text}"
    );
    assert_eq!(s.spill_bytes_held(), 0);
    assert_eq!(available(&f.env), before, "remote memory leaked");
}

#[test]
fn union_and_distinct_match_polars() {
    let f = fixture(30_000, 20_000, 50_000, 50_000);
    let keys = concat(
        [
            f.fact.clone().lazy().select([col("k1")]),
            f.dim.clone().lazy().select([col("d1").alias("k1")]),
        ],
        UnionArgs::default(),
    )
    .unwrap();
    let want = keys
        .clone()
        .unique(None, UniqueKeepStrategy::Any)
        .collect()
        .unwrap();
    // UNION (distinct) is a hash aggregate over both inputs.
    f.check(
        "union",
        "SELECT k1 FROM fact UNION SELECT d1 FROM dim",
        &want,
        false,
    );
    let all = keys.collect().unwrap();
    f.check(
        "union all",
        "SELECT k1 FROM fact UNION ALL SELECT d1 FROM dim",
        &all,
        false,
    );
}

#[test]
fn scans_read_only_the_columns_used() {
    let f = fixture(20_000, 10, 100, 10);
    let s = f.session(None);
    let out = s.sql("SELECT sum(qty) AS s FROM fact").unwrap();
    let table = f.frames[0].1.data_bytes();
    let read = out.stats().scan_bytes;
    assert!(read > 0 && read * 4 < table, "read {read} of {table} bytes");
    let plan = s.explain("SELECT k1, qty FROM fact WHERE qty > 5").unwrap();
    assert!(
        plan.contains("RemoteScanExec") && plan.contains("projection=[k1, qty]"),
        "{plan}"
    );
    let analyzed = out.explain_analyze();
    assert!(analyzed.contains("bytes_read="), "{analyzed}");
}

/// The sum of the scans' `reads` metric in an analyzed plan.
fn scan_reads(analyzed: &str) -> usize {
    analyzed
        .lines()
        .filter(|l| l.contains("RemoteScanExec"))
        .filter_map(|l| l.split("reads=").nth(1))
        .filter_map(|t| t.split([',', ']', ' ']).next()?.parse::<usize>().ok())
        .sum()
}

#[test]
fn scans_read_chunks_in_groups_within_the_budget() {
    // 25 chunks of 4,096 rows; one partition.
    let f = fixture(100_000, 10, 100, 10);
    assert_eq!(f.frames[0].1.chunk_count(), 25);
    let sql = "SELECT sum(qty) AS s FROM fact";
    let unlimited = f.session_with(None, Some(1)).sql(sql).unwrap();
    // All 25 in one read (32 at most): one hand-off and one read per memory element.
    assert_eq!(
        scan_reads(&unlimited.explain_analyze()),
        1,
        "{}",
        unlimited.explain_analyze()
    );
    // A group is a sixty-fourth of the budget in stored bytes: two and a half
    // chunks' worth takes three chunks a read.
    let chunk = unlimited.stats().scan_bytes as f64 / 25.0;
    let with_budget = |bytes: f64| f.session_with(Some(bytes / f.input_bytes as f64), Some(1));
    let out = with_budget(64.0 * 2.5 * chunk).sql(sql).unwrap();
    assert_eq!(
        scan_reads(&out.explain_analyze()),
        9,
        "{}",
        out.explain_analyze()
    );
    // A sixty-fourth less than a chunk as stored: a chunk a read, as the chunks read
    // wait outside the budget's accounting.
    let out = with_budget(64.0 * 0.5 * chunk).sql(sql).unwrap();
    assert_eq!(scan_reads(&out.explain_analyze()), 25);
    assert_same(
        &out.to_polars().unwrap(),
        &unlimited.to_polars().unwrap(),
        "same sum",
    );
    // Under a limit, no chunk is read past it.
    let out = f
        .session_with(None, Some(1))
        .sql("SELECT qty FROM fact LIMIT 10")
        .unwrap();
    assert_eq!(out.rows(), 10);
    assert_eq!(scan_reads(&out.explain_analyze()), 1);
}

#[test]
fn scans_skip_the_chunks_a_filter_excludes() {
    let f = fixture(40_000, 10, 100, 10);
    // Sorted on `day`, the chunks hold disjoint ranges of days.
    let sorted = f
        .fact
        .sort(
            ["day"],
            SortMultipleOptions::default().with_nulls_last(true),
        )
        .unwrap();
    let frame = RemoteFrame::from_polars(&f.env, &sorted).unwrap();
    let s = f.session(None);
    s.register("sorted", &frame).unwrap();
    let days = |lo: i32, hi: i32| {
        sorted
            .clone()
            .lazy()
            .filter(
                col("day")
                    .cast(DataType::Int32)
                    .gt_eq(lit(lo))
                    .and(col("day").cast(DataType::Int32).lt(lit(hi))),
            )
            .select([
                len().cast(DataType::Int64).alias("n"),
                col("qty").sum().alias("s"),
            ])
            .collect()
            .unwrap()
    };
    let full = s
        .sql("SELECT sum(qty) AS s, count(day) AS d FROM sorted")
        .unwrap();
    // 1998-01-01 is day 10227; the table spans days 10000 to 10799.
    let sql = "SELECT count(*) AS n, sum(qty) AS s FROM sorted \
               WHERE day >= DATE '1998-01-01' AND day < DATE '1998-02-01'";
    let out = s.sql(sql).unwrap();
    assert_same(&out.to_polars().unwrap(), &days(10227, 10258), "a month");
    let plan = s.explain(sql).unwrap();
    let total = frame.chunk_count();
    let read: usize = plan
        .split("chunks=")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no chunk count in {plan}"));
    assert!(
        read >= 1 && read * 4 < total,
        "read {read} of {total} chunks: {plan}"
    );
    assert!(
        out.stats().scan_bytes * 4 < full.stats().scan_bytes,
        "{} bytes read for a month, {} for all",
        out.stats().scan_bytes,
        full.stats().scan_bytes
    );
    // No chunk can match: nothing is read, the answer is still right.
    let none = s
        .sql("SELECT count(*) AS n FROM sorted WHERE day < DATE '1990-01-01'")
        .unwrap();
    assert_eq!(none.stats().scan_bytes, 0);
    let n = none.to_polars().unwrap();
    assert_eq!(n.column("n").unwrap().i64().unwrap().get(0), Some(0));
    // Nulls sort last: IS NULL reads only the chunks holding nulls.
    let nulls = s
        .sql("SELECT count(*) AS n FROM sorted WHERE day IS NULL")
        .unwrap();
    let n = nulls.to_polars().unwrap();
    assert_eq!(
        n.column("n").unwrap().i64().unwrap().get(0),
        Some(sorted.column("day").unwrap().null_count() as i64)
    );
    assert!(nulls.stats().scan_bytes * 4 < full.stats().scan_bytes);
    // Bounds prune; the answer still comes from the rows.
    let min_max = s
        .sql("SELECT min(day) AS lo, max(day) AS hi FROM sorted")
        .unwrap()
        .to_polars()
        .unwrap();
    let want = sorted
        .clone()
        .lazy()
        .select([col("day").min().alias("lo"), col("day").max().alias("hi")])
        .collect()
        .unwrap();
    assert_same(&min_max, &want, "min and max");
}

#[test]
fn a_join_chain_joins_its_filtered_relation_first() {
    let f = fixture(20_000, 500, 500, 500);
    // Written fact, unfiltered dim, filtered dim: run fact, filtered, unfiltered.
    let sql = "SELECT count(*) AS n, sum(f.qty) AS s FROM fact f, dim a, dim b \
               WHERE f.k1 = a.d1 AND f.qty = b.d1 AND b.label = 'label-7'";
    let s = f.session(None);
    let plan = s.explain(sql).unwrap();
    let deepest = plan
        .lines()
        .rfind(|l| l.contains("HashJoinExec"))
        .unwrap_or_else(|| panic!("no hash join in {plan}"));
    let keys = deepest
        .split("on=[")
        .nth(1)
        .and_then(|t| t.split(']').next())
        .unwrap_or_default();
    assert!(
        keys.contains("qty@"),
        "the filtered dim is not joined first: {plan}"
    );
    let filtered = f
        .dim
        .clone()
        .lazy()
        .filter(col("label").eq(lit("label-7")))
        .select([col("d1").alias("b1")]);
    let want = f
        .fact
        .clone()
        .lazy()
        .join(
            f.dim.clone().lazy().select([col("d1")]),
            [col("k1")],
            [col("d1")],
            JoinArgs::new(JoinType::Inner),
        )
        .join(
            filtered,
            [col("qty")],
            [col("b1")],
            JoinArgs::new(JoinType::Inner),
        )
        .select([
            len().cast(DataType::Int64).alias("n"),
            col("qty").sum().alias("s"),
        ])
        .collect()
        .unwrap();
    f.check("join chain", sql, &want, false);
}

#[test]
fn results_go_back_to_memory_elements() {
    let f = fixture(5_000, 10, 100, 10);
    let s = f.session(None);
    let out = s
        .sql("SELECT k1, count(*) AS n FROM fact GROUP BY k1")
        .unwrap();
    let frame = out.to_remote_frame(&f.env).unwrap();
    assert_eq!(frame.rows(), out.rows());
    s.register("counts", &frame).unwrap();
    let total = s
        .sql("SELECT sum(n) AS total FROM counts")
        .unwrap()
        .to_polars()
        .unwrap();
    assert_eq!(
        total.column("total").unwrap().i64().unwrap().get(0),
        Some(5_000)
    );
}

#[test]
fn bad_queries_get_clear_errors() {
    let f = fixture(1_000, 10, 100, 10);
    let s = f.session(None);
    let msg = |sql: &str| s.sql(sql).unwrap_err().to_string();
    let e = msg("SELECT * FROM no_such_table");
    assert!(e.contains("no_such_table"), "{e}");
    let e = msg("SELECT no_such_column FROM fact");
    assert!(e.contains("no_such_column"), "{e}");
    let e = msg("SELECT k1 + name FROM fact");
    assert!(e.to_lowercase().contains("utf8") || e.contains("+"), "{e}");
    let e = msg("SELEC 1");
    assert!(e.contains("SELEC"), "{e}");
    let e = msg("CREATE TABLE t AS SELECT 1");
    assert!(e.to_lowercase().contains("ddl"), "{e}");
    let e = msg("INSERT INTO fact SELECT * FROM fact");
    assert!(
        e.to_lowercase().contains("dml") || e.contains("INSERT"),
        "{e}"
    );
    assert!(matches!(
        s.register("", &f.frames[0].1),
        Err(Error::InvalidArgument(_))
    ));
    // The session still works after errors.
    assert_eq!(s.sql("SELECT count(*) FROM fact").unwrap().rows(), 1);
}

#[test]
fn a_failing_query_leaves_no_remote_memory_allocated() {
    // Every row shares one key: the build side cannot be split, and the budget is
    // far below it. An inner join would be joined piece by piece (its answer being
    // every pair of rows); a full join's probe rows each depend on all build rows of
    // their key, so it fails after spilling, naming the key; so does an aggregate.
    let f = fixture(20_000, 20_000, 1, 1);
    let free_before: u64 = f
        .env
        .elements()
        .allocation_state()
        .allocators
        .iter()
        .map(|a| a.available())
        .sum();
    let s = f.session(Some(0.02));
    let err = s
        .sql("SELECT f.qty, d.w FROM fact f FULL JOIN dim d ON f.k1 = d.d1")
        .unwrap_err();
    assert!(
        // The key 0, or null (a twentieth of the rows, also too many here).
        matches!(&err, Error::Skew { kernel, key, .. }
            if kernel.contains("hash join") && (key.starts_with("k1=") || key.starts_with("d1="))),
        "{err}"
    );
    assert_eq!(s.spill_bytes_held(), 0);
    assert_eq!(s.reserved_bytes(), 0);
    // One group whose state outgrows the budget: the aggregate partitions (every
    // row into the same partition, level after level) and then fails.
    let err = s
        .sql("SELECT k1, array_agg(name) AS names FROM fact GROUP BY k1")
        .unwrap_err();
    assert!(
        matches!(&err, Error::Skew { kernel: "group-by", key, .. } if key == "k1=0"),
        "{err}"
    );
    assert_eq!(s.spill_bytes_held(), 0);
    assert_eq!(s.reserved_bytes(), 0);
    let free_after: u64 = f
        .env
        .elements()
        .allocation_state()
        .allocators
        .iter()
        .map(|a| a.available())
        .sum();
    assert_eq!(free_after, free_before, "remote memory leaked");
}

/// Runs every stage of `sql` in order, each task of it in a fresh session over the same
/// tables (as a separate process would run it), handing outputs on as frame metadata
/// JSON; returns the answer, the stage list and the highest task peak. Frees every
/// stage output.
fn run_by_stages(
    f: &Fixture,
    fraction: Option<f64>,
    partitions: Option<usize>,
    sql: &str,
) -> (DataFrame, scad_remote_frame::StagePlan, u64) {
    use std::collections::BTreeMap;
    let plan = f.session_with(fraction, partitions).stages(sql).unwrap();
    // Stage -> partition -> frame metadata.
    let mut outputs: BTreeMap<usize, Vec<Vec<String>>> = BTreeMap::new();
    let mut peak = 0;
    for stage in &plan.stages {
        assert!(
            stage.inputs.iter().all(|&i| i < stage.id),
            "{sql}: stage {} reads a later stage",
            stage.id
        );
        assert!(stage.tasks >= 1, "{sql}: {stage:?}");
        let inputs: BTreeMap<usize, scad_remote_frame::StageFrames> = stage
            .inputs
            .iter()
            .map(|&i| {
                let frames = outputs[&i]
                    .iter()
                    .map(|part| {
                        part.iter()
                            .map(|json| RemoteFrame::from_json(&f.env, json).unwrap())
                            .collect()
                    })
                    .collect();
                (i, frames)
            })
            .collect();
        let mut merged: Vec<Vec<String>> = vec![Vec::new(); stage.partitions];
        for task in 0..stage.tasks {
            let out = f
                .session_with(fraction, partitions)
                .run_stage_task(sql, stage.id, task, &inputs)
                .unwrap_or_else(|e| panic!("{sql}: stage {} task {task}: {e}", stage.id));
            assert_eq!(
                out.frames.len(),
                stage.partitions,
                "{sql}: stage {}",
                stage.id
            );
            assert!(out.stats.budget.allows(out.stats.peak_local_bytes));
            peak = peak.max(out.stats.peak_local_bytes);
            for (q, part) in out.frames.iter().enumerate() {
                merged[q].extend(part.iter().map(|fr| fr.to_json().unwrap()));
            }
        }
        outputs.insert(stage.id, merged);
    }
    let root = plan.stages.len() - 1;
    let mut answer: Option<DataFrame> = None;
    for json in outputs[&root].iter().flatten() {
        let part = RemoteFrame::from_json(&f.env, json)
            .unwrap()
            .to_polars()
            .unwrap();
        match &mut answer {
            None => answer = Some(part),
            Some(a) => {
                a.vstack_mut(&part).unwrap();
            }
        }
    }
    for json in outputs.values().flatten().flatten() {
        RemoteFrame::from_json(&f.env, json)
            .unwrap()
            .free()
            .unwrap();
    }
    let answer = answer.unwrap_or_else(|| {
        // No rows at all: the whole query's empty answer has the columns.
        f.session_with(fraction, partitions)
            .sql(sql)
            .unwrap()
            .to_polars()
            .unwrap()
    });
    (answer, plan, peak)
}

#[test]
fn queries_run_stage_by_stage_equal_the_whole_query() {
    let f = fixture(30_000, 300, 400, 300);
    let before = available(&f.env);
    let queries = [
        // Join build side, final aggregate, sort: several stages.
        "SELECT d.label, sum(f.qty) AS q, count(*) AS n FROM fact f JOIN dim d ON f.k1 = d.d1 \
         GROUP BY d.label ORDER BY d.label NULLS LAST",
        // ROLLUP: the aggregate's grouping id is an 8-bit integer, stored widened.
        "SELECT k1 % 5 AS a, k2, sum(qty) AS s FROM fact GROUP BY ROLLUP (k1 % 5, k2)",
        // A scalar subquery: a one-row cross join.
        "SELECT count(*) AS n FROM fact WHERE qty > (SELECT avg(qty) FROM fact)",
        // A build side with no columns left after projection.
        "SELECT count(*) AS n FROM fact, (SELECT 1 AS one FROM dim WHERE w > 990) x",
        // Windows over a join, and duplicate column names inside the plan.
        "SELECT f.k1, d.d1, rank() OVER (PARTITION BY f.k1 ORDER BY f.qty, f.price) AS r \
         FROM fact f JOIN dim d ON f.k1 = d.d1",
        "SELECT k1 FROM fact WHERE qty < 3 UNION SELECT d1 FROM dim",
    ];
    let mut split = 0;
    for (fraction, partitions) in [(None, None), (Some(0.25), None), (None, Some(3))] {
        for sql in queries {
            let (got, plan, peak) = run_by_stages(&f, fraction, partitions, sql);
            let whole = f.session_with(fraction, partitions).sql(sql).unwrap();
            let want = whole.to_polars().unwrap();
            assert_eq!(plan.ordered, whole.ordered(), "{sql}");
            if plan.ordered {
                assert!(got.equals_missing(&want), "{sql}\n got {got}\nwant {want}");
            } else {
                assert_same(&got, &want, &format!("{sql} at {fraction:?}"));
            }
            if let Some(fr) = fraction {
                assert!(peak <= (f.input_bytes as f64 * fr) as u64, "{sql}");
            }
            if sql.contains("JOIN") {
                assert!(plan.stages.len() > 1, "{sql}: {plan:?}");
            }
            if partitions == Some(3) {
                // Exchanges end stages whose tasks each partition their rows.
                split += plan
                    .stages
                    .iter()
                    .filter(|s| s.tasks == 3 && s.operator.starts_with("RepartitionExec"))
                    .count();
            }
        }
    }
    assert!(
        split > 0,
        "no stage ran as three tasks ending in an exchange"
    );
    assert_eq!(available(&f.env), before, "stage outputs left allocated");
}

/// A runner that fails one task and runs the others on threads.
struct FailingRunner {
    inner: scad_remote_frame::ThreadRunner,
    fail: (usize, usize),
    ran: std::sync::Mutex<Vec<(usize, usize)>>,
}

impl scad_remote_frame::TaskRunner for FailingRunner {
    fn run(
        &self,
        spec: &scad_remote_frame::TaskSpec,
    ) -> scad_remote_frame::Result<scad_remote_frame::TaskOutput> {
        self.ran.lock().unwrap().push((spec.stage, spec.task));
        if (spec.stage, spec.task) == self.fail {
            return Err(Error::InvalidArgument("worker lost".into()));
        }
        self.inner.run(spec)
    }
}

#[test]
fn queries_run_distributed_equal_the_whole_query_and_free_everything() {
    let f = fixture(30_000, 300, 400, 300);
    let runner = scad_remote_frame::ThreadRunner::new(f.env.elements()).unwrap();
    let before = available(&f.env);
    let sql =
        "SELECT d.label, sum(f.qty) AS q, count(*) AS n FROM fact f JOIN dim d ON f.k1 = d.d1 \
               GROUP BY d.label ORDER BY d.label NULLS LAST";
    for (fraction, workers) in [(None, 1), (None, 3), (Some(0.25), 2)] {
        let driver = f.session_with(fraction, Some(3));
        let plan = driver.stages(sql).unwrap();
        let out = driver.run_distributed(sql, &runner, workers).unwrap();
        let whole = driver.sql(sql).unwrap();
        assert!(out.ordered);
        let got = polars_of(&out.schema, &out.batches);
        assert!(
            got.equals_missing(&whole.to_polars().unwrap()),
            "{got}\n{:?}",
            whole.to_polars()
        );
        assert_eq!(out.stages, plan.stages.len());
        assert_eq!(
            out.tasks.len(),
            plan.stages.iter().map(|s| s.tasks).sum::<usize>()
        );
        assert!(out.shuffle_bytes > 0);
        // Every task ran after the stages it reads had finished.
        for t in &out.tasks {
            for &i in &plan.stages[t.output.stage].inputs {
                let last = out
                    .tasks
                    .iter()
                    .filter(|u| u.output.stage == i)
                    .map(|u| u.ended_s)
                    .fold(0.0, f64::max);
                assert!(t.started_s >= last, "{t:?} started before stage {i} ended");
            }
            if let Some(fr) = fraction {
                assert!(t.output.peak_local_bytes <= (f.input_bytes as f64 * fr) as u64);
            }
        }
        if workers == 1 {
            let mut ends: Vec<_> = out.tasks.iter().map(|t| (t.started_s, t.ended_s)).collect();
            ends.sort_by(|a, b| a.0.total_cmp(&b.0));
            assert!(
                ends.windows(2).all(|w| w[0].1 <= w[1].0),
                "one worker ran two tasks at once"
            );
        }
        assert_eq!(
            available(&f.env),
            before,
            "a distributed query left memory allocated"
        );
    }
}

/// A Polars frame of record batches (the answer of a distributed query).
fn polars_of(schema: &arrow_schema::SchemaRef, batches: &[arrow_array::RecordBatch]) -> DataFrame {
    let e = env(Backend::Local, 64 << 20);
    let mut w = scad_remote_frame::FrameWriter::with_arrow_schema(&e.env, schema).unwrap();
    for b in batches {
        w.push_batch(b).unwrap();
    }
    let frame = w.finish().unwrap();
    let df = frame.to_polars().unwrap();
    frame.free().unwrap();
    df
}

#[test]
fn a_failing_task_fails_its_query_naming_it_and_frees_everything() {
    let f = fixture(20_000, 300, 400, 300);
    let driver = f.session_with(None, Some(3));
    let sql =
        "SELECT d.label, count(*) AS n FROM fact f JOIN dim d ON f.k1 = d.d1 GROUP BY d.label";
    let plan = driver.stages(sql).unwrap();
    let before = available(&f.env);
    // A task of the first stage that has several: the query stops there.
    let split = plan.stages.iter().find(|s| s.tasks > 1).unwrap();
    let runner = FailingRunner {
        inner: scad_remote_frame::ThreadRunner::new(f.env.elements()).unwrap(),
        fail: (split.id, 1),
        ran: Default::default(),
    };
    let err = driver.run_distributed(sql, &runner, 2).unwrap_err();
    assert!(
        matches!(&err, Error::TaskFailed { stage, task: 1, message } if *stage == split.id && message.contains("worker lost")),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains(&format!("stage {} task 1", split.id)),
        "{err}"
    );
    let ran = runner.ran.lock().unwrap().clone();
    let readers: Vec<usize> = plan
        .stages
        .iter()
        .filter(|s| s.inputs.contains(&split.id))
        .map(|s| s.id)
        .collect();
    assert!(
        ran.iter().all(|(s, _)| !readers.contains(s)),
        "a reader of the failed stage started: {ran:?}"
    );
    assert_eq!(
        available(&f.env),
        before,
        "a failed query left memory allocated"
    );

    // A task failing in the engine (a cast that fails at run time) names its error.
    let bad = "SELECT CAST(label AS INT) AS x FROM dim d JOIN fact f ON f.k1 = d.d1";
    let runner = scad_remote_frame::ThreadRunner::new(f.env.elements()).unwrap();
    let err = driver.run_distributed(bad, &runner, 2).unwrap_err();
    assert!(matches!(&err, Error::TaskFailed { .. }), "{err}");
    assert!(err.to_string().to_lowercase().contains("cast"), "{err}");
    assert_eq!(
        available(&f.env),
        before,
        "a failed query left memory allocated"
    );
    // The session still runs queries.
    let out = driver.run_distributed(sql, &runner, 2).unwrap();
    assert_eq!(out.rows(), driver.sql(sql).unwrap().rows());
}

#[test]
fn a_task_spec_with_a_freed_input_or_a_wrong_task_is_refused() {
    let f = fixture(5_000, 100, 100, 100);
    let driver = f.session_with(None, Some(2));
    // A filtered dimension, so that the count is not taken below the join (as it is
    // below a whole dimension's): the stage above the first reads its output alone.
    let sql = "SELECT d.label, count(*) AS n FROM fact f JOIN dim d ON f.k1 = d.d1 \
               WHERE d.w >= 0 GROUP BY d.label";
    let plan = driver.stages(sql).unwrap();
    let first = &plan.stages[0];
    let out = driver
        .run_stage(sql, first.id, &Default::default())
        .unwrap();
    let metas: Vec<Vec<String>> = out
        .frames
        .iter()
        .map(|p| p.iter().map(|fr| fr.to_json().unwrap()).collect())
        .collect();
    let reader = plan
        .stages
        .iter()
        .find(|s| s.inputs == vec![first.id])
        .unwrap();
    let tables = [("fact", 0), ("dim", 1)]
        .into_iter()
        .map(|(n, k)| (n.to_owned(), f.frames[k].1.to_json().unwrap()))
        .collect();
    let spec = scad_remote_frame::TaskSpec {
        sql: sql.to_owned(),
        stage: reader.id,
        task: 0,
        budget: None,
        partitions: 2,
        chunk_rows: 4096,
        tables,
        inputs: [(first.id, metas)].into_iter().collect(),
        region: f.env.elements().allocation_state(),
    };
    let elements = || {
        let e = std::sync::Arc::new(scad_remote_array::MemoryElements::new());
        for name in f.env.elements().names() {
            e.add(&name, f.env.elements().transport(&name).unwrap())
                .unwrap();
        }
        e
    };
    let mut wrong = spec.clone();
    wrong.task = reader.tasks;
    let err = scad_remote_frame::run_task(elements(), &wrong).unwrap_err();
    assert!(
        err.to_string().contains(&format!("task {}", reader.tasks)),
        "{err}"
    );
    // A slot that leaves out an element (it would allocate over the tables there), no
    // chunk rows, an input of a stage the task does not read, or a frame listed twice:
    // refused before anything runs.
    let mut wrong = spec.clone();
    wrong.region.allocators.pop();
    let err = scad_remote_frame::run_task(elements(), &wrong).unwrap_err();
    assert!(
        err.to_string().contains("leaves out memory element"),
        "{err}"
    );
    let mut wrong = spec.clone();
    wrong.chunk_rows = 0;
    let err = scad_remote_frame::run_task(elements(), &wrong).unwrap_err();
    assert!(err.to_string().contains("chunk_rows"), "{err}");
    let mut wrong = spec.clone();
    wrong.inputs.insert(99, Vec::new());
    let err = scad_remote_frame::run_task(elements(), &wrong).unwrap_err();
    assert!(err.to_string().contains("not stage 99"), "{err}");
    let mut wrong = spec.clone();
    let parts = wrong.inputs.get_mut(&first.id).unwrap();
    let q = parts.iter().position(|p| !p.is_empty()).unwrap();
    let again = parts[q][0].clone();
    parts[q].push(again);
    let err = scad_remote_frame::run_task(elements(), &wrong).unwrap_err();
    assert!(err.to_string().contains("twice"), "{err}");
    out.free().unwrap();
    let err = scad_remote_frame::run_task(elements(), &spec).unwrap_err();
    assert!(
        matches!(err, Error::Freed { .. } | Error::Stale { .. }),
        "{err}"
    );
}

#[test]
fn a_stage_without_its_inputs_is_refused() {
    let f = fixture(5_000, 100, 100, 100);
    let s = f.session(None);
    let sql =
        "SELECT d.label, count(*) AS n FROM fact f JOIN dim d ON f.k1 = d.d1 GROUP BY d.label";
    let plan = s.stages(sql).unwrap();
    let root = plan.stages.last().unwrap();
    assert!(!root.inputs.is_empty(), "{plan:?}");
    let before = available(&f.env);
    let err = s.run_stage(sql, root.id, &Default::default()).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("output of stage")),
        "{err}"
    );
    let err = s.run_stage(sql, 99, &Default::default()).unwrap_err();
    assert!(err.to_string().contains("stage 99"), "{err}");
    // An input of the wrong shape (another stage's output) is refused by its columns.
    let first = s.run_stage(sql, 0, &Default::default()).unwrap();
    let wrong: std::collections::BTreeMap<usize, scad_remote_frame::StageFrames> = root
        .inputs
        .iter()
        .map(|&i| (i, first.frames.clone()))
        .collect();
    if plan.stages[root.inputs[0]] != plan.stages[0] {
        let err = s.run_stage(sql, root.id, &wrong).unwrap_err();
        assert!(
            matches!(&err, Error::InvalidArgument(m) if m.contains("columns") || m.contains("partitions")),
            "{err}"
        );
    }
    first.free().unwrap();
    assert_eq!(
        available(&f.env),
        before,
        "a refused stage left memory allocated"
    );
}

#[test]
fn joins_over_several_partitions_match_the_unlimited_plan() {
    // Two partitions per operator: probe sides arrive in two partitions while small
    // build sides are collected once (the spilling join wraps such a join only when
    // it has one output partition, else every partition would read the build side
    // again; TPC-DS q1 at a 1 GiB budget, tests of scad-tpcds, panicked in
    // DataFusion's repartition when it did).
    let f = fixture(40_000, 2_000, 500, 2_000);
    let session = |budget: Option<u64>| {
        let s = match budget {
            Some(b) => {
                QuerySession::with_partitions(&f.env.with_budget(Budget::bytes(b).unwrap()), 2)
                    .unwrap()
            }
            None => QuerySession::new(&f.env).unwrap(),
        };
        for (name, frame) in &f.frames {
            s.register(name, frame).unwrap();
        }
        s
    };
    let (big, unlimited) = (session(Some(256 << 20)), session(None));
    for sql in [
        "SELECT f.k1, f.qty, d.w FROM fact f JOIN dim d ON f.k1 = d.d1",
        // A filter on the probe side: where a join's dynamic filter would land.
        "SELECT f.k1, f.qty, d.w FROM fact f JOIN dim d ON f.k1 = d.d1 WHERE f.qty > 2",
        "SELECT d.label, count(*) AS n FROM dim d JOIN fact f ON f.k1 = d.d1 \
         WHERE f.price > 10 GROUP BY d.label",
        "SELECT f.k1, d.w FROM fact f LEFT JOIN dim d ON f.k1 = d.d1 AND d.w > 500",
        "SELECT k1, count(*) AS n FROM fact WHERE k1 IN (SELECT d1 FROM dim WHERE w < 300) GROUP BY k1",
        "SELECT d.label, sum(f.price) AS p FROM fact f JOIN dim d ON f.k1 = d.d1 \
         JOIN (SELECT d1, max(w) AS m FROM dim GROUP BY d1) x ON x.d1 = f.k1 GROUP BY d.label",
    ] {
        let got = big.sql(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
        let want = unlimited.sql(sql).unwrap();
        assert_same(
            &got.to_polars().unwrap(),
            &want.to_polars().unwrap(),
            sql,
        );
    }
}

#[test]
fn partitioned_spilling_joins_over_two_partitions_match() {
    // Two partitions whose joins both spill: build sides over DataFusion's 1 MB
    // collect threshold make partitioned joins, fed by repartitions.
    let f = fixture(110_000, 110_000, 110_000, 110_000);
    let env = f
        .env
        .with_budget(Budget::bytes((f.input_bytes as f64 * 0.2) as u64).unwrap());
    let s = QuerySession::with_partitions(&env, 2).unwrap();
    let unlimited = f.session(None);
    for (name, frame) in &f.frames {
        s.register(name, frame).unwrap();
    }
    for sql in [
        "SELECT f.k1, f.qty, d.w, d.label FROM fact f JOIN dim d ON f.k1 = d.d1 WHERE f.qty > 2",
        "SELECT d.label, count(*) AS n, sum(f.qty) AS q FROM fact f JOIN dim d ON f.k1 = d.d1 \
         WHERE f.price > 10 GROUP BY d.label",
    ] {
        let plan = s.explain(sql).unwrap();
        assert!(plan.contains("mode=Partitioned"), "{plan}");
        let got = s.sql(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
        assert!(got.stats().spill_files > 0, "{sql}: nothing spilled");
        assert!(
            got.stats().budget.allows(got.stats().peak_local_bytes),
            "{sql}: peak {} over budget {}\n{}",
            got.stats().peak_local_bytes,
            got.stats().budget,
            got.explain_analyze()
        );
        let want = unlimited.sql(sql).unwrap();
        assert_same(&got.to_polars().unwrap(), &want.to_polars().unwrap(), sql);
    }
    assert_eq!(s.spill_bytes_held(), 0);
    assert!(QuerySession::with_partitions(&env, 0).is_err());
}

#[test]
fn lazy_queries_equal_their_sql() {
    use scad_remote_frame::query::expr::{col, count, lit, rank, sum, ExprFunctionExt, JoinType};
    let f = fixture(20_000, 2_000, 500, 2_000);
    for fraction in [None, Some(0.05)] {
        let s = f.session(fraction);
        // Join, filter, aggregate, sort.
        let lazy = s
            .table("fact")
            .unwrap()
            .filter(col("qty").gt(lit(2i64)))
            .unwrap()
            .join(
                // Filtered: a whole dimension would be joined after the sums
                // (EagerAggregation), and nothing would spill at 5 %.
                s.table("dim")
                    .unwrap()
                    .filter(col("w").gt(lit(100i64)))
                    .unwrap(),
                JoinType::Inner,
                &["k1"],
                &["d1"],
                None,
            )
            .unwrap()
            .aggregate(
                vec![col("label")],
                vec![sum(col("qty")).alias("q"), count(lit(1i64)).alias("n")],
            )
            .unwrap()
            .sort(vec![col("label").sort(true, false)])
            .unwrap()
            .collect()
            .unwrap();
        let sql = s
            .sql(
                "SELECT d.label, sum(f.qty) AS q, count(1) AS n FROM fact f JOIN dim d ON f.k1 = d.d1 \
                 WHERE f.qty > 2 AND d.w > 100 GROUP BY d.label ORDER BY d.label NULLS LAST",
            )
            .unwrap();
        assert!(lazy.ordered());
        let (got, want) = (lazy.to_polars().unwrap(), sql.to_polars().unwrap());
        assert!(
            got.equals_missing(&want),
            "{fraction:?}\n got {got}\nwant {want}"
        );
        if fraction.is_some() {
            assert!(lazy.stats().spill_files > 0, "nothing spilled at 5 %");
            assert!(lazy.stats().budget.allows(lazy.stats().peak_local_bytes));
        }
        if fraction.is_some() {
            // Windows and sorts at a tiny budget are a known gap (DataFusion's
            // window operator gathers its input unreserved): verbs only, unlimited.
            continue;
        }
        // Anti join, window, union, distinct, limit.
        let anti = s
            .table("fact")
            .unwrap()
            .join(
                s.table("dim").unwrap(),
                JoinType::LeftAnti,
                &["k1"],
                &["d1"],
                None,
            )
            .unwrap()
            .select(vec![col("k1")])
            .unwrap();
        let ranked = s
            .table("dim")
            .unwrap()
            .window(vec![rank()
                .partition_by(vec![col("label")])
                .order_by(vec![col("w").sort(true, true), col("d1").sort(true, true)])
                .build()
                .unwrap()
                .alias("r")])
            .unwrap()
            .filter(col("r").eq(lit(1u64)))
            .unwrap()
            .select(vec![col("d1").alias("k1")])
            .unwrap();
        let both = anti
            .union(ranked, true)
            .unwrap()
            .distinct()
            .unwrap()
            .sort(vec![col("k1").sort(true, true)])
            .unwrap()
            .limit(0, Some(50))
            .unwrap()
            .collect()
            .unwrap();
        let sql = s
            .sql(
                "SELECT k1 FROM (SELECT k1 FROM fact WHERE NOT EXISTS (SELECT 1 FROM dim WHERE d1 = k1) \
                 UNION SELECT d1 FROM (SELECT d1, rank() OVER (PARTITION BY label ORDER BY w NULLS FIRST, d1 NULLS FIRST) AS r FROM dim) WHERE r = 1) \
                 ORDER BY k1 NULLS FIRST LIMIT 50",
            )
            .unwrap();
        let (got, want) = (both.to_polars().unwrap(), sql.to_polars().unwrap());
        assert_eq!(got.height(), 50);
        assert!(
            got.column("k1")
                .unwrap()
                .as_materialized_series()
                .equals_missing(want.column("k1").unwrap().as_materialized_series()),
            "{fraction:?}\n got {got}\nwant {want}"
        );
        assert_eq!(s.spill_bytes_held(), 0);
    }
    // Names are checked as the query is built.
    let s = f.session(None);
    assert!(s.table("no_such_table").is_err());
    let err = s
        .table("fact")
        .unwrap()
        .filter(col("no_such_column").gt(lit(1i64)))
        .unwrap_err();
    assert!(err.to_string().contains("no_such_column"), "{err}");
    let plan = s
        .table("fact")
        .unwrap()
        .select(vec![col("k1")])
        .unwrap()
        .explain()
        .unwrap();
    assert!(plan.contains("projection=[k1]"), "{plan}");
}
