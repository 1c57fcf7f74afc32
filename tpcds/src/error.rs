//! The crate's error type.

use std::path::PathBuf;

/// Everything that can go wrong loading TPC-DS data, running a pipeline or comparing a
/// result with DuckDB's reference answer.
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
    /// A Polars operation failed inside a step (or while loading a table).
    #[error("{context}: {source}")]
    Polars {
        /// Which step or table.
        context: String,
        /// Underlying Polars error.
        #[source]
        source: polars::error::PolarsError,
    },
    /// A step asked for an input that its pipeline does not provide.
    #[error("step {step}: no input named {input}")]
    MissingInput {
        /// Step name.
        step: String,
        /// Input name.
        input: String,
    },
    /// A pipeline is malformed (unknown parent, duplicate step, no steps).
    #[error("pipeline {pipeline}: {message}")]
    BadPipeline {
        /// Pipeline name.
        pipeline: String,
        /// What is wrong.
        message: String,
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
    /// An unknown query name was given.
    #[error("unknown query {0:?} (known: q1, q16, q94, q95 and their _wide variants)")]
    UnknownQuery(String),
}

/// Attaches a context string to Polars errors.
pub(crate) trait PolarsContext<T> {
    /// Wraps the error with `context`.
    fn context(self, context: impl Into<String>) -> Result<T, TpcdsError>;
}

impl<T> PolarsContext<T> for Result<T, polars::error::PolarsError> {
    fn context(self, context: impl Into<String>) -> Result<T, TpcdsError> {
        self.map_err(|source| TpcdsError::Polars {
            context: context.into(),
            source,
        })
    }
}
