//! RemoteFrame verb benchmark (the verbs run on the query engine): a join of N x N rows
//! through tcp memory servers at local budgets of 100%, 25% and 5% of the build side,
//! and a group-by of N rows, each against Polars in memory with unlimited memory,
//! measured in the same run.
//!
//! ```text
//! cargo run --release -p scad-benches --features polars-baselines --bin frame-bench [-- --rows 10000000]
//! ```
//! Writes `benches/results/frame.{jsonl,md,png}` (relative to the workspace root).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use plotters::prelude::*;
use polars::prelude::*;
use scad_core::server::{MemoryServer, ServerConfig};
use scad_core::transport::{TcpOptions, TcpTransport};
use scad_remote_array::MemoryElements;
use scad_remote_frame::query::expr as fx;
use scad_remote_frame::{Budget, FrameEnv, JoinType, KernelStats, RemoteFrame};
use serde_json::json;

#[derive(Parser)]
#[command(about = "RemoteFrame join and group-by against Polars in memory")]
struct Args {
    /// Rows of each join side and of the group-by input.
    #[arg(long, default_value_t = 10_000_000)]
    rows: usize,
    /// Repetitions of the baselines and of the 25% join (median reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Memory servers (in-process, over loopback tcp).
    #[arg(long, default_value_t = 2)]
    servers: usize,
    /// Output directory.
    #[arg(long)]
    out: Option<PathBuf>,
}

struct Row {
    bench: &'static str,
    variant: String,
    times: Vec<Duration>,
    stats: Option<KernelStats>,
    budget: Option<u64>,
    baseline: Option<(String, f64)>,
    target: Option<f64>,
    note: String,
}

impl Row {
    fn median(&self) -> f64 {
        let mut t: Vec<f64> = self.times.iter().map(Duration::as_secs_f64).collect();
        t.sort_by(f64::total_cmp);
        t[t.len() / 2]
    }
    fn ratio(&self) -> Option<f64> {
        self.baseline.as_ref().map(|(_, b)| self.median() / b)
    }
    fn met(&self) -> Option<bool> {
        Some(self.ratio()? <= self.target?)
    }
}

fn tables(n: usize) -> Result<(DataFrame, DataFrame, DataFrame)> {
    let n64 = n as i64;
    // Unique keys in scrambled order on both sides (a permutation of 0..n).
    let perm = |salt: i64| -> Vec<i64> {
        let mut v: Vec<i64> = (0..n64).collect();
        let mut s = 0x9E37_79B9u64 ^ salt as u64;
        for i in (1..v.len()).rev() {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            v.swap(i, (s % (i as u64 + 1)) as usize);
        }
        v
    };
    let lk = perm(1);
    let rk = perm(2);
    let left = df!(
        "key" => &lk,
        "l_qty" => lk.iter().map(|k| k % 100).collect::<Vec<_>>(),
        "l_price" => lk.iter().map(|k| (k % 10_000) as f64 / 100.0).collect::<Vec<_>>(),
    )?;
    let right = df!(
        "key" => &rk,
        "r_cust" => rk.iter().map(|k| k / 3).collect::<Vec<_>>(),
        "r_disc" => rk.iter().map(|k| (k % 50) as f64 / 100.0).collect::<Vec<_>>(),
    )?;
    let groups = (n64 / 10).max(1);
    let agg_in = df!(
        "g" => lk.iter().map(|k| k % groups).collect::<Vec<_>>(),
        "v" => lk.iter().map(|k| k % 1000).collect::<Vec<_>>(),
        "x" => lk.iter().map(|k| (k % 977) as f64).collect::<Vec<_>>(),
    )?;
    Ok((left, right, agg_in))
}

fn main() -> Result<()> {
    let args = Args::parse();
    let n = args.rows;
    let out_dir = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("results"));
    std::fs::create_dir_all(&out_dir)?;
    println!("generating {n} x {n} rows ...");
    let (left, right, agg_in) = tables(n)?;

    // Memory servers sized for inputs, partitions and outputs at once.
    let per_server = ((n as u64 * 200) / args.servers as u64).max(64 << 20);
    let servers = (0..args.servers)
        .map(|_| MemoryServer::start("127.0.0.1:0", per_server, ServerConfig::default()))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let elements = Arc::new(MemoryElements::new());
    for (i, s) in servers.iter().enumerate() {
        let t = TcpTransport::connect(&s.local_addr().to_string(), TcpOptions::default())?;
        elements.add(&format!("mem{i}"), Arc::new(t))?;
    }
    let base = FrameEnv::new(elements);

    let pb = ProgressBar::new((args.reps * 4 + 4) as u64);
    pb.set_style(ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}")?);
    let mut rows: Vec<Row> = Vec::new();

    // Baseline: Polars in memory, unlimited.
    let join_polars = || -> Result<DataFrame> {
        Ok(left
            .clone()
            .lazy()
            .join(
                right.clone().lazy(),
                [col("key")],
                [col("key")],
                JoinArgs::new(polars::prelude::JoinType::Inner),
            )
            .collect()?)
    };
    let mut times = Vec::new();
    let mut expect_rows = 0;
    let mut polars_bytes = 0;
    for _ in 0..args.reps {
        pb.set_message("polars join");
        let t = Instant::now();
        let out = join_polars()?;
        times.push(t.elapsed());
        expect_rows = out.height();
        polars_bytes =
            (left.estimated_size() + right.estimated_size() + out.estimated_size()) as u64;
        pb.inc(1);
    }
    let join_base = {
        let r = Row {
            bench: "baseline",
            variant: format!("polars in-memory inner join {n} x {n}"),
            times,
            stats: None,
            budget: None,
            baseline: None,
            target: None,
            note: format!(
                "inputs + output {:.0} MiB in memory",
                polars_bytes as f64 / 1048576.0
            ),
        };
        let m = r.median();
        rows.push(r);
        m
    };

    pb.set_message("loading");
    let t = Instant::now();
    let lf = RemoteFrame::from_polars(&base, &left)?;
    let rf = RemoteFrame::from_polars(&base, &right)?;
    let load = t.elapsed();
    let build = rf.data_bytes();
    rows.push(Row {
        bench: "load",
        variant: format!(
            "write both join inputs ({:.0} MiB) to {} tcp memory servers",
            (lf.data_bytes() + build) as f64 / 1048576.0,
            args.servers
        ),
        times: vec![load],
        stats: None,
        budget: None,
        baseline: None,
        target: None,
        note: "not part of the join times".into(),
    });
    pb.inc(1);

    for pct in [100u64, 25, 5] {
        let budget = build * pct / 100;
        let reps = if pct == 25 { args.reps } else { 1 };
        let mut times = Vec::new();
        let mut stats = None;
        for _ in 0..reps {
            pb.set_message(format!("join at {pct}%"));
            let env = base.with_budget(Budget::bytes(budget)?);
            let t = Instant::now();
            let out = lf
                .with_env(&env)
                .join(&rf, ["key"], ["key"], JoinType::Inner)?;
            times.push(t.elapsed());
            ensure!(
                out.rows() == expect_rows,
                "join at {pct}%: {} rows, polars {expect_rows}",
                out.rows()
            );
            stats = Some(env.stats());
            out.free()?;
            pb.inc(1);
        }
        rows.push(Row {
            bench: "join",
            variant: format!("join {n} x {n}, budget {pct}% of build side"),
            times,
            stats,
            budget: Some(budget),
            baseline: Some(("polars join".into(), join_base)),
            target: if pct == 25 { Some(2.0) } else { None },
            note: String::new(),
        });
    }
    lf.free()?;
    rf.free()?;

    // Group-by: n rows, n/10 groups.
    let aggs = || {
        [
            col("v").sum().alias("sum_v"),
            col("x").mean().alias("avg_x"),
            len().alias("n"),
        ]
    };
    // The same aggregates as the query engine's (DataFusion) expressions.
    let frame_aggs = || {
        [
            fx::sum(fx::col("v")).alias("sum_v"),
            fx::avg(fx::col("x")).alias("avg_x"),
            fx::count(fx::lit(1)).alias("n"),
        ]
    };
    let mut times = Vec::new();
    let mut groups = 0;
    for _ in 0..args.reps {
        pb.set_message("polars group-by");
        let t = Instant::now();
        let out = agg_in
            .clone()
            .lazy()
            .group_by([col("g")])
            .agg(aggs())
            .collect()?;
        times.push(t.elapsed());
        groups = out.height();
        pb.inc(1);
    }
    let gb_base = {
        let r = Row {
            bench: "baseline",
            variant: format!("polars in-memory group-by {n} rows, {groups} groups"),
            times,
            stats: None,
            budget: None,
            baseline: None,
            target: None,
            note: String::new(),
        };
        let m = r.median();
        rows.push(r);
        m
    };
    let gf = RemoteFrame::from_polars(&base, &agg_in)?;
    for pct in [100u64, 25] {
        let budget = gf.data_bytes() * pct / 100;
        let env = base.with_budget(Budget::bytes(budget)?);
        pb.set_message(format!("group-by at {pct}%"));
        let t = Instant::now();
        let out = gf.with_env(&env).group_by(&["g"], frame_aggs())?;
        let el = t.elapsed();
        ensure!(
            out.rows() == groups,
            "group-by: {} groups, polars {groups}",
            out.rows()
        );
        rows.push(Row {
            bench: "group-by",
            variant: format!("group-by {n} rows, budget {pct}% of input"),
            times: vec![el],
            stats: Some(env.stats()),
            budget: Some(budget),
            baseline: Some(("polars group-by".into(), gb_base)),
            target: None,
            note: String::new(),
        });
        out.free()?;
        pb.inc(1);
    }
    pb.finish_and_clear();
    write_results(&out_dir, &rows, n, args.reps)?;
    for r in &rows {
        let verdict = match r.met() {
            Some(true) => " — target MET",
            Some(false) => " — target MISSED",
            None => "",
        };
        let ratio = r
            .ratio()
            .map(|x| format!(" ({x:.2}x baseline)"))
            .unwrap_or_default();
        println!(
            "{:<9} {:<70} {:>8.3} s{ratio}{verdict}",
            r.bench,
            r.variant,
            r.median()
        );
        if let Some(s) = &r.stats {
            println!("          {s}");
        }
    }
    Ok(())
}

fn mib(b: u64) -> f64 {
    b as f64 / 1048576.0
}

fn write_results(dir: &std::path::Path, rows: &[Row], n: usize, reps: usize) -> Result<()> {
    let unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let mut jsonl = String::new();
    for r in rows {
        let t: Vec<f64> = r.times.iter().map(Duration::as_secs_f64).collect();
        let v = json!({
            "bench": r.bench, "variant": r.variant, "rows": n,
            "median_s": r.median(),
            "min_s": t.iter().cloned().fold(f64::INFINITY, f64::min),
            "max_s": t.iter().cloned().fold(0.0, f64::max),
            "reps": t.len(),
            "budget_bytes": r.budget,
            "bytes_in": r.stats.map(|s| s.bytes_in),
            "bytes_out": r.stats.map(|s| s.bytes_out),
            "peak_local_bytes": r.stats.map(|s| s.peak_local_bytes),
            "spill_files": r.stats.map(|s| s.spill_files),
            "baseline": r.baseline.as_ref().map(|b| b.0.clone()),
            "ratio": r.ratio(), "target": r.target, "met": r.met(),
            "note": r.note, "unix_time": unix,
        });
        jsonl.push_str(&v.to_string());
        jsonl.push('\n');
    }
    std::fs::write(dir.join("frame.jsonl"), jsonl)?;

    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut md = String::new();
    md.push_str("# RemoteFrame verb benchmarks\n\n");
    md.push_str("`cargo run --release -p scad-benches --features polars-baselines --bin frame-bench` — in-process memory servers over loopback tcp, 2 cores shared by servers, client and other work. Join keys are int64, unique, in scrambled order on both sides; each side has two payload columns. Times are medians (min..max) of the repetitions; ratios are against Polars in memory with unlimited memory, measured in the same run. Peak local bytes are the peak reservation of the query engine's memory pool.\n\n");
    md.push_str(&format!("Rows per side: {n}; repetitions {reps} (baselines and the 25% join; the others once). Load average at the end: {}.\n\n", load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")));
    md.push_str("| bench | variant | median s (min..max) | budget MiB | peak local MiB | MiB in / out | spill files | vs baseline | target | verdict |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for r in rows {
        let t: Vec<f64> = r.times.iter().map(Duration::as_secs_f64).collect();
        let (lo, hi) = (
            t.iter().cloned().fold(f64::INFINITY, f64::min),
            t.iter().cloned().fold(0.0, f64::max),
        );
        md.push_str(&format!(
            "| {} | {} | {:.3} ({:.3}..{:.3}) | {} | {} | {} | {} | {} | {} | {} |\n",
            r.bench,
            r.variant,
            r.median(),
            lo,
            hi,
            r.budget
                .map(|b| format!("{:.0}", mib(b)))
                .unwrap_or_default(),
            r.stats
                .map(|s| format!("{:.0}", mib(s.peak_local_bytes)))
                .unwrap_or_default(),
            r.stats
                .map(|s| format!("{:.0} / {:.0}", mib(s.bytes_in), mib(s.bytes_out)))
                .unwrap_or_default(),
            r.stats
                .map(|s| s.spill_files.to_string())
                .unwrap_or_default(),
            r.ratio()
                .map(|x| format!(
                    "{x:.2}x {}",
                    r.baseline.as_ref().map(|b| b.0.as_str()).unwrap_or("")
                ))
                .unwrap_or_default(),
            r.target.map(|x| format!("<= {x}x")).unwrap_or_default(),
            match r.met() {
                Some(true) => "MET",
                Some(false) => "MISSED",
                None => "",
            },
        ));
        if !r.note.is_empty() {
            // notes go in the jsonl; keep the table compact
        }
    }
    std::fs::write(dir.join("frame.md"), md)?;
    plot(&dir.join("frame.png"), rows)?;
    println!("wrote {}", dir.join("frame.{jsonl,md,png}").display());
    Ok(())
}

fn plot(path: &std::path::Path, rows: &[Row]) -> Result<()> {
    let shown: Vec<&Row> = rows.iter().filter(|r| r.bench != "load").collect();
    let root = BitMapBackend::new(path, (1200, 80 + 50 * shown.len() as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let max = shown.iter().map(|r| r.median()).fold(0.0, f64::max) * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "RemoteFrame verbs vs Polars in memory (seconds, lower is better)",
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(35)
        .y_label_area_size(10)
        .build_cartesian_2d(0.0..max.max(0.001), 0..shown.len())?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .disable_y_axis()
        .x_desc("seconds")
        .draw()?;
    for (i, r) in shown.iter().enumerate() {
        let color = match r.bench {
            "baseline" => RGBColor(120, 120, 120),
            "join" => RGBColor(31, 119, 180),
            _ => RGBColor(44, 160, 44),
        };
        chart.draw_series(std::iter::once(Rectangle::new(
            [(0.0, i), (r.median(), i + 1)],
            color.mix(0.8).filled(),
        )))?;
        let label = match r.ratio() {
            Some(x) => format!("{}  {:.2} s  ({x:.2}x)", r.variant, r.median()),
            None => format!("{}  {:.2} s", r.variant, r.median()),
        };
        chart.draw_series(std::iter::once(Text::new(
            label,
            (max * 0.01, i),
            ("sans-serif", 16).into_font().color(&BLACK),
        )))?;
    }
    root.present()?;
    Ok(())
}
