//! # scad-remote-array — cached remote n-dimensional arrays
//!
//! Typed arrays whose data lives in Scad memory elements, read and written through a
//! local page cache.
//!
//! - [`MemoryElements`]: the one registry of the memory elements this compute element
//!   reaches: name, transport, size and a [`RemoteAllocator`] each, whose state
//!   ([`AllocationState`]) serializes, so the next element goes on allocating where
//!   this one stopped. Names are unique; filled by hand or from a
//!   [`scad_core::Action`].
//! - [`BufferPool`]: page frames in one registered buffer in front of one or more
//!   transports; pinning, dirty tracking, CLOCK or LRU eviction with write-back,
//!   sequential read-ahead, batched fetch through the vectored transport call (the
//!   transports of one request in parallel), and counters ([`PoolStats`]).
//! - [`RemoteStore`]: a pool and the elements it caches, where arrays are placed.
//! - [`RemoteArray`]: an `ndarray`-shaped array of any [`bytemuck::Pod`] type, with
//!   serializable metadata ([`ArrayMeta`]), zero-copy slicing and concatenation along
//!   axis 0, materialization into `ndarray::Array`, chunked iteration with read-ahead,
//!   write-back of row ranges, parallel chunk-wise map and reduce (rayon), and
//!   striping over several memory elements ([`Placement`]).
//!
//! ## Quick start
//! ```
//! use std::sync::Arc;
//! use ndarray::Array2;
//! use scad_core::server::{MemoryServer, ServerConfig};
//! use scad_core::transport::{TcpOptions, TcpTransport};
//! use scad_remote_array::{
//!     BufferPool, EvictionPolicy, MemoryElements, Placement, RemoteArray, RemoteStore,
//! };
//!
//! // Two memory elements (embedded servers here; real ones work the same).
//! let servers = [
//!     MemoryServer::start("127.0.0.1:0", 8 << 20, ServerConfig::default())?,
//!     MemoryServer::start("127.0.0.1:0", 8 << 20, ServerConfig::default())?,
//! ];
//! let elements = Arc::new(MemoryElements::new());
//! for (i, s) in servers.iter().enumerate() {
//!     let t = TcpTransport::connect(&s.local_addr().to_string(), TcpOptions::default())?;
//!     elements.add(&format!("mem{i}"), Arc::new(t))?;
//! }
//! let pool = BufferPool::builder(1 << 20) // 1 MiB of cache over those elements
//!     .page_size(16 * 1024)
//!     .policy(EvictionPolicy::Clock)
//!     .read_ahead(4)
//!     .elements(elements)
//!     .build()?;
//! let store = Arc::new(RemoteStore::new(Arc::new(pool)));
//!
//! // Write a matrix out, striped over both elements in 64 KiB units.
//! let m = Array2::from_shape_fn((1000, 100), |(i, j)| (i * 100 + j) as f64);
//! let placement = Placement::striped(["mem0", "mem1"]).stripe_bytes(64 * 1024);
//! let remote = RemoteArray::from_array_with(&store, &m, &placement)?;
//!
//! // Hand the metadata on as JSON; open it again (in another element, typically).
//! let json = remote.meta().to_json()?;
//! let meta = scad_remote_array::ArrayMeta::from_json(&json)?;
//! let again = RemoteArray::<f64, ndarray::Ix2>::from_meta(&store, &meta)?;
//!
//! // Slice without moving data, then sum chunk by chunk through the 1 MiB pool.
//! let part = again.slice(100..900)?;
//! let mut total = 0.0;
//! for chunk in part.chunks(128)? {
//!     let (_rows, data) = chunk?;
//!     total += data.sum();
//! }
//! assert_eq!(total, m.slice(ndarray::s![100..900, ..]).sum());
//! println!("{}", store.pool());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Cargo features
//! - `rdma`: passes `scad-core`'s `rdma` feature through, so stores can name
//!   `rdma_uverbs` memory elements.
//!
//! ## Threads
//! [`MemoryElements`], [`BufferPool`], [`RemoteStore`] and [`RemoteArray`] are
//! `Send + Sync`. The registry guards its list with a read-write lock and each
//! allocator with its own mutex; neither is held during I/O. The pool
//! guards its page table with one mutex that is never held during I/O or copying;
//! frames are pinned while a request copies to or from them, so eviction never takes
//! a page in use; a page being loaded by one thread is waited for, not fetched twice,
//! by the others. Reads of one large request overlap fetch and copy on a helper
//! thread; the transports of one round are fetched in parallel on scoped threads. See
//! the [`pool`] module for the full story, including why threads cannot deadlock.
//! Concurrent writes to overlapping rows are not ordered with each other; writes to
//! disjoint rows never interfere.
//!
//! ## Errors
//! One error type, [`Error`]; transport failures keep the [`scad_core::Error`] as
//! their source and name the memory element, address and size involved. On every
//! error path the pool releases the pages it pinned.

pub mod alloc;
pub mod array;
pub mod elements;
pub mod error;
pub mod pool;
pub mod store;

pub use alloc::{AllocationState, RemoteAllocator};
pub use array::{ArrayMeta, Chunks, Extent, RemoteArray};
pub use elements::{ElementId, MemoryElements};
pub use error::{Error, Result};
pub use pool::{
    BufferPool, BufferPoolBuilder, EvictionPolicy, PoolRange, PoolRead, PoolStats, PoolUsage,
    PoolWrite,
};
pub use store::{Placement, RemoteStore};

#[cfg(test)]
mod tests {
    fn send_sync<T: Send + Sync>() {}

    #[test]
    fn shared_types_are_send_and_sync() {
        send_sync::<crate::MemoryElements>();
        send_sync::<crate::BufferPool>();
        send_sync::<crate::RemoteStore>();
        send_sync::<crate::RemoteArray<f32, ndarray::Ix2>>();
        send_sync::<crate::RemoteArray<u8, ndarray::IxDyn>>();
        send_sync::<crate::Error>();
    }
}
