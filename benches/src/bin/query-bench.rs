//! Query-engine operator benchmark: each operator (hash join, full outer join,
//! external sort, window, union, group-by) as SQL over RemoteFrames in tcp memory
//! servers, at local budgets of 100 %, 25 % and 5 % of its input and unlimited,
//! against Polars in memory on the same data, measured in the same run.
//!
//! ```text
//! cargo run --release -p scad-benches --features polars-baselines --bin query-bench [-- --rows 2000000]
//! ```
//! Writes `benches/results/query.{jsonl,md,png}`. Target (BENCHMARKS.md): an
//! operator at 25 % of its input within 1.5x of the same operator unlimited.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use polars::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use scad_benches::{horizontal_bars, Bar};
use scad_core::server::{MemoryServer, ServerConfig};
use scad_core::transport::{TcpOptions, TcpTransport};
use scad_remote_array::MemoryElements;
use scad_remote_frame::{Budget, FrameEnv, QuerySession, QueryStats, RemoteFrame};
use serde_json::json;

/// mimalloc, as the main job's binaries use: glibc's malloc consolidated its free
/// lists on the in-process memory servers' threads at every spill block they took
/// (a fifth of the group-by at 25 % on those threads).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(about = "Query-engine operators at 100/25/5 % budgets against Polars in memory")]
struct Args {
    /// Rows of the fact table (the dimension table has a quarter as many).
    #[arg(long, default_value_t = 2_000_000)]
    rows: usize,
    /// Repetitions (median reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Output directory (default: benches/results).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Run only these operators (comma-separated names, e.g. `hash join,group-by`);
    /// results then go to the output directory as usual, so point `--out` elsewhere.
    #[arg(long, value_delimiter = ',')]
    operators: Vec<String>,
    /// Run only these budget variants (comma-separated: `unlimited`, `100`, `25`, `5`).
    #[arg(long, value_delimiter = ',')]
    budgets: Vec<String>,
    /// Print the per-operator profile (`explain_analyze`) of every repetition.
    #[arg(long)]
    analyze: bool,
}

/// One operator: its SQL, the Polars query computing the same, and which tables it
/// reads (for the budget's base).
struct Operator {
    name: &'static str,
    sql: &'static str,
    polars: fn(&DataFrame, &DataFrame) -> PolarsResult<DataFrame>,
    inputs: &'static [&'static str],
}

fn operators() -> Vec<Operator> {
    vec![
        Operator {
            name: "hash join",
            sql: "SELECT f.k, f.v, d.w FROM fact f JOIN dim d ON f.k = d.k",
            polars: |f, d| {
                f.clone()
                    .lazy()
                    .join(
                        d.clone().lazy(),
                        [col("k")],
                        [col("k")],
                        JoinArgs::new(JoinType::Inner),
                    )
                    .select([col("k"), col("v"), col("w")])
                    .collect()
            },
            inputs: &["fact", "dim"],
        },
        Operator {
            name: "full outer join",
            sql: "SELECT f.v, d.w FROM fact f FULL JOIN dim d ON f.k = d.k",
            polars: |f, d| {
                f.clone()
                    .lazy()
                    .join(
                        d.clone().lazy(),
                        [col("k")],
                        [col("k")],
                        JoinArgs::new(JoinType::Full),
                    )
                    .select([col("v"), col("w")])
                    .collect()
            },
            inputs: &["fact", "dim"],
        },
        Operator {
            name: "external sort",
            sql: "SELECT k, v, s FROM fact ORDER BY v, k",
            polars: |f, _| {
                f.clone()
                    .lazy()
                    .sort(
                        ["v", "k"],
                        SortMultipleOptions::default().with_nulls_last(true),
                    )
                    .collect()
            },
            inputs: &["fact"],
        },
        Operator {
            name: "window",
            sql: "SELECT k, v, sum(v) OVER (PARTITION BY k) AS total FROM fact",
            polars: |f, _| {
                f.clone()
                    .lazy()
                    .select([
                        col("k"),
                        col("v"),
                        col("v").sum().over([col("k")])?.alias("total"),
                    ])
                    .collect()
            },
            inputs: &["fact"],
        },
        Operator {
            name: "union",
            sql: "SELECT k FROM fact UNION SELECT k FROM dim",
            polars: |f, d| {
                concat(
                    [
                        f.clone().lazy().select([col("k")]),
                        d.clone().lazy().select([col("k")]),
                    ],
                    UnionArgs::default(),
                )?
                .unique(None, UniqueKeepStrategy::Any)
                .collect()
            },
            inputs: &["fact", "dim"],
        },
        Operator {
            name: "group-by",
            sql: "SELECT k, count(*) AS n, sum(v) AS total FROM fact GROUP BY k",
            polars: |f, _| {
                f.clone()
                    .lazy()
                    .group_by([col("k")])
                    .agg([len().alias("n"), col("v").sum().alias("total")])
                    .collect()
            },
            inputs: &["fact"],
        },
    ]
}

fn tables(rows: usize) -> Result<(DataFrame, DataFrame)> {
    let mut rng = StdRng::seed_from_u64(7);
    let keys = (rows / 4).max(1) as i64;
    let k: Vec<i64> = (0..rows).map(|_| rng.gen_range(0..keys)).collect();
    let v: Vec<i64> = (0..rows).map(|_| rng.gen_range(0..1_000_000)).collect();
    let s: Vec<String> = (0..rows).map(|i| format!("row {}", i % 1000)).collect();
    let fact = df!("k" => k, "v" => v, "s" => s)?;
    let dk: Vec<i64> = (0..keys).collect();
    let w: Vec<i64> = (0..keys).map(|_| rng.gen_range(0..1000)).collect();
    let dim = df!("k" => dk, "w" => w)?;
    Ok((fact, dim))
}

struct Measured {
    operator: &'static str,
    variant: String,
    secs: Option<f64>,
    stats: Option<QueryStats>,
    error: Option<String>,
    rows: usize,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<()> {
    let args = Args::parse();
    let out_dir = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("results"));
    std::fs::create_dir_all(&out_dir)?;
    let elements = Arc::new(MemoryElements::new());
    let mut servers = Vec::new();
    for k in 0..2 {
        let s = MemoryServer::start("127.0.0.1:0", 4 << 30, ServerConfig::default())?;
        let t = TcpTransport::connect(&s.local_addr().to_string(), TcpOptions::default())?;
        elements.add(&format!("mem{k}"), Arc::new(t))?;
        servers.push(s);
    }
    let env = FrameEnv::new(elements).with_chunk_rows(64 * 1024);
    let (fact, dim) = tables(args.rows)?;
    let frames = [
        ("fact", RemoteFrame::from_polars(&env, &fact)?),
        ("dim", RemoteFrame::from_polars(&env, &dim)?),
    ];
    let ops: Vec<Operator> = operators()
        .into_iter()
        .filter(|op| args.operators.is_empty() || args.operators.iter().any(|n| n == op.name))
        .collect();
    if ops.is_empty() {
        anyhow::bail!("no operator matches {:?}", args.operators);
    }
    let bar = ProgressBar::new((ops.len() * 5) as u64)
        .with_style(ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}")?);
    let mut results = Vec::new();
    for op in &ops {
        bar.set_message(op.name);
        let input: u64 = frames
            .iter()
            .filter(|(n, _)| op.inputs.contains(n))
            .map(|(_, f)| f.data_bytes())
            .sum();
        let mut times = Vec::new();
        let mut rows = 0;
        for _ in 0..args.reps {
            let t = Instant::now();
            rows = (op.polars)(&fact, &dim)?.height();
            times.push(t.elapsed().as_secs_f64());
        }
        results.push(Measured {
            operator: op.name,
            variant: "polars in memory".into(),
            secs: Some(median(times)),
            stats: None,
            error: None,
            rows,
        });
        bar.inc(1);
        for (variant, budget) in [
            ("unlimited".to_string(), None),
            ("100 %".to_string(), Some(input)),
            ("25 %".to_string(), Some(input / 4)),
            ("5 %".to_string(), Some(input / 20)),
        ] {
            let label = variant.trim_end_matches(" %");
            if !args.budgets.is_empty() && !args.budgets.iter().any(|b| b == label) {
                continue;
            }
            let e = env.with_budget(Budget::from_limit(budget)?);
            let session = QuerySession::new(&e)?;
            for (n, f) in &frames {
                session.register(n, f)?;
            }
            let mut times = Vec::new();
            let mut last = None;
            let mut error = None;
            for _ in 0..args.reps {
                let t = Instant::now();
                match session.sql(op.sql) {
                    Ok(out) => {
                        times.push(t.elapsed().as_secs_f64());
                        last = Some((*out.stats(), out.rows()));
                        if args.analyze {
                            let profile = out.explain_analyze();
                            bar.suspend(|| eprintln!("{} at {variant}:\n{profile}", op.name));
                        }
                    }
                    Err(err) => {
                        let text = err.to_string();
                        let first = text.lines().next().unwrap_or("");
                        error = Some(
                            first
                                .split(" with top memory consumers")
                                .next()
                                .unwrap_or(first)
                                .to_owned(),
                        );
                        break;
                    }
                }
            }
            let (stats, rows) = match last {
                Some((s, r)) if error.is_none() => (Some(s), r),
                _ => (None, 0),
            };
            results.push(Measured {
                operator: op.name,
                variant,
                secs: (error.is_none() && !times.is_empty()).then(|| median(times)),
                stats,
                error,
                rows,
            });
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    write_results(&out_dir, &results, args.rows, args.reps)?;
    drop(servers);
    Ok(())
}

fn mib(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}

fn write_results(dir: &std::path::Path, rows: &[Measured], n: usize, reps: usize) -> Result<()> {
    let mut jsonl = std::fs::File::create(dir.join("query.jsonl"))?;
    let mut md = String::new();
    md.push_str("# Query-engine operators\n\n");
    md.push_str(&format!(
        "`cargo run --release -p scad-benches --features polars-baselines --bin query-bench -- --rows {n}` — SQL over RemoteFrames in 2 in-process tcp memory servers; budgets are fractions of the operator's input bytes; medians of {reps} runs; Polars in memory on the same data measured in the same run. Peak local is the memory pool's peak reservation; moved = bytes scanned + spilled + read back.\n\n"
    ));
    md.push_str("| operator | variant | median s | rows | vs Polars | vs unlimited | target (25 % ≤ 1.5x unlimited) | peak local MiB | budget MiB | moved MiB | spill files |\n|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|\n");
    let mut bars = Vec::new();
    for r in rows {
        let polars = rows
            .iter()
            .find(|p| p.operator == r.operator && p.variant == "polars in memory")
            .and_then(|p| p.secs);
        let unlimited = rows
            .iter()
            .find(|p| p.operator == r.operator && p.variant == "unlimited")
            .and_then(|p| p.secs);
        let vs = |base: Option<f64>| match (r.secs, base) {
            (Some(s), Some(b)) if b > 0.0 => format!("{:.2}x", s / b),
            _ => String::new(),
        };
        let target = if r.variant == "25 %" {
            match (r.secs, unlimited) {
                (Some(s), Some(u)) if s <= 1.5 * u => "MET".to_string(),
                (Some(s), Some(u)) => format!("MISSED ({:.2}x)", s / u),
                _ => "MISSED (failed)".to_string(),
            }
        } else {
            String::new()
        };
        let secs = match (&r.secs, &r.error) {
            (Some(s), _) => format!("{s:.3}"),
            (None, Some(e)) => format!("failed: {e}"),
            _ => String::new(),
        };
        let (peak, budget, moved, spills) = match &r.stats {
            Some(s) => (
                format!("{:.1}", mib(s.peak_local_bytes)),
                match s.budget.limit() {
                    None => "∞".into(),
                    Some(b) => format!("{:.1}", mib(b)),
                },
                format!("{:.1}", mib(s.bytes_moved())),
                s.spill_files.to_string(),
            ),
            None => Default::default(),
        };
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.operator,
            r.variant,
            secs,
            r.rows,
            vs(polars),
            vs(unlimited),
            target,
            peak,
            budget,
            moved,
            spills
        ));
        let record = json!({
            "operator": r.operator, "variant": r.variant, "secs": r.secs, "rows": r.rows,
            "error": r.error, "peak_local_bytes": r.stats.map(|s| s.peak_local_bytes),
            "budget": r.stats.map(|s| s.budget.limit()), "bytes_moved": r.stats.map(|s| s.bytes_moved()),
            "spill_files": r.stats.map(|s| s.spill_files), "polars_secs": polars,
            "unlimited_secs": unlimited, "fact_rows": n,
        });
        writeln!(jsonl, "{record}")?;
        if let Some(s) = r.secs {
            bars.push(Bar {
                group: r.variant.clone(),
                label: format!("{} — {}", r.operator, r.variant),
                value: s,
            });
        }
    }
    std::fs::write(dir.join("query.md"), &md)?;
    print!("{md}");
    if !bars.is_empty() {
        horizontal_bars(
            &dir.join("query.png"),
            "Query-engine operators vs Polars in memory",
            "seconds (median)",
            &bars,
        )?;
    }
    Ok(())
}
