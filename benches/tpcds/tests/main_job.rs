//! The main job as a user runs it (the `tpcds-main` binary) on the SF 0.01 test set,
//! and queries run distributed, every task a process of its own, against
//! `memory_server` processes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::sync::OnceLock;

use scad_benches::MemoryServerProcess;
use scad_remote_frame::{Budget, Error as FrameError, QuerySession, TaskRunner};
use scad_tpcds::data::{generate, DataSet, GenerateOptions};
use scad_tpcds::engine::query_sql;
use scad_tpcds::remote::{load_tables, Cluster};
use scad_tpcds::stages::{run_query_distributed, ProcessRunner};

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
        (&["--stage-processes", "--workers", "0"][..], "at least 1"),
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
fn queries_run_distributed_as_task_processes_against_memory_server_processes() {
    let servers = [
        MemoryServerProcess::start("512M").unwrap(),
        MemoryServerProcess::start("512M").unwrap(),
    ];
    let addrs: Vec<String> = servers.iter().map(|s| s.addr.clone()).collect();
    let set = data_set();
    let mut cluster = Cluster::connect_tcp(&addrs).unwrap();
    cluster.set_chunk_rows(4096);
    let tables = load_tables(&cluster, set, None).unwrap();
    let budget = tables.largest_bytes() / 4;
    // Three partitions: stages split into tasks as on a cluster.
    let driver = QuerySession::with_partitions(
        &cluster.env().with_budget(Budget::bytes(budget).unwrap()),
        3,
    )
    .unwrap();
    for (name, frame) in tables.open(&cluster).unwrap() {
        driver.register(&name, &frame).unwrap();
    }
    let runner = ProcessRunner {
        program: MAIN.into(),
        args: ["stage", "task", "--servers", &addrs.join(",")]
            .map(String::from)
            .to_vec(),
    };
    let free_before = cluster.available_bytes();
    // q98 has a window function; q95 a self-join and EXISTS; q16 EXISTS / NOT EXISTS.
    for q in ["q1", "q16", "q95", "q98"] {
        let (run, tasks) = run_query_distributed(&driver, set, q, &runner, 2)
            .unwrap_or_else(|e| panic!("{q}: {e}"));
        assert!(run.equal(), "{q}: {:?}", run.error);
        let plan = driver.stages(&query_sql(set, q).unwrap()).unwrap();
        assert_eq!(
            tasks.len(),
            plan.stages.iter().map(|s| s.tasks).sum::<usize>()
        );
        assert!(
            tasks.len() > plan.stages.len(),
            "{q}: no stage split into tasks"
        );
        for t in &tasks {
            assert!(t.output.peak_local_bytes <= budget, "{q}: {t:?}");
        }
        assert!(run.handoff_bytes > 0, "{q}: nothing handed on");
        assert_eq!(
            cluster.available_bytes(),
            free_before,
            "{q} left memory allocated"
        );
    }

    // A task process that cannot start, or fails, fails its query naming the task.
    let broken = ProcessRunner {
        program: MAIN.into(),
        args: ["stage", "task", "--servers", "127.0.0.1:1"]
            .map(String::from)
            .to_vec(),
    };
    let sql = query_sql(set, "q1").unwrap();
    let err = driver.run_distributed(&sql, &broken, 2).unwrap_err();
    assert!(
        matches!(&err, FrameError::TaskFailed { message, .. } if message.contains("127.0.0.1:1")),
        "{err}"
    );
    assert_eq!(
        cluster.available_bytes(),
        free_before,
        "a failed query left memory allocated"
    );
    // A malformed spec is refused by the task process, naming the task.
    let spec = scad_remote_frame::TaskSpec {
        sql: "SELECT 1".into(),
        stage: 0,
        task: 0,
        budget: None,
        partitions: 1,
        chunk_rows: 4096,
        tables: Default::default(),
        inputs: Default::default(),
        region: Default::default(),
    };
    let err = runner.run(&spec).unwrap_err();
    assert!(err.to_string().contains("stage 0 task 0"), "{err}");
    assert!(
        err.to_string().contains("leaves out memory element"),
        "{err}"
    );
    tables.free(&cluster).unwrap();
}
