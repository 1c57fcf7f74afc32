//! [`Cluster`]: the memory elements queries run over — embedded memory servers,
//! running `memory_server` processes, shared memory, local memory or Redis — as one
//! [`MemoryElements`] registry under a frame environment.

use std::sync::Arc;
use std::time::Duration;

use scad_core::server::{MemoryServer, ServerConfig};
use scad_core::transport::{LocalTransport, ShmTransport, TcpOptions, TcpTransport};
use scad_core::Transport;
use scad_remote_array::MemoryElements;
use scad_remote_frame::{FrameEnv, DEFAULT_CHUNK_ROWS};

use super::error::RemoteError;

/// Alignment of allocations in memory elements (the frames' buffer alignment).
pub(super) const ALIGN: u64 = 64;

/// How the memory elements are reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportKind {
    /// Memory servers over TCP (embedded in this process, or running elsewhere).
    Tcp,
    /// POSIX shared memory segments created by this process.
    Shm,
    /// Plain local memory (no transport cost; a lower bound).
    Local,
    /// A Redis server as the intermediate store (feature `redis`).
    Redis,
}

impl std::str::FromStr for TransportKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "tcp" => Ok(TransportKind::Tcp),
            "shm" => Ok(TransportKind::Shm),
            "local" => Ok(TransportKind::Local),
            "redis" => Ok(TransportKind::Redis),
            other => Err(format!(
                "unknown transport {other:?} (tcp, shm, local, redis)"
            )),
        }
    }
}

impl std::fmt::Display for TransportKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TransportKind::Tcp => "tcp",
            TransportKind::Shm => "shm",
            TransportKind::Local => "local",
            TransportKind::Redis => "redis",
        })
    }
}

/// Memory elements `mem0`, `mem1`, ... and the environment frames live in.
pub struct Cluster {
    env: FrameEnv,
    /// Embedded servers, kept alive as long as the cluster.
    servers: Vec<MemoryServer>,
    description: String,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("elements", &self.element_names())
            .field("description", &self.description)
            .finish_non_exhaustive()
    }
}

fn transport_err(context: String) -> impl FnOnce(scad_core::Error) -> RemoteError {
    move |source| RemoteError::Transport { context, source }
}

fn tcp_options() -> TcpOptions {
    TcpOptions {
        timeout: Duration::from_secs(60),
        connect_timeout: Duration::from_secs(10),
        ..TcpOptions::default()
    }
}

impl Cluster {
    /// A cluster over the given transports, named `mem0`, `mem1`, ... in order.
    ///
    /// # Errors
    /// [`RemoteError::Alloc`] if an element cannot be registered (its size unknown).
    pub fn from_transports(
        transports: Vec<Arc<dyn Transport>>,
        description: impl Into<String>,
    ) -> Result<Self, RemoteError> {
        let elements = Arc::new(MemoryElements::with_alignment(ALIGN));
        for (i, t) in transports.into_iter().enumerate() {
            let name = format!("mem{i}");
            let what = t.describe();
            elements
                .add(&name, t)
                .map_err(|source| RemoteError::Alloc {
                    context: format!("registering memory element {name} ({what})"),
                    source,
                })?;
        }
        if elements.is_empty() {
            return Err(RemoteError::Invalid(
                "a cluster needs at least one memory element".into(),
            ));
        }
        Ok(Cluster {
            env: FrameEnv::new(elements).with_chunk_rows(DEFAULT_CHUNK_ROWS),
            servers: Vec::new(),
            description: description.into(),
        })
    }

    /// `count` memory elements of `size` bytes each, made by this process: embedded
    /// memory servers on loopback TCP, shared-memory segments or local memory.
    ///
    /// # Errors
    /// [`RemoteError::Invalid`] for [`TransportKind::Redis`] (see [`Cluster::redis`]);
    /// transport errors.
    pub fn embedded(kind: TransportKind, count: usize, size: u64) -> Result<Self, RemoteError> {
        let mut servers = Vec::new();
        let mut transports: Vec<Arc<dyn Transport>> = Vec::new();
        for i in 0..count {
            let t: Arc<dyn Transport> = match kind {
                TransportKind::Tcp => {
                    let s = MemoryServer::start("127.0.0.1:0", size, ServerConfig::default())
                        .map_err(transport_err(format!(
                            "starting embedded memory server {i}"
                        )))?;
                    let addr = s.local_addr().to_string();
                    servers.push(s);
                    Arc::new(
                        TcpTransport::connect(&addr, tcp_options())
                            .map_err(transport_err(format!("connecting to {addr}")))?,
                    )
                }
                TransportKind::Shm => {
                    let id = format!("tpcds-{}-{i}", std::process::id());
                    Arc::new(
                        ShmTransport::open(&id, size)
                            .map_err(transport_err(format!("creating shared memory {id}")))?,
                    )
                }
                TransportKind::Local => Arc::new(
                    LocalTransport::new(size)
                        .map_err(transport_err(format!("allocating local element {i}")))?,
                ),
                TransportKind::Redis => {
                    return Err(RemoteError::Invalid(
                        "redis elements live in a Redis server: use Cluster::redis".into(),
                    ))
                }
            };
            transports.push(t);
        }
        let mut c = Self::from_transports(
            transports,
            format!("{count} embedded {kind} element(s) of {} MiB", size >> 20),
        )?;
        c.servers = servers;
        Ok(c)
    }

    /// Memory servers already running at `addrs` (`HOST:PORT`, e.g. `memory_server`
    /// processes), element `memI` = `addrs[I]`.
    ///
    /// # Errors
    /// Connection errors naming the address.
    pub fn connect_tcp(addrs: &[String]) -> Result<Self, RemoteError> {
        let mut transports: Vec<Arc<dyn Transport>> = Vec::new();
        for addr in addrs {
            transports.push(Arc::new(
                TcpTransport::connect(addr, tcp_options())
                    .map_err(transport_err(format!("connecting to memory server {addr}")))?,
            ));
        }
        Self::from_transports(transports, format!("memory servers {}", addrs.join(",")))
    }

    /// `count` elements of `size` bytes each in the Redis server at `addr`
    /// (`HOST:PORT`), under key prefixes `PREFIX-memI`.
    ///
    /// # Errors
    /// [`RemoteError::Invalid`] without the `redis` feature; connection errors.
    #[cfg(feature = "redis")]
    pub fn redis(addr: &str, count: usize, size: u64, prefix: &str) -> Result<Self, RemoteError> {
        let hp = parse_host_port(addr)?;
        let mut transports: Vec<Arc<dyn Transport>> = Vec::new();
        for i in 0..count {
            let t = scad_core::transport::RedisTransport::connect(
                &hp,
                size,
                &format!("{prefix}-mem{i}"),
                None,
                Some(Duration::from_secs(60)),
            )
            .map_err(transport_err(format!("connecting to redis at {addr}")))?;
            transports.push(Arc::new(t));
        }
        Self::from_transports(transports, format!("{count} redis element(s) at {addr}"))
    }

    /// Without the `redis` feature: always an error.
    ///
    /// # Errors
    /// Always [`RemoteError::Invalid`].
    #[cfg(not(feature = "redis"))]
    pub fn redis(
        addr: &str,
        _count: usize,
        _size: u64,
        _prefix: &str,
    ) -> Result<Self, RemoteError> {
        Err(RemoteError::Invalid(format!(
            "redis at {addr}: this build lacks the `redis` feature of scad-tpcds"
        )))
    }

    /// The environment (unlimited budget; queries derive budgeted ones from it).
    pub fn env(&self) -> &FrameEnv {
        &self.env
    }

    /// Free bytes over all memory elements, as this process's allocators see them
    /// (what a query must give back).
    pub fn available_bytes(&self) -> u64 {
        self.env
            .elements()
            .allocation_state()
            .allocators
            .iter()
            .map(|a| a.available())
            .sum()
    }

    /// The same elements with `rows` rows per stored chunk of new frames.
    pub fn set_chunk_rows(&mut self, rows: usize) {
        self.env = self.env.with_chunk_rows(rows);
    }

    /// Element names in order.
    pub fn element_names(&self) -> Vec<String> {
        self.env.elements().names()
    }

    /// Addresses of the embedded memory servers (empty for other kinds).
    pub fn server_addrs(&self) -> Vec<String> {
        self.servers
            .iter()
            .map(|s| s.local_addr().to_string())
            .collect()
    }

    /// What the elements are, for reports.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// The transport of element `name`.
    ///
    /// # Errors
    /// [`RemoteError::Invalid`] naming the known elements.
    pub fn transport(&self, name: &str) -> Result<Arc<dyn Transport>, RemoteError> {
        self.env.elements().transport(name).map_err(|_| {
            RemoteError::Invalid(format!(
                "memory element {name:?} is not in this cluster (it has {})",
                self.element_names().join(", ")
            ))
        })
    }
}

/// Parses `HOST:PORT`.
///
/// # Errors
/// [`RemoteError::Invalid`] for anything else.
#[cfg(feature = "redis")]
fn parse_host_port(addr: &str) -> Result<scad_core::durl::HostPort, RemoteError> {
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| RemoteError::Invalid(format!("{addr:?} is not HOST:PORT")))?;
    let port = port
        .parse::<u16>()
        .map_err(|_| RemoteError::Invalid(format!("{addr:?}: bad port")))?;
    Ok(scad_core::durl::HostPort {
        host: host.trim_matches(['[', ']']).to_string(),
        port,
    })
}
