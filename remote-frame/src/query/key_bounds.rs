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
//! have read theirs.

use std::sync::{Arc, Mutex, PoisonError};

use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::DataType;
use datafusion::common::{Result as DfResult, ScalarValue};
use datafusion::functions_aggregate::min_max::{MaxAccumulator, MinAccumulator};
use datafusion::logical_expr::{Accumulator, Operator};
use datafusion::physical_expr::expressions::{lit, BinaryExpr, DynamicFilterPhysicalExpr};
use datafusion::physical_expr::{conjunction, conjunction_opt, PhysicalExpr};
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::ExecutionPlan;

/// Minimum and maximum of each build key over the rows seen (nulls never match).
#[derive(Debug)]
pub(crate) struct KeyBounds {
    keys: Vec<Arc<dyn PhysicalExpr>>,
    /// Per key: `None` until a non-null key is seen.
    bounds: Vec<Option<(ScalarValue, ScalarValue)>>,
}

impl KeyBounds {
    fn new(keys: Vec<Arc<dyn PhysicalExpr>>) -> Self {
        let bounds = vec![None; keys.len()];
        KeyBounds { keys, bounds }
    }

    /// Takes in the keys of `batch` (a batch of the build side).
    pub(crate) fn add(&mut self, batch: &RecordBatch) -> DfResult<()> {
        for (key, bound) in self.keys.iter().zip(&mut self.bounds) {
            let values = key.evaluate(batch)?.into_array(batch.num_rows())?;
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

    fn merge(&mut self, other: KeyBounds) {
        for (mine, theirs) in self.bounds.iter_mut().zip(other.bounds) {
            *mine = match (mine.take(), theirs) {
                (Some((a, b)), Some((c, d))) => Some((least(a, c), greatest(b, d))),
                (one, other) => one.or(other),
            };
        }
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
    /// both sides); the join's partitions number `ways`.
    pub(crate) fn of(join: &HashJoinExec, ways: usize) -> Option<Self> {
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
            ways: ways.max(1),
            gathering: Mutex::new(Gathering::default()),
        })
    }

    /// Empty bounds over the build keys, for one partition to fill.
    pub(crate) fn bounds(&self) -> KeyBounds {
        KeyBounds::new(self.build_keys.clone())
    }

    /// Bounds of the rows of `batches`.
    pub(crate) fn bounds_of(&self, batches: &[RecordBatch]) -> DfResult<KeyBounds> {
        let mut bounds = self.bounds();
        for b in batches {
            bounds.add(b)?;
        }
        Ok(bounds)
    }

    /// One partition has read its whole build side (`Some`), or will not
    /// (`None`). When the last partition reports, the probe keys' filter becomes
    /// `key >= min AND key <= max` for every key (`false` if no build row has a key).
    pub(crate) fn report(&self, bounds: Option<KeyBounds>) -> DfResult<()> {
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
        if let Some(p) = conjunction_opt(ranges) {
            self.filter.update(p)?;
            self.filter.mark_complete();
        }
        Ok(())
    }
}

fn bounded_type(t: &DataType) -> bool {
    t.is_integer() || matches!(t, DataType::Date32 | DataType::Date64)
}
