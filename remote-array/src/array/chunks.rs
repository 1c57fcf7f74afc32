//! [`Chunks`]: iterate a remote array in row chunks with read-ahead.

use std::ops::Range;
use std::thread::JoinHandle;

use bytemuck::Pod;
use ndarray::{Array, Dimension};

use super::RemoteArray;
use crate::error::Result;

/// Iterator over a [`RemoteArray`] in chunks of rows; made by
/// [`RemoteArray::chunks`]. Yields each chunk's row range and its data.
///
/// After handing out a chunk it prefetches the next one into the pool on a background
/// thread (best effort: at most a quarter of the pool), so fetching overlaps the
/// caller's work. After an error the iterator ends.
pub struct Chunks<T: Pod + Send + Sync, D: Dimension> {
    array: RemoteArray<T, D>,
    rows_per_chunk: usize,
    next_row: usize,
    read_ahead: bool,
    prefetch: Option<JoinHandle<()>>,
}

impl<T: Pod + Send + Sync, D: Dimension> std::fmt::Debug for Chunks<T, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chunks")
            .field("rows_per_chunk", &self.rows_per_chunk)
            .field("next_row", &self.next_row)
            .field("read_ahead", &self.read_ahead)
            .finish_non_exhaustive()
    }
}

impl<T: Pod + Send + Sync, D: Dimension> Chunks<T, D> {
    pub(super) fn new(array: RemoteArray<T, D>, rows_per_chunk: usize) -> Self {
        Chunks {
            array,
            rows_per_chunk,
            next_row: 0,
            read_ahead: true,
            prefetch: None,
        }
    }

    /// Turns background prefetching of the next chunk on or off (on by default).
    #[must_use]
    pub fn read_ahead(mut self, on: bool) -> Self {
        self.read_ahead = on;
        self
    }

    fn join_prefetch(&mut self) {
        if let Some(h) = self.prefetch.take() {
            // A failed prefetch only means the next read fetches for itself.
            let _ = h.join();
        }
    }

    fn start_prefetch(&mut self, rows: Range<usize>) {
        let pool = std::sync::Arc::clone(self.array.store.pool());
        let ranges = self.array.ranges(rows);
        self.prefetch = std::thread::Builder::new()
            .name("scad-chunk-prefetch".into())
            .spawn(move || {
                if let Err(e) = pool.prefetch(&ranges) {
                    tracing::debug!(error = %e, "chunk prefetch failed");
                }
            })
            .ok();
    }
}

impl<T: Pod + Send + Sync, D: Dimension> Iterator for Chunks<T, D> {
    type Item = Result<(Range<usize>, Array<T, D>)>;

    fn next(&mut self) -> Option<Self::Item> {
        let n = self.array.rows();
        if self.next_row >= n {
            return None;
        }
        self.join_prefetch();
        let r = self.next_row..(self.next_row + self.rows_per_chunk).min(n);
        match self.array.materialize_range(r.clone()) {
            Ok(chunk) => {
                self.next_row = r.end;
                if self.read_ahead && r.end < n {
                    self.start_prefetch(r.end..(r.end + self.rows_per_chunk).min(n));
                }
                Some(Ok((r, chunk)))
            }
            Err(e) => {
                self.next_row = n;
                Some(Err(e))
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = (self.array.rows() - self.next_row.min(self.array.rows()))
            .div_ceil(self.rows_per_chunk);
        (left, Some(left))
    }
}

impl<T: Pod + Send + Sync, D: Dimension> Drop for Chunks<T, D> {
    fn drop(&mut self) {
        self.join_prefetch();
    }
}
