//! What a query or stage reports about its run ([`QueryStats`]): its time, the peak
//! of the session's pool, the bytes its scans read and its own share of the
//! session's spill counters.

use std::sync::atomic::Ordering;
use std::time::Instant;

use datafusion::physical_plan::ExecutionPlan;

use super::{scan, stage, QuerySession, QueryStats};

/// The clock and the spill counters at a query's start, to report its own.
pub(super) struct MeasureStart {
    start: Instant,
    files: u64,
    written: u64,
    read: u64,
}

impl QuerySession {
    /// Starts the clock, resets the peak and notes the spill counters before a query
    /// or stage runs.
    pub(super) fn measure_start(&self) -> MeasureStart {
        let start = Instant::now();
        self.pool.reset_peak();
        MeasureStart {
            start,
            files: self.spill.files.load(Ordering::Relaxed),
            written: self.spill.bytes_written.load(Ordering::Relaxed),
            read: self.spill.bytes_read.load(Ordering::Relaxed),
        }
    }

    /// The statistics of a query or stage measured from `before`, which produced
    /// `rows` rows and whose scans read `scan_bytes` (see [`scan_bytes`]).
    pub(super) fn measure_end(
        &self,
        before: MeasureStart,
        rows: usize,
        scan_bytes: u64,
    ) -> QueryStats {
        QueryStats {
            elapsed: before.start.elapsed(),
            rows,
            peak_local_bytes: self.pool.peak_reserved() as u64,
            budget: self.env.budget(),
            scan_bytes,
            spill_files: self.spill.files.load(Ordering::Relaxed) - before.files,
            spill_bytes_written: self.spill.bytes_written.load(Ordering::Relaxed) - before.written,
            spill_bytes_read: self.spill.bytes_read.load(Ordering::Relaxed) - before.read,
        }
    }
}

/// Bytes read from memory elements by the plan's scans of tables and stage outputs
/// (their `bytes_read` metric).
pub(super) fn scan_bytes(plan: &dyn ExecutionPlan) -> u64 {
    let own = if plan.is::<scan::RemoteScanExec>() || plan.is::<stage::StageInputExec>() {
        plan.metrics()
            .and_then(|m| m.sum_by_name("bytes_read"))
            .map(|v| v.as_usize() as u64)
            .unwrap_or(0)
    } else {
        0
    };
    own + plan
        .children()
        .into_iter()
        .map(|c| scan_bytes(c.as_ref()))
        .sum::<u64>()
}
