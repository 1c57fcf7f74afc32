//! The main job: the 99 TPC-DS queries, from their official SQL text, run by the query
//! engine over memory elements within a local memory budget, each answer checked
//! against DuckDB's, and DuckDB in memory timed on the same data in the same run.
//!
//! Generates the data set if absent (`tpcds/gen_data.py`, SF 1 by default, cached
//! under `data/tpcds`), starts embedded memory servers (or connects to running ones),
//! loads every table into memory elements (apart from query time), runs the queries
//! one after another and prints per query: time, rows, bytes moved, peak local memory
//! against the budget, spills, and whether the answer equals DuckDB's; then totals and
//! the ratio to DuckDB.
//!
//! ```text
//! cargo run --release -p scad-tpcds --bin tpcds-main -- --sf 1 --budget 25%
//! cargo run --release -p scad-tpcds --bin tpcds-main -- --queries 1,16,94,95 --json out.jsonl
//! cargo run --release -p scad-tpcds --bin tpcds-main -- --servers 127.0.0.1:7000,127.0.0.1:7001
//! cargo run --release -p scad-tpcds --bin tpcds-main -- --transport redis
//! ```

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use scad_tpcds::data::{generate, GenerateOptions};
use scad_tpcds::engine::{official_queries, parse_queries, query_number, run_query, session};
use scad_tpcds::remote::{
    duckdb_timings, load_tables, Cluster, DuckDbTiming, RedisServer, TransportKind,
};
use scad_tpcds::report::{fmt_bytes, fmt_secs, parse_budget};
use serde_json::json;

/// Command-line options.
#[derive(Debug, Parser)]
#[command(
    about = "The 99 TPC-DS queries through the query engine over memory elements, checked against DuckDB"
)]
struct Args {
    /// Scale factor (the data is generated once and cached under data/tpcds).
    #[arg(long, default_value_t = 1.0)]
    sf: f64,
    /// Local memory budget of every query: bytes (64M, 1G) or a percentage of the
    /// largest table (25%).
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
    /// Bytes per memory element (default: 512M or 2G per scale factor unit, whichever
    /// is larger).
    #[arg(long)]
    element_size: Option<String>,
    /// Queries to run, by number or name (1,16,q94); default all 99.
    #[arg(long, value_delimiter = ',')]
    queries: Vec<String>,
    /// Rows per stored chunk of every table: the scan reads a chunk at a time, so a
    /// chunk must be small next to the budget.
    #[arg(long, default_value_t = 8192)]
    chunk_rows: usize,
    /// Timed DuckDB runs per query in this run, after a warm-up (0: skip DuckDB).
    #[arg(long, default_value_t = 3)]
    duckdb_repeats: usize,
    /// Write one JSON object per query per line here.
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
    if args.chunk_rows == 0 {
        bail!("--chunk-rows must be at least 1");
    }
    let queries = if args.queries.is_empty() {
        official_queries()
    } else {
        parse_queries(&args.queries)?
    };

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

    let spinner = ProgressBar::new_spinner()
        .with_style(ProgressStyle::with_template("{spinner} {msg} [{elapsed}]")?);
    spinner.enable_steady_tick(std::time::Duration::from_millis(200));
    spinner.set_message("loading the tables into memory elements");
    let tables = load_tables(&cluster, &set, None)?;
    spinner.finish_and_clear();
    let largest = tables.largest_bytes();
    let budget = parse_budget(&args.budget, largest)?;
    println!(
        "loaded {} tables ({}) in {} (not counted as query time); largest {}; budget {} per query",
        tables.tables.len(),
        fmt_bytes(tables.total_bytes()),
        fmt_secs(tables.load_secs),
        fmt_bytes(largest),
        fmt_bytes(budget)
    );
    let env = cluster.env().with_budget(budget);
    let session = session(&env, &tables.open(&cluster)?)?;

    println!(
        "\n{:<5} {:>10} {:>8} {:>11} {:>23} {:>17}  result",
        "query", "time", "rows", "moved", "peak local / budget", "spilled"
    );
    let bar = ProgressBar::new(queries.len() as u64).with_style(ProgressStyle::with_template(
        "{bar:30} {pos}/{len} queries, running {msg} [{elapsed}]",
    )?);
    let mut runs = Vec::with_capacity(queries.len());
    for q in &queries {
        bar.set_message(q.clone());
        let run = run_query(&session, &set, q)?;
        let line = match (&run.stats, &run.error) {
            (Some(s), error) => format!(
                "{:<5} {:>10} {:>8} {:>11} {:>23} {:>17}  {}",
                q,
                fmt_secs(run.secs),
                s.rows,
                fmt_bytes(s.bytes_moved()),
                format!(
                    "{} / {}",
                    fmt_bytes(s.peak_local_bytes),
                    fmt_bytes(s.budget)
                ),
                format!("{} in {}", fmt_bytes(s.spill_bytes_written), s.spill_files),
                match error {
                    None => "equals DuckDB".to_string(),
                    Some(e) => format!("DIFFERS: {e}"),
                }
            ),
            (None, error) => format!(
                "{:<5} {:>10}  FAILED: {}",
                q,
                fmt_secs(run.secs),
                error.as_deref().unwrap_or("?")
            ),
        };
        // A hidden bar (output not a terminal) prints nothing, not even println.
        if bar.is_hidden() {
            println!("{line}");
        } else {
            bar.println(line);
        }
        bar.inc(1);
        runs.push(run);
    }
    bar.finish_and_clear();
    drop(session);
    tables.free(&cluster)?;

    let duck: Vec<DuckDbTiming> = if args.duckdb_repeats > 0 {
        let spinner = ProgressBar::new_spinner()
            .with_style(ProgressStyle::with_template("{spinner} {msg} [{elapsed}]")?);
        spinner.enable_steady_tick(std::time::Duration::from_millis(200));
        spinner.set_message(format!(
            "timing DuckDB in memory on the same data ({} runs per query after a warm-up, median)",
            args.duckdb_repeats
        ));
        let timings = duckdb_timings(args.sf, &queries, args.duckdb_repeats, None);
        spinner.finish_and_clear();
        timings.unwrap_or_else(|e| {
            eprintln!("warning: no DuckDB timing: {e}");
            Vec::new()
        })
    } else {
        Vec::new()
    };
    let duck_secs = |q: &str| {
        duck.iter()
            .find(|d| d.query == q)
            .and_then(|d| d.query_s_median)
    };

    let equal = runs.iter().filter(|r| r.equal()).count();
    let ours: f64 = runs.iter().map(|r| r.secs).sum();
    let duck_total: Option<f64> = runs.iter().map(|r| duck_secs(&r.query)).sum();
    let peak = runs
        .iter()
        .filter_map(|r| r.stats.map(|s| s.peak_local_bytes))
        .max()
        .unwrap_or(0);
    let moved: u64 = runs
        .iter()
        .filter_map(|r| r.stats.map(|s| s.bytes_moved()))
        .sum();
    let spilled = runs
        .iter()
        .filter(|r| r.stats.is_some_and(|s| s.spill_files > 0))
        .count();
    println!(
        "\n{equal} of {} queries equal DuckDB's answers; {spilled} spilled to memory elements",
        runs.len()
    );
    println!(
        "total: ours {} ({}, budget {}, highest peak {}, moved {}){}",
        fmt_secs(ours),
        args.transport,
        fmt_bytes(budget),
        fmt_bytes(peak),
        fmt_bytes(moved),
        match duck_total {
            Some(d) => format!(
                "; DuckDB in memory {} (this run); ratio {:.2}x",
                fmt_secs(d),
                ours / d
            ),
            None => String::new(),
        }
    );

    if let Some(path) = &args.json {
        let mut out = std::fs::File::create(path)
            .with_context(|| format!("creating {}", path.display()))?;
        for r in &runs {
            let s = r.stats.unwrap_or_default();
            let line = json!({
                "query": query_number(&r.query)?,
                "name": r.query,
                "sf": args.sf,
                "transport": args.transport.to_string(),
                "equal": r.equal(),
                "error": r.error,
                "secs": r.secs,
                "duckdb_secs": duck_secs(&r.query),
                "rows": r.stats.map(|s| s.rows),
                "peak_local_bytes": s.peak_local_bytes,
                "budget": budget,
                "bytes_moved": s.bytes_moved(),
                "scan_bytes": s.scan_bytes,
                "spill_files": s.spill_files,
                "spill_bytes_written": s.spill_bytes_written,
            });
            writeln!(out, "{line}").with_context(|| format!("writing {}", path.display()))?;
        }
    }
    if equal != runs.len() {
        let failed: Vec<&str> = runs
            .iter()
            .filter(|r| !r.equal())
            .map(|r| r.query.as_str())
            .collect();
        bail!(
            "{} queries failed or differ from DuckDB: {}",
            failed.len(),
            failed.join(", ")
        );
    }
    Ok(())
}
