//! The main job: TPC-DS queries 1, 16, 94 and 95 as pipelines over memory elements.
//!
//! Generates the data set if absent (`tpcds/gen_data.py`, SF 0.1 by default), starts
//! embedded memory servers (or connects to running ones), loads the base tables into
//! memory elements, runs every query step by step — each step reading its parents'
//! frames by their handoff JSON and writing its result to memory elements — checks
//! each result against DuckDB's reference answer, times DuckDB in memory on the same
//! data in the same run, and prints per-step and per-query tables.
//!
//! ```text
//! cargo run --release -p scad-tpcds --bin tpcds-main -- --sf 0.1 --budget 25%
//! cargo run --release -p scad-tpcds --bin tpcds-main -- --servers 127.0.0.1:7000,127.0.0.1:7001
//! cargo run --release -p scad-tpcds --bin tpcds-main -- --transport redis
//! ```

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use scad_tpcds::compare::compare;
use scad_tpcds::data::{generate, GenerateOptions};
use scad_tpcds::queries::OFFICIAL;
use scad_tpcds::remote::{
    duckdb_timings, fmt_bytes, fmt_secs, load_tables, parse_budget, tables_for, Cluster,
    RedisServer, RemotePipeline, TransportKind,
};
use serde_json::json;

/// Command-line options.
#[derive(Debug, Parser)]
#[command(
    about = "TPC-DS q1/q16/q94/q95 as pipelines over memory elements, checked against DuckDB"
)]
struct Args {
    /// Scale factor (the data is generated once and cached under data/tpcds).
    #[arg(long, default_value_t = 0.1)]
    sf: f64,
    /// Local memory budget of every step: bytes (64M, 1G) or a percentage of the largest
    /// loaded input table (25%).
    #[arg(long, default_value = "25%")]
    budget: String,
    /// Connect to running memory servers (HOST:PORT,...) instead of starting embedded
    /// ones (tcp only).
    #[arg(long, value_delimiter = ',')]
    servers: Vec<String>,
    /// How the memory elements are reached: tcp (embedded memory servers), shm, local,
    /// or redis (a Redis server as the store).
    #[arg(long, default_value = "tcp")]
    transport: TransportKind,
    /// With --transport redis: a running Redis server (HOST:PORT); without it a private
    /// redis-server is started.
    #[arg(long)]
    redis: Option<String>,
    /// Memory elements to start (embedded, shm, local, redis).
    #[arg(long, default_value_t = 2)]
    elements: usize,
    /// Bytes per memory element (default: 512M or 2G per scale factor unit, whichever is larger).
    #[arg(long)]
    element_size: Option<String>,
    /// Queries to run.
    #[arg(long, value_delimiter = ',', default_values_t = OFFICIAL.map(String::from))]
    queries: Vec<String>,
    /// Rows per stored chunk of every frame. Kernels stream whole chunks (the current
    /// one, the one read ahead and the output being written), so a chunk must be small
    /// next to the budget: at SF 0.1 and a 25% budget 8192 rows keeps every step inside
    /// it, while 128Ki-row chunks overshoot it 2-4x.
    #[arg(long, default_value_t = 8192)]
    chunk_rows: usize,
    /// Timed DuckDB runs per query in this run (0: skip the DuckDB comparison).
    #[arg(long, default_value_t = 3)]
    duckdb_repeats: usize,
    /// Also write the per-step reports as JSON lines here.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    if args.elements == 0 {
        bail!("--elements must be at least 1");
    }

    let spinner = ProgressBar::new_spinner()
        .with_style(ProgressStyle::with_template("{spinner} {msg} [{elapsed}]")?);
    spinner.enable_steady_tick(std::time::Duration::from_millis(200));
    spinner.set_message(format!(
        "generating (or reusing) TPC-DS SF {} with DuckDB",
        args.sf
    ));
    let set = generate(&GenerateOptions::new(args.sf)).context("generating the TPC-DS data")?;
    spinner.finish_and_clear();
    println!("data: {} (SF {})", set.root.display(), set.manifest.sf);

    let element_size = match &args.element_size {
        Some(s) => parse_budget(s, 0).context("--element-size")?,
        None => (512u64 << 20).max((args.sf * (2u64 << 30) as f64) as u64),
    };
    let mut _redis_server = None;
    let mut cluster = if !args.servers.is_empty() {
        if args.transport != TransportKind::Tcp {
            bail!(
                "--servers connects to memory servers over tcp; drop --transport {}",
                args.transport
            );
        }
        Cluster::connect_tcp(&args.servers)?
    } else if args.transport == TransportKind::Redis {
        let addr = match &args.redis {
            Some(a) => a.clone(),
            None => {
                let s = RedisServer::start()?;
                let a = s.addr().to_string();
                _redis_server = Some(s);
                a
            }
        };
        Cluster::redis(
            &addr,
            args.elements,
            element_size,
            &format!("tpcds-{}", std::process::id()),
        )?
    } else {
        Cluster::embedded(args.transport, args.elements, element_size)?
    };
    cluster.set_chunk_rows(args.chunk_rows);
    println!("memory elements: {}", cluster.description());

    let tables = load_tables(&cluster, &set, &tables_for(&args.queries)?)?;
    let largest = tables.largest_bytes();
    let budget = parse_budget(&args.budget, largest)?;
    let loaded: u64 = tables.tables.values().map(|h| h.frame.data_bytes()).sum();
    println!(
        "loaded {} tables ({}) into memory elements in {} (not counted as query time); largest input {}; budget {} per step",
        tables.tables.len(),
        fmt_bytes(loaded),
        fmt_secs(tables.load_secs),
        fmt_bytes(largest),
        fmt_bytes(budget)
    );

    let mut summary = Vec::new();
    let mut failures = Vec::new();
    let mut json_lines = Vec::new();
    for q in &args.queries {
        let pipeline = RemotePipeline::for_query(q)?;
        let run = pipeline
            .run(&cluster, &tables, budget)
            .with_context(|| format!("running {q}"))?;
        let check = compare(&run.result, &set.reference(q)?, pipeline.row_order());
        println!("\n{q}: {} steps", run.steps.len());
        println!(
            "  {:<26} {:>10} {:>9} {:>11} {:>11} {:>11} {:>6}",
            "step", "time", "rows", "read", "written", "peak local", "parts"
        );
        for s in &run.steps {
            println!(
                "  {:<26} {:>10} {:>9} {:>11} {:>11} {:>11} {:>6}",
                s.step,
                fmt_secs(s.secs),
                s.rows,
                fmt_bytes(s.bytes_in),
                fmt_bytes(s.bytes_out),
                fmt_bytes(s.peak_local_bytes),
                s.partitions
            );
            json_lines.push(json!({"query": q, "sf": args.sf, "transport": args.transport.to_string(), "report": s}));
        }
        let ok = match &check {
            Ok(()) => "equals DuckDB".to_string(),
            Err(e) => {
                failures.push(format!("{q}: {e}"));
                format!("DIFFERS: {e}")
            }
        };
        println!(
            "  {:<26} {:>10}   peak local {} (budget {}), moved {}; result {ok}",
            "total",
            fmt_secs(run.secs),
            fmt_bytes(run.peak_local_bytes()),
            fmt_bytes(budget),
            fmt_bytes(run.bytes_moved())
        );
        if run.peak_local_bytes() > budget {
            failures.push(format!(
                "{q}: peak local memory {} exceeded the budget {} (try a smaller --chunk-rows)",
                fmt_bytes(run.peak_local_bytes()),
                fmt_bytes(budget)
            ));
        }
        summary.push((
            q.clone(),
            run.secs,
            run.peak_local_bytes(),
            run.bytes_moved(),
            ok,
        ));
    }
    tables.free(&cluster)?;

    let duck = if args.duckdb_repeats > 0 {
        println!(
            "\ntiming DuckDB in memory on the same data (gen_data.py --bench, {} runs, median) ...",
            args.duckdb_repeats
        );
        match duckdb_timings(args.sf, args.duckdb_repeats) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("warning: no DuckDB timing: {e}");
                Vec::new()
            }
        }
    } else {
        Vec::new()
    };

    println!("\n| query | ours ({}, budget {}) | DuckDB in memory (this run) | ratio | peak local | moved | result |", args.transport, fmt_bytes(budget));
    println!("|---|---|---|---|---|---|---|");
    for (q, secs, peak, moved, ok) in &summary {
        let d = duck.iter().find(|d| &d.query == q);
        let (dt, ratio) = match d {
            Some(d) => (
                fmt_secs(d.query_s_median),
                format!("{:.2}x", secs / d.query_s_median),
            ),
            None => ("-".into(), "-".into()),
        };
        println!(
            "| {q} | {} | {dt} | {ratio} | {} | {} | {ok} |",
            fmt_secs(*secs),
            fmt_bytes(*peak),
            fmt_bytes(*moved)
        );
    }
    if let Some(path) = &args.json {
        let text: String = json_lines.iter().map(|l| format!("{l}\n")).collect();
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    if !failures.is_empty() {
        bail!(
            "results differ from DuckDB's or broke the budget:\n{}",
            failures.join("\n")
        );
    }
    Ok(())
}
