//! [`FrameEnv`]: where frames live (the [`MemoryElements`] a compute element
//! reaches), the local memory budget frame operations keep to, and the counters they
//! report ([`KernelStats`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use scad_core::Transport;
use scad_remote_array::MemoryElements;

use crate::budget::Budget;
use crate::error::{Error, Result};

/// Default rows per stored chunk.
pub const DEFAULT_CHUNK_ROWS: usize = 128 * 1024;

/// Counters of the frame operations run in one [`FrameEnv`] (cumulative; see
/// [`FrameEnv::stats`] and [`FrameEnv::reset_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct KernelStats {
    /// Wall time spent inside frame operations.
    pub time: Duration,
    /// Bytes read from memory elements (frame data and spill files read back).
    pub bytes_in: u64,
    /// Bytes written to memory elements (frame data and spill files).
    pub bytes_out: u64,
    /// Largest local memory held at once: the batches being read or written, and
    /// the query operators' reservations.
    pub peak_local_bytes: u64,
    /// Spill files the query operators wrote to memory elements.
    pub spill_files: u64,
}

impl std::fmt::Display for KernelStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.3} s, {:.1} MiB in, {:.1} MiB out, peak local {:.1} MiB, {} spill files",
            self.time.as_secs_f64(),
            self.bytes_in as f64 / (1 << 20) as f64,
            self.bytes_out as f64 / (1 << 20) as f64,
            self.peak_local_bytes as f64 / (1 << 20) as f64,
            self.spill_files,
        )
    }
}

#[derive(Debug, Default)]
struct Counters {
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    current: AtomicU64,
    peak: AtomicU64,
    spill_files: AtomicU64,
    time_ns: AtomicU64,
}

/// The context frames and their operations run in: the memory elements frames and spill files
/// live on, the local memory budget, the chunk size and placement of new frames, and
/// counters. Frames read and write their chunks through the elements' transports
/// directly, so no buffer pool is needed.
///
/// Cheap to clone (an `Arc` inside); `Send + Sync`.
#[derive(Debug, Clone)]
pub struct FrameEnv {
    inner: Arc<EnvInner>,
}

#[derive(Debug)]
struct EnvInner {
    registry: Arc<MemoryElements>,
    budget: Budget,
    chunk_rows: usize,
    elements: Vec<String>,
    next_element: AtomicU64,
    counters: Counters,
}

impl FrameEnv {
    /// An environment over `elements` with an unlimited budget, chunks of
    /// [`DEFAULT_CHUNK_ROWS`] rows, and new frames dealt over all of the elements
    /// chunk by chunk.
    pub fn new(elements: Arc<MemoryElements>) -> Self {
        Self::build(elements, Budget::Unlimited, DEFAULT_CHUNK_ROWS, Vec::new())
    }

    fn build(
        registry: Arc<MemoryElements>,
        budget: Budget,
        chunk_rows: usize,
        elements: Vec<String>,
    ) -> Self {
        FrameEnv {
            inner: Arc::new(EnvInner {
                registry,
                budget,
                chunk_rows: chunk_rows.max(1),
                elements,
                next_element: AtomicU64::new(0),
                counters: Counters::default(),
            }),
        }
    }

    /// The same elements and settings with local memory budget `budget` (fresh
    /// counters).
    pub fn with_budget(&self, budget: Budget) -> Self {
        Self::build(
            Arc::clone(&self.inner.registry),
            budget,
            self.inner.chunk_rows,
            self.inner.elements.clone(),
        )
    }

    /// The same with `rows` rows per stored chunk (fresh counters).
    pub fn with_chunk_rows(&self, rows: usize) -> Self {
        Self::build(
            Arc::clone(&self.inner.registry),
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
            Arc::clone(&self.inner.registry),
            self.inner.budget,
            self.inner.chunk_rows,
            names.into_iter().map(Into::into).collect(),
        )
    }

    /// The memory elements frames live on: where they allocate, free and hand on
    /// allocation state.
    pub fn elements(&self) -> &Arc<MemoryElements> {
        &self.inner.registry
    }

    /// The local memory budget.
    pub fn budget(&self) -> Budget {
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
            spill_files: c.spill_files.load(Ordering::Relaxed),
        }
    }

    /// Zeroes the counters (the peak restarts from what is held now).
    pub fn reset_stats(&self) {
        let c = &self.inner.counters;
        for a in [&c.bytes_in, &c.bytes_out, &c.spill_files, &c.time_ns] {
            a.store(0, Ordering::Relaxed);
        }
        c.peak
            .store(c.current.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// Bytes of local memory frame operations hold now (outside query operators).
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

    /// Adds a query's figures: what it read and spilled, and its operators' peak on
    /// top of what is held outside the query now.
    pub(crate) fn record_query(&self, q: &crate::query::QueryStats) {
        let c = &self.inner.counters;
        c.bytes_in
            .fetch_add(q.scan_bytes + q.spill_bytes_read, Ordering::Relaxed);
        c.bytes_out
            .fetch_add(q.spill_bytes_written, Ordering::Relaxed);
        c.spill_files.fetch_add(q.spill_files, Ordering::Relaxed);
        let peak = c.current.load(Ordering::Relaxed) + q.peak_local_bytes;
        c.peak.fetch_max(peak, Ordering::Relaxed);
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

    /// The elements new frames are placed on, in round-robin order (never empty).
    fn placement(&self) -> Result<Vec<String>> {
        let names = if self.inner.elements.is_empty() {
            self.inner.registry.names()
        } else {
            self.inner.elements.clone()
        };
        if names.is_empty() {
            return Err(Error::InvalidArgument(
                "the environment has no memory elements to place a frame on".into(),
            ));
        }
        Ok(names)
    }

    /// The element the next chunk of a new frame goes to (round-robin).
    pub(crate) fn next_element(&self) -> Result<String> {
        let names = self.placement()?;
        let k = self.inner.next_element.fetch_add(1, Ordering::Relaxed) as usize;
        Ok(names[k % names.len()].clone())
    }

    /// The element a frame without chunks keeps its seal on: the first new frames are
    /// placed on (the round-robin is not advanced).
    pub(crate) fn first_element(&self) -> Result<String> {
        Ok(self.placement()?.swap_remove(0))
    }

    /// Makes sure new frames are not allocated over the given frames' chunks and seals:
    /// on every element they use, the allocator's bump pointer is moved past their
    /// highest chunk or seal. This is what a later compute element calls when all it got were frame
    /// metadata (no [`scad_remote_array::AllocationState`]); it gives up the free
    /// list below that point, so prefer handing on the allocation state when there is one.
    ///
    /// # Errors
    /// [`Error::Array`] for an element the environment lacks or a frame beyond its
    /// range.
    pub fn reserve_frames(&self, metas: &[&crate::meta::FrameMeta]) -> Result<()> {
        let state = self.inner.registry.allocation_state();
        let mut next = scad_remote_array::AllocationState::default();
        for a in &state.allocators {
            let chunks = metas
                .iter()
                .flat_map(|m| m.chunks.iter())
                .map(|c| (&c.element, c.addr.saturating_add(c.bytes)));
            let seals = metas
                .iter()
                .filter_map(|m| m.seal.as_ref())
                .map(|s| (&s.element, s.addr.saturating_add(crate::seal::SEAL_BYTES)));
            let end = chunks
                .chain(seals)
                .filter(|(e, _)| *e == a.element())
                .map(|(_, end)| end)
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
        self.inner.registry.resume_allocation(&next)?;
        Ok(())
    }

    /// The transport of element `name`.
    pub(crate) fn transport(&self, name: &str) -> Result<Arc<dyn Transport>> {
        Ok(self.inner.registry.transport(name)?)
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

#[cfg(test)]
mod tests {
    use polars::prelude::*;
    use scad_core::transport::LocalTransport;

    use super::*;
    use crate::frame::RemoteFrame;

    /// A frame environment needs memory elements and nothing else: no buffer pool,
    /// no store.
    #[test]
    fn a_frame_round_trips_through_elements_without_a_pool() {
        let elements = Arc::new(MemoryElements::new());
        for name in ["mem0", "mem1"] {
            elements
                .add(name, Arc::new(LocalTransport::new(4 << 20).expect("local")))
                .expect("add");
        }
        let env = FrameEnv::new(Arc::clone(&elements)).with_chunk_rows(3);
        assert!(Arc::ptr_eq(env.elements(), &elements));
        let before = elements.allocation_state();
        let df = df!(
            "k" => [Some(1i64), None, Some(3), Some(4), Some(5)],
            "s" => ["a", "bb", "", "dddd", "e"],
        )
        .expect("df");
        let frame = RemoteFrame::from_polars(&env, &df).expect("write");
        // Two chunks, dealt over both elements, allocated from the registry.
        let used: Vec<String> = frame
            .meta()
            .chunks
            .iter()
            .map(|c| c.element.clone())
            .collect();
        assert_eq!(used, ["mem0", "mem1"]);
        assert_ne!(elements.allocation_state(), before);
        assert!(frame.to_polars().expect("read").equals_missing(&df));
        // Another environment over the same elements opens it from its metadata.
        let json = frame.to_json().expect("json");
        let other = FrameEnv::new(Arc::clone(&elements));
        let again = RemoteFrame::from_json(&other, &json).expect("open");
        assert!(again.to_polars().expect("read").equals_missing(&df));
        frame.free().expect("free");
        let available = |s: scad_remote_array::AllocationState| -> u64 {
            s.allocators.iter().map(|a| a.available()).sum()
        };
        assert_eq!(available(elements.allocation_state()), available(before));
    }

    #[test]
    fn an_unknown_element_names_the_known_ones() {
        let elements = Arc::new(MemoryElements::new());
        elements
            .add(
                "mem0",
                Arc::new(LocalTransport::new(1 << 20).expect("local")),
            )
            .expect("add");
        let env = FrameEnv::new(elements);
        let err = env.transport("nope").map(drop).unwrap_err();
        assert!(err.to_string().contains("(known: mem0)"), "{err}");
        let empty = FrameEnv::new(Arc::new(MemoryElements::new()));
        assert!(empty.next_element().is_err());
    }
}
