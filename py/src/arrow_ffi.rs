//! The Arrow PyCapsule interface: Arrow C streams in and out of Python capsules named
//! `"arrow_array_stream"` (what `__arrow_c_stream__` returns in PyArrow, Polars,
//! DuckDB, pandas...). The only `unsafe` code of the frame bindings is here.

use std::ffi::CString;

use arrow_array::ffi_stream::{ArrowArrayStreamReader, FFI_ArrowArrayStream};
use arrow_array::{RecordBatch, RecordBatchIterator, RecordBatchReader};
use arrow_schema::SchemaRef;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

/// Name the Arrow PyCapsule interface gives stream capsules.
pub const STREAM_CAPSULE: &str = "arrow_array_stream";

/// Wraps a record batch reader as a stream capsule. The consumer moves the stream out
/// (setting the capsule's copy's `release` to null); if nobody does, dropping the
/// capsule releases it (`FFI_ArrowArrayStream`'s `Drop` calls `release` when set).
///
/// # Errors
/// Python errors creating the capsule.
pub fn export_stream(
    py: Python<'_>,
    reader: Box<dyn RecordBatchReader + Send>,
) -> PyResult<Bound<'_, PyCapsule>> {
    let stream = FFI_ArrowArrayStream::new(reader);
    let name = CString::new(STREAM_CAPSULE).map_err(|e| PyValueError::new_err(e.to_string()))?;
    // pyo3 keeps the value as the first field of a `#[repr(C)]` box, so the capsule's
    // pointer is a valid `ArrowArrayStream*` for as long as the capsule lives.
    PyCapsule::new(py, stream, Some(name))
}

/// Record batches in local memory as a stream capsule (the consumer shares their
/// buffers).
///
/// # Errors
/// Python errors creating the capsule.
pub fn export_batches(
    py: Python<'_>,
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
) -> PyResult<Bound<'_, PyCapsule>> {
    let reader = RecordBatchIterator::new(batches.into_iter().map(Ok), schema);
    export_stream(py, Box::new(reader))
}

/// Takes the stream out of an `"arrow_array_stream"` capsule and opens a reader on it.
///
/// # Errors
/// `ValueError` for a capsule of another name, a stream already consumed, or a
/// stream whose schema cannot be read.
pub fn import_stream(capsule: &Bound<'_, PyCapsule>) -> PyResult<ArrowArrayStreamReader> {
    let name = capsule.name()?;
    if name.map(|n| n.to_bytes()) != Some(STREAM_CAPSULE.as_bytes()) {
        return Err(PyValueError::new_err(format!(
            "expected a PyCapsule named {STREAM_CAPSULE:?} (from __arrow_c_stream__), got {:?}",
            name.map(|n| n.to_string_lossy().into_owned())
        )));
    }
    let ptr = capsule.pointer().cast::<FFI_ArrowArrayStream>();
    if ptr.is_null() {
        return Err(PyValueError::new_err(
            "the Arrow stream capsule holds a null pointer",
        ));
    }
    // SAFETY: a capsule named "arrow_array_stream" holds a pointer to a live
    // `ArrowArrayStream` struct (the PyCapsule interface's contract; checked non-null
    // above). `from_raw` moves the struct out and leaves a released (empty) one
    // behind, which the capsule's own destructor then ignores, so the stream is
    // released exactly once, by the reader.
    let stream = unsafe { FFI_ArrowArrayStream::from_raw(ptr) };
    if stream.release.is_none() {
        return Err(PyValueError::new_err(
            "the Arrow stream was already consumed (a capsule can be read once)",
        ));
    }
    ArrowArrayStreamReader::try_new(stream)
        .map_err(|e| PyValueError::new_err(format!("cannot read the Arrow stream: {e}")))
}
