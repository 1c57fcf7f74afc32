//! Command handling: what a decoded request does to the region, and its reply.

use std::io::{self, BufWriter, IoSlice, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering;

use tracing::{debug, warn};

use crate::error::Error;
use crate::protocol::{self, ErrorCode, ErrorReply, HelloReply, Request, Segment, RESPONSE_HEADER};

use super::auth::{authorize, Window};
use super::reply::{busy_message, refuse, reply_error, ConnError};
use super::Shared;

/// Below this many bytes a read reply is copied into one buffer and sent with one call;
/// larger replies go to the socket straight from the region's (page-aligned) memory.
const SMALL_REPLY: usize = 16 * 1024;

/// Answers one decoded request: the reply goes to `out`, or, for a large read, straight
/// to `writer`. A hello that is accepted sets `conn_window`, what the connection may
/// reach from then on.
pub(super) fn handle(
    shared: &Shared,
    conn_window: &mut Option<Window>,
    writer: &mut BufWriter<TcpStream>,
    out: &mut Vec<u8>,
    id: u64,
    request: Request<'_>,
) -> Result<(), ConnError> {
    let config = &shared.config;
    let region = &shared.region;
    let max_frame = config.max_frame;
    match request {
        Request::Hello { version, token } => {
            if version != protocol::VERSION {
                return refuse(
                    shared,
                    writer,
                    id,
                    ErrorCode::VersionMismatch,
                    format!(
                        "server speaks version {}, client {version}",
                        protocol::VERSION
                    ),
                );
            }
            let Some((window, name)) = authorize(shared, token) else {
                return refuse(
                    shared,
                    writer,
                    id,
                    ErrorCode::Unauthenticated,
                    "wrong or missing token".into(),
                );
            };
            if let Some(name) = name {
                debug!(region = name, "client authenticated for a region");
            }
            *conn_window = Some(window);
            HelloReply {
                version: protocol::VERSION,
                max_frame,
                size: window.len,
            }
            .encode(out, id);
        }
        _ if conn_window.is_none() => {
            return refuse(
                shared,
                writer,
                id,
                ErrorCode::Unauthenticated,
                "the first request must be a hello".into(),
            );
        }
        Request::Size => {
            let size = conn_window.map_or(0, |w| w.len);
            protocol::encode_size_reply(out, id, size);
        }
        Request::Read { mut segments } => {
            let total: u64 = segments.iter().map(|s| u64::from(s.len)).sum();
            if total + protocol::RESPONSE_ALIGN as u64
                > u64::from(max_frame) - RESPONSE_HEADER as u64
            {
                reply_error(
                    shared,
                    out,
                    id,
                    ErrorReply::new(
                        ErrorCode::FrameTooLarge,
                        format!("a read of {total} bytes does not fit one frame of {max_frame}"),
                    ),
                );
            } else if let Some(err) = translate(*conn_window, "read", &mut segments) {
                reply_error(shared, out, id, err);
            } else if let Some(_reply_grant) = shared.budget.take(total, config.in_flight_wait) {
                protocol::encode_ok_head(out, id, total as usize);
                if (total as usize) <= SMALL_REPLY {
                    for s in &segments {
                        let start = out.len();
                        out.resize(start + s.len as usize, 0);
                        region.read(s.addr, &mut out[start..])?;
                    }
                    protocol::pad_response(out, total as usize);
                } else {
                    // Head, the segments straight from the region, padding: one
                    // vectored write (a reply smaller than the writer's buffer is
                    // still gathered there).
                    let mut padding = Vec::new();
                    protocol::pad_response(&mut padding, total as usize);
                    let ranges: Vec<(u64, u64)> =
                        segments.iter().map(|s| (s.addr, s.len.into())).collect();
                    region.read_ranges(&ranges, |pieces| {
                        let mut slices = Vec::with_capacity(pieces.len() + 2);
                        slices.push(IoSlice::new(out));
                        slices.extend(pieces.iter().map(|p| IoSlice::new(p)));
                        slices.push(IoSlice::new(&padding));
                        write_all_vectored(writer, &mut slices).map_err(ConnError::Io)
                    })?;
                    // The head went out with the segments.
                    out.clear();
                }
                shared
                    .counters
                    .bytes_read
                    .fetch_add(total, Ordering::Relaxed);
            } else {
                shared.counters.busy.fetch_add(1, Ordering::Relaxed);
                let message = busy_message(shared, total);
                warn!(id, %message, "read refused: in-flight budget exhausted");
                reply_error(shared, out, id, ErrorReply::new(ErrorCode::Busy, message));
            }
        }
        Request::Write { mut segments, data } => {
            if let Some(err) = translate(*conn_window, "write", &mut segments) {
                reply_error(shared, out, id, err);
            } else {
                let mut pos = 0;
                for s in &segments {
                    let end = pos + s.len as usize;
                    region.write(s.addr, &data[pos..end])?;
                    pos = end;
                }
                shared
                    .counters
                    .bytes_written
                    .fetch_add(data.len() as u64, Ordering::Relaxed);
                protocol::encode_ok_head(out, id, 0);
            }
        }
    }
    writer.write_all(out)?;
    Ok(())
}

/// Checks every segment against the connection's window and turns its address into
/// one in the served region; the first segment outside the window is the error.
fn translate(
    window: Option<Window>,
    op: &'static str,
    segments: &mut [Segment],
) -> Option<ErrorReply> {
    let window = window?;
    for s in segments.iter_mut() {
        let len = u64::from(s.len);
        match s.addr.checked_add(len) {
            Some(end) if end <= window.len => s.addr += window.base,
            _ => {
                let message = Error::OutOfRange {
                    op,
                    addr: s.addr,
                    len,
                    size: window.len,
                }
                .to_string();
                return Some(ErrorReply {
                    code: ErrorCode::OutOfRange,
                    addr: s.addr,
                    len,
                    size: window.len,
                    message,
                });
            }
        }
    }
    None
}

/// Writes all of `slices` to `writer`, as many at once as it takes.
fn write_all_vectored(writer: &mut impl Write, mut slices: &mut [IoSlice<'_>]) -> io::Result<()> {
    // Empty slices first, so that a write of 0 bytes means the peer is gone.
    IoSlice::advance_slices(&mut slices, 0);
    while !slices.is_empty() {
        match writer.write_vectored(slices) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut slices, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
