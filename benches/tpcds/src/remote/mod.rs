//! The memory elements TPC-DS runs over, and what crosses process boundaries.
//!
//! A [`Cluster`] is a set of memory elements (embedded memory servers, running
//! `memory_server` processes, shared memory, local memory or Redis) as one store.
//! Base tables are loaded into it once ([`load_tables`]), apart from query time, and
//! handed on as [`Handoff`]s: frame metadata, whose seal proves that the memory still
//! holds the frame, so a process that opens a handoff (a query stage, see
//! [`crate::stages`]) detects memory that was freed or overwritten.
//!
//! ```no_run
//! use scad_tpcds::data::{generate, GenerateOptions};
//! use scad_tpcds::remote::{load_tables, Cluster, TransportKind};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let set = generate(&GenerateOptions::new(0.01))?;
//! let cluster = Cluster::embedded(TransportKind::Tcp, 2, 256 << 20)?;
//! let tables = load_tables(&cluster, &set, None)?;
//! println!("{} tables, largest {} bytes", tables.tables.len(), tables.largest_bytes());
//! # Ok(())
//! # }
//! ```

mod baseline;
mod cluster;
mod error;
mod handoff;
mod tables;

pub use baseline::{duckdb_timings, DuckDbTiming};
pub use cluster::{Cluster, TransportKind};
pub use error::RemoteError;
pub use handoff::{Handoff, HANDOFF_VERSION};
pub use scad_core::redis_server::RedisServer;
pub use tables::{load_tables, TableHandoffs};
