//! The main job: the 99 TPC-DS queries, from their official SQL text, run by the query
//! engine over memory elements within a local memory budget, each answer checked
//! against DuckDB's, and DuckDB in memory timed on the same data in the same run.
//!
//! Generates the data set if absent (`benches/tpcds/gen_data.py`, SF 1 by default, cached
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
//! cargo run --release -p scad-tpcds --bin tpcds-main -- --sf 0.1 --stage-processes
//! ```
//!
//! With `--stage-processes` each query runs distributed
//! ([`scad_remote_frame::QuerySession::run_distributed`]): every task of every stage of
//! its plan is a process of its own (this binary's `stage task`, the task's spec on
//! stdin, its output on stdout), at most `--workers` at once, against the same memory
//! servers over tcp, handing outputs on through memory elements.

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use scad_remote_frame::Budget;
use scad_tpcds::data::{generate, GenerateOptions};
use scad_tpcds::engine::{
    official_queries, parse_queries, query_number, run_query_times, session_with_partitions,
};
use scad_tpcds::regress::{
    compare_runs, comparison_table, machine_factor, read_results, QueryResult, SLOWER_RATIO,
    SLOWER_SECS,
};
use scad_tpcds::remote::{
    duckdb_timings, load_tables, Cluster, DuckDbTiming, RedisServer, TransportKind,
};
use scad_tpcds::report::{fmt_budget, fmt_bytes, fmt_secs, parse_budget};
use scad_tpcds::stages::{run_query_distributed, run_task_here, ProcessRunner};
use serde_json::json;

/// mimalloc instead of the system allocator: planning and the operators allocate and
/// free many small objects (glibc's malloc and free were a sixth of planning time).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Command-line options.
#[derive(Debug, Parser)]
#[command(
    about = "The 99 TPC-DS queries through the query engine over memory elements, checked against DuckDB",
    args_conflicts_with_subcommands = true
)]
struct Args {
    /// One stage of a query per process, by hand (see the docs).
    #[command(subcommand)]
    command: Option<Command>,
    /// Scale factor (the data is generated once and cached under data/tpcds).
    #[arg(long, default_value_t = 1.0)]
    sf: f64,
    /// TEST DATA ONLY: spread the catalog and web sales over N warehouses (below SF 1
    /// dsdgen makes one, and q16, q94 and q95 match nothing).
    #[arg(long, default_value_t = 0)]
    spread_warehouses: u32,
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
    /// Bytes per memory element (default: 512M or 4G per scale factor unit, whichever
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
    /// Runs of each query through our engine; the fastest is reported (a run that
    /// fails or differs is reported instead). Not with --stage-processes.
    #[arg(long, default_value_t = 1)]
    repeats: usize,
    /// Write one JSON object per query per line here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Compare this run query by query with a baseline written by `--json` (e.g.
    /// benches/results/main-sf1.jsonl): prints the table and fails if a query got
    /// more than 1.5x and 0.2 s slower, or no longer equals DuckDB (times scaled to
    /// the baseline's machine by DuckDB's total time in both runs).
    #[arg(long)]
    compare: Option<PathBuf>,
    /// Run each query distributed: every task of its stages as a process of its own
    /// (tcp only).
    #[arg(long)]
    stage_processes: bool,
    /// With --stage-processes: task processes running at once.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Print each query's physical plan (EXPLAIN) instead of running it.
    #[arg(long)]
    explain: bool,
    /// Partitions every query runs in (default: the session's choice, one per 12 MiB
    /// of budget, so one below 24 MiB, at most one per core).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    partitions: Option<u16>,
    /// Run each query and print its physical plan with every operator's metrics
    /// (EXPLAIN ANALYZE: rows, time, bytes read, spills) instead of the table.
    #[arg(long, conflicts_with_all = ["explain", "stage_processes"])]
    analyze: bool,
    /// Print each query's plan after every analyzer and optimizer rule, pass by pass
    /// (DataFusion's EXPLAIN VERBOSE), instead of running it.
    #[arg(long, conflicts_with_all = ["explain", "analyze", "stage_processes"])]
    explain_rules: bool,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Task process commands.
    #[command(subcommand)]
    Stage(StageCommandArgs),
}

#[derive(Debug, Subcommand)]
enum StageCommandArgs {
    /// Run one task of a distributed query: its spec (JSON) on stdin, its output
    /// (JSON) on stdout.
    Task {
        /// Memory servers, HOST:PORT,... (element memI = the I-th, as the driver's).
        #[arg(long, value_delimiter = ',', required = true)]
        servers: Vec<String>,
    },
}

fn stage_command(command: StageCommandArgs) -> Result<()> {
    match command {
        StageCommandArgs::Task { servers } => {
            let mut spec = String::new();
            std::io::stdin()
                .read_to_string(&mut spec)
                .context("reading the task spec from stdin")?;
            let output = run_task_here(&servers, &spec)?;
            let mut stdout = std::io::stdout().lock();
            writeln!(stdout, "{output}")?;
        }
    }
    Ok(())
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    if let Some(Command::Stage(command)) = args.command {
        return stage_command(command);
    }
    if args.elements == 0 {
        bail!("--elements must be at least 1");
    }
    if args.chunk_rows == 0 {
        bail!("--chunk-rows must be at least 1");
    }
    if args.workers == 0 {
        bail!("--workers must be at least 1");
    }
    if args.repeats == 0 {
        bail!("--repeats must be at least 1");
    }
    if args.repeats > 1 && args.stage_processes {
        bail!("--repeats runs a query in this process again; drop --stage-processes");
    }
    if args.stage_processes && args.transport != TransportKind::Tcp {
        bail!(
            "--stage-processes reaches the memory servers over tcp from every stage process; drop --transport {}",
            args.transport
        );
    }
    // Read before the run: a missing or malformed baseline fails at once.
    let baseline = match &args.compare {
        Some(path) => Some(read_results(path)?),
        None => None,
    };
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
    let mut options = GenerateOptions::new(args.sf);
    options.spread_warehouses = args.spread_warehouses;
    let set = generate(&options).context("generating the TPC-DS data")?;
    spinner.finish_and_clear();
    println!("data: {} (SF {})", set.root.display(), set.manifest.sf);

    let element_size = match &args.element_size {
        Some(s) => parse_budget(s, 0).context("--element-size")?,
        None => (512u64 << 20).max((args.sf * (4u64 << 30) as f64) as u64),
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
                let s = RedisServer::start(&[])?;
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
        "loaded {} tables ({}) in {} (not counted as query time); largest {}; budget {} per {}",
        tables.tables.len(),
        fmt_bytes(tables.total_bytes()),
        fmt_secs(tables.load_secs),
        fmt_bytes(largest),
        fmt_bytes(budget),
        if args.stage_processes {
            "task process"
        } else {
            "query"
        }
    );
    let env = cluster.env().with_budget(Budget::bytes(budget)?);
    let partitions = args.partitions.map(usize::from);
    let session = session_with_partitions(&env, &tables.open(&cluster)?, partitions)?;
    let servers = if args.servers.is_empty() {
        cluster.server_addrs()
    } else {
        args.servers.clone()
    };
    let runner = ProcessRunner {
        program: std::env::current_exe().context("locating this binary for the task processes")?,
        args: vec![
            "stage".into(),
            "task".into(),
            "--servers".into(),
            servers.join(","),
        ],
    };

    if args.explain {
        let mut planning = std::time::Duration::ZERO;
        for q in &queries {
            let sql = scad_tpcds::engine::query_sql(&set, q)?;
            let started = std::time::Instant::now();
            let plan = session.explain(&sql)?;
            let took = started.elapsed();
            planning += took;
            println!("-- {q} (planned in {took:.1?})\n{plan}");
        }
        println!("planned {} queries in {planning:.2?}", queries.len());
        return Ok(());
    }
    if args.explain_rules {
        for q in &queries {
            let sql = scad_tpcds::engine::query_sql(&set, q)?;
            let out = session.sql(&format!("EXPLAIN VERBOSE {sql}"))?;
            let table = datafusion::arrow::util::pretty::pretty_format_batches(out.batches())?;
            println!("-- {q}\n{table}");
        }
        return Ok(());
    }
    if args.analyze {
        for q in &queries {
            let sql = scad_tpcds::engine::query_sql(&set, q)?;
            let started = std::time::Instant::now();
            let out = session.sql(&sql)?;
            println!(
                "-- {q}: {} rows in {:.3} s\n{}",
                out.rows(),
                started.elapsed().as_secs_f64(),
                out.explain_analyze()
            );
        }
        return Ok(());
    }
    println!(
        "\n{:<5} {:>10} {:>8} {:>11} {:>23} {:>17}  result",
        "query", "time", "rows", "moved", "peak local / budget", "spilled"
    );
    let bar = ProgressBar::new(queries.len() as u64).with_style(ProgressStyle::with_template(
        "{bar:30} {pos}/{len} queries, running {msg} [{elapsed}]",
    )?);
    let mut runs = Vec::with_capacity(queries.len());
    // Tasks each query ran as (distributed runs only).
    let mut task_counts = Vec::with_capacity(queries.len());
    for q in &queries {
        bar.set_message(q.clone());
        let run = if args.stage_processes {
            let (run, tasks) = run_query_distributed(&session, &set, q, &runner, args.workers)?;
            task_counts.push(Some(tasks.len()));
            run
        } else {
            task_counts.push(None);
            let mut runs = run_query_times(&session, &set, q, args.repeats)?;
            // The fastest, or the run that failed or differed (the last).
            let failed = runs.last().is_some_and(|r| r.error.is_some());
            let at = if failed {
                runs.len() - 1
            } else {
                (0..runs.len())
                    .min_by(|&a, &b| runs[a].secs.total_cmp(&runs[b].secs))
                    .unwrap_or(0)
            };
            runs.swap_remove(at)
        };
        let line = match (&run.stats, &run.error) {
            (Some(s), error) => format!(
                "{:<5} {:>10} {:>8} {:>11} {:>23} {:>17}  {}",
                q,
                fmt_secs(run.secs),
                s.rows,
                fmt_bytes(run.bytes_moved()),
                format!(
                    "{} / {}",
                    fmt_bytes(s.peak_local_bytes),
                    fmt_budget(s.budget)
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
        let timings = duckdb_timings(&set, &queries, args.duckdb_repeats, None);
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
    let moved: u64 = runs.iter().map(|r| r.bytes_moved()).sum();
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
        let mut out =
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        for (r, tasks) in runs.iter().zip(&task_counts) {
            let s = r.stats.unwrap_or_default();
            let line = json!({
                "query": query_number(&r.query)?,
                "name": r.query,
                "sf": args.sf,
                "transport": args.transport.to_string(),
                "stage_processes": args.stage_processes,
                "workers": args.stage_processes.then_some(args.workers),
                "tasks": tasks,
                "equal": r.equal(),
                "error": r.error,
                "secs": r.secs,
                "duckdb_secs": duck_secs(&r.query),
                "rows": r.stats.map(|s| s.rows),
                "peak_local_bytes": s.peak_local_bytes,
                "budget": budget,
                "bytes_moved": r.bytes_moved(),
                "handoff_bytes": r.handoff_bytes,
                "scan_bytes": s.scan_bytes,
                "spill_files": s.spill_files,
                "spill_bytes_written": s.spill_bytes_written,
            });
            writeln!(out, "{line}").with_context(|| format!("writing {}", path.display()))?;
        }
    }
    if let Some(baseline) = baseline {
        let new: Vec<QueryResult> = runs
            .iter()
            .map(|r| QueryResult {
                name: r.query.clone(),
                equal: r.equal(),
                secs: r.secs,
                duckdb_secs: duck_secs(&r.query),
                spill_files: r.stats.map_or(0, |s| s.spill_files),
                bytes_moved: r.bytes_moved(),
            })
            .collect();
        let changes = compare_runs(&baseline, &new);
        println!(
            "\ncompared with {} (this run's times x {:.2}: DuckDB's time there over its time here):\n{}",
            args.compare.as_deref().unwrap_or(Path::new("")).display(),
            machine_factor(&baseline, &new),
            comparison_table(&changes, 5)
        );
        let regressed: Vec<&str> = changes
            .iter()
            .filter(|c| c.regressed)
            .map(|c| c.name.as_str())
            .collect();
        if !regressed.is_empty() {
            bail!(
                "{} queries regressed against the baseline (> {SLOWER_RATIO}x and > {SLOWER_SECS} s slower, or no longer equal): {}",
                regressed.len(),
                regressed.join(", ")
            );
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
