//! Room kept for the operators that cannot spill.
//!
//! Under a first-come, first-served pool an operator that can spill (a sort still
//! reading its input) takes whatever is free, and one that cannot (the merge of
//! another partition's sort, which has started merging its spilled runs) then finds
//! nothing and fails the query: q67 over two partitions did. [`HeadroomPool`] keeps
//! the last `headroom` bytes of the budget for operators that cannot spill: a grant
//! to one that can is refused when it would leave less free, and it spills a little
//! sooner instead. One that holds less than it asks for (a sort that has just spilled
//! every batch and needs room for the next) cannot make room by spilling, so it may
//! use the headroom too rather than fail the query (q47 over two partitions did).
//!
//! A repartition's queue of batches is held to the same share of the budget: it
//! holds batches only while the operators reading them are slower than its input,
//! and spills beyond. Unbounded, it grew to 15 MB of 25 MiB and the sort beside it
//! could not get 2 MB for its first batch (q47, two runs in six).

use std::fmt::{self, Display, Formatter};

use datafusion::common::{DataFusionError, Result as DfResult};
use datafusion::execution::memory_pool::{
    human_readable_size, GreedyMemoryPool, MemoryConsumer, MemoryLimit, MemoryPool,
    MemoryReservation, TrackConsumersPool,
};

/// See the module docs.
#[derive(Debug)]
pub(crate) struct HeadroomPool {
    inner: TrackConsumersPool<GreedyMemoryPool>,
    limit: usize,
    headroom: usize,
}

impl HeadroomPool {
    /// `inner` (limited to `limit` bytes) with its last `headroom` bytes kept for
    /// consumers that cannot spill.
    pub(crate) fn new(
        inner: TrackConsumersPool<GreedyMemoryPool>,
        limit: usize,
        headroom: usize,
    ) -> Self {
        HeadroomPool {
            inner,
            limit,
            headroom: headroom.min(limit),
        }
    }
}

impl Display for HeadroomPool {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        Display::fmt(&self.inner, f)
    }
}

impl MemoryPool for HeadroomPool {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn register(&self, consumer: &MemoryConsumer) {
        self.inner.register(consumer);
    }

    fn unregister(&self, consumer: &MemoryConsumer) {
        self.inner.unregister(consumer);
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        self.inner.grow(reservation, additional);
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.inner.shrink(reservation, shrink);
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> DfResult<()> {
        let consumer = reservation.consumer();
        if consumer.can_spill()
            && is_repartition_queue(consumer.name())
            && reservation.size() > 0
            && reservation.size().saturating_add(additional) > self.headroom
        {
            return Err(DataFusionError::ResourcesExhausted(format!(
                "Failed to allocate additional {} for {}: a repartition queues at most {}",
                human_readable_size(additional),
                consumer.name(),
                human_readable_size(self.headroom),
            )));
        }
        if consumer.can_spill() && reservation.size() >= additional {
            let held = self.inner.reserved();
            let open = self.limit - self.headroom;
            if held.saturating_add(additional) > open {
                return Err(DataFusionError::ResourcesExhausted(format!(
                    "Failed to allocate additional {} for {}: {} of {} held, the last {} kept for operators that cannot spill; top memory consumers:\n{}",
                    human_readable_size(additional),
                    reservation.consumer().name(),
                    human_readable_size(held),
                    human_readable_size(self.limit),
                    human_readable_size(self.headroom),
                    self.inner.report_top(5),
                )));
            }
        }
        self.inner.try_grow(reservation, additional)
    }

    fn reserved(&self) -> usize {
        self.inner.reserved()
    }

    fn memory_limit(&self) -> MemoryLimit {
        self.inner.memory_limit()
    }
}

/// Whether a consumer named `name` is the queue of a DataFusion `RepartitionExec`
/// (one per input partition, named `RepartitionExec[i]`; its merges are named
/// `RepartitionExec[Merge i]` and cannot spill).
fn is_repartition_queue(name: &str) -> bool {
    name.strip_prefix("RepartitionExec[")
        .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// A pool of 100 bytes whose last 20 are kept for consumers that cannot spill.
    fn pool_of_100_keeping_20() -> Arc<dyn MemoryPool> {
        Arc::new(HeadroomPool::new(
            TrackConsumersPool::new(GreedyMemoryPool::new(100), std::num::NonZeroUsize::MIN),
            100,
            20,
        ))
    }

    #[test]
    fn the_last_bytes_go_only_to_consumers_that_cannot_spill() {
        let pool = pool_of_100_keeping_20();
        let sort = MemoryConsumer::new("sort")
            .with_can_spill(true)
            .register(&pool);
        let merge = MemoryConsumer::new("merge").register(&pool);
        sort.try_grow(70).unwrap();
        let err = sort.try_grow(11).unwrap_err();
        assert!(
            matches!(err, DataFusionError::ResourcesExhausted(_)),
            "{err}"
        );
        assert!(err.to_string().contains("sort"), "{err}");
        sort.try_grow(10).unwrap();
        // The merge gets the last 20 bytes, and not one more.
        merge.try_grow(20).unwrap();
        assert!(merge.try_grow(1).is_err());
        // Once the merge holds part of the pool, the sort's limit is the same
        // total: nothing it gives back is lost to it.
        drop(merge);
        sort.shrink(30);
        sort.try_grow(30).unwrap();
        assert!(sort.try_grow(1).is_err());
        assert_eq!(pool.reserved(), 80);
        // A sort that has spilled all it held cannot make room by spilling: it
        // gets the headroom for its next batch, and the rest of it stays free.
        sort.free();
        let other = MemoryConsumer::new("other sort")
            .with_can_spill(true)
            .register(&pool);
        other.try_grow(78).unwrap();
        sort.try_grow(5).unwrap();
        assert!(
            sort.try_grow(5).is_err(),
            "holds 5: spilling them makes room"
        );
        let merge = MemoryConsumer::new("merge").register(&pool);
        merge.try_grow(17).unwrap();
        assert_eq!(pool.reserved(), 100);
    }

    #[test]
    fn a_repartition_queues_at_most_the_headroom() {
        let pool = pool_of_100_keeping_20();
        let queue = MemoryConsumer::new("RepartitionExec[0]")
            .with_can_spill(true)
            .register(&pool);
        // Its first batch, however large, rather than spilling every batch.
        queue.try_grow(30).unwrap();
        assert!(queue.try_grow(1).is_err());
        queue.shrink(25);
        queue.try_grow(15).unwrap();
        let err = queue.try_grow(1).unwrap_err();
        assert!(err.to_string().contains("RepartitionExec[0]"), "{err}");
        // The rest of the pool stays for the others.
        let sort = MemoryConsumer::new("sort")
            .with_can_spill(true)
            .register(&pool);
        sort.try_grow(60).unwrap();
        // Its merges cannot spill and are not queues.
        let merge = MemoryConsumer::new("RepartitionExec[Merge 0]").register(&pool);
        merge.try_grow(20).unwrap();
        assert_eq!(pool.reserved(), 100);
    }

    #[tokio::test]
    async fn repartition_queues_are_found_by_their_names() {
        use arrow_array::{Int64Array, RecordBatch};
        use arrow_schema::{DataType, Field, Schema};
        use datafusion::datasource::memory::MemorySourceConfig;
        use datafusion::execution::runtime_env::RuntimeEnvBuilder;
        use datafusion::execution::TaskContext;
        use datafusion::physical_plan::repartition::RepartitionExec;
        use datafusion::physical_plan::{collect, Partitioning};

        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(Int64Array::from_iter_values(0..1000))],
        )
        .unwrap();
        let input = MemorySourceConfig::try_new_exec(&[vec![batch]], schema, None).unwrap();
        let plan =
            Arc::new(RepartitionExec::try_new(input, Partitioning::RoundRobinBatch(2)).unwrap());
        let pool = Arc::new(NamesPool {
            names: std::sync::Mutex::default(),
            inner: GreedyMemoryPool::new(1 << 30),
        });
        let runtime = RuntimeEnvBuilder::new()
            .with_memory_pool(pool.clone())
            .build_arc()
            .unwrap();
        let context = Arc::new(TaskContext::default().with_runtime(runtime));
        let out = collect(plan, context).await.unwrap();
        assert_eq!(out.iter().map(|b| b.num_rows()).sum::<usize>(), 1000);
        let names = pool.names.lock().unwrap().clone();
        assert!(
            names.iter().any(|n| is_repartition_queue(n)),
            "no repartition queue among {names:?}"
        );
    }

    /// A pool that keeps the name of every consumer registered with it.
    #[derive(Debug)]
    struct NamesPool {
        names: std::sync::Mutex<Vec<String>>,
        inner: GreedyMemoryPool,
    }

    impl Display for NamesPool {
        fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
            f.write_str("names")
        }
    }

    impl MemoryPool for NamesPool {
        fn name(&self) -> &str {
            "names"
        }

        fn register(&self, consumer: &MemoryConsumer) {
            self.names.lock().unwrap().push(consumer.name().to_owned());
        }

        fn grow(&self, reservation: &MemoryReservation, additional: usize) {
            self.inner.grow(reservation, additional);
        }

        fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
            self.inner.shrink(reservation, shrink);
        }

        fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> DfResult<()> {
            self.inner.try_grow(reservation, additional)
        }

        fn reserved(&self) -> usize {
            self.inner.reserved()
        }
    }
}
