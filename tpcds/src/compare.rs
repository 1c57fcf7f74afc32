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

fn sort_all(df: &DataFrame) -> Result<DataFrame, TpcdsError> {
    let by: Vec<PlSmallStr> = df.get_column_names_owned();
    df.sort(by, SortMultipleOptions::default().with_nulls_last(true))
        .context("sorting for an unordered comparison")
}

#[cfg(test)]
mod tests {
    use super::*;

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
