//! Shared pieces of the Scad benchmarks: result-file locations and a bar chart that
//! every benchmark without a natural x axis (array, frame, TPC-DS) draws its results with.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Result};
use plotters::prelude::*;

/// `benches/results/` of this workspace, created if missing.
///
/// # Errors
/// The directory cannot be created.
pub fn results_dir() -> Result<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("results");
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// One horizontal bar: a measured value, labelled, coloured by its group.
#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    /// Group the bar belongs to (one colour per group, in order of first appearance).
    pub group: String,
    /// Text beside the bar.
    pub label: String,
    /// Length of the bar (must be finite and non-negative to be drawn).
    pub value: f64,
}

const PALETTE: [RGBColor; 6] = [
    RGBColor(127, 127, 127),
    RGBColor(214, 39, 40),
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
];

/// Draws `bars` top to bottom as a horizontal bar chart into a PNG at `path`, the value
/// written at the end of each bar and one colour per group (with a legend when a group
/// has several bars).
///
/// # Errors
/// No drawable bar, or a drawing or encoding error.
pub fn horizontal_bars(path: &Path, title: &str, value_desc: &str, bars: &[Bar]) -> Result<()> {
    let bars: Vec<&Bar> = bars
        .iter()
        .filter(|b| b.value.is_finite() && b.value >= 0.0)
        .collect();
    let max = bars.iter().map(|b| b.value).fold(0.0, f64::max);
    if bars.is_empty() || max <= 0.0 {
        return Err(anyhow!("no bar with a positive value to draw"));
    }
    let mut groups: Vec<&str> = Vec::new();
    for b in &bars {
        if !groups.contains(&b.group.as_str()) {
            groups.push(&b.group);
        }
    }
    let height = 140 + 30 * u32::try_from(bars.len()).unwrap_or(u32::MAX / 64);
    let root = BitMapBackend::new(path, (1400, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let n = bars.len() as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(560)
        .build_cartesian_2d(0.0..max * 1.18, 0.0..n)
        .map_err(|e| anyhow!("{e}"))?;
    let label_of = |y: &f64| -> String {
        let i = (n - y - 0.5).round();
        if i >= 0.0 && (y - (n - i - 0.5)).abs() < 1e-6 {
            bars.get(i as usize)
                .map(|b| b.label.clone())
                .unwrap_or_default()
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(bars.len() * 2 + 1)
        .y_label_formatter(&label_of)
        .x_desc(value_desc)
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    for (gi, group) in groups.iter().enumerate() {
        let color = PALETTE[gi % PALETTE.len()];
        let rects: Vec<_> = bars
            .iter()
            .enumerate()
            .filter(|(_, b)| b.group == *group)
            .map(|(i, b)| {
                let top = n - i as f64 - 0.15;
                Rectangle::new([(0.0, top), (b.value, top - 0.7)], color.filled())
            })
            .collect();
        chart
            .draw_series(rects)
            .map_err(|e| anyhow!("{e}"))?
            .label(*group)
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 16, y + 6)], color.filled()));
    }
    chart
        .draw_series(bars.iter().enumerate().map(|(i, b)| {
            Text::new(
                format!("{:.2}", b.value),
                (b.value + max * 0.01, n - i as f64 - 0.3),
                ("sans-serif", 14),
            )
        }))
        .map_err(|e| anyhow!("{e}"))?;
    // A legend only where it says more than the bars' own labels: with one bar per
    // group it covered the longest bars' values.
    if groups.len() < bars.len() {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn draws_a_png_and_refuses_nothing_to_draw() {
        let dir = std::env::temp_dir().join(format!("scad-bars-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("bars.png");
        let bars = vec![
            Bar {
                group: "baseline".into(),
                label: "memcpy".into(),
                value: 10.0,
            },
            Bar {
                group: "cached".into(),
                label: "re-read".into(),
                value: 9.0,
            },
        ];
        horizontal_bars(&path, "t", "GB/s", &bars).unwrap();
        let png = std::fs::read(&path).unwrap();
        assert_eq!(&png[1..4], b"PNG");
        let none = vec![Bar {
            group: "g".into(),
            label: "nan".into(),
            value: f64::NAN,
        }];
        assert!(horizontal_bars(&path, "t", "GB/s", &none).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// A `memory_server` process (the workspace's binary, in the target directory beside
/// the running executable), killed when dropped: what the benchmarks' and tools' tests
/// run against when they need a separate server process.
#[derive(Debug)]
pub struct MemoryServerProcess {
    child: std::process::Child,
    /// `HOST:PORT` it announced (a wildcard bind as `127.0.0.1`).
    pub addr: String,
}

impl MemoryServerProcess {
    /// Starts `memory_server 0 tcp --bind 127.0.0.1 --size SIZE` and waits for its
    /// `listening on` line.
    ///
    /// # Errors
    /// The binary is missing (`cargo build -p scad-core --features cli` builds it;
    /// `cargo test --workspace --all-features` does), fails to start, or announces
    /// nothing.
    pub fn start(size: &str) -> Result<Self> {
        use std::io::{BufRead, BufReader};
        use std::process::{Command, Stdio};

        let exe = std::env::current_exe()?;
        let bin = exe
            .ancestors()
            .skip(1)
            .take(2)
            .map(|d| d.join("memory_server"))
            .find(|p| p.exists())
            .ok_or_else(|| {
                anyhow!(
                    "no memory_server binary beside {}: build it with `cargo build -p scad-core --features cli`",
                    exe.display()
                )
            })?;
        let mut child = Command::new(&bin)
            .args(["0", "tcp", "--bind", "127.0.0.1", "--size", size])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let mut line = String::new();
        if let Some(out) = child.stdout.take() {
            BufReader::new(out).read_line(&mut line)?;
        }
        let Some(addr) = line.trim().strip_prefix("listening on ") else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(anyhow!(
                "{} announced {line:?}, not `listening on`",
                bin.display()
            ));
        };
        let addr = addr.replace("0.0.0.0", "127.0.0.1");
        Ok(MemoryServerProcess { child, addr })
    }
}

impl Drop for MemoryServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
