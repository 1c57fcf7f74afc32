//! The [`Transport`] trait and its implementations.
//!
//! A transport reaches the flat address space of one memory element. Every
//! implementation checks offsets (an out-of-range access is an error, never memory
//! corruption), is `Send + Sync`, and counts the bytes and operations it moves.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::durl::TransportConfig;
use crate::error::{Error, Result};
use crate::memory::RegisteredBuffer;

pub mod local;
#[cfg(feature = "redis")]
pub mod redis;
pub mod shm;
pub mod tcp;

pub use local::LocalTransport;
#[cfg(feature = "redis")]
pub use redis::RedisTransport;
pub use shm::ShmTransport;
pub use tcp::{TcpOptions, TcpTransport};

/// One piece of a vectored read: fill `dst` from remote address `addr`.
#[derive(Debug)]
pub struct ReadOp<'a> {
    /// Remote address.
    pub addr: u64,
    /// Local destination; its length is the number of bytes read.
    pub dst: &'a mut [u8],
}

/// One piece of a vectored write: store `src` at remote address `addr`.
#[derive(Debug, Clone, Copy)]
pub struct WriteOp<'a> {
    /// Remote address.
    pub addr: u64,
    /// Local source; its length is the number of bytes written.
    pub src: &'a [u8],
}

/// A snapshot of a transport's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransportStats {
    /// Bytes moved from remote to local memory.
    pub bytes_read: u64,
    /// Bytes moved from local to remote memory.
    pub bytes_written: u64,
    /// Read calls (a vectored call counts once).
    ///
    /// Transports count what they were asked for; the frames or work requests a call
    /// was split into are not counted here.
    pub read_ops: u64,
    /// Write calls (a vectored call counts once).
    pub write_ops: u64,
}

impl fmt::Display for TransportStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "read {} B in {} ops, wrote {} B in {} ops",
            self.bytes_read, self.read_ops, self.bytes_written, self.write_ops
        )
    }
}

/// Lock-free counters behind [`TransportStats`].
#[derive(Debug, Default)]
pub struct Counters {
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    read_ops: AtomicU64,
    write_ops: AtomicU64,
}

impl Counters {
    /// Records one read call of `bytes` bytes.
    pub fn record_read(&self, bytes: u64) {
        self.bytes_read.fetch_add(bytes, Ordering::Relaxed);
        self.read_ops.fetch_add(1, Ordering::Relaxed);
    }

    /// Records one write call of `bytes` bytes.
    pub fn record_write(&self, bytes: u64) {
        self.bytes_written.fetch_add(bytes, Ordering::Relaxed);
        self.write_ops.fetch_add(1, Ordering::Relaxed);
    }

    /// The current values.
    pub fn snapshot(&self) -> TransportStats {
        TransportStats {
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            bytes_written: self.bytes_written.load(Ordering::Relaxed),
            read_ops: self.read_ops.load(Ordering::Relaxed),
            write_ops: self.write_ops.load(Ordering::Relaxed),
        }
    }
}

/// Access to the remote address space of one memory element.
///
/// Implementations are thread-safe: many threads may call any method at once. Calls on
/// overlapping remote ranges from different threads are not ordered with each other
/// (as with one-sided RDMA); calls on disjoint ranges never interfere.
pub trait Transport: Send + Sync + fmt::Debug {
    /// A short description of where the memory is (`"tcp://host:port"`, `"local"`).
    fn describe(&self) -> String;

    /// Size of the remote address space in bytes.
    ///
    /// # Errors
    /// Network errors for remote transports.
    fn remote_size(&self) -> Result<u64>;

    /// Reads `dst.len()` bytes at remote address `addr` into `dst`.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] if the range is outside the remote space; transport errors.
    fn read(&self, addr: u64, dst: &mut [u8]) -> Result<()>;

    /// Writes `src` at remote address `addr`.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] if the range is outside the remote space; transport errors.
    fn write(&self, addr: u64, src: &[u8]) -> Result<()>;

    /// Reads many ranges in one call. Remote transports send them in as few round
    /// trips as they can; this is what page caches use to fill many pages at once.
    ///
    /// # Errors
    /// As [`Transport::read`]; on error the contents of every `dst` are unspecified.
    fn read_vectored(&self, ops: &mut [ReadOp<'_>]) -> Result<()> {
        ops.iter_mut().try_for_each(|op| self.read(op.addr, op.dst))
    }

    /// Writes many ranges in one call.
    ///
    /// # Errors
    /// As [`Transport::write`]; on error some ranges may have been written.
    fn write_vectored(&self, ops: &[WriteOp<'_>]) -> Result<()> {
        ops.iter().try_for_each(|op| self.write(op.addr, op.src))
    }

    /// Reads `len` remote bytes at `addr` into `buf` at `offset` (the libd `read`).
    /// Transports that need registered memory (RDMA) override this.
    ///
    /// # Errors
    /// [`Error::BufferRange`] for a bad local range, and as [`Transport::read`].
    fn read_to_buffer(
        &self,
        buf: &RegisteredBuffer,
        offset: usize,
        len: usize,
        addr: u64,
    ) -> Result<()> {
        let mut dst = buf.range_mut(offset, len)?;
        self.read(addr, &mut dst)
    }

    /// Writes `len` bytes of `buf` at `offset` to remote address `addr` (the libd `write`).
    ///
    /// # Errors
    /// [`Error::BufferRange`] for a bad local range, and as [`Transport::write`].
    fn write_from_buffer(
        &self,
        buf: &RegisteredBuffer,
        offset: usize,
        len: usize,
        addr: u64,
    ) -> Result<()> {
        let src = buf.range(offset, len)?;
        self.write(addr, &src)
    }

    /// Counters of bytes and operations moved so far.
    fn stats(&self) -> TransportStats;
}

/// Checks a remote range against a known remote size, for transports that can check
/// locally before moving any data.
pub(crate) fn check_remote(op: &'static str, addr: u64, len: u64, size: u64) -> Result<()> {
    match addr.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(Error::OutOfRange {
            op,
            addr,
            len,
            size,
        }),
    }
}

/// Checks every `(addr, len)` against a known remote size; the first range outside it
/// is the error.
pub(crate) fn check_ranges(op: &'static str, ranges: &[(u64, usize)], size: u64) -> Result<()> {
    ranges
        .iter()
        .try_for_each(|&(addr, len)| check_remote(op, addr, len as u64, size))
}

/// Idle connections of a remote transport, kept for reuse: a call takes one (or
/// opens one when there is none) and gives it back when it succeeded, so each thread
/// of a shared transport works on its own connection.
#[derive(Debug)]
pub(crate) struct ConnectionPool<C> {
    idle: std::sync::Mutex<Vec<C>>,
    capacity: usize,
}

impl<C> ConnectionPool<C> {
    /// A pool keeping at most `capacity` idle connections.
    pub(crate) fn new(capacity: usize) -> Self {
        ConnectionPool {
            idle: std::sync::Mutex::new(Vec::new()),
            capacity,
        }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<C>> {
        self.idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// An idle connection (the most recently used), if any.
    pub(crate) fn take(&self) -> Option<C> {
        self.idle().pop()
    }

    /// A pooled connection (`true`) or a new one from `open` (`false`).
    pub(crate) fn take_or_open(&self, open: impl FnOnce() -> Result<C>) -> Result<(C, bool)> {
        match self.take() {
            Some(c) => Ok((c, true)),
            None => Ok((open()?, false)),
        }
    }

    /// Keeps `conn` for reuse, unless the pool is full (then it is dropped).
    pub(crate) fn put(&self, conn: C) {
        let mut idle = self.idle();
        if idle.len() < self.capacity {
            idle.push(conn);
        }
    }

    /// Drops every idle connection.
    pub(crate) fn clear(&self) {
        self.idle().clear();
    }
}

/// Opens a client transport for a complete configuration.
///
/// Server configurations (`rdma_tcp_server`, `rdma_uverbs_server`) are not transports:
/// start a [`crate::server::MemoryServer`] for them.
///
/// # Errors
/// [`Error::Unsupported`] for server kinds, for RDMA without the `rdma` feature and for
/// Redis without the `redis` feature;
/// errors of the transport's constructor.
pub fn open(name: &str, config: &TransportConfig) -> Result<Arc<dyn Transport>> {
    match config {
        TransportConfig::Local { size } => Ok(Arc::new(LocalTransport::new(*size)?)),
        TransportConfig::Shm { size, shm_id } => Ok(Arc::new(ShmTransport::open(shm_id, *size)?)),
        TransportConfig::Tcp {
            addr,
            token,
            timeout,
        } => {
            let mut options = TcpOptions::default();
            options.token.clone_from(token);
            if let Some(t) = timeout {
                options.timeout = *t;
            }
            Ok(Arc::new(TcpTransport::new(&addr.socket_addr_string(), options)))
        }
        #[cfg(feature = "rdma")]
        TransportConfig::Uverbs { .. } => Ok(Arc::new(crate::rdma::RdmaTransport::from_config(
            config,
        )?)),
        #[cfg(not(feature = "rdma"))]
        TransportConfig::Uverbs { .. } => Err(Error::Unsupported(format!(
            "transport {name:?} uses rdma_uverbs, which needs the `rdma` feature"
        ))),
        #[cfg(feature = "redis")]
        TransportConfig::Redis {
            addr,
            size,
            prefix,
            token,
            timeout,
        } => Ok(Arc::new(RedisTransport::connect(
            addr,
            *size,
            prefix,
            token.as_deref(),
            *timeout,
        )?)),
        #[cfg(not(feature = "redis"))]
        TransportConfig::Redis { .. } => Err(Error::Unsupported(format!(
            "transport {name:?} uses redis, which needs the `redis` feature"
        ))),
        TransportConfig::TcpServer { .. } | TransportConfig::UverbsServer { .. } => {
            Err(Error::Unsupported(format!(
                "transport {name:?} is the serving side of a memory element; start a memory server for it"
            )))
        }
    }
}
