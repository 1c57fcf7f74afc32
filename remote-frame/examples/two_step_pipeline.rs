//! A two-step pipeline over memory elements, each step its own process.
//!
//! Step 1 writes a `date_dim`-like table, keeps the dates of 2000 with a filter, and
//! prints the filtered frame's metadata as JSON. Step 2 — another process, given only
//! that JSON and the memory servers' addresses — opens the frame, writes a
//! `store_sales`-like table of its own, joins the two and sums sales per month.
//!
//! ```text
//! cargo run -p scad-remote-frame --example two_step_pipeline            # all of it
//! cargo run -p scad-remote-frame --example two_step_pipeline -- step1 --servers A,B > meta.json
//! cargo run -p scad-remote-frame --example two_step_pipeline -- step2 --servers A,B --meta meta.json
//! ```
//! Without a subcommand it starts two embedded memory servers, runs step 1 in this
//! process and step 2 as a child process (this same program), and checks the result.

use std::io::Read as _;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use polars::prelude::*;
use scad_core::server::{MemoryServer, ServerConfig};
use scad_core::transport::{TcpOptions, TcpTransport};
use scad_remote_array::MemoryElements;
use scad_remote_frame::query::expr as q;
use scad_remote_frame::{Budget, FrameEnv, FrameMeta, JoinType, RemoteFrame};

#[derive(Parser)]
#[command(about = "Two pipeline steps handing a RemoteFrame on by its metadata JSON")]
struct Cli {
    #[command(subcommand)]
    step: Option<Step>,
}

#[derive(Subcommand)]
enum Step {
    /// Write and filter date_dim; print the filtered frame's metadata JSON.
    Step1 {
        /// Memory server addresses, comma separated.
        #[arg(long, value_delimiter = ',')]
        servers: Vec<String>,
    },
    /// Open step 1's frame from its JSON (file, or `-` for stdin) and join with sales.
    Step2 {
        /// Memory server addresses, comma separated (same order as step 1).
        #[arg(long, value_delimiter = ',')]
        servers: Vec<String>,
        /// File holding step 1's metadata JSON.
        #[arg(long)]
        meta: String,
    },
}

/// A frame environment over the memory servers (element `memI` = server I), with a
/// 32 MiB local budget.
fn connect(servers: &[String]) -> Result<FrameEnv> {
    let elements = Arc::new(MemoryElements::new());
    for (i, addr) in servers.iter().enumerate() {
        let t = TcpTransport::connect(addr, TcpOptions::default())
            .with_context(|| format!("connecting to memory server {addr}"))?;
        elements.add(&format!("mem{i}"), Arc::new(t))?;
    }
    Ok(FrameEnv::new(elements)
        .with_budget(Budget::bytes(32 << 20)?)
        .with_chunk_rows(16 * 1024))
}

/// Year and month of a day count since 1970-01-01 (proleptic Gregorian calendar).
fn civil(days: i32) -> (i32, i32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i32::from(m <= 2), m)
}

fn date_dim() -> Result<DataFrame> {
    // 1998-01-01 .. 2002-12-31, one row per day.
    let first = 10_227i32; // days since 1970-01-01 of 1998-01-01
    let days: Vec<i32> = (first..first + 5 * 365 + 1).collect();
    let sk: Vec<i64> = (0..days.len() as i64).map(|i| 2_450_000 + i).collect();
    let year: Vec<i32> = days.iter().map(|&d| civil(d).0).collect();
    let moy: Vec<i32> = days.iter().map(|&d| civil(d).1).collect();
    Ok(
        df!("d_date_sk" => sk, "d_date" => days, "d_year" => year, "d_moy" => moy)?
            .lazy()
            .with_columns([col("d_date").cast(DataType::Date)])
            .collect()?,
    )
}

fn step1(servers: &[String]) -> Result<String> {
    let env = connect(servers)?;
    let dates = RemoteFrame::from_polars(&env, &date_dim()?)?;
    let y2000 = dates.filter(q::col("d_year").eq(q::lit(2000)))?;
    dates.free()?; // only the filtered frame is handed on
    tracing::info!(rows = y2000.rows(), stats = %env.stats(), "step 1 done");
    Ok(y2000.to_json()?)
}

fn step2(servers: &[String], json: &str) -> Result<DataFrame> {
    let env = connect(servers)?;
    let meta = FrameMeta::from_json(json)?;
    // Allocate new frames above step 1's, so nothing of it is overwritten.
    env.reserve_frames(&[&meta])?;
    let y2000 = RemoteFrame::open(&env, meta)?;
    // Sales: 200k rows over the whole date range.
    let n = 200_000i64;
    let sales = df!(
        "ss_sold_date_sk" => (0..n).map(|i| 2_450_000 + (i * 7919) % 1826).collect::<Vec<_>>(),
        "ss_quantity" => (0..n).map(|i| 1 + i % 10).collect::<Vec<_>>(),
        "ss_net_paid" => (0..n).map(|i| (i % 1000) as f64 / 10.0).collect::<Vec<_>>(),
    )?;
    let sales = RemoteFrame::from_polars(&env, &sales)?;
    let per_month = sales
        .join(&y2000, ["ss_sold_date_sk"], ["d_date_sk"], JoinType::Inner)?
        .group_by(
            &["d_moy"],
            [
                q::sum(q::col("ss_quantity")).alias("quantity"),
                q::sum(q::col("ss_net_paid")).alias("net_paid"),
                q::count(q::lit(1)).alias("sales"),
            ],
        )?
        .sort(vec![q::col("d_moy").sort(true, false)])?;
    let out = per_month.to_polars()?;
    tracing::info!(stats = %env.stats(), "step 2 done");
    Ok(out)
}

/// The rows as text (the lean Polars build has no table formatter).
fn print_table(df: &DataFrame) -> String {
    let mut s = df
        .get_column_names()
        .iter()
        .map(|n| format!("{n:>12}"))
        .collect::<String>();
    s.push('\n');
    for i in 0..df.height() {
        if let Some(row) = df.get(i) {
            s.push_str(
                &row.iter()
                    .map(|v| format!("{:>12}", v.to_string()))
                    .collect::<String>(),
            );
            s.push('\n');
        }
    }
    s.push_str(&format!("rows: {}", df.height()));
    s
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().step {
        Some(Step::Step1 { servers }) => println!("{}", step1(&servers)?),
        Some(Step::Step2 { servers, meta }) => {
            let mut json = String::new();
            if meta == "-" {
                std::io::stdin().read_to_string(&mut json)?;
            } else {
                json = std::fs::read_to_string(&meta).with_context(|| format!("reading {meta}"))?;
            }
            let out = step2(&servers, &json)?;
            println!("{}", print_table(&out));
        }
        None => {
            let servers = [
                MemoryServer::start("127.0.0.1:0", 256 << 20, ServerConfig::default())?,
                MemoryServer::start("127.0.0.1:0", 256 << 20, ServerConfig::default())?,
            ];
            let addrs: Vec<String> = servers.iter().map(|s| s.local_addr().to_string()).collect();
            let json = step1(&addrs)?;
            println!("step 1 handed on {} bytes of metadata JSON", json.len());
            let path = std::env::temp_dir().join(format!("scad-step1-{}.json", std::process::id()));
            std::fs::write(&path, &json)?;
            let exe = std::env::current_exe()?;
            let out = std::process::Command::new(exe)
                .args(["step2", "--servers", &addrs.join(","), "--meta"])
                .arg(&path)
                .output()
                .context("running step 2 as a child process")?;
            let _ = std::fs::remove_file(&path);
            if !out.status.success() {
                bail!("step 2 failed: {}", String::from_utf8_lossy(&out.stderr));
            }
            println!(
                "step 2 (separate process) printed:\n{}",
                String::from_utf8_lossy(&out.stdout)
            );
            // Check against Polars in memory.
            let local = date_dim()?
                .lazy()
                .filter(col("d_year").eq(lit(2000)))
                .collect()?;
            let months = local.column("d_moy")?.n_unique()?;
            let printed = String::from_utf8_lossy(&out.stdout);
            if months != 12 || !printed.contains("rows: 12") {
                bail!("expected 12 months of 2000 in step 2's result");
            }
            println!("ok: 12 months of 2000 joined across processes");
        }
    }
    Ok(())
}
