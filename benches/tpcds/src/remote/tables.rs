//! Base tables loaded into memory elements, each handed on as a [`Handoff`].

use std::collections::BTreeMap;
use std::time::Instant;

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, StringViewArray};
use datafusion::arrow::buffer::ScalarBuffer;
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::record_batch::RecordBatch;
use scad_remote_frame::RemoteFrame;
use serde::{Deserialize, Serialize};

use crate::data::DataSet;

use super::cluster::Cluster;
use super::error::{FrameContext, RemoteError};
use super::handoff::Handoff;

/// Base tables loaded into memory elements: one handoff per table.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TableHandoffs {
    /// Handoff per table name.
    pub tables: BTreeMap<String, Handoff>,
    /// Wall time of loading (Parquet read + writing to memory elements).
    pub load_secs: f64,
}

impl TableHandoffs {
    /// Bytes of the largest loaded table (the budget's reference).
    pub fn largest_bytes(&self) -> u64 {
        self.tables
            .values()
            .map(|h| h.frame.data_bytes())
            .max()
            .unwrap_or(0)
    }

    /// Bytes of all tables.
    pub fn total_bytes(&self) -> u64 {
        self.tables.values().map(|h| h.frame.data_bytes()).sum()
    }

    /// Opens every table (after checking its seal) in the cluster's env.
    ///
    /// # Errors
    /// [`RemoteError::Stale`] for a table whose memory no longer holds it; transport
    /// errors.
    pub fn open(&self, cluster: &Cluster) -> Result<BTreeMap<String, RemoteFrame>, RemoteError> {
        self.tables
            .iter()
            .map(|(name, h)| {
                let frame = h.open(cluster.env(), &format!("table {name}"))?;
                Ok((name.clone(), frame))
            })
            .collect()
    }

    /// Frees every table.
    ///
    /// # Errors
    /// Transport and allocator errors.
    pub fn free(&self, cluster: &Cluster) -> Result<(), RemoteError> {
        self.tables.values().try_for_each(|h| h.free(cluster))
    }
}

/// Reads every table of the data set (or only `only`, if given) from its Parquet file
/// and writes it to the cluster's memory elements.
///
/// # Errors
/// Data set errors (an unknown table among `only`); allocation and transport errors.
pub fn load_tables(
    cluster: &Cluster,
    set: &DataSet,
    only: Option<&[&str]>,
) -> Result<TableHandoffs, RemoteError> {
    let start = Instant::now();
    let names: Vec<String> = match only {
        Some(names) => names.iter().map(|s| (*s).to_string()).collect(),
        None => set.manifest.tables.keys().cloned().collect(),
    };
    let mut out = BTreeMap::new();
    for table in names {
        let row_groups = set.read_table(&table, None)?;
        let chunks = in_chunks(&row_groups, cluster.env().chunk_rows())
            .map_err(|e| RemoteError::Invalid(format!("cutting table {table} into chunks: {e}")))?;
        drop(row_groups);
        let frame = RemoteFrame::from_record_batches(cluster.env(), &chunks)
            .frame_ctx(|| format!("writing table {table} to memory elements"))?;
        drop(chunks);
        let handoff = Handoff::new(&format!("table/{table}"), &frame);
        out.insert(table, handoff);
    }
    Ok(TableHandoffs {
        tables: out,
        load_secs: start.elapsed().as_secs_f64(),
    })
}

/// The batch with every string-view column's empty data buffers dropped (as Polars
/// drops them joining arrays), so the frame lists the same buffers as one written
/// from a Polars DataFrame.
fn without_empty_buffers(batch: &RecordBatch) -> Result<RecordBatch, ArrowError> {
    let mut columns = Vec::with_capacity(batch.num_columns());
    for c in batch.columns() {
        let Some(views) = c.as_string_view_opt() else {
            columns.push(c.clone());
            continue;
        };
        let buffers = views.data_buffers();
        if buffers.iter().all(|b| !b.is_empty()) {
            columns.push(c.clone());
            continue;
        }
        // New index of every kept buffer (an empty one holds no view's bytes).
        let mut index = vec![0u32; buffers.len()];
        let mut kept = Vec::with_capacity(buffers.len());
        for (k, b) in buffers.iter().enumerate() {
            if !b.is_empty() {
                index[k] = u32::try_from(kept.len()).unwrap_or(u32::MAX);
                kept.push(b.clone());
            }
        }
        let remapped: Vec<u128> = views
            .views()
            .iter()
            .map(|&v| {
                // A view: length (bits 0..32), then for a value over 12 bytes its
                // prefix, buffer index (bits 64..96) and offset.
                if (v as u32) <= 12 {
                    return v;
                }
                let old = (v >> 64) as u32 as usize;
                let new = index.get(old).copied().unwrap_or(u32::MAX);
                (v & !(u128::from(u32::MAX) << 64)) | (u128::from(new) << 64)
            })
            .collect();
        let array =
            StringViewArray::try_new(ScalarBuffer::from(remapped), kept, views.nulls().cloned())?;
        columns.push(Arc::new(array) as ArrayRef);
    }
    RecordBatch::try_new(batch.schema(), columns)
}

/// `batches` (a table's row groups) cut and joined into batches of `rows` rows (the
/// last may be shorter), each written as one chunk: chunks span row groups, as when
/// the table was written as one Polars DataFrame. A chunk within one row group shares
/// its buffers; one across two is copied.
fn in_chunks(batches: &[RecordBatch], rows: usize) -> Result<Vec<RecordBatch>, ArrowError> {
    let Some(first) = batches.first() else {
        return Ok(Vec::new());
    };
    let rows = rows.max(1);
    let schema = first.schema();
    let mut out = Vec::new();
    let mut pending: Vec<RecordBatch> = Vec::new();
    let mut pending_rows = 0;
    let mut flush = |pending: &mut Vec<RecordBatch>| -> Result<(), ArrowError> {
        match pending.len() {
            0 => {}
            1 => out.append(pending),
            _ => {
                out.push(without_empty_buffers(&concat_batches(
                    &schema,
                    pending.iter(),
                )?)?);
                pending.clear();
            }
        }
        Ok(())
    };
    for b in batches {
        let mut off = 0;
        while off < b.num_rows() {
            let take = (rows - pending_rows).min(b.num_rows() - off);
            pending.push(b.slice(off, take));
            pending_rows += take;
            off += take;
            if pending_rows == rows {
                flush(&mut pending)?;
                pending_rows = 0;
            }
        }
    }
    flush(&mut pending)?;
    if out.is_empty() {
        // No rows: the empty batch still says what the columns are.
        out.push(first.clone());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::buffer::Buffer;

    use super::*;

    fn batch(values: std::ops::Range<i64>) -> RecordBatch {
        let a: ArrayRef = Arc::new(Int64Array::from_iter_values(values));
        RecordBatch::try_from_iter([("x", a)]).unwrap()
    }

    #[test]
    fn row_groups_are_cut_into_chunks_across_their_bounds() {
        let chunks = in_chunks(&[batch(0..5), batch(5..12), batch(12..13)], 4).unwrap();
        let sizes: Vec<usize> = chunks.iter().map(RecordBatch::num_rows).collect();
        assert_eq!(sizes, [4, 4, 4, 1]);
        let values: Vec<i64> = chunks
            .iter()
            .flat_map(|c| {
                c.column(0)
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .unwrap()
                    .values()
                    .to_vec()
            })
            .collect();
        assert_eq!(values, (0..13).collect::<Vec<_>>());
        let empty = in_chunks(&[batch(0..0)], 4).unwrap();
        assert_eq!(empty.len(), 1);
        assert_eq!(empty[0].num_rows(), 0);
    }

    #[test]
    fn chunks_across_row_groups_keep_only_nonempty_string_buffers() {
        let strings = |values: &[&str]| -> RecordBatch {
            let long: Vec<u8> = values
                .iter()
                .filter(|v| v.len() > 12)
                .flat_map(|v| v.bytes())
                .collect();
            let mut at = 0u32;
            let views: Vec<u128> = values
                .iter()
                .map(|v| {
                    let view = datafusion::arrow::array::make_view(v.as_bytes(), 0, at);
                    if v.len() > 12 {
                        at += v.len() as u32;
                    }
                    view
                })
                .collect();
            let a = StringViewArray::try_new(
                ScalarBuffer::from(views),
                vec![Buffer::from_vec(long)],
                None,
            )
            .unwrap();
            RecordBatch::try_from_iter([("s", Arc::new(a) as ArrayRef)]).unwrap()
        };
        let groups = [
            strings(&["a", "b"]),
            strings(&["a string over twelve bytes", "c"]),
            strings(&["d", "another long string value"]),
        ];
        let chunks = in_chunks(&groups, 6).unwrap();
        assert_eq!(chunks.len(), 1);
        let s = chunks[0].column(0).as_string_view();
        assert_eq!(s.data_buffers().len(), 2);
        assert!(s.data_buffers().iter().all(|b| !b.is_empty()));
        let values: Vec<&str> = s.iter().map(Option::unwrap).collect();
        assert_eq!(
            values,
            [
                "a",
                "b",
                "a string over twelve bytes",
                "c",
                "d",
                "another long string value"
            ]
        );
        // Short values only: no data buffer at all; within one row group, its one.
        let short = in_chunks(&[strings(&["a"]), strings(&["b"])], 2).unwrap();
        assert!(short[0]
            .column(0)
            .as_string_view()
            .data_buffers()
            .is_empty());
        let one = in_chunks(&[strings(&["a", "b"])], 2).unwrap();
        assert_eq!(one[0].column(0).as_string_view().data_buffers().len(), 1);
        assert_eq!(one[0].column(0).len(), 2);
    }
}
