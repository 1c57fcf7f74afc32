//! # scad-py — the native part of the `scad` Python wheel (`scad._native`)
//!
//! - [`action`]: `Action` and `Endpoint` (libd), under `disagg`.
//! - [`buffer`]: the buffer protocol over registered buffers (`trans.buf`).
//! - [`pool`]: `BufferPool`, `Store` and `RemoteBytes`, under `disaggrt` and
//!   `scad.RemoteArray`.
//! - [`join`]: the `npjoin` functions over NumPy arrays (kernels in the
//!   `scad-npjoin` crate).
//! - [`server`]: embedded memory servers and the `memory_server` console script.
//! - [`frame`]: `FrameEnv` and `Frame` (scad-remote-frame) behind `scad.RemoteFrame`,
//!   with data in and out through the Arrow PyCapsule interface ([`arrow_ffi`]) and
//!   expressions as JSON trees (`scad_remote_frame::expr_json`).
//! - [`query`]: `QuerySession` and `QueryResult`, SQL over frames (the query engine of
//!   scad-remote-frame) behind `scad.sql`.
//!
//! Every transport operation and kernel runs with the GIL released; Rust errors become
//! Python exceptions ([`errors`]), and panics are caught at the boundary.
//!

use pyo3::prelude::*;

pub mod action;
pub mod arrow_ffi;
pub mod buffer;
pub mod distributed;
pub mod errors;
pub mod frame;
pub mod join;
pub mod pool;
pub mod query;
pub mod server;

/// The `scad._native` extension module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("ScadError", py.get_type::<errors::ScadError>())?;
    m.add("TerminatedError", py.get_type::<errors::TerminatedError>())?;
    m.add(
        "BudgetExceededError",
        py.get_type::<errors::BudgetExceededError>(),
    )?;
    m.add("QueryError", py.get_type::<errors::QueryError>())?;
    m.add("UnknownNameError", errors::unknown_name_error(py)?)?;
    m.add("FreedFrameError", py.get_type::<errors::FreedFrameError>())?;
    m.add("StaleFrameError", py.get_type::<errors::StaleFrameError>())?;
    m.add_class::<frame::PyFrameEnv>()?;
    m.add_class::<frame::PyFrame>()?;
    m.add_class::<query::PyQuerySession>()?;
    m.add_class::<query::PyQueryResult>()?;
    m.add_class::<distributed::PyDistributedQuery>()?;
    m.add_class::<distributed::PyAnswer>()?;
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
    m.add_function(wrap_pyfunction!(query::sql_in_env, m)?)?;
    m.add_function(wrap_pyfunction!(distributed::run_task, m)?)?;
    m.add_function(wrap_pyfunction!(query::explain_in_env, m)?)?;
    m.add_function(wrap_pyfunction!(query::env_sessions_started, m)?)?;
    m.add_function(wrap_pyfunction!(server::py_parse_size, m)?)?;
    m.add_function(wrap_pyfunction!(server::memory_server_main, m)?)?;
    Ok(())
}
