//! The main job as a user runs it (the `tpcds-main` binary) on the SF 0.01 test set,
//! and queries run one stage per process against `memory_server` processes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::sync::OnceLock;

use scad_benches::MemoryServerProcess;
use scad_remote_frame::Budget;
use scad_tpcds::data::{generate, DataSet, GenerateOptions};
use scad_tpcds::engine::{query_sql, session};
use scad_tpcds::remote::{Cluster, RemoteError};
use scad_tpcds::stages::{
    load_run_dir, read_stage, run_query_in_processes, run_stage_here, StageCommand,
};

const MAIN: &str = env!("CARGO_BIN_EXE_tpcds-main");

fn data_set() -> &'static DataSet {
    static SET: OnceLock<DataSet> = OnceLock::new();
    SET.get_or_init(|| {
        let mut options = GenerateOptions::new(0.01);
        options.spread_warehouses = 5;
        generate(&options).unwrap_or_else(|e| panic!("cannot generate the SF 0.01 test data: {e}"))
    })
}

#[test]
fn the_main_job_writes_one_json_line_per_query_for_all_99() {
    let json = std::env::temp_dir().join(format!("tpcds-main-{}.jsonl", std::process::id()));
    let out = Command::new(MAIN)
        .args([
            "--sf",
            "0.01",
            "--spread-warehouses",
            "5",
            "--chunk-rows",
            "4096",
        ])
        // No spilling here: the engine test runs all 99 within a spilling budget.
        .args(["--budget", "1G", "--duckdb-repeats", "1", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("99 of 99 queries equal DuckDB's answers"),
        "{stdout}"
    );
    let text = std::fs::read_to_string(&json).unwrap();
    std::fs::remove_file(&json).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let numbers: Vec<u64> = lines.iter().map(|l| l["query"].as_u64().unwrap()).collect();
    assert_eq!(numbers, (1..=99).collect::<Vec<u64>>());
    for l in &lines {
        assert_eq!(l["equal"], true, "{l}");
        assert!(l["secs"].as_f64().unwrap() > 0.0, "{l}");
        assert!(l["duckdb_secs"].as_f64().unwrap() > 0.0, "{l}");
        assert_eq!(l["budget"].as_u64().unwrap(), 1 << 30, "{l}");
        assert!(l["peak_local_bytes"].as_u64().unwrap() <= 1 << 30, "{l}");
        let part = |k: &str| l[k].as_u64().unwrap();
        assert!(
            part("bytes_moved") >= part("scan_bytes") + part("spill_bytes_written"),
            "{l}"
        );
    }
    // Queries read their tables, except where a filter excludes every chunk of a
    // build side (whose empty hash table ends the join before its probe side is read:
    // q24, q44, q93, q94 and q96 at SF 0.01).
    let idle: Vec<&str> = lines
        .iter()
        .filter(|l| l["scan_bytes"].as_u64() == Some(0))
        .filter_map(|l| l["name"].as_str())
        .collect();
    assert!(idle.len() <= 10, "read nothing: {idle:?}");
}

#[test]
fn bad_arguments_are_refused_before_anything_runs() {
    for (args, want) in [
        (&["--queries", "1,100"][..], "1 to 99"),
        (&["--budget", "lots"][..], "budget"),
        (&["--stage-processes", "--transport", "shm"][..], "tcp"),
        (&["--elements", "0"][..], "at least 1"),
    ] {
        let out = Command::new(MAIN)
            .args(["--sf", "0.01", "--duckdb-repeats", "0"])
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
    }
}

#[test]
fn queries_run_one_stage_per_process_against_memory_server_processes() {
    let servers = [
        MemoryServerProcess::start("512M").unwrap(),
        MemoryServerProcess::start("512M").unwrap(),
    ];
    let addrs: Vec<String> = servers.iter().map(|s| s.addr.clone()).collect();
    let set = data_set();
    let mut cluster = Cluster::connect_tcp(&addrs).unwrap();
    cluster.set_chunk_rows(4096);
    let dir = std::env::temp_dir().join(format!("tpcds-stages-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let tables = load_run_dir(&cluster, set, &dir).unwrap();
    let budget = tables.largest_bytes() / 4;
    let command = StageCommand {
        program: MAIN.into(),
        args: [
            "stage",
            "run",
            "--servers",
            &addrs.join(","),
            "--data",
            set.root.to_str().unwrap(),
            "--dir",
            dir.to_str().unwrap(),
            "--chunk-rows",
            "4096",
            "--budget",
            &budget.to_string(),
        ]
        .map(String::from)
        .to_vec(),
    };
    // q98 has a window function; q95 a self-join and EXISTS; q16 EXISTS / NOT EXISTS.
    for q in ["q1", "q16", "q95", "q98"] {
        let (run, reports) = run_query_in_processes(&cluster, set, &dir, q, budget, &command)
            .unwrap_or_else(|e| panic!("{q}: {e}"));
        assert!(run.equal(), "{q}: {:?}", run.error);
        assert!(reports.len() > 1, "{q} ran as {} stage(s)", reports.len());
        for r in &reports {
            assert!(r.peak_local_bytes <= budget, "{q} stage {}: {r:?}", r.stage);
        }
        assert!(run.handoff_bytes > 0, "{q}: no stage output handed on");
        assert!(!dir.join(q).exists(), "{q}: stage outputs left behind");
    }

    // A handoff whose memory was freed, or whose file was mangled, is refused.
    let planner = session(
        &cluster.env().with_budget(Budget::bytes(budget).unwrap()),
        &tables.open(&cluster).unwrap(),
    )
    .unwrap();
    let plan = planner.stages(&query_sql(set, "q1").unwrap()).unwrap();
    let reader = plan
        .stages
        .iter()
        .find(|s| s.inputs.contains(&0))
        .unwrap()
        .id;
    run_stage_here(&cluster, set, &dir, "q1", 0, budget).unwrap();
    for h in read_stage(&dir, "q1", 0).unwrap().into_iter().flatten() {
        cluster.reserve_past(&[&h]).unwrap();
        h.free(&cluster).unwrap();
    }
    let err = run_stage_here(&cluster, set, &dir, "q1", reader, budget).unwrap_err();
    assert!(matches!(err, RemoteError::Stale { .. }), "{err}");
    assert!(err.to_string().contains("freed"), "{err}");
    let err = run_stage_here(&cluster, set, &dir, "q1", 999, budget).unwrap_err();
    assert!(err.to_string().contains("no stage 999"), "{err}");
    std::fs::write(dir.join("q1").join("stage-0.json"), "[{\"version\": 1").unwrap();
    let err = run_stage_here(&cluster, set, &dir, "q1", reader, budget).unwrap_err();
    assert!(matches!(err, RemoteError::BadJson { .. }), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
