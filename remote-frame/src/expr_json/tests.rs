//! Each tree evaluated by DataFusion; the expected values, types and names are what
//! Polars 0.55 (the Rust crate behind Python Polars 1.x) gives for the same
//! expression, recorded before the move from Polars expressions.

use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BooleanArray, Date32Array, Float32Array, Float64Array, Int16Array, Int32Array,
    Int64Array, Int8Array, RecordBatch, StringViewArray, UInt32Array, UInt8Array,
};
use datafusion::arrow::compute::{cast as arrow_cast, concat};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::{DFSchema, ScalarValue};
use datafusion::prelude::{SessionConfig, SessionContext};
use serde_json::{json, Value};

use super::*;
use crate::query::has_aggregate;

/// The table the tests run on: the first five columns are the old Polars test frame.
fn frame() -> RecordBatch {
    let cols: Vec<(&str, ArrayRef)> = vec![
        (
            "i",
            Arc::new(Int64Array::from(vec![Some(1), Some(-2), None, Some(4)])),
        ),
        ("j", Arc::new(Int32Array::from(vec![2, 3, 4, 5]))),
        (
            "f",
            Arc::new(Float64Array::from(vec![1.25, -2.5, 3.75, 0.5])),
        ),
        (
            "b",
            Arc::new(BooleanArray::from(vec![true, false, true, false])),
        ),
        (
            "s",
            Arc::new(StringViewArray::from(vec!["a", "b", "c", "d"])),
        ),
        ("n", Arc::new(Int64Array::from(vec![-7, 7, -7, 7]))),
        ("d", Arc::new(Int64Array::from(vec![2, -2, -2, 0]))),
        ("n32", Arc::new(Int32Array::from(vec![-7, 7, -7, 7]))),
        (
            "fl",
            Arc::new(Float64Array::from(vec![-7.5, 7.5, -7.5, 7.5])),
        ),
        ("h", Arc::new(Float64Array::from(vec![0.5, 1.5, 2.5, -0.5]))),
        (
            "h2",
            Arc::new(Float64Array::from(vec![-1.5, -2.5, 1.25, 2.675])),
        ),
        ("g", Arc::new(Float32Array::from(vec![1.5, -2.5, 0.5, 3.0]))),
        (
            "bn",
            Arc::new(BooleanArray::from(vec![
                Some(true),
                None,
                Some(false),
                None,
            ])),
        ),
        (
            "bt",
            Arc::new(BooleanArray::from(vec![
                Some(true),
                Some(true),
                None,
                Some(false),
            ])),
        ),
        ("u", Arc::new(UInt32Array::from(vec![1, 2, 3, 4]))),
        (
            "sn",
            Arc::new(StringViewArray::from(vec![
                Some("x"),
                None,
                Some("x"),
                Some("y"),
            ])),
        ),
        (
            "in",
            Arc::new(Int64Array::from(vec![None, Some(1), Some(1), Some(2)])),
        ),
        ("big", Arc::new(Int64Array::from(vec![300, 1, 2, 3]))),
        (
            "snum",
            Arc::new(StringViewArray::from(vec!["1", "2", "x", "4"])),
        ),
        (
            "fbig",
            Arc::new(Float64Array::from(vec![1.7, -1.7, 1e20, 2.0])),
        ),
        ("i8", Arc::new(Int8Array::from(vec![1, 2, 3, 100]))),
        ("i16", Arc::new(Int16Array::from(vec![1, 2, 3, 30000]))),
        ("u8", Arc::new(UInt8Array::from(vec![1, 2, 3, 250]))),
        ("dt", Arc::new(Date32Array::from(vec![2, 3, 4, 5]))),
    ];
    let fields: Vec<Field> = cols
        .iter()
        .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
        .collect();
    RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        cols.into_iter().map(|(_, a)| a).collect(),
    )
    .unwrap()
}

fn schema() -> DFSchema {
    DFSchema::try_from(frame().schema()).unwrap()
}

/// One output column.
#[derive(Debug)]
struct Out {
    name: String,
    dtype: DataType,
    array: ArrayRef,
}

impl Out {
    fn values(&self) -> Vec<ScalarValue> {
        (0..self.array.len())
            .map(|i| ScalarValue::try_from_array(&self.array, i).unwrap())
            .collect()
    }

    /// The values as text (strings of any string type).
    fn strs(&self) -> Vec<Option<String>> {
        let a = arrow_cast(&self.array, &DataType::Utf8).unwrap();
        let a = a
            .as_any()
            .downcast_ref::<datafusion::arrow::array::StringArray>()
            .unwrap();
        a.iter().map(|v| v.map(str::to_owned)).collect()
    }

    fn f64s(&self) -> Vec<Option<f64>> {
        let a = arrow_cast(&self.array, &DataType::Float64).unwrap();
        let a = a.as_any().downcast_ref::<Float64Array>().unwrap();
        a.iter().collect()
    }

    fn i64s(&self) -> Vec<Option<i64>> {
        let a = arrow_cast(&self.array, &DataType::Int64).unwrap();
        let a = a.as_any().downcast_ref::<Int64Array>().unwrap();
        a.iter().collect()
    }

    fn bools(&self) -> Vec<Option<bool>> {
        let a = self.array.as_any().downcast_ref::<BooleanArray>().unwrap();
        a.iter().collect()
    }
}

/// Evaluates the tree over [`frame`] (rows where `filter` holds, if given), as one
/// column; aggregations through `DataFrame::aggregate` (which takes aggregate calls
/// inside casts and arithmetic as they are).
fn run(tree: &Value, filter: Option<&Value>) -> Result<Out, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let s = |e: datafusion::error::DataFusionError| e.to_string();
        let ctx = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(1));
        let mut df = ctx.read_batch(frame()).map_err(s)?;
        if let Some(f) = filter {
            let p = to_expr(f, df.schema()).map_err(|e| e.to_string())?;
            df = df.filter(p.unalias()).map_err(s)?;
        }
        let e = to_expr(tree, df.schema()).map_err(|e| e.to_string())?;
        let df = if has_aggregate(&e) {
            df.aggregate(vec![], vec![e]).map_err(s)?
        } else {
            df.select(vec![e]).map_err(s)?
        };
        let field = df.schema().field(0).clone();
        let batches = df.collect().await.map_err(s)?;
        let arrays: Vec<&dyn datafusion::arrow::array::Array> =
            batches.iter().map(|b| b.column(0).as_ref()).collect();
        Ok(Out {
            name: field.name().clone(),
            dtype: field.data_type().clone(),
            array: concat(&arrays).map_err(|e| e.to_string())?,
        })
    })
}

fn eval(tree: Value) -> Out {
    run(&tree, None).unwrap_or_else(|e| panic!("{tree}: {e}"))
}

/// Fails when evaluated (planning or execution), not when converted.
fn fails(tree: Value) -> String {
    to_expr(&tree, &schema()).unwrap_or_else(|e| panic!("{tree}: {e}"));
    match run(&tree, None) {
        Ok(out) => panic!("{tree} gave {out:?}"),
        Err(e) => e,
    }
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

fn agg(name: &str, e: Value) -> Value {
    json!({"op": "agg", "name": name, "expr": e})
}

fn cast_node(dtype: &str, e: Value) -> Value {
    json!({"op": "cast", "dtype": dtype, "expr": e})
}

fn err(tree: Value) -> ExprJsonError {
    to_expr(&tree, &schema()).unwrap_err()
}

/// Asserts name, type and (as i64) values.
fn ints(tree: Value, name: &str, dtype: DataType, want: &[Option<i64>]) {
    let out = eval(tree.clone());
    assert_eq!((out.name.as_str(), &out.dtype), (name, &dtype), "{tree}");
    assert_eq!(out.i64s(), want, "{tree}");
}

/// Asserts name, type and (as f64) values.
fn floats(tree: Value, name: &str, dtype: DataType, want: &[Option<f64>]) {
    let out = eval(tree.clone());
    assert_eq!((out.name.as_str(), &out.dtype), (name, &dtype), "{tree}");
    let got = out.f64s();
    assert_eq!(got.len(), want.len(), "{tree}");
    for (g, w) in got.iter().zip(want) {
        let same = match (g, w) {
            (Some(g), Some(w)) if w.is_nan() => g.is_nan(),
            (Some(g), Some(w)) if w.is_infinite() => g == w,
            (Some(g), Some(w)) => (g - w).abs() <= 1e-6 * w.abs().max(1.0),
            (g, w) => g == w,
        };
        assert!(same, "{tree}: got {got:?}, want {want:?}");
    }
}

/// Asserts name and boolean values.
fn bools(tree: Value, name: &str, want: &[Option<bool>]) {
    let out = eval(tree.clone());
    assert_eq!(
        (out.name.as_str(), &out.dtype),
        (name, &DataType::Boolean),
        "{tree}"
    );
    assert_eq!(out.bools(), want, "{tree}");
}

const T: Option<bool> = Some(true);
const F: Option<bool> = Some(false);

#[test]
fn col_and_alias() {
    ints(
        json!({"op": "alias", "name": "k", "expr": c("j")}),
        "k",
        DataType::Int32,
        &[Some(2), Some(3), Some(4), Some(5)],
    );
    // An alias inside a tree only names that subtree.
    ints(
        bin(
            "add",
            json!({"op": "alias", "name": "k", "expr": c("j")}),
            l(json!(1)),
        ),
        "k",
        DataType::Int32,
        &[Some(3), Some(4), Some(5), Some(6)],
    );
}

#[test]
fn dynamic_literals_take_the_column_type() {
    use DataType::*;
    ints(
        bin("add", c("j"), l(json!(1))),
        "j",
        Int32,
        &[Some(3), Some(4), Some(5), Some(6)],
    );
    ints(
        bin("add", l(json!(1)), c("j")),
        "literal",
        Int32,
        &[Some(3), Some(4), Some(5), Some(6)],
    );
    ints(
        bin("add", c("i8"), l(json!(1))),
        "i8",
        Int8,
        &[Some(2), Some(3), Some(4), Some(101)],
    );
    floats(
        bin("mul", c("f"), l(json!(2))),
        "f",
        Float64,
        &[Some(2.5), Some(-5.0), Some(7.5), Some(1.0)],
    );
    floats(
        bin("mul", c("g"), l(json!(2))),
        "g",
        Float32,
        &[Some(3.0), Some(-5.0), Some(1.0), Some(6.0)],
    );
    floats(
        bin("mul", c("g"), l(json!(2.5))),
        "g",
        Float32,
        &[Some(3.75), Some(-6.25), Some(1.25), Some(7.5)],
    );
    floats(
        bin("add", c("j"), l(json!(1.5))),
        "j",
        Float64,
        &[Some(3.5), Some(4.5), Some(5.5), Some(6.5)],
    );
    // Out of the column's range: Polars' supertype of the column and the literal.
    ints(
        bin("add", c("u"), l(json!(-1))),
        "u",
        Int64,
        &[Some(0), Some(1), Some(2), Some(3)],
    );
    ints(
        bin("add", c("j"), l(json!(5_000_000_000i64))),
        "j",
        Int64,
        &[
            Some(5_000_000_002),
            Some(5_000_000_003),
            Some(5_000_000_004),
            Some(5_000_000_005),
        ],
    );
    ints(
        bin("add", c("i8"), l(json!(300))),
        "i8",
        Int32,
        &[Some(301), Some(302), Some(303), Some(400)],
    );
    // Integer arithmetic wraps, as Polars.
    ints(
        bin("sub", c("u"), l(json!(3))),
        "u",
        UInt32,
        &[Some(4_294_967_294), Some(4_294_967_295), Some(0), Some(1)],
    );
    ints(
        bin("add", c("j"), l(json!(2_147_483_647))),
        "j",
        Int32,
        &[
            Some(-2_147_483_647),
            Some(-2_147_483_646),
            Some(-2_147_483_645),
            Some(-2_147_483_644),
        ],
    );
    ints(
        bin("add", c("j"), l(json!(null))),
        "j",
        Int32,
        &[None, None, None, None],
    );
    bools(bin("eq", c("s"), l(json!("b"))), "s", &[F, T, F, F]);
    bools(bin("lt", c("s"), l(json!("b"))), "s", &[T, F, F, F]);
    let out = eval(bin("add", c("s"), l(json!("z"))));
    assert_eq!(
        out.strs(),
        ["az", "bz", "cz", "dz"].map(|s| Some(s.to_owned()))
    );
    // An integer next to a date is a date (days).
    bools(bin("eq", c("dt"), l(json!(4))), "dt", &[F, F, T, F]);
    bools(
        bin("gt", c("dt"), json!({"op": "lit_date", "days": 3})),
        "dt",
        &[F, F, T, T],
    );
    // Polars does not mix strings with other types.
    for tree in [
        bin("eq", c("j"), l(json!("3"))),
        bin("eq", c("dt"), l(json!("1970-01-04"))),
        bin("eq", l(json!("3")), c("j")),
        json!({"op": "fill_null", "expr": c("i"), "value": l(json!("q"))}),
    ] {
        assert!(
            matches!(err(tree.clone()), ExprJsonError::BadLiteral(_)),
            "{tree}"
        );
    }
}

#[test]
fn numeric_operands_take_the_polars_supertype() {
    use DataType::*;
    floats(
        bin("add", c("j"), c("g")),
        "j",
        Float64,
        &[Some(3.5), Some(0.5), Some(4.5), Some(8.0)],
    );
    ints(
        bin("add", c("j"), c("i")),
        "j",
        Int64,
        &[Some(3), Some(1), None, Some(9)],
    );
    ints(
        bin("add", c("u"), c("j")),
        "u",
        Int64,
        &[Some(3), Some(5), Some(7), Some(9)],
    );
    ints(
        bin("add", c("u"), c("i")),
        "u",
        Int64,
        &[Some(2), Some(0), None, Some(8)],
    );
    ints(
        bin("add", c("i8"), c("u8")),
        "i8",
        Int16,
        &[Some(2), Some(4), Some(6), Some(350)],
    );
    floats(
        bin("add", c("i16"), c("g")),
        "i16",
        Float32,
        &[Some(2.5), Some(-0.5), Some(3.5), Some(30003.0)],
    );
    floats(
        bin("add", c("j"), c("f")),
        "j",
        Float64,
        &[Some(3.25), Some(0.5), Some(7.75), Some(5.5)],
    );
    bools(bin("gt", c("j"), l(json!(2.5))), "j", &[F, T, T, T]);
    bools(bin("eq", c("j"), l(json!(3.0))), "j", &[F, T, F, F]);
    bools(
        bin("gt", c("j"), l(json!(null))),
        "j",
        &[None, None, None, None],
    );
}

#[test]
fn scalar_literals() {
    let one = |v: Value| {
        let out = eval(l(v));
        assert_eq!(out.name, "literal");
        out.values()[0].clone()
    };
    assert_eq!(one(json!(null)), ScalarValue::Null);
    assert_eq!(one(json!(true)), ScalarValue::Boolean(Some(true)));
    assert_eq!(one(json!(7)), ScalarValue::Int32(Some(7)));
    assert_eq!(
        one(json!(2_147_483_648i64)),
        ScalarValue::Int64(Some(2_147_483_648))
    );
    assert_eq!(
        one(json!(-5_000_000_000i64)),
        ScalarValue::Int64(Some(-5_000_000_000))
    );
    assert_eq!(one(json!(u64::MAX)), ScalarValue::UInt64(Some(u64::MAX)));
    assert_eq!(one(json!(1.5)), ScalarValue::Float64(Some(1.5)));
    assert_eq!(one(json!("x")), ScalarValue::Utf8View(Some("x".into())));
    // DataFusion repeats a constant on every row (Polars gives one row).
    ints(
        bin("add", l(json!(1)), l(json!(2))),
        "literal",
        DataType::Int32,
        &[Some(3); 4],
    );
}

#[test]
fn date_and_decimal_literals() {
    let out = eval(json!({"op": "lit_date", "days": 10957}));
    assert_eq!(
        (out.name.as_str(), &out.dtype),
        ("literal", &DataType::Date32)
    );
    assert_eq!(out.values()[0], ScalarValue::Date32(Some(10957)));
    let out = eval(json!({"op": "lit_decimal", "unscaled": "-12345", "scale": 2}));
    assert_eq!(out.dtype, DataType::Decimal128(38, 2));
    assert_eq!(
        out.values()[0],
        ScalarValue::Decimal128(Some(-12345), 38, 2)
    );
    // Polars: a float next to a decimal gives Float64.
    let dec = json!({"op": "lit_decimal", "unscaled": "-12345", "scale": 2});
    floats(
        bin("add", c("f"), dec),
        "f",
        DataType::Float64,
        &[Some(-122.2), Some(-125.95), Some(-119.7), Some(-122.95)],
    );
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
    assert!(matches!(
        err(json!({"op": "lit_decimal", "unscaled": "1".repeat(39), "scale": 1})),
        ExprJsonError::BadLiteral(_)
    ));
}

#[test]
fn every_binary_operator() {
    let cmp = |kind: &str, want: &[Option<bool>]| bools(bin(kind, c("j"), l(json!(3))), "j", want);
    cmp("eq", &[F, T, F, F]);
    cmp("neq", &[T, F, T, T]);
    cmp("lt", &[T, F, F, F]);
    cmp("le", &[T, T, F, F]);
    cmp("gt", &[F, F, T, T]);
    cmp("ge", &[F, T, T, T]);
    let int = |kind: &str, want: [i64; 4]| {
        ints(
            bin(kind, c("j"), l(json!(3))),
            "j",
            DataType::Int32,
            &want.map(Some),
        );
    };
    int("add", [5, 6, 7, 8]);
    int("sub", [-1, 0, 1, 2]);
    int("mul", [6, 9, 12, 15]);
    int("floordiv", [0, 1, 1, 1]);
    int("mod", [2, 0, 1, 2]);
    floats(
        bin("truediv", c("j"), l(json!(2))),
        "j",
        DataType::Float64,
        &[Some(1.0), Some(1.5), Some(2.0), Some(2.5)],
    );
    // b = [t, f, t, f], j > 3 = [f, f, t, t]
    let logic = |kind: &str, want: &[Option<bool>]| {
        bools(bin(kind, c("b"), bin("gt", c("j"), l(json!(3)))), "b", want);
    };
    logic("and", &[F, F, T, F]);
    logic("or", &[T, F, T, T]);
    logic("xor", &[T, F, F, T]);
    assert!(matches!(
        err(bin("pow", c("j"), l(json!(2)))),
        ExprJsonError::Unknown {
            what: "binary operator",
            ..
        }
    ));
}

#[test]
fn division_and_modulo_as_polars() {
    use DataType::*;
    // Integers: floored, the remainder takes the divisor's sign, by zero is null.
    ints(
        bin("mod", c("n"), c("d")),
        "n",
        Int64,
        &[Some(1), Some(-1), Some(-1), None],
    );
    ints(
        bin("floordiv", c("n"), c("d")),
        "n",
        Int64,
        &[Some(-4), Some(-4), Some(3), None],
    );
    floats(
        bin("truediv", c("n"), c("d")),
        "n",
        Float64,
        &[Some(-3.5), Some(-3.5), Some(3.5), Some(f64::INFINITY)],
    );
    ints(
        bin("mod", c("n32"), l(json!(2))),
        "n32",
        Int32,
        &[Some(1); 4],
    );
    ints(
        bin("mod", c("n32"), l(json!(-2))),
        "n32",
        Int32,
        &[Some(-1); 4],
    );
    ints(
        bin("floordiv", c("n32"), l(json!(2))),
        "n32",
        Int32,
        &[Some(-4), Some(3), Some(-4), Some(3)],
    );
    ints(
        bin("floordiv", c("n32"), l(json!(0))),
        "n32",
        Int32,
        &[None; 4],
    );
    ints(bin("mod", c("n32"), l(json!(0))), "n32", Int32, &[None; 4]);
    floats(
        bin("truediv", c("n32"), l(json!(2))),
        "n32",
        Float64,
        &[Some(-3.5), Some(3.5), Some(-3.5), Some(3.5)],
    );
    ints(
        bin("floordiv", c("u"), l(json!(2))),
        "u",
        UInt32,
        &[Some(0), Some(1), Some(1), Some(2)],
    );
    ints(bin("mod", c("u"), l(json!(0))), "u", UInt32, &[None; 4]);
    // Floats.
    floats(
        bin("mod", c("fl"), l(json!(2))),
        "fl",
        Float64,
        &[Some(0.5), Some(1.5), Some(0.5), Some(1.5)],
    );
    floats(
        bin("mod", c("fl"), l(json!(-2))),
        "fl",
        Float64,
        &[Some(-1.5), Some(-0.5), Some(-1.5), Some(-0.5)],
    );
    floats(
        bin("floordiv", c("fl"), l(json!(2))),
        "fl",
        Float64,
        &[Some(-4.0), Some(3.0), Some(-4.0), Some(3.0)],
    );
    let inf = f64::INFINITY;
    floats(
        bin("floordiv", c("fl"), l(json!(0))),
        "fl",
        Float64,
        &[Some(-inf), Some(inf), Some(-inf), Some(inf)],
    );
    floats(
        bin("mod", c("fl"), l(json!(0))),
        "fl",
        Float64,
        &[Some(f64::NAN); 4],
    );
    // Float32 stays Float32; with a 32-bit integer column it is Float64.
    floats(
        bin("truediv", c("g"), c("g")),
        "g",
        Float32,
        &[Some(1.0); 4],
    );
    floats(
        bin("truediv", c("g"), l(json!(2))),
        "g",
        Float32,
        &[Some(0.75), Some(-1.25), Some(0.25), Some(1.5)],
    );
    floats(
        bin("floordiv", c("g"), l(json!(2))),
        "g",
        Float32,
        &[Some(0.0), Some(-2.0), Some(0.0), Some(1.0)],
    );
    floats(
        bin("mod", c("g"), l(json!(2))),
        "g",
        Float32,
        &[Some(1.5), Some(1.5), Some(0.5), Some(1.0)],
    );
    floats(
        bin("truediv", c("j"), c("g")),
        "j",
        Float64,
        &[Some(2.0 / 1.5), Some(-1.2), Some(8.0), Some(5.0 / 3.0)],
    );
}

#[test]
fn logic_and_bitwise() {
    use DataType::*;
    // bn = [t, null, f, null], bt = [t, t, null, f]: Kleene and/or, xor null on null.
    bools(bin("and", c("bn"), c("bt")), "bn", &[T, None, F, F]);
    bools(bin("or", c("bn"), c("bt")), "bn", &[T, T, None, None]);
    bools(bin("xor", c("bn"), c("bt")), "bn", &[F, None, None, None]);
    bools(bin("xor", c("b"), l(json!(true))), "b", &[F, T, F, T]);
    // Integers: bitwise.
    ints(
        bin("xor", c("n"), c("d")),
        "n",
        Int64,
        &[Some(-5), Some(-7), Some(7), Some(7)],
    );
    ints(
        bin("xor", c("j"), l(json!(1))),
        "j",
        Int32,
        &[Some(3), Some(2), Some(5), Some(4)],
    );
    ints(
        bin("and", c("j"), l(json!(1))),
        "j",
        Int32,
        &[Some(0), Some(1), Some(0), Some(1)],
    );
    ints(
        bin("or", c("j"), l(json!(1))),
        "j",
        Int32,
        &[Some(3), Some(3), Some(5), Some(5)],
    );
}

#[test]
fn unary_nodes() {
    use DataType::*;
    bools(un("not", c("b")), "b", &[F, T, F, T]);
    bools(un("not", c("bn")), "bn", &[F, None, T, None]);
    ints(
        un("not", c("j")),
        "j",
        Int32,
        &[Some(-3), Some(-4), Some(-5), Some(-6)],
    );
    ints(
        un("not", c("u")),
        "u",
        UInt32,
        &[
            Some(4_294_967_294),
            Some(4_294_967_293),
            Some(4_294_967_292),
            Some(4_294_967_291),
        ],
    );
    bools(un("is_null", c("i")), "i", &[F, F, T, F]);
    bools(un("is_not_null", c("i")), "i", &[T, T, F, T]);
    ints(
        un("neg", c("i")),
        "i",
        Int64,
        &[Some(-1), Some(2), None, Some(-4)],
    );
    floats(
        un("neg", c("g")),
        "g",
        Float32,
        &[Some(-1.5), Some(2.5), Some(-0.5), Some(-3.0)],
    );
    ints(un("neg", l(json!(3))), "literal", Int32, &[Some(-3); 4]);
    ints(
        un("abs", c("i")),
        "i",
        Int64,
        &[Some(1), Some(2), None, Some(4)],
    );
    ints(
        un("abs", c("u")),
        "u",
        UInt32,
        &[Some(1), Some(2), Some(3), Some(4)],
    );
    floats(un("abs", c("fl")), "fl", Float64, &[Some(7.5); 4]);
    // Polars refuses these too.
    fails(un("not", c("s")));
    fails(un("neg", c("b")));
    fails(un("abs", c("s")));
}

#[test]
fn round_half_to_even_keeps_the_type() {
    use DataType::*;
    let round = |e: Value, d: u32| json!({"op": "round", "decimals": d, "expr": e});
    floats(
        round(c("h"), 0),
        "h",
        Float64,
        &[Some(0.0), Some(2.0), Some(2.0), Some(-0.0)],
    );
    floats(
        round(c("h2"), 1),
        "h2",
        Float64,
        &[Some(-1.5), Some(-2.5), Some(1.2), Some(2.7)],
    );
    floats(
        round(c("h2"), 2),
        "h2",
        Float64,
        &[Some(-1.5), Some(-2.5), Some(1.25), Some(2.68)],
    );
    floats(
        round(c("f"), 1),
        "f",
        Float64,
        &[Some(1.2), Some(-2.5), Some(3.8), Some(0.5)],
    );
    floats(
        round(c("g"), 0),
        "g",
        Float32,
        &[Some(2.0), Some(-2.0), Some(0.0), Some(3.0)],
    );
    ints(
        round(c("j"), 0),
        "j",
        Int32,
        &[Some(2), Some(3), Some(4), Some(5)],
    );
    ints(
        round(c("i"), 1),
        "i",
        Int64,
        &[Some(1), Some(-2), None, Some(4)],
    );
    let out = eval(round(cast_node("decimal(10,2)", c("h2")), 1));
    assert_eq!((out.name.as_str(), &out.dtype), ("h2", &Decimal128(10, 2)));
    assert_eq!(
        out.strs(),
        ["-1.50", "-2.50", "1.20", "2.70"].map(|s| Some(s.to_owned()))
    );
    fails(round(c("s"), 1));
    assert!(matches!(
        err(json!({"op": "round", "decimals": -1, "expr": c("f")})),
        ExprJsonError::BadField { .. }
    ));
}

#[test]
fn fill_null_types_the_value_like_the_expression() {
    use DataType::*;
    let fill = |e: Value, v: Value| json!({"op": "fill_null", "expr": e, "value": v});
    ints(
        fill(c("i"), l(json!(0))),
        "i",
        Int64,
        &[Some(1), Some(-2), Some(0), Some(4)],
    );
    floats(
        fill(c("i"), l(json!(1.5))),
        "i",
        Float64,
        &[Some(1.0), Some(-2.0), Some(1.5), Some(4.0)],
    );
    ints(
        fill(c("in"), c("j")),
        "in",
        Int64,
        &[Some(2), Some(1), Some(1), Some(2)],
    );
    bools(fill(c("bn"), l(json!(true))), "bn", &[T, T, F, T]);
    let out = eval(fill(c("sn"), l(json!("q"))));
    assert_eq!(out.strs(), ["x", "q", "x", "y"].map(|s| Some(s.to_owned())));
    ints(
        fill(l(json!(null)), c("j")),
        "literal",
        Int32,
        &[Some(2), Some(3), Some(4), Some(5)],
    );
}

#[test]
fn casts() {
    use DataType::*;
    assert_eq!(eval(cast_node("Float32", c("j"))).dtype, Float32);
    assert_eq!(
        eval(cast_node("decimal(10, 2)", c("j"))).dtype,
        Decimal128(10, 2)
    );
    ints(
        cast_node("int64", c("f")),
        "f",
        Int64,
        &[Some(1), Some(-2), Some(3), Some(0)],
    );
    ints(
        cast_node("int32", c("b")),
        "b",
        Int32,
        &[Some(1), Some(0), Some(1), Some(0)],
    );
    floats(
        cast_node("float32", c("i")),
        "i",
        Float32,
        &[Some(1.0), Some(-2.0), None, Some(4.0)],
    );
    floats(
        cast_node("float32", l(json!(1e300))),
        "literal",
        Float32,
        &[Some(f64::INFINITY); 4],
    );
    let out = eval(cast_node("string", c("j")));
    assert_eq!((out.name.as_str(), &out.dtype), ("j", &Utf8View));
    assert_eq!(out.strs(), ["2", "3", "4", "5"].map(|s| Some(s.to_owned())));
    let out = eval(cast_node("string", c("dt")));
    assert_eq!(
        out.strs(),
        ["1970-01-03", "1970-01-04", "1970-01-05", "1970-01-06"].map(|s| Some(s.to_owned()))
    );
    let out = eval(cast_node("date", l(json!("2020-01-02"))));
    assert_eq!(out.values()[0], ScalarValue::Date32(Some(18263)));
    // Strict: an overflowing or unparsable value fails the query.
    for tree in [
        cast_node("int64", c("s")),
        cast_node("int64", c("snum")),
        cast_node("int8", c("big")),
        cast_node("uint8", c("i")),
        cast_node("int64", c("fbig")),
        cast_node("int64", l(json!("1.5"))),
        cast_node("decimal(3,2)", l(json!(123.5))),
    ] {
        fails(tree);
    }
    assert!(matches!(
        err(cast_node("int128", c("j"))),
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
        ("string", DataType::Utf8View),
        ("str", DataType::Utf8View),
        (" utf8 ", DataType::Utf8View),
        ("date", DataType::Date32),
        ("null", DataType::Null),
        ("decimal(38,0)", DataType::Decimal128(38, 0)),
        ("Decimal( 7 , 7 )", DataType::Decimal128(7, 7)),
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
        "decimal(5,-1)",
    ] {
        assert!(
            matches!(dtype(name), Err(ExprJsonError::BadType(_))),
            "{name:?}"
        );
    }
}

/// The single value of an aggregation, with its name and type.
fn agg1(name: &str, column: &str) -> (String, DataType, ScalarValue) {
    let out = eval(agg(name, c(column)));
    assert_eq!(out.array.len(), 1, "{name}");
    let v = out.values()[0].clone();
    (out.name, out.dtype, v)
}

#[test]
fn every_aggregation() {
    use ScalarValue as S;
    let v = |name: &str, column: &str| {
        let (n, _, v) = agg1(name, column);
        assert_eq!(n, column, "{name}({column})");
        v
    };
    assert_eq!(v("sum", "j"), S::Int32(Some(14)));
    assert_eq!(v("mean", "j"), S::Float64(Some(3.5)));
    assert_eq!(v("count", "i"), S::UInt32(Some(3)));
    assert_eq!(v("len", "i"), S::UInt32(Some(4)));
    assert_eq!(v("n_unique", "b"), S::UInt32(Some(2)));
    assert_eq!(v("min", "i"), S::Int64(Some(-2)));
    assert_eq!(v("max", "i"), S::Int64(Some(4)));
    assert_eq!(v("first", "s"), S::Utf8View(Some("a".into())));
    assert_eq!(v("last", "s"), S::Utf8View(Some("d".into())));
    assert_eq!(v("median", "j"), S::Float64(Some(3.5)));
    let S::Float64(Some(var)) = v("var", "j") else {
        panic!("var is not a float")
    };
    assert!((var - 5.0 / 3.0).abs() < 1e-12);
    let S::Float64(Some(sd)) = v("std", "j") else {
        panic!("std is not a float")
    };
    assert!((sd - (5.0f64 / 3.0).sqrt()).abs() < 1e-12);
    assert!(matches!(
        err(agg("mode", c("j"))),
        ExprJsonError::Unknown {
            what: "aggregation",
            ..
        }
    ));
}

#[test]
fn aggregation_types_and_nulls_as_polars() {
    use DataType::*;
    use ScalarValue as S;
    let t = |name: &str, column: &str| {
        let (_, t, v) = agg1(name, column);
        (t, v)
    };
    // Nulls: n_unique counts null once; first/last keep a null.
    assert_eq!(t("n_unique", "in"), (UInt32, S::UInt32(Some(3))));
    assert_eq!(t("n_unique", "sn"), (UInt32, S::UInt32(Some(3))));
    assert_eq!(t("n_unique", "bn"), (UInt32, S::UInt32(Some(3))));
    assert_eq!(t("first", "in"), (Int64, S::Int64(None)));
    assert_eq!(t("last", "bn"), (Boolean, S::Boolean(None)));
    assert_eq!(t("first", "i"), (Int64, S::Int64(Some(1))));
    assert_eq!(t("sum", "in"), (Int64, S::Int64(Some(4))));
    // Sum types.
    assert_eq!(t("sum", "i8"), (Int64, S::Int64(Some(106))));
    assert_eq!(t("sum", "i16"), (Int64, S::Int64(Some(30006))));
    assert_eq!(t("sum", "u8"), (Int64, S::Int64(Some(256))));
    assert_eq!(t("sum", "u"), (UInt32, S::UInt32(Some(10))));
    assert_eq!(t("sum", "g"), (Float32, S::Float32(Some(2.5))));
    assert_eq!(t("sum", "b"), (UInt32, S::UInt32(Some(2))));
    assert_eq!(t("sum", "bn"), (UInt32, S::UInt32(Some(1))));
    // Float32 stays Float32; the rest is Float64.
    assert_eq!(t("mean", "g"), (Float32, S::Float32(Some(0.625))));
    assert_eq!(t("median", "g"), (Float32, S::Float32(Some(1.0))));
    let (ty, S::Float32(Some(sd))) = t("std", "g") else {
        panic!("std g")
    };
    assert_eq!(ty, Float32);
    assert!((sd - 2.322_893).abs() < 1e-5);
    assert_eq!(t("median", "i"), (Float64, S::Float64(Some(1.0))));
    assert_eq!(t("var", "i"), (Float64, S::Float64(Some(9.0))));
    assert_eq!(t("mean", "b"), (Float64, S::Float64(Some(0.5))));
    assert_eq!(t("min", "b"), (Boolean, S::Boolean(Some(false))));
    assert_eq!(t("min", "s"), (Utf8View, S::Utf8View(Some("a".into()))));
    assert_eq!(t("max", "dt"), (Date32, S::Date32(Some(5))));
    // Decimal sums are Decimal(38, s), means Float64.
    let dec = cast_node("decimal(10,2)", c("f"));
    let out = eval(agg("sum", dec.clone()));
    assert_eq!((out.name.as_str(), &out.dtype), ("f", &Decimal128(38, 2)));
    assert_eq!(out.strs(), [Some("3.00".to_owned())]);
    floats(agg("mean", dec), "f", Float64, &[Some(0.75)]);
    // An aggregation of an expression, and an expression of an aggregation.
    ints(
        agg("sum", bin("add", c("j"), l(json!(1)))),
        "j",
        Int32,
        &[Some(18)],
    );
    ints(
        bin("add", agg("sum", c("j")), l(json!(1))),
        "j",
        Int32,
        &[Some(15)],
    );
    fails(agg("sum", c("s")));
    fails(agg("mean", c("s")));
}

#[test]
fn aggregations_over_no_rows_and_one_row() {
    use ScalarValue as S;
    let none = bin("gt", c("j"), l(json!(100)));
    let over = |name: &str, filter: &Value| {
        let out = run(&agg(name, c("j")), Some(filter)).unwrap();
        out.values()[0].clone()
    };
    // Polars: sum 0, counts 0, the rest null.
    assert_eq!(over("sum", &none), S::Int32(Some(0)));
    assert_eq!(over("count", &none), S::UInt32(Some(0)));
    assert_eq!(over("len", &none), S::UInt32(Some(0)));
    assert_eq!(over("n_unique", &none), S::UInt32(Some(0)));
    for name in ["mean", "median", "std", "var"] {
        assert_eq!(over(name, &none), S::Float64(None), "{name}");
    }
    for name in ["min", "max", "first", "last"] {
        assert_eq!(over(name, &none), S::Int32(None), "{name}");
    }
    let one = bin("eq", c("j"), l(json!(2)));
    assert_eq!(over("std", &one), S::Float64(None));
    assert_eq!(over("var", &one), S::Float64(None));
    // All null: sum 0.
    let out = run(&agg("sum", c("i")), Some(&un("is_null", c("i")))).unwrap();
    assert_eq!(out.values(), [S::Int64(Some(0))]);
}

#[test]
fn is_in_of_each_value_type() {
    let is_in = |column: &str, vals: Value, dtype: &str| json!({"op": "is_in", "expr": c(column), "values": vals, "dtype": dtype});
    bools(is_in("j", json!([3, 5]), "int32"), "j", &[F, T, F, T]);
    bools(is_in("j", json!([3, null]), "int64"), "j", &[F, T, F, F]);
    bools(is_in("j", json!([2]), "uint64"), "j", &[T, F, F, F]);
    bools(is_in("j", json!([2.0]), "float64"), "j", &[T, F, F, F]);
    bools(is_in("f", json!([1]), "int64"), "f", &[F, F, F, F]);
    bools(
        is_in("f", json!([0.5, -2.5]), "float64"),
        "f",
        &[F, T, F, T],
    );
    bools(is_in("s", json!(["a", "d"]), "string"), "s", &[T, F, F, T]);
    bools(is_in("b", json!([false]), "bool"), "b", &[F, T, F, T]);
    bools(is_in("dt", json!([4]), "date"), "dt", &[F, F, T, F]);
    let dates = cast_node("date", c("j"));
    bools(
        json!({"op": "is_in", "expr": dates, "values": [4], "dtype": "date"}),
        "j",
        &[F, F, T, F],
    );
    // Nulls as Polars: a null input is null, a null in the list matches nothing.
    bools(is_in("i", json!([1]), "int64"), "i", &[T, F, None, F]);
    bools(is_in("i", json!([1, null]), "int64"), "i", &[T, F, None, F]);
    bools(is_in("i", json!([null]), "int64"), "i", &[F, F, None, F]);
    bools(is_in("i", json!([]), "int64"), "i", &[F, F, None, F]);
    bools(is_in("sn", json!(["x"]), "string"), "sn", &[T, None, T, F]);
    // Out of the target type's range: the value matches nothing.
    bools(is_in("j", json!([300, 3]), "int8"), "j", &[F, T, F, F]);

    let node = |vals: Value, dtype: &str| is_in("j", vals, dtype);
    for (vals, dtype) in [
        (json!(["x"]), "int32"),
        (json!([1.5]), "int64"),
        (json!([-1]), "uint64"),
        (json!([1]), "string"),
        (json!(["3"]), "string"),
    ] {
        assert!(
            matches!(err(node(vals.clone(), dtype)), ExprJsonError::BadLiteral(_)),
            "{vals} {dtype}"
        );
    }
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
    let between = |e: Value, lo: Value, hi: Value, closed: &str| json!({"op": "between", "expr": e, "lower": lo, "upper": hi, "closed": closed});
    let j35 = |closed: &str| between(c("j"), l(json!(3)), l(json!(5)), closed);
    bools(j35("both"), "j", &[F, T, T, T]);
    bools(j35("left"), "j", &[F, T, T, F]);
    bools(j35("right"), "j", &[F, F, T, T]);
    bools(j35("none"), "j", &[F, F, T, F]);
    // i = [1, -2, null, 4] between 1 and 4.
    let i14 = |closed: &str| between(c("i"), l(json!(1)), l(json!(4)), closed);
    bools(i14("both"), "i", &[T, F, None, T]);
    bools(i14("left"), "i", &[T, F, None, F]);
    bools(i14("right"), "i", &[F, F, None, T]);
    bools(i14("none"), "i", &[F, F, None, F]);
    bools(
        between(c("j"), l(json!(1.5)), l(json!(4)), "both"),
        "j",
        &[T, T, T, F],
    );
    bools(
        between(c("j"), l(json!(null)), l(json!(4)), "both"),
        "j",
        &[None; 4],
    );
    bools(
        between(l(json!(3)), c("j"), c("i"), "both"),
        "literal",
        &[F, F, F, F],
    );
    let e = err(between(c("j"), l(json!(3)), l(json!(5)), "open"));
    assert!(matches!(e, ExprJsonError::Unknown { .. }), "{e}");
}

#[test]
fn when_then_otherwise() {
    use DataType::*;
    let gt = |v: i64| bin("gt", c("j"), l(json!(v)));
    let when1 = |then: Value, otherwise: Option<Value>| match otherwise {
        Some(o) => json!({"op": "when", "branches": [[gt(3), then]], "otherwise": o}),
        None => json!({"op": "when", "branches": [[gt(3), then]]}),
    };
    // One branch, no otherwise: null elsewhere.
    let out = eval(when1(l(json!("big")), None));
    assert_eq!(out.name, "literal");
    assert_eq!(
        out.strs(),
        [None, None, Some("big".to_owned()), Some("big".to_owned())]
    );
    ints(
        when1(l(json!(1)), None),
        "literal",
        Int32,
        &[None, None, Some(1), Some(1)],
    );
    // Two branches and an otherwise.
    ints(
        json!({"op": "when", "branches": [[gt(4), l(json!(2))], [gt(2), l(json!(1))]],
               "otherwise": l(json!(0))}),
        "literal",
        Int32,
        &[Some(0), Some(1), Some(1), Some(2)],
    );
    // Three branches: the first that holds wins.
    ints(
        json!({"op": "when",
               "branches": [[gt(4), l(json!(3))], [gt(3), l(json!(2))], [gt(2), l(json!(1))]],
               "otherwise": l(json!(0))}),
        "literal",
        Int32,
        &[Some(0), Some(1), Some(2), Some(3)],
    );
    // Types: literals take the other values' type; the values take Polars' supertype.
    ints(
        when1(l(json!(1)), Some(c("j"))),
        "literal",
        Int32,
        &[Some(2), Some(3), Some(1), Some(1)],
    );
    ints(
        when1(l(json!(1)), Some(c("i"))),
        "literal",
        Int64,
        &[Some(1), Some(-2), Some(1), Some(1)],
    );
    ints(
        when1(l(json!(1)), Some(c("u"))),
        "literal",
        UInt32,
        &[Some(1), Some(2), Some(1), Some(1)],
    );
    floats(
        when1(l(json!(1.5)), Some(c("j"))),
        "literal",
        Float64,
        &[Some(2.0), Some(3.0), Some(1.5), Some(1.5)],
    );
    ints(
        when1(c("j"), Some(l(json!(1)))),
        "j",
        Int32,
        &[Some(1), Some(1), Some(4), Some(5)],
    );
    floats(
        when1(c("j"), Some(c("g"))),
        "j",
        Float64,
        &[Some(1.5), Some(-2.5), Some(4.0), Some(5.0)],
    );
    floats(
        when1(l(json!(1)), Some(c("g"))),
        "literal",
        Float32,
        &[Some(1.5), Some(-2.5), Some(1.0), Some(1.0)],
    );
    floats(
        when1(c("g"), Some(l(json!(1)))),
        "g",
        Float32,
        &[Some(1.0), Some(1.0), Some(0.5), Some(3.0)],
    );
    ints(
        when1(l(json!(1)), Some(l(json!(5_000_000_000i64)))),
        "literal",
        Int64,
        &[Some(5_000_000_000), Some(5_000_000_000), Some(1), Some(1)],
    );
    ints(
        when1(l(json!(null)), Some(c("j"))),
        "literal",
        Int32,
        &[Some(2), Some(3), None, None],
    );
    let out = eval(when1(l(json!("zz")), Some(c("s"))));
    assert_eq!(
        out.strs(),
        ["a", "b", "zz", "zz"].map(|s| Some(s.to_owned()))
    );
    // A null condition takes the next branch.
    ints(
        json!({"op": "when", "branches": [[c("bn"), l(json!(1))]], "otherwise": l(json!(0))}),
        "literal",
        Int32,
        &[Some(1), Some(0), Some(0), Some(0)],
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
fn output_names() {
    let name = |tree: Value| output_name(&tree).unwrap();
    assert_eq!(name(c("x")), "x");
    assert_eq!(name(l(json!(1))), "literal");
    assert_eq!(name(json!({"op": "lit_date", "days": 1})), "literal");
    assert_eq!(name(bin("add", l(json!(1)), c("x"))), "literal");
    assert_eq!(name(bin("add", c("x"), l(json!(1)))), "x");
    assert_eq!(name(agg("len", c("x"))), "x");
    assert_eq!(name(cast_node("int8", un("neg", c("x")))), "x");
    assert_eq!(
        name(json!({"op": "alias", "name": "k", "expr": c("x")})),
        "k"
    );
    assert_eq!(
        name(json!({"op": "when", "branches": [[c("b"), c("s")]], "otherwise": c("j")})),
        "s"
    );
    assert!(matches!(
        output_name(&json!({"op": "when", "branches": []})),
        Err(ExprJsonError::BadField { .. })
    ));
}

#[test]
fn unknown_columns_fail_when_planned() {
    // Converting does not need the column's type; DataFusion names the column.
    let e = fails(bin("add", c("zz"), l(json!(1))));
    assert!(e.contains("zz"), "{e}");
    let e = fails(agg("n_unique", c("zz")));
    assert!(e.contains("zz"), "{e}");
}

#[test]
fn malformed_trees() {
    let s = schema();
    assert!(matches!(from_json("{", &s), Err(ExprJsonError::NotJson(_))));
    assert!(matches!(
        list_from_json("[1", &s),
        Err(ExprJsonError::NotJson(_))
    ));
    assert!(matches!(
        list_from_json(r#"{"op": "col", "name": "x"}"#, &s),
        Err(ExprJsonError::NotAnExpression { .. })
    ));
    for text in ["[]", "3", r#"{"name": "x"}"#, r#"{"op": 1, "name": "x"}"#] {
        assert!(
            matches!(
                from_json(text, &s),
                Err(ExprJsonError::NotAnExpression { .. })
            ),
            "{text}"
        );
    }
    let e = from_json(
        r#"{"op": "explode", "expr": {"op": "col", "name": "x"}}"#,
        &s,
    )
    .unwrap_err();
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
    assert!(matches!(
        err(json!({"op": "alias", "name": 5, "expr": c("j")})),
        ExprJsonError::BadField { .. }
    ));
    // A malformed node deep inside fails the whole tree.
    assert!(matches!(
        err(bin("add", c("j"), un("neg", json!({"op": "lit"})))),
        ExprJsonError::MissingField { .. }
    ));
    // Lists: every element is checked.
    let list = list_from_json(
        r#"[{"op": "col", "name": "x"}, {"op": "lit", "value": 1}]"#,
        &s,
    );
    assert_eq!(list.unwrap().len(), 2);
    assert!(list_from_json(r#"[{"op": "col", "name": "x"}, {"op": "nope"}]"#, &s).is_err());
}

#[test]
fn aggregate_with_group_keys_directly_or_split() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let ctx = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(1));
        let df = ctx.read_batch(frame()).unwrap();
        let exprs = list_from_json(
            &json!([
                agg("n_unique", c("in")),
                agg("sum", c("j")),
                agg("first", c("i")),
                json!({"op": "alias", "name": "m", "expr": agg("mean", c("g"))})
            ])
            .to_string(),
            df.schema(),
        )
        .unwrap();
        // DataFusion's aggregate takes the wrapped calls as they are.
        let out = df
            .aggregate(vec![ident("b")], exprs)
            .unwrap()
            .sort(vec![ident("b").sort(true, true)])
            .unwrap()
            .collect()
            .await
            .unwrap();
        let out = &out[0];
        let names: Vec<String> = out
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        assert_eq!(names, ["b", "in", "j", "i", "m"]);
        let col = |i: usize| {
            (0..out.num_rows())
                .map(|r| ScalarValue::try_from_array(out.column(i), r).unwrap())
                .collect::<Vec<_>>()
        };
        // b = false: rows 1, 3; b = true: rows 0, 2.
        assert_eq!(
            col(1),
            [ScalarValue::UInt32(Some(2)), ScalarValue::UInt32(Some(2))]
        );
        assert_eq!(
            col(2),
            [ScalarValue::Int32(Some(8)), ScalarValue::Int32(Some(6))]
        );
        assert_eq!(
            col(3),
            [ScalarValue::Int64(Some(-2)), ScalarValue::Int64(Some(1))]
        );
        assert_eq!(
            col(4),
            [
                ScalarValue::Float32(Some(0.25)),
                ScalarValue::Float32(Some(1.0))
            ]
        );
    });
}
