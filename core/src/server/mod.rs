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

mod auth;
mod budget;
mod config;
mod connection;
mod handler;
mod reply;
mod size;

use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tracing::{debug, info};

use crate::error::{Error, Result};
use crate::listener::{self, Hub, Protection, Refusal, PROTECTED_MESSAGE};
use crate::memory::MemoryRegion;
use crate::protocol::{self, ErrorCode, ErrorReply};
use budget::Budget;
use config::check_regions;
use connection::serve_connection;
use reply::{linger, LINGER_TIME};

pub use crate::listener::{admit, Admission};
pub use config::{RegionGrant, ServerConfig};
pub use size::parse_bytes;

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
