//! Polars DataFrames to and from arrow-rs `RecordBatch`es, through the Arrow C data
//! interface (buffers are shared, not copied).
//!
//! Polars (polars-arrow) and arrow-rs each define the C interface structs as
//! `#[repr(C)]` types of the layout the Arrow specification fixes; a value of one is
//! handed to the other by reinterpreting it. This module and `views` (string views
//! read back, checked buffer by buffer) hold the crate's only `unsafe` code.

use std::sync::Arc;

use arrow_array::{make_array, ArrayRef as ArrowArrayRef, RecordBatch};
use arrow_data::ffi::FFI_ArrowArray;
use arrow_schema::ffi::FFI_ArrowSchema;
use arrow_schema::{Field, Schema as ArrowSchema};
use polars::prelude::{CompatLevel, DataFrame, IntoColumn, PlSmallStr, Series};
use polars_arrow::ffi as pa_ffi;

use crate::error::{Error, Result};

// The two sides' structs must have the same size for the reinterpretation below.
const _: () =
    assert!(std::mem::size_of::<pa_ffi::ArrowArray>() == std::mem::size_of::<FFI_ArrowArray>());
const _: () =
    assert!(std::mem::size_of::<pa_ffi::ArrowSchema>() == std::mem::size_of::<FFI_ArrowSchema>());

fn polars_to_arrow(
    array: Box<dyn polars_arrow::array::Array>,
    name: &str,
) -> Result<ArrowArrayRef> {
    if array.dtype() == &polars_arrow::datatypes::ArrowDataType::Null {
        // Polars exports a null array with a buffer slot arrow-rs refuses; it has no
        // data to share anyway.
        return Ok(Arc::new(arrow_array::NullArray::new(array.len())));
    }
    let field =
        polars_arrow::datatypes::Field::new(PlSmallStr::from(name), array.dtype().clone(), true);
    let c_schema = pa_ffi::export_field_to_c(&field);
    let c_array = pa_ffi::export_array_to_c(array);
    // SAFETY: both types are `#[repr(C)]` renderings of the Arrow C data interface
    // structs (same fields, same order; sizes asserted above). Ownership, including
    // the release callback, moves with the value, so it is released exactly once.
    let (c_array, c_schema) = unsafe {
        (
            std::mem::transmute::<pa_ffi::ArrowArray, FFI_ArrowArray>(c_array),
            std::mem::transmute::<pa_ffi::ArrowSchema, FFI_ArrowSchema>(c_schema),
        )
    };
    // SAFETY: the structs were just produced by a conforming exporter (polars-arrow).
    let data = unsafe { arrow_array::ffi::from_ffi(c_array, &c_schema) }?;
    Ok(make_array(data))
}

fn arrow_to_polars(array: &ArrowArrayRef, name: &str) -> Result<Series> {
    let (c_array, c_schema) = arrow_array::ffi::to_ffi(&array.to_data())?;
    // SAFETY: as in `polars_to_arrow`, the other way round.
    let (c_array, c_schema) = unsafe {
        (
            std::mem::transmute::<FFI_ArrowArray, pa_ffi::ArrowArray>(c_array),
            std::mem::transmute::<FFI_ArrowSchema, pa_ffi::ArrowSchema>(c_schema),
        )
    };
    // SAFETY: the structs come from a conforming exporter (arrow-rs) and the array is
    // imported with the type its own schema declares.
    let imported = unsafe {
        let field = pa_ffi::import_field_from_c(&c_schema)?;
        pa_ffi::import_array_from_c(c_array, field.dtype)?
    };
    Ok(Series::from_arrow(PlSmallStr::from(name), imported)?)
}

/// A DataFrame as record batches, one per chunk of its columns.
///
/// # Errors
/// [`Error::Arrow`] when arrow-rs rejects an array.
pub fn to_record_batches(df: &DataFrame) -> Result<Vec<RecordBatch>> {
    let mut df = df.clone();
    df.align_chunks_par();
    let names: Vec<String> = df
        .get_column_names()
        .iter()
        .map(|s| s.to_string())
        .collect();
    let n_chunks = df
        .columns()
        .first()
        .map(|c| c.as_materialized_series().n_chunks())
        .unwrap_or(0);
    let mut out = Vec::with_capacity(n_chunks);
    for i in 0..n_chunks {
        let mut fields = Vec::with_capacity(names.len());
        let mut arrays = Vec::with_capacity(names.len());
        for (c, name) in df.columns().iter().zip(&names) {
            let a = polars_to_arrow(
                c.as_materialized_series()
                    .to_arrow(i, CompatLevel::newest()),
                name,
            )?;
            fields.push(Field::new(name, a.data_type().clone(), true));
            arrays.push(a);
        }
        out.push(RecordBatch::try_new(
            Arc::new(ArrowSchema::new(fields)),
            arrays,
        )?);
    }
    Ok(out)
}

/// Record batches (all of one schema) as one DataFrame.
///
/// # Errors
/// [`Error::InvalidArgument`] for batches of different schemas; [`Error::Polars`] for
/// types Polars cannot take.
pub fn from_record_batches(batches: &[RecordBatch]) -> Result<DataFrame> {
    let Some(first) = batches.first() else {
        return Err(Error::InvalidArgument("no record batches given".into()));
    };
    let schema = first.schema();
    let mut out: Option<DataFrame> = None;
    for (k, b) in batches.iter().enumerate() {
        if b.schema().fields() != schema.fields() {
            return Err(Error::InvalidArgument(format!(
                "record batch {k} has schema {:?}, batch 0 has {:?}",
                b.schema(),
                schema
            )));
        }
        let cols = b
            .columns()
            .iter()
            .zip(schema.fields())
            .map(|(a, f)| Ok(arrow_to_polars(a, f.name())?.into_column()))
            .collect::<Result<Vec<_>>>()?;
        let df = DataFrame::new(b.num_rows(), cols)?;
        match &mut out {
            None => out = Some(df),
            Some(acc) => {
                acc.vstack_mut_owned(df)?;
            }
        }
    }
    out.ok_or_else(|| Error::InvalidArgument("no record batches given".into()))
}
