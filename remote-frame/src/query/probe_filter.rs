//! A join that only filters its probe side.
//!
//! Most joins of a fact table with a dimension only filter the facts:
//! `ss_sold_date_sk = d_date_sk AND d_year = 2000` keeps a year of sales, and nothing
//! of `date_dim` goes further. DataFusion's hash join still looks each probe key up,
//! lists the matching row pairs and gathers every output column by those indices
//! (q99's join with its dates: a quarter of its execution, most of it the gather).
//! Where the build side is held whole, has one integer key, no build column is
//! output and (for an inner join) no key comes twice, the join's output is the probe
//! rows whose key is among the build keys: a bit test a row over a bitmap of the
//! keys, and one filtered copy of the output columns into batches of the session's
//! size. Semi joins (probe rows with a match) need no unique keys, anti joins (probe
//! rows without) keep null keys, which match nothing.

use std::sync::Arc;

use arrow_array::{Array, ArrayRef, BooleanArray, RecordBatch};
use arrow_schema::{ArrowError, SchemaRef};
use datafusion::arrow::compute::BatchCoalescer;
use datafusion::common::{JoinType, NullEquality, Result as DfResult};
use datafusion::execution::memory_pool::MemoryPool;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{ExecutionPlan, SendableRecordBatchStream};
use futures::StreamExt;

use super::key_bounds::{bounded_type, KeySet};
use super::operator::limit_rows;

/// The widest range of build keys a probe filter's bitmap covers: 2^22 bits,
/// 512 KiB (`customer_demographics`' 1.9 M keys take 2^21).
const PROBE_FILTER_MOST_BITS: u64 = 1 << 22;

/// What a join's output is, as a filter of its probe rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kept {
    /// The probe rows with a matching build key (inner joins over unique build
    /// keys, right semi joins).
    Matched,
    /// The probe rows without (right anti joins).
    Unmatched,
}

/// A join whose output is a filter of its probe rows: its keys and output columns.
#[derive(Debug, Clone)]
pub(crate) struct ProbeFilterShape {
    build_key: Arc<dyn PhysicalExpr>,
    probe_key: Arc<dyn PhysicalExpr>,
    /// The probe columns output, in order.
    output: Vec<usize>,
    kept: Kept,
    /// Whether the build keys must be unique (an inner join outputs a probe row once
    /// per match).
    unique: bool,
    schema: SchemaRef,
    fetch: Option<usize>,
}

impl ProbeFilterShape {
    /// The shape of `join` (its left side the build side) if its output is a filter
    /// of its probe rows once its build keys are known: one key of one integer or
    /// date type on both sides, no filter, nulls equal to nothing, and only probe
    /// columns output.
    pub(crate) fn of(join: &HashJoinExec) -> Option<Self> {
        let [(build_key, probe_key)] = join.on() else {
            return None;
        };
        if join.filter().is_some()
            || join.null_aware
            || join.null_equality() != NullEquality::NullEqualsNothing
        {
            return None;
        }
        let (left, right) = (join.left().schema(), join.right().schema());
        let key_type = build_key.data_type(&left).ok()?;
        if !bounded_type(&key_type) || probe_key.data_type(&right).ok()? != key_type {
            return None;
        }
        let projection = join.projection.as_deref();
        let (kept, unique, output) = match join.join_type() {
            // The join's columns are the build side's, then the probe side's.
            JoinType::Inner => {
                let probe_columns = projection?
                    .iter()
                    .map(|&c| c.checked_sub(left.fields().len()))
                    .collect::<Option<Vec<_>>>()?;
                (Kept::Matched, true, probe_columns)
            }
            JoinType::RightSemi | JoinType::RightAnti => {
                let all = || (0..right.fields().len()).collect();
                let kept = match join.join_type() {
                    JoinType::RightSemi => Kept::Matched,
                    _ => Kept::Unmatched,
                };
                (kept, false, projection.map_or_else(all, <[usize]>::to_vec))
            }
            _ => return None,
        };
        if output.is_empty() {
            // A batch of no columns carries its row count beside them, which the
            // coalescer does not.
            return None;
        }
        Some(ProbeFilterShape {
            build_key: build_key.clone(),
            probe_key: probe_key.clone(),
            output,
            kept,
            unique,
            schema: join.schema(),
            fetch: join.fetch(),
        })
    }

    /// The filter over the build rows `held` (all of them), its bitmap reserved
    /// from `pool`; `None` if they do not make the join a filter: an inner join's
    /// key that comes twice, no non-null key, keys over too wide a range, or no
    /// room for the bitmap.
    pub(crate) fn over(
        &self,
        held: &[RecordBatch],
        pool: &Arc<dyn MemoryPool>,
    ) -> DfResult<Option<Arc<ProbeFilter>>> {
        let keys = held
            .iter()
            .map(|b| self.build_key.evaluate(b)?.into_array(b.num_rows()))
            .collect::<DfResult<Vec<ArrayRef>>>()?;
        let Some((set, repeated)) =
            KeySet::exact(self.probe_key.clone(), &keys, PROBE_FILTER_MOST_BITS, pool)?
        else {
            return Ok(None);
        };
        if repeated && self.unique {
            return Ok(None);
        }
        Ok(Some(Arc::new(ProbeFilter {
            shape: self.clone(),
            set,
        })))
    }
}

/// A join run as a filter of its probe rows (see the module docs).
#[derive(Debug)]
pub(crate) struct ProbeFilter {
    shape: ProbeFilterShape,
    set: Arc<KeySet>,
}

impl ProbeFilter {
    /// Which rows of the probe batch `batch` the join outputs.
    fn kept(&self, batch: &RecordBatch) -> DfResult<BooleanArray> {
        let matched = self.set.mask(batch)?;
        // A null key matches nothing: never kept as matched, always as unmatched.
        let values = match (self.shape.kept, matched.nulls()) {
            (Kept::Matched, Some(valid)) => matched.values() & valid.inner(),
            (Kept::Matched, None) => matched.values().clone(),
            (Kept::Unmatched, Some(valid)) => &!matched.values() | &!valid.inner(),
            (Kept::Unmatched, None) => !matched.values(),
        };
        Ok(BooleanArray::new(values, None))
    }

    /// The join's output over probe side `probe`, in batches of `batch_rows` rows
    /// (the last may be shorter), up to the join's fetch.
    pub(crate) fn stream(
        self: Arc<Self>,
        probe: SendableRecordBatchStream,
        batch_rows: usize,
    ) -> SendableRecordBatchStream {
        let schema = self.shape.schema.clone();
        let fetch = self.shape.fetch;
        let coalescer = BatchCoalescer::new(schema.clone(), batch_rows.max(1));
        let batches = futures::stream::unfold(Some((probe, coalescer)), move |state| {
            let filter = self.clone();
            async move {
                let (mut probe, mut coalescer) = state?;
                loop {
                    if let Some(batch) = coalescer.next_completed_batch() {
                        return Some((Ok(batch), Some((probe, coalescer))));
                    }
                    match probe.next().await {
                        Some(Ok(batch)) => {
                            if let Err(e) = filter.push(&mut coalescer, &batch) {
                                return Some((Err(e), None));
                            }
                        }
                        Some(Err(e)) => return Some((Err(e), None)),
                        None => {
                            if let Err(e) = coalescer.finish_buffered_batch() {
                                return Some((Err(e.into()), None));
                            }
                            return coalescer.next_completed_batch().map(|b| (Ok(b), None));
                        }
                    }
                }
            }
        });
        match fetch {
            Some(rows) => Box::pin(RecordBatchStreamAdapter::new(
                schema,
                limit_rows(batches, rows),
            )),
            None => Box::pin(RecordBatchStreamAdapter::new(schema, batches)),
        }
    }

    /// Filters the probe batch `batch` into `coalescer`.
    fn push(&self, coalescer: &mut BatchCoalescer, batch: &RecordBatch) -> DfResult<()> {
        let kept = self.kept(batch)?;
        let columns = self
            .shape
            .output
            .iter()
            .map(|&c| {
                batch.columns().get(c).cloned().ok_or_else(|| {
                    ArrowError::SchemaError(format!(
                        "a probe batch of {} columns has no column {c}",
                        batch.num_columns()
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let out = RecordBatch::try_new(self.shape.schema.clone(), columns)?;
        coalescer.push_batch_with_filter(out, &kept)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    use arrow_array::Int64Array;
    use arrow_schema::{DataType, Field, Schema};
    use datafusion::execution::memory_pool::UnboundedMemoryPool;
    use datafusion::physical_expr::expressions::col;
    use futures::TryStreamExt;

    /// Probe batches of keys `0..rows` and values `10 * key`, `per` rows a batch.
    fn probe(rows: i64, per: i64) -> (SchemaRef, SendableRecordBatchStream) {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("v", DataType::Int64, false),
        ]));
        let batches: Vec<DfResult<RecordBatch>> = (0..rows)
            .step_by(per as usize)
            .map(|from| {
                let keys: Vec<i64> = (from..(from + per).min(rows)).collect();
                let values: Vec<i64> = keys.iter().map(|k| 10 * k).collect();
                Ok(RecordBatch::try_new(
                    schema.clone(),
                    vec![
                        Arc::new(Int64Array::from(keys)),
                        Arc::new(Int64Array::from(values)),
                    ],
                )?)
            })
            .collect();
        let stream = RecordBatchStreamAdapter::new(schema.clone(), futures::stream::iter(batches));
        (schema, Box::pin(stream))
    }

    #[test]
    fn a_probe_filter_outputs_matching_rows_in_order_in_whole_batches_up_to_its_fetch() {
        let (schema, probe) = probe(100, 7);
        let key = col("k", &schema).unwrap();
        let out = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
        let shape = ProbeFilterShape {
            build_key: key.clone(),
            probe_key: key,
            output: vec![1],
            kept: Kept::Matched,
            unique: true,
            schema: out,
            fetch: Some(12),
        };
        // Every third key from 0 to 60: 21 keys, of which the fetch keeps 12.
        let build: RecordBatch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from((0..=60).step_by(3).collect::<Vec<i64>>())),
                Arc::new(Int64Array::from(vec![0; 21])),
            ],
        )
        .unwrap();
        let pool: Arc<dyn MemoryPool> = Arc::new(UnboundedMemoryPool::default());
        let filter = shape.over(&[build], &pool).unwrap().unwrap();
        // Keys 0 to 60: a bitmap of 64 bits, reserved while the filter lives.
        assert_eq!(pool.reserved(), 8);
        let batches: Vec<RecordBatch> =
            futures::executor::block_on(filter.stream(probe, 5).try_collect::<Vec<_>>()).unwrap();
        let sizes: Vec<usize> = batches.iter().map(RecordBatch::num_rows).collect();
        assert_eq!(sizes, [5, 5, 2]);
        let values: Vec<i64> = batches
            .iter()
            .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
            .collect();
        let want: Vec<i64> = (0..12).map(|i| 30 * i).collect();
        assert_eq!(values, want);
        assert_eq!(pool.reserved(), 0);
    }
}
