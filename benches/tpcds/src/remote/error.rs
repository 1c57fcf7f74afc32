//! The error type of runs over memory elements.

use crate::error::TpcdsError;

/// Everything that can go wrong running queries over memory elements: the data set,
/// a query, a transport, or a handoff (metadata JSON) that is malformed or no
/// longer describes what is in memory.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteError {
    /// Loading data, reading references, comparing results.
    #[error(transparent)]
    Tpcds(#[from] TpcdsError),
    /// The query engine (or opening a frame) failed.
    #[error("{context}: {source}")]
    Frame {
        /// Which stage and input, or which table.
        context: String,
        /// Underlying error.
        #[source]
        source: scad_remote_frame::Error,
    },
    /// A transport or memory server failed.
    #[error("{context}: {source}")]
    Transport {
        /// What was being done.
        context: String,
        /// Underlying error.
        #[source]
        source: scad_core::Error,
    },
    /// Allocating or freeing remote memory failed.
    #[error("{context}: {source}")]
    Alloc {
        /// What was being done.
        context: String,
        /// Underlying error.
        #[source]
        source: scad_remote_array::Error,
    },
    /// A handoff's JSON could not be parsed.
    #[error("{context}: malformed handoff JSON: {source}")]
    BadJson {
        /// Which handoff.
        context: String,
        /// Underlying error.
        #[source]
        source: serde_json::Error,
    },
    /// A handoff names memory that no longer holds its frame (freed or overwritten).
    #[error("{context}: stale frame of {producer}: {reason}")]
    Stale {
        /// Which stage input.
        context: String,
        /// Step or table that wrote the frame.
        producer: String,
        /// What did not match.
        reason: String,
    },
    /// A malformed argument, a missing input, an unknown stage.
    #[error("{0}")]
    Invalid(String),
}

/// Attaches context to remote-frame errors.
pub(crate) trait FrameContext<T> {
    /// Wraps the error with `context`.
    fn frame_ctx(self, context: impl FnOnce() -> String) -> Result<T, RemoteError>;
}

impl<T> FrameContext<T> for Result<T, scad_remote_frame::Error> {
    fn frame_ctx(self, context: impl FnOnce() -> String) -> Result<T, RemoteError> {
        self.map_err(|source| RemoteError::Frame {
            context: context(),
            source,
        })
    }
}
