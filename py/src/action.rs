//! `Action` and `Endpoint`: the libd API the `disagg` module is built on.

use std::sync::Arc;
use std::time::Duration;

use numpy::{PyReadonlyArray1, PyReadwriteArray1};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use scad_core::{Action, Endpoint, TransportConfig};

use crate::buffer::RegisteredBytes;
use crate::errors::{core_err, detach};

/// The named transports of one element.
#[pyclass(module = "scad._native", name = "Action", frozen)]
pub struct PyAction {
    pub(crate) inner: Arc<Action>,
}

#[pymethods]
impl PyAction {
    /// A new action; transport calls wait at most `timeout` seconds for configuration.
    #[new]
    #[pyo3(signature = (aid, timeout=60.0))]
    fn new(aid: &str, timeout: f64) -> PyResult<Self> {
        if !(timeout.is_finite() && timeout > 0.0) {
            return Err(PyValueError::new_err(format!(
                "timeout must be a positive number of seconds, not {timeout}"
            )));
        }
        Ok(PyAction {
            inner: Arc::new(Action::with_timeout(aid, Duration::from_secs_f64(timeout))),
        })
    }

    /// The action's id.
    #[getter]
    fn id(&self) -> String {
        self.inner.id().to_owned()
    }

    /// Adds a transport from a (possibly incomplete) durl; returns its state code.
    fn add_transport(&self, py: Python<'_>, durl: String) -> PyResult<i32> {
        let a = Arc::clone(&self.inner);
        detach(py, move || {
            a.add_transport(&durl).map(|s| s.code()).map_err(core_err)
        })
    }

    /// Completes transport `name`; returns its state code.
    fn config_transport(&self, py: Python<'_>, name: String, durl: String) -> PyResult<i32> {
        let a = Arc::clone(&self.inner);
        detach(py, move || {
            a.config_transport(&name, &durl)
                .map(|s| s.code())
                .map_err(core_err)
        })
    }

    /// State code of transport `name` (0 pending, 1 ready, -1 terminated).
    fn state(&self, name: &str) -> PyResult<i32> {
        self.inner.state(name).map(|s| s.code()).map_err(core_err)
    }

    /// Names of the transports.
    fn names(&self) -> Vec<String> {
        self.inner.names()
    }

    /// A client handle on transport `name`.
    fn endpoint(&self, name: &str) -> PyResult<PyEndpoint> {
        Ok(PyEndpoint {
            inner: Arc::new(self.inner.endpoint(name).map_err(core_err)?),
        })
    }

    /// The configuration of server transport `name` as a dict (waits until complete).
    fn server_config<'py>(&self, py: Python<'py>, name: String) -> PyResult<Bound<'py, PyDict>> {
        let a = Arc::clone(&self.inner);
        let config = detach(py, move || a.server_config(&name).map_err(core_err))?;
        let d = PyDict::new(py);
        match config {
            TransportConfig::TcpServer { bind, size, token } => {
                d.set_item("impl", "rdma_tcp_server")?;
                d.set_item("bind", bind.socket_addr_string())?;
                d.set_item("size", size)?;
                d.set_item("token", token)?;
            }
            TransportConfig::UverbsServer {
                bind, size, token, ..
            } => {
                d.set_item("impl", "rdma_uverbs_server")?;
                d.set_item("bind", bind.socket_addr_string())?;
                d.set_item("size", size)?;
                d.set_item("token", token)?;
            }
            other => {
                return Err(PyValueError::new_err(format!(
                    "not a server configuration: {other:?}"
                )))
            }
        }
        Ok(d)
    }

    /// Drops transport `name`; calls waiting on it raise `TerminatedError`.
    fn release(&self, name: &str) -> PyResult<()> {
        self.inner.release(name).map_err(core_err)
    }

    /// Drops every transport.
    fn terminate(&self) {
        self.inner.terminate();
    }
}

/// A client handle on one named transport, with its registered buffer.
#[pyclass(module = "scad._native", name = "Endpoint", frozen)]
pub struct PyEndpoint {
    pub(crate) inner: Arc<Endpoint>,
}

#[pymethods]
impl PyEndpoint {
    /// The transport's name.
    #[getter]
    fn name(&self) -> String {
        self.inner.name().to_owned()
    }

    /// Registers a fresh zeroed buffer of `size` bytes.
    fn reg(&self, py: Python<'_>, size: usize) -> PyResult<()> {
        let e = Arc::clone(&self.inner);
        detach(py, move || e.reg(size).map(drop).map_err(core_err))
    }

    /// Shares the buffer registered on `other`.
    fn reg_shared(&self, other: &PyEndpoint) -> PyResult<()> {
        self.inner
            .reg_shared(&other.inner)
            .map(drop)
            .map_err(core_err)
    }

    /// True once a buffer is registered.
    fn registered(&self) -> bool {
        self.inner.buffer().is_ok()
    }

    /// The registered buffer (raises `MemoryError` if none).
    fn buffer(&self) -> PyResult<RegisteredBytes> {
        Ok(RegisteredBytes {
            buf: self.inner.buffer().map_err(core_err)?,
        })
    }

    /// Copies `size` bytes from remote `addr` into the buffer at `offset`.
    fn read(&self, py: Python<'_>, size: usize, addr: u64, offset: usize) -> PyResult<()> {
        let e = Arc::clone(&self.inner);
        detach(py, move || e.read(size, addr, offset).map_err(core_err))
    }

    /// Copies `size` bytes of the buffer at `offset` to remote `addr`.
    fn write(&self, py: Python<'_>, size: usize, addr: u64, offset: usize) -> PyResult<()> {
        let e = Arc::clone(&self.inner);
        detach(py, move || e.write(size, addr, offset).map_err(core_err))
    }

    /// Reads `dst.size` bytes at remote `addr` straight into the uint8 array `dst` (no
    /// registered buffer, no cache): the raw transport read.
    fn read_into(
        &self,
        py: Python<'_>,
        addr: u64,
        mut dst: PyReadwriteArray1<'_, u8>,
    ) -> PyResult<()> {
        let e = Arc::clone(&self.inner);
        let dst = dst
            .as_slice_mut()
            .map_err(|err| PyValueError::new_err(err.to_string()))?;
        detach(py, move || e.read_into(addr, dst).map_err(core_err))
    }

    /// Writes the uint8 array `src` to remote `addr` (no registered buffer, no cache).
    fn write_from(&self, py: Python<'_>, addr: u64, src: PyReadonlyArray1<'_, u8>) -> PyResult<()> {
        let e = Arc::clone(&self.inner);
        let src = src
            .as_slice()
            .map_err(|err| PyValueError::new_err(err.to_string()))?;
        detach(py, move || e.write_from(addr, src).map_err(core_err))
    }

    /// Waits until the transport is configured; returns the remote size in bytes.
    fn wait_ready(&self, py: Python<'_>) -> PyResult<u64> {
        let e = Arc::clone(&self.inner);
        detach(py, move || {
            e.transport()
                .and_then(|t| t.remote_size())
                .map_err(core_err)
        })
    }

    /// Bytes and calls moved so far: dict with reads, writes, bytes_read, bytes_written.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats();
        let d = PyDict::new(py);
        d.set_item("reads", s.read_ops)?;
        d.set_item("writes", s.write_ops)?;
        d.set_item("bytes_read", s.bytes_read)?;
        d.set_item("bytes_written", s.bytes_written)?;
        Ok(d)
    }
}
