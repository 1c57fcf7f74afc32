//! All 99 TPC-DS queries at SF 0.01 (spread warehouses) run distributed
//! ([`QuerySession::run_distributed`]): every task of every stage in a worker thread
//! over a registry of its own (as a separate process would run it), two at a time,
//! each allocating in its own slot, handing outputs on as frame metadata; each answer
//! equals DuckDB's and nothing stays allocated after.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::record_batch::RecordBatch;
use scad_remote_frame::{FrameEnv, QuerySession, RemoteFrame, ThreadRunner};
use scad_tpcds::compare::compare_values;
use scad_tpcds::data::{generate, DataSet, GenerateOptions};
use scad_tpcds::engine::{official_queries, query_sql};
use scad_tpcds::remote::{load_tables, Cluster, TransportKind};

/// Partitions every session plans: more than this machine's cores, so stages split
/// into tasks the way a cluster's would.
const PARTITIONS: usize = 3;

fn session(env: &FrameEnv, tables: &BTreeMap<String, RemoteFrame>) -> QuerySession {
    let s = QuerySession::with_partitions(env, PARTITIONS).unwrap();
    for (name, frame) in tables {
        s.register(name, frame).unwrap();
    }
    s
}

fn data_set() -> DataSet {
    let mut options = GenerateOptions::new(0.01);
    options.spread_warehouses = 5;
    generate(&options).unwrap_or_else(|e| panic!("cannot generate the SF 0.01 test data: {e}"))
}

#[test]
fn all_99_queries_run_distributed_equal_duckdb() {
    let set = data_set();
    let mut cluster = Cluster::embedded(TransportKind::Tcp, 2, 1 << 30).unwrap();
    cluster.set_chunk_rows(4096);
    let tables = load_tables(&cluster, &set, None).unwrap();
    let frames = tables.open(&cluster).unwrap();
    let env = cluster.env().clone();
    let driver = session(&env, &frames);
    let runner = ThreadRunner::new(env.elements()).unwrap();
    let free_before = cluster.available_bytes();
    // SCAD_TPCDS_QUERIES=q28,q51 runs only those (while working on them).
    let only: Option<Vec<String>> = std::env::var("SCAD_TPCDS_QUERIES")
        .ok()
        .map(|v| v.split(',').map(str::to_owned).collect());
    let queries: Vec<String> = official_queries()
        .into_iter()
        .filter(|q| only.as_ref().is_none_or(|o| o.contains(q)))
        .collect();
    let mut failures = Vec::new();
    let (mut split_stages, mut exchanges, mut overlapping) = (0, 0, 0);
    for q in &queries {
        let sql = query_sql(&set, q).unwrap();
        let plan = driver.stages(&sql).unwrap();
        split_stages += plan.stages.iter().filter(|s| s.tasks > 1).count();
        exchanges += plan
            .stages
            .iter()
            .filter(|s| s.operator.starts_with("RepartitionExec"))
            .count();
        let checked = driver
            .run_distributed(&sql, &runner, 2)
            .map_err(|e| e.to_string())
            .and_then(|out| {
                assert_eq!(
                    out.tasks.len(),
                    plan.stages.iter().map(|s| s.tasks).sum::<usize>()
                );
                // Two tasks of one stage ran at the same time.
                let t = &out.tasks;
                if t.iter().any(|a| {
                    t.iter().any(|b| {
                        a.output.stage == b.output.stage
                            && a.output.task < b.output.task
                            && a.started_s < b.ended_s
                            && b.started_s < a.ended_s
                    })
                }) {
                    overlapping += 1;
                }
                let answer: RecordBatch =
                    concat_batches(&out.schema, &out.batches).map_err(|e| e.to_string())?;
                compare_values(&answer, &set.reference(q).unwrap(), out.ordered)
                    .map_err(|e| e.to_string())
            });
        if let Err(e) = checked {
            eprintln!("{q}: {e}");
            failures.push(q.clone());
        }
        assert_eq!(
            cluster.available_bytes(),
            free_before,
            "{q} left memory allocated"
        );
    }
    assert!(
        failures.is_empty(),
        "{} queries differ: {failures:?}",
        failures.len()
    );
    eprintln!(
        "{split_stages} stages ran as several tasks, {exchanges} ended in an exchange; \
         {overlapping} queries ran two tasks of a stage at once"
    );
    if only.is_none() {
        assert!(
            split_stages > 99,
            "only {split_stages} stages split into tasks"
        );
        assert!(exchanges > 99, "only {exchanges} stages end in an exchange");
        assert!(
            overlapping > 50,
            "only {overlapping} queries ran tasks at once"
        );
    }
}
