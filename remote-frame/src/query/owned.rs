//! Batches that own what they are sized as.
//!
//! A slice of an Arrow array keeps (and reports, in `get_array_memory_size` and in
//! DataFusion's reservations) all of the buffers it points into: a 8,192-row slice of
//! a 128 Ki-row scanned chunk is sized as the whole chunk, and a batch decoded from a
//! spill file as the whole remote block it was read in, once per column. Operators
//! reserving for such batches reserve many times what the rows need, spill early
//! and split partitions again and again; operators keeping them keep whole chunks
//! alive. Copying out just the rows makes the size true on both counts.

use std::sync::Arc;

use arrow_array::{
    make_array, Array, ArrayRef, RecordBatch, RecordBatchOptions, StringViewArray, UInt32Array,
};
use arrow_data::transform::MutableArrayData;
use arrow_schema::SchemaRef;
use datafusion::arrow::compute::{cast, take};
use datafusion::common::Result as DfResult;

use crate::views::gather_views;

/// `batch` with every column copied into buffers of its own rows.
pub(crate) fn owned_batch(batch: &RecordBatch) -> DfResult<RecordBatch> {
    map_columns(batch, owned_column)
}

/// `batch` with its view arrays compacted to the strings they show; other columns
/// as they are (a `take` already copied them).
pub(crate) fn compact_views(batch: &RecordBatch) -> DfResult<RecordBatch> {
    map_columns(batch, |c| Ok(compact_view(c).unwrap_or_else(|| c.clone())))
}

/// `batch`, copied into buffers of its own rows when the buffers it points into are
/// much larger than its rows (a slice of a partial aggregate's state, a batch decoded
/// from a spill block): an operator about to hold it, and to lend DataFusion the memory
/// it holds it under, then counts what DataFusion will (`get_array_memory_size`) and
/// what the rows need alike. Others are passed on as they are.
pub(crate) fn owned_if_shared(batch: RecordBatch) -> DfResult<RecordBatch> {
    if is_shared(&batch) {
        owned_batch(&batch)
    } else {
        Ok(batch)
    }
}

/// `batch` with its view arrays compacted (see [`compact_views`]) when the buffers it
/// points into are much larger than its rows: for batches whose other columns are
/// already their own (interleaved, taken).
pub(crate) fn compact_views_if_shared(batch: RecordBatch) -> DfResult<RecordBatch> {
    if is_shared(&batch) {
        compact_views(&batch)
    } else {
        Ok(batch)
    }
}

/// Whether `batch` is sized (`get_array_memory_size`) at more than its rows and a
/// quarter.
fn is_shared(batch: &RecordBatch) -> bool {
    let rows = rows_bytes(batch);
    batch.get_array_memory_size() > rows + rows / 4 + SHARED_SLACK
}

/// What a batch may hold beyond its rows and a quarter before [`owned_if_shared`]
/// copies it: buffers' rounding to 64 bytes, a few columns' worth.
const SHARED_SLACK: usize = 4 << 10;

/// The bytes `batch`'s rows take: what [`owned_batch`] of it would hold, however
/// much of the buffers it points into lie outside its rows. For operators that
/// account for batches they are handed (slices of a sorted run, say) without
/// copying them.
pub(crate) fn rows_bytes(batch: &RecordBatch) -> usize {
    batch.columns().iter().map(column_rows_bytes).sum()
}

fn column_rows_bytes(array: &ArrayRef) -> usize {
    if let Some(views) = array.as_any().downcast_ref::<StringViewArray>() {
        // The views, the strings too long to inline (no more than the buffers hold:
        // views may share a string, as a scanned chunk's repeated values do), and the
        // validity bits.
        let buffers: usize = views.data_buffers().iter().map(|b| b.len()).sum();
        return views.len() * 16
            + views.total_buffer_bytes_used().min(buffers)
            + views.nulls().map_or(0, |n| n.len().div_ceil(8));
    }
    array
        .to_data()
        .get_slice_memory_size()
        .unwrap_or_else(|_| array.get_array_memory_size())
}

/// `batch` with each column replaced by `f` of it.
fn map_columns(
    batch: &RecordBatch,
    f: impl FnMut(&ArrayRef) -> DfResult<ArrayRef>,
) -> DfResult<RecordBatch> {
    map_columns_to(batch, batch.num_rows(), f)
}

/// A batch of `rows` rows whose columns are `f` of `batch`'s.
fn map_columns_to(
    batch: &RecordBatch,
    rows: usize,
    f: impl FnMut(&ArrayRef) -> DfResult<ArrayRef>,
) -> DfResult<RecordBatch> {
    let columns = batch
        .columns()
        .iter()
        .map(f)
        .collect::<DfResult<Vec<ArrayRef>>>()?;
    batch_of(batch.schema(), columns, rows)
}

/// A batch of `schema` with `columns` and `rows` rows (a batch without columns,
/// `count(*)` over a scan, still has its rows).
fn batch_of(schema: SchemaRef, columns: Vec<ArrayRef>, rows: usize) -> DfResult<RecordBatch> {
    let options = RecordBatchOptions::new().with_row_count(Some(rows));
    Ok(RecordBatch::try_new_with_options(
        schema, columns, &options,
    )?)
}

/// A view array compacted: a copy of its views would still refer to all of its
/// data buffers. Its long strings go to one buffer of exactly their size (Arrow's
/// `gc` grows blocks by doubling: a batch of 8,192 rows needing 0.3 MB came to
/// 1.2 MB). `None` for other arrays.
fn compact_view(array: &ArrayRef) -> Option<ArrayRef> {
    let views = array.as_any().downcast_ref::<StringViewArray>()?;
    let rows: Vec<u32> = (0..views.len() as u32).collect();
    Some(Arc::new(gather_views(views, &rows)?))
}

/// The rows `rows` of `batch`, owning their values: a view array's pieces would
/// otherwise keep, and be sized and spilled as, all of its data buffers. Other
/// columns (and strings too many for one buffer) are copied by `take`.
pub(crate) fn take_rows(batch: &RecordBatch, rows: &[u32]) -> DfResult<RecordBatch> {
    take_rows_as(batch, rows, &batch.schema())
}

/// The rows `rows` of `batch` as a batch of `schema`: [`take_rows`], with each column
/// whose type `schema` gives otherwise cast to it (a column of views to plain strings,
/// say, copied once).
pub(crate) fn take_rows_as(
    batch: &RecordBatch,
    rows: &[u32],
    schema: &SchemaRef,
) -> DfResult<RecordBatch> {
    let indices = UInt32Array::from(rows.to_vec());
    let columns = batch
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(column, field)| {
            if column.data_type() == field.data_type() {
                return take_rows_of(column, rows, &indices);
            }
            Ok(cast(&take(column, &indices, None)?, field.data_type())?)
        })
        .collect::<DfResult<Vec<ArrayRef>>>()?;
    batch_of(schema.clone(), columns, rows.len())
}

/// `batch` as a batch of `schema`, whose fields are `batch`'s with some types
/// changed: those columns are cast.
pub(crate) fn cast_to(batch: RecordBatch, schema: &SchemaRef) -> DfResult<RecordBatch> {
    if batch.schema().fields() == schema.fields() {
        return Ok(batch);
    }
    let columns = batch
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(column, field)| Ok(cast(column, field.data_type())?))
        .collect::<DfResult<Vec<ArrayRef>>>()?;
    batch_of(schema.clone(), columns, batch.num_rows())
}

/// The rows `rows` of `column`, owning their values (see [`take_rows`]).
fn take_rows_of(column: &ArrayRef, rows: &[u32], indices: &UInt32Array) -> DfResult<ArrayRef> {
    if let Some(views) = column.as_any().downcast_ref::<StringViewArray>() {
        if let Some(gathered) = gather_views(views, rows) {
            return Ok(Arc::new(gathered));
        }
    }
    Ok(take(column, indices, None)?)
}

fn owned_column(array: &ArrayRef) -> DfResult<ArrayRef> {
    if let Some(compact) = compact_view(array) {
        return Ok(compact);
    }
    let data = array.to_data();
    let mut copy = MutableArrayData::new(vec![&data], false, array.len());
    copy.try_extend(0, 0, array.len())?;
    Ok(make_array(copy.freeze()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::builder::StringViewBuilder;
    use arrow_array::{Int64Array, StringArray};
    use arrow_schema::{DataType, Field, Schema};

    #[test]
    fn an_owned_slice_is_sized_as_its_rows_and_keeps_its_values() {
        let n = 100_000;
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("s", DataType::Utf8, false),
        ]));
        let keys = Int64Array::from_iter((0..n).map(|i| (i % 7 != 0).then_some(i)));
        let names = StringArray::from_iter_values((0..n).map(|i| format!("name-{i}")));
        let batch = RecordBatch::try_new(schema, vec![Arc::new(keys), Arc::new(names)]).unwrap();
        let slice = batch.slice(50_000, 1_000);
        let owned = owned_batch(&slice).unwrap();
        assert_eq!(owned, slice);
        assert!(slice.get_array_memory_size() > 50 * owned.get_array_memory_size());
        assert!(owned.get_array_memory_size() < 40_000);
        // The rows' bytes: 1,000 keys, their validity and offsets, "name-5xxxx".
        assert_eq!(rows_bytes(&slice), 8_000 + 125 + 4_004 + 10_000);
        let views = RecordBatch::try_from_iter([(
            "v",
            Arc::new(StringViewArray::from_iter_values(
                (0..n).map(|i| format!("a string longer than twelve bytes {i}")),
            )) as ArrayRef,
        )])
        .unwrap();
        let long = views.slice(0, 10);
        assert_eq!(rows_bytes(&long), 10 * 16 + 10 * 35);
        let compacted = compact_views(&views.slice(0, 8_192)).unwrap();
        assert_eq!(compacted, views.slice(0, 8_192));
        let tight = rows_bytes(&compacted);
        assert!(
            compacted.get_array_memory_size() < tight + tight / 8,
            "{tight}"
        );
        assert!(long.get_array_memory_size() > 1_000 * rows_bytes(&long));
        // Views sharing one string: its bytes once, not once per view.
        let country = "a country of many customers";
        let mut builder = StringViewBuilder::new().with_deduplicate_strings();
        for _ in 0..1_000 {
            builder.append_value(country);
        }
        let shared =
            RecordBatch::try_from_iter([("c", Arc::new(builder.finish()) as ArrayRef)]).unwrap();
        assert_eq!(rows_bytes(&shared), 1_000 * 16 + country.len());
    }

    #[test]
    fn only_a_batch_pointing_into_much_more_than_its_rows_is_copied() {
        let n = 100_000;
        let batch = RecordBatch::try_from_iter([(
            "k",
            Arc::new(Int64Array::from_iter_values(0..n)) as ArrayRef,
        )])
        .unwrap();
        let whole = owned_if_shared(batch.clone()).unwrap();
        // Not copied: the same buffer.
        assert_eq!(
            whole.column(0).to_data().buffers()[0].as_ptr(),
            batch.column(0).to_data().buffers()[0].as_ptr()
        );
        let slice = batch.slice(1_000, 8_192);
        let owned = owned_if_shared(slice.clone()).unwrap();
        assert_eq!(owned, slice);
        // The slice is sized as the whole column, its copy as its rows.
        assert!(slice.get_array_memory_size() >= 8 * n as usize);
        assert!(owned.get_array_memory_size() <= rows_bytes(&slice) + SHARED_SLACK);
        assert!(owned.get_array_memory_size() < 8 * 8_192 + 1_024);
    }

    #[test]
    fn a_batch_without_columns_keeps_its_row_count() {
        let options = RecordBatchOptions::new().with_row_count(Some(1_000));
        let batch =
            RecordBatch::try_new_with_options(Arc::new(Schema::empty()), vec![], &options).unwrap();
        assert_eq!(owned_batch(&batch.slice(100, 300)).unwrap().num_rows(), 300);
    }
}
