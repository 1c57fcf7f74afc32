//! Test fixtures: stores over in-process memory servers (tcp) or local transports.

#![allow(dead_code, clippy::unwrap_used)] // test fixtures: a failure here is a broken test setup

use std::sync::Arc;
use std::time::Duration;

use scad_core::server::{MemoryServer, ServerConfig};
use scad_core::transport::{LocalTransport, TcpOptions, TcpTransport};
use scad_core::Transport;
use scad_remote_array::{BufferPool, EvictionPolicy, MemoryElements, RemoteStore};

/// Which transport the memory elements are reached through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Local,
    Tcp,
}

pub const BACKENDS: [Backend; 2] = [Backend::Local, Backend::Tcp];

/// A store and what keeps its memory elements alive.
pub struct Env {
    pub backend: Backend,
    pub store: Arc<RemoteStore>,
    pub servers: Vec<MemoryServer>,
}

pub fn tcp_options() -> TcpOptions {
    TcpOptions {
        timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(2),
        ..TcpOptions::default()
    }
}

/// Settings of a test environment.
#[derive(Debug, Clone, Copy)]
pub struct Setup {
    pub elements: usize,
    pub element_bytes: u64,
    pub pool_bytes: usize,
    pub page: usize,
    pub policy: EvictionPolicy,
    pub read_ahead: usize,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            elements: 2,
            element_bytes: 1 << 20,
            pool_bytes: 8 * 1024,
            page: 256,
            policy: EvictionPolicy::Clock,
            read_ahead: 2,
        }
    }
}

pub fn pool(setup: &Setup) -> Arc<BufferPool> {
    Arc::new(
        BufferPool::builder(setup.pool_bytes)
            .page_size(setup.page)
            .policy(setup.policy)
            .read_ahead(setup.read_ahead)
            .elements(Arc::new(MemoryElements::with_alignment(64)))
            .build()
            .unwrap(),
    )
}

pub fn env(backend: Backend, setup: Setup) -> Env {
    let store = Arc::new(RemoteStore::new(pool(&setup)));
    let mut servers = Vec::new();
    for i in 0..setup.elements {
        let t: Arc<dyn Transport> = match backend {
            Backend::Local => Arc::new(LocalTransport::new(setup.element_bytes).unwrap()),
            Backend::Tcp => {
                let s = MemoryServer::start(
                    "127.0.0.1:0",
                    setup.element_bytes,
                    ServerConfig::default(),
                )
                .unwrap();
                let t = TcpTransport::connect(&s.local_addr().to_string(), tcp_options()).unwrap();
                servers.push(s);
                Arc::new(t)
            }
        };
        store.elements().add(&format!("mem{i}"), t).unwrap();
    }
    Env {
        backend,
        store,
        servers,
    }
}

/// A second store over the same memory elements (a later compute element), with its
/// own pool and transports.
pub fn reopen(env: &Env, setup: Setup) -> Arc<RemoteStore> {
    assert_eq!(
        env.backend,
        Backend::Tcp,
        "local regions are private to their store"
    );
    let store = Arc::new(RemoteStore::new(pool(&setup)));
    for (i, s) in env.servers.iter().enumerate() {
        let t = TcpTransport::connect(&s.local_addr().to_string(), tcp_options()).unwrap();
        store
            .elements()
            .add(&format!("mem{i}"), Arc::new(t))
            .unwrap();
    }
    store
}
