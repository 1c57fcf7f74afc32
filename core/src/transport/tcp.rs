//! `rdma_tcp`: the client of a [`crate::server::MemoryServer`].
//!
//! A transport keeps a small pool of connections, so many threads can use it at once,
//! each on its own connection. A call splits its ranges into frames no larger than the
//! server's maximum, sends several frames before reading their replies (a window), and
//! reads reply bytes straight into the caller's buffers. A connection that saw any
//! error is dropped, and the next call connects again, so a restarted server is picked
//! up without help.

use std::io::{self, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::{check_ranges, ConnectionPool, Counters, ReadOp, Transport, TransportStats, WriteOp};
use crate::error::{Error, Result};
use crate::protocol::{
    self, ErrorCode, ErrorReply, HelloReply, ProtocolError, ResponseHead, Segment,
    RESPONSE_HEAD_BYTES, SEGMENT_BYTES,
};

/// Settings of a [`TcpTransport`].
#[derive(Debug, Clone)]
pub struct TcpOptions {
    /// Shared secret presented to the server.
    pub token: Option<String>,
    /// How long one send or receive may block before the call fails.
    pub timeout: Duration,
    /// How long connecting may take.
    pub connect_timeout: Duration,
    /// Largest data payload of one frame (further capped by the server's maximum).
    pub chunk: usize,
    /// Frames sent before the first reply is read.
    pub window: usize,
    /// Idle connections kept for reuse.
    pub pool_size: usize,
}

impl Default for TcpOptions {
    fn default() -> Self {
        TcpOptions {
            token: None,
            timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            chunk: 1 << 20,
            window: 8,
            pool_size: 16,
        }
    }
}

/// One authenticated connection.
#[derive(Debug)]
struct Connection {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    hello: HelloReply,
    out: Vec<u8>,
}

/// A client transport to a memory server over TCP.
#[derive(Debug)]
pub struct TcpTransport {
    addr: String,
    options: TcpOptions,
    pool: ConnectionPool<Connection>,
    size: AtomicU64,
    next_id: AtomicU64,
    counters: Counters,
}

/// Where one piece of a frame lands in (or comes from) the caller's buffers.
#[derive(Debug, Clone, Copy)]
struct Piece {
    op: usize,
    offset: usize,
    len: usize,
}

#[derive(Debug, Default)]
struct Frame {
    segments: Vec<Segment>,
    pieces: Vec<Piece>,
}

impl TcpTransport {
    /// A transport to the server at `addr` (`host:port`). Nothing is connected until
    /// the first call.
    pub fn new(addr: &str, options: TcpOptions) -> Self {
        TcpTransport {
            addr: addr.to_owned(),
            pool: ConnectionPool::new(options.pool_size),
            options,
            size: AtomicU64::new(u64::MAX),
            next_id: AtomicU64::new(1),
            counters: Counters::default(),
        }
    }

    /// Connects and authenticates at once, so a wrong address or token shows here.
    ///
    /// # Errors
    /// [`Error::Connect`], [`Error::Auth`], [`Error::Timeout`], [`Error::Protocol`].
    pub fn connect(addr: &str, options: TcpOptions) -> Result<Self> {
        let t = Self::new(addr, options);
        let conn = t.open_connection()?;
        t.pool.put(conn);
        Ok(t)
    }

    fn io_err(&self, op: &'static str, e: io::Error) -> Error {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Error::Timeout {
                what: format!("{op} with memory server {}", self.addr),
                timeout: self.options.timeout,
            },
            _ => Error::io(self.addr.clone(), op, e),
        }
    }

    fn proto_err(&self, source: ProtocolError) -> Error {
        Error::Protocol {
            peer: self.addr.clone(),
            source,
        }
    }

    fn remote_err(&self, op: &'static str, reply: ErrorReply) -> Error {
        match reply.code {
            ErrorCode::OutOfRange => Error::OutOfRange {
                op,
                addr: reply.addr,
                len: reply.len,
                size: reply.size,
            },
            ErrorCode::Unauthenticated | ErrorCode::Protected => Error::Auth {
                peer: self.addr.clone(),
                message: reply.message,
            },
            ErrorCode::Busy => Error::Busy {
                peer: self.addr.clone(),
                message: reply.message,
            },
            code => Error::Remote {
                peer: self.addr.clone(),
                code,
                message: reply.message,
            },
        }
    }

    fn open_connection(&self) -> Result<Connection> {
        let addrs: Vec<SocketAddr> = self
            .addr
            .to_socket_addrs()
            .map_err(|source| Error::Connect {
                peer: self.addr.clone(),
                source,
            })?
            .collect();
        let mut last = io::Error::new(io::ErrorKind::NotFound, "the address resolved to nothing");
        let mut stream = None;
        for a in &addrs {
            match TcpStream::connect_timeout(a, self.options.connect_timeout) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = e,
            }
        }
        let stream = stream.ok_or_else(|| Error::Connect {
            peer: self.addr.clone(),
            source: last,
        })?;
        let setup = |s: &TcpStream| -> io::Result<()> {
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(self.options.timeout))?;
            s.set_write_timeout(Some(self.options.timeout))
        };
        setup(&stream).map_err(|e| self.io_err("configure socket", e))?;
        let reader = stream
            .try_clone()
            .map_err(|e| self.io_err("clone socket", e))?;
        let mut conn = Connection {
            // Small, so large replies go from the socket straight into the caller's
            // buffer instead of through a copy from a misaligned staging buffer.
            reader: BufReader::with_capacity(8 * 1024 + 2 * protocol::RESPONSE_ALIGN, reader),
            writer: stream,
            hello: HelloReply {
                version: 0,
                max_frame: protocol::MIN_MAX_FRAME,
                size: 0,
            },
            out: Vec::new(),
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let token = self.options.token.as_deref().unwrap_or("").as_bytes();
        protocol::encode_hello(&mut conn.out, id, token);
        conn.writer
            .write_all(&conn.out)
            .map_err(|e| self.io_err("send hello", e))?;
        let payload = self.read_reply(&mut conn, id, "hello")?;
        let hello = HelloReply::decode(&payload).map_err(|e| self.proto_err(e))?;
        conn.hello = hello;
        self.size.store(hello.size, Ordering::Relaxed);
        Ok(conn)
    }

    /// Reads one whole small reply and returns its payload (errors become `Err`).
    fn read_reply(&self, conn: &mut Connection, id: u64, op: &'static str) -> Result<Vec<u8>> {
        let head = self.read_head(conn, id)?;
        let mut payload = vec![0u8; head.payload_len];
        conn.reader
            .read_exact(&mut payload)
            .map_err(|e| self.io_err("receive reply", e))?;
        self.skip_padding(conn, head.padding)?;
        if head.ok {
            Ok(payload)
        } else {
            let reply = ErrorReply::decode(&payload).map_err(|e| self.proto_err(e))?;
            Err(self.remote_err(op, reply))
        }
    }

    fn skip_padding(&self, conn: &mut Connection, padding: usize) -> Result<()> {
        let mut pad = [0u8; protocol::RESPONSE_ALIGN];
        conn.reader
            .read_exact(&mut pad[..padding])
            .map_err(|e| self.io_err("receive reply", e))
    }

    fn read_head(&self, conn: &mut Connection, id: u64) -> Result<ResponseHead> {
        let mut head = [0u8; RESPONSE_HEAD_BYTES];
        conn.reader.read_exact(&mut head).map_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                Error::io(
                    self.addr.clone(),
                    "receive reply",
                    io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "the memory server closed the connection",
                    ),
                )
            } else {
                self.io_err("receive reply", e)
            }
        })?;
        let max = conn.hello.max_frame.max(protocol::DEFAULT_MAX_FRAME);
        let head = protocol::decode_response_head(&head, max).map_err(|e| self.proto_err(e))?;
        if head.id != id && head.id != 0 {
            return Err(self.proto_err(ProtocolError::IdMismatch {
                expected: id,
                got: head.id,
            }));
        }
        Ok(head)
    }

    /// Splits `(len per op)` into frames whose data and segment descriptors together
    /// stay below the server's maximum frame (and whose data stays below `chunk`), so
    /// every request and every read reply fits one frame whatever the mix of sizes.
    fn plan(&self, hello: &HelloReply, ops: impl Iterator<Item = (u64, usize)>) -> Vec<Frame> {
        // Room for the request header, the segment count and the reply head.
        let cap = (hello.max_frame as usize)
            .saturating_sub(1024)
            .max(SEGMENT_BYTES + 1);
        let chunk = self.options.chunk.clamp(1, cap);
        let mut frames = Vec::new();
        let mut cur = Frame::default();
        let mut cur_bytes = 0usize;
        for (i, (addr, len)) in ops.enumerate() {
            let mut offset = 0;
            while offset < len {
                let cost = cur_bytes + cur.segments.len() * SEGMENT_BYTES;
                if cur_bytes == chunk || cost + SEGMENT_BYTES >= cap {
                    frames.push(std::mem::take(&mut cur));
                    cur_bytes = 0;
                }
                let cost = cur_bytes + cur.segments.len() * SEGMENT_BYTES;
                let n = (len - offset)
                    .min(chunk - cur_bytes)
                    .min(cap - cost - SEGMENT_BYTES);
                cur.segments.push(Segment {
                    addr: addr + offset as u64,
                    len: n as u32,
                });
                cur.pieces.push(Piece {
                    op: i,
                    offset,
                    len: n,
                });
                cur_bytes += n;
                offset += n;
            }
        }
        if !cur.segments.is_empty() {
            frames.push(cur);
        }
        frames
    }

    fn do_read(&self, conn: &mut Connection, ops: &mut [ReadOp<'_>]) -> Result<()> {
        let frames = self.plan(&conn.hello, ops.iter().map(|o| (o.addr, o.dst.len())));
        let base = self
            .next_id
            .fetch_add(frames.len() as u64, Ordering::Relaxed);
        let window = self.options.window.max(1);
        let (mut sent, mut received) = (0, 0);
        while received < frames.len() {
            conn.out.clear();
            while sent < frames.len() && sent - received < window {
                protocol::encode_read(&mut conn.out, base + sent as u64, &frames[sent].segments);
                sent += 1;
            }
            if !conn.out.is_empty() {
                conn.writer
                    .write_all(&conn.out)
                    .map_err(|e| self.io_err("send read request", e))?;
            }
            let frame = &frames[received];
            let id = base + received as u64;
            let head = self.read_head(conn, id)?;
            let len = head.payload_len;
            if !head.ok {
                let mut payload = vec![0u8; len];
                conn.reader
                    .read_exact(&mut payload)
                    .map_err(|e| self.io_err("receive reply", e))?;
                let reply = ErrorReply::decode(&payload).map_err(|e| self.proto_err(e))?;
                return Err(self.remote_err("read", reply));
            }
            let expected: usize = frame.pieces.iter().map(|p| p.len).sum();
            if len != expected {
                return Err(self.proto_err(ProtocolError::Inconsistent(format!(
                    "read reply carries {len} bytes, {expected} were asked for"
                ))));
            }
            for p in &frame.pieces {
                let dst = &mut ops[p.op].dst[p.offset..p.offset + p.len];
                conn.reader
                    .read_exact(dst)
                    .map_err(|e| self.io_err("receive read data", e))?;
            }
            self.skip_padding(conn, head.padding)?;
            received += 1;
        }
        Ok(())
    }

    fn do_write(&self, conn: &mut Connection, ops: &[WriteOp<'_>]) -> Result<()> {
        let frames = self.plan(&conn.hello, ops.iter().map(|o| (o.addr, o.src.len())));
        let base = self
            .next_id
            .fetch_add(frames.len() as u64, Ordering::Relaxed);
        let window = self.options.window.max(1);
        let mut received = 0;
        for (sent, frame) in frames.iter().enumerate() {
            if sent - received == window {
                self.read_reply(conn, base + received as u64, "write")?;
                received += 1;
            }
            conn.out.clear();
            protocol::encode_write_head(&mut conn.out, base + sent as u64, &frame.segments);
            let data: usize = frame.pieces.iter().map(|p| p.len).sum();
            let pieces = frame
                .pieces
                .iter()
                .map(|p| &ops[p.op].src[p.offset..p.offset + p.len]);
            if data <= 64 * 1024 {
                for piece in pieces {
                    conn.out.extend_from_slice(piece);
                }
                conn.writer
                    .write_all(&conn.out)
                    .map_err(|e| self.io_err("send write request", e))?;
            } else {
                conn.writer
                    .write_all(&conn.out)
                    .map_err(|e| self.io_err("send write request", e))?;
                for piece in pieces {
                    conn.writer
                        .write_all(piece)
                        .map_err(|e| self.io_err("send write data", e))?;
                }
            }
        }
        while received < frames.len() {
            self.read_reply(conn, base + received as u64, "write")?;
            received += 1;
        }
        Ok(())
    }

    /// Runs `f` on a pooled connection after checking every `(addr, len)` against the
    /// remote size. The connection goes back to the pool if `f` succeeded or the check
    /// failed before anything was sent; after any other error it is dropped, since
    /// replies may still be in flight on it.
    ///
    /// A pooled connection the server has closed meanwhile (its idle timeout, or a
    /// restart) fails at once; then `f` runs once more on a new connection. Reads and
    /// writes are idempotent (a write stores the same bytes again), so the retry cannot
    /// change the outcome, only rescue it. A timeout is not retried: the caller hears
    /// of it after one timeout, not two.
    fn with_connection<T>(
        &self,
        op: &'static str,
        ranges: &[(u64, usize)],
        mut f: impl FnMut(&mut Connection) -> Result<T>,
    ) -> Result<T> {
        let (mut conn, pooled) = self.pool.take_or_open(|| self.open_connection())?;
        let mut retried = false;
        loop {
            if let Err(e) = check_ranges(op, ranges, conn.hello.size) {
                self.pool.put(conn);
                return Err(e);
            }
            match f(&mut conn) {
                Ok(v) => {
                    self.pool.put(conn);
                    return Ok(v);
                }
                Err(e) if pooled && !retried && is_stale_connection(&e) => {
                    tracing::debug!(peer = %self.addr, error = %e, "pooled connection was closed; retrying on a new one");
                    retried = true;
                    // Its pool-mates are probably as stale.
                    self.pool.clear();
                    conn = self.open_connection()?;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// True for errors that mean the connection was already closed by the server before
/// this call used it (not a timeout, not a refusal of the request itself).
fn is_stale_connection(e: &Error) -> bool {
    match e {
        Error::Io { source, .. } => matches!(
            source.kind(),
            io::ErrorKind::ConnectionAborted
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::BrokenPipe
                | io::ErrorKind::UnexpectedEof
                | io::ErrorKind::NotConnected
        ),
        Error::Remote {
            code: ErrorCode::IdleTimeout,
            ..
        } => true,
        _ => false,
    }
}

impl Transport for TcpTransport {
    fn describe(&self) -> String {
        format!("tcp://{}", self.addr)
    }

    fn remote_size(&self) -> Result<u64> {
        let known = self.size.load(Ordering::Relaxed);
        if known != u64::MAX {
            return Ok(known);
        }
        self.with_connection("size", &[], |c| Ok(c.hello.size))
    }

    fn read(&self, addr: u64, dst: &mut [u8]) -> Result<()> {
        self.read_vectored(&mut [ReadOp { addr, dst }])
    }

    fn write(&self, addr: u64, src: &[u8]) -> Result<()> {
        self.write_vectored(&[WriteOp { addr, src }])
    }

    fn read_vectored(&self, ops: &mut [ReadOp<'_>]) -> Result<()> {
        let bytes: u64 = ops.iter().map(|o| o.dst.len() as u64).sum();
        let ranges: Vec<(u64, usize)> = ops.iter().map(|o| (o.addr, o.dst.len())).collect();
        self.with_connection("read", &ranges, |c| self.do_read(c, ops))?;
        self.counters.record_read(bytes);
        Ok(())
    }

    fn write_vectored(&self, ops: &[WriteOp<'_>]) -> Result<()> {
        let bytes: u64 = ops.iter().map(|o| o.src.len() as u64).sum();
        let ranges: Vec<(u64, usize)> = ops.iter().map(|o| (o.addr, o.src.len())).collect();
        self.with_connection("write", &ranges, |c| self.do_write(c, ops))?;
        self.counters.record_write(bytes);
        Ok(())
    }

    fn stats(&self) -> TransportStats {
        self.counters.snapshot()
    }
}
