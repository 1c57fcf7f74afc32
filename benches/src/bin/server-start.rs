//! How fast a `memory_server` process starts and how much memory it holds before
//! anything is written (BENCHMARKS.md: `--size 16G` listening within 100 ms, resident
//! < 64 MiB until written). Starts the release `memory_server` binary (build it first:
//! `cargo build --release -p scad-core --features cli`) repeatedly at several sizes, times
//! spawn → `listening on` line, and reads VmRSS from `/proc/PID/status`; a 16 MiB
//! server is the baseline (the fixed cost of starting a process). Then writes 256 MiB
//! into a 16 GiB server and reads its size again.
//!
//! ```text
//! cargo run --release -p scad-benches --bin server-start -- [--reps 9]
//! ```
//! Writes `benches/results/server_start.{jsonl,md}`.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use scad_benches::results_dir;
use scad_core::transport::{TcpOptions, TcpTransport};
use scad_core::Transport;

#[derive(Debug, Parser)]
#[command(about = "memory_server start-up time and resident size before writes")]
struct Args {
    /// Starts per size (the median is reported).
    #[arg(long, default_value_t = 9)]
    reps: usize,
}

const MIB: f64 = 1024.0 * 1024.0;

fn server_binary() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let bin = exe
        .parent()
        .ok_or_else(|| anyhow!("no directory for {}", exe.display()))?
        .join("memory_server");
    if !bin.exists() {
        bail!(
            "{} is missing: run `cargo build --release -p scad-core --features cli` first",
            bin.display()
        );
    }
    Ok(bin)
}

fn rss(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| anyhow!("no VmRSS for {pid}"))?;
    Ok(kib * 1024)
}

/// Starts a server of `size`, returns it, its address, seconds to listen and VmRSS.
fn start(bin: &PathBuf, size: &str) -> Result<(Child, String, f64, u64)> {
    let t0 = Instant::now();
    let mut child = Command::new(bin)
        .args(["0", "tcp", "--bind", "127.0.0.1", "--size", size])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting memory_server")?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?)
        .read_line(&mut line)?;
    let took = t0.elapsed().as_secs_f64();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .ok_or_else(|| anyhow!("unexpected first line {line:?}"))?
        .to_owned();
    let resident = rss(child.id())?;
    Ok((child, addr, took, resident))
}

fn stop(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<()> {
    let args = Args::parse();
    let bin = server_binary()?;
    let reps = args.reps.max(1);
    let mut jsonl = String::new();
    let mut md = vec![
        "# memory_server start-up".to_owned(),
        String::new(),
        format!(
            "`cargo run --release -p scad-benches --bin server-start -- --reps {reps}`: spawn \
             to the `listening on` line, medians of {reps} starts; resident = VmRSS right \
             after. Load average at the start: {}.",
            std::fs::read_to_string("/proc/loadavg")
                .unwrap_or_default()
                .split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        ),
        String::new(),
        "| size | listening after (median, min..max) | resident after start | target | result |"
            .to_owned(),
        "|---|---:|---:|---|---|".to_owned(),
    ];
    for size in ["16M", "1G", "16G", "64G"] {
        let (mut times, mut rsss) = (Vec::new(), Vec::new());
        for _ in 0..reps {
            let (child, _, took, resident) = start(&bin, size)?;
            stop(child);
            times.push(took);
            rsss.push(resident as f64);
        }
        let (lo, hi) = (
            times.iter().copied().fold(f64::INFINITY, f64::min),
            times.iter().copied().fold(0.0, f64::max),
        );
        let t = median(&mut times);
        let r = median(&mut rsss);
        let (target, verdict) = if size == "16G" {
            let met = t < 0.100 && r < 64.0 * MIB;
            (
                "listening < 100 ms, resident < 64 MiB",
                if met { "MET" } else { "MISSED" },
            )
        } else if size == "16M" {
            ("baseline: process start", "")
        } else {
            ("", "")
        };
        println!(
            "--size {size}: listening after {:.1} ms (min {:.1}, max {:.1}), resident {:.1} MiB {verdict}",
            t * 1e3,
            lo * 1e3,
            hi * 1e3,
            r / MIB
        );
        jsonl.push_str(&format!(
            "{{\"bench\":\"server-start\",\"size\":\"{size}\",\"listen_ms_median\":{:.3},\"listen_ms_min\":{:.3},\"listen_ms_max\":{:.3},\"rss_bytes\":{r},\"reps\":{reps},\"verdict\":\"{verdict}\"}}\n",
            t * 1e3, lo * 1e3, hi * 1e3
        ));
        md.push(format!(
            "| {size} | {:.1} ms ({:.1}..{:.1}) | {:.1} MiB | {target} | {verdict} |",
            t * 1e3,
            lo * 1e3,
            hi * 1e3,
            r / MIB
        ));
    }
    // Resident size follows writes: 256 MiB into a 16 GiB server.
    let (child, addr, _, before) = start(&bin, "16G")?;
    let c = TcpTransport::connect(&addr, TcpOptions::default())?;
    let chunk = vec![1u8; 16 << 20];
    for i in 0..16u64 {
        c.write(i * (1 << 30), &chunk)?;
    }
    let after = rss(child.id())?;
    stop(child);
    println!(
        "--size 16G: resident {:.1} MiB after start, {:.1} MiB after writing 256 MiB",
        before as f64 / MIB,
        after as f64 / MIB
    );
    md.push(String::new());
    md.push(format!(
        "A 16 GiB server: resident {:.1} MiB after start, {:.1} MiB after 256 MiB were \
         written into it (16 MiB at each of 16 addresses 1 GiB apart).",
        before as f64 / MIB,
        after as f64 / MIB
    ));
    jsonl.push_str(&format!(
        "{{\"bench\":\"server-start\",\"size\":\"16G\",\"rss_after_256mib_written\":{after},\"rss_before\":{before}}}\n"
    ));
    let dir = results_dir()?;
    std::fs::File::create(dir.join("server_start.jsonl"))?.write_all(jsonl.as_bytes())?;
    std::fs::write(dir.join("server_start.md"), md.join("\n") + "\n")?;
    Ok(())
}
