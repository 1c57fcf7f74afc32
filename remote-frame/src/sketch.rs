//! Distinct-count sketches: a HyperLogLog per column, filled as a frame is written and
//! kept in its metadata, so that the planner knows how many distinct values a column
//! holds (is `i_brand` as fine as the item key, or coarser?) without reading it.
//!
//! 1,024 one-byte registers (a relative error of about 3 %), hashed with DataFusion's
//! fixed-seed HyperLogLog hash state, so a sketch means the same in every process
//! that reads the metadata. Nulls are not counted. Stored as base64: the registers
//! themselves, or for a sketch with few registers set (a small frame) the set ones
//! as (index, value) pairs, so that small frames keep small metadata.

use arrow_array::{Array, ArrayRef};
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use datafusion::common::hash_utils::{create_hashes, HLL_RANDOM_STATE};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{Error, Result};

/// Bits of the hash that pick a register.
const INDEX_BITS: u32 = 10;
/// Registers per sketch.
pub const REGISTERS: usize = 1 << INDEX_BITS;
/// The largest register value: the hash's remaining bits all zero, plus one.
const MAX_RANK: u8 = (64 - INDEX_BITS + 1) as u8;
/// Leading byte of a stored sketch: the registers as they are.
const DENSE: u8 = 0;
/// Leading byte of a stored sketch: (index, value) pairs of the set registers.
const SPARSE: u8 = 1;

/// A HyperLogLog sketch of one column's values (see the module docs).
#[derive(Clone, PartialEq, Eq)]
pub struct DistinctSketch {
    registers: Box<[u8; REGISTERS]>,
}

impl Default for DistinctSketch {
    fn default() -> Self {
        DistinctSketch {
            registers: Box::new([0; REGISTERS]),
        }
    }
}

impl std::fmt::Debug for DistinctSketch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DistinctSketch")
            .field("estimate", &self.estimate())
            .finish()
    }
}

impl DistinctSketch {
    /// Adds the non-null values of `array`.
    ///
    /// # Errors
    /// [`Error::Query`] when DataFusion cannot hash the array's type.
    pub fn add_array(&mut self, array: &ArrayRef) -> Result<()> {
        let mut hashes = vec![0u64; array.len()];
        create_hashes([array], &HLL_RANDOM_STATE, &mut hashes)
            .map_err(|e| Error::Query(Box::new(e)))?;
        match array.logical_nulls() {
            Some(nulls) => hashes
                .iter()
                .zip(nulls.iter())
                .filter(|(_, valid)| *valid)
                .for_each(|(&h, _)| self.add_hash(h)),
            None => hashes.iter().for_each(|&h| self.add_hash(h)),
        }
        Ok(())
    }

    fn add_hash(&mut self, hash: u64) {
        let index = (hash & (REGISTERS as u64 - 1)) as usize;
        // The rank of the first set bit above the index bits (a sentinel bit ends
        // the count at the largest rank).
        let rank = ((hash >> INDEX_BITS) | (1 << (64 - INDEX_BITS))).trailing_zeros() + 1;
        let slot = &mut self.registers[index];
        *slot = (*slot).max(rank as u8);
    }

    /// Adds every value `other` counted.
    pub fn merge(&mut self, other: &DistinctSketch) {
        for (a, b) in self.registers.iter_mut().zip(other.registers.iter()) {
            *a = (*a).max(*b);
        }
    }

    /// The estimated number of distinct non-null values (HyperLogLog's estimate,
    /// linear counting while many registers are empty).
    pub fn estimate(&self) -> u64 {
        let m = REGISTERS as f64;
        let alpha = 0.7213 / (1.0 + 1.079 / m);
        let sum: f64 = self
            .registers
            .iter()
            .map(|&r| 2f64.powi(-i32::from(r)))
            .sum();
        let raw = alpha * m * m / sum;
        let empty = self.registers.iter().filter(|&&r| r == 0).count();
        let estimate = if raw <= 2.5 * m && empty > 0 {
            m * (m / empty as f64).ln()
        } else {
            raw
        };
        estimate.round() as u64
    }

    /// The sketch as stored in metadata (see the module docs).
    fn encode(&self) -> String {
        let set: Vec<(usize, u8)> = self
            .registers
            .iter()
            .enumerate()
            .filter(|(_, &r)| r > 0)
            .map(|(i, &r)| (i, r))
            .collect();
        let mut bytes = Vec::new();
        if set.len() * 3 < REGISTERS {
            bytes.push(SPARSE);
            for (i, r) in set {
                bytes.extend_from_slice(&(i as u16).to_le_bytes());
                bytes.push(r);
            }
        } else {
            bytes.push(DENSE);
            bytes.extend_from_slice(&self.registers[..]);
        }
        BASE64.encode(bytes)
    }

    /// A sketch stored by [`DistinctSketch::encode`].
    ///
    /// # Errors
    /// [`Error::Meta`] for text that is not one.
    fn decode(text: &str) -> Result<Self> {
        let bad = |why: String| Error::Meta(format!("distinct-count sketch: {why}"));
        let bytes = BASE64
            .decode(text)
            .map_err(|e| bad(format!("not base64 ({e})")))?;
        let mut sketch = DistinctSketch::default();
        match bytes.split_first() {
            Some((&DENSE, registers)) if registers.len() == REGISTERS => {
                sketch.registers.copy_from_slice(registers);
            }
            Some((&DENSE, registers)) => {
                return Err(bad(format!(
                    "{} registers, a sketch has {REGISTERS}",
                    registers.len()
                )))
            }
            Some((&SPARSE, pairs)) if pairs.len() % 3 == 0 => {
                for pair in pairs.chunks_exact(3) {
                    let index = usize::from(u16::from_le_bytes([pair[0], pair[1]]));
                    let slot = sketch
                        .registers
                        .get_mut(index)
                        .ok_or_else(|| bad(format!("register {index} of {REGISTERS}")))?;
                    *slot = pair[2];
                }
            }
            Some((&SPARSE, _)) => return Err(bad("a sparse sketch cut short".into())),
            Some((tag, _)) => return Err(bad(format!("unknown encoding {tag}"))),
            None => return Err(bad("empty".into())),
        }
        if let Some(r) = sketch.registers.iter().find(|&&r| r > MAX_RANK) {
            return Err(bad(format!("register value {r} above {MAX_RANK}")));
        }
        Ok(sketch)
    }
}

impl Serialize for DistinctSketch {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.encode())
    }
}

impl<'de> Deserialize<'de> for DistinctSketch {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        DistinctSketch::decode(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;

    use arrow_array::{Int64Array, StringArray};

    use super::*;

    fn sketch_of(array: ArrayRef) -> DistinctSketch {
        let mut s = DistinctSketch::default();
        s.add_array(&array).unwrap();
        s
    }

    fn assert_near(got: u64, want: u64, tolerance: f64) {
        let error = (got as f64 - want as f64).abs() / want as f64;
        assert!(error <= tolerance, "estimated {got}, {want} distinct");
    }

    #[test]
    fn estimates_are_within_a_few_percent_from_ten_values_to_a_million() {
        for distinct in [10i64, 1_000, 100_000, 1_000_000] {
            // Every value three times: repeats add nothing.
            let values: Int64Array = (0..distinct * 3).map(|i| i % distinct).collect();
            let got = sketch_of(Arc::new(values)).estimate();
            assert_near(got, distinct as u64, 0.08);
        }
        let names: StringArray = (0..50_000)
            .map(|i| Some(format!("brand #{}", i % 700)))
            .collect();
        assert_near(sketch_of(Arc::new(names)).estimate(), 700, 0.08);
    }

    #[test]
    fn nulls_are_not_counted_and_an_empty_sketch_counts_nothing() {
        let values: Int64Array = (0..10_000)
            .map(|i| (i % 2 == 0).then_some(i % 100))
            .collect();
        assert_near(sketch_of(Arc::new(values)).estimate(), 50, 0.08);
        assert_eq!(DistinctSketch::default().estimate(), 0);
    }

    #[test]
    fn merged_sketches_count_the_union() {
        let a = sketch_of(Arc::new((0..60_000i64).collect::<Int64Array>()));
        let b = sketch_of(Arc::new((40_000..100_000i64).collect::<Int64Array>()));
        let mut both = a.clone();
        both.merge(&b);
        assert_near(both.estimate(), 100_000, 0.08);
        let mut again = both.clone();
        again.merge(&a);
        assert_eq!(again, both);
    }

    #[test]
    fn sketches_round_trip_through_json_sparse_and_dense() {
        for distinct in [3i64, 200_000] {
            let s = sketch_of(Arc::new((0..distinct).collect::<Int64Array>()));
            let json = serde_json::to_string(&s).unwrap();
            let back: DistinctSketch = serde_json::from_str(&json).unwrap();
            assert_eq!(back, s);
            if distinct == 3 {
                assert!(json.len() < 20, "a sketch of 3 values stored in {json}");
            }
        }
    }

    #[test]
    fn malformed_sketches_are_refused_by_name() {
        let cases = [
            ("\"***\"", "not base64"),
            ("\"\"", "empty"),
            (
                &format!("\"{}\"", BASE64.encode([DENSE, 1, 2])),
                "2 registers",
            ),
            (
                &format!("\"{}\"", BASE64.encode([SPARSE, 1, 2])),
                "cut short",
            ),
            (
                &format!("\"{}\"", BASE64.encode([SPARSE, 0, 4, 1])),
                "register 1024",
            ),
            (
                &format!("\"{}\"", BASE64.encode([SPARSE, 0, 0, 60])),
                "register value 60",
            ),
            (&format!("\"{}\"", BASE64.encode([7])), "unknown encoding 7"),
        ];
        for (json, want) in cases {
            let err = serde_json::from_str::<DistinctSketch>(json).unwrap_err();
            assert!(err.to_string().contains(want), "{json}: {err}");
        }
    }
}
