//! Window functions one PARTITION BY partition at a time, within the budget.
//!
//! DataFusion's `WindowAggExec` (windows whose frames reach to the end of their
//! partition, e.g. `sum(x) OVER (PARTITION BY k)` or `rank() OVER (ORDER BY ...)`)
//! collects its whole input without reserving memory, then concatenates it. Its input
//! is sorted on the partition keys (the sort below spills to memory elements), so
//! [`PartitionedWindowExec`] instead takes the input batch by batch: it evaluates the
//! window expressions (DataFusion's own `WindowExpr`s, so the semantics stay
//! DataFusion's) over the partitions a batch completes, streams the result on, and
//! keeps only the last, possibly unfinished partition, under a reservation. It
//! reserves a quarter of the budget before its input runs, so that the sort below
//! does not take all of it. Only a single partition larger than what is left fails,
//! with an out-of-budget error naming the window and the partition's key.

use std::collections::VecDeque;
use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::SchemaRef;
use datafusion::arrow::compute::{concat, concat_batches};
use datafusion::common::config::ConfigOptions;
use datafusion::common::utils::evaluate_partition_ranges;
use datafusion::common::{DataFusionError, Result as DfResult, ScalarValue};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryLimit, MemoryReservation};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalSortExpr;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::metrics::{
    ExecutionPlanMetricsSet, Gauge, MetricBuilder, MetricsSet,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::windows::{WindowAggExec, WindowExpr};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ReplaceChildrenOptions, SendableRecordBatchStream,
};
use futures::StreamExt;

use super::operator::{estimated_row_width, replace_each, replace_wrapped_children};
use super::owned::{compact_views, rows_bytes, take_rows};

/// The most a window reserves before its input runs.
const WINDOW_FLOOR_CAP: usize = 32 << 20;

/// What each of a window's `ways` partitions reserves before its input runs, of a
/// budget of `budget` bytes.
pub(crate) fn window_floor(budget: usize, ways: usize) -> usize {
    (budget / 4).min(WINDOW_FLOOR_CAP) / ways.max(1)
}

/// Replaces DataFusion's `WindowAggExec` by [`PartitionedWindowExec`] (a physical
/// optimizer rule, added when the session has a budget).
#[derive(Debug, Default)]
pub(crate) struct PartitionedWindows;

impl PhysicalOptimizerRule for PartitionedWindows {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        replace_each(plan, |window: &WindowAggExec| {
            Ok(Some(
                Arc::new(PartitionedWindowExec::new(Arc::new(window.clone()))?) as _,
            ))
        })
    }

    fn name(&self) -> &str {
        "scad_partitioned_windows"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct PartitionedWindowExec {
    window: Arc<WindowAggExec>,
    /// The PARTITION BY keys as the input is sorted on them.
    keys: Vec<PhysicalSortExpr>,
    metrics: ExecutionPlanMetricsSet,
}

impl PartitionedWindowExec {
    fn new(window: Arc<WindowAggExec>) -> DfResult<Self> {
        let keys = window.partition_by_sort_keys()?;
        Ok(PartitionedWindowExec {
            window,
            keys,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    fn names(&self) -> String {
        let names: Vec<_> = self
            .window
            .window_expr()
            .iter()
            .map(|e| e.name().to_owned())
            .collect();
        names.join(", ")
    }
}

impl DisplayAs for PartitionedWindowExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let keys: Vec<String> = self.keys.iter().map(ToString::to_string).collect();
        write!(
            f,
            "PartitionedWindowExec: keys=[{}], wraps ",
            keys.join(", ")
        )?;
        self.window.fmt_as(t, f)
    }
}

impl ExecutionPlan for PartitionedWindowExec {
    fn name(&self) -> &str {
        "PartitionedWindowExec"
    }

    super::operator::wrapped_plan_methods!(window);

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        options: ReplaceChildrenOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let window = replace_wrapped_children(&self.window, children, options)?;
        Ok(Arc::new(PartitionedWindowExec::new(Arc::new(window))?))
    }

    super::operator::with_new_children_by_replace!();

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let input = self.window.input().execute(partition, context.clone())?;
        let names = self.names();
        let pool = context.memory_pool();
        let reservation =
            MemoryConsumer::new(format!("PartitionedWindow[{partition}] {names}")).register(pool);
        // Reserved before the input runs: the sort below merges its spilled runs with
        // as much memory as it finds free, which would leave none for the partitions.
        // Each partition's window reserves its share.
        let ways = self
            .window
            .properties()
            .partitioning
            .partition_count()
            .max(1);
        let floor = match pool.memory_limit() {
            MemoryLimit::Finite(bytes) => window_floor(bytes, ways),
            _ => 0,
        };
        let floor = if reservation.try_grow(floor).is_ok() {
            floor
        } else {
            0
        };
        let state = WindowRun {
            input,
            schema: self.window.schema(),
            window_expr: self.window.window_expr().to_vec(),
            keys: self.keys.clone(),
            names,
            window_row_bytes: window_row_bytes(
                &self.window.schema(),
                self.window.window_expr().len(),
            ),
            tail: None,
            ready: VecDeque::new(),
            reservation,
            floor,
            used: 0,
            finished: false,
            peak: MetricBuilder::new(&self.metrics).gauge("peak_mem_used", partition),
        };
        let schema = self.window.schema();
        let stream = futures::stream::try_unfold(state, |mut run| async move {
            let out = run.next_output().await?;
            Ok(out.map(|batch| (batch, run)))
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

/// Bytes per row of the last `columns` columns of `schema` (the window columns).
fn window_row_bytes(schema: &SchemaRef, columns: usize) -> usize {
    let fields = schema.fields();
    let window = &fields[fields.len().saturating_sub(columns)..];
    // A byte more a value (its validity).
    estimated_row_width(window, 16) + window.len()
}

/// One partition's execution state.
struct WindowRun {
    input: SendableRecordBatchStream,
    schema: SchemaRef,
    window_expr: Vec<Arc<dyn WindowExpr>>,
    keys: Vec<PhysicalSortExpr>,
    names: String,
    /// Bytes a row of the window columns takes (primitive widths; 16 for others).
    window_row_bytes: usize,
    /// The rows of the last partition seen, which the next batch may continue (a
    /// compact copy, under `reservation`).
    tail: Option<RecordBatch>,
    /// Output ready to hand on.
    ready: VecDeque<RecordBatch>,
    reservation: MemoryReservation,
    /// Bytes reserved from the start and kept until the end.
    floor: usize,
    /// Bytes of the reservation in use (the reservation is at least `floor`).
    used: usize,
    finished: bool,
    peak: Gauge,
}

impl WindowRun {
    /// The next output batch (the windows over whole partitions); None when done.
    async fn next_output(&mut self) -> DfResult<Option<RecordBatch>> {
        loop {
            if let Some(out) = self.ready.pop_front() {
                return Ok(Some(out));
            }
            if self.finished {
                return Ok(None);
            }
            match self.input.next().await {
                Some(batch) => {
                    let batch = batch?;
                    if batch.num_rows() > 0 {
                        self.push(batch)?;
                    }
                }
                None => {
                    self.finished = true;
                    if let Some(tail) = self.tail.take() {
                        let out = self.evaluate(&tail)?;
                        self.ready.push_back(out);
                    }
                    self.reservation.free();
                }
            }
        }
    }

    /// Takes one batch of the input (sorted on the partition keys): evaluates the
    /// partitions it completes and keeps its last one as the tail.
    fn push(&mut self, batch: RecordBatch) -> DfResult<()> {
        // The batch's own rows: it may be a slice of the sort's whole run.
        self.grow(rows_bytes(&batch), &batch)?;
        let ranges = self.ranges(&batch)?;
        let mut complete_from = 0;
        if let Some(tail) = self.tail.take() {
            if self.same_partition(&tail, &batch)? {
                // The batch's first partition continues the tail's.
                let first = batch.slice(0, ranges[0].end);
                self.grow(rows_bytes(&first), &tail)?;
                let glued = concat_batches(&batch.schema(), [&tail, &first])?;
                if ranges.len() == 1 {
                    // Still unfinished: the glued rows are the new tail.
                    self.tail = Some(compact_views(&glued)?);
                    self.keep_only_tail();
                    return Ok(());
                }
                let out = self.evaluate(&glued)?;
                self.ready.push_back(out);
                complete_from = 1;
            } else {
                let out = self.evaluate(&tail)?;
                self.ready.push_back(out);
            }
        }
        let last = ranges[ranges.len() - 1].clone();
        let start = ranges[complete_from].start;
        if start < last.start {
            let out = self.evaluate(&batch.slice(start, last.start - start))?;
            self.ready.push_back(out);
        }
        // A compact copy of the last partition, not a view that would keep the
        // whole batch alive.
        let rows = |n: usize| {
            u32::try_from(n).map_err(|_| {
                DataFusionError::ResourcesExhausted(format!(
                    "window {}: a batch of more than 2^32 rows",
                    self.names
                ))
            })
        };
        let idx: Vec<u32> = (rows(last.start)?..rows(last.end)?).collect();
        self.tail = Some(take_rows(&batch, &idx)?);
        self.keep_only_tail();
        Ok(())
    }

    /// Shrinks the reservation to what the tail holds (batches handed on are the
    /// consumer's).
    fn keep_only_tail(&mut self) {
        let kept = self
            .tail
            .as_ref()
            .map_or(0, RecordBatch::get_array_memory_size);
        self.set_used(kept);
    }

    /// Accounts `bytes` more, growing the reservation past what it holds if needed.
    fn grow(&mut self, bytes: usize, rows: &RecordBatch) -> DfResult<()> {
        let want = self.used + bytes;
        if want > self.reservation.size() {
            self.reservation
                .try_grow(want - self.reservation.size())
                .map_err(|e| self.too_large(e, rows))?;
        }
        self.used = want;
        self.peak.set_max(self.used);
        Ok(())
    }

    /// Sets the bytes in use, giving back what the reservation holds beyond them
    /// (but not below the floor).
    fn set_used(&mut self, used: usize) {
        self.used = used;
        self.reservation.resize(used.max(self.floor));
    }

    /// The ranges of rows with equal partition keys.
    fn ranges(&self, batch: &RecordBatch) -> DfResult<Vec<Range<usize>>> {
        let columns = self
            .keys
            .iter()
            .map(|k| k.evaluate_to_sort_column(batch))
            .collect::<DfResult<Vec<_>>>()?;
        evaluate_partition_ranges(batch.num_rows(), &columns)
    }

    /// True if the first row of `next` is in the partition of the last row of `tail`.
    fn same_partition(&self, tail: &RecordBatch, next: &RecordBatch) -> DfResult<bool> {
        // Only the two rows compared are evaluated, not both batches.
        let (a_row, b_row) = (tail.slice(tail.num_rows() - 1, 1), next.slice(0, 1));
        for k in &self.keys {
            let a = k.expr.evaluate(&a_row)?.into_array(1)?;
            let b = k.expr.evaluate(&b_row)?.into_array(1)?;
            if ScalarValue::try_from_array(&a, 0)? != ScalarValue::try_from_array(&b, 0)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The rows of whole partitions with the window columns appended.
    fn evaluate(&mut self, rows: &RecordBatch) -> DfResult<RecordBatch> {
        let columns_bytes = rows.num_rows() * self.window_row_bytes;
        self.grow(columns_bytes, rows)?;
        let ranges = self.ranges(rows)?;
        let mut pieces: Vec<Vec<ArrayRef>> = vec![Vec::new(); self.window_expr.len()];
        for r in &ranges {
            let part = rows.slice(r.start, r.end - r.start);
            for (expr, out) in self.window_expr.iter().zip(pieces.iter_mut()) {
                out.push(expr.evaluate(&part)?);
            }
        }
        let mut out_columns = rows.columns().to_vec();
        for p in &pieces {
            let refs: Vec<&dyn arrow_array::Array> = p.iter().map(|a| a.as_ref()).collect();
            out_columns.push(concat(&refs)?);
        }
        self.set_used(self.used - columns_bytes);
        Ok(RecordBatch::try_new(self.schema.clone(), out_columns)?)
    }

    /// The error for a partition that does not fit: names the window and the key.
    fn too_large(&self, e: DataFusionError, rows: &RecordBatch) -> DataFusionError {
        let key = if self.keys.is_empty() {
            "(the whole input: no PARTITION BY)".to_owned()
        } else {
            let vals: Vec<String> = self
                .keys
                .iter()
                .map(|k| {
                    k.expr
                        .evaluate(rows)
                        .and_then(|c| c.into_array(rows.num_rows()))
                        .and_then(|a| ScalarValue::try_from_array(&a, 0))
                        .map_or_else(|_| "?".to_owned(), |v| v.to_string())
                })
                .collect();
            format!("({})", vals.join(", "))
        };
        let held = self.tail.as_ref().map_or(0, RecordBatch::num_rows);
        DataFusionError::ResourcesExhausted(format!(
            "window {} holds {held} rows ({} bytes) of partition {key} and cannot take more: {e}",
            self.names, self.used
        ))
    }
}

#[cfg(test)]
mod tests {
    use polars::prelude::{df, DataFrame, SortMultipleOptions};

    use crate::env::FrameEnv;
    use crate::error::Error;
    use crate::frame::RemoteFrame;
    use crate::query::test_env::{local_env, one_partition_session};
    use crate::query::QueryOutput;

    const ROWS: i64 = 120_000;
    /// Rows per PARTITION BY partition: partitions span input batches.
    const PARTITION_ROWS: i64 = 1_500;
    const SQL: &str = "SELECT g, v, s, sum(v) OVER (PARTITION BY g) AS total FROM t";

    fn env_and_table() -> (FrameEnv, RemoteFrame) {
        let env = local_env(1, 128 << 20);
        // Stored out of partition order, so the sort below the window has work.
        let t = df!(
            "g" => (0..ROWS).map(|i| (i * 7919 % ROWS) / PARTITION_ROWS).collect::<Vec<_>>(),
            "v" => (0..ROWS).collect::<Vec<_>>(),
            "s" => (0..ROWS).map(|i| format!("a string past the inline length {i}")).collect::<Vec<_>>()
        )
        .unwrap();
        let frame = RemoteFrame::from_polars(&env, &t).unwrap();
        (env, frame)
    }

    fn run(env: &FrameEnv, t: &RemoteFrame, budget: Option<u64>) -> QueryOutput {
        let session = one_partition_session(env, budget, t);
        let out = session.sql(SQL).unwrap();
        assert_eq!(session.spill_bytes_held(), 0, "spill memory left behind");
        assert_eq!(out.rows(), ROWS as usize);
        out
    }

    fn sorted(out: &QueryOutput) -> DataFrame {
        out.to_polars()
            .unwrap()
            .sort(["g", "v"], SortMultipleOptions::default())
            .unwrap()
    }

    #[test]
    fn a_window_reserves_the_rows_it_is_handed_not_the_buffers_behind_them() {
        let (env, t) = env_and_table();
        let want = sorted(&run(&env, &t, None));
        // The sort below hands on batches whose string views point into all of its
        // run's buffers. Sized by those buffers, the window's peak was megabytes and
        // the query failed at 8 and 12 MiB; sized by its rows, it is kilobytes.
        for (mib, spill_files) in [(4u64, 2), (8, 1), (12, 0)] {
            let out = run(&env, &t, Some(mib << 20));
            assert_eq!(sorted(&out), want, "{mib} MiB");
            assert_eq!(out.stats().spill_files, spill_files, "{mib} MiB");
            assert!(out.stats().peak_local_bytes <= mib << 20);
            let window_peak = out
                .explain_analyze()
                .lines()
                .find(|l| l.contains("PartitionedWindowExec"))
                .and_then(|l| l.split("peak_mem_used=").nth(1).map(str::to_owned))
                .unwrap_or_default();
            assert!(window_peak.ends_with(" K]"), "{mib} MiB: {window_peak}");
        }
    }

    #[test]
    fn a_failed_window_query_leaves_nothing_allocated() {
        let (env, t) = env_and_table();
        let session = one_partition_session(&env, Some(1 << 20), &t);
        // One PARTITION BY partition of 1,500 rows fits in 1 MiB; the whole table as
        // one does not. The sort below has spilled its runs by the time it fails.
        let err = session
            .sql("SELECT g, v, s, sum(v) OVER (PARTITION BY g % 1) AS total FROM t")
            .unwrap_err();
        assert!(matches!(err, Error::OutOfBudget { .. }), "{err}");
        assert_eq!(session.spill_bytes_held(), 0, "spill memory left behind");
        assert_eq!(session.reserved_bytes(), 0, "local memory left reserved");
    }
}
