//! Queries 1, 16, 94 and 95 as pipelines over memory elements.
//!
//! Every step is an element: it opens its parents' frames from memory elements by
//! their metadata JSON (a [`Handoff`], sealed so that freed or overwritten memory is
//! detected), runs remote-frame kernels within a local memory budget, and writes its
//! result as a [`scad_remote_frame::RemoteFrame`] to memory elements, handing on a new
//! handoff. Base tables are loaded into memory elements first ([`load_tables`]), apart
//! from query time.
//!
//! ```no_run
//! use scad_tpcds::data::{generate, GenerateOptions};
//! use scad_tpcds::remote::{load_tables, tables_for, Cluster, RemotePipeline, TransportKind};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let set = generate(&GenerateOptions::new(0.01))?;
//! let cluster = Cluster::embedded(TransportKind::Tcp, 2, 256 << 20)?;
//! let tables = load_tables(&cluster, &set, &tables_for(&["q1".to_string()])?)?;
//! let q1 = RemotePipeline::for_query("q1")?;
//! let run = q1.run(&cluster, &tables, tables.largest_bytes() / 4)?;
//! scad_tpcds::compare::compare(&run.result, &set.reference("q1")?, q1.row_order())?;
//! # Ok(())
//! # }
//! ```
//!
//! The same steps run one per process with the `tpcds-step` binary (see its docs).

mod baseline;
mod cluster;
mod error;
mod handoff;
mod run;
mod steps;

pub use baseline::{duckdb_timings, DuckDbTiming, RedisServer};
pub use cluster::{Cluster, TransportKind};
pub use error::RemoteError;
pub use handoff::{project, rename, Handoff, Seal, HANDOFF_VERSION, SEAL_BYTES};
pub use run::{
    fmt_bytes, fmt_secs, load_tables, parse_budget, tables_for, RemotePipeline, RemoteRun,
    RemoteStepReport, TableHandoffs,
};
pub use steps::{exists_steps, q1_steps, q95_steps, steps_for, RemoteInputs, RemoteStepFn};
