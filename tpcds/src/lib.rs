//! TPC-DS queries 1, 16, 94 and 95 as multi-step pipelines, checked against DuckDB.
//!
//! # Quick start
//!
//! ```no_run
//! use scad_tpcds::{compare, data, queries};
//!
//! # fn main() -> Result<(), scad_tpcds::TpcdsError> {
//! // Runs tpcds/gen_data.py in the repository's .venv (cached after the first run).
//! let set = data::generate(&data::GenerateOptions::new(0.01))?;
//! let pipeline = queries::pipeline_for("q1")?;
//! let tables = set.load(&pipeline.table_columns())?; // load time, apart from query time
//! let run = pipeline.run(&tables)?;
//! compare::compare(&run.result, &set.reference("q1")?, pipeline.row_order)?;
//! # Ok(())
//! # }
//! ```
//!
//! A [`pipeline::Pipeline`] is a list of [`pipeline::Step`]s, each a function from its
//! named inputs (base tables projected to the columns it reads, or earlier steps'
//! results) to one `DataFrame`, the way an element of a DAG reads its parents' frames
//! from memory elements and writes its own. Each step lists the remote-frame kernels
//! (filter, project, hash join inner/left/semi/anti, group-by, sort, distinct, limit)
//! its logic maps to, so the same pipelines run on `RemoteFrame` by replacing the
//! Polars calls kernel by kernel; here they run on Polars in memory, which is also the
//! "Polars in memory" baseline of the TPC-DS benchmark.
//!
//! The data and the reference answers come from `tpcds/gen_data.py` (DuckDB with the
//! TPC-DS extension from PyPI); see the README's TPC-DS section.
//!
//! # Thread safety
//! Pipelines, steps and loaded tables are `Send + Sync`; a run uses Polars' own
//! thread pool.

pub mod compare;
pub mod data;
pub mod error;
pub mod pipeline;
pub mod queries;
pub mod remote;

pub use error::TpcdsError;
