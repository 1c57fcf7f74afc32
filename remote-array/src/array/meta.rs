//! [`ArrayMeta`]: the serializable description of a remote array.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// One contiguous piece of an array's bytes in one memory element.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Extent {
    /// Name of the memory element (transport) holding the bytes.
    pub transport: String,
    /// Remote address of the first byte.
    pub addr: u64,
    /// Length in bytes.
    pub bytes: u64,
}

/// Where a remote array's data lives and what it is: element type, shape, and the
/// extents that hold its bytes in row-major (C) order, one after the other.
///
/// This is what one compute element hands to the next (usually as JSON) so it can
/// open the same array with [`crate::RemoteArray::from_meta`], which checks it against
/// the element type, the dimension type and the memory elements it knows.
///
/// # Example
/// ```
/// use scad_remote_array::{ArrayMeta, Extent};
///
/// let meta = ArrayMeta {
///     dtype: "f32".into(),
///     item_size: 4,
///     shape: vec![2, 3],
///     extents: vec![Extent { transport: "mem0".into(), addr: 4096, bytes: 24 }],
/// };
/// let json = meta.to_json()?;
/// assert_eq!(ArrayMeta::from_json(&json)?, meta);
/// assert_eq!(meta.slice_rows(1..2)?.extents[0].addr, 4096 + 12);
/// # Ok::<(), scad_remote_array::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ArrayMeta {
    /// Element type: a stable name (`"f32"`, one of [`crate::array::DTYPES`]) or
    /// `rust:<type name>` for other types (see [`crate::array::dtype`]).
    pub dtype: String,
    /// Size of one element in bytes.
    pub item_size: usize,
    /// Shape; axis 0 is the row axis that slicing and concatenation work along.
    pub shape: Vec<usize>,
    /// Extents holding the bytes in order.
    pub extents: Vec<Extent>,
}

impl ArrayMeta {
    /// Prints the metadata as JSON.
    ///
    /// # Errors
    /// [`Error::MetaJson`] (only if serde fails, which plain data does not).
    pub fn to_json(&self) -> Result<String> {
        serde_json::to_string(self).map_err(Error::MetaJson)
    }

    /// Parses metadata printed by [`ArrayMeta::to_json`] and checks that it is
    /// consistent in itself ([`ArrayMeta::validate`]).
    ///
    /// # Errors
    /// [`Error::MetaJson`] for malformed JSON; as [`ArrayMeta::validate`].
    pub fn from_json(json: &str) -> Result<Self> {
        let meta: ArrayMeta = serde_json::from_str(json).map_err(Error::MetaJson)?;
        meta.validate()?;
        Ok(meta)
    }

    /// Number of elements (the product of the shape).
    ///
    /// # Errors
    /// [`Error::Shape`] if the product overflows.
    pub fn len(&self) -> Result<usize> {
        self.shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| Error::Shape(format!("shape {:?} has too many elements", self.shape)))
    }

    /// True if the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.shape.contains(&0)
    }

    /// Bytes of data the shape and item size call for.
    ///
    /// # Errors
    /// [`Error::Shape`] if that overflows.
    pub fn data_bytes(&self) -> Result<u64> {
        (self.len()? as u64)
            .checked_mul(self.item_size as u64)
            .ok_or_else(|| Error::Shape(format!("shape {:?} has too many bytes", self.shape)))
    }

    /// Bytes of one row (one index of axis 0).
    pub fn row_bytes(&self) -> u64 {
        self.shape
            .iter()
            .skip(1)
            .fold(self.item_size as u64, |a, &d| a.saturating_mul(d as u64))
    }

    /// Checks the metadata for consistency in itself: a non-zero item size, at least
    /// one axis, extents that add up to the shape, none empty or overflowing.
    ///
    /// # Errors
    /// [`Error::Meta`] or [`Error::Shape`] naming the inconsistency.
    pub fn validate(&self) -> Result<()> {
        if self.item_size == 0 {
            return Err(Error::Meta(format!(
                "item size of {:?} is zero",
                self.dtype
            )));
        }
        if self.shape.is_empty() {
            return Err(Error::Shape(
                "a remote array needs at least one axis (axis 0 is the row axis)".into(),
            ));
        }
        let want = self.data_bytes()?;
        let mut have: u64 = 0;
        for (i, e) in self.extents.iter().enumerate() {
            if e.bytes == 0 {
                return Err(Error::Meta(format!(
                    "extent {i} on {:?} is empty",
                    e.transport
                )));
            }
            if e.addr.checked_add(e.bytes).is_none() {
                return Err(Error::Meta(format!(
                    "extent {i} on {:?} at {:#x} of {} bytes overflows the address space",
                    e.transport, e.addr, e.bytes
                )));
            }
            have = have
                .checked_add(e.bytes)
                .ok_or_else(|| Error::Meta("extent lengths overflow".into()))?;
        }
        if have != want {
            return Err(Error::Shape(format!(
                "shape {:?} of {} ({} bytes each) needs {want} bytes, the extents hold {have}",
                self.shape, self.dtype, self.item_size
            )));
        }
        Ok(())
    }

    /// The same bytes as rows of bytes: element type `u8`, shape `[rows, row bytes]`
    /// (a 1-D array becomes one column of item-size rows), as a caller that handles
    /// the element type itself opens any array (`RemoteArray<u8, Ix2>`).
    ///
    /// # Errors
    /// As [`ArrayMeta::validate`].
    pub fn as_byte_rows(&self) -> Result<ArrayMeta> {
        self.validate()?;
        let row_bytes = usize::try_from(self.row_bytes())
            .map_err(|_| Error::Shape(format!("rows of shape {:?} are too large", self.shape)))?;
        Ok(ArrayMeta {
            dtype: "u8".into(),
            item_size: 1,
            shape: vec![self.shape[0], row_bytes],
            extents: self.extents.clone(),
        })
    }

    /// The same bytes described as `shape` elements of type `dtype` (one of
    /// [`crate::array::DTYPES`]): how a caller that wrote rows of bytes (the Python
    /// binding) says what they hold, so Rust opens them with their real element type.
    ///
    /// # Errors
    /// [`Error::Meta`] for a name outside [`crate::array::DTYPES`]; [`Error::Shape`]
    /// when `shape` does not cover exactly the bytes, or keeps rows of another size.
    pub fn retyped(&self, dtype: &str, shape: &[usize]) -> Result<ArrayMeta> {
        let item_size = super::dtype_size(dtype).ok_or_else(|| {
            Error::Meta(format!(
                "element type {dtype:?} is not one of {}",
                super::DTYPES.join(", ")
            ))
        })?;
        let out = ArrayMeta {
            dtype: dtype.to_owned(),
            item_size,
            shape: shape.to_vec(),
            extents: self.extents.clone(),
        };
        out.validate()?;
        if out.shape[0] != self.shape.first().copied().unwrap_or(0) {
            return Err(Error::Shape(format!(
                "shape {shape:?} has {} rows, the array {}",
                out.shape[0],
                self.shape.first().copied().unwrap_or(0)
            )));
        }
        Ok(out)
    }

    /// The metadata of rows `rows` (a view: no data is moved).
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for rows outside the array; as [`ArrayMeta::validate`].
    pub fn slice_rows(&self, rows: Range<usize>) -> Result<ArrayMeta> {
        self.validate()?;
        let n = self.shape[0];
        if rows.start > rows.end || rows.end > n {
            return Err(Error::OutOfRange {
                what: "slice",
                start: rows.start,
                end: rows.end,
                rows: n,
            });
        }
        let rb = self.row_bytes();
        let (lo, hi) = (rows.start as u64 * rb, rows.end as u64 * rb);
        let mut extents = Vec::new();
        let mut pos = 0u64;
        for e in &self.extents {
            let (s, t) = (pos, pos + e.bytes);
            pos = t;
            let (a, b) = (s.max(lo), t.min(hi));
            if a < b {
                extents.push(Extent {
                    transport: e.transport.clone(),
                    addr: e.addr + (a - s),
                    bytes: b - a,
                });
            }
        }
        let mut shape = self.shape.clone();
        shape[0] = rows.len();
        Ok(ArrayMeta {
            dtype: self.dtype.clone(),
            item_size: self.item_size,
            shape,
            extents,
        })
    }

    /// Concatenates arrays along axis 0 (metadata only: no data is moved).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty list, [`Error::TypeMismatch`] or
    /// [`Error::Shape`] when element types or the shapes past axis 0 differ.
    pub fn concat(parts: &[ArrayMeta]) -> Result<ArrayMeta> {
        let first = parts
            .first()
            .ok_or_else(|| Error::InvalidArgument("nothing to concatenate".into()))?;
        let mut out = first.clone();
        out.validate()?;
        for p in &parts[1..] {
            p.validate()?;
            if p.dtype != first.dtype || p.item_size != first.item_size {
                return Err(Error::TypeMismatch {
                    expected: first.dtype.clone(),
                    expected_size: first.item_size,
                    found: p.dtype.clone(),
                    found_size: p.item_size,
                });
            }
            if p.shape.len() != first.shape.len() || p.shape[1..] != first.shape[1..] {
                return Err(Error::Shape(format!(
                    "cannot concatenate shape {:?} to shape {:?} along axis 0",
                    p.shape, first.shape
                )));
            }
            out.shape[0] = out.shape[0]
                .checked_add(p.shape[0])
                .ok_or_else(|| Error::Shape("concatenated row count overflows".into()))?;
            out.extents.extend(p.extents.iter().cloned());
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> ArrayMeta {
        ArrayMeta {
            dtype: "u16".into(),
            item_size: 2,
            shape: vec![4, 3],
            extents: vec![
                Extent {
                    transport: "a".into(),
                    addr: 0,
                    bytes: 10,
                },
                Extent {
                    transport: "b".into(),
                    addr: 100,
                    bytes: 14,
                },
            ],
        }
    }

    #[test]
    fn byte_rows_and_retyping_describe_the_same_bytes() {
        let m = meta();
        let rows = m.as_byte_rows().unwrap();
        assert_eq!((rows.dtype.as_str(), rows.item_size), ("u8", 1));
        assert_eq!(rows.shape, vec![4, 6]);
        assert_eq!(rows.extents, m.extents);
        assert_eq!(rows.retyped("u16", &[4, 3]).unwrap(), m);
        assert_eq!(rows.retyped("i16", &[4, 3]).unwrap().item_size, 2);
        // The same 24 bytes in another row count are refused.
        let e = rows.retyped("f64", &[3]).unwrap_err();
        assert!(matches!(e, Error::Shape(_)), "{e}");
        let e = rows.retyped("u16", &[2, 6]).unwrap_err();
        assert!(e.to_string().contains("2 rows"), "{e}");
        let e = rows.retyped("float64", &[4, 3]).unwrap_err();
        assert!(
            matches!(e, Error::Meta(_)) && e.to_string().contains("u8, i8"),
            "{e}"
        );
        let e = rows.retyped("u16", &[]).unwrap_err();
        assert!(matches!(e, Error::Shape(_)), "{e}");
    }

    #[test]
    fn slicing_trims_extents() {
        let m = meta();
        let s = m.slice_rows(1..3).unwrap();
        assert_eq!(s.shape, vec![2, 3]);
        assert_eq!(
            s.extents,
            vec![
                Extent {
                    transport: "a".into(),
                    addr: 6,
                    bytes: 4
                },
                Extent {
                    transport: "b".into(),
                    addr: 100,
                    bytes: 8
                },
            ]
        );
        assert!(m.slice_rows(0..0).unwrap().extents.is_empty());
        assert!(matches!(m.slice_rows(2..5), Err(Error::OutOfRange { .. })));
    }

    #[test]
    fn validation_catches_inconsistencies() {
        let mut m = meta();
        m.shape = vec![5, 3];
        assert!(matches!(m.validate(), Err(Error::Shape(_))));
        let mut m = meta();
        m.item_size = 0;
        assert!(matches!(m.validate(), Err(Error::Meta(_))));
        let mut m = meta();
        m.extents[0].addr = u64::MAX;
        assert!(matches!(m.validate(), Err(Error::Meta(_))));
        let mut m = meta();
        m.shape = vec![];
        assert!(m.validate().is_err());
        let mut m = meta();
        m.shape = vec![usize::MAX, 3];
        assert!(m.validate().is_err());
    }

    #[test]
    fn concat_checks_types_and_shapes() {
        let m = meta();
        let c = ArrayMeta::concat(&[m.clone(), m.clone()]).unwrap();
        assert_eq!(c.shape, vec![8, 3]);
        assert_eq!(c.extents.len(), 4);
        let mut other = m.clone();
        other.dtype = "i16".into();
        assert!(matches!(
            ArrayMeta::concat(&[m.clone(), other]),
            Err(Error::TypeMismatch { .. })
        ));
        let mut wide = m.clone();
        wide.shape = vec![3, 4];
        assert!(matches!(
            ArrayMeta::concat(&[m, wide]),
            Err(Error::Shape(_))
        ));
        assert!(ArrayMeta::concat(&[]).is_err());
    }
}
