//! The memory server's wire protocol: pure encoding and decoding, no I/O.
//!
//! Every frame is a little-endian `u32` length followed by that many bytes of body.
//!
//! Requests: `id: u64, op: u8, payload`:
//! - `HELLO` (1): `magic: u32, version: u16, token_len: u16, token` — must come first.
//! - `READ` (2): `count: u32, count × (addr: u64, len: u32)`.
//! - `WRITE` (3): `count: u32, count × (addr: u64, len: u32), data` (the lengths' sum).
//! - `SIZE` (4): nothing.
//!
//! Responses: `id: u64, status: u8, payload_len: u32`, zero padding to a 64-byte head,
//! the payload, and zero padding to a multiple of 64 bytes. Keeping payloads at 64-byte
//! stream offsets lets the kernel copy them into (page-aligned) destination buffers at
//! full speed; a 13-byte head made large reads up to 2× slower on this hardware.
//! Status 0 is success with the op's result
//! (`HELLO`: `version: u16, max_frame: u32, size: u64`; `READ`: the bytes in segment
//! order; `WRITE`: nothing; `SIZE`: `size: u64`), status 1 is an error:
//! `code: u16, addr: u64, len: u64, size: u64, msg_len: u16, msg` (see [`ErrorCode`]).
//! A server that closes a connection on its own (a limit, a timeout) first sends an
//! error with request id 0.
//!
//! A client may send many requests before reading responses; the server answers in
//! order. Frames are capped at a maximum length the server announces in its hello
//! reply; clients split larger transfers into several frames.

use std::fmt;

/// `"SCAD"`, the first bytes of a hello payload.
pub const MAGIC: u32 = u32::from_be_bytes(*b"SCAD");
/// Protocol version spoken by this crate.
pub const VERSION: u16 = 1;
/// Bytes of the length prefix.
pub const LEN_BYTES: usize = 4;
/// Bytes of a request body before its payload (`id`, `op`).
pub const REQUEST_HEADER: usize = 9;
/// Bytes of a response body before its payload (`id`, `status`, `payload_len`, padding).
pub const RESPONSE_HEADER: usize = RESPONSE_HEAD_BYTES - LEN_BYTES;
/// Responses are padded to multiples of this many bytes.
pub const RESPONSE_ALIGN: usize = 64;
/// Bytes of one `(addr, len)` segment descriptor.
pub const SEGMENT_BYTES: usize = 12;
/// Default maximum frame body length: 16 MiB of data plus room for headers.
pub const DEFAULT_MAX_FRAME: u32 = 16 * 1024 * 1024 + 64 * 1024;
/// Smallest maximum frame a server may announce.
pub const MIN_MAX_FRAME: u32 = 4096;
/// Longest token a server accepts in a hello (so a hello always fits the smallest frame).
pub const MAX_TOKEN: usize = 1024;

/// Request operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    /// Authenticate and learn the server's limits.
    Hello = 1,
    /// Scatter-gather read.
    Read = 2,
    /// Scatter-gather write.
    Write = 3,
    /// Size of the address space.
    Size = 4,
}

/// Error classes a server reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
#[non_exhaustive]
pub enum ErrorCode {
    /// The token is missing or wrong, or a request came before `HELLO`.
    Unauthenticated = 1,
    /// A segment lies outside the address space.
    OutOfRange = 2,
    /// The frame does not follow the protocol.
    Malformed = 3,
    /// The frame, or the response it asks for, exceeds the maximum frame length.
    FrameTooLarge = 4,
    /// The client speaks another protocol version.
    VersionMismatch = 5,
    /// The server is at a resource limit (connections, or bytes in flight); try later.
    Busy = 6,
    /// Anything else.
    Internal = 7,
    /// A frame did not arrive whole within the server's request timeout (or a new
    /// connection sent no hello in time); the server closed the connection.
    RequestTimeout = 8,
    /// The connection was idle longer than the server's idle timeout and was closed.
    /// Sent with request id 0 just before closing.
    IdleTimeout = 9,
    /// Protected mode: the server has no token and serves only clients on its own host
    /// (loopback). Sent with request id 0 just before closing; the message says how the
    /// server can be opened to the network.
    Protected = 10,
}

impl ErrorCode {
    fn from_u16(v: u16) -> Option<Self> {
        Some(match v {
            1 => ErrorCode::Unauthenticated,
            2 => ErrorCode::OutOfRange,
            3 => ErrorCode::Malformed,
            4 => ErrorCode::FrameTooLarge,
            5 => ErrorCode::VersionMismatch,
            6 => ErrorCode::Busy,
            7 => ErrorCode::Internal,
            8 => ErrorCode::RequestTimeout,
            9 => ErrorCode::IdleTimeout,
            10 => ErrorCode::Protected,
            _ => return None,
        })
    }
}

/// Why bytes could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolError {
    /// The body is shorter than its fixed fields.
    #[error("frame truncated: {what} needs {needed} bytes, {got} present")]
    Truncated {
        /// Which field.
        what: &'static str,
        /// Bytes needed.
        needed: usize,
        /// Bytes present.
        got: usize,
    },
    /// Unknown operation byte.
    #[error("unknown operation {0}")]
    UnknownOp(u8),
    /// Unknown status byte.
    #[error("unknown response status {0}")]
    UnknownStatus(u8),
    /// Hello with the wrong magic number.
    #[error("bad magic {0:#x}: not a Scad client")]
    BadMagic(u32),
    /// Lengths inside the frame disagree with its size.
    #[error("inconsistent frame: {0}")]
    Inconsistent(String),
    /// The length prefix exceeds the maximum frame.
    #[error("frame of {len} bytes exceeds the maximum of {max}")]
    TooLarge {
        /// Announced length.
        len: u64,
        /// Maximum allowed.
        max: u32,
    },
    /// A response answers another request than expected.
    #[error("response id {got} does not match request id {expected}")]
    IdMismatch {
        /// Expected id.
        expected: u64,
        /// Received id.
        got: u64,
    },
}

/// One `(addr, len)` piece of a scatter-gather request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Remote address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
}

/// A decoded request body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request<'a> {
    /// Authenticate.
    Hello {
        /// Protocol version of the client.
        version: u16,
        /// Token bytes (empty when none).
        token: &'a [u8],
    },
    /// Read the segments.
    Read {
        /// Segments in order.
        segments: Vec<Segment>,
    },
    /// Write `data` to the segments, in order.
    Write {
        /// Segments in order.
        segments: Vec<Segment>,
        /// Their bytes, concatenated.
        data: &'a [u8],
    },
    /// Ask for the size.
    Size,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], ProtocolError> {
        let rest = &self.buf[self.pos..];
        if rest.len() < n {
            return Err(ProtocolError::Truncated {
                what,
                needed: n,
                got: rest.len(),
            });
        }
        self.pos += n;
        Ok(&rest[..n])
    }
    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], ProtocolError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }
    fn u8(&mut self, what: &'static str) -> Result<u8, ProtocolError> {
        Ok(self.array::<1>(what)?[0])
    }
    fn u16(&mut self, what: &'static str) -> Result<u16, ProtocolError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, ProtocolError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &'static str) -> Result<u64, ProtocolError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
    fn rest(&mut self) -> &'a [u8] {
        let rest = &self.buf[self.pos..];
        self.pos = self.buf.len();
        rest
    }
    fn segments(&mut self) -> Result<Vec<Segment>, ProtocolError> {
        let count = self.u32("segment count")? as usize;
        let remaining = self.buf.len() - self.pos;
        if count > remaining / SEGMENT_BYTES {
            return Err(ProtocolError::Inconsistent(format!(
                "{count} segments announced but only {remaining} bytes follow"
            )));
        }
        (0..count)
            .map(|_| {
                Ok(Segment {
                    addr: self.u64("segment address")?,
                    len: self.u32("segment length")?,
                })
            })
            .collect()
    }
}

/// Checks a length prefix against the maximum frame length.
///
/// # Errors
/// [`ProtocolError::TooLarge`], or [`ProtocolError::Truncated`] when the length cannot
/// even hold a header.
pub fn check_frame_len(len: u32, max: u32, header: usize) -> Result<usize, ProtocolError> {
    if len > max {
        return Err(ProtocolError::TooLarge {
            len: len.into(),
            max,
        });
    }
    if (len as usize) < header {
        return Err(ProtocolError::Truncated {
            what: "frame header",
            needed: header,
            got: len as usize,
        });
    }
    Ok(len as usize)
}

/// Reads the request id of a body, when it has one, so an error reply can name it.
pub fn peek_id(body: &[u8]) -> u64 {
    body.get(..8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes)
        .unwrap_or(0)
}

/// Decodes a request body (the bytes after the length prefix).
///
/// # Errors
/// A [`ProtocolError`] describing the first inconsistency.
pub fn decode_request(body: &[u8]) -> Result<(u64, Request<'_>), ProtocolError> {
    let mut c = Cursor { buf: body, pos: 0 };
    let id = c.u64("request id")?;
    let op = c.u8("operation")?;
    let request = match op {
        1 => {
            let magic = c.u32("magic")?;
            if magic != MAGIC {
                return Err(ProtocolError::BadMagic(magic));
            }
            let version = c.u16("version")?;
            let len = c.u16("token length")? as usize;
            let token = c.take(len, "token")?;
            Request::Hello { version, token }
        }
        2 => Request::Read {
            segments: c.segments()?,
        },
        3 => {
            let segments = c.segments()?;
            let total: u64 = segments.iter().map(|s| u64::from(s.len)).sum();
            let data = c.rest();
            if total != data.len() as u64 {
                return Err(ProtocolError::Inconsistent(format!(
                    "segments add up to {total} bytes but {} bytes of data follow",
                    data.len()
                )));
            }
            return Ok((id, Request::Write { segments, data }));
        }
        4 => Request::Size,
        other => return Err(ProtocolError::UnknownOp(other)),
    };
    if c.pos != body.len() {
        return Err(ProtocolError::Inconsistent(format!(
            "{} trailing bytes after the request",
            body.len() - c.pos
        )));
    }
    Ok((id, request))
}

fn put_len(out: &mut [u8], start: usize) {
    let len = (out.len() - start - LEN_BYTES) as u32;
    out[start..start + LEN_BYTES].copy_from_slice(&len.to_le_bytes());
}

fn put_segments(out: &mut Vec<u8>, segments: &[Segment]) {
    out.extend_from_slice(&(segments.len() as u32).to_le_bytes());
    for s in segments {
        out.extend_from_slice(&s.addr.to_le_bytes());
        out.extend_from_slice(&s.len.to_le_bytes());
    }
}

/// Appends a hello request.
pub fn encode_hello(out: &mut Vec<u8>, id: u64, token: &[u8]) {
    let start = out.len();
    out.extend_from_slice(&[0; LEN_BYTES]);
    out.extend_from_slice(&id.to_le_bytes());
    out.push(Op::Hello as u8);
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.extend_from_slice(&VERSION.to_le_bytes());
    let token = &token[..token.len().min(u16::MAX as usize)];
    out.extend_from_slice(&(token.len() as u16).to_le_bytes());
    out.extend_from_slice(token);
    put_len(out, start);
}

/// Appends a read request.
pub fn encode_read(out: &mut Vec<u8>, id: u64, segments: &[Segment]) {
    let start = out.len();
    out.extend_from_slice(&[0; LEN_BYTES]);
    out.extend_from_slice(&id.to_le_bytes());
    out.push(Op::Read as u8);
    put_segments(out, segments);
    put_len(out, start);
}

/// Appends the head of a write request; the caller sends the segments' data right
/// after it (the length prefix already counts it).
pub fn encode_write_head(out: &mut Vec<u8>, id: u64, segments: &[Segment]) {
    let start = out.len();
    out.extend_from_slice(&[0; LEN_BYTES]);
    out.extend_from_slice(&id.to_le_bytes());
    out.push(Op::Write as u8);
    put_segments(out, segments);
    let data: u64 = segments.iter().map(|s| u64::from(s.len)).sum();
    let len = (out.len() - start - LEN_BYTES) as u64 + data;
    let len = u32::try_from(len).unwrap_or(u32::MAX);
    out[start..start + LEN_BYTES].copy_from_slice(&len.to_le_bytes());
}

/// Appends a size request.
pub fn encode_size(out: &mut Vec<u8>, id: u64) {
    let start = out.len();
    out.extend_from_slice(&[0; LEN_BYTES]);
    out.extend_from_slice(&id.to_le_bytes());
    out.push(Op::Size as u8);
    put_len(out, start);
}

/// The fixed start of a response: what follows the length prefix up to the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseHead {
    /// Request id answered.
    pub id: u64,
    /// True for success.
    pub ok: bool,
    /// Payload bytes that follow the head.
    pub payload_len: usize,
    /// Zero bytes after the payload, to skip.
    pub padding: usize,
}

/// Bytes of a response head: length prefix, header and padding.
pub const RESPONSE_HEAD_BYTES: usize = 64;

/// Padding after a payload of `payload_len` bytes.
pub fn response_padding(payload_len: usize) -> usize {
    (RESPONSE_ALIGN - payload_len % RESPONSE_ALIGN) % RESPONSE_ALIGN
}

/// Decodes the first [`RESPONSE_HEAD_BYTES`] bytes of a response.
///
/// # Errors
/// [`ProtocolError`] for a length too small or too large, or an unknown status.
pub fn decode_response_head(
    bytes: &[u8; RESPONSE_HEAD_BYTES],
    max_frame: u32,
) -> Result<ResponseHead, ProtocolError> {
    let len = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    let len = check_frame_len(len, max_frame, RESPONSE_HEADER)?;
    let id = peek_id(&bytes[LEN_BYTES..]);
    let ok = match bytes[12] {
        0 => true,
        1 => false,
        s => return Err(ProtocolError::UnknownStatus(s)),
    };
    let payload_len = u32::from_le_bytes([bytes[13], bytes[14], bytes[15], bytes[16]]) as usize;
    let padding = response_padding(payload_len);
    if len != RESPONSE_HEADER + payload_len + padding {
        return Err(ProtocolError::Inconsistent(format!(
            "response of {len} bytes cannot carry a payload of {payload_len}"
        )));
    }
    Ok(ResponseHead {
        id,
        ok,
        payload_len,
        padding,
    })
}

fn encode_head(out: &mut Vec<u8>, id: u64, ok: bool, payload_len: usize) {
    let len = (RESPONSE_HEADER + payload_len + response_padding(payload_len)) as u32;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&id.to_le_bytes());
    out.push(u8::from(!ok));
    out.extend_from_slice(&(payload_len as u32).to_le_bytes());
    out.resize(out.len() + RESPONSE_HEAD_BYTES - 17, 0);
}

/// Appends the head of a successful response whose payload of `payload_len` bytes the
/// caller sends next, followed by [`response_padding`] zero bytes.
pub fn encode_ok_head(out: &mut Vec<u8>, id: u64, payload_len: usize) {
    encode_head(out, id, true, payload_len);
}

/// Appends the zero padding that ends a response with a payload of `payload_len` bytes.
pub fn pad_response(out: &mut Vec<u8>, payload_len: usize) {
    out.resize(out.len() + response_padding(payload_len), 0);
}

/// The server's answer to a hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HelloReply {
    /// Server protocol version.
    pub version: u16,
    /// Largest frame body the server accepts or sends.
    pub max_frame: u32,
    /// Size of the address space.
    pub size: u64,
}

impl HelloReply {
    /// Appends the whole response frame.
    pub fn encode(&self, out: &mut Vec<u8>, id: u64) {
        encode_ok_head(out, id, 14);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&self.max_frame.to_le_bytes());
        out.extend_from_slice(&self.size.to_le_bytes());
        pad_response(out, 14);
    }

    /// Decodes the payload.
    ///
    /// # Errors
    /// [`ProtocolError`] if it is malformed or announces a uselessly small frame.
    pub fn decode(payload: &[u8]) -> Result<Self, ProtocolError> {
        let mut c = Cursor {
            buf: payload,
            pos: 0,
        };
        let reply = HelloReply {
            version: c.u16("version")?,
            max_frame: c.u32("max frame")?,
            size: c.u64("size")?,
        };
        if reply.max_frame < MIN_MAX_FRAME {
            return Err(ProtocolError::Inconsistent(format!(
                "server maximum frame {} is below {MIN_MAX_FRAME}",
                reply.max_frame
            )));
        }
        Ok(reply)
    }
}

/// Appends the whole frame of a size response.
pub fn encode_size_reply(out: &mut Vec<u8>, id: u64, size: u64) {
    encode_ok_head(out, id, 8);
    out.extend_from_slice(&size.to_le_bytes());
    pad_response(out, 8);
}

/// Decodes a size response payload.
///
/// # Errors
/// [`ProtocolError::Truncated`] / [`ProtocolError::Inconsistent`].
pub fn decode_size_reply(payload: &[u8]) -> Result<u64, ProtocolError> {
    let arr: [u8; 8] = payload.try_into().map_err(|_| {
        ProtocolError::Inconsistent(format!("size reply of {} bytes", payload.len()))
    })?;
    Ok(u64::from_le_bytes(arr))
}

/// An error the server reports to a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorReply {
    /// Error class.
    pub code: ErrorCode,
    /// For out-of-range errors: the offending address (else 0).
    pub addr: u64,
    /// For out-of-range errors: the offending length (else 0).
    pub len: u64,
    /// For out-of-range errors: the address space size (else 0).
    pub size: u64,
    /// Human-readable message.
    pub message: String,
}

impl ErrorReply {
    /// An error with only a message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ErrorReply {
            code,
            addr: 0,
            len: 0,
            size: 0,
            message: message.into(),
        }
    }

    /// Appends the whole error frame.
    pub fn encode(&self, out: &mut Vec<u8>, id: u64) {
        let msg = &self.message.as_bytes()[..self.message.len().min(1024)];
        let payload = 2 + 8 + 8 + 8 + 2 + msg.len();
        encode_head(out, id, false, payload);
        out.extend_from_slice(&(self.code as u16).to_le_bytes());
        out.extend_from_slice(&self.addr.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&(msg.len() as u16).to_le_bytes());
        out.extend_from_slice(msg);
        pad_response(out, payload);
    }

    /// Decodes an error payload.
    ///
    /// # Errors
    /// [`ProtocolError`] if malformed.
    pub fn decode(payload: &[u8]) -> Result<Self, ProtocolError> {
        let mut c = Cursor {
            buf: payload,
            pos: 0,
        };
        let code = c.u16("error code")?;
        let code = ErrorCode::from_u16(code).unwrap_or(ErrorCode::Internal);
        let addr = c.u64("error address")?;
        let len = c.u64("error length")?;
        let size = c.u64("error size")?;
        let msg_len = c.u16("message length")? as usize;
        let msg = c.take(msg_len, "message")?;
        Ok(ErrorReply {
            code,
            addr,
            len,
            size,
            message: String::from_utf8_lossy(msg).into_owned(),
        })
    }
}

impl fmt::Display for ErrorReply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.code, self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(frame: &[u8]) -> &[u8] {
        let len = u32::from_le_bytes(frame[..4].try_into().unwrap()) as usize;
        assert_eq!(len, frame.len() - 4, "length prefix counts the body");
        &frame[4..]
    }

    #[test]
    fn requests_round_trip() {
        let mut out = Vec::new();
        encode_hello(&mut out, 7, b"secret");
        assert_eq!(
            decode_request(body(&out)).unwrap(),
            (
                7,
                Request::Hello {
                    version: VERSION,
                    token: b"secret"
                }
            )
        );
        let segs = [
            Segment { addr: 1, len: 2 },
            Segment {
                addr: u64::MAX,
                len: 0,
            },
        ];
        out.clear();
        encode_read(&mut out, 8, &segs);
        assert_eq!(
            decode_request(body(&out)).unwrap(),
            (
                8,
                Request::Read {
                    segments: segs.to_vec()
                }
            )
        );
        out.clear();
        encode_write_head(&mut out, 9, &segs);
        out.extend_from_slice(&[5, 6]);
        assert_eq!(
            decode_request(body(&out)).unwrap(),
            (
                9,
                Request::Write {
                    segments: segs.to_vec(),
                    data: &[5, 6]
                }
            )
        );
        out.clear();
        encode_size(&mut out, 10);
        assert_eq!(decode_request(body(&out)).unwrap(), (10, Request::Size));
    }

    #[test]
    fn malformed_requests_are_rejected() {
        assert!(matches!(
            decode_request(&[1, 2, 3]),
            Err(ProtocolError::Truncated { .. })
        ));
        let mut b = vec![0u8; 8];
        b.push(99);
        assert_eq!(decode_request(&b), Err(ProtocolError::UnknownOp(99)));
        // A read announcing a billion segments with none present.
        let mut b = vec![0u8; 8];
        b.push(2);
        b.extend_from_slice(&1_000_000_000u32.to_le_bytes());
        assert!(matches!(
            decode_request(&b),
            Err(ProtocolError::Inconsistent(_))
        ));
        // A write whose data is one byte short.
        let mut out = Vec::new();
        encode_write_head(&mut out, 1, &[Segment { addr: 0, len: 4 }]);
        out.extend_from_slice(&[1, 2, 3]);
        assert!(matches!(
            decode_request(&out[4..]),
            Err(ProtocolError::Inconsistent(_))
        ));
        // Hello with the wrong magic.
        let mut out = Vec::new();
        encode_hello(&mut out, 1, b"");
        out[4 + 9] ^= 0xff;
        assert!(matches!(
            decode_request(&out[4..]),
            Err(ProtocolError::BadMagic(_))
        ));
        // Trailing garbage after a size request.
        let mut out = Vec::new();
        encode_size(&mut out, 1);
        out.push(0);
        assert!(matches!(
            decode_request(&out[4..]),
            Err(ProtocolError::Inconsistent(_))
        ));
    }

    #[test]
    fn responses_round_trip() {
        let mut out = Vec::new();
        let hello = HelloReply {
            version: 1,
            max_frame: 1 << 20,
            size: 42,
        };
        hello.encode(&mut out, 3);
        assert_eq!(out.len() % RESPONSE_ALIGN, 0);
        let head = decode_response_head(out[..64].try_into().unwrap(), 1 << 20).unwrap();
        assert_eq!(
            head,
            ResponseHead {
                id: 3,
                ok: true,
                payload_len: 14,
                padding: 50
            }
        );
        assert_eq!(HelloReply::decode(&out[64..78]).unwrap(), hello);
        out.clear();
        let err = ErrorReply {
            code: ErrorCode::OutOfRange,
            addr: 5,
            len: 6,
            size: 7,
            message: "no".into(),
        };
        err.encode(&mut out, 4);
        assert_eq!(out.len() % RESPONSE_ALIGN, 0);
        let head = decode_response_head(out[..64].try_into().unwrap(), 1 << 20).unwrap();
        assert!(!head.ok);
        assert_eq!(head.payload_len + head.padding, out.len() - 64);
        assert_eq!(
            ErrorReply::decode(&out[64..64 + head.payload_len]).unwrap(),
            err
        );
        out.clear();
        encode_size_reply(&mut out, 5, 99);
        assert_eq!(out.len(), 128);
        assert_eq!(decode_size_reply(&out[64..72]).unwrap(), 99);
        out.clear();
        encode_ok_head(&mut out, 6, 128);
        assert_eq!(
            decode_response_head(out[..64].try_into().unwrap(), 1 << 20)
                .unwrap()
                .padding,
            0
        );
    }

    #[test]
    fn oversized_and_tiny_lengths_are_rejected() {
        assert!(matches!(
            check_frame_len(100, 99, 9),
            Err(ProtocolError::TooLarge { .. })
        ));
        assert!(matches!(
            check_frame_len(3, 99, 9),
            Err(ProtocolError::Truncated { .. })
        ));
        let mut head = [0u8; RESPONSE_HEAD_BYTES];
        head[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_response_head(&head, DEFAULT_MAX_FRAME).is_err());
        head[..4].copy_from_slice(&60u32.to_le_bytes());
        head[12] = 7;
        assert_eq!(
            decode_response_head(&head, DEFAULT_MAX_FRAME),
            Err(ProtocolError::UnknownStatus(7))
        );
        head[12] = 0;
        head[13] = 1; // claims a payload byte the length has no room for
        assert!(matches!(
            decode_response_head(&head, DEFAULT_MAX_FRAME),
            Err(ProtocolError::Inconsistent(_))
        ));
    }

    proptest::proptest! {
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
            let _ = decode_request(&bytes);
            let _ = ErrorReply::decode(&bytes);
            let _ = HelloReply::decode(&bytes);
            if bytes.len() >= RESPONSE_HEAD_BYTES {
                let _ = decode_response_head(bytes[..RESPONSE_HEAD_BYTES].try_into().unwrap(), DEFAULT_MAX_FRAME);
            }
        }
    }
}
