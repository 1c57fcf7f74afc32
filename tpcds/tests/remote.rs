//! The pipelines over memory elements on SF 0.01 data generated during the test run
//! (cached under data/tpcds): every query equals DuckDB's answer within a local memory
//! budget that the kernels keep to, bad handoffs fail clearly, and the steps run as
//! separate processes over memory servers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::process::Command;
use std::sync::OnceLock;

use scad_core::server::{MemoryServer, ServerConfig};
use scad_tpcds::compare::compare;
use scad_tpcds::data::{generate, DataSet, GenerateOptions};
use scad_tpcds::queries::ALL_REFERENCES;
use scad_tpcds::remote::{
    load_tables, tables_for, Cluster, Handoff, RemoteError, RemotePipeline, TableHandoffs,
    TransportKind,
};

fn data_set() -> &'static DataSet {
    static SET: OnceLock<DataSet> = OnceLock::new();
    SET.get_or_init(|| {
        let mut options = GenerateOptions::new(0.01);
        options.spread_warehouses = 5;
        generate(&options).unwrap_or_else(|e| panic!("cannot generate the SF 0.01 test data: {e}"))
    })
}

/// Two embedded tcp memory servers, small chunks so that frames span many chunks.
///
/// The kernels stream whole chunks: a streaming step holds the batch it works on (at
/// least one chunk), the next one read ahead, its output and the writer's pending
/// chunk. So the chunks of the widest input (catalog_sales, ~70 bytes a row) must be
/// a small fraction of the budget for any step to keep to it.
fn cluster(chunk_rows: usize) -> Cluster {
    let mut c = Cluster::embedded(TransportKind::Tcp, 2, 128 << 20).unwrap();
    c.set_chunk_rows(chunk_rows);
    c
}

fn load(c: &Cluster, queries: &[&str]) -> TableHandoffs {
    let q: Vec<String> = queries.iter().map(|s| s.to_string()).collect();
    load_tables(c, data_set(), &tables_for(&q).unwrap()).unwrap()
}

/// Runs `query` at `budget` and checks the result against DuckDB and every step's
/// peak local memory against the budget; returns the partitions written.
fn check(c: &Cluster, tables: &TableHandoffs, query: &str, budget: u64) -> u64 {
    let p = RemotePipeline::for_query(query).unwrap();
    let run = p
        .run(c, tables, budget)
        .unwrap_or_else(|e| panic!("{query}: {e}"));
    assert_eq!(run.steps.len(), p.pipeline.steps.len());
    if let Err(e) = compare(
        &run.result,
        &data_set().reference(query).unwrap(),
        p.row_order(),
    ) {
        panic!("{query}: {e}\nresult:\n{}", run.result);
    }
    for s in &run.steps {
        assert!(
            s.peak_local_bytes <= budget,
            "{query}/{}: peak local {} > budget {budget}",
            s.step,
            s.peak_local_bytes
        );
        // An empty result (q16's official parameters at SF 0.01) has no chunks to write.
        assert!(
            s.rows == 0 || s.bytes_out > 0,
            "{query}/{}: {} rows but wrote nothing",
            s.step,
            s.rows
        );
    }
    run.steps.iter().map(|s| s.partitions).sum()
}

#[test]
fn every_query_equals_duckdb_at_a_quarter_of_the_largest_input() {
    let c = cluster(512);
    let tables = load(&c, &ALL_REFERENCES);
    let budget = tables.largest_bytes() / 4;
    for q in ALL_REFERENCES {
        check(&c, &tables, q, budget);
    }
    // Every intermediate was freed: only the tables (and their seals) remain.
    tables.free(&c).unwrap();
}

#[test]
fn a_small_budget_partitions_and_still_equals_duckdb() {
    let c = cluster(256);
    let tables = load(&c, &["q95_wide", "q16_wide"]);
    let budget = tables.largest_bytes() / 10;
    let parts = check(&c, &tables, "q95_wide", budget) + check(&c, &tables, "q16_wide", budget);
    assert!(
        parts > 0,
        "a budget of 10% should force grace hash partitioning"
    );
}

/// Runs q1's first step and returns its handoff JSON with the cluster and tables.
fn first_step() -> (Cluster, TableHandoffs, RemotePipeline, String) {
    let c = cluster(1024);
    let tables = load(&c, &["q1"]);
    let p = RemotePipeline::for_query("q1").unwrap();
    let (h, _) = p
        .run_step(&c, "dates_in_year", &tables, &HashMap::new(), 1 << 30)
        .unwrap();
    let json = h.to_json().unwrap();
    (c, tables, p, json)
}

fn second_step(
    c: &Cluster,
    t: &TableHandoffs,
    p: &RemotePipeline,
    dates_json: String,
) -> Result<(), RemoteError> {
    let parents = HashMap::from([("dates_in_year".to_string(), dates_json)]);
    p.run_step(c, "returns_in_year", t, &parents, 1 << 30)
        .map(|_| ())
}

#[test]
fn a_good_handoff_is_accepted() {
    let (c, t, p, json) = first_step();
    second_step(&c, &t, &p, json).unwrap();
}

#[test]
fn a_handoff_of_the_wrong_frame_names_the_missing_column() {
    let (c, t, p, _) = first_step();
    let (stores, _) = p
        .run_step(&c, "stores_in_state", &t, &HashMap::new(), 1 << 30)
        .unwrap();
    let err = second_step(&c, &t, &p, stores.to_json().unwrap()).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("d_date_sk") && msg.contains("returns_in_year"),
        "{msg}"
    );
}

#[test]
fn a_freed_frame_is_refused() {
    let (c, t, p, json) = first_step();
    Handoff::from_json(&json, "test").unwrap().free(&c).unwrap();
    let err = second_step(&c, &t, &p, json).unwrap_err();
    assert!(matches!(err, RemoteError::Stale { .. }), "{err}");
    assert!(err.to_string().contains("freed"), "{err}");
}

#[test]
fn an_overwritten_frame_is_refused() {
    let (c, t, p, json) = first_step();
    let h = Handoff::from_json(&json, "test").unwrap();
    let chunk = &h.frame.chunks[0];
    // Another writer reuses the range (as after a free without clearing the seal).
    c.transport(&chunk.element)
        .unwrap()
        .write(chunk.addr, &[0xA5; 64])
        .unwrap();
    let err = second_step(&c, &t, &p, json).unwrap_err();
    assert!(matches!(err, RemoteError::Stale { .. }), "{err}");
    assert!(err.to_string().contains("overwritten"), "{err}");
}

#[test]
fn corrupted_or_edited_json_is_refused() {
    let (c, t, p, json) = first_step();
    let truncated = json[..json.len() / 2].to_string();
    let err = second_step(&c, &t, &p, truncated).unwrap_err();
    assert!(matches!(err, RemoteError::BadJson { .. }), "{err}");
    // Renaming a column in the metadata no longer matches the seal's hash.
    let edited = json.replace("\"d_date_sk\"", "\"sr_returned_date_sk\"");
    assert_ne!(edited, json);
    let err = second_step(&c, &t, &p, edited).unwrap_err();
    assert!(matches!(err, RemoteError::Stale { .. }), "{err}");
    // More rows than the chunks hold: the metadata itself is inconsistent.
    let mut v: serde_json::Value = serde_json::from_str(&json).unwrap();
    v["frame"]["rows"] = serde_json::json!(v["frame"]["rows"].as_u64().unwrap() + 1);
    let err = second_step(&c, &t, &p, v.to_string()).unwrap_err();
    assert!(err.to_string().contains("rows"), "{err}");
}

#[test]
fn q1_runs_one_step_per_process() {
    let exe = env!("CARGO_BIN_EXE_tpcds-step");
    let servers: Vec<MemoryServer> = (0..2)
        .map(|_| MemoryServer::start("127.0.0.1:0", 128 << 20, ServerConfig::default()).unwrap())
        .collect();
    let addrs = servers
        .iter()
        .map(|s| s.local_addr().to_string())
        .collect::<Vec<_>>()
        .join(",");
    let dir = std::env::temp_dir().join(format!("tpcds-steps-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let run = |args: &[&str]| {
        let out = Command::new(exe).args(args).output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let data = data_set().root.to_str().unwrap().to_string();
    let d = dir.to_str().unwrap();
    let (ok, _, err) = run(&[
        "load",
        "--servers",
        &addrs,
        "--data",
        &data,
        "--queries",
        "q1",
        "--dir",
        d,
        "--chunk-rows",
        "1024",
    ]);
    assert!(ok, "load: {err}");
    let (ok, steps, err) = run(&["steps", "--query", "q1"]);
    assert!(ok, "steps: {err}");
    let steps: Vec<&str> = steps
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(steps.len(), 9);
    for step in &steps {
        let (ok, out, err) = run(&[
            "run",
            "--servers",
            &addrs,
            "--query",
            "q1",
            "--step",
            step,
            "--dir",
            d,
        ]);
        assert!(ok, "{step}: {err}");
        let report: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(report["step"], *step);
        assert!(report["peak_local_bytes"].as_u64().unwrap() <= report["budget"].as_u64().unwrap());
    }
    let (ok, out, err) = run(&[
        "result",
        "--servers",
        &addrs,
        "--query",
        "q1",
        "--dir",
        d,
        "--data",
        &data,
    ]);
    assert!(ok, "result: {err}");
    assert!(out.contains("equals DuckDB"), "{out}");
    // A step given a corrupted parent handoff fails and says why.
    let bad = dir.join("bad.txt");
    std::fs::write(&bad, "{\"version\": 1, \"producer\": ").unwrap();
    let (ok, _, err) = run(&[
        "run",
        "--servers",
        &addrs,
        "--query",
        "q1",
        "--step",
        "returns_in_year",
        "--dir",
        d,
        "--input",
        &format!("dates_in_year={}", bad.display()),
    ]);
    assert!(!ok);
    assert!(err.contains("malformed handoff JSON"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
