//! Every Rust error becomes a Python exception of a fitting standard class (or a
//! `ScadError`), and every call that does I/O or heavy work runs with the GIL released
//! and with panics caught, so no panic unwinds into the interpreter.

use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::create_exception;
use pyo3::exceptions::{
    PyConnectionError, PyIndexError, PyKeyError, PyMemoryError, PyOSError, PyRuntimeError,
    PyTimeoutError, PyTypeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::{PyDict, PyTuple, PyType};

create_exception!(
    _native,
    ScadError,
    PyRuntimeError,
    "Base class of errors raised by Scad's native code that no standard exception fits."
);
create_exception!(
    _native,
    TerminatedError,
    ScadError,
    "The transport was released or its action terminated."
);

create_exception!(
    _native,
    BudgetExceededError,
    ScadError,
    "A remote-frame kernel or query operator cannot fit its work into the local memory budget (or a skewed key cannot be split)."
);

create_exception!(
    _native,
    QueryError,
    ScadError,
    "A SQL query failed to plan or run: a syntax or type error, an unknown table or column, \
     a statement other than a query (DDL, DML), a failing operator."
);

create_exception!(
    _native,
    FreedFrameError,
    ScadError,
    "The frame was freed through this handle or another handle of it: every later use raises."
);

create_exception!(
    _native,
    StaleFrameError,
    ScadError,
    "Memory no longer holds the frame the metadata describes: it was freed (in this process \
     or another), its memory reused or overwritten, or the metadata changed."
);

/// `UnknownNameError(QueryError, KeyError)`, made once per interpreter: pyo3's
/// `create_exception!` takes one base class, and this one has two.
static UNKNOWN_NAME_ERROR: GILOnceCell<Py<PyType>> = GILOnceCell::new();

/// The class of query errors that name an unknown table or column: a `QueryError`
/// that is also a `KeyError` (whose message prints without `KeyError`'s quotes).
///
/// # Errors
/// Python errors creating the class.
pub fn unknown_name_error(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    UNKNOWN_NAME_ERROR
        .get_or_try_init(py, || {
            let bases = PyTuple::new(
                py,
                [
                    py.get_type::<QueryError>(),
                    py.get_type::<pyo3::exceptions::PyKeyError>(),
                ],
            )?;
            let dict = PyDict::new(py);
            dict.set_item("__module__", "scad._native")?;
            dict.set_item(
                "__doc__",
                "A query names a table or column that does not exist (a QueryError and a KeyError).",
            )?;
            let base_exception = py.get_type::<pyo3::exceptions::PyBaseException>();
            dict.set_item("__str__", base_exception.getattr("__str__")?)?;
            let class = py
                .get_type::<PyType>()
                .call1(("UnknownNameError", bases, dict))?
                .downcast_into::<PyType>()?;
            Ok(class.unbind())
        })
        .map(|class| class.bind(py))
}

/// The Python exception for a scad-core error.
pub fn core_err(e: scad_core::Error) -> PyErr {
    use scad_core::Error as E;
    let msg = e.to_string();
    match e {
        E::NotRegistered { .. } | E::Alloc { .. } => PyMemoryError::new_err(msg),
        E::OutOfRange { .. } | E::BufferRange { .. } => PyIndexError::new_err(msg),
        E::Durl { .. } | E::InvalidArgument(_) => PyValueError::new_err(msg),
        E::UnknownTransport { .. } => PyKeyError::new_err(msg),
        E::Timeout { .. } => PyTimeoutError::new_err(msg),
        E::Terminated { .. } => TerminatedError::new_err(msg),
        E::Connect { .. } => PyConnectionError::new_err(msg),
        E::Io { .. } | E::Shm { .. } => PyOSError::new_err(msg),
        // The OS refused (address in use, no permission): an `OSError` with its errno
        // and its words, so callers catch it like a failed `socket.bind`.
        E::Server {
            source: Some(ref io),
            ..
        } => PyOSError::new_err((io.raw_os_error().unwrap_or(0), format!("{msg}: {io}"))),
        _ => ScadError::new_err(msg),
    }
}

/// The Python exception for a scad-remote-array error.
pub fn array_err(e: scad_remote_array::Error) -> PyErr {
    use scad_remote_array::Error as E;
    let msg = e.to_string();
    match e {
        // Keep the class of the transport's own error (connection refused, remote
        // range...), with the pool's context in the message.
        E::Transport { source, .. } => {
            let class = core_err(*source);
            Python::with_gil(|py| {
                let ty = class.get_type(py);
                PyErr::from_type(ty, msg)
            })
        }
        E::OutOfRange { .. } | E::RemoteRange { .. } => PyIndexError::new_err(msg),
        E::OutOfRemoteMemory { .. } | E::PoolAlloc { .. } => PyMemoryError::new_err(msg),
        E::UnknownElement { .. } => PyKeyError::new_err(msg),
        E::TypeMismatch { .. } => PyTypeError::new_err(msg),
        E::Timeout { .. } => PyTimeoutError::new_err(msg),
        E::Config(_)
        | E::Shape(_)
        | E::Meta(_)
        | E::MetaJson(_)
        | E::InvalidArgument(_)
        | E::DuplicateElement { .. }
        | E::BadFree { .. } => PyValueError::new_err(msg),
        _ => ScadError::new_err(msg),
    }
}

/// Runs `f` without the GIL, turning a panic into a `ScadError`.
pub fn detach<T, F>(py: Python<'_>, f: F) -> PyResult<T>
where
    F: Send + FnOnce() -> PyResult<T>,
    T: Send,
{
    py.allow_threads(|| {
        catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|panic| {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_owned());
            Err(ScadError::new_err(format!(
                "internal error in scad native code: {what}"
            )))
        })
    })
}
