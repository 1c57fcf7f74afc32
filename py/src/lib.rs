//! # scad-py — the native part of the `scad` Python wheel (`scad._native`)
//!
//! - [`action`]: `Action` and `Endpoint` (libd), under `disagg`.
//! - [`buffer`]: the buffer protocol over registered buffers (`trans.buf`).
//! - [`pool`]: `BufferPool`, `Store` and `RemoteBytes`, under `disaggrt` and
//!   `scad.RemoteArray`.
//! - [`join`]: the `npjoin` kernels.
//! - [`server`]: embedded memory servers and the `memory_server` console script.
//!
//! Every transport operation and kernel runs with the GIL released; Rust errors become
//! Python exceptions ([`errors`]), and panics are caught at the boundary.
//!
//! `RemoteFrame` bindings are not here yet: they follow once the remote-frame crate
//! lands.

use pyo3::prelude::*;

pub mod action;
pub mod buffer;
pub mod errors;
pub mod join;
pub mod pool;
pub mod server;

/// The `scad._native` extension module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("ScadError", py.get_type::<errors::ScadError>())?;
    m.add("TerminatedError", py.get_type::<errors::TerminatedError>())?;
    m.add_class::<action::PyAction>()?;
    m.add_class::<action::PyEndpoint>()?;
    m.add_class::<buffer::RegisteredBytes>()?;
    m.add_class::<pool::PyPool>()?;
    m.add_class::<pool::PyStore>()?;
    m.add_class::<pool::RemoteBytes>()?;
    m.add_class::<join::JoinTable>()?;
    m.add_class::<server::PyMemoryServer>()?;
    m.add_function(wrap_pyfunction!(join::prepare_join, m)?)?;
    m.add_function(wrap_pyfunction!(join::join_on_table, m)?)?;
    m.add_function(wrap_pyfunction!(join::partition_on, m)?)?;
    m.add_function(wrap_pyfunction!(join::partition_on_pair, m)?)?;
    m.add_function(wrap_pyfunction!(join::groupsort_indexer, m)?)?;
    m.add_function(wrap_pyfunction!(server::py_parse_size, m)?)?;
    m.add_function(wrap_pyfunction!(server::memory_server_main, m)?)?;
    Ok(())
}
