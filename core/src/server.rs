//! The memory server: one address space served over TCP to many concurrent clients.
//!
//! Each connection gets its own thread (blocking I/O has the lowest latency on
//! loopback and a connection is long-lived); requests on a connection are handled in
//! order, so a client may pipeline as many as it likes. A connection must open with a
//! `HELLO` carrying the server's token, if it has one, before anything is served; a
//! region's token ([`RegionGrant`]) opens only that region, addressed from 0.
//! Write requests are received whole before any byte of the region changes, so a client
//! that disconnects mid-request changes nothing. [`MemoryServer::shutdown`] stops
//! accepting, closes every connection and waits for every handler to finish.
//!
//! Every client is treated as possibly broken or hostile: connections, frame sizes,
//! bytes in flight, idle time and the time a started frame may take are all limited
//! ([`ServerConfig`] lists them with their defaults). A refusal is an error frame with
//! an [`ErrorCode`] (request id 0 when it ends the connection unprompted), a `tracing`
//! line, and, where the stream cannot be trusted any more, the end of the connection.

use std::fmt;
use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use subtle::ConstantTimeEq;
use tracing::{debug, info, warn};

use crate::error::{Error, Result};
use crate::listener::{self, Hub, Protection, Refusal, PROTECTED_MESSAGE};

pub use crate::listener::{admit, Admission};
use crate::memory::MemoryRegion;
use crate::protocol::{
    self, ErrorCode, ErrorReply, HelloReply, Request, Segment, LEN_BYTES, REQUEST_HEADER,
    RESPONSE_HEADER,
};

/// Settings of a [`MemoryServer`].
///
/// Limits and their defaults:
///
/// | limit | field | default |
/// |---|---|---|
/// | connections served at once (more get `Busy`) | `max_connections` | 1024 |
/// | bytes of one frame (clients split larger transfers) | `max_frame` | 16 MiB + 64 KiB |
/// | bytes in flight per connection | one request at a time, so `max_frame` | |
/// | bytes in flight in total | `max_in_flight` | 512 MiB |
/// | wait for in-flight budget before `Busy` | `in_flight_wait` | 5 s |
/// | idle connection closed after | `idle_timeout` | 600 s |
/// | a started frame (or a new connection's hello) must arrive within | `request_timeout` | 30 s |
#[derive(Clone)]
pub struct ServerConfig {
    /// Shared secret that opens the whole address space. With no token (and no
    /// `regions`) the server is in protected mode: it serves only clients on this host
    /// (see [`admit`]) unless `unprotected` is set.
    pub token: Option<String>,
    /// Parts of the address space with their own tokens. A client whose hello carries
    /// a region's token sees only that region, as an address space of its own starting
    /// at 0, so applications sharing a server cannot reach each other's bytes.
    /// Configuring regions turns authentication on even without `token`.
    pub regions: Vec<RegionGrant>,
    /// Largest frame body accepted or sent. A connection handles one request at a
    /// time, so this also bounds the bytes one connection has in flight. Between
    /// requests a connection keeps at most 2 MiB of receive buffer and 128 KiB of
    /// socket buffers (a larger buffer grown for one frame is given back).
    pub max_frame: u32,
    /// Connections served at once; more are refused with a `Busy` error.
    pub max_connections: usize,
    /// Bytes of request and reply data all connections together may have in flight
    /// (a write's payload while it is buffered, a read's reply while it is sent). A
    /// request that would exceed it waits up to `in_flight_wait` for others to finish,
    /// then gets a `Busy` error (a write is refused before its payload is read, and its
    /// connection closed; a read is refused and its connection kept).
    pub max_in_flight: u64,
    /// How long a request waits for in-flight budget before it is refused as `Busy`.
    pub in_flight_wait: Duration,
    /// A connection idle this long between requests is closed (with an `IdleTimeout`
    /// notice); `None` waits forever.
    pub idle_timeout: Option<Duration>,
    /// Once a frame has started, all of it must arrive within this time, and a new
    /// connection must send its hello within it; a reply must be taken by the client
    /// within it too. Otherwise the connection is closed with `RequestTimeout`, so a
    /// stalled client cannot hold a worker. `None` waits forever (up to `idle_timeout`).
    pub request_timeout: Option<Duration>,
    /// Serve clients on other hosts even without a token (`--unprotected`,
    /// `SCAD_UNPROTECTED=1`): anyone who can reach the port may then read and write the
    /// whole address space. Off by default (protected mode, as in Redis; see [`admit`]).
    pub unprotected: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            token: None,
            regions: Vec::new(),
            max_frame: protocol::DEFAULT_MAX_FRAME,
            max_connections: 1024,
            max_in_flight: 512 << 20,
            in_flight_wait: Duration::from_secs(5),
            idle_timeout: Some(Duration::from_secs(600)),
            request_timeout: Some(Duration::from_secs(30)),
            unprotected: false,
        }
    }
}

impl fmt::Debug for ServerConfig {
    /// Never prints tokens.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerConfig")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("regions", &self.regions)
            .field("max_frame", &self.max_frame)
            .field("max_connections", &self.max_connections)
            .field("max_in_flight", &self.max_in_flight)
            .field("in_flight_wait", &self.in_flight_wait)
            .field("idle_timeout", &self.idle_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("unprotected", &self.unprotected)
            .finish()
    }
}

/// A named part of the served address space and the token that opens it.
#[derive(Clone, PartialEq, Eq)]
pub struct RegionGrant {
    /// Name, for logs and errors.
    pub name: String,
    /// First byte of the region in the served address space.
    pub offset: u64,
    /// Bytes of the region.
    pub len: u64,
    /// The token a client presents to reach this region (and nothing else).
    pub token: String,
}

impl fmt::Debug for RegionGrant {
    /// Never prints the token.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegionGrant")
            .field("name", &self.name)
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl RegionGrant {
    /// Parses `NAME:OFFSET:LEN:TOKEN` (offset and length in bytes, or with a K, M, G or
    /// T suffix for powers of 1024), the form `memory_server --region` takes.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the bad part (the token is never quoted).
    pub fn parse(spec: &str) -> Result<Self> {
        let bad = |why: String| Error::InvalidArgument(format!("region spec: {why}"));
        let mut parts = spec.splitn(4, ':');
        let (Some(name), Some(offset), Some(len), Some(token)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad("expected NAME:OFFSET:LEN:TOKEN".into()));
        };
        let offset = parse_bytes(offset).map_err(|e| bad(format!("offset: {e}")))?;
        let len = parse_bytes(len).map_err(|e| bad(format!("length: {e}")))?;
        Ok(RegionGrant {
            name: name.to_owned(),
            offset,
            len,
            token: token.to_owned(),
        })
    }
}

/// Parses a byte count with an optional K, M, G or T suffix (powers of 1024), also
/// written as element limits are (`512 MB`, `1GiB`, `4096 B`): the one size parser
/// of the server, the `memory_server` command line and the wheel.
///
/// # Errors
/// A message naming what is wrong.
pub fn parse_bytes(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    // A unit written out: `MB`, `MiB`, `B` (all powers of 1024, as the limits mean).
    let t = match t.strip_suffix(['B', 'b']) {
        Some(rest) => rest.strip_suffix('i').unwrap_or(rest).trim_end(),
        None => t,
    };
    let (digits, shift) = match t.char_indices().last() {
        Some((i, 'K' | 'k')) => (&t[..i], 10),
        Some((i, 'M' | 'm')) => (&t[..i], 20),
        Some((i, 'G' | 'g')) => (&t[..i], 30),
        Some((i, 'T' | 't')) => (&t[..i], 40),
        _ => (t, 0),
    };
    let digits = digits.trim_end();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "{s:?} is not a number with an optional K/M/G/T suffix"
        ));
    }
    let n: u64 = digits.parse().map_err(|_| format!("{s:?} is too large"))?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// Counters a server keeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Connections accepted and served.
    pub connections: u64,
    /// Connections refused at the limit.
    pub refused: u64,
    /// Connections refused by protected mode (no token, client on another host).
    pub protected: u64,
    /// Requests handled (hello included).
    pub requests: u64,
    /// Requests answered with an error.
    pub errors: u64,
    /// Requests refused because the in-flight budget stayed exhausted.
    pub busy: u64,
    /// Bytes read out of the region.
    pub bytes_read: u64,
    /// Bytes written into the region.
    pub bytes_written: u64,
}

#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU64,
    errors: AtomicU64,
    busy: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
}

#[derive(Debug)]
struct Shared {
    region: Arc<MemoryRegion>,
    config: ServerConfig,
    budget: Budget,
    hub: Arc<Hub>,
    counters: Counters,
}

impl Shared {
    fn begin_shutdown(&self) {
        // Requests waiting for budget give up at once rather than after their wait.
        self.budget.close();
        self.hub.begin_shutdown();
    }
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
        self.shared.begin_shutdown();
    }
}

impl MemoryServer {
    /// Starts serving a fresh zeroed region of `size` bytes on `addr` (`"127.0.0.1:0"`
    /// picks a free port).
    ///
    /// # Errors
    /// [`Error::Alloc`] if the region cannot be allocated, [`Error::Server`] if the
    /// address cannot be bound or the config is invalid.
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
        let invalid = |reason: String| Error::Server {
            addr: addr.to_owned(),
            reason,
            source: None,
        };
        if config.max_frame < protocol::MIN_MAX_FRAME {
            return Err(invalid(format!(
                "max_frame must be at least {}",
                protocol::MIN_MAX_FRAME
            )));
        }
        if config.max_connections == 0 {
            return Err(invalid("max_connections must be at least 1".into()));
        }
        if config.max_in_flight < u64::from(config.max_frame) {
            return Err(invalid(format!(
                "max_in_flight ({}) must be at least max_frame ({}), or no full frame could be served",
                config.max_in_flight, config.max_frame
            )));
        }
        if config.request_timeout == Some(Duration::ZERO)
            || config.idle_timeout == Some(Duration::ZERO)
        {
            return Err(invalid(
                "timeouts must be longer than zero (or None)".into(),
            ));
        }
        check_regions(&config, region.size()).map_err(invalid)?;
        let (listener, local) = listener::bind(addr)?;
        let protection = Protection {
            token_configured: config.token.is_some() || !config.regions.is_empty(),
            unprotected: config.unprotected,
        };
        info!(
            addr = %local,
            size = region.size(),
            auth = protection.token_configured,
            protected_mode = !protection.token_configured && !protection.unprotected,
            regions = config.regions.len(),
            max_connections = config.max_connections,
            max_frame = config.max_frame,
            max_in_flight = config.max_in_flight,
            "memory server listening"
        );
        let shared = Arc::new(Shared {
            region,
            budget: Budget::new(config.max_in_flight),
            hub: Arc::new(Hub::new(local, config.max_connections, protection)),
            config,
            counters: Counters::default(),
        });
        let conn_shared = Arc::clone(&shared);
        let acceptor = listener::spawn_acceptor(
            Arc::clone(&shared.hub),
            listener,
            "scad",
            |stream, _peer, why| {
                let (reply, wait) = match why {
                    Refusal::AtLimit { limit } => (
                        ErrorReply::new(
                            ErrorCode::Busy,
                            format!("server is at its limit of {limit} connections"),
                        ),
                        // The accept thread must not wait on a client it refuses.
                        Duration::ZERO,
                    ),
                    // On the connection's own thread: wait until the client has its hello
                    // answered (its request discarded), so the reply is not lost to a reset.
                    Refusal::Protected => (
                        ErrorReply::new(ErrorCode::Protected, PROTECTED_MESSAGE.to_owned()),
                        LINGER_TIME,
                    ),
                };
                let mut out = Vec::new();
                reply.encode(&mut out, 0);
                let _ = stream.write_all(&out);
                linger(stream, wait);
            },
            move |stream, peer| {
                debug!(%peer, "client connected");
                match serve_connection(&conn_shared, stream) {
                    Ok(()) => debug!(%peer, "client disconnected"),
                    Err(e) => info!(%peer, error = %e, "connection closed"),
                }
            },
        )?;
        Ok(MemoryServer {
            shared,
            acceptor: Some(acceptor),
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.hub.addr()
    }

    /// A `tcp://HOST:PORT` url clients on this host can connect to.
    pub fn url(&self) -> String {
        listener::url(self.shared.hub.addr())
    }

    /// The served region.
    pub fn region(&self) -> &Arc<MemoryRegion> {
        &self.shared.region
    }

    /// Connections being served right now.
    pub fn active_connections(&self) -> usize {
        self.shared.hub.active()
    }

    /// Counters so far.
    pub fn stats(&self) -> ServerStats {
        let c = &self.shared.counters;
        ServerStats {
            connections: self.shared.hub.accepted(),
            refused: self.shared.hub.refused(),
            protected: self.shared.hub.refused_protected(),
            requests: c.requests.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            busy: c.busy.load(Ordering::Relaxed),
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
        self.shared.hub.wait_stopped();
        self.finish();
    }

    /// Stops accepting, closes every connection and waits for all handlers to end.
    pub fn shutdown(mut self) {
        self.finish();
    }

    fn finish(&mut self) {
        self.shared.begin_shutdown();
        self.shared.hub.finish(self.acceptor.take());
        info!(addr = %self.shared.hub.addr(), "memory server stopped");
    }
}

impl Drop for MemoryServer {
    fn drop(&mut self) {
        if self.acceptor.is_some() {
            self.finish();
        }
    }
}

/// Checks the region grants against each other, the global token and the region size.
fn check_regions(config: &ServerConfig, size: u64) -> std::result::Result<(), String> {
    if let Some(t) = &config.token {
        if t.is_empty() || t.len() > protocol::MAX_TOKEN {
            return Err(format!(
                "the token must have 1 to {} bytes",
                protocol::MAX_TOKEN
            ));
        }
    }
    for (i, g) in config.regions.iter().enumerate() {
        if g.name.is_empty() {
            return Err(format!("region {i} has no name"));
        }
        if g.token.is_empty() || g.token.len() > protocol::MAX_TOKEN {
            return Err(format!(
                "region {:?}: its token must have 1 to {} bytes",
                g.name,
                protocol::MAX_TOKEN
            ));
        }
        if g.len == 0 || g.offset.checked_add(g.len).is_none_or(|end| end > size) {
            return Err(format!(
                "region {:?} ({} bytes at {}) does not fit the address space of {size} bytes",
                g.name, g.len, g.offset
            ));
        }
        for other in &config.regions[..i] {
            if other.name == g.name {
                return Err(format!("two regions are named {:?}", g.name));
            }
            if other.token == g.token {
                return Err(format!(
                    "regions {:?} and {:?} have the same token",
                    other.name, g.name
                ));
            }
        }
        if config.token.as_deref() == Some(g.token.as_str()) {
            return Err(format!("region {:?} has the server's global token", g.name));
        }
    }
    Ok(())
}

/// The part of the address space one authenticated connection may reach; its
/// requests address it from 0.
#[derive(Debug, Clone, Copy)]
struct Window {
    base: u64,
    len: u64,
}

/// The window a hello token opens, if any. Every configured token is compared, in
/// constant time, whatever matches, so timing tells nothing about which one was close.
fn authorize<'a>(shared: &'a Shared, token: &[u8]) -> Option<(Window, Option<&'a str>)> {
    let config = &shared.config;
    let whole = Window {
        base: 0,
        len: shared.region.size(),
    };
    if config.token.is_none() && config.regions.is_empty() {
        return Some((whole, None));
    }
    let mut found = None;
    if let Some(expected) = &config.token {
        if bool::from(expected.as_bytes().ct_eq(token)) {
            found = Some((whole, None));
        }
    }
    for g in &config.regions {
        let hit = bool::from(g.token.as_bytes().ct_eq(token));
        if hit && found.is_none() {
            found = Some((
                Window {
                    base: g.offset,
                    len: g.len,
                },
                Some(g.name.as_str()),
            ));
        }
    }
    found
}

/// The server-wide budget of bytes in flight.
#[derive(Debug)]
struct Budget {
    limit: u64,
    used: AtomicU64,
    waiters: AtomicUsize,
    closed: AtomicBool,
    lock: Mutex<()>,
    freed: Condvar,
}

/// Bytes taken from a [`Budget`], given back on drop.
#[derive(Debug)]
struct Grant<'a> {
    budget: &'a Budget,
    bytes: u64,
}

impl Drop for Grant<'_> {
    fn drop(&mut self) {
        self.budget.give(self.bytes);
    }
}

impl Budget {
    fn new(limit: u64) -> Self {
        Budget {
            limit,
            used: AtomicU64::new(0),
            waiters: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            lock: Mutex::new(()),
            freed: Condvar::new(),
        }
    }

    fn try_take(&self, bytes: u64) -> bool {
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                used.checked_add(bytes).filter(|&n| n <= self.limit)
            })
            .is_ok()
    }

    /// Takes `bytes`, waiting up to `wait` for other requests to give some back.
    fn take(&self, bytes: u64, wait: Duration) -> Option<Grant<'_>> {
        let grant = Grant {
            budget: self,
            bytes,
        };
        if bytes == 0 || self.try_take(bytes) {
            return Some(grant);
        }
        let deadline = Instant::now() + wait;
        // Registered before the retry under the lock, so a giver that frees bytes after
        // our failed try sees us and notifies (it takes the lock first, so the notice
        // cannot fall between our try and our wait).
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let mut guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        let result = loop {
            if self.try_take(bytes) {
                break Some(grant);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.closed.load(Ordering::SeqCst) {
                std::mem::forget(grant);
                break None;
            }
            guard = self
                .freed
                .wait_timeout(guard, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        };
        drop(guard);
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        result
    }

    fn give(&self, bytes: u64) {
        if bytes == 0 {
            return;
        }
        self.used.fetch_sub(bytes, Ordering::SeqCst);
        if self.waiters.load(Ordering::SeqCst) > 0 {
            let _guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
            self.freed.notify_all();
        }
    }

    /// Wakes every waiter for good (the server is stopping).
    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let _guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        self.freed.notify_all();
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

/// A receive buffer grown past this for one large frame is given back afterwards, so
/// idle connections do not each keep a maximum-sized frame allocated.
const KEEP_BODY: usize = 2 << 20;

/// How a read of part of a frame failed.
enum PartError {
    /// The peer closed the connection.
    Eof,
    /// The request timeout passed.
    TimedOut,
    /// Anything else.
    Io(io::Error),
}

/// The receiving half of a connection.
struct Incoming {
    reader: BufReader<TcpStream>,
    /// The socket's current receive timeout, to skip needless system calls.
    read_timeout: Option<Duration>,
}

impl Incoming {
    fn set_read_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        if self.read_timeout != timeout {
            self.reader.get_ref().set_read_timeout(timeout)?;
            self.read_timeout = timeout;
        }
        Ok(())
    }

    /// Fills `buf`, all of it by `deadline` (`request_timeout` after the frame began).
    fn read_part(
        &mut self,
        buf: &mut [u8],
        deadline: Option<Instant>,
        request_timeout: Option<Duration>,
    ) -> std::result::Result<(), PartError> {
        let mut pos = 0;
        while pos < buf.len() {
            if let Some(deadline) = deadline {
                if Instant::now() >= deadline {
                    return Err(PartError::TimedOut);
                }
                // The socket timeout is set once per frame, not per read; the deadline
                // is checked after every read, so a client trickling bytes is cut off
                // within twice the request timeout.
                if self.reader.buffer().is_empty() {
                    self.set_read_timeout(request_timeout)
                        .map_err(PartError::Io)?;
                }
            }
            match self.reader.read(&mut buf[pos..]) {
                Ok(0) => return Err(PartError::Eof),
                Ok(n) => pos += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if is_timeout(&e) => return Err(PartError::TimedOut),
                Err(e) => return Err(PartError::Io(e)),
            }
        }
        Ok(())
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// One client connection being served.
struct Conn<'a> {
    shared: &'a Shared,
    incoming: Incoming,
    writer: BufWriter<TcpStream>,
    /// What the client may reach; `None` until its hello is accepted.
    window: Option<Window>,
    body: Vec<u8>,
    out: Vec<u8>,
}

fn serve_connection(shared: &Shared, stream: TcpStream) -> std::result::Result<(), ConnError> {
    let config = &shared.config;
    stream.set_nodelay(true)?;
    stream.set_write_timeout(config.request_timeout.or(config.idle_timeout))?;
    let mut conn = Conn {
        shared,
        incoming: Incoming {
            reader: BufReader::with_capacity(64 * 1024, stream.try_clone()?),
            read_timeout: None,
        },
        writer: BufWriter::with_capacity(64 * 1024, stream),
        window: None,
        body: Vec::new(),
        out: Vec::new(),
    };
    loop {
        if !conn.wait_for_frame()? {
            return Ok(());
        }
        if shared.hub.is_stopping() {
            return Ok(());
        }
        conn.serve_frame()?;
        // Flush only when no further request is already waiting: pipelined requests
        // get their replies in one batch.
        if conn.incoming.reader.buffer().is_empty() {
            conn.writer.flush()?;
        }
        if conn.body.capacity() > KEEP_BODY {
            conn.body = Vec::new();
        }
    }
}

impl Conn<'_> {
    /// Waits until the next frame starts; false when the client closed the connection.
    /// Before the hello the wait is the request timeout, after it the idle timeout.
    fn wait_for_frame(&mut self) -> std::result::Result<bool, ConnError> {
        if !self.incoming.reader.buffer().is_empty() {
            return Ok(true);
        }
        let config = &self.shared.config;
        let (wait, code) = if self.window.is_some() {
            (config.idle_timeout, ErrorCode::IdleTimeout)
        } else {
            (
                config.request_timeout.or(config.idle_timeout),
                ErrorCode::RequestTimeout,
            )
        };
        self.incoming.set_read_timeout(wait)?;
        loop {
            match self.incoming.reader.fill_buf() {
                Ok([]) => return Ok(false),
                Ok(_) => return Ok(true),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if is_timeout(&e) => {
                    let wait = wait.unwrap_or_default();
                    let message = if code == ErrorCode::IdleTimeout {
                        format!("connection idle for {wait:?}: closed by the server")
                    } else {
                        format!("no hello within {wait:?}: connection closed by the server")
                    };
                    refuse(self.shared, &mut self.writer, 0, code, message)?;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Turns a failed part read into the connection's end, telling the client why.
    fn part_failed(&mut self, e: PartError, part: &str) -> ConnError {
        match e {
            PartError::Eof => ConnError::Io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("client closed the connection in the middle of a frame's {part}"),
            )),
            PartError::Io(e) => e.into(),
            PartError::TimedOut => {
                let t = self.shared.config.request_timeout.unwrap_or_default();
                let id = protocol::peek_id(&self.body);
                let message =
                    format!("the {part} of a frame did not arrive within {t:?}: connection closed");
                match refuse(
                    self.shared,
                    &mut self.writer,
                    id,
                    ErrorCode::RequestTimeout,
                    message,
                ) {
                    Err(e) => e,
                    Ok(()) => ConnError::Refused("request timeout".into()),
                }
            }
        }
    }

    /// Receives one whole frame and answers it.
    fn serve_frame(&mut self) -> std::result::Result<(), ConnError> {
        let shared = self.shared;
        let config = &shared.config;
        let deadline = config.request_timeout.map(|t| Instant::now() + t);
        let mut len = [0u8; LEN_BYTES];
        self.body.clear();
        if let Err(e) = self
            .incoming
            .read_part(&mut len, deadline, config.request_timeout)
        {
            return Err(self.part_failed(e, "length"));
        }
        let len = u32::from_le_bytes(len);
        let len = match protocol::check_frame_len(len, config.max_frame, REQUEST_HEADER) {
            Ok(len) => len,
            Err(e) => {
                let code = if matches!(e, protocol::ProtocolError::TooLarge { .. }) {
                    ErrorCode::FrameTooLarge
                } else {
                    ErrorCode::Malformed
                };
                return refuse(shared, &mut self.writer, 0, code, e.to_string());
            }
        };
        // The frame's bytes count against the server's budget while they are buffered.
        let Some(_body_grant) = shared.budget.take(len as u64, config.in_flight_wait) else {
            shared.counters.busy.fetch_add(1, Ordering::Relaxed);
            return refuse(
                shared,
                &mut self.writer,
                0,
                ErrorCode::Busy,
                busy_message(shared, len as u64),
            );
        };
        self.body.resize(len, 0);
        if let Err(e) = self
            .incoming
            .read_part(&mut self.body, deadline, config.request_timeout)
        {
            return Err(self.part_failed(e, "body"));
        }
        shared.counters.requests.fetch_add(1, Ordering::Relaxed);
        let out = &mut self.out;
        let writer = &mut self.writer;
        out.clear();
        let (id, request) = match protocol::decode_request(&self.body) {
            Ok(r) => r,
            Err(e) => {
                let id = protocol::peek_id(&self.body);
                return refuse(shared, writer, id, ErrorCode::Malformed, e.to_string());
            }
        };
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
                self.window = Some(window);
                HelloReply {
                    version: protocol::VERSION,
                    max_frame,
                    size: window.len,
                }
                .encode(out, id);
            }
            _ if self.window.is_none() => {
                return refuse(
                    shared,
                    writer,
                    id,
                    ErrorCode::Unauthenticated,
                    "the first request must be a hello".into(),
                );
            }
            Request::Size => {
                let size = self.window.map_or(0, |w| w.len);
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
                            format!(
                                "a read of {total} bytes does not fit one frame of {max_frame}"
                            ),
                        ),
                    );
                } else if let Some(err) = translate(self.window, "read", &mut segments) {
                    reply_error(shared, out, id, err);
                } else if let Some(_reply_grant) = shared.budget.take(total, config.in_flight_wait)
                {
                    protocol::encode_ok_head(out, id, total as usize);
                    if (total as usize) <= SMALL_REPLY {
                        for s in &segments {
                            let start = out.len();
                            out.resize(start + s.len as usize, 0);
                            region.read(s.addr, &mut out[start..])?;
                        }
                        protocol::pad_response(out, total as usize);
                    } else {
                        writer.write_all(out)?;
                        out.clear();
                        for s in &segments {
                            region.read_with(s.addr, s.len.into(), |piece| {
                                writer.write_all(piece).map_err(ConnError::Io)
                            })?;
                        }
                        protocol::pad_response(out, total as usize);
                        // The reply's bytes are in flight until they left the buffer.
                        writer.write_all(out)?;
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
                if let Some(err) = translate(self.window, "write", &mut segments) {
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
}

fn busy_message(shared: &Shared, bytes: u64) -> String {
    format!(
        "{bytes} more bytes in flight would exceed the server's limit of {} (waited {:?}); try again",
        shared.config.max_in_flight, shared.config.in_flight_wait
    )
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

fn reply_error(shared: &Shared, out: &mut Vec<u8>, id: u64, err: ErrorReply) {
    shared.counters.errors.fetch_add(1, Ordering::Relaxed);
    debug!(id, error = %err, "request refused");
    err.encode(out, id);
}

/// Sends an error and ends the connection (the stream cannot be trusted to resync).
/// Always returns `Err`, for the caller to pass up.
fn refuse(
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
const LINGER_TIME: Duration = Duration::from_millis(500);

/// Closes our side gently: stop sending, then discard what the client still sends
/// (the rest of a refused frame, pipelined requests) for up to `wait` (with no wait,
/// only what has already arrived). Closing a socket with unread input makes the kernel
/// reset the connection, and a reset can destroy the error reply before the client
/// has read it.
fn linger(stream: &TcpStream, wait: Duration) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_waits_for_bytes_given_back() {
        let budget = Budget::new(100);
        let first = budget.take(80, Duration::ZERO).unwrap();
        assert!(budget.take(30, Duration::from_millis(10)).is_none());
        assert!(budget.take(20, Duration::ZERO).is_some());
        std::thread::scope(|s| {
            let waiter = s.spawn(|| budget.take(50, Duration::from_secs(30)).map(|g| g.bytes));
            std::thread::sleep(Duration::from_millis(20));
            drop(first);
            assert_eq!(waiter.join().unwrap(), Some(50));
        });
        assert_eq!(budget.used.load(Ordering::SeqCst), 0);
        // More than the whole budget never fits; zero always does.
        assert!(budget.take(101, Duration::from_millis(5)).is_none());
        assert!(budget.take(0, Duration::ZERO).is_some());
    }

    #[test]
    fn closing_the_budget_releases_waiters() {
        let budget = Budget::new(10);
        let _all = budget.take(10, Duration::ZERO).unwrap();
        std::thread::scope(|s| {
            let waiter = s.spawn(|| budget.take(5, Duration::from_secs(60)).is_none());
            std::thread::sleep(Duration::from_millis(20));
            budget.close();
            assert!(waiter.join().unwrap(), "a closed budget grants nothing");
        });
    }

    #[test]
    fn byte_counts_take_suffixes() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("3K"), Ok(3 << 10));
        assert_eq!(parse_bytes("2g"), Ok(2 << 30));
        assert!(parse_bytes("").is_err());
        assert!(parse_bytes("K").is_err());
        assert!(parse_bytes("-1").is_err());
        assert!(parse_bytes("99999999999T").is_err());
        assert_eq!(parse_bytes("512 MB"), Ok(512 << 20));
        assert_eq!(parse_bytes("1GiB"), Ok(1 << 30));
        assert_eq!(parse_bytes("4096 B"), Ok(4096));
        assert_eq!(parse_bytes(" 64 kb "), Ok(64 << 10));
        for bad in ["MB", "B", "1.5G", "1 2M", "1XB", "iB"] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn config_debug_hides_tokens() {
        let config = ServerConfig {
            token: Some("global-secret".into()),
            regions: vec![RegionGrant::parse("a:0:1K:region-secret").unwrap()],
            ..ServerConfig::default()
        };
        let shown = format!("{config:?}");
        assert!(!shown.contains("secret"), "{shown}");
        assert!(shown.contains("max_in_flight"));
    }
}
