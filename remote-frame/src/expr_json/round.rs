//! Polars' `round(decimals)` (half to even) as a DataFusion scalar function.
//!
//! DataFusion's own `round` rounds half away from zero and returns `Float64` for
//! every input; Polars rounds half to even and keeps the input type. This function
//! copies Polars' algorithm (`polars-ops`, `RoundSeries::round` with
//! `RoundMode::HalfToEven`):
//!
//! - `Float64`: `round_ties_even(x * 10^d) / 10^d`, or `x` when that is not finite;
//! - `Float32`: the same computed in `f64`, then narrowed;
//! - `Decimal128(p, s)`: the unscaled integer rounded half to even at `s - d` digits,
//!   type kept (unchanged when `d >= s`);
//! - integers and `Null`: unchanged;
//! - anything else: a planning error, as Polars ("round can only be used on numeric
//!   types").

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray};
use datafusion::arrow::datatypes::{DataType, Decimal128Type, Float32Type, Float64Type};
use datafusion::common::{exec_err, plan_err, Result, ScalarValue};
use datafusion::logical_expr::{
    ColumnarValue, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::prelude::lit;

/// `polars_round(x, decimals)`: Polars' round half to even (module docs).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct PolarsRound {
    signature: Signature,
}

impl Default for PolarsRound {
    fn default() -> Self {
        Self {
            signature: Signature::any(2, Volatility::Immutable),
        }
    }
}

/// `polars_round(e, decimals)` as an expression.
pub fn round_half_to_even(e: Expr, decimals: u32) -> Expr {
    ScalarUDF::new_from_impl(PolarsRound::default()).call(vec![e, lit(i64::from(decimals))])
}

impl ScalarUDFImpl for PolarsRound {
    fn name(&self) -> &str {
        "polars_round"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        match arg_types.first() {
            Some(
                t @ (DataType::Float32
                | DataType::Float64
                | DataType::Decimal128(_, _)
                | DataType::Null),
            ) => Ok(t.clone()),
            Some(t) if t.is_integer() => Ok(t.clone()),
            Some(t) => plan_err!("round can only be used on numeric types, not {t}"),
            None => plan_err!("polars_round takes two arguments"),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let [x, d] = args.args.as_slice() else {
            return exec_err!("polars_round takes two arguments");
        };
        let decimals = match d {
            ColumnarValue::Scalar(ScalarValue::Int64(Some(d))) => u32::try_from(*d).ok(),
            _ => None,
        };
        let Some(decimals) = decimals else {
            return exec_err!("polars_round: decimals must be a non-negative Int64 constant");
        };
        let array = x.to_array(args.number_rows)?;
        Ok(ColumnarValue::Array(round_array(&array, decimals)?))
    }
}

/// Rounds every value of `array` (module docs).
fn round_array(array: &ArrayRef, decimals: u32) -> Result<ArrayRef> {
    Ok(match array.data_type() {
        DataType::Float64 => {
            let a = array.as_primitive::<Float64Type>();
            Arc::new(a.unary::<_, Float64Type>(|v| round_f64(v, decimals)))
        }
        DataType::Float32 => {
            let a = array.as_primitive::<Float32Type>();
            Arc::new(a.unary::<_, Float32Type>(|v| round_f32(v, decimals)))
        }
        DataType::Decimal128(p, s) => {
            let a = array.as_primitive::<Decimal128Type>();
            let (p, s) = (*p, *s);
            match u32::try_from(s) {
                Ok(scale) if scale > decimals => {
                    let multiplier = 10i128.pow(scale - decimals);
                    Arc::new(
                        a.unary::<_, Decimal128Type>(|v| round_decimal(v, multiplier))
                            .with_precision_and_scale(p, s)?,
                    )
                }
                _ => Arc::clone(array),
            }
        }
        t if t.is_integer() || t == &DataType::Null => Arc::clone(array),
        t => return exec_err!("round can only be used on numeric types, not {t}"),
    })
}

fn round_f64(v: f64, decimals: u32) -> f64 {
    if decimals == 0 {
        return v.round_ties_even();
    }
    if decimals >= 326 {
        return v;
    }
    let ret = if decimals >= 300 {
        // As Polars: 10^d is not representable, split it into 2^d and 5^d.
        let d = decimals as i32;
        let mul2 = 2.0f64.powi(d);
        let mul5 = 5.0f64.powi(d);
        (v * mul2 * mul5).round_ties_even() / mul5 / mul2
    } else {
        let m = 10.0f64.powi(decimals as i32);
        (v * m).round_ties_even() / m
    };
    if ret.is_finite() {
        ret
    } else {
        v
    }
}

fn round_f32(v: f32, decimals: u32) -> f32 {
    if decimals == 0 {
        return v.round_ties_even();
    }
    if decimals >= 47 {
        return v;
    }
    let m = 10.0f64.powi(decimals as i32);
    #[allow(clippy::cast_possible_truncation)]
    let ret = ((f64::from(v) * m).round_ties_even() / m) as f32;
    if ret.is_finite() {
        ret
    } else {
        v
    }
}

/// Rounds the unscaled `v` half to even at a multiple of `multiplier` (Polars' code).
fn round_decimal(v: i128, multiplier: i128) -> i128 {
    let threshold = multiplier / 2;
    let rem_big = v % (2 * multiplier);
    let is_v_floor_even = rem_big.abs() < multiplier;
    let rem = if is_v_floor_even {
        rem_big
    } else if rem_big > 0 {
        rem_big - multiplier
    } else {
        rem_big + multiplier
    };
    let threshold = threshold + i128::from(is_v_floor_even);
    let round_offset = if rem.abs() >= threshold {
        if v < 0 {
            -multiplier
        } else {
            multiplier
        }
    } else {
        0
    };
    v - rem + round_offset
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_half_to_even() {
        let r0: Vec<f64> = [0.5, 1.5, 2.5, -0.5, -1.5]
            .iter()
            .map(|v| round_f64(*v, 0))
            .collect();
        assert_eq!(r0, [0.0, 2.0, 2.0, -0.0, -2.0]);
        assert_eq!(round_f64(1.25, 1), 1.2);
        assert_eq!(round_f64(2.675, 2), 2.68);
        assert_eq!(round_f64(f64::MAX, 5), f64::MAX);
        assert_eq!(round_f32(2.5, 0), 2.0);
        assert_eq!(round_f32(1.25, 1), 1.2);
    }

    #[test]
    fn decimals_half_to_even() {
        // Scale 2 rounded to 1 decimal: multiplier 10.
        let r: Vec<i128> = [125, 135, -125, -135, 124, 126, 270]
            .iter()
            .map(|v| round_decimal(*v, 10))
            .collect();
        assert_eq!(r, [120, 140, -120, -140, 120, 130, 270]);
    }
}
