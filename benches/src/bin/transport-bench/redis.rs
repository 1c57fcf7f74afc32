//! The Redis baseline's client: a minimal RESP client (the server is a
//! [`scad_core::redis_server::RedisServer`] started for the run).
//!
//! The client is deliberately lean (one buffered reader, values read straight into the
//! caller's buffer, small commands sent with one `write`), so the baseline is what a
//! good client gets out of Redis, not the overhead of a general-purpose library.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};

/// A minimal synchronous RESP2 client for `GET` and `SET`.
pub struct RespClient {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    out: Vec<u8>,
    line: Vec<u8>,
}

/// Values up to this size are copied into the command buffer and sent with one write.
const INLINE_VALUE: usize = 64 * 1024;

impl RespClient {
    /// Connects with `TCP_NODELAY`.
    ///
    /// # Errors
    /// Connection errors.
    pub fn connect(addr: SocketAddr) -> Result<Self> {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .with_context(|| format!("cannot connect to redis at {addr}"))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        stream.set_write_timeout(Some(Duration::from_secs(60)))?;
        Ok(RespClient {
            reader: BufReader::with_capacity(64 * 1024, stream.try_clone()?),
            writer: stream,
            out: Vec::with_capacity(INLINE_VALUE + 256),
            line: Vec::new(),
        })
    }

    fn push_bulk(out: &mut Vec<u8>, item: &[u8]) {
        out.extend_from_slice(format!("${}\r\n", item.len()).as_bytes());
        out.extend_from_slice(item);
        out.extend_from_slice(b"\r\n");
    }

    fn read_line(&mut self) -> Result<&[u8]> {
        self.line.clear();
        let n = self.reader.read_until(b'\n', &mut self.line)?;
        ensure!(
            n >= 3 && self.line.ends_with(b"\r\n"),
            "redis closed the connection or sent a bad line"
        );
        Ok(&self.line[..n - 2])
    }

    fn expect_simple(&mut self, want: &[u8]) -> Result<()> {
        let line = self.read_line()?;
        if line.first() == Some(&b'-') {
            bail!("redis error: {}", String::from_utf8_lossy(&line[1..]));
        }
        ensure!(
            line.first() == Some(&b'+') && &line[1..] == want,
            "unexpected redis reply {:?}",
            String::from_utf8_lossy(line)
        );
        Ok(())
    }

    /// `SET key value`.
    ///
    /// # Errors
    /// I/O errors and error replies.
    pub fn set(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        self.out.clear();
        self.out.extend_from_slice(b"*3\r\n$3\r\nSET\r\n");
        Self::push_bulk(&mut self.out, key);
        if value.len() <= INLINE_VALUE {
            Self::push_bulk(&mut self.out, value);
            self.writer.write_all(&self.out)?;
        } else {
            self.out
                .extend_from_slice(format!("${}\r\n", value.len()).as_bytes());
            self.writer.write_all(&self.out)?;
            self.writer.write_all(value)?;
            self.writer.write_all(b"\r\n")?;
        }
        self.expect_simple(b"OK")
    }

    /// `GET key` into `dst`, whose length must be the value's length.
    ///
    /// # Errors
    /// I/O errors, error replies, a missing key or a value of another length.
    pub fn get_into(&mut self, key: &[u8], dst: &mut [u8]) -> Result<()> {
        self.out.clear();
        self.out.extend_from_slice(b"*2\r\n$3\r\nGET\r\n");
        Self::push_bulk(&mut self.out, key);
        self.writer.write_all(&self.out)?;
        let line = self.read_line()?;
        match line.first() {
            Some(b'$') => {}
            Some(b'-') => bail!("redis error: {}", String::from_utf8_lossy(&line[1..])),
            _ => bail!("unexpected redis reply {:?}", String::from_utf8_lossy(line)),
        }
        let len: i64 = std::str::from_utf8(&line[1..])?.parse()?;
        ensure!(
            len >= 0,
            "redis key {:?} is missing",
            String::from_utf8_lossy(key)
        );
        ensure!(
            len as usize == dst.len(),
            "redis value is {len} bytes, {} expected",
            dst.len()
        );
        self.reader.read_exact(dst)?;
        let mut crlf = [0u8; 2];
        self.reader.read_exact(&mut crlf)?;
        ensure!(&crlf == b"\r\n", "redis bulk string not terminated by CRLF");
        Ok(())
    }
}
