//! All 99 TPC-DS queries from their official SQL text through the query engine over
//! memory elements, on SF 0.01 data generated during the test run (cached under
//! data/tpcds), compared with DuckDB's answers by value.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, OnceLock};

use scad_core::server::{MemoryServer, ServerConfig};
use scad_core::transport::{TcpOptions, TcpTransport};
use scad_remote_array::{BufferPool, RemoteStore};
use scad_remote_frame::FrameEnv;
use scad_tpcds::compare::compare_values;
use scad_tpcds::data::{generate, DataSet, GenerateOptions};
use scad_tpcds::engine::{load_frames, official_queries, query_sql, session};

fn data_set() -> &'static DataSet {
    static SET: OnceLock<DataSet> = OnceLock::new();
    SET.get_or_init(|| {
        let mut options = GenerateOptions::new(0.01);
        options.spread_warehouses = 5;
        generate(&options).unwrap_or_else(|e| panic!("cannot generate the SF 0.01 test data: {e}"))
    })
}

/// Two embedded tcp memory servers and an env over them with small chunks.
fn env() -> (Vec<MemoryServer>, FrameEnv) {
    let pool = Arc::new(BufferPool::builder(1 << 20).build().unwrap());
    let store = Arc::new(RemoteStore::new(pool));
    let mut servers = Vec::new();
    for k in 0..2 {
        let s = MemoryServer::start("127.0.0.1:0", 256 << 20, ServerConfig::default()).unwrap();
        let t = TcpTransport::connect(&s.local_addr().to_string(), TcpOptions::default()).unwrap();
        store.add_element(&format!("mem{k}"), Arc::new(t)).unwrap();
        servers.push(s);
    }
    (servers, FrameEnv::new(store).with_chunk_rows(4096))
}

/// Runs every official query at a budget of `budget` × the largest table's bytes
/// (`None`: unlimited), compares each
/// answer with DuckDB's, checks the reserved peak against the budget and that no
/// spill memory is left behind; returns the queries that spilled.
fn run_all(budget: Option<f64>) -> Vec<String> {
    let set = data_set();
    let (_servers, env) = env();
    let frames = load_frames(&env, set).unwrap();
    // The budget: a fraction of the largest table.
    let largest = frames.values().map(|f| f.data_bytes()).max().unwrap();
    let budget = budget.map(|fraction| (largest as f64 * fraction) as u64);
    let env = match budget {
        Some(b) => env.with_budget(b),
        None => env,
    };
    let session = session(&env, &frames).unwrap();
    let mut failures = Vec::new();
    let mut spilled = Vec::new();
    let mut aggregate_gaps = Vec::new();
    for q in official_queries() {
        let sql = query_sql(set, &q).unwrap();
        let outcome = session
            .sql(&sql)
            .map_err(|e| e.to_string())
            .and_then(|out| {
                let df = out.to_polars().map_err(|e| e.to_string())?;
                compare_values(&df, &set.reference(&q).unwrap(), out.ordered())
                    .map_err(|e| e.to_string())?;
                Ok(*out.stats())
            });
        match outcome {
            Ok(stats) => {
                if let Some(b) = budget {
                    assert!(
                        stats.peak_local_bytes <= b,
                        "{q}: peak {} over the budget {b}",
                        stats.peak_local_bytes
                    );
                }
                if stats.spill_files > 0 {
                    spilled.push(q.clone());
                }
            }
            // DataFusion's hash aggregate sometimes fails instead of spilling when
            // the budget is tight (a known gap, our own aggregate is to come): such
            // a failure must be a clean out-of-budget error naming it, never a wrong
            // answer, and at most two queries may hit it.
            Err(e)
                if budget.is_some()
                    && e.contains("needs more local memory than its budget")
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
fn all_99_queries_equal_duckdb() {
    run_all(None);
}

#[test]
fn all_99_queries_equal_duckdb_within_a_spilling_budget() {
    // 25 % of the largest table, as the benchmark runs: the hash joins of q4, q11
    // and q72 outgrow it and spill to the memory elements. (At 10 % all 99 were
    // equal in most runs; q23's aggregate failed in one.)
    let spilled = run_all(Some(0.25));
    eprintln!("{} queries spilled: {spilled:?}", spilled.len());
    assert!(spilled.len() >= 3, "too few queries spilled: {spilled:?}");
}
