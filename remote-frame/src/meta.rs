//! Frame metadata: the schema and, per row chunk, where each column's Arrow buffers
//! live. Plain data that serializes with serde, so the next compute element can open
//! a frame from its JSON alone (given transports to the same memory elements).

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::seal::Seal;
use crate::sketch::DistinctSketch;

/// Version of the metadata and layout described here; a frame written by another
/// version is refused rather than misread. Version 2 frames carry a [`Seal`] (the chunk
/// layout is version 1's); version 3 frames may store values packed ([`Packing`]),
/// version 4 frames strings as dictionaries ([`Dictionary`]), and this build reads
/// versions 2 and 3 too (nothing in them is packed, or a dictionary, that they did not
/// know). Version 1 metadata,
/// written before frames were sealed, is refused, as its memory cannot be checked.
pub const LAYOUT_VERSION: u32 = 4;

/// The oldest layout version this build reads.
pub const OLDEST_READABLE_VERSION: u32 = 2;

/// The layout version that brought packed values.
const PACKING_VERSION: u32 = 3;

/// The layout version that brought string dictionaries.
const DICTIONARY_VERSION: u32 = 4;

/// Alignment of every buffer inside a chunk's remote allocation (and of the local
/// buffers it is read into), so copies run at full speed.
pub const BUFFER_ALIGN: u64 = 64;

/// The column types a frame can hold (what the TPC-DS tables need).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ColumnType {
    /// Booleans (bit-packed values).
    Boolean,
    /// Signed 8-bit integers.
    Int8,
    /// Signed 16-bit integers.
    Int16,
    /// Signed 32-bit integers.
    Int32,
    /// Signed 64-bit integers.
    Int64,
    /// Unsigned 8-bit integers.
    UInt8,
    /// Unsigned 16-bit integers.
    UInt16,
    /// Unsigned 32-bit integers.
    UInt32,
    /// Unsigned 64-bit integers.
    UInt64,
    /// 32-bit floats.
    Float32,
    /// 64-bit floats.
    Float64,
    /// Days since 1970-01-01 (Arrow Date32).
    Date,
    /// 128-bit decimals.
    Decimal {
        /// Total digits.
        precision: usize,
        /// Digits after the point.
        scale: usize,
    },
    /// UTF-8 strings (stored as Arrow string views plus their data buffers).
    String,
    /// A column of nulls only (no buffers).
    Null,
}

impl ColumnType {
    /// The arrow-rs type a stored column is read as (Polars' own export of it:
    /// strings as views, dates as `Date32`, decimals as `Decimal128`).
    ///
    /// # Errors
    /// [`Error::Meta`] for a decimal beyond `Decimal128` (precision above 38, or a
    /// scale above the precision).
    pub fn arrow_type(self) -> Result<arrow_schema::DataType> {
        use arrow_schema::DataType as A;
        Ok(match self {
            ColumnType::Boolean => A::Boolean,
            ColumnType::Int8 => A::Int8,
            ColumnType::Int16 => A::Int16,
            ColumnType::Int32 => A::Int32,
            ColumnType::Int64 => A::Int64,
            ColumnType::UInt8 => A::UInt8,
            ColumnType::UInt16 => A::UInt16,
            ColumnType::UInt32 => A::UInt32,
            ColumnType::UInt64 => A::UInt64,
            ColumnType::Float32 => A::Float32,
            ColumnType::Float64 => A::Float64,
            ColumnType::Date => A::Date32,
            ColumnType::Decimal { precision, scale } => {
                if precision > 38 || scale > precision {
                    return Err(Error::Meta(format!(
                        "decimal({precision},{scale}) does not fit Decimal128 (precision at most 38, scale at most the precision)"
                    )));
                }
                A::Decimal128(precision as u8, scale as i8)
            }
            ColumnType::String => A::Utf8View,
            ColumnType::Null => A::Null,
        })
    }

    /// Whether chunks of this type may store their values packed ([`Packing`]):
    /// integers of 16 bits and more, dates and decimals (the types with a
    /// [`ColumnType::value_range`]).
    pub fn packable(self) -> bool {
        self.value_range().is_some()
    }

    /// The smallest and largest value of this type, for packable types.
    pub fn value_range(self) -> Option<(i128, i128)> {
        use ColumnType::*;
        Some(match self {
            Int16 => (i16::MIN.into(), i16::MAX.into()),
            Int32 | Date => (i32::MIN.into(), i32::MAX.into()),
            Int64 => (i64::MIN.into(), i64::MAX.into()),
            UInt16 => (0, u16::MAX.into()),
            UInt32 => (0, u32::MAX.into()),
            UInt64 => (0, u64::MAX.into()),
            Decimal { .. } => (i128::MIN, i128::MAX),
            _ => return None,
        })
    }

    /// Bytes per value of the values buffer, for fixed-width types.
    pub fn width(self) -> Option<u64> {
        use ColumnType::*;
        Some(match self {
            Int8 | UInt8 => 1,
            Int16 | UInt16 => 2,
            Int32 | UInt32 | Float32 | Date => 4,
            Int64 | UInt64 | Float64 => 8,
            Decimal { .. } => 16,
            String => 16, // one view per row
            Boolean | Null => return None,
        })
    }
}

impl std::fmt::Display for ColumnType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ColumnType::Decimal { precision, scale } => write!(f, "decimal({precision},{scale})"),
            other => write!(f, "{}", format!("{other:?}").to_lowercase()),
        }
    }
}

/// One column of the schema.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColumnMeta {
    /// Column name.
    pub name: String,
    /// Column type.
    pub dtype: ColumnType,
}

/// One buffer of a column chunk: `len` bytes at `offset` from the chunk's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BufferRef {
    /// Offset from the chunk's remote address (a multiple of [`BUFFER_ALIGN`]).
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

/// One column of one row chunk.
///
/// Buffers, in order: the validity bitmap (only if `null_count > 0`), then per type
/// - fixed width: the values;
/// - boolean: the value bitmap;
/// - string: the views (16 bytes per row), then the data buffers the views point into;
///   as a [`Dictionary`]: the indices (`width` bytes per row), the dictionary's views
///   (16 bytes per entry), then the data buffers those point into;
/// - null: nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColumnChunk {
    /// Nulls in this chunk of the column.
    pub null_count: u64,
    /// The column's buffers.
    pub buffers: Vec<BufferRef>,
    /// The smallest and largest value in this chunk of the column, when known
    /// (frames written before statistics were kept have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<ColumnStats>,
    /// How the values are packed (`None`: stored as themselves).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packing: Option<Packing>,
    /// The strings' dictionary (`None`: one view per row).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dictionary: Option<Dictionary>,
}

impl ColumnChunk {
    /// Bytes stored (and moved when read).
    pub fn stored_bytes(&self) -> u64 {
        self.buffers.iter().map(|b| b.len).sum()
    }

    /// Bytes the column chunk takes in local memory once read (`dtype` is its
    /// column's type, `rows` its chunk's rows): packed values are unpacked.
    pub fn local_bytes(&self, dtype: ColumnType, rows: u64) -> u64 {
        let stored = self.stored_bytes();
        // The indices become one view per row (the dictionary stays as it is).
        let indices = || self.buffers.get(usize::from(self.null_count > 0));
        match (&self.packing, self.buffers.last(), dtype.width()) {
            (Some(_), Some(values), Some(width)) => stored - values.len + rows * width,
            _ => match (&self.dictionary, indices()) {
                (Some(_), Some(indices)) => stored - indices.len + rows * 16,
                _ => stored,
            },
        }
    }
}

/// Packed values: each value's difference from `base`, as an unsigned integer of
/// `width` bytes (1, 2, 4 or 8; narrower than the type). A chunk whose values span a
/// small range (keys, dates, quantities, prices) is stored and moved in a half to an
/// eighth of its bytes; reading it unpacks the values into the column's own type.
/// Slots of nulls hold 0 (they read as `base`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Packing {
    /// The value a stored 0 stands for (the chunk's smallest).
    pub base: i64,
    /// Bytes per stored value.
    pub width: u8,
}

/// Strings stored as a dictionary: the chunk's distinct strings once (as views and
/// their data) and each row's index into them in `width` bytes. A chunk of a few
/// distinct strings (genders, states, categories, day names) is stored and moved in a
/// sixteenth to an eighth of its views' bytes; reading it gathers the dictionary's
/// views by index into one view per row, sharing the dictionary's data. Slots of nulls
/// hold 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dictionary {
    /// Distinct strings (at least one, at most 256 for 1-byte indices and 65,536 for
    /// 2-byte ones).
    pub entries: u32,
    /// Bytes per stored index (1 or 2).
    pub width: u8,
}

/// The smallest and largest non-null value of one column chunk: what lets a scan
/// skip chunks a filter excludes, and the planner estimate selectivities.
///
/// Values are JSON, by the column's type: integers, floats (finite; a chunk holding
/// NaN has no statistics) and dates (days since 1970-01-01) as numbers, booleans
/// as booleans, decimals as the string of their unscaled integer, strings as
/// themselves (only when both are at most [`MAX_STAT_STRING`] bytes). A chunk whose
/// values are all null has no statistics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColumnStats {
    /// Smallest value.
    pub min: serde_json::Value,
    /// Largest value.
    pub max: serde_json::Value,
}

/// Longest string kept as a chunk's minimum or maximum.
pub const MAX_STAT_STRING: usize = 64;

/// One row chunk: all its columns live in one allocation on one memory element.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkMeta {
    /// Rows in the chunk.
    pub rows: u64,
    /// Memory element holding the chunk.
    pub element: String,
    /// Remote address of the chunk's allocation.
    pub addr: u64,
    /// Bytes allocated (the sum of its aligned buffers).
    pub bytes: u64,
    /// One entry per schema column, in schema order.
    pub columns: Vec<ColumnChunk>,
}

/// Everything needed to open a frame: schema plus per-chunk buffer extents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrameMeta {
    /// Layout version ([`LAYOUT_VERSION`]).
    pub version: u32,
    /// Columns in order.
    pub schema: Vec<ColumnMeta>,
    /// Total rows (the sum over chunks).
    pub rows: u64,
    /// Row chunks in row order.
    pub chunks: Vec<ChunkMeta>,
    /// Where the frame's seal lives and what memory must hold (see [`crate::seal`]);
    /// required since version 2, optional here so that older metadata parses and is
    /// refused by its version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seal: Option<Seal>,
    /// One distinct-count sketch per schema column, filled as the frame was written
    /// (frames written before sketches were kept have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distinct: Option<Vec<DistinctSketch>>,
}

impl FrameMeta {
    /// The metadata as JSON.
    ///
    /// # Errors
    /// [`Error::MetaJson`] (only if serde fails, which plain data does not).
    pub fn to_json(&self) -> Result<String> {
        serde_json::to_string(self).map_err(Error::MetaJson)
    }

    /// Parses and validates metadata printed by [`FrameMeta::to_json`].
    ///
    /// # Errors
    /// [`Error::MetaJson`] for malformed JSON, [`Error::Meta`] for inconsistent contents.
    pub fn from_json(json: &str) -> Result<Self> {
        let meta: FrameMeta = serde_json::from_str(json).map_err(Error::MetaJson)?;
        meta.validate()?;
        Ok(meta)
    }

    /// Index of column `name`.
    ///
    /// # Errors
    /// [`Error::UnknownColumn`] listing the frame's columns.
    pub fn column_index(&self, name: &str) -> Result<usize> {
        self.schema
            .iter()
            .position(|c| c.name == name)
            .ok_or_else(|| Error::UnknownColumn {
                name: name.to_owned(),
                known: self.column_names().join(", "),
            })
    }

    /// Column names in order.
    pub fn column_names(&self) -> Vec<String> {
        self.schema.iter().map(|c| c.name.clone()).collect()
    }

    /// Bytes the given columns take in local memory once read (all chunks): what
    /// reading them costs locally.
    pub fn column_bytes(&self, columns: &[usize]) -> u64 {
        self.chunks
            .iter()
            .map(|c| chunk_column_bytes(&self.schema, c, columns))
            .sum()
    }

    /// The estimated number of distinct non-null values of column `index`, at most
    /// the frame's rows (`None` for a frame without sketches).
    pub fn distinct_estimate(&self, index: usize) -> Option<u64> {
        let sketch = self.distinct.as_ref()?.get(index)?;
        Some(sketch.estimate().min(self.rows))
    }

    /// Bytes of all columns in local memory once read.
    pub fn data_bytes(&self) -> u64 {
        let all: Vec<usize> = (0..self.schema.len()).collect();
        self.column_bytes(&all)
    }

    /// Bytes the given columns take as stored in the memory elements (all chunks):
    /// what reading them moves. Packed values take fewer than they do once read.
    pub fn column_stored_bytes(&self, columns: &[usize]) -> u64 {
        self.chunks
            .iter()
            .map(|c| chunk_column_stored_bytes(c, columns))
            .sum()
    }

    /// Bytes of all columns as stored in the memory elements.
    pub fn stored_bytes(&self) -> u64 {
        let all: Vec<usize> = (0..self.schema.len()).collect();
        self.column_stored_bytes(&all)
    }

    /// Checks the metadata for consistency: version, a seal, unique column names, row counts,
    /// buffer counts and sizes per type, buffers inside their chunk's allocation.
    ///
    /// # Errors
    /// [`Error::Meta`] naming the first inconsistency found.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Meta(m));
        if self.version == 1 {
            return bad(format!(
                "metadata version 1 (written before frames were sealed, so its memory cannot be checked); this build opens version {LAYOUT_VERSION}: write the frame again"
            ));
        }
        if !(OLDEST_READABLE_VERSION..=LAYOUT_VERSION).contains(&self.version) {
            return bad(format!(
                "layout version {} (this build reads versions {OLDEST_READABLE_VERSION} to {LAYOUT_VERSION})",
                self.version
            ));
        }
        match &self.seal {
            None => {
                return bad(format!(
                    "version {} metadata without its seal",
                    self.version
                ))
            }
            Some(s) if s.chunk_heads.len() != self.chunks.len() => {
                return bad(format!(
                    "the seal lists {} chunk heads, the frame has {} chunks",
                    s.chunk_heads.len(),
                    self.chunks.len()
                ))
            }
            Some(s) if s.addr.checked_add(crate::seal::SEAL_BYTES).is_none() => {
                return bad("seal: address range overflows".into())
            }
            Some(_) => {}
        }
        for (i, c) in self.schema.iter().enumerate() {
            if self.schema[..i].iter().any(|d| d.name == c.name) {
                return bad(format!("column name {:?} appears twice", c.name));
            }
        }
        if let Some(sketches) = &self.distinct {
            if sketches.len() != self.schema.len() {
                return bad(format!(
                    "{} distinct-count sketches for {} columns",
                    sketches.len(),
                    self.schema.len()
                ));
            }
        }
        let mut rows = 0u64;
        for (k, ch) in self.chunks.iter().enumerate() {
            rows = rows
                .checked_add(ch.rows)
                .ok_or_else(|| Error::Meta(format!("row count overflows at chunk {k}")))?;
            if ch.columns.len() != self.schema.len() {
                return bad(format!(
                    "chunk {k} has {} columns, the schema {}",
                    ch.columns.len(),
                    self.schema.len()
                ));
            }
            if ch.addr.checked_add(ch.bytes).is_none() {
                return bad(format!("chunk {k}: address range overflows"));
            }
            for (col, cc) in self.schema.iter().zip(&ch.columns) {
                if cc.packing.is_some() && self.version < PACKING_VERSION {
                    return bad(format!(
                        "chunk {k}, column {:?}: packed values in a version {} frame (packing came with version {PACKING_VERSION})",
                        col.name, self.version
                    ));
                }
                if cc.dictionary.is_some() && self.version < DICTIONARY_VERSION {
                    return bad(format!(
                        "chunk {k}, column {:?}: a string dictionary in a version {} frame (dictionaries came with version {DICTIONARY_VERSION})",
                        col.name, self.version
                    ));
                }
                validate_column(k, ch, col, cc)?;
            }
        }
        if rows != self.rows {
            return bad(format!(
                "chunks hold {rows} rows but the frame says {}",
                self.rows
            ));
        }
        Ok(())
    }
}

/// Bytes columns `columns` of chunk `c` take in local memory once read (`schema`: the
/// frame's; indices past it, such as a computed row index, count nothing).
pub(crate) fn chunk_column_bytes(schema: &[ColumnMeta], c: &ChunkMeta, columns: &[usize]) -> u64 {
    columns
        .iter()
        .filter_map(|&i| Some(c.columns.get(i)?.local_bytes(schema.get(i)?.dtype, c.rows)))
        .sum()
}

/// Bytes columns `columns` of chunk `c` take as stored: what reading them moves.
pub(crate) fn chunk_column_stored_bytes(c: &ChunkMeta, columns: &[usize]) -> u64 {
    columns
        .iter()
        .filter_map(|&i| c.columns.get(i))
        .map(ColumnChunk::stored_bytes)
        .sum()
}

fn validate_column(k: usize, ch: &ChunkMeta, col: &ColumnMeta, cc: &ColumnChunk) -> Result<()> {
    let bad = |m: String| {
        Err(Error::Meta(format!(
            "chunk {k}, column {:?} ({}): {m}",
            col.name, col.dtype
        )))
    };
    if cc.null_count > ch.rows {
        return bad(format!("{} nulls in {} rows", cc.null_count, ch.rows));
    }
    for b in &cc.buffers {
        if b.offset % BUFFER_ALIGN != 0 {
            return bad(format!(
                "buffer offset {} is not {BUFFER_ALIGN}-byte aligned",
                b.offset
            ));
        }
        match b.offset.checked_add(b.len) {
            Some(end) if end <= ch.bytes => {}
            _ => {
                return bad(format!(
                    "buffer {}+{} lies outside the chunk's {} bytes",
                    b.offset, b.len, ch.bytes
                ))
            }
        }
    }
    let bitmap_len = ch.rows.div_ceil(8);
    let has_validity = cc.null_count > 0 && col.dtype != ColumnType::Null;
    let mut bufs = cc.buffers.iter();
    if has_validity {
        match bufs.next() {
            Some(b) if b.len == bitmap_len => {}
            Some(b) => {
                return bad(format!(
                    "validity bitmap of {} bytes, expected {bitmap_len}",
                    b.len
                ))
            }
            None => return bad("validity bitmap missing".into()),
        }
    }
    let rest: Vec<&BufferRef> = bufs.collect();
    if cc.packing.is_some() && !col.dtype.packable() {
        return bad(format!(
            "values packed, but a {} column is never packed",
            col.dtype
        ));
    }
    if let Some(d) = cc.dictionary {
        if col.dtype != ColumnType::String {
            return bad(format!(
                "a dictionary, but a {} column is never stored as one",
                col.dtype
            ));
        }
        let width = u64::from(d.width);
        if !matches!(width, 1 | 2) {
            return bad(format!(
                "dictionary indices of {width} bytes (they take 1 or 2)"
            ));
        }
        if d.entries == 0 || u64::from(d.entries) > 1 << (8 * width) {
            return bad(format!(
                "a dictionary of {} strings with {width}-byte indices",
                d.entries
            ));
        }
        if rest.len() < 2
            || rest[0].len != ch.rows * width
            || rest[1].len != u64::from(d.entries) * 16
        {
            return bad(format!(
                "expected an indices buffer of {} bytes and dictionary views of {} bytes",
                ch.rows * width,
                u64::from(d.entries) * 16
            ));
        }
        if rest.len() - 2 > u32::MAX as usize {
            return bad("too many data buffers".into());
        }
        return Ok(());
    }
    match col.dtype {
        ColumnType::Null => {
            if !rest.is_empty() || cc.null_count != ch.rows {
                return bad("a null column has no buffers and only nulls".into());
            }
        }
        ColumnType::Boolean => {
            if rest.len() != 1 || rest[0].len != bitmap_len {
                return bad(format!("expected one value bitmap of {bitmap_len} bytes"));
            }
        }
        ColumnType::String => {
            if rest.is_empty() || rest[0].len != ch.rows * 16 {
                return bad(format!("expected a views buffer of {} bytes", ch.rows * 16));
            }
            if rest.len() - 1 > u32::MAX as usize {
                return bad("too many data buffers".into());
            }
        }
        t => {
            let mut w = t.width().unwrap_or(1);
            if let Some(p) = cc.packing {
                let packed = u64::from(p.width);
                if !matches!(packed, 1 | 2 | 4 | 8) || packed >= w {
                    return bad(format!(
                        "values packed in {packed} bytes (a {t} column packs into 1, 2, 4 or 8 bytes, fewer than its {w})"
                    ));
                }
                let (lo, hi) = t.value_range().unwrap_or((0, 0));
                if !(lo..=hi).contains(&i128::from(p.base)) {
                    return bad(format!("packing base {} is not a {t} value", p.base));
                }
                w = packed;
            }
            if rest.len() != 1 || rest[0].len != ch.rows * w {
                return bad(format!(
                    "expected one values buffer of {} bytes",
                    ch.rows * w
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_map_to_decimal128_or_are_refused() {
        let ok = ColumnType::Decimal {
            precision: 7,
            scale: 2,
        };
        assert_eq!(
            ok.arrow_type().ok(),
            Some(arrow_schema::DataType::Decimal128(7, 2))
        );
        for (precision, scale) in [(39, 2), (300, 2), (5, 6)] {
            let err = ColumnType::Decimal { precision, scale }.arrow_type();
            assert!(
                matches!(&err, Err(Error::Meta(m)) if m.contains(&format!("decimal({precision},{scale})"))),
                "{err:?}"
            );
        }
        assert_eq!(
            ColumnType::String.arrow_type().ok(),
            Some(arrow_schema::DataType::Utf8View)
        );
    }
}
