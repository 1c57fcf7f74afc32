//! The plain-TCP baseline: the least a request/response transfer over loopback costs.
//!
//! A server thread answers 64-byte requests (`op`, `len`, padding): for a read it writes `len`
//! bytes of a prepared block in a loop of 1 MiB writes (the fastest piece size on this
//! machine, and the memory server's frame size), for a write it reads `len` bytes into a
//! page-aligned buffer and answers one byte. The request is padded to 64 bytes so that
//! written data starts at a 64-byte boundary of the byte stream: on this machine the
//! kernel's copies run up to ~1.6× slower when the payload sits a few bytes off that
//! boundary (a 13-byte header before 1 MiB cost about a third of the throughput in a
//! side experiment), and the baseline should be the best plain TCP can do.
//! No framing, no bounds checks, no copies beyond the kernel's: the memory server's
//! reads and writes are measured against this.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{ensure, Context, Result};

use crate::buf::PlacedBuf;

const OP_READ: u8 = 1;
const OP_WRITE: u8 = 2;
/// Bytes per `write` call when answering a read.
const WRITE_PIECE: usize = 1 << 20;

/// A client connection to a private block server thread, which ends when this drops.
pub struct StreamPair {
    stream: TcpStream,
    server: Option<JoinHandle<()>>,
}

impl StreamPair {
    /// Starts a server thread that serves reads from `block` and accepts writes of up
    /// to `max_write` bytes, and connects to it.
    ///
    /// # Errors
    /// Socket or thread errors.
    pub fn start(block: Arc<PlacedBuf>, max_write: usize) -> Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .context("cannot bind the plain TCP baseline server")?;
        let addr = listener.local_addr()?;
        let server = std::thread::Builder::new()
            .name("plain-tcp-server".into())
            .spawn(move || {
                if let Ok((conn, _)) = listener.accept() {
                    // Errors end the thread; the client then sees EOF and fails.
                    let _ = serve(conn, &block, max_write);
                }
            })?;
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        stream.set_write_timeout(Some(Duration::from_secs(60)))?;
        Ok(StreamPair {
            stream,
            server: Some(server),
        })
    }

    /// Asks for `dst.len()` bytes and reads them into `dst`.
    ///
    /// # Errors
    /// I/O errors.
    pub fn read(&mut self, dst: &mut [u8]) -> Result<()> {
        self.stream.write_all(&request(OP_READ, dst.len()))?;
        self.stream.read_exact(dst)?;
        Ok(())
    }

    /// Sends `src` and waits for the one-byte acknowledgement.
    ///
    /// # Errors
    /// I/O errors.
    pub fn write(&mut self, src: &[u8]) -> Result<()> {
        self.stream.write_all(&request(OP_WRITE, src.len()))?;
        self.stream.write_all(src)?;
        let mut ack = [0u8; 1];
        self.stream.read_exact(&mut ack)?;
        ensure!(ack[0] == 1, "bad acknowledgement from the plain TCP server");
        Ok(())
    }
}

impl Drop for StreamPair {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(Shutdown::Both);
        if let Some(h) = self.server.take() {
            let _ = h.join();
        }
    }
}

/// Bytes of one request: op, length, padding.
const REQUEST_BYTES: usize = 64;

fn request(op: u8, len: usize) -> [u8; REQUEST_BYTES] {
    let mut req = [0u8; REQUEST_BYTES];
    req[0] = op;
    req[1..9].copy_from_slice(&(len as u64).to_le_bytes());
    req
}

fn serve(mut conn: TcpStream, block: &[u8], max_write: usize) -> std::io::Result<()> {
    conn.set_nodelay(true)?;
    let mut sink = PlacedBuf::filled(max_write, 0, 0x5a);
    let mut req = [0u8; REQUEST_BYTES];
    loop {
        match conn.read_exact(&mut req) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let mut len = [0u8; 8];
        len.copy_from_slice(&req[1..9]);
        let len = usize::try_from(u64::from_le_bytes(len)).unwrap_or(usize::MAX);
        match req[0] {
            OP_READ if len <= block.len() => {
                for piece in block[..len].chunks(WRITE_PIECE) {
                    conn.write_all(piece)?;
                }
            }
            OP_WRITE if len <= sink.len() => {
                conn.read_exact(&mut sink[..len])?;
                conn.write_all(&[1])?;
            }
            _ => return Ok(()),
        }
    }
}
