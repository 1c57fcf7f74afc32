//! The server-wide budget of bytes in flight, taken by RAII grants.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The server-wide budget of bytes in flight.
#[derive(Debug)]
pub(super) struct Budget {
    limit: u64,
    used: AtomicU64,
    waiters: AtomicUsize,
    closed: AtomicBool,
    lock: Mutex<()>,
    freed: Condvar,
}

/// Bytes taken from a [`Budget`], given back on drop.
#[derive(Debug)]
pub(super) struct Grant<'a> {
    budget: &'a Budget,
    bytes: u64,
}

impl Drop for Grant<'_> {
    fn drop(&mut self) {
        self.budget.give(self.bytes);
    }
}

impl Budget {
    pub(super) fn new(limit: u64) -> Self {
        Budget {
            limit,
            used: AtomicU64::new(0),
            waiters: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            lock: Mutex::new(()),
            freed: Condvar::new(),
        }
    }

    fn try_take(&self, bytes: u64) -> bool {
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                used.checked_add(bytes).filter(|&n| n <= self.limit)
            })
            .is_ok()
    }

    /// Takes `bytes`, waiting up to `wait` for other requests to give some back.
    pub(super) fn take(&self, bytes: u64, wait: Duration) -> Option<Grant<'_>> {
        let grant = Grant {
            budget: self,
            bytes,
        };
        if bytes == 0 || self.try_take(bytes) {
            return Some(grant);
        }
        let deadline = Instant::now() + wait;
        // Registered before the retry under the lock, so a giver that frees bytes after
        // our failed try sees us and notifies (it takes the lock first, so the notice
        // cannot fall between our try and our wait).
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let mut guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        let result = loop {
            if self.try_take(bytes) {
                break Some(grant);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.closed.load(Ordering::SeqCst) {
                std::mem::forget(grant);
                break None;
            }
            guard = self
                .freed
                .wait_timeout(guard, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        };
        drop(guard);
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        result
    }

    fn give(&self, bytes: u64) {
        if bytes == 0 {
            return;
        }
        self.used.fetch_sub(bytes, Ordering::SeqCst);
        if self.waiters.load(Ordering::SeqCst) > 0 {
            let _guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
            self.freed.notify_all();
        }
    }

    /// Wakes every waiter for good (the server is stopping).
    pub(super) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let _guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        self.freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_waits_for_bytes_given_back() {
        let budget = Budget::new(100);
        let first = budget.take(80, Duration::ZERO).unwrap();
        assert!(budget.take(30, Duration::from_millis(10)).is_none());
        assert!(budget.take(20, Duration::ZERO).is_some());
        std::thread::scope(|s| {
            let waiter = s.spawn(|| budget.take(50, Duration::from_secs(30)).map(|g| g.bytes));
            std::thread::sleep(Duration::from_millis(20));
            drop(first);
            assert_eq!(waiter.join().unwrap(), Some(50));
        });
        assert_eq!(budget.used.load(Ordering::SeqCst), 0);
        // More than the whole budget never fits; zero always does.
        assert!(budget.take(101, Duration::from_millis(5)).is_none());
        assert!(budget.take(0, Duration::ZERO).is_some());
    }

    #[test]
    fn closing_the_budget_releases_waiters() {
        let budget = Budget::new(10);
        let _all = budget.take(10, Duration::ZERO).unwrap();
        std::thread::scope(|s| {
            let waiter = s.spawn(|| budget.take(5, Duration::from_secs(60)).is_none());
            std::thread::sleep(Duration::from_millis(20));
            budget.close();
            assert!(waiter.join().unwrap(), "a closed budget grants nothing");
        });
    }
}
