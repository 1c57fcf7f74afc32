//! What the spilling operators share (the hash join and the aggregate): rows read
//! under a reservation handed on as a stream that gives the memory back as it goes,
//! hash partitioning of a stream into spill files in memory elements (grace
//! partitioning), and a leaf that feeds a prepared stream to a wrapped DataFusion
//! operator.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use arrow_array::{ArrayRef, RecordBatch, UInt32Array};
use arrow_schema::SchemaRef;
use datafusion::arrow::compute::take_record_batch;
use datafusion::common::hash_utils::{create_hashes, RandomState};
use datafusion::common::{DataFusionError, Result as DfResult};
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::execution::{SpillFile, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::memory::MemoryStream;
use datafusion::physical_plan::spill::SpillManager;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
    SendableRecordBatchStream,
};
use futures::StreamExt;

use super::owned::owned_batch;

/// Partitions an input is split into when it does not fit.
pub(crate) const FANOUT: usize = 16;

/// Levels of re-partitioning before a partition is handed to the wrapped operator as
/// is (which may then spill on its own, or fail with the pool's out-of-memory error
/// naming it).
pub(crate) const MAX_LEVEL: u32 = 3;

/// The hash seed of partitioning level `level`: a new seed per level, so that a
/// partition split again spreads over new partitions.
pub(crate) fn level_seed(level: u32) -> u64 {
    0x5cad_0000_u64 + u64::from(level)
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

/// The stream of a spill file written by [`spill_partitioned`] (batches that own
/// their rows), or an empty stream for a partition without rows.
pub(crate) fn partition_stream(
    spill: &SpillManager,
    file: Option<Arc<dyn SpillFile>>,
) -> DfResult<SendableRecordBatchStream> {
    match file {
        Some(f) => {
            // Decoded batches point into the remote block they were read in.
            let stream = spill.read_spill_as_stream(f, None)?;
            let schema = stream.schema();
            let owned = stream.map(|b| b.and_then(|b| owned_batch(&b)));
            Ok(Box::pin(RecordBatchStreamAdapter::new(schema, owned)))
        }
        None => empty_stream(spill.schema().clone()),
    }
}

/// Writes the batches of `input` into [`FANOUT`] spill files by the hash (seeded
/// with `seed`) of their `keys`; returns the files (`None` for a partition without
/// rows). Every row with the same key values lands in the same partition.
pub(crate) async fn spill_partitioned<S>(
    spill: &SpillManager,
    keys: &[Arc<dyn PhysicalExpr>],
    seed: u64,
    what: &str,
    mut input: S,
) -> DfResult<Vec<Option<Arc<dyn SpillFile>>>>
where
    S: futures::Stream<Item = DfResult<RecordBatch>> + Unpin,
{
    let hasher = RandomState::with_seed(seed);
    let mut files: Vec<Option<_>> = (0..FANOUT).map(|_| None).collect();
    let mut hashes = Vec::new();
    while let Some(batch) = input.next().await {
        let batch = batch?;
        let rows = batch.num_rows();
        if rows == 0 {
            continue;
        }
        let arrays: Vec<ArrayRef> = keys
            .iter()
            .map(|k| k.evaluate(&batch)?.into_array(rows))
            .collect::<DfResult<_>>()?;
        hashes.clear();
        hashes.resize(rows, 0u64);
        create_hashes(&arrays, &hasher, &mut hashes)?;
        let mut indices: Vec<Vec<u32>> = vec![Vec::new(); FANOUT];
        for (row, h) in hashes.iter().enumerate() {
            // The high bits: the wrapped operator's own hash table uses the low ones.
            let p = ((h >> 40) as usize) % FANOUT;
            indices[p].push(row as u32);
        }
        for (p, rows) in indices.into_iter().enumerate() {
            if rows.is_empty() {
                continue;
            }
            let part = take_record_batch(&batch, &UInt32Array::from(rows))?;
            let file = match &mut files[p] {
                Some(f) => f,
                slot => slot.insert(spill.create_in_progress_file(what)?),
            };
            file.append_batch(&part)?;
        }
    }
    files
        .into_iter()
        .map(|f| match f {
            Some(mut f) => f.finish(),
            None => Ok(None),
        })
        .collect()
}

/// A leaf that yields one prepared stream once: how a spilling operator hands rows it
/// already read (or spilled) to the DataFusion operator it wraps.
pub(crate) struct OneShotExec {
    stream: Mutex<Option<SendableRecordBatchStream>>,
    properties: Arc<PlanProperties>,
}

impl OneShotExec {
    pub(crate) fn new(schema: SchemaRef, stream: SendableRecordBatchStream) -> Self {
        OneShotExec {
            stream: Mutex::new(Some(stream)),
            properties: Arc::new(PlanProperties::new(
                EquivalenceProperties::new(schema),
                Partitioning::UnknownPartitioning(1),
                EmissionType::Incremental,
                Boundedness::Bounded,
            )),
        }
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
        let taken = self
            .stream
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        match (partition, taken) {
            (0, Some(s)) => Ok(s),
            _ => Err(DataFusionError::Internal(format!(
                "OneShotExec: partition {partition} asked for, or asked for twice"
            ))),
        }
    }
}
