//! `rdma_uverbs_server`: serves one [`MemoryRegion`] to RDMA clients.
//!
//! The region is registered once with remote READ and WRITE access; clients then move
//! data with one-sided RDMA and the server's CPU takes no part. What the server does
//! is connection set-up: it accepts TCP connections on its exchange port, checks each
//! client's token in constant time before anything else, creates a queue pair for the
//! client, and tells it the region's address, key and size. The queue pair lives as long
//! as that TCP connection; the device enforces the region's bounds on every access.

use std::io::{self, Read};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tracing::{debug, info, warn};

use super::exchange::RefuseCode;
use super::mr::{Access, Mr};
use super::pd::{self, Pd};
use super::qp::{PreparedQp, QpConfig, Role};
use super::session::{self, ServeError};
use crate::durl::TransportConfig;
use crate::error::{Error, Result};
use crate::listener::{self, Hub, Protection, Refusal, PROTECTED_MESSAGE};
use crate::memory::MemoryRegion;

/// Settings of an [`RdmaServer`].
#[derive(Debug, Clone)]
pub struct RdmaServerConfig {
    /// Shared secret clients must present. With `None` the server is in protected
    /// mode: it serves only clients on this host (see [`crate::server::admit`]) unless
    /// `unprotected` is set.
    pub token: Option<String>,
    /// Device name (`mlx5_0`); the first device found when `None`.
    pub device: Option<String>,
    /// Device port, from 1.
    pub port: u8,
    /// GID table index.
    pub gid_index: u8,
    /// Clients served at once; more are refused.
    pub max_connections: usize,
    /// How long a client may take to send its connection information.
    pub handshake_timeout: Duration,
    /// Serve clients on other hosts even without a token (`--unprotected`): anyone who
    /// can reach the exchange port may then read and write the whole region.
    pub unprotected: bool,
}

impl Default for RdmaServerConfig {
    fn default() -> Self {
        RdmaServerConfig {
            token: None,
            device: None,
            port: 1,
            gid_index: 0,
            max_connections: 1024,
            handshake_timeout: Duration::from_secs(10),
            unprotected: false,
        }
    }
}

/// Counters an [`RdmaServer`] keeps (data moves without the server, so there are no
/// byte counts).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RdmaServerStats {
    /// Clients connected (queue pairs made).
    pub connections: u64,
    /// Clients refused (bad token, protected mode, limit, failed set-up, malformed
    /// exchange).
    pub refused: u64,
}

#[derive(Debug)]
struct Shared {
    /// Declared before `region`: deregistered before the region's memory can go.
    mr: Mr,
    region: Arc<MemoryRegion>,
    pd: Arc<Pd>,
    config: RdmaServerConfig,
    hub: Arc<Hub>,
    connections: AtomicU64,
    /// Clients refused during the exchange (the hub counts those over the limit).
    refused: AtomicU64,
}

/// A running RDMA memory server. Dropping it shuts it down.
#[derive(Debug)]
pub struct RdmaServer {
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

/// A cheap handle that can stop an [`RdmaServer`] from another thread (a signal handler).
#[derive(Debug, Clone)]
pub struct RdmaShutdownHandle {
    shared: Arc<Shared>,
}

impl RdmaShutdownHandle {
    /// Asks the server to stop; returns at once.
    pub fn shutdown(&self) {
        self.shared.hub.begin_shutdown();
    }
}

impl RdmaServer {
    /// Serves a fresh zeroed region of `size` bytes; clients exchange connection
    /// information on `addr` (`"0.0.0.0:2333"`; port 0 picks a free one).
    ///
    /// The whole region is registered, so its pages are pinned: a large region needs a
    /// high locked-memory limit (`ulimit -l`).
    ///
    /// # Errors
    /// [`Error::NoDevice`], [`Error::Rdma`] (port not active, registration refused),
    /// [`Error::Alloc`], [`Error::Server`] if `addr` cannot be bound.
    pub fn start(addr: &str, size: u64, config: RdmaServerConfig) -> Result<Self> {
        Self::serve_region(addr, Arc::new(MemoryRegion::new(size)?), config)
    }

    /// Serves an `rdma_uverbs_server` configuration.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for another kind of configuration; as [`RdmaServer::start`].
    pub fn from_config(config: &TransportConfig) -> Result<Self> {
        let TransportConfig::UverbsServer {
            bind,
            size,
            token,
            device,
            port,
            gid_index,
        } = config
        else {
            return Err(Error::InvalidArgument(format!(
                "an RDMA memory server needs an rdma_uverbs_server configuration, not {config:?}"
            )));
        };
        Self::start(
            &bind.socket_addr_string(),
            *size,
            RdmaServerConfig {
                token: token.clone(),
                device: device.clone(),
                port: *port,
                gid_index: *gid_index,
                ..RdmaServerConfig::default()
            },
        )
    }

    /// Serves an existing region (shared with local users, say). Rust code in this
    /// process sees clients' writes as it sees writes to shared memory: unordered with
    /// its own, exactly as one-sided RDMA is.
    ///
    /// # Errors
    /// As [`RdmaServer::start`].
    pub fn serve_region(
        addr: &str,
        region: Arc<MemoryRegion>,
        config: RdmaServerConfig,
    ) -> Result<Self> {
        let pd = pd::shared(config.device.as_deref())?;
        // Check the port and GID now, with the same checks every client's pair gets, so a
        // misconfigured server fails at start rather than at its first client.
        drop(PreparedQp::new(&pd, qp_config(&config))?);
        let len = usize::try_from(region.size()).map_err(|_| Error::Alloc {
            size: region.size(),
            reason: "larger than the address space of this machine".into(),
        })?;
        // SAFETY: the region's memory is one live allocation of `len` bytes, kept alive
        // by the `Arc` in `Shared`, whose field order drops this registration first.
        // MemoryRegion treats its memory as shared with foreign writers (its accessors
        // hand out only short-lived slices under stripe locks, as for shared memory), so
        // peers writing it at any time breaks no Rust reference.
        let mr = unsafe { Mr::register(&pd, region.as_mut_ptr(), len, Access::Remote) }?;
        let (listener, local) = listener::bind(addr)?;
        info!(
            addr = %local,
            device = pd.context().name(),
            port = config.port,
            size = region.size(),
            "RDMA memory server listening"
        );
        let shared = Arc::new(Shared {
            mr,
            region,
            pd,
            hub: Arc::new(Hub::new(
                local,
                config.max_connections,
                Protection {
                    token_configured: config.token.is_some(),
                    unprotected: config.unprotected,
                },
            )),
            config,
            connections: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        });
        let conn_shared = Arc::clone(&shared);
        let acceptor = listener::spawn_acceptor(
            Arc::clone(&shared.hub),
            listener,
            "scad-rdma",
            |stream, _peer, why| refuse(stream, why),
            move |stream, peer| match serve_client(&conn_shared, stream) {
                Ok(()) => debug!(%peer, "RDMA client disconnected"),
                Err(ServeError::Refused { code, reason }) => {
                    conn_shared.refused.fetch_add(1, Ordering::Relaxed);
                    warn!(%peer, ?code, %reason, "RDMA client refused");
                }
                Err(e) => info!(%peer, error = %e, "RDMA exchange connection closed"),
            },
        )?;
        Ok(RdmaServer {
            shared,
            acceptor: Some(acceptor),
        })
    }

    /// The address of the exchange port.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.hub.addr()
    }

    /// A `tcp://HOST:PORT` url clients on this host can use in an `rdma_uverbs` durl.
    pub fn url(&self) -> String {
        listener::url(self.shared.hub.addr())
    }

    /// The name of the device serving the region.
    pub fn device_name(&self) -> &str {
        self.shared.pd.context().name()
    }

    /// The served region.
    pub fn region(&self) -> &Arc<MemoryRegion> {
        &self.shared.region
    }

    /// Clients connected right now.
    pub fn active_connections(&self) -> usize {
        self.shared.hub.active()
    }

    /// Counters so far.
    pub fn stats(&self) -> RdmaServerStats {
        RdmaServerStats {
            connections: self.shared.connections.load(Ordering::Relaxed),
            refused: self.shared.refused.load(Ordering::Relaxed)
                + self.shared.hub.refused()
                + self.shared.hub.refused_protected(),
        }
    }

    /// A handle that can stop the server from elsewhere.
    pub fn shutdown_handle(&self) -> RdmaShutdownHandle {
        RdmaShutdownHandle {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Blocks until some [`RdmaShutdownHandle`] stops the server, then finishes shutting down.
    pub fn wait(mut self) {
        self.shared.hub.wait_stopped();
        self.finish();
    }

    /// Stops accepting, disconnects every client (destroying its queue pair) and waits
    /// for every handler to end.
    pub fn shutdown(mut self) {
        self.finish();
    }

    fn finish(&mut self) {
        self.shared.hub.finish(self.acceptor.take());
        info!(addr = %self.shared.hub.addr(), "RDMA memory server stopped");
    }
}

impl Drop for RdmaServer {
    fn drop(&mut self) {
        if self.acceptor.is_some() {
            self.finish();
        }
    }
}

/// Tells a client the acceptor refuses why, in the exchange's terms.
fn refuse(stream: &mut TcpStream, why: Refusal) {
    let (code, reason) = match why {
        Refusal::AtLimit { limit } => (
            RefuseCode::Busy,
            format!("server is at its limit of {limit} connections"),
        ),
        Refusal::Protected => (RefuseCode::Protected, PROTECTED_MESSAGE.to_owned()),
    };
    session::refuse(stream, code, &reason);
    if why == Refusal::Protected {
        // On the connection's own thread: let the client read the refusal before the
        // close (its Connect message is read and discarded, at most for a moment).
        let _ = stream.shutdown(std::net::Shutdown::Write);
        let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
        let mut sink = [0u8; 4096];
        while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
    }
}

fn qp_config(config: &RdmaServerConfig) -> QpConfig {
    QpConfig {
        port: config.port,
        gid_index: config.gid_index,
        depth: 1,
        role: Role::Responder,
    }
}

/// Exchanges connection information with one client, then keeps its queue pair until
/// the client closes the connection (or shutdown closes it).
fn serve_client(shared: &Shared, mut stream: TcpStream) -> std::result::Result<(), ServeError> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(shared.config.handshake_timeout))?;
    stream.set_write_timeout(Some(shared.config.handshake_timeout))?;
    let qp = session::serve_exchange(&mut stream, shared.config.token.as_deref(), |client| {
        let prepared = PreparedQp::new(&shared.pd, qp_config(&shared.config))?;
        let mut ours = prepared.info();
        ours.rkey = shared.mr.rkey();
        ours.addr = shared.mr.addr();
        ours.size = shared.mr.len() as u64;
        let qp = prepared.handshake(client)?;
        Ok((ours, qp))
    })?;
    shared.connections.fetch_add(1, Ordering::Relaxed);
    debug!(
        qpn = qp.local().qpn,
        remote_qpn = qp.remote().qpn,
        "RDMA client connected"
    );
    stream.set_read_timeout(None)?;
    let mut scratch = [0u8; 64];
    loop {
        match stream.read(&mut scratch) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
        if shared.hub.is_stopping() {
            break;
        }
    }
    drop(qp);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::durl::Durl;

    /// The exchange side of protected mode, without RDMA hardware: a client the
    /// acceptor refuses (as it does a non-loopback client of a server with no token;
    /// the decision itself is `admit`, shared with the tcp server and tested there)
    /// gets a `Protected` refusal that says how to open the server, as `Error::Auth`.
    #[test]
    fn protected_mode_refusal_reaches_the_rdma_client_as_an_auth_error() {
        use crate::rdma::exchange::QpInfo;
        use crate::rdma::session::{client_exchange, ClientTimeouts};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            refuse(&mut stream, Refusal::Protected);
        });
        let timeouts = ClientTimeouts {
            connect: Duration::from_secs(5),
            exchange: Duration::from_secs(5),
        };
        let err = client_exchange(&addr, None, &QpInfo::default(), timeouts).unwrap_err();
        match &err {
            Error::Auth { message, .. } => {
                assert!(message.contains("protected mode"), "{message}");
                assert!(message.contains("--token") && message.contains("--unprotected"));
            }
            other => panic!("{other:?}"),
        }
        server.join().unwrap();
        assert_eq!(
            crate::server::admit("10.213.77.2".parse().unwrap(), false, false),
            crate::server::Admission::Protected
        );
    }

    #[test]
    fn server_without_a_device_says_which_device_is_missing() {
        let cfg = RdmaServerConfig {
            device: Some("scad-test-no-such-device".into()),
            ..RdmaServerConfig::default()
        };
        let err = RdmaServer::start("127.0.0.1:0", 4096, cfg).unwrap_err();
        assert!(
            matches!(&err, Error::NoDevice { requested: Some(n), .. } if n == "scad-test-no-such-device"),
            "{err:?}"
        );
    }

    #[test]
    fn server_durl_resolves_and_is_checked() {
        let d: Durl =
            "mem;rdma_uverbs_server;url,tcp://*:0;size,4096;device,scad-test-no-such-device;"
                .parse()
                .unwrap();
        let cfg = d.resolve().unwrap();
        assert!(matches!(
            &cfg,
            TransportConfig::UverbsServer {
                port: 1,
                gid_index: 0,
                size: 4096,
                ..
            }
        ));
        assert!(matches!(
            RdmaServer::from_config(&cfg),
            Err(Error::NoDevice { .. })
        ));
        assert!(matches!(
            RdmaServer::from_config(&TransportConfig::Local { size: 1 }),
            Err(Error::InvalidArgument(_))
        ));
    }
}
