//! # scad-npjoin — the kernels behind Python's `npjoin.join`: hash join on numeric keys, hash
//! partitioning and counting sort, over plain slices.
//!
//! Keys are first turned into 64-bit *key codes* ([`KeyCode`], [`codes`]) so that
//! equal keys get equal codes: for floats `-0.0` and `0.0` match and every NaN matches
//! every NaN (as in pandas `merge`). On codes:
//!
//! - [`JoinTable::build`] groups the left keys (group numbers in order of first
//!   appearance) and returns, with the table, a stable `left_sorter` and per-group
//!   `left_count`; [`JoinTable::probe`] then yields every inner-join pair
//!   `(left_indexer, right_indexer)`, grouped by key in order of first appearance on
//!   the left, left rows and right rows each in their original order within a group.
//! - [`partition`] and [`partition_pair`] hash-partition rows by one or two key
//!   columns into `num_bins` bins with [`mix`] (fixed, the same in every process), as a
//!   stable `(sorter, bounds)`: the rows of bin `b` are `sorter[bounds[b]..bounds[b+1]]`.
//! - [`counting_sort`] and [`groupsort_indexer`] (pandas' `groupsort_indexer`) sort
//!   group labels stably.
//!
//! Indexers are `isize` (NumPy's `intp`). Nothing here touches Python; the binding
//! (scad-py) converts arrays, checks dtypes and releases the GIL around these calls.
//!
//! The crate has no cargo features. The kernels are plain functions over slices and
//! a [`JoinTable`] is immutable once built (`Send + Sync`), so any thread may run them.
//!
//! ```
//! use scad_npjoin::{codes, JoinTable, KeyType};
//!
//! let left = codes([1i64, 2, 2, 3]);
//! let right = codes([2i64, 5, 3, 2]);
//! let (table, sorter, count) = JoinTable::build(KeyType::I64, &left)?;
//! let (li, ri) = table.probe(&sorter, &count, &right)?;
//! assert_eq!(li, [1, 1, 2, 2, 3]);
//! assert_eq!(ri, [0, 3, 0, 3, 2]);
//! # Ok::<(), scad_npjoin::NpJoinError>(())
//! ```

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::str::FromStr;

/// What the kernels reject.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NpJoinError {
    /// A key type name other than `float32`, `float64`, `int32`, `int64`.
    #[error("unknown key type {0:?}")]
    UnknownKeyType(String),

    /// Keys of another type than the one asked for (or than the table's).
    #[error("join keys must be {expected}, not {found}")]
    KeyTypeMismatch {
        /// The type wanted.
        expected: KeyType,
        /// The type given.
        found: KeyType,
    },

    /// `num_bins` is 0 or above `u32::MAX`.
    #[error("num_bins must be between 1 and 4294967295 (u32::MAX), not {0}")]
    BadBinCount(usize),

    /// Two key columns of a pair differ in length.
    #[error("key columns differ in length: {0} and {1}")]
    LengthMismatch(usize, usize),

    /// `ngroups` or `left_count` do not belong to the table.
    #[error("ngroups {ngroups} and left_count of length {counts} do not match the table's {groups} groups")]
    GroupMismatch {
        /// `ngroups` given.
        ngroups: usize,
        /// Length of `left_count`.
        counts: usize,
        /// Groups in the table.
        groups: usize,
    },

    /// `left_count` has a negative entry or does not add up to `left_sorter`'s length.
    #[error("left_count must be non-negative and add up to the length of left_sorter")]
    BadLeftCount,

    /// A group label outside `[-1, ngroups)` (or `[0, ngroups)` for [`counting_sort`]).
    #[error("label {label} outside [{low}, {ngroups})")]
    LabelOutOfRange {
        /// The label.
        label: i64,
        /// Lowest label allowed.
        low: i64,
        /// Number of groups.
        ngroups: usize,
    },

    /// More rows or groups than the kernels' 32-bit labels hold, or a result whose
    /// length overflows.
    #[error("{0}")]
    TooLarge(&'static str),
}

/// Result alias of this module.
pub type Result<T, E = NpJoinError> = std::result::Result<T, E>;

/// Key element types the kernels accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyType {
    /// `float32`.
    F32,
    /// `float64`.
    F64,
    /// `int32`.
    I32,
    /// `int64`.
    I64,
}

impl KeyType {
    /// The NumPy name: `float32`, `float64`, `int32` or `int64`.
    pub fn name(self) -> &'static str {
        match self {
            KeyType::F32 => "float32",
            KeyType::F64 => "float64",
            KeyType::I32 => "int32",
            KeyType::I64 => "int64",
        }
    }
}

impl fmt::Display for KeyType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KeyType {
    type Err = NpJoinError;

    /// Parses a NumPy name (as [`KeyType::name`] prints it).
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "float32" => KeyType::F32,
            "float64" => KeyType::F64,
            "int32" => KeyType::I32,
            "int64" => KeyType::I64,
            other => return Err(NpJoinError::UnknownKeyType(other.to_owned())),
        })
    }
}

/// A key element type: how one key becomes its 64-bit code.
pub trait KeyCode: Copy {
    /// The [`KeyType`] of this element type.
    const KEY_TYPE: KeyType;

    /// The key's code; equal keys (`-0.0 == 0.0`, NaN == NaN) have equal codes, and
    /// different keys different codes.
    fn code(self) -> u64;
}

impl KeyCode for f32 {
    const KEY_TYPE: KeyType = KeyType::F32;

    fn code(self) -> u64 {
        if self.is_nan() {
            u64::from(f32::NAN.to_bits())
        } else if self == 0.0 {
            0
        } else {
            u64::from(self.to_bits())
        }
    }
}

impl KeyCode for f64 {
    const KEY_TYPE: KeyType = KeyType::F64;

    fn code(self) -> u64 {
        if self.is_nan() {
            f64::NAN.to_bits()
        } else if self == 0.0 {
            0
        } else {
            self.to_bits()
        }
    }
}

impl KeyCode for i32 {
    const KEY_TYPE: KeyType = KeyType::I32;

    fn code(self) -> u64 {
        u64::from(self as u32)
    }
}

impl KeyCode for i64 {
    const KEY_TYPE: KeyType = KeyType::I64;

    fn code(self) -> u64 {
        self as u64
    }
}

/// The codes of a column of keys (a slice, or any iterator such as a strided view).
pub fn codes<T: KeyCode>(keys: impl IntoIterator<Item = T>) -> Vec<u64> {
    keys.into_iter().map(KeyCode::code).collect()
}

/// One step of splitmix64 (the golden-ratio increment, then its finalizer): a fixed,
/// well-mixing hash, the same in every process.
pub fn mix(z: u64) -> u64 {
    let mut x = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 30;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Hasher for keys that are already 64-bit key codes.
#[derive(Default)]
struct MixHasher(u64);

impl Hasher for MixHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = mix(self.0 ^ u64::from(b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = mix(n);
    }
}

type KeyMap = HashMap<u64, u32, BuildHasherDefault<MixHasher>>;

/// Fails if `n` does not fit the 32-bit row numbers and labels of the kernels.
fn check_u32(n: usize, what: &'static str) -> Result<()> {
    if n > u32::MAX as usize {
        return Err(NpJoinError::TooLarge(what));
    }
    Ok(())
}

/// The hash table of a prepared join: key code → group number (order of first
/// appearance in the left keys).
#[derive(Debug, Clone)]
pub struct JoinTable {
    map: KeyMap,
    key_type: KeyType,
    rows: usize,
}

impl JoinTable {
    /// Groups the left key codes (of keys of `key_type`): `(table, left_sorter,
    /// left_count)`, where `left_sorter` lists the left rows group by group (each group
    /// in row order) and `left_count[g]` is the size of group `g`.
    ///
    /// # Errors
    /// [`NpJoinError::TooLarge`] for more than `u32::MAX` rows.
    pub fn build(key_type: KeyType, left: &[u64]) -> Result<(Self, Vec<isize>, Vec<isize>)> {
        check_u32(left.len(), "too many left rows (at most 2^32 - 1)")?;
        let mut map = KeyMap::default();
        let mut labels = Vec::with_capacity(left.len());
        for &k in left {
            // At most u32::MAX rows, so at most that many groups.
            let next = map.len() as u32;
            labels.push(*map.entry(k).or_insert(next));
        }
        let (sorter, counts) = counting_sort_unchecked(&labels, map.len());
        let table = JoinTable {
            map,
            key_type,
            rows: left.len(),
        };
        Ok((table, sorter, counts))
    }

    /// Number of groups (distinct left keys).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the left side had no rows.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The type of the keys the table was built from.
    pub fn key_type(&self) -> KeyType {
        self.key_type
    }

    /// Number of left rows the table was built from.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// All inner-join pairs of the right key codes against the table: `(left_indexer,
    /// right_indexer)`, grouped by key in order of first appearance on the left.
    /// `left_sorter` and `left_count` are those [`JoinTable::build`] returned (or any
    /// with the same group sizes; the left indices are passed through).
    ///
    /// # Errors
    /// [`NpJoinError::GroupMismatch`] if `left_count` does not have one entry per
    /// group, [`NpJoinError::BadLeftCount`] if it does not describe `left_sorter`,
    /// [`NpJoinError::TooLarge`] for more than `u32::MAX` right rows or a result too
    /// long to index.
    pub fn probe(
        &self,
        left_sorter: &[isize],
        left_count: &[isize],
        right: &[u64],
    ) -> Result<(Vec<isize>, Vec<isize>)> {
        let ngroups = self.map.len();
        if left_count.len() != ngroups {
            return Err(NpJoinError::GroupMismatch {
                ngroups,
                counts: left_count.len(),
                groups: ngroups,
            });
        }
        let mut total_left = 0usize;
        for &c in left_count {
            let c = usize::try_from(c).map_err(|_| NpJoinError::BadLeftCount)?;
            total_left = total_left.checked_add(c).ok_or(NpJoinError::BadLeftCount)?;
        }
        if total_left != left_sorter.len() {
            return Err(NpJoinError::BadLeftCount);
        }
        check_u32(right.len(), "too many right rows (at most 2^32 - 1)")?;

        // Right rows by group, stable.
        let mut rlabels: Vec<(u32, u32)> = Vec::new();
        let mut rc = vec![0usize; ngroups];
        for (i, k) in right.iter().enumerate() {
            if let Some(&g) = self.map.get(k) {
                rc[g as usize] += 1;
                rlabels.push((g, i as u32));
            }
        }
        let mut rstart = Vec::with_capacity(ngroups + 1);
        let mut acc = 0usize;
        for &c in &rc {
            rstart.push(acc);
            acc += c;
        }
        rstart.push(acc);
        let mut rsorted = vec![0isize; acc];
        let mut next = rstart.clone();
        for &(g, i) in &rlabels {
            rsorted[next[g as usize]] = i as isize;
            next[g as usize] += 1;
        }

        let mut total = 0usize;
        for (&l, &r) in left_count.iter().zip(&rc) {
            // Non-negative: checked above.
            total = (l as usize)
                .checked_mul(r)
                .and_then(|n| total.checked_add(n))
                .filter(|&n| n <= isize::MAX as usize)
                .ok_or(NpJoinError::TooLarge("the join result has too many rows"))?;
        }
        let mut li = Vec::with_capacity(total);
        let mut ri = Vec::with_capacity(total);
        let mut lpos = 0usize;
        for (g, &n) in left_count.iter().enumerate() {
            let n = n as usize;
            let rights = &rsorted[rstart[g]..rstart[g + 1]];
            if !rights.is_empty() {
                for &l in &left_sorter[lpos..lpos + n] {
                    for &r in rights {
                        li.push(l);
                        ri.push(r);
                    }
                }
            }
            lpos += n;
        }
        Ok((li, ri))
    }
}

/// Stable counting sort of `labels` (each `< ngroups`, checked by the caller):
/// `(sorter, counts)`.
fn counting_sort_unchecked(labels: &[u32], ngroups: usize) -> (Vec<isize>, Vec<isize>) {
    let mut counts = vec![0isize; ngroups];
    for &l in labels {
        counts[l as usize] += 1;
    }
    let mut next = Vec::with_capacity(ngroups);
    let mut acc = 0isize;
    for &c in &counts {
        next.push(acc);
        acc += c;
    }
    let mut sorter = vec![0isize; labels.len()];
    for (i, &l) in labels.iter().enumerate() {
        let slot = &mut next[l as usize];
        sorter[*slot as usize] = i as isize;
        *slot += 1;
    }
    (sorter, counts)
}

/// Stable counting sort of `labels`, each in `[0, ngroups)`: `(sorter, counts)`, where
/// `sorter` lists the indices of label 0, then of label 1, ..., each in index order,
/// and `counts[g]` is how many labels are `g`.
///
/// # Errors
/// [`NpJoinError::LabelOutOfRange`] for a label `>= ngroups`.
pub fn counting_sort(labels: &[u32], ngroups: usize) -> Result<(Vec<isize>, Vec<isize>)> {
    if let Some(&l) = labels.iter().find(|&&l| l as usize >= ngroups) {
        return Err(NpJoinError::LabelOutOfRange {
            label: i64::from(l),
            low: 0,
            ngroups,
        });
    }
    Ok(counting_sort_unchecked(labels, ngroups))
}

/// Counting sort of group labels in `[-1, ngroups)`: `(indexer, counts)`, with
/// `counts[0]` counting label -1 and `counts[g + 1]` label `g` (as pandas'
/// `groupsort_indexer`); stable.
///
/// # Errors
/// [`NpJoinError::LabelOutOfRange`] for a label outside `[-1, ngroups)`,
/// [`NpJoinError::TooLarge`] for `ngroups >= u32::MAX`.
pub fn groupsort_indexer(labels: &[i64], ngroups: usize) -> Result<(Vec<isize>, Vec<isize>)> {
    if ngroups >= u32::MAX as usize {
        return Err(NpJoinError::TooLarge("too many groups"));
    }
    let mut shifted = Vec::with_capacity(labels.len());
    for &l in labels {
        if l < -1 || l >= ngroups as i64 {
            return Err(NpJoinError::LabelOutOfRange {
                label: l,
                low: -1,
                ngroups,
            });
        }
        // In [0, ngroups] and ngroups < u32::MAX.
        shifted.push((l + 1) as u32);
    }
    Ok(counting_sort_unchecked(&shifted, ngroups + 1))
}

/// Fails unless `1 <= num_bins <= u32::MAX`.
///
/// # Errors
/// [`NpJoinError::BadBinCount`].
pub fn check_bins(num_bins: usize) -> Result<()> {
    if num_bins == 0 || num_bins > u32::MAX as usize {
        return Err(NpJoinError::BadBinCount(num_bins));
    }
    Ok(())
}

/// The `(sorter, bounds)` of rows already assigned to bins.
fn bins_to_partition(bins: &[u32], num_bins: usize) -> (Vec<isize>, Vec<isize>) {
    let (sorter, counts) = counting_sort_unchecked(bins, num_bins);
    let mut bounds = Vec::with_capacity(num_bins + 1);
    let mut acc = 0isize;
    bounds.push(0);
    for c in counts {
        acc += c;
        bounds.push(acc);
    }
    (sorter, bounds)
}

/// The bin of one key code (`num_bins >= 1`).
pub fn bin_of(code: u64, num_bins: usize) -> u32 {
    // < num_bins <= u32::MAX (check_bins).
    (mix(code) % num_bins as u64) as u32
}

/// The bin of a pair of key codes (`num_bins >= 1`).
pub fn bin_of_pair(a: u64, b: u64, num_bins: usize) -> u32 {
    (mix(mix(a) ^ b.rotate_left(17)) % num_bins as u64) as u32
}

/// Hash-partitions rows by one key column's codes: `(sorter, bounds)`; the rows of bin
/// `b` ([`bin_of`]) are `sorter[bounds[b]..bounds[b + 1]]`, in row order.
///
/// # Errors
/// [`NpJoinError::BadBinCount`].
pub fn partition(keys: &[u64], num_bins: usize) -> Result<(Vec<isize>, Vec<isize>)> {
    check_bins(num_bins)?;
    let bins: Vec<u32> = keys.iter().map(|&k| bin_of(k, num_bins)).collect();
    Ok(bins_to_partition(&bins, num_bins))
}

/// Hash-partitions rows by a pair of key columns' codes ([`bin_of_pair`]), as
/// [`partition`].
///
/// # Errors
/// [`NpJoinError::BadBinCount`], [`NpJoinError::LengthMismatch`].
pub fn partition_pair(k1: &[u64], k2: &[u64], num_bins: usize) -> Result<(Vec<isize>, Vec<isize>)> {
    check_bins(num_bins)?;
    if k1.len() != k2.len() {
        return Err(NpJoinError::LengthMismatch(k1.len(), k2.len()));
    }
    let bins: Vec<u32> = k1
        .iter()
        .zip(k2)
        .map(|(&a, &b)| bin_of_pair(a, b, num_bins))
        .collect();
    Ok(bins_to_partition(&bins, num_bins))
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    /// Key equality as the kernels define it (NaN == NaN, -0.0 == 0.0).
    fn same_f64(a: f64, b: f64) -> bool {
        a == b || (a.is_nan() && b.is_nan())
    }

    /// Every pair, by a nested loop, in the order the kernel promises: left keys'
    /// groups in order of first appearance, then left rows, then right rows.
    fn nested_loop<T: Copy>(
        left: &[T],
        right: &[T],
        eq: impl Fn(T, T) -> bool,
    ) -> (Vec<isize>, Vec<isize>) {
        let mut firsts: Vec<usize> = Vec::new();
        for i in 0..left.len() {
            if !firsts.iter().any(|&f| eq(left[f], left[i])) {
                firsts.push(i);
            }
        }
        let (mut li, mut ri) = (Vec::new(), Vec::new());
        for &f in &firsts {
            for (i, &l) in left.iter().enumerate() {
                if !eq(left[f], l) {
                    continue;
                }
                for (j, &r) in right.iter().enumerate() {
                    if eq(l, r) {
                        li.push(i as isize);
                        ri.push(j as isize);
                    }
                }
            }
        }
        (li, ri)
    }

    fn join<T: KeyCode>(left: &[T], right: &[T]) -> (Vec<isize>, Vec<isize>) {
        let (table, sorter, count) =
            JoinTable::build(T::KEY_TYPE, &codes(left.iter().copied())).unwrap();
        assert_eq!(table.rows(), left.len());
        assert_eq!(count.iter().sum::<isize>() as usize, left.len());
        table
            .probe(&sorter, &count, &codes(right.iter().copied()))
            .unwrap()
    }

    /// A float key from a small domain with duplicates, NaNs (several payloads) and
    /// both zeros.
    fn float_key(rng: &mut StdRng) -> f64 {
        match rng.gen_range(0..10) {
            0 => f64::NAN,
            1 => -f64::NAN,
            2 => 0.0,
            3 => -0.0,
            _ => f64::from(rng.gen_range(-20i32..20)) * 0.5,
        }
    }

    #[test]
    fn joins_equal_a_nested_loop_on_random_keys() {
        let mut rng = StdRng::seed_from_u64(7);
        for round in 0..20 {
            let (nl, nr) = (rng.gen_range(0..200), rng.gen_range(0..200));
            let left: Vec<i64> = (0..nl).map(|_| rng.gen_range(-30..30)).collect();
            let right: Vec<i64> = (0..nr).map(|_| rng.gen_range(-30..30)).collect();
            assert_eq!(
                join(&left, &right),
                nested_loop(&left, &right, |a, b| a == b),
                "i64 round {round}"
            );

            let l32: Vec<i32> = left.iter().map(|&x| x as i32 * 50_000_000).collect();
            let r32: Vec<i32> = right.iter().map(|&x| x as i32 * 50_000_000).collect();
            assert_eq!(
                join(&l32, &r32),
                nested_loop(&l32, &r32, |a, b| a == b),
                "i32 round {round}"
            );

            let lf: Vec<f64> = (0..nl).map(|_| float_key(&mut rng)).collect();
            let rf: Vec<f64> = (0..nr).map(|_| float_key(&mut rng)).collect();
            assert_eq!(
                join(&lf, &rf),
                nested_loop(&lf, &rf, same_f64),
                "f64 round {round}"
            );

            let lf32: Vec<f32> = lf.iter().map(|&x| x as f32).collect();
            let rf32: Vec<f32> = rf.iter().map(|&x| x as f32).collect();
            let eq32 = |a: f32, b: f32| same_f64(f64::from(a), f64::from(b));
            assert_eq!(
                join(&lf32, &rf32),
                nested_loop(&lf32, &rf32, eq32),
                "f32 round {round}"
            );
        }
    }

    #[test]
    fn nan_and_signed_zero_match() {
        let left = [f32::NAN, 0.0, 1.0];
        let right = [-0.0, -f32::NAN, 2.0];
        assert_eq!(join(&left, &right), (vec![0, 1], vec![1, 0]));
        assert_eq!(0.0f64.code(), (-0.0f64).code());
        assert_eq!(f64::NAN.code(), (-f64::NAN).code());
        assert_eq!(
            f64::NAN.code(),
            f64::from_bits(0x7ff8_0000_0000_0001).code()
        );
        assert_ne!(1.0f64.code(), (-1.0f64).code());
        assert_eq!((-1i32).code(), 0xffff_ffff);
        assert_eq!((-1i64).code(), u64::MAX);
    }

    #[test]
    fn empty_sides() {
        assert_eq!(join::<i64>(&[], &[1, 2]), (vec![], vec![]));
        assert_eq!(join::<i64>(&[1, 2], &[]), (vec![], vec![]));
        let (table, sorter, count) = JoinTable::build(KeyType::I64, &[]).unwrap();
        assert!(table.is_empty() && sorter.is_empty() && count.is_empty());
    }

    #[test]
    fn build_groups_in_order_of_first_appearance() {
        let (table, sorter, count) =
            JoinTable::build(KeyType::I64, &codes([5i64, 3, 5, 9, 3, 5])).unwrap();
        assert_eq!(table.len(), 3);
        assert_eq!(table.key_type(), KeyType::I64);
        assert_eq!(sorter, [0, 2, 5, 1, 4, 3]);
        assert_eq!(count, [3, 2, 1]);
    }

    #[test]
    fn probe_checks_its_inputs() {
        let (table, sorter, count) = JoinTable::build(KeyType::I64, &codes([1i64, 2, 2])).unwrap();
        let right = codes([2i64]);
        assert!(matches!(
            table.probe(&sorter, &count[..1], &right),
            Err(NpJoinError::GroupMismatch {
                counts: 1,
                groups: 2,
                ..
            })
        ));
        assert_eq!(
            table.probe(&sorter, &[-1, 4], &right),
            Err(NpJoinError::BadLeftCount)
        );
        assert_eq!(
            table.probe(&sorter, &[1, 1], &right),
            Err(NpJoinError::BadLeftCount)
        );
        assert_eq!(
            table.probe(&sorter[..2], &count, &right),
            Err(NpJoinError::BadLeftCount)
        );
        assert_eq!(
            table.probe(&sorter, &[isize::MAX, isize::MAX], &right),
            Err(NpJoinError::BadLeftCount)
        );
        assert_eq!(
            table.probe(&sorter, &count, &right),
            Ok((vec![1, 2], vec![0, 0]))
        );
    }

    #[test]
    fn mix_is_splitmix64() {
        // The first outputs of splitmix64 seeded with 0: partitions must agree across
        // processes and releases.
        assert_eq!(mix(0), 0xe220_a839_7b1d_cdaf);
        assert_eq!(mix(0x9e37_79b9_7f4a_7c15), 0x6e78_9e6a_a1b9_65f4);
    }

    /// `sorter` is a permutation of `0..n`, `bounds` cut it into `num_bins` bins, rows
    /// ascend within a bin, and each row lies in the bin `bin` gives it.
    fn check_partition(
        sorter: &[isize],
        bounds: &[isize],
        n: usize,
        num_bins: usize,
        bin: impl Fn(usize) -> u32,
    ) {
        assert_eq!(bounds.len(), num_bins + 1);
        assert_eq!(bounds[0], 0);
        assert_eq!(bounds[num_bins] as usize, n);
        let mut seen = vec![false; n];
        for b in 0..num_bins {
            assert!(bounds[b] <= bounds[b + 1]);
            let rows = &sorter[bounds[b] as usize..bounds[b + 1] as usize];
            assert!(
                rows.windows(2).all(|w| w[0] < w[1]),
                "stable within bin {b}"
            );
            for &r in rows {
                let r = r as usize;
                assert!(!seen[r], "row {r} twice");
                seen[r] = true;
                assert_eq!(bin(r), b as u32);
            }
        }
        assert!(seen.iter().all(|&s| s), "every row once");
    }

    #[test]
    fn partition_covers_every_row_once_and_keeps_equal_keys_together() {
        let mut rng = StdRng::seed_from_u64(11);
        for num_bins in [1, 2, 7, 64] {
            let keys: Vec<f64> = (0..1000).map(|_| float_key(&mut rng)).collect();
            let c = codes(keys.iter().copied());
            let (sorter, bounds) = partition(&c, num_bins).unwrap();
            check_partition(&sorter, &bounds, keys.len(), num_bins, |r| {
                bin_of(c[r], num_bins)
            });
            // Equal keys (incl. NaN and -0.0) share a bin.
            for i in 0..keys.len() {
                for j in 0..keys.len() {
                    if same_f64(keys[i], keys[j]) {
                        assert_eq!(bin_of(c[i], num_bins), bin_of(c[j], num_bins));
                    }
                }
            }
        }
        assert_eq!(partition(&[], 3).unwrap(), (vec![], vec![0, 0, 0, 0]));
        assert_eq!(partition(&[1], 0), Err(NpJoinError::BadBinCount(0)));
    }

    #[test]
    fn partition_pair_covers_every_row_once() {
        let mut rng = StdRng::seed_from_u64(13);
        let k1 = codes(
            (0..800)
                .map(|_| rng.gen_range(0i64..10))
                .collect::<Vec<_>>(),
        );
        let k2 = codes(
            (0..800)
                .map(|_| rng.gen_range(0i32..10))
                .collect::<Vec<_>>(),
        );
        let (sorter, bounds) = partition_pair(&k1, &k2, 5).unwrap();
        check_partition(&sorter, &bounds, 800, 5, |r| bin_of_pair(k1[r], k2[r], 5));
        // The pair's bin depends on both columns, in order.
        let spread = (0..100u64)
            .map(|b| bin_of_pair(1, b, 64))
            .collect::<std::collections::HashSet<_>>();
        assert!(spread.len() > 10);
        assert_ne!(
            (0..100u64)
                .map(|b| bin_of_pair(1, b, 1 << 20))
                .collect::<Vec<_>>(),
            (0..100u64)
                .map(|b| bin_of_pair(b, 1, 1 << 20))
                .collect::<Vec<_>>()
        );
        assert_eq!(
            partition_pair(&k1, &k2[1..], 5),
            Err(NpJoinError::LengthMismatch(800, 799))
        );
        assert_eq!(
            partition_pair(&k1, &k2, 0),
            Err(NpJoinError::BadBinCount(0))
        );
    }

    #[test]
    fn counting_sort_is_stable() {
        let mut rng = StdRng::seed_from_u64(17);
        let labels: Vec<u32> = (0..2000).map(|_| rng.gen_range(0..37)).collect();
        let (sorter, counts) = counting_sort(&labels, 40).unwrap();
        // Equal to a stable comparison sort of the indices by label.
        let mut want: Vec<isize> = (0..labels.len() as isize).collect();
        want.sort_by_key(|&i| labels[i as usize]);
        assert_eq!(sorter, want);
        for (g, &c) in counts.iter().enumerate() {
            assert_eq!(
                c as usize,
                labels.iter().filter(|&&l| l as usize == g).count()
            );
        }
        assert_eq!(counts[37..], [0, 0, 0]);
        assert!(matches!(
            counting_sort(&[0, 3], 3),
            Err(NpJoinError::LabelOutOfRange { label: 3, .. })
        ));
    }

    #[test]
    fn groupsort_indexer_counts_missing_labels_first() {
        let (indexer, counts) = groupsort_indexer(&[1, -1, 0, 1, -1, 2], 3).unwrap();
        assert_eq!(indexer, [1, 4, 2, 0, 3, 5]);
        assert_eq!(counts, [2, 1, 2, 1]);
        assert_eq!(groupsort_indexer(&[], 0).unwrap(), (vec![], vec![0]));
        for bad in [-2, 3] {
            assert!(matches!(
                groupsort_indexer(&[0, bad], 3),
                Err(NpJoinError::LabelOutOfRange {
                    low: -1,
                    ngroups: 3,
                    ..
                })
            ));
        }
        assert_eq!(
            groupsort_indexer(&[], u32::MAX as usize),
            Err(NpJoinError::TooLarge("too many groups"))
        );
    }

    #[test]
    fn key_type_names() {
        for kt in [KeyType::F32, KeyType::F64, KeyType::I32, KeyType::I64] {
            assert_eq!(kt.name().parse::<KeyType>(), Ok(kt));
            assert_eq!(kt.to_string(), kt.name());
        }
        assert_eq!(
            "float16".parse::<KeyType>(),
            Err(NpJoinError::UnknownKeyType("float16".into()))
        );
        assert_eq!(f32::KEY_TYPE, KeyType::F32);
        assert_eq!(i64::KEY_TYPE, KeyType::I64);
    }
}
