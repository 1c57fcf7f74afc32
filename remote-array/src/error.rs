//! The error type of `scad-remote-array`.

use scad_core::Error as CoreError;

/// Result alias used throughout `scad-remote-array`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the buffer pool, the remote allocator and
/// [`crate::RemoteArray`].
///
/// Variants carry the context a caller needs to act on them (which memory element,
/// which address, how many bytes or rows) and, where there is one, the underlying
/// [`scad_core::Error`] as `#[source]`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A [`crate::BufferPoolBuilder`] setting is invalid.
    #[error("invalid buffer pool configuration: {0}")]
    Config(String),

    /// The pool's frame memory could not be allocated.
    #[error("cannot allocate {bytes} bytes of buffer pool frames: {source}")]
    PoolAlloc {
        /// Bytes asked for.
        bytes: usize,
        /// Cause.
        #[source]
        source: Box<CoreError>,
    },

    /// A frame of the pool's registered buffer could not be reached (a bug in the pool:
    /// its frame arithmetic is checked by the buffer rather than trusted).
    #[error("buffer pool frame access failed: {source}")]
    Frame {
        /// Cause.
        #[source]
        source: Box<CoreError>,
    },

    /// A transport call failed while the pool fetched pages, wrote them back, or asked
    /// a memory element for its size, or an action's transport never became usable.
    #[error("{op} of {len} bytes at {addr:#x} on memory element {element:?} failed: {source}")]
    Transport {
        /// `"fetch"`, `"write-back"`, `"size"` or `"configure"` (waiting for an action's
        /// transport).
        op: &'static str,
        /// Name of the memory element (transport) involved.
        element: String,
        /// First remote address of the failed call.
        addr: u64,
        /// Bytes the failed call moved.
        len: u64,
        /// Cause.
        #[source]
        source: Box<CoreError>,
    },

    /// A transport call did not finish in time (the memory server is gone or stalled).
    #[error("{op} on memory element {element:?} timed out: {source}")]
    Timeout {
        /// `"fetch"`, `"write-back"`, `"size"` or `"configure"`.
        op: &'static str,
        /// Name of the memory element (transport) involved.
        element: String,
        /// Cause, a [`scad_core::Error::Timeout`].
        #[source]
        source: Box<CoreError>,
    },

    /// An access falls outside a memory element's address space.
    #[error(
        "access of {len} bytes at {addr:#x} is outside memory element {element:?} of {size} bytes"
    )]
    RemoteRange {
        /// Name of the memory element.
        element: String,
        /// First remote address of the access.
        addr: u64,
        /// Length of the access in bytes.
        len: u64,
        /// Size of the element's address space.
        size: u64,
    },

    /// A row range falls outside an array.
    #[error("{what} of rows {start}..{end} is out of range for an array of {rows} rows")]
    OutOfRange {
        /// The operation (`"slice"`, `"materialize"`, `"write"`).
        what: &'static str,
        /// First row asked for.
        start: usize,
        /// One past the last row asked for.
        end: usize,
        /// Rows the array has.
        rows: usize,
    },

    /// A memory element has no room for an allocation.
    #[error("memory element {element:?} cannot fit an allocation of {asked} bytes: {left} bytes left, the largest free range has {largest} bytes")]
    OutOfRemoteMemory {
        /// Name of the memory element.
        element: String,
        /// Bytes asked for (after alignment).
        asked: u64,
        /// Bytes still free in the element, in all free ranges together.
        left: u64,
        /// The largest contiguous free range.
        largest: u64,
    },

    /// A range given back to an allocator was never handed out, or was freed twice.
    #[error("cannot free {len} bytes at {addr:#x} on memory element {element:?}: {reason}")]
    BadFree {
        /// Name of the memory element.
        element: String,
        /// Start of the range.
        addr: u64,
        /// Length of the range.
        len: u64,
        /// What is wrong with it.
        reason: String,
    },

    /// A memory element name is not registered.
    #[error("unknown memory element {name:?} (known: {known})")]
    UnknownElement {
        /// The name asked for.
        name: String,
        /// The registered names, comma separated.
        known: String,
    },

    /// A memory element name is registered twice.
    #[error("memory element {name:?} is already registered")]
    DuplicateElement {
        /// The name.
        name: String,
    },

    /// Metadata describes elements of another type than the array asked for.
    #[error("element type mismatch: the metadata holds {found} ({found_size} bytes), the array is of {expected} ({expected_size} bytes)")]
    TypeMismatch {
        /// The Rust type asked for.
        expected: String,
        /// Its size.
        expected_size: usize,
        /// The type named in the metadata.
        found: String,
        /// The size named in the metadata.
        found_size: usize,
    },

    /// Shapes disagree (with the data, with each other, or with the dimension type).
    #[error("shape mismatch: {0}")]
    Shape(String),

    /// Array metadata is inconsistent (beyond type and shape).
    #[error("invalid array metadata: {0}")]
    Meta(String),

    /// Array metadata could not be parsed or printed as JSON.
    #[error("array metadata JSON: {0}")]
    MetaJson(#[source] serde_json::Error),

    /// An argument is invalid (an empty list to concatenate, a zero chunk size).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl Error {
    /// Wraps a transport error with the context of the pool call that met it. A core
    /// timeout becomes [`Error::Timeout`], so callers can match on it.
    pub(crate) fn transport(
        op: &'static str,
        element: &str,
        addr: u64,
        len: u64,
        source: CoreError,
    ) -> Self {
        match source {
            CoreError::Timeout { .. } => Error::Timeout {
                op,
                element: element.to_owned(),
                source: Box::new(source),
            },
            source => Error::Transport {
                op,
                element: element.to_owned(),
                addr,
                len,
                source: Box::new(source),
            },
        }
    }

    /// True for [`Error::Timeout`].
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Timeout { .. })
    }

    /// True for errors of the transport underneath (including timeouts): the memory
    /// element could not be reached or refused the request.
    pub fn is_transport(&self) -> bool {
        matches!(self, Error::Transport { .. } | Error::Timeout { .. })
    }

    /// The transport error underneath, if this error wraps one.
    pub fn core_error(&self) -> Option<&CoreError> {
        match self {
            Error::Transport { source, .. }
            | Error::Timeout { source, .. }
            | Error::PoolAlloc { source, .. }
            | Error::Frame { source } => Some(source),
            _ => None,
        }
    }
}
