//! Checking an answer against DuckDB's reference answer, value by value.

use datafusion::arrow::array::{Array, RecordBatch};
use datafusion::common::ScalarValue;

use crate::error::TpcdsError;

/// One value of an answer, normalized so that two engines' answers compare by value:
/// integers of any width and decimals compare exactly (decimals at the larger scale),
/// a float against a float or a decimal within rounding.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Null,
    Bool(bool),
    /// An exact number: `digits × 10^-scale`.
    Exact {
        digits: i128,
        scale: u32,
    },
    Float(f64),
    Text(String),
    Date(i32),
}

impl Value {
    /// Row `row` of `array`.
    fn of(array: &dyn Array, row: usize) -> Result<Value, TpcdsError> {
        let v = ScalarValue::try_from_array(array, row).map_err(|e| {
            TpcdsError::Mismatch(format!(
                "reading a value of type {}: {e}",
                array.data_type()
            ))
        })?;
        if v.is_null() {
            return Ok(Value::Null);
        }
        let decimal = |digits: i128, scale: i8| {
            if scale >= 0 {
                Some(Value::Exact {
                    digits,
                    scale: scale.unsigned_abs().into(),
                })
            } else {
                10i128
                    .checked_pow(scale.unsigned_abs().into())
                    .and_then(|m| digits.checked_mul(m))
                    .map(Value::int)
            }
        };
        let exact = match &v {
            ScalarValue::Boolean(Some(b)) => Some(Value::Bool(*b)),
            ScalarValue::Int8(Some(x)) => Some(Value::int((*x).into())),
            ScalarValue::Int16(Some(x)) => Some(Value::int((*x).into())),
            ScalarValue::Int32(Some(x)) => Some(Value::int((*x).into())),
            ScalarValue::Int64(Some(x)) => Some(Value::int((*x).into())),
            ScalarValue::UInt8(Some(x)) => Some(Value::int((*x).into())),
            ScalarValue::UInt16(Some(x)) => Some(Value::int((*x).into())),
            ScalarValue::UInt32(Some(x)) => Some(Value::int((*x).into())),
            ScalarValue::UInt64(Some(x)) => Some(Value::int((*x).into())),
            ScalarValue::Float32(Some(x)) => Some(Value::Float((*x).into())),
            ScalarValue::Float64(Some(x)) => Some(Value::Float(*x)),
            ScalarValue::Decimal32(Some(d), _, s) => decimal((*d).into(), *s),
            ScalarValue::Decimal64(Some(d), _, s) => decimal((*d).into(), *s),
            ScalarValue::Decimal128(Some(d), _, s) => decimal(*d, *s),
            ScalarValue::Decimal256(Some(d), _, s) => d.to_i128().and_then(|d| decimal(d, *s)),
            ScalarValue::Date32(Some(d)) => Some(Value::Date(*d)),
            ScalarValue::Utf8(Some(t))
            | ScalarValue::Utf8View(Some(t))
            | ScalarValue::LargeUtf8(Some(t)) => Some(Value::Text(t.clone())),
            _ => None,
        };
        Ok(exact.unwrap_or_else(|| Value::Text(v.to_string())))
    }

    fn int(x: i128) -> Value {
        Value::Exact {
            digits: x,
            scale: 0,
        }
    }

    fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Float(x) => Some(*x),
            Value::Exact { digits, scale } => Some(*digits as f64 / 10f64.powi(*scale as i32)),
            _ => None,
        }
    }

    /// Equal as values: exact numbers exactly; a float within a relative 1e-9, or,
    /// against a decimal of scale `s`, within one unit of its last digit (an engine
    /// that averages decimals as decimals truncates where another gives a double).
    fn matches(&self, other: &Value) -> bool {
        match (self, other) {
            (
                Value::Exact {
                    digits: a,
                    scale: sa,
                },
                Value::Exact {
                    digits: b,
                    scale: sb,
                },
            ) => {
                let s = (*sa).max(*sb);
                let up = |d: i128, from: u32| {
                    10i128.checked_pow(s - from).and_then(|m| d.checked_mul(m))
                };
                up(*a, *sa) == up(*b, *sb)
            }
            (Value::Float(_), Value::Exact { .. })
            | (Value::Exact { .. }, Value::Float(_))
            | (Value::Float(_), Value::Float(_)) => {
                let (Some(a), Some(b)) = (self.as_f64(), other.as_f64()) else {
                    return false;
                };
                if a == b {
                    return true;
                }
                let rel = 1e-9 * a.abs().max(b.abs());
                let unit = match (self, other) {
                    (Value::Exact { scale, .. }, _) | (_, Value::Exact { scale, .. }) => {
                        10f64.powi(-(*scale as i32))
                    }
                    _ => 0.0,
                };
                (a - b).abs() <= rel.max(unit) + 1e-12
            }
            (a, b) => a == b,
        }
    }

    /// A key to sort rows by for an unordered comparison; numbers are rounded so
    /// that values equal within [`Value::matches`] sort alike.
    fn sort_key(&self) -> String {
        match self {
            Value::Null => "\u{0}".into(),
            Value::Bool(b) => format!("b{b}"),
            Value::Text(t) => format!("t{t}"),
            Value::Date(d) => format!("d{d:012}"),
            v => match v.as_f64() {
                Some(x) => format!("n{:+.6e}", x),
                None => String::new(),
            },
        }
    }
}

fn rows_of(batch: &RecordBatch) -> Result<Vec<Vec<Value>>, TpcdsError> {
    let mut rows = vec![Vec::with_capacity(batch.num_columns()); batch.num_rows()];
    for c in batch.columns() {
        for (i, row) in rows.iter_mut().enumerate() {
            row.push(Value::of(c.as_ref(), i)?);
        }
    }
    Ok(rows)
}

fn names(batch: &RecordBatch) -> Vec<String> {
    batch
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect()
}

/// Checks that an engine's `result` equals DuckDB's `reference` by value: the same
/// number of columns and rows, the same values row by row (in the same order when
/// `ordered`, as multisets otherwise). Column names and types may differ between
/// engines (DuckDB sums decimals as `DECIMAL(38, s)`, DataFusion as `DECIMAL(p+10,
/// s)`; DuckDB averages as `DOUBLE`, DataFusion decimals as decimals), so values are
/// compared as numbers: integers and decimals exactly, floats within rounding.
///
/// # Errors
/// [`TpcdsError::Mismatch`] describing the first difference.
pub fn compare_values(
    result: &RecordBatch,
    reference: &RecordBatch,
    ordered: bool,
) -> Result<(), TpcdsError> {
    if result.num_columns() != reference.num_columns() {
        return Err(TpcdsError::Mismatch(format!(
            "{} columns {:?}, reference has {} {:?}",
            result.num_columns(),
            names(result),
            reference.num_columns(),
            names(reference)
        )));
    }
    if result.num_rows() != reference.num_rows() {
        return Err(TpcdsError::Mismatch(format!(
            "{} rows, reference has {}",
            result.num_rows(),
            reference.num_rows()
        )));
    }
    let mut got = rows_of(result)?;
    let mut want = rows_of(reference)?;
    if !ordered {
        let key = |r: &Vec<Value>| r.iter().map(Value::sort_key).collect::<Vec<_>>();
        got.sort_by_cached_key(key);
        want.sort_by_cached_key(key);
    }
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        for (k, (a, b)) in g.iter().zip(w).enumerate() {
            if !a.matches(b) {
                return Err(TpcdsError::Mismatch(format!(
                    "row {i}{}, column {k} ({:?}): {a:?}, reference has {b:?}",
                    if ordered { "" } else { " (rows sorted)" },
                    reference.schema().field(k).name()
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{
        ArrayRef, Date32Array, Decimal128Array, Float64Array, Int32Array, Int64Array, StringArray,
        StringViewArray,
    };

    use super::*;

    fn batch(columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
        RecordBatch::try_from_iter(columns).unwrap()
    }

    fn ints(name: &str, v: [i64; 2]) -> (&str, ArrayRef) {
        (name, Arc::new(Int64Array::from(v.to_vec())))
    }

    fn floats(name: &str, v: [f64; 2]) -> (&str, ArrayRef) {
        (name, Arc::new(Float64Array::from(v.to_vec())))
    }

    #[test]
    fn values_compare_across_types() {
        let ours = batch(vec![
            ("a", Arc::new(Int32Array::from(vec![1, 2]))),
            floats("s", [1.5, 2.25]),
        ]);
        let theirs = batch(vec![ints("x", [1, 2]), floats("y", [1.5, 2.25])]);
        compare_values(&ours, &theirs, true).unwrap();
        let off = batch(vec![ints("x", [1, 2]), floats("y", [1.5, 2.26])]);
        let err = compare_values(&ours, &off, true).unwrap_err();
        assert!(err.to_string().contains("row 1, column 1"), "{err}");
        // Order matters only when ordered.
        let swapped = batch(vec![ints("x", [2, 1]), floats("y", [2.25, 1.5])]);
        compare_values(&ours, &swapped, false).unwrap();
        assert!(compare_values(&ours, &swapped, true).is_err());
    }

    #[test]
    fn decimals_compare_exactly_and_floats_within_their_last_digit() {
        let a = Value::Exact {
            digits: 1234,
            scale: 2,
        };
        assert!(a.matches(&Value::Exact {
            digits: 123400,
            scale: 4
        }));
        assert!(!a.matches(&Value::Exact {
            digits: 123401,
            scale: 4
        }));
        assert!(a.matches(&Value::Float(12.34)));
        assert!(a.matches(&Value::Float(12.344)));
        assert!(a.matches(&Value::Float(12.3499)));
        assert!(!a.matches(&Value::Float(12.36)));
        assert!(Value::Float(1.0).matches(&Value::Float(1.0 + 1e-12)));
        assert!(!Value::Float(1.0).matches(&Value::Float(1.001)));
        assert!(!Value::Null.matches(&Value::int(0)));
        assert!(Value::Null.matches(&Value::Null));
    }

    #[test]
    fn arrow_values_read_as_values() {
        let decimals: ArrayRef = Arc::new(
            Decimal128Array::from(vec![Some(1234), None])
                .with_precision_and_scale(7, 2)
                .unwrap(),
        );
        let views: ArrayRef = Arc::new(StringViewArray::from(vec![
            Some("a long string here"),
            None,
        ]));
        let strings: ArrayRef = Arc::new(StringArray::from(vec!["x", "y"]));
        let dates: ArrayRef = Arc::new(Date32Array::from(vec![10957, 0]));
        assert_eq!(
            Value::of(decimals.as_ref(), 0).unwrap(),
            Value::Exact {
                digits: 1234,
                scale: 2
            }
        );
        assert_eq!(Value::of(decimals.as_ref(), 1).unwrap(), Value::Null);
        assert_eq!(
            Value::of(views.as_ref(), 0).unwrap(),
            Value::Text("a long string here".into())
        );
        assert_eq!(Value::of(views.as_ref(), 1).unwrap(), Value::Null);
        assert_eq!(
            Value::of(strings.as_ref(), 1).unwrap(),
            Value::Text("y".into())
        );
        assert_eq!(Value::of(dates.as_ref(), 0).unwrap(), Value::Date(10957));
        // A string column and a string-view column of the same values are equal.
        let a = batch(vec![("s", strings.clone())]);
        let b = batch(vec![(
            "t",
            Arc::new(StringViewArray::from(vec!["x", "y"])) as ArrayRef,
        )]);
        compare_values(&a, &b, true).unwrap();
    }
}
