//! Replies that the connection loop and the command handler both send: the
//! connection's end ([`ConnError`]), refusals that close it, error replies that keep
//! it open, and the lingering close that lets a refusal reach the client.

use std::io::{self, BufWriter, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use crate::error::Error;
use crate::protocol::{ErrorCode, ErrorReply};

use super::Shared;

/// Why a connection ended early.
#[derive(Debug, thiserror::Error)]
pub(super) enum ConnError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("{0}")]
    Refused(String),
    #[error("{0}")]
    Region(#[from] Error),
}

/// Why a request of `bytes` more bytes was refused as busy.
pub(super) fn busy_message(shared: &Shared, bytes: u64) -> String {
    format!(
        "{bytes} more bytes in flight would exceed the server's limit of {} (waited {:?}); try again",
        shared.config.max_in_flight, shared.config.in_flight_wait
    )
}

/// Sends an error and ends the connection (the stream cannot be trusted to resync).
/// Always returns `Err`, for the caller to pass up.
pub(super) fn refuse(
    shared: &Shared,
    writer: &mut BufWriter<TcpStream>,
    id: u64,
    code: ErrorCode,
    message: String,
) -> std::result::Result<(), ConnError> {
    shared.counters.errors.fetch_add(1, Ordering::Relaxed);
    if code == ErrorCode::IdleTimeout {
        info!(id, ?code, %message, "closing connection");
    } else {
        warn!(id, ?code, %message, "closing connection");
    }
    let mut out = Vec::new();
    ErrorReply::new(code, message.clone()).encode(&mut out, id);
    // A client that stopped reading must not hold the worker here either.
    let _ = writer
        .get_ref()
        .set_write_timeout(Some(Duration::from_secs(1)));
    let _ = writer.write_all(&out).and_then(|()| writer.flush());
    linger(writer.get_ref(), LINGER_TIME);
    Err(ConnError::Refused(message))
}

/// Bytes [`linger`] discards at most.
const LINGER_BYTES: usize = 1 << 20;
/// Time a connection thread lingers at most after a refusal.
pub(super) const LINGER_TIME: Duration = Duration::from_millis(500);

/// Closes our side gently: stop sending, then discard what the client still sends
/// (the rest of a refused frame, pipelined requests) for up to `wait` (with no wait,
/// only what has already arrived). Closing a socket with unread input makes the kernel
/// reset the connection, and a reset can destroy the error reply before the client
/// has read it.
pub(super) fn linger(stream: &TcpStream, wait: Duration) {
    let _ = stream.shutdown(Shutdown::Write);
    let deadline = Instant::now() + wait;
    if wait.is_zero() && stream.set_nonblocking(true).is_err() {
        return;
    }
    let mut sink = [0u8; 16 * 1024];
    let mut drained = 0;
    while drained < LINGER_BYTES {
        if !wait.is_zero() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
                break;
            }
        }
        match (&*stream).read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => drained += n,
        }
    }
}

/// Counts and encodes an error reply to one request; the connection stays open.
pub(super) fn reply_error(shared: &Shared, out: &mut Vec<u8>, id: u64, err: ErrorReply) {
    shared.counters.errors.fetch_add(1, Ordering::Relaxed);
    debug!(id, error = %err, "request refused");
    err.encode(out, id);
}
