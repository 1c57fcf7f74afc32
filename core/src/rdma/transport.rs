//! `rdma_uverbs`: the client transport, one-sided READ and WRITE over RC queue pairs.

use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::mr::{Access, Mr};
use super::pd::{self, Pd};
use super::qp::{ConnectedQp, Opcode, PreparedQp, QpConfig, Role, WorkRequest};
use super::session::{self, ClientTimeouts};
use crate::durl::TransportConfig;
use crate::error::{Error, Result};
use crate::memory::RegisteredBuffer;
use crate::transport::{
    check_ranges, check_remote, ConnectionPool, Counters, ReadOp, Transport, TransportStats,
    WriteOp,
};

/// Settings of an [`RdmaTransport`].
#[derive(Debug, Clone)]
pub struct RdmaOptions {
    /// Shared secret presented to the server.
    pub token: Option<String>,
    /// How long one operation (or the connection exchange) may take before it fails.
    pub timeout: Duration,
    /// How long connecting to the exchange port may take.
    pub connect_timeout: Duration,
    /// Device name (`mlx5_0`); the first device found when `None`.
    pub device: Option<String>,
    /// Device port, from 1.
    pub port: u8,
    /// GID table index (on RoCE, pick the RoCE v2 entry that [`super::list_devices`] shows).
    pub gid_index: u8,
    /// Bytes of the registered bounce buffer each connection keeps for the plain-slice
    /// calls (`read`, `write` and their vectored forms); larger transfers go through it
    /// in pieces.
    pub bounce_size: usize,
    /// Send-queue depth: the longest chain of work requests posted at once.
    pub queue_depth: u32,
    /// Idle connections (queue pairs) kept for reuse; concurrent callers each use their own.
    pub pool_size: usize,
    /// Registered buffers whose memory registration is kept for reuse.
    pub max_registrations: usize,
}

impl Default for RdmaOptions {
    fn default() -> Self {
        RdmaOptions {
            token: None,
            timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            device: None,
            port: 1,
            gid_index: 0,
            bounce_size: 4 << 20,
            queue_depth: 128,
            pool_size: 16,
            max_registrations: 64,
        }
    }
}

/// One queue pair to the server with its bounce buffer. Fields drop in order: the QP
/// first (no more work), then the exchange stream (the server tears down its side),
/// then the bounce registration, then the bounce memory.
#[derive(Debug)]
struct Connection {
    qp: ConnectedQp,
    _stream: TcpStream,
    bounce_mr: Mr,
    bounce: RegisteredBuffer,
}

/// A client of an [`super::RdmaServer`]: reads and writes its memory with one-sided
/// RDMA, the server's CPU taking no part.
///
/// Each concurrent caller uses its own queue pair (connections are pooled). Buffers
/// given to [`Transport::read_to_buffer`] and [`Transport::write_from_buffer`] are
/// registered on first use and the registration is cached, so the data moves straight
/// between the buffer and the remote memory; the plain-slice calls copy through a
/// registered bounce buffer.
#[derive(Debug)]
pub struct RdmaTransport {
    addr: String,
    options: RdmaOptions,
    pd: Arc<Pd>,
    pool: ConnectionPool<Connection>,
    size: AtomicU64,
    registrations: Mutex<Vec<(u64, Arc<Mr>)>>,
    counters: Counters,
}

/// Where one piece of a plain-slice transfer sits: which op, where in it, where in the
/// bounce buffer, how long, and at which remote address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Piece {
    op: usize,
    op_offset: usize,
    bounce_offset: usize,
    len: usize,
    remote: u64,
}

/// Splits transfers of `(remote addr, len)` into batches that each fit the bounce buffer
/// (`cap` bytes), with no piece longer than `max_msg`.
fn plan(ops: impl Iterator<Item = (u64, usize)>, cap: usize, max_msg: usize) -> Vec<Vec<Piece>> {
    let cap = cap.max(1);
    let max_msg = max_msg.max(1);
    let mut batches = Vec::new();
    let mut cur = Vec::new();
    let mut fill = 0;
    for (i, (addr, len)) in ops.enumerate() {
        let mut off = 0;
        while off < len {
            if fill == cap {
                batches.push(std::mem::take(&mut cur));
                fill = 0;
            }
            let n = (len - off).min(cap - fill).min(max_msg);
            cur.push(Piece {
                op: i,
                op_offset: off,
                bounce_offset: fill,
                len: n,
                remote: addr + off as u64,
            });
            fill += n;
            off += n;
        }
    }
    if !cur.is_empty() {
        batches.push(cur);
    }
    batches
}

/// Work requests moving `len` bytes between local `local` and remote `remote`, none
/// longer than `max_msg`.
fn split(local: u64, lkey: u32, remote: u64, len: usize, max_msg: usize) -> Vec<WorkRequest> {
    let max_msg = max_msg.clamp(1, u32::MAX as usize);
    (0..len)
        .step_by(max_msg)
        .map(|off| WorkRequest {
            local: local + off as u64,
            len: (len - off).min(max_msg) as u32,
            lkey,
            remote: remote + off as u64,
        })
        .collect()
}

impl RdmaTransport {
    /// A transport to the RDMA memory server whose exchange port is `addr`
    /// (`host:port`). Opens the device now (so a missing device shows here); connects
    /// on first use.
    ///
    /// # Errors
    /// [`Error::NoDevice`] naming the device asked for and those present;
    /// [`Error::Rdma`] if it cannot be opened.
    pub fn new(addr: &str, options: RdmaOptions) -> Result<Self> {
        let pd = pd::shared(options.device.as_deref())?;
        Ok(RdmaTransport {
            addr: addr.to_owned(),
            pool: ConnectionPool::new(options.pool_size),
            options,
            pd,
            size: AtomicU64::new(u64::MAX),
            registrations: Mutex::new(Vec::new()),
            counters: Counters::default(),
        })
    }

    /// Opens the device and connects at once, so a wrong address, token, port or GID
    /// shows here.
    ///
    /// # Errors
    /// As [`RdmaTransport::new`]; [`Error::Connect`], [`Error::Auth`], [`Error::Timeout`],
    /// [`Error::Rdma`] from the connection.
    pub fn connect(addr: &str, options: RdmaOptions) -> Result<Self> {
        let t = Self::new(addr, options)?;
        let conn = t.open_connection()?;
        t.checkin(conn);
        Ok(t)
    }

    /// A transport for an `rdma_uverbs` configuration (not connected until first use).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for another kind of configuration or a wildcard url;
    /// as [`RdmaTransport::new`].
    pub fn from_config(config: &TransportConfig) -> Result<Self> {
        let TransportConfig::Uverbs {
            addr,
            token,
            timeout,
            device,
            port,
            gid_index,
        } = config
        else {
            return Err(Error::InvalidArgument(format!(
                "an RDMA transport needs an rdma_uverbs configuration, not {config:?}"
            )));
        };
        if addr.host == "*" || addr.port == 0 {
            return Err(Error::InvalidArgument(format!(
                "the url of an rdma_uverbs client needs a concrete host and a non-zero port, not {addr}"
            )));
        }
        let mut options = RdmaOptions {
            token: token.clone(),
            device: device.clone(),
            port: *port,
            gid_index: *gid_index,
            ..RdmaOptions::default()
        };
        if let Some(t) = timeout {
            options.timeout = *t;
        }
        Self::new(&addr.socket_addr_string(), options)
    }

    /// The name of the device in use.
    pub fn device_name(&self) -> &str {
        self.pd.context().name()
    }

    fn open_connection(&self) -> Result<Connection> {
        let bounce = RegisteredBuffer::new(self.options.bounce_size.max(4096))?;
        // SAFETY: `bounce` is a live allocation of `bounce.len()` bytes; Access::Local
        // lets the device touch it only through our work requests, and the Connection
        // drops this registration before the buffer (field order).
        let bounce_mr =
            unsafe { Mr::register(&self.pd, bounce.as_ptr(), bounce.len(), Access::Local) }?;
        let prepared = PreparedQp::new(
            &self.pd,
            QpConfig {
                port: self.options.port,
                gid_index: self.options.gid_index,
                depth: self.options.queue_depth,
                role: Role::Initiator,
            },
        )?;
        let (stream, remote) = session::client_exchange(
            &self.addr,
            self.options.token.as_deref(),
            &prepared.info(),
            ClientTimeouts {
                connect: self.options.connect_timeout,
                exchange: self.options.timeout,
            },
        )?;
        if remote.addr.checked_add(remote.size).is_none() {
            return Err(Error::Rdma {
                op: "connect",
                reason: format!(
                    "server {} announced memory at {:#x} of {} bytes, which wraps around",
                    self.addr, remote.addr, remote.size
                ),
                source: None,
            });
        }
        let qp = prepared.handshake(&remote)?;
        self.size.store(remote.size, Ordering::Relaxed);
        tracing::debug!(
            server = %self.addr,
            device = self.device_name(),
            qpn = qp.local().qpn,
            remote_qpn = remote.qpn,
            size = remote.size,
            "RDMA queue pair connected"
        );
        Ok(Connection {
            qp,
            _stream: stream,
            bounce_mr,
            bounce,
        })
    }

    fn checkin(&self, conn: Connection) {
        if !conn.qp.is_broken() {
            self.pool.put(conn);
        }
    }

    /// Runs `f` on a connection after checking every `(addr, len)` against the remote
    /// size. A connection whose queue pair broke is dropped (destroying the QP) before
    /// this returns.
    fn with_connection<T>(
        &self,
        op: &'static str,
        ranges: &[(u64, usize)],
        f: impl FnOnce(&mut Connection) -> Result<T>,
    ) -> Result<T> {
        let (mut conn, _) = self.pool.take_or_open(|| self.open_connection())?;
        if let Err(e) = check_ranges(op, ranges, conn.qp.remote().size) {
            self.checkin(conn);
            return Err(e);
        }
        let result = f(&mut conn);
        self.checkin(conn);
        result
    }

    /// The cached registration of `buf`, registering it on first use. Keyed by the
    /// buffer's process-unique id, so a new buffer at a reused address is registered
    /// afresh rather than mistaken for the old one.
    fn registration(&self, buf: &RegisteredBuffer) -> Result<Arc<Mr>> {
        let id = buf.id();
        let mut cache = self
            .registrations
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(pos) = cache.iter().position(|(i, _)| *i == id) {
            let entry = cache.remove(pos);
            let mr = Arc::clone(&entry.1);
            cache.push(entry);
            return Ok(mr);
        }
        // SAFETY: `buf` is a live allocation of `buf.len()` bytes. Access::Local: the
        // device touches it only through work requests, which we post only while holding
        // a guard of `buf` (so it is alive); an entry outliving its buffer is never named
        // again, ids being unique (see Mr::register).
        let mr =
            Arc::new(unsafe { Mr::register(&self.pd, buf.as_ptr(), buf.len(), Access::Local) }?);
        cache.push((id, Arc::clone(&mr)));
        if cache.len() > self.options.max_registrations.max(1) {
            cache.remove(0);
        }
        Ok(mr)
    }

    /// Reads into (or writes from) `len` bytes at `local`, inside registration `mr`.
    ///
    /// # Safety
    /// `local..local + len` lies inside `mr`'s memory, which is alive, and for a read
    /// nothing else touches it (for a write nothing writes it) until this returns.
    unsafe fn direct(
        &self,
        op: Opcode,
        mr: &Mr,
        local: *mut u8,
        len: usize,
        addr: u64,
    ) -> Result<()> {
        let name = match op {
            Opcode::Read => "read",
            Opcode::Write => "write",
        };
        if !mr.contains(local as u64, len) {
            return Err(Error::InvalidArgument(format!(
                "local range of {len} bytes at {local:p} is outside its registration"
            )));
        }
        let timeout = self.options.timeout;
        self.with_connection(name, &[(addr, len)], |conn| {
            let remote = conn.qp.remote().addr + addr;
            let reqs = split(local as u64, mr.lkey(), remote, len, conn.qp.max_msg());
            // SAFETY: forwarded from this function's contract; the range was checked
            // against the remote size and the local registration above.
            unsafe { conn.qp.execute(op, &reqs, timeout) }
        })
    }
}

impl Connection {
    /// Posts one batch of pieces between the bounce buffer and remote memory.
    fn execute(&mut self, op: Opcode, batch: &[Piece], timeout: Duration) -> Result<()> {
        let base = self.bounce.as_ptr() as u64;
        let remote_base = self.qp.remote().addr;
        let lkey = self.bounce_mr.lkey();
        let reqs: Vec<WorkRequest> = batch
            .iter()
            .map(|p| WorkRequest {
                local: base + p.bounce_offset as u64,
                len: p.len as u32,
                lkey,
                remote: remote_base + p.remote,
            })
            .collect();
        // SAFETY: every piece lies inside the bounce buffer (plan keeps offset + len
        // within its capacity), which is registered by bounce_mr and alive; the
        // connection is exclusively ours and no guard of the bounce buffer is held
        // while this runs, so nothing else touches it.
        unsafe { self.qp.execute(op, &reqs, timeout) }
    }
}

impl Transport for RdmaTransport {
    fn describe(&self) -> String {
        format!(
            "rdma://{} (device {} port {})",
            self.addr,
            self.device_name(),
            self.options.port
        )
    }

    fn remote_size(&self) -> Result<u64> {
        let known = self.size.load(Ordering::Relaxed);
        if known != u64::MAX {
            return Ok(known);
        }
        self.with_connection("size", &[], |c| Ok(c.qp.remote().size))
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
        let timeout = self.options.timeout;
        self.with_connection("read", &ranges, |conn| {
            let batches = plan(ranges.iter().copied(), conn.bounce.len(), conn.qp.max_msg());
            for batch in &batches {
                conn.execute(Opcode::Read, batch, timeout)?;
                for p in batch {
                    let dst = &mut ops[p.op].dst[p.op_offset..p.op_offset + p.len];
                    conn.bounce.read_at(p.bounce_offset, dst)?;
                }
            }
            Ok(())
        })?;
        self.counters.record_read(bytes);
        Ok(())
    }

    fn write_vectored(&self, ops: &[WriteOp<'_>]) -> Result<()> {
        let bytes: u64 = ops.iter().map(|o| o.src.len() as u64).sum();
        let ranges: Vec<(u64, usize)> = ops.iter().map(|o| (o.addr, o.src.len())).collect();
        let timeout = self.options.timeout;
        self.with_connection("write", &ranges, |conn| {
            for batch in &plan(ranges.iter().copied(), conn.bounce.len(), conn.qp.max_msg()) {
                for p in batch {
                    let src = &ops[p.op].src[p.op_offset..p.op_offset + p.len];
                    conn.bounce.write_at(p.bounce_offset, src)?;
                }
                conn.execute(Opcode::Write, batch, timeout)?;
            }
            Ok(())
        })?;
        self.counters.record_write(bytes);
        Ok(())
    }

    fn read_to_buffer(
        &self,
        buf: &RegisteredBuffer,
        offset: usize,
        len: usize,
        addr: u64,
    ) -> Result<()> {
        let mut guard = buf.range_mut(offset, len)?;
        if len > 0 {
            let mr = self.registration(buf)?;
            // SAFETY: the guard is inside `buf`, which `mr` registers; it is exclusive
            // (no other reader or writer of these bytes) and held until after `direct`
            // returns, by which time the device is done with them.
            unsafe { self.direct(Opcode::Read, &mr, guard.as_mut_ptr(), len, addr) }?;
        } else {
            check_remote("read", addr, 0, self.remote_size()?)?;
        }
        drop(guard);
        self.counters.record_read(len as u64);
        Ok(())
    }

    fn write_from_buffer(
        &self,
        buf: &RegisteredBuffer,
        offset: usize,
        len: usize,
        addr: u64,
    ) -> Result<()> {
        let guard = buf.range(offset, len)?;
        if len > 0 {
            let mr = self.registration(buf)?;
            // SAFETY: the guard is inside `buf`, which `mr` registers; being a shared
            // guard, nothing writes these bytes while it is held, which is until after
            // `direct` returns. The device only reads them.
            unsafe { self.direct(Opcode::Write, &mr, guard.as_ptr().cast_mut(), len, addr) }?;
        } else {
            check_remote("write", addr, 0, self.remote_size()?)?;
        }
        drop(guard);
        self.counters.record_write(len as u64);
        Ok(())
    }

    fn stats(&self) -> TransportStats {
        self.counters.snapshot()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::durl::Durl;

    #[test]
    fn plan_fills_the_bounce_buffer_and_splits_long_ops() {
        let batches = plan([(100, 10), (0, 0), (1000, 25), (5, 3)].into_iter(), 16, 8);
        let flat: Vec<(usize, usize, usize, usize, u64)> = batches
            .iter()
            .flatten()
            .map(|p| (p.op, p.op_offset, p.bounce_offset, p.len, p.remote))
            .collect();
        assert_eq!(
            flat,
            vec![
                (0, 0, 0, 8, 100),
                (0, 8, 8, 2, 108),
                (2, 0, 10, 6, 1000),
                (2, 6, 0, 8, 1006),
                (2, 14, 8, 8, 1014),
                (2, 22, 0, 3, 1022),
                (3, 0, 3, 3, 5),
            ]
        );
        assert_eq!(batches.len(), 3);
        for b in &batches {
            assert!(b.iter().map(|p| p.len).sum::<usize>() <= 16);
            assert!(b.iter().all(|p| p.bounce_offset + p.len <= 16));
        }
        assert!(plan(std::iter::empty(), 16, 8).is_empty());
        assert!(plan([(0, 0)].into_iter(), 16, 8).is_empty());
    }

    #[test]
    fn split_respects_the_message_limit() {
        let reqs = split(0x1000, 7, 0x9000, 10, 4);
        assert_eq!(reqs.len(), 3);
        assert_eq!(reqs[2].local, 0x1008);
        assert_eq!(reqs[2].remote, 0x9008);
        assert_eq!(reqs[2].len, 2);
        assert!(reqs.iter().all(|r| r.lkey == 7));
        assert!(split(0, 0, 0, 0, 4).is_empty());
    }

    #[test]
    fn durl_resolves_to_an_uverbs_config_with_defaults() {
        let d: Durl = "mem;rdma_uverbs;url,tcp://10.0.0.2:2333;".parse().unwrap();
        match d.resolve().unwrap() {
            TransportConfig::Uverbs {
                addr,
                device,
                port,
                gid_index,
                token,
                timeout,
            } => {
                assert_eq!(addr.socket_addr_string(), "10.0.0.2:2333");
                assert_eq!((device, port, gid_index), (None, 1, 0));
                assert_eq!((token, timeout), (None, None));
            }
            other => panic!("{other:?}"),
        }
        let d: Durl =
            "mem;rdma_uverbs;url,tcp://h:1;device,mlx5_1;port,2;gid_index,3;token,t;timeout_ms,50;"
                .parse()
                .unwrap();
        match d.resolve().unwrap() {
            TransportConfig::Uverbs {
                device,
                port,
                gid_index,
                token,
                timeout,
                ..
            } => {
                assert_eq!(device.as_deref(), Some("mlx5_1"));
                assert_eq!((port, gid_index), (2, 3));
                assert_eq!(token.as_deref(), Some("t"));
                assert_eq!(timeout, Some(Duration::from_millis(50)));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn missing_device_is_a_clear_error_naming_it() {
        const NAME: &str = "scad-test-no-such-device";
        let d: Durl = format!("mem;rdma_uverbs;url,tcp://127.0.0.1:9;device,{NAME};")
            .parse()
            .unwrap();
        let err = crate::transport::open("mem", &d.resolve().unwrap()).unwrap_err();
        match &err {
            Error::NoDevice { requested, .. } => assert_eq!(requested.as_deref(), Some(NAME)),
            other => panic!("expected NoDevice, got {other:?}"),
        }
        assert!(err.to_string().contains(NAME), "{err}");
    }

    #[test]
    fn no_device_at_all_is_reported_when_none_is_named() {
        if !crate::rdma::list_devices().unwrap().is_empty() {
            return; // this host has RDMA: the first device would be used
        }
        let err = RdmaTransport::new("127.0.0.1:9", RdmaOptions::default()).unwrap_err();
        assert!(
            matches!(
                err,
                Error::NoDevice {
                    requested: None,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("no RDMA device"), "{err}");
    }

    #[test]
    fn wildcard_client_url_and_wrong_kind_are_refused() {
        let d: Durl = "mem;rdma_uverbs;url,tcp://*:9;".parse().unwrap();
        assert!(matches!(
            RdmaTransport::from_config(&d.resolve().unwrap()),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            RdmaTransport::from_config(&TransportConfig::Local { size: 1 }),
            Err(Error::InvalidArgument(_))
        ));
    }
}
