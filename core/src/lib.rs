//! # scad-core — libd for Scad in Rust
//!
//! The transport layer through which compute elements reach the memory of the memory
//! elements they co-run with.
//!
//! - [`durl`]: the original configuration strings (`NAME;IMPL;KEY,VALUE;...`).
//! - [`Transport`]: byte-range and vectored reads and writes of a remote address
//!   space, with implementations [`transport::LocalTransport`] (in-process),
//!   [`transport::ShmTransport`] (POSIX shared memory) and [`transport::TcpTransport`]
//!   (client of a [`server::MemoryServer`]).
//! - [`memory`]: the served [`MemoryRegion`] and the local [`RegisteredBuffer`].
//! - [`server::MemoryServer`]: serves one address space to many TCP clients.
//! - [`Action`]: the named transports of one element, configurable late.
//! - [`protocol`]: the wire format shared by server and client.
//! - [`fmt`]: byte counts as reports print them.
//!
//! ## Quick start
//! ```
//! use scad_core::server::{MemoryServer, ServerConfig};
//! use scad_core::transport::{TcpOptions, TcpTransport};
//! use scad_core::Transport;
//!
//! let server = MemoryServer::start("127.0.0.1:0", 1 << 20, ServerConfig::default())?;
//! let client = TcpTransport::connect(&server.local_addr().to_string(), TcpOptions::default())?;
//! client.write(4096, b"remote memory")?;
//! let mut back = [0u8; 13];
//! client.read(4096, &mut back)?;
//! assert_eq!(&back, b"remote memory");
//! # Ok::<(), scad_core::Error>(())
//! ```
//!
//! ## Cargo features
//! - `rdma`: one-sided RDMA through libibverbs (`rdma_uverbs` durls).
//! - `redis`: the `redis` transport, a memory element kept in a Redis server.
//! - `redis-server`: `redis_server`, a `redis-server` child for tests and benchmarks.
//!
//! ## Threads
//! Every transport, the server and [`Action`] are `Send + Sync`. Concurrent calls on
//! disjoint remote ranges never interfere; calls on overlapping ranges from different
//! threads are not ordered with each other, as with one-sided RDMA.

pub mod action;
#[cfg(feature = "cli")]
pub mod cli;
pub mod durl;
pub mod error;
pub mod fmt;
mod listener;
pub mod memory;
pub mod protocol;
#[cfg(feature = "rdma")]
pub mod rdma;
/// Without the `rdma` feature only the pure connection-information codec of
/// `rdma_uverbs` is built, so tools and fuzzers can check it without libibverbs.
#[cfg(not(feature = "rdma"))]
pub mod rdma {
    pub mod exchange;
}
#[cfg(feature = "redis-server")]
pub mod redis_server;
pub mod server;
pub mod transport;

pub use action::{Action, Endpoint, TransportState};
pub use durl::{Durl, TransportConfig, TransportKind};
pub use error::{Error, Result};
pub use memory::{MemoryRegion, RegisteredBuffer};
pub use transport::{ReadOp, Transport, TransportStats, WriteOp};
