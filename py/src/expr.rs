//! Expressions from Python: `scad.frame` builds a small JSON tree (`col`, `lit`,
//! comparisons, boolean logic, arithmetic, `is_in`, `is_between`, `is_null`, `cast`,
//! `when/then/otherwise`, aggregations, `alias`) and this module turns it into a Polars
//! [`Expr`].
//!
//! Why not Polars' own serialized expressions: the Python `polars` package and the
//! Rust `polars` crate are released separately and their expression serialization is
//! not stable across versions, so a wheel built against one would break on the next
//! Python release. The tree here is ours and versioned with the wheel.
//!
//! Numbers and strings become Polars "dynamic" literals, so `col("x") + 1` keeps the
//! type of `x` exactly as in Python Polars.

use polars::prelude::{
    col, lit, when, ClosedInterval, DataType, Expr, LiteralValue, NamedFrom, PlSmallStr, RoundMode,
    Scalar, Series, NULL,
};
use polars_plan::plans::DynLiteralValue;
use serde_json::Value;

/// A malformed expression tree (the message says where).
#[derive(Debug, thiserror::Error)]
#[error("invalid expression: {0}")]
pub struct ExprError(pub String);

type Result<T> = std::result::Result<T, ExprError>;

fn bad<T>(msg: impl Into<String>) -> Result<T> {
    Err(ExprError(msg.into()))
}

/// Parses one expression from its JSON text.
///
/// # Errors
/// [`ExprError`] for malformed JSON or an unknown node.
pub fn from_json(text: &str) -> Result<Expr> {
    let v: Value = serde_json::from_str(text).map_err(|e| ExprError(format!("not JSON: {e}")))?;
    to_expr(&v)
}

/// Parses a JSON list of expressions.
///
/// # Errors
/// As [`from_json`]; the top level must be a list.
pub fn list_from_json(text: &str) -> Result<Vec<Expr>> {
    let v: Value = serde_json::from_str(text).map_err(|e| ExprError(format!("not JSON: {e}")))?;
    let Value::Array(items) = v else {
        return bad("expected a list of expressions");
    };
    items.iter().map(to_expr).collect()
}

fn field<'a>(node: &'a serde_json::Map<String, Value>, key: &str, kind: &str) -> Result<&'a Value> {
    node.get(key)
        .ok_or_else(|| ExprError(format!("{kind} node lacks {key:?}")))
}

fn str_field<'a>(
    node: &'a serde_json::Map<String, Value>,
    key: &str,
    kind: &str,
) -> Result<&'a str> {
    field(node, key, kind)?
        .as_str()
        .ok_or_else(|| ExprError(format!("{kind} node: {key:?} must be a string")))
}

fn sub(node: &serde_json::Map<String, Value>, key: &str, kind: &str) -> Result<Expr> {
    to_expr(field(node, key, kind)?)
}

/// A Polars data type from its name: `bool`, `int8`..`int64`, `uint8`..`uint64`,
/// `float32`, `float64`, `string`, `date`, `decimal(P,S)`, `null`.
///
/// # Errors
/// [`ExprError`] for other names.
pub fn dtype(name: &str) -> Result<DataType> {
    let n = name.trim().to_ascii_lowercase();
    Ok(match n.as_str() {
        "bool" | "boolean" => DataType::Boolean,
        "int8" => DataType::Int8,
        "int16" => DataType::Int16,
        "int32" => DataType::Int32,
        "int64" => DataType::Int64,
        "uint8" => DataType::UInt8,
        "uint16" => DataType::UInt16,
        "uint32" => DataType::UInt32,
        "uint64" => DataType::UInt64,
        "float32" => DataType::Float32,
        "float64" => DataType::Float64,
        "string" | "str" | "utf8" => DataType::String,
        "date" => DataType::Date,
        "null" => DataType::Null,
        _ => {
            let inner = n
                .strip_prefix("decimal(")
                .and_then(|r| r.strip_suffix(')'))
                .ok_or_else(|| ExprError(format!("unknown data type {name:?}")))?;
            let (p, s) = inner.split_once(',').ok_or_else(|| {
                ExprError(format!("decimal type {name:?} needs (precision, scale)"))
            })?;
            let p: usize = p
                .trim()
                .parse()
                .map_err(|_| ExprError(format!("bad precision in {name:?}")))?;
            let s: usize = s
                .trim()
                .parse()
                .map_err(|_| ExprError(format!("bad scale in {name:?}")))?;
            if p == 0 || p > 38 || s > p {
                return bad(format!(
                    "decimal type {name:?}: need 1 <= precision <= 38 and scale <= precision"
                ));
            }
            DataType::Decimal(p, s)
        }
    })
}

fn scalar_lit(v: &Value) -> Result<Expr> {
    Ok(match v {
        Value::Null => lit(NULL),
        Value::Bool(b) => lit(*b),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Expr::Literal(LiteralValue::Dyn(DynLiteralValue::Int(i128::from(i))))
            } else if let Some(u) = n.as_u64() {
                Expr::Literal(LiteralValue::Dyn(DynLiteralValue::Int(i128::from(u))))
            } else if let Some(f) = n.as_f64() {
                Expr::Literal(LiteralValue::Dyn(DynLiteralValue::Float(f)))
            } else {
                return bad(format!("number {n} out of range"));
            }
        }
        Value::String(s) => Expr::Literal(LiteralValue::Dyn(DynLiteralValue::Str(
            PlSmallStr::from(s.as_str()),
        ))),
        other => {
            return bad(format!(
                "literal must be null, a bool, a number or a string, got {other}"
            ))
        }
    })
}

fn decimal_lit(unscaled: &str, scale: usize) -> Result<Expr> {
    let v: i128 = unscaled
        .parse()
        .map_err(|_| ExprError(format!("decimal literal {unscaled:?} is not an integer")))?;
    if scale > 38 {
        return bad("decimal literal scale above 38");
    }
    Ok(lit(Scalar::new_decimal(v, 38, scale)))
}

/// The values of an `is_in` list as a Series of the given type.
fn values_series(values: &[Value], dtype_name: &str) -> Result<Series> {
    let name = PlSmallStr::from("values");
    let want = dtype(dtype_name)?;
    let err = |v: &Value| ExprError(format!("is_in value {v} does not fit type {dtype_name}"));
    let s = match want {
        DataType::Boolean => {
            let v: Vec<Option<bool>> = values
                .iter()
                .map(|v| {
                    if v.is_null() {
                        Ok(None)
                    } else {
                        v.as_bool().map(Some).ok_or_else(|| err(v))
                    }
                })
                .collect::<Result<_>>()?;
            Series::new(name, v)
        }
        DataType::Float32 | DataType::Float64 => {
            let v: Vec<Option<f64>> = values
                .iter()
                .map(|v| {
                    if v.is_null() {
                        Ok(None)
                    } else {
                        v.as_f64().map(Some).ok_or_else(|| err(v))
                    }
                })
                .collect::<Result<_>>()?;
            Series::new(name, v)
        }
        DataType::String => {
            let v: Vec<Option<&str>> = values
                .iter()
                .map(|v| {
                    if v.is_null() {
                        Ok(None)
                    } else {
                        v.as_str().map(Some).ok_or_else(|| err(v))
                    }
                })
                .collect::<Result<_>>()?;
            Series::new(name, v)
        }
        DataType::Date
        | DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32 => {
            let v: Vec<Option<i64>> = values
                .iter()
                .map(|v| {
                    if v.is_null() {
                        Ok(None)
                    } else {
                        v.as_i64().map(Some).ok_or_else(|| err(v))
                    }
                })
                .collect::<Result<_>>()?;
            let s = Series::new(name, v);
            s.cast(&want)
                .map_err(|e| ExprError(format!("is_in values: {e}")))?
        }
        DataType::UInt64 => {
            let v: Vec<Option<u64>> = values
                .iter()
                .map(|v| {
                    if v.is_null() {
                        Ok(None)
                    } else {
                        v.as_u64().map(Some).ok_or_else(|| err(v))
                    }
                })
                .collect::<Result<_>>()?;
            Series::new(name, v)
        }
        other => return bad(format!("is_in does not take values of type {other}")),
    };
    Ok(s)
}

fn closed(name: &str) -> Result<ClosedInterval> {
    Ok(match name {
        "both" => ClosedInterval::Both,
        "left" => ClosedInterval::Left,
        "right" => ClosedInterval::Right,
        "none" => ClosedInterval::None,
        other => {
            return bad(format!(
                "closed must be both, left, right or none, got {other:?}"
            ))
        }
    })
}

fn binary(op: &str, l: Expr, r: Expr) -> Result<Expr> {
    Ok(match op {
        "eq" => l.eq(r),
        "neq" => l.neq(r),
        "lt" => l.lt(r),
        "le" => l.lt_eq(r),
        "gt" => l.gt(r),
        "ge" => l.gt_eq(r),
        "and" => l.and(r),
        "or" => l.or(r),
        "xor" => l.xor(r),
        "add" => l + r,
        "sub" => l - r,
        "mul" => l * r,
        "truediv" => l.true_div(r),
        "floordiv" => l.floor_div(r),
        "mod" => l % r,
        other => return bad(format!("unknown binary operator {other:?}")),
    })
}

fn aggregate(name: &str, e: Expr) -> Result<Expr> {
    Ok(match name {
        "sum" => e.sum(),
        "mean" => e.mean(),
        "count" => e.count(),
        "len" => e.len(),
        "n_unique" => e.n_unique(),
        "min" => e.min(),
        "max" => e.max(),
        "first" => e.first(),
        "last" => e.last(),
        "median" => e.median(),
        "std" => e.std(1),
        "var" => e.var(1),
        other => return bad(format!("unknown aggregation {other:?}")),
    })
}

/// One node of the tree (a JSON object with one of the keys handled below).
fn to_expr(v: &Value) -> Result<Expr> {
    let Value::Object(node) = v else {
        return bad(format!("expected an expression object, got {v}"));
    };
    let kind = node
        .get("op")
        .and_then(Value::as_str)
        .ok_or_else(|| ExprError(format!("expression object without \"op\": {v}")))?;
    Ok(match kind {
        "col" => col(str_field(node, "name", kind)?),
        "lit" => scalar_lit(field(node, "value", kind)?)?,
        "lit_date" => {
            let days = field(node, "days", kind)?
                .as_i64()
                .and_then(|d| i32::try_from(d).ok())
                .ok_or_else(|| ExprError("lit_date: days must be a 32-bit integer".into()))?;
            lit(Scalar::new_date(days))
        }
        "lit_decimal" => {
            let scale = field(node, "scale", kind)?
                .as_u64()
                .and_then(|s| usize::try_from(s).ok())
                .ok_or_else(|| {
                    ExprError("lit_decimal: scale must be a non-negative integer".into())
                })?;
            decimal_lit(str_field(node, "unscaled", kind)?, scale)?
        }
        "bin" => binary(
            str_field(node, "kind", kind)?,
            sub(node, "left", kind)?,
            sub(node, "right", kind)?,
        )?,
        "not" => sub(node, "expr", kind)?.not(),
        "neg" => -sub(node, "expr", kind)?,
        "is_null" => sub(node, "expr", kind)?.is_null(),
        "is_not_null" => sub(node, "expr", kind)?.is_not_null(),
        "abs" => sub(node, "expr", kind)?.abs(),
        "round" => {
            let decimals = field(node, "decimals", kind)?
                .as_u64()
                .and_then(|d| u32::try_from(d).ok())
                .ok_or_else(|| {
                    ExprError("round: decimals must be a non-negative integer".into())
                })?;
            sub(node, "expr", kind)?.round(decimals, RoundMode::HalfToEven)
        }
        "cast" => sub(node, "expr", kind)?.strict_cast(dtype(str_field(node, "dtype", kind)?)?),
        "alias" => sub(node, "expr", kind)?.alias(str_field(node, "name", kind)?),
        "fill_null" => sub(node, "expr", kind)?.fill_null(sub(node, "value", kind)?),
        "agg" => aggregate(str_field(node, "name", kind)?, sub(node, "expr", kind)?)?,
        "is_in" => {
            let Value::Array(values) = field(node, "values", kind)? else {
                return bad("is_in: values must be a list");
            };
            let s = values_series(values, str_field(node, "dtype", kind)?)?;
            sub(node, "expr", kind)?.is_in(lit(s).implode(false), false)
        }
        "between" => sub(node, "expr", kind)?.is_between(
            sub(node, "lower", kind)?,
            sub(node, "upper", kind)?,
            closed(str_field(node, "closed", kind)?)?,
        ),
        "when" => {
            let Value::Array(branches) = field(node, "branches", kind)? else {
                return bad("when: branches must be a list");
            };
            let otherwise = match node.get("otherwise") {
                Some(o) => to_expr(o)?,
                None => lit(NULL),
            };
            let mut parsed = Vec::with_capacity(branches.len());
            for b in branches {
                let (Some(c), Some(t)) = (b.get(0), b.get(1)) else {
                    return bad("when: each branch is [condition, value]");
                };
                parsed.push((to_expr(c)?, to_expr(t)?));
            }
            let mut it = parsed.into_iter();
            let Some((c0, t0)) = it.next() else {
                return bad("when: needs at least one branch");
            };
            let chain = when(c0).then(t0);
            let Some((c1, t1)) = it.next() else {
                return Ok(chain.otherwise(otherwise));
            };
            let mut chained = chain.when(c1).then(t1);
            for (c, t) in it {
                chained = chained.when(c).then(t);
            }
            chained.otherwise(otherwise)
        }
        other => return bad(format!("unknown expression node {other:?}")),
    })
}
