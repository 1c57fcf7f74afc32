//! Checking a pipeline's result against DuckDB's reference answer.

use polars::prelude::*;

use crate::error::{PolarsContext, TpcdsError};
use crate::pipeline::RowOrder;

/// Checks that `result` equals `reference` exactly: the same column names in the same
/// order, the same types, the same rows (in the same order when `order` is
/// [`RowOrder::Ordered`], as multisets otherwise), NULLs equal to NULLs.
///
/// Types are compared as they are: the pipelines cast their outputs to the types DuckDB
/// gives (`BIGINT` for counts, `DECIMAL(38, s)` for sums of decimals, `VARCHAR` →
/// Polars `String`), so no conversion happens here.
///
/// # Errors
/// [`TpcdsError::Mismatch`] describing the first difference found.
pub fn compare(
    result: &DataFrame,
    reference: &DataFrame,
    order: RowOrder,
) -> Result<(), TpcdsError> {
    let names = |df: &DataFrame| -> Vec<String> {
        df.get_column_names()
            .into_iter()
            .map(|n| n.to_string())
            .collect()
    };
    if names(result) != names(reference) {
        return Err(TpcdsError::Mismatch(format!(
            "columns {:?}, reference has {:?}",
            names(result),
            names(reference)
        )));
    }
    for (r, e) in result.columns().iter().zip(reference.columns()) {
        if r.dtype() != e.dtype() {
            return Err(TpcdsError::Mismatch(format!(
                "column {:?} has type {}, reference has {}",
                r.name().as_str(),
                r.dtype(),
                e.dtype()
            )));
        }
    }
    if result.height() != reference.height() {
        return Err(TpcdsError::Mismatch(format!(
            "{} rows, reference has {}",
            result.height(),
            reference.height()
        )));
    }
    let (result, reference) = match order {
        RowOrder::Ordered => (result.clone(), reference.clone()),
        RowOrder::Unordered => (sort_all(result)?, sort_all(reference)?),
    };
    if result.equals_missing(&reference) {
        return Ok(());
    }
    for row in 0..result.height() {
        for (r, e) in result.columns().iter().zip(reference.columns()) {
            let got = r.get(row).context("reading a result value")?;
            let want = e.get(row).context("reading a reference value")?;
            if got != want {
                return Err(TpcdsError::Mismatch(format!(
                    "row {row}, column {:?}: {got}, reference has {want}",
                    r.name().as_str()
                )));
            }
        }
    }
    Err(TpcdsError::Mismatch(
        "frames differ but no differing value was found".into(),
    ))
}

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

fn sort_all(df: &DataFrame) -> Result<DataFrame, TpcdsError> {
    let by: Vec<PlSmallStr> = df.get_column_names_owned();
    df.sort(by, SortMultipleOptions::default().with_nulls_last(true))
        .context("sorting for an unordered comparison")
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

    fn frame(ids: &[Option<&str>], counts: &[i64]) -> DataFrame {
        df!("id" => ids, "n" => counts).unwrap()
    }

    #[test]
    fn equal_frames_compare_equal() {
        let a = frame(&[Some("a"), None], &[1, 2]);
        compare(&a, &a.clone(), RowOrder::Ordered).unwrap();
    }

    #[test]
    fn order_matters_only_when_ordered() {
        let a = frame(&[Some("a"), Some("b")], &[1, 2]);
        let b = frame(&[Some("b"), Some("a")], &[2, 1]);
        compare(&a, &b, RowOrder::Unordered).unwrap();
        let err = compare(&a, &b, RowOrder::Ordered).unwrap_err();
        assert!(err.to_string().contains("row 0"), "{err}");
    }

    #[test]
    fn differences_are_reported() {
        let a = frame(&[Some("a"), Some("b")], &[1, 2]);
        let fewer = frame(&[Some("a")], &[1]);
        assert!(compare(&a, &fewer, RowOrder::Ordered)
            .unwrap_err()
            .to_string()
            .contains("2 rows, reference has 1"));
        let null = frame(&[Some("a"), None], &[1, 2]);
        let err = compare(&a, &null, RowOrder::Ordered).unwrap_err();
        assert!(err.to_string().contains("row 1, column \"id\""), "{err}");
        let renamed = df!("id" => &["a", "b"], "m" => &[1i64, 2]).unwrap();
        assert!(compare(&a, &renamed, RowOrder::Ordered).is_err());
        let retyped = df!("id" => &["a", "b"], "n" => &[1i32, 2]).unwrap();
        let err = compare(&a, &retyped, RowOrder::Ordered).unwrap_err();
        assert!(err.to_string().contains("type"), "{err}");
    }
}
