//! The RemoteFrame scan: a DataFusion table over a [`RemoteFrame`] that reads only the
//! columns a query uses, chunk by chunk, straight from the memory elements.

use std::fmt;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Date32Type, Int32Type, Int64Type};
use arrow_array::{ArrayRef, BooleanArray, RecordBatch, RecordBatchOptions, UInt64Array};
use arrow_buffer::BooleanBuffer;
use arrow_schema::{DataType, SchemaRef};
use async_trait::async_trait;
use datafusion::arrow::compute::{cast, filter_record_batch};
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::cast::as_boolean_array;
use datafusion::common::config::ConfigOptions;
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{DFSchema, DataFusionError, Result as DfResult, ScalarValue, Statistics};
use datafusion::datasource::TableType;
use datafusion::execution::memory_pool::MemoryLimit;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::utils::conjunction;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::logical_expr::{JoinType, Operator};
use datafusion::physical_expr::expressions::{BinaryExpr, Column, Literal};
use datafusion::physical_expr::{conjunction_opt, EquivalenceProperties, PhysicalExpr};
use datafusion::physical_expr_common::physical_expr::{
    snapshot_generation, snapshot_physical_expr,
};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::filter_pushdown::{
    ChildPushdownResult, FilterPushdownPhase, FilterPushdownPropagation,
};
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet,
};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::statistics::StatisticsArgs;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::union::UnionExec;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
    SendableRecordBatchStream,
};
use std::collections::VecDeque;

use futures::StreamExt;

use super::join::SpillingHashJoinExec;
use super::key_bounds::{bits_where, KeySet};
use super::owned::owned_batch;
use super::stats::ChunkStatistics;
use crate::frame::{FetchedChunk, RemoteFrame};
use crate::meta::chunk_column_stored_bytes;

/// A [`RemoteFrame`] as a DataFusion table.
#[derive(Debug)]
pub(crate) struct RemoteTable {
    frame: RemoteFrame,
    schema: SchemaRef,
    stats: Arc<ChunkStatistics>,
    /// The whole table's statistics for the planner (computed once).
    table_stats: Statistics,
    /// The first row of each chunk, when the table has a row index column (the last).
    chunk_starts: Option<Arc<Vec<u64>>>,
}

impl RemoteTable {
    /// The frame as a table; with `row_index`, one more column of that name (UInt64,
    /// last): each row's position in the frame. It costs no reading (it is computed
    /// from the chunks' row counts) and gives operators that need the frame's order
    /// (a stable sort, first and last values) a key for it.
    ///
    /// # Errors
    /// As [`RemoteFrame::arrow_schema`]; [`crate::Error::InvalidArgument`] when the
    /// frame has a column named `row_index`.
    pub(crate) fn new(frame: RemoteFrame, row_index: Option<&str>) -> crate::Result<Self> {
        let stored = frame.arrow_schema()?;
        let chunks = &frame.meta().chunks;
        let (schema, chunk_starts) = match row_index {
            None => (stored, None),
            Some(name) => {
                if stored.index_of(name).is_ok() {
                    return Err(crate::Error::InvalidArgument(format!(
                        "the row index column {name:?} is already a column of the frame"
                    )));
                }
                let mut fields: Vec<_> = stored.fields().iter().cloned().collect();
                fields.push(Arc::new(arrow_schema::Field::new(
                    name,
                    arrow_schema::DataType::UInt64,
                    false,
                )));
                let starts = chunks
                    .iter()
                    .scan(0u64, |next, c| {
                        let start = *next;
                        *next += c.rows;
                        Some(start)
                    })
                    .collect();
                (
                    Arc::new(arrow_schema::Schema::new(fields)),
                    Some(Arc::new(starts)),
                )
            }
        };
        let stats = Arc::new(ChunkStatistics::new(schema.clone(), frame.meta()));
        let all_chunks: Vec<usize> = (0..frame.chunk_count()).collect();
        let all_columns: Vec<usize> = (0..schema.fields().len()).collect();
        let mut table_stats = stats.for_planner(frame.meta(), &all_chunks, &all_columns);
        // Distinct counts for our logical rules (eager aggregation) only: the scan's
        // own statistics, which DataFusion's join modes follow, stay rows and bytes.
        for (i, column) in table_stats.column_statistics.iter_mut().enumerate() {
            column.distinct_count = match frame.meta().distinct_estimate(i) {
                Some(d) => Precision::Inexact(d as usize),
                // The computed row index: one value per row.
                None if i == frame.meta().schema.len() => Precision::Exact(frame.rows()),
                None => Precision::Absent,
            };
        }
        Ok(RemoteTable {
            frame,
            schema,
            stats,
            table_stats,
            chunk_starts,
        })
    }
}

#[async_trait]
impl TableProvider for RemoteTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        self.frame
            .check_live()
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        let columns: Vec<usize> = match projection {
            Some(p) => p.clone(),
            None => (0..self.schema.fields().len()).collect(),
        };
        let schema = Arc::new(self.schema.project(&columns)?);
        let partitions = state.config().target_partitions().max(1);
        let batch_rows = state.config().batch_size().max(1);
        // The filters stay above the scan too (inexact pushdown): here they only
        // rule out the chunks whose statistics show no row can pass. A filter that
        // cannot be planned against the table alone prunes nothing, nor does one
        // too large for its table to be worth it (see `PRUNING_NODES_PER_CHUNK`).
        let max_nodes = PRUNING_NODES_PER_CHUNK
            .saturating_mul(self.frame.chunk_count())
            .max(PRUNING_MIN_NODES);
        let prunable = filters
            .iter()
            .filter(|f| expr_nodes(f) <= max_nodes)
            .cloned();
        let predicate = conjunction(prunable).and_then(|e| {
            let table = DFSchema::try_from(self.schema.as_ref().clone()).ok()?;
            state.create_physical_expr(e, &table).ok()
        });
        let chunks = self.stats.matching(predicate);
        // The row index (the table's last column) is computed, not read.
        let stored = self.frame.meta().schema.len();
        let row_index = self.chunk_starts.as_ref().and_then(|starts| {
            let at = columns.iter().position(|&c| c == stored)?;
            Some(RowIndex {
                at,
                starts: starts.clone(),
            })
        });
        let columns = columns.into_iter().filter(|&c| c < stored).collect();
        Ok(Arc::new(RemoteScanExec::new(
            self.frame.clone(),
            self.stats.clone(),
            chunks,
            columns,
            schema,
            partitions,
            batch_rows,
            limit,
            row_index,
        )))
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DfResult<Vec<TableProviderFilterPushDown>> {
        Ok(vec![TableProviderFilterPushDown::Inexact; filters.len()])
    }

    fn statistics(&self) -> Option<Statistics> {
        Some(self.table_stats.clone())
    }
}

/// Expression nodes per chunk of its table a pushed-down filter may have and still
/// be used to rule out chunks (but [`PRUNING_MIN_NODES`] on any table). Turning a
/// filter into a predicate over chunk statistics costs time in proportion to its
/// size, on every plan, while what it can save grows with the chunks it may skip:
/// q41's filter on item (207 nodes, 3 chunks) took about 0.25 ms of its 8 ms of
/// planning (profiled) and ruled out none of them, while over a large table sorted
/// on the filtered column a long list of ranges skips most chunks.
const PRUNING_NODES_PER_CHUNK: usize = 16;

/// Expression nodes a pushed-down filter may always have and still rule out chunks.
/// Of the filters the 99 TPC-DS queries push down, the largest that rules out chunks
/// has 63 (q88's merged time ranges: 3 of time_dim's 11 chunks kept).
const PRUNING_MIN_NODES: usize = 64;

/// Nodes of `expr` (itself, its operands, theirs, ...).
fn expr_nodes(expr: &Expr) -> usize {
    let mut nodes = 0;
    // Counting never fails (the closure returns no error).
    let _ = expr.apply(|_| {
        nodes += 1;
        Ok(TreeNodeRecursion::Continue)
    });
    nodes
}

/// Reads a frame's projected columns: chunks are dealt to the partitions in turn
/// (partition p reads chunks p, p + n, ... of n partitions, in frame order), and each
/// chunk read is one vectored read per memory element.
/// Chunks that dynamic filters pushed down from joins exclude are skipped, and the
/// rows they exclude are dropped from the chunks read when few pass (see
/// [`ROW_FILTER_MOST_KEPT`]).
#[derive(Debug, Clone)]
pub(crate) struct RemoteScanExec {
    frame: RemoteFrame,
    stats: Arc<ChunkStatistics>,
    /// The chunks read (those the filters may pass rows of), in order.
    chunks: Vec<usize>,
    columns: Vec<usize>,
    schema: SchemaRef,
    /// What the planner is told of the scan (computed once: the planner asks for it
    /// many times per query).
    planner_stats: Arc<Statistics>,
    /// Partitions the chunks are dealt to. In turn, not in contiguous ranges: the
    /// chunks a date range's dynamic filter leaves of a fact table stored in date
    /// order lie together, and contiguous ranges gave them all to one partition.
    parts: usize,
    batch_rows: usize,
    limit: Option<usize>,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
    /// Dynamic filters over the scan's columns (join key bounds), checked against
    /// each chunk's statistics before it is read.
    dynamic: Vec<Arc<dyn PhysicalExpr>>,
    row_index: Option<RowIndex>,
}

/// Where a scan's row index column goes and where each chunk's rows start.
#[derive(Debug, Clone)]
pub(crate) struct RowIndex {
    /// The column's position in the scan's schema.
    at: usize,
    /// The first row of each chunk of the frame.
    starts: Arc<Vec<u64>>,
}

impl RemoteScanExec {
    #[allow(clippy::too_many_arguments)]
    fn new(
        frame: RemoteFrame,
        stats: Arc<ChunkStatistics>,
        chunks: Vec<usize>,
        columns: Vec<usize>,
        schema: SchemaRef,
        partitions: usize,
        batch_rows: usize,
        limit: Option<usize>,
        row_index: Option<RowIndex>,
    ) -> Self {
        let n = chunks.len();
        let parts = partitions.min(n).max(1);
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(parts),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        let planner_stats = Arc::new(stats.for_planner(frame.meta(), &chunks, &columns));
        RemoteScanExec {
            frame,
            stats,
            planner_stats,
            chunks,
            columns,
            schema,
            parts,
            batch_rows,
            limit,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
            dynamic: Vec::new(),
            row_index,
        }
    }

    /// The distinct values of output column `index` as the frame's sketch estimates
    /// them (the row index: one a row), at most the rows read.
    fn distinct_estimate(&self, index: usize) -> Option<usize> {
        let column = match &self.row_index {
            Some(row_index) if row_index.at == index => return Some(self.frame.rows()),
            Some(row_index) if row_index.at < index => index - 1,
            _ => index,
        };
        let distinct = self
            .frame
            .meta()
            .distinct_estimate(*self.columns.get(column)?)?;
        let distinct = usize::try_from(distinct).ok()?;
        Some(distinct.min(self.rows_read()))
    }

    /// The rows of the chunks the scan reads.
    fn rows_read(&self) -> usize {
        let rows: u64 = self
            .chunks
            .iter()
            .map(|&c| self.frame.meta().chunks[c].rows)
            .sum();
        usize::try_from(rows).unwrap_or(usize::MAX)
    }
}

/// The distinct values of column `index` of `plan`'s output as the frames' sketches
/// estimate them, followed through operators that pass their input's values on
/// (filters and semi joins, which can only remove some, projections of plain columns,
/// repartitions, coalesces and cooperative yields) to a scan, and summed over a
/// union's inputs. `None` where the column leads anywhere else (another join, an
/// aggregate, a computed value).
pub(crate) fn column_distinct(plan: &Arc<dyn ExecutionPlan>, index: usize) -> Option<usize> {
    match source_of(plan, index)? {
        Source::Scan(scan, index, _) => scan.distinct_estimate(index),
        Source::Union(inputs, index) => inputs.into_iter().try_fold(0usize, |sum, input| {
            Some(sum.saturating_add(column_distinct(input, index)?))
        }),
    }
}

/// At most the rows `plan` outputs, as [`column_distinct`] follows them (the rows
/// its scans read): `None` where they come from anything else.
pub(crate) fn rows_bound(plan: &Arc<dyn ExecutionPlan>) -> Option<usize> {
    match source_of(plan, 0)? {
        Source::Scan(scan, _, _) => Some(scan.rows_read()),
        Source::Union(inputs, _) => inputs.into_iter().try_fold(0usize, |sum, input| {
            Some(sum.saturating_add(rows_bound(input)?))
        }),
    }
}

/// Whether the rows of `plan`, followed as [`rows_bound`] follows them to a scan,
/// pass a semi join on the way, which keeps only some of them.
pub(crate) fn semi_joined(plan: &Arc<dyn ExecutionPlan>) -> bool {
    matches!(source_of(plan, 0), Some(Source::Scan(_, _, true)))
}

/// Where column `index` of a plan's output comes from (see [`column_distinct`]).
enum Source<'a> {
    /// Column `.1` of a scan, and whether a semi join kept some of its rows.
    Scan(&'a RemoteScanExec, usize, bool),
    /// Column `.1` of each input of a union.
    Union(Vec<&'a Arc<dyn ExecutionPlan>>, usize),
}

fn source_of(plan: &Arc<dyn ExecutionPlan>, index: usize) -> Option<Source<'_>> {
    if let Some(scan) = plan.downcast_ref::<RemoteScanExec>() {
        return Some(Source::Scan(scan, index, false));
    }
    if plan.downcast_ref::<UnionExec>().is_some() {
        return Some(Source::Union(plan.children(), index));
    }
    if let Some(projection) = plan.downcast_ref::<ProjectionExec>() {
        let column = projection
            .expr()
            .get(index)?
            .expr
            .downcast_ref::<Column>()?;
        return source_of(projection.input(), column.index());
    }
    if let Some(filter) = plan.downcast_ref::<FilterExec>() {
        let index = match filter.projection() {
            Some(projection) => *projection.get(index)?,
            None => index,
        };
        return source_of(filter.input(), index);
    }
    let join = plan.downcast_ref::<HashJoinExec>().or_else(|| {
        plan.downcast_ref::<SpillingHashJoinExec>()
            .map(SpillingHashJoinExec::wrapped)
    });
    if let Some(join) = join {
        // A semi join keeps some of its preserved side's rows, as a filter does.
        let preserved = match join.join_type() {
            JoinType::LeftSemi => join.left(),
            JoinType::RightSemi => join.right(),
            _ => return None,
        };
        let index = match join.projection.as_deref() {
            Some(projection) => *projection.get(index)?,
            None => index,
        };
        return match source_of(preserved, index)? {
            Source::Scan(scan, index, _) => Some(Source::Scan(scan, index, true)),
            union => Some(union),
        };
    }
    match plan.children().as_slice() {
        [input] if passes_rows(plan.as_ref()) => source_of(input, index),
        _ => None,
    }
}

/// Whether `plan` hands on its one input's rows as they are, only moved between
/// partitions or threads (a repartition, a coalesce, a cooperative yield).
pub(crate) fn passes_rows(plan: &dyn ExecutionPlan) -> bool {
    plan.downcast_ref::<RepartitionExec>().is_some()
        || plan.downcast_ref::<CoalescePartitionsExec>().is_some()
        || plan.downcast_ref::<CooperativeExec>().is_some()
}

impl DisplayAs for RemoteScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let names: Vec<&str> = self
            .schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        write!(
            f,
            "RemoteScanExec: rows={}, chunks={} of {}, partitions={}, projection=[{}]",
            self.frame.rows(),
            self.chunks.len(),
            self.frame.chunk_count(),
            self.parts,
            names.join(", ")
        )?;
        if let Some(l) = self.limit {
            write!(f, ", limit={l}")?;
        }
        if !self.dynamic.is_empty() {
            write!(f, ", dynamic_filters={}", self.dynamic.len())?;
        }
        Ok(())
    }
}

impl ExecutionPlan for RemoteScanExec {
    super::operator::leaf_plan_methods!("RemoteScanExec", dynamic);

    fn statistics_from_inputs(
        &self,
        _input_stats: &[Arc<Statistics>],
        args: &StatisticsArgs,
    ) -> DfResult<Arc<Statistics>> {
        Ok(match args.partition() {
            None => self.planner_stats.clone(),
            Some(_) => Arc::new(Statistics::new_unknown(&self.schema)),
        })
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn handle_child_pushdown_result(
        &self,
        phase: FilterPushdownPhase,
        child_pushdown_result: ChildPushdownResult,
        _config: &ConfigOptions,
    ) -> DfResult<FilterPushdownPropagation<Arc<dyn ExecutionPlan>>> {
        // Only dynamic filters are new here (static ones pruned chunks when the scan
        // was planned). Either kind stays above the scan: it only skips chunks.
        let dynamic: Vec<_> = child_pushdown_result
            .parent_filters
            .iter()
            .map(|f| f.filter.clone())
            .filter(|f| snapshot_generation(f) != 0)
            .collect();
        let result = FilterPushdownPropagation::all_unsupported(child_pushdown_result);
        if phase != FilterPushdownPhase::Post || dynamic.is_empty() {
            return Ok(result);
        }
        let mut scan = self.clone();
        scan.dynamic.extend(dynamic);
        Ok(result.with_updated_node(Arc::new(scan) as _))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        if partition >= self.parts {
            return Err(DataFusionError::Internal(format!(
                "RemoteScanExec has {} partitions, partition {partition} asked for",
                self.parts
            )));
        }
        self.frame
            .check_live()
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        Ok(chunk_stream(
            ChunkReader::new(
                self.frame.clone(),
                Arc::new(self.columns.clone()),
                self.schema.clone(),
                self.batch_rows,
                self.row_index.clone(),
                &context,
            )?,
            self.chunks
                .iter()
                .skip(partition)
                .step_by(self.parts)
                .copied()
                .collect(),
            self.limit,
            &self.metrics,
            partition,
            (!self.dynamic.is_empty())
                .then(|| ChunkPruning::new(self.stats.clone(), self.dynamic.clone())),
        ))
    }
}

/// One partition's stream: `chunks` read in groups off the runtime's threads (but
/// those `pruning` rules out when their turn comes) and decoded one at a time as
/// their rows are taken, the frame's seal checked before the first, sliced into
/// batches, cut at `limit` rows; rows, `bytes_read` and
/// `chunks_pruned` recorded in `metrics`.
pub(crate) fn chunk_stream(
    reader: ChunkReader,
    chunks: Vec<usize>,
    limit: Option<usize>,
    metrics: &ExecutionPlanMetricsSet,
    partition: usize,
    pruning: Option<ChunkPruning>,
) -> SendableRecordBatchStream {
    let baseline = BaselineMetrics::new(metrics, partition);
    let bytes_read: Count = MetricBuilder::new(metrics).counter("bytes_read", partition);
    let chunks_pruned: Count = MetricBuilder::new(metrics).counter("chunks_pruned", partition);
    let rows_filtered: Count = MetricBuilder::new(metrics).counter("rows_filtered", partition);
    let reads: Count = MetricBuilder::new(metrics).counter("reads", partition);
    let schema = reader.schema.clone();
    let state = ScanState {
        reader,
        chunks: chunks.into_iter(),
        fetched: VecDeque::new(),
        pending: VecDeque::new(),
        left: limit,
        failed: false,
        sealed: false,
        bytes_read,
        pruning,
        chunks_pruned,
        rows_filtered,
        row_filter: None,
        reads,
        ahead: None,
    };
    let stream = futures::stream::unfold(state, |s| s.next()).map(move |b| {
        if let Ok(b) = &b {
            baseline.record_output(b.num_rows());
        }
        b
    });
    Box::pin(RecordBatchStreamAdapter::new(schema, stream))
}

/// Reads one stored chunk of the projected columns as record batches of `schema`
/// (see [`ChunkReader::conform`]).
#[derive(Clone)]
pub(crate) struct ChunkReader {
    /// The frame read.
    frame: RemoteFrame,
    /// Its columns read, in `schema`'s order (empty: row counts only).
    columns: Arc<Vec<usize>>,
    /// The arrow schema of `columns` as stored, which chunks are decoded into.
    stored_schema: SchemaRef,
    /// The batches' schema.
    schema: SchemaRef,
    /// Rows per batch at most.
    batch_rows: usize,
    /// The row index column of `schema`, if it has one (not among `columns`).
    row_index: Option<RowIndex>,
    /// Stored bytes read at once at most (see [`group_bytes`]).
    group_bytes: u64,
}

/// Chunks read at once at most.
const GROUP_CHUNKS: usize = 32;

/// Stored bytes a scan reads at once at most, under a memory pool limited to
/// `limit` (but always a chunk): chunks read together cost one hand-off to a
/// blocking thread and one read per memory element, instead of one of each per
/// chunk, and every read wakes the reading thread and a memory server's (on 2
/// cores the wake-ups were a fifth of a small query's time at 25 MiB). The chunks
/// read wait in the scan as stored, outside the budget's accounting, and are
/// decoded one at a time as the operators above take their rows: a group being
/// handed on and the next one being read, each a sixty-fourth of the budget (a
/// thirty-second together) and never more than 4 MiB, and the batches of one
/// decoded chunk. Stored chunks take a fraction of their decoded size (store_sales'
/// keys: about a fifth), so a group holds several times the chunks it held decoded:
/// SF 1 against groups of decoded chunks (8 at most), fastest of 3 rounds, all 99
/// queries: 7.48 -> 6.74 s at 25 MiB, 4.96 -> 4.48 s at 25 %, spill files
/// unchanged.
pub(crate) fn group_bytes(limit: MemoryLimit) -> u64 {
    let cap = 4 << 20;
    match limit {
        MemoryLimit::Finite(bytes) => (bytes as u64 / 64).min(cap),
        _ => cap,
    }
}

/// A chunk read and not yet decoded.
struct Fetched {
    chunk: usize,
    /// Its stored columns (`None`: no stored column is wanted).
    stored: Option<FetchedChunk>,
}

impl ChunkReader {
    /// A reader of `columns` of `frame` as batches of `schema` of at most
    /// `batch_rows` rows (with `row_index`, if any), in groups of chunks sized for
    /// the budget of `context`'s memory pool.
    ///
    /// # Errors
    /// A stored column type arrow-rs cannot hold.
    pub(crate) fn new(
        frame: RemoteFrame,
        columns: Arc<Vec<usize>>,
        schema: SchemaRef,
        batch_rows: usize,
        row_index: Option<RowIndex>,
        context: &TaskContext,
    ) -> DfResult<Self> {
        let stored_schema = frame
            .arrow_schema_of(&columns)
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        Ok(ChunkReader {
            frame,
            columns,
            stored_schema,
            schema,
            batch_rows,
            row_index,
            group_bytes: group_bytes(context.memory_pool().memory_limit()),
        })
    }

    /// Reads `chunks` as stored (one read per memory element for all of them), in
    /// order.
    fn read(&self, chunks: &[usize]) -> DfResult<Vec<Fetched>> {
        if self.columns.is_empty() {
            let rows_only = chunks
                .iter()
                .map(|&chunk| Fetched {
                    chunk,
                    stored: None,
                })
                .collect();
            return Ok(rows_only);
        }
        let fetched = self
            .frame
            .fetch_chunk_list(&self.columns, chunks)
            .map_err(|e| DataFusionError::External(Box::new(e)))?
            .into_iter()
            .map(|f| Fetched {
                chunk: f.chunk(),
                stored: Some(f),
            })
            .collect();
        Ok(fetched)
    }

    /// The batches of a chunk read by [`ChunkReader::read`].
    fn decode(&self, f: Fetched) -> DfResult<Vec<RecordBatch>> {
        let read = match f.stored {
            Some(stored) => Some(
                self.frame
                    .decode_fetched(stored, &self.columns, &self.stored_schema)
                    .map_err(|e| DataFusionError::External(Box::new(e)))?,
            ),
            None => None,
        };
        self.batches_of(f.chunk, read.as_ref())
    }

    /// The batches of chunk `chunk`, whose stored columns were read as `read`
    /// (`None`: none are needed).
    fn batches_of(&self, chunk: usize, read: Option<&RecordBatch>) -> DfResult<Vec<RecordBatch>> {
        let rows = self.frame.meta().chunks[chunk].rows as usize;
        // No stored column is needed (`count(*)`): batches of rows only.
        let mut arrays = match read {
            Some(b) => self.conform(b)?,
            None => Vec::new(),
        };
        if let Some(index) = &self.row_index {
            let start = index.starts.get(chunk).copied().unwrap_or_default();
            let positions = UInt64Array::from_iter_values(start..start + rows as u64);
            arrays.insert(index.at.min(arrays.len()), Arc::new(positions));
        }
        let whole = RecordBatch::try_new_with_options(
            self.schema.clone(),
            arrays,
            &RecordBatchOptions::new().with_row_count(Some(rows)),
        )?;
        if whole.num_rows() <= self.batch_rows {
            return Ok(vec![whole]);
        }
        let mut out = Vec::new();
        let mut start = 0;
        while start < whole.num_rows() {
            let n = self.batch_rows.min(whole.num_rows() - start);
            out.push(owned_batch(&whole.slice(start, n))?);
            start += n;
        }
        Ok(out)
    }

    /// Puts the scan's schema on the stored columns read: the types a stage's
    /// consumer expects where the stored ones differ (frames hold no 8- or 16-bit
    /// integers). The row index column is not among them.
    fn conform(&self, b: &RecordBatch) -> DfResult<Vec<ArrayRef>> {
        let index_at = self.row_index.as_ref().map(|i| i.at);
        let fields = self
            .schema
            .fields()
            .iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != index_at)
            .map(|(_, f)| f);
        b.columns()
            .iter()
            .zip(fields)
            .map(|(a, f)| {
                if a.data_type() == f.data_type() {
                    Ok(a.clone())
                } else {
                    Ok(cast(a, f.data_type())?)
                }
            })
            .collect()
    }
}

/// The state of one partition's scan stream.
struct ScanState {
    reader: ChunkReader,
    chunks: std::vec::IntoIter<usize>,
    /// Chunks read as stored, decoded one at a time as `pending` runs out.
    fetched: VecDeque<Fetched>,
    pending: VecDeque<RecordBatch>,
    /// Rows still wanted under a pushed-down limit.
    left: Option<usize>,
    failed: bool,
    /// Whether the frame's seal was checked (before the first chunk is read).
    sealed: bool,
    bytes_read: Count,
    pruning: Option<ChunkPruning>,
    chunks_pruned: Count,
    /// Rows read that the dynamic filters dropped.
    rows_filtered: Count,
    /// The dynamic filters as they stood when the last group of chunks arrived.
    row_filter: Option<RowFilters>,
    /// Reads of groups of chunks.
    reads: Count,
    /// The read of the next group, started when the one before it arrived, so that
    /// reading on a blocking thread overlaps the operators above.
    ahead: Option<GroupRead>,
}

/// A group of chunks being read on a blocking thread, and its stored bytes.
struct GroupRead {
    read: tokio::task::JoinHandle<DfResult<Vec<Fetched>>>,
    bytes: u64,
}

/// Dynamic filters checked against chunk statistics: the chunks they may pass
/// rows of, worked out again whenever a filter changes.
pub(crate) struct ChunkPruning {
    stats: Arc<ChunkStatistics>,
    filters: Vec<Arc<dyn PhysicalExpr>>,
    /// The filters' generation the `keep` was worked out for.
    generation: u64,
    /// Per chunk of the frame: whether it is read (`None`: every chunk).
    keep: Option<Vec<bool>>,
}

impl ChunkPruning {
    fn new(stats: Arc<ChunkStatistics>, filters: Vec<Arc<dyn PhysicalExpr>>) -> Self {
        ChunkPruning {
            stats,
            filters,
            generation: 0,
            keep: None,
        }
    }

    /// Whether `chunk` may hold rows the filters pass, as they stand now.
    fn keeps(&mut self, chunk: usize) -> bool {
        let generation = self
            .filters
            .iter()
            .fold(0u64, |g, f| g.wrapping_add(snapshot_generation(f)));
        if generation != self.generation {
            self.generation = generation;
            let now = self
                .filters
                .iter()
                .map(|f| snapshot_physical_expr(f.clone()))
                .collect::<DfResult<Vec<_>>>();
            self.keep = match now {
                Ok(now) => {
                    let mut keep = vec![false; self.stats.chunk_count()];
                    for i in self.stats.matching(conjunction_opt(now)) {
                        keep[i] = true;
                    }
                    Some(keep)
                }
                Err(_) => None,
            };
        }
        self.keep
            .as_ref()
            .is_none_or(|k| k.get(chunk).copied().unwrap_or(true))
    }

    /// The filters as they stand now, to drop rows with (`None`: none has been set
    /// by its join yet, or one cannot be read now).
    fn rows_filter(&self) -> Option<RowFilters> {
        let set: Vec<_> = self
            .filters
            .iter()
            .filter(|f| snapshot_generation(f) != 0)
            .map(|f| snapshot_physical_expr(f.clone()))
            .collect::<DfResult<_>>()
            .ok()?;
        (!set.is_empty()).then(|| RowFilters {
            kept: vec![ROW_FILTER_MOST_KEPT; set.len()],
            filters: set,
        })
    }
}

/// The dynamic filters a scan drops rows with, each with the fraction of rows it
/// kept in the last batch it was evaluated on: the one that kept fewest goes first,
/// and the others see only what it kept (q61's five filters, each over all of
/// store_sales' rows, cost more than the joins they spared).
#[derive(Debug)]
struct RowFilters {
    filters: Vec<Arc<dyn PhysicalExpr>>,
    kept: Vec<f64>,
}

/// The most of a batch's rows a dynamic filter may keep for the scan to drop the
/// others itself: the join above drops them anyway, and copying out most of the rows
/// costs more than probing the few it saves. A filter that keeps few (a month of
/// dates out of five years: q55's 2.9 M store_sales rows, in chunks that each span
/// every date) saves the hash probes, projections and repartitions of the rest.
const ROW_FILTER_MOST_KEPT: f64 = 0.25;

/// A batch through [`RowFilters::apply`].
enum Filtered {
    /// The rows the filters keep.
    Rows(RecordBatch),
    /// None kept.
    Empty,
    /// The batch as it was: each filter keeps too many of its rows to be worth
    /// applying, or cannot be evaluated on it (the joins above check every row).
    Unselective(RecordBatch),
}

impl RowFilters {
    /// `batch` without the rows the filters exclude, each filter applied if it keeps
    /// few of the rows left (see [`ROW_FILTER_MOST_KEPT`]). Counts the rows dropped.
    fn apply(&mut self, batch: RecordBatch, dropped: &Count) -> DfResult<Filtered> {
        let mut order: Vec<usize> = (0..self.filters.len()).collect();
        order.sort_by(|&a, &b| self.kept[a].total_cmp(&self.kept[b]));
        let mut batch = batch;
        let mut applied = false;
        for i in order {
            let rows = batch.num_rows();
            let fast = range_mask(&self.filters[i], &batch)
                .map(Ok)
                .or_else(|| key_set_mask(&self.filters[i], &batch));
            let evaluated = match fast {
                Some(Ok(mask)) => Arc::new(mask) as ArrayRef,
                Some(Err(_)) => continue,
                None => match self.filters[i]
                    .evaluate(&batch)
                    .and_then(|v| v.into_array(rows))
                {
                    Ok(mask) => mask,
                    Err(_) => continue,
                },
            };
            let Ok(mask) = as_boolean_array(&evaluated) else {
                continue;
            };
            let kept = mask.true_count();
            self.kept[i] = kept as f64 / rows.max(1) as f64;
            if self.kept[i] > ROW_FILTER_MOST_KEPT {
                continue;
            }
            dropped.add(rows - kept);
            if kept == 0 {
                return Ok(Filtered::Empty);
            }
            batch = filter_record_batch(&batch, mask)?;
            applied = true;
        }
        Ok(match applied {
            true => Filtered::Rows(batch),
            false => Filtered::Unselective(batch),
        })
    }
}

/// `filter` on `batch` when it is a join's key range and the set of its build keys
/// (`range AND key IN (…)`, see [`KeySet`]): the set's test alone, which passes no key
/// outside the range, where evaluating the filter as written takes two comparison
/// kernels and two ANDs besides (q42 1.08x slower with its item keys listed, until
/// this). `None`: another filter.
fn key_set_mask(
    filter: &Arc<dyn PhysicalExpr>,
    batch: &RecordBatch,
) -> Option<DfResult<BooleanArray>> {
    let and = filter.downcast_ref::<BinaryExpr>()?;
    if *and.op() != Operator::And {
        return None;
    }
    let set = and.right().downcast_ref::<KeySet>()?;
    Some(set.mask(batch))
}

/// `filter` on `batch` when it is a join's key range, `key >= lo AND key <= hi` over
/// an integer or date column: one pass and one unsigned comparison a row,
/// `(key - lo) as u64 <= hi - lo`, where evaluating it as written takes two
/// comparison kernels and an AND (arrow's comparison kernel was 15 % of q96's
/// profile). Null keys are not kept, as the filter keeps none. `None`: another filter.
fn range_mask(filter: &Arc<dyn PhysicalExpr>, batch: &RecordBatch) -> Option<BooleanArray> {
    let and = filter.downcast_ref::<BinaryExpr>()?;
    if *and.op() != Operator::And {
        return None;
    }
    let (column, Operator::GtEq, lo) = key_bound(and.left())? else {
        return None;
    };
    let (upper_column, Operator::LtEq, hi) = key_bound(and.right())? else {
        return None;
    };
    if column != upper_column {
        return None;
    }
    let array = batch.columns().get(column)?;
    let bits = match array.data_type() {
        DataType::Int64 => in_range(array.as_primitive::<Int64Type>().values(), lo, hi),
        DataType::Int32 => in_range(array.as_primitive::<Int32Type>().values(), lo, hi),
        DataType::Date32 => in_range(array.as_primitive::<Date32Type>().values(), lo, hi),
        _ => return None,
    };
    let bits = match array.nulls() {
        Some(valid) => &bits & valid.inner(),
        None => bits,
    };
    Some(BooleanArray::new(bits, None))
}

/// Whether each of `values` lies within `lo..=hi`.
fn in_range<T: Copy + Into<i64>>(values: &[T], lo: i64, hi: i64) -> BooleanBuffer {
    if hi < lo {
        return BooleanBuffer::new_unset(values.len());
    }
    let span = hi.wrapping_sub(lo) as u64;
    bits_where(values, |v| v.into().wrapping_sub(lo) as u64 <= span)
}

/// `column op literal` for a column of the batch and an integer or date literal, the
/// literal as an i64.
fn key_bound(expr: &Arc<dyn PhysicalExpr>) -> Option<(usize, Operator, i64)> {
    let b = expr.downcast_ref::<BinaryExpr>()?;
    let column = b.left().downcast_ref::<Column>()?;
    let literal = b.right().downcast_ref::<Literal>()?;
    let value = match literal.value() {
        ScalarValue::Int64(Some(v)) => *v,
        ScalarValue::Int32(Some(v)) | ScalarValue::Date32(Some(v)) => i64::from(*v),
        _ => return None,
    };
    Some((column.index(), *b.op(), value))
}

impl ScanState {
    /// The next chunks to read: those the pruning keeps, up to the reader's group
    /// bytes (one under a limit: rows past it are never read).
    fn next_group(&mut self) -> Vec<usize> {
        let meta = self.reader.frame.meta();
        let mut group = Vec::new();
        let mut bytes = 0;
        while group.len() < GROUP_CHUNKS {
            let Some(chunk) = self.chunks.next() else {
                break;
            };
            if let Some(p) = &mut self.pruning {
                if !p.keeps(chunk) {
                    self.chunks_pruned.add(1);
                    continue;
                }
            }
            group.push(chunk);
            bytes += chunk_column_stored_bytes(&meta.chunks[chunk], &self.reader.columns);
            if self.left.is_some() || bytes >= self.reader.group_bytes {
                break;
            }
        }
        group
    }

    async fn next(mut self) -> Option<(DfResult<RecordBatch>, Self)> {
        loop {
            if self.failed || self.left == Some(0) {
                return None;
            }
            if let Some(b) = self.pending.pop_front() {
                // Rows are dropped only without a limit: under one, the rows handed
                // on are the first rows of the scan.
                let b = match (&mut self.row_filter, self.left) {
                    (Some(filters), None) => match filters.apply(b, &self.rows_filtered) {
                        Ok(Filtered::Rows(b)) => b,
                        Ok(Filtered::Empty) => continue,
                        // Not worth it: the rest of this group goes on unfiltered.
                        Ok(Filtered::Unselective(b)) => {
                            self.row_filter = None;
                            b
                        }
                        Err(e) => {
                            self.failed = true;
                            return Some((Err(e), self));
                        }
                    },
                    _ => b,
                };
                let b = match self.left {
                    Some(l) if b.num_rows() > l => b.slice(0, l),
                    _ => b,
                };
                if let Some(l) = &mut self.left {
                    *l -= b.num_rows();
                }
                return Some((Ok(b), self));
            }
            if let Some(f) = self.fetched.pop_front() {
                match self.reader.decode(f) {
                    Ok(batches) => self.pending.extend(batches),
                    Err(e) => {
                        self.failed = true;
                        return Some((Err(e), self));
                    }
                }
                continue;
            }
            let group = self.ahead.take().or_else(|| self.start_read())?;
            match group.read.await {
                Ok(Ok(fetched)) => {
                    self.row_filter = self.pruning.as_ref().and_then(ChunkPruning::rows_filter);
                    self.bytes_read.add(group.bytes as usize);
                    self.reads.add(1);
                    self.fetched.extend(fetched);
                    // Under a limit the rows past it are never read, so nothing ahead.
                    if self.left.is_none() {
                        self.ahead = self.start_read();
                    }
                }
                Ok(Err(e)) => {
                    self.failed = true;
                    return Some((Err(e), self));
                }
                Err(e) => {
                    self.failed = true;
                    return Some((Err(DataFusionError::External(Box::new(e))), self));
                }
            }
        }
    }

    /// Starts reading the next group on a blocking thread (`None`: no chunk is left).
    fn start_read(&mut self) -> Option<GroupRead> {
        let group = self.next_group();
        if group.is_empty() {
            return None;
        }
        let reader = self.reader.clone();
        let meta = reader.frame.meta();
        let bytes: u64 = group
            .iter()
            .map(|&c| chunk_column_stored_bytes(&meta.chunks[c], &reader.columns))
            .sum();
        let check = !std::mem::replace(&mut self.sealed, true);
        let read = tokio::task::spawn_blocking(move || {
            if check {
                reader
                    .frame
                    .check_seal()
                    .map_err(|e| DataFusionError::External(Box::new(e)))?;
            }
            reader.read(&group)
        });
        Some(GroupRead { read, bytes })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    use arrow_array::StringArray;
    use arrow_array::{
        Array, ArrayRef, BooleanArray, Date32Array, Int32Array, Int64Array, RecordBatch,
    };
    use datafusion::common::ScalarValue;
    use datafusion::logical_expr::Operator;
    use datafusion::physical_expr::expressions::{lit, BinaryExpr, Column};
    use datafusion::physical_expr::PhysicalExpr;
    use datafusion::physical_plan::common::collect;

    use super::{range_mask, RemoteScanExec};
    use crate::frame::RemoteFrame;
    use crate::query::test_env::local_env;
    use crate::query::QuerySession;

    fn batch(columns: Vec<ArrayRef>) -> RecordBatch {
        RecordBatch::try_from_iter(
            columns
                .into_iter()
                .enumerate()
                .map(|(i, c)| (format!("c{i}"), c)),
        )
        .unwrap()
    }

    fn bound(column: usize, op: Operator, value: ScalarValue) -> Arc<dyn PhysicalExpr> {
        let name = format!("c{column}");
        Arc::new(BinaryExpr::new(
            Arc::new(Column::new(&name, column)),
            op,
            lit(value),
        ))
    }

    fn range(column: usize, lo: ScalarValue, hi: ScalarValue) -> Arc<dyn PhysicalExpr> {
        Arc::new(BinaryExpr::new(
            bound(column, Operator::GtEq, lo),
            Operator::And,
            bound(column, Operator::LtEq, hi),
        ))
    }

    /// What a filter keeps of `b` evaluated as written: nulls are not kept.
    fn as_written(filter: &Arc<dyn PhysicalExpr>, b: &RecordBatch) -> Vec<bool> {
        let v = filter
            .evaluate(b)
            .unwrap()
            .into_array(b.num_rows())
            .unwrap();
        let v = v.as_any().downcast_ref::<BooleanArray>().unwrap();
        (0..v.len()).map(|i| v.is_valid(i) && v.value(i)).collect()
    }

    fn kept(mask: &BooleanArray) -> Vec<bool> {
        assert_eq!(mask.null_count(), 0);
        (0..mask.len()).map(|i| mask.value(i)).collect()
    }

    #[test]
    fn a_key_range_keeps_what_the_filter_as_written_keeps() {
        // 200 rows (three whole words and a part), nulls, the extremes of i64.
        let mut values: Vec<Option<i64>> = (0..200)
            .map(|i| (i % 7 != 3).then_some((i * 37 % 101) - 20))
            .collect();
        values[5] = Some(i64::MIN);
        values[6] = Some(i64::MAX);
        let b = batch(vec![
            Arc::new(Int64Array::from(values.clone())),
            Arc::new(Int32Array::from(
                values
                    .iter()
                    .map(|v| v.map(|v| v as i32))
                    .collect::<Vec<_>>(),
            )),
            Arc::new(Date32Array::from(
                values
                    .iter()
                    .map(|v| v.map(|v| v as i32))
                    .collect::<Vec<_>>(),
            )),
        ]);
        for (lo, hi) in [(0, 10), (-20, 80), (11, 10), (i64::MIN, i64::MAX), (50, 50)] {
            let filter = range(
                0,
                ScalarValue::Int64(Some(lo)),
                ScalarValue::Int64(Some(hi)),
            );
            let mask = range_mask(&filter, &b).expect("a key range");
            assert_eq!(kept(&mask), as_written(&filter, &b), "{lo}..={hi}");
        }
        let filter = range(
            1,
            ScalarValue::Int32(Some(-3)),
            ScalarValue::Int32(Some(40)),
        );
        let mask = range_mask(&filter, &b).expect("an Int32 key range");
        assert_eq!(kept(&mask), as_written(&filter, &b));
        let filter = range(
            2,
            ScalarValue::Date32(Some(0)),
            ScalarValue::Date32(Some(30)),
        );
        let mask = range_mask(&filter, &b).expect("a date range");
        assert_eq!(kept(&mask), as_written(&filter, &b));
        assert!(kept(&mask).iter().any(|&k| k) && kept(&mask).iter().any(|&k| !k));
    }

    #[test]
    fn other_filters_are_evaluated_as_written() {
        let b = batch(vec![
            Arc::new(Int64Array::from(vec![1, 2, 3])),
            Arc::new(Int64Array::from(vec![4, 5, 6])),
            Arc::new(StringArray::from(vec!["a", "b", "c"])),
        ]);
        let one = |v| ScalarValue::Int64(Some(v));
        // Strict bounds, the bounds the other way round, two columns, a string column.
        let strict = Arc::new(BinaryExpr::new(
            bound(0, Operator::Gt, one(1)),
            Operator::And,
            bound(0, Operator::LtEq, one(2)),
        )) as Arc<dyn PhysicalExpr>;
        let reversed = Arc::new(BinaryExpr::new(
            bound(0, Operator::LtEq, one(2)),
            Operator::And,
            bound(0, Operator::GtEq, one(1)),
        )) as Arc<dyn PhysicalExpr>;
        let two_columns = Arc::new(BinaryExpr::new(
            bound(0, Operator::GtEq, one(1)),
            Operator::And,
            bound(1, Operator::LtEq, one(5)),
        )) as Arc<dyn PhysicalExpr>;
        let strings = range(
            2,
            ScalarValue::Utf8(Some("a".into())),
            ScalarValue::Utf8(Some("b".into())),
        );
        let or = Arc::new(BinaryExpr::new(
            bound(0, Operator::GtEq, one(1)),
            Operator::Or,
            bound(0, Operator::LtEq, one(2)),
        )) as Arc<dyn PhysicalExpr>;
        for filter in [strict, reversed, two_columns, strings, or] {
            assert!(range_mask(&filter, &b).is_none(), "{filter}");
        }
    }

    /// A filter rules out chunks by their statistics only while it is small for its
    /// table (`PRUNING_NODES_PER_CHUNK`): five ranges within the first of five chunks
    /// read one chunk, forty read all five, forty over 64 chunks read one; every
    /// answer is as written.
    #[test]
    fn only_filters_small_for_their_table_rule_out_chunks() {
        let env = local_env(1, 64 << 20);
        for (chunks, ranges, chunks_read) in [(5usize, 5, 1), (5, 40, 5), (64, 40, 1)] {
            let rows = i64::try_from(chunks * 4096).unwrap();
            let keys = batch(vec![Arc::new(Int64Array::from_iter_values(0..rows))]);
            let frame = RemoteFrame::from_record_batches(&env, &[keys]).unwrap();
            assert_eq!(frame.chunk_count(), chunks);
            let session = QuerySession::new(&env).unwrap();
            session.register("t", &frame).unwrap();
            let filter = (0..ranges)
                .map(|k| format!("c0 BETWEEN {} AND {}", 10 * k, 10 * k + 3))
                .collect::<Vec<_>>()
                .join(" OR ");
            let sql = format!("SELECT count(*) AS n FROM t WHERE {filter}");
            let plan = session.explain(&sql).unwrap();
            assert!(
                plan.contains(&format!("chunks={chunks_read} of {chunks}")),
                "{ranges} ranges over {chunks} chunks: {plan}"
            );
            let out = session.sql(&sql).unwrap();
            let n = out.batches()[0]
                .column(0)
                .as_primitive::<Int64Type>()
                .value(0);
            assert_eq!(n, 4 * ranges, "{ranges} ranges over {chunks} chunks");
        }
    }

    /// Two partitions are dealt a five-chunk frame's chunks in turn, each reading its
    /// own in frame order: 0, 2, 4 and 1, 3 (contiguous ranges gave one partition all
    /// the chunks a key range leaves of a frame stored in key order).
    #[test]
    fn partitions_are_dealt_the_chunks_in_turn() {
        let env = local_env(1, 16 << 20);
        let rows: i64 = 5 * 4096;
        let keys = batch(vec![Arc::new(Int64Array::from_iter_values(0..rows))]);
        let frame = RemoteFrame::from_record_batches(&env, &[keys]).unwrap();
        assert_eq!(frame.chunk_count(), 5);
        let session = QuerySession::with_partitions(&env, 2).unwrap();
        session.register("t", &frame).unwrap();
        let (_, plan) = session.plan("SELECT c0 FROM t").unwrap();
        let mut scans = vec![plan];
        let scan = loop {
            let node = scans.pop().expect("a scan in the plan");
            if node.downcast_ref::<RemoteScanExec>().is_some() {
                break node;
            }
            scans.extend(node.children().into_iter().cloned());
        };
        assert_eq!(scan.properties().partitioning.partition_count(), 2);
        for (partition, chunks) in [(0, vec![0, 2, 4]), (1, vec![1, 3])] {
            let stream = scan.execute(partition, session.ctx.task_ctx()).unwrap();
            let batches = session.runtime.block_on(collect(stream)).unwrap();
            let read: Vec<i64> = batches
                .iter()
                .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
                .collect();
            let expected: Vec<i64> = chunks
                .iter()
                .flat_map(|c| c * 4096..(c + 1) * 4096)
                .collect();
            assert_eq!(read, expected, "partition {partition}");
        }
    }
}
