//! The TPC-DS benchmark: queries 1, 16, 94 and 95 at SF 1 as pipelines over tcp memory
//! servers with a local memory budget of 25% of the largest input, against DuckDB in
//! memory, the same queries' Polars pipelines in memory, and the same pipelines with
//! Redis as the intermediate store — all on the same data in the same run, query time
//! only (loading is timed apart). Every result is checked against DuckDB's reference.
//! Writes `benches/results/tpcds.{jsonl,md,png}`.
//!
//! ```text
//! cargo run --release -p scad-tpcds --bin tpcds-bench -- --sf 1
//! ```

use std::fmt::Write as _;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use scad_benches::{horizontal_bars, results_dir, Bar};
use scad_tpcds::compare::compare;
use scad_tpcds::data::{generate, DataSet, GenerateOptions};
use scad_tpcds::queries::{pipeline_for, OFFICIAL};
use scad_tpcds::remote::{
    duckdb_timings, fmt_bytes, load_tables, parse_budget, tables_for, Cluster, RedisServer,
    RemotePipeline, TableHandoffs, TransportKind,
};
use serde_json::json;

/// Command-line options.
#[derive(Debug, Parser)]
#[command(about = "TPC-DS pipelines over memory elements vs DuckDB, Polars and Redis")]
struct Args {
    /// Scale factor.
    #[arg(long, default_value_t = 1.0)]
    sf: f64,
    /// Timed runs per query and engine (after one untimed warm-up run).
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Local memory budget of the pipelines: bytes or % of the largest input.
    #[arg(long, default_value = "25%")]
    budget: String,
    /// Memory elements (memory servers / Redis key spaces).
    #[arg(long, default_value_t = 2)]
    elements: usize,
    /// Queries.
    #[arg(long, value_delimiter = ',', default_values_t = OFFICIAL.map(String::from))]
    queries: Vec<String>,
    /// Skip the Redis runs.
    #[arg(long)]
    no_redis: bool,
    /// Rows per stored chunk of every frame (kernels stream whole chunks, so chunks must
    /// be small next to the budget).
    #[arg(long, default_value_t = 32768)]
    chunk_rows: usize,
}

#[derive(Debug, Clone)]
struct Measure {
    engine: &'static str,
    query: String,
    median: f64,
    min: f64,
    max: f64,
    load_s: f64,
    peak_local: Option<u64>,
    moved: Option<u64>,
    ok: bool,
}

fn stats(mut xs: Vec<f64>) -> (f64, f64, f64) {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    let med = if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    };
    (med, xs[0], xs[n - 1])
}

fn run_ours(
    engine: &'static str,
    cluster: &Cluster,
    tables: &TableHandoffs,
    set: &DataSet,
    args: &Args,
    budget: u64,
    bar: &ProgressBar,
) -> Result<Vec<Measure>> {
    let mut out = Vec::new();
    for q in &args.queries {
        bar.set_message(format!("{engine} {q}"));
        let p = RemotePipeline::for_query(q)?;
        let reference = set.reference(q)?;
        let mut times = Vec::new();
        let mut peak = 0;
        let mut moved = 0;
        let mut ok = true;
        for i in 0..=args.repeats {
            let run = p
                .run(cluster, tables, budget)
                .with_context(|| format!("{engine} {q}"))?;
            if let Err(e) = compare(&run.result, &reference, p.row_order()) {
                eprintln!("{engine} {q}: {e}");
                ok = false;
            }
            peak = peak.max(run.peak_local_bytes());
            moved = run.bytes_moved();
            if i > 0 {
                times.push(run.secs);
            }
            bar.inc(1);
        }
        let (median, min, max) = stats(times);
        out.push(Measure {
            engine,
            query: q.clone(),
            median,
            min,
            max,
            load_s: tables.load_secs,
            peak_local: Some(peak),
            moved: Some(moved),
            ok,
        });
    }
    Ok(out)
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    if args.repeats == 0 {
        bail!("--repeats must be at least 1");
    }
    eprintln!("generating (or reusing) SF {} data ...", args.sf);
    let set = generate(&GenerateOptions::new(args.sf)).context("generating TPC-DS data")?;
    let engines = if args.no_redis { 2 } else { 3 };
    let bar = ProgressBar::new((args.queries.len() * (args.repeats + 1) * engines) as u64)
        .with_style(ProgressStyle::with_template(
            "{bar:40} {pos}/{len} {msg} [{elapsed}]",
        )?);
    let mut all: Vec<Measure> = Vec::new();

    // Polars in memory: the same steps as DataFrame functions.
    for q in &args.queries {
        bar.set_message(format!("polars {q}"));
        let p = pipeline_for(q)?;
        let t0 = Instant::now();
        let tables = set.load(&p.table_columns())?;
        let load_s = t0.elapsed().as_secs_f64();
        let reference = set.reference(q)?;
        let mut times = Vec::new();
        let mut ok = true;
        for i in 0..=args.repeats {
            let run = p.run(&tables)?;
            if compare(&run.result, &reference, p.row_order).is_err() {
                ok = false;
            }
            if i > 0 {
                times.push(run.elapsed.as_secs_f64());
            }
            bar.inc(1);
        }
        let (median, min, max) = stats(times);
        all.push(Measure {
            engine: "polars_in_memory",
            query: q.clone(),
            median,
            min,
            max,
            load_s,
            peak_local: None,
            moved: None,
            ok,
        });
    }

    // Ours over embedded tcp memory servers.
    let size = (1u64 << 30).max((args.sf * (3u64 << 30) as f64) as u64);
    let table_cols = tables_for(&args.queries)?;
    let budget;
    {
        let mut cluster = Cluster::embedded(TransportKind::Tcp, args.elements, size)?;
        cluster.set_chunk_rows(args.chunk_rows);
        let tables = load_tables(&cluster, &set, &table_cols)?;
        budget = parse_budget(&args.budget, tables.largest_bytes())?;
        eprintln!(
            "tcp: loaded in {:.2} s; largest input {}; budget {}",
            tables.load_secs,
            fmt_bytes(tables.largest_bytes()),
            fmt_bytes(budget)
        );
        all.extend(run_ours(
            "ours_tcp", &cluster, &tables, &set, &args, budget, &bar,
        )?);
    }
    // The same pipelines with Redis as the intermediate store.
    if !args.no_redis {
        let redis = RedisServer::start()?;
        let mut cluster = Cluster::redis(redis.addr(), args.elements, size, "tpcds-bench")?;
        cluster.set_chunk_rows(args.chunk_rows);
        let tables = load_tables(&cluster, &set, &table_cols)?;
        eprintln!("redis: loaded in {:.2} s", tables.load_secs);
        all.extend(run_ours(
            "ours_redis",
            &cluster,
            &tables,
            &set,
            &args,
            budget,
            &bar,
        )?);
    }
    bar.finish_and_clear();

    eprintln!("timing DuckDB in memory (gen_data.py --bench) ...");
    for d in duckdb_timings(args.sf, args.repeats.max(5))? {
        if args.queries.contains(&d.query) {
            all.push(Measure {
                engine: "duckdb_in_memory",
                query: d.query.clone(),
                median: d.query_s_median,
                min: d.query_s_min,
                max: d.query_s_max,
                load_s: d.load_s,
                peak_local: None,
                moved: None,
                ok: true,
            });
        }
    }

    let dir = results_dir()?;
    let mut jsonl = String::new();
    for m in &all {
        writeln!(
            jsonl,
            "{}",
            json!({
                "bench": "tpcds", "engine": m.engine, "query": m.query, "sf": args.sf,
                "query_s_median": m.median, "query_s_min": m.min, "query_s_max": m.max,
                "repeats": args.repeats, "load_s": m.load_s, "budget_bytes": budget,
                "peak_local_bytes": m.peak_local, "bytes_moved": m.moved, "equals_duckdb": m.ok,
                "elements": args.elements,
            })
        )?;
    }
    std::fs::write(dir.join("tpcds.jsonl"), &jsonl)?;

    let get = |e: &str, q: &str| all.iter().find(|m| m.engine == e && m.query == q);
    let ms = |m: Option<&Measure>| {
        m.map_or("-".to_string(), |m| {
            format!(
                "{:.1} ({:.1}–{:.1})",
                m.median * 1e3,
                m.min * 1e3,
                m.max * 1e3
            )
        })
    };
    let mut md = String::new();
    writeln!(md, "TPC-DS SF {} — query time in ms, median of {} runs (min–max); load apart. Ours: {} tcp memory servers (embedded, loopback), local budget {} (= {} of the largest input) per step. DuckDB timed by `gen_data.py --bench` in this run.\n", args.sf, args.repeats, args.elements, fmt_bytes(budget), args.budget)?;
    writeln!(md, "| query | DuckDB in memory | Polars in memory | ours, tcp | ours, Redis store | ours / DuckDB (target ≤ 1.5) | ours / Polars (target < 1) | ours / Redis (target < 1) | peak local / budget | moved | = DuckDB |")?;
    writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|")?;
    let mut bars = Vec::new();
    let mut verdicts = Vec::new();
    for q in &args.queries {
        let (d, p, t, r) = (
            get("duckdb_in_memory", q),
            get("polars_in_memory", q),
            get("ours_tcp", q),
            get("ours_redis", q),
        );
        let ratio = |base: Option<&Measure>| match (t, base) {
            (Some(t), Some(b)) if b.median > 0.0 => Some(t.median / b.median),
            _ => None,
        };
        let fmt_ratio = |x: Option<f64>, target: f64, strict: bool| match x {
            Some(x) => {
                let met = if strict { x < target } else { x <= target };
                format!("{x:.2}x {}", if met { "met" } else { "MISSED" })
            }
            None => "-".into(),
        };
        let (rd, rp, rr) = (ratio(d), ratio(p), ratio(r));
        writeln!(
            md,
            "| {q} | {} | {} | {} | {} | {} | {} | {} | {} / {} | {} | {} |",
            ms(d),
            ms(p),
            ms(t),
            ms(r),
            fmt_ratio(rd, 1.5, false),
            fmt_ratio(rp, 1.0, true),
            fmt_ratio(rr, 1.0, true),
            t.and_then(|t| t.peak_local).map_or("-".into(), fmt_bytes),
            fmt_bytes(budget),
            t.and_then(|t| t.moved).map_or("-".into(), fmt_bytes),
            if t.is_some_and(|t| t.ok) && r.is_none_or(|r| r.ok) && p.is_some_and(|p| p.ok) {
                "yes"
            } else {
                "NO"
            },
        )?;
        verdicts.push(format!(
            "{q}: ours/DuckDB {} (≤ 1.5x), ours/Polars {} (< 1x), ours/Redis {} (< 1x)",
            fmt_ratio(rd, 1.5, false),
            fmt_ratio(rp, 1.0, true),
            fmt_ratio(rr, 1.0, true)
        ));
        for (m, label) in [
            (d, "DuckDB in memory"),
            (p, "Polars in memory"),
            (t, "ours, tcp"),
            (r, "ours, Redis store"),
        ] {
            if let Some(m) = m {
                bars.push(Bar {
                    group: label.to_string(),
                    label: format!("{q} {label}"),
                    value: m.median * 1e3,
                });
            }
        }
    }
    std::fs::write(dir.join("tpcds.md"), &md)?;
    horizontal_bars(
        &dir.join("tpcds.png"),
        &format!(
            "TPC-DS SF {} query time (median, ms; lower is better)",
            args.sf
        ),
        "milliseconds",
        &bars,
    )?;
    println!("{md}");
    for v in verdicts {
        println!("{v}");
    }
    println!("wrote {}/tpcds.{{jsonl,md,png}}", dir.display());
    if all.iter().any(|m| !m.ok) {
        bail!("some result differs from DuckDB's reference");
    }
    Ok(())
}
