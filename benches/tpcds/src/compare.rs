//! Checking an answer against DuckDB's reference answer, value by value.

use polars::prelude::*;

use crate::error::{PolarsContext, TpcdsError};

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
    fn of(v: AnyValue<'_>) -> Value {
        match v {
            AnyValue::Null => Value::Null,
            AnyValue::Boolean(b) => Value::Bool(b),
            AnyValue::Int8(x) => Value::int(x.into()),
            AnyValue::Int16(x) => Value::int(x.into()),
            AnyValue::Int32(x) => Value::int(x.into()),
            AnyValue::Int64(x) => Value::int(x.into()),
            AnyValue::UInt8(x) => Value::int(x.into()),
            AnyValue::UInt16(x) => Value::int(x.into()),
            AnyValue::UInt32(x) => Value::int(x.into()),
            AnyValue::UInt64(x) => Value::int(x.into()),
            AnyValue::Float32(x) => Value::Float(x.into()),
            AnyValue::Float64(x) => Value::Float(x),
            AnyValue::Decimal(digits, _precision, scale) => Value::Exact {
                digits,
                scale: scale as u32,
            },
            AnyValue::Date(d) => Value::Date(d),
            AnyValue::String(s) => Value::Text(s.to_owned()),
            AnyValue::StringOwned(s) => Value::Text(s.to_string()),
            other => Value::Text(other.to_string()),
        }
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

fn rows_of(df: &DataFrame) -> Result<Vec<Vec<Value>>, TpcdsError> {
    let mut rows = vec![Vec::with_capacity(df.width()); df.height()];
    for c in df.columns() {
        for (i, row) in rows.iter_mut().enumerate() {
            row.push(Value::of(c.get(i).context("reading a value")?));
        }
    }
    Ok(rows)
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
    result: &DataFrame,
    reference: &DataFrame,
    ordered: bool,
) -> Result<(), TpcdsError> {
    if result.width() != reference.width() {
        return Err(TpcdsError::Mismatch(format!(
            "{} columns {:?}, reference has {} {:?}",
            result.width(),
            result.get_column_names(),
            reference.width(),
            reference.get_column_names()
        )));
    }
    if result.height() != reference.height() {
        return Err(TpcdsError::Mismatch(format!(
            "{} rows, reference has {}",
            result.height(),
            reference.height()
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
                    reference.get_column_names()[k].as_str()
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_compare_across_types() {
        let ours = df!("a" => [1i32, 2], "s" => [1.5f64, 2.25]).unwrap();
        let theirs = df!("x" => [1i64, 2], "y" => [1.5f64, 2.25]).unwrap();
        compare_values(&ours, &theirs, true).unwrap();
        let off = df!("x" => [1i64, 2], "y" => [1.5f64, 2.26]).unwrap();
        let err = compare_values(&ours, &off, true).unwrap_err();
        assert!(err.to_string().contains("row 1, column 1"), "{err}");
        // Order matters only when ordered.
        let swapped = df!("x" => [2i64, 1], "y" => [2.25f64, 1.5]).unwrap();
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
}
