//! The TPC-DS benchmark: the 99 queries at SF 1 through our engine over 2 tcp memory
//! elements within a 25 MiB local budget, against, in the same run and on the same
//! data: DuckDB in memory, DuckDB under a `memory_limit` equal to our budget (its own
//! spilling to disk), DataFusion in memory and with a memory pool equal to our budget
//! (its spilling to disk), Polars SQL in memory (Python), and our engine with Redis
//! as the memory element (the original Scad's store). Query time only (loading is
//! timed apart); every answer is compared with DuckDB's reference.
//!
//! Writes `benches/results/tpcds.{jsonl,md,png}` and says whether each target was met:
//! all 99 equal; total ≤ 1.5× DuckDB in memory; every query faster than DuckDB at the
//! same memory limit where DuckDB finishes; q1, q16, q94 and q95 each ≤ 1.5× DuckDB in
//! memory.
//!
//! ```text
//! cargo run --release -p scad-tpcds --bin tpcds-bench -- --sf 1
//! cargo run --release -p scad-tpcds --bin tpcds-bench -- --sf 0.1 --engines ours,duckdb
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use datafusion::arrow::compute::concat_batches;
use datafusion::datasource::MemTable;
use datafusion::execution::memory_pool::{FairSpillPool, MemoryPool, UnboundedMemoryPool};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};
use indicatif::{ProgressBar, ProgressStyle};
use scad_benches::{horizontal_bars, results_dir, Bar};
use scad_remote_frame::Budget;
use scad_tpcds::compare::compare_values;
use scad_tpcds::data::{generate, repo_root, DataSet, GenerateOptions};
use scad_tpcds::engine::{official_queries, parse_queries, run_query_times, session};
use scad_tpcds::remote::{duckdb_timings, load_tables, Cluster, RedisServer, TransportKind};
use scad_tpcds::report::{fmt_bytes, parse_budget};
use serde::Deserialize;
use serde_json::json;

/// mimalloc instead of the system allocator: planning and the operators allocate and
/// free many small objects (glibc's malloc and free were a sixth of planning time).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Command-line options.
#[derive(Debug, Parser)]
#[command(about = "The 99 TPC-DS queries: our engine vs DuckDB, DataFusion, Polars and Redis")]
struct Args {
    /// Scale factor.
    #[arg(long, default_value_t = 1.0)]
    sf: f64,
    /// Our local memory budget per query, and the memory limit of DuckDB's and
    /// DataFusion's limited runs: bytes (25M) or % of the largest table.
    #[arg(long, default_value = "25M")]
    budget: String,
    /// Queries (default all 99).
    #[arg(long, value_delimiter = ',')]
    queries: Vec<String>,
    /// Engines to run: ours, redis, duckdb, duckdb-limit, datafusion, datafusion-limit,
    /// polars (default all).
    #[arg(long, value_delimiter = ',')]
    engines: Vec<String>,
    /// Timed runs per query of ours, DuckDB and Polars (after a warm-up; median).
    /// DataFusion runs each query once.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// A DataFusion query still running after this many seconds is cancelled and
    /// counted as unfinished.
    #[arg(long, default_value_t = 60)]
    timeout_secs: u64,
    /// Rows per stored chunk of our tables.
    #[arg(long, default_value_t = 8192)]
    chunk_rows: usize,
}

const ENGINES: [&str; 7] = [
    "ours",
    "redis",
    "duckdb",
    "duckdb-limit",
    "datafusion",
    "datafusion-limit",
    "polars",
];

/// One engine's result on one query.
#[derive(Debug, Clone, Default)]
struct Cell {
    secs: Option<f64>,
    equal: Option<bool>,
    error: Option<String>,
    peak: Option<u64>,
    moved: Option<u64>,
}

type Results = BTreeMap<&'static str, BTreeMap<String, Cell>>;

fn spinner(msg: String) -> Result<ProgressBar> {
    let s = ProgressBar::new_spinner()
        .with_style(ProgressStyle::with_template("{spinner} {msg} [{elapsed}]")?);
    s.enable_steady_tick(Duration::from_millis(200));
    s.set_message(msg);
    Ok(s)
}

fn bar(len: usize, what: &str) -> Result<ProgressBar> {
    Ok(
        ProgressBar::new(len as u64).with_style(ProgressStyle::with_template(&format!(
            "{{bar:30}} {{pos}}/{{len}} {what}, {{msg}} [{{elapsed}}]"
        ))?),
    )
}

/// Our engine over `cluster` within `budget`: each query once as a warm-up (its
/// answer checked, its peak and bytes moved recorded), then `repeats` timed runs,
/// the median reported, as DuckDB's and Polars' are.
fn run_ours(
    cluster: &Cluster,
    set: &DataSet,
    queries: &[String],
    budget: u64,
    repeats: usize,
    what: &str,
) -> Result<BTreeMap<String, Cell>> {
    let s = spinner(format!("{what}: loading the tables"))?;
    let tables = load_tables(cluster, set, None)?;
    s.finish_and_clear();
    let env = cluster.env().with_budget(Budget::bytes(budget)?);
    let session = session(&env, &tables.open(cluster)?)?;
    let b = bar(queries.len(), what)?;
    let mut out = BTreeMap::new();
    for q in queries {
        b.set_message(q.clone());
        let mut runs = run_query_times(&session, set, q, 1 + repeats)?;
        // The warm-up's figures and the timed runs' median; a run that failed or
        // differed (the last) is what is reported.
        let mut secs: Vec<f64> = runs
            .iter()
            .skip(1)
            .filter(|r| r.error.is_none())
            .map(|r| r.secs)
            .collect();
        secs.sort_by(f64::total_cmp);
        let run = match runs.last().is_some_and(|r| r.error.is_some()) {
            true => runs.pop(),
            false => runs.into_iter().next(),
        }
        .context("a query ran no time")?;
        let median = secs.get(secs.len() / 2).copied().unwrap_or(run.secs);
        out.insert(
            q.clone(),
            Cell {
                secs: run.stats.map(|_| median),
                equal: Some(run.equal()),
                peak: run.stats.map(|s| s.peak_local_bytes),
                moved: run.stats.map(|_| run.bytes_moved()),
                error: run.error,
            },
        );
        b.inc(1);
    }
    b.finish_and_clear();
    drop(session);
    tables.free(cluster)?;
    Ok(out)
}

/// DataFusion on in-memory tables, with no pool limit or a spilling pool of `limit`.
fn run_datafusion(
    set: &DataSet,
    queries: &[String],
    limit: Option<u64>,
    timeout: Duration,
) -> Result<BTreeMap<String, Cell>> {
    let pool: Arc<dyn MemoryPool> = match limit {
        Some(b) => Arc::new(FairSpillPool::new(usize::try_from(b)?)),
        None => Arc::new(UnboundedMemoryPool::default()),
    };
    let runtime = RuntimeEnvBuilder::new()
        .with_memory_pool(pool)
        .build_arc()?;
    let ctx = SessionContext::new_with_config_rt(SessionConfig::new(), runtime);
    let s = spinner("DataFusion: loading the tables into memory".into())?;
    for table in set.manifest.tables.keys() {
        let batches = set.read_table(table, None)?;
        let schema = batches
            .first()
            .map(|b| b.schema())
            .context("a table without batches")?;
        ctx.register_table(
            table.as_str(),
            Arc::new(MemTable::try_new(schema, vec![batches])?),
        )?;
    }
    s.finish_and_clear();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let what = if limit.is_some() {
        "DataFusion, memory pool"
    } else {
        "DataFusion in memory"
    };
    let b = bar(queries.len(), what)?;
    let mut out = BTreeMap::new();
    for q in queries {
        b.set_message(q.clone());
        let sql = scad_tpcds::engine::query_sql(set, q)?;
        let (tx, rx) = std::sync::mpsc::channel();
        let c = ctx.clone();
        let start = Instant::now();
        let task = rt.spawn(async move {
            let r = async { c.sql(&sql).await?.collect().await }.await;
            let _ = tx.send(r);
        });
        let cell = match rx.recv_timeout(timeout) {
            Ok(Ok(batches)) => {
                let secs = start.elapsed().as_secs_f64();
                let reference = set.reference(q)?;
                // Compared as multisets: the row order is checked for ours only.
                let equal = match batches.first() {
                    None => reference.num_rows() == 0,
                    Some(first) => concat_batches(&first.schema(), &batches)
                        .ok()
                        .is_some_and(|answer| compare_values(&answer, &reference, false).is_ok()),
                };
                Cell {
                    secs: Some(secs),
                    equal: Some(equal),
                    ..Cell::default()
                }
            }
            Ok(Err(e)) => Cell {
                error: Some(e.to_string().lines().next().unwrap_or_default().to_string()),
                ..Cell::default()
            },
            Err(_) => {
                task.abort();
                Cell {
                    error: Some(format!("still running after {} s", timeout.as_secs())),
                    ..Cell::default()
                }
            }
        };
        out.insert(q.clone(), cell);
        b.inc(1);
    }
    b.finish_and_clear();
    Ok(out)
}

#[derive(Debug, Deserialize)]
struct PolarsTiming {
    query: String,
    #[serde(default)]
    query_s_median: Option<f64>,
    #[serde(default)]
    error: Option<String>,
}

fn run_polars(set: &DataSet, queries: &[String], repeats: usize) -> Result<BTreeMap<String, Cell>> {
    let s = spinner("Polars SQL in memory (Python)".into())?;
    let json = std::env::temp_dir().join(format!("tpcds-polars-{}.json", std::process::id()));
    let numbers: Vec<String> = queries.iter().map(|q| q[1..].to_string()).collect();
    let out = std::process::Command::new(repo_root().join(".venv").join("bin").join("python"))
        .arg(
            repo_root()
                .join("benches")
                .join("tpcds")
                .join("polars_sql.py"),
        )
        .arg("--data")
        .arg(&set.root)
        .args([
            "--queries",
            &numbers.join(","),
            "--repeats",
            &repeats.to_string(),
        ])
        .arg("--json")
        .arg(&json)
        .output()
        .context("running benches/tpcds/polars_sql.py")?;
    s.finish_and_clear();
    if !out.status.success() {
        bail!(
            "polars_sql.py failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let timings: Vec<PolarsTiming> = serde_json::from_str(&std::fs::read_to_string(&json)?)?;
    let _ = std::fs::remove_file(&json);
    Ok(timings
        .into_iter()
        .map(|t| {
            (
                t.query,
                Cell {
                    secs: t.query_s_median,
                    error: t.error,
                    ..Cell::default()
                },
            )
        })
        .collect())
}

fn run_duckdb(
    set: &DataSet,
    queries: &[String],
    repeats: usize,
    limit: Option<u64>,
) -> Result<BTreeMap<String, Cell>> {
    let limit = limit.map(|b| format!("{}KiB", b / 1024));
    let s = spinner(match &limit {
        None => "DuckDB in memory".to_string(),
        Some(l) => format!("DuckDB under memory_limit {l}"),
    })?;
    let timings = duckdb_timings(set, queries, repeats, limit.as_deref())?;
    s.finish_and_clear();
    Ok(timings
        .into_iter()
        .map(|t| {
            (
                t.query,
                Cell {
                    secs: t.query_s_median,
                    error: t.error,
                    ..Cell::default()
                },
            )
        })
        .collect())
}

fn ms(c: Option<&Cell>) -> String {
    match c {
        Some(Cell { secs: Some(s), .. }) => format!("{:.1}", s * 1e3),
        Some(Cell { error: Some(e), .. })
            if e.contains("Out of Memory") || e.contains("Resources exhausted") =>
        {
            "OOM".into()
        }
        Some(Cell { error: Some(e), .. }) if e.contains("still running") => "timeout".into(),
        Some(_) => "failed".into(),
        None => "-".into(),
    }
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let queries = if args.queries.is_empty() {
        official_queries()
    } else {
        parse_queries(&args.queries)?
    };
    let engines: Vec<&'static str> = if args.engines.is_empty() {
        ENGINES.to_vec()
    } else {
        args.engines
            .iter()
            .map(|e| {
                ENGINES
                    .iter()
                    .find(|k| **k == e.as_str())
                    .copied()
                    .with_context(|| {
                        format!("unknown engine {e:?} (known: {})", ENGINES.join(", "))
                    })
            })
            .collect::<Result<_>>()?
    };
    let s = spinner(format!("generating (or reusing) TPC-DS SF {}", args.sf))?;
    let set = generate(&GenerateOptions::new(args.sf))?;
    s.finish_and_clear();
    // A percentage is of the largest table in memory (its Arrow arrays' size).
    let largest = if args.budget.contains('%') {
        set.manifest
            .tables
            .keys()
            .map(|t| {
                Ok(set
                    .read_table(t, None)?
                    .iter()
                    .map(|b| b.get_array_memory_size() as u64)
                    .sum())
            })
            .collect::<Result<Vec<u64>>>()?
            .into_iter()
            .max()
            .unwrap_or(0)
    } else {
        0
    };
    let budget = parse_budget(&args.budget, largest)?;
    let element_size = (512u64 << 20).max((args.sf * (4u64 << 30) as f64) as u64);
    println!(
        "TPC-DS SF {} ({}), {} queries, budget {}",
        args.sf,
        set.root.display(),
        queries.len(),
        fmt_bytes(budget)
    );
    let timeout = Duration::from_secs(args.timeout_secs);
    let mut results: Results = BTreeMap::new();
    for &engine in &engines {
        let cells = match engine {
            "ours" => {
                let mut c = Cluster::embedded(TransportKind::Tcp, 2, element_size)?;
                c.set_chunk_rows(args.chunk_rows);
                run_ours(&c, &set, &queries, budget, args.repeats, "ours (tcp)")?
            }
            "redis" => {
                let server = RedisServer::start(&[])?;
                let mut c = Cluster::redis(
                    &server.addr().to_string(),
                    2,
                    element_size,
                    &format!("tpcds-bench-{}", std::process::id()),
                )?;
                c.set_chunk_rows(args.chunk_rows);
                run_ours(&c, &set, &queries, budget, args.repeats, "ours (Redis)")?
            }
            "duckdb" => run_duckdb(&set, &queries, args.repeats, None)?,
            "duckdb-limit" => run_duckdb(&set, &queries, args.repeats, Some(budget))?,
            "datafusion" => run_datafusion(&set, &queries, None, timeout)?,
            "datafusion-limit" => run_datafusion(&set, &queries, Some(budget), timeout)?,
            "polars" => run_polars(&set, &queries, args.repeats)?,
            _ => unreachable!("engines are checked above"),
        };
        let done = cells.values().filter(|c| c.secs.is_some()).count();
        println!("{engine}: {done} of {} queries finished", queries.len());
        results.insert(engine, cells);
    }
    // Engines and queries not run keep the results of the last run at this scale
    // and budget: a 24 GiB machine runs the engines in groups (`--engines`), and a
    // run of some queries (`--queries`) must not drop the others' results.
    for (engine, cells) in earlier_results(set.manifest.sf, budget)? {
        let kept = results.entry(engine).or_default();
        for (query, cell) in cells {
            kept.entry(query).or_insert(cell);
        }
    }
    write_results(&args, &set, &queries, budget, &results)
}

/// The results in `benches/results/tpcds.jsonl` at scale factor `sf` and budget
/// `budget`, by engine (none if the file is absent).
fn earlier_results(sf: f64, budget: u64) -> Result<Results> {
    let path = results_dir()?.join("tpcds.jsonl");
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Results::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let mut results = Results::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let row: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("a line of {}: {line}", path.display()))?;
        let same_run = row["sf"].as_f64() == Some(sf) && row["budget"].as_u64() == Some(budget);
        let engine = ENGINES.iter().find(|e| row["engine"].as_str() == Some(**e));
        let (Some(&engine), Some(query), true) = (engine, row["query"].as_str(), same_run) else {
            continue;
        };
        let cell = Cell {
            secs: row["secs"].as_f64(),
            equal: row["equal"].as_bool(),
            error: row["error"].as_str().map(str::to_owned),
            peak: row["peak_local_bytes"].as_u64(),
            moved: row["bytes_moved"].as_u64(),
        };
        results
            .entry(engine)
            .or_default()
            .insert(query.to_owned(), cell);
    }
    Ok(results)
}

fn write_results(
    args: &Args,
    set: &DataSet,
    queries: &[String],
    budget: u64,
    results: &Results,
) -> Result<()> {
    let dir = results_dir()?;
    let cell = |e: &str, q: &str| results.get(e).and_then(|m| m.get(q));
    let secs = |e: &str, q: &str| cell(e, q).and_then(|c| c.secs);
    // The times of the queries of this run an engine finished.
    let finished = |e: &str| -> Vec<f64> { queries.iter().filter_map(|q| secs(e, q)).collect() };

    let mut jsonl = std::fs::File::create(dir.join("tpcds.jsonl"))?;
    for (engine, cells) in results {
        for (q, c) in cells {
            writeln!(
                jsonl,
                "{}",
                json!({"engine": engine, "query": q, "sf": set.manifest.sf, "budget": budget,
                       "secs": c.secs, "equal": c.equal, "error": c.error,
                       "peak_local_bytes": c.peak, "bytes_moved": c.moved})
            )?;
        }
    }

    // Targets.
    // Totals over the queries both finished (a failed query has no time).
    let both: Vec<&String> = queries
        .iter()
        .filter(|q| secs("ours", q).is_some() && secs("duckdb", q).is_some())
        .collect();
    let ours_all: f64 = both.iter().filter_map(|q| secs("ours", q)).sum();
    let duck_all: f64 = both.iter().filter_map(|q| secs("duckdb", q)).sum();
    let equal = queries
        .iter()
        .filter(|q| cell("ours", q).and_then(|c| c.equal) == Some(true))
        .count();
    let limited: Vec<(&String, f64, f64)> = queries
        .iter()
        .filter_map(|q| Some((q, secs("ours", q)?, secs("duckdb-limit", q)?)))
        .collect();
    let slower_than_limited: Vec<String> = limited
        .iter()
        .filter(|(_, o, d)| o >= d)
        .map(|(q, o, d)| format!("{q} ({:.2}x)", o / d))
        .collect();
    let duck_limit_failed = queries
        .iter()
        .filter(|q| cell("duckdb-limit", q).is_some_and(|c| c.secs.is_none()))
        .count();
    let met = |ok: bool| if ok { "met" } else { "MISSED" };

    let mut md = String::new();
    writeln!(
        md,
        "TPC-DS SF {} — {} official queries, query time in ms (load apart). Ours: the query engine over 2 embedded tcp memory servers (loopback), local budget {} per query; \
         ours, DuckDB and Polars: median of {} runs after a warm-up; DataFusion: one run. DuckDB-limit: `memory_limit` = our budget, reading the Parquet files, spilling to disk; \
         DataFusion-limit: a fair spill pool of our budget, spilling to disk, cancelled after {} s. OOM: out of memory; `=`: our answer equals DuckDB's. Generated by `tpcds-bench`.\n",
        set.manifest.sf,
        queries.len(),
        fmt_bytes(budget),
        args.repeats,
        args.timeout_secs
    )?;
    writeln!(md, "| query | ours | DuckDB | ours / DuckDB | DuckDB-limit | DataFusion | DataFusion-limit | Polars SQL | ours on Redis | peak local | moved | = |")?;
    writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|")?;
    for q in queries {
        let ratio = match (secs("ours", q), secs("duckdb", q)) {
            (Some(o), Some(d)) if d > 0.0 => format!("{:.2}x", o / d),
            _ => "-".into(),
        };
        let c = cell("ours", q);
        writeln!(
            md,
            "| {q} | {} | {} | {ratio} | {} | {} | {} | {} | {} | {} | {} | {} |",
            ms(c),
            ms(cell("duckdb", q)),
            ms(cell("duckdb-limit", q)),
            ms(cell("datafusion", q)),
            ms(cell("datafusion-limit", q)),
            ms(cell("polars", q)),
            ms(cell("redis", q)),
            c.and_then(|c| c.peak).map_or("-".into(), fmt_bytes),
            c.and_then(|c| c.moved).map_or("-".into(), fmt_bytes),
            match c.and_then(|c| c.equal) {
                Some(true) => "yes",
                Some(false) => "NO",
                None => "-",
            }
        )?;
    }
    writeln!(
        md,
        "\n| engine | finished | total of finished, s |\n|---|---|---|"
    )?;
    for engine in results.keys() {
        let done = finished(engine);
        writeln!(
            md,
            "| {engine} | {} of {} | {} |",
            done.len(),
            queries.len(),
            if done.is_empty() {
                "-".to_string()
            } else {
                format!("{:.2}", done.iter().sum::<f64>())
            }
        )?;
    }
    writeln!(md, "\nTargets:")?;
    writeln!(
        md,
        "- all {} equal DuckDB's answers: {equal} equal — {}",
        queries.len(),
        met(equal == queries.len())
    )?;
    if !both.is_empty() && duck_all > 0.0 {
        writeln!(
            md,
            "- total ≤ 1.5x DuckDB in memory (the {} queries both finished): {:.2} s vs {:.2} s = {:.2}x — {}",
            both.len(),
            ours_all,
            duck_all,
            ours_all / duck_all,
            met(both.len() == queries.len() && ours_all <= 1.5 * duck_all)
        )?;
    }
    if results.contains_key("duckdb-limit") {
        writeln!(
            md,
            "- faster than DuckDB under the same memory limit wherever it finishes ({} of {} finished, {duck_limit_failed} did not): slower on {} — {}",
            limited.len(),
            queries.len(),
            if slower_than_limited.is_empty() { "none".to_string() } else { slower_than_limited.join(", ") },
            met(slower_than_limited.is_empty())
        )?;
    }
    for q in ["q1", "q16", "q94", "q95"] {
        if !queries.iter().any(|r| r == q) {
            continue;
        }
        if let (Some(o), Some(d)) = (secs("ours", q), secs("duckdb", q)) {
            writeln!(
                md,
                "- {q} ≤ 1.5x DuckDB in memory: {:.2}x — {}",
                o / d,
                met(o <= 1.5 * d)
            )?;
        }
    }
    std::fs::write(dir.join("tpcds.md"), &md)?;
    println!("\n{md}");

    let mut bars = Vec::new();
    for engine in results.keys() {
        let done = finished(engine);
        bars.push(Bar {
            group: engine.to_string(),
            label: format!("{engine}: {} of {} queries", done.len(), queries.len()),
            value: done.iter().sum::<f64>(),
        });
    }
    horizontal_bars(
        &dir.join("tpcds.png"),
        &format!(
            "TPC-DS SF {}: total query time of the queries each engine finished",
            set.manifest.sf
        ),
        "seconds",
        &bars,
    )?;
    println!("wrote {}", dir.join("tpcds.md").display());
    Ok(())
}
