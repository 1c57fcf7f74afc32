//! Column chunks to and from their Arrow buffers.
//!
//! Writing borrows the buffers of arrow-rs arrays where it can (string views and their
//! data buffers, floats, and integers spanning a wide range go out as they are; only
//! bitmaps with a bit offset are re-packed). Integers, dates and decimals whose chunk
//! spans a small range are packed ([`Packing`]): the offsets from the chunk's
//! smallest value in 1, 2, 4 or 8 bytes. Strings whose chunk holds few distinct values
//! are stored as a [`Dictionary`]: the distinct strings once and a 1- or 2-byte index
//! per row. Reading fills typed local vectors straight from the transport and wraps
//! them as arrow-rs arrays without another copy (packed values are unpacked into a
//! vector of their type, dictionary indices gathered into views, one pass each); every
//! array is built through the checked constructors (or from views of one so built),
//! so corrupted remote bytes give an error, never undefined behaviour.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    ArrowPrimitiveType, Date32Type, Decimal128Type, Float32Type, Float64Type, Int16Type, Int32Type,
    Int64Type, Int8Type, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use arrow_array::{Array, ArrayRef, BooleanArray, NullArray, PrimitiveArray, StringViewArray};
use arrow_buffer::{BooleanBuffer, Buffer, NullBuffer, ScalarBuffer};
use arrow_schema::DataType;
use datafusion::arrow::compute;

use crate::error::{Error, Result};
use crate::meta::{ColumnChunk, ColumnStats, ColumnType, Dictionary, Packing, MAX_STAT_STRING};

/// The storable type of an arrow-rs data type. Strings of any Arrow layout are stored
/// as views (see [`storable`]).
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
        DataType::Date32 => ColumnType::Date,
        DataType::Decimal128(p, s) if *s >= 0 => ColumnType::Decimal {
            precision: usize::from(*p),
            scale: usize::from(s.unsigned_abs()),
        },
        DataType::Utf8View | DataType::Utf8 | DataType::LargeUtf8 => ColumnType::String,
        DataType::Null => ColumnType::Null,
        other => {
            return Err(Error::UnsupportedType {
                column: name.to_owned(),
                dtype: other.to_string(),
            })
        }
    })
}

/// `array` in the layout its stored type is kept in (strings as views), cast if it is
/// in another.
///
/// # Errors
/// [`Error::UnsupportedType`]; [`Error::Arrow`] when the cast fails.
pub fn storable(name: &str, array: &ArrayRef) -> Result<(ColumnType, ArrayRef)> {
    let t = column_type(name, array.data_type())?;
    let want = t.arrow_type()?;
    if array.data_type() == &want {
        Ok((t, array.clone()))
    } else {
        Ok((t, compute::cast(array, &want)?))
    }
}

/// A bitmap as bytes starting at bit 0 (re-packed only if it has a bit offset).
fn bitmap_bytes(b: &BooleanBuffer) -> Buffer {
    b.sliced()
}

/// The smallest and largest value of `array` as stored statistics; `None` when there
/// are none to keep (all null, NaN, long strings).
fn column_stats(array: &ArrayRef, dtype: ColumnType) -> Option<ColumnStats> {
    use serde_json::Value;
    if dtype == ColumnType::Null || array.null_count() == array.len() {
        return None;
    }
    fn ints<T>(a: &ArrayRef) -> Option<(Value, Value)>
    where
        T: datafusion::arrow::datatypes::ArrowNumericType,
        T::Native: Into<Value>,
    {
        let a = a.as_primitive_opt::<T>()?;
        Some((compute::min(a)?.into(), compute::max(a)?.into()))
    }
    fn floats<T>(a: &ArrayRef) -> Option<(Value, Value)>
    where
        T: datafusion::arrow::datatypes::ArrowNumericType,
        T::Native: Into<f64>,
    {
        // NaN sorts above (or, negative, below) every number: a chunk holding one
        // has no bounds to keep.
        let a = a.as_primitive_opt::<T>()?;
        let number = |x: T::Native| serde_json::Number::from_f64(x.into()).map(Value::Number);
        Some((number(compute::min(a)?)?, number(compute::max(a)?)?))
    }
    let (min, max) = match dtype {
        ColumnType::Boolean => {
            let a = array.as_boolean_opt()?;
            (
                Value::Bool(compute::min_boolean(a)?),
                Value::Bool(compute::max_boolean(a)?),
            )
        }
        ColumnType::Int8 => ints::<Int8Type>(array)?,
        ColumnType::Int16 => ints::<Int16Type>(array)?,
        ColumnType::Int32 => ints::<Int32Type>(array)?,
        ColumnType::Int64 => ints::<Int64Type>(array)?,
        ColumnType::UInt8 => ints::<UInt8Type>(array)?,
        ColumnType::UInt16 => ints::<UInt16Type>(array)?,
        ColumnType::UInt32 => ints::<UInt32Type>(array)?,
        ColumnType::UInt64 => ints::<UInt64Type>(array)?,
        ColumnType::Date => ints::<Date32Type>(array)?,
        ColumnType::Float32 => floats::<Float32Type>(array)?,
        ColumnType::Float64 => floats::<Float64Type>(array)?,
        ColumnType::Decimal { .. } => {
            let a = array.as_primitive_opt::<Decimal128Type>()?;
            (
                Value::String(compute::min(a)?.to_string()),
                Value::String(compute::max(a)?.to_string()),
            )
        }
        ColumnType::String => {
            let a = array.as_string_view_opt()?;
            let bound = |s: &str| (s.len() <= MAX_STAT_STRING).then(|| Value::String(s.into()));
            (
                bound(compute::min_string_view(a)?)?,
                bound(compute::max_string_view(a)?)?,
            )
        }
        ColumnType::Null => return None,
    };
    Some(ColumnStats { min, max })
}

/// The values of `array` (of type `dtype`) packed, when their range packs them into
/// fewer bytes than their type's: the packing and the packed values.
fn pack(array: &ArrayRef, dtype: ColumnType) -> Option<(Packing, Buffer)> {
    fn packed<T>(array: &ArrayRef, width: u64) -> Option<(Packing, Buffer)>
    where
        T: datafusion::arrow::datatypes::ArrowNumericType,
        T::Native: Into<i128>,
    {
        let a = array.as_primitive_opt::<T>()?;
        let lo: i128 = compute::min(a)?.into();
        let hi: i128 = compute::max(a)?.into();
        let bytes = match hi.checked_sub(lo)? {
            r if r <= i128::from(u8::MAX) => 1,
            r if r <= i128::from(u16::MAX) => 2,
            r if r <= i128::from(u32::MAX) => 4,
            r if r <= i128::from(u64::MAX) => 8,
            _ => return None,
        };
        if bytes >= width {
            return None;
        }
        let base = i64::try_from(lo).ok()?;
        let values = a.values();
        // A null's slot holds whatever its array had there: 0 is stored instead.
        let offset = |i: usize| -> u64 {
            match a.nulls() {
                Some(n) if n.is_null(i) => 0,
                _ => (values[i].into() - lo) as u64,
            }
        };
        let rows = 0..a.len();
        let buffer = match bytes {
            1 => Buffer::from_vec(rows.map(|i| offset(i) as u8).collect::<Vec<u8>>()),
            2 => Buffer::from_vec(rows.map(|i| offset(i) as u16).collect::<Vec<u16>>()),
            4 => Buffer::from_vec(rows.map(|i| offset(i) as u32).collect::<Vec<u32>>()),
            _ => Buffer::from_vec(rows.map(offset).collect::<Vec<u64>>()),
        };
        let width = u8::try_from(bytes).ok()?;
        Some((Packing { base, width }, buffer))
    }
    let width = dtype.width()?;
    match dtype {
        ColumnType::Int16 => packed::<Int16Type>(array, width),
        ColumnType::Int32 => packed::<Int32Type>(array, width),
        ColumnType::Date => packed::<Date32Type>(array, width),
        ColumnType::Int64 => packed::<Int64Type>(array, width),
        ColumnType::UInt16 => packed::<UInt16Type>(array, width),
        ColumnType::UInt32 => packed::<UInt32Type>(array, width),
        ColumnType::UInt64 => packed::<UInt64Type>(array, width),
        ColumnType::Decimal { .. } => packed::<Decimal128Type>(array, width),
        _ => None,
    }
}

/// The strings of `a` as a [`Dictionary`] (its description, each row's index, and the
/// distinct strings in the order first seen), when that stores them in at most three
/// quarters of the bytes of their views and data; `None` otherwise.
fn dictionary(a: &StringViewArray) -> Option<(Dictionary, Buffer, StringViewArray)> {
    let rows = a.len();
    let plain = rows * 16 + a.total_buffer_bytes_used();
    let most = plain * 3 / 4;
    let mut seen: std::collections::HashMap<&str, u16> = std::collections::HashMap::new();
    let mut first_rows: Vec<u32> = Vec::new();
    let mut indices: Vec<u16> = Vec::with_capacity(rows);
    for row in 0..rows {
        if a.is_null(row) {
            indices.push(0);
            continue;
        }
        let next = first_rows.len();
        let index = match seen.get(a.value(row)) {
            Some(&i) => i,
            None => {
                // Past 65,536 strings, or past the bytes the views take: no gain.
                let i = u16::try_from(next).ok()?;
                if (next + 1) * 16 > most {
                    return None;
                }
                seen.insert(a.value(row), i);
                first_rows.push(u32::try_from(row).ok()?);
                i
            }
        };
        indices.push(index);
    }
    let entries = first_rows.len();
    if entries == 0 {
        return None;
    }
    let strings = crate::views::gather_views(a, &first_rows)?;
    let width = if entries <= 1 << 8 { 1 } else { 2 };
    if rows * width + entries * 16 + strings.total_buffer_bytes_used() > most {
        return None;
    }
    let indices = if width == 1 {
        // Fewer than 257 strings: every index fits a byte.
        Buffer::from_vec(indices.iter().map(|&i| i as u8).collect::<Vec<u8>>())
    } else {
        Buffer::from_vec(indices)
    };
    let description = Dictionary {
        entries: u32::try_from(entries).ok()?,
        width: width as u8,
    };
    Some((description, indices, strings))
}

/// Packed values (`packed`, one offset per row, in a destination of their width)
/// unpacked into a destination of `dtype`'s values.
fn unpack(name: &str, dtype: ColumnType, packing: Packing, packed: Dest) -> Result<Dest> {
    let wrong = || {
        Error::Meta(format!(
            "column {name:?} ({dtype}): packed values of the wrong kind"
        ))
    };
    // `base` is checked against the type when the metadata is validated; offsets
    // beyond the type (corrupted memory) wrap rather than fail.
    macro_rules! widen {
        ($t:ty) => {{
            let base = packing.base as $t;
            match &packed {
                Dest::Bytes(v) => v.iter().map(|&o| base.wrapping_add(o as $t)).collect(),
                Dest::U16(v) => v.iter().map(|&o| base.wrapping_add(o as $t)).collect(),
                Dest::U32(v) => v.iter().map(|&o| base.wrapping_add(o as $t)).collect(),
                Dest::U64(v) => v.iter().map(|&o| base.wrapping_add(o as $t)).collect(),
                _ => return Err(wrong()),
            }
        }};
    }
    Ok(match dtype {
        ColumnType::Int16 => Dest::I16(widen!(i16)),
        ColumnType::Int32 | ColumnType::Date => Dest::I32(widen!(i32)),
        ColumnType::Int64 => Dest::I64(widen!(i64)),
        ColumnType::UInt16 => Dest::U16(widen!(u16)),
        ColumnType::UInt32 => Dest::U32(widen!(u32)),
        ColumnType::UInt64 => Dest::U64(widen!(u64)),
        ColumnType::Decimal { .. } => Dest::I128(widen!(i128)),
        _ => return Err(wrong()),
    })
}

/// One column of one chunk, ready to be written: its buffers in stored order (shared
/// with the array they came from, re-packed bitmaps, or packed values).
pub struct EncodedColumn {
    /// Nulls.
    pub null_count: u64,
    /// Smallest and largest value, when known (see [`ColumnStats`]).
    pub stats: Option<ColumnStats>,
    /// How the values are packed (`None`: as they are).
    pub packing: Option<Packing>,
    /// The strings' dictionary (`None`: one view per row).
    pub dictionary: Option<Dictionary>,
    buffers: Vec<Buffer>,
}

impl EncodedColumn {
    /// Encodes one column of a chunk.
    ///
    /// # Errors
    /// [`Error::UnsupportedType`]; [`Error::Arrow`] when a string column cannot be
    /// cast to views.
    pub fn new(name: &str, array: &ArrayRef) -> Result<Self> {
        let (dtype, mut array) = storable(name, array)?;
        if let Some(a) = array.as_string_view_opt() {
            // Slices and gathers share their parent's data buffers; when most of
            // those bytes belong to other rows, write only what these rows use.
            let used = a.total_buffer_bytes_used();
            let held: usize = a.data_buffers().iter().map(Buffer::len).sum();
            if held > used + used / 4 + 256 {
                array = Arc::new(a.gc());
            }
        }
        let null_count = if dtype == ColumnType::Null {
            array.len() as u64
        } else {
            array.null_count() as u64
        };
        let mut buffers = Vec::with_capacity(3);
        if let (false, Some(nulls)) = (dtype == ColumnType::Null, array.nulls()) {
            if null_count > 0 {
                buffers.push(bitmap_bytes(nulls.inner()));
            }
        }
        fn values<T: ArrowPrimitiveType>(a: &ArrayRef) -> Buffer {
            a.as_primitive_opt::<T>()
                .map(|p| p.values().inner().clone())
                .unwrap_or_default()
        }
        let packed = pack(&array, dtype);
        let packing = packed.as_ref().map(|(p, _)| *p);
        let mut dictionary_description = None;
        match dtype {
            _ if packed.is_some() => buffers.extend(packed.map(|(_, b)| b)),
            ColumnType::Null => {}
            ColumnType::Boolean => buffers.push(
                array
                    .as_boolean_opt()
                    .map(|b| bitmap_bytes(b.values()))
                    .unwrap_or_default(),
            ),
            ColumnType::Int8 => buffers.push(values::<Int8Type>(&array)),
            ColumnType::Int16 => buffers.push(values::<Int16Type>(&array)),
            ColumnType::Int32 => buffers.push(values::<Int32Type>(&array)),
            ColumnType::Date => buffers.push(values::<Date32Type>(&array)),
            ColumnType::Int64 => buffers.push(values::<Int64Type>(&array)),
            ColumnType::UInt8 => buffers.push(values::<UInt8Type>(&array)),
            ColumnType::UInt16 => buffers.push(values::<UInt16Type>(&array)),
            ColumnType::UInt32 => buffers.push(values::<UInt32Type>(&array)),
            ColumnType::UInt64 => buffers.push(values::<UInt64Type>(&array)),
            ColumnType::Float32 => buffers.push(values::<Float32Type>(&array)),
            ColumnType::Float64 => buffers.push(values::<Float64Type>(&array)),
            ColumnType::Decimal { .. } => buffers.push(values::<Decimal128Type>(&array)),
            ColumnType::String => {
                if let Some(s) = array.as_string_view_opt() {
                    match dictionary(s) {
                        Some((description, indices, strings)) => {
                            dictionary_description = Some(description);
                            buffers.push(indices);
                            buffers.push(strings.views().inner().clone());
                            buffers.extend(strings.data_buffers().iter().cloned());
                        }
                        None => {
                            buffers.push(s.views().inner().clone());
                            buffers.extend(s.data_buffers().iter().cloned());
                        }
                    }
                }
            }
        }
        Ok(EncodedColumn {
            null_count,
            stats: column_stats(&array, dtype),
            packing,
            dictionary: dictionary_description,
            buffers,
        })
    }

    /// The buffers in stored order (see [`ColumnChunk`]).
    pub fn buffers(&self) -> impl Iterator<Item = &[u8]> {
        self.buffers.iter().map(Buffer::as_slice)
    }
}

/// A local destination for one stored buffer, typed so the array can own it without
/// another copy.
pub enum Dest {
    /// Bytes (bitmaps, string data, u8 values).
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
    Views(Vec<u128>),
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

    /// The destination as an Arrow buffer (no copy).
    fn into_buffer(self) -> Buffer {
        match self {
            Dest::Bytes(v) => Buffer::from_vec(v),
            Dest::I8(v) => Buffer::from_vec(v),
            Dest::I16(v) => Buffer::from_vec(v),
            Dest::I32(v) => Buffer::from_vec(v),
            Dest::I64(v) => Buffer::from_vec(v),
            Dest::U16(v) => Buffer::from_vec(v),
            Dest::U32(v) => Buffer::from_vec(v),
            Dest::U64(v) => Buffer::from_vec(v),
            Dest::F32(v) => Buffer::from_vec(v),
            Dest::F64(v) => Buffer::from_vec(v),
            Dest::I128(v) => Buffer::from_vec(v),
            Dest::Views(v) => Buffer::from_vec(v),
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
    if let (ColumnType::String, Some(d)) = (dtype, cc.dictionary) {
        let mut bufs = bufs.map(|b| b.len as usize);
        if let Some(len) = bufs.next() {
            out.push(match d.width {
                2 => Dest::U16(vec![0; rows]),
                _ => Dest::Bytes(vec![0; len]),
            });
        }
        if bufs.next().is_some() {
            out.push(Dest::Views(vec![0; d.entries as usize]));
        }
        out.extend(bufs.map(|len| Dest::Bytes(vec![0; len])));
        return out;
    }
    let mut first = true;
    for b in bufs {
        let len = b.len as usize;
        if let Some(p) = cc.packing {
            out.push(match p.width {
                2 => Dest::U16(vec![0; rows]),
                4 => Dest::U32(vec![0; rows]),
                8 => Dest::U64(vec![0; rows]),
                _ => Dest::Bytes(vec![0; len]),
            });
            continue;
        }
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
            (ColumnType::String, true) => Dest::Views(vec![0; rows]),
            _ => Dest::Bytes(vec![0; len]),
        };
        first = false;
        out.push(d);
    }
    out
}

/// The checked bitmap of `rows` bits in `bytes`.
fn bitmap(name: &str, bytes: Buffer, rows: usize) -> Result<BooleanBuffer> {
    if bytes.len() < rows.div_ceil(8) {
        return Err(Error::Meta(format!(
            "column {name:?}: a bitmap of {} bytes cannot hold {rows} rows",
            bytes.len()
        )));
    }
    Ok(BooleanBuffer::new(bytes, 0, rows))
}

fn prim<T: ArrowPrimitiveType>(
    values: Buffer,
    rows: usize,
    nulls: Option<NullBuffer>,
    data_type: DataType,
) -> Result<ArrayRef> {
    let values = ScalarBuffer::<T::Native>::new(values, 0, rows);
    Ok(Arc::new(
        PrimitiveArray::<T>::try_new(values, nulls)?.with_data_type(data_type),
    ))
}

/// Builds the array of one column chunk from its filled destinations.
///
/// # Errors
/// [`Error::Meta`] / [`Error::Arrow`] when the bytes do not form a valid array (for
/// example string views pointing outside their data buffers, or invalid UTF-8).
pub fn decode(
    name: &str,
    dtype: ColumnType,
    rows: usize,
    cc: &ColumnChunk,
    dests: Vec<Dest>,
) -> Result<ArrayRef> {
    let mut it = dests.into_iter();
    if dtype == ColumnType::Null {
        return Ok(Arc::new(NullArray::new(rows)));
    }
    let nulls = if cc.null_count > 0 {
        let bytes = it
            .next()
            .ok_or_else(|| Error::Meta(format!("column {name:?}: validity missing")))?
            .into_buffer();
        Some(NullBuffer::new(bitmap(name, bytes, rows)?))
    } else {
        None
    };
    let mut values = it
        .next()
        .ok_or_else(|| Error::Meta(format!("column {name:?} ({dtype}): values buffer missing")))?;
    if let Some(d) = cc.dictionary {
        let strings = match (dtype, it.next()) {
            (ColumnType::String, Some(d @ Dest::Views(_))) => d.into_buffer(),
            _ => {
                return Err(Error::Meta(format!(
                    "column {name:?} ({dtype}): dictionary views missing"
                )))
            }
        };
        let strings = ScalarBuffer::<u128>::new(strings, 0, d.entries as usize);
        let data: Vec<Buffer> = it.map(Dest::into_buffer).collect();
        let strings = crate::views::string_views(strings, data, None)?;
        let array = match values {
            Dest::Bytes(v) => crate::views::dictionary_views(&strings, &v, nulls)?,
            Dest::U16(v) => crate::views::dictionary_views(&strings, &v, nulls)?,
            _ => {
                return Err(Error::Meta(format!(
                    "column {name:?} ({dtype}): dictionary indices of the wrong kind"
                )))
            }
        };
        if array.len() != rows {
            return Err(Error::Meta(format!(
                "column {name:?} ({dtype}): {} dictionary indices for {rows} rows",
                array.len()
            )));
        }
        return Ok(Arc::new(array));
    }
    if let Some(p) = cc.packing {
        values = unpack(name, dtype, p, values)?;
    }
    let wrong = || {
        Error::Meta(format!(
            "column {name:?} ({dtype}): buffer of the wrong kind"
        ))
    };
    let data_type = dtype.arrow_type()?;
    let array: ArrayRef = match (dtype, values) {
        (ColumnType::Boolean, Dest::Bytes(v)) => Arc::new(BooleanArray::new(
            bitmap(name, Buffer::from_vec(v), rows)?,
            nulls,
        )),
        (ColumnType::Int8, d @ Dest::I8(_)) => {
            prim::<Int8Type>(d.into_buffer(), rows, nulls, data_type)?
        }
        (ColumnType::Int16, d @ Dest::I16(_)) => {
            prim::<Int16Type>(d.into_buffer(), rows, nulls, data_type)?
        }
        (ColumnType::Int32, d @ Dest::I32(_)) => {
            prim::<Int32Type>(d.into_buffer(), rows, nulls, data_type)?
        }
        (ColumnType::Date, d @ Dest::I32(_)) => {
            prim::<Date32Type>(d.into_buffer(), rows, nulls, data_type)?
        }
        (ColumnType::Int64, d @ Dest::I64(_)) => {
            prim::<Int64Type>(d.into_buffer(), rows, nulls, data_type)?
        }
        (ColumnType::UInt8, d @ Dest::Bytes(_)) => {
            prim::<UInt8Type>(d.into_buffer(), rows, nulls, data_type)?
        }
        (ColumnType::UInt16, d @ Dest::U16(_)) => {
            prim::<UInt16Type>(d.into_buffer(), rows, nulls, data_type)?
        }
        (ColumnType::UInt32, d @ Dest::U32(_)) => {
            prim::<UInt32Type>(d.into_buffer(), rows, nulls, data_type)?
        }
        (ColumnType::UInt64, d @ Dest::U64(_)) => {
            prim::<UInt64Type>(d.into_buffer(), rows, nulls, data_type)?
        }
        (ColumnType::Float32, d @ Dest::F32(_)) => {
            prim::<Float32Type>(d.into_buffer(), rows, nulls, data_type)?
        }
        (ColumnType::Float64, d @ Dest::F64(_)) => {
            prim::<Float64Type>(d.into_buffer(), rows, nulls, data_type)?
        }
        (ColumnType::Decimal { .. }, d @ Dest::I128(_)) => {
            prim::<Decimal128Type>(d.into_buffer(), rows, nulls, data_type)?
        }
        (ColumnType::String, d @ Dest::Views(_)) => {
            let views = ScalarBuffer::<u128>::new(d.into_buffer(), 0, rows);
            let data: Vec<Buffer> = it.map(Dest::into_buffer).collect();
            Arc::new(crate::views::string_views(views, data, nulls)?)
        }
        _ => return Err(wrong()),
    };
    Ok(array)
}
