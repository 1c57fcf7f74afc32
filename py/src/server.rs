//! Memory servers from Python: an embedded one (`MemoryServer` class, used by the
//! local runner) and the `memory_server` console script (same flags as the binary).

use std::io::Write;
use std::sync::Mutex;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use scad_core::server::{MemoryServer, ServerConfig};

use crate::errors::{core_err, detach, ScadError};

/// A memory server running inside this process (on its own threads).
#[pyclass(module = "scad._native", name = "MemoryServer", frozen)]
pub struct PyMemoryServer {
    server: Mutex<Option<MemoryServer>>,
    url: String,
    port: u16,
    size: u64,
}

#[pymethods]
impl PyMemoryServer {
    /// Starts serving `size` bytes on `addr` (`"127.0.0.1:0"` picks a free port).
    #[new]
    #[pyo3(signature = (size, addr="127.0.0.1:0", token=None))]
    fn new(py: Python<'_>, size: u64, addr: &str, token: Option<String>) -> PyResult<Self> {
        let addr = addr.to_owned();
        let server = detach(py, move || {
            MemoryServer::start(
                &addr,
                size,
                ServerConfig {
                    token,
                    ..ServerConfig::default()
                },
            )
            .map_err(core_err)
        })?;
        Ok(PyMemoryServer {
            url: server.url(),
            port: server.local_addr().port(),
            size,
            server: Mutex::new(Some(server)),
        })
    }

    /// `tcp://HOST:PORT` for clients on this host.
    #[getter]
    fn url(&self) -> String {
        self.url.clone()
    }

    /// The port listened on.
    #[getter]
    fn port(&self) -> u16 {
        self.port
    }

    /// Bytes of the served address space.
    #[getter]
    fn size(&self) -> u64 {
        self.size
    }

    /// True until `shutdown`.
    #[getter]
    fn running(&self) -> bool {
        self.server.lock().map(|s| s.is_some()).unwrap_or(false)
    }

    /// Counters: connections, requests, errors, bytes_read, bytes_written.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let guard = self
            .server
            .lock()
            .map_err(|_| ScadError::new_err("memory server lock poisoned"))?;
        let s = guard.as_ref().map(MemoryServer::stats).unwrap_or_default();
        let d = PyDict::new(py);
        d.set_item("connections", s.connections)?;
        d.set_item("requests", s.requests)?;
        d.set_item("errors", s.errors)?;
        d.set_item("bytes_read", s.bytes_read)?;
        d.set_item("bytes_written", s.bytes_written)?;
        Ok(d)
    }

    /// Stops the server and closes its connections (idempotent).
    fn shutdown(&self, py: Python<'_>) -> PyResult<()> {
        let server = self
            .server
            .lock()
            .map_err(|_| ScadError::new_err("memory server lock poisoned"))?
            .take();
        if let Some(s) = server {
            detach(py, move || {
                s.shutdown();
                Ok(())
            })?;
        }
        Ok(())
    }
}

/// Which transport the server speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Impl {
    /// The TCP wire protocol (durl `rdma_tcp`).
    Tcp,
    /// One-sided RDMA (durl `rdma_uverbs`; needs the `rdma` feature and a device).
    Rdma,
}

/// Serve one memory element's address space.
#[derive(Debug, Parser)]
#[command(name = "memory_server", version, about)]
struct Args {
    /// TCP port to listen on (0 picks a free one).
    #[arg(default_value_t = 2333)]
    port: u16,
    /// Transport implementation.
    #[arg(value_enum, default_value_t = Impl::Tcp, name = "IMPL")]
    implementation: Impl,
    /// Bytes of the address space (suffixes K, M, G accepted, powers of 1024).
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    size: u64,
    /// Address to bind.
    #[arg(long, default_value = "0.0.0.0")]
    bind: String,
    /// Shared secret clients must present (also read from SCAD_TOKEN).
    #[arg(long, env = "SCAD_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Connections served at once.
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// Largest frame in bytes.
    #[arg(long, default_value_t = scad_core::protocol::DEFAULT_MAX_FRAME)]
    max_frame: u32,
    /// Seconds a connection may stay idle or stalled (0: forever).
    #[arg(long, default_value_t = 600)]
    idle_timeout: u64,
    /// List RDMA devices and exit.
    #[arg(long)]
    list_devices: bool,
    /// RDMA device (default: the first one found).
    #[arg(long)]
    device: Option<String>,
    /// RDMA device port.
    #[arg(long, default_value_t = 1)]
    rdma_port: u8,
    /// RDMA GID table index.
    #[arg(long, default_value_t = 0)]
    gid_index: u8,
}

/// Parses a size such as `4096`, `64K`, `512M`, `1G` or `512 MB` (powers of 1024).
#[pyfunction]
#[pyo3(name = "parse_size")]
pub fn py_parse_size(s: &str) -> PyResult<u64> {
    parse_size(s).map_err(PyValueError::new_err)
}

/// Parses `4096`, `64K`, `512M`, `1G`, `2T` (powers of 1024), and `512 MB` as in
/// element limits.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim().trim_end_matches(['B', 'b']).trim_end();
    let t = t.trim_end_matches(['i']);
    let (digits, shift) = match t.char_indices().last() {
        Some((i, 'K' | 'k')) => (&t[..i], 10),
        Some((i, 'M' | 'm')) => (&t[..i], 20),
        Some((i, 'G' | 'g')) => (&t[..i], 30),
        Some((i, 'T' | 't')) => (&t[..i], 40),
        _ => (t, 0),
    };
    let n: u64 = digits
        .trim()
        .parse()
        .map_err(|_| format!("size {s:?} is not a number with an optional K/M/G/T suffix"))?;
    let size = n
        .checked_mul(1u64 << shift)
        .ok_or_else(|| format!("size {s:?} is too large"))?;
    if size == 0 {
        return Err("size must be greater than 0".into());
    }
    Ok(size)
}

/// The `memory_server` console script: parses `argv` (program name first) like the
/// Rust binary, prints `listening on ADDR`, and serves until SIGINT or SIGTERM.
/// Returns the exit status.
#[pyfunction]
pub fn memory_server_main(py: Python<'_>, argv: Vec<String>) -> PyResult<i32> {
    let args = match Args::try_parse_from(&argv) {
        Ok(a) => a,
        Err(e) => {
            let code = e.exit_code();
            // Help and version go to stdout, usage errors to stderr, as clap does.
            let _ = e.print();
            return Ok(code);
        }
    };
    if args.list_devices {
        return list_devices();
    }
    if args.implementation == Impl::Rdma {
        return serve_rdma(py, &args);
    }
    let config = ServerConfig {
        token: args.token.clone(),
        max_frame: args.max_frame,
        max_connections: args.max_connections,
        idle_timeout: (args.idle_timeout > 0).then(|| Duration::from_secs(args.idle_timeout)),
    };
    let bind = bind_addr(&args);
    let size = args.size;
    detach(py, move || {
        let server = MemoryServer::start(&bind, size, config).map_err(core_err)?;
        let stop = server.shutdown_handle();
        serve_until_signal(server.local_addr(), move || stop.shutdown())?;
        server.wait();
        Ok(0)
    })
}

#[cfg(feature = "rdma")]
fn list_devices() -> PyResult<i32> {
    let devices = scad_core::rdma::list_devices().map_err(core_err)?;
    if devices.is_empty() {
        println!("no RDMA devices found on this host");
    }
    for d in &devices {
        println!("{d}");
    }
    Ok(0)
}

#[cfg(not(feature = "rdma"))]
fn list_devices() -> PyResult<i32> {
    println!("no RDMA support: this wheel was built without the `rdma` feature");
    Ok(0)
}

#[cfg(feature = "rdma")]
fn serve_rdma(py: Python<'_>, args: &Args) -> PyResult<i32> {
    use scad_core::rdma::{RdmaServer, RdmaServerConfig};
    let config = RdmaServerConfig {
        token: args.token.clone(),
        device: args.device.clone(),
        port: args.rdma_port,
        gid_index: args.gid_index,
        max_connections: args.max_connections,
        ..RdmaServerConfig::default()
    };
    let bind = bind_addr(args);
    let size = args.size;
    detach(py, move || {
        let server = RdmaServer::start(&bind, size, config).map_err(core_err)?;
        let stop = server.shutdown_handle();
        let addr = server.local_addr();
        serve_until_signal(addr, move || stop.shutdown())?;
        server.wait();
        Ok(0)
    })
}

#[cfg(not(feature = "rdma"))]
fn serve_rdma(_py: Python<'_>, _args: &Args) -> PyResult<i32> {
    Err(PyValueError::new_err(
        "the rdma implementation needs the wheel built with the `rdma` feature \
         (maturin build --features rdma) or the Rust memory_server binary",
    ))
}

fn bind_addr(args: &Args) -> String {
    if args.bind.contains(':') {
        format!("[{}]:{}", args.bind, args.port)
    } else {
        format!("{}:{}", args.bind, args.port)
    }
}

/// Installs SIGINT/SIGTERM handling that calls `stop`, and announces `addr` on stdout.
fn serve_until_signal(
    addr: std::net::SocketAddr,
    stop: impl FnOnce() + Send + 'static,
) -> PyResult<()> {
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])
    .map_err(|e| ScadError::new_err(format!("installing signal handlers: {e}")))?;
    std::thread::spawn(move || {
        if let Some(sig) = signals.forever().next() {
            tracing::info!(signal = sig, "stopping");
            stop();
        }
    });
    println!("listening on {addr}");
    let _ = std::io::stdout().flush();
    Ok(())
}
