//! Memory an operator reserved, lent to the plans it runs inside itself.
//!
//! A spilling aggregate runs DataFusion's aggregate once per spilled partition. Under
//! the session's first-come, first-served pool, the operator above (a sort fed by
//! those partitions, say) takes whatever a finished partition gives back, and the
//! next partition's hash table finds no memory at all. So the operator keeps a
//! reservation of its own from before its input runs, and runs its partitions in a
//! [`TaskContext`] whose pool is a [`ReservedPool`]: their allocations come out of
//! that reservation first, grow it in the session's pool when they need more, and
//! go back to it, not to the session's pool, when freed.

use std::fmt::{self, Display, Formatter};
use std::sync::{Arc, Mutex, PoisonError};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use datafusion::common::Result as DfResult;
use datafusion::execution::memory_pool::{MemoryLimit, MemoryPool, MemoryReservation};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::TaskContext;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;

use super::grace::OneShotExec;
use super::operator::task_context_like;

/// See the module docs.
#[derive(Debug)]
pub(crate) struct ReservedPool {
    lent: Mutex<Lent>,
    /// The reservation is never shrunk below this.
    floor: usize,
    /// The session pool's limit (`None`: unlimited), told to the operators.
    limit: Option<usize>,
}

/// The lender's reservation in the session's pool, and the bytes lent out of it.
#[derive(Debug)]
struct Lent {
    reservation: MemoryReservation,
    used: usize,
}

impl ReservedPool {
    /// A pool lending `reservation` (which keeps at least `floor` bytes, if it
    /// holds them now).
    pub(crate) fn new(reservation: MemoryReservation, floor: usize, limit: MemoryLimit) -> Self {
        ReservedPool {
            lent: Mutex::new(Lent {
                reservation,
                used: 0,
            }),
            floor,
            limit: match limit {
                MemoryLimit::Finite(bytes) => Some(bytes),
                _ => None,
            },
        }
    }

    /// A task context like `context` whose operators allocate from `pool`.
    pub(crate) fn context(
        pool: Arc<ReservedPool>,
        context: &TaskContext,
    ) -> DfResult<Arc<TaskContext>> {
        let runtime = RuntimeEnvBuilder::from_runtime_env(&context.runtime_env())
            .with_memory_pool(pool)
            .build_arc()?;
        Ok(task_context_like(
            context,
            context.session_config().clone(),
            runtime,
        ))
    }

    /// `batches` as a one-shot input, and a task context like `context` whose pool
    /// lends the operator built on them `reservation`, the memory they were read
    /// under: a wrapped operator that cannot spill (DataFusion's hash join, its
    /// aggregate) builds its state out of that memory instead of racing the
    /// operators beside it for it as it is given back batch by batch.
    pub(crate) fn lend_rows(
        schema: SchemaRef,
        batches: Vec<RecordBatch>,
        reservation: MemoryReservation,
        context: &TaskContext,
    ) -> DfResult<(OneShotExec, Arc<TaskContext>)> {
        let limit = context.memory_pool().memory_limit();
        let pool = Arc::new(ReservedPool::new(reservation, 0, limit));
        let context = ReservedPool::context(pool, context)?;
        let rows = futures::stream::iter(batches.into_iter().map(Ok));
        let rows = Box::pin(RecordBatchStreamAdapter::new(schema.clone(), rows));
        Ok((OneShotExec::new(schema, rows), context))
    }

    fn lent(&self) -> std::sync::MutexGuard<'_, Lent> {
        self.lent.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Display for ReservedPool {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let used = self.lent().used;
        write!(f, "reserved(lent: {used} B, floor: {} B)", self.floor)
    }
}

impl MemoryPool for ReservedPool {
    fn name(&self) -> &str {
        "reserved"
    }

    fn grow(&self, _reservation: &MemoryReservation, additional: usize) {
        let mut lent = self.lent();
        lent.used += additional;
        if lent.used > lent.reservation.size() {
            lent.reservation.grow(lent.used - lent.reservation.size());
        }
    }

    fn shrink(&self, _reservation: &MemoryReservation, shrink: usize) {
        let mut lent = self.lent();
        lent.used = lent.used.saturating_sub(shrink);
        // Back to what is lent, but not below the floor.
        let keep = lent.used.max(self.floor);
        if lent.reservation.size() > keep {
            lent.reservation.shrink(lent.reservation.size() - keep);
        }
    }

    fn try_grow(&self, _reservation: &MemoryReservation, additional: usize) -> DfResult<()> {
        let mut lent = self.lent();
        let want = lent.used + additional;
        if want > lent.reservation.size() {
            lent.reservation.try_grow(want - lent.reservation.size())?;
        }
        lent.used = want;
        Ok(())
    }

    fn reserved(&self) -> usize {
        self.lent().used
    }

    fn memory_limit(&self) -> MemoryLimit {
        self.limit
            .map_or(MemoryLimit::Infinite, MemoryLimit::Finite)
    }
}

#[cfg(test)]
mod tests {
    use datafusion::execution::memory_pool::{GreedyMemoryPool, MemoryConsumer};

    use super::*;

    #[test]
    fn lent_memory_returns_to_the_lender_not_the_pool() {
        let session: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(1000));
        let lender = MemoryConsumer::new("aggregate").register(&session);
        lender.try_grow(300).unwrap();
        let pool: Arc<dyn MemoryPool> =
            Arc::new(ReservedPool::new(lender, 300, session.memory_limit()));
        // A partition's table takes the 300 bytes kept and 200 more.
        let table = MemoryConsumer::new("table").register(&pool);
        table.try_grow(500).unwrap();
        assert_eq!(session.reserved(), 500);
        // Meanwhile an operator outside takes everything else.
        let sort = MemoryConsumer::new("sort").register(&session);
        sort.try_grow(500).unwrap();
        assert!(table.try_grow(1).is_err());
        // The table is done: its bytes go back to the lender down to the floor,
        // so the next partition starts with them whatever the sort wants.
        drop(table);
        assert_eq!(session.reserved(), 800);
        assert!(sort.try_grow(201).is_err());
        sort.try_grow(200).unwrap();
        let next = MemoryConsumer::new("next table").register(&pool);
        next.try_grow(300).unwrap();
        assert!(
            next.try_grow(1).is_err(),
            "beyond the floor only what is free"
        );
        drop(next);
        drop(pool);
        assert_eq!(
            session.reserved(),
            700,
            "the lender's bytes freed with the pool"
        );
    }
}
