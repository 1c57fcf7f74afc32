//! TPC-DS over memory elements: the 99 official queries, from their SQL text, run by
//! the query engine ([`scad_remote_frame::QuerySession`]) over tables loaded into
//! memory elements, each answer checked against DuckDB's.
//!
//! # Quick start
//!
//! ```no_run
//! use scad_tpcds::data::{generate, GenerateOptions};
//! use scad_tpcds::engine::{run_query, session};
//! use scad_remote_frame::Budget;
//! use scad_tpcds::remote::{load_tables, Cluster, TransportKind};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Runs benches/tpcds/gen_data.py in the repository's .venv (cached after the first run).
//! let set = generate(&GenerateOptions::new(0.01))?;
//! let cluster = Cluster::embedded(TransportKind::Tcp, 2, 256 << 20)?;
//! let tables = load_tables(&cluster, &set, None)?; // load time, apart from query time
//! let env = cluster.env().with_budget(Budget::bytes(tables.largest_bytes() / 4)?);
//! let session = session(&env, &tables.open(&cluster)?)?;
//! let run = run_query(&session, &set, "q1")?;
//! assert!(run.equal(), "{:?}", run.error);
//! # Ok(())
//! # }
//! ```
//!
//! * [`data`]: generated data sets (`benches/tpcds/gen_data.py`: DuckDB's dsdgen from PyPI),
//!   their Parquet tables, query texts and DuckDB's reference answers;
//! * [`remote`]: the memory elements ([`remote::Cluster`]) and sealed handoffs of
//!   frames between processes;
//! * [`engine`]: running a query and checking its answer;
//! * [`stages`]: a query's stages, each run as its own process;
//! * [`compare`]: comparing answers by value;
//! * [`regress`]: a main-job run compared with a committed baseline, query by query.

pub mod compare;
pub mod data;
pub mod engine;
pub mod error;
pub mod regress;
pub mod remote;
pub mod report;
pub mod stages;

pub use error::TpcdsError;
