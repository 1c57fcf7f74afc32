//! Memory servers from Python: an embedded one (`MemoryServer` class, used by the
//! local runner) and the `memory_server` console script (same flags as the binary).

use std::sync::Mutex;

use clap::Parser;
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
    /// Starts serving `size` bytes on `addr` (`"127.0.0.1:0"` picks a free port). The
    /// memory is mapped, not committed: pages cost memory once written. Without a
    /// `token` only clients on this host are served (protected mode) unless
    /// `unprotected` is true.
    #[new]
    #[pyo3(signature = (size, addr="127.0.0.1:0", token=None, unprotected=false))]
    fn new(
        py: Python<'_>,
        size: u64,
        addr: &str,
        token: Option<String>,
        unprotected: bool,
    ) -> PyResult<Self> {
        let addr = addr.to_owned();
        let server = detach(py, move || {
            MemoryServer::start(
                &addr,
                size,
                ServerConfig {
                    token,
                    unprotected,
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

/// Parses a size such as `4096`, `64K`, `512M`, `1G` or `512 MB` (powers of 1024).
#[pyfunction]
#[pyo3(name = "parse_size")]
pub fn py_parse_size(s: &str) -> PyResult<u64> {
    // The one size parser, as `memory_server` takes sizes (zero refused).
    scad_core::cli::parse_size(s).map_err(PyValueError::new_err)
}

/// The `memory_server` console script: parses `argv` (program name first) exactly as
/// the Rust binary does (it is the same code, `scad_core::cli`), prints
/// `listening on ADDR`, and serves until SIGINT or SIGTERM. Returns the exit status.
#[pyfunction]
pub fn memory_server_main(py: Python<'_>, argv: Vec<String>) -> PyResult<i32> {
    let args = match scad_core::cli::Args::try_parse_from(&argv) {
        Ok(a) => a,
        Err(e) => {
            let code = e.exit_code();
            // Help and version go to stdout, usage errors to stderr, as clap does.
            let _ = e.print();
            return Ok(code);
        }
    };
    detach(py, move || {
        scad_core::cli::run(&args).map_err(|e| ScadError::new_err(format!("{e:#}")))?;
        Ok(0)
    })
}
