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
    spilled
}

#[test]
fn all_99_queries_equal_duckdb_within_a_spilling_budget() {
    // 10 % of the largest table (2.4 MB at SF 0.01): hash joins, aggregates (q67's
    // ROLLUP) and sorts of eleven queries outgrow it and spill to the memory
    // elements. (At 5 %, 98 are equal; q67 fails cleanly out of budget: the sort
    // above its aggregate takes all the memory the aggregate's partitions free.)
    let spilled = run_all(0.10);
    eprintln!("{} queries spilled: {spilled:?}", spilled.len());
    assert!(spilled.len() >= 8, "too few queries spilled: {spilled:?}");
}
