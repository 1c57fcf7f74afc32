//! Times the TPC-DS baselines on one data set: DuckDB in memory (via
//! `tpcds/gen_data.py --bench`) and this crate's pipelines on Polars in memory, per
//! query, query time apart from load time; checks every Polars result against DuckDB's
//! reference answer. Writes `benches/results/tpcds_baselines.{jsonl,md}`.
//!
//! ```text
//! cargo run --release -p scad-tpcds --bin tpcds-baselines -- --sf 1 --repeats 5
//! ```

use std::fs;
use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use scad_tpcds::compare::compare;
use scad_tpcds::data::{generate, repo_root, GenerateOptions};
use scad_tpcds::queries::{pipeline_for, OFFICIAL};
use serde::Deserialize;
use serde_json::json;

/// Command-line options.
#[derive(Debug, Parser)]
#[command(about = "TPC-DS q1/q16/q94/q95: DuckDB in memory vs the Polars pipelines in memory")]
struct Args {
    /// Scale factor.
    #[arg(long, default_value_t = 1.0)]
    sf: f64,
    /// Timed runs per query (after one untimed warm-up run).
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    /// Directory for the results.
    #[arg(long, default_value = "benches/results")]
    out: PathBuf,
}

/// One DuckDB measurement as printed by gen_data.py --bench-json.
#[derive(Debug, Deserialize)]
struct DuckDbResult {
    query: String,
    load_s: f64,
    query_s_median: f64,
    query_s_min: f64,
    query_s_max: f64,
    rows: u64,
    threads: u64,
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

fn main() -> Result<()> {
    tracing_subscriber_init();
    let args = Args::parse();
    if args.repeats == 0 {
        bail!("--repeats must be at least 1");
    }
    let root = repo_root();
    let out_dir = if args.out.is_absolute() {
        args.out.clone()
    } else {
        root.join(&args.out)
    };
    fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;

    eprintln!("generating (or reusing) SF {} data ...", args.sf);
    let set = generate(&GenerateOptions::new(args.sf)).context("generating TPC-DS data")?;

    eprintln!("timing DuckDB in memory ...");
    let duck_json = out_dir.join("tpcds_duckdb.json.tmp");
    let status = Command::new(root.join(".venv/bin/python"))
        .arg(root.join("tpcds/gen_data.py"))
        .args(["--sf", &args.sf.to_string(), "--no-text", "--bench"])
        .args(["--repeats", &args.repeats.to_string()])
        .arg("--out")
        .arg(root.join("data/tpcds"))
        .arg("--bench-json")
        .arg(&duck_json)
        .status()
        .context("running gen_data.py --bench")?;
    if !status.success() {
        bail!("gen_data.py --bench failed: {status}");
    }
    let duck: Vec<DuckDbResult> = serde_json::from_str(
        &fs::read_to_string(&duck_json)
            .with_context(|| format!("reading {}", duck_json.display()))?,
    )?;
    let _ = fs::remove_file(&duck_json);

    let bar = ProgressBar::new((OFFICIAL.len() * (args.repeats + 1)) as u64);
    bar.set_style(
        ProgressStyle::with_template("polars in memory {bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut lines = Vec::new();
    let mut table = Vec::new();
    for query in OFFICIAL {
        bar.set_message(query);
        let pipeline = pipeline_for(query)?;
        let load_start = Instant::now();
        let tables = set.load(&pipeline.table_columns())?;
        let load_s = load_start.elapsed().as_secs_f64();
        let mut times = Vec::with_capacity(args.repeats);
        let mut last = None;
        for i in 0..=args.repeats {
            let run = pipeline.run(&tables)?;
            bar.inc(1);
            if i > 0 {
                times.push(run.elapsed.as_secs_f64());
            }
            last = Some(run);
        }
        let run = last.context("no run")?;
        let reference = set.reference(query)?;
        let equal = compare(&run.result, &reference, pipeline.row_order);
        if let Err(e) = &equal {
            eprintln!("{query}: result differs from DuckDB: {e}");
        }
        let steps: Vec<_> = run
            .steps
            .iter()
            .map(|s| json!({"step": s.name, "s": s.elapsed.as_secs_f64(), "rows": s.rows, "bytes": s.bytes}))
            .collect();
        let polars_median = median(times.clone());
        let d = duck
            .iter()
            .find(|d| d.query == query)
            .with_context(|| format!("no DuckDB timing for {query}"))?;
        lines.push(json!({
            "bench": "tpcds_baselines", "engine": "duckdb_in_memory", "query": query, "sf": args.sf,
            "load_s": d.load_s, "query_s_median": d.query_s_median, "query_s_min": d.query_s_min,
            "query_s_max": d.query_s_max, "rows": d.rows, "threads": d.threads,
            "repeats": args.repeats,
        }));
        lines.push(json!({
            "bench": "tpcds_baselines", "engine": "polars_in_memory", "query": query, "sf": args.sf,
            "load_s": load_s, "query_s_median": polars_median,
            "query_s_min": times.iter().copied().fold(f64::INFINITY, f64::min),
            "query_s_max": times.iter().copied().fold(0.0, f64::max),
            "query_s_all": times, "rows": run.result.height(), "equals_duckdb": equal.is_ok(),
            "table_bytes": tables.estimated_bytes(), "steps_last_run": steps,
            "repeats": args.repeats, "threads": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        }));
        table.push((
            query,
            d.load_s,
            d.query_s_median,
            load_s,
            polars_median,
            equal.is_ok(),
            d.query_s_min,
            d.query_s_max,
            times,
        ));
    }
    bar.finish_and_clear();

    let jsonl = out_dir.join("tpcds_baselines.jsonl");
    let mut f = fs::File::create(&jsonl)?;
    for line in &lines {
        writeln!(f, "{line}")?;
    }
    let ms = |s: f64| format!("{:.1}", s * 1e3);
    let mut md = format!(
        "# TPC-DS baselines, SF {} (in memory, query time only; load apart)\n\n\
         Median of {} runs after a warm-up; min–max in brackets. DuckDB {} threads; Polars pipelines \
         (scad-tpcds steps, {} build). `equal` = the Polars result equals DuckDB's reference answer.\n\n\
         | query | DuckDB load (s) | DuckDB query (ms) | Polars load (s) | Polars query (ms) | Polars / DuckDB | equal |\n\
         |---|---:|---:|---:|---:|---:|---|\n",
        args.sf,
        args.repeats,
        duck.first().map(|d| d.threads).unwrap_or(0),
        if cfg!(debug_assertions) {
            "DEBUG (timings not meaningful)"
        } else {
            "release"
        },
    );
    for (query, dl, dq, pl, pq, eq, dmin, dmax, times) in &table {
        let pmin = times.iter().copied().fold(f64::INFINITY, f64::min);
        let pmax = times.iter().copied().fold(0.0, f64::max);
        md.push_str(&format!(
            "| {query} | {dl:.2} | {} [{}–{}] | {pl:.2} | {} [{}–{}] | {:.2}× | {} |\n",
            ms(*dq),
            ms(*dmin),
            ms(*dmax),
            ms(*pq),
            ms(pmin),
            ms(pmax),
            pq / dq,
            if *eq { "yes" } else { "NO" }
        ));
    }
    md.push_str(
        "\nDuckDB loads the tables from Parquet into in-memory tables; the Polars load reads only \
         the columns the pipeline uses. Regenerate: `cargo run --release -p scad-tpcds --bin \
         tpcds-baselines -- --sf 1`.\n",
    );
    fs::write(out_dir.join("tpcds_baselines.md"), &md)?;
    print!("{md}");
    if table.iter().any(|t| !t.5) {
        bail!("some Polars results differ from DuckDB's");
    }
    Ok(())
}

fn tracing_subscriber_init() {
    // Logs go to stderr when RUST_LOG is set; the bench itself prints a table.
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
    }
}
