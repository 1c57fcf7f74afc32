//! The memory server: one address space served over TCP to many concurrent clients.
//!
//! Each connection gets its own thread (blocking I/O has the lowest latency on
//! loopback and a connection is long-lived); requests on a connection are handled in
//! order, so a client may pipeline as many as it likes. A connection must open with a
//! `HELLO` carrying the server's token, if it has one, before anything is served.
//! Write requests are received whole before any byte of the region changes, so a client
//! that disconnects mid-request changes nothing. [`MemoryServer::shutdown`] stops
//! accepting, closes every connection and waits for every handler to finish.

use std::collections::HashMap;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{
    IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs,
};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use subtle::ConstantTimeEq;
use tracing::{debug, info, warn};

use crate::error::{Error, Result};
use crate::memory::MemoryRegion;
use crate::protocol::{
    self, ErrorCode, ErrorReply, HelloReply, Request, Segment, LEN_BYTES, REQUEST_HEADER,
    RESPONSE_HEADER,
};

/// Settings of a [`MemoryServer`].
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Shared secret clients must present in their hello; `None` serves everyone.
    pub token: Option<String>,
    /// Largest frame body accepted or sent.
    pub max_frame: u32,
    /// Connections served at once; more are refused with a `Busy` error.
    pub max_connections: usize,
    /// A connection idle (or stalled mid-frame) this long is closed; `None` waits forever.
    pub idle_timeout: Option<Duration>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            token: None,
            max_frame: protocol::DEFAULT_MAX_FRAME,
            max_connections: 1024,
            idle_timeout: Some(Duration::from_secs(600)),
        }
    }
}

/// Counters a server keeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Connections accepted and served.
    pub connections: u64,
    /// Connections refused at the limit.
    pub refused: u64,
    /// Requests handled (hello included).
    pub requests: u64,
    /// Requests answered with an error.
    pub errors: u64,
    /// Bytes read out of the region.
    pub bytes_read: u64,
    /// Bytes written into the region.
    pub bytes_written: u64,
}

#[derive(Debug, Default)]
struct Counters {
    connections: AtomicU64,
    refused: AtomicU64,
    requests: AtomicU64,
    errors: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
}

#[derive(Debug, Default)]
struct Live {
    streams: HashMap<u64, TcpStream>,
    handlers: Vec<JoinHandle<()>>,
}

#[derive(Debug)]
struct Shared {
    region: Arc<MemoryRegion>,
    config: ServerConfig,
    addr: SocketAddr,
    stopping: AtomicBool,
    active: AtomicUsize,
    live: Mutex<Live>,
    stopped: Mutex<bool>,
    stopped_cv: Condvar,
    counters: Counters,
}

/// A running memory server. Dropping it shuts it down.
#[derive(Debug)]
pub struct MemoryServer {
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

/// A cheap handle that can stop a server from another thread (a signal handler).
#[derive(Debug, Clone)]
pub struct ShutdownHandle {
    shared: Arc<Shared>,
}

impl ShutdownHandle {
    /// Asks the server to stop; returns at once.
    pub fn shutdown(&self) {
        begin_shutdown(&self.shared);
    }
}

impl MemoryServer {
    /// Starts serving a fresh zeroed region of `size` bytes on `addr` (`"127.0.0.1:0"`
    /// picks a free port).
    ///
    /// # Errors
    /// [`Error::Alloc`] if the region cannot be allocated, [`Error::Server`] if the
    /// address cannot be bound.
    pub fn start(addr: &str, size: u64, config: ServerConfig) -> Result<Self> {
        Self::serve_region(addr, Arc::new(MemoryRegion::new(size)?), config)
    }

    /// Starts serving an existing region (shared with local transports, say).
    ///
    /// # Errors
    /// [`Error::Server`] if the address cannot be bound or the config is invalid.
    pub fn serve_region(
        addr: &str,
        region: Arc<MemoryRegion>,
        config: ServerConfig,
    ) -> Result<Self> {
        let server_err = |reason: &str, source: Option<io::Error>| Error::Server {
            addr: addr.to_owned(),
            reason: reason.to_owned(),
            source,
        };
        if config.max_frame < protocol::MIN_MAX_FRAME {
            return Err(server_err(
                &format!("max_frame must be at least {}", protocol::MIN_MAX_FRAME),
                None,
            ));
        }
        if config.max_connections == 0 {
            return Err(server_err("max_connections must be at least 1", None));
        }
        let addrs: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|e| server_err("cannot resolve", Some(e)))?
            .collect();
        let listener =
            TcpListener::bind(&addrs[..]).map_err(|e| server_err("cannot bind", Some(e)))?;
        let local = listener
            .local_addr()
            .map_err(|e| server_err("cannot read the bound address", Some(e)))?;
        info!(addr = %local, size = region.size(), auth = config.token.is_some(), "memory server listening");
        let shared = Arc::new(Shared {
            region,
            config,
            addr: local,
            stopping: AtomicBool::new(false),
            active: AtomicUsize::new(0),
            live: Mutex::new(Live::default()),
            stopped: Mutex::new(false),
            stopped_cv: Condvar::new(),
            counters: Counters::default(),
        });
        let accept_shared = Arc::clone(&shared);
        let acceptor = std::thread::Builder::new()
            .name(format!("scad-accept-{}", local.port()))
            .spawn(move || accept_loop(&accept_shared, &listener))
            .map_err(|e| server_err("cannot spawn the accept thread", Some(e)))?;
        Ok(MemoryServer {
            shared,
            acceptor: Some(acceptor),
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// A `tcp://HOST:PORT` url clients on this host can connect to.
    pub fn url(&self) -> String {
        let addr = connectable(self.shared.addr);
        match addr.ip() {
            IpAddr::V6(ip) => format!("tcp://[{ip}]:{}", addr.port()),
            IpAddr::V4(ip) => format!("tcp://{ip}:{}", addr.port()),
        }
    }

    /// The served region.
    pub fn region(&self) -> &Arc<MemoryRegion> {
        &self.shared.region
    }

    /// Connections being served right now.
    pub fn active_connections(&self) -> usize {
        self.shared.active.load(Ordering::Relaxed)
    }

    /// Counters so far.
    pub fn stats(&self) -> ServerStats {
        let c = &self.shared.counters;
        ServerStats {
            connections: c.connections.load(Ordering::Relaxed),
            refused: c.refused.load(Ordering::Relaxed),
            requests: c.requests.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            bytes_read: c.bytes_read.load(Ordering::Relaxed),
            bytes_written: c.bytes_written.load(Ordering::Relaxed),
        }
    }

    /// A handle that can stop the server from elsewhere.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Blocks until some [`ShutdownHandle`] stops the server, then finishes shutting down.
    pub fn wait(mut self) {
        {
            let mut stopped = self
                .shared
                .stopped
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            while !*stopped {
                stopped = self
                    .shared
                    .stopped_cv
                    .wait(stopped)
                    .unwrap_or_else(PoisonError::into_inner);
            }
        }
        self.finish();
    }

    /// Stops accepting, closes every connection and waits for all handlers to end.
    pub fn shutdown(mut self) {
        begin_shutdown(&self.shared);
        self.finish();
    }

    fn finish(&mut self) {
        begin_shutdown(&self.shared);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        let handlers = {
            let mut live = self
                .shared
                .live
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            for stream in live.streams.values() {
                let _ = stream.shutdown(Shutdown::Both);
            }
            std::mem::take(&mut live.handlers)
        };
        for h in handlers {
            let _ = h.join();
        }
        info!(addr = %self.shared.addr, "memory server stopped");
    }
}

impl Drop for MemoryServer {
    fn drop(&mut self) {
        if self.acceptor.is_some() {
            self.finish();
        }
    }
}

/// Where to connect to reach a listener bound to `addr` (wildcards become loopback).
fn connectable(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv4Addr::LOCALHOST.into(), addr.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv6Addr::LOCALHOST.into(), addr.port())
        }
        _ => addr,
    }
}

fn begin_shutdown(shared: &Arc<Shared>) {
    if shared.stopping.swap(true, Ordering::SeqCst) {
        return;
    }
    // Wake the blocking accept with a connection of our own.
    let _ = TcpStream::connect_timeout(&connectable(shared.addr), Duration::from_secs(1));
    let mut stopped = shared
        .stopped
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    *stopped = true;
    shared.stopped_cv.notify_all();
}

fn accept_loop(shared: &Arc<Shared>, listener: &TcpListener) {
    let mut next_id = 0u64;
    for stream in listener.incoming() {
        if shared.stopping.load(Ordering::SeqCst) {
            break;
        }
        let mut stream = match stream {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %e, "accept failed");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let peer = stream
            .peer_addr()
            .map_or_else(|_| "?".to_owned(), |a| a.to_string());
        if shared.active.load(Ordering::SeqCst) >= shared.config.max_connections {
            shared.counters.refused.fetch_add(1, Ordering::Relaxed);
            warn!(%peer, limit = shared.config.max_connections, "connection refused: at the connection limit");
            let mut out = Vec::new();
            ErrorReply::new(
                ErrorCode::Busy,
                format!(
                    "server is at its limit of {} connections",
                    shared.config.max_connections
                ),
            )
            .encode(&mut out, 0);
            let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
            let _ = stream.write_all(&out);
            continue;
        }
        next_id += 1;
        let id = next_id;
        shared.active.fetch_add(1, Ordering::SeqCst);
        shared.counters.connections.fetch_add(1, Ordering::Relaxed);
        let mut live = shared.live.lock().unwrap_or_else(PoisonError::into_inner);
        live.handlers.retain(|h| !h.is_finished());
        if let Ok(clone) = stream.try_clone() {
            live.streams.insert(id, clone);
        }
        let conn_shared = Arc::clone(shared);
        let spawned = std::thread::Builder::new()
            .name(format!("scad-conn-{id}"))
            .spawn(move || {
                debug!(%peer, "client connected");
                match serve_connection(&conn_shared, stream) {
                    Ok(()) => debug!(%peer, "client disconnected"),
                    Err(e) => info!(%peer, error = %e, "connection closed"),
                }
                conn_shared
                    .live
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .streams
                    .remove(&id);
                conn_shared.active.fetch_sub(1, Ordering::SeqCst);
            });
        match spawned {
            Ok(h) => live.handlers.push(h),
            Err(e) => {
                warn!(error = %e, "cannot spawn a connection thread");
                live.streams.remove(&id);
                shared.active.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
}

/// Why a connection ended early.
#[derive(Debug, thiserror::Error)]
enum ConnError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("{0}")]
    Refused(String),
    #[error("{0}")]
    Region(#[from] Error),
}

/// Below this many bytes a read reply is copied into one buffer and sent with one call;
/// larger replies go to the socket straight from the region's (page-aligned) memory.
const SMALL_REPLY: usize = 16 * 1024;

fn serve_connection(shared: &Shared, stream: TcpStream) -> std::result::Result<(), ConnError> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(shared.config.idle_timeout)?;
    stream.set_write_timeout(shared.config.idle_timeout)?;
    let mut reader = BufReader::with_capacity(64 * 1024, stream.try_clone()?);
    let mut writer = BufWriter::with_capacity(64 * 1024, stream);
    let mut body = Vec::new();
    let mut out = Vec::new();
    let mut authenticated = false;
    let region = &shared.region;
    let max_frame = shared.config.max_frame;
    loop {
        let mut len = [0u8; LEN_BYTES];
        match reader.read_exact(&mut len) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        if shared.stopping.load(Ordering::Relaxed) {
            return Ok(());
        }
        let len = u32::from_le_bytes(len);
        let len = match protocol::check_frame_len(len, max_frame, REQUEST_HEADER) {
            Ok(len) => len,
            Err(e) => {
                let code = if matches!(e, protocol::ProtocolError::TooLarge { .. }) {
                    ErrorCode::FrameTooLarge
                } else {
                    ErrorCode::Malformed
                };
                return refuse(shared, &mut writer, 0, code, e.to_string());
            }
        };
        body.resize(len, 0);
        reader.read_exact(&mut body)?;
        shared.counters.requests.fetch_add(1, Ordering::Relaxed);
        let (id, request) = match protocol::decode_request(&body) {
            Ok(r) => r,
            Err(e) => {
                let id = protocol::peek_id(&body);
                return refuse(shared, &mut writer, id, ErrorCode::Malformed, e.to_string());
            }
        };
        out.clear();
        match request {
            Request::Hello { version, token } => {
                if version != protocol::VERSION {
                    return refuse(
                        shared,
                        &mut writer,
                        id,
                        ErrorCode::VersionMismatch,
                        format!(
                            "server speaks version {}, client {version}",
                            protocol::VERSION
                        ),
                    );
                }
                if let Some(expected) = &shared.config.token {
                    if !bool::from(expected.as_bytes().ct_eq(token)) {
                        return refuse(
                            shared,
                            &mut writer,
                            id,
                            ErrorCode::Unauthenticated,
                            "wrong or missing token".into(),
                        );
                    }
                }
                authenticated = true;
                HelloReply {
                    version: protocol::VERSION,
                    max_frame,
                    size: region.size(),
                }
                .encode(&mut out, id);
            }
            _ if !authenticated => {
                return refuse(
                    shared,
                    &mut writer,
                    id,
                    ErrorCode::Unauthenticated,
                    "the first request must be a hello".into(),
                );
            }
            Request::Size => protocol::encode_size_reply(&mut out, id, region.size()),
            Request::Read { segments } => {
                let total: u64 = segments.iter().map(|s| u64::from(s.len)).sum();
                if total + protocol::RESPONSE_ALIGN as u64
                    > u64::from(max_frame) - RESPONSE_HEADER as u64
                {
                    reply_error(
                        shared,
                        &mut out,
                        id,
                        ErrorReply::new(
                            ErrorCode::FrameTooLarge,
                            format!(
                                "a read of {total} bytes does not fit one frame of {max_frame}"
                            ),
                        ),
                    );
                } else if let Some(err) = range_error(region, "read", &segments) {
                    reply_error(shared, &mut out, id, err);
                } else {
                    protocol::encode_ok_head(&mut out, id, total as usize);
                    if (total as usize) <= SMALL_REPLY {
                        for s in &segments {
                            let start = out.len();
                            out.resize(start + s.len as usize, 0);
                            region.read(s.addr, &mut out[start..])?;
                        }
                        protocol::pad_response(&mut out, total as usize);
                    } else {
                        writer.write_all(&out)?;
                        out.clear();
                        for s in &segments {
                            region.read_with(s.addr, s.len.into(), |piece| {
                                writer.write_all(piece).map_err(ConnError::Io)
                            })?;
                        }
                        protocol::pad_response(&mut out, total as usize);
                    }
                    shared
                        .counters
                        .bytes_read
                        .fetch_add(total, Ordering::Relaxed);
                }
            }
            Request::Write { segments, data } => {
                if let Some(err) = range_error(region, "write", &segments) {
                    reply_error(shared, &mut out, id, err);
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
                    protocol::encode_ok_head(&mut out, id, 0);
                }
            }
        }
        writer.write_all(&out)?;
        // Flush only when no further request is already waiting: pipelined requests
        // get their replies in one batch.
        if reader.buffer().is_empty() {
            writer.flush()?;
        }
    }
}

fn range_error(
    region: &MemoryRegion,
    op: &'static str,
    segments: &[Segment],
) -> Option<ErrorReply> {
    segments.iter().find_map(|s| {
        region
            .check(op, s.addr, s.len.into())
            .err()
            .map(|e| ErrorReply {
                code: ErrorCode::OutOfRange,
                addr: s.addr,
                len: s.len.into(),
                size: region.size(),
                message: e.to_string(),
            })
    })
}

fn reply_error(shared: &Shared, out: &mut Vec<u8>, id: u64, err: ErrorReply) {
    shared.counters.errors.fetch_add(1, Ordering::Relaxed);
    debug!(id, error = %err, "request refused");
    err.encode(out, id);
}

/// Sends an error and ends the connection (the stream cannot be trusted to resync).
fn refuse(
    shared: &Shared,
    writer: &mut BufWriter<TcpStream>,
    id: u64,
    code: ErrorCode,
    message: String,
) -> std::result::Result<(), ConnError> {
    shared.counters.errors.fetch_add(1, Ordering::Relaxed);
    warn!(id, ?code, %message, "closing connection");
    let mut out = Vec::new();
    ErrorReply::new(code, message.clone()).encode(&mut out, id);
    let _ = writer.write_all(&out).and_then(|()| writer.flush());
    Err(ConnError::Refused(message))
}
