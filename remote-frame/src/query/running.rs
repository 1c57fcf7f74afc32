//! Running aggregates in windows: `sum`, `min`, `max` and `count` over `ROWS BETWEEN
//! UNBOUNDED PRECEDING AND CURRENT ROW`, in one pass over each batch.
//!
//! DataFusion's `BoundedWindowAggExec` evaluates such a frame row by row through the
//! aggregate's accumulator: one update and one `ScalarValue` per row (q51's four
//! running sums and maxima over 18 k item partitions took 0.39 s of its 0.56 s, about
//! 390 ns a row). The frame grows by one row at a time, so each row's value is the
//! previous row's combined with its own: [`RunningWindowExec`] computes them in a loop
//! over the batch's values, carrying each aggregate's state from the last row of a
//! batch to the next batch while the partition goes on. It holds no rows, so it needs
//! no memory of its own. Windows of other functions, frames or types stay
//! DataFusion's.

use std::fmt;
use std::sync::Arc;

use arrow_array::types::{Decimal128Type, Float64Type, Int64Type};
use arrow_array::{
    Array, ArrayRef, ArrowNativeTypeOp, ArrowPrimitiveType, Int64Array, PrimitiveArray, RecordBatch,
};
use arrow_buffer::{BooleanBufferBuilder, NullBuffer};
use arrow_schema::{DataType, SchemaRef, SortOptions};
use datafusion::arrow::row::{OwnedRow, RowConverter, SortField};
use datafusion::common::config::ConfigOptions;
use datafusion::common::{DataFusionError, Result as DfResult};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{WindowFrameBound, WindowFrameUnits};
use datafusion::physical_expr::window::PlainAggregateWindowExpr;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::windows::{BoundedWindowAggExec, WindowExpr};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, InputOrderMode, ReplaceChildrenOptions,
    SendableRecordBatchStream,
};
use futures::StreamExt;

use super::operator::{replace_each, replace_wrapped_children};

/// Swaps [`RunningWindowExec`] in for each `BoundedWindowAggExec` whose window
/// expressions it computes (a physical optimizer rule).
#[derive(Debug, Default)]
pub(crate) struct RunningWindows;

impl PhysicalOptimizerRule for RunningWindows {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        replace_each(plan, |window: &BoundedWindowAggExec| {
            Ok(RunningWindowExec::try_new(Arc::new(window.clone()))?
                .map(|exec| Arc::new(exec) as Arc<dyn ExecutionPlan>))
        })
    }

    fn name(&self) -> &str {
        "scad_running_windows"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// What a running aggregate combines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Sum,
    Min,
    Max,
    Count,
}

/// One running aggregate of a window.
#[derive(Debug, Clone)]
struct Running {
    kind: Kind,
    argument: Arc<dyn PhysicalExpr>,
    /// The argument's type: Int64, Float64 or Decimal128 (any for count).
    data_type: DataType,
    /// The result's type: the argument's, a wider decimal of the same scale for a
    /// decimal sum, Int64 for count.
    result: DataType,
}

impl Running {
    /// The running aggregate `expr` computes, if it is one this operator computes as
    /// DataFusion would: sum, min, max or count of an Int64 or Float64 argument (any
    /// for count), not distinct, no FILTER, over ROWS from the partition's start to
    /// the current row.
    fn of(expr: &Arc<dyn WindowExpr>, input: &SchemaRef) -> DfResult<Option<Self>> {
        let Some(plain) = expr.as_any().downcast_ref::<PlainAggregateWindowExpr>() else {
            return Ok(None);
        };
        let frame = plain.get_window_frame();
        if frame.units != WindowFrameUnits::Rows
            || !frame.start_bound.is_unbounded()
            || !matches!(frame.start_bound, WindowFrameBound::Preceding(_))
            || frame.end_bound != WindowFrameBound::CurrentRow
            || !without_filter(plain)
        {
            return Ok(None);
        }
        let aggregate = plain.get_aggregate_expr();
        if aggregate.is_distinct() || aggregate.ignore_nulls() || !aggregate.order_bys().is_empty()
        {
            return Ok(None);
        }
        let kind = match aggregate.fun().name() {
            "sum" => Kind::Sum,
            "min" => Kind::Min,
            "max" => Kind::Max,
            "count" => Kind::Count,
            _ => return Ok(None),
        };
        let arguments = aggregate.expressions();
        let [argument] = arguments.as_slice() else {
            return Ok(None);
        };
        let argument = argument.clone();
        let Ok(data_type) = argument.data_type(input) else {
            return Ok(None);
        };
        let result = expr.field()?.data_type().clone();
        let supported = match (kind, &data_type, &result) {
            (Kind::Count, _, DataType::Int64) => true,
            (Kind::Count, _, _) => false,
            // A decimal sum widens its precision, not its scale: the same units.
            (Kind::Sum, DataType::Decimal128(_, s), DataType::Decimal128(_, r)) => s == r,
            (_, DataType::Int64 | DataType::Float64 | DataType::Decimal128(..), _) => {
                result == data_type
            }
            _ => false,
        };
        Ok(supported.then_some(Running {
            kind,
            argument,
            data_type,
            result,
        }))
    }
}

/// Whether `expr` has no FILTER clause. DataFusion keeps the clause in a private
/// field and its accessor in a trait it does not export; its derived `Debug` ends
/// with the field.
fn without_filter(expr: &PlainAggregateWindowExpr) -> bool {
    format!("{expr:?}").ends_with("filter: None }")
}

/// A `BoundedWindowAggExec` of running aggregates, computed in one pass (see the
/// module docs).
#[derive(Debug)]
pub(crate) struct RunningWindowExec {
    window: Arc<BoundedWindowAggExec>,
    partition_by: Vec<Arc<dyn PhysicalExpr>>,
    aggregates: Vec<Running>,
    metrics: ExecutionPlanMetricsSet,
}

impl RunningWindowExec {
    /// The operator for `window`, if it computes all of its expressions: their
    /// input sorted on the same PARTITION BY keys.
    fn try_new(window: Arc<BoundedWindowAggExec>) -> DfResult<Option<Self>> {
        let exprs = window.window_expr();
        let Some(first) = exprs.first() else {
            return Ok(None);
        };
        if window.input_order_mode != InputOrderMode::Sorted {
            return Ok(None);
        }
        let partition_by = first.partition_by().to_vec();
        let same_partitions = exprs.iter().all(|e| {
            e.partition_by().len() == partition_by.len()
                && e.partition_by()
                    .iter()
                    .zip(&partition_by)
                    .all(|(a, b)| a == b)
        });
        if !same_partitions {
            return Ok(None);
        }
        let input = window.input().schema();
        let mut aggregates = Vec::with_capacity(exprs.len());
        for e in exprs {
            match Running::of(e, &input)? {
                Some(running) => aggregates.push(running),
                None => return Ok(None),
            }
        }
        Ok(Some(RunningWindowExec {
            window,
            partition_by,
            aggregates,
            metrics: ExecutionPlanMetricsSet::new(),
        }))
    }
}

impl DisplayAs for RunningWindowExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "RunningWindowExec: wraps ")?;
        self.window.fmt_as(t, f)
    }
}

impl ExecutionPlan for RunningWindowExec {
    fn name(&self) -> &str {
        "RunningWindowExec"
    }

    super::operator::wrapped_plan_methods!(window);

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        options: ReplaceChildrenOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let window = Arc::new(replace_wrapped_children(&self.window, children, options)?);
        match RunningWindowExec::try_new(window.clone())? {
            Some(exec) => Ok(Arc::new(exec)),
            // Its input no longer sorted as it needs: DataFusion's window runs.
            None => Ok(window),
        }
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
        let input = self.window.input().execute(partition, context)?;
        let input_schema = self.window.input().schema();
        let fields = self
            .partition_by
            .iter()
            .map(|e| {
                Ok(SortField::new_with_options(
                    e.data_type(&input_schema)?,
                    SortOptions::default(),
                ))
            })
            .collect::<DfResult<Vec<_>>>()?;
        let mut state = RunState {
            schema: self.schema(),
            partition_by: self.partition_by.clone(),
            keys: RowConverter::new(fields)?,
            last_key: None,
            aggregates: self
                .aggregates
                .iter()
                .map(|a| (a.clone(), Acc::default()))
                .collect(),
        };
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let stream = input.map(move |batch| {
            let batch = batch?;
            let timer = baseline.elapsed_compute().timer();
            let out = state.next(&batch);
            timer.done();
            let out = out?;
            baseline.record_output(out.num_rows());
            Ok(out)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema(),
            stream,
        )))
    }
}

/// A running aggregate's state at the last row read.
#[derive(Debug, Default, Clone)]
struct Acc {
    /// Sum, minimum or maximum so far: the last row's result, one row of the
    /// aggregate's type (null while the partition had only nulls).
    value: Option<ArrayRef>,
    /// Non-null values so far (count's result).
    count: i64,
}

/// The state of one partition's stream.
struct RunState {
    schema: SchemaRef,
    partition_by: Vec<Arc<dyn PhysicalExpr>>,
    keys: RowConverter,
    /// The PARTITION BY values of the last row read.
    last_key: Option<OwnedRow>,
    aggregates: Vec<(Running, Acc)>,
}

impl RunState {
    /// `batch` with each running aggregate's column appended.
    fn next(&mut self, batch: &RecordBatch) -> DfResult<RecordBatch> {
        let rows = batch.num_rows();
        let starts = self.partition_starts(batch)?;
        let mut columns = batch.columns().to_vec();
        for (running, acc) in &mut self.aggregates {
            let values = running.argument.evaluate(batch)?.into_array(rows)?;
            let values = values.as_ref();
            let column: ArrayRef = match (running.kind, &running.data_type) {
                (Kind::Count, _) => Arc::new(count(values, &starts, acc)),
                (kind, DataType::Int64) => {
                    Arc::new(combine::<Int64Type>(values, &starts, acc, kind)?)
                }
                (kind, DataType::Float64) => {
                    Arc::new(combine::<Float64Type>(values, &starts, acc, kind)?)
                }
                (kind, DataType::Decimal128(..)) => Arc::new(
                    combine::<Decimal128Type>(values, &starts, acc, kind)?
                        .with_data_type(running.result.clone()),
                ),
                (_, other) => {
                    return Err(DataFusionError::Internal(format!(
                        "RunningWindowExec got a {other} argument"
                    )))
                }
            };
            columns.push(column);
        }
        Ok(RecordBatch::try_new(self.schema.clone(), columns)?)
    }

    /// For each row of `batch`, whether it starts a new partition (the first row of
    /// the stream continues none, and finds every state empty).
    fn partition_starts(&mut self, batch: &RecordBatch) -> DfResult<Vec<bool>> {
        let rows = batch.num_rows();
        if self.partition_by.is_empty() || rows == 0 {
            return Ok(vec![false; rows]);
        }
        let keys = self
            .partition_by
            .iter()
            .map(|e| e.evaluate(batch)?.into_array(rows))
            .collect::<DfResult<Vec<_>>>()?;
        let converted = self.keys.convert_columns(&keys)?;
        let mut starts = Vec::with_capacity(rows);
        starts.push(
            self.last_key
                .as_ref()
                .is_some_and(|last| last.row() != converted.row(0)),
        );
        for i in 1..rows {
            starts.push(converted.row(i) != converted.row(i - 1));
        }
        self.last_key = Some(converted.row(rows - 1).owned());
        Ok(starts)
    }
}

/// The running count of non-null `values`.
fn count(values: &dyn Array, starts: &[bool], acc: &mut Acc) -> Int64Array {
    let counts: Vec<i64> = starts
        .iter()
        .enumerate()
        .map(|(i, &start)| {
            if start {
                *acc = Acc::default();
            }
            acc.count += i64::from(values.is_valid(i));
            acc.count
        })
        .collect();
    Int64Array::from(counts)
}

/// The running sum, minimum or maximum of `values` (as DataFusion's accumulators
/// combine them: wrapping sums, floats in total order), null until a partition's
/// first non-null value.
fn combine<T>(
    values: &dyn Array,
    starts: &[bool],
    acc: &mut Acc,
    kind: Kind,
) -> DfResult<PrimitiveArray<T>>
where
    T: ArrowPrimitiveType,
{
    let values = values
        .as_any()
        .downcast_ref::<PrimitiveArray<T>>()
        .ok_or_else(|| {
            DataFusionError::Internal("RunningWindowExec: argument of another type".into())
        })?;
    let mut out: Vec<T::Native> = Vec::with_capacity(values.len());
    let mut valid = BooleanBufferBuilder::new(values.len());
    let mut current: Option<T::Native> = acc
        .value
        .as_ref()
        .and_then(|last| last.as_any().downcast_ref::<PrimitiveArray<T>>())
        .filter(|last| last.is_valid(0))
        .map(|last| last.value(0));
    for (i, &start) in starts.iter().enumerate() {
        if start {
            current = None;
        }
        if values.is_valid(i) {
            let v = values.value(i);
            current = Some(match (current, kind) {
                (None, _) => v,
                (Some(c), Kind::Sum) => c.add_wrapping(v),
                (Some(c), Kind::Min) => {
                    if v.is_lt(c) {
                        v
                    } else {
                        c
                    }
                }
                (Some(c), _) => {
                    if v.is_gt(c) {
                        v
                    } else {
                        c
                    }
                }
            });
        }
        out.push(current.unwrap_or_default());
        valid.append(current.is_some());
    }
    acc.value = Some(Arc::new(PrimitiveArray::<T>::from_iter([current])));
    Ok(PrimitiveArray::<T>::new(
        out.into(),
        Some(NullBuffer::new(valid.finish())),
    ))
}

#[cfg(test)]
mod tests {
    use polars::prelude::{df, AnyValue, DataFrame};

    use crate::frame::RemoteFrame;
    use crate::query::test_env::local_env;
    use crate::query::QuerySession;

    const ROWS: i64 = 20_000;
    /// Rows per partition (`g`): partitions span the 4,096-row chunks and batches.
    const PARTITION_ROWS: i64 = 1_500;

    /// Rows stored out of partition order; `v` and `f` have nulls, and the first
    /// rows of some partitions are null.
    fn table() -> DataFrame {
        let g: Vec<i64> = (0..ROWS)
            .map(|i| (i * 7919 % ROWS) / PARTITION_ROWS)
            .collect();
        let v: Vec<Option<i64>> = (0..ROWS)
            .map(|i| (i % 11 != 0).then_some(i % 1000 - 500))
            .collect();
        let f: Vec<Option<f64>> = (0..ROWS)
            .map(|i| (i % 7 != 0).then_some(i as f64 * 0.37 - 3000.0))
            .collect();
        df!("g" => g, "o" => (0..ROWS).collect::<Vec<_>>(), "v" => v, "f" => f).unwrap()
    }

    const RUNNING: &str = "ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW";

    fn session(t: &DataFrame) -> QuerySession {
        let env = local_env(1, 64 << 20);
        let frame = RemoteFrame::from_polars(&env, t).unwrap();
        let s = QuerySession::with_partitions(&env, 2).unwrap();
        s.register("t", &frame).unwrap();
        s
    }

    /// Row by row, in (g, o) order: the running sum, min and count of `v`, and the
    /// running max and sum of `f`, and the rows so far.
    #[allow(clippy::type_complexity)]
    fn expected(
        t: &DataFrame,
    ) -> Vec<(
        i64,
        Option<i64>,
        Option<i64>,
        i64,
        Option<f64>,
        Option<f64>,
        i64,
    )> {
        let get_i = |c: &str, i: usize| match t.column(c).unwrap().get(i).unwrap() {
            AnyValue::Int64(x) => Some(x),
            _ => None,
        };
        let get_f = |c: &str, i: usize| match t.column(c).unwrap().get(i).unwrap() {
            AnyValue::Float64(x) => Some(x),
            _ => None,
        };
        let mut order: Vec<usize> = (0..t.height()).collect();
        order.sort_by_key(|&i| (get_i("g", i), get_i("o", i)));
        let mut out = Vec::new();
        let mut last_g = None;
        let (mut sum, mut min, mut count, mut max_f, mut sum_f, mut rows) = (
            None::<i64>,
            None::<i64>,
            0i64,
            None::<f64>,
            None::<f64>,
            0i64,
        );
        for i in order {
            let g = get_i("g", i);
            if g != last_g {
                (sum, min, count, max_f, sum_f, rows) = (None, None, 0, None, None, 0);
                last_g = g;
            }
            if let Some(v) = get_i("v", i) {
                sum = Some(sum.map_or(v, |s| s + v));
                min = Some(min.map_or(v, |m| m.min(v)));
                count += 1;
            }
            if let Some(f) = get_f("f", i) {
                max_f = Some(max_f.map_or(f, |m| m.max(f)));
                sum_f = Some(sum_f.map_or(f, |s| s + f));
            }
            rows += 1;
            out.push((g.unwrap(), sum, min, count, max_f, sum_f, rows));
        }
        out
    }

    #[test]
    fn running_aggregates_equal_a_row_by_row_computation() {
        let t = table();
        let s = session(&t);
        let w = format!("OVER (PARTITION BY g ORDER BY o {RUNNING})");
        let sql = format!(
            "SELECT g, sum(v) {w} AS sv, min(v) {w} AS mv, count(v) {w} AS cv, \
             max(f) {w} AS xf, sum(f) {w} AS sf, count(*) {w} AS n, \
             CAST(sum(d) {w} AS DOUBLE) AS sd, CAST(min(d) {w} AS DOUBLE) AS md \
             FROM (SELECT *, CAST(v AS DECIMAL(12, 2)) AS d FROM t) ORDER BY g, o"
        );
        let plan = s.explain(&sql).unwrap();
        assert!(
            plan.contains("RunningWindowExec: wraps BoundedWindowAggExec"),
            "{plan}"
        );
        assert!(plan.contains("Decimal128"), "{plan}");
        let got = s.sql(&sql).unwrap().to_polars().unwrap();
        let want = expected(&t);
        assert_eq!(got.height(), want.len());
        let col = |c: &str| got.column(c).unwrap().as_materialized_series().clone();
        let (g, sv, mv, cv, xf, sf, n) = (
            col("g"),
            col("sv"),
            col("mv"),
            col("cv"),
            col("xf"),
            col("sf"),
            col("n"),
        );
        let int = |s: &polars::prelude::Series, i: usize| s.i64().unwrap().get(i);
        let float = |s: &polars::prelude::Series, i: usize| s.f64().unwrap().get(i);
        for (i, w) in want.iter().enumerate() {
            let row = (
                int(&g, i).unwrap(),
                int(&sv, i),
                int(&mv, i),
                int(&cv, i).unwrap(),
                float(&xf, i),
                float(&sf, i),
                int(&n, i).unwrap(),
            );
            assert_eq!(&row, w, "row {i}");
            // Decimal sums and minima: the same values.
            assert_eq!(float(&col("sd"), i), w.1.map(|x| x as f64), "row {i}");
            assert_eq!(float(&col("md"), i), w.2.map(|x| x as f64), "row {i}");
        }
        // Partitions whose first rows are null start with nulls.
        assert!(sv.null_count() > 0 && xf.null_count() > 0);
    }

    #[test]
    fn other_windows_stay_datafusions() {
        let t = table();
        let s = session(&t);
        for over in [
            // Not a running frame.
            "sum(v) OVER (PARTITION BY g ORDER BY o ROWS BETWEEN 2 PRECEDING AND CURRENT ROW)",
            // Peers share a value in a RANGE frame.
            "sum(v) OVER (PARTITION BY g ORDER BY o RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)",
            // Not an aggregate computed here.
            "avg(v) OVER (PARTITION BY g ORDER BY o ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)",
            // Distinct.
            "count(DISTINCT v) OVER (PARTITION BY g ORDER BY o ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)",
        ] {
            let plan = s.explain(&format!("SELECT g, {over} AS x FROM t")).unwrap();
            assert!(!plan.contains("RunningWindowExec"), "{over}\n{plan}");
        }
    }
}
