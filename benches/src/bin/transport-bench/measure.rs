//! Timing loop and summary statistics.
//!
//! A [`Case`] is one operation of one size on one transport. Cases of the same size are
//! measured in interleaved rounds (every case once per round), so a slow phase of a
//! shared, noisy machine hits all of them alike instead of one.

use std::time::{Duration, Instant};

use anyhow::Result;

/// One thing to time: a closure that performs the operation once.
pub struct Case {
    /// Transport or baseline name (`tcp`, `redis`, `memcpy`, ...).
    pub transport: &'static str,
    /// Operation name (`read`, `write`, `read_vectored`, ...).
    pub op: &'static str,
    /// Bytes moved by one operation.
    pub size: usize,
    /// Performs the operation once. The first call is untimed and may verify data.
    pub run: Box<dyn FnMut() -> Result<()>>,
    /// Operations per timed sample (set by [`Case::warm_up`]): tiny operations are
    /// timed in batches so the clock's own cost does not dominate.
    pub batch: usize,
    /// Per-operation time of every sample, in nanoseconds.
    pub samples: Vec<f64>,
}

impl Case {
    /// A case that has not run yet.
    pub fn new(
        transport: &'static str,
        op: &'static str,
        size: usize,
        run: impl FnMut() -> Result<()> + 'static,
    ) -> Self {
        Case {
            transport,
            op,
            size,
            run: Box::new(run),
            batch: 1,
            samples: Vec::new(),
        }
    }

    /// Runs the operation a few times untimed (the first run verifies data, later ones
    /// warm caches and connections) and picks the batch size.
    ///
    /// # Errors
    /// The first error of the operation.
    pub fn warm_up(&mut self) -> Result<()> {
        let runs = if self.size >= 1 << 20 { 2 } else { 20 };
        for _ in 0..runs {
            (self.run)()?;
        }
        let probes = 10u32;
        let start = Instant::now();
        for _ in 0..probes {
            (self.run)()?;
        }
        let per_op = start.elapsed().as_secs_f64() * 1e9 / f64::from(probes);
        // Aim for samples of at least ~2 µs.
        self.batch = if per_op < 2_000.0 {
            (2_000.0 / per_op.max(1.0)).ceil() as usize
        } else {
            1
        };
        Ok(())
    }

    /// Takes samples for one round: until `budget` has passed or `max_samples` were
    /// taken, but at least `min_samples`.
    ///
    /// # Errors
    /// The first error of the operation.
    pub fn round(
        &mut self,
        budget: Duration,
        min_samples: usize,
        max_samples: usize,
    ) -> Result<()> {
        let start = Instant::now();
        let mut taken = 0;
        while taken < min_samples || (taken < max_samples && start.elapsed() < budget) {
            let t = Instant::now();
            for _ in 0..self.batch {
                (self.run)()?;
            }
            let ns = t.elapsed().as_secs_f64() * 1e9;
            self.samples.push(ns / self.batch as f64);
            taken += 1;
        }
        Ok(())
    }

    /// Summary of the samples taken so far.
    pub fn summary(&self) -> Summary {
        Summary::of(&self.samples, self.batch)
    }
}

/// Order statistics of one case's samples (nanoseconds per operation).
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    /// Timed samples.
    pub samples: usize,
    /// Operations per sample.
    pub batch: usize,
    /// Median time per operation.
    pub median_ns: f64,
    /// 99th percentile.
    pub p99_ns: f64,
    /// 1st percentile.
    pub p1_ns: f64,
    /// Fastest sample.
    pub min_ns: f64,
    /// Mean.
    pub mean_ns: f64,
}

impl Summary {
    /// Statistics of `samples` (any order); zeros for no samples.
    pub fn of(samples: &[f64], batch: usize) -> Self {
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let mean = if n == 0 {
            0.0
        } else {
            sorted.iter().sum::<f64>() / n as f64
        };
        Summary {
            samples: n,
            batch,
            median_ns: percentile(&sorted, 0.5),
            p99_ns: percentile(&sorted, 0.99),
            p1_ns: percentile(&sorted, 0.01),
            min_ns: sorted.first().copied().unwrap_or(0.0),
            mean_ns: mean,
        }
    }
}

/// The `q` quantile of sorted values (nearest rank; the mean of the middle two for the
/// median of an even count); 0 for no values.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    let n = sorted.len();
    if n == 0 {
        return 0.0;
    }
    if (q - 0.5).abs() < f64::EPSILON && n % 2 == 0 {
        return (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0;
    }
    let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
    sorted[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 50.5);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&v, 0.01), 1.0);
        assert_eq!(percentile(&[3.0], 0.99), 3.0);
        assert_eq!(percentile(&[1.0, 2.0, 3.0], 0.5), 2.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }
}
