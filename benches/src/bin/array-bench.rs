//! Benchmarks of the buffer pool and `RemoteArray`, each beside a baseline measured in
//! the same run (see BENCHMARKS.md):
//!
//! 1. materialize 256 MiB over tcp vs a raw tcp transport bulk read of the same bytes
//!    (target ≥ 0.7×);
//! 2. re-read of a cached range vs memcpy of the same size (target ≥ 0.8×);
//! 3. random 4 KiB-element reads with a pool of 10% and 50% of the array (CLOCK and
//!    LRU, uniform and Zipf-skewed): hit rate and throughput, beside uncached reads;
//! 4. materialize striped over 1, 2 and 4 memory servers.
//!
//! Writes `benches/results/array.jsonl`, `array.md` and the chart `array.png`, and prints
//! MET/MISSED for every target. `--replot` redraws the chart from `array.jsonl` alone.
//!
//! ```text
//! cargo run --release -p scad-benches --bin array-bench [-- --quick | --replot]
//! ```

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ndarray::{Array2, Ix2};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use scad_core::server::{MemoryServer, ServerConfig};
use scad_core::transport::{TcpOptions, TcpTransport};
use scad_core::Transport;
use scad_remote_array::{
    BufferPool, EvictionPolicy, MemoryElements, Placement, RemoteArray, RemoteStore,
};

type BoxResult<T> = Result<T, Box<dyn std::error::Error>>;

const MIB: usize = 1 << 20;

/// Median, min and max of repeated timings.
#[derive(Debug, Clone, Copy)]
struct Timing {
    median: f64,
    min: f64,
    max: f64,
}

fn time_reps(reps: usize, mut f: impl FnMut() -> BoxResult<()>) -> BoxResult<Timing> {
    let mut t = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t0 = Instant::now();
        f()?;
        t.push(t0.elapsed().as_secs_f64());
    }
    t.sort_by(f64::total_cmp);
    Ok(Timing {
        median: t[t.len() / 2],
        min: t[0],
        max: t[t.len() - 1],
    })
}

/// One result row.
struct Row {
    bench: &'static str,
    variant: String,
    bytes: u64,
    timing: Timing,
    extra: String,
    /// (baseline name, ratio, target) when this row is checked against a target.
    target: Option<(String, f64, f64)>,
}

impl Row {
    fn gbs(&self) -> f64 {
        self.bytes as f64 / self.timing.median / 1e9
    }
}

struct Report {
    rows: Vec<Row>,
}

impl Report {
    fn add(&mut self, row: Row) {
        let verdict = match &row.target {
            Some((base, ratio, target)) => format!(
                "  {:.2}x {base} (target >= {target}x): {}",
                ratio,
                if ratio >= target { "MET" } else { "MISSED" }
            ),
            None => String::new(),
        };
        println!(
            "{:<10} {:<48} {:>8.2} GB/s  median {:>8.2} ms [{:.2}..{:.2}] {}{}",
            row.bench,
            row.variant,
            row.gbs(),
            row.timing.median * 1e3,
            row.timing.min * 1e3,
            row.timing.max * 1e3,
            row.extra,
            verdict
        );
        self.rows.push(row);
    }
}

fn server(size: u64) -> BoxResult<(MemoryServer, Arc<dyn Transport>)> {
    let s = MemoryServer::start("127.0.0.1:0", size, ServerConfig::default())?;
    let t = TcpTransport::connect(&s.local_addr().to_string(), TcpOptions::default())?;
    Ok((s, Arc::new(t)))
}

fn store(
    transports: &[Arc<dyn Transport>],
    pool_bytes: usize,
    page: usize,
    policy: EvictionPolicy,
) -> BoxResult<Arc<RemoteStore>> {
    let elements = Arc::new(MemoryElements::new());
    for (i, t) in transports.iter().enumerate() {
        elements.add(&format!("mem{i}"), Arc::clone(t))?;
    }
    let mut builder = BufferPool::builder(pool_bytes)
        .page_size(page)
        .policy(policy)
        .elements(elements);
    if let Some(b) = std::env::var("ARRAY_BENCH_BATCH")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        builder = builder.batch_bytes(b);
    }
    let pool = builder.build()?;
    Ok(Arc::new(RemoteStore::new(Arc::new(pool))))
}

/// A matrix of `bytes` bytes of f32 in rows of 1024 values (4 KiB).
fn matrix(bytes: usize) -> Array2<f32> {
    Array2::from_shape_fn((bytes / 4096, 1024), |(i, j)| (i * 1024 + j) as f32)
}

/// 1. Materialize over tcp vs a raw bulk read.
fn bench_materialize(report: &mut Report, size: usize, reps: usize) -> BoxResult<()> {
    let (_server, t) = server((size + 16 * MIB) as u64)?;
    let a = matrix(size);
    for page in [64 * 1024, 256 * 1024] {
        let store = store(
            std::slice::from_ref(&t),
            size / 4,
            page,
            EvictionPolicy::Clock,
        )?;
        let remote = RemoteArray::from_array_with(&store, &a, &Placement::on("mem0"))?;
        let addr = remote.meta().extents[0].addr;

        // Baselines: one bulk read of the same bytes, into a reused buffer and into a
        // fresh one (materialize allocates its result).
        let mut buf = vec![0u8; size];
        t.read(addr, &mut buf)?;
        let raw_reused = time_reps(reps, || {
            t.read(addr, &mut buf)?;
            Ok(())
        })?;
        let raw_fresh = time_reps(reps, || {
            let mut fresh = vec![0u8; size];
            t.read(addr, &mut fresh)?;
            std::hint::black_box(&fresh);
            Ok(())
        })?;
        let before = store.pool().stats();
        let mat = time_reps(reps, || {
            let m = remote.materialize()?;
            std::hint::black_box(&m);
            Ok(())
        })?;
        let s = store.pool().stats().since(&before);
        let mut dst = vec![0f32; a.len()];
        let into = time_reps(reps, || {
            remote.read_into(.., &mut dst)?;
            Ok(())
        })?;
        let check = remote.materialize()?;
        if check != a {
            return Err("materialized data differ".into());
        }
        let (kib, mib, pool) = (page / 1024, size / MIB, size / 4 / MIB);
        report.add(Row {
            bench: "baseline",
            variant: format!("raw tcp read {mib} MiB, reused buffer (page {kib} KiB run)"),
            bytes: size as u64,
            timing: raw_reused,
            extra: String::new(),
            target: None,
        });
        report.add(Row {
            bench: "baseline",
            variant: format!("raw tcp read {mib} MiB, fresh buffer (page {kib} KiB run)"),
            bytes: size as u64,
            timing: raw_fresh,
            extra: String::new(),
            target: None,
        });
        report.add(Row {
            bench: "materialize",
            variant: format!("materialize {mib} MiB, pool {pool} MiB, {kib} KiB pages"),
            bytes: size as u64,
            timing: mat,
            extra: format!("hit {:.0}%", 100.0 * s.hit_ratio()),
            target: Some((
                "raw read, fresh buffer".into(),
                raw_fresh.median / mat.median,
                0.7,
            )),
        });
        report.add(Row {
            bench: "materialize",
            variant: format!("read_into {mib} MiB (reused dst), {kib} KiB pages"),
            bytes: size as u64,
            timing: into,
            extra: String::new(),
            target: Some((
                "raw read, reused buffer".into(),
                raw_reused.median / into.median,
                0.7,
            )),
        });
    }
    Ok(())
}

/// 2. Re-read of a cached range vs memcpy.
fn bench_cached(report: &mut Report, reps: usize) -> BoxResult<()> {
    let range = 32 * MIB;
    let (_server, t) = server((96 * MIB) as u64)?;
    let store = store(&[t], 64 * MIB, 64 * 1024, EvictionPolicy::Clock)?;
    let a = matrix(64 * MIB);
    let remote = RemoteArray::from_array(&store, &a)?;
    let rows = range / 4096;
    let part = remote.slice(1000..1000 + rows)?;
    part.materialize()?; // warm
                         // Data the compiler cannot know, so the copies below stay copies.
    let src: Vec<u8> = std::hint::black_box((0..range).map(|i| (i % 251) as u8).collect());
    let memcpy_fresh = time_reps(reps, || {
        let v = std::hint::black_box(&src).clone();
        std::hint::black_box(&v);
        Ok(())
    })?;
    let mut dst_bytes = vec![0u8; range];
    let memcpy_reused = time_reps(reps, || {
        dst_bytes.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&dst_bytes);
        Ok(())
    })?;
    let before = store.pool().stats();
    let mat = time_reps(reps, || {
        let m = part.materialize()?;
        std::hint::black_box(&m);
        Ok(())
    })?;
    let mut dst = vec![0f32; rows * 1024];
    let into = time_reps(reps, || {
        part.read_into(.., &mut dst)?;
        Ok(())
    })?;
    let s = store.pool().stats().since(&before);
    if s.misses != 0 {
        return Err(format!("cached re-read missed: {s}").into());
    }
    report.add(Row {
        bench: "baseline",
        variant: "memcpy 32 MiB into a fresh Vec".into(),
        bytes: range as u64,
        timing: memcpy_fresh,
        extra: String::new(),
        target: None,
    });
    report.add(Row {
        bench: "baseline",
        variant: "memcpy 32 MiB into a reused buffer".into(),
        bytes: range as u64,
        timing: memcpy_reused,
        extra: String::new(),
        target: None,
    });
    report.add(Row {
        bench: "cached",
        variant: "materialize cached 32 MiB (fresh array)".into(),
        bytes: range as u64,
        timing: mat,
        extra: format!("hit {:.0}%", 100.0 * s.hit_ratio()),
        target: Some((
            "memcpy, fresh".into(),
            memcpy_fresh.median / mat.median,
            0.8,
        )),
    });
    report.add(Row {
        bench: "cached",
        variant: "read_into cached 32 MiB (reused dst)".into(),
        bytes: range as u64,
        timing: into,
        extra: String::new(),
        target: Some((
            "memcpy, reused".into(),
            memcpy_reused.median / into.median,
            0.8,
        )),
    });
    Ok(())
}

/// Zipf(s) sampler over `0..n` by inverse CDF.
struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(n: usize, s: f64) -> Self {
        let mut cdf = Vec::with_capacity(n);
        let mut acc = 0.0;
        for k in 1..=n {
            acc += 1.0 / (k as f64).powf(s);
            cdf.push(acc);
        }
        for c in &mut cdf {
            *c /= acc;
        }
        Zipf { cdf }
    }

    fn sample(&self, rng: &mut StdRng) -> usize {
        let u: f64 = rng.gen();
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1)
    }
}

/// 3. Random 4 KiB-element reads.
fn bench_random(report: &mut Report, reads: usize) -> BoxResult<()> {
    let size = 64 * MIB;
    let rows = size / 4096;
    let (_server, t) = server((size + 16 * MIB) as u64)?;
    let a = matrix(size);
    // Uncached baseline: the transport's own 4 KiB reads at the same random rows.
    let base_store = store(std::slice::from_ref(&t), 4096, 4096, EvictionPolicy::Clock)?;
    let remote = RemoteArray::from_array_with(&base_store, &a, &Placement::on("mem0"))?;
    let meta = remote.meta();
    let addr = meta.extents[0].addr;
    let zipf = Zipf::new(rows, 0.99);
    let mut rng = StdRng::seed_from_u64(7);
    let mut buf = vec![0u8; 4096];
    let raw = time_reps(1, || {
        for _ in 0..reads {
            let r = rng.gen_range(0..rows);
            t.read(addr + (r * 4096) as u64, &mut buf)?;
        }
        Ok(())
    })?;
    report.add(Row {
        bench: "baseline",
        variant: format!("uncached raw tcp 4 KiB reads x{reads}"),
        bytes: (reads * 4096) as u64,
        timing: raw,
        extra: format!("{:.0} reads/s", reads as f64 / raw.median),
        target: None,
    });
    for policy in [EvictionPolicy::Clock, EvictionPolicy::Lru] {
        for pct in [10usize, 50] {
            for skew in ["uniform", "zipf0.99"] {
                let store = store(std::slice::from_ref(&t), size * pct / 100, 4096, policy)?;
                let arr = RemoteArray::<f32, Ix2>::from_meta(&store, &meta)?;
                let mut rng = StdRng::seed_from_u64(11);
                let pick = |rng: &mut StdRng| match skew {
                    "uniform" => rng.gen_range(0..rows),
                    _ => zipf.sample(rng),
                };
                let mut dst = vec![0f32; 1024];
                // Warm up with as many reads as are timed.
                for _ in 0..reads {
                    let r = pick(&mut rng);
                    arr.read_into(r..r + 1, &mut dst)?;
                }
                let before = store.pool().stats();
                let timing = time_reps(1, || {
                    for _ in 0..reads {
                        let r = pick(&mut rng);
                        arr.read_into(r..r + 1, &mut dst)?;
                    }
                    Ok(())
                })?;
                let s = store.pool().stats().since(&before);
                report.add(Row {
                    bench: "random",
                    variant: format!("{policy} pool {pct}% {skew} 4 KiB reads x{reads}"),
                    bytes: (reads * 4096) as u64,
                    timing,
                    extra: format!(
                        "hit {:.1}%, {:.0} reads/s ({:.1}x uncached)",
                        100.0 * s.hit_ratio(),
                        reads as f64 / timing.median,
                        raw.median / timing.median
                    ),
                    target: None,
                });
            }
        }
    }
    Ok(())
}

/// 4. Striping over 1, 2, 4 servers.
fn bench_striping(report: &mut Report, size: usize, reps: usize) -> BoxResult<()> {
    let a = matrix(size);
    let mut one = None;
    for n in [1usize, 2, 4] {
        let servers = (0..n)
            .map(|_| server((size / n + 16 * MIB) as u64))
            .collect::<BoxResult<Vec<_>>>()?;
        let transports: Vec<Arc<dyn Transport>> =
            servers.iter().map(|s| Arc::clone(&s.1)).collect();
        let store = store(&transports, size / 4, 64 * 1024, EvictionPolicy::Clock)?;
        let remote =
            RemoteArray::from_array_with(&store, &a, &Placement::all().stripe_bytes(MIB as u64))?;
        // Into a reused buffer, so the page faults of a fresh result do not hide the
        // transports.
        let mut dst = vec![0f32; a.len()];
        remote.read_into(.., &mut dst)?;
        let timing = time_reps(reps, || {
            remote.read_into(.., &mut dst)?;
            Ok(())
        })?;
        let base = *one.get_or_insert(timing.median);
        report.add(Row {
            bench: "striping",
            variant: format!(
                "read_into {} MiB over {n} server(s), 1 MiB stripes, 64 KiB pages",
                size / MIB
            ),
            bytes: size as u64,
            timing,
            extra: format!("{:.2}x one server", base / timing.median),
            target: None,
        });
    }
    Ok(())
}

fn write_results(report: &Report, quick: bool) -> BoxResult<()> {
    let dir = scad_benches::results_dir()?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs();
    let mut jsonl = String::new();
    for r in &report.rows {
        let mut v = serde_json::json!({
            "bench": r.bench,
            "variant": r.variant,
            "bytes": r.bytes,
            "median_s": r.timing.median,
            "min_s": r.timing.min,
            "max_s": r.timing.max,
            "gb_per_s": r.gbs(),
            "note": r.extra,
            "unix_time": stamp,
            "quick": quick,
        });
        if let Some((base, ratio, target)) = &r.target {
            v["baseline"] = serde_json::json!(base);
            v["ratio"] = serde_json::json!(ratio);
            v["target"] = serde_json::json!(target);
            v["met"] = serde_json::json!(ratio >= target);
        }
        jsonl.push_str(&v.to_string());
        jsonl.push('\n');
    }
    std::fs::write(dir.join("array.jsonl"), jsonl)?;

    let mut md = String::new();
    writeln!(md, "# RemoteArray benchmarks")?;
    writeln!(md)?;
    writeln!(
        md,
        "`cargo run --release -p scad-benches --bin array-bench` — in-process memory \
         servers over loopback tcp, 2 cores shared by servers and client. Times are medians \
         (min..max) of the repetitions; every ratio is against a baseline measured in the same run."
    )?;
    writeln!(md)?;
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    writeln!(
        md,
        "Machine: {} cores; load average at the end of the run: {}.",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    )?;
    writeln!(md)?;
    writeln!(
        md,
        "| bench | variant | GB/s | median ms (min..max) | note | vs baseline | target | verdict |"
    )?;
    writeln!(md, "|---|---|---:|---:|---|---:|---:|---|")?;
    for r in &report.rows {
        let (ratio, target, verdict) = match &r.target {
            Some((base, ratio, target)) => (
                format!("{ratio:.2}x {base}"),
                format!(">= {target}x"),
                if ratio >= target { "MET" } else { "MISSED" }.to_owned(),
            ),
            None => (String::new(), String::new(), String::new()),
        };
        writeln!(
            md,
            "| {} | {} | {:.2} | {:.1} ({:.1}..{:.1}) | {} | {} | {} | {} |",
            r.bench,
            r.variant,
            r.gbs(),
            r.timing.median * 1e3,
            r.timing.min * 1e3,
            r.timing.max * 1e3,
            r.extra,
            ratio,
            target,
            verdict
        )?;
    }
    std::fs::write(dir.join("array.md"), md)?;
    draw_chart()?;
    println!("wrote {}", dir.join("array.{jsonl,md,png}").display());
    Ok(())
}

/// Draws `array.png` from `array.jsonl`: throughput of every measured variant, baselines
/// in grey beside the runs they are compared with.
fn draw_chart() -> BoxResult<()> {
    let dir = scad_benches::results_dir()?;
    let text = std::fs::read_to_string(dir.join("array.jsonl"))?;
    let mut bars = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line)?;
        let field = |k: &str| v[k].as_str().unwrap_or_default().to_owned();
        bars.push(scad_benches::Bar {
            group: field("bench"),
            label: field("variant"),
            value: v["gb_per_s"].as_f64().unwrap_or(f64::NAN),
        });
    }
    scad_benches::horizontal_bars(
        &dir.join("array.png"),
        "scad-remote-array: RemoteArray and buffer pool over loopback tcp (median)",
        "GB/s",
        &bars,
    )?;
    Ok(())
}

fn main() -> BoxResult<()> {
    if std::env::args().any(|a| a == "--replot") {
        return draw_chart();
    }
    let quick = std::env::args().any(|a| a == "--quick");
    let (size, reps, reads) = if quick {
        (32 * MIB, 3, 2000)
    } else {
        (256 * MIB, 9, 20_000)
    };
    // Benchmarks named on the command line run alone (and write no result files).
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let run = |name: &str| only.is_empty() || only.iter().any(|o| o == name);
    let reps = std::env::var("ARRAY_BENCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(reps);
    let mut report = Report { rows: Vec::new() };
    if run("materialize") {
        bench_materialize(&mut report, size, reps)?;
    }
    if run("cached") {
        bench_cached(&mut report, reps)?;
    }
    if run("random") {
        bench_random(&mut report, reads)?;
    }
    if run("striping") {
        bench_striping(&mut report, size, reps.min(5))?;
    }
    if only.is_empty() {
        write_results(&report, quick)?;
    }
    Ok(())
}
