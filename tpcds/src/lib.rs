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
//! # Porting a step to remote-frame
//!
//! Each step's [`pipeline::Step::inputs`] says which parents (or which base table and
//! columns) it reads, and [`pipeline::Step::kernels`] which kernels it applies in
//! order. What the kernels must support for these queries:
//! * filter: `=` on strings and integers, `BETWEEN` on a `Date` (as `Int32` days),
//!   `IS NOT NULL`, `<>` and `>` between two columns (`Decimal` cast to `Float64`);
//! * project: rename, cast (`Decimal` → `Float64`, unscaled `Int128` → `Float64`,
//!   count → `Int64`, sum → `Decimal(38, s)`), `/`, `*`, and `CASE WHEN count = 0 THEN NULL`;
//! * hash join: inner, semi and anti on single `Int64` keys, NULL keys never matching;
//!   `ws_wh` in q95 is an inner self-join of `web_sales` (the largest intermediate:
//!   several rows per order squared);
//! * group-by: sum and non-NULL count of `Decimal(7,2)` / `Decimal(38,2)`, min and max of
//!   `Int64`, count distinct without NULLs, also as a global aggregate (no keys) that
//!   yields one row on empty input;
//! * sort with NULLs last, limit, distinct.
//!
//! # Thread safety
//! Pipelines, steps and loaded tables are `Send + Sync`; a run uses Polars' own
//! thread pool.

pub mod compare;
pub mod data;
pub mod engine;
pub mod error;
pub mod pipeline;
pub mod queries;
pub mod remote;

pub use error::TpcdsError;
