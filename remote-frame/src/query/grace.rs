//! What the spilling operators share (the hash join and the aggregate): rows read
//! under a reservation handed on as a stream that gives the memory back as it goes,
//! hash partitioning of a stream into spill files in memory elements (grace
//! partitioning), and a leaf that feeds a prepared stream to a wrapped DataFusion
//! operator.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use arrow_array::{ArrayRef, BooleanArray, RecordBatch};
use arrow_buffer::BooleanBufferBuilder;
use arrow_data::{layout, BufferSpec};
use arrow_schema::SchemaRef;
use datafusion::arrow::compute::{concat_batches, filter_record_batch, BatchCoalescer};
use datafusion::arrow::ipc::writer::{IpcWriteOptions, StreamWriter};
use datafusion::arrow::ipc::MetadataVersion;
use datafusion::common::hash_utils::{create_hashes, RandomState};
use datafusion::common::{DataFusionError, Result as DfResult};
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::execution::spill_file::SpillWriter;
use datafusion::execution::{SpillFile, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::memory::MemoryStream;
use datafusion::physical_plan::metrics::SpillMetrics;
use datafusion::physical_plan::spill::SpillManager;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
    SendableRecordBatchStream,
};
use futures::StreamExt;

use super::owned::{compact_views, rows_bytes, take_rows};
use super::spill::{read_spilled, RemoteSpillFactory};

/// The fewest partitions a hybrid hash join splits its build side into when it does
/// not fit (more when its build side is estimated larger: see `JoinRun::build_fanout`
/// in `join`). The partitions that fit stay in memory, but each spilled one writes a
/// build and a probe file and is joined on its own: at 25 MiB, 64 partitions cut
/// q47's self-joins of 7.5 MB into 256 files of 60 KB. Measured over all 99 at
/// 25 MiB with every join split this many ways: 64 took 7.16 s, 16 6.74 s (q72
/// 0.37x, q47 0.84x), 8 6.76 s; at 25 %, 16 and 64 alike.
pub(crate) const JOIN_FANOUT: usize = 16;

/// The fewest partitions a spilling aggregate splits its input into at the first
/// level, where the input's size is unknown (a partition split again is split by
/// its size); see [`aggregate_fanout`].
pub(crate) const AGGREGATE_FANOUT: usize = 16;

/// The room of its cap each first-level partition of a spilling aggregate is given
/// at least (see [`aggregate_fanout`]).
const AGGREGATE_PARTITION_ROOM: usize = 128 << 10;

/// The partitions a spilling aggregate with `cap` bytes whose groups are estimated
/// to take `groups_cost` bytes (`None`: unknown) splits its input into at the first
/// level. Unknown: as many as leave each [`AGGREGATE_PARTITION_ROOM`] of the cap,
/// from [`AGGREGATE_FANOUT`] to [`SPLIT_FANOUT`]. Estimated: as few as leave each
/// partition's groups a quarter of the cap, at least [`FEWEST_AGGREGATE_FANOUT`] and
/// at most as many as unknown: a batch cut into fewer pieces costs less to
/// aggregate, a spilled partition gets larger writes, and each still fits when read
/// back (query-bench's group-by at 25 %, 490 k groups: 0.13 s over 64 partitions,
/// 0.09 s over 8). As many partitions as fit stay in
/// memory and small spilled ones are aggregated together, so a large input is best
/// split many ways at once: q67 at 25 MiB, 14 times its share, moved 0.7 GB over
/// 64 partitions and 1.2 GB over 16 (its partitions split again). Under a small cap
/// each batch cut into many pieces costs more than it saves (every piece is a
/// batch of its own to reserve, spill and read back), and the plans' statistics
/// carry no reliable row counts to choose by.
pub(crate) fn aggregate_fanout(cap: usize, groups_cost: Option<usize>) -> usize {
    let fits = cap / AGGREGATE_PARTITION_ROOM;
    let fanout = if fits == 0 { 1 } else { 1 << fits.ilog2() };
    let most = fanout.clamp(AGGREGATE_FANOUT, SPLIT_FANOUT);
    match groups_cost {
        Some(cost) => (cost / (cap / 4).max(1) + 1)
            .next_power_of_two()
            .clamp(FEWEST_AGGREGATE_FANOUT, most),
        None => most,
    }
}

/// The fewest partitions a spilling aggregate whose groups are estimated splits its
/// input into at the first level (an estimate too low costs a level more).
const FEWEST_AGGREGATE_FANOUT: usize = 4;

/// The most partitions a partition too large for its share is split into.
pub(crate) const SPLIT_FANOUT: usize = 64;

/// Levels of re-partitioning before a partition is handed to the wrapped operator as
/// is. A partition still too large then holds a key too frequent for the budget,
/// which the join and the aggregate each handle (see [`super::skew`]).
pub(crate) const MAX_LEVEL: u32 = 3;

/// The partitions to split an input costing `cost` into when it does not fit `cap`
/// at a level below the first (where its size is known): each part about half the
/// cap, so that a few fit at once and no further level is needed; at least two, at
/// most [`SPLIT_FANOUT`].
pub(crate) fn split_fanout(cost: usize, cap: usize) -> usize {
    (cost / (cap / 2).max(1) + 1)
        .next_power_of_two()
        .clamp(2, SPLIT_FANOUT)
}

/// The hash seed of partitioning level `level`: a new seed per level, so that a
/// partition split again spreads over new partitions. The seeds are far apart
/// (SplitMix64 of the level): seeds one apart gave hashes whose high bits agree, and
/// a partition split four ways at the next level put 70 % of its rows in one part
/// and none in another.
pub(crate) fn level_seed(level: u32) -> u64 {
    let mut z = (0x5cad_u64 + u64::from(level)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Batches read under `reservation` (each batch having reserved `cost(batch)`), as a
/// stream that gives each batch's share back as it hands the batch on, for the
/// operator consuming them to reserve in turn (giving back after the hand-off would
/// count the batch twice while the consumer reserves). Whatever the reservation
/// holds beyond the batches' shares is given back first.
pub(crate) fn reserved_stream(
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
    reservation: MemoryReservation,
    cost: fn(&RecordBatch) -> usize,
) -> SendableRecordBatchStream {
    let shares: usize = batches.iter().map(cost).sum();
    reservation.shrink(reservation.size().saturating_sub(shares));
    let state = (VecDeque::from(batches), reservation);
    let stream = futures::stream::unfold(state, move |(mut queue, reservation)| async move {
        let batch = queue.pop_front()?;
        reservation.shrink(cost(&batch).min(reservation.size()));
        Some((Ok(batch), (queue, reservation)))
    });
    Box::pin(RecordBatchStreamAdapter::new(schema, stream))
}

/// An empty stream of `schema`.
pub(crate) fn empty_stream(schema: SchemaRef) -> DfResult<SendableRecordBatchStream> {
    Ok(Box::pin(MemoryStream::try_new(vec![], schema, None)?))
}

/// The stream of a spill file written by a partitioning (batches that own their
/// rows, gathered into batches of `batch_rows`), or an empty stream for a partition
/// without rows.
pub(crate) fn partition_stream(
    spill: &SpillManager,
    file: Option<Arc<dyn SpillFile>>,
    batch_rows: usize,
) -> DfResult<SendableRecordBatchStream> {
    let Some(file) = file else {
        return empty_stream(spill.schema().clone());
    };
    let schema = spill.schema().clone();
    let stream = read_spilled(file, schema.clone())?;
    // Partitioning cuts every input batch into as many pieces as there are
    // partitions: gathered again, the operator reading them back works on full
    // batches. Decoded batches point into the remote block they were read in; the
    // gathering copies their rows out.
    let gather = BatchCoalescer::new(schema.clone(), batch_rows.max(1));
    let state = (stream, Some(gather));
    let gathered = futures::stream::unfold(state, |(mut input, mut gather)| async move {
        loop {
            let g = gather.as_mut()?;
            if let Some(batch) = g.next_completed_batch() {
                return Some((Ok(batch), (input, gather)));
            }
            match input.next().await {
                Some(Ok(batch)) => {
                    if let Err(e) = g.push_batch(batch) {
                        return Some((Err(e.into()), (input, None)));
                    }
                }
                Some(Err(e)) => return Some((Err(e), (input, None))),
                None => {
                    let rest = g.finish_buffered_batch().map(|()| g.next_completed_batch());
                    return match rest {
                        // The last batch is short, but its buffers were sized for a
                        // whole batch, and would be counted so by whatever reserves
                        // it: a partition of a few rows would look many times its
                        // size. Copied, it takes what its rows need.
                        Ok(Some(batch)) => {
                            let rows: Vec<u32> = (0..batch.num_rows() as u32).collect();
                            Some((take_rows(&batch, &rows), (input, None)))
                        }
                        Ok(None) => None,
                        Err(e) => Some((Err(e.into()), (input, None))),
                    };
                }
            }
        }
    });
    Ok(Box::pin(RecordBatchStreamAdapter::new(schema, gathered)))
}

/// Splits batches by the seeded hash of their key columns.
pub(crate) struct Partitioner {
    keys: Vec<Arc<dyn PhysicalExpr>>,
    hasher: RandomState,
    fanout: usize,
    hashes: Vec<u64>,
}

impl Partitioner {
    pub(crate) fn new(keys: Vec<Arc<dyn PhysicalExpr>>, seed: u64, fanout: usize) -> Self {
        Partitioner {
            keys,
            hasher: RandomState::with_seed(seed),
            fanout: fanout.max(1),
            hashes: Vec::new(),
        }
    }

    pub(crate) fn fanout(&self) -> usize {
        self.fanout
    }

    /// The partition of each row of `batch` (every row with the same key values in
    /// the same one).
    fn partitions(&mut self, batch: &RecordBatch) -> DfResult<Vec<usize>> {
        let rows = batch.num_rows();
        let arrays: Vec<ArrayRef> = self
            .keys
            .iter()
            .map(|k| k.evaluate(batch)?.into_array(rows))
            .collect::<DfResult<_>>()?;
        self.hashes.clear();
        self.hashes.resize(rows, 0u64);
        create_hashes(&arrays, &self.hasher, &mut self.hashes)?;
        // The high bits: the wrapped operator's own hash table uses the low ones.
        Ok(self
            .hashes
            .iter()
            .map(|h| ((h >> 40) as usize) % self.fanout)
            .collect())
    }

    /// The row indices of `batch` in each partition, in row order.
    pub(crate) fn indices(&mut self, batch: &RecordBatch) -> DfResult<Vec<Vec<u32>>> {
        let mut indices: Vec<Vec<u32>> = vec![Vec::new(); self.fanout];
        for (row, p) in self.partitions(batch)?.into_iter().enumerate() {
            indices[p].push(row as u32);
        }
        Ok(indices)
    }

    /// `batch` split into its non-empty partitions, each piece owning its rows.
    pub(crate) fn split(&mut self, batch: &RecordBatch) -> DfResult<Vec<(usize, RecordBatch)>> {
        if batch.num_rows() == 0 {
            return Ok(Vec::new());
        }
        self.indices(batch)?
            .into_iter()
            .enumerate()
            .filter(|(_, rows)| !rows.is_empty())
            .map(|(p, rows)| Ok((p, take_rows(batch, &rows)?)))
            .collect()
    }
}

/// A finished spill file (`None`: nothing was written).
type Finished = DfResult<Option<Arc<dyn SpillFile>>>;

/// A spill file being written batch by batch (DataFusion's in-progress spill file,
/// whose type is not public).
pub(crate) trait PartitionWriter: Send {
    fn append(&mut self, batch: &RecordBatch) -> DfResult<()>;
    fn finish(&mut self) -> Finished;
}

struct InProgress<F> {
    file: F,
    append: fn(&mut F, &RecordBatch) -> DfResult<usize>,
    finish: fn(&mut F) -> Finished,
}

impl<F: Send> PartitionWriter for InProgress<F> {
    fn append(&mut self, batch: &RecordBatch) -> DfResult<()> {
        (self.append)(&mut self.file, batch).map(|_| ())
    }

    fn finish(&mut self) -> Finished {
        (self.finish)(&mut self.file)
    }
}

/// A new spill file of `spill`'s schema, described as `what`.
pub(crate) fn partition_writer(
    spill: &SpillManager,
    what: &str,
) -> DfResult<Box<dyn PartitionWriter>> {
    Ok(Box::new(InProgress {
        file: spill.create_in_progress_file(what)?,
        append: |f, b| f.append_batch(b),
        finish: |f| f.finish(),
    }))
}

/// Spill files opened through the session's factory with blocks of their own size
/// (see [`RemoteSpillFactory::create_file`]), written as DataFusion's in-progress
/// files write theirs (an Arrow IPC stream of the spill manager's schema, aligned as
/// theirs, view arrays compacted) and counted in the same metrics (the bytes as the
/// rows' bytes).
#[derive(Clone)]
pub(crate) struct SizedBlocks {
    pub(crate) factory: Arc<RemoteSpillFactory>,
    pub(crate) block_bytes: usize,
    pub(crate) metrics: SpillMetrics,
}

/// A partition's file opened with [`SizedBlocks`].
struct SizedWriter {
    file: Arc<dyn SpillFile>,
    schema: SchemaRef,
    metrics: SpillMetrics,
    writer: Option<StreamWriter<Box<dyn SpillWriter>>>,
}

impl PartitionWriter for SizedWriter {
    fn append(&mut self, batch: &RecordBatch) -> DfResult<()> {
        let writer = match &mut self.writer {
            Some(writer) => writer,
            slot => {
                let options = IpcWriteOptions::try_new(
                    spill_alignment(&self.schema),
                    false,
                    MetadataVersion::V5,
                )?;
                let writer = StreamWriter::try_new_with_options(
                    self.file.open_writer()?,
                    &self.schema,
                    options,
                )?;
                self.metrics.spill_file_count.add(1);
                slot.insert(writer)
            }
        };
        let batch = compact_views(batch)?;
        writer.write(&batch)?;
        self.metrics.spilled_rows.add(batch.num_rows());
        self.metrics.spilled_bytes.add(rows_bytes(&batch));
        Ok(())
    }

    fn finish(&mut self) -> Finished {
        let Some(mut writer) = self.writer.take() else {
            return Ok(None);
        };
        writer.finish()?;
        writer.into_inner()?.finish()?;
        Ok(Some(self.file.clone()))
    }
}

/// The alignment of a spill file's buffers: the largest any column's buffers need,
/// at least 8, as DataFusion's spill writer aligns them (a view array read back from
/// buffers aligned less would be copied).
fn spill_alignment(schema: &SchemaRef) -> usize {
    schema
        .fields()
        .iter()
        .flat_map(|field| layout(field.data_type()).buffers)
        .map(|buffer| match buffer {
            BufferSpec::FixedWidth { alignment, .. } => alignment,
            _ => 8,
        })
        .fold(8, usize::max)
}

/// One spill file per partition, each opened when its partition's first rows are
/// written.
struct PartitionFiles {
    spill: Arc<SpillManager>,
    what: String,
    writers: Vec<Option<Box<dyn PartitionWriter>>>,
    sized: Option<SizedBlocks>,
}

impl PartitionFiles {
    /// `fanout` partitions' files of `spill`'s schema, described as `what`.
    fn new(spill: Arc<SpillManager>, what: &str, fanout: usize) -> Self {
        PartitionFiles {
            spill,
            what: what.to_owned(),
            writers: (0..fanout).map(|_| None).collect(),
            sized: None,
        }
    }

    /// A new file of `spill`'s schema for a partition, described as `what`.
    fn open(
        spill: &SpillManager,
        what: &str,
        sized: Option<&SizedBlocks>,
    ) -> DfResult<Box<dyn PartitionWriter>> {
        let Some(sized) = sized else {
            return partition_writer(spill, what);
        };
        Ok(Box::new(SizedWriter {
            file: sized.factory.create_file(what, sized.block_bytes),
            schema: spill.schema().clone(),
            metrics: sized.metrics.clone(),
            writer: None,
        }))
    }

    /// Whether partition `p` has a file.
    fn has(&self, p: usize) -> bool {
        self.writers[p].is_some()
    }

    /// Appends `batch` to partition `p`'s file.
    fn append(&mut self, p: usize, batch: &RecordBatch) -> DfResult<()> {
        let writer = match &mut self.writers[p] {
            Some(w) => w,
            slot => slot.insert(Self::open(&self.spill, &self.what, self.sized.as_ref())?),
        };
        writer.append(batch)
    }

    /// The spill file of each partition (`None` where nothing was written).
    fn finish(&mut self) -> DfResult<Vec<Option<Arc<dyn SpillFile>>>> {
        std::mem::take(&mut self.writers)
            .into_iter()
            .map(|w| match w {
                Some(mut w) => w.finish(),
                None => Ok(None),
            })
            .collect()
    }
}

/// Grows `reservation` by `need` bytes if it then holds at most `cap` and the pool
/// grants them.
pub(crate) fn grow_within(reservation: &MemoryReservation, need: usize, cap: usize) -> bool {
    reservation.size() + need <= cap && reservation.try_grow(need).is_ok()
}

/// Pieces a partition kept in memory holds before they are gathered into one batch.
const GATHER_PIECES: usize = 16;

/// The spilled partitions of a hybrid partitioning: a spill file each, and pieces
/// queued for it. A batch cut 64 ways gives pieces of a few rows, and each written
/// alone costs its own message header, encoding and decoding (a spilled DISTINCT at
/// 5 % took 2.4x as long): a partition's pieces are queued, under the partitioning's
/// reservation, and written as one batch.
pub(crate) struct SpilledPartitions {
    /// A partition with a file is spilled.
    files: PartitionFiles,
    pending: Vec<Vec<RecordBatch>>,
    pending_bytes: Vec<usize>,
    cost: fn(&RecordBatch) -> usize,
}

impl SpilledPartitions {
    /// `fanout` partitions spilled through `spill` (described as `what`), none yet;
    /// a queued piece reserves `cost(piece)`.
    pub(crate) fn new(
        spill: Arc<SpillManager>,
        what: &str,
        fanout: usize,
        cost: fn(&RecordBatch) -> usize,
    ) -> Self {
        SpilledPartitions {
            files: PartitionFiles::new(spill, what, fanout),
            pending: (0..fanout).map(|_| Vec::new()).collect(),
            pending_bytes: vec![0; fanout],
            cost,
        }
    }

    /// Its files opened with blocks of their own size.
    pub(crate) fn with_sized_blocks(mut self, sized: Option<SizedBlocks>) -> Self {
        self.files.sized = sized;
        self
    }

    /// Whether partition `p` is spilled.
    pub(crate) fn has(&self, p: usize) -> bool {
        self.files.has(p)
    }

    /// Writes `batch` to partition `p`'s file now (spilling `p` if it was not).
    pub(crate) fn append(&mut self, p: usize, batch: &RecordBatch) -> DfResult<()> {
        self.files.append(p, batch)
    }

    /// Whether pieces are queued, holding memory.
    pub(crate) fn any_pending(&self) -> bool {
        self.pending_bytes.iter().any(|&b| b > 0)
    }

    /// Queues `part` for spilled partition `p` under `reservation` (up to `cap`
    /// bytes in all, a quarter of it for queues), writing the partition's queued
    /// pieces as one batch once there are enough of them or no memory to queue.
    pub(crate) fn write_later(
        &mut self,
        p: usize,
        part: RecordBatch,
        reservation: &MemoryReservation,
        cap: usize,
    ) -> DfResult<()> {
        let need = (self.cost)(&part);
        let queued = self.pending[p].len() + 1 < GATHER_PIECES
            && self.pending_bytes.iter().sum::<usize>() + need <= cap / 4
            && grow_within(reservation, need, cap);
        self.pending[p].push(part);
        if queued {
            self.pending_bytes[p] += need;
            return Ok(());
        }
        self.flush(p, reservation)
    }

    /// Writes spilled partition `p`'s queued pieces as one batch.
    fn flush(&mut self, p: usize, reservation: &MemoryReservation) -> DfResult<()> {
        let pieces = std::mem::take(&mut self.pending[p]);
        let batch = match pieces.as_slice() {
            [] => return Ok(()),
            [one] => one.clone(),
            [first, ..] => concat_batches(&first.schema(), &pieces)?,
        };
        self.files.append(p, &batch)?;
        let queued = std::mem::take(&mut self.pending_bytes[p]);
        reservation.shrink(queued.min(reservation.size()));
        Ok(())
    }

    /// Writes every queue, giving its memory back to `reservation`.
    pub(crate) fn flush_all(&mut self, reservation: &MemoryReservation) -> DfResult<()> {
        (0..self.pending.len()).try_for_each(|p| self.flush(p, reservation))
    }

    /// The spill file of each partition (`None` where nothing was written), once
    /// the queues are written.
    pub(crate) fn finish(
        &mut self,
        reservation: &MemoryReservation,
    ) -> DfResult<Vec<Option<Arc<dyn SpillFile>>>> {
        self.flush_all(reservation)?;
        self.files.finish()
    }
}

/// A build side split by key hash into partitions kept in memory while a
/// reservation (up to a cap) takes them; when it does not, the largest partition in
/// memory is written to a spill file and every later row of it follows there (a
/// hybrid hash join's build phase).
pub(crate) struct HybridPartitions {
    partitioner: Partitioner,
    held: Vec<Vec<RecordBatch>>,
    held_bytes: Vec<usize>,
    spilled: SpilledPartitions,
    reservation: MemoryReservation,
    cap: usize,
    cost: fn(&RecordBatch) -> usize,
}

/// The partitions of a [`HybridPartitions`] once its input ended.
pub(crate) struct PartitionedBuild {
    /// Rows of the partitions kept in memory, under `reservation`.
    pub(crate) held: Vec<RecordBatch>,
    pub(crate) reservation: MemoryReservation,
    /// Which partitions were spilled.
    pub(crate) spilled: Vec<bool>,
    /// The spill file of each spilled partition.
    pub(crate) files: Vec<Option<Arc<dyn SpillFile>>>,
}

impl HybridPartitions {
    /// Partitions by `partitioner`, holding up to `cap` bytes (as `cost` counts
    /// them) under `reservation` and spilling through `spill` beyond.
    pub(crate) fn new(
        partitioner: Partitioner,
        spill: Arc<SpillManager>,
        what: &str,
        reservation: MemoryReservation,
        cap: usize,
        cost: fn(&RecordBatch) -> usize,
    ) -> Self {
        let fanout = partitioner.fanout();
        HybridPartitions {
            partitioner,
            held: (0..fanout).map(|_| Vec::new()).collect(),
            held_bytes: vec![0; fanout],
            spilled: SpilledPartitions::new(spill, what, fanout, cost),
            reservation,
            cap,
            cost,
        }
    }

    /// Adds the rows of `batch` to their partitions.
    pub(crate) fn push(&mut self, batch: &RecordBatch) -> DfResult<()> {
        for (p, part) in self.partitioner.split(batch)? {
            if self.spilled.has(p) {
                self.spilled
                    .write_later(p, part, &self.reservation, self.cap)?;
                continue;
            }
            let need = (self.cost)(&part);
            loop {
                if grow_within(&self.reservation, need, self.cap) {
                    self.held[p].push(part);
                    self.held_bytes[p] += need;
                    if self.held[p].len() >= GATHER_PIECES {
                        self.gather(p)?;
                    }
                    break;
                }
                // Pieces waiting to be written give their memory back first.
                if self.spilled.any_pending() {
                    self.spilled.flush_all(&self.reservation)?;
                    continue;
                }
                // The largest partition in memory goes to memory elements (this
                // one if it is the largest, or if no other holds anything).
                let victim = (0..self.held.len())
                    .filter(|&q| !self.spilled.has(q))
                    .max_by_key(|&q| self.held_bytes[q])
                    .filter(|&q| self.held_bytes[q] > 0)
                    .unwrap_or(p);
                self.spill_partition(victim)?;
                if victim == p {
                    self.spilled
                        .write_later(p, part, &self.reservation, self.cap)?;
                    break;
                }
            }
        }
        Ok(())
    }

    /// Gives back `bytes` of the reservation (at most what it holds): rows reserved
    /// before they were handed to the partitions, which reserve them again.
    pub(crate) fn give_back(&mut self, bytes: usize) {
        self.reservation.shrink(bytes.min(self.reservation.size()));
    }

    /// Partition `p`'s pieces as one batch. A piece of a batch cut 64 ways holds a
    /// few rows in buffers of their own, each with its fixed cost: gathered, they
    /// take what their rows need, and the partition keeps more rows in memory.
    fn gather(&mut self, p: usize) -> DfResult<()> {
        let pieces = std::mem::take(&mut self.held[p]);
        let schema = pieces[0].schema();
        let whole = concat_batches(&schema, &pieces)?;
        drop(pieces);
        let cost = (self.cost)(&whole);
        let before = std::mem::replace(&mut self.held_bytes[p], cost);
        if cost <= before {
            self.reservation
                .shrink((before - cost).min(self.reservation.size()));
        } else {
            self.reservation.grow(cost - before);
        }
        self.held[p].push(whole);
        Ok(())
    }

    fn spill_partition(&mut self, p: usize) -> DfResult<()> {
        for batch in std::mem::take(&mut self.held[p]) {
            self.spilled.append(p, &batch)?;
        }
        self.reservation
            .shrink(std::mem::take(&mut self.held_bytes[p]).min(self.reservation.size()));
        Ok(())
    }

    /// The partitions as they stand, once the partitions in memory have reserved
    /// `state(rows)` more for what their consumer builds on their rows (a join's
    /// table): the largest ones are spilled until that fits under the cap.
    pub(crate) fn finish_with_state(
        mut self,
        state: impl Fn(&[RecordBatch]) -> DfResult<usize>,
    ) -> DfResult<PartitionedBuild> {
        self.spilled.flush_all(&self.reservation)?;
        loop {
            let held: Vec<RecordBatch> = self.held.iter().flatten().cloned().collect();
            let need = state(&held)?;
            if grow_within(&self.reservation, need, self.cap) {
                break;
            }
            let victim = (0..self.held.len())
                .filter(|&q| !self.spilled.has(q) && self.held_bytes[q] > 0)
                .max_by_key(|&q| self.held_bytes[q]);
            match victim {
                Some(q) => self.spill_partition(q)?,
                // Nothing held: nothing is built.
                None => break,
            }
        }
        self.finish()
    }

    /// The partitions as they stand: those in memory and the spilled ones' files.
    pub(crate) fn finish(mut self) -> DfResult<PartitionedBuild> {
        let spilled = (0..self.held.len()).map(|p| self.spilled.has(p)).collect();
        let files = self.spilled.finish(&self.reservation)?;
        Ok(PartitionedBuild {
            held: self.held.into_iter().flatten().collect(),
            reservation: self.reservation,
            spilled,
            files,
        })
    }
}

/// A probe side routed by the build side's partitions: rows of partitions held in
/// memory are handed on (to the join over those partitions), rows of spilled ones
/// are written to a spill file per partition.
pub(crate) struct ProbeRouter {
    input: SendableRecordBatchStream,
    partitioner: Partitioner,
    spilled: Vec<bool>,
    /// The spilled partitions' probe rows.
    files: PartitionFiles,
    /// The files once the input ended.
    finished: Option<Vec<Option<Arc<dyn SpillFile>>>>,
}

impl ProbeRouter {
    pub(crate) fn new(
        input: SendableRecordBatchStream,
        partitioner: Partitioner,
        spilled: Vec<bool>,
        spill: Arc<SpillManager>,
        what: &str,
    ) -> Self {
        let fanout = partitioner.fanout();
        ProbeRouter {
            input,
            partitioner,
            spilled,
            files: PartitionFiles::new(spill, what, fanout),
            finished: None,
        }
    }

    /// The next rows of partitions held in memory; `None` once the input ended (its
    /// spilled rows are then all written, and [`ProbeRouter::files`] has them).
    pub(crate) async fn next_held(&mut self) -> Option<DfResult<RecordBatch>> {
        loop {
            if self.finished.is_some() {
                return None;
            }
            let Some(batch) = self.input.next().await else {
                return match self.files.finish() {
                    Ok(files) => {
                        self.finished = Some(files);
                        None
                    }
                    Err(e) => Some(Err(e)),
                };
            };
            match self.route(batch) {
                Ok(Some(held)) => return Some(Ok(held)),
                Ok(None) => {}
                Err(e) => return Some(Err(e)),
            }
        }
    }

    fn route(&mut self, batch: DfResult<RecordBatch>) -> DfResult<Option<RecordBatch>> {
        let batch = batch?;
        if batch.num_rows() == 0 {
            return Ok(None);
        }
        // Rows of held partitions are picked out by a mask, in their order; rows of
        // spilled ones gathered per partition.
        let partitions = self.partitioner.partitions(&batch)?;
        let mut spilled_rows: Vec<Vec<u32>> = vec![Vec::new(); self.spilled.len()];
        let mut held = BooleanBufferBuilder::new(partitions.len());
        for (row, &p) in partitions.iter().enumerate() {
            let spilled = self.spilled[p];
            held.append(!spilled);
            if spilled {
                spilled_rows[p].push(row as u32);
            }
        }
        for (p, rows) in spilled_rows.into_iter().enumerate() {
            if !rows.is_empty() {
                self.files.append(p, &take_rows(&batch, &rows)?)?;
            }
        }
        let held = BooleanArray::new(held.finish(), None);
        match held.true_count() {
            0 => Ok(None),
            n if n == batch.num_rows() => Ok(Some(batch)),
            _ => Ok(Some(compact_views(&filter_record_batch(&batch, &held)?)?)),
        }
    }

    /// Reads the rest of the input (what the join over the partitions in memory
    /// did not ask for) and returns the spilled partitions' files.
    pub(crate) async fn files(&mut self) -> DfResult<Vec<Option<Arc<dyn SpillFile>>>> {
        while let Some(held) = self.next_held().await {
            held?;
        }
        Ok(self.finished.take().unwrap_or_default())
    }
}

/// A leaf that yields one prepared stream once: how a spilling operator hands rows it
/// already read (or spilled) to the DataFusion operator it wraps. With several
/// partitions, each partition's stream is put in its slot ([`OneShotExec::put`])
/// before that partition is executed.
pub(crate) struct OneShotExec {
    streams: Mutex<Vec<Option<SendableRecordBatchStream>>>,
    properties: Arc<PlanProperties>,
}

impl OneShotExec {
    pub(crate) fn new(schema: SchemaRef, stream: SendableRecordBatchStream) -> Self {
        let exec = OneShotExec::slots(schema, 1);
        exec.lock()[0] = Some(stream);
        exec
    }

    /// `partitions` empty slots, each filled by [`OneShotExec::put`].
    pub(crate) fn slots(schema: SchemaRef, partitions: usize) -> Self {
        OneShotExec {
            streams: Mutex::new((0..partitions).map(|_| None).collect()),
            properties: Arc::new(PlanProperties::new(
                EquivalenceProperties::new(schema),
                Partitioning::UnknownPartitioning(partitions),
                EmissionType::Incremental,
                Boundedness::Bounded,
            )),
        }
    }

    /// Partition `partition`'s stream, for it to yield once.
    pub(crate) fn put(&self, partition: usize, stream: SendableRecordBatchStream) -> DfResult<()> {
        match self.lock().get_mut(partition) {
            Some(slot @ None) => {
                *slot = Some(stream);
                Ok(())
            }
            _ => Err(DataFusionError::Internal(format!(
                "OneShotExec: partition {partition} put twice, or no such partition"
            ))),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Option<SendableRecordBatchStream>>> {
        self.streams.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl fmt::Debug for OneShotExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OneShotExec")
    }
}

impl DisplayAs for OneShotExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("OneShotExec")
    }
}

impl ExecutionPlan for OneShotExec {
    super::operator::leaf_plan_methods!("OneShotExec");

    fn execute(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let taken = self.lock().get_mut(partition).and_then(Option::take);
        taken.ok_or_else(|| {
            DataFusionError::Internal(format!(
                "OneShotExec: partition {partition} asked for before it was put, or twice"
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::Int64Array;
    use datafusion::physical_expr::expressions::Column;

    use super::*;

    #[test]
    fn an_aggregate_is_split_more_ways_the_more_room_it_has() {
        // Each partition has at least its room of the cap, within 16 and 64.
        assert_eq!(aggregate_fanout(0, None), 16);
        assert_eq!(aggregate_fanout(80_000, None), 16);
        assert_eq!(aggregate_fanout(2 << 20, None), 16);
        assert_eq!(aggregate_fanout((4 << 20) + 1, None), 32);
        assert_eq!(aggregate_fanout((8 << 20) - 1, None), 32);
        assert_eq!(aggregate_fanout(8 << 20, None), 64);
        assert_eq!(aggregate_fanout(usize::MAX, None), 64);
        // Estimated groups: a quarter of the cap each, between 4 and the above.
        let cap = 8 << 20;
        assert_eq!(aggregate_fanout(cap, Some(0)), 4);
        assert_eq!(aggregate_fanout(cap, Some(cap)), 8);
        assert_eq!(aggregate_fanout(cap, Some(3 * cap)), 16);
        assert_eq!(aggregate_fanout(cap, Some(100 * cap)), 64);
        assert_eq!(aggregate_fanout(2 << 20, Some(100 << 20)), 16);
    }

    #[test]
    fn a_partition_split_again_spreads_evenly_over_the_next_level() {
        let keys = Int64Array::from_iter_values((0..64_000).map(|i| 1_000_000 + i * 7));
        let batch = RecordBatch::try_from_iter([("k", Arc::new(keys) as ArrayRef)]).unwrap();
        let key: Arc<dyn PhysicalExpr> = Arc::new(Column::new("k", 0));
        let mut first = Partitioner::new(vec![key.clone()], level_seed(0), 16);
        let mut second = Partitioner::new(vec![key], level_seed(1), 4);
        let (p0, p1) = (
            first.partitions(&batch).unwrap(),
            second.partitions(&batch).unwrap(),
        );
        // Each first-level partition (about 4,000 rows) cut four ways: about 1,000
        // rows each, where correlated seeds left a part empty.
        let mut counts = vec![[0usize; 4]; 16];
        for (a, b) in p0.into_iter().zip(p1) {
            counts[a][b] += 1;
        }
        for parts in counts {
            let total: usize = parts.iter().sum();
            for n in parts {
                assert!(n * 4 > total / 2 && n * 4 < total * 3 / 2, "{parts:?}");
            }
        }
    }
}
