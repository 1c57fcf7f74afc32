//! Skewed keys in the spilling operators: what they share once a partition at the
//! last level of re-partitioning still does not fit, which happens when one key value
//! is more frequent than the budget allows (hashing with a new seed cannot split a
//! single key).
//!
//! - [`DistinctKeys`] keeps one row per key value: a join whose build side
//!   contributes only its keys needs no more.
//! - [`most_frequent_key`] counts a partition's key values and prints the most
//!   frequent one `col=value`, for [`Error::Skew`].
//! - [`memory_error_as`] turns a wrapped operator's out-of-memory failure into
//!   another error (a spilling aggregate's last level: DataFusion's aggregate holds a
//!   group's state, which may or may not grow with its rows).

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::Schema;
use datafusion::arrow::row::{RowConverter, Rows, SortField};
use datafusion::arrow::util::display::array_value_to_string;
use datafusion::common::{DataFusionError, Result as DfResult};
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::SendableRecordBatchStream;
use futures::StreamExt;

use super::owned::take_rows;
use crate::error::Error;

/// Bytes a key in a hash set or map costs beyond its encoded row (the entry, the
/// allocation's header, the table's spare capacity).
const ENTRY_OVERHEAD: usize = 48;

/// The key columns of `batch`.
fn key_arrays(keys: &[Arc<dyn PhysicalExpr>], batch: &RecordBatch) -> DfResult<Vec<ArrayRef>> {
    let rows = batch.num_rows();
    keys.iter()
        .map(|k| k.evaluate(batch)?.into_array(rows))
        .collect()
}

/// A converter of `keys` (over `schema`) to comparable byte rows.
fn key_converter(keys: &[Arc<dyn PhysicalExpr>], schema: &Schema) -> DfResult<RowConverter> {
    let fields = keys
        .iter()
        .map(|k| Ok(SortField::new(k.data_type(schema)?)))
        .collect::<DfResult<Vec<_>>>()?;
    Ok(RowConverter::new(fields)?)
}

/// The key rows of `batch`.
fn key_rows(
    converter: &RowConverter,
    keys: &[Arc<dyn PhysicalExpr>],
    batch: &RecordBatch,
) -> DfResult<Rows> {
    Ok(converter.convert_columns(&key_arrays(keys, batch)?)?)
}

/// Rows with key values not seen before.
pub(crate) struct DistinctKeys {
    keys: Vec<Arc<dyn PhysicalExpr>>,
    converter: RowConverter,
    seen: HashSet<Box<[u8]>>,
}

impl DistinctKeys {
    /// Over batches of `schema`, keyed by `keys`.
    pub(crate) fn new(keys: Vec<Arc<dyn PhysicalExpr>>, schema: &Schema) -> DfResult<Self> {
        Ok(DistinctKeys {
            converter: key_converter(&keys, schema)?,
            keys,
            seen: HashSet::new(),
        })
    }

    /// The rows of `batch` whose key values no earlier row had (`None` if there are
    /// none), and the bytes their keys added to the set of keys seen.
    pub(crate) fn filter(&mut self, batch: &RecordBatch) -> DfResult<(Option<RecordBatch>, usize)> {
        if batch.num_rows() == 0 {
            return Ok((None, 0));
        }
        let rows = key_rows(&self.converter, &self.keys, batch)?;
        let mut new = Vec::new();
        let mut bytes = 0;
        for (i, row) in rows.iter().enumerate() {
            let key = row.as_ref();
            if !self.seen.contains(key) {
                bytes += key.len() + ENTRY_OVERHEAD;
                self.seen.insert(key.into());
                new.push(i as u32);
            }
        }
        Ok(match new.len() {
            0 => (None, bytes),
            n if n == batch.num_rows() => (Some(batch.clone()), bytes),
            _ => (Some(take_rows(batch, &new)?), bytes),
        })
    }
}

/// The most frequent key value of a partition.
#[derive(Debug)]
pub(crate) struct TopKey {
    /// Printed `col=value, ...`.
    pub(crate) key: String,
    /// Bytes of its rows (each row counted at its batch's average).
    pub(crate) bytes: u64,
}

/// The most frequent value of `keys` in `input`, counted batch by batch under
/// `reservation` (`None` for an input without rows). The counts take memory per
/// distinct key: when `reservation` cannot grow, keys not seen yet are no longer
/// counted, and the answer is the most frequent of those counted (a key too
/// frequent for the budget turns up early in any case).
pub(crate) async fn most_frequent_key(
    mut input: SendableRecordBatchStream,
    keys: &[Arc<dyn PhysicalExpr>],
    reservation: MemoryReservation,
) -> DfResult<Option<TopKey>> {
    let converter = key_converter(keys, &input.schema())?;
    // Key row -> (rows, bytes).
    let mut counts: HashMap<Box<[u8]>, (u64, u64)> = HashMap::new();
    let mut full = false;
    while let Some(batch) = input.next().await {
        let batch = batch?;
        let rows = batch.num_rows();
        if rows == 0 {
            continue;
        }
        let row_bytes = (batch.get_array_memory_size() / rows) as u64;
        for row in key_rows(&converter, keys, &batch)?.iter() {
            let key = row.as_ref();
            if let Some((n, bytes)) = counts.get_mut(key) {
                *n += 1;
                *bytes += row_bytes;
            } else if !full {
                if reservation.try_grow(key.len() + ENTRY_OVERHEAD).is_ok() {
                    counts.insert(key.into(), (1, row_bytes));
                } else {
                    full = true;
                }
            }
        }
    }
    let Some((key, (_, bytes))) = counts.into_iter().max_by_key(|(_, (n, _))| *n) else {
        return Ok(None);
    };
    let values = converter.convert_rows([converter.parser().parse(&key)])?;
    let printed = keys
        .iter()
        .zip(&values)
        .map(|(k, v)| Ok(format!("{}={}", key_name(k), value_text(v)?)))
        .collect::<DfResult<Vec<_>>>()?;
    Ok(Some(TopKey {
        key: printed.join(", "),
        bytes,
    }))
}

/// A key expression's name: a column's own, else the expression printed.
fn key_name(key: &Arc<dyn PhysicalExpr>) -> String {
    match key.downcast_ref::<Column>() {
        Some(c) => c.name().to_owned(),
        None => key.to_string(),
    }
}

/// The first value of `array`, printed (`null` for a null).
fn value_text(array: &ArrayRef) -> DfResult<String> {
    if array.is_null(0) {
        return Ok("null".into());
    }
    Ok(array_value_to_string(array, 0)?)
}

/// [`Error::Skew`] carried through DataFusion (the session takes it out again).
pub(crate) fn skew_error(
    kernel: &'static str,
    partition: &str,
    level: u32,
    top: TopKey,
    budget: usize,
) -> DataFusionError {
    DataFusionError::External(Box::new(Error::Skew {
        kernel,
        partition: if partition.is_empty() {
            "/".into()
        } else {
            partition.to_owned()
        },
        level,
        key: top.key,
        bytes: top.bytes,
        budget: budget as u64,
    }))
}

/// Whether `e` is a reservation the memory pool refused, however wrapped.
pub(crate) fn is_memory_error(e: &DataFusionError) -> bool {
    matches!(e.find_root(), DataFusionError::ResourcesExhausted(_))
}

/// `input`, except that when it fails for memory, it is dropped first (giving its
/// memory back) and the error is the one `replace` makes of the original.
pub(crate) fn memory_error_as<F, Fut>(
    input: SendableRecordBatchStream,
    replace: F,
) -> SendableRecordBatchStream
where
    F: FnOnce(DataFusionError) -> Fut + Send + 'static,
    Fut: Future<Output = DataFusionError> + Send + 'static,
{
    let schema = input.schema();
    let stream = futures::stream::unfold(Some((input, replace)), |state| async move {
        let (mut input, replace) = state?;
        match input.next().await {
            Some(Err(e)) if is_memory_error(&e) => {
                drop(input);
                Some((Err(replace(e).await), None))
            }
            Some(item) => Some((item, Some((input, replace)))),
            None => None,
        }
    });
    Box::pin(RecordBatchStreamAdapter::new(schema, stream))
}

#[cfg(test)]
mod tests {
    use arrow_array::{Int64Array, StringArray};
    use arrow_schema::{DataType, Field};
    use datafusion::execution::memory_pool::{GreedyMemoryPool, MemoryConsumer, MemoryPool};
    use datafusion::physical_plan::memory::MemoryStream;

    use super::*;

    fn batch(k: Vec<i64>, s: Vec<&str>) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("s", DataType::Utf8, false),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(k)),
                Arc::new(StringArray::from(s)),
            ],
        )
        .unwrap()
    }

    fn keys(schema: &Schema, names: &[&str]) -> Vec<Arc<dyn PhysicalExpr>> {
        names
            .iter()
            .map(|n| Arc::new(Column::new_with_schema(n, schema).unwrap()) as _)
            .collect()
    }

    #[test]
    fn distinct_keys_keep_the_first_row_of_each_key_across_batches() {
        let a = batch(vec![1, 2, 1, 3], vec!["a", "b", "c", "d"]);
        let b = batch(vec![3, 4, 4], vec!["e", "f", "g"]);
        let mut d = DistinctKeys::new(keys(&a.schema(), &["k"]), &a.schema()).unwrap();
        let (kept, bytes) = d.filter(&a).unwrap();
        let kept = kept.unwrap();
        assert_eq!(kept.num_rows(), 3);
        assert!(bytes > 0);
        let (kept, _) = d.filter(&b).unwrap();
        let s = kept.unwrap();
        let s = s.column(1).as_any().downcast_ref::<StringArray>().unwrap();
        assert_eq!(s.iter().flatten().collect::<Vec<_>>(), ["f"]);
        assert!(d.filter(&b).unwrap().0.is_none());
    }

    #[test]
    fn the_most_frequent_key_is_printed_col_equals_value() {
        let a = batch(vec![7, 2, 7], vec!["x", "y", "x"]);
        let b = batch(vec![7, 2, 5], vec!["x", "z", "x"]);
        let schema = a.schema();
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(1 << 20));
        let count = |names: &[&str]| {
            let input = Box::pin(
                MemoryStream::try_new(vec![a.clone(), b.clone()], schema.clone(), None).unwrap(),
            );
            let r = MemoryConsumer::new("test").register(&pool);
            futures::executor::block_on(most_frequent_key(input, &keys(&schema, names), r))
                .unwrap()
                .unwrap()
        };
        let top = count(&["k"]);
        assert_eq!(top.key, "k=7");
        assert!(top.bytes > 0);
        assert_eq!(count(&["k", "s"]).key, "k=7, s=x");
        assert_eq!(pool.reserved(), 0);
    }
}
