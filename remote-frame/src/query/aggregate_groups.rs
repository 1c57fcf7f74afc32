//! A hybrid hash aggregate's partitions: the groups of each partition kept in
//! memory, not its rows.
//!
//! When a final aggregate's input does not fit, [`super::aggregate`] splits it by
//! group key into partitions. Holding the rows of the partitions that stay in memory
//! (as a join holds its build side) keeps few of them: a group's state is merged from
//! many rows, and a partition's rows take several times its groups' state. Here each
//! partition in memory is a hash table of its groups with their accumulators (the
//! parts DataFusion's own aggregate is made of), which merges every row of the
//! partition as it comes; when the budget runs short, the largest table's state is
//! written to its partition's spill file, and the partition's later rows follow it
//! there, to be aggregated again, a spilled partition at a time. The state written is
//! the final aggregate's input (a partial state per group), so a spilled partition's
//! file holds rows of one schema whichever way they got there.
//!
//! Only a final phase is aggregated so: its input rows and its groups' state have one
//! schema, and its accumulators merge states, which never grow with a group's rows
//! (an aggregate whose state does is left to the row partitioning).

use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::SchemaRef;
use datafusion::common::{internal_err, Result as DfResult};
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::execution::SpillFile;
use datafusion::logical_expr::{EmitTo, GroupsAccumulator};
use datafusion::physical_expr::aggregate::AggregateFunctionExpr;
use datafusion::physical_expr::{GroupsAccumulatorAdapter, PhysicalExpr};
use datafusion::physical_plan::aggregates::group_values::{new_group_values, GroupValues};
use datafusion::physical_plan::aggregates::order::GroupOrdering;
use datafusion::physical_plan::aggregates::{
    aggregate_expressions, evaluate_group_by, AggregateExec, AggregateMode,
};
use datafusion::physical_plan::spill::SpillManager;
use datafusion::physical_plan::ExecutionPlan;

use super::grace::{grow_within, Partitioner, SizedBlocks, SpilledPartitions};

/// Whether `agg` merges partial states (a final phase), whose groups
/// [`HybridGroups`] can hold.
pub(crate) fn merges_states(agg: &AggregateExec) -> bool {
    matches!(
        agg.mode(),
        AggregateMode::Final | AggregateMode::FinalPartitioned
    )
}

/// One partition's groups: their key values and each aggregate's states.
struct GroupTable {
    values: Box<dyn GroupValues>,
    accumulators: Vec<Box<dyn GroupsAccumulator>>,
    /// The group of each row of the batch being merged.
    rows_groups: Vec<usize>,
}

impl GroupTable {
    fn size(&self) -> usize {
        self.values.size()
            + self.accumulators.iter().map(|a| a.size()).sum::<usize>()
            + self.rows_groups.capacity() * std::mem::size_of::<usize>()
    }
}

/// What every partition's table is made of.
struct Aggregate {
    agg: Arc<AggregateExec>,
    group_schema: SchemaRef,
    /// Each aggregate's input columns (its partial state's).
    arguments: Vec<Vec<Arc<dyn PhysicalExpr>>>,
}

impl Aggregate {
    fn new(agg: Arc<AggregateExec>) -> DfResult<Self> {
        if !merges_states(&agg) || !agg.group_expr().is_single() {
            return internal_err!("a hybrid aggregate holds a final phase's groups only");
        }
        let input_schema = agg.input().schema();
        let group_schema = agg.group_expr().group_schema(&input_schema)?;
        let arguments = aggregate_expressions(
            agg.aggr_expr(),
            agg.mode(),
            agg.group_expr().num_group_exprs(),
        )?;
        Ok(Aggregate {
            agg,
            group_schema,
            arguments,
        })
    }

    fn table(&self) -> DfResult<GroupTable> {
        Ok(GroupTable {
            values: new_group_values(self.group_schema.clone(), &GroupOrdering::None)?,
            accumulators: self
                .agg
                .aggr_expr()
                .iter()
                .map(accumulator)
                .collect::<DfResult<_>>()?,
            rows_groups: Vec::new(),
        })
    }

    /// Merges the partial states of `batch` into `table`.
    fn merge(&self, table: &mut GroupTable, batch: &RecordBatch) -> DfResult<()> {
        let mut sets = evaluate_group_by(self.agg.group_expr(), batch)?;
        let Some(keys) = sets.pop() else {
            return Ok(());
        };
        table.values.intern(&keys, &mut table.rows_groups)?;
        let groups = table.values.len();
        for (acc, arguments) in table.accumulators.iter_mut().zip(&self.arguments) {
            let values = arguments
                .iter()
                .map(|e| e.evaluate(batch)?.into_array(batch.num_rows()))
                .collect::<DfResult<Vec<ArrayRef>>>()?;
            acc.merge_batch(&values, &table.rows_groups, groups)?;
        }
        Ok(())
    }

    /// The groups of `table` as partial states (the input's schema), to be merged
    /// again when their partition is read back.
    fn states(&self, table: GroupTable) -> DfResult<Option<RecordBatch>> {
        emit(table, self.agg.input().schema(), |acc, columns| {
            columns.extend(acc.state(EmitTo::All)?);
            Ok(())
        })
    }

    /// The aggregate's answer for the groups of `table`.
    fn answer(&self, table: GroupTable) -> DfResult<Option<RecordBatch>> {
        emit(table, self.agg.schema(), |acc, columns| {
            columns.push(acc.evaluate(EmitTo::All)?);
            Ok(())
        })
    }
}

/// All groups of `table` as a batch of `schema` (`None` for no groups): their key
/// values, then what `accumulated` appends of each accumulator.
fn emit(
    mut table: GroupTable,
    schema: SchemaRef,
    accumulated: impl Fn(&mut Box<dyn GroupsAccumulator>, &mut Vec<ArrayRef>) -> DfResult<()>,
) -> DfResult<Option<RecordBatch>> {
    if table.values.is_empty() {
        return Ok(None);
    }
    let mut columns = table.values.emit(EmitTo::All)?;
    for acc in &mut table.accumulators {
        accumulated(acc, &mut columns)?;
    }
    Ok(Some(RecordBatch::try_new(schema, columns)?))
}

/// DataFusion's accumulator of many groups for `expr` (an adapter over its
/// single-group accumulator where it has none), as its own aggregate makes it.
fn accumulator(expr: &Arc<AggregateFunctionExpr>) -> DfResult<Box<dyn GroupsAccumulator>> {
    if expr.groups_accumulator_supported() {
        return expr.create_groups_accumulator();
    }
    let expr = expr.clone();
    Ok(Box::new(GroupsAccumulatorAdapter::new(move || {
        expr.create_accumulator()
    })))
}

/// A final aggregate's input split by group key into partitions whose groups are
/// held in memory while a reservation (up to a cap) takes them; when it does not,
/// the largest table's states are spilled and every later row of its partition
/// follows them (see the module docs).
pub(crate) struct HybridGroups {
    aggregate: Aggregate,
    partitioner: Partitioner,
    /// Each partition's table (`None` once it is spilled).
    tables: Vec<Option<GroupTable>>,
    /// What each table reserves.
    sizes: Vec<usize>,
    spilled: SpilledPartitions,
    reservation: MemoryReservation,
    cap: usize,
    /// Rows of a spilled table's states written at a time.
    batch_rows: usize,
    cost: fn(&RecordBatch) -> usize,
}

/// The partitions of a [`HybridGroups`] once its input ended.
pub(crate) struct GroupedBuild {
    /// The partitions kept in memory.
    pub(crate) held: HeldGroups,
    /// Their memory (what [`HeldGroups::bytes`] says), and whatever else of the
    /// partitioning's is left.
    pub(crate) reservation: MemoryReservation,
    /// Which partitions were spilled.
    pub(crate) spilled: Vec<bool>,
    /// The spill file of each spilled partition.
    pub(crate) files: Vec<Option<Arc<dyn SpillFile>>>,
}

impl HybridGroups {
    /// Partitions of `agg`'s input by `partitioner`, holding groups up to `cap`
    /// bytes under `reservation` and spilling through `spill` beyond; a row handed
    /// in reserves `cost(rows)` until it is merged, and a spilled partition's rows
    /// are written in batches of up to `batch_rows`.
    pub(crate) fn new(
        agg: Arc<AggregateExec>,
        partitioner: Partitioner,
        spill: Arc<SpillManager>,
        reservation: MemoryReservation,
        cap: usize,
        batch_rows: usize,
        cost: fn(&RecordBatch) -> usize,
    ) -> DfResult<Self> {
        let aggregate = Aggregate::new(agg)?;
        let fanout = partitioner.fanout();
        let tables = (0..fanout)
            .map(|_| aggregate.table().map(Some))
            .collect::<DfResult<_>>()?;
        Ok(HybridGroups {
            aggregate,
            partitioner,
            tables,
            sizes: vec![0; fanout],
            spilled: SpilledPartitions::new(spill, "hash aggregate", fanout, cost),
            reservation,
            cap,
            batch_rows: batch_rows.max(1),
            cost,
        })
    }

    /// Its spilled partitions' files opened with blocks of their own size.
    pub(crate) fn with_sized_blocks(mut self, sized: Option<SizedBlocks>) -> Self {
        self.spilled = self.spilled.with_sized_blocks(sized);
        self
    }

    /// Gives back `bytes` of the reservation (at most what it holds): rows reserved
    /// before they were handed in, which reserve again as they are merged.
    pub(crate) fn give_back(&mut self, bytes: usize) {
        self.reservation.shrink(bytes.min(self.reservation.size()));
    }

    /// Merges the rows of `batch` into their partitions' groups (or queues them for
    /// a spilled partition's file).
    pub(crate) fn push(&mut self, batch: &RecordBatch) -> DfResult<()> {
        for (p, part) in self.partitioner.split(batch)? {
            if self.spilled.has(p) {
                self.spilled
                    .write_later(p, part, &self.reservation, self.cap)?;
                continue;
            }
            // The piece reserves its rows' cost before it is merged: the groups it
            // adds take no more than that, and the table is sized again after.
            let need = (self.cost)(&part);
            if !self.make_room(need, p)? {
                self.spilled
                    .write_later(p, part, &self.reservation, self.cap)?;
                continue;
            }
            if let Some(table) = &mut self.tables[p] {
                self.aggregate.merge(table, &part)?;
                let size = table.size();
                self.resize(p, size, need)?;
            }
        }
        Ok(())
    }

    /// Reserves `need` bytes for partition `p`, spilling the largest table (`p`
    /// itself if it is the largest or no other holds anything) until they fit.
    /// False if `p` was spilled for it.
    fn make_room(&mut self, need: usize, p: usize) -> DfResult<bool> {
        loop {
            if grow_within(&self.reservation, need, self.cap) {
                return Ok(true);
            }
            if self.spilled.any_pending() {
                self.spilled.flush_all(&self.reservation)?;
                continue;
            }
            let victim = self.largest().unwrap_or(p);
            self.spill_table(victim)?;
            if victim == p {
                return Ok(false);
            }
        }
    }

    /// Partition `p`'s table has grown to `size` with `reserved` reserved for it
    /// besides its last size: the reservation is made to match. A table that grew
    /// more than its rows reserved (its hash table doubling) makes room for the
    /// rest as a piece does, spilling others or itself.
    fn resize(&mut self, p: usize, size: usize, reserved: usize) -> DfResult<()> {
        let held = self.sizes[p] + reserved;
        if size <= held {
            self.give_back(held - size);
            self.sizes[p] = size;
            return Ok(());
        }
        self.sizes[p] = held;
        if self.make_room(size - held, p)? {
            self.sizes[p] = size;
        }
        Ok(())
    }

    /// The partition in memory whose table reserves the most, if any holds anything.
    fn largest(&self) -> Option<usize> {
        (0..self.tables.len())
            .filter(|&q| self.tables[q].is_some() && self.sizes[q] > 0)
            .max_by_key(|&q| self.sizes[q])
    }

    /// Writes partition `p`'s groups (as partial states) to its spill file and gives
    /// their memory back; its later rows go to the file.
    fn spill_table(&mut self, p: usize) -> DfResult<()> {
        let Some(table) = self.tables[p].take() else {
            return Ok(());
        };
        let states = self.aggregate.states(table)?;
        if let Some(states) = states {
            let mut offset = 0;
            while offset < states.num_rows() {
                let rows = self.batch_rows.min(states.num_rows() - offset);
                self.spilled.append(p, &states.slice(offset, rows))?;
                offset += rows;
            }
        } else {
            // An empty partition is spilled all the same: its later rows follow.
            let empty = RecordBatch::new_empty(self.aggregate.agg.input().schema());
            self.spilled.append(p, &empty)?;
        }
        let size = std::mem::take(&mut self.sizes[p]);
        self.give_back(size);
        Ok(())
    }

    /// The partitions as they stand: the groups kept in memory and the spilled
    /// partitions' files.
    pub(crate) fn finish(mut self) -> DfResult<GroupedBuild> {
        let spilled = (0..self.tables.len())
            .map(|p| self.spilled.has(p))
            .collect();
        let files = self.spilled.finish(&self.reservation)?;
        let held = HeldGroups {
            aggregate: self.aggregate,
            tables: self
                .tables
                .into_iter()
                .zip(self.sizes)
                .filter_map(|(t, size)| t.map(|t| (t, size)))
                .collect(),
            batch_rows: self.batch_rows,
        };
        Ok(GroupedBuild {
            held,
            reservation: self.reservation,
            spilled,
            files,
        })
    }
}

/// The groups of the partitions a [`HybridGroups`] kept in memory.
pub(crate) struct HeldGroups {
    aggregate: Aggregate,
    /// Each table with the bytes it reserved.
    tables: Vec<(GroupTable, usize)>,
    batch_rows: usize,
}

impl HeldGroups {
    /// Whether no partition was kept in memory.
    pub(crate) fn is_empty(&self) -> bool {
        self.tables.is_empty()
    }

    /// The bytes the tables reserved.
    pub(crate) fn bytes(&self) -> usize {
        self.tables.iter().map(|(_, size)| size).sum()
    }

    /// The answers of the tables, a table at a time, each in batches of up to the
    /// batch size; `reservation` holds [`HeldGroups::bytes`] and gives each table's
    /// share back once its answer is made (the answer then belongs to whoever it is
    /// handed to).
    pub(crate) fn answers(
        self,
        reservation: MemoryReservation,
    ) -> impl futures::Stream<Item = DfResult<RecordBatch>> + Send {
        let answers = HeldAnswers {
            held: self,
            reservation,
            current: None,
        };
        futures::stream::unfold(answers, |mut answers| async move {
            let next = answers.next_batch().transpose()?;
            Some((next, answers))
        })
    }
}

/// See [`HeldGroups::answers`].
struct HeldAnswers {
    held: HeldGroups,
    reservation: MemoryReservation,
    /// The answer being handed on and the rows of it handed on so far.
    current: Option<(RecordBatch, usize)>,
}

impl HeldAnswers {
    /// The next batch of answers.
    pub(crate) fn next_batch(&mut self) -> DfResult<Option<RecordBatch>> {
        loop {
            if let Some((answer, offset)) = &mut self.current {
                if *offset < answer.num_rows() {
                    let rows = self.held.batch_rows.min(answer.num_rows() - *offset);
                    let batch = answer.slice(*offset, rows);
                    *offset += rows;
                    return Ok(Some(batch));
                }
                self.current = None;
            }
            let Some((table, size)) = self.held.tables.pop() else {
                return Ok(None);
            };
            let answer = self.held.aggregate.answer(table)?;
            self.reservation.shrink(size.min(self.reservation.size()));
            if let Some(answer) = answer {
                self.current = Some((answer, 0));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::Int64Array;
    use futures::StreamExt;
    use polars::prelude::{df, ChunkAgg, SortMultipleOptions};

    use crate::budget::Budget;
    use crate::env::FrameEnv;
    use crate::frame::RemoteFrame;
    use crate::query::test_env::{local_env, one_partition_session, with_skipping_partials};
    use crate::query::QuerySession;

    /// `rows` rows over `groups` keys (`g = i % groups`), `v = i`, in one frame.
    fn repeated_keys(env: &FrameEnv, rows: i64, groups: i64) -> RemoteFrame {
        let t = df!(
            "g" => (0..rows).map(|i| i % groups).collect::<Vec<_>>(),
            "v" => (0..rows).collect::<Vec<_>>()
        )
        .unwrap();
        RemoteFrame::from_polars(env, &t).unwrap()
    }

    /// Under a sort, the partial phase passes rows on barely aggregated (its
    /// probe sees distinct keys first, as DataFusion's does): the final phase's
    /// input is many times its groups.
    const SQL: &str = "SELECT g, count(*) AS n, sum(v) AS s FROM t GROUP BY g ORDER BY g";

    #[test]
    fn groups_held_in_memory_take_every_later_row_of_theirs_without_spilling() {
        // 1 M rows of 100 K keys (the first 100 K rows distinct, so the partial
        // phase's probe passes rows on) reach the final phase as rows of partial
        // state, 48 MB counted as rows, twice the budget: held as rows, they
        // spilled. The 100 K groups take about 7 MB: all stay in memory.
        let env = local_env(1, 256 << 20);
        let (rows, groups) = (1_000_000, 100_000);
        let t = repeated_keys(&env, rows, groups);
        let session = with_skipping_partials(one_partition_session(&env, Some(24 << 20), &t));
        let out = session.sql(SQL).unwrap();
        let text = out.explain_analyze();
        assert!(
            text.contains("skipped_aggregation_rows=")
                && !text.contains("skipped_aggregation_rows=0,"),
            "the partial phase must pass rows on for this test: {text}"
        );
        assert_eq!(out.stats().spill_files, 0, "{text}");
        assert!(out.stats().peak_local_bytes <= 24 << 20, "{text}");
        let got = out.to_polars().unwrap();
        assert_eq!(got.height(), groups as usize);
        let n = got.column("n").unwrap().i64().unwrap();
        assert_eq!(
            (n.min(), n.max()),
            (Some(rows / groups), Some(rows / groups))
        );
        let s = got.column("s").unwrap().i64().unwrap();
        // g's rows are g, g + groups, ..., g + 9 groups: their sum is 10 g + 45 groups.
        let want: Vec<i64> = (0..groups).map(|g| 10 * g + 45 * groups).collect();
        assert_eq!(s.into_no_null_iter().collect::<Vec<_>>(), want);
        assert_eq!(session.reserved_bytes(), 0, "reservations left behind");
    }

    #[test]
    fn groups_that_do_not_fit_spill_their_states_and_answer_the_same() {
        // 200 K keys, twice each: the groups outgrow the budget, the largest
        // tables' states are spilled with their later rows, and the answer is the
        // unlimited one.
        let env = local_env(1, 256 << 20);
        let t = repeated_keys(&env, 400_000, 200_000);
        let want = {
            let env = env.with_budget(Budget::from_limit(None).unwrap());
            let s = QuerySession::with_partitions(&env, 1).unwrap();
            s.register("t", &t).unwrap();
            s.sql(SQL).unwrap().to_polars().unwrap()
        };
        let session = one_partition_session(&env, Some(4 << 20), &t);
        let out = session.sql(SQL).unwrap();
        let text = out.explain_analyze();
        assert!(out.stats().spill_files > 0, "{text}");
        assert!(out.stats().peak_local_bytes <= 4 << 20, "{text}");
        assert_eq!(
            out.stats().spill_bytes_written,
            out.stats().spill_bytes_read,
            "{text}"
        );
        let got = out
            .to_polars()
            .unwrap()
            .sort(["g"], SortMultipleOptions::default())
            .unwrap();
        assert!(got.equals_missing(&want), "{got:?} vs {want:?}");
        assert_eq!(session.spill_bytes_held(), 0, "spill memory left behind");
        assert_eq!(session.reserved_bytes(), 0, "reservations left behind");
    }

    #[test]
    fn an_aggregate_dropped_midway_frees_its_groups_and_spill_files() {
        let env = local_env(1, 256 << 20);
        let t = repeated_keys(&env, 400_000, 200_000);
        let session = one_partition_session(&env, Some(4 << 20), &t);
        // No sort above: the first answers are handed on while spilled
        // partitions wait in memory elements.
        let (_, plan) = session
            .plan("SELECT g, count(*) AS n FROM t GROUP BY g")
            .unwrap();
        let mut stream = plan.execute(0, session.ctx.task_ctx()).unwrap();
        let first = session.runtime.block_on(stream.next()).unwrap().unwrap();
        let n = first
            .column(1)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        assert!(!n.is_empty() && n.iter().all(|n| n == Some(2)));
        assert!(session.spill_bytes_held() > 0);
        drop(stream);
        session.await_spill_release();
        assert_eq!(session.spill_bytes_held(), 0, "spill files left behind");
        assert_eq!(session.reserved_bytes(), 0, "reservations left behind");
    }
}
