//! # scad-remote-frame — dataframes in remote memory
//!
//! Tables whose columns live in Scad memory elements, and relational kernels over
//! them whose local memory stays within a budget the caller sets.
//!
//! - [`RemoteFrame`]: a table stored chunk by chunk (row groups of
//!   [`FrameEnv::chunk_rows`] rows) as the columns' Arrow buffers, with serializable
//!   metadata ([`FrameMeta`]: schema and, per chunk, where each buffer is). Read all
//!   of it, a projection of its columns, or a stream of batches; row count and schema
//!   come from the metadata alone. The JSON of the metadata is all another compute
//!   element needs to open the frame (given transports to the same memory elements).
//! - Kernels (results are RemoteFrames again): [`RemoteFrame::filter`],
//!   [`RemoteFrame::select`], [`RemoteFrame::with_columns`], [`RemoteFrame::join`]
//!   (inner, left, semi, anti; one or more key columns), [`RemoteFrame::group_by`]
//!   (any Polars aggregation: sum, mean, count, n_unique, min, max, ...),
//!   [`RemoteFrame::distinct`], [`RemoteFrame::sort`], [`RemoteFrame::sort_limit`],
//!   [`RemoteFrame::limit`], and [`RemoteFrame::map_batches`] for any row-wise
//!   Polars query.
//! - Arrow-native: frames are written from arrow-rs `RecordBatch`es
//!   ([`RemoteFrame::from_record_batches`], [`FrameWriter::push_batch`]) and read
//!   straight into arrow-rs arrays ([`RemoteFrame::to_record_batches`], the query
//!   engine's scan). Polars `DataFrame`s ([`RemoteFrame::from_polars`],
//!   [`RemoteFrame::to_polars`]) convert at the edge through the Arrow C data
//!   interface, sharing buffers.
//!
//! Expressions are Polars' own ([`col`], [`lit`], [`Expr`]); each batch or partition
//! is processed by Polars in memory, so per-partition speed is Polars' speed.
//! [`expr_json`] builds them from the versioned JSON tree the Python package sends.
//!
//! ## Layout in remote memory
//! A chunk of `n` rows is one allocation on one memory element (chunks are dealt
//! round-robin over the elements). Inside it, every column contributes its Arrow
//! buffers, each at a 64-byte aligned offset: the validity bitmap (only if the chunk
//! has nulls), then the values (fixed width: `n` values; booleans: a bitmap;
//! decimals: `i128`; dates: `i32` days), or for strings the `n` 16-byte string views
//! followed by the data buffers they point into (Arrow's string-view layout, so
//! nothing is re-encoded on either side). Reading a projection issues one vectored
//! read per memory element for all buffers of the chunks asked for, straight into
//! typed vectors that become the arrays without another copy; arrays are built
//! through the checked constructors, so corrupted bytes give an error. Frame data
//! moves over the transports directly (it is written once and streamed), not through
//! a page cache: a [`FrameEnv`] needs memory elements, no buffer pool.
//!
//! ## Seals
//! Every frame also holds a 64-byte [`seal`] in its own allocation (nonce, rows, a
//! hash of the metadata), and its metadata a fingerprint of each chunk's head.
//! Opening metadata checks both; each read and each query scan reads the seal again;
//! freeing zeroes it. So metadata of a frame that was freed, or whose memory was
//! reused, is refused ([`Error::Stale`]) instead of read, and a freed handle (or a
//! clone of it) refuses every later use ([`Error::Freed`]).
//!
//! ## The budget
//! [`FrameEnv::with_budget`] sets how many bytes of local memory kernels may hold (a
//! [`Budget`]: a positive number of bytes, or unlimited as [`FrameEnv::new`] starts):
//! the batches and partitions they read, Polars' results, and the batch being read
//! ahead, each sized as Polars sizes DataFrames. A join whose inputs (and result)
//! fit is done in one go; if only the right side fits, the left side streams past
//! it; otherwise both sides are hash-partitioned by key into remote memory and
//! joined partition by partition (a grace hash join), re-partitioning a partition
//! that is still too large with a new hash seed. A key too frequent to split is
//! joined by a nested loop over pages (inner joins), needs no work (semi and anti
//! joins hold only distinct keys) or is reported as [`Error::Skew`] naming the key
//! (left joins, group-bys). The largest amount held is [`KernelStats::peak_local_bytes`]
//! ([`FrameEnv::stats`]), with the time and bytes moved.
//!
//! ## Example
//! ```
//! use std::sync::Arc;
//! use polars::prelude::*;
//! use scad_core::transport::LocalTransport;
//! use scad_remote_array::MemoryElements;
//! use scad_remote_frame::{Budget, FrameEnv, JoinType, RemoteFrame};
//!
//! let elements = Arc::new(MemoryElements::new());
//! elements.add("mem0", Arc::new(LocalTransport::new(64 << 20)?))?;
//! let env = FrameEnv::new(elements).with_budget(Budget::bytes(16 << 20)?);
//!
//! let dates = df!("d_date_sk" => [1i64, 2, 3], "d_year" => [1999i32, 2000, 2000])?;
//! let sales = df!("ss_sold_date_sk" => [1i64, 2, 2, 3], "ss_price" => [1.0, 2.0, 3.0, 4.0])?;
//! let dates = RemoteFrame::from_polars(&env, &dates)?;
//! let sales = RemoteFrame::from_polars(&env, &sales)?;
//!
//! let y2000 = dates.filter(col("d_year").eq(lit(2000)))?;
//! let joined = sales.join(&y2000, ["ss_sold_date_sk"], ["d_date_sk"], JoinType::Semi)?;
//! let total = joined.group_by(&["ss_sold_date_sk"], [col("ss_price").sum()])?;
//! assert_eq!(total.rows(), 2);
//! // The next element needs only this JSON (and the same memory elements):
//! let json = total.to_json()?;
//! let again = RemoteFrame::from_json(&env, &json)?;
//! assert_eq!(again.to_polars()?.height(), 2);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod budget;
pub(crate) mod codec;
pub mod env;
pub mod error;
pub mod expr_json;
pub mod frame;
pub(crate) mod hash;
mod interop;
pub mod kernels;
pub mod meta;
pub mod query;
pub mod seal;

pub use budget::Budget;
pub use env::{FrameEnv, KernelStats, DEFAULT_CHUNK_ROWS};
pub use error::{Error, NameKind, Result};
pub use frame::{Batches, FrameWriter, RemoteFrame};
pub use kernels::JoinType;
pub use meta::{ColumnMeta, ColumnStats, ColumnType, FrameMeta};
pub use polars::prelude::{col, lit, DataFrame, Expr, SortMultipleOptions};
pub use query::{QueryOutput, QuerySession, QueryStats, Stage, StageOutput, StagePlan};
pub use seal::{Seal, SEAL_BYTES};

impl RemoteFrame {
    /// Writes arrow-rs record batches (all of one schema) as a new frame, each batch
    /// cut into chunks of [`FrameEnv::chunk_rows`] rows.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for no batches; as [`FrameWriter::push_batch`].
    pub fn from_record_batches(
        env: &FrameEnv,
        batches: &[arrow_array::RecordBatch],
    ) -> Result<Self> {
        let Some(first) = batches.first() else {
            return Err(Error::InvalidArgument("no record batches given".into()));
        };
        let _t = env.timer();
        let mut w = FrameWriter::with_arrow_schema(env, first.schema_ref())?;
        for b in batches {
            w.push_batch(b)?;
        }
        w.finish()
    }
}

/// Converts a Polars DataFrame to arrow-rs record batches (one per chunk).
///
/// # Errors
/// [`Error::Arrow`].
pub fn dataframe_to_record_batches(df: &DataFrame) -> Result<Vec<arrow_array::RecordBatch>> {
    interop::to_record_batches(df)
}

/// Converts arrow-rs record batches (one schema) to a Polars DataFrame.
///
/// # Errors
/// As [`RemoteFrame::from_record_batches`].
pub fn record_batches_to_dataframe(batches: &[arrow_array::RecordBatch]) -> Result<DataFrame> {
    interop::from_record_batches(batches)
}

#[cfg(test)]
mod tests {
    fn send_sync<T: Send + Sync>() {}

    #[test]
    fn shared_types_are_send_and_sync() {
        send_sync::<crate::RemoteFrame>();
        send_sync::<crate::FrameEnv>();
        send_sync::<crate::Error>();
    }
}
