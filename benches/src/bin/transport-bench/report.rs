//! Result rows, targets and their outputs: JSON lines, Markdown and a PNG chart.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use plotters::prelude::*;
use serde::Serialize;

use crate::measure::Summary;

/// One measured row, as written to the JSON lines file.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// `local`, `shm`, `tcp`, `redis`, `tcp-stream` or `memcpy`.
    pub transport: String,
    /// `read`, `write`, `read_vectored`, `get`, `set` or `copy`.
    pub op: String,
    /// Bytes moved by one operation.
    pub size: usize,
    /// `full` or `quick`.
    pub mode: String,
    /// Operations timed.
    pub iterations: usize,
    /// Timed samples (each of `batch` operations).
    pub samples: usize,
    /// Operations per sample (more than one only for sub-2-µs operations).
    pub batch: usize,
    /// Median time of one operation, µs.
    pub median_us: f64,
    /// 99th-percentile time, µs.
    pub p99_us: f64,
    /// 1st-percentile time, µs.
    pub p1_us: f64,
    /// Fastest sample, µs.
    pub min_us: f64,
    /// Mean time, µs.
    pub mean_us: f64,
    /// Throughput at the median time, GB/s (10^9 bytes per second).
    pub gbps: f64,
    /// Throughput at the 99th-percentile time (the slow end of the spread), GB/s.
    pub gbps_p99: f64,
    /// The row this one is compared with (`transport op`, same size), if any.
    pub baseline: Option<String>,
    /// Median time of the baseline row, µs.
    pub baseline_median_us: Option<f64>,
    /// Throughput of the baseline row, GB/s.
    pub baseline_gbps: Option<f64>,
    /// `gbps / baseline_gbps`: above 1 is faster than the baseline.
    pub ratio_to_baseline: Option<f64>,
}

impl Row {
    /// A row from a case's summary.
    pub fn new(transport: &str, op: &str, size: usize, mode: &str, s: &Summary) -> Self {
        let gbps = |ns: f64| if ns > 0.0 { size as f64 / ns } else { 0.0 };
        Row {
            transport: transport.to_owned(),
            op: op.to_owned(),
            size,
            mode: mode.to_owned(),
            iterations: s.samples * s.batch,
            samples: s.samples,
            batch: s.batch,
            median_us: s.median_ns / 1e3,
            p99_us: s.p99_ns / 1e3,
            p1_us: s.p1_ns / 1e3,
            min_us: s.min_ns / 1e3,
            mean_us: s.mean_ns / 1e3,
            gbps: gbps(s.median_ns),
            gbps_p99: gbps(s.p99_ns),
            baseline: None,
            baseline_median_us: None,
            baseline_gbps: None,
            ratio_to_baseline: None,
        }
    }

    /// A one-line summary for the console.
    pub fn one_line(&self) -> String {
        format!(
            "{:<10} {:<13} {:>7}  median {:>10.2} µs  p99 {:>10.2} µs  {:>7.2} GB/s  ({} ops)",
            self.transport,
            self.op,
            scad_core::fmt::bytes_exact(self.size as u64),
            self.median_us,
            self.p99_us,
            self.gbps,
            self.iterations
        )
    }
}

/// Fills the baseline fields of every row that has a baseline row of the same size.
pub fn attach_baselines(
    rows: &mut [Row],
    baseline_of: impl Fn(&str, &str) -> Option<(&'static str, &'static str)>,
) {
    let snapshot: Vec<(String, String, usize, f64, f64)> = rows
        .iter()
        .map(|r| {
            (
                r.transport.clone(),
                r.op.clone(),
                r.size,
                r.median_us,
                r.gbps,
            )
        })
        .collect();
    for row in rows.iter_mut() {
        let Some((bt, bop)) = baseline_of(&row.transport, &row.op) else {
            continue;
        };
        let Some((_, _, _, median, gbps)) = snapshot
            .iter()
            .find(|(t, op, size, _, _)| t == bt && op == bop && *size == row.size)
        else {
            continue;
        };
        row.baseline = Some(format!("{bt} {bop}"));
        row.baseline_median_us = Some(*median);
        row.baseline_gbps = Some(*gbps);
        row.ratio_to_baseline = (*gbps > 0.0).then(|| row.gbps / gbps);
    }
}

/// Whether a target was met.
#[derive(Debug, Clone)]
pub enum Status {
    /// Met.
    Met,
    /// Missed.
    Missed,
    /// Not measured, with the reason.
    Skipped(String),
}

/// One target of BENCHMARKS.md and how this run did.
#[derive(Debug, Clone)]
pub struct Target {
    /// What is measured.
    pub what: String,
    /// Its value in this run.
    pub measured: String,
    /// What it is compared with.
    pub baseline: String,
    /// The baseline's value in this run.
    pub baseline_value: String,
    /// measured / baseline (or the absolute value for absolute targets).
    pub ratio: Option<f64>,
    /// The bound, as text (`≤ 0.5×`).
    pub bound: String,
    /// Met or missed.
    pub status: Status,
}

impl Target {
    /// A target whose ratio must not exceed `bound` (latency).
    pub fn at_most(
        what: &str,
        measured: String,
        baseline: &str,
        base: String,
        ratio: f64,
        bound: f64,
    ) -> Self {
        Target {
            what: what.to_owned(),
            measured,
            baseline: baseline.to_owned(),
            baseline_value: base,
            ratio: Some(ratio),
            bound: format!("≤ {bound}×"),
            status: if ratio <= bound {
                Status::Met
            } else {
                Status::Missed
            },
        }
    }

    /// A target whose ratio must reach `bound` (throughput).
    pub fn at_least(
        what: &str,
        measured: String,
        baseline: &str,
        base: String,
        ratio: f64,
        bound: f64,
    ) -> Self {
        Target {
            what: what.to_owned(),
            measured,
            baseline: baseline.to_owned(),
            baseline_value: base,
            ratio: Some(ratio),
            bound: format!("≥ {bound}×"),
            status: if ratio >= bound {
                Status::Met
            } else {
                Status::Missed
            },
        }
    }

    /// A throughput target with no baseline: at least `bound` GB/s.
    pub fn absolute(what: &str, gbps: f64, bound: f64) -> Self {
        Target {
            what: what.to_owned(),
            measured: format!("{gbps:.2} GB/s"),
            baseline: "—".to_owned(),
            baseline_value: "—".to_owned(),
            ratio: None,
            bound: format!("≥ {bound} GB/s"),
            status: if gbps >= bound {
                Status::Met
            } else {
                Status::Missed
            },
        }
    }

    /// A target that could not be evaluated.
    pub fn skipped(what: &str, baseline: &str, reason: &str, bound: &str) -> Self {
        Target {
            what: what.to_owned(),
            measured: "—".to_owned(),
            baseline: baseline.to_owned(),
            baseline_value: "—".to_owned(),
            ratio: None,
            bound: bound.to_owned(),
            status: Status::Skipped(reason.to_owned()),
        }
    }

    fn result(&self) -> String {
        match &self.status {
            Status::Met => "MET".to_owned(),
            Status::Missed => "MISSED".to_owned(),
            Status::Skipped(why) => format!("SKIPPED ({why})"),
        }
    }
}

/// Facts about the run shown above the tables.
#[derive(Debug, Clone)]
pub struct Meta {
    /// `full` or `quick`.
    pub mode: &'static str,
    /// The command that regenerates the results.
    pub command: String,
    /// The Redis version, or why Redis was skipped.
    pub redis: String,
    /// Logical CPUs.
    pub cores: usize,
    /// Interleaved rounds per size.
    pub rounds: usize,
    /// Wall time of the whole run.
    pub elapsed: Duration,
}

/// Writes one JSON object per row.
///
/// # Errors
/// I/O and serialisation errors.
pub fn write_jsonl(path: &Path, rows: &[Row]) -> Result<()> {
    let mut out = Vec::new();
    for row in rows {
        serde_json::to_writer(&mut out, row)?;
        out.write_all(b"\n")?;
    }
    std::fs::write(path, out).with_context(|| format!("cannot write {}", path.display()))
}

fn ratio_text(r: Option<f64>) -> String {
    r.map_or_else(|| "—".to_owned(), |r| format!("{r:.2}×"))
}

/// The Markdown report: run facts, the targets table and every row.
pub fn markdown(meta: &Meta, rows: &[Row], targets: &[Target]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Transport benchmark ({} mode)\n", meta.mode);
    let _ = writeln!(s, "Regenerate with `{}`.\n", meta.command);
    let _ = writeln!(
        s,
        "Machine: {} logical CPUs, loopback only. Redis: {}. Every size's cases run in {} \
         interleaved rounds; the whole run took {:.0} s. Times are per operation; GB/s is \
         10^9 bytes/s at the median time. tcp runs against an in-process memory server on \
         127.0.0.1; `tcp-stream` is the plain request/response TCP baseline (a 64-byte request, \
         the block as answer; for writes the request and the block, then a 1-byte answer); `memcpy` is \
         `copy_from_slice` into a pre-faulted buffer. Sources and destinations are page-aligned \
         (like a registered buffer and the served regions); the `read_dst16` and \
         `copy_dst16` rows read into a buffer that starts 16 bytes into a page, as a large \
         `Vec<u8>` from malloc does. The vectored read fetches 256 pages of 4 KiB at a \
         stride of 8 KiB in one call into a page-aligned buffer.\n",
        meta.cores,
        meta.redis,
        meta.rounds,
        meta.elapsed.as_secs_f64()
    );
    let _ = writeln!(
        s,
        "Copy speed on this machine depends on where data sits relative to 64-byte \
         boundaries: glibc's `memcpy` and the kernel's `copy_to_user` use `rep movsb` for \
         mid-sized copies, which on AMD Zen is many times slower when the destination is a \
         few bytes past the source modulo 64 (see the `_dst16` rows). The tcp protocol pads reply \
         heads and payloads to 64 bytes so payloads stay on those boundaries, and the memory \
         region copies large ranges in one call; loopback numbers still vary from run to \
         run, so compare several runs before reading much into one.\n"
    );
    let _ = writeln!(s, "## Targets (BENCHMARKS.md)\n");
    let _ = writeln!(
        s,
        "| target | measured | baseline (same run) | baseline value | ratio | bound | result |"
    );
    let _ = writeln!(s, "|---|---:|---|---:|---:|---|---|");
    for t in targets {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} |",
            t.what,
            t.measured,
            t.baseline,
            t.baseline_value,
            ratio_text(t.ratio),
            t.bound,
            t.result()
        );
    }
    let _ = writeln!(s, "\n## All rows\n");
    let _ = writeln!(
        s,
        "| transport | op | size | iterations | median µs | p99 µs | GB/s (median) | GB/s (p99) | baseline | × baseline |"
    );
    let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|---:|---|---:|");
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {} |",
            r.transport,
            r.op,
            scad_core::fmt::bytes_exact(r.size as u64),
            r.iterations,
            r.median_us,
            r.p99_us,
            r.gbps,
            r.gbps_p99,
            r.baseline.as_deref().unwrap_or("—"),
            ratio_text(r.ratio_to_baseline)
        );
    }
    s
}

/// Series drawn in each panel: (transport, op in the read panel, op in the write panel,
/// colour, dashed). Dashed read series are reads into a buffer at page offset 16.
const SERIES: [(&str, &str, &str, RGBColor, bool); 10] = [
    ("memcpy", "copy", "copy", RGBColor(120, 120, 120), false),
    ("local", "read", "write", RGBColor(31, 119, 180), false),
    ("shm", "read", "write", RGBColor(44, 160, 44), false),
    ("tcp", "read", "write", RGBColor(214, 39, 40), false),
    ("tcp-stream", "read", "write", RGBColor(255, 127, 14), false),
    ("redis", "get", "set", RGBColor(148, 103, 189), false),
    ("rdma", "read", "write", RGBColor(23, 190, 207), false),
    ("memcpy", "copy_dst16", "", RGBColor(120, 120, 120), true),
    ("local", "read_dst16", "", RGBColor(31, 119, 180), true),
    ("tcp", "read_dst16", "", RGBColor(214, 39, 40), true),
];

/// Draws throughput against transfer size (both axes logarithmic), reads on the left
/// and writes on the right; the vectored reads are single markers at their total size.
///
/// # Errors
/// Drawing or encoding errors.
pub fn chart(path: &Path, rows: &[Row]) -> Result<()> {
    let root = BitMapBackend::new(path, (1500, 860)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let root = root
        .titled(
            "scad-core transports: throughput vs transfer size (median of all samples)",
            ("sans-serif", 26),
        )
        .map_err(|e| anyhow!("{e}"))?;
    let positive: Vec<f64> = rows.iter().map(|r| r.gbps).filter(|g| *g > 0.0).collect();
    let lo = positive
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min)
        .min(1.0);
    let hi = positive.iter().copied().fold(0.0, f64::max).max(1.0);
    // Room below the lowest point for the legends.
    let y_range = (lo / 40.0)..(hi * 2.0);
    let sizes: Vec<f64> = rows.iter().map(|r| (r.size as f64).log2()).collect();
    let x_lo = sizes.iter().copied().fold(f64::INFINITY, f64::min).floor() - 0.5;
    let x_hi = sizes.iter().copied().fold(0.0, f64::max).ceil() + 0.5;

    let panels = root.split_evenly((1, 2));
    for (panel, read_side) in panels.iter().zip([true, false]) {
        let mut chart = ChartBuilder::on(panel)
            .caption(
                if read_side {
                    "read / GET / copy"
                } else {
                    "write / SET / copy"
                },
                ("sans-serif", 22),
            )
            .margin(18)
            .x_label_area_size(50)
            .y_label_area_size(70)
            .build_cartesian_2d(x_lo..x_hi, y_range.clone().log_scale())
            .map_err(|e| anyhow!("{e}"))?;
        chart
            .configure_mesh()
            .x_labels(9)
            .x_label_formatter(&|v| {
                let e = v.round();
                if (v - e).abs() < 1e-6 {
                    scad_core::fmt::bytes_exact(2f64.powf(e) as u64)
                } else {
                    String::new()
                }
            })
            .y_label_formatter(&|v| {
                if *v >= 1.0 {
                    format!("{v:.0}")
                } else {
                    format!("{v:.2}")
                }
            })
            .x_desc("transfer size (log scale)")
            .y_desc("GB/s at median time (log scale)")
            .label_style(("sans-serif", 16))
            .axis_desc_style(("sans-serif", 18))
            .draw()
            .map_err(|e| anyhow!("{e}"))?;
        for (transport, read_op, write_op, color, dashed) in SERIES {
            let op = if read_side { read_op } else { write_op };
            if op.is_empty() {
                continue;
            }
            let mut points: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.transport == transport && r.op == op && r.gbps > 0.0)
                .map(|r| ((r.size as f64).log2(), r.gbps))
                .collect();
            if points.is_empty() {
                continue;
            }
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            let label = format!("{transport} {op}");
            if dashed {
                chart
                    .draw_series(DashedLineSeries::new(
                        points.clone(),
                        8,
                        6,
                        color.stroke_width(2),
                    ))
                    .map_err(|e| anyhow!("{e}"))?
                    .label(label)
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 10, y)], color.stroke_width(2))
                    });
                chart
                    .draw_series(
                        points
                            .iter()
                            .map(|p| Circle::new(*p, 4, color.stroke_width(2))),
                    )
                    .map_err(|e| anyhow!("{e}"))?;
            } else {
                chart
                    .draw_series(LineSeries::new(points.clone(), color.stroke_width(3)))
                    .map_err(|e| anyhow!("{e}"))?
                    .label(label)
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3))
                    });
                chart
                    .draw_series(points.iter().map(|p| Circle::new(*p, 5, color.filled())))
                    .map_err(|e| anyhow!("{e}"))?;
            }
        }
        if read_side {
            for (transport, color) in [
                ("tcp", RGBColor(214, 39, 40)),
                ("local", RGBColor(31, 119, 180)),
                ("shm", RGBColor(44, 160, 44)),
            ] {
                let Some(r) = rows
                    .iter()
                    .find(|r| r.transport == transport && r.op == "read_vectored" && r.gbps > 0.0)
                else {
                    continue;
                };
                chart
                    .draw_series(std::iter::once(TriangleMarker::new(
                        ((r.size as f64).log2(), r.gbps),
                        9,
                        color.filled(),
                    )))
                    .map_err(|e| anyhow!("{e}"))?
                    .label(format!("{transport} vectored 256 × 4 KiB"))
                    .legend(move |(x, y)| TriangleMarker::new((x + 12, y), 7, color.filled()));
            }
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .label_font(("sans-serif", 16))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| anyhow!("{e}"))?;
    }
    root.present().map_err(|e| anyhow!("{e}"))?;
    Ok(())
}
