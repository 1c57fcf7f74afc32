//! The crate's error type.

use std::path::PathBuf;

/// Everything that can go wrong loading TPC-DS data, running a query or comparing an
/// answer with DuckDB's reference answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TpcdsError {
    /// The generated data set is not where it was expected.
    #[error("TPC-DS data not found at {path}: {hint}")]
    DataMissing {
        /// File or directory that is missing.
        path: PathBuf,
        /// What to do about it.
        hint: String,
    },
    /// The Python generator could not be run or failed.
    #[error("TPC-DS generator failed: {0}")]
    Generator(String),
    /// Reading a file failed.
    #[error("reading {path}: {source}")]
    Io {
        /// File being read.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The data set's manifest is malformed.
    #[error("bad manifest {path}: {message}")]
    Manifest {
        /// Manifest file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// Reading a Parquet file (a table or a reference answer) failed.
    #[error("reading {path}: {source}")]
    Parquet {
        /// File being read.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: parquet::errors::ParquetError,
    },
    /// An Arrow operation failed (gathering a table's batches, a cast).
    #[error("{context}: {source}")]
    Arrow {
        /// What was being done.
        context: String,
        /// Underlying error.
        #[source]
        source: datafusion::arrow::error::ArrowError,
    },
    /// A result differs from the reference answer.
    #[error("result differs from the reference: {0}")]
    Mismatch(String),
    /// A RemoteFrame or query-engine operation failed.
    #[error("{what}: {source}")]
    Frame {
        /// What was being done.
        what: String,
        /// Underlying error.
        #[source]
        source: Box<scad_remote_frame::Error>,
    },
    /// A command-line value or argument is malformed.
    #[error("{0}")]
    Invalid(String),
    /// An unknown query name was given.
    #[error("unknown query {0:?}: TPC-DS has queries 1 to 99 (q1 .. q99)")]
    UnknownQuery(String),
}
