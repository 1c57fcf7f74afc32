//! Column chunks to and from their Arrow buffers.
//!
//! Writing borrows the buffers of Polars' own arrays (no re-encoding: primitive
//! values, string views and their data buffers go out as they are; only bitmaps with
//! a bit offset are re-packed). Reading fills typed local vectors straight from the
//! transport and wraps them as arrays without another copy; every array is built
//! through the checked constructors, so corrupted remote bytes give an error, never
//! undefined behaviour.

use polars::prelude::{AnyValue, ArrayRef, CompatLevel, DataType, Series};
use polars_arrow::array::{Array, BooleanArray, NullArray, PrimitiveArray, Utf8ViewArray, View};
use polars_arrow::bitmap::Bitmap;
use polars_arrow::datatypes::ArrowDataType;
use polars_arrow::types::NativeType;
use polars_buffer::Buffer;

use crate::error::{Error, Result};
use crate::meta::{ColumnChunk, ColumnStats, ColumnType, MAX_STAT_STRING};

/// The storable type of a Polars data type.
///
/// # Errors
/// [`Error::UnsupportedType`].
pub fn column_type(name: &str, dtype: &DataType) -> Result<ColumnType> {
    Ok(match dtype {
        DataType::Boolean => ColumnType::Boolean,
        DataType::Int8 => ColumnType::Int8,
        DataType::Int16 => ColumnType::Int16,
        DataType::Int32 => ColumnType::Int32,
        DataType::Int64 => ColumnType::Int64,
        DataType::UInt8 => ColumnType::UInt8,
        DataType::UInt16 => ColumnType::UInt16,
        DataType::UInt32 => ColumnType::UInt32,
        DataType::UInt64 => ColumnType::UInt64,
        DataType::Float32 => ColumnType::Float32,
        DataType::Float64 => ColumnType::Float64,
        DataType::Date => ColumnType::Date,
        DataType::Decimal(p, s) => ColumnType::Decimal {
            precision: *p,
            scale: *s,
        },
        DataType::String => ColumnType::String,
        DataType::Null => ColumnType::Null,
        other => {
            return Err(Error::UnsupportedType {
                column: name.to_owned(),
                dtype: other.to_string(),
            })
        }
    })
}

/// The Polars data type of a stored type.
pub fn polars_type(t: ColumnType) -> DataType {
    match t {
        ColumnType::Boolean => DataType::Boolean,
        ColumnType::Int8 => DataType::Int8,
        ColumnType::Int16 => DataType::Int16,
        ColumnType::Int32 => DataType::Int32,
        ColumnType::Int64 => DataType::Int64,
        ColumnType::UInt8 => DataType::UInt8,
        ColumnType::UInt16 => DataType::UInt16,
        ColumnType::UInt32 => DataType::UInt32,
        ColumnType::UInt64 => DataType::UInt64,
        ColumnType::Float32 => DataType::Float32,
        ColumnType::Float64 => DataType::Float64,
        ColumnType::Date => DataType::Date,
        ColumnType::Decimal { precision, scale } => DataType::Decimal(precision, scale),
        ColumnType::String => DataType::String,
        ColumnType::Null => DataType::Null,
    }
}

fn arrow_type(t: ColumnType) -> ArrowDataType {
    match t {
        ColumnType::Boolean => ArrowDataType::Boolean,
        ColumnType::Int8 => ArrowDataType::Int8,
        ColumnType::Int16 => ArrowDataType::Int16,
        ColumnType::Int32 => ArrowDataType::Int32,
        ColumnType::Int64 => ArrowDataType::Int64,
        ColumnType::UInt8 => ArrowDataType::UInt8,
        ColumnType::UInt16 => ArrowDataType::UInt16,
        ColumnType::UInt32 => ArrowDataType::UInt32,
        ColumnType::UInt64 => ArrowDataType::UInt64,
        ColumnType::Float32 => ArrowDataType::Float32,
        ColumnType::Float64 => ArrowDataType::Float64,
        ColumnType::Date => ArrowDataType::Date32,
        ColumnType::Decimal { precision, scale } => ArrowDataType::Decimal(precision, scale),
        ColumnType::String => ArrowDataType::Utf8View,
        ColumnType::Null => ArrowDataType::Null,
    }
}

/// A bitmap as bytes starting at bit 0 (re-packed if it had a bit offset).
fn bitmap_bytes(b: &Bitmap) -> Vec<u8> {
    let (bytes, offset, len) = b.as_slice();
    if offset % 8 == 0 {
        let start = offset / 8;
        bytes[start..start + len.div_ceil(8)].to_vec()
    } else {
        let packed: Bitmap = b.iter().collect();
        let (bytes, offset, len) = packed.as_slice();
        bytes[offset / 8..offset / 8 + len.div_ceil(8)].to_vec()
    }
}

/// The smallest and largest value of `series` as stored statistics; `None` when
/// there are none to keep (all null, NaN, long strings, a reduction Polars lacks).
fn column_stats(series: &Series, dtype: ColumnType) -> Option<ColumnStats> {
    if dtype == ColumnType::Null || series.null_count() == series.len() {
        return None;
    }
    if matches!(dtype, ColumnType::Float32 | ColumnType::Float64) && series.is_nan().ok()?.any() {
        return None;
    }
    let min = stat_value(series.min_reduce().ok()?.value())?;
    let max = stat_value(series.max_reduce().ok()?.value())?;
    Some(ColumnStats { min, max })
}

fn stat_value(v: &AnyValue<'_>) -> Option<serde_json::Value> {
    use serde_json::Value;
    Some(match v {
        AnyValue::Boolean(b) => Value::Bool(*b),
        AnyValue::Int8(x) => Value::from(*x),
        AnyValue::Int16(x) => Value::from(*x),
        AnyValue::Int32(x) => Value::from(*x),
        AnyValue::Int64(x) => Value::from(*x),
        AnyValue::UInt8(x) => Value::from(*x),
        AnyValue::UInt16(x) => Value::from(*x),
        AnyValue::UInt32(x) => Value::from(*x),
        AnyValue::UInt64(x) => Value::from(*x),
        AnyValue::Float32(x) => Value::Number(serde_json::Number::from_f64(f64::from(*x))?),
        AnyValue::Float64(x) => Value::Number(serde_json::Number::from_f64(*x)?),
        AnyValue::Date(d) => Value::from(*d),
        AnyValue::Decimal(unscaled, _, _) => Value::String(unscaled.to_string()),
        AnyValue::String(s) if s.len() <= MAX_STAT_STRING => Value::String((*s).to_owned()),
        AnyValue::StringOwned(s) if s.len() <= MAX_STAT_STRING => Value::String(s.to_string()),
        _ => return None,
    })
}

/// One column of one chunk, ready to be written: the array (kept alive so its
/// buffers can be borrowed) and the bitmaps re-packed to start at bit 0.
pub struct EncodedColumn {
    /// Stored type.
    pub dtype: ColumnType,
    /// Nulls.
    pub null_count: u64,
    /// Smallest and largest value, when known (see [`ColumnStats`]).
    pub stats: Option<ColumnStats>,
    validity: Option<Vec<u8>>,
    bool_values: Option<Vec<u8>>,
    array: ArrayRef,
}

impl EncodedColumn {
    /// Encodes a series of one chunk (callers rechunk).
    ///
    /// # Errors
    /// [`Error::UnsupportedType`].
    pub fn new(series: &Series) -> Result<Self> {
        let dtype = column_type(series.name(), series.dtype())?;
        let mut array = if series.is_empty() {
            Series::new_empty(series.name().clone(), series.dtype())
                .to_arrow(0, CompatLevel::newest())
        } else {
            series.to_arrow(0, CompatLevel::newest())
        };
        if dtype == ColumnType::String {
            // Slices and gathers share their parent's data buffers; when most of
            // those bytes belong to other rows, write only what these rows use.
            if let Some(a) = array.as_any().downcast_ref::<Utf8ViewArray>() {
                let used: usize = a
                    .views()
                    .iter()
                    .filter(|v| v.length > View::MAX_INLINE_SIZE)
                    .map(|v| v.length as usize)
                    .sum();
                if a.total_buffer_len() > used + used / 4 + 256 {
                    array = Box::new(a.clone().gc());
                }
            }
        }
        let null_count = if dtype == ColumnType::Null {
            array.len() as u64
        } else {
            array.null_count() as u64
        };
        let validity = match (dtype, array.validity()) {
            (ColumnType::Null, _) => None,
            (_, Some(v)) if null_count > 0 => Some(bitmap_bytes(v)),
            _ => None,
        };
        let bool_values = array
            .as_any()
            .downcast_ref::<BooleanArray>()
            .map(|a| bitmap_bytes(a.values()));
        Ok(EncodedColumn {
            dtype,
            null_count,
            stats: column_stats(series, dtype),
            validity,
            bool_values,
            array,
        })
    }

    /// The buffers in stored order (see [`ColumnChunk`]).
    pub fn buffers(&self) -> Vec<&[u8]> {
        let mut out: Vec<&[u8]> = Vec::with_capacity(3);
        if let Some(v) = &self.validity {
            out.push(v);
        }
        fn values<T: NativeType>(a: &ArrayRef) -> &[u8] {
            a.as_any()
                .downcast_ref::<PrimitiveArray<T>>()
                .map(|p| bytemuck::cast_slice(p.values().as_slice()))
                .unwrap_or(&[])
        }
        let a = &self.array;
        match self.dtype {
            ColumnType::Null => {}
            ColumnType::Boolean => out.push(self.bool_values.as_deref().unwrap_or(&[])),
            ColumnType::Int8 => out.push(values::<i8>(a)),
            ColumnType::Int16 => out.push(values::<i16>(a)),
            ColumnType::Int32 | ColumnType::Date => out.push(values::<i32>(a)),
            ColumnType::Int64 => out.push(values::<i64>(a)),
            ColumnType::UInt8 => out.push(values::<u8>(a)),
            ColumnType::UInt16 => out.push(values::<u16>(a)),
            ColumnType::UInt32 => out.push(values::<u32>(a)),
            ColumnType::UInt64 => out.push(values::<u64>(a)),
            ColumnType::Float32 => out.push(values::<f32>(a)),
            ColumnType::Float64 => out.push(values::<f64>(a)),
            ColumnType::Decimal { .. } => out.push(values::<i128>(a)),
            ColumnType::String => {
                if let Some(s) = a.as_any().downcast_ref::<Utf8ViewArray>() {
                    out.push(bytemuck::cast_slice(s.views().as_slice()));
                    for b in s.data_buffers().iter() {
                        out.push(b.as_slice());
                    }
                }
            }
        }
        out
    }
}

/// A local destination for one stored buffer, typed so the array can own it without
/// another copy.
pub enum Dest {
    /// Bytes (bitmaps, string data).
    Bytes(Vec<u8>),
    /// i8 values.
    I8(Vec<i8>),
    /// i16 values.
    I16(Vec<i16>),
    /// i32 values (also dates).
    I32(Vec<i32>),
    /// i64 values.
    I64(Vec<i64>),
    /// u16 values.
    U16(Vec<u16>),
    /// u32 values.
    U32(Vec<u32>),
    /// u64 values.
    U64(Vec<u64>),
    /// f32 values.
    F32(Vec<f32>),
    /// f64 values.
    F64(Vec<f64>),
    /// i128 values (decimals).
    I128(Vec<i128>),
    /// String views.
    Views(Vec<View>),
}

impl Dest {
    /// The destination as bytes, for the transport to fill.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Dest::Bytes(v) => v,
            Dest::I8(v) => bytemuck::cast_slice_mut(v),
            Dest::I16(v) => bytemuck::cast_slice_mut(v),
            Dest::I32(v) => bytemuck::cast_slice_mut(v),
            Dest::I64(v) => bytemuck::cast_slice_mut(v),
            Dest::U16(v) => bytemuck::cast_slice_mut(v),
            Dest::U32(v) => bytemuck::cast_slice_mut(v),
            Dest::U64(v) => bytemuck::cast_slice_mut(v),
            Dest::F32(v) => bytemuck::cast_slice_mut(v),
            Dest::F64(v) => bytemuck::cast_slice_mut(v),
            Dest::I128(v) => bytemuck::cast_slice_mut(v),
            Dest::Views(v) => bytemuck::cast_slice_mut(v),
        }
    }

    fn into_bytes(self) -> Vec<u8> {
        match self {
            Dest::Bytes(v) => v,
            mut other => other.bytes_mut().to_vec(),
        }
    }
}

/// Typed destinations for the buffers of one column chunk (lengths from the
/// validated metadata).
pub fn destinations(dtype: ColumnType, rows: usize, cc: &ColumnChunk) -> Vec<Dest> {
    let mut out = Vec::with_capacity(cc.buffers.len());
    let mut bufs = cc.buffers.iter();
    if cc.null_count > 0 && dtype != ColumnType::Null {
        if let Some(b) = bufs.next() {
            out.push(Dest::Bytes(vec![0; b.len as usize]));
        }
    }
    let mut first = true;
    for b in bufs {
        let len = b.len as usize;
        let d = match (dtype, first) {
            (ColumnType::Int8, _) => Dest::I8(vec![0; rows]),
            (ColumnType::Int16, _) => Dest::I16(vec![0; rows]),
            (ColumnType::Int32 | ColumnType::Date, _) => Dest::I32(vec![0; rows]),
            (ColumnType::Int64, _) => Dest::I64(vec![0; rows]),
            (ColumnType::UInt16, _) => Dest::U16(vec![0; rows]),
            (ColumnType::UInt32, _) => Dest::U32(vec![0; rows]),
            (ColumnType::UInt64, _) => Dest::U64(vec![0; rows]),
            (ColumnType::Float32, _) => Dest::F32(vec![0.0; rows]),
            (ColumnType::Float64, _) => Dest::F64(vec![0.0; rows]),
            (ColumnType::Decimal { .. }, _) => Dest::I128(vec![0; rows]),
            (ColumnType::String, true) => Dest::Views(vec![View::default(); rows]),
            _ => Dest::Bytes(vec![0; len]),
        };
        first = false;
        out.push(d);
    }
    out
}

fn prim<T: NativeType>(
    t: ColumnType,
    v: Vec<T>,
    validity: Option<Bitmap>,
) -> Result<Box<dyn Array>> {
    Ok(Box::new(PrimitiveArray::<T>::try_new(
        arrow_type(t),
        Buffer::from(v),
        validity,
    )?))
}

/// Builds the array of one column chunk from its filled destinations.
///
/// # Errors
/// [`Error::Meta`] / [`Error::Polars`] when the bytes do not form a valid array (for
/// example string views pointing outside their data buffers, or invalid UTF-8).
pub fn decode(
    name: &str,
    dtype: ColumnType,
    rows: usize,
    cc: &ColumnChunk,
    dests: Vec<Dest>,
) -> Result<Box<dyn Array>> {
    let mut it = dests.into_iter();
    let validity = if cc.null_count > 0 && dtype != ColumnType::Null {
        let bytes = it
            .next()
            .ok_or_else(|| Error::Meta(format!("column {name:?}: validity missing")))?
            .into_bytes();
        Some(Bitmap::try_new(bytes, rows)?)
    } else {
        None
    };
    let missing = || Error::Meta(format!("column {name:?} ({dtype}): values buffer missing"));
    if dtype == ColumnType::Null {
        return Ok(Box::new(NullArray::new(ArrowDataType::Null, rows)));
    }
    let values = it.next().ok_or_else(missing)?;
    let wrong = || {
        Error::Meta(format!(
            "column {name:?} ({dtype}): buffer of the wrong kind"
        ))
    };
    match (dtype, values) {
        (ColumnType::Boolean, Dest::Bytes(v)) => Ok(Box::new(BooleanArray::try_new(
            ArrowDataType::Boolean,
            Bitmap::try_new(v, rows)?,
            validity,
        )?)),
        (ColumnType::Int8, Dest::I8(v)) => prim(dtype, v, validity),
        (ColumnType::Int16, Dest::I16(v)) => prim(dtype, v, validity),
        (ColumnType::Int32 | ColumnType::Date, Dest::I32(v)) => prim(dtype, v, validity),
        (ColumnType::Int64, Dest::I64(v)) => prim(dtype, v, validity),
        (ColumnType::UInt8, Dest::Bytes(v)) => prim(dtype, v, validity),
        (ColumnType::UInt16, Dest::U16(v)) => prim(dtype, v, validity),
        (ColumnType::UInt32, Dest::U32(v)) => prim(dtype, v, validity),
        (ColumnType::UInt64, Dest::U64(v)) => prim(dtype, v, validity),
        (ColumnType::Float32, Dest::F32(v)) => prim(dtype, v, validity),
        (ColumnType::Float64, Dest::F64(v)) => prim(dtype, v, validity),
        (ColumnType::Decimal { .. }, Dest::I128(v)) => prim(dtype, v, validity),
        (ColumnType::String, Dest::Views(views)) => {
            let data: Vec<Buffer<u8>> = it.map(|d| Buffer::from(d.into_bytes())).collect();
            Ok(Box::new(Utf8ViewArray::try_new(
                ArrowDataType::Utf8View,
                Buffer::from(views),
                Buffer::from(data),
                validity,
            )?))
        }
        _ => Err(wrong()),
    }
}
