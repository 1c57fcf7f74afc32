//! DataFusion expressions with Python Polars' semantics, from a small, versioned JSON tree.
//!
//! The Python package (`scad.frame`) builds expressions as JSON objects, one per node,
//! each with an `"op"` key, and [`from_json`] / [`list_from_json`] turn them into
//! DataFusion [`Expr`]s that compute what Python Polars computes for the same
//! expression (values, output types and output names), over a table of the given
//! [`DFSchema`]:
//!
//! | `op` | fields | expression (Polars semantics) |
//! |---|---|---|
//! | `col` | `name` | the column (no `.` parsing: [`ident`]) |
//! | `lit` | `value` (null, bool, number, string) | a dynamic literal (below) |
//! | `lit_date` | `days` (32-bit, since 1970-01-01) | a `Date32` literal |
//! | `lit_decimal` | `unscaled` (integer as a string), `scale` | a `Decimal128(38, scale)` literal |
//! | `bin` | `kind`, `left`, `right` | `eq neq lt le gt ge and or xor add sub mul truediv floordiv mod` |
//! | `not`, `neg`, `is_null`, `is_not_null`, `abs` | `expr` | the method of that name |
//! | `round` | `expr`, `decimals` | round half to even, type kept ([`round_half_to_even`]) |
//! | `cast` | `expr`, `dtype` ([`dtype`]) | strict cast (fails on overflow or unparsable text) |
//! | `alias` | `expr`, `name` | renames the output |
//! | `fill_null` | `expr`, `value` (an expression) | `coalesce(expr, value)` |
//! | `agg` | `expr`, `name` | `sum mean count len n_unique min max first last median std var` |
//! | `is_in` | `expr`, `values` (list), `dtype` | `expr IN (values)`, nulls as Polars |
//! | `between` | `expr`, `lower`, `upper`, `closed` (`both left right none`) | `lower <(=) expr <(=) upper` |
//! | `when` | `branches` (list of `[condition, value]`), optional `otherwise` | `CASE WHEN .. THEN .. ELSE .. END` |
//!
//! Why not Polars' own serialized expressions: the Python `polars` package and the
//! Rust crates are released separately and their expression serialization is not
//! stable across versions. This tree is ours and versioned with the wheel.
//!
//! # Polars semantics reproduced
//!
//! - **Output names** ([`output_name`]): `alias` its name, `col` the column, literals
//!   `"literal"`, every other node the name of its first input expression (`bin` its
//!   left operand, `when` its first `then` value, `agg` its expression — also for
//!   `len`). [`from_json`] and [`to_expr`] alias the expression to that name.
//! - **Dynamic literals**: an integer literal next to an integer or float expression
//!   takes that type when it fits (`col(i32) + 1` is `Int32`, `col(f32) * 2` is
//!   `Float32`), else stays `Int32`/`Int64`/`UInt64` and the operation takes Polars'
//!   supertype (`col(u32) + -1` is `Int64`); next to a `Date32` it is a date (days).
//!   A float literal is `Float32` next to `Float32`, else `Float64`. A string literal
//!   is of the string type next to it (`Utf8View` alone); next to a non-string
//!   operand it is an error ([`ExprJsonError::BadLiteral`]), as in Polars. A null
//!   literal takes the type next to it. The operand next to a literal is typed with
//!   the table's schema; when that fails (an unknown column) the literal keeps its
//!   default type and DataFusion reports the column when the query is planned.
//! - **Numeric operands** of a binary node are cast to Polars' supertype (`i32 + f32`
//!   is `Float64`, `u32 + i32` is `Int64`, `i64` with `u64` is `Float64`). Integer
//!   arithmetic wraps on overflow (as Polars).
//! - **`truediv`** is `Float32` when both operands are at most `Float32`, else
//!   `Float64`. **`floordiv`** floors (`-7 // 2 = -4`; floats `floor(l / r)`), **`mod`**
//!   takes the divisor's sign (`-7 % 2 = 1`, `7 % -2 = -1`, `-7.5 % 2 = 0.5`). Integer
//!   `//` and `%` by zero are null (as Polars; DataFusion alone would fail the query);
//!   float `/ 0` is ±inf and `% 0` NaN.
//! - **`and`/`or`/`xor`/`not`** are logical (Kleene `and`/`or`; `xor` null when
//!   either side is) on booleans and bitwise on integers. `add` of strings
//!   concatenates.
//! - **Aggregations** have Polars' types: `count`, `len`, `n_unique` are `UInt32`
//!   (`n_unique` counts null as a value); `sum` keeps `Int32`/`Int64`/`UInt32`/`UInt64`/
//!   floats, widens `Int8`/`Int16`/`UInt8`/`UInt16` to `Int64`, counts booleans as
//!   `UInt32`, gives `Decimal128(38, s)` for decimals and 0 (not null) over no values;
//!   `mean`, `median`, `std`, `var` are `Float32` for `Float32` and `Float64`
//!   otherwise (`median` of integers is the float midpoint); `std`/`var` have
//!   ddof 1; `first`/`last` take the first/last row even if null (no `ORDER BY`: the
//!   caller keeps the input order). Several of these wrap the aggregate function in a
//!   cast or an arithmetic expression, which `DataFrame::aggregate` takes as it is.
//! - **`is_in`**: a null input gives null, nulls in `values` match nothing, values that
//!   do not fit the `dtype`'s range are dropped. **`between`** and **`when`** as Polars
//!   (a null condition takes the next branch; no `otherwise` gives null; the branches
//!   take Polars' supertype). **`fill_null`**: the value is typed like the expression.
//! - **`cast`** is strict (`Expr::Cast`, not `TryCast`): an overflowing or unparsable
//!   value fails the query.
//!
//! ```
//! use datafusion::arrow::array::{Int64Array, RecordBatch};
//! use datafusion::arrow::datatypes::{DataType, Field, Schema};
//! use datafusion::prelude::SessionContext;
//! use scad_remote_frame::expr_json;
//! use std::sync::Arc;
//!
//! let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
//! let batch = RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![-7, 1, 2, 3]))])?;
//! let rt = tokio::runtime::Builder::new_current_thread().build()?;
//! rt.block_on(async {
//!     let df = SessionContext::new().read_batch(batch)?;
//!     // filter(col("x") > 1): a predicate goes in unaliased.
//!     let gt = expr_json::from_json(
//!         r#"{"op": "bin", "kind": "gt", "left": {"op": "col", "name": "x"},
//!             "right": {"op": "lit", "value": 1}}"#,
//!         df.schema(),
//!     )?;
//!     assert_eq!(df.clone().filter(gt.unalias())?.count().await?, 2);
//!     // select(col("x") // 2): floored, Int64, named "x".
//!     let half = expr_json::from_json(
//!         r#"{"op": "bin", "kind": "floordiv", "left": {"op": "col", "name": "x"},
//!             "right": {"op": "lit", "value": 2}}"#,
//!         df.schema(),
//!     )?;
//!     let out = df.select(vec![half])?.collect().await?;
//!     let field = out[0].schema().field(0).clone();
//!     assert_eq!((field.name().as_str(), field.data_type()), ("x", &DataType::Int64));
//!     let got = out[0].column(0).as_any().downcast_ref::<Int64Array>().unwrap();
//!     assert_eq!(got.values().to_vec(), [-4, 0, 1, 1]);
//!     Ok::<(), Box<dyn std::error::Error>>(())
//! })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod round;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::{DFSchema, ScalarValue};
use datafusion::functions::expr_fn::{abs, coalesce, floor, nullif};
use datafusion::functions_aggregate::expr_fn::{
    avg, count, count_distinct, first_value, last_value, max, median, min, stddev, sum, var_sample,
};
use datafusion::logical_expr::{
    binary_expr, cast, ident, in_list, Case, Expr, ExprSchemable, Operator,
};
use datafusion::prelude::lit;
use serde_json::{Map, Value};

pub use round::{round_half_to_even, PolarsRound};

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

/// Parses one expression from its JSON text, for a table of `schema`, aliased to its
/// Polars output name ([`output_name`]).
///
/// A filter predicate must not be aliased in DataFusion: pass `e.unalias()` to
/// `DataFrame::filter`.
///
/// # Errors
/// [`ExprJsonError`] for malformed JSON or a malformed node anywhere in the tree. An
/// unknown column is not an error here (DataFusion reports it when planning).
pub fn from_json(text: &str, schema: &DFSchema) -> Result<Expr> {
    let v: Value = serde_json::from_str(text).map_err(ExprJsonError::NotJson)?;
    to_expr(&v, schema)
}

/// Parses a JSON list of expressions, each as [`from_json`].
///
/// # Errors
/// As [`from_json`]; [`ExprJsonError::NotAnExpression`] if the top level is not a list.
pub fn list_from_json(text: &str, schema: &DFSchema) -> Result<Vec<Expr>> {
    let v: Value = serde_json::from_str(text).map_err(ExprJsonError::NotJson)?;
    let Value::Array(items) = v else {
        return Err(ExprJsonError::NotAnExpression {
            expected: "a list of expressions",
            got: v.to_string(),
        });
    };
    items.iter().map(|item| to_expr(item, schema)).collect()
}

/// Turns a parsed JSON value into an expression over a table of `schema`, aliased to
/// its Polars output name ([`output_name`]).
///
/// # Errors
/// As [`from_json`].
pub fn to_expr(v: &Value, schema: &DFSchema) -> Result<Expr> {
    let e = Converter { schema }.expr(v)?;
    Ok(e.alias(output_name(v)?))
}

/// The name Polars gives the output of the tree `v`: `alias` its name, `col` the
/// column, `lit`, `lit_date`, `lit_decimal` `"literal"`, every other node the name of
/// its first input expression (`bin`: `left`; `when`: the first branch's value; `agg`:
/// its `expr`, also for `len`).
///
/// # Errors
/// [`ExprJsonError`] when a node on that path is malformed (it does not check the rest
/// of the tree; [`to_expr`] does).
pub fn output_name(v: &Value) -> Result<String> {
    let n = Node::of(v)?;
    Ok(match n.kind {
        "alias" | "col" => n.str("name")?.to_owned(),
        "lit" | "lit_date" | "lit_decimal" => "literal".to_owned(),
        "bin" => output_name(n.field("left")?)?,
        "when" => {
            let (_, first) = n
                .branches()?
                .into_iter()
                .next()
                .ok_or_else(|| n.bad("branches", "a non-empty list"))?;
            output_name(first)?
        }
        "not" | "neg" | "is_null" | "is_not_null" | "abs" | "round" | "cast" | "fill_null"
        | "agg" | "is_in" | "between" => output_name(n.field("expr")?)?,
        other => {
            return Err(ExprJsonError::Unknown {
                what: "expression node",
                name: other.to_owned(),
            })
        }
    })
}

/// A data type from its name (case-insensitive): `bool`/`boolean`, `int8`..`int64`,
/// `uint8`..`uint64`, `float32`, `float64`, `string`/`str`/`utf8` (`Utf8View`, the
/// frames' string type), `date` (`Date32`), `decimal(P,S)` (`Decimal128`,
/// 1 ≤ P ≤ 38, S ≤ P), `null`.
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
        "string" | "str" | "utf8" => DataType::Utf8View,
        "date" => DataType::Date32,
        "null" => DataType::Null,
        _ => {
            let inner = n
                .strip_prefix("decimal(")
                .and_then(|r| r.strip_suffix(')'))
                .ok_or_else(|| bad(format!("unknown data type {name:?}")))?;
            let (p, s) = inner
                .split_once(',')
                .ok_or_else(|| bad(format!("decimal type {name:?} needs (precision, scale)")))?;
            let p: u8 = p
                .trim()
                .parse()
                .map_err(|_| bad(format!("bad precision in {name:?}")))?;
            let s: i8 = s
                .trim()
                .parse()
                .map_err(|_| bad(format!("bad scale in {name:?}")))?;
            if p == 0 || p > 38 || s < 0 || i16::from(s) > i16::from(p) {
                return Err(bad(format!(
                    "decimal type {name:?}: need 1 <= precision <= 38 and 0 <= scale <= precision"
                )));
            }
            DataType::Decimal128(p, s)
        }
    })
}

/// A node being parsed: its fields and its `op` (for messages).
struct Node<'a> {
    node: &'a Map<String, Value>,
    kind: &'a str,
}

/// A `when` branch: `(condition, value)`.
type Branch<'a> = (&'a Value, &'a Value);

impl<'a> Node<'a> {
    fn of(v: &'a Value) -> Result<Self> {
        let Value::Object(node) = v else {
            return Err(ExprJsonError::NotAnExpression {
                expected: "an expression object",
                got: v.to_string(),
            });
        };
        let kind = node.get("op").and_then(Value::as_str).ok_or_else(|| {
            ExprJsonError::NotAnExpression {
                expected: "an expression object with a string \"op\"",
                got: v.to_string(),
            }
        })?;
        Ok(Node { node, kind })
    }

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

    fn bad(&self, key: &str, expected: &'static str) -> ExprJsonError {
        ExprJsonError::BadField {
            node: self.kind.to_owned(),
            field: key.to_owned(),
            expected,
        }
    }

    /// The `[condition, value]` pairs of a `when` node (possibly empty).
    fn branches(&self) -> Result<Vec<Branch<'a>>> {
        let Value::Array(branches) = self.field("branches")? else {
            return Err(self.bad("branches", "a list"));
        };
        branches
            .iter()
            .map(|b| match b.as_array().map(Vec::as_slice) {
                Some([c, t]) => Ok((c, t)),
                _ => Err(self.bad("branches", "a list of [condition, value] pairs")),
            })
            .collect()
    }
}

/// Where a dynamic literal stands, for the string rule (module docs).
#[derive(Clone, Copy, PartialEq)]
enum Place {
    /// An operand of `bin`, `between` or `fill_null`: a string next to a non-string is
    /// an error.
    Operand,
    /// A `when` value: a string is fine (the branches become strings, as Polars).
    Branch,
}

/// Builds expressions for a table of `schema`.
struct Converter<'s> {
    schema: &'s DFSchema,
}

impl Converter<'_> {
    /// The expression of `v`, not aliased.
    fn expr(&self, v: &Value) -> Result<Expr> {
        self.typed(v, None, Place::Operand)
    }

    /// The expression of `v`; a dynamic literal takes its type from `next_to`.
    fn typed(&self, v: &Value, next_to: Option<&DataType>, place: Place) -> Result<Expr> {
        let n = Node::of(v)?;
        Ok(match n.kind {
            "col" => ident(n.str("name")?),
            "lit" => dyn_lit(n.field("value")?, next_to, place)?,
            "lit_date" => {
                let days = n
                    .field("days")?
                    .as_i64()
                    .and_then(|d| i32::try_from(d).ok())
                    .ok_or_else(|| n.bad("days", "a 32-bit integer"))?;
                lit(ScalarValue::Date32(Some(days)))
            }
            "lit_decimal" => {
                let scale = n
                    .field("scale")?
                    .as_u64()
                    .ok_or_else(|| n.bad("scale", "a non-negative integer"))?;
                decimal_lit(n.str("unscaled")?, scale)?
            }
            "bin" => self.binary(&n)?,
            "not" => {
                let e = self.expr(n.field("expr")?)?;
                match self.type_of(&e) {
                    Some(t) if t.is_integer() => {
                        // Bitwise not: xor with all ones (-1, or MAX when unsigned).
                        let ones = int_scalar(-1, &t)
                            .or_else(|| int_scalar(max_unsigned(&t), &t))
                            .ok_or_else(|| {
                                ExprJsonError::BadLiteral(format!("no bitwise not for {t}"))
                            })?;
                        binary_expr(e, Operator::BitwiseXor, lit(ones))
                    }
                    _ => std::ops::Not::not(e),
                }
            }
            "neg" => Expr::Negative(Box::new(self.expr(n.field("expr")?)?)),
            "is_null" => self.expr(n.field("expr")?)?.is_null(),
            "is_not_null" => self.expr(n.field("expr")?)?.is_not_null(),
            "abs" => abs(self.expr(n.field("expr")?)?),
            "round" => {
                let decimals = n
                    .field("decimals")?
                    .as_u64()
                    .and_then(|d| u32::try_from(d).ok())
                    .ok_or_else(|| n.bad("decimals", "a non-negative integer"))?;
                round_half_to_even(self.expr(n.field("expr")?)?, decimals)
            }
            "cast" => {
                let to = dtype(n.str("dtype")?)?;
                cast(self.expr(n.field("expr")?)?, to)
            }
            // The name only matters at the top ([`output_name`]); DataFusion does not
            // want aliases inside expressions.
            "alias" => {
                n.str("name")?;
                self.typed(n.field("expr")?, next_to, place)?
            }
            "fill_null" => {
                let (e, value) = self.pair(n.field("expr")?, n.field("value")?, Place::Operand)?;
                let (e, value) = self.unify(e, value);
                coalesce(vec![e, value])
            }
            "agg" => {
                let name = n.str("name")?;
                let e = self.expr(n.field("expr")?)?;
                self.aggregate(name, e)?
            }
            "is_in" => self.is_in(&n)?,
            "between" => self.between(&n)?,
            "when" => self.when(&n)?,
            other => {
                return Err(ExprJsonError::Unknown {
                    what: "expression node",
                    name: other.to_owned(),
                })
            }
        })
    }

    /// The type of `e` over the schema, if DataFusion can tell (not for an unknown
    /// column).
    fn type_of(&self, e: &Expr) -> Option<DataType> {
        e.get_type(self.schema).ok()
    }

    /// Two operands, a dynamic literal on either side typed from the other.
    fn pair(&self, a: &Value, b: &Value, place: Place) -> Result<(Expr, Expr)> {
        if is_dyn_lit(a) && !is_dyn_lit(b) {
            let b = self.expr(b)?;
            let a = self.typed(a, self.type_of(&b).as_ref(), place)?;
            Ok((a, b))
        } else {
            let a = self.expr(a)?;
            let b = self.typed(b, self.type_of(&a).as_ref(), place)?;
            Ok((a, b))
        }
    }

    /// Casts numeric operands to their Polars supertype.
    fn unify(&self, a: Expr, b: Expr) -> (Expr, Expr) {
        match (self.type_of(&a), self.type_of(&b)) {
            (Some(ta), Some(tb)) if ta != tb => match supertype(&ta, &tb) {
                Some(t) => (cast_to(a, &ta, &t), cast_to(b, &tb, &t)),
                None => (a, b),
            },
            _ => (a, b),
        }
    }

    fn binary(&self, n: &Node<'_>) -> Result<Expr> {
        let kind = n.str("kind")?;
        let (left, right) = (n.field("left")?, n.field("right")?);
        let op = match kind {
            "eq" => Operator::Eq,
            "neq" => Operator::NotEq,
            "lt" => Operator::Lt,
            "le" => Operator::LtEq,
            "gt" => Operator::Gt,
            "ge" => Operator::GtEq,
            "and" => Operator::And,
            "or" => Operator::Or,
            "xor" => Operator::BitwiseXor,
            "add" => Operator::Plus,
            "sub" => Operator::Minus,
            "mul" => Operator::Multiply,
            "truediv" => Operator::Divide,
            "floordiv" => Operator::IntegerDivide,
            "mod" => Operator::Modulo,
            other => {
                return Err(ExprJsonError::Unknown {
                    what: "binary operator",
                    name: other.to_owned(),
                })
            }
        };
        let (l, r) = self.pair(left, right, Place::Operand)?;
        let (tl, tr) = (self.type_of(&l), self.type_of(&r));
        if op == Operator::Divide {
            // Float32 when both sides are at most Float32, else Float64.
            let t = match (&tl, &tr) {
                (Some(a), Some(b)) => match supertype(a, b) {
                    Some(DataType::Float32) => DataType::Float32,
                    _ if a.is_decimal() || b.is_decimal() => {
                        return Ok(binary_expr(l, op, r));
                    }
                    _ => DataType::Float64,
                },
                _ => DataType::Float64,
            };
            return Ok(binary_expr(
                cast_known(l, tl.as_ref(), &t),
                op,
                cast_known(r, tr.as_ref(), &t),
            ));
        }
        let (l, r) = self.unify(l, r);
        let t = self.type_of(&l);
        let int = t.as_ref().is_some_and(DataType::is_integer);
        let float = t.as_ref().is_some_and(DataType::is_floating);
        let string = t.as_ref().is_some_and(is_string);
        Ok(match op {
            Operator::And | Operator::Or | Operator::BitwiseXor if int => {
                let op = match op {
                    Operator::And => Operator::BitwiseAnd,
                    Operator::Or => Operator::BitwiseOr,
                    other => other,
                };
                binary_expr(l, op, r)
            }
            // Booleans: null when either side is, as Polars.
            Operator::BitwiseXor => l.not_eq(r),
            Operator::Plus if string => binary_expr(l, Operator::StringConcat, r),
            Operator::IntegerDivide | Operator::Modulo if int || float => {
                let signed = t.as_ref().is_some_and(|t| !is_unsigned(t));
                // Integers by zero: null, as Polars.
                let r = match &t {
                    Some(t) if int => nullif(r, lit(ScalarValue::new_zero(t).map_err(df_err)?)),
                    _ => r,
                };
                let m = binary_expr(l.clone(), Operator::Modulo, r.clone());
                // Python's modulo: the remainder takes the divisor's sign.
                let m = if signed {
                    let zero = lit(
                        ScalarValue::new_zero(t.as_ref().unwrap_or(&DataType::Int64))
                            .map_err(df_err)?,
                    );
                    let wrong_sign = m
                        .clone()
                        .not_eq(zero.clone())
                        .and(m.clone().lt(zero.clone()).not_eq(r.clone().lt(zero)));
                    case(vec![(wrong_sign, m.clone() + r.clone())], Some(m))
                } else {
                    m
                };
                match op {
                    Operator::Modulo => m,
                    _ if float => floor(binary_expr(l, Operator::Divide, r)),
                    // Exact division once the floored remainder is taken off.
                    _ => binary_expr(l - m, Operator::Divide, r),
                }
            }
            Operator::IntegerDivide => binary_expr(l, Operator::Divide, r),
            _ => binary_expr(l, op, r),
        })
    }

    fn between(&self, n: &Node<'_>) -> Result<Expr> {
        let (lower_op, upper_op) = match n.str("closed")? {
            "both" => (Operator::GtEq, Operator::LtEq),
            "left" => (Operator::GtEq, Operator::Lt),
            "right" => (Operator::Gt, Operator::LtEq),
            "none" => (Operator::Gt, Operator::Lt),
            other => {
                return Err(ExprJsonError::Unknown {
                    what: "closed (both, left, right or none)",
                    name: other.to_owned(),
                })
            }
        };
        let (ev, lv, uv) = (n.field("expr")?, n.field("lower")?, n.field("upper")?);
        let (e, lower) = self.pair(ev, lv, Place::Operand)?;
        let (e2, upper) = self.pair(ev, uv, Place::Operand)?;
        if is_null_lit(lv) || is_null_lit(uv) {
            // Polars: a null bound makes every row null (even where the other bound
            // alone would say false).
            drop((e2, lower, upper));
            return Ok(case(
                vec![(e.is_null(), lit(ScalarValue::Boolean(None)))],
                Some(lit(ScalarValue::Boolean(None))),
            ));
        }
        let (e, lower) = self.unify(e, lower);
        let (e2, upper) = self.unify(e2, upper);
        Ok(binary_expr(e, lower_op, lower).and(binary_expr(e2, upper_op, upper)))
    }

    fn is_in(&self, n: &Node<'_>) -> Result<Expr> {
        let Value::Array(values) = n.field("values")? else {
            return Err(n.bad("values", "a list"));
        };
        let dtype_name = n.str("dtype")?;
        let want = dtype(dtype_name)?;
        let e = self.expr(n.field("expr")?)?;
        if let Some(t) = self.type_of(&e) {
            if is_string(&t) != is_string(&want) && t != DataType::Null {
                return Err(ExprJsonError::BadLiteral(format!(
                    "is_in cannot look for {want} values in {t} data"
                )));
            }
        }
        let mut list = Vec::with_capacity(values.len());
        for v in values {
            if v.is_null() {
                // Polars: a null in the list matches nothing.
                continue;
            }
            let misfit = || {
                ExprJsonError::BadLiteral(format!("is_in value {v} does not fit type {dtype_name}"))
            };
            let s = match &want {
                DataType::Boolean => {
                    Some(ScalarValue::Boolean(Some(v.as_bool().ok_or_else(misfit)?)))
                }
                DataType::Float32 => {
                    #[allow(clippy::cast_possible_truncation)]
                    let f = v.as_f64().ok_or_else(misfit)? as f32;
                    Some(ScalarValue::Float32(Some(f)))
                }
                DataType::Float64 => {
                    Some(ScalarValue::Float64(Some(v.as_f64().ok_or_else(misfit)?)))
                }
                DataType::Utf8View => Some(ScalarValue::Utf8View(Some(
                    v.as_str().ok_or_else(misfit)?.to_owned(),
                ))),
                DataType::UInt64 => Some(ScalarValue::UInt64(Some(v.as_u64().ok_or_else(misfit)?))),
                // Out of the type's range: dropped (it matches nothing).
                DataType::Date32 => i32::try_from(v.as_i64().ok_or_else(misfit)?)
                    .ok()
                    .map(|d| ScalarValue::Date32(Some(d))),
                t if t.is_integer() => int_scalar(i128::from(v.as_i64().ok_or_else(misfit)?), t),
                other => {
                    return Err(ExprJsonError::BadType(format!(
                        "is_in does not take values of type {other}"
                    )))
                }
            };
            list.extend(s.map(lit));
        }
        if list.is_empty() {
            // Polars: false, but null for a null input.
            return Ok(case(
                vec![(e.is_null(), lit(ScalarValue::Boolean(None)))],
                Some(lit(false)),
            ));
        }
        Ok(in_list(e, list, false))
    }

    fn when(&self, n: &Node<'_>) -> Result<Expr> {
        let branches = n.branches()?;
        if branches.is_empty() {
            return Err(n.bad("branches", "a non-empty list"));
        }
        let otherwise = n.node.get("otherwise");
        // The values that are not dynamic literals set the type (their supertype);
        // the literals take it.
        let values: Vec<&Value> = branches.iter().map(|b| b.1).chain(otherwise).collect();
        let mut fixed = Vec::with_capacity(values.len());
        for v in &values {
            fixed.push(if is_dyn_lit(v) {
                None
            } else {
                Some(self.expr(v)?)
            });
        }
        // The other values' supertype types the literals.
        let mut common: Option<DataType> = None;
        for t in fixed.iter().flatten().filter_map(|e| self.type_of(e)) {
            common = Some(match common {
                None => t,
                Some(c) => supertype(&c, &t).unwrap_or(c),
            });
        }
        let mut out = Vec::with_capacity(values.len());
        for (v, e) in values.iter().zip(fixed) {
            out.push(match e {
                Some(e) => e,
                None => self.typed(v, common.as_ref(), Place::Branch)?,
            });
        }
        // Then every value takes the supertype of all (when Polars has one).
        let types: Option<Vec<DataType>> = out.iter().map(|e| self.type_of(e)).collect();
        if let Some((first, rest)) = types.as_ref().and_then(|t| t.split_first()) {
            let all = rest.iter().try_fold(first.clone(), |c, t| supertype(&c, t));
            if let (Some(all), Some(types)) = (all, &types) {
                out = out
                    .into_iter()
                    .zip(types.iter())
                    .map(|(e, t)| cast_to(e, t, &all))
                    .collect();
            }
        }
        let mut out = out.into_iter();
        let mut pairs = Vec::with_capacity(branches.len());
        for (c, _) in &branches {
            let cond = self.expr(c)?;
            let value = out.next().ok_or_else(|| n.bad("branches", "a list"))?;
            pairs.push((cond, value));
        }
        Ok(case(pairs, out.next()))
    }

    fn aggregate(&self, name: &str, e: Expr) -> Result<Expr> {
        let t = self.type_of(&e);
        let f32_or_f64 = || match t {
            Some(DataType::Float32) => DataType::Float32,
            _ => DataType::Float64,
        };
        // Integers, booleans and decimals are averaged (etc.) as Float64.
        let as_float = |e: Expr| match &t {
            Some(t) if !t.is_floating() => cast(e, DataType::Float64),
            _ => e,
        };
        let idx = |e: Expr| cast(e, DataType::UInt32);
        Ok(match name {
            "sum" => match &t {
                Some(t) => {
                    let out = sum_type(t);
                    let input = if t == &DataType::Boolean {
                        cast(e, DataType::UInt32)
                    } else {
                        e
                    };
                    match ScalarValue::new_zero(&out) {
                        Ok(zero) => coalesce(vec![cast(sum(input), out), lit(zero)]),
                        // Not a number: DataFusion reports it when planning.
                        Err(_) => sum(input),
                    }
                }
                None => sum(e),
            },
            "mean" => cast_float(avg(as_float(e)), f32_or_f64()),
            "median" => cast_float(median(as_float(e)), f32_or_f64()),
            "std" => cast_float(stddev(as_float(e)), f32_or_f64()),
            "var" => cast_float(var_sample(as_float(e)), f32_or_f64()),
            "count" => idx(count(e)),
            "len" => idx(count(lit(1i64))),
            "n_unique" => {
                // A null counts as one more distinct value.
                let has_null = cast(count(lit(1i64)).gt(count(e.clone())), DataType::Int64);
                idx(count_distinct(e) + has_null)
            }
            "min" => min(e),
            "max" => max(e),
            "first" => first_value(e, vec![]),
            "last" => last_value(e, vec![]),
            other => {
                return Err(ExprJsonError::Unknown {
                    what: "aggregation",
                    name: other.to_owned(),
                })
            }
        })
    }
}

/// `e` cast to `to` unless DataFusion already gives that float type (`Float64`).
fn cast_float(e: Expr, to: DataType) -> Expr {
    if to == DataType::Float64 {
        e
    } else {
        cast(e, to)
    }
}

/// `e` (of type `from` if known) cast to `to` unless known to be of that type.
fn cast_known(e: Expr, from: Option<&DataType>, to: &DataType) -> Expr {
    match from {
        Some(from) => cast_to(e, from, to),
        None => cast(e, to.clone()),
    }
}

/// `e` (of type `from`) cast to `to` unless already of that type.
fn cast_to(e: Expr, from: &DataType, to: &DataType) -> Expr {
    if from == to {
        e
    } else {
        cast(e, to.clone())
    }
}

/// `CASE WHEN c THEN v ... [ELSE o] END`.
fn case(pairs: Vec<(Expr, Expr)>, otherwise: Option<Expr>) -> Expr {
    Expr::Case(Case::new(
        None,
        pairs
            .into_iter()
            .map(|(c, v)| (Box::new(c), Box::new(v)))
            .collect(),
        otherwise.map(Box::new),
    ))
}

fn df_err(e: datafusion::error::DataFusionError) -> ExprJsonError {
    ExprJsonError::BadLiteral(e.to_string())
}

/// Polars' type of `sum` over `t`.
fn sum_type(t: &DataType) -> DataType {
    match t {
        DataType::Int8 | DataType::Int16 | DataType::UInt8 | DataType::UInt16 => DataType::Int64,
        DataType::Boolean => DataType::UInt32,
        DataType::Decimal128(_, s) => DataType::Decimal128(38, *s),
        other => other.clone(),
    }
}

fn is_string(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

fn is_unsigned(t: &DataType) -> bool {
    matches!(
        t,
        DataType::UInt8 | DataType::UInt16 | DataType::UInt32 | DataType::UInt64
    )
}

/// Bits of an integer type.
fn int_bits(t: &DataType) -> Option<u32> {
    Some(match t {
        DataType::Int8 | DataType::UInt8 => 8,
        DataType::Int16 | DataType::UInt16 => 16,
        DataType::Int32 | DataType::UInt32 => 32,
        DataType::Int64 | DataType::UInt64 => 64,
        _ => return None,
    })
}

fn signed_of(bits: u32) -> DataType {
    match bits {
        8 => DataType::Int8,
        16 => DataType::Int16,
        32 => DataType::Int32,
        _ => DataType::Int64,
    }
}

fn max_unsigned(t: &DataType) -> i128 {
    int_bits(t).map_or(0, |b| (1i128 << b) - 1)
}

/// Polars' supertype of two numeric (or boolean) types; `None` for other pairs.
fn supertype(a: &DataType, b: &DataType) -> Option<DataType> {
    use DataType::{Boolean, Float32, Float64};
    if a == b || b == &DataType::Null {
        return Some(a.clone());
    }
    if a == &DataType::Null {
        return Some(b.clone());
    }
    Some(match (a, b) {
        (Float64, x) | (x, Float64) if x.is_numeric() || x == &Boolean => Float64,
        (Float32, x) | (x, Float32) if x.is_integer() => {
            if int_bits(x)? <= 16 {
                Float32
            } else {
                Float64
            }
        }
        (Float32, Boolean) | (Boolean, Float32) => Float32,
        (Boolean, x) | (x, Boolean) if x.is_integer() => x.clone(),
        (x, y) if x.is_integer() && y.is_integer() => {
            let (bx, by) = (int_bits(x)?, int_bits(y)?);
            match (is_unsigned(x), is_unsigned(y)) {
                (false, false) | (true, true) => {
                    if bx >= by {
                        x.clone()
                    } else {
                        y.clone()
                    }
                }
                (sx, _) => {
                    let (s_bits, u_bits) = if sx { (by, bx) } else { (bx, by) };
                    if s_bits > u_bits {
                        signed_of(s_bits)
                    } else if u_bits < 64 {
                        signed_of(u_bits * 2)
                    } else {
                        Float64
                    }
                }
            }
        }
        _ => return None,
    })
}

/// Whether `v` is a `lit` node (a literal typed by what stands next to it).
fn is_dyn_lit(v: &Value) -> bool {
    v.get("op").and_then(Value::as_str) == Some("lit")
}

fn is_null_lit(v: &Value) -> bool {
    is_dyn_lit(v) && v.get("value").is_some_and(Value::is_null)
}

/// `i` as a scalar of the integer type `t`, if it fits.
fn int_scalar(i: i128, t: &DataType) -> Option<ScalarValue> {
    Some(match t {
        DataType::Int8 => ScalarValue::Int8(Some(i8::try_from(i).ok()?)),
        DataType::Int16 => ScalarValue::Int16(Some(i16::try_from(i).ok()?)),
        DataType::Int32 => ScalarValue::Int32(Some(i32::try_from(i).ok()?)),
        DataType::Int64 => ScalarValue::Int64(Some(i64::try_from(i).ok()?)),
        DataType::UInt8 => ScalarValue::UInt8(Some(u8::try_from(i).ok()?)),
        DataType::UInt16 => ScalarValue::UInt16(Some(u16::try_from(i).ok()?)),
        DataType::UInt32 => ScalarValue::UInt32(Some(u32::try_from(i).ok()?)),
        DataType::UInt64 => ScalarValue::UInt64(Some(u64::try_from(i).ok()?)),
        _ => return None,
    })
}

/// A `lit` value typed by the expression next to it (module docs).
fn dyn_lit(v: &Value, next_to: Option<&DataType>, place: Place) -> Result<Expr> {
    let next_to = next_to.filter(|t| **t != DataType::Null);
    Ok(lit(match v {
        Value::Null => match next_to {
            Some(t) => ScalarValue::try_from(t).unwrap_or(ScalarValue::Null),
            None => ScalarValue::Null,
        },
        Value::Bool(b) => ScalarValue::Boolean(Some(*b)),
        Value::Number(n) => {
            if let Some(i) = n.as_i64().map(i128::from).or(n.as_u64().map(i128::from)) {
                let typed = match next_to {
                    Some(t) if t.is_integer() => int_scalar(i, t),
                    #[allow(clippy::cast_precision_loss)]
                    Some(DataType::Float32) => Some(ScalarValue::Float32(Some(i as f32))),
                    #[allow(clippy::cast_precision_loss)]
                    Some(DataType::Float64) => Some(ScalarValue::Float64(Some(i as f64))),
                    Some(DataType::Date32) => {
                        i32::try_from(i).ok().map(|d| ScalarValue::Date32(Some(d)))
                    }
                    _ => None,
                };
                match typed {
                    Some(s) => s,
                    None => [DataType::Int32, DataType::Int64, DataType::UInt64]
                        .iter()
                        .find_map(|t| int_scalar(i, t))
                        .ok_or_else(|| {
                            ExprJsonError::BadLiteral(format!("number {n} out of range"))
                        })?,
                }
            } else if let Some(f) = n.as_f64() {
                match next_to {
                    #[allow(clippy::cast_possible_truncation)]
                    Some(DataType::Float32) => ScalarValue::Float32(Some(f as f32)),
                    _ => ScalarValue::Float64(Some(f)),
                }
            } else {
                return Err(ExprJsonError::BadLiteral(format!(
                    "number {n} out of range"
                )));
            }
        }
        Value::String(s) => match next_to {
            Some(DataType::Utf8) => ScalarValue::Utf8(Some(s.clone())),
            Some(DataType::LargeUtf8) => ScalarValue::LargeUtf8(Some(s.clone())),
            Some(t) if place == Place::Operand && !is_string(t) => {
                return Err(ExprJsonError::BadLiteral(format!(
                    "string literal {s:?} next to an expression of type {t} (Polars does not \
                     mix strings with other types)"
                )))
            }
            _ => ScalarValue::Utf8View(Some(s.clone())),
        },
        other => {
            return Err(ExprJsonError::BadLiteral(format!(
                "literal must be null, a bool, a number or a string, got {other}"
            )))
        }
    }))
}

fn decimal_lit(unscaled: &str, scale: u64) -> Result<Expr> {
    let v: i128 = unscaled.parse().map_err(|_| {
        ExprJsonError::BadLiteral(format!("decimal literal {unscaled:?} is not an integer"))
    })?;
    let scale = i8::try_from(scale)
        .ok()
        .filter(|s| *s <= 38)
        .ok_or_else(|| ExprJsonError::BadLiteral("decimal literal scale above 38".into()))?;
    if v.unsigned_abs() >= 10u128.pow(38) {
        return Err(ExprJsonError::BadLiteral(format!(
            "decimal literal {unscaled:?} has more than 38 digits"
        )));
    }
    Ok(lit(ScalarValue::Decimal128(Some(v), 38, scale)))
}

#[cfg(test)]
mod tests;
