//! The bounds of a join's build keys, handed to the scans of its probe side.
//!
//! Once a hash join has read its build side, no probe row with a key outside the
//! build keys' range can match. DataFusion's planner gives each hash join whose
//! unmatched probe rows are dropped a dynamic filter on its probe keys, pushed down
//! to the probe side's scans; [`super::scan::RemoteScanExec`] skips the chunks whose
//! statistics show the filter excludes all of their rows. Fact tables stored in key
//! order gain most: inventory is stored by date, so a join with a month of dates
//! reads a month of inventory.
//!
//! The spilling join takes the filter over from the join it wraps (which may see
//! only some partitions of the build side, or swapped roles) and publishes
//! [`KeyBounds`] gathered over every build row its partitions read, once all of them
//! have read theirs. A single key of few build rows is also listed (for a join that
//! probes as it comes, only keys sparse in their range): the scan then drops the
//! probe rows whose key is not among them (see `RowFilters` there), which bounds
//! cannot do when the few keys are spread over the whole range.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Date64Type, Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type,
    UInt64Type, UInt8Type,
};
use arrow_array::{Array, ArrayRef, BooleanArray, RecordBatch};
use arrow_buffer::{BooleanBuffer, Buffer};
use arrow_schema::{DataType, Schema};
use datafusion::arrow::compute::cast;
use datafusion::common::{DataFusionError, Result as DfResult, ScalarValue};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool, MemoryReservation};
use datafusion::functions_aggregate::min_max::{MaxAccumulator, MinAccumulator};
use datafusion::logical_expr::ColumnarValue;
use datafusion::logical_expr::{Accumulator, Operator};
use datafusion::physical_expr::expressions::{lit, BinaryExpr, DynamicFilterPhysicalExpr};
use datafusion::physical_expr::{conjunction, conjunction_opt, PhysicalExpr};
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::ExecutionPlan;

/// Build rows of a single-key join whose keys the filter also lists: a probe row's
/// key is then looked up among them (q94's 135 orders out of web_sales' 720 K, whose
/// bounds span every order), beside the bounds. The keys are copied (128 KiB at
/// most, reserved from the query's pool), not held in the build batches' buffers,
/// which may spill.
const LISTED_KEYS_MOST_ROWS: usize = 1 << 14;

/// Minimum and maximum of each build key over the rows seen (nulls never match),
/// and for a single key, the keys themselves while they are few.
#[derive(Debug)]
pub(crate) struct KeyBounds {
    keys: Vec<Arc<dyn PhysicalExpr>>,
    /// Per key: `None` until a non-null key is seen.
    bounds: Vec<Option<(ScalarValue, ScalarValue)>>,
    /// The single key's non-null values seen, as `i64`s (`None`: more than
    /// [`LISTED_KEYS_MOST_ROWS`] rows, a value beyond `i64`, several keys, no room
    /// in the pool for them, or not listed as rows come).
    listed: Option<Vec<i64>>,
    /// The memory of `listed`, reserved before it grows (none once it is `None`).
    listed_reservation: MemoryReservation,
}

impl KeyBounds {
    /// Bounds over `keys`, which are also listed if there is one, the list's memory
    /// reserved from `pool`.
    fn new(keys: Vec<Arc<dyn PhysicalExpr>>, pool: &Arc<dyn MemoryPool>) -> Self {
        let bounds = vec![None; keys.len()];
        let listed = (keys.len() == 1).then(Vec::new);
        KeyBounds {
            keys,
            bounds,
            listed,
            listed_reservation: MemoryConsumer::new("hash join key list").register(pool),
        }
    }

    /// Takes in the keys of `batch` (a batch of the build side).
    pub(crate) fn add(&mut self, batch: &RecordBatch) -> DfResult<()> {
        for (key, bound) in self.keys.iter().zip(&mut self.bounds) {
            let values = key.evaluate(batch)?.into_array(batch.num_rows())?;
            if self.listed.is_some() {
                list_values(&mut self.listed, &mut self.listed_reservation, &values)?;
            }
            let (lo, hi) = min_max(&values)?;
            if lo.is_null() || hi.is_null() {
                continue;
            }
            *bound = Some(match bound.take() {
                None => (lo, hi),
                Some((a, b)) => (least(a, lo), greatest(b, hi)),
            });
        }
        Ok(())
    }

    /// Lists the single key of `held`: all the rows of a build side read with
    /// [`JoinKeyFilter::unlisted_bounds`] (whose bounds are these).
    pub(crate) fn list_held(&mut self, held: &[RecordBatch]) -> DfResult<()> {
        let [key] = self.keys.as_slice() else {
            return Ok(());
        };
        self.listed = Some(Vec::new());
        for batch in held {
            let values = key.evaluate(batch)?.into_array(batch.num_rows())?;
            list_values(&mut self.listed, &mut self.listed_reservation, &values)?;
            if self.listed.is_none() {
                break;
            }
        }
        Ok(())
    }

    fn merge(&mut self, mut other: KeyBounds) {
        // Their keys move into this list: their reservation is given back first, so
        // that they are not counted twice while this one grows for them.
        let theirs = other.listed.take();
        other.listed_reservation.free();
        list(
            &mut self.listed,
            &mut self.listed_reservation,
            theirs.map(|keys| (keys.len(), keys.into_iter())),
        );
        for (mine, theirs) in self.bounds.iter_mut().zip(other.bounds) {
            *mine = match (mine.take(), theirs) {
                (Some((a, b)), Some((c, d))) => Some((least(a, c), greatest(b, d))),
                (one, other) => one.or(other),
            };
        }
    }
}

/// Takes the non-null `values` into `listed` (see [`list`]); a value `i64` cannot
/// hold stops the listing.
fn list_values(
    listed: &mut Option<Vec<i64>>,
    reservation: &mut MemoryReservation,
    values: &ArrayRef,
) -> DfResult<()> {
    let ints = as_i64(values)?;
    let more = ints.as_ref().map(|ints| {
        let ints = ints.as_primitive::<Int64Type>();
        (ints.len() - ints.null_count(), ints.iter().flatten())
    });
    list(listed, reservation, more);
    Ok(())
}

/// `values` cast to `Int64`, or `None` when some value is beyond `i64` (the cast
/// makes it null).
fn as_i64(values: &ArrayRef) -> DfResult<Option<ArrayRef>> {
    let ints = cast(values, &DataType::Int64)?;
    Ok((ints.null_count() == values.null_count()).then_some(ints))
}

/// Takes the `count` keys `more` into `listed`, reserving their memory first; stops
/// listing (`listed` becomes `None`, its memory given back) when there are no keys
/// to take (`None`: some cannot be listed), they would pass
/// [`LISTED_KEYS_MOST_ROWS`], or the pool has no room for them.
fn list(
    listed: &mut Option<Vec<i64>>,
    reservation: &mut MemoryReservation,
    more: Option<(usize, impl Iterator<Item = i64>)>,
) {
    let taken = match (listed.as_mut(), more) {
        (Some(keys), Some((count, more))) if keys.len() + count <= LISTED_KEYS_MOST_ROWS => {
            let bytes = (keys.len() + count) * std::mem::size_of::<i64>();
            let grow = bytes.saturating_sub(reservation.size());
            let room = grow == 0 || reservation.try_grow(grow).is_ok();
            if room {
                keys.reserve_exact(count);
                keys.extend(more);
            }
            room
        }
        _ => false,
    };
    if !taken {
        *listed = None;
        reservation.free();
    }
}

/// The least and greatest non-null value of `values` (nulls if there is none).
pub(crate) fn min_max(values: &ArrayRef) -> DfResult<(ScalarValue, ScalarValue)> {
    let mut lo = MinAccumulator::try_new(values.data_type())?;
    let mut hi = MaxAccumulator::try_new(values.data_type())?;
    lo.update_batch(std::slice::from_ref(values))?;
    hi.update_batch(std::slice::from_ref(values))?;
    Ok((lo.evaluate()?, hi.evaluate()?))
}

pub(crate) fn least(a: ScalarValue, b: ScalarValue) -> ScalarValue {
    if b < a {
        b
    } else {
        a
    }
}

pub(crate) fn greatest(a: ScalarValue, b: ScalarValue) -> ScalarValue {
    if b > a {
        b
    } else {
        a
    }
}

/// The dynamic filter of one join and the bounds its partitions gather for it.
#[derive(Debug)]
pub(crate) struct JoinKeyFilter {
    filter: Arc<DynamicFilterPhysicalExpr>,
    build_keys: Vec<Arc<dyn PhysicalExpr>>,
    probe_keys: Vec<Arc<dyn PhysicalExpr>>,
    /// Whether the join runs repartitioned by key (see [`JoinKeyFilter::of`]).
    repartitioned: bool,
    /// The join's partitions, each of which reports once.
    ways: usize,
    gathering: Mutex<Gathering>,
}

#[derive(Debug, Default)]
struct Gathering {
    reported: usize,
    /// Bounds so far (`None` before the first report).
    bounds: Option<KeyBounds>,
    /// A partition read only part of its build side (roles swapped): nothing is
    /// published.
    incomplete: bool,
}

impl JoinKeyFilter {
    /// The dynamic filter DataFusion gave `join`, if it has one over keys whose
    /// bounds are cheap and exact to compare (integers and dates of one type on
    /// both sides); the join's partitions number `ways`. A single key is also listed
    /// when the join runs `repartitioned` by key: its probe rows are then hashed and
    /// copied into partitions before they are probed, which the scan spares the rows
    /// it drops. Where the join probes its probe side as it comes, a probe of a small
    /// build side costs about what the scan's test does (listing every such join made
    /// the 42 small TPC-DS queries at 25 MiB 4 % slower): its keys are listed only
    /// when they are sparse in their range (see [`SPARSE_KEYS_MOST_FRACTION`]).
    pub(crate) fn of(join: &HashJoinExec, ways: usize, repartitioned: bool) -> Option<Self> {
        let expr = join.dynamic_expressions_produced().into_iter().next()?;
        let any: Arc<dyn std::any::Any + Send + Sync> = expr;
        let filter = any.downcast::<DynamicFilterPhysicalExpr>().ok()?;
        let (left, right) = (join.left().schema(), join.right().schema());
        let comparable = |l: &Arc<dyn PhysicalExpr>, r: &Arc<dyn PhysicalExpr>| {
            let (Ok(lt), Ok(rt)) = (l.data_type(&left), r.data_type(&right)) else {
                return false;
            };
            lt == rt && bounded_type(&lt)
        };
        if !join.on().iter().all(|(l, r)| comparable(l, r)) {
            return None;
        }
        Some(JoinKeyFilter {
            filter,
            build_keys: join.on().iter().map(|(l, _)| l.clone()).collect(),
            probe_keys: join.on().iter().map(|(_, r)| r.clone()).collect(),
            repartitioned,
            ways: ways.max(1),
            gathering: Mutex::new(Gathering::default()),
        })
    }

    /// Empty bounds over the build keys, for one partition to fill (a listed key's
    /// memory reserved from `pool`).
    pub(crate) fn bounds(&self, pool: &Arc<dyn MemoryPool>) -> KeyBounds {
        KeyBounds::new(self.build_keys.clone(), pool)
    }

    /// Empty bounds over the build keys for a partition whose build rows may spill
    /// as they are read: its keys are not listed as they come (the copies would take
    /// memory the rows need: a build side of 10 K rows of two integer columns lists
    /// 80 KB of keys, half its size), but from the rows kept once it has read them
    /// all, if none spilled ([`KeyBounds::list_held`]).
    pub(crate) fn unlisted_bounds(&self, pool: &Arc<dyn MemoryPool>) -> KeyBounds {
        let mut bounds = self.bounds(pool);
        bounds.listed = None;
        bounds
    }

    /// Bounds of the rows of `batches`.
    pub(crate) fn bounds_of(
        &self,
        batches: &[RecordBatch],
        pool: &Arc<dyn MemoryPool>,
    ) -> DfResult<KeyBounds> {
        let mut bounds = self.bounds(pool);
        for b in batches {
            bounds.add(b)?;
        }
        Ok(bounds)
    }

    /// One partition has read its whole build side (`Some`), or will not
    /// (`None`). When the last partition reports, the probe keys' filter becomes
    /// `key >= min AND key <= max` for every key (`false` if no build row has a key),
    /// and for a single key of at most [`LISTED_KEYS_MOST_ROWS`] build rows also
    /// `key IN (the build keys)`, its bitmap reserved from `pool` (the bounds alone
    /// when the pool has no room for it).
    pub(crate) fn report(
        &self,
        bounds: Option<KeyBounds>,
        pool: &Arc<dyn MemoryPool>,
    ) -> DfResult<()> {
        let mut g = self
            .gathering
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match bounds {
            None => g.incomplete = true,
            Some(b) => match &mut g.bounds {
                None => g.bounds = Some(b),
                Some(so_far) => so_far.merge(b),
            },
        }
        g.reported += 1;
        if g.reported < self.ways {
            return Ok(());
        }
        // Every partition has reported: publish, and start over for another run.
        let done = std::mem::take(&mut *g);
        drop(g);
        if done.incomplete {
            return Ok(());
        }
        let Some(bounds) = done.bounds else {
            return Ok(());
        };
        let listed = match (&bounds.listed, self.probe_keys.as_slice()) {
            (Some(keys), [key]) => listed_keys(key, keys, !self.repartitioned)
                .and_then(|set| set.reserved(pool))
                .map(|set| set as Arc<dyn PhysicalExpr>),
            _ => None,
        };
        let ranges = self
            .probe_keys
            .iter()
            .zip(bounds.bounds)
            .map(|(key, bound)| {
                match bound {
                    // No build row has a key: no probe row can match.
                    None => lit(false),
                    Some((lo, hi)) => conjunction([
                        Arc::new(BinaryExpr::new(key.clone(), Operator::GtEq, lit(lo))) as _,
                        Arc::new(BinaryExpr::new(key.clone(), Operator::LtEq, lit(hi))) as _,
                    ]),
                }
            });
        if let Some(p) = conjunction_opt(ranges.chain(listed)) {
            self.filter.update(p)?;
            self.filter.mark_complete();
        }
        Ok(())
    }
}

/// The most bits of a [`KeySet`]: keys over a wider range share bits (a key's bit
/// is its offset from the least key modulo this), which passes a few keys that are
/// not among the build keys (at most [`LISTED_KEYS_MOST_ROWS`] keys in 2^20 bits: 1.6 %);
/// the join above drops them.
const KEY_SET_MOST_BITS: i64 = 1 << 20;

/// A join that probes its probe side as it comes (not repartitioned by key) has its
/// build keys listed only when they take at most this fraction of their range: then
/// the bounds pass far more probe rows than can match (q84's 210 customers'
/// demographics out of 1.9 M, spread over all of them: probing them was half the
/// query), while a scan testing each row of a dense set (a year of dates) would drop
/// nothing the bounds had not.
const SPARSE_KEYS_MOST_FRACTION: i64 = 16;

/// `key IN (keys)` as a [`KeySet`] (`None` for no keys); when `sparse_only`, only if
/// the keys are sparse in their range (see [`SPARSE_KEYS_MOST_FRACTION`]).
fn listed_keys(key: &Arc<dyn PhysicalExpr>, keys: &[i64], sparse_only: bool) -> Option<KeySet> {
    let (&lo, &hi) = (keys.iter().min()?, keys.iter().max()?);
    // At least 1: the keys' span may exceed i64 (then saturated).
    let span = hi.saturating_sub(lo).saturating_add(1);
    let set = KeySet::of(
        key.clone(),
        lo,
        hi,
        KEY_SET_MOST_BITS as u64,
        keys.iter().copied(),
    );
    let distinct = i64::try_from(set.distinct()).unwrap_or(i64::MAX);
    if sparse_only && distinct.saturating_mul(SPARSE_KEYS_MOST_FRACTION) > span {
        return None;
    }
    Some(set)
}

/// Whether an integer or date key is one of a set of build keys: a bitmap over
/// the set's range (folded, see [`KEY_SET_MOST_BITS`]), a bit test a row
/// (DataFusion's `IN` list hashes each value). Null keys give null.
#[derive(Debug)]
pub(crate) struct KeySet {
    key: Arc<dyn PhysicalExpr>,
    /// The least key: bit `(k - lo) & mask` is set for key `k`.
    lo: i64,
    /// The greatest key.
    hi: i64,
    mask: u64,
    bits: Arc<Vec<u64>>,
    /// The bitmap's memory, reserved from the query's pool (shared by the set's
    /// copies; given back when the last goes).
    reservation: Option<Arc<MemoryReservation>>,
}

impl Eq for KeySet {}

impl PartialEq for KeySet {
    fn eq(&self, other: &Self) -> bool {
        self.key.as_ref() == other.key.as_ref()
            && (self.lo, self.hi, self.mask) == (other.lo, other.hi, other.mask)
            && self.bits == other.bits
    }
}

impl std::hash::Hash for KeySet {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.key.hash(state);
        (self.lo, self.hi, self.mask).hash(state);
        self.bits.hash(state);
    }
}

impl KeySet {
    /// `key IN (keys)`, all of them within `lo..=hi`, over a bitmap of at most
    /// `most_bits` bits (keys over a wider range share bits), not reserved.
    fn of(
        key: Arc<dyn PhysicalExpr>,
        lo: i64,
        hi: i64,
        most_bits: u64,
        keys: impl Iterator<Item = i64>,
    ) -> Self {
        let width = Self::width(lo, hi, most_bits);
        let mut bits = vec![0u64; width.div_ceil(64) as usize];
        for k in keys {
            let at = (k.wrapping_sub(lo) as u64 & (width - 1)) as usize;
            bits[at / 64] |= 1 << (at % 64);
        }
        KeySet {
            key,
            lo,
            hi,
            mask: width - 1,
            bits: Arc::new(bits),
            reservation: None,
        }
    }

    /// The bits of a set of keys within `lo..=hi` and of at most `most_bits` bits.
    fn width(lo: i64, hi: i64, most_bits: u64) -> u64 {
        let span = hi.abs_diff(lo).saturating_add(1);
        span.min(most_bits).next_power_of_two()
    }

    /// How many bits are set: the distinct keys when none share a bit.
    fn distinct(&self) -> u64 {
        self.bits.iter().map(|w| u64::from(w.count_ones())).sum()
    }

    /// The set with its bitmap's memory reserved from `pool`; `None` when the pool
    /// has no room for it (the bounds are then published alone).
    fn reserved(mut self, pool: &Arc<dyn MemoryPool>) -> Option<Arc<Self>> {
        let reservation = MemoryConsumer::new("hash join key set").register(pool);
        reservation
            .try_grow(self.bits.len() * std::mem::size_of::<u64>())
            .ok()?;
        self.reservation = Some(Arc::new(reservation));
        Some(Arc::new(self))
    }

    /// `key IN (the non-null keys of values)` over exactly their range (no bits
    /// shared), its bitmap reserved from `pool`, and whether some key came more than
    /// once. `None` when there is no key, their range passes `most_bits`, a value
    /// is beyond `i64` or the pool has no room.
    pub(crate) fn exact(
        key: Arc<dyn PhysicalExpr>,
        values: &[ArrayRef],
        most_bits: u64,
        pool: &Arc<dyn MemoryPool>,
    ) -> DfResult<Option<(Arc<KeySet>, bool)>> {
        let mut ints = Vec::with_capacity(values.len());
        for v in values {
            let Some(cast) = as_i64(v)? else {
                return Ok(None);
            };
            ints.push(cast);
        }
        let keys = || {
            ints.iter()
                .flat_map(|a| a.as_primitive::<Int64Type>().iter().flatten())
        };
        let (Some(lo), Some(hi)) = (keys().min(), keys().max()) else {
            return Ok(None);
        };
        if hi.abs_diff(lo).saturating_add(1) > most_bits {
            return Ok(None);
        }
        // Reserved before it is built; within `most_bits`, no two keys share a bit.
        let reservation = MemoryConsumer::new("hash join key set").register(pool);
        let words = Self::width(lo, hi, most_bits).div_ceil(64) as usize;
        let bytes = words * std::mem::size_of::<u64>();
        if reservation.try_grow(bytes).is_err() {
            return Ok(None);
        }
        let mut set = KeySet::of(key, lo, hi, most_bits, keys());
        set.reservation = Some(Arc::new(reservation));
        let repeated = set.distinct() < keys().count() as u64;
        Ok(Some((Arc::new(set), repeated)))
    }

    fn contains(&self, k: i64) -> bool {
        // One unsigned comparison for both bounds; the bit of an offset past the
        // range is read but not kept (the mask keeps it inside the bitmap).
        let offset = k.wrapping_sub(self.lo) as u64;
        let in_range = offset <= self.hi.wrapping_sub(self.lo) as u64;
        let at = (offset & self.mask) as usize;
        let bit = self
            .bits
            .get(at / 64)
            .is_some_and(|word| word & (1 << (at % 64)) != 0);
        in_range & bit
    }

    /// Whether each row of `batch` has one of the keys (null for a null key).
    pub(crate) fn mask(&self, batch: &RecordBatch) -> DfResult<BooleanArray> {
        let keys = self.key.evaluate(batch)?.into_array(batch.num_rows())?;
        self.test(&keys)
    }

    /// The set's test over an integer or date array of keys.
    fn test(&self, keys: &ArrayRef) -> DfResult<BooleanArray> {
        macro_rules! over {
            ($t:ty) => {{
                let a = keys.as_primitive::<$t>();
                bits_where(a.values(), |v| {
                    i64::try_from(v).is_ok_and(|k| self.contains(k))
                })
            }};
        }
        let values = match keys.data_type() {
            DataType::Int8 => over!(Int8Type),
            DataType::Int16 => over!(Int16Type),
            DataType::Int32 => over!(Int32Type),
            DataType::Int64 => over!(Int64Type),
            DataType::UInt8 => over!(UInt8Type),
            DataType::UInt16 => over!(UInt16Type),
            DataType::UInt32 => over!(UInt32Type),
            DataType::UInt64 => over!(UInt64Type),
            DataType::Date32 => over!(Date32Type),
            DataType::Date64 => over!(Date64Type),
            other => {
                return Err(DataFusionError::Internal(format!(
                    "a key set over keys of type {other}"
                )))
            }
        };
        Ok(BooleanArray::new(values, keys.nulls().cloned()))
    }
}

impl fmt::Display for KeySet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keys: u32 = self.bits.iter().map(|w| w.count_ones()).sum();
        write!(f, "{} IN ({keys} build keys from {})", self.key, self.lo)
    }
}

impl PhysicalExpr for KeySet {
    fn data_type(&self, _input_schema: &Schema) -> DfResult<DataType> {
        Ok(DataType::Boolean)
    }

    fn nullable(&self, input_schema: &Schema) -> DfResult<bool> {
        self.key.nullable(input_schema)
    }

    fn evaluate(&self, batch: &RecordBatch) -> DfResult<ColumnarValue> {
        Ok(ColumnarValue::Array(Arc::new(self.mask(batch)?)))
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        vec![&self.key]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn PhysicalExpr>>,
    ) -> DfResult<Arc<dyn PhysicalExpr>> {
        let [key] = <[_; 1]>::try_from(children).map_err(|c| {
            DataFusionError::Internal(format!("a key set has one child, not {}", c.len()))
        })?;
        Ok(Arc::new(KeySet {
            key,
            lo: self.lo,
            hi: self.hi,
            mask: self.mask,
            bits: self.bits.clone(),
            reservation: self.reservation.clone(),
        }))
    }

    fn fmt_sql(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

pub(crate) fn bounded_type(t: &DataType) -> bool {
    t.is_integer() || matches!(t, DataType::Date32 | DataType::Date64)
}

/// Whether `keep` holds for each of `values`, built a word of 64 values at a time in
/// a loop of fixed length, which the compiler unrolls or vectorizes (arrow's
/// `collect_bool` calls its closure with each index: 9 % of q96's profile).
pub(crate) fn bits_where<T: Copy>(values: &[T], keep: impl Fn(T) -> bool) -> BooleanBuffer {
    let word = |rows: &[T]| {
        rows.iter()
            .enumerate()
            .fold(0u64, |word, (bit, &v)| word | u64::from(keep(v)) << bit)
    };
    let whole = values.chunks_exact(64);
    let rest = whole.remainder();
    let mut words: Vec<u64> = whole.map(word).collect();
    if !rest.is_empty() {
        words.push(word(rest));
    }
    BooleanBuffer::new(Buffer::from_vec(words), 0, values.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Int32Array, Int64Array, UInt64Array};
    use arrow_schema::Field;
    use datafusion::execution::memory_pool::UnboundedMemoryPool;
    use datafusion::physical_expr::expressions::col;

    fn one_key(data_type: DataType) -> (Arc<Schema>, Arc<dyn PhysicalExpr>) {
        let schema = Arc::new(Schema::new(vec![Field::new("k", data_type, true)]));
        let key = col("k", &schema).unwrap();
        (schema, key)
    }

    fn batch_of(schema: &Arc<Schema>, keys: ArrayRef) -> RecordBatch {
        RecordBatch::try_new(schema.clone(), vec![keys]).unwrap()
    }

    #[test]
    fn a_mask_built_a_word_at_a_time_keeps_each_value_as_the_test_does() {
        // Whole words, a partial last word, and an empty input.
        for len in [0usize, 1, 63, 64, 65, 200] {
            let values: Vec<i64> = (0..len as i64).map(|v| v * 7 % 11).collect();
            let mask = bits_where(&values, |v| v % 3 == 0);
            assert_eq!(mask.len(), len);
            let expected: Vec<bool> = values.iter().map(|v| v % 3 == 0).collect();
            assert_eq!(mask.iter().collect::<Vec<_>>(), expected, "{len} values");
        }
    }

    #[test]
    fn a_key_set_passes_exactly_the_build_keys_and_leaves_null_keys_null() {
        let (schema, key) = one_key(DataType::Int32);
        let set = listed_keys(&key, &[7, 1000, 7, -3], false).unwrap();
        let probe: ArrayRef = Arc::new(Int32Array::from(vec![
            Some(7),
            Some(8),
            None,
            Some(-3),
            Some(1000),
            Some(1001),
            Some(-4),
            Some(i32::MAX),
            Some(i32::MIN),
        ]));
        let got = set
            .evaluate(&batch_of(&schema, probe))
            .unwrap()
            .into_array(9)
            .unwrap();
        let want = BooleanArray::from(vec![
            Some(true),
            Some(false),
            None,
            Some(true),
            Some(true),
            Some(false),
            Some(false),
            Some(false),
            Some(false),
        ]);
        assert_eq!(got.as_boolean(), &want);
        assert_eq!(set.to_string(), "k@0 IN (3 build keys from -3)");
    }

    #[test]
    fn an_exact_key_set_tests_each_key_of_its_range_and_tells_repeated_keys() {
        let (schema, key) = one_key(DataType::Int64);
        let pool: Arc<dyn MemoryPool> = Arc::new(UnboundedMemoryPool::default());
        let build: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(vec![Some(5), None, Some(130)])),
            Arc::new(Int64Array::from(vec![Some(-2)])),
        ];
        let (set, repeated) = KeySet::exact(key.clone(), &build, 1 << 10, &pool)
            .unwrap()
            .unwrap();
        assert!(!repeated);
        // The bitmap (133 keys: 256 bits) is reserved while the set lives.
        assert_eq!(pool.reserved(), 32);
        let probe: ArrayRef = Arc::new(Int64Array::from(vec![
            Some(-2),
            Some(-1),
            Some(5),
            Some(6),
            None,
            Some(130),
            // Past the range by a multiple of the bitmap's width: not folded in.
            Some(5 + 256),
            Some(i64::MIN),
        ]));
        let got = set.mask(&batch_of(&schema, probe)).unwrap();
        let want = BooleanArray::from(vec![
            Some(true),
            Some(false),
            Some(true),
            Some(false),
            None,
            Some(true),
            Some(false),
            Some(false),
        ]);
        assert_eq!(got, want);
        drop(set);
        assert_eq!(pool.reserved(), 0);

        let twice: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(vec![3, 4])),
            Arc::new(Int64Array::from(vec![4])),
        ];
        let (_, repeated) = KeySet::exact(key.clone(), &twice, 1 << 10, &pool)
            .unwrap()
            .unwrap();
        assert!(repeated);
        // No keys, a range wider than allowed, a value beyond i64: no set.
        let none: Vec<ArrayRef> = vec![Arc::new(Int64Array::from(vec![None::<i64>]))];
        assert!(KeySet::exact(key.clone(), &none, 1 << 10, &pool)
            .unwrap()
            .is_none());
        let wide: Vec<ArrayRef> = vec![Arc::new(Int64Array::from(vec![0, 1 << 10]))];
        assert!(KeySet::exact(key.clone(), &wide, 1 << 10, &pool)
            .unwrap()
            .is_none());
        let huge: Vec<ArrayRef> = vec![Arc::new(UInt64Array::from(vec![1, u64::MAX]))];
        assert!(KeySet::exact(key, &huge, 1 << 10, &pool).unwrap().is_none());
    }

    #[test]
    fn keys_over_a_wide_range_share_bits_and_every_build_key_passes() {
        let (schema, key) = one_key(DataType::Int64);
        let wide = KEY_SET_MOST_BITS;
        let set = listed_keys(&key, &[0, wide, 3 * wide + 5], false).unwrap();
        let probe: ArrayRef = Arc::new(Int64Array::from(vec![
            0,
            wide,
            3 * wide + 5,
            // Folded onto a build key's bit: passed (the join drops it).
            2 * wide,
            1,
            wide + 1,
            -1,
            3 * wide + 6,
        ]));
        let got = set
            .evaluate(&batch_of(&schema, probe))
            .unwrap()
            .into_array(8)
            .unwrap();
        let want = BooleanArray::from(vec![true, true, true, true, false, false, false, false]);
        assert_eq!(got.as_boolean(), &want);
        // Keys spanning all of i64 are listed too, and pass.
        let all = listed_keys(&key, &[i64::MIN, i64::MAX], false).unwrap();
        let extremes: ArrayRef = Arc::new(Int64Array::from(vec![i64::MIN, i64::MAX]));
        let got = all
            .evaluate(&batch_of(&schema, extremes))
            .unwrap()
            .into_array(2)
            .unwrap();
        assert_eq!(got.as_boolean(), &BooleanArray::from(vec![true, true]));
        assert!(listed_keys(&key, &[], false).is_none());
    }

    #[test]
    fn a_key_sets_bitmap_is_reserved_while_a_copy_lives_and_needs_room() {
        use datafusion::execution::memory_pool::GreedyMemoryPool;
        let (schema, key) = one_key(DataType::Int64);
        // 2^20 bits: 128 KiB.
        let keys = [0, KEY_SET_MOST_BITS - 1];
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(1 << 20));
        let set = listed_keys(&key, &keys, false)
            .unwrap()
            .reserved(&pool)
            .unwrap();
        assert_eq!(pool.reserved(), 128 << 10);
        let copy = set
            .clone()
            .with_new_children(vec![col("k", &schema).unwrap()]);
        drop(set);
        assert_eq!(pool.reserved(), 128 << 10);
        drop(copy);
        assert_eq!(pool.reserved(), 0);
        // No room: not listed, nothing held.
        let small: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(64 << 10));
        assert!(listed_keys(&key, &keys, false)
            .unwrap()
            .reserved(&small)
            .is_none());
        assert_eq!(small.reserved(), 0);
    }

    #[test]
    fn dense_keys_are_not_listed_where_only_sparse_ones_are() {
        let (_, key) = one_key(DataType::Int64);
        let dense: Vec<i64> = (100..200).collect();
        assert!(listed_keys(&key, &dense, true).is_none());
        assert!(listed_keys(&key, &dense, false).is_some());
        // 2 keys over 32 values: exactly a sixteenth, sparse enough; 3 are not.
        assert!(listed_keys(&key, &[0, 31], true).is_some());
        assert!(listed_keys(&key, &[0, 15, 31], true).is_none());
        // Duplicates count once.
        assert!(listed_keys(&key, &[0, 0, 0, 31, 31], true).is_some());
    }

    #[test]
    fn build_keys_are_listed_for_one_key_while_they_are_few() {
        let pool: Arc<dyn MemoryPool> = Arc::new(UnboundedMemoryPool::default());
        let (schema, key) = one_key(DataType::Int64);
        let rows = |n: i64, from: i64| {
            batch_of(
                &schema,
                Arc::new(Int64Array::from_iter_values(from..from + n)),
            )
        };
        let mut few = KeyBounds::new(vec![key.clone()], &pool);
        few.add(&rows(10, 100)).unwrap();
        assert_eq!(few.listed.as_ref().map(Vec::len), Some(10));
        let mut at_cap = KeyBounds::new(vec![key.clone()], &pool);
        at_cap.add(&rows(LISTED_KEYS_MOST_ROWS as i64, 0)).unwrap();
        assert!(at_cap.listed.is_some());
        let mut small = KeyBounds::new(vec![key.clone()], &pool);
        small.add(&rows(5, 500)).unwrap();
        few.merge(small);
        assert_eq!(few.listed.as_ref().map(Vec::len), Some(15));
        // Over the cap, merged or added: bounds only, still over every row.
        few.merge(at_cap);
        assert!(few.listed.is_none());
        assert_eq!(
            few.bounds[0],
            Some((
                ScalarValue::Int64(Some(0)),
                ScalarValue::Int64(Some(LISTED_KEYS_MOST_ROWS as i64 - 1))
            ))
        );
        let mut over = KeyBounds::new(vec![key.clone()], &pool);
        over.add(&rows(LISTED_KEYS_MOST_ROWS as i64 + 1, 0))
            .unwrap();
        assert!(over.listed.is_none());
        // Null keys are not listed; a key beyond i64 stops the listing.
        let (nullable, key32) = one_key(DataType::Int32);
        let mut with_nulls = KeyBounds::new(vec![key32], &pool);
        let some_null: ArrayRef = Arc::new(Int32Array::from(vec![Some(7), None, Some(-3)]));
        with_nulls.add(&batch_of(&nullable, some_null)).unwrap();
        assert_eq!(with_nulls.listed, Some(vec![7, -3]));
        let (unsigned, key64) = one_key(DataType::UInt64);
        let mut huge = KeyBounds::new(vec![key64], &pool);
        let beyond: ArrayRef = Arc::new(UInt64Array::from(vec![1, u64::MAX]));
        huge.add(&batch_of(&unsigned, beyond)).unwrap();
        assert!(huge.listed.is_none());
        // Two keys: never listed.
        assert!(KeyBounds::new(vec![key.clone(), key], &pool)
            .listed
            .is_none());
    }

    #[test]
    fn a_build_side_that_may_spill_lists_its_keys_from_the_rows_held_after_reading() {
        let (schema, key) = one_key(DataType::Int64);
        let rows = |from: i64, n: i64| {
            batch_of(
                &schema,
                Arc::new(Int64Array::from_iter_values(from..from + n)),
            )
        };
        let pool: Arc<dyn MemoryPool> = Arc::new(UnboundedMemoryPool::default());
        let filter_keys = KeyBounds::new(vec![key.clone()], &pool);
        let mut bounds = KeyBounds {
            listed: None,
            ..filter_keys
        };
        let held = [rows(0, 100), rows(500, 50)];
        for b in &held {
            bounds.add(b).unwrap();
        }
        // Read as they came: bounds only, no copies held beside the rows.
        assert!(bounds.listed.is_none());
        assert_eq!(pool.reserved(), 0);
        bounds.list_held(&held).unwrap();
        let listed = bounds.listed.clone().unwrap();
        assert_eq!(listed.len(), 150);
        assert!(listed.contains(&0) && listed.contains(&549) && !listed.contains(&100));
        assert_eq!(pool.reserved(), 150 * 8);
        assert_eq!(
            bounds.bounds[0],
            Some((ScalarValue::Int64(Some(0)), ScalarValue::Int64(Some(549))))
        );
        drop(bounds);
        assert_eq!(pool.reserved(), 0);
    }

    #[test]
    fn listed_build_keys_are_reserved_and_given_back_or_not_listed_without_room() {
        use datafusion::execution::memory_pool::GreedyMemoryPool;
        let (schema, key) = one_key(DataType::Int64);
        let rows = |n: i64| batch_of(&schema, Arc::new(Int64Array::from_iter_values(0..n)));
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(1 << 20));
        let mut one = KeyBounds::new(vec![key.clone()], &pool);
        one.add(&rows(1000)).unwrap();
        assert_eq!(pool.reserved(), 8000);
        let mut other = KeyBounds::new(vec![key.clone()], &pool);
        other.add(&rows(500)).unwrap();
        assert_eq!(pool.reserved(), 12_000);
        // Merged, the other's keys are held once: by the list they joined.
        one.merge(other);
        assert_eq!(one.listed.as_ref().map(Vec::len), Some(1500));
        assert_eq!(pool.reserved(), 12_000);
        // Past the most rows the list goes, and its memory with it.
        one.add(&rows(LISTED_KEYS_MOST_ROWS as i64)).unwrap();
        assert!(one.listed.is_none());
        assert_eq!(pool.reserved(), 0);
        // A pool without room for the keys: bounds alone, nothing held.
        let small: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(4 << 10));
        let mut bounds = KeyBounds::new(vec![key], &small);
        bounds.add(&rows(1000)).unwrap();
        assert!(bounds.listed.is_none());
        assert_eq!(small.reserved(), 0);
        assert_eq!(
            bounds.bounds[0],
            Some((ScalarValue::Int64(Some(0)), ScalarValue::Int64(Some(999))))
        );
        drop(bounds);
        drop(one);
        assert_eq!(pool.reserved(), 0);
    }
}
