//! All 99 TPC-DS queries at SF 0.01 (spread warehouses) run stage by stage, every
//! task of every stage in a session of its own (as separate processes would run
//! them), the tasks of a stage in reverse order, handing outputs on as frame
//! metadata; each answer equals DuckDB's and every stage output is freed after.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use scad_remote_frame::{FrameEnv, QuerySession, RemoteFrame, StageFrames, StagePlan};
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

/// Runs `sql` task by task; returns the answer and the plan. Frees every output.
fn run_by_tasks(
    env: &FrameEnv,
    tables: &BTreeMap<String, RemoteFrame>,
    query: &str,
    sql: &str,
) -> Result<(RecordBatch, StagePlan), String> {
    let plan = session(env, tables)
        .stages(sql)
        .map_err(|e| e.to_string())?;
    let mut outputs: BTreeMap<usize, StageFrames> = BTreeMap::new();
    let mut run = || -> Result<RecordBatch, String> {
        for stage in &plan.stages {
            let inputs: BTreeMap<usize, StageFrames> = stage
                .inputs
                .iter()
                .map(|i| (*i, outputs[i].clone()))
                .collect();
            let mut parts: Vec<Vec<Vec<RemoteFrame>>> = Vec::new();
            for task in (0..stage.tasks).rev() {
                let out = session(env, tables)
                    .run_stage_task(sql, stage.id, task, &inputs)
                    .map_err(|e| format!("{query} stage {} task {task}: {e}", stage.id))?;
                assert_eq!(out.frames.len(), stage.partitions, "{query}: {stage:?}");
                parts.push(out.frames);
            }
            parts.reverse();
            let mut merged: StageFrames = vec![Vec::new(); stage.partitions];
            for task_out in parts {
                for (q, frames) in task_out.into_iter().enumerate() {
                    merged[q].extend(frames);
                }
            }
            outputs.insert(stage.id, merged);
        }
        let root = &outputs[&(plan.stages.len() - 1)];
        let mut batches = Vec::new();
        for frame in root.iter().flatten() {
            batches.extend(frame.to_record_batches().map_err(|e| e.to_string())?);
        }
        let schema = match batches.first() {
            Some(b) => b.schema(),
            None => std::sync::Arc::new(Schema::new(
                plan.stages[plan.stages.len() - 1]
                    .columns
                    .iter()
                    .map(|c| Field::new(c, DataType::Null, true))
                    .collect::<Vec<_>>(),
            )),
        };
        concat_batches(&schema, &batches).map_err(|e| e.to_string())
    };
    let answer = run();
    for frame in outputs.into_values().flatten().flatten() {
        frame.free().unwrap();
    }
    answer.map(|a| (a, plan))
}

/// Free bytes over all of `env`'s memory elements.
fn available(env: &FrameEnv) -> u64 {
    env.elements()
        .allocation_state()
        .allocators
        .iter()
        .map(|a| a.available())
        .sum()
}

fn data_set() -> DataSet {
    let mut options = GenerateOptions::new(0.01);
    options.spread_warehouses = 5;
    generate(&options).unwrap_or_else(|e| panic!("cannot generate the SF 0.01 test data: {e}"))
}

#[test]
fn all_99_queries_run_task_by_task_equal_duckdb() {
    let set = data_set();
    let mut cluster = Cluster::embedded(TransportKind::Tcp, 2, 256 << 20).unwrap();
    cluster.set_chunk_rows(4096);
    let tables = load_tables(&cluster, &set, None).unwrap();
    let frames = tables.open(&cluster).unwrap();
    let env = cluster.env().clone();
    let free_before = available(&env);
    let mut failures = Vec::new();
    let (mut split_stages, mut exchanges) = (0, 0);
    // SCAD_TPCDS_QUERIES=q28,q51 runs only those (while working on them).
    let only: Option<Vec<String>> = std::env::var("SCAD_TPCDS_QUERIES")
        .ok()
        .map(|v| v.split(',').map(str::to_owned).collect());
    let queries: Vec<String> = official_queries()
        .into_iter()
        .filter(|q| only.as_ref().is_none_or(|o| o.contains(q)))
        .collect();
    for q in &queries {
        let sql = query_sql(&set, q).unwrap();
        let checked = run_by_tasks(&env, &frames, q, &sql).and_then(|(answer, plan)| {
            split_stages += plan.stages.iter().filter(|s| s.tasks > 1).count();
            exchanges += plan
                .stages
                .iter()
                .filter(|s| s.operator.starts_with("RepartitionExec"))
                .count();
            compare_values(&answer, &set.reference(q).unwrap(), plan.ordered)
                .map_err(|e| e.to_string())
        });
        if let Err(e) = checked {
            eprintln!("{q}: {e}");
            failures.push(q.clone());
        }
        assert_eq!(available(&env), free_before, "{q} left memory allocated");
    }
    assert!(
        failures.is_empty(),
        "{} queries differ: {failures:?}",
        failures.len()
    );
    eprintln!("{split_stages} stages ran as several tasks, {exchanges} ended in an exchange");
    if only.is_none() {
        assert!(
            split_stages > 99,
            "only {split_stages} stages split into tasks"
        );
        assert!(exchanges > 99, "only {exchanges} stages end in an exchange");
    }
}
