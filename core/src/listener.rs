//! What every memory server does with its TCP listener, whatever it serves: bind,
//! accept, apply protected mode ([`admit`]), refuse clients over the connection limit,
//! run each connection on its own thread, and shut down by closing every connection and
//! joining every thread. The tcp [`crate::server::MemoryServer`] serves requests on its
//! connections; the RDMA server (feature `rdma`) exchanges queue-pair information on
//! them.

use std::collections::HashMap;
use std::io;
use std::net::{
    IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs,
};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use tracing::warn;

use crate::error::{Error, Result};

/// Whether a memory server serves a client, by [`admit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Serve it (it must still pass the token check, if there is a token).
    Serve,
    /// Refuse it: the server has no token and the client is not on this host.
    Protected,
}

/// Protected mode, as in Redis: a memory server started without a token serves only
/// clients on this host (loopback addresses), because anyone it serves may read and
/// write its whole address space. A server with a token (or region tokens) serves the
/// network, every client proving itself with the token first; `unprotected` (the
/// `--unprotected` flag, `SCAD_UNPROTECTED=1`) serves the network without one, for
/// those who accept that risk. Both the tcp and the RDMA server decide here.
///
/// IPv4-mapped IPv6 addresses count as their IPv4 address (`::ffff:127.0.0.1` is
/// loopback).
///
/// # Example
/// ```
/// use scad_core::server::{admit, Admission};
/// let lan = "10.0.0.7".parse().unwrap();
/// assert_eq!(admit(lan, false, false), Admission::Protected);
/// assert_eq!(admit(lan, true, false), Admission::Serve);
/// assert_eq!(admit("127.0.0.1".parse().unwrap(), false, false), Admission::Serve);
/// ```
pub fn admit(peer: IpAddr, token_configured: bool, unprotected: bool) -> Admission {
    if token_configured || unprotected || peer.to_canonical().is_loopback() {
        Admission::Serve
    } else {
        Admission::Protected
    }
}

/// What a client refused by protected mode is told (in the server's protocol) and the
/// log says: why, and the two ways to open the server.
pub(crate) const PROTECTED_MESSAGE: &str = "memory server is in protected mode: it has no \
    token, so it serves only clients on its own host (loopback). To serve the network, \
    start it with --token SECRET (SCAD_TOKEN; clients add token,SECRET; to their durl), \
    or accept that anyone who can reach the port may read and write all of its memory \
    and start it with --unprotected (SCAD_UNPROTECTED=1)";

/// Why the acceptor refuses a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The server serves its limit of connections already.
    AtLimit {
        /// The limit.
        limit: usize,
    },
    /// Protected mode ([`admit`]): no token, and the client is not on this host.
    Protected,
}

/// Who a listener serves: the inputs of [`admit`] besides the peer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Protection {
    /// A token (or region tokens) is configured.
    pub(crate) token_configured: bool,
    /// The operator accepted serving the network without a token.
    pub(crate) unprotected: bool,
}

/// Binds `addr` (`"0.0.0.0:2333"`; port 0 picks a free one); errors name `addr` and
/// what failed.
pub(crate) fn bind(addr: &str) -> Result<(TcpListener, SocketAddr)> {
    let server_err = |reason: &str, source: io::Error| Error::Server {
        addr: addr.to_owned(),
        reason: reason.to_owned(),
        source: Some(source),
    };
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| server_err("cannot resolve", e))?
        .collect();
    let listener = TcpListener::bind(&addrs[..]).map_err(|e| server_err("cannot bind", e))?;
    let local = listener
        .local_addr()
        .map_err(|e| server_err("cannot read the bound address", e))?;
    Ok((listener, local))
}

/// Where to connect to reach a listener bound to `addr` (wildcards become loopback).
pub(crate) fn connectable(addr: SocketAddr) -> SocketAddr {
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

/// A `tcp://HOST:PORT` url that clients on this host can use for a listener on `addr`.
pub(crate) fn url(addr: SocketAddr) -> String {
    let addr = connectable(addr);
    match addr.ip() {
        IpAddr::V6(ip) => format!("tcp://[{ip}]:{}", addr.port()),
        IpAddr::V4(ip) => format!("tcp://{ip}:{}", addr.port()),
    }
}

#[derive(Debug, Default)]
struct Live {
    streams: HashMap<u64, TcpStream>,
    handlers: Vec<JoinHandle<()>>,
}

/// The connections of one listener: the limit, the live connections and their
/// threads, and the stop flag.
#[derive(Debug)]
pub(crate) struct Hub {
    addr: SocketAddr,
    max_connections: usize,
    protection: Protection,
    stopping: AtomicBool,
    active: AtomicUsize,
    accepted: AtomicU64,
    refused: AtomicU64,
    protected: AtomicU64,
    live: Mutex<Live>,
    stopped: Mutex<bool>,
    stopped_cv: Condvar,
}

impl Hub {
    /// A hub for a listener bound to `addr`.
    pub(crate) fn new(addr: SocketAddr, max_connections: usize, protection: Protection) -> Self {
        if !protection.token_configured && protection.unprotected && !addr.ip().is_loopback() {
            warn!(
                %addr,
                "serving the network without a token (--unprotected): anyone who can reach \
                 this port may read and write all of this server's memory"
            );
        }
        Hub {
            addr,
            max_connections,
            protection,
            stopping: AtomicBool::new(false),
            active: AtomicUsize::new(0),
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            protected: AtomicU64::new(0),
            live: Mutex::new(Live::default()),
            stopped: Mutex::new(false),
            stopped_cv: Condvar::new(),
        }
    }

    /// The bound address.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections being served right now.
    pub(crate) fn active(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    /// Connections accepted and handed to a thread so far.
    pub(crate) fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Connections refused at the limit so far.
    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Connections refused by protected mode so far.
    pub(crate) fn refused_protected(&self) -> u64 {
        self.protected.load(Ordering::Relaxed)
    }

    /// True once shutdown has begun.
    pub(crate) fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }

    /// Stops accepting and wakes [`Hub::wait_stopped`]; returns at once.
    pub(crate) fn begin_shutdown(&self) {
        if self.stopping.swap(true, Ordering::SeqCst) {
            return;
        }
        // Wake the blocking accept with a connection of our own.
        let _ = TcpStream::connect_timeout(&connectable(self.addr), Duration::from_secs(1));
        let mut stopped = self.stopped.lock().unwrap_or_else(PoisonError::into_inner);
        *stopped = true;
        self.stopped_cv.notify_all();
    }

    /// Blocks until [`Hub::begin_shutdown`] has been called.
    pub(crate) fn wait_stopped(&self) {
        let mut stopped = self.stopped.lock().unwrap_or_else(PoisonError::into_inner);
        while !*stopped {
            stopped = self
                .stopped_cv
                .wait(stopped)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Stops accepting, joins the accept thread, closes every connection and joins
    /// every connection thread.
    pub(crate) fn finish(&self, acceptor: Option<JoinHandle<()>>) {
        self.begin_shutdown();
        if let Some(acceptor) = acceptor {
            let _ = acceptor.join();
        }
        let handlers = {
            let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
            for stream in live.streams.values() {
                let _ = stream.shutdown(Shutdown::Both);
            }
            std::mem::take(&mut live.handlers)
        };
        for h in handlers {
            let _ = h.join();
        }
    }
}

/// Starts the accept thread of `listener`. A client that protected mode refuses
/// ([`admit`]), or that comes over the hub's connection limit, is handed to `refuse`
/// (which tells it why, in its protocol) and dropped; every other one gets its own
/// thread running `serve(stream, peer)`. Limit refusals run on the accept thread (they
/// must not wait for the client); protected-mode refusals run on a connection thread
/// (counted against the limit), which can linger until the client has read why.
pub(crate) fn spawn_acceptor<R, S>(
    hub: Arc<Hub>,
    listener: TcpListener,
    thread_prefix: &'static str,
    refuse: R,
    serve: S,
) -> Result<JoinHandle<()>>
where
    R: Fn(&mut TcpStream, &str, Refusal) + Send + Sync + 'static,
    S: Fn(TcpStream, &str) + Send + Sync + 'static,
{
    let addr = hub.addr;
    std::thread::Builder::new()
        .name(format!("{thread_prefix}-accept-{}", addr.port()))
        .spawn(move || {
            accept_loop(
                &hub,
                &listener,
                thread_prefix,
                &Arc::new(refuse),
                &Arc::new(serve),
            )
        })
        .map_err(|e| Error::Server {
            addr: addr.to_string(),
            reason: "cannot spawn the accept thread".into(),
            source: Some(e),
        })
}

fn accept_loop<R, S>(
    hub: &Arc<Hub>,
    listener: &TcpListener,
    thread_prefix: &str,
    refuse: &Arc<R>,
    serve: &Arc<S>,
) where
    R: Fn(&mut TcpStream, &str, Refusal) + Send + Sync + 'static,
    S: Fn(TcpStream, &str) + Send + Sync + 'static,
{
    let mut next_id = 0u64;
    for stream in listener.incoming() {
        if hub.stopping.load(Ordering::SeqCst) {
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
        let peer_addr = stream.peer_addr().ok();
        let peer = peer_addr.map_or_else(|| "?".to_owned(), |a| a.to_string());
        let admission = match peer_addr {
            Some(a) => admit(
                a.ip(),
                hub.protection.token_configured,
                hub.protection.unprotected,
            ),
            // No address to judge: only a server that serves the network may serve it.
            None if hub.protection.token_configured || hub.protection.unprotected => {
                Admission::Serve
            }
            None => Admission::Protected,
        };
        if hub.active.load(Ordering::SeqCst) >= hub.max_connections {
            hub.refused.fetch_add(1, Ordering::Relaxed);
            warn!(%peer, limit = hub.max_connections, "connection refused: at the connection limit");
            let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
            refuse(
                &mut stream,
                &peer,
                Refusal::AtLimit {
                    limit: hub.max_connections,
                },
            );
            continue;
        }
        if admission == Admission::Protected {
            hub.protected.fetch_add(1, Ordering::Relaxed);
            warn!(
                %peer,
                "connection refused: protected mode (no token, client not on this host); \
                 start the server with --token SECRET to serve the network, or with \
                 --unprotected (SCAD_UNPROTECTED=1) to accept the risk"
            );
        }
        next_id += 1;
        let slot = ConnectionSlot::take(hub, next_id, stream.try_clone().ok());
        let serve = Arc::clone(serve);
        let refuse = Arc::clone(refuse);
        if admission == Admission::Serve {
            hub.accepted.fetch_add(1, Ordering::Relaxed);
        }
        let spawned = std::thread::Builder::new()
            .name(format!("{thread_prefix}-conn-{next_id}"))
            .spawn(move || {
                // Released when the handler ends, by returning or by panicking.
                let _slot = slot;
                let mut stream = stream;
                match admission {
                    Admission::Serve => serve(stream, &peer),
                    Admission::Protected => {
                        let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
                        refuse(&mut stream, &peer, Refusal::Protected);
                    }
                }
            });
        // A thread that could not be spawned dropped its closure, and the slot in it.
        match spawned {
            Ok(h) => {
                let mut live = hub.live.lock().unwrap_or_else(PoisonError::into_inner);
                live.handlers.retain(|h| !h.is_finished());
                live.handlers.push(h);
            }
            Err(e) => warn!(error = %e, "cannot spawn a connection thread"),
        }
    }
}

/// One connection's place under the hub's limit: counted while it lives, its stream
/// registered for shutdown; both released when it drops (a handler that panics
/// releases it too).
struct ConnectionSlot {
    hub: Arc<Hub>,
    id: u64,
}

impl ConnectionSlot {
    fn take(hub: &Arc<Hub>, id: u64, stream: Option<TcpStream>) -> Self {
        hub.active.fetch_add(1, Ordering::SeqCst);
        if let Some(stream) = stream {
            hub.live
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .streams
                .insert(id, stream);
        }
        ConnectionSlot {
            hub: Arc::clone(hub),
            id,
        }
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.hub
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .streams
            .remove(&self.id);
        self.hub.active.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handler_that_panics_gives_its_connection_slot_back() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let hub = Arc::new(Hub::new(
            addr,
            1,
            Protection {
                token_configured: false,
                unprotected: false,
            },
        ));
        let acceptor = spawn_acceptor(
            Arc::clone(&hub),
            listener,
            "test",
            |_, _, _| {},
            |_stream, _peer| panic!("a handler bug"),
        )
        .unwrap();
        // With a limit of one connection, the second and third are served only if
        // the panicking handlers before them released their slots.
        for served in 1..=3 {
            let _c = TcpStream::connect(addr).unwrap();
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while hub.accepted() < served || hub.active() > 0 {
                assert!(std::time::Instant::now() < deadline, "slot never released");
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        assert_eq!(hub.accepted(), 3);
        assert_eq!(hub.refused(), 0);
        assert_eq!(hub.active(), 0);
        hub.finish(Some(acceptor));
    }

    #[test]
    fn connectable_turns_wildcards_into_loopback() {
        let a: SocketAddr = "0.0.0.0:5".parse().unwrap();
        assert_eq!(connectable(a).to_string(), "127.0.0.1:5");
        let a: SocketAddr = "[::]:5".parse().unwrap();
        assert_eq!(connectable(a).to_string(), "[::1]:5");
        assert_eq!(url("[::]:7".parse().unwrap()), "tcp://[::1]:7");
        assert_eq!(url("10.0.0.1:7".parse().unwrap()), "tcp://10.0.0.1:7");
    }

    #[test]
    fn protected_mode_serves_loopback_only_unless_a_token_or_the_flag_opens_it() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let local = ["127.0.0.1", "127.8.9.10", "::1", "::ffff:127.0.0.1"];
        let remote = [
            "10.213.77.2",
            "192.168.1.5",
            "0.0.0.0",
            "::",
            "fe80::1",
            "2001:db8::1",
            "::ffff:10.0.0.1",
        ];
        for peer in local {
            for (token, open) in [(false, false), (true, false), (false, true), (true, true)] {
                assert_eq!(admit(ip(peer), token, open), Admission::Serve, "{peer}");
            }
        }
        for peer in remote {
            assert_eq!(
                admit(ip(peer), false, false),
                Admission::Protected,
                "{peer}"
            );
            assert_eq!(admit(ip(peer), true, false), Admission::Serve, "{peer}");
            assert_eq!(admit(ip(peer), false, true), Admission::Serve, "{peer}");
            assert_eq!(admit(ip(peer), true, true), Admission::Serve, "{peer}");
        }
        assert!(
            PROTECTED_MESSAGE.contains("--token") && PROTECTED_MESSAGE.contains("--unprotected")
        );
    }

    #[test]
    fn bad_addresses_are_server_errors() {
        assert!(matches!(bind("no address"), Err(Error::Server { .. })));
    }
}
