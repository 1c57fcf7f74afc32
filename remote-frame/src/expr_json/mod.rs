//! Polars expressions from a small, versioned JSON tree.
//!
//! The Python package (`scad.frame`) builds expressions as JSON objects, one per node,
//! each with an `"op"` key, and [`from_json`] / [`list_from_json`] turn them into
//! Polars [`Expr`]s:
//!
//! | `op` | fields | expression |
//! |---|---|---|
//! | `col` | `name` | `col(name)` |
//! | `lit` | `value` (null, bool, number, string) | a dynamic literal (below) |
//! | `lit_date` | `days` (32-bit, since 1970-01-01) | a `Date` literal |
//! | `lit_decimal` | `unscaled` (integer as a string), `scale` | a `Decimal(38, scale)` literal |
//! | `bin` | `kind`, `left`, `right` | `eq neq lt le gt ge and or xor add sub mul truediv floordiv mod` |
//! | `not`, `neg`, `is_null`, `is_not_null`, `abs` | `expr` | the method of that name |
//! | `round` | `expr`, `decimals` | round half to even |
//! | `cast` | `expr`, `dtype` ([`dtype`]) | strict cast |
//! | `alias` | `expr`, `name` | `expr.alias(name)` |
//! | `fill_null` | `expr`, `value` (an expression) | `expr.fill_null(value)` |
//! | `agg` | `expr`, `name` | `sum mean count len n_unique min max first last median std var` |
//! | `is_in` | `expr`, `values` (list), `dtype` | `expr.is_in(values)` |
//! | `between` | `expr`, `lower`, `upper`, `closed` (`both left right none`) | `expr.is_between(..)` |
//! | `when` | `branches` (list of `[condition, value]`), optional `otherwise` | `when/then/otherwise` |
//!
//! Why not Polars' own serialized expressions: the Python `polars` package and the
//! Rust `polars` crate are released separately and their expression serialization is
//! not stable across versions, so a wheel built against one would break on the next
//! Python release. This tree is ours and versioned with the wheel.
//!
//! Numbers and strings become Polars "dynamic" literals, so `col("x") + 1` keeps the
//! type of `x` exactly as in Python Polars.
//!
//! ```
//! use polars::prelude::*;
//! use scad_remote_frame::expr_json;
//!
//! // col("x") > 1
//! let e = expr_json::from_json(
//!     r#"{"op": "bin", "kind": "gt", "left": {"op": "col", "name": "x"},
//!         "right": {"op": "lit", "value": 1}}"#,
//! )?;
//! let df = df!("x" => [0i64, 1, 2, 3])?;
//! assert_eq!(df.lazy().filter(e).collect()?.height(), 2);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use polars::prelude::{
    col, lit, when, ClosedInterval, DataType, Expr, LiteralValue, NamedFrom, PlSmallStr, RoundMode,
    Scalar, Series, NULL,
};
use polars_plan::plans::DynLiteralValue;
use serde_json::{Map, Value};

/// A malformed expression tree; the message says which node and field.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExprJsonError {
    /// The text is not JSON at all.
    #[error("invalid expression: not JSON: {0}")]
    NotJson(#[source] serde_json::Error),

    /// A value of the wrong JSON shape where an expression (or a list of them) belongs.
    #[error("invalid expression: expected {expected}, got {got}")]
    NotAnExpression {
        /// What belongs there.
        expected: &'static str,
        /// The JSON found.
        got: String,
    },

    /// An `op`, binary operator `kind` or aggregation `name` this tree does not know.
    #[error("invalid expression: unknown {what} {name:?}")]
    Unknown {
        /// `"expression node"`, `"binary operator"`, `"aggregation"` or `"closed"`.
        what: &'static str,
        /// The name given.
        name: String,
    },

    /// A node lacks a field it needs.
    #[error("invalid expression: {node} node lacks {field:?}")]
    MissingField {
        /// The node's `op`.
        node: String,
        /// The field.
        field: String,
    },

    /// A node's field has the wrong JSON type or shape (including a `when` branch that
    /// is not a `[condition, value]` pair).
    #[error("invalid expression: {node} node: {field:?} must be {expected}")]
    BadField {
        /// The node's `op`.
        node: String,
        /// The field.
        field: String,
        /// What it must be.
        expected: &'static str,
    },

    /// A data type name [`dtype`] does not know, or a decimal type out of range.
    #[error("invalid expression: {0}")]
    BadType(String),

    /// A literal that no Polars literal holds (a number out of range, a value that does
    /// not fit the `is_in` type, a malformed decimal).
    #[error("invalid expression: {0}")]
    BadLiteral(String),
}

/// Result alias of this module.
pub type Result<T, E = ExprJsonError> = std::result::Result<T, E>;

/// Parses one expression from its JSON text.
///
/// # Errors
/// [`ExprJsonError`] for malformed JSON or a malformed node anywhere in the tree.
pub fn from_json(text: &str) -> Result<Expr> {
    let v: Value = serde_json::from_str(text).map_err(ExprJsonError::NotJson)?;
    to_expr(&v)
}

/// Parses a JSON list of expressions.
///
/// # Errors
/// As [`from_json`]; [`ExprJsonError::NotAnExpression`] if the top level is not a list.
pub fn list_from_json(text: &str) -> Result<Vec<Expr>> {
    let v: Value = serde_json::from_str(text).map_err(ExprJsonError::NotJson)?;
    let Value::Array(items) = v else {
        return Err(ExprJsonError::NotAnExpression {
            expected: "a list of expressions",
            got: v.to_string(),
        });
    };
    items.iter().map(to_expr).collect()
}

/// Turns a parsed JSON value into an expression.
///
/// # Errors
/// As [`from_json`].
pub fn to_expr(v: &Value) -> Result<Expr> {
    let Value::Object(node) = v else {
        return Err(ExprJsonError::NotAnExpression {
            expected: "an expression object",
            got: v.to_string(),
        });
    };
    let kind =
        node.get("op")
            .and_then(Value::as_str)
            .ok_or_else(|| ExprJsonError::NotAnExpression {
                expected: "an expression object with a string \"op\"",
                got: v.to_string(),
            })?;
    let n = Node { node, kind };
    Ok(match kind {
        "col" => col(n.str("name")?),
        "lit" => scalar_lit(n.field("value")?)?,
        "lit_date" => {
            let days = n
                .field("days")?
                .as_i64()
                .and_then(|d| i32::try_from(d).ok())
                .ok_or_else(|| n.bad("days", "a 32-bit integer"))?;
            lit(Scalar::new_date(days))
        }
        "lit_decimal" => {
            let scale = n
                .field("scale")?
                .as_u64()
                .and_then(|s| usize::try_from(s).ok())
                .ok_or_else(|| n.bad("scale", "a non-negative integer"))?;
            decimal_lit(n.str("unscaled")?, scale)?
        }
        "bin" => binary(n.str("kind")?, n.sub("left")?, n.sub("right")?)?,
        "not" => n.sub("expr")?.not(),
        "neg" => -n.sub("expr")?,
        "is_null" => n.sub("expr")?.is_null(),
        "is_not_null" => n.sub("expr")?.is_not_null(),
        "abs" => n.sub("expr")?.abs(),
        "round" => {
            let decimals = n
                .field("decimals")?
                .as_u64()
                .and_then(|d| u32::try_from(d).ok())
                .ok_or_else(|| n.bad("decimals", "a non-negative integer"))?;
            n.sub("expr")?.round(decimals, RoundMode::HalfToEven)
        }
        "cast" => n.sub("expr")?.strict_cast(dtype(n.str("dtype")?)?),
        "alias" => n.sub("expr")?.alias(n.str("name")?),
        "fill_null" => n.sub("expr")?.fill_null(n.sub("value")?),
        "agg" => aggregate(n.str("name")?, n.sub("expr")?)?,
        "is_in" => {
            let Value::Array(values) = n.field("values")? else {
                return Err(n.bad("values", "a list"));
            };
            let s = values_series(values, n.str("dtype")?)?;
            n.sub("expr")?.is_in(lit(s).implode(false), false)
        }
        "between" => {
            n.sub("expr")?
                .is_between(n.sub("lower")?, n.sub("upper")?, closed(n.str("closed")?)?)
        }
        "when" => when_chain(&n)?,
        other => {
            return Err(ExprJsonError::Unknown {
                what: "expression node",
                name: other.to_owned(),
            })
        }
    })
}

/// A node being parsed: its fields and its `op` (for messages).
struct Node<'a> {
    node: &'a Map<String, Value>,
    kind: &'a str,
}

impl<'a> Node<'a> {
    fn field(&self, key: &str) -> Result<&'a Value> {
        self.node
            .get(key)
            .ok_or_else(|| ExprJsonError::MissingField {
                node: self.kind.to_owned(),
                field: key.to_owned(),
            })
    }

    fn str(&self, key: &str) -> Result<&'a str> {
        self.field(key)?
            .as_str()
            .ok_or_else(|| self.bad(key, "a string"))
    }

    fn sub(&self, key: &str) -> Result<Expr> {
        to_expr(self.field(key)?)
    }

    fn bad(&self, key: &str, expected: &'static str) -> ExprJsonError {
        ExprJsonError::BadField {
            node: self.kind.to_owned(),
            field: key.to_owned(),
            expected,
        }
    }
}

/// `when(c0).then(v0).when(c1).then(v1)...otherwise(o)`; `otherwise` defaults to null.
fn when_chain(n: &Node<'_>) -> Result<Expr> {
    let Value::Array(branches) = n.field("branches")? else {
        return Err(n.bad("branches", "a list"));
    };
    let otherwise = match n.node.get("otherwise") {
        Some(o) => to_expr(o)?,
        None => lit(NULL),
    };
    let mut parsed = Vec::with_capacity(branches.len());
    for b in branches {
        let Some([c, t]) = b
            .as_array()
            .map(Vec::as_slice)
            .and_then(|s| <&[_; 2]>::try_from(s).ok())
        else {
            return Err(n.bad("branches", "a list of [condition, value] pairs"));
        };
        parsed.push((to_expr(c)?, to_expr(t)?));
    }
    let mut it = parsed.into_iter();
    let Some((c0, t0)) = it.next() else {
        return Err(n.bad("branches", "a non-empty list"));
    };
    let chain = when(c0).then(t0);
    let Some((c1, t1)) = it.next() else {
        return Ok(chain.otherwise(otherwise));
    };
    let mut chained = chain.when(c1).then(t1);
    for (c, t) in it {
        chained = chained.when(c).then(t);
    }
    Ok(chained.otherwise(otherwise))
}

/// A Polars data type from its name (case-insensitive): `bool`/`boolean`,
/// `int8`..`int64`, `uint8`..`uint64`, `float32`, `float64`, `string`/`str`/`utf8`,
/// `date`, `decimal(P,S)` (1 ≤ P ≤ 38, S ≤ P), `null`.
///
/// # Errors
/// [`ExprJsonError::BadType`] for other names.
pub fn dtype(name: &str) -> Result<DataType> {
    let n = name.trim().to_ascii_lowercase();
    let bad = |msg: String| ExprJsonError::BadType(msg);
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
                .ok_or_else(|| bad(format!("unknown data type {name:?}")))?;
            let (p, s) = inner
                .split_once(',')
                .ok_or_else(|| bad(format!("decimal type {name:?} needs (precision, scale)")))?;
            let p: usize = p
                .trim()
                .parse()
                .map_err(|_| bad(format!("bad precision in {name:?}")))?;
            let s: usize = s
                .trim()
                .parse()
                .map_err(|_| bad(format!("bad scale in {name:?}")))?;
            if p == 0 || p > 38 || s > p {
                return Err(bad(format!(
                    "decimal type {name:?}: need 1 <= precision <= 38 and scale <= precision"
                )));
            }
            DataType::Decimal(p, s)
        }
    })
}

/// `null`, a bool, or a dynamic integer, float or string literal.
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
                return Err(ExprJsonError::BadLiteral(format!(
                    "number {n} out of range"
                )));
            }
        }
        Value::String(s) => Expr::Literal(LiteralValue::Dyn(DynLiteralValue::Str(
            PlSmallStr::from(s.as_str()),
        ))),
        other => {
            return Err(ExprJsonError::BadLiteral(format!(
                "literal must be null, a bool, a number or a string, got {other}"
            )))
        }
    })
}

fn decimal_lit(unscaled: &str, scale: usize) -> Result<Expr> {
    let v: i128 = unscaled.parse().map_err(|_| {
        ExprJsonError::BadLiteral(format!("decimal literal {unscaled:?} is not an integer"))
    })?;
    if scale > 38 {
        return Err(ExprJsonError::BadLiteral(
            "decimal literal scale above 38".into(),
        ));
    }
    Ok(lit(Scalar::new_decimal(v, 38, scale)))
}

/// Converts each JSON value (or null) with `get`, or fails naming the value.
fn typed<'v, T>(
    values: &'v [Value],
    dtype_name: &str,
    get: impl Fn(&'v Value) -> Option<T>,
) -> Result<Vec<Option<T>>> {
    values
        .iter()
        .map(|v| {
            if v.is_null() {
                Ok(None)
            } else {
                get(v).map(Some).ok_or_else(|| {
                    ExprJsonError::BadLiteral(format!(
                        "is_in value {v} does not fit type {dtype_name}"
                    ))
                })
            }
        })
        .collect()
}

/// The values of an `is_in` list as a Series of the given type.
fn values_series(values: &[Value], dtype_name: &str) -> Result<Series> {
    let name = PlSmallStr::from("values");
    let want = dtype(dtype_name)?;
    Ok(match want {
        DataType::Boolean => Series::new(name, typed(values, dtype_name, Value::as_bool)?),
        DataType::Float32 | DataType::Float64 => {
            Series::new(name, typed(values, dtype_name, Value::as_f64)?)
        }
        DataType::String => Series::new(name, typed(values, dtype_name, Value::as_str)?),
        DataType::Date
        | DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32 => Series::new(name, typed(values, dtype_name, Value::as_i64)?)
            .cast(&want)
            .map_err(|e| ExprJsonError::BadLiteral(format!("is_in values: {e}")))?,
        DataType::UInt64 => Series::new(name, typed(values, dtype_name, Value::as_u64)?),
        other => {
            return Err(ExprJsonError::BadType(format!(
                "is_in does not take values of type {other}"
            )))
        }
    })
}

fn closed(name: &str) -> Result<ClosedInterval> {
    Ok(match name {
        "both" => ClosedInterval::Both,
        "left" => ClosedInterval::Left,
        "right" => ClosedInterval::Right,
        "none" => ClosedInterval::None,
        other => {
            return Err(ExprJsonError::Unknown {
                what: "closed (both, left, right or none)",
                name: other.to_owned(),
            })
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
        other => {
            return Err(ExprJsonError::Unknown {
                what: "binary operator",
                name: other.to_owned(),
            })
        }
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
        other => {
            return Err(ExprJsonError::Unknown {
                what: "aggregation",
                name: other.to_owned(),
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use polars::prelude::{df, AnyValue, DataFrame, IntoLazy};
    use serde_json::json;

    use super::*;

    fn frame() -> DataFrame {
        df!(
            "i" => [Some(1i64), Some(-2), None, Some(4)],
            "j" => [2i32, 3, 4, 5],
            "f" => [1.25f64, -2.5, 3.75, 0.5],
            "b" => [true, false, true, false],
            "s" => ["a", "b", "c", "d"],
        )
        .unwrap()
    }

    /// Evaluates the expression (JSON) over [`frame`], as one column.
    fn eval(tree: Value) -> Series {
        let e = to_expr(&tree).unwrap();
        let out = frame().lazy().select([e]).collect().unwrap();
        out.columns()[0].as_materialized_series().clone()
    }

    fn values(s: &Series) -> Vec<AnyValue<'static>> {
        s.iter().map(|v| v.into_static()).collect()
    }

    fn c(name: &str) -> Value {
        json!({"op": "col", "name": name})
    }

    fn l(v: Value) -> Value {
        json!({"op": "lit", "value": v})
    }

    fn un(op: &str, e: Value) -> Value {
        json!({"op": op, "expr": e})
    }

    fn bin(kind: &str, a: Value, b: Value) -> Value {
        json!({"op": "bin", "kind": kind, "left": a, "right": b})
    }

    fn err(tree: Value) -> ExprJsonError {
        to_expr(&tree).unwrap_err()
    }

    #[test]
    fn col_and_alias() {
        let s = eval(json!({"op": "alias", "name": "k", "expr": c("j")}));
        assert_eq!(s.name().as_str(), "k");
        assert_eq!(s.dtype(), &DataType::Int32);
        assert_eq!(
            s.i32().unwrap().to_vec(),
            [Some(2), Some(3), Some(4), Some(5)]
        );
    }

    #[test]
    fn dynamic_literals_take_the_column_type() {
        let s = eval(bin("add", c("j"), l(json!(1))));
        assert_eq!(s.dtype(), &DataType::Int32);
        assert_eq!(
            s.i32().unwrap().to_vec(),
            [Some(3), Some(4), Some(5), Some(6)]
        );
        let s = eval(bin("mul", c("f"), l(json!(2))));
        assert_eq!(s.dtype(), &DataType::Float64);
        let s = eval(bin("eq", c("s"), l(json!("b"))));
        assert_eq!(
            s.bool().unwrap().iter().collect::<Vec<_>>(),
            [Some(false), Some(true), Some(false), Some(false)]
        );
    }

    #[test]
    fn scalar_literals() {
        let one = |v: Value| values(&eval(l(v)))[0].clone();
        assert_eq!(one(json!(null)), AnyValue::Null);
        assert_eq!(one(json!(true)), AnyValue::Boolean(true));
        assert_eq!(one(json!(7)), AnyValue::Int32(7));
        assert_eq!(
            one(json!(-5_000_000_000i64)),
            AnyValue::Int64(-5_000_000_000)
        );
        assert_eq!(one(json!(u64::MAX)), AnyValue::UInt64(u64::MAX));
        assert_eq!(one(json!(1.5)), AnyValue::Float64(1.5));
        assert_eq!(one(json!("x")), AnyValue::String("x").into_static());
    }

    #[test]
    fn date_and_decimal_literals() {
        let s = eval(json!({"op": "lit_date", "days": 10957}));
        assert_eq!(s.dtype(), &DataType::Date);
        assert_eq!(values(&s)[0], AnyValue::Date(10957));
        let s = eval(json!({"op": "lit_decimal", "unscaled": "-12345", "scale": 2}));
        assert_eq!(s.dtype(), &DataType::Decimal(38, 2));
        assert_eq!(values(&s)[0], AnyValue::Decimal(-12345, 38, 2));
    }

    #[test]
    fn bad_literals() {
        assert!(matches!(err(l(json!([1]))), ExprJsonError::BadLiteral(_)));
        assert!(matches!(
            err(l(json!({"a": 1}))),
            ExprJsonError::BadLiteral(_)
        ));
        assert!(matches!(
            err(json!({"op": "lit_date", "days": 1u64 << 40})),
            ExprJsonError::BadField { .. }
        ));
        assert!(matches!(
            err(json!({"op": "lit_date", "days": "1"})),
            ExprJsonError::BadField { .. }
        ));
        assert!(matches!(
            err(json!({"op": "lit_decimal", "unscaled": "1.5", "scale": 1})),
            ExprJsonError::BadLiteral(_)
        ));
        assert!(matches!(
            err(json!({"op": "lit_decimal", "unscaled": "1", "scale": 39})),
            ExprJsonError::BadLiteral(_)
        ));
        assert!(matches!(
            err(json!({"op": "lit_decimal", "unscaled": "1", "scale": -1})),
            ExprJsonError::BadField { .. }
        ));
        assert!(matches!(
            err(json!({"op": "lit_decimal", "unscaled": 1, "scale": 1})),
            ExprJsonError::BadField { .. }
        ));
    }

    #[test]
    fn every_binary_operator() {
        let ints = |kind: &str| {
            let s = eval(bin(kind, c("j"), l(json!(3))));
            values(&s)
        };
        let b = |v: [bool; 4]| v.map(AnyValue::Boolean).to_vec();
        assert_eq!(ints("eq"), b([false, true, false, false]));
        assert_eq!(ints("neq"), b([true, false, true, true]));
        assert_eq!(ints("lt"), b([true, false, false, false]));
        assert_eq!(ints("le"), b([true, true, false, false]));
        assert_eq!(ints("gt"), b([false, false, true, true]));
        assert_eq!(ints("ge"), b([false, true, true, true]));
        let i = |v: [i32; 4]| v.map(AnyValue::Int32).to_vec();
        assert_eq!(ints("add"), i([5, 6, 7, 8]));
        assert_eq!(ints("sub"), i([-1, 0, 1, 2]));
        assert_eq!(ints("mul"), i([6, 9, 12, 15]));
        assert_eq!(ints("floordiv"), i([0, 1, 1, 1]));
        assert_eq!(ints("mod"), i([2, 0, 1, 2]));
        let f = |v: [f64; 4]| v.map(AnyValue::Float64).to_vec();
        assert_eq!(
            values(&eval(bin("truediv", c("j"), l(json!(2))))),
            f([1.0, 1.5, 2.0, 2.5])
        );
        let logic = |kind: &str| values(&eval(bin(kind, c("b"), bin("gt", c("j"), l(json!(3))))));
        // b = [t, f, t, f], j > 3 = [f, f, t, t]
        assert_eq!(logic("and"), b([false, false, true, false]));
        assert_eq!(logic("or"), b([true, false, true, true]));
        assert_eq!(logic("xor"), b([true, false, false, true]));
        assert!(matches!(
            err(bin("pow", c("j"), l(json!(2)))),
            ExprJsonError::Unknown {
                what: "binary operator",
                ..
            }
        ));
    }

    #[test]
    fn unary_nodes() {
        let b = |v: [bool; 4]| v.map(AnyValue::Boolean).to_vec();
        assert_eq!(
            values(&eval(un("not", c("b")))),
            b([false, true, false, true])
        );
        assert_eq!(
            values(&eval(un("is_null", c("i")))),
            b([false, false, true, false])
        );
        assert_eq!(
            values(&eval(un("is_not_null", c("i")))),
            b([true, true, false, true])
        );
        assert_eq!(
            eval(un("neg", c("i"))).i64().unwrap().to_vec(),
            [Some(-1), Some(2), None, Some(-4)]
        );
        assert_eq!(
            eval(un("abs", c("i"))).i64().unwrap().to_vec(),
            [Some(1), Some(2), None, Some(4)]
        );
        let r = eval(json!({"op": "round", "decimals": 1, "expr": c("f")}));
        // Half to even: 1.25 -> 1.2, -2.5 -> -2.5, 3.75 -> 3.8.
        assert_eq!(
            r.f64().unwrap().to_vec(),
            [Some(1.2), Some(-2.5), Some(3.8), Some(0.5)]
        );
        assert!(matches!(
            err(json!({"op": "round", "decimals": -1, "expr": c("f")})),
            ExprJsonError::BadField { .. }
        ));
        let filled = eval(json!({"op": "fill_null", "expr": c("i"), "value": l(json!(0))}));
        assert_eq!(
            filled.i64().unwrap().to_vec(),
            [Some(1), Some(-2), Some(0), Some(4)]
        );
    }

    #[test]
    fn casts() {
        let s = eval(json!({"op": "cast", "dtype": "Float32", "expr": c("j")}));
        assert_eq!(s.dtype(), &DataType::Float32);
        let s = eval(json!({"op": "cast", "dtype": "decimal(10, 2)", "expr": c("j")}));
        assert_eq!(s.dtype(), &DataType::Decimal(10, 2));
        // Strict: a string that is no number fails when evaluated.
        let e = to_expr(&json!({"op": "cast", "dtype": "int64", "expr": c("s")})).unwrap();
        assert!(frame().lazy().select([e]).collect().is_err());
        assert!(matches!(
            err(json!({"op": "cast", "dtype": "int128", "expr": c("j")})),
            ExprJsonError::BadType(_)
        ));
    }

    #[test]
    fn data_type_names() {
        let cases = [
            ("bool", DataType::Boolean),
            ("Boolean", DataType::Boolean),
            ("int8", DataType::Int8),
            ("int16", DataType::Int16),
            ("int32", DataType::Int32),
            ("INT64", DataType::Int64),
            ("uint8", DataType::UInt8),
            ("uint16", DataType::UInt16),
            ("uint32", DataType::UInt32),
            ("uint64", DataType::UInt64),
            ("float32", DataType::Float32),
            ("float64", DataType::Float64),
            ("string", DataType::String),
            ("str", DataType::String),
            (" utf8 ", DataType::String),
            ("date", DataType::Date),
            ("null", DataType::Null),
            ("decimal(38,0)", DataType::Decimal(38, 0)),
            ("Decimal( 7 , 7 )", DataType::Decimal(7, 7)),
        ];
        for (name, want) in cases {
            assert_eq!(dtype(name).unwrap(), want, "{name}");
        }
        for name in [
            "",
            "int128",
            "decimal",
            "decimal(5)",
            "decimal(a,1)",
            "decimal(5,b)",
            "decimal(0,0)",
            "decimal(39,0)",
            "decimal(5,6)",
            "decimal(-1,0)",
        ] {
            assert!(
                matches!(dtype(name), Err(ExprJsonError::BadType(_))),
                "{name:?}"
            );
        }
    }

    #[test]
    fn every_aggregation() {
        let agg = |name: &str, column: &str| {
            let s = eval(json!({"op": "agg", "name": name, "expr": c(column)}));
            assert_eq!(s.len(), 1, "{name}");
            values(&s)[0].clone()
        };
        assert_eq!(agg("sum", "j"), AnyValue::Int32(14));
        assert_eq!(agg("mean", "j"), AnyValue::Float64(3.5));
        assert_eq!(agg("count", "i"), AnyValue::UInt32(3));
        assert_eq!(agg("len", "i"), AnyValue::UInt32(4));
        assert_eq!(agg("n_unique", "b"), AnyValue::UInt32(2));
        assert_eq!(agg("min", "i"), AnyValue::Int64(-2));
        assert_eq!(agg("max", "i"), AnyValue::Int64(4));
        assert_eq!(agg("first", "s"), AnyValue::String("a").into_static());
        assert_eq!(agg("last", "s"), AnyValue::String("d").into_static());
        assert_eq!(agg("median", "j"), AnyValue::Float64(3.5));
        assert_eq!(agg("var", "j"), AnyValue::Float64(5.0 / 3.0));
        let AnyValue::Float64(sd) = agg("std", "j") else {
            panic!("std is not a float");
        };
        assert!((sd - (5.0f64 / 3.0).sqrt()).abs() < 1e-12);
        assert!(matches!(
            err(json!({"op": "agg", "name": "mode", "expr": c("j")})),
            ExprJsonError::Unknown {
                what: "aggregation",
                ..
            }
        ));
    }

    #[test]
    fn is_in_of_each_value_type() {
        let is_in = |column: &str, vals: Value, dtype: &str| {
            let s = eval(json!({"op": "is_in", "expr": c(column), "values": vals, "dtype": dtype}));
            s.bool().unwrap().iter().collect::<Vec<_>>()
        };
        let b = |v: [bool; 4]| v.map(Some).to_vec();
        assert_eq!(
            is_in("j", json!([3, 5]), "int32"),
            b([false, true, false, true])
        );
        assert_eq!(
            is_in("j", json!([3, null]), "int64"),
            b([false, true, false, false])
        );
        assert_eq!(
            is_in("j", json!([2]), "uint64"),
            b([true, false, false, false])
        );
        assert_eq!(
            is_in("f", json!([0.5, -2.5]), "float64"),
            b([false, true, false, true])
        );
        assert_eq!(
            is_in("s", json!(["a", "d"]), "string"),
            b([true, false, false, true])
        );
        assert_eq!(
            is_in("b", json!([false]), "bool"),
            b([false, true, false, true])
        );
        let dates = json!({"op": "cast", "dtype": "date", "expr": c("j")});
        let s = eval(json!({"op": "is_in", "expr": dates, "values": [4], "dtype": "date"}));
        assert_eq!(
            s.bool().unwrap().iter().collect::<Vec<_>>(),
            b([false, false, true, false])
        );

        let node = |vals: Value, dtype: &str| json!({"op": "is_in", "expr": c("j"), "values": vals, "dtype": dtype});
        assert!(matches!(
            err(node(json!(["x"]), "int32")),
            ExprJsonError::BadLiteral(_)
        ));
        assert!(matches!(
            err(node(json!([1.5]), "int64")),
            ExprJsonError::BadLiteral(_)
        ));
        assert!(matches!(
            err(node(json!([-1]), "uint64")),
            ExprJsonError::BadLiteral(_)
        ));
        assert!(matches!(
            err(node(json!([1]), "string")),
            ExprJsonError::BadLiteral(_)
        ));
        // Out of the target type's range: the value becomes null and matches nothing.
        let s = eval(node(json!([300, 3]), "int8"));
        assert_eq!(
            s.bool().unwrap().iter().collect::<Vec<_>>(),
            b([false, true, false, false])
        );
        assert!(matches!(
            err(node(json!([1]), "decimal(5,2)")),
            ExprJsonError::BadType(_)
        ));
        assert!(matches!(
            err(node(json!([1]), "weird")),
            ExprJsonError::BadType(_)
        ));
        assert!(matches!(
            err(node(json!(1), "int32")),
            ExprJsonError::BadField { .. }
        ));
    }

    #[test]
    fn between_each_closed() {
        let between = |closed: &str| {
            let s = eval(
                json!({"op": "between", "expr": c("j"), "lower": l(json!(3)),
                                "upper": l(json!(5)), "closed": closed}),
            );
            s.bool().unwrap().iter().collect::<Vec<_>>()
        };
        let b = |v: [bool; 4]| v.map(Some).to_vec();
        assert_eq!(between("both"), b([false, true, true, true]));
        assert_eq!(between("left"), b([false, true, true, false]));
        assert_eq!(between("right"), b([false, false, true, true]));
        assert_eq!(between("none"), b([false, false, true, false]));
        let e = err(
            json!({"op": "between", "expr": c("j"), "lower": l(json!(3)),
                           "upper": l(json!(5)), "closed": "open"}),
        );
        assert!(matches!(e, ExprJsonError::Unknown { .. }), "{e}");
    }

    #[test]
    fn when_then_otherwise() {
        let gt = |v: i64| bin("gt", c("j"), l(json!(v)));
        // One branch, no otherwise: null elsewhere.
        let s = eval(json!({"op": "when", "branches": [[gt(3), l(json!("big"))]]}));
        assert_eq!(
            s.str().unwrap().iter().collect::<Vec<_>>(),
            [None, None, Some("big"), Some("big")]
        );
        // Two branches and an otherwise.
        let s = eval(json!({"op": "when",
            "branches": [[gt(4), l(json!(2))], [gt(2), l(json!(1))]],
            "otherwise": l(json!(0))}));
        assert_eq!(
            s.i32().unwrap().to_vec(),
            [Some(0), Some(1), Some(1), Some(2)]
        );
        // Three branches: the first that holds wins.
        let s = eval(json!({"op": "when",
            "branches": [[gt(4), l(json!(3))], [gt(3), l(json!(2))], [gt(2), l(json!(1))]],
            "otherwise": l(json!(0))}));
        assert_eq!(
            s.i32().unwrap().to_vec(),
            [Some(0), Some(1), Some(2), Some(3)]
        );
    }

    #[test]
    fn malformed_when() {
        let bad = |branches: Value| err(json!({"op": "when", "branches": branches}));
        let pair = json!([{"op": "col", "name": "b"}, {"op": "lit", "value": 1}]);
        for branches in [
            json!([]),
            json!([[c("b")]]),
            json!([[c("b"), l(json!(1)), l(json!(2))]]),
            json!([pair, {"cond": c("b")}]),
            json!({"0": pair}),
        ] {
            let e = bad(branches.clone());
            assert!(
                matches!(e, ExprJsonError::BadField { .. }),
                "{branches}: {e}"
            );
        }
        assert!(matches!(
            err(json!({"op": "when"})),
            ExprJsonError::MissingField { .. }
        ));
    }

    #[test]
    fn malformed_trees() {
        assert!(matches!(from_json("{"), Err(ExprJsonError::NotJson(_))));
        assert!(matches!(
            list_from_json("[1"),
            Err(ExprJsonError::NotJson(_))
        ));
        assert!(matches!(
            list_from_json(r#"{"op": "col", "name": "x"}"#),
            Err(ExprJsonError::NotAnExpression { .. })
        ));
        assert!(matches!(
            from_json("[]"),
            Err(ExprJsonError::NotAnExpression { .. })
        ));
        assert!(matches!(
            from_json("3"),
            Err(ExprJsonError::NotAnExpression { .. })
        ));
        assert!(matches!(
            from_json(r#"{"name": "x"}"#),
            Err(ExprJsonError::NotAnExpression { .. })
        ));
        assert!(matches!(
            from_json(r#"{"op": 1, "name": "x"}"#),
            Err(ExprJsonError::NotAnExpression { .. })
        ));
        let e = from_json(r#"{"op": "explode", "expr": {"op": "col", "name": "x"}}"#).unwrap_err();
        assert!(matches!(
            e,
            ExprJsonError::Unknown {
                what: "expression node",
                ..
            }
        ));
        assert_eq!(
            e.to_string(),
            "invalid expression: unknown expression node \"explode\""
        );
        // Missing operands (wrong arity) and operands of the wrong JSON type.
        let e = err(json!({"op": "bin", "kind": "add", "left": c("j")}));
        assert_eq!(
            e.to_string(),
            "invalid expression: bin node lacks \"right\""
        );
        assert!(matches!(
            err(json!({"op": "not"})),
            ExprJsonError::MissingField { .. }
        ));
        assert!(matches!(
            err(json!({"op": "col"})),
            ExprJsonError::MissingField { .. }
        ));
        assert!(matches!(
            err(json!({"op": "col", "name": 5})),
            ExprJsonError::BadField { .. }
        ));
        // A malformed node deep inside fails the whole tree.
        assert!(matches!(
            err(bin("add", c("j"), un("neg", json!({"op": "lit"})))),
            ExprJsonError::MissingField { .. }
        ));
        // Lists: every element is checked.
        let list = list_from_json(r#"[{"op": "col", "name": "x"}, {"op": "lit", "value": 1}]"#);
        assert_eq!(list.unwrap().len(), 2);
        assert!(list_from_json(r#"[{"op": "col", "name": "x"}, {"op": "nope"}]"#).is_err());
    }
}
