//! # scad-remote-frame — dataframes in remote memory
//!
//! Tables whose columns live in Scad memory elements, and one query engine over
//! them whose local memory stays within a budget the caller sets.
//!
//! - [`RemoteFrame`]: a table stored chunk by chunk (row groups of
//!   [`FrameEnv::chunk_rows`] rows) as the columns' Arrow buffers, with serializable
//!   metadata ([`FrameMeta`]: schema and, per chunk, where each buffer is). Read all
//!   of it, a projection of its columns, or a stream of batches; row count and schema
//!   come from the metadata alone. The JSON of the metadata is all another compute
//!   element needs to open the frame (given transports to the same memory elements).
//! - The engine ([`query`]): SQL ([`QuerySession::sql`]) and lazy queries
//!   ([`query::LazyQuery`]) planned by DataFusion and run by Scad's scan and
//!   spilling operators, which spill to memory elements, never to local disk.
//! - Verbs (results are RemoteFrames again), each a query on that engine:
//!   [`RemoteFrame::filter`], [`RemoteFrame::select`], [`RemoteFrame::with_columns`],
//!   [`RemoteFrame::join`] (inner, left, right, full, semi, anti; one or more key
//!   columns), [`RemoteFrame::group_by`], [`RemoteFrame::distinct`],
//!   [`RemoteFrame::sort`], [`RemoteFrame::sort_limit`], [`RemoteFrame::limit`].
//!   Expressions are DataFusion's ([`query::expr`]); [`expr_json`] builds them, with
//!   Polars' semantics, from the versioned JSON tree the Python package sends.
//! - Arrow-native: frames are written from arrow-rs `RecordBatch`es
//!   ([`RemoteFrame::from_record_batches`], [`FrameWriter::push_batch`]) and read
//!   straight into arrow-rs arrays ([`RemoteFrame::to_record_batches`], the query
//!   engine's scan). Polars `DataFrame`s ([`RemoteFrame::from_polars`],
//!   [`RemoteFrame::to_polars`], [`RemoteFrame::map_batches`]) convert at the edge
//!   through the Arrow C data interface, sharing buffers.
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
//! [`FrameEnv::with_budget`] sets how many bytes of local memory queries and verbs
//! may hold (a [`Budget`]: a positive number of bytes, or unlimited as
//! [`FrameEnv::new`] starts). Every operator reserves from one pool of that size
//! before it holds memory; joins, aggregates, sorts and windows that cannot get it
//! spill to memory elements (see [`query`]). The largest amount reserved is
//! [`KernelStats::peak_local_bytes`] ([`FrameEnv::stats`]), with the time, bytes
//! moved and spill files.
//!
//! ## Example
//! ```
//! use std::sync::Arc;
//! use arrow_array::{Float64Array, Int32Array, Int64Array, RecordBatch};
//! use scad_core::transport::LocalTransport;
//! use scad_remote_array::MemoryElements;
//! use scad_remote_frame::query::expr::{col, lit, sum};
//! use scad_remote_frame::{Budget, FrameEnv, JoinType, RemoteFrame};
//!
//! let elements = Arc::new(MemoryElements::new());
//! elements.add("mem0", Arc::new(LocalTransport::new(64 << 20)?))?;
//! let env = FrameEnv::new(elements).with_budget(Budget::bytes(16 << 20)?);
//!
//! let dates = RecordBatch::try_from_iter([
//!     ("d_date_sk", Arc::new(Int64Array::from(vec![1, 2, 3])) as _),
//!     ("d_year", Arc::new(Int32Array::from(vec![1999, 2000, 2000])) as _),
//! ])?;
//! let sales = RecordBatch::try_from_iter([
//!     ("ss_sold_date_sk", Arc::new(Int64Array::from(vec![1, 2, 2, 3])) as _),
//!     ("ss_price", Arc::new(Float64Array::from(vec![1.0, 2.0, 3.0, 4.0])) as _),
//! ])?;
//! let dates = RemoteFrame::from_record_batches(&env, &[dates])?;
//! let sales = RemoteFrame::from_record_batches(&env, &[sales])?;
//!
//! let y2000 = dates.filter(col("d_year").eq(lit(2000)))?;
//! let joined = sales.join(&y2000, ["ss_sold_date_sk"], ["d_date_sk"], JoinType::LeftSemi)?;
//! let total = joined.group_by(&["ss_sold_date_sk"], [sum(col("ss_price"))])?;
//! assert_eq!(total.rows(), 2);
//! // The next element needs only this JSON (and the same memory elements):
//! let json = total.to_json()?;
//! let again = RemoteFrame::from_json(&env, &json)?;
//! assert_eq!(again.to_record_batches()?.iter().map(|b| b.num_rows()).sum::<usize>(), 2);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod budget;
pub(crate) mod codec;
pub mod env;
pub mod error;
pub mod expr_json;
pub mod frame;
#[cfg(feature = "polars")]
mod interop;
pub mod meta;
pub mod query;
pub mod seal;
pub mod sketch;
mod views;

pub use budget::Budget;
pub use datafusion::logical_expr::JoinType;
pub use env::{FrameEnv, KernelStats, DEFAULT_CHUNK_ROWS};
pub use error::{Error, NameKind, Result};
pub use frame::{Batches, FrameWriter, RemoteFrame};
pub use meta::{ColumnMeta, ColumnStats, ColumnType, Dictionary, FrameMeta, Packing};
#[cfg(feature = "polars")]
pub use polars::prelude::DataFrame;
pub use query::{
    run_task, DistributedOutput, DistributedQuery, QueryOutput, QuerySession, QueryStats, Stage,
    StageFrames, StageOutput, StagePlan, TaskOutput, TaskRecord, TaskRunner, TaskSpec,
    ThreadRunner,
};
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

#[cfg(feature = "polars")]
/// Converts a Polars DataFrame to arrow-rs record batches (one per chunk).
///
/// # Errors
/// [`Error::Arrow`].
pub fn dataframe_to_record_batches(df: &DataFrame) -> Result<Vec<arrow_array::RecordBatch>> {
    interop::to_record_batches(df)
}

#[cfg(feature = "polars")]
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
