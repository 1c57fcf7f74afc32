//! `redis`: a memory element kept in a Redis server.
//!
//! The address space is cut into blocks of [`BLOCK_BYTES`]; block `i` is the Redis
//! string `PREFIX:i`, created by the first write that touches it (`SETRANGE` pads with
//! zeros) and read with `GETRANGE`, so an unwritten range reads as zeros, as a fresh
//! memory element does. Every call sends all its commands in one pipeline, one round
//! trip. This is the baseline the memory servers are measured against, and a backend
//! where no memory server may run.

use std::sync::Mutex;
use std::time::Duration;

use redis::IntoConnectionInfo;

use super::{check_remote, Counters, ReadOp, Transport, TransportStats, WriteOp};
use crate::durl::HostPort;
use crate::error::{Error, Result};

/// Bytes per Redis string. Small enough that one value never nears Redis' 512 MB limit
/// and a partial write rewrites little; large enough that a bulk read is few commands.
pub const BLOCK_BYTES: u64 = 1 << 20;

/// Default per-operation timeout.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Idle connections kept for reuse.
const POOL_SIZE: usize = 16;

/// A transport to an address space of `size` bytes stored in Redis under a key prefix.
pub struct RedisTransport {
    client: redis::Client,
    peer: String,
    size: u64,
    prefix: String,
    timeout: Duration,
    idle: Mutex<Vec<redis::Connection>>,
    counters: Counters,
}

impl std::fmt::Debug for RedisTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTransport")
            .field("peer", &self.peer)
            .field("size", &self.size)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// One block-sized piece of a remote range: the key, where in the block, and where in
/// the caller's buffer.
struct Piece {
    key: String,
    offset_in_block: u64,
    offset_in_buf: usize,
    len: usize,
}

impl RedisTransport {
    /// A transport to `size` bytes under `prefix` on the Redis server at `addr`,
    /// authenticating with `password` if given. Connects once to check the server is
    /// there and the password is right.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero size or empty prefix; [`Error::Connect`],
    /// [`Error::Auth`] or [`Error::Redis`] if the server cannot be used.
    pub fn connect(
        addr: &HostPort,
        size: u64,
        prefix: &str,
        password: Option<&str>,
        timeout: Option<Duration>,
    ) -> Result<Self> {
        if size == 0 {
            return Err(Error::InvalidArgument(
                "a redis memory element needs a size greater than 0".to_owned(),
            ));
        }
        if prefix.is_empty() {
            return Err(Error::InvalidArgument(
                "a redis memory element needs a non-empty key prefix".to_owned(),
            ));
        }
        let peer = addr.socket_addr_string();
        let mut info = (addr.host.as_str(), addr.port)
            .into_connection_info()
            .map_err(|e| redis_error(&peer, "configure", &e))?;
        if let Some(password) = password {
            let settings = info.redis_settings().clone().set_password(password);
            info = info.set_redis_settings(settings);
        }
        let client = redis::Client::open(info).map_err(|e| redis_error(&peer, "configure", &e))?;
        let transport = RedisTransport {
            client,
            peer,
            size,
            prefix: prefix.to_owned(),
            timeout: timeout.unwrap_or(DEFAULT_TIMEOUT),
            idle: Mutex::new(Vec::new()),
            counters: Counters::default(),
        };
        // Redis accepts a connection before authentication, so ask it something.
        let mut ping = redis::pipe();
        ping.cmd("PING");
        let _: Vec<String> = transport.run(&ping, "connect")?;
        Ok(transport)
    }

    /// The key prefix of this element's blocks.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Deletes every block of this element from Redis (the memory reads as zeros again).
    ///
    /// # Errors
    /// Redis errors.
    pub fn clear(&self) -> Result<()> {
        let blocks = self.size.div_ceil(BLOCK_BYTES);
        let mut pipe = redis::pipe();
        for block in 0..blocks {
            pipe.cmd("DEL").arg(self.key(block)).ignore();
        }
        self.run(&pipe, "clear")
    }

    fn key(&self, block: u64) -> String {
        format!("{}:{block}", self.prefix)
    }

    /// Splits `[addr, addr + len)` into block pieces, `offset_in_buf` counted from `base`.
    fn pieces(&self, addr: u64, len: usize, base: usize, out: &mut Vec<Piece>) {
        let mut done = 0usize;
        while done < len {
            let at = addr + done as u64;
            let block = at / BLOCK_BYTES;
            let offset_in_block = at % BLOCK_BYTES;
            let take = ((BLOCK_BYTES - offset_in_block) as usize).min(len - done);
            out.push(Piece {
                key: self.key(block),
                offset_in_block,
                offset_in_buf: base + done,
                len: take,
            });
            done += take;
        }
    }

    fn checkout(&self) -> Result<redis::Connection> {
        if let Some(con) = self.idle.lock().ok().and_then(|mut idle| idle.pop()) {
            return Ok(con);
        }
        let con = self
            .client
            .get_connection_with_timeout(self.timeout)
            .map_err(|e| connect_error(&self.peer, &e))?;
        con.set_read_timeout(Some(self.timeout))
            .and_then(|()| con.set_write_timeout(Some(self.timeout)))
            .map_err(|e| redis_error(&self.peer, "configure", &e))?;
        Ok(con)
    }

    fn checkin(&self, con: redis::Connection) {
        if let Ok(mut idle) = self.idle.lock() {
            if idle.len() < POOL_SIZE {
                idle.push(con);
            }
        }
    }

    /// Runs a pipeline on a pooled connection; a connection that saw an error is
    /// dropped, so the next call starts on a fresh one.
    fn run<T: redis::FromRedisValue>(&self, pipe: &redis::Pipeline, op: &'static str) -> Result<T> {
        let mut con = self.checkout()?;
        match pipe.query::<T>(&mut con) {
            Ok(v) => {
                self.checkin(con);
                Ok(v)
            }
            Err(e) if e.is_timeout() => Err(Error::Timeout {
                what: format!("redis {op} on {}", self.peer),
                timeout: self.timeout,
            }),
            Err(e) if is_auth_failure(&e) => Err(Error::Auth {
                peer: self.peer.clone(),
                message: e.to_string(),
            }),
            Err(e) => Err(redis_error(&self.peer, op, &e)),
        }
    }

    /// Fetches `pieces` in one round trip and hands each piece's bytes (shorter than
    /// asked where the block ends early or does not exist) to `fill`.
    fn fetch(&self, pieces: &[Piece], mut fill: impl FnMut(&Piece, &[u8])) -> Result<()> {
        if pieces.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for p in pieces {
            pipe.cmd("GETRANGE")
                .arg(&p.key)
                .arg(p.offset_in_block)
                .arg(p.offset_in_block + p.len as u64 - 1);
        }
        let values: Vec<Vec<u8>> = self.run(&pipe, "read")?;
        if values.len() != pieces.len() {
            return Err(Error::Redis {
                peer: self.peer.clone(),
                op: "read",
                reason: format!(
                    "asked for {} ranges, got {} replies",
                    pieces.len(),
                    values.len()
                ),
            });
        }
        for (p, v) in pieces.iter().zip(&values) {
            fill(p, v);
        }
        Ok(())
    }

    fn store(&self, pieces: &[(Piece, &[u8])]) -> Result<()> {
        if pieces.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for (p, src) in pieces {
            let bytes = &src[p.offset_in_buf..p.offset_in_buf + p.len];
            pipe.cmd("SETRANGE")
                .arg(&p.key)
                .arg(p.offset_in_block)
                .arg(bytes)
                .ignore();
        }
        self.run(&pipe, "write")
    }
}

/// Copies what Redis returned into `dst`; bytes past the end of a short block are zero.
fn copy_padded(dst: &mut [u8], got: &[u8]) {
    let n = got.len().min(dst.len());
    dst[..n].copy_from_slice(&got[..n]);
    dst[n..].fill(0);
}

fn is_auth_failure(e: &redis::RedisError) -> bool {
    let text = e.to_string();
    e.kind() == redis::ErrorKind::AuthenticationFailed
        || text.contains("WRONGPASS")
        || text.contains("NOAUTH")
}

fn connect_error(peer: &str, e: &redis::RedisError) -> Error {
    if is_auth_failure(e) {
        return Error::Auth {
            peer: peer.to_owned(),
            message: e.to_string(),
        };
    }
    if e.is_io_error() || e.is_connection_refusal() || e.is_timeout() {
        return Error::Connect {
            peer: peer.to_owned(),
            source: std::io::Error::other(e.to_string()),
        };
    }
    redis_error(peer, "connect", e)
}

fn redis_error(peer: &str, op: &'static str, e: &redis::RedisError) -> Error {
    Error::Redis {
        peer: peer.to_owned(),
        op,
        reason: e.to_string(),
    }
}

impl Transport for RedisTransport {
    fn describe(&self) -> String {
        format!("redis://{}/{}", self.peer, self.prefix)
    }

    fn remote_size(&self) -> Result<u64> {
        Ok(self.size)
    }

    fn read(&self, addr: u64, dst: &mut [u8]) -> Result<()> {
        self.read_vectored(&mut [ReadOp { addr, dst }])
    }

    fn write(&self, addr: u64, src: &[u8]) -> Result<()> {
        self.write_vectored(&[WriteOp { addr, src }])
    }

    fn read_vectored(&self, ops: &mut [ReadOp<'_>]) -> Result<()> {
        let mut pieces = Vec::new();
        let mut owner = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            check_remote("read", op.addr, op.dst.len() as u64, self.size)?;
            let before = pieces.len();
            self.pieces(op.addr, op.dst.len(), 0, &mut pieces);
            owner.extend(std::iter::repeat_n(i, pieces.len() - before));
        }
        let mut piece_index = 0;
        self.fetch(&pieces, |p, got| {
            let op = &mut ops[owner[piece_index]];
            copy_padded(&mut op.dst[p.offset_in_buf..p.offset_in_buf + p.len], got);
            piece_index += 1;
        })?;
        let bytes = ops.iter().map(|op| op.dst.len() as u64).sum();
        self.counters.record_read(bytes);
        Ok(())
    }

    fn write_vectored(&self, ops: &[WriteOp<'_>]) -> Result<()> {
        let mut pieces = Vec::new();
        for op in ops {
            check_remote("write", op.addr, op.src.len() as u64, self.size)?;
            let mut mine = Vec::new();
            self.pieces(op.addr, op.src.len(), 0, &mut mine);
            pieces.extend(mine.into_iter().map(|p| (p, op.src)));
        }
        self.store(&pieces)?;
        let bytes = ops.iter().map(|op| op.src.len() as u64).sum();
        self.counters.record_write(bytes);
        Ok(())
    }

    fn stats(&self) -> TransportStats {
        self.counters.snapshot()
    }
}
