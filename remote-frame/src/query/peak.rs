//! The budget's high-water mark.
//!
//! DataFusion's `PeakRecordingPool` keeps a running total of its own beside the
//! wrapped pool's, updated after the pool: while one operator shrinks and another
//! grows on another thread, that total briefly counts the shrunk bytes twice, and a
//! query that never held more than its budget could report a peak above it.
//! [`PeakPool`] reads the wrapped pool's own total right after each grant instead
//! (an atomic load for the greedy and unbounded pools), so its peak is a total the
//! pool really had.

use std::fmt::{self, Display, Formatter};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use datafusion::common::Result as DfResult;
use datafusion::execution::memory_pool::{
    MemoryConsumer, MemoryLimit, MemoryPool, MemoryReservation,
};

/// A memory pool that records the highest total the wrapped pool reached.
#[derive(Debug)]
pub(crate) struct PeakPool {
    inner: Arc<dyn MemoryPool>,
    peak: AtomicUsize,
}

impl PeakPool {
    pub(crate) fn new(inner: Arc<dyn MemoryPool>) -> Self {
        Self {
            inner,
            peak: AtomicUsize::new(0),
        }
    }

    /// The highest total reserved since the last [`PeakPool::reset_peak`].
    pub(crate) fn peak_reserved(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    /// Starts a new reading at what is reserved now.
    pub(crate) fn reset_peak(&self) {
        self.peak.store(self.inner.reserved(), Ordering::Relaxed);
    }

    fn record(&self) {
        self.peak
            .fetch_max(self.inner.reserved(), Ordering::Relaxed);
    }
}

impl Display for PeakPool {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        Display::fmt(&self.inner, f)
    }
}

impl MemoryPool for PeakPool {
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
        self.record();
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.inner.shrink(reservation, shrink);
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> DfResult<()> {
        self.inner.try_grow(reservation, additional)?;
        self.record();
        Ok(())
    }

    fn reserved(&self) -> usize {
        self.inner.reserved()
    }

    fn memory_limit(&self) -> MemoryLimit {
        self.inner.memory_limit()
    }
}

#[cfg(test)]
mod tests {
    use datafusion::execution::memory_pool::GreedyMemoryPool;

    use super::*;

    #[test]
    fn the_peak_is_the_most_held_at_once() {
        let peak = Arc::new(PeakPool::new(Arc::new(GreedyMemoryPool::new(100))));
        let pool: Arc<dyn MemoryPool> = peak.clone();
        let a = MemoryConsumer::new("a").register(&pool);
        let b = MemoryConsumer::new("b").register(&pool);
        a.try_grow(60).unwrap();
        a.shrink(50);
        b.try_grow(80).unwrap();
        assert!(a.try_grow(20).is_err(), "a refused grant is not counted");
        assert_eq!(peak.peak_reserved(), 90);
        drop(b);
        peak.reset_peak();
        assert_eq!(peak.peak_reserved(), 10);
        a.try_grow(5).unwrap();
        assert_eq!(peak.peak_reserved(), 15);
    }
}
