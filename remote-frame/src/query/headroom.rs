//! A first-come, first-served budget that keeps room for operators starting up.
//!
//! Under DataFusion's greedy pool an operator that can spill grows until the pool is
//! full and spills only when it is refused. A sort fed by an aggregate's partitions
//! (or by a join) fills the pool that way while its producer still has partitions
//! to run, and the producer's next hash table then cannot get its first bytes: the
//! query fails although everything in it could spill or fit. [`HeadroomPool`] keeps
//! the last part of the budget (the headroom) for reservations that are still small:
//! a spillable reservation that already holds at least the headroom may grow only
//! while that much stays free, so it spills a little earlier and whatever starts next
//! finds room. Reservations that cannot spill, and spillable ones below the
//! headroom, may use the whole budget.

use std::fmt::{self, Display, Formatter};
use std::sync::atomic::{AtomicUsize, Ordering};

use datafusion::common::{DataFusionError, Result as DfResult};
use datafusion::execution::memory_pool::{MemoryLimit, MemoryPool, MemoryReservation};

/// The part of the budget kept free of large spillable reservations: an eighth.
const HEADROOM_FRACTION: usize = 8;

/// See the module docs.
#[derive(Debug)]
pub(crate) struct HeadroomPool {
    size: usize,
    headroom: usize,
    used: AtomicUsize,
}

impl HeadroomPool {
    /// A pool of `size` bytes keeping an eighth of them as headroom.
    pub(crate) fn new(size: usize) -> Self {
        HeadroomPool {
            size,
            headroom: size / HEADROOM_FRACTION,
            used: AtomicUsize::new(0),
        }
    }

    /// The most the pool may hold after granting `additional` more to `reservation`.
    fn limit_for(&self, reservation: &MemoryReservation, additional: usize) -> usize {
        let large = reservation.size().saturating_add(additional) > self.headroom;
        if reservation.consumer().can_spill() && large {
            self.size - self.headroom
        } else {
            self.size
        }
    }
}

impl Display for HeadroomPool {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "headroom(used: {} B, pool_size: {} B, headroom: {} B)",
            self.used.load(Ordering::Relaxed),
            self.size,
            self.headroom
        )
    }
}

impl MemoryPool for HeadroomPool {
    fn name(&self) -> &str {
        "headroom"
    }

    fn grow(&self, _reservation: &MemoryReservation, additional: usize) {
        self.used.fetch_add(additional, Ordering::Relaxed);
    }

    fn shrink(&self, _reservation: &MemoryReservation, shrink: usize) {
        self.used.fetch_sub(shrink, Ordering::Relaxed);
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> DfResult<()> {
        let limit = self.limit_for(reservation, additional);
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                let want = used.checked_add(additional)?;
                (want <= limit).then_some(want)
            })
            .map_err(|used| {
                let kept = if limit < self.size {
                    format!(" ({} B of it kept for smaller reservations)", self.headroom)
                } else {
                    String::new()
                };
                DataFusionError::ResourcesExhausted(format!(
                    "Failed to allocate additional {additional} B for {} with {} B already \
                     allocated for this reservation - {} B remain available for the total \
                     memory pool{kept}",
                    reservation.consumer().name(),
                    reservation.size(),
                    self.size.saturating_sub(used),
                ))
            })?;
        Ok(())
    }

    fn reserved(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn memory_limit(&self) -> MemoryLimit {
        MemoryLimit::Finite(self.size)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::execution::memory_pool::MemoryConsumer;

    use super::*;

    #[test]
    fn large_spillable_reservations_leave_the_headroom_to_others() {
        let pool: Arc<dyn MemoryPool> = Arc::new(HeadroomPool::new(800));
        let sort = MemoryConsumer::new("sort")
            .with_can_spill(true)
            .register(&pool);
        sort.try_grow(650).unwrap();
        assert!(
            sort.try_grow(100).is_err(),
            "past 700 a large spillable one is refused"
        );
        sort.try_grow(50).unwrap();
        assert_eq!(pool.reserved(), 700);

        // A spillable reservation starting now gets the headroom, up to its size.
        let table = MemoryConsumer::new("table")
            .with_can_spill(true)
            .register(&pool);
        table.try_grow(100).unwrap();
        let err = table.try_grow(1).unwrap_err().to_string();
        assert!(err.contains("kept for smaller reservations"), "{err}");

        // One that cannot spill may take the last byte.
        let merge = MemoryConsumer::new("merge").register(&pool);
        merge.try_grow(0).unwrap();
        drop(table);
        merge.try_grow(100).unwrap();
        assert!(merge.try_grow(1).is_err(), "never past the budget");
        assert_eq!(pool.reserved(), 800);
        drop(sort);
        drop(merge);
        assert_eq!(pool.reserved(), 0);
    }
}
