//! The error type of `scad-core`.

use std::io;
use std::time::Duration;

/// Result alias used throughout `scad-core`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the transport core.
///
/// Variants carry the context a caller needs to act (which transport, which address,
/// how many bytes) and, where there is one, the underlying cause as `#[source]`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A durl configuration string could not be parsed.
    #[error("malformed durl {durl:?}: {reason} (at {part:?})")]
    Durl {
        /// The whole string as given.
        durl: String,
        /// The offending part of it.
        part: String,
        /// What is wrong with that part.
        reason: String,
    },

    /// A remote access falls outside the memory element's address space.
    #[error("{op} of {len} bytes at remote address {addr:#x} is out of range: the remote address space has {size} bytes")]
    OutOfRange {
        /// `"read"` or `"write"`.
        op: &'static str,
        /// First remote address of the access.
        addr: u64,
        /// Length of the access in bytes.
        len: u64,
        /// Size of the remote address space.
        size: u64,
    },

    /// A local buffer range falls outside the registered buffer.
    #[error("local range of {len} bytes at offset {offset} exceeds the registered buffer of {size} bytes")]
    BufferRange {
        /// Offset into the registered buffer.
        offset: usize,
        /// Length of the range.
        len: usize,
        /// Size of the registered buffer.
        size: usize,
    },

    /// A buffer operation was attempted before `reg` registered a buffer.
    #[error("transport {name:?} has no registered buffer: call reg(size) first")]
    NotRegistered {
        /// Transport name.
        name: String,
    },

    /// Something did not become ready, or did not answer, in time.
    #[error("{what} timed out after {timeout:?}")]
    Timeout {
        /// What was being waited for.
        what: String,
        /// How long was waited.
        timeout: Duration,
    },

    /// The operation is not available in this build or for this transport.
    #[error("unsupported: {0}")]
    Unsupported(String),

    /// An argument is invalid (a zero size, overlapping ranges, a size that does not fit).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// A transport name is not known to the action.
    #[error("unknown transport {name:?}{hint}")]
    UnknownTransport {
        /// The name asked for.
        name: String,
        /// A hint listing the known names.
        hint: String,
    },

    /// The transport was terminated while an operation waited on it or ran.
    #[error("transport {name:?} was terminated")]
    Terminated {
        /// Transport name.
        name: String,
    },

    /// Connecting to a memory server failed.
    #[error("cannot connect to memory server {peer}: {source}")]
    Connect {
        /// Server address.
        peer: String,
        /// Cause.
        #[source]
        source: io::Error,
    },

    /// An I/O error on an established connection or socket.
    #[error("I/O error with {peer} during {op}: {source}")]
    Io {
        /// Peer or resource.
        peer: String,
        /// What was being done.
        op: &'static str,
        /// Cause.
        #[source]
        source: io::Error,
    },

    /// The peer sent bytes that do not follow the wire protocol.
    #[error("protocol error with {peer}: {source}")]
    Protocol {
        /// Peer address.
        peer: String,
        /// What was wrong.
        #[source]
        source: crate::protocol::ProtocolError,
    },

    /// The memory server refused the shared-secret token.
    #[error("memory server {peer} refused authentication: {message}")]
    Auth {
        /// Server address.
        peer: String,
        /// The server's message.
        message: String,
    },

    /// The memory server is at a resource limit (its connection limit, or its budget
    /// of bytes in flight) and refused the request or connection; retrying later can
    /// succeed.
    #[error("memory server {peer} is busy: {message}")]
    Busy {
        /// Server address.
        peer: String,
        /// The server's message, naming the limit.
        message: String,
    },

    /// The memory server answered a request with an error.
    #[error("memory server {peer} refused the request ({code:?}): {message}")]
    Remote {
        /// Server address.
        peer: String,
        /// Error class reported by the server.
        code: crate::protocol::ErrorCode,
        /// The server's message.
        message: String,
    },

    /// A Redis server (the `redis` transport) refused or failed a command.
    #[error("redis {peer} failed during {op}: {reason}")]
    Redis {
        /// Server address.
        peer: String,
        /// What was being done (`"read"`, `"write"`, `"connect"`).
        op: &'static str,
        /// What Redis or the connection reported.
        reason: String,
    },

    /// A `redis-server` child (feature `redis-server`) could not be started or did not
    /// come up.
    #[error("redis-server {binary}: {reason}")]
    RedisServer {
        /// The binary that was (or would have been) started.
        binary: String,
        /// What failed.
        reason: String,
        /// Cause, where the OS gave one.
        #[source]
        source: Option<io::Error>,
    },

    /// Shared memory could not be created, opened or mapped.
    #[error("shared memory segment {name:?}: {reason}")]
    Shm {
        /// Segment name.
        name: String,
        /// What failed.
        reason: String,
        /// Cause, where the OS gave one.
        #[source]
        source: Option<io::Error>,
    },

    /// A memory region could not be allocated.
    #[error("cannot allocate {size} bytes: {reason}")]
    Alloc {
        /// Bytes asked for.
        size: u64,
        /// Why it failed.
        reason: String,
    },

    /// Starting or running a memory server failed.
    #[error("memory server on {addr}: {reason}")]
    Server {
        /// Listening address.
        addr: String,
        /// What failed.
        reason: String,
        /// Cause.
        #[source]
        source: Option<io::Error>,
    },

    /// An RDMA verbs call failed (opening a device, creating a queue pair, registering
    /// memory, posting work, exchanging connection information).
    #[error("RDMA {op} failed: {reason}")]
    Rdma {
        /// What was being done (`"open device"`, `"register memory"`, `"post read"`).
        op: &'static str,
        /// What went wrong, naming the device, port or peer involved.
        reason: String,
        /// The OS error the verbs library reported, where it gave one.
        #[source]
        source: Option<io::Error>,
    },

    /// An RDMA work request completed with an error status.
    #[error(
        "RDMA {op} completed with status {status:?} (code {code}, vendor error {vendor_err:#x})"
    )]
    RdmaCompletion {
        /// `"read"` or `"write"`.
        op: &'static str,
        /// The status as `ibv_wc_status_str` names it (`"remote access error"`).
        status: String,
        /// The numeric `ibv_wc_status`.
        code: u32,
        /// The device's vendor-specific error code.
        vendor_err: u32,
    },

    /// No RDMA device (or not the one asked for) is present on this host.
    #[error("{}", no_device_message(requested.as_deref(), available))]
    NoDevice {
        /// The device name asked for; `None` when any device would do.
        requested: Option<String>,
        /// Names of the devices that are present.
        available: Vec<String>,
    },
}

fn no_device_message(requested: Option<&str>, available: &[String]) -> String {
    let present = if available.is_empty() {
        "no RDMA device is present on this host".to_owned()
    } else {
        format!("devices present: {}", available.join(", "))
    };
    match requested {
        Some(name) => format!("RDMA device {name:?} not found ({present})"),
        None => format!("no RDMA device found ({present})"),
    }
}

impl Error {
    pub(crate) fn durl(durl: &str, part: &str, reason: impl Into<String>) -> Self {
        Error::Durl {
            durl: durl.to_owned(),
            part: part.to_owned(),
            reason: reason.into(),
        }
    }

    pub(crate) fn io(peer: impl Into<String>, op: &'static str, source: io::Error) -> Self {
        Error::Io {
            peer: peer.into(),
            op,
            source,
        }
    }

    /// True when the error is a remote range check failure, locally or on the server.
    pub fn is_out_of_range(&self) -> bool {
        matches!(
            self,
            Error::OutOfRange { .. }
                | Error::Remote {
                    code: crate::protocol::ErrorCode::OutOfRange,
                    ..
                }
        )
    }
}
