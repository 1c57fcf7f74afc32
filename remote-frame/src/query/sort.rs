//! ORDER BY, and the sorts under windows, within the budget: sorted runs spilled to
//! memory elements and merged with as many at once as the budget reads.
//!
//! DataFusion's `SortExec` reserves every batch it holds twice over (for the sort's
//! copy), and before spilling merges the batches it holds through row cursors paid
//! from a small reserve of their own: a sort whose keys are most of its rows
//! (`ORDER BY k, v` over two integers) failed out of memory at every budget from 2
//! to 12 MiB, and a sort given as much memory as its input spilled. [`SpillingSortExec`]
//! sorts each batch as it arrives and holds it, reserving it before it holds it; the
//! merge converts the keys of the next few rows of each batch to Arrow's row format
//! as it reaches them (and then compares bytes). When the
//! next batch does not fit, the held batches are merged into one sorted run written
//! to a spill file. At the end the held batches are merged with the runs read back a
//! batch at a time and streamed on; runs more than the budget reads at once are
//! first merged into fewer.

use std::cmp::Ordering;
use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch};
use arrow_buffer::ScalarBuffer;
use arrow_schema::{DataType, FieldRef, Schema, SchemaRef};
use datafusion::arrow::compute::{interleave_record_batch, sort_to_indices};
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::common::config::ConfigOptions;
use datafusion::common::{DataFusionError, Result as DfResult};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::SpillFile;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::utils::collect_columns;
use datafusion::physical_expr::LexOrdering;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::metrics::{
    ExecutionPlanMetricsSet, Gauge, MetricBuilder, MetricsSet, SpillMetrics,
};
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::spill::SpillManager;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ReplaceChildrenOptions, SendableRecordBatchStream,
};
use futures::StreamExt;

use super::grace::{grow_within, partition_writer};
use super::operator::{
    budget_bytes, holder_cap, is_window_over_sort, memory_holders, memory_holders_but,
    replace_each, replace_wrapped_children,
};
use super::owned::{cast_to, compact_views_if_shared, rows_bytes, take_rows_as};
use super::spill::{read_spilled, spill_block_bytes};
use super::window::window_floor;

/// Spilled runs a merge is sized to read at once.
const MERGE_WAYS: usize = 16;

/// The fewest rows in a batch of a spilled run.
const MIN_RUN_ROWS: usize = 16;

/// Rows of a sorted batch whose keys are held as rows at once: the next ones are
/// converted as the merge reaches them. Keys held for whole batches took a third of
/// what a sort of two integers and a short string held (18 bytes of keys beside 27
/// of values), and a sort given its input's size spilled for them.
const KEY_WINDOW_ROWS: usize = 256;

/// Replaces DataFusion's `SortExec`s that sort all their input (not a top-k) by
/// [`SpillingSortExec`] (a physical optimizer rule, added when the session has a
/// budget). A sort on keys Arrow's row format cannot hold stays DataFusion's.
#[derive(Debug, Default)]
pub(crate) struct SpillingSorts;

impl PhysicalOptimizerRule for SpillingSorts {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        // A window over the sort of its partition keys holds one partition at a
        // time, from a floor it reserves: with no other holder the sort takes what
        // the sole holder would, less that floor.
        let holders = memory_holders(plan.as_ref());
        let under_window =
            holders == 2 && memory_holders_but(plan.as_ref(), &is_window_over_sort) == 1;
        let sole = holders == 1 || under_window;
        replace_each(plan, |sort: &SortExec| {
            if sort.fetch().is_some() || converter(sort.expr(), &sort.input().schema()).is_err() {
                return Ok(None);
            }
            Ok(Some(Arc::new(SpillingSortExec::new(
                Arc::new(sort.clone()),
                sole,
                under_window,
            )) as _))
        })
    }

    fn name(&self) -> &str {
        "scad_spilling_sorts"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// The row converter of `keys` over rows of `schema`.
fn converter(keys: &LexOrdering, schema: &SchemaRef) -> DfResult<RowConverter> {
    let fields = keys
        .iter()
        .map(|k| {
            Ok(SortField::new_with_options(
                k.expr.data_type(schema)?,
                k.options,
            ))
        })
        .collect::<DfResult<Vec<_>>>()?;
    Ok(RowConverter::new(fields)?)
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct SpillingSortExec {
    sort: Arc<SortExec>,
    /// Whether the sort is the only operator of its plan that holds memory (see
    /// [`holder_cap`]).
    sole: bool,
    /// Whether it is the sort of the plan's only window, which reserves its floor
    /// from the sort's share (see [`window_floor`]).
    under_window: bool,
    metrics: ExecutionPlanMetricsSet,
}

impl SpillingSortExec {
    fn new(sort: Arc<SortExec>, sole: bool, under_window: bool) -> Self {
        SpillingSortExec {
            sort,
            sole,
            under_window,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }
}

impl DisplayAs for SpillingSortExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "SpillingSortExec: wraps ")?;
        self.sort.fmt_as(t, f)
    }
}

impl ExecutionPlan for SpillingSortExec {
    fn name(&self) -> &str {
        "SpillingSortExec"
    }

    super::operator::wrapped_plan_methods!(sort);

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        options: ReplaceChildrenOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let sort = replace_wrapped_children(&self.sort, children, options)?;
        Ok(Arc::new(SpillingSortExec::new(
            Arc::new(sort),
            self.sole,
            self.under_window,
        )))
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
        let input = self.sort.input().execute(partition, context.clone())?;
        let schema = self.sort.input().schema();
        let keys = self.sort.expr().clone();
        let converter = converter(&keys, &schema)?;
        let held_schema = held_schema(&schema, &keys);
        let name = format!("SpillingSort[{partition}]");
        let reservation = MemoryConsumer::new(name.clone())
            .with_can_spill(true)
            .register(context.memory_pool());
        // This partition's share of the budget: the sort's partitions run at once.
        let ways = self.sort.properties().partitioning.partition_count().max(1);
        let cap = match budget_bytes(&context) {
            usize::MAX => usize::MAX,
            bytes if self.under_window => {
                holder_cap(bytes / ways, true).saturating_sub(window_floor(bytes, ways))
            }
            bytes => holder_cap(bytes / ways, self.sole),
        };
        let spill = Arc::new(SpillManager::new(
            context.runtime_env(),
            SpillMetrics::new(&self.metrics, partition),
            held_schema.clone(),
        ));
        let run = SortRun {
            input,
            keys,
            converter,
            held_schema,
            out_schema: self.sort.schema(),
            held: Vec::new(),
            used: 0,
            runs: Vec::new(),
            spill,
            reservation,
            cap,
            batch_rows: context.session_config().batch_size().max(1),
            block_bytes: spill_block_bytes(budget_bytes(&context)),
            chunk_cost: 0,
            key_bytes_per_row: 0,
            row_bytes: 0,
            output: None,
            name,
            peak: MetricBuilder::new(&self.metrics).gauge("peak_mem_used", partition),
        };
        let stream = futures::stream::try_unfold(run, |mut run| async move {
            let out = run.next_output().await?;
            Ok(out.map(|batch| (batch, run)))
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.sort.schema(),
            stream,
        )))
    }
}

/// One partition's execution state.
struct SortRun {
    input: SendableRecordBatchStream,
    keys: LexOrdering,
    converter: RowConverter,
    /// The types rows are held and spilled in (see [`held_schema`]); the answer is
    /// cast back to `out_schema`.
    held_schema: SchemaRef,
    out_schema: SchemaRef,
    /// Batches read since the last spill, each sorted, with their first rows' keys
    /// as rows.
    held: Vec<Cursor>,
    /// Bytes of `reservation` the held batches take.
    used: usize,
    /// Sorted runs spilled (the passes before the last merge reorder them by size).
    runs: Vec<Arc<dyn SpillFile>>,
    spill: Arc<SpillManager>,
    reservation: MemoryReservation,
    /// The most this partition holds.
    cap: usize,
    batch_rows: usize,
    /// The spill blocks a run is read back in.
    block_bytes: usize,
    /// The most a batch of a spilled run costs with a window of its keys as rows:
    /// what each run read back holds while it is merged.
    chunk_cost: usize,
    /// The most bytes a row's keys took in the row format.
    key_bytes_per_row: usize,
    /// The most bytes a held row took, with its share of its batch's key window.
    row_bytes: usize,
    /// The merge streaming the answer, once the input is read.
    output: Option<Merge>,
    name: String,
    peak: Gauge,
}

impl SortRun {
    /// The next batch of the answer (`None` at its end).
    async fn next_output(&mut self) -> DfResult<Option<RecordBatch>> {
        if self.output.is_none() {
            self.read_input().await?;
            let merge = self.final_merge().await?;
            self.output = Some(merge);
        }
        let Some(merge) = self.output.as_mut() else {
            return Ok(None);
        };
        let chunk = merge.next_chunk(&self.keys, &self.converter).await?;
        // Held batches the merge is done with are given back as it goes.
        let freed = std::mem::take(&mut merge.freed);
        self.reservation.shrink(freed.min(self.reservation.size()));
        if chunk.is_none() {
            self.reservation.free();
        }
        chunk.map(|c| cast_to(c, &self.out_schema)).transpose()
    }

    /// Reads the whole input, holding sorted batches and spilling them as runs when
    /// the next does not fit.
    async fn read_input(&mut self) -> DfResult<()> {
        while let Some(batch) = self.input.next().await {
            let batch = batch?;
            if batch.num_rows() == 0 {
                continue;
            }
            // Sorted before it is reserved, as a batch in flight: its cost is known
            // once it is taken in the held types with its first keys as rows.
            let cursor = sorted(&batch, &self.keys, &self.converter, &self.held_schema)?;
            drop(batch);
            let cost = cursor.cost;
            self.row_bytes = self.row_bytes.max(cost.div_ceil(cursor.batch.num_rows()));
            self.key_bytes_per_row = self
                .key_bytes_per_row
                .max(cursor.rows.size().div_ceil(cursor.rows.len()));
            if !self.room_for(cost) && !self.held.is_empty() {
                self.spill_held().await?;
            }
            if self.room_for(cost) {
                self.used += cost;
                self.held.push(cursor);
                self.peak.set_max(self.reservation.size());
            } else {
                // Not even one batch fits beside what the others hold: it becomes
                // a run of its own (held only while it is written, as a batch in
                // flight is).
                self.write_run(vec![cursor]).await?;
            }
        }
        Ok(())
    }

    /// Whether `cost` more bytes fit in the reservation, grown within the cap if
    /// need be.
    fn room_for(&self, cost: usize) -> bool {
        let need = self.used + cost;
        need <= self.reservation.size()
            || grow_within(&self.reservation, need - self.reservation.size(), self.cap)
    }

    /// Merges the held batches into one run written to a spill file. Their memory
    /// stays reserved, for the batches that follow.
    async fn spill_held(&mut self) -> DfResult<()> {
        let held = std::mem::take(&mut self.held);
        self.used = 0;
        self.write_run(held).await
    }

    /// Merges `cursors` (the held batches, or runs read back) into one run written
    /// to a spill file.
    async fn write_run(&mut self, cursors: Vec<Cursor>) -> DfResult<()> {
        let mut merge = Merge::new(cursors, self.run_rows());
        let mut writer = partition_writer(&self.spill, "SpillingSort run")?;
        while let Some(chunk) = merge.next_chunk(&self.keys, &self.converter).await? {
            let cost =
                rows_bytes(&chunk) + chunk.num_rows().min(KEY_WINDOW_ROWS) * self.key_bytes_per_row;
            self.chunk_cost = self.chunk_cost.max(cost);
            // A merged batch's strings no longer share buffers, as the batches
            // read did: the next ones are cut to what this one cost a row.
            self.row_bytes = self.row_bytes.max(cost.div_ceil(chunk.num_rows()));
            merge.batch_rows = self.run_rows();
            writer.append(&chunk)?;
        }
        if let Some(file) = writer.finish()? {
            self.runs.push(file);
        }
        Ok(())
    }

    /// The merge of everything read: the held batches in memory and the spilled
    /// runs, as many at once as the budget reads (earlier passes merge the smallest
    /// runs into one until then).
    async fn final_merge(&mut self) -> DfResult<Merge> {
        // Each run read back holds a batch, its keys as rows and the spill block it
        // is decoded from; the merge builds one more batch.
        let run_cost = self.chunk_cost + self.block_bytes;
        let readers = |runs: usize| (runs + 1) * run_cost;
        if !self.runs.is_empty() && !self.room_for(readers(self.runs.len())) {
            if !self.held.is_empty() {
                self.spill_held().await?;
            }
            loop {
                let fan_in = self.fan_in(self.runs.len(), run_cost);
                if fan_in < 2 {
                    return Err(DataFusionError::ResourcesExhausted(format!(
                        "{} cannot read two sorted runs at once within its budget: a run's \
                         batch takes {run_cost} bytes, {} are reserved",
                        self.name,
                        self.reservation.size()
                    )));
                }
                if self.runs.len() <= fan_in {
                    break;
                }
                // The smallest runs, as many as leave `fan_in` for the last merge (or
                // a full merge's worth): rows merged early are written again by every
                // later pass that takes their run.
                let take = fan_in.min(self.runs.len() - fan_in + 1);
                self.runs
                    .sort_by_key(|r| std::cmp::Reverse(r.size().unwrap_or(u64::MAX)));
                let smallest = self.runs.split_off(self.runs.len() - take);
                let cursors = self.open_runs(smallest).await?;
                self.write_run(cursors).await?;
            }
        }
        self.used += readers(self.runs.len()).min(self.reservation.size() - self.used);
        let runs = std::mem::take(&mut self.runs);
        let out_rows = if runs.is_empty() {
            self.batch_rows
        } else {
            self.run_rows()
        };
        let mut cursors = std::mem::take(&mut self.held);
        cursors.extend(self.open_runs(runs).await?);
        // What the reservation holds beyond the held batches and the readers goes
        // back now.
        self.reservation
            .shrink(self.reservation.size().saturating_sub(self.used));
        Ok(Merge::new(cursors, out_rows))
    }

    /// Rows in a batch of a spilled run: few enough that [`MERGE_WAYS`] runs read
    /// back at once, and the merge's own batch, fit in what the sort holds now (it
    /// keeps that until the end). A full batch of wide rows in a budget of a few
    /// hundred KiB did not fit twice, nor at 25 MiB under a window that held most
    /// of the budget (q47).
    fn run_rows(&self) -> usize {
        if self.cap == usize::MAX {
            return self.batch_rows;
        }
        let per_run = (self.reservation.size() / (MERGE_WAYS + 1)).saturating_sub(self.block_bytes);
        (per_run / self.row_bytes.max(1)).clamp(MIN_RUN_ROWS, self.batch_rows)
    }

    /// How many of `runs` runs can be read at once (one more batch is the merge's
    /// output): the reservation grown towards all of them as far as the cap and the
    /// pool allow.
    fn fan_in(&self, runs: usize, run_cost: usize) -> usize {
        let mut extra = ((runs + 1) * run_cost).saturating_sub(self.reservation.size());
        while extra >= run_cost && !grow_within(&self.reservation, extra, self.cap) {
            extra /= 2;
        }
        (self.reservation.size() / run_cost.max(1)).saturating_sub(1)
    }

    /// A cursor at the first batch of each of `runs`.
    async fn open_runs(&mut self, runs: Vec<Arc<dyn SpillFile>>) -> DfResult<Vec<Cursor>> {
        let schema = self.spill.schema().clone();
        let mut cursors = Vec::with_capacity(runs.len());
        for file in runs {
            let mut stream = read_spilled(file, schema.clone())?;
            if let Some((batch, rows)) =
                next_sorted(&mut stream, &self.keys, &self.converter).await?
            {
                cursors.push(Cursor {
                    batch,
                    rows,
                    start: 0,
                    pos: 0,
                    cost: 0,
                    rest: Some(stream),
                });
            }
        }
        Ok(cursors)
    }
}

/// The key columns of `batch`.
fn key_columns(keys: &LexOrdering, batch: &RecordBatch) -> DfResult<Vec<ArrayRef>> {
    keys.iter()
        .map(|k| k.expr.evaluate(batch)?.into_array(batch.num_rows()))
        .collect()
}

/// The schema a sort holds and spills its rows in: `schema` with the string and
/// binary views of columns no key reads as plain strings and binaries. A view takes
/// 16 bytes a row beside the bytes of a string longer than 12; plain strings take
/// 4 beside all of theirs: a sort of two integers and a short string held 32 bytes a
/// row instead of 27, and spilled at a budget of its input's size. Keys stay as they
/// are, for the row converter and the key expressions.
fn held_schema(schema: &SchemaRef, keys: &LexOrdering) -> SchemaRef {
    let read: HashSet<usize> = keys
        .iter()
        .flat_map(|k| collect_columns(&k.expr))
        .map(|c| c.index())
        .collect();
    let plain = |i: usize, field: &FieldRef| match field.data_type() {
        DataType::Utf8View if !read.contains(&i) => Some(DataType::Utf8),
        DataType::BinaryView if !read.contains(&i) => Some(DataType::Binary),
        _ => None,
    };
    if !schema
        .fields()
        .iter()
        .enumerate()
        .any(|(i, f)| plain(i, f).is_some())
    {
        return schema.clone();
    }
    let fields: Vec<FieldRef> = schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| match plain(i, f) {
            Some(t) => Arc::new(f.as_ref().clone().with_data_type(t)),
            None => f.clone(),
        })
        .collect();
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// The keys of `batch`'s rows from `start` on, as many as [`KEY_WINDOW_ROWS`], as rows.
fn key_window(
    batch: &RecordBatch,
    start: usize,
    keys: &LexOrdering,
    converter: &RowConverter,
) -> DfResult<KeyRows> {
    let n = KEY_WINDOW_ROWS.min(batch.num_rows().saturating_sub(start));
    KeyRows::of(converter, &key_columns(keys, &batch.slice(start, n))?)
}

/// `batch` sorted by its keys, with its first rows' keys as rows. One key sorts by
/// Arrow's kernel (values of one type compared without encoding them); several by
/// their row format compared as bytes: Arrow's lexicographic sort calls a comparator
/// per key per comparison, and over q67's eight keys (four strings, long runs of equal
/// leading keys) that took a third of the query (0.42 -> 0.37 s at 25 %).
fn sorted(
    batch: &RecordBatch,
    keys: &LexOrdering,
    converter: &RowConverter,
    held_schema: &SchemaRef,
) -> DfResult<Cursor> {
    let columns = key_columns(keys, batch)?;
    let order: ScalarBuffer<u32> = match (columns.as_slice(), keys.first()) {
        ([column], key) => sort_to_indices(column, Some(key.options), None)?
            .values()
            .clone(),
        _ => {
            let rows = converter.convert_columns(&columns)?;
            let heads: Vec<u128> = (0..rows.num_rows())
                .map(|i| head(rows.row(i).data()))
                .collect();
            let mut order: Vec<u32> = (0..rows.num_rows() as u32).collect();
            order.sort_unstable_by(|&a, &b| {
                let (a, b) = (a as usize, b as usize);
                heads[a]
                    .cmp(&heads[b])
                    .then_with(|| compare_rows(rows.row(a).data(), rows.row(b).data()))
            });
            order.into()
        }
    };
    drop(columns);
    let batch = take_rows_as(batch, &order, held_schema)?;
    let rows = key_window(&batch, 0, keys, converter)?;
    let cost = rows_bytes(&batch) + rows.size();
    Ok(Cursor {
        batch,
        rows,
        start: 0,
        pos: 0,
        cost,
        rest: None,
    })
}

/// The next non-empty batch of a sorted run with its first rows' keys as rows.
async fn next_sorted(
    stream: &mut SendableRecordBatchStream,
    keys: &LexOrdering,
    converter: &RowConverter,
) -> DfResult<Option<(RecordBatch, KeyRows)>> {
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        if batch.num_rows() > 0 {
            let rows = key_window(&batch, 0, keys, converter)?;
            return Ok(Some((batch, rows)));
        }
    }
    Ok(None)
}

/// The sort keys of a batch's rows in Arrow's row format, compared as bytes. Copied
/// out of Arrow's `Rows`: rows of fixed-width keys (the usual case) need no offsets,
/// others 4 bytes of offset a row rather than 8, and reaching a row is inlined.
#[derive(Default)]
struct KeyRows {
    data: Vec<u8>,
    /// The bytes of every row, when they are all alike (0: see `offsets`).
    width: usize,
    /// Where each row starts, and the end of the last (empty when `width` is set).
    offsets: Vec<u32>,
    rows: usize,
}

impl KeyRows {
    /// Key `columns` as rows.
    fn of(converter: &RowConverter, columns: &[ArrayRef]) -> DfResult<Self> {
        let rows = converter.convert_columns(columns)?;
        let n = rows.num_rows();
        let width = if n > 0 { rows.row(0).data().len() } else { 0 };
        let fixed = width > 0 && (1..n).all(|i| rows.row(i).data().len() == width);
        let order = (0..n).map(|i| rows.row(i).data());
        if fixed {
            let mut data = Vec::with_capacity(n * width);
            order.for_each(|r| data.extend_from_slice(r));
            Ok(KeyRows {
                data,
                width,
                offsets: Vec::new(),
                rows: n,
            })
        } else {
            Self::variable(order, n)
        }
    }

    /// Rows of different widths, in the order given.
    fn variable<'a>(rows: impl Iterator<Item = &'a [u8]>, n: usize) -> DfResult<Self> {
        let mut data = Vec::new();
        let mut offsets = Vec::with_capacity(n + 1);
        offsets.push(0);
        for r in rows {
            data.extend_from_slice(r);
            offsets.push(u32::try_from(data.len()).map_err(|_| {
                DataFusionError::ResourcesExhausted(
                    "the sort keys of one batch take more than 4 GiB".into(),
                )
            })?);
        }
        Ok(KeyRows {
            data,
            width: 0,
            offsets,
            rows: n,
        })
    }

    #[inline]
    fn row(&self, i: usize) -> &[u8] {
        if self.width > 0 {
            &self.data[i * self.width..(i + 1) * self.width]
        } else {
            &self.data[self.offsets[i] as usize..self.offsets[i + 1] as usize]
        }
    }

    fn len(&self) -> usize {
        self.rows
    }

    /// The bytes these rows take.
    fn size(&self) -> usize {
        self.data.capacity() + self.offsets.capacity() * 4
    }
}

/// A sorted batch being merged, with the keys of its next rows as rows: a held batch,
/// or the current batch of a run read back (whose later batches follow).
struct Cursor {
    batch: RecordBatch,
    /// The keys of the batch's rows from `start` on (a window of them).
    rows: KeyRows,
    start: usize,
    /// The next row to merge, in `rows`.
    pos: usize,
    /// The bytes reserved for it (0 for a run's batch: the merge's readers are
    /// reserved as a whole).
    cost: usize,
    /// The rest of its run.
    rest: Option<SendableRecordBatchStream>,
}

/// Compares two rows of Arrow's row format (ordered as their bytes are), eight bytes
/// at a time: rows are a few dozen bytes, and a call to `memcmp` for each took more
/// time than the rest of the merge.
#[inline]
fn compare_rows(a: &[u8], b: &[u8]) -> Ordering {
    let n = a.len().min(b.len());
    let (a_head, b_head) = (&a[..n], &b[..n]);
    let mut a_words = a_head.chunks_exact(8);
    let mut b_words = b_head.chunks_exact(8);
    for (x, y) in a_words.by_ref().zip(b_words.by_ref()) {
        let x = u64::from_be_bytes(<[u8; 8]>::try_from(x).unwrap_or_default());
        let y = u64::from_be_bytes(<[u8; 8]>::try_from(y).unwrap_or_default());
        if x != y {
            return x.cmp(&y);
        }
    }
    for (x, y) in a_words.remainder().iter().zip(b_words.remainder()) {
        if x != y {
            return x.cmp(y);
        }
    }
    a.len().cmp(&b.len())
}

/// The first 16 bytes of a row (zeros after a shorter one) as a number: rows whose
/// heads differ compare as their heads do.
#[inline]
fn head(row: &[u8]) -> u128 {
    let mut bytes = [0u8; 16];
    let n = row.len().min(16);
    bytes[..n].copy_from_slice(&row[..n]);
    u128::from_be_bytes(bytes)
}

impl Cursor {
    /// The head of its next row (`u128::MAX` when it has none).
    fn head(&self) -> u128 {
        if self.pos < self.rows.len() {
            head(self.rows.row(self.pos))
        } else {
            u128::MAX
        }
    }
}

/// A k-way merge of sorted cursors: a tree of losers (each node holds the cursor
/// that lost the match played there, the root the overall winner), so that the
/// next row costs one comparison per level. Ties go to the earlier cursor, so that
/// the order of equal rows does not depend on the tree's shape. Most comparisons
/// are of the cursors' next rows' heads, kept side by side; only equal heads
/// compare the rows.
struct Merge {
    cursors: Vec<Cursor>,
    /// The head of each cursor's next row (`u128::MAX` once it is done).
    heads: Vec<u128>,
    /// `tree[0]` is the winner; `tree[1..]` the losers of the matches.
    tree: Vec<usize>,
    batch_rows: usize,
    /// Bytes of held batches the merge has finished with since last asked.
    freed: usize,
}

impl Merge {
    fn new(cursors: Vec<Cursor>, batch_rows: usize) -> Self {
        let k = cursors.len();
        let heads = cursors.iter().map(Cursor::head).collect();
        let mut merge = Merge {
            cursors,
            heads,
            tree: vec![usize::MAX; k.max(1)],
            batch_rows,
            freed: 0,
        };
        for leaf in 0..k {
            let mut winner = leaf;
            let mut node = (k + leaf) / 2;
            while node != 0 && merge.tree[node] != usize::MAX {
                let other = merge.tree[node];
                if merge.after(winner, other) {
                    merge.tree[node] = winner;
                    winner = other;
                }
                node /= 2;
            }
            merge.tree[node] = winner;
        }
        merge
    }

    /// Whether cursor `c` has no rows left.
    fn done(&self, c: usize) -> bool {
        self.cursors[c].pos >= self.cursors[c].rows.len()
    }

    /// Whether cursor `a`'s next row comes after cursor `b`'s (a cursor with no rows
    /// left comes after every other).
    #[inline]
    fn after(&self, a: usize, b: usize) -> bool {
        let (ha, hb) = (self.heads[a], self.heads[b]);
        if ha != hb {
            return ha > hb;
        }
        self.after_by_rows(a, b)
    }

    /// [`Merge::after`] for cursors whose heads are equal.
    fn after_by_rows(&self, a: usize, b: usize) -> bool {
        let (ca, cb) = (&self.cursors[a], &self.cursors[b]);
        match (ca.pos >= ca.rows.len(), cb.pos >= cb.rows.len()) {
            (true, true) => a > b,
            (true, false) => true,
            (false, true) => false,
            (false, false) => compare_rows(ca.rows.row(ca.pos), cb.rows.row(cb.pos))
                .then(a.cmp(&b))
                .is_gt(),
        }
    }

    /// Plays the winner's next row up the tree.
    fn replay(&mut self) {
        let k = self.cursors.len();
        let mut winner = self.tree[0];
        let mut node = (k + winner) / 2;
        while node != 0 {
            let other = self.tree[node];
            if self.after(winner, other) {
                self.tree[node] = winner;
                winner = other;
            }
            node /= 2;
        }
        self.tree[0] = winner;
    }

    /// The next `batch_rows` rows in order (`None` when every cursor is done).
    async fn next_chunk(
        &mut self,
        keys: &LexOrdering,
        converter: &RowConverter,
    ) -> DfResult<Option<RecordBatch>> {
        // The batches this chunk takes rows from, and each cursor's place among them.
        let mut batches: Vec<RecordBatch> = Vec::new();
        let mut slots: Vec<Option<usize>> = vec![None; self.cursors.len()];
        let mut picks = Vec::with_capacity(self.batch_rows);
        while picks.len() < self.batch_rows {
            let top = self.tree[0];
            if top == usize::MAX || self.done(top) {
                break;
            }
            let cursor = &mut self.cursors[top];
            let slot = *slots[top].get_or_insert_with(|| {
                batches.push(cursor.batch.clone());
                batches.len() - 1
            });
            picks.push((slot, cursor.start + cursor.pos));
            cursor.pos += 1;
            let next_start = cursor.start + cursor.rows.len();
            if cursor.pos == cursor.rows.len() && next_start < cursor.batch.num_rows() {
                cursor.rows = key_window(&cursor.batch, next_start, keys, converter)?;
                cursor.start = next_start;
                cursor.pos = 0;
            } else if cursor.pos == cursor.rows.len() {
                let next = match cursor.rest.as_mut() {
                    Some(rest) => next_sorted(rest, keys, converter).await?,
                    None => None,
                };
                match next {
                    Some((batch, rows)) => {
                        cursor.batch = batch;
                        cursor.rows = rows;
                        cursor.start = 0;
                        cursor.pos = 0;
                        slots[top] = None;
                    }
                    None => {
                        // Done: its memory goes once the chunk is built.
                        cursor.rest = None;
                        self.freed += std::mem::take(&mut cursor.cost);
                        cursor.rows = KeyRows::default();
                        cursor.batch = RecordBatch::new_empty(cursor.batch.schema());
                        cursor.start = 0;
                        cursor.pos = 0;
                    }
                }
            }
            self.heads[top] = self.cursors[top].head();
            self.replay();
        }
        if picks.is_empty() {
            return Ok(None);
        }
        let refs: Vec<&RecordBatch> = batches.iter().collect();
        // Interleaved views point into every batch they came from, a run's whole
        // spill block among them: compacted, the chunk is sized (by the merge of
        // partitions above, which cannot spill) as the strings it shows.
        compact_views_if_shared(interleave_record_batch(&refs, &picks)?).map(Some)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use arrow_array::Int64Array;
    use futures::StreamExt;
    use polars::prelude::df;

    use crate::env::FrameEnv;
    use crate::frame::RemoteFrame;
    use crate::query::test_env::{local_env, one_partition_session};
    use crate::query::QueryOutput;

    const ROWS: i64 = 750_000;
    const KEYS: i64 = 1_000;

    /// Two int64 columns (12 MB): `k` = one of 1,000 keys in no order, `v` = the row.
    fn table(env: &FrameEnv) -> RemoteFrame {
        let frame = df!(
            "k" => (0..ROWS).map(|i| i * 7_919 % KEYS).collect::<Vec<_>>(),
            "v" => (0..ROWS).collect::<Vec<_>>()
        )
        .unwrap();
        RemoteFrame::from_polars(env, &frame).unwrap()
    }

    /// `sql` in `budget` bytes, checked to stay within it and to leave nothing behind.
    fn sort(env: &FrameEnv, t: &RemoteFrame, budget: u64, sql: &str) -> QueryOutput {
        let session = one_partition_session(env, Some(budget), t);
        let out = session.sql(sql).unwrap();
        let text = out.explain_analyze();
        assert!(text.contains("SpillingSortExec"), "{text}");
        assert!(out.stats().peak_local_bytes <= budget, "{budget}: {text}");
        assert_eq!(session.spill_bytes_held(), 0, "spill files left behind");
        assert_eq!(session.reserved_bytes(), 0, "reservations left behind");
        out
    }

    fn column(out: &QueryOutput, name: &str) -> Vec<i64> {
        let frame = out.to_polars().unwrap();
        frame
            .column(name)
            .unwrap()
            .i64()
            .unwrap()
            .into_no_null_iter()
            .collect()
    }

    #[test]
    fn a_sort_whose_keys_are_its_whole_rows_sorts_within_small_budgets() {
        // DataFusion's sort merged the batches it held through row cursors paid from
        // a reserve of budget/32 before spilling them: with keys as wide as the rows
        // it failed out of memory at every one of these budgets.
        let env = local_env(1, 64 << 20);
        let t = table(&env);
        let mut want: Vec<(i64, i64)> = (0..ROWS).map(|i| (i * 7_919 % KEYS, i)).collect();
        want.sort_unstable();
        for mib in [2u64, 3, 4, 6, 8, 12] {
            let out = sort(&env, &t, mib << 20, "SELECT k, v FROM t ORDER BY k, v");
            assert!(out.stats().spill_files > 0, "{mib} MiB");
            let got: Vec<(i64, i64)> = column(&out, "k")
                .into_iter()
                .zip(column(&out, "v"))
                .collect();
            assert!(got == want, "{mib} MiB: not in order");
        }
    }

    #[test]
    fn runs_the_budget_reads_at_once_are_written_once_and_merged_in_one_pass() {
        // Each run holds as many rows as the budget holds (16 bytes of values a row;
        // their keys are rows only a window at a time, as the merge reaches them):
        // 7, 3 and 1 runs (10, 5 and 1 when whole batches' keys were held), every
        // row written at most once and read back once. What is held when the input
        // ends is merged with the runs in memory, not written.
        let env = local_env(1, 64 << 20);
        let t = table(&env);
        for (mib, runs) in [(2u64, 7u64), (4, 3), (12, 1)] {
            let out = sort(&env, &t, mib << 20, "SELECT k, v FROM t ORDER BY v DESC");
            assert_eq!(out.stats().spill_files, runs, "{mib} MiB");
            let once = ROWS as u64 * 16;
            let written = out.stats().spill_bytes_written;
            assert!(
                written + (mib << 20) >= once && written < once + once / 50,
                "{mib} MiB: {written}"
            );
            assert_eq!(out.stats().spill_bytes_read, written, "{mib} MiB");
            assert!(
                column(&out, "v").into_iter().eq((0..ROWS).rev()),
                "{mib} MiB"
            );
        }
    }

    #[test]
    fn runs_too_many_to_read_at_once_are_merged_in_passes() {
        // At 768 KiB a run holds ~42 k rows: the runs are more than the budget reads
        // at once, so the smallest, as few as leave a full merge for the last pass,
        // are merged into one first (22 files in all): their rows are written twice,
        // the others' once (1.18x the rows' bytes). Merged oldest first, 8 at a
        // time, rows were written up to three times.
        let env = local_env(1, 64 << 20);
        let t = table(&env);
        let out = sort(&env, &t, 768 << 10, "SELECT k, v FROM t ORDER BY v");
        let once = ROWS as u64 * 16;
        let written = out.stats().spill_bytes_written;
        assert_eq!(out.stats().spill_files, 22);
        assert!(
            written > once + once / 20 && written < once + once / 2,
            "{written}"
        );
        assert!(column(&out, "v").into_iter().eq(0..ROWS));
    }

    #[test]
    fn a_sort_that_fits_spills_nothing() {
        let env = local_env(1, 64 << 20);
        let t = table(&env);
        let out = sort(&env, &t, 48 << 20, "SELECT k, v FROM t ORDER BY k DESC, v");
        assert_eq!(out.stats().spill_files, 0);
        let k = column(&out, "k");
        assert!(k.windows(2).all(|w| w[0] >= w[1]));
    }

    #[test]
    fn a_sort_given_its_input_s_size_spills_nothing() {
        // Two integers and a short string (a 16-byte view when read): 32 bytes a row
        // read, 27 held (the string as a plain one, no key reads it) and the keys
        // only a window at a time. Held as views beside their keys' rows (50 bytes a
        // row) the sort spilled at this budget.
        let env = local_env(1, 64 << 20);
        let frame = df!(
            "k" => (0..ROWS).map(|i| i * 7_919 % KEYS).collect::<Vec<_>>(),
            "v" => (0..ROWS).collect::<Vec<_>>(),
            "s" => (0..ROWS).map(|i| format!("row {}", i % 1_000)).collect::<Vec<_>>()
        )
        .unwrap();
        let t = RemoteFrame::from_polars(&env, &frame).unwrap();
        let out = sort(
            &env,
            &t,
            t.data_bytes(),
            "SELECT k, v, s FROM t ORDER BY v, k",
        );
        assert_eq!(out.stats().spill_files, 0);
        assert!(column(&out, "v").into_iter().eq(0..ROWS));
        let strings = out.to_polars().unwrap();
        let s = strings.column("s").unwrap().str().unwrap();
        let s = s.rechunk();
        assert!((0..ROWS as usize).all(|i| s.get(i) == Some(format!("row {}", i % 1_000).as_str())));
    }

    #[test]
    fn a_sort_dropped_midway_frees_its_memory_and_runs() {
        let env = local_env(1, 64 << 20);
        let t = table(&env);
        let session = one_partition_session(&env, Some(2 << 20), &t);
        let (_, plan) = session.plan("SELECT k, v FROM t ORDER BY v DESC").unwrap();
        let mut stream = plan.execute(0, session.ctx.task_ctx()).unwrap();
        let first = session.runtime.block_on(stream.next()).unwrap().unwrap();
        let v = first
            .column(1)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        assert_eq!(v.value(0), ROWS - 1);
        assert!(session.spill_bytes_held() > 0);
        assert!(session.reserved_bytes() > 0);
        drop(stream);
        session.await_spill_release();
        assert_eq!(session.spill_bytes_held(), 0, "spill files left behind");
        assert_eq!(session.reserved_bytes(), 0, "reservations left behind");
    }
}
