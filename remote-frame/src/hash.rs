//! Row hashes of key columns, for hash partitioning.
//!
//! Equal keys hash equally whatever the integer width on either side of a join
//! (integers are widened to 64 bits first); a null hashes to a fixed value (null keys
//! never match, but their rows must land somewhere for left and anti joins).

use polars::prelude::{DataFrame, DataType, IdxCa, IdxSize, PlSmallStr};

use rayon::prelude::*;

use crate::error::{Error, Result};

const K: u64 = 0x9E37_79B9_7F4A_7C15;
const NULL_HASH: u64 = 0x2545_F491_4F6C_DD1D;

/// The splitmix64 finalizer.
#[inline]
pub(crate) fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

#[inline]
fn bytes_hash(b: &[u8]) -> u64 {
    let mut h = (b.len() as u64).wrapping_mul(K);
    let mut it = b.chunks_exact(8);
    for c in &mut it {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        h = (h ^ u64::from_le_bytes(w)).wrapping_mul(K).rotate_left(29);
    }
    let mut w = [0u8; 8];
    let r = it.remainder();
    w[..r.len()].copy_from_slice(r);
    mix(h ^ u64::from_le_bytes(w))
}

/// One hash per row of `df` over columns `keys`, seeded by `seed`.
///
/// # Errors
/// [`Error::UnknownColumn`]; [`Error::UnsupportedType`] for key types that cannot be
/// hashed here.
pub fn row_hashes(df: &DataFrame, keys: &[String], seed: u64) -> Result<Vec<u64>> {
    let n = df.height();
    let mut h = vec![mix(seed.wrapping_mul(K) ^ 0x1234_5678); n];
    let fold = |h: &mut u64, v: u64| *h = mix(h.rotate_left(17) ^ v.wrapping_mul(K));
    for k in keys {
        let col = df.column(k).map_err(|_| Error::UnknownColumn {
            name: k.clone(),
            known: df
                .get_column_names()
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        })?;
        let s = col.as_materialized_series();
        let unsupported = || Error::UnsupportedType {
            column: k.clone(),
            dtype: format!("{} (as a hash key)", s.dtype()),
        };
        match s.dtype() {
            DataType::String => {
                for (h, v) in h.iter_mut().zip(s.str()?.iter()) {
                    fold(h, v.map_or(NULL_HASH, |v| bytes_hash(v.as_bytes())));
                }
            }
            DataType::Float32 | DataType::Float64 => {
                let c = s.cast(&DataType::Float64)?;
                for (h, v) in h.iter_mut().zip(c.f64()?.iter()) {
                    // -0.0 and 0.0 are equal keys.
                    fold(h, v.map_or(NULL_HASH, |v| mix((v + 0.0).to_bits())));
                }
            }
            DataType::UInt64 => {
                for (h, v) in h.iter_mut().zip(s.u64()?.iter()) {
                    fold(h, v.map_or(NULL_HASH, mix));
                }
            }
            DataType::Decimal(..) => {
                let p = s.to_physical_repr();
                for (h, v) in h.iter_mut().zip(p.i128()?.iter()) {
                    fold(
                        h,
                        v.map_or(NULL_HASH, |v| mix(v as u64 ^ mix((v >> 64) as u64))),
                    );
                }
            }
            DataType::Null => {
                for h in h.iter_mut() {
                    fold(h, NULL_HASH);
                }
            }
            DataType::Boolean
            | DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32
            | DataType::Date => {
                let c = s.to_physical_repr().cast(&DataType::Int64)?;
                for (h, v) in h.iter_mut().zip(c.i64()?.iter()) {
                    fold(h, v.map_or(NULL_HASH, |v| mix(v as u64)));
                }
            }
            _ => return Err(unsupported()),
        }
    }
    Ok(h)
}

/// Splits `df` into `parts` pieces by the hash of `keys` (seeded by `level`, so a
/// partition split again at the next level spreads over all new partitions).
///
/// # Errors
/// As [`row_hashes`]; Polars errors from the gather.
pub fn split(df: &DataFrame, keys: &[String], level: u32, parts: usize) -> Result<Vec<DataFrame>> {
    let hashes = row_hashes(df, keys, u64::from(level) + 1)?;
    let mut idx: Vec<Vec<IdxSize>> =
        vec![Vec::with_capacity(df.height() / parts.max(1) + 16); parts];
    for (row, h) in hashes.iter().enumerate() {
        // Multiply-shift range reduction of the high 32 bits (no division).
        let p = ((h >> 32) * parts as u64) >> 32;
        idx[p as usize].push(row as IdxSize);
    }
    idx.into_par_iter()
        .map(|i| {
            let ca = IdxCa::from_vec(PlSmallStr::EMPTY, i);
            Ok(df.take(&ca)?)
        })
        .collect()
}
