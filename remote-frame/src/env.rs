//! [`FrameEnv`]: where frames live (a [`RemoteStore`]), the local memory budget the
//! kernels keep to, and the counters they report ([`KernelStats`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use scad_core::Transport;
use scad_remote_array::RemoteStore;

use crate::error::{Error, Result};

/// Default rows per stored chunk.
pub const DEFAULT_CHUNK_ROWS: usize = 128 * 1024;

/// Counters of the kernels run in one [`FrameEnv`] (cumulative; see
/// [`FrameEnv::stats`] and [`FrameEnv::reset_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct KernelStats {
    /// Wall time spent inside kernels.
    pub time: Duration,
    /// Bytes read from memory elements (frame data).
    pub bytes_in: u64,
    /// Bytes written to memory elements (frame data).
    pub bytes_out: u64,
    /// Largest local memory the kernels held at once: the frames read, the
    /// partitions being joined or aggregated, and their results, as Polars sizes them.
    pub peak_local_bytes: u64,
    /// Hash partitions written to remote memory (all levels).
    pub partitions: u64,
    /// Deepest recursive re-partitioning level reached (0: none needed).
    pub max_level: u32,
    /// Partitions joined by the nested loop over pages (skewed keys).
    pub nested_loop_partitions: u64,
}

impl std::fmt::Display for KernelStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.3} s, {:.1} MiB in, {:.1} MiB out, peak local {:.1} MiB, {} partitions (max level {}), {} nested-loop partitions",
            self.time.as_secs_f64(),
            self.bytes_in as f64 / (1 << 20) as f64,
            self.bytes_out as f64 / (1 << 20) as f64,
            self.peak_local_bytes as f64 / (1 << 20) as f64,
            self.partitions,
            self.max_level,
            self.nested_loop_partitions
        )
    }
}

#[derive(Debug, Default)]
struct Counters {
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    current: AtomicU64,
    peak: AtomicU64,
    partitions: AtomicU64,
    max_level: AtomicU64,
    nested: AtomicU64,
    time_ns: AtomicU64,
}

/// The context frames and kernels run in: the store of memory elements, the local
/// memory budget, the chunk size and placement of new frames, and counters.
///
/// Cheap to clone (an `Arc` inside); `Send + Sync`.
#[derive(Debug, Clone)]
pub struct FrameEnv {
    inner: Arc<EnvInner>,
}

#[derive(Debug)]
struct EnvInner {
    store: Arc<RemoteStore>,
    budget: u64,
    chunk_rows: usize,
    elements: Vec<String>,
    next_element: AtomicU64,
    counters: Counters,
    transports: Mutex<Vec<(String, Arc<dyn Transport>)>>,
}

impl FrameEnv {
    /// An environment over `store` with an unlimited budget, chunks of
    /// [`DEFAULT_CHUNK_ROWS`] rows, and new frames dealt over all of the store's
    /// elements chunk by chunk.
    pub fn new(store: Arc<RemoteStore>) -> Self {
        Self::build(store, u64::MAX, DEFAULT_CHUNK_ROWS, Vec::new())
    }

    fn build(
        store: Arc<RemoteStore>,
        budget: u64,
        chunk_rows: usize,
        elements: Vec<String>,
    ) -> Self {
        FrameEnv {
            inner: Arc::new(EnvInner {
                store,
                budget,
                chunk_rows: chunk_rows.max(1),
                elements,
                next_element: AtomicU64::new(0),
                counters: Counters::default(),
                transports: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The same store and settings with a local memory budget of `bytes` (fresh
    /// counters).
    pub fn with_budget(&self, bytes: u64) -> Self {
        Self::build(
            self.inner.store.clone(),
            bytes.max(1),
            self.inner.chunk_rows,
            self.inner.elements.clone(),
        )
    }

    /// The same with `rows` rows per stored chunk (fresh counters).
    pub fn with_chunk_rows(&self, rows: usize) -> Self {
        Self::build(
            self.inner.store.clone(),
            self.inner.budget,
            rows,
            self.inner.elements.clone(),
        )
    }

    /// The same, placing new frames only on the named elements (fresh counters).
    pub fn with_elements<I, S>(&self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::build(
            self.inner.store.clone(),
            self.inner.budget,
            self.inner.chunk_rows,
            names.into_iter().map(Into::into).collect(),
        )
    }

    /// The store.
    pub fn store(&self) -> &Arc<RemoteStore> {
        &self.inner.store
    }

    /// The local memory budget in bytes (`u64::MAX`: unlimited).
    pub fn budget(&self) -> u64 {
        self.inner.budget
    }

    /// Rows per stored chunk of new frames.
    pub fn chunk_rows(&self) -> usize {
        self.inner.chunk_rows
    }

    /// The counters so far.
    pub fn stats(&self) -> KernelStats {
        let c = &self.inner.counters;
        KernelStats {
            time: Duration::from_nanos(c.time_ns.load(Ordering::Relaxed)),
            bytes_in: c.bytes_in.load(Ordering::Relaxed),
            bytes_out: c.bytes_out.load(Ordering::Relaxed),
            peak_local_bytes: c.peak.load(Ordering::Relaxed),
            partitions: c.partitions.load(Ordering::Relaxed),
            max_level: c.max_level.load(Ordering::Relaxed) as u32,
            nested_loop_partitions: c.nested.load(Ordering::Relaxed),
        }
    }

    /// Zeroes the counters (the peak restarts from what is held now).
    pub fn reset_stats(&self) {
        let c = &self.inner.counters;
        for a in [
            &c.bytes_in,
            &c.bytes_out,
            &c.partitions,
            &c.max_level,
            &c.nested,
            &c.time_ns,
        ] {
            a.store(0, Ordering::Relaxed);
        }
        c.peak
            .store(c.current.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// Bytes of local memory the kernels hold now.
    pub fn local_bytes(&self) -> u64 {
        self.inner.counters.current.load(Ordering::Relaxed)
    }

    pub(crate) fn add_in(&self, n: u64) {
        self.inner.counters.bytes_in.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn add_out(&self, n: u64) {
        self.inner
            .counters
            .bytes_out
            .fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn add_partitions(&self, n: u64, level: u32) {
        let c = &self.inner.counters;
        c.partitions.fetch_add(n, Ordering::Relaxed);
        c.max_level.fetch_max(u64::from(level), Ordering::Relaxed);
    }

    pub(crate) fn add_nested(&self) {
        self.inner.counters.nested.fetch_add(1, Ordering::Relaxed);
    }

    /// Records `bytes` of local memory as held until the guard drops.
    pub(crate) fn hold(&self, bytes: u64) -> Held {
        let c = &self.inner.counters;
        let now = c.current.fetch_add(bytes, Ordering::Relaxed) + bytes;
        c.peak.fetch_max(now, Ordering::Relaxed);
        Held {
            env: self.clone(),
            bytes,
        }
    }

    /// Starts timing a kernel; the time is added when the guard drops. Nested kernels
    /// (a join's partitioning) are counted once, by the outermost timer.
    pub(crate) fn timer(&self) -> Timer {
        Timer {
            env: self.clone(),
            start: Instant::now(),
        }
    }

    /// The element the next chunk of a new frame goes to (round-robin).
    pub(crate) fn next_element(&self) -> Result<String> {
        let names = if self.inner.elements.is_empty() {
            self.inner.store.element_names()
        } else {
            self.inner.elements.clone()
        };
        if names.is_empty() {
            return Err(Error::InvalidArgument(
                "the store has no memory elements to place a frame on".into(),
            ));
        }
        let k = self.inner.next_element.fetch_add(1, Ordering::Relaxed) as usize;
        Ok(names[k % names.len()].clone())
    }

    /// Makes sure new frames are not allocated over the given frames' chunks: on every
    /// element they use, the allocator's bump pointer is moved past their highest
    /// chunk. This is what a later compute element calls when all it got were frame
    /// metadata (no [`scad_remote_array::AllocationState`]); it gives up the free
    /// list below that point, so prefer handing on the allocation state when there is one.
    ///
    /// # Errors
    /// [`Error::Array`] for an element the store lacks or a frame beyond its range.
    pub fn reserve_frames(&self, metas: &[&crate::meta::FrameMeta]) -> Result<()> {
        let state = self.inner.store.allocation_state();
        let mut next = scad_remote_array::AllocationState::default();
        for a in &state.allocators {
            let end = metas
                .iter()
                .flat_map(|m| m.chunks.iter())
                .filter(|c| c.element == a.element())
                .map(|c| c.addr.saturating_add(c.bytes))
                .max();
            let Some(end) = end else { continue };
            if end <= a.high_water() {
                continue;
            }
            let range = a.range();
            let mut fresh = scad_remote_array::RemoteAllocator::new(
                a.element(),
                range.clone(),
                crate::meta::BUFFER_ALIGN,
            )?;
            fresh.allocate(end.saturating_sub(range.start))?;
            next.allocators.push(fresh);
        }
        self.inner.store.resume_allocation(&next)?;
        Ok(())
    }

    /// The transport of element `name` (cached).
    pub(crate) fn transport(&self, name: &str) -> Result<Arc<dyn Transport>> {
        let mut cache = self
            .inner
            .transports
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((_, t)) = cache.iter().find(|(n, _)| n == name) {
            return Ok(t.clone());
        }
        let pool = self.inner.store.pool();
        let t = pool
            .find_transport(name)
            .and_then(|id| pool.transport(id))
            .ok_or_else(|| {
                Error::from(scad_remote_array::Error::UnknownElement {
                    name: name.to_owned(),
                    known: self.inner.store.element_names().join(", "),
                })
            })?;
        cache.push((name.to_owned(), t.clone()));
        Ok(t)
    }
}

/// Local memory recorded as held; released on drop.
#[derive(Debug)]
pub(crate) struct Held {
    env: FrameEnv,
    bytes: u64,
}

impl Held {
    /// Changes the amount held (a result that grew or shrank).
    pub(crate) fn set(&mut self, bytes: u64) {
        let c = &self.env.inner.counters;
        if bytes >= self.bytes {
            let now =
                c.current.fetch_add(bytes - self.bytes, Ordering::Relaxed) + bytes - self.bytes;
            c.peak.fetch_max(now, Ordering::Relaxed);
        } else {
            c.current.fetch_sub(self.bytes - bytes, Ordering::Relaxed);
        }
        self.bytes = bytes;
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.env
            .inner
            .counters
            .current
            .fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// Adds the elapsed time to the counters on drop.
#[derive(Debug)]
pub(crate) struct Timer {
    env: FrameEnv,
    start: Instant,
}

impl Drop for Timer {
    fn drop(&mut self) {
        let ns = self.start.elapsed().as_nanos() as u64;
        self.env
            .inner
            .counters
            .time_ns
            .fetch_add(ns, Ordering::Relaxed);
    }
}
