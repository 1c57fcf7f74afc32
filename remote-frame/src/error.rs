//! The one error type of `scad-remote-frame`.

use crate::budget::Budget;

/// Result alias used throughout `scad-remote-frame`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while storing frames or running kernels.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The store, allocator or pool of `scad-remote-array` failed.
    #[error(transparent)]
    Array(Box<scad_remote_array::Error>),

    /// A transport call moving frame data failed.
    #[error("{op} of {len} bytes at {addr:#x} on memory element {element:?} failed: {source}")]
    Transport {
        /// `"read"` or `"write"`.
        op: &'static str,
        /// Memory element name.
        element: String,
        /// First remote address of the failed call.
        addr: u64,
        /// Bytes the call moved.
        len: u64,
        /// Cause.
        #[source]
        source: Box<scad_core::Error>,
    },

    /// Polars failed while evaluating an expression or a per-batch operation.
    #[cfg(feature = "polars")]
    #[error("polars: {0}")]
    Polars(Box<polars::prelude::PolarsError>),

    /// Arrow (arrow-rs) failed while converting record batches.
    #[error("arrow: {0}")]
    Arrow(Box<arrow_schema::ArrowError>),

    /// Frame metadata is malformed JSON.
    #[error("frame metadata is not valid JSON: {0}")]
    MetaJson(#[source] serde_json::Error),

    /// Frame metadata is inconsistent (corrupted, or not written by this crate).
    #[error("invalid frame metadata: {0}")]
    Meta(String),

    /// The frame was freed through this handle or a clone of it; the handle can no
    /// longer be used (nor freed again).
    #[error("frame {frame} was freed; its handle can no longer be used")]
    Freed {
        /// The frame: its seal's nonce, rows, chunks and seal location.
        frame: String,
    },

    /// Memory no longer holds the frame the metadata describes: it was freed (its
    /// seal zeroed), its memory reused, or the metadata does not match its seal.
    #[error("stale frame {frame}: {reason}")]
    Stale {
        /// The frame, as the metadata names it.
        frame: String,
        /// What did not match.
        reason: String,
    },

    /// A column name is not in the frame.
    #[error("unknown column {name:?}; the frame has: {known}")]
    UnknownColumn {
        /// Name asked for.
        name: String,
        /// The frame's column names, comma separated.
        known: String,
    },

    /// A column's data type differs from the one expected.
    #[error("column {column:?} has type {found}, expected {expected}")]
    TypeMismatch {
        /// Column name.
        column: String,
        /// The type expected (the frame's schema, or the other side's).
        expected: String,
        /// The type found.
        found: String,
    },

    /// A data type this crate cannot store.
    #[error("unsupported data type {dtype} of column {column:?} (supported: booleans, integers, floats, decimals, dates, strings, nulls)")]
    UnsupportedType {
        /// Column name.
        column: String,
        /// The Polars or Arrow type.
        dtype: String,
    },

    /// One key value holds more rows than the budget allows and cannot be split by
    /// hashing (a skewed key).
    #[error("skewed key in {kernel}: partition {partition} (level {level}) holds {bytes} bytes for key {key}, which repartitioning cannot split, and the budget is {budget} bytes")]
    Skew {
        /// The kernel (`"left join"`, `"group-by"`, ...), or the query operator: a
        /// hash join by DataFusion's join type, whose left input is the one built
        /// (`"hash join (Right)"`: a SQL left join built on its right table), or
        /// `"group-by"`.
        kernel: &'static str,
        /// Partition path, e.g. `"3/17"`.
        partition: String,
        /// Recursion level.
        level: u32,
        /// The most frequent key value of the partition, printed.
        key: String,
        /// Bytes of the key's rows in the partition.
        bytes: u64,
        /// The budget.
        budget: u64,
    },

    /// A task of a distributed query failed (see
    /// [`crate::QuerySession::run_distributed`]).
    #[error("stage {stage} task {task} failed: {message}")]
    TaskFailed {
        /// Its stage.
        stage: usize,
        /// Its number in the stage.
        task: usize,
        /// Its error, as its worker reported it.
        message: String,
    },

    /// A bad argument (empty key list, mismatched key counts, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// A query failed to plan or run: unknown table or column, a type error, a
    /// failing operator.
    #[error("query: {0}")]
    Query(Box<datafusion::common::DataFusionError>),

    /// SQL the engine cannot run; the message names the construct. Refused before
    /// anything runs.
    #[error("unsupported in a query: {0}")]
    Unsupported(String),

    /// Work that cannot be split further needs more local memory than the budget: a
    /// kernel's step (with its estimate of the bytes it needs), or a query operator
    /// that cannot spill (DataFusion's account of the failed reservation, naming the
    /// operators holding the most).
    #[error("{}", out_of_budget(.what, *.need, *.budget))]
    OutOfBudget {
        /// What did not fit.
        what: String,
        /// Bytes needed, where known (a kernel's estimate).
        need: Option<u64>,
        /// The budget.
        budget: Budget,
    },

    /// A query names a table or a column that does not exist.
    #[error("query: unknown {kind} {name:?}; known: {known}")]
    UnknownName {
        /// Whether a table or a column is unknown.
        kind: NameKind,
        /// The name as the query gives it (qualified if it is).
        name: String,
        /// The names that do exist there, comma separated (`none` for none): the
        /// session's tables, or the columns in scope.
        known: String,
    },
}

/// What kind of name [`Error::UnknownName`] does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NameKind {
    /// A table.
    Table,
    /// A column.
    Column,
}

impl std::fmt::Display for NameKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NameKind::Table => "table",
            NameKind::Column => "column",
        })
    }
}

fn out_of_budget(what: &str, need: Option<u64>, budget: Budget) -> String {
    match need {
        Some(need) => {
            format!("{what} needs about {need} bytes of local memory but the budget is {budget}")
        }
        None => format!("out of the local memory budget of {budget}: {what}"),
    }
}

impl From<scad_remote_array::Error> for Error {
    fn from(e: scad_remote_array::Error) -> Self {
        Error::Array(Box::new(e))
    }
}

#[cfg(feature = "polars")]
impl From<polars::prelude::PolarsError> for Error {
    fn from(e: polars::prelude::PolarsError) -> Self {
        Error::Polars(Box::new(e))
    }
}

impl From<arrow_schema::ArrowError> for Error {
    fn from(e: arrow_schema::ArrowError) -> Self {
        Error::Arrow(Box::new(e))
    }
}
