//! A `redis-server` child on a free loopback port, for the tests and benchmarks that
//! measure or exercise Redis as a memory element (feature `redis-server`).
//!
//! The one place that starts Redis: the `redis` transport's tests, the transport
//! benchmark's Redis baseline and the TPC-DS runs with Redis as the store all use it.
//! The server keeps nothing on disk (`--save ""`, `--appendonly no`) and is killed,
//! by its own process handle, when the [`RedisServer`] is dropped.
//!
//! # Example: a private server for one test
//! ```no_run
//! use scad_core::redis_server::RedisServer;
//!
//! let redis = RedisServer::start(&["--requirepass", "secret"])?;
//! println!("redis {} on {}", redis.version(), redis.addr());
//! # Ok::<(), scad_core::Error>(())
//! ```

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// How long [`RedisServer::start`] waits for the server to answer.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// The `redis-server` binary in a directory of `PATH`, if there is one.
pub fn find_binary() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("redis-server"))
        .find(|p| p.is_file())
}

/// A `redis-server` child process on a loopback port; killed when dropped.
#[derive(Debug)]
pub struct RedisServer {
    child: Child,
    binary: PathBuf,
    addr: SocketAddr,
    version: String,
}

impl RedisServer {
    /// Starts the `redis-server` found on `PATH` (see [`find_binary`]); `extra_args` are
    /// appended to its command line (`["--requirepass", "secret"]`, say).
    ///
    /// # Errors
    /// [`Error::RedisServer`] if there is no `redis-server` on `PATH`, or as
    /// [`RedisServer::start_binary`].
    pub fn start(extra_args: &[&str]) -> Result<Self> {
        let Some(bin) = find_binary() else {
            return Err(Error::RedisServer {
                binary: "redis-server".into(),
                reason: "not found on PATH (scripts/setup.sh installs it)".into(),
                source: None,
            });
        };
        Self::start_binary(&bin, extra_args)
    }

    /// Starts `bin` on a free loopback port with persistence off and waits, up to 10 s,
    /// until it answers `PING` (a `NOAUTH` refusal counts: the server is up).
    ///
    /// # Errors
    /// [`Error::RedisServer`] if no port can be had, the binary cannot be started, it
    /// exits at startup or it does not answer in time.
    pub fn start_binary(bin: &Path, extra_args: &[&str]) -> Result<Self> {
        let fail = |reason: String, source: Option<std::io::Error>| Error::RedisServer {
            binary: bin.display().to_string(),
            reason,
            source,
        };
        let version = Command::new(bin)
            .arg("--version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default();
        // A port that was free a moment ago; a race with another process is possible
        // but unlikely, and shows as a clear error below.
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .map_err(|e| fail("cannot find a free loopback port".into(), Some(e)))?
            .port();
        let child = Command::new(bin)
            .args(["--port", &port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| fail("cannot start it".into(), Some(e)))?;
        let mut server = RedisServer {
            child,
            binary: bin.to_owned(),
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
            version,
        };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match server.child.try_wait() {
                Ok(Some(status)) => {
                    return Err(fail(format!("exited at startup with {status}"), None))
                }
                Ok(None) => {}
                Err(e) => return Err(fail("cannot watch the child".into(), Some(e))),
            }
            if answers_ping(server.addr) {
                return Ok(server);
            }
            if Instant::now() > deadline {
                // Dropping `server` kills the child.
                return Err(fail(
                    format!(
                        "did not answer PING on {} within {START_TIMEOUT:?}",
                        server.addr
                    ),
                    None,
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The address the server listens on (`127.0.0.1:PORT`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Kills the server now and waits for it to exit (to test what clients do when
    /// their Redis goes away); [`RedisServer::addr`] still names the port it had.
    ///
    /// # Errors
    /// [`Error::RedisServer`] if the child cannot be killed or waited for.
    pub fn stop(&mut self) -> Result<()> {
        let fail = |reason: &str, e| Error::RedisServer {
            binary: self.binary.display().to_string(),
            reason: format!("{reason} (on {})", self.addr),
            source: Some(e),
        };
        self.child.kill().map_err(|e| fail("cannot kill it", e))?;
        self.child
            .wait()
            .map_err(|e| fail("cannot wait for it", e))?;
        Ok(())
    }

    /// What `redis-server --version` printed (empty if it printed nothing).
    pub fn version(&self) -> &str {
        &self.version
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // Only the child this process started, by its own handle.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether a Redis server on `addr` answers `PING` with `+PONG` (or refuses it for want
/// of a password, which also shows it is serving commands).
fn answers_ping(addr: SocketAddr) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
        return false;
    };
    if stream
        .set_read_timeout(Some(Duration::from_millis(500)))
        .and_then(|()| stream.write_all(b"*1\r\n$4\r\nPING\r\n"))
        .is_err()
    {
        return false;
    }
    let mut reply = [0u8; 128];
    let mut n = 0;
    while n < reply.len() {
        match stream.read(&mut reply[n..]) {
            Ok(0) | Err(_) => return false,
            Ok(k) => n += k,
        }
        if reply[..n].ends_with(b"\r\n") {
            return reply[..n].starts_with(b"+PONG") || reply[..n].starts_with(b"-NOAUTH");
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_binary_is_an_error_naming_it() {
        let err = RedisServer::start_binary(Path::new("/nonexistent/redis-server"), &[])
            .expect_err("no such binary");
        assert!(
            err.to_string().contains("/nonexistent/redis-server"),
            "{err}"
        );
    }

    #[test]
    fn a_silent_port_does_not_answer_ping() {
        // Bound but never accepted: connects succeed, no reply ever comes.
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
        let addr = listener.local_addr().expect("addr");
        assert!(!answers_ping(addr));
    }
}
